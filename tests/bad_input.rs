//! Bad input, never a panic, never a lost byte (issue 7 item 2): each case gives a clear
//! error and leaves the source database, the replica and any previous restore untouched.
//!
//! Restore-side cases already covered by `tests/restore_errors.rs` (flipped byte, truncated
//! file, missing middle file, wrong magic, invalid header flag, a file from a database with
//! another page size) are not repeated here.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn golden_replica() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5/basic-4k/replica")
}

/// Every file under `dir` with its bytes: what "untouched" is compared against.
fn snapshot_tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_path_buf();
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn l0(replica: &Path, min: u64, max: u64) -> PathBuf {
    replica.join(format!("ltx/0/{min:016x}-{max:016x}.ltx"))
}

fn restore_cmd(replica: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(["restore", "--to", s(out)])
        .args(extra)
        .arg(replica)
        .output()
        .unwrap()
}

/// A failed restore: exit 1, `needle` in stderr, and the previous output byte for byte.
fn assert_refused_keeping(o: &Output, needle: &str, out: &Path, previous: &[u8]) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(
        fs::read(out).unwrap(),
        previous,
        "the previous restore at {} changed",
        out.display()
    );
    let tmp = PathBuf::from(format!("{}.tmp", out.display()));
    assert!(!tmp.exists(), "{} left behind", tmp.display());
}

/// A golden replica and a good restore of it at TXID 5 (the "previous restore").
fn replica_and_previous_restore(name: &str) -> (TestDir, PathBuf, PathBuf, Vec<u8>) {
    let dir = TestDir::new(name);
    let replica = dir.join("replica");
    copy_dir(&golden_replica(), &replica);
    let out = dir.join("previous.db");
    let o = restore_cmd(&replica, &out, &["--txid", "0000000000000005"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let previous = fs::read(&out).unwrap();
    (dir, replica, out, previous)
}

#[test]
fn reordered_segments_are_refused_and_a_previous_restore_is_kept() {
    let (_dir, replica, out, previous) = replica_and_previous_restore("reordered");
    // Files 4 and 5 swap names: each name's range no longer matches the file's TXIDs.
    let (a, b) = (l0(&replica, 4, 4), l0(&replica, 5, 5));
    let tmp = replica.join("swap");
    fs::rename(&a, &tmp).unwrap();
    fs::rename(&b, &a).unwrap();
    fs::rename(&tmp, &b).unwrap();
    let before = snapshot_tree(&replica);
    let o = restore_cmd(&replica, &out, &["--force", "--txid", "0000000000000005"]);
    assert_refused_keeping(&o, "renamed or misplaced", &out, &previous);
    assert_eq!(
        snapshot_tree(&replica),
        before,
        "restore changed the replica"
    );
}

#[test]
fn overlapping_segment_ranges_are_refused_and_a_previous_restore_is_kept() {
    let (_dir, replica, out, previous) = replica_and_previous_restore("overlap");
    // A file named 3-5 overlaps 4 and 5 (it holds only TXID 3).
    fs::copy(l0(&replica, 3, 3), l0(&replica, 3, 5)).unwrap();
    let before = snapshot_tree(&replica);
    let o = restore_cmd(&replica, &out, &["--force", "--txid", "0000000000000005"]);
    assert_refused_keeping(&o, "renamed or misplaced", &out, &previous);
    assert_eq!(
        snapshot_tree(&replica),
        before,
        "restore changed the replica"
    );
}

/// Planted in every level directory: names that are not `<min>-<max>.ltx`.
fn plant_foreign(replica: &Path) -> Vec<PathBuf> {
    let mut planted = Vec::new();
    for level in ["0", "1", "9"] {
        let d = replica.join("ltx").join(level);
        fs::create_dir_all(&d).unwrap();
        for (name, body) in [
            ("README.txt", &b"not an LTX file"[..]),
            ("0000000000000001-0000000000000001.ltx.bak", b"backup copy"),
            ("notes.ltx", b"\x00\x01garbage"),
        ] {
            let p = d.join(name);
            fs::write(&p, body).unwrap();
            planted.push(p);
        }
        let sub = d.join("subdir");
        fs::create_dir_all(&sub).unwrap();
        planted.push(sub);
    }
    planted
}

#[test]
fn foreign_files_in_level_directories_are_left_alone_by_daemon_and_restore() {
    let seed = seed("foreign_files_in_level_directories");
    let dir = TestDir::new("foreign");
    fs::create_dir_all(dir.join("db")).unwrap();
    let (db, replica) = (dir.join("db/app.db"), dir.join("replica"));
    let planted = plant_foreign(&replica);
    let planted_bytes: Vec<Option<Vec<u8>>> = planted.iter().map(|p| fs::read(p).ok()).collect();
    let mut w = Writer::open(&db, seed);
    let mut d = spawn_replicate(
        dir.path(),
        &[s(&db), s(&replica), "--monitor-interval", "50ms"],
    );
    w.run(40);
    assert!(d.running(), "daemon exited; {}", dir.logs());
    d.stop_ok();
    assert_l0_contiguous(&replica);
    for (p, bytes) in planted.iter().zip(&planted_bytes) {
        assert!(p.exists(), "{} was removed", p.display());
        assert_eq!(&fs::read(p).ok(), bytes, "{} changed", p.display());
    }
    let out = dir.join("restored.db");
    restore_ok(s(&replica), &out, None);
    assert_same_content(&db, &out, "restore beside foreign files");
    assert!(!dir.logs().contains("panicked"), "{}", dir.logs());
}

fn wait_exit_or_running(d: &mut Daemon, for_: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + for_;
    while Instant::now() < deadline {
        if let Some(st) = d.child.try_wait().unwrap() {
            return Some(st);
        }
        sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn daemon_refuses_a_replica_of_a_database_with_another_page_size() {
    let seed = seed("daemon_refuses_a_replica_of_another_page_size");
    let dir = TestDir::new("foreign-replica");
    fs::create_dir_all(dir.join("a")).unwrap();
    fs::create_dir_all(dir.join("b")).unwrap();
    let replica = dir.join("replica");
    // Database A (4096-byte pages) fills the replica.
    let a = dir.join("a/app.db");
    let mut wa = Writer::open(&a, seed);
    let d = spawn_replicate(
        dir.path(),
        &[s(&a), s(&replica), "--monitor-interval", "50ms"],
    );
    wa.run(20);
    d.stop_ok();
    drop(wa);
    let a_hash = content_hash(&a);
    let replica_before = snapshot_tree(&replica);
    assert!(!replica_before.is_empty());

    // Database B (8192-byte pages) is pointed at A's replica.
    let b = dir.join("b/app.db");
    {
        let c = rusqlite::Connection::open(&b).unwrap();
        c.execute_batch(
            "PRAGMA page_size=8192; PRAGMA journal_mode=WAL;
             CREATE TABLE other (id INTEGER PRIMARY KEY, v TEXT);
             INSERT INTO other (v) VALUES ('b1'), ('b2');",
        )
        .unwrap();
    }
    let b_hash = content_hash(&b);
    let b_bytes = fs::read(&b).unwrap();
    let mut d = spawn_replicate(
        dir.path(),
        &[s(&b), s(&replica), "--monitor-interval", "50ms"],
    );
    let exited = wait_exit_or_running(&mut d, Duration::from_secs(3));
    let log = d.log_text();
    if exited.is_none() {
        d.stop();
    }
    assert!(
        log.contains("page size") || log.contains("page_size") || log.contains("-byte pages"),
        "no clear page-size error; log:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(
        snapshot_tree(&replica),
        replica_before,
        "B's daemon changed A's replica"
    );
    assert_eq!(content_hash(&b), b_hash);
    assert_eq!(fs::read(&b).unwrap(), b_bytes, "B's database file changed");
    let out = dir.join("restored-a.db");
    restore_ok(s(&replica), &out, None);
    assert_eq!(
        content_hash(&out),
        a_hash,
        "A's replica no longer restores A"
    );
}
