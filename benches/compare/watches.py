#!/usr/bin/env python3
"""Commit detection at scale: N databases in one replicad process, all in one directory
(one inotify watch) or each in a directory of its own (N watches). Reports, for each layout:
seconds until every database is replicated, inotify watches held (from /proc/PID/fdinfo),
databases watched (replicad_db_commit_watched), VmRSS, and idle CPU over a window.

    python3 benches/compare/watches.py [--dbs 10000] [--window 30]

Uses target/release/replicad (cargo build --release first). File replicas, default settings.
"""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402

WORK = os.path.join(h.DATA, "watches")
BIN = os.path.join(h.REPO, "target", "release", "replicad")


def seed_db(path):
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, note TEXT)")
    con.executemany("INSERT INTO t (note) VALUES (?)", [("x" * 40,) for _ in range(100)])
    con.commit()
    con.close()


def has_l0(rep):
    l0 = os.path.join(rep, "ltx", "0")
    return os.path.isdir(l0) and bool(os.listdir(l0))


def inotify_watches(pid):
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                n += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass
    return n


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)


def sums(port):
    """Totals over every database of the counters that show work while idle."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    out = {}
    for name in ("replicad_db_syncs_total", "replicad_db_sync_skipped_total", "replicad_db_wakes_total",
                 "replicad_db_segments_total"):
        out[name[len("replicad_db_"):]] = sum(float(line.split()[-1]) for line in text.splitlines()
                                             if line.startswith(name + "{"))
    return out


def run(n, apart, window, settle):
    work = os.path.join(WORK, "apart" if apart else "together")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    seed = os.path.join(work, "seed.db")
    seed_db(seed)
    port = 19400 + int(apart)
    cfg = os.path.join(work, "replicad.yml")
    reps = []
    with open(cfg, "w") as f:
        f.write(f'addr: "127.0.0.1:{port}"\ndbs:\n')
        for i in range(n):
            d = os.path.join(work, "db", f"d{i:05d}") if apart else os.path.join(work, "db")
            os.makedirs(d, exist_ok=True)
            db = os.path.join(d, f"db{i:05d}.db")
            shutil.copyfile(seed, db)
            rep = os.path.join(work, "replica", f"r{i:05d}")
            reps.append(rep)
            f.write(f"  - path: {db}\n    replica:\n      type: file\n      path: {rep}\n")
    logp = open(os.path.join(work, "replicad.log"), "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([BIN, "replicate", "--config", cfg], stdout=logp, stderr=logp)
    try:
        pending = reps
        while pending and proc.poll() is None and time.monotonic() - t0 < 600:
            pending = [r for r in pending if not has_l0(r)]
            time.sleep(1)
        start_s = round(time.monotonic() - t0, 1)
        if proc.poll() is not None:
            raise SystemExit(f"replicad exited with {proc.returncode}; log: {logp.name}")
        time.sleep(settle)
        m0 = sums(port)
        c0 = cpu_s(proc.pid)
        time.sleep(window)
        cpu = round(100 * (cpu_s(proc.pid) - c0) / window, 2)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        watched = sum(int(float(line.split()[-1])) for line in metrics.splitlines()
                      if line.startswith("replicad_db_commit_watched{"))
        m1 = sums(port)
        during = {k: m1[k] - m0[k] for k in m0}
        res = {"layout": "one directory each" if apart else "one directory", "dbs": n,
               "start_s": start_s, "pending": len(pending), "inotify_watches": inotify_watches(proc.pid),
               "dbs_watched": watched, "rss_mib": rss_mib(proc.pid), "idle_cpu_pct": cpu, "in_window": during}
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        logp.close()
    shutil.rmtree(os.path.join(work, "db"), ignore_errors=True)
    shutil.rmtree(os.path.join(work, "replica"), ignore_errors=True)
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dbs", type=int, default=10000)
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=60.0, help="s after the start before the window")
    p.add_argument("--layouts", default="together,apart", help="comma list of: together,apart")
    args = p.parse_args()
    with open("/proc/sys/fs/inotify/max_user_watches") as f:
        print(f"fs.inotify.max_user_watches = {f.read().strip()}")
    for layout in args.layouts.split(","):
        print(run(args.dbs, layout == "apart", args.window, args.settle), flush=True)


if __name__ == "__main__":
    main()
