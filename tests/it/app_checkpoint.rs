//! An application's own `PRAGMA wal_checkpoint(FULL|RESTART|TRUNCATE)` beside a writer that
//! commits every few milliseconds, while the daemon runs
//! (`src/replicate/db/app_checkpoint.rs`). Without the yield, the daemon's read transaction
//! keeps each such checkpoint waiting for its whole busy timeout (20 s here), after which it
//! reports busy; with it, every one completes (busy = 0). The chain stays whole: the restore
//! equals the source. Each way of proving that a restart lost nothing is used: the wal-index
//! header (no full segment after the initial one), the database file's checksums when the
//! index proof is turned off (zstd), and a full segment when neither applies (lz4).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::common::http::{free_port, get, sample};
use crate::common::{self, Daemon, TestDir};

/// What the daemon reported after the checkpoints.
struct Counts {
    /// The daemon's log lines that start a full segment, with their reasons.
    full_reasons: Vec<String>,
    yields: f64,
    index_proofs: f64,
    rebases: f64,
    full: f64,
}

async fn counts(port: u16, db: &Path) -> Counts {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let m = get(addr, "/metrics").await.1;
    let labels = format!("db=\"{}\"", db.display());
    let v = |name: &str| {
        sample(&m, name, &labels).unwrap_or_else(|| panic!("{name} missing from /metrics"))
    };
    Counts {
        full_reasons: Vec::new(),
        yields: v("replicad_db_checkpoint_yields_total"),
        index_proofs: v("replicad_db_checkpoint_yield_index_proofs_total"),
        rebases: v("replicad_db_checkpoint_yield_rebases_total"),
        full: v("replicad_db_full_segments_total"),
    }
}

/// Runs the checkpoints of `modes` (each after 300 ms of writes) beside the writer, checks
/// each completed, then stops the writer, waits for the replica and compares its restore.
async fn checkpoints_complete(
    name: &str,
    codec: &str,
    modes: &[&str],
    index_proof: bool,
    min_sync: &str,
) -> Counts {
    let dir = TestDir::new(name);
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let socket = dir.join("ctl.sock");
    let app = Connection::open(&db).unwrap();
    app.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB); BEGIN;",
    )
    .unwrap();
    for _ in 0..200 {
        app.execute("INSERT INTO t(v) VALUES (randomblob(2000))", [])
            .unwrap();
    }
    app.execute_batch("COMMIT").unwrap();
    let port = free_port();
    let config = dir.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "addr: \"127.0.0.1:{port}\"\nsocket: {{enabled: true, path: {}}}\n\
             min-sync-interval: {min_sync}\ndbs:\n  - path: {}\n    \
             compression: {codec}\n    replica:\n      url: {}\n",
            socket.display(),
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    // The hook turns the index proof off, so that the other proofs are exercised.
    let hook: &[(&str, &str)] = if index_proof {
        &[]
    } else {
        &[("REPLICAD_TEST_NO_INDEX_PROOF", "1")]
    };
    let d: Daemon =
        common::spawn_replicate_env(dir.path(), &["--config", common::s(&config)], hook);
    assert!(
        common::wait_for_txid(&replica, 1, Duration::from_secs(30)),
        "initial snapshot: {}",
        d.log_text()
    );

    // The writer: one small commit every 5 ms. Its own auto-checkpoint is off, so that only
    // the checkpoints below touch the database file (a PASSIVE one between a restart and the
    // daemon's look at it would make the proof fail over to a full segment, which is correct
    // but not what this test counts).
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let writer = {
        let (db, stop, commits) = (db.clone(), stop.clone(), commits.clone());
        std::thread::spawn(move || {
            let w = Connection::open(&db).unwrap();
            w.busy_timeout(Duration::from_secs(60)).unwrap();
            w.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
            while !stop.load(Ordering::Relaxed) {
                w.execute("INSERT INTO t(v) VALUES (randomblob(500))", [])
                    .unwrap();
                commits.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    app.busy_timeout(Duration::from_secs(20)).unwrap();
    let mut report = Vec::new();
    for mode in modes {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = commits.load(Ordering::Relaxed);
        let started = Instant::now();
        let (busy, log, done): (i64, i64, i64) = tokio::task::block_in_place(|| {
            app.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
        })
        .unwrap();
        report.push(format!(
            "{mode}: busy {busy}, log {log}, checkpointed {done}, {:?}, {} commits before",
            started.elapsed(),
            before
        ));
        assert_eq!(
            busy,
            0,
            "wal_checkpoint({mode}) stayed busy: the daemon's read transaction kept it waiting\n{}\n{}",
            report.join("\n"),
            d.log_text()
        );
        assert_eq!(log, done, "{mode}: not every frame was checkpointed");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    eprintln!("{name}:\n{}", report.join("\n"));

    let txid = tokio::task::block_in_place(|| common::sync_wait(&socket, &db));
    let mut c = counts(port, &db).await;
    c.full_reasons = d
        .log_text()
        .lines()
        .filter(|l| l.contains("writing a full segment"))
        .map(str::to_owned)
        .collect();
    d.stop_ok();
    assert!(
        common::max_replica_txid(&replica) >= txid,
        "the replica is behind the synced TXID {txid}"
    );
    common::assert_l0_contiguous(&replica);
    let out = dir.join("restored.db");
    common::restore_ok(common::s(&replica), &out, None);
    common::assert_same_content(&db, &out, name);
    assert!(common::integrity_ok(&out));
    // A RESTART or TRUNCATE always meets our read transaction; a FULL that lands right
    // after a sync, before the writer's next commit, finds our snapshot current and needs
    // no yield.
    let blocking = modes.iter().filter(|m| **m != "FULL").count();
    assert!(
        c.yields >= blocking as f64,
        "{} yields for {blocking} blocking checkpoints",
        c.yields
    );
    c
}

const MODES: [&str; 6] = ["FULL", "RESTART", "TRUNCATE", "TRUNCATE", "RESTART", "FULL"];

/// The wal-index header proves restarts lossless: no full segment follows the initial one
/// except after a yield it could not prove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_restart_and_truncate_complete_and_the_chain_goes_on() {
    let c = checkpoints_complete("app-checkpoint-index", "zstd", &MODES, true, "1s").await;
    assert!(c.index_proofs >= 1.0, "no yield was proven by the index");
    // A yield the index cannot prove (a commit of the writer slipped in while the checkpoint
    // waited for the write lock: rare, timing) may cost one; nothing else may.
    let unproven = c.yields - c.index_proofs - c.rebases;
    assert!(
        c.full - 1.0 <= unproven,
        "{} full segments after the initial one for {unproven} unproven yields:\n{}",
        c.full - 1.0,
        c.full_reasons.join("\n")
    );
}

/// Without the index proof, zstd's page checksums prove each restart from the database file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_file_proves_a_restart_when_the_index_cannot() {
    let c = checkpoints_complete("app-checkpoint-file", "zstd", &MODES, false, "1s").await;
    assert_eq!(c.index_proofs, 0.0);
    assert!(
        c.rebases >= 1.0,
        "no restart was proven from the database file"
    );
    assert!(
        c.full - 1.0 <= c.yields - c.rebases,
        "{} full segments after the initial one for {} yields not proven:\n{}",
        c.full - 1.0,
        c.yields - c.rebases,
        c.full_reasons.join("\n")
    );
}

/// lz4 (Litestream's format) keeps no checksums: without the index proof, a WAL found
/// restarted after a yield costs a full segment, and the restore is still exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_any_proof_a_restart_costs_a_full_segment() {
    let c = checkpoints_complete(
        "app-checkpoint-lz4",
        "lz4",
        &["TRUNCATE", "FULL", "RESTART"],
        false,
        "1s",
    )
    .await;
    assert_eq!(c.rebases, 0.0, "a restart proven without checksums");
    assert!(
        c.full >= 2.0,
        "a TRUNCATE restarts the WAL: {} full segments",
        c.full
    );
}

/// `min-sync-interval: 30s`: the writer's commits wait up to 30 s to ship, but an application's
/// checkpoint waiting for our read lock does not (a poll held to the interval would leave it
/// busy after its 20 s timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_does_not_wait_for_min_sync_interval() {
    let c = checkpoints_complete(
        "app-checkpoint-min-sync",
        "zstd",
        &["RESTART", "TRUNCATE"],
        true,
        "30s",
    )
    .await;
    assert!(c.yields >= 2.0, "{} yields", c.yields);
}
