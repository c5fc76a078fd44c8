//! The configuration: which databases to replicate, where to, and how.
//!
//! The file is YAML with the layout and key names of Litestream v0.5 (a subset of them), plus
//! replicad's own keys. `config/replicad.yml` is the reference: every key, its default and
//! unit, with examples. This module keeps the rules that hold for every key:
//!
//! - **Unknown keys are errors that name the key and its line, never silently ignored**: a
//!   misspelt `checkpoint-intreval` must not leave the default in force. The same goes for
//!   Litestream keys replicad does not implement, for duplicate keys, and inside every map.
//! - Every error names the file, the key and the line when they are known:
//!   `config /etc/replicad.yml: line 7: unknown key `retention-foo` in dbs[0] (...)`.
//! - Setting keys ([`DbSettings`]) may appear at the top level and in each database: the
//!   database's key wins, then the top-level key, then the default. Compaction, snapshot and
//!   retention keys are top level only, as in Litestream.
//! - Durations use Go syntax (`500ms`, `1h30m`); a bare number is an error asking for a unit.
//! - Paths are made absolute against the current directory, with `~` expanded, and normalised
//!   lexically (`..` is kept: resolving it without the file system is wrong across symlinks).
//! - `$VAR` and `${VAR}` are replaced by the environment before parsing (unset: empty, as in
//!   Litestream) unless expansion is turned off.
//! - Every database needs a replica; no two databases share a path, and no two replicas (in
//!   any database) share a destination (`url.rs`).
//! - Secrets never appear in an error message or in `Debug` output ([`Secret`]);
//!   credentials inside a URL are rejected without echoing it. [`ReplicaConfig::url`] never
//!   holds credentials.
//!
//! A new replica type is a new arm of [`ReplicaKind`] plus its keys in `yaml/replica.rs`.
//! Parsing is in `yaml/` (hand-written visitors, so that every error carries a line),
//! loading and cross-database checks in `load.rs`.

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

mod load;
pub mod notify;
pub use load::warn_unset_vars;
mod url;
mod yaml;

use crate::config::url::{
    Destination, file_url_from_path, reject_userinfo, s3_url, unsupported_type,
};
use crate::config::yaml::settings::{EMPTY_LEVELS, too_many_levels};
use crate::ltx::Codec;
use crate::storage::AnyClient;
use crate::storage::age::keys::AgeKeys;
use crate::storage::object::{ObjectClient, ObjectConfig};
use crate::storage::s3::{
    DEFAULT_PART_SIZE, S3Client, S3Clients, S3Config, Secret, parse_size, reject_skip_verify,
};
use crate::storage::sftp::{SftpClient, SftpConfig};

/// The longest duration a setting takes: longer ones (`1000000years`) overflowed the clocks
/// and dates they are added to, in tasks of the running daemon.
/// 100 years as the syntax counts them (`100y`, of 365.25 days).
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// Why a duration was refused ([`parse_duration`]).
#[derive(Debug, thiserror::Error)]
pub enum DurationError {
    /// Not in the syntax (humantime's reason).
    #[error("{0}")]
    Syntax(String),
    /// Past [`MAX_DURATION`].
    #[error("longer than 100 years, the longest a setting takes")]
    TooLong,
}

/// Parses a duration in humantime's syntax (`500ms`, `1h30m`, `7d`), at most
/// [`MAX_DURATION`]; the error names neither the value nor the key (callers add them).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let d = humantime::parse_duration(s).map_err(|e| DurationError::Syntax(e.to_string()))?;
    if d > MAX_DURATION {
        return Err(DurationError::TooLong);
    }
    Ok(d)
}

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
    /// Key `notify` (top level only, default off): webhooks and the heartbeat ping.
    pub notify: notify::NotifyConfig,
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
    // The command is not shown: its arguments may hold a token the config expanded.
    let argv = shell_words::split(cmd).map_err(|e| format!("invalid command ({e})"))?;
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
    /// How `settings.compression` was chosen (the Litestream-compatibility rule).
    pub codec: CodecOrigin,
}

/// How a database's page codec was chosen. Litestream reads only `lz4`, so a user who came
/// from Litestream keeps the way back: `lz4` is written unless a codec is set explicitly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodecOrigin {
    /// Key `compression` (file, top level or database) or `--compression`: always honoured.
    Set,
    /// The config file is Litestream's (no replicad-only key): `lz4`.
    LitestreamFile,
    /// replicad's default, which becomes `lz4` when a replica already holds
    /// Litestream-readable files (decided at start, [`crate::daemon`]).
    Default,
}

/// Keys only replicad reads: a file with none of them is a Litestream config.
pub const REPLICAD_ONLY_KEYS: [&str; 17] = [
    "compression",
    "notify",
    "window",
    "hourly",
    "daily",
    "weekly",
    "monthly",
    "age",
    "max-lag",
    "lease-ttl",
    "dormant-after",
    "dormant-max-size",
    "min-sync-interval",
    "full-verify-interval",
    "verify-interval",
    "verify-recheck-interval",
    "replica-check-interval",
];

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
    /// The replicas of every discovered database, before [`DirConfig::db`] moves them under it.
    pub replicas: Vec<ReplicaConfig>,
    /// Effective settings of every discovered database.
    pub settings: DbSettings,
    /// How `settings.compression` was chosen.
    pub codec: CodecOrigin,
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
            codec: self.codec,
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
    // A key prefix `p` becomes `p/<rel>`, an empty one `<rel>`.
    let under = |base: &str| {
        let base = base.trim_end_matches('/');
        if base.is_empty() {
            rel.to_string()
        } else {
            format!("{base}/{rel}")
        }
    };
    let mut moved = ReplicaConfig {
        url: format!("{}/{rel}", replica.url.trim_end_matches('/')),
        ..replica.clone()
    };
    if let Some(cfg) = &mut moved.s3 {
        cfg.path = under(&cfg.path);
        moved.url = s3_url(cfg);
    } else if let Some(cfg) = &mut moved.object {
        cfg.path = under(&cfg.path);
        moved.url = cfg.url();
    } else if let Some(cfg) = &mut moved.sftp {
        // Not `under`: an empty path is the login directory, `/` the server's root.
        cfg.path = match cfg.path.as_str() {
            "" => rel.to_string(),
            "/" => format!("/{rel}"),
            p => format!("{p}/{rel}"),
        };
        moved.url = cfg.url();
    }
    moved
}

/// Per-database settings (effective values).
#[derive(Clone, Debug, PartialEq)]
pub struct DbSettings {
    /// Key `monitor-interval` (default 1s, must be > 0): how often the WAL is checked for new
    /// frames.
    pub monitor_interval: Duration,
    /// Key `min-sync-interval` (default 1s; `0s` = ship every commit at once): a commit
    /// seen by inotify or by a poll is synced at once, but no sooner than this after the
    /// previous sync that shipped a segment (unless an application's checkpoint waits for us
    /// or the WAL nears `truncate-page-n`). Each such sync costs one upload per replica, so this bounds a busy
    /// database's requests (one per second per replica, Litestream's rate) while a database
    /// that commits now and then ships each commit within milliseconds.
    pub min_sync_interval: Duration,
    /// Key `checkpoint-interval` (default 1m): time-based PASSIVE checkpoints; `0s` disables
    /// them (page-count checkpoints still happen).
    pub checkpoint_interval: Duration,
    /// Key `verify-interval` (default 0s = off): how often each replica is restored into a
    /// temporary directory and checked (`integrity_check`, checksums); the result is the
    /// metric `replicad_replica_verify_ok`.
    pub verify_interval: Duration,
    /// Key `verify-recheck-interval` (default 24h; `0s` = never): how long a passing verify
    /// vouches for files that have not changed since. A verify of an unchanged replica is
    /// skipped until then, and downloads again after it, so that an object damaged or replaced
    /// in place (bit rot, a same-sized overwrite) is found within a day.
    pub verify_recheck_interval: Duration,
    /// Key `replica-check-interval` (default 24h; `0s` = never): how often each replica is
    /// listed to check that its files still restore up to the database's position. An idle
    /// replica otherwise sends no request, so files deleted behind replicad's back while its
    /// lease stays (an expiry rule of the bucket, a person) would go unnoticed; one that no
    /// longer restores is re-seeded. A listing is one request per 1,000 objects on an object
    /// store.
    pub replica_check_interval: Duration,
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
    /// of it. Another instance takes over a replica whose lease is older than this. With
    /// conditional writes, an upload round skips re-reading it for 1/60 of this after a read
    /// found it ours (10 s by default).
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
    /// Key `snapshot.retention`, or `retention.window` (top level only; default 24h, must be
    /// > 0): how long snapshots are kept, and so the window of point-in-time restores.
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
    /// Keys `retention.hourly`, `.daily`, `.weekly`, `.monthly` (top level only; default 0):
    /// snapshots kept past the window as calendar restore points.
    pub calendar: Calendar,
}

/// Calendar retention: besides every snapshot of the window, keep the newest snapshot of
/// each of the last `hourly` hours, `daily` days, `weekly` ISO weeks and `monthly` months
/// (UTC) that have one, as backup tools' `keep-daily` rules do. 0 keeps none of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calendar {
    /// Key `retention.hourly`.
    pub hourly: u32,
    /// Key `retention.daily`.
    pub daily: u32,
    /// Key `retention.weekly`.
    pub weekly: u32,
    /// Key `retention.monthly`.
    pub monthly: u32,
}

impl Calendar {
    /// Whether any calendar rule is set.
    pub fn is_set(&self) -> bool {
        *self != Calendar::default()
    }
}

impl Default for DbSettings {
    fn default() -> Self {
        DbSettings {
            monitor_interval: Duration::from_secs(1),
            min_sync_interval: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(60),
            verify_interval: Duration::ZERO,
            verify_recheck_interval: Duration::from_secs(24 * 3600),
            replica_check_interval: Duration::from_secs(24 * 3600),
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
            calendar: Calendar::default(),
        }
    }
}

impl DbSettings {
    /// Checks the rules the file parser checks per key (used for settings built in code, and
    /// for a file's settings once the command line overrode them).
    pub(crate) fn validate(&mut self) -> Result<(), String> {
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
    /// The settings of a Google Cloud Storage or Azure Blob Storage replica (`None`
    /// otherwise). Its `Debug` output redacts the secrets.
    pub object: Option<ObjectConfig>,
    /// The settings of an SFTP replica (`None` otherwise). Its `Debug` output redacts the
    /// password.
    pub sftp: Option<SftpConfig>,
    /// Key `age`: the recipients new files are encrypted to and the identities that read
    /// encrypted files, loaded (and checked) when the config is read. `None`: plain. Its
    /// `Debug` output names identities by source and public key only.
    pub age: Option<Arc<AgeKeys>>,
}

impl ReplicaConfig {
    /// Builds the client of this replica (nothing is contacted yet).
    pub fn client(&self) -> Result<AnyClient, String> {
        if let Some(cfg) = &self.s3 {
            Ok(AnyClient::S3(S3Client::new(cfg.clone())))
        } else if let Some(cfg) = &self.object {
            Ok(AnyClient::Object(Box::new(ObjectClient::new(cfg.clone())?)))
        } else if let Some(cfg) = &self.sftp {
            Ok(AnyClient::Sftp(SftpClient::new(cfg.clone())))
        } else {
            AnyClient::from_url(&self.url)
        }
    }

    /// [`ReplicaConfig::client`], sharing S3 connection pools through `pool` (a daemon's
    /// replicas of one bucket use one pool).
    pub fn client_in(&self, pool: &S3Clients) -> Result<AnyClient, String> {
        match &self.s3 {
            Some(cfg) => Ok(AnyClient::S3(S3Client::shared(cfg.clone(), pool))),
            None => self.client(),
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
    /// A Google Cloud Storage bucket (`type: gs` or `gs://` URL).
    Gs,
    /// An Azure Blob Storage container (`type: abs` or `abs://` URL).
    Abs,
    /// A directory on an SFTP server (`type: sftp` or `sftp://` URL).
    Sftp,
    /// A WebDAV server (`type: webdav`, or a `webdav://` or `webdavs://` URL).
    Webdav,
}

impl ReplicaKind {
    /// The `type` value, also the default replica name.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaKind::File => "file",
            ReplicaKind::S3 => "s3",
            ReplicaKind::Gs => "gs",
            ReplicaKind::Abs => "abs",
            ReplicaKind::Sftp => "sftp",
            ReplicaKind::Webdav => "webdav",
        }
    }

    /// Parses a `type` value.
    fn from_type(t: &str) -> Result<ReplicaKind, String> {
        match t {
            "file" => Ok(ReplicaKind::File),
            "s3" => Ok(ReplicaKind::S3),
            "gs" => Ok(ReplicaKind::Gs),
            "abs" => Ok(ReplicaKind::Abs),
            "sftp" => Ok(ReplicaKind::Sftp),
            "webdav" => Ok(ReplicaKind::Webdav),
            other => Err(unsupported_type(other)),
        }
    }

    /// The kind named by a URL's scheme; no scheme means a file path.
    fn from_url(url: &str) -> Result<ReplicaKind, String> {
        match url.split_once("://") {
            None | Some(("file", _)) => Ok(ReplicaKind::File),
            Some(("s3", _)) => Ok(ReplicaKind::S3),
            Some(("gs", _)) => Ok(ReplicaKind::Gs),
            Some(("abs", _)) => Ok(ReplicaKind::Abs),
            Some(("sftp", _)) => Ok(ReplicaKind::Sftp),
            Some(("webdav" | "webdavs", _)) => Ok(ReplicaKind::Webdav),
            Some((scheme, _)) => Err(unsupported_type(scheme)),
        }
    }

    /// Parses a URL of this kind: the normalised URL ([`ReplicaConfig::url`]) and, for S3,
    /// the settings the URL gives. Checks that a client can be built from it.
    fn parse_url(self, url: &str) -> Result<ParsedUrl, String> {
        if matches!(
            self,
            ReplicaKind::Gs | ReplicaKind::Abs | ReplicaKind::Webdav
        ) {
            // `abs://ACCOUNT@CONTAINER` is Litestream's form: the account is not a secret.
            let cfg = ObjectConfig::from_url(url)?;
            return Ok(ParsedUrl {
                url: cfg.url(),
                object: Some(cfg),
                ..ParsedUrl::default()
            });
        }
        if self == ReplicaKind::Sftp {
            // The user in `sftp://USER@HOST` is not a secret either; a password is refused.
            let cfg = SftpConfig::from_url(url)?;
            return Ok(ParsedUrl {
                url: cfg.url(),
                sftp: Some(cfg),
                ..ParsedUrl::default()
            });
        }
        reject_userinfo(url)?;
        match self {
            ReplicaKind::Gs | ReplicaKind::Abs | ReplicaKind::Webdav | ReplicaKind::Sftp => {
                unreachable!("handled above")
            }
            ReplicaKind::File => {
                let path = match url.strip_prefix("file://") {
                    Some(rest) if !rest.starts_with('/') => {
                        return Err(format!(
                            "file URL {} must be absolute (file:///path)",
                            crate::config::url::redact_userinfo(url)
                        ));
                    }
                    Some(rest) => rest,
                    None => url,
                };
                Ok(ParsedUrl {
                    url: file_url_from_path(path)?,
                    ..ParsedUrl::default()
                })
            }
            ReplicaKind::S3 => {
                let cfg = S3Config::from_url(url)?;
                Ok(ParsedUrl {
                    url: s3_url(&cfg),
                    s3: Some(cfg),
                    ..ParsedUrl::default()
                })
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

/// A replica URL as parsed: the normalised URL and the settings it gives.
#[derive(Clone, Debug, Default)]
struct ParsedUrl {
    url: String,
    s3: Option<S3Config>,
    object: Option<ObjectConfig>,
    sftp: Option<SftpConfig>,
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

#[cfg(test)]
mod tests;
