//! Starting one database: its local claim, every replica's lease, staging, the replica
//! listings, then its monitor and upload tasks (see the module doc of [`super`]).
//!
//! Order: the claim, then every lease, before anything local or remote is touched, so that a
//! second daemon for the database never cleans up the first one's staging or build files.
//! The local file work (claim, staging, leftovers) runs off the runtime's threads.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::monitor::monitor;
use super::{DbClaim, DbHandle, StoreCore, StoreError, SyncTrigger};
use super::{STARTUP_LEASE_ATTEMPTS, STARTUP_LIST_ATTEMPTS};
use crate::config::DbConfig;
use crate::ltx::TxId;
use crate::replicate::counters::{ReplicaCounters, ReplicaMetrics};
use crate::replicate::db::{Db, RemoteTip};
use crate::replicate::health::stopped_on_panic;
use crate::replicate::lease::Lease;
use crate::replicate::maintenance::Maintenance;
use crate::replicate::maintenance::schedule::RetentionPolicy;
use crate::replicate::replica::Replica;
use crate::replicate::staging::{Staging, StagingLock};
use crate::storage::AnyClient;

impl StoreCore {
    /// Starts `dbc` in the order of the module doc; on failure, hands back the leases it took.
    pub(super) async fn start_db(
        &self,
        dbc: &DbConfig,
        token: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<DbHandle, StoreError> {
        let core = &*self.inner;
        let db_label = dbc.path.display().to_string();
        // Until it has started, a start that fails or is dropped takes its replica series
        // out of /metrics: the stand-in that reports it has no replicas.
        let mut series = ReplicaSeries {
            metrics: &core.counters,
            db: &db_label,
            dbc,
            started: false,
        };
        let meta = dbc
            .meta_path
            .clone()
            .unwrap_or_else(|| crate::replicate::db::default_meta_path(&dbc.path));
        // The clients first: a configuration error is told at once (exit 2), also when the
        // database's file system hangs below.
        let mut clients = Vec::with_capacity(dbc.replicas.len());
        for rc in &dbc.replicas {
            let client = match rc.client_in(&core.s3_clients) {
                Ok(c) => c,
                Err(e) => return Err(StoreError::Config(e)),
            };
            let client = match &core.wrap {
                Some(w) => w(&db_label, &rc.name, client),
                None => client,
            };
            // Every replica sees both plain and `.age` names, so a switch is never silent.
            clients.push(client.with_age(rc.age.clone().unwrap_or_default()));
        }
        // One daemon per database: a second one would share (and clean) this staging. The
        // start's first touch of the database's file system, off the runtime's threads: a hung
        // mount holds up this start alone (and `Store::open` goes on without it).
        let claimed = off_runtime({
            let (db, meta) = (dbc.path.clone(), meta.clone());
            move || {
                crate::util::test_gate::wait_at_test_gate(&db);
                match crate::util::fsutil::parent_dir(&db).is_dir() {
                    true => StagingLock::acquire(&meta).map(Some),
                    false => Ok(None),
                }
            }
        })
        .await;
        let db = dbc.path.clone();
        let claimed = match claimed {
            Ok(Ok(Some(lock))) => lock,
            Ok(Ok(None)) => {
                let dir = crate::util::fsutil::parent_dir(&db).to_path_buf();
                return Err(StoreError::MissingDir { db, dir });
            }
            Ok(Err(source)) => return Err(StoreError::Claimed { db, source }),
            Err(source) => {
                let (op, path) = ("claim", meta.join("lock"));
                return Err(StoreError::Io { op, path, source });
            }
        };
        let lock = Arc::new(DbClaim {
            lock: claimed,
            _counted: core.awake.count_claim(),
        });
        // Every replica's lease comes first, before anything local or remote is touched: a
        // second daemon for this database must not clean up the first one's staging or
        // build files, and what is listed below is then ours alone to extend.
        // (config, client, counters, lease, why it is deferred: unreachable at start).
        let mut leased: Vec<(_, AnyClient, _, Lease, Option<String>)> =
            Vec::with_capacity(dbc.replicas.len());
        for (rc, client) in dbc.replicas.iter().zip(clients) {
            let verifies = !dbc.settings.verify_interval.is_zero();
            let counters = core.counters.replica(&db_label, &rc.name, verifies);
            let mut lease = Lease::new(client.clone(), &db_label, dbc.settings.lease_ttl)
                .succeeding(lock.lock.predecessor());
            let _permit = core
                .permits
                .acquire()
                .await
                .map_err(|_| StoreError::ShuttingDown)?;
            let deferred = match lease
                .acquire_with_retries(&counters, STARTUP_LEASE_ATTEMPTS)
                .await
            {
                Ok(()) => None,
                // Another host's lease to watch for its TTL, or unreachable for now: the
                // others go ahead; this one connects in the background.
                Err(e @ crate::replicate::lease::LeaseError::Expired { .. }) => {
                    Some(format!("waiting to take its lease over: {e}"))
                }
                Err(e) if e.is_retryable() => Some(format!("unreachable since start: {e}")),
                Err(e) => {
                    // Hand back what this database already took: the other instance may need
                    // those replicas too.
                    release_all(leased.into_iter().map(|(_, _, c, l, _)| (c, l))).await;
                    return Err(StoreError::Lease {
                        replica: rc.name.clone(),
                        db: dbc.path.clone(),
                        source: e,
                    });
                }
            };
            leased.push((rc, client, counters, lease, deferred));
        }
        let staging_dir = meta.join("ltx").join("0");
        let opened = off_runtime({
            let (db, meta) = (dbc.path.clone(), meta.clone());
            move || open_local(&db, &meta)
        })
        .await
        .and_then(|opened| opened);
        let (staging, network_fs) = match opened {
            Ok(s) => s,
            Err(e) => {
                release_all(leased.into_iter().map(|(_, _, c, l, _)| (c, l))).await;
                return Err(StoreError::Io {
                    op: "open staging",
                    path: staging_dir,
                    source: e,
                });
            }
        };
        let mut replicas: Vec<Replica> = Vec::new();
        let mut tip = RemoteTip::default();
        let mut leased = leased.into_iter();
        while let Some((rc, client, counters, lease, deferred)) = leased.next() {
            let mut r = Replica::new(
                rc.name.clone(),
                db_label.clone(),
                client,
                staging.clone(),
                dbc.settings.heartbeat_interval,
                counters,
                maintenance_of(&dbc.settings, meta.join("tmp").join(&rc.name), &core.turns),
                lease,
            );
            if let Some(why) = deferred {
                replicas.push(r.deferred(why));
                continue;
            }
            let _permit = core
                .permits
                .acquire()
                .await
                .map_err(|_| StoreError::ShuttingDown)?;
            match r.init_with(STARTUP_LIST_ATTEMPTS).await {
                Err(e) if e.is_retryable() => {
                    replicas.push(r.deferred(format!("unreachable since start: {e}")));
                    continue;
                }
                Ok(t) => {
                    let forced = tip.full_reason.or(t.full_reason);
                    if t.txid > tip.txid {
                        tip = t;
                    }
                    tip.full_reason = forced;
                }
                Err(e) => {
                    drop(_permit);
                    let rest = leased.map(|(_, _, c, l, _)| (c, l));
                    release_all(rest.chain(replicas.into_iter().map(Replica::into_lease))).await;
                    r.release_lease().await;
                    return Err(StoreError::List {
                        replica: rc.name.clone(),
                        db: dbc.path.clone(),
                        source: e,
                    });
                }
            }
            replicas.push(r);
        }
        let settings = codec_for(dbc, &mut replicas);
        let mut db = Db::new(dbc.path.clone(), Some(meta), settings, tip);
        db.set_network_fs(network_fs);
        db.share_awake_budget(core.awake.clone());
        db.share_phases(core.phases.clone());
        let seeds = db.take_seed_requests();
        let replicas: Vec<Replica> = replicas
            .into_iter()
            .map(|r| r.with_seeds(db.seed_requests()))
            .collect();
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
            unstarted: false,
        };
        let acks: Vec<watch::Receiver<TxId>> = replicas.iter().map(Replica::acks).collect();
        for (r, (_, stats)) in replicas.into_iter().zip(&handle.replicas) {
            let span =
                tracing::info_span!("replica", db = %dbc.path.display(), replica = %r.name());
            let rx = db.subscribe();
            let feed = (r.streams_segments() && crate::storage::feed::supported())
                .then(|| db.segment_feed());
            let abort = core.root.clone();
            let held = lock.clone();
            let run = async move {
                r.run(rx, feed, abort).await;
                drop(held);
            };
            let run = stopped_on_panic(run, stats.health.clone(), "upload");
            let fut = tracing::Instrument::instrument(run, span);
            core.tracker.spawn(tasks.track_future(fut));
        }
        let span = tracing::info_span!("db", db = %dbc.path.display());
        let monitor = monitor(
            db,
            seeds,
            lock,
            acks,
            token.clone(),
            core.permits.clone(),
            dbc.settings.monitor_interval,
            trigger,
            (!dbc.settings.dormant_after.is_zero())
                .then(|| self.dormant_watch(dbc.settings.monitor_interval))
                .flatten(),
            (
                Some(core.wal_watcher.clone()),
                dbc.settings.min_sync_interval,
            ),
        );
        let monitor = stopped_on_panic(monitor, handle.stats.clone(), "monitor");
        let fut = tracing::Instrument::instrument(monitor, span);
        core.tracker.spawn(tasks.track_future(fut));
        series.started = true;
        Ok(handle)
    }
}

/// The replica series of a database whose start is under way: removed when it does not end
/// started (a stale operation count or TXID would describe a replica nothing writes).
struct ReplicaSeries<'a> {
    metrics: &'a ReplicaMetrics,
    db: &'a str,
    dbc: &'a DbConfig,
    started: bool,
}

impl Drop for ReplicaSeries<'_> {
    fn drop(&mut self) {
        if !self.started {
            for rc in &self.dbc.replicas {
                self.metrics.forget_replica(self.db, &rc.name);
            }
        }
    }
}

/// Runs `work` (local file work: opens, locks, fsyncs) on the blocking pool; an error when
/// it panicked.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)
}

/// Opens the database's staging and drops what a previous run left half-made: seed
/// snapshots (never uploaded whole, rebuilt on demand) and the replicas' build directories
/// (partial outputs of a crashed compaction, never uploaded), those of replicas no longer
/// configured too. The database's claim is held, so no other run builds there. Also tells
/// whether the database is on a network file system.
fn open_local(db: &Path, meta: &Path) -> std::io::Result<(Staging, bool)> {
    let staging = Staging::open(meta.join("ltx").join("0"))?;
    let _ = std::fs::remove_dir_all(meta.join("seed"));
    // Directories only: anything else there is not ours to remove.
    for entry in std::fs::read_dir(meta.join("tmp")).into_iter().flatten() {
        let Ok(entry) = entry else { continue };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let network_fs = crate::util::fsutil::on_network_fs(crate::util::fsutil::parent_dir(db));
    Ok((staging, network_fs))
}

/// Releases leases taken by a start that failed: the next start (or another host) must not
/// wait out their TTL.
async fn release_all(leases: impl Iterator<Item = (ReplicaCounters, Lease)>) {
    for (counters, mut lease) in leases {
        lease.release(&counters).await;
    }
}

/// The database's settings with its codec decided: a database whose codec was not chosen
/// explicitly keeps writing `lz4` to a replica that holds Litestream-readable files, so that
/// Litestream can still restore it; an explicit codec Litestream cannot read on such a replica
/// is kept, with one warning.
fn codec_for(dbc: &DbConfig, replicas: &mut [Replica]) -> crate::config::DbSettings {
    use crate::config::CodecOrigin;
    use crate::ltx::Codec;
    let mut settings = dbc.settings.clone();
    let readable: Vec<&str> = replicas
        .iter()
        .filter(|r| r.remote_codec() == Some(Codec::Lz4))
        .map(Replica::name)
        .collect();
    if readable.is_empty() || settings.compression == Codec::Lz4 {
        return settings;
    }
    let names = readable.join(", ");
    match dbc.codec {
        CodecOrigin::Set => tracing::warn!(
            db = %dbc.path.display(),
            replicas = %names,
            compression = settings.compression.name(),
            "the replica holds files Litestream can restore, but `compression` is not lz4: \
             Litestream cannot restore the files written from now on (set `compression: lz4` \
             to keep it able to)"
        ),
        CodecOrigin::Default | CodecOrigin::LitestreamFile => {
            tracing::info!(
                db = %dbc.path.display(),
                replicas = %names,
                "the replica holds files Litestream can restore: writing lz4 so that it still \
                 can (set `compression` to choose another codec)"
            );
            settings.compression = Codec::Lz4;
            for r in replicas.iter_mut() {
                r.set_output_codec(Codec::Lz4);
            }
        }
    }
    settings
}

/// A replica's maintenance settings (its build directory emptied by [`open_local`]).
fn maintenance_of(
    s: &crate::config::DbSettings,
    tmp_dir: std::path::PathBuf,
    turns: &crate::replicate::maintenance::Turns,
) -> Maintenance {
    Maintenance {
        levels: s.levels.clone(),
        snapshot_interval: s.snapshot_interval,
        retention: RetentionPolicy {
            snapshot_retention: s.snapshot_retention,
            l0_retention: s.l0_retention,
            calendar: s.calendar,
        },
        retention_check: s.l0_retention_check_interval,
        retention_enabled: s.retention_enabled,
        codec: s.compression,
        tmp_dir,
        verify_interval: s.verify_interval,
        verify_recheck: s.verify_recheck_interval,
        replica_check: s.replica_check_interval,
        turns: turns.clone(),
    }
}
