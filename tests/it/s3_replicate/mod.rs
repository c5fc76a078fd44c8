//! Tests for replication to S3 go here: a real S3 server on 127.0.0.1 (tests/it/common/s3.rs),
//! injected faults, the idle request budget, the lease, independent replicas, a chunked
//! restore and a large snapshot, on a Store in this process; `daemon` runs the real binary.

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

mod daemon;
