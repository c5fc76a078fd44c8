//! Commit detection by inotify (`src/replicate/walwatch.rs`): with a monitor interval of an
//! hour, a commit can only reach the replica through the event path; with the watches capped
//! (as a full `fs.inotify.max_user_watches` would), the database beyond the cap is polled,
//! the log says so once and `replicad_db_commit_watched` tells which database polls.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::http::{free_port, get, make_db, sample};
use crate::common::{self, Daemon, TestDir};

fn start(dir: &Path, yml: &str, env: &[(&str, &str)]) -> Daemon {
    let config = dir.join("replicad.yml");
    std::fs::write(&config, yml).unwrap();
    let log = dir.join("replicad.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(common::bin())
        .args(["replicate", "--config", common::s(&config)])
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn replicad");
    Daemon { child, log }
}

fn entry(db: &Path, replica: &Path) -> String {
    format!(
        "  - path: {}\n    replica:\n      url: {}\n",
        db.display(),
        replica.display()
    )
}

/// Stops the daemon cleanly and checks the replica restores to the source.
fn stop_and_restore(d: Daemon, dir: &TestDir, db: &Path, replica: &Path, ctx: &str) {
    d.stop_ok();
    let out = dir.join("restored.db");
    common::restore_ok(common::s(replica), &out, None);
    common::assert_same_content(db, &out, ctx);
}

async fn watched(port: u16, db: &Path) -> Option<f64> {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let metrics = get(addr, "/metrics").await.1;
    sample(
        &metrics,
        "replicad_db_commit_watched",
        &format!("db=\"{}\"", db.display()),
    )
}

/// Two databases, `a/app.db` and `b/app.db`, replicated to `ra` and `rb` by one daemon whose
/// inotify watches are capped at one directory (as a full `fs.inotify.max_user_watches`
/// would), so one database is watched and the other polled; `settings` go before `dbs:`.
struct OneWatched {
    a: PathBuf,
    b: PathBuf,
    ra: PathBuf,
    rb: PathBuf,
    ca: rusqlite::Connection,
    cb: rusqlite::Connection,
    port: u16,
    d: Daemon,
}

/// Starts [`OneWatched`] and waits for both initial snapshots.
fn one_watched(dir: &TestDir, settings: &str) -> OneWatched {
    let (a, b) = (dir.join("a/app.db"), dir.join("b/app.db"));
    for sub in ["a", "b"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let (ca, cb) = (make_db(&a), make_db(&b));
    let (ra, rb) = (dir.join("ra"), dir.join("rb"));
    let port = free_port();
    let yml = format!(
        "addr: \"127.0.0.1:{port}\"\n{settings}dbs:\n{}{}",
        entry(&a, &ra),
        entry(&b, &rb)
    );
    let d = start(
        dir.path(),
        &yml,
        &[(replicad::replicate::walwatch::MAX_WATCHES_ENV, "1")],
    );
    for r in [&ra, &rb] {
        assert!(
            common::wait_for_txid(r, 1, Duration::from_secs(30)),
            "{}",
            d.log_text()
        );
    }
    OneWatched {
        a,
        b,
        ra,
        rb,
        ca,
        cb,
        port,
        d,
    }
}

impl OneWatched {
    /// `replicad_db_commit_watched` says one database is watched and the other polled.
    async fn assert_one_polled(&self) {
        let mut flags = [
            watched(self.port, &self.a).await,
            watched(self.port, &self.b).await,
        ];
        flags.sort_by(|x, y| x.partial_cmp(y).unwrap());
        assert_eq!(flags, [Some(0.0), Some(1.0)], "one watched, one polled");
    }
}

/// Monitor interval 1h: after the initial snapshot (the first tick runs at once), only a WAL
/// event can start a sync, so each commit reaching the replica went through inotify. The
/// restore equals the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_ships_without_waiting_for_a_tick() {
    let dir = TestDir::new("commit-watch");
    let db = dir.join("app.db");
    let conn = make_db(&db);
    let replica = dir.join("replica");
    let port = free_port();
    let yml = format!(
        "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 1h\nmin-sync-interval: 0s\n\
         checkpoint-interval: 0s\ndbs:\n{}",
        entry(&db, &replica)
    );
    let d = start(dir.path(), &yml, &[]);
    assert!(
        common::wait_for_txid(&replica, 1, Duration::from_secs(30)),
        "initial snapshot: {}",
        d.log_text()
    );
    for i in 2..=4u64 {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [format!("row {i}")])
            .unwrap();
        assert!(
            common::wait_for_txid(&replica, i, Duration::from_secs(30)),
            "commit {i} never shipped with a 1h monitor interval: {}",
            d.log_text()
        );
    }
    assert_eq!(watched(port, &db).await, Some(1.0));
    stop_and_restore(d, &dir, &db, &replica, "restored after event-driven syncs");
}

/// `min-sync-interval: 1s`, monitor interval 1h: a commit right after one that shipped is held
/// back until the interval has passed, then ships (the event is not lost while it waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_held_back_by_min_sync_interval_still_ships() {
    let dir = TestDir::new("commit-min-sync");
    let db = dir.join("app.db");
    let conn = make_db(&db);
    let replica = dir.join("replica");
    let yml = format!(
        "monitor-interval: 1h\nmin-sync-interval: 1s\ncheckpoint-interval: 0s\ndbs:\n{}",
        entry(&db, &replica)
    );
    let d = start(dir.path(), &yml, &[]);
    assert!(common::wait_for_txid(&replica, 1, Duration::from_secs(30)));
    conn.execute("INSERT INTO t(v) VALUES ('first')", [])
        .unwrap();
    assert!(common::wait_for_txid(&replica, 2, Duration::from_secs(30)));
    // Right after a shipping sync: this one waits for the rest of the second.
    conn.execute("INSERT INTO t(v) VALUES ('second')", [])
        .unwrap();
    assert!(
        common::wait_for_txid(&replica, 3, Duration::from_secs(30)),
        "the held-back commit never shipped: {}",
        d.log_text()
    );
    stop_and_restore(d, &dir, &db, &replica, "restored after a held-back commit");
}

/// Watches capped at one directory: the second database polls (monitor interval 1s), its
/// commits still ship, the log says why once, and the metric shows which database polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_watch_commits_are_polled() {
    let dir = TestDir::new("commit-poll");
    let t = one_watched(&dir, "monitor-interval: 1s\n");
    for c in [&t.ca, &t.cb] {
        c.execute("INSERT INTO t(v) VALUES ('more')", []).unwrap();
    }
    for r in [&t.ra, &t.rb] {
        assert!(
            common::wait_for_txid(r, 2, Duration::from_secs(30)),
            "{}: {}",
            r.display(),
            t.d.log_text()
        );
    }
    t.assert_one_polled().await;
    let log = t.d.log_text();
    assert_eq!(
        log.matches("found by polling every monitor-interval")
            .count(),
        1,
        "said once: {log}"
    );
    t.d.stop_ok();
}

/// `min-sync-interval: 2s` with a 100 ms monitor interval, beside a writer committing every
/// 20 ms: the poll ticks keep to the interval as the event ticks do, so a busy database ships
/// about one file per 2 s (a poll that shipped at every tick made about 20), whether its
/// commits are seen by inotify (`a`) or only by polling (`b`, past the watch cap). Every
/// commit still reaches the replica while the daemon runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_database_ships_at_most_once_per_min_sync_interval() {
    let dir = TestDir::new("commit-busy-min-sync");
    let t = one_watched(
        &dir,
        "monitor-interval: 100ms\nmin-sync-interval: 2s\ncheckpoint-interval: 0s\n",
    );
    t.assert_one_polled().await;
    let OneWatched {
        a, b, ra, rb, d, ..
    } = t;
    let began = std::time::Instant::now();
    let writers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|db| {
            std::thread::spawn(move || {
                let conn = rusqlite::Connection::open(&db).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                for i in 0..250 {
                    conn.execute("INSERT INTO t(v) VALUES (?1)", [format!("busy {i}")])
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for (db, r) in [(&a, &ra), (&b, &rb)] {
        common::wait_restores(&dir, db, "the busy database's replica", |out| {
            common::restore(common::s(r), out, None).status.success()
        });
    }
    let elapsed = began.elapsed().as_secs_f64();
    // The syncs that shipped the writer's commits: one level-0 file each after the snapshot.
    let bound = (elapsed / 2.0).ceil() as usize + 2;
    for r in [&ra, &rb] {
        let shipped = common::l0_ranges(r)
            .iter()
            .filter(|(min, _)| *min > 1)
            .count();
        assert!(
            (1..=bound).contains(&shipped),
            "{}: {shipped} files in {elapsed:.1} s with min-sync-interval 2s (at most {bound}): {}",
            r.display(),
            d.log_text()
        );
    }
    d.stop_ok();
}

/// `min-sync-interval: 1h` with `truncate-page-n: 400`: a small commit waits for the interval,
/// but a transaction that takes the WAL past a quarter of `truncate-page-n` ships at the next
/// poll, so that the checkpoint after it keeps the WAL bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_nearing_truncate_page_n_ships_before_min_sync_interval() {
    let dir = TestDir::new("commit-wal-urgent");
    let db = dir.join("app.db");
    let conn = make_db(&db);
    let replica = dir.join("replica");
    let port = free_port();
    let yml = format!(
        "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 100ms\nmin-sync-interval: 1h\n\
         checkpoint-interval: 0s\nmin-checkpoint-page-count: 100\ntruncate-page-n: 400\n\
         dbs:\n{}",
        entry(&db, &replica)
    );
    let d = start(dir.path(), &yml, &[]);
    assert!(common::wait_for_txid(&replica, 1, Duration::from_secs(30)));
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let held = || async {
        let metrics = get(addr, "/metrics").await.1;
        let label = format!("db=\"{}\"", db.display());
        let metric = sample(&metrics, "replicad_db_held_seconds", &label);
        let status: serde_json::Value =
            serde_json::from_str(&get(addr, "/status").await.1).unwrap();
        let shown = status["databases"][0]["held_seconds"].as_f64();
        (metric.unwrap_or(-1.0), shown.unwrap_or(-1.0))
    };
    assert_eq!(held().await, (0.0, 0.0), "nothing waits yet");
    conn.execute("INSERT INTO t(v) VALUES ('small')", [])
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        common::max_replica_txid(&replica),
        1,
        "a small commit shipped before min-sync-interval: {}",
        d.log_text()
    );
    // Not replica lag yet, but shown: it has waited about 2 s.
    let (metric, shown) = held().await;
    assert!(
        (1.5..30.0).contains(&metric) && (1.5..30.0).contains(&shown),
        "held_seconds: metric {metric}, /status {shown}"
    );
    conn.execute_batch(
        "BEGIN; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
         INSERT INTO t(v) SELECT hex(randomblob(2000)) FROM n; COMMIT;",
    )
    .unwrap();
    assert!(
        common::wait_for_txid(&replica, 2, Duration::from_secs(30)),
        "a WAL past a quarter of truncate-page-n waited for min-sync-interval: {}",
        d.log_text()
    );
    // The monitor clears it once back from the sync, which may be just after the upload.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while held().await != (0.0, 0.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the urgent sync shipped what waited, but held_seconds stayed at {:?}",
            held().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_and_restore(d, &dir, &db, &replica, "restored after an urgent sync");
}
