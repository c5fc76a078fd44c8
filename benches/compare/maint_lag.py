#!/usr/bin/env python3
"""Commit lag while the replica is being maintained: a writer commits every 100 ms (50-150 ms,
same seed for every run) into a 1 GiB database replicated to a local directory, while the
tool writes a level-9 snapshot of the whole database every `--snapshot-interval`. replicad
runs it twice: with the snapshot alone, and with `verify-interval` as well (a restore and
check of the replica, replicad only). Not part of `cargo test`.

Usage (from anywhere; paths are relative to the repository root):

    python3 benches/compare/maint_lag.py              # ~5 min once the database is cached
    python3 benches/compare/maint_lag.py --no-build --tools replicad

A thread polls the replica's level-0 directory every 5 ms; a commit's lag is the time from
its COMMIT to the first new level-0 file after it. The figures: lag p50 / p99 / max, the
commits that waited more than 2 s, and the level-9 files the tool wrote in the window (a
run in which none was written measured nothing). Both tools run with their defaults
otherwise (Litestream lz4; replicad lz4 too, as the config is one Litestream can read).

Prints one table and writes benches/compare/results/results-maintlag-<UTC time>.json.
Python 3 standard library; the tools are installed as by s3_snapshot.py.
"""

import argparse
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402
import large  # noqa: E402

WORK = os.path.join(h.DATA, "maintlag")
LTX = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.ltx$")
log = h.log


def ltx_files(d):
    """(min, max) TXIDs of the whole LTX files in `d` (Litestream writes `.ltx.tmp` first)."""
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return [(int(m[1], 16), int(m[2], 16)) for m in map(LTX.match, names) if m]


def max_txid(d):
    return max((hi for _, hi in ltx_files(d)), default=0)


def run_case(tool, verify, source, args):
    name = f"{tool}-verify" if verify else tool
    workdir = os.path.join(WORK, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    db = os.path.join(workdir, "app.db")
    root = os.path.join(workdir, "replica")
    log(f"{name}: copying the source")
    shutil.copyfile(source, db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE IF NOT EXISTS lag (id INTEGER PRIMARY KEY, i INTEGER, note TEXT)")
    con.close()
    os.sync()
    extra = f"verify-interval: {args.snapshot_interval}\n" if verify else ""
    cfg = os.path.join(workdir, f"{tool}.yml")
    with open(cfg, "w") as f:
        f.write(f"{extra}snapshot:\n  interval: {args.snapshot_interval}\n"
                f"dbs:\n  - path: {db}\n    replica:\n      type: file\n      path: {root}\n")
    if tool == "replicad":
        cmd = [h.REPLICAD_BIN, "replicate", "--config", cfg]
    else:
        cmd = [h.LITESTREAM_BIN, "replicate", "-config", cfg]
    logf = open(os.path.join(workdir, f"{tool}.log"), "wb")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=workdir,
                            env=large.tool_env(tool), start_new_session=True)
    l0, l9 = os.path.join(root, "ltx", "0"), os.path.join(root, "ltx", "9")
    res = {"tool": tool, "case": name, "command": cmd}
    try:
        t0 = time.monotonic()
        while max_txid(l0) == 0 and time.monotonic() - t0 < 120 and proc.poll() is None:
            time.sleep(0.05)
        if max_txid(l0) == 0:
            raise RuntimeError(f"{name}: no level-0 file after {time.monotonic() - t0:.0f} s")
        res["initial_snapshot_s"] = round(time.monotonic() - t0, 1)
        time.sleep(3)
        events, stop_ev = [], threading.Event()
        snaps0 = set(ltx_files(l9))

        def poll():
            cur = max_txid(l0)
            while not stop_ev.is_set():
                m = max_txid(l0)
                if m > cur:
                    events.append((time.monotonic(), m))
                    cur = m
                time.sleep(0.005)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        con = sqlite3.connect(db, timeout=30, isolation_level=None)
        con.execute("PRAGMA busy_timeout=30000")
        commits, jitter = [], random.Random(20261127)
        start = nxt = time.monotonic()
        i = 0
        while time.monotonic() - start < args.seconds:
            m_pre = max_txid(l0)
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO lag (i, note) VALUES (?, ?)", (i, "y" * 40))
            con.execute("COMMIT")
            commits.append((time.monotonic(), m_pre))
            i += 1
            nxt += jitter.uniform(0.05, 0.15)
            time.sleep(max(0.0, nxt - time.monotonic()))
        con.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (events and events[-1][0] > commits[-1][0]):
            time.sleep(0.05)
        stop_ev.set()
        th.join()
        lags = []
        for t_c, m_pre in commits:
            seen = next((t for t, m in events if m > m_pre and t >= t_c), None)
            lags.append(seen - t_c if seen is not None else float("inf"))
        lags.sort()

        def pct(p):
            return round(1000 * lags[min(len(lags) - 1, int(p * len(lags)))], 1)

        res.update(commits=len(commits), p50_ms=pct(0.5), p99_ms=pct(0.99),
                   max_ms=round(1000 * lags[-1], 1),
                   over_2s=sum(1 for x in lags if x > 2.0),
                   snapshots_in_window=len(set(ltx_files(l9)) - snaps0))
        st = h.proc_stats(proc.pid)
        res["peak_rss_mib"] = round(st.get("VmHWM", 0) / 1024, 1)
        res["cpu_s"] = round(st.get("cpu_s", 0.0), 1)
        log(f"  {name}: {res}")
    finally:
        res["exit_code"] = large.stop(proc, logf, 60)
    with open(os.path.join(workdir, f"{tool}.log"), errors="replace") as f:
        text = f.read()
    res["verifies_ok"] = text.count("verify ok")
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--seconds", type=float, default=70, help="writer window per run")
    p.add_argument("--snapshot-interval", default="20s")
    p.add_argument("--tools", default="replicad,litestream")
    p.add_argument("--no-verify", action="store_true", help="skip replicad's verify run")
    p.add_argument("--no-build", action="store_true")
    args = p.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    h.ensure_tools(not args.no_build)
    source, meta = h.ensure_db(args.size_mib)
    commit = subprocess.run(["git", "-C", h.REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    r = {"started_utc": stamp, "commit": commit, "args": vars(args), "database": meta,
         "runs": []}
    for tool in args.tools.split(","):
        r["runs"].append(run_case(tool, False, source, args))
        if tool == "replicad" and not args.no_verify:
            r["runs"].append(run_case(tool, True, source, args))
    print(f"\ncommit {commit}; writer every 50-150 ms for {args.seconds:.0f} s; "
          f"snapshot every {args.snapshot_interval}")
    print("| run | commits | lag p50 ms | p99 ms | max ms | commits over 2 s | level-9 files "
          "| verifies ok | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for x in r["runs"]:
        print(f"| {x['case']} | {x.get('commits')} | {x.get('p50_ms')} | {x.get('p99_ms')} | "
              f"{x.get('max_ms')} | {x.get('over_2s')} | {x.get('snapshots_in_window')} | "
              f"{x.get('verifies_ok')} | {x.get('peak_rss_mib')} |")
    out = os.path.join(h.HERE, "results", f"results-maintlag-{stamp}.json")
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
    print(f"\n{out}")


if __name__ == "__main__":
    main()
