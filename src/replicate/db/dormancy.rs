//! Dormancy and the idle fast path: a small database whose WAL has not changed for a while
//! closes its connection (see the parent module on what waking must check), and an awake
//! one answers an idle tick from the WAL's size and salts alone.

use super::connection::{file_id, open_pinned};
#[allow(unused_imports)]
use super::*;

/// The database file's identity and last change, as stat reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
    pub(super) len: u64,
    pub(super) ino: u64,
    pub(super) mtime: (i64, i64),
    pub(super) ctime: (i64, i64),
}

impl FileStamp {
    pub(super) fn of(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::from_meta(&std::fs::metadata(path)?))
    }

    pub(super) fn from_meta(m: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            len: m.len(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// The last change is older than `margin` (so a write now would get another mtime).
    pub(super) fn settled(&self, margin: Duration) -> bool {
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
pub(super) struct Dormant {
    pub(super) db: FileStamp,
    /// None: there was no WAL file.
    pub(super) wal: Option<FileStamp>,
}

impl Dormant {
    /// The files are as they were at dormancy: one `statx` of the WAL, or two when there was
    /// none (then the database file's stamp decides). With `check_db`, a WAL that is there
    /// (an application holds a connection) is not enough: the database file's stamp must
    /// hold too, so that a file renamed over the database, copied into it or removed is seen.
    pub(super) fn unchanged(&self, db_path: &Path, wal_path: &Path, check_db: bool) -> bool {
        let db_same = || FileStamp::of(db_path).is_ok_and(|now| now == self.db);
        match (FileStamp::of(wal_path), self.wal) {
            (Ok(now), Some(wal)) => now == wal && (!check_db || db_same()),
            (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => db_same(),
            _ => false,
        }
    }
}

/// A parked database with a WAL has its database file's stamp checked at every this many
/// probes, not every one: the replace or removal of a file an application holds open is seen
/// within that many ticks, for a tenth of a `statx` per idle tick.
pub(super) const DB_CHECK_EVERY: u32 = 10;

/// The idle check of a dormant database, apart from its Db: what
/// [`crate::replicate::dormant`] runs for a parked monitor.
#[derive(Debug)]
pub struct DormantProbe {
    pub(super) path: PathBuf,
    pub(super) wal_path: PathBuf,
    pub(super) stamps: Dormant,
    pub(super) stats: Arc<DbStats>,
    /// Probes since the database file's stamp was last checked ([`DB_CHECK_EVERY`]).
    pub(super) probes: u32,
}

impl DormantProbe {
    /// The files are as they were at dormancy; counts a skipped tick when they are.
    pub fn unchanged(&mut self) -> bool {
        crate::util::test_gate::wait_at_test_gate(&self.path);
        self.probes += 1;
        let check_db = self.probes >= DB_CHECK_EVERY;
        if check_db {
            self.probes = 0;
        }
        let same = self.stamps.unchanged(&self.path, &self.wal_path, check_db);
        if same {
            self.stats.sync_skipped.fetch_add(1, Ordering::Relaxed);
        }
        same
    }

    /// The database's stats, whose health counts the probe's checks.
    pub fn stats(&self) -> Arc<DbStats> {
        self.stats.clone()
    }
}

/// How old the database file's last change must be before it is stamped for dormancy: well
/// above the kernel's coarse timestamp granularity (one jiffy, 1-10 ms).
pub(super) const STAMP_MARGIN: Duration = Duration::from_millis(50);

/// Descriptors an awake database is counted for: about five (SQLite keeps the file twice, the
/// WAL, the shared memory, the `-shm` lock probe) and a share of the headroom for staging
/// writes, sockets and replicas. `replicate` sets the budget to its open-file limit, less
/// 1024, over this.
pub const FDS_PER_AWAKE: usize = 6;

/// Open connections against a descriptor budget, shared by the databases of one Store. Every
/// database also holds one descriptor for its claim, dormant or not (counted by
/// [`AwakeBudget::count_claim`]). Above the budget, idle databases go dormant at once instead
/// of after `dormant-after`, so that thousands of databases fit the open-file limit.
#[derive(Debug)]
pub struct AwakeBudget {
    awake: AtomicUsize,
    budget: AtomicUsize,
    claims: AtomicUsize,
}

/// One database's claim counted against an [`AwakeBudget`]; uncounted when dropped.
#[derive(Debug)]
pub struct CountedClaim(Arc<AwakeBudget>);

impl Drop for CountedClaim {
    fn drop(&mut self) {
        self.0.claims.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AwakeBudget {
    /// No connection open; no limit until [`AwakeBudget::set`].
    pub fn unlimited() -> AwakeBudget {
        AwakeBudget {
            awake: AtomicUsize::new(0),
            budget: AtomicUsize::new(usize::MAX),
            claims: AtomicUsize::new(0),
        }
    }

    /// Sets how many databases may keep a connection open (less the claims' share) before
    /// idle ones go dormant early: `replicate` derives it from its open-file limit.
    pub fn set(&self, databases: usize) {
        self.budget.store(databases, Ordering::Relaxed);
    }

    /// Counts one database's claim (one descriptor) until the value is dropped.
    pub fn count_claim(self: &Arc<Self>) -> CountedClaim {
        self.claims.fetch_add(1, Ordering::Relaxed);
        CountedClaim(self.clone())
    }

    fn pressed(&self) -> bool {
        let claims = self.claims.load(Ordering::Relaxed).div_ceil(FDS_PER_AWAKE);
        self.awake.load(Ordering::Relaxed).saturating_add(claims)
            > self.budget.load(Ordering::Relaxed)
    }
}

impl Db {
    /// The budget of open connections this database counts against (its own until
    /// [`Db::share_awake_budget`]).
    pub fn awake_budget(&self) -> &Arc<AwakeBudget> {
        &self.awake
    }

    /// The phase totals this database counts into.
    pub fn phases(&self) -> &Arc<PhaseStats> {
        &self.phases
    }

    /// Counts this database's phases into `phases` (the Store's).
    pub fn share_phases(&mut self, phases: Arc<PhaseStats>) {
        self.phases = phases;
    }

    /// Marks the database as on a network or FUSE file system
    /// ([`crate::util::fsutil::on_network_fs`]): a call there may block without end, so its
    /// monitor runs even the idle check on the blocking pool and it never parks in the shared
    /// [`crate::replicate::dormant::DormantWatch`], where a hung check would hold up the others.
    pub fn set_network_fs(&mut self, on: bool) {
        self.network_fs = on;
    }

    /// [`Db::set_network_fs`].
    pub fn on_network_fs(&self) -> bool {
        self.network_fs
    }

    /// Counts this database against `budget` (the Store's, shared by its databases). Call
    /// before the first sync: a connection already open stays counted where it was.
    pub fn share_awake_budget(&mut self, budget: Arc<AwakeBudget>) {
        if self.opened().is_none() {
            self.awake = budget;
        }
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
        if self.dormant().is_none()
            && (now.duration_since(self.last_full_verify) >= self.settings.full_verify_interval
                || self.dormancy_due(now)
                || self.shrink_due(now))
        {
            return false;
        }
        self.unchanged_since_sync() && !self.checkpoint_maybe_waiting() && self.skip_tick(now)
    }

    /// While dormant and healthy: its idle check, to run away from the Db (its skipped ticks
    /// are counted on this Db's stats).
    pub fn dormant_probe(&self) -> Option<DormantProbe> {
        let stamps = self.dormant()?;
        if self.poisoned.is_some() || self.network_fs {
            return None;
        }
        Some(DormantProbe {
            path: self.path.clone(),
            wal_path: self.wal_path.clone(),
            stamps,
            stats: self.stats.clone(),
            probes: 0,
        })
    }

    /// The WAL (and, while dormant, the database file) is as the last sync left it.
    pub(super) fn unchanged_since_sync(&self) -> bool {
        if let Some(d) = self.dormant() {
            // Not parked (it is checked here at every tick): the database file at every one.
            return d.unchanged(&self.path, &self.wal_path, true);
        }
        let Some((size, salt1, salt2)) = self.fast else {
            return false;
        };
        // A file renamed over the database, or the database removed, leaves ours unlinked.
        if let Some(open) = self.opened()
            && open.db_file.metadata().is_ok_and(|m| m.nlink() == 0)
        {
            return false;
        }
        let f = match File::open(&self.wal_path) {
            Ok(f) => f,
            // Our open connection keeps the WAL from being deleted by SQLite: a missing one
            // was deleted by something else, which the sync reports.
            Err(_) => return false,
        };
        let Ok(meta) = f.metadata() else { return false };
        // Another file at the path (the WAL was deleted and a new one made): the sync says so.
        if let Some(Open {
            wal_id: Some(id), ..
        }) = self.opened()
            && (meta.dev(), meta.ino()) != *id
        {
            return false;
        }
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
    pub(super) fn skip_tick(&mut self, now: Instant) -> bool {
        if self.checkpoint_due(now) {
            return false;
        }
        self.stats.sync_skipped.fetch_add(1, Ordering::Relaxed);
        self.stats.idle.store(true, Ordering::Relaxed);
        self.idle_since.get_or_insert(now);
        true
    }

    /// The open connection, if there is one.
    pub(super) fn opened(&self) -> Option<&Open> {
        match &self.conn {
            Conn::Open(open) => Some(open),
            _ => None,
        }
    }

    /// The stamps taken at dormancy, while dormant.
    pub(super) fn dormant(&self) -> Option<Dormant> {
        match &self.conn {
            Conn::Dormant(d) => Some(*d),
            _ => None,
        }
    }

    /// Moves to `conn`, keeping the budget's count of open connections.
    fn set_conn(&mut self, conn: Conn) {
        let id = |c: &Conn| match c {
            Conn::Open(open) => Some(open.id),
            _ => None,
        };
        if let Some(old) = id(&self.conn) {
            super::held::release(old);
        }
        if let Some(new) = id(&conn) {
            super::held::hold(new);
        }
        let was = matches!(self.conn, Conn::Open(_));
        let is = matches!(conn, Conn::Open(_));
        if !was && is {
            self.awake.awake.fetch_add(1, Ordering::Relaxed);
        } else if was && !is {
            self.awake.awake.fetch_sub(1, Ordering::Relaxed);
        }
        self.conn = conn;
    }

    /// Installs a freshly opened connection (ending dormancy, if it was dormant).
    pub(super) fn install(&mut self, mut open: Open) {
        open.wal_id = std::fs::metadata(&self.wal_path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        self.set_conn(Conn::Open(open));
        self.refresh_shm_probe();
    }

    /// Drops the connection if one is open; a dormant database stays dormant.
    pub(super) fn close(&mut self) {
        if matches!(self.conn, Conn::Open(_)) {
            self.set_conn(Conn::Closed);
        }
    }

    /// Forgets the connection and any dormancy: the next sync opens the database again.
    pub(super) fn forget_conn(&mut self) {
        self.set_conn(Conn::Closed);
    }

    /// Time to close the connection: idle long enough (at once when open connections exceed
    /// the descriptor budget), small enough, and nothing pending.
    pub(super) fn dormancy_due(&self, now: Instant) -> bool {
        if self.keep_awake {
            return false;
        }
        let after = self.settings.dormant_after;
        let Some(open) = self.opened() else {
            return false;
        };
        let pressed = self.awake.pressed();
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
    pub(super) fn go_dormant(&mut self) -> Result<(), DbError> {
        self.refresh_fast_cache();
        if self.fast.is_none() {
            return Ok(());
        }
        #[cfg(test)]
        if let Some(hook) = self.hooks.before_dormant_stamps.as_mut() {
            hook();
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
        // A commit since this sync's scan is in the stamps just taken, and a later change is
        // what wakes a dormant database: the WAL must still be as the scan left it (size,
        // salts, no frame of the current generation past our mark), or that commit would wait
        // for the next one. Settled is not enough: the sync can take longer than the margin.
        if !self.unchanged_since_sync() {
            return Ok(());
        }
        // Dropping the connection ends the read transaction and closes every descriptor and
        // the shared-memory mapping (no checkpoint: SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE).
        self.set_conn(Conn::Dormant(Dormant { db, wal }));
        // Our connections are closed: the probe's descriptor may go (see `app_checkpoint`).
        self.shm = None;
        self.continuous = false;
        self.dirty_since_checkpoint = false;
        self.stats.dormant.store(true, Ordering::Relaxed);
        // The connection's page cache was freed.
        crate::util::malloc::note_freed();
        tracing::debug!(db = %self.path.display(), txid = %self.pos, "dormant");
        Ok(())
    }

    /// Reopens a dormant database: the connection and read transaction first, then the stamp
    /// comparison (a checkpoint after this point can only move frames we will read).
    pub(super) fn wake(&mut self, stamp: FileStamp) -> Result<(), DbError> {
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
        self.install(Open {
            conn,
            db_file,
            page_size,
            id,
            wal_id: None,
        });
        self.continuous = false;
        self.stats.dormant.store(false, Ordering::Relaxed);
        self.stats.wakes.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(db = %self.path.display(), unchanged = self.woke_unchanged, "woke");
        Ok(())
    }
}

#[cfg(test)]
impl DormantProbe {
    /// The probe of a database at `path` that has no WAL, stamped as it is now (the watch's
    /// tests).
    pub(crate) fn of_file(path: &Path) -> DormantProbe {
        DormantProbe {
            path: path.to_path_buf(),
            wal_path: PathBuf::from(format!("{}-wal", path.display())),
            stamps: Dormant {
                db: FileStamp::of(path).expect("the test created the file"),
                wal: None,
            },
            stats: Arc::default(),
            probes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Claims take their descriptors from the budget: six of them cost one awake database.
    #[test]
    fn claims_count_against_the_descriptor_budget() {
        let budget = Arc::new(AwakeBudget::unlimited());
        budget.set(2);
        budget.awake.store(1, Ordering::Relaxed);
        let claims: Vec<_> = (0..FDS_PER_AWAKE).map(|_| budget.count_claim()).collect();
        assert!(!budget.pressed(), "one awake and six claims fit two");
        let seventh = budget.count_claim();
        assert!(budget.pressed(), "one awake and seven claims do not");
        drop(seventh);
        drop(claims);
        budget.awake.store(2, Ordering::Relaxed);
        assert!(!budget.pressed(), "claims uncounted when dropped");
    }
}
