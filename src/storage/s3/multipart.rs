//! Large objects: multipart uploads of a staged file or of a segment still being written.

use super::sdk::{classify, permanent};
#[allow(unused_imports)]
use super::*;

/// `n` bytes of the file at `path` from `offset`, as a streamed body: nothing held in memory,
/// and the payload is not hashed for the signature (the LTX file checksum covers it). The SDK
/// reopens the path on a retry.
pub(super) async fn file_part(
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
        .map_err(|e| StorageError::Transient {
            op: "put",
            key: key.to_string(),
            reason: format!("reading {}: {e}", path.display()),
        })
}

/// S3's most parts in one upload.
const MAX_PARTS: u64 = 10_000;

/// The part size for an object of `len` bytes: the configured `base`, or, for an object that
/// would need more than 10,000 parts of it (48.8 GiB at 5 MiB), the smallest whole MiB that
/// fits 10,000. Every part but the last has the same size: Cloudflare R2 requires it.
fn part_size_for(base: u64, len: u64) -> u64 {
    const MIB: u64 = 1024 * 1024;
    base.max(len.div_ceil(MAX_PARTS).div_ceil(MIB) * MIB)
}

impl S3Client {
    pub(super) async fn put_multipart(
        &self,
        key: &str,
        src: &Path,
        len: u64,
        timestamp: &str,
    ) -> Result<(), StorageError> {
        let c = self.client().await?;
        let upload_id = self.create_upload(c, key, timestamp).await?;
        let part_size = part_size_for(self.cfg.part_size, len);
        let parts = len.div_ceil(part_size);
        let upload_id = &upload_id;
        let mut inflight = futures_util::stream::FuturesUnordered::new();
        let mut done = Vec::new();
        let mut next = 0u64;
        let result = loop {
            while next < parts && inflight.len() < self.cfg.concurrency {
                let offset = next * part_size;
                let index = next;
                inflight.push(async move {
                    let n = part_size.min(len - offset);
                    let body = file_part(src, offset, n, key).await?;
                    self.upload_part(c, key, upload_id, index, body, n).await
                });
                next += 1;
            }
            match inflight.next().await {
                None => break Ok(std::mem::take(&mut done)),
                Some(Ok(part)) => done.push(part),
                Some(Err(e)) => {
                    // No new part; the ones under way end before the abort.
                    settle(&mut inflight).await;
                    break Err(e);
                }
            }
        };
        match result {
            Ok(parts) => self.complete(c, key, upload_id, parts).await,
            Err(e) => {
                self.abort(c, key, upload_id).await;
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
    pub(super) async fn stream_parts(
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
            let now = *progress.borrow_and_update();
            let (written, end) = match now {
                Progress::Writing(n) => (n, None),
                Progress::Published(len) => (len, Some(len)),
                Progress::Failed => {
                    settle(&mut inflight).await;
                    return Ok(None);
                }
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
                if next >= MAX_PARTS {
                    // Past S3's limit at this part size: the staged file is put whole instead,
                    // in parts sized from its length.
                    settle(&mut inflight).await;
                    return Ok(None);
                }
                let n = part_size.min(written - offset);
                let index = next;
                let seg = seg.clone();
                inflight.push(async move {
                    let body = file_part(&seg.reopen_path(), offset, n, key).await?;
                    let part = self.upload_part(c, key, upload_id, index, body, n).await?;
                    // Uploaded: its pages are dead weight in the page cache (see `storage/feed.rs`).
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
                Some(part) = inflight.next() => match part {
                    Ok(part) => done.push(part),
                    Err(e) => {
                        settle(&mut inflight).await;
                        return Err(e);
                    }
                },
                changed = progress.changed(), if end.is_none() => {
                    if changed.is_err() {
                        settle(&mut inflight).await;
                        return Ok(None);
                    }
                }
            }
        }
    }

    pub(super) async fn create_upload(
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
        let upload = create
            .send()
            .await
            .map_err(|e| classify(&self.cfg, "put", key, e))?;
        Ok(upload
            .upload_id()
            .ok_or_else(|| {
                permanent(
                    &self.cfg,
                    "put",
                    key,
                    "CreateMultipartUpload returned no upload id",
                )
            })?
            .to_string())
    }

    /// Uploads part `index` (0-based) of `n` bytes.
    pub(super) async fn upload_part(
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
        let out = req
            .send()
            .await
            .map_err(|e| classify(&self.cfg, "put", key, e))?;
        let etag = out
            .e_tag()
            .ok_or_else(|| permanent(&self.cfg, "put", key, "UploadPart returned no ETag"))?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .e_tag(etag)
            .build())
    }

    /// Completes an upload from its parts (any order), aborting it if that fails.
    pub(super) async fn complete(
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
            return Err(classify(&self.cfg, "put", key, e));
        }
        Ok(())
    }

    /// Aborts an upload. Call it only once no part upload is in flight ([`settle`]): S3 may
    /// keep a part whose upload was under way when the abort came, stored (and billed) until
    /// a lifecycle rule removes it.
    pub(super) async fn abort(&self, c: &Client, key: &str, upload_id: &str) {
        let r = c
            .abort_multipart_upload()
            .bucket(&self.cfg.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        if let Err(e) = r {
            tracing::warn!(key, error = %classify(&self.cfg, "abort multipart", key, e), "could not abort a failed multipart upload; a bucket lifecycle rule cleans it up");
        }
    }
}

/// Waits for the part uploads still in flight to end, whatever their outcome, so that an abort
/// after this leaves no part behind.
async fn settle<F: std::future::Future>(inflight: &mut futures_util::stream::FuturesUnordered<F>) {
    while inflight.next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_equal_and_at_most_ten_thousand() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(part_size_for(5 * MIB, 12 * MIB), 5 * MIB);
        assert_eq!(part_size_for(5 * MIB, 48 * 1024 * MIB), 5 * MIB);
        for len in [49 * 1024 * MIB, 100 * 1024 * MIB, 4 * 1024 * 1024 * MIB] {
            let size = part_size_for(5 * MIB, len);
            assert!(len.div_ceil(size) <= MAX_PARTS, "{len}: {size}");
            assert_eq!(size % MIB, 0);
            assert!(size <= 5 * 1024 * MIB);
        }
    }
}
