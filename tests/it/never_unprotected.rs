//! Never silently unprotected: every situation in which replicad used to stop protecting a
//! database while saying all was well, run through the real binary on real files. Each
//! either heals by itself or is reported by `/readyz`, `/status`, the metrics and the exit
//! code; once the cause is gone, the restore equals the source.

use crate::common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::http::{free_port, sample};
use common::*;
use rusqlite::Connection;

/// `GET path` on 127.0.0.1:`port`: (status, body); (0, "") while nothing listens.
pub(crate) fn get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    if raw.is_empty() {
        return (0, String::new());
    }
    common::http::parse_response(&raw)
}

/// The control socket of the daemon on `port` (`replicad sync`).
fn socket(dir: &TestDir, port: u16) -> PathBuf {
    dir.join(&format!("ctl-{port}.sock"))
}

/// A config replicating `db` to every directory of `replicas`, HTTP on `port`.
pub(crate) fn config(
    dir: &TestDir,
    db: &Path,
    replicas: &[&Path],
    port: u16,
    extra: &str,
) -> PathBuf {
    let mut y = format!(
        "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nheartbeat-interval: 100ms\nmax-lag: 300ms\n\
         socket: {{enabled: true, path: {}}}\n{extra}dbs:\n  - path: {}\n    replicas:\n",
        socket(dir, port).display(),
        db.display()
    );
    for (i, r) in replicas.iter().enumerate() {
        y.push_str(&format!(
            "      - name: r{i}\n        url: {}\n",
            r.display()
        ));
    }
    let path = dir.join(&format!("replicad-{port}.yml"));
    fs::write(&path, y).unwrap();
    path
}

/// L1 compaction every 200 ms: staging drops what L1 covers soon after it is uploaded.
const FAST_L1: &str = "levels:\n  - interval: 200ms\n";

pub(crate) fn new_db(path: &Path) -> Connection {
    let c = Connection::open(path).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT);",
    )
    .unwrap();
    c
}

pub(crate) fn insert(c: &Connection, n: usize, tag: &str) {
    for i in 0..n {
        c.execute("INSERT INTO t(v) VALUES (?1)", [format!("{tag}-{i}")])
            .unwrap();
    }
}

fn ready(port: u16) -> bool {
    get(port, "/readyz").0 == 200
}

/// Waits until the daemon has staged everything (ready) and `replica` holds the database's
/// TXID as `/status` reports it, and the daemon has counted that upload: every replica's
/// `remote_txid` has reached it too (a file is visible before its metrics are updated).
pub(crate) fn wait_caught_up(dir: &TestDir, port: u16, replica: &Path) {
    wait_until(dir, "the replica to hold the database's TXID", || {
        let (code, body) = get(port, "/status");
        if code != 200 {
            return false;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let txid = v["databases"][0]["txid"].as_u64().unwrap_or(0);
        let counted = v["databases"][0]["replicas"]
            .as_array()
            .is_some_and(|rs| rs.iter().all(|r| r["remote_txid"].as_u64() >= Some(txid)));
        txid > 0 && counted && ready(port) && max_replica_txid(replica) >= txid
    });
}

pub(crate) fn restored_equals(dir: &TestDir, replica: &Path, source: &Path, name: &str) {
    let out = dir.join(name);
    restore_ok(s(replica), &out, None);
    assert_same_content(source, &out, name);
}

/// Starts a daemon replicating `db` to `a` with level-1 compactions every 200 ms (and
/// `extra`), commits `rows` more rows, and waits until staging no longer holds the first
/// segment: from then on only a seed can make `a` whole again.
fn replicating_past_staging(
    dir: &TestDir,
    db: &Path,
    a: &Path,
    c: &Connection,
    port: u16,
    rows: usize,
    extra: &str,
) -> Daemon {
    let extra = format!("{FAST_L1}{extra}");
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(dir, db, &[a], port, &extra))],
    );
    wait_caught_up(dir, port, a);
    insert(c, rows, "second");
    wait_caught_up(dir, port, a);
    wait_until(dir, "staging to be pruned", || {
        !dir.join(".app.db-replicad/ltx/0/0000000000000001-0000000000000001.ltx")
            .exists()
    });
    d
}

#[test]
fn a_replica_added_later_is_seeded_with_a_snapshot() {
    let dir = TestDir::new("added-later");
    let db = dir.join("app.db");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let c = new_db(&db);
    insert(&c, 50, "first");
    let port = free_port();
    // More segments, compacted into L1, so that staging no longer holds the first ones.
    let d = replicating_past_staging(&dir, &db, &a, &c, port, 50, "");
    d.stop_ok();
    insert(&c, 50, "between");

    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a, &b], port, FAST_L1))],
    );
    insert(&c, 50, "after");
    wait_caught_up(&dir, port, &b);
    let metrics = get(port, "/metrics").1;
    let labels = format!("db=\"{}\",reason=\"empty\",replica=\"r1\"", db.display());
    assert_eq!(
        sample(&metrics, "replicad_replica_reseeds_total", &labels),
        Some(1.0),
        "{metrics}"
    );
    let log = d.log_text();
    d.stop_ok();
    assert!(log.contains("replica re-seeded"), "{log}");
    assert_eq!(level_ranges(&b, 9).len(), 1, "{}", listing(&b));
    restored_equals(&dir, &b, &db, "from-b.db");
    restored_equals(&dir, &a, &db, "from-a.db");
}

/// Local staging lost and one replica emptied while the daemon was down, the database idle
/// after the restart: the empty replica is seeded at once from the position the other
/// replica gives, with no write needed (it used to wait for the next commit, reporting "no
/// position to seed from yet").
#[test]
fn an_idle_database_with_lost_staging_seeds_an_empty_replica() {
    let dir = TestDir::new("lost-staging-idle");
    let db = dir.join("app.db");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let c = new_db(&db);
    insert(&c, 20, "first");
    let port = free_port();
    let cfg = config(&dir, &db, &[&a, &b], port, "");
    let d = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    wait_caught_up(&dir, port, &b);
    d.stop_ok();
    drop(c);
    fs::remove_dir_all(dir.join(".app.db-replicad")).unwrap();
    fs::remove_dir_all(&b).unwrap();

    let port = free_port();
    let cfg = config(&dir, &db, &[&a, &b], port, "");
    let d = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    // `/status` counts the seed only after its log line (the file is visible before).
    wait_caught_up(&dir, port, &b);
    let log = d.log_text();
    d.stop_ok();
    assert!(log.contains("replica re-seeded"), "{log}");
    assert!(!log.contains("no position to seed from yet"), "{log}");
    restored_equals(&dir, &b, &db, "from-b.db");
    restored_equals(&dir, &a, &db, "from-a.db");
}

#[test]
fn a_replica_wiped_while_running_is_seeded_again() {
    let dir = TestDir::new("wiped");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 20, "first");
    let port = free_port();
    let d = replicating_past_staging(&dir, &db, &a, &c, port, 20, "");
    wipe_dir(&a);
    // The next commit's upload round finds the lease gone, lists the replica, and re-seeds.
    insert(&c, 20, "after-wipe");
    // A heartbeat may re-seed the replica before the daemon sees the commit: the status
    // alone could report it caught up at the TXID before "after-wipe".
    common::sync_wait(&socket(&dir, port), &db);
    wait_caught_up(&dir, port, &a);
    let metrics = get(port, "/metrics").1;
    let labels = format!("db=\"{}\",reason=\"wiped\",replica=\"r0\"", db.display());
    assert_eq!(
        sample(&metrics, "replicad_replica_reseeds_total", &labels),
        Some(1.0),
        "{metrics}\n{}",
        d.log_text()
    );
    restored_equals(&dir, &a, &db, "while-running.db");
    insert(&c, 20, "last");
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    restored_equals(&dir, &a, &db, "after-stop.db");
}

/// Files deleted behind replicad's back while its lease stays (a bucket's expiry rule, a
/// person) leave an idle replica that no request would ever look at: the periodic listing
/// (`replica-check-interval`) finds that it no longer restores and re-seeds it, with no commit.
#[test]
fn files_deleted_behind_an_idle_replica_are_found_by_its_periodic_listing() {
    let dir = TestDir::new("expired");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 20, "first");
    let port = free_port();
    let check = "replica-check-interval: 1s\n";
    let d = replicating_past_staging(&dir, &db, &a, &c, port, 20, check);
    // Every file goes at once (moved out of the replica: no listing sees half of it), the
    // lease stays.
    fs::rename(a.join("ltx"), dir.join("expired-ltx")).unwrap();
    assert!(a.join("replicad.lease").exists());
    let labels = format!("db=\"{}\",reason=\"wiped\",replica=\"r0\"", db.display());
    wait_until(
        &dir,
        "the listing to find the replica empty and re-seed it",
        || {
            sample(
                &get(port, "/metrics").1,
                "replicad_replica_reseeds_total",
                &labels,
            )
            .is_some_and(|n| n >= 1.0)
        },
    );
    wait_caught_up(&dir, port, &a);
    restored_equals(&dir, &a, &db, "after-expiry.db");
    d.stop_ok();
}

/// A stop whose database's sync does not return (held by the test gate: a hung disk) exits
/// anyway, `shutdown-sync-timeout` plus a few seconds after SIGTERM, with exit code 1 and
/// the database named as not uploaded, where it waited for the sync without end; the next
/// start uploads what it held.
#[test]
fn a_stop_does_not_wait_for_a_sync_that_never_returns() {
    let dir = TestDir::new("hung-stop");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 10, "first");
    let gate = dir.join("gate");
    let port = free_port();
    let cfg = config(&dir, &db, &[&a], port, "shutdown-sync-timeout: 1s\n");
    let d = spawn_replicate_env(
        dir.path(),
        &["--config", s(&cfg)],
        &[("REPLICAD_TEST_SYNC_GATE", s(&gate))],
    );
    wait_caught_up(&dir, port, &a);
    fs::write(&gate, b"").unwrap();
    insert(&c, 10, "held");
    // Nothing says a sync is held before it has run for 10 s; a tick comes every 50 ms. A
    // sync not yet held would let the stop exit 0: the test fails then, it never passes.
    sleep(Duration::from_secs(1));
    let log = d.log.clone();
    let st = d.stop();
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
    assert!(text.contains("exiting without waiting for it"), "{text}");
    assert!(
        text.contains(&format!(
            "database {}: a sync or check had not returned",
            db.display()
        )),
        "{text}"
    );
    fs::remove_file(&gate).unwrap();
    let d = spawn_replicate_env(
        dir.path(),
        &["--config", s(&cfg)],
        &[("REPLICAD_TEST_SYNC_GATE", s(&gate))],
    );
    wait_caught_up(&dir, port, &a);
    restored_equals(&dir, &a, &db, "after-the-hung-stop.db");
    // Idle, every commit uploaded: the stop's own final sync hangs, and is named too, where
    // the stop said every segment was uploaded and exited 0.
    fs::write(&gate, b"").unwrap();
    let log = d.log.clone();
    let st = d.stop();
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "database {}: a sync or check had not returned",
            db.display()
        )),
        "{text}"
    );
    assert!(!text.contains("every segment uploaded"), "{text}");
    fs::remove_file(&gate).unwrap();
}

/// A maintenance job whose work was then done another way stops being reported: snapshots
/// and level-1 compactions fail (their build directory is a file, and stays one), then the
/// replica's files go behind an idle database's back and the periodic listing re-seeds it,
/// which stores the snapshot at the tip and leaves nothing to compact. The report clears
/// with no commit and no job run, where it stood until a snapshot next ran.
#[test]
fn a_failed_job_whose_work_a_seed_did_is_no_longer_reported() {
    let dir = TestDir::new("moot");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 20, "first");
    let port = free_port();
    let extra = "replica-check-interval: 1s\nsnapshot: {interval: 300ms}\n";
    let d = replicating_past_staging(&dir, &db, &a, &c, port, 20, extra);
    let tmp = dir.join(".app.db-replicad/tmp");
    fs::remove_dir_all(&tmp).unwrap();
    fs::write(&tmp, b"in the way").unwrap();
    let maint = || {
        let (_, body) = get(port, "/status");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["databases"][0]["replicas"][0]["maintenance_error"].clone()
    };
    insert(&c, 5, "third");
    wait_until(&dir, "the failing snapshot reported", || {
        maint().as_str().is_some_and(|e| e.contains("Snapshot"))
    });
    wait_caught_up(&dir, port, &a);
    fs::rename(a.join("ltx"), dir.join("gone-ltx")).unwrap();
    let labels = format!("db=\"{}\",reason=\"wiped\",replica=\"r0\"", db.display());
    wait_until(&dir, "the re-seed", || {
        sample(
            &get(port, "/metrics").1,
            "replicad_replica_reseeds_total",
            &labels,
        )
        .is_some_and(|n| n >= 1.0)
    });
    wait_until(&dir, "the report cleared", || maint().is_null());
    assert!(tmp.is_file(), "no job could have run");
    let log = d.log_text();
    assert!(log.contains("its failure no longer stands"), "{log}");
    assert!(
        !log.contains("maintenance runs again"),
        "no job ran:\n{log}"
    );
    wait_caught_up(&dir, port, &a);
    restored_equals(&dir, &a, &db, "after-seed.db");
    d.stop_ok();
}

/// A sync that blocks without an error (a staging write on a dying disk, a hung file system,
/// stood in for by the `REPLICAD_TEST_SYNC_GATE` file that holds it on the blocking pool)
/// makes the database not protected in every signal, and the log, once it has run for 10 s,
/// though nothing failed; once it ends, the commits it held back ship and the database is
/// protected again.
#[test]
fn a_sync_that_hangs_is_reported_while_it_hangs() {
    let dir = TestDir::new("hung-sync");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 10, "first");
    let gate = dir.join("gate");
    let port = free_port();
    let d = spawn_replicate_env(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
        &[("REPLICAD_TEST_SYNC_GATE", s(&gate))],
    );
    wait_caught_up(&dir, port, &a);
    wait_until(&dir, "ready", || get(port, "/readyz").0 == 200);

    fs::write(&gate, b"").unwrap();
    insert(&c, 10, "held");
    wait_until(&dir, "/readyz to report the hung sync", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("has been running for")
    });
    let status = get(port, "/status").1;
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["databases"][0]["protected"], false, "{status}");
    let metrics = get(port, "/metrics").1;
    let label = format!("db=\"{}\"", db.display());
    assert_eq!(sample(&metrics, "replicad_db_protected", &label), Some(0.0));
    wait_until(&dir, "the ERROR line", || {
        d.log_text().contains("NOT protected until it ends")
    });

    fs::remove_file(&gate).unwrap();
    wait_caught_up(&dir, port, &a);
    wait_until(&dir, "ready again", || get(port, "/readyz").0 == 200);
    let metrics = get(port, "/metrics").1;
    assert_eq!(sample(&metrics, "replicad_db_protected", &label), Some(1.0));
    d.stop_ok();
    restored_equals(&dir, &a, &db, "after-the-hang.db");
}

/// The `/status` entry of `db` (the order of several databases is that of their starts).
pub(crate) fn entry<'a>(status: &'a serde_json::Value, db: &Path) -> &'a serde_json::Value {
    status["databases"]
        .as_array()
        .and_then(|dbs| dbs.iter().find(|d| d["path"].as_str() == Some(s(db))))
        .unwrap_or(&serde_json::Value::Null)
}

/// [`wait_caught_up`] for `db` among several databases, at a TXID above `past`; returns it.
pub(crate) fn caught_up(dir: &TestDir, port: u16, db: &Path, replica: &Path, past: u64) -> u64 {
    let mut at = 0;
    wait_until(dir, "the replica to hold the database's TXID", || {
        let v: serde_json::Value = serde_json::from_str(&get(port, "/status").1).unwrap();
        let e = entry(&v, db);
        at = e["txid"].as_u64().unwrap_or(0);
        let counted = e["replicas"]
            .as_array()
            .is_some_and(|rs| rs.iter().all(|r| r["remote_txid"].as_u64() >= Some(at)));
        at > past && counted && e["protected"] == true && max_replica_txid(replica) >= at
    });
    at
}

/// Adds the database `db`, replicated to `replica`, to the config file `cfg`.
pub(crate) fn add_database(cfg: &Path, db: &Path, replica: &Path) {
    let yaml = fs::read_to_string(cfg).unwrap();
    let more = format!(
        "  - path: {}\n    replicas:\n      - name: r0\n        url: {}\n",
        db.display(),
        replica.display()
    );
    fs::write(cfg, yaml + &more).unwrap();
}

/// `/status` answers 200.
pub(crate) fn get_status_ok(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok() && get(port, "/status").0 == 200
}

/// A database on a network file system (NFS, a FUSE mount) whose server stops answering: its
/// idle check runs on the blocking pool, so while it hangs (stood in for by
/// `REPLICAD_TEST_SYNC_GATE`; `REPLICAD_TEST_NETWORK_FS` stands in for the mount) the other
/// databases go on replicating and every signal still answers, and reports this one once it
/// has hung for 10 s. On the runtime's own thread (one here), the hang would stall them all.
#[test]
fn a_hung_network_file_system_stops_only_its_own_database() {
    let t = NfsPair::new("hung-nfs");
    let (dir, db, other, a, b, gate, port) = (&t.dir, &t.db, &t.other, &t.a, &t.b, &t.gate, t.port);
    let o = Connection::open(other).unwrap();
    let d = spawn_replicate_env(
        dir.path(),
        &["--config", s(&t.cfg)],
        &[
            ("REPLICAD_TEST_SYNC_GATE", s(gate)),
            ("REPLICAD_TEST_NETWORK_FS", s(&dir.join("nfs"))),
            // One runtime thread, as on a one-core host: a hang on it would stall everything.
            ("TOKIO_WORKER_THREADS", "1"),
        ],
    );
    wait_until(dir, "the daemon to answer", || get_status_ok(port));
    caught_up(dir, port, db, a, 0);
    let txid = caught_up(dir, port, other, b, 0);
    // Registering a watch resolves the path, which may hang there: the database polls.
    let metrics = get(port, "/metrics").1;
    let watched = |p: &Path| {
        let label = format!("db=\"{}\"", p.display());
        sample(&metrics, "replicad_db_commit_watched", &label)
    };
    assert_eq!(
        (watched(db), watched(other)),
        (Some(0.0), Some(1.0)),
        "{metrics}"
    );

    // No commit: the idle check itself hangs (a sync would wait at the gate whatever ran it).
    fs::write(gate, b"").unwrap();
    // The other database is replicated meanwhile.
    insert(&o, 10, "meanwhile");
    let txid = caught_up(dir, port, other, b, txid);
    wait_until(dir, "/readyz to report the hung database", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(db)) && body.contains("has been running for")
    });
    let (_, body) = get(port, "/readyz");
    assert!(!body.contains(s(other)), "{body}");
    insert(&o, 10, "still");
    caught_up(dir, port, other, b, txid);

    t.release_and_restore(d);
}

/// Two databases for a daemon on `port` (`cfg`): `db` in `nfs/`, a directory standing in for
/// a network mount, where `gate` (`REPLICAD_TEST_SYNC_GATE`) holds its file work, and `other`
/// beside it; replicated to `a` and `b`.
pub(crate) struct NfsPair {
    pub(crate) dir: TestDir,
    pub(crate) db: PathBuf,
    pub(crate) other: PathBuf,
    pub(crate) a: PathBuf,
    pub(crate) b: PathBuf,
    pub(crate) gate: PathBuf,
    pub(crate) port: u16,
    pub(crate) cfg: PathBuf,
}

impl NfsPair {
    pub(crate) fn new(name: &str) -> NfsPair {
        let dir = TestDir::new(name);
        fs::create_dir_all(dir.join("nfs")).unwrap();
        let (db, other) = (dir.join("nfs/app.db"), dir.join("local.db"));
        let (a, b) = (dir.join("a"), dir.join("b"));
        insert(&new_db(&db), 10, "first");
        insert(&new_db(&other), 10, "first");
        let (gate, port) = (dir.join("nfs/gate"), free_port());
        let cfg = config(&dir, &db, &[&a], port, "");
        add_database(&cfg, &other, &b);
        NfsPair {
            dir,
            db,
            other,
            a,
            b,
            gate,
            port,
            cfg,
        }
    }

    /// Opens the gate; once both databases are caught up and the daemon ready, stops it
    /// (exit 0) and checks that both replicas restore equal to their sources.
    pub(crate) fn release_and_restore(&self, d: Daemon) {
        let (dir, port) = (&self.dir, self.port);
        fs::remove_file(&self.gate).unwrap();
        wait_until(dir, "the daemon to answer", || get_status_ok(port));
        caught_up(dir, port, &self.db, &self.a, 0);
        wait_until(dir, "ready again", || get(port, "/readyz").0 == 200);
        d.stop_ok();
        restored_equals(dir, &self.a, &self.db, "after-the-hang.db");
        restored_equals(dir, &self.b, &self.other, "the-other.db");
    }
}

#[test]
fn a_failed_local_write_is_reported_and_then_healed() {
    let dir = TestDir::new("failed-publish");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 10, "first");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_caught_up(&dir, port, &a);
    // A directory where the next staged segment goes: its publish (rename) fails.
    let next = max_replica_txid(&a) + 1;
    let obstacle = dir
        .join(".app.db-replicad/ltx/0")
        .join(format!("{next:016x}-{next:016x}.ltx"));
    fs::create_dir(&obstacle).unwrap();
    fs::write(obstacle.join("keep"), b"x").unwrap();
    insert(&c, 10, "blocked");
    wait_until(&dir, "/readyz to report the database", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(&db.display().to_string()) && body.contains("not protected")
    });
    let status = get(port, "/status").1;
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["databases"][0]["protected"], false, "{status}");
    let metrics = get(port, "/metrics").1;
    let label = format!("db=\"{}\"", db.display());
    assert_eq!(sample(&metrics, "replicad_db_protected", &label), Some(0.0));
    fs::remove_dir_all(&obstacle).unwrap();
    insert(&c, 10, "healed");
    // Backoff paces the retries: a few seconds at most here.
    wait_caught_up(&dir, port, &a);
    let metrics = get(port, "/metrics").1;
    assert_eq!(sample(&metrics, "replicad_db_protected", &label), Some(1.0));
    insert(&c, 10, "more");
    wait_caught_up(&dir, port, &a);
    let log = d.log_text();
    d.stop_ok();
    assert!(log.contains("NOT protected"), "{log}");
    assert!(log.contains("the database is protected again"), "{log}");
    restored_equals(&dir, &a, &db, "healed.db");
}

#[test]
fn a_replaced_database_file_is_replicated_as_a_full_copy() {
    let dir = TestDir::new("replaced");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 30, "old");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_caught_up(&dir, port, &a);
    let old_txid = max_replica_txid(&a);
    let old_copy = dir.join("old-copy.db");
    restore_ok(s(&a), &old_copy, None);

    // The application stops; a new file takes the database's place.
    drop(c);
    let new = dir.join("new.db");
    {
        let n = new_db(&new);
        n.execute_batch("CREATE TABLE other(x); INSERT INTO other VALUES (42);")
            .unwrap();
        insert(&n, 5, "new");
    }
    for side in ["-wal", "-shm"] {
        let _ = fs::remove_file(format!("{}{side}", db.display()));
    }
    fs::rename(&new, &db).unwrap();
    wait_until(&dir, "a full segment of the new file", || {
        max_replica_txid(&a) > old_txid
    });
    let c = new_db(&db);
    insert(&c, 5, "later");
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    restored_equals(&dir, &a, &db, "new.db-restored");
    // The chain before the replacement still restores the old database.
    let out = dir.join("old-restored.db");
    restore_ok(s(&a), &out, Some(old_txid));
    assert_same_content(&old_copy, &out, "old state");
}

#[test]
fn restore_refuses_to_write_over_a_database_a_daemon_holds() {
    let dir = TestDir::new("restore-held");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 5, "x");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, ""))],
    );
    wait_caught_up(&dir, port, &a);
    let o = Command::new(bin())
        .args(["restore", "--force", "--to", s(&db), s(&a)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--while-replicating"), "{err}");
    // A restore that would skip an existing database (an init container) writes nothing:
    // the daemon holding it is no failure.
    let o = Command::new(bin())
        .args(["restore", "--if-db-not-exists", "--to", s(&db), s(&a)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains("already exists, skipping restore"), "{text}");
    // A second daemon on the same database is refused too (it would share the staging).
    let port2 = free_port();
    let b = dir.join("b");
    let o = Command::new(bin())
        .args([
            "replicate",
            "--config",
            s(&config(&dir, &db, &[&b], port2, "")),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("another replicad already replicates"), "{err}");
    assert!(!b.join("replicad.lease").exists(), "{}", listing(&b));
    d.stop_ok();
}

#[test]
fn a_replica_unreachable_at_start_catches_up_when_it_comes_back() {
    let dir = TestDir::new("unreachable-at-start");
    let db = dir.join("app.db");
    let a = dir.join("a");
    // A path under a regular file: every call fails (not a directory), as a server that is
    // down does, until the file goes.
    let blocker = dir.join("blocker");
    fs::write(&blocker, b"in the way").unwrap();
    let b = blocker.join("rep");
    let c = new_db(&db);
    insert(&c, 10, "first");
    let port = free_port();
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a, &b], port, ""))],
    );
    wait_until(&dir, "the reachable replica to be written", || {
        max_replica_txid(&a) > 0
    });
    wait_until(&dir, "/readyz to name the unreachable replica", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains("replica r1") && body.contains("not written")
    });
    insert(&c, 10, "while-down");
    fs::remove_file(&blocker).unwrap();
    insert(&c, 10, "back");
    wait_caught_up(&dir, port, &b);
    wait_caught_up(&dir, port, &a);
    d.stop_ok();
    restored_equals(&dir, &b, &db, "from-b.db");
    restored_equals(&dir, &a, &db, "from-a.db");
}

#[test]
fn a_wal_whose_restart_a_reader_blocked_goes_back_to_the_idle_fast_path() {
    let dir = TestDir::new("stale-wal-tail");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 5, "first");
    let port = free_port();
    let extra = "min-checkpoint-page-count: 50\ncheckpoint-interval: 1m\n";
    let d = spawn_replicate(
        dir.path(),
        &["--config", s(&config(&dir, &db, &[&a], port, extra))],
    );
    wait_caught_up(&dir, port, &a);
    let label = format!("db=\"{}\"", db.display());
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let tail = |m: &str| {
        let logical = sample(m, "replicad_db_wal_size_bytes", &label).unwrap_or(0.0) as u64;
        fs::metadata(&wal).map_or(0, |m| m.len()) > logical
    };
    // The header alone: the restart must be seen well within the quiet shrink's 500 ms.
    let salt1 = || {
        let mut h = [0u8; 20];
        let mut f = fs::File::open(&wal).ok()?;
        f.read_exact(&mut h).ok()?;
        Some(u32::from_be_bytes([h[16], h[17], h[18], h[19]]))
    };
    let before = salt1();
    // A large write: its checkpoint (by page count) restarts the WAL in place, leaving the
    // file longer than what it holds until a quiet tick shrinks it.
    let big = "x".repeat(3000);
    c.execute_batch("BEGIN").unwrap();
    for i in 0..200 {
        c.execute("INSERT INTO t(v) VALUES (?1)", [format!("{big}{i}")])
            .unwrap();
    }
    c.execute_batch("COMMIT").unwrap();
    wait_until(&dir, "the WAL restarted in place", || {
        salt1() != before && tail(&get(port, "/metrics").1)
    });
    // An application reader takes a snapshot before that quiet tick: the shrink's restart is
    // blocked, so the long file stays.
    let reader = Connection::open(&db).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    // The quiet shrink is tried and blocked by the reader: the long file stays.
    sleep(Duration::from_millis(1500));
    let m1 = get(port, "/metrics").1;
    assert!(
        tail(&m1),
        "no stale tail to test: wal {:?}, logical {:?}",
        fs::metadata(&wal).map(|m| m.len()),
        sample(&m1, "replicad_db_wal_size_bytes", &label)
    );
    // 2 s of 50 ms ticks (longer when a loaded machine lost some): all but a shrink retry
    // or two answered by the fast path.
    let delta = |m2: &str, name: &str| {
        sample(m2, name, &label).unwrap() - sample(&m1, name, &label).unwrap()
    };
    sleep(Duration::from_secs(2));
    let mut m2 = get(port, "/metrics").1;
    let deadline = Instant::now() + WAIT;
    while delta(&m2, "replicad_db_sync_skipped_total") < 20.0 {
        assert!(Instant::now() < deadline, "{m2}");
        sleep(Duration::from_millis(100));
        m2 = get(port, "/metrics").1;
    }
    assert!(tail(&m2), "{m2}");
    assert!(delta(&m2, "replicad_db_syncs_total") <= 2.0, "{m2}");
    // A commit inside the long file is still seen at once.
    insert(&c, 3, "inside-the-tail");
    wait_caught_up(&dir, port, &a);
    drop(reader);
    d.stop_ok();
    restored_equals(&dir, &a, &db, "after-the-tail.db");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_server_down_at_start_is_caught_up_once_it_starts() {
    let mut server = common::s3::S3Server::start().await;
    if server.is_external() {
        eprintln!("skipped: needs the in-process S3 server (it is stopped and started)");
        return;
    }
    let dir = TestDir::new("s3-down-at-start");
    let db = dir.join("app.db");
    let a = dir.join("a");
    let c = new_db(&db);
    insert(&c, 10, "first");
    server.stop().await;
    let port = free_port();
    let cfg = dir.join("s3.yml");
    fs::write(
        &cfg,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nmax-lag: 300ms\ndbs:\n  - path: {}\n    replicas:\n      - name: dir\n        url: {}\n      - name: s3\n        url: \"{}\"\n        access-key-id: {}\n        secret-access-key: {}\n",
            db.display(),
            a.display(),
            server.url("down/app.db"),
            server.access_key,
            server.secret_key
        ),
    )
    .unwrap();
    let d = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    tokio::task::block_in_place(|| {
        wait_until(&dir, "the directory replica to be written", || {
            max_replica_txid(&a) > 0
        });
        wait_until(&dir, "/readyz to name the S3 replica", || {
            let (code, body) = get(port, "/readyz");
            code == 503 && body.contains("replica s3") && body.contains("unreachable")
        });
        insert(&c, 10, "while-down");
    });
    server.restart().await;
    tokio::task::block_in_place(|| {
        insert(&c, 10, "back");
        // Ready means every replica, S3 included, holds the database's TXID.
        wait_until(&dir, "the S3 replica to catch up", || {
            let (code, body) = get(port, "/status");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            code == 200
                && ready(port)
                && v["databases"][0]["replicas"][1]["lag_txids"].as_u64() == Some(0)
        });
        d.stop_ok();
        let out = dir.join("from-s3.db");
        let o = Command::new(bin())
            .args(["restore", "--to", s(&out), &server.url("down/app.db")])
            .env("AWS_ACCESS_KEY_ID", &server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &server.secret_key)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_same_content(&db, &out, "from S3");
        restored_equals(&dir, &a, &db, "from-dir.db");
    });
}
