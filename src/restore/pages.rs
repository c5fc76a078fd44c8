//! Decoding and writing a chain's pages on several threads: the apply reads each file's frames in
//! order on its own thread and decides which pages go to the output; decoder threads
//! decompress batches of them (most of a restore's CPU) and write the kept pages at their
//! offsets (copying into the page cache is most of the rest); the apply folds the decoded
//! batches back into the file checksum in the order they were read.
//!
//! Invariants:
//! - Batches come back in the order they were sent ([`Decoders::recv`]), so the file checksum
//!   ([`crate::ltx::Decoder::fold`]) sees pages in file order, as a single thread would.
//! - Which copy of a page is written is decided by the reading thread before a batch is sent
//!   (the first copy read, newest file first), so each page of the output is written by one
//!   write only and the threads' writes never overlap.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::Scope;

use crate::ltx::checksum::page_checksum;
use crate::ltx::{Frame, LtxError};
use crate::restore::output::{AlignedBuf, OutputFile};

/// Decoded bytes per batch: enough to amortize a hand-over, small enough that the batches
/// in flight stay a few MiB.
const BATCH_BYTES: usize = 256 * 1024;
/// Batches in flight per decoder thread: one being decoded, one waiting.
const PER_THREAD: usize = 2;
/// Most decoder threads (beyond this the single reading thread is the bound).
const MAX_THREADS: usize = 4;

/// A run of frames read from one file, and once decoded, their pages.
pub(super) struct Batch {
    frames: Vec<Frame>,
    len: usize,
    /// Whether each frame's page goes to the output (the newest copy of a page in range).
    keep: Vec<bool>,
    /// Each kept page's checksum, when the chain's checksum is tracked.
    sums: Vec<u64>,
    track_sum: bool,
    /// Aligned, so that runs of pages can be written around the page cache.
    pages: AlignedBuf,
    page_size: usize,
    result: Result<(), BatchError>,
}

/// Why a batch failed.
pub(super) enum BatchError {
    /// A page did not decode.
    Decode(LtxError),
    /// Writing pages to the output failed.
    Write(std::io::Error),
}

impl Batch {
    fn new() -> Batch {
        Batch {
            frames: Vec::new(),
            len: 0,
            keep: Vec::new(),
            sums: Vec::new(),
            track_sum: false,
            pages: AlignedBuf::new(0),
            page_size: 0,
            result: Ok(()),
        }
    }

    /// Empties the batch for pages of `page_size` bytes.
    pub(super) fn reset(&mut self, page_size: usize, track_sum: bool) {
        let n = (BATCH_BYTES / page_size).max(1);
        if self.page_size != page_size {
            self.pages = AlignedBuf::new(n * page_size);
            self.page_size = page_size;
        }
        self.frames.resize_with(n, Frame::default);
        self.keep.resize(n, false);
        self.sums.resize(n, 0);
        self.len = 0;
        self.track_sum = track_sum;
        self.result = Ok(());
    }

    /// The frame to read next into, or `None` when the batch is full.
    pub(super) fn next_slot(&mut self) -> Option<&mut Frame> {
        self.frames.get_mut(self.len)
    }

    /// Counts the frame last read into [`Batch::next_slot`]; `keep` says whether its page
    /// goes to the output.
    pub(super) fn push(&mut self, keep: bool) {
        self.keep[self.len] = keep;
        self.len += 1;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Each frame with its decoded page, whether it is kept and its checksum when tracked.
    pub(super) fn pages(&self) -> impl Iterator<Item = (&Frame, &[u8], bool, u64)> {
        let ps = self.page_size;
        (0..self.len).map(move |i| {
            (
                &self.frames[i],
                &self.pages[i * ps..(i + 1) * ps],
                self.keep[i],
                self.sums[i],
            )
        })
    }

    /// Decodes every frame, then writes the kept pages to `out` if given, each run of
    /// consecutive page numbers in one positional write.
    fn decode_and_write(&mut self, out: Option<&OutputFile>) {
        let ps = self.page_size;
        let decoded = (0..self.len).try_for_each(|i| {
            let page = &mut self.pages[i * ps..(i + 1) * ps];
            self.frames[i].decode(page)?;
            if self.track_sum && self.keep[i] {
                self.sums[i] = page_checksum(self.frames[i].pgno(), page);
            }
            Ok(())
        });
        self.result = decoded.map_err(BatchError::Decode).and_then(|()| {
            let Some(out) = out else { return Ok(()) };
            let mut i = 0;
            while i < self.len {
                if !self.keep[i] {
                    i += 1;
                    continue;
                }
                let first = self.frames[i].pgno();
                let mut j = i + 1;
                while j < self.len
                    && self.keep[j]
                    && self.frames[j].pgno() == first + (j - i) as u32
                {
                    j += 1;
                }
                let at = u64::from(first - 1) * ps as u64;
                out.write_all_at(&self.pages[i * ps..j * ps], at)
                    .map_err(BatchError::Write)?;
                i = j;
            }
            Ok(())
        });
    }

    /// The outcome of the decode and the writes (taken: a batch is reused).
    pub(super) fn take_result(&mut self) -> Result<(), BatchError> {
        std::mem::replace(&mut self.result, Ok(()))
    }
}

/// Decoder threads fed round-robin, each through its own pair of channels, so that receiving
/// round-robin returns batches in the order sent.
pub(super) struct Decoders {
    to: Vec<SyncSender<Batch>>,
    from: Vec<Receiver<Batch>>,
    free: Vec<Batch>,
    sent: usize,
    received: usize,
}

/// The decoder threads stopped before returning a batch (one panicked).
#[derive(Debug)]
pub(super) struct DecoderGone;

impl Decoders {
    /// Starts `threads` decoder threads (at least one, at most [`MAX_THREADS`]) in `scope`,
    /// writing the pages they keep to `out` if given; they stop when this is dropped. Fails
    /// only when the system gives not even one thread.
    pub(super) fn spawn<'scope>(
        scope: &'scope Scope<'scope, '_>,
        out: Option<&'scope OutputFile>,
        threads: usize,
    ) -> std::io::Result<Decoders> {
        let threads = threads.clamp(1, MAX_THREADS);
        let (mut to, mut from) = (Vec::new(), Vec::new());
        for i in 0..threads {
            let (job_tx, job_rx) = sync_channel::<Batch>(PER_THREAD);
            // Room for every batch in flight: a decoder never blocks on handing one back.
            let (done_tx, done_rx) = sync_channel::<Batch>(PER_THREAD);
            let started = std::thread::Builder::new()
                .name(format!("restore-decode-{i}"))
                .spawn_scoped(scope, move || {
                    while let Ok(mut batch) = job_rx.recv() {
                        // A panic stays in its batch: the restore fails with it, not the process.
                        let done = std::panic::catch_unwind(AssertUnwindSafe(|| {
                            batch.decode_and_write(out);
                        }));
                        if done.is_err() {
                            let offset = batch.frames.first().map_or(0, Frame::offset);
                            batch.result = Err(BatchError::Decode(LtxError::InvalidPage {
                                offset,
                                reason: "decoding a page panicked".into(),
                            }));
                        }
                        if done_tx.send(batch).is_err() {
                            break;
                        }
                    }
                });
            match started {
                Ok(_) => {
                    to.push(job_tx);
                    from.push(done_rx);
                }
                // Out of threads (a pids limit, say): decode on those that started.
                Err(e) if to.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(Decoders {
            to,
            from,
            free: Vec::new(),
            sent: 0,
            received: 0,
        })
    }

    /// The decoder threads that started.
    pub(super) fn threads(&self) -> usize {
        self.to.len()
    }

    /// A batch to fill, reused when one was returned.
    pub(super) fn batch(&mut self) -> Batch {
        self.free.pop().unwrap_or_else(Batch::new)
    }

    /// Returns a batch for reuse.
    pub(super) fn recycle(&mut self, batch: Batch) {
        self.free.push(batch);
    }

    /// Whether another batch can be sent without waiting.
    pub(super) fn has_room(&self) -> bool {
        self.in_flight() < self.to.len() * PER_THREAD
    }

    pub(super) fn in_flight(&self) -> usize {
        self.sent - self.received
    }

    /// Hands a filled batch to the next thread.
    pub(super) fn send(&mut self, batch: Batch) -> Result<(), DecoderGone> {
        let i = self.sent % self.to.len();
        self.to[i].send(batch).map_err(|_| DecoderGone)?;
        self.sent += 1;
        Ok(())
    }

    /// The oldest batch in flight, decoded (see [`Batch::take_result`]).
    pub(super) fn recv(&mut self) -> Result<Batch, DecoderGone> {
        let i = self.received % self.from.len();
        let batch = self.from[i].recv().map_err(|_| DecoderGone)?;
        self.received += 1;
        Ok(batch)
    }
}
