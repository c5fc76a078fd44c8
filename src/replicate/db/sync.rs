//! The sync state machine: first sync after start (continuing from staging or cutting a full
//! segment), then one incremental segment per sync of the committed WAL frames.

use super::connection::{file_id, open_pinned, read_wal_header, same_generation};
use super::encode::{PageReader, PageSrc};
#[allow(unused_imports)]
use super::*;

impl Db {
    /// Syncs every committed frame into segments, then checkpoints if the policy says so.
    /// Blocking: run it off the async reactor. Returns the number of segments written.
    pub fn sync(&mut self, allow_checkpoint: bool) -> Result<usize, DbError> {
        if let Some(why) = self.poisoned.take() {
            tracing::warn!(db = %self.path.display(), txid = %self.pos, cause = %why, "reopening the database after a failed local write; the next segment is a full copy");
            self.reopen("recovering from a failed local write");
        }
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let result = self.sync_inner(allow_checkpoint);
        self.stats
            .sync_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(m) = self.mark {
            self.stats.wal_size.store(m.offset, Ordering::Relaxed);
        }
        match &result {
            Err(_) => {
                self.stats.sync_errors.fetch_add(1, Ordering::Relaxed);
                self.fast = None;
            }
            // A segment's buffers were freed.
            Ok(n) if *n > 0 => crate::util::malloc::note_freed(),
            Ok(_) => {}
        }
        result
    }

    pub(super) fn sync_inner(&mut self, allow_checkpoint: bool) -> Result<usize, DbError> {
        self.checkpoint_segments = 0;
        if self.opened().is_some() && self.replaced()? {
            tracing::warn!(db = %self.path.display(), txid = %self.pos, "the database file was replaced (a new file at its path); reopening it, the next segment is a full copy of the new one");
            self.reopen("database file replaced");
        }
        // Before a dormant database wakes: a WAL lost while it slept is no reason to open.
        self.check_wal()?;
        if let Some(d) = self.dormant() {
            if !self.path.exists() {
                return Err(DbError::Missing(self.path.clone()));
            }
            self.wake(d.db)?;
        }
        if self.opened().is_none() && !self.init()? {
            return Err(DbError::Missing(self.path.clone()));
        }
        if self.staging.is_some() && !self.staging_dir.is_dir() {
            // Deleted under us (an operator, a tmp cleaner): the position lives on in memory,
            // so recreating the directory is enough to go on without losing a transaction.
            // Segments staged but not yet uploaded are gone; a replica that needed them
            // reports that it cannot catch up from staging.
            tracing::warn!(db = %self.path.display(), dir = %self.staging_dir.display(), txid = %self.pos, "staging directory disappeared; recreating it");
            fsutil::create_dir_all_durable(&self.staging_dir)
                .map_err(io_err("recreate staging", &self.staging_dir))?;
        }
        let mut written = 0;
        loop {
            let (wrote, limited) = self.sync_once()?;
            written += usize::from(wrote);
            if !limited {
                break;
            }
        }
        if self.checkpoint_waiting() {
            written += self.yield_to_checkpoint()?;
        }
        self.last_full_verify = Instant::now();
        if allow_checkpoint && self.checkpoint_due(Instant::now()) {
            written += self.checkpoint(false)?;
        } else if allow_checkpoint && written == 0 && self.shrink_due(Instant::now()) {
            // Quiet since an earlier empty sync too (`shrink_due`): one empty sync alone can
            // fall between two commits of a busy writer.
            self.shrink_tried = Some(Instant::now());
            written += self.checkpoint(true)?;
        }
        self.refresh_fast_cache();
        self.stats.idle.store(written == 0, Ordering::Relaxed);
        let now = Instant::now();
        if written > 0 {
            self.idle_since = None;
        } else {
            self.idle_since.get_or_insert(now);
            if self.dormancy_due(now) {
                self.go_dormant()?;
            }
        }
        Ok(written)
    }

    /// Opens SQLite, takes the read transaction, and recovers the position. Returns false if
    /// the database file does not exist yet.
    pub(super) fn init(&mut self) -> Result<bool, DbError> {
        if !self.path.exists() {
            return Ok(false);
        }
        let (conn, page_size) = open_pinned(&self.path)?;
        let db_file = File::open(&self.path).map_err(io_err("open", &self.path))?;
        let staging = Staging::open(self.staging_dir.clone())
            .map_err(io_err("open staging", &self.staging_dir))?;
        match staging.tip() {
            Ok(Some(tip)) if tip.header.page_size != page_size => {
                return Err(DbError::Unsupported(format!(
                    "page size of {} changed from {} to {page_size}; replicate it to a new replica path",
                    self.path.display(),
                    tip.header.page_size
                )));
            }
            Ok(Some(tip)) => {
                self.pos = tip.header.max_txid;
                self.commit = tip.header.commit;
                self.post = tip.post_apply_checksum;
                self.mark = (tip.header.wal_offset > 0).then_some(WalMark {
                    salt1: tip.header.wal_salt1,
                    salt2: tip.header.wal_salt2,
                    offset: (tip.header.wal_offset + tip.header.wal_size) as u64,
                });
                self.publish(tip.header.timestamp);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(db = %self.path.display(), error = %e, "newest staged segment unusable; continuing after the replicas' position with a full segment");
                staging
                    .clear()
                    .map_err(io_err("clear staging", &self.staging_dir))?;
            }
        }
        if self.remote_tip.page_size != 0 && self.remote_tip.page_size != page_size {
            return Err(DbError::Unsupported(format!(
                "a replica of {} holds a database with {}-byte pages up to TXID {}, but the \
                 database has {page_size}-byte pages: the replica belongs to another database; \
                 give this one its own replica path (nothing is written to the replica)",
                self.path.display(),
                self.remote_tip.page_size,
                self.remote_tip.txid
            )));
        }
        if self.remote_tip.txid > self.pos {
            self.pos = self.remote_tip.txid;
            self.post = self.remote_tip.post_apply_checksum;
            self.mark = None;
            self.publish(0);
        }
        self.continuous = false;
        self.page_buf = vec![0u8; page_size as usize];
        let id = file_id(&db_file, &self.path)?;
        self.install(Open {
            conn,
            db_file,
            page_size,
            id,
            wal_id: None,
        });
        self.staging = Some(staging);
        Ok(true)
    }

    /// Cuts at most one segment. Returns (segment written, more WAL left to copy).
    pub(super) fn sync_once(&mut self) -> Result<(bool, bool), DbError> {
        let wal_file = match File::open(&self.wal_path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("open", &self.wal_path)(e)),
        };
        let header = match &wal_file {
            Some(f) => read_wal_header(f)?,
            None => None,
        };
        let wal_len = match &wal_file {
            Some(f) => f.metadata().map_err(io_err("stat", &self.wal_path))?.len(),
            None => 0,
        };
        if !self.continuous {
            // Decides continuity from scratch, with its own proofs.
            self.after_yield = false;
            self.next_gen_follows = false;
            self.yield_seal_to = None;
            return self.startup_sync(wal_file.as_ref(), header, wal_len);
        }
        if self.after_yield
            && !matches!((self.mark, header), (Some(m), Some(h)) if (m.salt1, m.salt2) == (h.salt1, h.salt2))
        {
            // Rebased: the new generation's frames are scanned by the caller's next round.
            let wrote = self.rebase_after_yield(wal_file.as_ref(), header)?;
            return Ok((wrote, !wrote));
        }
        let start = match (self.mark, header) {
            (_, None) => {
                // No valid WAL: nothing can have been committed since (the read transaction
                // stops anyone from truncating it), unless this is our first look.
                return Ok((false, false));
            }
            (Some(m), Some(h)) if (m.salt1, m.salt2) == (h.salt1, h.salt2) => {
                if wal_len < m.offset {
                    return self
                        .write_full(wal_file.as_ref(), header, "wal truncated")
                        .map(|w| (w, false));
                }
                m.offset
            }
            (Some(m), Some(h)) if h.salt1 == m.salt1.wrapping_add(1) || self.next_gen_follows => {
                WAL_HEADER_SIZE
            }
            (Some(_), Some(_)) => {
                return self
                    .write_full(wal_file.as_ref(), header, "wal restarted more than once")
                    .map(|w| (w, false));
            }
            (None, Some(_)) => WAL_HEADER_SIZE,
        };
        let Some(f) = wal_file.as_ref() else {
            return Ok((false, false));
        };
        let scan = match wal::scan(f, start, MAX_SYNC_WAL_BYTES) {
            // The scan reads the header again. A restart between the two reads would have it
            // continue from our mark in a generation the decision above did not see: look
            // again (the caller's loop calls back at once).
            Ok(Some(s))
                if header
                    .is_some_and(|h| (h.salt1, h.salt2) != (s.header.salt1, s.header.salt2)) =>
            {
                return Ok((false, true));
            }
            Ok(Some(s)) => s,
            Ok(None) => return Ok((false, true)),
            // The same race, seen as the frame before our mark carrying the old salts under
            // the new header: only a generation that did not change was overwritten.
            Err(WalError::PrevFrameMismatch { .. })
                if header.is_some_and(|h| same_generation(f, (h.salt1, h.salt2)).is_err()) =>
            {
                return Ok((false, true));
            }
            Err(WalError::PrevFrameMismatch { .. }) => {
                return self
                    .write_full(wal_file.as_ref(), header, "wal overwritten")
                    .map(|w| (w, false));
            }
            Err(e) => return Err(e.into()),
        };
        let h = scan.header;
        if scan.pages.is_empty() && scan.end_offset == start {
            // Nothing found may mean a restart overwrote the frames between the scan's
            // header read and its frame reads: look again rather than call it sealed.
            if same_generation(f, (h.salt1, h.salt2)).is_err() {
                return Ok((false, true));
            }
            // An empty generation after a proven restart may still be rolled back and
            // replaced by another with other salts: keep following the old mark until one
            // holds a commit.
            let other = self
                .mark
                .is_some_and(|m| (m.salt1, m.salt2) != (h.salt1, h.salt2));
            if !(other && start == WAL_HEADER_SIZE && self.next_gen_follows) {
                self.mark = Some(WalMark {
                    salt1: h.salt1,
                    salt2: h.salt2,
                    offset: start,
                });
            }
            self.sealed_after_yield();
            return Ok((false, false));
        }
        let wrote = self.write_incremental(f, &scan, start, |_| true)?;
        // The mark follows the scanned generation from here, which holds a commit.
        self.next_gen_follows = false;
        // Every frame of the mark's generation is sealed: a later generation follows it.
        if !scan.limited {
            self.sealed_after_yield();
        }
        Ok((wrote, scan.limited))
    }

    /// The mark's generation is sealed to its end: after a yield, that proves continuity once
    /// the seal has reached the frames the proof counted.
    fn sealed_after_yield(&mut self) {
        let reached = match (self.yield_seal_to, self.mark) {
            (Some(to), Some(m)) => m.offset >= to,
            (Some(_), None) => false,
            (None, _) => true,
        };
        if reached {
            self.after_yield = false;
            self.yield_seal_to = None;
        }
    }

    /// First sync after opening: decides between continuing the chain and a full segment, and
    /// builds the checksum table from the whole database.
    pub(super) fn startup_sync(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
        wal_len: u64,
    ) -> Result<(bool, bool), DbError> {
        #[cfg(test)]
        {
            self.hooks.startup_syncs += 1;
        }
        let scan = match (wal_file, header) {
            (Some(f), Some(_)) => wal::scan(f, WAL_HEADER_SIZE, u64::MAX)?,
            _ => None,
        };
        // Kept until the full segment is written: a failed write is decided again.
        let forced = self.remote_tip.full_reason;
        let woke_unchanged = std::mem::take(&mut self.woke_unchanged);
        let same_wal = |m: WalMark, s: &wal::WalScan| {
            (s.header.salt1, s.header.salt2) == (m.salt1, m.salt2)
                && wal_len >= m.offset
                && s.end_offset >= m.offset
        };
        let reason = match (self.pos.0, self.mark, &scan) {
            _ if forced.is_some() => forced,
            (0, _, _) => Some("initial snapshot"),
            (_, Some(m), Some(s)) if same_wal(m, s) => None,
            // Woken with the database file untouched: nothing was checkpointed while dormant,
            // so the current WAL, if any, holds every change since the mark (module doc).
            (_, _, None) if woke_unchanged => {
                self.continuous = true;
                return Ok((false, false));
            }
            (_, _, Some(_)) if woke_unchanged => {
                self.mark = None;
                None
            }
            (_, None, _) => Some("local position unknown"),
            (_, Some(_), None) => Some("wal missing or empty after restart"),
            (_, Some(m), Some(s)) => {
                if (s.header.salt1, s.header.salt2) != (m.salt1, m.salt2) {
                    Some("wal restarted while replicad was down")
                } else if wal_len < m.offset || s.end_offset < m.offset {
                    Some("wal truncated while replicad was down")
                } else {
                    None
                }
            }
        };
        let wrote = match (reason, scan.as_ref(), wal_file) {
            (None, Some(s), Some(f)) => {
                let from = self.mark.map_or(WAL_HEADER_SIZE, |m| m.offset);
                if self.checksums {
                    self.build_table(Some((f, s)))?;
                }
                let changed = |off: u64| off >= from;
                if s.end_offset == from {
                    self.mark = Some(WalMark {
                        salt1: s.header.salt1,
                        salt2: s.header.salt2,
                        offset: from,
                    });
                    false
                } else {
                    self.write_incremental(f, s, from, changed)?
                }
            }
            (Some(reason), _, _) => {
                // A database identical to the replica's tip needs no full copy (clean restart
                // where SQLite removed the WAL on close).
                if forced.is_none() && self.checksums && self.pos.0 > 0 && self.post != 0 {
                    self.build_table(scan.as_ref().zip(wal_file).map(|(s, f)| (f, s)))?;
                    if self.sum.value() == self.post {
                        // The position's page count is the database's now (the checksums
                        // say they are the same state); a seed snapshot needs it when staging
                        // was lost and only a replica gave the position.
                        self.commit = self.current_commit(scan.as_ref())?;
                        self.mark = scan.as_ref().map(|s| WalMark {
                            salt1: s.header.salt1,
                            salt2: s.header.salt2,
                            offset: s.end_offset,
                        });
                        self.continuous = true;
                        return Ok((false, false));
                    }
                }
                self.write_full(wal_file, header, reason)?
            }
            (None, _, _) => self.write_full(wal_file, header, "wal unreadable")?,
        };
        self.remote_tip.full_reason = None;
        self.continuous = true;
        Ok((wrote, false))
    }

    /// Builds the per-page checksum table of the current database state.
    pub(super) fn build_table(
        &mut self,
        overlay: Option<(&File, &wal::WalScan)>,
    ) -> Result<(), DbError> {
        let commit = self.current_commit(overlay.map(|(_, s)| s))?;
        // The table describes the database as it is now; `self.commit` stays the commit at
        // the current position, so growth since then is still copied.
        let mut table = vec![0u64; commit as usize];
        let mut sum = DbChecksum::default();
        let ps = self.page_size();
        let lock = lock_pgno(ps);
        let mut buf = std::mem::take(&mut self.page_buf);
        // Phase stats: summed here, added to the process-wide totals once.
        let (mut read_nanos, mut read_bytes) = (0u64, 0u64);
        let read = (|| {
            for pgno in (1..=commit).filter(|p| *p != lock) {
                let src = overlay
                    .and_then(|(_, s)| s.pages.get(&pgno).copied())
                    .map_or(PageSrc::DB_FILE, |o| PageSrc::wal(o, ps));
                let t = Instant::now();
                self.read_page(overlay.map(|(f, _)| f), src, pgno, &mut buf)?;
                read_nanos += duration_nanos(t.elapsed());
                read_bytes += buf.len() as u64;
                let c = page_checksum(pgno, &buf);
                table[pgno as usize - 1] = c;
                sum.toggle(c);
            }
            match overlay {
                Some((f, s)) => same_generation(f, (s.header.salt1, s.header.salt2)),
                None => Ok(()),
            }
        })();
        // The page buffer goes back on every path: an empty one would make every later
        // segment fail (a failed read here once left the daemon retrying a full segment).
        self.page_buf = buf;
        read?;
        self.phases
            .record_nanos(Phase::WalRead, read_bytes, read_nanos);
        self.table = table;
        self.sum = sum;
        Ok(())
    }

    pub(super) fn page_size(&self) -> u32 {
        self.opened().map_or(4096, |o| o.page_size)
    }

    /// Database size in pages: the last commit frame's, else the database header's.
    pub(super) fn current_commit(&self, scan: Option<&wal::WalScan>) -> Result<u32, DbError> {
        if let Some(s) = scan.filter(|s| s.commit > 0) {
            return Ok(s.commit);
        }
        let open = self
            .opened()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?;
        let len = open
            .db_file
            .metadata()
            .map_err(io_err("stat", &self.path))?
            .len();
        let mut h = [0u8; 100];
        if len >= 100 && open.db_file.read_exact_at(&mut h, 0).is_ok() {
            let in_header = u32::from_be_bytes([h[28], h[29], h[30], h[31]]);
            let change = &h[24..28];
            let valid_for = &h[92..96];
            if in_header > 0 && change == valid_for {
                return Ok(in_header);
            }
        }
        Ok((len / u64::from(open.page_size)) as u32)
    }

    pub(super) fn read_page(
        &self,
        wal_file: Option<&File>,
        src: PageSrc,
        pgno: u32,
        buf: &mut [u8],
    ) -> Result<(), DbError> {
        self.page_reader(wal_file)?.read(src, pgno, buf)
    }

    pub(super) fn page_reader<'a>(
        &'a self,
        wal_file: Option<&'a File>,
    ) -> Result<PageReader<'a>, DbError> {
        let open = self
            .opened()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?;
        Ok(PageReader {
            db_file: &open.db_file,
            wal_file,
            page_size: open.page_size,
            path: &self.path,
        })
    }
}
