//! The current set of replicated databases, as the outside world sees it.
//!
//! Databases come and go at run time ([`crate::daemon::discovery`]); the HTTP endpoints, the metrics
//! collector, the control socket and the systemd notifier read this registry at each use
//! instead of a list taken at start.
//!
//! Invariants:
//! - Readers get an immutable snapshot (`Arc<Vec<DbHandle>>`): the lock is held only to clone
//!   an `Arc` or to change the list, never across an `.await` or any I/O.
//! - Only the Store changes the set ([`crate::daemon`]); a path appears at most once.
//! - A database found at run time whose start failed is listed too, as a stand-in with that
//!   failure as its problem and no replica, until a start succeeds (the real one replaces
//!   it) or the file is gone: every reader then reports it as not protected.
//! - A change copies the list only while a reader still holds a snapshot of it
//!   (`Arc::make_mut`): starting 10,000 databases must not copy the list 10,000 times.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use crate::replicate::db::{DbPos, DbStats};
use crate::replicate::health::{SLOW_WORK, SlowWork};
use crate::replicate::replica::ReplicaStats;

/// What the outside world can see of one database.
#[derive(Clone)]
pub struct DbHandle {
    /// Database path.
    pub path: std::path::PathBuf,
    /// Counters.
    pub stats: Arc<DbStats>,
    /// Replicas: name and counters.
    pub replicas: Vec<(String, ReplicaStats)>,
    /// Position updates.
    pub pos: watch::Receiver<DbPos>,
    /// "Sync now" requests to the monitor ([`crate::ops::control`]).
    pub sync: Arc<SyncTrigger>,
    /// A stand-in for a database whose start failed: no monitor reads `sync`.
    pub unstarted: bool,
}

/// Wakes a database's monitor for an immediate tick, and tells when a tick has completed.
///
/// Ticks are numbered from 1 in the order they start. A caller that reads [`started`]
/// (`n`), then calls [`request`], knows that tick `n + 1` started after its read; once
/// [`synced`] reaches `n + 1`, everything committed before the read is in a local segment.
///
/// [`started`]: SyncTrigger::started
/// [`request`]: SyncTrigger::request
/// [`synced`]: SyncTrigger::synced
#[derive(Debug, Default)]
pub struct SyncTrigger {
    pub(crate) wake: tokio::sync::Notify,
    started: AtomicU64,
    synced: AtomicU64,
}

impl SyncTrigger {
    /// Number of ticks started so far.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Number of the latest tick that completed without error (idle skip or sync).
    pub fn synced(&self) -> u64 {
        self.synced.load(Ordering::SeqCst)
    }

    /// Wakes the monitor: its next tick starts now (a pending wake-up is kept if it is busy),
    /// and that tick bypasses the idle fast path.
    pub fn request(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn begin(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(crate) fn done(&self, tick: u64) {
        self.synced.fetch_max(tick, Ordering::SeqCst);
    }
}

/// The shared, current list of databases (cheap to clone).
#[derive(Clone, Default)]
pub struct DbRegistry {
    inner: Arc<RwLock<Listed>>,
}

#[derive(Default)]
struct Listed {
    dbs: Arc<Vec<DbHandle>>,
    /// The paths in `dbs`, for the at-most-once check without a scan.
    paths: HashSet<PathBuf>,
    /// The paths in `dbs` that are stand-ins for a failed start.
    unstarted: HashSet<PathBuf>,
}

impl DbRegistry {
    /// The databases now, in the order they were added.
    pub fn snapshot(&self) -> Arc<Vec<DbHandle>> {
        // A poisoned lock still holds a consistent list: nothing a writer does between
        // changing `paths` and `dbs` can panic.
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .dbs
            .clone()
    }

    /// Whether `path` is in the set.
    pub fn contains(&self, path: &Path) -> bool {
        let listed = self.inner.read().unwrap_or_else(|e| e.into_inner());
        listed.paths.contains(path)
    }

    /// Adds `db`, in place of its stand-in if its last start had failed; false (and nothing
    /// changed) when its path is already there.
    pub(crate) fn insert(&self, db: DbHandle) -> bool {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let listed = &mut *guard;
        if listed.unstarted.remove(&db.path) {
            Arc::make_mut(&mut listed.dbs).retain(|d| d.path != db.path);
            listed.paths.remove(&db.path);
        }
        if !listed.paths.insert(db.path.clone()) {
            return false;
        }
        Arc::make_mut(&mut listed.dbs).push(db);
        true
    }

    /// Lists `path`, whose start failed because of `why`, as not protected (a stand-in with
    /// that problem), or updates the reason of its stand-in; nothing if it runs.
    pub(crate) fn unstarted(&self, path: &Path, why: String) {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let listed = &mut *guard;
        if listed.unstarted.contains(path) {
            if let Some(d) = listed.dbs.iter().find(|d| d.path == path) {
                d.stats.health.fail(why);
            }
            return;
        }
        if !listed.paths.insert(path.to_path_buf()) {
            return;
        }
        let stats = Arc::new(DbStats::default());
        stats.health.fail(why);
        listed.unstarted.insert(path.to_path_buf());
        Arc::make_mut(&mut listed.dbs).push(DbHandle {
            path: path.to_path_buf(),
            stats,
            replicas: Vec::new(),
            pos: watch::channel(DbPos::default()).1,
            sync: Arc::default(),
            unstarted: true,
        });
    }

    /// Removes the database at `path`, returning it.
    pub(crate) fn remove(&self, path: &Path) -> Option<DbHandle> {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let listed = &mut *guard;
        let i = listed.dbs.iter().position(|d| d.path == path)?;
        listed.paths.remove(path);
        listed.unstarted.remove(path);
        Some(Arc::make_mut(&mut listed.dbs).remove(i))
    }
}

/// What is not protected now: databases with a problem, replicas behind their database or
/// stopped. One line each, naming them.
pub fn unprotected(dbs: &[DbHandle]) -> Vec<String> {
    let mut out = Vec::new();
    for d in dbs {
        if let Some(p) = d.stats.health.problem() {
            out.push(format!("database {}: {}", d.path.display(), p.reason));
        }
        replicas_behind(d, &mut out);
    }
    out
}

/// One line per database removed while replicated (a `dir` entry's file deleted) whose
/// replicas do not hold what it staged: its own problems (a file that is gone) are expected.
pub fn removed_unuploaded(dbs: &[DbHandle]) -> Vec<String> {
    let mut out = Vec::new();
    for d in dbs {
        replicas_behind(d, &mut out);
    }
    out.iter_mut()
        .for_each(|l| l.push_str(" (the database was removed while replicated)"));
    out
}

/// The lines of [`unprotected`] for `d`'s replicas.
fn replicas_behind(d: &DbHandle, out: &mut Vec<String>) {
    let db = d.path.display();
    let txid = d.pos.borrow().txid;
    for (name, r) in &d.replicas {
        let remote = r.remote_txid.load(Ordering::Relaxed);
        if r.lease_lost.load(Ordering::Relaxed) {
            out.push(format!(
                "database {db}: replica {name}: stopped at TXID {remote}: its single-writer lease was taken"
            ));
        } else if remote < txid.0 {
            let why = r
                .health
                .problem()
                .map_or(String::new(), |p| format!(" ({})", p.reason));
            out.push(format!(
                "database {db}: replica {name}: holds TXID {remote} of {}: not fully uploaded{why}",
                txid.0
            ));
        } else if let Some(p) = r.health.problem() {
            // Holding as much as the database, but not its chain (a seed still owed).
            out.push(format!("database {db}: replica {name}: {}", p.reason));
        }
    }
}

/// One line per database whose own file work (a sync, an idle check, its final sync and
/// close) still runs, for a shutdown that leaves it behind.
pub fn still_working(dbs: &[DbHandle]) -> Vec<String> {
    dbs.iter()
        .filter_map(|d| {
            let ran = d.stats.health.working_for()?;
            Some(format!(
                "database {}: a sync or check had not returned after {} s when the process \
                 exited: the commits it had not captured are uploaded by the next start",
                d.path.display(),
                ran.as_secs()
            ))
        })
        .collect()
}

/// Logs the databases whose tick has run for [`SLOW_WORK`] (at ERROR, once each) and when it
/// ends (INFO), looking every half [`SLOW_WORK`] until `stop`: a monitor blocked in the kernel
/// cannot log it itself. One wake-up per interval for the whole Store, idle or not.
pub async fn log_slow_work(registry: DbRegistry, stop: tokio_util::sync::CancellationToken) {
    let mut report = SlowReport::default();
    let mut every = tokio::time::interval(SLOW_WORK / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let dbs = registry.snapshot();
        let slow = dbs
            .iter()
            .filter_map(|d| Some((d.path.clone(), d.stats.health.slow_work()?)));
        for line in report.update(slow) {
            line.log();
        }
    }
}

/// The most databases one line of [`log_slow_work`] names; `/status` lists them all.
const NAMED: usize = 8;

/// What [`log_slow_work`] has reported and not yet seen end. A database's own slow work is
/// its own line; the held pass of the dormant databases is one line for all it holds (10,000
/// parked databases must not make 10,000 ERROR lines of one hung disk).
#[derive(Default)]
struct SlowReport {
    own: HashSet<PathBuf>,
    shared: HashSet<PathBuf>,
}

/// One line of [`log_slow_work`].
#[derive(Debug, PartialEq)]
enum SlowLine {
    Own(PathBuf, SlowWork),
    OwnEnded(PathBuf),
    /// Parked databases held by the dormant pass; `more` when others were already reported.
    Shared {
        dbs: Vec<PathBuf>,
        work: SlowWork,
        more: bool,
    },
    SharedEnded(Vec<PathBuf>),
}

impl SlowReport {
    /// The lines for the slow work seen now (each database at most once).
    fn update(&mut self, now: impl IntoIterator<Item = (PathBuf, SlowWork)>) -> Vec<SlowLine> {
        let mut lines = Vec::new();
        let (mut own, mut shared) = (HashSet::new(), HashSet::new());
        let mut joined: Vec<PathBuf> = Vec::new();
        let mut longest: Option<SlowWork> = None;
        for (db, work) in now {
            if work.shared {
                if !self.shared.contains(&db) {
                    joined.push(db.clone());
                    longest = longest.filter(|l| l.ran >= work.ran).or(Some(work));
                }
                shared.insert(db);
            } else {
                if !self.own.contains(&db) {
                    lines.push(SlowLine::Own(db.clone(), work));
                }
                own.insert(db);
            }
        }
        for db in self.own.difference(&own) {
            lines.push(SlowLine::OwnEnded(db.clone()));
        }
        let mut ended: Vec<PathBuf> = self.shared.difference(&shared).cloned().collect();
        if !ended.is_empty() {
            ended.sort();
            lines.push(SlowLine::SharedEnded(ended));
        }
        if let Some(work) = longest {
            joined.sort();
            lines.push(SlowLine::Shared {
                dbs: joined,
                work,
                more: !self.shared.is_empty(),
            });
        }
        (self.own, self.shared) = (own, shared);
        lines
    }
}

impl SlowLine {
    fn log(&self) {
        match self {
            SlowLine::Own(db, work) => tracing::error!(db = %db.display(),
                seconds = work.ran.as_secs(), "{}: it is NOT protected until it ends",
                work.describe()),
            SlowLine::OwnEnded(db) => {
                tracing::info!(db = %db.display(), "the slow sync or check ended")
            }
            SlowLine::Shared {
                dbs,
                work,
                more: false,
            } => tracing::error!(
                databases = dbs.len(),
                seconds = work.ran.as_secs(),
                "the idle checks of the dormant databases have been held for {} s (a hung file \
                 system or disk under one of them): {} dormant database(s) are NOT protected \
                 until they end, a change to one seen only if its file-change watch wakes it: {}",
                work.ran.as_secs(),
                dbs.len(),
                named(dbs)
            ),
            SlowLine::Shared {
                dbs,
                work,
                more: true,
            } => tracing::error!(
                databases = dbs.len(),
                seconds = work.ran.as_secs(),
                "{} more dormant database(s) have waited {} s on the held idle checks of the \
                 dormant databases and are NOT protected until they end: {}",
                dbs.len(),
                work.ran.as_secs(),
                named(dbs)
            ),
            SlowLine::SharedEnded(dbs) => tracing::info!(
                databases = dbs.len(),
                "the held idle checks no longer hold {} dormant database(s) (the pass ended, \
                 or they woke): {}",
                dbs.len(),
                named(dbs)
            ),
        }
    }
}

/// The first [`NAMED`] of `dbs`, and how many more.
fn named(dbs: &[PathBuf]) -> String {
    let mut out: Vec<String> = dbs
        .iter()
        .take(NAMED)
        .map(|d| d.display().to_string())
        .collect();
    if dbs.len() > NAMED {
        out.push(format!("and {} more (see /status)", dbs.len() - NAMED));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(path: &str) -> DbHandle {
        DbHandle {
            path: PathBuf::from(path),
            stats: Default::default(),
            replicas: Vec::new(),
            pos: tokio::sync::watch::channel(Default::default()).1,
            sync: Default::default(),
            unstarted: false,
        }
    }

    fn paths(dbs: &[DbHandle]) -> Vec<&Path> {
        dbs.iter().map(|d| d.path.as_path()).collect()
    }

    #[test]
    fn snapshots_keep_their_list_while_the_set_changes() {
        let reg = DbRegistry::default();
        assert!(reg.insert(handle("/a")));
        assert!(reg.insert(handle("/b")));
        assert!(!reg.insert(handle("/a")), "a path appears at most once");
        let before = reg.snapshot();
        assert!(reg.insert(handle("/c")));
        assert!(reg.remove(Path::new("/a")).is_some());
        assert!(reg.remove(Path::new("/a")).is_none());
        assert_eq!(paths(&before), [Path::new("/a"), Path::new("/b")]);
        assert_eq!(paths(&reg.snapshot()), [Path::new("/b"), Path::new("/c")]);
        assert!(!reg.contains(Path::new("/a")));
        assert!(reg.contains(Path::new("/c")));
        // Removed, the path can come back (a database deleted and created again).
        assert!(reg.insert(handle("/a")));
        assert_eq!(
            paths(&reg.snapshot()),
            [Path::new("/b"), Path::new("/c"), Path::new("/a")]
        );
    }

    #[test]
    fn a_failed_start_is_listed_not_protected_until_the_database_starts_or_goes() {
        let reg = DbRegistry::default();
        reg.unstarted(Path::new("/a"), "not replicated: first".into());
        reg.unstarted(Path::new("/a"), "not replicated: second".into());
        let snap = reg.snapshot();
        assert_eq!(paths(&snap), [Path::new("/a")]);
        let problem = snap[0].stats.health.problem().map(|p| p.reason);
        assert_eq!(problem.as_deref(), Some("not replicated: second"));
        // The start that succeeds replaces the stand-in.
        assert!(reg.insert(handle("/a")));
        let snap = reg.snapshot();
        assert_eq!(paths(&snap), [Path::new("/a")]);
        assert!(snap[0].stats.health.is_ok());
        // A running database is never shadowed by a stand-in.
        reg.unstarted(Path::new("/a"), "late".into());
        assert!(reg.snapshot()[0].stats.health.is_ok());
        // A stand-in whose file is gone leaves.
        reg.unstarted(Path::new("/b"), "not replicated".into());
        assert!(reg.remove(Path::new("/b")).is_some());
        assert_eq!(paths(&reg.snapshot()), [Path::new("/a")]);
    }

    fn work(secs: u64, shared: bool) -> SlowWork {
        SlowWork {
            ran: std::time::Duration::from_secs(secs),
            shared,
        }
    }

    fn ended(lines: &[SlowLine]) -> usize {
        match lines {
            [SlowLine::SharedEnded(dbs)] => dbs.len(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_held_dormant_pass_is_one_line_for_all_it_holds() {
        let mut r = SlowReport::default();
        let parked: Vec<(PathBuf, SlowWork)> = (0..10_000)
            .map(|i| (PathBuf::from(format!("/d/{i:05}")), work(11, true)))
            .collect();
        let lines = r.update(parked.clone());
        let [SlowLine::Shared { dbs, work: w, more }] = &lines[..] else {
            panic!("{lines:?}");
        };
        assert_eq!((dbs.len(), w.ran.as_secs(), *more), (10_000, 11, false));
        assert_eq!(dbs[0], Path::new("/d/00000"), "named in order");
        assert!(r.update(parked.clone()).is_empty(), "reported once");

        // A database that parked later joins the held pass; another's own sync is slow.
        let mut next = parked.clone();
        next.push(("/d/late".into(), work(10, true)));
        next.push(("/own".into(), work(12, false)));
        assert_eq!(
            r.update(next),
            [
                SlowLine::Own("/own".into(), work(12, false)),
                SlowLine::Shared {
                    dbs: vec!["/d/late".into()],
                    work: work(10, true),
                    more: true
                }
            ]
        );
        // The pass ends: one line for all it held; the own sync goes on, then ends.
        assert_eq!(ended(&r.update([("/own".into(), work(17, false))])), 10_001);
        assert_eq!(r.update([]), [SlowLine::OwnEnded("/own".into())]);
        // A pass held again is a new report.
        let lines = r.update(parked[..2].to_vec());
        assert!(
            matches!(&lines[..], [SlowLine::Shared { more: false, .. }]),
            "{lines:?}"
        );
        // A woken database leaves the report by itself.
        assert_eq!(ended(&r.update(parked[..1].to_vec())), 1);
    }

    #[test]
    fn a_line_names_the_first_databases_and_counts_the_rest() {
        let dbs: Vec<PathBuf> = (0..10).map(|i| PathBuf::from(format!("/{i}"))).collect();
        assert_eq!(named(&dbs[..2]), "/0, /1");
        assert_eq!(
            named(&dbs),
            "/0, /1, /2, /3, /4, /5, /6, /7, and 2 more (see /status)"
        );
    }

    #[test]
    fn inserts_do_not_copy_the_list_when_no_snapshot_is_held() {
        let reg = DbRegistry::default();
        reg.insert(handle("/a"));
        let first = Arc::as_ptr(&reg.snapshot());
        for i in 0..100 {
            reg.insert(handle(&format!("/db{i}")));
        }
        // Same allocation of the Arc: the list was changed in place.
        assert_eq!(Arc::as_ptr(&reg.snapshot()), first);
        assert_eq!(reg.snapshot().len(), 101);
    }
}
