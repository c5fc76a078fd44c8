//! Dormancy: an idle database closes its SQLite connection (no descriptor, no shared memory),
//! and every way the application can change it meanwhile is caught on waking, without a lost
//! transaction: a plain commit (continued incrementally), a checkpoint that restarted the WAL,
//! and a last connection closing (which checkpoints and deletes the WAL).
//!
//! The Db is driven directly, so the test decides when ticks happen and the application's
//! actions land exactly while the database is dormant.

use crate::common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use replicad::config::DbSettings;
use replicad::replicate::db::{Db, DbStats, RemoteTip};
use rusqlite::Connection;

fn settings(codec: &str) -> DbSettings {
    DbSettings {
        dormant_after: Duration::from_millis(1),
        compression: codec.parse().unwrap(),
        ..DbSettings::default()
    }
}

/// Descriptors of this process open on the database or its WAL/shm.
fn open_fds(db: &Path) -> Vec<String> {
    // Tests run in parallel in this process: match the whole path, not the file name.
    let prefix = db.to_string_lossy().into_owned();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .filter(|t| t.starts_with(&prefix))
        .collect()
}

fn stat(s: &DbStats) -> (u64, u64, u64, bool) {
    (
        s.segments.load(Ordering::Relaxed),
        s.full_segments.load(Ordering::Relaxed),
        s.wakes.load(Ordering::Relaxed),
        s.dormant.load(Ordering::Relaxed),
    )
}

/// Syncs until the database is dormant (the stamp needs the file's mtime 50 ms old).
fn put_to_sleep(db: &mut Db) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !db.stats().dormant.load(Ordering::Relaxed) {
        assert!(Instant::now() < deadline, "database never went dormant");
        db.sync(true).unwrap();
        sleep(Duration::from_millis(20));
    }
    assert!(
        db.fast_path_skip(Instant::now()),
        "a dormant, unchanged database takes the fast path"
    );
}

/// The replica (the staging directory) restores to exactly the source.
fn assert_restores(meta: &Path, source: &Path, tag: &str) {
    let out = meta.parent().unwrap().join(format!("restored-{tag}.db"));
    restore_ok(s(meta), &out, None);
    assert_same_content(source, &out, tag);
    assert!(integrity_ok(&out), "{tag}: integrity_check failed");
}

fn app(path: &Path) -> Connection {
    let c = Connection::open(path).unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c
}

fn insert(c: &Connection, n: usize, tag: &str) {
    c.execute_batch("BEGIN").unwrap();
    for i in 0..n {
        c.execute(
            "INSERT INTO t (v) VALUES (?1)",
            [format!("{tag}-{i}-{}", "x".repeat(300))],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
}

fn dormancy_case(codec: &str) {
    let (dir, path, mut db) = seeded(
        &format!("dormancy-{}", codec.replace(':', "")),
        settings(codec),
    );
    let meta = dir.join("meta");
    let stats = db.stats();
    db.sync(true).unwrap();
    assert!(
        !open_fds(&path).is_empty(),
        "awake, the connection holds descriptors"
    );

    // 1. Dormant: nothing of the database stays open.
    put_to_sleep(&mut db);
    assert_eq!(
        open_fds(&path),
        Vec::<String>::new(),
        "dormant, no descriptor stays open"
    );
    let (segs, fulls, wakes, _) = stat(&stats);

    // 2. A plain commit by an application that keeps its connection: continued incrementally.
    let keep = app(&path);
    insert(&keep, 10, "plain");
    assert!(
        !db.fast_path_skip(Instant::now()),
        "a commit wakes the database"
    );
    db.sync(true).unwrap();
    assert_eq!(
        stat(&stats),
        (segs + 1, fulls, wakes + 1, false),
        "one incremental segment"
    );
    assert_restores(&meta, &path, "plain-commit");

    // 3. While dormant, the application checkpoints (TRUNCATE) and commits again: the WAL
    //    restarted over frames replicad never held a lock on, and the database file changed.
    put_to_sleep(&mut db);
    let (segs, fulls, wakes, _) = stat(&stats);
    insert(&keep, 20, "before-truncate");
    keep.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    insert(&keep, 5, "after-truncate");
    assert!(!db.fast_path_skip(Instant::now()));
    db.sync(true).unwrap();
    let (segs2, fulls2, wakes2, dormant) = stat(&stats);
    assert_eq!(
        (segs2, fulls2, wakes2, dormant),
        (segs + 1, fulls + 1, wakes + 1, false),
        "a restarted WAL with a changed database file costs one full segment"
    );
    assert_restores(&meta, &path, "wal-restarted");

    // 4. While dormant, the application commits and closes its last connection, which
    //    checkpoints and deletes the WAL: only the database file's stamp shows the change.
    put_to_sleep(&mut db);
    let (segs, fulls, wakes, _) = stat(&stats);
    insert(&keep, 7, "then-close");
    drop(keep);
    assert!(
        !dir.join("app.db-wal").exists(),
        "SQLite deleted the WAL on the last close"
    );
    assert!(
        !db.fast_path_skip(Instant::now()),
        "a changed database file wakes it"
    );
    db.sync(true).unwrap();
    assert_eq!(stat(&stats), (segs + 1, fulls + 1, wakes + 1, false));
    assert_restores(&meta, &path, "wal-deleted");

    // 5. Shutdown of a dormant, unchanged database writes nothing and stays closed.
    put_to_sleep(&mut db);
    let before = stat(&stats);
    assert_eq!(db.final_sync().unwrap(), 0);
    assert_eq!(stat(&stats), before);
    assert_eq!(open_fds(&path), Vec::<String>::new());
}

#[test]
fn dormant_database_wakes_on_every_kind_of_change_zstd() {
    dormancy_case("zstd:3");
}

/// The Litestream-compatible codec keeps no checksum table: the same cases must hold.
#[test]
fn dormant_database_wakes_on_every_kind_of_change_lz4() {
    dormancy_case("lz4");
}

/// A small database whose application closed its last connection (SQLite checkpointed and
/// deleted the WAL), and its Db staging under `<dir>/meta`.
fn seeded(name: &str, settings: DbSettings) -> (TestDir, std::path::PathBuf, Db) {
    let dir = TestDir::new(name);
    let path = dir.join("app.db");
    {
        let c = app(&path);
        c.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);",
        )
        .unwrap();
        insert(&c, 5, "seed");
    }
    let db = Db::new(
        path.clone(),
        Some(dir.join("meta")),
        settings,
        RemoteTip::default(),
    );
    (dir, path, db)
}

/// `dormant-after: 0s` keeps the connection open however long the database idles.
#[test]
fn dormancy_can_be_switched_off() {
    let (_dir, path, mut db) = seeded(
        "dormancy-off",
        DbSettings {
            dormant_after: Duration::ZERO,
            ..DbSettings::default()
        },
    );
    for _ in 0..10 {
        db.sync(true).unwrap();
        sleep(Duration::from_millis(20));
    }
    assert!(!db.stats().dormant.load(Ordering::Relaxed));
    assert!(!open_fds(&path).is_empty());
}

/// With more open connections than the descriptor budget `replicate` derives from its
/// open-file limit, an idle database goes dormant at its next idle sync, not after
/// `dormant-after` (here an hour): this is what lets 10,000 databases fit 20,000 descriptors.
#[test]
fn descriptor_pressure_makes_idle_databases_dormant_at_once() {
    let (_dir, path, mut db) = seeded(
        "dormancy-pressure",
        DbSettings {
            dormant_after: Duration::from_secs(3600),
            ..DbSettings::default()
        },
    );
    db.sync(true).unwrap();
    db.sync(true).unwrap();
    assert!(
        !db.stats().dormant.load(Ordering::Relaxed),
        "no pressure: awake"
    );
    db.awake_budget().set(0);
    put_to_sleep(&mut db);
    assert!(open_fds(&path).is_empty());
}

/// A database replaced (`mv new.db app.db`) or removed while dormant, with an application's
/// connection holding its WAL, so that the WAL's stamp stays as it was: the monitor's own
/// check sees it at once, and the parked probe within ten probes (it checks the database
/// file's stamp at every tenth). Only the WAL was compared, and the change went unseen for as
/// long as the database stayed idle.
#[test]
fn a_dormant_database_replaced_or_removed_under_an_open_connection_is_seen() {
    for removed in [false, true] {
        let (dir, path, mut db) =
            seeded(&format!("dormant-replaced-{removed}"), settings("zstd:3"));
        let keep = app(&path);
        insert(&keep, 3, "kept");
        db.sync(true).unwrap();
        put_to_sleep(&mut db);
        assert!(
            dir.join("app.db-wal").exists(),
            "the connection keeps the WAL"
        );
        let mut probe = db.dormant_probe().expect("dormant and healthy");
        for _ in 0..12 {
            assert!(probe.unchanged(), "nothing changed yet");
        }
        if removed {
            std::fs::remove_file(&path).unwrap();
        } else {
            let other = dir.join("other.db");
            let c = Connection::open(&other).unwrap();
            c.execute_batch("CREATE TABLE o (x); INSERT INTO o VALUES (1);")
                .unwrap();
            drop(c);
            std::fs::rename(&other, &path).unwrap();
        }
        let mut probes = 1;
        while probe.unchanged() {
            probes += 1;
            assert!(
                probes <= 10,
                "removed={removed}: unseen after {probes} probes"
            );
        }
        assert!(
            !db.fast_path_skip(Instant::now()),
            "removed={removed}: the monitor's own check sees it at once"
        );
        drop(keep);
    }
}
