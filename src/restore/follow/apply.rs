//! Applying one downloaded file to the followed database in place (steps 1-4 of the parent
//! module's doc), under SQLite's exclusive lock.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{AppliedFile, change_counter, file_label, patch_page1, write_txid};
use crate::ltx::{self, Decoder, Header, TxId};
use crate::restore::RestoreError;
use crate::storage::LtxFileInfo;

/// SQLite's EXCLUSIVE lock on a database, held by a connection inside `BEGIN EXCLUSIVE`;
/// released (ROLLBACK: nothing is written through it) when dropped. The database's own file
/// handle must outlive it: closing any descriptor of the file drops the process's POSIX locks.
pub(super) struct SqliteLock(rusqlite::Connection);

impl SqliteLock {
    pub(super) fn acquire(path: &Path) -> Result<SqliteLock, RestoreError> {
        let err = |e: rusqlite::Error| {
            RestoreError::Inconsistent(format!(
                "cannot take SQLite's exclusive lock on {}: {e}",
                path.display()
            ))
        };
        let conn = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(err)?;
        conn.execute_batch("BEGIN EXCLUSIVE").map_err(err)?;
        Ok(SqliteLock(conn))
    }
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

/// The pages a file's apply wrote and its post-apply checksum, if it carries one.
pub(super) type Written = Result<(u32, Option<u64>), RestoreError>;

/// Everything the blocking half of applying one file needs.
pub(super) struct ApplyJob {
    pub(super) db: Arc<File>,
    pub(super) to: PathBuf,
    pub(super) incoming: PathBuf,
    pub(super) txid_path: PathBuf,
    pub(super) info: LtxFileInfo,
    pub(super) page_size: u32,
    pub(super) txid: TxId,
    pub(super) last_post: Option<u64>,
    /// Tests: fails writing this page, as a full disk would.
    #[cfg(test)]
    pub(super) fail_at_page: Option<u32>,
}

impl ApplyJob {
    fn ltx_err(&self) -> impl Fn(ltx::LtxError) -> RestoreError + '_ {
        move |source| RestoreError::Ltx {
            file: file_label(&self.info),
            source,
        }
    }

    fn decoder(&self) -> Result<Decoder<File>, RestoreError> {
        let f = File::open(&self.incoming).map_err(RestoreError::io("open", &self.incoming))?;
        Decoder::new(f).map_err(self.ltx_err())
    }

    /// The database file we write is still the one at its path.
    fn still_at_path(&self) -> Result<(), RestoreError> {
        use std::os::unix::fs::MetadataExt;
        let ours = self
            .db
            .metadata()
            .map_err(RestoreError::io("stat", &self.to))?;
        match fs::metadata(&self.to) {
            Ok(m) if (m.dev(), m.ino()) == (ours.dev(), ours.ino()) => Ok(()),
            _ => Err(RestoreError::Inconsistent(format!(
                "{} was replaced or removed while it was followed; restart the follower",
                self.to.display()
            ))),
        }
    }

    /// Verifies and writes the file; `held` is the lock kept over a database a failed apply
    /// left torn. Returns the lock to keep: the database is torn again (or still).
    pub(super) fn run(
        self,
        held: Option<SqliteLock>,
    ) -> (Result<AppliedFile, RestoreError>, Option<SqliteLock>) {
        let (written, torn) = match self.verify() {
            Ok(h) => {
                let (written, torn) = self.write(&h, held);
                (written.map(|w| (h, w)), torn)
            }
            Err(e) => (Err(e), held),
        };
        let _ = fs::remove_file(&self.incoming);
        let (h, (pages, post)) = match written {
            Ok(w) => w,
            Err(e) => return (Err(e), torn),
        };
        // Another file at the path (replaced by hand): its `-txid` must not name our state.
        let recorded = self
            .still_at_path()
            .and_then(|()| {
                write_txid(&self.txid_path, h.max_txid)
                    .map_err(RestoreError::io("write", &self.txid_path))
            })
            .map(|()| AppliedFile {
                level: self.info.level,
                min_txid: h.min_txid,
                txid: h.max_txid,
                pages,
                commit: h.commit,
                post_apply_checksum: post,
            });
        (recorded, None)
    }

    /// First pass: the whole file must decode and fit the database before any byte of it is
    /// written.
    fn verify(&self) -> Result<Header, RestoreError> {
        let label = file_label(&self.info);
        let mut dec = self.decoder()?;
        let h = *dec.header();
        if (h.min_txid, h.max_txid) != (self.info.min_txid, self.info.max_txid) {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} holds TXIDs {}-{} (renamed or misplaced file)",
                h.min_txid, h.max_txid
            )));
        }
        if h.page_size != self.page_size {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} has {}-byte pages, the followed database {}-byte pages \
                 (files from another database?)",
                h.page_size, self.page_size
            )));
        }
        if h.commit == 0 {
            return Err(RestoreError::Inconsistent(format!(
                "replica file {label} leaves an empty database (commit 0)"
            )));
        }
        if h.min_txid.0 > self.txid.0.saturating_add(1) {
            return Err(RestoreError::Gap {
                from: TxId(self.txid.0 + 1),
                to: TxId(h.min_txid.0 - 1),
            });
        }
        let mut buf = vec![0u8; self.page_size as usize];
        while dec.next_page(&mut buf).map_err(self.ltx_err())?.is_some() {}
        dec.finish().map_err(self.ltx_err())?;
        // A bare flag is a writer's "predecessor unknown" (its staging was lost), not a state.
        if let Some(prev) = self.last_post
            && h.has_checksums()
            && !h.is_snapshot()
            && h.min_txid.0 == self.txid.0 + 1
            && h.pre_apply_checksum != ltx::CHECKSUM_FLAG
            && h.pre_apply_checksum != prev
        {
            return Err(RestoreError::Diverged {
                file: label,
                pre: h.pre_apply_checksum,
                prev,
            });
        }
        Ok(h)
    }

    /// Second pass: writes the pages in place under SQLite's exclusive lock (`held`, or taken
    /// now), then fsyncs. Returns the pages written and the post-apply checksum, if the file
    /// carries one; on an error, the lock too when the database may be torn (it was already,
    /// or a page was written).
    fn write(&self, h: &Header, held: Option<SqliteLock>) -> (Written, Option<SqliteLock>) {
        let mut torn = held.is_some();
        let lock = match held {
            Some(lock) => lock,
            None => match SqliteLock::acquire(&self.to) {
                Ok(lock) => lock,
                Err(e) => return (Err(e), None),
            },
        };
        match self.write_locked(h, &mut torn) {
            Ok(written) => (Ok(written), None),
            Err(e) => (Err(e), torn.then_some(lock)),
        }
    }

    /// [`ApplyJob::write`] under the lock; sets `torn` at its first write.
    fn write_locked(&self, h: &Header, torn: &mut bool) -> Written {
        let db = &*self.db;
        let to = &self.to;
        let ps = u64::from(self.page_size);
        let mut hdr = [0u8; 100];
        db.read_exact_at(&mut hdr, 0)
            .map_err(RestoreError::io("read", to))?;
        let counter = change_counter(&hdr).wrapping_add(1);
        let mut dec = self.decoder()?;
        let mut buf = vec![0u8; self.page_size as usize];
        let mut page1 = false;
        while let Some(pgno) = dec.next_page(&mut buf).map_err(self.ltx_err())? {
            if pgno == 1 {
                patch_page1(&mut buf, counter);
                page1 = true;
            }
            *torn = true;
            #[cfg(test)]
            if self.fail_at_page == Some(pgno) {
                return Err(RestoreError::io("write", to)(std::io::Error::other(
                    "injected",
                )));
            }
            db.write_all_at(&buf, u64::from(pgno - 1) * ps)
                .map_err(RestoreError::io("write", to))?;
        }
        let pages = dec.page_count();
        let trailer = dec.finish().map_err(self.ltx_err())?;
        db.set_len(u64::from(h.commit) * ps)
            .map_err(RestoreError::io("truncate", to))?;
        if !page1 {
            patch_page1(&mut hdr, counter);
            db.write_all_at(&hdr, 0)
                .map_err(RestoreError::io("write", to))?;
        }
        db.sync_all().map_err(RestoreError::io("fsync", to))?;
        let post = h.has_checksums().then_some(trailer.post_apply_checksum);
        Ok((pages, post))
    }
}
