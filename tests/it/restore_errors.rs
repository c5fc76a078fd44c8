//! Tests for restore failure modes go here: corrupt, truncated, missing and foreign files,
//! existing outputs, and exit codes. Every failure must leave no output (and no `.tmp`).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use replicad::ltx::checksum::{DbChecksum, page_checksum};
use replicad::ltx::{Codec, Decoder, Encoder, Frame, Header, TxId};

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

/// A chain of two files large enough to be decoded in many batches on several threads:
/// a snapshot of `SNAP_PAGES` pages, then a file rewriting [`REWRITTEN`]. Returns the bytes
/// each TXID restores to.
fn write_large_chain(replica: &Path) -> [Vec<u8>; 2] {
    const SNAP_PAGES: u32 = 3000;
    const PS: usize = 4096;
    let page = |pgno: u32, version: u8| -> Vec<u8> {
        // Compressible but distinct per page and version.
        let mut p = vec![version; PS];
        let mut x = u64::from(pgno).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(version);
        for chunk in p[..PS / 4].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_be_bytes());
        }
        p[..4].copy_from_slice(&pgno.to_be_bytes());
        p
    };
    let rewritten = |pgno: u32| pgno == 5 || (1000..=1500).contains(&pgno) || pgno == 2999;
    let dir = replica.join("ltx/0");
    fs::create_dir_all(&dir).unwrap();
    let mut states = [Vec::new(), Vec::new()];
    let mut sum = DbChecksum::default();
    let mut pre = 0;
    for (txid, pages) in [
        (1u64, (1..=SNAP_PAGES).collect::<Vec<_>>()),
        (2, (1..=SNAP_PAGES).filter(|&p| rewritten(p)).collect()),
    ] {
        let version = txid as u8;
        let header = Header {
            flags: 0,
            page_size: PS as u32,
            commit: SNAP_PAGES,
            min_txid: TxId(txid),
            max_txid: TxId(txid),
            timestamp: 1_767_225_600_000 + txid as i64,
            pre_apply_checksum: pre,
            ..Header::default()
        };
        let path = dir.join(format!("{txid:016x}-{txid:016x}.ltx"));
        let mut enc =
            Encoder::new(fs::File::create(&path).unwrap(), header, Codec::Zstd(3)).unwrap();
        for &p in &pages {
            if txid > 1 {
                sum.toggle(page_checksum(p, &page(p, 1)));
            }
            sum.toggle(page_checksum(p, &page(p, version)));
            enc.encode_page(p, &page(p, version)).unwrap();
        }
        enc.finish(sum.value()).unwrap();
        pre = sum.value();
        states[txid as usize - 1] = (1..=SNAP_PAGES)
            .flat_map(|p| page(p, if txid == 2 && rewritten(p) { 2 } else { 1 }))
            .collect();
    }
    states
}

/// Every page of a chain decoded in many batches on several threads lands once, the newest
/// copy winning, and the database checksum holds (it is compared at the end). Unchecked, the
/// pages go out from the reading thread where the file system takes direct writes (else from
/// the decoder threads); with the check, decoder threads write them, which `large_segment`
/// covers (a chain of two files, restored and compared with the source).
#[test]
fn a_chain_decoded_in_many_batches_restores_the_newest_copy_of_every_page() {
    let f = Fixture {
        dir: tempfile::tempdir().unwrap(),
    };
    let states = write_large_chain(&f.dir.path().join("replica"));
    let o = f.restore(&["--no-integrity-check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("verified"));
    assert!(
        fs::read(f.out()).unwrap() == states[1],
        "latest state differs"
    );
    let o = f.restore(&[
        "--no-integrity-check",
        "--force",
        "--txid",
        "0000000000000001",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(fs::read(f.out()).unwrap() == states[0], "TXID 1 differs");
}

/// A page that does not decode, late in a large file, fails the restore on the decoder thread
/// that meets it while other batches are in flight, with or without the check (the two
/// write paths), naming the page.
#[test]
fn a_page_that_does_not_decode_deep_in_a_large_file_is_refused() {
    let f = Fixture {
        dir: tempfile::tempdir().unwrap(),
    };
    write_large_chain(&f.dir.path().join("replica"));
    let mut b = fs::read(f.l0(1)).unwrap();
    let at = {
        let mut dec = Decoder::new(&b[..]).unwrap();
        let mut frame = Frame::default();
        while dec.read_frame(&mut frame).unwrap() && frame.pgno() != 2400 {}
        assert_eq!(frame.pgno(), 2400);
        frame.offset()
    };
    // The zstd frame's magic, after the page header (6 bytes) and its size (4).
    b[at as usize + 10] ^= 0xff;
    fs::write(f.l0(1), b).unwrap();
    for extra in [&["--no-integrity-check"][..], &[]] {
        f.assert_failed_cleanly(&f.restore(extra), "page 2400: ");
    }
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

/// A rollback journal beside the output (a rollback-mode writer that crashed there) is
/// refused as a WAL is, and removed by `--force`: SQLite rolled it back over the restored
/// database on its first open (foreign pages, and `integrity_check` still said ok).
#[test]
fn a_journal_beside_the_output_needs_force_and_force_removes_it() {
    let f = Fixture::new();
    let journal = f.dir.path().join("out.db-journal");
    fs::write(&journal, b"a hot journal").unwrap();
    let o = f.restore(&[]);
    f.assert_failed_cleanly(&o, "out.db-journal already exists");
    assert_eq!(fs::read(&journal).unwrap(), b"a hot journal");
    let o = f.restore(&["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !journal.exists(),
        "SQLite would roll it back over the output"
    );
}

/// A second restore to the same output while the first writes `<to>.tmp` (its `flock`, taken
/// here by the test) is refused and leaves that file alone: it used to remove and recreate
/// it, and the first then integrity-checked and published the second's pages.
#[test]
fn a_restore_to_an_output_another_restore_is_writing_is_refused() {
    let f = Fixture::new();
    let tmp = f.dir.path().join("out.db.tmp");
    fs::write(&tmp, b"the other restore's pages").unwrap();
    let held = fs::File::open(&tmp).unwrap();
    held.lock().unwrap();
    let o = f.restore(&["--force"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("another restore to"), "{stderr}");
    assert!(!f.out().exists(), "{stderr}");
    assert_eq!(fs::read(&tmp).unwrap(), b"the other restore's pages");
    drop(held);
    // A leftover nobody holds is taken over.
    let o = f.restore(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !tmp.exists(),
        "the leftover is gone once the restore is placed"
    );
    assert!(common::integrity_ok(&f.out()));
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
    // Without --if-replica-exists, a typo is said as one, not as an empty replica.
    let o = Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(["restore", "-o", out.to_str().unwrap()])
        .arg(&missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("does not exist (a typo?)"), "{err}");
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

/// An output among a directory replica's own files would change the backup being read;
/// `--force` (which replaces a file) does not make it right. Also through a symlink to the
/// replica. Elsewhere under the replica's root, nothing reads a file.
#[test]
fn an_output_among_the_replicas_own_files_is_refused_even_with_force() {
    let f = Fixture::new();
    let l0 = f.l0(1);
    let before = fs::read(&l0).unwrap();
    let link = f.dir.path().join("link");
    std::os::unix::fs::symlink(f.dir.path().join("replica"), &link).unwrap();
    let replica = f.replica();
    let outputs = [
        l0.display().to_string(),
        link.join("ltx/0/new.db").display().to_string(),
        link.join("replicad.lease").display().to_string(),
    ];
    for to in &outputs {
        for cmd in ["restore", "snapshot"] {
            let o = Command::new(env!("CARGO_BIN_EXE_replicad"))
                .args([cmd, "--to", to, "--force", &replica])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd} --to {to}: {err}");
            assert!(err.contains("is one of the replica's own files"), "{err}");
        }
    }
    assert_eq!(
        fs::read(&l0).unwrap(),
        before,
        "the replica's file was changed"
    );
    assert!(!f.dir.path().join("replica/ltx/0/new.db").exists());
    assert!(!f.dir.path().join("replica/replicad.lease").exists());
    // Beside ltx/ in the replica's root, a restore is allowed.
    let beside = link.join("restored.db");
    let o = Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(["restore", "--to", beside.to_str().unwrap(), &replica])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
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
        // Not a level: the log filter took it for a target and dropped every line.
        &[
            "--log-level",
            "warning",
            "restore",
            "-o",
            "/tmp/x.db",
            "/tmp",
        ],
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
    // Litestream's -integrity-check with a level it does not have: the valid ones are named.
    for level in [
        &["-integrity-check", "bogus"][..],
        &["-integrity-check=fast"],
    ] {
        let o = Command::new(bin)
            .arg("restore")
            .args(level)
            .args(["-o", "/tmp/x.db", "/tmp"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{level:?}: {err}");
        assert!(err.contains("possible values: none, quick, full"), "{err}");
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

/// A reader that left before the report (`| head -0`, a closed pipe) does not make a finished
/// restore exit 101 with a panic: the database is in place and the exit code says so.
#[test]
fn a_closed_stdout_does_not_fail_a_finished_restore() {
    let f = Fixture::new();
    let out = f.out();
    let replica = f.replica();
    let o = crate::common::run_with_stdout_closed(&[
        "restore",
        "--to",
        out.to_str().unwrap(),
        &replica,
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let conn = rusqlite::Connection::open(&out).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}
