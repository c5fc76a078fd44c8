//! Tests for `replicad::replicate::maintenance::compactor`: golden Litestream replicas compacted into level-9
//! snapshots and L1 files must restore to exactly the bytes Litestream restored; synthetic
//! files check the header, checksum and latest-copy-wins rules; broken inputs are refused and
//! their output discarded.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use replicad::ltx::{
    self, Codec, Decoder, Encoder, HEADER_FLAG_CODEC_MASK, HEADER_FLAG_NO_CHECKSUM, Header,
    LtxError, TxId,
    checksum::{DbChecksum, page_checksum},
};
use replicad::replicate::maintenance::compactor::{
    CompactError, CompactOptions, CompactSummary, compact,
};
use replicad::util::fsutil;
use sha2::{Digest, Sha256};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5")
}

fn l0(scenario: &str, txid: u64) -> PathBuf {
    data_dir()
        .join(scenario)
        .join("replica/ltx/0")
        .join(ltx::format_filename(TxId(txid), TxId(txid)))
}

fn golden_snapshot_1_6(scenario: &str) -> PathBuf {
    data_dir()
        .join(scenario)
        .join("replica/ltx/9")
        .join(ltx::format_filename(TxId(1), TxId(6)))
}

fn expected_sha(scenario: &str, txid: u64) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(data_dir().join(scenario).join("expected.json")).unwrap())
            .unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["txid"].as_u64() == Some(txid))
        .unwrap_or_else(|| panic!("{scenario}: no step for TXID {txid}"))["restored_db_sha256"]
        .as_str()
        .unwrap()
        .to_string()
}

fn replicad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(args)
        .output()
        .expect("run replicad")
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

/// Restores `replica` (latest, or `txid`) into a new file and returns the file's sha256.
fn restore(replica: &Path, txid: Option<u64>) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("restored.db");
    let txid = txid.map(|t| format!("{t:016x}"));
    let mut args = vec!["restore", "--to", out.to_str().unwrap()];
    if let Some(t) = &txid {
        args.extend(["--txid", t.as_str()]);
    }
    args.push(replica.to_str().unwrap());
    let o = replicad(&args);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    Ok(sha256(&out))
}

fn level_path(replica: &Path, level: u8, min: u64, max: u64) -> PathBuf {
    replica
        .join("ltx")
        .join(level.to_string())
        .join(ltx::format_filename(TxId(min), TxId(max)))
}

fn open_all(paths: &[PathBuf]) -> Vec<Decoder<File>> {
    paths
        .iter()
        .map(|p| {
            Decoder::new(File::open(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect()
}

/// The way a caller uses `compact`: write `<dest>.tmp`, publish it only on success, delete it
/// on error.
fn compact_files(
    inputs: &[PathBuf],
    dest: &Path,
    opts: CompactOptions,
) -> Result<CompactSummary, CompactError> {
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let tmp = fsutil::tmp_path(dest);
    let mut f = File::create(&tmp).unwrap();
    match compact(open_all(inputs), &mut f, opts) {
        Ok(summary) => {
            drop(f);
            fsutil::publish(&tmp, dest).unwrap();
            Ok(summary)
        }
        Err(e) => {
            drop(f);
            fs::remove_file(&tmp).unwrap();
            Err(e)
        }
    }
}

fn lz4() -> CompactOptions {
    CompactOptions::default()
}

fn with_codec(codec: Codec) -> CompactOptions {
    CompactOptions {
        codec,
        ..CompactOptions::default()
    }
}

/// Decodes a whole file, checking it verifies; returns its header and pages.
fn read_all(bytes: &[u8]) -> (Header, Vec<(u32, Vec<u8>)>, u64) {
    let mut dec = Decoder::new(bytes).unwrap();
    let h = *dec.header();
    let mut buf = vec![0u8; h.page_size as usize];
    let mut pages = Vec::new();
    while let Some(pgno) = dec.next_page(&mut buf).unwrap() {
        pages.push((pgno, buf.clone()));
    }
    let t = dec.finish().unwrap();
    (h, pages, t.post_apply_checksum)
}

/// Compacts L0 1..=9 of `scenario` into a level-9 snapshot in a fresh replica; restore must
/// give Litestream's bytes at TXID 9 (latest and by TXID).
fn snapshot_from_l0(scenario: &str, opts: CompactOptions) -> CompactSummary {
    let dir = tempfile::tempdir().unwrap();
    let replica = dir.path().join("replica");
    let inputs: Vec<PathBuf> = (1..=9).map(|t| l0(scenario, t)).collect();
    let dest = level_path(&replica, 9, 1, 9);
    let s = compact_files(&inputs, &dest, opts).unwrap();

    let last = ltx::decoder::read_header(File::open(l0(scenario, 9)).unwrap()).unwrap();
    let h = s.header;
    assert_eq!((h.min_txid, h.max_txid), (TxId(1), TxId(9)));
    assert_eq!(h.commit, last.commit);
    assert_eq!(h.timestamp, last.timestamp);
    assert_eq!(h.page_size, last.page_size);
    assert_eq!(
        h.flags,
        HEADER_FLAG_NO_CHECKSUM | opts.codec.flag_bits(),
        "Litestream's inputs carry no checksums"
    );
    assert_eq!(h.pre_apply_checksum, 0);
    assert_eq!(
        (h.wal_offset, h.wal_size, h.wal_salt1, h.wal_salt2),
        (0, 0, 0, 0)
    );
    assert_eq!(s.trailer.post_apply_checksum, 0);
    assert_eq!(s.pages, h.commit, "a snapshot holds every page");
    assert_eq!(s.bytes_written, fs::metadata(&dest).unwrap().len());
    let (dh, pages, _) = read_all(&fs::read(&dest).unwrap());
    assert_eq!(dh, h);
    assert_eq!(pages.len() as u32, s.pages);
    assert!(!fsutil::tmp_path(&dest).exists());

    let want = expected_sha(scenario, 9);
    assert_eq!(restore(&replica, None).unwrap(), want, "{scenario} latest");
    assert_eq!(
        restore(&replica, Some(9)).unwrap(),
        want,
        "{scenario} txid 9"
    );
    s
}

/// Compacts L0 7..=9 into one L1 file beside a copy of the golden level-9 snapshot 1-6 (the
/// L0 files are not copied): restore at 9 and at 6 must match, 7 and 8 are gone.
fn l1_beside_golden_snapshot(scenario: &str, opts: CompactOptions) -> CompactSummary {
    let dir = tempfile::tempdir().unwrap();
    let replica = dir.path().join("replica");
    let snap = level_path(&replica, 9, 1, 6);
    fs::create_dir_all(snap.parent().unwrap()).unwrap();
    fs::copy(golden_snapshot_1_6(scenario), &snap).unwrap();
    let inputs: Vec<PathBuf> = (7..=9).map(|t| l0(scenario, t)).collect();
    let dest = level_path(&replica, 1, 7, 9);
    let s = compact_files(&inputs, &dest, opts).unwrap();
    assert_eq!((s.header.min_txid, s.header.max_txid), (TxId(7), TxId(9)));
    assert_eq!(s.header.pre_apply_checksum, 0);
    // Every golden L0 file is full; pages past TXID 9's commit (the database shrank at 8 and
    // grew again at 9) are dropped.
    assert_eq!(s.pages, s.header.commit);
    assert!(!replica.join("ltx/0").exists());

    let want = expected_sha(scenario, 9);
    assert_eq!(restore(&replica, None).unwrap(), want, "{scenario} latest");
    assert_eq!(
        restore(&replica, Some(9)).unwrap(),
        want,
        "{scenario} txid 9"
    );
    assert_eq!(
        restore(&replica, Some(6)).unwrap(),
        expected_sha(scenario, 6),
        "{scenario} txid 6"
    );
    let err = restore(&replica, Some(8)).unwrap_err();
    assert!(err.contains("compaction boundaries"), "{err}");
    s
}

#[test]
fn basic_4k_l0_into_level9_snapshot_restores_exactly() {
    let s = snapshot_from_l0("basic-4k", lz4());
    assert_eq!(s.recompressed_pages, 0, "lz4 blocks are copied as stored");
}

#[test]
fn basic_4k_l0_into_l1_beside_golden_snapshot_restores_exactly() {
    let s = l1_beside_golden_snapshot("basic-4k", lz4());
    assert_eq!(s.recompressed_pages, 0);
}

#[test]
fn basic_64k_compacts_too() {
    snapshot_from_l0("basic-64k", lz4());
    l1_beside_golden_snapshot("basic-64k", lz4());
}

#[test]
fn zstd_output_is_recompressed_and_restores_exactly() {
    let s = snapshot_from_l0("basic-4k", with_codec(Codec::Zstd(3)));
    assert_eq!(s.header.flags & HEADER_FLAG_CODEC_MASK, 0x100);
    assert_eq!(
        s.recompressed_pages, s.pages,
        "lz4 -> zstd recompresses every page"
    );
    let s = l1_beside_golden_snapshot("basic-4k", with_codec(Codec::Zstd(3)));
    assert_eq!(s.recompressed_pages, s.pages);
    l1_beside_golden_snapshot("basic-4k", with_codec(Codec::Gzip(6)));
    l1_beside_golden_snapshot("basic-4k", with_codec(Codec::None));
}

#[test]
fn zstd_inputs_pass_through_and_convert_back_to_lz4() {
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<PathBuf> = (1..=9).map(|t| l0("basic-4k", t)).collect();
    let zstd = dir.path().join("zstd.ltx");
    let first = compact_files(&inputs, &zstd, with_codec(Codec::Zstd(3))).unwrap();

    // zstd -> zstd (another level): blocks are copied, the file is identical.
    let again = dir.path().join("again.ltx");
    let s = compact_files(
        std::slice::from_ref(&zstd),
        &again,
        with_codec(Codec::Zstd(19)),
    )
    .unwrap();
    assert_eq!(s.recompressed_pages, 0);
    assert_eq!(s.pages, first.pages);
    assert_eq!(fs::read(&again).unwrap(), fs::read(&zstd).unwrap());

    // zstd -> lz4: every page recompressed, and the result restores exactly.
    let replica = dir.path().join("replica");
    let dest = level_path(&replica, 9, 1, 9);
    let s = compact_files(&[zstd], &dest, lz4()).unwrap();
    assert_eq!(s.recompressed_pages, s.pages);
    assert_eq!(s.header.flags, HEADER_FLAG_NO_CHECKSUM);
    assert_eq!(
        restore(&replica, None).unwrap(),
        expected_sha("basic-4k", 9)
    );
}

/// An lz4 -> lz4 compaction copies every stored block byte for byte: with a single input the
/// output is the input file itself.
#[test]
fn single_lz4_input_is_reproduced_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for txid in [1, 5, 9] {
        let input = l0("basic-4k", txid);
        let dest = dir.path().join(format!("{txid}.ltx"));
        let s = compact_files(std::slice::from_ref(&input), &dest, lz4()).unwrap();
        assert_eq!(s.recompressed_pages, 0);
        let (ih, ipages, _) = read_all(&fs::read(&input).unwrap());
        let (oh, opages, _) = read_all(&fs::read(&dest).unwrap());
        // Golden L0 files carry WAL fields, which a compaction zeroes.
        assert_eq!(
            Header {
                wal_offset: 0,
                wal_size: 0,
                wal_salt1: 0,
                wal_salt2: 0,
                ..ih
            },
            oh
        );
        assert_eq!(ipages, opages);
        assert_eq!(
            fs::read(&dest).unwrap()[100..fs::metadata(&dest).unwrap().len() as usize - 8],
            fs::read(&input).unwrap()[100..fs::metadata(&input).unwrap().len() as usize - 8],
            "pages, index and post-apply checksum are copied as stored"
        );
    }
}

#[test]
fn legacy_frame_pages_become_block_pages() {
    let s = snapshot_from_l0("legacy-frames-4k", lz4());
    assert_eq!(
        s.recompressed_pages, s.pages,
        "legacy LZ4-frame pages cannot be copied into a block file"
    );
    let s = l1_beside_golden_snapshot("legacy-frames-4k", lz4());
    assert_eq!(s.recompressed_pages, s.pages);
    l1_beside_golden_snapshot("legacy-frames-4k", with_codec(Codec::Zstd(3)));
}

/// Every golden L0 file is full, so L0 7..=9 with the min TXID overridden to 1 is a valid
/// snapshot of TXID 9.
#[test]
fn min_txid_override_makes_a_snapshot_from_a_full_state() {
    let dir = tempfile::tempdir().unwrap();
    let replica = dir.path().join("replica");
    let inputs: Vec<PathBuf> = (7..=9).map(|t| l0("basic-4k", t)).collect();
    let dest = level_path(&replica, 9, 1, 9);
    let opts = CompactOptions {
        min_txid: Some(TxId(1)),
        timestamp: Some(1_800_000_000_000),
        ..lz4()
    };
    let s = compact_files(&inputs, &dest, opts).unwrap();
    assert_eq!((s.header.min_txid, s.header.max_txid), (TxId(1), TxId(9)));
    assert!(s.header.is_snapshot());
    assert_eq!(s.header.timestamp, 1_800_000_000_000);
    assert_eq!(
        restore(&replica, None).unwrap(),
        expected_sha("basic-4k", 9)
    );

    let err = compact_files(
        &inputs,
        &dir.path().join("x.ltx"),
        CompactOptions {
            min_txid: Some(TxId(3)),
            ..lz4()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CompactError::InvalidMinTxId {
                requested: TxId(3),
                first_min: TxId(7)
            }
        ),
        "{err}"
    );
}

fn assert_discarded(dest: &Path) {
    assert!(!dest.exists(), "{} must not be published", dest.display());
    assert!(
        !fsutil::tmp_path(dest).exists(),
        "the temp file must be deleted"
    );
}

#[test]
fn gaps_unsorted_inputs_and_no_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("out.ltx");
    let err = compact_files(&[l0("basic-4k", 7), l0("basic-4k", 9)], &dest, lz4()).unwrap_err();
    assert!(
        matches!(
            err,
            CompactError::Gap {
                after: TxId(7),
                next_min: TxId(9)
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("0000000000000008 to 0000000000000008 are missing"),
        "{msg}"
    );
    assert_discarded(&dest);

    let err = compact_files(&[l0("basic-4k", 8), l0("basic-4k", 7)], &dest, lz4()).unwrap_err();
    assert!(
        matches!(err, CompactError::NotAscending { index: 1, .. }),
        "{err:?}"
    );
    let err = compact_files(&[l0("basic-4k", 7), l0("basic-4k", 7)], &dest, lz4()).unwrap_err();
    assert!(
        matches!(err, CompactError::NotAscending { index: 1, .. }),
        "{err:?}"
    );
    assert_discarded(&dest);

    let mut out = Vec::new();
    let err = compact(Vec::<Decoder<File>>::new(), &mut out, lz4()).unwrap_err();
    assert!(matches!(err, CompactError::NoInputs), "{err:?}");
    assert!(out.is_empty());

    // A decoder that already handed out pages would make the merge miss them.
    let mut dec = Decoder::new(File::open(l0("basic-4k", 7)).unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    dec.next_page(&mut buf).unwrap();
    let err = compact(vec![dec], &mut out, lz4()).unwrap_err();
    assert!(
        matches!(err, CompactError::AlreadyRead { index: 0, pages: 1 }),
        "{err:?}"
    );
}

#[test]
fn page_size_mismatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("out.ltx");
    let err = compact_files(&[l0("basic-4k", 7), l0("basic-64k", 8)], &dest, lz4()).unwrap_err();
    assert!(
        matches!(
            err,
            CompactError::PageSize {
                index: 1,
                expected: 4096,
                found: 65536,
                ..
            }
        ),
        "{err:?}"
    );
    assert_discarded(&dest);
}

/// A corrupt input fails the compaction, names the input, and the unfinished output is not a
/// valid LTX file even if a caller forgot to delete it.
#[test]
fn corrupt_inputs_are_refused_and_the_output_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let inputs: Vec<PathBuf> = (7..=9).map(|t| l0("basic-4k", t)).collect();
    // Flip a byte of a page payload (middle of file 8), then of the trailer's file checksum
    // (last byte of file 9, noticed only when the input is finished, after every page).
    for (victim, at_end) in [(1usize, false), (2, true)] {
        let mut bytes = fs::read(&inputs[victim]).unwrap();
        let at = if at_end {
            bytes.len() - 1
        } else {
            bytes.len() / 2
        };
        bytes[at] ^= 0x40;
        let broken = dir.path().join(format!("broken-{victim}.ltx"));
        fs::write(&broken, &bytes).unwrap();
        let mut files = inputs.clone();
        files[victim] = broken;

        let dest = dir.path().join(format!("out-{victim}.ltx"));
        let err = compact_files(&files, &dest, lz4()).unwrap_err();
        match &err {
            CompactError::Ltx {
                index,
                min_txid,
                source,
                ..
            } => {
                assert_eq!(*index, victim);
                assert_eq!(min_txid.0, 7 + victim as u64);
                if at_end {
                    assert!(
                        matches!(source, LtxError::ChecksumMismatch { .. }),
                        "{source:?}"
                    );
                }
            }
            other => panic!("expected an input error, got {other:?}"),
        }
        assert!(
            err.to_string().contains(&format!("input {victim}")),
            "{err}"
        );
        assert_discarded(&dest);

        // Without the temp file discipline: what was written does not decode.
        let mut out = Vec::new();
        assert!(compact(open_all(&files), &mut out, lz4()).is_err());
        let verified = Decoder::new(&out[..]).and_then(|d| d.finish());
        assert!(verified.is_err(), "an unfinished output must not verify");
    }
}

// ---- Synthetic files: checksums, latest copy wins, shrink, snapshot coverage. ----

const PS: usize = 512;

fn page(tag: u8, pgno: u32) -> Vec<u8> {
    let mut p = vec![tag; PS];
    p[..4].copy_from_slice(&pgno.to_be_bytes());
    p
}

/// A database as page number -> content, for computing real rolling checksums.
type Db = std::collections::BTreeMap<u32, Vec<u8>>;

fn db_checksum(db: &Db) -> u64 {
    let mut c = DbChecksum::default();
    for (pgno, data) in db {
        c.toggle(page_checksum(*pgno, data));
    }
    c.value()
}

/// Applies `pages` to `db`, truncated to `commit`, and encodes them as TXID `txid`.
fn encode_step(
    db: &mut Db,
    txid: u64,
    commit: u32,
    pages: &[(u32, u8)],
    codec: Codec,
    checksums: bool,
) -> Vec<u8> {
    let pre = db_checksum(db);
    for &(pgno, tag) in pages {
        db.insert(pgno, page(tag, pgno));
    }
    db.retain(|&p, _| p <= commit);
    let header = Header {
        flags: if checksums {
            0
        } else {
            HEADER_FLAG_NO_CHECKSUM
        },
        page_size: PS as u32,
        commit,
        min_txid: TxId(txid),
        max_txid: TxId(txid),
        timestamp: 1_000 + txid as i64,
        pre_apply_checksum: if checksums && txid > 1 { pre } else { 0 },
        ..Header::default()
    };
    let mut enc = Encoder::new(Vec::new(), header, codec).unwrap();
    for &(pgno, tag) in pages {
        enc.encode_page(pgno, &page(tag, pgno)).unwrap();
    }
    let post = if checksums { db_checksum(db) } else { 0 };
    enc.finish(post).unwrap().0
}

fn decoders<'a>(files: &[&'a Vec<u8>]) -> Vec<Decoder<&'a [u8]>> {
    files
        .iter()
        .map(|f| Decoder::new(&f[..]).unwrap())
        .collect()
}

#[test]
fn synthetic_merge_keeps_checksums_latest_copies_and_drops_pages_past_commit() {
    let mut db = Db::new();
    // 1: snapshot of 4 pages (zstd). 2: grows to 6 (lz4). 3: shrinks to 5 (no compression).
    let a = encode_step(
        &mut db,
        1,
        4,
        &[(1, 0xa1), (2, 0xa2), (3, 0xa3), (4, 0xa4)],
        Codec::Zstd(3),
        true,
    );
    let after_a = db.clone();
    let b = encode_step(
        &mut db,
        2,
        6,
        &[(2, 0xb2), (5, 0xb5), (6, 0xb6)],
        Codec::Lz4,
        true,
    );
    let c = encode_step(&mut db, 3, 5, &[(1, 0xc1), (3, 0xc3)], Codec::None, true);
    let final_db = db.clone();

    let mut out = Vec::new();
    let s = compact(decoders(&[&a, &b, &c]), &mut out, lz4()).unwrap();
    assert_eq!(s.bytes_written, out.len() as u64);
    let (h, pages, post) = read_all(&out);
    assert_eq!(h, s.header);
    assert_eq!((h.min_txid, h.max_txid, h.commit), (TxId(1), TxId(3), 5));
    assert_eq!(h.flags, 0, "all inputs carry checksums");
    assert_eq!(h.pre_apply_checksum, 0);
    assert_eq!(h.timestamp, 1_003);
    assert_eq!(post, db_checksum(&final_db));
    assert_eq!(post, s.trailer.post_apply_checksum);
    let want: Vec<(u32, Vec<u8>)> = final_db.into_iter().collect();
    assert_eq!(pages, want, "latest copy of every page, page 6 dropped");
    assert_eq!(s.pages, 5);
    // Pages 2 and 5 come from the lz4 file as stored; 1, 3 (none) and 4 (zstd) are re-encoded.
    assert_eq!(s.recompressed_pages, 3);

    // Without the snapshot: pre-apply is the state after TXID 1.
    let mut out = Vec::new();
    let s = compact(decoders(&[&b, &c]), &mut out, lz4()).unwrap();
    let (h, pages, post) = read_all(&out);
    assert_eq!((h.min_txid, h.max_txid), (TxId(2), TxId(3)));
    assert_eq!(h.pre_apply_checksum, db_checksum(&after_a));
    assert_eq!(post, db_checksum(&db));
    let got: Vec<(u32, u8)> = pages.iter().map(|(p, d)| (*p, d[PS - 1])).collect();
    assert_eq!(got, vec![(1, 0xc1), (2, 0xb2), (3, 0xc3), (5, 0xb5)]);
    assert_eq!(s.pages, 4);

    // ... and it cannot be turned into a snapshot: page 4 is only in TXID 1.
    let mut out = Vec::new();
    let opts = CompactOptions {
        min_txid: Some(TxId(1)),
        ..lz4()
    };
    let err = compact(decoders(&[&b, &c]), &mut out, opts).unwrap_err();
    assert!(
        matches!(
            err,
            CompactError::NotFullSnapshot {
                missing: 4,
                commit: 5
            }
        ),
        "{err:?}"
    );

    // One input without checksums makes the output NoChecksum.
    let mut db2 = after_a.clone();
    let b_plain = encode_step(
        &mut db2,
        2,
        6,
        &[(2, 0xb2), (5, 0xb5), (6, 0xb6)],
        Codec::Lz4,
        false,
    );
    let mut out = Vec::new();
    let s = compact(decoders(&[&b_plain, &c]), &mut out, lz4()).unwrap();
    assert_eq!(s.header.flags, HEADER_FLAG_NO_CHECKSUM);
    assert_eq!(s.header.pre_apply_checksum, 0);
    assert_eq!(s.trailer.post_apply_checksum, 0);
    let (_, _, post) = read_all(&out);
    assert_eq!(post, 0);
}

/// Overlapping inputs (a later file re-covering earlier TXIDs) are allowed, as upstream.
#[test]
fn overlapping_inputs_are_merged() {
    let mut db = Db::new();
    let a = encode_step(&mut db, 1, 2, &[(1, 1), (2, 2)], Codec::Lz4, false);
    let mut db_b = db.clone();
    let b = encode_step(&mut db_b, 2, 2, &[(2, 3)], Codec::Lz4, false);
    let c = encode_step(&mut db_b, 3, 3, &[(3, 4)], Codec::Lz4, false);
    // b+c compacted into 2-3, then merged with a and b again: 1-1, 2-3.
    let mut bc = Vec::new();
    compact(decoders(&[&b, &c]), &mut bc, lz4()).unwrap();
    let mut out = Vec::new();
    let s = compact(decoders(&[&a, &b, &bc]), &mut out, lz4()).unwrap();
    assert_eq!((s.header.min_txid, s.header.max_txid), (TxId(1), TxId(3)));
    let (_, pages, _) = read_all(&out);
    let got: Vec<(u32, u8)> = pages.iter().map(|(p, d)| (*p, d[PS - 1])).collect();
    assert_eq!(got, vec![(1, 1), (2, 3), (3, 4)]);
}
