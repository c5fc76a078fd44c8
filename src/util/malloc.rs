//! Process-wide allocator settings (glibc), so that freed memory goes back to the system.
//!
//! By default glibc keeps up to 8 arenas per core and raises its mmap threshold to the size
//! of the largest buffer freed (up to 32 MiB): after one snapshot or compaction, the
//! blocking threads' multi-megabyte buffers (upload parts, page batches, LTX page indexes)
//! come from arenas that keep their pages. Measured on a 10 GiB database: peak RSS through
//! the first compaction 137 MiB by default, 106 MiB with these settings
//! (`docs/benchmarks.md`, "A 10 GiB database").
//!
//! glibc also keeps the free pages inside its heaps until `malloc_trim`: after a burst of
//! work (the first sync of 400 databases, a database going dormant, a finished compaction)
//! the daemon [`trim_periodically`] hands them back, at most once per [`TRIM_EVERY`] and only
//! when something was freed since the last time ([`note_freed`]). Measured on the idle
//! benchmark's 400-database process: 55.7 MiB RSS before a trim, 51.7 after.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Set when memory was probably freed in bulk since the last trim.
static FREED: AtomicBool = AtomicBool::new(false);

/// How often freed heap pages are handed back, at most.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Notes that memory was probably freed in bulk (a sync, a database gone dormant, a finished
/// maintenance job): the next [`trim_periodically`] round trims.
pub fn note_freed() {
    FREED.store(true, Ordering::Relaxed);
}

/// Every [`TRIM_EVERY`] until `stop`: hands the heaps' free pages back to the system, when
/// something was freed since the last round (an idle process does nothing but wake).
pub async fn trim_periodically(stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(TRIM_EVERY) => {}
        }
        if FREED.swap(false, Ordering::Relaxed) {
            // A walk of the heaps: off the reactor.
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    }
}

/// Hands the free pages of every heap back to the system.
#[allow(unsafe_code)]
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; safe from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Buffers of this size or more are mapped on their own and unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: std::ffi::c_int = 1 << 20;

/// At most this many malloc arenas: the work is a few blocking threads at a time.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: std::ffi::c_int = 2;

/// Sets the allocator up. Call once, first thing in `main`, before any other thread exists.
/// A user's own setting wins: `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`, or any
/// `glibc.malloc` tunable in `GLIBC_TUNABLES` (then replicad sets nothing).
#[allow(unsafe_code)]
pub fn configure_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var_os("GLIBC_TUNABLES")
            .is_some_and(|t| t.to_string_lossy().contains("glibc.malloc"));
        if tunables {
            return;
        }
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only changes allocator tunables; called before other threads.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        }
    }
}
