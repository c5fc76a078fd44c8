use super::*;
use crate::ltx::Header;
use chrono::DateTime;

fn file(level: u8, min: u64, max: u64) -> LtxFileInfo {
    LtxFileInfo {
        level,
        min_txid: TxId(min),
        max_txid: TxId(max),
        size: 1,
        created_at: DateTime::default(),
        encrypted: false,
    }
}

fn ranges(ext: &Extension) -> Vec<(u8, u64, u64)> {
    ext.files
        .iter()
        .map(|f| (f.level, f.min_txid.0, f.max_txid.0))
        .collect()
}

#[test]
fn level0_chain_from_the_follower_txid() {
    let files = [
        file(0, 1, 1),
        file(0, 2, 2),
        file(0, 3, 3),
        file(0, 4, 4),
        file(9, 1, 3),
    ];
    let ext = extend_chain(&files, TxId(2));
    assert_eq!(ranges(&ext), vec![(0, 3, 3), (0, 4, 4)]);
    assert_eq!(ext.gap, None);
}

#[test]
fn up_to_date_or_empty_listing_is_nothing_to_do() {
    let files = [file(0, 1, 1), file(0, 2, 2)];
    assert_eq!(
        extend_chain(&files, TxId(2)),
        Extension {
            files: vec![],
            gap: None
        }
    );
    assert_eq!(extend_chain(&[], TxId(7)).files, vec![]);
    assert_eq!(extend_chain(&[], TxId(7)).gap, None);
    // A replica behind the follower offers nothing either (the caller reports it).
    assert_eq!(extend_chain(&files, TxId(9)).files, vec![]);
}

#[test]
fn retired_level0_files_are_bridged_from_a_higher_level() {
    // L0 6..=8 were compacted into L1 and retired; the L1 file overlaps what we have.
    let files = [file(1, 1, 5), file(1, 4, 8), file(0, 9, 9), file(0, 10, 10)];
    let ext = extend_chain(&files, TxId(5));
    assert_eq!(ranges(&ext), vec![(1, 4, 8), (0, 9, 9), (0, 10, 10)]);
    assert_eq!(ext.gap, None);
}

#[test]
fn furthest_reach_wins_then_smallest_download_then_higher_level() {
    let files = [
        file(0, 6, 6),
        file(0, 7, 7),
        file(1, 6, 7),
        file(2, 1, 7),
        file(0, 8, 8),
    ];
    // L1 6-7 and L2 1-7 both reach 7: the later start (less history to download) wins.
    let ext = extend_chain(&files, TxId(5));
    assert_eq!(ranges(&ext), vec![(1, 6, 7), (0, 8, 8)]);
    // ... unless it is the bigger object.
    let mut sized = files.to_vec();
    sized[2].size = 100;
    sized[3].size = 50;
    assert_eq!(
        ranges(&extend_chain(&sized, TxId(5))),
        vec![(2, 1, 7), (0, 8, 8)]
    );
    // Same range at two levels: the higher level.
    let files = [file(0, 6, 7), file(3, 6, 7)];
    assert_eq!(ranges(&extend_chain(&files, TxId(5))), vec![(3, 6, 7)]);
}

#[test]
fn a_hole_stops_the_chain_and_is_named() {
    let files = [file(0, 5, 5), file(0, 6, 6), file(0, 9, 9), file(0, 10, 10)];
    let ext = extend_chain(&files, TxId(5));
    assert_eq!(ranges(&ext), vec![(0, 6, 6)]);
    assert_eq!(ext.gap, Some((TxId(7), TxId(8))));
    // Nothing applicable at all.
    let ext = extend_chain(&[file(0, 9, 9)], TxId(5));
    assert_eq!(ranges(&ext), vec![]);
    assert_eq!(ext.gap, Some((TxId(6), TxId(8))));
}

#[test]
fn a_snapshot_is_the_last_resort() {
    // Incremental files continue the chain: the snapshot (same reach) is not downloaded.
    let files = [file(9, 1, 8), file(0, 6, 6), file(0, 7, 7), file(0, 8, 8)];
    assert_eq!(
        ranges(&extend_chain(&files, TxId(5))),
        vec![(0, 6, 6), (0, 7, 7), (0, 8, 8)]
    );
    // Only a snapshot reaches past the hole: take the newest, then continue from it.
    let files = [
        file(9, 1, 4),
        file(9, 1, 8),
        file(0, 8, 8),
        file(0, 9, 9),
        file(0, 10, 10),
    ];
    let ext = extend_chain(&files, TxId(5));
    assert_eq!(ranges(&ext), vec![(9, 1, 8), (0, 9, 9), (0, 10, 10)]);
    assert_eq!(ext.gap, None);
    // A snapshot no newer than the follower is useless.
    let ext = extend_chain(&[file(9, 1, 5), file(0, 8, 8)], TxId(5));
    assert_eq!(ranges(&ext), vec![]);
    assert_eq!(ext.gap, Some((TxId(6), TxId(7))));
}

#[test]
fn the_largest_txid_does_not_overflow() {
    let files = [file(0, 1, u64::MAX)];
    assert_eq!(
        ranges(&extend_chain(&files, TxId(3))),
        vec![(0, 1, u64::MAX)]
    );
    let ext = extend_chain(&files, TxId(u64::MAX));
    assert!(ext.files.is_empty() && ext.gap.is_none());
}

#[test]
fn txid_file_round_trip_and_header_patch() {
    let dir = tempfile::tempdir().unwrap();
    let p = txid_path(&dir.path().join("db.sqlite"));
    assert!(p.ends_with("db.sqlite-txid"));
    assert_eq!(read_txid(&p).unwrap(), None);
    write_txid(&p, TxId(0x1f)).unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), "000000000000001f\n");
    assert_eq!(read_txid(&p).unwrap(), Some(TxId(0x1f)));
    fs::write(&p, "zz\n").unwrap();
    assert!(read_txid(&p).is_err());

    let mut hdr = [0u8; 100];
    hdr[..16].copy_from_slice(b"SQLite format 3\0");
    hdr[16..18].copy_from_slice(&1u16.to_be_bytes());
    hdr[18] = 2;
    hdr[19] = 2;
    hdr[24..28].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(db_page_size(&hdr), Some(65536));
    let next = change_counter(&hdr).wrapping_add(1);
    patch_page1(&mut hdr, next);
    assert_eq!((hdr[18], hdr[19]), (1, 1));
    assert_eq!(change_counter(&hdr), 0);
    hdr[16..18].copy_from_slice(&1000u16.to_be_bytes());
    assert_eq!(db_page_size(&hdr), None);
    hdr[0] = b'X';
    assert_eq!(db_page_size(&hdr), None);
}

/// A database of `rows` rows in table `t`, in rollback-journal mode, at `path`; its pages.
fn rollback_db(path: &Path, rows: u32) -> Vec<Vec<u8>> {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch("PRAGMA page_size=4096; PRAGMA journal_mode=DELETE; CREATE TABLE t (v BLOB)")
        .unwrap();
    for _ in 0..rows {
        c.execute("INSERT INTO t VALUES (zeroblob(900))", [])
            .unwrap();
    }
    drop(c);
    fs::read(path)
        .unwrap()
        .chunks(4096)
        .map(<[u8]>::to_vec)
        .collect()
}

/// Rows in `t`, read by a connection that does not wait for a lock.
fn rows_now(path: &Path) -> rusqlite::Result<i64> {
    let c = rusqlite::Connection::open(path)?;
    c.busy_timeout(Duration::ZERO)?;
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
}

/// A followed database of 3 rows and a downloaded file (TXID 2) that makes it 40.
struct Fixture {
    _dir: tempfile::TempDir,
    to: PathBuf,
    incoming: PathBuf,
    new: Vec<Vec<u8>>,
    db: Arc<File>,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("follower.db");
        rollback_db(&to, 3);
        let new = rollback_db(&dir.path().join("new.db"), 40);
        let db = Arc::new(File::options().read(true).write(true).open(&to).unwrap());
        let incoming = dir.path().join("incoming.ltx");
        Fixture {
            _dir: dir,
            to,
            incoming,
            new,
            db,
        }
    }

    /// Downloads the file again (an apply removes it): with checksums when `pre` is its
    /// pre-apply checksum.
    fn write_incoming(&self, pre: Option<u64>) {
        let header = Header {
            flags: match pre {
                Some(_) => 0,
                None => ltx::HEADER_FLAG_NO_CHECKSUM,
            },
            pre_apply_checksum: pre.unwrap_or(0),
            page_size: 4096,
            commit: self.new.len() as u32,
            min_txid: TxId(2),
            max_txid: TxId(2),
            timestamp: 1,
            ..Header::default()
        };
        let mut enc = ltx::encoder::Encoder::new(Vec::new(), header, ltx::Codec::Lz4).unwrap();
        for (i, page) in self.new.iter().enumerate() {
            enc.encode_page(i as u32 + 1, page).unwrap();
        }
        let post = pre.map_or(0, |_| ltx::CHECKSUM_FLAG | 0x2);
        fs::write(&self.incoming, enc.finish(post).unwrap().0).unwrap();
    }

    fn job(&self, fail_at_page: Option<u32>) -> ApplyJob {
        self.write_incoming(None);
        ApplyJob {
            db: self.db.clone(),
            to: self.to.clone(),
            incoming: self.incoming.clone(),
            txid_path: txid_path(&self.to),
            info: file(0, 2, 2),
            page_size: 4096,
            txid: TxId(1),
            last_post: None,
            fail_at_page,
        }
    }
}

/// An apply that fails after its first write (a full disk) keeps SQLite's exclusive lock on
/// the database until a retry applies the file whole: readers get "database is locked", never
/// a database with the pages of two states (the lock went with the error, and readers saw
/// the half-written file until the next poll, which on a full disk fails again).
#[test]
fn an_apply_that_fails_halfway_keeps_readers_out_until_it_applies() {
    let f = Fixture::new();
    let (applied, torn) = f.job(Some(5)).run(None);
    assert!(applied.is_err());
    assert!(torn.is_some(), "the lock went with the error");
    let e = rows_now(&f.to).expect_err("a reader read a half-applied database");
    assert!(e.to_string().contains("locked"), "{e}");
    // A retry that fails before it writes keeps the lock too: the file is still torn.
    let (applied, torn) = f.job(Some(1)).run(torn);
    assert!(applied.is_err() && torn.is_some());
    let (applied, torn) = f.job(None).run(torn);
    assert_eq!(applied.unwrap().txid, TxId(2));
    assert!(torn.is_none());
    assert_eq!(rows_now(&f.to).unwrap(), 40);
    assert_eq!(read_txid(&txid_path(&f.to)).unwrap(), Some(TxId(2)));
}

/// A followed database replaced at its path (by hand, while the follower runs) gets no
/// `-txid` from the follower, which goes on writing the old file: the new file's `-txid`
/// would name a state it does not hold, and a later follower would resume from it.
#[test]
fn a_followed_database_replaced_at_its_path_gets_no_txid() {
    let f = Fixture::new();
    let other = f.to.with_extension("other");
    fs::copy(&f.to, &other).unwrap();
    fs::rename(&other, &f.to).unwrap();
    let (applied, torn) = f.job(None).run(None);
    let e = applied.unwrap_err();
    assert!(e.to_string().contains("was replaced"), "{e}");
    assert!(torn.is_none());
    assert_eq!(read_txid(&txid_path(&f.to)).unwrap(), None);
}

/// A file that does not start from the state the follower holds (its pre-apply checksum is
/// not the last post-apply one) is refused with the database untouched; one whose writer did
/// not know its predecessor (a bare checksum flag: its staging was lost) is applied, where it
/// was refused at every poll.
#[test]
fn a_file_from_another_state_is_refused_and_an_unknown_start_applied() {
    let f = Fixture::new();
    let followed = ltx::CHECKSUM_FLAG | 0x1;
    let job = |pre: u64| {
        let mut job = f.job(None);
        f.write_incoming(Some(pre));
        job.last_post = Some(followed);
        job
    };
    let (applied, torn) = job(ltx::CHECKSUM_FLAG | 0x9).run(None);
    assert!(
        matches!(applied, Err(RestoreError::Diverged { .. })),
        "{applied:?}"
    );
    assert!(torn.is_none());
    assert_eq!(rows_now(&f.to).unwrap(), 3);
    let (applied, _) = job(ltx::CHECKSUM_FLAG).run(None);
    assert_eq!(applied.unwrap().txid, TxId(2));
    assert_eq!(rows_now(&f.to).unwrap(), 40);
}
