//! The current set of replicated databases, as the outside world sees it.
//!
//! Databases come and go at run time ([`crate::discovery`]); the HTTP endpoints, the metrics
//! collector, the control socket and the systemd notifier read this registry at each use
//! instead of a list taken at start.
//!
//! Invariants:
//! - Readers get an immutable snapshot (`Arc<Vec<DbHandle>>`): the lock is held only to clone
//!   an `Arc` or to swap in a new list, never across an `.await` or any I/O.
//! - Only the Store changes the set ([`crate::store`]); a path appears at most once.

use std::path::Path;
use std::sync::{Arc, RwLock};

use crate::store::DbHandle;

/// The shared, current list of databases (cheap to clone).
#[derive(Clone, Default)]
pub struct DbRegistry {
    inner: Arc<RwLock<Arc<Vec<DbHandle>>>>,
}

impl DbRegistry {
    /// The databases now, in the order they were added.
    pub fn snapshot(&self) -> Arc<Vec<DbHandle>> {
        // A poisoned lock still holds a consistent list: writers only swap whole `Arc`s.
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether `path` is in the set.
    pub fn contains(&self, path: &Path) -> bool {
        self.snapshot().iter().any(|d| d.path == path)
    }

    /// Adds `db`; false (and nothing changed) when its path is already there.
    pub(crate) fn insert(&self, db: DbHandle) -> bool {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if guard.iter().any(|d| d.path == db.path) {
            return false;
        }
        let mut next = Vec::with_capacity(guard.len() + 1);
        next.extend(guard.iter().cloned());
        next.push(db);
        *guard = Arc::new(next);
        true
    }

    /// Removes the database at `path`, returning it.
    pub(crate) fn remove(&self, path: &Path) -> Option<DbHandle> {
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let i = guard.iter().position(|d| d.path == path)?;
        let mut next: Vec<DbHandle> = guard.iter().cloned().collect();
        let removed = next.remove(i);
        *guard = Arc::new(next);
        Some(removed)
    }
}
