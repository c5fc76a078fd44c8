#!/usr/bin/env python3
"""replicad vs Litestream, side by side, in one run: the whole comparison of issue 6.

Usage (from anywhere; paths are relative to the repository root):

    python3 benches/compare/run.py            # everything, ~22 min on 2 cores once tools are built
    python3 benches/compare/run.py --quick    # shorter windows (~3.5 min), for a smoke run

Both tools run alternately (the order flips from one figure to the next) against the same
loopback S3 server (s3s-fs) and the same generated databases. The idle figures of one tool
come from one window in which its 1-, 100- and 400-database processes run side by side.
Prints one table, each figure for both tools and the ratio replicad / Litestream, then the
wall time of each phase, and writes benches/compare/results/results-compare-<UTC time>.json with
every raw figure (phase_s and setup_s: the wall times).

Figures: idle CPU / RSS / threads / fds at 1, 100 and 400 databases, syscalls per idle tick
per database (strace -c -f), S3 requests per database per idle hour, lag commit -> object
(p50/p99, one commit every 100 ms), the same lag while a level-9 snapshot of the 1 GiB
database is written every 20 s (and, for replicad, a verify; maint_lag.py), app write throughput (none / Litestream / replicad),
the application's own wal_checkpoint(TRUNCATE) beside a writer (latency, calls ended busy),
initial snapshot of the 1 GiB database (MB/s, peak RSS), restore of it (MB/s, peak RSS), on
S3 and on a directory replica (where replicad's snapshot seconds go: start-up, build with its
read and compress CPU, fsync, upload).

Python 3 standard library; strace and GNU time from Debian (installed with apt-get when
missing and running as root). See README.md next to this file.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402
import restore as rst  # noqa: E402
import maint_lag  # noqa: E402
from harness import REPO, WORK, ensure_system_tools, log, raise_fd_limit  # noqa: E402
from idle import idle_set, scale_prepare, scale_run  # noqa: E402
from busy import appckpt_run, dir_run, lag_run, write_run  # noqa: E402
from report import build_table, print_seconds, print_table  # noqa: E402


# ----------------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short windows: a smoke run, not figures")
    p.add_argument("--no-build", action="store_true", help="use target/release/replicad as is")
    p.add_argument("--dbs", default="1,100,400", help="idle database counts")
    p.add_argument("--window", type=float, default=60.0, help="idle window, s")
    p.add_argument("--settle", type=float, default=40.0,
                   help="s after every database has replicated, before the idle window (past the first L1 compaction)")
    p.add_argument("--strace-dbs", default="100", help="idle counts for which strace runs")
    p.add_argument("--strace-seconds", type=float, default=10.0)
    p.add_argument("--startup-timeout", type=float, default=180.0)
    p.add_argument("--lag-seconds", type=float, default=30.0)
    p.add_argument("--maint-seconds", type=float, default=70.0,
                   help="writer window of each maint run (a 1 GiB snapshot every 20 s)")
    p.add_argument("--sparse-commits", type=int, default=40,
                   help="commits of the sparse lag run (2-5 s apart)")
    p.add_argument("--write-seconds", type=float, default=15.0)
    p.add_argument("--batch", type=int, default=1000, help="rows per write transaction")
    p.add_argument("--write-rounds", type=int, default=2,
                   help="rounds of (none, litestream, replicad) write runs, then one more none")
    p.add_argument("--size-mib", type=int, default=1024, help="snapshot/restore database size")
    p.add_argument("--scale", type=int, default=10000,
                   help="databases in one process for the scale figure (0: skip)")
    p.add_argument("--scale-timeout", type=float, default=300.0)
    p.add_argument("--scale-litestream", action="store_true",
                   help="also try Litestream at --scale databases (it fails at 10,000 here)")
    p.add_argument("--scale-apart", action="store_true",
                   help="run the scale process on its own (start, --settle, window) instead of "
                        "within replicad's idle set")
    p.add_argument("--appckpt-count", type=int, default=10,
                   help="application TRUNCATE checkpoints per tool in the appckpt phase")
    p.add_argument("--appckpt-busy", type=float, default=5.0,
                   help="the application's busy timeout for its checkpoints, s")
    p.add_argument("--skip", default="", help="comma list of: idle,scale,lag,maint,write,appckpt,snapshot,restore,dir")
    args = p.parse_args()
    if args.quick:  # shorter windows, unless given on the command line
        given = {a.split("=")[0] for a in sys.argv[1:] if a.startswith("--")}
        for key, val in (("window", 10.0), ("settle", 35.0), ("dbs", "1,100"), ("lag_seconds", 10.0), ("sparse_commits", 8), ("maint_seconds", 25.0),
                         ("write_seconds", 5.0), ("write_rounds", 1), ("strace_seconds", 5.0), ("size_mib", 64),
                         ("scale", 1000)):
            if "--" + key.replace("_", "-") not in given:
                setattr(args, key, val)
    skip = set(filter(None, args.skip.split(",")))
    started = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")

    phase_s, setup_s = {}, {}
    t = time.monotonic()
    ensure_system_tools()
    setup_s["apt"] = round(time.monotonic() - t, 1)
    fd_limit = raise_fd_limit()
    setup_s.update(h.ensure_tools(not args.no_build))
    os.makedirs(WORK, exist_ok=True)
    r = {"started_utc": stamp, "args": vars(args), "fd_limit": fd_limit,
         "versions": {"replicad": h.version_of([h.REPLICAD_BIN, "--version"]),
                      "litestream": h.version_of([h.LITESTREAM_BIN, "version"])},
         "git_head": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip(),
         "cpus": os.cpu_count(), "idle": {}, "idle_dbs": [int(x) for x in args.dbs.split(",")],
         "phase_s": phase_s, "setup_s": setup_s}
    source = meta = None
    if not {"snapshot", "restore", "dir", "maint"} <= skip:
        t = time.monotonic()
        source, meta = h.ensure_db(args.size_mib)
        setup_s["database"] = round(time.monotonic() - t, 1)
        r["database"] = dict(meta, path=os.path.relpath(source, REPO))

    def timed(name, fn):
        t = time.monotonic()
        try:
            return fn()
        finally:
            phase_s[name] = round(time.monotonic() - t, 1)
            log(f"phase {name} took {phase_s[name]} s")

    t = time.monotonic()
    s3 = h.S3Server()  # waits while another benchmark run holds the lock; wipes the old root
    setup_s["s3 server start"] = round(time.monotonic() - t, 1)
    phase_s["setup"] = round(time.monotonic() - started, 1)
    log(f"setup took {phase_s['setup']} s: {setup_s}")
    try:
        tools = ["replicad", "litestream"]
        # The scale process (replicad, default) runs within replicad's idle set: started
        # first and alone (its start time is measured alone), then sampled over the same
        # window as the idle processes. With --skip idle or --scale-apart it runs on its own.
        want_scale = "scale" not in skip and args.scale
        if want_scale and args.scale_litestream:
            # Litestream keeps about four descriptors a database (SQLite: database twice, WAL,
            # shared memory) and has no budget: cap the count for it. replicad is not capped:
            # idle databases go dormant (no descriptor) when open ones near a fifth of its
            # open-file limit (docs/operations.md, "Many databases in one process").
            fits = int((fd_limit - 500) / 4.2)
            if args.scale > fits:
                log(f"--scale {args.scale} needs ~{4.2 * args.scale + 500:.0f} open files; the hard "
                    f"limit here is {fd_limit} and cannot be raised (no CAP_SYS_RESOURCE): using {fits}")
                r["scale_capped_by_fd_limit"] = {"asked": args.scale, "used": fits}
                args.scale = fits
        scale_apart = want_scale and ("idle" in skip or args.scale_apart)
        if "idle" not in skip:
            strace_n = {int(x) for x in args.strace_dbs.split(",") if x}
            t = time.monotonic()
            sc = scale_prepare("replicad", args.scale) if want_scale and not scale_apart else None
            for tool in tools:
                for n, res in idle_set(tool, r["idle_dbs"], s3, args, strace_n,
                                       sc if tool == "replicad" else None).items():
                    r["idle"][f"{tool}-{n}"] = res
            # The scale process's own share of the wall time: making its databases, waiting
            # for its start, its shutdown (the window is the idle set's).
            scale_s = round(sc["harness_s"], 1) if sc is not None else 0
            phase_s["idle"] = round(time.monotonic() - t - scale_s, 1)
            if sc is not None:
                r["scale"] = {"replicad": dict(sc["res"], with_idle_set=True)}
                phase_s["scale"] = scale_s
            log(f"phase idle took {phase_s['idle']} s"
                + (f" (+ {scale_s} s for the scale process)" if sc is not None else ""))
        if scale_apart or (want_scale and args.scale_litestream):
            def scale():
                if scale_apart:
                    r["scale"] = {"replicad": scale_run("replicad", args.scale, args)}
                if args.scale_litestream:
                    r.setdefault("scale", {})["litestream"] = scale_run("litestream", args.scale, args)
            timed("scale" if scale_apart else "scale_litestream", scale)
        if "lag" not in skip:
            r["lag"] = timed("lag", lambda: {t: lag_run(t, s3, args) for t in tools[::-1]})
            r["lag_sparse"] = timed("lag_sparse", lambda: {
                t: lag_run(t, s3, args, "sparse") for t in tools[::-1]})
        if "maint" not in skip:
            ml = argparse.Namespace(seconds=args.maint_seconds, snapshot_interval="20s")

            def maint():
                out = {}
                for tool in tools[::-1]:
                    out[tool] = maint_lag.run_case(tool, False, source, ml)
                    if tool == "replicad":
                        out["replicad-verify"] = maint_lag.run_case(tool, True, source, ml)
                return out
            r["maint"] = timed("maint", maint)
        if "write" not in skip:
            # Rounds of (none, litestream, replicad), then none again: the VM's own rate drifts
            # by 10-15 % between 15 s windows, so each mode's figure is the mean of its runs.
            order = ["none", "litestream", "replicad"] * args.write_rounds + ["none"]
            runs = timed("write", lambda: [write_run(m, s3, args) for m in order])
            r["write"], r["write_runs"] = {}, runs
            for mode in ("none", "litestream", "replicad"):
                mine = [x for x in runs if x["mode"] == mode]
                rates = [x["rows_per_s"] for x in mine]
                waits = [x["lock_wait_s"] for x in mine]
                # Every transaction of every run of the mode, pooled.
                lat = sorted(v for x in mine for v in x["latencies_ms"])
                def pct(q):
                    return round(lat[min(len(lat) - 1, int(q * len(lat)))], 1) if lat else None
                r["write"][mode] = dict(mine[0], rows_per_s=round(sum(rates) / len(rates)),
                                        runs_rows_per_s=rates,
                                        lock_wait_s=round(sum(waits) / len(waits), 2),
                                        runs_lock_wait_s=waits,
                                        commit_ms={"p50": pct(0.5), "p99": pct(0.99),
                                                   "max": round(lat[-1], 1) if lat else None,
                                                   "transactions": len(lat)},
                                        wal_peak_mib=max(x["wal_peak_mib"] for x in mine))
                r["write"][mode].pop("latencies_ms", None)
            for x in runs:
                x.pop("latencies_ms", None)
        if "appckpt" not in skip:
            r["appckpt"] = timed("appckpt", lambda: {
                m: appckpt_run(m, s3, args) for m in ("none", "litestream", "replicad")})
        if "snapshot" not in skip:
            r["snapshot"], state = {}, {}

            def snapshot():
                for idx, (tool, codec) in enumerate([("litestream", "lz4"), ("replicad", "lz4"),
                                                     ("replicad", "zstd:3")], start=1):
                    r["snapshot"][f"{tool}-{codec}"] = h.one_run(
                        idx, tool, codec, source, meta["bytes"], s3, 600, 0, state)
            timed("snapshot", snapshot)
        if "restore" not in skip and "snapshot" not in skip:
            r["restore"], verifier = {}, rst.Verifier()

            def restore():
                for idx, tool in enumerate(["replicad", "litestream"], start=1):
                    made = r["snapshot"][f"{tool}-lz4"]
                    rep = {"name": made["prefix"], "tool": tool, "codec": "lz4", "kind": "s3",
                           "root": os.path.join(s3.root, h.BUCKET, made["prefix"]),
                           "prefix": made["prefix"], "db_bytes": meta["bytes"], "rows": meta["rows"]}
                    r["restore"][tool] = rst.run_case(1, idx, "s3", tool, rep, False, s3, verifier)
            timed("restore", restore)
        if "dir" not in skip:
            r["dir"] = timed("dir", lambda: dir_run(source, meta, s3))
    finally:
        s3.stop()
    r["elapsed_s"] = round(time.monotonic() - started, 1)
    table = build_table(r)
    r["table"] = [dict(zip(("figure", "replicad", "litestream", "ratio", "target"), row)) for row in table]
    results_dir = os.path.join(h.HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    out = os.path.join(results_dir, f"results-compare-{stamp}.json")
    with open(out, "w") as f:
        json.dump(r, f, indent=1, default=str)
    print(f"\nreplicad {r['versions']['replicad']} vs Litestream {r['versions']['litestream']}, "
          f"{r['cpus']} CPUs, {r['elapsed_s']} s in all\n")
    print_table(table)
    print_seconds(r)
    print("\nwall time by phase, s: " + ", ".join(f"{k} {v}" for k, v in phase_s.items())
          + f"; total {r['elapsed_s']}")
    if setup_s:
        print("setup steps, s: " + ", ".join(f"{k} {v}" for k, v in setup_s.items()))
    print(f"\nJSON: {os.path.relpath(out, REPO)}")


if __name__ == "__main__":
    main()
