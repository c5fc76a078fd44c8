//! The HTTP endpoint (config key `addr`): metrics and health checks, nothing else.
//!
//! - `GET /metrics`: Prometheus text exposition of the Store's registry ([`Metrics::render`]).
//! - `GET /healthz`: `200 ok` while the process runs.
//! - `GET /readyz`: `200 ready` when every database has completed its first sync and is
//!   protected (no sync has been failing for `max-lag` or longer), and every replica is
//!   within `max-lag`, has not been failing for that long, and still holds its single-writer
//!   lease (see [`readiness`]); a replica or database that stopped for good is reported at
//!   once;
//!   otherwise `503` with one line per thing
//!   that is not ready.
//! - `GET /status`: JSON summary for `replicad status` (see [`Status::summary`]): per database
//!   its path, TXID, idle flag, sync and sync-error counts, and per replica its remote TXID
//!   and lag.
//! - Anything else: `404`; a method other than GET or HEAD: `405`.
//!
//! The listener is bound by the Store's owner (the replicate command) before the Store opens,
//! so a bad `addr` fails the start; [`serve`] then runs until its token is cancelled.
//!
//! Invariant: nothing served here is a secret: metric labels are database paths and replica
//! names, and readiness reasons name the same.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::daemon::registry::DbRegistry;
use crate::daemon::{DbHandle, Store};
use crate::ops::metrics::{Metrics, behind, is_protected, replica_lag};

/// Longest time a connection may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the endpoints read: the Store's databases and metrics.
#[derive(Clone)]
pub struct Status {
    dbs: DbRegistry,
    metrics: Metrics,
    max_lag: Duration,
}

impl Status {
    /// The state of `store`; replicas are ready within `max_lag`.
    pub fn new(store: &Store, max_lag: Duration) -> Status {
        Status {
            dbs: store.registry().clone(),
            metrics: Metrics::of(store),
            max_lag,
        }
    }

    /// [`readiness`] of these databases.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        readiness(
            &self.dbs.snapshot(),
            self.max_lag,
            self.metrics.started_ms(),
        )
    }

    /// The body of `GET /status`:
    ///
    /// ```json
    /// {"databases": [{"path": "/data/app.db", "txid": 42, "idle": true, "syncs": 7,
    ///   "sync_errors": 0, "held_seconds": 0.0, "protected": true, "error": null,
    ///   "replicas": [{"name": "s3", "remote_txid": 42, "lag_txids": 0, "lag_seconds": 0.0,
    ///   "lease_lost": false, "protected": true, "error": null, "reseeds": 0,
    ///   "maintenance_error": null}]}]}
    /// ```
    ///
    /// TXIDs are plain numbers (not the 16-digit hex of file names); lags are those of
    /// `replicad_replica_lag_*` ([`replica_lag`]), which start at the sync: `held_seconds` is
    /// how long changes have waited for `min-sync-interval` before it.
    pub fn summary(&self) -> serde_json::Value {
        let since_ms = self.metrics.started_ms();
        let dbs: Vec<serde_json::Value> = self
            .dbs
            .snapshot()
            .iter()
            .map(|d| {
                let pos = *d.pos.borrow();
                let db_unprotected = crate::ops::metrics::db_unprotected(d);
                let replicas: Vec<serde_json::Value> = d
                    .replicas
                    .iter()
                    .map(|(name, r)| {
                        let lag = replica_lag(pos, r, since_ms);
                        serde_json::json!({
                            "name": name,
                            "remote_txid": lag.remote,
                            "lag_txids": lag.txids,
                            "lag_seconds": lag.seconds,
                            "lease_lost": r.lease_lost.load(Ordering::Relaxed),
                            "protected": is_protected(pos, r, self.max_lag, since_ms),
                            "error": r.health.problem().map(|p| p.reason),
                            "reseeds": r.reseeds.load(Ordering::Relaxed),
                            "maintenance_error": r.maintenance.problem().map(|p| p.reason),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "path": d.path.display().to_string(),
                    // The position the lags were computed from: the counter is stored a moment
                    // before the position is published.
                    "txid": pos.txid.0,
                    "idle": d.stats.idle.load(Ordering::Relaxed),
                    "syncs": d.stats.syncs.load(Ordering::Relaxed),
                    "sync_errors": d.stats.sync_errors.load(Ordering::Relaxed),
                    "held_seconds": d.stats.held_seconds(),
                    "protected": db_unprotected.is_none(),
                    "error": db_unprotected,
                    "replicas": replicas,
                })
            })
            .collect();
        serde_json::json!({ "databases": dbs })
    }
}

/// Ready when every database has completed a sync and has not been failing for `max_lag`,
/// and each of its replicas has not been failing for `max_lag` (nor stopped) and either
/// holds the database's TXID or has been missing data for less than `max_lag`
/// ([`crate::ops::metrics::Lag::seconds`]). Otherwise, one reason per database or replica
/// that is not ready.
/// `since_ms`: the stand-in timestamp of a replica that has uploaded nothing yet (see
/// [`crate::ops::metrics::Lag::seconds`]).
pub fn readiness(dbs: &[DbHandle], max_lag: Duration, since_ms: i64) -> Result<(), Vec<String>> {
    let mut reasons = Vec::new();
    for d in dbs {
        let db = d.path.display();
        let now = crate::util::clock::steady_ms();
        let errors = d.stats.sync_errors.load(Ordering::Relaxed);
        // A tick that completed without error (counting attempts would race a failing one).
        let synced = d.sync.synced() > 0;
        if let Some(p) = d.stats.health.problem() {
            // Never synced, or failing for longer than max-lag: not protected.
            if !synced || p.reportable(max_lag, now) {
                reasons.push(format!("db {db}: {}", p.reason));
                continue;
            }
        }
        if !synced {
            reasons.push(if errors > 0 {
                format!("db {db}: first sync not completed ({errors} failed)")
            } else {
                format!("db {db}: first sync not completed")
            });
            continue;
        }
        let pos = *d.pos.borrow();
        for (name, r) in &d.replicas {
            if r.lease_lost.load(Ordering::Relaxed) {
                reasons.push(format!(
                    "db {db}: replica {name}: stopped: another instance took its single-writer lease"
                ));
                continue;
            }
            let problem = r
                .health
                .problem()
                .filter(|p| p.reportable(max_lag, now))
                .map(|p| p.reason);
            match (behind(pos, r, max_lag, since_ms), problem) {
                (None, None) => {}
                (Some(b), None) => reasons.push(format!("db {db}: replica {name}: {b}")),
                (None, Some(p)) => reasons.push(format!("db {db}: replica {name}: {p}")),
                (Some(b), Some(p)) => reasons.push(format!("db {db}: replica {name}: {b}: {p}")),
            }
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// Binds `addr`, with an error that names it.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("listen on {addr} (key `addr`): {e}")))
}

/// Serves the endpoints on `listener` until `token` is cancelled; open connections are
/// closed then as well (scrapes are short).
pub async fn serve(listener: TcpListener, status: Status, token: CancellationToken) {
    let status = Arc::new(status);
    let conns = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = token.cancelled() => break,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let status = status.clone();
        let token = token.clone();
        conns.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let status = status.clone();
                async move { Ok::<_, Infallible>(handle(&status, &req)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "http connection ended with an error");
                },
                _ = token.cancelled() => {}
            }
        });
    }
    conns.close();
    conns.wait().await;
}

fn handle(status: &Status, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, status.metrics.render());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/status" => {
            let mut body = status.summary().to_string();
            body.push('\n');
            let mut r = text(StatusCode::OK, body);
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match status.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(reasons) => {
                let mut body = String::from("not ready:\n");
                for r in reasons {
                    body.push_str(&r);
                    body.push('\n');
                }
                text(StatusCode::SERVICE_UNAVAILABLE, body)
            }
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
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
