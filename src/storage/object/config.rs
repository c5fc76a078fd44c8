//! The settings of a Google Cloud Storage, Azure Blob Storage or WebDAV replica: parsed from a
//! URL (`gs://BUCKET/PATH`, `abs://ACCOUNT@CONTAINER/PATH`, `webdav[s]://HOST/PATH`, as
//! Litestream spells them), checked, and turned into an OpenDAL operator.

use std::time::Duration;

use opendal::Operator;
use opendal::layers::TimeoutLayer;
use opendal::services::{Azblob, Gcs, Webdav};

use crate::storage::s3::Secret;

/// Which service a replica is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Google Cloud Storage (`gs://`).
    Gcs,
    /// Azure Blob Storage (`abs://`).
    Azure,
    /// A WebDAV server (`webdav://` over HTTP, `webdavs://` over HTTPS).
    Webdav,
}

impl Service {
    /// The URL scheme and config `type`.
    pub fn scheme(self) -> &'static str {
        match self {
            Service::Gcs => "gs",
            Service::Azure => "abs",
            Service::Webdav => "webdav",
        }
    }
}

/// Settings of one GCS, Azure or WebDAV replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectConfig {
    /// The service.
    pub service: Service,
    /// GCS bucket, or Azure container; empty on WebDAV.
    pub bucket: String,
    /// Key prefix (no leading or trailing slash); objects are `<path>/ltx/<level>/...`.
    pub path: String,
    /// Endpoint override: an emulator (fake-gcs-server, Azurite) or a private endpoint.
    /// For Azure it includes the account when the service is path-style
    /// (`http://127.0.0.1:10000/devstoreaccount1`), as Litestream takes it. On WebDAV it is
    /// the server's URL (`webdav-url`), required.
    pub endpoint: Option<String>,
    /// Azure storage account.
    pub account_name: Option<String>,
    /// Azure account key (else `LITESTREAM_AZURE_ACCOUNT_KEY`, else a SAS token or Entra ID).
    pub account_key: Option<Secret>,
    /// Azure SAS token (the query string, with or without a leading `?`).
    pub sas_token: Option<Secret>,
    /// WebDAV basic-auth user (`webdav-username`).
    pub username: Option<String>,
    /// WebDAV basic-auth password (`webdav-password`).
    pub password: Option<Secret>,
}

impl ObjectConfig {
    /// A config for `service` with only the location set.
    pub fn new(service: Service, bucket: &str, path: &str) -> ObjectConfig {
        ObjectConfig {
            service,
            bucket: bucket.to_string(),
            path: path.trim_matches('/').to_string(),
            endpoint: None,
            account_name: None,
            account_key: None,
            sas_token: None,
            username: None,
            password: None,
        }
    }

    /// A WebDAV replica at `webdav_url` (the server, `webdav-url`) under `path`.
    pub fn webdav(webdav_url: &str, path: &str) -> ObjectConfig {
        ObjectConfig {
            endpoint: Some(webdav_url.trim_end_matches('/').to_string()),
            ..ObjectConfig::new(Service::Webdav, "", path)
        }
    }

    /// Parses `gs://BUCKET/PATH[?endpoint=...]`,
    /// `abs://ACCOUNT@CONTAINER/PATH[?endpoint=...]` or `webdav[s]://HOST[:PORT]/PATH`
    /// (Litestream's form: the server is `http[s]://HOST[:PORT]`, the files are under `PATH`).
    pub fn from_url(url: &str) -> Result<ObjectConfig, String> {
        for (scheme, http) in [("webdav://", "http://"), ("webdavs://", "https://")] {
            if let Some(rest) = url.strip_prefix(scheme) {
                let shown = redact(url);
                let parsed = url::Url::parse(&format!("{http}{rest}")).map_err(|e| {
                    format!("a WebDAV replica URL is webdav[s]://HOST[:PORT]/PATH ({e}): {shown}")
                })?;
                if !parsed.username().is_empty() || parsed.password().is_some() {
                    return Err(format!(
                        "credentials in a replica URL are refused: {shown}; hint: set \
                         `webdav-username` and `webdav-password` instead"
                    ));
                }
                let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
                if host.is_empty() || path.contains('?') {
                    return Err(format!(
                        "a WebDAV replica URL is webdav[s]://HOST[:PORT]/PATH, got {shown}"
                    ));
                }
                let cfg = ObjectConfig::webdav(&format!("{http}{host}"), path);
                cfg.validate()?;
                return Ok(cfg);
            }
        }
        let (service, rest) = if let Some(rest) = url.strip_prefix("gs://") {
            (Service::Gcs, rest)
        } else if let Some(rest) = url.strip_prefix("abs://") {
            (Service::Azure, rest)
        } else {
            return Err(format!(
                "not a gs://, abs:// or webdav:// URL: {}",
                redact(url)
            ));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        // An account key holds `/` (base64): credentials end at the last `@`, not the first `/`.
        if service == Service::Azure
            && rest
                .rsplit_once('@')
                .is_some_and(|(user, _)| user.contains(':'))
        {
            return Err(format!(
                "credentials in a replica URL are refused: {}",
                redact(url)
            ));
        }
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let mut cfg = match service {
            Service::Gcs | Service::Webdav => {
                if host.contains('@') {
                    return Err(format!(
                        "credentials in a replica URL are refused: {}",
                        redact(url)
                    ));
                }
                ObjectConfig::new(service, host, path)
            }
            Service::Azure => {
                let Some((account, container)) = host.split_once('@') else {
                    return Err(format!(
                        "an abs:// URL names the account and the container: \
                         abs://ACCOUNT@CONTAINER/PATH, got {}",
                        redact(url)
                    ));
                };
                if account.contains(':') {
                    return Err(format!(
                        "credentials in a replica URL are refused: {}",
                        redact(url)
                    ));
                }
                let mut c = ObjectConfig::new(service, container, path);
                c.account_name = Some(account.to_string()).filter(|a| !a.is_empty());
                c
            }
        };
        for (k, v) in query
            .map(|q| url::form_urlencoded::parse(q.as_bytes()).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            match k.as_ref() {
                "endpoint" => cfg.endpoint = Some(v.into_owned()),
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} in {} URL {}",
                        service.scheme(),
                        redact(url)
                    ));
                }
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what can be checked without contacting the service.
    pub fn validate(&self) -> Result<(), String> {
        let what = match self.service {
            Service::Gcs => "bucket",
            Service::Azure => "container",
            Service::Webdav => {
                return match &self.endpoint {
                    Some(ep)
                        if url::Url::parse(ep)
                            .is_ok_and(|u| !u.username().is_empty() || u.password().is_some()) =>
                    {
                        Err(format!(
                            "credentials in webdav-url are refused: {}; hint: set \
                             `webdav-username` and `webdav-password` instead",
                            redact(ep)
                        ))
                    }
                    Some(ep) if ep.starts_with("http://") || ep.starts_with("https://") => Ok(()),
                    Some(ep) => Err(format!(
                        "webdav-url {} must start with http:// or https://",
                        redact(ep)
                    )),
                    None => Err("a webdav replica needs `webdav-url` (the server, \
                                 https://HOST[:PORT][/PATH]) or a webdav[s]:// `url`"
                        .into()),
                };
            }
        };
        if self.bucket.is_empty() {
            return Err(format!(
                "{} replica without a {what}",
                self.service.scheme()
            ));
        }
        if self.service == Service::Azure && self.account_name.is_none() {
            return Err(
                "an abs replica needs `account-name` (or abs://ACCOUNT@CONTAINER/PATH)".into(),
            );
        }
        if let Some(ep) = &self.endpoint
            && !(ep.starts_with("http://") || ep.starts_with("https://"))
        {
            return Err(format!(
                "endpoint {} must start with http:// or https://",
                redact(ep)
            ));
        }
        Ok(())
    }

    /// `gs://BUCKET/PATH`, `abs://ACCOUNT@CONTAINER/PATH` (no secrets, no endpoint) or
    /// `webdav[s]://HOST[:PORT]/PATH` (the server's URL path, if any, then the replica's).
    pub fn url(&self) -> String {
        if self.service == Service::Webdav {
            let ep = self.endpoint.as_deref().unwrap_or_default();
            let (scheme, rest) = match ep.strip_prefix("https://") {
                Some(rest) => ("webdavs", rest),
                None => ("webdav", ep.trim_start_matches("http://")),
            };
            let rest = rest.trim_end_matches('/');
            return if self.path.is_empty() {
                format!("{scheme}://{rest}")
            } else {
                format!("{scheme}://{rest}/{}", self.path)
            };
        }
        let host = match (self.service, &self.account_name) {
            (Service::Azure, Some(a)) => format!("{a}@{}", self.bucket),
            _ => self.bucket.clone(),
        };
        if self.path.is_empty() {
            format!("{}://{host}", self.service.scheme())
        } else {
            format!("{}://{host}/{}", self.service.scheme(), self.path)
        }
    }

    /// The endpoint requests go to, for messages.
    pub fn endpoint_label(&self) -> String {
        match (&self.endpoint, self.service) {
            (Some(ep), _) => redact(ep),
            (None, Service::Gcs) => "storage.googleapis.com".into(),
            (None, Service::Azure) => format!(
                "{}.blob.core.windows.net",
                self.account_name.as_deref().unwrap_or("ACCOUNT")
            ),
            (None, Service::Webdav) => "the WebDAV server".into(),
        }
    }

    /// Builds the OpenDAL operator (nothing is contacted).
    pub fn build(&self) -> Result<Operator, String> {
        // OpenDAL's process-wide HTTP transport (reqwest with rustls); first call wins.
        static TRANSPORT: std::sync::Once = std::sync::Once::new();
        TRANSPORT.call_once(opendal::install_default);
        let op = match self.service {
            Service::Gcs => {
                let mut b = Gcs::default().bucket(&self.bucket).root("/");
                // The Go SDK's emulator variable, which Litestream users already set.
                let emulator = std::env::var("STORAGE_EMULATOR_HOST")
                    .ok()
                    .filter(|h| !h.is_empty())
                    .map(|h| {
                        if h.contains("://") {
                            h
                        } else {
                            format!("http://{h}")
                        }
                    });
                // Otherwise Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS
                // (a service-account key file), gcloud's, or the attached service account.
                if let Some(ep) = self.endpoint.clone().or(emulator) {
                    // An emulator takes no OAuth token.
                    b = b.endpoint(ep.trim_end_matches('/')).skip_signature();
                }
                Operator::new(b)
            }
            Service::Azure => {
                let account = self.account_name.clone().unwrap_or_default();
                let endpoint = self
                    .endpoint
                    .clone()
                    .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"));
                let mut b = Azblob::default()
                    .container(&self.bucket)
                    .root("/")
                    .endpoint(endpoint.trim_end_matches('/'))
                    .account_name(&account);
                let key = self.account_key.as_ref().map(|k| k.0.clone()).or_else(|| {
                    std::env::var("LITESTREAM_AZURE_ACCOUNT_KEY")
                        .ok()
                        .filter(|k| !k.is_empty())
                });
                if let Some(k) = key {
                    b = b.account_key(&k);
                } else if let Some(sas) = &self.sas_token {
                    b = b.sas_token(sas.0.trim_start_matches('?'));
                }
                Operator::new(b)
            }
            Service::Webdav => {
                // Collections are made once per client (see `ensure_dir`), not before every PUT.
                let mut b = Webdav::default()
                    .endpoint(self.endpoint.as_deref().unwrap_or_default())
                    .root("/")
                    .disable_create_dir(true);
                if let Some(user) = &self.username {
                    b = b.username(user);
                }
                if let Some(pw) = &self.password {
                    b = b.password(&pw.0);
                }
                Operator::new(b)
            }
        };
        let op =
            op.map_err(|e| format!("{} replica {}: {e}", self.service.scheme(), self.url()))?;
        // A hung connection must fail the call, not the replica: replicad retries rounds.
        Ok(op.layer(
            TimeoutLayer::new()
                .with_timeout(Duration::from_secs(60))
                .with_io_timeout(Duration::from_secs(30)),
        ))
    }
}

/// A URL with any `user:secret@` part hidden.
fn redact(url: &str) -> String {
    crate::storage::s3::redact_url(url)
}
