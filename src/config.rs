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
//! # Compaction, snapshots and retention (top level only, as in Litestream).
//! levels:                              # L1..Ln compaction intervals (1 to 8 levels)
//!   - interval: 30s
//!   - interval: 5m
//!   - interval: 1h
//! snapshot:
//!   interval: 24h                      # level-9 snapshot cadence
//!   retention: 24h                     # how long snapshots are kept
//! l0-retention: 5m
//! l0-retention-check-interval: 15s
//! retention:
//!   enabled: true
//!
//! dbs:
//!   - path: /var/lib/app/app.db
//!     checkpoint-interval: 5m          # overrides the global value for this database
//!     replicas:
//!       - url: file:///backup/app      # or `path: /backup/app` (with optional `type: file`)
//!       - type: s3                     # or `url: s3://my-bucket/app?region=eu-west-1`
//!         bucket: my-bucket
//!         path: app                    # the key prefix inside the bucket
//!         region: eu-west-1
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
//!   for Litestream keys replicad does not implement (`sync-interval`, `mcp-addr`, ...).
//!   Duplicate keys are errors too, and so are unknown keys inside the maps `levels[]`,
//!   `snapshot`, `retention` and `logging`.
//! - Every error names the file, the key and the line when they are known:
//!   `config /etc/replicad.yml: line 7: unknown key `retention-foo` in dbs[0] (...)`.
//! - Setting keys (`monitor-interval`, `checkpoint-interval`, `min-checkpoint-page-count`,
//!   `truncate-page-n`, `full-verify-interval`, `compression`, `heartbeat-interval`,
//!   `verify-interval`, `lease-ttl`, `dormant-after`, `dormant-max-size`) may appear
//!   at the top level and in each database; the effective value is the database's key, else the
//!   top-level key, else the default ([`DbSettings::default`]).
//! - Compaction, snapshot and retention keys are **top level only, as in Litestream** (one
//!   schedule for every database; each database's settings get a copy):
//!   - `levels` (default `[30s, 5m, 1h]`): the compaction intervals of levels L1..Ln, a list
//!     of 1 to 8 maps `- interval: DURATION` (each > 0); L0 holds the files written as the WAL
//!     changes and L9 is the snapshot level. An empty list is an error (remove the key for the
//!     defaults).
//!   - `snapshot`: a map with `interval` (default 24h, > 0), how often a level-9 snapshot is
//!     written, and `retention` (default 24h, > 0), how long snapshots are kept.
//!   - `l0-retention` (default 5m): L0 files are deleted once compacted into L1 and older than
//!     this; `0s` disables the deletion of L0 files.
//!   - `l0-retention-check-interval` (default 15s, > 0): how often that rule is enforced.
//!   - `retention`: a map with `enabled` (default true); `false` means replicad never deletes
//!     remote files (leave it to the bucket's lifecycle rules).
//!
//!   In a database map these keys (and `shutdown-sync-timeout`) are errors saying they are
//!   top-level only. `snapshot` or `retention` with no value (all sub-keys commented
//!   out) means the defaults.
//! - `addr` (top level only, default off): where the HTTP endpoint listens (`/metrics`,
//!   `/healthz`, `/readyz`, see [`crate::ops::http`]). `":9090"` or `"9090"` means
//!   **127.0.0.1:9090**: unlike Litestream, which then listens on every interface, replicad
//!   binds the loopback address unless a host is given (`"0.0.0.0:9090"` for every interface,
//!   `"[::]:9090"`, `"10.0.0.5:9090"`, `"localhost:9090"`). An empty value means off. The
//!   host must be an IP address or `localhost`.
//! - `exec` (top level only, default none): a command run as a child once every database is
//!   open, as Litestream's `exec`. The string is split with shell-words rules (quotes and
//!   backslashes, no shell: no `$VAR`, pipes or globs; `sh -c "..."` for those). When the
//!   child exits, replicad does its normal shutdown and exits with the **child's exit code**
//!   (Litestream exits 1 on any failure); SIGTERM/SIGINT are forwarded to the child. The
//!   command line's `--exec` replaces it. An empty string or unbalanced quotes are errors.
//! - `logging` (top level only): a map with `level` (`trace`, `debug`, `info` (default),
//!   `warn`, `error`; any case), `type` (`text` (default) or `json`, one JSON object per
//!   line; Litestream's `pretty` is taken as `text`) and `stderr` (true or false). replicad
//!   **always logs to stderr**, whatever `stderr` says (Litestream logs to stdout unless it
//!   is true); the key is accepted so Litestream files load. `RUST_LOG` and the command
//!   line's `--log-level` take precedence over `level`. An empty `logging` means defaults.
//! - `socket` (top level only, as Litestream): a map with `enabled` (default false), `path`
//!   (default `/var/run/replicad.sock`) and `permissions` (an octal string, default
//!   `"0600"`): the control socket of `replicad sync` ([`crate::ops::control`]).
//! - `max-lag` (top level only, replicad's own, default 60s): `/readyz` reports a replica
//!   ready while it holds the database's TXID or its newest uploaded segment is less than
//!   this much older than the database's newest segment.
//! - Durations use Go syntax, as Litestream: `500ms`, `10s`, `1m`, `24h`, `1h30m`. A bare
//!   number (`10`) is an error asking for a unit.
//! - Paths (`path`, `meta-path`, a file replica's `path` or plain-path `url`) are made absolute
//!   against the current directory (not the config file's directory), with `~` expanded to
//!   `$HOME` as Litestream does, and normalised lexically ([`std::path::absolute`], then `.`
//!   components and duplicate or trailing slashes removed; `..` is kept because resolving it
//!   without the file system is wrong across symbolic links).
//! - `$VAR` and `${VAR}` are replaced by the environment variable before parsing (unset
//!   variables become the empty string, as Litestream), unless expansion is turned off. A `$`
//!   not followed by a name is kept as it is.
//! - Every database needs at least one replica; no two databases may share a path, and no two
//!   replicas (in any database) may share a destination: a directory for file replicas,
//!   (endpoint, bucket, path) for S3 replicas.
//! - A `dbs` entry may name a directory instead of one database (**directory discovery**,
//!   [`crate::daemon::discovery`]): `dir` (absolute after `~` expansion and
//!   [`std::path::absolute`]; `replicate` refuses to start unless it is an existing
//!   directory, [`Config::check_dirs`]),
//!   `pattern` (a glob on the file name, default `*`; the file header decides what is a
//!   database), `recursive` (default false) and `watch` (default false: only the databases
//!   present at start). `path` and `dir` together are an error, and so are `pattern`,
//!   `recursive` or `watch` without `dir`, and `meta-path` with `dir` (each discovered
//!   database keeps its state next to itself). The replicas and settings apply to every
//!   discovered database, each replica under the database's path relative to `dir`
//!   ([`DirConfig::replica_for`]).
//!
//! Replica types:
//!
//! - `file`: `url: file:///dir` or a plain path, or `path: /dir` (with optional `type: file`).
//! - `s3`: `type: s3` with `bucket` (required; letters, digits, `.`, `-`, `_`) and `path` (the
//!   key prefix, default none), or
//!   `url: s3://BUCKET/PATH?endpoint=...&region=...` (the query takes the same keys, see
//!   [`S3Config::from_url`]). Further keys, with Litestream's names and meanings: `region`,
//!   `endpoint`, `force-path-style` (default true when `endpoint` is set, else false),
//!   `access-key-id` and `secret-access-key` (both or neither; without them the standard AWS
//!   chain or `LITESTREAM_ACCESS_KEY_ID`/`LITESTREAM_SECRET_ACCESS_KEY` is used), `part-size`
//!   (bytes, `10MiB` or an integer; default 5 MiB), `concurrency` (default 5), `storage-class`,
//!   `sse-kms-key-id`, `sse-customer-key` and `skip-verify` (only `false`: TLS verification
//!   cannot be turned off). With `url`, only the secrets (`access-key-id`,
//!   `secret-access-key`, `sse-customer-key`) and `skip-verify` may be added as keys; `url`
//!   with `bucket` or `path` is an error, as in Litestream, and so is every other S3 key (it
//!   goes in the URL's query). S3 keys on a file replica are errors.
//! - Global replica settings, as Litestream: the S3 keys above (`bucket`, `region`,
//!   `endpoint`, `force-path-style`, `access-key-id`, `secret-access-key`, `part-size`,
//!   `concurrency`, `storage-class`, `sse-kms-key-id`, `sse-customer-key`, `skip-verify`) may
//!   appear at the top level (before or after `dbs`), with the same checks, as the defaults of
//!   every s3 replica that does not set them; the replica's own value wins. The credentials
//!   (`access-key-id` + `secret-access-key`) and the encryption (`sse-kms-key-id` or
//!   `sse-customer-key`) go as pairs: a replica setting either key of a pair takes neither
//!   from the top level. A `url` replica takes only those pairs (its URL holds the rest).
//!   File replicas ignore them. The top-level `path` is not a global key (unknown key error).
//! - Secrets (`secret-access-key`, `sse-customer-key`) never appear in an error message or in
//!   `Debug` output ([`Secret`]); credentials inside a URL (`s3://key:secret@bucket`) are
//!   rejected without echoing the URL. [`ReplicaConfig::url`] never holds credentials.
//!
//! A new type is a new arm of [`ReplicaKind`] plus its keys in the replica map.
//!
//! Implementation note: the file is read with `serde_norway` through hand-written visitors
//! rather than derived structs, because an error raised inside a visitor carries the line of
//! the YAML node being read: unknown and duplicate keys are reported at the key's line, bad
//! values at the value's line, and rules that involve several keys (such as `url` vs `path`,
//! or an S3 key on a file replica) at the line where the map starts.

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use crate::ltx::Codec;
use crate::storage::AnyClient;
use crate::storage::age::keys::AgeKeys;
use crate::storage::s3::{
    DEFAULT_PART_SIZE, S3Client, S3Config, Secret, parse_size, reject_skip_verify,
};

/// Default of `lease-ttl`: how long a replica's single-writer lease stays valid unrefreshed.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(600);
/// Smallest accepted `lease-ttl`.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
/// Default of `max-lag`.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(60);
/// Default of `shutdown-sync-timeout`.
pub const DEFAULT_SHUTDOWN_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `truncate-page-n` (Litestream's): the WAL size in pages above which a checkpoint
/// truncates the WAL.
pub const DEFAULT_TRUNCATE_PAGE_N: u32 = 121_359;

/// Default of `levels`: the compaction intervals of L1, L2 and L3 (Litestream's).
pub const DEFAULT_LEVELS: [Duration; 3] = [
    Duration::from_secs(30),
    Duration::from_secs(5 * 60),
    Duration::from_secs(60 * 60),
];
/// Most compaction levels in `levels` (L1..L8): level 9 is the snapshot level.
pub const MAX_LEVELS: usize = 8;
/// Default of `snapshot.interval`.
pub const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default of `snapshot.retention`.
pub const DEFAULT_SNAPSHOT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// Default of `l0-retention`.
pub const DEFAULT_L0_RETENTION: Duration = Duration::from_secs(5 * 60);
/// Default of `l0-retention-check-interval`.
pub const DEFAULT_L0_RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(15);

/// Origin used in errors from [`Config::single`].
const COMMAND_LINE: &str = "command line";

/// The whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The databases to replicate, in file order (`dbs` and `dirs` are never both empty).
    pub dbs: Vec<DbConfig>,
    /// The `dbs` entries with `dir`: directories whose databases are discovered, in file
    /// order.
    pub dirs: Vec<DirConfig>,
    /// Key `shutdown-sync-timeout` (top level only, default 30s): how long a shutdown waits
    /// for the last changes to reach the replicas. `0s` means do not wait.
    pub shutdown_sync_timeout: Duration,
    /// Key `addr` (top level only, default off): where the HTTP endpoint listens. A port
    /// without a host (`":9090"`, `"9090"`) means 127.0.0.1, not every interface.
    pub addr: Option<std::net::SocketAddr>,
    /// Key `max-lag` (top level only, default 60s): how far behind its database a replica may
    /// be and still be ready (`/readyz`).
    pub max_lag: Duration,
    /// Key `exec` (top level only, default none): the child command, split into program and
    /// arguments (never empty when set). See the module rules.
    pub exec: Option<Vec<String>>,
    /// Key `logging` (top level only).
    pub logging: LoggingConfig,
    /// Key `socket` (top level only, default off): the control socket (`replicad sync`).
    pub socket: SocketConfig,
}

/// Default of `socket.path`.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/replicad.sock";

/// The `socket` map: the Unix-socket control endpoint ([`crate::ops::control`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SocketConfig {
    /// Key `enabled` (default false).
    pub enabled: bool,
    /// Key `path` (default `/var/run/replicad.sock`).
    pub path: PathBuf,
    /// Key `permissions` (an octal string, default `"0600"`): the socket file's mode.
    pub permissions: u32,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            enabled: false,
            path: PathBuf::from(DEFAULT_SOCKET_PATH),
            permissions: 0o600,
        }
    }
}

/// The `logging` map.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoggingConfig {
    /// Key `level`: `trace`, `debug`, `info`, `warn` or `error` (lower case here); `None`
    /// means the command line's `--log-level` (default `info`). `RUST_LOG` overrides it.
    pub level: Option<String>,
    /// Key `type` (default `text`).
    pub format: LogFormat,
    /// Key `stderr` (default false). Accepted for Litestream compatibility; replicad always
    /// logs to stderr.
    pub stderr: bool,
}

/// Key `logging.type`: how log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (`text`, or Litestream's `pretty`).
    #[default]
    Text,
    /// One JSON object per line (`json`).
    Json,
}

/// Splits an `exec` command line with shell-words rules (no shell); refuses an empty one.
pub fn split_exec(cmd: &str) -> Result<Vec<String>, String> {
    let argv = shell_words::split(cmd).map_err(|e| format!("invalid command {cmd:?}: {e}"))?;
    if argv.is_empty() {
        return Err("the command is empty".into());
    }
    Ok(argv)
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

/// A `dbs` entry with `dir`: every SQLite database found under a directory
/// ([`crate::daemon::discovery`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DirConfig {
    /// Key `dir` (required instead of `path`): absolute; `replicate` checks that it exists
    /// ([`Config::check_dirs`]).
    pub dir: PathBuf,
    /// Key `pattern` (default `*`): a glob on the file name (valid for [`globset`]).
    pub pattern: String,
    /// Key `recursive` (default false): look into subdirectories too.
    pub recursive: bool,
    /// Key `watch` (default false): add and remove databases while running.
    pub watch: bool,
    /// The replicas of every discovered database, before [`DirConfig::replica_for`].
    pub replicas: Vec<ReplicaConfig>,
    /// Effective settings of every discovered database.
    pub settings: DbSettings,
}

impl DirConfig {
    /// The configuration of the database at `rel` (relative to `dir`, no `..`): the same
    /// settings, each replica moved under `rel` ([`replica_under`]), state next to the file.
    pub fn db(&self, rel: &Path) -> DbConfig {
        DbConfig {
            path: self.dir.join(rel),
            meta_path: None,
            replicas: self
                .replicas
                .iter()
                .map(|r| replica_under(r, rel))
                .collect(),
            settings: self.settings.clone(),
        }
    }
}

/// `replica` moved under the relative path `rel` of a discovered database: a file replica
/// `file:///backup` becomes `file:///backup/<rel>`, an S3 replica with prefix `p` gets the
/// prefix `p/<rel>` (`<rel>` alone when `p` is empty). `rel` uses `/` on every platform
/// replicad runs on, so it is the key suffix as it is.
pub fn replica_under(replica: &ReplicaConfig, rel: &Path) -> ReplicaConfig {
    let rel = rel.to_string_lossy();
    let rel = rel.trim_matches('/');
    match &replica.s3 {
        Some(cfg) => {
            let mut cfg = cfg.clone();
            let base = cfg.path.trim_end_matches('/');
            cfg.path = if base.is_empty() {
                rel.to_string()
            } else {
                format!("{base}/{rel}")
            };
            ReplicaConfig {
                name: replica.name.clone(),
                url: s3_url(&cfg),
                s3: Some(cfg),
                age: replica.age.clone(),
            }
        }
        None => ReplicaConfig {
            name: replica.name.clone(),
            url: format!("{}/{rel}", replica.url.trim_end_matches('/')),
            s3: None,
            age: replica.age.clone(),
        },
    }
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
    /// Key `verify-interval` (default 0s = off): how often each replica is restored into a
    /// temporary directory and checked (`integrity_check`, checksums); the result is the
    /// metric `replicad_replica_verify_ok`.
    pub verify_interval: Duration,
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
    /// Key `lease-ttl` (default 10m, at least 1s): how long the single-writer lease on each
    /// replica stays valid without a refresh ([`crate::replicate::lease`]); it is refreshed every half
    /// of it. Another instance takes over a replica whose lease is older than this.
    pub lease_ttl: Duration,
    /// Key `dormant-after` (default 30s; `0s` = never): a database whose WAL has not changed
    /// for this long releases its SQLite connection (and its read transaction, descriptors
    /// and shared-memory mapping) until it changes again; see [`crate::replicate::db`] on dormancy.
    pub dormant_after: Duration,
    /// Key `dormant-max-size` (default 64MiB): only databases up to this size go dormant, as
    /// waking one after the application restarted the WAL costs a full segment.
    pub dormant_max_size: u64,
    /// Key `levels` (top level only; default 30s, 5m, 1h): the compaction intervals of levels
    /// L1..Ln, `levels[0]` being L1. Every `levels[i]`, the files of the level below are
    /// compacted into one file of level i+1. 1 to [`MAX_LEVELS`] entries, each > 0.
    pub levels: Vec<Duration>,
    /// Key `snapshot.interval` (top level only; default 24h, must be > 0): how often a
    /// snapshot (level 9) of the database is written.
    pub snapshot_interval: Duration,
    /// Key `snapshot.retention` (top level only; default 24h, must be > 0): how long
    /// snapshots are kept.
    pub snapshot_retention: Duration,
    /// Key `l0-retention` (top level only; default 5m): L0 files are deleted once they have
    /// been compacted into L1 and are older than this. `0s` disables the deletion of L0 files.
    pub l0_retention: Duration,
    /// Key `l0-retention-check-interval` (top level only; default 15s, must be > 0): how
    /// often the `l0-retention` rule is enforced.
    pub l0_retention_check_interval: Duration,
    /// Key `retention.enabled` (top level only; default true): `false` means remote files
    /// are never deleted (neither snapshots past `snapshot.retention` nor L0 files past
    /// `l0-retention`): deletion is left to the bucket's lifecycle rules.
    pub retention_enabled: bool,
}

impl Default for DbSettings {
    fn default() -> Self {
        DbSettings {
            monitor_interval: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(60),
            verify_interval: Duration::ZERO,
            min_checkpoint_page_count: 1000,
            truncate_page_n: DEFAULT_TRUNCATE_PAGE_N,
            full_verify_interval: Duration::from_secs(60),
            compression: Codec::Zstd(crate::ltx::codec::DEFAULT_ZSTD_LEVEL),
            heartbeat_interval: Duration::from_secs(60),
            lease_ttl: DEFAULT_LEASE_TTL,
            dormant_after: Duration::from_secs(30),
            dormant_max_size: 64 * 1024 * 1024,
            levels: DEFAULT_LEVELS.to_vec(),
            snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
            snapshot_retention: DEFAULT_SNAPSHOT_RETENTION,
            l0_retention: DEFAULT_L0_RETENTION,
            l0_retention_check_interval: DEFAULT_L0_RETENTION_CHECK_INTERVAL,
            retention_enabled: true,
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
            ("snapshot.interval", self.snapshot_interval),
            ("snapshot.retention", self.snapshot_retention),
            (
                "l0-retention-check-interval",
                self.l0_retention_check_interval,
            ),
        ] {
            if value.is_zero() {
                return Err(format!("{key} must be greater than zero"));
            }
        }
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err("lease-ttl must be at least 1s".into());
        }
        if self.levels.is_empty() {
            return Err(EMPTY_LEVELS.into());
        }
        if self.levels.len() > MAX_LEVELS {
            return Err(too_many_levels(&format!(
                "`levels` has {} entries",
                self.levels.len()
            )));
        }
        if let Some(i) = self.levels.iter().position(|d| d.is_zero()) {
            return Err(format!(
                "levels[{i}] (L{}): interval must be greater than zero",
                i + 1
            ));
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
    /// Key `name`: unique within the database. Default: the type (`file`, `s3`) for the first
    /// replica, `<type>-N` for the replica at position N (1-based) after that.
    pub name: String,
    /// Where the replica is, for logs and listings; never holds credentials.
    ///
    /// File replicas: always `file:///absolute/path`, whether given as `url` (`file://` or a
    /// plain path) or as `path` (with optional `type: file`); accepted by
    /// [`AnyClient::from_url`]. S3 replicas: `s3://BUCKET/PATH` (`s3://BUCKET` without a
    /// prefix), without the endpoint and other settings, which are in [`ReplicaConfig::s3`].
    /// Build clients with [`ReplicaConfig::client`].
    pub url: String,
    /// The settings of an S3 replica (`None` for file replicas). Its `Debug` output redacts
    /// the secrets.
    pub s3: Option<S3Config>,
    /// Key `age`: the recipients new files are encrypted to and the identities that read
    /// encrypted files, loaded (and checked) when the config is read. `None`: plain. Its
    /// `Debug` output names identities by source and public key only.
    pub age: Option<Arc<AgeKeys>>,
}

impl ReplicaConfig {
    /// Builds the client of this replica (nothing is contacted yet).
    pub fn client(&self) -> Result<AnyClient, String> {
        match &self.s3 {
            Some(cfg) => Ok(AnyClient::S3(S3Client::new(cfg.clone()))),
            None => AnyClient::from_url(&self.url),
        }
    }

    /// The client to replicate and restore with: [`ReplicaConfig::client`] seen through both
    /// plain and age-encrypted names, with this replica's keys (see [`crate::storage::age`]).
    pub fn age_client(&self) -> Result<AnyClient, String> {
        let keys = self.age.clone().unwrap_or_default();
        Ok(self.client()?.with_age(keys))
    }

    /// The destination, as compared by the rule "no two replicas share a destination".
    fn destination(&self) -> Destination {
        Destination::of(&self.url, self.s3.as_ref())
    }
}

/// The kind of a replica: decides which keys and URL schemes are valid.
///
/// Adding a destination means a new arm here and in each `match` on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaKind {
    /// A local directory (`type: file`, `file://` URL or plain path).
    File,
    /// An S3-compatible bucket (`type: s3` or `s3://` URL).
    S3,
}

impl ReplicaKind {
    /// The `type` value, also the default replica name.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaKind::File => "file",
            ReplicaKind::S3 => "s3",
        }
    }

    /// Parses a `type` value.
    fn from_type(t: &str) -> Result<ReplicaKind, String> {
        match t {
            "file" => Ok(ReplicaKind::File),
            "s3" => Ok(ReplicaKind::S3),
            other => Err(unsupported_type(other)),
        }
    }

    /// The kind named by a URL's scheme; no scheme means a file path.
    fn from_url(url: &str) -> Result<ReplicaKind, String> {
        match url.split_once("://") {
            None | Some(("file", _)) => Ok(ReplicaKind::File),
            Some(("s3", _)) => Ok(ReplicaKind::S3),
            Some((scheme, _)) => Err(unsupported_type(scheme)),
        }
    }

    /// Parses a URL of this kind: the normalised URL ([`ReplicaConfig::url`]) and, for S3,
    /// the settings the URL gives. Checks that a client can be built from it.
    fn parse_url(self, url: &str) -> Result<(String, Option<S3Config>), String> {
        reject_userinfo(url)?;
        match self {
            ReplicaKind::File => {
                let path = match url.strip_prefix("file://") {
                    Some(rest) if !rest.starts_with('/') => {
                        return Err(format!("file URL {url:?} must be absolute (file:///path)"));
                    }
                    Some(rest) => rest,
                    None => url,
                };
                let normalized = file_url_from_path(path)?;
                Ok((normalized, None))
            }
            ReplicaKind::S3 => {
                let cfg = S3Config::from_url(url)?;
                Ok((s3_url(&cfg), Some(cfg)))
            }
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
}

fn unsupported_type(t: &str) -> String {
    format!("replica type {t} is not supported yet")
}

/// The `file://` URL of a file replica given by a path (or the path part of a `file://` URL).
fn file_url_from_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("empty replica path".into());
    }
    let normalized = file_url(&absolutize(Path::new(path))?);
    AnyClient::from_url(&normalized).map_err(|e| format!("invalid replica URL: {e}"))?;
    Ok(normalized)
}

/// [`ReplicaConfig::url`] of an S3 replica.
fn s3_url(cfg: &S3Config) -> String {
    if cfg.path.is_empty() {
        format!("s3://{}", cfg.bucket)
    } else {
        format!("s3://{}/{}", cfg.bucket, cfg.path)
    }
}

/// The authority part (`user:secret@host`) of `scheme://authority/...`, if any.
fn authority(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some((scheme, &rest[..end], &rest[end..]))
}

/// Credentials in a URL would be shown wherever the URL is (logs, `replicad databases`).
/// The error does not echo the URL.
fn reject_userinfo(url: &str) -> Result<(), String> {
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
fn redact_userinfo(url: &str) -> String {
    match authority(url) {
        Some((scheme, auth, rest)) if auth.contains('@') => {
            let host = auth.rsplit_once('@').map_or("", |(_, h)| h);
            format!("{scheme}://<redacted>@{host}{rest}")
        }
        _ => url.to_string(),
    }
}

/// Where a replica writes: two replicas with the same destination would overwrite each other.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Destination {
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
    fn of(url: &str, s3: Option<&S3Config>) -> Destination {
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
            Config::parse_with_env(text, origin, |name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
        } else {
            parse_yaml(text, origin)
        }
    }

    /// [`Config::parse`] with expansion, variables looked up by `lookup` (tests cannot set the
    /// process environment safely).
    fn parse_with_env(
        text: &str,
        origin: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        parse_yaml(&expand_vars(text, lookup), origin)
    }

    /// One database with replicas from the command line (`replicad replicate DB URL...`),
    /// settings = defaults overridden by `settings` (build it from [`DbSettings::default`]).
    /// Applies the file's rules: at least one URL, supported and valid URLs (`file://`, plain
    /// paths, `s3://BUCKET/PATH?...` with credentials from the AWS chain), no destination
    /// twice, non-zero intervals; `truncate_page_n == 0` means the default.
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
            let in_url =
                |e: String| invalid(format!("{e} (replica URL {:?})", redact_userinfo(raw)));
            let kind = ReplicaKind::from_url(raw).map_err(in_url)?;
            let (url, s3) = kind.parse_url(raw).map_err(in_url)?;
            let replica = ReplicaConfig {
                name: kind.default_name(i),
                url,
                s3,
                age: None,
            };
            let dest = replica.destination();
            if replicas.iter().any(|r| r.destination() == dest) {
                return Err(invalid(format!("{dest} is given twice")));
            }
            replicas.push(replica);
        }
        Ok(Config {
            dbs: vec![DbConfig {
                path,
                meta_path: None,
                replicas,
                settings,
            }],
            dirs: Vec::new(),
            shutdown_sync_timeout: DEFAULT_SHUTDOWN_SYNC_TIMEOUT,
            addr: None,
            max_lag: DEFAULT_MAX_LAG,
            exec: None,
            logging: LoggingConfig::default(),
            socket: SocketConfig::default(),
        })
    }

    /// Checks that every `dir` entry names an existing directory: `replicate` refuses to start
    /// otherwise (a typo must not start a daemon that replicates nothing).
    pub fn check_dirs(&self) -> Result<(), String> {
        for d in &self.dirs {
            match std::fs::metadata(&d.dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("dir {} is not a directory", d.dir.display())),
                Err(e) => return Err(format!("dir {}: {e}", d.dir.display())),
            }
        }
        Ok(())
    }

    /// The configuration a `dir` entry gives the database at `path` (which need not exist:
    /// a restore target): the first entry whose `dir` holds `path` at an allowed depth and
    /// whose `pattern` matches its name. For `--config FILE DB_PATH` commands.
    pub fn find_discovered(&self, path: &Path) -> Option<DbConfig> {
        let abs = absolutize(path).ok()?;
        self.dirs.iter().find_map(|d| {
            let rel = abs.strip_prefix(&d.dir).ok()?;
            let name = rel.file_name()?;
            let depth_ok = d.recursive || rel.components().count() == 1;
            let matches = globset::Glob::new(&d.pattern)
                .ok()?
                .compile_matcher()
                .is_match(name);
            (depth_ok && matches).then(|| d.db(rel))
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

const SETTING_KEYS: [&str; 11] = [
    "monitor-interval",
    "checkpoint-interval",
    "min-checkpoint-page-count",
    "truncate-page-n",
    "full-verify-interval",
    "compression",
    "heartbeat-interval",
    "verify-interval",
    "lease-ttl",
    "dormant-after",
    "dormant-max-size",
];
/// Keys of the top level that are errors in a database map ("top-level only").
const TOP_ONLY_KEYS: [&str; 11] = [
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
];
const ROOT_KEYS: &[&str] = &[
    "dbs",
    TOP_ONLY_KEYS[0],
    TOP_ONLY_KEYS[1],
    TOP_ONLY_KEYS[2],
    TOP_ONLY_KEYS[3],
    TOP_ONLY_KEYS[4],
    TOP_ONLY_KEYS[5],
    TOP_ONLY_KEYS[6],
    TOP_ONLY_KEYS[7],
    TOP_ONLY_KEYS[8],
    TOP_ONLY_KEYS[9],
    TOP_ONLY_KEYS[10],
    SETTING_KEYS[0],
    SETTING_KEYS[1],
    SETTING_KEYS[2],
    SETTING_KEYS[3],
    SETTING_KEYS[4],
    SETTING_KEYS[5],
    SETTING_KEYS[6],
    SETTING_KEYS[7],
    SETTING_KEYS[8],
    SETTING_KEYS[9],
    SETTING_KEYS[10],
    // Global replica defaults (see `S3_GLOBAL_KEYS`).
    S3_KEYS[0],
    S3_KEYS[1],
    S3_KEYS[2],
    S3_KEYS[3],
    S3_KEYS[4],
    S3_KEYS[5],
    S3_KEYS[6],
    S3_KEYS[7],
    S3_KEYS[8],
    S3_KEYS[9],
    S3_KEYS[10],
    S3_KEYS[11],
];
const DB_KEYS: &[&str] = &[
    "path",
    "dir",
    "pattern",
    "recursive",
    "watch",
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
    SETTING_KEYS[7],
    SETTING_KEYS[8],
    SETTING_KEYS[9],
    SETTING_KEYS[10],
];
/// Keys of one `levels` entry.
const LEVEL_KEYS: &[&str] = &["interval"];
/// Keys of the `snapshot` map.
const SNAPSHOT_KEYS: &[&str] = &["interval", "retention"];
/// Keys of the `retention` map.
const RETENTION_KEYS: &[&str] = &["enabled"];
/// Keys of a replica's `age` map.
const AGE_KEYS: &[&str] = &["recipients", "identities"];
/// Keys of the `logging` map.
const LOGGING_KEYS: &[&str] = &["level", "type", "stderr"];
const REPLICA_KEYS: &[&str] = &[
    "name",
    "age",
    "type",
    "path",
    "url",
    S3_KEYS[0],
    S3_KEYS[1],
    S3_KEYS[2],
    S3_KEYS[3],
    S3_KEYS[4],
    S3_KEYS[5],
    S3_KEYS[6],
    S3_KEYS[7],
    S3_KEYS[8],
    S3_KEYS[9],
    S3_KEYS[10],
    S3_KEYS[11],
];
/// Replica keys of S3 replicas only.
const S3_KEYS: [&str; 12] = [
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
const S3_KEYS_WITH_URL: [&str; 4] = [
    "access-key-id",
    "secret-access-key",
    "sse-customer-key",
    "skip-verify",
];
/// S3's maximum size of one part of a multipart upload.
const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;

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
    /// Replica destinations seen so far, with their database index.
    replica_dests: RefCell<Vec<(Destination, usize)>>,
    /// The top-level S3 keys (global replica defaults), read by a first pass over the file
    /// so that they are known whatever their position relative to `dbs`.
    s3_defaults: RawS3,
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
    // First pass: the global replica defaults only. An error raised on one of those keys is
    // reported as it is; any other problem is left to the second pass, which reports it with
    // its key and line.
    let first = Ctx::default();
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
        ..Ctx::default()
    };
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

/// `addr`: `[HOST]:PORT` or `PORT`; no host means 127.0.0.1 (see the module rules); empty
/// means off.
fn listen_addr(s: Scalar<'_>) -> Result<Option<std::net::SocketAddr>, String> {
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

fn positive_duration(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

fn lease_ttl(s: Scalar<'_>) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < MIN_LEASE_TTL {
        return Err("must be at least 1s".into());
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

fn boolean(s: Scalar<'_>) -> Result<bool, String> {
    match s {
        Scalar::Bool(b) => Ok(b),
        other => Err(format!("expected true or false, found {other}")),
    }
}

/// A secret: a non-empty string, never echoed in errors. A number is refused rather than
/// converted, since YAML may have changed its spelling (`0x1F`, `+1`, `1e3`).
fn secret(s: Scalar<'_>) -> Result<Secret, String> {
    match s {
        Scalar::Str("") | Scalar::Null => Err("the value is empty".into()),
        Scalar::Str(v) => Ok(Secret(v.to_string())),
        _ => Err("the value is not a string: quote it (the value is not shown)".into()),
    }
}

fn bucket(s: Scalar<'_>) -> Result<String, String> {
    let b = text(s)?;
    if b.contains('/') {
        return Err(format!(
            "bucket {b:?} contains `/`: give the key prefix in `path`"
        ));
    }
    crate::storage::s3::check_bucket_name(&b)?;
    Ok(b)
}

/// Bytes, as an integer or with a unit (`64MiB`).
fn byte_size(s: Scalar<'_>) -> Result<u64, String> {
    match s {
        Scalar::Str(v) => parse_size(v),
        Scalar::Int(i) => u64::try_from(i).map_err(|_| format!("{i} is not a size in bytes")),
        other => Err(format!(
            "expected a size in bytes such as 64MiB or 67108864, found {other}"
        )),
    }
}

/// `part-size`: bytes, as an integer or with a unit (`10MiB`), within S3's part size limits.
fn part_size(s: Scalar<'_>) -> Result<u64, String> {
    let n = match s {
        Scalar::Str(v) => parse_size(v)?,
        Scalar::Int(i) => u64::try_from(i).map_err(|_| format!("{i} is not a size in bytes"))?,
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

fn concurrency(s: Scalar<'_>) -> Result<usize, String> {
    match s {
        Scalar::Int(i) if i >= 1 => usize::try_from(i).map_err(|_| format!("{i} is out of range")),
        Scalar::Int(i) => Err(format!("{i}: must be at least 1")),
        other => Err(format!("expected a whole number, found {other}")),
    }
}

fn skip_verify(s: Scalar<'_>) -> Result<(), String> {
    reject_skip_verify(boolean(s)?)
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
    /// Keys refused with "top-level only" rather than "unknown" (in database maps).
    top_only: &'static [&'static str],
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
    verify_interval: Option<Duration>,
    lease_ttl: Option<Duration>,
    dormant_after: Option<Duration>,
    dormant_max_size: Option<u64>,
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
            "verify-interval" => {
                self.verify_interval = Some(map.next_value_seed(seed(ctx, key, place, &duration))?)
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
            "lease-ttl" => {
                self.lease_ttl = Some(map.next_value_seed(seed(ctx, key, place, &lease_ttl))?)
            }
            "dormant-after" => {
                self.dormant_after = Some(map.next_value_seed(seed(ctx, key, place, &duration))?)
            }
            "dormant-max-size" => {
                self.dormant_max_size =
                    Some(map.next_value_seed(seed(ctx, key, place, &byte_size))?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Effective settings: `self`, else `global`, else the defaults (the top-level-only keys
    /// keep their defaults here).
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
            verify_interval: self
                .verify_interval
                .or(global.verify_interval)
                .unwrap_or(d.verify_interval),
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
            lease_ttl: self.lease_ttl.or(global.lease_ttl).unwrap_or(d.lease_ttl),
            dormant_after: self
                .dormant_after
                .or(global.dormant_after)
                .unwrap_or(d.dormant_after),
            dormant_max_size: self
                .dormant_max_size
                .or(global.dormant_max_size)
                .unwrap_or(d.dormant_max_size),
            // The top-level-only keys are set by `RawCompaction::apply`.
            ..d
        }
    }
}

/// The top-level-only keys of compaction, snapshots and retention, as read.
#[derive(Default)]
struct RawCompaction {
    levels: Option<Vec<Duration>>,
    snapshot_interval: Option<Duration>,
    snapshot_retention: Option<Duration>,
    l0_retention: Option<Duration>,
    l0_retention_check_interval: Option<Duration>,
    retention_enabled: Option<bool>,
}

impl RawCompaction {
    /// Reads the value of `key` if it is one of these keys; returns whether it was.
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: &'static str,
        map: &mut A,
        ctx: &Ctx,
        place: &str,
    ) -> Result<bool, A::Error> {
        let value = |convert| ValueSeed {
            ctx,
            key,
            place,
            convert,
        };
        match key {
            "levels" => self.levels = Some(map.next_value_seed(LevelsSeed { ctx })?),
            "snapshot" => {
                let section = map.next_value_seed(SectionSeed {
                    ctx,
                    name: key.to_string(),
                    keys: SNAPSHOT_KEYS,
                    required: false,
                    convert: &|_, s| positive_duration(s),
                    hint: "",
                    refuse: None,
                })?;
                for (k, v) in section {
                    match k {
                        "interval" => self.snapshot_interval = Some(v),
                        _ => self.snapshot_retention = Some(v),
                    }
                }
            }
            "l0-retention" => self.l0_retention = Some(map.next_value_seed(value(&duration))?),
            "l0-retention-check-interval" => {
                self.l0_retention_check_interval =
                    Some(map.next_value_seed(value(&positive_duration))?)
            }
            "retention" => {
                let section = map.next_value_seed(SectionSeed {
                    ctx,
                    name: key.to_string(),
                    keys: RETENTION_KEYS,
                    required: false,
                    convert: &|_, s| boolean(s),
                    hint: " (how long snapshots are kept is `retention` inside `snapshot`)",
                    refuse: None,
                })?;
                for (_, enabled) in section {
                    self.retention_enabled = Some(enabled);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Sets the keys that were given on `s`; the others keep their value.
    fn apply(&self, s: &mut DbSettings) {
        if let Some(levels) = &self.levels {
            s.levels.clone_from(levels);
        }
        if let Some(v) = self.snapshot_interval {
            s.snapshot_interval = v;
        }
        if let Some(v) = self.snapshot_retention {
            s.snapshot_retention = v;
        }
        if let Some(v) = self.l0_retention {
            s.l0_retention = v;
        }
        if let Some(v) = self.l0_retention_check_interval {
            s.l0_retention_check_interval = v;
        }
        if let Some(v) = self.retention_enabled {
            s.retention_enabled = v;
        }
    }
}

const EMPTY_LEVELS: &str = "`levels` is empty: give at least one compaction level \
                            (`- interval: 30s`), or remove the key for the defaults (30s, 5m, 1h)";

/// `what`, followed by the rule on the number of levels.
fn too_many_levels(what: &str) -> String {
    format!(
        "{what}: at most {MAX_LEVELS} compaction levels (L1..L{MAX_LEVELS}; level 9 is the \
         snapshot level, set by `snapshot`)"
    )
}

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
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.$method(Scalar::Float(v))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            self.$method(Scalar::Bool(v))
        }
    };
}

/// The `levels` list: the intervals of L1..Ln.
struct LevelsSeed<'a> {
    ctx: &'a Ctx,
}

impl LevelsSeed<'_> {
    fn not_a_list<E: de::Error>(&self, found: impl fmt::Display) -> Result<Vec<Duration>, E> {
        Err(self.ctx.fail(format!(
            "`levels` takes a list of maps such as `- interval: 30s`, found {found}"
        )))
    }

    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<Duration>, E> {
        self.not_a_list(s)
    }
}

impl<'de> DeserializeSeed<'de> for LevelsSeed<'_> {
    type Value = Vec<Duration>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<Duration>, D::Error> {
        // `any`: a map or a scalar must reach its `visit_` method for a clear error.
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LevelsSeed<'_> {
    type Value = Vec<Duration>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of compaction levels")
    }
    visit_scalars!(scalar);
    fn visit_unit<E: de::Error>(self) -> Result<Vec<Duration>, E> {
        Err(self.ctx.fail(EMPTY_LEVELS.into()))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Vec<Duration>, A::Error> {
        self.not_a_list("a map")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Duration>, A::Error> {
        let mut levels = Vec::new();
        loop {
            let index = levels.len();
            let Some(mut level) = seq.next_element_seed(SectionSeed {
                ctx: self.ctx,
                name: format!("levels[{index}]"),
                keys: LEVEL_KEYS,
                required: true,
                convert: &|_, s| positive_duration(s),
                hint: " (write `- interval: 30s`)",
                refuse: (index >= MAX_LEVELS)
                    .then(|| too_many_levels(&format!("too many levels (levels[{index}])"))),
            })?
            else {
                break;
            };
            let Some((_, interval)) = level.pop() else {
                return Err(self
                    .ctx
                    .fail(format!("internal error: levels[{index}] has no interval")));
            };
            levels.push(interval);
        }
        if levels.is_empty() {
            return Err(self.ctx.fail(EMPTY_LEVELS.into()));
        }
        Ok(levels)
    }
}

/// A map of scalars of one kind under a top-level key (`snapshot`, `retention`) or in a list
/// (one entry of `levels`): its keys, in file order, with their converted values.
struct SectionSeed<'a, T> {
    ctx: &'a Ctx,
    /// How errors name the map: `snapshot`, `levels[0]`.
    name: String,
    keys: &'static [&'static str],
    /// Whether every key is required; else absent keys keep their defaults and an empty value
    /// (every key commented out) means all defaults.
    required: bool,
    /// Converts the value of a key (the key decides the kind when a map mixes kinds).
    convert: &'a dyn Fn(&str, Scalar<'_>) -> Result<T, String>,
    /// Added to the error when the value is not a map.
    hint: &'static str,
    /// Refuse the value, whatever it is, with this message (a level beyond the last).
    refuse: Option<String>,
}

impl<T> SectionSeed<'_, T> {
    /// The refusal, if any.
    fn check<E: de::Error>(&self) -> Result<(), E> {
        match &self.refuse {
            Some(message) => Err(self.ctx.fail(message.clone())),
            None => Ok(()),
        }
    }

    fn not_a_map<E: de::Error>(
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

    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<(&'static str, T)>, E> {
        self.not_a_map(s)
    }

    fn missing<E: de::Error>(&self, seen: &[&str]) -> Result<(), E> {
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

/// First pass over the top-level map: the global replica defaults (the S3 keys at the top
/// level, as Litestream's global replica settings). Every other key is skipped.
struct GlobalsSeed<'a> {
    ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for GlobalsSeed<'_> {
    type Value = RawS3;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawS3, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for GlobalsSeed<'_> {
    type Value = RawS3;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawS3, A::Error> {
        let (ctx, place) = (self.ctx, "at the top level");
        let mut globals = RawS3::default();
        let mut seen: Vec<&'static str> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match S3_KEYS.iter().copied().find(|k| *k == key) {
                // A duplicate is reported by the second pass.
                Some(key) if !seen.contains(&key) => {
                    seen.push(key);
                    globals.read(key, &mut map, ctx, place)?;
                }
                _ => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        // The rules that involve several keys, as on a replica.
        if globals.access_key_id.is_some() != globals.secret_access_key.is_some() {
            return Err(ctx.fail(format!(
                "keys `access-key-id` and `secret-access-key` go together {place}"
            )));
        }
        if globals.sse_kms_key_id.is_some() && globals.sse_customer_key.is_some() {
            return Err(ctx.fail(format!(
                "keys `sse-kms-key-id` and `sse-customer-key` are mutually exclusive {place} \
                 (S3 accepts one server-side encryption per object)"
            )));
        }
        let mut probe = globals.clone().into_config(None);
        probe.bucket = "probe".into();
        probe
            .validate()
            .map_err(|e| ctx.fail(format!("{e} {place}")))?;
        Ok(globals)
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
        let mut compaction = RawCompaction::default();
        let mut dbs = None;
        let mut shutdown_sync_timeout = None;
        let mut addr = None;
        let mut max_lag = None;
        let mut exec = None;
        let mut logging = LoggingConfig::default();
        let mut socket = SocketConfig::default();
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: ROOT_KEYS,
            top_only: &[],
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
                "addr" => {
                    addr = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &listen_addr,
                    })?
                }
                "max-lag" => {
                    max_lag = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &duration,
                    })?)
                }
                "exec" => {
                    exec = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &|s| split_exec(&text(s)?),
                    })?)
                }
                "logging" => {
                    logging = logging_from(read_section(
                        &mut map,
                        ctx,
                        key,
                        LOGGING_KEYS,
                        &logging_field,
                    )?)
                }
                "socket" => {
                    socket = socket_from(read_section(
                        &mut map,
                        ctx,
                        key,
                        SOCKET_KEYS,
                        &socket_field,
                    )?)
                }
                _ => {
                    // Global S3 keys were taken by the first pass (`GlobalsSeed`); read
                    // again here only to consume (and check) the value.
                    if !settings.read(key, &mut map, ctx, place)?
                        && !compaction.read(key, &mut map, ctx, place)?
                        && !RawS3::default().read(key, &mut map, ctx, place)?
                    {
                        return Err(ctx.fail(format!("internal error: key `{key}` {place}")));
                    }
                }
            }
        }
        let Some(entries) = dbs else {
            return Err(ctx.fail(format!("missing key `dbs`: {NO_DBS}")));
        };
        let mut dbs = Vec::new();
        let mut dirs = Vec::new();
        for db in entries {
            let mut db_settings = db.settings.resolve(&settings);
            compaction.apply(&mut db_settings);
            match db.source {
                Source::Path(path) => dbs.push(DbConfig {
                    settings: db_settings,
                    path,
                    meta_path: db.meta_path,
                    replicas: db.replicas,
                }),
                Source::Dir(d) => dirs.push(DirConfig {
                    dir: d.dir,
                    pattern: d.pattern,
                    recursive: d.recursive,
                    watch: d.watch,
                    replicas: db.replicas,
                    settings: db_settings,
                }),
            }
        }
        Ok(Config {
            dbs,
            dirs,
            shutdown_sync_timeout: shutdown_sync_timeout.unwrap_or(DEFAULT_SHUTDOWN_SYNC_TIMEOUT),
            addr,
            max_lag: max_lag.unwrap_or(DEFAULT_MAX_LAG),
            exec,
            logging,
            socket,
        })
    }
}

/// `logging.level`.
fn log_level(s: Scalar<'_>) -> Result<String, String> {
    const LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];
    let v = text(s)?.to_ascii_lowercase();
    match LEVELS.iter().find(|l| **l == v) {
        Some(l) => Ok(l.to_string()),
        None => Err(format!(
            "invalid log level {s}: use one of {}",
            LEVELS.join(", ")
        )),
    }
}

/// `logging.type`.
fn log_format(s: Scalar<'_>) -> Result<LogFormat, String> {
    match text(s)?.to_ascii_lowercase().as_str() {
        "text" | "pretty" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("invalid log type {s}: use text or json")),
    }
}

const SOCKET_KEYS: &[&str] = &["enabled", "path", "permissions"];

/// `socket.permissions`: an octal mode such as `"0600"` (at most 0777).
fn permissions(s: Scalar<'_>) -> Result<u32, String> {
    let v = text(s)?;
    let digits = v.trim().trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 && !digits.is_empty() => Ok(m),
        _ => Err(format!(
            "invalid permissions {s}: use an octal mode such as \"0600\""
        )),
    }
}

/// A value of the `logging` or `socket` map: each key has its own kind.
enum Field {
    Text(String),
    Flag(bool),
    Format(LogFormat),
    Mode(u32),
}

/// Reads the `logging` or `socket` map through [`SectionSeed`] with per-key converters.
fn read_section<'de, A: MapAccess<'de>>(
    map: &mut A,
    ctx: &Ctx,
    name: &str,
    keys: &'static [&'static str],
    convert: &dyn Fn(&str, Scalar<'_>) -> Result<Field, String>,
) -> Result<Vec<(&'static str, Field)>, A::Error> {
    map.next_value_seed(SectionSeed {
        ctx,
        name: name.to_string(),
        keys,
        required: false,
        convert,
        hint: "",
        refuse: None,
    })
}

/// The `logging` map.
fn logging_field(key: &str, s: Scalar<'_>) -> Result<Field, String> {
    match key {
        "level" => log_level(s).map(Field::Text),
        "type" => log_format(s).map(Field::Format),
        _ => boolean(s).map(Field::Flag),
    }
}

fn logging_from(fields: Vec<(&'static str, Field)>) -> LoggingConfig {
    let mut logging = LoggingConfig::default();
    for (_, field) in fields {
        match field {
            Field::Text(level) => logging.level = Some(level),
            Field::Format(format) => logging.format = format,
            Field::Flag(stderr) => logging.stderr = stderr,
            Field::Mode(_) => {}
        }
    }
    logging
}

/// The `socket` map.
fn socket_field(key: &str, s: Scalar<'_>) -> Result<Field, String> {
    match key {
        "enabled" => boolean(s).map(Field::Flag),
        "path" => text(s).map(Field::Text),
        _ => permissions(s).map(Field::Mode),
    }
}

fn socket_from(fields: Vec<(&'static str, Field)>) -> SocketConfig {
    let mut socket = SocketConfig::default();
    for (_, field) in fields {
        match field {
            Field::Flag(enabled) => socket.enabled = enabled,
            Field::Text(path) => socket.path = PathBuf::from(path),
            Field::Mode(mode) => socket.permissions = mode,
            Field::Format(_) => {}
        }
    }
    socket
}

/// Where a `dbs` entry's databases are: one `path`, or a `dir` to discover them in.
enum Source {
    Path(PathBuf),
    Dir(RawDir),
}

/// The discovery keys of a `dbs` entry with `dir`.
struct RawDir {
    dir: PathBuf,
    pattern: String,
    recursive: bool,
    watch: bool,
}

/// Key `dir`: made absolute. Whether it exists is checked by the daemon at start
/// ([`Config::check_dirs`]), not here: a restore may target a directory not created yet.
fn discovery_dir(s: Scalar<'_>) -> Result<PathBuf, String> {
    let p = text(s)?;
    if p.is_empty() {
        return Err("empty dir".into());
    }
    absolutize(Path::new(&p))
}

/// Key `pattern`: a glob on the file name.
fn name_pattern(s: Scalar<'_>) -> Result<String, String> {
    let p = text(s)?;
    if p.contains('/') {
        return Err(format!(
            "pattern {p:?} contains `/`: it matches the file name only (use `recursive`)"
        ));
    }
    globset::Glob::new(&p).map_err(|e| format!("invalid pattern {p:?}: {e}"))?;
    Ok(p)
}

/// A database as read, before the top-level settings are known.
struct PartialDb {
    source: Source,
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

const PATH_AND_DIR: &str = "keys `path` and `dir` are mutually exclusive: a `dbs` entry is one \
                            database (`path`) or a directory to discover databases in (`dir`)";
const META_AND_DIR: &str = "keys `meta-path` and `dir` are mutually exclusive: each discovered \
                            database keeps its state next to itself";

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
        let mut dir = None;
        let mut pattern = None;
        let mut recursive = None;
        let mut watch = None;
        let mut meta_path = None;
        let mut replica = None;
        let mut replicas = None;
        while let Some(key) = map.next_key_seed(KeySeed {
            ctx,
            allowed: DB_KEYS,
            top_only: &TOP_ONLY_KEYS,
            seen: &mut seen,
            place,
        })? {
            let (has_path, has_dir, has_meta) =
                (path.is_some(), dir.is_some(), meta_path.is_some());
            // Checked on the value so that the error names the second key's line.
            let exclusive = |_: Scalar<'_>| -> Result<(), String> {
                match key {
                    "path" if has_dir => Err(PATH_AND_DIR.to_string()),
                    "dir" if has_path => Err(PATH_AND_DIR.to_string()),
                    "meta-path" if has_dir => Err(META_AND_DIR.to_string()),
                    "dir" if has_meta => Err(META_AND_DIR.to_string()),
                    _ => Ok(()),
                }
            };
            match key {
                "dir" => {
                    let convert = |s: Scalar<'_>| {
                        exclusive(s)?;
                        discovery_dir(s)
                    };
                    dir = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &convert,
                    })?);
                }
                "pattern" => {
                    pattern = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &name_pattern,
                    })?);
                }
                "recursive" | "watch" => {
                    let v = map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &boolean,
                    })?;
                    if key == "watch" {
                        watch = Some(v);
                    } else {
                        recursive = Some(v);
                    }
                }
                "path" => {
                    let convert = |s: Scalar<'_>| -> Result<PathBuf, String> {
                        exclusive(s)?;
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
                        exclusive(s)?;
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
        let source = match (path, dir) {
            (Some(p), _) => {
                if let Some(k) = [
                    ("pattern", pattern.is_some()),
                    ("recursive", recursive.is_some()),
                    ("watch", watch.is_some()),
                ]
                .iter()
                .find_map(|(k, set)| set.then_some(k))
                {
                    return Err(ctx.fail(format!(
                        "key `{k}` needs `dir` {place} (it applies to directory discovery)"
                    )));
                }
                Source::Path(p)
            }
            (None, Some(dir)) => Source::Dir(RawDir {
                dir,
                pattern: pattern.unwrap_or_else(|| "*".to_string()),
                recursive: recursive.unwrap_or(false),
                watch: watch.unwrap_or(false),
            }),
            (None, None) => {
                return Err(ctx.fail(format!(
                    "missing key `path` {place} (or `dir` to discover databases in a directory)"
                )));
            }
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
            replicas.push(ReplicaConfig {
                name,
                url: r.url,
                s3: r.s3,
                age: r.age,
            });
        }
        Ok(PartialDb {
            source,
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
    s3: Option<S3Config>,
    age: Option<Arc<AgeKeys>>,
}

/// The S3 keys of one replica map (or of the top level: the global defaults), as read.
#[derive(Clone, Default)]
struct RawS3 {
    bucket: Option<String>,
    region: Option<String>,
    endpoint: Option<String>,
    force_path_style: Option<bool>,
    access_key_id: Option<String>,
    secret_access_key: Option<Secret>,
    part_size: Option<u64>,
    concurrency: Option<usize>,
    storage_class: Option<String>,
    sse_kms_key_id: Option<String>,
    sse_customer_key: Option<Secret>,
}

impl RawS3 {
    /// Reads the value of `key` if it is an S3 key; returns whether it was.
    fn read<'de, A: MapAccess<'de>>(
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
    fn into_config(self, path: Option<&str>) -> S3Config {
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
    fn with_defaults(mut self, g: &RawS3) -> RawS3 {
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
    fn inherit_pairs(&mut self, g: &RawS3) {
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
    fn add_secrets(self, cfg: &mut S3Config) {
        cfg.access_key_id = self.access_key_id;
        cfg.secret_access_key = self.secret_access_key;
        cfg.sse_customer_key = self.sse_customer_key;
    }
}

/// A replica's `age` map: `recipients` and `identities`, each a list (or one value) of
/// inline keys and file paths. Files are read here, so a missing or bad one fails the config.
struct AgeSeed<'a> {
    ctx: &'a Ctx,
    place: &'a str,
}

impl AgeSeed<'_> {
    fn not_a_map<E: de::Error>(&self, found: impl fmt::Display) -> Result<AgeKeys, E> {
        Err(self.ctx.fail(format!(
            "`age` takes a map with the keys `recipients` and `identities` (lists of keys or \
             key files), found {found} {}",
            self.place
        )))
    }

    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<AgeKeys, E> {
        self.not_a_map(s)
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
struct StringListSeed<'a> {
    ctx: &'a Ctx,
    key: &'static str,
    place: &'a str,
}

impl StringListSeed<'_> {
    fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<String>, E> {
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
        let mut url: Option<(ReplicaKind, String, Option<S3Config>)> = None;
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
                            let (url, s3) = kind.parse_url(&raw)?;
                            Ok((kind, url, s3))
                        },
                    })?)
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
            (Some(kind), Some((url_kind, url, _))) if kind != *url_kind => {
                return Err(ctx.fail(format!(
                    "`type: {}` does not match the URL {url} {place}",
                    kind.name()
                )));
            }
            (Some(kind), _) => kind,
            (None, Some((url_kind, _, _))) => *url_kind,
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
        let (url, s3) = match kind {
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
                    (Some((_, url, _)), None) => (url, None),
                    (None, Some(path)) => {
                        let url = file_url_from_path(&path)
                            .map_err(|e| ctx.fail(format!("{e} (key `path` {place})")))?;
                        (url, None)
                    }
                }
            }
            ReplicaKind::S3 => {
                let cfg = match url {
                    Some((_, _, url_cfg)) => {
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
                (s3_url(&cfg), Some(cfg))
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
            age,
        })
    }
}

#[cfg(test)]
mod tests;
