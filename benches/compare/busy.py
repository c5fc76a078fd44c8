"""run.py's phases with work: lag commit -> object, the application's write throughput and
commit latency, its own checkpoints, and snapshot and restore on a directory replica.
"""

import os
import random
import re
import shutil
import sqlite3
import threading
import time

import dbgen
import s3_snapshot as h
import restore as rst
from harness import REPO, WORK, l0_dir, log, make_small_dbs, max_txid, start, stop, write_config
from idle import requests_by_bucket


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
    in four indexed tables (dbgen.ensure_split_db)."""
    out, verifier = {"snapshot": {}, "restore": {}}, rst.Verifier()
    # Made (once, cached) before anything is measured.
    split, split_meta = dbgen.ensure_split_db(source, meta)
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
