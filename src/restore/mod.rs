//! Restore: plan a chain of LTX files for a target, then apply it into a new database file.
//!
//! The plan is a pure function of a listing and a target ([`calc_plan`]): the newest level-9
//! snapshot at or before the target, then, step by step, the file (any of levels 8..0) that
//! starts inside the restored range and reaches furthest. A gap is refused, naming the
//! missing TXIDs.
//!
//! Apply walks the chain newest first and writes each page number once, the first time it is
//! seen (the newest copy wins, as upstream's compactor decides), with positional writes into
//! `<to>.tmp` ([`OutputFile`]: around the page cache when unchecked). Memory is a 1 MiB run of
//! pages, a bitmap of written pages and, from a remote replica, a [`DownloadWindow`] of
//! `parallelism` chunks, whatever the size of the database.
//!
//! Invariants:
//! - The output path is never touched until every file checksum, the page coverage, the
//!   database checksum (when the files carry one) and `PRAGMA integrity_check` have passed;
//!   then `<to>.tmp` is fsynced and renamed over `<to>`, and the directory fsynced.
//! - An existing database (or a stray `-wal` beside it, which SQLite would replay) is replaced
//!   only with `force`.

pub mod download;
pub mod follow;
pub mod output;
mod progress;

use progress::Progress;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::io::SyncIoBridge;

use crate::ltx::checksum::{DbChecksum, page_checksum};
use crate::ltx::{self, Decoder, Header, LtxError, TxId, lock_pgno};
use crate::restore::download::{DownloadWindow, Slot};
use crate::restore::output::{AlignedBuf, OutputFile};
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;
use crate::util::phase::{PHASES, Phase};

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
}

/// Chooses the files that restore `target_txid` (or the newest state) from `files`, which may
/// span every level in any order. Pure: no I/O.
pub fn calc_plan(
    files: &[LtxFileInfo],
    target_txid: Option<TxId>,
) -> Result<Vec<LtxFileInfo>, RestoreError> {
    let limit = target_txid.unwrap_or(TxId(u64::MAX));
    let mut plan = Vec::new();
    let snapshot = files
        .iter()
        .filter(|f| f.level == SNAPSHOT_LEVEL && f.max_txid <= limit)
        .max_by_key(|f| (f.max_txid, std::cmp::Reverse(f.created_at)));
    let mut current = 0u64;
    if let Some(s) = snapshot {
        current = s.max_txid.0;
        plan.push(s.clone());
    }
    while current < limit.0 {
        let next = files
            .iter()
            .filter(|f| {
                f.level < SNAPSHOT_LEVEL
                    && f.min_txid.0 <= current.saturating_add(1)
                    && f.max_txid.0 > current
                    && f.max_txid <= limit
            })
            // Furthest reach first; then the smaller start, the higher level, the older file.
            .max_by_key(|f| {
                (
                    f.max_txid,
                    std::cmp::Reverse(f.min_txid),
                    f.level,
                    std::cmp::Reverse(f.created_at),
                )
            });
        match next {
            Some(f) => {
                current = f.max_txid.0;
                plan.push(f.clone());
            }
            None => break,
        }
    }
    let beyond = files
        .iter()
        .filter(|f| f.min_txid.0 > current.saturating_add(1) && f.min_txid <= limit)
        .map(|f| f.min_txid)
        .min();
    if plan.is_empty() && beyond.is_some() {
        // Nothing to start from: the history before the oldest snapshot was retired.
        let oldest = files
            .iter()
            .filter(|f| f.level == SNAPSHOT_LEVEL || f.min_txid.0 == 1)
            .map(|f| f.max_txid)
            .min();
        return Err(RestoreError::NotAvailable {
            target: target_txid.map_or("the latest state".into(), |t| format!("TXID {t}")),
            reason: match oldest {
                Some(o) => format!(
                    "it is older than the oldest restorable TXID {o} (retention removed what came before)"
                ),
                None => "the replica holds no snapshot and no chain starting at TXID 1".into(),
            },
        });
    }
    if let Some(next_min) = beyond {
        return Err(RestoreError::Gap {
            from: TxId(current.saturating_add(1)),
            to: TxId(next_min.0 - 1),
        });
    }
    let newest = files.iter().map(|f| f.max_txid).max();
    match (target_txid, plan.last()) {
        (_, None) => Err(RestoreError::NotAvailable {
            target: target_txid.map_or("the latest state".into(), |t| format!("TXID {t}")),
            reason: "no snapshot or chain starting at TXID 1 reaches it".into(),
        }),
        (Some(t), Some(last)) if last.max_txid != t => Err(RestoreError::NotAvailable {
            target: format!("TXID {t}"),
            reason: match newest {
                Some(n) if n < t => format!("the newest TXID on the replica is {n}"),
                _ => format!(
                    "no file chain ends exactly at it (the nearest restorable TXID below is {}); \
                     older TXIDs are only kept at compaction boundaries",
                    last.max_txid
                ),
            },
        }),
        _ => Ok(plan),
    }
}

/// Lists the replica and plans a restore for `target`, reading file headers when the target
/// is a time.
pub async fn plan(client: &AnyClient, target: Target) -> Result<Vec<LtxFileInfo>, RestoreError> {
    let mut files = client.list_all().await?;
    if files.is_empty() {
        return Err(RestoreError::NoBackups(client.location()));
    }
    match target {
        Target::Latest => calc_plan(&files, None),
        Target::TxId(t) => calc_plan(&files, Some(t)),
        Target::Before(ts) => {
            let cutoff = ts.timestamp_millis();
            let mut kept = Vec::with_capacity(files.len());
            let mut oldest: Option<i64> = None;
            for f in files.drain(..) {
                let h = client.read_header(&f).await?;
                if f.level == SNAPSHOT_LEVEL || f.min_txid.0 == 1 {
                    oldest = Some(oldest.map_or(h.timestamp, |o| o.min(h.timestamp)));
                }
                if h.timestamp < cutoff {
                    kept.push(f);
                }
            }
            if kept.is_empty() {
                let oldest = oldest
                    .and_then(DateTime::<Utc>::from_timestamp_millis)
                    .map_or("unknown".into(), |t| {
                        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    });
                return Err(RestoreError::NotAvailable {
                    target: format!("time {}", ts.to_rfc3339()),
                    reason: format!("the oldest restorable time is just after {oldest}"),
                });
            }
            calc_plan(&kept, None)
        }
    }
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
/// Most bytes of consecutive pages the apply writes at once.
const WRITE_RUN: usize = 1024 * 1024;
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
    let started = Instant::now();
    check_output(&opts.to, opts.force)?;
    let total: u64 = plan.iter().map(|f| f.size).sum();
    let window = (!client.is_local()).then(|| DownloadWindow::new(parallelism));
    let downloaded: u64 = match window {
        Some(_) => plan.iter().filter(|f| !f.encrypted).map(|f| f.size).sum(),
        None => 0,
    };
    let progress = Progress::start(total + downloaded);
    let apply = {
        let client = client.clone();
        let opts = opts.clone();
        let handle = tokio::runtime::Handle::current();
        let p = progress.clone();
        let plan = plan.clone();
        let window = window.clone();
        tokio::task::spawn_blocking(move || {
            apply_blocking(&client, &plan, &opts, &handle, started, window.as_ref(), &p)
        })
    };
    let result = match &window {
        Some(w) => {
            let fetching = Instant::now();
            let fetched = download(w, client, &plan, parallelism.max(1), &progress);
            tokio::pin!(fetched);
            tokio::pin!(apply);
            let mut fetch_error = None;
            let applied = loop {
                tokio::select! {
                    // Fetch first: a failed fetch wakes the apply, whose error only repeats it.
                    biased;
                    r = &mut fetched, if fetch_error.is_none() => {
                        // Wall time of the whole fetch; bytes are counted per chunk.
                        PHASES.record(Phase::Download, 0, fetching.elapsed());
                        fetch_error = Some(r.err());
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
    result
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
                    running.push(download_chunk(window, client, i, &plan[i], off, len, slot, progress));
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
    PHASES.record_nanos(Phase::Download, len, 0);
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

/// Refuses an existing output (or a WAL beside it) unless `force`.
pub fn check_output(to: &Path, force: bool) -> Result<(), RestoreError> {
    if force {
        return Ok(());
    }
    for p in [to.to_path_buf(), sidecar(to, "-wal")] {
        if p.exists() {
            return Err(RestoreError::Exists(p));
        }
    }
    Ok(())
}

fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn apply_blocking(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    opts: &RestoreOptions,
    handle: &tokio::runtime::Handle,
    started: Instant,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
) -> Result<RestoreReport, RestoreError> {
    let last = plan
        .last()
        .ok_or_else(|| RestoreError::Inconsistent("empty restore plan".into()))?;
    let tmp = fsutil::tmp_path(&opts.to);
    if let Some(dir) = opts.to.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(RestoreError::io("create directory", dir))?;
    }
    let applying = Instant::now();
    // Around the page cache only when nothing reads the output back right away: the
    // integrity check reads every page, from the cache when the writes went through it
    // (measured on the 1 GiB benchmark: 23-26 s with direct writes, ~10 s without).
    let direct = !opts.integrity_check;
    let written = write_tmp(client, plan, &tmp, handle, window, progress, direct);
    PHASES.record(
        Phase::Apply,
        written.as_ref().map_or(0, |a| a.bytes),
        applying.elapsed(),
    );
    let result = written.and_then(|applied| {
        if opts.integrity_check {
            integrity_check(&tmp)?;
        }
        Ok(applied)
    });
    let applied = match result {
        Ok(a) => a,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    if opts.force {
        for suffix in ["-wal", "-shm"] {
            let p = sidecar(&opts.to, suffix);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(RestoreError::Io {
                        op: "remove",
                        path: p,
                        source: e,
                    });
                }
            }
        }
    }
    fsutil::publish(&tmp, &opts.to).map_err(RestoreError::io("publish", &opts.to))?;
    Ok(RestoreReport {
        db_path: opts.to.clone(),
        replica: client.location(),
        txid: last.max_txid.to_string(),
        files: plan.iter().map(PlannedFile::from).collect(),
        bytes: plan.iter().map(|f| f.size).sum(),
        page_size: applied.page_size,
        pages: applied.commit,
        db_checksum: applied.db_checksum.map(|c| format!("{c:016x}")),
        integrity_check: if opts.integrity_check {
            "ok"
        } else {
            "skipped"
        },
        duration_ms: started.elapsed().as_millis(),
    })
}

struct Applied {
    page_size: u32,
    commit: u32,
    db_checksum: Option<u64>,
    /// Page bytes written to the output (phase stats).
    bytes: u64,
}

fn file_label(f: &LtxFileInfo) -> String {
    format!(
        "{}/{}",
        f.level,
        ltx::format_filename(f.min_txid, f.max_txid)
    )
}

/// Writes the database into `tmp`, newest file first, each page once; verifies everything
/// that can be verified without SQLite.
fn write_tmp(
    client: &AnyClient,
    plan: &[LtxFileInfo],
    tmp: &Path,
    handle: &tokio::runtime::Handle,
    window: Option<&Arc<DownloadWindow>>,
    progress: &Progress,
    direct: bool,
) -> Result<Applied, RestoreError> {
    let _ = fs::remove_file(tmp);
    let mut out = OutputFile::create_new(tmp, direct).map_err(RestoreError::io("create", tmp))?;
    let mut written: Vec<u64> = Vec::new();
    let mut final_commit = 0u32;
    let mut page_size = 0u32;
    let mut sum = DbChecksum::default();
    let mut track_sum = false;
    let mut run = AlignedBuf::new(0);
    let mut bytes = 0u64;
    // (header, post-apply checksum) per plan position, to check the checksum chain afterwards.
    let mut seen: Vec<Option<(Header, u64)>> = vec![None; plan.len()];
    for (i, info) in plan.iter().enumerate().rev() {
        let label = file_label(info);
        let ltx_err = |source| RestoreError::Ltx {
            file: label.clone(),
            source,
        };
        let reader: Box<dyn std::io::Read + Send> = match window {
            Some(w) if !info.encrypted => Box::new(w.reader(i, info.size)),
            _ => {
                let body =
                    handle.block_on(client.open(info.level, info.min_txid, info.max_txid, 0))?;
                Box::new(SyncIoBridge::new_with_handle(body, handle.clone()))
            }
        };
        let mut dec = Decoder::new(reader).map_err(ltx_err)?;
        let h = *dec.header();
        if (h.min_txid, h.max_txid) != (info.min_txid, info.max_txid) {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} holds TXIDs {}-{} (renamed or misplaced file)",
                h.min_txid, h.max_txid
            )));
        }
        if i == plan.len() - 1 {
            page_size = h.page_size;
            final_commit = h.commit;
            out.set_len(u64::from(final_commit) * u64::from(page_size))
                .map_err(RestoreError::io("size", tmp))?;
            written = vec![0u64; (final_commit as usize).div_ceil(64) + 1];
            let ps = page_size as usize;
            run = AlignedBuf::new((WRITE_RUN / ps).max(1) * ps);
            // Only the newest file's checksum is compared (below): without one, skip the sums.
            track_sum = h.has_checksums();
        } else if h.page_size != page_size {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} has {}-byte pages, the rest of the chain {page_size}-byte pages \
                 (files from another database?)",
                h.page_size
            )));
        }
        // Pages are decoded straight into `run`; consecutive page numbers go out in one write.
        let ps = page_size as usize;
        let at = |pgno: u32| u64::from(pgno - 1) * u64::from(page_size);
        let (mut run_first, mut run_len) = (0u32, 0usize);
        loop {
            if run_len + ps > run.len() {
                out.write_all_at(&run[..run_len], at(run_first))
                    .map_err(RestoreError::io("write", tmp))?;
                run_len = 0;
            }
            let Some(pgno) = dec
                .next_page(&mut run[run_len..run_len + ps])
                .map_err(ltx_err)?
            else {
                break;
            };
            if pgno > final_commit {
                continue;
            }
            let (word, bit) = ((pgno / 64) as usize, 1u64 << (pgno % 64));
            if written[word] & bit != 0 {
                continue;
            }
            written[word] |= bit;
            if run_len > 0 && pgno != run_first + (run_len / ps) as u32 {
                out.write_all_at(&run[..run_len], at(run_first))
                    .map_err(RestoreError::io("write", tmp))?;
                run.copy_within(run_len..run_len + ps, 0);
                run_len = 0;
            }
            if run_len == 0 {
                run_first = pgno;
            }
            if track_sum {
                sum.toggle(page_checksum(pgno, &run[run_len..run_len + ps]));
            }
            run_len += ps;
            bytes += ps as u64;
        }
        if run_len > 0 {
            out.write_all_at(&run[..run_len], at(run_first))
                .map_err(RestoreError::io("write", tmp))?;
        }
        let trailer = dec.finish().map_err(ltx_err)?;
        progress.add(info.size);
        seen[i] = Some((h, trailer.post_apply_checksum));
    }
    let lock = lock_pgno(page_size);
    if let Some(missing) = (1..=final_commit)
        .find(|&p| p != lock && written[(p / 64) as usize] & (1u64 << (p % 64)) == 0)
    {
        return Err(RestoreError::Inconsistent(format!(
            "page {missing} of {final_commit} is in no file of the chain (the chain does not start with a full snapshot)"
        )));
    }
    verify_checksum_chain(plan, &seen)?;
    let (last_header, last_post) = seen
        .last()
        .copied()
        .flatten()
        .ok_or_else(|| RestoreError::Inconsistent("empty plan".into()))?;
    let db_checksum = if last_header.has_checksums() {
        if sum.value() != last_post {
            return Err(RestoreError::Inconsistent(format!(
                "rebuilt database checksum {:016x} differs from the source's {last_post:016x} at TXID {}",
                sum.value(),
                last_header.max_txid
            )));
        }
        Some(last_post)
    } else {
        None
    };
    out.sync_all().map_err(RestoreError::io("fsync", tmp))?;
    Ok(Applied {
        page_size,
        commit: final_commit,
        db_checksum,
        bytes,
    })
}

/// Where consecutive files both carry checksums, the later's pre-apply checksum must be the
/// earlier's post-apply checksum.
fn verify_checksum_chain(
    plan: &[LtxFileInfo],
    seen: &[Option<(Header, u64)>],
) -> Result<(), RestoreError> {
    for i in 1..plan.len() {
        let (Some((prev, prev_post)), Some((cur, _))) = (seen[i - 1], seen[i]) else {
            continue;
        };
        if prev.has_checksums() && cur.has_checksums() && !cur.is_snapshot()
            // Files overlapping the previous one start from an earlier state.
            && cur.min_txid.0 == prev.max_txid.0 + 1
            && cur.pre_apply_checksum != prev_post
        {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {} does not continue from {}: pre-apply checksum {:016x}, previous post-apply {prev_post:016x}",
                file_label(&plan[i]),
                file_label(&plan[i - 1]),
                cur.pre_apply_checksum
            )));
        }
    }
    Ok(())
}

/// Runs `PRAGMA integrity_check` on a database file without creating a WAL or SHM beside it.
pub fn integrity_check(path: &Path) -> Result<(), RestoreError> {
    let uri = format!("file:{}?immutable=1", path.display());
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let conn = rusqlite::Connection::open_with_flags(&uri, flags)
        .map_err(|e| RestoreError::Integrity(format!("cannot open: {e}")))?;
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|e| RestoreError::Integrity(e.to_string()))?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| RestoreError::Integrity(e.to_string()))?;
    if rows != ["ok"] {
        return Err(RestoreError::Integrity(rows.join("; ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
