//! Reading SQLite write-ahead logs (the `-wal` file), byte-compatible with SQLite 3.7.0+.
//!
//! ```text
//! [WAL header 32 B][Frame]*
//! WAL header   = magic | version 3007000 | page size | checkpoint seq | salt-1 | salt-2
//!                | checksum-1 | checksum-2                       (big-endian u32 each)
//! frame        = [frame header 24 B][page]
//! frame header = pgno | commit (db size in pages, non-zero only on a commit frame)
//!                | salt-1 | salt-2 | checksum-1 | checksum-2      (big-endian u32 each)
//! ```
//!
//! Frame `k` (0-based) starts at `32 + k * (24 + page_size)`. The checksum is a running pair
//! (see [`wal_checksum`]) whose words are little-endian when the magic is `0x377f0682` and
//! big-endian when it is `0x377f0683`. It covers header bytes `0..24`, then for each frame
//! frame-header bytes `0..8` and the page, each frame continuing from the one before.
//!
//! This module owns only *reading*: it never writes to, locks or truncates a WAL. The caller
//! is responsible for reading a WAL that SQLite is not concurrently restarting (replicad
//! holds a read transaction while it scans).
//!
//! Invariants this module keeps:
//! - A frame counts only if its salts equal the header's salts, its page number is non-zero
//!   and its stored checksum equals the running checksum, exactly as SQLite's recovery
//!   decides. The first frame failing any of these ends the WAL; this is the normal way a
//!   WAL ends (stale frames from before a restart, a torn write) and never an error.
//! - [`scan`] reports only *committed* frames: those up to and including the last valid
//!   commit frame. [`WalScan::end_offset`] is therefore always a commit boundary, and
//!   [`WalScan::pages`] never holds a page past [`WalScan::commit`].
//! - A WAL that is too short for a header or whose header does not validate is an empty WAL
//!   (`Ok(None)`), as SQLite treats it; real I/O failures are always errors.
//! - The file is read with positional reads through one reused buffer; it is never read
//!   into memory whole and its cursor is never moved.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Size of the WAL header in bytes.
pub const WAL_HEADER_SIZE: u64 = 32;
/// Size of a frame header in bytes (the page follows it).
pub const WAL_FRAME_HEADER_SIZE: u64 = 24;
/// WAL magic whose checksums are computed over little-endian u32 words.
pub const WAL_MAGIC_LE: u32 = 0x377f_0682;
/// WAL magic whose checksums are computed over big-endian u32 words.
pub const WAL_MAGIC_BE: u32 = 0x377f_0683;
/// The only WAL format version SQLite writes and reads.
pub const WAL_VERSION: u32 = 3_007_000;

/// How many bytes [`scan`] reads per positional read (rounded to whole frames, at least one).
const SCAN_BUFFER_SIZE: usize = 1 << 20;

/// Errors reading a WAL.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An I/O error (including a short read in [`read_page`]).
    #[error("WAL I/O error: {0}")]
    Io(#[from] io::Error),
    /// The header magic is neither `0x377f0682` nor `0x377f0683`.
    #[error("bad WAL magic {0:#010x}")]
    BadMagic(u32),
    /// The header format version is not 3007000.
    #[error("unsupported WAL format version {0}")]
    BadVersion(u32),
    /// The header page size is not a power of two in 512..=65536.
    #[error("bad WAL page size {0}")]
    BadPageSize(u32),
    /// The header checksum does not match header bytes 0..24.
    #[error("WAL header checksum mismatch")]
    HeaderChecksum,
    /// A scan was asked to start at an offset that is not a frame boundary.
    #[error("WAL offset {offset} is not a frame boundary")]
    Misaligned {
        /// The offending start offset.
        offset: u64,
    },
    /// A scan was asked to continue at `offset`, but the frame before it is missing or carries
    /// other salts than the WAL header: the WAL was restarted (or truncated) since that
    /// position was recorded, so the position no longer names the same frames.
    #[error("WAL frame before offset {offset} is missing or belongs to another WAL generation")]
    PrevFrameMismatch {
        /// The start offset whose previous frame did not match.
        offset: u64,
    },
}

/// A parsed and validated WAL header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    /// [`WAL_MAGIC_LE`] or [`WAL_MAGIC_BE`].
    pub magic: u32,
    /// Always [`WAL_VERSION`].
    pub version: u32,
    /// Database page size in bytes, a power of two in 512..=65536.
    pub page_size: u32,
    /// Checkpoint sequence number, incremented each time the WAL is restarted.
    pub checkpoint_seq: u32,
    /// Salt-1: incremented on each WAL restart.
    pub salt1: u32,
    /// Salt-2: a fresh random value on each WAL restart.
    pub salt2: u32,
    /// First half of the header checksum.
    pub checksum1: u32,
    /// Second half of the header checksum.
    pub checksum2: u32,
}

fn be_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

impl WalHeader {
    /// Parses and fully validates a WAL header: magic, version, page size and header checksum,
    /// checked in that order (the first failure is reported).
    pub fn parse(buf: &[u8; 32]) -> Result<WalHeader, WalError> {
        let header = WalHeader {
            magic: be_u32(buf, 0),
            version: be_u32(buf, 4),
            page_size: be_u32(buf, 8),
            checkpoint_seq: be_u32(buf, 12),
            salt1: be_u32(buf, 16),
            salt2: be_u32(buf, 20),
            checksum1: be_u32(buf, 24),
            checksum2: be_u32(buf, 28),
        };
        if header.magic != WAL_MAGIC_LE && header.magic != WAL_MAGIC_BE {
            return Err(WalError::BadMagic(header.magic));
        }
        if header.version != WAL_VERSION {
            return Err(WalError::BadVersion(header.version));
        }
        if !(512..=65536).contains(&header.page_size) || !header.page_size.is_power_of_two() {
            return Err(WalError::BadPageSize(header.page_size));
        }
        let sum = wal_checksum(header.big_endian_checksums(), &buf[..24], 0, 0);
        if sum != (header.checksum1, header.checksum2) {
            return Err(WalError::HeaderChecksum);
        }
        Ok(header)
    }

    /// True if checksums are computed over big-endian words (magic `0x377f0683`).
    pub fn big_endian_checksums(&self) -> bool {
        self.magic & 1 == 1
    }

    /// Size of one frame in bytes: the 24-byte frame header plus one page.
    pub fn frame_size(&self) -> u64 {
        WAL_FRAME_HEADER_SIZE + u64::from(self.page_size)
    }
}

/// Continues a running WAL checksum `(s0, s1)` over `data`, whose length must be a multiple
/// of 8 (a trailing partial chunk is ignored). Words are read big-endian if `big_endian`,
/// little-endian otherwise. Start from `(0, 0)` for the WAL header.
pub fn wal_checksum(big_endian: bool, data: &[u8], mut s0: u32, mut s1: u32) -> (u32, u32) {
    debug_assert!(
        data.len().is_multiple_of(8),
        "WAL checksum input must be 8-byte chunks"
    );
    for chunk in data.chunks_exact(8) {
        let (a, b) = if big_endian {
            (be_u32(chunk, 0), be_u32(chunk, 4))
        } else {
            (
                u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
                u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]),
            )
        };
        s0 = s0.wrapping_add(a).wrapping_add(s1);
        s1 = s1.wrapping_add(b).wrapping_add(s0);
    }
    (s0, s1)
}

/// Outcome of scanning committed frames from some offset.
#[derive(Debug, Clone)]
pub struct WalScan {
    /// The WAL header the frames were validated against.
    pub header: WalHeader,
    /// The offset the scan started at.
    pub start_offset: u64,
    /// Newest committed copy of each page: pgno -> byte offset in the WAL file of that frame's
    /// PAGE DATA (not the frame header). Pages with pgno > commit are dropped (VACUUM shrink).
    pub pages: BTreeMap<u32, u64>,
    /// Database size in pages from the last commit frame scanned (0 if no commit frame found).
    pub commit: u32,
    /// Offset just past the last committed frame (== start_offset when nothing committed).
    pub end_offset: u64,
    /// The running checksum after the last committed frame (to seed a later continuation).
    pub checksum: (u32, u32),
    /// Committed transactions scanned (commit frames).
    pub commits: u32,
    /// True if the scan stopped early at a commit boundary because max_bytes was reached.
    /// More committed frames may follow (or may not: the scan does not look ahead).
    pub limited: bool,
}

/// Reads into `buf` at `offset` until it is full or the file ends; returns the bytes read.
fn read_full_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut total = 0;
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                offset += n as u64;
                buf = &mut buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// Scans the WAL file from `start_offset` (32 = the first frame; otherwise must be
/// `32 + k * frame_size`) and returns the committed frames found.
///
/// When `start_offset > 32` the running checksum is seeded from the previous frame's stored
/// checksum fields; if that frame is missing or its salts differ from the WAL header's salts,
/// [`WalError::PrevFrameMismatch`] is returned. Note that this check cannot detect a WAL
/// that was restarted and has since grown past `start_offset` again: callers continuing a
/// scan must also compare [`WalScan::header`]'s salts with those of their previous scan.
///
/// The scan stops at the first invalid frame (bad salts, zero page number, bad checksum or
/// short read: the normal end of a WAL, not an error) or, once at least `max_bytes` of frames
/// have been consumed, at the next commit boundary (`limited = true`). Pass `u64::MAX` for
/// no limit; `0` stops after the first committed transaction.
///
/// A WAL shorter than 32 bytes or with an invalid header (bad magic, version, page size or
/// header checksum) is an empty WAL: `Ok(None)`. A `start_offset` below 32 is always
/// [`WalError::Misaligned`]; other misalignment is only detectable, and reported, once the
/// header (and so the frame size) is known.
pub fn scan(file: &File, start_offset: u64, max_bytes: u64) -> Result<Option<WalScan>, WalError> {
    scan_with_read_size(file, start_offset, max_bytes, SCAN_BUFFER_SIZE)
}

/// [`scan`], reading `read_size` bytes (rounded down to whole frames, at least one frame) per
/// positional read; tests use small sizes to cross read boundaries.
fn scan_with_read_size(
    file: &File,
    start_offset: u64,
    max_bytes: u64,
    read_size: usize,
) -> Result<Option<WalScan>, WalError> {
    if start_offset < WAL_HEADER_SIZE {
        return Err(WalError::Misaligned {
            offset: start_offset,
        });
    }
    let mut header_buf = [0u8; WAL_HEADER_SIZE as usize];
    if read_full_at(file, &mut header_buf, 0)? < header_buf.len() {
        return Ok(None);
    }
    let header = match WalHeader::parse(&header_buf) {
        Ok(header) => header,
        Err(WalError::Io(e)) => return Err(WalError::Io(e)),
        Err(_) => return Ok(None),
    };
    let frame_size = header.frame_size();
    if !(start_offset - WAL_HEADER_SIZE).is_multiple_of(frame_size) {
        return Err(WalError::Misaligned {
            offset: start_offset,
        });
    }
    let big_endian = header.big_endian_checksums();
    let salts = (header.salt1, header.salt2);

    let seed = if start_offset == WAL_HEADER_SIZE {
        (header.checksum1, header.checksum2)
    } else {
        let mut prev = [0u8; WAL_FRAME_HEADER_SIZE as usize];
        let n = read_full_at(file, &mut prev, start_offset - frame_size)?;
        // The previous frame must be whole: a continuation past the end of the file (a
        // truncated WAL) is as much a break in the chain as foreign salts.
        let whole = file.metadata()?.len() >= start_offset;
        if !whole || n < prev.len() || (be_u32(&prev, 8), be_u32(&prev, 12)) != salts {
            return Err(WalError::PrevFrameMismatch {
                offset: start_offset,
            });
        }
        (be_u32(&prev, 16), be_u32(&prev, 20))
    };

    let mut result = WalScan {
        header,
        start_offset,
        pages: BTreeMap::new(),
        commit: 0,
        end_offset: start_offset,
        checksum: seed,
        commits: 0,
        limited: false,
    };

    // Whole frames per read; frame_size <= 24 + 65536, so this fits comfortably in usize.
    let frame_len = frame_size as usize;
    let frames_per_read = (read_size / frame_len).max(1);
    let mut buf = vec![0u8; frames_per_read * frame_len];
    // Frames of the transaction in progress: (pgno, page data offset), in WAL order.
    let mut pending: Vec<(u32, u64)> = Vec::new();
    let mut running = seed;
    let mut offset = start_offset;

    'read: loop {
        let n = read_full_at(file, &mut buf, offset)?;
        let whole = n / frame_len;
        for frame in buf[..whole * frame_len].chunks_exact(frame_len) {
            let pgno = be_u32(frame, 0);
            let commit = be_u32(frame, 4);
            if (be_u32(frame, 8), be_u32(frame, 12)) != salts || pgno == 0 {
                break 'read;
            }
            let (s0, s1) = wal_checksum(big_endian, &frame[..8], running.0, running.1);
            running = wal_checksum(big_endian, &frame[WAL_FRAME_HEADER_SIZE as usize..], s0, s1);
            if running != (be_u32(frame, 16), be_u32(frame, 20)) {
                break 'read;
            }
            pending.push((pgno, offset + WAL_FRAME_HEADER_SIZE));
            offset += frame_size;
            if commit != 0 {
                result.pages.extend(pending.drain(..));
                // A commit that shrinks the database (VACUUM) drops pages past its end.
                if let Some(past_end) = commit.checked_add(1) {
                    drop(result.pages.split_off(&past_end));
                }
                result.commit = commit;
                result.commits += 1;
                result.end_offset = offset;
                result.checksum = running;
                if offset - start_offset >= max_bytes {
                    result.limited = true;
                    break 'read;
                }
            }
        }
        if whole < frames_per_read {
            break;
        }
    }
    Ok(Some(result))
}

/// Reads one page's data at `data_offset` (as recorded in [`WalScan::pages`]) into `buf`,
/// filling it completely, with a positional read. A short read is an
/// [`io::ErrorKind::UnexpectedEof`] error.
pub fn read_page(file: &File, data_offset: u64, buf: &mut [u8]) -> Result<(), WalError> {
    file.read_exact_at(buf, data_offset)?;
    Ok(())
}

#[cfg(test)]
mod tests;
