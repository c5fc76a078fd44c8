"""run.py's table: each figure for both tools, the ratio and the target, and where replicad's
snapshot seconds went.
"""


# ----------------------------------------------------------------------------- report

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
