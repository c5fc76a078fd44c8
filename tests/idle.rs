//! Tests for the idle path go here: an idle database skips every tick through the fast path,
//! and its replicas make no client call at all, across many heartbeats.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use replicad::config::{Config, DbSettings};
use replicad::store::Store;

fn settings() -> DbSettings {
    DbSettings {
        monitor_interval: Duration::from_millis(20),
        heartbeat_interval: Duration::from_millis(50),
        ..DbSettings::default()
    }
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

    let skipped0 = h.stats.sync_skipped.load(Ordering::Relaxed);
    let syncs0 = h.stats.syncs.load(Ordering::Relaxed);
    let ops0 = rstats.total_ops();
    let puts0 = rstats.counters.ops[0].get();
    let gets0 = rstats.counters.ops[1].get();
    let window = Duration::from_millis(1500);
    tokio::time::sleep(window).await;
    let skipped = h.stats.sync_skipped.load(Ordering::Relaxed) - skipped0;
    let ticks = (window.as_millis() / 20) as u64;
    // Every tick in the window took the fast path (timer slack may lose a few ticks).
    assert!(
        skipped >= ticks * 2 / 3,
        "only {skipped} of ~{ticks} ticks skipped"
    );
    assert_eq!(
        h.stats.syncs.load(Ordering::Relaxed),
        syncs0,
        "a full sync ran while idle"
    );
    // ~30 heartbeats elapsed: none may touch the replica.
    assert_eq!(rstats.total_ops(), ops0, "idle replica made client calls");
    assert!(h.stats.idle.load(Ordering::Relaxed));

    // One commit costs exactly one PUT, plus the single-writer lease check of the upload
    // round (one GET; the lease refresh is due only after half of `lease-ttl`, 5 min).
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
