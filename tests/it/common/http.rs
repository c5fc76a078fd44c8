//! HTTP helpers for tests that scrape a running listener.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` over a fresh connection: (status code, body).
pub async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    parse_response(&raw)
}

/// `GET path` on 127.0.0.1:`port` from blocking code: (status code, body).
pub fn get_blocking(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

/// Splits a raw HTTP/1.1 response into (status code, body).
pub fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8(raw.to_vec()).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a full response");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    (code, body.to_string())
}

/// The value of the sample `name{labels}` (labels as rendered, e.g. `db="/x",replica="r"`).
pub fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// A WAL-mode database with one table and one row.
pub fn make_db(path: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
         INSERT INTO t(v) VALUES ('a');",
    )
    .unwrap();
    conn
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes `<dir>/replicad.yml` replicating `db` to `<dir>/replica` with its HTTP listener on a
/// free port; returns the config path and the port.
pub fn daemon_config(dir: &std::path::Path, db: &std::path::Path) -> (std::path::PathBuf, u16) {
    let port = free_port();
    let config = dir.join("replicad.yml");
    std::fs::write(
        &config,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\ndbs:\n  - path: {}\n    replica:\n      url: {}\n",
            db.display(),
            dir.join("replica").display()
        ),
    )
    .unwrap();
    (config, port)
}

/// A lease object as another replicad, on another host, would have written it.
pub const FOREIGN_LEASE: &str = r#"{"instance":"other","host":"elsewhere","pid":4242,"db":"/other/app.db","ttl_ms":600000,"refreshed_ms":0,"version":"x"}"#;

/// `/readyz` of `store` fails, and one of its reasons names the single-writer lease.
pub fn assert_unready_for_the_lease(store: &replicad::daemon::Store) {
    let reasons =
        replicad::ops::http::readiness(&store.dbs(), std::time::Duration::from_secs(60), 0)
            .unwrap_err();
    assert!(
        reasons.iter().any(|r| r.contains("single-writer lease")),
        "{reasons:?}"
    );
}
