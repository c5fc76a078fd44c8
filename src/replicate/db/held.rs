//! The database files this process holds open through SQLite, by (device, inode).
//!
//! Invariant: POSIX locks belong to a process and a file, so closing *any* descriptor of one
//! of these files in this process drops SQLite's locks on it (its SHARED lock: the
//! application's last connection could then checkpoint past our read mark and delete the
//! WAL). Code that opens a database file outside SQLite (discovery's header read) asks
//! [`is_held`] first. Only [`super::Db`]'s connection changes register here; a file is told
//! by identity, whatever path names it (symlinks, `..`, another entry's spelling).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;

/// Open connections per (device, inode).
static HELD: Mutex<BTreeMap<(u64, u64), usize>> = Mutex::new(BTreeMap::new());

fn held() -> std::sync::MutexGuard<'static, BTreeMap<(u64, u64), usize>> {
    // The map stays consistent whatever panicked while it was held (one insert or remove).
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection to the file `id` opened.
pub(super) fn hold(id: (u64, u64)) {
    *held().entry(id).or_default() += 1;
}

/// A connection to the file `id` closed.
pub(super) fn release(id: (u64, u64)) {
    let mut held = held();
    if let Some(n) = held.get_mut(&id) {
        *n -= 1;
        if *n == 0 {
            held.remove(&id);
        }
    }
}

/// Whether the file at `path` (followed through symlinks: one `stat`, no descriptor) is a
/// database this process has open.
pub fn is_held(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| held().contains_key(&(m.dev(), m.ino())))
}
