//! An application that commits back to back, with no pause between its transactions, beside
//! the daemon: restores stay exact, checkpoints keep the WAL bounded without a TRUNCATE, and
//! our checkpoint's read mark keeps the application from restarting the WAL under us.

use super::*;

fn create_wal_table(db: &Path, create: &str) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.execute_batch(&format!("PRAGMA journal_mode=WAL; {create};"))
        .unwrap();
}

/// An application thread that commits `body` in `BEGIN IMMEDIATE` transactions back to back.
struct BackToBack {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<u64>,
}

impl BackToBack {
    /// `spin`: retry a busy lock at once, as a busy application would, rather than with
    /// SQLite's handler, which sleeps 1-100 ms between tries.
    fn start(db: &Path, body: &'static str, spin: bool) -> BackToBack {
        Self::paced(db, body, spin, Duration::ZERO)
    }

    /// As [`BackToBack::start`], with `pause` between a commit and the next `BEGIN`.
    fn paced(db: &Path, body: &'static str, spin: bool, pause: Duration) -> BackToBack {
        let stop = Arc::new(AtomicBool::new(false));
        let (path, stopped) = (db.to_path_buf(), stop.clone());
        let thread = thread::spawn(move || {
            let mut c = rusqlite::Connection::open(&path).unwrap();
            if spin {
                c.busy_handler(Some(|n| {
                    thread::yield_now();
                    n < 10_000_000
                }))
                .unwrap();
            } else {
                c.busy_timeout(Duration::from_secs(30)).unwrap();
            }
            let tx = format!("BEGIN IMMEDIATE; {body} COMMIT;");
            let mut commits = 0u64;
            while !stopped.load(Ordering::Relaxed) {
                c.execute_batch(&tx).unwrap();
                commits += 1;
                if !pause.is_zero() {
                    thread::sleep(pause);
                }
            }
            commits
        });
        BackToBack { stop, thread }
    }

    /// Stops the thread; returns its commits.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Checkpoints beside a writer that never pauses: the unlocked backfill passes and the
/// barrier must together move only frames already in segments, so the replica restores to
/// exactly the source after thousands of back-to-back commits. Each commit adds a row with
/// overflow pages that no later commit rewrites: a frame checkpointed before it was sealed
/// (and then overwritten by a WAL restart) leaves a hole in the restored database.
#[test]
fn back_to_back_commits_through_checkpoints_restore_exactly() {
    let t = Setup::new("hot-writer-restore");
    create_wal_table(
        &t.db,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, n INT)",
    );
    // Debug logs name every checkpoint. The barrier insists past 2,000 pages: polling, it
    // gets in while the writer is mid-stream, which is when an unsealed frame could be moved.
    let mut d = t.spawn(&[
        "--min-checkpoint-page-count",
        "64",
        "--truncate-page-n",
        "8000",
        "--log-level",
        "debug",
    ]);
    let writer = BackToBack::start(
        &t.db,
        "INSERT INTO t (v, n) VALUES (hex(randomblob(3000)), 0);
         UPDATE t SET n = n + 1 WHERE id = abs(random()) % ((SELECT max(id) FROM t) + 1);",
        true,
    );
    // At least 4 s; on a loaded machine, longer, until a checkpoint has restarted the WAL in
    // place under the writer (one CI run saw only a PASSIVE and a TRUNCATE in 4 s).
    let started = std::time::Instant::now();
    sleep(Duration::from_secs(4));
    while !t.dir.logs_all().contains("shrink=false") && started.elapsed() < Duration::from_secs(20)
    {
        sleep(Duration::from_millis(250));
    }
    let commits = writer.stop();
    // Under the busy writer the WAL is restarted in place (its blocks are not freed under
    // the write lock); once the writer is quiet, it shrinks back to our restart write's one
    // frame (32 + 24 + 4,096 bytes), so the idle fast path applies again.
    let wal = t.dir.join("db/app.db-wal");
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    let quiet = std::time::Instant::now();
    while wal_len() > 4152 && quiet.elapsed() < Duration::from_secs(15) {
        sleep(Duration::from_millis(100));
    }
    assert!(
        wal_len() <= 4152,
        "the WAL still holds {} bytes after the writer stopped:\n{}",
        wal_len(),
        t.dir.logs()
    );
    assert_running(&mut d, &t.dir);
    d.stop_ok();
    let n = assert_l0_contiguous(&t.replica);
    // Every line: the last 80 (`logs`) cover about a second of this debug log.
    let (logs, tail) = (t.dir.logs_all(), t.dir.logs());
    let in_place = logs.matches("shrink=false").count();
    let shrunk = logs.matches("shrink=true").count();
    assert!(
        in_place >= 1,
        "no restart in place under the busy writer:\n{tail}"
    );
    // A TRUNCATE (the barrier did not get in before truncate-page-n) also leaves it empty.
    let truncated = logs.matches("mode=\"TRUNCATE\"").count();
    assert!(shrunk + truncated >= 1, "the WAL was never shrunk:\n{tail}");
    let checkpoints = logs.matches("checkpoint db=").count();
    // A full segment after a TRUNCATE (the barrier did not get in for a while) recaptures
    // the whole database, and would hide an earlier loss; most runs have none.
    let full = logs.matches("writing a full segment").count();
    println!("{commits} commits in {n} TXIDs, {checkpoints} checkpoints, {full} full segments");
    assert!(commits >= 500, "the writer made only {commits} commits");
    assert!(checkpoints >= 2, "{checkpoints} checkpoints:\n{tail}");
    t.check_restore("after back-to-back commits");
}

/// An application that commits back to back, with no pause at all, frees SQLite's write lock
/// only for microseconds between transactions, and grows the WAL by more than
/// `truncate-page-n` during one checkpoint's unlocked passes. The checkpoint must judge the
/// WAL by its size after the passes: its barrier then insists (and gets in), so the WAL never
/// reaches the TRUNCATE threshold at the start of a checkpoint, whose TRUNCATE stalls the
/// application for seconds; and it stops the passes near that threshold, so the WAL stays
/// within a few times of it.
#[test]
fn checkpoints_keep_up_with_a_writer_committing_back_to_back() {
    use replicad::config::DbSettings;
    use replicad::replicate::db::{Db, RemoteTip};

    let t = Setup::new("hot-writer");
    create_wal_table(&t.db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
    let mut db = Db::new(
        t.db.clone(),
        Some(t.dir.join("meta")),
        DbSettings {
            min_checkpoint_page_count: 64,
            // Well under a second of this writer's WAL; 4,000 were too few for a debug
            // build beside the other tests (one TRUNCATE in a CI run, with a paced writer).
            truncate_page_n: 8000,
            dormant_after: Duration::ZERO,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    // Opened first: the writer's first second must not count as a checkpoint falling behind.
    db.sync(true).unwrap();
    let writer = BackToBack::start(
        &t.db,
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
         INSERT INTO t (v) SELECT hex(randomblob(100)) FROM n;",
        false,
    );
    let started = std::time::Instant::now();
    // Long enough for the WAL to pass `truncate_page_n` several times over had the
    // checkpoints not kept up (over 10,000 pages a second here).
    while started.elapsed() < Duration::from_secs(5) {
        db.sync(true).unwrap();
        sleep(Duration::from_millis(20));
    }
    let commits = writer.stop();
    // Only a TRUNCATE (asserted absent below) or a shrink once the writer is quiet (it never
    // is here) makes the file shorter: restarts reuse it in place, and the writer keeps
    // SQLite's default journal_size_limit. So its length is the WAL's peak.
    let wal = std::fs::metadata(t.dir.join("db/app.db-wal"))
        .unwrap()
        .len();
    let page: i64 = rusqlite::Connection::open(&t.db)
        .unwrap()
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    // A 32-byte WAL header, then frames of a 24-byte header and a page.
    let peak_frames = wal.saturating_sub(32) / (24 + page.unsigned_abs());
    let stats = db.stats();
    let (checkpoints, truncates) = (
        stats.checkpoints.load(Ordering::Relaxed),
        stats.truncate_checkpoints.load(Ordering::Relaxed),
    );
    let held = Duration::from_nanos(stats.write_lock_nanos.load(Ordering::Relaxed));
    println!(
        "{commits} commits, {checkpoints} checkpoints, {truncates} TRUNCATE, write lock {held:?}, WAL peak {peak_frames} frames"
    );
    assert!(
        !held.is_zero(),
        "the checkpoints' write-lock time is not counted"
    );
    // SQLite's default busy handler got in at most once a second, if at all; a polite
    // barrier (judged by the WAL before the passes) left 1-2 TRUNCATEs in 5 s.
    assert!(
        checkpoints >= 5 && truncates == 0,
        "{checkpoints} checkpoints ({truncates} TRUNCATE) in 5 s beside {commits} commits"
    );
    // 8,000-21,000 frames here; passes that went on past the threshold let it reach
    // 15,000-55,000 (over 32,000 in 4 of 6 runs: a weak guard of that, which the TRUNCATE
    // check above does not cover).
    assert!(
        peak_frames <= 32_000,
        "the WAL reached {peak_frames} frames (truncate-page-n 8,000)"
    );
}

/// Invariant 3 of `db`: replicad holds its read transaction across its own checkpoints, so
/// the application cannot checkpoint and restart the WAL behind it (which could overwrite
/// frames not yet in a segment). Seen from the application: a RESTART checkpoint right after
/// replicad's finds a reader in its way (SQLite answers busy). Without the read transaction
/// (checked by skipping the `begin_read` after the barrier), it restarts the WAL.
#[test]
fn after_our_checkpoint_the_application_cannot_restart_the_wal() {
    use replicad::config::DbSettings;
    use replicad::replicate::db::{Db, RemoteTip};

    let t = Setup::new("read-mark");
    create_wal_table(&t.db, "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
    let app = rusqlite::Connection::open(&t.db).unwrap();
    app.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    // Answer busy at once rather than wait for the reader.
    app.busy_timeout(Duration::ZERO).unwrap();
    let mut db = Db::new(
        t.db.clone(),
        Some(t.dir.join("meta")),
        DbSettings {
            min_checkpoint_page_count: 8,
            dormant_after: Duration::ZERO,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    db.sync(true).unwrap();
    for round in 0..3 {
        for i in 0..20 {
            app.execute(
                "INSERT INTO t (v) VALUES (?1)",
                [format!("{round}-{i}-{}", "x".repeat(900))],
            )
            .unwrap();
        }
        let before = db.stats().checkpoints.load(Ordering::Relaxed);
        db.sync(true).unwrap();
        assert!(
            db.stats().checkpoints.load(Ordering::Relaxed) > before,
            "round {round}: no checkpoint"
        );
        let (busy, log, done): (i64, i64, i64) = app
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(
            busy, 1,
            "round {round}: the application restarted the WAL past replicad's reader (log {log}, done {done})"
        );
    }
    db.sync(true).unwrap();
}
