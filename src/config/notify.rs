//! The `notify` map: webhooks called when protection changes, and the health-gated heartbeat
//! ping ([`crate::ops::alerts`] sends them).
//!
//! Webhook URLs and heartbeat URLs often carry a token in their path (Slack, healthchecks.io),
//! and headers carry credentials: `Debug` shows only a URL's scheme and host, never a header
//! value, and [`NotifyUrl::host`] is what logs and errors name.

use std::fmt;
use std::time::Duration;

use crate::storage::s3::Secret;

/// Default of `notify.heartbeat-interval` (Litestream's default too).
pub const DEFAULT_HEARTBEAT_PING_INTERVAL: Duration = Duration::from_secs(300);
/// Default of a webhook's `timeout`: how long one attempt may take.
pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of a webhook's `retries`: attempts after the first one fails.
pub const DEFAULT_WEBHOOK_RETRIES: u32 = 5;

/// What a webhook can be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotifyEvent {
    /// The daemon started: every database is open.
    Start,
    /// The daemon stopped; the body says whether everything was uploaded.
    Stop,
    /// A database's syncs have been failing for `max-lag`.
    DatabaseFailing,
    /// A database that was reported failing syncs again.
    DatabaseRecovered,
    /// A replica's uploads have been failing for `max-lag`, or it stopped for good.
    ReplicaFailing,
    /// A replica that was reported failing uploads again.
    ReplicaRecovered,
    /// The periodic verify of a replica failed.
    VerifyFailed,
    /// Another instance took a replica's single-writer lease: the replica stopped.
    LeaseLost,
    /// A replica was seeded again with a snapshot (it was emptied, wiped or diverged).
    Reseed,
}

impl NotifyEvent {
    /// Every event, in the order the docs list them.
    pub const ALL: [NotifyEvent; 9] = [
        NotifyEvent::Start,
        NotifyEvent::Stop,
        NotifyEvent::DatabaseFailing,
        NotifyEvent::DatabaseRecovered,
        NotifyEvent::ReplicaFailing,
        NotifyEvent::ReplicaRecovered,
        NotifyEvent::VerifyFailed,
        NotifyEvent::LeaseLost,
        NotifyEvent::Reseed,
    ];

    /// The name in the config file and in the JSON body.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Start => "start",
            NotifyEvent::Stop => "stop",
            NotifyEvent::DatabaseFailing => "database-failing",
            NotifyEvent::DatabaseRecovered => "database-recovered",
            NotifyEvent::ReplicaFailing => "replica-failing",
            NotifyEvent::ReplicaRecovered => "replica-recovered",
            NotifyEvent::VerifyFailed => "verify-failed",
            NotifyEvent::LeaseLost => "lease-lost",
            NotifyEvent::Reseed => "reseed",
        }
    }

    /// The event named `name`, or an error listing the names.
    pub fn parse(name: &str) -> Result<NotifyEvent, String> {
        NotifyEvent::ALL
            .into_iter()
            .find(|e| e.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = NotifyEvent::ALL.iter().map(|e| e.as_str()).collect();
                format!("unknown event {name:?}: use {}", names.join(", "))
            })
    }
}

/// An http(s) URL that may hold a token: shown by scheme and host only.
#[derive(Clone, PartialEq, Eq)]
pub struct NotifyUrl(pub Secret);

impl NotifyUrl {
    /// Parses `s`: http or https, a host, no `user:password@` (use `headers`).
    pub fn parse(s: &str) -> Result<NotifyUrl, String> {
        let u = url::Url::parse(s.trim()).map_err(|e| format!("not a URL ({e})"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(format!(
                "scheme {}: use an http:// or https:// URL",
                u.scheme()
            ));
        }
        if u.host_str().is_none_or(str::is_empty) {
            return Err("the URL has no host".into());
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(
                "credentials in the URL: put them in `headers` (an Authorization header)".into(),
            );
        }
        Ok(NotifyUrl(Secret(u.to_string())))
    }

    /// The whole URL, for the request only.
    pub fn expose(&self) -> &str {
        &self.0.0
    }

    /// `scheme://host[:port]`: what logs and errors name (the path may be a token).
    pub fn host(&self) -> String {
        match url::Url::parse(&self.0.0) {
            Ok(u) => {
                let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
                format!("{}://{}{port}", u.scheme(), u.host_str().unwrap_or(""))
            }
            Err(_) => "<invalid URL>".into(),
        }
    }
}

impl fmt::Debug for NotifyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}/<redacted>\"", self.host())
    }
}

/// One entry of `notify.webhooks`.
#[derive(Clone, Debug, PartialEq)]
pub struct WebhookConfig {
    /// Key `name` (default `webhook-N`, N from 0 in file order): the metrics label and what
    /// the log names.
    pub name: String,
    /// Key `url` (required): where the JSON body is POSTed.
    pub url: NotifyUrl,
    /// Key `headers` (default none): extra request headers, e.g. `Authorization`
    /// (`${VAR}` expansion keeps the value out of the file).
    pub headers: Vec<(String, Secret)>,
    /// Key `events` (default every event): which events are sent.
    pub events: Vec<NotifyEvent>,
    /// Key `timeout` (default 10s, > 0): how long one attempt may take.
    pub timeout: Duration,
    /// Key `retries` (default 5, at most 20): attempts after a failed one, 1s apart doubling
    /// up to 60s.
    pub retries: u32,
}

/// The `notify` map (top level only).
#[derive(Clone, Debug, PartialEq)]
pub struct NotifyConfig {
    /// Key `heartbeat-url` (default off; Litestream's top-level `heartbeat-url` too): a GET
    /// every `heartbeat-interval`, sent only while the daemon is ready (`/readyz`).
    pub heartbeat_url: Option<NotifyUrl>,
    /// Key `heartbeat-interval` (default 5m, at least 1s): the ping interval. At the top level
    /// of a file that has a top-level `heartbeat-url`, Litestream's `heartbeat-interval`
    /// means this.
    pub heartbeat_interval: Duration,
    /// Key `webhooks` (default none).
    pub webhooks: Vec<WebhookConfig>,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            heartbeat_url: None,
            heartbeat_interval: DEFAULT_HEARTBEAT_PING_INTERVAL,
            webhooks: Vec::new(),
        }
    }
}

impl NotifyConfig {
    /// Whether anything is configured (else no task runs).
    pub fn is_enabled(&self) -> bool {
        self.heartbeat_url.is_some() || !self.webhooks.is_empty()
    }
}
