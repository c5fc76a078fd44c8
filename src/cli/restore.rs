//! `replicad restore`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;

use super::CliError;
use super::source::{refuse_output_in_replica, source, target};
use crate::restore::{self, RestoreError, RestoreOptions};
use crate::storage::ReplicaClient;
use crate::util::stop::Gate;

/// Arguments of `replicad restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// Replica to restore from (`file:///abs/path`, a directory, or `s3://BUCKET/PATH?...`); with
    /// --config, the path of a configured database.
    #[arg(value_name = "REPLICA_URL")]
    pub replica: String,
    /// Configuration file: restore the database DB_PATH (the positional argument) from its
    /// replica, by default to DB_PATH itself.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config, the replica to restore from (default: the first).
    #[arg(long = "replica", value_name = "NAME", requires = "config")]
    pub replica_name: Option<String>,
    /// Do not expand $VAR and ${VAR} in the configuration file.
    #[arg(long)]
    pub no_expand_env: bool,
    /// An age identity file to decrypt an encrypted replica with (repeatable; with
    /// --config, tried after the replica's configured `age.identities`).
    #[arg(long = "age-identity", value_name = "FILE")]
    pub age_identity: Vec<PathBuf>,
    /// Output database path.
    #[arg(long = "to", short = 'o', value_name = "PATH")]
    pub to: Option<PathBuf>,
    /// Restore the state right after this TXID (16 hex digits).
    #[arg(long, value_name = "HEX16", conflicts_with = "timestamp")]
    pub txid: Option<String>,
    /// Restore the newest state written strictly before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub timestamp: Option<String>,
    /// Overwrite an existing output database (and remove its -wal, -journal and -shm files,
    /// and the -txid of a `--follow` that kept it; one still running is never overwritten).
    #[arg(long)]
    pub force: bool,
    /// Write over a database that a running `replicad replicate` holds (its lock in the
    /// database's `.<name>-replicad` directory). Refused without it: the daemon notices the
    /// new file and replicates it as a full copy, which is rarely what a restore meant.
    #[arg(long)]
    pub while_replicating: bool,
    /// Do nothing, successfully, if the output database already exists.
    #[arg(long)]
    pub if_db_not_exists: bool,
    /// Do nothing, successfully, if the replica holds no backup. A directory replica whose
    /// directory does not exist is still an error (a typo must not start an application on
    /// an empty database), unless --if-replica-missing-ok.
    #[arg(long)]
    pub if_replica_exists: bool,
    /// With --if-replica-exists: a directory replica that does not exist counts as empty.
    #[arg(long, requires = "if_replica_exists")]
    pub if_replica_missing_ok: bool,
    /// List the restore points (snapshots, and the TXIDs a restore reaches) and write nothing.
    #[arg(long, conflicts_with_all = ["to", "txid", "timestamp", "force", "dry_run", "follow", "if_db_not_exists", "if_replica_exists", "while_replicating", "no_integrity_check"])]
    pub list: bool,
    /// Print the plan (files, levels, sizes) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip `PRAGMA integrity_check` on the restored database.
    #[arg(long)]
    pub no_integrity_check: bool,
    /// Litestream's `-integrity-check LEVEL`; `quick` and `full` both run the full check, and
    /// an unknown level is refused with the valid ones named.
    #[arg(long = "integrity-check", value_name = "LEVEL", hide = true, value_parser = ["none", "quick", "full"])]
    pub integrity_check_level: Option<String>,
    /// Ranged GETs in flight while downloading from a remote replica; each holds up to 2 MiB
    /// in memory until it has been applied.
    #[arg(long, value_name = "N", default_value_t = restore::DEFAULT_PARALLELISM, value_parser = parse_parallelism)]
    pub parallelism: usize,
    /// Keep the output up to date (a read replica): restore, record the TXID in
    /// `<PATH>-txid`, then apply each new LTX file in place every --follow-interval until
    /// SIGINT or SIGTERM. An output with its `<PATH>-txid` is resumed, without --force.
    #[arg(long, short = 'f', conflicts_with_all = ["dry_run", "txid", "timestamp", "if_db_not_exists"])]
    pub follow: bool,
    /// How often --follow polls the replica (e.g. 1s, 100ms).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "1s",
        value_parser = parse_follow_interval,
        requires = "follow"
    )]
    pub follow_interval: Duration,
}

impl RestoreArgs {
    /// Whether the restored database is checked: `--no-integrity-check` and Litestream's
    /// `-integrity-check none` turn it off.
    fn integrity_check(&self) -> bool {
        !self.no_integrity_check && self.integrity_check_level.as_deref() != Some("none")
    }
}

fn parse_parallelism(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=256).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: expected a number from 1 to 256")),
    }
}

fn parse_follow_interval(s: &str) -> Result<Duration, String> {
    match crate::config::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("the interval must be greater than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{s:?}: {e} (use a unit, e.g. 1s or 500ms)")),
    }
}

/// Runs `replicad restore`.
pub async fn run(args: RestoreArgs) -> Result<(), CliError> {
    let (client, db) = source(
        &args.replica,
        args.config.as_deref(),
        args.replica_name.as_deref(),
        !args.no_expand_env,
        &args.age_identity,
    )?;
    if args.list {
        let calendar = db.as_ref().map(|d| d.settings.calendar);
        return super::restore_list::run(&client, calendar, args.json).await;
    }
    let meta_of_db = db.as_ref().map(|d| (d.path.clone(), d.meta_path.clone()));
    let default_to = db.map(|d| d.path);
    let target = target(args.txid.as_deref(), args.timestamp.as_deref())?;
    let to = match (&args.to, default_to, args.dry_run) {
        (Some(to), _, _) => to.clone(),
        (None, Some(db), _) => db,
        (None, None, true) => PathBuf::new(),
        (None, None, false) => {
            return Err(CliError::Usage(
                "restore from a replica URL needs --to PATH".into(),
            ));
        }
    };
    if !args.dry_run && to.is_dir() {
        return Err(CliError::Usage(format!(
            "--to {} is a directory: give the path of the database file to write",
            to.display()
        )));
    }
    if !args.dry_run {
        refuse_output_in_replica(&client, &to)?;
    }
    // Before the lock: a skip writes nothing, so a daemon that holds the database (a pod's
    // init container while the old pod's sidecar still runs) is no reason to fail.
    if args.if_db_not_exists && !args.dry_run && !args.follow && to.exists() {
        out!("database {} already exists, skipping restore", to.display());
        return Ok(());
    }
    if !args.dry_run && !args.while_replicating && to.exists() {
        let meta = match meta_of_db {
            Some((path, Some(meta))) if path == to => meta,
            _ => crate::replicate::db::default_meta_path(&to),
        };
        if crate::replicate::staging::StagingLock::is_held(&meta) {
            return Err(CliError::Runtime(anyhow!(
                "{} is being replicated by a running replicad (lock {}); stop it first, or \
                 pass --while-replicating to write over it anyway",
                to.display(),
                meta.join("lock").display()
            )));
        }
    }
    if args.follow {
        let opts = crate::restore::follow::FollowOptions {
            to,
            interval: args.follow_interval,
            force: args.force,
            integrity_check: args.integrity_check(),
        };
        return follow_until_signal(&client, &opts)
            .await
            .map_err(CliError::Runtime);
    }
    let plan = match restore::plan(&client, target).await {
        Ok(plan) => plan,
        Err(RestoreError::NoBackups(_)) if args.if_replica_exists => {
            if let Some(root) = client.local_root().filter(|r| !r.exists())
                && !args.if_replica_missing_ok
            {
                return Err(CliError::Runtime(anyhow!(
                    "replica directory {} does not exist (a typo?); nothing was restored. \
                     Pass --if-replica-missing-ok to treat a missing replica like an empty one",
                    root.display()
                )));
            }
            out!(
                "no backups found on {}, skipping restore",
                client.location()
            );
            return Ok(());
        }
        Err(RestoreError::NoBackups(_)) if client.local_root().is_some_and(|r| !r.exists()) => {
            return Err(CliError::Runtime(anyhow!(
                "replica directory {} does not exist (a typo?); nothing was restored",
                client
                    .local_root()
                    .map(|r| r.display().to_string())
                    .unwrap_or_default()
            )));
        }
        Err(e) => return Err(anyhow!(e).into()),
    };
    if args.dry_run {
        print_plan(&plan, args.json)?;
        return Ok(());
    }
    let opts = RestoreOptions {
        to,
        target,
        force: args.force,
        integrity_check: args.integrity_check(),
        phases: Default::default(),
        threads: None,
    };
    // A signal stops the restore and waits for it: it removes its temporary output, or had
    // already published the output, and says which. A second signal does not wait.
    let gate = Gate::default();
    let restore = restore::apply_until(&client, plan, &opts, args.parallelism, &gate);
    tokio::pin!(restore);
    let first = super::stop_signal().map_err(CliError::Runtime)?;
    let (result, signal) = tokio::select! {
        biased;
        r = &mut restore => (r, None),
        signal = first => {
            gate.stop();
            let second = super::stop_signal().map_err(CliError::Runtime)?;
            tokio::select! {
                biased;
                r = &mut restore => (r, Some(signal)),
                again = second => {
                    return Err(CliError::Runtime(anyhow!(
                        "{again} again: restore abandoned before it ended; {} may be left",
                        crate::util::fsutil::tmp_path(&opts.to).display()
                    )));
                }
            }
        }
    };
    let report = match (result, signal) {
        (Err(RestoreError::Cancelled), Some(signal)) => {
            return Err(CliError::Runtime(anyhow!(
                "{signal}: restore stopped; nothing was written to {}",
                opts.to.display()
            )));
        }
        (r, _) => r.map_err(|e| anyhow!(e))?,
    };
    if args.json {
        out!(
            "{}",
            serde_json::to_string(&report).map_err(|e| anyhow!(e))?
        );
    } else {
        out!(
            "restored {} to TXID {} from {} ({} file{}, {} bytes, {} pages of {} bytes, integrity_check {}{}) in {} ms",
            report.db_path.display(),
            report.txid,
            report.replica,
            report.files.len(),
            if report.files.len() == 1 { "" } else { "s" },
            report.bytes,
            report.pages,
            report.page_size,
            report.integrity_check,
            report
                .db_checksum
                .as_ref()
                .map(|c| format!(", checksum {c} verified"))
                .unwrap_or_default(),
            report.duration_ms
        );
    }
    Ok(())
}

fn print_plan(plan: &[crate::storage::LtxFileInfo], json: bool) -> Result<(), CliError> {
    let files: Vec<restore::PlannedFile> = plan.iter().map(Into::into).collect();
    if json {
        let total: u64 = files.iter().map(|f| f.size).sum();
        let txid = files.last().map(|f| f.max_txid.clone()).unwrap_or_default();
        let v = serde_json::json!({ "txid": txid, "files": files, "bytes": total });
        out!("{v}");
        return Ok(());
    }
    out!(
        "{:<6} {:<17} {:<17} {:>12}",
        "level",
        "min_txid",
        "max_txid",
        "size"
    );
    for f in &files {
        out!(
            "{:<6} {:<17} {:<17} {:>12}",
            f.level,
            f.min_txid,
            f.max_txid,
            f.size
        );
    }
    let total: u64 = files.iter().map(|f| f.size).sum();
    let plural = if files.len() == 1 { "" } else { "s" };
    out!("{} file{plural}, {total} bytes", files.len());
    Ok(())
}

/// [`crate::restore::follow::run`] until SIGINT or SIGTERM (signals are the CLI's business).
async fn follow_until_signal(
    client: &crate::storage::AnyClient,
    opts: &crate::restore::follow::FollowOptions,
) -> anyhow::Result<()> {
    let stopped = super::stop_signal()?;
    let shutdown = async move {
        let signal = stopped.await;
        tracing::info!("{signal}: stopping");
    };
    crate::restore::follow::run(client, opts, shutdown).await?;
    Ok(())
}
