//! Yielding to an application's own checkpoint.
//!
//! An application's `PRAGMA wal_checkpoint(FULL|RESTART|TRUNCATE)` takes SQLite's checkpoint
//! and write locks, then waits in its busy handler for every reader behind the WAL's end
//! (FULL), and after copying for every reader at all (RESTART, TRUNCATE). Our read
//! transaction, held at all times (invariant 3 of the parent module), is such a reader: left
//! alone, the application waits out its whole busy timeout and gets `SQLITE_BUSY`.
//!
//! So each tick of an open database asks the kernel who holds those locks: one `F_GETLK` on
//! the checkpoint lock's byte of the `-shm` file, and more only when another process holds
//! it: the write lock held by the same process, both still held 2 ms later (a blocking
//! checkpoint holds them for its whole wait; a PASSIVE checkpoint beside another
//! connection's commit holds them together only by chance). Then the Db:
//! 1. seals every committed frame (nothing can commit while the checkpoint holds the write
//!    lock, so the seal reaches the WAL's end) and reads the wal-index header from the
//!    `-shm` file: its change counter and frame count. A frame count past the seal means the
//!    write lock is a writer's (the checkpoint is still waiting for it): no yield this tick;
//! 2. ends its read transaction and waits, polling the locks every millisecond for at most
//!    [`YIELD_WAIT`], until the checkpoint is over;
//! 3. begins its read transaction again and proves that no frame past its mark was lost
//!    before it takes a later WAL generation as following the mark (until then
//!    `after_yield` is set and `sync_once` does not apply its salt-1 + 1 rule):
//!    - by the wal-index header, at no cost (until a seal reaches the frames it counted, when
//!      the current generation is not the mark's: `yield_seal_to`): SQLite adds one to its change counter at each
//!      commit (`sqlite3WalFrames`), never at a restart. Nothing past the mark was lost if
//!      the counter moved by exactly the commits now in the WAL's current generation (none
//!      when it is still the mark's);
//!    - else, once the WAL shows another generation (or none), by the database file: if its
//!      checksum is our post-apply checksum with the same page count, it holds exactly the
//!      state at our position, and every frame of the current generation applies on top of
//!      it;
//!    - else, and always with the `lz4` codec (it keeps no checksums), the next segment is a
//!      full one (invariant 1).
//!
//! Known limit of the index proof: SQLite's recovery of the index (after an application
//! crashed in the middle of writing it) restarts the change counter from zero; a counter
//! that by chance came back to exactly the expected value would pass. A zero counter is
//! refused, which covers a recovery with no commit since.
//!
//! The probe ([`super::shm`]) reads the lock state and the index header; it takes no lock
//! here.

use super::connection::begin_read;
use super::shm::{IndexHeader, ShmProbe};
#[allow(unused_imports)]
use super::*;

/// Longest a yield waits for the application's checkpoint to end. Nothing can commit while
/// it holds the write lock, so the wait delays no replication; the bound keeps the monitor
/// responsive when the checkpoint stays blocked by a reader of the application's own.
pub(super) const YIELD_WAIT: Duration = Duration::from_secs(3);

/// Turns the wal-index proof off, so that every restart goes through the database file's
/// checksum or a full segment (tests of those paths).
pub const NO_INDEX_PROOF_ENV: &str = "REPLICAD_TEST_NO_INDEX_PROOF";

fn index_proof_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os(NO_INDEX_PROOF_ENV).is_some())
}

/// How a yield proved that nothing past our mark was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// No restart and no commit: the WAL is as the mark left it.
    SameGeneration,
    /// Restarted with no commit before it; `max_frame` frames of the generation with these
    /// salts since (0: its header may not be written yet, and its salts may be random).
    Restarted { max_frame: u32, salts: (u32, u32) },
}

impl Db {
    /// Another process's checkpoint is waiting for readers (ours among them). Blocking (it
    /// confirms after 2 ms): for syncs, off the async reactor.
    pub(super) fn checkpoint_waiting(&self) -> bool {
        self.opened().is_some() && self.shm.as_ref().is_some_and(ShmProbe::blocked)
    }

    /// Maybe a checkpoint waiting for readers (both locks held by one other process now),
    /// without the confirming wait: for the idle fast path, which runs on the async worker.
    /// The sync it hands the tick to confirms.
    pub(super) fn checkpoint_maybe_waiting(&self) -> bool {
        self.opened().is_some() && self.shm.as_ref().is_some_and(ShmProbe::both_held)
    }

    /// Steps out of an application's checkpoint's way (module doc). Returns segments written.
    pub(super) fn yield_to_checkpoint(&mut self) -> Result<usize, DbError> {
        let mut written = self.seal()?;
        // What the checkpoint holds still: our mark must be the WAL's end for the index to
        // prove anything afterwards.
        let frame = self.frame_size();
        let index = self.shm.as_ref().and_then(ShmProbe::index_header);
        let at_end = |h: &IndexHeader| match self.mark {
            Some(m) => {
                (m.salt1, m.salt2) == (h.salt1, h.salt2)
                    && m.offset == WAL_HEADER_SIZE + u64::from(h.max_frame) * frame
            }
            None => h.max_frame == 0,
        };
        // Commits still landing after the seal: the write lock is a writer's, and the
        // checkpoint (if it is one) is still waiting for it, not for us. Stay; the next tick
        // looks again. Stepping aside now would let the checkpoint move frames past our mark.
        if index.is_some_and(|h| !at_end(&h)) {
            tracing::debug!(db = %self.path.display(), "not yielding: commits still land");
            return Ok(written);
        }
        let before = index.filter(|_| !index_proof_off());
        // From here until continuity is proven, a new WAL generation is not taken as
        // following our mark.
        self.after_yield = true;
        let conn = self.end_read()?;
        let started = Instant::now();
        while started.elapsed() < YIELD_WAIT && self.shm.as_ref().is_some_and(ShmProbe::both_held) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited = started.elapsed();
        if let Err(e) = begin_read(conn) {
            self.reopen_after_lost_read();
            return Err(e);
        }
        self.stats.checkpoint_yields.fetch_add(1, Ordering::Relaxed);
        if waited >= YIELD_WAIT {
            self.stats.yield_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        let after = self.shm.as_ref().and_then(ShmProbe::index_header);
        let proof = match (before, after) {
            (Some(b), Some(a)) => self.nothing_lost(b, a)?,
            _ => None,
        };
        match proof {
            Some(Proof::SameGeneration) => {}
            // The current generation starts right after the mark's end.
            Some(Proof::Restarted { max_frame: 0, .. }) => self.next_gen_follows = true,
            // The current generation follows the mark, but our reader may be SQLite's read
            // mark 0 on it (wholly checkpointed meanwhile), which lets the next writer
            // restart it: it counts as sealed only once the seal has reached its last
            // counted frame (until then a restart still goes through the file's proof).
            Some(Proof::Restarted { max_frame, salts }) => {
                self.next_gen_follows = false;
                self.mark = Some(WalMark {
                    salt1: salts.0,
                    salt2: salts.1,
                    offset: WAL_HEADER_SIZE,
                });
                let frame = self.frame_size();
                self.yield_seal_to = Some(WAL_HEADER_SIZE + u64::from(max_frame) * frame);
            }
            None => {}
        }
        let proven = proof.is_some();
        if proven && self.yield_seal_to.is_none() {
            self.after_yield = false;
        }
        if proven {
            self.stats
                .yield_index_proofs
                .fetch_add(1, Ordering::Relaxed);
        }
        written += self.seal()?;
        tracing::debug!(db = %self.path.display(), waited_ms = waited.as_millis(), proven, ?before, ?after, txid = %self.pos, "yielded to an application checkpoint");
        Ok(written)
    }

    /// Whether the index headers read before and after a yield prove that nothing was
    /// committed past our mark in the generation we knew (module doc), and how.
    ///
    /// The counter moves at each commit only. A commit past our mark in the generation we
    /// knew, or in any generation between it and the current one, moves it beyond the
    /// commits of the current generation, which is all it may have moved by. (New salts
    /// come from a restart, salt-1 plus one, or are random when a connection that never
    /// restarted the WAL writes its first frame after a TRUNCATE.)
    fn nothing_lost(
        &self,
        before: IndexHeader,
        after: IndexHeader,
    ) -> Result<Option<Proof>, DbError> {
        // A recovered index counts from 0 again: never take such a header as proof.
        if before.change == 0 || after.change == 0 {
            return Ok(None);
        }
        let moved = after.change.wrapping_sub(before.change);
        if (after.salt1, after.salt2) == (before.salt1, before.salt2) {
            return Ok((moved == 0).then_some(Proof::SameGeneration));
        }
        let restarted = Proof::Restarted {
            max_frame: after.max_frame,
            salts: (after.salt1, after.salt2),
        };
        if after.max_frame == 0 {
            return Ok((moved == 0).then_some(restarted));
        }
        // Restarted and commits since: count the commits of the current generation up to
        // the index's last frame (a restart during the count ends it early: no proof).
        let Ok(f) = File::open(&self.wal_path) else {
            return Ok(None);
        };
        let frame = self.frame_size();
        let end = WAL_HEADER_SIZE + u64::from(after.max_frame) * frame;
        // One scan up to the index's last frame, a commit boundary: it stops right there.
        let counted = match wal::scan(&f, WAL_HEADER_SIZE, end - WAL_HEADER_SIZE) {
            Ok(Some(s)) if (s.header.salt1, s.header.salt2) == (after.salt1, after.salt2) => s,
            _ => return Ok(None),
        };
        Ok((counted.end_offset == end && moved == counted.commits).then_some(restarted))
    }

    /// After a yield, the WAL is of another generation than our mark (or gone): continue on
    /// it only if the database file holds exactly the state at our position, else write a
    /// full segment. Returns whether a segment was written.
    pub(super) fn rebase_after_yield(
        &mut self,
        wal_file: Option<&File>,
        header: Option<WalHeader>,
    ) -> Result<bool, DbError> {
        if self.checksums && self.post != 0 {
            let commit = self.commit;
            // Replaces the table with the file's; on a mismatch the full segment below
            // rebuilds it.
            self.build_table(None)?;
            if self.sum.value() == self.post && self.current_commit(None)? == commit {
                self.mark = header.map(|h| WalMark {
                    salt1: h.salt1,
                    salt2: h.salt2,
                    offset: WAL_HEADER_SIZE,
                });
                self.after_yield = false;
                self.yield_seal_to = None;
                self.next_gen_follows = false;
                self.stats.yield_rebases.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(db = %self.path.display(), txid = %self.pos, "WAL restarted by an application checkpoint; the database file holds our position, continuing on the new WAL");
                return Ok(false);
            }
        }
        // Clears `after_yield` once written: until then a failed attempt must not let the
        // next sync take the new generation as following our mark.
        self.write_full(
            wal_file,
            header,
            "wal restarted by an application checkpoint",
        )
    }
}
