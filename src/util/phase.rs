//! Per-phase throughput of the data path (Vitess-style phase stats): bytes and time spent
//! reading the WAL, encoding, compressing, staging, uploading, downloading and applying.
//!
//! Plain atomics, added to once per unit of work. A Store owns one set (shared by its
//! databases and replicas, exported by `ops::metrics` at scrape time); a restore run outside a
//! Store counts into its own ([`crate::restore::RestoreOptions::phases`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
    /// Restore: decoding the chain and writing the database into `<to>.tmp`, not its fsync,
    /// which runs beside the integrity check (bytes: page bytes written to the output).
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

/// Totals per [`Phase`]: bytes and nanoseconds, each an atomic. Callers sum
/// locally and add once per unit of work (a segment, an upload, a chunk), so the shared
/// cache lines are touched rarely. Times of concurrent work (parallel uploads or syncs of
/// several databases) add up, so seconds may exceed wall time.
#[derive(Debug)]
pub struct PhaseStats {
    bytes: [AtomicU64; 7],
    nanos: [AtomicU64; 7],
}

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
