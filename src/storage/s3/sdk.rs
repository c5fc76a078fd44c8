//! The AWS SDK behind an [`S3Client`](super::S3Client): building it, sharing one per endpoint,
//! region and credentials among a Store's replicas ([`S3Clients`]), and mapping its errors to
//! [`StorageError`] (transient or permanent).

use super::config::S3Config;
#[allow(unused_imports)]
use super::*;

/// What makes two replicas' SDK clients interchangeable: everything `build_client` reads.
/// Bucket and path are per request, so every database of a bucket shares one client and its
/// connection pool (400 databases: one pool, not 400).
#[derive(PartialEq, Eq, Hash)]
pub(super) struct ClientKey {
    pub(super) region: Option<String>,
    pub(super) endpoint: Option<String>,
    pub(super) force_path_style: bool,
    pub(super) access_key_id: Option<String>,
    pub(super) secret_access_key: Option<String>,
}

/// SDK clients shared by the replicas of one Store ([`S3Client::shared`](super::S3Client::shared)).
#[derive(Default)]
pub struct S3Clients {
    /// Held only while looking up, never across `.await`.
    by_key: std::sync::Mutex<HashMap<ClientKey, Arc<OnceCell<Client>>>>,
}

impl S3Clients {
    /// The (lazily built) SDK client for `cfg`'s endpoint, region and credentials.
    pub(super) fn get(&self, cfg: &S3Config) -> Arc<OnceCell<Client>> {
        let key = ClientKey {
            region: cfg.region.clone(),
            endpoint: cfg.endpoint.clone(),
            force_path_style: cfg.force_path_style,
            access_key_id: cfg.access_key_id.clone(),
            secret_access_key: cfg.secret_access_key.as_ref().map(|s| s.0.clone()),
        };
        match self.by_key.lock() {
            Ok(mut shared) => shared.entry(key).or_default().clone(),
            // A panic elsewhere while looking up: an unshared client still works.
            Err(_) => Arc::new(OnceCell::new()),
        }
    }
}

pub(super) async fn build_client(cfg: &S3Config) -> Result<Client, StorageError> {
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

pub(super) fn transient(
    cfg: &S3Config,
    op: &'static str,
    key: &str,
    e: impl fmt::Display,
) -> StorageError {
    StorageError::Transient {
        op,
        key: format!("s3://{}/{key}", cfg.bucket),
        reason: one_line(&e.to_string()),
    }
}

pub(super) fn permanent(cfg: &S3Config, op: &'static str, key: &str, reason: &str) -> StorageError {
    StorageError::Permanent {
        op,
        key: format!("s3://{}/{key}", cfg.bucket),
        reason: reason.to_string(),
    }
}

/// Maps an SDK error: missing objects are NotFound; 4xx other than throttling and timeouts
/// are permanent; the rest (5xx, network, timeouts) may pass.
///
/// The error names the object as `s3://BUCKET/KEY` and says what went wrong in words, with a
/// hint for the common causes; the SDK's own (multi-line, debug-formatted) account goes to the
/// log at `debug` only.
pub(super) fn classify<E, R>(
    cfg: &S3Config,
    op: &'static str,
    key: &str,
    e: SdkError<E, R>,
) -> StorageError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug + 'static,
{
    let at = format!("s3://{}/{key}", cfg.bucket);
    tracing::debug!(op, key = %at, error = ?aws_sdk_s3::error::DisplayErrorContext(&e), "S3 request failed");
    let status = match &e {
        SdkError::ServiceError(s) => raw_status(s.raw()),
        SdkError::ResponseError(r) => raw_status(r.raw()),
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
    // An upload S3 no longer knows (aborted, expired by a lifecycle rule): the put is tried
    // again whole; its object is not missing.
    if code.as_deref() == Some("NoSuchUpload") {
        return StorageError::Transient {
            op,
            key: at,
            reason: "the multipart upload is gone (NoSuchUpload): it is started again".into(),
        };
    }
    // A missing bucket is a configuration error, not a missing object.
    if code.as_deref() != Some("NoSuchBucket")
        && (matches!(code.as_deref(), Some("NoSuchKey" | "NotFound")) || status == Some(404))
    {
        return StorageError::NotFound(at);
    }
    if code.as_deref() == Some("PreconditionFailed") || status == Some(412) {
        return StorageError::Conflict { op, key: at };
    }
    let (reason, permanent) = match &e {
        SdkError::ServiceError(_) => {
            explain_answer(cfg, code.as_deref(), message.as_deref(), status)
        }
        _ => explain_no_answer(cfg, &e),
    };
    if permanent {
        StorageError::Permanent {
            op,
            key: at,
            reason,
        }
    } else {
        StorageError::Transient {
            op,
            key: at,
            reason,
        }
    }
}

/// Where requests go, for messages: the configured endpoint, or AWS's for the region.
fn endpoint_label(cfg: &S3Config) -> String {
    match (&cfg.endpoint, &cfg.region) {
        (Some(ep), _) => super::redact_url(ep),
        (None, Some(r)) => format!("s3.{r}.amazonaws.com"),
        (None, None) => "AWS S3".to_string(),
    }
}

/// A request the server answered with an error: the cause in words and whether it is
/// permanent (a retry will not fix it).
fn explain_answer(
    cfg: &S3Config,
    code: Option<&str>,
    message: Option<&str>,
    status: Option<u16>,
) -> (String, bool) {
    let bucket = &cfg.bucket;
    let said = match (code, message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_string(),
        (None, _) => match status {
            Some(s) => format!("HTTP {s}"),
            None => "an error without a code".to_string(),
        },
    };
    // (cause in words, hint)
    let words: Option<(String, &str)> = match code {
        Some("NoSuchBucket") => Some((
            format!(
                "bucket `{bucket}` does not exist at {}",
                endpoint_label(cfg)
            ),
            "create it, or correct the bucket name, region or endpoint",
        )),
        // s3s answers NotSignedUp for an unknown key; AWS uses it for an account without S3.
        Some("InvalidAccessKeyId" | "NotSignedUp") => Some((
            "the server does not know this access key ID".to_string(),
            "check access-key-id (or AWS_ACCESS_KEY_ID / LITESTREAM_ACCESS_KEY_ID)",
        )),
        Some("SignatureDoesNotMatch") => Some((
            "the server rejected the request signature: the secret access key is wrong for \
             this access key ID"
                .to_string(),
            "check secret-access-key (or AWS_SECRET_ACCESS_KEY / LITESTREAM_SECRET_ACCESS_KEY)",
        )),
        Some("AccessDenied" | "AllAccessDisabled" | "AccountProblem") => Some((
            format!("access denied to bucket `{bucket}`"),
            "the credentials need s3:ListBucket on the bucket and s3:GetObject, s3:PutObject \
             and s3:DeleteObject on the replica's path",
        )),
        Some(
            "PermanentRedirect"
            | "AuthorizationHeaderMalformed"
            | "IllegalLocationConstraintException",
        ) => Some((
            format!("bucket `{bucket}` is in another region"),
            "set region to the bucket's region",
        )),
        Some("InvalidBucketName") => Some((
            format!("`{bucket}` is not a valid bucket name"),
            "bucket names are 3-63 lowercase letters, digits, dots and hyphens",
        )),
        Some("ExpiredToken" | "InvalidToken" | "TokenRefreshRequired") => Some((
            "the session token is expired or invalid".to_string(),
            "refresh the credentials",
        )),
        _ => match status {
            Some(403) => Some((
                format!("access denied to bucket `{bucket}`"),
                "check the credentials and their permissions on the bucket",
            )),
            Some(301) => Some((
                format!("bucket `{bucket}` is in another region"),
                "set region to the bucket's region",
            )),
            _ => None,
        },
    };
    let reason = match words {
        Some((cause, hint)) => format!("{cause} (server said {said}); hint: {hint}"),
        None => format!("server said {said}"),
    };
    // 409 ConditionalRequestConflict: two conditional writes raced; the retry decides.
    // 400 RequestTimeout: the connection was idle too long mid-request; it may pass.
    let permanent = matches!(status, Some(s) if (400..500).contains(&s) && !matches!(s, 408 | 409 | 429))
        && code != Some("RequestTimeout")
        || matches!(
            code,
            Some(
                "NoSuchBucket"
                    | "AccessDenied"
                    | "InvalidAccessKeyId"
                    | "NotSignedUp"
                    | "SignatureDoesNotMatch"
            )
        );
    (reason, permanent)
}

/// A request that got no usable answer: no credentials, no connection, a timeout. All of
/// them may pass (a server restarting, a role being attached), so all are transient.
fn explain_no_answer<E, R>(cfg: &S3Config, e: &SdkError<E, R>) -> (String, bool)
where
    E: std::error::Error + 'static,
    R: fmt::Debug + 'static,
{
    let endpoint = endpoint_label(cfg);
    let mut deepest: &(dyn std::error::Error + 'static) = e;
    let mut credentials = None;
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if credentials.is_none()
            && let Some(c) =
                s.downcast_ref::<aws_credential_types::provider::error::CredentialsError>()
        {
            credentials = Some(c);
        }
        deepest = s;
        source = s.source();
    }
    let cause = one_line(&deepest.to_string());
    let reason = if let Some(c) = credentials {
        use aws_credential_types::provider::error::CredentialsError as C;
        let what = match c {
            C::CredentialsNotLoaded(_) => "no AWS credentials found".to_string(),
            // The chain's last provider (often EC2 instance metadata) failed: nothing found.
            C::ProviderError(_) | C::ProviderTimedOut(_) => {
                format!("no AWS credentials found (last place tried: {cause})")
            }
            _ => format!("AWS credentials could not be loaded: {cause}"),
        };
        format!(
            "{what}; hint: set access-key-id and secret-access-key in the config, or \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or LITESTREAM_ACCESS_KEY_ID and \
             LITESTREAM_SECRET_ACCESS_KEY), or run with an AWS profile or IAM role"
        )
    } else {
        match e {
            SdkError::TimeoutError(_) => format!(
                "no answer from {endpoint} in time; hint: check the endpoint and the network"
            ),
            SdkError::DispatchFailure(d) if d.is_timeout() => format!(
                "timed out connecting to {endpoint}; hint: check the endpoint and the network"
            ),
            SdkError::DispatchFailure(d) if d.is_io() => format!(
                "cannot reach {endpoint}: {cause}; hint: check the endpoint (scheme, host, \
                 port) and that the server is up"
            ),
            SdkError::ResponseError(_) => {
                format!("the answer from {endpoint} could not be read: {cause}")
            }
            SdkError::ConstructionFailure(_) => {
                format!("the request could not be built: {cause}")
            }
            _ => format!("request to {endpoint} failed: {cause}"),
        }
    };
    (reason, false)
}

/// Error texts from deep in the stack may span lines; a log line must not.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(super) fn raw_status<R: fmt::Debug>(raw: &R) -> Option<u16> {
    // The raw response type is generic here; its Debug carries `status: StatusCode(N)`.
    let dbg = format!("{raw:?}");
    let at = dbg.find("StatusCode(")? + "StatusCode(".len();
    dbg[at..].split(')').next()?.parse().ok()
}

pub(super) fn from_smithy_time(t: Option<&aws_sdk_s3::primitives::DateTime>) -> DateTime<Utc> {
    t.and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_pass_are_transient_and_setup_errors_permanent() {
        let cfg = S3Config::default();
        let permanent =
            |code: &str, status: u16| explain_answer(&cfg, Some(code), None, Some(status)).1;
        // S3 answers an idle connection mid-request with 400 RequestTimeout: it may pass.
        assert!(!permanent("RequestTimeout", 400));
        assert!(!permanent("SlowDown", 503));
        assert!(permanent("InvalidArgument", 400));
        assert!(permanent("AccessDenied", 403));
    }
}
