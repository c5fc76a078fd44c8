//! S3 replication seen from the real binary: a server restart under the daemon, credentials
//! kept out of logs, Litestream on the same bucket, a stop during a stalled verify, an
//! interrupted restore, and a step of the wall clock.

use super::*;

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
