//! Replica maintenance: level compactions, level-9 snapshots, retention and verifies, each on
//! its interval and only when there is something new, planned by the replica's upload task and
//! run as a task of their own beside it.
//!
//! Invariants:
//! - Outputs are built in a local temporary file, fsynced, then uploaded whole; a crash
//!   leaves at most a `.tmp` file locally and never a partial object remotely. An output that
//!   would be one staged segment again (a lone level-0 input, same codec, same first TXID) is
//!   that segment, hard-linked into the temporary directory and decoded whole before it is
//!   stored: only a segment that still verifies is stored twice.
//! - Level-0 inputs are read from local staging when present (staging keeps level-0 segments
//!   until level 1 covers them, unless L1 compaction keeps failing), so an L1 compaction
//!   costs no GET; missing ones are read from the replica. Staging stands only for level-0
//!   files this run stored ([`Work::Compact::staged_above`]): one found on the replica (at
//!   the start, at a divergence, in a later listing) may be another writer's at one of our
//!   TXIDs, and is read from the replica, with every level-0 file below it. (A file of ours
//!   replaced in place under its name is caught by its size only, and an encrypted one not.)
//! - Planning reads only the in-memory index: an idle replica makes no request. (The sweep
//!   for temporary files lists the replica after the start, then hourly only while the
//!   replica gets new files or the last sweep left some: see `Replica::start_next`.)
//! - A job never holds up the replica's uploads. It is planned from the index ([`plan`]) into
//!   [`Work`] that owns the files it reads or deletes, all older than anything an upload adds,
//!   runs as a task of its own ([`run`]), and its [`Done`] enters the index when it ends. One
//!   job runs at a time per replica, and the replica waits for it before anything that
//!   replaces its index (a wipe, a divergence, a seed).
//! - A dropped job stops its blocking part too: builds and verifies read through a
//!   [`Stoppable`](crate::util::stop::Stoppable) whose token the job holds, and remove their
//!   partial output.
//! - Builds and verifies take turns across the Store ([`Turns`]): at most [`MAX_BUILDS`]
//!   builds and [`MAX_VERIFIES`] verify at once, verifies handed out in the order replicas
//!   asked, so every database gets its verify.
//! - A passing verify vouches for the files it restored ([`plan_id`]), not for a TXID: once a
//!   snapshot or compaction changes what a restore reads, the next verify runs again, also at
//!   the same TXID. It vouches for them for `verify_recheck` only: files that never change
//!   are downloaded and checked again after it, as an object can rot or be replaced in place.

mod build;
pub mod compactor;
pub mod schedule;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::ltx::{Codec, TxId};
use crate::replicate::counters::ReplicaCounters;
use crate::replicate::staging::Staging;
use crate::storage::tmp_names::Swept;
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;
pub use build::MAX_BUILDS;
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
    /// How long a passing verify vouches for files that have not changed (zero: for ever).
    pub verify_recheck: Duration,
    /// How often the replica is listed to check that it still restores (zero: never).
    pub replica_check: Duration,
    /// Turns shared by every replica of a Store.
    pub turns: Turns,
}

/// Turns shared by every replica of a Store: jobs that would all come due together (the
/// databases started together) take them one after the other.
#[derive(Debug, Clone)]
pub struct Turns {
    /// Local builds (merge, compress, fsync), [`MAX_BUILDS`] at once.
    pub builds: std::sync::Arc<tokio::sync::Semaphore>,
    /// Verifies, [`MAX_VERIFIES`] at once.
    pub verifies: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns {
            builds: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_BUILDS)),
            verifies: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_VERIFIES)),
        }
    }
}

/// Verifies running at once across a Store. Each restores a whole database into the temporary
/// directory and checks it on one core: 400 databases with the same `verify-interval` would
/// otherwise hold 400 copies on disk and every core at once, every interval.
pub const MAX_VERIFIES: usize = 1;

/// How often a replica is swept for the temporary files of interrupted writes (while it gets
/// new files, or while the last sweep left some).
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Age from which a temporary file on a replica is a leftover: its last change, and the time
/// in its name, which a put under way always has recent (its file may carry an old LTX
/// timestamp), so the server's clock matters only for a lease write's file, which lives for
/// the length of one request.
pub const TMP_STALE: Duration = Duration::from_secs(3600);

/// A maintenance job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Compact into this level.
    Compact(u8),
    /// Write a level-9 snapshot.
    Snapshot,
    /// Delete what retention allows.
    Retention,
    /// Remove the temporary files that interrupted writes left on the replica.
    Sweep,
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
        if m.retention_enabled {
            // Once soon after the start (a crash's leftovers are found by the next start, and
            // removed once an hour old), then hourly while there is something to sweep.
            jobs.push((Job::Sweep, SWEEP_EVERY, now + m.retention_check));
        }
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

/// A due job with something to do, planned from the replica's index. It owns the files it
/// reads or deletes, so it can run beside the replica's uploads, which only add newer files.
#[derive(Debug)]
pub enum Work {
    /// Restore a chain and check the result.
    Verify {
        /// The chain's files, or why the index holds no chain to the tip (a gap, say).
        plan: Result<Vec<LtxFileInfo>, String>,
        /// Its newest TXID.
        tip: TxId,
        /// Which files those are ([`plan_id`]).
        id: u64,
    },
    /// Merge files into one file of a level.
    Compact {
        /// The level written.
        level: u8,
        /// The files merged.
        inputs: Vec<LtxFileInfo>,
        /// Staging stands for level-0 files above this TXID only (those this run stored);
        /// the others are read from the replica.
        staged_above: TxId,
    },
    /// Merge a restore plan into one level-9 snapshot.
    Snapshot {
        /// The plan's files.
        plan: Vec<LtxFileInfo>,
        /// As [`Work::Compact::staged_above`].
        staged_above: TxId,
    },
    /// Delete files.
    Retention {
        /// The files deleted.
        doomed: Vec<LtxFileInfo>,
    },
    /// Remove temporary files older than [`TMP_STALE`].
    Sweep,
}

/// What a finished job changed on the replica, for the index.
#[derive(Debug)]
pub enum Done {
    /// Nothing: a verify passed, of the restore plan [`plan_id`] names.
    Checked(u64),
    /// Nothing: a verify found that the replica does not restore to `tip`, because of
    /// `reason` (its content, not a request that failed).
    Unrestorable {
        /// The TXID the verify tried to restore.
        tip: TxId,
        /// What the restore or its check said.
        reason: String,
    },
    /// This file was stored.
    Stored(LtxFileInfo),
    /// These files were deleted.
    Deleted(Vec<LtxFileInfo>),
    /// Nothing the index holds: temporary files were removed. `again`: the next sweep must
    /// run even if the replica stays idle (it failed, or left leftovers too young to remove).
    Swept {
        /// Sweep again at the next interval.
        again: bool,
    },
}

impl Done {
    /// Records the change in `index`; returns how many files it uploaded or deleted.
    pub fn apply(self, index: &mut RemoteIndex) -> usize {
        match self {
            Done::Checked(_) | Done::Unrestorable { .. } | Done::Swept { .. } => 0,
            Done::Stored(f) => {
                index.insert(f);
                1
            }
            Done::Deleted(doomed) => {
                index.remove(&doomed);
                doomed.len()
            }
        }
    }
}

/// A verify that passed: which files it restored ([`plan_id`]) and when it ended.
#[derive(Debug, Clone, Copy)]
pub struct Verified {
    /// The restore plan's id.
    pub plan: u64,
    /// When the verify passed.
    pub at: Instant,
}

impl Verified {
    /// True while this verify still vouches for plan `id`: the same files, checked less than
    /// `recheck` ago (zero: for ever).
    fn vouches_for(&self, id: u64, recheck: Duration) -> bool {
        self.plan == id && (recheck.is_zero() || self.at.elapsed() < recheck)
    }
}

/// Names the files of a restore plan: equal ids, the same files (level, range and size).
pub fn plan_id(files: &[LtxFileInfo]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in files {
        (f.level, f.min_txid.0, f.max_txid.0, f.size).hash(&mut h);
    }
    h.finish()
}

/// Plans `job` from `index` (no request): `None` when it has nothing to do. `verified`: the
/// last verify that passed. A verify runs again once the restore plan changed, by a new TXID
/// or by maintenance at the same one (a snapshot or a compaction that a restore now reads
/// instead of what was verified), or once `verify_recheck` has passed since. `staged_above`:
/// see [`Work::Compact::staged_above`].
pub fn plan(
    job: Job,
    m: &Maintenance,
    client: &AnyClient,
    index: &RemoteIndex,
    verified: Option<Verified>,
    staged_above: TxId,
) -> Result<Option<Work>, StorageError> {
    let failed = |op: &'static str, reason: String| StorageError::Permanent {
        op,
        key: client.location(),
        reason,
    };
    Ok(match job {
        Job::Verify => {
            let tip = index.tip();
            let plan = crate::restore::calc_plan(&index.all(), None).map_err(|e| e.to_string());
            let id = plan.as_deref().map_or(0, plan_id);
            let vouched = verified.is_some_and(|v| v.vouches_for(id, m.verify_recheck));
            if tip.0 == 0 || (plan.is_ok() && vouched) {
                return Ok(None);
            }
            Some(Work::Verify { plan, tip, id })
        }
        Job::Compact(level) => {
            let inputs = schedule::compaction_inputs(index, level);
            (!inputs.is_empty()).then_some(Work::Compact {
                level,
                inputs,
                staged_above,
            })
        }
        Job::Snapshot => {
            if index.max_txid(SNAPSHOT_LEVEL) >= index.tip() {
                return Ok(None);
            }
            let plan = crate::restore::calc_plan(&index.all(), None)
                .map_err(|e| failed("snapshot", e.to_string()))?;
            Some(Work::Snapshot { plan, staged_above })
        }
        Job::Retention => {
            if !m.retention_enabled {
                return Ok(None);
            }
            let doomed = schedule::retention_deletes(index, chrono::Utc::now(), m.retention);
            (!doomed.is_empty()).then_some(Work::Retention { doomed })
        }
        Job::Sweep => m.retention_enabled.then_some(Work::Sweep),
    })
}

/// Runs planned work.
pub async fn run(
    work: Work,
    m: &Maintenance,
    client: &AnyClient,
    staging: &Staging,
    counters: &ReplicaCounters,
) -> Result<Done, StorageError> {
    match work {
        Work::Verify { plan, tip, id } => {
            let verdict = match plan {
                Ok(plan) => verify(m, client, plan, counters).await,
                Err(reason) => {
                    tracing::error!(error = %reason, "verify FAILED: the replica's files hold no chain to their newest TXID");
                    Ok(Err(reason))
                }
            };
            // A verify that could not run (a request failed) is no verdict: the last one
            // stands, where a 0 here read as "failed" and sent a verify-failed webhook.
            if let Ok(v) = &verdict {
                counters.verify_ok.set(i64::from(v.is_ok()));
                counters.verify_txid.set(tip.0 as i64);
            }
            match verdict? {
                Ok(()) => Ok(Done::Checked(id)),
                Err(reason) => Ok(Done::Unrestorable { tip, reason }),
            }
        }
        Work::Compact {
            level,
            inputs,
            staged_above,
        } => {
            let staged = build::Staged::new(staging, staged_above);
            build::build(m, client, staged, &inputs, None, level, counters)
                .await
                .map(Done::Stored)
        }
        Work::Snapshot { plan, staged_above } => build::build(
            m,
            client,
            build::Staged::new(staging, staged_above),
            &plan,
            Some(TxId(1)),
            SNAPSHOT_LEVEL,
            counters,
        )
        .await
        .map(Done::Stored),
        Work::Retention { doomed } => {
            let started = Instant::now();
            let deleted = client.delete(&doomed).await;
            counters.observe(3, started, &deleted);
            deleted?;
            Ok(Done::Deleted(doomed))
        }
        // Housekeeping, not protection: a sweep that fails is said in the log and tried again
        // at the next sweep, and never marks the replica's maintenance as failing.
        Work::Sweep => match sweep(client, counters, TMP_STALE).await {
            Ok(swept) => {
                if swept.removed > 0 {
                    tracing::info!(
                        files = swept.removed,
                        "removed temporary files that interrupted writes left on the replica"
                    );
                }
                Ok(Done::Swept {
                    again: swept.young > 0,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not remove the temporary files that interrupted writes left on the replica; tried again at the next sweep");
                Ok(Done::Swept { again: true })
            }
        },
    }
}

/// Sweeps the replica's temporary files `older` than that, counted as one listing, plus one
/// delete when it removed any, on the backends that list for it (directory, SFTP, WebDAV).
async fn sweep(
    client: &AnyClient,
    counters: &ReplicaCounters,
    older: Duration,
) -> Result<Swept, StorageError> {
    let started = Instant::now();
    let swept = client.sweep_tmp(older).await;
    if !matches!(&swept, Ok(s) if !s.listed) {
        counters.observe(2, started, &swept);
    }
    if swept.as_ref().is_ok_and(|s| s.removed > 0) {
        counters.ops[3].inc();
    }
    swept
}

/// Restores the chain `plan` into the temporary directory and checks it (file checksums,
/// database checksum where present, `PRAGMA integrity_check`). The verdict is `Err` with the
/// reason when the replica's content does not restore; the outer error is a verify that
/// could not run to a verdict (a request or the local disk failed, or it was stopped).
async fn verify(
    m: &Maintenance,
    client: &AnyClient,
    plan: Vec<LtxFileInfo>,
    counters: &ReplicaCounters,
) -> Result<Result<(), String>, StorageError> {
    let failed = |reason: String| StorageError::Permanent {
        op: "verify",
        key: client.location(),
        reason,
    };
    // The restore makes `tmp_dir` on the blocking pool (a mkdir and a directory fsync, here
    // after every start, which empties it, would run on the runtime's threads).
    // Its own name: a dropped verify's restore may still be ending under the last one.
    let to = fsutil::unique_tmp_path(&m.tmp_dir.join("verify.db"));
    // Also when this job is dropped after its restore published the file.
    let remove = fsutil::RemoveOnDrop(to.clone());
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
    let started = Instant::now();
    let result = crate::restore::apply(client, plan, &opts).await;
    remove.remove().await;
    match result {
        Ok(report) => {
            tracing::info!(txid = %report.txid, pages = report.pages, threads = report.threads, elapsed = ?started.elapsed(), "verify ok: the replica restores and passes integrity_check");
            Ok(Ok(()))
        }
        Err(e) if unrestorable(&e) => {
            tracing::error!(error = %e, "verify FAILED: the replica does not restore cleanly");
            Ok(Err(e.to_string()))
        }
        Err(e) => {
            tracing::warn!(error = %e, "verify could not run to a verdict; it runs again at its next interval");
            Err(failed(e.to_string()))
        }
    }
}

/// Whether a restore failed on the replica's content (a file that does not decode, fit or
/// exist, a hole, a database that fails its check), not on a request, the local machine or
/// a stop. A read that failed inside a file's stream counts only when it said the bytes are
/// invalid (a codec's error): a download cut short is no verdict; nor is a check SQLite
/// could not run for a local reason.
fn unrestorable(e: &crate::restore::RestoreError) -> bool {
    use crate::ltx::LtxError;
    use crate::restore::RestoreError as E;
    const LOCAL: [&str; 5] = [
        "cannot open",
        "cannot watch",
        "disk I/O error",
        "out of memory",
        "unable to open",
    ];
    match e {
        E::Ltx {
            source: LtxError::Io(io),
            ..
        } => io.kind() == std::io::ErrorKind::InvalidData,
        E::Integrity(why) if LOCAL.iter().any(|l| why.contains(l)) => false,
        E::Storage(StorageError::NotFound(_)) => true,
        E::NoBackups(_)
        | E::Gap { .. }
        | E::NotAvailable { .. }
        | E::Ltx { .. }
        | E::Inconsistent(_)
        | E::Integrity(_) => true,
        E::Exists(_) | E::Busy(_) | E::Storage(_) | E::Io { .. } | E::Cancelled => false,
        // A follower's alone: a verify never meets them.
        E::Diverged { .. } | E::NotFollowed { .. } | E::Unproven { .. } => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicate::counters::ReplicaMetrics;

    /// A sweep's requests count in the replica's operations: `/metrics` and `/status` would
    /// otherwise miss the only requests an idle, clean replica makes besides its lease.
    #[tokio::test]
    async fn a_sweep_counts_as_a_listing_and_its_removals_as_a_delete() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let level = dir.path().join("ltx/0");
        std::fs::create_dir_all(&level).expect("a level directory");
        let leftover =
            level.join("0000000000000001-0000000000000001.ltx.4242.1700000000000000000.tmp");
        std::fs::write(&leftover, b"cut").expect("a leftover");
        let client =
            AnyClient::from_url(&dir.path().display().to_string()).expect("a directory replica");
        let metrics = ReplicaMetrics::register(&prometheus::Registry::new(), Default::default());
        let counters = metrics.replica("db", "r", false);
        let ops = |c: &ReplicaCounters| c.ops.each_ref().map(prometheus::IntCounter::get);
        let swept = sweep(&client, &counters, Duration::ZERO)
            .await
            .expect("a sweep");
        assert_eq!(swept.removed, 1);
        assert!(!leftover.exists());
        assert_eq!(ops(&counters), [0, 0, 1, 1], "put, get, list, delete");
        sweep(&client, &counters, Duration::ZERO)
            .await
            .expect("a sweep");
        assert_eq!(ops(&counters), [0, 0, 2, 1], "nothing removed: no delete");
    }
}
