//! Checkpoints and the write-lock barrier: a frame is checkpointed only once it is durable in
//! a staged segment (invariant 2 of the parent module); reopening after a lost read
//! transaction or a replaced file.
//!
//! Beside a busy writer a checkpoint first copies the WAL into the database file in unlocked
//! passes, each moving our read mark by a leapfrog of two connections, and takes SQLite's
//! write lock only for what the writer committed during the last pass (or defers, while the
//! WAL is under half of `truncate-page-n`, when the writer outran every pass): the
//! application waits for that lock, so its hold is what this module keeps short.

use super::connection::{PINNED_BUSY_TIMEOUT, begin_read, open_connection, read_wal_header};
use super::shm::ShmProbe;
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
pub(super) const BACKFILL_PASSES: usize = 16;

/// No pass begins after this many once the WAL holds half of `truncate-page-n` (judged at
/// each pass; none after the first once it holds all of it).
pub(super) const NEAR_TRUNCATE_PASSES: usize = 3;

/// Frames left past our read mark that a checkpoint copies under the barrier without another
/// unlocked pass first (about 1 MiB of 4 KiB pages: a few milliseconds of copying).
pub(super) const BACKFILL_SETTLED_FRAMES: u64 = 256;

/// Backlog below which a backfill pass skips its extra unlocked steps (the seal before its
/// lock, the database file's sync after its copy): each costs fsyncs of its own, which with a
/// small backlog take longer than the locked work they save, and a longer pass lets a fast
/// writer outgrow the checkpoint (`checkpoints_keep_up_with_a_writer_committing_back_to_back`
/// guards this).
pub(super) const PASS_EXTRA_MIN_FRAMES: u64 = 1024;

/// Most frames left after the unlocked passes that the barrier copies under the write lock
/// (about 8 MiB of 4 KiB pages) while the WAL is under half of `truncate-page-n`.
pub(super) const BARRIER_MAX_FRAMES: u64 = 2048;

/// How long a writer must have been quiet before an oversized WAL is shrunk.
pub(super) const QUIET_BEFORE_SHRINK: Duration = Duration::from_millis(500);

/// Polls of [`barrier_busy`] before the checkpoint is skipped (about 1-2 s in all).
pub(super) const BARRIER_BUSY_POLLS: i32 = 20_000;

/// How often a TRUNCATE checkpoint is tried again while another connection's reader keeps
/// it from resetting the WAL.
const TRUNCATE_RETRY: Duration = Duration::from_secs(5);

impl Db {
    /// The salts of the WAL generation our mark is in.
    pub(super) fn mark_salts(&self) -> Option<(u32, u32)> {
        self.mark.map(|m| (m.salt1, m.salt2))
    }

    /// Bytes of one WAL frame: its 24-byte header and a page.
    pub(super) fn frame_size(&self) -> u64 {
        wal::WAL_FRAME_HEADER_SIZE + u64::from(self.page_size())
    }

    /// A sync must not wait for `min-sync-interval`: an application's checkpoint waits for
    /// our read lock (its busy timeout runs meanwhile), or the WAL holds more than a quarter of
    /// `truncate-page-n` frames (waiting longer would bring the TRUNCATE that stalls the
    /// application). The frames are the wal-index's count (the file keeps its length after a
    /// restart), ours when the index is being written. Two reads; called when the WAL changed.
    pub fn sync_urgent(&self) -> bool {
        let frames = self
            .shm
            .as_ref()
            .and_then(ShmProbe::index_header)
            .map_or_else(|| self.wal_pages(), |h| u64::from(h.max_frame));
        self.checkpoint_maybe_waiting() || frames >= self.insist_pages()
    }

    /// A quarter of `truncate-page-n`: past it a checkpoint insists on the write lock, and a
    /// sync no longer waits for `min-sync-interval`.
    fn insist_pages(&self) -> u64 {
        u64::from(self.settings.truncate_page_n / 4)
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
        // While a reader keeps TRUNCATE from resetting the WAL, it is tried again only every
        // few seconds (each try takes the write lock); PASSIVE checkpoints run in between.
        let truncate = pages >= u64::from(self.settings.truncate_page_n)
            && self
                .truncate_blocked
                .is_none_or(|(_, tried)| tried.elapsed() >= TRUNCATE_RETRY);
        let shrink = quiet || pages < u64::from(self.settings.min_checkpoint_page_count);
        // The connection that takes the write lock; during the unlocked passes it takes turns
        // with the pinned one in holding our read transaction ([`Db::leapfrog`]).
        let mut barrier = open_connection(&self.path)?;
        let mut written = 0;
        if !truncate {
            let (wrote, behind, complete) = self.backfill_unlocked(&mut barrier)?;
            written += wrote;
            if complete {
                // The whole WAL is in the database file and nothing landed since: with our
                // read moved once more (onto SQLite's read mark 0 if still so), the restart
                // needs no barrier, only a moment of the write lock for our own write.
                written += self.leapfrog(&mut barrier)?;
                self.checkpointed(false);
                barrier.busy_timeout(Duration::from_millis(10))?;
                written += self.own_segments(|d| d.restart_wal(&barrier, shrink))?;
                return Ok(written);
            }
            // A writer that outran every pass would hold the barrier for its whole backlog:
            // leave the WAL to grow until a later tick, unless it must be bounded now.
            let bound = u64::from(self.settings.truncate_page_n / 2);
            if behind > BARRIER_MAX_FRAMES && self.wal_pages() < bound {
                tracing::debug!(db = %self.path.display(), behind, "checkpoint deferred: the writer outran the copy");
                return Ok(written);
            }
            if behind > BACKFILL_SETTLED_FRAMES {
                // The checkpoint under the barrier syncs the WAL and the database file: sync
                // both now, unlocked, so that those syncs find little left to write. Likewise
                // seal now, leaving the barrier's seal only what is committed from here on.
                self.sync_wal_and_db()?;
                written += self.seal()?;
            }
        }
        // Politely while the WAL is small: a busy write lock skips this checkpoint until a
        // later tick, without holding up the monitor. Insistently past a quarter of the
        // TRUNCATE threshold, so that a writer that never pauses gets one short stall of a
        // PASSIVE checkpoint instead of a TRUNCATE's long one followed by a full segment.
        // The WAL as it is now, after the passes, which a fast writer can grow past the
        // quarter (a polite barrier then fails, and the next tick meets the TRUNCATE
        // threshold); the size at entry still counts if the WAL restarted under a pass.
        if self.wal_pages().max(pages) >= self.insist_pages() {
            barrier.busy_handler(Some(barrier_busy))?;
        } else {
            barrier.busy_timeout(Duration::from_millis(10))?;
        }
        // The barrier: holding SQLite's write lock, no commit can land between the seal and
        // the checkpoint, so every frame the checkpoint moves is already in a segment.
        if let Err(e) = barrier.execute_batch("BEGIN IMMEDIATE") {
            tracing::debug!(db = %self.path.display(), error = %e, "checkpoint skipped: write lock busy");
            return Ok(written);
        }
        let locked = Instant::now();
        let mut released = false;
        let was_continuous = self.continuous;
        #[cfg(test)]
        let mut before_truncate = self.hooks.before_truncate.take();
        let sealed = (|| {
            written += self.seal()?;
            let seal_ms = locked.elapsed().as_millis();
            // Commits may land between our unlock and the TRUNCATE, which moves them into the
            // database file, out of every WAL frame we will see: until a full segment is
            // written, the next sync decides from scratch (when writing it failed, the chain
            // went on from the old mark without them).
            if truncate {
                self.continuous = false;
            }
            let conn = self.end_read()?;
            released = true;
            let mode = if truncate { "TRUNCATE" } else { "PASSIVE" };
            // TRUNCATE needs the write lock itself: give it up first (the WAL is synced).
            if truncate {
                barrier.execute_batch("ROLLBACK")?;
                #[cfg(test)]
                if let Some(hook) = before_truncate.as_mut() {
                    hook();
                }
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
        if truncated && self.wal_generation_is_the_marks() {
            // A reader kept the TRUNCATE from resetting the WAL. The frames committed around
            // it are still in the WAL, but the TRUNCATE may have copied them all into the
            // database file, and then, with our read on SQLite's read mark 0, the next write
            // may restart the WAL over them. So they are sealed now, under the write lock,
            // and the generation checked again there: a chain that covers the whole WAL goes
            // on from it. A full segment here copied the whole database at every tick the
            // reader stayed. Without the lock, or with a restart already, it is written.
            if let Some(sealed) = self.seal_after_blocked_truncate(&barrier, was_continuous)? {
                written += sealed;
                self.blocked_truncate();
                return Ok(written);
            }
        }
        self.checkpointed(truncated);
        if truncated {
            self.wal_oversized = false;
            self.shrink_tried = None;
            // Commits may have landed between the unlock and the truncate: they are in the
            // database file now, not in any WAL frame we saw. Only a full segment is safe
            // (written by the next sync if not here: `continuous` is off until it is).
            let f = File::open(&self.wal_path).ok();
            let h = match &f {
                Some(f) => read_wal_header(f)?,
                None => None,
            };
            written += self.own_segments(|d| {
                d.write_full(f.as_ref(), h, "checkpoint boundary after TRUNCATE")
                    .map(usize::from)
            })?;
            // The full segment is not new application data.
            self.dirty_since_checkpoint = false;
        } else if complete {
            written += self.own_segments(|d| d.restart_wal(&barrier, shrink))?;
        }
        Ok(written)
    }

    /// The WAL at the path still holds the generation of the mark (its salts): it was
    /// neither reset nor restarted since the mark was taken.
    fn wal_generation_is_the_marks(&self) -> bool {
        let Some(mark) = self.mark else {
            return false;
        };
        let header = File::open(&self.wal_path)
            .ok()
            .and_then(|f| read_wal_header(&f).ok().flatten());
        header.is_some_and(|h| (h.salt1, h.salt2) == (mark.salt1, mark.salt2))
    }

    /// After a TRUNCATE a reader kept from resetting the WAL: under the write lock again,
    /// seals every frame since the mark if the WAL still holds the mark's generation, going
    /// on from the mark (`continuous` as it was before the TRUNCATE: a seal from scratch
    /// would read the whole database under the lock). `None`: the lock was busy or the WAL
    /// restarted meanwhile (a full segment is owed, `continuous` stays off).
    fn seal_after_blocked_truncate(
        &mut self,
        barrier: &Connection,
        was_continuous: bool,
    ) -> Result<Option<usize>, DbError> {
        if barrier.execute_batch("BEGIN IMMEDIATE").is_err() {
            return Ok(None);
        }
        let locked = Instant::now();
        let sealed = if self.wal_generation_is_the_marks() {
            self.continuous = was_continuous;
            let sealed = self.seal();
            if sealed.is_err() {
                // A seal cut short may leave the mark before those commits: decide afresh.
                self.continuous = false;
            }
            sealed.map(Some)
        } else {
            Ok(None)
        };
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        self.count_write_lock(locked);
        sealed
    }

    /// A TRUNCATE checkpoint a reader kept from resetting the WAL: counted, and said once
    /// per streak (the WAL grows past `truncate-page-n` until the reader ends; PASSIVE
    /// checkpoints between the tries keep copying what they can into the database file).
    fn blocked_truncate(&mut self) {
        self.stats.truncate_blocked.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let since = self.truncate_blocked.map(|(since, _)| since);
        self.truncate_blocked = Some((since.unwrap_or(now), now));
        if since.is_none() {
            tracing::warn!(db = %self.path.display(), wal_pages = self.wal_pages(),
                "a TRUNCATE checkpoint could not reset the WAL: a read transaction of another \
                 connection holds it; the WAL grows until that reader ends (replication goes on)");
        }
    }

    /// Ends a streak of blocked TRUNCATEs once the WAL really reset or restarted (the reader
    /// is gone), and says so.
    fn wal_reset_again(&mut self) {
        if let Some((since, _)) = self.truncate_blocked.take() {
            tracing::info!(db = %self.path.display(), blocked_for = ?since.elapsed(),
                "the WAL was reset again after TRUNCATE checkpoints a reader had blocked");
        }
    }

    /// Counts a checkpoint that ran to the end of the WAL or that truncated it.
    fn checkpointed(&mut self, truncated: bool) {
        if truncated {
            self.wal_reset_again();
        }
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        if truncated {
            self.stats
                .truncate_checkpoints
                .fetch_add(1, Ordering::Relaxed);
        }
        self.last_checkpoint = Instant::now();
        self.dirty_since_checkpoint = false;
    }

    /// After a complete checkpoint, restarts the WAL with our own small write, so the file
    /// shrinks back to one frame (journal_size_limit=0, when `shrink`) and the idle fast path
    /// applies again. A busy write lock is no error: the whole WAL is in the database file
    /// and sealed, so the writer that holds the lock restarts the WAL itself.
    /// Runs `write`, a step of the checkpoint that writes segments of its own (the restart
    /// write, the full segment after a TRUNCATE), and counts them in `checkpoint_segments`.
    /// The seals before it count as the application's: they carry its commits.
    fn own_segments(
        &mut self,
        write: impl FnOnce(&mut Self) -> Result<usize, DbError>,
    ) -> Result<usize, DbError> {
        let n = write(self)?;
        self.checkpoint_segments += n;
        Ok(n)
    }

    fn restart_wal(&mut self, barrier: &Connection, shrink: bool) -> Result<usize, DbError> {
        let restarting = Instant::now();
        // The generation our seal ended in: a WAL that shows another one after our write was
        // restarted (by our write, or by the application's commit just before it).
        let before = self.mark_salts();
        let limit = if shrink { 0 } else { -1 };
        barrier.execute_batch(&format!("PRAGMA journal_size_limit={limit}"))?;
        let wrote = barrier.execute_batch(
            "BEGIN IMMEDIATE; \
             CREATE TABLE IF NOT EXISTS _replicad_seq (id INTEGER PRIMARY KEY, seq INTEGER); \
             INSERT INTO _replicad_seq (id, seq) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET seq = seq + 1; \
             COMMIT;",
        );
        if !barrier.is_autocommit() {
            barrier.execute_batch("ROLLBACK")?;
        }
        match wrote {
            Ok(()) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy =>
            {
                tracing::debug!(db = %self.path.display(), "WAL restart left to the writer: write lock busy");
                self.wal_oversized = true;
                return Ok(0);
            }
            Err(e) => return Err(e.into()),
        }
        // The seal of our write moves the mark into the generation that holds it.
        let (wrote, _) = self.sync_once()?;
        if self.mark_salts() == before {
            // Not restarted: a reader (the application's, or ours begun on a slot past 0
            // because a commit landed first) still needed the WAL; our write only added a
            // frame. The WAL stays long and is shrunk once quiet (a shrink that fails this
            // way is retried only after `checkpoint-interval`: `Db::sync_inner` paces it).
            tracing::debug!(db = %self.path.display(), "WAL not restarted by our write: a reader still uses it");
            self.wal_oversized = true;
            self.dirty_since_checkpoint = false;
            return Ok(usize::from(wrote));
        }
        tracing::debug!(db = %self.path.display(), shrink, restart_ms = restarting.elapsed().as_millis(), "WAL restarted");
        self.wal_reset_again();
        // Our own restart write is not new application data.
        self.dirty_since_checkpoint = false;
        self.wal_oversized = !shrink;
        // Restarted: no reader holds the WAL now, so a shrink may follow once it is quiet.
        self.shrink_tried = None;
        Ok(usize::from(wrote))
    }

    /// Moves our read transaction to the end of the WAL without SQLite's write lock: `spare`
    /// begins its read before ours ends, so one of our readers holds a read mark at every
    /// moment (no restart can happen, and no checkpoint copies past the older mark), and the
    /// seal in between puts every frame up to the newer mark into a segment first. `spare`
    /// then becomes the pinned connection and the old one, its read ended, the spare.
    pub(super) fn leapfrog(&mut self, spare: &mut Connection) -> Result<usize, DbError> {
        if let Err(e) = begin_read(spare) {
            let _ = spare.execute_batch("ROLLBACK");
            return Err(e);
        }
        let written = match self.seal() {
            Ok(w) => w,
            Err(e) => {
                // Ours still holds its read: nothing moved.
                let _ = spare.execute_batch("ROLLBACK");
                return Err(e);
            }
        };
        let Conn::Open(open) = &mut self.conn else {
            let _ = spare.execute_batch("ROLLBACK");
            return Err(DbError::Unsupported("database not open".into()));
        };
        std::mem::swap(&mut open.conn, spare);
        // The pinned connection's own busy timeout (the spare's may be the barrier's).
        open.conn.busy_timeout(PINNED_BUSY_TIMEOUT)?;
        // The old reader's end; if it fails, dropping the connection ends it as well.
        spare.execute_batch("COMMIT")?;
        Ok(written)
    }

    /// The first phase of a PASSIVE checkpoint, so that the application waits on the barrier
    /// only for the frames it commits during the last pass, not for a whole interval's: each
    /// pass moves our read mark to the end of the sealed WAL ([`Db::leapfrog`], no lock),
    /// then an unlocked PASSIVE checkpoint copies those frames into the database file while
    /// the application keeps committing. It stops at our read mark, and the WAL cannot
    /// restart while we read, so no frame is lost (invariants 2 and 3).
    ///
    /// Unlocked work around the copy keeps the barrier short: after a large copy, a sync of
    /// the database file (SQLite syncs it only when a copy reaches the end of the WAL); after
    /// every copy, a seal of what landed meanwhile.
    ///
    /// No pass begins after [`NEAR_TRUNCATE_PASSES`] once the WAL holds half of
    /// `truncate-page-n`, nor after the first once it holds all of it (judged at each pass).
    ///
    /// Returns segments written and the frames the application committed during the last
    /// pass's copy; 0 with a complete last copy means the whole WAL was in the database file.
    pub(super) fn backfill_unlocked(
        &mut self,
        spare: &mut Connection,
    ) -> Result<(usize, u64, bool), DbError> {
        let mut written = 0;
        // Where the previous pass left our read mark, in frames.
        let mut read_mark = 0;
        let mut last_behind = u64::MAX;
        let start_gen = self.mark_salts();
        for pass in 0..BACKFILL_PASSES {
            // Near the TRUNCATE threshold the barrier comes sooner, and past it at once:
            // passes do not shrink the WAL, and a fast writer grows it during each of them.
            let wal = self.wal_pages();
            let limit = u64::from(self.settings.truncate_page_n);
            if (pass >= NEAR_TRUNCATE_PASSES && wal >= limit / 2) || (pass >= 1 && wal >= limit) {
                return Ok((written, last_behind, false));
            }
            // Moving the mark hands a large backlog to whichever checkpoint comes next;
            // holding the checkpoint lock across the move makes it ours, not the
            // application's auto-checkpoint (which would copy it inside one of its commits).
            // Not for a small one: the lock also turns away the application's own FULL,
            // RESTART or TRUNCATE checkpoint at once (SQLite takes it without waiting).
            let exposed = self.wal_pages().saturating_sub(read_mark);
            let held = exposed >= PASS_EXTRA_MIN_FRAMES
                && self
                    .shm
                    .as_ref()
                    .is_some_and(ShmProbe::hold_checkpoint_lock);
            let copying = Instant::now();
            let copy = self.leapfrog(spare).and_then(|w| {
                let r: (i64, i64, i64) =
                    spare.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })?;
                Ok((w, r))
            });
            if held && let Some(p) = &self.shm {
                p.release_checkpoint_lock();
            }
            let (wrote, (_, log, done)) = copy?;
            written += wrote;
            let copy_ms = copying.elapsed().as_millis();
            let copied = self.wal_pages().saturating_sub(read_mark);
            read_mark += copied;
            // SQLite syncs the database file only when a checkpoint's copy ends at the end of
            // the WAL, which a pass beside a busy writer never does: every pass's pages would
            // stay dirty until the barrier's checkpoint wrote them all back under the lock.
            if copied >= PASS_EXTRA_MIN_FRAMES {
                self.sync_db()?;
            }
            // What the application committed meanwhile, sealed now, unlocked. (The
            // checkpoint's own figures are from its start; the file's length says nothing
            // once the WAL is reused in place.)
            let sealed_to = self.mark.map_or(0, |m| m.offset);
            written += self.seal()?;
            let behind =
                self.mark.map_or(0, |m| m.offset).saturating_sub(sealed_to) / self.frame_size();
            let complete = log >= 0 && log == done;
            tracing::debug!(db = %self.path.display(), pass, log, done, behind, copied, copy_ms, "backfill pass");
            if self.mark_salts() != start_gen {
                // The WAL restarted under a pass (our read was on SQLite's read mark 0):
                // offsets of two generations say nothing about what is left.
                return Ok((written, 0, false));
            }
            if behind == 0 && complete {
                return Ok((written, 0, true));
            }
            // Settled, or the writer outpaces the copy: the barrier takes what is left.
            if behind <= BACKFILL_SETTLED_FRAMES || (pass >= 8 && behind >= last_behind) {
                return Ok((written, behind, false));
            }
            last_behind = behind;
        }
        Ok((written, last_behind, false))
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
        self.staging_pruner()(acknowledged)
    }

    /// [`Db::prune_staging`] as a job that owns what it needs, for the blocking pool (staging
    /// on a network file system that may hang).
    pub fn staging_pruner(
        &self,
    ) -> impl FnOnce(TxId) -> Result<usize, DbError> + Send + 'static + use<> {
        let (staging, dir, stats) = (
            self.staging.clone(),
            self.staging_dir.clone(),
            self.stats.clone(),
        );
        move |acknowledged| {
            let Some(s) = staging else { return Ok(0) };
            let removed = s
                .prune_below(TxId(acknowledged.0 + 1))
                .map_err(io_err("prune", &dir))?;
            if removed > 0 {
                let bytes = s.total_bytes().map_err(io_err("stat", &dir))?;
                stats.staging_bytes.store(bytes, Ordering::Relaxed);
            }
            Ok(removed)
        }
    }
}
