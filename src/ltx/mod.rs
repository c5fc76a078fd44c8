//! The LTX v3 segment format, byte-compatible with `superfly/ltx` v0.5.2 (Litestream v0.5).
//!
//! ```text
//! [Header 100 B][Page frame]*[Zero page header 6 B][Page index][Trailer 16 B]
//! page frame  = pgno u32 | flags u16 | (flags & 1: size u32) | compressed page
//! page index  = (uvarint pgno, uvarint offset, uvarint frame size)* | uvarint 0 | u64 length
//! trailer     = post-apply database checksum u64 | file checksum u64
//! ```
//!
//! All integers are big-endian. The file checksum is CRC-64/GO-ISO over the *logical* stream
//! (headers as stored, pages decompressed) with bit 63 forced on; see [`checksum`].
//!
//! Invariants this module keeps:
//! - Every header that is encoded or decoded passes [`Header::validate`], the same rules as
//!   upstream, plus replicad's codec bits (which upstream rejects: a clean refusal, never
//!   garbage).
//! - Pages inside a file are strictly ascending, never the SQLite lock page, never past
//!   `commit`; a snapshot (min TXID 1) holds every page `1..=commit` but the lock page.
//! - A decoder reports success only after the file checksum, the page index and the trailer
//!   all agree with what was read.

pub mod checksum;
pub mod codec;
pub mod decoder;
pub mod encoder;

use std::fmt;

pub use codec::Codec;
pub use decoder::{Decoder, Frame};
pub use encoder::Encoder;

/// File magic; there is no on-disk version field (LTX v3 is implied by 6-byte page headers).
pub const MAGIC: &[u8; 4] = b"LTX1";
/// Header size in bytes.
pub const HEADER_SIZE: usize = 100;
/// Page header size in bytes (pgno u32 + flags u16), not counting the optional size field.
pub const PAGE_HEADER_SIZE: usize = 6;
/// Trailer size in bytes.
pub const TRAILER_SIZE: usize = 16;

/// Header flag: the file carries no database checksums (what Litestream always writes).
pub const HEADER_FLAG_NO_CHECKSUM: u32 = 0x0000_0002;
/// Header flag bits (replicad only) that name a page codec other than LZ4. Upstream accepts
/// no flag but [`HEADER_FLAG_NO_CHECKSUM`], so such files are refused cleanly by Litestream.
pub const HEADER_FLAG_CODEC_MASK: u32 = 0x0000_0F00;
/// Page flag: a u32 compressed size follows the page header ("block" encoding).
pub const PAGE_FLAG_SIZE: u16 = 0x0001;
/// Bit forced on in every database and file checksum.
pub const CHECKSUM_FLAG: u64 = 1 << 63;

/// The page number of SQLite's lock page (the page holding byte offset 1 GiB), never stored.
pub fn lock_pgno(page_size: u32) -> u32 {
    0x4000_0000 / page_size + 1
}

/// True if `page_size` is a power of two in 512..=65536.
pub fn is_valid_page_size(page_size: u32) -> bool {
    (512..=65536).contains(&page_size) && page_size.is_power_of_two()
}

/// A transaction ID: one Litestream "sync batch", shown as 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TxId(pub u64);

impl fmt::Display for TxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for TxId {
    type Err = LtxError;

    /// Parses exactly 16 hex digits, as Litestream's `-txid` does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(LtxError::InvalidTxId(s.to_string()));
        }
        u64::from_str_radix(s, 16)
            .map(TxId)
            .map_err(|_| LtxError::InvalidTxId(s.to_string()))
    }
}

/// The canonical file name of a segment: `<min>-<max>.ltx` in 16-digit lowercase hex.
pub fn format_filename(min: TxId, max: TxId) -> String {
    format!("{min}-{max}.ltx")
}

/// Parses a canonical segment file name; anything else (including `.tmp` files) is `None`.
pub fn parse_filename(name: &str) -> Option<(TxId, TxId)> {
    let stem = name.strip_suffix(".ltx")?;
    let (min, max) = stem.split_once('-')?;
    let lower_hex =
        |s: &str| s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !lower_hex(min) || !lower_hex(max) {
        return None;
    }
    Some((min.parse().ok()?, max.parse().ok()?))
}

/// Errors of the LTX codec. Every variant says what was wrong with which input.
#[derive(Debug, thiserror::Error)]
pub enum LtxError {
    /// An I/O error while reading or writing a segment.
    #[error("ltx i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The file does not start with `LTX1`.
    #[error("not an LTX file (bad magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// A header field breaks a validation rule.
    #[error("invalid LTX header: {0}")]
    InvalidHeader(String),
    /// A page header or page payload is malformed.
    #[error("invalid LTX page at offset {offset}: {reason}")]
    InvalidPage {
        /// Byte offset of the page frame in the file.
        offset: u64,
        /// What was wrong.
        reason: String,
    },
    /// The page index or trailer does not agree with the pages read.
    #[error("invalid LTX index or trailer: {0}")]
    InvalidIndex(String),
    /// The file ended before its trailer.
    #[error("LTX file truncated ({0})")]
    Truncated(&'static str),
    /// The recomputed file checksum differs from the trailer's.
    #[error(
        "LTX file checksum mismatch: trailer says {expected:016x}, content gives {actual:016x}"
    )]
    ChecksumMismatch {
        /// Checksum stored in the trailer.
        expected: u64,
        /// Checksum computed over the content.
        actual: u64,
    },
    /// Bytes follow the trailer.
    #[error("LTX file has trailing bytes after its trailer")]
    TrailingBytes,
    /// A page could not be compressed or decompressed.
    #[error("{codec} codec: {reason}")]
    Codec {
        /// Codec name.
        codec: &'static str,
        /// What failed.
        reason: String,
    },
    /// An encoder was used against its rules (a caller bug or bad input pages).
    #[error("ltx encoder: {0}")]
    Encode(String),
    /// A TXID string is not 16 hex digits.
    #[error("invalid TXID {0:?}: expected 16 hex digits")]
    InvalidTxId(String),
}

/// The 100-byte LTX header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Flag bits: [`HEADER_FLAG_NO_CHECKSUM`] and replicad's codec bits.
    pub flags: u32,
    /// Database page size in bytes.
    pub page_size: u32,
    /// Database size in pages after this file is applied.
    pub commit: u32,
    /// First TXID covered.
    pub min_txid: TxId,
    /// Last TXID covered.
    pub max_txid: TxId,
    /// Creation time of the data, milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Database checksum before apply (0 for snapshots and `NoChecksum` files).
    pub pre_apply_checksum: u64,
    /// Byte offset in the source WAL where this file's frames start (0 if not from a WAL).
    pub wal_offset: i64,
    /// Number of WAL bytes covered (0 if not from a WAL).
    pub wal_size: i64,
    /// Source WAL salt-1.
    pub wal_salt1: u32,
    /// Source WAL salt-2.
    pub wal_salt2: u32,
    /// Creator node (LiteFS); always 0 here.
    pub node_id: u64,
}

impl Header {
    /// True for a snapshot: a file that starts at TXID 1 and holds every page.
    pub fn is_snapshot(&self) -> bool {
        self.min_txid.0 == 1
    }

    /// True if the file carries real pre/post-apply database checksums.
    pub fn has_checksums(&self) -> bool {
        self.flags & HEADER_FLAG_NO_CHECKSUM == 0
    }

    /// The page codec named by the flags.
    pub fn codec(&self) -> Result<Codec, LtxError> {
        Codec::from_flag_bits(self.flags & HEADER_FLAG_CODEC_MASK)
    }

    /// Checks the same rules as upstream's `Header.Validate`, with replicad's codec bits allowed.
    pub fn validate(&self) -> Result<(), LtxError> {
        let bad = |m: &str| Err(LtxError::InvalidHeader(m.to_string()));
        if self.flags & !(HEADER_FLAG_NO_CHECKSUM | HEADER_FLAG_CODEC_MASK) != 0 {
            return Err(LtxError::InvalidHeader(format!(
                "unknown flags {:#010x}",
                self.flags
            )));
        }
        self.codec()?;
        if !is_valid_page_size(self.page_size) {
            return Err(LtxError::InvalidHeader(format!(
                "invalid page size {}",
                self.page_size
            )));
        }
        if self.min_txid.0 == 0 || self.max_txid.0 == 0 {
            return bad("TXIDs must be non-zero");
        }
        if self.min_txid > self.max_txid {
            return bad("min TXID greater than max TXID");
        }
        if self.wal_offset < 0 || self.wal_size < 0 {
            return bad("negative WAL offset or size");
        }
        if (self.wal_salt1 != 0 || self.wal_salt2 != 0) && self.wal_offset == 0 {
            return bad("WAL salts set without a WAL offset");
        }
        if self.wal_offset == 0 && self.wal_size != 0 {
            return bad("WAL size set without a WAL offset");
        }
        if self.is_snapshot() {
            if self.pre_apply_checksum != 0 {
                return bad("snapshot with a pre-apply checksum");
            }
        } else if !self.has_checksums() {
            if self.pre_apply_checksum != 0 {
                return bad("pre-apply checksum set on a NoChecksum file");
            }
        } else if self.pre_apply_checksum & CHECKSUM_FLAG == 0 {
            return bad("pre-apply checksum without its flag bit");
        }
        Ok(())
    }

    /// Serialises the header; fails if it does not validate.
    pub fn encode(&self) -> Result<[u8; HEADER_SIZE], LtxError> {
        self.validate()?;
        let mut b = [0u8; HEADER_SIZE];
        b[0..4].copy_from_slice(MAGIC);
        b[4..8].copy_from_slice(&self.flags.to_be_bytes());
        b[8..12].copy_from_slice(&self.page_size.to_be_bytes());
        b[12..16].copy_from_slice(&self.commit.to_be_bytes());
        b[16..24].copy_from_slice(&self.min_txid.0.to_be_bytes());
        b[24..32].copy_from_slice(&self.max_txid.0.to_be_bytes());
        b[32..40].copy_from_slice(&self.timestamp.to_be_bytes());
        b[40..48].copy_from_slice(&self.pre_apply_checksum.to_be_bytes());
        b[48..56].copy_from_slice(&self.wal_offset.to_be_bytes());
        b[56..64].copy_from_slice(&self.wal_size.to_be_bytes());
        b[64..68].copy_from_slice(&self.wal_salt1.to_be_bytes());
        b[68..72].copy_from_slice(&self.wal_salt2.to_be_bytes());
        b[72..80].copy_from_slice(&self.node_id.to_be_bytes());
        Ok(b)
    }

    /// Parses and validates a header. Reserved bytes are not checked (as upstream).
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Result<Header, LtxError> {
        let magic: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if &magic != MAGIC {
            return Err(LtxError::BadMagic(magic));
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[o..o + 8]);
            u64::from_be_bytes(x)
        };
        let h = Header {
            flags: u32_at(4),
            page_size: u32_at(8),
            commit: u32_at(12),
            min_txid: TxId(u64_at(16)),
            max_txid: TxId(u64_at(24)),
            timestamp: u64_at(32) as i64,
            pre_apply_checksum: u64_at(40),
            wal_offset: u64_at(48) as i64,
            wal_size: u64_at(56) as i64,
            wal_salt1: u32_at(64),
            wal_salt2: u32_at(68),
            node_id: u64_at(72),
        };
        h.validate()?;
        Ok(h)
    }
}

/// The page-order rules of an LTX file, shared by the encoder and the decoder: pages strictly
/// ascending, in `1..=commit`, never the lock page; a snapshot holds every page but the lock
/// page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageOrder {
    commit: u32,
    snapshot: bool,
    lock: u32,
    last: u32,
}

impl PageOrder {
    pub(crate) fn new(h: &Header) -> PageOrder {
        PageOrder {
            commit: h.commit,
            snapshot: h.is_snapshot(),
            lock: lock_pgno(h.page_size),
            last: 0,
        }
    }

    fn next_snapshot_pgno(&self) -> u32 {
        let next = self.last + 1;
        if next == self.lock { next + 1 } else { next }
    }

    /// Accepts `pgno` as the next page, or says why it cannot be.
    pub(crate) fn accept(&mut self, pgno: u32) -> Result<(), String> {
        if pgno == 0 || pgno > self.commit {
            return Err(format!("page {pgno} outside 1..={}", self.commit));
        }
        if pgno <= self.last {
            return Err(format!("page {pgno} after page {}", self.last));
        }
        if pgno == self.lock {
            return Err(format!("page {pgno} is the lock page"));
        }
        if self.snapshot && pgno != self.next_snapshot_pgno() {
            return Err(format!("snapshot skips from page {} to {pgno}", self.last));
        }
        self.last = pgno;
        Ok(())
    }

    /// After the last page: a snapshot must have reached `commit`.
    pub(crate) fn finish(&self) -> Result<(), String> {
        if self.snapshot && self.next_snapshot_pgno() <= self.commit {
            return Err(format!(
                "snapshot ends at page {} of {}",
                self.last, self.commit
            ));
        }
        Ok(())
    }
}

/// The 16-byte trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trailer {
    /// Database checksum after apply (0 in `NoChecksum` files).
    pub post_apply_checksum: u64,
    /// CRC-64/GO-ISO of the logical stream, bit 63 set.
    pub file_checksum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filenames_round_trip_and_reject_foreign_names() {
        let name = format_filename(TxId(1), TxId(0x4d2));
        assert_eq!(name, "0000000000000001-00000000000004d2.ltx");
        assert_eq!(parse_filename(&name), Some((TxId(1), TxId(0x4d2))));
        for bad in [
            "0000000000000001-00000000000004D2.ltx",
            "0000000000000001-0000000000000002.ltx.tmp",
            "1-2.ltx",
            "notes.txt",
        ] {
            assert_eq!(parse_filename(bad), None, "{bad}");
        }
    }

    /// The decoder checks the page index against the pages through a digest of the entries:
    /// one wrong page number in an index of the right length is still refused.
    #[test]
    fn a_page_index_that_disagrees_with_the_pages_is_refused() {
        let h = Header {
            flags: HEADER_FLAG_NO_CHECKSUM,
            page_size: 512,
            commit: 3,
            min_txid: TxId(1),
            max_txid: TxId(1),
            timestamp: 1_767_225_600_000,
            ..Header::default()
        };
        let mut enc = Encoder::new(Vec::new(), h, Codec::Lz4).unwrap();
        for pgno in 1..=3u32 {
            enc.encode_page(pgno, &[pgno as u8; 512]).unwrap();
        }
        let (good, _) = enc.finish(0).unwrap();
        let decode = |bytes: &[u8]| {
            let mut dec = Decoder::new(bytes).unwrap();
            let mut page = [0u8; 512];
            while dec.next_page(&mut page).unwrap().is_some() {}
            dec.finish()
        };
        decode(&good).unwrap();
        // The index: its length field sits between it and the 16-byte trailer.
        let at = good.len() - 16 - 8;
        let index_len = u64::from_be_bytes(good[at..at + 8].try_into().unwrap()) as usize;
        let mut bad = good.clone();
        assert_eq!(bad[at - index_len], 1, "the first entry's page number");
        bad[at - index_len] = 2;
        assert!(matches!(decode(&bad), Err(LtxError::InvalidIndex(_))));
    }

    #[test]
    fn lock_page_numbers_match_upstream() {
        assert_eq!(lock_pgno(4096), 262_145);
        assert_eq!(lock_pgno(65536), 16_385);
    }

    #[test]
    fn header_rules() {
        let ok = Header {
            flags: HEADER_FLAG_NO_CHECKSUM,
            page_size: 4096,
            commit: 10,
            min_txid: TxId(5),
            max_txid: TxId(5),
            timestamp: 1_767_225_600_000,
            wal_offset: 12392,
            wal_size: 8240,
            wal_salt1: 0x8a3c_1f02,
            wal_salt2: 0x5e11_d0c7,
            ..Header::default()
        };
        let bytes = ok.encode().unwrap();
        assert_eq!(
            &bytes[0..16],
            &[
                0x4c, 0x54, 0x58, 0x31, 0, 0, 0, 2, 0, 0, 0x10, 0, 0, 0, 0, 0x0a
            ]
        );
        assert_eq!(Header::decode(&bytes).unwrap(), ok);
        let broken = [
            Header { flags: 0x4, ..ok },
            Header {
                page_size: 1000,
                ..ok
            },
            Header {
                min_txid: TxId(0),
                ..ok
            },
            Header {
                min_txid: TxId(6),
                ..ok
            },
            Header {
                wal_offset: 0,
                ..ok
            },
            Header {
                wal_offset: -1,
                ..ok
            },
            Header {
                pre_apply_checksum: 7,
                ..ok
            },
            Header {
                flags: 0,
                pre_apply_checksum: 7,
                ..ok
            },
            Header {
                min_txid: TxId(1),
                pre_apply_checksum: CHECKSUM_FLAG | 7,
                flags: 0,
                ..ok
            },
        ];
        for h in broken {
            assert!(h.validate().is_err(), "{h:?}");
        }
    }
}
