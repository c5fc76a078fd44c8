//! Local staging of level-0 segments: `<meta>/ltx/0/<N>-<N>.ltx`.
//!
//! Invariants:
//! - A segment appears here only whole and durable (tmp -> fsync -> rename -> fsync dir);
//!   `*.tmp` leftovers of a crash are removed when the directory is opened.
//! - Staging keeps every segment not yet acknowledged by every replica, and the newest one
//!   always (its header is where a restarted process learns its position and WAL offset).

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::ltx::{self, Header, TRAILER_SIZE, TxId};
use crate::util::fsutil;

/// The staging directory of one database.
#[derive(Debug, Clone)]
pub struct Staging {
    dir: PathBuf,
}

/// The newest staged segment: where the local chain ends.
#[derive(Debug, Clone, Copy)]
pub struct StagedTip {
    /// Its header.
    pub header: Header,
    /// Its post-apply database checksum (0 if it carries none).
    pub post_apply_checksum: u64,
}

/// Why local staging could not be claimed or read.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// Another live replicad claimed this database.
    #[error(
        "another replicad already replicates this database (pid {}, lock {}); \
         run one daemon per database, with every replica in its config",
        pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        lock.display()
    )]
    Claimed {
        /// Its pid (in its own PID namespace), when the claim file names one.
        pid: Option<u32>,
        /// The claim file.
        lock: PathBuf,
    },
    /// A file-system operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The newest staged segment does not verify (torn or corrupt).
    #[error("staged segment {}: {source}", path.display())]
    Segment {
        /// The segment.
        path: PathBuf,
        /// Why.
        source: ltx::LtxError,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StagingError {
    let path = path.to_path_buf();
    move |source| StagingError::Io { op, path, source }
}

/// The claim of one database's local state (`<meta>/lock`): one daemon per database.
///
/// The claim is an exclusive `flock` on the open file, held while this value lives: the kernel
/// drops it when the process ends, however it ends (crash, kill -9, power loss). So a claim is
/// never judged by a pid, which after a reboot may belong to another process, and which is 1
/// for every container with a PID namespace of its own. It costs one descriptor per database
/// (beside the four or so each holds). The file names its claimant (`<pid> <instance>`) and
/// stays when the process ends: the next claimant learns from it which instance ran this
/// database here before ([`StagingLock::predecessor`]).
#[derive(Debug)]
pub struct StagingLock {
    /// Open for as long as the claim lives: closing it releases the `flock`.
    _file: File,
    predecessor: Option<String>,
}

impl StagingLock {
    /// Claims `meta` (creating the directory), or says which live process holds it.
    pub fn acquire(meta: &Path) -> Result<StagingLock, StagingError> {
        use std::io::Write;
        fsutil::create_dir_all_durable(meta).map_err(io_err("create", meta))?;
        let path = meta.join("lock");
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("open", &path))?;
        let mut text = String::new();
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let _ = file.read_to_string(&mut text);
                let pid = text.split_whitespace().next().and_then(|p| p.parse().ok());
                return Err(StagingError::Claimed { pid, lock: path });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", &path)(e)),
        }
        file.read_to_string(&mut text)
            .map_err(io_err("read", &path))?;
        // A claim written before claims named their instance is a bare pid: no predecessor.
        let predecessor = text.split_whitespace().nth(1).map(str::to_string);
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| {
                writeln!(
                    file,
                    "{} {}",
                    std::process::id(),
                    crate::replicate::lease::instance_id()
                )
            })
            .and_then(|()| file.sync_data())
            .map_err(io_err("write", &path))?;
        Ok(StagingLock {
            _file: file,
            predecessor,
        })
    }

    /// The instance that held this claim before this process (its `flock` is ours now, so it
    /// has ended), if the claim file named one.
    pub fn predecessor(&self) -> Option<&str> {
        self.predecessor.as_deref()
    }

    /// True when a live process has claimed `meta` (checked before writing over a database:
    /// a running daemon would keep replicating the file it has open).
    pub fn is_held(meta: &Path) -> bool {
        let Ok(file) = File::open(meta.join("lock")) else {
            return false;
        };
        // Shared, and released when `file` closes right below.
        matches!(file.try_lock_shared(), Err(fs::TryLockError::WouldBlock))
    }
}

impl Staging {
    /// Opens (creating) the directory and removes temporary leftovers.
    pub fn open(dir: PathBuf) -> std::io::Result<Staging> {
        fsutil::create_dir_all_durable(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().ends_with(".tmp") {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(Staging { dir })
    }

    /// Runs `f` on this staging on the blocking pool: the replica tasks run on the runtime's
    /// threads, and staging may sit on a network file system that stops answering, which
    /// would hold up every database's task with it, not only this one's.
    pub async fn off_reactor<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Staging) -> T + Send + 'static,
    ) -> T {
        let s = self.clone();
        match tokio::task::spawn_blocking(move || f(&s)).await {
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of segment `txid`.
    pub fn path(&self, txid: TxId) -> PathBuf {
        self.dir.join(ltx::format_filename(txid, txid))
    }

    /// TXIDs of the staged segments, ascending.
    pub fn txids(&self) -> std::io::Result<Vec<TxId>> {
        let mut out: Vec<TxId> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(ltx::parse_filename))
            .filter(|(min, max)| min == max)
            .map(|(min, _)| min)
            .collect();
        out.sort();
        Ok(out)
    }

    /// Reads the header and post-apply checksum of the newest segment. The whole file is
    /// verified first: a torn or corrupt newest segment must not define the position.
    pub fn tip(&self) -> Result<Option<StagedTip>, StagingError> {
        let txids = self.txids().map_err(io_err("list", &self.dir))?;
        let Some(&txid) = txids.last() else {
            return Ok(None);
        };
        let path = self.path(txid);
        let verify = || -> Result<StagedTip, ltx::LtxError> {
            let dec = ltx::Decoder::new(File::open(&path)?)?;
            let header = *dec.header();
            let trailer = dec.verify_to_end()?;
            Ok(StagedTip {
                header,
                post_apply_checksum: trailer.post_apply_checksum,
            })
        };
        verify()
            .map(Some)
            .map_err(|source| StagingError::Segment { path, source })
    }

    /// Reads only the header of a staged segment (the upload path needs its timestamp).
    pub fn header(&self, txid: TxId) -> Result<Header, ltx::LtxError> {
        ltx::decoder::read_header(File::open(self.path(txid))?)
    }

    /// Reads the trailer's post-apply checksum of any LTX file on disk.
    pub fn post_apply_checksum_of(path: &Path) -> std::io::Result<u64> {
        let mut f = File::open(path)?;
        f.seek(SeekFrom::End(-(TRAILER_SIZE as i64)))?;
        let mut b = [0u8; 8];
        f.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    /// Total bytes of the staged segments.
    pub fn total_bytes(&self) -> std::io::Result<u64> {
        let mut total = 0;
        for t in self.txids()? {
            match fs::metadata(self.path(t)) {
                Ok(m) => total += m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Deletes every staged segment older than `keep_from`, but never the newest.
    pub fn prune_below(&self, keep_from: TxId) -> std::io::Result<usize> {
        let txids = self.txids()?;
        let newest = txids.last().copied();
        let mut removed = 0;
        for t in txids
            .into_iter()
            .filter(|t| *t < keep_from && Some(*t) != newest)
        {
            match fs::remove_file(self.path(t)) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if removed > 0 {
            fsutil::fsync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Removes every staged segment (the local position is then rebuilt from the replicas).
    pub fn clear(&self) -> std::io::Result<()> {
        for t in self.txids()? {
            fs::remove_file(self.path(t))?;
        }
        fsutil::fsync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim is the kernel lock, not the pid the file names: a second claim is refused
    /// while the first lives (even in this process), a claim file naming a live process that
    /// holds no lock (pid 1 here: a reused pid after a reboot, or a twin container's) is free,
    /// and each claim learns the instance that held it before.
    #[test]
    fn the_claim_is_the_lock_and_names_its_predecessor() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let meta = dir.path().join("meta");
        assert!(!StagingLock::is_held(&meta));
        let first = StagingLock::acquire(&meta).expect("a free claim");
        assert!(StagingLock::is_held(&meta));
        match StagingLock::acquire(&meta) {
            Err(StagingError::Claimed { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("a second claim while the first lives: {other:?}"),
        }
        drop(first);
        assert!(!StagingLock::is_held(&meta));
        let second = StagingLock::acquire(&meta).expect("released when dropped");
        assert_eq!(
            second.predecessor(),
            Some(crate::replicate::lease::instance_id())
        );
        drop(second);

        fs::write(meta.join("lock"), "1 0123abcd\n").expect("write the claim file");
        let third = StagingLock::acquire(&meta).expect("a pid that holds no lock is no claim");
        assert_eq!(third.predecessor(), Some("0123abcd"));
        drop(third);
        // A claim file written before claims named their instance.
        fs::write(meta.join("lock"), "1").expect("write the claim file");
        let fourth = StagingLock::acquire(&meta).expect("a bare pid is no claim");
        assert_eq!(fourth.predecessor(), None);
    }
}
