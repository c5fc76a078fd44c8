//! Arbitrary bytes through the streaming LTX decoder: it must return errors, never panic.
//!
//! When the decoder accepts a file, the pages it handed out are re-encoded with the header's
//! codec and decoded again: anything the decoder accepts, the encoder must be able to write
//! (except a `commit == 0` file whose post-apply checksum is not the empty-database one, which
//! the encoder refuses by design), and the copy must decode to the same header and pages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replicad::ltx::{CHECKSUM_FLAG, Decoder, Encoder, Header};

/// Keeps memory bounded: a decoded file of more pages than this is checked without the
/// round trip (inputs are at most a few hundred KB, so this is rarely reached).
const MAX_KEPT_BYTES: usize = 8 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(mut dec) = Decoder::new(data) else {
        return;
    };
    let header = *dec.header();
    // The header validated, so the page size is a power of two in 512..=65536: the only
    // allocation sized by the input is bounded by 64 KiB.
    let page_size = header.page_size as usize;
    assert!((512..=65536).contains(&page_size));
    let mut buf = vec![0u8; page_size];
    let mut pages: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut kept = 0usize;
    let mut keep = true;
    let mut last = 0u32;
    loop {
        match dec.next_page(&mut buf) {
            Ok(Some(pgno)) => {
                assert!(
                    pgno > last && pgno <= header.commit,
                    "page {pgno} out of order"
                );
                last = pgno;
                if keep {
                    kept += page_size;
                    keep = kept <= MAX_KEPT_BYTES;
                    pages.push((pgno, buf.clone()));
                }
            }
            Ok(None) => break,
            Err(_) => {
                // finish() after an error must also fail cleanly.
                assert!(dec.finish().is_err(), "finish succeeded after a page error");
                return;
            }
        }
    }
    if keep {
        assert_eq!(dec.page_count() as usize, pages.len());
    }
    let Ok(trailer) = dec.finish() else {
        return;
    };
    if !keep {
        return;
    }
    round_trip(&header, &pages, trailer.post_apply_checksum);
});

fn round_trip(header: &Header, pages: &[(u32, Vec<u8>)], post_apply_checksum: u64) {
    let codec = header.codec().expect("a validated header names a codec");
    let mut enc = Encoder::new(Vec::new(), *header, codec)
        .expect("encoder refuses a header the decoder accepted");
    for (pgno, page) in pages {
        enc.encode_page(*pgno, page)
            .expect("encoder refuses a page the decoder accepted");
    }
    let out = match enc.finish(post_apply_checksum) {
        Ok((out, _)) => out,
        Err(e) => {
            assert!(
                header.commit == 0 && post_apply_checksum != CHECKSUM_FLAG,
                "encoder refuses to finish a file the decoder accepted: {e}"
            );
            return;
        }
    };
    let mut dec = Decoder::new(&out[..]).expect("re-encoded header does not decode");
    assert_eq!(dec.header(), header);
    let mut buf = vec![0u8; header.page_size as usize];
    for (pgno, page) in pages {
        let got = dec
            .next_page(&mut buf)
            .expect("re-encoded page does not decode");
        assert_eq!(got, Some(*pgno));
        assert!(buf == *page, "page {pgno} differs after a round trip");
    }
    assert_eq!(dec.next_page(&mut buf).expect("end marker"), None);
    let t = dec.finish().expect("re-encoded file does not verify");
    assert_eq!(t.post_apply_checksum, post_apply_checksum);
}
