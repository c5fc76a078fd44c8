//! Tests for the idle path go here: an idle database skips every tick through the fast path,
//! and its replicas make no client call at all, across many heartbeats.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common;

use replicad::config::{Config, DbSettings};
use replicad::daemon::{DbHandle, Store};

fn settings() -> DbSettings {
    DbSettings {
        monitor_interval: Duration::from_millis(20),
        heartbeat_interval: Duration::from_millis(50),
        ..DbSettings::default()
    }
}

/// Over `window` (longer when a starved runtime lost ticks), at least 2/3 of the 20 ms ticks
/// took the idle path, no sync ran, and the replica saw no client call (heartbeats: 50 ms).
async fn assert_quiet_window(h: &DbHandle, window: Duration) {
    let (_, rstats) = &h.replicas[0];
    let skipped0 = h.stats.sync_skipped.load(Ordering::Relaxed);
    let syncs0 = h.stats.syncs.load(Ordering::Relaxed);
    let ops0 = rstats.total_ops();
    let began = Instant::now();
    tokio::time::sleep(window).await;
    // A starved runtime loses ticks (a late one is not made up): then the window only
    // lasts longer, until it held the ticks it should have.
    let ticks = (window.as_millis() / 20) as u64;
    loop {
        let skipped = h.stats.sync_skipped.load(Ordering::Relaxed) - skipped0;
        if skipped >= ticks * 2 / 3 {
            break;
        }
        assert!(
            began.elapsed() < common::WAIT,
            "only {skipped} of ~{ticks} ticks skipped in {:?}",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.stats.syncs.load(Ordering::Relaxed),
        syncs0,
        "a full sync ran while idle"
    );
    assert_eq!(rstats.total_ops(), ops0, "idle replica made client calls");
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_database_skips_every_tick_and_makes_no_replica_calls() {
    idle_case(false).await;
}

/// The common case of an idle database: the application closed its last connection, SQLite
/// checkpointed and removed the WAL. That state must take the fast path too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_database_with_an_empty_wal_skips_every_tick() {
    idle_case(true).await;
}

async fn idle_case(close_app_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("app.db");
    let mut conn = rusqlite::Connection::open(&db_path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         INSERT INTO t(v) SELECT 'row' FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<200) SELECT x FROM c);",
    )
    .unwrap();
    if close_app_first {
        drop(conn);
        conn = rusqlite::Connection::open(&db_path).unwrap();
        let wal = dir.path().join("app.db-wal");
        assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0);
    }
    let replica = dir.path().join("replica");
    let config = Config::single(
        db_path.clone(),
        &[replica.display().to_string()],
        settings(),
    )
    .unwrap();
    let store = Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    let (_, rstats) = h.replicas[0].clone();
    wait_until("first segment uploaded", || {
        let txid = h.stats.txid.load(Ordering::Relaxed);
        txid > 0 && rstats.remote_txid.load(Ordering::Relaxed) == txid
    })
    .await;
    // Let the jittered second tick and any catch-up settle.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let ops0 = rstats.total_ops();
    let puts0 = rstats.counters.ops[0].get();
    let gets0 = rstats.counters.ops[1].get();
    // ~30 heartbeats elapse: none may touch the replica.
    assert_quiet_window(&h, Duration::from_millis(1500)).await;
    assert!(h.stats.idle.load(Ordering::Relaxed));

    // One commit costs exactly one PUT, plus the single-writer lease check of the upload
    // round (one GET: a directory replica has no conditional writes, so every round reads
    // the lease; the refresh is due only after half of `lease-ttl`, 5 min).
    conn.execute("INSERT INTO t(v) VALUES ('one more')", [])
        .unwrap();
    let before = h.stats.txid.load(Ordering::Relaxed);
    wait_until("new segment uploaded", || {
        rstats.remote_txid.load(Ordering::Relaxed) > before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        rstats.total_ops(),
        ops0 + 2,
        "one commit should cost one lease GET and one PUT"
    );
    assert_eq!(rstats.counters.ops[0].get(), puts0 + 1);
    assert_eq!(rstats.counters.ops[1].get(), gets0 + 1);

    store.shutdown(std::future::pending()).await;
}

/// A dormant database's monitor parks in the dormant watch: the watch runs its idle checks
/// (counted as skipped ticks, no sync, no client call) and wakes it for a commit, which is
/// then replicated as usual; the database goes dormant and parks again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dormant_database_is_checked_by_the_watch_and_woken_by_a_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("app.db");
    let conn = rusqlite::Connection::open(&db_path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         INSERT INTO t(v) VALUES ('first');",
    )
    .unwrap();
    let replica = dir.path().join("replica");
    // L1 every 2 s: staging may drop a segment only once L1 covers it, which comes after
    // the database parked, so the parked monitor must still prune.
    let settings = DbSettings {
        dormant_after: Duration::from_millis(100),
        levels: vec![Duration::from_secs(2)],
        ..settings()
    };
    let config =
        Config::single(db_path.clone(), &[replica.display().to_string()], settings).unwrap();
    let store = Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    let (_, rstats) = h.replicas[0].clone();
    wait_until("first segment", || {
        h.stats.txid.load(Ordering::Relaxed) == 1
    })
    .await;
    conn.execute("INSERT INTO t(v) VALUES ('second')", [])
        .unwrap();
    let staged = replicad::replicate::db::default_meta_path(&db_path)
        .join("ltx")
        .join("0");
    let staged = move || std::fs::read_dir(&staged).unwrap().count();
    wait_until("dormant and parked", || {
        h.stats.dormant.load(Ordering::Relaxed) && store.parked() == 1
    })
    .await;
    let syncs_parked = h.stats.syncs.load(Ordering::Relaxed);
    // The newest staged segment always stays (the next one chains from it).
    wait_until("staging pruned while parked", || staged() == 1).await;
    assert_eq!(h.stats.wakes.load(Ordering::Relaxed), 0, "pruning woke it");
    assert_eq!(h.stats.syncs.load(Ordering::Relaxed), syncs_parked);
    // L1 compaction's client calls are done once staging is pruned.
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Parked: the watch counts the skipped ticks.
    assert_quiet_window(&h, Duration::from_millis(1000)).await;
    assert_eq!(store.parked(), 1);

    let wakes0 = h.stats.wakes.load(Ordering::Relaxed);
    let before = h.stats.txid.load(Ordering::Relaxed);
    conn.execute("INSERT INTO t(v) VALUES ('while parked')", [])
        .unwrap();
    wait_until("the commit replicated", || {
        rstats.remote_txid.load(Ordering::Relaxed) > before
    })
    .await;
    assert_eq!(h.stats.wakes.load(Ordering::Relaxed), wakes0 + 1);
    // Woken, it went back to sleep; the watch forgot the old entry.
    wait_until("parked again", || {
        h.stats.dormant.load(Ordering::Relaxed) && store.parked() == 1
    })
    .await;

    // A "sync now" request leaves the watch at once and completes.
    let started = h.sync.started();
    h.sync.request();
    wait_until("the forced tick", || h.sync.synced() > started).await;
    // The entry it left is forgotten; it parks again once dormant.
    wait_until("parked once more", || {
        h.stats.dormant.load(Ordering::Relaxed) && store.parked() == 1
    })
    .await;

    store.shutdown(std::future::pending()).await;
    let restored = dir.path().join("restored.db");
    common::restore_ok(common::s(&replica), &restored, None);
    assert_eq!(
        common::strings(&restored, "SELECT v FROM t ORDER BY id"),
        ["first", "second", "while parked"]
    );
}
