//! Restore: plan a chain of LTX files for a target, then apply it into a new database file.
//!
//! The plan is a pure function of a listing and a target ([`calc_plan`]): the newest level-9
//! snapshot at or before the target, then, step by step, the file (any of levels 8..0) that
//! starts inside the restored range and reaches furthest. A gap is refused, naming the
//! missing TXIDs.
//!
//! Apply walks the chain newest first and writes each page number once, the first time it is
//! seen (the newest copy wins, as upstream's compactor decides), with positional writes into
//! `<to>.tmp` ([`OutputFile`]: around the page cache when unchecked), decoded by a thread per
//! core by default ([`RestoreOptions::threads`], `pages`), which also write the pages when they go through the page cache (direct
//! writes go out from the reading thread in 1 MiB runs). Memory is two batches of 256 KiB of
//! pages and their stored frames per thread, the 1 MiB run, a bitmap of written pages and,
//! from a remote replica, a [`DownloadWindow`] of `parallelism` chunks, whatever the size of
//! the database.
//!
//! Invariants:
//! - The output path is never touched until every file checksum, the page coverage, the
//!   database checksum (when the files carry one) and `PRAGMA integrity_check` have passed;
//!   then `<to>.tmp` is fsynced and renamed over `<to>`, and the directory fsynced.
//! - An existing database (or a stray `-wal` beside it, which SQLite would replay) is replaced
//!   only with `force`.
//! - `<to>.tmp` is this restore's alone from its creation to its rename (an exclusive `flock`,
//!   [`fsutil::claim_tmp`]): a second restore to `<to>` meanwhile fails, where it used to
//!   recreate the file under the first, which then published the second's pages.

pub mod download;
pub mod follow;
pub mod output;
mod progress;

use progress::Progress;
use std::fs;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::util::stop::Gate;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::io::SyncIoBridge;

use crate::ltx::checksum::DbChecksum;
use crate::ltx::{self, Decoder, Header, LtxError, TxId, lock_pgno};
use crate::restore::download::{DownloadWindow, Slot};
use crate::restore::output::OutputFile;
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;
use crate::util::phase::{Phase, PhaseStats};

mod apply;
mod check;
mod pages;
mod plan;
pub mod points;
use apply::{apply_blocking, file_label};
pub use check::integrity_check;
pub use plan::{calc_plan, plan};

/// What state to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The newest state on the replica.
    Latest,
    /// The state right after this TXID.
    TxId(TxId),
    /// The newest state whose data was written strictly before this time.
    Before(DateTime<Utc>),
}

/// Why a restore failed. Nothing was written to the output path in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The replica holds no LTX files.
    #[error("no backup files on replica {0}")]
    NoBackups(String),
    /// The replica's chain has a hole.
    #[error("the replica's TXID chain has a gap: TXIDs {from} to {to} are missing")]
    Gap {
        /// First missing TXID.
        from: TxId,
        /// Last missing TXID.
        to: TxId,
    },
    /// The target lies outside what the replica can restore.
    #[error("cannot restore {target}: {reason}")]
    NotAvailable {
        /// The requested target, as text.
        target: String,
        /// Why, with the range that is available.
        reason: String,
    },
    /// The output exists and `force` was not given.
    #[error("{0} already exists; pass --force to overwrite it")]
    Exists(PathBuf),
    /// A file of the chain is corrupt or invalid.
    #[error("replica file {file}: {source}")]
    Ltx {
        /// Level and name of the file.
        file: String,
        /// The codec's error.
        source: LtxError,
    },
    /// The chain's files do not fit together.
    #[error("{0}")]
    Inconsistent(String),
    /// A followed database's next file starts from another state than the database's.
    #[error(
        "replica file {file} does not continue the followed history: pre-apply checksum \
         {pre:016x}, previous post-apply {prev:016x} (was the replica replaced?)"
    )]
    Diverged {
        /// The file's name.
        file: String,
        /// Its pre-apply checksum.
        pre: u64,
        /// The database's checksum.
        prev: u64,
    },
    /// A resumed follower's database is not the replica's state at its TXID.
    #[error(
        "{} at TXID {txid} is not this replica's state at that TXID ({reason}): it was \
         followed from another replica; nothing was applied. Remove it and its -txid to \
         restore it afresh from this replica",
        db.display()
    )]
    NotFollowed {
        /// The database.
        db: PathBuf,
        /// The TXID its `-txid` names.
        txid: TxId,
        /// Why its first file did not fit.
        reason: String,
    },
    /// A resumed follower's database was followed from another replica, and this one cannot
    /// show that it holds the same state at its TXID (its files carry no checksums there).
    #[error(
        "{} at TXID {txid} was followed from {before}, and this replica ({now}) cannot show \
         that it holds the same state ({why}): nothing was applied. Follow it from {before} \
         again, or remove it and its -txid to restore it afresh from this replica",
        db.display()
    )]
    Unproven {
        /// The database.
        db: PathBuf,
        /// The TXID its `-txid` names.
        txid: TxId,
        /// The replica it was followed from, as its last clean stop recorded it.
        before: String,
        /// This replica.
        now: String,
        /// Why no check was possible.
        why: String,
    },
    /// Reading the replica failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A local file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// Operation.
        op: &'static str,
        /// Path involved.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// SQLite found the rebuilt database damaged.
    #[error("restored database fails PRAGMA integrity_check: {0}")]
    Integrity(String),
    /// Another restore (or snapshot) to the same output is writing its temporary file.
    #[error("another restore to {} is running (it holds {}.tmp); wait for it to end", .0.display(), .0.display())]
    Busy(PathBuf),
    /// The restore's future was dropped (a daemon's verify at shutdown, say) and its blocking
    /// side stopped.
    #[error("the restore was cancelled")]
    Cancelled,
}

impl RestoreError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
        let path = path.to_path_buf();
        move |source| RestoreError::Io { op, path, source }
    }
}

/// Options of one restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// Output database path.
    pub to: PathBuf,
    /// Target state.
    pub target: Target,
    /// Replace an existing output.
    pub force: bool,
    /// Run `PRAGMA integrity_check` before publishing.
    pub integrity_check: bool,
    /// Where the download and apply phases are counted (a Store's for its verifies, else
    /// the restore's own).
    pub phases: Arc<PhaseStats>,
    /// Threads that decode pages (at most 4) and connections that check the output (at most
    /// 8): `None` for one per core. A daemon's periodic verify takes one of each, so that it
    /// leaves the application the other cores (its reading thread runs beside the decoder).
    pub threads: Option<NonZeroUsize>,
}

/// One file of a plan, for `--dry-run` and `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedFile {
    /// Level.
    pub level: u8,
    /// First TXID.
    pub min_txid: String,
    /// Last TXID.
    pub max_txid: String,
    /// Bytes.
    pub size: u64,
}

impl From<&LtxFileInfo> for PlannedFile {
    fn from(f: &LtxFileInfo) -> Self {
        PlannedFile {
            level: f.level,
            min_txid: f.min_txid.to_string(),
            max_txid: f.max_txid.to_string(),
            size: f.size,
        }
    }
}

/// What a restore did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    /// Output path.
    pub db_path: PathBuf,
    /// Replica location.
    pub replica: String,
    /// TXID restored.
    pub txid: String,
    /// Files applied, oldest first.
    pub files: Vec<PlannedFile>,
    /// Bytes read from the replica.
    pub bytes: u64,
    /// Page size.
    pub page_size: u32,
    /// Database size in pages.
    pub pages: u32,
    /// The database checksum proven equal to the source's, if the files carried one.
    pub db_checksum: Option<String>,
    /// `ok`, or `skipped`.
    pub integrity_check: &'static str,
    /// Wall time.
    pub duration_ms: u128,
    /// Decoder threads that ran.
    #[serde(skip)]
    pub threads: usize,
    /// Connections the integrity check ran on (0 when it was skipped).
    #[serde(skip)]
    pub check_connections: usize,
}

/// Applies `plan` into `opts.to` (see the module doc for the guarantees).
pub async fn apply(
    client: &AnyClient,
    plan: Vec<LtxFileInfo>,
    opts: &RestoreOptions,
) -> Result<RestoreReport, RestoreError> {
    apply_parallel(client, plan, opts, DEFAULT_PARALLELISM).await
}

/// Default number of ranged GETs in flight during a restore.
pub const DEFAULT_PARALLELISM: usize = 8;
/// Bytes per ranged GET: large enough to stream well, small enough to spread one big
/// snapshot over every connection. A restore holds `parallelism` of them in memory.
const CHUNK: u64 = 2 * 1024 * 1024;
/// Attempts per chunk before the restore fails.
const CHUNK_ATTEMPTS: u32 = 4;

/// [`apply`] with `parallelism` ranged GETs in flight. Remote files are fetched in chunks
/// into a [`DownloadWindow`] of `parallelism` chunks in memory, newest first, and applied
/// newest first while they arrive; encrypted files (whose ciphertext ranges are not
/// plaintext ranges) and local (directory) replicas are streamed by the apply itself.
pub async fn apply_parallel(
    client: &AnyClient,
    plan: Vec<LtxFileInfo>,
    opts: &RestoreOptions,
    parallelism: usize,
) -> Result<RestoreReport, RestoreError> {
    apply_until(client, plan, opts, parallelism, &Gate::default()).await
}

/// [`apply_parallel`] until `gate` is stopped: the restore then ends with
/// [`RestoreError::Cancelled`] having removed its temporary output, or with its report if it
/// had already published the output (a stop waits for a publish under way). Dropping the
/// future stops it too.
pub async fn apply_until(
    client: &AnyClient,
    plan: Vec<LtxFileInfo>,
    opts: &RestoreOptions,
    parallelism: usize,
    gate: &Gate,
) -> Result<RestoreReport, RestoreError> {
    let started = Instant::now();
    check_output(&opts.to, opts.force)?;
    let total: u64 = plan.iter().map(|f| f.size).sum();
    let window = (!client.is_local()).then(|| DownloadWindow::new(parallelism));
    let downloaded: u64 = match window {
        Some(_) => plan.iter().filter(|f| !f.encrypted).map(|f| f.size).sum(),
        None => 0,
    };
    let progress = Progress::start(total + downloaded);
    // Dropped with this future (or at its end): the blocking side stops instead of running
    // on, or waiting for chunks no download brings, past the restore.
    let stop = StopOnDrop {
        gate: gate.clone(),
        window: window.clone(),
    };
    let apply = {
        let gate = stop.gate.clone();
        let client = client.clone();
        let opts = opts.clone();
        let handle = tokio::runtime::Handle::current();
        let p = progress.clone();
        let plan = plan.clone();
        let window = window.clone();
        tokio::task::spawn_blocking(move || {
            let window = window.as_ref();
            apply_blocking(&client, &plan, &opts, &handle, started, window, &p, &gate)
        })
    };
    let result = match &window {
        Some(w) => {
            let fetching = Instant::now();
            let fetched = download(
                w,
                client,
                &plan,
                parallelism.max(1),
                &progress,
                &opts.phases,
            );
            tokio::pin!(fetched);
            tokio::pin!(apply);
            let mut fetch_error = None;
            let mut stopping = false;
            let applied = loop {
                tokio::select! {
                    // Fetch first: a failed fetch wakes the apply, whose error only repeats it.
                    biased;
                    r = &mut fetched, if fetch_error.is_none() => {
                        // Wall time of the whole fetch; bytes are counted per chunk.
                        opts.phases.record(Phase::Download, 0, fetching.elapsed());
                        fetch_error = Some(r.err());
                    }
                    // A reader waiting for a chunk the download may never bring wakes now.
                    _ = gate.token().cancelled(), if !stopping => {
                        stopping = true;
                        w.fail("the restore was cancelled");
                    }
                    r = &mut apply => break r,
                }
            };
            match fetch_error {
                // The download's own error says more than the apply's "download failed".
                Some(Some(e)) => Err(e),
                _ => joined(applied),
            }
        }
        None => joined(apply.await),
    };
    progress.finish();
    // After a stop, whatever failed failed because of it.
    match result {
        Err(_) if gate.is_stopped() => Err(RestoreError::Cancelled),
        r => r,
    }
}

/// Stops a restore's blocking side when dropped: the decoders at their next read, a reader
/// waiting for a chunk at once, the integrity check at its next progress callback. The
/// blocking side then removes its temporary output as after any failure.
struct StopOnDrop {
    gate: Gate,
    window: Option<Arc<DownloadWindow>>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.gate.stop();
        if let Some(w) = &self.window {
            w.fail("the restore was cancelled");
        }
    }
}

fn joined(
    r: Result<Result<RestoreReport, RestoreError>, tokio::task::JoinError>,
) -> Result<RestoreReport, RestoreError> {
    r.map_err(|e| RestoreError::Inconsistent(format!("restore task failed: {e}")))
        .and_then(|r| r)
}

/// Downloads every unencrypted file of `plan` into `window` with ranged GETs, `parallelism`
/// at a time, newest file first and each front to back: the order the apply reads them in,
/// which is also the order the window's room is taken in.
async fn download(
    window: &DownloadWindow,
    client: &AnyClient,
    plan: &[LtxFileInfo],
    parallelism: usize,
    progress: &Progress,
    phases: &PhaseStats,
) -> Result<(), RestoreError> {
    use futures_util::StreamExt;
    // Collected: an iterator of closures held across the awaits below would make the
    // future lose `Send` (rustc's higher-ranked lifetime limitation).
    let chunks: Vec<(usize, u64, u64)> = plan
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, f)| !f.encrypted)
        .flat_map(|(i, f)| {
            (0..f.size)
                .step_by(CHUNK as usize)
                .map(move |off| (i, off, CHUNK.min(f.size - off)))
        })
        .collect();
    let mut chunks = chunks.into_iter().peekable();
    let mut running = futures_util::stream::FuturesUnordered::new();
    let fetched = loop {
        let room = running.len() < parallelism && chunks.peek().is_some();
        tokio::select! {
            // Room is taken in read order, one chunk after the other, while the chunks in
            // flight go on (the reader frees room only as they arrive).
            slot = window.reserve(), if room => {
                if let Some((i, off, len)) = chunks.next() {
                    running.push(download_chunk(window, client, i, &plan[i], off, len, slot, progress, phases));
                }
            }
            Some(r) = running.next() => {
                if let Err(e) = r {
                    break Err(e);
                }
            }
            else => break Ok(()),
        }
    };
    if let Err(e) = &fetched {
        window.fail(&e.to_string());
    }
    fetched
}

/// Downloads one chunk (retrying transient failures) and hands it to the window.
#[allow(clippy::too_many_arguments)]
async fn download_chunk(
    window: &DownloadWindow,
    client: &AnyClient,
    i: usize,
    f: &LtxFileInfo,
    off: u64,
    len: u64,
    slot: Slot,
    progress: &Progress,
    phases: &PhaseStats,
) -> Result<(), RestoreError> {
    let mut buf = window.buffer();
    let mut attempt = 1;
    loop {
        match fetch_chunk(client, f, off, len, &mut buf).await {
            Ok(()) => break,
            Err(RestoreError::Storage(e)) if e.is_retryable() && attempt < CHUNK_ATTEMPTS => {
                tracing::debug!(file = %file_label(f), off, attempt, error = %e, "chunk download failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(250 << attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
    window.arrive(i, off, buf, slot);
    progress.add(len);
    phases.record_nanos(Phase::Download, len, 0);
    Ok(())
}

/// One ranged GET of `len` bytes at `off`, into `buf`.
async fn fetch_chunk(
    client: &AnyClient,
    f: &LtxFileInfo,
    off: u64,
    len: u64,
    buf: &mut Vec<u8>,
) -> Result<(), RestoreError> {
    use tokio::io::AsyncReadExt;
    let mut body = client
        .open_range(f.level, f.min_txid, f.max_txid, off, len)
        .await?;
    buf.clear();
    buf.resize(len as usize, 0);
    let mut filled = 0;
    while filled < buf.len() {
        let n = body
            .read(&mut buf[filled..])
            .await
            .map_err(|e| StorageError::Transient {
                op: "get",
                key: file_label(f),
                reason: e.to_string(),
            })?;
        if n == 0 {
            return Err(RestoreError::Storage(StorageError::Transient {
                op: "get",
                key: file_label(f),
                reason: format!(
                    "body ended at byte {} of {}",
                    off + filled as u64,
                    off + len
                ),
            }));
        }
        filled += n;
    }
    Ok(())
}

/// Refuses an existing output, or a WAL or rollback journal beside it (SQLite would replay
/// either over the restored database when it first opens it), unless `force`.
pub fn check_output(to: &Path, force: bool) -> Result<(), RestoreError> {
    if force {
        return Ok(());
    }
    for p in [
        to.to_path_buf(),
        sidecar(to, "-wal"),
        sidecar(to, "-journal"),
    ] {
        // A dangling symlink counts: the rename would replace it.
        if p.symlink_metadata().is_ok() {
            return Err(RestoreError::Exists(p));
        }
    }
    Ok(())
}

/// Moves a restored database from `staged` to `to`: over an existing one only with `force`,
/// and then without its side files. Without `force` it never replaces a database, WAL or
/// journal that appeared at `to` while the restore ran (the check at its start is minutes
/// old): the side files are checked again, and the database is placed by a no-clobber
/// publish.
pub(crate) fn place(staged: &Path, to: &Path, force: bool) -> Result<(), RestoreError> {
    match force {
        true => refuse_followed(to)?,
        false => check_output(to, false)?,
    }
    forget_follow_position(to)?;
    if !force {
        return fsutil::publish_new(staged, to).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => RestoreError::Exists(to.to_path_buf()),
            _ => RestoreError::io("publish", to)(e),
        });
    }
    replace_with_sidecars(staged, to)
}

/// Publishes `staged` over `to` and drops `to`'s side files. The old WAL and hot journal hold
/// commits the old file lacks: they are set aside, not removed, until the new file is in
/// place, and put back only if it could not be placed (a restore that fails must leave the
/// old database whole; once the rename is done they must never meet the new file). The
/// `-shm` only indexes the WAL, and SQLite rebuilds it.
fn replace_with_sidecars(staged: &Path, to: &Path) -> Result<(), RestoreError> {
    let mut aside: Vec<(PathBuf, PathBuf)> = Vec::new();
    // The error of a failed step, naming what could not be put back.
    let undo = |aside: &[(PathBuf, PathBuf)], e: RestoreError| {
        let stuck: Vec<String> = aside
            .iter()
            .rev()
            .filter(|(p, tmp)| fs::rename(tmp, p).is_err())
            .map(|(p, tmp)| format!("{} (put it back from {})", p.display(), tmp.display()))
            .collect();
        match stuck.is_empty() {
            true => e,
            false => RestoreError::Inconsistent(format!("{e}; NOT put back: {}", stuck.join(", "))),
        }
    };
    for suffix in ["-wal", "-journal"] {
        let p = sidecar(to, suffix);
        let tmp = fsutil::unique_tmp_path(&p);
        match fs::rename(&p, &tmp) {
            Ok(()) => aside.push((p, tmp)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(undo(&aside, RestoreError::io("set aside", &p)(e))),
        }
    }
    let shm = sidecar(to, "-shm");
    let placed = match fs::remove_file(&shm) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(RestoreError::io("remove", &shm)(e))
        }
        _ => fs::File::open(staged)
            .and_then(|f| f.sync_all())
            .and_then(|()| fs::rename(staged, to))
            .map_err(RestoreError::io("publish", to)),
    };
    if let Err(e) = placed {
        return Err(undo(&aside, e));
    }
    for (_, tmp) in &aside {
        let _ = fs::remove_file(tmp);
    }
    fsutil::fsync_dir(fsutil::parent_dir(to)).map_err(RestoreError::io("sync the directory of", to))
}

/// Refuses to replace a database a running `restore --follow` holds (its `flock`): the
/// follower would go on applying to the replaced file and write its `-txid` beside the new
/// one, which a later follower would then resume from.
fn refuse_followed(to: &Path) -> Result<(), RestoreError> {
    let file = match fs::File::open(to) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(RestoreError::io("open", to)(e)),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(()),
        Err(fs::TryLockError::WouldBlock) => Err(RestoreError::Inconsistent(format!(
            "{} is kept up to date by a running `restore --follow`; stop it first",
            to.display()
        ))),
        Err(fs::TryLockError::Error(e)) => Err(RestoreError::io("lock", to)(e)),
    }
}

/// Removes the `<db>-txid` a `restore --follow` keeps beside its database, before another
/// file is placed at `db`: a later `--follow` resumed from that TXID over a database that does
/// not hold it (a restore to an older TXID), and applied only the files after it.
pub fn forget_follow_position(db: &Path) -> Result<(), RestoreError> {
    for p in [follow::txid_path(db), follow::checksum_path(db)] {
        match fs::remove_file(&p) {
            Ok(()) => {
                fsutil::fsync_dir(fsutil::parent_dir(&p)).map_err(RestoreError::io("fsync", &p))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RestoreError::io("remove", &p)(e)),
        }
    }
    Ok(())
}

/// `db` with `suffix` appended (`-wal`, `-txid`, ...).
pub fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests;
