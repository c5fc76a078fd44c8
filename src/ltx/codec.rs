//! Page codecs: how one page's bytes are compressed inside an LTX file.
//!
//! `lz4` is the only codec Litestream reads; the others are marked by header flag bits that
//! Litestream refuses. Compression is per page (random page access through the index depends
//! on it). Compressor and decompressor contexts live in thread-locals and are reused for every
//! page and file a thread handles: creating zstd contexts per file dominates allocation
//! otherwise.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use super::LtxError;

/// A page compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 block format, one block per page (Litestream-compatible).
    Lz4,
    /// Zstandard at a level (1..=19); the level only matters when writing.
    Zstd(i32),
    /// DEFLATE (the algorithm inside gzip, via flate2, without the 18-byte gzip container per
    /// page) at a level (0..=9); the level only matters when writing.
    Gzip(u32),
    /// Pages stored as they are.
    None,
}

/// Default zstd level: the best MB/s per ratio in `benches/ltx_codec.rs` on 4 KiB pages.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
/// Default DEFLATE level (flate2's default).
pub const DEFAULT_GZIP_LEVEL: u32 = 6;

impl Codec {
    /// The header flag bits naming this codec (0 for lz4, so Litestream reads those files).
    pub fn flag_bits(&self) -> u32 {
        match self {
            Codec::Lz4 => 0x000,
            Codec::Zstd(_) => 0x100,
            Codec::Gzip(_) => 0x200,
            Codec::None => 0x300,
        }
    }

    /// The codec named by header flag bits (already masked).
    pub fn from_flag_bits(bits: u32) -> Result<Codec, LtxError> {
        match bits {
            0x000 => Ok(Codec::Lz4),
            0x100 => Ok(Codec::Zstd(DEFAULT_ZSTD_LEVEL)),
            0x200 => Ok(Codec::Gzip(DEFAULT_GZIP_LEVEL)),
            0x300 => Ok(Codec::None),
            other => Err(LtxError::InvalidHeader(format!(
                "unknown page codec bits {other:#x}"
            ))),
        }
    }

    /// The codec's name as written in configs.
    pub fn name(&self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd(_) => "zstd",
            Codec::Gzip(_) => "gzip",
            Codec::None => "none",
        }
    }

    /// Compresses one page into `out` (cleared first).
    pub fn compress(&self, page: &[u8], out: &mut Vec<u8>) -> Result<(), LtxError> {
        out.clear();
        match *self {
            Codec::Lz4 => {
                out.resize(lz4_flex::block::get_maximum_output_size(page.len()), 0);
                let n = lz4_flex::block::compress_into(page, out)
                    .map_err(|e| codec_err("lz4", e.to_string()))?;
                out.truncate(n);
            }
            Codec::Zstd(level) => ZSTD_C.with(|cell| {
                let mut slot = cell.borrow_mut();
                let c = match &mut *slot {
                    Some((l, c)) if *l == level => c,
                    slot_ref => {
                        let c = zstd::bulk::Compressor::new(level)
                            .map_err(|e| codec_err("zstd", e.to_string()))?;
                        &mut slot_ref.insert((level, c)).1
                    }
                };
                out.reserve(zstd::zstd_safe::compress_bound(page.len()));
                c.compress_to_buffer(page, out)
                    .map_err(|e| codec_err("zstd", e.to_string()))?;
                Ok::<(), LtxError>(())
            })?,
            Codec::Gzip(level) => DEFLATE_C.with(|cell| {
                let mut slot = cell.borrow_mut();
                let c = match &mut *slot {
                    Some((l, c)) if *l == level => c,
                    slot_ref => {
                        let c = flate2::Compress::new(flate2::Compression::new(level), false);
                        &mut slot_ref.insert((level, c)).1
                    }
                };
                c.reset();
                // Worst case of DEFLATE stored blocks: 5 bytes per 16 KiB block plus slack.
                out.reserve(page.len() + page.len() / 1000 + 64);
                let status = c
                    .compress_vec(page, out, flate2::FlushCompress::Finish)
                    .map_err(|e| codec_err("gzip", e.to_string()))?;
                if status != flate2::Status::StreamEnd {
                    return Err(codec_err("gzip", "output buffer too small".into()));
                }
                Ok(())
            })?,
            Codec::None => out.extend_from_slice(page),
        }
        Ok(())
    }

    /// Decompresses one page into `out`, which must come out exactly full.
    pub fn decompress(&self, input: &[u8], out: &mut [u8]) -> Result<(), LtxError> {
        let want = out.len();
        let got = match *self {
            Codec::Lz4 => lz4_flex::block::decompress_into(input, out)
                .map_err(|e| codec_err("lz4", e.to_string()))?,
            Codec::Zstd(_) => ZSTD_D.with(|cell| {
                let mut slot = cell.borrow_mut();
                let d = match &mut *slot {
                    Some(d) => d,
                    empty => empty.insert(
                        zstd::bulk::Decompressor::new()
                            .map_err(|e| codec_err("zstd", e.to_string()))?,
                    ),
                };
                d.decompress_to_buffer(input, out)
                    .map_err(|e| codec_err("zstd", e.to_string()))
            })?,
            Codec::Gzip(_) => DEFLATE_D.with(|cell| {
                let mut slot = cell.borrow_mut();
                let d = slot.get_or_insert_with(|| flate2::Decompress::new(false));
                d.reset(false);
                let status = d
                    .decompress(input, out, flate2::FlushDecompress::Finish)
                    .map_err(|e| codec_err("gzip", e.to_string()))?;
                if status != flate2::Status::StreamEnd || d.total_in() != input.len() as u64 {
                    return Err(codec_err(
                        "gzip",
                        "page does not end where its stream ends".into(),
                    ));
                }
                Ok(d.total_out() as usize)
            })?,
            Codec::None => {
                if input.len() != want {
                    return Err(codec_err(
                        "none",
                        format!("stored page is {} bytes", input.len()),
                    ));
                }
                out.copy_from_slice(input);
                want
            }
        };
        if got != want {
            return Err(codec_err(
                self.name(),
                format!("page decompressed to {got} bytes, want {want}"),
            ));
        }
        Ok(())
    }
}

fn codec_err(codec: &'static str, reason: String) -> LtxError {
    LtxError::Codec { codec, reason }
}

thread_local! {
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static DEFLATE_C: RefCell<Option<(u32, flate2::Compress)>> = const { RefCell::new(None) };
    static DEFLATE_D: RefCell<Option<flate2::Decompress>> = const { RefCell::new(None) };
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Zstd(l) => write!(f, "zstd:{l}"),
            Codec::Gzip(l) => write!(f, "gzip:{l}"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Codec {
    type Err = String;

    /// Parses `lz4`, `none`, `zstd`, `zstd:LEVEL`, `gzip`, `gzip:LEVEL`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let level_in = |lo: i64, hi: i64, default: i64| -> Result<i64, String> {
            let Some(l) = level else { return Ok(default) };
            match l.parse::<i64>() {
                Ok(v) if (lo..=hi).contains(&v) => Ok(v),
                _ => Err(format!(
                    "compression level {l:?} for {name} must be {lo}..={hi}"
                )),
            }
        };
        match name {
            "lz4" | "none" if level.is_some() => Err(format!("{name} takes no level")),
            "lz4" => Ok(Codec::Lz4),
            "none" => Ok(Codec::None),
            "zstd" => Ok(Codec::Zstd(
                level_in(1, 19, DEFAULT_ZSTD_LEVEL as i64)? as i32
            )),
            "gzip" => Ok(Codec::Gzip(
                level_in(0, 9, DEFAULT_GZIP_LEVEL as i64)? as u32
            )),
            _ => Err(format!(
                "unknown compression {s:?} (expected lz4, zstd[:1-19], gzip[:0-9] or none)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_rejects_wrong_sizes() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        for codec in [
            Codec::Lz4,
            Codec::Zstd(1),
            Codec::Zstd(19),
            Codec::Gzip(1),
            Codec::Gzip(9),
            Codec::None,
        ] {
            let mut c = Vec::new();
            codec.compress(&page, &mut c).unwrap();
            let mut out = vec![0u8; 4096];
            codec.decompress(&c, &mut out).unwrap();
            assert_eq!(out, page, "{codec}");
            let mut short = vec![0u8; 2048];
            assert!(codec.decompress(&c, &mut short).is_err(), "{codec}");
            let mut big = vec![0u8; 8192];
            assert!(codec.decompress(&c, &mut big).is_err(), "{codec}");
        }
    }

    #[test]
    fn names_parse() {
        assert_eq!("zstd:7".parse::<Codec>().unwrap(), Codec::Zstd(7));
        assert_eq!("gzip".parse::<Codec>().unwrap(), Codec::Gzip(6));
        assert!("zstd:40".parse::<Codec>().is_err());
        assert!("lz4:1".parse::<Codec>().is_err());
        assert!("brotli".parse::<Codec>().is_err());
    }
}
