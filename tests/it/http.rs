//! The HTTP endpoint: /metrics, /healthz, /readyz over real HTTP, in-process and through the
//! `replicad replicate` binary.

use crate::common;

use common::http::{daemon_config, get, make_db, parse_response, sample};

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use replicad::config::{Config, DbSettings};
use replicad::daemon::{ClientWrapper, DbHandle, Store};
use replicad::ops::http::{self, Status};
use replicad::storage::AnyClient;
use replicad::storage::faulty::{Faults, FaultyClient};
use tokio_util::sync::CancellationToken;

fn settings(monitor: Duration) -> DbSettings {
    DbSettings {
        monitor_interval: monitor,
        // Ship at every poll, as these tests were written for.
        min_sync_interval: monitor,
        heartbeat_interval: Duration::from_millis(50),
        ..DbSettings::default()
    }
}

async fn wait_until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Served {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(store: &Store, max_lag: Duration) -> Served {
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(http::serve(
        listener,
        Status::new(store, max_lag),
        stop.clone(),
    ));
    Served { addr, stop, task }
}

impl Served {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the server stops on its token")
            .unwrap();
        assert!(
            tokio::net::TcpStream::connect(self.addr).await.is_err(),
            "the listener is closed"
        );
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
async fn endpoints_metrics_and_readiness_before_and_after_the_first_sync() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let replica = dir.path().join("secret-free-replica");
    // Something that is not a database sits at the path: the first sync fails (and retries),
    // so the Store is open but not ready.
    std::fs::create_dir(&db).unwrap();
    let config = Config::single(
        db.clone(),
        &[replica.display().to_string()],
        settings(Duration::from_millis(1500)),
    )
    .unwrap();
    let store = Store::open(&config).await.unwrap();
    let srv = serve(&store, Duration::from_secs(60)).await;
    let a = srv.addr;

    assert_eq!(get(a, "/healthz").await, (200, "ok\n".into()));
    let (code, body) = get(a, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(&db.display().to_string()), "{body}");
    // Once it has failed, the first sync is named with its cause.
    wait_until("the failing sync named", async || {
        let (code, body) = get(a, "/readyz").await;
        code == 503 && body.contains("not protected: sqlite: unable to open")
    })
    .await;
    assert_eq!(get(a, "/nope").await.0, 404);
    assert_eq!(get(a, "/metrics/x").await.0, 404);

    std::fs::remove_dir(&db).unwrap();
    let _conn = make_db(&db);
    let h = store.dbs()[0].clone();
    wait_until("caught up", async || caught_up(&h)).await;
    wait_until("ready", async || get(a, "/readyz").await.0 == 200).await;
    assert_eq!(get(a, "/readyz").await.1, "ready\n");

    let (code, m) = get(a, "/metrics").await;
    assert_eq!(code, 200);
    let dbl = format!("db=\"{}\"", db.display());
    let txid = h.stats.txid.load(Ordering::Relaxed) as f64;
    assert!(txid > 0.0);
    assert_eq!(sample(&m, "replicad_db_txid", &dbl), Some(txid), "{m}");
    for name in [
        "replicad_db_syncs_total",
        "replicad_db_sync_skipped_total",
        "replicad_db_sync_errors_total",
        "replicad_db_segments_total",
        "replicad_db_full_segments_total",
        "replicad_db_checkpoints_total",
        "replicad_db_truncate_checkpoints_total",
        "replicad_db_truncate_checkpoints_blocked_total",
        "replicad_db_checkpoint_write_lock_seconds_total",
        "replicad_db_wal_size_bytes",
        "replicad_db_sync_seconds_total",
        "replicad_db_staging_bytes",
        "replicad_db_idle",
        "replicad_db_protected",
    ] {
        assert!(sample(&m, name, &dbl).is_some(), "{name} missing:\n{m}");
    }
    assert_eq!(sample(&m, "replicad_db_protected", &dbl), Some(1.0), "{m}");
    assert!(m.contains("# TYPE replicad_db_syncs_total counter"), "{m}");
    // verify-interval is 0s here: no verify series, so -1 always means "not run yet".
    assert!(!m.contains("replicad_replica_verify_ok{"), "{m}");
    assert!(m.contains("# TYPE replicad_db_txid gauge"), "{m}");
    assert!(sample(&m, "replicad_db_syncs_total", &dbl).unwrap() >= 1.0);
    assert!(sample(&m, "replicad_db_segments_total", &dbl).unwrap() >= 1.0);
    let rl = format!("{dbl},replica=\"file\"");
    assert_eq!(
        sample(&m, "replicad_replica_lag_txids", &rl),
        Some(0.0),
        "{m}"
    );
    assert_eq!(sample(&m, "replicad_replica_lag_seconds", &rl), Some(0.0));
    assert_eq!(
        sample(&m, "replicad_replica_protected", &rl),
        Some(1.0),
        "{m}"
    );
    // Existing metrics stay in the same registry.
    assert!(m.contains("replicad_replica_operations_total{"), "{m}");
    assert!(sample(&m, "replicad_db_sync_seconds_total", &dbl).unwrap() > 0.0);
    assert!(sample(&m, "replicad_db_wal_size_bytes", &dbl).unwrap() > 0.0);
    assert!(sample(&m, "replicad_db_staging_bytes", &dbl).unwrap() > 0.0);
    let put = format!("{dbl},operation=\"put\",replica=\"file\"");
    assert!(
        sample(&m, "replicad_replica_operation_seconds_total", &put).unwrap() > 0.0,
        "{m}"
    );

    // No label value is a secret: labels are paths and replica names only.
    for line in m.lines().filter(|l| !l.starts_with('#')) {
        if let Some((_, labels)) = line.split_once('{') {
            let labels = labels.split_once('}').unwrap().0;
            for pair in labels.split("\",") {
                let (k, _) = pair.split_once('=').unwrap();
                assert!(
                    ["db", "replica", "operation", "phase", "reason"].contains(&k),
                    "unexpected label {k} in {line}"
                );
            }
            let without_dir = labels.replace(&dir.path().display().to_string(), "");
            assert!(
                !without_dir.contains("secret"),
                "a label contains a secret: {line}"
            );
        }
    }

    srv.stop().await;
    store.shutdown(std::future::pending()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_grows_while_a_replica_fails_and_returns_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let conn = make_db(&db);
    let good = dir.path().join("good");
    let bad = dir.path().join("bad");
    let mut config = Config::single(
        db.clone(),
        &[good.display().to_string(), bad.display().to_string()],
        settings(Duration::from_millis(20)),
    )
    .unwrap();
    config.dbs[0].replicas[0].name = "good".into();
    config.dbs[0].replicas[1].name = "bad".into();
    let faults = Faults::new();
    let f = faults.clone();
    let wrap: ClientWrapper = Arc::new(move |_db: &str, name: &str, client: AnyClient| {
        if name == "bad" {
            AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone())))
        } else {
            client
        }
    });
    let store = Store::open_with(&config, Some(wrap)).await.unwrap();
    // max-lag 0: a replica is ready only when it holds the database's TXID.
    let srv = serve(&store, Duration::ZERO).await;
    let a = srv.addr;
    let h = store.dbs()[0].clone();
    wait_until("caught up", async || caught_up(&h)).await;
    wait_until("ready", async || get(a, "/readyz").await.0 == 200).await;

    faults.set_fail_rate(1.0);
    for i in 0..5 {
        let txid = h.stats.txid.load(Ordering::Relaxed);
        conn.execute("INSERT INTO t(v) VALUES (?1)", [format!("row {i}")])
            .unwrap();
        // One TXID per insert (a slow sync would otherwise ship two in one segment).
        wait_until("the insert synced", async || {
            h.stats.txid.load(Ordering::Relaxed) > txid
        })
        .await;
    }
    let dbl = format!("db=\"{}\"", db.display());
    let bad_l = format!("{dbl},replica=\"bad\"");
    let good_l = format!("{dbl},replica=\"good\"");
    let mut m = String::new();
    // In one scrape: the good replica stores the last segment a little after it is staged.
    wait_until("bad replica lags by the 5 new txids", async || {
        m = get(a, "/metrics").await.1;
        sample(&m, "replicad_replica_lag_txids", &bad_l) == Some(5.0)
            && sample(&m, "replicad_replica_lag_txids", &good_l) == Some(0.0)
    })
    .await;
    let secs = sample(&m, "replicad_replica_lag_seconds", &bad_l).unwrap();
    assert!(secs > 0.1, "lag seconds {secs}:\n{m}");
    assert_eq!(sample(&m, "replicad_replica_lag_txids", &good_l), Some(0.0));
    assert_eq!(
        sample(&m, "replicad_replica_lag_seconds", &good_l),
        Some(0.0)
    );
    let (code, body) = get(a, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("replica bad: 5 txids"), "{body}");
    assert!(!body.contains("replica good"), "{body}");
    assert!(faults.injected() > 0);

    // Within a generous max-lag the same state is ready.
    let lenient = serve(&store, Duration::from_secs(3600)).await;
    assert_eq!(get(lenient.addr, "/readyz").await.0, 200);
    lenient.stop().await;

    faults.set_fail_rate(0.0);
    wait_until("bad replica recovered", async || {
        m = get(a, "/metrics").await.1;
        sample(&m, "replicad_replica_lag_txids", &bad_l) == Some(0.0)
    })
    .await;
    assert_eq!(
        sample(&m, "replicad_replica_lag_seconds", &bad_l),
        Some(0.0)
    );
    // The lag is 0 at the upload; the replica's problem clears at the end of its round.
    wait_until("ready again", async || {
        get(a, "/readyz").await == (200, "ready\n".into())
    })
    .await;

    srv.stop().await;
    store.shutdown(std::future::pending()).await;
}

/// An upload that hangs without an error, after which the database goes quiet: the replica's
/// lag grows on the clock, so /readyz, /status and the metric say it is not protected once
/// it passes max-lag (the lag in data between the last two segments stays a few ms), and
/// all three say protected again once the upload lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_upload_is_reported_also_once_the_database_is_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let conn = make_db(&db);
    let replica = dir.path().join("replica");
    let mut config = Config::single(
        db.clone(),
        &[replica.display().to_string()],
        settings(Duration::from_millis(20)),
    )
    .unwrap();
    config.max_lag = Duration::from_secs(1);
    config.dbs[0].replicas[0].name = "r".into();
    let faults = Faults::new();
    let f = faults.clone();
    let wrap: ClientWrapper = Arc::new(move |_db: &str, _name: &str, client: AnyClient| {
        AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone())))
    });
    let store = Store::open_with(&config, Some(wrap)).await.unwrap();
    let srv = serve(&store, config.max_lag).await;
    let a = srv.addr;
    let h = store.dbs()[0].clone();
    let insert = |i: i32| {
        let txid = h.stats.txid.load(Ordering::Relaxed);
        conn.execute("INSERT INTO t(v) VALUES (?1)", [format!("row {i}")])
            .unwrap();
        txid
    };
    let txid = insert(0);
    wait_until("the first insert uploaded", async || {
        caught_up(&h) && h.stats.txid.load(Ordering::Relaxed) > txid
    })
    .await;
    wait_until("ready", async || get(a, "/readyz").await.0 == 200).await;

    // The next upload waits 5 s, reporting nothing; the database then stays quiet.
    faults.set_latency(Duration::from_secs(5));
    let txid = insert(1);
    wait_until("the second insert synced", async || {
        h.stats.txid.load(Ordering::Relaxed) > txid
    })
    .await;
    wait_until("not ready", async || get(a, "/readyz").await.0 == 503).await;
    let remote = h.replicas[0].1.remote_txid.load(Ordering::Relaxed);
    assert!(remote <= txid, "reported only once it landed");
    let (_, body) = get(a, "/readyz").await;
    assert!(body.contains("1 txids and"), "{body}");
    let (_, status) = get(a, "/status").await;
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["databases"][0]["replicas"][0]["protected"], false, "{v}");
    let m = get(a, "/metrics").await.1;
    let l = format!("db=\"{}\",replica=\"r\"", db.display());
    assert_eq!(
        sample(&m, "replicad_replica_protected", &l),
        Some(0.0),
        "{m}"
    );
    assert!(
        sample(&m, "replicad_replica_lag_seconds", &l).unwrap() >= 1.0,
        "{m}"
    );

    // The upload lands: protected again everywhere.
    faults.set_latency(Duration::ZERO);
    wait_until("ready again", async || get(a, "/readyz").await.0 == 200).await;
    let m = get(a, "/metrics").await.1;
    assert_eq!(
        sample(&m, "replicad_replica_protected", &l),
        Some(1.0),
        "{m}"
    );
    srv.stop().await;
    store.shutdown(std::future::pending()).await;
}

/// A failing replica's retries are paced by its backoff (1 s, doubling) even once a
/// maintenance deadline has passed: maintenance runs only after a successful round, and a
/// passed deadline once cut every retry's wait to nothing (a busy loop of requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_replica_retries_at_its_backoff_past_a_maintenance_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let conn = make_db(&db);
    let replica = dir.path().join("replica");
    let settings = DbSettings {
        levels: vec![Duration::from_millis(200)],
        ..settings(Duration::from_millis(20))
    };
    let config = Config::single(db.clone(), &[replica.display().to_string()], settings).unwrap();
    let faults = Faults::new();
    let f = faults.clone();
    let wrap: ClientWrapper = Arc::new(move |_db: &str, _name: &str, client: AnyClient| {
        AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone())))
    });
    let store = Store::open_with(&config, Some(wrap)).await.unwrap();
    let h = store.dbs()[0].clone();
    wait_until("caught up", async || caught_up(&h)).await;

    faults.set_fail_rate(1.0);
    let before = faults.injected();
    conn.execute("INSERT INTO t(v) VALUES ('while failing')", [])
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let failed = faults.injected() - before;
    // Rounds at 0 s and after jittered backoffs of 0.5-1, 1-2 and 2-4 s, each ended by its
    // first failed call (a busy loop made thousands); at least two show the faults were met.
    assert!(
        (2..=8).contains(&failed),
        "{failed} failed client calls in 4 s"
    );

    faults.set_fail_rate(0.0);
    wait_until("caught up after the faults", async || caught_up(&h)).await;
    store.shutdown(std::future::pending()).await;
    let restored = dir.path().join("restored.db");
    common::restore_ok(common::s(&replica), &restored, None);
    assert_eq!(
        common::strings(&restored, "SELECT v FROM t ORDER BY id")
            .last()
            .map(String::as_str),
        Some("while failing")
    );
}

/// Blocking `GET path` for the binary test.
fn get_blocking(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(parse_response(&raw))
}

#[test]
fn replicate_binary_serves_healthz_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let _conn = make_db(&db);
    let (config, port) = daemon_config(dir.path(), &db);
    let d = common::spawn_replicate(dir.path(), &["--config", common::s(&config)]);
    let deadline = Instant::now() + common::WAIT;
    let dbl = format!("db=\"{}\"", db.display());
    loop {
        if let Ok((200, m)) = get_blocking(port, "/metrics")
            && sample(&m, "replicad_db_txid", &dbl).is_some_and(|t| t > 0.0)
            && sample(
                &m,
                "replicad_replica_lag_txids",
                &format!("{dbl},replica=\"file\""),
            ) == Some(0.0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics with a synced database; log:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        get_blocking(port, "/healthz").unwrap(),
        (200, "ok\n".into())
    );
    // Ready once the monitor has counted the sync, which may come after the upload's counts.
    crate::common::wait_for(
        "ready",
        || d.log_text(),
        || get_blocking(port, "/readyz").is_ok_and(|r| r.0 == 200),
    );
    d.stop_ok();
    assert!(
        get_blocking(port, "/healthz").is_err(),
        "the port is closed after exit"
    );

    // The port is taken now: the daemon fails to start with a clear error and exit code 1.
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let out = std::process::Command::new(common::bin())
        .args(["replicate", "--config", common::s(&config)])
        .output()
        .unwrap();
    drop(taken);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("listen on 127.0.0.1:{port} (key `addr`)")),
        "{err}"
    );
}
