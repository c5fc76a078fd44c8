//! `replicate --exec` (child process, signal forwarding, exit code), systemd notifications
//! (`NOTIFY_SOCKET`, watchdog) and the `logging` configuration, with the real binary.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestDir, WAIT, bin, restore_ok, s, sigterm, spawn_replicate, wait_timeout};
use rusqlite::Connection;

/// A WAL database with a table `t(x)`.
fn create_db(path: &Path) {
    let c = Connection::open(path).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x TEXT); INSERT INTO t VALUES ('a');")
        .unwrap();
}

/// Waits for the daemon to exit and returns its exit code; fails with the log otherwise.
fn exit_code(d: &mut common::Daemon) -> i32 {
    let st = wait_timeout(&mut d.child, WAIT)
        .unwrap_or_else(|| panic!("replicad did not exit; log:\n{}", d.log_text()));
    st.code()
        .unwrap_or_else(|| panic!("replicad died by signal: {st}; log:\n{}", d.log_text()))
}

#[test]
fn exec_child_exit_code_is_returned_and_its_last_write_is_replicated() {
    let t = TestDir::new("exec-code");
    let db = t.join("app.db");
    let replica = t.join("replica");
    create_db(&db);
    let script = t.join("child.py");
    std::fs::write(
        &script,
        format!(
            "import sqlite3, sys\n\
             c = sqlite3.connect({db:?})\n\
             c.execute(\"INSERT INTO t VALUES ('from-child')\")\n\
             c.commit()\n\
             c.close()\n\
             sys.exit(7)\n",
            db = s(&db)
        ),
    )
    .unwrap();
    // The Go-style single-dash flag, as Litestream users write it.
    let exec = format!("python3 '{}'", s(&script));
    let mut d = spawn_replicate(
        t.path(),
        &[
            "--monitor-interval",
            "50ms",
            "-exec",
            &exec,
            s(&db),
            s(&replica),
        ],
    );
    assert_eq!(exit_code(&mut d), 7, "log:\n{}", d.log_text());
    let out = t.join("restored.db");
    restore_ok(s(&replica), &out, None);
    let rows = common::strings(&out, "SELECT x FROM t ORDER BY rowid");
    assert_eq!(rows, ["a", "from-child"], "log:\n{}", d.log_text());
}

#[test]
fn exec_exit_zero_and_unstartable_command() {
    let t = TestDir::new("exec-zero");
    let db = t.join("app.db");
    create_db(&db);
    let mut d = spawn_replicate(t.path(), &["--exec", "true", s(&db), s(&t.join("replica"))]);
    assert_eq!(exit_code(&mut d), 0, "log:\n{}", d.log_text());

    let mut d = spawn_replicate(
        t.path(),
        &[
            "--exec",
            "/nonexistent/replicad-test-child",
            s(&db),
            s(&t.join("replica")),
        ],
    );
    assert_eq!(exit_code(&mut d), 1);
    assert!(
        d.log_text().contains("cannot start the exec command"),
        "{}",
        d.log_text()
    );

    // Unbalanced quotes: a usage error.
    let o = Command::new(bin())
        .args(["replicate", "--exec", "sh -c 'x", s(&db), s(&t.join("r2"))])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--exec"));
}

#[test]
fn sigterm_is_forwarded_to_the_exec_child() {
    let t = TestDir::new("exec-term");
    let db = t.join("app.db");
    create_db(&db);
    let ready = t.join("child-ready");
    let marker = t.join("child-got-sigterm");
    let script = t.join("child.py");
    std::fs::write(
        &script,
        format!(
            "import pathlib, signal, sys, time\n\
             def on_term(sig, frame):\n    \
                 pathlib.Path({marker:?}).write_text('term')\n    \
                 sys.exit(3)\n\
             signal.signal(signal.SIGTERM, on_term)\n\
             pathlib.Path({ready:?}).write_text('ready')\n\
             while True:\n    \
                 time.sleep(0.05)\n",
            marker = s(&marker),
            ready = s(&ready)
        ),
    )
    .unwrap();
    let config = t.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "exec: python3 '{}'\nmonitor-interval: 50ms\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
            s(&script),
            s(&db),
            s(&t.join("replica"))
        ),
    )
    .unwrap();
    let mut d = spawn_replicate(t.path(), &["-config", s(&config)]);
    let deadline = Instant::now() + WAIT;
    while !ready.exists() {
        assert!(
            Instant::now() < deadline && d.running(),
            "child never started; log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sigterm(&d.child);
    assert_eq!(exit_code(&mut d), 3, "log:\n{}", d.log_text());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "term");
    assert!(d.log_text().contains("forwarding"), "{}", d.log_text());
}

#[test]
fn systemd_notifications() {
    let t = TestDir::new("notify");
    let db = t.join("app.db");
    create_db(&db);
    let sock_path = t.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::fs::create_dir_all(t.join("logs")).unwrap();
    let log = t.join("logs/replicad-notify.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(bin())
        .args([
            "replicate",
            "--monitor-interval",
            "50ms",
            s(&db),
            s(&t.join("replica")),
        ])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut lines: Vec<String> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut recv = |lines: &mut Vec<String>| {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            lines.extend(msg.lines().map(str::to_string));
        }
    };
    let has = |lines: &[String], want: &str| lines.iter().any(|l| l.starts_with(want));
    let deadline = Instant::now() + WAIT;
    while !(has(&lines, "READY=1") && has(&lines, "WATCHDOG=1") && has(&lines, "STATUS=")) {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("missing notifications: {lines:?}; log:\n{}", log_text());
        }
        recv(&mut lines);
    }
    assert!(!has(&lines, "STOPPING=1"), "{lines:?}");
    // READY=1 comes after the first sync.
    assert!(
        has(&lines, "STATUS=replicating 1 database"),
        "{lines:?}; log:\n{}",
        log_text()
    );
    // Watchdog pings keep coming.
    let seen = lines.iter().filter(|l| *l == "WATCHDOG=1").count();
    let deadline = Instant::now() + WAIT;
    while lines.iter().filter(|l| *l == "WATCHDOG=1").count() < seen + 2 {
        assert!(Instant::now() < deadline, "{lines:?}");
        recv(&mut lines);
    }
    sigterm(&child);
    let deadline = Instant::now() + WAIT;
    while !has(&lines, "STOPPING=1") {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no STOPPING=1: {lines:?}; log:\n{}", log_text());
        }
        recv(&mut lines);
    }
    let st = wait_timeout(&mut child, WAIT).expect("replicad exits after SIGTERM");
    assert_eq!(st.code(), Some(0), "log:\n{}", log_text());
    let ready = lines.iter().position(|l| l == "READY=1").unwrap();
    let stopping = lines.iter().position(|l| l == "STOPPING=1").unwrap();
    assert!(ready < stopping, "{lines:?}");
}

#[test]
fn logging_json_from_the_config_file() {
    let t = TestDir::new("log-json");
    let db = t.join("app.db");
    create_db(&db);
    let config = t.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "logging: {{type: json, level: debug}}\nmonitor-interval: 50ms\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
            s(&db),
            s(&t.join("replica"))
        ),
    )
    .unwrap();
    let d = spawn_replicate(t.path(), &["--config", s(&config)]);
    common::wait_for_txid(&t.join("replica"), 1, WAIT);
    let log = d.log.clone();
    d.stop_ok();
    let text = std::fs::read_to_string(log).unwrap();
    let mut levels = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nlog:\n{text}"));
        levels.push(v["level"].as_str().unwrap_or_default().to_string());
    }
    assert!(levels.iter().any(|l| l == "INFO"), "{text}");

    // `level` applies, and --log-level on the command line beats it.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("level: debug", "level: WARN"),
    )
    .unwrap();
    for (args, info) in [
        (vec!["--config", s(&config)], false),
        (vec!["--log-level", "info", "-config", s(&config)], true),
    ] {
        let d = spawn_replicate(t.path(), &args);
        // Its lease (the last run's was released): the daemon started, and handles SIGTERM.
        let lease = t.join("replica").join("replicad.lease");
        let deadline = Instant::now() + WAIT;
        while !lease.exists() {
            assert!(Instant::now() < deadline, "{args:?}: never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = d.log.clone();
        d.stop_ok();
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            text.contains("\"level\":\"INFO\""),
            info,
            "{args:?}: {text}"
        );
    }
}

#[test]
fn invalid_logging_type_is_a_config_error() {
    let t = TestDir::new("log-bad");
    let db = t.join("app.db");
    create_db(&db);
    let config = t.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\nlogging:\n  level: info\n  type: xml\n",
            s(&db),
            s(&t.join("replica"))
        ),
    )
    .unwrap();
    let o = Command::new(bin())
        .args(["replicate", "-config", s(&config)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("line 7"), "{err}");
    assert!(err.contains("key `type` in logging"), "{err}");
    assert!(err.contains("\"xml\""), "{err}");
}
