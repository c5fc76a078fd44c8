//! A configuration file written exactly as a Litestream user writes `litestream.yml` (global
//! replica settings at the top level, `addr: ":PORT"`, `levels`, `snapshot`, a `replicas`
//! list with a file and an S3 replica) loads and runs with the real binary: replicate, the
//! metrics endpoint, SIGTERM, and a restore from each replica. A Litestream key replicad does
//! not implement is refused with exit code 2 and the key's name.

use crate::common;

use common::http::free_port;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::{TestDir, WAIT, assert_same_content, s, write_file};
use rusqlite::{Connection, params};

/// `replicad ARGS...` with the credentials given only as `TEST_KEY`/`TEST_SECRET` (expanded
/// in the file), never through the AWS or Litestream variables.
fn replicad(server: &S3Server) -> Command {
    let mut c = Command::new(common::bin());
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "LITESTREAM_ACCESS_KEY_ID",
        "LITESTREAM_SECRET_ACCESS_KEY",
    ] {
        c.env_remove(var);
    }
    c.env("TEST_KEY", &server.access_key)
        .env("TEST_SECRET", &server.secret_key)
        .env("NO_COLOR", "1");
    c
}

/// The `litestream.yml` of the test, with `extra` appended at the top level.
fn litestream_yml(server: &S3Server, port: u16, db: &Path, backup: &Path, extra: &str) -> String {
    format!(
        r#"# Unchanged Litestream v0.5 syntax.
addr: ":{port}"

access-key-id: ${{TEST_KEY}}
secret-access-key: ${{TEST_SECRET}}

levels:
  - interval: 5s
  - interval: 1m
snapshot:
  interval: 1h
  retention: 24h

dbs:
  - path: {db}
    monitor-interval: 50ms
    replicas:
      - type: file
        path: {backup}
      - type: s3
        bucket: {bucket}
        path: {prefix}
        endpoint: {endpoint}
        region: {region}
        force-path-style: true
{extra}"#,
        db = db.display(),
        backup = backup.display(),
        bucket = server.bucket,
        prefix = server.key("litestream-yml/app.db"),
        endpoint = server.endpoint,
        region = server.region,
    )
}

/// `GET /metrics` over a raw TCP connection; `None` while nothing listens.
fn metrics(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The value of `replicad_db_txid` for `db` in a metrics page.
fn db_txid(page: &str, db: &Path) -> Option<f64> {
    let label = format!("db=\"{}\"", db.display());
    page.lines()
        .find(|l| l.starts_with("replicad_db_txid{") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn check(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what} failed with {}:\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litestream_yml_replicates_and_restores_from_both_replicas() {
    let server = S3Server::start().await;
    let dir = TestDir::new("litestream-yml");
    let db = dir.join("app.db");
    let backup = dir.join("backup");
    let port = free_port();
    let config = dir.join("litestream.yml");
    write_file(&config, &litestream_yml(&server, port, &db, &backup, ""));

    let conn = Connection::open(&db).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);")
        .unwrap();

    let log = dir.join("replicad.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = replicad(&server)
        .args(["replicate", "-config", s(&config)])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    for batch in 0..5 {
        let tx = conn.unchecked_transaction().unwrap();
        for i in 0..20 {
            tx.execute(
                "INSERT INTO t (v) VALUES (?1)",
                params![format!("row {batch}-{i}")],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }

    // `addr: ":PORT"` listens on 127.0.0.1 and shows the database's TXID.
    let deadline = Instant::now() + WAIT;
    let txid = loop {
        if let Some(txid) = metrics(port).and_then(|p| db_txid(&p, &db))
            && txid > 0.0
        {
            break txid;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "replicad exited early; log:\n{}",
            log_text()
        );
        assert!(
            Instant::now() < deadline,
            "no replicad_db_txid for {} at :{port}; log:\n{}",
            db.display(),
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(txid >= 1.0, "{txid}");

    common::sigterm(&child);
    let st = common::wait_timeout(&mut child, WAIT).expect("replicad did not exit on SIGTERM");
    assert_eq!(
        st.code(),
        Some(0),
        "exit after SIGTERM; log:\n{}",
        log_text()
    );
    assert!(
        !log_text().contains(&server.secret_key),
        "secret in the log:\n{}",
        log_text()
    );
    drop(conn);

    // Written from a Litestream config, the replica stays Litestream's (lz4, no codec set):
    // Litestream itself restores it.
    match common::litestream_bin() {
        Some(ls) => {
            let out = dir.join("by-litestream.db");
            let o = std::process::Command::new(ls)
                .args(["restore", "-o", s(&out)])
                .arg(format!("file://{}", backup.display()))
                .env_remove("AWS_CA_BUNDLE")
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "litestream could not restore the replica written from litestream.yml: {}\n{}",
                String::from_utf8_lossy(&o.stderr),
                log_text()
            );
            let n: i64 = Connection::open(&out)
                .unwrap()
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 100);
        }
        None if std::env::var_os("CI").is_some() => {
            panic!("litestream is not installed, and CI must run the interoperability test")
        }
        None => println!("SKIPPED (litestream part): litestream not installed"),
    }

    // Both replicas restore the same rows, through the same file (the S3 credentials come
    // from the file's top-level keys).
    for name in ["file", "s3-2"] {
        let out = dir.join(&format!("restored-{name}.db"));
        let o = replicad(&server)
            .args([
                "restore",
                "-config",
                s(&config),
                "-replica",
                name,
                "-o",
                s(&out),
                s(&db),
            ])
            .output()
            .unwrap();
        check(&o, &format!("restore -replica {name}"));
        assert_same_content(&db, &out, &format!("restore from replica {name}"));
        let n: i64 = Connection::open(&out)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 100, "rows restored from {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_litestream_keys_exit_2_naming_the_key() {
    let server = S3Server::start().await;
    let dir = TestDir::new("litestream-yml-unsupported");
    let db = dir.join("app.db");
    let backup = dir.join("backup");
    for (extra, key) in [
        ("mcp-addr: \":3001\"\n", "mcp-addr"),
        ("verify-compaction: true\n", "verify-compaction"),
    ] {
        let config = dir.join("litestream.yml");
        write_file(
            &config,
            &litestream_yml(&server, free_port(), &db, &backup, extra),
        );
        let o = replicad(&server)
            .args(["replicate", "-config", s(&config)])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}: {stderr}");
        assert!(stderr.contains(&format!("`{key}`")), "{key}: {stderr}");
        assert!(
            !stderr.contains(&server.secret_key),
            "secret leaked: {stderr}"
        );
    }
}
