//! Checksums of the LTX format: the file checksum (CRC-64/GO-ISO over the logical stream) and
//! the rolling database checksum (XOR of per-page CRC-64s, the lock page excluded).
//!
//! Invariant: every checksum this module returns has [`CHECKSUM_FLAG`] set, so a zero value
//! always means "not tracked".

use crc_fast::CrcAlgorithm;

use super::CHECKSUM_FLAG;

/// A running CRC-64/GO-ISO digest, the file checksum Go's `hash/crc64` computes with the ISO
/// table. crc-fast folds it with carry-less multiplication where the CPU has it: the file
/// checksum covers every byte a snapshot writes or a restore reads, on one thread.
pub struct Crc64Digest(crc_fast::Digest);

impl Crc64Digest {
    /// An empty digest.
    pub fn new() -> Self {
        Crc64Digest(crc_fast::Digest::new(CrcAlgorithm::Crc64GoIso))
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The CRC of everything added so far.
    pub fn finalize(&self) -> u64 {
        self.0.finalize()
    }
}

impl Default for Crc64Digest {
    fn default() -> Self {
        Self::new()
    }
}

/// Checksum of one page: `FLAG | CRC64(pgno BE || data)`.
pub fn page_checksum(pgno: u32, data: &[u8]) -> u64 {
    let mut d = Crc64Digest::new();
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

    fn crc64(data: &[u8]) -> u64 {
        let mut d = Crc64Digest::new();
        d.update(data);
        d.finalize()
    }

    #[test]
    fn crc64_go_iso_check_value() {
        assert_eq!(crc64(b"123456789"), 0xB909_56C7_75A4_1001);
    }

    #[test]
    fn crc64_matches_the_table_driven_reference_at_every_length_and_split() {
        let reference = crc::Crc::<u64>::new(&crc::CRC_64_GO_ISO);
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..300).chain([4095, 4096, 4097, 5000]) {
            let d = &data[..len];
            assert_eq!(crc64(d), reference.checksum(d), "length {len}");
            // Fed in pieces, as the encoder and decoder do.
            let mut pieces = Crc64Digest::new();
            for part in d.chunks(7) {
                pieces.update(part);
            }
            assert_eq!(
                pieces.finalize(),
                reference.checksum(d),
                "length {len} in pieces"
            );
        }
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
