//! A segment of thousands of pages is read and compressed on every core (the initial snapshot
//! of a large database): the pages must still land in order, with the file and database
//! checksums of a sequential encode, and restore to exactly the source.

use crate::common;

use std::time::Duration;

use common::*;
use replicad::config::DbSettings;
use replicad::replicate::db::{Db, RemoteTip};

fn case(codec: &str) {
    let dir = TestDir::new(&format!("large-segment-{}", codec.replace(':', "")));
    let path = dir.join("app.db");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA page_size=4096;
         CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);
         CREATE INDEX t_v ON t (v);",
    )
    .unwrap();
    // About 5,000 pages, half of them still in the WAL when the segment is cut, so pages come
    // from both sources in one segment.
    c.execute_batch("BEGIN").unwrap();
    for i in 0..24000 {
        c.execute(
            "INSERT INTO t (v) VALUES (?1)",
            [format!("{i:08}-{}", "abcdefgh".repeat(24 + i % 40))],
        )
        .unwrap();
    }
    c.execute_batch("COMMIT; PRAGMA wal_checkpoint(PASSIVE);")
        .unwrap();
    c.execute("UPDATE t SET v = v || '-updated' WHERE id % 3 = 0", [])
        .unwrap();
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    assert!(
        pages > 4000,
        "only {pages} pages: below the parallel threshold"
    );

    let meta = dir.join("meta");
    let mut db = Db::new(
        path.clone(),
        Some(meta.clone()),
        DbSettings {
            compression: codec.parse().unwrap(),
            dormant_after: Duration::ZERO,
            ..DbSettings::default()
        },
        RemoteTip::default(),
    );
    assert_eq!(db.sync(false).unwrap(), 1, "one full segment");
    let out = dir.join("restored.db");
    restore_ok(s(&meta), &out, None);
    assert_same_content(&path, &out, codec);
    assert!(integrity_ok(&out));
    // The next (small) segment continues from the parallel one's checksum.
    c.execute("DELETE FROM t WHERE id % 7 = 0", []).unwrap();
    assert_eq!(db.sync(false).unwrap(), 1);
    let out2 = dir.join("restored-2.db");
    restore_ok(s(&meta), &out2, None);
    assert_same_content(&path, &out2, codec);
}

#[test]
fn large_full_segment_zstd_restores_exactly() {
    case("zstd:3");
}

#[test]
fn large_full_segment_lz4_restores_exactly() {
    case("lz4");
}
