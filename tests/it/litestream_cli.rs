//! Litestream command lines (Go `flag` syntax: `-config FILE`, `-txid=X`, `-if-db-not-exists`)
//! run against the real binary: scripts, Dockerfiles and manifests written for Litestream v0.5
//! work with replicad unchanged. The rewriting itself is unit-tested in
//! `src/cli/golang_flags.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

fn replica_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5/basic-4k/replica")
}

fn replica_url() -> String {
    format!("file://{}", replica_dir().display())
}

/// `restored_db_sha256` of TXID `txid` in the golden expected.json.
fn expected_sha(txid: u64) -> String {
    let v: serde_json::Value = serde_json::from_slice(
        &fs::read(replica_dir().parent().unwrap().join("expected.json")).unwrap(),
    )
    .unwrap();
    let step = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["txid"].as_u64() == Some(txid))
        .unwrap_or_else(|| panic!("no step for txid {txid}"));
    step["restored_db_sha256"].as_str().unwrap().to_string()
}

/// The newest TXID of the golden replica.
fn latest_txid() -> u64 {
    let v: serde_json::Value = serde_json::from_slice(
        &fs::read(replica_dir().parent().unwrap().join("expected.json")).unwrap(),
    )
    .unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["txid"].as_u64().unwrap())
        .max()
        .unwrap()
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `replicad ARGS...` in `cwd`.
fn replicad_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run replicad")
}

fn assert_ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A config file `dbs: [{path: DB, replica: {path: REPLICA}}]` in `dir`.
fn write_config(dir: &Path, db: &Path, replica: &Path) -> PathBuf {
    let config = dir.join("litestream.yml");
    fs::write(
        &config,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn restore_txid_with_single_dash_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.db");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-o",
            s(&out),
            "-txid",
            "0000000000000003",
            &replica_url(),
        ],
    );
    assert_ok(&o, "restore -o OUT -txid 3");
    assert_eq!(sha256(&out), expected_sha(3));

    // `-flag=value`, a global flag before the subcommand, and `-integrity-check none`.
    let out2 = dir.path().join("out2.db");
    let o = replicad_in(
        dir.path(),
        &[
            "-log-level",
            "warn",
            "restore",
            "-txid=0000000000000002",
            "-integrity-check",
            "none",
            "-parallelism=2",
            "-o",
            s(&out2),
            &replica_url(),
        ],
    );
    assert_ok(&o, "restore -txid=2 -integrity-check none");
    assert_eq!(sha256(&out2), expected_sha(2));
}

#[test]
fn restore_output_path_that_looks_like_a_flag() {
    // Go takes the argument after `-o` as its value, whatever it looks like.
    let dir = tempfile::tempdir().unwrap();
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-o",
            "-json.db",
            "-integrity-check=full",
            &replica_url(),
        ],
    );
    assert_ok(&o, "restore -o -json.db");
    assert_eq!(
        sha256(&dir.path().join("-json.db")),
        expected_sha(latest_txid())
    );
}

#[test]
fn restore_if_db_not_exists_leaves_an_existing_database() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing.db");
    fs::write(&existing, b"not touched").unwrap();
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-if-db-not-exists",
            "-o",
            s(&existing),
            &replica_url(),
        ],
    );
    assert_ok(&o, "restore -if-db-not-exists");
    assert_eq!(fs::read(&existing).unwrap(), b"not touched");

    // `-if-replica-exists` with an empty replica: nothing to restore, exit 0.
    let empty = dir.path().join("empty-replica");
    fs::create_dir(&empty).unwrap();
    let out = dir.path().join("new.db");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-if-db-not-exists",
            "-if-replica-exists",
            "-o",
            s(&out),
            s(&empty),
        ],
    );
    assert_ok(&o, "restore -if-replica-exists on an empty replica");
    assert!(!out.exists());
}

#[test]
fn restore_timestamp_in_the_future_is_the_latest_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.db");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-o",
            s(&out),
            "-timestamp",
            "2999-01-01T00:00:00Z",
            &replica_url(),
        ],
    );
    assert_ok(&o, "restore -timestamp 2999");
    assert_eq!(sha256(&out), expected_sha(latest_txid()));
}

#[test]
fn restore_from_config_by_database_path() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let config = write_config(dir.path(), &db, &replica_dir());
    let out = dir.path().join("out.db");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-config",
            s(&config),
            "-no-expand-env",
            "-o",
            s(&out),
            s(&db),
        ],
    );
    assert_ok(&o, "restore -config F -o OUT DB");
    assert_eq!(sha256(&out), expected_sha(latest_txid()));
    assert!(!db.exists(), "restore -o must not write the database path");

    // `-dry-run -json` prints the plan and writes nothing.
    let out2 = dir.path().join("out2.db");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-config",
            s(&config),
            "-dry-run",
            "-json",
            "-o",
            s(&out2),
            s(&db),
        ],
    );
    assert_ok(&o, "restore -dry-run -json");
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(plan["txid"].as_str(), Some("0000000000000009"));
    assert!(!out2.exists());
}

#[test]
fn databases_with_single_dash_config() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let rep = dir.path().join("replica");
    let config = write_config(dir.path(), &db, &rep);
    let o = replicad_in(dir.path(), &["databases", "-config", s(&config)]);
    assert_ok(&o, "databases -config F");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(s(&db)), "{stdout}");

    let joined = format!("-config={}", s(&config));
    let o = replicad_in(dir.path(), &["databases", &joined]);
    assert_ok(&o, "databases -config=F");

    let o = replicad_in(dir.path(), &["databases", "-config", s(&config), "-json"]);
    assert_ok(&o, "databases -config F -json");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["path"].as_str(), Some(s(&db)));
}

/// Kills the daemon if a test fails before stopping it.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn ltx_files(replica: &Path) -> usize {
    fs::read_dir(replica.join("ltx/0"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn replicate_with_single_dash_config_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let rep = dir.path().join("replica");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "journal_mode", "wal").unwrap();
        conn.execute_batch(
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
             INSERT INTO t(v) VALUES ('a'), ('b'), ('c');",
        )
        .unwrap();
    }
    let config = write_config(dir.path(), &db, &rep);
    let log = dir.path().join("replicate.log");
    let out = fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(["replicate", "-config", s(&config), "-no-expand-env"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn replicad replicate");
    let mut daemon = Daemon(child);
    let logs = || fs::read_to_string(&log).unwrap_or_default();
    // Up (signal handlers installed) and the first segment uploaded.
    assert!(
        wait_until(Duration::from_secs(30), || logs().contains("replicating")
            && ltx_files(&rep) > 0),
        "replicate did not start; log:\n{}",
        logs()
    );
    let st = Command::new("kill")
        .args(["-TERM", &daemon.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            status = daemon.0.try_wait().unwrap();
            status.is_some()
        }),
        "replicate did not exit on SIGTERM; log:\n{}",
        logs()
    );
    let status = status.unwrap();
    assert_eq!(status.code(), Some(0), "log:\n{}", logs());

    // The replica restores to the database's rows, again with Litestream's flags.
    let out = dir.path().join("restored.db");
    let o = replicad_in(
        dir.path(),
        &["restore", "-config", s(&config), "-o", s(&out), s(&db)],
    );
    assert_ok(&o, "restore of the replicated database");
    let n: i64 = rusqlite::Connection::open(&out)
        .unwrap()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 3);
}

#[test]
fn unknown_single_dash_flags_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let o = replicad_in(dir.path(), &["restore", "-frobnicate", &replica_url()]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = replicad_in(
        dir.path(),
        &[
            "restore",
            "-integrity-check",
            "bogus",
            "-o",
            "x.db",
            &replica_url(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(!dir.path().join("x.db").exists());
}
