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

/// Default multipart part size: S3's minimum, 5 MiB.
pub const DEFAULT_PART_SIZE: u64 = 5 * 1024 * 1024;
/// Default number of parts uploaded at once.
pub const DEFAULT_CONCURRENCY: usize = 5;
/// Most keys one DeleteObjects call may name (an S3 limit).
const DELETE_BATCH: usize = 1000;
/// Times a dropped GET body is resumed before the error is returned.
const GET_RESUMES: u32 = 3;

/// A string that never prints.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Settings of one S3 replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix (no leading or trailing slash).
    pub path: String,
    /// Region; `us-east-1` when a custom endpoint is set and none is given.
    pub region: Option<String>,
    /// Custom endpoint URL (MinIO, R2, B2, a loopback test server).
    pub endpoint: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`); the default with a custom endpoint.
    pub force_path_style: bool,
    /// Access key; when unset the standard AWS credential chain is used.
    pub access_key_id: Option<String>,
    /// Secret key.
    pub secret_access_key: Option<Secret>,
    /// Objects above this size are uploaded in parts of this size (at least 5 MiB).
    pub part_size: u64,
    /// Parts uploaded at once.
    pub concurrency: usize,
    /// Storage class of new objects.
    pub storage_class: Option<String>,
    /// SSE-KMS key id.
    pub sse_kms_key_id: Option<String>,
    /// SSE-C key: 32 bytes, base64.
    pub sse_customer_key: Option<Secret>,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            bucket: String::new(),
            path: String::new(),
            region: None,
            endpoint: None,
            force_path_style: false,
            access_key_id: None,
            secret_access_key: None,
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            storage_class: None,
            sse_kms_key_id: None,
            sse_customer_key: None,
        }
    }
}

/// S3's bucket naming rules, widened to its legacy names (upper case, `_`, up to 255 bytes).
/// Anything else (`@`, `:`, `%`, a space) is a typo or a URL fragment, and an `@` would read
/// as credentials wherever the replica URL (`s3://BUCKET/PATH`) is shown.
pub fn check_bucket_name(bucket: &str) -> Result<(), String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if bucket.len() > 255 || !bucket.chars().all(legal) {
        return Err(format!(
            "bucket {bucket:?} is not a valid bucket name: use letters, digits, `.`, `-` and `_`"
        ));
    }
    Ok(())
}

impl S3Config {
    /// Parses `s3://BUCKET/PATH?endpoint=...&region=...&force-path-style=true&part-size=...
    /// &concurrency=...&storage-class=...&sse-kms-key-id=...` (Litestream's URL form; camelCase
    /// keys accepted). Credentials never go in a URL: they come from the config file or the
    /// standard AWS chain (`AWS_ACCESS_KEY_ID`, ..., or `LITESTREAM_ACCESS_KEY_ID`, ...).
    pub fn from_url(s: &str) -> Result<S3Config, String> {
        let shown = redact_url(s);
        let url = url::Url::parse(s).map_err(|e| format!("invalid replica URL {shown:?}: {e}"))?;
        if url.scheme() != "s3" {
            return Err(format!("not an s3:// URL: {shown:?}"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "credentials do not belong in a replica URL ({shown:?}): use access-key-id and \
                 secret-access-key, or the AWS credential chain"
            ));
        }
        let bucket = url
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| format!("no bucket in {shown:?}"))?;
        let mut cfg = S3Config {
            bucket: bucket.to_string(),
            // Go's url.Parse decodes the path; so must we, or keys differ from Litestream's.
            path: clean_path(
                &percent_encoding::percent_decode_str(url.path())
                    .decode_utf8()
                    .map_err(|_| format!("path of {shown:?} is not UTF-8"))?,
            ),
            ..S3Config::default()
        };
        let mut path_style = None;
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "endpoint" => cfg.endpoint = Some(v.into_owned()),
                "region" => cfg.region = Some(v.into_owned()),
                "force-path-style" | "forcePathStyle" => path_style = Some(parse_bool(&k, &v)?),
                "part-size" | "partSize" => cfg.part_size = parse_size(&v)?,
                "concurrency" => {
                    cfg.concurrency = v
                        .parse()
                        .map_err(|_| format!("concurrency {v:?} is not a number"))?
                }
                "storage-class" | "storageClass" => cfg.storage_class = Some(v.into_owned()),
                "sse-kms-key-id" | "sseKmsKeyId" => cfg.sse_kms_key_id = Some(v.into_owned()),
                "skip-verify" | "skipVerify" => reject_skip_verify(parse_bool(&k, &v)?)?,
                other => return Err(format!("unknown s3 URL parameter {other:?}")),
            }
        }
        cfg.force_path_style = path_style.unwrap_or(cfg.endpoint.is_some());
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the settings for mistakes that would only show at the first upload.
    pub fn validate(&self) -> Result<(), String> {
        if self.bucket.is_empty() {
            return Err("s3 replica needs a bucket".into());
        }
        check_bucket_name(&self.bucket)?;
        if self.part_size < DEFAULT_PART_SIZE {
            return Err(format!(
                "part-size {} is below S3's minimum of 5 MiB",
                self.part_size
            ));
        }
        if self.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if self.access_key_id.is_some() != self.secret_access_key.is_some() {
            return Err("access-key-id and secret-access-key go together".into());
        }
        if let Some(key) = &self.sse_customer_key {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(&key.0)
                .map_err(|_| "sse-customer-key must be base64".to_string())?;
            if raw.len() != 32 {
                return Err("sse-customer-key must be 32 bytes (base64)".into());
            }
        }
        Ok(())
    }
}

/// TLS verification cannot be turned off: a replica is where a disaster recovery reads from,
/// and a silently unauthenticated endpoint is not a trade replicad offers.
pub fn reject_skip_verify(on: bool) -> Result<(), String> {
    if on {
        return Err("skip-verify is not supported: use http:// for a trusted local endpoint, or add its CA to the system store".into());
    }
    Ok(())
}

/// A URL as it may be shown: any `user:password@` part is replaced.
pub fn redact_url(s: &str) -> String {
    match (s.find("://"), s.find('@')) {
        (Some(end), Some(at)) if at > end && !s[end + 3..at].contains('/') => {
            format!("{}<redacted>{}", &s[..end + 3], &s[at..])
        }
        _ => s.to_string(),
    }
}

fn parse_bool(k: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{k}={v:?} must be true or false")),
    }
}

/// Parses a byte size: `5242880`, `5MiB`, `10MB`, `1GiB`.
pub fn parse_size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("size {v:?} is not a number"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" | "k" => 1024,
        "mb" => 1000 * 1000,
        "mib" | "m" => 1024 * 1024,
        "gb" => 1000 * 1000 * 1000,
        "gib" | "g" => 1024 * 1024 * 1024,
        other => return Err(format!("unknown size unit {other:?} in {v:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {v:?} is too large"))
}

fn clean_path(p: &str) -> String {
    p.trim_matches('/').to_string()
}

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

/// What makes two replicas' SDK clients interchangeable: everything `build_client` reads.
/// Bucket and path are per request, so every database of a bucket shares one client and its
/// connection pool (400 databases: one pool, not 400).
#[derive(PartialEq, Eq, Hash)]
struct ClientKey {
    region: Option<String>,
    endpoint: Option<String>,
    force_path_style: bool,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
}

/// SDK clients shared across replicas; held only while looking up, never across `.await`.
static SHARED_CLIENTS: std::sync::LazyLock<
    std::sync::Mutex<HashMap<ClientKey, Arc<OnceCell<Client>>>>,
> = std::sync::LazyLock::new(Default::default);

impl S3Client {
    /// A client for `cfg`; nothing is contacted until the first call. Replicas with the same
    /// endpoint, region and credentials share one SDK client.
    pub fn new(cfg: S3Config) -> S3Client {
        let key = ClientKey {
            region: cfg.region.clone(),
            endpoint: cfg.endpoint.clone(),
            force_path_style: cfg.force_path_style,
            access_key_id: cfg.access_key_id.clone(),
            secret_access_key: cfg.secret_access_key.as_ref().map(|s| s.0.clone()),
        };
        let client = match SHARED_CLIENTS.lock() {
            Ok(mut shared) => shared.entry(key).or_default().clone(),
            // A panic elsewhere while looking up: an unshared client still works.
            Err(_) => Arc::new(OnceCell::new()),
        };
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
            let page = page.map_err(|e| classify("list", prefix, e))?;
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
        req.send().await.map_err(|e| classify("put", &key, e))?;
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
            .map_err(|e| transient("get", &key, e))?;
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
            .map_err(|e| transient("put", key, e))?;
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
        req.send().await.map_err(|e| classify("put", key, e))?;
        Ok(())
    }

    async fn put_multipart(
        &self,
        key: &str,
        src: &Path,
        len: u64,
        timestamp: &str,
    ) -> Result<(), StorageError> {
        let c = self.client().await?;
        let upload_id = self.create_upload(c, key, timestamp).await?;
        let part_size = self.cfg.part_size;
        let parts = len.div_ceil(part_size);
        let result = futures_util::stream::iter(0..parts)
            .map(|i| {
                let upload_id = &upload_id;
                async move {
                    let offset = i * part_size;
                    let n = part_size.min(len - offset);
                    let body = file_part(src, offset, n, key).await?;
                    self.upload_part(c, key, upload_id, i, body, n).await
                }
            })
            .buffer_unordered(self.cfg.concurrency)
            .try_collect::<Vec<_>>()
            .await;
        match result {
            Ok(parts) => self.complete(c, key, &upload_id, parts).await,
            Err(e) => {
                self.abort(c, key, &upload_id).await;
                Err(e)
            }
        }
    }

    /// Uploads `seg` while it is being staged (see [`crate::storage::feed`]) as the object
    /// `level/<txid>-<txid>`: each part as soon as it is in the file, completed only once the
    /// segment is published, aborted if it fails. `Ok(None)`: nothing was stored, because the
    /// segment failed or ended within one part (a plain put of the staged file serves better).
    pub async fn put_streamed(
        &self,
        level: u8,
        seg: &Arc<GrowingSegment>,
    ) -> Result<Option<LtxFileInfo>, StorageError> {
        let part_size = self.cfg.part_size;
        let mut progress = seg.progress();
        // The sender lives in `seg`, which this function holds: the wait cannot fail.
        let first = match progress
            .wait_for(|p| !matches!(p, Progress::Writing(n) if *n <= part_size))
            .await
        {
            Ok(p) => *p,
            Err(_) => Progress::Failed,
        };
        if !matches!(first, Progress::Writing(_)) {
            return Ok(None);
        }
        let key = self.key(level, seg.txid, seg.txid);
        let created = DateTime::<Utc>::from_timestamp_millis(seg.timestamp_ms).unwrap_or_default();
        let timestamp = created.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let c = self.client().await?;
        let upload_id = self.create_upload(c, &key, &timestamp).await?;
        match self
            .stream_parts(c, &key, &upload_id, seg, &mut progress)
            .await
        {
            Ok(Some((parts, len))) => {
                self.complete(c, &key, &upload_id, parts).await?;
                Ok(Some(LtxFileInfo {
                    level,
                    min_txid: seg.txid,
                    max_txid: seg.txid,
                    size: len,
                    created_at: Utc::now(),
                    encrypted: !self.suffix.is_empty(),
                }))
            }
            Ok(None) => {
                self.abort(c, &key, &upload_id).await;
                Ok(None)
            }
            Err(e) => {
                self.abort(c, &key, &upload_id).await;
                Err(e)
            }
        }
    }

    /// Uploads the parts of `seg` as they are written, at most `concurrency` at once, until
    /// it is published (its parts and length) or fails (`None`).
    async fn stream_parts(
        &self,
        c: &Client,
        key: &str,
        upload_id: &str,
        seg: &Arc<GrowingSegment>,
        progress: &mut tokio::sync::watch::Receiver<Progress>,
    ) -> Result<Option<(Vec<CompletedPart>, u64)>, StorageError> {
        let part_size = self.cfg.part_size;
        let mut inflight = futures_util::stream::FuturesUnordered::new();
        let mut done = Vec::new();
        let mut next = 0u64;
        loop {
            let (written, end) = match *progress.borrow_and_update() {
                Progress::Writing(n) => (n, None),
                Progress::Published(len) => (len, Some(len)),
                Progress::Failed => return Ok(None),
            };
            while inflight.len() < self.cfg.concurrency {
                let offset = next * part_size;
                let ready = match end {
                    None => offset + part_size <= written,
                    Some(len) => offset < len,
                };
                if !ready {
                    break;
                }
                let n = part_size.min(written - offset);
                let index = next;
                let seg = seg.clone();
                inflight.push(async move {
                    let body = file_part(&seg.reopen_path(), offset, n, key).await?;
                    let part = self.upload_part(c, key, upload_id, index, body, n).await?;
                    // Uploaded: its pages are dead weight in the page cache (see segment_feed).
                    let _ = tokio::task::spawn_blocking(move || seg.release(offset, n)).await;
                    Ok::<_, StorageError>(part)
                });
                next += 1;
            }
            if let Some(len) = end
                && inflight.is_empty()
            {
                return Ok(Some((done, len)));
            }
            tokio::select! {
                Some(part) = inflight.next() => done.push(part?),
                changed = progress.changed(), if end.is_none() => {
                    if changed.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    async fn create_upload(
        &self,
        c: &Client,
        key: &str,
        timestamp: &str,
    ) -> Result<String, StorageError> {
        let mut create = c
            .create_multipart_upload()
            .bucket(&self.cfg.bucket)
            .key(key)
            .metadata("litestream-timestamp", timestamp);
        create = with_write_options!(self, create);
        let upload = create.send().await.map_err(|e| classify("put", key, e))?;
        Ok(upload
            .upload_id()
            .ok_or_else(|| permanent("put", key, "CreateMultipartUpload returned no upload id"))?
            .to_string())
    }

    /// Uploads part `index` (0-based) of `n` bytes.
    async fn upload_part(
        &self,
        c: &Client,
        key: &str,
        upload_id: &str,
        index: u64,
        body: ByteStream,
        n: u64,
    ) -> Result<CompletedPart, StorageError> {
        let number = index as i32 + 1;
        let mut req = c
            .upload_part()
            .bucket(&self.cfg.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .content_length(n as i64)
            .body(body);
        req = with_sse_c!(self, req);
        let out = req.send().await.map_err(|e| classify("put", key, e))?;
        let etag = out
            .e_tag()
            .ok_or_else(|| permanent("put", key, "UploadPart returned no ETag"))?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .e_tag(etag)
            .build())
    }

    /// Completes an upload from its parts (any order), aborting it if that fails.
    async fn complete(
        &self,
        c: &Client,
        key: &str,
        upload_id: &str,
        mut parts: Vec<CompletedPart>,
    ) -> Result<(), StorageError> {
        parts.sort_by_key(|p| p.part_number());
        let mut req = c
            .complete_multipart_upload()
            .bucket(&self.cfg.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            );
        if self.conditional() {
            req = req.if_none_match("*");
        }
        let done = req.send().await;
        if let Err(e) = done {
            self.abort(c, key, upload_id).await;
            return Err(classify("put", key, e));
        }
        Ok(())
    }

    async fn abort(&self, c: &Client, key: &str, upload_id: &str) {
        let r = c
            .abort_multipart_upload()
            .bucket(&self.cfg.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        if let Err(e) = r {
            tracing::warn!(key, error = %classify("abort multipart", key, e), "could not abort a failed multipart upload; a bucket lifecycle rule cleans it up");
        }
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
        match end {
            Some(end) if end > offset => req = req.range(format!("bytes={offset}-{}", end - 1)),
            Some(_) => return Ok(ByteStream::from_static(b"")),
            None if offset > 0 => req = req.range(format!("bytes={offset}-")),
            None => {}
        }
        req = with_sse_c!(self, req);
        match req.send().await {
            Ok(out) => Ok(out.body),
            // A range starting at the object's end: the object exists, its tail is empty.
            Err(e)
                if offset > 0
                    && e.as_service_error().and_then(|s| s.code()) == Some("InvalidRange") =>
            {
                Ok(ByteStream::from_static(b""))
            }
            Err(e) => Err(classify("get", key, e)),
        }
    }
}

async fn build_client(cfg: &S3Config) -> Result<Client, StorageError> {
    let region = cfg
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok().filter(|r| !r.is_empty()))
        .or_else(|| {
            std::env::var("AWS_DEFAULT_REGION")
                .ok()
                .filter(|r| !r.is_empty())
        })
        .or_else(|| cfg.endpoint.as_ref().map(|_| "us-east-1".to_string()));
    let mut b = match (&cfg.access_key_id, &cfg.secret_access_key) {
        (Some(id), Some(secret)) => aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .credentials_provider(Credentials::new(
                id,
                &secret.0,
                None,
                None,
                "replicad-config",
            )),
        _ => {
            let mut loader = aws_config::defaults(BehaviorVersion::latest());
            // A known region must not be looked up (IMDS would add its timeout off EC2).
            if let Some(r) = &region {
                loader = loader.region(Region::new(r.clone()));
            }
            if let (Ok(id), Ok(secret), Err(_)) = (
                std::env::var("LITESTREAM_ACCESS_KEY_ID"),
                std::env::var("LITESTREAM_SECRET_ACCESS_KEY"),
                std::env::var("AWS_ACCESS_KEY_ID"),
            ) {
                loader = loader.credentials_provider(Credentials::new(
                    id,
                    secret,
                    None,
                    None,
                    "litestream-env",
                ));
            }
            aws_sdk_s3::config::Builder::from(&loader.load().await)
        }
    };
    // Explicit keys skip the environment loader, so read the region variables here too.
    if let Some(r) = region {
        b = b.region(Region::new(r));
    }
    if let Some(ep) = &cfg.endpoint {
        let ep = if ep.contains("://") {
            ep.clone()
        } else {
            format!("https://{ep}")
        };
        b = b
            .endpoint_url(ep)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
    }
    let conf = b
        .force_path_style(cfg.force_path_style)
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(10))
                .read_timeout(Duration::from_secs(60))
                .build(),
        )
        .build();
    if conf.region().is_none() {
        return Err(StorageError::Permanent {
            op: "configure",
            key: format!("s3://{}", cfg.bucket),
            reason: "no region: set `region` (or AWS_REGION)".into(),
        });
    }
    Ok(Client::from_conf(conf))
}

/// `n` bytes of the file at `path` from `offset`, as a streamed body: nothing held in memory,
/// and the payload is not hashed for the signature (the LTX file checksum covers it). The SDK
/// reopens the path on a retry.
async fn file_part(
    path: &Path,
    offset: u64,
    n: u64,
    key: &str,
) -> Result<ByteStream, StorageError> {
    ByteStream::read_from()
        .path(path)
        .offset(offset)
        .length(Length::Exact(n))
        .build()
        .await
        .map_err(|e| transient("put", key, e))
}

fn transient(op: &'static str, key: &str, e: impl fmt::Display) -> StorageError {
    StorageError::Transient {
        op,
        key: key.to_string(),
        reason: e.to_string(),
    }
}

fn permanent(op: &'static str, key: &str, reason: &str) -> StorageError {
    StorageError::Permanent {
        op,
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// Maps an SDK error: missing objects are NotFound; 4xx other than throttling and timeouts
/// are permanent; the rest (5xx, network, timeouts) may pass.
fn classify<E, R>(op: &'static str, key: &str, e: SdkError<E, R>) -> StorageError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    let status = match &e {
        SdkError::ServiceError(s) => Some(raw_status(s.raw())),
        _ => None,
    };
    let code = e
        .as_service_error()
        .and_then(|s| s.code())
        .map(str::to_string);
    let message = e
        .as_service_error()
        .and_then(|s| s.message())
        .map(str::to_string);
    // A missing bucket is a configuration error, not a missing object.
    if code.as_deref() != Some("NoSuchBucket")
        && (matches!(code.as_deref(), Some("NoSuchKey" | "NotFound")) || status == Some(Some(404)))
    {
        return StorageError::NotFound(key.to_string());
    }
    if code.as_deref() == Some("PreconditionFailed") || status == Some(Some(412)) {
        return StorageError::Conflict {
            op,
            key: key.to_string(),
        };
    }
    let reason = match (&code, &message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.clone(),
        _ => aws_sdk_s3::error::DisplayErrorContext(&e).to_string(),
    };
    // 409 ConditionalRequestConflict: two conditional writes raced; the retry decides.
    let permanent_status =
        matches!(status, Some(Some(s)) if (400..500).contains(&s) && !matches!(s, 408 | 409 | 429));
    if permanent_status
        || matches!(
            code.as_deref(),
            Some("NoSuchBucket" | "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch")
        )
    {
        StorageError::Permanent {
            op,
            key: key.to_string(),
            reason,
        }
    } else {
        StorageError::Transient {
            op,
            key: key.to_string(),
            reason,
        }
    }
}

fn raw_status<R: fmt::Debug>(raw: &R) -> Option<u16> {
    // The raw response type is generic here; its Debug carries `status: StatusCode(N)`.
    let dbg = format!("{raw:?}");
    let at = dbg.find("StatusCode(")? + "StatusCode(".len();
    dbg[at..].split(')').next()?.parse().ok()
}

fn from_smithy_time(t: Option<&aws_sdk_s3::primitives::DateTime>) -> DateTime<Utc> {
    t.and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos()))
        .unwrap_or_default()
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
                .map_err(|e| permanent("delete", &batch[0], &e.to_string()))?;
            let delete = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| permanent("delete", &batch[0], &e.to_string()))?;
            let out = c
                .delete_objects()
                .bucket(&self.cfg.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| classify("delete", &batch[0], e))?;
            let failed: HashMap<&str, &str> = out
                .errors()
                .iter()
                .filter(|e| e.code() != Some("NoSuchKey"))
                .map(|e| (e.key().unwrap_or("?"), e.code().unwrap_or("?")))
                .collect();
            if let Some((k, code)) = failed.iter().next() {
                return Err(transient(
                    "delete",
                    k,
                    format!("{code} ({} keys failed)", failed.len()),
                ));
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
            .map_err(|e| transient("get", &key, e))?;
        Ok(Some(data.into_bytes().to_vec()))
    }

    async fn write_aux(&self, name: &str, data: Vec<u8>) -> Result<(), StorageError> {
        let key = format!("{}{name}", self.prefix());
        let req = self.aux_put(&key, data).await?;
        req.send().await.map_err(|e| classify("put", &key, e))?;
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
                return match classify("get", &key, e) {
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
            .map_err(|e| transient("get", &key, e))?;
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
        let r = req.send().await.map_err(|e| classify("put", &key, e));
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
            Err(e) => match classify("delete", &key, e) {
                StorageError::NotFound(_) => Ok(()),
                e => Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests;
