//! LTX codec throughput: page encoding, decoding with verification, and the real restore path.
//!
//! Groups (throughput is in *database* bytes, i.e. uncompressed pages):
//! - `encode/<codec>/page=<size>`: one snapshot segment (1024 x 4 KiB or 64 x 64 KiB pages)
//!   written into memory.
//! - `decode/<codec>/page=<size>`: the same segment decoded from memory and verified
//!   (`Decoder::finish`: file checksum, page index, trailer).
//! - `restore_apply/<codec>`: `restore::plan` + `restore::apply` from a file replica (a 16 MiB
//!   level-9 snapshot plus four level-0 files) into a fresh output, `integrity_check` off
//!   (the pages are synthetic, not a real SQLite database).
//!
//! Pages look like SQLite table leaves: a small header, a cell pointer array, rows of varied
//! printable text (names, e-mails, timestamps, sentences) with a random 8-byte blob each, and
//! 8-33% free space, so they compress 2-3.5x (lz4 about 2x at 4 KiB) rather than collapsing
//! like zeros. The compression ratio of each codec is printed once per run.
//!
//! Run: `cargo bench --bench ltx_codec` (about two minutes on two cores).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
    measurement::WallTime,
};
use replicad::ltx::{self, Codec, Decoder, Encoder, HEADER_FLAG_NO_CHECKSUM, Header, TxId};
use replicad::restore::{self, RestoreOptions, Target};
use replicad::storage::file::FileClient;
use replicad::storage::{AnyClient, SNAPSHOT_LEVEL};

const CODECS: [Codec; 5] = [
    Codec::Lz4,
    Codec::Zstd(1),
    Codec::Zstd(3),
    Codec::Gzip(6),
    Codec::None,
];

/// (page size, pages per segment): 4 MiB of database either way.
const SEGMENTS: [(u32, u32); 2] = [(4096, 1024), (65536, 64)];

/// A small deterministic PRNG (splitmix64), so every run benchmarks the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const FIRST: &[&str] = &[
    "ada", "alan", "barbara", "carl", "dennis", "edsger", "frances", "grace", "hedy", "ivan",
    "john", "ken", "leslie", "margaret", "niklaus", "olga", "peter", "radia", "sophie", "tim",
];
const CITIES: &[&str] = &[
    "Lisbon", "Osaka", "Nairobi", "Quito", "Tallinn", "Perth", "Lagos", "Oslo", "Lima", "Pune",
];
const WORDS: &[&str] = &[
    "order",
    "shipped",
    "pending",
    "invoice",
    "refund",
    "customer",
    "warehouse",
    "priority",
    "fragile",
    "express",
    "returned",
    "address",
    "updated",
    "payment",
    "received",
    "delayed",
    "weather",
    "carrier",
    "signed",
    "package",
    "label",
    "printed",
    "batch",
    "quantity",
    "discount",
    "applied",
    "coupon",
    "expired",
    "review",
    "stars",
    "the",
    "a",
    "of",
    "and",
    "to",
    "with",
    "for",
    "on",
    "was",
    "is",
];

/// Appends one row of text-like data plus a random blob to `out`.
fn push_row(rng: &mut Rng, id: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    let first = rng.pick(FIRST);
    let _ = write!(
        out,
        "{id}\x1f{first}_{}\x1f{first}.{}@example.com\x1f{}\x1f2026-{:02}-{:02}T{:02}:{:02}:{:02}Z\x1f",
        rng.below(10_000),
        rng.below(1000),
        rng.pick(CITIES),
        1 + rng.below(12),
        1 + rng.below(28),
        rng.below(24),
        rng.below(60),
        rng.below(60),
    );
    for i in 0..3 + rng.below(10) {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(rng.pick(WORDS).as_bytes());
    }
    out.push(0x1f);
    // A random 8-byte blob (a hash or token) in every row.
    out.extend_from_slice(&rng.next().to_le_bytes());
}

/// One SQLite-like table leaf page: header, cell pointers growing up, cells growing down,
/// filled to 67-92% (B-tree pages after splits are rarely full); the gap stays zeroed.
fn make_page(rng: &mut Rng, page_size: usize, first_id: &mut u64) -> Vec<u8> {
    let mut page = vec![0u8; page_size];
    page[0] = 0x0d;
    let mut ptr = 8usize;
    let mut end = page_size;
    let free_target = page_size * (8 + rng.below(26)) / 100;
    let mut cell = Vec::with_capacity(256);
    loop {
        cell.clear();
        push_row(rng, *first_id, &mut cell);
        if end < cell.len() + ptr + 2 + free_target {
            break;
        }
        end -= cell.len();
        page[end..end + cell.len()].copy_from_slice(&cell);
        page[ptr..ptr + 2].copy_from_slice(&(end as u16).to_be_bytes());
        ptr += 2;
        *first_id += 1;
    }
    let cells = ((ptr - 8) / 2) as u16;
    page[3..5].copy_from_slice(&cells.to_be_bytes());
    page[5..7].copy_from_slice(&(end as u16).to_be_bytes());
    page
}

fn make_pages(seed: u64, page_size: u32, count: u32) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    let mut id = 1;
    (0..count)
        .map(|_| make_page(&mut rng, page_size as usize, &mut id))
        .collect()
}

fn header(page_size: u32, commit: u32, min: u64, max: u64) -> Header {
    Header {
        flags: HEADER_FLAG_NO_CHECKSUM,
        page_size,
        commit,
        min_txid: TxId(min),
        max_txid: TxId(max),
        timestamp: 1_767_225_600_000 + max as i64,
        ..Header::default()
    }
}

/// Encodes `pages` (numbered from 1, skipping the lock page) as a snapshot segment.
fn encode_snapshot(pages: &[Vec<u8>], page_size: u32, max: u64, codec: Codec) -> Vec<u8> {
    let commit = pages.len() as u32;
    let mut enc = Encoder::new(
        Vec::with_capacity(pages.len() * page_size as usize),
        header(page_size, commit, 1, max),
        codec,
    )
    .expect("header");
    for (i, page) in pages.iter().enumerate() {
        enc.encode_page(i as u32 + 1, page).expect("page");
    }
    enc.finish(0).expect("finish").0
}

fn decode_all(bytes: &[u8], page_size: u32) -> u32 {
    let mut dec = Decoder::new(bytes).expect("header");
    let mut buf = vec![0u8; page_size as usize];
    let mut n = 0;
    while let Some(pgno) = dec.next_page(&mut buf).expect("page") {
        n += pgno & 1;
        black_box(&buf);
    }
    dec.finish().expect("verify");
    n
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500));
}

fn bench_codec(c: &mut Criterion) {
    let segments: Vec<(u32, Vec<Vec<u8>>)> = SEGMENTS
        .iter()
        .map(|&(size, count)| (size, make_pages(u64::from(size), size, count)))
        .collect();

    for &(size, ref pages) in &segments {
        let raw = pages.len() as u64 * u64::from(size);
        for codec in CODECS {
            let file = encode_snapshot(pages, size, 1, codec);
            eprintln!(
                "ratio {:>7} page={size:<5}: {:.2}x ({raw} -> {} bytes)",
                codec.to_string(),
                raw as f64 / file.len() as f64,
                file.len()
            );
        }
    }

    let mut group = c.benchmark_group("encode");
    configure(&mut group);
    for &(size, ref pages) in &segments {
        group.throughput(Throughput::Bytes(pages.len() as u64 * u64::from(size)));
        for codec in CODECS {
            group.bench_function(format!("{codec}/page={size}"), |b| {
                b.iter(|| black_box(encode_snapshot(pages, size, 1, codec)).len())
            });
        }
    }
    group.finish();

    let mut group = c.benchmark_group("decode");
    configure(&mut group);
    for &(size, ref pages) in &segments {
        group.throughput(Throughput::Bytes(pages.len() as u64 * u64::from(size)));
        for codec in CODECS {
            let file = encode_snapshot(pages, size, 1, codec);
            group.bench_function(format!("{codec}/page={size}"), |b| {
                b.iter(|| decode_all(black_box(&file), size))
            });
        }
    }
    group.finish();
}

/// Database of the restore bench: 16 MiB of 4 KiB pages.
const RESTORE_PAGE_SIZE: u32 = 4096;
const RESTORE_PAGES: u32 = 4096;
/// Level-0 files after the snapshot, each rewriting a spread of pages.
const RESTORE_L0_FILES: u64 = 4;
const RESTORE_L0_PAGES: u32 = 64;

/// Writes a file replica: snapshot `1-5` at level 9, then L0 files `6`..=`9`.
fn build_replica(root: &Path, codec: Codec) {
    let client = FileClient::new(root.to_path_buf());
    let snapshot_max = 5;
    let pages = make_pages(42, RESTORE_PAGE_SIZE, RESTORE_PAGES);
    let dir = client.level_dir(SNAPSHOT_LEVEL);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let bytes = encode_snapshot(&pages, RESTORE_PAGE_SIZE, snapshot_max, codec);
    std::fs::write(
        dir.join(ltx::format_filename(TxId(1), TxId(snapshot_max))),
        bytes,
    )
    .expect("write snapshot");

    let dir = client.level_dir(0);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut rng = Rng(7);
    let mut id = 1_000_000;
    for k in 0..RESTORE_L0_FILES {
        let txid = snapshot_max + 1 + k;
        let h = header(RESTORE_PAGE_SIZE, RESTORE_PAGES, txid, txid);
        let mut enc = Encoder::new(Vec::new(), h, codec).expect("header");
        let stride = RESTORE_PAGES / RESTORE_L0_PAGES;
        for i in 0..RESTORE_L0_PAGES {
            let pgno = 1 + i * stride + k as u32;
            let page = make_page(&mut rng, RESTORE_PAGE_SIZE as usize, &mut id);
            enc.encode_page(pgno, &page).expect("page");
        }
        let bytes = enc.finish(0).expect("finish").0;
        std::fs::write(
            dir.join(ltx::format_filename(TxId(txid), TxId(txid))),
            bytes,
        )
        .expect("write l0");
    }
}

fn bench_restore(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("restore_apply");
    configure(&mut group);
    group.throughput(Throughput::Bytes(
        u64::from(RESTORE_PAGES) * u64::from(RESTORE_PAGE_SIZE),
    ));
    for codec in [Codec::Lz4, Codec::Zstd(3), Codec::Gzip(6), Codec::None] {
        let root = tmp.path().join(format!("replica-{}", codec.name()));
        build_replica(&root, codec);
        let client = AnyClient::File(FileClient::new(root));
        let out: PathBuf = tmp.path().join(format!("restored-{}.db", codec.name()));
        let opts = RestoreOptions {
            to: out.clone(),
            target: Target::Latest,
            force: true,
            integrity_check: false,
            phases: Default::default(),
            threads: None,
        };
        group.bench_function(codec.to_string(), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let _ = std::fs::remove_file(&out);
                    let start = Instant::now();
                    let report = rt.block_on(async {
                        let plan = restore::plan(&client, Target::Latest).await?;
                        restore::apply(&client, plan, &opts).await
                    });
                    total += start.elapsed();
                    let report = report.expect("restore");
                    assert_eq!(report.pages, RESTORE_PAGES);
                    assert_eq!(report.files.len(), 1 + RESTORE_L0_FILES as usize);
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_codec, bench_restore);
criterion_main!(benches);
