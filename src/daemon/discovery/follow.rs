//! The follow task of a watched directory: inotify events and the periodic rescan, until the
//! Store stops ingesting. It keeps the parent module's invariants (an event only names a path
//! to look at again; a look runs on the blocking pool and never holds up the stop).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use notify::{INotifyWatcher, Watcher};
use tokio::sync::mpsc;

use super::late::Pending;
use super::{Discovery, RESCAN_INTERVAL, SETTLE, Signal, Start, Watches, gone, stopped};
use crate::daemon::{Removal, StoreCore};
use crate::replicate::db::is_held;

/// The task of a watched directory: inotify events and the periodic rescan, until the Store
/// stops ingesting.
pub(super) async fn follow(
    me: Arc<Discovery>,
    core: StoreCore,
    mut tracked: HashSet<PathBuf>,
    mut failed: HashSet<PathBuf>,
    mut pending: Pending,
) {
    let stop = core.ingest().clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<Signal>();
    let filter = me.clone();
    let handler = move |res: notify::Result<notify::Event>| {
        for s in filter.signals(res) {
            let _ = tx.send(s);
        }
    };
    let watcher = match INotifyWatcher::new(handler, notify::Config::default()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::error!(dir = %me.cfg.dir.display(), error = %e,
                "cannot start inotify; only the periodic rescan finds new databases");
            None
        }
    };
    let events = watcher.is_some();
    let mut st = Some(Watches {
        watcher,
        watched: HashSet::new(),
    });
    // The first pass is a full rescan: it puts the watches in place, then catches what was
    // created since the start-up scan.
    let mut full = true;
    let mut first = true;
    let mut paths = HashSet::new();
    let mut next_rescan = tokio::time::Instant::now();
    loop {
        if full {
            next_rescan = tokio::time::Instant::now() + RESCAN_INTERVAL;
        }
        // The first rescan leaves the databases whose start just failed to the next one: it
        // comes at once, and a retry then would only log the same failure again.
        let known = match first {
            true => tracked.union(&failed).cloned().collect(),
            false => tracked.clone(),
        };
        first = false;
        let (Some(mut watches), d) = (st.take(), me.clone()) else {
            return;
        };
        let batch = std::mem::take(&mut paths);
        let unstarted = failed.clone();
        let look = tokio::task::spawn_blocking(move || {
            // Databases open here, ours or another entry's, whose header is not read again.
            let held = |p: &std::path::Path| known.contains(p) || is_held(p);
            let c = if full {
                d.rescan(&mut watches, &known, &held)
            } else {
                d.look(&mut watches, &batch, &known, &held)
            };
            let unstarted_gone: Vec<PathBuf> = unstarted.into_iter().filter(|p| gone(p)).collect();
            (watches, c, unstarted_gone)
        });
        // A look that hangs (the mount stopped answering) must not hold up the stop.
        let looked = tokio::select! {
            looked = look => looked,
            _ = stop.cancelled() => return,
        };
        let (changes, unstarted_gone) = match looked {
            Ok((w, c, g)) => {
                st = Some(w);
                (c, g)
            }
            Err(e) => {
                stopped(&core, &me.cfg.dir, &format!("it panicked: {e}"));
                return;
            }
        };
        for path in changes.removed {
            pending.forget(&path);
            if !tracked.remove(&path) {
                continue;
            }
            match core.remove(&path).await {
                Removal::Stopping => tracing::info!(db = %path.display(),
                    "database removed: stopping its replication (final sync, staged files are uploaded)"),
                Removal::StartCancelled => tracing::info!(db = %path.display(),
                    "database removed while it started: its start is cancelled"),
                Removal::Nothing => {}
            }
        }
        // A database that never started and is gone is no longer reported.
        for path in unstarted_gone {
            failed.remove(&path);
            core.remove(&path).await;
        }
        for path in changes.added {
            if stop.is_cancelled() {
                break;
            }
            pending.forget(&path);
            match me.add(&core, &path).await {
                Ok(Start::Started) => {
                    failed.remove(&path);
                    tracked.insert(path);
                }
                Ok(Start::Late(late)) => {
                    failed.remove(&path);
                    pending.push(path.clone(), late);
                    tracked.insert(path);
                }
                Ok(Start::Skipped) => {
                    failed.remove(&path);
                }
                Err(e) => {
                    me.unstarted(&core, &path, &e);
                    failed.insert(path);
                }
            }
        }
        full = false;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next_rescan) => full = true,
            // A start left to the background failed: reported, and retried as any failed start
            // (not tracked, it is found again by the next look at it or rescan).
            Some((path, e)) = pending.failure(), if !pending.is_empty() => {
                if tracked.remove(&path) {
                    me.unstarted(&core, &path, &e);
                    failed.insert(path);
                }
            }
            s = rx.recv(), if events => {
                tokio::time::sleep(SETTLE).await;
                let mut next = s;
                while let Some(sig) = next {
                    match sig {
                        Signal::Path(p) => {
                            paths.insert(p);
                        }
                        Signal::Rescan => full = true,
                    }
                    next = rx.try_recv().ok();
                }
            }
        }
    }
}
