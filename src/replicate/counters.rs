//! The per-replica counters the replication tasks count into: handles into a Prometheus
//! registry, so counting is one atomic add and `ops::metrics` only has to render.
//!
//! Invariant: no label value is ever a secret: labels are database paths, replica names,
//! operation names and re-seed reasons only.

use prometheus::Registry;
use std::sync::Arc;

use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use crate::replicate::health::SeedReason;
use crate::util::phase::PhaseStats;

/// Replica operations counted, in the order of [`ReplicaCounters::ops`].
pub const OPERATIONS: [&str; 4] = ["put", "get", "list", "delete"];

/// The per-replica metric vectors of one Store, registered in its registry.
#[derive(Clone)]
pub struct ReplicaMetrics {
    ops: IntCounterVec,
    errors: IntCounterVec,
    bytes: IntCounterVec,
    seconds: CounterVec,
    txid: IntGaugeVec,
    verify_ok: IntGaugeVec,
    verify_txid: IntGaugeVec,
    reseeds: IntCounterVec,
    maintenance_failures: IntCounterVec,
    phases: Arc<PhaseStats>,
}

impl ReplicaMetrics {
    /// Registers every per-replica metric in `registry`; uploads count into `phases`.
    pub fn register(registry: &Registry, phases: Arc<PhaseStats>) -> ReplicaMetrics {
        let add = |c: Box<dyn prometheus::core::Collector>| {
            registry
                .register(c)
                .expect("each metric is registered once");
        };
        let labels = ["db", "replica", "operation"];
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("metric definitions are static and valid");
            add(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["db", "replica"])
                .expect("metric definitions are static and valid");
            add(Box::new(g.clone()));
            g
        };
        let seconds = CounterVec::new(
            Opts::new(
                "replicad_replica_operation_seconds_total",
                "Time spent in replica client calls by operation.",
            ),
            &labels,
        )
        .expect("metric definitions are static and valid");
        add(Box::new(seconds.clone()));
        ReplicaMetrics {
            phases,
            ops: counter(
                "replicad_replica_operations_total",
                "Replica client calls by operation.",
                &labels,
            ),
            errors: counter(
                "replicad_replica_errors_total",
                "Failed replica client calls by operation.",
                &labels,
            ),
            bytes: counter(
                "replicad_replica_bytes_total",
                "Bytes sent or received by operation.",
                &labels,
            ),
            seconds,
            txid: gauge(
                "replicad_replica_txid",
                "Highest TXID stored on the replica.",
            ),
            verify_ok: gauge(
                "replicad_replica_verify_ok",
                "Result of the last periodic verify: 1 restored and checked, 0 failed, -1 never run.",
            ),
            verify_txid: gauge(
                "replicad_replica_verify_txid",
                "TXID the last periodic verify restored.",
            ),
            reseeds: counter(
                "replicad_replica_reseeds_total",
                "Times a replica was re-seeded with a snapshot of the live database, by reason \
                 (empty, wiped, behind).",
                &["db", "replica", "reason"],
            ),
            maintenance_failures: counter(
                "replicad_replica_maintenance_failures_total",
                "Maintenance jobs (compaction, snapshot, retention, verify) that failed; \
                 /status names the job that keeps failing and why.",
                &["db", "replica"],
            ),
        }
    }

    /// Counters of one replica of one database. The verify series are exported only when the
    /// replica `verifies` (`verify-interval` set), so that -1 means "not run yet", never "off".
    pub fn replica(&self, db: &str, replica: &str, verifies: bool) -> ReplicaCounters {
        let per_op =
            |vec: &IntCounterVec| OPERATIONS.map(|op| vec.with_label_values(&[db, replica, op]));
        let (verify_ok, verify_txid) = match verifies {
            true => (
                self.verify_ok.with_label_values(&[db, replica]),
                self.verify_txid.with_label_values(&[db, replica]),
            ),
            false => (detached("verify_ok"), detached("verify_txid")),
        };
        verify_ok.set(-1);
        ReplicaCounters {
            ops: per_op(&self.ops),
            errors: per_op(&self.errors),
            bytes: per_op(&self.bytes),
            seconds: OPERATIONS.map(|op| self.seconds.with_label_values(&[db, replica, op])),
            txid: self.txid.with_label_values(&[db, replica]),
            verify_ok,
            verify_txid,
            reseeds: SeedReason::ALL
                .map(|r| self.reseeds.with_label_values(&[db, replica, r.label()])),
            maintenance_failures: self.maintenance_failures.with_label_values(&[db, replica]),
            phases: self.phases.clone(),
        }
    }

    /// Drops the series of a replica whose database is no longer replicated (directory
    /// discovery removed it), so that /metrics does not report it forever.
    pub fn forget_replica(&self, db: &str, replica: &str) {
        for op in OPERATIONS {
            for vec in [&self.ops, &self.errors, &self.bytes] {
                let _ = vec.remove_label_values(&[db, replica, op]);
            }
            let _ = self.seconds.remove_label_values(&[db, replica, op]);
        }
        for vec in [&self.txid, &self.verify_ok, &self.verify_txid] {
            let _ = vec.remove_label_values(&[db, replica]);
        }
        for r in SeedReason::ALL {
            let _ = self.reseeds.remove_label_values(&[db, replica, r.label()]);
        }
        let _ = self
            .maintenance_failures
            .remove_label_values(&[db, replica]);
    }
}

/// A gauge in no registry (a series that is not exported).
fn detached(name: &str) -> IntGauge {
    IntGauge::new(name, "not exported").expect("a static name and help are valid")
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
    pub txid: IntGauge,
    /// Last periodic verify: 1 ok, 0 failed, -1 never run.
    pub verify_ok: IntGauge,
    /// TXID the last periodic verify restored.
    pub verify_txid: IntGauge,
    /// Re-seeds, indexed like [`SeedReason::ALL`].
    pub reseeds: [IntCounter; 4],
    /// Maintenance jobs (compaction, snapshot, retention, verify) that failed.
    pub maintenance_failures: IntCounter,
    /// The Store's phase totals (uploads count into them).
    pub phases: Arc<PhaseStats>,
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
