#!/usr/bin/env python3
"""Idle-cost and replication-lag benchmark for `replicad replicate`.

Idle mode (default): for each N in --dbs, create N small WAL databases, replicate each to
its own file replica, wait for every first segment plus a settle delay, then measure the
daemon's CPU, memory, threads and fds over --window seconds while nothing is written;
optionally count syscalls with `strace -c -f` for --strace-seconds.

Lag mode (--lag): one database, a writer commits one row every 100 ms; report how long it
takes until a replica segment containing each commit appears.

Stdlib + sqlite3 only. Linux only (/proc). See README.md next to this file.
"""

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# Syscalls whose per-tick counts are reported individually (grouped as in the brief).
SYSCALL_GROUPS = {
    "openat": ["openat", "open"],
    "fstat/statx": ["fstat", "newfstatat", "statx", "stat", "lstat"],
    "pread64/read": ["pread64", "read"],
    "close": ["close"],
    "futex": ["futex"],
    "epoll_wait": ["epoll_wait", "epoll_pwait", "epoll_pwait2"],
}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- /proc


def proc_cpu_ticks(pid):
    """utime + stime of the whole process (all threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # The command name (field 2) may contain spaces; fields after ')' are fixed.
    rest = data[data.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime is field 14, stime field 15.
    return int(rest[11]) + int(rest[12])


def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])  # kB
            elif k == "Threads":
                out[k] = int(v)
    return out


def proc_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------------------- setup


def raise_fd_limit(want=65536):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for lim in ((want, max(hard, want)), (max(soft, min(want, hard)), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, lim)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def create_db(path, rows=100):
    conn = sqlite3.connect(path)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode.lower() == "wal", mode
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, val REAL, note TEXT)")
    conn.executemany(
        "INSERT INTO t (name, val, note) VALUES (?, ?, ?)",
        [(f"name-{i}", i * 1.5, "x" * 40) for i in range(rows)],
    )
    conn.commit()
    conn.close()


def write_config(path, dbs, replicas, extra=None):
    lines = []
    for k, v in (extra or {}).items():
        lines.append(f"{k}: {v}")
    lines.append("dbs:")
    for db, rep in zip(dbs, replicas):
        lines.append(f"  - path: {db}")
        lines.append("    replica:")
        lines.append(f"      url: file://{rep}")
    Path(path).write_text("\n".join(lines) + "\n")


def setup(root, n):
    root.mkdir(parents=True, exist_ok=True)
    dbs, reps = [], []
    for i in range(n):
        d = root / "db" / f"db{i:04d}.db"
        r = root / "replica" / f"r{i:04d}"
        d.parent.mkdir(parents=True, exist_ok=True)
        create_db(str(d))
        dbs.append(d)
        reps.append(r)
    cfg = root / "replicad.yml"
    write_config(cfg, dbs, reps)
    return dbs, reps, cfg


def segments(replica):
    """Names of the level-0 segment files of a replica (no *.tmp)."""
    try:
        return [e.name for e in os.scandir(replica / "ltx" / "0") if e.name.endswith(".ltx")]
    except FileNotFoundError:
        return []


def max_txid(replica):
    best = 0
    for name in segments(replica):
        try:
            best = max(best, int(name[:-4].split("-")[1], 16))
        except (IndexError, ValueError):
            pass
    return best


# ---------------------------------------------------------------------------- daemon


class Daemon:
    def __init__(self, binary, cfg, stderr_path):
        self.stderr_path = stderr_path
        self.stderr_f = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "replicate", "--config", str(cfg)],
            stdout=self.stderr_f,
            stderr=self.stderr_f,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=90):
        t0 = time.monotonic()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            rc = f"killed after {timeout}s (rc {rc})"
        self.stderr_f.close()
        return rc, time.monotonic() - t0

    def stderr_issues(self, limit=40):
        """Log lines at WARN/ERROR level (or panics), first `limit` of them, plus the count."""
        try:
            text = Path(self.stderr_path).read_text(errors="replace")
        except FileNotFoundError:
            return 0, []
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # tracing's ANSI colours
        pat = re.compile(r"^\S+\s+(WARN|ERROR)\b|panicked")
        bad = [l for l in text.splitlines() if pat.search(l)]
        return len(bad), bad[:limit]


def wait_first_segments(daemon, reps, timeout):
    t0 = time.monotonic()
    pending = list(reps)
    while pending:
        if not daemon.alive():
            raise RuntimeError(f"daemon exited early (rc {daemon.proc.returncode}); see {daemon.stderr_path}")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{len(pending)} replicas still without a segment after {timeout}s")
        pending = [r for r in pending if not segments(r)]
        if pending:
            time.sleep(0.05)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------- strace


def parse_strace_c(text):
    """Parses the `strace -c` summary table into {syscall: {calls, errors, seconds}}."""
    rows = {}
    for line in text.splitlines():
        toks = line.split()
        if len(toks) < 5 or not re.match(r"^\d+(\.\d+)?$", toks[0]):
            continue
        name = toks[-1]
        try:
            seconds = float(toks[1])
            calls = int(toks[3])
        except ValueError:
            continue
        errors = int(toks[4]) if len(toks) == 6 else 0
        rows[name] = {"calls": calls, "errors": errors, "seconds": seconds}
    return rows


def run_strace(pid, seconds, out_path):
    proc = subprocess.Popen(
        ["strace", "-c", "-f", "-p", str(pid), "-o", str(out_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # strace counts from the moment it attaches, so the span is measured from its start.
    t0 = time.monotonic()
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)  # detach and print the summary
    _, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    text = Path(out_path).read_text(errors="replace") if Path(out_path).exists() else ""
    return parse_strace_c(text), elapsed, text, err.decode(errors="replace")


# ---------------------------------------------------------------------------- idle


def measure_idle(args, n, work):
    root = work / f"n{n}"
    log(f"N={n}: creating {n} databases under {root}")
    t0 = time.monotonic()
    dbs, reps, cfg = setup(root, n)
    log(f"N={n}: created in {time.monotonic() - t0:.1f}s; starting daemon")
    daemon = Daemon(args.bin, cfg, root / "replicad.stderr")
    res = {"n": n, "workdir": str(root)}
    try:
        res["startup_to_first_segments_s"] = round(wait_first_segments(daemon, reps, args.startup_timeout), 2)
        log(f"N={n}: all first segments in {res['startup_to_first_segments_s']}s; settling {args.settle}s")
        time.sleep(args.settle)

        seg_before = sum(len(segments(r)) for r in reps)
        pid = daemon.pid
        samples = []
        c0, w0 = proc_cpu_ticks(pid), time.monotonic()
        prev_c, prev_w = c0, w0
        per_sec_cpu = []
        log(f"N={n}: measuring for {args.window}s")
        end = w0 + args.window
        while True:
            now = time.monotonic()
            if now >= end:
                break
            time.sleep(min(1.0, end - now))
            if not daemon.alive():
                raise RuntimeError(f"daemon died during the window (rc {daemon.proc.returncode})")
            c, w = proc_cpu_ticks(pid), time.monotonic()
            per_sec_cpu.append(100.0 * (c - prev_c) / CLK_TCK / (w - prev_w))
            prev_c, prev_w = c, w
            st = proc_status(pid)
            st["fds"] = proc_fds(pid)
            samples.append(st)
        c1, w1 = prev_c, prev_w
        seg_after = sum(len(segments(r)) for r in reps)

        cpu = 100.0 * (c1 - c0) / CLK_TCK / (w1 - w0)
        last = samples[-1]
        res.update(
            {
                "window_s": round(w1 - w0, 2),
                "cpu_pct": round(cpu, 3),
                "cpu_ms_per_s": round(cpu * 10, 2),
                "cpu_pct_per_db": round(cpu / n, 5),
                "cpu_pct_1s_max": round(max(per_sec_cpu), 2),
                "cpu_pct_1s_samples": [round(x, 2) for x in per_sec_cpu],
                "rss_mib": round(last["VmRSS"] / 1024, 2),
                "rss_mib_max_sampled": round(max(s["VmRSS"] for s in samples) / 1024, 2),
                "hwm_mib": round(last["VmHWM"] / 1024, 2),
                "threads": last["Threads"],
                "threads_min": min(s["Threads"] for s in samples),
                "threads_max": max(s["Threads"] for s in samples),
                "fds": last["fds"],
                "fds_min": min(s["fds"] for s in samples),
                "fds_max": max(s["fds"] for s in samples),
                "fds_per_db": round(last["fds"] / n, 2),
                "segments_written_while_idle": seg_after - seg_before,
            }
        )
        log(f"N={n}: cpu {cpu:.3f}%  rss {res['rss_mib']} MiB  threads {res['threads']}  fds {res['fds']}")

        if n in args.strace_dbs:
            if shutil.which("strace") is None:
                res["strace"] = {"skipped": "strace not installed (apt-get install -y strace)"}
            else:
                log(f"N={n}: strace -c -f for {args.strace_seconds}s")
                rows, secs, text, err = run_strace(pid, args.strace_seconds, root / "strace.txt")
                if not rows:
                    res["strace"] = {"skipped": f"no strace summary: {err.strip()[:500]}"}
                else:
                    total = rows.get("total", {}).get("calls") or sum(
                        r["calls"] for k, r in rows.items() if k != "total"
                    )
                    ticks = n * secs / args.monitor_interval_s
                    groups = {}
                    for g, names in SYSCALL_GROUPS.items():
                        calls = sum(rows.get(x, {}).get("calls", 0) for x in names)
                        groups[g] = {
                            "calls": calls,
                            "per_db_tick": round(calls / ticks, 3),
                            "by_syscall": {x: rows[x]["calls"] for x in names if x in rows},
                        }
                    top = sorted(((k, v) for k, v in rows.items() if k != "total"), key=lambda kv: -kv[1]["calls"])
                    res["strace"] = {
                        "seconds": round(secs, 2),
                        "total_calls": total,
                        "per_db_tick": round(total / ticks, 2),
                        "groups": groups,
                        "top": [
                            {"syscall": k, "calls": v["calls"], "errors": v["errors"],
                             "per_db_tick": round(v["calls"] / ticks, 3)}
                            for k, v in top[:15]
                        ],
                        "table": rows,
                    }
                    log(f"N={n}: {total} syscalls in {secs:.1f}s = {total / ticks:.1f} per db per tick")
    finally:
        rc, stop_s = daemon.stop()
        res["exit_code"] = rc
        res["stop_s"] = round(stop_s, 2)
        cnt, lines = daemon.stderr_issues()
        res["stderr_warn_error_count"] = cnt
        res["stderr_warn_error_lines"] = lines
        res["stderr_path"] = str(daemon.stderr_path)
        log(f"N={n}: SIGTERM -> exit {rc} in {stop_s:.2f}s; {cnt} warn/error lines on stderr")
    return res


# ---------------------------------------------------------------------------- lag


def measure_lag(args, work):
    root = work / "lag"
    dbs, reps, cfg = setup(root, 1)
    db, rep = dbs[0], reps[0]
    daemon = Daemon(args.bin, cfg, root / "replicad.stderr")
    res = {"mode": "lag", "workdir": str(root), "write_interval_ms": args.lag_interval_ms,
           "write_seconds": args.lag_seconds}
    try:
        wait_first_segments(daemon, reps, args.startup_timeout)
        time.sleep(2)

        events = []  # (first time seen, new max txid), txid strictly increasing
        stop = threading.Event()
        lock = threading.Lock()

        def poll():
            cur = max_txid(rep)
            while not stop.is_set():
                m = max_txid(rep)
                t = time.monotonic()
                if m > cur:
                    with lock:
                        events.append((t, m))
                    cur = m
                time.sleep(args.lag_poll_ms / 1000)

        th = threading.Thread(target=poll, daemon=True)
        th.start()

        conn = sqlite3.connect(str(db), timeout=10, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=10000")
        commits = []  # (t_commit, m_before, m_after)
        c0, w0 = proc_cpu_ticks(daemon.pid), time.monotonic()
        n_writes = int(args.lag_seconds * 1000 / args.lag_interval_ms)
        next_t = time.monotonic()
        for i in range(n_writes):
            m_pre = max_txid(rep)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (name, val, note) VALUES (?, ?, ?)", (f"lag-{i}", i, "y" * 40))
            conn.execute("COMMIT")
            t_c = time.monotonic()
            m_post = max_txid(rep)
            commits.append((t_c, m_pre, m_post))
            next_t += args.lag_interval_ms / 1000
            time.sleep(max(0.0, next_t - time.monotonic()))
        c1, w1 = proc_cpu_ticks(daemon.pid), time.monotonic()
        conn.close()

        # Wait for the last commit to show up (at most 10 s).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with lock:
                if events and events[-1][1] > commits[-1][2]:
                    break
            time.sleep(0.05)
        time.sleep(0.05)
        stop.set()
        th.join()

        def lags(which):
            out, missing = [], 0
            for t_c, m_pre, m_post in commits:
                m = m_post if which == "post" else m_pre
                hit = next((t for t, txid in events if txid > m), None)
                if hit is None:
                    missing += 1
                else:
                    out.append((hit - t_c) * 1000)
            return out, missing

        lat, missing = lags("post")
        lat_opt, _ = lags("pre")
        ambiguous = sum(1 for _, a, b in commits if b > a)

        def pct(xs, p):
            xs = sorted(xs)
            if not xs:
                return None
            k = (len(xs) - 1) * p / 100
            lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
            return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

        res.update(
            {
                "commits": len(commits),
                "segments_seen": len(events),
                "unmatched_commits": missing,
                "ambiguous_commits": ambiguous,
                "lag_ms_p50": round(pct(lat, 50), 1) if lat else None,
                "lag_ms_p99": round(pct(lat, 99), 1) if lat else None,
                "lag_ms_max": round(max(lat), 1) if lat else None,
                "lag_ms_min": round(min(lat), 1) if lat else None,
                "lag_ms_mean": round(statistics.mean(lat), 1) if lat else None,
                "lag_ms_p50_lower_bound": round(pct(lat_opt, 50), 1) if lat_opt else None,
                "lag_ms_p99_lower_bound": round(pct(lat_opt, 99), 1) if lat_opt else None,
                "cpu_pct_during_writes": round(100.0 * (c1 - c0) / CLK_TCK / (w1 - w0), 3),
            }
        )
        log(f"lag: {len(commits)} commits, {len(events)} segments, p50 {res['lag_ms_p50']} ms, "
            f"p99 {res['lag_ms_p99']} ms")
    finally:
        rc, stop_s = daemon.stop()
        res["exit_code"] = rc
        res["stop_s"] = round(stop_s, 2)
        cnt, lines = daemon.stderr_issues()
        res["stderr_warn_error_count"] = cnt
        res["stderr_warn_error_lines"] = lines
        res["stderr_path"] = str(daemon.stderr_path)
    return res


# ---------------------------------------------------------------------------- report


def print_idle_table(results):
    hdr = (f"{'N':>5} {'CPU %':>8} {'CPU %/db':>9} {'max1s %':>8} {'RSS MiB':>8} {'HWM MiB':>8} "
           f"{'threads':>9} {'fds':>6} {'fds/db':>7} {'idle seg':>8} {'start s':>8} {'exit':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if "cpu_pct" not in r:
            print(f"{r['n']:>5}  FAILED: {r.get('error')}")
            continue
        thr = f"{r['threads']}" if r["threads_min"] == r["threads_max"] else f"{r['threads_min']}-{r['threads_max']}"
        print(f"{r['n']:>5} {r['cpu_pct']:>8.3f} {r['cpu_pct_per_db']:>9.5f} {r['cpu_pct_1s_max']:>8.2f} "
              f"{r['rss_mib']:>8.1f} {r['hwm_mib']:>8.1f} {thr:>9} {r['fds']:>6} {r['fds_per_db']:>7.2f} "
              f"{r['segments_written_while_idle']:>8} {r['startup_to_first_segments_s']:>8.1f} {str(r['exit_code']):>5}")
    st = [r for r in results if isinstance(r.get("strace"), dict) and "total_calls" in r["strace"]]
    if st:
        print()
        print("Syscalls per database per idle tick (strace -c -f):")
        groups = list(SYSCALL_GROUPS)
        hdr = f"{'N':>5} {'total':>8} " + " ".join(f"{g:>13}" for g in groups)
        print(hdr)
        print("-" * len(hdr))
        for r in st:
            s = r["strace"]
            print(f"{r['n']:>5} {s['per_db_tick']:>8.2f} " +
                  " ".join(f"{s['groups'][g]['per_db_tick']:>13.3f}" for g in groups))
        for r in st:
            s = r["strace"]
            print(f"  N={r['n']} top syscalls ({s['total_calls']} calls in {s['seconds']}s): " +
                  ", ".join(f"{t['syscall']} {t['per_db_tick']}" for t in s["top"][:10]))
    for r in results:
        if r.get("strace", {}).get("skipped"):
            print(f"  N={r['n']} strace skipped: {r['strace']['skipped']}")
    for r in results:
        if r.get("stderr_warn_error_count"):
            print(f"\nN={r['n']}: {r['stderr_warn_error_count']} WARN/ERROR lines in {r['stderr_path']}, first:")
            for l in r["stderr_warn_error_lines"][:10]:
                print("   ", l)


def print_lag(r):
    print()
    print("Replication lag (1 db, commit every "
          f"{r['write_interval_ms']} ms for {r['write_seconds']} s, poll {r.get('poll_ms', '')}):")
    if r.get("lag_ms_p50") is None:
        print("  FAILED:", r.get("error"))
        return
    print(f"  commits {r['commits']}, segments seen {r['segments_seen']}, unmatched {r['unmatched_commits']}, "
          f"ambiguous {r['ambiguous_commits']}")
    print(f"  lag ms: p50 {r['lag_ms_p50']}  p99 {r['lag_ms_p99']}  min {r['lag_ms_min']}  "
          f"max {r['lag_ms_max']}  mean {r['lag_ms_mean']}")
    print(f"  (lower bound, attributing ambiguous commits to the earlier segment: p50 "
          f"{r['lag_ms_p50_lower_bound']}  p99 {r['lag_ms_p99_lower_bound']})")
    print(f"  daemon CPU during writes: {r['cpu_pct_during_writes']}%   exit {r['exit_code']}")
    if r.get("stderr_warn_error_count"):
        print(f"  {r['stderr_warn_error_count']} WARN/ERROR lines in {r['stderr_path']}, first:")
        for l in r["stderr_warn_error_lines"][:10]:
            print("   ", l)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dbs", default="1,100,400", help="comma-separated database counts (default 1,100,400)")
    ap.add_argument("--window", type=float, default=60, help="idle measurement window, seconds (default 60)")
    ap.add_argument("--settle", type=float, default=5, help="wait after the last first segment (default 5)")
    ap.add_argument("--strace-dbs", default="1,100", help="run strace for these N (default 1,100; '' for none)")
    ap.add_argument("--strace-seconds", type=float, default=10)
    ap.add_argument("--startup-timeout", type=float, default=180)
    ap.add_argument("--lag", action="store_true", help="measure replication lag instead of idle cost")
    ap.add_argument("--lag-seconds", type=float, default=30)
    ap.add_argument("--lag-interval-ms", type=float, default=100)
    ap.add_argument("--lag-poll-ms", type=float, default=5)
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "replicad"))
    ap.add_argument("--workdir", help="where databases and replicas go (default: a new temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", help="JSON output path (default benches/idle/results-<timestamp>.json)")
    args = ap.parse_args()
    args.dbs = [int(x) for x in args.dbs.split(",") if x.strip()]
    args.strace_dbs = {int(x) for x in args.strace_dbs.split(",") if x.strip()}
    args.monitor_interval_s = 1.0  # the built-in default; the config does not override it

    if not Path(args.bin).exists():
        sys.exit(f"{args.bin} not found: run `cargo build --release` first")
    fd_soft, fd_hard = raise_fd_limit()
    log(f"RLIMIT_NOFILE {fd_soft}/{fd_hard}; binary {args.bin}")

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="replicad-idle-"))
    work.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else HERE / (f"results-{'lag-' if args.lag else ''}{stamp}.json")
    meta = {
        "timestamp": stamp,
        "binary": args.bin,
        "binary_mtime": dt.datetime.fromtimestamp(Path(args.bin).stat().st_mtime).isoformat(),
        "git_head": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True).stdout.strip(),
        "cpus": os.cpu_count(),
        "clk_tck": CLK_TCK,
        "rlimit_nofile": [fd_soft, fd_hard],
        "argv": sys.argv,
    }
    try:
        if args.lag:
            try:
                r = measure_lag(args, work)
            except Exception as e:  # report and keep going
                r = {"mode": "lag", "error": str(e), "write_interval_ms": args.lag_interval_ms,
                     "write_seconds": args.lag_seconds}
            r["poll_ms"] = args.lag_poll_ms
            print_lag(r)
            doc = {"meta": meta, "lag": r}
        else:
            results = []
            for n in args.dbs:
                try:
                    results.append(measure_idle(args, n, work))
                except Exception as e:
                    log(f"N={n}: FAILED: {e}")
                    results.append({"n": n, "error": str(e)})
            print()
            print(f"Idle cost over {args.window:.0f}s (monitor-interval 1s, {os.cpu_count()} CPUs; "
                  "CPU % of one core):")
            print_idle_table(results)
            doc = {"meta": meta, "idle": results, "window_s": args.window}
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nJSON: {out}")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory kept: {work}")


if __name__ == "__main__":
    main()
