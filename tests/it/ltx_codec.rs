//! Tests for the LTX codec go here: golden files written by Litestream, round trips, and
//! corrupt input.

use std::fs;
use std::path::{Path, PathBuf};

use rand::{Rng, RngExt, SeedableRng, rngs::StdRng};
use replicad::ltx::{
    self, CHECKSUM_FLAG, Codec, Decoder, Encoder, HEADER_FLAG_NO_CHECKSUM, Header, LtxError, TxId,
    checksum::{DbChecksum, page_checksum},
};

fn golden_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5");
    let mut out = Vec::new();
    for scenario in fs::read_dir(&root).unwrap() {
        let dir = scenario.unwrap().path().join("replica/ltx");
        if !dir.is_dir() {
            continue;
        }
        for level in fs::read_dir(&dir).unwrap() {
            for f in fs::read_dir(level.unwrap().path()).unwrap() {
                out.push(f.unwrap().path());
            }
        }
    }
    out.sort();
    assert!(out.len() >= 40, "golden files missing: {}", out.len());
    out
}

#[test]
fn every_golden_file_decodes_and_verifies() {
    for path in golden_files() {
        let bytes = fs::read(&path).unwrap();
        let mut dec =
            Decoder::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let h = *dec.header();
        assert_eq!(h.flags, HEADER_FLAG_NO_CHECKSUM, "{}", path.display());
        let mut page = vec![0u8; h.page_size as usize];
        let mut n = 0;
        while dec.next_page(&mut page).unwrap().is_some() {
            n += 1;
        }
        assert!(n > 0);
        let trailer = dec
            .finish()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(trailer.post_apply_checksum, 0);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(ltx::parse_filename(name), Some((h.min_txid, h.max_txid)));
    }
}

/// Re-encoding a block-encoded golden file with the same compressed payloads reproduces it
/// byte for byte, so the file checksum is computed exactly as the format defines.
#[test]
fn reencoding_golden_block_files_reproduces_them_exactly() {
    let mut checked = 0;
    for path in golden_files() {
        if path.to_string_lossy().contains("legacy-frames") {
            continue;
        }
        let bytes = fs::read(&path).unwrap();
        let mut dec = Decoder::new(&bytes[..]).unwrap();
        let h = *dec.header();
        let mut enc = Encoder::new(Vec::new(), h, Codec::Lz4).unwrap();
        let mut page = vec![0u8; h.page_size as usize];
        while let Some(pgno) = dec.next_page(&mut page).unwrap() {
            let payload = dec.last_compressed().expect("block page").to_vec();
            enc.encode_compressed_page(pgno, &payload, &page).unwrap();
        }
        let golden = dec.finish().unwrap();
        let (out, trailer) = enc.finish(0).unwrap();
        assert_eq!(trailer, golden, "{}", path.display());
        assert_eq!(out, bytes, "{}", path.display());
        checked += 1;
    }
    assert!(checked >= 30);
}

#[test]
fn legacy_frame_files_have_flag_zero_pages() {
    let path = golden_files()
        .into_iter()
        .find(|p| p.to_string_lossy().contains("legacy-frames"))
        .unwrap();
    let bytes = fs::read(path).unwrap();
    // First page header follows the 100-byte header: pgno 1, flags 0, then an LZ4 frame magic.
    assert_eq!(&bytes[100..106], &[0, 0, 0, 1, 0, 0]);
    assert_eq!(&bytes[106..110], &[0x04, 0x22, 0x4d, 0x18]);
    let mut dec = Decoder::new(&bytes[..]).unwrap();
    let mut page = vec![0u8; 4096];
    dec.next_page(&mut page).unwrap();
    assert!(dec.last_compressed().is_none());
    assert_eq!(&page[..16], b"SQLite format 3\0");
}

fn random_page(rng: &mut StdRng, size: usize) -> Vec<u8> {
    // Half random, half runs: realistic compressibility without being trivial.
    let mut p = vec![0u8; size];
    rng.fill_bytes(&mut p[..size / 2]);
    let fill: u8 = rng.random();
    p[size / 2..].fill(fill);
    p
}

fn encode(header: Header, codec: Codec, pages: &[(u32, Vec<u8>)], post: u64) -> Vec<u8> {
    let mut enc = Encoder::new(Vec::new(), header, codec).unwrap();
    for (pgno, data) in pages {
        enc.encode_page(*pgno, data).unwrap();
    }
    enc.finish(post).unwrap().0
}

fn header(page_size: u32, commit: u32, min: u64, max: u64) -> Header {
    Header {
        flags: HEADER_FLAG_NO_CHECKSUM,
        page_size,
        commit,
        min_txid: TxId(min),
        max_txid: TxId(max),
        timestamp: 1_767_225_600_000,
        ..Header::default()
    }
}

#[test]
fn round_trip_random_pages_every_page_size_and_codec() {
    let seed: u64 = std::env::var("REPLICAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut rng = StdRng::seed_from_u64(seed);
    for shift in 9..=16 {
        let page_size = 1u32 << shift;
        for codec in [
            Codec::Lz4,
            Codec::Zstd(1),
            Codec::Zstd(9),
            Codec::Gzip(6),
            Codec::None,
        ] {
            let commit = rng.random_range(1..40u32);
            let mut pages: Vec<(u32, Vec<u8>)> = Vec::new();
            for p in 1..=commit {
                if rng.random_bool(0.6) {
                    pages.push((p, random_page(&mut rng, page_size as usize)));
                }
            }
            if pages.is_empty() {
                pages.push((commit, random_page(&mut rng, page_size as usize)));
            }
            let mut sum = DbChecksum::default();
            for (p, d) in &pages {
                sum.toggle(page_checksum(*p, d));
            }
            let mut h = header(page_size, commit, 5, 9);
            h.flags = 0;
            h.pre_apply_checksum = CHECKSUM_FLAG | 42;
            let bytes = encode(h, codec, &pages, sum.value());
            let mut dec = Decoder::new(&bytes[..]).unwrap();
            assert_eq!(dec.header().codec().unwrap().name(), codec.name());
            let mut buf = vec![0u8; page_size as usize];
            let mut got = Vec::new();
            while let Some(p) = dec.next_page(&mut buf).unwrap() {
                got.push((p, buf.clone()));
            }
            let t = dec.finish().unwrap();
            assert_eq!(
                got, pages,
                "seed {seed} page size {page_size} codec {codec}"
            );
            assert_eq!(t.post_apply_checksum, sum.value());
        }
    }
}

#[test]
fn non_lz4_codecs_are_flagged_so_litestream_refuses_them() {
    let pages = vec![(1, vec![1u8; 4096])];
    for codec in [Codec::Zstd(3), Codec::Gzip(6), Codec::None] {
        let bytes = encode(header(4096, 1, 1, 1), codec, &pages, 0);
        let flags = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
        assert_ne!(flags & !HEADER_FLAG_NO_CHECKSUM, 0, "{codec}");
    }
    let bytes = encode(header(4096, 1, 1, 1), Codec::Lz4, &pages, 0);
    assert_eq!(
        u32::from_be_bytes(bytes[4..8].try_into().unwrap()),
        HEADER_FLAG_NO_CHECKSUM
    );
}

#[test]
fn encoder_refuses_invalid_pages() {
    let page = vec![0u8; 4096];
    let mut enc = Encoder::new(Vec::new(), header(4096, 300_000, 2, 2), Codec::Lz4).unwrap();
    assert!(enc.encode_page(0, &page).is_err());
    assert!(enc.encode_page(ltx::lock_pgno(4096), &page).is_err());
    assert!(enc.encode_page(300_001, &page).is_err());
    assert!(enc.encode_page(3, &page[..100]).is_err());
    enc.encode_page(3, &page).unwrap();
    assert!(enc.encode_page(3, &page).is_err());
    let mut snap = Encoder::new(Vec::new(), header(4096, 3, 1, 4), Codec::Lz4).unwrap();
    assert!(snap.encode_page(2, &page).is_err());
    snap.encode_page(1, &page).unwrap();
    assert!(
        snap.finish(0).is_err(),
        "a snapshot missing pages must not finish"
    );
}

fn decode_all(bytes: &[u8]) -> Result<(), LtxError> {
    let mut dec = Decoder::new(bytes)?;
    let mut buf = vec![0u8; dec.header().page_size as usize];
    while dec.next_page(&mut buf)?.is_some() {}
    dec.finish().map(|_| ())
}

#[test]
fn corrupt_input_is_refused_with_a_clear_error() {
    let golden = golden_files()
        .into_iter()
        .find(|p| p.ends_with("0/0000000000000002-0000000000000002.ltx"))
        .unwrap();
    let bytes = fs::read(golden).unwrap();
    decode_all(&bytes).unwrap();

    // One flipped byte inside a compressed page.
    let mut flipped = bytes.clone();
    flipped[400] ^= 0x55;
    let err = decode_all(&flipped).unwrap_err();
    assert!(
        matches!(
            err,
            LtxError::ChecksumMismatch { .. } | LtxError::InvalidPage { .. }
        ),
        "{err}"
    );

    // Every truncation point fails, and never panics.
    for cut in [
        0,
        50,
        99,
        100,
        105,
        300,
        bytes.len() / 2,
        bytes.len() - 17,
        bytes.len() - 1,
    ] {
        assert!(decode_all(&bytes[..cut]).is_err(), "truncated at {cut}");
    }
    let err = decode_all(&bytes[..bytes.len() - 3]).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");

    let mut magic = bytes.clone();
    magic[0] = b'X';
    assert!(matches!(
        decode_all(&magic).unwrap_err(),
        LtxError::BadMagic(_)
    ));

    let mut flags = bytes.clone();
    flags[7] = 0x06;
    let err = decode_all(&flags).unwrap_err();
    assert!(err.to_string().contains("flags"), "{err}");

    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        decode_all(&trailing).unwrap_err(),
        LtxError::TrailingBytes
    ));

    // A wrong file checksum in the trailer.
    let mut sum = bytes.clone();
    let n = sum.len();
    sum[n - 1] ^= 1;
    assert!(matches!(
        decode_all(&sum).unwrap_err(),
        LtxError::ChecksumMismatch { .. }
    ));
}

/// Seeded random mutation of golden files: the decoder must return an error or succeed, and
/// never panic. `cargo fuzz` (fuzz/) does the same coverage-guided; this keeps a floor in CI.
#[test]
fn random_mutations_never_panic() {
    let files = golden_files();
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for i in 0..400 {
        let mut bytes = fs::read(&files[i % files.len()]).unwrap();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..bytes.len());
            bytes[at] = rng.random();
        }
        if rng.random_bool(0.3) {
            let keep = rng.random_range(0..bytes.len());
            bytes.truncate(keep);
        }
        let _ = decode_all(&bytes);
    }
}

/// The split API the restore decodes with on several threads: frames read in order, decoded
/// anywhere, folded back in order. Folding out of order or not at all fails `finish`.
#[test]
fn frames_decoded_apart_verify_only_when_folded_back_in_order() {
    let mut rng = StdRng::seed_from_u64(11);
    let pages: Vec<(u32, Vec<u8>)> = (1..=6).map(|p| (p, random_page(&mut rng, 4096))).collect();
    let mut h = header(4096, 6, 1, 1);
    h.flags = 0;
    let mut sum = DbChecksum::default();
    for (p, d) in &pages {
        sum.toggle(page_checksum(*p, d));
    }
    let bytes = encode(h, Codec::Zstd(3), &pages, sum.value());
    type Read<'a> = (Decoder<&'a [u8]>, Vec<ltx::Frame>, Vec<(u32, Vec<u8>)>);
    fn read(bytes: &[u8]) -> Read<'_> {
        let mut dec = Decoder::new(bytes).unwrap();
        let mut frames = Vec::new();
        loop {
            let mut f = ltx::Frame::default();
            if !dec.read_frame(&mut f).unwrap() {
                break;
            }
            frames.push(f);
        }
        let decoded: Vec<(u32, Vec<u8>)> = frames
            .iter()
            .map(|f| {
                let mut page = vec![0u8; 4096];
                f.decode(&mut page).unwrap();
                (f.pgno(), page)
            })
            .collect();
        (dec, frames, decoded)
    }

    let (mut dec, frames, decoded) = read(&bytes);
    assert_eq!(decoded, pages);
    for (f, (_, page)) in frames.iter().zip(&decoded) {
        dec.fold(f, page);
    }
    assert_eq!(dec.finish().unwrap().post_apply_checksum, sum.value());

    let (mut dec, frames, decoded) = read(&bytes);
    for i in [1, 0, 2, 3, 4, 5] {
        dec.fold(&frames[i], &decoded[i].1);
    }
    assert!(
        matches!(dec.finish(), Err(LtxError::ChecksumMismatch { .. })),
        "pages folded out of order must not verify"
    );

    let (dec, _, _) = read(&bytes);
    let err = dec.finish().unwrap_err();
    assert!(err.to_string().contains("never folded"), "{err}");
}
