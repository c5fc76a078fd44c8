//! `replicad verify`: proves that a replica restores, and optionally that it equals the live
//! database.
//!
//! 1. The latest state is restored with [`restore::apply`] into a private temporary directory
//!    under [`std::env::temp_dir`] (`replicad-verify-<pid>-<random>`, mode 0700, removed at
//!    the end): every LTX file checksum, the page coverage, the database checksum (when the
//!    files carry one) and `PRAGMA integrity_check` must pass. The rolling database checksum
//!    of the restored file is computed and, when the replica records one, compared with it.
//! 2. With `--config`, when the database file exists on this host, its current state is read
//!    and compared page for page (per-page CRC-64 checksums, the lock page excluded) with the
//!    restored file. The live state is read the way the replication daemon reads it: inside
//!    a read transaction of a read-only SQLite connection (which pins the WAL against restarts
//!    and against checkpoints past it), the main file overlaid with every committed WAL frame.
//!    (SQLite's backup API and `VACUUM INTO` are not page-identical: both rewrite header
//!    fields of page 1.) Like any SQLite reader of a WAL database, the connection creates the
//!    `-wal` and `-shm` files (empty) if they do not exist. The live database may legitimately be ahead of the replica (the
//!    daemon is not caught up, or is not running), so a difference is a warning, `MISMATCH`,
//!    not a failure, unless `--strict`.

use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::anyhow;
use clap::Args;
use rusqlite::{Connection, OpenFlags};

use super::CliError;
use crate::config::DbConfig;
use crate::ltx::checksum::{DbChecksum, page_checksum};
use crate::ltx::{self, TxId, lock_pgno};
use crate::replicate::db::default_meta_path;
use crate::restore::{self, RestoreOptions, RestoreReport, Target};
use crate::sqlite::wal;
use crate::storage::{AnyClient, ReplicaClient};

/// How many times the live state is re-read when the WAL changed generation while it was read.
const LIVE_READ_ATTEMPTS: usize = 3;

/// Arguments of `replicad verify`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Verify that a replica restores: restore its latest state into a temporary \
directory (removed afterwards), check every file checksum, the database checksum when the \
replica records one, and PRAGMA integrity_check, and print one verdict line: `OK: ...` (exit \
0) or `FAILED: reason` (exit 1).\n\n\
With --config, on the host of the database (DB_PATH exists), also compare the restored \
database page for page with the live one. The live state is read as the replication daemon \
reads it: inside a read transaction of a read-only SQLite connection, the database file \
overlaid with the committed frames of its WAL (like any SQLite reader, the connection \
creates empty -wal and -shm files if they are missing). A second line reports `MATCH` or `MISMATCH \
(live database is ahead or differs)`. The live database is often legitimately ahead of its \
replica (the daemon uploads asynchronously, or is stopped while the application writes), so \
a mismatch is only a warning unless --strict. A match proves the replica holds exactly the \
live state; a mismatch alone does not prove the replica is wrong."
)]
pub struct VerifyArgs {
    /// Replica to verify (`file:///abs/path`, a directory, or `s3://BUCKET/PATH?...`); with
    /// --config, the path of a configured database (DB_PATH).
    #[arg(value_name = "DB_PATH|REPLICA_URL")]
    pub source: String,
    /// Configuration file: verify the replica of the database DB_PATH, and compare with the
    /// live database when it exists on this host.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// With --config, the replica to verify (default: the first).
    #[arg(long = "replica", value_name = "NAME", requires = "config")]
    pub replica_name: Option<String>,
    /// Do not expand $VAR and ${VAR} in the configuration file.
    #[arg(long)]
    pub no_expand_env: bool,
    /// An age identity file to decrypt an encrypted replica with (repeatable; with
    /// --config, tried after the replica's configured `age.identities`).
    #[arg(long = "age-identity", value_name = "FILE")]
    pub age_identity: Vec<PathBuf>,
    /// Fail (exit 1) unless the live database was compared and matched; needs --config on
    /// the host of the database.
    #[arg(long, requires = "config")]
    pub strict: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Per-page checksums of a database state.
#[derive(Debug, Clone)]
struct PageSums {
    page_size: u32,
    /// `sums[pgno - 1]`; 0 for the lock page.
    sums: Vec<u64>,
    total: DbChecksum,
}

impl PageSums {
    fn pages(&self) -> u32 {
        self.sums.len() as u32
    }
}

/// The restored state that passed every check.
struct Restored {
    report: RestoreReport,
    sums: PageSums,
}

/// The outcome of the live comparison.
enum Live {
    /// No --config, so no live database.
    NotConfigured,
    /// The database file does not exist on this host.
    Absent(PathBuf),
    /// The live state could not be read.
    Unreadable(PathBuf, String),
    /// Compared.
    Compared(Comparison),
}

struct Comparison {
    path: PathBuf,
    sums: PageSums,
    /// Pages present in both whose checksums differ.
    differing: u32,
    /// Newest TXID staged locally by the daemon, if its staging directory is readable.
    local_txid: Option<TxId>,
}

impl Comparison {
    fn matches(&self, restored: &PageSums) -> bool {
        self.differing == 0
            && self.sums.page_size == restored.page_size
            && self.sums.pages() == restored.pages()
            && self.sums.total == restored.total
    }
}

/// Runs `replicad verify`.
pub async fn run(args: VerifyArgs) -> Result<(), CliError> {
    let started = Instant::now();
    let (client, db) = super::source::source(
        &args.source,
        args.config.as_deref(),
        args.replica_name.as_deref(),
        !args.no_expand_env,
        &args.age_identity,
    )?;
    let work = TempDir::create().map_err(|e| anyhow!("create a temporary directory: {e}"))?;
    let restored = restore_and_sum(&client, &work.path.join("restored.db")).await;
    let live = match (&restored, &db) {
        (Ok(r), Some(db)) => live_comparison(db, &r.sums).await,
        _ => Live::NotConfigured,
    };
    drop(work);
    let duration_ms = started.elapsed().as_millis();
    let location = client.location();

    let (ok, verdict, error) = match &restored {
        Err(reason) => (false, format!("FAILED: {reason}"), Some(reason.clone())),
        Ok(r) => {
            let summary = restored_summary(&location, r);
            let live_failed =
                args.strict && !matches!(&live, Live::Compared(c) if c.matches(&r.sums));
            if live_failed {
                let reason =
                    format!("{summary}, but the live database was not proven equal (--strict)");
                (false, format!("FAILED: {reason}"), Some(reason))
            } else {
                (true, format!("OK: {summary}"), None)
            }
        }
    };
    let live_line = match &restored {
        Ok(r) => live_line(&live, &r.sums),
        Err(_) => None,
    };

    if args.json {
        let restored_json = restored.as_ref().ok().map(|r| {
            serde_json::json!({
                "txid": r.report.txid,
                "pages": r.report.pages,
                "page_size": r.report.page_size,
                "files": r.report.files.len(),
                "bytes_read": r.report.bytes,
                "checksum": format!("{:016x}", r.sums.total.value()),
                "checksum_verified": r.report.db_checksum.is_some(),
                "integrity_check": r.report.integrity_check,
            })
        });
        let live_json = restored
            .as_ref()
            .ok()
            .and_then(|r| live_json(&live, &r.sums));
        let v = serde_json::json!({
            "ok": ok,
            "replica": location,
            "restored": restored_json,
            "live": live_json,
            "error": error,
            "duration_ms": duration_ms,
        });
        out!("{v}");
    } else {
        out!("{verdict}");
        if let Some(line) = live_line {
            out!("{line}");
        }
    }
    if ok {
        Ok(())
    } else {
        Err(CliError::Runtime(anyhow!(
            "verification of {location} failed"
        )))
    }
}

/// Restores the latest state into `to` and computes its page checksums; any failure is the
/// reason the replica does not verify.
async fn restore_and_sum(client: &AnyClient, to: &Path) -> Result<Restored, String> {
    let plan = restore::plan(client, Target::Latest)
        .await
        .map_err(|e| e.to_string())?;
    let opts = RestoreOptions {
        to: to.to_path_buf(),
        target: Target::Latest,
        force: false,
        integrity_check: true,
        phases: Default::default(),
        threads: None,
    };
    let report = restore::apply(client, plan, &opts)
        .await
        .map_err(|e| e.to_string())?;
    let (path, page_size, pages) = (to.to_path_buf(), report.page_size, report.pages);
    let sums = tokio::task::spawn_blocking(move || file_sums(&path, page_size, pages))
        .await
        .map_err(|e| format!("checksum task failed: {e}"))?
        .map_err(|e| format!("read restored database: {e}"))?;
    if let Some(recorded) = &report.db_checksum {
        let computed = format!("{:016x}", sums.total.value());
        if &computed != recorded {
            return Err(format!(
                "restored database checksum {computed} differs from the replica's {recorded}"
            ));
        }
    }
    Ok(Restored { report, sums })
}

fn restored_summary(location: &str, r: &Restored) -> String {
    let checksum = format!("{:016x}", r.sums.total.value());
    format!(
        "replica {location} restores to TXID {} ({} pages, integrity {}, checksum {checksum} {})",
        r.report.txid,
        r.report.pages,
        r.report.integrity_check,
        if r.report.db_checksum.is_some() {
            "verified"
        } else {
            "computed; the replica records none to verify against"
        }
    )
}

fn live_line(live: &Live, restored: &PageSums) -> Option<String> {
    match live {
        Live::NotConfigured => None,
        Live::Absent(p) => Some(format!(
            "NOT COMPARED: live database {} does not exist on this host",
            p.display()
        )),
        Live::Unreadable(p, e) => Some(format!(
            "NOT COMPARED: cannot read live database {}: {e}",
            p.display()
        )),
        Live::Compared(c) if c.matches(restored) => Some(format!(
            "MATCH: live database {} equals the restored state ({} pages, checksum {:016x})",
            c.path.display(),
            c.sums.pages(),
            c.sums.total.value()
        )),
        Live::Compared(c) => {
            let local = c
                .local_txid
                .map(|t| format!("; the daemon has staged up to TXID {t} locally"))
                .unwrap_or_default();
            Some(format!(
                "MISMATCH (live database is ahead or differs): live database {} has {} pages of {} \
                 bytes (checksum {:016x}), the restored state {} pages of {} bytes (checksum \
                 {:016x}); {} pages differ{local}",
                c.path.display(),
                c.sums.pages(),
                c.sums.page_size,
                c.sums.total.value(),
                restored.pages(),
                restored.page_size,
                restored.total.value(),
                c.differing
            ))
        }
    }
}

fn live_json(live: &Live, restored: &PageSums) -> Option<serde_json::Value> {
    Some(match live {
        Live::NotConfigured => return None,
        Live::Absent(p) => serde_json::json!({
            "path": p, "result": "not_compared", "reason": "the database does not exist on this host",
        }),
        Live::Unreadable(p, e) => serde_json::json!({
            "path": p, "result": "not_compared", "reason": e,
        }),
        Live::Compared(c) => serde_json::json!({
            "path": c.path,
            "result": if c.matches(restored) { "match" } else { "mismatch" },
            "pages": c.sums.pages(),
            "page_size": c.sums.page_size,
            "checksum": format!("{:016x}", c.sums.total.value()),
            "differing_pages": c.differing,
            "local_txid": c.local_txid.map(|t| t.to_string()),
        }),
    })
}

/// Reads the live database of `db`, if it is on this host, and compares it with `restored`.
async fn live_comparison(db: &DbConfig, restored: &PageSums) -> Live {
    let path = db.path.clone();
    if !path.exists() {
        return Live::Absent(path);
    }
    let meta = db
        .meta_path
        .clone()
        .unwrap_or_else(|| default_meta_path(&path));
    let read_path = path.clone();
    let sums = match tokio::task::spawn_blocking(move || live_sums(&read_path)).await {
        Ok(Ok(sums)) => sums,
        Ok(Err(e)) => return Live::Unreadable(path, e),
        Err(e) => return Live::Unreadable(path, format!("task failed: {e}")),
    };
    let common = sums.sums.len().min(restored.sums.len());
    let differing = if sums.page_size == restored.page_size {
        sums.sums[..common]
            .iter()
            .zip(&restored.sums[..common])
            .filter(|(a, b)| a != b)
            .count() as u32
    } else {
        common as u32
    };
    Live::Compared(Comparison {
        path,
        sums,
        differing,
        local_txid: staged_tip(&meta.join("ltx").join("0")),
    })
}

/// The newest TXID in the daemon's staging directory (read only: never opened as staging,
/// which would clean it up under a running daemon).
fn staged_tip(dir: &Path) -> Option<TxId> {
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(ltx::parse_filename))
        .map(|(_, max)| max)
        .max()
}

/// Page checksums of pages `1..=pages` of a database file.
fn file_sums(path: &Path, page_size: u32, pages: u32) -> std::io::Result<PageSums> {
    let file = File::open(path)?;
    let mut buf = vec![0u8; page_size as usize];
    let lock = lock_pgno(page_size);
    let mut sums = vec![0u64; pages as usize];
    let mut total = DbChecksum::default();
    for pgno in (1..=pages).filter(|p| *p != lock) {
        read_db_page(&file, page_size, pgno, &mut buf)?;
        let c = page_checksum(pgno, &buf);
        sums[pgno as usize - 1] = c;
        total.toggle(c);
    }
    Ok(PageSums {
        page_size,
        sums,
        total,
    })
}

/// Reads page `pgno` of a database file; past the end of the file SQLite reads zeros, and so
/// does this.
fn read_db_page(file: &File, page_size: u32, pgno: u32, buf: &mut [u8]) -> std::io::Result<()> {
    let at = u64::from(pgno - 1) * u64::from(page_size);
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// The salts of the WAL's header, if it has a valid one.
fn wal_salts(path: &Path) -> std::io::Result<Option<(u32, u32)>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut h = [0u8; wal::WAL_HEADER_SIZE as usize];
    match f.read_exact_at(&mut h, 0) {
        Ok(()) => Ok(wal::WalHeader::parse(&h).ok().map(|h| (h.salt1, h.salt2))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the live database's current committed state inside a read transaction of a
/// read-only connection, and checksums it page by page.
fn live_sums(path: &Path) -> Result<PageSums, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| format!("open: {e}"))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let page_size: u32 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| format!("PRAGMA page_size: {e}"))?;
    // The read transaction pins the WAL: no restart, no checkpoint past our snapshot.
    conn.execute_batch("BEGIN")
        .map_err(|e| format!("BEGIN: {e}"))?;
    let _: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(|e| format!("read transaction: {e}"))?;
    let result = (|| {
        let wal = wal_path(path);
        let mut last = String::new();
        for _ in 0..LIVE_READ_ATTEMPTS {
            let before = wal_salts(&wal).map_err(|e| format!("read {}: {e}", wal.display()))?;
            let sums = read_live_once(path, &wal, page_size)?;
            let after = wal_salts(&wal).map_err(|e| format!("read {}: {e}", wal.display()))?;
            if before == after {
                return Ok(sums);
            }
            last = "the WAL was restarted while it was read".into();
        }
        Err(last)
    })();
    let _ = conn.execute_batch("COMMIT");
    result
}

fn read_live_once(path: &Path, wal_path: &Path, page_size: u32) -> Result<PageSums, String> {
    let io = |op: &str, p: &Path, e: &dyn std::fmt::Display| format!("{op} {}: {e}", p.display());
    let db_file = File::open(path).map_err(|e| io("open", path, &e))?;
    let wal_file = match File::open(wal_path) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("open", wal_path, &e)),
    };
    let scan = match &wal_file {
        Some(f) => wal::scan(f, wal::WAL_HEADER_SIZE, u64::MAX)
            .map_err(|e| io("scan", wal_path, &e))?
            .filter(|s| s.commit > 0),
        None => None,
    };
    if let Some(s) = &scan
        && s.header.page_size != page_size
    {
        return Err(format!(
            "WAL page size {} differs from the database's {page_size}",
            s.header.page_size
        ));
    }
    let pages = match &scan {
        Some(s) => s.commit,
        None => header_page_count(&db_file, page_size).map_err(|e| io("read", path, &e))?,
    };
    let lock = lock_pgno(page_size);
    let mut buf = vec![0u8; page_size as usize];
    let mut sums = vec![0u64; pages as usize];
    let mut total = DbChecksum::default();
    for pgno in (1..=pages).filter(|p| *p != lock) {
        match (scan.as_ref().and_then(|s| s.pages.get(&pgno)), &wal_file) {
            (Some(&off), Some(f)) => {
                wal::read_page(f, off, &mut buf).map_err(|e| io("read", wal_path, &e))?
            }
            _ => read_db_page(&db_file, page_size, pgno, &mut buf)
                .map_err(|e| io("read", path, &e))?,
        }
        let c = page_checksum(pgno, &buf);
        sums[pgno as usize - 1] = c;
        total.toggle(c);
    }
    Ok(PageSums {
        page_size,
        sums,
        total,
    })
}

/// Database size in pages without WAL frames: the header's in-header size when valid, else
/// the file length.
fn header_page_count(db_file: &File, page_size: u32) -> std::io::Result<u32> {
    let len = db_file.metadata()?.len();
    let mut h = [0u8; 100];
    if len >= 100 && db_file.read_exact_at(&mut h, 0).is_ok() {
        let in_header = u32::from_be_bytes([h[28], h[29], h[30], h[31]]);
        if in_header > 0 && h[24..28] == h[92..96] {
            return Ok(in_header);
        }
    }
    Ok((len / u64::from(page_size)) as u32)
}

/// A private temporary directory, removed with its contents when dropped.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create() -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(format!(
            "replicad-verify-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}
