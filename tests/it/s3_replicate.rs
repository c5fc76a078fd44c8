//! Tests for replication to S3 go here: a real S3 server on 127.0.0.1 (tests/it/common/s3.rs),
//! injected faults, a server restart, the idle request budget, independent replicas,
//! credentials kept out of logs and metrics, and Litestream reading and writing the same bucket.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::{TestDir, Writer, assert_same_content};
use replicad::config::{Config, DbSettings};
use replicad::daemon::{ClientWrapper, DbHandle, Store};
use replicad::restore::{self, RestoreOptions, Target};
use replicad::storage::AnyClient;
use replicad::storage::faulty::{Faults, FaultyClient};
use replicad::storage::s3::{S3Client, S3Config, Secret};

fn settings() -> DbSettings {
    DbSettings {
        monitor_interval: Duration::from_millis(25),
        // Ship at every poll, as these tests were written for.
        min_sync_interval: Duration::from_millis(25),
        heartbeat_interval: Duration::from_millis(50),
        min_checkpoint_page_count: 64,
        ..DbSettings::default()
    }
}

/// An S3 client for `url` that signs with the server's credentials.
fn s3_client(server: &S3Server, url: &str) -> S3Client {
    let cfg = S3Config::from_url(url).unwrap();
    S3Client::new(S3Config {
        access_key_id: Some(server.access_key.clone()),
        secret_access_key: Some(Secret(server.secret_key.clone())),
        ..cfg
    })
}

/// Gives S3 clients the server's credentials and, where `faults` names a replica, faults.
fn wrapper(server: &S3Server, faults: Vec<(&'static str, Arc<Faults>)>) -> ClientWrapper {
    let (key, secret) = (server.access_key.clone(), server.secret_key.clone());
    Arc::new(move |_db: &str, name: &str, client: AnyClient| {
        let client = match client {
            AnyClient::S3(c) => AnyClient::S3(S3Client::new(S3Config {
                access_key_id: Some(key.clone()),
                secret_access_key: Some(Secret(secret.clone())),
                ..c.config().clone()
            })),
            other => other,
        };
        match faults.iter().find(|(n, _)| *n == name) {
            Some((_, f)) => AnyClient::Faulty(Box::new(FaultyClient::new(client, f.clone()))),
            None => client,
        }
    })
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store replicating `db` alone to the S3 replica `url` (through [`wrapper`]), and the
/// database's handle.
async fn open_store(
    server: &S3Server,
    db: &Path,
    url: &str,
    settings: DbSettings,
) -> (Store, DbHandle) {
    let config = Config::single(db.to_path_buf(), &[url.to_string()], settings).unwrap();
    let store = Store::open_with(&config, Some(wrapper(server, vec![])))
        .await
        .unwrap();
    let h = store.dbs()[0].clone();
    (store, h)
}

fn caught_up(h: &DbHandle, replica: usize) -> bool {
    let txid = h.stats.txid.load(Ordering::Relaxed);
    txid > 0 && h.replicas[replica].1.remote_txid.load(Ordering::Relaxed) == txid
}

async fn restore_to(client: AnyClient, out: &Path) {
    let plan = restore::plan(&client, Target::Latest).await.unwrap();
    let opts = RestoreOptions {
        to: out.to_path_buf(),
        target: Target::Latest,
        force: false,
        integrity_check: true,
        phases: Default::default(),
        threads: None,
    };
    restore::apply(&client, plan, &opts).await.unwrap();
}

/// L0 TXIDs on the bucket are 1..=N with no gap and no duplicate.
async fn assert_contiguous(client: &S3Client) -> u64 {
    use replicad::storage::ReplicaClient;
    let files = client.list(0).await.unwrap();
    let txids: Vec<u64> = files.iter().map(|f| f.min_txid.0).collect();
    let expected: Vec<u64> = (1..=txids.len() as u64).collect();
    assert_eq!(txids, expected, "L0 chain on the bucket");
    assert!(files.iter().all(|f| f.min_txid == f.max_txid));
    txids.len() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_30_percent_lose_nothing_and_restore_equals_source() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-faults");
    let db = dir.join("app.db");
    let url = server.url("faults/app.db");
    let config = Config::single(db.clone(), std::slice::from_ref(&url), settings()).unwrap();
    let faults = Faults::new();
    // Startup meets a replica that fails its first calls: taking the lease must retry
    // them rather than stop. A fixed count, not the random storm below: at 30% the ten
    // startup attempts (three calls each) all fail about once in 70 runs, which is a
    // replica that is down, not one that blinks.
    faults.fail_next(3);
    let mut writer = Writer::open(&db, common::seed("s3-faults"));
    let store = Store::open_with(
        &config,
        Some(wrapper(&server, vec![("s3", faults.clone())])),
    )
    .await
    .expect("startup retries a replica's transient failures");
    assert_eq!(faults.injected(), 3, "the first three calls failed");
    faults.set_fail_rate(0.3);
    let h = store.dbs()[0].clone();
    for _ in 0..60 {
        writer.step();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    faults.set_fail_rate(0.0);
    wait_until(
        "replica caught up after the fault storm",
        Duration::from_secs(60),
        || caught_up(&h, 0),
    )
    .await;
    store.shutdown(std::future::pending()).await;
    assert!(
        faults.injected() > 3,
        "no fault was injected during replication"
    );
    let errors: u64 = h.replicas[0]
        .1
        .counters
        .errors
        .iter()
        .map(|c| c.get())
        .sum();
    assert!(errors > 0, "injected failures must be counted as errors");

    let client = s3_client(&server, &url);
    assert_contiguous(&client).await;
    let out = dir.join("restored.db");
    restore_to(AnyClient::S3(client), &out).await;
    assert_same_content(&db, &out, "restore after 30% faults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_database_makes_zero_requests_and_metrics_count_operations() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-idle");
    let db = dir.join("app.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    let url = server.url("idle/app.db");
    let (store, h) = open_store(&server, &db, &url, settings()).await;
    wait_until("first upload", Duration::from_secs(20), || caught_up(&h, 0)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.reset_counts();
    let ops0 = h.replicas[0].1.total_ops();
    // 2 s = 80 ticks and 40 heartbeats.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if server.counts_requests() {
        assert_eq!(
            server.request_count(),
            0,
            "idle requests: {:?}",
            server.requests_by_op()
        );
    }
    assert_eq!(h.replicas[0].1.total_ops(), ops0);

    let text = replicad::ops::metrics::Metrics::of(&store).render();
    let put_line = text
        .lines()
        .find(|l| {
            l.starts_with("replicad_replica_operations_total{") && l.contains("operation=\"put\"")
        })
        .unwrap_or_else(|| panic!("no put counter in:\n{text}"));
    // Three PUTs: the conditional-write probe at start (refused: it writes nothing), the
    // single-writer lease, then the one segment.
    assert!(
        put_line.contains("replica=\"s3\"") && put_line.ends_with(" 3"),
        "{put_line}"
    );
    let get_line = text
        .lines()
        .find(|l| {
            l.starts_with("replicad_replica_operations_total{") && l.contains("operation=\"get\"")
        })
        .unwrap();
    // GETs: the lease at start, the tip's trailer and header when there is one; no read-back
    // of the lease, which was written conditionally, and no check before the segment's round,
    // which comes less than `reread_after` (10 s) after that compare-and-swap.
    assert!(get_line.ends_with(" 1"), "{get_line}");
    let list_line = text
        .lines()
        .find(|l| {
            l.starts_with("replicad_replica_operations_total{") && l.contains("operation=\"list\"")
        })
        .unwrap();
    assert!(
        list_line.ends_with(" 1"),
        "one listing of every level at start: {list_line}"
    );
    store.shutdown(std::future::pending()).await;
}

/// With conditional writes an upload round re-reads the single-writer lease only once
/// `reread_after` (TTL/60) has passed since a read found it ours: a burst of commits costs one
/// PUT each and no GET. A lease replaced meanwhile (as after this host was paused past the
/// TTL) still stops the first round after that, before its upload, and `/readyz` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_reread_the_lease_once_per_ttl_60th_and_stop_when_it_was_taken() {
    let server = S3Server::start().await;
    if !server.counts_requests() {
        eprintln!("skipped: needs the in-process S3 server");
        return;
    }
    let dir = TestDir::new("s3-recheck");
    let db = dir.join("app.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (0);")
        .unwrap();
    let url = server.url("recheck/app.db");
    let reread = Duration::from_secs(5);
    let settings = DbSettings {
        lease_ttl: reread * 60,
        ..settings()
    };
    let (store, h) = open_store(&server, &db, &url, settings).await;
    wait_until("first upload", Duration::from_secs(20), || caught_up(&h, 0)).await;
    let commit = |v: i64| {
        let h = &h;
        let before = h.stats.txid.load(Ordering::Relaxed);
        c.execute("INSERT INTO t VALUES (?1)", [v]).unwrap();
        wait_until("the commit uploaded", Duration::from_secs(20), move || {
            h.stats.txid.load(Ordering::Relaxed) > before && caught_up(h, 0)
        })
    };
    // `reread_after` past the compare-and-swap that took the lease: this round reads it.
    tokio::time::sleep(reread).await;
    let gets = server.op_count("GetObject");
    commit(1).await;
    assert_eq!(
        server.op_count("GetObject"),
        gets + 1,
        "a check due was skipped"
    );

    let (gets, puts) = (server.op_count("GetObject"), server.op_count("PutObject"));
    let burst = Instant::now();
    for v in 2..7 {
        commit(v).await;
    }
    let took = burst.elapsed();
    assert!(server.op_count("PutObject") >= puts + 5);
    // One GET per round would be 5; the burst may cross one `reread_after` boundary, and one
    // more per `reread_after` it lasts.
    let allowed = took.as_secs() / reread.as_secs() + 1;
    assert!(
        server.op_count("GetObject") - gets <= allowed,
        "{} lease GETs for 5 rounds in {took:?}",
        server.op_count("GetObject") - gets
    );

    common::s3::plant_file(
        &server,
        "recheck/app.db/replicad.lease",
        common::http::FOREIGN_LEASE.as_bytes(),
    );
    tokio::time::sleep(reread).await;
    let uploaded = server.list_keys("recheck/app.db/").await;
    c.execute("INSERT INTO t VALUES (7)", []).unwrap();
    let stats = h.replicas[0].1.clone();
    wait_until("the taken lease noticed", Duration::from_secs(20), || {
        stats.lease_lost.load(Ordering::Relaxed)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.list_keys("recheck/app.db/").await,
        uploaded,
        "uploaded after the lease was taken"
    );
    common::http::assert_unready_for_the_lease(&store);
    store.shutdown(std::future::pending()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_replica_never_blocks_the_other() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-independent");
    let db = dir.join("app.db");
    let file_replica = dir.join("file-replica");
    let url = server.url("independent/app.db");
    let config = Config::single(
        db.clone(),
        &[file_replica.display().to_string(), url.clone()],
        settings(),
    )
    .unwrap();
    let mut writer = Writer::open(&db, common::seed("s3-independent"));
    writer.step();
    let store = Store::open_with(&config, Some(wrapper(&server, vec![])))
        .await
        .unwrap();
    let h = store.dbs()[0].clone();
    wait_until("both replicas start", Duration::from_secs(20), || {
        caught_up(&h, 0) && caught_up(&h, 1)
    })
    .await;
    // The S3 endpoint goes away; the file replica must keep up meanwhile.
    let mut server = server;
    server.stop().await;
    let before = h.stats.txid.load(Ordering::Relaxed);
    for _ in 0..20 {
        writer.step();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    wait_until(
        "file replica keeps up while S3 is down",
        Duration::from_secs(20),
        // Past the outage's first commit (the last one can wait a poll to ship).
        || h.stats.txid.load(Ordering::Relaxed) > before && caught_up(&h, 0),
    )
    .await;
    assert!(
        !caught_up(&h, 1),
        "the S3 replica cannot be caught up while its server is down"
    );
    server.restart().await;
    wait_until(
        "S3 replica catches up after recovery",
        Duration::from_secs(60),
        || caught_up(&h, 1),
    )
    .await;
    store.shutdown(std::future::pending()).await;
    let out = dir.join("from-s3.db");
    restore_to(AnyClient::S3(s3_client(&server, &url)), &out).await;
    assert_same_content(&db, &out, "S3 replica after its outage");
}

/// Runs the real binary with the server's credentials in the environment.
fn replicad_cmd(server: &S3Server, dir: &Path, args: &[&str], log: &str) -> Child {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    Command::new(common::bin())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &server.secret_key)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn run_ok(server: &S3Server, args: &[&str]) -> std::process::Output {
    let o = Command::new(common::bin())
        .args(args)
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &server.secret_key)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stop(child: &mut Child) {
    common::sigterm(child);
    let status = common::wait_timeout(child, Duration::from_secs(60)).expect("daemon did not stop");
    assert!(status.success(), "daemon exit {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_survives_a_server_restart_and_restores_from_the_s3_url() {
    let mut server = S3Server::start().await;
    if server.is_external() {
        eprintln!("SKIPPED: cannot restart an external S3 endpoint");
        return;
    }
    let dir = TestDir::new("s3-restart");
    let db = dir.join("app.db");
    let url = server.url("restart/app.db");
    let mut writer = Writer::open(&db, common::seed("s3-restart"));
    writer.step();
    let mut child = replicad_cmd(
        &server,
        dir.path(),
        &[
            "replicate",
            "--monitor-interval",
            "50ms",
            db.to_str().unwrap(),
            &url,
        ],
        "daemon.log",
    );
    let client = s3_client(&server, &url);
    let wait_remote = |n: u64| {
        let client = client.clone();
        async move {
            use replicad::storage::ReplicaClient;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if client
                    .list(0)
                    .await
                    .is_ok_and(|files| files.len() as u64 >= n)
                {
                    return;
                }
                assert!(Instant::now() < deadline, "replica did not reach {n} files");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_remote(1).await;
    for _ in 0..30 {
        writer.step();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
    for _ in 0..30 {
        writer.step();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart().await;
    for _ in 0..10 {
        writer.step();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop(&mut child);
    let n = assert_contiguous(&client).await;
    assert!(n >= 3);
    let out = dir.join("restored.db");
    run_ok(&server, &["restore", "--to", out.to_str().unwrap(), &url]);
    assert_same_content(&db, &out, "restore from s3:// after a server restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_appear_in_logs_or_errors() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-secrets");
    let db = dir.join("app.db");
    let _ = Writer::open(&db, 1);
    let url = server.url("secrets/app.db");
    let secret = "wrongsecret-Zq9ShouldNeverBePrinted";
    let o = Command::new(common::bin())
        .args([
            "--log-level",
            "debug",
            "replicate",
            "--monitor-interval",
            "50ms",
            db.to_str().unwrap(),
            &url,
        ])
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a rejected signature must fail the start: {stderr}"
    );
    assert!(!stderr.contains(secret), "secret leaked:\n{stderr}");
    assert!(
        stderr.contains("SignatureDoesNotMatch") || stderr.contains("signature"),
        "{stderr}"
    );

    let out = dir.join("x.db");
    let o = Command::new(common::bin())
        .args(["restore", "--to", out.to_str().unwrap(), &url])
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr.contains(secret), "secret leaked:\n{stderr}");
}

fn litestream_cmd(bin: &Path, server: &S3Server) -> Command {
    let mut c = Command::new(bin);
    // Litestream 0.5.17's S3 client fails to start when AWS_CA_BUNDLE is set.
    c.env_remove("AWS_CA_BUNDLE")
        .env("LITESTREAM_ACCESS_KEY_ID", &server.access_key)
        .env("LITESTREAM_SECRET_ACCESS_KEY", &server.secret_key)
        .env("AWS_ACCESS_KEY_ID", &server.access_key)
        .env("AWS_SECRET_ACCESS_KEY", &server.secret_key);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litestream_and_replicad_read_each_others_buckets() {
    let Some(ls) = common::litestream_bin() else {
        eprintln!("SKIPPED: litestream not installed");
        return;
    };
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-interop");

    // replicad writes (lz4), Litestream restores.
    let db = dir.join("a.db");
    let url = server.url("interop/a.db");
    let mut writer = Writer::open(&db, common::seed("s3-interop"));
    writer.step();
    let mut child = replicad_cmd(
        &server,
        dir.path(),
        &[
            "replicate",
            "--monitor-interval",
            "50ms",
            "--compression",
            "lz4",
            db.to_str().unwrap(),
            &url,
        ],
        "replicad.log",
    );
    for _ in 0..30 {
        writer.step();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop(&mut child);
    let out = dir.join("a-by-litestream.db");
    let o = litestream_cmd(&ls, &server)
        .args(["restore", "-o", out.to_str().unwrap(), &url])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "litestream restore: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_same_content(&db, &out, "litestream restore of replicad's bucket");

    // Litestream writes, replicad restores.
    let db2 = dir.join("b.db");
    let url2 = server.url("interop/b.db");
    let mut writer2 = Writer::open(&db2, common::seed("s3-interop-2"));
    writer2.step();
    let cfg = dir.join("litestream.yml");
    std::fs::write(
        &cfg,
        format!(
            "dbs:\n  - path: {}\n    monitor-interval: 100ms\n    replica:\n      type: s3\n      bucket: {}\n      path: {}\n      endpoint: {}\n      region: us-east-1\n      force-path-style: true\n      access-key-id: {}\n      secret-access-key: {}\n",
            db2.display(),
            server.bucket,
            server.key("interop/b.db"),
            server.endpoint,
            server.access_key,
            server.secret_key
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("litestream.log")).unwrap();
    let mut ls_child = litestream_cmd(&ls, &server)
        .args(["replicate", "-config", cfg.to_str().unwrap()])
        .stderr(log)
        .spawn()
        .unwrap();
    for _ in 0..20 {
        writer2.step();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::task::block_in_place(|| {
        common::wait_restores(&dir, &db2, "Litestream's bucket", |out| {
            Command::new(common::bin())
                .args(["restore", "--to", common::s(out), &url2])
                .env("AWS_ACCESS_KEY_ID", &server.access_key)
                .env("AWS_SECRET_ACCESS_KEY", &server.secret_key)
                .output()
                .is_ok_and(|o| o.status.success())
        })
    });
    stop(&mut ls_child);
    drop(writer2);
    let out2 = dir.join("b-by-replicad.db");
    run_ok(&server, &["restore", "--to", out2.to_str().unwrap(), &url2]);
    assert_same_content(&db2, &out2, "replicad restore of Litestream's bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_chunked_restore_survives_failing_calls() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-chunked");
    let db = dir.join("app.db");
    {
        // About 20 MiB of incompressible rows: the snapshot spans three 8 MiB chunks.
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB);")
            .unwrap();
        for _ in 0..20 {
            c.execute("INSERT INTO t(b) VALUES (randomblob(1024 * 1024))", [])
                .unwrap();
        }
    }
    let url = server.url("chunked/app.db");
    let settings = DbSettings {
        compression: replicad::ltx::Codec::None,
        ..settings()
    };
    let (store, h) = open_store(&server, &db, &url, settings).await;
    wait_until("snapshot uploaded", Duration::from_secs(60), || {
        caught_up(&h, 0)
    })
    .await;
    store.shutdown(std::future::pending()).await;

    let faults = Faults::new();
    faults.fail_next(3);
    let client = AnyClient::Faulty(Box::new(FaultyClient::new(
        AnyClient::S3(s3_client(&server, &url)),
        faults.clone(),
    )));
    let plan = restore::plan(&AnyClient::S3(s3_client(&server, &url)), Target::Latest)
        .await
        .unwrap();
    assert!(
        plan.iter().map(|f| f.size).sum::<u64>() > 16 * 1024 * 1024,
        "snapshot smaller than expected"
    );
    let out = dir.join("restored.db");
    let opts = RestoreOptions {
        to: out.clone(),
        target: Target::Latest,
        force: false,
        integrity_check: true,
        phases: Default::default(),
        threads: None,
    };
    restore::apply_parallel(&client, plan, &opts, 4)
        .await
        .unwrap();
    assert_eq!(faults.injected(), 3);
    assert_same_content(&db, &out, "parallel chunked restore");
    assert!(
        !dir.join("restored.db.restore").exists(),
        "fetch directory left behind"
    );

    // A download that keeps failing ends the restore (the apply, reading while it downloads,
    // does not wait forever) with the storage error, and leaves nothing behind.
    faults.set_fail_rate(1.0);
    let plan = restore::plan(&AnyClient::S3(s3_client(&server, &url)), Target::Latest)
        .await
        .unwrap();
    let out = dir.join("never.db");
    let opts = RestoreOptions {
        to: out.clone(),
        ..opts
    };
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        restore::apply_parallel(&client, plan, &opts, 4),
    )
    .await
    .expect("the restore hung on a failed download")
    .unwrap_err();
    assert!(
        matches!(err, restore::RestoreError::Storage(_)),
        "not the download's error: {err}"
    );
    for left in ["never.db", "never.db.tmp", "never.db.restore"] {
        assert!(!dir.join(left).exists(), "{left} left behind");
    }
}

/// A large initial snapshot is uploaded while it is staged (its parts go out during the
/// encoding, see `storage::feed`), and the object it completes restores to exactly the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_snapshot_is_uploaded_while_staged_and_restores_exactly() {
    let server = S3Server::start().await;
    let dir = TestDir::new("s3-streamed");
    let db = dir.join("app.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        // ~24 MiB that lz4 cannot shrink: the segment spans several 5 MiB parts, and its
        // encoding (unoptimised in test builds) lasts long enough for the replica to follow.
        c.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 6000)
             INSERT INTO t (b) SELECT randomblob(4000) FROM n;",
        )
        .unwrap();
    }
    let url = server.url("streamed/app.db");
    let (store, h) = open_store(&server, &db, &url, settings()).await;
    wait_until("snapshot uploaded", Duration::from_secs(120), || {
        caught_up(&h, 0)
    })
    .await;
    assert_eq!(
        h.replicas[0].1.streamed_segments.load(Ordering::Relaxed),
        1,
        "the initial snapshot was not uploaded while staged"
    );
    if server.counts_requests() {
        assert_eq!(
            (
                server.op_count("CreateMultipartUpload"),
                server.op_count("CompleteMultipartUpload"),
                server.op_count("AbortMultipartUpload"),
            ),
            (1, 1, 0),
            "{:?}",
            server.requests_by_op()
        );
        assert!(
            server.op_count("UploadPart") >= 5,
            "{:?}",
            server.requests_by_op()
        );
    }
    store.shutdown(std::future::pending()).await;
    let out = dir.join("restored.db");
    restore_to(AnyClient::S3(s3_client(&server, &url)), &out).await;
    assert_same_content(&db, &out, "streamed snapshot");
}

/// A shutdown drops a running verify at once (its verdict would not outlive the process), and
/// the verify leaves nothing behind: its restore is cancelled (downloads stop, the blocking
/// decoder ends, the temporary output is removed) instead of running on, or waiting forever
/// for chunks nobody fetches any more, past the end of the daemon. Here the verify's GETs
/// stall in the server, so a shutdown that waited for it would last its whole 30 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_a_stalled_verify_at_once_and_it_leaves_no_files() {
    let server = S3Server::start().await;
    if server.is_external() {
        eprintln!("SKIPPED: cannot stall an external S3 endpoint");
        return;
    }
    let dir = TestDir::new("s3-verify-stop");
    let db = dir.join("app.db");
    let url = server.url("verify-stop/app.db");
    let mut writer = Writer::open(&db, common::seed("s3-verify-stop"));
    for _ in 0..20 {
        writer.step();
    }
    let cfg = dir.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "monitor-interval: 50ms\nverify-interval: 200ms\nshutdown-sync-timeout: 30s\n\
             dbs:\n  - path: {}\n    replica:\n      url: {}\n",
            db.display(),
            url
        ),
    )
    .unwrap();
    let mut child = replicad_cmd(
        &server,
        dir.path(),
        &["replicate", "-config", cfg.to_str().unwrap()],
        "daemon.log",
    );
    let log = || std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log().contains("verify ok") {
        assert!(Instant::now() < deadline, "no verify passed:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The next verify's GETs wait in the server; the shutdown comes while they do.
    server.hold_ltx("GetObject", true);
    // A commit, so that the tip moves (a random step may roll back or only checkpoint).
    writer.commit_txn();
    while server.held_ltx() == 0 {
        assert!(Instant::now() < deadline, "no verify started:\n{}", log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopping = Instant::now();
    common::sigterm(&child);
    let status = common::wait_timeout(&mut child, Duration::from_secs(20));
    let took = stopping.elapsed();
    server.hold_ltx("GetObject", false);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("replicad still running 20 s after SIGTERM:\n{}", log());
    };
    assert!(status.success(), "exit {status:?}:\n{}", log());
    // Not the 30 s timeout: the verify was dropped at once, and its restore's threads ended.
    assert!(
        took < Duration::from_secs(10),
        "exit {took:?} after SIGTERM"
    );

    // Nothing of the verify is left beside the database: no output, no temporary file.
    let left = common::files_under(dir.path(), |n| n.starts_with("verify"));
    assert!(left.is_empty(), "the dropped verify left {left:?}");

    // The commit made just before the shutdown was shipped and restores.
    let out = dir.join("restored.db");
    run_ok(&server, &["restore", "--to", out.to_str().unwrap(), &url]);
    assert_same_content(&db, &out, "restore after a shutdown during a verify");
}

/// Ctrl-C or SIGTERM during `restore`, `snapshot` or `verify` stops it cleanly: exit 1 naming
/// the signal, no output and no temporary file left (the restore inside removes its own
/// before the process exits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_restore_snapshot_or_verify_leaves_no_files() {
    let server = S3Server::start().await;
    if server.is_external() {
        eprintln!("SKIPPED: cannot stall an external S3 endpoint");
        return;
    }
    let dir = TestDir::new("s3-restore-int");
    let db = dir.join("app.db");
    let url = server.url("restore-int/app.db");
    let mut writer = Writer::open(&db, common::seed("s3-restore-int"));
    for _ in 0..20 {
        writer.step();
    }
    let mut daemon = replicad_cmd(
        &server,
        dir.path(),
        &["replicate", db.to_str().unwrap(), &url],
        "daemon.log",
    );
    let client = s3_client(&server, &url);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !caught_up_remote(&client).await {
        assert!(Instant::now() < deadline, "the replica got no file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(&mut daemon);

    // Each command's GETs wait in the server; the signal comes while they do.
    server.hold_ltx("GetObject", true);
    let out = dir.join("restored.db");
    let snap = dir.join("snap.db");
    type Signal = fn(&Child);
    let cases: [(&str, Vec<&str>, Signal); 3] = [
        (
            "SIGINT",
            vec!["restore", "--to", out.to_str().unwrap(), &url],
            common::sigint,
        ),
        (
            "SIGTERM",
            vec!["snapshot", "--to", snap.to_str().unwrap(), &url],
            common::sigterm,
        ),
        ("SIGINT", vec!["verify", &url], common::sigint),
    ];
    for (signal, args, send) in cases {
        let held = server.held_ltx();
        // `verify` works in a directory under TMPDIR.
        let tmpdir = dir.join("tmpdir");
        std::fs::create_dir_all(&tmpdir).unwrap();
        let mut child = Command::new(common::bin())
            .args(&args)
            .env("AWS_ACCESS_KEY_ID", &server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &server.secret_key)
            .env("TMPDIR", &tmpdir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("cmd.log")).unwrap())
            .spawn()
            .unwrap();
        let log = || std::fs::read_to_string(dir.join("cmd.log")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        // Held GETs, and the temporary output the restore inside creates as it starts.
        while server.held_ltx() == held
            || common::files_under(dir.path(), |n| n.contains(".tmp")).is_empty()
        {
            assert!(
                Instant::now() < deadline,
                "{args:?} did not start:\n{}",
                log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        send(&child);
        let status = common::wait_timeout(&mut child, Duration::from_secs(20));
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running 20 s after {signal}:\n{}", log());
        };
        assert_eq!(status.code(), Some(1), "{args:?}: {}", log());
        assert!(
            log().contains(&format!("{signal}: ")),
            "{args:?}: {}",
            log()
        );
        assert!(!out.exists() && !snap.exists(), "{args:?} wrote an output");
        let left: Vec<_> = [".tmp", ".replicad-snapshot-", "verify"]
            .iter()
            .flat_map(|p| common::files_under(dir.path(), |n| n.contains(p)))
            .collect();
        assert!(left.is_empty(), "{args:?} after {signal} left {left:?}");
        let dirs = std::fs::read_dir(&tmpdir).unwrap().count();
        assert_eq!(
            dirs, 0,
            "{args:?} after {signal} left a directory in TMPDIR"
        );
    }
    server.hold_ltx("GetObject", false);
}

/// True once the replica holds at least one level-0 file.
async fn caught_up_remote(client: &S3Client) -> bool {
    use replicad::storage::ReplicaClient;
    client.list(0).await.is_ok_and(|files| !files.is_empty())
}

/// A backward step of the wall clock (NTP, a VM restored from a snapshot) while an upload
/// hangs without an error: the replica's lag is measured on the steady clock, so it keeps
/// growing and `/readyz` reports it past `max-lag`. Measured on the LTX timestamps (wall
/// clock), the lag read 0 for the size of the step, an hour here. The daemon runs under
/// libfaketime, whose offset file the test rewrites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_step_of_the_wall_clock_does_not_hide_a_stuck_upload() {
    let server = S3Server::start().await;
    if server.is_external() {
        eprintln!("skipped: needs the in-process S3 server");
        return;
    }
    let Some(faketime) = common::libfaketime() else {
        eprintln!("SKIPPED: libfaketime is not installed (apt-get install libfaketime)");
        return;
    };
    let dir = TestDir::new("s3-clock-step");
    let db = dir.join("app.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (0);")
        .unwrap();
    let url = server.url("clock/app.db");
    let port = common::http::free_port();
    let cfg = dir.join("replicad.yml");
    std::fs::write(
        &cfg,
        format!(
            "addr: \"127.0.0.1:{port}\"\nmonitor-interval: 50ms\nmax-lag: 1s\ndbs:\n  - path: {}\n    \
             replica:\n      url: {url}\n",
            db.display()
        ),
    )
    .unwrap();
    let offset = dir.join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let d = common::spawn_replicate_env(
        dir.path(),
        &["-c", common::s(&cfg)],
        &[
            ("LD_PRELOAD", faketime),
            ("FAKETIME_TIMESTAMP_FILE", common::s(&offset)),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("AWS_ACCESS_KEY_ID", &server.access_key),
            ("AWS_SECRET_ACCESS_KEY", &server.secret_key),
        ],
    );
    let wait = Duration::from_secs(20);
    let replica = || -> (u64, serde_json::Value) {
        // Not listening yet: nothing replicated.
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            return (0, serde_json::Value::Null);
        }
        let (_, body) = common::http::get_blocking(port, "/status");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let db = &v["databases"][0];
        (db["txid"].as_u64().unwrap_or(0), db["replicas"][0].clone())
    };
    wait_until("replicated and ready", wait, || {
        let (txid, r) = replica();
        txid > 0
            && r["remote_txid"].as_u64() == Some(txid)
            && common::http::get_blocking(port, "/readyz").0 == 200
    })
    .await;

    // The next upload waits in the server; once its segment is cut, the clock steps back.
    server.hold_ltx("PutObject", true);
    let (before, held) = (replica().0, server.held_ltx());
    c.execute("INSERT INTO t VALUES (1)", []).unwrap();
    wait_until("the commit cut", wait, || replica().0 > before).await;
    // Its upload has begun (and waits in the server) before the step.
    wait_until("the upload held", wait, || server.held_ltx() > held).await;
    std::fs::write(&offset, "-1h\n").unwrap();
    // A second commit, cut after the step: its header time (in staging, as its upload waits
    // behind the first) shows the daemon's clock an hour back.
    c.execute("INSERT INTO t VALUES (2)", []).unwrap();
    wait_until("the second commit cut", wait, || replica().0 > before + 1).await;
    let staged = run_ok(&server, &["ltx", "--json", common::s(&db)]);
    let staged: serde_json::Value = serde_json::from_slice(&staged.stdout).unwrap();
    let newest = staged
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|f| f["max_txid"].as_str().unwrap().to_string())
        .unwrap();
    let cut = chrono::DateTime::parse_from_rfc3339(newest["timestamp"].as_str().unwrap()).unwrap();
    assert!(
        chrono::Utc::now().signed_duration_since(cut) > chrono::TimeDelta::minutes(50),
        "the daemon's clock did not step back: {staged}"
    );
    wait_until("the stuck upload's lag to pass 3 s", wait, || {
        replica().1["lag_seconds"].as_f64().unwrap_or(0.0) >= 3.0
    })
    .await;
    let (code, body) = common::http::get_blocking(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("txids and"), "{body}");

    // The clock back and the upload let go: ready again, and the restore equals the source.
    std::fs::write(&offset, "+0\n").unwrap();
    server.hold_ltx("PutObject", false);
    wait_until("ready again", wait, || {
        let (txid, r) = replica();
        r["remote_txid"].as_u64() == Some(txid)
            && common::http::get_blocking(port, "/readyz").0 == 200
    })
    .await;
    d.stop_ok();
    let out = dir.join("restored.db");
    run_ok(&server, &["restore", "--to", common::s(&out), &url]);
    common::assert_same_content(&db, &out, "after the clock step");
}
