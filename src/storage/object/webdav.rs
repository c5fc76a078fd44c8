//! The upload of one WebDAV segment in two plain requests, beside OpenDAL (which lists, reads
//! and deletes): a streamed `PUT` of the file under a temporary name, then `MOVE` to its name
//! with `Overwrite: F`. OpenDAL's WebDAV writer takes one in-memory buffer and its `MOVE`
//! always overwrites; this keeps memory at one read buffer and lets the server refuse an
//! existing name atomically (RFC 4918 §10.6: 412 Precondition Failed).

use std::path::Path;
use std::time::Duration;

use super::config::ObjectConfig;
use super::errors;
use crate::storage::StorageError;

/// One request's time limit (a segment of several hundred MB over a slow link fits).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// The HTTP side of a WebDAV replica's uploads.
#[derive(Clone)]
pub(super) struct Uploader {
    http: reqwest::Client,
    base: url::Url,
    auth: Option<(String, String)>,
}

impl Uploader {
    /// An uploader for `cfg` (a WebDAV config); nothing is contacted.
    pub(super) fn new(cfg: &ObjectConfig) -> Result<Uploader, String> {
        let endpoint = cfg.endpoint.as_deref().unwrap_or_default();
        let mut base = url::Url::parse(endpoint).map_err(|e| {
            let shown = crate::storage::s3::redact_url(endpoint);
            format!("webdav-url {shown} is not a URL: {e}")
        })?;
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| format!("webdav client: {e}"))?;
        Ok(Uploader {
            http,
            base,
            auth: cfg.username.clone().map(|u| {
                (
                    u,
                    cfg.password
                        .as_ref()
                        .map(|p| p.0.clone())
                        .unwrap_or_default(),
                )
            }),
        })
    }

    /// The URL of `key` (a `/`-separated path under the server), each segment escaped.
    fn url(&self, key: &str) -> url::Url {
        let mut u = self.base.clone();
        if let Ok(mut segments) = u.path_segments_mut() {
            segments.pop_if_empty().extend(key.split('/'));
        }
        u
    }

    fn request(&self, method: &str, key: &str) -> reqwest::RequestBuilder {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .expect("PUT, MOVE and DELETE are valid method names");
        let r = self.http.request(method, self.url(key));
        match &self.auth {
            Some((user, pass)) => r.basic_auth(user, Some(pass)),
            None => r,
        }
    }

    /// Streams `src` (`size` bytes) to `key`.
    pub(super) async fn put(
        &self,
        cfg: &ObjectConfig,
        key: &str,
        src: &Path,
        size: u64,
    ) -> Result<(), StorageError> {
        let file = tokio::fs::File::open(src)
            .await
            .map_err(|e| StorageError::from_io("put", src, e))?;
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
            file,
            256 * 1024,
        ));
        let resp = self
            .request("PUT", key)
            .header(reqwest::header::CONTENT_LENGTH, size)
            .body(body)
            .send()
            .await
            .map_err(|e| transport(cfg, "put", key, &e))?;
        expect_success(cfg, "put", key, resp).await
    }

    /// Moves `from` to `to` unless `to` exists: [`StorageError::Conflict`] then.
    pub(super) async fn move_new(
        &self,
        cfg: &ObjectConfig,
        from: &str,
        to: &str,
    ) -> Result<(), StorageError> {
        let resp = self
            .request("MOVE", from)
            .header("Destination", self.url(to).as_str())
            .header("Overwrite", "F")
            .send()
            .await
            .map_err(|e| transport(cfg, "put", to, &e))?;
        if resp.status() == reqwest::StatusCode::PRECONDITION_FAILED {
            return Err(StorageError::Conflict {
                op: "put",
                key: errors::at(cfg, to),
            });
        }
        expect_success(cfg, "put", to, resp).await
    }

    /// Deletes `key`, best effort (a temporary name after a failed upload).
    pub(super) async fn delete(&self, key: &str) {
        let _ = self.request("DELETE", key).send().await;
    }
}

/// True for the answer to a PUT whose parent collection is missing (RFC 4918 §9.7.1: 409;
/// some servers say 404).
pub(super) fn is_missing_parent(e: &StorageError) -> bool {
    matches!(e, StorageError::Transient { reason, .. }
        if reason.starts_with("the server said HTTP 409") || reason.starts_with("the server said HTTP 404"))
}

fn transport(cfg: &ObjectConfig, op: &'static str, key: &str, e: &reqwest::Error) -> StorageError {
    tracing::debug!(op, key = %errors::at(cfg, key), error = ?e, "webdav request failed");
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    StorageError::Transient {
        op,
        key: errors::at(cfg, key),
        reason: format!(
            "cannot reach {}: {cause}; hint: check the endpoint and that the service is up",
            cfg.endpoint_label()
        ),
    }
}

async fn expect_success(
    cfg: &ObjectConfig,
    op: &'static str,
    key: &str,
    resp: reqwest::Response,
) -> Result<(), StorageError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body: String = resp
        .text()
        .await
        .unwrap_or_default()
        .split_whitespace()
        .take(30)
        .collect::<Vec<_>>()
        .join(" ");
    Err(errors::from_status(cfg, op, key, status.as_u16(), &body))
}
