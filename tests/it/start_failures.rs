//! Databases and replicas that cannot start are loud, through the real binary: a missing
//! database is not ready until it exists, a missing directory is a config error, a file that
//! is not a database and a replica that cannot be written fail the start and name themselves,
//! a failed start hands back its leases, and a start that hangs holds up only its database.

use crate::common;
use crate::never_unprotected::{
    NfsPair, caught_up, config, get, get_status_ok, insert, new_db, restored_equals, wait_caught_up,
};

use std::fs;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::http::free_port;
use common::*;
use rusqlite::Connection;

#[test]
fn a_missing_database_is_not_ready_until_it_is_created() {
    let dir = TestDir::new("missing");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_until(&dir, "/readyz to name the missing database", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("does not exist")
    });
    let c = new_db(&db);
    insert(&c, 10, "created");
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    restored_equals(&dir, &a, &db, "created.db");
}

#[test]
fn a_database_in_a_missing_directory_is_a_config_error() {
    let dir = TestDir::new("missing-dir");
    let db = dir.join("no/such/dir/app.db");
    let o = Command::new(bin())
        .args(["replicate", s(&db), s(&dir.join("a"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!dir.join("no").exists(), "nothing is created for a typo");
}

/// A replica setting only its client can refuse (an Azure account key that is not base64) is
/// a config error, exit 2, also when the database's file system hangs (the gate holds the
/// start's first file access): the client was made after the claim, so the start went to the
/// background after 10 s and the daemon ran on with the database unprotected.
#[test]
fn a_replica_the_client_refuses_is_a_config_error_even_on_a_hung_file_system() {
    let dir = TestDir::new("client-config");
    let db = dir.join("app.db");
    new_db(&db);
    let gate = dir.join("gate");
    fs::write(&gate, b"").unwrap();
    let cfg = dir.join("replicad.yml");
    fs::write(
        &cfg,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      url: abs://acct@container/app\n      \
             account-key: \"!!! not base64 !!!\"\n",
            db.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin())
        .args(["replicate", "-c", s(&cfg)])
        .env("REPLICAD_TEST_SYNC_GATE", &gate)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            break None;
        }
        sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("account_key"), "{err}");
}

#[test]
fn a_file_that_is_not_a_database_fails_loudly_and_shutdown_says_so() {
    let dir = TestDir::new("not-sqlite");
    let db = dir.join("app.db");
    fs::write(
        &db,
        b"this is not a database, just text that is long enough to be read",
    )
    .unwrap();
    let a = dir.join("a");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_until(&dir, "/readyz to report the failing database", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("not protected")
    });
    let log = d.log.clone();
    let st = d.stop();
    let text = fs::read_to_string(log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
    assert!(text.contains("not fully protected"), "{text}");
    assert!(!text.contains("every segment uploaded"), "{text}");
}

#[test]
fn a_replica_that_cannot_be_written_is_named_and_shutdown_fails() {
    let dir = TestDir::new("replica-stuck");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 5, "x");
    let port = free_port();
    let cfg = config(&dir, &db, &[&a], port, "shutdown-sync-timeout: 2s\n");
    let d = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    wait_caught_up(&dir, port, &a);
    let next = max_replica_txid(&a) + 1;
    let obstacle = a.join("ltx/0").join(format!("{next:016x}-{next:016x}.ltx"));
    fs::create_dir(&obstacle).unwrap();
    fs::write(obstacle.join("keep"), b"x").unwrap();
    insert(&c, 5, "y");
    wait_until(&dir, "/readyz to name the replica", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("replica r0") && body.contains("not written")
    });
    let log = d.log.clone();
    let st = d.stop();
    let text = fs::read_to_string(log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
    assert!(text.contains("replica r0: holds TXID"), "{text}");
    // Cause removed: the next run catches up.
    fs::remove_dir_all(&obstacle).unwrap();
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    restored_equals(&dir, &a, &db, "caught-up.db");
}

#[test]
fn a_failed_start_hands_back_its_leases() {
    let dir = TestDir::new("failed-start");
    let ok_db = dir.join("ok.db");
    let bad_db = dir.join("bad.db");
    insert(&new_db(&ok_db), 3, "ok");
    insert(&new_db(&bad_db), 3, "bad");
    // The bad database's staging cannot be created: a file where its directory goes.
    fs::create_dir_all(dir.join(".bad.db-replicad")).unwrap();
    fs::write(dir.join(".bad.db-replicad/ltx"), b"in the way").unwrap();
    let (ra, rb) = (dir.join("ra"), dir.join("rb"));
    let cfg = dir.join("two.yml");
    fs::write(
        &cfg,
        format!(
            "monitor-interval: 50ms\ndbs:\n  - path: {}\n    replica:\n      url: {}\n  - path: {}\n    replica:\n      url: {}\n",
            ok_db.display(),
            ra.display(),
            bad_db.display(),
            rb.display()
        ),
    )
    .unwrap();
    let o = Command::new(bin())
        .args(["replicate", "--config", s(&cfg)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("open staging"), "{err}");
    for r in [&ra, &rb] {
        assert!(
            !r.join("replicad.lease").exists(),
            "a lease was left behind: {}",
            listing(r)
        );
    }
    // Fixed, the next start goes ahead at once.
    fs::remove_file(dir.join(".bad.db-replicad/ltx")).unwrap();
    let d = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    let deadline = Instant::now() + WAIT;
    while max_replica_txid(&rb) == 0 || max_replica_txid(&ra) == 0 {
        assert!(Instant::now() < deadline, "{}", dir.logs());
        sleep(Duration::from_millis(25));
    }
    d.stop_ok();
    restored_equals(&dir, &rb, &bad_db, "bad-restored.db");
}

/// A database whose file system hangs when replicad starts (a hard NFS mount whose server is
/// down after a reboot; stood in for by `REPLICAD_TEST_SYNC_GATE`, which holds its start's
/// first file access): after 10 s the daemon goes on without it, serves its endpoints,
/// replicates the other database, and reports this one not protected in `/readyz` and the log
/// until the mount answers; then it starts and catches up.
#[test]
fn a_start_that_hangs_holds_up_only_its_own_database() {
    let t = NfsPair::new("hung-start");
    let d = spawn_gated(&t);
    let (dir, port) = (&t.dir, t.port);
    wait_until(dir, "the daemon to answer", || get_status_ok(port));
    let txid = caught_up(dir, port, &t.other, &t.b, 0);
    assert_start_reported_hung(port, &t.db, &d);
    insert(&Connection::open(&t.other).unwrap(), 10, "meanwhile");
    caught_up(dir, port, &t.other, &t.b, txid);
    let log = d.log.clone();
    t.release_and_restore(d);
    let text = fs::read_to_string(log).unwrap();
    assert!(text.contains("started after all"), "{text}");
}

/// A stop while a database's start still hangs ends at once and says that database was not
/// protected (exit 1); the next start, with the mount answering again, replicates it.
#[test]
fn a_stop_while_a_start_hangs_says_so() {
    let t = NfsPair::new("hung-start-stop");
    let d = spawn_gated(&t);
    wait_until(&t.dir, "the daemon to answer", || get_status_ok(t.port));
    assert_start_reported_hung(t.port, &t.db, &d);
    let log = d.log.clone();
    let st = d.stop();
    let text = fs::read_to_string(log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
    assert!(text.contains("its start has run for"), "{text}");

    // The gate stays until the next start is under way: `release_and_restore` opens it.
    let d = spawn_gated(&t);
    t.release_and_restore(d);
}

/// `/readyz`, the metrics and the log report the start of `db` as hung.
fn assert_start_reported_hung(port: u16, db: &std::path::Path, d: &Daemon) {
    let (code, body) = get(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(s(db)) && body.contains("its start has run for"),
        "{body}"
    );
    let metrics = get(port, "/metrics").1;
    let label = format!("db=\"{}\"", db.display());
    assert_eq!(
        common::http::sample(&metrics, "replicad_db_protected", &label),
        Some(0.0),
        "{metrics}"
    );
    let log = d.log_text();
    assert!(log.contains("NOT protected until it starts"), "{log}");
}

/// Closes `t`'s gate and starts the daemon: the start of `t.db` hangs until it opens.
fn spawn_gated(t: &NfsPair) -> Daemon {
    fs::write(&t.gate, b"").unwrap();
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&t.gate))];
    spawn_replicate_env(t.dir.path(), &["--config", s(&t.cfg)], &env)
}
