//! `replicad status`: asks a running daemon (its HTTP endpoint, config key `addr`) for the
//! state of its databases and replicas (`GET /status`), and prints it as a table or as JSON.
//!
//! The client is a minimal HTTP/1.1 one over a plain TCP connection (`Connection: close`,
//! read to the end): the endpoint is local and unauthenticated, so nothing more is needed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::CliError;
use crate::config::Config;

/// How long connecting, and then reading the whole answer, may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `replicad status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// YAML configuration file of the daemon; its `addr` key says where to ask.
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with = "addr")]
    pub config: Option<PathBuf>,
    /// Address of the daemon's HTTP endpoint (HOST:PORT), instead of --config.
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port)]
    pub addr: Option<String>,
    /// Print the daemon's JSON as it is.
    #[arg(long)]
    pub json: bool,
}

/// Runs `replicad status`.
pub async fn run(args: StatusArgs) -> Result<(), CliError> {
    let addr = match (&args.addr, &args.config) {
        (Some(a), _) => a.clone(),
        (None, Some(path)) => {
            let config = Config::load_without_credentials(path, true)
                .map_err(|e| CliError::Usage(e.to_string()))?;
            match config.addr {
                Some(a) => a.to_string(),
                None => {
                    return Err(CliError::Usage(format!(
                        "{} has no `addr` key: the daemon serves no HTTP endpoint to ask \
                         (set `addr`, or pass --addr HOST:PORT)",
                        path.display()
                    )));
                }
            }
        }
        (None, None) => {
            return Err(CliError::Usage(
                "status needs --config FILE or --addr HOST:PORT".into(),
            ));
        }
    };
    let body = get(&addr, "/status").await?;
    let value: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("replicad at {addr} answered /status with invalid JSON"))?;
    if args.json {
        out!("{value}");
    } else {
        super::print_text(&table(&value))?;
    }
    // Exit 1 when anything is not protected, so that a script or a cron job can ask.
    match not_protected(&value) {
        0 => Ok(()),
        n => Err(CliError::Runtime(anyhow!(
            "{n} database{} or replica{} not protected",
            if n == 1 { "" } else { "s" },
            if n == 1 { "" } else { "s" }
        ))),
    }
}

/// How many databases and replicas `/status` says are not protected.
fn not_protected(v: &serde_json::Value) -> usize {
    let empty = Vec::new();
    v["databases"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|d| {
            let replicas = d["replicas"].as_array().unwrap_or(&empty);
            usize::from(d["protected"] == false)
                + replicas.iter().filter(|r| r["protected"] == false).count()
        })
        .sum()
}

/// `--addr`: `HOST:PORT` (a name or an address, `[v6]:PORT` for IPv6), checked before
/// anything is asked: a value that is no address is a usage error, not an unreachable daemon.
fn host_port(s: &str) -> Result<String, String> {
    let port_ok = |p: &str| p.parse::<u16>().is_ok_and(|p| p > 0);
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port_ok(port) => Ok(s.to_string()),
        _ => Err(format!(
            "{s:?} is not HOST:PORT (e.g. 127.0.0.1:9090, localhost:9090 or [::1]:9090)"
        )),
    }
}

/// `GET path` from the daemon at `addr`: the body of a 200 answer.
async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    let unreachable = |e: &dyn std::fmt::Display| {
        anyhow!(
            "cannot reach replicad at {addr}: {e} (is `replicad replicate` running with `addr` set?)"
        )
    };
    let mut stream = tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))?;
    let raw = tokio::time::timeout(TIMEOUT, async {
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    })
    .await
    .map_err(|e| unreachable(&e))?
    .map_err(|e| unreachable(&e))?;
    let (code, body) = parse_response(&raw).with_context(|| format!("replicad at {addr}"))?;
    if code != 200 {
        bail!(
            "replicad at {addr} answered {path} with HTTP {code}: {}",
            body.trim()
        );
    }
    Ok(body)
}

/// Splits an HTTP/1.1 response into (status code, body), de-chunking if needed.
pub(super) fn parse_response(raw: &[u8]) -> anyhow::Result<(u16, String)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("incomplete HTTP response ({} bytes)", raw.len()))?;
    let head = std::str::from_utf8(&raw[..split]).context("HTTP headers are not UTF-8")?;
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP response"))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if chunked {
        body = dechunk(&body)?;
    }
    Ok((
        code,
        String::from_utf8(body).context("the response body is not UTF-8")?,
    ))
}

fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("truncated chunked body"))?;
        let size_text = std::str::from_utf8(&data[..eol])?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| anyhow!("bad chunk size {size_text:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("truncated chunked body");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// One row per replica (a database without replicas gets one row with `-`).
fn table(v: &serde_json::Value) -> String {
    let empty = Vec::new();
    let dbs = v["databases"].as_array().unwrap_or(&empty);
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".into(), |n| n.to_string());
    let header = [
        "DB",
        "TXID",
        "IDLE",
        "SYNCS",
        "ERRORS",
        "REPLICA",
        "REMOTE_TXID",
        "LAG_TXIDS",
        "LAG_SECONDS",
    ];
    let mut rows: Vec<[String; 9]> = Vec::new();
    for d in dbs {
        let db = [
            d["path"].as_str().unwrap_or("?").to_string(),
            num(&d["txid"]),
            match d["idle"].as_bool() {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "-".into(),
            },
            num(&d["syncs"]),
            num(&d["sync_errors"]),
        ];
        let replicas = d["replicas"].as_array().unwrap_or(&empty);
        if replicas.is_empty() {
            let [a, b, c, e, f] = db.clone();
            rows.push([
                a,
                b,
                c,
                e,
                f,
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for r in replicas {
            let [a, b, c, e, f] = db.clone();
            rows.push([
                a,
                b,
                c,
                e,
                f,
                r["name"].as_str().unwrap_or("?").to_string(),
                num(&r["remote_txid"]),
                num(&r["lag_txids"]),
                r["lag_seconds"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.3}")),
            ]);
        }
    }
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            // Text left-aligned, numbers right-aligned.
            if i == 0 || i == 2 || i == 5 {
                l.push_str(&format!("{cell:<w$}"));
            } else {
                l.push_str(&format!("{cell:>w$}"));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    if dbs.is_empty() {
        out.push_str("(no databases)\n");
    }
    // What is not protected, in words, after the table.
    for d in dbs {
        let path = d["path"].as_str().unwrap_or("?");
        if let Some(e) = d["error"].as_str() {
            out.push_str(&format!("NOT PROTECTED  {path}: {e}\n"));
        }
        for r in d["replicas"].as_array().unwrap_or(&empty) {
            let name = r["name"].as_str().unwrap_or("?");
            // Unprotected without an error: an upload that hangs, past max-lag.
            let why = match r["error"].as_str() {
                Some(e) => Some(e.to_string()),
                None if r["protected"] == false => Some(format!(
                    "{} s behind, past max-lag",
                    r["lag_seconds"].as_f64().unwrap_or(0.0)
                )),
                None => None,
            };
            if let Some(why) = why {
                out.push_str(&format!("NOT PROTECTED  {path} replica {name}: {why}\n"));
            }
            if let Some(e) = r["maintenance_error"].as_str() {
                out.push_str(&format!("MAINTENANCE    {path} replica {name}: {e}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_responses() {
        let (code, body) =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((code, body.as_str()), (200, "{}"));
        let raw =
            b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (code, body) = parse_response(raw).unwrap();
        assert_eq!((code, body.as_str()), (503, "abcde"));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
    }

    #[test]
    fn not_protected_counts_databases_and_replicas() {
        let v = serde_json::json!({"databases": [
            {"path": "/d/a.db", "protected": true, "replicas": [
                {"name": "s3", "protected": true}, {"name": "file", "protected": false}]},
            {"path": "/d/b.db", "protected": false, "replicas": []}]});
        assert_eq!(not_protected(&v), 2);
        assert_eq!(not_protected(&serde_json::json!({"databases": []})), 0);
    }

    #[test]
    fn table_has_a_row_per_replica() {
        let v = serde_json::json!({"databases": [{"path": "/d/a.db", "txid": 7, "idle": true,
            "syncs": 3, "sync_errors": 0, "replicas": [
                {"name": "s3", "remote_txid": 7, "lag_txids": 0, "lag_seconds": 0.0},
                {"name": "file", "remote_txid": 5, "lag_txids": 2, "lag_seconds": 1.5}]}]});
        let t = table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("DB"), "{t}");
        assert!(
            lines[1].contains("/d/a.db") && lines[1].contains("s3"),
            "{t}"
        );
        assert!(
            lines[2].contains("file") && lines[2].contains("1.500"),
            "{t}"
        );
    }

    #[test]
    fn table_names_what_is_not_protected() {
        let v = serde_json::json!({"databases": [{"path": "/d/a.db", "txid": 7, "idle": true,
            "syncs": 3, "sync_errors": 2, "error": "not protected: disk full", "replicas": [
                {"name": "s3", "remote_txid": 5, "lag_txids": 2, "lag_seconds": 0.0,
                 "error": "not written: denied"}]}]});
        let t = table(&v);
        assert!(
            t.contains("NOT PROTECTED  /d/a.db: not protected: disk full"),
            "{t}"
        );
        assert!(
            t.contains("NOT PROTECTED  /d/a.db replica s3: not written: denied"),
            "{t}"
        );
    }

    /// An upload that hangs sets no error: `protected: false` alone (past max-lag) is shown,
    /// as is a maintenance job that keeps failing.
    #[test]
    fn table_names_a_replica_past_max_lag_and_a_failing_maintenance_job() {
        let v = serde_json::json!({"databases": [{"path": "/d/a.db", "txid": 7, "idle": false,
            "syncs": 3, "sync_errors": 0, "error": null, "replicas": [
                {"name": "s3", "remote_txid": 5, "lag_txids": 2, "lag_seconds": 9.25,
                 "protected": false, "error": null,
                 "maintenance_error": "compaction: disk full"},
                {"name": "file", "remote_txid": 7, "lag_txids": 0, "lag_seconds": 0.0,
                 "protected": true, "error": null, "maintenance_error": null}]}]});
        let t = table(&v);
        assert!(
            t.contains("NOT PROTECTED  /d/a.db replica s3: 9.25 s behind, past max-lag"),
            "{t}"
        );
        assert!(
            t.contains("MAINTENANCE    /d/a.db replica s3: compaction: disk full"),
            "{t}"
        );
        assert!(!t.contains("replica file:"), "{t}");
    }
}
