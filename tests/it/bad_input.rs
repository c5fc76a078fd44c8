//! Bad input, never a panic, never a lost byte: each case gives a clear
//! error and leaves the source database, the replica and any previous restore untouched.
//!
//! Restore-side cases already covered by `tests/restore_errors.rs` (flipped byte, truncated
//! file, missing middle file, wrong magic, invalid header flag, a file from a database with
//! another page size) are not repeated here.

use crate::common;

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

/// TXID 0 names no state: a usage error (2), where it was looked for on the replica (1).
#[test]
fn txid_zero_is_a_usage_error() {
    let (_dir, replica, out, previous) = replica_and_previous_restore("txid-zero");
    let o = restore_cmd(&replica, &out, &["--force", "--txid", "0000000000000000"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("TXIDs start at 0000000000000001"), "{err}");
    assert_eq!(fs::read(&out).unwrap(), previous);
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
    assert!(!dir.logs_all().contains("panicked"), "{}", dir.logs());
}

/// Waits until the daemon exits, or ran for at least `min` and its log `says` what is
/// expected (a loaded machine may take longer to get there), or `WAIT` passed.
fn wait_exit_or_log(
    d: &mut Daemon,
    min: Duration,
    says: impl Fn(&str) -> bool,
) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < WAIT {
        if let Some(st) = d.child.try_wait().unwrap() {
            return Some(st);
        }
        if started.elapsed() >= min && says(&d.log_text()) {
            return None;
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
    let says = |log: &str| {
        log.contains("page size") || log.contains("page_size") || log.contains("-byte pages")
    };
    let exited = wait_exit_or_log(&mut d, Duration::from_secs(3), says);
    let log = d.log_text();
    if exited.is_none() {
        d.stop();
    }
    assert!(says(&log), "no clear page-size error; log:\n{log}");
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

/// The default meta directory of `db` (`<dir>/.<name>-replicad`), where staging lives.
fn meta_dir(db: &Path) -> PathBuf {
    let name = db.file_name().unwrap().to_string_lossy();
    db.parent().unwrap().join(format!(".{name}-replicad"))
}

#[test]
fn staging_directory_deleted_while_running_and_missing_at_start() {
    let seed = seed("staging_directory_deleted");
    let dir = TestDir::new("staging-gone");
    fs::create_dir_all(dir.join("db")).unwrap();
    let (db, replica) = (dir.join("db/app.db"), dir.join("replica"));
    let meta = meta_dir(&db);
    let mut w = Writer::open(&db, seed);
    let args = [s(&db), s(&replica), "--monitor-interval", "50ms"];
    let mut d = spawn_replicate(dir.path(), &args);
    // As above: TXID 2 only follows writes made after the first sync.
    w.run(15);
    assert!(wait_for_txid(&replica, 1, WAIT), "{}", dir.logs());
    w.run(5);
    // Everything staged is uploaded before staging goes (a deleted staged segment that never
    // reached the replica is lost by definition).
    assert!(
        wait_stable_txid(&replica, 2, Duration::from_millis(500), WAIT).is_some(),
        "{}",
        dir.logs()
    );
    assert!(meta.join("ltx/0").is_dir());

    // Deleted while the daemon runs: it must keep going and lose no transaction.
    fs::remove_dir_all(&meta).unwrap();
    w.run(25);
    assert!(
        d.running(),
        "daemon exited after its staging was deleted; {}",
        dir.logs()
    );
    d.stop_ok();
    let out = dir.join("restored-1.db");
    restore_ok(s(&replica), &out, None);
    assert_same_content(&db, &out, "after staging was deleted under the daemon");

    // Missing at start.
    fs::remove_dir_all(&meta).unwrap();
    let mut d = spawn_replicate(dir.path(), &args);
    w.run(15);
    assert!(
        d.running(),
        "daemon exited with no staging at start; {}",
        dir.logs()
    );
    d.stop_ok();
    assert_l0_contiguous(&replica);
    let out = dir.join("restored-2.db");
    restore_ok(s(&replica), &out, None);
    assert_same_content(&db, &out, "after a start without staging");
    assert!(!dir.logs_all().contains("panicked"), "{}", dir.logs());
}

/// A small tmpfs mounted at a path, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` when this machine cannot mount one (not root, no CAP_SYS_ADMIN).
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", s(at)])
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let p = dir.join("filler");
    let mut f = fs::File::create(&p).unwrap();
    let chunk = vec![0xa5u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    // Byte by byte to the last one.
    while f.write_all(&[0]).is_ok() {}
    let _ = f.sync_all();
    p
}

#[test]
fn full_disk_during_staging_keeps_the_source_and_recovers_without_loss() {
    let seed = seed("full_disk_during_staging");
    let dir = TestDir::new("disk-full");
    fs::create_dir_all(dir.join("db")).unwrap();
    let (db, replica) = (dir.join("db/app.db"), dir.join("replica"));
    let Some(_tmpfs) = Tmpfs::mount(&meta_dir(&db), "4m") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root and must be able to mount a tmpfs"
        );
        eprintln!("SKIPPED: cannot mount a tmpfs here (not root?)");
        return;
    };
    let mut w = Writer::open(&db, seed);
    let mut d = spawn_replicate(
        dir.path(),
        &[s(&db), s(&replica), "--monitor-interval", "50ms"],
    );
    // The daemon's first sync may take everything written so far into one snapshot (TXID 1):
    // write again after it, so that an incremental segment (TXID 2) is certain to follow.
    w.run(10);
    assert!(wait_for_txid(&replica, 1, WAIT), "{}", dir.logs());
    w.run(10);
    assert!(wait_for_txid(&replica, 2, WAIT), "{}", dir.logs());
    let filler = fill(&meta_dir(&db));

    // The disk is full: commits go on in the source; the daemon reports and waits.
    let before_full = max_replica_txid(&replica);
    for _ in 0..20 {
        w.commit_txn();
    }
    let deadline = Instant::now() + WAIT;
    while !d.log_text().contains("No space left on device") {
        assert!(
            Instant::now() < deadline,
            "no ENOSPC reported; {}",
            dir.logs()
        );
        sleep(Duration::from_millis(50));
    }
    assert!(d.running(), "daemon exited on a full disk; {}", dir.logs());
    assert!(integrity_ok(&db), "the source is damaged");
    let source_hash = content_hash(&db);
    sleep(Duration::from_millis(500));
    assert_eq!(
        content_hash(&db),
        source_hash,
        "the daemon changed the source"
    );
    assert!(
        max_replica_txid(&replica) <= before_full + 1,
        "segments reached the replica while staging was full"
    );

    // Space is back: the daemon catches up without losing a transaction.
    fs::remove_file(&filler).unwrap();
    w.run(10);
    assert!(d.running(), "{}", dir.logs());
    d.stop_ok();
    assert_l0_contiguous(&replica);
    let out = dir.join("restored.db");
    restore_ok(s(&replica), &out, None);
    assert_same_content(&db, &out, "after the disk was full");
    assert!(!dir.logs_all().contains("panicked"), "{}", dir.logs());
}

/// The daemon is given a database it cannot read: a clear error, and neither the path nor
/// the replica changes.
fn assert_unreadable_db_refused(name: &str, make: impl FnOnce(&Path)) {
    let dir = TestDir::new(name);
    fs::create_dir_all(dir.join("db")).unwrap();
    let (db, replica) = (dir.join("db/app.db"), dir.join("replica"));
    make(&db);
    let before = if db.is_dir() {
        snapshot_tree(&db)
    } else {
        BTreeMap::from([(PathBuf::new(), fs::read(&db).unwrap())])
    };
    let mut d = spawn_replicate(
        dir.path(),
        &[s(&db), s(&replica), "--monitor-interval", "50ms"],
    );
    let says = |log: &str| log.contains(s(&db)) && (log.contains("ERROR") || log.contains("error"));
    let exited = wait_exit_or_log(&mut d, Duration::from_secs(2), says);
    let log = d.log_text();
    if exited.is_none() {
        d.stop();
    }
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        says(&log),
        "{name}: no clear error naming the database; log:\n{log}"
    );
    let after = if db.is_dir() {
        snapshot_tree(&db)
    } else {
        BTreeMap::from([(PathBuf::new(), fs::read(&db).unwrap())])
    };
    assert_eq!(before, after, "{name}: the database path changed");
    assert_eq!(
        max_replica_txid(&replica),
        0,
        "{name}: something was replicated"
    );
    for side in ["-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{side}", db.display()));
        assert!(
            !p.exists() || db.is_dir(),
            "{name}: {} was created",
            p.display()
        );
    }
}

#[test]
fn unreadable_database_a_directory() {
    assert_unreadable_db_refused("db-is-dir", |db| {
        fs::create_dir_all(db).unwrap();
        fs::write(db.join("inside"), b"keep me").unwrap();
    });
}

#[test]
fn unreadable_database_not_sqlite() {
    assert_unreadable_db_refused("db-not-sqlite", |db| {
        let junk: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        fs::write(db, junk).unwrap();
    });
}

#[test]
fn unreadable_database_no_permission() {
    if rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: root reads a chmod 000 file anyway (the other unreadable cases run)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    assert_unreadable_db_refused("db-chmod-000", |db| {
        let c = rusqlite::Connection::open(db).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (v); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(c);
        fs::set_permissions(db, fs::Permissions::from_mode(0o000)).unwrap();
    });
}

/// A directory replica given as a file (the database itself, a typo for its directory) is a
/// usage error at start (2), where the daemon ran with the replica never protected; nothing
/// is written to either file.
#[test]
fn a_replica_that_is_a_file_is_refused_at_start() {
    let dir = TestDir::new("replica-file");
    let db = dir.join("app.db");
    common::http::make_db(&db);
    let other = dir.join("notes.txt");
    fs::write(&other, b"mine").unwrap();
    let before = fs::read(&db).unwrap();
    // Accepted, the daemon would run until stopped: a failure, not a hang.
    let run = |args: &[&str]| {
        let log = dir.join("replicate.log");
        let mut child = Command::new(bin())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let status = wait_timeout(&mut child, WAIT);
        if status.is_none() {
            kill9(&mut child);
        }
        (
            status.and_then(|s| s.code()),
            fs::read_to_string(&log).unwrap(),
        )
    };
    for (replica, what) in [(&db, "the database itself"), (&other, "a file")] {
        let (code, err) = run(&["replicate", s(&db), s(replica)]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(&format!("is {what}: a directory replica")),
            "{err}"
        );
        let cfg = dir.join("replicad.yml");
        let yaml = format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            s(&db),
            s(replica)
        );
        fs::write(&cfg, yaml).unwrap();
        let (code, err) = run(&["replicate", "--config", s(&cfg)]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(&format!("is {what}")), "{err}");
    }
    assert_eq!(fs::read(&db).unwrap(), before);
    assert_eq!(fs::read(&other).unwrap(), b"mine");
}
