//! Tests for compaction, snapshots and retention go here (accelerated intervals): restores
//! through compacted levels equal what the writer recorded, retention deletes but never what
//! the window needs, kill -9 during maintenance leaves no partial object, and Litestream
//! restores a replica replicad compacted.

use crate::common;
use crate::periodic_verify::stopped_and_restored_equal;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{TestDir, Writer, assert_same_content, content_hash, level_ranges};
use replicad::config::{Config, DbSettings};
use replicad::daemon::{DbHandle, Store};
use replicad::ltx::{Codec, TxId};
use replicad::restore::{self, RestoreOptions, Target};
use replicad::storage::AnyClient;

fn fast(codec: Codec) -> DbSettings {
    DbSettings {
        monitor_interval: Duration::from_millis(40),
        // Ship at every poll, as these tests were written for.
        min_sync_interval: Duration::from_millis(40),
        heartbeat_interval: Duration::from_millis(100),
        levels: vec![Duration::from_millis(300), Duration::from_millis(900)],
        snapshot_interval: Duration::from_millis(1500),
        snapshot_retention: Duration::from_secs(3600),
        l0_retention: Duration::ZERO,
        l0_retention_check_interval: Duration::from_millis(200),
        compression: codec,
        ..DbSettings::default()
    }
}

pub(crate) async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn replica_txid(h: &DbHandle) -> u64 {
    h.replicas[0].1.remote_txid.load(Ordering::Relaxed)
}

/// Commits batches, recording (TXID, content hash) once each batch is on the replica.
async fn write_and_record(
    writer: &mut Writer,
    db: &Path,
    h: &DbHandle,
    batches: usize,
) -> Vec<(u64, String)> {
    let mut recorded = Vec::new();
    for _ in 0..batches {
        let before = replica_txid(h);
        writer.commit_txn();
        wait_until("batch replicated", || {
            replica_txid(h) > before && replica_txid(h) == h.stats.txid.load(Ordering::Relaxed)
        })
        .await;
        // Let a tick pass so no later segment belongs to this state.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if replica_txid(h) == h.stats.txid.load(Ordering::Relaxed) {
            recorded.push((replica_txid(h), content_hash(db)));
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    recorded
}

async fn restore_txid(
    replica: &Path,
    out: &Path,
    txid: Option<u64>,
) -> Result<(), restore::RestoreError> {
    restore_on(replica, out, txid, None).await.map(|_| ())
}

/// Restores with its integrity check on `threads` (`None`: one per core).
async fn restore_on(
    replica: &Path,
    out: &Path,
    txid: Option<u64>,
    threads: Option<std::num::NonZeroUsize>,
) -> Result<restore::RestoreReport, restore::RestoreError> {
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    let target = txid.map_or(Target::Latest, |t| Target::TxId(TxId(t)));
    let plan = restore::plan(&client, target).await?;
    let opts = RestoreOptions {
        to: out.to_path_buf(),
        target,
        force: true,
        integrity_check: true,
        phases: Default::default(),
        threads,
    };
    restore::apply(&client, plan, &opts).await
}

/// A daemon replicating `db` to the directory `replica`, and its database's handle.
async fn start(db: &Path, replica: &Path, settings: DbSettings) -> (Store, DbHandle) {
    let config = Config::single(db.to_path_buf(), &[replica.display().to_string()], settings)
        .expect("a valid single-database config");
    let store = Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    (store, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_txid_restores_through_compacted_levels() {
    let dir = TestDir::new("maint-pitr");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-pitr"));
    writer.commit_txn();
    let (store, h) = start(&db, &replica, fast(Codec::Zstd(3))).await;
    let recorded = write_and_record(&mut writer, &db, &h, 14).await;
    // Let L2 and a snapshot happen after the last write.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    store.shutdown(std::future::pending()).await;

    assert!(
        !level_ranges(&replica, 1).is_empty(),
        "no L1 compaction happened"
    );
    assert!(
        !level_ranges(&replica, 2).is_empty(),
        "no L2 compaction happened"
    );
    assert!(
        !level_ranges(&replica, 9).is_empty(),
        "no snapshot happened"
    );
    assert!(recorded.len() >= 10, "recorded only {}", recorded.len());
    for (txid, hash) in &recorded {
        let out = dir.join(&format!("at-{txid}.db"));
        restore_txid(&replica, &out, Some(*txid))
            .await
            .unwrap_or_else(|e| panic!("restore {txid}: {e}"));
        assert_eq!(&content_hash(&out), hash, "content at TXID {txid}");
    }
    // The latest restore goes through the snapshot rather than replaying every L0 file.
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    let plan = restore::plan(&client, Target::Latest).await.unwrap();
    assert_eq!(
        plan[0].level, 9,
        "latest plan should start at a snapshot: {plan:?}"
    );
    let out = dir.join("latest.db");
    restore_txid(&replica, &out, None).await.unwrap();
    assert_same_content(&db, &out, "latest after compactions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_what_the_window_no_longer_needs() {
    let dir = TestDir::new("maint-retention");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-retention"));
    writer.commit_txn();
    let settings = DbSettings {
        snapshot_interval: Duration::from_millis(700),
        snapshot_retention: Duration::from_millis(1500),
        l0_retention: Duration::from_millis(400),
        ..fast(Codec::Lz4)
    };
    let (store, h) = start(&db, &replica, settings).await;
    let recorded = write_and_record(&mut writer, &db, &h, 16).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.shutdown(std::future::pending()).await;

    let l0 = level_ranges(&replica, 0);
    let top = recorded.last().unwrap().0;
    assert!(
        (l0.len() as u64) < top,
        "L0 retention deleted nothing: {} files for {top} TXIDs",
        l0.len()
    );
    let snapshots = level_ranges(&replica, 9);
    assert!(!snapshots.is_empty());
    // Latest, and every recorded TXID the replica still covers, restore exactly.
    let out = dir.join("latest.db");
    restore_txid(&replica, &out, None).await.unwrap();
    assert_same_content(&db, &out, "latest after retention");
    let mut restorable = 0;
    for (txid, hash) in &recorded {
        let out = dir.join(&format!("at-{txid}.db"));
        match restore_txid(&replica, &out, Some(*txid)).await {
            Ok(()) => {
                restorable += 1;
                assert_eq!(&content_hash(&out), hash, "content at TXID {txid}");
            }
            Err(restore::RestoreError::NotAvailable { .. }) => {}
            Err(e) => panic!("TXID {txid}: unexpected error {e}"),
        }
    }
    assert!(restorable >= 1);
    // Before the window: a clear error naming the oldest restorable time.
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    let old = chrono::DateTime::parse_from_rfc3339("2001-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let err = restore::plan(&client, Target::Before(old))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("oldest restorable time"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litestream_restores_a_replica_replicad_compacted() {
    let Some(ls) = common::litestream_bin() else {
        eprintln!("SKIPPED: litestream not installed");
        return;
    };
    let dir = TestDir::new("maint-litestream");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-litestream"));
    writer.commit_txn();
    let settings = DbSettings {
        l0_retention: Duration::from_millis(300),
        ..fast(Codec::Lz4)
    };
    let (store, h) = start(&db, &replica, settings).await;
    write_and_record(&mut writer, &db, &h, 10).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.shutdown(std::future::pending()).await;
    assert!(!level_ranges(&replica, 9).is_empty() && !level_ranges(&replica, 1).is_empty());
    let out = dir.join("by-litestream.db");
    let o = common::litestream_restore(&ls, &replica, &out);
    assert!(
        o.status.success(),
        "litestream restore: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_same_content(
        &db,
        &out,
        "litestream restore of a compacted replicad replica",
    );
}

/// kill -9 while compactions and snapshots run every few hundred milliseconds: every object
/// on the replica is whole (decodes and verifies), the chain restores, and it equals the source.
#[test]
fn kill9_during_compaction_and_snapshots_leaves_no_partial_object() {
    use rand::SeedableRng;
    let seed = common::seed("maint-kill9");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = TestDir::new("maint-kill9");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let cfg = dir.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "monitor-interval: 20ms\nmin-sync-interval: 20ms\nlevels:\n  - interval: 100ms\n  - interval: 250ms\nsnapshot:\n  interval: 400ms\n  retention: 1s\nl0-retention: 300ms\nl0-retention-check-interval: 100ms\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    let mut writer = Writer::open(&db, seed);
    writer.commit_txn();
    for _ in 0..6 {
        let d = common::spawn_replicate(dir.path(), &["--config", cfg.to_str().unwrap()]);
        let until =
            Instant::now() + Duration::from_millis(rand::RngExt::random_range(&mut rng, 300..1200));
        while Instant::now() < until {
            writer.commit_txn();
            std::thread::sleep(Duration::from_millis(15));
        }
        d.kill9();
    }
    let mut d = common::spawn_replicate(dir.path(), &["--config", cfg.to_str().unwrap()]);
    writer.commit_txn();
    std::thread::sleep(Duration::from_millis(1500));
    common::sigterm(&d.child);
    let status =
        common::wait_timeout(&mut d.child, Duration::from_secs(30)).expect("daemon stopped");
    assert!(status.success());

    // Every object on the replica is whole.
    for level in 0..=9u32 {
        for (min, max) in level_ranges(&replica, level) {
            let path = replica.join(format!("ltx/{level}/{min:016x}-{max:016x}.ltx"));
            let mut dec = replicad::ltx::Decoder::new(std::fs::File::open(&path).unwrap()).unwrap();
            let mut page = vec![0u8; dec.header().page_size as usize];
            while dec.next_page(&mut page).unwrap().is_some() {}
            dec.finish()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
    assert!(
        !level_ranges(&replica, 9).is_empty(),
        "no snapshot was taken"
    );
    let out = dir.join("restored.db");
    common::restore_ok(replica.to_str().unwrap(), &out, None);
    assert_same_content(&db, &out, "after kill -9 during maintenance");
}

/// A restore decodes on the threads it is given and checks on as many connections: one each
/// for a daemon's periodic verify, which runs beside the application and should leave it the
/// other cores; one per core (at most 4 decoders) by default. Every count restores the same
/// database. The table has an index, so the check has tasks to split over its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_runs_on_the_threads_it_is_given() {
    let dir = TestDir::new("maint-threads");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-threads"));
    writer.commit_txn();
    writer
        .conn
        .execute_batch("CREATE INDEX t0_a ON t0(a); CREATE INDEX t0_b ON t0(b);")
        .unwrap();
    for _ in 0..20 {
        writer.commit_txn();
    }
    let (store, h) = start(&db, &replica, fast(Codec::Zstd(3))).await;
    wait_until("the last commit replicated", || {
        replica_txid(&h) > 0 && replica_txid(&h) == h.stats.txid.load(Ordering::Relaxed)
    })
    .await;
    store.shutdown(std::future::pending()).await;

    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let n = |k: usize| std::num::NonZeroUsize::new(k);
    // (threads asked, decoder threads, check connections): decoders are capped at 4, and the
    // check's tasks here (the quick check and each table's and index's scans) number 4.
    let cases = [
        (n(1), 1, 1),
        (n(2), 2, 2),
        (n(9), 4, 4),
        (None, cores.min(4), cores.min(4)),
    ];
    for (i, (threads, decoders, connections)) in cases.into_iter().enumerate() {
        let out = dir.join(&format!("restored-{i}.db"));
        let report = restore_on(&replica, &out, None, threads).await.unwrap();
        assert_eq!(report.threads, decoders, "decoder threads for {threads:?}");
        assert_eq!(
            report.check_connections, connections,
            "check connections for {threads:?}"
        );
        assert_eq!(report.integrity_check, "ok");
        assert_same_content(&db, &out, &format!("restored with {threads:?} threads"));
    }
}

/// Maintenance runs beside the uploads: commits reach the replica while a verify (a restore
/// and check of the whole database) runs. The sampler reads the replica's position, then the
/// tip of the last finished verify. A verify of tip T that finishes after a sample saw the
/// position past T, while the verify before it was still the last finished one, was running
/// when that upload landed: run inline in the upload task, as maintenance once was, the
/// position stays at T until the verify of T ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_ship_while_a_verify_runs() {
    let dir = TestDir::new("maint-beside");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-beside"));
    writer.commit_txn();
    // About 8 MiB, so that each verify takes a while.
    writer
        .conn
        .execute_batch(
            "CREATE TABLE big(b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO big SELECT randomblob(4000) FROM n;",
        )
        .unwrap();
    let settings = DbSettings {
        verify_interval: Duration::from_millis(100),
        levels: vec![Duration::from_secs(3600)],
        snapshot_interval: Duration::from_secs(3600),
        ..fast(Codec::Zstd(3))
    };
    let (store, h) = start(&db, &replica, settings).await;
    let counters = h.replicas[0].1.counters.clone();
    wait_until("first verify ok", || counters.verify_ok.get() == 1).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let commits = std::thread::spawn({
        let stop = stop.clone();
        move || {
            while !stop.load(Ordering::Relaxed) {
                writer.commit_txn();
                std::thread::sleep(Duration::from_millis(10));
            }
            writer.commits
        }
    });
    // (position, tip of the last finished verify), in the order read.
    let mut samples: Vec<(i64, i64)> = Vec::new();
    let (mut verifies, mut beside) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while beside == 0 && Instant::now() < deadline {
        let position = replica_txid(&h) as i64;
        let verified = counters.verify_txid.get();
        if let Some(&(_, last)) = samples.last()
            && verified != last
        {
            verifies += 1;
            // The verify that just finished checked `verified`; while the one before it was
            // the last finished, did the position pass `verified`?
            beside += samples
                .iter()
                .filter(|&&(p, v)| v == last && p > verified)
                .count();
        }
        samples.push((position, verified));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let committed = commits.join().unwrap();
    assert!(
        beside > 0,
        "no upload landed while a verify ran ({verifies} verifies finished, {committed} commits)"
    );
    assert_eq!(counters.verify_ok.get(), 1, "every verify passes");
    wait_until("the last commit replicated", || {
        replica_txid(&h) == h.stats.txid.load(Ordering::Relaxed)
    })
    .await;
    store.shutdown(std::future::pending()).await;
    let out = dir.join("restored.db");
    restore_txid(&replica, &out, None).await.unwrap();
    assert_same_content(&db, &out, "restored after verifies ran beside uploads");
}

/// A start empties the build directories a previous run left (a crash mid-compaction), of
/// the replicas still configured and of those removed from the config since, and leaves
/// anything else in the build area alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_empties_the_build_directories_of_current_and_removed_replicas() {
    let dir = TestDir::new("maint-build-dirs");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-build-dirs"));
    writer.commit_txn();
    let tmp = dir.join(".app.db-replicad/tmp");
    let left = [
        tmp.join("file/1-0000000000000001-0000000000000002.ltx.tmp-1"),
        tmp.join("removed/1-0000000000000001-0000000000000009.ltx.tmp-2"),
    ];
    for f in &left {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, vec![7u8; 4096]).unwrap();
    }
    let not_ours = tmp.join("notes.txt");
    std::fs::write(&not_ours, "kept").unwrap();
    let config = Config::single(
        db.clone(),
        &[replica.display().to_string()],
        fast(Codec::Lz4),
    )
    .unwrap();
    let store = Store::open(&config).await.unwrap();
    assert_eq!(store.dbs()[0].replicas[0].0, "file", "the replica's name");
    // (A compaction of this run may make `file` again.)
    for f in &left {
        assert!(!f.exists(), "{} left", f.display());
    }
    assert!(
        !tmp.join("removed").exists(),
        "the removed replica's directory"
    );
    assert!(
        not_ours.exists(),
        "a file that is not a build directory is kept"
    );
    stopped_and_restored_equal(store, &dir, &db, &replica, "after emptying the builds").await;
}

/// A level-1 compaction that keeps failing does not make local staging keep every segment
/// until the disk is full: after a few failures staging drops what the replica holds, and
/// the replica still restores to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_compaction_does_not_grow_staging_without_bound() {
    let dir = TestDir::new("maint-l1-fails");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("maint-l1-fails"));
    writer.commit_txn();
    // Every build fails: its temporary directory cannot be made (root or not).
    let meta = dir.join(".app.db-replicad");
    std::fs::create_dir_all(meta.join("tmp")).unwrap();
    std::fs::write(meta.join("tmp/file"), "in the way").unwrap();
    let settings = DbSettings {
        levels: vec![Duration::from_millis(100)],
        snapshot_interval: Duration::from_secs(3600),
        ..fast(Codec::Lz4)
    };
    let config = Config::single(db.clone(), &[replica.display().to_string()], settings).unwrap();
    let store = Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    let staged = || common::files_under(&meta.join("ltx"), |n| n.ends_with(".ltx")).len();
    let mut most = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        writer.commit_txn();
        tokio::time::sleep(Duration::from_millis(50)).await;
        if started.elapsed() > Duration::from_secs(1) {
            most = most.max(staged());
        }
    }
    let txid = h.stats.txid.load(Ordering::Relaxed);
    assert!(txid > 30, "commits were synced: {txid}");
    assert!(
        most < 15,
        "staging kept {most} segments of {txid} while compactions failed"
    );
    stopped_and_restored_equal(store, &dir, &db, &replica, "while compactions failed").await;
}

/// A maintenance job that keeps failing (here the build directory is a file: every
/// compaction fails to create its output) is said in `/status` (`maintenance_error`, naming
/// the job) and counted in `replicad_replica_maintenance_failures_total`, where only the log
/// said it; the replica stays protected (it is written and restores), and the report clears
/// once the job runs again.
#[test]
fn a_maintenance_job_that_keeps_failing_is_reported_until_it_runs_again() {
    use crate::discovery::status;
    let dir = TestDir::new("maint-failing");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let port = common::http::free_port();
    let cfg = dir.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 20ms\nmin-sync-interval: 20ms\n\
             levels:\n  - interval: 100ms\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    let mut writer = Writer::open(&db, common::seed("maint-failing"));
    writer.commit_txn();
    let d = common::spawn_replicate(dir.path(), &["--config", cfg.to_str().unwrap()]);
    let replica_status = || {
        let st = status(port);
        st["databases"][0]["replicas"][0].clone()
    };
    let up = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    common::wait_for("the daemon listening", || d.log_text(), up);
    common::wait_for(
        "a level-1 file",
        || d.log_text(),
        || {
            writer.commit_txn();
            !level_ranges(&replica, 1).is_empty()
        },
    );
    let tmp = dir.join(".app.db-replicad/tmp");
    std::fs::remove_dir_all(&tmp).unwrap();
    std::fs::write(&tmp, b"in the way").unwrap();
    common::wait_for(
        "the failing compaction reported",
        || d.log_text(),
        || {
            writer.commit_txn();
            replica_status()["maintenance_error"]
                .as_str()
                .is_some_and(|e| e.contains("Compact(1)"))
        },
    );
    let r = replica_status();
    assert_eq!(r["protected"], true, "{r}");
    let (code, metrics) = common::http::get_blocking(port, "/metrics");
    assert_eq!(code, 200);
    let failures: f64 = metrics
        .lines()
        .find(|l| l.starts_with("replicad_replica_maintenance_failures_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no failure counter:\n{metrics}"));
    assert!(failures >= 1.0, "{failures}");

    std::fs::remove_file(&tmp).unwrap();
    common::wait_for(
        "the report cleared",
        || d.log_text(),
        || {
            writer.commit_txn();
            replica_status()["maintenance_error"].is_null()
        },
    );
    // The report is cleared just before the line is written.
    common::wait_for(
        "the recovery line",
        || d.log_text(),
        || d.log_text().contains("maintenance runs again"),
    );
    d.stop_ok();
}
