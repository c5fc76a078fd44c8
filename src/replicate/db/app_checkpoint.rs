//! Yielding to an application's own checkpoint.
//!
//! An application's `PRAGMA wal_checkpoint(FULL|RESTART|TRUNCATE)` takes SQLite's checkpoint
//! and write locks, then waits in its busy handler for every reader behind the WAL's end
//! (FULL), and after copying for every reader at all (RESTART, TRUNCATE). Our read
//! transaction, held at all times (invariant 3 of the parent module), is such a reader: left
//! alone, the application waits out its whole busy timeout and gets `SQLITE_BUSY`.
//!
//! So each tick of an open database asks the kernel who holds those locks: one `F_GETLK` on
//! the checkpoint lock's byte of the `-shm` file, and one more on the write lock's when the
//! first is held. Both held by another process is a blocking checkpoint. Then the Db:
//! 1. seals every committed frame (nothing can commit while the checkpoint holds the write
//!    lock, so the seal reaches the WAL's end);
//! 2. ends its read transaction and waits, polling the locks every millisecond for at most
//!    [`YIELD_WAIT`], until the checkpoint is over;
//! 3. begins its read transaction again and, until it has proven continuity, does not take
//!    a later WAL generation as following its mark (`after_yield`):
//!    - the WAL's salts unchanged: no restart happened, every frame past our mark is still
//!      there and is new; they are sealed at once;
//!    - the salts changed (or the WAL is gone): frames past our mark may have been
//!      checkpointed and overwritten. The database file is read whole: if it holds exactly
//!      the state at our position (its checksum is our post-apply checksum, same page count),
//!      every frame of the current generation applies on top of it and the chain goes on;
//!      otherwise, and always with the `lz4` codec (it keeps no checksums), the next segment
//!      is a full one (invariant 1).
//!
//! The probe only reads lock state (no lock is taken). Its descriptor must outlive every
//! connection of ours to the database: closing any descriptor of a file drops every POSIX
//! lock this process holds on it, SQLite's included. So it is opened with the first
//! connection, kept across reopens, and closed only when the database goes dormant or the
//! Db is dropped, both after our connections are closed.

use std::os::fd::AsRawFd;

use super::connection::begin_read;

#[allow(unused_imports)]
use super::*;

/// Longest a yield waits for the application's checkpoint to end. Nothing can commit while
/// it holds the write lock, so the wait delays no replication; the bound keeps the monitor
/// responsive when the checkpoint stays blocked by a reader of the application's own.
pub(super) const YIELD_WAIT: Duration = Duration::from_secs(3);

/// Offset of SQLite's WAL lock bytes in the `-shm` file (unix VFS: `UNIX_SHM_BASE`).
const SHM_LOCK_BASE: i64 = 120;
/// `WAL_WRITE_LOCK` and `WAL_CKPT_LOCK`, as offsets from [`SHM_LOCK_BASE`].
const WRITE_LOCK: i64 = 0;
const CKPT_LOCK: i64 = 1;

/// The `-shm` file, open only to ask who holds SQLite's WAL locks (see the module doc on
/// when it may be closed).
#[derive(Debug)]
pub(super) struct ShmProbe {
    file: File,
    ino: u64,
}

impl ShmProbe {
    /// Opens the `-shm` file of `db`; None when there is none (a database in exclusive
    /// locking mode keeps its index in heap memory, and no other process can checkpoint).
    pub(super) fn open(db: &Path) -> Option<ShmProbe> {
        let file = File::open(shm_path(db)).ok()?;
        let ino = file.metadata().ok()?.ino();
        Some(ShmProbe { file, ino })
    }

    /// Still the file at the path (a replaced database may come with a new `-shm`).
    pub(super) fn current(&self, db: &Path) -> bool {
        std::fs::metadata(shm_path(db)).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Another process holds the WAL lock at `lock` (one `F_GETLK`; locks of this process
    /// never count, by POSIX rules). An error reads as "not held": the yield is an
    /// optimisation for the application, never needed for correctness.
    #[allow(unsafe_code)]
    fn held_by_other(&self, lock: i64) -> bool {
        // SAFETY: `flock` is plain old data, for which all-zero bytes are a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = SHM_LOCK_BASE + lock;
        fl.l_len = 1;
        // SAFETY: the descriptor is open for the life of `self`, and F_GETLK only writes the
        // `flock` it is given, which outlives the call.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLK, &mut fl) };
        rc == 0 && fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// A checkpoint of another process holds the checkpoint and write locks: FULL, RESTART
    /// or TRUNCATE (a PASSIVE one takes no write lock and never waits for us).
    pub(super) fn blocking_checkpoint(&self) -> bool {
        self.held_by_other(CKPT_LOCK) && self.held_by_other(WRITE_LOCK)
    }
}

fn shm_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-shm");
    PathBuf::from(p)
}

impl Db {
    /// Opens the `-shm` probe if there is none, or the one open is no longer the file at the
    /// path. Call with our connection open (it creates the `-shm`).
    pub(super) fn refresh_shm_probe(&mut self) {
        if self.shm.as_ref().is_none_or(|p| !p.current(&self.path)) {
            // Dropping a stale probe is safe: it is another file than SQLite's current one.
            self.shm = ShmProbe::open(&self.path);
        }
    }

    /// Another process's checkpoint is waiting for readers (ours among them).
    pub(super) fn checkpoint_waiting(&self) -> bool {
        self.opened().is_some() && self.shm.as_ref().is_some_and(ShmProbe::blocking_checkpoint)
    }

    /// Steps out of an application's checkpoint's way (module doc). Returns segments written.
    pub(super) fn yield_to_checkpoint(&mut self) -> Result<usize, DbError> {
        let mut written = self.seal()?;
        // From here until a seal proves continuity, a new WAL generation is not taken as
        // following our mark.
        self.after_yield = true;
        let conn = self.end_read()?;
        let started = Instant::now();
        while started.elapsed() < YIELD_WAIT && self.checkpoint_waiting() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited_ms = started.elapsed().as_millis();
        if let Err(e) = begin_read(conn) {
            self.reopen_after_lost_read();
            return Err(e);
        }
        self.stats.checkpoint_yields.fetch_add(1, Ordering::Relaxed);
        written += self.seal()?;
        tracing::debug!(db = %self.path.display(), waited_ms, txid = %self.pos, "yielded to an application checkpoint");
        Ok(written)
    }

    /// After a yield, the WAL is of another generation than our mark (or gone): continue on
    /// it only if the database file holds exactly the state at our position, else write a
    /// full segment. Returns whether a segment was written.
    pub(super) fn rebase_after_yield(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
    ) -> Result<bool, DbError> {
        if self.checksums && self.post != 0 {
            let commit = self.commit;
            self.build_table(None)?;
            if self.sum.value() == self.post && self.current_commit(None)? == commit {
                self.mark = header.map(|h| WalMark {
                    salt1: h.salt1,
                    salt2: h.salt2,
                    offset: WAL_HEADER_SIZE,
                });
                self.after_yield = false;
                self.stats.yield_rebases.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(db = %self.path.display(), txid = %self.pos, "WAL restarted by an application checkpoint; the database file holds our position, continuing on the new WAL");
                return Ok(false);
            }
        }
        // The flag stays set until this succeeds: a failed attempt must not let the next
        // sync take the new generation as following our mark.
        let wrote = self.write_full(
            wal_file,
            header,
            "wal restarted by an application checkpoint",
        )?;
        self.after_yield = false;
        Ok(wrote)
    }
}
