//! OpenDAL errors as [`StorageError`]s a person can act on: the object named as
//! `gs://BUCKET/KEY`, `abs://ACCOUNT@CONTAINER/KEY` or `webdav[s]://HOST/KEY`, the cause in
//! words, a hint.

use super::config::{ObjectConfig, Service};
use crate::storage::StorageError;

/// `gs://BUCKET/KEY`, `abs://ACCOUNT@CONTAINER/KEY` or `webdav[s]://HOST/KEY`.
pub(super) fn at(cfg: &ObjectConfig, key: &str) -> String {
    if cfg.service == Service::Webdav {
        let server = ObjectConfig {
            path: String::new(),
            ..cfg.clone()
        };
        return format!("{}/{key}", server.url());
    }
    let host = match (cfg.service, &cfg.account_name) {
        (Service::Azure, Some(a)) => format!("{a}@{}", cfg.bucket),
        _ => cfg.bucket.clone(),
    };
    format!("{}://{host}/{key}", cfg.service.scheme())
}

/// Maps an OpenDAL error. `listing`: a NotFound answer to a listing means the bucket or
/// container itself is missing (a missing prefix lists empty; on WebDAV, a missing
/// collection is an empty replica).
pub(super) fn classify(
    cfg: &ObjectConfig,
    op: &'static str,
    key: &str,
    e: opendal::Error,
    listing: bool,
) -> StorageError {
    use opendal::ErrorKind as K;
    tracing::debug!(op, key = %at(cfg, key), error = %scrub(&format!("{e:?}")), "object store request failed");
    let key_at = at(cfg, key);
    let (bucket_word, perms) = match cfg.service {
        Service::Gcs => (
            "bucket",
            "the account needs roles/storage.objectAdmin on the bucket (objects create, get, \
             list and delete)",
        ),
        Service::Azure => (
            "container",
            "the identity needs the Storage Blob Data Contributor role on the container (or a \
             SAS token with read, add, create, write, delete and list)",
        ),
        Service::Webdav => (
            "collection",
            "the user needs to list (PROPFIND), create collections (MKCOL), write (PUT), move \
             (MOVE) and delete (DELETE) under the replica's path",
        ),
    };
    let cause = scrub(&one_line(&deepest(&e)));
    let lower = format!("{e:?}").to_ascii_lowercase();
    let permanent = |reason: String| StorageError::Permanent {
        op,
        key: key_at.clone(),
        reason,
    };
    let missing_bucket = || {
        permanent(format!(
            "{bucket_word} `{}` does not exist at {}; hint: create it, or correct the \
             {bucket_word} name or endpoint",
            cfg.bucket,
            cfg.endpoint_label()
        ))
    };
    let webdav_status = (cfg.service == Service::Webdav)
        .then(|| http_status(&lower))
        .flatten();
    match e.kind() {
        K::NotFound
            if listing && cfg.service != Service::Webdav
                || lower.contains("containernotfound")
                || lower.contains("bucket does not exist")
                || lower.contains("no such bucket") =>
        {
            missing_bucket()
        }
        K::NotFound => StorageError::NotFound(key_at),
        K::AlreadyExists | K::ConditionNotMatch => StorageError::Conflict { op, key: key_at },
        K::PermissionDenied
            if lower.contains("authenticationfailed")
                || lower.contains("authorizationfailure") && lower.contains("signature")
                || lower.contains("401") =>
        {
            permanent(format!(
                "the credentials were refused ({cause}); hint: {}",
                credentials_hint(cfg)
            ))
        }
        K::PermissionDenied => permanent(format!("access denied ({cause}); hint: {perms}")),
        // WebDAV answers come back as "unexpected" with the status inside.
        K::Unexpected if let Some(status) = webdav_status => from_status(cfg, op, key, status, ""),
        K::ConfigInvalid | K::Unsupported => permanent(cause),
        _ if lower.contains("credential") || lower.contains("token") && lower.contains("load") => {
            StorageError::Transient {
                op,
                key: key_at,
                reason: format!(
                    "no usable credentials ({cause}); hint: {}",
                    credentials_hint(cfg)
                ),
            }
        }
        _ if lower.contains("connect")
            || lower.contains("dns")
            || lower.contains("timed out")
            || lower.contains("timeout") =>
        {
            StorageError::Transient {
                op,
                key: key_at,
                reason: format!(
                    "cannot reach {}: {cause}; hint: check the endpoint and that the service is \
                     up",
                    cfg.endpoint_label()
                ),
            }
        }
        _ if e.is_temporary() || matches!(e.kind(), K::RateLimited | K::Unexpected) => {
            StorageError::Transient {
                op,
                key: key_at,
                reason: cause,
            }
        }
        _ => permanent(cause),
    }
}

/// Maps a WebDAV server's answer to a request replicad made itself (the segment upload).
pub(super) fn from_status(
    cfg: &ObjectConfig,
    op: &'static str,
    key: &str,
    status: u16,
    body: &str,
) -> StorageError {
    let key = at(cfg, key);
    let said = if body.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {body}")
    };
    let permanent = |reason: String| StorageError::Permanent {
        op,
        key: key.clone(),
        reason,
    };
    match status {
        401 => permanent(format!(
            "the credentials were refused ({said}); hint: {}",
            credentials_hint(cfg)
        )),
        403 => permanent(format!(
            "access denied ({said}); hint: the user needs to list (PROPFIND), create \
             collections (MKCOL), write (PUT), move (MOVE) and delete (DELETE) under the \
             replica's path"
        )),
        // 409: a parent collection is missing (removed behind replicad's back, or a server
        // that will not make it); it may pass, so the replica keeps trying, loudly.
        409 => StorageError::Transient {
            op,
            key,
            reason: format!(
                "the server said {said}: a parent collection is missing and could not be \
                 made; hint: check that the server is writable and lets the user create \
                 collections (MKCOL) under the replica's path"
            ),
        },
        // 501: the server does not implement a WebDAV method (PROPFIND, MKCOL, MOVE); a
        // plain HTTP server answers so, and it does not pass.
        501 => permanent(format!(
            "the server said {said}; hint: it does not implement WebDAV (PROPFIND, MKCOL, \
             MOVE): is the URL a WebDAV share?"
        )),
        // 408 timed out, 423 locked, 429 and 5xx: busy or failing; 507: out of space. All
        // may pass.
        404 | 408 | 423 | 429 | 500..=599 => StorageError::Transient {
            op,
            key,
            reason: format!("the server said {said}"),
        },
        _ => permanent(format!("the server said {said}")),
    }
}

/// The HTTP status inside an OpenDAL error's text (`status: 409`), if any.
fn http_status(lower: &str) -> Option<u16> {
    let at = lower.find("status: ")? + "status: ".len();
    lower.get(at..at + 3)?.parse().ok()
}

fn credentials_hint(cfg: &ObjectConfig) -> &'static str {
    match cfg.service {
        Service::Gcs => {
            "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run with a \
             service account attached"
        }
        Service::Azure => {
            "set `account-key` (or LITESTREAM_AZURE_ACCOUNT_KEY) or `sas-token`, or run with a \
             managed or workload identity"
        }
        Service::Webdav => "check `webdav-username` and `webdav-password`",
    }
}

/// The innermost error's text: the cause, not the wrappers.
fn deepest(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let t = s.to_string();
        if !t.is_empty() {
            last = t;
        }
        source = s.source();
    }
    last
}

/// `text` with the value of every `sig=` parameter hidden: OpenDAL names the request's URL in
/// some errors (a connection cut while sending or reading a body), and an Azure SAS token
/// rides in that URL's query; its signature is the secret.
pub(super) fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        let (head, tail) = rest.split_at(at + "sig=".len());
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '&' || c == '"' || c == '\'' || c.is_whitespace() || c == ')')
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str("REDACTED");
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
