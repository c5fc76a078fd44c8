//! `replicad snapshot`: exports a plain SQLite database file (optionally gzip-compressed) of a
//! replica's state, the latest or at a target TXID or time.
//!
//! The state is rebuilt with [`restore::apply`] (every check of a restore, `PRAGMA
//! integrity_check` included) into a hidden work file beside the output, then published:
//! - `FILE` not ending in `.gz`: the work file is renamed to `FILE` (already fsynced by the
//!   restore), and the directory fsynced;
//! - `FILE.gz`: the work file is streamed through a gzip encoder (level 6) into `FILE.tmp`,
//!   which is fsynced and renamed to `FILE`; the work file is removed. Memory stays one copy
//!   buffer whatever the size of the database.
//!
//! An existing `FILE` is replaced only with `--force`. The work file never outlives the run.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, anyhow};
use clap::Args;
use flate2::Compression;
use flate2::write::GzEncoder;

use super::CliError;
use super::source::{refuse_output_in_replica, source, target};
use crate::restore::{self, RestoreOptions};
use crate::util::fsutil;
use crate::util::stop::{Gate, Stoppable};

/// The gzip level of `.gz` snapshots.
const GZIP_LEVEL: u32 = 6;

/// Copy buffer of the gzip stream.
const COPY_BUFFER: usize = 256 * 1024;

/// Arguments of `replicad snapshot`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Export a plain SQLite database file of a replica's state: the latest state, \
or the state at --txid or before --timestamp.\n\n\
The database is rebuilt exactly as `replicad restore` does (checksums, page coverage and \
PRAGMA integrity_check are verified) into a hidden work file beside FILE, then renamed to \
FILE. If FILE ends in `.gz`, the database is instead streamed through gzip (level 6) into \
FILE.tmp, fsynced and renamed to FILE. An existing FILE is replaced only with --force.\n\n\
The source is a replica URL (`file:///abs/path`, a directory, or `s3://BUCKET/PATH?...`), or, \
with --config, the path of a configured database, whose replica is used."
)]
pub struct SnapshotArgs {
    /// Replica to export (`file:///abs/path`, a directory, or `s3://BUCKET/PATH?...`); with
    /// --config, the path of a configured database (DB_PATH).
    #[arg(value_name = "DB_PATH|REPLICA_URL")]
    pub source: String,
    /// Output file; gzip-compressed if it ends in `.gz`.
    #[arg(long = "to", short = 'o', value_name = "FILE")]
    pub to: PathBuf,
    /// Export the state right after this TXID (16 hex digits).
    #[arg(long, value_name = "HEX16", conflicts_with = "timestamp")]
    pub txid: Option<String>,
    /// Export the newest state written strictly before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub timestamp: Option<String>,
    /// Overwrite an existing output file (and, for a plain database, remove its -wal, -journal
    /// and -shm files, which SQLite would otherwise replay onto the snapshot).
    #[arg(long)]
    pub force: bool,
    /// Configuration file: export the replica of the database DB_PATH (the positional
    /// argument).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config, the replica to export from (default: the first).
    #[arg(long = "replica", value_name = "NAME", requires = "config")]
    pub replica_name: Option<String>,
    /// Do not expand $VAR and ${VAR} in the configuration file.
    #[arg(long)]
    pub no_expand_env: bool,
    /// An age identity file to decrypt an encrypted replica with (repeatable; with
    /// --config, tried after the replica's configured `age.identities`).
    #[arg(long = "age-identity", value_name = "FILE")]
    pub age_identity: Vec<PathBuf>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `replicad snapshot`.
pub async fn run(args: SnapshotArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let (client, _db) = source(
        &args.source,
        args.config.as_deref(),
        args.replica_name.as_deref(),
        !args.no_expand_env,
        &args.age_identity,
    )?;
    let target = target(args.txid.as_deref(), args.timestamp.as_deref())?;
    let to = args.to.clone();
    let gzip = to.to_string_lossy().ends_with(".gz");
    if to.is_dir() {
        return Err(CliError::Usage(format!(
            "--to {} is a directory; give a file name",
            to.display()
        )));
    }
    refuse_output_in_replica(&client, &to)?;
    check_output(&to, gzip, args.force)?;

    let plan = restore::plan(&client, target)
        .await
        .map_err(|e| anyhow!(e))?;
    let work = WorkFile::beside(&to);
    let opts = RestoreOptions {
        to: work.path.clone(),
        target,
        force: false,
        integrity_check: true,
        phases: Default::default(),
        threads: None,
    };
    let report = restore::apply(&client, plan, &opts)
        .await
        .map_err(|e| anyhow!(e))?;

    // Dropped with this future (a signal): compression stops and nothing is published.
    let gate = Gate::default();
    let _stop = gate.stop_on_drop();
    let (work_path, dest, force) = (work.path.clone(), to.clone(), args.force);
    tokio::task::spawn_blocking(move || publish(&work_path, &dest, gzip, force, &gate))
        .await
        .map_err(|e| anyhow!("snapshot task failed: {e}"))??;
    drop(work);

    let written = fs::metadata(&to)
        .with_context(|| format!("stat {}", to.display()))?
        .len();
    let db_size = u64::from(report.pages) * u64::from(report.page_size);
    let duration_ms = started.elapsed().as_millis();
    if args.json {
        let v = serde_json::json!({
            "path": to,
            "replica": report.replica,
            "txid": report.txid,
            "gzip": gzip,
            "bytes_written": written,
            "db_size": db_size,
            "page_size": report.page_size,
            "pages": report.pages,
            "files": report.files.len(),
            "bytes_read": report.bytes,
            "db_checksum": report.db_checksum,
            "integrity_check": report.integrity_check,
            "duration_ms": duration_ms,
        });
        out!("{v}");
    } else {
        out!(
            "snapshot of {} at TXID {} written to {} ({} pages of {} bytes, {db_size} bytes{}, integrity_check {}{}) in {duration_ms} ms",
            report.replica,
            report.txid,
            to.display(),
            report.pages,
            report.page_size,
            if gzip {
                format!(", gzip {written} bytes")
            } else {
                String::new()
            },
            report.integrity_check,
            report
                .db_checksum
                .as_ref()
                .map(|c| format!(", checksum {c} verified"))
                .unwrap_or_default(),
        );
    }
    Ok(())
}

/// Refuses an existing output (for a plain database, also a `-wal` or `-journal` beside it:
/// [`restore::check_output`]) unless `force`.
fn check_output(to: &Path, gzip: bool, force: bool) -> Result<(), CliError> {
    if gzip && !force && to.symlink_metadata().is_ok() {
        return Err(CliError::Runtime(anyhow!(
            "{} already exists; pass --force to overwrite it",
            to.display()
        )));
    }
    if !gzip {
        restore::check_output(to, force).map_err(|e| CliError::Runtime(e.into()))?;
    }
    Ok(())
}

/// Moves the restored `work` file to `to`, gzip-compressing it on the way for `.gz`; nothing
/// once `gate` is stopped.
fn publish(work: &Path, to: &Path, gzip: bool, force: bool, gate: &Gate) -> anyhow::Result<()> {
    let stopped = || Err(anyhow!("stopped"));
    if gzip {
        // Claimed until it is placed: another snapshot to this path is refused, not mixed in.
        let (tmp, out) = fsutil::claim_tmp(to).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => anyhow!(
                "another snapshot to {} is running (it holds {}); wait for it to end",
                to.display(),
                fsutil::tmp_path(to).display()
            ),
            _ => anyhow!(e).context(format!("create {}", fsutil::tmp_path(to).display())),
        })?;
        let result = compress(work, &out, &tmp, gate).and_then(|()| {
            gate.unless_stopped(|| place(&tmp, to, force))
                .unwrap_or_else(stopped)
        });
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        drop(out);
        result?;
        let dir = fsutil::parent_dir(to);
        return fsutil::fsync_dir(dir).with_context(|| format!("fsync {}", dir.display()));
    }
    // Placed durably (the directory fsynced), as a restore's output is.
    gate.unless_stopped(|| Ok(restore::place(work, to, force)?))
        .unwrap_or_else(stopped)
}

/// Moves the finished `src` to `to`. Without `force` the move never replaces a file that
/// appeared since the check at the start: a hard link is created (failing if `to` exists),
/// then `src` unlinked; where hard links are unsupported, it falls back to check-then-rename.
fn place(src: &Path, to: &Path, force: bool) -> anyhow::Result<()> {
    let exists = || {
        anyhow!(
            "{} already exists; pass --force to overwrite it",
            to.display()
        )
    };
    if !force {
        match fs::hard_link(src, to) {
            Ok(()) => {
                return fs::remove_file(src).with_context(|| format!("remove {}", src.display()));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(exists()),
            Err(_) if to.symlink_metadata().is_ok() => return Err(exists()),
            Err(_) => {}
        }
    }
    fs::rename(src, to).with_context(|| format!("rename to {}", to.display()))
}

/// Streams `src` through gzip into a new `dest`, then fsyncs it (until `gate` stops).
fn compress(src: &Path, out: &File, dest: &Path, gate: &Gate) -> anyhow::Result<()> {
    let input = File::open(src).with_context(|| format!("open {}", src.display()))?;
    let mut input = Stoppable::new(input, gate.token().clone());
    let mut enc = GzEncoder::new(out, Compression::new(GZIP_LEVEL));
    let mut buf = vec![0u8; COPY_BUFFER];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("read {}", src.display())),
        };
        enc.write_all(&buf[..n])
            .with_context(|| format!("write {}", dest.display()))?;
    }
    let out = enc
        .finish()
        .with_context(|| format!("write {}", dest.display()))?;
    out.sync_all()
        .with_context(|| format!("fsync {}", dest.display()))
}

/// The hidden file beside the output that the restore writes; removed (with the restore's own
/// `.tmp`) when dropped, whatever happened.
struct WorkFile {
    path: PathBuf,
}

impl WorkFile {
    fn beside(to: &Path) -> WorkFile {
        let name = to
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "snapshot".into());
        let path = fsutil::parent_dir(to).join(format!(
            ".{name}.replicad-snapshot-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        WorkFile { path }
    }
}

impl Drop for WorkFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        let _ = fs::remove_file(fsutil::tmp_path(&self.path));
    }
}
