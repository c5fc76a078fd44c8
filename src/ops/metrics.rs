//! Prometheus exposition of a running Store: the per-replica counters the tasks count into
//! ([`crate::replicate::counters`]), plus collectors that read the databases' and replicas'
//! atomics ([`DbStats`](crate::replicate::db::DbStats), [`ReplicaStats`]) and the phase totals
//! ([`crate::util::phase`]) at scrape time, so the hot path never looks up a metric.
//!
//! Invariant: no label value is ever a secret: labels are database paths, replica names,
//! operation names and phase names only.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus::Registry;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use crate::daemon::Store;
use crate::daemon::registry::{DbHandle, DbRegistry};
use crate::replicate::db::DbPos;
use crate::replicate::replica::ReplicaStats;
use crate::util::phase::{Phase, PhaseStats};

/// The metrics of one Store, ready to render.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    started_ms: i64,
}

impl Metrics {
    /// The metrics of `store`: its registry, with the scrape-time collectors of its databases
    /// and of the phase totals registered the first time.
    pub fn of(store: &Store) -> Metrics {
        let registry = store.prometheus().clone();
        let started_ms = store.started_ms();
        for c in [
            Box::new(PhaseCollector::new(store.phases().clone())) as Box<dyn Collector>,
            Box::new(DbCollector::new(
                store.registry().clone(),
                started_ms,
                store.max_lag(),
            )),
        ] {
            match registry.register(c) {
                Ok(()) | Err(prometheus::Error::AlreadyReg) => {}
                Err(e) => tracing::warn!(error = %e, "registering metrics failed"),
            }
        }
        Metrics {
            registry,
            started_ms,
        }
    }

    /// When the Store started (ms since the epoch): the stand-in age of a replica that has
    /// uploaded nothing since (see [`Lag::seconds`]).
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    /// The registry, for scraping.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        out
    }
}

/// How far one replica is behind its database.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    /// Database TXID minus the replica's TXID (0 when the replica is current).
    pub txids: u64,
    /// How long the replica's copy has been stale, in seconds (0 when it is current): since
    /// the first segment it misses was cut. That is the newest segment when only one is
    /// missing, or the one being uploaded; before the upload of the next one begins, the
    /// larger of the time since the newest segment and the data between the newest segment
    /// and the replica's newest upload. So it grows on the clock while an upload is stuck,
    /// also once the database has gone quiet. Times before the process started (a segment
    /// staged by an earlier run, a replica that has uploaded nothing since) count from
    /// `since_ms`: a lower bound. Measured on the steady clock
    /// ([`crate::util::clock::steady_ms`]): a backward step of the wall clock does not hide a
    /// stuck upload (segment times are read when published or when their upload begins).
    pub seconds: f64,
    /// The replica's TXID these were computed from (one read, so a report shows a pair that
    /// agrees).
    pub remote: u64,
}

/// The lag of replica `r` behind database position `pos`.
pub fn replica_lag(pos: DbPos, r: &ReplicaStats, since_ms: i64) -> Lag {
    lag_at(pos, r, since_ms, crate::util::clock::steady_ms())
}

fn lag_at(pos: DbPos, r: &ReplicaStats, since_ms: i64, now_ms: i64) -> Lag {
    let remote = r.remote_txid.load(Ordering::Relaxed);
    let txids = pos.txid.0.saturating_sub(remote);
    if txids == 0 {
        return Lag {
            txids,
            seconds: 0.0,
            remote,
        };
    }
    let known = |ms: i64| ms.max(since_ms);
    let remote_ms = known(i64::try_from(r.remote_steady_ms.load(Ordering::Relaxed)).unwrap_or(0));
    let next_ms = i64::try_from(r.next_steady_ms.load(Ordering::Relaxed)).unwrap_or(0);
    let newest = known(pos.steady_ms);
    let ms = match txids {
        1 => now_ms.saturating_sub(newest),
        _ if next_ms > 0 => now_ms.saturating_sub(known(next_ms)),
        _ => newest
            .saturating_sub(remote_ms)
            .max(now_ms.saturating_sub(newest)),
    }
    .max(0);
    Lag {
        txids,
        seconds: ms as f64 / 1000.0,
        remote,
    }
}

/// Why replica `r` is not ready for lag: it misses TXIDs of `pos` and has been stale for
/// `max_lag` or more ([`Lag::seconds`]; `/readyz`, and the webhooks' `replica-failing`).
pub fn behind(pos: DbPos, r: &ReplicaStats, max_lag: Duration, since_ms: i64) -> Option<String> {
    let lag = replica_lag(pos, r, since_ms);
    (lag.txids > 0 && lag.seconds >= max_lag.as_secs_f64()).then(|| {
        format!(
            "{} txids and {:.3}s behind (max-lag {})",
            lag.txids,
            lag.seconds,
            humantime::format_duration(max_lag)
        )
    })
}

/// Whether replica `r` is protected now, as `/status` and `replicad_replica_protected` say:
/// it holds its lease, has no problem and is within `max_lag`.
pub fn is_protected(pos: DbPos, r: &ReplicaStats, max_lag: Duration, since_ms: i64) -> bool {
    unprotected(pos, r, max_lag, since_ms).is_none()
}

/// Why replica `r` is not protected now by [`is_protected`]'s rule (None: it is).
pub fn unprotected(
    pos: DbPos,
    r: &ReplicaStats,
    max_lag: Duration,
    since_ms: i64,
) -> Option<String> {
    match r.health.problem() {
        Some(p) => Some(p.reason),
        None if r.lease_lost.load(Ordering::Relaxed) => {
            Some("its single-writer lease was taken".to_string())
        }
        None => behind(pos, r, max_lag, since_ms),
    }
}

/// Why database `d` is not protected now (None: it is): a problem, or no sync completed yet,
/// so none of its changes are captured (a start waiting for its turn sets no problem).
pub fn db_unprotected(d: &DbHandle) -> Option<String> {
    match d.stats.health.problem() {
        Some(p) => Some(p.reason),
        None if d.sync.synced() == 0 => Some("first sync not completed".to_string()),
        None => None,
    }
}

/// Per-database metrics: `(name, help, type, value)`; labelled `db`.
type DbMetric = (&'static str, &'static str, MetricType, fn(&DbHandle) -> f64);

fn load(a: &std::sync::atomic::AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

const DB_METRICS: [DbMetric; 23] = [
    (
        "replicad_db_protected",
        "1 while the database's changes are being captured (its last sync succeeded), 0 while \
         it is not, or before its first sync completed (see /status for why).",
        MetricType::GAUGE,
        |d| f64::from(u8::from(db_unprotected(d).is_none())),
    ),
    (
        "replicad_db_txid",
        "Current TXID of the database (last segment staged locally).",
        MetricType::GAUGE,
        |d| load(&d.stats.txid),
    ),
    (
        "replicad_db_syncs_total",
        "Syncs that ran the full path.",
        MetricType::COUNTER,
        |d| load(&d.stats.syncs),
    ),
    (
        "replicad_db_sync_skipped_total",
        "Ticks answered by the idle fast path.",
        MetricType::COUNTER,
        |d| load(&d.stats.sync_skipped),
    ),
    (
        "replicad_db_sync_errors_total",
        "Failed syncs.",
        MetricType::COUNTER,
        |d| load(&d.stats.sync_errors),
    ),
    (
        "replicad_db_segments_total",
        "Segments written.",
        MetricType::COUNTER,
        |d| load(&d.stats.segments),
    ),
    (
        "replicad_db_full_segments_total",
        "Full-database segments written (a subset of segments).",
        MetricType::COUNTER,
        |d| load(&d.stats.full_segments),
    ),
    (
        "replicad_db_checkpoints_total",
        "Checkpoints run, any mode.",
        MetricType::COUNTER,
        |d| load(&d.stats.checkpoints),
    ),
    (
        "replicad_db_truncate_checkpoints_total",
        "TRUNCATE checkpoints (the others are PASSIVE; RESTART is never used).",
        MetricType::COUNTER,
        |d| load(&d.stats.truncate_checkpoints),
    ),
    (
        "replicad_db_truncate_checkpoints_blocked_total",
        "TRUNCATE checkpoints that another connection's read transaction kept from resetting the WAL (the WAL grows past truncate-page-n until it ends).",
        MetricType::COUNTER,
        |d| load(&d.stats.truncate_blocked),
    ),
    (
        "replicad_db_checkpoint_yields_total",
        "Times replicad stepped out of the way of an application's FULL, RESTART or TRUNCATE checkpoint.",
        MetricType::COUNTER,
        |d| load(&d.stats.checkpoint_yields),
    ),
    (
        "replicad_db_checkpoint_yield_rebases_total",
        "Yields after which the WAL index could not prove continuity, but the database file held replicad's position, so no full segment was needed.",
        MetricType::COUNTER,
        |d| load(&d.stats.yield_rebases),
    ),
    (
        "replicad_db_checkpoint_yield_index_proofs_total",
        "Yields whose continuity the WAL index proved at no cost (nothing was committed behind replicad's back).",
        MetricType::COUNTER,
        |d| load(&d.stats.yield_index_proofs),
    ),
    (
        "replicad_db_checkpoint_yield_timeouts_total",
        "Yields that stopped waiting for the application's checkpoint after 3 s (something else held it up).",
        MetricType::COUNTER,
        |d| load(&d.stats.yield_timeouts),
    ),
    (
        "replicad_db_checkpoint_write_lock_seconds_total",
        "Time checkpoints held SQLite's write lock: the application's commits waited for it.",
        MetricType::COUNTER,
        |d| load(&d.stats.write_lock_nanos) / 1e9,
    ),
    (
        "replicad_db_wal_size_bytes",
        "Logical WAL size: end of the last frame copied into a segment.",
        MetricType::GAUGE,
        |d| load(&d.stats.wal_size),
    ),
    (
        "replicad_db_sync_seconds_total",
        "Time spent in syncs (the full path).",
        MetricType::COUNTER,
        |d| load(&d.stats.sync_nanos) / 1e9,
    ),
    (
        "replicad_db_staging_bytes",
        "Bytes of segments in local staging (kept until every replica has them).",
        MetricType::GAUGE,
        |d| load(&d.stats.staging_bytes),
    ),
    (
        "replicad_db_idle",
        "1 while the last tick found nothing new.",
        MetricType::GAUGE,
        |d| f64::from(u8::from(d.stats.idle.load(Ordering::Relaxed))),
    ),
    (
        "replicad_db_dormant",
        "1 while the database is dormant (its SQLite connection closed until it changes).",
        MetricType::GAUGE,
        |d| f64::from(u8::from(d.stats.dormant.load(Ordering::Relaxed))),
    ),
    (
        "replicad_db_wakes_total",
        "Times the database woke from dormancy.",
        MetricType::COUNTER,
        |d| load(&d.stats.wakes),
    ),
    (
        "replicad_db_commit_watched",
        "1 while a write to the database's WAL wakes its monitor at once (inotify), 0 while its \
         commits are found by polling every monitor-interval.",
        MetricType::GAUGE,
        |d| f64::from(u8::from(d.stats.commit_watched.load(Ordering::Relaxed))),
    ),
    (
        "replicad_db_held_seconds",
        "Seconds the database's newest changes have waited for min-sync-interval before their \
         sync (0 when none wait); the replicas' lag starts after that sync.",
        MetricType::GAUGE,
        |d| d.stats.held_seconds(),
    ),
];

const LAG_TXIDS: (&str, &str) = (
    "replicad_replica_lag_txids",
    "Database TXID minus the replica's TXID.",
);
const PROTECTED: (&str, &str) = (
    "replicad_replica_protected",
    "1 while the replica is being written (its last upload round succeeded) and is within \
     max-lag, 0 while it is not (see /status for why).",
);
const LEASE_LOST: (&str, &str) = (
    "replicad_replica_lease_lost",
    "1 after another writer took the replica's single-writer lease (replicad stopped writing \
     it), else 0.",
);
const LAG_SECONDS: (&str, &str) = (
    "replicad_replica_lag_seconds",
    "How long the replica has been missing the database's newest data: seconds since the \
     first segment it misses was cut (0 when current).",
);

/// Reads [`DbStats`](crate::replicate::db::DbStats) and [`ReplicaStats`] at scrape time.
struct DbCollector {
    dbs: DbRegistry,
    descs: Vec<Desc>,
    since_ms: i64,
    max_lag: Duration,
}

impl DbCollector {
    fn new(dbs: DbRegistry, since_ms: i64, max_lag: Duration) -> DbCollector {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            Desc::new(
                name.to_string(),
                help.to_string(),
                labels.iter().map(|l| l.to_string()).collect(),
                HashMap::new(),
            )
            .expect("metric definitions are static and valid")
        };
        let mut descs: Vec<Desc> = DB_METRICS
            .iter()
            .map(|(name, help, _, _)| desc(name, help, &["db"]))
            .collect();
        for (name, help) in [LAG_TXIDS, LAG_SECONDS, PROTECTED, LEASE_LOST] {
            descs.push(desc(name, help, &["db", "replica"]));
        }
        DbCollector {
            dbs,
            descs,
            since_ms,
            max_lag,
        }
    }
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut mf = MetricFamily::default();
    mf.set_name(name.to_string());
    mf.set_help(help.to_string());
    mf.set_field_type(kind);
    mf.set_metric(metrics);
    mf
}

fn sample(labels: &[(&str, &str)], kind: MetricType, value: f64) -> proto::Metric {
    let mut m = proto::Metric::default();
    m.set_label(
        labels
            .iter()
            .map(|(n, v)| {
                let mut l = proto::LabelPair::default();
                l.set_name(n.to_string());
                l.set_value(v.to_string());
                l
            })
            .collect(),
    );
    if kind == MetricType::COUNTER {
        let mut c = proto::Counter::default();
        c.set_value(value);
        m.set_counter(c);
    } else {
        let mut g = proto::Gauge::default();
        g.set_value(value);
        m.set_gauge(g);
    }
    m
}

impl Collector for DbCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let dbs = self.dbs.snapshot();
        let labels: Vec<String> = dbs.iter().map(|d| d.path.display().to_string()).collect();
        let mut out: Vec<MetricFamily> = DB_METRICS
            .iter()
            .map(|&(name, help, kind, value)| {
                let metrics = dbs
                    .iter()
                    .zip(&labels)
                    .map(|(d, db)| sample(&[("db", db)], kind, value(d)))
                    .collect();
                family(name, help, kind, metrics)
            })
            .collect();
        let mut txids = Vec::new();
        let mut seconds = Vec::new();
        let mut protected = Vec::new();
        let mut lease_lost = Vec::new();
        for (d, db) in dbs.iter().zip(&labels) {
            let pos = *d.pos.borrow();
            for (name, r) in &d.replicas {
                let lag = replica_lag(pos, r, self.since_ms);
                let l = [("db", db.as_str()), ("replica", name.as_str())];
                txids.push(sample(&l, MetricType::GAUGE, lag.txids as f64));
                seconds.push(sample(&l, MetricType::GAUGE, lag.seconds));
                let lost = r.lease_lost.load(Ordering::Relaxed);
                let ok = is_protected(pos, r, self.max_lag, self.since_ms);
                protected.push(sample(&l, MetricType::GAUGE, f64::from(u8::from(ok))));
                lease_lost.push(sample(&l, MetricType::GAUGE, f64::from(u8::from(lost))));
            }
        }
        out.push(family(LAG_TXIDS.0, LAG_TXIDS.1, MetricType::GAUGE, txids));
        out.push(family(
            LAG_SECONDS.0,
            LAG_SECONDS.1,
            MetricType::GAUGE,
            seconds,
        ));
        out.push(family(
            PROTECTED.0,
            PROTECTED.1,
            MetricType::GAUGE,
            protected,
        ));
        out.push(family(
            LEASE_LOST.0,
            LEASE_LOST.1,
            MetricType::GAUGE,
            lease_lost,
        ));
        out
    }
}

const PHASE_BYTES: (&str, &str) = (
    "replicad_phase_bytes_total",
    "Bytes processed per data-path phase (see the phase list in the docs).",
);
const PHASE_SECONDS: (&str, &str) = (
    "replicad_phase_seconds_total",
    "Time spent per data-path phase; concurrent work adds up.",
);

/// Exports a Store's [`PhaseStats`] at scrape time.
struct PhaseCollector {
    descs: Vec<Desc>,
    phases: std::sync::Arc<PhaseStats>,
}

impl PhaseCollector {
    fn new(phases: std::sync::Arc<PhaseStats>) -> PhaseCollector {
        let descs = [PHASE_BYTES, PHASE_SECONDS]
            .iter()
            .map(|(name, help)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    vec!["phase".to_string()],
                    HashMap::new(),
                )
                .expect("metric definitions are static and valid")
            })
            .collect();
        PhaseCollector { descs, phases }
    }
}

impl Collector for PhaseCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let per_phase = |value: &dyn Fn(Phase) -> f64| {
            Phase::ALL
                .iter()
                .map(|&p| sample(&[("phase", p.name())], MetricType::COUNTER, value(p)))
                .collect()
        };
        vec![
            family(
                PHASE_BYTES.0,
                PHASE_BYTES.1,
                MetricType::COUNTER,
                per_phase(&|p| self.phases.bytes(p) as f64),
            ),
            family(
                PHASE_SECONDS.0,
                PHASE_SECONDS.1,
                MetricType::COUNTER,
                per_phase(&|p| self.phases.seconds(p)),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ltx::TxId;

    fn replica(txid: u64, timestamp_ms: u64) -> ReplicaStats {
        let counters = crate::replicate::counters::ReplicaMetrics::register(
            &prometheus::Registry::new(),
            std::sync::Arc::default(),
        )
        .replica("/a.db", "r", false);
        let r = ReplicaStats::new(counters, "file:///r");
        r.remote_txid.store(txid, Ordering::Relaxed);
        r.remote_steady_ms.store(timestamp_ms, Ordering::Relaxed);
        r
    }

    fn pos(txid: u64, steady_ms: i64) -> DbPos {
        DbPos {
            txid: TxId(txid),
            timestamp_ms: 0,
            steady_ms,
        }
    }

    #[test]
    fn a_stuck_upload_ages_on_the_clock_and_a_current_replica_has_no_lag() {
        // An hour idle, then one commit at t = 3,600 s: stale since that commit, not for
        // the hour the database did not change.
        let r = replica(5, 0);
        let lag = |now_ms| lag_at(pos(6, 3_600_000), &r, 0, now_ms).seconds;
        assert_eq!(lag(3_600_050), 0.05);
        // Its upload stuck while the database stays quiet: the lag grows with the clock.
        assert_eq!(lag(3_700_000), 100.0);
        // Two segments missing, before the next upload begins: the data between the newest
        // and the replica counts, and so does the wait.
        let two = |now_ms| lag_at(pos(7, 10_000), &r, 0, now_ms).seconds;
        assert_eq!(two(10_001), 10.0);
        assert_eq!(two(60_000), 50.0);
        // Once it uploads the first it misses (cut at 2 s): since that cut.
        r.next_steady_ms.store(2_000, Ordering::Relaxed);
        assert_eq!(two(10_001), 8.001);
        r.next_steady_ms.store(0, Ordering::Relaxed);
        // A cut before the process started (or unknown: 0) counts from the start.
        assert_eq!(lag_at(pos(6, 0), &r, 5_000, 6_000).seconds, 1.0);
        assert_eq!(lag_at(pos(6, 1_000), &r, 5_000, 6_000).seconds, 1.0);
        // Current: nothing missing, no lag, however old its last upload.
        let current = lag_at(pos(5, 0), &r, 0, 9_999_999);
        assert_eq!((current.txids, current.seconds), (0, 0.0));
    }
}
