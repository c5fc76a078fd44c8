//! Checkpoints and the write-lock barrier: a frame is checkpointed only once it is durable in
//! a staged segment (invariant 2 of the parent module); reopening after a lost read
//! transaction or a replaced file.

use super::connection::{begin_read, open_connection, read_wal_header};
#[allow(unused_imports)]
use super::*;

/// Busy handler of the checkpoint barrier's `BEGIN IMMEDIATE` once the WAL is large: a writer
/// committing back to back frees the write lock only for microseconds, which SQLite's default
/// handler (sleeps of 1 to 100 ms) misses until a TRUNCATE stalls the application; polling
/// every 20 us for about a second catches a gap (figures: `docs/benchmarks.md`, write lock).
pub(super) fn barrier_busy(attempt: i32) -> bool {
    std::thread::sleep(Duration::from_micros(20));
    attempt < BARRIER_BUSY_POLLS
}

/// Most unlocked backfill passes before a checkpoint takes the barrier.
pub(super) const BACKFILL_PASSES: usize = 3;

/// Frames left past our read mark that a checkpoint copies under the barrier without another
/// unlocked pass first (about 1 MiB of 4 KiB pages: a few milliseconds of copying).
pub(super) const BACKFILL_SETTLED_FRAMES: u64 = 256;

/// Backlog below which a backfill pass skips its extra unlocked steps (the seal before its
/// lock, the database file's sync after its copy): each costs fsyncs of its own, which with a
/// small backlog take longer than the locked work they save, and a longer pass lets a fast
/// writer outgrow the checkpoint (`checkpoints_keep_up_with_a_writer_committing_back_to_back`
/// guards this).
pub(super) const PASS_EXTRA_MIN_FRAMES: u64 = 1024;

/// How long a writer must have been quiet before an oversized WAL is shrunk.
pub(super) const QUIET_BEFORE_SHRINK: Duration = Duration::from_millis(500);

/// Polls of [`barrier_busy`] before the checkpoint is skipped (about 1-2 s in all).
pub(super) const BARRIER_BUSY_POLLS: i32 = 20_000;

impl Db {
    /// Bytes of one WAL frame: its 24-byte header and a page.
    pub(super) fn frame_size(&self) -> u64 {
        24 + u64::from(self.page_size())
    }

    pub(super) fn wal_pages(&self) -> u64 {
        // A mark kept on an older generation after a proven restart holds no current frame.
        if self.next_gen_follows {
            return 0;
        }
        self.mark.map_or(0, |m| {
            m.offset.saturating_sub(WAL_HEADER_SIZE) / self.frame_size()
        })
    }

    pub(super) fn checkpoint_due(&self, now: Instant) -> bool {
        if !self.dirty_since_checkpoint {
            return false;
        }
        let pages = self.wal_pages();
        let interval = self.settings.checkpoint_interval;
        pages >= u64::from(self.settings.min_checkpoint_page_count)
            || (!interval.is_zero()
                && now.duration_since(self.last_checkpoint) >= interval
                && pages > 1)
    }

    /// An oversized WAL (see `wal_oversized`) is shrunk on the first tick that finds no new
    /// frame: the writer has paused, so freeing the file's blocks holds no one up.
    pub(super) fn shrink_due(&self, now: Instant) -> bool {
        let retry = self
            .settings
            .checkpoint_interval
            .max(Duration::from_secs(1));
        self.wal_oversized
            && self
                .idle_since
                .is_some_and(|t| now.duration_since(t) >= QUIET_BEFORE_SHRINK)
            && self
                .shrink_tried
                .is_none_or(|t| now.duration_since(t) >= retry)
    }

    /// Checkpoints the WAL (DESIGN §3.1): PASSIVE under a write lock after a sealing sync;
    /// TRUNCATE above `truncate-page-n`. Never RESTART. Returns segments written.
    ///
    /// A complete PASSIVE checkpoint restarts the WAL with a small write of our own. That
    /// write shrinks the file to one frame unless the page count forced this checkpoint (a
    /// busy writer) and `quiet` is false: then the WAL is reused in place, as SQLite does by
    /// default. Shrinking frees the file's blocks while our write holds SQLite's write lock,
    /// which beside a busy writer costs the application far more than reuse in place
    /// (`docs/benchmarks.md`, write lock). The first quiet tick shrinks it instead.
    pub(super) fn checkpoint(&mut self, quiet: bool) -> Result<usize, DbError> {
        let pages = self.wal_pages();
        let truncate = pages >= u64::from(self.settings.truncate_page_n);
        let shrink = quiet || pages < u64::from(self.settings.min_checkpoint_page_count);
        let mut barrier = open_connection(&self.path)?;
        // Politely while the WAL is small: a busy write lock skips this checkpoint until a
        // later tick, without holding up the monitor. Insistently past a quarter of the
        // TRUNCATE threshold, so that a writer that never pauses gets one short stall of a
        // PASSIVE checkpoint instead of a TRUNCATE's long one followed by a full segment.
        let insist = pages >= u64::from(self.settings.truncate_page_n / 4);
        if insist {
            barrier.busy_handler(Some(barrier_busy))?;
        } else {
            barrier.busy_timeout(Duration::from_millis(10))?;
        }
        let mut written = 0;
        if !truncate {
            // Each pass leaves for the barrier only what the application committed during it;
            // against a fast writer a second or third pass shrinks that several-fold.
            let mut ahead = true;
            // Where the previous pass left our read mark (frames), and whether it left enough
            // behind to be worth a seal of its own before the next pass locks.
            let (mut read_mark, mut seal_first) = (0, false);
            for _ in 0..BACKFILL_PASSES {
                let (wrote, behind) = self.backfill_ahead(&barrier, seal_first, &mut read_mark)?;
                written += wrote;
                seal_first = behind.is_some_and(|n| n >= PASS_EXTRA_MIN_FRAMES);
                match behind {
                    // Busy while polite: give up at once, so that the next tick tries again
                    // soon (a failed try must stay cheap against a fast writer).
                    None if !insist => {
                        tracing::debug!(db = %self.path.display(), "checkpoint skipped: write lock busy");
                        return Ok(written);
                    }
                    // Busy while insisting: the barrier polls again, with nothing in between.
                    None => {
                        ahead = false;
                        break;
                    }
                    Some(n) if n <= BACKFILL_SETTLED_FRAMES => break,
                    Some(_) => {}
                }
            }
            if ahead {
                // The checkpoint under the barrier syncs the WAL and the database file: sync
                // both now, unlocked, so that those syncs find little left to write. Likewise
                // seal now, leaving the barrier's seal only what is committed from here on.
                self.sync_wal_and_db()?;
                written += self.seal()?;
            }
        }
        // The barrier: holding SQLite's write lock, no commit can land between the seal and
        // the checkpoint, so every frame the checkpoint moves is already in a segment.
        if let Err(e) = barrier.execute_batch("BEGIN IMMEDIATE") {
            tracing::debug!(db = %self.path.display(), error = %e, "checkpoint skipped: write lock busy");
            return Ok(written);
        }
        let locked = Instant::now();
        let mut released = false;
        let sealed = (|| {
            written += self.seal()?;
            let seal_ms = locked.elapsed().as_millis();
            let conn = self.end_read()?;
            released = true;
            let mode = if truncate { "TRUNCATE" } else { "PASSIVE" };
            // TRUNCATE needs the write lock itself: give it up first (the WAL is synced).
            if truncate {
                barrier.execute_batch("ROLLBACK")?;
            }
            let copying = Instant::now();
            let (busy, log, done): (i64, i64, i64) =
                conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            let copy_ms = copying.elapsed().as_millis();
            let complete = log >= 0 && log == done;
            begin_read(conn)?;
            released = false;
            let locked_ms = locked.elapsed().as_millis();
            tracing::debug!(db = %self.path.display(), mode, busy, log, done, seal_ms, copy_ms, locked_ms, "checkpoint");
            Ok::<_, DbError>((truncate, complete))
        })();
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        self.count_write_lock(locked);
        let (truncated, complete) = match sealed {
            Ok(v) => v,
            Err(e) => {
                if released {
                    self.reopen_after_lost_read();
                }
                return Err(e);
            }
        };
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        if truncated {
            self.stats
                .truncate_checkpoints
                .fetch_add(1, Ordering::Relaxed);
        }
        self.last_checkpoint = Instant::now();
        self.dirty_since_checkpoint = false;
        if truncated {
            self.wal_oversized = false;
            self.shrink_tried = None;
            // Commits may have landed between the unlock and the truncate: they are in the
            // database file now, not in any WAL frame we saw. Only a full segment is safe.
            let f = File::open(&self.wal_path).ok();
            let h = match &f {
                Some(f) => read_wal_header(f)?,
                None => None,
            };
            written += usize::from(self.write_full(
                f.as_ref(),
                h,
                "checkpoint boundary after TRUNCATE",
            )?);
        } else if complete {
            // Restart the WAL now with our own small write, so the file shrinks back to one
            // frame (journal_size_limit=0) and the idle fast path applies again.
            let restarting = Instant::now();
            let limit = if shrink { 0 } else { -1 };
            barrier.execute_batch(&format!("PRAGMA journal_size_limit={limit}"))?;
            barrier.execute_batch(
                "BEGIN IMMEDIATE; \
                 CREATE TABLE IF NOT EXISTS _replicad_seq (id INTEGER PRIMARY KEY, seq INTEGER); \
                 INSERT INTO _replicad_seq (id, seq) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; \
                 COMMIT;",
            )?;
            tracing::debug!(db = %self.path.display(), shrink, restart_ms = restarting.elapsed().as_millis(), "WAL restarted");
            let (wrote, _) = self.sync_once()?;
            written += usize::from(wrote);
            self.wal_oversized = !shrink;
            if shrink {
                self.shrink_tried = None;
            }
        }
        // Our own restart write is not new application data.
        self.dirty_since_checkpoint = false;
        Ok(written)
    }

    /// The first two phases of a PASSIVE checkpoint, so that the application waits on the
    /// barrier only for what it commits meanwhile, not for a whole interval's frames:
    /// 1. under the write lock for a moment, seal (copy what is new) and move our read
    ///    transaction to the end of the WAL, which is now all in segments;
    /// 2. without any lock, a PASSIVE checkpoint copies those frames into the database file
    ///    while the application keeps committing. It stops at our read mark, and the WAL
    ///    cannot restart while we read, so no frame is lost (invariants 2 and 3 hold: the
    ///    frames it moves stay in the WAL until the barrier's phase allows a restart).
    ///
    /// Unlocked work around both phases keeps the locked moment short: after the copy,
    /// another seal; with a large backlog (see [`PASS_EXTRA_MIN_FRAMES`]) also a seal before
    /// the lock (`seal_first`), so that the seal under it has only what lands meanwhile, and
    /// a sync of the database file after a large copy. `read_mark` is where the previous
    /// pass left our read mark, in frames (0 for the first pass); it is moved on.
    ///
    /// Returns segments written and the frames the application committed during the copy,
    /// sealed (unlocked) right after it (`None` when the write lock was busy).
    pub(super) fn backfill_ahead(
        &mut self,
        barrier: &Connection,
        seal_first: bool,
        read_mark: &mut u64,
    ) -> Result<(usize, Option<u64>), DbError> {
        let mut written = if seal_first { self.seal()? } else { 0 };
        if barrier.execute_batch("BEGIN IMMEDIATE").is_err() {
            return Ok((written, None));
        }
        let locked = Instant::now();
        let mut released = false;
        let moved = (|| {
            written += self.seal()?;
            let conn = self.end_read()?;
            released = true;
            // Nobody can commit while the barrier holds the write lock: the new read mark
            // is exactly the end of what was just sealed.
            begin_read(conn)?;
            Ok::<_, DbError>(())
        })();
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        self.count_write_lock(locked);
        if let Err(e) = moved {
            if released {
                self.reopen_after_lost_read();
            }
            return Err(e);
        }
        let locked_ms = locked.elapsed().as_millis();
        let copied = self.wal_pages().saturating_sub(*read_mark);
        *read_mark += copied;
        let copying = Instant::now();
        let (_, log, done): (i64, i64, i64) =
            barrier.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        let copy_ms = copying.elapsed().as_millis();
        // SQLite syncs the database file only when a checkpoint's copy ends at the end of the
        // WAL, which a pass beside a busy writer never does: every pass's pages would stay
        // dirty until the barrier's checkpoint wrote them all back under the write lock.
        if copied >= PASS_EXTRA_MIN_FRAMES {
            self.sync_db()?;
        }
        // What the application committed meanwhile, sealed now, unlocked, so that the next
        // pass's seal under the lock has only the last few commits. (The checkpoint's own
        // figures are from its start; the file's length says nothing once the WAL is reused
        // in place.)
        let sealed_to = self.mark.map_or(0, |m| m.offset);
        written += self.seal()?;
        let behind =
            self.mark.map_or(0, |m| m.offset).saturating_sub(sealed_to) / self.frame_size();
        tracing::debug!(db = %self.path.display(), log, done, behind, locked_ms, copy_ms, "backfill pass");
        Ok((written, Some(behind)))
    }

    /// Syncs the application's WAL and database file ahead of a checkpoint's own syncs, which
    /// then find little left to write. A failure is reported, not ignored: the checkpoint
    /// must not go on as if those pages were safe (SQLite's own sync on its descriptor would
    /// report it too, but only once).
    pub(super) fn sync_wal_and_db(&self) -> Result<(), DbError> {
        File::open(&self.wal_path)
            .and_then(|f| f.sync_data())
            .map_err(io_err("fsync", &self.wal_path))?;
        self.sync_db()
    }

    /// Syncs the application's database file (see [`Db::sync_wal_and_db`]).
    pub(super) fn sync_db(&self) -> Result<(), DbError> {
        if let Some(open) = self.opened() {
            open.db_file
                .sync_data()
                .map_err(io_err("fsync", &self.path))?;
        }
        Ok(())
    }

    /// After an error left us without our read transaction, the WAL may restart behind us:
    /// the next sync reopens from the staged position (a full segment if continuity is lost).
    pub(super) fn reopen_after_lost_read(&mut self) {
        self.close();
        self.continuous = false;
    }

    /// True when the path no longer names the file we have open (replaced, or removed:
    /// then [`DbError::Missing`] after the reopen).
    pub(super) fn replaced(&self) -> Result<bool, DbError> {
        let Some(open) = self.opened() else {
            return Ok(false);
        };
        match std::fs::metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) != open.id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(io_err("stat", &self.path)(e)),
        }
    }

    /// The next segment is a full copy, at the TXID after every one staged so far.
    pub(super) fn force_full(&mut self, reason: &'static str) {
        let page_size = if self.page_buf.is_empty() {
            self.remote_tip.page_size
        } else {
            self.page_buf.len() as u32
        };
        self.remote_tip = RemoteTip {
            txid: self.pos.max(self.remote_tip.txid),
            post_apply_checksum: self.post,
            full_reason: Some(reason),
            page_size,
        };
    }

    /// Forgets everything not proven by staging (connection, read transaction, WAL mark,
    /// checksum table); the next sync opens the database again and writes a full segment.
    pub(super) fn reopen(&mut self, reason: &'static str) {
        self.force_full(reason);
        self.forget_conn();
        self.stats.dormant.store(false, Ordering::Relaxed);
        self.continuous = false;
        self.mark = None;
        self.fast = None;
        self.staging = None;
        self.table = Vec::new();
        self.sum = DbChecksum::default();
        self.wal_oversized = false;
        self.woke_unchanged = false;
        self.after_yield = false;
        self.next_gen_follows = false;
        self.yield_seal_to = None;
    }

    pub(super) fn count_write_lock(&self, since: Instant) {
        self.stats
            .write_lock_nanos
            .fetch_add(duration_nanos(since.elapsed()), Ordering::Relaxed);
    }

    /// Copies every committed frame into segments (under the barrier: nothing new can land).
    pub(super) fn seal(&mut self) -> Result<usize, DbError> {
        let mut written = 0;
        loop {
            let (wrote, limited) = self.sync_once()?;
            written += usize::from(wrote);
            if !limited {
                return Ok(written);
            }
        }
    }

    /// Ends our read transaction (only under the barrier); returns the connection.
    pub(super) fn end_read(&self) -> Result<&Connection, DbError> {
        let conn = &self
            .opened()
            .ok_or_else(|| DbError::Unsupported("database not open".into()))?
            .conn;
        conn.execute_batch("COMMIT")?;
        Ok(conn)
    }

    /// Final sync before shutdown (no checkpoint: the next start continues from the WAL).
    /// A dormant database that did not change stays closed.
    pub fn final_sync(&mut self) -> Result<usize, DbError> {
        if self.dormant().is_some() && self.unchanged_since_sync() {
            return Ok(0);
        }
        self.sync(false)
    }

    /// Deletes staged segments every replica has (keeping the newest).
    pub fn prune_staging(&self, acknowledged: TxId) -> Result<usize, DbError> {
        let Some(s) = &self.staging else { return Ok(0) };
        let removed = s
            .prune_below(TxId(acknowledged.0 + 1))
            .map_err(io_err("prune", &self.staging_dir))?;
        if removed > 0 {
            let bytes = s.total_bytes().map_err(io_err("stat", &self.staging_dir))?;
            self.stats.staging_bytes.store(bytes, Ordering::Relaxed);
        }
        Ok(removed)
    }
}
