//! Replica maintenance: level compactions, level-9 snapshots and retention, run by the
//! replica's own task on their intervals, each only when there is something new.
//!
//! Invariants:
//! - Outputs are built in a local temporary file, fsynced, then uploaded whole; a crash
//!   leaves at most a `.tmp` file locally and never a partial object remotely.
//! - Level-0 inputs are read from local staging when present (staging keeps level-0 segments
//!   until level 1 covers them), so an L1 compaction costs no GET.
//! - Planning reads only the in-memory index: an idle replica makes no request.

pub mod compactor;
pub mod schedule;

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::io::SyncIoBridge;

use crate::ltx::{self, Codec, Decoder, TxId};
use crate::replicate::counters::ReplicaCounters;
use crate::replicate::staging::Staging;
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;
use compactor::CompactOptions;
use schedule::{RemoteIndex, RetentionPolicy};

/// Maintenance settings of one replica.
#[derive(Debug, Clone)]
pub struct Maintenance {
    /// Compaction intervals of levels 1..=n.
    pub levels: Vec<Duration>,
    /// Snapshot cadence.
    pub snapshot_interval: Duration,
    /// Retention policy.
    pub retention: RetentionPolicy,
    /// How often retention is checked.
    pub retention_check: Duration,
    /// False: never delete remote files.
    pub retention_enabled: bool,
    /// Codec of compaction and snapshot outputs.
    pub codec: Codec,
    /// Where outputs are built before upload.
    pub tmp_dir: PathBuf,
    /// How often the replica is restored and checked (zero: never).
    pub verify_interval: Duration,
    /// Turns for local builds (merge, compress, fsync), shared by every replica of a Store
    /// ([`MAX_BUILDS`]).
    pub builds: std::sync::Arc<tokio::sync::Semaphore>,
}

/// A maintenance job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Compact into this level.
    Compact(u8),
    /// Write a level-9 snapshot.
    Snapshot,
    /// Delete what retention allows.
    Retention,
    /// Restore the latest state into a temporary file and check it.
    Verify,
}

/// When each job is next due.
#[derive(Debug)]
pub struct Schedule {
    jobs: Vec<(Job, Duration, Instant)>,
}

impl Schedule {
    /// Every job first comes due one interval from `now`.
    pub fn new(m: &Maintenance, now: Instant) -> Schedule {
        let mut jobs: Vec<(Job, Duration, Instant)> = m
            .levels
            .iter()
            .enumerate()
            .map(|(i, d)| (Job::Compact(i as u8 + 1), *d, now + *d))
            .collect();
        jobs.push((
            Job::Snapshot,
            m.snapshot_interval,
            now + m.snapshot_interval,
        ));
        jobs.push((Job::Retention, m.retention_check, now + m.retention_check));
        if !m.verify_interval.is_zero() {
            jobs.push((Job::Verify, m.verify_interval, now + m.verify_interval));
        }
        Schedule { jobs }
    }

    /// Jobs due at `now`, lowest level first (compactions feed the next level and the
    /// snapshot), each rescheduled one interval later.
    pub fn take_due(&mut self, now: Instant) -> Vec<Job> {
        let mut due = Vec::new();
        for (job, every, next) in &mut self.jobs {
            if *next <= now {
                due.push(*job);
                *next = now + *every;
            }
        }
        due
    }

    /// Time until the next job.
    pub fn until_next(&self, now: Instant) -> Duration {
        self.jobs
            .iter()
            .map(|(_, _, next)| next.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::MAX)
    }
}

/// One input of a compaction.
type Input = Box<dyn Read + Send>;

/// Runs one job. Returns the files it uploaded or deleted, for the caller's index.
pub async fn run_job(
    job: Job,
    m: &Maintenance,
    client: &AnyClient,
    staging: &Staging,
    index: &mut RemoteIndex,
    counters: &ReplicaCounters,
) -> Result<usize, StorageError> {
    match job {
        Job::Verify => {
            let tip = index.tip();
            let done = counters.verify_ok.get() == 1 && counters.verify_txid.get() == tip.0 as i64;
            if tip.0 == 0 || done {
                return Ok(0);
            }
            let result = verify(m, client, index, counters).await;
            counters.verify_ok.set(i64::from(result.is_ok()));
            counters.verify_txid.set(tip.0 as i64);
            result.map(|()| 1)
        }
        Job::Compact(level) => {
            let inputs = schedule::compaction_inputs(index, level);
            if inputs.is_empty() {
                return Ok(0);
            }
            let out = build(m, client, staging, &inputs, None, level, counters).await?;
            index.insert(out);
            Ok(1)
        }
        Job::Snapshot => {
            if index.max_txid(SNAPSHOT_LEVEL) >= index.tip() {
                return Ok(0);
            }
            let plan = crate::restore::calc_plan(&index.all(), None).map_err(|e| {
                StorageError::Permanent {
                    op: "snapshot",
                    key: client.location(),
                    reason: e.to_string(),
                }
            })?;
            let out = build(
                m,
                client,
                staging,
                &plan,
                Some(TxId(1)),
                SNAPSHOT_LEVEL,
                counters,
            )
            .await?;
            index.insert(out);
            Ok(1)
        }
        Job::Retention => {
            if !m.retention_enabled {
                return Ok(0);
            }
            let doomed = schedule::retention_deletes(index, chrono::Utc::now(), m.retention);
            if doomed.is_empty() {
                return Ok(0);
            }
            let started = Instant::now();
            let deleted = client.delete(&doomed).await;
            counters.observe(3, started, &deleted);
            deleted?;
            index.remove(&doomed);
            Ok(doomed.len())
        }
    }
}

/// Restores the replica's latest state into the temporary directory and checks it
/// (file checksums, database checksum where present, `PRAGMA integrity_check`).
async fn verify(
    m: &Maintenance,
    client: &AnyClient,
    index: &RemoteIndex,
    counters: &ReplicaCounters,
) -> Result<(), StorageError> {
    let failed = |reason: String| StorageError::Permanent {
        op: "verify",
        key: client.location(),
        reason,
    };
    let plan = crate::restore::calc_plan(&index.all(), None).map_err(|e| failed(e.to_string()))?;
    fsutil::create_dir_all_durable(&m.tmp_dir).map_err(|e| failed(e.to_string()))?;
    let to = m.tmp_dir.join("verify.db");
    let opts = crate::restore::RestoreOptions {
        to: to.clone(),
        target: crate::restore::Target::Latest,
        force: true,
        integrity_check: true,
        phases: counters.phases.clone(),
        // One decoder thread and one checking connection: a verify runs beside the
        // application, whose cores it should not take.
        threads: Some(std::num::NonZeroUsize::MIN),
    };
    let result = crate::restore::apply(client, plan, &opts).await;
    let _ = std::fs::remove_file(&to);
    match result {
        Ok(report) => {
            tracing::info!(txid = %report.txid, pages = report.pages, threads = report.threads, "verify ok: the replica restores and passes integrity_check");
            Ok(())
        }
        Err(e) => {
            tracing::error!(error = %e, "verify FAILED: the replica does not restore cleanly");
            Err(failed(e.to_string()))
        }
    }
}

/// Local builds (merge, compress, fsync) running at once, across every replica of a Store.
/// Databases started together reach their first compaction together, and each build holds a
/// blocking thread whose stack and allocator arena stay in memory. The uploads that follow
/// are not bounded by it.
pub const MAX_BUILDS: usize = 8;

/// Merges `inputs` into one file of `level` and uploads it.
async fn build(
    m: &Maintenance,
    client: &AnyClient,
    staging: &Staging,
    inputs: &[LtxFileInfo],
    min_override: Option<TxId>,
    level: u8,
    counters: &ReplicaCounters,
) -> Result<LtxFileInfo, StorageError> {
    // Taken before the inputs are opened, so that no remote body waits idle for a turn.
    let turn = m
        .builds
        .acquire()
        .await
        .expect("the build semaphore is never closed");
    let handle = tokio::runtime::Handle::current();
    let mut readers: Vec<Input> = Vec::with_capacity(inputs.len());
    for f in inputs {
        let local = staging.path(f.min_txid);
        let local = (f.level == 0 && f.min_txid == f.max_txid)
            .then(|| std::fs::File::open(&local).ok())
            .flatten();
        match local {
            Some(file) => readers.push(Box::new(file)),
            None => {
                let opened = Instant::now();
                let body = client.open(f.level, f.min_txid, f.max_txid, 0).await;
                counters.observe(1, opened, &body);
                let body = body?;
                readers.push(Box::new(SyncIoBridge::new_with_handle(
                    body,
                    handle.clone(),
                )));
            }
        }
    }
    let min = min_override.unwrap_or(inputs[0].min_txid);
    let max = inputs[inputs.len() - 1].max_txid;
    let name = format!("{level}-{}", ltx::format_filename(min, max));
    let tmp = fsutil::unique_tmp_path(&m.tmp_dir.join(name));
    let tmp_dir = m.tmp_dir.clone();
    let codec = m.codec;
    let out_path = tmp.clone();
    let started = Instant::now();
    let summary = tokio::task::spawn_blocking(move || -> Result<_, String> {
        fsutil::create_dir_all_durable(&tmp_dir).map_err(|e| e.to_string())?;
        let decoders = readers
            .into_iter()
            .map(Decoder::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let file = fsutil::create_fresh(&out_path).map_err(|e| e.to_string())?;
        let opts = CompactOptions {
            codec,
            min_txid: min_override,
            timestamp: None,
        };
        let result = compactor::compact(decoders, file, opts).map_err(|e| e.to_string());
        let summary = match result {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&out_path);
                return Err(e);
            }
        };
        std::fs::File::open(&out_path)
            .and_then(|f| f.sync_all())
            .map_err(|e| e.to_string())?;
        Ok(summary)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r)
    .map_err(|reason| StorageError::Permanent {
        op: "compact",
        key: format!("level {level}"),
        reason,
    })?;
    drop(turn);
    let put_started = Instant::now();
    let put =
        crate::storage::put_new(client, level, min, max, &tmp, summary.header.timestamp).await;
    counters.observe(0, put_started, &put);
    if let Ok(info) = &put {
        counters.bytes[0].inc_by(info.size);
    }
    let _ = std::fs::remove_file(&tmp);
    let info = put?;
    tracing::info!(level, min = %min, max = %max, inputs = inputs.len(), bytes = info.size, elapsed = ?started.elapsed(), "compacted");
    Ok(info)
}
