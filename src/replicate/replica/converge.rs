//! How a replica converges: the seed snapshot it asks its database for when its chain cannot
//! be continued from staging, the checks that find it wiped, continued by another writer or
//! not restorable, and the late connection of a replica unreachable at start (see the
//! module doc of [`super`] for the rules).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Replica, RoundError};
use crate::ltx::{self, TxId};
use crate::replicate::health::SeedReason;
use crate::replicate::maintenance::schedule::RemoteIndex;
use crate::replicate::staging::Staging;
use crate::storage::{DAMAGED, LtxFileInfo, ReplicaClient, StorageError, put_new};
use crate::util::phase::Phase;

/// How soon a periodic listing that failed is tried again.
const RETRY_CHECK: std::time::Duration = std::time::Duration::from_secs(300);

impl Replica {
    /// A replica that could not be reached at start (`why`): its upload task connects to it
    /// in the background (lease, then listing), with backoff, while the others go ahead. It
    /// is reported as not protected until then.
    pub fn deferred(mut self, why: String) -> Replica {
        tracing::error!(db = %self.db, replica = %self.name, error = %why, "replica not connected at start; replicating to the others and connecting to it in the background");
        self.stats.health.fail(format!("not written: {why}"));
        self.deferred = true;
        self
    }

    /// Connects a deferred replica: takes its lease and lists it. Its chain must not be
    /// ahead of the database's (it would then belong to another chain: written by a run
    /// whose staging was lost while this replica was down).
    pub(super) async fn connect(&mut self, db_txid: TxId) -> Result<(), RoundError> {
        self.lease.acquire(&self.stats.counters).await?;
        let tip = self.init_with(1).await.map_err(RoundError::Storage)?;
        // Beyond the database's position (its local state was lost while this replica was
        // down, or another chain), or a chain that is not ours: a seed after it.
        if tip.txid > db_txid
            || tip.full_reason.is_some()
            || (tip.page_size != 0 && tip.page_size != self.page_size().await)
        {
            self.pending_seed = Some(SeedReason::Behind);
        }
        tracing::info!(db = %self.db, replica = %self.name, remote_txid = %tip.txid, "replica connected");
        self.deferred = false;
        Ok(())
    }

    /// Notes the level-0 files of a listing that this run did not store (not in the index,
    /// which holds every file it stored): staging does not stand for them, nor for any
    /// level-0 file below the newest of them. Called before the listing becomes the index.
    pub(super) fn found_on_replica(&mut self, files: &[LtxFileInfo]) {
        let known = self.index.level(0);
        let found = files
            .iter()
            .filter(|f| f.level == 0)
            .filter(|f| {
                known
                    .binary_search_by_key(&(f.min_txid, f.max_txid), |k| (k.min_txid, k.max_txid))
                    .is_err()
            })
            .map(|f| f.max_txid)
            .max();
        if let Some(txid) = found.filter(|&t| t > self.found_tip) {
            tracing::debug!(db = %self.db, replica = %self.name, %txid, "level-0 files found on the replica up to this TXID: compactions read them from it");
            self.found_tip = txid;
        }
    }

    /// The page size of the newest staged segment (0 when none).
    pub(super) async fn page_size(&self) -> u32 {
        self.staging
            .off_reactor(|s| {
                let newest = s.txids().ok()?.last().copied()?;
                s.header(newest).ok()
            })
            .await
            .map_or(0, |h| h.page_size)
    }

    /// Whether the replica's newest file `f` is the one local staging holds for its TXID:
    /// the same header (level 0), or the same post-apply checksum (a compaction, when both
    /// carry one). Without a staged copy of that TXID there is nothing to compare: yes.
    pub(super) async fn is_our_chain(
        &self,
        f: &LtxFileInfo,
        remote: Option<&ltx::Header>,
        post: u64,
    ) -> bool {
        let txid = f.max_txid;
        let by_header = remote.is_some() && f.level == 0;
        let (local, staged) = self
            .staging
            .off_reactor(move |s| {
                let local = s.header(txid).ok();
                let staged = local
                    .filter(|_| !by_header)
                    .and_then(|_| Staging::post_apply_checksum_of(&s.path(txid)).ok());
                (local, staged)
            })
            .await;
        let Some(local) = local else {
            return true;
        };
        match remote {
            // The very bytes uploaded from staging: the same header.
            Some(remote) if f.level == 0 => *remote == local,
            _ => match staged {
                Some(ours) if ours != 0 && post != 0 => ours == post,
                _ => true,
            },
        }
    }

    /// Another writer stored TXID `txid` here, with other bytes: if it took our lease, we
    /// stop; if the lease is still ours (it wrote during a round it began before a takeover
    /// and ours after), its files are history and the chain continues after them with a
    /// seed snapshot, never with our staged segments on top of its state.
    pub(super) async fn diverged(&mut self, txid: TxId) -> Result<(), RoundError> {
        self.lease.check(&self.stats.counters).await?;
        Box::pin(self.settle_maintenance()).await;
        let started = Instant::now();
        let listed = self.client.list_all().await;
        self.stats.counters.observe(2, started, &listed);
        let files = listed.map_err(RoundError::Storage)?;
        let tip = files.iter().map(|f| f.max_txid).max().unwrap_or_default();
        tracing::error!(db = %self.db, replica = %self.name, %txid, listed_tip = %tip, "another writer stored this TXID on the replica; continuing after its files with a seed snapshot");
        // The file that refused our put is the other writer's, listed or not (a lagging
        // listing may not show it yet).
        self.found_on_replica(&files);
        self.found_tip = self.found_tip.max(txid);
        self.index = RemoteIndex::default();
        for f in files {
            self.index.insert(f);
        }
        self.remote = tip.max(self.remote);
        self.stats
            .remote_txid
            .store(self.remote.0, Ordering::Relaxed);
        self.send_ack();
        self.pending_seed = Some(SeedReason::Behind);
        Ok(())
    }

    pub(super) fn seed_reason(&self) -> SeedReason {
        if self.wiped {
            SeedReason::Wiped
        } else if self.remote.0 == 0 && self.index.tip().0 == 0 {
            SeedReason::Empty
        } else {
            SeedReason::Behind
        }
    }

    /// Re-seeds the replica: asks the database for a snapshot of its current state, stores
    /// it at level 9, and moves the remote position to it.
    pub(super) async fn reseed(
        &mut self,
        reason: SeedReason,
        db_txid: TxId,
    ) -> Result<(), RoundError> {
        Box::pin(self.settle_maintenance()).await;
        let seed_err = |why: String| {
            RoundError::Seed(StorageError::Transient {
                op: "seed",
                key: self.db.clone(),
                reason: why,
            })
        };
        let Some(seeds) = &self.seeds else {
            return Err(seed_err(format!(
                "{}, and this replica cannot be re-seeded here",
                reason.explain()
            )));
        };
        tracing::warn!(db = %self.db, replica = %self.name, remote_txid = %self.remote, reason = reason.label(), "{}: re-seeding it with a snapshot of the live database", reason.explain());
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Holding TXIDs the database has not reached (or the same one, from another chain):
        // the database moves past them first. A replica that failed its verify holds our
        // own chain: its seed may be at its very TXID.
        let ours = reason == SeedReason::Unrestorable;
        let past = (!ours && self.remote.0 > 0 && self.remote >= db_txid).then_some(self.remote);
        seeds
            .send(crate::replicate::db::SeedRequest { past, reply: tx })
            .map_err(|_| seed_err("the database's monitor has stopped".into()))?;
        let seed = rx
            .await
            .map_err(|_| seed_err("the database stopped before the snapshot was built".into()))?
            .map_err(|e| seed_err(format!("building the snapshot: {e}")))?;
        if seed.txid < self.remote || (seed.txid == self.remote && !ours) {
            return Err(seed_err(format!(
                "the snapshot's TXID {} is not past the replica's {}",
                seed.txid, self.remote
            )));
        }
        let mut started = Instant::now();
        let level = crate::storage::SNAPSHOT_LEVEL;
        let client = self.client.clone();
        let store = || {
            put_new(
                &client,
                level,
                TxId(1),
                seed.txid,
                &seed.path,
                seed.timestamp_ms,
            )
        };
        let mut put = store().await;
        if ours && matches!(put, Err(StorageError::Conflict { .. })) && seed.txid == self.failed_tip
        {
            self.stats.counters.observe(0, started, &put);
            if self.replace_snapshot(seed.txid).await? {
                started = Instant::now();
                put = store().await;
            }
        }
        let bytes = put.as_ref().map_or(0, |info| info.size);
        self.stats
            .counters
            .phases
            .record(Phase::Upload, bytes, started.elapsed());
        self.stats.counters.observe(0, started, &put);
        let info = put.map_err(RoundError::Storage)?;
        self.wiped = false;
        // Whatever asked for it, this seed is the one any other pending one would store.
        self.pending_seed = None;
        self.heal_owed = false;
        if self.unrestorable.is_some() {
            self.healed = true;
            self.heal_unverified = true;
            self.unrestorable = Some(format!(
                "verify failed at TXID {}; re-seeded at TXID {}, not verified since",
                self.failed_tip, seed.txid
            ));
        }
        // Counted before the log line: a slow log write must not leave the object visible
        // and uncounted.
        self.stats.counters.reseeds[reason as usize].inc();
        self.stats.reseeds.fetch_add(1, Ordering::Relaxed);
        tracing::info!(db = %self.db, replica = %self.name, txid = %seed.txid, bytes, elapsed = ?started.elapsed(), reason = reason.label(), "replica re-seeded");
        self.stored(info, seed.timestamp_ms);
        Ok(())
    }

    /// Deletes the level-9 snapshot `1-<txid>` that stands where the seed of a replica that
    /// failed its verify goes. At an idle database's TXID the restore plan is that snapshot
    /// alone, so it is what the verify failed on (damaged in place, or made of a database
    /// that was corrupt then), and while it stands no seed can be stored: the replica would
    /// stay unrestorable until the next commit. Objects stay whole: the seed is put after.
    /// Called only when `txid` is the one the verify failed at; false when the index does
    /// not hold the object (nothing deleted).
    async fn replace_snapshot(&mut self, txid: TxId) -> Result<bool, RoundError> {
        let level = crate::storage::SNAPSHOT_LEVEL;
        let Some(old) = (self.index.level(level).iter())
            .find(|f| (f.min_txid, f.max_txid) == (TxId(1), txid))
            .cloned()
        else {
            return Ok(false);
        };
        tracing::warn!(db = %self.db, replica = %self.name, %txid, "replacing the snapshot that the failed verify restored through with the seed");
        let started = Instant::now();
        let deleted = self.client.delete(std::slice::from_ref(&old)).await;
        self.stats.counters.observe(3, started, &deleted);
        deleted.map_err(RoundError::Storage)?;
        self.index.remove(&[old]);
        Ok(true)
    }

    /// Stores the seed owed to a replica that failed its verify, after the round's uploads:
    /// the chain itself still continues from staging, so a seed that cannot be stored only
    /// waits for the next failed verify, and the uploads go on.
    pub(super) async fn heal(&mut self, target: TxId) {
        self.heal_owed = false;
        if let Err(e) = self.reseed(SeedReason::Unrestorable, target).await {
            tracing::warn!(db = %self.db, replica = %self.name, error = %e, "the seed that heals the replica failed; the next failed verify asks for it again");
        }
    }

    /// True when the periodic listing (`replica-check-interval`) is due. An idle replica
    /// sends no request, so files deleted behind our back while the lease stays (a bucket's
    /// expiry rule, a person) are found only by listing. The first one falls at a random
    /// point of the second half of the interval, so that databases started together spread.
    /// It waits for a round with no maintenance job running (the listing replaces the index,
    /// so it would wait for the job, and uploads with it) and, for a quarter of the interval,
    /// for an `idle` round (nothing to upload), so that no commit waits for it.
    pub(super) fn check_due(&mut self, idle: bool) -> bool {
        let every = self.maint.replica_check;
        if every.is_zero() || self.job.is_some() {
            return false;
        }
        let now = Instant::now();
        let due = *self.next_check.get_or_insert_with(|| {
            use rand::RngExt;
            now + every.mul_f64(rand::rng().random_range(0.5..1.0))
        });
        now >= due && (idle || now >= due + every / 4)
    }

    /// The periodic listing. Its failure does not fail the round (the uploads go on): it is
    /// logged and the listing tried again in 5 minutes.
    pub(super) async fn periodic_check(&mut self) {
        if let Err(e) = self.recheck_listing().await {
            tracing::warn!(db = %self.db, replica = %self.name, error = %e, "the periodic listing of the replica failed; retrying in 5 minutes");
            self.next_check = Some(Instant::now() + RETRY_CHECK.min(self.maint.replica_check));
        }
    }

    /// Our lease vanished: one listing tells a wiped (or truncated) replica from a lease
    /// deleted alone. Then the lease is taken again.
    pub(super) async fn lease_vanished(&mut self) -> Result<(), RoundError> {
        // Not waited for: the lease is retaken as soon as the listing has spoken.
        self.abort_maintenance("the replica's lease vanished");
        if !self.recheck_listing().await? {
            tracing::warn!(db = %self.db, replica = %self.name, "the replica's lease object was removed but its files are intact; taking the lease again");
        }
        self.lease.acquire(&self.stats.counters).await?;
        Ok(())
    }

    /// Lists the replica and, unless it still restores up to our position, starts it over:
    /// a seed, then every staged segment after it again (objects that survived compare
    /// equal and are kept). An upload racing the wipe can leave the newest file standing with
    /// nothing under it, so the test is the restore plan, not the tip. True when it was wiped.
    /// Either way the listing becomes the index (a dropped maintenance job's last request may
    /// have landed; a file of ours may be gone), with the files of ours a lagging listing did
    /// not show yet.
    pub(super) async fn recheck_listing(&mut self) -> Result<bool, RoundError> {
        Box::pin(self.settle_maintenance()).await;
        let started = Instant::now();
        let listed = self.client.list_all().await;
        self.stats.counters.observe(2, started, &listed);
        // A listing that failed leaves a recheck owed (the round's retry lists again).
        let mut files = listed.map_err(RoundError::Storage)?;
        let plan_tip = |files: &[LtxFileInfo]| {
            crate::restore::calc_plan(files, None)
                .ok()
                .and_then(|plan| plan.last().map(|f| f.max_txid))
        };
        let mut restorable = plan_tip(&files);
        if self.remote.0 > 0
            && restorable.is_none_or(|t| t < self.remote)
            && let Some(late) = self.listing_lags(&self.index.all(), &files).await?
        {
            tracing::warn!(db = %self.db, replica = %self.name, listed = files.len(), late = late.len(), "the replica's listing lacks files stored here that a read finds: the store's listings lag its writes; keeping them");
            files.extend(late);
            restorable = plan_tip(&files);
        }
        self.recheck = false;
        // Files another writer stored past our position, or in place of ours after a wipe.
        self.found_on_replica(&files);
        let every = self.maint.replica_check;
        self.next_check = (!every.is_zero()).then(|| Instant::now() + every);
        self.index = RemoteIndex::default();
        for f in files {
            self.index.insert(f);
        }
        // Nothing stored yet: nothing to wipe (the first seed is the replica's, "empty").
        if self.remote.0 == 0 || restorable.is_some_and(|t| t >= self.remote) {
            self.send_ack();
            return Ok(false);
        }
        tracing::warn!(db = %self.db, replica = %self.name, remote_txid = %self.remote, restorable = ?restorable, "the replica was emptied or truncated behind replicad's back");
        self.remote = TxId(0);
        self.stats.remote_txid.store(0, Ordering::Relaxed);
        self.stats.counters.txid.set(0);
        self.wiped = true;
        self.send_ack();
        Ok(true)
    }

    /// The files of `known` (the index: what we stored and listed) that our restore plan
    /// needs and the `listed` files lack, when every one is still there, read newest first:
    /// a store whose listings lag its PUTs shows the newest files late, and a replica that
    /// restored a moment ago is not wiped for that. None when one is gone or damaged (a real
    /// wipe, found at its first read; re-seeding heals a damaged file too);
    /// an error when a read could not tell (the recheck is retried).
    async fn listing_lags(
        &self,
        known: &[LtxFileInfo],
        listed: &[LtxFileInfo],
    ) -> Result<Option<Vec<LtxFileInfo>>, RoundError> {
        let listed: HashSet<_> = listed.iter().map(key).collect();
        let Ok(plan) = crate::restore::calc_plan(known, None) else {
            return Ok(None);
        };
        if plan.last().is_none_or(|f| f.max_txid < self.remote) {
            return Ok(None);
        }
        let mut unlisted: Vec<LtxFileInfo> = plan
            .into_iter()
            .filter(|f| !listed.contains(&key(f)))
            .collect();
        unlisted.sort_by_key(|f| std::cmp::Reverse(f.max_txid));
        if unlisted.is_empty() {
            return Ok(None);
        }
        for f in &unlisted {
            let started = Instant::now();
            let read = self.client.read_header(f).await;
            self.stats.counters.observe(1, started, &read);
            match read {
                Ok(h) if (h.min_txid, h.max_txid) == (f.min_txid, f.max_txid) => {}
                Ok(_)
                | Err(StorageError::NotFound(_))
                | Err(StorageError::Permanent { op: DAMAGED, .. }) => return Ok(None),
                // Could not tell (a passing fault, or access refused: said as any failed
                // listing is).
                Err(e) => return Err(RoundError::Storage(e)),
            }
        }
        Ok(Some(unlisted))
    }
}

/// What names one file on the replica.
fn key(f: &LtxFileInfo) -> (u8, TxId, TxId, bool) {
    (f.level, f.min_txid, f.max_txid, f.encrypted)
}
