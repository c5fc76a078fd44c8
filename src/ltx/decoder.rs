//! Streaming LTX decoder and verifier.
//!
//! Reads a file front to back through any `Read` (a local file or an HTTP body), one page at a
//! time, in memory that does not grow with the file: the page index is checked against the
//! pages through a CRC-64 of the entries each side implies (at 10 GiB the expected index
//! alone was 26 MiB, and its check another 26 MiB). That digest is the same CRC-64 as the
//! file checksum, so a corruption of the index that fools one fools the other: together
//! they are one CRC-64's protection, not two. Nothing reads pages through the index. Both page encodings are read: block (flag 0x0001, u32 size, payload of the header's
//! codec) and legacy (flag 0x0000, one whole LZ4 frame, Litestream 0.5.0-0.5.15).
//!
//! Invariant: [`Decoder::finish`] succeeds only if the file checksum, the page index and the
//! trailer all agree with the pages handed out, and nothing follows the trailer. Callers must
//! treat pages as provisional until then (restore writes them to a temporary file).

use std::io::{BufReader, Read};

use super::checksum::Crc64Digest;
use super::encoder::put_uvarint;
use super::{
    CHECKSUM_FLAG, Codec, HEADER_SIZE, Header, LtxError, PAGE_FLAG_SIZE, PAGE_HEADER_SIZE,
    PageOrder, TRAILER_SIZE, Trailer,
};

/// Largest compressed payload accepted for one page: incompressible input grows a little under
/// every codec; anything far larger is corruption, refused before allocating for it.
fn max_payload(page_size: u32) -> usize {
    page_size as usize * 2 + 1024
}

/// LZ4 frame magic number (little-endian on disk).
const LZ4_FRAME_MAGIC: u32 = 0x184D_2204;

/// Reads and verifies one LTX file.
pub struct Decoder<R: Read> {
    r: BufReader<R>,
    header: Header,
    codec: Codec,
    digest: Crc64Digest,
    offset: u64,
    /// CRC-64 of the index entries the pages read so far imply (canonical varints).
    expected_index: Crc64Digest,
    /// One entry's varints, reused.
    entry: Vec<u8>,
    order: PageOrder,
    /// The frame [`Decoder::next_page`] reads into (its payload buffer reused).
    frame: Frame,
    pages_done: bool,
    page_count: u32,
    /// Frames read and not yet folded back into the file checksum.
    unfolded: u32,
}

/// One page as stored: read in file order by [`Decoder::read_frame`], decoded by
/// [`Frame::decode`] on any thread, and folded back into the checksum by [`Decoder::fold`].
#[derive(Debug)]
pub struct Frame {
    pgno: u32,
    offset: u64,
    /// The page header and, for a block, its size field: the bytes the checksum covers
    /// before the decoded page.
    head: [u8; PAGE_HEADER_SIZE + 4],
    head_len: u8,
    payload: Vec<u8>,
    block: bool,
    codec: Codec,
    page_size: u32,
}

impl Default for Frame {
    fn default() -> Self {
        Frame {
            pgno: 0,
            offset: 0,
            head: [0; PAGE_HEADER_SIZE + 4],
            head_len: 0,
            payload: Vec::new(),
            block: false,
            codec: Codec::Lz4,
            page_size: 0,
        }
    }
}

impl Frame {
    /// The page number.
    pub fn pgno(&self) -> u32 {
        self.pgno
    }

    /// Where the frame starts in its file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Decodes the page into `out` (exactly one page long).
    pub fn decode(&self, out: &mut [u8]) -> Result<(), LtxError> {
        let bad = |reason: String| LtxError::InvalidPage {
            offset: self.offset,
            reason: format!("page {}: {reason}", self.pgno),
        };
        if out.len() != self.page_size as usize {
            return Err(bad(format!(
                "buffer of {} bytes for {}-byte pages",
                out.len(),
                self.page_size
            )));
        }
        if self.block {
            self.codec
                .decompress(&self.payload, out)
                .map_err(|e| bad(e.to_string()))
        } else {
            decode_lz4_frame(&self.payload, out).map_err(bad)
        }
    }
}

impl<R: Read> Decoder<R> {
    /// Reads and validates the header.
    pub fn new(r: R) -> Result<Self, LtxError> {
        let mut r = BufReader::with_capacity(128 * 1024, r);
        let mut buf = [0u8; HEADER_SIZE];
        read_full(&mut r, &mut buf, "header")?;
        let header = Header::decode(&buf)?;
        let mut digest = Crc64Digest::new();
        digest.update(&buf);
        Ok(Decoder {
            r,
            codec: header.codec()?,
            header,
            digest,
            offset: HEADER_SIZE as u64,
            expected_index: Crc64Digest::new(),
            entry: Vec::with_capacity(32),
            order: PageOrder::new(&header),
            frame: Frame::default(),
            pages_done: false,
            page_count: 0,
            unfolded: 0,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Number of pages returned so far.
    pub fn page_count(&self) -> u32 {
        self.page_count
    }

    /// The stored payload of the page last returned by [`Decoder::next_page`], if it was
    /// block-encoded with the header's codec (so it can be copied into another file of the
    /// same codec without recompressing).
    pub fn last_compressed(&self) -> Option<&[u8]> {
        self.frame.block.then_some(&self.frame.payload[..])
    }

    /// Decodes the next page into `buf` (exactly one page long) and returns its number, or
    /// `None` after the last page.
    pub fn next_page(&mut self, buf: &mut [u8]) -> Result<Option<u32>, LtxError> {
        let mut frame = std::mem::take(&mut self.frame);
        let read = self.read_frame(&mut frame).and_then(|more| {
            if more {
                frame.decode(buf)?;
                self.fold(&frame, buf);
            }
            Ok(more.then_some(frame.pgno))
        });
        self.frame = frame;
        read
    }

    /// Reads the next page as stored into `frame` without decoding it; `false` after the
    /// last page. Every frame read must be decoded ([`Frame::decode`], on any thread) and
    /// handed back to [`Decoder::fold`] in the order read before [`Decoder::finish`].
    pub fn read_frame(&mut self, frame: &mut Frame) -> Result<bool, LtxError> {
        if self.pages_done {
            return Ok(false);
        }
        let frame_offset = self.offset;
        let mut ph = [0u8; PAGE_HEADER_SIZE];
        read_full(&mut self.r, &mut ph, "page header")?;
        self.offset += ph.len() as u64;
        let pgno = u32::from_be_bytes([ph[0], ph[1], ph[2], ph[3]]);
        let flags = u16::from_be_bytes([ph[4], ph[5]]);
        let bad = |reason: String| LtxError::InvalidPage {
            offset: frame_offset,
            reason,
        };
        if pgno == 0 {
            // The end marker (all zeros) joins the checksum in `finish`, after every page
            // read before it has been folded.
            if flags != 0 {
                return Err(bad(format!("end-of-pages marker with flags {flags:#x}")));
            }
            self.pages_done = true;
            self.check_snapshot_complete()?;
            return Ok(false);
        }
        self.order.accept(pgno).map_err(bad)?;
        frame.head[..ph.len()].copy_from_slice(&ph);
        frame.head_len = ph.len() as u8;
        match flags {
            PAGE_FLAG_SIZE => {
                let mut size = [0u8; 4];
                read_full(&mut self.r, &mut size, "page size")?;
                self.offset += 4;
                frame.head[ph.len()..ph.len() + 4].copy_from_slice(&size);
                frame.head_len += 4;
                let size = u32::from_be_bytes(size) as usize;
                if size > max_payload(self.header.page_size) {
                    return Err(bad(format!("compressed size {size} is implausible")));
                }
                frame.payload.resize(size, 0);
                read_full(&mut self.r, &mut frame.payload, "page data")?;
                self.offset += size as u64;
                frame.block = true;
            }
            0 => {
                if self.codec != Codec::Lz4 {
                    return Err(bad(format!("legacy LZ4 frame in a {} file", self.codec)));
                }
                self.read_lz4_frame(frame_offset, &mut frame.payload)?;
                frame.block = false;
            }
            other => return Err(bad(format!("unknown page flags {other:#x}"))),
        }
        frame.pgno = pgno;
        frame.offset = frame_offset;
        frame.codec = self.codec;
        frame.page_size = self.header.page_size;
        let size = self.offset - frame_offset;
        digest_entry(
            &mut self.expected_index,
            &mut self.entry,
            &[u64::from(pgno), frame_offset, size],
        );
        self.page_count += 1;
        self.unfolded += 1;
        Ok(true)
    }

    /// Adds a frame [`Decoder::read_frame`] returned, and `page`, what it decoded to, to the
    /// file checksum. Frames must come back in the order they were read.
    pub fn fold(&mut self, frame: &Frame, page: &[u8]) {
        self.digest
            .update(&frame.head[..usize::from(frame.head_len)]);
        self.digest.update(page);
        debug_assert!(self.unfolded > 0, "a frame folded that was never read");
        self.unfolded = self.unfolded.saturating_sub(1);
    }

    fn check_snapshot_complete(&self) -> Result<(), LtxError> {
        self.order.finish().map_err(|reason| LtxError::InvalidPage {
            offset: self.offset,
            reason,
        })
    }

    /// Copies exactly one LZ4 frame from the stream into `out`, walking its structure (the
    /// frame has no length prefix; its blocks and end mark delimit it).
    fn read_lz4_frame(&mut self, frame_offset: u64, out: &mut Vec<u8>) -> Result<(), LtxError> {
        let limit = max_payload(self.header.page_size);
        let bad = |reason: &str| LtxError::InvalidPage {
            offset: frame_offset,
            reason: reason.to_string(),
        };
        out.clear();
        let take = |dec: &mut Self, out: &mut Vec<u8>, n: usize| -> Result<usize, LtxError> {
            let start = out.len();
            if start + n > limit {
                return Err(bad("LZ4 frame too large for one page"));
            }
            out.resize(start + n, 0);
            read_full(&mut dec.r, &mut out[start..], "lz4 frame")?;
            dec.offset += n as u64;
            Ok(start)
        };
        let at = take(self, out, 6)?;
        let p = &out[at..];
        if u32::from_le_bytes([p[0], p[1], p[2], p[3]]) != LZ4_FRAME_MAGIC {
            return Err(bad("legacy page is not an LZ4 frame"));
        }
        let flg = p[4];
        if flg >> 6 != 0b01 {
            return Err(bad("unsupported LZ4 frame version"));
        }
        let block_checksum = flg & 0x10 != 0;
        let content_size = flg & 0x08 != 0;
        let content_checksum = flg & 0x04 != 0;
        let dict_id = flg & 0x01 != 0;
        let extra = 1 + if content_size { 8 } else { 0 } + if dict_id { 4 } else { 0 };
        take(self, out, extra)?;
        loop {
            let at = take(self, out, 4)?;
            let p = &out[at..];
            let word = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
            if word == 0 {
                break;
            }
            let len = (word & 0x7FFF_FFFF) as usize + if block_checksum { 4 } else { 0 };
            take(self, out, len)?;
        }
        if content_checksum {
            take(self, out, 4)?;
        }
        Ok(())
    }

    /// Decodes every page, then checks the index and trailer ([`Decoder::finish`]): the whole
    /// file verified.
    pub fn verify_to_end(mut self) -> Result<Trailer, LtxError> {
        let mut page = vec![0u8; self.header.page_size as usize];
        while self.next_page(&mut page)?.is_some() {}
        self.finish()
    }

    /// Drains any remaining pages, then reads and checks the index and trailer.
    pub fn finish(mut self) -> Result<Trailer, LtxError> {
        if !self.pages_done {
            let mut page = vec![0u8; self.header.page_size as usize];
            while self.next_page(&mut page)?.is_some() {}
        }
        if self.unfolded != 0 {
            return Err(LtxError::InvalidPage {
                offset: self.offset,
                reason: format!(
                    "{} pages read but never folded back (a caller's bug)",
                    self.unfolded
                ),
            });
        }
        self.digest.update(&[0u8; PAGE_HEADER_SIZE]);

        let mut index_len = 0u64;
        let mut actual = Crc64Digest::new();
        let mut entries = 0u32;
        loop {
            let pgno = self.read_uvarint(&mut index_len)?;
            if pgno == 0 {
                break;
            }
            let offset = self.read_uvarint(&mut index_len)?;
            let size = self.read_uvarint(&mut index_len)?;
            digest_entry(&mut actual, &mut self.entry, &[pgno, offset, size]);
            entries += 1;
            if entries > self.page_count {
                return Err(LtxError::InvalidIndex(
                    "index lists pages the file does not hold".into(),
                ));
            }
        }
        if entries != self.page_count || actual.finalize() != self.expected_index.finalize() {
            return Err(LtxError::InvalidIndex(
                "index does not match the pages".into(),
            ));
        }
        let mut len = [0u8; 8];
        read_full(&mut self.r, &mut len, "index length")?;
        self.digest.update(&len);
        if u64::from_be_bytes(len) != index_len {
            return Err(LtxError::InvalidIndex(format!(
                "index length field says {}, index is {index_len} bytes",
                u64::from_be_bytes(len)
            )));
        }
        let mut t = [0u8; TRAILER_SIZE];
        read_full(&mut self.r, &mut t, "trailer")?;
        let post_apply_checksum =
            u64::from_be_bytes([t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]);
        let file_checksum =
            u64::from_be_bytes([t[8], t[9], t[10], t[11], t[12], t[13], t[14], t[15]]);
        self.digest.update(&t[..8]);
        let actual_checksum = CHECKSUM_FLAG | self.digest.finalize();
        if file_checksum != actual_checksum {
            return Err(LtxError::ChecksumMismatch {
                expected: file_checksum,
                actual: actual_checksum,
            });
        }
        if self.header.has_checksums() {
            if post_apply_checksum & CHECKSUM_FLAG == 0 {
                return Err(LtxError::InvalidIndex(
                    "post-apply checksum without its flag bit".into(),
                ));
            }
        } else if post_apply_checksum != 0 {
            return Err(LtxError::InvalidIndex(
                "post-apply checksum in a NoChecksum file".into(),
            ));
        }
        let mut probe = [0u8; 1];
        loop {
            match self.r.read(&mut probe) {
                Ok(0) => break,
                Ok(_) => return Err(LtxError::TrailingBytes),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Trailer {
            post_apply_checksum,
            file_checksum,
        })
    }

    fn read_uvarint(&mut self, consumed: &mut u64) -> Result<u64, LtxError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let mut b = [0u8; 1];
            read_full(&mut self.r, &mut b, "page index")?;
            self.digest.update(&b);
            *consumed += 1;
            v |= u64::from(b[0] & 0x7F) << shift;
            if b[0] & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(LtxError::InvalidIndex("varint longer than 10 bytes".into()))
    }
}

fn decode_lz4_frame(frame: &[u8], out: &mut [u8]) -> Result<(), String> {
    let mut d = lz4_flex::frame::FrameDecoder::new(frame);
    d.read_exact(out).map_err(|e| format!("LZ4 frame: {e}"))?;
    // Reading on to the end makes the decoder check the end mark and content checksum; one
    // byte is enough to tell a longer frame, without inflating the rest of it.
    let mut more = [0u8; 1];
    match d.read(&mut more) {
        Ok(0) => Ok(()),
        Ok(_) => Err("LZ4 frame holds more than a page".into()),
        Err(e) => Err(format!("LZ4 frame: {e}")),
    }
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8], what: &'static str) -> Result<(), LtxError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => LtxError::Truncated(what),
        _ => LtxError::Io(e),
    })
}

/// Reads only the header of an LTX file.
pub fn read_header<R: Read>(mut r: R) -> Result<Header, LtxError> {
    let mut buf = [0u8; HEADER_SIZE];
    read_full(&mut r, &mut buf, "header")?;
    Header::decode(&buf)
}

/// Adds one index entry, as canonical varints, to `d` (`buf` is scratch).
fn digest_entry(d: &mut Crc64Digest, buf: &mut Vec<u8>, values: &[u64]) {
    buf.clear();
    for v in values {
        put_uvarint(buf, *v);
    }
    d.update(buf);
}
