//! Idle checks of dormant databases, batched per tick slot.
//!
//! A dormant database ([`crate::replicate::db`]) needs one `statx` per tick and nothing else. Run from
//! each database's own monitor, at 10,000 databases that check costs 10,000 task wake-ups,
//! timer re-arms and polls a second, several times the `statx` itself. So a dormant monitor
//! parks here instead: one task per monitor interval walks the slot that is due, runs each
//! parked database's check, and wakes only the monitors whose files changed.
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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::replicate::db::DormantProbe;
use crate::replicate::tick::{TICK_SLOTS, TickGrid};

/// The parked dormant databases of one monitor interval, by slot.
pub struct DormantWatch {
    interval: Duration,
    slots: Vec<Mutex<Vec<Entry>>>,
    /// Entries parked and not yet dropped by a pass.
    parked: AtomicUsize,
    /// A database parked: the task recomputes which slots it must wake for.
    parked_one: Notify,
}

struct Entry {
    probe: DormantProbe,
    wake: Arc<Notify>,
}

/// A monitor's place in the watch: completes when its database's files changed. Dropping it
/// leaves the watch.
pub struct Parked {
    wake: Arc<Notify>,
}

impl Parked {
    /// Waits until the database's files changed.
    pub async fn changed(&self) {
        self.wake.notified().await
    }
}

impl DormantWatch {
    /// An empty watch for monitors ticking every `interval`; [`DormantWatch::run`] checks it.
    pub fn new(interval: Duration) -> Arc<DormantWatch> {
        Arc::new(DormantWatch {
            interval,
            slots: (0..TICK_SLOTS).map(|_| Mutex::new(Vec::new())).collect(),
            parked: AtomicUsize::new(0),
            parked_one: Notify::new(),
        })
    }

    /// Parks a dormant database whose monitor ticks on slot `slot` of the interval.
    pub fn park(&self, slot: u32, probe: DormantProbe) -> Parked {
        let wake = Arc::new(Notify::new());
        self.parked.fetch_add(1, Ordering::Relaxed);
        self.slot(slot).push(Entry {
            probe,
            wake: wake.clone(),
        });
        self.parked_one.notify_one();
        Parked { wake }
    }

    /// Databases parked now (left ones not yet forgotten included).
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Checks each slot that holds parked databases at its grid times, until `stop`. With
    /// none parked it sleeps until one is: a process with few databases pays nothing.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let grids: Vec<TickGrid> = (0..TICK_SLOTS)
            .map(|s| TickGrid::on_slot(self.interval, s))
            .collect();
        loop {
            let now = tokio::time::Instant::now();
            let due = grids
                .iter()
                .filter(|g| !self.slot(g.slot()).is_empty())
                .map(|g| (g.slot(), g.after(now)))
                .min_by_key(|&(_, at)| at);
            let Some((slot, at)) = due else {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.parked_one.notified() => continue,
                }
            };
            tokio::select! {
                // A due slot is checked even if a park arrived at the same moment.
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(at) => {}
                // Maybe on an earlier slot: look again.
                _ = self.parked_one.notified() => continue,
            }
            self.check(slot);
        }
    }

    /// One pass over a slot: wakes the changed, forgets the left, keeps the rest.
    fn check(&self, slot: u32) {
        let mut entries = std::mem::take(&mut *self.slot(slot));
        if entries.is_empty() {
            return;
        }
        let before = entries.len();
        entries.retain(|e| {
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
}
