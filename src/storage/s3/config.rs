//! An S3 replica's settings: parsed from a URL or the config file's keys, checked, and
//! redacted for display.

#[allow(unused_imports)]
use super::*;

/// Default multipart part size: S3's minimum, 5 MiB.
pub const DEFAULT_PART_SIZE: u64 = 5 * 1024 * 1024;

/// Default number of parts uploaded at once.
pub const DEFAULT_CONCURRENCY: usize = 5;

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

/// A URL as it may be shown: any `user:password@` part is replaced, and so is each value of
/// its query (an Azure SAS signature, a token), which keeps its parameter names.
pub fn redact_url(s: &str) -> String {
    // Up to the last `@` anywhere: a password may itself hold `/`, `?` or `@`, and hiding a
    // little too much of a message costs nothing.
    // Without a scheme (`user:secret@host` where a URL was expected), from the start.
    let start = s.find("://").map_or(0, |end| end + 3);
    let shown = match s.rfind('@') {
        Some(at) if at >= start => format!("{}<redacted>{}", &s[..start], &s[at..]),
        _ => s.to_string(),
    };
    match shown.split_once('?') {
        Some((base, query)) => {
            let names: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) if !v.is_empty() => format!("{k}=<redacted>"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{base}?{}", names.join("&"))
        }
        None => shown,
    }
}

pub(super) fn parse_bool(k: &str, v: &str) -> Result<bool, String> {
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

pub(super) fn clean_path(p: &str) -> String {
    p.trim_matches('/').to_string()
}
