#!/usr/bin/env python3
"""Start of many databases, configured one by one (`dbs: - path:`) or discovered in a directory
(`dbs: - dir:`): seconds from the process start until every database has a level-0 file on its
replica. Each run with no added latency and with `--latency` added before every storage call
(the failure drill's `latency`, standing in for a store some milliseconds away: a start's
lease and listing are round trips). replicad only: a directory of databases is its feature.

    python3 benches/compare/discovery.py [--dbs 1000] [--latency 20ms]

Uses target/release/replicad (cargo build --release first). File replicas, default settings.
"""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402

WORK = os.path.join(h.DATA, "discovery")
BIN = os.path.join(h.REPO, "target", "release", "replicad")


def prepare(n):
    """`n` copies of one small WAL database under WORK/t, and the two configs."""
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "t"))
    seed = os.path.join(WORK, "seed.db")
    con = sqlite3.connect(seed)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t(x)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    con.close()
    dbs = [os.path.join(WORK, "t", f"db{i:05d}.db") for i in range(n)]
    for p in dbs:
        shutil.copyfile(seed, p)
    cfgs = {"dir": os.path.join(WORK, "dir.yml"), "dbs": os.path.join(WORK, "dbs.yml")}
    with open(cfgs["dir"], "w") as f:
        f.write(f"dbs:\n  - dir: {WORK}/t\n    pattern: '*.db'\n    replica:\n"
                f"      path: {WORK}/r-dir\n")
    with open(cfgs["dbs"], "w") as f:
        f.write("dbs:\n")
        for i, p in enumerate(dbs):
            f.write(f"  - path: {p}\n    replica:\n      path: {WORK}/r-dbs/db{i:05d}\n")
    return cfgs


def level0_files(root):
    n = 0
    for d, _, files in os.walk(root):
        if d.endswith(os.path.join("ltx", "0")):
            n += sum(1 for f in files if f.endswith(".ltx"))
    return n


def start_seconds(binary, form, cfg, n, latency, timeout):
    """Seconds until `n` level-0 files exist under the form's replica root."""
    root = os.path.join(WORK, f"r-{form}")
    shutil.rmtree(root, ignore_errors=True)
    for d in os.listdir(os.path.join(WORK, "t")):
        if d.endswith("-replicad"):
            shutil.rmtree(os.path.join(WORK, "t", d))
    env = dict(os.environ)
    if latency:
        env["REPLICAD_DRILL_FAULTS"] = f"latency={latency}"
    t0 = time.monotonic()
    log = open(os.path.join(WORK, f"{form}-{latency or 'none'}.log"), "wb")
    p = subprocess.Popen([binary, "replicate", "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                         env=env)
    try:
        while level0_files(root) < n:
            if time.monotonic() - t0 > timeout or p.poll() is not None:
                return None
            time.sleep(0.1)
        return time.monotonic() - t0
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dbs", type=int, default=1000)
    ap.add_argument("--latency", default="20ms", help="drill latency per storage call")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--bin", default=BIN, help="the replicad binary (another build to compare)")
    args = ap.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=h.REPO,
                          capture_output=True, text=True).stdout.strip()
    cfgs = prepare(args.dbs)
    rows = []
    for latency in ("", args.latency):
        for form in ("dbs", "dir"):
            s = start_seconds(args.bin, form, cfgs[form], args.dbs, latency, args.timeout)
            rows.append((form, latency or "none", s))
            h.log(f"{form}, latency {latency or 'none'}: "
                  f"{'timed out' if s is None else f'{s:.2f} s'}")
    which = f"at {head}" if args.bin == BIN else args.bin
    print(f"\nreplicad {which}, {args.dbs} databases, seconds until all replicated")
    print("| databases | added latency per call | s |\n|---|---|---|")
    for form, latency, s in rows:
        shown = "timed out" if s is None else f"{s:.2f}"
        print(f"| {'configured' if form == 'dbs' else 'discovered (dir)'} | {latency} | {shown} |")


if __name__ == "__main__":
    main()
