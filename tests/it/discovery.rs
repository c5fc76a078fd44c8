//! Directory discovery (`dbs: [{dir: ..., pattern, recursive, watch}]`) with the real binary:
//! databases created and deleted under a watched directory while the daemon runs are added
//! and removed without a restart, each replicated under its relative path; the others go on.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use common::http::{free_port, get_blocking as get};
use common::{
    Daemon, TestDir, WAIT, Writer, bin, content_hash, listing, max_replica_txid, restore_ok, s,
    seed, spawn_replicate, wait_for_txid,
};

/// `GET /status` on 127.0.0.1:`port`, parsed.
pub(crate) fn status(port: u16) -> serde_json::Value {
    let (code, body) = get(port, "/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until the daemon's HTTP endpoint on `port` accepts connections.
pub(crate) fn listening(d: &Daemon, port: u16) {
    wait_until(d, "listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// The database paths `/status` lists, sorted.
pub(crate) fn listed(port: u16) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = status(port)["databases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| PathBuf::from(d["path"].as_str().unwrap()))
        .collect();
    v.sort();
    v
}

/// Polls `cond` until it holds; fails with the daemon's log after [`WAIT`].
pub(crate) fn wait_until(d: &Daemon, what: &str, cond: impl FnMut() -> bool) {
    common::wait_for(what, || d.log_text(), cond);
}

/// Waits until `/status` shows `db` synced with every replica at its TXID, then returns it.
pub(crate) fn caught_up(d: &Daemon, port: u16, db: &Path) -> u64 {
    caught_up_past(d, port, db, 0)
}

/// [`caught_up`] at a TXID above `past`: a database re-added at a known path starts at the
/// replica's tip and reports it, caught up, before its own first sync.
/// First a `replicad sync --wait` (a status read right after a commit may predate it).
pub(crate) fn caught_up_past(d: &Daemon, port: u16, db: &Path, past: u64) -> u64 {
    common::sync_wait(&socket(d), db);
    let mut txid = 0;
    wait_until(d, &format!("{} caught up", db.display()), || {
        let st = status(port);
        let Some(e) = st["databases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"].as_str() == Some(s(db)))
        else {
            return false;
        };
        txid = e["txid"].as_u64().unwrap();
        txid > past
            && e["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["remote_txid"].as_u64() == Some(txid))
    });
    txid
}

/// The control socket's name in the test directory (its config and logs live there too).
pub(crate) const SOCKET: &str = "ctl.sock";

pub(crate) fn socket(d: &Daemon) -> PathBuf {
    let logs = d.log.parent().expect("the log is under <dir>/logs");
    logs.parent()
        .expect("logs is under the test dir")
        .join(SOCKET)
}

pub(crate) fn config(dir: &Path, data: &Path, replica: &Path, port: u16, watch: bool) -> PathBuf {
    let path = dir.join("replicad.yml");
    std::fs::write(
        &path,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nsocket: {{enabled: true, path: {}}}\ndbs:\n  - dir: {}\n    \
             pattern: \"*.db\"\n    recursive: true\n    watch: {watch}\n    replica:\n      \
             url: {}\n",
            dir.join(SOCKET).display(),
            data.display(),
            replica.display()
        ),
    )
    .unwrap();
    path
}

pub(crate) fn remove_db(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", db.display()));
        if p.exists() {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

#[test]
fn watched_directory_adds_and_removes_databases_at_run_time() {
    let seed = seed("discovery_watch");
    let t = TestDir::new("discovery-watch");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    let (a, b, c) = (
        data.join("a.db"),
        data.join("sub/b.db"),
        data.join("later/c.db"),
    );
    let mut wa = Writer::open(&a, seed);
    let mut wb = Writer::open(&b, seed + 1);
    wa.run(10);
    wb.run(10);
    // Matches the pattern but is no database: ignored, whatever its name says.
    std::fs::write(
        data.join("notes.db"),
        "not a database, just text\n".repeat(4),
    )
    .unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);

    wait_until(&d, "both databases listed", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && listed(port) == [a.clone(), b.clone()]
    });
    caught_up(&d, port, &a);
    caught_up(&d, port, &b);

    // A third database, in a directory created while the daemon runs.
    std::fs::create_dir_all(c.parent().unwrap()).unwrap();
    let mut wc = Writer::open(&c, seed + 2);
    wait_until(&d, "c.db discovered", || listed(port).contains(&c));
    for _ in 0..3 {
        wa.run(5);
        wb.run(5);
        wc.run(5);
    }
    caught_up(&d, port, &a);
    caught_up(&d, port, &b);
    caught_up(&d, port, &c);
    let log = d.log_text();
    assert!(log.contains("database discovered"), "{log}");
    assert!(
        !log.contains("notes.db"),
        "a non-SQLite file was picked up:\n{log}"
    );
    assert!(!replica.join("notes.db").exists(), "{}", listing(&replica));

    // Each is restorable from the replica under its relative path, equal to the source.
    for (db, rel) in [(&a, "a.db"), (&b, "sub/b.db"), (&c, "later/c.db")] {
        let out = t.join(&format!("restored-{}", rel.replace('/', "-")));
        restore_ok(s(&replica.join(rel)), &out, None);
        assert_eq!(content_hash(&out), content_hash(db), "{rel}");
    }

    // Delete a.db: only its replication stops.
    let hash_a = content_hash(&a);
    drop(wa);
    remove_db(&a);
    wait_until(&d, "a.db removed", || !listed(port).contains(&a));
    wait_until(&d, "the removal logged", || {
        d.log_text()
            .lines()
            .any(|l| l.contains("database removed") && l.contains(s(&a)))
    });
    // Its drain (if any) is over once the replica stays still for a while.
    common::wait_stable_txid(&replica.join("a.db"), 1, Duration::from_millis(500), WAIT)
        .expect("a.db's replica settles");
    let a_files = listing(&replica.join("a.db"));

    let (b_before, c_before) = (
        max_replica_txid(&replica.join("sub/b.db")),
        max_replica_txid(&replica.join("later/c.db")),
    );
    wb.run(10);
    wc.run(10);
    let tb = caught_up(&d, port, &b);
    let tc = caught_up(&d, port, &c);
    assert!(
        tb > b_before && tc > c_before,
        "{tb} {b_before} {tc} {c_before}"
    );
    assert!(wait_for_txid(&replica.join("sub/b.db"), tb, WAIT));
    assert!(wait_for_txid(&replica.join("later/c.db"), tc, WAIT));
    let mut others = vec![b.clone(), c.clone()];
    others.sort();
    assert_eq!(listed(port), others);
    assert_eq!(
        listing(&replica.join("a.db")),
        a_files,
        "the removed database got new files"
    );
    let discovered = d.log_text();
    let n = discovered
        .lines()
        .filter(|l| l.contains("database discovered"))
        .count();
    assert_eq!(n, 3, "{discovered}");

    drop(wb);
    drop(wc);
    d.stop_ok();
    let out = t.join("restored-a-after");
    restore_ok(s(&replica.join("a.db")), &out, None);
    assert_eq!(content_hash(&out), hash_a);
    for (db, rel) in [(&b, "sub/b.db"), (&c, "later/c.db")] {
        let out = t.join(&format!("final-{}", rel.replace('/', "-")));
        restore_ok(s(&replica.join(rel)), &out, None);
        assert_eq!(content_hash(&out), content_hash(db), "{rel}");
    }
    // `--config F DB_PATH` finds a discovered database's replica too.
    let out = t.join("via-config");
    let o = Command::new(bin())
        .args(["restore", "--config", s(&cfg), "--to", s(&out), s(&c)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(content_hash(&out), content_hash(&c));
    let o = Command::new(bin())
        .args(["databases", "--config", s(&cfg)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains(s(&b)) && text.contains(s(&c)), "{text}");
    assert!(
        !text.contains("notes.db") && !text.contains(s(&a)),
        "{text}"
    );
}

/// A database removed while its replica fails: its replication goes on draining out of
/// sight (it is no longer listed), and a stop meanwhile names what its replica lacks and
/// exits 1, where it said "every segment uploaded" and exited 0.
#[test]
fn a_stop_names_what_a_removed_database_did_not_upload() {
    let t = TestDir::new("discovery-removed-failing");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.db");
    let mut wa = Writer::open(&a, seed("discovery_removed_failing"));
    wa.run(5);
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.insert_str(0, "shutdown-sync-timeout: 1s\n");
    std::fs::write(&cfg, text).unwrap();
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    let tip = caught_up(&d, port, &a);
    // Level 0 of its replica becomes a file: no upload lands any more.
    let l0 = replica.join("a.db/ltx/0");
    std::fs::remove_dir_all(&l0).unwrap();
    std::fs::write(&l0, b"").unwrap();
    wa.run(5);
    wait_until(&d, "the new commits staged", || {
        status(port)["databases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"].as_str() == Some(s(&a)) && e["txid"].as_u64() > Some(tip))
    });
    drop(wa);
    remove_db(&a);
    wait_until(&d, "a.db removed", || !listed(port).contains(&a));
    let log_path = d.log.clone();
    let st = d.stop();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(st.code(), Some(1), "{log}");
    assert!(
        log.contains("removed while replicated") && log.contains(&format!("holds TXID {tip} of")),
        "{log}"
    );
    assert!(!log.contains("every segment uploaded"), "{log}");
}

#[test]
fn without_watch_only_the_databases_present_at_start_are_replicated() {
    let seed = seed("discovery_nowatch");
    let t = TestDir::new("discovery-nowatch");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.db");
    let mut wa = Writer::open(&a, seed);
    wa.run(5);
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, false);
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    caught_up(&d, port, &a);
    let b = data.join("b.db");
    let mut wb = Writer::open(&b, seed + 1);
    wb.run(5);
    wa.run(5);
    let ta = caught_up(&d, port, &a);
    // Many monitor intervals later, b.db is still not replicated.
    sleep(Duration::from_secs(1));
    assert_eq!(listed(port), vec![a.clone()]);
    assert!(!replica.join("b.db").exists(), "{}", listing(&replica));
    assert!(ta > 0);
    drop(wa);
    d.stop_ok();
    let out = t.join("restored");
    restore_ok(s(&replica.join("a.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&a));
}

#[test]
fn discovery_config_errors_exit_2() {
    let t = TestDir::new("discovery-config");
    let data = t.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let run = |name: &str, text: String| {
        let path = t.join(name);
        std::fs::write(&path, text).unwrap();
        Command::new(bin())
            .args(["replicate", "-c", s(&path)])
            .output()
            .unwrap()
    };
    let both = run(
        "both.yml",
        format!(
            "dbs:\n  - path: {}/x.db\n    dir: {}\n    replica:\n      url: {}\n",
            data.display(),
            data.display(),
            t.join("r").display()
        ),
    );
    let err = String::from_utf8_lossy(&both.stderr);
    assert_eq!(both.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`path` and `dir` are mutually exclusive"),
        "{err}"
    );
    assert!(err.contains("line 3"), "{err}");

    let missing = data.join("nope");
    let gone = run(
        "missing.yml",
        format!(
            "dbs:\n  - dir: {}\n    replica:\n      url: {}\n",
            missing.display(),
            t.join("r").display()
        ),
    );
    let err = String::from_utf8_lossy(&gone.stderr);
    assert_eq!(gone.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("dir {}: ", missing.display())),
        "{err}"
    );
}

#[test]
fn a_database_deleted_then_created_again_is_replicated_again() {
    let seed = seed("discovery_recreate");
    let t = TestDir::new("discovery-recreate");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.db");
    let mut wa = Writer::open(&a, seed);
    wa.run(5);
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    let first = caught_up(&d, port, &a);
    drop(wa);
    remove_db(&a);
    wait_until(&d, "a.db removed", || !listed(port).contains(&a));

    // Same path, a different database: it is picked up again and its new content replicated.
    let mut wa = Writer::open(&a, seed + 7);
    wa.run(8);
    wait_until(&d, "a.db discovered again", || listed(port).contains(&a));
    let again = caught_up_past(&d, port, &a, first);
    assert!(
        again > first,
        "TXIDs go on after the old chain: {again} <= {first}"
    );
    drop(wa);
    d.stop_ok();
    let out = t.join("restored");
    restore_ok(s(&replica.join("a.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&a));
}

/// A database found at run time whose start fails is not protected, and every signal says
/// so: `/readyz`, `/status` (listed, `protected: false`, the error) and the exit code of a
/// shutdown meanwhile. The next write to its file retries the start; once it starts, it is
/// replicated and ready like the others.
#[test]
fn a_discovered_database_that_cannot_start_is_reported_until_it_starts() {
    let seed = seed("discovery_unstarted");
    let t = TestDir::new("discovery-unstarted");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.db");
    let mut wa = Writer::open(&a, seed);
    wa.run(5);
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    caught_up(&d, port, &a);
    wait_until(&d, "ready", || get(port, "/readyz").0 == 200);

    // b.db's staging cannot be made, found once its replica's lease is taken: a file is in
    // its place (root or not).
    let b = data.join("b.db");
    std::fs::create_dir_all(data.join(".b.db-replicad")).unwrap();
    let obstacle = data.join(".b.db-replicad/ltx");
    std::fs::write(&obstacle, "in the way").unwrap();
    let mut wb = Writer::open(&b, seed + 1);
    wb.run(5);
    wait_until(&d, "b.db reported", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(&b))
    });
    let (_, body) = get(port, "/readyz");
    assert!(body.contains("not replicated"), "{body}");
    // Its failed start left no replica series: they would count for a replica nothing writes.
    let metrics = get(port, "/metrics").1;
    let b_label = format!("db=\"{}\"", s(&b));
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("replicad_replica_") && l.contains(&b_label)),
        "{metrics}"
    );
    assert_eq!(
        common::http::sample(&metrics, "replicad_db_protected", &b_label),
        Some(0.0),
        "{metrics}"
    );
    assert!(!body.contains(&format!("db {}", s(&a))), "{body}");
    let st = status(port);
    let entry = st["databases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"].as_str() == Some(s(&b)))
        .unwrap_or_else(|| panic!("b.db not listed: {st}"))
        .clone();
    assert_eq!(entry["protected"], false, "{st}");
    assert!(
        entry["error"]
            .as_str()
            .is_some_and(|e| e.contains("not replicated")),
        "{st}"
    );

    // Cleared, the next write to its file (a checkpoint) retries the start: replicated and
    // ready.
    std::fs::remove_file(&obstacle).unwrap();
    wb.run(5);
    wb.checkpoint("TRUNCATE");
    wait_until(&d, "b.db started", || {
        status(port)["databases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| {
                e["path"].as_str() == Some(s(&b))
                    && e["replicas"].as_array().is_some_and(|r| !r.is_empty())
            })
    });
    caught_up(&d, port, &b);
    wait_until(&d, "ready again", || get(port, "/readyz").0 == 200);
    drop(wb);
    d.stop_ok();
    let out = t.join("restored-b");
    restore_ok(s(&replica.join("b.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&b));

    // A shutdown while one cannot start exits 1, naming it.
    std::fs::write(data.join(".c.db-replicad"), "in the way").unwrap();
    let c = data.join("c.db");
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    let mut wc = Writer::open(&c, seed + 2);
    wc.run(5);
    wait_until(&d, "c.db reported", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(&c))
    });
    let log = d.log.clone();
    let status = d.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{text}");
    let named = format!("database {}: not replicated", s(&c));
    assert!(text.contains(&named), "{text}");
}

/// A file whose name matches but which cannot be read (here a symlink to itself, which even
/// root cannot open; a file of another user's is the usual case) is reported as not
/// protected, never skipped in silence: it may be a database.
#[test]
fn a_matching_file_that_cannot_be_read_is_reported() {
    let t = TestDir::new("discovery-unreadable");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.db");
    let mut wa = Writer::open(&a, seed("discovery_unreadable"));
    wa.run(3);
    let looped = data.join("loop.db");
    std::os::unix::fs::symlink("loop.db", &looped).unwrap();
    // No regular file, so no database: never reported.
    std::fs::create_dir_all(t.join("elsewhere")).unwrap();
    let to_dir = data.join("dir.db");
    std::os::unix::fs::symlink(t.join("elsewhere"), &to_dir).unwrap();
    let socket = data.join("sock.db");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    caught_up(&d, port, &a);
    wait_until(&d, "loop.db reported", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(&looped))
    });
    let shown = listed(port);
    assert!(shown.contains(&looped), "{shown:?}");
    assert!(
        !shown.contains(&to_dir) && !shown.contains(&socket),
        "{shown:?}"
    );
    drop(wa);
    let log = d.log.clone();
    let st = d.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
}

/// A database present at start whose start fails stops only itself: the daemon starts, the
/// other databases are replicated, and the failed one is reported by `/readyz` with how it
/// is retried. A watched directory retries it at its next change; without `watch` it stays
/// reported until a restart, and the shutdown exits 1 naming it.
#[test]
fn a_database_that_cannot_start_at_start_up_does_not_stop_the_others() {
    let seed = seed("discovery_start_failure");
    let t = TestDir::new("discovery-start-failure");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    let (a, b) = (data.join("a.db"), data.join("b.db"));
    let mut wa = Writer::open(&a, seed);
    wa.run(5);
    let mut wb = Writer::open(&b, seed + 1);
    wb.run(5);
    // b.db's staging directory cannot be made: a file is in its place (root or not).
    let obstacle = data.join(".b.db-replicad");
    std::fs::write(&obstacle, "in the way").unwrap();
    let b_reported = |port: u16, retry: &str| {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(&b)) && body.contains(retry)
    };

    for watch in [false, true] {
        let port = free_port();
        let cfg = config(t.path(), &data, &replica, port, watch);
        let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
        listening(&d, port);
        caught_up(&d, port, &a);
        let retry = if watch {
            "retried when the file changes"
        } else {
            "restart replicad"
        };
        wait_until(&d, "b.db reported", || b_reported(port, retry));
        let (_, body) = get(port, "/readyz");
        assert!(!body.contains(&format!("db {}", s(&a))), "{body}");
        if !watch {
            let log = d.log.clone();
            let status = d.stop();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert_eq!(status.code(), Some(1), "{text}");
            assert!(
                text.contains(&format!("database {}: not replicated", s(&b))),
                "{text}"
            );
            continue;
        }
        // Cleared, the next write to its file retries the start.
        std::fs::remove_file(&obstacle).unwrap();
        wb.run(5);
        wb.checkpoint("TRUNCATE");
        caught_up(&d, port, &b);
        wait_until(&d, "ready", || get(port, "/readyz").0 == 200);
        drop(wb);
        let log = d.log.clone();
        d.stop_ok();
        // Reported once, at the start: the first rescan, right after it, did not retry it (the
        // next periodic rescan, 60 s on, would; the test ends long before).
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let failures = text
            .lines()
            .filter(|l| l.contains("cannot start the discovered database"))
            .count();
        assert_eq!(failures, 1, "{text}");
        let out = t.join("restored-b");
        restore_ok(s(&replica.join("b.db")), &out, None);
        assert_eq!(content_hash(&out), content_hash(&b));
        break;
    }
}

/// A look at a database the daemon has open keeps SQLite's locks on it. Discovery read the
/// file's header through a descriptor of its own, and closing it released every POSIX lock
/// the daemon held on the file: the first rescan, right after the start, did so for every
/// discovered database already open, and a look at a database configured by `path` inside a
/// watched directory did at each of its checkpoints. The application's last connection could
/// then checkpoint past replicad's read mark and delete the WAL: a false "WAL deleted" error
/// and a full copy each time. The watched directory is named through a symlink here, so
/// that the configured database is another path to the same file: it is told by identity.
#[test]
fn a_look_at_a_database_keeps_the_daemons_locks_on_it() {
    let seed = seed("discovery_locks");
    let t = TestDir::new("discovery-locks");
    let data = t.join("data");
    let link = t.join("link");
    let replica = t.join("replica");
    std::fs::create_dir_all(&data).unwrap();
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let [a, b, e] = ["a", "b", "e"].map(|n| link.join(format!("{n}.db")));
    let c = data.join("c.db");
    let mut wa = Writer::open(&a, seed);
    let mut wc = Writer::open(&c, seed + 1);
    wa.run(3);
    wc.run(3);
    let port = free_port();
    let cfg = t.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\ndormant-after: 0s\n\
             socket: {{enabled: true, path: {}}}\ndbs:\n  - path: {}\n    replica:\n      \
             url: {}\n  - dir: {}\n    pattern: \"*.db\"\n    watch: true\n    replica:\n      \
             url: {}\n",
            t.join(SOCKET).display(),
            c.display(),
            replica.join("configured").display(),
            link.display(),
            replica.join("found").display(),
        ),
    )
    .unwrap();
    let d = spawn_replicate(t.path(), &["-c", s(&cfg)]);
    listening(&d, port);
    caught_up(&d, port, &a);
    caught_up(&d, port, &c);
    // Created after the start: replicated once the first rescan, which walked a.db and c.db,
    // is done.
    let mut wb = Writer::open(&b, seed + 2);
    wb.run(3);
    caught_up(&d, port, &b);
    // c.db's checkpoint writes its file: an event, and a look at it; e.db's creation comes
    // after it, so once e.db is replicated that look is done.
    wc.run(3);
    wc.checkpoint("PASSIVE");
    let mut we = Writer::open(&e, seed + 3);
    we.run(3);
    caught_up(&d, port, &e);
    for db in [&a, &b, &c, &e] {
        assert!(
            holds_shared_lock(d.pid(), db),
            "the daemon holds no SQLite lock on {}:\n{}",
            db.display(),
            std::fs::read_to_string("/proc/locks").unwrap()
        );
    }
    // link/c.db, the configured database under another path, cannot start twice: reported.
    let _ = d.stop();
}

/// Whether process `pid` holds SQLite's SHARED lock (a POSIX read lock on the bytes from
/// 0x40000002) on the database file at `db`, as `/proc/locks` lists it.
fn holds_shared_lock(pid: u32, db: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(db).unwrap().ino().to_string();
    let (pid, start) = (pid.to_string(), (0x4000_0002u64).to_string());
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8
                && f[1] == "POSIX"
                && f[4] == pid
                && f[5].rsplit(':').next() == Some(ino.as_str())
                && f[6] == start
        })
}
