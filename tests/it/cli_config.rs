//! Tests for config-driven commands go here: `restore --config DB_PATH [--replica NAME]`,
//! `databases --config`, `ltx`, and the second-signal abort of a shutdown drain.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_replicad")
}

fn golden(scenario: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/litestream-v0.5")
        .join(scenario)
}

fn final_sha(scenario: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(golden(scenario).join("expected.json")).unwrap()).unwrap();
    v["steps"].as_array().unwrap().last().unwrap()["restored_db_sha256"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn restore_with_config_picks_the_named_replica_and_defaults_to_the_db_path() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    common::copy_dir(&golden("basic-64k").join("replica"), &a);
    common::copy_dir(&golden("basic-4k").join("replica"), &b);
    let db = dir.path().join("app.db");
    let cfg = dir.path().join("replicad.yml");
    fs::write(
        &cfg,
        format!(
            "dbs:\n  - path: {}\n    replicas:\n      - name: first\n        path: {}\n      - name: second\n        url: file://{}\n",
            db.display(),
            a.display(),
            b.display()
        ),
    )
    .unwrap();
    let sha = |p: &Path| hex::encode(Sha256::digest(fs::read(p).unwrap()));

    let out = dir.path().join("second.db");
    let o = Command::new(bin())
        .args([
            "restore",
            "--config",
            cfg.to_str().unwrap(),
            "--replica",
            "second",
            "--to",
            out.to_str().unwrap(),
            db.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(sha(&out), final_sha("basic-4k"));

    // Without --to the database path itself is restored, from the first replica.
    let o = Command::new(bin())
        .args(["restore", "-c", cfg.to_str().unwrap(), db.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(sha(&db), final_sha("basic-64k"));
    // And it is never overwritten without --force.
    let o = Command::new(bin())
        .args(["restore", "-c", cfg.to_str().unwrap(), db.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));

    let o = Command::new(bin())
        .args([
            "restore",
            "-c",
            cfg.to_str().unwrap(),
            "--replica",
            "third",
            db.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("\"first\""),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new(bin())
        .args(["restore", "-c", cfg.to_str().unwrap(), "/not/configured.db"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));

    let o = Command::new(bin())
        .args(["databases", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && text.contains("first")
            && text.contains("second")
            && text.contains("app.db"),
        "{text}"
    );

    let o = Command::new(bin())
        .args(["ltx", "--json", b.to_str().unwrap()])
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 10);
    assert_eq!(rows[9]["level"], 9);
    // Each row carries the segment's own time, as restore reads it from the header.
    for r in rows.as_array().unwrap() {
        let ts = r["timestamp"]
            .as_str()
            .unwrap_or_else(|| panic!("no timestamp: {r}"));
        let t = chrono::DateTime::parse_from_rfc3339(ts).unwrap();
        assert!(t.timestamp() > 1_700_000_000, "{r}");
        assert!(r["stored"].is_string(), "{r}");
    }
    // A mistyped path is no empty replica.
    let typo = b.with_extension("typo");
    let o = Command::new(bin())
        .args(["ltx", typo.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("does not exist (a typo?"), "{err}");
}

/// A replica that fails every upload keeps the drain waiting; a second SIGTERM ends it at
/// once (exit 1, naming what was not uploaded), and a later start uploads what stayed
/// staged: nothing is lost.
#[test]
fn second_signal_aborts_a_stuck_drain_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let rep = dir.path().join("rep");
    let mut w = rusqlite::Connection::open(&db).unwrap();
    w.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t(v) VALUES ('a');")
        .unwrap();
    let args = |log: &str| {
        let log = fs::File::create(dir.path().join(log)).unwrap();
        Command::new(bin())
            .args([
                "replicate",
                "--monitor-interval",
                "50ms",
                "--shutdown-sync-timeout",
                "60s",
            ])
            .arg(&db)
            .arg(&rep)
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let mut child = args("run1.log");
    assert!(common::wait_for_txid(&rep, 1, Duration::from_secs(20)));
    // Sabotage: the level directory becomes a file, so every upload fails.
    fs::rename(rep.join("ltx/0"), rep.join("ltx/0.bak")).unwrap();
    fs::write(rep.join("ltx/0"), b"not a directory").unwrap();
    let tx = w.transaction().unwrap();
    tx.execute("INSERT INTO t(v) VALUES ('b')", []).unwrap();
    tx.commit().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    let kill = |sig: &str| {
        Command::new("kill")
            .args([sig, pid.as_str()])
            .status()
            .unwrap()
    };
    kill("-TERM");
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the drain should still be retrying"
    );
    kill("-TERM");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "second signal did not abort the drain"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = fs::read_to_string(dir.path().join("run1.log")).unwrap();
    // Something was left unuploaded: the exit code and the log say so, naming the replica.
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("aborting the shutdown sync"), "{log}");
    assert!(log.contains("not fully uploaded"), "{log}");
    assert!(!log.contains("every segment uploaded"), "{log}");
    // One error line for the whole streak, not one per retry.
    assert_eq!(log.matches("upload failed").count(), 1, "{log}");

    // Repair the replica and start again: the staged segment is uploaded.
    fs::remove_file(rep.join("ltx/0")).unwrap();
    fs::rename(rep.join("ltx/0.bak"), rep.join("ltx/0")).unwrap();
    let mut child = args("run2.log");
    assert!(common::wait_for_txid(&rep, 2, Duration::from_secs(20)));
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let out = dir.path().join("out.db");
    let o = Command::new(bin())
        .args([
            "restore",
            "--to",
            out.to_str().unwrap(),
            rep.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n: i64 = rusqlite::Connection::open(&out)
        .unwrap()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

/// Commands that never contact a replica (`databases`, `status`, `sync`) do not need its
/// secrets: a config naming unset variables for them still loads. Commands that use the
/// replica still refuse it, naming the key.
#[test]
fn commands_that_do_not_use_a_replica_do_not_need_its_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let cfg = dir.path().join("replicad.yml");
    fs::write(
        &cfg,
        format!(
            "addr: 127.0.0.1:1\nsocket: {{enabled: true, path: {sock}}}\n\
             access-key-id: ${{REPLICAD_TEST_UNSET_KEY_ID}}\n\
             secret-access-key: ${{REPLICAD_TEST_UNSET_SECRET}}\n\
             dbs:\n  - path: {db}\n    replica:\n      type: s3\n      bucket: b\n      \
             endpoint: http://127.0.0.1:1\n      sse-customer-key: ${{REPLICAD_TEST_UNSET_SSE}}\n",
            sock = dir.path().join("ctl.sock").display(),
            db = db.display(),
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .env_remove("REPLICAD_TEST_UNSET_KEY_ID")
            .env_remove("REPLICAD_TEST_UNSET_SECRET")
            .env_remove("REPLICAD_TEST_UNSET_SSE")
            .output()
            .unwrap()
    };
    let cfg = cfg.to_str().unwrap();
    let o = run(&["databases", "--config", cfg]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("app.db"));
    // No daemon is listening: a runtime failure (1), not a config error (2).
    let db_arg = db.to_str().unwrap();
    for args in [
        vec!["status", "--config", cfg],
        vec!["sync", "--config", cfg, db_arg],
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("value is empty"), "{args:?}: {err}");
    }
    // An --addr that is no HOST:PORT is a usage error, not an unreachable daemon.
    for addr in ["garbage", "", "127.0.0.1:99999", ":9090"] {
        let o = run(&["status", "--addr", addr]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{addr:?}: {err}");
        assert!(err.contains("is not HOST:PORT"), "{addr:?}: {err}");
    }
    let o = run(&["status", "--addr", "localhost:1"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // restore uses the replica: the empty secret is still an error naming its key.
    let o = run(&[
        "restore",
        "--config",
        cfg,
        "--to",
        "/nonexistent/out.db",
        db.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("access-key-id") || err.contains("secret-access-key"),
        "{err}"
    );
}

/// A command-line value that overrides a config file's is checked as the file's own would
/// be: `--monitor-interval 0s` with `--config` started a 1 ms poll (exit 2 without a file),
/// and `--truncate-page-n 0` made every checkpoint a TRUNCATE.
#[test]
fn command_line_overrides_of_a_config_file_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let db = t.path().join("app.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x)")
        .unwrap();
    let cfg = t.path().join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            t.path().join("replica").display()
        ),
    )
    .unwrap();
    for flag in [
        &["--monitor-interval", "0s"][..],
        &["--full-verify-interval", "0s"][..],
    ] {
        let log = t.path().join("replicate.log");
        let mut child = Command::new(bin())
            .args(["replicate", "--config", cfg.to_str().unwrap()])
            .args(flag)
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Accepted, it would replicate until stopped: a failure, not a hang.
        let status = common::wait_timeout(&mut child, Duration::from_secs(20));
        if status.is_none() {
            common::kill9(&mut child);
        }
        let err = fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{flag:?}: {err}");
        assert!(err.contains("must be greater than zero"), "{flag:?}: {err}");
    }
    // Past 100 years a value overflowed the clocks it was added to: a panic in the daemon.
    for (flag, value) in [
        ("--monitor-interval", "500000000000years"),
        ("--full-verify-interval", "101y"),
    ] {
        let o = Command::new(bin())
            .args(["replicate", "--config", cfg.to_str().unwrap(), flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("longer than 100 years"), "{flag}: {err}");
    }
    let o = Command::new(bin())
        .args(["restore", "--follow", "--follow-interval", "200y", "--to"])
        .arg(t.path().join("out.db"))
        .arg(t.path().join("replica"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("longer than 100 years"), "{err}");
    assert!(!t.path().join("replica").exists(), "nothing replicated");
}

/// A variable the config names that the environment does not set expands to an empty string
/// (as in Litestream), which turns `${ROOT}/replica` into `/replica`: the daemon says so in a
/// WARN line, and not for a variable in a comment.
#[test]
fn an_unset_variable_in_the_config_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let cfg = dir.path().join("replicad.yml");
    fs::write(
        &cfg,
        format!(
            "# ${{REPLICAD_TEST_IN_A_COMMENT}}\ndbs:\n  - path: {}\n    replica:\n      \
             path: {}${{REPLICAD_TEST_UNSET_ROOT}}/replica\n",
            db.display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let d = common::spawn_replicate(dir.path(), &["-c", common::s(&cfg)]);
    common::wait_for(
        "the warning",
        || d.log_text(),
        || {
            d.log_text()
                .contains("${REPLICAD_TEST_UNSET_ROOT} is not set")
        },
    );
    let log = d.log_text();
    assert!(!log.contains("REPLICAD_TEST_IN_A_COMMENT"), "{log}");
    d.stop();
}
