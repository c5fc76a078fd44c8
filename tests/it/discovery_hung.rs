//! Directory discovery on a file system that hangs (a hard NFS mount whose server is down;
//! `REPLICAD_TEST_SYNC_GATE` holds a start's, or the scan's, first file access there): the
//! rest of the daemon goes on, what hangs is reported, and every way it can end (it answers,
//! fails, is deleted, is deleted and created again) ends in a true report.

use crate::common;
use crate::discovery::{SOCKET, caught_up, config, listed, listening, remove_db, wait_until};

use std::path::{Path, PathBuf};

use common::http::{free_port, get_blocking as get};
use common::{Daemon, TestDir, Writer, content_hash, restore_ok, s, seed, spawn_replicate_env};

/// `data/a.db`, replicated, beside `data/nfs/c.db` on the "mount" whose gate is closed.
struct Hung {
    t: TestDir,
    data: PathBuf,
    replica: PathBuf,
    a: PathBuf,
    c: PathBuf,
    /// c.db's writer (none once c.db is deleted).
    wc: Option<Writer>,
    seed: u64,
    gate: PathBuf,
    port: u16,
    d: Daemon,
}

/// Writes the config of a test (its directory, `data`, the replica, the port) and returns its path.
type ConfigFn = fn(&Path, &Path, &Path, u16) -> PathBuf;

impl Hung {
    /// Both databases with 3 commits each, the gate closed, with `blocked` a file where c.db's
    /// staging directory goes (its start fails once the gate opens), the daemon started with
    /// the config `cfg` writes, and a.db caught up.
    fn start(name: &str, blocked: bool, cfg: ConfigFn) -> Hung {
        let seed = seed(name);
        let t = TestDir::new(name);
        let (data, replica) = (t.join("data"), t.join("replica"));
        std::fs::create_dir_all(data.join("nfs")).unwrap();
        let (a, c) = (data.join("a.db"), data.join("nfs/c.db"));
        Writer::open(&a, seed).run(3);
        let mut wc = Writer::open(&c, seed + 1);
        wc.run(3);
        if blocked {
            std::fs::write(data.join("nfs/.c.db-replicad"), "in the way").unwrap();
        }
        let gate = data.join("nfs/gate");
        std::fs::write(&gate, b"").unwrap();
        let port = free_port();
        let cfg = cfg(t.path(), &data, &replica, port);
        let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
        let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
        listening(&d, port);
        caught_up(&d, port, &a);
        Hung {
            t,
            data,
            replica,
            a,
            c,
            wc: Some(wc),
            seed,
            gate,
            port,
            d,
        }
    }

    /// The mount answers.
    fn open_gate(&self) {
        std::fs::remove_file(&self.gate).unwrap();
    }

    /// Deletes c.db, its writer closed first (closing after would delete, by name, the WAL of
    /// a database created again there).
    fn delete_c(&mut self) {
        self.wc = None;
        remove_db(&self.c);
        wait_until(&self.d, "c.db no longer listed", || {
            !listed(self.port).contains(&self.c)
        });
    }

    /// `/readyz`: status and body.
    fn readyz(&self) -> (u16, String) {
        get(self.port, "/readyz")
    }

    /// Waits for `/readyz` to say ready, stops cleanly, and restores each of `dbs` (its path
    /// under `data` and the replica) equal to its source.
    fn ready_stopped_and_restored(self, dbs: &[&str]) {
        wait_until(&self.d, "ready", || self.readyz().0 == 200);
        drop(self.wc);
        self.d.stop_ok();
        for rel in dbs {
            let out = self.t.join(&format!("restored-{}", rel.replace('/', "-")));
            restore_ok(s(&self.replica.join(rel)), &out, None);
            assert_eq!(
                content_hash(&out),
                content_hash(&self.data.join(rel)),
                "{rel}"
            );
        }
    }
}

/// The `dir` config over all of `data`, watched.
fn watched(t: &Path, data: &Path, replica: &Path, port: u16) -> PathBuf {
    config(t, data, replica, port, true)
}

/// A discovered database whose file system hangs at the start holds up neither the others
/// nor the endpoints: after 10 s it is reported, and once the mount answers it is
/// replicated.
#[test]
fn a_discovered_database_whose_start_hangs_does_not_hold_up_the_others() {
    let h = Hung::start("discovery-hung-start", false, |t, data, replica, port| {
        config(t, data, replica, port, false)
    });
    let (code, body) = h.readyz();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(s(&h.c)) && body.contains("its start has run for"),
        "{body}"
    );

    h.open_gate();
    caught_up(&h.d, h.port, &h.c);
    h.ready_stopped_and_restored(&["a.db", "nfs/c.db"]);
}

/// A discovered database whose start hangs, then fails once the mount answers (its staging
/// directory cannot be made), is retried like any failed start: reported with how, and
/// replicated after its next write. It was counted as started, never retried.
#[test]
fn a_hung_start_that_then_fails_is_retried() {
    let mut h = Hung::start("discovery-hung-then-failed", true, watched);
    wait_until(&h.d, "c.db reported hung", || {
        h.readyz().1.contains("its start has run for")
    });

    h.open_gate();
    wait_until(&h.d, "c.db's failure reported with its retry", || {
        let (code, body) = h.readyz();
        code == 503 && body.contains(s(&h.c)) && body.contains("retried when the file changes")
    });
    std::fs::remove_file(h.data.join("nfs/.c.db-replicad")).unwrap();
    let wc = h.wc.as_mut().expect("c.db is not deleted");
    wc.run(3);
    wc.checkpoint("TRUNCATE");
    caught_up(&h.d, h.port, &h.c);
    h.ready_stopped_and_restored(&["nfs/c.db"]);
}

/// A database whose start hangs, deleted and created again, waits for that start to end
/// before it starts again (never two on one staging directory), and holds up nobody
/// meanwhile: a database created after it is replicated at once (the wait held the lock
/// every start and removal takes). Deleted again while it waits, neither start leaves
/// anything behind once the mount answers (the waiting one started the deleted file, reported
/// missing for good); created once more, it is replicated.
#[test]
fn a_hung_start_deleted_and_created_again_holds_up_no_other_database() {
    let mut h = Hung::start("discovery-hung-readded", false, watched);
    wait_until(&h.d, "c.db reported hung", || listed(h.port).contains(&h.c));

    h.delete_c();
    let mut wc = Writer::open(&h.c, h.seed + 2);
    wc.run(3);
    h.wc = Some(wc);
    wait_until(&h.d, "c.db, back, reported hung again", || {
        listed(h.port).contains(&h.c)
            && h.d.log_text().matches("its start has run for").count() >= 2
    });
    let b = h.data.join("b.db");
    Writer::open(&b, h.seed + 3).run(3);
    caught_up(&h.d, h.port, &b);

    h.delete_c();
    h.open_gate();
    wait_until(&h.d, "both starts of c.db ended", || {
        // Each start's end; the removals' own lines came before the gate opened.
        let log = h.d.log_text();
        log.matches("removed while it started: not replicated")
            .count()
            >= 2
    });
    // Neither start ran: their removal said so, not that a replication was stopped.
    let log = h.d.log_text();
    assert_eq!(log.matches("its start is cancelled").count(), 2, "{log}");
    assert!(!log.contains("stopping its replication"), "{log}");
    let (code, body) = h.readyz();
    assert_eq!(code, 200, "{body}");
    assert_eq!(listed(h.port), vec![h.a.clone(), b.clone()]);

    let mut wc = Writer::open(&h.c, h.seed + 4);
    wc.run(3);
    h.wc = Some(wc);
    caught_up(&h.d, h.port, &h.c);
    h.ready_stopped_and_restored(&["b.db", "nfs/c.db"]);
}

/// A database whose start hangs and is deleted meanwhile is no longer reported, even if its
/// start then fails: the failure no longer put back the stand-in its removal took away, and
/// `/readyz` said "not protected" for a file that was gone, until a restart.
#[test]
fn a_hung_start_deleted_meanwhile_leaves_no_report_behind() {
    let mut h = Hung::start("discovery-hung-deleted", true, watched);
    wait_until(&h.d, "c.db reported hung", || listed(h.port).contains(&h.c));

    h.delete_c();
    h.open_gate();
    wait_until(&h.d, "c.db's start ended", || {
        let log = h.d.log_text();
        // The start's end, not the removal's line, which came before the gate opened.
        log.contains("removed while it started: not replicated") || log.contains("its start failed")
    });
    let (code, body) = h.readyz();
    assert_eq!(code, 200, "{body}");
    assert_eq!(listed(h.port), vec![h.a.clone()]);
    h.d.stop_ok();
}

/// A watched directory whose scan hangs at the start holds up neither the databases
/// configured beside it nor the endpoints: after 10 s the directory is reported not
/// protected, and once its file system answers its databases are replicated.
#[test]
fn a_directory_whose_scan_hangs_does_not_hold_up_the_others() {
    let h = Hung::start("discovery-hung-scan", false, |t, data, replica, port| {
        let cfg = t.join("replicad.yml");
        let yaml = format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nsocket: {{enabled: true, path: {}}}\n\
             dbs:\n  - path: {}\n    replica:\n      url: {}\n  - dir: {}\n    pattern: \"*.db\"\n    \
             watch: true\n    replica:\n      url: {}\n",
            t.join(SOCKET).display(),
            data.join("a.db").display(),
            replica.join("a.db").display(),
            data.join("nfs").display(),
            replica.join("nfs").display(),
        );
        std::fs::write(&cfg, yaml).unwrap();
        cfg
    });
    let nfs = h.data.join("nfs");
    let (code, body) = h.readyz();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(s(&nfs)) && body.contains("its scan has run for"),
        "{body}"
    );

    h.open_gate();
    caught_up(&h.d, h.port, &h.c);
    wait_until(&h.d, "ready", || h.readyz().0 == 200);
    assert!(!listed(h.port).contains(&nfs));
    h.ready_stopped_and_restored(&["a.db", "nfs/c.db"]);
}
