//! A disk hung under the dormant databases' idle pass: the pass runs on a thread of its own,
//! so every endpoint still answers (on one runtime thread here), and every database parked in
//! it is reported once the pass has been held for 10 s, until it ends, in one log line for
//! them all.

use crate::common;
use crate::never_unprotected::{
    add_database, caught_up, config, entry, get, insert, new_db, restored_equals,
};

use std::fs;
use std::path::Path;

use common::http::{free_port, sample};
use common::*;

/// The database's dormancy gauge and `/status` entry say it is dormant and protected.
fn dormant(port: u16, db: &Path) -> bool {
    let label = format!("db=\"{}\"", db.display());
    let status: serde_json::Value =
        serde_json::from_str(&get(port, "/status").1).unwrap_or_default();
    sample(&get(port, "/metrics").1, "replicad_db_dormant", &label) == Some(1.0)
        && entry(&status, db)["protected"] == true
}

#[test]
fn a_disk_hung_under_the_dormant_pass_reports_its_databases_and_the_endpoints_answer() {
    let dir = TestDir::new("hung-dormant-pass");
    fs::create_dir_all(dir.join("hung")).unwrap();
    let (db, other) = (dir.join("hung/app.db"), dir.join("local.db"));
    let (a, b) = (dir.join("a"), dir.join("b"));
    insert(&new_db(&db), 10, "first");
    let o = new_db(&other);
    insert(&o, 10, "first");
    let (gate, port) = (dir.join("hung/gate"), free_port());
    let cfg = config(&dir, &db, &[&a], port, "dormant-after: 300ms\n");
    add_database(&cfg, &other, &b);
    let d = spawn_replicate_env(
        dir.path(),
        &["--config", s(&cfg)],
        &[
            ("REPLICAD_TEST_SYNC_GATE", s(&gate)),
            // One runtime thread: a pass held on it stranded every task queued there.
            ("TOKIO_WORKER_THREADS", "1"),
        ],
    );
    wait_until(&dir, "the daemon to answer", || {
        get(port, "/status").0 == 200
    });
    caught_up(&dir, port, &db, &a, 0);
    let txid = caught_up(&dir, port, &other, &b, 0);
    wait_until(&dir, "both databases dormant", || {
        dormant(port, &db) && dormant(port, &other)
    });

    // The pass stops at `db`'s `statx` (nothing else touches a dormant database's files).
    fs::write(&gate, b"").unwrap();
    // Each database by its own line, for the held pass.
    let held = |body: &str, p: &Path| {
        body.lines().any(|l| {
            l.starts_with(&format!("db {}: ", p.display()))
                && l.contains("dormant databases have been held for")
        })
    };
    wait_until(&dir, "/readyz to report both parked databases", || {
        let (code, body) = get(port, "/readyz");
        code == 503 && held(&body, &db) && held(&body, &other)
    });
    assert_eq!(get(port, "/healthz").0, 200);
    let metrics = get(port, "/metrics").1;
    for p in [&db, &other] {
        let label = format!("db=\"{}\"", p.display());
        assert_eq!(
            sample(&metrics, "replicad_db_protected", &label),
            Some(0.0),
            "{metrics}"
        );
    }
    // One ERROR line for the pass, naming both.
    wait_until(&dir, "the ERROR line", || {
        d.log_text().lines().any(|l| {
            l.contains("ERROR")
                && l.contains("dormant databases have been held for")
                && l.contains("2 dormant database(s) are NOT protected")
                && l.contains(&*db.to_string_lossy())
                && l.contains(&*other.to_string_lossy())
        })
    });
    // A commit's file event still wakes a parked database, which ships it.
    insert(&o, 10, "meanwhile");
    assert!(wait_for_txid(&b, txid + 1, WAIT), "{}", d.log_text());

    fs::remove_file(&gate).unwrap();
    wait_until(&dir, "ready again", || get(port, "/readyz").0 == 200);
    wait_until(&dir, "the end of the report", || {
        d.log_text().lines().any(|l| {
            l.contains("the held idle checks no longer hold") && l.contains(&*db.to_string_lossy())
        })
    });
    let log = d.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("dormant databases have been held for"));
    assert_eq!(
        lines.count(),
        1,
        "one line for the pass, not one per database: {log}"
    );
    d.stop_ok();
    restored_equals(&dir, &a, &db, "after-the-hang.db");
    restored_equals(&dir, &b, &other, "the-other.db");
}
