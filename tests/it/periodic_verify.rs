//! Tests for the periodic verify go here: a replica that fails it is reported and re-seeded,
//! a snapshot at the verified TXID counts as verified, an unchanged replica is checked again
//! after the recheck interval, and verifies take turns across databases.

use crate::common;
use crate::maintenance::wait_until;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{TestDir, Writer, assert_same_content, level_ranges};
use replicad::config::Config;
use replicad::daemon::{DbHandle, Store};

/// A database with one commit, replicated to `replica` by a Store that verifies every 300 ms,
/// compacts only hourly and snapshots every `snapshot`; returns once the first verify passed.
pub(crate) async fn verified_every_300ms(
    dir: &TestDir,
    name: &str,
    snapshot: &str,
    recheck: &str,
) -> (PathBuf, PathBuf, Writer, Store) {
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let yaml = format!(
        "monitor-interval: 40ms\nheartbeat-interval: 100ms\nverify-interval: 300ms\nverify-recheck-interval: {recheck}\nlevels:\n  - interval: 1h\nsnapshot:\n  interval: {snapshot}\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
        db.display(),
        replica.display()
    );
    let config = Config::parse(&yaml, "test", false).unwrap();
    assert_eq!(
        config.dbs[0].settings.verify_interval,
        Duration::from_millis(300)
    );
    let mut writer = Writer::open(&db, common::seed(name));
    writer.commit_txn();
    let store = Store::open(&config).await.unwrap();
    let counters = store.dbs()[0].replicas[0].1.counters.clone();
    wait_until("first verify ok", || counters.verify_ok.get() == 1).await;
    (db, replica, writer, store)
}

/// Waits for the seed that heals the replica of `h` after its verify failed, the verify that
/// passes after it, and the replica protected again.
async fn healed_by_one_seed(h: &DbHandle) {
    let stats = h.replicas[0].1.clone();
    let unrestorable = replicad::replicate::health::SeedReason::Unrestorable as usize;
    wait_until("a seed after the failed verify", || {
        stats.counters.reseeds[unrestorable].get() == 1
    })
    .await;
    wait_until("a verify that passes after the seed", || {
        stats.counters.verify_ok.get() == 1
    })
    .await;
    wait_until("protected again", || stats.health.is_ok()).await;
}

/// Stops `store`, restores `replica` and checks that it equals `db`.
pub(crate) async fn stopped_and_restored_equal(
    store: Store,
    dir: &TestDir,
    db: &Path,
    replica: &Path,
    what: &str,
) {
    store.shutdown(std::future::pending()).await;
    let out = dir.join("restored.db");
    common::restore_ok(replica.to_str().unwrap(), &out, None);
    assert_same_content(db, &out, what);
}

/// Flips a byte in the middle of the replica's file at `path`, keeping its size; returns the
/// damaged bytes. The file is replaced whole: a directory replica's file may share its inode
/// with the staged segment (it links it), which an in-place write would damage too.
pub(crate) fn damage(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    let damaged = path.with_extension("damaged");
    std::fs::write(&damaged, &bytes).unwrap();
    std::fs::rename(&damaged, path).unwrap();
    bytes
}

/// A replica that fails its periodic verify is not protected, in every signal, until it is
/// healed: it gets a seed snapshot, is verified again at once, and is protected again only
/// once that verify passes; a restore then equals the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_verify_reports_a_corrupted_replica_and_reseeds_it() {
    let dir = TestDir::new("maint-verify");
    let (db, replica, mut writer, store) =
        verified_every_300ms(&dir, "maint-verify", "1h", "24h").await;
    let h = store.dbs()[0].clone();
    let counters = h.replicas[0].1.counters.clone();

    // The seed that heals the replica cannot be stored yet (an obstacle where its level's
    // directory goes), so the failed verify's state lasts until the test removes it.
    let obstacle = replica.join("ltx/9");
    assert!(
        !obstacle.exists(),
        "no snapshot yet: the first segment was a full one"
    );
    std::fs::write(&obstacle, b"not a directory").unwrap();

    // Damage a middle segment, then commit so the tip moves and the next verify runs.
    let ranges = level_ranges(&replica, 0);
    let (min, max) = ranges[ranges.len() / 2];
    damage(&replica.join(format!("ltx/0/{min:016x}-{max:016x}.ltx")));
    let before = counters.verify_txid.get();
    writer.commit_txn();
    wait_until("verify of the new tip", || {
        counters.verify_txid.get() > before
    })
    .await;
    assert_eq!(
        counters.verify_ok.get(),
        0,
        "a corrupted replica must fail verification"
    );
    let text = replicad::ops::metrics::Metrics::of(&store).render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("replicad_replica_verify_ok{") && l.ends_with(" 0")),
        "{text}"
    );

    // Not protected: the replica's health, so /status, the metric and /readyz (no grace).
    let stats = h.replicas[0].1.clone();
    let reason = || stats.health.problem().map(|p| p.reason).unwrap_or_default();
    wait_until("the failed verify and seed in the replica's health", || {
        reason().contains("re-seeding")
    })
    .await;
    let why = reason();
    assert!(why.starts_with("verify failed"), "{why}");
    let text = replicad::ops::metrics::Metrics::of(&store).render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("replicad_replica_protected{") && l.ends_with(" 0")),
        "{text}"
    );
    let ready = replicad::ops::http::readiness(&store.dbs(), Duration::ZERO, 0);
    assert!(
        ready
            .as_ref()
            .is_err_and(|r| r.iter().any(|l| l.contains("verify failed"))),
        "{ready:?}"
    );

    // Still not protected while the seed fails, though the uploads go on: they do not make
    // it restorable.
    let txid = || h.stats.txid.load(Ordering::Relaxed);
    let failed_at = txid();
    writer.commit_txn();
    wait_until("the commit uploaded", || {
        stats.remote_txid.load(Ordering::Relaxed) == txid() && txid() > failed_at
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counters.verify_ok.get(), 0);
    assert!(reason().starts_with("verify failed"), "{}", reason());

    // Healed once the seed can be stored: a seed, a verify that passes, protected again.
    std::fs::remove_file(&obstacle).unwrap();
    let unrestorable = replicad::replicate::health::SeedReason::Unrestorable as usize;
    wait_until("a seed after the failed verify", || {
        counters.reseeds[unrestorable].get() == 1
    })
    .await;
    wait_until("a verify that passes", || counters.verify_ok.get() == 1).await;
    wait_until("protected again", || stats.health.is_ok()).await;
    assert!(replicad::ops::http::readiness(&store.dbs(), Duration::ZERO, 0).is_ok());
    // One seed healed it: no more once verifies pass.
    writer.commit_txn();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(counters.reseeds[unrestorable].get(), 1);
    assert!(stats.health.is_ok());
    stopped_and_restored_equal(
        store,
        &dir,
        &db,
        &replica,
        "after the seed that healed the replica",
    )
    .await;
}

/// A verify covers the files a restore reads, not only the newest TXID: once a snapshot
/// replaces the verified files at the same TXID (the database idle), the next verify restores
/// through the snapshot, and then none runs while nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_at_the_verified_txid_is_verified_too() {
    let dir = TestDir::new("maint-verify-snapshot");
    let (_, replica, _writer, store) =
        verified_every_300ms(&dir, "maint-verify-snapshot", "3s", "24h").await;
    let counters = store.dbs()[0].replicas[0].1.counters.clone();
    let tip = counters.verify_txid.get();
    assert!(
        level_ranges(&replica, 9).is_empty(),
        "the first verify passed before any snapshot"
    );
    // Each verify restores the whole database: the same page bytes, at the same TXID.
    let applied = || store.phases().bytes(replicad::util::phase::Phase::Apply);
    let one = applied();
    assert!(one > 0);
    wait_until("a level-9 snapshot", || {
        !level_ranges(&replica, 9).is_empty()
    })
    .await;
    assert_eq!(
        level_ranges(&replica, 9),
        vec![(1, tip as u64)],
        "the snapshot is at the verified TXID"
    );
    wait_until("a verify through the snapshot", || applied() == 2 * one).await;
    assert_eq!(counters.verify_ok.get(), 1);
    assert_eq!(counters.verify_txid.get(), tip);
    // Nothing changes any more: the next verifies are skipped.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(applied(), 2 * one);
    store.shutdown(std::future::pending()).await;
}

/// A passing verify vouches for unchanged files only for `verify-recheck-interval`: an object
/// damaged in place with its size kept (the restore plan unchanged, the database idle) is
/// found by the verify after it, and the replica is re-seeded and verified again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_replica_is_checked_again_after_the_recheck_interval() {
    let dir = TestDir::new("maint-recheck");
    let (db, replica, _writer, store) =
        verified_every_300ms(&dir, "maint-recheck", "1h", "3s").await;
    let h = store.dbs()[0].clone();
    let applied = || store.phases().bytes(replicad::util::phase::Phase::Apply);
    let one = applied();

    // Damage the newest segment, keeping its size: the index and the plan stay as they were.
    let (min, max) = *level_ranges(&replica, 0).last().unwrap();
    damage(&replica.join(format!("ltx/0/{min:016x}-{max:016x}.ltx")));
    // Within the recheck interval the verify is skipped: nothing is restored again.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        applied(),
        one,
        "a verify of unchanged files within the interval"
    );

    healed_by_one_seed(&h).await;
    stopped_and_restored_equal(store, &dir, &db, &replica, "after the recheck and its seed").await;
}

/// An idle database's replica restores from its level-9 snapshot at the database's TXID
/// alone. When that object is damaged in place, the seed that heals the replica belongs where
/// it stands: it is replaced (deleted, then the seed put whole), and the replica restores
/// again without waiting for a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_of_an_idle_database_is_replaced_by_its_seed() {
    let dir = TestDir::new("maint-heal-idle");
    let (db, replica, _writer, store) =
        verified_every_300ms(&dir, "maint-heal-idle", "1s", "1s").await;
    let h = store.dbs()[0].clone();
    let counters = h.replicas[0].1.counters.clone();
    let tip = counters.verify_txid.get() as u64;
    wait_until("a level-9 snapshot", || {
        !level_ranges(&replica, 9).is_empty()
    })
    .await;
    assert_eq!(level_ranges(&replica, 9), vec![(1, tip)]);

    let path = replica.join(format!("ltx/9/{:016x}-{tip:016x}.ltx", 1));
    let bytes = damage(&path);

    healed_by_one_seed(&h).await;
    assert_eq!(
        h.stats.txid.load(Ordering::Relaxed),
        tip,
        "no commit healed it"
    );
    assert_eq!(level_ranges(&replica, 9), vec![(1, tip)]);
    assert_ne!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the damaged object was replaced"
    );
    stopped_and_restored_equal(
        store,
        &dir,
        &db,
        &replica,
        "after the damaged snapshot was replaced",
    )
    .await;
}

/// A database that is itself corrupt (an index that does not match its table, written through
/// SQLite) restores from any replica as corrupt: the failed verify seeds the replica once,
/// the verify after the seed fails too, and the replica's health then blames the database
/// (run `PRAGMA integrity_check` on it) instead of seeding whole copies in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verify_that_fails_again_after_its_seed_points_at_the_database() {
    let dir = TestDir::new("maint-verify-db");
    let (_, _, mut writer, store) =
        verified_every_300ms(&dir, "maint-verify-db", "1h", "24h").await;
    let h = store.dbs()[0].clone();
    let counters = h.replicas[0].1.counters.clone();
    let stats = h.replicas[0].1.clone();

    // The application corrupts its own database: the index now claims another column than
    // the one its entries hold. A commit like any other, so every replica ships it.
    writer
        .conn
        .execute_batch(
            "CREATE TABLE c(a, b); CREATE INDEX c_a ON c(a); \
             INSERT INTO c VALUES (1, 10), (2, 20), (3, 30); \
             PRAGMA writable_schema=ON; \
             UPDATE sqlite_schema SET sql = 'CREATE INDEX c_a ON c(b)' WHERE name = 'c_a'; \
             PRAGMA writable_schema=OFF;",
        )
        .unwrap();
    let unrestorable = replicad::replicate::health::SeedReason::Unrestorable as usize;
    let reason = || stats.health.problem().map(|p| p.reason).unwrap_or_default();
    wait_until("the verify after the seed fails too", || {
        reason().contains("also after a seed")
    })
    .await;
    let why = reason();
    assert!(why.starts_with("verify failed"), "{why}");
    assert!(why.contains("PRAGMA integrity_check"), "{why}");
    assert_eq!(counters.reseeds[unrestorable].get(), 1, "{why}");
    let ready = replicad::ops::http::readiness(&store.dbs(), Duration::ZERO, 0);
    assert!(
        ready
            .as_ref()
            .is_err_and(|r| r.iter().any(|l| l.contains("also after a seed"))),
        "{ready:?}"
    );
    // More commits and verifies: still not protected, and no second whole copy.
    let before = counters.verify_txid.get();
    writer.commit_txn();
    wait_until("a verify of the new tip", || {
        counters.verify_txid.get() > before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(counters.verify_ok.get(), 0);
    assert_eq!(counters.reseeds[unrestorable].get(), 1);
    assert!(reason().contains("also after a seed"), "{}", reason());
    store.shutdown(std::future::pending()).await;
}

/// Verifies take turns across the Store: with four databases due for a verify at the same
/// moments, at most one is restored at a time (each verify holds a whole copy of its database
/// on disk and a core), and every database is still verified, though each also compacts
/// every 300 ms (a replica keeps its place in line while another of its jobs runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_take_turns_across_databases() {
    let dir = TestDir::new("maint-turns");
    let mut yaml = String::from(
        "monitor-interval: 40ms\nheartbeat-interval: 100ms\nverify-interval: 100ms\n\
         levels:\n  - interval: 300ms\nsnapshot:\n  interval: 1h\ndbs:\n",
    );
    let mut writers = Vec::new();
    for i in 0..4 {
        let db = dir.join(&format!("db{i}.db"));
        let mut w = Writer::open(&db, common::seed(&format!("maint-turns-{i}")));
        w.commit_txn();
        // About 2 MiB, so that each verify takes a while.
        w.conn
            .execute_batch(
                "CREATE TABLE big(b BLOB);
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
                 INSERT INTO big SELECT randomblob(4000) FROM n;",
            )
            .unwrap();
        writers.push(w);
        yaml += &format!(
            "  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            dir.join(&format!("replica{i}")).display()
        );
    }
    let config = Config::parse(&yaml, "test", false).unwrap();
    let store = Store::open(&config).await.unwrap();

    // Sample the verifies' outputs on disk while every database commits.
    let mut most = 0;
    let mut commits = Instant::now();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        if commits.elapsed() >= Duration::from_millis(50) {
            for w in &mut writers {
                w.commit_txn();
            }
            commits = Instant::now();
        }
        // Two looks in a row: one walk of the directories can see the verify that just ended
        // and the one that just began, which never ran together.
        let (a, b) = (verifying(dir.path()), verifying(dir.path()));
        most = most.max(a.intersection(&b).count());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for h in store.dbs().iter() {
        let c = &h.replicas[0].1.counters;
        assert!(
            c.verify_ok.get() == 1 && c.verify_txid.get() > 1,
            "{}: verify ok {} at TXID {}",
            h.path.display(),
            c.verify_ok.get(),
            c.verify_txid.get()
        );
    }
    assert_eq!(
        most, 1,
        "databases being verified at once, at most (0: no verify was seen)"
    );
    store.shutdown(std::future::pending()).await;
}

/// The replicas' temporary directories under `dir` that hold a verify's output now.
fn verifying(dir: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    common::files_under(dir, |n| n.starts_with("verify.db"))
        .into_iter()
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect()
}

/// A verify that cannot run (every request to the replica fails) is no verdict: the last
/// verdict stands in `replicad_replica_verify_ok`, where a 0 read as "the verify failed" and
/// sent a verify-failed webhook while the log said it could not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verify_that_cannot_run_keeps_the_last_verdict() {
    use replicad::storage::faulty::Faults;
    let dir = TestDir::new("verify-no-verdict");
    let db = dir.join("app.db");
    let yaml = format!(
        "monitor-interval: 40ms\nheartbeat-interval: 100ms\nverify-interval: 300ms\nverify-recheck-interval: 300ms\nlevels:\n  - interval: 1h\nsnapshot:\n  interval: 1h\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
        db.display(),
        dir.join("replica").display()
    );
    let config = Config::parse(&yaml, "test", false).unwrap();
    let mut writer = Writer::open(&db, common::seed("verify-no-verdict"));
    writer.commit_txn();
    let faults = Faults::new();
    let store = Store::open_with(&config, Some(common::behind_faults(&faults)))
        .await
        .unwrap();
    let counters = store.dbs()[0].replicas[0].1.counters.clone();
    wait_until("first verify ok", || counters.verify_ok.get() == 1).await;
    let failures = counters.maintenance_failures.get();
    faults.set_fail_rate(1.0);
    wait_until("verifies that could not run", || {
        counters.maintenance_failures.get() >= failures + 3
    })
    .await;
    assert_eq!(
        counters.verify_ok.get(),
        1,
        "no verdict counted as a failure"
    );
    faults.set_fail_rate(0.0);
    store.shutdown(std::future::pending()).await;
}
