//! The `-shm` file seen from outside SQLite: who holds its WAL lock bytes (`F_GETLK`), the
//! wal-index header, and the checkpoint lock held for a moment by this process.
//!
//! Its descriptor must outlive every connection of ours to the database: closing any
//! descriptor of a file drops every POSIX lock this process holds on it, SQLite's included.
//! So it is opened with the first connection, kept across reopens, replaced only by a file
//! with another inode, and closed only when the database goes dormant or the Db is dropped,
//! both after our connections are closed. (A program that embeds `Db` must not open the
//! database itself in the same process for the same reason.)

use std::os::fd::AsRawFd;

#[allow(unused_imports)]
use super::*;

/// How long both locks must stay held before a checkpoint counts as blocked on readers.
const CONFIRM_AFTER: Duration = Duration::from_millis(2);

/// Tries of [`ShmProbe::hold_checkpoint_lock`] (about 2 ms in all).
const HOLD_TRIES: u32 = 40;

/// Offset of SQLite's WAL lock bytes in the `-shm` file (unix VFS: `UNIX_SHM_BASE`).
const SHM_LOCK_BASE: i64 = 120;
/// `WAL_WRITE_LOCK` and `WAL_CKPT_LOCK`, as offsets from [`SHM_LOCK_BASE`].
const WRITE_LOCK: i64 = 0;
const CKPT_LOCK: i64 = 1;
/// The dead-man switch every connection using the file holds shared (`UNIX_SHM_DMS`).
const DMS_LOCK: i64 = 8;

/// The wal-index header's fields a yield compares (`WalIndexHdr` in SQLite's wal.c: native
/// byte order, salts as in the WAL file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexHeader {
    /// Incremented at each commit (a restart leaves it).
    pub(super) change: u32,
    /// Valid frames in the WAL.
    pub(super) max_frame: u32,
    pub(super) salt1: u32,
    pub(super) salt2: u32,
}

/// The `-shm` file, open only to ask who holds SQLite's WAL locks and to read the wal-index
/// header (see the module doc on when it may be closed).
#[derive(Debug)]
pub(super) struct ShmProbe {
    /// Read-write when allowed (only [`ShmProbe::hold_checkpoint_lock`] needs it).
    file: File,
    writable: bool,
    /// None when `fstat` failed: then the probe is never replaced (it may be SQLite's file).
    ino: Option<u64>,
}

impl ShmProbe {
    /// Opens the `-shm` file of `db`; None when there is none (a database in exclusive
    /// locking mode keeps its index in heap memory, and no other process can checkpoint).
    pub(super) fn open(db: &Path) -> Option<ShmProbe> {
        let path = shm_path(db);
        let (file, writable) = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => (f, true),
            // No `-shm`: the common case before a database's first open (and at every tick
            // of one that is missing), not worth a second try.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(_) => (File::open(&path).ok()?, false),
        };
        let ino = file.metadata().ok().map(|m| m.ino());
        Some(ShmProbe {
            file,
            writable,
            ino,
        })
    }

    /// Another file is at the path now (a replaced database may come with a new `-shm`).
    /// False when unsure: closing a descriptor of SQLite's current file would drop its locks.
    pub(super) fn replaced(&self, db: &Path) -> bool {
        match (self.ino, std::fs::metadata(shm_path(db))) {
            (Some(ino), Ok(m)) => m.ino() != ino,
            _ => false,
        }
    }

    /// The process holding the WAL lock at `lock` when it is another one (one `F_GETLK`;
    /// locks of this process never count, by POSIX rules). An error reads as "not held": the
    /// yield is an optimisation for the application, never needed for correctness.
    fn holder(&self, lock: i64) -> Option<libc::pid_t> {
        conflicting_lock(&self.file, SHM_LOCK_BASE + lock, 1)
            .ok()
            .flatten()
    }

    /// Takes SQLite's checkpoint lock for this process if no one holds it (one `F_SETLK`),
    /// so that another process's checkpoint, such as the application's auto-checkpoint after
    /// a commit, stays out until ours has taken it: our PASSIVE checkpoint's own lock is the
    /// same process's lock, and SQLite's unlock after it releases this one too. False when
    /// not taken (held elsewhere, or the file is read-only to us).
    /// Retries for up to [`HOLD_TRIES`] x 50 us: the application's auto-checkpoint takes the
    /// lock after each of its commits, mostly for a moment (it copies nothing past our mark).
    pub(super) fn hold_checkpoint_lock(&self) -> bool {
        if !self.writable {
            return false;
        }
        for _ in 0..HOLD_TRIES {
            match self.set_lock(CKPT_LOCK, libc::F_WRLCK) {
                Ok(()) => return true,
                // Held by another process: it lets go in a moment, or we go on without.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Releases [`ShmProbe::hold_checkpoint_lock`]'s lock when no checkpoint of ours took
    /// it over (call only with no checkpoint of ours running).
    pub(super) fn release_checkpoint_lock(&self) {
        // Failure leaves nothing held that SQLite's next unlock of the byte would not drop.
        let _ = self.set_lock(CKPT_LOCK, libc::F_UNLCK);
    }

    #[allow(unsafe_code)]
    fn set_lock(&self, lock: i64, kind: libc::c_int) -> std::io::Result<()> {
        // SAFETY: `flock` is plain old data, for which all-zero bytes are a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = SHM_LOCK_BASE + lock;
        fl.l_len = 1;
        // SAFETY: the descriptor is open for the life of `self`; F_SETLK only reads `fl`.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLK, &fl) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Another process has a connection using this wal-index.
    pub(super) fn in_use(&self) -> bool {
        self.holder(DMS_LOCK).is_some()
    }

    /// One process holds both the checkpoint and the write lock: a FULL, RESTART or TRUNCATE
    /// checkpoint, or a commit beside a PASSIVE checkpoint (see [`ShmProbe::blocked`]).
    pub(super) fn both_held(&self) -> bool {
        self.holder(CKPT_LOCK)
            .is_some_and(|pid| self.holder(WRITE_LOCK) == Some(pid))
    }

    /// A checkpoint of another process waits for readers: both locks held by one process,
    /// and still held a moment later.
    pub(super) fn blocked(&self) -> bool {
        if !self.both_held() {
            return false;
        }
        std::thread::sleep(CONFIRM_AFTER);
        self.both_held()
    }

    /// The wal-index header, when both copies agree and its checksum holds, as SQLite's own
    /// readers require (`walIndexTryHdr`): SQLite writes the second copy first, so equal
    /// copies with a valid checksum are a whole header.
    pub(super) fn index_header(&self) -> Option<IndexHeader> {
        let mut b = [0u8; 96];
        self.file.read_exact_at(&mut b, 0).ok()?;
        let init = b[12] == 1;
        if !init || b[..48] != b[48..] {
            return None;
        }
        let ne = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        // `walChecksumBytes` in native order over the 40 bytes before the checksum.
        let (mut s1, mut s2) = (0u32, 0u32);
        for o in (0..40).step_by(8) {
            s1 = s1.wrapping_add(ne(o)).wrapping_add(s2);
            s2 = s2.wrapping_add(ne(o + 4)).wrapping_add(s1);
        }
        if (s1, s2) != (ne(40), ne(44)) {
            return None;
        }
        let be = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Some(IndexHeader {
            change: ne(8),
            max_frame: ne(16),
            salt1: be(32),
            salt2: be(36),
        })
    }
}

/// The process holding a lock on `len` bytes of `f` from `start` that a write lock would
/// conflict with, when it is another one (one `F_GETLK`; this process's own locks never
/// count, by POSIX rules).
#[allow(unsafe_code)]
pub(super) fn conflicting_lock(
    f: &File,
    start: i64,
    len: i64,
) -> std::io::Result<Option<libc::pid_t>> {
    // SAFETY: `flock` is plain old data, for which all-zero bytes are a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: the descriptor is open for the call, and F_GETLK only writes the `flock` it is
    // given, which outlives the call.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then_some(fl.l_pid))
}

fn shm_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-shm");
    PathBuf::from(p)
}

impl Db {
    /// Opens the `-shm` probe if there is none, or the one open is of a replaced file. Called
    /// with our connection open (which creates the `-shm`), or before it opens, to read the
    /// index of the application's (see `lost_wal`).
    pub(super) fn refresh_shm_probe(&mut self) {
        if self.shm.as_ref().is_none_or(|p| p.replaced(&self.path)) {
            // Dropping a replaced probe is safe: it is another file than SQLite's current one.
            self.shm = ShmProbe::open(&self.path);
        }
    }
}
