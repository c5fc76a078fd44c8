//! One replicated database: the SQLite side.
//!
//! A `Db` holds a connection with a long-running read transaction (so no other connection can
//! restart the WAL over frames not yet copied), reads committed WAL frames, cuts one level-0
//! segment per sync into [`Staging`], and checkpoints the WAL itself.
//!
//! Invariants:
//! 1. Positions advance by one TXID per segment, without gaps. When continuity with the last
//!    segment cannot be proven (WAL restarted or truncated behind our back, position lost),
//!    the next segment is a *full* copy of the database at the next TXID, so the chain never
//!    breaks.
//! 2. A frame is never checkpointed before it is durable in a staged segment: a checkpoint
//!    either runs under SQLite's write lock (no commit can land) after a sealing sync, or
//!    runs without it but stops at our read mark, which moves only under that lock, right
//!    after a seal (SQLite backfills no frame past a live reader's mark).
//! 3. While the process runs, the read transaction is held at all times except inside that
//!    write-locked window, so the WAL generation changes only when we allow it. (Begun on a
//!    completely checkpointed WAL it reads the database file alone, SQLite's read mark 0:
//!    the next write may then restart the WAL once, but no frame after it can be checkpointed
//!    while we read, so not twice.)
//! 4. Segments carry real pre/post-apply database checksums when the codec is not
//!    Litestream's (`lz4`): the per-page checksum table is kept in memory (8 bytes a page).
//! 5. A failed local write or fsync never builds on what it may have left behind: the Db
//!    forgets its connection, read transaction and WAL mark, and its next sync (paced by the
//!    monitor's backoff) reopens the database and writes a *full* segment at the next TXID.
//!    The same happens when the database file is replaced (a new inode at its path). A
//!    position never goes back: the reopened Db continues after the highest TXID it staged.
//! 6. A segment's WAL pages all come from the generation its scan saw: the WAL header's salts
//!    are read again after the pages, and a restart in between drops the segment.
//!
//! The idle fast path compares the WAL's size and salts with what the last sync saw. Our
//! restart write shrinks the WAL to one frame, except under a busy writer: then the WAL is
//! reused in place (`Db::checkpoint` says why), and a reader of the application can also keep
//! a restart from happening. In such a WAL, longer than our position, the fast path also
//! reads the frame header where our position ends: a commit writes its first frame there with
//! the current salts, a stale tail holds another generation's. After our own restart in
//! place, the first quiet tick once the writer (and any reader holding it) is gone shrinks
//! the file.
//!
//! Dormancy (`dormant-after`, `dormant-max-size`): a small database whose WAL has not changed
//! for a while closes its connection, so an idle database costs no descriptor, no shared-memory
//! mapping and no SQLite memory. It is caught up when it goes dormant, and it records the
//! database file's stat (size, mtime, ctime, inode), taken only when the file's mtime is older
//! than the coarse clock's granularity, so that any later write changes it. Without the read
//! transaction the application may checkpoint and restart the WAL, so on waking:
//! - WAL salts unchanged: no restart happened, every frame past the mark is new (as at start);
//! - the database file unchanged: nothing was checkpointed, so no frame was lost; the whole
//!   current WAL (one restart at most, since a second needs a checkpoint) is new;
//! - otherwise frames may have been checkpointed and overwritten: a full segment keeps the
//!   chain unbroken (invariant 1). That is the price the size cap bounds.
//!
//! While dormant the idle check compares stats instead of salts: the WAL's (size, mtime, ctime,
//! inode; one `statx`) when there was one at dormancy, else the database file's (a failed
//! `statx` + one more), since an application closing its last connection checkpoints and
//! deletes the WAL, and a TRUNCATE checkpoint empties it; any of that changes a stamp. The
//! monitor of a dormant database hands that check ([`DormantProbe`]) to
//! [`crate::replicate::dormant`], which runs it for every parked database of a tick slot at once.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::watch;

use crate::config::DbSettings;
use crate::ltx::checksum::{DbChecksum, page_checksum};
use crate::ltx::{
    self, CHECKSUM_FLAG, Codec, Encoder, HEADER_FLAG_NO_CHECKSUM, Header, TxId, lock_pgno,
};
use crate::replicate::staging::Staging;
use crate::sqlite::wal::{self, WAL_HEADER_SIZE, WalError, WalHeader};
use crate::storage::feed::{GrowingSegment, SegmentFeed, Tap};
use crate::util::fsutil;
use crate::util::phase::{PHASES, Phase, duration_nanos};

mod seed;
pub use seed::{SeedRequest, SeedRequests, SeedSnapshot};

/// Most WAL bytes one segment covers; a larger backlog is cut into several segments.
pub const MAX_SYNC_WAL_BYTES: u64 = 64 * 1024 * 1024;

/// The position a Db publishes after each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DbPos {
    /// Last TXID staged locally (0: none yet).
    pub txid: TxId,
    /// Header timestamp of that segment, ms since the epoch.
    pub timestamp_ms: i64,
}

/// Counters of one Db (exported as metrics).
#[derive(Debug, Default)]
pub struct DbStats {
    /// Sync attempts that did real work (the full path).
    pub syncs: AtomicU64,
    /// Ticks answered by the idle fast path.
    pub sync_skipped: AtomicU64,
    /// Failed syncs.
    pub sync_errors: AtomicU64,
    /// Segments written.
    pub segments: AtomicU64,
    /// Of which full-database segments.
    pub full_segments: AtomicU64,
    /// Checkpoints run, any mode.
    pub checkpoints: AtomicU64,
    /// Of which TRUNCATE checkpoints (the rest are PASSIVE).
    pub truncate_checkpoints: AtomicU64,
    /// Time checkpoints held SQLite's write lock (the application's commits wait for it, or
    /// for a TRUNCATE checkpoint), nanoseconds.
    pub write_lock_nanos: AtomicU64,
    /// Logical WAL size: end of the last frame copied into a segment.
    pub wal_size: AtomicU64,
    /// Time spent in syncs (full path), nanoseconds.
    pub sync_nanos: AtomicU64,
    /// Bytes of segments in local staging.
    pub staging_bytes: AtomicU64,
    /// 1 while the last tick found nothing new.
    pub idle: AtomicBool,
    /// Current TXID.
    pub txid: AtomicU64,
    /// 1 while the database is dormant (connection closed until its files change).
    pub dormant: AtomicBool,
    /// Times the database woke from dormancy.
    pub wakes: AtomicU64,
    /// Whether the database is protected (the monitor's last sync succeeded), else why not.
    pub health: crate::replicate::health::HealthCell,
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite refused something.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Reading the WAL failed.
    #[error("wal: {0}")]
    Wal(#[from] WalError),
    /// A local file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// Operation.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Encoding a segment failed.
    #[error("segment: {0}")]
    Ltx(#[from] ltx::LtxError),
    /// The database file does not exist (a typo in the path, or not created yet).
    #[error(
        "database file {0} does not exist: nothing is replicated until it is created (check the path)"
    )]
    Missing(PathBuf),
    /// The database is in a state replicad cannot replicate.
    #[error("{0}")]
    Unsupported(String),
    /// The WAL was restarted while pages were read from it: what was read may mix two
    /// generations, so it was dropped (the next sync sees the restart).
    #[error("the WAL was restarted while it was read; dropped what was read")]
    WalRestartedDuringRead,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DbError {
    let path = path.to_path_buf();
    move |source| DbError::Io { op, path, source }
}

/// What the replicas hold at startup, so a lost local position continues after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteTip {
    /// Highest TXID on any replica.
    pub txid: TxId,
    /// That file's post-apply checksum (0 if unknown or absent).
    pub post_apply_checksum: u64,
    /// Why the next segment must be a full one whatever the local state (a replica switched
    /// on or off age encryption: its new chain starts with a snapshot).
    pub full_reason: Option<&'static str>,
    /// That file's page size (0 if unknown): a database with another page size must not
    /// continue this replica's chain.
    pub page_size: u32,
}

/// Where the last segment ended in the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WalMark {
    salt1: u32,
    salt2: u32,
    /// End of the last committed frame copied.
    offset: u64,
}

/// The database file's identity and last change, as stat reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::from_meta(&std::fs::metadata(path)?))
    }

    fn from_meta(m: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            len: m.len(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The last change is older than `margin` (so a write now would get another mtime).
    fn settled(&self, margin: Duration) -> bool {
        let changed = UNIX_EPOCH
            + Duration::new(
                u64::try_from(self.mtime.0.max(self.ctime.0)).unwrap_or(0),
                u32::try_from(self.mtime.1.max(self.ctime.1)).unwrap_or(0),
            );
        SystemTime::now()
            .duration_since(changed)
            .is_ok_and(|age| age >= margin)
    }
}

/// What a dormant database compares on each tick.
#[derive(Debug, Clone, Copy)]
struct Dormant {
    db: FileStamp,
    /// None: there was no WAL file.
    wal: Option<FileStamp>,
}

impl Dormant {
    /// The files are as they were at dormancy: one `statx` of the WAL, or two when there was
    /// none (then the database file's stamp decides).
    fn unchanged(&self, db_path: &Path, wal_path: &Path) -> bool {
        match (FileStamp::of(wal_path), self.wal) {
            (Ok(now), Some(wal)) => now == wal,
            (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => {
                FileStamp::of(db_path).is_ok_and(|now| now == self.db)
            }
            _ => false,
        }
    }
}

/// The idle check of a dormant database, apart from its Db: what
/// [`crate::replicate::dormant`] runs for a parked monitor.
#[derive(Debug)]
pub struct DormantProbe {
    path: PathBuf,
    wal_path: PathBuf,
    stamps: Dormant,
    stats: Arc<DbStats>,
}

impl DormantProbe {
    /// The files are as they were at dormancy; counts a skipped tick when they are.
    pub fn unchanged(&self) -> bool {
        let same = self.stamps.unchanged(&self.path, &self.wal_path);
        if same {
            self.stats.sync_skipped.fetch_add(1, Ordering::Relaxed);
        }
        same
    }
}

/// How old the database file's last change must be before it is stamped for dormancy: well
/// above the kernel's coarse timestamp granularity (one jiffy, 1-10 ms).
const STAMP_MARGIN: Duration = Duration::from_millis(50);

struct Open {
    conn: Connection,
    db_file: File,
    page_size: u32,
    /// (device, inode) of the file opened: another one at the path means it was replaced.
    id: (u64, u64),
}

/// Where a page of a segment comes from.
#[derive(Clone, Copy)]
enum PageSrc {
    Wal(u64),
    DbFile,
}

/// Reads pages of the current state: from a WAL frame or from the database file.
#[derive(Clone, Copy)]
struct PageReader<'a> {
    db_file: &'a File,
    wal_file: Option<&'a File>,
    page_size: u32,
    path: &'a Path,
}

impl PageReader<'_> {
    fn read(&self, src: PageSrc, pgno: u32, buf: &mut [u8]) -> Result<(), DbError> {
        match (src, self.wal_file) {
            (PageSrc::Wal(off), Some(f)) => Ok(wal::read_page(f, off, buf)?),
            _ => {
                let at = u64::from(pgno - 1) * u64::from(self.page_size);
                // Past the end of the file SQLite reads zeros; so do we.
                let mut done = 0;
                while done < buf.len() {
                    match self.db_file.read_at(&mut buf[done..], at + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_err("read", self.path)(e)),
                    }
                }
                buf[done..].fill(0);
                Ok(())
            }
        }
    }
}

/// Databases with an open connection, process-wide (each holds about four descriptors).
static AWAKE: AtomicUsize = AtomicUsize::new(0);
/// Above this many open connections, idle databases go dormant at once instead of after
/// `dormant-after`, so that thousands of databases fit the open-file limit.
static AWAKE_BUDGET: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets the number of databases that may keep a connection open before idle ones go dormant
/// early: `replicate` derives it from its open-file limit.
pub fn set_awake_budget(databases: usize) {
    AWAKE_BUDGET.store(databases, Ordering::Relaxed);
}

/// Pages per batch of the parallel segment encoder.
const BATCH_PAGES: usize = 256;
/// Segments with fewer pages are encoded on the calling thread.
const PARALLEL_MIN_PAGES: usize = 8 * BATCH_PAGES;
/// Full segments of at least this many page bytes are announced on the segment feed while
/// they are written (smaller ones upload in a blink once staged).
const STREAM_MIN_BYTES: u64 = 16 * 1024 * 1024;

/// Pages read, compressed and checksummed by one encoder worker, in segment order. The
/// writer hands each batch back to its worker for the next chunk: a snapshot then touches a
/// few batches' worth of fresh memory instead of a megabyte per 256 pages.
#[derive(Default)]
struct PageBatch {
    data: Vec<u8>,
    comp: Vec<u8>,
    ends: Vec<usize>,
    sums: Vec<u64>,
    read_nanos: u64,
    compress_nanos: u64,
}

/// Fills `b` with the pages of `chunk` (whatever it held before is replaced).
fn encode_batch(
    reader: &PageReader<'_>,
    codec: Codec,
    checksums: bool,
    chunk: &[(u32, PageSrc)],
    b: &mut PageBatch,
) -> Result<(), DbError> {
    let ps = reader.page_size as usize;
    // Every page is read over its whole slot, so the old contents need no clearing.
    b.data.resize(chunk.len() * ps, 0);
    b.comp.clear();
    b.ends.clear();
    b.sums.clear();
    b.read_nanos = 0;
    b.compress_nanos = 0;
    let mut scratch = Vec::new();
    for (k, &(pgno, src)) in chunk.iter().enumerate() {
        let buf = &mut b.data[k * ps..(k + 1) * ps];
        let t0 = Instant::now();
        reader.read(src, pgno, buf)?;
        let t1 = Instant::now();
        codec.compress(buf, &mut scratch)?;
        b.comp.extend_from_slice(&scratch);
        b.ends.push(b.comp.len());
        if checksums {
            b.sums.push(page_checksum(pgno, buf));
        }
        b.read_nanos += duration_nanos(t1 - t0);
        b.compress_nanos += duration_nanos(t1.elapsed());
    }
    Ok(())
}

/// Reads, compresses and checksums `pages` on `workers` threads, and hands each page to `sink`
/// in segment order on the calling thread (which owns the encoder and its file checksum).
/// Memory is bounded: each worker keeps at most three batches in flight. Returns the read and
/// compress nanoseconds summed over the workers.
fn encode_parallel(
    reader: PageReader<'_>,
    codec: Codec,
    checksums: bool,
    pages: &[(u32, PageSrc)],
    workers: usize,
    mut sink: impl FnMut(u32, &[u8], &[u8], u64) -> Result<(), DbError>,
) -> Result<(u64, u64), DbError> {
    let ps = reader.page_size as usize;
    let chunks: Vec<&[(u32, PageSrc)]> = pages.chunks(BATCH_PAGES).collect();
    std::thread::scope(|scope| {
        let mut rxs = Vec::with_capacity(workers);
        let mut returns = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = std::sync::mpsc::sync_channel(2);
            // Room for every batch of this worker in flight (2 queued, 1 being written).
            let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<PageBatch>(3);
            rxs.push(rx);
            returns.push(back_tx);
            let chunks = &chunks;
            scope.spawn(move || {
                for chunk in chunks.iter().skip(w).step_by(workers) {
                    let mut b = back_rx.try_recv().unwrap_or_default();
                    let batch = encode_batch(&reader, codec, checksums, chunk, &mut b).map(|()| b);
                    let failed = batch.is_err();
                    // A closed channel means the writer stopped on an error: stop too.
                    if tx.send(batch).is_err() || failed {
                        break;
                    }
                }
            });
        }
        let (mut read_nanos, mut compress_nanos) = (0, 0);
        for (i, chunk) in chunks.iter().enumerate() {
            let batch = rxs[i % workers]
                .recv()
                .map_err(|_| DbError::Unsupported("a segment encoder thread stopped".into()))??;
            read_nanos += batch.read_nanos;
            compress_nanos += batch.compress_nanos;
            let mut start = 0;
            for (k, &(pgno, _)) in chunk.iter().enumerate() {
                let end = batch.ends[k];
                let sum = batch.sums.get(k).copied().unwrap_or(0);
                sink(
                    pgno,
                    &batch.data[k * ps..(k + 1) * ps],
                    &batch.comp[start..end],
                    sum,
                )?;
                start = end;
            }
            // Back to its worker; a full or closed return queue just drops it.
            let _ = returns[i % workers].try_send(batch);
        }
        Ok((read_nanos, compress_nanos))
    })
}

/// Threads for encoding a large segment: every core.
fn encode_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One replicated database.
pub struct Db {
    path: PathBuf,
    wal_path: PathBuf,
    staging_dir: PathBuf,
    settings: DbSettings,
    codec: Codec,
    checksums: bool,
    open: Option<Open>,
    staging: Option<Staging>,
    remote_tip: RemoteTip,
    pos: TxId,
    post: u64,
    mark: Option<WalMark>,
    /// The read transaction has been held since `mark` was taken.
    continuous: bool,
    table: Vec<u64>,
    sum: DbChecksum,
    commit: u32,
    /// (WAL file size, salts) after the last full-path sync, for the idle fast path.
    fast: Option<(u64, u32, u32)>,
    /// Where our position ends inside a WAL file that is longer than it (restarted in place,
    /// or its restart blocked by a reader): the fast path also reads the frame header there.
    fast_tail: Option<u64>,
    last_full_verify: Instant,
    last_checkpoint: Instant,
    dirty_since_checkpoint: bool,
    /// The WAL was restarted in place under a busy writer, so the file is longer than what
    /// it holds until a quiet tick shrinks it (the fast path reads one more frame header).
    wal_oversized: bool,
    /// When a shrink of an oversized WAL was last tried (an application reader holding an
    /// old snapshot can make it fail; it is then retried once per checkpoint interval).
    shrink_tried: Option<Instant>,
    poisoned: Option<String>,
    /// Start of the current run of idle ticks.
    idle_since: Option<Instant>,
    /// Set while dormant: the stamps when the connection was closed.
    dormant: Option<Dormant>,
    /// Set by a wake that found the database file untouched since dormancy (see the module
    /// doc); consumed by the first sync after it.
    woke_unchanged: bool,
    pos_tx: watch::Sender<DbPos>,
    feed: SegmentFeed,
    stats: Arc<DbStats>,
    page_buf: Vec<u8>,
    /// Set while a sync serves a seed request: the connection must stay open for the seed.
    keep_awake: bool,
    /// Where seed snapshots are built (`<meta>/seed`), and the last one built.
    seed_dir: PathBuf,
    last_seed: Option<std::sync::Weak<SeedSnapshot>>,
    /// The header time of the last seed built for a position without one of its own.
    seed_time: Option<(TxId, i64)>,
    /// Replicas' seed requests: the sender is handed out, the receiver taken by the monitor.
    seed_tx: SeedRequests,
    seed_rx: Option<tokio::sync::mpsc::UnboundedReceiver<SeedRequest>>,
}

impl Db {
    /// A database at `path`, staging under `meta_path` (default `<dir>/.<name>-replicad`).
    /// Does no I/O: the database may not exist yet.
    pub fn new(
        path: PathBuf,
        meta_path: Option<PathBuf>,
        settings: DbSettings,
        remote_tip: RemoteTip,
    ) -> Db {
        let meta = meta_path.unwrap_or_else(|| default_meta_path(&path));
        let mut wal_path = path.as_os_str().to_owned();
        wal_path.push("-wal");
        let codec = settings.compression;
        let (pos_tx, _) = watch::channel(DbPos::default());
        let (seed_tx, seed_rx) = tokio::sync::mpsc::unbounded_channel();
        let now = Instant::now();
        Db {
            keep_awake: false,
            seed_dir: meta.join("seed"),
            last_seed: None,
            seed_time: None,
            seed_tx,
            seed_rx: Some(seed_rx),
            wal_path: PathBuf::from(wal_path),
            staging_dir: meta.join("ltx").join("0"),
            path,
            settings,
            codec,
            // Litestream's restore merges inputs into a NoChecksum stream and refuses inputs
            // that carry checksums, so the Litestream-compatible codec writes none.
            checksums: codec != Codec::Lz4,
            open: None,
            staging: None,
            remote_tip,
            pos: TxId(0),
            post: 0,
            mark: None,
            continuous: false,
            table: Vec::new(),
            sum: DbChecksum::default(),
            commit: 0,
            fast: None,
            fast_tail: None,
            last_full_verify: now,
            last_checkpoint: now,
            dirty_since_checkpoint: false,
            wal_oversized: false,
            shrink_tried: None,
            poisoned: None,
            idle_since: None,
            dormant: None,
            woke_unchanged: false,
            pos_tx,
            feed: SegmentFeed::default(),
            stats: Arc::new(DbStats::default()),
            page_buf: Vec::new(),
        }
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The staging directory of level-0 segments.
    pub fn staging_dir(&self) -> &Path {
        &self.staging_dir
    }

    /// Subscribes to position updates.
    pub fn subscribe(&self) -> watch::Receiver<DbPos> {
        self.pos_tx.subscribe()
    }

    /// Follows the full segments being staged (see [`crate::storage::feed`]): for replicas
    /// that upload a large segment while it is written.
    pub fn segment_feed(&self) -> watch::Receiver<Option<Arc<GrowingSegment>>> {
        self.feed.subscribe()
    }

    /// A sync that leaves the database open (not dormant), for a seed built right after it.
    pub fn sync_awake(&mut self) -> Result<usize, DbError> {
        self.keep_awake = true;
        let r = self.sync(true);
        self.keep_awake = false;
        r
    }

    /// Where replicas ask this database for a seed snapshot.
    pub fn seed_requests(&self) -> SeedRequests {
        self.seed_tx.clone()
    }

    /// The receiving end of [`Db::seed_requests`], for the monitor (once).
    pub fn take_seed_requests(
        &mut self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<SeedRequest>> {
        self.seed_rx.take()
    }

    /// Counters.
    pub fn stats(&self) -> Arc<DbStats> {
        self.stats.clone()
    }

    /// Current TXID.
    pub fn pos(&self) -> TxId {
        self.pos
    }

    /// The idle fast path: one fstat of the database file (unlinked: replaced or removed),
    /// one open, fstat and 32-byte read of the WAL header (and, in a WAL longer than our
    /// position, of the 24-byte frame header where it ends). Returns true
    /// when the tick can be skipped: the WAL is exactly as long as what was synced and its
    /// salts are unchanged (size alone is not enough: after a restart SQLite rewrites frames
    /// inside a file of unchanged size). A full verification still runs every
    /// `full-verify-interval`.
    ///
    /// This runs on the async worker on purpose: four syscalls on local metadata cost less
    /// than a hop to the blocking pool, and the path allocates nothing.
    ///
    /// A dormant database skips the full verification (it holds no state to verify) and
    /// compares stamps instead (module doc): one `statx` of the WAL, or two when it is missing.
    pub fn fast_path_skip(&mut self, now: Instant) -> bool {
        if self.dormant.is_none()
            && (now.duration_since(self.last_full_verify) >= self.settings.full_verify_interval
                || self.dormancy_due(now)
                || self.shrink_due(now))
        {
            return false;
        }
        self.unchanged_since_sync() && self.skip_tick(now)
    }

    /// While dormant and healthy: its idle check, to run away from the Db (its skipped ticks
    /// are counted on this Db's stats).
    pub fn dormant_probe(&self) -> Option<DormantProbe> {
        let stamps = *self.dormant.as_ref()?;
        if self.poisoned.is_some() {
            return None;
        }
        Some(DormantProbe {
            path: self.path.clone(),
            wal_path: self.wal_path.clone(),
            stamps,
            stats: self.stats.clone(),
        })
    }

    /// The WAL (and, while dormant, the database file) is as the last sync left it.
    fn unchanged_since_sync(&self) -> bool {
        if let Some(d) = &self.dormant {
            return d.unchanged(&self.path, &self.wal_path);
        }
        let Some((size, salt1, salt2)) = self.fast else {
            return false;
        };
        // A file renamed over the database, or the database removed, leaves ours unlinked.
        if let Some(open) = &self.open
            && open.db_file.metadata().is_ok_and(|m| m.nlink() == 0)
        {
            return false;
        }
        let f = match File::open(&self.wal_path) {
            Ok(f) => f,
            // No WAL and none expected: nothing was committed (a commit creates the WAL, and
            // our read transaction keeps a closing application from deleting it).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && size == 0 => return true,
            Err(_) => return false,
        };
        let Ok(meta) = f.metadata() else { return false };
        if meta.len() != size {
            return false;
        }
        if size == 0 {
            return true;
        }
        let mut h = [0u8; 32];
        if f.read_exact_at(&mut h, 0).is_err() {
            return false;
        }
        let s1 = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
        let s2 = u32::from_be_bytes([h[20], h[21], h[22], h[23]]);
        if s1 != salt1 || s2 != salt2 {
            return false;
        }
        // A file longer than our position: a commit writes its first frame right there, with
        // the current salts; a stale tail holds an older generation's frames.
        if let Some(at) = self.fast_tail {
            let mut fh = [0u8; 24];
            if f.read_exact_at(&mut fh, at).is_err() {
                return false;
            }
            let (f1, f2) = (
                u32::from_be_bytes([fh[8], fh[9], fh[10], fh[11]]),
                u32::from_be_bytes([fh[12], fh[13], fh[14], fh[15]]),
            );
            return (f1, f2) != (salt1, salt2);
        }
        true
    }

    /// Counts a skipped tick, unless a time-based checkpoint is due (then the tick must run).
    fn skip_tick(&mut self, now: Instant) -> bool {
        if self.checkpoint_due(now) {
            return false;
        }
        self.stats.sync_skipped.fetch_add(1, Ordering::Relaxed);
        self.stats.idle.store(true, Ordering::Relaxed);
        self.idle_since.get_or_insert(now);
        true
    }

    /// Installs or drops the connection, keeping the process-wide count of open ones.
    fn set_open(&mut self, open: Option<Open>) {
        match (self.open.is_some(), open.is_some()) {
            (false, true) => {
                AWAKE.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                AWAKE.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        self.open = open;
    }

    /// Time to close the connection: idle long enough (at once when open connections exceed
    /// the descriptor budget), small enough, and nothing pending.
    fn dormancy_due(&self, now: Instant) -> bool {
        if self.keep_awake {
            return false;
        }
        let after = self.settings.dormant_after;
        let Some(open) = &self.open else { return false };
        let pressed = AWAKE.load(Ordering::Relaxed) > AWAKE_BUDGET.load(Ordering::Relaxed);
        !after.is_zero()
            && self.continuous
            && self.poisoned.is_none()
            && self
                .idle_since
                .is_some_and(|t| pressed || now.duration_since(t) >= after)
            && u64::from(self.commit) * u64::from(open.page_size) <= self.settings.dormant_max_size
            && !self.checkpoint_due(now)
    }

    /// Closes the connection if the database is exactly caught up and its file settled.
    fn go_dormant(&mut self) -> Result<(), DbError> {
        self.refresh_fast_cache();
        if self.fast.is_none() {
            return Ok(());
        }
        let db = FileStamp::of(&self.path).map_err(io_err("stat", &self.path))?;
        let wal = match FileStamp::of(&self.wal_path) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("stat", &self.wal_path)(e)),
        };
        if !db.settled(STAMP_MARGIN) || wal.is_some_and(|w| !w.settled(STAMP_MARGIN)) {
            return Ok(());
        }
        // Dropping the connection ends the read transaction and closes every descriptor and
        // the shared-memory mapping (no checkpoint: SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE).
        self.set_open(None);
        self.continuous = false;
        self.dormant = Some(Dormant { db, wal });
        self.dirty_since_checkpoint = false;
        self.stats.dormant.store(true, Ordering::Relaxed);
        tracing::debug!(db = %self.path.display(), txid = %self.pos, "dormant");
        Ok(())
    }

    /// Reopens a dormant database: the connection and read transaction first, then the stamp
    /// comparison (a checkpoint after this point can only move frames we will read).
    fn wake(&mut self, stamp: FileStamp) -> Result<(), DbError> {
        let (conn, page_size) = open_pinned(&self.path)?;
        if page_size != self.page_size_or(page_size) {
            return Err(DbError::Unsupported(format!(
                "page size of {} changed from {} to {page_size}; replicate it to a new replica path",
                self.path.display(),
                self.page_size_or(page_size)
            )));
        }
        let db_file = File::open(&self.path).map_err(io_err("open", &self.path))?;
        let id = file_id(&db_file, &self.path)?;
        self.woke_unchanged = FileStamp::of(&self.path).is_ok_and(|now| now == stamp);
        if id.1 != stamp.ino {
            tracing::warn!(db = %self.path.display(), txid = %self.pos, "the database file was replaced while dormant; the next segment is a full copy of the new one");
            self.force_full("database file replaced");
        }
        self.set_open(Some(Open {
            conn,
            db_file,
            page_size,
            id,
        }));
        self.dormant = None;
        self.continuous = false;
        self.stats.dormant.store(false, Ordering::Relaxed);
        self.stats.wakes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(db = %self.path.display(), unchanged = self.woke_unchanged, "woke");
        Ok(())
    }

    fn page_size_or(&self, default: u32) -> u32 {
        if self.page_buf.is_empty() {
            default
        } else {
            self.page_buf.len() as u32
        }
    }

    /// Syncs every committed frame into segments, then checkpoints if the policy says so.
    /// Blocking: run it off the async reactor. Returns the number of segments written.
    pub fn sync(&mut self, allow_checkpoint: bool) -> Result<usize, DbError> {
        if let Some(why) = self.poisoned.take() {
            tracing::warn!(db = %self.path.display(), txid = %self.pos, cause = %why, "reopening the database after a failed local write; the next segment is a full copy");
            self.reopen("recovering from a failed local write");
        }
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = self.sync_inner(allow_checkpoint);
        self.stats
            .sync_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(m) = self.mark {
            self.stats.wal_size.store(m.offset, Ordering::Relaxed);
        }
        if result.is_err() {
            self.stats.sync_errors.fetch_add(1, Ordering::Relaxed);
            self.fast = None;
        }
        result
    }

    fn sync_inner(&mut self, allow_checkpoint: bool) -> Result<usize, DbError> {
        if let Some(d) = self.dormant {
            if !self.path.exists() {
                return Err(DbError::Missing(self.path.clone()));
            }
            self.wake(d.db)?;
        }
        if self.open.is_some() && self.replaced()? {
            tracing::warn!(db = %self.path.display(), txid = %self.pos, "the database file was replaced (a new file at its path); reopening it, the next segment is a full copy of the new one");
            self.reopen("database file replaced");
        }
        if self.open.is_none() && !self.init()? {
            return Err(DbError::Missing(self.path.clone()));
        }
        if self.staging.is_some() && !self.staging_dir.is_dir() {
            // Deleted under us (an operator, a tmp cleaner): the position lives on in memory,
            // so recreating the directory is enough to go on without losing a transaction.
            // Segments staged but not yet uploaded are gone; a replica that needed them
            // reports that it cannot catch up from staging.
            tracing::warn!(db = %self.path.display(), dir = %self.staging_dir.display(), txid = %self.pos, "staging directory disappeared; recreating it");
            fsutil::create_dir_all_durable(&self.staging_dir)
                .map_err(io_err("recreate staging", &self.staging_dir))?;
        }
        let mut written = 0;
        loop {
            let (wrote, limited) = self.sync_once()?;
            written += usize::from(wrote);
            if !limited {
                break;
            }
        }
        self.last_full_verify = Instant::now();
        if allow_checkpoint && self.checkpoint_due(Instant::now()) {
            written += self.checkpoint(false)?;
        } else if allow_checkpoint && written == 0 && self.shrink_due(Instant::now()) {
            // Quiet since an earlier empty sync too (`shrink_due`): one empty sync alone can
            // fall between two commits of a busy writer.
            self.shrink_tried = Some(Instant::now());
            written += self.checkpoint(true)?;
        }
        self.refresh_fast_cache();
        self.stats.idle.store(written == 0, Ordering::Relaxed);
        let now = Instant::now();
        if written > 0 {
            self.idle_since = None;
        } else {
            self.idle_since.get_or_insert(now);
            if self.dormancy_due(now) {
                self.go_dormant()?;
            }
        }
        Ok(written)
    }

    /// Opens SQLite, takes the read transaction, and recovers the position. Returns false if
    /// the database file does not exist yet.
    fn init(&mut self) -> Result<bool, DbError> {
        if !self.path.exists() {
            return Ok(false);
        }
        let (conn, page_size) = open_pinned(&self.path)?;
        let db_file = File::open(&self.path).map_err(io_err("open", &self.path))?;
        let staging = Staging::open(self.staging_dir.clone())
            .map_err(io_err("open staging", &self.staging_dir))?;
        match staging.tip() {
            Ok(Some(tip)) if tip.header.page_size != page_size => {
                return Err(DbError::Unsupported(format!(
                    "page size of {} changed from {} to {page_size}; replicate it to a new replica path",
                    self.path.display(),
                    tip.header.page_size
                )));
            }
            Ok(Some(tip)) => {
                self.pos = tip.header.max_txid;
                self.commit = tip.header.commit;
                self.post = tip.post_apply_checksum;
                self.mark = (tip.header.wal_offset > 0).then_some(WalMark {
                    salt1: tip.header.wal_salt1,
                    salt2: tip.header.wal_salt2,
                    offset: (tip.header.wal_offset + tip.header.wal_size) as u64,
                });
                self.publish(tip.header.timestamp);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(db = %self.path.display(), error = %e, "newest staged segment unusable; continuing after the replicas' position with a full segment");
                staging
                    .clear()
                    .map_err(io_err("clear staging", &self.staging_dir))?;
            }
        }
        if self.remote_tip.page_size != 0 && self.remote_tip.page_size != page_size {
            return Err(DbError::Unsupported(format!(
                "a replica of {} holds a database with {}-byte pages up to TXID {}, but the \
                 database has {page_size}-byte pages: the replica belongs to another database; \
                 give this one its own replica path (nothing is written to the replica)",
                self.path.display(),
                self.remote_tip.page_size,
                self.remote_tip.txid
            )));
        }
        if self.remote_tip.txid > self.pos {
            self.pos = self.remote_tip.txid;
            self.post = self.remote_tip.post_apply_checksum;
            self.mark = None;
            self.publish(0);
        }
        self.continuous = false;
        self.page_buf = vec![0u8; page_size as usize];
        let id = file_id(&db_file, &self.path)?;
        self.set_open(Some(Open {
            conn,
            db_file,
            page_size,
            id,
        }));
        self.staging = Some(staging);
        Ok(true)
    }

    /// Cuts at most one segment. Returns (segment written, more WAL left to copy).
    fn sync_once(&mut self) -> Result<(bool, bool), DbError> {
        let wal_file = match File::open(&self.wal_path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("open", &self.wal_path)(e)),
        };
        let header = match &wal_file {
            Some(f) => read_wal_header(f)?,
            None => None,
        };
        let wal_len = match &wal_file {
            Some(f) => f.metadata().map_err(io_err("stat", &self.wal_path))?.len(),
            None => 0,
        };
        if !self.continuous {
            return self.startup_sync(wal_file.as_ref(), header, wal_len);
        }
        let start = match (self.mark, header) {
            (_, None) => {
                // No valid WAL: nothing can have been committed since (the read transaction
                // stops anyone from truncating it), unless this is our first look.
                return Ok((false, false));
            }
            (Some(m), Some(h)) if (m.salt1, m.salt2) == (h.salt1, h.salt2) => {
                if wal_len < m.offset {
                    return self
                        .write_full(wal_file.as_ref(), header, "wal truncated")
                        .map(|w| (w, false));
                }
                m.offset
            }
            (Some(m), Some(h)) if h.salt1 == m.salt1.wrapping_add(1) => WAL_HEADER_SIZE,
            (Some(_), Some(_)) => {
                return self
                    .write_full(wal_file.as_ref(), header, "wal restarted more than once")
                    .map(|w| (w, false));
            }
            (None, Some(_)) => WAL_HEADER_SIZE,
        };
        let Some(f) = wal_file.as_ref() else {
            return Ok((false, false));
        };
        let scan = match wal::scan(f, start, MAX_SYNC_WAL_BYTES) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok((false, false)),
            Err(WalError::PrevFrameMismatch { .. }) => {
                return self
                    .write_full(wal_file.as_ref(), header, "wal overwritten")
                    .map(|w| (w, false));
            }
            Err(e) => return Err(e.into()),
        };
        let h = scan.header;
        if scan.pages.is_empty() && scan.end_offset == start {
            self.mark = Some(WalMark {
                salt1: h.salt1,
                salt2: h.salt2,
                offset: start,
            });
            return Ok((false, false));
        }
        let wrote = self.write_incremental(f, &scan, start, |_| true)?;
        Ok((wrote, scan.limited))
    }

    /// First sync after opening: decides between continuing the chain and a full segment, and
    /// builds the checksum table from the whole database.
    fn startup_sync(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
        wal_len: u64,
    ) -> Result<(bool, bool), DbError> {
        let scan = match (wal_file, header) {
            (Some(f), Some(_)) => wal::scan(f, WAL_HEADER_SIZE, u64::MAX)?,
            _ => None,
        };
        let forced = self.remote_tip.full_reason.take();
        let woke_unchanged = std::mem::take(&mut self.woke_unchanged);
        let same_wal = |m: WalMark, s: &wal::WalScan| {
            (s.header.salt1, s.header.salt2) == (m.salt1, m.salt2)
                && wal_len >= m.offset
                && s.end_offset >= m.offset
        };
        let reason = match (self.pos.0, self.mark, &scan) {
            _ if forced.is_some() => forced,
            (0, _, _) => Some("initial snapshot"),
            (_, Some(m), Some(s)) if same_wal(m, s) => None,
            // Woken with the database file untouched: nothing was checkpointed while dormant,
            // so the current WAL, if any, holds every change since the mark (module doc).
            (_, _, None) if woke_unchanged => {
                self.continuous = true;
                return Ok((false, false));
            }
            (_, _, Some(_)) if woke_unchanged => {
                self.mark = None;
                None
            }
            (_, None, _) => Some("local position unknown"),
            (_, Some(_), None) => Some("wal missing or empty after restart"),
            (_, Some(m), Some(s)) => {
                if (s.header.salt1, s.header.salt2) != (m.salt1, m.salt2) {
                    Some("wal restarted while replicad was down")
                } else if wal_len < m.offset || s.end_offset < m.offset {
                    Some("wal truncated while replicad was down")
                } else {
                    None
                }
            }
        };
        let wrote = match (reason, scan.as_ref(), wal_file) {
            (None, Some(s), Some(f)) => {
                let from = self.mark.map_or(WAL_HEADER_SIZE, |m| m.offset);
                if self.checksums {
                    self.build_table(Some((f, s)))?;
                }
                let changed = |off: u64| off >= from;
                if s.end_offset == from {
                    self.mark = Some(WalMark {
                        salt1: s.header.salt1,
                        salt2: s.header.salt2,
                        offset: from,
                    });
                    false
                } else {
                    self.write_incremental(f, s, from, changed)?
                }
            }
            (Some(reason), _, _) => {
                // A database identical to the replica's tip needs no full copy (clean restart
                // where SQLite removed the WAL on close).
                if forced.is_none() && self.checksums && self.pos.0 > 0 && self.post != 0 {
                    self.build_table(scan.as_ref().zip(wal_file).map(|(s, f)| (f, s)))?;
                    if self.sum.value() == self.post {
                        self.mark = scan.as_ref().map(|s| WalMark {
                            salt1: s.header.salt1,
                            salt2: s.header.salt2,
                            offset: s.end_offset,
                        });
                        self.continuous = true;
                        return Ok((false, false));
                    }
                }
                self.write_full(wal_file, header, reason)?
            }
            (None, _, _) => self.write_full(wal_file, header, "wal unreadable")?,
        };
        self.continuous = true;
        Ok((wrote, false))
    }

    /// Builds the per-page checksum table of the current database state.
    fn build_table(&mut self, overlay: Option<(&File, &wal::WalScan)>) -> Result<(), DbError> {
        let commit = self.current_commit(overlay.map(|(_, s)| s))?;
        // The table describes the database as it is now; `self.commit` stays the commit at
        // the current position, so growth since then is still copied.
        let mut table = vec![0u64; commit as usize];
        let mut sum = DbChecksum::default();
        let lock = lock_pgno(self.page_size());
        let mut buf = std::mem::take(&mut self.page_buf);
        // Phase stats: summed here, added to the process-wide totals once.
        let (mut read_nanos, mut read_bytes) = (0u64, 0u64);
        let read = (|| {
            for pgno in (1..=commit).filter(|p| *p != lock) {
                let src = overlay
                    .and_then(|(_, s)| s.pages.get(&pgno).copied())
                    .map_or(PageSrc::DbFile, PageSrc::Wal);
                let t = Instant::now();
                self.read_page(overlay.map(|(f, _)| f), src, pgno, &mut buf)?;
                read_nanos += duration_nanos(t.elapsed());
                read_bytes += buf.len() as u64;
                let c = page_checksum(pgno, &buf);
                table[pgno as usize - 1] = c;
                sum.toggle(c);
            }
            match overlay {
                Some((f, s)) => same_generation(f, (s.header.salt1, s.header.salt2)),
                None => Ok(()),
            }
        })();
        // The page buffer goes back on every path: an empty one would make every later
        // segment fail (a failed read here once left the daemon retrying a full segment).
        self.page_buf = buf;
        read?;
        PHASES.record_nanos(Phase::WalRead, read_bytes, read_nanos);
        self.table = table;
        self.sum = sum;
        Ok(())
    }

    fn page_size(&self) -> u32 {
        self.open.as_ref().map_or(4096, |o| o.page_size)
    }

    /// Database size in pages: the last commit frame's, else the database header's.
    fn current_commit(&self, scan: Option<&wal::WalScan>) -> Result<u32, DbError> {
        if let Some(s) = scan.filter(|s| s.commit > 0) {
            return Ok(s.commit);
        }
        let open = self
            .open
            .as_ref()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?;
        let len = open
            .db_file
            .metadata()
            .map_err(io_err("stat", &self.path))?
            .len();
        let mut h = [0u8; 100];
        if len >= 100 && open.db_file.read_exact_at(&mut h, 0).is_ok() {
            let in_header = u32::from_be_bytes([h[28], h[29], h[30], h[31]]);
            let change = &h[24..28];
            let valid_for = &h[92..96];
            if in_header > 0 && change == valid_for {
                return Ok(in_header);
            }
        }
        Ok((len / u64::from(open.page_size)) as u32)
    }

    fn read_page(
        &self,
        wal_file: Option<&File>,
        src: PageSrc,
        pgno: u32,
        buf: &mut [u8],
    ) -> Result<(), DbError> {
        self.page_reader(wal_file)?.read(src, pgno, buf)
    }

    fn page_reader<'a>(&'a self, wal_file: Option<&'a File>) -> Result<PageReader<'a>, DbError> {
        let open = self
            .open
            .as_ref()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?;
        Ok(PageReader {
            db_file: &open.db_file,
            wal_file,
            page_size: open.page_size,
            path: &self.path,
        })
    }

    /// Writes a segment with the pages of `scan` whose newest frame is at or after `from`
    /// (`changed`), plus pages the database grew by that no frame carries.
    fn write_incremental(
        &mut self,
        f: &File,
        scan: &wal::WalScan,
        from: u64,
        changed: impl Fn(u64) -> bool,
    ) -> Result<bool, DbError> {
        let old_commit = self.commit;
        let commit = self.current_commit(Some(scan))?;
        let lock = lock_pgno(self.page_size());
        let mut pages: Vec<(u32, PageSrc)> = scan
            .pages
            .iter()
            .filter(|(_, off)| changed(**off))
            .map(|(p, off)| (*p, PageSrc::Wal(*off)))
            .collect();
        if commit > old_commit {
            let growth =
                (old_commit + 1..=commit).filter(|p| *p != lock && !scan.pages.contains_key(p));
            pages.extend(growth.map(|p| (p, PageSrc::DbFile)));
            pages.sort_by_key(|(p, _)| *p);
        }
        if pages.is_empty() && commit == self.commit {
            self.mark = Some(WalMark {
                salt1: scan.header.salt1,
                salt2: scan.header.salt2,
                offset: scan.end_offset,
            });
            return Ok(false);
        }
        let header = self.next_header(commit, from, scan.end_offset - from, &scan.header);
        self.write_segment(header, Some(f), &pages, false)?;
        self.mark = Some(WalMark {
            salt1: scan.header.salt1,
            salt2: scan.header.salt2,
            offset: scan.end_offset,
        });
        Ok(true)
    }

    /// Writes a segment holding every page of the database, at the next TXID.
    fn write_full(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
        reason: &str,
    ) -> Result<bool, DbError> {
        let scan = match (wal_file, header) {
            (Some(f), Some(_)) => wal::scan(f, WAL_HEADER_SIZE, u64::MAX)?,
            _ => None,
        };
        let commit = self.current_commit(scan.as_ref())?;
        if commit == 0 {
            return Ok(false);
        }
        tracing::info!(db = %self.path.display(), txid = %TxId(self.pos.0 + 1), reason, pages = commit, "writing a full segment");
        let lock = lock_pgno(self.page_size());
        let pages: Vec<(u32, PageSrc)> = (1..=commit)
            .filter(|p| *p != lock)
            .map(|p| {
                (
                    p,
                    scan.as_ref()
                        .and_then(|s| s.pages.get(&p).copied())
                        .map_or(PageSrc::DbFile, PageSrc::Wal),
                )
            })
            .collect();
        let (wal_off, wal_size, wh) = match &scan {
            Some(s) => (
                WAL_HEADER_SIZE,
                s.end_offset - WAL_HEADER_SIZE,
                Some(s.header),
            ),
            None => (0, 0, None),
        };
        let mut h = match &wh {
            Some(wh) => self.next_header(commit, wal_off, wal_size, wh),
            None => self.next_header_no_wal(commit),
        };
        if h.wal_size == 0 {
            // No frame was copied: record no WAL position (a header rule of the format).
            (h.wal_offset, h.wal_salt1, h.wal_salt2) = (0, 0, 0);
        }
        self.write_segment(h, wal_file, &pages, true)?;
        self.stats.full_segments.fetch_add(1, Ordering::Relaxed);
        self.mark = scan.as_ref().map(|s| WalMark {
            salt1: s.header.salt1,
            salt2: s.header.salt2,
            offset: s.end_offset,
        });
        self.continuous = true;
        Ok(true)
    }

    fn next_header(&self, commit: u32, wal_offset: u64, wal_size: u64, wh: &WalHeader) -> Header {
        let mut h = self.next_header_no_wal(commit);
        if wal_size > 0 {
            h.wal_offset = wal_offset as i64;
            h.wal_size = wal_size as i64;
            h.wal_salt1 = wh.salt1;
            h.wal_salt2 = wh.salt2;
        }
        h
    }

    fn next_header_no_wal(&self, commit: u32) -> Header {
        let txid = TxId(self.pos.0 + 1);
        let pre = match (self.checksums, txid.0) {
            (false, _) | (_, 1) => 0,
            // An unknown predecessor (a Litestream-written tip) still needs a flagged value.
            (true, _) if self.post == 0 => CHECKSUM_FLAG,
            (true, _) => self.post,
        };
        Header {
            flags: if self.checksums {
                0
            } else {
                HEADER_FLAG_NO_CHECKSUM
            },
            page_size: self.page_size(),
            commit,
            min_txid: txid,
            max_txid: txid,
            timestamp: now_ms(),
            pre_apply_checksum: pre,
            ..Header::default()
        }
    }

    /// Encodes `pages` into a staged segment (tmp -> fsync -> rename -> fsync dir), updates
    /// the checksum table, and publishes the new position.
    fn write_segment(
        &mut self,
        header: Header,
        wal_file: Option<&File>,
        pages: &[(u32, PageSrc)],
        full: bool,
    ) -> Result<(), DbError> {
        let staging = self
            .staging
            .as_ref()
            .ok_or_else(|| DbError::Unsupported("staging not open".into()))?;
        let dest = staging.path(header.max_txid);
        let tmp = fsutil::tmp_path(&dest);
        let file = File::create(&tmp).map_err(io_err("create", &tmp))?;
        let built = Instant::now();
        let announced = (full
            && self.feed.followed()
            && pages.len() as u64 * u64::from(header.page_size) >= STREAM_MIN_BYTES)
            .then(|| File::open(&tmp).ok())
            .flatten()
            .map(|r| {
                self.feed
                    .announce(GrowingSegment::new(header.max_txid, header.timestamp, r))
            });
        let tap = Tap::new(file, announced.as_ref().map(|a| a.segment().clone()));
        let mut enc = Encoder::new(tap, header, self.codec)?;
        let commit = header.commit;
        // The checksum table changes only once the segment is published: a failed write
        // (ENOSPC, EIO) must leave it exactly as it was, or the next segment's post-apply
        // checksum would be computed from a table missing pages.
        let mut sum = if full {
            DbChecksum::default()
        } else {
            self.sum
        };
        if self.checksums && !full {
            for p in (commit as usize + 1)..=self.table.len() {
                sum.toggle(self.table[p - 1]);
            }
        }
        let mut updates: Vec<(u32, u64)> =
            Vec::with_capacity(if self.checksums { pages.len() } else { 0 });
        let mut buf = std::mem::take(&mut self.page_buf);
        // Phase stats (three clock reads a page, no shared writes until the segment is done):
        // wal_read = read_page, compress = encode_page, encode = the rest of the build.
        let (mut read_nanos, mut compress_nanos) = (0u64, 0u64);
        let mut page_bytes = 0u64;
        let checksums = self.checksums;
        let table = &self.table;
        // Pages of one segment are distinct, so the old value is the table's.
        let mut account = |pgno: u32, c: u64| {
            let old = if full || pgno > commit {
                0
            } else {
                table.get(pgno as usize - 1).copied().unwrap_or(0)
            };
            if old != 0 {
                sum.toggle(old);
            }
            sum.toggle(c);
            updates.push((pgno, c));
        };
        let workers = encode_workers();
        let encoded = (|| {
            if pages.len() >= PARALLEL_MIN_PAGES && workers > 1 {
                let reader = self.page_reader(wal_file)?;
                let (r, c) = encode_parallel(
                    reader,
                    self.codec,
                    checksums,
                    pages,
                    workers,
                    |pgno, data, comp, c| {
                        enc.encode_compressed_page(pgno, comp, data)?;
                        page_bytes += data.len() as u64;
                        if checksums {
                            account(pgno, c);
                        }
                        Ok(())
                    },
                )?;
                read_nanos += r;
                compress_nanos += c;
            } else {
                for &(pgno, src) in pages {
                    let t0 = Instant::now();
                    self.read_page(wal_file, src, pgno, &mut buf)?;
                    let t1 = Instant::now();
                    enc.encode_page(pgno, &buf)?;
                    let t2 = Instant::now();
                    read_nanos += duration_nanos(t1 - t0);
                    compress_nanos += duration_nanos(t2 - t1);
                    page_bytes += buf.len() as u64;
                    if checksums {
                        account(pgno, page_checksum(pgno, &buf));
                    }
                }
            }
            Ok::<_, DbError>(())
        })();
        let from_wal = pages.iter().any(|(_, s)| matches!(s, PageSrc::Wal(_)));
        let result = encoded.and_then(|()| {
            if let (true, Some(f)) = (from_wal, wal_file) {
                same_generation(f, (header.wal_salt1, header.wal_salt2))?;
            }
            let post = if checksums { sum.value() } else { 0 };
            let (tap, _) = enc.finish(post)?;
            Ok::<_, DbError>((tap.into_inner(), post))
        });
        self.page_buf = buf;
        let build_nanos = duration_nanos(built.elapsed());
        PHASES.record_nanos(Phase::WalRead, page_bytes, read_nanos);
        PHASES.record_nanos(Phase::Compress, page_bytes, compress_nanos);
        let (file, post) = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let segment_bytes = file.metadata().map_or(0, |m| m.len());
        PHASES.record_nanos(
            Phase::Encode,
            segment_bytes,
            build_nanos.saturating_sub(read_nanos + compress_nanos),
        );
        let staged = Instant::now();
        if let Err(e) = file.sync_all().and_then(|()| fsutil::publish(&tmp, &dest)) {
            self.poisoned = Some(format!("fsync {}: {e}", dest.display()));
            return Err(io_err("publish", &dest)(e));
        }
        let stage_elapsed = staged.elapsed();
        PHASES.record(Phase::StageWrite, segment_bytes, stage_elapsed);
        if full {
            tracing::debug!(
                txid = %header.max_txid,
                bytes = segment_bytes,
                build_ms = build_nanos / 1_000_000,
                read_ms = read_nanos / 1_000_000,
                compress_ms = compress_nanos / 1_000_000,
                durable_ms = stage_elapsed.as_millis() as u64,
                "full segment staged"
            );
        }
        if self.checksums {
            let mut table = if full {
                Vec::new()
            } else {
                std::mem::take(&mut self.table)
            };
            table.resize(commit as usize, 0);
            for (pgno, c) in updates {
                table[pgno as usize - 1] = c;
            }
            self.table = table;
        }
        self.sum = sum;
        self.commit = commit;
        self.pos = header.max_txid;
        self.post = post;
        self.dirty_since_checkpoint = true;
        self.stats.segments.fetch_add(1, Ordering::Relaxed);
        if let Ok(meta) = std::fs::metadata(&dest) {
            self.stats
                .staging_bytes
                .fetch_add(meta.len(), Ordering::Relaxed);
        }
        self.publish(header.timestamp);
        if let Some(a) = announced {
            a.published(segment_bytes);
        }
        Ok(())
    }

    fn publish(&self, timestamp_ms: i64) {
        self.stats.txid.store(self.pos.0, Ordering::Relaxed);
        self.pos_tx.send_replace(DbPos {
            txid: self.pos,
            timestamp_ms,
        });
    }

    fn refresh_fast_cache(&mut self) {
        let len = match std::fs::metadata(&self.wal_path) {
            Ok(meta) => Some(meta.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(0),
            Err(_) => None,
        };
        self.fast_tail = None;
        self.fast = match (self.mark, len) {
            (Some(m), Some(len)) if len == m.offset => Some((m.offset, m.salt1, m.salt2)),
            // Longer than our position: whatever lies past it is a stale tail as long as the
            // frame there is not of the current generation (see `unchanged_since_sync`).
            (Some(m), Some(len)) if len > m.offset && m.offset >= WAL_HEADER_SIZE => {
                self.fast_tail = Some(m.offset);
                Some((len, m.salt1, m.salt2))
            }
            // An empty or missing WAL while we hold the read transaction: any commit makes it
            // grow, so size 0 is a sound idle marker.
            (None, Some(0)) if self.continuous => Some((0, 0, 0)),
            _ => None,
        };
    }

    fn wal_pages(&self) -> u64 {
        let frame = 24 + u64::from(self.page_size());
        self.mark
            .map_or(0, |m| m.offset.saturating_sub(WAL_HEADER_SIZE) / frame)
    }

    fn checkpoint_due(&self, now: Instant) -> bool {
        if !self.dirty_since_checkpoint {
            return false;
        }
        let pages = self.wal_pages();
        let interval = self.settings.checkpoint_interval;
        pages >= u64::from(self.settings.min_checkpoint_page_count)
            || (!interval.is_zero()
                && now.duration_since(self.last_checkpoint) >= interval
                && pages > 1)
    }

    /// An oversized WAL (see `wal_oversized`) is shrunk on the first tick that finds no new
    /// frame: the writer has paused, so freeing the file's blocks holds no one up.
    fn shrink_due(&self, now: Instant) -> bool {
        let retry = self
            .settings
            .checkpoint_interval
            .max(Duration::from_secs(1));
        self.wal_oversized
            && self
                .idle_since
                .is_some_and(|t| now.duration_since(t) >= QUIET_BEFORE_SHRINK)
            && self
                .shrink_tried
                .is_none_or(|t| now.duration_since(t) >= retry)
    }

    /// Checkpoints the WAL (DESIGN §3.1): PASSIVE under a write lock after a sealing sync;
    /// TRUNCATE above `truncate-page-n`. Never RESTART. Returns segments written.
    ///
    /// A complete PASSIVE checkpoint restarts the WAL with a small write of our own. That
    /// write shrinks the file to one frame unless the page count forced this checkpoint (a
    /// busy writer) and `quiet` is false: then the WAL is reused in place, as SQLite does by
    /// default. Shrinking frees the file's blocks while our write holds SQLite's write lock:
    /// beside a writer filling hundreds of MB of WAL between checkpoints, that write held the
    /// application up for 50-164 ms at every checkpoint (the `ftruncate` alone took up to
    /// 170 ms), against under 5 ms in place. The first quiet tick shrinks it instead.
    fn checkpoint(&mut self, quiet: bool) -> Result<usize, DbError> {
        let pages = self.wal_pages();
        let truncate = pages >= u64::from(self.settings.truncate_page_n);
        let shrink = quiet || pages < u64::from(self.settings.min_checkpoint_page_count);
        let mut barrier = open_connection(&self.path)?;
        // Politely while the WAL is small: a busy write lock skips this checkpoint until a
        // later tick, without holding up the monitor. Insistently past a quarter of the
        // TRUNCATE threshold, so that a writer that never pauses gets one short stall of a
        // PASSIVE checkpoint instead of a TRUNCATE's long one followed by a full segment.
        let insist = pages >= u64::from(self.settings.truncate_page_n / 4);
        if insist {
            barrier.busy_handler(Some(barrier_busy))?;
        } else {
            barrier.busy_timeout(Duration::from_millis(10))?;
        }
        let mut written = 0;
        if !truncate {
            // Each pass leaves for the barrier only what the application committed during it;
            // against a fast writer a second or third pass shrinks that several-fold.
            let mut ahead = true;
            // Where the previous pass left our read mark (frames), and whether it left enough
            // behind to be worth a seal of its own before the next pass locks.
            let (mut read_mark, mut seal_first) = (0, false);
            for _ in 0..BACKFILL_PASSES {
                let (wrote, behind) = self.backfill_ahead(&barrier, seal_first, &mut read_mark)?;
                written += wrote;
                seal_first = behind.is_some_and(|n| n >= PASS_EXTRA_MIN_FRAMES);
                match behind {
                    // Busy while polite: give up at once, so that the next tick tries again
                    // soon (a failed try must stay cheap against a fast writer).
                    None if !insist => {
                        tracing::debug!(db = %self.path.display(), "checkpoint skipped: write lock busy");
                        return Ok(written);
                    }
                    // Busy while insisting: the barrier polls again, with nothing in between.
                    None => {
                        ahead = false;
                        break;
                    }
                    Some(n) if n <= BACKFILL_SETTLED_FRAMES => break,
                    Some(_) => {}
                }
            }
            if ahead {
                // The checkpoint under the barrier syncs the WAL and the database file: sync
                // both now, unlocked, so that those syncs find little left to write. Likewise
                // seal now, leaving the barrier's seal only what is committed from here on.
                self.sync_wal_and_db()?;
                written += self.seal()?;
            }
        }
        // The barrier: holding SQLite's write lock, no commit can land between the seal and
        // the checkpoint, so every frame the checkpoint moves is already in a segment.
        if let Err(e) = barrier.execute_batch("BEGIN IMMEDIATE") {
            tracing::debug!(db = %self.path.display(), error = %e, "checkpoint skipped: write lock busy");
            return Ok(written);
        }
        let locked = Instant::now();
        let mut released = false;
        let sealed = (|| {
            written += self.seal()?;
            let seal_ms = locked.elapsed().as_millis();
            let conn = self.end_read()?;
            released = true;
            let mode = if truncate { "TRUNCATE" } else { "PASSIVE" };
            // TRUNCATE needs the write lock itself: give it up first (the WAL is synced).
            if truncate {
                barrier.execute_batch("ROLLBACK")?;
            }
            let copying = Instant::now();
            let (busy, log, done): (i64, i64, i64) =
                conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            let copy_ms = copying.elapsed().as_millis();
            let complete = log >= 0 && log == done;
            begin_read(conn)?;
            released = false;
            let locked_ms = locked.elapsed().as_millis();
            tracing::debug!(db = %self.path.display(), mode, busy, log, done, seal_ms, copy_ms, locked_ms, "checkpoint");
            Ok::<_, DbError>((truncate, complete))
        })();
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        self.count_write_lock(locked);
        let (truncated, complete) = match sealed {
            Ok(v) => v,
            Err(e) => {
                if released {
                    self.reopen_after_lost_read();
                }
                return Err(e);
            }
        };
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        if truncated {
            self.stats
                .truncate_checkpoints
                .fetch_add(1, Ordering::Relaxed);
        }
        self.last_checkpoint = Instant::now();
        self.dirty_since_checkpoint = false;
        if truncated {
            self.wal_oversized = false;
            self.shrink_tried = None;
            // Commits may have landed between the unlock and the truncate: they are in the
            // database file now, not in any WAL frame we saw. Only a full segment is safe.
            let f = File::open(&self.wal_path).ok();
            let h = match &f {
                Some(f) => read_wal_header(f)?,
                None => None,
            };
            written += usize::from(self.write_full(
                f.as_ref(),
                h,
                "checkpoint boundary after TRUNCATE",
            )?);
        } else if complete {
            // Restart the WAL now with our own small write, so the file shrinks back to one
            // frame (journal_size_limit=0) and the idle fast path applies again.
            let restarting = Instant::now();
            let limit = if shrink { 0 } else { -1 };
            barrier.execute_batch(&format!("PRAGMA journal_size_limit={limit}"))?;
            barrier.execute_batch(
                "BEGIN IMMEDIATE; \
                 CREATE TABLE IF NOT EXISTS _replicad_seq (id INTEGER PRIMARY KEY, seq INTEGER); \
                 INSERT INTO _replicad_seq (id, seq) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; \
                 COMMIT;",
            )?;
            tracing::debug!(db = %self.path.display(), shrink, restart_ms = restarting.elapsed().as_millis(), "WAL restarted");
            let (wrote, _) = self.sync_once()?;
            written += usize::from(wrote);
            self.wal_oversized = !shrink;
            if shrink {
                self.shrink_tried = None;
            }
        }
        // Our own restart write is not new application data.
        self.dirty_since_checkpoint = false;
        Ok(written)
    }

    /// The first two phases of a PASSIVE checkpoint, so that the application waits on the
    /// barrier only for what it commits meanwhile, not for a whole interval's frames:
    /// 1. under the write lock for a moment, seal (copy what is new) and move our read
    ///    transaction to the end of the WAL, which is now all in segments;
    /// 2. without any lock, a PASSIVE checkpoint copies those frames into the database file
    ///    while the application keeps committing. It stops at our read mark, and the WAL
    ///    cannot restart while we read, so no frame is lost (invariants 2 and 3 hold: the
    ///    frames it moves stay in the WAL until the barrier's phase allows a restart).
    ///
    /// Unlocked work around both phases keeps the locked moment short: after the copy,
    /// another seal; with a large backlog (see [`PASS_EXTRA_MIN_FRAMES`]) also a seal before
    /// the lock (`seal_first`), so that the seal under it has only what lands meanwhile, and
    /// a sync of the database file after a large copy. `read_mark` is where the previous
    /// pass left our read mark, in frames (0 for the first pass); it is moved on.
    ///
    /// Returns segments written and the frames the application committed during the copy,
    /// sealed (unlocked) right after it (`None` when the write lock was busy).
    fn backfill_ahead(
        &mut self,
        barrier: &Connection,
        seal_first: bool,
        read_mark: &mut u64,
    ) -> Result<(usize, Option<u64>), DbError> {
        let mut written = if seal_first { self.seal()? } else { 0 };
        if barrier.execute_batch("BEGIN IMMEDIATE").is_err() {
            return Ok((written, None));
        }
        let locked = Instant::now();
        let mut released = false;
        let moved = (|| {
            written += self.seal()?;
            let conn = self.end_read()?;
            released = true;
            // Nobody can commit while the barrier holds the write lock: the new read mark
            // is exactly the end of what was just sealed.
            begin_read(conn)?;
            Ok::<_, DbError>(())
        })();
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        self.count_write_lock(locked);
        if let Err(e) = moved {
            if released {
                self.reopen_after_lost_read();
            }
            return Err(e);
        }
        let locked_ms = locked.elapsed().as_millis();
        let copied = self.wal_pages().saturating_sub(*read_mark);
        *read_mark += copied;
        let copying = Instant::now();
        let (_, log, done): (i64, i64, i64) =
            barrier.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        let copy_ms = copying.elapsed().as_millis();
        // SQLite syncs the database file only when a checkpoint's copy ends at the end of the
        // WAL, which a pass beside a busy writer never does: every pass's pages stayed dirty
        // until the barrier's checkpoint wrote them all back under the write lock (130-240 ms
        // of its time with 500-4,000 frames left to copy).
        if copied >= PASS_EXTRA_MIN_FRAMES {
            self.sync_db()?;
        }
        // What the application committed meanwhile, sealed now, unlocked, so that the next
        // pass's seal under the lock has only the last few commits. (The checkpoint's own
        // figures are from its start; the file's length says nothing once the WAL is reused
        // in place.)
        let sealed_to = self.mark.map_or(0, |m| m.offset);
        written += self.seal()?;
        let behind = self.mark.map_or(0, |m| m.offset).saturating_sub(sealed_to)
            / (24 + u64::from(self.page_size()));
        tracing::debug!(db = %self.path.display(), log, done, behind, locked_ms, copy_ms, "backfill pass");
        Ok((written, Some(behind)))
    }

    /// Syncs the application's WAL and database file ahead of a checkpoint's own syncs, which
    /// then find little left to write. A failure is reported, not ignored: the checkpoint
    /// must not go on as if those pages were safe (SQLite's own sync on its descriptor would
    /// report it too, but only once).
    fn sync_wal_and_db(&self) -> Result<(), DbError> {
        File::open(&self.wal_path)
            .and_then(|f| f.sync_data())
            .map_err(io_err("fsync", &self.wal_path))?;
        self.sync_db()
    }

    /// Syncs the application's database file (see [`Db::sync_wal_and_db`]).
    fn sync_db(&self) -> Result<(), DbError> {
        if let Some(open) = &self.open {
            open.db_file
                .sync_data()
                .map_err(io_err("fsync", &self.path))?;
        }
        Ok(())
    }

    /// After an error left us without our read transaction, the WAL may restart behind us:
    /// the next sync reopens from the staged position (a full segment if continuity is lost).
    fn reopen_after_lost_read(&mut self) {
        self.set_open(None);
        self.continuous = false;
    }

    /// True when the path no longer names the file we have open (replaced, or removed:
    /// then [`DbError::Missing`] after the reopen).
    fn replaced(&self) -> Result<bool, DbError> {
        let Some(open) = &self.open else {
            return Ok(false);
        };
        match std::fs::metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) != open.id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(io_err("stat", &self.path)(e)),
        }
    }

    /// The next segment is a full copy, at the TXID after every one staged so far.
    fn force_full(&mut self, reason: &'static str) {
        let page_size = if self.page_buf.is_empty() {
            self.remote_tip.page_size
        } else {
            self.page_buf.len() as u32
        };
        self.remote_tip = RemoteTip {
            txid: self.pos.max(self.remote_tip.txid),
            post_apply_checksum: self.post,
            full_reason: Some(reason),
            page_size,
        };
    }

    /// Forgets everything not proven by staging (connection, read transaction, WAL mark,
    /// checksum table); the next sync opens the database again and writes a full segment.
    fn reopen(&mut self, reason: &'static str) {
        self.force_full(reason);
        self.set_open(None);
        self.dormant = None;
        self.stats.dormant.store(false, Ordering::Relaxed);
        self.continuous = false;
        self.mark = None;
        self.fast = None;
        self.staging = None;
        self.table = Vec::new();
        self.sum = DbChecksum::default();
        self.wal_oversized = false;
        self.woke_unchanged = false;
    }

    fn count_write_lock(&self, since: Instant) {
        self.stats
            .write_lock_nanos
            .fetch_add(duration_nanos(since.elapsed()), Ordering::Relaxed);
    }

    /// Copies every committed frame into segments (under the barrier: nothing new can land).
    fn seal(&mut self) -> Result<usize, DbError> {
        let mut written = 0;
        loop {
            let (wrote, limited) = self.sync_once()?;
            written += usize::from(wrote);
            if !limited {
                return Ok(written);
            }
        }
    }

    /// Ends our read transaction (only under the barrier); returns the connection.
    fn end_read(&self) -> Result<&Connection, DbError> {
        let conn = &self
            .open
            .as_ref()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?
            .conn;
        conn.execute_batch("COMMIT")?;
        Ok(conn)
    }

    /// Final sync before shutdown (no checkpoint: the next start continues from the WAL).
    /// A dormant database that did not change stays closed.
    pub fn final_sync(&mut self) -> Result<usize, DbError> {
        if self.dormant.is_some() && self.unchanged_since_sync() {
            return Ok(0);
        }
        self.sync(false)
    }

    /// Deletes staged segments every replica has (keeping the newest).
    pub fn prune_staging(&self, acknowledged: TxId) -> Result<usize, DbError> {
        let Some(s) = &self.staging else { return Ok(0) };
        let removed = s
            .prune_below(TxId(acknowledged.0 + 1))
            .map_err(io_err("prune", &self.staging_dir))?;
        if removed > 0 {
            let bytes = s.total_bytes().map_err(io_err("stat", &self.staging_dir))?;
            self.stats.staging_bytes.store(bytes, Ordering::Relaxed);
        }
        Ok(removed)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.set_open(None);
    }
}

/// Default metadata directory: `<dir>/.<file name>-replicad`.
pub fn default_meta_path(db: &Path) -> PathBuf {
    let name = db
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    db.parent()
        .unwrap_or(Path::new("."))
        .join(format!(".{name}-replicad"))
}

/// Process-wide SQLite memory settings for a daemon that holds one connection per database.
/// Call once, first thing in `main`, before any connection exists.
///
/// Each connection otherwise pre-allocates (and touches) a 20-page bulk page cache and a
/// lookaside buffer: about 150 KiB a connection, 60 MiB at 400 databases, for a connection
/// that reads a handful of pages (pages come from the files directly). Without them SQLite
/// allocates pages and small objects on demand.
#[allow(unsafe_code)]
pub fn configure_sqlite_memory() {
    use std::ffi::{c_int, c_void};
    // SAFETY: sqlite3_config may only be called before SQLite initializes and while no other
    // thread calls SQLite; `main` calls this before any thread or connection exists. Called
    // later, SQLite answers SQLITE_MISUSE and changes nothing: only memory use differs.
    unsafe {
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_PAGECACHE,
            std::ptr::null_mut::<c_void>(),
            0 as c_int,
            0 as c_int,
        );
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_LOOKASIDE,
            0 as c_int,
            0 as c_int,
        );
    }
}

/// Busy handler of the checkpoint barrier's `BEGIN IMMEDIATE` once the WAL is large. An
/// application that commits back to back frees the write lock only for microseconds between
/// its transactions, which SQLite's default handler (sleeps of 1 to 100 ms) almost never hits:
/// the checkpoint was skipped again and again until the WAL reached `truncate-page-n`, and the
/// TRUNCATE then stalled the application for seconds (3-7 s at 1 GiB). Polling every 20 us
/// for about a second catches a gap.
fn barrier_busy(attempt: i32) -> bool {
    std::thread::sleep(Duration::from_micros(20));
    attempt < BARRIER_BUSY_POLLS
}

/// Most unlocked backfill passes before a checkpoint takes the barrier.
const BACKFILL_PASSES: usize = 3;

/// Frames left past our read mark that a checkpoint copies under the barrier without another
/// unlocked pass first (about 1 MiB of 4 KiB pages: a few milliseconds of copying).
const BACKFILL_SETTLED_FRAMES: u64 = 256;

/// Backlog below which a backfill pass skips its extra unlocked steps (the seal before its
/// lock, the database file's sync after its copy): each costs fsyncs of its own, which with a
/// small backlog take longer than the locked work they save, and a longer pass lets a fast
/// writer outgrow the checkpoint (`checkpoints_keep_up_with_a_writer_committing_back_to_back`
/// reached `truncate-page-n` in most runs with the steps always on). 1,024 frames are 4 MiB
/// of 4 KiB pages; the benchmark's writer leaves 2,000-25,000 per pass.
const PASS_EXTRA_MIN_FRAMES: u64 = 1024;

/// How long a writer must have been quiet before an oversized WAL is shrunk.
const QUIET_BEFORE_SHRINK: Duration = Duration::from_millis(500);

/// Polls of [`barrier_busy`] before the checkpoint is skipped (about 1-2 s in all).
const BARRIER_BUSY_POLLS: i32 = 20_000;

fn open_connection(path: &Path) -> Result<Connection, DbError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(std::time::Duration::from_secs(1))?;
    // Our connection closing must never checkpoint or delete the WAL behind the chain.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    conn.execute_batch("PRAGMA cache_size=-256;")?;
    Ok(conn)
}

/// Opens our connection in WAL mode and starts the read transaction. Returns the page size.
fn open_pinned(path: &Path) -> Result<(Connection, u32), DbError> {
    let conn = open_connection(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Unsupported(format!(
            "{} cannot be switched to WAL mode (journal_mode is {mode})",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA wal_autocheckpoint=0;")?;
    let page_size: u32 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    begin_read(&conn)?;
    Ok((conn, page_size))
}

/// Starts the long-running read transaction that pins the WAL.
fn begin_read(conn: &Connection) -> Result<(), DbError> {
    conn.execute_batch("BEGIN")?;
    let _: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    Ok(())
}

/// Checks, after pages were read from `f` at offsets a scan found under the WAL header with
/// these salts, that they all came from that generation. SQLite writes a new generation's
/// header (new salts; salt-1 only ever increases) before its first frame, so if the header
/// is unchanged now, no frame of another generation can have been read.
fn same_generation(f: &File, salts: (u32, u32)) -> Result<(), DbError> {
    match read_wal_header(f)? {
        Some(now) if (now.salt1, now.salt2) == salts => Ok(()),
        _ => Err(DbError::WalRestartedDuringRead),
    }
}

/// (device, inode) of an open file.
fn file_id(f: &File, path: &Path) -> Result<(u64, u64), DbError> {
    let m = f.metadata().map_err(io_err("stat", path))?;
    Ok((m.dev(), m.ino()))
}

fn read_wal_header(f: &File) -> Result<Option<WalHeader>, DbError> {
    let mut h = [0u8; 32];
    match f.read_exact_at(&mut h, 0) {
        Ok(()) => Ok(WalHeader::parse(&h).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(DbError::Wal(WalError::Io(e))),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
