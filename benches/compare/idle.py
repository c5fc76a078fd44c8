"""run.py's idle and scale phases: processes of 1, 100 and 400 databases (and one of 10,000)
sampled while nothing changes: CPU, RSS, threads, descriptors, syscalls, S3 requests.
"""

import os
import re
import shutil
import signal
import time

import s3_snapshot as h
from harness import REPO, WORK, l0_dir, log, make_small_dbs, max_txid, proc_sample, start, stop, write_config


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
