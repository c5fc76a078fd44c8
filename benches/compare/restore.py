#!/usr/bin/env python3
"""Restore of a ~1 GiB SQLite database from S3 (loopback) and from a directory replica:
replicad vs Litestream, in the same run, alternating.

Usage (from anywhere; paths are taken relative to the repository root):

    python3 benches/compare/restore.py [--rounds 2] [--no-build]

What it does (tools and databases are cached under target/, see s3_snapshot.py):
  1. installs / builds the tools and the databases as s3_snapshot.py does (imports it), and
     starts s3s-fs on 127.0.0.1 with request logging;
  2. makes the replicas, each from a fresh copy of the database, each tool running until its
     level-0 snapshot is complete and its writes have stopped for 2 s, then SIGTERM:
       rd-s3-lz4    replicad, S3 prefix, lz4 (Litestream can read it too)
       rd-s3-zstd3  replicad, S3 prefix, zstd:3 (replicad only)
       rd-dir-lz4   replicad, directory replica (`replica: {path: DIR}`), lz4
       ls-s3        Litestream, S3 prefix (lz4)
       ls-dir       Litestream, directory replica (`type: file`)
       rd64-s3-lz4  replicad, S3 prefix, lz4, of the 64 MiB database (peak RSS flatness)
  3. restores them to fresh paths under /usr/bin/time (wall, user+sys CPU, max RSS), counting
     the S3 requests each restore made from the server's log: the main cases (S3 and
     directory, without and with the integrity check, replicad and Litestream alternating)
     every round; replicad zstd:3, the cross restores, the 64 MiB restores and the
     `replicad snapshot` exports (.db and .db.gz) in the first round only;
  4. verifies every restored file: PRAGMA integrity_check = ok and the row count equal to the
     source's. A file byte-identical (BLAKE2b) to one already verified in this run is not
     checked again (recorded as such);
  5. prints a table and writes benches/compare/results/results-restore-<UTC time>.json.

Python 3 standard library only, plus GNU time (/usr/bin/time; `apt-get install -y time`).
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_snapshot as h  # noqa: E402
from harness import stop  # noqa: E402

REPO, DATA, HERE = h.REPO, h.DATA, h.HERE
REPLICAD, LITESTREAM = h.REPLICAD_BIN, h.LITESTREAM_BIN
GNU_TIME = "/usr/bin/time"
L0_NAME = "0000000000000001-0000000000000001.ltx"
REPLICA_DIRS = os.path.join(DATA, "replicas")
RUNS = os.path.join(DATA, "restore-runs")
OUT = os.path.join(DATA, "restore-out")
PROGRESS = re.compile(r"restore progress.*?done_bytes=(\d+).*?total_bytes=(\d+)")

log = h.log


# ----------------------------------------------------------------------------- helpers

def file_hash(path):
    d = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            d.update(b)
    return d.hexdigest()


def gz_hash(path):
    d = hashlib.blake2b(digest_size=16)
    with gzip.open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            d.update(b)
    return d.hexdigest()


def tool_env(tool):
    env = dict(os.environ, NO_COLOR="1")
    env.update(AWS_ACCESS_KEY_ID=h.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=h.SECRET_KEY)
    if tool == "litestream":
        env.pop("AWS_CA_BUNDLE", None)  # breaks Litestream's S3 client
        env.update(LITESTREAM_ACCESS_KEY_ID=h.ACCESS_KEY, LITESTREAM_SECRET_ACCESS_KEY=h.SECRET_KEY)
    return env


def s3_url(s3, prefix):
    return (f"s3://{h.BUCKET}/{prefix}?endpoint={s3.endpoint}&region={h.REGION}"
            f"&force-path-style=true")


def find_l0(root):
    """The level-0 TXID-1 file (the snapshot) under a replica root, if complete."""
    for d, _, files in os.walk(root):
        if L0_NAME in files:
            try:
                if int(os.path.basename(d)) == 0:
                    return os.path.join(d, L0_NAME)
            except ValueError:
                pass
    return None


def rel_ts(ts, t0_wall):
    return round(h.iso_to_epoch(ts) - t0_wall, 3)


# ----------------------------------------------------------------------------- replicas

def make_replica(name, tool, codec, kind, source, dbmeta, s3, timeout=300):
    """Runs `tool` on a fresh copy of `source` until its L0 snapshot is complete on the replica
    and its writes have stopped for 2 s, then SIGTERM."""
    workdir = os.path.join(RUNS, "make-" + name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    db = os.path.join(workdir, "copy.db")
    shutil.copyfile(source, db)
    os.sync()
    prefix = f"{name}"
    if kind == "s3":
        root = os.path.join(s3.root, h.BUCKET, prefix)
        rep_yaml = f"""      type: s3
      bucket: {h.BUCKET}
      path: {prefix}
      endpoint: {s3.endpoint}
      region: {h.REGION}
      force-path-style: true
      access-key-id: {h.ACCESS_KEY}
      secret-access-key: {h.SECRET_KEY}
"""
    else:
        root = os.path.join(REPLICA_DIRS, name)
        shutil.rmtree(root, ignore_errors=True)
        rep_yaml = (f"      path: {root}\n" if tool == "replicad"
                    else f"      type: file\n      path: {root}\n")
    env = tool_env(tool)
    if tool == "replicad":
        cfg = os.path.join(workdir, "replicad.yml")
        with open(cfg, "w") as f:
            f.write(f"dbs:\n  - path: {db}\n    compression: {codec}\n    replica:\n{rep_yaml}")
        cmd = [REPLICAD, "replicate", "--config", cfg]
        env["RUST_LOG"] = "info,replicad=debug"
    else:
        cfg = os.path.join(workdir, "litestream.yml")
        with open(cfg, "w") as f:
            f.write(f"dbs:\n  - path: {db}\n    replica:\n{rep_yaml}")
        cmd = [LITESTREAM, "replicate", "-config", cfg]
    logp = os.path.join(workdir, f"{tool}.log")
    log(f"replica {name}: {tool} ({codec}) -> {kind} {root}")
    off0 = s3.log_offset()
    logf = open(logp, "wb")
    t0, t0_wall = time.monotonic(), time.time()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                            start_new_session=True)
    seen = None
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        if find_l0(root):
            seen = time.monotonic() - t0
            break
        time.sleep(0.02)
    # Wait for the writes to stop: S3 -> no request but ListObjectsV2 for 2 s; directory ->
    # the listing (names and sizes) unchanged for 2 s. At most 60 s.
    quiet, t_q, last, last_change = 2.0, time.monotonic(), None, time.monotonic()
    while seen is not None and proc.poll() is None and time.monotonic() - t_q < 60:
        if kind == "s3":
            ops, _ = s3.requests_between(off0, s3.log_offset())
            state = sum(v for op, v in ops.items() if op != "ListObjectsV2")
        else:
            state = h.dir_files(root)
        if state != last:
            last, last_change = state, time.monotonic()
        elif time.monotonic() - last_change >= quiet:
            break
        time.sleep(0.2)
    stats = h.proc_stats(proc.pid)
    stop(proc, logf)
    time.sleep(0.3)
    ops, _ = s3.requests_between(off0, s3.log_offset())
    local_state = h.dir_files(workdir)
    # Keep the logs and configs, not the 1 GiB copy and the tool's local LTX staging.
    for p in os.listdir(workdir):
        if p.startswith(("copy.db", ".copy.db")):
            pp = os.path.join(workdir, p)
            shutil.rmtree(pp) if os.path.isdir(pp) else os.remove(pp)
    objects = h.dir_files(root)
    rep = {"name": name, "tool": tool, "codec": codec, "kind": kind, "root": root,
           "prefix": prefix if kind == "s3" else None,
           "db_bytes": dbmeta["bytes"], "rows": dbmeta["rows"], "command": cmd,
           "config": open(cfg).read().replace(h.SECRET_KEY, "***"),
           "l0_seconds": round(seen, 3) if seen is not None else None,
           "ran_s": round(time.monotonic() - t0, 2), "exit_code": proc.returncode,
           "peak_rss_mib": round(stats.get("VmHWM", 0) / 1024, 1),
           "cpu_s": stats.get("cpu_s"), "started_wall": t0_wall,
           "requests": ops if kind == "s3" else None, "objects": objects,
           "local_files_at_exit": local_state,
           "log": os.path.relpath(logp, REPO), "log_problems": h.problem_lines(logp)}
    log(f"  L0 after {rep['l0_seconds']} s, stopped after {rep['ran_s']} s (exit "
        f"{proc.returncode}); objects {objects}")
    if seen is None:
        sys.exit(f"replica {name} was not made; see {logp}")
    return rep


# ----------------------------------------------------------------------------- restores

class Verifier:
    def __init__(self):
        self.by_hash = {}  # hash -> (integrity, rows, case that verified it)

    def check_db(self, path, expect_rows, case):
        t = time.monotonic()
        sidecars = {s: os.path.getsize(path + s) for s in ("-wal", "-shm", "-journal")
                    if os.path.exists(path + s)}
        res = {"bytes": os.path.getsize(path), "sidecars": sidecars}
        digest = file_hash(path) if not sidecars.get("-wal") else None
        res["blake2b"] = digest
        if digest and digest in self.by_hash:
            integ, rows, by = self.by_hash[digest]
            res.update(integrity=integ, rows=rows, verified_by=f"identical to {by}")
        else:
            # immutable=1: no -wal/-shm created, nothing written (only when there is no WAL
            # to replay).
            uri = f"file:{path}?immutable=1" if not sidecars.get("-wal") else f"file:{path}"
            con = sqlite3.connect(uri, uri=True)
            integ = "; ".join(r[0] for r in con.execute("PRAGMA integrity_check").fetchall())
            # The one-table database, or its rows spread over customers_0.. (several tables).
            tables = [t for (t,) in con.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' "
                "AND (name = 'customers' OR name GLOB 'customers_[0-9]*')")]
            rows = sum(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
            con.close()
            res.update(integrity=integ, rows=rows, verified_by="integrity_check+count")
            if digest:
                self.by_hash[digest] = (integ, rows, case)
        res["ok"] = res["integrity"] == "ok" and res["rows"] == expect_rows
        res["verify_s"] = round(time.monotonic() - t, 2)
        return res

    def check_gz(self, path, expect_rows, case):
        t = time.monotonic()
        digest = gz_hash(path)
        res = {"bytes": os.path.getsize(path), "blake2b_uncompressed": digest}
        if digest in self.by_hash:
            integ, rows, by = self.by_hash[digest]
            res.update(integrity=integ, rows=rows,
                       verified_by=f"decompressed bytes identical to {by}")
        else:
            tmp = path + ".check.db"
            with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
            r = self.check_db(tmp, expect_rows, case)
            os.remove(tmp)
            res.update(integrity=r["integrity"], rows=r["rows"], verified_by="gunzip+" + r["verified_by"])
        res["ok"] = res["integrity"] == "ok" and res["rows"] == expect_rows
        res["verify_s"] = round(time.monotonic() - t, 2)
        return res


def run_case(rnd, idx, case, tool, rep, check, s3, verifier, mode="restore", gz=False,
             timeout=900):
    """One restore (or `replicad snapshot` export) of replica `rep` by `tool`."""
    name = f"r{rnd}-{idx:02d}-{case}-{tool}"
    workdir = os.path.join(RUNS, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    os.makedirs(OUT, exist_ok=True)
    out = os.path.join(OUT, name + (".db.gz" if gz else ".db"))
    for p in (out, out + "-wal", out + "-shm"):
        if os.path.exists(p):
            os.remove(p)
    if rep["kind"] == "s3":
        url = s3_url(s3, rep["prefix"])
    else:
        url = rep["root"] if tool == "replicad" else "file://" + rep["root"]
    if tool == "replicad" and mode == "snapshot":
        cmd = [REPLICAD, "snapshot", "--json", "--to", out, url]
        check_label = "integrity_check (always)"
    elif tool == "replicad":
        cmd = [REPLICAD, "restore", "--json", "--to", out]
        if not check:
            cmd.append("--no-integrity-check")
        cmd.append(url)
        check_label = "integrity_check" if check else "none"
    else:
        cmd = [LITESTREAM, "restore", "-json", "-o", out]
        if check:
            cmd += ["-integrity-check", "full"]
        cmd.append(url)
        check_label = "full" if check else "none"
    timef = os.path.join(workdir, "time.txt")
    outp, errp = os.path.join(workdir, "stdout.txt"), os.path.join(workdir, "stderr.log")
    full = [GNU_TIME, "-f", "%e %U %S %M", "-o", timef] + cmd
    log(f"{name}: {' '.join(cmd)}")
    os.sync()  # no writeback of earlier work during the measurement
    load = os.getloadavg()
    off0 = s3.log_offset()
    s3_cpu0 = h.proc_stats(s3.proc.pid).get("cpu_s", 0.0)
    t0_wall = time.time()
    t0 = time.monotonic()
    with open(outp, "wb") as fo, open(errp, "wb") as fe:
        proc = subprocess.Popen(full, stdout=fo, stderr=fe, env=tool_env(tool), cwd=workdir,
                                start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    secs = time.monotonic() - t0
    time.sleep(0.3)  # let the server log the last requests
    ops, times = s3.requests_between(off0, s3.log_offset())
    s3_cpu = h.proc_stats(s3.proc.pid).get("cpu_s", 0.0) - s3_cpu0
    tlines = [l for l in open(timef).read().splitlines() if l.strip()] if os.path.exists(timef) else []
    try:
        e, u, s, m = tlines[-1].split()
        cpu, rss = float(u) + float(s), int(m) / 1024
    except (IndexError, ValueError):
        cpu = rss = None
    r = {"case": case, "round": rnd, "run": name, "tool": tool, "mode": mode,
         "replica": rep["name"], "replica_made_by": rep["tool"], "source": rep["kind"],
         "codec": rep["codec"], "integrity_check": check_label, "command": cmd,
         "db_bytes": rep["db_bytes"], "exit_code": proc.returncode,
         "seconds": round(secs, 3), "mb_per_s": round(rep["db_bytes"] / 1e6 / secs, 1),
         "peak_rss_mib": round(rss, 1) if rss is not None else None,
         "cpu_s": round(cpu, 2) if cpu is not None else None,
         "s3_server_cpu_s": round(s3_cpu, 2), "requests": ops,
         "requests_total": sum(ops.values()), "loadavg_at_start": load}
    # Phases from the server's log (request arrival times, relative to process start).
    if times:
        gets = [rel_ts(ts, t0_wall) for ts, op, _ in times if op == "GetObject"]
        r["server_phases"] = {"first_request_s": rel_ts(times[0][0], t0_wall),
                              "first_get_s": gets[0] if gets else None,
                              "last_get_s": gets[-1] if gets else None,
                              "after_last_request_s": round(secs - rel_ts(times[-1][0], t0_wall), 3)}
    # replicad's own progress lines (every 5 s without a terminal): fetched+applied bytes.
    err = h.ANSI.sub("", open(errp, "rb").read().decode("utf-8", "replace"))
    prog = []
    for line in err.splitlines():
        m = PROGRESS.search(line)
        t = h.TS.search(line)
        if m and t:
            prog.append([rel_ts(t.group(1), t0_wall), int(m.group(1)), int(m.group(2))])
    if prog:
        r["progress"] = prog
    r["stderr_tail"] = err.splitlines()[-12:]
    r["log_problems"] = h.problem_lines(errp)
    stdout = open(outp, "rb").read().decode("utf-8", "replace").strip()
    try:  # replicad prints one line, Litestream an indented object
        r["json_report"] = json.loads(stdout)
    except ValueError:
        try:
            r["json_report"] = json.loads(stdout.splitlines()[-1])
        except (ValueError, IndexError):
            r["stdout_tail"] = stdout[-2000:]
    leftovers = sorted(p for p in os.listdir(OUT) if p.startswith(name) and p != os.path.basename(out))
    r["leftovers"] = leftovers
    if proc.returncode == 0 and os.path.exists(out):
        v = (verifier.check_gz(out, rep["rows"], name) if gz
             else verifier.check_db(out, rep["rows"], name))
        r["verify"] = v
        r["ok"] = v["ok"]
    else:
        r["ok"] = False
    for p in os.listdir(OUT):
        if p.startswith(name):
            pp = os.path.join(OUT, p)
            shutil.rmtree(pp) if os.path.isdir(pp) else os.remove(pp)
    log(f"  {r['seconds']} s, {r['mb_per_s']} MB/s, RSS {r['peak_rss_mib']} MiB, CPU {r['cpu_s']} s, "
        f"requests {ops}, exit {proc.returncode}, ok {r['ok']}"
        + (f" ({r['verify']['verified_by']})" if "verify" in r else ""))
    return r


# ----------------------------------------------------------------------------- report

def table(results):
    hdr = ["run", "case", "tool", "replica by", "source", "codec", "integrity check", "seconds",
           "MB/s", "peak RSS MiB", "CPU s", "S3 requests by op", "verified ok"]
    rows = []
    for r in results:
        rows.append([
            r["run"].split("-", 2)[0] + "-" + r["run"].split("-", 2)[1], r["case"],
            r["tool"] + (" snapshot" if r["mode"] == "snapshot" else ""), r["replica_made_by"],
            r["source"], r["codec"], r["integrity_check"], f"{r['seconds']:.2f}",
            f"{r['mb_per_s']:.1f}", f"{r['peak_rss_mib']}", f"{r['cpu_s']}",
            " ".join(f"{k}={v}" for k, v in r["requests"].items()) or "-",
            ("yes" if r["ok"] else "NO") + (" (=)" if "identical" in r.get("verify", {}).get("verified_by", "") else ""),
        ])
    widths = [max(len(hh), *(len(row[i]) for row in rows)) for i, hh in enumerate(hdr)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(hdr), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(row) for row in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the main cases; default 2")
    ap.add_argument("--size-mib", type=int, default=1024, help="main database, MiB; default 1024")
    ap.add_argument("--small-mib", type=int, default=64, help="small database for the RSS "
                    "flatness check, MiB; default 64")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build --release")
    args = ap.parse_args()
    if not os.access(GNU_TIME, os.X_OK):
        sys.exit("needs GNU time: apt-get install -y time")

    h.ensure_tools(not args.no_build)
    source, dbmeta = h.ensure_db(args.size_mib)
    small, smallmeta = h.ensure_db(args.small_mib)
    versions = {"replicad": h.version_of([REPLICAD, "--version"]),
                "replicad_git": h.version_of(["git", "-C", REPO, "describe", "--always", "--dirty"]),
                "replicad_binary_mtime_utc": datetime.fromtimestamp(
                    os.path.getmtime(REPLICAD), timezone.utc).isoformat(),
                "litestream": h.version_of([LITESTREAM, "version"]), "s3s-fs": "0.14.1",
                "gnu_time": h.version_of([GNU_TIME, "--version"]).splitlines()[0]}
    for d in (REPLICA_DIRS, RUNS, OUT):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    started = datetime.now(timezone.utc)
    t_start = time.monotonic()
    source_hash = {"main": file_hash(source), "small": file_hash(small)}
    s3 = h.S3Server()
    verifier = Verifier()
    results, replicas = [], {}
    try:
        for name, tool, codec, kind, src, meta in [
                ("rd-s3-lz4", "replicad", "lz4", "s3", source, dbmeta),
                ("ls-s3", "litestream", "lz4", "s3", source, dbmeta),
                ("rd-dir-lz4", "replicad", "lz4", "dir", source, dbmeta),
                ("ls-dir", "litestream", "lz4", "dir", source, dbmeta),
                ("rd-s3-zstd3", "replicad", "zstd:3", "s3", source, dbmeta),
                ("rd64-s3-lz4", "replicad", "lz4", "s3", small, smallmeta)]:
            replicas[name] = make_replica(name, tool, codec, kind, src, meta, s3)
        log(f"replicas made in {time.monotonic() - t_start:.0f} s")
        R = replicas
        # (case, tool, replica, integrity check): pairs run replicad/Litestream alternately,
        # the order within each pair swapped every other round.
        main_pairs = [
            ("s3", ("replicad", R["rd-s3-lz4"], False), ("litestream", R["ls-s3"], False)),
            ("dir", ("replicad", R["rd-dir-lz4"], False), ("litestream", R["ls-dir"], False)),
            ("s3-check", ("replicad", R["rd-s3-lz4"], True), ("litestream", R["ls-s3"], True)),
            ("dir-check", ("replicad", R["rd-dir-lz4"], True), ("litestream", R["ls-dir"], True)),
        ]
        extra = [
            ("s3-zstd3", "replicad", R["rd-s3-zstd3"], False, "restore", False),
            ("cross-s3", "litestream", R["rd-s3-lz4"], False, "restore", False),
            ("cross-s3", "replicad", R["ls-s3"], False, "restore", False),
            ("s3-zstd3-check", "replicad", R["rd-s3-zstd3"], True, "restore", False),
            ("cross-dir", "litestream", R["rd-dir-lz4"], False, "restore", False),
            ("cross-dir", "replicad", R["ls-dir"], False, "restore", False),
            ("small-s3", "replicad", R["rd64-s3-lz4"], False, "restore", False),
            ("small-s3-check", "replicad", R["rd64-s3-lz4"], True, "restore", False),
            ("snapshot-db", "replicad", R["rd-s3-lz4"], True, "snapshot", False),
            ("snapshot-gz", "replicad", R["rd-s3-lz4"], True, "snapshot", True),
        ]
        for rnd in range(1, args.rounds + 1):
            idx = 0
            for case, a, b in main_pairs:
                for tool, rep, check in ((a, b) if rnd % 2 else (b, a)):
                    idx += 1
                    results.append(run_case(rnd, idx, case, tool, rep, check, s3, verifier))
            if rnd == 1:
                for case, tool, rep, check, mode, gz in extra:
                    idx += 1
                    results.append(run_case(rnd, idx, case, tool, rep, check, s3, verifier,
                                            mode=mode, gz=gz))
    finally:
        s3.stop()

    for r in results:
        if "verify" in r:
            key = "small" if r["replica"].startswith("rd64") else "main"
            bh = r["verify"].get("blake2b") or r["verify"].get("blake2b_uncompressed")
            r["verify"]["identical_to_source"] = bh == source_hash[key]
    print()
    print(table(results))
    print()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = {
        "benchmark": "restore",
        "started_utc": started.isoformat(),
        "total_s": round(time.monotonic() - t_start, 1),
        "host": {"nproc": os.cpu_count(), "kernel": os.uname().release,
                 "mem_total_kib": int(open("/proc/meminfo").readline().split()[1])},
        "versions": versions,
        "database": dict(dbmeta, path=os.path.relpath(source, REPO), blake2b=source_hash["main"]),
        "small_database": dict(smallmeta, path=os.path.relpath(small, REPO),
                               blake2b=source_hash["small"]),
        "s3": {"endpoint": "127.0.0.1 (loopback)", "bucket": h.BUCKET,
               "server_log": os.path.relpath(s3.log_path, REPO)},
        "units": {
            "seconds": "wall time of the restore command (fork to exit), including its fsync "
                       "and, when on, its integrity check",
            "mb_per_s": "source database bytes / 1e6 / seconds",
            "peak_rss_mib": "max RSS of the restore process (GNU time %M), MiB",
            "cpu_s": "user+sys CPU of the restore process (GNU time)",
            "requests": "S3 requests by operation logged by the server during the restore",
            "s3_server_cpu_s": "CPU time of s3s-fs during the restore",
            "server_phases": "request arrival times from the server log, s after the start; "
                             "after_last_request_s = exit - last request",
            "progress": "replicad's 'restore progress' log lines: [s after start, done bytes, "
                        "total bytes]; for S3 total = 2 x LTX bytes (fetch, then apply)",
            "verify": "integrity_check and row count of the restored file (BLAKE2b-identical "
                      "files verified once); identical_to_source: byte-identical to the source"},
        "replicas": replicas,
        "results": results,
    }
    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"results-restore-{stamp}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"results: {os.path.relpath(path, REPO)} (total {out['total_s']} s)")


if __name__ == "__main__":
    main()
