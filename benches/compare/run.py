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
import random
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402
import restore as rst  # noqa: E402
import maint_lag  # noqa: E402

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


# ----------------------------------------------------------------------------- idle

BUCKET_ROUTE = re.compile(r'resolved route, op: (\w+), s3_path: (?:Bucket \{ bucket: "([^"]*)"'
                          r'|Object \{ bucket: "([^"]*)", key: "([^"]*)")')


def requests_by_bucket(s3, start, end):
    """S3 requests the server logged between two log offsets: {bucket: {op: count}}, and
    {bucket: {level directory: PutObject count}} (keys <prefix>/dbNNNN/<level>/<file>; other
    keys count as "other"). Every route line names the bucket (ListObjectsV2 names nothing
    else), so one bucket per process attributes every request exactly."""
    with open(s3.log_path, "rb") as f:
        f.seek(start)
        text = h.ANSI.sub("", f.read(end - start).decode("utf-8", "replace"))
    ops_by, puts_by = {}, {}
    for m in BUCKET_ROUTE.finditer(text):
        op, bucket, key = m.group(1), m.group(2) or m.group(3), m.group(4)
        ops = ops_by.setdefault(bucket, {})
        ops[op] = ops.get(op, 0) + 1
        if op == "PutObject" and key is not None:
            parts = key.split("/")
            level = parts[2] if len(parts) >= 4 else "other"
            lv = puts_by.setdefault(bucket, {})
            lv[level] = lv.get(level, 0) + 1
    return ({b: dict(sorted(o.items())) for b, o in ops_by.items()},
            {b: dict(sorted(o.items())) for b, o in puts_by.items()})


def load_strace():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "idle_measure", os.path.join(REPO, "benches", "idle", "measure.py"))
    im = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(im)
    return im


def idle_set(tool, ns, s3, args, strace_ns, scale=None):
    """One process per database count in `ns`, all of `tool`, started together; each with its
    own work directory, databases, config and S3 bucket (bench-idle-<n>, prefixes
    idle-<tool>-<n>/dbNNNN). Once every database of every process has its first L0 object:
    one settle, then one window in which every process is sampled (CPU, RSS, threads, fds,
    its bucket's requests), then strace of the processes in `strace_ns`, one after the other.

    `scale` (from scale_prepare, same tool): that process is started first, alone, and timed
    until all its databases are replicated (its start_s); then the idle processes start and
    it is sampled over the same window as they are.

    Returns {n: result} with the fields of one run per process."""
    procs = []  # dicts: n, name, bucket, prefixes, proc, logf, logp, t0, res
    for n in ns:
        name = f"idle-{tool}-{n}"
        bucket = f"bench-idle-{n}"
        workdir = os.path.join(WORK, name)
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        shutil.rmtree(os.path.join(s3.root, bucket, name), ignore_errors=True)
        os.makedirs(os.path.join(s3.root, bucket), exist_ok=True)  # s3s-fs: a bucket is a directory
        dbs = make_small_dbs(os.path.join(workdir, "db"), n)
        prefixes = [f"{name}/db{i:04d}" for i in range(n)]
        cfg = os.path.join(workdir, f"{tool}.yml")
        write_config(tool, cfg, dbs, prefixes, s3, bucket=bucket)
        procs.append({"n": n, "name": name, "bucket": bucket, "prefixes": prefixes, "cfg": cfg,
                      "workdir": workdir, "res": {"tool": tool, "dbs": n, "bucket": bucket}})
    os.sync()
    live = []
    try:
        if scale is not None:
            if scale_start(scale, args):
                live.append(scale)
            else:
                scale_finish(scale)
        log(f"idle {tool}: starting {', '.join(str(n) for n in ns)} databases, one process each")
        for p in procs:
            p["t0"] = time.monotonic()
            p["proc"], p["logf"], p["logp"] = start(tool, p["cfg"], p["workdir"])
        pending = {p["name"]: set(p["prefixes"]) for p in procs}
        t0 = min(p["t0"] for p in procs)
        while any(pending.values()) and time.monotonic() - t0 < args.startup_timeout:
            for p in procs:
                left = pending[p["name"]]
                if not left or p["proc"].poll() is not None:
                    continue
                left -= {x for x in left if max_txid(l0_dir(s3, x, p["bucket"])) > 0}
                if not left:
                    p["res"]["start_s"] = round(time.monotonic() - p["t0"], 2)
            if all(p["proc"].poll() is not None for p in procs if pending[p["name"]]):
                break
            time.sleep(0.1)
        bad = [p for p in procs if pending[p["name"]]]
        for p in bad:
            p["res"]["error"] = (f"{len(pending[p['name']])} databases had no L0 file after the "
                                 f"startup timeout (exit code {p['proc'].poll()})")
            log(f"  {p['name']}: {p['res']['error']}")
        live += [p for p in procs if p not in bad]
        if not live:
            return {p["n"]: p["res"] for p in procs}
        starts = ", ".join(f"{p['n']}: {p['res']['start_s']} s" for p in procs if p not in bad)
        log(f"  all replicated ({starts}); settling {args.settle:.0f} s")
        # Settle past the first L1 compaction of both tools (replicad: 30 s after each
        # replica's start; Litestream: its 30 s tick, aligned to the wall clock), counted from
        # the last process's last first segment, so that only idle is measured.
        time.sleep(args.settle)
        off0 = s3.log_offset()
        for p in live:
            if "prefixes" in p:
                p["segs0"] = sum(max_txid(l0_dir(s3, x, p["bucket"])) for x in p["prefixes"])
            p["a"], p["w0"] = proc_sample(p["proc"].pid), time.monotonic()
            p["threads"] = {p["a"]["threads"]}
        w0 = min(p["w0"] for p in live)
        while time.monotonic() - w0 < args.window:
            time.sleep(1)
            for p in live:
                p["threads"].add(h.proc_stats(p["proc"].pid).get("Threads"))
        for p in live:
            p["b"], p["secs"] = proc_sample(p["proc"].pid), time.monotonic() - p["w0"]
        by_bucket, puts_by_bucket = requests_by_bucket(s3, off0, s3.log_offset())
        for p in live:
            a, b, secs, res, n = p["a"], p["b"], p["secs"], p["res"], p["n"]
            res.update(window_s=round(secs, 1),
                       cpu_pct=round(100 * (b["cpu_s"] - a["cpu_s"]) / secs, 3),
                       rss_mib=b["rss_mib"], hwm_mib=b["hwm_mib"], fds=b["fds"],
                       concurrent_with=[q["n"] for q in live if q is not p])
            if p is scale:
                res.update(threads=b["threads"], settle_s=round(p["w0"] - p["replicated_at"], 1))
                log(f"  {p['name']}: cpu {res['cpu_pct']}%  rss {res['rss_mib']} MiB  "
                    f"fds {res['fds']}")
                continue
            ops = by_bucket.get(p["bucket"], {})
            threads = {t for t in p["threads"] if t is not None}
            res.update(
                threads=(f"{min(threads)}-{max(threads)}" if len(threads) > 1
                         else str(b["threads"])),
                requests_in_window=ops,
                puts_in_window_by_level=puts_by_bucket.get(p["bucket"], {}),
                requests_per_db_hour=round(sum(ops.values()) * 3600 / secs / n, 2),
                new_l0_in_window=sum(max_txid(l0_dir(s3, x, p["bucket"])) for x in p["prefixes"])
                - p["segs0"])
            log(f"  {p['name']}: cpu {res['cpu_pct']}%  rss {res['rss_mib']} MiB  threads "
                f"{res['threads']}  fds {res['fds']}  requests {ops}")
        other = {b: o for b, o in by_bucket.items() if b not in {p.get("bucket") for p in live}}
        if other:
            log(f"  requests to other buckets in the window: {other}")
        for p in live:
            if p is scale or p["n"] not in strace_ns:
                continue
            im = load_strace()
            out = os.path.join(p["workdir"], "strace.txt")
            rows, elapsed, _, _ = im.run_strace(p["proc"].pid, args.strace_seconds, out)
            rows.pop("total", None)
            total = sum(r["calls"] for r in rows.values())
            ticks = p["n"] * elapsed / 1.0  # both tools: 1 s monitor interval
            top = sorted(rows.items(), key=lambda kv: -kv[1]["calls"])[:8]
            p["res"]["syscalls_per_db_tick"] = round(total / ticks, 2)
            p["res"]["syscalls_top"] = {k: round(v["calls"] / ticks, 3) for k, v in top}
            log(f"  {p['name']}: syscalls per db per tick {p['res']['syscalls_per_db_tick']}: "
                f"{p['res']['syscalls_top']}")
    finally:
        # SIGTERM to all first: they shut down in parallel.
        for p in procs + ([scale] if scale is not None and "proc" in scale else []):
            if "proc" in p and p["proc"].poll() is None:
                p["proc"].send_signal(signal.SIGTERM)
        for p in procs:
            if "proc" in p:
                p["res"]["exit_code"] = stop(p["proc"], p["logf"], signalled=True)
                p["res"]["log_problems"] = h.problem_lines(p["logp"])[:10]
        if scale is not None:
            scale_finish(scale, signalled=True)
    return {p["n"]: p["res"] for p in procs}


# ----------------------------------------------------------------------------- scale

def scale_prepare(tool, n):
    """`n` databases for one process, file replicas, and its config. The databases are copies
    of one small database (creating 10,000 with SQLite takes minutes)."""
    t = time.monotonic()
    name = f"scale-{tool}-{n}"
    workdir = os.path.join(WORK, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(os.path.join(workdir, "db"))
    seed = make_small_dbs(os.path.join(workdir, "seed"), 1)[0]
    dbs, reps = [], []
    for i in range(n):
        p = os.path.join(workdir, "db", f"db{i:05d}.db")
        shutil.copyfile(seed, p)
        dbs.append(p)
        reps.append(os.path.join(workdir, "replica", f"r{i:05d}"))
    cfg = os.path.join(workdir, f"{tool}.yml")
    with open(cfg, "w") as f:
        f.write("dbs:\n")
        for db, rep in zip(dbs, reps):
            f.write(f"  - path: {db}\n    replica:\n      type: file\n      path: {rep}\n")
    return {"n": n, "name": name, "workdir": workdir, "cfg": cfg, "reps": reps,
            "res": {"tool": tool, "dbs": n}, "harness_s": time.monotonic() - t}


def scale_start(sc, args):
    """Starts the process and waits until every database has its first level-0 file on its
    replica (start_s). True when it got there."""
    t = time.monotonic()
    res, n, tool = sc["res"], sc["n"], sc["res"]["tool"]
    log(f"{sc['name']}: starting")
    sc["t0"] = time.monotonic()
    sc["proc"], sc["logf"], sc["logp"] = start(tool, sc["cfg"], sc["workdir"])
    proc = sc["proc"]
    pending = list(sc["reps"])
    while pending and proc.poll() is None and time.monotonic() - sc["t0"] < args.scale_timeout:
        pending = [r for r in pending if max_txid(os.path.join(r, "ltx", "0")) == 0
                   and max_txid(os.path.join(r, "0000")) == 0]
        time.sleep(0.5)
    if proc.poll() is not None:
        res["error"] = f"exited with {proc.returncode} during start"
    elif pending:
        res["error"] = f"{len(pending)} of {n} databases had no L0 file after {args.scale_timeout} s"
    else:
        sc["replicated_at"] = time.monotonic()
        res["start_s"] = round(sc["replicated_at"] - sc["t0"], 1)
        log(f"  all {n} databases replicated {res['start_s']} s after start")
    if "error" in res:
        log(f"  {res['error']}")
    sc["harness_s"] += time.monotonic() - t
    return "error" not in res


def scale_finish(sc, signalled=False):
    if sc.get("finished"):
        return
    sc["finished"] = True
    t = time.monotonic()
    if "proc" in sc:
        sc["res"]["exit_code"] = stop(sc["proc"], sc["logf"], signalled)
        sc["res"]["stop_s"] = round(time.monotonic() - t, 1)
        sc["res"]["log_problems"] = h.problem_lines(sc["logp"])[:10]
        keep = os.path.join(WORK, f"{sc['name']}.log")  # the work directory goes, the log stays
        shutil.move(sc["logp"], keep)
        sc["res"]["log"] = os.path.relpath(keep, REPO)
    shutil.rmtree(sc["workdir"], ignore_errors=True)
    sc["harness_s"] += time.monotonic() - t


def scale_run(tool, n, args):
    """The scale figure on its own (with --skip idle, --scale-apart or --scale-litestream):
    start, then --settle s, then idle CPU and RSS over the window."""
    sc = scale_prepare(tool, n)
    os.sync()
    res = sc["res"]
    try:
        if scale_start(sc, args):
            log(f"  settling {args.settle} s")
            time.sleep(args.settle)
            proc = sc["proc"]
            a = proc_sample(proc.pid)
            w0 = time.monotonic()
            time.sleep(args.window)
            b = proc_sample(proc.pid)
            secs = time.monotonic() - w0
            res.update(window_s=round(secs, 1), settle_s=round(w0 - sc["replicated_at"], 1),
                       cpu_pct=round(100 * (b["cpu_s"] - a["cpu_s"]) / secs, 3),
                       rss_mib=b["rss_mib"], hwm_mib=b["hwm_mib"], threads=b["threads"],
                       fds=b["fds"])
            log(f"  {sc['name']}: cpu {res['cpu_pct']}%  rss {res['rss_mib']} MiB  fds {res['fds']}")
    finally:
        scale_finish(sc)
    return res


# ----------------------------------------------------------------------------- lag

# Commit gaps of the lag runs (uniform, s) and how many commits each makes.
LAG_MODES = {"busy": (0.05, 0.15), "sparse": (2.0, 5.0)}


def lag_run(tool, s3, args, mode="busy"):
    name = f"lag-{mode}-{tool}"
    workdir = os.path.join(WORK, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    shutil.rmtree(os.path.join(s3.root, h.BUCKET, name), ignore_errors=True)
    db = make_small_dbs(os.path.join(workdir, "db"), 1)[0]
    cfg = os.path.join(workdir, f"{tool}.yml")
    write_config(tool, cfg, [db], [name], s3)
    rep = l0_dir(s3, name)
    proc, logf, logp = start(tool, cfg, workdir)
    res = {"tool": tool}
    try:
        t0 = time.monotonic()
        while max_txid(rep) == 0 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        time.sleep(2)
        events, stop_ev, lock = [], threading.Event(), threading.Lock()

        def poll():
            cur = max_txid(rep)
            while not stop_ev.is_set():
                m = max_txid(rep)
                if m > cur:
                    with lock:
                        events.append((time.monotonic(), m))
                    cur = m
                time.sleep(0.005)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        con = sqlite3.connect(db, timeout=10, isolation_level=None)
        con.execute("PRAGMA busy_timeout=10000")
        commits = []
        nxt = time.monotonic()
        jitter = random.Random(20261122)
        lo, hi = LAG_MODES[mode]
        n = int(args.lag_seconds * 10) if mode == "busy" else args.sparse_commits
        off0 = s3.log_offset()
        for i in range(n):
            m_pre = max_txid(rep)
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO t (name, val, note) VALUES (?, ?, ?)", (f"lag-{i}", i, "y" * 40))
            con.execute("COMMIT")
            commits.append((time.monotonic(), m_pre, time.time()))
            # Mean 100 ms, uniformly jittered (same seed for both tools): with a fixed 100 ms
            # period the commits fall on the same ten offsets of each tool's 1 s tick, and the
            # percentiles measure that alignment rather than the tool.
            nxt += jitter.uniform(lo, hi)
            time.sleep(max(0.0, nxt - time.monotonic()))
        con.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with lock:
                if events and events[-1][1] > max_txid(rep) - 1 and events[-1][0] > commits[-1][0]:
                    break
            time.sleep(0.05)
        time.sleep(0.1)
        stop_ev.set()
        th.join()
        ops = requests_by_bucket(s3, off0, s3.log_offset())[0].get(h.BUCKET, {})
        res["puts_per_commit"] = round(ops.get("PutObject", 0) / max(1, len(commits)), 2)
        res["requests_per_commit"] = round(sum(ops.values()) / max(1, len(commits)), 2)
        res["requests_by_operation"] = ops
        lags, by_commit = [], []
        for t_c, m_pre, wall in commits:
            seen = next((t for t, m in events if m > m_pre and t >= t_c), None)
            if seen is not None:
                lags.append(seen - t_c)
                by_commit.append([round(wall, 3), round(1000 * (seen - t_c), 1)])
        if mode == "sparse":  # [commit time (epoch s), lag ms]: which commits were slow
            res["lag_ms_by_commit"] = by_commit
        lags.sort()
        if lags:
            def pct(p):
                return round(1000 * lags[min(len(lags) - 1, int(p * len(lags)))], 1)
            # min_ms: a commit just before a tick waits for nothing else, so the smallest lag
            # is the tool's own cost from its tick to the object (plus the 5 ms poll).
            res.update(commits=len(commits), seen=len(lags), p50_ms=pct(0.5), p99_ms=pct(0.99),
                       max_ms=round(1000 * lags[-1], 1), min_ms=round(1000 * lags[0], 1))
        log(f"  {name}: {res}")
    finally:
        res["exit_code"] = stop(proc, logf)
    return res


# ----------------------------------------------------------------------------- write throughput

def one_db_replicated(name, mode, s3):
    """A fresh small database in WORK/`name`, replicated by `mode` (none: not replicated) to
    the S3 prefix `name` once its first segment is there. Returns (db, proc, logf)."""
    workdir = os.path.join(WORK, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    shutil.rmtree(os.path.join(s3.root, h.BUCKET, name), ignore_errors=True)
    db = make_small_dbs(os.path.join(workdir, "db"), 1)[0]
    proc = logf = None
    if mode != "none":
        cfg = os.path.join(workdir, f"{mode}.yml")
        write_config(mode, cfg, [db], [name], s3)
        proc, logf, _ = start(mode, cfg, workdir)
        t0 = time.monotonic()
        while max_txid(l0_dir(s3, name)) == 0 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        time.sleep(1)
    return db, proc, logf


def write_run(mode, s3, args):
    name = f"write-{mode}"
    # The previous run's gigabytes of WAL are still being written back: each run starts on a
    # clean page cache, so that none pays for the one before it in its fsyncs.
    os.sync()
    db, proc, logf = one_db_replicated(name, mode, s3)
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    con.execute("PRAGMA busy_timeout=30000")
    con.execute("PRAGMA synchronous=NORMAL")
    payload = "p" * 200
    rows, batches, t0 = 0, 0, time.monotonic()
    # Time spent in BEGIN IMMEDIATE: waiting for the write lock, which only a replication
    # tool's checkpoints hold against this single writer.
    lock_wait = 0.0
    # Each transaction's latency as the application sees it (BEGIN IMMEDIATE to COMMIT
    # returned), and the WAL's size after it: the tail is what a replication tool adds.
    latencies, wal_peak = [], 0
    wal = db + "-wal"
    while time.monotonic() - t0 < args.write_seconds:
        b0 = time.monotonic()
        con.execute("BEGIN IMMEDIATE")
        lock_wait += time.monotonic() - b0
        con.executemany("INSERT INTO t (name, val, note) VALUES (?, ?, ?)",
                        [(f"w{rows + j}", float(j), payload) for j in range(args.batch)])
        con.execute("COMMIT")
        latencies.append(time.monotonic() - b0)
        try:
            wal_peak = max(wal_peak, os.path.getsize(wal))
        except OSError:
            pass
        rows += args.batch
        batches += 1
    secs = time.monotonic() - t0
    con.close()
    res = {"mode": mode, "rows": rows, "batches": batches, "seconds": round(secs, 2),
           "rows_per_s": round(rows / secs), "lock_wait_s": round(lock_wait, 3),
           "latencies_ms": [round(1000 * x, 3) for x in latencies],
           "wal_peak_mib": round(wal_peak / 2**20, 1)}
    if proc is not None:
        # Nothing after the window is measured: SIGKILL rather than SIGTERM, which would have
        # the tool ship its backlog first (15-20 s of uploads at 15 s of writes). The
        # directories and the S3 prefix are fresh for each run.
        proc.kill()
        res["exit_code"] = stop(proc, logf)
        res["stopped"] = "SIGKILL after the window"
    log(f"  {name}: {res}")
    return res


def appckpt_run(mode, s3, args):
    """The application's own `PRAGMA wal_checkpoint(TRUNCATE)`, `--appckpt-count` times one
    second apart, with a busy timeout of `--appckpt-busy` s, beside a writer committing one row
    every 10 ms: how long each call takes and whether it ended busy (not checkpointed)."""
    name = f"appckpt-{mode}"
    db, proc, logf = one_db_replicated(name, mode, s3)
    stop_writer, commits = threading.Event(), [0]

    def writer():
        w = sqlite3.connect(db, timeout=60, isolation_level=None)
        while not stop_writer.is_set():
            w.execute("INSERT INTO t (name, val, note) VALUES ('w', 1.0, ?)", ("n" * 200,))
            commits[0] += 1
            time.sleep(0.01)
        w.close()

    wt = threading.Thread(target=writer)
    wt.start()
    app = sqlite3.connect(db, timeout=args.appckpt_busy, isolation_level=None)
    app.execute(f"PRAGMA busy_timeout={int(args.appckpt_busy * 1000)}")
    calls = []
    try:
        for _ in range(args.appckpt_count):
            time.sleep(1)
            t0 = time.monotonic()
            try:
                busy = app.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.OperationalError:
                busy = 1
            calls.append((round(1000 * (time.monotonic() - t0), 1), busy))
    finally:
        stop_writer.set()
        wt.join()
        app.close()
    lat = sorted(c[0] for c in calls)
    res = {"mode": mode, "calls": len(calls), "busy": sum(c[1] for c in calls),
           "commits": commits[0], "ms": [c[0] for c in calls],
           "p50_ms": lat[len(lat) // 2], "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
           "max_ms": lat[-1]}
    if proc is not None:
        proc.kill()
        res["exit_code"] = stop(proc, logf)
    log(f"  {name}: {res}")
    return res


# ----------------------------------------------------------------------------- report

STAGED = re.compile(r"full segment staged .*?build_ms=(\d+) read_ms=(\d+) compress_ms=(\d+) "
                    r"durable_ms=(\d+)")


def snapshot_seconds(rep):
    """Where the seconds of replicad's directory snapshot went, from its debug log: start-up
    (process start to the segment's first page), build (wall; read and compress are CPU
    seconds summed over the encoder threads), fsync + rename of the staged file, and the
    upload (staged -> object listed, the harness polling every 20 ms)."""
    text = h.ANSI.sub("", open(os.path.join(REPO, rep["log"]), errors="replace").read())
    begin = staged = None
    for line in text.splitlines():
        t = h.TS.search(line)
        if not t:
            continue
        if "writing a full segment" in line and begin is None:
            begin = h.iso_to_epoch(t.group(1))
        m = STAGED.search(line)
        if m and staged is None:
            staged = (h.iso_to_epoch(t.group(1)), [int(x) / 1000 for x in m.groups()])
    if begin is None or staged is None:
        return None
    ts, (build, read, compress, durable) = staged
    startup = begin - rep["started_wall"]
    return {"startup_s": round(startup, 3), "build_s": build, "read_cpu_s": read,
            "compress_cpu_s": compress, "fsync_rename_s": durable,
            "upload_s": round(rep["l0_seconds"] - (ts - rep["started_wall"]), 3),
            "total_s": rep["l0_seconds"], "process_cpu_s_at_exit": rep.get("cpu_s")}


def dir_run(source, meta, s3):
    """Initial snapshot of the 1 GiB database to a directory replica and its restore, each tool
    with its defaults (replicad zstd:3 and its integrity check; Litestream lz4, no check), plus
    replicad lz4 and a replicad restore without the check; then the restores of the same rows
    in four indexed tables (h.ensure_split_db)."""
    out, verifier = {"snapshot": {}, "restore": {}}, rst.Verifier()
    # Made (once, cached) before anything is measured.
    split, split_meta = h.ensure_split_db(source, meta)
    reps = {}
    for tool, codec in (("litestream", "lz4"), ("replicad", "zstd:3"), ("replicad", "lz4")):
        rep = rst.make_replica(f"dir-{tool}-{codec.replace(':', '')}", tool, codec, "dir",
                               source, meta, s3)
        reps[f"{tool}-{codec}"] = rep
        res = {k: rep[k] for k in ("l0_seconds", "peak_rss_mib", "cpu_s", "objects")}
        res["mb_per_s"] = round(meta["bytes"] / 1e6 / rep["l0_seconds"], 1)
        if tool == "replicad":
            res["seconds"] = snapshot_seconds(rep)
        out["snapshot"][f"{tool}-{codec}"] = res
    cases = (("replicad", "replicad-zstd:3", True), ("litestream", "litestream-lz4", False),
             ("replicad", "replicad-zstd:3", False))

    def restores(case, first, reps, into):
        for idx, (tool, key, check) in enumerate(cases, start=first):
            res = rst.run_case(1, idx, case, tool, reps[key], check, s3, verifier)
            res.pop("progress", None)
            into[f"{tool}-{'check' if check else 'nocheck'}"] = res

    try:
        restores("dir", 1, reps, out["restore"])
    finally:
        for rep in reps.values():
            shutil.rmtree(rep["root"], ignore_errors=True)
    # The same rows in four tables, each with its index, as an application has several: the
    # integrity check is then split over the cores.
    reps = {}
    out["restore_4_tables"] = {}
    try:
        for tool, codec in (("litestream", "lz4"), ("replicad", "zstd:3")):
            reps[f"{tool}-{codec}"] = rst.make_replica(
                f"dir4-{tool}-{codec.replace(':', '')}", tool, codec, "dir", split, split_meta, s3)
        restores("dir4", 4, reps, out["restore_4_tables"])
    finally:
        for rep in reps.values():
            shutil.rmtree(rep["root"], ignore_errors=True)
    return out


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return round(a / b, 3)


def build_table(r):
    rows = []  # (figure, replicad, litestream, ratio, target)

    def add(fig, a, b, target=""):
        rows.append((fig, a, b, ratio(a, b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None, target))

    for n in r["idle_dbs"]:
        rd, ls = r["idle"].get(f"replicad-{n}", {}), r["idle"].get(f"litestream-{n}", {})
        add(f"idle CPU % of a core, {n} dbs", rd.get("cpu_pct"), ls.get("cpu_pct"),
            "<= 0.1" if n == 400 else "")
        add(f"idle RSS MiB, {n} dbs", rd.get("rss_mib"), ls.get("rss_mib"),
            "<= 0.25" if n == 400 else "")
        add(f"threads, {n} dbs", rd.get("threads"), ls.get("threads"))
        add(f"fds, {n} dbs", rd.get("fds"), ls.get("fds"))
        add(f"S3 requests per db per idle hour, {n} dbs", rd.get("requests_per_db_hour"),
            ls.get("requests_per_db_hour"))
        if "syscalls_per_db_tick" in rd or "syscalls_per_db_tick" in ls:
            add(f"syscalls per db per idle tick, {n} dbs", rd.get("syscalls_per_db_tick"),
                ls.get("syscalls_per_db_tick"), "replicad <= 4")
    sc = r.get("scale", {})
    if sc:
        rd, ls = sc.get("replicad", {}), sc.get("litestream", {})
        n = rd.get("dbs")
        add(f"{n} dbs: start s (all replicated)", rd.get("start_s", rd.get("error")),
            ls.get("start_s", ls.get("error")), "replicad < 60 s")
        add(f"{n} dbs: idle CPU % of a core", rd.get("cpu_pct"), ls.get("cpu_pct"), "replicad < 5")
        add(f"{n} dbs: idle RSS MiB", rd.get("rss_mib"), ls.get("rss_mib"))
    lag = r.get("lag", {})
    for k in ("min_ms", "p50_ms", "p99_ms"):
        add(f"lag commit -> object {k[:3]} ms (busy, 100 ms gaps)", lag.get("replicad", {}).get(k),
            lag.get("litestream", {}).get(k), "<= 1" if k == "p99_ms" else "")
    lag = r.get("lag_sparse", {})
    for k, fig, target in (("p50_ms", "lag commit -> object p50 ms", "replicad <= 50"),
                           ("p99_ms", "lag commit -> object p99 ms", "replicad <= 150"),
                           ("max_ms", "lag commit -> object max ms", ""),
                           ("puts_per_commit", "PUTs per commit", ""),
                           ("requests_per_commit", "requests per commit", "")):
        add(f"{fig} (sparse, 2-5 s gaps)", lag.get("replicad", {}).get(k),
            lag.get("litestream", {}).get(k), target)
    lag = r.get("lag", {})
    for k, fig in (("puts_per_commit", "PUTs per commit"), ("requests_per_commit", "requests per commit")):
        add(f"{fig} (busy, 100 ms gaps)", lag.get("replicad", {}).get(k),
            lag.get("litestream", {}).get(k), "<= 1" if k == "puts_per_commit" else "")
    mt = r.get("maint", {})
    for key, what in (("replicad", "snapshot"), ("replicad-verify", "snapshot and verify")):
        for k in ("p99_ms", "max_ms"):
            add(f"lag {k[:-3]} ms, busy, 1 GiB dir replica, {what} every 20 s (Litestream: snapshot)",
                mt.get(key, {}).get(k), mt.get("litestream", {}).get(k),
                "<= 1" if k == "p99_ms" else "")
    w = r.get("write", {})
    base = w.get("none", {}).get("rows_per_s")
    add("app write rows/s (no replication: %s, mean of %d)"
        % (base, len(w.get("none", {}).get("runs_rows_per_s", [])) or 1), w.get("replicad", {}).get("rows_per_s"),
        w.get("litestream", {}).get("rows_per_s"))
    add("app write throughput vs none", ratio(w.get("replicad", {}).get("rows_per_s"), base),
        ratio(w.get("litestream", {}).get("rows_per_s"), base), "replicad >= 0.95")
    add("app s waiting for the write lock per %d s window" % round(w.get("none", {}).get("seconds", 15)),
        w.get("replicad", {}).get("lock_wait_s"), w.get("litestream", {}).get("lock_wait_s"))
    lat_none = w.get("none", {}).get("commit_ms", {})
    for k in ("p50", "p99", "max"):
        add(f"app commit latency {k} ms (no replication: {lat_none.get(k)})",
            w.get("replicad", {}).get("commit_ms", {}).get(k),
            w.get("litestream", {}).get("commit_ms", {}).get(k))
    add("app commit latency p99 vs none",
        ratio(w.get("replicad", {}).get("commit_ms", {}).get("p99"), lat_none.get("p99")),
        ratio(w.get("litestream", {}).get("commit_ms", {}).get("p99"), lat_none.get("p99")),
        "replicad <= 1.25")
    add("peak WAL MiB during the writes (no replication: %s)" % w.get("none", {}).get("wal_peak_mib"),
        w.get("replicad", {}).get("wal_peak_mib"), w.get("litestream", {}).get("wal_peak_mib"))
    ac = r.get("appckpt", {})
    none = ac.get("none", {})
    for k in ("p50_ms", "p99_ms", "max_ms"):
        add(f"app wal_checkpoint(TRUNCATE) {k[:-3]} ms beside a writer (no replication: {none.get(k)})",
            ac.get("replicad", {}).get(k), ac.get("litestream", {}).get(k),
            "replicad <= 2000" if k == "p99_ms" else "")
    if ac:
        add("app wal_checkpoint(TRUNCATE) calls that ended busy (of %s; busy timeout %s s)"
            % (none.get("calls"), r["args"].get("appckpt_busy")),
            ac.get("replicad", {}).get("busy"), ac.get("litestream", {}).get("busy"), "replicad 0")
    snap = r.get("snapshot", {})
    for codec in ("lz4", "zstd:3"):
        rd = snap.get(f"replicad-{codec}")
        if rd:
            ls = snap.get("litestream-lz4", {})
            add(f"initial snapshot 1 GiB MB/s (replicad {codec})", rd.get("mb_per_s"),
                ls.get("mb_per_s"), ">= 3.5" if codec == "lz4" else ">= 3")
            add(f"initial snapshot peak RSS MiB (replicad {codec})", rd.get("peak_rss_mib"),
                ls.get("peak_rss_mib"), "<= 0.5")
    res = r.get("restore", {})
    rd, ls = res.get("replicad", {}), res.get("litestream", {})
    add("restore 1 GiB MB/s", rd.get("mb_per_s"), ls.get("mb_per_s"), ">= 3")
    add("restore peak RSS MiB", rd.get("peak_rss_mib"), ls.get("peak_rss_mib"), "<= 0.5")
    d = r.get("dir", {})
    snap, ls = d.get("snapshot", {}), d.get("snapshot", {}).get("litestream-lz4", {})
    for codec, target in (("zstd:3", ">= 3"), ("lz4", ">= 3.5")):
        rd = snap.get(f"replicad-{codec}")
        if rd:
            add(f"directory replica: initial snapshot 1 GiB MB/s (replicad {codec})",
                rd.get("mb_per_s"), ls.get("mb_per_s"), target)
            add(f"directory replica: initial snapshot peak RSS MiB (replicad {codec})",
                rd.get("peak_rss_mib"), ls.get("peak_rss_mib"), "<= 0.5")
    res = d.get("restore", {})
    ls = res.get("litestream-nocheck", {})
    for key, label, target in (("replicad-check", "replicad zstd:3 + integrity_check, "
                                "Litestream no check: each tool's defaults", ">= 3"),
                               ("replicad-nocheck", "replicad zstd:3 without the check", "")):
        rd = res.get(key)
        if rd:
            add(f"directory replica: restore 1 GiB MB/s ({label})", rd.get("mb_per_s"),
                ls.get("mb_per_s"), target)
    if "replicad-check" in res:
        add("directory replica: restore peak RSS MiB", res["replicad-check"].get("peak_rss_mib"),
            ls.get("peak_rss_mib"), "<= 0.5")
    res = d.get("restore_4_tables", {})
    ls = res.get("litestream-nocheck", {})
    for key, label in (("replicad-check", "defaults"), ("replicad-nocheck", "replicad without the check")):
        rd = res.get(key)
        if rd:
            add(f"directory replica: restore 1 GiB in 4 tables MB/s ({label})", rd.get("mb_per_s"),
                ls.get("mb_per_s"))
    return rows


def print_seconds(r):
    """Where the seconds of replicad's directory snapshots went (see snapshot_seconds)."""
    for codec in ("zstd:3", "lz4"):
        sec = r.get("dir", {}).get("snapshot", {}).get(f"replicad-{codec}", {}).get("seconds")
        if sec:
            print(f"directory snapshot, replicad {codec}: " + ", ".join(
                f"{k} {v}" for k, v in sec.items()))


def print_table(rows):
    hdr = ("figure", "replicad", "litestream", "ratio", "target")
    cells = [hdr] + [tuple("-" if v is None else str(v) for v in row) for row in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    out = []
    for i, c in enumerate(cells):
        out.append("| " + " | ".join(c[j].ljust(widths[j]) for j in range(5)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print("\n".join(out))


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
