//! Prometheus metrics: one registry per Store, counters handed to the tasks that count.
//!
//! Per-phase throughput (`replicad_phase_bytes_total{phase}`, `replicad_phase_seconds_total{phase}`)
//! is process-wide, unlike everything else here: the phases are counted into the static
//! [`PHASES`] (plain atomics, no registry lookup on the hot path) by whatever code runs them —
//! syncs of every database, uploads of every replica, restores and the CLI — and every
//! Store's registry exports the same totals through a collector reading [`PHASES`] at scrape
//! time. Two Stores in one process (tests) therefore report the same, shared, phase totals.
//!
//! Invariant: no label value is ever a secret: labels are database paths, replica names,
//! operation names and phase names only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::db::DbPos;
use crate::registry::DbRegistry;
use crate::replica::ReplicaStats;
use crate::store::DbHandle;

/// Replica operations counted, in the order of [`ReplicaCounters::ops`].
pub const OPERATIONS: [&str; 4] = ["put", "get", "list", "delete"];

/// Every metric of one Store.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    replica_ops: IntCounterVec,
    replica_errors: IntCounterVec,
    replica_bytes: IntCounterVec,
    replica_seconds: CounterVec,
    replica_txid: IntGaugeVec,
    replica_verify_ok: IntGaugeVec,
    replica_verify_txid: IntGaugeVec,
    replica_reseeds: IntCounterVec,
    started_ms: i64,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        registry
            .register(Box::new(PhaseCollector::new()))
            .expect("each metric is registered once");
        let labels = ["db", "replica", "operation"];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("metric definitions are static and valid");
            registry
                .register(Box::new(c.clone()))
                .expect("each metric is registered once");
            c
        };
        let replica_ops = counter(
            "replicad_replica_operations_total",
            "Replica client calls by operation.",
            &labels,
        );
        let replica_errors = counter(
            "replicad_replica_errors_total",
            "Failed replica client calls by operation.",
            &labels,
        );
        let replica_bytes = counter(
            "replicad_replica_bytes_total",
            "Bytes sent or received by operation.",
            &labels,
        );
        let replica_seconds = CounterVec::new(
            Opts::new(
                "replicad_replica_operation_seconds_total",
                "Time spent in replica client calls by operation.",
            ),
            &labels,
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(replica_seconds.clone()))
            .expect("each metric is registered once");
        let replica_txid = IntGaugeVec::new(
            Opts::new(
                "replicad_replica_txid",
                "Highest TXID stored on the replica.",
            ),
            &["db", "replica"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(replica_txid.clone()))
            .expect("each metric is registered once");
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["db", "replica"])
                .expect("metric definitions are static and valid");
            registry
                .register(Box::new(g.clone()))
                .expect("each metric is registered once");
            g
        };
        let replica_verify_ok = gauge(
            "replicad_replica_verify_ok",
            "Result of the last periodic verify: 1 restored and checked, 0 failed, -1 never run.",
        );
        let replica_verify_txid = gauge(
            "replicad_replica_verify_txid",
            "TXID the last periodic verify restored.",
        );
        let replica_reseeds = counter(
            "replicad_replica_reseeds_total",
            "Times a replica was re-seeded with a snapshot of the live database, by reason \
             (empty, wiped, behind).",
            &["db", "replica", "reason"],
        );
        Metrics {
            replica_reseeds,
            started_ms: now_ms(),
            replica_verify_ok,
            replica_verify_txid,
            registry,
            replica_ops,
            replica_errors,
            replica_bytes,
            replica_seconds,
            replica_txid,
        }
    }

    /// When this registry was made (ms since the epoch): the stand-in age of a replica that
    /// has uploaded nothing since (see [`Lag::seconds`]).
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    /// The registry, for scraping.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counters of one replica of one database.
    pub fn replica(&self, db: &str, replica: &str) -> ReplicaCounters {
        let per_op =
            |vec: &IntCounterVec| OPERATIONS.map(|op| vec.with_label_values(&[db, replica, op]));
        ReplicaCounters {
            ops: per_op(&self.replica_ops),
            errors: per_op(&self.replica_errors),
            bytes: per_op(&self.replica_bytes),
            seconds: OPERATIONS
                .map(|op| self.replica_seconds.with_label_values(&[db, replica, op])),
            txid: self.replica_txid.with_label_values(&[db, replica]),
            verify_ok: {
                let g = self.replica_verify_ok.with_label_values(&[db, replica]);
                g.set(-1);
                g
            },
            verify_txid: self.replica_verify_txid.with_label_values(&[db, replica]),
            reseeds: crate::replica::SeedReason::ALL.map(|r| {
                self.replica_reseeds
                    .with_label_values(&[db, replica, r.label()])
            }),
        }
    }

    /// Drops the series of a replica whose database is no longer replicated (directory
    /// discovery removed it), so that /metrics does not report it forever.
    pub fn forget_replica(&self, db: &str, replica: &str) {
        for op in OPERATIONS {
            for vec in [&self.replica_ops, &self.replica_errors, &self.replica_bytes] {
                let _ = vec.remove_label_values(&[db, replica, op]);
            }
            let _ = self.replica_seconds.remove_label_values(&[db, replica, op]);
        }
        let _ = self.replica_txid.remove_label_values(&[db, replica]);
        let _ = self.replica_verify_ok.remove_label_values(&[db, replica]);
        let _ = self.replica_verify_txid.remove_label_values(&[db, replica]);
        for r in crate::replica::SeedReason::ALL {
            let _ = self
                .replica_reseeds
                .remove_label_values(&[db, replica, r.label()]);
        }
    }

    /// Registers the per-database and per-replica-lag metrics of the databases in `dbs`
    /// (read at each scrape, so databases added or removed later are seen), read from their
    /// atomics at scrape time (the hot path keeps counting into atomics only). Call once.
    pub fn register_dbs(&self, dbs: DbRegistry) {
        let collector = DbCollector::new(dbs, self.started_ms);
        if let Err(e) = self.registry.register(Box::new(collector)) {
            tracing::warn!(error = %e, "registering database metrics failed");
        }
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

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Counters of one replica (handles into the registry: counting is an atomic add).
#[derive(Clone)]
pub struct ReplicaCounters {
    /// Calls by operation, indexed like [`OPERATIONS`].
    pub ops: [IntCounter; 4],
    /// Failed calls by operation.
    pub errors: [IntCounter; 4],
    /// Bytes by operation.
    pub bytes: [IntCounter; 4],
    /// Seconds spent by operation.
    pub seconds: [Counter; 4],
    /// Highest TXID stored.
    pub txid: prometheus::IntGauge,
    /// Last periodic verify: 1 ok, 0 failed, -1 never run.
    pub verify_ok: prometheus::IntGauge,
    /// TXID the last periodic verify restored.
    pub verify_txid: prometheus::IntGauge,
    /// Re-seeds, indexed like [`crate::replica::SeedReason::ALL`].
    pub reseeds: [IntCounter; 3],
}

impl ReplicaCounters {
    /// Records one client call of operation `op` (index into [`OPERATIONS`]) that started at
    /// `started`.
    pub fn observe<T, E>(&self, op: usize, started: std::time::Instant, result: &Result<T, E>) {
        self.ops[op].inc();
        self.seconds[op].inc_by(started.elapsed().as_secs_f64());
        if result.is_err() {
            self.errors[op].inc();
        }
    }

    /// Total client calls.
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().map(IntCounter::get).sum()
    }
}

/// How far one replica is behind its database.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    /// Database TXID minus the replica's TXID (0 when the replica is current).
    pub txids: u64,
    /// Header timestamp of the database's newest segment minus that of the replica's newest
    /// uploaded segment, in seconds (0 when the replica is current). When the replica has
    /// uploaded nothing since the process started (its timestamp is unknown), the age is
    /// counted from `since_ms` (the process start) instead: a lower bound.
    pub seconds: f64,
}

/// The lag of replica `r` behind database position `pos`.
pub fn replica_lag(pos: DbPos, r: &ReplicaStats, since_ms: i64) -> Lag {
    let remote = r.remote_txid.load(Ordering::Relaxed);
    let txids = pos.txid.0.saturating_sub(remote);
    if txids == 0 {
        return Lag {
            txids,
            seconds: 0.0,
        };
    }
    let remote_ms = match r.remote_timestamp_ms.load(Ordering::Relaxed) {
        0 => since_ms,
        ms => i64::try_from(ms).unwrap_or(i64::MAX),
    };
    let ms = pos.timestamp_ms.saturating_sub(remote_ms).max(0);
    Lag {
        txids,
        seconds: ms as f64 / 1000.0,
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Per-database metrics: `(name, help, type, value)`; labelled `db`.
type DbMetric = (&'static str, &'static str, MetricType, fn(&DbHandle) -> f64);

fn load(a: &std::sync::atomic::AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

const DB_METRICS: [DbMetric; 16] = [
    (
        "replicad_db_protected",
        "1 while the database's changes are being captured (its last sync succeeded), 0 while \
         it is not (see /status for why).",
        MetricType::GAUGE,
        |d| f64::from(u8::from(d.stats.health.is_ok())),
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
];

const LAG_TXIDS: (&str, &str) = (
    "replicad_replica_lag_txids",
    "Database TXID minus the replica's TXID.",
);
const PROTECTED: (&str, &str) = (
    "replicad_replica_protected",
    "1 while the replica is being written (its last upload round succeeded), 0 while it is \
     not (see /status for why).",
);
const LAG_SECONDS: (&str, &str) = (
    "replicad_replica_lag_seconds",
    "Age of the replica's newest segment relative to the database's newest segment.",
);

/// Reads [`DbStats`](crate::db::DbStats) and [`ReplicaStats`] at scrape time.
struct DbCollector {
    dbs: DbRegistry,
    descs: Vec<Desc>,
    since_ms: i64,
}

impl DbCollector {
    fn new(dbs: DbRegistry, since_ms: i64) -> DbCollector {
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
        for (name, help) in [LAG_TXIDS, LAG_SECONDS, PROTECTED] {
            descs.push(desc(name, help, &["db", "replica"]));
        }
        DbCollector {
            dbs,
            descs,
            since_ms,
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
        for (d, db) in dbs.iter().zip(&labels) {
            let pos = *d.pos.borrow();
            for (name, r) in &d.replicas {
                let lag = replica_lag(pos, r, self.since_ms);
                let l = [("db", db.as_str()), ("replica", name.as_str())];
                txids.push(sample(&l, MetricType::GAUGE, lag.txids as f64));
                seconds.push(sample(&l, MetricType::GAUGE, lag.seconds));
                let ok = r.health.is_ok() && !r.lease_lost.load(Ordering::Relaxed);
                protected.push(sample(&l, MetricType::GAUGE, f64::from(u8::from(ok))));
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
        out
    }
}

/// A stage of the data path, for per-phase throughput (Vitess-style phase stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sync: reading pages from the WAL or the database file (bytes: page bytes read).
    WalRead,
    /// Sync: building a segment other than page compression (header, page framing, index,
    /// trailer, checksums; bytes: segment file bytes produced).
    Encode,
    /// Sync: compressing and appending pages to the segment (`Encoder::encode_page`, whose
    /// cost is the codec's; bytes: uncompressed page bytes in).
    Compress,
    /// Sync: fsync and publish (rename, directory fsync) of a staged segment (bytes: segment
    /// bytes made durable).
    StageWrite,
    /// Replica: storing a staged segment on the replica (`put`; bytes: object bytes stored).
    Upload,
    /// Restore: fetching files of a remote replica into the local sidecar directory (bytes:
    /// bytes received). Directory (`file`) replicas are read in place during `Apply`, so a
    /// restore from one leaves this phase at 0.
    Download,
    /// Restore: decoding the chain and writing the database into `<to>.tmp`, including its
    /// fsync (bytes: page bytes written to the output).
    Apply,
}

impl Phase {
    /// Every phase, in export order.
    pub const ALL: [Phase; 7] = [
        Phase::WalRead,
        Phase::Encode,
        Phase::Compress,
        Phase::StageWrite,
        Phase::Upload,
        Phase::Download,
        Phase::Apply,
    ];

    /// The `phase` label value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::WalRead => "wal_read",
            Phase::Encode => "encode",
            Phase::Compress => "compress",
            Phase::StageWrite => "stage_write",
            Phase::Upload => "upload",
            Phase::Download => "download",
            Phase::Apply => "apply",
        }
    }
}

/// Process-wide totals per [`Phase`]: bytes and nanoseconds, each an atomic. Callers sum
/// locally and add once per unit of work (a segment, an upload, a chunk), so the shared
/// cache lines are touched rarely. Times of concurrent work (parallel uploads or syncs of
/// several databases) add up, so seconds may exceed wall time.
#[derive(Debug)]
pub struct PhaseStats {
    bytes: [AtomicU64; 7],
    nanos: [AtomicU64; 7],
}

/// The process-wide phase totals (see the module documentation).
pub static PHASES: PhaseStats = PhaseStats::new();

impl PhaseStats {
    /// All zero.
    pub const fn new() -> PhaseStats {
        PhaseStats {
            bytes: [const { AtomicU64::new(0) }; 7],
            nanos: [const { AtomicU64::new(0) }; 7],
        }
    }

    /// Adds `bytes` and `elapsed` to `phase`.
    pub fn record(&self, phase: Phase, bytes: u64, elapsed: Duration) {
        self.record_nanos(phase, bytes, duration_nanos(elapsed));
    }

    /// Adds `bytes` and `nanos` to `phase`.
    pub fn record_nanos(&self, phase: Phase, bytes: u64, nanos: u64) {
        let i = phase as usize;
        if bytes > 0 {
            self.bytes[i].fetch_add(bytes, Ordering::Relaxed);
        }
        if nanos > 0 {
            self.nanos[i].fetch_add(nanos, Ordering::Relaxed);
        }
    }

    /// Bytes counted for `phase`.
    pub fn bytes(&self, phase: Phase) -> u64 {
        self.bytes[phase as usize].load(Ordering::Relaxed)
    }

    /// Seconds counted for `phase`.
    pub fn seconds(&self, phase: Phase) -> f64 {
        self.nanos[phase as usize].load(Ordering::Relaxed) as f64 / 1e9
    }
}

impl Default for PhaseStats {
    fn default() -> Self {
        PhaseStats::new()
    }
}

/// `d` in nanoseconds, saturating.
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

const PHASE_BYTES: (&str, &str) = (
    "replicad_phase_bytes_total",
    "Bytes processed per data-path phase, process-wide (see the phase list in the docs).",
);
const PHASE_SECONDS: (&str, &str) = (
    "replicad_phase_seconds_total",
    "Time spent per data-path phase, process-wide; concurrent work adds up.",
);

/// Exports [`PHASES`] at scrape time.
struct PhaseCollector {
    descs: Vec<Desc>,
}

impl PhaseCollector {
    fn new() -> PhaseCollector {
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
        PhaseCollector { descs }
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
                per_phase(&|p| PHASES.bytes(p) as f64),
            ),
            family(
                PHASE_SECONDS.0,
                PHASE_SECONDS.1,
                MetricType::COUNTER,
                per_phase(&|p| PHASES.seconds(p)),
            ),
        ]
    }
}
