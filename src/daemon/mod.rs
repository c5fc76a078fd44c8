//! The Store owns every database, every long-lived task and the shutdown sequence.
//!
//! ```text
//! Store (root token, ingest = root.child_token(), TaskTracker)
//!  ├─ per Db: monitor task (cancel: db = ingest.child_token())
//!  │           --watch DbPos-->  per Replica: upload task (cancel: root)
//!  └─ per watched `dir`: discovery task (cancel: ingest) -> StoreCore::add / remove
//! ```
//!
//! Shutdown: cancelling `ingest` makes each monitor run a final sync and drop its position
//! sender; upload tasks see the channel close, upload what is left, and return. The Store
//! waits for that within `shutdown-sync-timeout`; on timeout or a second signal it cancels
//! `root`, which stops uploads mid-flight. Nothing is lost either way: segments stay staged
//! and the next start resumes from staging and the replicas' listings.
//!
//! Databases can be added and removed at run time ([`StoreCore`], used by
//! [`crate::daemon::discovery`]). Removing one cancels only its own token: its monitor runs the same
//! final sync (it fails harmlessly when the file is gone) and its upload tasks drain what is
//! staged, exactly as at shutdown, while every other database goes on untouched. A path
//! that comes back is started again only once its previous start and tasks have all ended,
//! so two monitors never share one staging directory; that wait holds up no other path (a
//! start hung on a dead mount can last for ever). A start whose path is removed meanwhile
//! ends as [`Added::Removed`], however it went: nothing runs, nothing is reported.
//!
//! Invariant: only the Store spawns long-lived tasks, and every one is tracked (by the
//! Store's tracker, and a database's tasks also by that database's own tracker).

pub mod discovery;
pub mod registry;

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, DbConfig};
use crate::daemon::discovery::Discovery;
use crate::replicate::counters::ReplicaMetrics;
use crate::replicate::dormant::DormantWatch;
use crate::replicate::health::SLOW_WORK;
use crate::storage::AnyClient;
use registry::still_working;
pub use registry::{DbHandle, DbRegistry, SyncTrigger, unprotected};

mod monitor;
mod start;

/// Databases opened (replica listings, first sync) at the same time: thousands of databases
/// must start without a thundering herd on the disk and the object store.
const OPEN_CONCURRENCY: usize = 16;
/// Attempts at taking a replica's lease when the replica fails transiently (about 0.7 s);
/// past them the replica is left to connect in the background and the others go ahead.
const STARTUP_LEASE_ATTEMPTS: u32 = 4;
/// Attempts at a replica's first listing, likewise.
const STARTUP_LIST_ATTEMPTS: u32 = 4;

/// How long a shutdown waits for its tasks once it has stopped them (its timeout passed, or a
/// second signal): all but file work on the blocking pool end at once, and file work that
/// has not returned by then may never (a hung disk or mount), so the process exits without it.
const AFTER_STOP: Duration = Duration::from_secs(5);

/// The running replication of every configured database.
pub struct Store {
    core: StoreCore,
    shutdown_timeout: Duration,
}

/// Wraps each replica's client (database path, replica name, client): fault injection in
/// tests and drills.
pub type ClientWrapper = Arc<dyn Fn(&str, &str, AnyClient) -> AnyClient + Send + Sync>;

/// Why the Store could not start (or add a database).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A replica URL or setting is invalid (the message names it).
    #[error("{0}")]
    Config(String),
    /// The database's directory does not exist: a mistyped path, not a database to wait for.
    #[error("database {}: its directory {} does not exist (check the path)", db.display(), dir.display())]
    MissingDir {
        /// The database.
        db: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// Another replicad replicates this database (the one-daemon-per-database claim), or its
    /// claim could not be written.
    #[error("database {}: {source}", db.display())]
    Claimed {
        /// The database.
        db: PathBuf,
        /// Why.
        source: crate::replicate::staging::StagingError,
    },
    /// Another instance writes a replica (its single-writer lease is held), or the lease
    /// could not be taken.
    #[error("replica {replica} of {}: {source}", db.display())]
    Lease {
        /// The replica's name.
        replica: String,
        /// The database.
        db: PathBuf,
        /// Why.
        source: crate::replicate::lease::LeaseError,
    },
    /// A replica could not be listed at start.
    #[error("list replica {replica} of {}: {source}", db.display())]
    List {
        /// The replica's name.
        replica: String,
        /// The database.
        db: PathBuf,
        /// Why.
        source: crate::storage::StorageError,
    },
    /// A local directory could not be prepared or read.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The Store is shutting down: nothing new starts.
    #[error("shutting down")]
    ShuttingDown,
}

impl StoreError {
    /// Work `op` on `path` that panicked or was cancelled (`why`: a task's `JoinError` says
    /// which), as an error: reported, not lost.
    pub(crate) fn panicked(op: &'static str, path: &Path, why: impl std::fmt::Display) -> Self {
        StoreError::Io {
            op,
            path: path.to_path_buf(),
            source: std::io::Error::other(why.to_string()),
        }
    }

    /// A mistake in the configuration (exit code 2), not a runtime failure.
    pub fn is_config(&self) -> bool {
        matches!(self, StoreError::Config(_) | StoreError::MissingDir { .. })
    }
}

/// The part of the Store that adds and removes databases while it runs (cheap to clone).
#[derive(Clone)]
pub struct StoreCore {
    inner: Arc<Core>,
}

struct Core {
    root: CancellationToken,
    ingest: CancellationToken,
    tracker: TaskTracker,
    permits: Arc<Semaphore>,
    prometheus: prometheus::Registry,
    counters: ReplicaMetrics,
    /// Open connections of every database, against the descriptor budget.
    awake: Arc<crate::replicate::db::AwakeBudget>,
    /// Phase totals of every database and replica.
    phases: Arc<crate::util::phase::PhaseStats>,
    /// Turns for the maintenance builds and verifies of every replica.
    turns: crate::replicate::maintenance::Turns,
    /// SDK clients shared by the replicas of one endpoint, region and credentials.
    s3_clients: crate::storage::s3::S3Clients,
    started_ms: i64,
    /// The config's `max-lag`: a replica further behind is not protected.
    max_lag: Duration,
    wrap: Option<ClientWrapper>,
    registry: DbRegistry,
    /// The tasks of each database started and not yet finished, removed ones included until
    /// their tasks end. An async lock, never held across a start or a wait for one.
    running: tokio::sync::Mutex<HashMap<PathBuf, Running>>,
    /// One watch of dormant databases per monitor interval in use (nearly always one).
    dormant: std::sync::Mutex<HashMap<Duration, Arc<DormantWatch>>>,
    /// The inotify watches that wake monitors at each commit.
    wal_watcher: Arc<crate::replicate::walwatch::WalWatcher>,
}

/// One database's claim, counted in the Store's descriptor budget while it lives; its monitor
/// and upload tasks hold it.
pub(super) struct DbClaim {
    lock: crate::replicate::staging::StagingLock,
    _counted: crate::replicate::db::CountedClaim,
}

/// One database's own cancellation and tasks.
struct Running {
    token: CancellationToken,
    tasks: TaskTracker,
    /// What the outside world saw of it, kept once it is removed (no longer listed) while
    /// its final sync and uploads drain, so that a shutdown still reports what they left.
    removed: Option<DbHandle>,
}

/// What [`StoreCore::add`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Added {
    /// The database is now replicated.
    Started,
    /// The path was already replicated (e.g. also configured by `path`); nothing changed.
    AlreadyRunning,
    /// The path was removed while it started: nothing runs, nothing is reported.
    Removed,
}

/// What [`StoreCore::remove`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The database's replication: a final sync, then its uploads drain.
    Stopping,
    /// Its start, before it replicated anything.
    StartCancelled,
    /// Nothing ran there.
    Nothing,
}

/// How [`StoreCore::add_patiently`] left a start.
#[derive(Debug)]
pub(crate) enum Patient {
    /// It ended in time.
    Done(Added),
    /// It goes on in the background, its database reported not protected meanwhile; how it
    /// ends arrives here (nothing if the Store stops first).
    Late(tokio::sync::oneshot::Receiver<Result<Added, StoreError>>),
}

/// Whether a database's start has ended and every task it spawned too.
fn drained(r: &Running) -> bool {
    r.tasks.is_closed() && r.tasks.is_empty()
}

impl StoreCore {
    /// The current databases.
    pub fn registry(&self) -> &DbRegistry {
        &self.inner.registry
    }

    /// Starts replicating `dbc` (replica listings first, within the open concurrency).
    pub async fn add(&self, dbc: &DbConfig) -> Result<Added, StoreError> {
        let core = &*self.inner;
        let token = core.ingest.child_token();
        let tasks = TaskTracker::new();
        let prev = {
            let mut running = core.running.lock().await;
            if core.ingest.is_cancelled() {
                return Err(StoreError::ShuttingDown);
            }
            // Removed, and maybe still draining or still starting: waited for below.
            let prev = match running.get(&dbc.path) {
                Some(prev) if !prev.token.is_cancelled() => return Ok(Added::AlreadyRunning),
                Some(prev) if !drained(prev) => Some(prev.tasks.clone()),
                _ => None,
            };
            // Reserved before the (slow) start, so that starts of other databases run
            // concurrently while a second add of this path sees it running, and a removal
            // meanwhile cancels this start.
            running.insert(
                dbc.path.clone(),
                Running {
                    token: token.clone(),
                    tasks: tasks.clone(),
                    removed: None,
                },
            );
            prev
        };
        // Never two monitors on one staging dir. Waited without the lock, which every add and
        // remove takes: a start hung on a dead mount holds up only its own path. This start's
        // tracker stays open meanwhile, so a third add of the path waits for both.
        if let Some(prev) = prev {
            tokio::select! {
                _ = prev.wait() => {}
                _ = core.ingest.cancelled() => {}
            }
            if core.ingest.is_cancelled() {
                tasks.close();
                return Err(StoreError::ShuttingDown);
            }
            if token.is_cancelled() {
                tasks.close();
                return Ok(Added::Removed);
            }
        }
        // Boxed: a start nests leases, listings and every client wrapper; unboxed, the
        // layout of the futures that await it exceeds the compiler's type query depth.
        let started = AssertUnwindSafe(Box::pin(self.start_db(dbc, &token, &tasks)))
            .catch_unwind()
            .await;
        tasks.close();
        // A start that panicked fails as any other (its entry goes, a later add retries);
        // left as it was, the path would count as running for good.
        let started = match started {
            Ok(started) => started,
            Err(panic) => Err(StoreError::panicked(
                "start",
                &dbc.path,
                format!(
                    "it panicked: {}",
                    crate::replicate::health::panic_text(&*panic)
                ),
            )),
        };
        // Under the lock a removal takes: a removal either came first (this start ends as
        // removed) or comes after the database is listed (and unlists it).
        let mut running = core.running.lock().await;
        // Removed while starting (not stopped): however the start ended, nothing is to run or
        // be reported; its tasks, if any, are already stopping.
        if token.is_cancelled() && !core.ingest.is_cancelled() {
            return Ok(Added::Removed);
        }
        match started {
            // Stopped while starting: its tasks are already stopping; never list it.
            Ok(_) if token.is_cancelled() => Ok(Added::Started),
            Ok(handle) => {
                core.registry.insert(handle);
                Ok(Added::Started)
            }
            Err(e) => {
                token.cancel();
                if running.get(&dbc.path).is_some_and(|r| r.token == token) {
                    running.remove(&dbc.path);
                }
                Err(e)
            }
        }
    }

    /// [`StoreCore::add`], for the starts nobody waits on one by one (the Store's open,
    /// directory discovery): a start still running after [`SLOW_WORK`] (a hung mount under
    /// the database, a replica that takes the connection and never answers) goes on in the
    /// background, its database reported not protected until it has started, so that the
    /// other databases and the endpoints do not wait for it ([`Patient::Late`]). A start that
    /// then fails stays reported, by the caller if it listens (directory discovery, which
    /// retries it in a watched directory), here otherwise (the daemon cannot exit 2 or 1 for
    /// it any more).
    pub(crate) async fn add_patiently(&self, dbc: &DbConfig) -> Result<Patient, StoreError> {
        let mut start = {
            let (me, dbc) = (self.clone(), dbc.clone());
            tokio::spawn(async move { me.add(&dbc).await })
        };
        let Ok(joined) = tokio::time::timeout(SLOW_WORK, &mut start).await else {
            let why = format!(
                "its start has run for {SLOW_WORK:?} (its file system or a replica does not \
                 answer); the other databases go on, and it is NOT protected until it starts"
            );
            tracing::error!(db = %dbc.path.display(), "{why}");
            self.registry().unstarted(&dbc.path, why);
            let (core, path) = (self.clone(), dbc.path.clone());
            let ingest = self.inner.ingest.clone();
            let (tell, told) = tokio::sync::oneshot::channel();
            self.spawn(async move {
                let abort = start.abort_handle();
                let joined = tokio::select! {
                    joined = start => joined,
                    // At the stop, dropped where it waits (a blocked thread cannot be stopped;
                    // nothing it left undone is lost: the next start claims and lists again).
                    _ = ingest.cancelled() => return abort.abort(),
                };
                let ended = match joined {
                    Ok(ended) => ended,
                    Err(e) => Err(StoreError::panicked("start", &path, e)),
                };
                match &ended {
                    Ok(Added::Started) => tracing::info!(db = %path.display(), "started after all"),
                    // Nobody retries it (the Store's open): reported here, until a restart.
                    Err(e) if tell.is_closed() => {
                        tracing::error!(db = %path.display(), error = %e, "its start failed; it is NOT protected until replicad restarts");
                        core.registry().unstarted(&path, format!("not replicated: {e}"));
                    }
                    Ok(Added::Removed) => tracing::info!(db = %path.display(),
                        "removed while it started: not replicated, not reported"),
                    // Reported by the caller.
                    _ => {}
                }
                let _ = tell.send(ended);
            });
            return Ok(Patient::Late(told));
        };
        match joined {
            Ok(added) => added.map(Patient::Done),
            Err(e) => Err(StoreError::panicked("start", &dbc.path, e)),
        }
    }

    /// Stops replicating the database at `path`: a final sync, then its uploads drain. The
    /// other databases are not touched. Returns when its tasks are stopping, not ended.
    pub async fn remove(&self, path: &Path) -> Removal {
        let core = &*self.inner;
        let mut running = core.running.lock().await;
        // Forget databases removed earlier whose start and tasks have all ended, unless their
        // replicas still lack what they staged (a task that ended on its own: the stop says so).
        running.retain(|_, r| {
            !r.token.is_cancelled()
                || !drained(r)
                || r.removed.as_ref().is_some_and(|h| {
                    !registry::removed_unuploaded(std::slice::from_ref(h)).is_empty()
                })
        });
        let registered = core.registry.remove(path);
        if let Some(handle) = &registered {
            let label = path.display().to_string();
            for (name, _) in &handle.replicas {
                core.counters.forget_replica(&label, name);
            }
        }
        match running.get_mut(path) {
            Some(r) if !r.token.is_cancelled() => {
                r.token.cancel();
                r.removed = registered.clone().filter(|h| !h.unstarted);
                // A stand-in says its start has not ended.
                if registered.is_some_and(|h| !h.unstarted) {
                    Removal::Stopping
                } else {
                    Removal::StartCancelled
                }
            }
            _ => Removal::Nothing,
        }
    }

    /// Spawns `fut` as a tracked long-lived task of the Store.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.inner.tracker.spawn(fut);
    }

    /// The token cancelled when the Store stops ingesting.
    pub(crate) fn ingest(&self) -> &CancellationToken {
        &self.inner.ingest
    }

    /// The watch of dormant databases ticking every `interval`; its thread starts with it.
    /// None when that thread cannot start: the monitors then check their dormant databases
    /// themselves (a task wake-up each per tick), and the next database tries again.
    fn dormant_watch(&self, interval: Duration) -> Option<Arc<DormantWatch>> {
        let core = &*self.inner;
        let mut watches = core.dormant.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(watch) = watches.get(&interval) {
            return Some(watch.clone());
        }
        let watch = DormantWatch::new(interval);
        match watch.start(core.ingest.child_token()) {
            Ok(ender) => core.tracker.spawn(ender),
            Err(e) => {
                static TOLD: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %e, "cannot start the dormant databases' thread: their monitors check them");
                }
                return None;
            }
        };
        watches.insert(interval, watch.clone());
        Some(watch)
    }
}

impl Store {
    /// Starts replication of every database in `config`, and the discovery of `dirs`. Replica
    /// listings happen here (one LIST per level per replica, bounded concurrency); a replica
    /// that cannot be listed fails the start.
    pub async fn open(config: &Config) -> Result<Store, StoreError> {
        Self::open_with(config, None).await
    }

    /// [`Store::open`], with every replica client passed through `wrap`.
    pub async fn open_with(
        config: &Config,
        wrap: Option<ClientWrapper>,
    ) -> Result<Store, StoreError> {
        Self::open_budgeted(config, wrap, None).await
    }

    /// [`Store::open_with`], with the awake budget ([`Store::set_awake_budget`]) in place
    /// before the first database opens: set afterwards, thousands of databases starting
    /// together would all hold their connections and run out of descriptors first.
    pub async fn open_budgeted(
        config: &Config,
        wrap: Option<ClientWrapper>,
        awake_budget: Option<usize>,
    ) -> Result<Store, StoreError> {
        let root = CancellationToken::new();
        let awake = Arc::new(crate::replicate::db::AwakeBudget::unlimited());
        if let Some(n) = awake_budget {
            awake.set(n);
        }
        let ingest = root.child_token();
        let prometheus = prometheus::Registry::new();
        let phases = Arc::new(crate::util::phase::PhaseStats::new());
        let core = StoreCore {
            inner: Arc::new(Core {
                root,
                ingest,
                tracker: TaskTracker::new(),
                permits: Arc::new(Semaphore::new(OPEN_CONCURRENCY)),
                prometheus: prometheus.clone(),
                counters: ReplicaMetrics::register(&prometheus, phases.clone()),
                phases,
                turns: Default::default(),
                s3_clients: Default::default(),
                awake,
                // Also anchors the steady clock, so both read the same now.
                started_ms: crate::util::clock::steady_ms(),
                max_lag: config.max_lag,
                wrap,
                registry: DbRegistry::default(),
                running: tokio::sync::Mutex::new(HashMap::new()),
                dormant: std::sync::Mutex::new(HashMap::new()),
                wal_watcher: crate::replicate::walwatch::WalWatcher::new(),
            }),
        };
        let watcher = core.inner.wal_watcher.clone();
        core.inner
            .tracker
            .spawn(watcher.run(core.inner.ingest.child_token()));
        core.inner
            .tracker
            .spawn(crate::util::malloc::trim_periodically(
                core.inner.ingest.child_token(),
            ));
        core.inner.tracker.spawn(registry::log_slow_work(
            core.inner.registry.clone(),
            core.inner.ingest.child_token(),
        ));
        // Databases start concurrently (listing a replica is a network round trip: thousands
        // started one by one would take minutes).
        // Every start runs to its end, except one still hung at the stop (`add_patiently`),
        // which keeps the leases it took until their TTL or the next start here.
        let added: Vec<Result<(), StoreError>> = futures_util::stream::iter(&config.dbs)
            .map(|dbc| async { core.add_patiently(dbc).await.map(drop) })
            .buffer_unordered(OPEN_CONCURRENCY)
            .collect()
            .await;
        let added: Result<(), StoreError> = added.into_iter().collect();
        let store = Store {
            core: core.clone(),
            shutdown_timeout: config.shutdown_sync_timeout,
        };
        if let Err(e) = added {
            // Databases that did start stop cleanly, handing back their leases.
            store.abandon().await;
            return Err(e);
        }
        for dir in &config.dirs {
            let discovery = Discovery::new(dir.clone()).map_err(StoreError::Config)?;
            // Failures here would stop the start half-way: let the shutdown reap what started.
            if let Err(e) = discovery.start(&core).await {
                store.abandon().await;
                return Err(e);
            }
        }
        Ok(store)
    }

    /// The Prometheus registry the replicas count into ([`crate::ops::metrics::Metrics::of`]
    /// renders it with the databases' figures).
    pub fn prometheus(&self) -> &prometheus::Registry {
        &self.core.inner.prometheus
    }

    /// How many databases may keep a connection open before idle ones go dormant early
    /// (see [`crate::replicate::db::AwakeBudget`]).
    pub fn set_awake_budget(&self, databases: usize) {
        self.core.inner.awake.set(databases);
    }

    /// The phase totals of every database and replica of this Store.
    pub fn phases(&self) -> &Arc<crate::util::phase::PhaseStats> {
        &self.core.inner.phases
    }

    /// When the Store started (ms since the epoch).
    pub fn started_ms(&self) -> i64 {
        self.core.inner.started_ms
    }

    /// The config's `max-lag`: how far behind a replica may be and still be protected.
    pub fn max_lag(&self) -> Duration {
        self.core.inner.max_lag
    }

    /// The current databases.
    pub fn registry(&self) -> &DbRegistry {
        self.core.registry()
    }

    /// A snapshot of the current databases.
    pub fn dbs(&self) -> Arc<Vec<DbHandle>> {
        self.core.registry().snapshot()
    }

    /// Dormant databases whose idle checks the dormant watch runs now (monitors that left
    /// since its last pass over their slot included).
    pub fn parked(&self) -> usize {
        let watches = self
            .core
            .inner
            .dormant
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        watches.values().map(|w| w.parked()).sum()
    }

    /// Stops ingesting, drains uploads within the timeout, and returns when every task ended,
    /// or 5 s after stopping those still running (file work that does not return is left
    /// behind and named). `abort` (a second signal) cuts the drain short. Returns what was
    /// left unprotected: one line per database whose last sync failed, per replica that does
    /// not hold its database's last TXID, and per database whose work was left behind (empty:
    /// every segment was uploaded).
    pub async fn shutdown(self, abort: impl Future<Output = ()>) -> Vec<String> {
        let core = &*self.core.inner;
        core.ingest.cancel();
        core.tracker.close();
        let started = Instant::now();
        let drained = tokio::select! {
            _ = core.tracker.wait() => true,
            _ = tokio::time::sleep(self.shutdown_timeout) => {
                tracing::warn!(timeout = ?self.shutdown_timeout, "shutdown-sync-timeout passed: stopping the uploads and maintenance still running");
                false
            }
            _ = abort => {
                tracing::warn!("second signal: aborting the shutdown sync and the maintenance still running");
                false
            }
        };
        let mut timed_out = false;
        if !drained {
            core.root.cancel();
            timed_out = tokio::time::timeout(AFTER_STOP, core.tracker.wait())
                .await
                .is_err();
        }
        let dbs = self.core.registry().snapshot();
        let mut left = unprotected(&dbs);
        // Databases removed while running (a `dir` entry's file deleted): their final sync
        // and uploads were still owed to their replicas.
        let removed: Vec<DbHandle> = core
            .running
            .lock()
            .await
            .values()
            .filter_map(|r| r.removed.clone())
            .collect();
        left.extend(registry::removed_unuploaded(&removed));
        if timed_out {
            let hung = still_working(&dbs);
            tracing::error!(
                databases = hung.len(),
                after = ?AFTER_STOP,
                "file work still runs after the stop (a hung file system or disk?): exiting without waiting for it"
            );
            if hung.is_empty() {
                left.push(format!(
                    "a task had not ended {} s after the stop was forced (a hung file system \
                     or disk?): what it held is uploaded by the next start",
                    AFTER_STOP.as_secs()
                ));
            }
            left.extend(hung);
        }
        if left.is_empty() {
            tracing::info!(elapsed = ?started.elapsed(), "shutdown complete: every segment uploaded");
        } else {
            for line in &left {
                tracing::error!("shutdown: {line}");
            }
            tracing::warn!(
                "the next start uploads what was not (from staging, or from the WAL when a sync failed)"
            );
        }
        left
    }

    /// Stops everything at once after a failed start (leases are released by the upload
    /// tasks as they end).
    async fn abandon(self) {
        let core = &*self.core.inner;
        core.ingest.cancel();
        core.tracker.close();
        if tokio::time::timeout(self.shutdown_timeout, core.tracker.wait())
            .await
            .is_err()
        {
            core.root.cancel();
            core.tracker.wait().await;
        }
    }
}
