//! Directory discovery on a file system that hangs (a hard NFS mount whose server is down;
//! `REPLICAD_TEST_SYNC_GATE` holds a start's, or the scan's, first file access there): the
//! rest of the daemon goes on, what hangs is reported, and every way it can end (it answers,
//! fails, is deleted, is deleted and created again) ends in a true report.

use crate::common;
use crate::discovery::{SOCKET, caught_up, config, listed, listening, remove_db, wait_until};

use common::http::{free_port, get_blocking as get};
use common::{TestDir, Writer, content_hash, restore_ok, s, seed, spawn_replicate_env};

/// A discovered database whose file system hangs at the start (its subdirectory a hard NFS
/// mount whose server is down; `REPLICAD_TEST_SYNC_GATE` holds its start's first file access)
/// holds up neither the others nor the endpoints: after 10 s it is reported, and once the
/// mount answers it is replicated.
#[test]
fn a_discovered_database_whose_start_hangs_does_not_hold_up_the_others() {
    let seed = seed("discovery_hung_start");
    let t = TestDir::new("discovery-hung-start");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(data.join("nfs")).unwrap();
    let (a, b, hung) = (data.join("a.db"), data.join("b.db"), data.join("nfs/c.db"));
    for (i, db) in [&a, &b, &hung].into_iter().enumerate() {
        Writer::open(db, seed + i as u64).run(3);
    }
    let gate = data.join("nfs/gate");
    std::fs::write(&gate, b"").unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, false);
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
    let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
    listening(&d, port);
    caught_up(&d, port, &a);
    caught_up(&d, port, &b);
    let (code, body) = get(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(s(&hung)) && body.contains("its start has run for"),
        "{body}"
    );

    std::fs::remove_file(&gate).unwrap();
    caught_up(&d, port, &hung);
    wait_until(&d, "ready", || get(port, "/readyz").0 == 200);
    d.stop_ok();
    let out = t.join("restored-c");
    restore_ok(s(&replica.join("nfs/c.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&hung));
}

/// A discovered database whose start hangs, then fails once the mount answers (its staging
/// directory cannot be made), is retried like any failed start: reported with how, and
/// replicated after its next write. It was counted as started, never retried.
#[test]
fn a_hung_start_that_then_fails_is_retried() {
    let seed = seed("discovery_hung_then_failed");
    let t = TestDir::new("discovery-hung-then-failed");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(data.join("nfs")).unwrap();
    let (a, c) = (data.join("a.db"), data.join("nfs/c.db"));
    Writer::open(&a, seed).run(3);
    let mut wc = Writer::open(&c, seed + 1);
    wc.run(3);
    let obstacle = data.join("nfs/.c.db-replicad");
    std::fs::write(&obstacle, "in the way").unwrap();
    let gate = data.join("nfs/gate");
    std::fs::write(&gate, b"").unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
    let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
    listening(&d, port);
    caught_up(&d, port, &a);
    wait_until(&d, "c.db reported hung", || {
        get(port, "/readyz").1.contains("its start has run for")
    });

    std::fs::remove_file(&gate).unwrap();
    wait_until(&d, "c.db's failure reported with its retry", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && body.contains(s(&c)) && body.contains("retried when the file changes")
    });
    std::fs::remove_file(&obstacle).unwrap();
    wc.run(3);
    wc.checkpoint("TRUNCATE");
    caught_up(&d, port, &c);
    wait_until(&d, "ready", || get(port, "/readyz").0 == 200);
    drop(wc);
    d.stop_ok();
    let out = t.join("restored-c");
    restore_ok(s(&replica.join("nfs/c.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&c));
}

/// A database whose start hangs, deleted and created again, waits for that start to end
/// before it starts again (never two on one staging directory), and holds up nobody
/// meanwhile: a database created after it is replicated at once. The wait held the lock
/// every start and removal takes.
#[test]
fn a_hung_start_deleted_and_created_again_holds_up_no_other_database() {
    let seed = seed("discovery_hung_readded");
    let t = TestDir::new("discovery-hung-readded");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(data.join("nfs")).unwrap();
    let (a, b, c) = (data.join("a.db"), data.join("b.db"), data.join("nfs/c.db"));
    Writer::open(&a, seed).run(3);
    Writer::open(&c, seed + 1).run(3);
    let gate = data.join("nfs/gate");
    std::fs::write(&gate, b"").unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
    let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
    listening(&d, port);
    caught_up(&d, port, &a);
    wait_until(&d, "c.db reported hung", || listed(port).contains(&c));

    remove_db(&c);
    wait_until(&d, "c.db no longer listed", || !listed(port).contains(&c));
    Writer::open(&c, seed + 2).run(3);
    wait_until(&d, "c.db, back, reported hung again", || {
        listed(port).contains(&c) && d.log_text().matches("its start has run for").count() >= 2
    });
    let mut wb = Writer::open(&b, seed + 3);
    wb.run(3);
    caught_up(&d, port, &b);

    std::fs::remove_file(&gate).unwrap();
    caught_up(&d, port, &c);
    wait_until(&d, "ready", || get(port, "/readyz").0 == 200);
    drop(wb);
    d.stop_ok();
    for (db, rel) in [(&b, "b.db"), (&c, "nfs/c.db")] {
        let out = t.join(&format!("restored-{rel}").replace('/', "-"));
        restore_ok(s(&replica.join(rel)), &out, None);
        assert_eq!(content_hash(&out), content_hash(db), "{rel}");
    }
}

/// A database whose start hangs and is deleted meanwhile is no longer reported, even if its
/// start then fails: the failure no longer put back the stand-in its removal took away, and
/// `/readyz` said "not protected" for a file that was gone, until a restart.
#[test]
fn a_hung_start_deleted_meanwhile_leaves_no_report_behind() {
    let seed = seed("discovery_hung_deleted");
    let t = TestDir::new("discovery-hung-deleted");
    let data = t.join("data");
    let replica = t.join("replica");
    std::fs::create_dir_all(data.join("nfs")).unwrap();
    let (a, c) = (data.join("a.db"), data.join("nfs/c.db"));
    Writer::open(&a, seed).run(3);
    Writer::open(&c, seed + 1).run(3);
    // Its start fails once the mount answers: its staging directory cannot be made.
    std::fs::write(data.join("nfs/.c.db-replicad"), "in the way").unwrap();
    let gate = data.join("nfs/gate");
    std::fs::write(&gate, b"").unwrap();
    let port = free_port();
    let cfg = config(t.path(), &data, &replica, port, true);
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
    let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
    listening(&d, port);
    caught_up(&d, port, &a);
    wait_until(&d, "c.db reported hung", || listed(port).contains(&c));

    remove_db(&c);
    wait_until(&d, "c.db no longer listed", || !listed(port).contains(&c));
    std::fs::remove_file(&gate).unwrap();
    wait_until(&d, "c.db's start ended", || {
        let log = d.log_text();
        log.contains("removed while it started") || log.contains("its start failed")
    });
    let (code, body) = get(port, "/readyz");
    assert_eq!(code, 200, "{body}");
    assert_eq!(listed(port), vec![a.clone()]);
    d.stop_ok();
}

/// A watched directory whose scan hangs at the start holds up neither the databases
/// configured beside it nor the endpoints: after 10 s the directory is reported not
/// protected, and once its file system answers its databases are replicated.
#[test]
fn a_directory_whose_scan_hangs_does_not_hold_up_the_others() {
    let seed = seed("discovery_hung_scan");
    let t = TestDir::new("discovery-hung-scan");
    let data = t.join("data");
    let replica = t.join("replica");
    let nfs = data.join("nfs");
    std::fs::create_dir_all(&nfs).unwrap();
    let (a, c) = (data.join("a.db"), nfs.join("c.db"));
    Writer::open(&a, seed).run(3);
    Writer::open(&c, seed + 1).run(3);
    let gate = nfs.join("gate");
    std::fs::write(&gate, b"").unwrap();
    let port = free_port();
    let cfg = t.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nsocket: {{enabled: true, path: {}}}\n\
             dbs:\n  - path: {}\n    replica:\n      url: {}\n  - dir: {}\n    pattern: \"*.db\"\n    \
             watch: true\n    replica:\n      url: {}\n",
            t.join(SOCKET).display(),
            a.display(),
            replica.join("a.db").display(),
            nfs.display(),
            replica.join("nfs").display(),
        ),
    )
    .unwrap();
    let env = [("REPLICAD_TEST_SYNC_GATE", s(&gate))];
    let d = spawn_replicate_env(t.path(), &["-c", s(&cfg)], &env);
    listening(&d, port);
    caught_up(&d, port, &a);
    let (code, body) = get(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(s(&nfs)) && body.contains("its scan has run for"),
        "{body}"
    );

    std::fs::remove_file(&gate).unwrap();
    caught_up(&d, port, &c);
    wait_until(&d, "ready", || get(port, "/readyz").0 == 200);
    assert!(!listed(port).contains(&nfs));
    d.stop_ok();
    let out = t.join("restored-c");
    restore_ok(s(&replica.join("nfs/c.db")), &out, None);
    assert_eq!(content_hash(&out), content_hash(&c));
}
