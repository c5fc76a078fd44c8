//! One destination of one database, and its upload task.
//!
//! The upload task sleeps until the database's position changes, an idle heartbeat fires (it
//! sends no request when nothing is new), a retry timer fires, its maintenance job ends, or
//! the verify turn it waits for comes.
//! It uploads staged segments strictly in TXID order and advances its remote position only
//! after a whole object is stored; the position it acknowledges lets the database prune
//! staging.
//!
//! Invariants:
//! - An idle replica makes no call to its client but the lease refresh and one listing per
//!   `replica-check-interval`: the remote contents are known from the listing at start and
//!   tracked in memory afterwards; the periodic listing finds files deleted behind our back.
//! - The remote position advances by one TXID per acknowledged PUT, never past a failure.
//! - A segment uploaded while it is staged ([`crate::storage::feed`]; plain S3 only, and only
//!   the TXID after the remote position) becomes an object only once it is published
//!   locally; until then its parts are an incomplete multipart upload, invisible to readers.
//! - An error streak is logged once when it starts and once when it ends, not per retry.
//! - Nothing is written before the single-writer lease ([`crate::replicate::lease`]) is acquired; an
//!   upload round first checks it (one GET; with conditional writes, only once
//!   [`Lease::reread_after`] has passed since a check found it ours), a maintenance job that
//!   writes starts only after a round found it fresh (a verify, which only reads, starts as
//!   soon as its turn comes), and a replica whose lease was taken stops for good
//!   (logged as an error, shown by `/readyz`; its running job is aborted, though one request
//!   already sent may still land). A vanished lease aborts the running job before the listing
//!   that decides what to do. A clean shutdown drops a running verify, waits for any
//!   other job unless the shutdown's timeout cancels it, then releases the lease.
//! - Maintenance runs beside uploads: a commit ships while a snapshot or a verify of the
//!   whole database is being built (see [`crate::replicate::maintenance`]). Only the rare
//!   paths that replace the index (a seed, a divergence, a wipe) wait for the running job.
//! - Every replica converges: when its chain cannot be continued from staging (a new or
//!   emptied replica, one wiped behind our back, or one behind what staging still holds),
//!   it is re-seeded with a snapshot of the live database ([`crate::replicate::db::SeedSnapshot`],
//!   stored at level 9 as `1-<txid>`) and continues with the staged segments after it. A
//!   wipe is noticed without any extra request: the next lease check (of an upload round, at
//!   most `reread_after` after the last one, or of a refresh) finds the lease gone, and one
//!   listing then tells a wipe (the replica's tip is below ours) from a lease deleted alone.
//!   Worst case from a wipe to a restorable replica: the next commit (10 s later on a store
//!   with conditional writes), or half the lease TTL when idle (5 min by default), plus the
//!   time to upload one snapshot.
//! - A replica whose verify fails is re-seeded at the database's TXID; where an idle
//!   database's level-9 snapshot already stands at that TXID (so the verify failed on it),
//!   it is deleted and the seed put in its place, so the replica heals without a commit.
//! - A replica that cannot be written says so: its [`HealthCell`](crate::replicate::health::HealthCell) holds the reason from the
//!   first failed round until a round succeeds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::ltx::{self, TxId};
use crate::replicate::counters::ReplicaCounters;
use crate::replicate::db::{DbPos, RemoteTip, SeedRequests};
use crate::replicate::lease::{Lease, LeaseError};
use crate::replicate::maintenance::schedule::RemoteIndex;
use crate::replicate::maintenance::{Done, Job, Maintenance, Schedule, Verified};
use crate::replicate::staging::Staging;
use crate::storage::feed::GrowingSegment;
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, StorageError, put_new};
use crate::util::clock::steady_of;
use crate::util::phase::Phase;
use crate::util::retry::Backoff;

mod converge;
mod jobs;
mod stats;
pub use crate::replicate::health::SeedReason;
pub use stats::ReplicaStats;

/// One replica of one database.
pub struct Replica {
    name: String,
    db: String,
    client: AnyClient,
    staging: Staging,
    remote: TxId,
    ack_tx: watch::Sender<TxId>,
    stats: ReplicaStats,
    heartbeat: Duration,
    index: RemoteIndex,
    maint: Maintenance,
    lease: Lease,
    /// Where to ask the database for a seed snapshot (None: this replica cannot be seeded).
    seeds: Option<SeedRequests>,
    /// The replica was found wiped: the next seed counts as that.
    wiped: bool,
    /// The codec of the newest file found at start (plain files only).
    remote_codec: Option<ltx::Codec>,
    /// Unreachable at start: the upload task takes the lease and lists the replica first.
    deferred: bool,
    /// A seed to store before anything else (set when a late listing asks for a new chain).
    pending_seed: Option<SeedReason>,
    /// The segment whose upload time [`Replica::uploading`] recorded (0: none since the last
    /// one stored).
    uploading: TxId,
    /// Level-1 compactions that failed in a row (see `compacted_l1`).
    l1_failures: u32,
    /// The maintenance jobs whose last run failed ([`ReplicaStats::maintenance`]).
    maint_failing: Vec<Job>,
    /// The index (tip, files) at the last look for failing jobs with nothing left to do.
    moot_checked: Option<(TxId, usize)>,
    /// Why the last verify found that the replica does not restore: it is not protected
    /// until a verify passes again (after the seed that heals it).
    unrestorable: Option<String>,
    /// The last verify that passed; None: none since the start or a failure.
    verified: Option<Verified>,
    /// The newest TXID of the level-0 files found on the replica rather than stored by this
    /// run ([`Replica::found_on_replica`]): another writer may have stored them at TXIDs
    /// staging also holds, so compactions read every level-0 file up to it from the replica
    /// ([`crate::replicate::maintenance::Work::Compact`]).
    found_tip: TxId,
    /// The replica's newest TXID at the last sweep for temporary files (None: none yet).
    swept: Option<TxId>,
    /// A seed is owed to heal a failed verify: stored after the round's uploads.
    heal_owed: bool,
    /// A seed was stored since the verify failed (another failure then points at the
    /// database itself, and no further seed is made).
    healed: bool,
    /// A seed was stored since the verify failed and no verify has run since (see
    /// `confirm_heal`).
    heal_unverified: bool,
    /// A file of ours was found missing: list the replica before the next upload.
    recheck: bool,
    /// When the replica is next listed to check that it still restores (`replica_check`).
    next_check: Option<Instant>,
    /// The TXID a verify last failed to restore to (0: none since the start).
    failed_tip: TxId,
    /// Maintenance jobs that came due and wait for the running one, in order.
    due: VecDeque<Job>,
    /// The maintenance job running beside the uploads (aborted if the replica stops).
    job: Option<(Job, AbortOnDropHandle<Result<Done, StorageError>>)>,
    /// A verify turn this replica waited for in line, used by the next job start.
    verify_turn: Option<OwnedSemaphorePermit>,
}

/// A segment's header time `timestamp_ms` on the steady clock, as the lag stats hold it.
fn cut_time(timestamp_ms: i64) -> u64 {
    u64::try_from(steady_of(timestamp_ms)).unwrap_or(0)
}

/// A finished maintenance job's result, or its task's failure.
type Finished = Result<Result<Done, StorageError>, tokio::task::JoinError>;

/// A place in line for a verify turn.
type TurnWait = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<OwnedSemaphorePermit, tokio::sync::AcquireError>>
            + Send,
    >,
>;

impl Replica {
    /// A replica named `name` of database `db` (for logs), uploading from `staging`, under
    /// `lease`, which the caller has acquired.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        db: String,
        client: AnyClient,
        staging: Staging,
        heartbeat: Duration,
        counters: ReplicaCounters,
        maint: Maintenance,
        lease: Lease,
    ) -> Replica {
        let (ack_tx, _) = watch::channel(TxId(0));
        let stats = ReplicaStats::new(counters, &client.location());
        Replica {
            lease,
            name,
            db,
            client,
            staging,
            remote: TxId(0),
            ack_tx,
            stats,
            heartbeat,
            index: RemoteIndex::default(),
            maint,
            seeds: None,
            wiped: false,
            remote_codec: None,
            deferred: false,
            pending_seed: None,
            unrestorable: None,
            heal_owed: false,
            healed: false,
            heal_unverified: false,
            uploading: TxId(0),
            verified: None,
            found_tip: TxId(0),
            swept: None,
            l1_failures: 0,
            maint_failing: Vec::new(),
            moot_checked: None,
            recheck: false,
            next_check: None,
            failed_tip: TxId(0),
            due: VecDeque::new(),
            verify_turn: None,
            job: None,
        }
    }

    /// The codec of the newest (plain) file the replica held at start: `Lz4` means Litestream
    /// can restore it.
    pub fn remote_codec(&self) -> Option<ltx::Codec> {
        self.remote_codec
    }

    /// Writes compaction and snapshot outputs with `codec` (the database's, once decided).
    pub fn set_output_codec(&mut self, codec: ltx::Codec) {
        self.maint.codec = codec;
    }

    /// Its lease and counters, for a start that failed after taking it.
    pub(crate) fn into_lease(self) -> (ReplicaCounters, Lease) {
        (self.stats.counters, self.lease)
    }

    /// Releases its lease (a start that failed).
    pub(crate) async fn release_lease(mut self) {
        self.lease.release(&self.stats.counters).await;
    }

    /// Lets this replica ask its database for seed snapshots (see the module doc).
    pub fn with_seeds(mut self, seeds: SeedRequests) -> Replica {
        self.seeds = Some(seeds);
        self
    }

    /// The replica's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the client uploads segments while they are staged (wants the segment feed).
    pub fn streams_segments(&self) -> bool {
        self.client.streaming().is_some()
    }

    /// Counters.
    pub fn stats(&self) -> ReplicaStats {
        self.stats.clone()
    }

    /// Acknowledged remote positions.
    pub fn acks(&self) -> watch::Receiver<TxId> {
        self.ack_tx.subscribe()
    }

    /// Lists the replica once (every level) to learn where its chain ends, trying up to
    /// `attempts` times while it fails transiently.
    pub async fn init_with(&mut self, attempts: u32) -> Result<RemoteTip, StorageError> {
        let mut tip = RemoteTip::default();
        let mut newest = None;
        let files = self.list_with_retries(attempts).await?;
        // Files that do not restore up to their own tip (a wipe that spared the newest, or
        // history retired without a snapshot): the chain starts over with a seed.
        let tip_txid = files.iter().map(|f| f.max_txid).max().unwrap_or_default();
        let broken = tip_txid.0 > 0
            && crate::restore::calc_plan(&files, None)
                .ok()
                .and_then(|p| p.last().map(|f| f.max_txid))
                .is_none_or(|t| t < tip_txid);
        if broken {
            tracing::warn!(db = %self.db, replica = %self.name, tip = %tip_txid, "the replica's files do not restore up to its newest one; it gets a seed snapshot");
        }
        self.found_on_replica(&files);
        for f in &files {
            self.index.insert(f.clone());
        }
        // The newest file of the lowest level that holds the tip: the same file a per-level
        // scan from level 0 upwards would pick.
        if let Some(f) = files
            .iter()
            .filter(|f| f.max_txid > TxId(0))
            .max_by_key(|f| (f.max_txid, std::cmp::Reverse(f.level)))
        {
            tip.txid = f.max_txid;
            newest = Some(f.clone());
        }
        let encrypts = self.client.age().is_some_and(|a| a.encrypts());
        if let Some(age) = self.client.age()
            && encrypts
            && let Err(e) = age.write_note().await
        {
            tracing::warn!(db = %self.db, replica = %self.name, error = %e, "could not write the age recipients note");
        }
        if let Some(f) = &newest
            && f.encrypted != encrypts
        {
            // The new chain starts with a full segment, so restoring the newest state needs
            // no file of the other kind after it; older files stay readable as they are.
            let (reason, how) = if encrypts {
                ("replica switched to age encryption", "encrypted")
            } else {
                ("replica switched off age encryption", "plain")
            };
            tracing::warn!(
                db = %self.db,
                replica = %self.name,
                tip = %f.max_txid,
                "REPLICA ENCRYPTION CHANGED: the replica's newest file is {} but the config says {how}; \
                 starting a new chain with a full snapshot at the next TXID (older files stay as they are)",
                if f.encrypted { "age-encrypted" } else { "plain" },
            );
            tip.full_reason = Some(reason);
        }
        if let Some(f) = newest {
            tip.post_apply_checksum = self.read_post_apply(&f).await.unwrap_or(0);
            let header = self.read_remote_header(&f).await.ok().flatten();
            tip.page_size = header.map_or(0, |h| h.page_size);
            self.remote_codec = header.filter(|_| !f.encrypted).and_then(|h| h.codec().ok());
            if !self
                .is_our_chain(&f, header.as_ref(), tip.post_apply_checksum)
                .await
            {
                tracing::warn!(db = %self.db, replica = %self.name, tip = %f.max_txid, "the replica's newest file is not the one this database staged for that TXID: another writer continued the chain; it gets a seed snapshot after a full segment");
                tip.full_reason = Some("a replica was continued by another writer");
                self.pending_seed = Some(SeedReason::Behind);
            }
            // Mtime (file) or upload time (S3): close to the segment's own timestamp, so lag
            // in seconds is meaningful right after a restart.
            let ms = cut_time(f.created_at.timestamp_millis());
            self.stats.remote_steady_ms.store(ms, Ordering::Relaxed);
        }
        // A replica that does not restore holds nothing usable: it starts over from a seed
        // (the database still continues after its tip, so no TXID is used twice).
        let holds = if broken { TxId(0) } else { tip.txid };
        self.wiped |= broken;
        self.remote = holds;
        self.stats.remote_txid.store(holds.0, Ordering::Relaxed);
        self.stats.counters.txid.set(holds.0 as i64);
        self.send_ack();
        Ok(tip)
    }

    async fn read_post_apply(&self, f: &crate::storage::LtxFileInfo) -> Result<u64, StorageError> {
        let started = Instant::now();
        let r = self.client.read_tail(f, ltx::TRAILER_SIZE).await;
        self.stats.counters.observe(1, started, &r);
        let tail = r?;
        let b: [u8; 8] = tail
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| StorageError::Permanent {
                op: "get",
                key: ltx::format_filename(f.min_txid, f.max_txid),
                reason: "file shorter than an LTX trailer".into(),
            })?;
        Ok(u64::from_be_bytes(b))
    }

    /// The header of `f` (`None` when it does not decode).
    async fn read_remote_header(
        &self,
        f: &crate::storage::LtxFileInfo,
    ) -> Result<Option<ltx::Header>, StorageError> {
        use tokio::io::AsyncReadExt;
        let started = Instant::now();
        let r = self.client.open(f.level, f.min_txid, f.max_txid, 0).await;
        self.stats.counters.observe(1, started, &r);
        let mut r = r?;
        let mut b = [0u8; ltx::HEADER_SIZE];
        r.read_exact(&mut b)
            .await
            .map_err(|e| StorageError::Transient {
                op: "get",
                key: ltx::format_filename(f.min_txid, f.max_txid),
                reason: e.to_string(),
            })?;
        Ok(ltx::Header::decode(&b).ok())
    }

    /// Acknowledges what staging may drop: segments on the replica and, when levels are
    /// configured, covered by level 1 (so L1 compaction reads them locally, without a GET),
    /// unless level-1 compaction keeps failing.
    fn send_ack(&self) {
        let ack = if self.maint.levels.is_empty() || self.l1_failures >= L1_FAILURES_BEFORE_PRUNING
        {
            self.remote
        } else {
            self.remote.min(self.index.max_txid(1))
        };
        self.ack_tx.send_if_modified(|a| {
            let changed = *a != ack;
            *a = ack;
            changed
        });
    }

    /// Lists a level, retrying transient failures: a replica that blinks at startup must not
    /// stop the daemon, while a permanent error (credentials, missing bucket) fails at once.
    async fn list_with_retries(&self, attempts: u32) -> Result<Vec<LtxFileInfo>, StorageError> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut attempt = 1;
        loop {
            let started = Instant::now();
            let listed = self.client.list_all().await;
            self.stats.counters.observe(2, started, &listed);
            match listed {
                Ok(files) => return Ok(files),
                Err(e) => {
                    if !e.is_retryable() || attempt >= attempts {
                        return Err(e);
                    }
                    tracing::debug!(db = %self.db, replica = %self.name, attempt, error = %e, "listing the replica failed; retrying");
                    attempt += 1;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Uploads staged segments after the remote position up to `target`, in order. A
    /// segment missing from staging (or unreadable there) means the chain cannot be continued
    /// from it: [`RoundError::NeedsSeed`].
    async fn upload_until(&mut self, target: TxId) -> Result<(), RoundError> {
        while self.remote < target {
            let txid = TxId(self.remote.0 + 1);
            let path = self.staging.path(txid);
            let read = self
                .staging
                .off_reactor(move |s| {
                    let h = s.header(txid);
                    // Missing, not unreadable: a network file system's error is retried.
                    let missing = h.is_err() && matches!(s.path(txid).try_exists(), Ok(false));
                    (h, missing)
                })
                .await;
            let header = match read {
                (Ok(h), _) => h,
                (Err(e), true) => {
                    tracing::debug!(db = %self.db, replica = %self.name, %txid, error = %e, "next segment not in staging");
                    return Err(RoundError::NeedsSeed(self.seed_reason()));
                }
                // Damaged (not an LTX header, or cut short), not unreadable: staging publishes
                // whole files only, so no retry reads it whole again; the chain continues
                // after it from a seed.
                (Err(e), false) if !matches!(e, ltx::LtxError::Io(_)) => {
                    tracing::error!(db = %self.db, replica = %self.name, %txid, error = %e, "staged segment damaged: continuing the replica after it with a seed snapshot");
                    return Err(RoundError::NeedsSeed(self.seed_reason()));
                }
                (Err(e), false) => {
                    return Err(RoundError::Storage(StorageError::Transient {
                        op: "read staged segment",
                        key: path.display().to_string(),
                        reason: e.to_string(),
                    }));
                }
            };
            self.uploading(txid, header.timestamp);
            let started = Instant::now();
            let put = put_new(&self.client, 0, txid, txid, &path, header.timestamp).await;
            let bytes = put.as_ref().map_or(0, |info| info.size);
            self.stats
                .counters
                .phases
                .record(Phase::Upload, bytes, started.elapsed());
            self.stats.counters.observe(0, started, &put);
            match put {
                Err(StorageError::Conflict { .. }) => return Err(RoundError::Diverged(txid)),
                put => self.stored(put.map_err(RoundError::Storage)?, header.timestamp),
            }
        }
        Ok(())
    }

    /// Uploads the segment after the remote position while it is being staged (see
    /// [`crate::storage::feed`]). Stores nothing if the segment fails or stays within one part;
    /// the plain upload of the staged file then takes over.
    async fn upload_growing(&mut self, seg: &Arc<GrowingSegment>) -> Result<(), StorageError> {
        // Recorded also without streaming: the plain upload of this segment comes next.
        self.uploading(seg.txid, seg.timestamp_ms);
        let Some(s3) = self.client.streaming() else {
            return Ok(());
        };
        let started = Instant::now();
        let put = s3.put_streamed(0, seg).await;
        if let Ok(None) = put {
            return Ok(());
        }
        self.stats.counters.observe(0, started, &put);
        if let Some(info) = put? {
            tracing::info!(db = %self.db, replica = %self.name, txid = %seg.txid, bytes = info.size, elapsed = ?started.elapsed(), "segment uploaded while it was staged");
            self.stats.streamed_segments.fetch_add(1, Ordering::Relaxed);
            self.stored(info, seg.timestamp_ms);
        }
        Ok(())
    }

    /// Records a stored level-0 segment: the remote position advances to it.
    fn stored(&mut self, info: LtxFileInfo, timestamp_ms: i64) {
        let txid = info.max_txid;
        self.remote = txid;
        self.stats.counters.bytes[0].inc_by(info.size);
        self.index.insert(info);
        self.stats.counters.txid.set(txid.0 as i64);
        self.stats.remote_txid.store(txid.0, Ordering::Relaxed);
        // The time read when its upload began, if it is that segment: a clock step since then
        // does not move it.
        let next = self.stats.next_steady_ms.load(Ordering::Relaxed);
        let ms = if txid == self.uploading && next > 0 {
            next
        } else {
            cut_time(timestamp_ms)
        };
        self.stats.remote_steady_ms.store(ms, Ordering::Relaxed);
        self.stats.next_steady_ms.store(0, Ordering::Relaxed);
        self.uploading = TxId(0);
        self.send_ack();
    }

    /// The upload of segment `txid`, cut at `timestamp_ms`, begins: the replica's lag counts
    /// from that cut. Read once per TXID, so that retries after a step of the wall clock keep
    /// the time read before it.
    fn uploading(&mut self, txid: TxId, timestamp_ms: i64) {
        if self.uploading != txid {
            self.uploading = txid;
            self.stats
                .next_steady_ms
                .store(cut_time(timestamp_ms), Ordering::Relaxed);
        }
    }

    /// Stops this replica for good after its lease was taken or removed.
    fn lease_lost(&self, e: &LeaseError) {
        tracing::error!(db = %self.db, replica = %self.name, error = %e, remote_txid = %self.remote, "single-writer lease lost; this replica stops uploading");
        self.stats.lease_lost.store(true, Ordering::Relaxed);
        self.stats.health.stop(format!("stopped: {e}"));
    }

    /// The upload task: runs until the database's position channel closes and everything is
    /// uploaded (a clean shutdown, which releases the lease), until `abort` is cancelled, or
    /// until the lease is lost.
    ///
    /// `feed`, given to a client that can use it, announces large segments while they are
    /// staged: the next one is uploaded as it grows.
    pub async fn run(
        mut self,
        mut pos_rx: watch::Receiver<DbPos>,
        mut feed: Option<watch::Receiver<Option<Arc<GrowingSegment>>>>,
        abort: CancellationToken,
    ) {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        let mut streak: Option<(Instant, u32)> = None;
        let mut schedule = Schedule::new(&self.maint, Instant::now());
        // A place in line for a verify turn, kept across wake-ups so that every replica gets
        // its turn in order (boxed: held only while a verify waits).
        let mut in_line: Option<TurnWait> = None;
        loop {
            let target = pos_rx.borrow_and_update().txid;
            let closed = pos_rx.has_changed().is_err();
            // Only the segment right after the remote position, and only when caught up:
            // positions advance in order.
            let growing = feed
                .as_mut()
                .and_then(|rx| rx.borrow_and_update().clone())
                .filter(|s| self.remote >= target && s.txid == TxId(self.remote.0 + 1));
            // An upload round checks the lease first (one GET) unless a recent check spares
            // it; an idle wake-up only refreshes it when half its TTL has passed. The round
            // future is boxed: inline it would make every idle replica task ~15 KB (the task
            // holds its largest state), 6 MB of the daemon's RSS at 400 databases.
            let round = Box::pin(async {
                if self.deferred {
                    if target.0 == 0 {
                        // The database's first sync has not published a position yet.
                        return Err(RoundError::NotYet);
                    }
                    self.connect(target).await?;
                }
                let checked = if self.remote < target
                    || growing.is_some()
                    || self.pending_seed.is_some()
                    || self.heal_owed
                {
                    self.lease.check_if_due(&self.stats.counters).await
                } else {
                    self.lease.refresh_if_due(&self.stats.counters).await
                };
                match checked {
                    Err(e) if e.is_vanished() => self.lease_vanished().await?,
                    r => r?,
                }
                if self.recheck {
                    self.recheck_listing().await?;
                } else if self.check_due(self.remote >= target && growing.is_none() && !closed) {
                    self.periodic_check().await;
                }
                if let Some(reason) = self.pending_seed {
                    self.reseed(reason, target).await?;
                    self.pending_seed = None;
                }
                if let Some(seg) = &growing {
                    self.upload_growing(seg)
                        .await
                        .map_err(RoundError::Storage)?;
                }
                match self.upload_until(target).await {
                    Err(RoundError::NeedsSeed(reason)) => {
                        self.reseed(reason, target).await?;
                        self.upload_until(target).await
                    }
                    Err(RoundError::Diverged(txid)) => {
                        self.diverged(txid).await?;
                        self.reseed(SeedReason::Behind, target).await?;
                        self.upload_until(target).await
                    }
                    r => r,
                }?;
                if self.heal_owed && !closed {
                    self.heal(target).await;
                }
                Ok(())
            });
            let result = tokio::select! {
                _ = abort.cancelled() => return,
                r = round => r,
            };
            let retry = match result {
                Ok(()) => {
                    if let Some((since, failures)) = streak.take() {
                        tracing::info!(db = %self.db, replica = %self.name, failures, after = ?since.elapsed(), "replica recovered");
                    }
                    match &self.unrestorable {
                        // Uploads do not make a replica that failed its verify restorable.
                        Some(why) => {
                            self.stats.health.fail(why.clone());
                        }
                        None => {
                            self.stats.health.recover();
                        }
                    }
                    backoff.reset();
                    if closed {
                        // A verify's verdict would not outlive the process: it stops now (its
                        // restore stops with it), unless it confirms a heal (`confirm_heal`,
                        // after the lease: it only reads). Any other job is waited for, unless
                        // the shutdown's timeout cancels it: what it stores is kept. Our own
                        // place in the verify turns' line would hold up that verify's turn.
                        drop(in_line.take());
                        if matches!(self.job, Some((Job::Verify, _))) && !self.heal_unverified {
                            self.abort_maintenance("the database stopped");
                        }
                        tokio::select! {
                            _ = abort.cancelled() => return,
                            _ = Box::pin(self.settle_maintenance()) => {}
                        }
                        Box::pin(self.lease.release(&self.stats.counters)).await;
                        tokio::select! {
                            _ = abort.cancelled() => {}
                            _ = Box::pin(self.confirm_heal()) => {}
                        }
                        return;
                    }
                    None
                }
                Err(RoundError::Lease(e)) if e.is_conflict() => {
                    self.lease_lost(&e);
                    return;
                }
                Err(RoundError::NotYet) => Some(Duration::from_secs(1)),
                Err(e) => {
                    let why = format!("not written: {e}");
                    self.stats.health.fail(match &self.unrestorable {
                        Some(verify) => format!("{verify}; {why}"),
                        None => why,
                    });
                    match &mut streak {
                        None => {
                            tracing::error!(db = %self.db, replica = %self.name, error = %e, remote_txid = %self.remote, "upload failed; retrying with backoff");
                            streak = Some((Instant::now(), 1));
                        }
                        Some((_, n)) => *n += 1,
                    }
                    if closed && matches!(e, RoundError::Seed(_)) {
                        // The database has stopped: nothing can seed this replica any more.
                        return;
                    }
                    Some(backoff.next_delay())
                }
            };
            // Nothing new starts once the database has stopped (the next round is the last).
            if retry.is_none() && pos_rx.has_changed().is_ok() {
                self.start_maintenance(&mut schedule);
            }
            // A turn not used now goes to the next in line; one that came while a job runs is
            // kept for when it ends (a failing replica keeps none).
            if self.job.is_none() || retry.is_some() {
                self.verify_turn = None;
            }
            // While retrying, the backoff alone paces requests (a failed refresh leaves the
            // lease due, which must not turn into a busy loop).
            // Maintenance starts only after a successful round: a deadline it has passed must
            // not shorten the backoff to nothing. While a job runs, its end wakes the task.
            let wait = match retry {
                Some(delay) => delay,
                None if self.job.is_some() => self.heartbeat.min(self.lease.refresh_in()),
                None => self
                    .heartbeat
                    .min(self.lease.refresh_in())
                    .min(schedule.until_next(Instant::now())),
            };
            let running = self.job.is_some();
            // A due verify waits in line for its turn, also while another job of this replica
            // runs (a turn that comes meanwhile waits for that job); a failing replica leaves
            // the line.
            if retry.is_some() || !self.due.contains(&Job::Verify) {
                in_line = None;
            } else if in_line.is_none() && self.verify_turn.is_none() {
                in_line = Some(Box::pin(self.maint.turns.verifies.clone().acquire_owned()));
            }
            let deadline = crate::replicate::tick::coarse_deadline(wait);
            let finished = tokio::select! {
                _ = abort.cancelled() => return,
                _ = pos_rx.changed(), if retry.is_none() && !closed => None,
                Some(Ok(())) = async { match feed.as_mut() {
                    Some(rx) => Some(rx.changed().await),
                    None => None,
                } }, if retry.is_none() && !closed => None,
                r = async { match self.job.as_mut() {
                    Some((_, task)) => task.await,
                    None => std::future::pending().await,
                } }, if running => Some(r),
                turn = async { match in_line.as_mut() {
                    Some(wait) => wait.await,
                    None => std::future::pending().await,
                } }, if in_line.is_some() => {
                    in_line = None;
                    self.verify_turn = turn.ok();
                    None
                }
                _ = tokio::time::sleep_until(deadline) => None,
            };
            if self.verify_turn.is_some() && self.job.is_none() && !closed {
                self.start_verify();
            }
            if let Some(r) = finished
                && let Some((job, _)) = self.job.take()
            {
                self.finished(job, r);
                if retry.is_some() {
                    // A job that ends does not cut a retry's backoff short.
                    tokio::select! {
                        _ = abort.cancelled() => return,
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }
}

/// Level-1 compactions failing in a row after which staging stops keeping segments for them.
const L1_FAILURES_BEFORE_PRUNING: u32 = 3;

/// Why an upload round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    /// The lease check or refresh.
    #[error("{0}")]
    Lease(#[from] LeaseError),
    /// An upload.
    #[error("{0}")]
    Storage(StorageError),
    /// The chain cannot be continued from staging: the replica needs a seed snapshot.
    #[error("the replica cannot be continued from local staging ({})", .0.explain())]
    NeedsSeed(SeedReason),
    /// A seed snapshot could not be had.
    #[error("re-seeding: {0}")]
    Seed(StorageError),
    /// Another writer stored this TXID with other bytes.
    #[error("another writer stored TXID {0} on the replica")]
    Diverged(TxId),
    /// A deferred replica waits for the database's first position.
    #[error("waiting for the database's first sync")]
    NotYet,
}
