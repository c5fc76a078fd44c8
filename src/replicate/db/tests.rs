use super::connection::same_generation;
use super::*;

/// An application database in WAL mode with one committed row, and its connection.
fn wal_app(dir: &Path) -> (PathBuf, Connection) {
    let path = dir.join("app.db");
    let app = Connection::open(&path).unwrap();
    app.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('a');",
    )
    .unwrap();
    (path, app)
}

/// A `Db` with default settings for the database at `path`, after its first sync.
fn synced_db(dir: &Path, path: &Path) -> Db {
    let mut db = Db::new(
        path.to_path_buf(),
        Some(dir.join("meta")),
        DbSettings::default(),
        RemoteTip::default(),
    );
    db.sync(false).unwrap();
    db
}

fn scan_wal(wal: &File) -> wal::WalScan {
    wal::scan(wal, WAL_HEADER_SIZE, u64::MAX)
        .unwrap()
        .expect("frames in the WAL")
}

fn salts(scan: &wal::WalScan) -> (u32, u32) {
    (scan.header.salt1, scan.header.salt2)
}

/// Pages read under one WAL header are accepted while the salts stand, and refused once
/// the WAL has been restarted (SQLite rewrote the header with new salts).
#[test]
fn same_generation_refuses_pages_read_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (_, app) = wal_app(dir.path());
    let wal = File::open(dir.path().join("app.db-wal")).unwrap();
    let scan = scan_wal(&wal);
    assert!(!scan.pages.is_empty());
    same_generation(&wal, salts(&scan)).unwrap();

    // More frames in the same generation do not matter.
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    same_generation(&wal, salts(&scan)).unwrap();

    // A complete checkpoint, then a write: SQLite restarts the WAL in place.
    app.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    app.execute("INSERT INTO t VALUES ('c')", []).unwrap();
    assert!(matches!(
        same_generation(&wal, salts(&scan)),
        Err(DbError::WalRestartedDuringRead)
    ));
}

/// A failed `build_table` (here: its pages seem to span a WAL restart) must leave the
/// page buffer in place; without it every later segment failed, and the daemon kept
/// retrying one full segment.
#[test]
fn a_failed_build_table_keeps_the_page_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    let mut db = synced_db(dir.path(), &path);
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    let wal = File::open(dir.path().join("app.db-wal")).unwrap();
    let mut scan = scan_wal(&wal);
    scan.header.salt1 ^= 1;
    assert!(matches!(
        db.build_table(Some((&wal, &scan))),
        Err(DbError::WalRestartedDuringRead)
    ));
    assert_eq!(db.page_buf.len(), 4096);
    app.execute("INSERT INTO t VALUES ('c')", []).unwrap();
    assert!(db.sync(false).unwrap() > 0, "the next sync wrote nothing");
}

/// The checkpoint's passes move our read mark without SQLite's write lock: while the
/// application holds that lock in an open transaction, the frames already committed are
/// still copied into the database file (the barrier, which needs the lock, is skipped), and
/// the chain goes on once the application commits. With passes that took the write lock,
/// nothing was copied.
#[test]
fn checkpoint_passes_copy_the_wal_while_the_application_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    let mut db = synced_db(dir.path(), &path);
    for i in 0..300 {
        app.execute("INSERT INTO t VALUES (?1)", [format!("{i:0>2000}")])
            .unwrap();
    }
    db.sync(false).unwrap();
    let before = std::fs::metadata(&path).unwrap().len();
    let pages: i64 = app
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    let pages = pages as u64;
    let writer = Connection::open(&path).unwrap();
    writer
        .execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES ('held');")
        .unwrap();
    db.checkpoint(false).unwrap();
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        before < pages * 4096 && after == pages * 4096,
        "database file {before} -> {after} bytes, {pages} pages committed"
    );
    writer.execute_batch("COMMIT").unwrap();
    let pos = db.pos();
    assert!(
        db.sync(false).unwrap() > 0,
        "the held commit was not staged"
    );
    assert_eq!(db.pos().0, pos.0 + 1);
    assert_eq!(db.stats().full_segments.load(Ordering::Relaxed), 1);
}

/// The premise of holding SQLite's checkpoint lock across a move of our read mark: the
/// probe's lock is seen by others (here an open file description lock, which conflicts with
/// this process's own record locks), and our PASSIVE checkpoint's unlock releases it.
#[cfg(target_os = "linux")]
#[test]
fn the_held_checkpoint_lock_is_released_by_our_own_checkpoint() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let (path, _app) = wal_app(dir.path());
    let ours = super::connection::open_connection(&path).unwrap();
    let probe = super::shm::ShmProbe::open(&path).expect("a -shm file");
    let other = File::open(dir.path().join("app.db-shm")).unwrap();
    let held = || {
        // SAFETY: plain old data; F_OFD_GETLK only writes the struct it is given.
        #[allow(unsafe_code)]
        unsafe {
            let mut fl: libc::flock = std::mem::zeroed();
            fl.l_type = libc::F_WRLCK as libc::c_short;
            fl.l_whence = libc::SEEK_SET as libc::c_short;
            fl.l_start = 121;
            fl.l_len = 1;
            assert_eq!(
                libc::fcntl(other.as_raw_fd(), libc::F_OFD_GETLK, &mut fl),
                0
            );
            fl.l_type != libc::F_UNLCK as libc::c_short
        }
    };
    assert!(!held());
    assert!(probe.hold_checkpoint_lock());
    assert!(held());
    ours.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    assert!(!held(), "our checkpoint left the lock held");
    assert!(probe.hold_checkpoint_lock());
    probe.release_checkpoint_lock();
    assert!(!held());
}

/// A sync tells apart the segments its checkpoint wrote (the restart write of our sequence
/// row) from the application's commits: the monitor starts `min-sync-interval` after the
/// latter only, so a quiet checkpoint does not hold the next commit back.
#[test]
fn a_sync_reports_which_of_its_segments_its_checkpoint_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    let mut db = Db::new(
        path,
        Some(dir.path().join("meta")),
        DbSettings {
            min_checkpoint_page_count: 1,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    db.sync(true).unwrap();
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    let written = db.sync(true).unwrap();
    let ours = db.checkpoint_segments();
    assert!(
        ours >= 1,
        "the checkpoint's restart write ships as a segment"
    );
    assert_eq!(written - ours, 1, "one application commit");
    assert_eq!((db.sync(true).unwrap(), db.checkpoint_segments()), (0, 0));
}

/// An application's TRUNCATE checkpoint, let through by a yield, empties the WAL while our
/// mark stays on the old generation until the next commit: a seed must still be built from
/// the database file (it failed with "the WAL was restarted while it was read" at every
/// request until the application committed again, found by the 50-takeover test).
#[test]
fn a_seed_is_built_after_the_application_truncated_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    for i in 0..20 {
        app.execute("INSERT INTO t VALUES (?1)", [format!("row-{i}")])
            .unwrap();
    }
    let mut db = synced_db(dir.path(), &path);
    // Another process (SQLite's locks are per process): the sqlite3 shell, as CI installs it.
    let mut truncate = std::process::Command::new("sqlite3")
        .args([
            "-batch",
            "-init",
            "/dev/null",
            path.to_str().unwrap(),
            ".timeout 20000",
            "PRAGMA wal_checkpoint(TRUNCATE);",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the sqlite3 shell");
    let deadline = Instant::now() + Duration::from_secs(20);
    while truncate.try_wait().unwrap().is_none() && Instant::now() < deadline {
        db.sync(true).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = truncate.wait_with_output().unwrap();
    let busy = String::from_utf8_lossy(&out.stdout);
    assert!(busy.starts_with("0|"), "the TRUNCATE was busy: {busy}");
    assert!(db.stats().checkpoint_yields.load(Ordering::Relaxed) >= 1);
    assert_eq!(
        std::fs::metadata(dir.path().join("app.db-wal"))
            .unwrap()
            .len(),
        0
    );
    db.sync(true).unwrap();
    // The route under test: the yield proved the restart, and the mark waits for a commit.
    assert!(db.next_gen_follows);
    let seed = db.build_seed().expect("a seed from the database file");
    assert_eq!(seed.txid, db.pos);
    let mut f = File::open(&seed.path).unwrap();
    let mut dec = crate::ltx::Decoder::new(&mut f).unwrap();
    let mut page = vec![0u8; dec.header().page_size as usize];
    let mut pages = 0;
    while dec.next_page(&mut page).unwrap().is_some() {
        pages += 1;
    }
    assert_eq!(pages, dec.header().commit);
    dec.finish().unwrap();
}

/// Restores the segments staged under `meta` into `to`, as a directory replica of them.
fn restore_staged(meta: &Path, to: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = crate::storage::AnyClient::File(crate::storage::file::FileClient::new(
            meta.to_path_buf(),
        ));
        let plan = crate::restore::plan(&client, crate::restore::Target::Latest)
            .await
            .unwrap();
        let opts = crate::restore::RestoreOptions {
            to: to.to_path_buf(),
            target: crate::restore::Target::Latest,
            force: false,
            integrity_check: true,
            phases: Arc::default(),
            threads: None,
        };
        crate::restore::apply(&client, plan, &opts).await.unwrap();
    });
}

/// The rows of tables `t` and `u` of the database at `path`.
fn rows(path: &Path) -> Vec<String> {
    let c = Connection::open(path).unwrap();
    let mut st = c
        .prepare("SELECT v FROM t UNION ALL SELECT 'u:' || v FROM u")
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A commit that lands between our checkpoint's unlock and its TRUNCATE is in the database
/// file only: the full segment written after the TRUNCATE carries it. When writing that
/// segment failed (a full disk), nothing remembered it was owed: the next sync went on from
/// the old mark into the WAL's next generation, and the replica lacked the commit, silently.
#[test]
fn a_commit_the_truncate_moved_is_shipped_when_the_full_segment_first_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    // The commit in the gap goes to a page no later commit writes again.
    app.execute_batch("CREATE TABLE u (v TEXT)").unwrap();
    // A connection that has restarted the WAL once writes the next generation's header with
    // the salt after the last one (a fresh one draws both at random, which reads as a second
    // restart and forces a full segment anyway).
    app.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let meta = dir.path().join("meta");
    let mut db = Db::new(
        path.clone(),
        Some(meta.clone()),
        DbSettings {
            min_checkpoint_page_count: 1,
            truncate_page_n: 4,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    db.sync(false).unwrap();
    for i in 0..8 {
        app.execute("INSERT INTO t VALUES (?1)", [format!("row-{i}")])
            .unwrap();
    }
    // Between the unlock and the TRUNCATE: the application commits, and the staging
    // directory stops taking files.
    let staging = meta.join("ltx/0");
    let aside = meta.join("ltx/0-aside");
    let (p, s, a) = (path.clone(), staging.clone(), aside.clone());
    db.hooks.before_truncate = Some(Box::new(move || {
        let c = Connection::open(&p).unwrap();
        c.execute("INSERT INTO u VALUES ('in the gap')", [])
            .unwrap();
        std::fs::rename(&s, &a).unwrap();
        std::fs::write(&s, b"").unwrap();
    }));
    db.sync(true)
        .expect_err("the full segment cannot be staged");
    assert_eq!(
        std::fs::metadata(dir.path().join("app.db-wal"))
            .unwrap()
            .len(),
        0,
        "the TRUNCATE ran"
    );
    std::fs::remove_file(&staging).unwrap();
    std::fs::rename(&aside, &staging).unwrap();
    app.execute("INSERT INTO t VALUES ('after')", []).unwrap();
    db.sync(false).unwrap();
    let out = dir.path().join("restored.db");
    restore_staged(&meta, &out);
    let want = rows(&path);
    assert!(want.contains(&"u:in the gap".to_string()), "{want:?}");
    assert_eq!(rows(&out), want);
}

/// An application database with tables `t` and `u`, and its `Db` (staging in `<dir>/meta`)
/// synced, then 8 commits: past `truncate-page-n` (4), so the next checkpoint is a TRUNCATE.
fn past_truncate_page_n(dir: &Path) -> (PathBuf, Connection, PathBuf, Db) {
    let (path, app) = wal_app(dir);
    app.execute_batch("CREATE TABLE u (v TEXT)").unwrap();
    let meta = dir.join("meta");
    let mut db = Db::new(
        path.clone(),
        Some(meta.clone()),
        DbSettings {
            min_checkpoint_page_count: 1,
            truncate_page_n: 4,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    db.sync(false).unwrap();
    for i in 0..8 {
        app.execute("INSERT INTO t VALUES (?1)", [format!("row-{i}")])
            .unwrap();
    }
    (path, app, meta, db)
}

/// A TRUNCATE checkpoint that an application's reader keeps from resetting the WAL leaves
/// every frame in it: the chain goes on incrementally, a commit that landed around the
/// TRUNCATE included, and the TRUNCATE is not tried again at once. It was counted as a
/// TRUNCATE and followed by a full segment, a copy of the whole database at every tick the
/// reader stayed.
#[test]
fn a_truncate_a_reader_blocks_writes_no_full_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app, meta, mut db) = past_truncate_page_n(dir.path());
    // A reader of the application on a snapshot in the WAL.
    let reader = Connection::open(&path).unwrap();
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM t;")
        .unwrap();
    let p = path.clone();
    db.hooks.before_truncate = Some(Box::new(move || {
        let c = Connection::open(&p).unwrap();
        c.execute("INSERT INTO u VALUES ('around the truncate')", [])
            .unwrap();
    }));
    let stats = db.stats();
    let fulls = stats.full_segments.load(Ordering::Relaxed);
    db.sync(true).unwrap();
    assert!(
        std::fs::metadata(dir.path().join("app.db-wal"))
            .unwrap()
            .len()
            > 0,
        "the reader kept the WAL"
    );
    let counted = |s: &DbStats| {
        (
            s.full_segments.load(Ordering::Relaxed),
            s.truncate_checkpoints.load(Ordering::Relaxed),
            s.truncate_blocked.load(Ordering::Relaxed),
        )
    };
    assert_eq!(
        counted(&stats),
        (fulls, 0, 1),
        "no full segment, no TRUNCATE counted"
    );
    // The next ticks, the reader still there: no new TRUNCATE try within the retry interval
    // (the PASSIVE checkpoints between do not end the streak: the WAL was not reset).
    for i in 0..3 {
        app.execute("INSERT INTO t VALUES (?1)", [format!("after-{i}")])
            .unwrap();
        db.sync(true).unwrap();
    }
    app.execute("INSERT INTO t VALUES ('after')", []).unwrap();
    db.sync(true).unwrap();
    assert_eq!(counted(&stats), (fulls, 0, 1));
    assert!(db.truncate_blocked.is_some(), "the streak goes on");
    reader.execute_batch("COMMIT").unwrap();
    db.sync(false).unwrap();
    let out = dir.path().join("restored.db");
    restore_staged(&meta, &out);
    let want = rows(&path);
    assert!(
        want.contains(&"u:around the truncate".to_string()),
        "{want:?}"
    );
    assert!(want.contains(&"after".to_string()), "{want:?}");
    assert_eq!(rows(&out), want);
}

/// The blocked TRUNCATE's worst case: the reader begins after a commit that lands around the
/// TRUNCATE, so the TRUNCATE copies every frame into the database file and only cannot reset
/// the WAL; our read then sits on SQLite's read mark 0, and once the reader ends, the next
/// write restarts the WAL over that commit. It must be in a segment before that: sealed under
/// the write lock right after the TRUNCATE. (Going on from the mark lost it.)
#[test]
fn a_commit_around_a_blocked_truncate_survives_the_next_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app, meta, mut db) = past_truncate_page_n(dir.path());
    let reader: Arc<std::sync::Mutex<Option<Connection>>> = Arc::default();
    let (p, r) = (path.clone(), reader.clone());
    db.hooks.before_truncate = Some(Box::new(move || {
        let c = Connection::open(&p).unwrap();
        c.execute("INSERT INTO u VALUES ('around the truncate')", [])
            .unwrap();
        let rd = Connection::open(&p).unwrap();
        rd.execute_batch("BEGIN; SELECT count(*) FROM u;").unwrap();
        *r.lock().unwrap() = Some(rd);
    }));
    let stats = db.stats();
    let fulls = stats.full_segments.load(Ordering::Relaxed);
    let from_scratch = db.hooks.startup_syncs;
    db.sync(true).unwrap();
    assert_eq!(stats.truncate_blocked.load(Ordering::Relaxed), 1);
    assert_eq!(stats.full_segments.load(Ordering::Relaxed), fulls);
    // The seal under the lock went on from the mark: no read of the whole database there.
    assert_eq!(db.hooks.startup_syncs, from_scratch);
    // The reader ends; the next write restarts the WAL (everything is in the database file).
    drop(reader.lock().unwrap().take());
    app.execute("INSERT INTO t VALUES ('after')", []).unwrap();
    db.sync(false).unwrap();
    let out = dir.path().join("restored.db");
    restore_staged(&meta, &out);
    let want = rows(&path);
    assert!(
        want.contains(&"u:around the truncate".to_string()),
        "{want:?}"
    );
    assert_eq!(rows(&out), want);
}

/// A full segment a replica asked for at the start (here as when it switched age encryption
/// on) is still written when the first attempt fails: the reason was taken before the write,
/// and the retry went on incrementally, so the new chain did not start with a full copy.
#[test]
fn a_full_segment_asked_for_at_the_start_survives_a_failed_write() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    let mut db = synced_db(dir.path(), &path);
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    // As a start with that replica leaves it: the first sync decides, the reason forces.
    db.continuous = false;
    db.remote_tip.full_reason = Some("replica switched to age encryption");
    // The full segment's temporary file cannot be created: a directory is in its place.
    let tmp = dir
        .path()
        .join("meta/ltx/0/0000000000000002-0000000000000002.ltx.tmp");
    std::fs::create_dir(&tmp).unwrap();
    let e = db
        .sync(false)
        .expect_err("the full segment cannot be staged");
    assert!(e.to_string().contains(".ltx.tmp"), "{e}");
    std::fs::remove_dir(&tmp).unwrap();
    let full = db.stats().full_segments.load(Ordering::Relaxed);
    db.sync(false).unwrap();
    assert_eq!(
        db.stats().full_segments.load(Ordering::Relaxed),
        full + 1,
        "the new chain starts with a full segment"
    );
}

/// A commit that lands after a sync's scan and before the stamps its database goes dormant
/// with is in those stamps, and only a later change wakes a dormant database: it must stay
/// awake. The WAL's mtime settled alone let it sleep when the sync ran longer than the margin,
/// and the commit waited for the next one, the database reported protected meanwhile.
#[test]
fn a_commit_during_the_sync_that_would_go_dormant_keeps_it_awake() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _app) = wal_app(dir.path());
    let mut db = Db::new(
        path.clone(),
        Some(dir.path().join("meta")),
        DbSettings {
            dormant_after: Duration::from_millis(1),
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    db.sync(false).unwrap();
    db.sync(false).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let p = path.clone();
    db.hooks.before_dormant_stamps = Some(Box::new(move || {
        let c = Connection::open(&p).unwrap();
        c.execute("INSERT INTO t VALUES ('late')", []).unwrap();
        // Older than the margin by the time the stamps are taken.
        std::thread::sleep(super::dormancy::STAMP_MARGIN * 2);
    }));
    assert_eq!(db.sync(false).unwrap(), 0);
    assert!(!db.stats().dormant.load(Ordering::Relaxed), "went dormant");
    assert!(
        !db.unchanged_since_sync(),
        "the next tick would skip the commit"
    );
    db.hooks.before_dormant_stamps = None;
    assert_eq!(db.sync(false).unwrap(), 1, "the commit is shipped");
}
