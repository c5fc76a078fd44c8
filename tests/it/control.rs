//! The control socket (`socket` key) and `replicad sync`, with the real binary: a sync with
//! `--wait` returns only once the replica holds the latest TXID, although the monitor would
//! not have ticked by itself for seconds.

use crate::common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{TestDir, WAIT, bin, max_replica_txid, restore_ok, s, spawn_replicate};

fn sync(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("sync")
        .args(args)
        .output()
        .expect("run replicad sync")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits until the daemon listens at `sock`.
fn wait_for_socket(sock: &Path, logs: impl Fn() -> String) {
    let deadline = Instant::now() + WAIT;
    // A stale socket file refuses connections; the daemon's accepts them.
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "no socket at {} after {WAIT:?}; logs:\n{}",
            sock.display(),
            logs()
        );
        sleep(Duration::from_millis(20));
    }
}

#[test]
fn sync_wait_replicates_the_latest_txid_through_the_socket() {
    let dir = TestDir::new("control");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let sock = dir.join("r.sock");
    let config = dir.join("replicad.yml");
    let conn = common::http::make_db(&db);
    // A stale socket file from an earlier run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    std::fs::write(
        &config,
        format!(
            "addr: \"127.0.0.1:{}\"\nmonitor-interval: 10s\nsocket:\n  enabled: true\n  path: {}\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
            common::http::free_port(),
            s(&sock),
            s(&db),
            s(&replica)
        ),
    )
    .unwrap();
    let daemon = spawn_replicate(dir.path(), &["--config", s(&config)]);
    wait_for_socket(&sock, || daemon.log_text());
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    conn.execute("INSERT INTO t(v) VALUES ('synced-now')", [])
        .unwrap();
    let started = Instant::now();
    let o = sync(&["--config", s(&config), "--wait", s(&db)]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}\nlog:\n{}",
        text(&o),
        daemon.log_text()
    );
    // Well before the first 10s tick: the request woke the monitor.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let txid = answer["txid"].as_u64().unwrap();
    assert!(txid > 0, "{answer}");
    assert_eq!(answer["db"].as_str(), Some(s(&db)));
    assert_eq!(
        answer["replicas"][0]["remote_txid"].as_u64(),
        Some(txid),
        "{answer}"
    );
    // Immediately: the replica holds that TXID and the row.
    assert_eq!(max_replica_txid(&replica), txid);
    let out = dir.join("restored.db");
    restore_ok(s(&replica), &out, None);
    let restored = rusqlite::Connection::open(&out).unwrap();
    let n: i64 = restored
        .query_row("SELECT count(*) FROM t WHERE v = 'synced-now'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(n, 1);

    // Without --wait, with --socket: answers at once.
    let o = sync(&["--socket", s(&sock), s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // A database the daemon does not replicate.
    let other = dir.join("other.db");
    let o = sync(&["--config", s(&config), "--wait", s(&other)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("404"),
        "{}",
        text(&o)
    );

    // A reader that left (`| head`) is no failure; a stdout that fails (a full disk) is.
    for cmd in [
        &["sync", "--socket", s(&sock), s(&db)][..],
        &["status", "--config", s(&config)],
    ] {
        let o = common::run_with_stdout_closed(cmd);
        assert_eq!(o.status.code(), Some(0), "{cmd:?}: {}", text(&o));
        let full = std::fs::File::create("/dev/full").unwrap();
        let o = Command::new(bin()).args(cmd).stdout(full).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{cmd:?}: {}", text(&o));
    }

    daemon.stop_ok();
    assert!(!sock.exists(), "socket file left behind after shutdown");

    // No daemon: unreachable.
    let o = sync(&["--config", s(&config), "--wait", s(&db)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot reach"),
        "{}",
        text(&o)
    );
}

#[test]
fn sync_usage_errors_exit_2() {
    let o = sync(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let dir = TestDir::new("control-usage");
    let o = sync(&[
        "--config",
        s(&dir.join("missing.yml")),
        s(&dir.join("a.db")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A timeout past 100 years overflowed the client's own limit: a panic (exit 101).
    let o = sync(&["--timeout", "18446744073709551615", s(&dir.join("a.db"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A config without the control socket: said as such, not as an unreachable default path.
    let cfg = dir.join("no-socket.yml");
    std::fs::write(
        &cfg,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            s(&dir.join("a.db")),
            s(&dir.join("r"))
        ),
    )
    .unwrap();
    let o = sync(&["--config", s(&cfg), s(&dir.join("a.db"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("does not enable the control socket"),
        "{}",
        text(&o)
    );
}
