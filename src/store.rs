//! The Store owns every database, every long-lived task and the shutdown sequence.
//!
//! ```text
//! Store (root token, ingest = root.child_token(), TaskTracker)
//!  └─ per Db: monitor task (cancel: ingest)  --watch DbPos-->  per Replica: upload task (cancel: root)
//! ```
//!
//! Shutdown: cancelling `ingest` makes each monitor run a final sync and drop its position
//! sender; upload tasks see the channel close, upload what is left, and return. The Store
//! waits for that within `shutdown-sync-timeout`; on timeout or a second signal it cancels
//! `root`, which stops uploads mid-flight. Nothing is lost either way: segments stay staged
//! and the next start resumes from staging and the replicas' listings.
//!
//! Invariant: only the Store spawns long-lived tasks, and every one is tracked.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::RngExt;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::compaction::RetentionPolicy;
use crate::config::{Config, DbConfig};
use crate::db::{Db, DbError, DbPos, DbStats, RemoteTip};
use crate::lease::Lease;
use crate::ltx::TxId;
use crate::maintenance::Maintenance;
use crate::metrics::Metrics;
use crate::replica::{Replica, ReplicaStats};
use crate::replica_client::AnyClient;
use crate::retry::Backoff;
use crate::staging::Staging;

/// Databases opened (replica listings, first sync) at the same time: thousands of databases
/// must start without a thundering herd on the disk and the object store.
const OPEN_CONCURRENCY: usize = 16;
/// Attempts at taking a replica's lease when the replica fails transiently (about 30 s).
const STARTUP_LEASE_ATTEMPTS: u32 = 10;

/// What `start_db` needs from the Store.
#[derive(Clone, Copy)]
struct StartContext<'a> {
    tracker: &'a TaskTracker,
    root: &'a CancellationToken,
    ingest: &'a CancellationToken,
    permits: &'a Arc<Semaphore>,
    metrics: &'a Metrics,
    wrap: Option<&'a ClientWrapper>,
}

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
    /// "Sync now" requests to the monitor ([`crate::control`]).
    pub sync: Arc<SyncTrigger>,
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
    wake: tokio::sync::Notify,
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

    fn begin(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn done(&self, tick: u64) {
        self.synced.fetch_max(tick, Ordering::SeqCst);
    }
}

/// The running replication of every configured database.
pub struct Store {
    root: CancellationToken,
    ingest: CancellationToken,
    tracker: TaskTracker,
    dbs: Vec<DbHandle>,
    shutdown_timeout: Duration,
    metrics: Metrics,
}

/// Wraps each replica's client (database path, replica name, client): fault injection in
/// tests and drills.
pub type ClientWrapper = Arc<dyn Fn(&str, &str, AnyClient) -> AnyClient + Send + Sync>;

/// Why the Store could not start.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A replica URL or setting is invalid.
    #[error("{0}")]
    Config(String),
    /// A local directory could not be prepared.
    #[error("{0}")]
    Io(String),
    /// Another instance writes a replica (its single-writer lease is held), or the lease
    /// could not be taken.
    #[error("{0}")]
    Lease(String),
}

impl Store {
    /// Starts replication of every database in `config`. Replica listings happen here (one
    /// LIST per level per replica, bounded concurrency); a replica that cannot be listed is
    /// retried by its own task rather than failing the whole Store.
    pub async fn open(config: &Config) -> Result<Store, StoreError> {
        Self::open_with(config, None).await
    }

    /// [`Store::open`], with every replica client passed through `wrap`.
    pub async fn open_with(
        config: &Config,
        wrap: Option<ClientWrapper>,
    ) -> Result<Store, StoreError> {
        let root = CancellationToken::new();
        let ingest = root.child_token();
        let tracker = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(OPEN_CONCURRENCY));
        let metrics = Metrics::new();
        let ctx = StartContext {
            tracker: &tracker,
            root: &root,
            ingest: &ingest,
            permits: &permits,
            metrics: &metrics,
            wrap: wrap.as_ref(),
        };
        let mut dbs = Vec::with_capacity(config.dbs.len());
        for dbc in &config.dbs {
            dbs.push(Self::start_db(dbc, &ctx).await?);
        }
        metrics.register_dbs(&dbs);
        Ok(Store {
            root,
            ingest,
            tracker,
            dbs,
            shutdown_timeout: config.shutdown_sync_timeout,
            metrics,
        })
    }

    async fn start_db(dbc: &DbConfig, ctx: &StartContext<'_>) -> Result<DbHandle, StoreError> {
        let StartContext {
            tracker,
            root,
            ingest,
            permits,
            metrics,
            wrap,
        } = *ctx;
        let db_label = dbc.path.display().to_string();
        let meta = dbc
            .meta_path
            .clone()
            .unwrap_or_else(|| crate::db::default_meta_path(&dbc.path));
        // Every replica's lease comes first, before anything local or remote is touched: a
        // second daemon for this database must not clean up the first one's staging or
        // build files, and what is listed below is then ours alone to extend.
        let mut leased: Vec<(_, AnyClient, _, Lease)> = Vec::with_capacity(dbc.replicas.len());
        for rc in &dbc.replicas {
            let client = rc.client().map_err(StoreError::Config)?;
            let client = match wrap {
                Some(w) => w(&db_label, &rc.name, client),
                None => client,
            };
            let counters = metrics.replica(&db_label, &rc.name);
            let mut lease = Lease::new(client.clone(), &db_label, dbc.settings.lease_ttl);
            let _permit = permits
                .acquire()
                .await
                .map_err(|e| StoreError::Io(e.to_string()))?;
            if let Err(e) = lease
                .acquire_with_retries(&counters, STARTUP_LEASE_ATTEMPTS)
                .await
            {
                // Hand back what this database already took: the other instance may need
                // those replicas too.
                for (_, _, counters, mut lease) in leased {
                    lease.release(&counters).await;
                }
                return Err(StoreError::Lease(format!(
                    "replica {} of {}: {e}",
                    rc.name,
                    dbc.path.display()
                )));
            }
            leased.push((rc, client, counters, lease));
        }
        let staging_dir = meta.join("ltx").join("0");
        let staging = Staging::open(staging_dir.clone())
            .map_err(|e| StoreError::Io(format!("open staging {}: {e}", staging_dir.display())))?;
        let mut replicas = Vec::new();
        let mut tip = RemoteTip::default();
        for (rc, client, counters, lease) in leased {
            let mut r = Replica::new(
                rc.name.clone(),
                db_label.clone(),
                client,
                staging.clone(),
                dbc.settings.heartbeat_interval,
                counters,
                maintenance_of(&dbc.settings, meta.join("tmp").join(&rc.name)),
                lease,
            );
            let _permit = permits
                .acquire()
                .await
                .map_err(|e| StoreError::Io(e.to_string()))?;
            match r.init().await {
                Ok(t) if t.txid > tip.txid => tip = t,
                Ok(_) => {}
                Err(e) => {
                    return Err(StoreError::Io(format!(
                        "list replica {} of {}: {e}",
                        rc.name,
                        dbc.path.display()
                    )));
                }
            }
            replicas.push(r);
        }
        let db = Db::new(dbc.path.clone(), Some(meta), dbc.settings.clone(), tip);
        let trigger = Arc::new(SyncTrigger::default());
        let handle = DbHandle {
            path: dbc.path.clone(),
            stats: db.stats(),
            replicas: replicas
                .iter()
                .map(|r| (r.name().to_string(), r.stats()))
                .collect(),
            pos: db.subscribe(),
            sync: trigger.clone(),
        };
        let acks: Vec<watch::Receiver<TxId>> = replicas.iter().map(Replica::acks).collect();
        for r in replicas {
            let span =
                tracing::info_span!("replica", db = %dbc.path.display(), replica = %r.name());
            let rx = db.subscribe();
            let abort = root.clone();
            tracker.spawn(tracing::Instrument::instrument(r.run(rx, abort), span));
        }
        let span = tracing::info_span!("db", db = %dbc.path.display());
        let monitor = monitor(
            db,
            acks,
            ingest.clone(),
            permits.clone(),
            dbc.settings.monitor_interval,
            trigger,
        );
        tracker.spawn(tracing::Instrument::instrument(monitor, span));
        Ok(handle)
    }

    /// The metrics of every database and replica.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The databases.
    pub fn dbs(&self) -> &[DbHandle] {
        &self.dbs
    }

    /// Stops ingesting, drains uploads within the timeout, and returns when every task ended.
    /// `abort` (a second signal) cuts the drain short.
    pub async fn shutdown(self, abort: impl Future<Output = ()>) {
        self.ingest.cancel();
        self.tracker.close();
        let started = Instant::now();
        tokio::select! {
            _ = self.tracker.wait() => {
                tracing::info!(elapsed = ?started.elapsed(), "shutdown complete: every segment uploaded");
                return;
            }
            _ = tokio::time::sleep(self.shutdown_timeout) => {
                tracing::warn!(timeout = ?self.shutdown_timeout, "shutdown sync timed out; segments stay staged for the next start");
            }
            _ = abort => {
                tracing::warn!("second signal: aborting the shutdown sync; segments stay staged for the next start");
            }
        }
        self.root.cancel();
        self.tracker.wait().await;
    }
}

/// A replica's maintenance settings; removes build leftovers of a previous run.
fn maintenance_of(s: &crate::config::DbSettings, tmp_dir: std::path::PathBuf) -> Maintenance {
    // Leftovers are partial outputs of a crashed compaction: never uploaded, safe to drop.
    let _ = std::fs::remove_dir_all(&tmp_dir);
    Maintenance {
        levels: s.levels.clone(),
        snapshot_interval: s.snapshot_interval,
        retention: RetentionPolicy {
            snapshot_retention: s.snapshot_retention,
            l0_retention: s.l0_retention,
        },
        retention_check: s.l0_retention_check_interval,
        retention_enabled: s.retention_enabled,
        codec: s.compression,
        tmp_dir,
        verify_interval: s.verify_interval,
    }
}

/// The monitor task of one database: ticks, runs the idle fast path, and syncs when the WAL
/// changed. The first tick fires after exactly one interval, the second after a random
/// delay in [0, interval) to spread thousands of databases apart, then every interval.
/// A [`SyncTrigger::request`] starts a tick at once, without the idle fast path.
async fn monitor(
    mut db: Db,
    acks: Vec<watch::Receiver<TxId>>,
    ingest: CancellationToken,
    permits: Arc<Semaphore>,
    interval: Duration,
    trigger: Arc<SyncTrigger>,
) {
    let mut delay = interval;
    let mut ticks = 0u64;
    let mut backoff = Backoff::new(
        interval.max(Duration::from_millis(100)),
        Duration::from_secs(300),
    );
    let mut failing: Option<(Instant, u32)> = None;
    let mut pruned = TxId(0);
    let mut opened = false;
    loop {
        let forced = tokio::select! {
            _ = ingest.cancelled() => break,
            _ = tokio::time::sleep(delay) => false,
            _ = trigger.wake.notified() => true,
        };
        let tick = trigger.begin();
        ticks += 1;
        delay = if ticks == 1 {
            jitter(interval)
        } else {
            interval
        };
        if !forced && db.fast_path_skip(Instant::now()) {
            prune(&db, &acks, &mut pruned);
            trigger.done(tick);
            continue;
        }
        let permit = if opened {
            None
        } else {
            permits.clone().acquire_owned().await.ok()
        };
        let (back, result) = match run_blocking(db, |d| d.sync(true)).await {
            Some(v) => v,
            None => return,
        };
        drop(permit);
        db = back;
        match result {
            Ok(_) => {
                opened = true;
                trigger.done(tick);
                if let Some((since, n)) = failing.take() {
                    tracing::info!(failures = n, after = ?since.elapsed(), "sync recovered");
                }
                backoff.reset();
            }
            Err(e) => {
                match &mut failing {
                    None => {
                        tracing::error!(error = %e, "sync failed; retrying with backoff");
                        failing = Some((Instant::now(), 1));
                    }
                    Some((_, n)) => *n += 1,
                }
                if matches!(e, DbError::Poisoned(_)) {
                    return;
                }
                delay = backoff.next_delay();
            }
        }
        prune(&db, &acks, &mut pruned);
    }
    let tick = trigger.begin();
    if let Some((back, result)) = run_blocking(db, |d| d.final_sync()).await {
        match result {
            Ok(_) => trigger.done(tick),
            Err(e) => {
                tracing::error!(error = %e, "final sync failed; the next start resumes from the WAL")
            }
        }
        // Dropping the Db closes the position channel: upload tasks drain and return.
        drop(back);
    }
}

/// Moves the Db to the blocking pool for `f` and back.
async fn run_blocking<T: Send + 'static>(
    mut db: Db,
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
            None
        }
    }
}

fn prune(db: &Db, acks: &[watch::Receiver<TxId>], pruned: &mut TxId) {
    let Some(min) = acks.iter().map(|a| *a.borrow()).min() else {
        return;
    };
    if min > *pruned {
        match db.prune_staging(min) {
            Ok(_) => *pruned = min,
            Err(e) => tracing::warn!(error = %e, "pruning staging failed"),
        }
    }
}

fn jitter(interval: Duration) -> Duration {
    let nanos = interval.as_nanos().max(1) as u64;
    Duration::from_nanos(rand::rng().random_range(0..nanos))
}
