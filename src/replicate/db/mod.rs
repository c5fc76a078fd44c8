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
//!    runs without it but stops at our read mark, which is never past the sealed frames: it
//!    moves either under that lock right after a seal, or by a leapfrog (a second connection
//!    of ours begins its read, a seal reaches its mark, then the old read ends). The
//!    exceptions: invariant 7's yield, which proves afterwards that nothing was lost, and our
//!    TRUNCATE, which runs without our read and may copy commits that landed after its seal:
//!    when it truncated, a full segment follows; when a reader kept it from resetting the
//!    WAL, those commits are sealed under the write lock again (the WAL's generation checked
//!    there) before the chain goes on, so no restart can come before they are staged.
//! 3. While the process runs, one of our connections holds a read transaction at all times
//!    except inside that write-locked window and a yield (invariant 7), so the WAL
//!    generation changes only when we allow it. (Begun on a completely checkpointed WAL it
//!    reads the database file alone, SQLite's read mark 0: the next write may then restart
//!    the WAL once, but no frame after it can be checkpointed while we read, so not twice.
//!    Only an application's TRUNCATE or RESTART checkpoints, with no write between them, can
//!    restart the empty WAL again: salt-1 then moves by 2, and the chain takes a full segment.)
//! 4. Segments carry real pre/post-apply database checksums when the codec is not
//!    Litestream's (`lz4`): the per-page checksum table is kept in memory (8 bytes a page).
//! 5. A failed local write or fsync never builds on what it may have left behind: the Db
//!    forgets its connection, read transaction and WAL mark, and its next sync (paced by the
//!    monitor's backoff) reopens the database and writes a *full* segment at the next TXID.
//!    The same happens when the database file is replaced (a new inode at its path). A
//!    position never goes back: the reopened Db continues after the highest TXID it staged.
//! 6. A segment's WAL pages all come from the generation its scan saw: the WAL header's salts
//!    are read again after the pages, and a restart in between drops the segment.
//! 7. An application's FULL, RESTART or TRUNCATE checkpoint waits on our read transaction
//!    for one monitor tick at most: the Db seals, steps aside while it runs, and proves
//!    continuity before it takes a new WAL generation as following its mark
//!    (`app_checkpoint`).
//! 8. While our connection is open, the WAL at the path is the file it opened: SQLite deletes
//!    a WAL only on the last connection's close. Another file there, or none, means something
//!    else deleted it under the application ([`DbError::WalLost`]): our connection closes at
//!    once, so that the application's last one can checkpoint the lost file on close, and
//!    reopens, with a full segment, only once no other process uses a WAL but the one at
//!    the path; a copy taken sooner would read the lost frames as zeroes.
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
use crate::util::phase::{Phase, PhaseStats, duration_nanos};

mod app_checkpoint;
mod checkpoint;
mod connection;
mod dormancy;
mod encode;
mod held;
mod lost_wal;
mod seed;
mod segment;
mod shm;
mod sync;
pub use connection::configure_sqlite_memory;
use dormancy::Dormant;
pub use dormancy::{AwakeBudget, CountedClaim, DormantProbe, FDS_PER_AWAKE};
pub use held::is_held;
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
    /// The same time on [`crate::util::clock::steady_ms`]'s clock (0: none), read when the
    /// segment was published: how long it has waited is measured on it, so that a step of
    /// the wall clock neither hides nor invents lag.
    pub steady_ms: i64,
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
    /// TRUNCATE checkpoints that a reader kept from resetting the WAL (not counted above).
    pub truncate_blocked: AtomicU64,
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
    /// 1 while an inotify watch wakes the monitor on each WAL write
    /// ([`crate::replicate::walwatch`]); 0 while commits are found by polling.
    pub commit_watched: AtomicBool,
    /// Times the database stepped out of the way of an application's FULL, RESTART or
    /// TRUNCATE checkpoint (`app_checkpoint`).
    pub checkpoint_yields: AtomicU64,
    /// Yields that found the WAL restarted without an index proof and continued the chain
    /// on the new WAL (the database file held our position) instead of a full segment.
    pub yield_rebases: AtomicU64,
    /// Yields whose continuity the wal-index header proved (no read of the database file).
    pub yield_index_proofs: AtomicU64,
    /// Yields that gave up waiting for the checkpoint after `YIELD_WAIT` (it was held up by
    /// something else, such as a reader of the application's).
    pub yield_timeouts: AtomicU64,
    /// Whether the database is protected (the monitor's last sync succeeded), else why not.
    pub health: crate::replicate::health::HealthCell,
    /// Since when ([`crate::util::clock::steady_ms`]) a tick has found changes that wait for
    /// `min-sync-interval`; 0 when none wait. The replicas' lag counts only what was synced.
    pub held_since_ms: AtomicU64,
}

impl AsRef<crate::replicate::health::HealthCell> for DbStats {
    fn as_ref(&self) -> &crate::replicate::health::HealthCell {
        &self.health
    }
}

impl DbStats {
    /// Seconds the newest changes have waited for `min-sync-interval` (0 when none wait).
    pub fn held_seconds(&self) -> f64 {
        match self
            .held_since_ms
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => 0.0,
            since => {
                crate::util::clock::steady_ms()
                    .saturating_sub(since as i64)
                    .max(0) as f64
                    / 1000.0
            }
        }
    }
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
    /// The WAL file was deleted while the application had the database open (`lost_wal`).
    #[error(
        "the WAL file {path} was {what} while the database was open, by something other than \
         SQLite: the application's open connections commit into a file that no new connection \
         and no backup can read, and those commits are lost unless its last connection \
         copies them into the database on close. Close every connection of the application \
         (replicad has closed its own); replication resumes with a full copy once no process \
         has the deleted file open"
    )]
    WalLost {
        /// The WAL's path.
        path: PathBuf,
        /// "deleted", or "deleted (another file is at its path now)".
        what: &'static str,
    },
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

/// The state of a [`Db`]'s SQLite connection.
enum Conn {
    /// None: before the first sync, or after a failure or a replaced file (the next sync
    /// opens the database again).
    Closed,
    /// The pinned connection, holding the read transaction.
    Open(Open),
    /// Closed while idle: the stamps taken then decide how the database wakes.
    Dormant(Dormant),
}

struct Open {
    conn: Connection,
    db_file: File,
    page_size: u32,
    /// (device, inode) of the file opened: another one at the path means it was replaced.
    id: (u64, u64),
    /// (device, inode) of the WAL when the connection was installed (our connection in WAL
    /// mode creates it, and no one else's closing may delete it while ours is open).
    wal_id: Option<(u64, u64)>,
}

/// Full segments of at least this many page bytes are announced on the segment feed while
/// they are written (smaller ones upload in a blink once staged).
const STREAM_MIN_BYTES: u64 = 16 * 1024 * 1024;

/// One replicated database.
pub struct Db {
    /// The open-connection budget counted against (see [`AwakeBudget`]).
    awake: Arc<AwakeBudget>,
    /// Phase totals counted into (its own until [`Db::share_phases`]).
    phases: Arc<PhaseStats>,
    path: PathBuf,
    wal_path: PathBuf,
    staging_dir: PathBuf,
    settings: DbSettings,
    codec: Codec,
    checksums: bool,
    /// The SQLite connection: closed, open (holding the read transaction) or dormant.
    conn: Conn,
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
    /// Since when TRUNCATE checkpoints have found the WAL held by a reader (said once), and
    /// when the last one was tried.
    truncate_blocked: Option<(Instant, Instant)>,
    /// Segments the last sync's checkpoint wrote for itself (its restart write, the full
    /// segment after a TRUNCATE): not a commit the application is waiting on, so they do not
    /// pace the next sync. Its seals of the application's frames are not counted here.
    checkpoint_segments: usize,
    poisoned: Option<String>,
    /// The WAL was deleted under the application: our connection stays closed until no
    /// process uses the lost file ([`lost_wal`]).
    wal_lost: Option<lost_wal::LostWal>,
    /// Start of the current run of idle ticks.
    idle_since: Option<Instant>,
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
    /// Set by a yield to an application's checkpoint until a seal proves continuity: a WAL
    /// generation other than the mark's is then not taken as following it.
    after_yield: bool,
    /// Set when a yield proved that the WAL restarted right after our mark and nothing was
    /// committed in between, before the new generation's header was written (its salts may
    /// be random): the next generation seen follows the mark, whatever its salts.
    next_gen_follows: bool,
    /// After a yield proved that a restarted generation follows the mark: where its last
    /// frame counted ends. `after_yield` stays set until a seal reaches it.
    yield_seal_to: Option<u64>,
    /// On a network or FUSE file system ([`Db::set_network_fs`]).
    network_fs: bool,
    /// Tests: work run at a point of a race (a commit there).
    #[cfg(test)]
    hooks: TestHooks,
    /// Who holds SQLite's WAL locks ([`app_checkpoint`]). Declared last so that it closes
    /// after the connection (closing it drops this process's locks on the `-shm` file).
    shm: Option<shm::ShmProbe>,
}

/// Work a test runs at a point of a race, to make it happen every time.
#[cfg(test)]
#[derive(Default)]
struct TestHooks {
    /// Between our checkpoint's unlock and its TRUNCATE.
    before_truncate: Option<Box<dyn FnMut() + Send>>,
    /// Between the last look at the WAL and the stamps a database goes dormant with.
    before_dormant_stamps: Option<Box<dyn FnMut() + Send>>,
    /// Syncs that started from scratch (`startup_sync`), which read the whole database.
    startup_syncs: usize,
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
            awake: Arc::new(AwakeBudget::unlimited()),
            phases: Arc::default(),
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
            conn: Conn::Closed,
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
            truncate_blocked: None,
            checkpoint_segments: 0,
            poisoned: None,
            network_fs: false,
            #[cfg(test)]
            hooks: TestHooks::default(),
            wal_lost: None,
            idle_since: None,
            woke_unchanged: false,
            pos_tx,
            feed: SegmentFeed::default(),
            stats: Arc::new(DbStats::default()),
            page_buf: Vec::new(),
            after_yield: false,
            next_gen_follows: false,
            yield_seal_to: None,
            shm: None,
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

    /// Of the segments the last sync wrote, those its checkpoint wrote (see
    /// `checkpoint_segments`): the monitor paces the next sync after the others only.
    pub fn checkpoint_segments(&self) -> usize {
        self.checkpoint_segments
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

    fn page_size_or(&self, default: u32) -> u32 {
        if self.page_buf.is_empty() {
            default
        } else {
            self.page_buf.len() as u32
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.close();
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
