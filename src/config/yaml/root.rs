//! The top-level map: global settings, global S3 keys, `logging`, `socket`, `notify`, `addr`,
//! `exec`.

use crate::config::notify::NotifyConfig;
use crate::config::yaml::dbs::{DbsSeed, NO_DBS, Source};
use crate::config::yaml::notify::{MIN_PING_INTERVAL, NotifySeed, notify_url};
use crate::config::yaml::replica::RawS3;
use crate::config::yaml::settings::{RawCompaction, RawSettings};
use crate::config::yaml::{
    Ctx, KeySeed, LOGGING_KEYS, ROOT_KEYS, S3_KEYS, Scalar, SectionSeed, ValueSeed, boolean,
    duration, listen_addr, text,
};
#[allow(unused_imports)]
use crate::config::*;

/// First pass over the top-level map: the global replica defaults (the S3 keys at the top
/// level, as Litestream's global replica settings). Every other key is skipped.
pub(crate) struct GlobalsSeed<'a> {
    pub(crate) ctx: &'a Ctx,
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
pub(crate) struct RootSeed<'a> {
    pub(crate) ctx: &'a Ctx,
}

impl<'de> DeserializeSeed<'de> for RootSeed<'_> {
    type Value = Config;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Config, D::Error> {
        d.deserialize_map(self)
    }
}

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
        let mut notify: Option<NotifyConfig> = None;
        let mut heartbeat_url = None;
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
                // Commands that never run the daemon need none of it (nor its variables).
                "notify" | "heartbeat-url" if ctx.skip_credentials => {
                    map.next_value::<de::IgnoredAny>()?;
                }
                "notify" => notify = Some(map.next_value_seed(NotifySeed { ctx })?),
                "heartbeat-url" => {
                    heartbeat_url = Some(map.next_value_seed(ValueSeed {
                        ctx,
                        key,
                        place,
                        convert: &notify_url,
                    })?)
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
        let mut notify = notify.unwrap_or_default();
        if let Some(url) = heartbeat_url {
            if notify.heartbeat_url.is_some() {
                return Err(ctx.fail(
                    "keys `heartbeat-url` at the top level and `notify.heartbeat-url` are the \
                     same setting: keep one"
                        .into(),
                ));
            }
            notify.heartbeat_url = Some(url);
            // Litestream's pair: beside its `heartbeat-url`, the top-level
            // `heartbeat-interval` is the ping interval, not the upload tasks' heartbeat.
            if let Some(d) = settings.heartbeat_interval.take() {
                if d < MIN_PING_INTERVAL {
                    return Err(ctx.fail(format!(
                        "key `heartbeat-interval` at the top level is {}: beside a top-level \
                         `heartbeat-url` it is the heartbeat ping interval (as in Litestream), \
                         at least 1s; set the upload tasks' heartbeat in each database",
                        humantime::format_duration(d)
                    )));
                }
                notify.heartbeat_interval = d;
            }
        }
        let Some(entries) = dbs else {
            return Err(ctx.fail(format!("missing key `dbs`: {NO_DBS}")));
        };
        let mut dbs = Vec::new();
        let mut dirs = Vec::new();
        for db in entries {
            let codec = if db.settings.compression.is_some() || settings.compression.is_some() {
                CodecOrigin::Set
            } else {
                CodecOrigin::Default
            };
            let mut db_settings = db.settings.resolve(&settings);
            compaction.apply(&mut db_settings);
            match db.source {
                Source::Path(path) => dbs.push(DbConfig {
                    settings: db_settings,
                    path,
                    meta_path: db.meta_path,
                    replicas: db.replicas,
                    codec,
                }),
                Source::Dir(d) => dirs.push(DirConfig {
                    dir: d.dir,
                    pattern: d.pattern,
                    recursive: d.recursive,
                    watch: d.watch,
                    replicas: db.replicas,
                    settings: db_settings,
                    codec,
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
            notify,
        })
    }
}

/// `logging.level`.
pub(crate) fn log_level(s: Scalar<'_>) -> Result<String, String> {
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
pub(crate) fn log_format(s: Scalar<'_>) -> Result<LogFormat, String> {
    match text(s)?.to_ascii_lowercase().as_str() {
        "text" | "pretty" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("invalid log type {s}: use text or json")),
    }
}

pub(crate) const SOCKET_KEYS: &[&str] = &["enabled", "path", "permissions"];

/// `socket.permissions`: an octal mode such as `"0600"` (at most 0777).
pub(crate) fn permissions(s: Scalar<'_>) -> Result<u32, String> {
    // An unquoted number arrives as its value (0o640 as 416, read back as mode 0416): which
    // digits were written is lost. `0640` unquoted stays text (YAML 1.2), and is taken.
    if let Scalar::Int(_) = s {
        return Err(format!(
            "invalid permissions {s}: write the octal mode as a quoted string, such as \"0600\""
        ));
    }
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
pub(crate) enum Field {
    Text(String),
    Flag(bool),
    Format(LogFormat),
    Mode(u32),
}

/// Reads the `logging` or `socket` map through [`SectionSeed`] with per-key converters.
pub(crate) fn read_section<'de, A: MapAccess<'de>>(
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
pub(crate) fn logging_field(key: &str, s: Scalar<'_>) -> Result<Field, String> {
    match key {
        "level" => log_level(s).map(Field::Text),
        "type" => log_format(s).map(Field::Format),
        _ => boolean(s).map(Field::Flag),
    }
}

pub(crate) fn logging_from(fields: Vec<(&'static str, Field)>) -> LoggingConfig {
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
pub(crate) fn socket_field(key: &str, s: Scalar<'_>) -> Result<Field, String> {
    match key {
        "enabled" => boolean(s).map(Field::Flag),
        "path" => text(s).map(Field::Text),
        _ => permissions(s).map(Field::Mode),
    }
}

pub(crate) fn socket_from(fields: Vec<(&'static str, Field)>) -> SocketConfig {
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
