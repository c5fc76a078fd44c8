//! An idle tick allocates nothing: 1,000 ticks of [`Db::fast_path_skip`] on a database whose
//! WAL holds committed frames, and on one whose WAL is empty, under an allocator that counts
//! the allocations of this thread. (Its own test binary: the counting allocator is global.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use replicad::config::DbSettings;
use replicad::replicate::db::{Db, RemoteTip};

struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    COUNTING.with(|c| c.set(true));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let out = f();
    let n = ALLOCATIONS.load(Ordering::Relaxed) - before;
    COUNTING.with(|c| c.set(false));
    (out, n)
}

#[test]
fn idle_ticks_allocate_nothing() {
    let settings = DbSettings {
        checkpoint_interval: Duration::from_secs(3600),
        full_verify_interval: Duration::from_secs(3600),
        ..DbSettings::default()
    };
    for truncate in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idle.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(500));",
        )
        .unwrap();
        if truncate {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .unwrap();
        }
        let mut db = Db::new(path, None, settings.clone(), RemoteTip::default());
        db.sync(false).unwrap();

        // The counter sees this thread's allocations: prove it before trusting a zero.
        let (_, n) = counted(|| std::hint::black_box(vec![0u8; 64]));
        assert_eq!(n, 1, "the counting allocator counts");

        let (skipped, n) = counted(|| {
            (0..1000)
                .filter(|_| db.fast_path_skip(Instant::now()))
                .count()
        });
        assert_eq!(
            skipped, 1000,
            "every idle tick takes the fast path (empty WAL: {truncate})"
        );
        assert_eq!(
            n, 0,
            "heap allocations in 1000 idle ticks (empty WAL: {truncate})"
        );

        // A commit makes the next tick leave the fast path.
        conn.execute("INSERT INTO t VALUES (1)", []).unwrap();
        assert!(!db.fast_path_skip(Instant::now()), "a commit is noticed");
    }
}
