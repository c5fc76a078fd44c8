//! Reading a configuration: the file (or a command line's single database), `$VAR`
//! expansion, paths made absolute, and the checks that span several databases.

use crate::config::url::{absolutize, redact_userinfo};
use crate::config::yaml::{parse_yaml, parse_yaml_with};
#[allow(unused_imports)]
use crate::config::*;

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

    /// [`Config::load`] for a command that never contacts a replica (`status`, `sync`,
    /// `databases`): the replicas' credentials (`access-key-id`, `secret-access-key`,
    /// `sse-customer-key`) are not read, so the variables they name need not be set. The
    /// clients of such a config hold no credentials: do not build them.
    pub fn load_without_credentials(path: &Path, expand_env: bool) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let origin = path.display().to_string();
        let text = if expand_env {
            expand_vars(&text, |name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
        } else {
            text
        };
        parse_yaml_with(&text, &origin, true).map(|c| c.litestream_compatible(&text))
    }

    /// Parses configuration text; `origin` names it in errors (usually the file's path).
    /// `expand_env` as for [`Config::load`].
    pub fn parse(text: &str, origin: &str, expand_env: bool) -> Result<Config, ConfigError> {
        if expand_env {
            warn_unset_vars(text, origin);
            Config::parse_with_env(text, origin, |name| {
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
            })
        } else {
            parse_yaml(text, origin).map(|c| c.litestream_compatible(text))
        }
    }

    /// [`Config::parse`] with expansion, variables looked up by `lookup` (tests cannot set the
    /// process environment safely).
    pub(crate) fn parse_with_env(
        text: &str,
        origin: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        parse_yaml(&expand_vars(text, lookup), origin).map(|c| c.litestream_compatible(text))
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
            let parsed = kind.parse_url(raw).map_err(in_url)?;
            if let Some(cfg) = &parsed.sftp {
                // In a config file the `user` key may complete the URL; here nothing can.
                cfg.validate().map_err(in_url)?;
            }
            let replica = ReplicaConfig {
                name: kind.default_name(i),
                url: parsed.url,
                s3: parsed.s3,
                object: parsed.object,
                sftp: parsed.sftp,
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
                codec: CodecOrigin::Default,
            }],
            dirs: Vec::new(),
            shutdown_sync_timeout: DEFAULT_SHUTDOWN_SYNC_TIMEOUT,
            addr: None,
            max_lag: DEFAULT_MAX_LAG,
            exec: None,
            logging: LoggingConfig::default(),
            socket: SocketConfig::default(),
            notify: Default::default(),
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

    /// Checks that no directory replica is a file that exists (the database itself, most
    /// likely, given by mistake for the replica): `replicate` refuses to start, where the
    /// replica would retry, never protected, until the stop.
    pub fn check_local_replicas(&self) -> Result<(), String> {
        for db in &self.dbs {
            let local = db
                .replicas
                .iter()
                .filter(|r| r.s3.is_none() && r.object.is_none() && r.sftp.is_none());
            for r in local {
                let Some(path) = r.url.strip_prefix("file://").map(Path::new) else {
                    continue;
                };
                let what = if path == db.path {
                    "the database itself"
                } else if std::fs::metadata(path).is_ok_and(|m| !m.is_dir()) {
                    "a file"
                } else {
                    continue;
                };
                return Err(format!(
                    "database {}: replica {} ({}) is {what}: a directory replica is a \
                     directory of LTX files; give a directory path",
                    db.path.display(),
                    r.name,
                    path.display()
                ));
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

/// A WARN line for each variable a configuration names (outside comments) that is not set:
/// it expands to an empty string, as in Litestream, which silently turns `${ROOT}/app`
/// into `/app`.
pub fn warn_unset_vars(text: &str, origin: &str) {
    for name in unset_vars(text, |name| std::env::var_os(name).is_some()) {
        tracing::warn!(config = origin, variable = %name,
            "${{{name}}} is not set: it expands to an empty string (a path under it becomes \
             one under /)");
    }
}

/// The variables `text` names outside YAML comments that `is_set` says are not set, each
/// once, in order.
pub(crate) fn unset_vars(text: &str, is_set: impl Fn(&str) -> bool) -> Vec<String> {
    let unset = std::cell::RefCell::new(Vec::<String>::new());
    for line in text.lines() {
        // A `#` at the start or after a blank starts a comment (quotes aside).
        let code = match line.find('#') {
            Some(0) => "",
            Some(i) if line[..i].ends_with([' ', '\t']) => &line[..i],
            _ => line,
        };
        expand_vars(code, |name| {
            let mut u = unset.borrow_mut();
            if !is_set(name) && !u.iter().any(|n| n == name) {
                u.push(name.to_string());
            }
            None
        });
    }
    unset.into_inner()
}

/// Replaces `${NAME}` and `$NAME` (NAME = `[A-Za-z_][A-Za-z0-9_]*`) by `lookup(NAME)`, or by
/// nothing when it returns `None`. Any other `$` is kept.
pub(crate) fn expand_vars(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    pub(crate) fn name_len(s: &str) -> usize {
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

impl Config {
    /// A Litestream config file (no key only replicad reads) writes `lz4`, the one codec
    /// Litestream restores, so that its user keeps the way back.
    fn litestream_compatible(mut self, text: &str) -> Config {
        if !litestream_file(text) {
            return self;
        }
        let dbs = self.dbs.iter_mut().map(|d| (&mut d.settings, &mut d.codec));
        let dirs = self
            .dirs
            .iter_mut()
            .map(|d| (&mut d.settings, &mut d.codec));
        for (settings, codec) in dbs.chain(dirs) {
            if *codec == CodecOrigin::Default {
                settings.compression = Codec::Lz4;
                *codec = CodecOrigin::LitestreamFile;
            }
        }
        self
    }
}

/// True when `text` names no key of [`REPLICAD_ONLY_KEYS`], at any depth.
pub(crate) fn litestream_file(text: &str) -> bool {
    fn replicad_key(v: &serde_norway::Value) -> bool {
        match v {
            serde_norway::Value::Mapping(m) => m.iter().any(|(k, v)| {
                k.as_str().is_some_and(|k| REPLICAD_ONLY_KEYS.contains(&k)) || replicad_key(v)
            }),
            serde_norway::Value::Sequence(s) => s.iter().any(replicad_key),
            serde_norway::Value::Tagged(t) => replicad_key(&t.value),
            _ => false,
        }
    }
    serde_norway::from_str::<serde_norway::Value>(text).is_ok_and(|v| !replicad_key(&v))
}
