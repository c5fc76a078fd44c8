//! Tests for restore failure modes go here: corrupt, truncated, missing and foreign files,
//! existing outputs, and exit codes. Every failure must leave no output (and no `.tmp`).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn golden(scenario: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/litestream-v0.5")
        .join(scenario)
        .join("replica")
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        common::copy_dir(&golden("basic-4k"), &dir.path().join("replica"));
        Fixture { dir }
    }
    fn replica(&self) -> String {
        self.dir.path().join("replica").display().to_string()
    }
    fn l0(&self, txid: u64) -> PathBuf {
        self.dir
            .path()
            .join(format!("replica/ltx/0/{txid:016x}-{txid:016x}.ltx"))
    }
    fn out(&self) -> PathBuf {
        self.dir.path().join("out.db")
    }
    fn restore(&self, extra: &[&str]) -> Output {
        let out = self.out();
        let mut args = vec!["restore", "--to", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        let replica = self.replica();
        args.push(&replica);
        Command::new(env!("CARGO_BIN_EXE_replicad"))
            .args(&args)
            .output()
            .unwrap()
    }
    fn assert_failed_cleanly(&self, o: &Output, needle: &str) {
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "stderr: {stderr}");
        assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
        assert!(!self.out().exists(), "output written despite: {stderr}");
        assert!(
            !self.dir.path().join("out.db.tmp").exists(),
            "tmp left behind"
        );
    }
}

#[test]
fn flipped_byte_in_a_page_is_refused() {
    let f = Fixture::new();
    let mut b = fs::read(f.l0(8)).unwrap();
    b[2000] ^= 0xff;
    fs::write(f.l0(8), b).unwrap();
    let o = f.restore(&[]);
    f.assert_failed_cleanly(&o, "0000000000000008-0000000000000008.ltx");
}

#[test]
fn truncated_file_is_refused() {
    let f = Fixture::new();
    let b = fs::read(f.l0(9)).unwrap();
    fs::write(f.l0(9), &b[..b.len() - 40]).unwrap();
    f.assert_failed_cleanly(&f.restore(&[]), "truncated");
}

#[test]
fn missing_middle_file_names_the_gap() {
    let f = Fixture::new();
    fs::remove_file(f.l0(8)).unwrap();
    f.assert_failed_cleanly(
        &f.restore(&[]),
        "TXIDs 0000000000000008 to 0000000000000008 are missing",
    );
}

#[test]
fn wrong_magic_is_refused() {
    let f = Fixture::new();
    let mut b = fs::read(f.l0(7)).unwrap();
    b[..4].copy_from_slice(b"LTX2");
    fs::write(f.l0(7), b).unwrap();
    f.assert_failed_cleanly(&f.restore(&[]), "bad magic");
}

#[test]
fn invalid_header_flag_is_refused() {
    let f = Fixture::new();
    let mut b = fs::read(f.l0(9)).unwrap();
    b[7] = 0x03;
    fs::write(f.l0(9), b).unwrap();
    f.assert_failed_cleanly(&f.restore(&[]), "flags");
}

#[test]
fn file_from_a_database_with_another_page_size_is_refused() {
    let f = Fixture::new();
    let foreign = golden("basic-64k").join("ltx/0/0000000000000008-0000000000000008.ltx");
    fs::copy(foreign, f.l0(8)).unwrap();
    f.assert_failed_cleanly(&f.restore(&[]), "65536-byte pages");
}

#[test]
fn unavailable_txid_names_the_newest() {
    let f = Fixture::new();
    let o = f.restore(&["--txid", "00000000000000ff"]);
    f.assert_failed_cleanly(&o, "newest TXID on the replica is 0000000000000009");
}

#[test]
fn existing_output_needs_force_and_force_replaces_it_and_its_wal() {
    let f = Fixture::new();
    fs::write(f.out(), b"precious").unwrap();
    let o = f.restore(&[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert_eq!(fs::read(f.out()).unwrap(), b"precious");

    let o = f.restore(&["--if-db-not-exists"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(fs::read(f.out()).unwrap(), b"precious");

    let wal = f.dir.path().join("out.db-wal");
    fs::write(&wal, b"stale wal").unwrap();
    let o = f.restore(&["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !wal.exists(),
        "a stale WAL would be replayed over the restored database"
    );
    let conn = rusqlite::Connection::open(f.out()).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert!(n > 0);
}

#[test]
fn stray_wal_beside_a_missing_output_is_not_silently_kept() {
    let f = Fixture::new();
    fs::write(f.dir.path().join("out.db-wal"), b"stale").unwrap();
    let o = f.restore(&[]);
    f.assert_failed_cleanly(&o, "out.db-wal already exists");
}

#[test]
fn empty_replica_fails_unless_if_replica_exists() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.db");
    let run = |extra: &[&str]| {
        let mut args = vec!["restore", "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push(dir.path().to_str().unwrap());
        Command::new(env!("CARGO_BIN_EXE_replicad"))
            .args(&args)
            .output()
            .unwrap()
    };
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no backup files"));
    let o = run(&["--if-replica-exists"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!out.exists());
}

#[test]
fn a_replica_directory_that_does_not_exist_is_not_an_empty_replica() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.db");
    let missing = dir.path().join("no-such-replica");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "restore",
            "-o",
            out.to_str().unwrap(),
            "--if-replica-exists",
        ];
        args.extend_from_slice(extra);
        args.push(missing.to_str().unwrap());
        Command::new(env!("CARGO_BIN_EXE_replicad"))
            .args(&args)
            .output()
            .unwrap()
    };
    let o = run(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not exist") && err.contains("--if-replica-missing-ok"),
        "{err}"
    );
    assert!(!out.exists());
    let o = run(&["--if-replica-missing-ok"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.exists());
}

#[test]
fn a_directory_as_the_output_is_refused_before_any_work() {
    let f = Fixture::new();
    fs::create_dir(f.out()).unwrap();
    let o = f.restore(&["--force"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("is a directory"), "{err}");
    assert!(
        !f.dir.path().join("out.db.tmp").exists(),
        "a tmp was written"
    );
}

#[test]
fn usage_errors_exit_2() {
    let bin = env!("CARGO_BIN_EXE_replicad");
    let cases: &[&[&str]] = &[
        &["restore"],
        &["restore", "--txid", "12", "-o", "/tmp/x.db", "/tmp"],
        &[
            "restore",
            "--timestamp",
            "yesterday",
            "-o",
            "/tmp/x.db",
            "/tmp",
        ],
        &[
            "restore",
            "--txid",
            "0000000000000001",
            "--timestamp",
            "2026-01-01T00:00:00Z",
            "/tmp",
        ],
        &["restore", "/tmp/replica-without-output"],
        &["restore", "-o", "/tmp/x.db", "ftp://host/path"],
        &["frobnicate"],
    ];
    for args in cases {
        let o = Command::new(bin).args(*args).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A replica of a damaged database (an index that missed an update, as a failing primary
/// could leave it): the chain is whole and its checksums hold, so only the integrity check
/// can refuse it, and the output is not written; `--no-integrity-check` restores it as it is.
#[test]
fn a_replica_of_a_damaged_database_fails_the_integrity_check_and_writes_nothing() {
    let f = Fixture {
        dir: tempfile::tempdir().unwrap(),
    };
    let db = f.dir.path().join("app.db");
    let index_row: (i64, String) = {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT); CREATE INDEX t_a ON t(a);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
             INSERT INTO t(a) SELECT 'row-' || i FROM n;",
        )
        .unwrap();
        let row = c
            .query_row(
                "SELECT rootpage, sql FROM sqlite_schema WHERE name = 't_a'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        c.execute_batch("PRAGMA writable_schema=ON; DELETE FROM sqlite_schema WHERE name = 't_a';")
            .unwrap();
        row
    };
    // A new connection reads the schema without the index: the update leaves it stale.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("UPDATE t SET a = 'changed' WHERE id = 5", [])
        .unwrap();
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(&format!(
            "PRAGMA writable_schema=ON; INSERT INTO sqlite_schema(type, name, tbl_name, rootpage, sql) \
             VALUES ('index', 't_a', 't', {}, '{}');",
            index_row.0,
            index_row.1.replace('\'', "''")
        ))
        .unwrap();
    assert!(!common::integrity_ok(&db), "the source is not damaged");

    let replica = f.dir.path().join("replica");
    let d = common::spawn_replicate(f.dir.path(), &[common::s(&db), common::s(&replica)]);
    assert!(
        common::wait_for_txid(&replica, 1, common::WAIT),
        "nothing replicated"
    );
    d.stop_ok();

    let o = f.restore(&[]);
    f.assert_failed_cleanly(&o, "fails PRAGMA integrity_check");
    let o = f.restore(&["--no-integrity-check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!common::integrity_ok(&f.out()));
    assert_eq!(
        common::strings(&f.out(), "SELECT a FROM t NOT INDEXED WHERE id = 5"),
        ["changed"]
    );
}
