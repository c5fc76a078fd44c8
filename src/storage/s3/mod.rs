//! A replica in an S3-compatible bucket (aws-sdk-s3), laid out as Litestream v0.5 does:
//! `<path>/<level as %04x>/<min>-<max>.ltx`, with metadata `litestream-timestamp` (RFC 3339,
//! nanoseconds) = the LTX header timestamp. Either tool restores the other's bucket when the
//! codec is `lz4`.
//!
//! Invariants:
//! - Objects are written whole: one PutObject below the part size, otherwise a multipart upload
//!   that is completed only after every part succeeded and aborted on any failure, so a
//!   reader never sees a partial object.
//! - Secrets (secret key, SSE-C key) never appear in `Debug`, `location()`, logs or errors.
//! - For a custom endpoint the SDK's trailing aws-chunked checksums are off (R2, B2 and other
//!   providers reject them); checksums are sent only where an operation requires one.
//! - A GET whose body drops mid-stream is resumed with a ranged GET from the byte reached.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use crate::ltx::{self, TxId};
use crate::storage::feed::{GrowingSegment, Progress};
use crate::storage::{
    LtxFileInfo, ObjectReader, PROBE_VERSION, ReplicaClient, SNAPSHOT_LEVEL, StorageError,
    Versioned, WriteIf,
};

/// Adds the SSE-C headers, when a customer key is configured, to any request builder (each
/// S3 operation has its own builder type, with the same setters).
macro_rules! with_sse_c {
    ($client:expr, $req:expr) => {
        match $client.sse_c() {
            Some((key, md5)) => $req
                .sse_customer_algorithm("AES256")
                .sse_customer_key(key)
                .sse_customer_key_md5(md5),
            None => $req,
        }
    };
}

/// Adds what a new object is written with (storage class, SSE-KMS, SSE-C) to a PutObject or
/// CreateMultipartUpload builder.
macro_rules! with_write_options {
    ($client:expr, $req:expr) => {{
        let mut req = $req;
        if let Some(sc) = &$client.cfg.storage_class {
            req = req.storage_class(sc.as_str().into());
        }
        if let Some(kms) = &$client.cfg.sse_kms_key_id {
            req = req
                .server_side_encryption("aws:kms".into())
                .ssekms_key_id(kms);
        }
        with_sse_c!($client, req)
    }};
}

mod config;
mod multipart;
mod sdk;

pub use config::{
    DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, S3Config, Secret, check_bucket_name, parse_size,
    redact_url, reject_skip_verify,
};
pub use sdk::S3Clients;
use sdk::{build_client, classify, from_smithy_time, permanent, transient};

/// Most keys one DeleteObjects call may name (an S3 limit).
const DELETE_BATCH: usize = 1000;
/// Times a dropped GET body is resumed before the error is returned.
const GET_RESUMES: u32 = 3;

/// An S3 replica client. Cheap to clone; the SDK client is built on first use.
#[derive(Clone)]
pub struct S3Client {
    cfg: Arc<S3Config>,
    client: Arc<OnceCell<Client>>,
    /// Appended to every object name: `""`, or `".age"` for the encrypted view.
    suffix: &'static str,
    /// Whether the server honours conditional writes (`If-None-Match`, `If-Match`): learnt
    /// from the lease's probe ([`crate::replicate::lease`]); until then, and when it does not, puts are
    /// unconditional. Shared by the views of one replica.
    conditional: Arc<AtomicU8>,
}

const COND_UNKNOWN: u8 = 0;
const COND_ON: u8 = 1;
const COND_OFF: u8 = 2;

impl fmt::Debug for S3Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Client").field("cfg", &self.cfg).finish()
    }
}

impl S3Client {
    /// A client for `cfg`, with an SDK client of its own; nothing is contacted until the
    /// first call.
    pub fn new(cfg: S3Config) -> S3Client {
        S3Client::with_sdk(cfg, Arc::new(OnceCell::new()))
    }

    /// [`S3Client::new`], sharing the SDK client (and its connection pool) of `pool` with
    /// every other replica of the same endpoint, region and credentials: every database of a
    /// bucket then uses one pool. Bucket and path are per request.
    pub fn shared(cfg: S3Config, pool: &S3Clients) -> S3Client {
        let client = pool.get(&cfg);
        S3Client::with_sdk(cfg, client)
    }

    fn with_sdk(cfg: S3Config, client: Arc<OnceCell<Client>>) -> S3Client {
        S3Client {
            cfg: Arc::new(cfg),
            client,
            suffix: "",
            conditional: Arc::new(AtomicU8::new(COND_UNKNOWN)),
        }
    }

    /// The same bucket (and connection) seen through the names of age-encrypted objects
    /// (`<min>-<max>.ltx.age`): it lists, opens, writes and deletes only those.
    pub fn sealed_view(&self) -> S3Client {
        S3Client {
            cfg: self.cfg.clone(),
            client: self.client.clone(),
            suffix: crate::storage::SEALED_SUFFIX,
            conditional: self.conditional.clone(),
        }
    }

    /// True once the server was seen to honour conditional writes.
    pub fn conditional(&self) -> bool {
        self.conditional.load(Ordering::Relaxed) == COND_ON
    }

    /// The settings.
    pub fn config(&self) -> &S3Config {
        &self.cfg
    }

    async fn client(&self) -> Result<&Client, StorageError> {
        self.client
            .get_or_try_init(|| build_client(&self.cfg))
            .await
    }

    /// Every object under `prefix` that `level_of` places in a level (given the key after the
    /// prefix, it returns the level and the file name) and whose name is this view's LTX name.
    async fn list_under(
        &self,
        prefix: &str,
        level_of: impl Fn(&str) -> Option<(u8, &str)>,
    ) -> Result<Vec<LtxFileInfo>, StorageError> {
        let c = self.client().await?;
        let mut pages = c
            .list_objects_v2()
            .bucket(&self.cfg.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| classify(&self.cfg, "list", prefix, e))?;
            for obj in page.contents() {
                let Some((level, name)) = obj
                    .key()
                    .and_then(|k| k.strip_prefix(prefix))
                    .and_then(&level_of)
                else {
                    continue;
                };
                let Some((min, max)) = name.strip_suffix(self.suffix).and_then(ltx::parse_filename)
                else {
                    continue;
                };
                out.push(LtxFileInfo {
                    level,
                    min_txid: min,
                    max_txid: max,
                    size: obj.size().unwrap_or(0).max(0) as u64,
                    created_at: from_smithy_time(obj.last_modified()),
                    encrypted: !self.suffix.is_empty(),
                });
            }
        }
        Ok(out)
    }

    /// Object key of one file.
    pub fn key(&self, level: u8, min: TxId, max: TxId) -> String {
        format!(
            "{}{level:04x}/{}{}",
            self.prefix(),
            ltx::format_filename(min, max),
            self.suffix
        )
    }

    fn prefix(&self) -> String {
        if self.cfg.path.is_empty() {
            String::new()
        } else {
            format!("{}/", self.cfg.path)
        }
    }

    /// Writes a small object `name` at the replica's root (the age recipients note).
    pub async fn put_small(&self, name: &str, body: Vec<u8>) -> Result<(), StorageError> {
        let key = format!("{}{name}", self.prefix());
        let c = self.client().await?;
        let mut req = c
            .put_object()
            .bucket(&self.cfg.bucket)
            .key(&key)
            .body(ByteStream::from(body));
        req = with_sse_c!(self, req);
        req.send()
            .await
            .map_err(|e| classify(&self.cfg, "put", &key, e))?;
        Ok(())
    }

    /// The PUT of an auxiliary object `key` (the lease): whole, with the replica's
    /// server-side encryption.
    async fn aux_put(
        &self,
        key: &str,
        data: Vec<u8>,
    ) -> Result<aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder, StorageError>
    {
        let c = self.client().await?;
        let mut req = c
            .put_object()
            .bucket(&self.cfg.bucket)
            .key(key)
            .content_length(data.len() as i64)
            .body(ByteStream::from(data));
        if let Some(kms) = &self.cfg.sse_kms_key_id {
            req = req
                .server_side_encryption("aws:kms".into())
                .ssekms_key_id(kms);
        }
        Ok(with_sse_c!(self, req))
    }

    /// Reads a small object `name` at the replica's root.
    pub async fn get_small(&self, name: &str) -> Result<Vec<u8>, StorageError> {
        let key = format!("{}{name}", self.prefix());
        let body = self.get_from(&key, 0, None).await?;
        let data = body
            .collect()
            .await
            .map_err(|e| transient(&self.cfg, "get", &key, e))?;
        Ok(data.into_bytes().to_vec())
    }

    async fn put_single(
        &self,
        key: &str,
        src: &Path,
        len: u64,
        timestamp: &str,
    ) -> Result<(), StorageError> {
        let c = self.client().await?;
        let body = ByteStream::from_path(src)
            .await
            .map_err(|e| transient(&self.cfg, "put", key, e))?;
        let mut req = c
            .put_object()
            .bucket(&self.cfg.bucket)
            .key(key)
            .body(body)
            .content_length(len as i64)
            .metadata("litestream-timestamp", timestamp);
        if self.conditional() {
            req = req.if_none_match("*");
        }
        req = with_write_options!(self, req);
        req.send()
            .await
            .map_err(|e| classify(&self.cfg, "put", key, e))?;
        Ok(())
    }

    fn sse_c(&self) -> Option<(String, String)> {
        let key = self.cfg.sse_customer_key.as_ref()?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&key.0)
            .ok()?;
        use md5::Digest;
        let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&raw));
        Some((key.0.clone(), md5))
    }

    /// A GET of `[offset, end)` whose body resumes with a ranged GET when it drops.
    async fn open_bounded(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        end: Option<u64>,
    ) -> Result<ObjectReader, StorageError> {
        let key = self.key(level, min, max);
        let first = self.get_from(&key, offset, end).await?;
        // State: the open body, the next offset, resumes left.
        let me = self.clone();
        let stream = futures_util::stream::try_unfold(
            (Some(first), offset, GET_RESUMES, key),
            move |(body, at, resumes, key)| {
                let me = me.clone();
                async move {
                    let mut body = match body {
                        Some(b) => b,
                        None => return Ok(None),
                    };
                    let mut resumes = resumes;
                    loop {
                        match body.try_next().await {
                            Ok(Some(chunk)) => {
                                let next = at + chunk.len() as u64;
                                return Ok(Some((chunk, (Some(body), next, resumes, key))));
                            }
                            Ok(None) => return Ok::<_, std::io::Error>(None),
                            Err(e) if resumes > 0 => {
                                resumes -= 1;
                                tracing::debug!(key, at, error = %e, "GET body dropped; resuming with a ranged GET");
                                tokio::time::sleep(Duration::from_millis(250)).await;
                                body = me
                                    .get_from(&key, at, end)
                                    .await
                                    .map_err(std::io::Error::other)?;
                            }
                            Err(e) => return Err(std::io::Error::other(e)),
                        }
                    }
                }
            },
        );
        let stream = stream.map_ok(|b: Bytes| b);
        Ok(Box::pin(tokio_util::io::StreamReader::new(stream)))
    }

    /// GETs `key` from `offset` to `end` (exclusive; `None`: to the object's end).
    async fn get_from(
        &self,
        key: &str,
        offset: u64,
        end: Option<u64>,
    ) -> Result<ByteStream, StorageError> {
        let c = self.client().await?;
        let mut req = c.get_object().bucket(&self.cfg.bucket).key(key);
        let ranged = match end {
            Some(end) if end > offset => {
                req = req.range(format!("bytes={offset}-{}", end - 1));
                true
            }
            Some(_) => return Ok(ByteStream::from_static(b"")),
            None if offset > 0 => {
                req = req.range(format!("bytes={offset}-"));
                true
            }
            None => false,
        };
        req = with_sse_c!(self, req);
        match req.send().await {
            Ok(out) => {
                if ranged && !range_honoured(out.content_range(), out.content_length(), offset, end)
                {
                    return Err(permanent(
                        &self.cfg,
                        "get",
                        key,
                        &format!(
                            "the server ignored the Range of a ranged GET (bytes from {offset}; \
                             it answered Content-Range {:?}); hint: the endpoint (or a proxy in \
                             front of it) must support ranged reads",
                            out.content_range()
                        ),
                    ));
                }
                Ok(out.body)
            }
            // A range starting at the object's end: the object exists, its tail is empty.
            Err(e)
                if offset > 0
                    && e.as_service_error().and_then(|s| s.code()) == Some("InvalidRange") =>
            {
                Ok(ByteStream::from_static(b""))
            }
            Err(e) => Err(classify(&self.cfg, "get", key, e)),
        }
    }
}

/// Whether a ranged GET's answer holds the range asked for: a `Content-Range` that starts at
/// `offset`, or, for a range from 0, the whole object within it (a 200 of a small object).
/// A server (or proxy) that ignores `Range` answers the whole object, and its first bytes
/// would be read as those at `offset`.
fn range_honoured(
    content_range: Option<&str>,
    content_length: Option<i64>,
    offset: u64,
    end: Option<u64>,
) -> bool {
    match content_range {
        Some(r) => {
            r.strip_prefix("bytes ")
                .and_then(|r| r.split_once('-'))
                .and_then(|(start, _)| start.parse::<u64>().ok())
                == Some(offset)
        }
        None => {
            offset == 0
                && content_length
                    .and_then(|n| u64::try_from(n).ok())
                    .zip(end)
                    .is_some_and(|(n, end)| n <= end)
        }
    }
}

impl ReplicaClient for S3Client {
    fn kind(&self) -> &'static str {
        "s3"
    }

    fn location(&self) -> String {
        format!("s3://{}/{}", self.cfg.bucket, self.cfg.path)
    }

    async fn list(&self, level: u8) -> Result<Vec<LtxFileInfo>, StorageError> {
        let mut out = self
            .list_under(&format!("{}{level:04x}/", self.prefix()), |rest| {
                Some((level, rest))
            })
            .await?;
        out.sort_by_key(|f| (f.min_txid, f.max_txid));
        Ok(out)
    }

    async fn list_all(&self) -> Result<Vec<LtxFileInfo>, StorageError> {
        let mut out = self
            .list_under(&self.prefix(), |rest| {
                // `<level %04x>/<min>-<max>.ltx`; anything else (deeper keys, foreign files,
                // other levels' spellings) is not ours.
                let (dir, name) = rest.split_once('/')?;
                match u8::from_str_radix(dir, 16) {
                    Ok(l) if dir.len() == 4 && l <= SNAPSHOT_LEVEL => Some((l, name)),
                    _ => None,
                }
            })
            .await?;
        out.sort_by_key(|f| (f.level, f.min_txid, f.max_txid));
        Ok(out)
    }

    async fn open(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
    ) -> Result<ObjectReader, StorageError> {
        self.open_bounded(level, min, max, offset, None).await
    }

    async fn open_range(
        &self,
        level: u8,
        min: TxId,
        max: TxId,
        offset: u64,
        len: u64,
    ) -> Result<ObjectReader, StorageError> {
        self.open_bounded(level, min, max, offset, Some(offset + len))
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
        let len = tokio::fs::metadata(src)
            .await
            .map_err(|e| StorageError::from_io("put", src, e))?
            .len();
        let created = DateTime::<Utc>::from_timestamp_millis(timestamp_ms).unwrap_or_default();
        let timestamp = created.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        if len > self.cfg.part_size {
            self.put_multipart(&key, src, len, &timestamp).await?;
        } else {
            self.put_single(&key, src, len, &timestamp).await?;
        }
        Ok(LtxFileInfo {
            level,
            min_txid: min,
            max_txid: max,
            size: len,
            created_at: Utc::now(),
            encrypted: !self.suffix.is_empty(),
        })
    }

    async fn delete(&self, files: &[LtxFileInfo]) -> Result<(), StorageError> {
        let c = self.client().await?;
        let keys: Vec<String> = files
            .iter()
            .map(|f| {
                // Each file is deleted under its own name, whichever view lists it.
                let view = if f.encrypted {
                    self.sealed_view()
                } else {
                    self.clone()
                };
                view.key(f.level, f.min_txid, f.max_txid)
            })
            .collect();
        for batch in keys.chunks(DELETE_BATCH) {
            let ids = batch
                .iter()
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| permanent(&self.cfg, "delete", &batch[0], &e.to_string()))?;
            let delete = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| permanent(&self.cfg, "delete", &batch[0], &e.to_string()))?;
            let out = c
                .delete_objects()
                .bucket(&self.cfg.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| classify(&self.cfg, "delete", &batch[0], e))?;
            let failed: HashMap<&str, &str> = out
                .errors()
                .iter()
                .filter(|e| e.code() != Some("NoSuchKey"))
                .map(|e| (e.key().unwrap_or("?"), e.code().unwrap_or("?")))
                .collect();
            if let Some((k, code)) = failed.iter().next() {
                let reason = format!("{code} ({} keys failed)", failed.len());
                // A missing permission does not pass by itself: said as the setup error it is.
                if *code == "AccessDenied" {
                    return Err(permanent(
                        &self.cfg,
                        "delete",
                        k,
                        &format!("{reason}; hint: the credentials need s3:DeleteObject"),
                    ));
                }
                return Err(transient(&self.cfg, "delete", k, reason));
            }
        }
        Ok(())
    }

    async fn read_aux(&self, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let key = format!("{}{name}", self.prefix());
        let body = match self.get_from(&key, 0, None).await {
            Ok(b) => b,
            Err(StorageError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let data = body
            .collect()
            .await
            .map_err(|e| transient(&self.cfg, "get", &key, e))?;
        Ok(Some(data.into_bytes().to_vec()))
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        let key = format!("{}{name}", self.prefix());
        let req = self.aux_put(&key, data).await?;
        req.send()
            .await
            .map_err(|e| classify(&self.cfg, "put", &key, e))?;
        Ok(())
    }

    async fn read_aux_versioned(&self, name: &str) -> Result<Option<Versioned>, StorageError> {
        let key = format!("{}{name}", self.prefix());
        let c = self.client().await?;
        let mut req = c.get_object().bucket(&self.cfg.bucket).key(&key);
        req = with_sse_c!(self, req);
        let out = match req.send().await {
            Ok(out) => out,
            Err(e) => {
                return match classify(&self.cfg, "get", &key, e) {
                    StorageError::NotFound(_) => Ok(None),
                    e => Err(e),
                };
            }
        };
        let etag = out.e_tag().map(str::to_string);
        let data = out
            .body
            .collect()
            .await
            .map_err(|e| transient(&self.cfg, "get", &key, e))?;
        Ok(Some((data.into_bytes().to_vec(), etag)))
    }

    async fn write_aux_if(
        &self,
        name: &str,
        data: Vec<u8>,
        cond: WriteIf,
    ) -> Result<Option<String>, StorageError> {
        let key = format!("{}{name}", self.prefix());
        let mut req = self.aux_put(&key, data).await?;
        let probe = cond == WriteIf::Version(PROBE_VERSION.into());
        req = match &cond {
            WriteIf::Absent => req.if_none_match("*"),
            WriteIf::Version(v) => req.if_match(v),
        };
        let r = req
            .send()
            .await
            .map_err(|e| classify(&self.cfg, "put", &key, e));
        if probe {
            // A write that must fail when conditions are honoured (see `PROBE_VERSION`).
            let mode = match &r {
                Err(StorageError::Conflict { .. } | StorageError::NotFound(_)) => COND_ON,
                Ok(_) => COND_OFF,
                Err(_) => COND_UNKNOWN,
            };
            self.conditional.store(mode, Ordering::Relaxed);
        }
        Ok(r?.e_tag().map(str::to_string))
    }

    async fn delete_aux(&self, name: &str) -> Result<(), StorageError> {
        let key = format!("{}{name}", self.prefix());
        let c = self.client().await?;
        match c
            .delete_object()
            .bucket(&self.cfg.bucket)
            .key(&key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match classify(&self.cfg, "delete", &key, e) {
                StorageError::NotFound(_) => Ok(()),
                e => Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests;
