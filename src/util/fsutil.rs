//! Crash-safe local file helpers.
//!
//! Invariant: a file is published only by tmp -> fsync -> rename -> fsync(dir), so after a
//! crash a reader finds either no file or the whole file, and a name that exists is durable.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The temporary sibling a file is staged under before its rename (`<name>.tmp`).
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// `<path>.tmp`, new and empty, for this process alone: an exclusive `flock` on it lasts while
/// the returned file is open. A second restore or snapshot to the same path gets `WouldBlock`
/// instead of writing into the first one's file, which the first would then publish. A
/// leftover nobody holds (a crashed run's, or one linked to the output by a crash between a
/// no-clobber publish's link and unlink, or a symlink) is unlinked, never written through:
/// the file published is always one this process created.
pub fn claim_tmp(path: &Path) -> io::Result<(PathBuf, File)> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let tmp = tmp_path(path);
    let busy = || {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{} is being written by another process", tmp.display()),
        )
    };
    // Whether `f` is free to take: held by another process, or locks unsupported (some FUSE
    // mounts: claimed unguarded, as before).
    let lock = |f: &File| match f.try_lock() {
        Ok(()) => Ok(()),
        Err(fs::TryLockError::WouldBlock) => Err(busy()),
        Err(fs::TryLockError::Error(e))
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)
            ) =>
        {
            Ok(())
        }
        Err(fs::TryLockError::Error(e)) => Err(e),
    };
    let unlink = || match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    // A pass ends early only after an unlink, or when another claimant got in between.
    for _ in 0..3 {
        match File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => {
                lock(&f)?;
                return Ok((tmp, f));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let old = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        match old {
            Ok(old) => {
                lock(&old)?;
                let meta = old.metadata()?;
                let at_path = fs::symlink_metadata(&tmp)
                    .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()));
                if at_path {
                    unlink()?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // A symlink, or a file we may not read (another user's leftover): unlinked as
            // the claim always did.
            Err(_) => unlink()?,
        }
    }
    Err(busy())
}

/// A temporary sibling of `path` no other writer uses (`<name>.<pid>-<random>.tmp`): two
/// processes writing one name (two daemons on one replica) must never share a temporary file.
pub fn unique_tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(unique_tmp_suffix());
    PathBuf::from(s)
}

/// The suffix of [`unique_tmp_path`], `.<pid>-<random>.tmp`, for remote names too.
pub fn unique_tmp_suffix() -> String {
    format!(".{}-{:016x}.tmp", std::process::id(), rand::random::<u64>())
}

/// The name `name` carries before a [`unique_tmp_suffix`], or `None` when it has none.
pub fn strip_unique_tmp_suffix(name: &str) -> Option<&str> {
    let (rest, random) = name.strip_suffix(".tmp")?.rsplit_once('-')?;
    let (stem, pid) = rest.rsplit_once('.')?;
    let is_pid = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    let is_random = random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit());
    (is_pid && is_random && !stem.is_empty()).then_some(stem)
}

/// Creates `path` as a new, empty file, removing whatever was there first. A file handed to a
/// directory replica's put may share its inode with the replica's object (see
/// [`crate::storage::file`]), so a leftover of that name must be unlinked, never truncated.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    File::options().write(true).create_new(true).open(path)
}

/// fsyncs a directory so a rename or unlink inside it is durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Makes `tmp` durable and moves it to `dest` atomically, then makes the rename durable.
pub fn publish(tmp: &Path, dest: &Path) -> io::Result<()> {
    File::open(tmp)?.sync_all()?;
    fs::rename(tmp, dest)?;
    fsync_dir(parent_dir(dest))
}

/// [`publish`], but never replacing an existing `dest`: fails with `AlreadyExists` (and
/// removes `tmp`) when it exists. A hard link is the atomic no-clobber rename every local and
/// network file system has; one that refuses links falls back to check-then-rename.
pub fn publish_new(tmp: &Path, dest: &Path) -> io::Result<()> {
    File::open(tmp)?.sync_all()?;
    match fs::hard_link(tmp, dest) {
        // Published: the temporary name is a second name, which someone may have removed.
        Ok(()) => match fs::remove_file(tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = fs::remove_file(tmp);
            return Err(e);
        }
        Err(e) if e.kind() == io::ErrorKind::Unsupported || e.raw_os_error() == Some(1) => {
            if dest.exists() {
                let _ = fs::remove_file(tmp);
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists"));
            }
            fs::rename(tmp, dest)?;
        }
        Err(e) => return Err(e),
    }
    fsync_dir(parent_dir(dest))
}

/// Writes back the `len` bytes of `file` at `offset` and drops them from the page cache, a
/// hint for data no one will read again soon. Blocking (it waits for the range's writeback:
/// dirty pages cannot be dropped). Durability is unchanged: `sync_file_range` promises
/// nothing on a crash, so publishing still needs its fsync. Errors are ignored, since a file
/// system that refuses the hint (tmpfs) only keeps its pages. A no-op off Linux.
pub fn evict_range(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(from), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        #[allow(unsafe_code)]
        // SAFETY: a plain syscall on a descriptor `file` keeps open; no memory is passed.
        let _ = unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from,
                n,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        };
        let _ = rustix::fs::fadvise(
            file,
            offset,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::DontNeed,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// The directory holding `path` (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any parents, fsyncing each directory whose entries changed.
pub fn create_dir_all_durable(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all_durable(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => fsync_dir(
            dir.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        ),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `data` to `path` durably and atomically (tmp -> fsync -> rename -> fsync dir).
pub fn write_durable(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, data)?;
    publish(&tmp, path)
}

/// Removes a file when dropped, whatever happened: a temporary output whose owner may be
/// dropped mid-way (an aborted maintenance job). Its name must be unique: the removal may
/// come a moment later ([`remove_file_off_reactor`]).
#[derive(Debug)]
pub struct RemoveOnDrop(pub PathBuf);

impl RemoveOnDrop {
    /// Removes the file now, on the blocking pool, and waits for it: a job that ended leaves
    /// its directory as it found it (the removal on drop is for a job dropped mid-way).
    pub async fn remove(mut self) {
        let path = std::mem::take(&mut self.0);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            remove_file_off_reactor(std::mem::take(&mut self.0));
        }
    }
}

/// Removes a file whose name nothing will take again (a unique temporary name), on the
/// blocking pool when called on a runtime thread: unlinking a file of gigabytes, or one on a
/// network mount, can take seconds. Should the runtime stop first, the file stays in a
/// directory the next start empties. While the thread unwinds a panic it removes the file at
/// once: `spawn_blocking` panics when no thread can be started, and a second panic aborts.
pub fn remove_file_off_reactor(path: PathBuf) {
    let remove = move || {
        let _ = std::fs::remove_file(&path);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) if !std::thread::panicking() => drop(rt.spawn_blocking(remove)),
        _ => remove(),
    }
}

/// Treats directories under this path as on a network file system ([`on_network_fs`]): tests
/// of that path, where no NFS server can be mounted.
pub const NETWORK_FS_ENV: &str = "REPLICAD_TEST_NETWORK_FS";

/// Whether `dir` is on a network or FUSE file system (NFS, SMB, 9p, Ceph, AFS, Lustre, FUSE
/// mounts such as gcsfuse or s3fs), where any call may block for as long as the server does
/// not answer. False when unknown.
pub fn on_network_fs(dir: &Path) -> bool {
    if std::env::var_os(NETWORK_FS_ENV).is_some_and(|p| dir.starts_with(p)) {
        return true;
    }
    // `f_type` is signed, 32 bits wide on 32-bit targets (where the SMB magics read as
    // negative): the magics are its low 32 bits.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(dir).is_ok_and(|s| is_network_fs_type(s.f_type as u32))
}

/// Whether `statfs`'s `f_type` is that of a network or FUSE file system.
pub fn is_network_fs_type(f_type: u32) -> bool {
    matches!(
        f_type,
        0x6969 // NFS
            | 0x517B // SMB
            | 0xFF53_4D42 // CIFS
            | 0xFE53_4D42 // SMB2
            | 0x0102_1997 // 9p (WSL, VM shares)
            | 0x6E73_6676 // virtiofs (VM shares)
            | 0x00C3_6400 // Ceph
            | 0x5346_414F // AFS
            | 0x6B41_4653 // kAFS
            | 0x0BD0_0BD0 // Lustre
            | 0x6573_5546 // FUSE
    )
}

#[cfg(test)]
mod network_fs_tests {
    use super::*;

    #[test]
    fn network_file_systems_are_told_by_their_type() {
        assert!(is_network_fs_type(0x6969), "NFS");
        assert!(is_network_fs_type(0x6573_5546), "FUSE");
        assert!(is_network_fs_type(0xFF53_4D42), "CIFS");
        assert!(!is_network_fs_type(0xEF53), "ext4");
        assert!(!is_network_fs_type(0x0102_1994), "tmpfs");
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert!(
            !on_network_fs(dir.path()),
            "the temporary directory is local here"
        );
    }
}

#[cfg(test)]
mod claim_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_claimed_tmp_is_refused_to_a_second_claim_until_dropped() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("out.db");
        let (tmp, first) = claim_tmp(&out).expect("the first claim");
        std::io::Write::write_all(&mut &first, b"the first restore's pages").expect("write");
        let e = claim_tmp(&out).expect_err("a second claim while the first holds it");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        assert_eq!(fs::read(&tmp).expect("read"), b"the first restore's pages");
        drop(first);
        let (_, again) = claim_tmp(&out).expect("a claim once the first ended");
        assert_eq!(
            again.metadata().expect("stat").len(),
            0,
            "a leftover is emptied"
        );
    }

    #[test]
    fn a_leftover_linked_elsewhere_or_a_symlink_is_unlinked_not_truncated() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("out.db");
        // A crash between a no-clobber publish's link and its unlink.
        fs::write(&out, b"the restored database").expect("write");
        fs::hard_link(&out, tmp_path(&out)).expect("link");
        let (tmp, claimed) = claim_tmp(&out).expect("claim over a linked leftover");
        assert_eq!(fs::read(&out).expect("read"), b"the restored database");
        assert_eq!(claimed.metadata().expect("stat").nlink(), 1);
        drop(claimed);
        fs::remove_file(&tmp).expect("remove");
        std::os::unix::fs::symlink(&out, &tmp).expect("symlink");
        let (_, claimed) = claim_tmp(&out).expect("claim over a symlink");
        assert_eq!(fs::read(&out).expect("read"), b"the restored database");
        assert!(!fs::symlink_metadata(&tmp).expect("stat").is_symlink());
        drop(claimed);
    }
}

#[cfg(test)]
mod removal_tests {
    use super::*;

    /// On a runtime the file goes on the blocking pool; elsewhere at once.
    #[test]
    fn a_file_is_removed_off_the_reactor_or_at_once() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (here, there) = (dir.path().join("here"), dir.path().join("there"));
        for p in [&here, &there] {
            std::fs::write(p, b"x").expect("a file");
        }
        remove_file_off_reactor(here.clone());
        assert!(!here.exists());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let now = dir.path().join("now");
            std::fs::write(&now, b"x").expect("a file");
            RemoveOnDrop(now.clone()).remove().await;
            assert!(!now.exists());
            drop(RemoveOnDrop(there.clone()));
            for _ in 0..500 {
                if !there.exists() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{} was not removed", there.display());
        });
    }
}
