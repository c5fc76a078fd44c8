//! Replicas on an SFTP server (OpenSSH's `internal-sftp`, a storage box), over russh and
//! russh-sftp, laid out as Litestream v0.5 lays them out for `sftp`:
//! `<path>/ltx/<level>/<min>-<max>.ltx`, each file's modification time set to the LTX header
//! timestamp (second resolution, SFTP v3), which is what both tools list as its time.
//!
//! Invariants:
//! - A segment is written under a temporary name in its level directory (`<name>.<pid>.<ns>.tmp`,
//!   as Litestream names it; neither tool lists it), flushed to the server's disk where it
//!   offers `fsync@openssh.com`, then given its name by a hard link (`hardlink@openssh.com`,
//!   refused over an existing name) or, on servers without one, a rename after checking the
//!   name is free (OpenSSH's rename refuses an existing name too; others may replace). A put
//!   never replaces a segment and a reader never sees a partial one.
//! - At most [`PUTS_IN_FLIGHT`] uploads at once per replica, each with up to 16 write requests
//!   in flight (1 with `concurrent-writes: false`).
//! - One connection per replica, opened on first use and kept; a call that finds it closed
//!   (server restart, idle cut) reconnects once before failing. An idle replica sends nothing.
//! - The host key is checked before anything else is sent (see `conn`).

mod config;
mod conn;

use std::collections::HashSet;
use std::future::Future;
use std::io::SeekFrom;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use russh_sftp::client::error::Error as SftpError;
use russh_sftp::protocol::{FileAttributes, OpenFlags, StatusCode};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{Mutex, Semaphore};

pub use config::{DEFAULT_PORT, HostKeyCheck, SftpConfig, split_host_port};
use conn::{Conn, ConnectError};

use crate::ltx::{self, TxId};
use crate::storage::tmp_names::{self, Swept};
use crate::storage::{LtxFileInfo, ObjectReader, ReplicaClient, SNAPSHOT_LEVEL, StorageError};

/// Uploads of one replica in flight at once.
pub const PUTS_IN_FLIGHT: usize = 4;

/// Seconds after which a lease write's temporary file is a crashed write's, not one under way.
const AUX_WRITE_STALE_S: i64 = 60;

/// An SFTP replica client. Cheap to clone; clones share the connection. A call that fails on
/// a connection found dead runs once more on a new one, never more.
#[derive(Clone)]
pub struct SftpClient {
    cfg: Arc<SftpConfig>,
    conn: Arc<Mutex<Option<Arc<Conn>>>>,
    /// Directories known to exist, so a put does not ask again.
    made: Arc<std::sync::Mutex<HashSet<String>>>,
    puts: Arc<Semaphore>,
    /// Appended to every file name: `""`, or `".age"` for the encrypted view.
    suffix: &'static str,
}

impl std::fmt::Debug for SftpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftpClient")
            .field("url", &self.cfg.url())
            .finish()
    }
}

impl SftpClient {
    /// A client for `cfg`; nothing is contacted until the first call.
    pub fn new(cfg: SftpConfig) -> SftpClient {
        SftpClient {
            cfg: Arc::new(cfg),
            conn: Arc::new(Mutex::new(None)),
            made: Arc::default(),
            puts: Arc::new(Semaphore::new(PUTS_IN_FLIGHT)),
            suffix: "",
        }
    }

    /// The settings.
    pub fn config(&self) -> &SftpConfig {
        &self.cfg
    }

    /// The same replica seen through the names of age-encrypted files (`<min>-<max>.ltx.age`).
    pub fn sealed_view(&self) -> SftpClient {
        SftpClient {
            suffix: crate::storage::SEALED_SUFFIX,
            ..self.clone()
        }
    }

    /// `rel` under the replica's directory.
    fn path(&self, rel: &str) -> String {
        match self.cfg.path.as_str() {
            "" => rel.to_string(),
            "/" => format!("/{rel}"),
            root => format!("{root}/{rel}"),
        }
    }

    /// The replica's root directory, as a directory listing names it.
    fn root_dir(&self) -> String {
        match self.path("").trim_end_matches('/') {
            "" if self.cfg.path == "/" => "/".to_string(),
            "" => ".".to_string(),
            d => d.to_string(),
        }
    }

    /// The level directories under `ltx/` (one listing; none when it does not exist).
    async fn levels_present(&self, c: &Conn) -> Result<Vec<u8>, StorageError> {
        let ltx_dir = self.path("ltx");
        match c.sftp.read_dir(ltx_dir.clone()).await {
            Ok(entries) => Ok(entries
                .filter(|e| e.metadata().is_dir())
                .filter_map(|e| e.file_name().parse::<u8>().ok())
                .filter(|l| *l <= SNAPSHOT_LEVEL)
                .collect()),
            Err(e) => match self.fail("list", &ltx_dir, e) {
                StorageError::NotFound(_) => Ok(Vec::new()),
                e => Err(e),
            },
        }
    }

    fn level_dir(&self, level: u8) -> String {
        self.path(&format!("ltx/{level}"))
    }

    fn file(&self, level: u8, min: TxId, max: TxId) -> String {
        format!(
            "{}/{}{}",
            self.level_dir(level),
            ltx::format_filename(min, max),
            self.suffix
        )
    }

    fn aux_path(&self, name: &str) -> Result<String, StorageError> {
        crate::storage::check_aux_name(name)?;
        Ok(self.path(name))
    }

    /// `sftp://USER@HOST[:PORT]/PATH` of a file, for messages.
    fn at(&self, path: &str) -> String {
        let server = SftpConfig {
            path: String::new(),
            ..(*self.cfg).clone()
        };
        if path.starts_with('/') {
            format!("{}{path}", server.url())
        } else {
            format!("{}/~/{path}", server.url())
        }
    }

    /// The open connection, or a new one; `true` when new.
    async fn conn(&self, op: &'static str, path: &str) -> Result<(Arc<Conn>, bool), StorageError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok((c.clone(), false));
        }
        *slot = None;
        let c = Arc::new(conn::connect(self.cfg.clone()).await.map_err(|e| {
            let key = self.at(path);
            match e {
                ConnectError::Transient(reason) => StorageError::Transient { op, key, reason },
                ConnectError::Permanent(reason) => StorageError::Permanent { op, key, reason },
            }
        })?);
        *slot = Some(c.clone());
        Ok((c, true))
    }

    /// Runs `f` on the connection; if it fails because the connection had died (the server
    /// restarted, or cut an idle session), runs it once more on a new one.
    async fn run<T, F, Fut>(&self, op: &'static str, path: &str, f: F) -> Result<T, StorageError>
    where
        F: Fn(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, StorageError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (c, fresh) = self.conn(op, path).await?;
            match f(c.clone()).await {
                Err(e) if e.is_retryable() && (c.is_closed() || is_timeout(&e)) => {
                    let mut slot = self.conn.lock().await;
                    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &c)) {
                        *slot = None;
                    }
                    if fresh || attempt >= 2 {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    fn fail(&self, op: &'static str, path: &str, e: SftpError) -> StorageError {
        let key = self.at(path);
        match e {
            SftpError::Status(s) => match s.status_code {
                StatusCode::NoSuchFile => StorageError::NotFound(key),
                StatusCode::PermissionDenied => StorageError::Permanent {
                    op,
                    key,
                    reason: format!(
                        "permission denied; hint: user `{}` needs to list, create, write, \
                         rename and delete files and create directories under {}",
                        self.cfg.user,
                        self.at(&self.cfg.path)
                    ),
                },
                StatusCode::OpUnsupported => StorageError::Permanent {
                    op,
                    key,
                    reason: format!("the server does not support this: {}", s.error_message),
                },
                _ => StorageError::Transient {
                    op,
                    key,
                    reason: format!("the server said: {} ({})", s.error_message, s.status_code),
                },
            },
            other => StorageError::Transient {
                op,
                key,
                reason: other.to_string(),
            },
        }
    }

    fn io_fail(&self, op: &'static str, path: &str, e: std::io::Error) -> StorageError {
        StorageError::Transient {
            op,
            key: self.at(path),
            reason: e.to_string(),
        }
    }

    /// Lists one directory's LTX files as `level`'s.
    async fn list_dir(&self, c: &Conn, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let dir = self.level_dir(level);
        let entries = match c.sftp.read_dir(dir.clone()).await {
            Ok(entries) => entries,
            Err(e) => {
                return match self.fail("list", &dir, e) {
                    StorageError::NotFound(_) => Ok(Vec::new()),
                    e => Err(e),
                };
            }
        };
        let mut out = Vec::new();
        for entry in entries {
            let meta = entry.metadata();
            if meta.is_dir() {
                continue;
            }
            let name = entry.file_name();
            let Some((min, max)) = name
                .strip_suffix(self.suffix)
                .filter(|n| !n.ends_with(crate::storage::SEALED_SUFFIX))
                .and_then(ltx::parse_filename)
            else {
                continue;
            };
            out.push(LtxFileInfo {
                level,
                min_txid: min,
                max_txid: max,
                size: meta.size.unwrap_or(0),
                created_at: meta
                    .mtime
                    .and_then(|t| DateTime::<Utc>::from_timestamp(i64::from(t), 0))
                    .unwrap_or_default(),
                encrypted: !self.suffix.is_empty(),
            });
        }
        out.sort_by_key(|f| (f.min_txid, f.max_txid));
        Ok(out)
    }

    /// Creates `dir` and its parents under the replica's directory, once per client.
    async fn make_dirs(&self, c: &Conn, dir: &str) -> Result<(), StorageError> {
        if self.made_contains(dir) {
            return Ok(());
        }
        let mut at = String::new();
        for part in dir.split('/') {
            if at.is_empty() && part.is_empty() {
                at.push('/');
                continue;
            }
            if !at.is_empty() && !at.ends_with('/') {
                at.push('/');
            }
            at.push_str(part);
            if self.made_contains(&at) {
                continue;
            }
            if let Err(e) = c.sftp.create_dir(at.clone()).await {
                // It exists (the usual case), or the real failure shows on stat.
                match c.sftp.metadata(at.clone()).await {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        return Err(StorageError::Permanent {
                            op: "put",
                            key: self.at(&at),
                            reason: "exists and is not a directory".into(),
                        });
                    }
                    Err(_) => return Err(self.fail("put", &at, e)),
                }
            }
            self.made_lock().insert(at.clone());
        }
        Ok(())
    }

    fn made_contains(&self, dir: &str) -> bool {
        self.made_lock().contains(dir)
    }

    fn made_lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // The set is only a cache: a panic elsewhere cannot leave it inconsistent.
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Uploads `src` to `tmp` whole: written, flushed, synced, its time set, closed.
    async fn upload(
        &self,
        c: &Conn,
        src: &Path,
        tmp: &str,
        timestamp_ms: i64,
    ) -> Result<u64, StorageError> {
        let mut local = tokio::fs::File::open(src)
            .await
            .map_err(|e| StorageError::from_io("put", src, e))?;
        let flags = OpenFlags::CREATE | OpenFlags::EXCLUDE | OpenFlags::WRITE;
        let mut remote = c
            .sftp
            .open_with_flags(tmp.to_string(), flags)
            .await
            .map_err(|e| self.fail("put", tmp, e))?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut size = 0u64;
        loop {
            let n = local
                .read(&mut buf)
                .await
                .map_err(|e| StorageError::from_io("put", src, e))?;
            if n == 0 {
                break;
            }
            remote
                .write_all(&buf[..n])
                .await
                .map_err(|e| self.io_fail("put", tmp, e))?;
            size += n as u64;
        }
        remote
            .flush()
            .await
            .map_err(|e| self.io_fail("put", tmp, e))?;
        remote
            .sync_all()
            .await
            .map_err(|e| self.fail("put", tmp, e))?;
        let secs = u32::try_from(timestamp_ms.max(0) / 1000).unwrap_or(u32::MAX);
        let times = FileAttributes {
            atime: Some(secs),
            mtime: Some(secs),
            ..FileAttributes::empty()
        };
        remote
            .set_metadata(times)
            .await
            .map_err(|e| self.fail("put", tmp, e))?;
        remote
            .close()
            .await
            .map_err(|e| self.io_fail("put", tmp, e))?;
        Ok(size)
    }

    /// Creates (or truncates) `path` and writes `data` to it.
    async fn write_small(&self, c: &Conn, path: &str, data: &[u8]) -> Result<(), StorageError> {
        let mut f = c
            .sftp
            .create(path.to_string())
            .await
            .map_err(|e| self.fail("put", path, e))?;
        f.write_all(data)
            .await
            .map_err(|e| self.io_fail("put", path, e))?;
        f.close().await.map_err(|e| self.io_fail("put", path, e))
    }

    /// One attempt of a put on connection `c`.
    async fn put_on(
        &self,
        c: &Conn,
        level: u8,
        name: &str,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<u64, StorageError> {
        let dir = self.level_dir(level);
        self.make_dirs(c, &dir).await?;
        let tmp = tmp_names::put_tmp_name(name);
        let uploaded = match self.upload(c, src, &tmp, timestamp_ms).await {
            // The directory was removed behind the cache's back: make it again, once.
            Err(StorageError::NotFound(_)) if !self.made_lock().is_empty() => {
                self.made_lock().clear();
                self.make_dirs(c, &dir).await?;
                self.upload(c, src, &tmp, timestamp_ms).await
            }
            r => r,
        };
        let size = match uploaded {
            Ok(size) => size,
            Err(e) => {
                let _ = c.sftp.remove_file(tmp.clone()).await;
                return Err(e);
            }
        };
        // Publish: a hard link where the server offers `hardlink@openssh.com` (refused over
        // an existing name by any POSIX file system), else a rename (refused over an existing
        // name by OpenSSH; other servers may replace, so the name is checked first). A link
        // refused for another reason (a file system without hard links: vfat, SMB) falls back
        // to the rename too, where every put failed as "permission denied".
        let published = match c.sftp.hardlink(tmp.clone(), name.to_string()).await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => match c.sftp.metadata(name.to_string()).await {
                Ok(_) => Err(None),
                Err(_) => c
                    .sftp
                    .rename(tmp.clone(), name.to_string())
                    .await
                    .map_err(Some),
            },
        };
        // After a link the temporary name is a second name of the file; after a failure, junk.
        let _ = c.sftp.remove_file(tmp).await;
        match published {
            Ok(()) => Ok(size),
            Err(e) => Err(match c.sftp.metadata(name.to_string()).await {
                Ok(_) => StorageError::Conflict {
                    op: "put",
                    key: self.at(name),
                },
                Err(_) => match e {
                    Some(e) => self.fail("put", name, e),
                    None => StorageError::Transient {
                        op: "put",
                        key: self.at(name),
                        reason: "the name vanished while being published".into(),
                    },
                },
            }),
        }
    }
}

fn is_timeout(e: &StorageError) -> bool {
    matches!(e, StorageError::Transient { reason, .. } if reason.contains("Timeout"))
}

impl ReplicaClient for SftpClient {
    fn kind(&self) -> &'static str {
        "sftp"
    }

    fn location(&self) -> String {
        self.cfg.url()
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let dir = self.level_dir(level);
        self.run(
            "list",
            &dir,
            |c| async move { self.list_dir(&c, level).await },
        )
        .await
    }

    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        let ltx_dir = self.path("ltx");
        self.run("list", &ltx_dir, |c| {
            async move {
                // One listing of `ltx/`, then one per level directory present.
                let mut all = Vec::new();
                let levels = self.levels_present(&c).await?;
                for level in levels {
                    all.extend(self.list_dir(&c, level).await?);
                }
                all.sort_by_key(|f| (f.level, f.min_txid, f.max_txid));
                Ok(all)
            }
        })
        .await
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        let path = self.file(level, min, max);
        self.run("get", &path, |c| {
            let path = path.clone();
            async move {
                let mut f = c
                    .sftp
                    .open(path.clone())
                    .await
                    .map_err(|e| self.fail("get", &path, e))?;
                if offset > 0 {
                    f.seek(SeekFrom::Start(offset))
                        .await
                        .map_err(|e| self.io_fail("get", &path, e))?;
                }
                Ok(Box::pin(f) as ObjectReader)
            }
        })
        .await
    }

    async fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectReader, StorageError> {
        let body = self.open(level, min, max, offset).await?;
        Ok(Box::pin(body.take(len)))
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        let name = self.file(level, min, max);
        let _permit = self
            .puts
            .acquire()
            .await
            .map_err(|_| StorageError::Permanent {
                op: "put",
                key: self.at(&name),
                reason: "the client is shutting down".into(),
            })?;
        let size = self
            .run("put", &name, |c| {
                let name = name.clone();
                async move { self.put_on(&c, level, &name, src, timestamp_ms).await }
            })
            .await?;
        Ok(LtxFileInfo {
            level,
            min_txid: min,
            max_txid: max,
            size,
            created_at: DateTime::<Utc>::from_timestamp_millis(timestamp_ms).unwrap_or_default(),
            encrypted: !self.suffix.is_empty(),
        })
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        if files.is_empty() {
            return Ok(());
        }
        // Each file is deleted under its own name, whichever view lists it; a name given twice
        // is removed once.
        let sealed = self.sealed_view();
        let mut paths: Vec<String> = files
            .iter()
            .map(|f| {
                let view = if f.encrypted { &sealed } else { self };
                view.file(f.level, f.min_txid, f.max_txid)
            })
            .collect();
        paths.sort_unstable();
        paths.dedup();
        self.run("delete", &paths[0], |c| {
            let paths = paths.clone();
            async move {
                // SFTP answers requests out of order: 16 removals in flight on one session.
                let mut results = futures_util::stream::iter(paths)
                    .map(|p| {
                        let c = c.clone();
                        async move {
                            match c.sftp.remove_file(p.clone()).await {
                                Ok(()) => Ok(()),
                                Err(e) => match self.fail("delete", &p, e) {
                                    StorageError::NotFound(_) => Ok(()),
                                    e => Err(e),
                                },
                            }
                        }
                    })
                    .buffer_unordered(16);
                while let Some(r) = results.next().await {
                    r?;
                }
                Ok(())
            }
        })
        .await
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.aux_path(name)?;
        self.run("get", &path, |c| {
            let path = path.clone();
            async move {
                match c.sftp.read(path.clone()).await {
                    Ok(b) => Ok(Some(b)),
                    Err(e) => match self.fail("get", &path, e) {
                        StorageError::NotFound(_) => Ok(None),
                        e => Err(e),
                    },
                }
            }
        })
        .await
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        let path = self.aux_path(name)?;
        self.run("put", &path, |c| {
            let (path, data) = (path.clone(), data.clone());
            async move {
                let root = self.path("");
                let root = root.trim_end_matches('/');
                if !root.is_empty() {
                    self.make_dirs(&c, root).await?;
                }
                // Written aside, then put in place: readers see the old or the new one whole
                // (SFTP's rename will not replace, so the old one goes first: a reader in
                // between sees none, and the lease looks for this temporary file before it
                // takes a missing lease for free: `aux_write_in_flight`).
                let tmp = format!("{path}{}", crate::util::fsutil::unique_tmp_suffix());
                let placed = async {
                    match self.write_small(&c, &tmp, &data).await {
                        // The directory was removed behind the cache's back: make it again,
                        // once.
                        Err(StorageError::NotFound(_)) if !root.is_empty() => {
                            self.made_lock().clear();
                            self.make_dirs(&c, root).await?;
                            self.write_small(&c, &tmp, &data).await?;
                        }
                        r => r?,
                    }
                    match c.sftp.remove_file(path.clone()).await {
                        Ok(()) => {}
                        Err(e) => match self.fail("put", &path, e) {
                            StorageError::NotFound(_) => {}
                            e => return Err(e),
                        },
                    }
                    c.sftp
                        .rename(tmp.clone(), path.clone())
                        .await
                        .map_err(|e| self.fail("put", &path, e))
                }
                .await;
                // Each attempt's name is its own: a failed one must not stay behind.
                if placed.is_err() {
                    let _ = c.sftp.remove_file(tmp.clone()).await;
                }
                placed
            }
        })
        .await
    }

    fn replaces_aux_in_two_steps(&self) -> bool {
        true
    }

    /// A `<name>.<pid>-<random>.tmp` beside it changed in the last minute (by the server's
    /// clock): [`ReplicaClient::write_aux`] under way, between its remove and its rename. An
    /// older one is a crashed write's. One listing.
    async fn aux_write_in_flight(&self, name: &str) -> Result<bool, StorageError> {
        crate::storage::check_aux_name(name)?;
        let dir = self.root_dir();
        self.run("list", &dir, |c| {
            let dir = dir.clone();
            async move {
                match c.sftp.read_dir(dir.clone()).await {
                    Ok(entries) => {
                        let now = Utc::now().timestamp();
                        Ok(entries.into_iter().any(|e| {
                            let n = e.file_name();
                            let recent = e
                                .metadata()
                                .mtime
                                .is_none_or(|t| now - i64::from(t) < AUX_WRITE_STALE_S);
                            crate::util::fsutil::strip_unique_tmp_suffix(&n) == Some(name) && recent
                        }))
                    }
                    Err(e) => match self.fail("list", &dir, e) {
                        StorageError::NotFound(_) => Ok(false),
                        e => Err(e),
                    },
                }
            }
        })
        .await
    }

    /// The root and the level directories ([`tmp_names::old_enough`]: the server's
    /// modification time, and the time in a put's name, by this host's clock).
    async fn sweep_tmp(&self, older_than: std::time::Duration) -> Result<Swept, StorageError> {
        let root = self.root_dir();
        let older_s = i64::try_from(older_than.as_secs()).unwrap_or(i64::MAX);
        self.run("sweep", &root, |c| {
            let root = root.clone();
            async move {
                let levels = self.levels_present(&c).await?;
                let dirs = std::iter::once((root, false))
                    .chain(levels.into_iter().map(|l| (self.level_dir(l), true)));
                let mut swept = Swept::listing();
                for (dir, in_level) in dirs {
                    let entries = match c.sftp.read_dir(dir.clone()).await {
                        Ok(entries) => entries,
                        Err(e) => match self.fail("list", &dir, e) {
                            StorageError::NotFound(_) => continue,
                            e => return Err(e),
                        },
                    };
                    let now = Utc::now().timestamp();
                    for e in entries {
                        let name = e.file_name();
                        let meta = e.metadata();
                        let changed = meta.mtime.filter(|_| !meta.is_dir()).map(i64::from);
                        if !swept.judge(&name, in_level, changed, now, older_s) {
                            continue;
                        }
                        let path = format!("{}/{name}", dir.trim_end_matches('/'));
                        match c.sftp.remove_file(path.clone()).await {
                            Ok(()) => swept.removed += 1,
                            Err(e) => match self.fail("delete", &path, e) {
                                StorageError::NotFound(_) => {}
                                e => return Err(e),
                            },
                        }
                    }
                }
                Ok(swept)
            }
        })
        .await
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        let path = self.aux_path(name)?;
        self.run("delete", &path, |c| {
            let path = path.clone();
            async move {
                match c.sftp.remove_file(path.clone()).await {
                    Ok(()) => Ok(()),
                    Err(e) => match self.fail("delete", &path, e) {
                        StorageError::NotFound(_) => Ok(()),
                        e => Err(e),
                    },
                }
            }
        })
        .await
    }
}
