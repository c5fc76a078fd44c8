//! Where a command reads from: a replica URL, or a configured database's replica; and the
//! restore target of `--txid` / `--timestamp`. Shared by `restore`, `snapshot` and `verify`.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::CliError;
use crate::config::{Config, DbConfig};
use crate::ltx::TxId;
use crate::restore::Target;
use crate::storage::AnyClient;
use crate::storage::age::keys::AgeKeys;

/// The restore target of `--txid` / `--timestamp` (latest when neither is given).
pub fn target(txid: Option<&str>, timestamp: Option<&str>) -> Result<Target, CliError> {
    if let Some(t) = txid {
        let txid: TxId = t
            .parse()
            .map_err(|e| CliError::Usage(format!("--txid: {e}")))?;
        if txid.0 == 0 {
            return Err(CliError::Usage(
                "--txid 0000000000000000: TXIDs start at 0000000000000001".into(),
            ));
        }
        return Ok(Target::TxId(txid));
    }
    if let Some(ts) = timestamp {
        let t = DateTime::parse_from_rfc3339(ts)
            .map_err(|e| CliError::Usage(format!("--timestamp {ts:?} is not RFC 3339: {e}")))?;
        return Ok(Target::Before(t.with_timezone(&Utc)));
    }
    Ok(Target::Latest)
}

/// Refuses an output among a directory replica's own files (its `ltx/` tree and its lease),
/// where writing (and `--force` replacing) would change the backup being read. Elsewhere
/// under the replica's root, nothing reads a file.
pub fn refuse_output_in_replica(client: &AnyClient, to: &Path) -> Result<(), CliError> {
    let Some(root) = client.local_root() else {
        return Ok(());
    };
    let ltx = root.join("ltx");
    let lease = root.join(crate::storage::LEASE_NAME);
    if is_inside(to, &ltx) || resolved(to).is_some_and(|t| resolved(&lease) == Some(t)) {
        return Err(CliError::Usage(format!(
            "--to {} is one of the replica's own files (under {}, or its lease): writing there \
             would change the backup it reads; give a path outside them",
            to.display(),
            ltx.display()
        )));
    }
    Ok(())
}

/// `path` with its directory resolved (symlinks, `..`); the file itself need not exist.
fn resolved(path: &Path) -> Option<PathBuf> {
    let path = std::path::absolute(path).ok()?;
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => dir.canonicalize().ok().map(|d| d.join(name)),
        _ => path.canonicalize().ok(),
    }
}

/// Whether `path` (which may not exist yet) lies under the directory `root`, through any
/// symlink or `..` in either.
fn is_inside(path: &Path, root: &Path) -> bool {
    match (resolved(path), root.canonicalize()) {
        (Some(p), Ok(root)) => p.starts_with(root),
        _ => false,
    }
}

/// Whether `path` is an existing regular file starting with the SQLite header string.
fn is_sqlite_file(path: &Path) -> bool {
    let mut magic = [0u8; 16];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"SQLite format 3\0"
}

/// The client of the replica to read, and the configured database in `--config` mode.
///
/// `arg` is a replica URL, or with `config` the path of a configured database (the replica
/// `replica_name`, else the first). Without `config`, an existing regular file cannot be a
/// replica (replicas are directories or URLs): that is a usage error asking for a replica URL
/// or `--config`.
pub fn source(
    arg: &str,
    config: Option<&Path>,
    replica_name: Option<&str>,
    expand_env: bool,
    age_identities: &[PathBuf],
) -> Result<(AnyClient, Option<DbConfig>), CliError> {
    // Identity files given on the command line: a missing or bad one is a usage error,
    // never a silent "no identity".
    let extra = AgeKeys::from_identity_files(age_identities)
        .map_err(|e| CliError::Usage(format!("--age-identity: {e}")))?;
    let Some(config_path) = config else {
        let p = Path::new(arg);
        if p.is_file() {
            let what = if is_sqlite_file(p) {
                "a SQLite database"
            } else {
                "a file"
            };
            return Err(CliError::Usage(format!(
                "{arg} is {what}, not a replica: give a replica URL (file:///path, a replica \
                 directory, s3://BUCKET/PATH), or --config FILE to use the database's \
                 configured replica"
            )));
        }
        let client = AnyClient::from_url(arg).map_err(CliError::Usage)?;
        return Ok((client.with_age(Arc::new(extra)), None));
    };
    let config =
        Config::load(config_path, expand_env).map_err(|e| CliError::Usage(e.to_string()))?;
    let db = config
        .find_db(Path::new(arg))
        .cloned()
        .or_else(|| config.find_discovered(Path::new(arg)));
    let db = db.ok_or_else(|| {
        CliError::Usage(format!(
            "database {arg} is not in {}",
            config_path.display()
        ))
    })?;
    let replica = match replica_name {
        Some(name) => db.replicas.iter().find(|r| r.name == name).ok_or_else(|| {
            let names: Vec<&str> = db.replicas.iter().map(|r| r.name.as_str()).collect();
            CliError::Usage(format!(
                "database {arg} has no replica {name:?} (it has {names:?})"
            ))
        })?,
        None => db
            .replicas
            .first()
            .ok_or_else(|| CliError::Usage(format!("database {arg} has no replica")))?,
    };
    let mut keys = replica.age.as_deref().cloned().unwrap_or_default();
    keys.merge_identities(&extra);
    let client = replica
        .client()
        .map_err(|e| CliError::Usage(format!("replica {}: {e}", replica.name)))?
        .with_age(Arc::new(keys));
    Ok((client, Some(db)))
}
