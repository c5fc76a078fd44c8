//! End-to-end tests of `replicad restore --follow`: a read replica kept up to date in place
//! from a replica that the real `replicad replicate` daemon writes while a seeded random
//! writer changes the source. The follower must reach the replica's newest TXID with exactly
//! the source's content, resume after a restart (or a SIGKILL) without a full restore, and
//! refuse, without touching the database, files of another page size or a hole in the chain.
//!
//! Set `REPLICAD_TEST_SEED` to replay a failure (every test prints its seed), and
//! `REPLICAD_TEST_KEEP=1` to keep the temp directories (they are kept anyway on failure).

use crate::common;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use replicad::ltx::Decoder;
use replicad::replicate::maintenance::compactor::{CompactOptions, compact};
use rusqlite::Connection;
use sha2::{Digest, Sha256};

/// A test's layout: the source database, its replica, and the follower's database.
struct Setup {
    dir: TestDir,
    src: PathBuf,
    replica: PathBuf,
    follower: PathBuf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let dir = TestDir::new(name);
        for d in ["src", "follower"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        let src = dir.join("src/app.db");
        let replica = dir.join("replica");
        let follower = dir.join("follower/app.db");
        Setup {
            dir,
            src,
            replica,
            follower,
        }
    }

    fn replicate(&self) -> Daemon {
        self.replicate_db(&self.src, &self.replica)
    }

    fn replicate_db(&self, db: &Path, replica: &Path) -> Daemon {
        spawn_replicate(
            self.dir.path(),
            &[s(db), s(replica), "--monitor-interval", "50ms"],
        )
    }

    /// Starts `replicad restore --follow --follow-interval 100ms --to FOLLOWER REPLICA`.
    fn follow(&self, replica: &Path) -> Daemon {
        self.follow_with(replica, &[])
    }

    /// [`Setup::follow`] with `extra` flags.
    fn follow_with(&self, replica: &Path, extra: &[&str]) -> Daemon {
        let logs = self.dir.join("logs");
        fs::create_dir_all(&logs).unwrap();
        let n = fs::read_dir(&logs).unwrap().count();
        let log = logs.join(format!("follow-{n:02}.log"));
        let out = File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = Command::new(bin())
            .args(["restore", "--follow", "--follow-interval", "100ms"])
            .args(extra)
            .arg("--to")
            .arg(&self.follower)
            .arg(replica)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn replicad restore --follow");
        Daemon { child, log }
    }

    /// The TXID in `<FOLLOWER>-txid`; 0 while there is none.
    fn follower_txid(&self) -> u64 {
        let mut p = self.follower.as_os_str().to_owned();
        p.push("-txid");
        match fs::read_to_string(PathBuf::from(p)) {
            Ok(t) => {
                assert!(t.ends_with('\n') && t.len() == 17, "bad -txid file {t:?}");
                u64::from_str_radix(t.trim(), 16).unwrap()
            }
            Err(_) => 0,
        }
    }

    /// Waits until the follower's TXID reaches `txid` (it must never pass the replica's).
    fn wait_follower(&self, f: &mut Daemon, txid: u64) {
        let ok = wait_until(WAIT, || {
            assert!(
                f.running(),
                "follower exited early; logs:\n{}",
                self.dir.logs()
            );
            self.follower_txid() >= txid
        });
        assert!(
            ok,
            "follower at TXID {:x}, replica at {txid:x} after {WAIT:?}; logs:\n{}\n{}",
            self.follower_txid(),
            self.dir.logs(),
            listing(&self.replica)
        );
        assert_eq!(self.follower_txid(), txid, "follower passed the replica");
    }

    /// Waits for `line` in the follower's log: the `-txid` file moves before the line that
    /// says so is written.
    fn wait_log(&self, f: &Daemon, line: &str) {
        let ok = wait_until(WAIT, || f.log_text().contains(line));
        assert!(ok, "no {line:?} in the log; {}", self.context());
    }

    fn context(&self) -> String {
        format!("{}\n{}", listing(&self.replica), self.dir.logs())
    }
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20));
    }
}

fn inode(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

fn file_sha(p: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(p).unwrap()))
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Stops `replicad replicate` (a clean shutdown with a final sync), once it is up: a SIGTERM
/// before its handlers are installed would kill it.
fn stop_replicate(d: Daemon) {
    let up = wait_until(WAIT, || d.log_text().contains("replicating"));
    assert!(
        up,
        "replicad replicate did not start; log:\n{}",
        d.log_text()
    );
    d.stop_ok();
}

/// The follower exits 0 on SIGTERM.
fn stop_follower(f: Daemon, t: &Setup) {
    let log = f.log.clone();
    let st = f.stop();
    assert_eq!(
        st.code(),
        Some(0),
        "follower exited with {st} after SIGTERM; log:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
    let incoming = t.follower.with_extension("db.incoming");
    assert!(!incoming.exists(), "{} left behind", incoming.display());
}

#[test]
fn follower_tracks_a_live_replica() {
    let seed = seed("follower_tracks_a_live_replica");
    let t = Setup::new("follow-live");
    let mut w = Writer::open(&t.src, seed);
    let rep = t.replicate();
    w.run(20);
    assert!(
        wait_for_txid(&t.replica, 2, WAIT),
        "nothing replicated; {}",
        t.context()
    );
    let mut f = t.follow(&t.replica);
    assert!(
        wait_until(WAIT, || t.follower_txid() > 0),
        "no initial restore; {}",
        t.context()
    );
    // A reader that stays open across the follower's updates.
    let reader = open_ro(&t.follower);
    let before = count(&reader, "SELECT count(*) FROM t0");
    for i in 0..100 {
        w.step();
        w.pause();
        if i == 50 {
            w.vacuum();
        }
        // Readers never see a half-applied file.
        if i % 25 == 10 {
            assert!(
                integrity_ok(&t.follower),
                "integrity_check failed mid-follow"
            );
            count(&reader, "SELECT count(*) FROM t0");
        }
    }
    stop_replicate(rep);
    let target = max_replica_txid(&t.replica);
    t.wait_follower(&mut f, target);
    assert_same_content(&t.src, &t.follower, "live follow");
    let src_rows = count(&open_ro(&t.src), "SELECT count(*) FROM t0");
    let seen = count(&reader, "SELECT count(*) FROM t0");
    assert_eq!(
        seen, src_rows,
        "a reader open since {before} rows does not see the applied changes"
    );
    drop(reader);
    t.wait_log(&f, "applied LTX file");
    let log = f.log_text();
    assert!(!log.contains("ERROR"), "errors while following:\n{log}");
    stop_follower(f, &t);
    // Readers find a rollback-journal database: no WAL is ever looked for.
    let hdr = fs::read(&t.follower).unwrap();
    assert_eq!((hdr[18], hdr[19]), (1, 1));
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut p = t.follower.as_os_str().to_owned();
        p.push(suffix);
        assert!(!PathBuf::from(p).exists(), "follower left a {suffix} file");
    }
}

#[test]
fn follower_resumes_from_its_txid_file() {
    let seed = seed("follower_resumes_from_its_txid_file");
    let t = Setup::new("follow-resume");
    let mut w = Writer::open(&t.src, seed);
    let rep = t.replicate();
    w.run(30);
    stop_replicate(rep);
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    t.wait_log(&f, "restored; following");
    stop_follower(f, &t);
    let ino = inode(&t.follower);
    let first = t.follower_txid();

    // More writes while no follower runs; the first restart is killed mid-catch-up.
    let rep = t.replicate();
    w.run(40);
    w.vacuum();
    w.run(20);
    stop_replicate(rep);
    let target = max_replica_txid(&t.replica);
    assert!(target > first + 1, "only {first:x} -> {target:x}");
    let f = t.follow(&t.replica);
    assert!(
        wait_until(WAIT, || t.follower_txid() > first),
        "no progress after restart; {}",
        t.context()
    );
    f.kill9();
    println!(
        "killed the follower at TXID {:x} (target {target:x})",
        t.follower_txid()
    );

    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, target);
    t.wait_log(&f, "resuming follow");
    let log = f.log_text();
    assert!(
        !log.contains("restored; following"),
        "restarted with a full restore:\n{log}"
    );
    assert_eq!(inode(&t.follower), ino, "the database file was recreated");
    assert_same_content(&t.src, &t.follower, "resumed follow");
    stop_follower(f, &t);
}

#[test]
fn other_page_size_is_refused_and_the_database_kept() {
    let seed = seed("other_page_size_is_refused_and_the_database_kept");
    let t = Setup::new("follow-pagesize");
    let mut w = Writer::open(&t.src, seed);
    let rep = t.replicate();
    w.run(10);
    stop_replicate(rep);
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    stop_follower(f, &t);
    let txid = t.follower_txid();
    let sha = file_sha(&t.follower);

    // Another database, with 1024-byte pages, replicated further than the follower is.
    let other = t.dir.join("src/other.db");
    let other_replica = t.dir.join("other-replica");
    Connection::open(&other)
        .unwrap()
        .execute_batch("PRAGMA page_size=1024; PRAGMA journal_mode=WAL; CREATE TABLE t0 (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB)")
        .unwrap();
    let mut w2 = Writer::open(&other, seed ^ 1);
    let rep2 = t.replicate_db(&other, &other_replica);
    while max_replica_txid(&other_replica) < txid + 3 {
        w2.run(5);
    }
    stop_replicate(rep2);

    let mut f = t.follow(&other_replica);
    let ok = wait_until(WAIT, || f.log_text().contains("1024-byte pages"));
    assert!(ok, "no page size error; log:\n{}", f.log_text());
    sleep(Duration::from_millis(600));
    assert!(f.running(), "the follower gave up; log:\n{}", f.log_text());
    let log = f.log_text();
    assert_eq!(
        log.matches("1024-byte pages").count(),
        1,
        "the error is not logged once per streak:\n{log}"
    );
    assert!(log.contains("ERROR"), "not logged as an error:\n{log}");
    assert_eq!(t.follower_txid(), txid);
    assert_eq!(file_sha(&t.follower), sha, "the database was changed");
    stop_follower(f, &t);
    assert_eq!(file_sha(&t.follower), sha, "the database was changed");
    assert!(integrity_ok(&t.follower));
}

#[test]
fn gap_is_refused_until_bridged_from_level_1() {
    let seed = seed("gap_is_refused_until_bridged_from_level_1");
    let t = Setup::new("follow-gap");
    let mut w = Writer::open(&t.src, seed);
    let rep = t.replicate();
    w.run(15);
    stop_replicate(rep);
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    stop_follower(f, &t);
    let txid = t.follower_txid();
    let sha = file_sha(&t.follower);

    let rep = t.replicate();
    while max_replica_txid(&t.replica) < txid + 4 {
        w.run(5);
    }
    stop_replicate(rep);
    let target = max_replica_txid(&t.replica);

    // A copy of the replica without the level-0 file that follows the follower's TXID, and
    // without any other level that could bridge the hole.
    let holed = t.dir.join("holed");
    copy_dir(&t.replica, &holed);
    for e in fs::read_dir(holed.join("ltx")).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "0" {
            fs::remove_dir_all(e.path()).unwrap();
        }
    }
    let l0 = l0_ranges(&holed);
    let k = l0
        .iter()
        .position(|&(min, _)| min == txid + 1)
        .unwrap_or_else(|| panic!("no L0 file starts at {:x}: {l0:x?}", txid + 1));
    assert!(k >= 1 && k + 1 < l0.len(), "{l0:x?}");
    let name = |(min, max): (u64, u64)| format!("{min:016x}-{max:016x}.ltx");
    let l0_path = |r: (u64, u64)| holed.join("ltx/0").join(name(r));
    let removed = fs::read(l0_path(l0[k])).unwrap();
    fs::remove_file(l0_path(l0[k])).unwrap();

    let mut f = t.follow(&holed);
    let ok = wait_until(WAIT, || f.log_text().contains("chain has a gap"));
    assert!(ok, "no gap error; log:\n{}", f.log_text());
    sleep(Duration::from_millis(500));
    assert!(f.running(), "the follower gave up; log:\n{}", f.log_text());
    assert_eq!(
        f.log_text().matches("chain has a gap").count(),
        1,
        "the error is not logged once per streak:\n{}",
        f.log_text()
    );
    assert_eq!(t.follower_txid(), txid);
    assert_eq!(file_sha(&t.follower), sha, "the database was changed");

    // A level-1 file that overlaps what the follower has and spans the hole: compacted from
    // the L0 files before, in and after it; the L0 file after it is retired too.
    let inputs: Vec<Decoder<File>> = [l0[k - 1], l0[k], l0[k + 1]]
        .iter()
        .map(|&r| {
            let f = if r == l0[k] {
                let p = t.dir.join("removed.ltx");
                fs::write(&p, &removed).unwrap();
                File::open(p).unwrap()
            } else {
                File::open(l0_path(r)).unwrap()
            };
            Decoder::new(f).unwrap()
        })
        .collect();
    let l1 = holed.join("ltx/1");
    fs::create_dir_all(&l1).unwrap();
    let span = (l0[k - 1].0, l0[k + 1].1);
    let tmp = l1.join("compacting.tmp");
    compact(
        inputs,
        File::create(&tmp).unwrap(),
        CompactOptions::default(),
    )
    .unwrap();
    fs::rename(&tmp, l1.join(name(span))).unwrap();
    fs::remove_file(l0_path(l0[k + 1])).unwrap();

    t.wait_follower(&mut f, target);
    let recovered = wait_until(WAIT, || f.log_text().contains("follow recovered"));
    let log = f.log_text();
    assert!(
        log.contains("level=1"),
        "the hole was not bridged from level 1:\n{log}"
    );
    assert!(recovered, "no recovery logged:\n{log}");
    assert_same_content(&t.src, &t.follower, "follow across a bridged hole");
    stop_follower(f, &t);
}

/// A follower's database appears only in its final form: a reader that opens it the moment
/// it exists finds rollback-journal mode (page 1 is set on `<db>.restoring`, before the
/// rename; set after it, a reader in between would open the source's WAL mode).
#[test]
fn a_follower_database_appears_only_in_its_final_form() {
    let t = Setup::new("follow-appears");
    let mut w = Writer::open(
        &t.src,
        seed("a_follower_database_appears_only_in_its_final_form"),
    );
    let rep = t.replicate();
    w.run(5);
    assert!(
        wait_for_txid(&t.replica, 1, WAIT),
        "nothing replicated; {}",
        t.context()
    );
    stop_replicate(rep);
    let restoring = t.follower.with_extension("db.restoring");
    for round in 0..5 {
        let _ = fs::remove_file(&t.follower);
        let _ = fs::remove_file(t.follower.with_extension("db-txid"));
        let mut f = t.follow(&t.replica);
        let deadline = Instant::now() + WAIT;
        // Read the header as soon as the file is there.
        let hdr = loop {
            if let Ok(b) = fs::read(&t.follower) {
                break b;
            }
            assert!(
                Instant::now() < deadline,
                "no follower database; {}",
                t.context()
            );
            std::thread::sleep(Duration::from_micros(100));
        };
        assert_eq!(
            (hdr[18], hdr[19]),
            (1, 1),
            "round {round}: the follower's database appeared in WAL mode"
        );
        t.wait_follower(&mut f, max_replica_txid(&t.replica));
        assert!(!restoring.exists(), "{} left behind", restoring.display());
        stop_follower(f, &t);
    }

    // A database without `-txid` is not the follower's: kept without --force; replaced with
    // it, and the stray WAL beside it removed (SQLite would read it).
    fs::remove_file(t.follower.with_extension("db-txid")).unwrap();
    let kept = fs::read(&t.follower).unwrap();
    let wal = t.follower.with_extension("db-wal");
    fs::write(&wal, b"not ours").unwrap();
    let o = Command::new(bin())
        .args(["restore", "--follow", "--to"])
        .arg(&t.follower)
        .arg(&t.replica)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        fs::read(&t.follower).unwrap(),
        kept,
        "replaced without --force"
    );
    let mut f = t.follow_with(&t.replica, &["--force"]);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    assert!(!wal.exists(), "the stray WAL was kept");
    stop_follower(f, &t);
    assert_same_content(&t.src, &t.follower, "follow --force");
}

/// A restore over a followed database (here to an older TXID) ends its follow position: a
/// later `--follow` resumed from the `-txid` left beside it, applied only the files after that
/// TXID onto a database that did not hold it, and lost the rows between, with
/// `integrity_check` ok.
#[test]
fn a_restore_over_a_followed_database_ends_its_follow_position() {
    let seed = seed("a_restore_over_a_followed_database_ends_its_follow_position");
    let t = Setup::new("follow-overwritten");
    let mut w = Writer::open(&t.src, seed);
    let rep = t.replicate();
    // Several segments, so that TXID 2 is well behind the newest. Random steps may all be
    // checkpoints and rollbacks: each round ends with a commit.
    for _ in 0..4 {
        let before = max_replica_txid(&t.replica);
        w.run(2);
        w.commit_txn();
        assert!(
            wait_until(WAIT, || max_replica_txid(&t.replica) > before),
            "{}",
            t.context()
        );
    }
    stop_replicate(rep);
    assert!(max_replica_txid(&t.replica) >= 4);
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    stop_follower(f, &t);

    let o = Command::new(bin())
        .args(["restore", "--force", "--txid", "0000000000000002", "--to"])
        .arg(&t.follower)
        .arg(&t.replica)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        t.follower_txid(),
        0,
        "the -txid of the replaced database is kept"
    );

    let rep = t.replicate();
    w.run(10);
    stop_replicate(rep);
    let mut f = t.follow_with(&t.replica, &["--force"]);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    t.wait_log(&f, "restored; following");
    assert_same_content(&t.src, &t.follower, "followed again");
    stop_follower(f, &t);
}

/// A WAL beside the output of a first `--follow` is refused before anything is restored (it
/// was found only when the restored file was placed, after the whole download).
#[test]
fn a_wal_beside_a_new_followers_output_is_refused_first() {
    let t = Setup::new("follow-stray-wal");
    fs::write(replicad::restore::sidecar(&t.follower, "-wal"), b"stale").unwrap();
    fs::create_dir_all(&t.replica).unwrap();
    // Without the check it waits for the (empty) replica to get backups, for ever.
    let mut f = t.follow(&t.replica);
    let status = wait_timeout(&mut f.child, WAIT);
    let log = f.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("app.db-wal already exists"), "{log}");
    assert!(!t.follower.exists());
}

/// A SIGINT during the first run's restore stops it at once (exit 1, nothing at `--to`),
/// where the follower used to finish the restore first: here an endpoint that accepts the
/// connection and never answers held it for the S3 client's 60 s read timeout and more.
#[test]
fn a_stop_during_the_first_restore_ends_it_at_once() {
    let dir = TestDir::new("follow-stop-first");
    let out = dir.join("follower.db");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted, connected) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            let _ = accepted.send(());
        }
    });
    let url = format!("s3://bkt/app?endpoint=http://127.0.0.1:{port}&region=us-east-1");
    let mut cmd = Command::new(bin());
    cmd.args(["restore", "--follow", "--to"])
        .arg(&out)
        .arg(&url)
        .env("AWS_ACCESS_KEY_ID", "id")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env_remove("AWS_CA_BUNDLE");
    let mut f = spawn_logged(dir.path(), cmd);
    connected
        .recv_timeout(WAIT)
        .expect("the follower connected to the endpoint");
    sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    sigint(&f.child);
    let status = wait_timeout(&mut f.child, Duration::from_secs(15));
    let text = f.log_text();
    let Some(status) = status else {
        kill9(&mut f.child);
        panic!("still restoring 15 s after SIGINT:\n{text}");
    };
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("cancelled"), "{text}");
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "{:?}",
        signalled.elapsed()
    );
    assert!(!out.exists(), "nothing placed at --to");
}

/// A first restore whose `-txid` cannot be written (here a directory appears at its name
/// after the database was placed, held there by the test gate) takes its database away
/// again: left without its position, the next run refused it as another's ("already exists;
/// pass --force"). Once the way is clear, a run starts as new.
#[test]
fn a_follow_position_that_cannot_be_written_leaves_no_database() {
    let t = Setup::new("follow-no-txid");
    let mut w = Writer::open(&t.src, seed("follow-no-txid"));
    w.run(5);
    let rep = t.replicate();
    assert!(wait_for_txid(&t.replica, 1, WAIT), "{}", t.context());
    rep.stop_ok();
    let gate = t.dir.join("follower/gate");
    fs::write(&gate, b"").unwrap();
    let mut child = Command::new(bin())
        .args(["restore", "--follow", "--to"])
        .arg(&t.follower)
        .arg(&t.replica)
        .env("REPLICAD_TEST_SYNC_GATE", &gate)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(WAIT, || t.follower.exists()), "never placed");
    let in_the_way = t.follower.with_extension("db-txid");
    fs::create_dir_all(in_the_way.join("d")).unwrap();
    fs::remove_file(&gate).unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(!t.follower.exists(), "the database stayed: {stderr}");
    let left: Vec<_> = fs::read_dir(t.dir.join("follower"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("app.db-txid")], "{stderr}");

    fs::remove_dir_all(&in_the_way).unwrap();
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    stop_follower(f, &t);
    assert_same_content(&t.src, &t.follower, "after the way was cleared");
}

/// A follower resumed over another replica's database (its `-txid` at a TXID that replica
/// also has) is refused with the database untouched, where it applied the other replica's
/// pages over it and left a database that fails `integrity_check`: a clean stop records the
/// database's checksum, and the first file after the resume must start from it.
#[test]
fn a_resume_over_another_replicas_database_is_refused() {
    let seed = seed("a_resume_over_another_replicas_database_is_refused");
    let t = Setup::new("follow-other");
    let (src_b, replica_b) = (t.dir.join("src/b.db"), t.dir.join("replica-b"));
    let mut wa = Writer::open(&t.src, seed);
    let rep = t.replicate();
    wa.run(30);
    stop_replicate(rep);
    let mut f = t.follow(&t.replica);
    t.wait_follower(&mut f, max_replica_txid(&t.replica));
    stop_follower(f, &t);
    let at = t.follower_txid();
    let before = file_sha(&t.follower);

    let mut wb = Writer::open(&src_b, seed.wrapping_add(1));
    let rep = t.replicate_db(&src_b, &replica_b);
    let past = wait_until(WAIT, || {
        wb.run(5);
        max_replica_txid(&replica_b) > at + 3
    });
    assert!(
        past,
        "replica b stayed at or below TXID {at:x}; {}",
        t.context()
    );
    stop_replicate(rep);
    let mut f = t.follow(&replica_b);
    let st = wait_timeout(&mut f.child, WAIT);
    let log = f.log_text();
    assert_eq!(st.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("is not this replica's state"), "{log}");
    assert_eq!(file_sha(&t.follower), before, "the database was written");
    assert_eq!(t.follower_txid(), at);
    assert!(integrity_ok(&t.follower));

    // Replica b with its level 0 compacted past the followed TXID: the first file starts
    // before it (unchecked as it is applied), and the file that ends at it says whose it is.
    let compacted = compacted_past(&t.dir.join("b-compacted"), &replica_b, at);
    let mut f = t.follow(&compacted);
    let st = wait_timeout(&mut f.child, WAIT);
    let log = f.log_text();
    assert_eq!(st.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("ends there with checksum"), "{log}");
    assert_eq!(file_sha(&t.follower), before, "the database was written");

    // Its own replica, compacted the same way, still resumes it: the file that ends at the
    // followed TXID agrees.
    let rep = t.replicate();
    let past = wait_until(WAIT, || {
        wa.run(5);
        max_replica_txid(&t.replica) > at + 3
    });
    assert!(
        past,
        "replica a stayed at or below TXID {at:x}; {}",
        t.context()
    );
    stop_replicate(rep);
    let own = compacted_past(&t.dir.join("a-compacted"), &t.replica, at);
    let mut f = t.follow(&own);
    t.wait_log(&f, "resuming follow");
    t.wait_follower(&mut f, max_replica_txid(&own));
    assert_same_content(&t.src, &t.follower, "resumed from a compacted replica");
    assert!(
        !f.log_text().contains("without checking"),
        "{}",
        f.log_text()
    );
    stop_follower(f, &t);
}

/// Replicas whose files carry no checksums (Litestream's, or replicad's lz4): a resume from
/// another replica than the one the last clean stop recorded cannot be checked, and is refused
/// with the database untouched, where it applied the other replica's pages over it and exited
/// 0 with a database that fails `integrity_check`. The recorded replica itself resumes it, as
/// before, without a warning. Two of Litestream's golden replicas (the same steps, other
/// pages), the first cut at TXID 5.
#[test]
fn a_resume_from_another_replica_without_checksums_is_refused() {
    let t = Setup::new("follow-other-unchecked");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5");
    let (a, b) = (t.dir.join("replica-a"), t.dir.join("replica-b"));
    copy_dir(&golden.join("basic-4k/replica"), &a);
    copy_dir(&golden.join("legacy-frames-4k/replica"), &b);
    fs::remove_dir_all(a.join("ltx/9")).unwrap();
    for txid in 6..=9u64 {
        fs::remove_file(a.join(format!("ltx/0/{txid:016x}-{txid:016x}.ltx"))).unwrap();
    }
    let mut f = t.follow(&a);
    t.wait_follower(&mut f, 5);
    stop_follower(f, &t);
    let before = file_sha(&t.follower);

    let mut f = t.follow(&b);
    let st = wait_timeout(&mut f.child, WAIT);
    let log = f.log_text();
    assert_eq!(st.and_then(|s| s.code()), Some(1), "{log}");
    assert!(log.contains("was followed from"), "{log}");
    assert_eq!(file_sha(&t.follower), before, "the database was written");
    assert_eq!(t.follower_txid(), 5);
    assert!(integrity_ok(&t.follower));

    // Its own replica, grown meanwhile (and spelled with a trailing `/`), resumes it without
    // a word.
    for txid in 6..=9u64 {
        let name = format!("ltx/0/{txid:016x}-{txid:016x}.ltx");
        fs::copy(golden.join("basic-4k/replica").join(&name), a.join(&name)).unwrap();
    }
    let mut f = t.follow(Path::new(&format!("{}/", a.display())));
    t.wait_follower(&mut f, 9);
    assert!(
        !f.log_text().contains("without checking"),
        "{}",
        f.log_text()
    );
    stop_follower(f, &t);
    assert!(integrity_ok(&t.follower));
}

/// A copy of `replica` at `to` whose level-0 files that start right after `at` and the next
/// are compacted, with the one before them, into one level-1 file, and retired (as the
/// replica's own compaction and retention do); level 0 goes on after them.
fn compacted_past(to: &Path, replica: &Path, at: u64) -> PathBuf {
    copy_dir(replica, to);
    let l0 = l0_ranges(to);
    let k = l0.iter().position(|&(min, _)| min == at + 1);
    let k = k.unwrap_or_else(|| panic!("no L0 file starts at {:x}: {l0:x?}", at + 1));
    assert!(k >= 1 && l0[k - 1].1 == at && k + 2 < l0.len(), "{l0:x?}");
    let name = |(min, max): (u64, u64)| format!("{min:016x}-{max:016x}.ltx");
    let l0_path = |r: (u64, u64)| to.join("ltx/0").join(name(r));
    let inputs: Vec<Decoder<File>> = [l0[k - 1], l0[k], l0[k + 1]]
        .iter()
        .map(|&r| Decoder::new(File::open(l0_path(r)).unwrap()).unwrap())
        .collect();
    let l1 = to.join("ltx/1");
    fs::create_dir_all(&l1).unwrap();
    let tmp = l1.join("compacting.tmp");
    compact(
        inputs,
        File::create(&tmp).unwrap(),
        CompactOptions::default(),
    )
    .unwrap();
    fs::rename(&tmp, l1.join(name((l0[k - 1].0, l0[k + 1].1)))).unwrap();
    for r in [l0[k], l0[k + 1]] {
        fs::remove_file(l0_path(r)).unwrap();
    }
    to.to_path_buf()
}
