"""What every phase of run.py shares: the system tools it needs, each tool's environment,
config, start and stop, and what it reads from the S3 server's files and /proc.
"""

import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys

import s3_snapshot as h

REPO, DATA = h.REPO, h.DATA
WORK = os.path.join(DATA, "compare")
LTX_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")
log = h.log

# ----------------------------------------------------------------------------- setup

def ensure_system_tools():
    missing = [p for p, b in (("strace", "/usr/bin/strace"), ("time", "/usr/bin/time"))
               if not os.access(b, os.X_OK)]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-q"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-q"] + missing, check=False)
    for b in ("/usr/bin/strace", "/usr/bin/time"):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is missing: apt-get install -y strace time")


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


def tool_env(tool):
    # BENCH_RUST_LOG: replicad's log filter for a diagnosis run of the idle, scale, lag, write
    # and appckpt phases (the figures use info; the snapshot phases set their own).
    env = dict(os.environ, NO_COLOR="1", RUST_LOG=os.environ.get("BENCH_RUST_LOG", "info"))
    env.update(AWS_ACCESS_KEY_ID=h.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=h.SECRET_KEY)
    if tool == "litestream":
        env.pop("AWS_CA_BUNDLE", None)  # breaks Litestream's S3 client
    return env


def s3_block(prefix, s3, indent, bucket=h.BUCKET):
    pad = " " * indent
    return (f"{pad}type: s3\n{pad}bucket: {bucket}\n{pad}path: {prefix}\n"
            f"{pad}endpoint: {s3.endpoint}\n{pad}region: {h.REGION}\n"
            f"{pad}force-path-style: true\n{pad}access-key-id: {h.ACCESS_KEY}\n"
            f"{pad}secret-access-key: {h.SECRET_KEY}\n")


def write_config(tool, path, dbs, prefixes, s3, codec=None, bucket=h.BUCKET):
    """Both tools read the same shape; replicad gets `compression:` when asked."""
    with open(path, "w") as f:
        f.write("dbs:\n")
        for db, prefix in zip(dbs, prefixes):
            f.write(f"  - path: {db}\n")
            if tool == "replicad" and codec:
                f.write(f"    compression: {codec}\n")
            f.write("    replica:\n" + s3_block(prefix, s3, 6, bucket))


def start(tool, cfg, workdir):
    binary = h.REPLICAD_BIN if tool == "replicad" else h.LITESTREAM_BIN
    flag = "--config" if tool == "replicad" else "-config"
    logp = os.path.join(workdir, f"{tool}.log")
    logf = open(logp, "wb")
    proc = subprocess.Popen([binary, "replicate", flag, cfg], stdout=logf,
                            stderr=subprocess.STDOUT, env=tool_env(tool), cwd=workdir,
                            start_new_session=True)
    return proc, logf, logp


def stop(proc, logf, signalled=False):
    """SIGTERM (unless `signalled`: a second signal makes both tools skip their shutdown
    sync), then up to 60 s for the exit, then SIGKILL."""
    if proc.poll() is None:
        if not signalled:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    logf.close()
    return proc.returncode


def l0_dir(s3, prefix, bucket=h.BUCKET):
    return os.path.join(s3.root, bucket, prefix, "0000")


def max_txid(d):
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    best = 0
    for n in names:
        m = LTX_NAME.match(n)
        if m:
            best = max(best, int(m.group(2), 16))
    return best


def proc_sample(pid):
    st = h.proc_stats(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        fds = None
    return {"cpu_s": st.get("cpu_s"), "rss_mib": round(st.get("VmRSS", 0) / 1024, 1),
            "hwm_mib": round(st.get("VmHWM", 0) / 1024, 1), "threads": st.get("Threads"),
            "fds": fds}


def make_small_dbs(root, n):
    os.makedirs(root, exist_ok=True)
    dbs = []
    for i in range(n):
        p = os.path.join(root, f"db{i:04d}.db")
        con = sqlite3.connect(p)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")  # the caller runs os.sync() once
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, val REAL, note TEXT)")
        con.executemany("INSERT INTO t (name, val, note) VALUES (?, ?, ?)",
                        [(f"name-{j}", j * 1.5, "x" * 40) for j in range(100)])
        con.commit()
        con.close()
        dbs.append(p)
    return dbs
