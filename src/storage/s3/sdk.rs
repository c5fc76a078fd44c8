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

pub(super) fn transient(op: &'static str, key: &str, e: impl fmt::Display) -> StorageError {
    StorageError::Transient {
        op,
        key: key.to_string(),
        reason: e.to_string(),
    }
}

pub(super) fn permanent(op: &'static str, key: &str, reason: &str) -> StorageError {
    StorageError::Permanent {
        op,
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// Maps an SDK error: missing objects are NotFound; 4xx other than throttling and timeouts
/// are permanent; the rest (5xx, network, timeouts) may pass.
pub(super) fn classify<E, R>(op: &'static str, key: &str, e: SdkError<E, R>) -> StorageError
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
