//! A WAL deleted under an open database (invariant 8 of the parent module): how it is noticed,
//! and when replicad may open the database again.
//!
//! SQLite deletes a WAL only when the connection closing is the last one, so while ours is
//! open the WAL at the path is the file it opened. Another file there, or none, means a
//! cleanup script or a copy deleted it: the application's open connections go on committing
//! into the deleted file, which no new connection (and no sync of ours) can read. Ours closes
//! at once, because its SHARED lock would keep the application's last connection from
//! copying the deleted file into the database on close. Opening again is safe only once no
//! process uses the deleted file: a copy taken sooner would miss, or read as zeroes, the
//! frames its index points at.

use std::collections::BTreeSet;

use super::shm::ShmProbe;
#[allow(unused_imports)]
use super::*;

/// A WAL lost under an open database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LostWal {
    /// "deleted", or "deleted (another file is at its path now)".
    pub(super) what: &'static str,
    /// (device, inode) of the lost file, when known (it was lost while our connection was
    /// open; not when it was found lost before we opened).
    pub(super) id: Option<(u64, u64)>,
}

/// SQLite's unix VFS takes its SHARED lock as a read lock on these bytes of the database
/// file (`SHARED_FIRST`, `SHARED_SIZE`); a connection in WAL mode holds it while open.
const SHARED_FIRST: i64 = 0x4000_0000 + 2;
const SHARED_SIZE: i64 = 510;

/// How long a WAL missing beside an index in use must stay missing before it counts as lost:
/// an application's last connection deletes its WAL a moment before its `-shm`.
const CONFIRM_MISSING: Duration = Duration::from_millis(20);

/// Another process holds SQLite's SHARED lock on `f` (one `F_GETLK`; an error reads as held).
#[allow(unsafe_code)]
fn shared_lock_held(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` is plain old data, for which all-zero bytes are a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = SHARED_FIRST;
    fl.l_len = SHARED_SIZE;
    // SAFETY: the descriptor is open for the call, and F_GETLK only writes the `flock` it is
    // given, which outlives the call.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) };
    rc != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
}

/// Whether a process other than this one that holds a lock on the file with inode `ino` may
/// have the lost WAL open: the file `lost` when known, else a deleted file named `name`. The
/// holders come from `/proc/locks` (matched by inode alone: overlay filesystems report
/// another device there), their descriptors from `/proc/PID/fd`. Anything unreadable
/// (another user's process, a process in another PID namespace, no `/proc`) counts as "may".
fn open_elsewhere(ino: u64, lost: Option<(u64, u64)>, name: &std::ffi::OsStr) -> bool {
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return true;
    };
    let me = std::process::id();
    let ino = format!(":{ino}");
    // "1: POSIX  ADVISORY  READ 1234 08:01:5678 1073741826 1073742335" (a blocked waiter's
    // line has "->" before its type).
    let pids: BTreeSet<u32> = locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let at = f.iter().position(|x| x.matches(':').count() == 2)?;
            f[at].ends_with(&ino).then(|| f.get(at - 1)?.parse().ok())?
        })
        .filter(|p| *p != me)
        .collect();
    let mut deleted = name.to_owned();
    deleted.push(" (deleted)");
    let is_lost = |fd: &Path| match lost {
        Some(id) => std::fs::metadata(fd).is_ok_and(|m| (m.dev(), m.ino()) == id),
        // The link names the file as its process sees it; only the name is the same in
        // another mount namespace.
        None => std::fs::read_link(fd).is_ok_and(|t| t.file_name() == Some(&deleted)),
    };
    pids.iter()
        .any(|pid| match std::fs::read_dir(format!("/proc/{pid}/fd")) {
            Err(_) => true,
            Ok(fds) => fds.flatten().any(|e| is_lost(&e.path())),
        })
}

impl Db {
    /// Notices a lost WAL, and keeps the database closed while the lost file may be in use
    /// ([`DbError::WalLost`]); once it is not, the next open writes a full segment.
    pub(super) fn check_wal(&mut self) -> Result<(), DbError> {
        if self.wal_lost.is_none() {
            let lost = match self.opened() {
                Some(_) => self.wal_swapped()?,
                None => self.wal_missing_before_open(),
            };
            if let Some(lost) = lost {
                tracing::error!(db = %self.path.display(), wal = %self.wal_path.display(), txid = %self.pos,
                    "the WAL file was {} while the application had the database open: commits only in it are missing from the database file unless the application's last connection copies them in on close. The replicas hold those replicad had shipped, up to TXID {} (`replicad restore --txid {}` brings them back)",
                    lost.what, self.pos, self.pos);
                self.reopen("WAL file lost under the application");
                self.wal_lost = Some(lost);
            }
        }
        let Some(lost) = self.wal_lost else {
            return Ok(());
        };
        if !self.wal_settled(lost) {
            return Err(DbError::WalLost {
                path: self.wal_path.clone(),
                what: lost.what,
            });
        }
        tracing::info!(db = %self.path.display(), "no process has the lost WAL open any more: opening the database again, the next segment is a full copy");
        self.wal_lost = None;
        Ok(())
    }

    /// With our connection open: the WAL at the path is no longer the file it opened.
    pub(super) fn wal_swapped(&self) -> Result<Option<LostWal>, DbError> {
        let Some(Open {
            wal_id: Some(id), ..
        }) = self.opened()
        else {
            return Ok(None);
        };
        let what = match std::fs::metadata(&self.wal_path) {
            Ok(m) if (m.dev(), m.ino()) == *id => return Ok(None),
            Ok(_) => "deleted (another file is at its path now)",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "deleted",
            Err(e) => return Err(io_err("stat", &self.wal_path)(e)),
        };
        Ok(Some(LostWal {
            what,
            id: Some(*id),
        }))
    }

    /// Before our connection opens: another process uses the `-shm` at the path, whose index
    /// holds frames, but no WAL is at the path (it was deleted while replicad had the
    /// database closed: dormant, or not running).
    pub(super) fn wal_missing_before_open(&self) -> Option<LostWal> {
        let missing = || {
            matches!(std::fs::symlink_metadata(&self.wal_path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
                && ShmProbe::open(&self.path).is_some_and(|p| {
                    p.in_use() && p.index_header().is_some_and(|h| h.max_frame > 0)
                })
        };
        if !missing() {
            return None;
        }
        std::thread::sleep(CONFIRM_MISSING);
        missing().then_some(LostWal {
            what: "deleted",
            id: None,
        })
    }

    /// With our connection closed, after a lost WAL: no process can still use the lost file.
    /// Either no other process has the database open (its last connection copied the lost
    /// WAL into the database on close), or none of those that do has the lost file open.
    pub(super) fn wal_settled(&self, lost: LostWal) -> bool {
        let Ok(db) = File::open(&self.path) else {
            // Gone or unreadable: the reopen reports it.
            return true;
        };
        // Closing `db` drops this process's locks on the file: none, with our connection
        // closed.
        let shared = shared_lock_held(&db);
        let ino = db.metadata().map(|m| m.ino());
        drop(db);
        if !shared {
            return true;
        }
        let name = self.wal_path.file_name().unwrap_or_default();
        ino.is_ok_and(|ino| !open_elsewhere(ino, lost.id, name))
    }
}
