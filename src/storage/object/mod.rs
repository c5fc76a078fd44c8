//! Replicas on Google Cloud Storage, Azure Blob Storage and WebDAV servers, through OpenDAL,
//! laid out as Litestream v0.5 lays them out for `gs`, `abs` and `webdav`:
//! `<path>/ltx/<level>/<min>-<max>.ltx` (the directory layout, level in decimal). On GCS each
//! object carries the metadata `litestream-timestamp` (RFC 3339, nanoseconds) = the LTX header
//! timestamp, as Litestream writes it; Azure metadata names cannot hold a `-`, and Litestream
//! writes none there.
//!
//! Invariants:
//! - A segment is written conditionally (`If-None-Match: *` on Azure, `ifGenerationMatch=0` on
//!   GCS), so an object is never replaced, and whole: one upload up to [`SINGLE_PUT_MAX`],
//!   above it a resumable upload (GCS) or a block list (Azure) committed only after every part.
//!   On WebDAV a segment is streamed under a temporary name in its level, then moved to its
//!   name with `Overwrite: F`, which the server refuses if the name exists (see `webdav`), so
//!   a reader never sees a partial one and never a replaced one. Litestream's listing skips
//!   the temporary names.
//! - Listing is by level prefix and filtered by name, never by a TXID name prefix
//!   (Litestream #1537: seeking by name prefix stalls its compaction).
//! - Secrets (account key, SAS token) never appear in `Debug`, `location()`, logs or errors.

mod config;
mod errors;
mod webdav;

use std::path::Path;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use opendal::{ErrorKind, Operator};
use tokio::io::AsyncReadExt;

pub use config::{ObjectConfig, Service};
use errors::classify;

use crate::ltx::{self, TxId};
use crate::storage::tmp_names::{self, Swept};
use crate::storage::{
    LtxFileInfo, ObjectReader, ReplicaClient, SNAPSHOT_LEVEL, StorageError, Versioned, WriteIf,
};

/// Largest segment written with one upload; larger ones go in parts.
pub const SINGLE_PUT_MAX: u64 = 8 * 1024 * 1024;
/// Size of one part of a multipart upload.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts of one upload in flight.
const PARTS_IN_FLIGHT: usize = 4;
/// GCS metadata holding the LTX header timestamp (Litestream's key).
const TIMESTAMP_KEY: &str = "litestream-timestamp";

/// A GCS or Azure replica client. Cheap to clone.
#[derive(Clone)]
pub struct ObjectClient {
    cfg: std::sync::Arc<ObjectConfig>,
    op: Operator,
    /// Appended to every object name: `""`, or `".age"` for the encrypted view.
    suffix: &'static str,
    /// WebDAV: collections known to exist.
    dirs: std::sync::Arc<tokio::sync::Mutex<std::collections::HashSet<String>>>,
    /// WebDAV: the segment upload (streamed PUT, then MOVE without overwrite).
    webdav: Option<webdav::Uploader>,
}

impl std::fmt::Debug for ObjectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectClient")
            .field("url", &self.cfg.url())
            .finish()
    }
}

impl ObjectClient {
    /// A client for `cfg`; nothing is contacted until the first call.
    pub fn new(cfg: ObjectConfig) -> Result<ObjectClient, String> {
        let op = cfg.build()?;
        let webdav = match cfg.service {
            Service::Webdav => Some(webdav::Uploader::new(&cfg)?),
            _ => None,
        };
        Ok(ObjectClient {
            cfg: std::sync::Arc::new(cfg),
            op,
            suffix: "",
            dirs: Default::default(),
            webdav,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ObjectConfig {
        &self.cfg
    }

    /// The same replica seen through the names of age-encrypted files (`<min>-<max>.ltx.age`).
    pub fn sealed_view(&self) -> ObjectClient {
        ObjectClient {
            suffix: crate::storage::SEALED_SUFFIX,
            ..self.clone()
        }
    }

    fn root(&self) -> String {
        if self.cfg.path.is_empty() {
            String::new()
        } else {
            format!("{}/", self.cfg.path)
        }
    }

    fn level_prefix(&self, level: u8) -> String {
        format!("{}ltx/{level}/", self.root())
    }

    fn key(&self, level: u8, min: TxId, max: TxId) -> String {
        format!(
            "{}{}{}",
            self.level_prefix(level),
            ltx::format_filename(min, max),
            self.suffix
        )
    }

    fn aux_key(&self, name: &str) -> Result<String, StorageError> {
        crate::storage::check_aux_name(name)?;
        Ok(format!("{}{name}", self.root()))
    }

    fn fail(&self, op: &'static str, key: &str, e: opendal::Error) -> StorageError {
        classify(&self.cfg, op, key, e, false)
    }

    /// Lists everything under `prefix` (a level directory, or `ltx/` for every level).
    async fn list_under(
        &self,
        prefix: &str,
        only_level: Option<u8>,
    ) -> Result<Vec<LtxFileInfo>, StorageError> {
        let fail = |e| classify(&self.cfg, "list", prefix, e, true);
        let mut lister = match self.op.lister_with(prefix).recursive(true).await {
            Ok(l) => l,
            // A collection never created is an empty replica.
            Err(e) if e.kind() == ErrorKind::NotFound && self.cfg.service == Service::Webdav => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(fail(e)),
        };
        let strip = format!("{}ltx/", self.root());
        let mut out = Vec::new();
        while let Some(entry) = lister.next().await {
            let entry = entry.map_err(fail)?;
            let key = entry.path().trim_start_matches('/');
            let Some((level, name)) = key.strip_prefix(&strip).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            let Some(level) = level.parse::<u8>().ok().filter(|l| *l <= SNAPSHOT_LEVEL) else {
                continue;
            };
            if only_level.is_some_and(|l| l != level) {
                continue;
            }
            let Some((min, max)) = name
                .strip_suffix(self.suffix)
                .filter(|n| !n.contains('/'))
                .filter(|n| !n.ends_with(crate::storage::SEALED_SUFFIX))
                .and_then(ltx::parse_filename)
            else {
                continue;
            };
            let meta = entry.metadata();
            out.push(LtxFileInfo {
                level,
                min_txid: min,
                max_txid: max,
                size: meta.content_length(),
                created_at: meta
                    .last_modified()
                    .map(|t| DateTime::<Utc>::from(std::time::SystemTime::from(t)))
                    .unwrap_or_default(),
                encrypted: !self.suffix.is_empty(),
            });
        }
        out.sort_by_key(|f| (f.level, f.min_txid, f.max_txid));
        Ok(out)
    }

    async fn get(
        &self,
        key: &str,
        range: impl Into<opendal::BytesRange>,
    ) -> Result<ObjectReader, StorageError> {
        let reader = self
            .op
            .reader_with(key)
            .await
            .map_err(|e| self.fail("get", key, e))?;
        let mut body = reader
            .into_bytes_stream(range)
            .await
            .map_err(|e| self.fail("get", key, e))?;
        // The request goes out on the first poll: take its answer now, so a missing object
        // is NotFound here and not an I/O error in the middle of a read.
        let first = match body.next().await {
            None => return Ok(Box::pin(tokio::io::empty())),
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                return Err(match e.downcast::<opendal::Error>() {
                    Ok(e) => self.fail("get", key, e),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        StorageError::NotFound(errors::at(&self.cfg, key))
                    }
                    Err(e) => StorageError::Transient {
                        op: "get",
                        key: errors::at(&self.cfg, key),
                        reason: errors::scrub(&e.to_string()),
                    },
                });
            }
        };
        // An error later in the body names the signed URL too: scrubbed before a reader,
        // a log line or /status sees it.
        let body = futures_util::stream::iter([Ok(first)])
            .chain(body)
            .map(|r| r.map_err(|e| std::io::Error::new(e.kind(), errors::scrub(&e.to_string()))));
        Ok(Box::pin(tokio_util::io::StreamReader::new(body)))
    }

    /// The object's size, for reads from an offset: ranged reads past the end fail.
    async fn size(&self, key: &str) -> Result<u64, StorageError> {
        self.op
            .stat(key)
            .await
            .map(|m| m.content_length())
            .map_err(|e| self.fail("get", key, e))
    }

    async fn put_file(
        &self,
        key: &str,
        src: &Path,
        size: u64,
        timestamp_ms: i64,
    ) -> Result<(), StorageError> {
        let io = |e: std::io::Error| StorageError::from_io("put", src, e);
        if self.cfg.service == Service::Webdav {
            return self.put_then_move(key, src, size).await;
        }
        let metadata = self.timestamp_metadata(timestamp_ms);
        if size <= SINGLE_PUT_MAX {
            let data = tokio::fs::read(src).await.map_err(io)?;
            self.op
                .write_with(key, data)
                .if_not_exists(true)
                .user_metadata(metadata)
                .await
                .map_err(|e| self.fail("put", key, e))?;
            return Ok(());
        }
        let mut writer = self
            .op
            .writer_with(key)
            .if_not_exists(true)
            .user_metadata(metadata)
            .chunk(PART_SIZE)
            .concurrent(PARTS_IN_FLIGHT)
            .await
            .map_err(|e| self.fail("put", key, e))?;
        let mut file = tokio::fs::File::open(src).await.map_err(io)?;
        let mut buf = vec![0u8; PART_SIZE];
        loop {
            let n = match file.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(io(e));
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = writer.write(buf[..n].to_vec()).await {
                let _ = writer.abort().await;
                return Err(self.fail("put", key, e));
            }
        }
        // Only a complete upload is committed; an aborted one leaves nothing visible.
        writer
            .close()
            .await
            .map(drop)
            .map_err(|e| self.fail("put", key, e))
    }

    /// WebDAV: upload under a temporary name beside `key`, then move it to `key` if free.
    async fn put_then_move(&self, key: &str, src: &Path, size: u64) -> Result<(), StorageError> {
        let Some(up) = &self.webdav else {
            return Err(StorageError::Permanent {
                op: "put",
                key: key.to_string(),
                reason: "internal error: a WebDAV client without its uploader".into(),
            });
        };
        let tmp = tmp_names::put_tmp_name(key);
        self.ensure_dir(key).await?;
        let mut put = up.put(&self.cfg, &tmp, src, size).await;
        if put.as_ref().is_err_and(webdav::is_missing_parent) {
            // The collection was removed behind the cache's back: make it again, once.
            self.dirs.lock().await.clear();
            self.ensure_dir(key).await?;
            put = up.put(&self.cfg, &tmp, src, size).await;
        }
        let uploaded = match put {
            Ok(()) => up.move_new(&self.cfg, &tmp, key).await,
            Err(e) => Err(e),
        };
        if uploaded.is_err() {
            // Best effort: a leftover temporary name is never listed as a segment.
            up.delete(&tmp).await;
        }
        uploaded
    }

    /// WebDAV: creates the collection holding `key` once per client, one creation at a time
    /// (servers answer concurrent MKCOLs of one collection with 423 Locked).
    async fn ensure_dir(&self, key: &str) -> Result<(), StorageError> {
        let Some((dir, _)) = key.rsplit_once('/') else {
            return Ok(());
        };
        let mut made = self.dirs.lock().await;
        if made.contains(dir) {
            return Ok(());
        }
        self.op
            .create_dir(&format!("{dir}/"))
            .await
            .map_err(|e| self.fail("put", dir, e))?;
        made.insert(dir.to_string());
        Ok(())
    }

    fn timestamp_metadata(&self, timestamp_ms: i64) -> Vec<(String, String)> {
        if self.cfg.service != Service::Gcs {
            return Vec::new();
        }
        let t = DateTime::<Utc>::from_timestamp_millis(timestamp_ms).unwrap_or_default();
        vec![(
            TIMESTAMP_KEY.to_string(),
            t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        )]
    }
}

/// The lease's version string, what its conditions compare: the generation on GCS, the
/// ETag elsewhere (an Azure account with blob versioning also reports a version id, which
/// `If-Match` never matches: every read of the lease failed).
fn version_of(service: Service, meta: &opendal::Metadata) -> Option<String> {
    match service {
        Service::Gcs => meta.version().or(meta.etag()),
        _ => meta.etag(),
    }
    .map(str::to_string)
}

impl ReplicaClient for ObjectClient {
    fn kind(&self) -> &'static str {
        self.cfg.service.scheme()
    }

    fn location(&self) -> String {
        self.cfg.url()
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        self.list_under(&self.level_prefix(level), Some(level))
            .await
    }

    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        self.list_under(&format!("{}ltx/", self.root()), None).await
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        let key = self.key(level, min, max);
        if offset == 0 {
            return self.get(&key, ..).await;
        }
        let size = self.size(&key).await?;
        if offset >= size {
            return Ok(Box::pin(tokio::io::empty()));
        }
        self.get(&key, offset..size).await
    }

    async fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectReader, StorageError> {
        if len == 0 {
            return Ok(Box::pin(tokio::io::empty()));
        }
        self.get(&self.key(level, min, max), offset..offset + len)
            .await
    }

    async fn put(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        src: &Path,
        timestamp_ms: i64,
    ) -> Result<LtxFileInfo, StorageError> {
        let key = self.key(level, min, max);
        let size = tokio::fs::metadata(src)
            .await
            .map_err(|e| StorageError::from_io("put", src, e))?
            .len();
        self.put_file(&key, src, size, timestamp_ms).await?;
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
        // Each file is deleted under its own name, whichever view lists it; a name given twice
        // is deleted once (two DELETEs of one path race, and WebDAV locks answer 423).
        let sealed = self.sealed_view();
        let mut keys: Vec<String> = files
            .iter()
            .map(|f| {
                let view = if f.encrypted { &sealed } else { self };
                view.key(f.level, f.min_txid, f.max_txid)
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if self.cfg.service == Service::Azure {
            let first = keys.first().cloned().unwrap_or_default();
            // Azure: batch deletes.
            return self
                .op
                .delete_iter(keys)
                .await
                .map_err(|e| self.fail("delete", &first, e));
        }
        // GCS and WebDAV: one request per object, 16 at a time (fake-gcs-server refuses
        // OpenDAL's batch requests, a GCS batch holds at most 100 anyway, WebDAV has none).
        let mut results = futures_util::stream::iter(keys)
            .map(|key| async move {
                self.op
                    .delete(&key)
                    .await
                    .map_err(|e| self.fail("delete", &key, e))
            })
            .buffer_unordered(16);
        while let Some(r) = results.next().await {
            r?;
        }
        Ok(())
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let key = self.aux_key(name)?;
        match self.op.read(&key).await {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.fail("get", &key, e)),
        }
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        let key = self.aux_key(name)?;
        if self.cfg.service == Service::Webdav {
            // Whole: written aside, then moved over the old one (MOVE replaces in one step).
            self.ensure_dir(&key).await?;
            let tmp = format!("{key}{}", crate::util::fsutil::unique_tmp_suffix());
            let placed = match self.op.write(&tmp, data).await {
                Ok(_) => self.op.rename(&tmp, &key).await,
                Err(e) => Err(e),
            };
            // Each attempt's name is its own: a failed one must not stay behind.
            if placed.is_err() {
                let _ = self.op.delete(&tmp).await;
            }
            return placed.map_err(|e| self.fail("put", &key, e));
        }
        self.op
            .write(&key, data)
            .await
            .map(drop)
            .map_err(|e| self.fail("put", &key, e))
    }

    /// A WebDAV MOVE deletes its target first.
    fn replaces_aux_in_two_steps(&self) -> bool {
        self.cfg.service == Service::Webdav
    }

    /// On WebDAV, a `<name>.<pid>-<random>.tmp` beside it: [`ReplicaClient::write_aux`]
    /// under way, between its write and its MOVE, or one that crashed there. One listing.
    /// Elsewhere a write replaces in one step: false.
    async fn aux_write_in_flight(&self, name: &str) -> Result<bool, StorageError> {
        crate::storage::check_aux_name(name)?;
        if !self.replaces_aux_in_two_steps() {
            return Ok(false);
        }
        let root = self.root();
        let dir = if root.is_empty() { "/" } else { root.as_str() };
        match self.op.list(dir).await {
            Ok(entries) => Ok(entries.iter().any(|e| {
                let key = e.path().trim_start_matches('/');
                key.strip_prefix(root.as_str())
                    .and_then(crate::util::fsutil::strip_unique_tmp_suffix)
                    == Some(name)
            })),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(classify(&self.cfg, "list", &root, e, true)),
        }
    }

    /// WebDAV only (the other services write whole objects, never a temporary one): one
    /// listing of the root and one of the level tree. An entry without a modification time
    /// is kept.
    async fn sweep_tmp(&self, older_than: std::time::Duration) -> Result<Swept, StorageError> {
        if !self.replaces_aux_in_two_steps() {
            return Ok(Swept::default());
        }
        let mut swept = Swept::listing();
        let root = self.root();
        let ltx = format!("{root}ltx/");
        let now = Utc::now().timestamp();
        let older_s = i64::try_from(older_than.as_secs()).unwrap_or(i64::MAX);
        let mut doomed = Vec::new();
        for (dir, recursive) in [(root.as_str(), false), (ltx.as_str(), true)] {
            let listed = self
                .op
                .list_with(if dir.is_empty() { "/" } else { dir })
                .recursive(recursive)
                .await;
            let entries = match listed {
                Ok(entries) => entries,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(classify(&self.cfg, "list", dir, e, true)),
            };
            for e in entries {
                let key = e.path().trim_start_matches('/');
                let Some(rest) = key.strip_prefix(root.as_str()) else {
                    continue;
                };
                let (name, in_level) = match rest.strip_prefix("ltx/").map(|r| r.split_once('/')) {
                    Some(Some((level, name)))
                        if level.parse::<u8>().is_ok_and(|l| l <= SNAPSHOT_LEVEL) =>
                    {
                        (name, true)
                    }
                    None => (rest, false),
                    _ => continue,
                };
                let changed = e
                    .metadata()
                    .last_modified()
                    .map(|t| DateTime::<Utc>::from(std::time::SystemTime::from(t)).timestamp());
                if swept.judge(name, in_level, changed, now, older_s) {
                    doomed.push(key.to_string());
                }
            }
        }
        for key in &doomed {
            match self.op.delete(key).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(classify(&self.cfg, "delete", key, e, true)),
            }
        }
        swept.removed = doomed.len();
        Ok(swept)
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        let key = self.aux_key(name)?;
        self.op
            .delete(&key)
            .await
            .map_err(|e| self.fail("delete", &key, e))
    }

    async fn read_aux_versioned(&self, name: &str) -> Result<Option<Versioned>, StorageError> {
        if self.cfg.service == Service::Webdav {
            // No conditional writes: the lease finds that out with its probe.
            return Ok(self.read_aux(name).await?.map(|d| (d, None)));
        }
        let key = self.aux_key(name)?;
        // Two requests: OpenDAL's read returns no metadata.
        let meta = match self.op.stat(&key).await {
            Ok(m) => m,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.fail("get", &key, e)),
        };
        let version = version_of(self.cfg.service, &meta);
        let mut read = self.op.read_with(&key);
        if let Some(v) = &version {
            read = if self.cfg.service == Service::Gcs {
                read.if_version_match(v)
            } else {
                read.if_match(v)
            };
        }
        match read.await {
            Ok(b) => Ok(Some((b.to_vec(), version))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            // Rewritten between the two requests: the caller reads again next round.
            Err(e) if e.kind() == ErrorKind::ConditionNotMatch => Err(StorageError::Transient {
                op: "get",
                key: errors::at(&self.cfg, &key),
                reason: "changed while being read".into(),
            }),
            Err(e) => Err(self.fail("get", &key, e)),
        }
    }

    async fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> Result<Option<String>, StorageError> {
        if self.cfg.service == Service::Webdav {
            return self.write_aux(name, data).await.map(|()| None);
        }
        let key = self.aux_key(name)?;
        let mut w = self.op.write_with(&key, data);
        w = match &cond {
            WriteIf::Absent => w.if_not_exists(true),
            WriteIf::Version(v) if self.cfg.service == Service::Gcs => {
                // A GCS generation is a number; anything else (the lease's probe) never matches.
                let generation = if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() {
                    v.as_str()
                } else {
                    "1"
                };
                w.if_version_match(generation)
            }
            WriteIf::Version(v) => w.if_match(v),
        };
        let meta = w.await.map_err(|e| self.fail("put", &key, e))?;
        match version_of(self.cfg.service, &meta) {
            Some(v) => Ok(Some(v)),
            // Not every answer carries the new version: ask.
            None => Ok(self
                .op
                .stat(&key)
                .await
                .ok()
                .and_then(|m| version_of(self.cfg.service, &m))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_version_is_the_generation_on_gcs_and_the_etag_elsewhere() {
        let mut b = opendal::MetadataBuilder::file(10);
        b.etag("\"0x8DD\"").version("2026-11-29T07:00:00.0000000Z");
        let meta = b.build();
        assert_eq!(
            version_of(Service::Azure, &meta).as_deref(),
            Some("\"0x8DD\""),
            "a blob version id never matches If-Match"
        );
        assert_eq!(
            version_of(Service::Gcs, &meta).as_deref(),
            Some("2026-11-29T07:00:00.0000000Z")
        );
    }

    #[test]
    fn a_server_without_webdav_is_a_setup_error_and_a_timeout_passes() {
        let cfg = ObjectConfig::from_url("webdav://127.0.0.1:1/replica").unwrap();
        let e = errors::from_status(&cfg, "list", "ltx/0", 501, "");
        assert!(
            matches!(&e, StorageError::Permanent { reason, .. } if reason.contains("WebDAV")),
            "{e:?}"
        );
        let e = errors::from_status(&cfg, "put", "ltx/0/x", 408, "");
        assert!(matches!(e, StorageError::Transient { .. }), "{e:?}");
    }

    #[test]
    fn a_sas_signature_in_an_error_is_hidden() {
        let e = "send http request, context: { url: https://acct.blob.core.windows.net/c/k?sv=2022-11-02&sig=abc%2Bdef%3D&se=2027 } => error sending request";
        let s = errors::scrub(e);
        assert!(!s.contains("abc%2Bdef"), "{s}");
        assert!(s.contains("sig=REDACTED&se=2027"), "{s}");
        assert_eq!(
            errors::scrub("url=http://h/k?sig=xyz"),
            "url=http://h/k?sig=REDACTED"
        );
        assert_eq!(errors::scrub("no secret here"), "no secret here");
    }
}
