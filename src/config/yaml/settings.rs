//! Per-database settings (`monitor-interval`, `checkpoint-interval`, ...) and the top-level
//! compaction schedule (`levels`, `snapshot`, `l0-retention`, `retention`).

use crate::config::yaml::SectionSeed;
use crate::config::yaml::{
    Ctx, LEVEL_KEYS, RETENTION_KEYS, SNAPSHOT_KEYS, Scalar, ValueSeed, boolean, byte_size, codec,
    count, duration, lease_ttl, positive_duration,
};
#[allow(unused_imports)]
use crate::config::*;

/// Setting keys as read in one map (top level or one database).
#[derive(Default)]
pub(crate) struct RawSettings {
    pub(crate) monitor_interval: Option<Duration>,
    pub(crate) checkpoint_interval: Option<Duration>,
    pub(crate) min_checkpoint_page_count: Option<u32>,
    pub(crate) truncate_page_n: Option<u32>,
    pub(crate) full_verify_interval: Option<Duration>,
    pub(crate) compression: Option<Codec>,
    pub(crate) heartbeat_interval: Option<Duration>,
    pub(crate) verify_interval: Option<Duration>,
    pub(crate) verify_recheck_interval: Option<Duration>,
    pub(crate) replica_check_interval: Option<Duration>,
    pub(crate) lease_ttl: Option<Duration>,
    pub(crate) dormant_after: Option<Duration>,
    pub(crate) min_sync_interval: Option<Duration>,
    pub(crate) dormant_max_size: Option<u64>,
}

impl RawSettings {
    /// Reads the value of `key` if it is a setting key; returns whether it was.
    pub(crate) fn read<'de, A: MapAccess<'de>>(
        &mut self,
        key: &'static str,
        map: &mut A,
        ctx: &Ctx,
        place: &str,
    ) -> Result<bool, A::Error> {
        match key {
            "monitor-interval" => {
                self.monitor_interval = Some(map.next_value_seed(ValueSeed::new(
                    ctx,
                    key,
                    place,
                    &positive_duration,
                ))?)
            }
            "checkpoint-interval" => {
                self.checkpoint_interval =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "verify-interval" => {
                self.verify_interval =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "verify-recheck-interval" => {
                self.verify_recheck_interval =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "replica-check-interval" => {
                self.replica_check_interval =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "min-checkpoint-page-count" => {
                self.min_checkpoint_page_count =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &count))?)
            }
            "truncate-page-n" => {
                self.truncate_page_n =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &count))?)
            }
            "full-verify-interval" => {
                self.full_verify_interval = Some(map.next_value_seed(ValueSeed::new(
                    ctx,
                    key,
                    place,
                    &positive_duration,
                ))?)
            }
            "compression" => {
                self.compression =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &codec))?)
            }
            "heartbeat-interval" => {
                self.heartbeat_interval = Some(map.next_value_seed(ValueSeed::new(
                    ctx,
                    key,
                    place,
                    &positive_duration,
                ))?)
            }
            "lease-ttl" => {
                self.lease_ttl =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &lease_ttl))?)
            }
            "min-sync-interval" => {
                self.min_sync_interval =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "dormant-after" => {
                self.dormant_after =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &duration))?)
            }
            "dormant-max-size" => {
                self.dormant_max_size =
                    Some(map.next_value_seed(ValueSeed::new(ctx, key, place, &byte_size))?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Effective settings: `self`, else `global`, else the defaults (the top-level-only keys
    /// keep their defaults here).
    pub(crate) fn resolve(&self, global: &RawSettings) -> DbSettings {
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
            verify_recheck_interval: self
                .verify_recheck_interval
                .or(global.verify_recheck_interval)
                .unwrap_or(d.verify_recheck_interval),
            replica_check_interval: self
                .replica_check_interval
                .or(global.replica_check_interval)
                .unwrap_or(d.replica_check_interval),
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
            min_sync_interval: self
                .min_sync_interval
                .or(global.min_sync_interval)
                .unwrap_or(d.min_sync_interval),
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
pub(crate) struct RawCompaction {
    pub(crate) levels: Option<Vec<Duration>>,
    pub(crate) snapshot_interval: Option<Duration>,
    pub(crate) snapshot_retention: Option<Duration>,
    pub(crate) l0_retention: Option<Duration>,
    pub(crate) l0_retention_check_interval: Option<Duration>,
    pub(crate) retention_enabled: Option<bool>,
    /// `retention.window` was given (it and `snapshot.retention` are one setting).
    pub(crate) window_key: bool,
    pub(crate) calendar: Option<Calendar>,
}

/// A value of the `retention` map: each key has its own kind.
enum RetentionField {
    Flag(bool),
    Window(Duration),
    Count(u32),
}

/// Most restore points of one calendar kind (ten years of days).
const MAX_CALENDAR: i128 = 3660;

fn retention_field(key: &str, s: Scalar<'_>) -> Result<RetentionField, String> {
    match key {
        "enabled" => boolean(s).map(RetentionField::Flag),
        "window" => positive_duration(s).map(RetentionField::Window),
        _ => match s {
            Scalar::Int(i) if (0..=MAX_CALENDAR).contains(&i) => {
                Ok(RetentionField::Count(i as u32))
            }
            other => Err(format!(
                "expected how many restore points to keep, 0 to {MAX_CALENDAR}, found {other}"
            )),
        },
    }
}

const SAME_WINDOW: &str = "keys `snapshot.retention` and `retention.window` are the same setting \
                           (how long every snapshot is kept): keep one";

impl RawCompaction {
    /// Reads the value of `key` if it is one of these keys; returns whether it was.
    pub(crate) fn read<'de, A: MapAccess<'de>>(
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
                        _ if self.window_key => return Err(ctx.fail(SAME_WINDOW.into())),
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
                    convert: &retention_field,
                    hint: " (e.g. `retention: {window: 24h, daily: 7}`; the window is also \
                           `retention` inside `snapshot`)",
                    refuse: None,
                })?;
                for (k, v) in section {
                    match v {
                        RetentionField::Flag(enabled) => self.retention_enabled = Some(enabled),
                        RetentionField::Window(_) if self.snapshot_retention.is_some() => {
                            return Err(ctx.fail(SAME_WINDOW.into()));
                        }
                        RetentionField::Window(d) => {
                            self.snapshot_retention = Some(d);
                            self.window_key = true;
                        }
                        RetentionField::Count(n) => {
                            let c = self.calendar.get_or_insert_with(Calendar::default);
                            match k {
                                "hourly" => c.hourly = n,
                                "daily" => c.daily = n,
                                "weekly" => c.weekly = n,
                                _ => c.monthly = n,
                            }
                        }
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Sets the keys that were given on `s`; the others keep their value.
    pub(crate) fn apply(&self, s: &mut DbSettings) {
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
        if let Some(c) = self.calendar {
            s.calendar = c;
        }
    }
}

pub(crate) const EMPTY_LEVELS: &str = "`levels` is empty: give at least one compaction level \
                            (`- interval: 30s`), or remove the key for the defaults (30s, 5m, 1h)";

/// `what`, followed by the rule on the number of levels.
pub(crate) fn too_many_levels(what: &str) -> String {
    format!(
        "{what}: at most {MAX_LEVELS} compaction levels (L1..L{MAX_LEVELS}; level 9 is the \
         snapshot level, set by `snapshot`)"
    )
}

/// The `levels` list: the intervals of L1..Ln.
pub(crate) struct LevelsSeed<'a> {
    pub(crate) ctx: &'a Ctx,
}

impl LevelsSeed<'_> {
    pub(crate) fn not_a_list<E: de::Error>(
        &self,
        found: impl fmt::Display,
    ) -> Result<Vec<Duration>, E> {
        Err(self.ctx.fail(format!(
            "`levels` takes a list of maps such as `- interval: 30s`, found {found}"
        )))
    }

    pub(crate) fn scalar<E: de::Error>(self, s: Scalar<'_>) -> Result<Vec<Duration>, E> {
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
