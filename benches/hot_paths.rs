//! The daemon's hot paths outside the codec (see `ltx_codec` for encode/decode/restore):
//!
//! - `idle_tick/<wal>`: one idle tick of the monitor, [`Db::fast_path_skip`]: open + fstat +
//!   32-byte read of the WAL header + close, for a database whose WAL holds committed frames
//!   (`wal=frames`) and one whose WAL is empty (`wal=empty`: open + fstat + close). Before
//!   the timing, 10,000 ticks run under a counting allocator and the allocations per tick are
//!   printed (`tests/idle_alloc.rs` asserts the same number is zero).
//! - `wal_scan/frames=<n>`: [`wal::scan`] of a WAL of `n` committed 4 KiB frames (the work of
//!   a sync after writes: validate every frame's checksum chain and index the pages).
//!
//! Run: `cargo bench --bench hot_paths` (about a minute).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fs::File;
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use replicad::config::DbSettings;
use replicad::replicate::db::{Db, RemoteTip};
use replicad::sqlite::wal;

/// Counts allocations made by the thread that set `COUNTING`.
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

fn settings() -> DbSettings {
    DbSettings {
        // Nothing time-based may interrupt the idle path during a run.
        checkpoint_interval: Duration::from_secs(3600),
        full_verify_interval: Duration::from_secs(3600),
        ..DbSettings::default()
    }
}

/// A WAL-mode database with `rows` committed rows; the returned connection keeps the WAL
/// (closing the last connection would checkpoint and delete it).
fn database(dir: &Path, rows: usize, blob: usize) -> (std::path::PathBuf, rusqlite::Connection) {
    let path = dir.join("bench.db");
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0; CREATE TABLE t(x BLOB);",
    )
    .expect("schema");
    for i in 0..rows {
        conn.execute(
            "INSERT INTO t VALUES (randomblob(?1))",
            [blob as i64 + (i % 7) as i64],
        )
        .expect("insert");
    }
    (path, conn)
}

fn idle_tick(c: &mut Criterion) {
    let mut g = c.benchmark_group("idle_tick");
    for (label, truncate) in [("wal=frames", false), ("wal=empty", true)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, conn) = database(dir.path(), 20, 100);
        if truncate {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
                .expect("checkpoint");
        }
        let mut db = Db::new(path, None, settings(), RemoteTip::default());
        db.sync(false).expect("first sync");
        assert!(
            db.fast_path_skip(Instant::now()),
            "{label}: idle tick not skipped"
        );
        COUNTING.with(|c| c.set(true));
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for _ in 0..10_000 {
            black_box(db.fast_path_skip(Instant::now()));
        }
        let allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
        COUNTING.with(|c| c.set(false));
        println!(
            "idle_tick/{label}: {:.3} heap allocations per tick (10,000 ticks)",
            allocs as f64 / 10_000.0
        );
        g.bench_function(label, |b| {
            b.iter(|| black_box(db.fast_path_skip(Instant::now())))
        });
        drop(conn);
    }
    g.finish();
}

fn wal_scan(c: &mut Criterion) {
    let mut g = c.benchmark_group("wal_scan");
    for rows in [250usize, 4000] {
        let dir = tempfile::tempdir().expect("tempdir");
        // One ~3.5 KiB row per page: about one WAL frame per row.
        let (path, conn) = database(dir.path(), rows, 3500);
        let mut wal_path = path.into_os_string();
        wal_path.push("-wal");
        let file = File::open(&wal_path).expect("wal");
        let len = file.metadata().expect("stat").len();
        let frames = (len - 32) / (24 + 4096);
        g.throughput(Throughput::Bytes(len));
        g.bench_function(format!("frames={frames}"), |b| {
            b.iter(|| {
                let s = wal::scan(&file, 32, u64::MAX).expect("scan");
                black_box(s.map(|s| s.end_offset))
            })
        });
        drop(conn);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = idle_tick, wal_scan
}
criterion_main!(benches);
