//! A WAL file deleted under a running application, with the real binary, real SQLite files
//! and real processes holding SQLite's locks: replicad reports the database as not protected,
//! closes its own connection so that the application's last one can save the lost commits,
//! and resumes with a full copy once no process can still use the lost file, including one it
//! cannot inspect (see `src/replicate/db/lost_wal.rs`).

use crate::common;
use crate::never_unprotected::{
    add_database, caught_up, config, entry, get, get_status_ok, insert, new_db, restored_equals,
    wait_caught_up,
};

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::http::{free_port, sample};
use common::*;
use rusqlite::Connection;

/// An application with 30 rows in `app.db` and a daemon replicating it to `a`, started with
/// `extra` in its config: (database, replica, the application's connection, port, daemon).
fn app_and_daemon(dir: &TestDir, extra: &str) -> (PathBuf, PathBuf, Connection, u16, Daemon) {
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 30, "before");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(dir, &db, &[&a], port, extra))],
    );
    (db, a, c, port, d)
}

/// A cleanup script deletes the WAL while the application runs; the application's
/// connection commits 20 rows more into the deleted file, which no new connection can read.
/// Returns once `/readyz` names the lost WAL.
fn lose_the_wal(dir: &TestDir, db: &Path, c: &Connection, port: u16) {
    fs::remove_file(format!("{}-wal", db.display())).unwrap();
    insert(c, 20, "after");
    wait_until(dir, "/readyz to name the lost WAL", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("was deleted while the database was open")
    });
}

/// A process (`python3`, which `.ci/run` installs) holding POSIX read locks as a SQLite
/// connection does, without SQLite: on the SHARED bytes of `db`, and with `shm` also on the
/// dead-man switch of its `-shm`. Returns once they are held.
fn lock_holder(db: &Path, shm: bool) -> std::process::Child {
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import fcntl, os, sys, time\n\
             db = os.open(sys.argv[1], os.O_RDONLY)\n\
             fcntl.lockf(db, fcntl.LOCK_SH, 510, 0x40000002)\n\
             if sys.argv[2] == 'shm':\n\
             \x20   shm = os.open(sys.argv[1] + '-shm', os.O_RDONLY)\n\
             \x20   fcntl.lockf(shm, fcntl.LOCK_SH, 1, 128)\n\
             print('locked', flush=True)\n\
             time.sleep(120)",
            s(db),
            if shm { "shm" } else { "db" },
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 6];
    holder
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut line)
        .unwrap();
    assert_eq!(&line, b"locked");
    holder
}

/// Waits for three more ticks of `db` that each found the lost WAL unsettled (counted as
/// failed syncs), then checks that `/readyz` still names it.
fn still_closed_three_ticks_later(dir: &TestDir, port: u16, db: &Path) {
    let errors = || {
        let v: serde_json::Value = serde_json::from_str(&get(port, "/status").1).unwrap();
        entry(&v, db)["sync_errors"].as_u64().unwrap_or(0)
    };
    let after = errors();
    wait_until(dir, "three more ticks with the lost WAL unsettled", || {
        errors() >= after + 3
    });
    let (code, body) = get(port, "/readyz");
    assert!(
        code == 503 && body.contains("was deleted while the database was open"),
        "{code} {body}"
    );
}

fn rows(db: &Path) -> i64 {
    Connection::open(db)
        .unwrap()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_wal_deleted_under_the_application_is_reported_until_its_last_connection_closes() {
    let dir = TestDir::new("wal-deleted");
    let (db, a, c, port, d) = app_and_daemon(&dir, "");
    wait_caught_up(&dir, port, &a);
    let before = max_replica_txid(&a);
    lose_the_wal(&dir, &db, &c, port);
    let (_, status) = get(port, "/status");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["databases"][0]["protected"], false, "{status}");
    let (_, metrics) = get(port, "/metrics");
    let label = format!("db=\"{}\"", db.display());
    assert_eq!(
        sample(&metrics, "replicad_db_protected", &label),
        Some(0.0),
        "{metrics}"
    );
    // Nothing was cut from a WAL that lacks the application's frames.
    assert_eq!(max_replica_txid(&a), before);
    // The application closes: its last connection, no longer held back by ours, checkpoints
    // the lost WAL into the database file, and replication resumes with a full copy.
    drop(c);
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    assert_eq!(
        rows(&db),
        50,
        "the commits made after the deletion are kept"
    );
    restored_equals(&dir, &a, &db, "restored.db");
}

/// The lost WAL's commits cannot be copied into the database when another process keeps
/// the application's last connection from doing so on close (here a plain POSIX read lock on
/// SQLite's SHARED bytes). Once no process has the lost file open, replication resumes with
/// a full copy of what the database holds, although that process still holds its lock (found
/// by `/proc`), and the log says which TXID the replica holds the lost commits up to.
#[test]
fn replication_resumes_once_no_process_has_the_lost_wal_open() {
    let dir = TestDir::new("wal-deleted-held");
    let (db, a, c, port, d) = app_and_daemon(&dir, "");
    // The rows are in the database file, not only in the WAL.
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    let mut holder = lock_holder(&db, false);
    lose_the_wal(&dir, &db, &c, port);
    // The application closes, but the lock keeps its close from copying the lost WAL in.
    drop(c);
    wait_caught_up(&dir, port, &a);
    assert!(
        holder.try_wait().unwrap().is_none(),
        "resumed while the lock is still held"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let log = d.log.clone();
    d.stop_ok();
    let text = fs::read_to_string(log).unwrap();
    assert!(text.contains("replicad restore --txid"), "{text}");
    assert_eq!(rows(&db), 30, "the commits only in the lost WAL are gone");
    restored_equals(&dir, &a, &db, "restored.db");
}

/// The daemon in a PID namespace of its own, as a sidecar without a shared one runs: the
/// kernel lists in `/proc/locks` only the locks of that namespace, so the process outside that
/// holds SQLite's SHARED bytes (found by `F_GETLK`, with no pid) cannot be inspected. It may
/// have the lost file open, so the database stays not protected while it holds its lock, and
/// replication resumes once it lets go.
#[test]
fn a_lock_holder_out_of_sight_keeps_the_database_closed() {
    if !can_unshare_pid() {
        return;
    }
    let dir = TestDir::new("wal-deleted-unseen");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 30, "before");
    // A second database keeps locks of the daemon's own in its namespace's `/proc/locks`.
    let other = dir.join("other.db");
    insert(&new_db(&other), 1, "other");
    let port = free_port();
    let cfg = config(&dir, &db, &[&a], port, "");
    add_database(&cfg, &other, &dir.join("b"));
    let d = spawn_replicate_unshared(dir.path(), &["--config", s(&cfg)]);
    wait_until(&dir, "the daemon to answer", || get_status_ok(port));
    caught_up(&dir, port, &db, &a, 0);
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    let mut holder = lock_holder(&db, false);
    lose_the_wal(&dir, &db, &c, port);
    drop(c);
    still_closed_three_ticks_later(&dir, port, &db);
    holder.kill().unwrap();
    holder.wait().unwrap();
    caught_up(&dir, port, &db, &a, 0);
    let text = stop_unshared_ok(d);
    assert!(text.contains("replicad restore --txid"), "{text}");
    assert_eq!(rows(&db), 30, "the commits only in the lost WAL are gone");
    restored_equals(&dir, &a, &db, "restored.db");
}

/// A process that opened the database after the loss keeps the application's `-shm` in use,
/// whose index still points at frames only the lost WAL held (here a bare POSIX lock on its
/// dead-man switch and on SQLite's SHARED bytes, as a connection holds them). It never had
/// the lost file open, yet opening the database then would copy it without those frames: it
/// stays not protected until that process lets go.
#[test]
fn an_index_that_points_into_the_lost_wal_keeps_the_database_closed() {
    let dir = TestDir::new("wal-deleted-index");
    let (db, a, c, port, d) = app_and_daemon(&dir, "");
    wait_caught_up(&dir, port, &a);
    // The rows are in the database file, not only in the WAL.
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    lose_the_wal(&dir, &db, &c, port);
    let mut holder = lock_holder(&db, true);
    // The application closes; the lock keeps its close from copying the lost WAL in, and no
    // process has the lost file open any more.
    drop(c);
    still_closed_three_ticks_later(&dir, port, &db);
    holder.kill().unwrap();
    holder.wait().unwrap();
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    assert_eq!(rows(&db), 30, "the commits only in the lost WAL are gone");
    restored_equals(&dir, &a, &db, "restored.db");
}

/// A WAL deleted while replicad slept on the database (dormant: its connection closed) is
/// found before it opens again: another process uses the `-shm`, whose index holds frames,
/// and no WAL is at the path. Opening then would copy a database without those frames.
#[test]
fn a_wal_deleted_while_the_database_is_dormant_is_found_before_it_opens() {
    let dir = TestDir::new("wal-deleted-dormant");
    let (db, a, c, port, d) = app_and_daemon(&dir, "dormant-after: 200ms\n");
    wait_caught_up(&dir, port, &a);
    let label = format!("db=\"{}\"", db.display());
    wait_until(&dir, "the database to go dormant", || {
        sample(&get(port, "/metrics").1, "replicad_db_dormant", &label) == Some(1.0)
    });
    let before = max_replica_txid(&a);
    lose_the_wal(&dir, &db, &c, port);
    assert_eq!(
        max_replica_txid(&a),
        before,
        "nothing copied without the lost frames"
    );
    drop(c);
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    assert_eq!(rows(&db), 50);
    restored_equals(&dir, &a, &db, "restored.db");
}
