//! Replica URLs: normalising them, refusing credentials inside them, redacting them for
//! messages, and the "no two replicas share a destination" key.

#[allow(unused_imports)]
use crate::config::*;

pub(crate) fn unsupported_type(t: &str) -> String {
    format!("replica type {t} is not supported yet")
}

/// The `file://` URL of a file replica given by a path (or the path part of a `file://` URL).
pub(crate) fn file_url_from_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("empty replica path".into());
    }
    let normalized = file_url(&absolutize(Path::new(path))?);
    AnyClient::from_url(&normalized).map_err(|e| format!("invalid replica URL: {e}"))?;
    Ok(normalized)
}

/// [`ReplicaConfig::url`] of an S3 replica.
pub(crate) fn s3_url(cfg: &S3Config) -> String {
    if cfg.path.is_empty() {
        format!("s3://{}", cfg.bucket)
    } else {
        format!("s3://{}/{}", cfg.bucket, cfg.path)
    }
}

/// The authority part (`user:secret@host`) of `scheme://authority/...`, if any.
pub(crate) fn authority(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some((scheme, &rest[..end], &rest[end..]))
}

/// Credentials in a URL would be shown wherever the URL is (logs, `replicad databases`).
/// The error does not echo the URL.
pub(crate) fn reject_userinfo(url: &str) -> Result<(), String> {
    match authority(url) {
        Some((_, auth, _)) if auth.contains('@') => Err(
            "credentials do not belong in a replica URL (it is shown in logs): use the keys \
             `access-key-id` and `secret-access-key` in a config file, or the standard AWS \
             credential chain"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// `url` with any `user:secret@` replaced, for error messages.
pub(crate) fn redact_userinfo(url: &str) -> String {
    crate::storage::s3::redact_url(url)
}

/// Where a replica writes: two replicas with the same destination would overwrite each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// A directory (absolute, normalised).
    File(String),
    /// An S3 location. `endpoint` is empty for AWS, else normalised as the client uses it
    /// (`https://` added when there is no scheme, no trailing slash, lower case).
    S3 {
        endpoint: String,
        bucket: String,
        path: String,
    },
}

impl Destination {
    pub(crate) fn of(url: &str, s3: Option<&S3Config>) -> Destination {
        match s3 {
            Some(cfg) => Destination::S3 {
                endpoint: cfg
                    .endpoint
                    .as_deref()
                    .map(|e| {
                        let e = e.trim().trim_end_matches('/').to_ascii_lowercase();
                        if e.contains("://") {
                            e
                        } else {
                            format!("https://{e}")
                        }
                    })
                    .unwrap_or_default(),
                bucket: cfg.bucket.clone(),
                path: cfg.path.clone(),
            },
            None => Destination::File(url.strip_prefix("file://").unwrap_or(url).to_string()),
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::File(path) => write!(f, "replica path {path}"),
            Destination::S3 {
                endpoint,
                bucket,
                path,
            } => {
                write!(f, "s3 destination s3://{bucket}/{path}")?;
                if !endpoint.is_empty() {
                    write!(f, " at endpoint {endpoint}")?;
                }
                Ok(())
            }
        }
    }
}

/// Expands a leading `~`, makes `path` absolute against the current directory and normalises
/// it lexically (see the module rules).
pub(crate) fn absolutize(path: &Path) -> Result<PathBuf, String> {
    let expanded = match path.to_str() {
        Some(s) if s == "~" || s.starts_with("~/") => {
            let home = std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .ok_or_else(|| format!("path {s:?}: cannot expand `~`: HOME is not set"))?;
            let mut p = PathBuf::from(home);
            p.push(s.trim_start_matches('~').trim_start_matches('/'));
            p
        }
        _ => path.to_path_buf(),
    };
    let abs = std::path::absolute(&expanded)
        .map_err(|e| format!("path {:?}: cannot make it absolute: {e}", path.display()))?;
    Ok(abs.components().collect())
}

pub(crate) fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}
