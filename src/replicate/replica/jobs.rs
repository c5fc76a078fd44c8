//! The replica's maintenance jobs: which due job starts, the verify turns it waits for, and
//! what a finished job records (see the module doc of [`super`] and of
//! [`crate::replicate::maintenance`]).

use std::collections::VecDeque;
use std::time::Instant;

use tokio_util::task::AbortOnDropHandle;

use super::{Finished, L1_FAILURES_BEFORE_PRUNING, Replica};
use crate::replicate::maintenance::{self, Job, Schedule, Verified};
use crate::storage::StorageError;

impl Replica {
    /// Starts the next due maintenance job with work to do, unless one is running (call it
    /// only after a successful round: never while uploads are failing).
    pub(super) fn start_maintenance(&mut self, schedule: &mut Schedule) {
        if self.job.is_some() {
            return;
        }
        self.clear_moot_failures();
        for job in schedule.take_due(Instant::now()) {
            if !self.due.contains(&job) {
                self.due.push_back(job);
            }
        }
        self.start_next();
    }

    /// Starts the due verify now, with the turn that came for it, rather than after the next
    /// round: a verify writes nothing, so it needs no fresh lease check, and the only turn of
    /// the Store is not held through a long round.
    pub(super) fn start_verify(&mut self) {
        let Some(at) = self.due.iter().position(|j| *j == Job::Verify) else {
            self.verify_turn = None;
            return;
        };
        if self.job.is_some() {
            return;
        }
        let _ = self.due.remove(at);
        let others = std::mem::replace(&mut self.due, VecDeque::from([Job::Verify]));
        self.start_next();
        // The others keep their order (the verify is not left: its turn was there).
        self.due = others;
    }

    /// Plans `job` from the index (no request; see [`maintenance::plan`]).
    fn plan(
        &self,
        job: Job,
        verified: Option<Verified>,
    ) -> Result<Option<maintenance::Work>, StorageError> {
        maintenance::plan(
            job,
            &self.maint,
            &self.client,
            &self.index,
            verified,
            self.found_tip,
        )
    }

    /// Clears the failure of each failing job that now has nothing to do: what it failed to
    /// do was done another way (a seed stored the snapshot at the tip, a wipe took the files
    /// a compaction was to read), so its report would otherwise stand until the job next
    /// runs, which may be never on an idle database. Plans need no request.
    fn clear_moot_failures(&mut self) {
        if self.maint_failing.is_empty() {
            return;
        }
        // Only a change to the index makes a job moot: planning (a restore plan, for a
        // verify) is not repeated at every round while nothing changed.
        let files = (0..=crate::storage::SNAPSHOT_LEVEL)
            .map(|l| self.index.level(l).len())
            .sum();
        let seen = Some((self.index.tip(), files));
        if self.moot_checked == seen {
            return;
        }
        self.moot_checked = seen;
        let failing = self.maint_failing.clone();
        for job in failing {
            let planned = self.plan(job, self.verified);
            if let Ok(None) = planned {
                tracing::info!(db = %self.db, replica = %self.name, ?job, "a failing maintenance job has nothing left to do (its work was done another way): its failure no longer stands");
                if job == Job::Compact(1) {
                    self.compacted_l1(true);
                }
                // As `maintenance_ran` clears a job that ran, without its "runs again" line.
                self.maint_failing.retain(|j| *j != job);
                if self.maint_failing.is_empty() {
                    self.stats.maintenance.recover();
                }
            }
        }
    }

    /// Starts the first job of `due` that has work to do (one at a time; see
    /// `start_maintenance`).
    fn start_next(&mut self) {
        // A verify whose turn is taken by another replica's stays due, and the task waits in
        // line for a turn (`run`); the other jobs do not wait behind it.
        let mut waiting = None;
        while let Some(job) = self.due.pop_front() {
            let turn = match job {
                Job::Verify => match self.verify_turn.take().or_else(|| {
                    // Fails while others wait in line: the semaphore hands turns out in order.
                    self.maint.turns.verifies.clone().try_acquire_owned().ok()
                }) {
                    Some(turn) => Some(turn),
                    None => {
                        waiting = Some(job);
                        continue;
                    }
                },
                _ => None,
            };
            if job == Job::Sweep {
                // Temporary files come from writes: none since the last sweep (which left none),
                // none to find.
                if self.swept == Some(self.index.tip()) {
                    continue;
                }
                self.swept = Some(self.index.tip());
            }
            let planned = self.plan(job, self.verified);
            let work = match planned {
                Ok(Some(work)) => work,
                Ok(None) => continue,
                Err(e) => {
                    self.finished(job, Ok(Err(e)));
                    continue;
                }
            };
            let (m, client) = (self.maint.clone(), self.client.clone());
            let (staging, counters) = (self.staging.clone(), self.stats.counters.clone());
            let run = async move {
                let _turn = turn;
                maintenance::run(work, &m, &client, &staging, &counters).await
            };
            let span = tracing::Span::current();
            let task = tokio::spawn(tracing::Instrument::instrument(run, span));
            self.job = Some((job, AbortOnDropHandle::new(task)));
            break;
        }
        if let Some(job) = waiting {
            self.due.push_front(job);
        }
    }

    /// Records what a finished maintenance job did.
    pub(super) fn finished(&mut self, job: Job, finished: Finished) {
        crate::util::malloc::note_freed();
        if job == Job::Compact(1) {
            self.compacted_l1(matches!(finished, Ok(Ok(_))));
        }
        match &finished {
            Ok(Ok(_)) => self.maintenance_ran(job, None),
            Ok(Err(e)) => self.maintenance_ran(job, Some(e.to_string())),
            Err(e) => self.maintenance_ran(job, Some(e.to_string())),
        }
        let done = match finished {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(db = %self.db, replica = %self.name, ?job, error = %e, "a maintenance task failed; it runs again at its next interval");
                return;
            }
        };
        match done {
            Ok(maintenance::Done::Unrestorable { tip, reason }) => {
                self.failed_tip = tip;
                self.heal_unverified = false;
                self.verified = None;
                let failed =
                    format!("verify failed: the replica does not restore to TXID {tip} ({reason})");
                // One stored seed per streak: a seed that did not heal it points at the
                // database itself, and seeding again would only upload whole copies in a loop.
                let why = match self.healed {
                    false => format!("{failed}; re-seeding it with a snapshot of the database"),
                    true => format!(
                        "{failed}, also after a seed: check the database itself with PRAGMA integrity_check"
                    ),
                };
                tracing::error!(db = %self.db, replica = %self.name, "{why}");
                if !self.healed {
                    self.heal_owed = true;
                    // Checked again right after the seed (maintenance starts only after a
                    // round, which stores it), not an interval later.
                    if !self.due.contains(&Job::Verify) {
                        self.due.push_back(Job::Verify);
                    }
                }
                self.stats.health.fail(why.clone());
                self.unrestorable = Some(why);
            }
            Ok(done) => {
                if let maintenance::Done::Checked(id) = done {
                    self.heal_unverified = false;
                    let at = Instant::now();
                    self.verified = Some(Verified { plan: id, at });
                    if self.unrestorable.take().is_some() {
                        self.healed = false;
                        // The health cell clears at the next round that succeeds.
                        tracing::info!(db = %self.db, replica = %self.name, "verify passed: the replica restores again");
                    }
                }
                if let maintenance::Done::Swept { again: true } = done {
                    self.swept = None;
                }
                let n = done.apply(&mut self.index);
                if n > 0 {
                    tracing::debug!(db = %self.db, replica = %self.name, ?job, files = n, "maintenance");
                    self.send_ack();
                }
            }
            Err(e) => {
                tracing::warn!(db = %self.db, replica = %self.name, ?job, error = %e, "maintenance failed; retrying at its next interval");
                // A file we stored is gone: the replica may have been wiped around a
                // lease write (which then survived); the next round lists it. So is an
                // output whose name is taken: the index missed that object (a put whose
                // answer was lost, then a retry that built other bytes).
                if matches!(e, StorageError::NotFound(_) | StorageError::Conflict { .. }) {
                    self.recheck = true;
                }
            }
        }
    }

    /// Records how a maintenance job ended (`failed`: why it failed) in
    /// [`ReplicaStats::maintenance`](super::ReplicaStats): a problem while any job's last run
    /// failed, cleared once each of them has run again.
    fn maintenance_ran(&mut self, job: Job, failed: Option<String>) {
        let cell = &self.stats.maintenance;
        match failed {
            Some(why) => {
                if !self.maint_failing.contains(&job) {
                    self.maint_failing.push(job);
                }
                self.stats.counters.maintenance_failures.inc();
                cell.fail(format!(
                    "maintenance job {job:?} failed: {why}; retried at its next interval"
                ));
            }
            None => {
                self.maint_failing.retain(|j| *j != job);
                if self.maint_failing.is_empty() && cell.recover().is_some() {
                    tracing::info!(db = %self.db, replica = %self.name, ?job, "maintenance runs again");
                }
            }
        }
    }

    /// Counts level-1 compactions that failed in a row. From the
    /// [`L1_FAILURES_BEFORE_PRUNING`]th on, staging no longer keeps level-0 segments for
    /// them (they then read them from the replica), so one that keeps failing cannot fill the
    /// disk; the first success restores the keeping.
    fn compacted_l1(&mut self, ok: bool) {
        let before = self.l1_failures;
        self.l1_failures = if ok { 0 } else { before.saturating_add(1) };
        if self.l1_failures == L1_FAILURES_BEFORE_PRUNING {
            tracing::error!(db = %self.db, replica = %self.name, failures = self.l1_failures, "level-1 compaction keeps failing: local staging no longer keeps segments for it, and it reads them from the replica");
            self.send_ack();
        } else if ok && before >= L1_FAILURES_BEFORE_PRUNING {
            tracing::info!(db = %self.db, replica = %self.name, failures = before, "level-1 compaction works again");
            self.send_ack();
        }
    }

    /// Waits for the running maintenance job, if any, and records it: before anything that
    /// replaces the index, and at a clean shutdown.
    pub(super) async fn settle_maintenance(&mut self) {
        if let Some((job, task)) = self.job.take() {
            let finished = task.await;
            self.finished(job, finished);
        }
    }

    /// At a clean stop, verifies a replica that was re-seeded after a failed verify and not
    /// verified since (within the shutdown's timeout, which cancels it), so that the stop
    /// reports what holds: the old verdict would otherwise be the last word on a healed
    /// replica, and the next process keeps neither.
    pub(super) async fn confirm_heal(&mut self) {
        if self.heal_unverified {
            let turn = match self.verify_turn.take() {
                Some(turn) => turn,
                None => self
                    .maint
                    .turns
                    .verifies
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the verify semaphore is never closed"),
            };
            let job = Job::Verify;
            let planned = self.plan(job, None);
            match planned {
                Ok(Some(work)) => {
                    let (m, counters) = (&self.maint, &self.stats.counters);
                    let done = maintenance::run(work, m, &self.client, &self.staging, counters);
                    let done = done.await;
                    drop(turn);
                    self.finished(job, Ok(done));
                }
                Ok(None) => {}
                Err(e) => self.finished(job, Ok(Err(e))),
            }
        }
        // A verify that passed here or in the job waited for at the stop.
        if self.unrestorable.is_none() {
            self.stats.health.recover();
        }
    }

    /// Aborts the running maintenance job, if any (a request already sent may still land).
    pub(super) fn abort_maintenance(&mut self, why: &str) {
        if let Some((job, _)) = self.job.take() {
            tracing::info!(db = %self.db, replica = %self.name, ?job, "maintenance job dropped: {why}");
        }
    }
}
