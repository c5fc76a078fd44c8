//! Tests of `replicad snapshot` and `replicad verify` through the real binary, against the
//! golden replicas Litestream wrote and against a live database replicated by the daemon.

use crate::common;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{TestDir, WAIT, copy_dir, s, spawn_replicate, wait_for_txid, write_file};
use rusqlite::{Connection, params};
use sha2::{Digest, Sha256};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5")
}

fn replicad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(args)
        .output()
        .expect("run replicad")
}

fn show(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// (txid, restored_db_sha256) of every step of a golden scenario.
fn steps(scenario: &str) -> Vec<(u64, String)> {
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(data_dir().join(scenario).join("expected.json")).unwrap())
            .unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["txid"].as_u64().unwrap(),
                s["restored_db_sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn replica(scenario: &str) -> PathBuf {
    data_dir().join(scenario).join("replica")
}

/// No leftover work files beside the output.
fn assert_only(dir: &Path, names: &[&str]) {
    let mut got: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    got.sort();
    let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    want.sort();
    assert_eq!(got, want, "files in {}", dir.display());
}

#[test]
fn snapshot_latest_and_at_a_txid_equal_litestreams_restores() {
    let t = TestDir::new("snapshot-golden");
    for scenario in ["basic-4k", "basic-64k", "compacted-4k"] {
        let steps = steps(scenario);
        let rep = replica(scenario);
        let out_dir = t.join(scenario);
        fs::create_dir_all(&out_dir).unwrap();

        let latest = out_dir.join("latest.db");
        let o = replicad(&["snapshot", s(&rep), "--to", s(&latest)]);
        assert!(o.status.success(), "{scenario}: {}", show(&o));
        assert!(stdout(&o).starts_with("snapshot of "), "{}", show(&o));
        assert_eq!(
            sha256(&fs::read(&latest).unwrap()),
            steps.last().unwrap().1,
            "{scenario} latest"
        );

        // A TXID in the middle of the history (any step: the first one that a plan reaches).
        let (txid, sha) = &steps[steps.len() / 2];
        let at = out_dir.join("at.db");
        let hex = format!("{txid:016x}");
        let o = replicad(&[
            "snapshot",
            "--txid",
            &hex,
            s(&rep),
            "--to",
            s(&at),
            "--json",
        ]);
        assert!(o.status.success(), "{scenario} txid {hex}: {}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["txid"], hex.as_str());
        assert_eq!(v["gzip"], false);
        assert_eq!(v["integrity_check"], "ok");
        assert_eq!(
            v["bytes_written"].as_u64().unwrap(),
            fs::metadata(&at).unwrap().len()
        );
        assert_eq!(
            &sha256(&fs::read(&at).unwrap()),
            sha,
            "{scenario} txid {hex}"
        );
        // A time after every write is the latest state.
        let late = out_dir.join("late.db");
        let o = replicad(&[
            "snapshot",
            "--timestamp",
            "2999-01-01T00:00:00Z",
            s(&rep),
            "--to",
            s(&late),
        ]);
        assert!(o.status.success(), "{scenario}: {}", show(&o));
        assert_eq!(
            sha256(&fs::read(&late).unwrap()),
            steps.last().unwrap().1,
            "{scenario} --timestamp"
        );
        assert_only(&out_dir, &["latest.db", "at.db", "late.db"]);
    }
}

#[test]
fn snapshot_to_gz_gunzips_to_the_expected_database() {
    let t = TestDir::new("snapshot-gz");
    let steps = steps("basic-4k");
    let rep = replica("basic-4k");
    let url = format!("file://{}", rep.display());
    for (txid, sha) in [steps.last().unwrap(), &steps[2]] {
        let out = t.join(&format!("snap-{txid}.db.gz"));
        let hex = format!("{txid:016x}");
        let o = replicad(&["snapshot", &url, "--txid", &hex, "-o", s(&out), "--json"]);
        assert!(o.status.success(), "{}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["gzip"], true);
        let gz = fs::read(&out).unwrap();
        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
        assert_eq!(v["bytes_written"].as_u64().unwrap(), gz.len() as u64);
        let mut db = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut db)
            .unwrap();
        assert_eq!(&sha256(&db), sha, "txid {hex}");
        assert_eq!(
            v["db_size"].as_u64().unwrap(),
            db.len() as u64,
            "db_size is the uncompressed size"
        );
    }
    let mut names: Vec<String> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            format!("snap-{}.db.gz", steps[2].0),
            format!("snap-{}.db.gz", steps.last().unwrap().0)
        ],
        "no work or .tmp files left"
    );
}

/// A `.gz` snapshot to an output another snapshot is compressing into (its `<to>.tmp` under
/// `flock`, taken here by the test) is refused and leaves that file alone; a leftover nobody
/// holds is taken over.
#[test]
fn a_gz_snapshot_to_an_output_another_is_writing_is_refused() {
    let t = TestDir::new("snapshot-busy");
    let steps = steps("basic-4k");
    let rep = replica("basic-4k");
    let out = t.join("snap.db.gz");
    let tmp = t.join("snap.db.gz.tmp");
    fs::write(&tmp, b"the other snapshot").unwrap();
    let held = fs::File::open(&tmp).unwrap();
    held.lock().unwrap();
    let o = replicad(&["snapshot", s(&rep), "--to", s(&out), "--force"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("another snapshot to"),
        "{}",
        show(&o)
    );
    assert!(!out.exists());
    assert_eq!(fs::read(&tmp).unwrap(), b"the other snapshot");
    drop(held);
    let o = replicad(&["snapshot", s(&rep), "--to", s(&out)]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(!tmp.exists());
    let mut db = Vec::new();
    flate2::read::GzDecoder::new(&fs::read(&out).unwrap()[..])
        .read_to_end(&mut db)
        .unwrap();
    assert_eq!(sha256(&db), steps.last().unwrap().1);
}

#[test]
fn snapshot_refuses_an_existing_output_without_force() {
    let t = TestDir::new("snapshot-exists");
    let steps = steps("basic-4k");
    let rep = replica("basic-4k");
    for name in ["out.db", "out.db.gz"] {
        let out = t.join(name);
        fs::write(&out, b"precious").unwrap();
        let o = replicad(&["snapshot", s(&rep), "--to", s(&out)]);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("already exists") && err.contains("--force"),
            "{}",
            show(&o)
        );
        assert_eq!(fs::read(&out).unwrap(), b"precious", "untouched");

        let o = replicad(&["snapshot", s(&rep), "--to", s(&out), "--force"]);
        assert!(o.status.success(), "{}", show(&o));
        let mut bytes = fs::read(&out).unwrap();
        if name.ends_with(".gz") {
            let mut db = Vec::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_end(&mut db)
                .unwrap();
            bytes = db;
        }
        assert_eq!(sha256(&bytes), steps.last().unwrap().1, "{name}");
    }
    // A stale WAL beside a plain database would be replayed onto the snapshot: refused too,
    // and removed with --force.
    let out = t.join("w.db");
    let wal = t.join("w.db-wal");
    fs::write(&wal, b"stale").unwrap();
    let o = replicad(&["snapshot", s(&rep), "--to", s(&out)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(!out.exists());
    let o = replicad(&["snapshot", s(&rep), "--to", s(&out), "--force"]);
    assert!(o.status.success(), "{}", show(&o));
    assert!(!wal.exists());
    assert_eq!(sha256(&fs::read(&out).unwrap()), steps.last().unwrap().1);
}

#[test]
fn a_database_path_without_config_is_a_usage_error() {
    let t = TestDir::new("snapshot-dbpath");
    let db = t.join("app.db");
    Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE x(a)")
        .unwrap();
    let out = t.join("out.db");
    for args in [
        vec!["snapshot", s(&db), "--to", s(&out)],
        vec!["verify", s(&db)],
    ] {
        let o = replicad(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", show(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("--config"),
            "{}",
            show(&o)
        );
    }
    assert!(!out.exists());
}

#[test]
fn verify_ok_on_good_replicas() {
    for scenario in ["basic-4k", "basic-64k", "legacy-frames-4k", "compacted-4k"] {
        let rep = replica(scenario);
        let o = verify(&[s(&rep)]);
        assert_eq!(o.status.code(), Some(0), "{scenario}: {}", show(&o));
        let out = stdout(&o);
        let last = steps(scenario).last().unwrap().0;
        assert!(out.starts_with("OK: replica "), "{}", show(&o));
        assert!(
            out.contains(&format!("restores to TXID {last:016x}")),
            "{}",
            show(&o)
        );
        assert!(out.contains("integrity ok"), "{}", show(&o));
        assert_eq!(out.lines().count(), 1, "one line: {out}");

        let o = verify(&["--json", s(&rep)]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(v["restored"]["txid"], format!("{last:016x}").as_str());
        assert!(v["live"].is_null());
    }
}

#[test]
fn verify_fails_on_a_corrupted_replica() {
    let t = TestDir::new("verify-corrupt");
    let rep = t.join("replica");
    copy_dir(&replica("basic-4k"), &rep);
    // The newest L0 file is in every plan for the latest state.
    let l0 = rep.join("ltx/0");
    let mut files: Vec<PathBuf> = fs::read_dir(&l0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let victim = files.last().unwrap();
    let mut bytes = fs::read(victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(victim, &bytes).unwrap();

    let o = verify(&[s(&rep)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stdout(&o).starts_with("FAILED: "), "{}", show(&o));

    let o = verify(&["--json", s(&rep)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");

    // An empty replica fails too.
    let empty = t.join("empty");
    fs::create_dir_all(&empty).unwrap();
    let o = verify(&[s(&empty)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stdout(&o).starts_with("FAILED: "), "{}", show(&o));
}

/// Runs `replicad verify ARGS`, and checks that it left no temporary directory behind.
fn verify(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_replicad"))
        .arg("verify")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run replicad verify");
    let prefix = format!("replicad-verify-{}-", child.id());
    let o = child.wait_with_output().unwrap();
    let left: Vec<String> = fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(
        left.is_empty(),
        "verify left {left:?} in the temp directory"
    );
    o
}

#[test]
fn verify_with_config_compares_with_the_live_database() {
    let t = TestDir::new("verify-live");
    let db = t.join("app.db");
    let rep = t.join("replica");
    let config = t.join("replicad.yml");
    write_file(
        &config,
        &format!(
            "dbs: [{{path: {}, replica: {{path: {}}}}}]\n",
            s(&db),
            s(&rep)
        ),
    );
    let conn = Connection::open(&db).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB); \
         CREATE INDEX t_v ON t(v);",
    )
    .unwrap();
    let insert = |from: i64, to: i64| {
        for i in from..to {
            conn.execute(
                "INSERT INTO t(id, v) VALUES (?1, randomblob(300))",
                params![i],
            )
            .unwrap();
        }
    };
    insert(0, 50);

    let daemon = spawn_replicate(t.path(), &["--monitor-interval", "50ms", s(&db), s(&rep)]);
    assert!(
        wait_for_txid(&rep, 1, WAIT),
        "nothing replicated; log:\n{}",
        daemon.log_text()
    );
    insert(50, 200);
    conn.execute_batch("UPDATE t SET v = randomblob(10) WHERE id % 3 = 0")
        .unwrap();
    daemon.stop_ok();

    // The writer's connection is still open: the live state is partly in the WAL.
    let o = verify(&["--config", s(&config), s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{}", show(&o));
    assert!(lines[0].starts_with("OK: replica "), "{}", show(&o));
    assert!(lines[1].starts_with("MATCH"), "{}", show(&o));
    let o = verify(&["--strict", "--json", "--config", s(&config), s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["live"]["result"], "match", "{v}");
    assert_eq!(v["live"]["checksum"], v["restored"]["checksum"], "{v}");

    // The daemon is stopped and the application writes on: the live database is ahead. A
    // warning, not a failure, unless --strict.
    insert(200, 210);
    let o = verify(&["--config", s(&config), s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("OK: "), "{}", show(&o));
    assert!(
        lines[1].starts_with("MISMATCH (live database is ahead or differs)"),
        "{}",
        show(&o)
    );
    let o = verify(&["--strict", "--config", s(&config), s(&db)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stdout(&o).starts_with("FAILED: "), "{}", show(&o));
    let o = verify(&["--json", "--config", s(&config), s(&db)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["live"]["result"], "mismatch", "{v}");

    // Catch up (the daemon resumes and uploads the rest), with the writer closed, so the WAL
    // is checkpointed away and the live state is the main file alone.
    let daemon = spawn_replicate(t.path(), &["--monitor-interval", "50ms", s(&db), s(&rep)]);
    let target = common::max_replica_txid(&rep) + 1;
    assert!(
        wait_for_txid(&rep, target, WAIT),
        "no catch-up; log:\n{}",
        daemon.log_text()
    );
    daemon.stop_ok();
    drop(conn);
    let o = verify(&["--config", s(&config), s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        stdout(&o)
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("MATCH")),
        "{}",
        show(&o)
    );
    // Configured, but the database is not on this host: not compared (a failure with --strict).
    let elsewhere = t.join("elsewhere.yml");
    write_file(
        &elsewhere,
        &format!(
            "dbs: [{{path: {}, replica: {{path: {}}}}}]\n",
            s(&t.join("gone.db")),
            s(&rep)
        ),
    );
    let gone = t.join("gone.db");
    let o = verify(&["--config", s(&elsewhere), s(&gone)]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        stdout(&o)
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("NOT COMPARED")),
        "{}",
        show(&o)
    );
    let o = verify(&["--strict", "--config", s(&elsewhere), s(&gone)]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(!gone.exists());

    // The snapshot of the configured database equals its content.
    let snap = t.join("snap.db");
    let o = replicad(&["snapshot", "--config", s(&config), s(&db), "--to", s(&snap)]);
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(
        common::content_hash(&snap),
        common::content_hash(&db),
        "snapshot content"
    );
}

/// SIGTERM while a `.gz` snapshot is being compressed (after its restore): exit 1, and no
/// `.gz`, no `.gz.tmp` and no work file is left (the compression reads through a stop and
/// its output is placed only under the gate).
#[test]
fn a_gz_snapshot_stopped_while_compressing_leaves_no_files() {
    let t = TestDir::new("snap-gz-stop");
    let db = t.join("app.db");
    let rep = t.join("replica");
    let conn = Connection::open(&db).unwrap();
    // About 24 MB that gzip cannot shrink: seconds of compression in a debug build.
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE t(v BLOB);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 6000)
         INSERT INTO t SELECT randomblob(4000) FROM n;",
    )
    .unwrap();
    let daemon = spawn_replicate(t.path(), &["--monitor-interval", "50ms", s(&db), s(&rep)]);
    assert!(
        wait_for_txid(&rep, 1, WAIT),
        "nothing replicated; log:\n{}",
        daemon.log_text()
    );
    daemon.stop_ok();

    let out = t.join("snap.db.gz");
    let gz_tmp = t.join("snap.db.gz.tmp");
    let log = t.join("cmd.log");
    let mut child = Command::new(common::bin())
        .args(["snapshot", "--to", s(&out), s(&rep)])
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while !gz_tmp.exists() {
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none() && std::time::Instant::now() < deadline,
            "compression not caught under way ({exited:?}): {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    common::sigterm(&child);
    let status = common::wait_timeout(&mut child, std::time::Duration::from_secs(20));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("snapshot still running 20 s after SIGTERM");
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("SIGTERM: "), "{text}");
    let left = common::files_under(t.path(), |n| {
        n.starts_with("snap") || n.starts_with(".snap")
    });
    assert!(left.is_empty(), "the stopped snapshot left {left:?}");
}
