//! The `dbs` list: one database (`path`) or a discovered directory (`dir`) per entry.

use crate::config::url::absolutize;
use crate::config::yaml::settings::RawSettings;
use crate::config::yaml::{Ctx, DB_KEYS, KeySeed, Scalar, TOP_ONLY_KEYS, ValueSeed, boolean, text};
#[allow(unused_imports)]
use crate::config::*;

use crate::config::yaml::replica::{ReplicaSeed, ReplicasSeed};

pub(crate) const NO_DBS: &str = "configure at least one database under `dbs`";

/// Where a `dbs` entry's databases are: one `path`, or a `dir` to discover them in.
pub(crate) enum Source {
    Path(PathBuf),
    Dir(RawDir),
}

/// The discovery keys of a `dbs` entry with `dir`.
pub(crate) struct RawDir {
    pub(crate) dir: PathBuf,
    pub(crate) pattern: String,
    pub(crate) recursive: bool,
    pub(crate) watch: bool,
}

/// Key `dir`: made absolute. Whether it exists is checked by the daemon at start
/// ([`Config::check_dirs`]), not here: a restore may target a directory not created yet.
pub(crate) fn discovery_dir(s: Scalar<'_>) -> Result<PathBuf, String> {
    let p = text(s)?;
    if p.is_empty() {
        return Err("empty dir".into());
    }
    absolutize(Path::new(&p))
}

/// Key `pattern`: a glob on the file name.
pub(crate) fn name_pattern(s: Scalar<'_>) -> Result<String, String> {
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
pub(crate) struct PartialDb {
    pub(crate) source: Source,
    pub(crate) meta_path: Option<PathBuf>,
    pub(crate) replicas: Vec<ReplicaConfig>,
    pub(crate) settings: RawSettings,
}

/// The `dbs` list.
pub(crate) struct DbsSeed<'a> {
    pub(crate) ctx: &'a Ctx,
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

pub(crate) const PATH_AND_DIR: &str = "keys `path` and `dir` are mutually exclusive: a `dbs` entry is one \
                            database (`path`) or a directory to discover databases in (`dir`)";
pub(crate) const META_AND_DIR: &str = "keys `meta-path` and `dir` are mutually exclusive: each discovered \
                            database keeps its state next to itself";

/// One database map.
pub(crate) struct DbSeed<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) index: usize,
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
                object: r.object,
                sftp: r.sftp,
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
