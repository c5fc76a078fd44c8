//! Streaming LTX encoder: header, then pages in ascending order, then index and trailer.
//!
//! Invariant: the encoder refuses any page that would make the file invalid for upstream's
//! decoder or compactor (out of order, past `commit`, the lock page, a gap in a snapshot), so a
//! file it finishes is always one Litestream's `ltx` package accepts (codec `lz4`).

use std::io::{BufWriter, Write};

use super::checksum::Crc64Digest;
use super::{
    CHECKSUM_FLAG, Codec, Header, LtxError, PAGE_FLAG_SIZE, PAGE_HEADER_SIZE, PageOrder, Trailer,
};

/// Writes one LTX file to `W`.
pub struct Encoder<W: Write> {
    w: BufWriter<W>,
    header: Header,
    codec: Codec,
    digest: Crc64Digest,
    offset: u64,
    index: Vec<u8>,
    order: PageOrder,
    scratch: Vec<u8>,
}

impl<W: Write> Encoder<W> {
    /// Validates and writes `header`; pages are compressed with `codec`, whose flag bits are
    /// set in the header (any codec bits already there are replaced).
    pub fn new(w: W, mut header: Header, codec: Codec) -> Result<Self, LtxError> {
        header.flags = (header.flags & !super::HEADER_FLAG_CODEC_MASK) | codec.flag_bits();
        let bytes = header.encode()?;
        let mut w = BufWriter::with_capacity(128 * 1024, w);
        w.write_all(&bytes)?;
        let mut digest = Crc64Digest::new();
        digest.update(&bytes);
        Ok(Encoder {
            w,
            header,
            codec,
            digest,
            offset: bytes.len() as u64,
            order: PageOrder::new(&header),
            index: snapshot_index(&header),
            scratch: Vec::new(),
        })
    }

    /// The header as written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Compresses and appends page `pgno`.
    pub fn encode_page(&mut self, pgno: u32, data: &[u8]) -> Result<(), LtxError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self
            .codec
            .compress(data, &mut scratch)
            .and_then(|()| self.encode_compressed_page(pgno, &scratch, data));
        self.scratch = scratch;
        result
    }

    /// Appends page `pgno` whose payload is already compressed with this encoder's codec
    /// (compaction passes pages through without recompressing). `data` is the decompressed
    /// page, needed for the file checksum; the caller guarantees the two agree.
    pub fn encode_compressed_page(
        &mut self,
        pgno: u32,
        compressed: &[u8],
        data: &[u8],
    ) -> Result<(), LtxError> {
        self.check_page(pgno, data.len())?;
        let mut head = [0u8; PAGE_HEADER_SIZE + 4];
        head[0..4].copy_from_slice(&pgno.to_be_bytes());
        head[4..6].copy_from_slice(&PAGE_FLAG_SIZE.to_be_bytes());
        let size = u32::try_from(compressed.len())
            .map_err(|_| LtxError::Encode("compressed page larger than 4 GiB".into()))?;
        head[6..10].copy_from_slice(&size.to_be_bytes());
        self.w.write_all(&head)?;
        self.w.write_all(compressed)?;
        self.digest.update(&head);
        self.digest.update(data);
        let frame_size = (head.len() + compressed.len()) as u64;
        put_uvarint(&mut self.index, u64::from(pgno));
        put_uvarint(&mut self.index, self.offset);
        put_uvarint(&mut self.index, frame_size);
        self.offset += frame_size;
        Ok(())
    }

    fn check_page(&mut self, pgno: u32, len: usize) -> Result<(), LtxError> {
        if len != self.header.page_size as usize {
            return Err(LtxError::Encode(format!(
                "page {pgno} has {len} bytes, page size is {}",
                self.header.page_size
            )));
        }
        self.order.accept(pgno).map_err(LtxError::Encode)
    }

    /// Writes the end marker, page index and trailer; returns the writer and the trailer.
    pub fn finish(mut self, post_apply_checksum: u64) -> Result<(W, Trailer), LtxError> {
        let h = self.header;
        self.order.finish().map_err(LtxError::Encode)?;
        if h.has_checksums() {
            if post_apply_checksum & CHECKSUM_FLAG == 0 {
                return Err(LtxError::Encode(
                    "post-apply checksum without its flag bit".into(),
                ));
            }
        } else if post_apply_checksum != 0 {
            return Err(LtxError::Encode(
                "post-apply checksum on a NoChecksum file".into(),
            ));
        }
        if h.commit == 0 && post_apply_checksum != CHECKSUM_FLAG {
            return Err(LtxError::Encode(
                "a file with commit 0 needs an empty-database checksum".into(),
            ));
        }
        let end = [0u8; PAGE_HEADER_SIZE];
        self.w.write_all(&end)?;
        self.digest.update(&end);
        put_uvarint(&mut self.index, 0);
        let index_len = self.index.len() as u64;
        self.index.extend_from_slice(&index_len.to_be_bytes());
        self.w.write_all(&self.index)?;
        self.digest.update(&self.index);
        let post = post_apply_checksum.to_be_bytes();
        self.digest.update(&post);
        let file_checksum = CHECKSUM_FLAG | self.digest.finalize();
        self.w.write_all(&post)?;
        self.w.write_all(&file_checksum.to_be_bytes())?;
        let w = self
            .w
            .into_inner()
            .map_err(|e| LtxError::Io(e.into_error()))?;
        Ok((
            w,
            Trailer {
                post_apply_checksum,
                file_checksum,
            },
        ))
    }
}

/// Most index entries reserved up front (64 GiB of 4 KiB pages): a header read from storage
/// may claim any commit, and a reservation the system refuses would abort the process.
const MAX_RESERVED_ENTRIES: u64 = 1 << 24;

/// The page index of a snapshot, sized once for every page (a 10 GiB database has 2.6
/// million entries, which doubling would copy and overshoot by up to half); empty otherwise.
/// Past [`MAX_RESERVED_ENTRIES`], or when the system refuses, it grows as it goes.
fn snapshot_index(h: &Header) -> Vec<u8> {
    let mut index = Vec::new();
    if !h.is_snapshot() {
        return index;
    }
    let len = |v: u64| u64::from((64 - v.max(1).leading_zeros()).div_ceil(7));
    // Offsets up to 32 GiB take 5 bytes; a larger file grows the index past this once.
    let entry = len(u64::from(h.commit)) + 5 + len(u64::from(h.page_size) + 10);
    let bytes = entry * u64::from(h.commit).min(MAX_RESERVED_ENTRIES);
    if let Ok(bytes) = usize::try_from(bytes) {
        let _ = index.try_reserve_exact(bytes);
    }
    index
}

/// Appends `v` as an unsigned LEB128 varint (Go's `binary.AppendUvarint`).
pub(crate) fn put_uvarint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}
