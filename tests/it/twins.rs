//! Which earlier daemon a start may replace at once is decided by the kernel's lock on the
//! database's local claim, never by a pid: two containers with PID namespaces of their own are
//! both pid 1, and after a reboot a dead daemon's pid may belong to another process (see
//! `src/replicate/staging.rs` and `src/replicate/lease.rs`). Real daemons, real namespaces
//! (`unshare --pid`, as root), a file replica.

use crate::common;
use crate::never_unprotected::{insert, new_db, restored_equals};

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Writes `<dir>/<name>.yml` replicating `db` to `replica`, its local state at `meta` (the
/// default place beside the database when `None`).
fn config(dir: &TestDir, name: &str, db: &Path, replica: &Path, meta: Option<&Path>) -> PathBuf {
    let meta = meta.map_or(String::new(), |m| {
        format!("    meta-path: {}\n", m.display())
    });
    let path = dir.join(&format!("{name}.yml"));
    fs::write(
        &path,
        format!(
            "monitor-interval: 50ms\nlease-ttl: 30s\ndbs:\n  - path: {}\n{meta}    replicas:\n      - name: r0\n        url: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    path
}

/// Waits until the replica holds a txid past `past`; returns it.
fn uploaded_past(dir: &TestDir, replica: &Path, past: u64) -> u64 {
    wait_until(dir, "an upload", || max_replica_txid(replica) > past);
    max_replica_txid(replica)
}

/// Waits for a daemon that must be refused to exit; returns its log.
fn refused(d: &mut Daemon) -> String {
    let st = wait_timeout(&mut d.child, WAIT);
    let log = d.log_text();
    assert_eq!(st.and_then(|s| s.code()), Some(1), "not refused:\n{log}");
    log
}

/// Waits until a daemon that must start has taken its lease; returns its log.
fn started(dir: &TestDir, d: &mut Daemon) -> String {
    wait_until(dir, "the lease to be taken", || {
        assert!(d.running(), "exited:\n{}", d.log_text());
        d.log_text().contains("single-writer lease acquired")
    });
    d.log_text()
}

const AT_ONCE: &str = "taking over the lease of a previous run of this database on this host";

/// Two containers on one host, each replicad pid 1 in a PID namespace of its own, the same
/// database path and replica: the second is refused, whether it shares the first's local
/// state (the claim's lock) or has its own (the lease). The first's crash is still taken over
/// at once by its restart.
#[test]
fn twin_containers_are_refused_and_a_restart_takes_over_at_once() {
    if !can_unshare_pid() {
        return;
    }
    let dir = TestDir::new("twins");
    let db = dir.join("app.db");
    let r = dir.join("r");
    let c = new_db(&db);
    insert(&c, 20, "first");
    let cfg = config(&dir, "a", &db, &r, None);
    let mut a = spawn_replicate_unshared(dir.path(), &["--config", s(&cfg)]);
    let mut n = uploaded_past(&dir, &r, 0);

    let mut shared = spawn_replicate_unshared(dir.path(), &["--config", s(&cfg)]);
    let log = refused(&mut shared);
    assert!(
        log.contains("another replicad already replicates this database (pid 1,"),
        "{log}"
    );
    let own = config(&dir, "own", &db, &r, Some(&dir.join("meta-own")));
    let mut separate = spawn_replicate_unshared(dir.path(), &["--config", s(&own)]);
    let log = refused(&mut separate);
    for want in ["in use by another replicad", "pid 1 ("] {
        assert!(log.contains(want), "refusal lacks {want:?}:\n{log}");
    }
    assert!(!log.contains(AT_ONCE), "{log}");

    // The first replicates on, alone.
    insert(&c, 20, "second");
    n = uploaded_past(&dir, &r, n);
    assert!(a.running(), "{}", a.log_text());
    assert!(!a.log_text().contains("lost the lease"), "{}", a.log_text());

    // Its crash: the restart, pid 1 in a new namespace, is its successor.
    signal_unshared(&a, "-KILL");
    wait_timeout(&mut a.child, WAIT).expect("the namespace to end");
    let mut restarted = spawn_replicate_unshared(dir.path(), &["--config", s(&cfg)]);
    let log = started(&dir, &mut restarted);
    assert!(log.contains(AT_ONCE), "{log}");
    insert(&c, 20, "third");
    uploaded_past(&dir, &r, n);
    stop_unshared_ok(restarted);
    drop(c);
    restored_equals(&dir, &r, &db, "restored.db");
}

/// After a crash and a reboot, the dead daemon's pid belongs to another process, in its
/// local claim and in its lease: the next start neither refuses nor waits for the TTL.
#[test]
fn a_dead_daemons_pid_reused_by_another_process_holds_nothing() {
    let dir = TestDir::new("pid-reused");
    let db = dir.join("app.db");
    let r = dir.join("r");
    let meta = dir.join("meta");
    let c = new_db(&db);
    insert(&c, 20, "first");
    let cfg = config(&dir, "a", &db, &r, Some(&meta));
    let a = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    let n = uploaded_past(&dir, &r, 0);
    a.kill9();

    let mut other = Command::new("sleep").arg("600").spawn().unwrap();
    let reused = other.id();
    let claim = fs::read_to_string(meta.join("lock")).unwrap();
    let rest: Vec<&str> = claim.split_whitespace().skip(1).collect();
    let claim = std::iter::once(reused.to_string())
        .chain(rest.iter().map(|t| t.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    fs::write(meta.join("lock"), claim).unwrap();
    let lease_path = r.join("replicad.lease");
    let mut lease: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&lease_path).unwrap()).unwrap();
    lease["pid"] = reused.into();
    fs::write(&lease_path, lease.to_string()).unwrap();

    let mut b = spawn_replicate(dir.path(), &["--config", s(&cfg)]);
    let log = started(&dir, &mut b);
    assert!(log.contains(AT_ONCE), "{log}");
    insert(&c, 20, "second");
    uploaded_past(&dir, &r, n);
    b.stop_ok();
    other.kill().unwrap();
    other.wait().unwrap();
    drop(c);
    restored_equals(&dir, &r, &db, "restored.db");
}
