//! Checksums of the LTX format: the file checksum (CRC-64/GO-ISO over the logical stream) and
//! the rolling database checksum (XOR of per-page CRC-64s, the lock page excluded).
//!
//! Invariant: every checksum this module returns has [`CHECKSUM_FLAG`] set, so a zero value
//! always means "not tracked".

use crc::{CRC_64_GO_ISO, Crc, Digest, Table};

use super::CHECKSUM_FLAG;

/// Slice-by-16 tables: page checksums sit on the snapshot and restore hot paths.
type Crc64 = Crc<u64, Table<16>>;

/// The CRC-64 Go's `hash/crc64` computes with the ISO table.
pub static CRC64: Crc64 = Crc64::new(&CRC_64_GO_ISO);

/// A running CRC-64/GO-ISO digest.
pub type Crc64Digest = Digest<'static, u64, Table<16>>;

/// Checksum of one page: `FLAG | CRC64(pgno BE || data)`.
pub fn page_checksum(pgno: u32, data: &[u8]) -> u64 {
    let mut d = CRC64.digest();
    d.update(&pgno.to_be_bytes());
    d.update(data);
    CHECKSUM_FLAG | d.finalize()
}

/// A rolling database checksum, updated page by page in any order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DbChecksum(u64);

impl DbChecksum {
    /// Starts from a known value (0 = empty database).
    pub fn new(value: u64) -> Self {
        DbChecksum(value)
    }

    /// The current value (0 only when no page was ever added).
    pub fn value(&self) -> u64 {
        self.0
    }

    /// Adds (or removes: XOR is its own inverse) one page checksum.
    pub fn toggle(&mut self, page_checksum: u64) {
        self.0 = CHECKSUM_FLAG | (self.0 ^ page_checksum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_go_iso_check_value() {
        assert_eq!(CRC64.checksum(b"123456789"), 0xB909_56C7_75A4_1001);
    }

    #[test]
    fn rolling_checksum_is_order_free_and_reversible() {
        let pages: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 512]).collect();
        let mut a = DbChecksum::default();
        for (i, p) in pages.iter().enumerate() {
            a.toggle(page_checksum(i as u32 + 1, p));
        }
        let mut b = DbChecksum::default();
        for (i, p) in pages.iter().enumerate().rev() {
            b.toggle(page_checksum(i as u32 + 1, p));
        }
        assert_eq!(a, b);
        let before = a;
        a.toggle(page_checksum(3, &pages[2]));
        a.toggle(page_checksum(3, &[9u8; 512]));
        a.toggle(page_checksum(3, &[9u8; 512]));
        a.toggle(page_checksum(3, &pages[2]));
        assert_eq!(a, before);
    }
}
