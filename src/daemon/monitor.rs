//! The monitor task of one database: its ticks, the idle fast path, syncs, seed requests from
//! its replicas, staging pruning, and the final sync at shutdown (see [`super`] for the task
//! tree). A failed sync is never the end: it is reported through the database's health and
//! retried with backoff.
//!
//! A write to the WAL seen by inotify ([`crate::replicate::walwatch`]) brings the next tick
//! forward to [`COALESCE`] from now, but never sooner than `min-sync-interval` after the last
//! tick that shipped an application commit (our own checkpoint's segments do not count), nor
//! [`PARTIAL_PAUSE`] after one that found only part of a transaction (a long write is not read
//! again at every frame). The tick still goes through
//! the idle fast path: our own checkpoint's truncation costs one `statx`.
//!
//! Invariant: a sync starts sooner than that only when it is forced (a sync request, a
//! replica's seed request) or urgent ([`Db::sync_urgent`]: an application's checkpoint waits
//! for our read lock, or the WAL nears `truncate-page-n`); a poll tick that finds the WAL
//! changed earlier waits for it. So a busy database ships at most once per
//! `min-sync-interval`, whether its commits are seen by inotify or by polling.
//!
//! A database on a network or FUSE file system runs its idle fast path on the blocking pool
//! too ([`Db::on_network_fs`]): a call there may block without end, and on the runtime's
//! threads it would stall every database.
//!
//! Invariant: every tick, the idle fast path included, is marked on the database's health
//! ([`crate::replicate::health::HealthCell::begin`]; a wait for a turn to open the database
//! is not counted), so a tick blocked in the kernel (a hung file system) reads as not
//! protected once it has run for [`crate::replicate::health::SLOW_WORK`], though this task
//! cannot say so itself ([`super::registry::log_slow_work`] logs it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::SyncTrigger;
use crate::ltx::TxId;
use crate::replicate::db::{Db, DbError, SeedRequest};
use crate::replicate::dormant::{DormantWatch, Parked};
use crate::replicate::tick::TickGrid;
use crate::replicate::walwatch::{WalWatch, WalWatcher};
use crate::util::retry::Backoff;
use crate::util::test_gate::wait_at_test_gate;

/// How long after the first write event a tick starts: the frames of one commit are written in
/// a burst, and a tick that reads them all ships one segment instead of two.
const COALESCE: Duration = Duration::from_millis(2);

/// After a sync that shipped nothing (a transaction still being written), how long the next
/// event-driven tick waits; doubled at each such sync in a row up to [`PARTIAL_PAUSE_MAX`],
/// so that a long import is not scanned again fifty times a second.
const PARTIAL_PAUSE: Duration = Duration::from_millis(20);
const PARTIAL_PAUSE_MAX: Duration = Duration::from_secs(1);

/// When the events of a database's WAL may bring its next tick forward.
struct Events {
    watcher: Option<Arc<WalWatcher>>,
    watch: Option<WalWatch>,
    min_sync: Duration,
    /// Earliest start of an event-driven tick.
    earliest: tokio::time::Instant,
    /// A tick was brought forward for an event and has not started yet.
    due: bool,
    /// The pause after the next sync that ships nothing.
    partial: Duration,
}

impl Events {
    /// Registers the database if it has no (live) watch yet; true when it got one now (a
    /// commit made before the watch existed sent no event: the caller ticks soon). Cheap
    /// while inotify is full: the watcher resolves the path (two local calls) and refuses
    /// without asking the kernel for a watch, for a while. A database on a network file
    /// system polls: resolving its path may block without end there, on this runtime thread
    /// and under the watcher's process-wide lock.
    fn ensure(&mut self, db: &Db) -> bool {
        if self.watch.as_ref().is_some_and(|w| !w.is_lost()) {
            return false;
        }
        self.watch = None;
        if let Some(watcher) = self.watcher.as_ref().filter(|_| !db.on_network_fs()) {
            self.watch = watcher.watch(db.path());
        }
        db.stats()
            .commit_watched
            .store(self.watch.is_some(), std::sync::atomic::Ordering::Relaxed);
        self.watch.is_some()
    }

    /// Takes a wake-up left by writes made before this tick: the tick covers them.
    fn consume(&self) {
        use futures_util::FutureExt;
        if let Some(w) = &self.watch {
            let _ = w.changed().now_or_never();
        }
    }

    /// Completes when the WAL changed (never without a watch).
    async fn changed(&self) {
        match &self.watch {
            Some(w) => w.changed().await,
            None => std::future::pending().await,
        }
    }

    /// When a tick due at `now` must wait: until `earliest`, if that is later.
    fn held(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        (now < self.earliest).then_some(self.earliest)
    }

    /// After a sync that started at `at` and wrote `segments` segments, `ours` of them for our
    /// own checkpoint. Only the application's commits start a `min-sync-interval`: the restart
    /// write of a quiet checkpoint would otherwise hold the next commit back for up to a
    /// second.
    fn synced(&mut self, at: tokio::time::Instant, segments: usize, ours: usize) {
        if segments > ours {
            self.partial = PARTIAL_PAUSE;
            self.earliest = at.checked_add(self.min_sync).unwrap_or(at);
        } else if segments > 0 {
            self.partial = PARTIAL_PAUSE;
        } else {
            let pause = self.partial;
            self.partial = (pause * 2).min(PARTIAL_PAUSE_MAX);
            self.earliest = self.earliest.max(tokio::time::Instant::now() + pause);
        }
    }
}

/// The monitor task of one database: ticks, runs the idle fast path, and syncs when the WAL
/// changed. The first tick fires at once (a new database's initial snapshot starts without
/// waiting; the start permits bound how many run together), then on the database's
/// [`TickGrid`] (a random slot, every interval).
/// A [`SyncTrigger::request`] starts a tick at once, without the idle fast path; so does a
/// replica's request for a seed snapshot, answered right after that tick's sync.
///
/// A failed sync is never the end: it sets the database's health (logged at ERROR once when
/// it starts, at INFO when it ends) and is retried with backoff; a missing database file is
/// checked again every interval.
#[allow(clippy::too_many_arguments)]
pub(super) async fn monitor(
    mut db: Db,
    mut seeds: Option<tokio::sync::mpsc::UnboundedReceiver<SeedRequest>>,
    lock: Arc<super::DbClaim>,
    mut acks: Vec<watch::Receiver<TxId>>,
    ingest: CancellationToken,
    permits: Arc<Semaphore>,
    interval: Duration,
    trigger: Arc<SyncTrigger>,
    watch: Option<Arc<DormantWatch>>,
    wal: (Option<Arc<WalWatcher>>, Duration),
) {
    let grid = TickGrid::new(interval);
    let mut events = Events {
        watcher: wal.0,
        watch: None,
        min_sync: wal.1,
        earliest: tokio::time::Instant::now(),
        due: false,
        partial: PARTIAL_PAUSE,
    };
    // Before the first tick: a commit made between that tick's read and a later registration
    // would send no event.
    events.ensure(&db);
    let mut next = tokio::time::Instant::now();
    let mut backoff = Backoff::new(
        interval.max(Duration::from_millis(100)),
        Duration::from_secs(300),
    );
    let mut failing: Option<(Instant, u32)> = None;
    let mut pruned = TxId(0);
    let mut opened = false;
    let stats = db.stats();
    // Replicas waiting for a seed snapshot.
    let mut wanted: Vec<SeedRequest> = Vec::new();
    // While dormant, the watch checks the files instead of our own ticks; we wake for a
    // change, a request, or an upload to prune after.
    let mut parked: Option<Parked> = None;
    loop {
        let forced = tokio::select! {
            // A stop first: no tick starts once it came.
            biased;
            _ = ingest.cancelled() => break,
            _ = until_tick(parked.as_ref(), next) => false,
            _ = trigger.wake.notified() => true,
            Some(req) = async { match seeds.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            } } => {
                wanted.push(req);
                true
            }
            _ = any_changed(&mut acks), if parked.is_some() => {
                if let Some(min) = prune_due(&acks, pruned) {
                    // Marked as a tick's work is: staging on a mount that stops answering
                    // holds this task here, and commits are not captured meanwhile.
                    let _working = stats.health.begin(Instant::now());
                    prune(db.staging_pruner(), min, &mut pruned).await;
                }
                continue;
            }
            // Once a tick is due for an event, later events wait for it (a busy writer's
            // thousands of writes a second wake this task once per tick).
            _ = events.changed(), if !events.due => {
                let at = (tokio::time::Instant::now() + COALESCE).max(events.earliest);
                next = if parked.take().is_some() { at } else { next.min(at) };
                events.due = true;
                continue;
            }
        };
        parked = None;
        events.due = false;
        events.consume();
        let tick = trigger.begin();
        let now = tokio::time::Instant::now();
        let mut working = stats.health.begin(now.into_std());
        if !forced {
            next = grid.after(now);
        }
        // Whether a sync must not wait for `min-sync-interval`, where it was read off the
        // runtime's threads.
        let mut urgent = None;
        // A failed sync is retried on its backoff even while the files stay as they were (a
        // dormant database's forced sync that failed would stay reported until a write).
        let skip = if forced || !wanted.is_empty() || failing.is_some() {
            false
        } else if db.on_network_fs() {
            // A call there may block without end: never on the runtime's threads.
            let checked = run_blocking(db, &stats.health, |d| {
                wait_at_test_gate(d.path());
                let skip = d.fast_path_skip(Instant::now());
                (skip, !skip && d.sync_urgent())
            });
            let Some((back, (skip, now_urgent))) = checked.await else {
                return;
            };
            db = back;
            urgent = Some(now_urgent);
            skip
        } else {
            db.fast_path_skip(Instant::now())
        };
        if skip {
            if let Some(min) = prune_due(&acks, pruned) {
                prune(db.staging_pruner(), min, &mut pruned).await;
            }
            trigger.done(tick);
            if let Some(watch) = &watch {
                // Left first: dropping an old place after the new park would end its report.
                drop(parked.take());
                parked = db
                    .dormant_probe()
                    .map(|probe| watch.park(grid.slot(), probe));
            }
            continue;
        }
        // Something to ship: a poll tick keeps to `min-sync-interval` as an event's tick does
        // (and to a partial pause or a backoff), or a busy database would ship at every poll.
        // The polls go on meanwhile: each looks again whether the sync has become urgent.
        let held = events.held(now).filter(|_| !forced && wanted.is_empty());
        if held.is_some() && urgent.is_none() && db.on_network_fs() {
            // A backoff's hold too: read where a call may block, as the fast path is.
            let read = run_blocking(db, &stats.health, |d| d.sync_urgent());
            let Some((back, now_urgent)) = read.await else {
                return;
            };
            db = back;
            urgent = Some(now_urgent);
        }
        if let Some(at) = held
            && !urgent.unwrap_or_else(|| db.sync_urgent())
        {
            next = next.min(at);
            // Shown as `held_seconds`: the replicas' lag cannot see changes not yet synced.
            // This task alone writes it; the clock is read once per hold, not per poll.
            if stats
                .held_since_ms
                .load(std::sync::atomic::Ordering::Relaxed)
                == 0
            {
                let now = crate::util::clock::steady_ms().max(1) as u64;
                stats
                    .held_since_ms
                    .store(now, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(min) = prune_due(&acks, pruned) {
                prune(db.staging_pruner(), min, &mut pruned).await;
            }
            continue;
        }
        let permit = if opened {
            None
        } else {
            // Waiting for a turn to open (thousands of databases starting) is not slow work.
            drop(working);
            let permit = permits.clone().acquire_owned().await.ok();
            working = stats.health.begin(Instant::now());
            permit
        };
        let began = tokio::time::Instant::now();
        let want_seed = !wanted.is_empty();
        let past = wanted.iter().filter_map(|r| r.past).max();
        let synced = run_blocking(db, &stats.health, move |d| {
            wait_at_test_gate(d.path());
            if let Some(txid) = past {
                d.continue_after(txid);
            }
            let r = if want_seed {
                d.sync_awake()
            } else {
                d.sync(true)
            };
            let seed = (want_seed && r.is_ok()).then(|| d.build_seed());
            (r, seed)
        });
        let Some((back, (result, seed))) = synced.await else {
            return;
        };
        drop(permit);
        db = back;
        match seed {
            Some(Ok(snap)) => {
                for r in wanted.drain(..) {
                    let _ = r.reply.send(Ok(snap.clone()));
                }
            }
            Some(Err(e)) => {
                for r in wanted.drain(..) {
                    let _ = r.reply.send(Err(e.to_string()));
                }
            }
            None => {}
        }
        match result {
            Ok(segments) => {
                stats
                    .held_since_ms
                    .store(0, std::sync::atomic::Ordering::Relaxed);
                events.synced(began, segments, db.checkpoint_segments());
                if events.ensure(&db) {
                    next = next.min(tokio::time::Instant::now() + COALESCE);
                }
                opened = true;
                if let Some((since, n)) = failing.take() {
                    tracing::info!(failures = n, after = ?since.elapsed(), "sync recovered: the database is protected again");
                }
                stats.health.recover();
                // After the health: whoever waited for this sync sees it protected.
                trigger.done(tick);
                backoff.reset();
            }
            Err(e) => {
                let reason = format!("not protected: {e}");
                stats.health.fail(reason);
                match &mut failing {
                    None => {
                        tracing::error!(error = %e, "sync failed; the database is NOT protected until it succeeds; retrying with backoff");
                        failing = Some((Instant::now(), 1));
                    }
                    Some((_, n)) => *n += 1,
                }
                // A missing file costs one stat to check again: every interval, so that a
                // database created later is replicated at once. A lost WAL is checked every
                // interval too: an application's restart is a short window to catch.
                let delay = if matches!(e, DbError::Missing(_) | DbError::WalLost { .. }) {
                    Duration::ZERO
                } else {
                    backoff.next_delay()
                };
                next = grid.after(tokio::time::Instant::now() + delay);
                // A write must not cut the backoff short (a full disk would otherwise be
                // retried at every commit).
                events.earliest = events.earliest.max(next);
            }
        }
        if let Some(min) = prune_due(&acks, pruned) {
            prune(db.staging_pruner(), min, &mut pruned).await;
        }
    }
    drop(wanted);
    drop(seeds);
    // Marked as a tick's work is, through the close: a stop that hangs here names this
    // database (`Store::shutdown`).
    let _final = stats.health.begin(Instant::now());
    let tick = trigger.begin();
    let last = run_blocking(db, &stats.health, |d| {
        wait_at_test_gate(d.path());
        d.final_sync()
    });
    if let Some((back, result)) = last.await {
        match result {
            Ok(_) => {
                if stats.health.recover().is_some() {
                    tracing::info!("final sync succeeded: the database is protected again");
                }
                // After the health, as for every sync.
                trigger.done(tick);
            }
            Err(e) => {
                stats.health.fail(format!("final sync failed: {e}"));
                tracing::error!(error = %e, "final sync failed; the next start resumes from the WAL")
            }
        }
        // Dropping the Db closes the position channel: upload tasks drain and return. Its
        // close (SQLite's, the files') may block on a hung file system: not on the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(back)).await;
    }
    drop(lock);
}

/// A monitor's wait for its next tick: its grid time, or while parked, a change the watch saw.
async fn until_tick(parked: Option<&Parked>, next: tokio::time::Instant) {
    match parked {
        Some(p) => p.changed().await,
        None => tokio::time::sleep_until(next).await,
    }
}

/// Returns when any of `acks` changed; never when none can change any more.
async fn any_changed(acks: &mut [watch::Receiver<TxId>]) {
    if acks.is_empty() {
        return std::future::pending().await;
    }
    let waits = acks.iter_mut().map(|a| {
        Box::pin(async move {
            if a.changed().await.is_err() {
                // That replica's task ended: only another one can wake us.
                std::future::pending::<()>().await
            }
        })
    });
    futures_util::future::select_all(waits).await;
}

/// Moves the Db to the blocking pool for `f` and back; None when `f` panicked, which `health`
/// then reports for good.
async fn run_blocking<T: Send + 'static>(
    mut db: Db,
    health: &crate::replicate::health::HealthCell,
    f: impl FnOnce(&mut Db) -> T + Send + 'static,
) -> Option<(Db, T)> {
    match tokio::task::spawn_blocking(move || {
        let r = f(&mut db);
        (db, r)
    })
    .await
    {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(error = %e, "sync task panicked; this database stops replicating");
            health.stop("stopped: the sync task panicked; restart replicad");
            None
        }
    }
}

/// The TXID staging can be pruned to: what every replica acknowledged, when it is past
/// `pruned`.
fn prune_due(acks: &[watch::Receiver<TxId>], pruned: TxId) -> Option<TxId> {
    acks.iter()
        .map(|a| *a.borrow())
        .min()
        .filter(|min| *min > pruned)
}

/// Runs a [`Db::staging_pruner`] job up to `min` on the blocking pool: staging may sit on a
/// network file system (beside the database, or wherever `meta-path` says), where a call may
/// hang. It runs only when an acknowledgement moved, never on an idle tick.
async fn prune(
    job: impl FnOnce(TxId) -> Result<usize, crate::replicate::db::DbError> + Send + 'static,
    min: TxId,
    pruned: &mut TxId,
) {
    let done = match tokio::task::spawn_blocking(move || job(min)).await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    match done {
        Ok(_) => *pruned = min,
        Err(e) => tracing::warn!(error = %e, "pruning staging failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(min_sync: Duration) -> Events {
        Events {
            watcher: None,
            watch: None,
            min_sync,
            earliest: tokio::time::Instant::now(),
            due: false,
            partial: PARTIAL_PAUSE,
        }
    }

    #[test]
    fn only_the_applications_segments_start_a_min_sync_interval() {
        let at = tokio::time::Instant::now();
        let mut e = events(Duration::from_secs(60));
        let before = e.earliest;
        e.synced(at, 1, 1);
        assert_eq!(
            e.earliest, before,
            "our checkpoint's segment paced the next sync"
        );
        e.synced(at, 2, 1);
        assert_eq!(e.earliest, at + Duration::from_secs(60));
        // A sync that found only part of a transaction pauses briefly and doubles the pause.
        let mut e = events(Duration::ZERO);
        e.synced(at, 0, 0);
        assert_eq!(e.partial, PARTIAL_PAUSE * 2);
        e.synced(at, 1, 1);
        assert_eq!(e.partial, PARTIAL_PAUSE);
    }

    #[test]
    fn a_tick_after_a_shipping_sync_waits_for_min_sync_interval() {
        let at = tokio::time::Instant::now();
        let soon = at + Duration::from_millis(100);
        let mut e = events(Duration::from_secs(2));
        assert_eq!(e.held(soon), None, "nothing shipped yet");
        e.synced(at, 1, 1);
        assert_eq!(e.held(soon), None, "only our checkpoint's segment shipped");
        e.synced(at, 3, 1);
        let until = at + Duration::from_secs(2);
        assert_eq!(e.held(soon), Some(until));
        assert_eq!(e.held(until), None);
        let mut e = events(Duration::ZERO);
        e.synced(at, 3, 0);
        assert_eq!(e.held(soon), None, "0s ships every commit at once");
    }
}
