//! The YAML reader: the key lists, the parsing context that carries line numbers, and the
//! scalar parsers every section shares.
//!
//! Hand-written `serde` visitors rather than derived structs, because an error raised inside
//! a visitor carries the line of the node being read: unknown and duplicate keys are reported
//! at the key's line, bad values at the value's line, and rules involving several keys at the
//! line where the map starts.

/// Visitor methods for every scalar, each returning `self.$method(Scalar::...)`.
macro_rules! visit_scalars {
    ($method:ident) => {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            self.$method(Scalar::Str(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            self.$method(Scalar::Int(v.into()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            self.$method(Scalar::Int(v.into()))
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<Self::Value, E> {
            self.$method(Scalar::Int(v))
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<Self::Value, E> {
            match i128::try_from(v) {
                Ok(i) => self.$method(Scalar::Int(i)),
                Err(_) => Err(E::custom(format!("{v} is out of range"))),
            }
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.$method(Scalar::Float(v))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            self.$method(Scalar::Bool(v))
        }
    };
}

/// A map of scalars of one kind under a top-level key (`snapshot`, `retention`) or in a list
/// (one entry of `levels`): its keys, in file order, with their converted values.
pub(crate) struct SectionSeed<'a, T> {
    pub(crate) ctx: &'a Ctx,
    /// How errors name the map: `snapshot`, `levels[0]`.
    pub(crate) name: String,
    pub(crate) keys: &'static [&'static str],
    /// Whether every key is required; else absent keys keep their defaults and an empty value
    /// (every key commented out) means all defaults.
    pub(crate) required: bool,
    /// Converts the value of a key (the key decides the kind when a map mixes kinds).
    pub(crate) convert: &'a dyn Fn(&str, Scalar<'_>) -> Result<T, String>,
    /// Added to the error when the value is not a map.
    pub(crate) hint: &'static str,
    /// Refuse the value, whatever it is, with this message (a level beyond the last).
    pub(crate) refuse: Option<String>,
}

impl<T> SectionSeed<'_, T> {
    /// The refusal, if any.
    pub(crate) fn check<E: de::Error>(&self) -> Result<(), E> {
        match &self.refuse {
            Some(message) => Err(self.ctx.fail(message.clone())),
            None => Ok(()),
        }
    }

    pub(crate) fn not_a_map<E: de::Error>(
        &self,
        found: impl fmt::Display,
    ) -> Result<Vec<(&'static str, T)>, E> {
        self.check()?;
        let keys: Vec<String> = self.keys.iter().map(|k| format!("`{k}`")).collect();
        let plural = if keys.len() == 1 { "key" } else { "keys" };
        Err(self.ctx.fail(format!(
            "`{}` takes a map with the {plural} {}, found {found}{}",
            self.name,
            keys.join(", "),
            self.hint
        )))
    }

    pub(crate) fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<(&'static str, T)>, E> {
        self.not_a_map(s)
    }

    pub(crate) fn missing<E: de::Error>(&self, seen: &[&str]) -> Result<(), E> {
        if !self.required {
            return Ok(());
        }
        match self.keys.iter().find(|k| !seen.contains(k)) {
            Some(key) => Err(self
                .ctx
                .fail(format!("missing key `{key}` in {}", self.name))),
            None => Ok(()),
        }
    }
}

impl<'de, T> DeserializeSeed<'de> for SectionSeed<'_, T> {
    type Value = Vec<(&'static str, T)>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        // `any`: a list or a scalar must reach its `visit_` method for a clear error.
        d.deserialize_any(self)
    }
}

impl<'de, T> Visitor<'de> for SectionSeed<'_, T> {
    type Value = Vec<(&'static str, T)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a map for `{}`", self.name)
    }
    visit_scalars!(scalar);
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.check()?;
        self.missing(&[])?;
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        self.not_a_map("a list")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        self.check()?;
        let ctx = self.ctx;
        let place = format!("in {}", self.name);
        let place = place.as_str();
        let mut seen = Vec::new();
        let mut values = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: self.keys,
            top_only: &[],
            seen: &mut seen,
            place,
        })? {
            let convert = |s: Scalar<'_>| (self.convert)(key, s);
            let value = map.next_value_seed(ValueSeed {
                ctx,
                key,
                place,
                convert: &convert,
            })?;
            values.push((key, value));
        }
        self.missing(&seen)?;
        Ok(values)
    }
}

pub(crate) mod dbs;
pub(crate) mod notify;
pub(crate) mod remote;
pub(crate) mod replica;
pub(crate) mod root;
pub(crate) mod settings;

use crate::config::url::Destination;
use crate::config::yaml::replica::RawS3;
use crate::config::yaml::root::{GlobalsSeed, RootSeed};
#[allow(unused_imports)]
use crate::config::*;

// ---------------------------------------------------------------------------------------------
// YAML reading.

/// The key lists `parts` one after the other; `N` must be their total length (checked when
/// compiling), so that a key added to a part is in every list made of it.
const fn join<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut p) = (0, 0);
    while p < parts.len() {
        let mut k = 0;
        while k < parts[p].len() {
            out[i] = parts[p][k];
            (i, k) = (i + 1, k + 1);
        }
        p += 1;
    }
    assert!(i == N, "N is not the total length of the parts");
    out
}

pub(crate) const SETTING_KEYS: [&str; 14] = [
    "monitor-interval",
    "checkpoint-interval",
    "min-checkpoint-page-count",
    "truncate-page-n",
    "full-verify-interval",
    "compression",
    "heartbeat-interval",
    "verify-interval",
    "verify-recheck-interval",
    "replica-check-interval",
    "lease-ttl",
    "dormant-after",
    "dormant-max-size",
    "min-sync-interval",
];
/// Keys of the top level that are errors in a database map ("top-level only").
pub(crate) const TOP_ONLY_KEYS: [&str; 13] = [
    "shutdown-sync-timeout",
    "levels",
    "snapshot",
    "l0-retention",
    "l0-retention-check-interval",
    "retention",
    "addr",
    "max-lag",
    "exec",
    "logging",
    "socket",
    "notify",
    "heartbeat-url",
];
/// Keys of the top level.
pub(crate) const ROOT_KEYS: &[&str] =
    &join::<{ 1 + TOP_ONLY_KEYS.len() + SETTING_KEYS.len() + S3_KEYS.len() }>(&[
        &["dbs"],
        &TOP_ONLY_KEYS,
        &SETTING_KEYS,
        // Defaults for every S3 replica.
        &S3_KEYS,
    ]);
/// Keys of a `dbs` entry: every setting may be given per database.
pub(crate) const DB_KEYS: &[&str] =
    &join::<{ DB_OWN_KEYS.len() + SETTING_KEYS.len() }>(&[&DB_OWN_KEYS, &SETTING_KEYS]);
/// Keys of a `dbs` entry that are not settings.
const DB_OWN_KEYS: [&str; 8] = [
    "path",
    "dir",
    "pattern",
    "recursive",
    "watch",
    "meta-path",
    "replica",
    "replicas",
];
/// Keys of one `levels` entry.
pub(crate) const LEVEL_KEYS: &[&str] = &["interval"];
/// Keys of the `snapshot` map.
pub(crate) const SNAPSHOT_KEYS: &[&str] = &["interval", "retention"];
/// Keys of the `retention` map.
pub(crate) const RETENTION_KEYS: &[&str] =
    &["enabled", "window", "hourly", "daily", "weekly", "monthly"];
/// Keys of a replica's `age` map.
pub(crate) const AGE_KEYS: &[&str] = &["recipients", "identities"];
/// Keys of the `logging` map.
pub(crate) const LOGGING_KEYS: &[&str] = &["level", "type", "stderr"];
/// Keys of a replica.
pub(crate) const REPLICA_KEYS: &[&str] =
    &join::<{ 5 + S3_KEYS.len() + AZURE_KEYS.len() + SFTP_KEYS.len() + WEBDAV_KEYS.len() }>(&[
        &["name", "age", "type", "path", "url"],
        &S3_KEYS,
        &AZURE_KEYS,
        &SFTP_KEYS,
        &WEBDAV_KEYS,
    ]);
/// Replica keys of SFTP replicas only (Litestream's names, then replicad's two for the host
/// key check).
pub(crate) const SFTP_KEYS: [&str; 8] = [
    "host",
    "user",
    "password",
    "key-path",
    "host-key",
    "concurrent-writes",
    "known-hosts-path",
    "insecure-skip-host-key-check",
];
/// Replica keys of WebDAV replicas only (Litestream's names).
pub(crate) const WEBDAV_KEYS: [&str; 3] = ["webdav-url", "webdav-username", "webdav-password"];
/// Replica keys of Azure Blob Storage replicas only (Litestream's names).
pub(crate) const AZURE_KEYS: [&str; 3] = ["account-name", "account-key", "sas-token"];
/// The S3 keys a gs or abs replica takes too.
pub(crate) const OBJECT_SHARED_KEYS: [&str; 2] = ["bucket", "endpoint"];
/// Replica keys of S3 replicas only.
pub(crate) const S3_KEYS: [&str; 12] = [
    "bucket",
    "region",
    "endpoint",
    "force-path-style",
    "access-key-id",
    "secret-access-key",
    "part-size",
    "concurrency",
    "storage-class",
    "sse-kms-key-id",
    "sse-customer-key",
    "skip-verify",
];
/// S3 keys that may be added to an `s3://` `url`: the secrets, which never go in a URL, and
/// `skip-verify` (only `false` is accepted, so it cannot conflict with the URL).
pub(crate) const S3_KEYS_WITH_URL: [&str; 4] = [
    "access-key-id",
    "secret-access-key",
    "sse-customer-key",
    "skip-verify",
];
/// S3's maximum size of one part of a multipart upload.
pub(crate) const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;

/// State shared by the visitors of one parse.
#[derive(Default)]
pub(crate) struct Ctx {
    /// The message of the last error raised by a visitor (serde_norway adds a path and a
    /// location to it; the rendered error uses this text and the location).
    pub(crate) last_error: RefCell<Option<String>>,
    /// `path` of each database seen so far (`None` until its `path` key is read).
    pub(crate) db_paths: RefCell<Vec<Option<PathBuf>>>,
    /// `meta-path`s seen so far, with their database index.
    pub(crate) meta_paths: RefCell<Vec<(PathBuf, usize)>>,
    /// Replica destinations seen so far, with their database index.
    pub(crate) replica_dests: RefCell<Vec<(Destination, usize)>>,
    /// The top-level S3 keys (global replica defaults), read by a first pass over the file
    /// so that they are known whatever their position relative to `dbs`.
    pub(crate) s3_defaults: RawS3,
    /// Credential keys are skipped, not read ([`Config::load_without_credentials`]).
    pub(crate) skip_credentials: bool,
}

impl Ctx {
    /// An error raised by a visitor; remembered so the rendered error can drop serde's prefix.
    pub(crate) fn fail<E: de::Error>(&self, message: String) -> E {
        let e = E::custom(&message);
        *self.last_error.borrow_mut() = Some(message);
        e
    }

    /// `dbs[i] (/path)`, or `dbs[i]` while its path is unknown.
    pub(crate) fn db_label(&self, index: usize) -> String {
        match self.db_paths.borrow().get(index) {
            Some(Some(p)) => format!("dbs[{index}] ({})", p.display()),
            _ => format!("dbs[{index}]"),
        }
    }

    /// Turns a serde_norway error into a [`ConfigError`] with the line of the node.
    pub(crate) fn into_error(self, origin: &str, e: &serde_norway::Error) -> ConfigError {
        let line = e.location().map(|l| l.line());
        let rendered = e.to_string();
        let message = match self.last_error.into_inner() {
            Some(mine) if rendered.contains(&mine) => mine,
            _ => without_quoted_strings(&match e.location() {
                Some(l) => rendered.replacen(
                    &format!(" at line {} column {}", l.line(), l.column()),
                    "",
                    1,
                ),
                None => rendered,
            }),
        };
        ConfigError::Invalid {
            origin: origin.to_string(),
            line,
            message,
        }
    }
}

pub(crate) fn parse_yaml(text: &str, origin: &str) -> Result<Config, ConfigError> {
    parse_yaml_with(text, origin, false)
}

/// [`parse_yaml`]; with `skip_credentials`, the replicas' credential keys are not read.
pub(crate) fn parse_yaml_with(
    text: &str,
    origin: &str,
    skip_credentials: bool,
) -> Result<Config, ConfigError> {
    // First pass: the global replica defaults only. An error raised on one of those keys is
    // reported as it is; any other problem is left to the second pass, which reports it with
    // its key and line.
    let first = Ctx {
        skip_credentials,
        ..Ctx::default()
    };
    let globals = GlobalsSeed { ctx: &first };
    let s3_defaults = match globals.deserialize(serde_norway::Deserializer::from_str(text)) {
        Ok(globals) => globals,
        Err(e) if first.last_error.borrow().is_some() => {
            return Err(first.into_error(origin, &e));
        }
        Err(_) => RawS3::default(),
    };
    let ctx = Ctx {
        s3_defaults,
        skip_credentials,
        ..Ctx::default()
    };
    let result = RootSeed { ctx: &ctx }.deserialize(serde_norway::Deserializer::from_str(text));
    result.map_err(|e| ctx.into_error(origin, &e))
}

/// A YAML scalar, as a value visitor sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar<'s> {
    Str(&'s str),
    Int(i128),
    Float(f64),
    Bool(bool),
    Null,
}

impl fmt::Display for Scalar<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Str(s) => write!(f, "{s:?}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Null => f.write_str("null"),
        }
    }
}

impl Scalar<'_> {
    /// What kind of value it is, for a message that must not show it (a URL with a password,
    /// a key).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Scalar::Str(_) => "a string",
            Scalar::Int(_) | Scalar::Float(_) => "a number",
            Scalar::Bool(_) => "a boolean",
            Scalar::Null => "nothing",
        }
    }
}

/// serde's own message with the strings it quotes (`invalid type: string "s3://KEY:..."`)
/// left out: a value where a map was expected may be a replica URL with its password, or a
/// key.
fn without_quoted_strings(rendered: &str) -> String {
    let mut out = String::with_capacity(rendered.len());
    let mut rest = rendered;
    while let Some(at) = rest.find("string \"") {
        out.push_str(&rest[..at]);
        out.push_str("a string");
        let quoted = &rest[at + "string \"".len()..];
        // The closing quote: the first one no backslash escapes.
        let mut escaped = false;
        let end = quoted.char_indices().find_map(|(i, c)| match c {
            '\\' if !escaped => {
                escaped = true;
                None
            }
            '"' if !escaped => Some(i + 1),
            _ => {
                escaped = false;
                None
            }
        });
        rest = end.map_or("", |e| &quoted[e..]);
    }
    out.push_str(rest);
    out
}

/// A non-empty string (integers are taken as their digits, e.g. `name: 2`).
pub(crate) fn text(s: Scalar<'_>) -> Result<String, String> {
    match s {
        Scalar::Str("") | Scalar::Null => Err("the value is empty".into()),
        Scalar::Str(v) => Ok(v.to_string()),
        Scalar::Int(i) => Ok(i.to_string()),
        other => Err(format!("expected a string, found {other} (quote it)")),
    }
}

pub(crate) fn duration(s: Scalar<'_>) -> Result<Duration, String> {
    const SYNTAX: &str =
        "use Go duration syntax such as 500ms, 10s, 1m, 24h or 1h30m (and d or w: 7d, 2w)";
    match s {
        Scalar::Str(v) => super::parse_duration(v.trim()).map_err(|e| match e {
            super::DurationError::TooLong => format!("duration {v:?} is {e}"),
            super::DurationError::Syntax(_) => format!("invalid duration {v:?} ({e}): {SYNTAX}"),
        }),
        Scalar::Int(_) | Scalar::Float(_) => Err(format!(
            "{s} is a bare number: add a unit, e.g. `{s}s` ({SYNTAX})"
        )),
        Scalar::Null => Err(format!("the value is empty: {SYNTAX}")),
        Scalar::Bool(_) => Err(format!("expected a duration, found {s}: {SYNTAX}")),
    }
}

/// `addr`: `[HOST]:PORT` or `PORT`; no host means 127.0.0.1 (see the module rules); empty
/// means off.
pub(crate) fn listen_addr(s: Scalar<'_>) -> Result<Option<std::net::SocketAddr>, String> {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    const SYNTAX: &str = "use HOST:PORT or PORT, e.g. \":9090\" (127.0.0.1) or \"0.0.0.0:9090\"";
    let v = match s {
        Scalar::Null | Scalar::Str("") => return Ok(None),
        Scalar::Str(v) => v.trim().to_string(),
        Scalar::Int(i) => i.to_string(),
        other => return Err(format!("expected an address, found {other}: {SYNTAX}")),
    };
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("invalid port in address {v:?}: {SYNTAX}"))
    };
    if let Some(p) = v.strip_prefix(':') {
        return Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            port(p)?,
        )));
    }
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            port(&v)?,
        )));
    }
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    match v.rsplit_once(':') {
        Some(("localhost", p)) => Ok(Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            port(p)?,
        ))),
        Some((host, p)) => {
            port(p)?;
            Err(format!(
                "host {host:?} in address {v:?} is not an IP address or `localhost`: {SYNTAX}"
            ))
        }
        None => Err(format!("invalid address {v:?}: {SYNTAX}")),
    }
}

pub(crate) fn positive_duration(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

pub(crate) fn lease_ttl(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < MIN_LEASE_TTL {
        return Err("must be at least 1s".into());
    }
    Ok(d)
}

pub(crate) fn count(s: Scalar<'_>) -> Result<u32, String> {
    match s {
        Scalar::Int(i) => {
            u32::try_from(i).map_err(|_| format!("{i} is out of range (0..={})", u32::MAX))
        }
        other => Err(format!("expected a whole number, found {other}")),
    }
}

pub(crate) fn boolean(s: Scalar<'_>) -> Result<bool, String> {
    match s {
        Scalar::Bool(b) => Ok(b),
        other => Err(format!("expected true or false, found {other}")),
    }
}

/// A secret: a non-empty string, never echoed in errors. A number is refused rather than
/// converted, since YAML may have changed its spelling (`0x1F`, `+1`, `1e3`).
pub(crate) fn secret(s: Scalar<'_>) -> Result<Secret, String> {
    match s {
        Scalar::Str("") | Scalar::Null => Err("the value is empty".into()),
        Scalar::Str(v) => Ok(Secret(v.to_string())),
        _ => Err("the value is not a string: quote it (the value is not shown)".into()),
    }
}

pub(crate) fn bucket(s: Scalar<'_>) -> Result<String, String> {
    let b = text(s)?;
    if b.contains('/') {
        return Err(format!(
            "bucket {b:?} contains `/`: give the key prefix in `path`"
        ));
    }
    crate::storage::s3::check_bucket_name(&b)?;
    Ok(b)
}

/// A size in bytes from an integer, or why it is not one.
fn bytes_of(i: i128) -> Result<u64, String> {
    if i < 0 {
        return Err(format!("{i} is not a size in bytes"));
    }
    u64::try_from(i).map_err(|_| format!("{i} is out of range (at most {} bytes)", u64::MAX))
}

/// Bytes, as an integer or with a unit (`64MiB`).
pub(crate) fn byte_size(s: Scalar<'_>) -> Result<u64, String> {
    match s {
        Scalar::Str(v) => parse_size(v),
        Scalar::Int(i) => bytes_of(i),
        other => Err(format!(
            "expected a size in bytes such as 64MiB or 67108864, found {other}"
        )),
    }
}

/// `part-size`: bytes, as an integer or with a unit (`10MiB`), within S3's part size limits.
pub(crate) fn part_size(s: Scalar<'_>) -> Result<u64, String> {
    let n = match s {
        Scalar::Str(v) => parse_size(v)?,
        Scalar::Int(i) => bytes_of(i)?,
        other => {
            return Err(format!(
                "expected a size in bytes such as 10MiB or 10485760, found {other}"
            ));
        }
    };
    if n < DEFAULT_PART_SIZE {
        return Err(format!(
            "part size {n} bytes is below S3's minimum of 5 MiB ({DEFAULT_PART_SIZE} bytes)"
        ));
    }
    if n > MAX_PART_SIZE {
        return Err(format!(
            "part size {n} bytes is above S3's maximum of 5 GiB ({MAX_PART_SIZE} bytes)"
        ));
    }
    Ok(n)
}

pub(crate) fn concurrency(s: Scalar<'_>) -> Result<usize, String> {
    match s {
        Scalar::Int(i) if i >= 1 => usize::try_from(i).map_err(|_| format!("{i} is out of range")),
        Scalar::Int(i) => Err(format!("{i}: must be at least 1")),
        other => Err(format!("expected a whole number, found {other}")),
    }
}

pub(crate) fn skip_verify(s: Scalar<'_>) -> Result<(), String> {
    reject_skip_verify(boolean(s)?)
}

pub(crate) fn codec(s: Scalar<'_>) -> Result<Codec, String> {
    match s {
        Scalar::Str(v) => v.parse(),
        other => Err(format!(
            "expected lz4, zstd[:1-19], gzip[:0-9] or none, found {other}"
        )),
    }
}

/// Reads one scalar value and converts it inside the visitor, so errors carry its line.
pub(crate) struct ValueSeed<'a, T> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) key: &'static str,
    /// `in dbs[0]`, `at the top level`, ...
    pub(crate) place: &'a str,
    pub(crate) convert: &'a dyn Fn(Scalar<'_>) -> Result<T, String>,
}

impl<'a, T> ValueSeed<'a, T> {
    /// The seed of `key` (read `place`), converted by `convert`.
    pub(crate) fn new(
        ctx: &'a Ctx,
        key: &'static str,
        place: &'a str,
        convert: &'a dyn Fn(Scalar<'_>) -> Result<T, String>,
    ) -> ValueSeed<'a, T> {
        ValueSeed {
            ctx,
            key,
            place,
            convert,
        }
    }

    pub(crate) fn finish<E: de::Error>(self, s: Scalar<'_>) -> Result<T, E> {
        (self.convert)(s).map_err(|m| {
            self.ctx
                .fail(format!("{m} (key `{}` {})", self.key, self.place))
        })
    }
}

impl<'de, T> DeserializeSeed<'de> for ValueSeed<'_, T> {
    type Value = T;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T> Visitor<'de> for ValueSeed<'_, T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a single value for `{}`", self.key)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        self.finish(Scalar::Str(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        self.finish(Scalar::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        self.finish(Scalar::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<T, E> {
        self.finish(Scalar::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<T, E> {
        match i128::try_from(v) {
            Ok(i) => self.finish(Scalar::Int(i)),
            Err(_) => Err(self.ctx.fail(format!(
                "{v} is out of range (key `{}` {})",
                self.key, self.place
            ))),
        }
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        self.finish(Scalar::Float(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
        self.finish(Scalar::Bool(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        self.finish(Scalar::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        self.finish(Scalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        Err(self.ctx.fail(format!(
            "expected a single value, found a list (key `{}` {})",
            self.key, self.place
        )))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        Err(self.ctx.fail(format!(
            "expected a single value, found a map (key `{}` {})",
            self.key, self.place
        )))
    }
}

/// Reads a map key: must be one of `allowed` and not seen before in the same map.
pub(crate) struct KeySeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) allowed: &'static [&'static str],
    /// Keys refused with "top-level only" rather than "unknown" (in database maps).
    pub(crate) top_only: &'static [&'static str],
    pub(crate) seen: &'a mut Vec<&'static str>,
    pub(crate) place: &'a str,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = &'static str;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<&'static str, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = &'static str;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<&'static str, E> {
        let Some(key) = self.allowed.iter().copied().find(|k| *k == v) else {
            if self.top_only.contains(&v) {
                return Err(self.ctx.fail(format!(
                    "key `{v}` {} is top-level only, as in Litestream (one value for every \
                     database): move it to the top level of the file",
                    self.place
                )));
            }
            let expected: Vec<String> = self.allowed.iter().map(|k| format!("`{k}`")).collect();
            return Err(self.ctx.fail(format!(
                "unknown key `{v}` {} (expected one of {})",
                self.place,
                expected.join(", ")
            )));
        };
        if self.seen.contains(&key) {
            return Err(self
                .ctx
                .fail(format!("duplicate key `{key}` {}", self.place)));
        }
        self.seen.push(key);
        Ok(key)
    }
}
