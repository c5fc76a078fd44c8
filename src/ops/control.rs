//! The control socket (config key `socket`): HTTP/1.1 over a Unix socket, for `replicad sync`.
//!
//! - `POST /sync?db=<abs path>[&wait=true][&timeout=<seconds>]`: wakes that database's
//!   monitor for an immediate sync ([`SyncTrigger::request`]). Without `wait` it answers at
//!   once. With `wait` it answers when a sync that started after the request has completed
//!   and every replica holds the database's TXID as of that sync (stats polled every 20 ms),
//!   or `504` after `timeout` seconds (default 30).
//!   Body: `{"db": "/data/app.db", "txid": 42, "replicas": [{"name": "s3", "remote_txid": 42}]}`.
//! - Unknown database: `404`; bad query: `400`; another path: `404`; another method: `405`.
//!
//! The socket file is created with `socket.permissions` (bound under a temporary name,
//! chmod-ed, then renamed into place; a stale socket file is removed first) and removed when [`serve`] returns. Whoever can open it can make the
//! daemon sync, nothing more.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::SocketConfig;
use crate::daemon::registry::DbRegistry;
use crate::daemon::{DbHandle, SyncTrigger};

/// Longest time a connection may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a waiting `/sync` looks at the stats.
const POLL: Duration = Duration::from_millis(20);
/// Default of the `timeout` query parameter.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A bound control socket; removes its file when dropped.
pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the socket of `cfg`: removes a stale socket file, binds, then sets the mode.
pub fn bind(cfg: &SocketConfig) -> std::io::Result<ControlListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = &cfg.path;
    let ctx = |e: std::io::Error, what: &str| {
        std::io::Error::new(
            e.kind(),
            format!("{what} {} (key `socket.path`): {e}", path.display()),
        )
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| ctx(e, "remove stale socket"))?
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket (key `socket.path`)",
                    path.display()
                ),
            ));
        }
        Err(_) => {}
    }
    // Bound under a temporary name, chmod-ed, then renamed into place: nobody can connect
    // to it while it still has the umask's mode.
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| ctx(e, "listen on"))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(cfg.permissions))
        .map_err(|e| ctx(e, "chmod"))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| ctx(e, "rename socket to")));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(ControlListener {
        listener,
        path: path.clone(),
    })
}

/// Serves `/sync` for `dbs` on `listener` until `token` is cancelled; waiting requests are
/// answered `503` then. The socket file is removed on return.
pub async fn serve(listener: ControlListener, dbs: DbRegistry, token: CancellationToken) {
    let conns = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = token.cancelled() => break,
            r = listener.listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let dbs = dbs.clone();
        let token = token.clone();
        conns.spawn(async move {
            let stop = token.clone();
            let service = hyper::service::service_fn(move |req| {
                let dbs = dbs.clone();
                let stop = stop.clone();
                async move { Ok::<_, Infallible>(handle(&dbs.snapshot(), &req, &stop).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(error = %e, "control connection ended with an error");
                },
                // Let a handler that saw the cancellation write its 503 first.
                _ = async {
                    token.cancelled().await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                } => {}
            }
        });
    }
    drop(listener);
    conns.close();
    conns.wait().await;
}

/// The query of a `/sync` request.
#[derive(Debug, PartialEq)]
struct SyncQuery {
    db: PathBuf,
    wait: bool,
    timeout: Duration,
}

fn parse_query(query: &str) -> Result<SyncQuery, String> {
    let mut db = None;
    let mut wait = false;
    let mut timeout = DEFAULT_TIMEOUT;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "db" => db = Some(PathBuf::from(&*v)),
            "wait" => {
                wait = match &*v {
                    "" | "true" | "1" => true,
                    "false" | "0" => false,
                    other => return Err(format!("wait={other}: use true or false")),
                }
            }
            "timeout" => {
                // try_from: a number past Duration's range panicked the handler.
                timeout = v
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| format!("timeout={v}: use a number of seconds"))?
            }
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    let db = db.ok_or("missing parameter db")?;
    if !db.is_absolute() {
        return Err(format!("db={}: use an absolute path", db.display()));
    }
    Ok(SyncQuery { db, wait, timeout })
}

/// How long the search through symlinks may take before the database counts as not found.
const FIND_TIMEOUT: Duration = Duration::from_secs(5);

/// One search through symlinks at a time: each may hold a blocking thread for as long as a
/// dead mount does not answer, and the monitors' syncs share that pool.
static SEARCHING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The database at `path`, as configured or through symlinks. The second search stats every
/// database's path, which blocks without end on a dead mount: off the reactor, one at a time,
/// and bounded; `Err` when it cannot answer.
async fn find<'a>(dbs: &'a [DbHandle], path: &Path) -> Result<Option<&'a DbHandle>, String> {
    if let Some(d) = dbs.iter().find(|d| d.path == path) {
        return Ok(Some(d));
    }
    let unanswered =
        || "the search through symlinks is held up (a file system does not answer)".to_string();
    let permit = SEARCHING.try_acquire().map_err(|_| unanswered())?;
    let want = path.to_path_buf();
    let paths: Vec<PathBuf> = dbs.iter().map(|d| d.path.clone()).collect();
    let search = tokio::task::spawn_blocking(move || {
        // Held until the search ends, however long after the request it does.
        let _permit = permit;
        let canon = std::fs::canonicalize(&want).ok()?;
        paths
            .iter()
            .position(|p| std::fs::canonicalize(p).is_ok_and(|p| p == canon))
    });
    match tokio::time::timeout(FIND_TIMEOUT, search).await {
        Ok(Ok(at)) => Ok(at.and_then(|i| dbs.get(i))),
        _ => Err(unanswered()),
    }
}

async fn handle(
    dbs: &[DbHandle],
    req: &Request<Incoming>,
    stop: &CancellationToken,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/sync" {
        return text(StatusCode::NOT_FOUND, "not found\n".into());
    }
    if req.method() != Method::POST {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use POST\n".into(),
        );
    }
    let q = match parse_query(req.uri().query().unwrap_or("")) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let db = match find(dbs, &q.db).await {
        Ok(Some(db)) => db,
        Ok(None) => {
            return text(
                StatusCode::NOT_FOUND,
                format!("database {} is not replicated here\n", q.db.display()),
            );
        }
        Err(why) => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("database {}: {why}\n", q.db.display()),
            );
        }
    };
    if db.unstarted {
        let why = db
            .stats
            .health
            .problem()
            .map(|p| p.reason)
            .unwrap_or_default();
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("database {}: {why}\n", q.db.display()),
        );
    }
    if !q.wait {
        db.sync.request();
        let txid = db.stats.txid.load(Ordering::SeqCst);
        return json(StatusCode::OK, db, txid);
    }
    let waited = tokio::select! {
        r = tokio::time::timeout(q.timeout, wait_synced(db, &db.sync)) => r,
        _ = stop.cancelled() => {
            return text(StatusCode::SERVICE_UNAVAILABLE, "replicad is shutting down\n".into());
        }
    };
    match waited {
        Ok(txid) => json(StatusCode::OK, db, txid),
        Err(_) => json(
            StatusCode::GATEWAY_TIMEOUT,
            db,
            db.stats.txid.load(Ordering::SeqCst),
        ),
    }
}

/// Requests a sync of `db`, waits for a tick that started after the request to complete,
/// then for every replica to hold the TXID the database had then; returns that TXID.
async fn wait_synced(db: &DbHandle, trigger: &SyncTrigger) -> u64 {
    let after = trigger.started();
    trigger.request();
    while trigger.synced() <= after {
        tokio::time::sleep(POLL).await;
    }
    let target = db.stats.txid.load(Ordering::SeqCst);
    while db
        .replicas
        .iter()
        .any(|(_, r)| r.remote_txid.load(Ordering::SeqCst) < target)
    {
        tokio::time::sleep(POLL).await;
    }
    target
}

fn json(code: StatusCode, db: &DbHandle, txid: u64) -> Response<Full<Bytes>> {
    let replicas: Vec<serde_json::Value> = db
        .replicas
        .iter()
        .map(|(name, r)| {
            serde_json::json!({
                "name": name,
                "remote_txid": r.remote_txid.load(Ordering::SeqCst),
            })
        })
        .collect();
    let mut body = serde_json::json!({
        "db": db.path.display().to_string(),
        "txid": txid,
        "replicas": replicas,
    })
    .to_string();
    body.push('\n');
    let mut r = text(code, body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn text(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sync_queries() {
        let q = parse_query("db=%2Fdata%2Fapp.db&wait=true&timeout=2.5").unwrap();
        assert_eq!(
            q,
            SyncQuery {
                db: "/data/app.db".into(),
                wait: true,
                timeout: Duration::from_millis(2500),
            }
        );
        let q = parse_query("db=/a.db").unwrap();
        assert!(!q.wait);
        assert_eq!(q.timeout, DEFAULT_TIMEOUT);
        assert!(parse_query("wait=true").is_err());
        assert!(parse_query("db=rel.db").is_err());
        assert!(parse_query("db=/a.db&wait=maybe").is_err());
        assert!(parse_query("db=/a.db&timeout=-1").is_err());
        assert!(
            parse_query("db=/a.db&timeout=1e20").is_err(),
            "past Duration's range"
        );
        assert!(parse_query("db=/a.db&timeout=NaN").is_err());
        assert!(parse_query("db=/a.db&x=1").is_err());
    }
}
