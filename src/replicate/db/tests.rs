use super::connection::same_generation;
use super::*;

/// An application database in WAL mode with one committed row, and its connection.
fn wal_app(dir: &Path) -> (PathBuf, Connection) {
    let path = dir.join("app.db");
    let app = Connection::open(&path).unwrap();
    app.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('a');",
    )
    .unwrap();
    (path, app)
}

fn scan_wal(wal: &File) -> wal::WalScan {
    wal::scan(wal, WAL_HEADER_SIZE, u64::MAX)
        .unwrap()
        .expect("frames in the WAL")
}

fn salts(scan: &wal::WalScan) -> (u32, u32) {
    (scan.header.salt1, scan.header.salt2)
}

/// Pages read under one WAL header are accepted while the salts stand, and refused once
/// the WAL has been restarted (SQLite rewrote the header with new salts).
#[test]
fn same_generation_refuses_pages_read_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (_, app) = wal_app(dir.path());
    let wal = File::open(dir.path().join("app.db-wal")).unwrap();
    let scan = scan_wal(&wal);
    assert!(!scan.pages.is_empty());
    same_generation(&wal, salts(&scan)).unwrap();

    // More frames in the same generation do not matter.
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    same_generation(&wal, salts(&scan)).unwrap();

    // A complete checkpoint, then a write: SQLite restarts the WAL in place.
    app.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .unwrap();
    app.execute("INSERT INTO t VALUES ('c')", []).unwrap();
    assert!(matches!(
        same_generation(&wal, salts(&scan)),
        Err(DbError::WalRestartedDuringRead)
    ));
}

/// A failed `build_table` (here: its pages seem to span a WAL restart) must leave the
/// page buffer in place; without it every later segment failed, and the daemon kept
/// retrying one full segment.
#[test]
fn a_failed_build_table_keeps_the_page_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let (path, app) = wal_app(dir.path());
    let mut db = Db::new(
        path.clone(),
        Some(dir.path().join("meta")),
        DbSettings::default(),
        RemoteTip::default(),
    );
    db.sync(false).unwrap();
    app.execute("INSERT INTO t VALUES ('b')", []).unwrap();
    let wal = File::open(dir.path().join("app.db-wal")).unwrap();
    let mut scan = scan_wal(&wal);
    scan.header.salt1 ^= 1;
    assert!(matches!(
        db.build_table(Some((&wal, &scan))),
        Err(DbError::WalRestartedDuringRead)
    ));
    assert_eq!(db.page_buf.len(), 4096);
    app.execute("INSERT INTO t VALUES ('c')", []).unwrap();
    assert!(db.sync(false).unwrap() > 0, "the next sync wrote nothing");
}
