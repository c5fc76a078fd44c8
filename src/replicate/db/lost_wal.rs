//! A WAL deleted under an open database (invariant 8 of the parent module): how it is noticed,
//! and when replicad may open the database again.
//!
//! SQLite deletes a WAL only when the connection closing is the last one, so while ours is
//! open the WAL at the path is the file it opened. Another file there, or none, means a
//! cleanup script or a copy deleted it: the application's open connections go on committing
//! into the deleted file, which no new connection (and no sync of ours) can read. Ours closes
//! at once, because its SHARED lock would keep the application's last connection from
//! copying the deleted file into the database on close. With ours closed (dormant, or before
//! the first open) the sign is the `-shm`: in use, its index holding frames, but no WAL with
//! its salts at the path.
//!
//! Opening again waits until no process that may have the deleted file open holds the
//! database, and the index in use (if any) describes the WAL at the path: a copy taken sooner
//! would miss the frames the index points at, or read them as zeroes.

use std::collections::BTreeSet;

use super::connection::read_wal_header;
use super::shm::conflicting_lock;
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
    /// When it was noticed, on the boot clock: a process started later cannot have it open.
    pub(super) noticed: Duration,
}

/// SQLite's unix VFS takes its SHARED lock as a read lock on these bytes of the database
/// file (`SHARED_FIRST`, `SHARED_SIZE`); a connection in WAL mode holds it while open.
const SHARED_FIRST: i64 = 0x4000_0000 + 2;
const SHARED_SIZE: i64 = 510;

/// How long a WAL must stay lost, seen from the `-shm`, before it counts: the index and the
/// WAL are written one after the other, never as one.
const CONFIRM: Duration = Duration::from_millis(20);

/// The `-shm` index in use, against the WAL at the path.
#[derive(Debug, PartialEq, Eq)]
enum Index {
    /// No other process uses a `-shm` (or none is there): whoever opens next rebuilds the
    /// index from the WAL at the path.
    Free,
    /// It describes the WAL at the path (or no frame at all).
    Matches,
    /// It holds frames, and the WAL at the path is not theirs.
    Lost(&'static str),
    /// Torn or unreadable: look again later.
    Unknown,
}

impl Db {
    /// Notices a lost WAL, and keeps the database closed while the lost file may be in use
    /// ([`DbError::WalLost`]); once it is not, the next open writes a full segment.
    pub(super) fn check_wal(&mut self) -> Result<(), DbError> {
        if self.wal_lost.is_none() {
            let lost = match self.opened() {
                Some(_) => self.wal_swapped()?,
                None => self.wal_lost_before_open(),
            };
            if let Some(lost) = lost {
                tracing::error!(db = %self.path.display(), wal = %self.wal_path.display(), txid = %self.pos,
                    "the WAL file was {} while the application had the database open: commits only in it are missing from the database file unless the application's last connection copies them in on close. replicad had staged up to TXID {}; the replicas hold what they uploaded of it (`replicad restore --txid` brings those commits back)",
                    lost.what, self.pos);
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
    fn wal_swapped(&self) -> Result<Option<LostWal>, DbError> {
        let Some(open) = self.opened() else {
            return Ok(None);
        };
        let lost = |what, id| {
            Ok(Some(LostWal {
                what,
                id,
                noticed: crate::util::clock::since_boot(),
            }))
        };
        // Our open in WAL mode creates the WAL: none at install was already lost.
        let Some(id) = open.wal_id else {
            return lost("deleted", None);
        };
        match std::fs::metadata(&self.wal_path) {
            Ok(m) if (m.dev(), m.ino()) == id => Ok(None),
            Ok(_) => lost("deleted (another file is at its path now)", Some(id)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => lost("deleted", Some(id)),
            Err(e) => Err(io_err("stat", &self.wal_path)(e)),
        }
    }

    /// With our connection closed: the `-shm` in use holds frames of a WAL that is not at the
    /// path (deleted while replicad was dormant on the database, or not running), twice
    /// [`CONFIRM`] apart.
    fn wal_lost_before_open(&mut self) -> Option<LostWal> {
        let Index::Lost(_) = self.index() else {
            return None;
        };
        std::thread::sleep(CONFIRM);
        let Index::Lost(what) = self.index() else {
            return None;
        };
        Some(LostWal {
            what,
            id: None,
            noticed: crate::util::clock::since_boot(),
        })
    }

    /// The `-shm` against the WAL at the path. Read through the Db's own probe, which stays
    /// open (see [`super::shm`]: closing a descriptor of the file would drop every lock this
    /// process holds on it). A probe of a `-shm` deleted since reads the file the processes
    /// that still map it use.
    fn index(&mut self) -> Index {
        self.refresh_shm_probe();
        let Some(probe) = &self.shm else {
            return Index::Free;
        };
        if !probe.in_use() {
            return Index::Free;
        }
        let Some(index) = probe.index_header() else {
            return Index::Unknown;
        };
        if index.max_frame == 0 {
            return Index::Matches;
        }
        let wal = match File::open(&self.wal_path) {
            Ok(f) => read_wal_header(&f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Index::Lost("deleted"),
            Err(_) => return Index::Unknown,
        };
        match wal {
            Ok(Some(h)) if (h.salt1, h.salt2) == (index.salt1, index.salt2) => Index::Matches,
            Ok(_) => Index::Lost("deleted (another file is at its path now)"),
            Err(_) => Index::Unknown,
        }
    }

    /// With our connection closed, after a lost WAL: no process can still use the lost file.
    /// Either no other process has the database open (its last connection copied the lost
    /// WAL into the database on close), or none of those that do may have the lost file
    /// open and the index in use describes the WAL at the path.
    fn wal_settled(&mut self, lost: LostWal) -> bool {
        let Ok(db) = File::open(&self.path) else {
            // Gone or unreadable: the reopen reports it.
            return true;
        };
        // Closing `db` drops this process's locks on the file: none, with our connection
        // closed. An error reads as held.
        let holder = conflicting_lock(&db, SHARED_FIRST, SHARED_SIZE);
        let meta = db.metadata();
        drop(db);
        match holder {
            Ok(None) => return true,
            // Pid 0: a holder in another PID namespace (-1: an OFD lock), not to be inspected.
            Ok(Some(..=0)) | Err(_) => return false,
            Ok(Some(_)) => {}
        }
        let Ok(meta) = meta else { return false };
        let name = self.wal_path.file_name().unwrap_or_default();
        !open_elsewhere((meta.dev(), meta.ino()), lost, name)
            && matches!(self.index(), Index::Free | Index::Matches)
    }
}

/// Whether a process other than this one that holds a lock on the database `db` (device,
/// inode) may have the lost WAL open: the file `lost.id` when known, else a deleted file
/// named `name`. The holders come from `/proc/locks`, their start times from
/// `/proc/PID/stat` (one started after the loss cannot have the file), their descriptors
/// from `/proc/PID/fd`. Anything that cannot be inspected (another user's process, a process
/// in another PID namespace, no `/proc`) counts as "may". Called once `F_GETLK` found a holder:
/// when `/proc/locks` names none, that holder is out of sight (the kernel lists only the locks
/// of our PID namespace: a sidecar without a shared one), so it counts as "may" too.
fn open_elsewhere(db: (u64, u64), lost: LostWal, name: &std::ffi::OsStr) -> bool {
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return true;
    };
    let me = i64::from(std::process::id());
    let Some(pids) = lock_holders(&locks, db) else {
        return true;
    };
    let mut deleted = name.to_owned();
    deleted.push(" (deleted)");
    let is_lost = |fd: &Path| {
        // Only a deleted file: inode numbers are reused, also by the WAL made since.
        let Ok(target) = std::fs::read_link(fd) else {
            return false;
        };
        match lost.id {
            Some(id) => {
                target.to_string_lossy().ends_with(" (deleted)")
                    && std::fs::metadata(fd).is_ok_and(|m| (m.dev(), m.ino()) == id)
            }
            // Only the name is the same in another mount namespace.
            None => target.file_name() == Some(&deleted),
        }
    };
    let others: Vec<i64> = pids.into_iter().filter(|p| *p != me).collect();
    if others.is_empty() {
        return true;
    }
    others.into_iter().any(|pid| {
        if pid <= 0 {
            return true;
        }
        if started_after(pid, lost.noticed) {
            return false;
        }
        match std::fs::read_dir(format!("/proc/{pid}/fd")) {
            Err(_) => true,
            Ok(fds) => fds.flatten().any(|e| is_lost(&e.path())),
        }
    })
}

/// The pids holding a lock on the file `db` (device, inode) in `/proc/locks` text: lines on
/// its device, or when none, lines with its inode on any device (overlay filesystems report
/// another device there). None when the text has no line of the expected form.
fn lock_holders(locks: &str, db: (u64, u64)) -> Option<BTreeSet<i64>> {
    let dev = format!(
        "{:02x}:{:02x}",
        libc::major(db.0 as libc::dev_t),
        libc::minor(db.0 as libc::dev_t)
    );
    let ino = db.1.to_string();
    // "1: POSIX  ADVISORY  READ 1234 08:01:5678 1073741826 1073742335"; a blocked waiter's
    // line has "->" before its type; OFD locks show pid -1, other namespaces' pid 0 or less.
    let mut any = false;
    let (mut same_dev, mut same_ino) = (BTreeSet::new(), BTreeSet::new());
    for line in locks.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = f.iter().position(|x| x.matches(':').count() == 2) else {
            continue;
        };
        any = true;
        let Some((d, i)) = f[at].rsplit_once(':') else {
            continue;
        };
        let Some(pid) = at.checked_sub(1).and_then(|p| f[p].parse::<i64>().ok()) else {
            continue;
        };
        if i == ino {
            same_ino.insert(pid);
            if d == dev {
                same_dev.insert(pid);
            }
        }
    }
    any.then_some(if same_dev.is_empty() {
        same_ino
    } else {
        same_dev
    })
}

/// Process `pid` started after `noticed` (boot clock), per `/proc/PID/stat` (field 22, in
/// clock ticks since boot). False when unknown.
fn started_after(pid: i64, noticed: Duration) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let Some(start) = rest
        .split_whitespace()
        .nth(19)
        .and_then(|t| t.parse::<u64>().ok())
    else {
        return false;
    };
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_millis(start.saturating_mul(1000) / ticks) > noticed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_holders_reads_proc_locks() {
        let dev = libc::makedev(8, 1) as u64;
        let text = "1: POSIX  ADVISORY  READ 1234 08:01:5678 1073741826 1073742335\n\
                    2: OFDLCK ADVISORY  READ -1 08:01:5678 0 EOF\n\
                    3: POSIX  ADVISORY  WRITE 99 08:01:15678 0 EOF\n\
                    4: FLOCK  ADVISORY  WRITE 77 00:2a:5678 0 EOF\n\
                    4: -> POSIX  ADVISORY  WRITE 55 08:01:5678 0 EOF\n";
        let got = lock_holders(text, (dev, 5678)).expect("lines of the form");
        assert_eq!(got.into_iter().collect::<Vec<_>>(), [-1, 55, 1234]);
        // Another device reporting the inode (an overlay): used when no line is on ours.
        let other = libc::makedev(0, 0x30) as u64;
        let got = lock_holders(text, (other, 5678)).expect("lines of the form");
        assert_eq!(got.into_iter().collect::<Vec<_>>(), [-1, 55, 77, 1234]);
        assert_eq!(lock_holders("", (dev, 5678)), None);
    }

    #[test]
    fn a_process_started_before_is_not_after() {
        let me = i64::from(std::process::id());
        assert!(!started_after(me, crate::util::clock::since_boot()));
        assert!(started_after(me, Duration::ZERO));
    }
}
