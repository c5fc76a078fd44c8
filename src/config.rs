//! The configuration file: which databases to replicate, where to, and how.
//!
//! The file is YAML with the layout and key names of Litestream v0.5 (a subset of them):
//!
//! ```yaml
//! # Global settings: the defaults for every database below.
//! monitor-interval: 1s
//! compression: zstd:3
//! shutdown-sync-timeout: 30s
//!
//! dbs:
//!   - path: /var/lib/app/app.db
//!     checkpoint-interval: 5m          # overrides the global value for this database
//!     replicas:
//!       - url: file:///backup/app      # or `path: /backup/app` (with optional `type: file`)
//!   - path: /var/lib/app/audit.db
//!     replica:                         # one replica: a map instead of a list
//!       path: /backup/audit
//! ```
//!
//! `config/replicad.yml` in the repository lists every key with its default and unit.
//!
//! Rules:
//!
//! - **Unknown keys are errors that name the key and its line — never silently ignored.** A
//!   misspelt `checkpoint-intreval` must not quietly leave the default in force; the same goes
//!   for Litestream keys replicad does not implement (`retention`, `sync-interval`, S3
//!   credentials, ...). Duplicate keys are errors too.
//! - Every error names the file, the key and the line when they are known:
//!   `config /etc/replicad.yml: line 7: unknown key `retention-foo` in dbs[0] (...)`.
//! - Setting keys (`monitor-interval`, `checkpoint-interval`, `min-checkpoint-page-count`,
//!   `truncate-page-n`, `full-verify-interval`, `compression`, `heartbeat-interval`) may appear
//!   at the top level and in each database; the effective value is the database's key, else the
//!   top-level key, else the default ([`DbSettings::default`]).
//! - Durations use Go syntax, as Litestream: `500ms`, `10s`, `1m`, `24h`, `1h30m`. A bare
//!   number (`10`) is an error asking for a unit.
//! - Paths (`path`, `meta-path`, a replica's `path` or plain-path `url`) are made absolute
//!   against the current directory (not the config file's directory), with `~` expanded to
//!   `$HOME` as Litestream does, and normalised lexically ([`std::path::absolute`], then `.`
//!   components and duplicate or trailing slashes removed; `..` is kept because resolving it
//!   without the file system is wrong across symbolic links).
//! - `$VAR` and `${VAR}` are replaced by the environment variable before parsing (unset
//!   variables become the empty string, as Litestream), unless expansion is turned off. A `$`
//!   not followed by a name is kept as it is.
//! - Every database needs at least one replica; no two databases may share a path, and no two
//!   replicas (in any database) may share a destination.
//!
//! Replica types: only `file` exists so far; `type: s3` or an `s3://` URL is rejected with a
//! clear error. A new type is a new arm of [`ReplicaKind`] plus its keys in the replica map.
//!
//! Implementation note: the file is read with `serde_norway` through hand-written visitors
//! rather than derived structs, because an error raised inside a visitor carries the line of
//! the YAML node being read: unknown and duplicate keys are reported at the key's line, bad
//! values at the value's line, and rules that involve several keys (such as `url` vs `path`)
//! at the line where the map starts.

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use crate::ltx::Codec;
use crate::replica_client::AnyClient;

/// Default of `shutdown-sync-timeout`.
pub const DEFAULT_SHUTDOWN_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `truncate-page-n` (Litestream's): the WAL size in pages above which a checkpoint
/// truncates the WAL.
pub const DEFAULT_TRUNCATE_PAGE_N: u32 = 121_359;

/// Origin used in errors from [`Config::single`].
const COMMAND_LINE: &str = "command line";

/// The whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The databases to replicate, in file order (never empty).
    pub dbs: Vec<DbConfig>,
    /// Key `shutdown-sync-timeout` (top level only, default 30s): how long a shutdown waits
    /// for the last changes to reach the replicas. `0s` means do not wait.
    pub shutdown_sync_timeout: Duration,
}

/// One database and its replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct DbConfig {
    /// Key `path` (required): the database file, absolute (see the module rules on paths).
    pub path: PathBuf,
    /// Key `meta-path`: where replication state is kept; `None` means the default location
    /// next to the database. Absolute when set.
    pub meta_path: Option<PathBuf>,
    /// Keys `replica` (one map) or `replicas` (a list), exactly one of them: never empty.
    pub replicas: Vec<ReplicaConfig>,
    /// Effective settings: this database's keys, else the top-level keys, else the defaults.
    pub settings: DbSettings,
}

/// Per-database settings (effective values).
#[derive(Clone, Debug, PartialEq)]
pub struct DbSettings {
    /// Key `monitor-interval` (default 1s, must be > 0): how often the WAL is checked for new
    /// frames.
    pub monitor_interval: Duration,
    /// Key `checkpoint-interval` (default 1m): time-based PASSIVE checkpoints; `0s` disables
    /// them (page-count checkpoints still happen).
    pub checkpoint_interval: Duration,
    /// Key `min-checkpoint-page-count` (default 1000 pages): WAL size that triggers a PASSIVE
    /// checkpoint.
    pub min_checkpoint_page_count: u32,
    /// Key `truncate-page-n` (default 121359 pages): WAL size that triggers a TRUNCATE
    /// checkpoint. `0` in the file means "not set" (falls back to the top level, then to the
    /// default), as in Litestream; the value here is never 0.
    pub truncate_page_n: u32,
    /// Key `full-verify-interval` (default 60s, must be > 0): how often the local state is
    /// fully verified against the database.
    pub full_verify_interval: Duration,
    /// Key `compression` (default `zstd:3`): page codec for new LTX files; one of `lz4`,
    /// `zstd`, `zstd:N` (1-19), `gzip`, `gzip:N` (0-9), `none`.
    pub compression: Codec,
    /// Key `heartbeat-interval` (default 60s, must be > 0): idle heartbeat of upload tasks.
    pub heartbeat_interval: Duration,
}

impl Default for DbSettings {
    fn default() -> Self {
        DbSettings {
            monitor_interval: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(60),
            min_checkpoint_page_count: 1000,
            truncate_page_n: DEFAULT_TRUNCATE_PAGE_N,
            full_verify_interval: Duration::from_secs(60),
            compression: Codec::Zstd(crate::ltx::codec::DEFAULT_ZSTD_LEVEL),
            heartbeat_interval: Duration::from_secs(60),
        }
    }
}

impl DbSettings {
    /// Checks the rules the file parser checks per key (used for settings built in code).
    fn validate(&mut self) -> Result<(), String> {
        for (key, value) in [
            ("monitor-interval", self.monitor_interval),
            ("full-verify-interval", self.full_verify_interval),
            ("heartbeat-interval", self.heartbeat_interval),
        ] {
            if value.is_zero() {
                return Err(format!("{key} must be greater than zero"));
            }
        }
        if self.truncate_page_n == 0 {
            self.truncate_page_n = DEFAULT_TRUNCATE_PAGE_N;
        }
        Ok(())
    }
}

/// One replica of a database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Key `name`: unique within the database. Default: the type (`file`) for the first
    /// replica, `<type>-N` for the replica at position N (1-based) after that.
    pub name: String,
    /// Normalised replica URL, accepted by [`AnyClient::from_url`]: for files always
    /// `file:///absolute/path`, whether given as `url` (`file://` or a plain path) or as
    /// `path` (with optional `type: file`).
    pub url: String,
}

/// The kind of a replica: decides which keys and URL schemes are valid.
///
/// Adding a destination (S3 next) means a new arm here and in each `match` on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaKind {
    /// A local directory (`type: file`, `file://` URL or plain path).
    File,
}

impl ReplicaKind {
    /// The `type` value, also the default replica name.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaKind::File => "file",
        }
    }

    /// Parses a `type` value.
    fn from_type(t: &str) -> Result<ReplicaKind, String> {
        match t {
            "file" => Ok(ReplicaKind::File),
            other => Err(unsupported_type(other)),
        }
    }

    /// The kind named by a URL's scheme; no scheme means a file path.
    fn from_url(url: &str) -> Result<ReplicaKind, String> {
        match url.split_once("://") {
            None | Some(("file", _)) => Ok(ReplicaKind::File),
            Some((scheme, _)) => Err(unsupported_type(scheme)),
        }
    }

    /// Normalises a URL of this kind and checks that a client can be built from it.
    fn normalize_url(self, url: &str) -> Result<String, String> {
        let normalized = match self {
            ReplicaKind::File => {
                let path = match url.strip_prefix("file://") {
                    Some(rest) if !rest.starts_with('/') => {
                        return Err(format!("file URL {url:?} must be absolute (file:///path)"));
                    }
                    Some(rest) => rest,
                    None => url,
                };
                if path.is_empty() {
                    return Err("empty replica path".into());
                }
                file_url(&absolutize(Path::new(path))?)
            }
        };
        AnyClient::from_url(&normalized).map_err(|e| format!("invalid replica URL: {e}"))?;
        Ok(normalized)
    }

    /// Builds the URL of a replica given by the key `path`.
    fn url_from_path(self, path: &str) -> Result<String, String> {
        match self {
            ReplicaKind::File => self.normalize_url(path),
        }
    }

    /// The default name of the replica at `index` (0-based) in its database.
    fn default_name(self, index: usize) -> String {
        if index == 0 {
            self.name().to_string()
        } else {
            format!("{}-{}", self.name(), index + 1)
        }
    }

    /// How errors call a destination of this kind.
    fn destination_noun(self) -> &'static str {
        match self {
            ReplicaKind::File => "replica path",
        }
    }

    /// The destination shown in errors.
    fn destination(self, url: &str) -> &str {
        match self {
            ReplicaKind::File => url.strip_prefix("file://").unwrap_or(url),
        }
    }
}

fn unsupported_type(t: &str) -> String {
    format!("replica type {t} is not supported yet")
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {}: cannot read: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The text is not valid YAML or breaks a rule; `message` names the key.
    #[error("config {origin}: {}{message}", line_prefix(.line))]
    Invalid {
        /// The file (or `command line` for [`Config::single`]).
        origin: String,
        /// The 1-based line of the offending key, value or map, when known.
        line: Option<usize>,
        /// What is wrong, naming the key and where it is (`in dbs[0]`).
        message: String,
    },
}

fn line_prefix(line: &Option<usize>) -> String {
    match line {
        Some(n) => format!("line {n}: "),
        None => String::new(),
    }
}

impl Config {
    /// Reads and parses a file; `expand_env` expands `$VAR` and `${VAR}` (unset -> empty
    /// string, like Litestream) before parsing.
    pub fn load(path: &Path, expand_env: bool) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Config::parse(&text, &path.display().to_string(), expand_env)
    }

    /// Parses configuration text; `origin` names it in errors (usually the file's path).
    /// `expand_env` as for [`Config::load`].
    pub fn parse(text: &str, origin: &str, expand_env: bool) -> Result<Config, ConfigError> {
        if expand_env {
            let expanded = expand_vars(text, |name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            });
            parse_yaml(&expanded, origin)
        } else {
            parse_yaml(text, origin)
        }
    }

    /// One database with replicas from the command line (`replicad replicate DB URL...`),
    /// settings = defaults overridden by `settings` (build it from [`DbSettings::default`]).
    /// Applies the file's rules: at least one URL, supported and valid URLs, no URL twice,
    /// non-zero intervals; `truncate_page_n == 0` means the default.
    pub fn single(
        db: PathBuf,
        urls: &[String],
        settings: DbSettings,
    ) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            origin: COMMAND_LINE.to_string(),
            line: None,
            message,
        };
        let mut settings = settings;
        settings.validate().map_err(invalid)?;
        let path = absolutize(&db).map_err(|e| invalid(format!("database {e}")))?;
        if urls.is_empty() {
            return Err(invalid(format!(
                "no replica URL given for {}",
                path.display()
            )));
        }
        let mut replicas: Vec<ReplicaConfig> = Vec::with_capacity(urls.len());
        for (i, raw) in urls.iter().enumerate() {
            let kind = ReplicaKind::from_url(raw)
                .map_err(|e| invalid(format!("{e} (replica URL {raw:?})")))?;
            let url = kind
                .normalize_url(raw)
                .map_err(|e| invalid(format!("{e} (replica URL {raw:?})")))?;
            if replicas.iter().any(|r| r.url == url) {
                return Err(invalid(format!(
                    "{} {} is given twice",
                    kind.destination_noun(),
                    kind.destination(&url)
                )));
            }
            replicas.push(ReplicaConfig {
                name: kind.default_name(i),
                url,
            });
        }
        Ok(Config {
            dbs: vec![DbConfig {
                path,
                meta_path: None,
                replicas,
                settings,
            }],
            shutdown_sync_timeout: DEFAULT_SHUTDOWN_SYNC_TIMEOUT,
        })
    }

    /// Finds a configured database by path: compares absolute paths (made as for the file),
    /// then, if none matches, the canonical paths of existing files (symbolic links resolved).
    pub fn find_db(&self, path: &Path) -> Option<&DbConfig> {
        if let Ok(abs) = absolutize(path)
            && let Some(db) = self.dbs.iter().find(|db| db.path == abs)
        {
            return Some(db);
        }
        let canonical = std::fs::canonicalize(path).ok()?;
        self.dbs
            .iter()
            .find(|db| std::fs::canonicalize(&db.path).is_ok_and(|c| c == canonical))
    }
}

// ---------------------------------------------------------------------------------------------
// Environment expansion and paths.

/// Replaces `${NAME}` and `$NAME` (NAME = `[A-Za-z_][A-Za-z0-9_]*`) by `lookup(NAME)`, or by
/// nothing when it returns `None`. Any other `$` is kept.
fn expand_vars(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    fn name_len(s: &str) -> usize {
        let bytes = s.as_bytes();
        match bytes.first() {
            Some(b) if b.is_ascii_alphabetic() || *b == b'_' => bytes
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                .count(),
            _ => 0,
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(inner) = after.strip_prefix('{') {
            if let Some(end) = inner.find('}') {
                let name = &inner[..end];
                if !name.is_empty() && name_len(name) == name.len() {
                    out.push_str(&lookup(name).unwrap_or_default());
                    rest = &inner[end + 1..];
                    continue;
                }
            }
        } else {
            let len = name_len(after);
            if len > 0 {
                out.push_str(&lookup(&after[..len]).unwrap_or_default());
                rest = &after[len..];
                continue;
            }
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Expands a leading `~`, makes `path` absolute against the current directory and normalises
/// it lexically (see the module rules).
fn absolutize(path: &Path) -> Result<PathBuf, String> {
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

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

// ---------------------------------------------------------------------------------------------
// YAML reading.

const SETTING_KEYS: [&str; 7] = [
    "monitor-interval",
    "checkpoint-interval",
    "min-checkpoint-page-count",
    "truncate-page-n",
    "full-verify-interval",
    "compression",
    "heartbeat-interval",
];
const ROOT_KEYS: &[&str] = &[
    "dbs",
    "shutdown-sync-timeout",
    SETTING_KEYS[0],
    SETTING_KEYS[1],
    SETTING_KEYS[2],
    SETTING_KEYS[3],
    SETTING_KEYS[4],
    SETTING_KEYS[5],
    SETTING_KEYS[6],
];
const DB_KEYS: &[&str] = &[
    "path",
    "meta-path",
    "replica",
    "replicas",
    SETTING_KEYS[0],
    SETTING_KEYS[1],
    SETTING_KEYS[2],
    SETTING_KEYS[3],
    SETTING_KEYS[4],
    SETTING_KEYS[5],
    SETTING_KEYS[6],
];
const REPLICA_KEYS: &[&str] = &["name", "type", "path", "url"];

/// State shared by the visitors of one parse.
#[derive(Default)]
struct Ctx {
    /// The message of the last error raised by a visitor (serde_norway adds a path and a
    /// location to it; the rendered error uses this text and the location).
    last_error: RefCell<Option<String>>,
    /// `path` of each database seen so far (`None` until its `path` key is read).
    db_paths: RefCell<Vec<Option<PathBuf>>>,
    /// `meta-path`s seen so far, with their database index.
    meta_paths: RefCell<Vec<(PathBuf, usize)>>,
    /// Replica URLs seen so far, with their database index.
    replica_urls: RefCell<Vec<(String, usize)>>,
}

impl Ctx {
    /// An error raised by a visitor; remembered so the rendered error can drop serde's prefix.
    fn fail<E: de::Error>(&self, message: String) -> E {
        let e = E::custom(&message);
        *self.last_error.borrow_mut() = Some(message);
        e
    }

    /// `dbs[i] (/path)`, or `dbs[i]` while its path is unknown.
    fn db_label(&self, index: usize) -> String {
        match self.db_paths.borrow().get(index) {
            Some(Some(p)) => format!("dbs[{index}] ({})", p.display()),
            _ => format!("dbs[{index}]"),
        }
    }

    /// Turns a serde_norway error into a [`ConfigError`] with the line of the node.
    fn into_error(self, origin: &str, e: &serde_norway::Error) -> ConfigError {
        let line = e.location().map(|l| l.line());
        let rendered = e.to_string();
        let message = match self.last_error.into_inner() {
            Some(mine) if rendered.contains(&mine) => mine,
            _ => match e.location() {
                Some(l) => rendered.replacen(
                    &format!(" at line {} column {}", l.line(), l.column()),
                    "",
                    1,
                ),
                None => rendered,
            },
        };
        ConfigError::Invalid {
            origin: origin.to_string(),
            line,
            message,
        }
    }
}

fn parse_yaml(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let ctx = Ctx::default();
    let result = RootSeed { ctx: &ctx }.deserialize(serde_norway::Deserializer::from_str(text));
    result.map_err(|e| ctx.into_error(origin, &e))
}

/// A YAML scalar, as a value visitor sees it.
#[derive(Clone, Copy, Debug)]
enum Scalar<'s> {
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

/// A non-empty string (integers are taken as their digits, e.g. `name: 2`).
fn text(s: Scalar<'_>) -> Result<String, String> {
    match s {
        Scalar::Str("") | Scalar::Null => Err("the value is empty".into()),
        Scalar::Str(v) => Ok(v.to_string()),
        Scalar::Int(i) => Ok(i.to_string()),
        other => Err(format!("expected a string, found {other} (quote it)")),
    }
}

fn duration(s: Scalar<'_>) -> Result<Duration, String> {
    const SYNTAX: &str = "use Go duration syntax such as 500ms, 10s, 1m, 24h or 1h30m";
    match s {
        Scalar::Str(v) => humantime::parse_duration(v.trim())
            .map_err(|e| format!("invalid duration {v:?} ({e}): {SYNTAX}")),
        Scalar::Int(_) | Scalar::Float(_) => Err(format!(
            "{s} is a bare number: add a unit, e.g. `{s}s` ({SYNTAX})"
        )),
        Scalar::Null => Err(format!("the value is empty: {SYNTAX}")),
        Scalar::Bool(_) => Err(format!("expected a duration, found {s}: {SYNTAX}")),
    }
}

fn positive_duration(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

fn count(s: Scalar<'_>) -> Result<u32, String> {
    match s {
        Scalar::Int(i) => {
            u32::try_from(i).map_err(|_| format!("{i} is out of range (0..={})", u32::MAX))
        }
        other => Err(format!("expected a whole number, found {other}")),
    }
}

fn codec(s: Scalar<'_>) -> Result<Codec, String> {
    match s {
        Scalar::Str(v) => v.parse(),
        other => Err(format!(
            "expected lz4, zstd[:1-19], gzip[:0-9] or none, found {other}"
        )),
    }
}

/// Reads one scalar value and converts it inside the visitor, so errors carry its line.
struct ValueSeed<'a, T> {
    ctx: &'a Ctx,
    key: &'static str,
    /// `in dbs[0]`, `at the top level`, ...
    place: &'a str,
    convert: &'a dyn Fn(Scalar<'_>) -> Result<T, String>,
}

impl<T> ValueSeed<'_, T> {
    fn finish<E: de::Error>(self, s: Scalar<'_>) -> Result<T, E> {
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
struct KeySeed<'a> {
    ctx: &'a Ctx,
    allowed: &'static [&'static str],
    seen: &'a mut Vec<&'static str>,
    place: &'a str,
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

/// Setting keys as read in one map (top level or one database).
#[derive(Default)]
struct RawSettings {
    monitor_interval: Option<Duration>,
    checkpoint_interval: Option<Duration>,
    min_checkpoint_page_count: Option<u32>,
    truncate_page_n: Option<u32>,
    full_verify_interval: Option<Duration>,
    compression: Option<Codec>,
    heartbeat_interval: Option<Duration>,
}

impl RawSettings {
    /// Reads the value of `key` if it is a setting key; returns whether it was.
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: &'static str,
        map: &mut A,
        ctx: &Ctx,
        place: &str,
    ) -> Result<bool, A::Error> {
        fn seed<'a, T>(
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
        match key {
            "monitor-interval" => {
                self.monitor_interval =
                    Some(map.next_value_seed(seed(ctx, key, place, &positive_duration))?)
            }
            "checkpoint-interval" => {
                self.checkpoint_interval =
                    Some(map.next_value_seed(seed(ctx, key, place, &duration))?)
            }
            "min-checkpoint-page-count" => {
                self.min_checkpoint_page_count =
                    Some(map.next_value_seed(seed(ctx, key, place, &count))?)
            }
            "truncate-page-n" => {
                self.truncate_page_n = Some(map.next_value_seed(seed(ctx, key, place, &count))?)
            }
            "full-verify-interval" => {
                self.full_verify_interval =
                    Some(map.next_value_seed(seed(ctx, key, place, &positive_duration))?)
            }
            "compression" => {
                self.compression = Some(map.next_value_seed(seed(ctx, key, place, &codec))?)
            }
            "heartbeat-interval" => {
                self.heartbeat_interval =
                    Some(map.next_value_seed(seed(ctx, key, place, &positive_duration))?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Effective settings: `self`, else `global`, else the defaults.
    fn resolve(&self, global: &RawSettings) -> DbSettings {
        let d = DbSettings::default();
        let nonzero = |n: &u32| *n != 0;
        DbSettings {
            monitor_interval: self
                .monitor_interval
                .or(global.monitor_interval)
                .unwrap_or(d.monitor_interval),
            checkpoint_interval: self
                .checkpoint_interval
                .or(global.checkpoint_interval)
                .unwrap_or(d.checkpoint_interval),
            min_checkpoint_page_count: self
                .min_checkpoint_page_count
                .or(global.min_checkpoint_page_count)
                .unwrap_or(d.min_checkpoint_page_count),
            truncate_page_n: self
                .truncate_page_n
                .filter(nonzero)
                .or(global.truncate_page_n.filter(nonzero))
                .unwrap_or(d.truncate_page_n),
            full_verify_interval: self
                .full_verify_interval
                .or(global.full_verify_interval)
                .unwrap_or(d.full_verify_interval),
            compression: self
                .compression
                .or(global.compression)
                .unwrap_or(d.compression),
            heartbeat_interval: self
                .heartbeat_interval
                .or(global.heartbeat_interval)
                .unwrap_or(d.heartbeat_interval),
        }
    }
}

/// The top-level map.
struct RootSeed<'a> {
    ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for RootSeed<'_> {
    type Value = Config;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Config, D::Error> {
        d.deserialize_map(self)
    }
}

const NO_DBS: &str = "configure at least one database under `dbs`";

impl<'de> Visitor<'de> for RootSeed<'_> {
    type Value = Config;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map with the key `dbs`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Config, E> {
        Err(self.ctx.fail(format!("the file is empty: {NO_DBS}")))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Config, A::Error> {
        let ctx = self.ctx;
        let place = "at the top level";
        let mut seen = Vec::new();
        let mut settings = RawSettings::default();
        let mut dbs = None;
        let mut shutdown_sync_timeout = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: ROOT_KEYS,
            seen: &mut seen,
            place,
        })? {
            match key {
                "dbs" => dbs = Some(map.next_value_seed(DbsSeed { ctx })?),
                "shutdown-sync-timeout" => {
                    shutdown_sync_timeout = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &duration,
                    })?)
                }
                _ => {
                    if !settings.read(key, &mut map, ctx, place)? {
                        return Err(ctx.fail(format!("internal error: key `{key}` {place}")));
                    }
                }
            }
        }
        let Some(dbs) = dbs else {
            return Err(ctx.fail(format!("missing key `dbs`: {NO_DBS}")));
        };
        Ok(Config {
            dbs: dbs
                .into_iter()
                .map(|db| DbConfig {
                    settings: db.settings.resolve(&settings),
                    path: db.path,
                    meta_path: db.meta_path,
                    replicas: db.replicas,
                })
                .collect(),
            shutdown_sync_timeout: shutdown_sync_timeout.unwrap_or(DEFAULT_SHUTDOWN_SYNC_TIMEOUT),
        })
    }
}

/// A database as read, before the top-level settings are known.
struct PartialDb {
    path: PathBuf,
    meta_path: Option<PathBuf>,
    replicas: Vec<ReplicaConfig>,
    settings: RawSettings,
}

/// The `dbs` list.
struct DbsSeed<'a> {
    ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for DbsSeed<'_> {
    type Value = Vec<PartialDb>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<PartialDb>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for DbsSeed<'_> {
    type Value = Vec<PartialDb>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of databases")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Vec<PartialDb>, E> {
        Err(self.ctx.fail(format!("`dbs` is empty: {NO_DBS}")))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<PartialDb>, A::Error> {
        let mut dbs = Vec::new();
        while let Some(db) = seq.next_element_seed(DbSeed {
            ctx: self.ctx,
            index: dbs.len(),
        })? {
            dbs.push(db);
        }
        if dbs.is_empty() {
            return Err(self.ctx.fail(format!("`dbs` is empty: {NO_DBS}")));
        }
        Ok(dbs)
    }
}

/// One database map.
struct DbSeed<'a> {
    ctx: &'a Ctx,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for DbSeed<'_> {
    type Value = PartialDb;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<PartialDb, D::Error> {
        self.ctx.db_paths.borrow_mut().push(None);
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DbSeed<'_> {
    type Value = PartialDb;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a database: a map with `path` and `replica` or `replicas`")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PartialDb, A::Error> {
        let (ctx, index) = (self.ctx, self.index);
        let here = format!("dbs[{index}]");
        let place = format!("in {here}");
        let place = place.as_str();
        let mut seen = Vec::new();
        let mut settings = RawSettings::default();
        let mut path = None;
        let mut meta_path = None;
        let mut replica = None;
        let mut replicas = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: DB_KEYS,
            seen: &mut seen,
            place,
        })? {
            match key {
                "path" => {
                    let convert = |s: Scalar<'_>| -> Result<PathBuf, String> {
                        let p = absolutize(Path::new(&text(s)?))?;
                        let mut paths = ctx.db_paths.borrow_mut();
                        if let Some(other) = paths.iter().position(|q| q.as_ref() == Some(&p)) {
                            return Err(format!(
                                "database {} is configured twice: dbs[{other}] and {here}",
                                p.display()
                            ));
                        }
                        paths[index] = Some(p.clone());
                        Ok(p)
                    };
                    path = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &convert,
                    })?);
                }
                "meta-path" => {
                    let convert = |s: Scalar<'_>| -> Result<PathBuf, String> {
                        let p = absolutize(Path::new(&text(s)?))?;
                        let mut metas = ctx.meta_paths.borrow_mut();
                        if let Some((_, other)) = metas.iter().find(|(q, _)| *q == p) {
                            return Err(format!(
                                "meta-path {} is used by two databases: {} and {here}",
                                p.display(),
                                ctx.db_label(*other)
                            ));
                        }
                        metas.push((p.clone(), index));
                        Ok(p)
                    };
                    meta_path = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &convert,
                    })?);
                }
                "replica" => {
                    replica = Some(map.next_value_seed(ReplicaSeed {
                        ctx,
                        db: index,
                        place: format!("in {here}.replica"),
                    })?);
                }
                "replicas" => {
                    replicas = Some(map.next_value_seed(ReplicasSeed { ctx, db: index })?);
                }
                _ => {
                    if !settings.read(key, &mut map, ctx, place)? {
                        return Err(ctx.fail(format!("internal error: key `{key}` {place}")));
                    }
                }
            }
        }
        let Some(path) = path else {
            return Err(ctx.fail(format!("missing key `path` {place}")));
        };
        let raw = match (replica, replicas) {
            (Some(_), Some(_)) => {
                return Err(ctx.fail(format!(
                    "keys `replica` and `replicas` are mutually exclusive {place}"
                )));
            }
            (Some(one), None) => vec![one],
            (None, Some(list)) => list,
            (None, None) => {
                return Err(ctx.fail(format!(
                    "{} has no replica: add `replica` (one map) or `replicas` (a list)",
                    ctx.db_label(index)
                )));
            }
        };
        let mut replicas: Vec<ReplicaConfig> = Vec::with_capacity(raw.len());
        for (i, r) in raw.into_iter().enumerate() {
            let name = r.name.unwrap_or_else(|| r.kind.default_name(i));
            if replicas.iter().any(|other| other.name == name) {
                return Err(ctx.fail(format!(
                    "replica name `{name}` is used twice {place} (key `name`; unnamed replicas \
                     are called after their type, then <type>-N for the N-th replica)"
                )));
            }
            replicas.push(ReplicaConfig { name, url: r.url });
        }
        Ok(PartialDb {
            path,
            meta_path,
            replicas,
            settings,
        })
    }
}

/// The `replicas` list of one database.
struct ReplicasSeed<'a> {
    ctx: &'a Ctx,
    db: usize,
}

impl<'de> DeserializeSeed<'de> for ReplicasSeed<'_> {
    type Value = Vec<RawReplica>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<RawReplica>, D::Error> {
        // `any`: a map must reach `visit_map` for its hint.
        d.deserialize_any(self)
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
struct RawReplica {
    name: Option<String>,
    kind: ReplicaKind,
    url: String,
}

/// One replica map.
struct ReplicaSeed<'a> {
    ctx: &'a Ctx,
    db: usize,
    place: String,
}

impl<'de> DeserializeSeed<'de> for ReplicaSeed<'_> {
    type Value = RawReplica;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawReplica, D::Error> {
        // `any`: a list must reach `visit_seq` for its hint.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReplicaSeed<'_> {
    type Value = RawReplica;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a replica: a map with `url` or `path`")
    }
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
        let mut url: Option<(ReplicaKind, String)> = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: REPLICA_KEYS,
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
                            Ok((kind, kind.normalize_url(&raw)?))
                        },
                    })?)
                }
                _ => return Err(ctx.fail(format!("internal error: key `{key}` {place}"))),
            }
        }
        let (kind, url) = match (url, path) {
            (Some(_), Some(_)) => {
                return Err(ctx.fail(format!(
                    "keys `url` and `path` are mutually exclusive {place}"
                )));
            }
            (None, None) => {
                return Err(ctx.fail(format!("missing key `url` or `path` {place}")));
            }
            (Some((url_kind, url)), None) => {
                if let Some(kind) = kind
                    && kind != url_kind
                {
                    return Err(ctx.fail(format!(
                        "`type: {}` does not match the URL {url} {place}",
                        kind.name()
                    )));
                }
                (url_kind, url)
            }
            (None, Some(path)) => {
                let kind = kind.unwrap_or(ReplicaKind::File);
                let url = kind
                    .url_from_path(&path)
                    .map_err(|e| ctx.fail(format!("{e} (key `path` {place})")))?;
                (kind, url)
            }
        };
        let mut urls = ctx.replica_urls.borrow_mut();
        if let Some((_, other)) = urls.iter().find(|(u, _)| *u == url) {
            let what = format!("{} {}", kind.destination_noun(), kind.destination(&url));
            return Err(ctx.fail(if *other == self.db {
                format!(
                    "{what} is used twice by {} ({place})",
                    ctx.db_label(self.db)
                )
            } else {
                format!(
                    "{what} is used by two databases: {} and {} ({place})",
                    ctx.db_label(*other),
                    ctx.db_label(self.db)
                )
            }));
        }
        urls.push((url.clone(), self.db));
        Ok(RawReplica { name, kind, url })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `text` (no env expansion) from a fake file.
    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "/etc/replicad.yml", false)
    }

    /// The line and the rendered message of a rejected config.
    fn fail(text: &str) -> (Option<usize>, String) {
        match parse(text) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => {
                let ConfigError::Invalid { line, .. } = &e else {
                    panic!("unexpected error {e:?}")
                };
                (*line, e.to_string())
            }
        }
    }

    /// Asserts an error at `line` whose message contains every part of `parts`.
    #[track_caller]
    fn assert_fail(text: &str, line: usize, parts: &[&str]) {
        let (l, msg) = fail(text);
        assert_eq!(l, Some(line), "wrong line in: {msg}");
        assert!(
            msg.starts_with(&format!("config /etc/replicad.yml: line {line}: ")),
            "bad prefix: {msg}"
        );
        for p in parts {
            assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
        }
    }

    fn cwd() -> PathBuf {
        std::env::current_dir().unwrap()
    }

    const MINIMAL: &str = "dbs:\n  - path: /data/a.db\n    replica:\n      url: file:///backup/a\n";

    #[test]
    fn defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.shutdown_sync_timeout, Duration::from_secs(30));
        assert_eq!(c.dbs.len(), 1);
        let db = &c.dbs[0];
        assert_eq!(db.path, PathBuf::from("/data/a.db"));
        assert_eq!(db.meta_path, None);
        assert_eq!(
            db.replicas,
            vec![ReplicaConfig {
                name: "file".into(),
                url: "file:///backup/a".into()
            }]
        );
        let d = DbSettings::default();
        assert_eq!(db.settings, d);
        assert_eq!(d.monitor_interval, Duration::from_secs(1));
        assert_eq!(d.checkpoint_interval, Duration::from_secs(60));
        assert_eq!(d.min_checkpoint_page_count, 1000);
        assert_eq!(d.truncate_page_n, 121_359);
        assert_eq!(d.full_verify_interval, Duration::from_secs(60));
        assert_eq!(d.compression, Codec::Zstd(3));
        assert_eq!(d.heartbeat_interval, Duration::from_secs(60));
    }

    #[test]
    fn settings_precedence_db_over_global_over_default() {
        let c = parse(
            "monitor-interval: 2s
checkpoint-interval: 2m
min-checkpoint-page-count: 50
truncate-page-n: 5000
full-verify-interval: 10m
compression: lz4
heartbeat-interval: 5s
shutdown-sync-timeout: 1m
dbs:
  - path: /data/a.db
    monitor-interval: 500ms
    checkpoint-interval: 0s
    min-checkpoint-page-count: 7
    truncate-page-n: 9
    full-verify-interval: 1h30m
    compression: gzip:9
    heartbeat-interval: 24h
    replica: {url: /backup/a}
  - path: /data/b.db
    compression: none
    replica: {url: /backup/b}
",
        )
        .unwrap();
        assert_eq!(c.shutdown_sync_timeout, Duration::from_secs(60));
        assert_eq!(
            c.dbs[0].settings,
            DbSettings {
                monitor_interval: Duration::from_millis(500),
                checkpoint_interval: Duration::ZERO,
                min_checkpoint_page_count: 7,
                truncate_page_n: 9,
                full_verify_interval: Duration::from_secs(5400),
                compression: Codec::Gzip(9),
                heartbeat_interval: Duration::from_secs(86_400),
            }
        );
        assert_eq!(
            c.dbs[1].settings,
            DbSettings {
                monitor_interval: Duration::from_secs(2),
                checkpoint_interval: Duration::from_secs(120),
                min_checkpoint_page_count: 50,
                truncate_page_n: 5000,
                full_verify_interval: Duration::from_secs(600),
                compression: Codec::None,
                heartbeat_interval: Duration::from_secs(5),
            }
        );
    }

    #[test]
    fn global_settings_may_follow_dbs() {
        let c = parse(&format!("{MINIMAL}monitor-interval: 3s\n")).unwrap();
        assert_eq!(c.dbs[0].settings.monitor_interval, Duration::from_secs(3));
    }

    #[test]
    fn truncate_page_n_zero_means_not_set() {
        let c = parse(&format!("{MINIMAL}    truncate-page-n: 0\n")).unwrap();
        assert_eq!(c.dbs[0].settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
        let c = parse(&format!(
            "truncate-page-n: 5000\n{MINIMAL}    truncate-page-n: 0\n"
        ))
        .unwrap();
        assert_eq!(c.dbs[0].settings.truncate_page_n, 5000);
        let c = parse(&format!("truncate-page-n: 0\n{MINIMAL}")).unwrap();
        assert_eq!(c.dbs[0].settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
    }

    #[test]
    fn durations_in_go_syntax() {
        for (text, want) in [
            ("500ms", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("1m", Duration::from_secs(60)),
            ("24h", Duration::from_secs(86_400)),
            ("1h30m", Duration::from_secs(5400)),
            ("\"2s\"", Duration::from_secs(2)),
        ] {
            let c = parse(&format!("monitor-interval: {text}\n{MINIMAL}")).unwrap();
            assert_eq!(c.dbs[0].settings.monitor_interval, want, "{text}");
        }
    }

    #[test]
    fn bare_number_duration_asks_for_a_unit() {
        assert_fail(
            &format!("{MINIMAL}    checkpoint-interval: 10\n"),
            5,
            &[
                "10 is a bare number: add a unit, e.g. `10s`",
                "key `checkpoint-interval` in dbs[0]",
            ],
        );
        assert_fail(
            &format!("shutdown-sync-timeout: 30\n{MINIMAL}"),
            1,
            &["add a unit", "key `shutdown-sync-timeout` at the top level"],
        );
    }

    #[test]
    fn bad_durations() {
        assert_fail(
            &format!("{MINIMAL}monitor-interval: soon\n"),
            5,
            &[
                "invalid duration \"soon\"",
                "Go duration syntax",
                "key `monitor-interval`",
            ],
        );
        assert_fail(
            &format!("{MINIMAL}monitor-interval: -1s\n"),
            5,
            &["invalid duration \"-1s\"", "key `monitor-interval`"],
        );
        assert_fail(
            &format!("{MINIMAL}    monitor-interval: 0s\n"),
            5,
            &[
                "must be greater than zero",
                "key `monitor-interval` in dbs[0]",
            ],
        );
        assert_fail(
            &format!("heartbeat-interval: 0s\n{MINIMAL}"),
            1,
            &[
                "must be greater than zero",
                "key `heartbeat-interval` at the top level",
            ],
        );
        assert_fail(
            &format!("{MINIMAL}full-verify-interval: [1s]\n"),
            5,
            &["found a list", "key `full-verify-interval`"],
        );
    }

    #[test]
    fn bad_numbers_and_compression() {
        assert_fail(
            &format!("{MINIMAL}    min-checkpoint-page-count: -1\n"),
            5,
            &[
                "-1 is out of range",
                "key `min-checkpoint-page-count` in dbs[0]",
            ],
        );
        assert_fail(
            &format!("{MINIMAL}truncate-page-n: many\n"),
            5,
            &[
                "expected a whole number",
                "key `truncate-page-n` at the top level",
            ],
        );
        assert_fail(
            &format!("{MINIMAL}compression: brotli\n"),
            5,
            &["unknown compression \"brotli\"", "key `compression`"],
        );
        assert_fail(
            &format!("{MINIMAL}    compression: zstd:42\n"),
            5,
            &["must be 1..=19", "key `compression` in dbs[0]"],
        );
    }

    #[test]
    fn replica_forms() {
        let c = parse(
            "dbs:
  - path: /data/a.db
    meta-path: /meta/a
    replicas:
      - url: file:///backup/one/
      - url: /backup/two
      - path: /backup/three
      - type: file
        path: /backup/./four//
        name: four
      - url: rel/five
  - path: data/b.db
    replica:
      type: file
      path: rel/six
",
        )
        .unwrap();
        let cwd = cwd();
        let a = &c.dbs[0];
        assert_eq!(a.meta_path, Some(PathBuf::from("/meta/a")));
        let got: Vec<(&str, &str)> = a
            .replicas
            .iter()
            .map(|r| (r.name.as_str(), r.url.as_str()))
            .collect();
        let five = format!("file://{}", cwd.join("rel/five").display());
        assert_eq!(
            got,
            vec![
                ("file", "file:///backup/one"),
                ("file-2", "file:///backup/two"),
                ("file-3", "file:///backup/three"),
                ("four", "file:///backup/four"),
                ("file-5", five.as_str()),
            ]
        );
        let b = &c.dbs[1];
        assert_eq!(b.path, cwd.join("data/b.db"));
        assert_eq!(
            b.replicas,
            vec![ReplicaConfig {
                name: "file".into(),
                url: format!("file://{}", cwd.join("rel/six").display()),
            }]
        );
        for r in c.dbs.iter().flat_map(|d| &d.replicas) {
            AnyClient::from_url(&r.url).unwrap();
        }
    }

    #[test]
    fn home_is_expanded_in_paths() {
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return;
        };
        let home = PathBuf::from(home);
        let c = parse("dbs:\n  - path: ~/a.db\n    replica: {path: ~/backup}\n").unwrap();
        assert_eq!(c.dbs[0].path, absolutize(&home.join("a.db")).unwrap());
        assert_eq!(
            c.dbs[0].replicas[0].url,
            file_url(&absolutize(&home.join("backup")).unwrap())
        );
    }

    #[test]
    fn unknown_keys_name_the_key_and_line() {
        let (line, msg) = fail(
            "dbs:
  - path: /data/a.db
    replica:
      url: /backup/a


    retention-foo: 24h
",
        );
        assert_eq!(line, Some(7));
        assert!(
            msg.starts_with(
                "config /etc/replicad.yml: line 7: unknown key `retention-foo` in dbs[0] (expected one of `path`"
            ),
            "{msg}"
        );
        assert_fail(
            &format!("# comment\naddr: \":9090\"\n{MINIMAL}"),
            2,
            &[
                "unknown key `addr` at the top level",
                "`dbs`",
                "`shutdown-sync-timeout`",
            ],
        );
        assert_fail(
            &format!("{MINIMAL}      access-key-id: x\n"),
            5,
            &["unknown key `access-key-id` in dbs[0].replica", "`url`"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - url: /c\n        bucket: x\n",
            6,
            &["unknown key `bucket` in dbs[0].replicas[1]"],
        );
        // Keys that belong elsewhere are unknown too.
        assert_fail(
            &format!("{MINIMAL}    shutdown-sync-timeout: 1s\n"),
            5,
            &["unknown key `shutdown-sync-timeout` in dbs[0]"],
        );
        // Flow style: still the right line.
        assert_fail(
            "dbs: [{path: /a.db, replica: {url: /b}},\n  {path: /c.db, replica: {url: /d, sync-interval: 1s}}]\n",
            2,
            &["unknown key `sync-interval` in dbs[1].replica"],
        );
    }

    #[test]
    fn duplicate_keys() {
        assert_fail(
            "dbs:\n  - path: /a.db\n    path: /b.db\n    replica: {url: /b}\n",
            3,
            &["duplicate key `path` in dbs[0]"],
        );
        assert_fail(
            &format!("{MINIMAL}monitor-interval: 1s\nmonitor-interval: 2s\n"),
            6,
            &["duplicate key `monitor-interval` at the top level"],
        );
    }

    #[test]
    fn unsupported_replica_types() {
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - type: s3\n        path: bucket/x\n",
            4,
            &["replica type s3 is not supported yet (key `type` in dbs[0].replicas[0])"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica:\n      name: s3\n      url: s3://bucket/db\n",
            5,
            &["replica type s3 is not supported yet (key `url` in dbs[0].replica)"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica: {type: sftp, path: /x}\n",
            3,
            &["replica type sftp is not supported yet (key `type` in dbs[0].replica)"],
        );
    }

    #[test]
    fn replica_url_and_path_rules() {
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n        path: /c\n",
            4,
            &["keys `url` and `path` are mutually exclusive in dbs[0].replicas[0]"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - name: x\n",
            5,
            &["missing key `url` or `path` in dbs[0].replicas[1]"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica:\n      url: file://relative/x\n",
            4,
            &[
                "must be absolute (file:///path)",
                "key `url` in dbs[0].replica",
            ],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica:\n      path: \"\"\n",
            4,
            &["the value is empty (key `path` in dbs[0].replica)"],
        );
    }

    #[test]
    fn databases_need_dbs_path_and_replicas() {
        assert_fail(
            "dbs: []\n",
            1,
            &["`dbs` is empty: configure at least one database"],
        );
        assert_fail("\n\ndbs:\n", 3, &["`dbs` is empty"]);
        assert_fail(
            "# nothing but\nmonitor-interval: 1s\n",
            2,
            &["missing key `dbs`: configure at least one database"],
        );
        let (_, msg) = fail("");
        assert!(msg.contains("configure at least one database"), "{msg}");
        let (_, msg) = fail("# only a comment\n");
        assert!(msg.contains("configure at least one database"), "{msg}");
        assert_fail(
            "dbs:\n  - replica: {url: /b}\n",
            2,
            &["missing key `path` in dbs[0]"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    monitor-interval: 1s\n",
            2,
            &["dbs[0] (/a.db) has no replica: add `replica` (one map) or `replicas` (a list)"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas: []\n",
            3,
            &["`replicas` is empty in dbs[0]"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n",
            3,
            &["`replicas` is empty in dbs[0]"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas: {url: /b}\n",
            3,
            &["`replicas` takes a list (`- url: ...`); use `replica` for a single map (in dbs[0])"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica:\n      - url: /b\n",
            4,
            &["`replica` takes one map; use `replicas` for a list (in dbs[0])"],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replica: {url: /b}\n    replicas:\n      - url: /c\n",
            2,
            &["keys `replica` and `replicas` are mutually exclusive in dbs[0]"],
        );
    }

    #[test]
    fn duplicate_database_paths() {
        assert_fail(
            "dbs:
  - path: /data/a.db
    replica: {url: /b1}
  - path: /data/./a.db
    replica: {url: /b2}
",
            4,
            &["database /data/a.db is configured twice: dbs[0] and dbs[1] (key `path` in dbs[1])"],
        );
        assert_fail(
            "dbs:
  - path: /data/a.db
    meta-path: /meta
    replica: {url: /b1}
  - path: /data/b.db
    meta-path: /meta/
    replica: {url: /b2}
",
            6,
            &["meta-path /meta is used by two databases: dbs[0] (/data/a.db) and dbs[1]"],
        );
    }

    #[test]
    fn replica_destination_shared_by_two_databases() {
        assert_fail(
            "dbs:
  - path: /data/a.db
    replicas:
      - url: file:///backup/x
  - path: /data/b.db
    replicas:
      - url: /backup/y
      - path: /backup/x/
",
            8,
            &[
                "replica path /backup/x is used by two databases: dbs[0] (/data/a.db) and dbs[1] (/data/b.db)",
                "dbs[1].replicas[1]",
            ],
        );
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - url: file:///b\n",
            5,
            &["replica path /b is used twice by dbs[0] (/a.db)"],
        );
    }

    #[test]
    fn replica_names_are_unique_within_a_database() {
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - {url: /b, name: x}\n      - {url: /c, name: x}\n",
            2,
            &["replica name `x` is used twice in dbs[0]", "key `name`"],
        );
        // An explicit name may collide with a default one.
        assert_fail(
            "dbs:\n  - path: /a.db\n    replicas:\n      - {url: /b, name: file-2}\n      - {url: /c}\n",
            2,
            &["replica name `file-2` is used twice in dbs[0]"],
        );
        // The same names in two databases are fine.
        let c = parse(
            "dbs:\n  - path: /a.db\n    replica: {url: /b}\n  - path: /c.db\n    replica: {url: /d}\n",
        )
        .unwrap();
        assert_eq!(c.dbs[0].replicas[0].name, c.dbs[1].replicas[0].name);
    }

    #[test]
    fn yaml_syntax_errors_have_a_line() {
        let (line, msg) = fail("dbs:\n  - path: /a.db\n    replica: {url: /b\n\n");
        assert!(line.is_some(), "{msg}");
        assert!(msg.starts_with("config /etc/replicad.yml: line "), "{msg}");
        // The error's own location moves to the prefix; libyaml's context keeps its own.
        let line = line.unwrap_or_default();
        assert!(
            !msg.contains(&format!("at line {line} column")),
            "location left in the message: {msg}"
        );
        assert!(
            msg.contains("while parsing a flow mapping at line 3"),
            "{msg}"
        );
        let (line, msg) = fail("dbs:\n  - path /a.db\n");
        assert_eq!(line, Some(2), "{msg}");
        assert!(msg.contains("dbs[0]"), "{msg}");
    }

    #[test]
    fn expand_vars_rules() {
        let lookup = |n: &str| match n {
            "A" => Some("x".to_string()),
            "DIR_1" => Some("/srv".to_string()),
            _ => None,
        };
        assert_eq!(
            expand_vars("$A ${A} $DIR_1/a ${DIR_1}b", lookup),
            "x x /srv/a /srvb"
        );
        assert_eq!(expand_vars("[$UNSET] [${UNSET}]", lookup), "[] []");
        assert_eq!(
            expand_vars("$Ab", lookup),
            "",
            "the name is as long as possible"
        );
        assert_eq!(expand_vars("${A}b", lookup), "xb");
        assert_eq!(
            expand_vars("cost $ 5, $1, ${, ${ A}, ${}, end $", lookup),
            "cost $ 5, $1, ${, ${ A}, ${}, end $"
        );
        assert_eq!(expand_vars("é$A€", lookup), "éx€");
        assert_eq!(expand_vars("$$A", lookup), "$x");
    }

    #[test]
    fn env_expansion_on_and_off() {
        // A variable that exists with a path-safe value (the environment cannot be set safely
        // from a test).
        let Some((name, value)) = std::env::vars().find(|(k, v)| {
            !v.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
        }) else {
            return;
        };
        let text = format!(
            "dbs:\n  - path: /data/${{{name}}}/a.db\n    replica: {{url: /b/${name}/$REPLICAD_TEST_SURELY_UNSET_4711x}}\n"
        );
        let on = Config::parse(&text, "t", true).unwrap();
        assert_eq!(
            on.dbs[0].path,
            absolutize(Path::new(&format!("/data/{value}/a.db"))).unwrap()
        );
        assert_eq!(
            on.dbs[0].replicas[0].url,
            file_url(&absolutize(Path::new(&format!("/b/{value}"))).unwrap())
        );
        let off = Config::parse(&text, "t", false).unwrap();
        assert_eq!(
            off.dbs[0].path,
            PathBuf::from(format!("/data/${{{name}}}/a.db"))
        );
        assert_eq!(
            off.dbs[0].replicas[0].url,
            format!("file:///b/${name}/$REPLICAD_TEST_SURELY_UNSET_4711x")
        );
    }

    #[test]
    fn single_from_command_line() {
        let settings = DbSettings {
            monitor_interval: Duration::from_millis(250),
            truncate_page_n: 0,
            ..DbSettings::default()
        };
        let urls = vec!["file:///backup/a".to_string(), "rel/b".to_string()];
        let c = Config::single(PathBuf::from("data/x.db"), &urls, settings.clone()).unwrap();
        assert_eq!(c.shutdown_sync_timeout, DEFAULT_SHUTDOWN_SYNC_TIMEOUT);
        let db = &c.dbs[0];
        assert_eq!(db.path, cwd().join("data/x.db"));
        assert_eq!(db.meta_path, None);
        assert_eq!(db.settings.monitor_interval, Duration::from_millis(250));
        assert_eq!(db.settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
        assert_eq!(
            db.replicas,
            vec![
                ReplicaConfig {
                    name: "file".into(),
                    url: "file:///backup/a".into()
                },
                ReplicaConfig {
                    name: "file-2".into(),
                    url: format!("file://{}", cwd().join("rel/b").display())
                },
            ]
        );
        assert_eq!(c.find_db(Path::new("data/x.db")), Some(db));
    }

    #[test]
    fn single_errors() {
        let msg = |urls: &[&str], s: DbSettings| {
            let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
            match Config::single(PathBuf::from("/a.db"), &urls, s) {
                Ok(c) => panic!("expected an error, got {c:?}"),
                Err(e) => e.to_string(),
            }
        };
        let d = DbSettings::default;
        assert_eq!(
            msg(&[], d()),
            "config command line: no replica URL given for /a.db"
        );
        assert_eq!(
            msg(&["s3://bucket/a"], d()),
            "config command line: replica type s3 is not supported yet (replica URL \"s3://bucket/a\")"
        );
        assert!(msg(&["file://rel"], d()).contains("must be absolute"));
        assert_eq!(
            msg(&["/b", "file:///b/"], d()),
            "config command line: replica path /b is given twice"
        );
        let s = DbSettings {
            heartbeat_interval: Duration::ZERO,
            ..d()
        };
        assert_eq!(
            msg(&["/b"], s),
            "config command line: heartbeat-interval must be greater than zero"
        );
    }

    #[test]
    fn find_db_compares_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.db");
        std::fs::write(&real, b"").unwrap();
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let text = format!(
            "dbs:\n  - path: {}\n    replica: {{url: /b}}\n  - path: rel/c.db\n    replica: {{url: /c}}\n",
            real.display()
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.find_db(&real).unwrap().path, real);
        assert_eq!(
            c.find_db(&dir.path().join(".").join("real.db"))
                .unwrap()
                .path,
            real
        );
        assert_eq!(c.find_db(&link).unwrap().path, real, "symbolic link");
        assert_eq!(
            c.find_db(&cwd().join("rel/c.db")).unwrap().path,
            cwd().join("rel/c.db")
        );
        assert_eq!(
            c.find_db(Path::new("rel/./c.db")).unwrap().replicas[0].url,
            "file:///c"
        );
        assert!(c.find_db(Path::new("/nowhere.db")).is_none());
    }

    #[test]
    fn load_reads_files_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replicad.yml");
        std::fs::write(&path, MINIMAL).unwrap();
        assert_eq!(Config::load(&path, true).unwrap(), parse(MINIMAL).unwrap());
        std::fs::write(&path, format!("{MINIMAL}bogus: 1\n")).unwrap();
        let e = Config::load(&path, false).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "config {}: line 5: unknown key `bogus`",
                path.display()
            )),
            "{e}"
        );
        let missing = dir.path().join("missing.yml");
        let e = Config::load(&missing, true).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(
            e.to_string()
                .starts_with(&format!("config {}: cannot read: ", missing.display())),
            "{e}"
        );
    }

    #[test]
    fn example_file_parses() {
        let text = include_str!("../config/replicad.yml");
        for expand in [false, true] {
            let c = Config::parse(text, "config/replicad.yml", expand).unwrap();
            assert_eq!(c.shutdown_sync_timeout, DEFAULT_SHUTDOWN_SYNC_TIMEOUT);
            assert_eq!(c.dbs.len(), 2);
            let app = &c.dbs[0];
            assert_eq!(app.path, PathBuf::from("/var/lib/app/app.db"));
            assert_eq!(
                app.meta_path,
                Some(PathBuf::from("/var/lib/app/.app.db-replicad"))
            );
            assert_eq!(
                app.settings,
                DbSettings {
                    checkpoint_interval: Duration::from_secs(300),
                    compression: Codec::Lz4,
                    ..DbSettings::default()
                }
            );
            let names: Vec<(&str, &str)> = app
                .replicas
                .iter()
                .map(|r| (r.name.as_str(), r.url.as_str()))
                .collect();
            assert_eq!(
                names,
                vec![
                    ("local", "file:///backup/app"),
                    ("file-2", "file:///mnt/offsite/app")
                ]
            );
            let audit = &c.dbs[1];
            assert_eq!(audit.settings.monitor_interval, Duration::from_secs(5));
            assert_eq!(audit.replicas[0].url, "file:///backup/audit");
        }
        // The example documents every key the parser knows.
        for key in ROOT_KEYS.iter().chain(DB_KEYS).chain(REPLICA_KEYS) {
            assert!(text.contains(&format!("{key}:")), "example lacks `{key}`");
        }
    }
}
