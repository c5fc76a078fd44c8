//! Delivery of one webhook (`notify.webhooks[i]`): a queue and a task that POSTs each event's
//! JSON body, retrying with backoff.
//!
//! Invariants:
//! - Replication never waits for a webhook: [`Webhook::send`] never blocks; when the queue is
//!   full the event is dropped, logged and counted.
//! - A URL is named by scheme and host only and header values never leave the request: both
//!   may be credentials (see [`crate::config::notify`]).
//! - Every event handed to a webhook ends as one of `delivered`, `failed` (every attempt
//!   failed) or `dropped` (not queued) in `replicad_webhook_deliveries_total{webhook,result}`,
//!   except those still queued when the exit stops waiting (logged then).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use tokio::sync::mpsc;

use crate::config::notify::{NotifyEvent, WebhookConfig};

/// Events waiting for delivery per webhook; more are dropped.
const QUEUE: usize = 256;
/// Pause after the first failed attempt, doubled after each one up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The webhook counters, shared by every webhook of a daemon.
#[derive(Clone)]
pub struct WebhookMetrics {
    deliveries: IntCounterVec,
    attempt_errors: IntCounterVec,
}

impl WebhookMetrics {
    /// Registers the counters in `registry` (or finds them there).
    pub fn register(registry: &Registry) -> WebhookMetrics {
        let deliveries = IntCounterVec::new(
            Opts::new(
                "replicad_webhook_deliveries_total",
                "Webhook events by outcome: delivered, failed (every attempt failed), dropped (queue full).",
            ),
            &["webhook", "result"],
        )
        .expect("static metric definition is valid");
        let attempt_errors = IntCounterVec::new(
            Opts::new(
                "replicad_webhook_attempt_errors_total",
                "Webhook calls that failed (each retry counts).",
            ),
            &["webhook"],
        )
        .expect("static metric definition is valid");
        WebhookMetrics {
            deliveries: register(registry, deliveries),
            attempt_errors: register(registry, attempt_errors),
        }
    }
}

/// Registers `c` in `registry`. A second Store in one process (tests) finds the name taken:
/// its counts then stay out of the registry, which is harmless.
pub(crate) fn register(registry: &Registry, c: IntCounterVec) -> IntCounterVec {
    let _ = registry.register(Box::new(c.clone()));
    c
}

/// One webhook's sending end.
pub struct Webhook {
    name: String,
    events: Vec<NotifyEvent>,
    tx: mpsc::Sender<Arc<serde_json::Value>>,
    metrics: WebhookMetrics,
    /// Events are being dropped (logged once per streak).
    dropping: AtomicBool,
}

impl Webhook {
    /// Starts the delivery task of `cfg`; it ends once every [`Webhook`] of it is dropped and
    /// its queue is empty.
    pub fn start(
        cfg: WebhookConfig,
        http: reqwest::Client,
        metrics: WebhookMetrics,
    ) -> (Webhook, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let hook = Webhook {
            name: cfg.name.clone(),
            events: cfg.events.clone(),
            tx,
            metrics: metrics.clone(),
            dropping: AtomicBool::new(false),
        };
        let task = tokio::spawn(deliver_all(cfg, http, metrics, rx));
        (hook, task)
    }

    /// Queues `body` when this webhook takes `event`; never waits.
    pub fn send(&self, event: NotifyEvent, body: &Arc<serde_json::Value>) {
        if !self.events.contains(&event) {
            return;
        }
        let why = match self.tx.try_send(body.clone()) {
            Ok(()) => {
                self.dropping.store(false, Ordering::Relaxed);
                return;
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                format!("queue full ({QUEUE} events waiting)")
            }
            Err(mpsc::error::TrySendError::Closed(_)) => "its delivery task has ended".to_string(),
        };
        self.metrics
            .deliveries
            .with_label_values(&[self.name.as_str(), "dropped"])
            .inc();
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                webhook = %self.name,
                event = event.as_str(),
                "webhook {}: event dropped (and the next ones until one is queued; all counted)",
                why
            );
        }
    }
}

async fn deliver_all(
    cfg: WebhookConfig,
    http: reqwest::Client,
    metrics: WebhookMetrics,
    mut rx: mpsc::Receiver<Arc<serde_json::Value>>,
) {
    let body_of = |v: &serde_json::Value| serde_json::to_vec(v).unwrap_or_default();
    while let Some(event) = rx.recv().await {
        let body = body_of(&event);
        let kind = event["event"].as_str().unwrap_or("?").to_string();
        let result = deliver(&cfg, &http, &metrics, &body, &kind).await;
        metrics
            .deliveries
            .with_label_values(&[cfg.name.as_str(), result])
            .inc();
    }
}

/// POSTs `body` until it is accepted (2xx), refused for good (4xx other than 408 and 429), or
/// the retries are spent. Returns the outcome's label.
async fn deliver(
    cfg: &WebhookConfig,
    http: &reqwest::Client,
    metrics: &WebhookMetrics,
    body: &[u8],
    event: &str,
) -> &'static str {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    for (k, v) in &cfg.headers {
        // Checked when the config was read; a value is marked sensitive (kept out of debug
        // output and HTTP/2 compression tables).
        if let (Ok(name), Ok(mut value)) = (
            reqwest::header::HeaderName::from_bytes(k.as_bytes()),
            reqwest::header::HeaderValue::from_str(&v.0),
        ) {
            value.set_sensitive(true);
            headers.insert(name, value);
        }
    }
    let mut pause = FIRST_PAUSE;
    for attempt in 0..=cfg.retries {
        let req = http
            .post(cfg.url.expose())
            .timeout(cfg.timeout)
            .headers(headers.clone())
            .body(body.to_vec());
        let (error, retry) = match req.send().await {
            Ok(r) if r.status().is_success() => {
                if attempt > 0 {
                    tracing::info!(webhook = %cfg.name, event, attempt = attempt + 1, "webhook delivered after retrying");
                }
                return "delivered";
            }
            Ok(r) if r.status().is_redirection() => (
                format!(
                    "the server answered HTTP {} (redirects are not followed: configure the final URL)",
                    r.status().as_u16()
                ),
                false,
            ),
            Ok(r) => {
                let code = r.status();
                let retry = code.is_server_error()
                    || code == reqwest::StatusCode::REQUEST_TIMEOUT
                    || code == reqwest::StatusCode::TOO_MANY_REQUESTS;
                (format!("the server answered HTTP {}", code.as_u16()), retry)
            }
            // reqwest's error names the URL: only its kind is kept.
            Err(e) if e.is_timeout() => (format!("no answer within {:?}", cfg.timeout), true),
            Err(e) if e.is_connect() => ("cannot connect".to_string(), true),
            Err(_) => ("the request failed".to_string(), true),
        };
        metrics
            .attempt_errors
            .with_label_values(&[cfg.name.as_str()])
            .inc();
        let last = attempt == cfg.retries || !retry;
        tracing::warn!(
            webhook = %cfg.name,
            host = %cfg.url.host(),
            event,
            attempt = attempt + 1,
            of = cfg.retries + 1,
            "webhook call failed: {error}{}",
            if last { "; event not delivered" } else { "; retrying" }
        );
        if last {
            break;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
    "failed"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::notify::NotifyUrl;

    /// A receiver that accepts connections and never answers: the queue fills, and
    /// `send` still returns at once, dropping and counting what does not fit.
    #[tokio::test]
    async fn a_stuck_receiver_never_blocks_the_sender_and_drops_are_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = listener.accept().await {
                conns.push(c);
            }
        });
        let registry = Registry::new();
        let metrics = WebhookMetrics::register(&registry);
        let cfg = WebhookConfig {
            name: "stuck".into(),
            url: NotifyUrl::parse(&format!("http://{addr}/hook")).unwrap(),
            headers: Vec::new(),
            events: NotifyEvent::ALL.to_vec(),
            timeout: Duration::from_secs(30),
            retries: 0,
        };
        let (hook, task) = Webhook::start(cfg, reqwest::Client::new(), metrics.clone());
        let body = Arc::new(serde_json::json!({"event": "reseed"}));
        let events = QUEUE + 50;
        for _ in 0..events {
            hook.send(NotifyEvent::Reseed, &body);
        }
        let dropped_of = || {
            metrics
                .deliveries
                .with_label_values(&["stuck", "dropped"])
                .get()
        };
        let dropped = dropped_of();
        // An event the webhook does not take is not even offered to the full queue.
        let only_stop = Webhook {
            events: vec![NotifyEvent::Stop],
            ..hook
        };
        only_stop.send(NotifyEvent::Reseed, &body);
        assert_eq!(dropped_of(), dropped);
        only_stop.send(NotifyEvent::Stop, &body);
        assert_eq!(dropped_of(), dropped + 1);
        // One event may be in the delivery task's hands, the queue holds QUEUE.
        assert!(
            (events - QUEUE - 1..=events - QUEUE).contains(&(dropped as usize)),
            "{dropped} dropped of {events}"
        );
        task.abort();
        held.abort();
    }
}
