"""The generated databases the comparison scripts share, cached under target/bench-data: one
table of text rows with an index (`ensure_db`), and the same rows in four tables
(`ensure_split_db`).
"""

import json
import os
import sqlite3
import sys
import time

from benchenv import DATA, log

GEN_VERSION = 2  # bump when the generator changes: invalidates the cached database


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
