use super::*;
use rusqlite::Connection;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

type Rows = Vec<(i64, Vec<u8>)>;

/// Opens (creating) a database in WAL mode with automatic checkpoints off.
fn open_writer(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA wal_autocheckpoint=0;").unwrap();
    conn
}

fn wal_path(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", db.display()))
}

/// Runs a checkpoint in `mode` and asserts it completed (not busy, all frames copied).
fn checkpoint(conn: &Connection, mode: &str) {
    let (busy, log, done): (i64, i64, i64) = conn
        .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "checkpoint {mode} was blocked");
    assert_eq!(log, done, "checkpoint {mode} did not copy every frame");
}

fn pragma_u32(conn: &Connection, name: &str) -> u32 {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
        .unwrap()
}

fn rows(conn: &Connection) -> Rows {
    let mut stmt = conn.prepare("SELECT id, body FROM t ORDER BY id").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn integrity(conn: &Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

/// Creates table `t` with some rows and checkpoints everything into the main file, so
/// the WAL is empty (truncated) afterwards.
fn create_base(conn: &Connection) {
    conn.execute_batch(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, body BLOB NOT NULL);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
             INSERT INTO t(body) SELECT randomblob(200) FROM n;",
    )
    .unwrap();
    checkpoint(conn, "TRUNCATE");
}

/// Several transactions: small, overflow (a blob larger than a page), multi-page,
/// updates and deletes. Returns the number of transactions committed.
fn workload(conn: &Connection) -> usize {
    let txns = [
        "INSERT INTO t(body) VALUES (randomblob(10)), (randomblob(20)), (randomblob(30));",
        "INSERT INTO t(body) VALUES (randomblob(10000));",
        "BEGIN;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO t(body) SELECT randomblob(300) FROM n;
             COMMIT;",
        "UPDATE t SET body = randomblob(250) WHERE id % 7 = 0;",
        "DELETE FROM t WHERE id % 5 = 0;",
        "INSERT INTO t(body) VALUES (randomblob(9000));",
    ];
    for sql in txns {
        conn.execute_batch(sql).unwrap();
    }
    txns.len()
}

/// One frame as stored, without any validation.
#[derive(Debug, Clone, Copy)]
struct RawFrame {
    offset: u64,
    pgno: u32,
    commit: u32,
    salts: (u32, u32),
}

/// Every whole frame in a WAL image, valid or not.
fn raw_frames(wal: &[u8]) -> Vec<RawFrame> {
    let page_size = be_u32(wal, 8) as usize;
    let frame = WAL_FRAME_HEADER_SIZE as usize + page_size;
    let mut out = Vec::new();
    let mut off = WAL_HEADER_SIZE as usize;
    while off + frame <= wal.len() {
        out.push(RawFrame {
            offset: off as u64,
            pgno: be_u32(wal, off),
            commit: be_u32(wal, off + 4),
            salts: (be_u32(wal, off + 8), be_u32(wal, off + 12)),
        });
        off += frame;
    }
    out
}

fn header_of(wal: &[u8]) -> WalHeader {
    WalHeader::parse(wal[..32].try_into().unwrap()).unwrap()
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn scan_path(path: &Path, start: u64, max_bytes: u64) -> Result<Option<WalScan>, WalError> {
    scan(&File::open(path).unwrap(), start, max_bytes)
}

/// Copies every page of `s` out of the WAL at `wal` onto the database file at `db`, then
/// truncates it to the committed size.
fn apply(s: &WalScan, wal: &Path, db: &Path) {
    let wal = File::open(wal).unwrap();
    let out = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    let page_size = u64::from(s.header.page_size);
    let mut page = vec![0u8; s.header.page_size as usize];
    for (&pgno, &off) in &s.pages {
        read_page(&wal, off, &mut page).unwrap();
        out.write_all_at(&page, u64::from(pgno - 1) * page_size)
            .unwrap();
    }
    out.set_len(u64::from(s.commit) * page_size).unwrap();
    out.sync_all().unwrap();
}

/// Merges a continuation scan into accumulated pages, as a replicator would.
fn merge(pages: &mut BTreeMap<u32, u64>, s: &WalScan) {
    pages.extend(&s.pages);
    pages.retain(|&p, _| p <= s.commit);
}

/// Rewrites a little-endian WAL image as the big-endian variant: new magic, header
/// checksum and the checksum of every frame before `end`.
fn to_big_endian(wal: &mut [u8], end: u64) {
    put_u32(wal, 0, WAL_MAGIC_BE);
    let (c1, c2) = wal_checksum(true, &wal[..24], 0, 0);
    put_u32(wal, 24, c1);
    put_u32(wal, 28, c2);
    let frame = header_of(wal).frame_size() as usize;
    let mut sum = (c1, c2);
    let mut off = WAL_HEADER_SIZE as usize;
    while (off + frame) as u64 <= end {
        sum = wal_checksum(true, &wal[off..off + 8], sum.0, sum.1);
        sum = wal_checksum(true, &wal[off + 24..off + frame], sum.0, sum.1);
        put_u32(wal, off + 16, sum.0);
        put_u32(wal, off + 20, sum.1);
        off += frame;
    }
}

// 1. A real WAL: header, commit size, end offset and the set of pages changed.
#[test]
fn scans_a_real_wal_written_by_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    let base = std::fs::read(&db).unwrap();
    workload(&conn);
    let copy = dir.path().join("wal.copy");
    std::fs::copy(wal_path(&db), &copy).unwrap();
    let wal = std::fs::read(&copy).unwrap();

    let header = header_of(&wal);
    let expected_magic = if cfg!(target_endian = "big") {
        WAL_MAGIC_BE
    } else {
        WAL_MAGIC_LE
    };
    assert_eq!(header.magic, expected_magic);
    assert_eq!(header.big_endian_checksums(), cfg!(target_endian = "big"));
    assert_eq!(header.version, WAL_VERSION);
    assert_eq!(header.page_size, pragma_u32(&conn, "page_size"));

    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.header, header);
    assert_eq!(s.start_offset, 32);
    assert_eq!(s.commit, pragma_u32(&conn, "page_count"));
    assert_eq!(s.end_offset, wal.len() as u64, "every frame is committed");
    assert!(!s.limited);

    // Every frame is committed, so the pages are exactly the frames' page numbers, each
    // pointing at the data of its newest frame.
    let frames = raw_frames(&wal);
    assert_eq!(
        frames.iter().map(|f| f.pgno).collect::<BTreeSet<_>>(),
        s.pages.keys().copied().collect::<BTreeSet<_>>()
    );
    for (&pgno, &off) in &s.pages {
        let newest = frames.iter().rfind(|f| f.pgno == pgno).unwrap();
        assert_eq!(off, newest.offset + WAL_FRAME_HEADER_SIZE);
    }
    assert_eq!(frames.last().unwrap().commit, s.commit);

    // Checkpoint, and compare the main file before and after: every page that changed
    // (or was added) must be in the scan.
    checkpoint(&conn, "TRUNCATE");
    let after = std::fs::read(&db).unwrap();
    let ps = header.page_size as usize;
    let changed: BTreeSet<u32> = (0..after.len() / ps)
        .filter(|&i| base.get(i * ps..(i + 1) * ps) != Some(&after[i * ps..(i + 1) * ps]))
        .map(|i| i as u32 + 1)
        .collect();
    assert!(
        changed.len() > 10,
        "workload changed few pages: {changed:?}"
    );
    for pgno in &changed {
        assert!(
            s.pages.contains_key(pgno),
            "changed page {pgno} not scanned"
        );
    }
}

// 2. Applying the scanned pages onto the checkpointed database reproduces the live one,
// including a VACUUM that shrinks the database below pages the WAL still holds.
#[test]
fn applying_scanned_pages_reproduces_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    let restored = dir.path().join("restored.db");
    std::fs::copy(&db, &restored).unwrap();

    workload(&conn);
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
             INSERT INTO t(body) SELECT randomblob(1000) FROM n;",
    )
    .unwrap();
    let grown = pragma_u32(&conn, "page_count");
    conn.execute_batch("DELETE FROM t WHERE id > 20; VACUUM;")
        .unwrap();
    conn.execute_batch("INSERT INTO t(body) VALUES (randomblob(5000));")
        .unwrap();
    let final_pages = pragma_u32(&conn, "page_count");
    assert!(
        final_pages < grown / 2,
        "VACUUM did not shrink: {grown} -> {final_pages}"
    );

    let copy = dir.path().join("wal.copy");
    std::fs::copy(wal_path(&db), &copy).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.commit, final_pages);
    let max_frame_pgno = raw_frames(&std::fs::read(&copy).unwrap())
        .iter()
        .map(|f| f.pgno)
        .max()
        .unwrap();
    assert!(
        max_frame_pgno > s.commit,
        "the WAL holds pages past the end"
    );
    assert!(*s.pages.keys().last().unwrap() <= s.commit);

    // The scan crosses read boundaries identically with tiny reads.
    let file = File::open(&copy).unwrap();
    for read_size in [1, 3 * s.header.frame_size() as usize + 7, 100_000] {
        let small = scan_with_read_size(&file, 32, u64::MAX, read_size)
            .unwrap()
            .unwrap();
        assert_eq!(small.pages, s.pages);
        assert_eq!(
            (small.commit, small.end_offset, small.checksum),
            (s.commit, s.end_offset, s.checksum)
        );
    }

    apply(&s, &copy, &restored);
    let check = Connection::open(&restored).unwrap();
    assert_eq!(integrity(&check), "ok");
    assert_eq!(pragma_u32(&check, "page_count"), final_pages);
    assert_eq!(rows(&check), rows(&conn));
}

// 3. Garbage, a partial frame and a valid but uncommitted frame after the last commit are
// ignored; a corrupt frame ends the WAL at the commit before it.
#[test]
fn uncommitted_tail_and_corruption_end_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    let orig = std::fs::read(wal_path(&db)).unwrap();
    let copy = dir.path().join("wal.copy");
    std::fs::write(&copy, &orig).unwrap();
    let full = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(full.end_offset, orig.len() as u64);
    let header = full.header;
    let fs = header.frame_size() as usize;

    let same = |bytes: &[u8]| {
        std::fs::write(&copy, bytes).unwrap();
        let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
        assert_eq!(s.end_offset, full.end_offset);
        assert_eq!(s.pages, full.pages);
        assert_eq!(s.commit, full.commit);
        assert_eq!(s.checksum, full.checksum);
    };

    // Garbage bytes (less and more than a frame).
    let mut wal = orig.clone();
    wal.extend((0..100u32).map(|i| (i * 37) as u8));
    same(&wal);
    wal.extend((0..2 * fs as u32).map(|i| (i * 101 + 5) as u8));
    same(&wal);

    // A frame with the right salts, but only half its page.
    let mut frame = vec![0u8; fs];
    put_u32(&mut frame, 0, 2);
    put_u32(&mut frame, 8, header.salt1);
    put_u32(&mut frame, 12, header.salt2);
    frame[24..].copy_from_slice(&orig[32 + 24..32 + fs]);
    let mut wal = orig.clone();
    wal.extend_from_slice(&frame[..fs / 2]);
    same(&wal);

    // A whole, valid frame that is not a commit frame: still not committed.
    let seal = |frame: &mut [u8], sum: (u32, u32)| {
        let sum = wal_checksum(false, &frame[..8], sum.0, sum.1);
        let sum = wal_checksum(false, &frame[24..], sum.0, sum.1);
        put_u32(frame, 16, sum.0);
        put_u32(frame, 20, sum.1);
        sum
    };
    assert!(!header.big_endian_checksums());
    let sum = seal(&mut frame, full.checksum);
    let mut wal = orig.clone();
    wal.extend_from_slice(&frame);
    same(&wal);
    // ... and a commit frame after it makes both count (so the frame above was valid).
    let mut commit_frame = frame.clone();
    put_u32(&mut commit_frame, 0, 3);
    put_u32(&mut commit_frame, 4, full.commit);
    let sum = seal(&mut commit_frame, sum);
    wal.extend_from_slice(&commit_frame);
    std::fs::write(&copy, &wal).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.end_offset, wal.len() as u64);
    assert_eq!(s.checksum, sum);
    assert_eq!(s.pages[&2], orig.len() as u64 + 24);
    assert_eq!(s.pages[&3], (orig.len() + fs) as u64 + 24);

    // One corrupt byte in the middle frame's page: the scan ends at the last commit
    // before that frame.
    let frames = raw_frames(&orig);
    let m = frames.len() / 2;
    let last_commit = frames[..m].iter().rfind(|f| f.commit != 0).unwrap();
    let expected_end = last_commit.offset + fs as u64;
    assert!(expected_end < frames[m].offset + fs as u64);
    let mut wal = orig.clone();
    wal[frames[m].offset as usize + 24 + 100] ^= 0x01;
    std::fs::write(&copy, &wal).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.end_offset, expected_end);
    assert_eq!(s.commit, last_commit.commit);
    assert!(s.pages.values().all(|&off| off < expected_end));
    // Wrong salts in that frame (checksum untouched) end it the same way.
    let mut wal = orig.clone();
    wal[frames[m].offset as usize + 8] ^= 0x80;
    std::fs::write(&copy, &wal).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.end_offset, expected_end);
}

// 3b. Frames SQLite itself writes before a commit (a page-cache spill inside a large
// open transaction) are not committed until the commit frame arrives.
#[test]
fn frames_spilled_by_an_open_transaction_are_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    let before = std::fs::metadata(wal_path(&db)).unwrap().len();

    conn.execute_batch(
        "PRAGMA cache_size=10;
             BEGIN;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
             INSERT INTO t(body) SELECT randomblob(1000) FROM n;",
    )
    .unwrap();
    let copy = dir.path().join("wal.copy");
    std::fs::copy(wal_path(&db), &copy).unwrap();
    let len = std::fs::metadata(&copy).unwrap().len();
    assert!(
        len > before,
        "SQLite did not spill frames before the commit"
    );
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.end_offset, before);

    conn.execute_batch("COMMIT;").unwrap();
    std::fs::copy(wal_path(&db), &copy).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!(s.end_offset, std::fs::metadata(&copy).unwrap().len());
    assert_eq!(s.commit, pragma_u32(&conn, "page_count"));
}

// 4. Scanning in limited steps, each continuing from the previous end, equals one scan.
#[test]
fn limited_scans_continue_to_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    let txns = workload(&conn);
    let copy = dir.path().join("wal.copy");
    std::fs::copy(wal_path(&db), &copy).unwrap();
    let full = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    let fs = full.header.frame_size();

    // One transaction per step.
    let mut pages = BTreeMap::new();
    let mut offset = 32;
    let mut checksum = (full.header.checksum1, full.header.checksum2);
    let mut steps = 0;
    loop {
        let s = scan_path(&copy, offset, 1).unwrap().unwrap();
        assert_eq!(s.start_offset, offset);
        if s.end_offset == offset {
            // Nothing left: the seed read back from the previous frame is the checksum
            // the previous step ended with.
            assert!(!s.limited);
            assert_eq!(s.commit, 0);
            assert!(s.pages.is_empty());
            assert_eq!(s.checksum, checksum);
            break;
        }
        assert!(s.limited);
        assert_eq!((s.end_offset - 32) % fs, 0);
        merge(&mut pages, &s);
        offset = s.end_offset;
        checksum = s.checksum;
        steps += 1;
    }
    assert_eq!(steps, txns);
    assert_eq!(pages, full.pages);
    assert_eq!(offset, full.end_offset);
    assert_eq!(checksum, full.checksum);

    // A first scan limited to a few frames, then the rest in one go.
    let first = scan_path(&copy, 32, 3 * fs).unwrap().unwrap();
    assert!(first.limited);
    assert!(first.end_offset >= 32 + 3 * fs && first.end_offset < full.end_offset);
    let rest = scan_path(&copy, first.end_offset, u64::MAX)
        .unwrap()
        .unwrap();
    assert!(!rest.limited);
    let mut pages = first.pages.clone();
    merge(&mut pages, &rest);
    assert_eq!(pages, full.pages);
    assert_eq!(rest.commit, full.commit);
    assert_eq!(rest.end_offset, full.end_offset);
    assert_eq!(rest.checksum, full.checksum);
}

// 5. A big-endian WAL (rewritten from a real one) scans identically, and SQLite reads it.
#[test]
fn big_endian_checksums_are_understood_by_scan_and_by_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    let orig = std::fs::read(wal_path(&db)).unwrap();
    let le_copy = dir.path().join("le.wal");
    std::fs::write(&le_copy, &orig).unwrap();
    let le = scan_path(&le_copy, 32, u64::MAX).unwrap().unwrap();
    assert!(!le.header.big_endian_checksums());

    let mut wal = orig.clone();
    to_big_endian(&mut wal, le.end_offset);
    let be_db = dir.path().join("be.db");
    std::fs::copy(&db, &be_db).unwrap();
    std::fs::write(wal_path(&be_db), &wal).unwrap();
    let be = scan_path(&wal_path(&be_db), 32, u64::MAX).unwrap().unwrap();
    assert_eq!(be.header.magic, WAL_MAGIC_BE);
    assert!(be.header.big_endian_checksums());
    assert_eq!(be.pages, le.pages);
    assert_eq!((be.commit, be.end_offset), (le.commit, le.end_offset));
    assert_ne!(be.checksum, le.checksum);

    // SQLite recovers the rewritten WAL (there is no -shm) and sees every row.
    let live = rows(&conn);
    let check = Connection::open(&be_db).unwrap();
    assert_eq!(rows(&check), live);
    assert_eq!(integrity(&check), "ok");
    drop(check);

    // Control: the big-endian magic over little-endian frame checksums is an empty WAL
    // to SQLite (it only sees the checkpointed rows) and to scan.
    let mut wal = orig.clone();
    put_u32(&mut wal, 0, WAL_MAGIC_BE);
    let (c1, c2) = wal_checksum(true, &wal[..24], 0, 0);
    put_u32(&mut wal, 24, c1);
    put_u32(&mut wal, 28, c2);
    let bad_db = dir.path().join("bad.db");
    std::fs::copy(&db, &bad_db).unwrap();
    std::fs::write(wal_path(&bad_db), &wal).unwrap();
    let s = scan_path(&wal_path(&bad_db), 32, u64::MAX)
        .unwrap()
        .unwrap();
    assert_eq!((s.commit, s.end_offset), (0, 32));
    assert!(s.pages.is_empty());
    let check = Connection::open(&bad_db).unwrap();
    assert_eq!(rows(&check).len(), 50);
    assert_ne!(rows(&check), live);
}

// 6 and 7. After a checkpoint, SQLite restarts the WAL in place with new salts; the stale
// frames left behind do not count, and continuing at an old position is refused.
#[test]
fn a_restarted_wal_ignores_stale_frames_and_refuses_old_positions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    for _ in 0..10 {
        conn.execute_batch("INSERT INTO t(body) VALUES (randomblob(3000));")
            .unwrap();
    }
    let old_copy = dir.path().join("old.wal");
    std::fs::copy(wal_path(&db), &old_copy).unwrap();
    let old = scan_path(&old_copy, 32, u64::MAX).unwrap().unwrap();

    checkpoint(&conn, "RESTART");
    let checkpointed = dir.path().join("checkpointed.db");
    std::fs::copy(&db, &checkpointed).unwrap();
    conn.execute_batch("UPDATE t SET body = randomblob(100) WHERE id = 3;")
        .unwrap();

    let new_copy = dir.path().join("new.wal");
    std::fs::copy(wal_path(&db), &new_copy).unwrap();
    let bytes = std::fs::read(&new_copy).unwrap();
    let new = scan_path(&new_copy, 32, u64::MAX).unwrap().unwrap();
    let (oh, nh) = (old.header, new.header);
    assert_eq!(nh.salt1, oh.salt1.wrapping_add(1));
    assert_ne!((nh.salt1, nh.salt2), (oh.salt1, oh.salt2));
    assert_eq!(nh.checkpoint_seq, oh.checkpoint_seq + 1);

    // The file was rewritten in place, not truncated: stale frames follow the new ones.
    assert_eq!(bytes.len() as u64, old.end_offset);
    assert!(new.end_offset < old.end_offset);
    let frames = raw_frames(&bytes);
    let k = ((new.end_offset - 32) / nh.frame_size()) as usize;
    assert!(frames[..k].iter().all(|f| f.salts == (nh.salt1, nh.salt2)));
    assert!(frames[k..].iter().all(|f| f.salts == (oh.salt1, oh.salt2)));
    assert_eq!(
        s_pgnos(&frames[..k]),
        new.pages.keys().copied().collect::<BTreeSet<_>>()
    );
    assert!(new.pages.len() < old.pages.len());

    // The new frames on top of the checkpointed database are the live database.
    apply(&new, &new_copy, &checkpointed);
    let check = Connection::open(&checkpointed).unwrap();
    assert_eq!(rows(&check), rows(&conn));
    assert_eq!(integrity(&check), "ok");

    // 7. A position recorded in the old generation names a frame with the old salts.
    match scan_path(&new_copy, old.end_offset, u64::MAX) {
        Err(WalError::PrevFrameMismatch { offset }) => assert_eq!(offset, old.end_offset),
        other => panic!("expected PrevFrameMismatch, got {other:?}"),
    }
}

fn s_pgnos(frames: &[RawFrame]) -> BTreeSet<u32> {
    frames.iter().map(|f| f.pgno).collect()
}

// 7. PrevFrameMismatch: the previous frame has other salts, or does not exist.
#[test]
fn continuing_after_a_foreign_or_missing_frame_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    let mut wal = std::fs::read(wal_path(&db)).unwrap();
    let copy = dir.path().join("wal.copy");
    let fs = header_of(&wal).frame_size();
    let len = wal.len() as u64;

    std::fs::write(&copy, &wal).unwrap();
    // Sanity: the same offsets are fine before the salts are touched.
    assert!(scan_path(&copy, 32 + 2 * fs, u64::MAX).unwrap().is_some());
    assert!(scan_path(&copy, len, u64::MAX).unwrap().is_some());
    match scan_path(&copy, len + fs, u64::MAX) {
        Err(WalError::PrevFrameMismatch { offset }) => assert_eq!(offset, len + fs),
        other => panic!("expected PrevFrameMismatch, got {other:?}"),
    }

    wal[(32 + fs + 12) as usize] ^= 0x01; // salt-2 of frame 1
    std::fs::write(&copy, &wal).unwrap();
    match scan_path(&copy, 32 + 2 * fs, u64::MAX) {
        Err(WalError::PrevFrameMismatch { offset }) => assert_eq!(offset, 32 + 2 * fs),
        other => panic!("expected PrevFrameMismatch, got {other:?}"),
    }
}

/// Found by the `wal_reader` fuzz target: a WAL header plus only the 24-byte header of
/// frame 1; continuing after frame 1 (past the end of the file) must be refused.
#[test]
fn continuing_past_a_partial_frame_is_refused() {
    let bytes = hex::decode(
        "377f0682002de2180000100000000000cde6b8f86406bcd3cd9fe9e05943c7e9\
             0000000100000000cde6b8f86406bcd3f3b9a2190f551523",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("wal.copy");
    std::fs::write(&copy, &bytes).unwrap();
    match scan_path(&copy, 32 + 24 + 4096, u64::MAX) {
        Err(WalError::PrevFrameMismatch { offset }) => assert_eq!(offset, 4152),
        other => panic!("expected PrevFrameMismatch, got {other:?}"),
    }
}

// 8. Misaligned offsets are errors; short or invalid headers are an empty WAL.
#[test]
fn misaligned_offsets_and_short_or_invalid_headers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let conn = open_writer(&db);
    create_base(&conn);
    workload(&conn);
    let wal = std::fs::read(wal_path(&db)).unwrap();
    let copy = dir.path().join("wal.copy");
    std::fs::write(&copy, &wal).unwrap();
    let fs = header_of(&wal).frame_size();

    for bad in [0, 16, 31, 33, 32 + fs - 1, 32 + fs + 1, 32 + 5 * fs + 24] {
        match scan_path(&copy, bad, u64::MAX) {
            Err(WalError::Misaligned { offset }) => assert_eq!(offset, bad),
            other => panic!("expected Misaligned for {bad}, got {other:?}"),
        }
    }

    // Too short for a header.
    for len in [0, 10, 31] {
        std::fs::write(&copy, &wal[..len]).unwrap();
        assert!(scan_path(&copy, 32, u64::MAX).unwrap().is_none());
    }
    // A header alone: a valid, empty WAL.
    std::fs::write(&copy, &wal[..32]).unwrap();
    let s = scan_path(&copy, 32, u64::MAX).unwrap().unwrap();
    assert_eq!((s.commit, s.end_offset, s.limited), (0, 32, false));
    assert_eq!(s.checksum, (s.header.checksum1, s.header.checksum2));
    // The right magic with a wrong header checksum: empty.
    let mut bad = wal.clone();
    bad[20] ^= 0x01;
    std::fs::write(&copy, &bad).unwrap();
    assert!(scan_path(&copy, 32, u64::MAX).unwrap().is_none());

    // Each header check, with the checksum recomputed so only that field is wrong.
    let with = |at: usize, v: u32| {
        let mut h: [u8; 32] = wal[..32].try_into().unwrap();
        put_u32(&mut h, at, v);
        let (c1, c2) = wal_checksum(h[3] & 1 == 1, &h[..24], 0, 0);
        put_u32(&mut h, 24, c1);
        put_u32(&mut h, 28, c2);
        h
    };
    assert!(matches!(
        WalHeader::parse(&with(0, 0x377f_0681)),
        Err(WalError::BadMagic(0x377f_0681))
    ));
    assert!(matches!(
        WalHeader::parse(&with(4, 3_007_001)),
        Err(WalError::BadVersion(3_007_001))
    ));
    for ps in [0, 1, 256, 1000, 4097, 131_072] {
        assert!(matches!(
            WalHeader::parse(&with(8, ps)),
            Err(WalError::BadPageSize(p)) if p == ps
        ));
    }
    for ps in [512, 1024, 65536] {
        assert_eq!(WalHeader::parse(&with(8, ps)).unwrap().page_size, ps);
    }
    let mut h = with(0, WAL_MAGIC_LE);
    h[31] ^= 0x01;
    assert!(matches!(
        WalHeader::parse(&h),
        Err(WalError::HeaderChecksum)
    ));
    std::fs::write(&copy, with(8, 1000)).unwrap();
    assert!(scan_path(&copy, 32, u64::MAX).unwrap().is_none());

    // read_page past the end of the file is an error, not a short page.
    std::fs::write(&copy, &wal).unwrap();
    let file = File::open(&copy).unwrap();
    let mut page = vec![0u8; header_of(&wal).page_size as usize];
    read_page(&file, 32 + 24, &mut page).unwrap();
    assert_eq!(page, wal[56..56 + page.len()]);
    match read_page(&file, wal.len() as u64 - 10, &mut page) {
        Err(WalError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
        other => panic!("expected UnexpectedEof, got {other:?}"),
    }
}
