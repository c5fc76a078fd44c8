//! Prometheus metrics: one registry per Store, counters handed to the tasks that count.
//!
//! Invariant: no label value is ever a secret: labels are database paths, replica names and
//! operation names only.

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Replica operations counted, in the order of [`ReplicaCounters::ops`].
pub const OPERATIONS: [&str; 4] = ["put", "get", "list", "delete"];

/// Every metric of one Store.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    replica_ops: IntCounterVec,
    replica_errors: IntCounterVec,
    replica_bytes: IntCounterVec,
    replica_txid: IntGaugeVec,
    replica_verify_ok: IntGaugeVec,
    replica_verify_txid: IntGaugeVec,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Metrics {
        let registry = Registry::new();
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
        Metrics {
            replica_verify_ok,
            replica_verify_txid,
            registry,
            replica_ops,
            replica_errors,
            replica_bytes,
            replica_txid,
        }
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
            txid: self.replica_txid.with_label_values(&[db, replica]),
            verify_ok: {
                let g = self.replica_verify_ok.with_label_values(&[db, replica]);
                g.set(-1);
                g
            },
            verify_txid: self.replica_verify_txid.with_label_values(&[db, replica]),
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
    /// Highest TXID stored.
    pub txid: prometheus::IntGauge,
    /// Last periodic verify: 1 ok, 0 failed, -1 never run.
    pub verify_ok: prometheus::IntGauge,
    /// TXID the last periodic verify restored.
    pub verify_txid: prometheus::IntGauge,
}

impl ReplicaCounters {
    /// Total client calls.
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().map(IntCounter::get).sum()
    }
}
