//! Streaming k-way merge of LTX files into one (Litestream's `ltx.Compactor`).
//!
//! [`compact`] reads every input front to back at the same time and writes the merged file in
//! one pass: at each step it takes the lowest page number among the inputs' current pages,
//! emits the copy from the latest input holding it, drops the older copies, and drops every
//! page past the output's `commit` (the database shrank). Pages whose stored payload is a
//! block of the output codec are copied without recompressing.
//!
//! Output header (as upstream, see the research brief §1.12-1.13): min TXID = first input's
//! (or [`CompactOptions::min_txid`]), max TXID, commit and timestamp = last input's, WAL
//! fields and node ID 0. Database checksums are kept only if every input carries them:
//! pre-apply = first input's (0 for a snapshot), post-apply = last input's; otherwise the
//! output is `NoChecksum` with both 0.
//!
//! Memory: per input, one page buffer plus its decoder's read buffer, payload buffer and
//! expected page index (a few bytes per page); never a whole database.
//!
//! Invariants:
//! - The output is written completely (end marker, index, trailer) only after every input's
//!   `finish` has verified its file checksum, page index and trailer. On any error the
//!   writer holds an unfinished file: callers write to a temporary file (`<name>.tmp`, see
//!   [`crate::util::fsutil::tmp_path`]), delete it on `Err`, and publish it with
//!   [`crate::util::fsutil::publish`] only on `Ok`.
//! - An output starting at TXID 1 is a snapshot: it holds every page `1..=commit` but the
//!   lock page, or compaction fails with [`CompactError::NotFullSnapshot`].
//!
//! The function is blocking; async callers run it under `spawn_blocking` with
//! `tokio_util::io::SyncIoBridge` readers and writer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};

use crate::ltx::{
    Codec, Decoder, Encoder, HEADER_FLAG_CODEC_MASK, HEADER_FLAG_NO_CHECKSUM, Header, LtxError,
    Trailer, TxId, lock_pgno,
};

/// Options of one compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactOptions {
    /// Codec of the output pages. Input pages already stored as blocks of this codec are
    /// copied as they are (for zstd and gzip whatever level they were written at).
    pub codec: Codec,
    /// Output min TXID override: `Some(TxId(1))` turns the output into a snapshot when the
    /// inputs start from a full database state (a full L0 file at a TXID > 1). Only 1 or the
    /// first input's min TXID are accepted. `None`: the first input's min TXID.
    pub min_txid: Option<TxId>,
    /// Output timestamp (ms since the Unix epoch). `None`: the last input's, as Litestream.
    pub timestamp: Option<i64>,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            codec: Codec::Lz4,
            min_txid: None,
            timestamp: None,
        }
    }
}

/// What a compaction wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactSummary {
    /// The output header as written (codec bits included).
    pub header: Header,
    /// The output trailer.
    pub trailer: Trailer,
    /// Pages written.
    pub pages: u32,
    /// Pages that had to be decompressed and compressed again (a different codec, or a
    /// legacy LZ4-frame page); the others were copied as stored.
    pub recompressed_pages: u32,
    /// Bytes written to the output, trailer included.
    pub bytes_written: u64,
}

/// Why a compaction failed. The output written so far is unfinished and must be discarded.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    /// No input was given.
    #[error("compaction needs at least one input file")]
    NoInputs,
    /// An input's pages are not the size of the first input's.
    #[error(
        "input {index} (TXIDs {min_txid}-{max_txid}) has {found}-byte pages, the first input \
         {expected}-byte pages (files from another database?)"
    )]
    PageSize {
        /// Position of the input.
        index: usize,
        /// Its min TXID.
        min_txid: TxId,
        /// Its max TXID.
        max_txid: TxId,
        /// The first input's page size.
        expected: u32,
        /// This input's page size.
        found: u32,
    },
    /// Two consecutive inputs leave TXIDs uncovered.
    #[error(
        "inputs are not contiguous: one ends at TXID {after}, the next starts at {next_min}, \
         so TXIDs {} to {} are missing",
        TxId(.after.0.saturating_add(1)),
        TxId(.next_min.0.saturating_sub(1))
    )]
    Gap {
        /// Max TXID of the earlier input.
        after: TxId,
        /// Min TXID of the next input.
        next_min: TxId,
    },
    /// An input does not reach past the one before it (inputs unsorted or duplicated).
    #[error(
        "input {index} (TXIDs {min_txid}-{max_txid}) does not reach past the previous input, \
         which ends at {prev_max} (inputs must be sorted by TXID)"
    )]
    NotAscending {
        /// Position of the input.
        index: usize,
        /// Its min TXID.
        min_txid: TxId,
        /// Its max TXID.
        max_txid: TxId,
        /// Max TXID of the input before it.
        prev_max: TxId,
    },
    /// An input decoder had already handed out pages, which the merge would miss.
    #[error("input {index} was already partly read ({pages} pages); pass fresh decoders")]
    AlreadyRead {
        /// Position of the input.
        index: usize,
        /// Pages read before compaction.
        pages: u32,
    },
    /// The min TXID override is neither 1 nor the first input's min TXID.
    #[error(
        "output min TXID {requested} is invalid: only 0000000000000001 (a snapshot) or the \
         first input's {first_min} are allowed"
    )]
    InvalidMinTxId {
        /// The override.
        requested: TxId,
        /// The first input's min TXID.
        first_min: TxId,
    },
    /// The output is a snapshot but the inputs do not hold every page.
    #[error(
        "the output would be a snapshot (min TXID 1) but page {missing} of {commit} is in no \
         input: the inputs do not start from a full database state"
    )]
    NotFullSnapshot {
        /// First page no input holds.
        missing: u32,
        /// The output's commit (database size in pages).
        commit: u32,
    },
    /// An input is corrupt, invalid or unreadable.
    #[error("input {index} (TXIDs {min_txid}-{max_txid}): {source}")]
    Ltx {
        /// Position of the input.
        index: usize,
        /// Its min TXID.
        min_txid: TxId,
        /// Its max TXID.
        max_txid: TxId,
        /// The decoder's error.
        #[source]
        source: LtxError,
    },
    /// Encoding or writing the output failed.
    #[error("writing the compacted file: {0}")]
    Output(#[source] LtxError),
}

/// Merges `inputs` (sorted by TXID, contiguous: each next min <= previous max + 1 and next
/// max > previous max; overlap allowed) into one LTX file written to `out`. See the module
/// documentation for the rules and for what to do with `out` on error.
pub fn compact<R: Read, W: Write>(
    inputs: Vec<Decoder<R>>,
    out: W,
    opts: CompactOptions,
) -> Result<CompactSummary, CompactError> {
    let header = output_header(&inputs, &opts)?;
    let mut enc = Encoder::new(CountingWriter { inner: out, n: 0 }, header, opts.codec)
        .map_err(CompactError::Output)?;
    let header = *enc.header();
    let out_codec_bits = header.flags & HEADER_FLAG_CODEC_MASK;
    let page_size = header.page_size as usize;

    let mut inputs: Vec<Input<R>> = inputs
        .into_iter()
        .enumerate()
        .map(|(index, dec)| {
            let h = *dec.header();
            Input {
                index,
                min_txid: h.min_txid,
                max_txid: h.max_txid,
                pass_through: h.flags & HEADER_FLAG_CODEC_MASK == out_codec_bits,
                buf: vec![0u8; page_size],
                dec,
            }
        })
        .collect();

    // Min-heap of input heads by (pgno, latest input first).
    let mut heads: BinaryHeap<Reverse<(u32, Reverse<usize>)>> =
        BinaryHeap::with_capacity(inputs.len());
    for input in &mut inputs {
        input.advance(&mut heads)?;
    }

    let lock = lock_pgno(header.page_size);
    // Next page a snapshot must hold (u64: the page after u32::MAX does not overflow).
    let next_pgno = |p: u32| {
        let n = u64::from(p) + 1;
        if n == u64::from(lock) { n + 1 } else { n }
    };
    let mut expected = header.is_snapshot().then_some(1u64);
    let (mut pages, mut recompressed_pages) = (0u32, 0u32);
    while let Some(Reverse((pgno, Reverse(winner)))) = heads.pop() {
        if pgno > header.commit {
            // Pages ascend in every input, so every remaining head is past commit too; the
            // inputs' `finish` reads (and verifies) what is left.
            break;
        }
        if let Some(want) = expected {
            if u64::from(pgno) != want {
                return Err(CompactError::NotFullSnapshot {
                    missing: want as u32,
                    commit: header.commit,
                });
            }
            expected = Some(next_pgno(pgno));
        }
        let input = &inputs[winner];
        let stored = input.dec.last_compressed().filter(|_| input.pass_through);
        match stored {
            Some(payload) => enc.encode_compressed_page(pgno, payload, &input.buf),
            None => {
                recompressed_pages += 1;
                enc.encode_page(pgno, &input.buf)
            }
        }
        .map_err(CompactError::Output)?;
        pages += 1;
        inputs[winner].advance(&mut heads)?;
        // Older copies of the same page are dropped.
        while let Some(&Reverse((p, Reverse(older)))) = heads.peek() {
            if p != pgno {
                break;
            }
            heads.pop();
            inputs[older].advance(&mut heads)?;
        }
    }
    if let Some(want) = expected.filter(|&w| w <= u64::from(header.commit)) {
        return Err(CompactError::NotFullSnapshot {
            missing: want as u32,
            commit: header.commit,
        });
    }

    // Verify every input before the output gets its trailer.
    let mut last_trailer = Trailer::default();
    for input in inputs {
        let (index, min_txid, max_txid) = (input.index, input.min_txid, input.max_txid);
        last_trailer = input.dec.finish().map_err(|source| CompactError::Ltx {
            index,
            min_txid,
            max_txid,
            source,
        })?;
    }
    let post_apply = if header.has_checksums() {
        last_trailer.post_apply_checksum
    } else {
        0
    };
    let (mut w, trailer) = enc.finish(post_apply).map_err(CompactError::Output)?;
    w.flush()
        .map_err(|e| CompactError::Output(LtxError::Io(e)))?;
    Ok(CompactSummary {
        header,
        trailer,
        pages,
        recompressed_pages,
        bytes_written: w.n,
    })
}

/// Checks the inputs against each other and builds the output header.
fn output_header<R: Read>(
    inputs: &[Decoder<R>],
    opts: &CompactOptions,
) -> Result<Header, CompactError> {
    let (Some(first), Some(last)) = (inputs.first(), inputs.last()) else {
        return Err(CompactError::NoInputs);
    };
    let (first, last) = (*first.header(), *last.header());
    for (index, dec) in inputs.iter().enumerate() {
        if dec.page_count() != 0 {
            return Err(CompactError::AlreadyRead {
                index,
                pages: dec.page_count(),
            });
        }
        let h = dec.header();
        if h.page_size != first.page_size {
            return Err(CompactError::PageSize {
                index,
                min_txid: h.min_txid,
                max_txid: h.max_txid,
                expected: first.page_size,
                found: h.page_size,
            });
        }
        if index == 0 {
            continue;
        }
        let prev = inputs[index - 1].header();
        if h.max_txid <= prev.max_txid {
            return Err(CompactError::NotAscending {
                index,
                min_txid: h.min_txid,
                max_txid: h.max_txid,
                prev_max: prev.max_txid,
            });
        }
        if h.min_txid.0 > prev.max_txid.0.saturating_add(1) {
            return Err(CompactError::Gap {
                after: prev.max_txid,
                next_min: h.min_txid,
            });
        }
    }
    let min_txid = match opts.min_txid {
        None => first.min_txid,
        Some(t) if t == TxId(1) || t == first.min_txid => t,
        Some(requested) => {
            return Err(CompactError::InvalidMinTxId {
                requested,
                first_min: first.min_txid,
            });
        }
    };
    let checksums = inputs.iter().all(|d| d.header().has_checksums());
    Ok(Header {
        flags: if checksums {
            0
        } else {
            HEADER_FLAG_NO_CHECKSUM
        },
        page_size: first.page_size,
        commit: last.commit,
        min_txid,
        max_txid: last.max_txid,
        timestamp: opts.timestamp.unwrap_or(last.timestamp),
        pre_apply_checksum: if checksums && min_txid != TxId(1) {
            first.pre_apply_checksum
        } else {
            0
        },
        ..Header::default()
    })
}

/// One input of the merge: its decoder and its current page (the last one the decoder
/// returned, whose stored payload the decoder still holds).
struct Input<R: Read> {
    index: usize,
    min_txid: TxId,
    max_txid: TxId,
    /// The input's pages are blocks of the output codec when block-encoded.
    pass_through: bool,
    buf: Vec<u8>,
    dec: Decoder<R>,
}

impl<R: Read> Input<R> {
    /// Reads the next page into `buf` and queues it, if there is one.
    fn advance(
        &mut self,
        heads: &mut BinaryHeap<Reverse<(u32, Reverse<usize>)>>,
    ) -> Result<(), CompactError> {
        match self.dec.next_page(&mut self.buf) {
            Ok(Some(pgno)) => {
                heads.push(Reverse((pgno, Reverse(self.index))));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(source) => Err(CompactError::Ltx {
                index: self.index,
                min_txid: self.min_txid,
                max_txid: self.max_txid,
                source,
            }),
        }
    }
}

/// Counts the bytes written through it.
struct CountingWriter<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
