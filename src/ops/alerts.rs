//! Notifications to the outside (`notify` in the config): webhook events when protection
//! changes, and the health-gated heartbeat ping of Litestream's `heartbeat-url`.
//!
//! - Events come from the state `/readyz` judges by: every second the databases' and
//!   replicas' health cells, lag and counters are compared with what was last seen
//!   (`diff`). A failure is reported once it has lasted `max-lag` (the readiness grace: a
//!   network blip flaps nothing), a replica more than `max-lag` behind counts as failing
//!   even when its uploads report no error, and a recovery is reported only after its
//!   failure was. A lost lease is one `lease-lost` event (the replica stopped for good). A
//!   re-seed or a failed verify is reported whenever its counter moves.
//! - The heartbeat GET goes out every `heartbeat-interval`, and only while `/readyz` would say
//!   ready ([`crate::ops::heartbeat`]).
//! - `start` is sent once the databases are open, `stop` after the shutdown drain with what
//!   it left unprotected; the exit waits for queued events at most [`FINISH_WAIT`].
//!
//! Nothing here runs when `notify` is not configured.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::notify::{NotifyConfig, NotifyEvent};
use crate::daemon::Store;
use crate::daemon::registry::{DbHandle, DbRegistry};
use crate::ops::heartbeat::Ping;
use crate::ops::webhook::{Webhook, WebhookMetrics};
use crate::replicate::health::Problem;

/// How often the health cells are compared with what was last seen.
const POLL: Duration = Duration::from_secs(1);
/// How long the exit waits for queued webhook events.
pub const FINISH_WAIT: Duration = Duration::from_secs(10);

/// The running notifications of a daemon.
pub struct Alerts {
    hooks: Arc<Vec<Webhook>>,
    deliveries: Vec<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
    host: Option<String>,
}

impl Alerts {
    /// Starts the webhooks and the heartbeat of `cfg` for `store` and sends `start`; `None`
    /// when nothing is configured.
    pub fn start(cfg: &NotifyConfig, store: &Store, max_lag: Duration) -> Option<Alerts> {
        if !cfg.is_enabled() {
            return None;
        }
        // A redirect would turn a POST into a GET and carry custom headers to another host.
        let http = match reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                // Loud: the operator asked to be told, and will not be.
                tracing::error!(error = %e, "notify: cannot build the HTTP client: no webhook or heartbeat will be sent");
                return None;
            }
        };
        let metrics = WebhookMetrics::register(store.prometheus());
        let mut deliveries = Vec::new();
        let hooks: Vec<Webhook> = cfg
            .webhooks
            .iter()
            .map(|w| {
                tracing::info!(webhook = %w.name, host = %w.url.host(), events = ?w.events.iter().map(|e| e.as_str()).collect::<Vec<_>>(), "notify: webhook");
                let (hook, task) = Webhook::start(w.clone(), http.clone(), metrics.clone());
                deliveries.push(task);
                hook
            })
            .collect();
        let alerts = Alerts {
            hooks: Arc::new(hooks),
            deliveries,
            tasks: Vec::new(),
            stop: CancellationToken::new(),
            host: hostname(),
        };
        let registry = store.registry().clone();
        let dbs = registry.snapshot().len();
        alerts.emit(
            NotifyEvent::Start,
            serde_json::json!({ "databases": dbs, "version": env!("CARGO_PKG_VERSION") }),
        );
        let mut alerts = alerts;
        if !alerts.hooks.is_empty() {
            let watch = Watch {
                registry: registry.clone(),
                hooks: alerts.hooks.clone(),
                host: alerts.host.clone(),
                grace: max_lag,
                since_ms: store.started_ms(),
                seen: Seen::default(),
            };
            alerts
                .tasks
                .push(tokio::spawn(watch.run(alerts.stop.clone())));
        }
        if let Some(url) = &cfg.heartbeat_url {
            tracing::info!(host = %url.host(), interval = ?cfg.heartbeat_interval, "notify: heartbeat ping while ready");
            let ping = Ping {
                url: url.clone(),
                interval: cfg.heartbeat_interval,
                registry,
                max_lag,
                since_ms: store.started_ms(),
                http,
                pings: Ping::register(store.prometheus()),
            };
            alerts
                .tasks
                .push(tokio::spawn(ping.run(alerts.stop.clone())));
        }
        Some(alerts)
    }

    fn emit(&self, event: NotifyEvent, fields: serde_json::Value) {
        send_all(&self.hooks, self.host.as_deref(), event, fields);
    }

    /// Stops the watch and the heartbeat, sends `stop` with what the shutdown left
    /// unprotected, and waits at most [`FINISH_WAIT`] for the queued events, or until `abort`
    /// completes (another signal).
    pub async fn finish(mut self, unprotected: &[String], abort: impl Future<Output = ()>) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        let error = (!unprotected.is_empty()).then(|| {
            format!(
                "shutdown left {} thing(s) not fully protected: {}",
                unprotected.len(),
                unprotected.join("; ")
            )
        });
        self.emit(
            NotifyEvent::Stop,
            serde_json::json!({ "error": error, "unprotected": unprotected }),
        );
        let Alerts {
            hooks, deliveries, ..
        } = self;
        // The last senders: the delivery tasks end once their queues are empty.
        drop(hooks);
        let all = futures_util::future::join_all(deliveries);
        tokio::select! {
            _ = all => {}
            _ = tokio::time::sleep(FINISH_WAIT) => tracing::warn!(
                "notify: webhook events still undelivered after {FINISH_WAIT:?}: given up at exit"
            ),
            _ = abort => tracing::warn!("notify: signal received: undelivered webhook events given up"),
        }
    }
}

/// Queues one body of `event` for every webhook that takes it.
fn send_all(hooks: &[Webhook], host: Option<&str>, event: NotifyEvent, fields: serde_json::Value) {
    let body = Arc::new(body(event, host, fields));
    for h in hooks {
        h.send(event, &body);
    }
}

/// The JSON body of `event`: its name, the time, the host, then `fields`.
fn body(event: NotifyEvent, host: Option<&str>, fields: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::json!({
        "event": event.as_str(),
        "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        "host": host,
    });
    if let (Some(out), serde_json::Value::Object(more)) = (v.as_object_mut(), fields) {
        out.extend(more);
    }
    v
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// What one replica looked like at a poll.
#[derive(Clone, Debug)]
struct ReplicaView {
    name: String,
    location: Arc<str>,
    problem: Option<Problem>,
    lease_lost: bool,
    reseeds: u64,
    /// The last periodic verify: (1 ok / 0 failed / -1 never run, TXID it restored).
    verify: (i64, i64),
    remote_txid: u64,
    /// Why it is more than `max-lag` behind its database.
    behind: Option<String>,
}

impl Default for ReplicaView {
    fn default() -> Self {
        ReplicaView {
            name: String::new(),
            location: Arc::from(""),
            problem: None,
            lease_lost: false,
            reseeds: 0,
            verify: (-1, 0),
            remote_txid: 0,
            behind: None,
        }
    }
}

/// What one database looked like at a poll.
#[derive(Clone, Debug)]
struct DbView {
    path: PathBuf,
    problem: Option<Problem>,
    /// A tick has completed without error (else a problem is reported at once, as
    /// `/readyz` does).
    synced: bool,
    txid: u64,
    replicas: Vec<ReplicaView>,
}

impl Default for DbView {
    fn default() -> Self {
        DbView {
            path: PathBuf::new(),
            problem: None,
            synced: true,
            txid: 0,
            replicas: Vec::new(),
        }
    }
}

/// `d` as seen now; a replica lagging by `max_lag` or more is `behind` (as `/readyz` says).
fn view(d: &DbHandle, max_lag: Duration, since_ms: i64) -> DbView {
    let pos = *d.pos.borrow();
    DbView {
        path: d.path.clone(),
        problem: d.stats.health.problem(),
        synced: d.sync.synced() > 0,
        txid: d.stats.txid.load(Ordering::Relaxed),
        replicas: d
            .replicas
            .iter()
            .map(|(name, r)| {
                let behind = crate::ops::metrics::behind(pos, r, max_lag, since_ms);
                ReplicaView {
                    name: name.clone(),
                    location: r.location.clone(),
                    problem: r.health.problem(),
                    lease_lost: r.lease_lost.load(Ordering::Relaxed),
                    reseeds: r.reseeds.load(Ordering::Relaxed),
                    verify: (r.counters.verify_ok.get(), r.counters.verify_txid.get()),
                    remote_txid: r.remote_txid.load(Ordering::Relaxed),
                    behind,
                }
            })
            .collect(),
    }
}

/// What was last reported.
#[derive(Default)]
struct Seen {
    dbs: HashMap<PathBuf, DbSeen>,
    replicas: HashMap<(PathBuf, String), ReplicaSeen>,
}

#[derive(Clone, Copy, Default)]
struct DbSeen {
    /// When the reported failure started (`None`: none reported).
    failing: Option<i64>,
    /// Since when (ms) it has been seen without a completed sync.
    unsynced_since: Option<i64>,
}

#[derive(Clone)]
struct ReplicaSeen {
    /// Where it replicates, for an event after its database is gone.
    location: Arc<str>,
    /// When the reported failure started (`None`: none reported).
    failing: Option<i64>,
    lease_lost: bool,
    reseeds: u64,
    verify: (i64, i64),
    /// Since when (ms) it has been seen `behind`.
    behind_since: Option<i64>,
}

impl Default for ReplicaSeen {
    fn default() -> Self {
        ReplicaSeen {
            location: Arc::from(""),
            failing: None,
            behind_since: None,
            lease_lost: false,
            reseeds: 0,
            verify: (-1, 0),
        }
    }
}

/// The task that turns health changes into events.
struct Watch {
    registry: DbRegistry,
    hooks: Arc<Vec<Webhook>>,
    host: Option<String>,
    grace: Duration,
    /// When the Store started: the stand-in age of a replica that has uploaded nothing.
    since_ms: i64,
    seen: Seen,
}

impl Watch {
    async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let views: Vec<DbView> = self
                .registry
                .snapshot()
                .iter()
                .map(|d| view(d, self.grace, self.since_ms))
                .collect();
            let events = diff(
                &mut self.seen,
                &views,
                self.grace,
                crate::util::clock::steady_ms(),
            );
            for (event, fields) in events {
                tracing::info!(event = event.as_str(), "notify: event");
                send_all(&self.hooks, self.host.as_deref(), event, fields);
            }
        }
    }
}

/// The events between `seen` and `views` at `now_ms`; updates `seen`. Databases that are gone
/// are forgotten.
fn diff(
    seen: &mut Seen,
    views: &[DbView],
    grace: Duration,
    now_ms: i64,
) -> Vec<(NotifyEvent, serde_json::Value)> {
    let mut out = Vec::new();
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    for d in views {
        let db = d.path.display().to_string();
        let s = seen.dbs.entry(d.path.clone()).or_default();
        s.unsynced_since = match d.synced {
            true => None,
            false => Some(s.unsynced_since.unwrap_or(now_ms)),
        };
        // Failing as `/readyz` judges: an error before the first sync, or lasting max-lag;
        // and a first sync that has not completed in max-lag (a start that hangs sets no
        // error, yet nothing of the database is captured).
        let failure = match (&d.problem, s.unsynced_since) {
            (Some(p), _) if !d.synced || p.reportable(grace, now_ms) => {
                Some((p.reason.clone(), p.since_ms))
            }
            (None, Some(t)) if now_ms.saturating_sub(t) >= grace_ms => {
                Some(("first sync not completed".to_string(), t))
            }
            _ => None,
        };
        match (failure, s.failing) {
            (Some((reason, since)), None) => {
                s.failing = Some(since);
                out.push((
                    NotifyEvent::DatabaseFailing,
                    serde_json::json!({ "db": db, "error": reason, "since": rfc3339(since), "txid": d.txid }),
                ));
            }
            (None, Some(since)) if d.problem.is_none() && d.synced => {
                s.failing = None;
                out.push((
                    NotifyEvent::DatabaseRecovered,
                    serde_json::json!({ "db": db, "since": rfc3339(since), "txid": d.txid }),
                ));
            }
            _ => {}
        }
        for r in &d.replicas {
            let s = seen
                .replicas
                .entry((d.path.clone(), r.name.clone()))
                .or_default();
            s.location = r.location.clone();
            let base = |error: Option<&str>| {
                serde_json::json!({
                    "db": db, "replica": r.name, "replica_url": &*r.location, "error": error,
                    "txid": d.txid, "remote_txid": r.remote_txid,
                })
            };
            let with = |mut v: serde_json::Value, k: &str, x: serde_json::Value| {
                v[k] = x;
                v
            };
            // Failing as `/readyz` judges: an error lasting max-lag, or max-lag behind. A lost
            // lease is its own event (the replica stopped for good).
            // Lag is measured between data timestamps: right after a commit that follows a
            // quiet spell, a replica is "behind" by the spell for a moment. It counts once it
            // has lasted max-lag by the clock.
            s.behind_since = match r.behind {
                Some(_) => Some(s.behind_since.unwrap_or(now_ms)),
                None => None,
            };
            let failure = match (&r.problem, &r.behind, s.behind_since) {
                _ if r.lease_lost => None,
                (Some(p), _, _) if p.reportable(grace, now_ms) => {
                    Some((p.reason.clone(), p.since_ms))
                }
                (_, Some(why), Some(t)) if now_ms.saturating_sub(t) >= grace_ms => {
                    Some((why.clone(), t))
                }
                _ => None,
            };
            let healthy = r.problem.is_none() && r.behind.is_none() && !r.lease_lost;
            match (failure, s.failing) {
                (Some((reason, since)), None) => {
                    s.failing = Some(since);
                    out.push((
                        NotifyEvent::ReplicaFailing,
                        with(base(Some(&reason)), "since", rfc3339(since).into()),
                    ));
                }
                (None, Some(since)) if healthy => {
                    s.failing = None;
                    out.push((
                        NotifyEvent::ReplicaRecovered,
                        with(base(None), "since", rfc3339(since).into()),
                    ));
                }
                _ => {}
            }
            if r.lease_lost && !s.lease_lost {
                out.push((
                    NotifyEvent::LeaseLost,
                    base(Some(
                        "another instance took this replica's single-writer lease: this replica stopped uploading",
                    )),
                ));
            }
            s.lease_lost = r.lease_lost;
            if r.reseeds > s.reseeds {
                out.push((
                    NotifyEvent::Reseed,
                    with(base(None), "reseeds", (r.reseeds - s.reseeds).into()),
                ));
            }
            s.reseeds = r.reseeds;
            if r.verify != s.verify && r.verify.0 == 0 {
                let why = format!(
                    "the periodic verify of TXID {} failed (see the log for the cause)",
                    r.verify.1
                );
                out.push((NotifyEvent::VerifyFailed, base(Some(&why))));
            }
            s.verify = r.verify;
        }
    }
    // A database no longer replicated (removed from the config, or its file by discovery) is
    // forgotten; a failure reported for it is closed, so that an alert opened by the event
    // does not stay open for good. `removed` says why it ended.
    let present: HashSet<&PathBuf> = views.iter().map(|d| &d.path).collect();
    for ((path, name), r) in &seen.replicas {
        if let (false, Some(since)) = (present.contains(path), r.failing) {
            out.push((
                NotifyEvent::ReplicaRecovered,
                serde_json::json!({ "db": path.display().to_string(), "replica": name, "replica_url": &*r.location, "error": null, "since": rfc3339(since), "removed": true }),
            ));
        }
    }
    for (path, d) in &seen.dbs {
        if let (false, Some(since)) = (present.contains(path), d.failing) {
            out.push((
                NotifyEvent::DatabaseRecovered,
                serde_json::json!({ "db": path.display().to_string(), "since": rfc3339(since), "removed": true }),
            ));
        }
    }
    seen.dbs.retain(|p, _| present.contains(p));
    seen.replicas.retain(|(p, _), _| present.contains(p));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(since_ms: i64) -> Option<Problem> {
        Some(Problem {
            reason: "cannot reach the server".into(),
            since_ms,
            steady_ms: since_ms,
            stopped: false,
        })
    }

    fn one(replica: ReplicaView) -> Vec<DbView> {
        vec![DbView {
            path: PathBuf::from("/data/app.db"),
            txid: 7,
            replicas: vec![ReplicaView {
                name: "s3".into(),
                location: "s3://bucket/app".into(),
                ..replica
            }],
            ..DbView::default()
        }]
    }

    fn names(events: &[(NotifyEvent, serde_json::Value)]) -> Vec<&'static str> {
        events.iter().map(|(e, _)| e.as_str()).collect()
    }

    #[test]
    fn a_failure_is_reported_after_the_grace_and_its_recovery_once() {
        let grace = Duration::from_secs(60);
        let mut seen = Seen::default();
        let failing = ReplicaView {
            problem: problem(1_000),
            ..Default::default()
        };
        assert!(diff(&mut seen, &one(failing.clone()), grace, 30_000).is_empty());
        let ev = diff(&mut seen, &one(failing.clone()), grace, 61_000);
        assert_eq!(names(&ev), ["replica-failing"]);
        assert_eq!(ev[0].1["error"], "cannot reach the server");
        assert_eq!(ev[0].1["replica_url"], "s3://bucket/app");
        assert_eq!(ev[0].1["db"], "/data/app.db");
        assert!(diff(&mut seen, &one(failing), grace, 62_000).is_empty());
        let ev = diff(&mut seen, &one(ReplicaView::default()), grace, 63_000);
        assert_eq!(names(&ev), ["replica-recovered"]);
        assert!(diff(&mut seen, &one(ReplicaView::default()), grace, 64_000).is_empty());
    }

    #[test]
    fn a_blip_shorter_than_the_grace_says_nothing() {
        let grace = Duration::from_secs(60);
        let mut seen = Seen::default();
        let blip = ReplicaView {
            problem: problem(1_000),
            ..Default::default()
        };
        assert!(diff(&mut seen, &one(blip), grace, 2_000).is_empty());
        assert!(diff(&mut seen, &one(ReplicaView::default()), grace, 3_000).is_empty());
    }

    #[test]
    fn lease_loss_reseeds_and_failed_verifies_are_reported_when_they_change() {
        let grace = Duration::from_secs(60);
        let mut seen = Seen::default();
        let ok = ReplicaView {
            verify: (1, 5),
            ..Default::default()
        };
        assert!(diff(&mut seen, &one(ok), grace, 1).is_empty());
        // A lost lease also stops the replica's health cell: one event, not two.
        let changed = ReplicaView {
            verify: (0, 6),
            reseeds: 2,
            lease_lost: true,
            problem: Some(Problem {
                reason: "another instance took the lease".into(),
                since_ms: 2,
                steady_ms: 2,
                stopped: true,
            }),
            ..Default::default()
        };
        let ev = diff(&mut seen, &one(changed.clone()), grace, 2);
        assert_eq!(names(&ev), ["lease-lost", "reseed", "verify-failed"]);
        assert_eq!(ev[1].1["reseeds"], 2);
        assert!(ev[2].1["error"].as_str().unwrap().contains("TXID 6"));
        assert!(diff(&mut seen, &one(changed.clone()), grace, 3).is_empty());
        let again = ReplicaView {
            verify: (0, 9),
            reseeds: 3,
            ..changed.clone()
        };
        assert_eq!(
            names(&diff(&mut seen, &one(again), grace, 4)),
            ["reseed", "verify-failed"]
        );
    }

    #[test]
    fn a_database_failure_and_recovery() {
        let grace = Duration::ZERO;
        let mut seen = Seen::default();
        let mut views = one(ReplicaView::default());
        views[0].problem = problem(5);
        let ev = diff(&mut seen, &views, grace, 5);
        assert_eq!(names(&ev), ["database-failing"]);
        views[0].problem = None;
        assert_eq!(
            names(&diff(&mut seen, &views, grace, 6)),
            ["database-recovered"]
        );
        // A database that is gone is forgotten.
        assert!(diff(&mut seen, &[], grace, 7).is_empty());
        assert!(seen.dbs.is_empty() && seen.replicas.is_empty());
    }

    #[test]
    fn a_replica_behind_by_max_lag_is_failing_without_an_error() {
        let grace = Duration::from_secs(60);
        let mut seen = Seen::default();
        let stuck = ReplicaView {
            behind: Some("3 TXIDs and 61.0s behind".into()),
            ..Default::default()
        };
        // Seen behind at 100 s: a failure once that has lasted max-lag by the clock.
        assert!(diff(&mut seen, &one(stuck.clone()), grace, 100_000).is_empty());
        assert!(diff(&mut seen, &one(stuck.clone()), grace, 159_000).is_empty());
        let ev = diff(&mut seen, &one(stuck), grace, 160_000);
        assert_eq!(names(&ev), ["replica-failing"]);
        assert_eq!(ev[0].1["error"], "3 TXIDs and 61.0s behind");
        assert_eq!(ev[0].1["since"], rfc3339(100_000));
        let ev = diff(&mut seen, &one(ReplicaView::default()), grace, 161_000);
        assert_eq!(names(&ev), ["replica-recovered"]);
    }

    #[test]
    fn a_database_that_never_synced_is_failing_at_once() {
        let mut seen = Seen::default();
        let mut views = one(ReplicaView::default());
        views[0].problem = problem(1_000);
        views[0].synced = false;
        let ev = diff(&mut seen, &views, Duration::from_secs(60), 1_001);
        assert_eq!(names(&ev), ["database-failing"]);
    }

    #[test]
    fn a_first_sync_that_never_completes_is_failing_after_the_grace() {
        let grace = Duration::from_secs(60);
        let mut seen = Seen::default();
        let mut views = one(ReplicaView::default());
        views[0].synced = false;
        // No error anywhere: a start that hangs, first seen at 10 s.
        assert!(diff(&mut seen, &views, grace, 10_000).is_empty());
        assert!(diff(&mut seen, &views, grace, 69_000).is_empty());
        let ev = diff(&mut seen, &views, grace, 70_000);
        assert_eq!(names(&ev), ["database-failing"]);
        assert_eq!(ev[0].1["error"], "first sync not completed");
        assert_eq!(ev[0].1["since"], rfc3339(10_000));
        assert!(diff(&mut seen, &views, grace, 71_000).is_empty());
        views[0].synced = true;
        assert_eq!(
            names(&diff(&mut seen, &views, grace, 72_000)),
            ["database-recovered"]
        );
        // An error before any sync that clears while the first sync is still to come: no
        // recovery until it completes.
        let mut seen = Seen::default();
        views[0].synced = false;
        views[0].problem = problem(1_000);
        assert_eq!(
            names(&diff(&mut seen, &views, grace, 1_000)),
            ["database-failing"]
        );
        views[0].problem = None;
        assert!(diff(&mut seen, &views, grace, 2_000).is_empty());
        views[0].synced = true;
        assert_eq!(
            names(&diff(&mut seen, &views, grace, 3_000)),
            ["database-recovered"]
        );
    }

    #[test]
    fn a_database_removed_while_failing_closes_its_failures() {
        let grace = Duration::ZERO;
        let mut seen = Seen::default();
        let mut views = one(ReplicaView {
            problem: problem(5),
            ..Default::default()
        });
        views[0].problem = problem(5);
        assert_eq!(
            names(&diff(&mut seen, &views, grace, 5)),
            ["database-failing", "replica-failing"]
        );
        let ev = diff(&mut seen, &[], grace, 6);
        assert_eq!(names(&ev), ["replica-recovered", "database-recovered"]);
        assert!(ev.iter().all(|(_, v)| v["removed"] == true));
        assert_eq!(ev[0].1["replica_url"], "s3://bucket/app");
        assert_eq!(ev[1].1["db"], "/data/app.db");
        assert!(diff(&mut seen, &[], grace, 7).is_empty());
        assert!(seen.dbs.is_empty() && seen.replicas.is_empty());
    }
}
