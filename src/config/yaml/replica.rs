//! One replica map (`url`, or `type` with its keys), its S3 keys and its `age` encryption.

use crate::config::url::{Destination, file_url_from_path, s3_url};
use crate::config::yaml::remote::RawOther;
use crate::config::yaml::{
    AGE_KEYS, AZURE_KEYS, Ctx, KeySeed, OBJECT_SHARED_KEYS, REPLICA_KEYS, S3_KEYS,
    S3_KEYS_WITH_URL, SFTP_KEYS, Scalar, ValueSeed, WEBDAV_KEYS, boolean, bucket, concurrency,
    part_size, secret, skip_verify, text,
};
#[allow(unused_imports)]
use crate::config::*;
use crate::storage::object::{ObjectConfig, Service};

/// The `replicas` list of one database.
pub(crate) struct ReplicasSeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) db: usize,
}

impl<'de> DeserializeSeed<'de> for ReplicasSeed<'_> {
    type Value = Vec<RawReplica>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<RawReplica>, D::Error> {
        // `any`: a map must reach `visit_map` for its hint.
        d.deserialize_any(self)
    }
}

impl ReplicasSeed<'_> {
    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<RawReplica>, E> {
        // Not shown: a replica URL may hold its password.
        Err(self.ctx.fail(format!(
            "`replicas` takes a list of maps (`- url: ...`), found {} (in dbs[{}])",
            s.kind(),
            self.db
        )))
    }
}

impl<'de> Visitor<'de> for ReplicasSeed<'_> {
    type Value = Vec<RawReplica>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of replicas")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Vec<RawReplica>, A::Error> {
        Err(self.ctx.fail(format!(
            "`replicas` takes a list (`- url: ...`); use `replica` for a single map (in dbs[{}])",
            self.db
        )))
    }
    visit_scalars!(scalar);
    fn visit_unit<E: de::Error>(self) -> Result<Vec<RawReplica>, E> {
        Err(self.ctx.fail(format!(
            "`replicas` is empty in dbs[{}]: configure at least one replica",
            self.db
        )))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<RawReplica>, A::Error> {
        let mut list = Vec::new();
        while let Some(r) = seq.next_element_seed(ReplicaSeed {
            ctx: self.ctx,
            db: self.db,
            place: format!("in dbs[{}].replicas[{}]", self.db, list.len()),
        })? {
            list.push(r);
        }
        if list.is_empty() {
            return self.visit_unit();
        }
        Ok(list)
    }
}

/// A replica as read; its name is defaulted once its position is known.
pub(crate) struct RawReplica {
    pub(crate) name: Option<String>,
    pub(crate) kind: ReplicaKind,
    pub(crate) url: String,
    pub(crate) s3: Option<S3Config>,
    pub(crate) object: Option<ObjectConfig>,
    pub(crate) sftp: Option<SftpConfig>,
    pub(crate) age: Option<Arc<AgeKeys>>,
}

/// The S3 keys of one replica map (or of the top level: the global defaults), as read.
#[derive(Clone, Default)]
pub(crate) struct RawS3 {
    pub(crate) bucket: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) endpoint: Option<String>,
    pub(crate) force_path_style: Option<bool>,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<Secret>,
    pub(crate) part_size: Option<u64>,
    pub(crate) concurrency: Option<usize>,
    pub(crate) storage_class: Option<String>,
    pub(crate) sse_kms_key_id: Option<String>,
    pub(crate) sse_customer_key: Option<Secret>,
}

impl RawS3 {
    /// Reads the value of `key` if it is an S3 key; returns whether it was.
    pub(crate) fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: &'static str,
        map: &mut A,
        ctx: &Ctx,
        place: &str,
    ) -> Result<bool, A::Error> {
        fn value<'de, A: MapAccess<'de>, T>(
            map: &mut A,
            ctx: &Ctx,
            key: &'static str,
            place: &str,
            convert: &dyn Fn(Scalar<'_>) -> Result<T, String>,
        ) -> Result<Option<T>, A::Error> {
            map.next_value_seed(ValueSeed {
                ctx,
                key,
                place,
                convert,
            })
            .map(Some)
        }
        if ctx.skip_credentials
            && matches!(
                key,
                "access-key-id" | "secret-access-key" | "sse-customer-key"
            )
        {
            // A command that never contacts the replica: its secrets need not be set.
            map.next_value::<de::IgnoredAny>()?;
            return Ok(true);
        }
        match key {
            "bucket" => self.bucket = value(map, ctx, key, place, &bucket)?,
            "region" => self.region = value(map, ctx, key, place, &text)?,
            "endpoint" => self.endpoint = value(map, ctx, key, place, &text)?,
            "force-path-style" => self.force_path_style = value(map, ctx, key, place, &boolean)?,
            "access-key-id" => self.access_key_id = value(map, ctx, key, place, &text)?,
            "secret-access-key" => self.secret_access_key = value(map, ctx, key, place, &secret)?,
            "part-size" => self.part_size = value(map, ctx, key, place, &part_size)?,
            "concurrency" => self.concurrency = value(map, ctx, key, place, &concurrency)?,
            "storage-class" => self.storage_class = value(map, ctx, key, place, &text)?,
            "sse-kms-key-id" => self.sse_kms_key_id = value(map, ctx, key, place, &text)?,
            "sse-customer-key" => self.sse_customer_key = value(map, ctx, key, place, &secret)?,
            "skip-verify" => value(map, ctx, key, place, &skip_verify).map(drop)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The settings of a replica given by `bucket` and `path` (`path` is the key prefix).
    pub(crate) fn into_config(self, path: Option<&str>) -> S3Config {
        let d = S3Config::default();
        S3Config {
            bucket: self.bucket.unwrap_or_default(),
            path: path.unwrap_or_default().trim_matches('/').to_string(),
            region: self.region,
            // Litestream: path style when an endpoint is set, unless said otherwise.
            force_path_style: self.force_path_style.unwrap_or(self.endpoint.is_some()),
            endpoint: self.endpoint,
            access_key_id: self.access_key_id,
            secret_access_key: self.secret_access_key,
            part_size: self.part_size.unwrap_or(d.part_size),
            concurrency: self.concurrency.unwrap_or(d.concurrency),
            storage_class: self.storage_class,
            sse_kms_key_id: self.sse_kms_key_id,
            sse_customer_key: self.sse_customer_key,
        }
    }

    /// Fills the keys this replica does not set from the top-level ones (`globals`): the
    /// replica's own value wins. The credentials (`access-key-id` with `secret-access-key`)
    /// and the server-side encryption (`sse-kms-key-id` or `sse-customer-key`) go as pairs:
    /// a replica that sets either key of a pair takes neither from the top level.
    pub(crate) fn with_defaults(mut self, g: &RawS3) -> RawS3 {
        fn or<T: Clone>(own: &mut Option<T>, global: &Option<T>) {
            if own.is_none() {
                own.clone_from(global);
            }
        }
        or(&mut self.bucket, &g.bucket);
        or(&mut self.region, &g.region);
        or(&mut self.endpoint, &g.endpoint);
        or(&mut self.force_path_style, &g.force_path_style);
        or(&mut self.part_size, &g.part_size);
        or(&mut self.concurrency, &g.concurrency);
        or(&mut self.storage_class, &g.storage_class);
        self.inherit_pairs(g);
        self
    }

    /// The pairs of [`RawS3::with_defaults`] (also for `url` replicas).
    pub(crate) fn inherit_pairs(&mut self, g: &RawS3) {
        if self.access_key_id.is_none() && self.secret_access_key.is_none() {
            self.access_key_id.clone_from(&g.access_key_id);
            self.secret_access_key.clone_from(&g.secret_access_key);
        }
        if self.sse_kms_key_id.is_none() && self.sse_customer_key.is_none() {
            self.sse_kms_key_id.clone_from(&g.sse_kms_key_id);
            self.sse_customer_key.clone_from(&g.sse_customer_key);
        }
    }

    /// Adds the secrets given as keys to the settings of an `s3://` URL.
    pub(crate) fn add_secrets(self, cfg: &mut S3Config) {
        cfg.access_key_id = self.access_key_id;
        cfg.secret_access_key = self.secret_access_key;
        cfg.sse_customer_key = self.sse_customer_key;
    }
}

/// A replica's `age` map: `recipients` and `identities`, each a list (or one value) of
/// inline keys and file paths. Files are read here, so a missing or bad one fails the config.
pub(crate) struct AgeSeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) place: &'a str,
}

impl AgeSeed<'_> {
    pub(crate) fn not_a_map<E: de::Error>(&self, found: impl fmt::Display) -> Result<AgeKeys, E> {
        Err(self.ctx.fail(format!(
            "`age` takes a map with the keys `recipients` and `identities` (lists of keys or \
             key files), found {found} {}",
            self.place
        )))
    }

    pub(crate) fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<AgeKeys, E> {
        // Not shown: it may be the identity itself.
        self.not_a_map(s.kind())
    }
}

impl<'de> DeserializeSeed<'de> for AgeSeed<'_> {
    type Value = AgeKeys;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<AgeKeys, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AgeSeed<'_> {
    type Value = AgeKeys;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with `recipients` and `identities`")
    }
    visit_scalars!(scalar);
    fn visit_unit<E: de::Error>(self) -> Result<AgeKeys, E> {
        self.not_a_map("nothing")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<AgeKeys, A::Error> {
        self.not_a_map("a list")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AgeKeys, A::Error> {
        let ctx = self.ctx;
        let place = format!("(key `age` {})", self.place);
        let mut seen = Vec::new();
        let mut recipients = Vec::new();
        let mut identities = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: AGE_KEYS,
            top_only: &[],
            seen: &mut seen,
            place: &place,
        })? {
            let list: Vec<String> = map.next_value_seed(StringListSeed {
                ctx,
                key,
                place: &place,
            })?;
            // Loaded now, so the error points at this key's line.
            let loaded = if key == "recipients" {
                AgeKeys::load(&list, &[])
            } else {
                AgeKeys::load(&[], &list)
            };
            if let Err(e) = loaded {
                return Err(ctx.fail(format!("age.{e} {place}")));
            }
            if key == "recipients" {
                recipients = list;
            } else {
                identities = list;
            }
        }
        if recipients.is_empty() && identities.is_empty() {
            return self.not_a_map("an empty map");
        }
        if !recipients.is_empty() && identities.is_empty() {
            return Err(ctx.fail(format!(
                "`age.recipients` needs `age.identities` too {place}: replicad reads its own \
                 files back (startup position, compaction, snapshots); give the identity file \
                 of one of the recipients"
            )));
        }
        AgeKeys::load(&recipients, &identities).map_err(|e| ctx.fail(format!("age.{e} {place}")))
    }
}

/// A list of strings, or one string (a one-element list).
pub(crate) struct StringListSeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) key: &'static str,
    pub(crate) place: &'a str,
}

impl StringListSeed<'_> {
    pub(crate) fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<String>, E> {
        text(s).map(|v| vec![v]).map_err(|m| {
            self.ctx
                .fail(format!("{m} (key `{}` {})", self.key, self.place))
        })
    }
}

impl<'de> DeserializeSeed<'de> for StringListSeed<'_> {
    type Value = Vec<String>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringListSeed<'_> {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of strings for `{}`", self.key)
    }
    visit_scalars!(scalar);
    fn visit_unit<E: de::Error>(self) -> Result<Vec<String>, E> {
        self.scalar(Scalar::Null)
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Vec<String>, A::Error> {
        Err(self.ctx.fail(format!(
            "expected a list of keys or key files, found a map (key `{}` {})",
            self.key, self.place
        )))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(ValueSeed {
            ctx: self.ctx,
            key: self.key,
            place: self.place,
            convert: &text,
        })? {
            out.push(v);
        }
        Ok(out)
    }
}

/// One replica map.
pub(crate) struct ReplicaSeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) db: usize,
    pub(crate) place: String,
}

impl<'de> DeserializeSeed<'de> for ReplicaSeed<'_> {
    type Value = RawReplica;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawReplica, D::Error> {
        // `any`: a list must reach `visit_seq` for its hint.
        d.deserialize_any(self)
    }
}

impl ReplicaSeed<'_> {
    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<RawReplica, E> {
        // Not shown: a replica URL may hold its password.
        Err(self.ctx.fail(format!(
            "a replica is a map with `url` or `path` (`url: ...`), found {} ({})",
            s.kind(),
            self.place
        )))
    }
}

impl<'de> Visitor<'de> for ReplicaSeed<'_> {
    type Value = RawReplica;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a replica: a map with `url` or `path`")
    }
    visit_scalars!(scalar);
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<RawReplica, A::Error> {
        Err(self.ctx.fail(match self.place.strip_suffix(".replica") {
            Some(db) => format!("`replica` takes one map; use `replicas` for a list ({db})"),
            None => format!(
                "expected a replica map with `url` or `path` ({})",
                self.place
            ),
        }))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawReplica, A::Error> {
        let ctx = self.ctx;
        let place = self.place.as_str();
        let mut seen = Vec::new();
        let mut name = None;
        let mut kind = None;
        let mut path = None;
        let mut url: Option<(ReplicaKind, ParsedUrl)> = None;
        let mut azure = RawAzure::default();
        let mut other = RawOther::default();
        let mut raw_s3 = RawS3::default();
        let mut age = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: REPLICA_KEYS,
            top_only: &[],
            seen: &mut seen,
            place,
        })? {
            let seed = |convert| ValueSeed {
                ctx,
                key,
                place,
                convert,
            };
            match key {
                "name" => name = Some(map.next_value_seed(seed(&text))?),
                "age" => age = Some(Arc::new(map.next_value_seed(AgeSeed { ctx, place })?)),
                "path" => path = Some(map.next_value_seed(seed(&text))?),
                "type" => {
                    kind = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &|s| ReplicaKind::from_type(&text(s)?),
                    })?)
                }
                "url" => {
                    url = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &|s| {
                            let raw = text(s)?;
                            let kind = ReplicaKind::from_url(&raw)?;
                            Ok((kind, kind.parse_url(&raw)?))
                        },
                    })?)
                }
                "account-name" => azure.account_name = Some(map.next_value_seed(seed(&text))?),
                "account-key" | "sas-token" if ctx.skip_credentials => {
                    // A command that never contacts the replica: its secrets need not be set.
                    map.next_value::<de::IgnoredAny>()?;
                }
                "account-key" | "sas-token" => {
                    let v = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &secret,
                    })?;
                    if key == "account-key" {
                        azure.account_key = Some(v);
                    } else {
                        azure.sas_token = Some(v);
                    }
                }
                "password" | "webdav-password" if ctx.skip_credentials => {
                    map.next_value::<de::IgnoredAny>()?;
                }
                "password" | "webdav-password" => {
                    let v = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &secret,
                    })?;
                    if key == "password" {
                        other.password = Some(v);
                    } else {
                        other.webdav_password = Some(v);
                    }
                }
                "concurrent-writes" | "insecure-skip-host-key-check" => {
                    let v = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &boolean,
                    })?;
                    other.flags.push((key, v));
                }
                k if SFTP_KEYS.contains(&k) || WEBDAV_KEYS.contains(&k) => {
                    other.text.push((key, map.next_value_seed(seed(&text))?));
                }
                _ => {
                    if !raw_s3.read(key, &mut map, ctx, place)? {
                        return Err(ctx.fail(format!("internal error: key `{key}` {place}")));
                    }
                }
            }
        }
        let s3_keys: Vec<&str> = seen
            .iter()
            .copied()
            .filter(|k| S3_KEYS.contains(k))
            .collect();
        // The kind: `type`, else the URL's scheme, else file (as Litestream).
        let kind = match (kind, &url) {
            (Some(kind), Some((url_kind, parsed))) if kind != *url_kind => {
                return Err(ctx.fail(format!(
                    "`type: {}` does not match the URL {} {place}",
                    kind.name(),
                    parsed.url
                )));
            }
            (Some(kind), _) => kind,
            (None, Some((url_kind, _))) => *url_kind,
            (None, None) => {
                if let Some(key) = s3_keys.first() {
                    return Err(ctx.fail(format!(
                        "key `{key}` applies only to s3 replicas, not to a file replica \
                         {place} (add `type: s3`, or use an s3:// `url`)"
                    )));
                }
                ReplicaKind::File
            }
        };
        for (keys, owner) in [
            (&AZURE_KEYS[..], ReplicaKind::Abs),
            (&SFTP_KEYS[..], ReplicaKind::Sftp),
            (&WEBDAV_KEYS[..], ReplicaKind::Webdav),
        ] {
            if kind != owner
                && let Some(key) = seen.iter().find(|k| keys.contains(k))
            {
                return Err(ctx.fail(format!(
                    "key `{key}` applies only to {} replicas, not to a {} replica {place}",
                    owner.name(),
                    kind.name()
                )));
            }
        }
        if matches!(kind, ReplicaKind::Sftp | ReplicaKind::Webdav)
            && let Some(key) = s3_keys.first()
        {
            return Err(ctx.fail(format!(
                "key `{key}` applies only to s3 replicas, not to a {} replica {place}",
                kind.name()
            )));
        }
        let (url, s3, object, sftp) = match kind {
            ReplicaKind::Webdav => {
                let mut cfg = match url {
                    Some((
                        _,
                        ParsedUrl {
                            object: Some(cfg), ..
                        },
                    )) => {
                        for k in ["path", "webdav-url"] {
                            if seen.contains(&k) {
                                return Err(ctx.fail(format!(
                                    "keys `url` and `{k}` are mutually exclusive {place}"
                                )));
                            }
                        }
                        cfg
                    }
                    _ => ObjectConfig {
                        endpoint: other
                            .text("webdav-url")
                            .map(|u| u.trim_end_matches('/').into()),
                        ..ObjectConfig::webdav("", path.as_deref().unwrap_or(""))
                    },
                };
                cfg.username = other.text("webdav-username").map(str::to_string);
                cfg.password = other.webdav_password.clone();
                cfg.validate()
                    .map_err(|e| ctx.fail(format!("{e} {place}")))?;
                (cfg.url(), None, Some(cfg), None)
            }
            ReplicaKind::Sftp => {
                let cfg = other
                    .sftp(url.and_then(|(_, p)| p.sftp), path.as_deref(), &seen)
                    .map_err(|e| ctx.fail(format!("{e} {place}")))?;
                (cfg.url(), None, None, Some(cfg))
            }
            ReplicaKind::Gs | ReplicaKind::Abs => {
                if let Some(key) = s3_keys.iter().find(|k| !OBJECT_SHARED_KEYS.contains(k)) {
                    return Err(ctx.fail(format!(
                        "key `{key}` applies only to s3 replicas, not to a {} replica {place}",
                        kind.name()
                    )));
                }
                let mut cfg = match url {
                    Some((
                        _,
                        ParsedUrl {
                            object: Some(cfg), ..
                        },
                    )) => {
                        for other in ["path", "bucket", "endpoint", "account-name"] {
                            if seen.contains(&other) {
                                return Err(ctx.fail(format!(
                                    "keys `url` and `{other}` are mutually exclusive {place}"
                                )));
                            }
                        }
                        cfg
                    }
                    _ => {
                        let service = if kind == ReplicaKind::Gs {
                            Service::Gcs
                        } else {
                            Service::Azure
                        };
                        let Some(bucket) = raw_s3.bucket.clone() else {
                            return Err(ctx.fail(format!(
                                "missing key `bucket` {place} (a {} replica takes `bucket`{} and \
                                 an optional key prefix `path`, or a `url`)",
                                kind.name(),
                                if kind == ReplicaKind::Abs {
                                    " (the container), `account-name`"
                                } else {
                                    ""
                                }
                            )));
                        };
                        let mut c =
                            ObjectConfig::new(service, &bucket, path.as_deref().unwrap_or(""));
                        c.endpoint = raw_s3.endpoint.clone();
                        c.account_name = azure.account_name.clone();
                        c
                    }
                };
                cfg.account_key = azure.account_key.clone();
                cfg.sas_token = azure.sas_token.clone();
                cfg.validate()
                    .map_err(|e| ctx.fail(format!("{e} {place}")))?;
                (cfg.url(), None, Some(cfg), None)
            }
            ReplicaKind::File => {
                if let Some(key) = s3_keys.first() {
                    return Err(ctx.fail(format!(
                        "key `{key}` applies only to s3 replicas, not to a file replica {place}"
                    )));
                }
                match (url, path) {
                    (Some(_), Some(_)) => {
                        return Err(ctx.fail(format!(
                            "keys `url` and `path` are mutually exclusive {place}"
                        )));
                    }
                    (None, None) => {
                        return Err(ctx.fail(format!("missing key `url` or `path` {place}")));
                    }
                    (Some((_, parsed)), None) => (parsed.url, None, None, None),
                    (None, Some(path)) => {
                        let url = file_url_from_path(&path)
                            .map_err(|e| ctx.fail(format!("{e} (key `path` {place})")))?;
                        (url, None, None, None)
                    }
                }
            }
            ReplicaKind::S3 => {
                let cfg = match url {
                    Some((_, ParsedUrl { s3: url_cfg, .. })) => {
                        // As Litestream: the URL names the bucket and the prefix.
                        for other in ["path", "bucket"] {
                            if seen.contains(&other) {
                                return Err(ctx.fail(format!(
                                    "keys `url` and `{other}` are mutually exclusive {place}"
                                )));
                            }
                        }
                        if let Some(key) = s3_keys.iter().find(|k| !S3_KEYS_WITH_URL.contains(k)) {
                            return Err(ctx.fail(format!(
                                "key `{key}` cannot be combined with `url` {place}: put it in \
                                 the URL's query (s3://BUCKET/PATH?{key}=...), or replace \
                                 `url` with the keys `bucket` and `path`"
                            )));
                        }
                        let mut cfg = url_cfg.unwrap_or_default();
                        // The URL holds the replica's own settings; of the global defaults
                        // only the credentials and the encryption (pairs) apply.
                        let mut own = raw_s3;
                        own.sse_kms_key_id.clone_from(&cfg.sse_kms_key_id);
                        own.inherit_pairs(&ctx.s3_defaults);
                        cfg.sse_kms_key_id.clone_from(&own.sse_kms_key_id);
                        own.add_secrets(&mut cfg);
                        cfg
                    }
                    None => {
                        let raw_s3 = raw_s3.with_defaults(&ctx.s3_defaults);
                        if raw_s3.bucket.is_none() {
                            return Err(ctx.fail(format!(
                                "missing key `bucket` {place} (an s3 replica takes `bucket` \
                                 and an optional key prefix `path`, or `url: \
                                 s3://BUCKET/PATH`; a top-level `bucket` is the default)"
                            )));
                        }
                        raw_s3.into_config(path.as_deref())
                    }
                };
                cfg.validate()
                    .map_err(|e| ctx.fail(format!("{e} {place}")))?;
                if cfg.sse_kms_key_id.is_some() && cfg.sse_customer_key.is_some() {
                    return Err(ctx.fail(format!(
                        "keys `sse-kms-key-id` and `sse-customer-key` are mutually exclusive \
                         {place} (S3 accepts one server-side encryption per object)"
                    )));
                }
                (s3_url(&cfg), Some(cfg), None, None)
            }
        };
        let dest = Destination::of(&url, s3.as_ref());
        let mut dests = ctx.replica_dests.borrow_mut();
        if let Some((_, other)) = dests.iter().find(|(d, _)| *d == dest) {
            return Err(ctx.fail(if *other == self.db {
                format!(
                    "{dest} is used twice by {} ({place})",
                    ctx.db_label(self.db)
                )
            } else {
                format!(
                    "{dest} is used by two databases: {} and {} ({place})",
                    ctx.db_label(*other),
                    ctx.db_label(self.db)
                )
            }));
        }
        dests.push((dest, self.db));
        Ok(RawReplica {
            name,
            kind,
            url,
            s3,
            object,
            sftp,
            age,
        })
    }
}

/// The Azure keys of one replica map, as read.
#[derive(Default)]
struct RawAzure {
    account_name: Option<String>,
    account_key: Option<Secret>,
    sas_token: Option<Secret>,
}
