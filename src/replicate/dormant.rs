//! Idle checks of dormant databases, batched per tick slot.
//!
//! A dormant database ([`crate::replicate::db`]) needs one `statx` per tick (and, while an
//! application holds its WAL, one more at every tenth) and nothing else. Run from
//! each database's own monitor, at 10,000 databases that check costs 10,000 task wake-ups,
//! timer re-arms and polls a second, several times the `statx` itself. So a dormant monitor
//! parks here instead: one thread per monitor interval walks the slot that is due, runs each
//! parked database's check, and wakes only the monitors whose files changed.
//!
//! The pass runs on a thread of its own, not the async runtime's: a disk hung under one
//! `statx` holds that thread alone, where it held a runtime thread and stranded the tasks
//! queued on it (`/healthz` among them, on two cores). While a pass runs, its mark
//! ([`crate::replicate::health::WorkMark`]) counts as the work of every parked database, so
//! a pass held for [`crate::replicate::health::SLOW_WORK`] reports each of them.
//!
//! Invariants:
//! - A parked database is checked at the grid times its monitor would have ticked at (its
//!   `TickGrid` slot), so parking adds no lag.
//! - A monitor leaves by dropping its [`Parked`] (a forced sync, shutdown); the watch forgets
//!   such entries at its next pass. An entry still held by its monitor is dropped only
//!   after that monitor has been woken.
//! - A slot's list is locked only to take or give back entries, never during the checks.
//! - [`DormantWatch::parked`] counts an entry from its park to the pass that drops it, so a
//!   pass holding a slot's entries out of their list does not hide them.
//! - A parked database's health shares the pass's mark from its park until its monitor drops
//!   its [`Parked`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::replicate::db::{DbStats, DormantProbe};
use crate::replicate::health::WorkMark;
use crate::replicate::tick::{TICK_SLOTS, TickGrid};

/// The parked dormant databases of one monitor interval, by slot.
pub struct DormantWatch {
    interval: Duration,
    slots: Vec<Mutex<Vec<Entry>>>,
    /// Entries parked and not yet dropped by a pass.
    parked: AtomicUsize,
    /// What the thread waits for besides its next pass; never held during a pass.
    signal: Mutex<Signal>,
    signalled: Condvar,
    /// Set while a pass runs.
    pass: Arc<WorkMark>,
}

#[derive(Default)]
struct Signal {
    /// A database parked: the thread recomputes which slots it must wake for.
    parked: bool,
    /// The Store stopped ingesting: the thread ends.
    stop: bool,
}

struct Entry {
    probe: DormantProbe,
    wake: Arc<Notify>,
}

/// A monitor's place in the watch: completes when its database's files changed. Dropping it
/// leaves the watch.
pub struct Parked {
    wake: Arc<Notify>,
    stats: Arc<DbStats>,
}

impl Parked {
    /// Waits until the database's files changed.
    pub async fn changed(&self) {
        self.wake.notified().await
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.stats.health.share(None);
    }
}

impl DormantWatch {
    /// An empty watch for monitors ticking every `interval`; [`DormantWatch::start`] checks it.
    pub fn new(interval: Duration) -> Arc<DormantWatch> {
        Arc::new(DormantWatch {
            interval,
            slots: (0..TICK_SLOTS).map(|_| Mutex::new(Vec::new())).collect(),
            parked: AtomicUsize::new(0),
            signal: Mutex::new(Signal::default()),
            signalled: Condvar::new(),
            pass: Arc::default(),
        })
    }

    /// Parks a dormant database whose monitor ticks on slot `slot` of the interval.
    pub fn park(&self, slot: u32, probe: DormantProbe) -> Parked {
        self.park_at(slot, probe, Instant::now())
    }

    /// [`DormantWatch::park`], at `at`: a pass held before then is its work from then on.
    fn park_at(&self, slot: u32, probe: DormantProbe, at: Instant) -> Parked {
        let wake = Arc::new(Notify::new());
        let stats = probe.stats();
        stats.health.share(Some((self.pass.clone(), at)));
        self.parked.fetch_add(1, Ordering::Relaxed);
        self.slot(slot).push(Entry {
            probe,
            wake: wake.clone(),
        });
        self.signal(|s| s.parked = true);
        Parked { wake, stats }
    }

    /// Databases parked now (left ones not yet forgotten included).
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Starts the thread that checks each slot holding parked databases at its grid times,
    /// and the task that ends it once `stop` is cancelled (or the runtime drops the task).
    /// With none parked the thread sleeps until one is: a process with few databases pays
    /// nothing. Nothing waits for the thread's end: a pass held by a hung disk must not hold
    /// up a shutdown.
    pub fn start(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
        let watch = self.clone();
        std::thread::Builder::new()
            .name("replicad-dormant".into())
            .spawn(move || watch.run())?;
        let ender = Ender(self.clone());
        Ok(async move {
            stop.cancelled().await;
            drop(ender);
        })
    }

    fn run(&self) {
        let grids: Vec<TickGrid> = (0..TICK_SLOTS)
            .map(|s| TickGrid::on_slot(self.interval, s))
            .collect();
        loop {
            let now = tokio::time::Instant::from_std(Instant::now());
            let due = grids
                .iter()
                .filter(|g| !self.slot(g.slot()).is_empty())
                .map(|g| (g.slot(), g.after(now).into_std()))
                .min_by_key(|&(_, at)| at);
            let mut signal = self.signal.lock().unwrap_or_else(|e| e.into_inner());
            if signal.stop {
                return;
            }
            // Parked since `due` was computed: maybe on an earlier slot, look again.
            if std::mem::take(&mut signal.parked) {
                continue;
            }
            let Some((slot, at)) = due else {
                drop(self.signalled.wait(signal));
                continue;
            };
            let left = at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                drop(self.signalled.wait_timeout(signal, left));
                // Woken early (a park, a spurious wake): the slot stays due at the same time.
                if Instant::now() < at {
                    continue;
                }
            } else {
                drop(signal);
            }
            self.check(slot);
        }
    }

    fn signal(&self, set: impl FnOnce(&mut Signal)) {
        set(&mut self.signal.lock().unwrap_or_else(|e| e.into_inner()));
        self.signalled.notify_one();
    }

    /// One pass over a slot: wakes the changed, forgets the left, keeps the rest.
    fn check(&self, slot: u32) {
        let mut entries = std::mem::take(&mut *self.slot(slot));
        if entries.is_empty() {
            return;
        }
        let _pass = self.pass.begin(Instant::now());
        let before = entries.len();
        entries.retain_mut(|e| {
            // Only our clone left: the monitor is gone.
            if Arc::strong_count(&e.wake) == 1 {
                return false;
            }
            if e.probe.unchanged() {
                return true;
            }
            e.wake.notify_one();
            false
        });
        self.parked
            .fetch_sub(before - entries.len(), Ordering::Relaxed);
        let mut list = self.slot(slot);
        // Parked during the pass: join the survivors (whose allocation is the one kept, so an
        // idle pass allocates nothing).
        entries.append(&mut *list);
        *list = entries;
    }

    fn slot(&self, slot: u32) -> MutexGuard<'_, Vec<Entry>> {
        // A poisoned list is still a list of whole entries: a panic cannot leave one half-made.
        let i = usize::try_from(slot).unwrap_or(0) % self.slots.len();
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends the watch's thread when dropped: at `stop`, or when the runtime drops the task
/// holding it without a stop (a Store dropped in a test).
struct Ender(Arc<DormantWatch>);

impl Drop for Ender {
    fn drop(&mut self) {
        self.0.signal(|s| s.stop = true);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use futures_util::FutureExt;

    use super::*;

    fn probe(dir: &tempfile::TempDir) -> (std::path::PathBuf, DormantProbe) {
        let path = dir.path().join("app.db");
        std::fs::write(&path, b"x").expect("the temporary directory is writable");
        let probe = DormantProbe::of_file(&path);
        (path, probe)
    }

    /// A pass takes a slot's entries out of its list while it checks them: `parked` must
    /// still count them (a test, or anything else, reading it then saw none).
    #[test]
    fn a_pass_does_not_hide_the_entries_it_checks() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (_, probe) = probe(&dir);
        let watch = DormantWatch::new(Duration::from_millis(20));
        let _parked = watch.park(0, probe);
        let done = AtomicBool::new(false);
        let (mut reads, mut wrong) = (0u64, 0u64);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..20_000 {
                    watch.check(0);
                }
                done.store(true, Ordering::Relaxed);
            });
            while !done.load(Ordering::Relaxed) {
                reads += 1;
                wrong += u64::from(watch.parked() != 1);
            }
        });
        assert_eq!(
            wrong, 0,
            "{wrong} of {reads} reads during passes missed the entry"
        );
        assert_eq!(watch.parked(), 1);
    }

    /// A pass forgets a left entry and wakes (then drops) a changed one; both stop counting.
    #[test]
    fn a_pass_forgets_the_left_and_wakes_the_changed() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (path, probe) = probe(&dir);
        let watch = DormantWatch::new(Duration::from_millis(20));
        let left = watch.park(0, DormantProbe::of_file(&path));
        let kept = watch.park(1, probe);
        drop(left);
        assert_eq!(watch.parked(), 2, "forgotten at the next pass only");
        watch.check(0);
        watch.check(1);
        assert_eq!(watch.parked(), 1);
        std::fs::write(&path, b"a longer file").expect("the temporary directory is writable");
        watch.check(1);
        assert_eq!(watch.parked(), 0);
        assert!(
            kept.changed().now_or_never().is_some(),
            "the changed database was not woken"
        );
    }

    /// A pass held past SLOW_WORK (a disk hung under one `statx`) reports every database
    /// parked, until it ends or the database leaves.
    #[test]
    fn a_held_pass_reports_every_parked_database() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let watch = DormantWatch::new(Duration::from_millis(20));
        let (_, a) = probe(&dir);
        let (_, b) = probe(&dir);
        let (_, c) = probe(&dir);
        let (sa, sb, sc) = (a.stats(), b.stats(), c.stats());
        let Some(long_ago) = Instant::now().checked_sub(Duration::from_secs(12)) else {
            return;
        };
        let pa = watch.park_at(0, a, long_ago);
        let _pb = watch.park_at(3, b, long_ago);
        let held = watch.pass.begin(long_ago + Duration::from_secs(1));
        // Parked into a pass already held: protected until it parked.
        let _pc = watch.park(5, c);
        for s in [&sa, &sb] {
            let p = s
                .health
                .problem()
                .expect("a held pass is every parked database's");
            assert!(
                p.reason.contains("dormant databases have been held for"),
                "{p:?}"
            );
            let ran = s.health.slow_work().map(|w| w.ran);
            assert!(
                ran < Some(Duration::from_secs(12)),
                "counted from the pass: {ran:?}"
            );
        }
        assert!(sc.health.is_ok(), "counted from its park");
        drop(pa);
        assert!(sa.health.is_ok(), "a database that left the watch");
        assert!(!sb.health.is_ok());
        drop(held);
        assert!(sb.health.is_ok(), "the pass ended");
    }

    /// The thread wakes a changed database at its slot's time, and ends at the stop.
    #[tokio::test]
    async fn the_thread_wakes_the_changed_and_ends_at_the_stop() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (path, probe) = probe(&dir);
        let watch = DormantWatch::new(Duration::from_millis(20));
        let stop = CancellationToken::new();
        let ender = tokio::spawn(watch.start(stop.clone()).expect("a thread starts"));
        let parked = watch.park(7, probe);
        std::fs::write(&path, b"a longer file").expect("the temporary directory is writable");
        tokio::time::timeout(Duration::from_secs(10), parked.changed())
            .await
            .expect("the changed database was woken");
        stop.cancel();
        ender.await.expect("the task ends");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&watch) > 1 {
            assert!(
                Instant::now() < deadline,
                "the thread still runs after the stop"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
