//! A level-1 compaction whose only input is a segment still in local staging stores that
//! segment as it is (on a directory replica, one more hard link: no byte written locally),
//! after decoding it whole; such objects restore with replicad and with Litestream, and a
//! staged segment that no longer verifies is never stored again.

use crate::common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{TestDir, Writer, assert_same_content, level_ranges};
use replicad::config::{Config, DbSettings};
use replicad::daemon::Store;
use replicad::ltx::{self, Codec, TxId};
use replicad::replicate::counters::{ReplicaCounters, ReplicaMetrics};
use replicad::replicate::maintenance::schedule::RetentionPolicy;
use replicad::replicate::maintenance::{self, Done, Maintenance, Work};
use replicad::replicate::staging::Staging;
use replicad::storage::{AnyClient, LtxFileInfo, ReplicaClient};

/// A replica and staging left by a daemon that shipped TXIDs 1 and 2 (2 from the WAL) and
/// never compacted; returns the database, the replica and the staging directory.
async fn two_staged_segments(dir: &TestDir, codec: Codec) -> (PathBuf, PathBuf, Staging) {
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed(dir.path().to_str().unwrap()));
    writer.commit_txn();
    let never = Duration::from_secs(3600);
    let settings = DbSettings {
        monitor_interval: Duration::from_millis(40),
        min_sync_interval: Duration::from_millis(40),
        levels: vec![never],
        snapshot_interval: never,
        l0_retention: never,
        compression: codec,
        ..DbSettings::default()
    };
    let config = Config::single(db.clone(), &[replica.display().to_string()], settings).unwrap();
    let store = Store::open(&config).await.unwrap();
    let h = store.dbs()[0].clone();
    let h = &h;
    let replicated = |txid: u64| async move {
        while h.replicas[0].1.remote_txid.load(Ordering::Relaxed) < txid {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let within = |what| tokio::time::timeout(Duration::from_secs(30), what);
    within(replicated(1)).await.expect("TXID 1 on the replica");
    writer.commit_txn();
    within(replicated(2)).await.expect("TXID 2 on the replica");
    store.shutdown(std::future::pending()).await;
    let staging = Staging::open(dir.join(".app.db-replicad/ltx/0")).unwrap();
    (db, replica, staging)
}

fn maintenance_in(dir: &TestDir, codec: Codec) -> Maintenance {
    Maintenance {
        levels: vec![Duration::from_secs(1)],
        snapshot_interval: Duration::from_secs(3600),
        retention: RetentionPolicy {
            snapshot_retention: Duration::from_secs(3600),
            l0_retention: Duration::ZERO,
            calendar: Default::default(),
        },
        retention_check: Duration::from_secs(3600),
        retention_enabled: false,
        codec,
        tmp_dir: dir.join("build-tmp"),
        verify_interval: Duration::ZERO,
        verify_recheck: Duration::ZERO,
        replica_check: Duration::ZERO,
        turns: Default::default(),
    }
}

fn counters() -> ReplicaCounters {
    let phases = Arc::new(replicad::util::phase::PhaseStats::new());
    ReplicaMetrics::register(&prometheus::Registry::new(), phases).replica("app", "r", false)
}

/// Compacts the level-0 object `txid` alone into level 1, writing `codec`.
async fn compact_l0(
    dir: &TestDir,
    codec: Codec,
    client: &AnyClient,
    staging: &Staging,
    txid: u64,
) -> Result<LtxFileInfo, replicad::storage::StorageError> {
    let input = client
        .list(0)
        .await
        .unwrap()
        .into_iter()
        .find(|f| f.min_txid == TxId(txid))
        .expect("the level-0 object is listed");
    let work = Work::Compact {
        level: 1,
        inputs: vec![input],
        staged_above: TxId(0),
    };
    let m = maintenance_in(dir, codec);
    match maintenance::run(work, &m, client, staging, &counters()).await? {
        Done::Stored(info) => Ok(info),
        other => panic!("a compaction ended as {other:?}"),
    }
}

/// A segment another writer might store at `txid`: one page, page 2 filled with `byte`, over
/// a database like the one `like` (a staged header of ours) describes.
fn one_page_segment(like: &ltx::Header, txid: u64, byte: u8) -> Vec<u8> {
    let header = ltx::Header {
        flags: ltx::HEADER_FLAG_NO_CHECKSUM,
        page_size: like.page_size,
        commit: like.commit,
        min_txid: TxId(txid),
        max_txid: TxId(txid),
        timestamp: like.timestamp,
        ..ltx::Header::default()
    };
    let mut enc = ltx::encoder::Encoder::new(Vec::new(), header, Codec::Lz4).unwrap();
    enc.encode_page(2, &vec![byte; like.page_size as usize])
        .unwrap();
    enc.finish(0).unwrap().0
}

/// With level 0 deleted, the replica restores (with replicad) to `db`'s content.
fn restores_without_level_0(dir: &TestDir, db: &Path, replica: &Path, what: &str) {
    std::fs::remove_dir_all(replica.join("ltx/0")).unwrap();
    let out = dir.join(&format!("{}.db", what.replace(' ', "-")));
    common::restore_ok(&replica.display().to_string(), &out, None);
    assert_same_content(db, &out, what);
}

fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn object(replica: &Path, level: u8, txid: u64) -> PathBuf {
    replica
        .join(format!("ltx/{level}"))
        .join(ltx::format_filename(TxId(txid), TxId(txid)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_staged_segment_is_stored_at_level_1_as_it_is_and_restores() {
    let dir = TestDir::new("as-is-l1");
    let (db, replica, staging) = two_staged_segments(&dir, Codec::Lz4).await;
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    for txid in [1, 2] {
        let info = compact_l0(&dir, Codec::Lz4, &client, &staging, txid)
            .await
            .unwrap();
        assert_eq!((info.min_txid, info.max_txid), (TxId(txid), TxId(txid)));
        assert_eq!(
            inode(&object(&replica, 1, txid)),
            inode(&staging.path(TxId(txid))),
            "level-1 object {txid} is the staged segment, linked, not a copy"
        );
    }
    // TXID 2 came from the WAL: its header keeps the WAL fields a merge would have zeroed.
    let header =
        ltx::decoder::read_header(std::fs::File::open(object(&replica, 1, 2)).unwrap()).unwrap();
    assert!(header.wal_offset > 0 && header.wal_size > 0, "{header:?}");
    assert!(
        common::files_under(&dir.join("build-tmp"), |_| true).is_empty(),
        "the build directory keeps no link"
    );

    // Level 1 alone restores, with replicad and with Litestream.
    restores_without_level_0(
        &dir,
        &db,
        &replica,
        "replicad restore of level 1 stored as is",
    );
    assert_eq!(level_ranges(&replica, 1), vec![(1, 1), (2, 2)]);
    let Some(ls) = common::litestream_bin() else {
        eprintln!("SKIPPED the Litestream half: litestream not installed");
        return;
    };
    let out = dir.join("by-litestream.db");
    let o = common::litestream_restore(&ls, &replica, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_content(&db, &out, "Litestream restore of level 1 stored as is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_segment_that_no_longer_verifies_is_not_stored_again() {
    let dir = TestDir::new("as-is-rot");
    let (_db, replica, staging) = two_staged_segments(&dir, Codec::Lz4).await;
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    // One byte of a page rots in place, the size kept.
    let staged = staging.path(TxId(2));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&staged)
        .unwrap();
    let at = ltx::HEADER_SIZE as u64 + 64;
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
    drop(file);

    let err = compact_l0(&dir, Codec::Lz4, &client, &staging, 2)
        .await
        .expect_err("a segment that does not verify is refused")
        .to_string();
    assert!(err.contains("staged segment"), "{err}");
    assert!(
        level_ranges(&replica, 1).is_empty(),
        "nothing was stored at level 1"
    );
    assert!(
        common::files_under(&dir.join("build-tmp"), |_| true).is_empty(),
        "the build directory keeps no link"
    );
}

/// zstd segments are stored as they are at any level (`zstd:5` here; a header names the codec,
/// not its level), and segments of another codec than the outputs' are merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_segments_at_any_level_are_stored_as_they_are_and_another_codec_is_merged() {
    let dir = TestDir::new("as-is-zstd");
    let (db, replica, staging) = two_staged_segments(&dir, Codec::Zstd(5)).await;
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    compact_l0(&dir, Codec::Zstd(5), &client, &staging, 1)
        .await
        .unwrap();
    assert_eq!(
        inode(&object(&replica, 1, 1)),
        inode(&staging.path(TxId(1)))
    );
    // Outputs in lz4 from zstd segments are merged into a file of their own.
    compact_l0(&dir, Codec::Lz4, &client, &staging, 2)
        .await
        .unwrap();
    assert_ne!(
        inode(&object(&replica, 1, 2)),
        inode(&staging.path(TxId(2)))
    );
    let header =
        ltx::decoder::read_header(std::fs::File::open(object(&replica, 1, 2)).unwrap()).unwrap();
    assert_eq!(header.codec().unwrap(), Codec::Lz4);
    restores_without_level_0(&dir, &db, &replica, "level 1 stored as is and merged");
}

/// A level-9 snapshot whose plan is the lone full segment at TXID 1 is that segment too; a
/// compaction whose staged segment is gone merges from the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_first_segment_is_the_snapshot_and_a_pruned_one_is_merged_from_the_replica() {
    let dir = TestDir::new("as-is-l9");
    let (db, replica, staging) = two_staged_segments(&dir, Codec::Lz4).await;
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    let l0 = client.list(0).await.unwrap();
    let first = l0.iter().find(|f| f.min_txid == TxId(1)).unwrap().clone();
    let work = Work::Snapshot {
        plan: vec![first],
        staged_above: TxId(0),
    };
    let m = maintenance_in(&dir, Codec::Lz4);
    match maintenance::run(work, &m, &client, &staging, &counters()).await {
        Ok(Done::Stored(info)) => assert_eq!((info.level, info.max_txid), (9, TxId(1))),
        other => panic!("the snapshot ended as {other:?}"),
    }
    assert_eq!(
        inode(&object(&replica, 9, 1)),
        inode(&staging.path(TxId(1)))
    );

    let staged = inode(&staging.path(TxId(2)));
    std::fs::remove_file(staging.path(TxId(2))).unwrap();
    compact_l0(&dir, Codec::Lz4, &client, &staging, 2)
        .await
        .unwrap();
    assert_ne!(
        inode(&object(&replica, 1, 2)),
        staged,
        "merged into a file of its own"
    );
    restores_without_level_0(&dir, &db, &replica, "level 9 as is, then level 1 merged");
}

/// A level-0 object that another writer stored at a TXID staging also holds (the replica
/// diverged, or another host continued it while this one was down) is compacted from the
/// replica, not from staging: our staged segment was taken for it by name, and a level-1 file
/// then held pages the replica's history never had (a restore to a TXID inside it wrong,
/// silently with lz4). Staging stands only for files above `staged_above` (those this run
/// stored); below it, a staged segment of another size is refused too (the size guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_another_writer_stored_is_compacted_from_the_replica() {
    let dir = TestDir::new("as-is-foreign");
    let (_db, replica, staging) = two_staged_segments(&dir, Codec::Lz4).await;
    let client = AnyClient::from_url(&replica.display().to_string()).unwrap();
    let header_of = |txid| {
        ltx::decoder::read_header(std::fs::File::open(staging.path(TxId(txid))).unwrap()).unwrap()
    };
    let (first, ours) = (header_of(1), header_of(2));
    assert_eq!(ours.page_size, 4096);
    // A TXID 2 over the database of TXID 1 (so that the merge with it is a whole snapshot).
    let like = ltx::Header {
        timestamp: ours.timestamp,
        ..first
    };
    let segment = |byte: u8| one_page_segment(&like, 2, byte);
    let foreign = segment(0xab);
    let stored = object(&replica, 0, 2);
    std::fs::remove_file(&stored).unwrap();
    std::fs::write(&stored, &foreign).unwrap();
    assert_ne!(
        foreign.len() as u64,
        std::fs::metadata(staging.path(TxId(2))).unwrap().len()
    );

    // Our staged TXID 2 of another size (the real one), then of the same size (0xcd pages),
    // below and at `staged_above`; the last case shows what staging would stand for.
    let cases = [
        (false, TxId(0), true),
        (false, TxId(2), true),
        (true, TxId(2), true),
        (true, TxId(1), false),
    ];
    for (same_size, staged_above, replicas_page) in cases {
        if same_size {
            std::fs::write(staging.path(TxId(2)), segment(0xcd)).unwrap();
        }
        for inputs in [1, 2] {
            let l1 = object(&replica, 1, 2);
            let _ = std::fs::remove_file(&l1);
            // Alone (stored as it is) and merged with TXID 1.
            let listed = client.list(0).await.unwrap();
            let input = |txid| {
                listed
                    .iter()
                    .find(|f| f.min_txid == TxId(txid))
                    .unwrap()
                    .clone()
            };
            let work = Work::Compact {
                level: 1,
                inputs: match inputs {
                    1 => vec![input(2)],
                    _ => vec![input(1), input(2)],
                },
                staged_above,
            };
            let m = maintenance_in(&dir, Codec::Lz4);
            let Done::Stored(info) = maintenance::run(work, &m, &client, &staging, &counters())
                .await
                .unwrap()
            else {
                panic!("no level-1 file stored");
            };
            let path = replica
                .join("ltx/1")
                .join(ltx::format_filename(info.min_txid, info.max_txid));
            let mut dec = ltx::Decoder::new(std::fs::File::open(&path).unwrap()).unwrap();
            let mut page = vec![0u8; 4096];
            let mut page2 = None;
            while let Some(pgno) = dec.next_page(&mut page).unwrap() {
                if pgno == 2 {
                    page2 = Some(page[0]);
                }
            }
            let want = if replicas_page { 0xab } else { 0xcd };
            assert_eq!(
                page2,
                Some(want),
                "{inputs} input(s), staged of the same size: {same_size}, staged_above {staged_above}"
            );
            std::fs::remove_file(&path).unwrap();
        }
    }
}

/// The daemon's first "compacted" log line of level 1, if any.
fn first_l1(d: &common::Daemon) -> Option<String> {
    d.log_text()
        .lines()
        .find(|l| l.contains("compacted") && l.contains(" level=1 "))
        .map(str::to_string)
}

/// Waits for the daemon's first level-1 compaction; returns its log line.
fn wait_for_first_l1(d: &common::Daemon) -> String {
    common::wait_for(
        "a level-1 compaction",
        || d.log_text(),
        || first_l1(d).is_some(),
    );
    first_l1(d).expect("waited for")
}

/// The files a start lists were on the replica before this run, so its first level-1
/// compaction reads them from the replica (`from_replica` in its log line) although staging
/// still holds segments of those TXIDs and sizes; the replica then restores to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_listed_at_the_start_are_compacted_from_the_replica() {
    let dir = TestDir::new("as-is-restart");
    let (db, replica, staging) = two_staged_segments(&dir, Codec::Lz4).await;
    for txid in [1, 2] {
        assert!(staging.path(TxId(txid)).exists(), "TXID {txid} staged");
    }
    let config = dir.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "monitor-interval: 40ms\nlevels:\n  - interval: 200ms\nsnapshot:\n  interval: 1h\n\
             dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    let d = common::spawn_replicate(dir.path(), &["--config", config.to_str().unwrap()]);
    let line = wait_for_first_l1(&d);
    assert!(
        line.contains("from_replica=2"),
        "TXIDs 1 and 2 were read from the replica: {line}"
    );
    d.stop_ok();
    restores_without_level_0(&dir, &db, &replica, "compacted after a restart");
}

/// A level-0 file that another writer stored while this run was idle, found by the periodic
/// listing: compactions read every level-0 file up to it from the replica (staging may hold
/// other segments at those TXIDs once this run commits again).
#[test]
fn a_file_another_writer_stored_meanwhile_is_compacted_from_the_replica() {
    let dir = TestDir::new("as-is-meanwhile");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let mut writer = Writer::open(&db, common::seed("as-is-meanwhile"));
    writer.commit_txn();
    let config = dir.join("replicad.yml");
    // Level 1 comes 10 s after the start: after the listing that finds the file (checked
    // below, so that a slow machine fails with a clear message rather than a wrong count).
    std::fs::write(
        &config,
        format!(
            "monitor-interval: 40ms\nmin-sync-interval: 40ms\nheartbeat-interval: 100ms\n\
             replica-check-interval: 300ms\nlevels:\n  - interval: 10s\nsnapshot:\n  interval: 1h\n\
             dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    let d = common::spawn_replicate(
        dir.path(),
        &["--log-level", "debug", "--config", config.to_str().unwrap()],
    );
    for txid in 1..=3 {
        if txid > 1 {
            writer.commit_txn();
        }
        assert!(
            common::wait_for_txid(&replica, txid, common::WAIT),
            "TXID {txid} on the replica; log:\n{}",
            d.log_text()
        );
    }
    let staging = Staging::open(dir.join(".app.db-replicad/ltx/0")).unwrap();
    let ours = staging.header(TxId(3)).unwrap();
    std::fs::write(object(&replica, 0, 4), one_page_segment(&ours, 4, 0xab)).unwrap();
    common::wait_for(
        "the listing that finds it",
        || d.log_text(),
        || {
            d.log_text().lines().any(|l| {
                l.contains("compactions read them from it") && l.contains("txid=0000000000000004")
            })
        },
    );
    assert!(
        first_l1(&d).is_none(),
        "level 1 ran before the listing found the file (a slow machine): {:?}",
        first_l1(&d)
    );
    let line = wait_for_first_l1(&d);
    assert!(
        line.contains("max=0000000000000004") && line.contains("from_replica=4"),
        "TXIDs 1 to 4 were read from the replica: {line}"
    );
    d.stop_ok();
}
