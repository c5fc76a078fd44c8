//! The storage seam: what a replica destination must do, with written semantics.
//!
//! Semantics every backend keeps (checked by one conformance suite run against each):
//! - `put` is atomic and whole: a reader sees the old state or the complete new object, never
//!   a prefix. Objects are immutable once written; their key is their level and TXID range.
//!   (One exception, above this seam: a level-9 snapshot that a verify found unrestorable is
//!   deleted, then replaced whole by the seed that heals the replica; see
//!   `Replica::replace_snapshot`.)
//! - `list` returns one level's files sorted by (min TXID, max TXID); foreign names are skipped.
//! - `open` of a missing object is [`StorageError::NotFound`], distinct from other failures.
//! - `delete` of a missing object succeeds.
//! - Errors say whether a retry may help ([`StorageError::is_retryable`]).
//! - Auxiliary objects (`read_aux`, `write_aux`, `delete_aux`) live at the replica root, beside
//!   the level directories and outside them, so neither replicad's nor Litestream's listings
//!   ever see them. They are small, written whole (same atomicity as `put`), and are not
//!   immutable: the single-writer lease ([`crate::replicate::lease`]) is rewritten in place.
//!
//! Backends are dispatched through the [`AnyClient`] enum rather than `dyn`, so their futures
//! stay concrete (and `Send`) without boxing every call.

pub mod age;
pub mod faulty;
pub mod feed;
pub mod file;
pub mod object;
pub mod s3;
pub mod sftp;
pub mod tmp_names;

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::io::AsyncRead;

use crate::ltx::{Header, TxId};
use crate::storage::age::AgeClient;
use crate::storage::age::keys::AgeKeys;
use crate::storage::faulty::FaultyClient;
use crate::storage::file::FileClient;
use crate::storage::object::{ObjectClient, ObjectConfig};
use crate::storage::s3::{S3Client, S3Config};
use crate::storage::sftp::SftpClient;

/// Name suffix of age-encrypted objects (`<min>-<max>.ltx.age`).
pub const SEALED_SUFFIX: &str = ".age";

/// Level of full snapshots (`0000000000000001-<max>.ltx`).
pub const SNAPSHOT_LEVEL: u8 = 9;

/// One LTX file on a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LtxFileInfo {
    /// Level: 0 = one file per sync, 1..=8 compactions, 9 snapshots.
    pub level: u8,
    /// First TXID covered.
    pub min_txid: TxId,
    /// Last TXID covered.
    pub max_txid: TxId,
    /// Object size in bytes.
    pub size: u64,
    /// When the object was written (file mtime or object LastModified).
    pub created_at: DateTime<Utc>,
    /// The object is age-encrypted (`<min>-<max>.ltx.age`); `size` is then the ciphertext's.
    pub encrypted: bool,
}

/// A readable object body.
pub type ObjectReader = Pin<Box<dyn AsyncRead + Send>>;

/// The op of a [`StorageError::Permanent`] that says a file is there but damaged (its LTX
/// header short or not one, a sealed file that is not an age file): the file's own fault, not
/// the store's or the keys'.
pub const DAMAGED: &str = "damaged";

/// The op of a [`StorageError::Transient`] whose body ended inside a format's header (a sealed
/// file's age header): a cut connection or a truncated file, which only a second read tells
/// apart ([`AnyClient::read_header`]); every other reader retries it as any passing fault.
pub const ENDED_EARLY: &str = "ended early";

/// Failures of a replica client, classified for retry decisions.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The object or replica does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A failure that may pass (network, timeouts, 5xx, interrupted I/O).
    #[error("{op} {key}: {reason}")]
    Transient {
        /// Operation ("put", "list", ...).
        op: &'static str,
        /// Key or path involved.
        key: String,
        /// What failed.
        reason: String,
    },
    /// A conditional write found its condition false: the object already exists (a put
    /// never replaces one) or changed since it was read (the lease).
    #[error("{op} {key}: the object exists or changed (another writer?)")]
    Conflict {
        /// Operation.
        op: &'static str,
        /// Key or path involved.
        key: String,
    },
    /// A failure a retry will not fix (permissions, bad configuration, full disk is not here:
    /// it passes when space is freed, so it is transient).
    #[error("{op} {key}: {reason}")]
    Permanent {
        /// Operation.
        op: &'static str,
        /// Key or path involved.
        key: String,
        /// What failed.
        reason: String,
    },
}

impl StorageError {
    /// True if retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StorageError::Transient { .. })
    }

    /// Classifies an I/O error on `key`.
    pub fn from_io(op: &'static str, key: &Path, e: io::Error) -> Self {
        let key = key.display().to_string();
        match e.kind() {
            io::ErrorKind::NotFound => StorageError::NotFound(key),
            io::ErrorKind::PermissionDenied => StorageError::Permanent {
                op,
                key,
                reason: format!(
                    "{e}; hint: the user replicad runs as needs read and write access to the \
                     replica directory"
                ),
            },
            io::ErrorKind::ReadOnlyFilesystem => StorageError::Permanent {
                op,
                key,
                reason: format!("{e}; hint: the replica directory must be on a writable mount"),
            },
            io::ErrorKind::InvalidInput => StorageError::Permanent {
                op,
                key,
                reason: e.to_string(),
            },
            io::ErrorKind::StorageFull => StorageError::Transient {
                op,
                key,
                reason: format!("{e}; hint: free space on the replica's disk; uploads resume"),
            },
            _ => StorageError::Transient {
                op,
                key,
                reason: e.to_string(),
            },
        }
    }
}

/// What every replica backend provides.
pub trait ReplicaClient {
    /// Backend name for logs and metrics ("file", "s3").
    fn kind(&self) -> &'static str;

    /// Human-readable location (never includes credentials).
    fn location(&self) -> String;

    /// Files of one level, sorted by (min, max) TXID.
    fn list(
        &self,
        level: u8,
    ) -> impl Future<Output = Result<Vec<LtxFileInfo>, StorageError>> + Send;

    /// Files of every level, 0 through 9, sorted by (level, min, max). Backends that can list
    /// the whole replica in one request (S3: one ListObjectsV2 page per 1000 keys) override
    /// it: a start or a restore of thousands of databases pays one request each, not ten.
    fn list_all(&self) -> impl Future<Output = Result<Vec<LtxFileInfo>, StorageError>> + Send
    where
        Self: Sync,
    {
        async move {
            let mut all = Vec::new();
            for level in 0..=SNAPSHOT_LEVEL {
                all.extend(self.list(level).await?);
            }
            Ok(all)
        }
    }

    /// Opens a file's body from byte `offset` to its end.
    fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> impl Future<Output = Result<ObjectReader, StorageError>> + Send;

    /// Opens `len` bytes of a file's body from byte `offset` (parallel chunked downloads).
    fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<ObjectReader, StorageError>> + Send
    where
        Self: Sync,
    {
        async move {
            use tokio::io::AsyncReadExt;
            let body = self.open(level, min, max, offset).await?;
            Ok(Box::pin(body.take(len)) as ObjectReader)
        }
    }

    /// Writes a whole file atomically from a local path; `timestamp_ms` is the LTX header's.
    /// It never replaces an existing object where the backend can check that atomically
    /// (file: always; S3: when the server honours `If-None-Match`): such a put fails with
    /// [`StorageError::Conflict`] (see [`put_new`] for retries of a put that went through).
    /// `src` is never written again by the caller: a directory replica may hard-link it.
    fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> impl Future<Output = Result<LtxFileInfo, StorageError>> + Send;

    /// Deletes files; missing ones are not an error.
    fn delete(
        &self,
        files: &[LtxFileInfo],
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Reads the auxiliary object `name` (a plain file name) at the replica root; `None`
    /// when it does not exist.
    fn read_aux(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StorageError>> + Send;

    /// Writes the auxiliary object `name` whole, replacing any previous one.
    fn write_aux(
        &self,
        name: &str,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Deletes the auxiliary object `name`; a missing one is not an error.
    fn delete_aux(&self, name: &str) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// Whether [`ReplicaClient::write_aux`] removes the old object before the new one is in
    /// place (SFTP's rename will not replace; a WebDAV MOVE deletes the target first): a
    /// reader in between finds none, which the lease must not take for free.
    fn replaces_aux_in_two_steps(&self) -> bool {
        false
    }

    /// Whether a [`ReplicaClient::write_aux`] of `name` may be under way: its temporary file
    /// is there (one listing where [`ReplicaClient::replaces_aux_in_two_steps`]; elsewhere
    /// false, without a request).
    fn aux_write_in_flight(
        &self,
        _name: &str,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send {
        std::future::ready(Ok(false))
    }

    /// Removes the temporary files that writes cut short left behind (a `kill -9`, a
    /// connection lost before the cleanup), last changed more than `older_than` ago, and
    /// says how many, and how many of ours it kept as too young. Only names [`tmp_names::is_leftover_tmp`] accepts are touched. Backends that
    /// never write under a temporary name (S3, GCS, Azure) have none and make no request.
    fn sweep_tmp(
        &self,
        _older_than: std::time::Duration,
    ) -> impl Future<Output = Result<tmp_names::Swept, StorageError>> + Send {
        std::future::ready(Ok(tmp_names::Swept::default()))
    }

    /// [`ReplicaClient::read_aux`] with the object's version (S3: its ETag) when the backend
    /// has one.
    fn read_aux_versioned(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Versioned>, StorageError>> + Send
    where
        Self: Sync,
    {
        async move { Ok(self.read_aux(name).await?.map(|d| (d, None))) }
    }

    /// Writes the auxiliary object `name` only if `cond` holds, atomically, and returns its
    /// new version; [`StorageError::Conflict`] when it does not hold. A backend that cannot
    /// check conditions writes unconditionally and returns `None` (the lease finds out with
    /// a probe, see [`crate::replicate::lease`]).
    fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> impl Future<Output = Result<Option<String>, StorageError>> + Send
    where
        Self: Sync,
    {
        let _ = cond;
        async move { self.write_aux(name, data).await.map(|()| None) }
    }
}

/// Checks that `name` names an auxiliary object: a plain file name at the replica root, never
/// a path, `.`, `..` or the level tree `ltx`.
pub(crate) fn check_aux_name(name: &str) -> Result<(), StorageError> {
    if name.is_empty() || name.contains('/') || matches!(name, "." | ".." | "ltx") {
        return Err(StorageError::Permanent {
            op: "aux",
            key: name.to_string(),
            reason: "not a plain file name".into(),
        });
    }
    Ok(())
}

/// The single-writer lease's object at the replica root ([`crate::replicate::lease`]); named
/// here because a sweep must know its temporary files.
pub const LEASE_NAME: &str = "replicad.lease";

/// The age recipients note at the root of an encrypted replica ([`age::NOTE_NAME`]); named
/// here because a sweep must know its temporary files.
pub const AGE_NOTE_NAME: &str = "age-recipients.txt";

/// A version no object ever has: a write conditional on it must fail where conditions are
/// honoured, which is how the lease learns whether a backend honours them.
pub const PROBE_VERSION: &str = "\"replicad-probe-not-an-etag\"";

/// An auxiliary object's bytes and version (S3: ETag; `None` where there are none).
pub type Versioned = (Vec<u8>, Option<String>);

/// The condition of [`ReplicaClient::write_aux_if`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteIf {
    /// Only if no such object exists.
    Absent,
    /// Only if the object's version is this one.
    Version(String),
}

/// [`ReplicaClient::put`], where a [`StorageError::Conflict`] whose existing object holds
/// exactly the bytes of `src` counts as done: an earlier attempt went through but its answer
/// was lost. Any other existing object stays a conflict.
pub async fn put_new<C: ReplicaClient + Sync>(
    client: &C,
    level: u8,
    min: TxId,
    max: TxId,
    src: &Path,
    timestamp_ms: i64,
) -> Result<LtxFileInfo, StorageError> {
    match client.put(level, min, max, src, timestamp_ms).await {
        Err(StorageError::Conflict { op, key }) => {
            if same_content(client, level, min, max, src).await? {
                // As listed (its stored size, and whether it is the encrypted name).
                let listed = client.list(level).await?;
                listed
                    .into_iter()
                    .find(|f| (f.min_txid, f.max_txid) == (min, max))
                    .ok_or(StorageError::NotFound(crate::ltx::format_filename(
                        min, max,
                    )))
            } else {
                Err(StorageError::Conflict { op, key })
            }
        }
        r => r,
    }
}

/// Whether the stored object's (plaintext) bytes equal those of `src`.
async fn same_content<C: ReplicaClient + Sync>(
    client: &C,
    level: u8,
    min: TxId,
    max: TxId,
    src: &Path,
) -> Result<bool, StorageError> {
    use tokio::io::AsyncReadExt;
    let key = crate::ltx::format_filename(min, max);
    let io = |e: std::io::Error| StorageError::Transient {
        op: "compare",
        key: key.clone(),
        reason: e.to_string(),
    };
    let mut remote = client.open(level, min, max, 0).await?;
    let mut local = tokio::fs::File::open(src).await.map_err(io)?;
    let (mut a, mut b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = local.read(&mut a).await.map_err(io)?;
        if n == 0 {
            let mut one = [0u8; 1];
            return Ok(remote.read(&mut one).await.map_err(io)? == 0);
        }
        match remote.read_exact(&mut b[..n]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(io(e)),
        }
        if a[..n] != b[..n] {
            return Ok(false);
        }
    }
}

/// Every backend, behind one type.
#[derive(Debug, Clone)]
pub enum AnyClient {
    /// A local directory.
    File(FileClient),
    /// An S3-compatible bucket.
    S3(S3Client),
    /// A Google Cloud Storage bucket, an Azure Blob Storage container or a WebDAV server.
    Object(Box<ObjectClient>),
    /// A directory on an SFTP server.
    Sftp(SftpClient),
    /// Any client with injected faults (tests and failure drills).
    Faulty(Box<FaultyClient>),
    /// A file or S3 client seen through plain and age-encrypted names (see [`AgeClient`]).
    Age(Box<AgeClient>),
}

impl AnyClient {
    /// Builds a client from a replica URL: `file:///abs/path`, a plain path,
    /// `s3://BUCKET/PATH?endpoint=...` (credentials from the standard AWS chain), `gs://`,
    /// `abs://`, `webdav[s]://` (no credentials) or `sftp://USER@HOST/PATH` (the host key from
    /// `~/.ssh/known_hosts`, but no key: a config file gives those).
    pub fn from_url(url: &str) -> Result<AnyClient, String> {
        if url.starts_with("s3://") {
            return Ok(AnyClient::S3(S3Client::new(S3Config::from_url(url)?)));
        }
        if url.starts_with("sftp://") {
            let cfg = crate::storage::sftp::SftpConfig::from_url(url)?;
            cfg.validate()?;
            return Ok(AnyClient::Sftp(SftpClient::new(cfg)));
        }
        if ["gs://", "abs://", "webdav://", "webdavs://"]
            .iter()
            .any(|s| url.starts_with(s))
        {
            return Ok(AnyClient::Object(Box::new(ObjectClient::new(
                ObjectConfig::from_url(url)?,
            )?)));
        }
        if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(format!(
                    "file URL {} must be absolute (file:///path)",
                    crate::storage::s3::redact_url(url)
                ));
            }
            return Ok(AnyClient::File(FileClient::new(PathBuf::from(rest))));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return Err(format!(
                "unsupported replica URL scheme {scheme:?} in {}",
                crate::storage::s3::redact_url(url)
            ));
        }
        if url.is_empty() {
            return Err("empty replica path".into());
        }
        Ok(AnyClient::File(FileClient::new(PathBuf::from(url))))
    }

    /// Sees this replica through both plain and age-encrypted names, writing with `keys`
    /// (plain when they hold no recipient). Clients without an encrypted view are returned
    /// unchanged.
    pub fn with_age(self, keys: Arc<AgeKeys>) -> AnyClient {
        match AgeClient::new(self, keys) {
            Ok(c) => AnyClient::Age(Box::new(c)),
            Err(inner) => inner,
        }
    }

    /// True if the replica is a local directory (read in place, no download).
    pub fn is_local(&self) -> bool {
        match self {
            AnyClient::File(_) => true,
            AnyClient::Age(c) => c.plain().is_local(),
            _ => false,
        }
    }

    /// The root directory of a directory replica (through the age wrapper too).
    pub fn local_root(&self) -> Option<&Path> {
        match self {
            AnyClient::File(c) => Some(c.root()),
            AnyClient::Age(c) => c.plain().local_root(),
            _ => None,
        }
    }

    /// The age wrapper, if this client is one.
    pub fn age(&self) -> Option<&AgeClient> {
        match self {
            AnyClient::Age(c) => Some(c),
            _ => None,
        }
    }

    /// The S3 client, if this is a plain one: the client that can upload a segment while it
    /// is being staged ([`S3Client::put_streamed`]).
    /// A client with injected faults does not stream: its faults would be bypassed.
    pub fn streaming(&self) -> Option<&S3Client> {
        match self {
            AnyClient::S3(c) => Some(c),
            AnyClient::Age(a) if !a.encrypts() => a.plain().streaming(),
            _ => None,
        }
    }

    /// Reads the last `n` plaintext bytes of a file: a ranged read of a plain one, the whole
    /// decrypted stream (keeping its tail) of an encrypted one.
    pub async fn read_tail(&self, info: &LtxFileInfo, n: usize) -> Result<Vec<u8>, StorageError> {
        use tokio::io::AsyncReadExt;
        let key = crate::ltx::format_filename(info.min_txid, info.max_txid);
        let offset = if info.encrypted {
            0
        } else {
            info.size.saturating_sub(n as u64)
        };
        let mut r = self
            .open(info.level, info.min_txid, info.max_txid, offset)
            .await?;
        let mut tail: std::collections::VecDeque<u8> = std::collections::VecDeque::with_capacity(n);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let got = r
                .read(&mut buf)
                .await
                .map_err(|e| StorageError::Transient {
                    op: "get",
                    key: key.clone(),
                    reason: e.to_string(),
                })?;
            if got == 0 {
                break;
            }
            tail.extend(&buf[..got]);
            let extra = tail.len().saturating_sub(n);
            tail.drain(..extra);
        }
        Ok(tail.into())
    }

    /// Reads the 100-byte header of one file. A header that is there but damaged (short, or
    /// not an LTX header) is a [`StorageError::Permanent`] of op [`DAMAGED`]. A body a network
    /// cut ends early looks the same once, so a short read is read again: only the same short
    /// outcome twice is the file's own.
    pub async fn read_header(&self, info: &LtxFileInfo) -> Result<Header, StorageError> {
        let key = || crate::ltx::format_filename(info.min_txid, info.max_txid);
        let damaged = |reason: String| StorageError::Permanent {
            op: DAMAGED,
            key: key(),
            reason,
        };
        let mut first = None;
        let buf = loop {
            let read = match self.read_prefix(info).await {
                // A sealed file says it at the open: short (a cut or a truncated file) or
                // not an age file.
                Err(
                    StorageError::Permanent {
                        op: DAMAGED,
                        reason,
                        ..
                    }
                    | StorageError::Transient {
                        op: ENDED_EARLY,
                        reason,
                        ..
                    },
                ) => Prefix::Broken(std::io::ErrorKind::InvalidData, reason),
                read => read?,
            };
            match (read, &first) {
                (Prefix::Whole(buf), _) => break buf,
                (short, None) => first = Some(short),
                (short, Some(before)) if short == *before => {
                    return Err(damaged(short.to_string()));
                }
                (short, Some(before)) => {
                    return Err(StorageError::Transient {
                        op: "read header",
                        key: key(),
                        reason: format!("{before}, then {short}"),
                    });
                }
            }
        };
        Header::decode(&buf).map_err(|e| damaged(e.to_string()))
    }

    /// The first [`crate::ltx::HEADER_SIZE`] bytes of a file, or how reading them fell short.
    async fn read_prefix(&self, info: &LtxFileInfo) -> Result<Prefix, StorageError> {
        use tokio::io::AsyncReadExt;
        let mut r = self
            .open(info.level, info.min_txid, info.max_txid, 0)
            .await?;
        let mut buf = [0u8; crate::ltx::HEADER_SIZE];
        let mut got = 0;
        while got < buf.len() {
            match r.read(&mut buf[got..]).await {
                Ok(0) => return Ok(Prefix::Short(got)),
                Ok(n) => got += n,
                // What a file cut short or not decrypting says (age's stream reader): the
                // file's fault if a second read says it again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                    ) =>
                {
                    return Ok(Prefix::Broken(e.kind(), e.to_string()));
                }
                Err(e) => {
                    return Err(StorageError::Transient {
                        op: "read header",
                        key: crate::ltx::format_filename(info.min_txid, info.max_txid),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(Prefix::Whole(buf))
    }
}

/// What reading a file's header gave ([`AnyClient::read_header`]).
#[derive(Debug, PartialEq)]
enum Prefix {
    Whole([u8; crate::ltx::HEADER_SIZE]),
    /// The body ended after this many bytes.
    Short(usize),
    /// The body failed as a damaged file's does.
    Broken(std::io::ErrorKind, String),
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prefix::Whole(_) => write!(f, "a whole header"),
            Prefix::Short(n) => write!(
                f,
                "ended after {n} bytes, shorter than an LTX header ({})",
                crate::ltx::HEADER_SIZE
            ),
            Prefix::Broken(_, e) => write!(f, "broke within its header ({e})"),
        }
    }
}

/// Forwards a call to whichever client `self` holds: one line per method instead of one arm
/// per backend (a new backend is a new arm here only).
macro_rules! dispatch {
    ($any:expr, $c:ident => $call:expr) => {
        match $any {
            AnyClient::File($c) => $call,
            AnyClient::S3($c) => $call,
            AnyClient::Object($c) => $call,
            AnyClient::Sftp($c) => $call,
            AnyClient::Faulty($c) => $call,
            AnyClient::Age($c) => $call,
        }
    };
}

impl ReplicaClient for AnyClient {
    fn kind(&self) -> &'static str {
        dispatch!(self, c => c.kind())
    }

    fn location(&self) -> String {
        dispatch!(self, c => c.location())
    }

    fn replaces_aux_in_two_steps(&self) -> bool {
        dispatch!(self, c => c.replaces_aux_in_two_steps())
    }

    async fn aux_write_in_flight(&self, name: &str) -> Result<bool, StorageError> {
        dispatch!(self, c => c.aux_write_in_flight(name).await)
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        dispatch!(self, c => c.list(level).await)
    }

    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        dispatch!(self, c => c.list_all().await)
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        dispatch!(self, c => c.open(level, min, max, offset).await)
    }

    async fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectReader, StorageError> {
        dispatch!(self, c => c.open_range(level, min, max, offset, len).await)
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        dispatch!(self, c => c.put(level, min, max, src, timestamp_ms).await)
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        dispatch!(self, c => c.delete(files).await)
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        dispatch!(self, c => c.read_aux(name).await)
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        dispatch!(self, c => c.write_aux(name, data).await)
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        dispatch!(self, c => c.delete_aux(name).await)
    }

    async fn read_aux_versioned(&self, name: &str) -> Result<Option<Versioned>, StorageError> {
        dispatch!(self, c => c.read_aux_versioned(name).await)
    }

    async fn sweep_tmp(
        &self,
        older_than: std::time::Duration,
    ) -> Result<tmp_names::Swept, StorageError> {
        dispatch!(self, c => c.sweep_tmp(older_than).await)
    }

    async fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> Result<Option<String>, StorageError> {
        dispatch!(self, c => c.write_aux_if(name, data, cond).await)
    }
}

#[cfg(test)]
mod tests;
