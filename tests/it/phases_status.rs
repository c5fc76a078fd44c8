//! Per-phase throughput metrics (`replicad_phase_*_total{phase}`) and the `/status` endpoint,
//! in-process and through `replicad status` against a running `replicad replicate`.
//!
//! Phase totals belong to a Store (or to one restore): nothing else in the test process counts
//! into them, so the restores below assert exact figures.

use crate::common;

use common::http::{daemon_config, get, make_db, sample};

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use replicad::config::{Config, DbSettings};
use replicad::daemon::{DbHandle, Store};
use replicad::ops::http::{self, Status};
use replicad::restore::{self, RestoreOptions, Target};
use replicad::storage::AnyClient;
use replicad::storage::faulty::{Faults, FaultyClient};
use replicad::util::phase::Phase;
use tokio_util::sync::CancellationToken;

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn caught_up(h: &DbHandle) -> bool {
    let txid = h.stats.txid.load(Ordering::Relaxed);
    txid > 0
        && h.replicas
            .iter()
            .all(|(_, r)| r.remote_txid.load(Ordering::Relaxed) == txid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phase_metrics_and_status_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let conn = make_db(&db);
    let replica = dir.path().join("replica");
    let config = Config::single(
        db.clone(),
        &[replica.display().to_string()],
        DbSettings {
            monitor_interval: Duration::from_millis(20),
            // Ship at every poll, as these tests were written for.
            min_sync_interval: Duration::from_millis(20),
            heartbeat_interval: Duration::from_millis(50),
            ..DbSettings::default()
        },
    )
    .unwrap();
    let store = Store::open(&config).await.unwrap();
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let a = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(http::serve(
        listener,
        Status::new(&store, Duration::from_secs(60)),
        stop.clone(),
    ));
    let h = store.dbs()[0].clone();
    wait_until("first sync", async || caught_up(&h)).await;
    for i in 0..20 {
        conn.execute("INSERT INTO t(v) VALUES (?1)", [format!("{i:0>500}")])
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The writes moved the database past its first TXID (a commit can wait a poll to ship).
    wait_until("caught up after writes", async || {
        h.stats.txid.load(Ordering::Relaxed) > 1 && caught_up(&h)
    })
    .await;

    // Sync and upload phases are counted and exported by the Store's registry.
    let (code, m) = get(a, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        m.contains("# TYPE replicad_phase_bytes_total counter"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE replicad_phase_seconds_total counter"),
        "{m}"
    );
    for phase in Phase::ALL {
        let l = format!("phase=\"{}\"", phase.name());
        assert!(
            sample(&m, "replicad_phase_bytes_total", &l).is_some(),
            "{l}:\n{m}"
        );
        assert!(
            sample(&m, "replicad_phase_seconds_total", &l).is_some(),
            "{l}:\n{m}"
        );
    }
    for phase in ["wal_read", "encode", "compress", "stage_write", "upload"] {
        let l = format!("phase=\"{phase}\"");
        let bytes = sample(&m, "replicad_phase_bytes_total", &l).unwrap();
        let secs = sample(&m, "replicad_phase_seconds_total", &l).unwrap();
        assert!(bytes > 0.0, "{phase} bytes {bytes}:\n{m}");
        assert!(secs > 0.0, "{phase} seconds {secs}:\n{m}");
    }

    // /status: the database at its TXID, the replica caught up.
    let mut v = serde_json::Value::Null;
    wait_until("status matches the stats", async || {
        let (code, body) = get(a, "/status").await;
        assert_eq!(code, 200, "{body}");
        v = serde_json::from_str(&body).unwrap();
        v["databases"][0]["txid"].as_u64() == Some(h.stats.txid.load(Ordering::Relaxed))
            && v["databases"][0]["replicas"][0]["lag_txids"].as_u64() == Some(0)
    })
    .await;
    let d = &v["databases"][0];
    assert_eq!(v["databases"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(d["path"].as_str(), Some(db.display().to_string().as_str()));
    assert!(d["txid"].as_u64().unwrap() > 1, "{v}");
    assert!(d["syncs"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(d["sync_errors"].as_u64(), Some(0), "{v}");
    assert!(d["idle"].is_boolean(), "{v}");
    let r = &d["replicas"][0];
    assert_eq!(r["name"].as_str(), Some("file"), "{v}");
    assert_eq!(r["remote_txid"].as_u64(), d["txid"].as_u64(), "{v}");
    assert_eq!(r["lag_txids"].as_u64(), Some(0), "{v}");
    assert_eq!(r["lag_seconds"].as_f64(), Some(0.0), "{v}");

    // Restore from the directory replica: read in place, so only `apply` counts (download
    // is for remote replicas, whose files are fetched first).
    let client = config.dbs[0].replicas[0].client().unwrap();
    let phases = store.phases().clone();
    let opts = |to: &str| RestoreOptions {
        to: dir.path().join(to),
        target: Target::Latest,
        force: false,
        integrity_check: true,
        phases: phases.clone(),
        threads: None,
    };
    let (apply0, download0) = (phases.bytes(Phase::Apply), phases.bytes(Phase::Download));
    let plan = restore::plan(&client, Target::Latest).await.unwrap();
    restore::apply_parallel(&client, plan, &opts("file.db"), 2)
        .await
        .unwrap();
    let apply1 = phases.bytes(Phase::Apply);
    assert!(apply1 > apply0, "apply bytes {apply0} -> {apply1}");
    assert_eq!(phases.bytes(Phase::Download), download0);
    assert!(phases.seconds(Phase::Apply) > 0.0);

    // The same replica behind a (fault-free) wrapper counts as remote: fetched, then applied.
    let remote = AnyClient::Faulty(Box::new(FaultyClient::new(client.clone(), Faults::new())));
    let plan = restore::plan(&remote, Target::Latest).await.unwrap();
    let planned: u64 = plan.iter().map(|f| f.size).sum();
    restore::apply_parallel(&remote, plan, &opts("remote.db"), 2)
        .await
        .unwrap();
    assert_eq!(phases.bytes(Phase::Download), download0 + planned);
    assert!(phases.bytes(Phase::Apply) > apply1);
    let m = get(a, "/metrics").await.1;
    for phase in ["download", "apply"] {
        let l = format!("phase=\"{phase}\"");
        assert!(
            sample(&m, "replicad_phase_bytes_total", &l).unwrap() > 0.0,
            "{m}"
        );
        assert!(
            sample(&m, "replicad_phase_seconds_total", &l).unwrap() > 0.0,
            "{m}"
        );
    }

    stop.cancel();
    server.await.unwrap();
    store.shutdown(std::future::pending()).await;
}

fn status(args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::bin())
        .arg("status")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// `status` exits 1 while something is not protected (here a configured database whose file
/// does not exist yet), after printing it, so that a script can ask; 0 once all is.
#[test]
fn status_exits_1_while_something_is_not_protected() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("later.db");
    let (config, _) = daemon_config(dir.path(), &db);
    let cfg = common::s(&config);
    let d = common::spawn_replicate(dir.path(), &["--config", cfg]);
    let deadline = Instant::now() + common::WAIT;
    let out = loop {
        let out = status(&["--config", cfg]);
        if String::from_utf8_lossy(&out.stdout).contains("NOT PROTECTED") {
            break out;
        }
        assert!(Instant::now() < deadline, "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("1 database or replica not protected"), "{err}");
    let _conn = make_db(&db);
    let deadline = Instant::now() + common::WAIT;
    while !status(&["--config", cfg]).status.success() {
        assert!(Instant::now() < deadline, "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    d.stop_ok();
}

#[test]
fn status_command_against_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let _conn = make_db(&db);
    let (config, port) = daemon_config(dir.path(), &db);
    let cfg = common::s(&config);
    let d = common::spawn_replicate(dir.path(), &["--config", cfg]);

    // --json: wait until the daemon answers with the database synced and uploaded.
    let deadline = Instant::now() + common::WAIT;
    let v: serde_json::Value = loop {
        let out = status(&["--config", cfg, "--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
            let db0 = &v["databases"][0];
            if db0["txid"].as_u64().is_some_and(|t| t > 0)
                && db0["replicas"][0]["lag_txids"].as_u64() == Some(0)
            {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "status never showed a synced database; last stderr: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        v["databases"][0]["path"].as_str(),
        Some(db.display().to_string().as_str()),
        "{v}"
    );
    assert_eq!(
        v["databases"][0]["replicas"][0]["name"].as_str(),
        Some("file")
    );

    // The table: a header and one row naming the database and its replica.
    for args in [
        vec!["--config", cfg],
        vec!["--addr", &*format!("127.0.0.1:{port}")],
    ] {
        let out = status(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{stdout}");
        assert!(lines[0].starts_with("DB") && lines[0].contains("LAG_TXIDS"));
        assert!(lines[1].contains(&db.display().to_string()), "{stdout}");
        assert!(lines[1].contains("file"), "{stdout}");
    }
    d.stop_ok();

    // Nothing listening: a clear error and exit code 1.
    let out = status(&["--addr", "127.0.0.1:1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot reach replicad at 127.0.0.1:1"),
        "{err}"
    );
    // The daemon stopped: the same through its config.
    let out = status(&["--config", cfg]);
    assert_eq!(out.status.code(), Some(1));

    // No address: a usage error (exit 2), as is a config without `addr`.
    assert_eq!(status(&[]).status.code(), Some(2));
    let no_addr = dir.path().join("no-addr.yml");
    std::fs::write(
        &no_addr,
        format!(
            "dbs:\n  - path: {}\n    replica:\n      url: {}\n",
            db.display(),
            dir.path().join("replica").display()
        ),
    )
    .unwrap();
    let out = status(&["--config", common::s(&no_addr)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no `addr` key"), "{err}");
}
