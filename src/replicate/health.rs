//! Whether one database or one replica is protected right now, and if not, why.
//!
//! The task that owns a database (its monitor) or a replica (its upload task) is the only
//! writer of its cell; `/readyz`, `/status`, the metrics, systemd's STATUS and the shutdown
//! report read it. A problem is logged at ERROR by the owner when it starts and at INFO when
//! it ends ([`HealthCell::fail`] and [`HealthCell::recover`] say when).
//!
//! Invariant: a cell is "protected" only while its owner has evidence of it (a completed
//! sync, a completed upload round); any failure it cannot heal on the spot sets a problem
//! first, so no reader ever sees "fine" for a database or replica that is not. An owner that
//! cannot report because it is blocked (a tick stuck in the kernel on a hung file system)
//! marks the work it begins ([`HealthCell::begin`]): work that has run for [`SLOW_WORK`] is
//! a problem every reader computes, with no help from the blocked owner. A dormant database,
//! whose idle check the dormant databases' pass runs, shares that pass's mark
//! ([`HealthCell::share`]) while it is parked there.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Work that has run this long makes its cell not protected until it ends: the commits since
/// it began wait for it (a full copy of a large database, or a tick blocked on a hung file
/// system or a dying disk, which no error would ever report).
pub const SLOW_WORK: Duration = Duration::from_secs(10);

/// The origin of [`HealthCell::begin`]'s marks: an hour before its first use, so that a mark of
/// an `Instant` read a little earlier is exact.
fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    })
}

/// Why something is not protected, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// One line, for people: what is wrong and, where known, what to do.
    pub reason: String,
    /// When it started, ms since the Unix epoch (for people).
    pub since_ms: i64,
    /// When it started on [`crate::util::clock::steady_ms`]'s clock, which the grace counts
    /// on: a step of the wall clock does not move it.
    pub steady_ms: i64,
    /// The owner stopped for good (no retry will heal it): reported at once, whatever the
    /// readiness grace.
    pub stopped: bool,
}

impl Problem {
    /// Whether readiness reports it: at once when stopped, else once it has lasted `grace`
    /// (a blip of the network must not flap a pod's readiness) at `now_ms`, a
    /// [`crate::util::clock::steady_ms`] reading.
    pub fn reportable(&self, grace: std::time::Duration, now_ms: i64) -> bool {
        self.stopped || now_ms.saturating_sub(self.steady_ms) >= grace.as_millis() as i64
    }
}

/// The protection state of one database or replica.
#[derive(Debug, Default)]
pub struct HealthCell {
    problem: Mutex<Option<Problem>>,
    /// The owner's current work.
    busy: WorkMark,
    /// Work done for the owner by another thread (the dormant pass) and when the owner began
    /// to count on it, while it does.
    shared: Mutex<Option<(Arc<WorkMark>, Instant)>>,
}

/// When some work began, if some runs.
#[derive(Debug, Default)]
pub struct WorkMark(
    /// Ms after [`origin`], plus 1 (0: no work).
    AtomicU64,
);

/// The mark of work in progress ([`WorkMark::begin`]); cleared when dropped.
pub struct Working<'a>(&'a WorkMark);

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.0.0.store(0, Ordering::Relaxed);
    }
}

impl WorkMark {
    /// Marks work that began at `at` (an `Instant` the caller read anyway, so that marking
    /// costs no clock read) until the returned mark is dropped.
    pub fn begin(&self, at: Instant) -> Working<'_> {
        let ms = at.saturating_duration_since(origin()).as_millis();
        self.0.store(
            u64::try_from(ms).unwrap_or(u64::MAX - 1) + 1,
            Ordering::Relaxed,
        );
        Working(self)
    }

    /// How long the marked work has run, if some is.
    fn ran(&self) -> Option<Duration> {
        let mark = self.0.load(Ordering::Relaxed);
        let began = origin().checked_add(Duration::from_millis(mark.checked_sub(1)?))?;
        Some(Instant::now().saturating_duration_since(began))
    }
}

/// Work that has run for [`SLOW_WORK`] or more ([`HealthCell::slow_work`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowWork {
    /// How long it has run.
    pub ran: Duration,
    /// It is the dormant databases' pass, not the owner's own work.
    pub shared: bool,
}

impl SlowWork {
    /// What runs, for people.
    pub fn describe(&self) -> String {
        let s = self.ran.as_secs();
        if self.shared {
            format!(
                "the idle checks of the dormant databases have been held for {s} s (a hung file \
                 system or disk under one of them); a change to this database is not seen \
                 until they end, unless its file-change watch wakes it"
            )
        } else {
            format!(
                "a sync or check of this database has been running for {s} s; commits since \
                 it began are not captured until it ends (a full copy of a large database, or \
                 a hung file system or disk)"
            )
        }
    }
}

impl HealthCell {
    /// Records `reason`; returns true when this starts a problem (the owner logs it then).
    pub fn fail(&self, reason: impl Into<String>) -> bool {
        self.set(reason.into(), false)
    }

    /// Records that the owner stopped for good, because of `reason`.
    pub fn stop(&self, reason: impl Into<String>) {
        self.set(reason.into(), true);
    }

    fn set(&self, reason: String, stopped: bool) -> bool {
        let mut p = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *p {
            Some(old) => {
                old.reason = reason;
                old.stopped |= stopped;
                false
            }
            None => {
                *p = Some(Problem {
                    reason,
                    since_ms: crate::util::clock::now_ms(),
                    steady_ms: crate::util::clock::steady_ms(),
                    stopped,
                });
                true
            }
        }
    }

    /// Clears the problem; returns it when there was one (the owner logs the recovery).
    pub fn recover(&self) -> Option<Problem> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Marks work that began at `at` (a tick: an `Instant` it read anyway, so that marking
    /// costs no clock read) until the returned mark is dropped.
    pub fn begin(&self, at: Instant) -> Working<'_> {
        self.busy.begin(at)
    }

    /// Counts `mark` (work another thread does for the owner) as the owner's own work from
    /// the given time (when the owner began to count on it), until called again with `None`.
    pub fn share(&self, mark: Option<(Arc<WorkMark>, Instant)>) {
        *self.shared.lock().unwrap_or_else(|e| e.into_inner()) = mark;
    }

    /// The current problem, if any: the one recorded, else work that has run for
    /// [`SLOW_WORK`], which counts from when it began.
    pub fn problem(&self) -> Option<Problem> {
        let recorded = self
            .problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        recorded.or_else(|| self.slow())
    }

    /// How long the owner's own current work has run, if some runs (of any length).
    pub fn working_for(&self) -> Option<Duration> {
        self.busy.ran()
    }

    /// The owner's current work (its own, else the shared), once it has run for
    /// [`SLOW_WORK`] or more.
    pub fn slow_work(&self) -> Option<SlowWork> {
        let own = self.busy.ran().map(|ran| SlowWork { ran, shared: false });
        let shared = || {
            let shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            let (mark, since) = shared.as_ref()?;
            // A pass held before the owner joined it counts from the join: the owner was
            // protected until then.
            let ran = mark.ran()?.min(since.elapsed());
            Some(SlowWork { ran, shared: true })
        };
        own.filter(|w| w.ran >= SLOW_WORK)
            .or_else(|| shared().filter(|w| w.ran >= SLOW_WORK))
    }

    fn slow(&self) -> Option<Problem> {
        let work = self.slow_work()?;
        let ago = i64::try_from(work.ran.as_millis()).unwrap_or(i64::MAX);
        Some(Problem {
            reason: format!("not protected: {}", work.describe()),
            since_ms: crate::util::clock::now_ms().saturating_sub(ago),
            steady_ms: crate::util::clock::steady_ms().saturating_sub(ago),
            stopped: false,
        })
    }

    /// True while there is no problem ([`HealthCell::problem`]).
    pub fn is_ok(&self) -> bool {
        self.problem().is_none()
    }
}

/// Runs `task`, the long-lived task that owns `health`; if it panics, its cell says so for
/// good (and the log at ERROR): a task that died must not read as fine, which its last
/// state, or the drained replicas of a monitor that is gone, would.
pub fn stopped_on_panic<C: AsRef<HealthCell>>(
    task: impl Future<Output = ()>,
    health: Arc<C>,
    what: &'static str,
) -> impl Future<Output = ()> {
    on_panic(task, move |msg| {
        tracing::error!(task = what, panic = %msg, "a task panicked: not protected until replicad restarts");
        (*health).as_ref().stop(format!(
            "stopped: the {what} task panicked ({msg}); restart replicad"
        ));
    })
}

/// Runs `task`; if it panics, calls `then` with the panic's message.
///
/// Built from combinators, not an `async fn`: that would hold `task` twice in its state (the
/// argument and the wrapped future), which is kilobytes per database at 400 idle ones.
pub fn on_panic(
    task: impl Future<Output = ()>,
    then: impl FnOnce(String),
) -> impl Future<Output = ()> {
    use futures_util::FutureExt;
    std::panic::AssertUnwindSafe(task)
        .catch_unwind()
        .map(move |ended| {
            if let Err(panic) = ended {
                then(panic_text(&*panic));
            }
        })
}

/// The message a panic carried (empty when it was not a string).
pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

impl AsRef<HealthCell> for HealthCell {
    fn as_ref(&self) -> &HealthCell {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_past_slow_work_is_a_problem_until_it_ends() {
        let h = HealthCell::default();
        let now = Instant::now();
        {
            let _quick = h.begin(now);
            assert!(h.is_ok(), "work that just began");
        }
        let Some(long_ago) = now.checked_sub(SLOW_WORK + Duration::from_secs(1)) else {
            return;
        };
        {
            let _slow = h.begin(long_ago);
            let p = h.problem().expect("work past SLOW_WORK");
            assert!(
                p.reason.contains("has been running for 11 s"),
                "{}",
                p.reason
            );
            assert!(!p.reportable(Duration::from_secs(60), crate::util::clock::steady_ms()));
            assert!(p.reportable(Duration::from_secs(5), crate::util::clock::steady_ms()));
            // A recorded problem comes first.
            h.fail("a recorded one");
            assert_eq!(
                h.problem().map(|p| p.reason).as_deref(),
                Some("a recorded one")
            );
            h.recover();
        }
        assert!(h.is_ok(), "the mark ends with its work");
    }

    #[tokio::test]
    async fn a_task_that_panics_leaves_its_cell_stopped() {
        let h = Arc::new(HealthCell::default());
        stopped_on_panic(async {}, h.clone(), "upload").await;
        assert!(h.is_ok(), "a task that ends is not a problem");
        let task = async { panic!("index out of bounds") };
        stopped_on_panic(task, h.clone(), "upload").await;
        let p = h.problem().expect("the panic is recorded");
        assert!(
            p.stopped && p.reason.contains("index out of bounds"),
            "{p:?}"
        );
    }

    #[test]
    fn a_problem_starts_once_and_ends_once() {
        let h = HealthCell::default();
        assert!(h.is_ok());
        assert!(h.fail("disk full"));
        assert!(
            !h.fail("still full"),
            "the same streak does not start twice"
        );
        assert_eq!(h.problem().map(|p| p.reason), Some("still full".into()));
        assert_eq!(h.recover().map(|p| p.reason), Some("still full".into()));
        assert!(h.recover().is_none());
        assert!(h.is_ok());
    }

    #[test]
    fn readiness_reports_a_problem_after_the_grace_or_at_once_when_stopped() {
        let h = HealthCell::default();
        h.fail("blip");
        let p = h.problem().expect("set");
        let grace = std::time::Duration::from_secs(60);
        assert!(!p.reportable(grace, p.steady_ms + 59_999));
        assert!(p.reportable(grace, p.steady_ms + 60_000));
        h.stop("lease taken");
        let p = h.problem().expect("set");
        assert!(p.stopped && p.reportable(grace, p.steady_ms));
    }
}

/// Why a replica was re-seeded (the `reason` label of `replicad_replica_reseeds_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedReason {
    /// The replica held nothing of this database (new, or emptied before the start).
    Empty,
    /// Its files vanished while the daemon ran (the lease went with them).
    Wiped,
    /// It is behind what local staging still holds (staging pruned or lost meanwhile).
    Behind,
    /// A verify found that it does not restore (a damaged or missing file).
    Unrestorable,
}

impl SeedReason {
    /// Every reason, in metric-label order.
    pub const ALL: [SeedReason; 4] = [
        SeedReason::Empty,
        SeedReason::Wiped,
        SeedReason::Behind,
        SeedReason::Unrestorable,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            SeedReason::Empty => "empty",
            SeedReason::Wiped => "wiped",
            SeedReason::Behind => "behind",
            SeedReason::Unrestorable => "unrestorable",
        }
    }

    pub(crate) fn explain(self) -> &'static str {
        match self {
            SeedReason::Empty => "the replica holds nothing of this database",
            SeedReason::Wiped => "the replica's files vanished while replicad ran",
            SeedReason::Behind => "the replica is behind what local staging still holds",
            SeedReason::Unrestorable => "a verify found that the replica does not restore",
        }
    }
}
