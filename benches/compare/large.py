#!/usr/bin/env python3
"""A large database (10 GiB by default), replicad vs Litestream in one run: initial snapshot,
the first compaction round, restore, and the start of `restore --follow`. Not part of
`cargo test`.

Usage (from anywhere; paths are relative to the repository root):

    python3 benches/compare/large.py                  # 10 GiB, ~25 min on 2 cores once generated
    python3 benches/compare/large.py --size-mib 1024  # the same steps on 1 GiB
    python3 benches/compare/large.py --storage s3,dir # also to a directory replica (~+20 min)

Each tool runs with its defaults (Litestream lz4, no check on restore; replicad its integrity
check on restore, and lz4: the codec it writes by default for a config Litestream could read,
as this one is; `--replicad-codec zstd:3` sets its other default) on its own fresh copy of the same generated database (cached under
target/bench-data, ~25 s a GiB to make), replicating to the same loopback S3 server (s3s-fs)
and, with `--storage s3,dir`, to a local directory as well. The S3 rows also give the
server's CPU seconds during each step: s3s-fs serves a GET body in 4 KiB reads, each on
tokio's blocking pool, so on 2 cores it takes a large share of the machine from both tools.

For each tool:
  1. `replicate` until the level-0 snapshot object is complete (snapshot s, MB/s), then until
     a level-1 object exists and the server has seen no upload (a directory replica: no file
     changed) for 5 s (the first
     compaction round; both tools compact level 0 into level 1 about 30 s after start),
     then SIGTERM;
  2. `restore` of the replica to a fresh path;
  3. `restore --follow` (Litestream: `restore -f`) of it until the follower has restored
     and is following (replicad: its "restored; following" log line; Litestream: the output
     file exists at its full size, as it restores to a temporary name and renames it).
Each step reports wall time, MB/s of database bytes, peak RSS (VmHWM, polled every 0.2 s
from /proc and read once more at exit), CPU s, the bytes the process wrote to local disk
(/proc/PID/io write_bytes, which counts what reaches the page cache for block devices) and
the largest file other than the database and the output that appeared in the process's
directories while it ran (staging, temporary files).

Prints one table and writes benches/compare/results/results-large-<UTC time>.json.
Python 3 standard library; the tools are installed as by s3_snapshot.py.
"""

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402

REPO, DATA = h.REPO, h.DATA
WORK = os.path.join(DATA, "large")
log = h.log


def s3_url(s3, prefix):
    return (f"s3://{h.BUCKET}/{prefix}?endpoint={s3.endpoint}&region={h.REGION}"
            f"&force-path-style=true")


def tool_env(tool):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=h.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=h.SECRET_KEY,
               NO_COLOR="1")
    if tool == "litestream":
        env.pop("AWS_CA_BUNDLE", None)  # breaks Litestream's S3 client
    return env


def stop(proc, logf, timeout):
    """SIGTERM, up to `timeout` s for the exit, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    logf.close()
    return proc.returncode


class Watch:
    """Polls a process every 0.2 s: peak RSS, CPU, bytes written, and the largest file in
    `dirs` other than the paths in `skip` (and their -wal / -shm / -journal)."""

    def __init__(self, proc, dirs, skip):
        self.proc, self.dirs = proc, dirs
        self.skip = {p + suffix for p in skip for suffix in ("", "-wal", "-shm", "-journal")}
        self.peak_rss_kib, self.cpu_s, self.write_bytes = 0, 0.0, 0
        self.largest = (0, None)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def sample(self):
        st = h.proc_stats(self.proc.pid)
        self.peak_rss_kib = max(self.peak_rss_kib, st.get("VmHWM", 0))
        self.cpu_s = max(self.cpu_s, st.get("cpu_s", 0.0))
        try:
            with open(f"/proc/{self.proc.pid}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        self.write_bytes = max(self.write_bytes, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
        for d in self.dirs:
            for root, _, files in os.walk(d):
                for name in files:
                    p = os.path.join(root, name)
                    if p in self.skip:
                        continue
                    try:
                        size = os.path.getsize(p)
                    except OSError:
                        continue
                    if size > self.largest[0]:
                        self.largest = (size, os.path.relpath(p, d))

    def run(self):
        while not self.stop.is_set() and self.proc.poll() is None:
            self.sample()
            time.sleep(0.2)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return {"peak_rss_mib": round(self.peak_rss_kib / 1024, 1), "cpu_s": round(self.cpu_s, 1),
                "local_write_mib": round(self.write_bytes / 2**20, 1),
                "largest_other_file_mib": round(self.largest[0] / 2**20, 1),
                "largest_other_file": self.largest[1]}


def replica_name(tool, storage):
    return f"large-{tool}" if storage == "s3" else f"large-{tool}-{storage}"


def replica_root(s3, name, storage):
    """Where the replica's objects land: s3s-fs's directory for the bucket, or the directory."""
    if storage == "s3":
        return os.path.join(s3.root, h.BUCKET, name)
    return os.path.join(WORK, "replicas", name)


def server_cpu(s3):
    return h.proc_stats(s3.proc.pid).get("cpu_s", 0.0)


def replicate(tool, source, meta, s3, storage, args):
    name = replica_name(tool, storage)
    workdir = os.path.join(WORK, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    root = replica_root(s3, name, storage)
    shutil.rmtree(root, ignore_errors=True)
    db = os.path.join(workdir, "app.db")
    log(f"{name}: copying the source")
    shutil.copyfile(source, db)
    os.sync()
    if tool == "replicad":
        cfg = os.path.join(workdir, "replicad.yml")
        cmd = [h.REPLICAD_BIN, "replicate", "--config", cfg]
    else:
        cfg = os.path.join(workdir, "litestream.yml")
        cmd = [h.LITESTREAM_BIN, "replicate", "-config", cfg]
    codec = (f"    compression: {args.replicad_codec}\n"
             if tool == "replicad" and args.replicad_codec else "")
    if storage == "s3":
        replica = f"""      type: s3
      bucket: {h.BUCKET}
      path: {name}
      endpoint: {s3.endpoint}
      region: {h.REGION}
      force-path-style: true
"""
        l0 = os.path.join(root, h.L0_SNAPSHOT)
        l1 = os.path.join(root, "0001")
    else:
        replica = f"      type: file\n      path: {root}\n"
        l0 = os.path.join(root, "ltx", "0", os.path.basename(h.L0_SNAPSHOT))
        l1 = os.path.join(root, "ltx", "1")
    with open(cfg, "w") as f:
        f.write(f"dbs:\n  - path: {db}\n{codec}    replica:\n{replica}")
    logf = open(os.path.join(workdir, f"{tool}.log"), "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=tool_env(tool),
                            cwd=workdir, start_new_session=True)
    w = Watch(proc, [workdir], [db])
    res = {"tool": tool, "storage": storage, "command": cmd}
    snap = l1_at = None
    cpu0 = server_cpu(s3)
    quiet_since, last_off, last_files = None, s3.log_offset(), None
    while proc.poll() is None and time.monotonic() - t0 < args.timeout:
        now = time.monotonic()
        if snap is None and os.path.exists(l0):
            snap = now - t0
            log(f"  snapshot complete after {snap:.1f} s")
        # Whole objects only: Litestream's file replica writes `<name>.ltx.tmp` in the level
        # directory and renames it when complete (s3s-fs shows an object once complete).
        if l1_at is None and os.path.isdir(l1) and any(
                n.endswith(".ltx") for n in os.listdir(l1)):
            l1_at = now - t0
            log(f"  level 1 after {l1_at:.1f} s")
        if snap is not None and l1_at is not None:
            if storage == "s3":
                ops, _ = s3.requests_between(last_off, s3.log_offset())
                last_off = s3.log_offset()
                uploads = sum(v for op, v in ops.items()
                              if op in ("PutObject", "UploadPart", "CompleteMultipartUpload"))
            else:
                files = h.dir_files(root)
                uploads, last_files = files != last_files, files
            if uploads:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= 5:
                break
        time.sleep(0.2)
    res.update(snapshot_s=round(snap, 1) if snap else None,
               snapshot_mb_per_s=round(meta["bytes"] / 1e6 / snap, 1) if snap else None,
               level1_at_s=round(l1_at, 1) if l1_at else None,
               settled_s=round(time.monotonic() - t0 - 5, 1),
               exited_early=proc.poll())
    if storage == "s3":
        res["server_cpu_s"] = round(server_cpu(s3) - cpu0, 1)
    w.sample()
    res.update(w.finish())
    res["exit_code"] = stop(proc, logf, 120)
    objects = {}
    levels = root if storage == "s3" else os.path.join(root, "ltx")
    for level in sorted(os.listdir(levels)) if os.path.isdir(levels) else []:
        if not os.path.isdir(os.path.join(levels, level)):
            continue
        files = os.listdir(os.path.join(levels, level))
        objects[level] = {"files": len(files), "mib": round(sum(
            os.path.getsize(os.path.join(levels, level, x)) for x in files) / 2**20, 1)}
    res["objects"] = objects
    os.remove(db)
    log(f"  {name}: {res}")
    return res


def restore(tool, s3, meta, storage, follow, args):
    name = replica_name(tool, storage)
    workdir = os.path.join(WORK, f"{name}-{'follow' if follow else 'restore'}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    out = os.path.join(workdir, "out.db")
    url = s3_url(s3, name) if storage == "s3" else "file://" + replica_root(s3, name, storage)
    if tool == "replicad":
        cmd = [h.REPLICAD_BIN, "restore"] + (["--follow"] if follow else []) + ["--to", out, url]
    else:
        cmd = [h.LITESTREAM_BIN, "restore"] + (["-f"] if follow else []) + ["-o", out, url]
    logp = os.path.join(workdir, f"{tool}.log")
    logf = open(logp, "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=tool_env(tool),
                            cwd=workdir, start_new_session=True)
    w = Watch(proc, [workdir], [out])
    done, cpu0 = None, server_cpu(s3)
    while time.monotonic() - t0 < args.timeout:
        if not follow:
            if proc.poll() is not None:
                done = time.monotonic() - t0
                break
        elif tool == "replicad":
            if b"restored; following" in open(logp, "rb").read():
                done = time.monotonic() - t0
                break
        elif os.path.exists(out) and os.path.getsize(out) >= meta["bytes"]:
            done = time.monotonic() - t0
            break
        if follow and proc.poll() is not None:
            break
        time.sleep(0.05)
    w.sample()
    res = {"tool": tool, "storage": storage, "command": cmd,
           "seconds": round(done, 1) if done else None,
           "mb_per_s": round(meta["bytes"] / 1e6 / done, 1) if done else None}
    if storage == "s3":
        res["server_cpu_s"] = round(server_cpu(s3) - cpu0, 1)
    res.update(w.finish())
    res["exit_code"] = stop(proc, logf, 60)
    if done and os.path.exists(out) and not follow:
        con = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
        res["rows_equal"] = con.execute("SELECT count(*) FROM customers").fetchone()[0] == meta["rows"]
        con.close()
    if not done:
        res["log_tail"] = open(logp, "rb").read()[-2000:].decode("utf-8", "replace")
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"  {name} {'follow' if follow else 'restore'}: {res}")
    return res


def ratio(a, b):
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=10240)
    p.add_argument("--no-build", action="store_true", help="use target/release/replicad as is")
    p.add_argument("--tools", default="replicad,litestream")
    p.add_argument("--storage", default="s3", help="s3, dir or s3,dir")
    p.add_argument("--replicad-codec", default=None,
                   help="replicad's `compression` (default: unset, so lz4 for this config)")
    p.add_argument("--timeout", type=float, default=1800.0, help="per step, s")
    args = p.parse_args()
    tools = args.tools.split(",")
    storages = args.storage.split(",")
    if not set(storages) <= {"s3", "dir"}:
        sys.exit(f"--storage: s3, dir or s3,dir, not {args.storage}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    started = time.monotonic()
    h.ensure_tools(not args.no_build)
    source, meta = h.ensure_db(args.size_mib)
    log(f"source {source}: {meta}")
    os.makedirs(WORK, exist_ok=True)
    s3 = h.S3Server()
    r = {"started_utc": stamp, "args": vars(args), "database": meta,
         "git_head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip(),
         "versions": {"replicad": h.version_of([h.REPLICAD_BIN, "--version"]),
                      "litestream": h.version_of([h.LITESTREAM_BIN, "version"])},
         "cpus": os.cpu_count()}
    try:
        for storage in storages:
            # The S3 results keep their keys of earlier runs ("replicad", "litestream").
            for tool in tools:
                key = tool if storage == "s3" else f"{tool}-{storage}"
                r[key] = {"replicate": replicate(tool, source, meta, s3, storage, args)}
                r[key]["restore"] = restore(tool, s3, meta, storage, False, args)
                r[key]["follow"] = restore(tool, s3, meta, storage, True, args)
                shutil.rmtree(replica_root(s3, replica_name(tool, storage), storage),
                              ignore_errors=True)
    finally:
        s3.stop()
    r["elapsed_s"] = round(time.monotonic() - started, 1)
    rows = []
    for storage in storages:
        sfx, tag = ("", "") if storage == "s3" else (f"-{storage}", f" ({storage})")
        server = ("server_cpu_s",) if storage == "s3" else ()
        for step, keys in (("replicate", ("snapshot_s", "snapshot_mb_per_s", "level1_at_s",
                                          "settled_s", "peak_rss_mib", "cpu_s") + server
                            + ("local_write_mib", "largest_other_file_mib")),
                           ("restore", ("seconds", "mb_per_s", "peak_rss_mib", "cpu_s") + server
                            + ("local_write_mib", "largest_other_file_mib")),
                           ("follow", ("seconds", "peak_rss_mib", "local_write_mib",
                                       "largest_other_file_mib"))):
            for k in keys:
                a = r.get("replicad" + sfx, {}).get(step, {}).get(k)
                b = r.get("litestream" + sfx, {}).get(step, {}).get(k)
                rows.append((f"{step}{tag} {k}", a, b, ratio(a, b)))
    out = os.path.join(h.HERE, "results", f"results-large-{stamp}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    r["table"] = rows
    with open(out, "w") as f:
        json.dump(r, f, indent=1, default=str)
    mib = meta["bytes"] / 2**20
    print(f"\n{mib:.0f} MiB database, replicad {r['versions']['replicad']} vs Litestream "
          f"{r['versions']['litestream']} at {r['git_head']}, {r['elapsed_s']} s in all\n")
    print("| figure | replicad | litestream | ratio |\n|---|---|---|---|")
    for fig, a, b, q in rows:
        print(f"| {fig} | {'-' if a is None else a} | {'-' if b is None else b} | {'-' if q is None else q} |")
    print(f"\nJSON: {os.path.relpath(out, REPO)}")


if __name__ == "__main__":
    main()
