//! Process-wide allocator settings (glibc), so that freed memory goes back to the system.
//!
//! By default glibc keeps up to 8 arenas per core and raises its mmap threshold to the size
//! of the largest buffer freed (up to 32 MiB): after one snapshot or compaction, the
//! blocking threads' multi-megabyte buffers (upload parts, page batches, LTX page indexes)
//! come from arenas that keep their pages. Measured on a 10 GiB database: peak RSS through
//! the first compaction 137 MiB by default, 106 MiB with these settings
//! (`docs/benchmarks.md`, "A 10 GiB database").

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
