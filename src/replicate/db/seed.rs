//! Seed snapshots: a full copy of the live database at its current TXID, for a replica whose
//! chain cannot be continued from staging (new, emptied, wiped, or behind what staging
//! still holds). The replica stores it as a level-9 snapshot (`0000000000000001-<txid>.ltx`,
//! the form Litestream writes and reads) and continues with the staged segments after it.
//!
//! Invariants:
//! - A seed holds exactly the state at the Db's position: the pages of the WAL frames up to
//!   the position's mark over the database file, read under our read transaction (the same
//!   reasoning as a full segment, `Db::write_full`), and the WAL's salts are checked again
//!   after the pages. After an application's checkpoint emptied the WAL with nothing
//!   committed since (`next_gen_follows`), the mark's frames are all in the file: it
//!   alone. With checksums on, its post-apply checksum must equal the position's.
//! - Building a seed changes nothing of the chain: no TXID, no staging file, no checkpoint,
//!   and it takes no SQLite lock beyond the read transaction already held.
//! - The file lives as long as someone holds its [`SeedSnapshot`]; the last holder removes it.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::connection::same_generation;
use super::encode::{PARALLEL_MIN_PAGES, PageSrc, encode_parallel, encode_workers, full_page_list};
use super::{Db, DbError, io_err, now_ms};
use crate::ltx::checksum::{DbChecksum, page_checksum};
use crate::ltx::{Encoder, HEADER_FLAG_NO_CHECKSUM, Header, TxId};
use crate::sqlite::wal::{self, WAL_HEADER_SIZE};
use crate::util::fsutil;

/// A built seed: an LTX snapshot file of the database at `txid`.
#[derive(Debug)]
pub struct SeedSnapshot {
    /// The TXID whose state it holds.
    pub txid: TxId,
    /// Header timestamp: that of the segment at `txid` (so time-based restores pick it).
    pub timestamp_ms: i64,
    /// The file (removed when the last holder drops this).
    pub path: PathBuf,
}

impl Drop for SeedSnapshot {
    fn drop(&mut self) {
        // Its name is its own (a random part); a replica task may be the last holder.
        fsutil::remove_file_off_reactor(std::mem::take(&mut self.path));
    }
}

/// A replica's request to its database's monitor for a seed snapshot.
#[derive(Debug)]
pub struct SeedRequest {
    /// The replica holds TXIDs up to this one, at or beyond the database's position (another
    /// writer's files, or this database's own history when its local state was lost): the
    /// database first moves past it ([`Db::continue_after`]), so that the seed and everything
    /// after it land on TXIDs no replica has.
    pub past: Option<TxId>,
    /// The snapshot, or why it could not be built.
    pub reply: oneshot::Sender<Result<Arc<SeedSnapshot>, String>>,
}

/// Where replicas send [`SeedRequest`]s to their database's monitor.
pub type SeedRequests = mpsc::UnboundedSender<SeedRequest>;

impl Db {
    /// Moves the position past `txid`, which a replica holds at or beyond ours: TXID
    /// `txid + 1` is skipped and the next sync writes a full segment at `txid + 2`, so no
    /// replica's chain can take it for a continuation of its own (every replica behind it is
    /// then re-seeded, which is what they need: their chains and ours part there).
    pub fn continue_after(&mut self, txid: TxId) {
        if txid < self.pos {
            return;
        }
        tracing::warn!(db = %self.path.display(), txid = %self.pos, replica_tip = %txid, "a replica holds TXIDs at or beyond this database's position; continuing after them with a full segment");
        self.reopen("a replica holds TXIDs at or beyond this database's position");
        self.remote_tip.txid = TxId(txid.0 + 1);
        self.remote_tip.post_apply_checksum = 0;
    }

    /// Builds a seed snapshot at the current position (right after a sync). Reuses the last
    /// one while the position has not moved and a replica still holds it.
    pub fn build_seed(&mut self) -> Result<Arc<SeedSnapshot>, DbError> {
        if let Some(seed) = self.last_seed.as_ref().and_then(std::sync::Weak::upgrade)
            && seed.txid == self.pos
        {
            return Ok(seed);
        }
        if self.pos.0 == 0 || !self.continuous || self.commit == 0 {
            return Err(DbError::Unsupported(
                "no position to seed from yet (the database has not been synced)".into(),
            ));
        }
        let wal_file = match File::open(&self.wal_path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("open", &self.wal_path)(e)),
        };
        // The frames up to our mark, when the WAL holds any: the state at the position.
        let scan = match (self.mark, wal_file.as_ref()) {
            (Some(m), Some(f)) if m.offset > WAL_HEADER_SIZE => {
                let s = wal::scan(f, WAL_HEADER_SIZE, m.offset - WAL_HEADER_SIZE)?.filter(|s| {
                    (s.header.salt1, s.header.salt2) == (m.salt1, m.salt2)
                        && s.end_offset == m.offset
                });
                match s {
                    Some(s) => Some(s),
                    // An application's checkpoint copied every frame up to the mark into the
                    // database file and restarted the WAL right after it, with no commit since
                    // (proven by the yield); the mark stays until a commit, and our read keeps
                    // any later frame out of the file: the file alone is the state.
                    None if self.next_gen_follows => None,
                    None => return Err(DbError::WalRestartedDuringRead),
                }
            }
            _ => None,
        };
        let commit = self.commit;
        let pages = full_page_list(commit, self.page_size(), scan.as_ref());
        // A position known only from a replica has no timestamp: the first seed's time is
        // kept, so that a seed built again for a retry holds the same bytes.
        let timestamp = match (self.pos_tx.borrow().timestamp_ms, self.seed_time) {
            (0, Some((txid, t))) if txid == self.pos => t,
            (0, _) => now_ms(),
            (t, _) => t,
        };
        self.seed_time = Some((self.pos, timestamp));
        let header = Header {
            flags: if self.checksums {
                0
            } else {
                HEADER_FLAG_NO_CHECKSUM
            },
            page_size: self.page_size(),
            commit,
            min_txid: TxId(1),
            max_txid: self.pos,
            timestamp,
            ..Header::default()
        };
        fsutil::create_dir_all_durable(&self.seed_dir).map_err(io_err("create", &self.seed_dir))?;
        // A name of its own: an older seed of the same TXID may still be dropping its file.
        let path = self.seed_dir.join(format!(
            "{}.{:016x}",
            crate::ltx::format_filename(TxId(1), self.pos),
            rand::random::<u64>()
        ));
        let tmp = fsutil::tmp_path(&path);
        let built = self.encode_seed(&tmp, header, wal_file.as_ref(), &pages);
        let built = built.and_then(|post| {
            if let (Some(f), Some(s)) = (wal_file.as_ref(), scan.as_ref()) {
                same_generation(f, (s.header.salt1, s.header.salt2))?;
            }
            // The position's own checksum, when known (0: after a Litestream-written tip),
            // proves the copy.
            if self.checksums && self.post != 0 && post != self.post {
                return Err(DbError::Unsupported(format!(
                    "seed snapshot at TXID {} does not match the position's checksum \
                     ({post:016x} != {:016x}); not used",
                    self.pos, self.post
                )));
            }
            std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))
        });
        if let Err(e) = built {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        tracing::info!(db = %self.path.display(), txid = %self.pos, pages = pages.len(), "seed snapshot built");
        let seed = Arc::new(SeedSnapshot {
            txid: self.pos,
            timestamp_ms: timestamp,
            path,
        });
        self.last_seed = Some(Arc::downgrade(&seed));
        Ok(seed)
    }

    /// Encodes `pages` into `tmp`; returns the post-apply checksum (0 without checksums).
    fn encode_seed(
        &mut self,
        tmp: &std::path::Path,
        header: Header,
        wal_file: Option<&File>,
        pages: &[(u32, PageSrc)],
    ) -> Result<u64, DbError> {
        let file = File::create(tmp).map_err(io_err("create", tmp))?;
        let mut enc = Encoder::new(std::io::BufWriter::new(file), header, self.codec)?;
        let checksums = self.checksums;
        let mut sum = DbChecksum::default();
        let workers = encode_workers();
        if pages.len() >= PARALLEL_MIN_PAGES && workers > 1 {
            let reader = self.page_reader(wal_file)?;
            encode_parallel(
                reader,
                self.codec,
                checksums,
                pages,
                workers,
                |pgno, data, comp, c| {
                    enc.encode_compressed_page(pgno, comp, data)?;
                    if checksums {
                        sum.toggle(c);
                    }
                    Ok(())
                },
            )?;
        } else {
            let mut buf = vec![0u8; header.page_size as usize];
            for &(pgno, src) in pages {
                self.read_page(wal_file, src, pgno, &mut buf)?;
                enc.encode_page(pgno, &buf)?;
                if checksums {
                    sum.toggle(page_checksum(pgno, &buf));
                }
            }
        }
        let post = if checksums { sum.value() } else { 0 };
        let (w, _) = enc.finish(post)?;
        let file = w
            .into_inner()
            .map_err(|e| io_err("write", tmp)(e.into_error()))?;
        // Not fsynced: a seed is rebuilt after a crash, and it is whole before it is renamed.
        drop(file);
        Ok(post)
    }
}
