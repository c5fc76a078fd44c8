//! The shared, read-mostly view of one replica: what `/status`, `/readyz` and the metrics
//! read while its upload task writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use crate::replicate::counters::ReplicaCounters;
use crate::replicate::health::HealthCell;

/// Counters of one replica: the Prometheus counters plus the remote position.
#[derive(Clone)]
pub struct ReplicaStats {
    /// Calls, errors and bytes by operation (`replicad_replica_*{db,replica,operation}`).
    pub counters: ReplicaCounters,
    /// Highest TXID stored on the replica.
    pub remote_txid: Arc<AtomicU64>,
    /// Header timestamp (ms) of the newest uploaded segment, on the steady clock
    /// ([`crate::util::clock::steady_of`], read when it was stored): lag is measured on it.
    pub remote_steady_ms: Arc<AtomicU64>,
    /// Header timestamp of the segment being uploaded after it, on the steady clock (read
    /// once per TXID, when its first upload began; 0: none yet).
    pub next_steady_ms: Arc<AtomicU64>,
    /// Set when another instance took this replica's lease: the replica stopped uploading.
    pub lease_lost: Arc<AtomicBool>,
    /// Segments uploaded while they were being staged (see [`crate::storage::feed`]).
    pub streamed_segments: Arc<AtomicU64>,
    /// Whether the replica is being written (its last round succeeded), else why not.
    pub health: Arc<HealthCell>,
    /// Whether its maintenance (compaction, snapshots, retention, verify) runs, else which job
    /// keeps failing and why. Not protection: uploads go on and the replica restores, but
    /// levels, snapshots and deletions stop, so it grows and restores slow down.
    pub maintenance: Arc<HealthCell>,
    /// Times the replica was re-seeded with a snapshot.
    pub reseeds: Arc<AtomicU64>,
    /// Where it writes, without credentials ([`crate::storage::ReplicaClient::location`]).
    pub location: Arc<str>,
}

impl ReplicaStats {
    /// Stats counting into `counters`.
    pub fn new(counters: ReplicaCounters, location: &str) -> ReplicaStats {
        ReplicaStats {
            location: location.into(),
            counters,
            remote_txid: Arc::default(),
            remote_steady_ms: Arc::default(),
            next_steady_ms: Arc::default(),
            lease_lost: Arc::default(),
            streamed_segments: Arc::default(),
            health: Arc::default(),
            maintenance: Arc::default(),
            reseeds: Arc::default(),
        }
    }

    /// Total client calls.
    pub fn total_ops(&self) -> u64 {
        self.counters.total_ops()
    }
}
