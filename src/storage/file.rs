//! A replica in a local directory, laid out as Litestream v0.5 does:
//! `<root>/ltx/<level>/<min>-<max>.ltx`, with mtime = the LTX header timestamp.
//!
//! Invariants:
//! - Files are published with tmp -> fsync -> rename -> fsync(dir) (see
//!   [`crate::util::fsutil`]); `*.tmp` leftovers are never listed.
//! - A put on the file system of its source hard-links the source instead of copying it: a
//!   snapshot of 1 GiB then costs no second write of its bytes. The object shares the source's
//!   inode, so every caller hands `put` a file it never writes again (staged segments and seeds
//!   are renamed into place once whole; other temporary files are made by
//!   [`fsutil::create_fresh`], which unlinks a leftover of the same name instead of
//!   truncating it). Across file systems, or where links are refused, the bytes are copied.
//!   The price: until staging drops the file, an in-place write to the object (an operator,
//!   `rsync --inplace`) changes the staged copy too, and the object keeps the staged file's
//!   group and ACL rather than the replica directory's defaults.

use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

use crate::ltx::{self, TxId};
use crate::storage::tmp_names::{self, Swept};
use crate::storage::{LtxFileInfo, ObjectReader, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;

/// A directory replica.
#[derive(Debug, Clone)]
pub struct FileClient {
    root: PathBuf,
    /// Appended to every file name: `""`, or `".age"` for the encrypted view.
    suffix: &'static str,
}

impl FileClient {
    /// A client for the replica rooted at `root` (the directory that holds `ltx/`). A path that
    /// names the `ltx` directory itself is accepted too.
    pub fn new(root: PathBuf) -> FileClient {
        // Absolute, so that `file://` locations in messages are URLs (not `file://rep`), and
        // one spelling per directory (no trailing `/` or `.`: a follower records it).
        let root: PathBuf = std::path::absolute(&root)
            .unwrap_or(root)
            .components()
            .collect();
        let root = if root.file_name().is_some_and(|n| n == "ltx") && !root.join("ltx").exists() {
            root.parent().map(Path::to_path_buf).unwrap_or(root)
        } else {
            root
        };
        FileClient { root, suffix: "" }
    }

    /// The same replica seen through the names of age-encrypted files (`<min>-<max>.ltx.age`):
    /// it lists, opens, writes and deletes only those, and marks them `encrypted`.
    pub fn sealed_view(&self) -> FileClient {
        FileClient {
            root: self.root.clone(),
            suffix: crate::storage::SEALED_SUFFIX,
        }
    }

    /// The replica's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of one level.
    pub fn level_dir(&self, level: u8) -> PathBuf {
        self.root.join("ltx").join(level.to_string())
    }

    /// Path of one file.
    pub fn file_path(&self, level: u8, min: TxId, max: TxId) -> PathBuf {
        self.level_dir(level)
            .join(ltx::format_filename(min, max) + self.suffix)
    }

    fn list_blocking(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let dir = self.level_dir(level);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StorageError::from_io("list", &dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::from_io("list", &dir, e))?;
            let name = entry.file_name();
            let Some((min, max)) = name
                .to_str()
                .and_then(|n| n.strip_suffix(self.suffix))
                .and_then(ltx::parse_filename)
            else {
                continue;
            };
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Deleted between readdir and stat: it is no longer part of the listing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StorageError::from_io("list", &entry.path(), e)),
            };
            if !meta.is_file() {
                continue;
            }
            let created_at: DateTime<Utc> = meta.modified().map(DateTime::from).unwrap_or_default();
            out.push(LtxFileInfo {
                level,
                min_txid: min,
                max_txid: max,
                size: meta.len(),
                created_at,
                encrypted: !self.suffix.is_empty(),
            });
        }
        out.sort_by_key(|f| (f.min_txid, f.max_txid));
        Ok(out)
    }

    fn put_blocking(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        let dest = self.file_path(level, min, max);
        let io = |e| StorageError::from_io("put", &dest, e);
        fsutil::create_dir_all_durable(&self.level_dir(level)).map_err(io)?;
        // The name says when it was made: a sweep never takes it for a crash's leftover.
        let name = ltx::format_filename(min, max) + self.suffix;
        let tmp = dest.with_file_name(tmp_names::put_tmp_name(&name));
        let size = match fs::hard_link(src, &tmp) {
            Ok(()) => fs::metadata(&tmp).map(|m| m.len()),
            // Another file system (EXDEV), or links refused: a copy says what else is wrong.
            Err(_) => fs::copy(src, &tmp),
        }
        .map_err(|e| {
            let _ = fs::remove_file(&tmp);
            match e.kind() {
                std::io::ErrorKind::NotFound if !src.exists() => {
                    StorageError::from_io("put", src, e)
                }
                _ => io(e),
            }
        })?;
        let mtime = UNIX_EPOCH + Duration::from_millis(timestamp_ms.max(0) as u64);
        let published = File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(mtime))
            .and_then(|()| fsutil::publish_new(&tmp, &dest));
        if let Err(e) = published {
            // A linked leftover would keep the staged file's blocks after staging drops it.
            let _ = fs::remove_file(&tmp);
            return Err(match e.kind() {
                std::io::ErrorKind::AlreadyExists => StorageError::Conflict {
                    op: "put",
                    key: dest.display().to_string(),
                },
                _ => io(e),
            });
        }
        Ok(LtxFileInfo {
            level,
            min_txid: min,
            max_txid: max,
            size,
            created_at: DateTime::from(mtime),
            encrypted: !self.suffix.is_empty(),
        })
    }
}

impl ReplicaClient for FileClient {
    fn kind(&self) -> &'static str {
        "file"
    }

    fn location(&self) -> String {
        format!("file://{}", self.root.display())
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let me = self.clone();
        blocking(move || me.list_blocking(level)).await
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        let path = self.file_path(level, min, max);
        let file = blocking(move || {
            let mut f = File::open(&path).map_err(|e| StorageError::from_io("open", &path, e))?;
            if offset > 0 {
                f.seek(SeekFrom::Start(offset))
                    .map_err(|e| StorageError::from_io("open", &path, e))?;
            }
            Ok(f)
        })
        .await?;
        Ok(Box::pin(tokio::fs::File::from_std(file)))
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        let me = self.clone();
        let src = src.to_path_buf();
        blocking(move || me.put_blocking(level, min, max, &src, timestamp_ms)).await
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        let paths: Vec<PathBuf> = files
            .iter()
            .map(|f| {
                let view = if f.encrypted {
                    self.sealed_view()
                } else {
                    self.clone()
                };
                view.file_path(f.level, f.min_txid, f.max_txid)
            })
            .collect();
        blocking(move || {
            let mut dirs = Vec::new();
            for p in &paths {
                match fs::remove_file(p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::from_io("delete", p, e)),
                }
                if let Some(d) = p
                    .parent()
                    .filter(|d| !dirs.iter().any(|x: &PathBuf| x == d))
                {
                    dirs.push(d.to_path_buf());
                }
            }
            for d in dirs {
                match fsutil::fsync_dir(&d) {
                    Ok(()) => {}
                    // Nothing was ever stored in that level: nothing was removed there either.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::from_io("delete", &d, e)),
                }
            }
            Ok(())
        })
        .await
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.aux_path(name)?;
        blocking(move || match fs::read(&path) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::from_io("get", &path, e)),
        })
        .await
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        let path = self.aux_path(name)?;
        let root = self.root.clone();
        blocking(move || {
            let io = |e| StorageError::from_io("put", &path, e);
            fsutil::create_dir_all_durable(&root).map_err(io)?;
            let tmp = fsutil::unique_tmp_path(&path);
            fs::write(&tmp, &data).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                io(e)
            })?;
            fsutil::publish(&tmp, &path).map_err(io)
        })
        .await
    }

    async fn sweep_tmp(&self, older_than: Duration) -> Result<Swept, StorageError> {
        let c = self.clone();
        blocking(move || c.sweep_tmp_blocking(older_than)).await
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        let path = self.aux_path(name)?;
        let root = self.root.clone();
        blocking(move || {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(StorageError::from_io("delete", &path, e)),
            }
            fsutil::fsync_dir(&root).map_err(|e| StorageError::from_io("delete", &root, e))
        })
        .await
    }
}

impl FileClient {
    /// [`ReplicaClient::sweep_tmp`]: the root and the level directories. A file's change is
    /// its inode's too: a put's temporary name is a hard link to a staged segment, whose own
    /// modification time may be old (on file systems that keep no such time, the put's name
    /// still says when it was made).
    fn sweep_tmp_blocking(&self, older_than: Duration) -> Result<Swept, StorageError> {
        use std::os::unix::fs::MetadataExt;
        let now_s = chrono::Utc::now().timestamp();
        let older_s = i64::try_from(older_than.as_secs()).unwrap_or(i64::MAX);
        // The level directories present: an idle replica's sweep reads three or four.
        let levels: Vec<u8> = match fs::read_dir(self.root.join("ltx")) {
            Ok(entries) => entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u8>().ok())
                .filter(|l| *l <= SNAPSHOT_LEVEL)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StorageError::from_io("list", &self.root, e)),
        };
        let dirs = std::iter::once((self.root.clone(), false))
            .chain(levels.into_iter().map(|l| (self.level_dir(l), true)));
        let mut swept = Swept::listing();
        for (dir, in_level) in dirs {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StorageError::from_io("list", &dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| StorageError::from_io("list", &dir, e))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if !tmp_names::is_leftover_tmp(name, in_level) {
                    continue;
                }
                let path = entry.path();
                let changed = fs::symlink_metadata(&path)
                    .ok()
                    .filter(|m| m.is_file())
                    .map(|m| m.mtime().max(m.ctime()));
                if !swept.judge(name, in_level, changed, now_s, older_s) {
                    continue;
                }
                match fs::remove_file(&path) {
                    Ok(()) => swept.removed += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::from_io("delete", &path, e)),
                }
            }
        }
        Ok(swept)
    }

    /// Path of an auxiliary object: a plain name at the root, never a path that leaves it.
    fn aux_path(&self, name: &str) -> Result<PathBuf, StorageError> {
        crate::storage::check_aux_name(name)?;
        Ok(self.root.join(name))
    }
}

/// Runs blocking file work off the reactor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StorageError::Transient {
            op: "spawn_blocking",
            key: String::new(),
            reason: e.to_string(),
        })?
}

/// Milliseconds since the epoch of a `SystemTime` (for tests and listings).
pub fn system_time_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn put(c: &FileClient, src: &Path, txid: u64, ts: i64) -> LtxFileInfo {
        c.put_blocking(0, TxId(txid), TxId(txid), src, ts).unwrap()
    }

    #[test]
    fn a_put_on_the_same_file_system_links_and_a_fresh_source_leaves_the_object_alone() {
        let dir = tempfile::tempdir().unwrap();
        let c = FileClient::new(dir.path().join("replica"));
        let src = dir.path().join("staged.ltx");
        std::fs::write(&src, b"first segment").unwrap();
        let info = put(&c, &src, 1, 1_700_000_000_123);
        let object = c.file_path(0, TxId(1), TxId(1));
        let (s, o) = (fs::metadata(&src).unwrap(), fs::metadata(&object).unwrap());
        assert_eq!((o.dev(), o.ino()), (s.dev(), s.ino()), "not linked");
        assert_eq!(info.size, 13);
        assert_eq!(
            o.modified().unwrap(),
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
        // The next file of that name is made fresh (as every caller makes its sources).
        fsutil::create_fresh(&src)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"other bytes"))
            .unwrap();
        assert_eq!(fs::read(&object).unwrap(), b"first segment");
        fs::remove_file(&src).unwrap();
        assert_eq!(fs::read(&object).unwrap(), b"first segment");
        let tmp_left = fs::read_dir(c.level_dir(0))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count();
        assert_eq!(tmp_left, 0);
    }

    #[test]
    fn a_put_across_file_systems_copies() {
        // /dev/shm is a tmpfs on Linux: another file system than the temporary directory.
        let shm = Path::new("/dev/shm");
        let dir = tempfile::tempdir().unwrap();
        let Ok(src_dir) = tempfile::tempdir_in(shm) else {
            eprintln!("no writable /dev/shm: the copy path is not exercised here");
            return;
        };
        if fs::metadata(src_dir.path()).unwrap().dev() == fs::metadata(dir.path()).unwrap().dev() {
            eprintln!("/dev/shm shares the temporary directory's file system");
            return;
        }
        let c = FileClient::new(dir.path().join("replica"));
        let src = src_dir.path().join("staged.ltx");
        std::fs::write(&src, b"across devices").unwrap();
        let info = put(&c, &src, 2, 5_000);
        let object = c.file_path(0, TxId(2), TxId(2));
        assert_ne!(
            fs::metadata(&object).unwrap().ino(),
            fs::metadata(&src).unwrap().ino()
        );
        assert_eq!(fs::read(&object).unwrap(), b"across devices");
        assert_eq!(info.size, 14);
        // A second put of the range is a conflict either way.
        assert!(matches!(
            c.put_blocking(0, TxId(2), TxId(2), &src, 5_000),
            Err(StorageError::Conflict { .. })
        ));
    }
}
