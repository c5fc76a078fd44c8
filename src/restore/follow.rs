//! `restore --follow`: a read replica, kept up to date in place.
//!
//! The first run restores the newest state (through [`restore::plan`] and [`restore::apply`],
//! with all their checks) into `<db>.restoring`, locks it and sets page 1 to rollback-journal
//! mode, renames it to `<db>` (so a reader never opens the file before it is final), and
//! records its TXID in `<db>-txid` (16 hex digits and a newline).
//! Then, every interval until SIGINT or SIGTERM, the replica is listed and every LTX file that
//! extends the chain past that TXID ([`extend_chain`]: level 0, bridged from levels 1..8 when
//! level-0 files were retired, a snapshot as the last resort) is applied to the database file
//! in place. A later run with the database and its `<db>-txid` present resumes from there.
//!
//! Applying one file:
//! 1. download it whole to `<db>.incoming` and verify it with a full decoder pass (file
//!    checksum, page index, TXID range, page size, and the checksum chain when the files carry
//!    database checksums): nothing of a corrupt or foreign file ever reaches the database;
//! 2. take SQLite's own EXCLUSIVE lock on the database (a connection in `BEGIN EXCLUSIVE`), so
//!    readers, which hold POSIX locks, never see a half-applied file;
//! 3. decode the file again and write each page at `(pgno - 1) * page_size`, set the length to
//!    `commit * page_size`, and set page 1's bytes 18..20 to 1,1 (rollback-journal mode: a
//!    reader never looks for a WAL) and bytes 24..28 to the previous file change counter plus
//!    one (so readers drop their page caches), as Litestream does;
//! 4. fsync the database, release the lock, then publish the new `<db>-txid` (tmp, fsync,
//!    rename, fsync dir).
//!
//! Invariants:
//! - `<db>-txid` names the file's own state only: any restore that places another file at
//!   `<db>` removes it first ([`restore::forget_follow_position`]), so a later run restores
//!   afresh instead of resuming over a database that does not hold that TXID.
//! - `<db>-txid` never names a state newer than the durable database file. After a crash in
//!   step 3 the file is ahead of it, and re-applying from it is idempotent: every page a file
//!   holds is its final value at the file's max TXID.
//! - A file that does not fit (another page size, a broken checksum chain, a hole in the
//!   replica's history) is never applied: the error is logged once per streak and the poll
//!   retried at the next interval, the database unchanged.
//! - The follower holds an exclusive `flock` on the database file for its whole run, so two
//!   followers never write the same file.
//! - An apply that fails after its first write (a full disk) keeps SQLite's exclusive lock
//!   until a retry applies the file whole (`follow/apply.rs`): readers get "database is locked",
//!   never pages of two states. A stop meanwhile releases it; the next run re-applies from
//!   `<db>-txid`.
//! - A resume does not apply another replica's files over its database: a clean stop records
//!   the replica's post-apply checksum at the database's TXID, and the replica's location, in
//!   `<db>-checksum` (replicad's own; Litestream neither writes nor reads it), and the replica
//!   must agree at that TXID (`follow/resume.rs`), or the run fails with the database
//!   untouched. Where no checksum can decide (the files carry none, as Litestream's and lz4
//!   ones do, or no file of the replica starts right after that TXID or ends at it any more),
//!   a resume from the recorded replica goes on (with a warning when a checksum was
//!   recorded) and one from another replica fails. It resumes unchecked without a record (a
//!   crash, a Litestream follower). The record is the replica's checksum, not one read from
//!   the file: a write to the database itself is not seen.
//! - A shutdown never interrupts step 2..4: it is noticed while listing, downloading or
//!   sleeping, and between files. One during the first run's restore stops it (nothing is
//!   placed at `<db>`) and the run fails (exit 1), as a plain restore stopped does.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::ltx::{self, TxId};
use crate::restore::{self, RestoreError, RestoreOptions, Target, sidecar};
use crate::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL, StorageError};
use crate::util::fsutil;

mod apply;
mod resume;

use apply::{ApplyJob, SqliteLock};
pub use resume::checksum_path;
use resume::{Record, restored_checksum};

/// Options of `restore --follow`.
#[derive(Debug, Clone)]
pub struct FollowOptions {
    /// The database kept up to date.
    pub to: PathBuf,
    /// How often the replica is polled.
    pub interval: Duration,
    /// Replace an existing database that has no `<db>-txid` with a fresh restore, and remove
    /// a stray `-wal` or `-journal` beside a database being resumed.
    pub force: bool,
    /// Run `PRAGMA integrity_check` on the initial restore.
    pub integrity_check: bool,
}

/// `<db>-txid`: the TXID the database file holds.
pub fn txid_path(db: &Path) -> PathBuf {
    sidecar(db, "-txid")
}

/// Where the first restore is made ready before it is moved to `db`.
fn restoring_path(db: &Path) -> PathBuf {
    sidecar(db, ".restoring")
}

/// Reads `<db>-txid`; `None` if it does not exist.
pub fn read_txid(path: &Path) -> Result<Option<TxId>, RestoreError> {
    match fs::read_to_string(path) {
        Ok(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| RestoreError::Inconsistent(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RestoreError::io("read", path)(e)),
    }
}

/// Writes `<db>-txid` crash-safely: tmp, fsync, rename, fsync of the directory. The
/// temporary name is new (never a file someone left there, nor a symlink's target) and goes
/// on failure.
pub fn write_txid(path: &Path, txid: TxId) -> io::Result<()> {
    write_sidecar(path, &format!("{txid}\n"))
}

/// Writes `text` to `path` as [`write_txid`] does.
fn write_sidecar(path: &Path, text: &str) -> io::Result<()> {
    let tmp = fsutil::unique_tmp_path(path);
    let written = File::create_new(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| fs::rename(&tmp, path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    fsutil::fsync_dir(fsutil::parent_dir(path))
}

/// The files that take a database at some TXID forward, in the order to apply them, and the
/// hole that stops the chain, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    /// Files to apply, oldest first; each starts at or before the previous one's max + 1.
    pub files: Vec<LtxFileInfo>,
    /// `(first, last)` missing TXIDs when files exist beyond a hole the listing cannot bridge.
    pub gap: Option<(TxId, TxId)>,
}

/// Chooses the files that take a database at `last` forward, from a listing of any levels in
/// any order. At each step the file of levels 0..8 that starts at or before `current + 1` and
/// reaches furthest wins, as in [`restore::calc_plan`]; among equal reaches the smallest
/// download (then the later start, the higher level, the older file), since the database
/// already holds what came before. Only when no such file exists is the newest snapshot
/// beyond `current` taken. Pure: no I/O.
pub fn extend_chain(files: &[LtxFileInfo], last: TxId) -> Extension {
    let mut current = last.0;
    let mut chain = Vec::new();
    loop {
        let next = current.saturating_add(1);
        let incremental = files
            .iter()
            .filter(|f| f.level < SNAPSHOT_LEVEL && f.min_txid.0 <= next && f.max_txid.0 > current)
            .max_by_key(|f| {
                (
                    f.max_txid,
                    std::cmp::Reverse(f.size),
                    f.min_txid,
                    f.level,
                    std::cmp::Reverse(f.created_at),
                )
            });
        let step = incremental.or_else(|| {
            files
                .iter()
                .filter(|f| f.level == SNAPSHOT_LEVEL && f.max_txid.0 > current)
                .max_by_key(|f| (f.max_txid, std::cmp::Reverse(f.created_at)))
        });
        match step {
            Some(f) => {
                current = f.max_txid.0;
                chain.push(f.clone());
            }
            None => break,
        }
    }
    let gap = files
        .iter()
        .filter(|f| f.min_txid.0 > current.saturating_add(1))
        .map(|f| f.min_txid)
        .min()
        .map(|m| (TxId(current + 1), TxId(m.0 - 1)));
    Extension { files: chain, gap }
}

/// One file applied to the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedFile {
    /// Level of the file.
    pub level: u8,
    /// Its first TXID.
    pub min_txid: TxId,
    /// Its last TXID: the database's TXID now.
    pub txid: TxId,
    /// Pages written.
    pub pages: u32,
    /// Database size in pages now.
    pub commit: u32,
    /// The file's post-apply database checksum, if it carries one.
    pub post_apply_checksum: Option<u64>,
}

/// What to do with the output path before following.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Resume(TxId),
    Restore,
}

/// Decides between resuming and restoring, with the local checks that no retry can fix.
fn start_mode(opts: &FollowOptions) -> Result<Start, RestoreError> {
    let to = &opts.to;
    if !to.exists() {
        // Refused now, not after the whole restore: a WAL or journal beside the output.
        restore::check_output(to, opts.force)?;
        return Ok(Start::Restore);
    }
    let Some(txid) = read_txid(&txid_path(to))? else {
        if opts.force {
            return Ok(Start::Restore);
        }
        return Err(RestoreError::Exists(to.clone()));
    };
    // SQLite would read through a WAL, or roll a hot journal back into what we write.
    for suffix in ["-wal", "-journal"] {
        let p = sidecar(to, suffix);
        if !p.exists() {
            continue;
        }
        if !opts.force {
            return Err(RestoreError::Inconsistent(format!(
                "{} exists beside the followed database; remove it or pass --force",
                p.display()
            )));
        }
        for s in [suffix, "-shm"] {
            let p = sidecar(to, s);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(RestoreError::io("remove", &p)(e)),
            }
        }
    }
    Ok(Start::Resume(txid))
}

/// Says that the initial restore (`restored`, if there was one) is done: only once the
/// database is in place under its name, locked and its TXID noted, so that a tool waiting for
/// this line finds a database to read.
fn restored_and_following(opts: &FollowOptions, restored: Option<restore::RestoreReport>) {
    if let Some(report) = restored {
        tracing::info!(
            db = %opts.to.display(),
            txid = %report.txid,
            files = report.files.len(),
            pages = report.pages,
            replica = %report.replica,
            "restored; following"
        );
    }
}

/// The initial restore of the newest state into `staged`; returns its TXID and report.
async fn initial_restore(
    client: &AnyClient,
    opts: &FollowOptions,
    staged: &Path,
) -> Result<(TxId, restore::RestoreReport), RestoreError> {
    let plan = restore::plan(client, Target::Latest).await?;
    let txid = plan
        .last()
        .map(|f| f.max_txid)
        .ok_or_else(|| RestoreError::Inconsistent("empty restore plan".into()))?;
    let ropts = RestoreOptions {
        to: staged.to_path_buf(),
        target: Target::Latest,
        // Ours alone: whatever an interrupted start left there goes.
        force: true,
        integrity_check: opts.integrity_check,
        phases: Default::default(),
        threads: None,
    };
    let report = restore::apply(client, plan, &ropts).await?;
    Ok((txid, report))
}

/// A database kept up to date from a replica.
pub struct Follower {
    client: AnyClient,
    to: PathBuf,
    txid_path: PathBuf,
    incoming: PathBuf,
    /// The database file, `flock`ed for the follower's life.
    db: Arc<File>,
    page_size: u32,
    txid: TxId,
    /// Post-apply checksum of the database's state: of the last file this process applied, if
    /// it carried one, or as recorded at the last clean stop.
    last_post: Option<u64>,
    /// Resumed with a record of the last clean stop, and no file applied since: a file that
    /// does not start from its checksum shows a database that is not this replica's.
    checking_resume: bool,
    /// The replica the record names, when it is not this one: a resume this replica cannot
    /// check is refused rather than applied over another replica's state.
    followed_from: Option<String>,
    /// SQLite's exclusive lock, kept over a database whose last apply failed after its first
    /// write (a full disk): readers get "database is locked", never a mix of two states,
    /// until a retry applies the file whole.
    torn: Option<SqliteLock>,
}

impl Follower {
    /// Restores `opts.to` from the replica (when it must) or resumes it from `<db>-txid`, and
    /// locks it: [`run`]'s start without its retries.
    pub async fn open(client: &AnyClient, opts: &FollowOptions) -> Result<Follower, RestoreError> {
        let mode = start_mode(opts)?;
        let staged = restoring_path(&opts.to);
        let (txid, restored) = match mode {
            Start::Resume(t) => (t, None),
            Start::Restore => {
                let (t, report) = initial_restore(client, opts, &staged).await?;
                (t, Some(report))
            }
        };
        let staged = (mode == Start::Restore).then_some(staged);
        let post = restored_checksum(restored.as_ref());
        let follower = Follower::attach(client, opts, mode, (txid, post), staged).await?;
        restored_and_following(opts, restored);
        Ok(follower)
    }

    /// Locks the database (restored into `staged`, then moved into place; or resumed at
    /// `txid`) and records its TXID. `post`: the restored state's checksum.
    async fn attach(
        client: &AnyClient,
        opts: &FollowOptions,
        mode: Start,
        (txid, post): (TxId, Option<u64>),
        staged: Option<PathBuf>,
    ) -> Result<Follower, RestoreError> {
        let (to, force) = (opts.to.clone(), opts.force);
        let txid_path = txid_path(&opts.to);
        let position = txid_path.clone();
        let (db, page_size) = tokio::task::spawn_blocking(move || match staged {
            Some(staged) => {
                let attached = attach_file(&staged)
                    .and_then(|a| restore::place(&staged, &to, force).map(|()| a));
                let (db, page_size) = match attached {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = fs::remove_file(&staged);
                        return Err(e);
                    }
                };
                crate::util::test_gate::wait_at_test_gate(&to);
                if let Err(e) = write_txid(&position, txid) {
                    // Placed without its position, the database would be refused by the next
                    // run as another's: it goes while it is still the file this run placed.
                    use std::os::unix::fs::MetadataExt;
                    let ours = fs::metadata(&to).ok().zip(db.metadata().ok());
                    if ours.is_some_and(|(a, b)| (a.dev(), a.ino()) == (b.dev(), b.ino())) {
                        let _ = fs::remove_file(&to);
                    }
                    return Err(RestoreError::io("write", &position)(e));
                }
                Ok((db, page_size))
            }
            None => attach_file(&to),
        })
        .await
        .map_err(|e| RestoreError::Inconsistent(format!("follow task failed: {e}")))??;
        match mode {
            Start::Restore => {}
            Start::Resume(_) => tracing::info!(
                db = %opts.to.display(),
                txid = %txid,
                replica = %client.location(),
                "resuming follow"
            ),
        }
        let incoming = sidecar(&opts.to, ".incoming");
        let _ = fs::remove_file(&incoming);
        let record = match mode {
            Start::Resume(_) => Record::read(&opts.to, txid),
            Start::Restore => None,
        };
        let last_post = match mode {
            Start::Resume(_) => record.as_ref().and_then(|r| r.post),
            Start::Restore => post,
        };
        let here = client.location();
        let followed_from = record
            .as_ref()
            .and_then(|r| r.location.clone())
            .filter(|l| *l != here);
        Ok(Follower {
            client: client.clone(),
            to: opts.to.clone(),
            txid_path,
            incoming,
            db: Arc::new(db),
            page_size,
            txid,
            last_post,
            checking_resume: record.is_some(),
            followed_from,
            torn: None,
        })
    }

    /// The TXID the database holds.
    pub fn txid(&self) -> TxId {
        self.txid
    }

    /// The database's page size.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Lists the replica: level 0, and every level when level 0 alone cannot take the
    /// database forward (a hole, retired files) or looks older than it.
    async fn listing(&self) -> Result<Vec<LtxFileInfo>, RestoreError> {
        let l0 = self.client.list(0).await?;
        let newest = l0.iter().map(|f| f.max_txid).max();
        if newest.is_some_and(|n| n >= self.txid) && extend_chain(&l0, self.txid).gap.is_none() {
            return Ok(l0);
        }
        let mut all = l0;
        for level in 1..=SNAPSHOT_LEVEL {
            all.extend(self.client.list(level).await?);
        }
        Ok(all)
    }

    /// One round: applies every file that extends the database, in order, logging each. A
    /// hole that stops the chain, or a replica older than the database, is an error (after
    /// applying what comes before the hole). Returns early, with what was applied, once
    /// `stop` is cancelled; an apply in progress is always finished first.
    pub async fn poll(
        &mut self,
        stop: &CancellationToken,
    ) -> Result<Vec<AppliedFile>, RestoreError> {
        let files = tokio::select! {
            r = self.listing() => r?,
            _ = stop.cancelled() => return Ok(Vec::new()),
        };
        let ext = extend_chain(&files, self.txid);
        if self.checking_resume
            && let Some(first) = ext.files.first()
        {
            self.check_resume(&files, first, stop).await?;
        }
        let mut applied = Vec::new();
        for info in &ext.files {
            let downloaded = tokio::select! {
                r = self.download(info) => r,
                _ = stop.cancelled() => {
                    let _ = tokio::fs::remove_file(&self.incoming).await;
                    return Ok(applied);
                }
            };
            if let Err(e) = downloaded {
                let _ = tokio::fs::remove_file(&self.incoming).await;
                return Err(e);
            }
            let a = self.apply_incoming(info).await?;
            tracing::info!(
                txid = %a.txid,
                min_txid = %a.min_txid,
                level = a.level,
                pages = a.pages,
                commit = a.commit,
                "applied LTX file"
            );
            applied.push(a);
            if stop.is_cancelled() {
                return Ok(applied);
            }
        }
        if let Some((from, to)) = ext.gap {
            return Err(RestoreError::Gap { from, to });
        }
        match files.iter().map(|f| f.max_txid).max() {
            None => return Err(RestoreError::NoBackups(self.client.location())),
            Some(n) if n < self.txid => {
                return Err(RestoreError::Inconsistent(format!(
                    "the replica's newest TXID {n} is older than the followed database's {} \
                     (was the replica reset or replaced?)",
                    self.txid
                )));
            }
            Some(_) => {}
        }
        Ok(applied)
    }

    /// Downloads one file whole to `<db>.incoming`.
    async fn download(&self, info: &LtxFileInfo) -> Result<(), RestoreError> {
        let mut reader = self
            .client
            .open(info.level, info.min_txid, info.max_txid, 0)
            .await?;
        let path = &self.incoming;
        let mut out = tokio::fs::File::create(path)
            .await
            .map_err(RestoreError::io("create", path))?;
        tokio::io::copy(&mut reader, &mut out).await.map_err(|e| {
            RestoreError::Storage(StorageError::Transient {
                op: "download",
                key: file_label(info),
                reason: e.to_string(),
            })
        })?;
        out.flush().await.map_err(RestoreError::io("write", path))?;
        Ok(())
    }

    /// Verifies and applies the downloaded file, then records its TXID. Runs to the end even
    /// if the caller stops waiting.
    async fn apply_incoming(&mut self, info: &LtxFileInfo) -> Result<AppliedFile, RestoreError> {
        let job = ApplyJob {
            db: self.db.clone(),
            to: self.to.clone(),
            incoming: self.incoming.clone(),
            txid_path: self.txid_path.clone(),
            info: info.clone(),
            page_size: self.page_size,
            txid: self.txid,
            last_post: self.last_post,
            #[cfg(test)]
            fail_at_page: None,
        };
        let held = self.torn.take();
        let (applied, torn) = tokio::task::spawn_blocking(move || job.run(held))
            .await
            .map_err(|e| RestoreError::Inconsistent(format!("follow task failed: {e}")))?;
        if torn.is_some() && self.torn.is_none() {
            tracing::error!(db = %self.to.display(), file = %file_label(info),
                "applying a file failed after its first write: readers are kept out of the database (SQLite's exclusive lock stays) until it applies");
        }
        self.torn = torn;
        let applied = match applied {
            Err(e @ RestoreError::Diverged { .. }) if self.checking_resume => {
                return Err(RestoreError::NotFollowed {
                    db: self.to.clone(),
                    txid: self.txid,
                    reason: e.to_string(),
                });
            }
            r => r?,
        };
        self.txid = applied.txid;
        self.last_post = applied.post_apply_checksum;
        self.checking_resume = false;
        Ok(applied)
    }
}

fn file_label(f: &LtxFileInfo) -> String {
    format!(
        "{}/{}",
        f.level,
        ltx::format_filename(f.min_txid, f.max_txid)
    )
}

/// Opens and locks the database file, reads its page size, and makes sure page 1 says
/// rollback-journal mode (a restore leaves the source's WAL mode there).
fn attach_file(to: &Path) -> Result<(File, u32), RestoreError> {
    let db = File::options()
        .read(true)
        .write(true)
        .open(to)
        .map_err(RestoreError::io("open", to))?;
    match db.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            return Err(RestoreError::Inconsistent(format!(
                "{} is locked by another process (another follower?)",
                to.display()
            )));
        }
        Err(fs::TryLockError::Error(e)) => return Err(RestoreError::io("lock", to)(e)),
    }
    let mut hdr = [0u8; 100];
    db.read_exact_at(&mut hdr, 0).map_err(|e| {
        RestoreError::Inconsistent(format!("{} is not a SQLite database: {e}", to.display()))
    })?;
    let page_size = db_page_size(&hdr).ok_or_else(|| {
        RestoreError::Inconsistent(format!(
            "{} is not a SQLite database (bad header)",
            to.display()
        ))
    })?;
    let len = db.metadata().map_err(RestoreError::io("stat", to))?.len();
    if len % u64::from(page_size) != 0 {
        return Err(RestoreError::Inconsistent(format!(
            "{} is {len} bytes, not a whole number of {page_size}-byte pages",
            to.display()
        )));
    }
    if hdr[18] != 1 || hdr[19] != 1 {
        let counter = change_counter(&hdr).wrapping_add(1);
        patch_page1(&mut hdr, counter);
        db.write_all_at(&hdr, 0)
            .map_err(RestoreError::io("write", to))?;
        db.sync_all().map_err(RestoreError::io("fsync", to))?;
    }
    Ok((db, page_size))
}

/// Page size from a database header, if the header is SQLite's.
fn db_page_size(hdr: &[u8]) -> Option<u32> {
    if hdr.len() < 100 || &hdr[..16] != b"SQLite format 3\0" {
        return None;
    }
    let raw = u32::from(u16::from_be_bytes([hdr[16], hdr[17]]));
    let size = if raw == 1 { 65536 } else { raw };
    ltx::is_valid_page_size(size).then_some(size)
}

fn change_counter(page1: &[u8]) -> u32 {
    u32::from_be_bytes([page1[24], page1[25], page1[26], page1[27]])
}

/// Sets rollback-journal mode (file format versions 1, 1) and the file change counter.
fn patch_page1(page1: &mut [u8], counter: u32) {
    page1[18] = 1;
    page1[19] = 1;
    page1[24..28].copy_from_slice(&counter.to_be_bytes());
}

/// Logs an error once per streak of identical failures, and the recovery.
#[derive(Debug, Default)]
struct ErrorStreak {
    current: Option<String>,
    count: u64,
}

impl ErrorStreak {
    fn fail(&mut self, what: &str, e: &RestoreError) {
        let msg = format!("{what}: {e}");
        if self.current.as_deref() != Some(msg.as_str()) {
            tracing::error!("{msg}; retrying");
            self.current = Some(msg);
            self.count = 0;
        } else {
            tracing::debug!("{msg} (again)");
        }
        self.count += 1;
    }

    fn ok(&mut self) {
        if self.current.take().is_some() {
            tracing::info!(failures = self.count, "follow recovered");
            self.count = 0;
        }
    }
}

/// Sleeps for `d`, or less if `stop` is cancelled; true if it was.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.cancelled() => true,
    }
}

/// Follows until `shutdown` completes: restores (retrying until the replica can be restored)
/// or resumes, then polls every interval. Fails on what no retry fixes (an existing database
/// without `<db>-txid`, or a local database that cannot be followed), and with
/// [`RestoreError::Cancelled`] when `shutdown` comes before the first restore is in place
/// (that restore is stopped and its output removed). An apply in progress is finished
/// before returning.
pub async fn run(
    client: &AnyClient,
    opts: &FollowOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RestoreError> {
    let stop = CancellationToken::new();
    let watcher = tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    let result = follow(client, opts, &stop).await;
    watcher.abort();
    result
}

async fn follow(
    client: &AnyClient,
    opts: &FollowOptions,
    stop: &CancellationToken,
) -> Result<(), RestoreError> {
    let mut streak = ErrorStreak::default();
    let mode = start_mode(opts)?;
    let staged = restoring_path(&opts.to);
    let (txid, restored) = match mode {
        Start::Resume(t) => (t, None),
        Start::Restore => loop {
            let restored = tokio::select! {
                r = initial_restore(client, opts, &staged) => Some(r),
                _ = stop.cancelled() => None,
            };
            let Some(restored) = restored else {
                // Dropped with the select: its threads stopped (a publish under way was waited
                // for), so a copy it had placed at `<db>.restoring` is its last write.
                fsutil::RemoveOnDrop(staged.clone()).remove().await;
                return Err(RestoreError::Cancelled);
            };
            match restored {
                Ok((t, report)) => break (t, Some(report)),
                Err(e @ RestoreError::Exists(_)) => return Err(e),
                Err(e) => streak.fail("initial restore", &e),
            }
            if sleep_or_stop(opts.interval, stop).await {
                return Err(RestoreError::Cancelled);
            }
        },
    };
    let staged = (mode == Start::Restore).then_some(staged);
    let post = restored_checksum(restored.as_ref());
    let mut follower = Follower::attach(client, opts, mode, (txid, post), staged).await?;
    restored_and_following(opts, restored);
    streak.ok();
    while !stop.is_cancelled() {
        match follower.poll(stop).await {
            Ok(_) => streak.ok(),
            // No retry makes another database this replica's.
            Err(e @ (RestoreError::NotFollowed { .. } | RestoreError::Unproven { .. })) => {
                return Err(e);
            }
            Err(e) => streak.fail("follow", &e),
        }
        if sleep_or_stop(opts.interval, stop).await {
            break;
        }
    }
    follower.record_stop().await;
    tracing::info!(db = %opts.to.display(), txid = %follower.txid(), "stopped following");
    Ok(())
}

#[cfg(test)]
mod tests;
