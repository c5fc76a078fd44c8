//! The heartbeat ping of Litestream's `heartbeat-url`: a GET every `heartbeat-interval`, sent
//! only while `/readyz` would say ready. A withheld ping is what tells a healthchecks.io-style
//! monitor that something is wrong, so it is logged (once per streak) and counted, never
//! silently skipped; a failed one is tried again at the next check, not at once.

use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts};
use tokio_util::sync::CancellationToken;

use crate::config::notify::NotifyUrl;
use crate::daemon::registry::DbRegistry;
use crate::ops::webhook::register;

/// Longest wait between two heartbeat checks (Litestream checks every 15 s).
const PING_CHECK: Duration = Duration::from_secs(15);
/// How long one heartbeat GET may take (Litestream's figure).
const PING_TIMEOUT: Duration = Duration::from_secs(30);

/// The heartbeat ping task.
pub(crate) struct Ping {
    pub(crate) url: NotifyUrl,
    pub(crate) interval: Duration,
    pub(crate) registry: DbRegistry,
    pub(crate) max_lag: Duration,
    pub(crate) since_ms: i64,
    pub(crate) http: reqwest::Client,
    pub(crate) pings: IntCounterVec,
}

impl Ping {
    /// `replicad_heartbeat_pings_total` in `registry`.
    pub(crate) fn register(registry: &prometheus::Registry) -> IntCounterVec {
        register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "replicad_heartbeat_pings_total",
                    "Heartbeat pings by result: ok, failed, withheld (the daemon was not ready).",
                ),
                &["result"],
            )
            .expect("static metric definition is valid"),
        )
    }

    pub(crate) async fn run(self, stop: CancellationToken) {
        let check = self.interval.min(PING_CHECK);
        // A ping `interval` after the last one that went through; after one that failed or
        // was withheld, another try `check` later (not at once: that looped every 10 ms).
        let mut next = Instant::now() + check;
        let mut withheld = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            next = Instant::now() + check;
            let dbs = self.registry.snapshot();
            if let Err(reasons) = crate::ops::http::readiness(&dbs, self.max_lag, self.since_ms) {
                // Logged before it is counted: whoever sees the count finds the line.
                if !withheld {
                    tracing::warn!(
                        reason = %reasons.first().map(String::as_str).unwrap_or(""),
                        "heartbeat withheld: not ready"
                    );
                    withheld = true;
                }
                self.pings.with_label_values(&["withheld"]).inc();
                continue;
            }
            if withheld {
                tracing::info!("heartbeat resumed: ready again");
                withheld = false;
            }
            let get = self
                .http
                .get(self.url.expose())
                .timeout(PING_TIMEOUT)
                .send();
            // A ping in flight never holds the shutdown.
            let sent = tokio::select! {
                _ = stop.cancelled() => break,
                r = get => r,
            };
            match sent {
                Ok(r) if r.status().is_success() => {
                    self.pings.with_label_values(&["ok"]).inc();
                    next = Instant::now() + self.interval;
                }
                other => {
                    self.pings.with_label_values(&["failed"]).inc();
                    // reqwest's error text names the URL: only its kind is kept.
                    let why = match other {
                        Ok(r) => format!("the server answered HTTP {}", r.status().as_u16()),
                        Err(e) if e.is_timeout() => format!("no answer within {PING_TIMEOUT:?}"),
                        Err(e) if e.is_connect() => "cannot connect".to_string(),
                        Err(_) => "the request failed".to_string(),
                    };
                    // Retried at the next check.
                    tracing::warn!(host = %self.url.host(), "heartbeat ping failed: {why}");
                }
            }
        }
    }
}
