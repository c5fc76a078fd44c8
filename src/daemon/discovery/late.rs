//! The starts of discovered databases that went on in the background
//! ([`StoreCore::add_patiently`](crate::daemon::StoreCore)): how each ends, for the follow
//! task to retry a failure as it retries any failed start (an unwatched directory's task
//! reports it with its cause, without a retry).
//!
//! Invariant: only the outcome of a path's newest background start counts. A path deleted,
//! created again and started again meanwhile has a newer start (or none in the background);
//! the older start's outcome says nothing about it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};

use crate::daemon::{Added, StoreError};

/// How a start left to the background ended (a closed channel: the Store stopped first).
pub(super) type Late = tokio::sync::oneshot::Receiver<Result<Added, StoreError>>;

/// The background starts still awaited.
#[derive(Default)]
pub(super) struct Pending {
    /// Each start's path, its number, and its error if it failed.
    ends: FuturesUnordered<BoxFuture<'static, (PathBuf, u64, Option<StoreError>)>>,
    /// The number of each path's newest background start.
    newest: HashMap<PathBuf, u64>,
    numbered: u64,
}

impl Pending {
    /// Awaits `late`, the background start of `path`, in place of any earlier one.
    pub(super) fn push(&mut self, path: PathBuf, late: Late) {
        self.numbered += 1;
        let n = self.numbered;
        self.newest.insert(path.clone(), n);
        self.ends.push(
            async move {
                let failed = match late.await {
                    Ok(Err(e)) => Some(e),
                    // Started, removed meanwhile, or the Store stopped.
                    Ok(Ok(_)) | Err(_) => None,
                };
                (path, n, failed)
            }
            .boxed(),
        );
    }

    /// Forgets the background start of `path`: the path was removed, or started anew.
    pub(super) fn forget(&mut self, path: &Path) {
        self.newest.remove(path);
    }

    /// Whether no start is awaited.
    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The next failure of a path's newest background start; None once none is awaited.
    pub(super) async fn failure(&mut self) -> Option<(PathBuf, StoreError)> {
        loop {
            let (path, n, failed) = self.ends.next().await?;
            if self.newest.get(&path) != Some(&n) {
                continue;
            }
            self.newest.remove(&path);
            if let Some(e) = failed {
                return Some((path, e));
            }
        }
    }
}
