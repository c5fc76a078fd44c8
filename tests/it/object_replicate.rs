//! Replication to Google Cloud Storage, Azure Blob Storage and WebDAV end to end, against real
//! servers on 127.0.0.1 (fake-gcs-server, Azurite, rclone; see `common::emulators`): replicate,
//! kill -9, replicate again, restore; age-encrypted round trips; Litestream restoring
//! replicad's replica and the reverse; and bad input (wrong key, missing bucket, a server
//! down at start) reported by name while the daemon keeps running.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::emulators::{AZURITE_ACCOUNT, AZURITE_KEY, Emulator};
use common::{TestDir, Writer, assert_same_content, steps, wait_for_replica_txid};
use replicad::storage::ReplicaClient;
use replicad::storage::object::Service;

fn replicad(emu: &Emulator, args: &[&str]) -> Command {
    let mut c = Command::new(common::bin());
    c.args(args).env("NO_COLOR", "1").envs(emu.env());
    c
}

fn spawn(emu: &Emulator, dir: &Path, args: &[&str], log: &str) -> Child {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    replicad(emu, args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn stop_ok(child: &mut Child, dir: &Path, log: &str) {
    common::sigterm(child);
    let st = common::wait_timeout(child, Duration::from_secs(60)).expect("daemon did not stop");
    assert!(
        st.success(),
        "daemon exit {st:?}:\n{}",
        std::fs::read_to_string(dir.join(log)).unwrap_or_default()
    );
}

fn run(emu: &Emulator, args: &[&str]) -> Output {
    replicad(emu, args).output().unwrap()
}

fn run_ok(emu: &Emulator, args: &[&str]) -> Output {
    let o = run(emu, args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn emulators() -> Vec<Emulator> {
    [
        Emulator::gcs(),
        Emulator::azurite(),
        Emulator::webdav(false),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// replicate -> kill -9 -> replicate again -> SIGTERM -> restore equals the source, on each
/// backend; then a point in time from the first run restores too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicate_kill9_and_restore_on_each_backend() {
    for emu in emulators() {
        let name = emu.name();
        let dir = TestDir::new(&format!("obj-e2e-{name}"));
        let db = dir.join("app.db");
        let url = emu.url("e2e/app.db");
        let mut w = Writer::open(&db, common::seed(&format!("obj-e2e-{name}")));
        w.step();
        let args = [
            "replicate",
            "--monitor-interval",
            "50ms",
            common::s(&db),
            &url,
        ];
        let mut first = spawn(&emu, dir.path(), &args, "first.log");
        steps(&mut w, 25).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        common::kill9(&mut first);
        steps(&mut w, 25).await;
        let mut second = spawn(&emu, dir.path(), &args, "second.log");
        steps(&mut w, 25).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop_ok(&mut second, dir.path(), "second.log");

        let out = dir.join("restored.db");
        run_ok(&emu, &["restore", "--to", common::s(&out), &url]);
        assert_same_content(&db, &out, &format!("{name}: restore after kill -9"));

        let ltx = run_ok(&emu, &["ltx", &url]);
        let listing = String::from_utf8_lossy(&ltx.stdout);
        assert!(
            listing.lines().count() > 3,
            "{name}: ltx listing:\n{listing}"
        );
        let at2 = dir.join("at-2.db");
        run_ok(
            &emu,
            &[
                "restore",
                "--txid",
                "0000000000000002",
                "--to",
                common::s(&at2),
                &url,
            ],
        );
        assert!(common::integrity_ok(&at2), "{name}: TXID 2");
    }
}

/// An age-encrypted replica on each backend: the objects are `.ltx.age`, and restore needs
/// and uses the identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_encrypted_round_trip_on_each_backend() {
    for emu in emulators() {
        let name = emu.name();
        let dir = TestDir::new(&format!("obj-age-{name}"));
        let (identity, public) = replicad::storage::age::keys::generate_identity();
        let id = dir.join("id.txt");
        std::fs::write(&id, identity).unwrap();
        let db = dir.join("app.db");
        let mut w = Writer::open(&db, common::seed(&format!("obj-age-{name}")));
        w.step();
        let url = emu.url("age/app.db");
        let cfg = dir.join("replicad.yml");
        std::fs::write(
            &cfg,
            format!(
                "monitor-interval: 50ms\ndbs:\n  - path: {}\n    replica:\n      url: \"{url}\"\n      age:\n        recipients: [{public}]\n        identities: [{}]\n",
                db.display(),
                id.display()
            ),
        )
        .unwrap();
        let mut d = spawn(
            &emu,
            dir.path(),
            &["replicate", "--config", common::s(&cfg)],
            "d.log",
        );
        steps(&mut w, 20).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop_ok(&mut d, dir.path(), "d.log");

        // What the storage holds: only encrypted segments.
        let op = emu.config("age/app.db").build().unwrap();
        let keys: Vec<String> = op
            .list_with("age/app.db/ltx/")
            .recursive(true)
            .await
            .unwrap()
            .iter()
            .map(|e| e.path().to_string())
            .filter(|p| !p.ends_with('/'))
            .collect();
        assert!(
            !keys.is_empty() && keys.iter().all(|k| k.ends_with(".ltx.age")),
            "{name}: {keys:?}"
        );
        let out = dir.join("no-key.db");
        let o = run(&emu, &["restore", "--to", common::s(&out), &url]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{name}: restore without the identity"
        );
        assert!(!out.exists());
        run_ok(
            &emu,
            &[
                "restore",
                "--age-identity",
                common::s(&id),
                "--to",
                common::s(&out),
                &url,
            ],
        );
        assert_same_content(&db, &out, &format!("{name}: age round trip"));
    }
}

/// Litestream restores replicad's replica (lz4) and replicad restores Litestream's, on each
/// backend Litestream can point at an emulator: gs through STORAGE_EMULATOR_HOST, abs through
/// `endpoint` with the account key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litestream_and_replicad_read_each_others_replicas_on_each_backend() {
    let Some(ls) = common::litestream_bin() else {
        eprintln!("SKIPPED: litestream not installed");
        return;
    };
    for emu in emulators() {
        let name = emu.name();
        let dir = TestDir::new(&format!("obj-interop-{name}"));
        let litestream = |args: &[&str]| {
            let mut c = Command::new(&ls);
            c.args(args).env_remove("AWS_CA_BUNDLE");
            if emu.service == Service::Gcs {
                c.env("STORAGE_EMULATOR_HOST", format!("127.0.0.1:{}", emu.port));
            } else {
                c.env("LITESTREAM_AZURE_ACCOUNT_KEY", AZURITE_KEY);
            }
            c
        };
        let replica_yaml = |path: &str| match emu.service {
            Service::Gcs => format!(
                "      type: gs\n      bucket: {}\n      path: {path}\n",
                emu.bucket
            ),
            Service::Azure => format!(
                "      type: abs\n      account-name: {AZURITE_ACCOUNT}\n      bucket: {}\n      path: {path}\n      endpoint: {}\n",
                emu.bucket, emu.endpoint
            ),
            Service::Webdav => format!(
                "      type: webdav\n      webdav-url: {}\n      path: {path}\n",
                emu.endpoint
            ),
        };

        // replicad writes (lz4), Litestream restores.
        let db = dir.join("a.db");
        let mut w = Writer::open(&db, common::seed(&format!("obj-interop-{name}")));
        w.step();
        let url = emu.url("interop/a.db");
        let args = [
            "replicate",
            "--monitor-interval",
            "50ms",
            "--compression",
            "lz4",
            common::s(&db),
            &url,
        ];
        let mut d = spawn(&emu, dir.path(), &args, "replicad.log");
        steps(&mut w, 25).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop_ok(&mut d, dir.path(), "replicad.log");
        let cfg_a = dir.join("litestream-a.yml");
        std::fs::write(
            &cfg_a,
            format!(
                "dbs:\n  - path: {}\n    replica:\n{}",
                db.display(),
                replica_yaml("interop/a.db")
            ),
        )
        .unwrap();
        let out = dir.join("a-by-litestream.db");
        let o = litestream(&[
            "restore",
            "-config",
            common::s(&cfg_a),
            "-o",
            common::s(&out),
            common::s(&db),
        ])
        .output()
        .unwrap();
        assert!(
            o.status.success(),
            "{name}: litestream restore: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_same_content(
            &db,
            &out,
            &format!("{name}: Litestream restores replicad's"),
        );

        // Litestream writes, replicad restores.
        let db2 = dir.join("b.db");
        let mut w2 = Writer::open(&db2, common::seed(&format!("obj-interop-b-{name}")));
        w2.step();
        let cfg_b = dir.join("litestream-b.yml");
        std::fs::write(
            &cfg_b,
            format!(
                "dbs:\n  - path: {}\n    monitor-interval: 100ms\n    replica:\n{}",
                db2.display(),
                replica_yaml("interop/b.db")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("litestream.log")).unwrap();
        let mut ls_child = litestream(&["replicate", "-config", common::s(&cfg_b)])
            .stderr(log)
            .spawn()
            .unwrap();
        steps(&mut w2, 20).await;
        tokio::task::block_in_place(|| {
            common::wait_restores(&dir, &db2, "Litestream's replica", |out| {
                run(
                    &emu,
                    &["restore", "--to", common::s(out), &emu.url("interop/b.db")],
                )
                .status
                .success()
            })
        });
        common::sigterm(&ls_child);
        let st =
            common::wait_timeout(&mut ls_child, Duration::from_secs(30)).expect("litestream stop");
        assert!(
            st.success(),
            "{name}: litestream exit {st:?}: {}",
            std::fs::read_to_string(dir.join("litestream.log")).unwrap_or_default()
        );
        drop(w2);
        let out2 = dir.join("b-by-replicad.db");
        run_ok(
            &emu,
            &[
                "restore",
                "--to",
                common::s(&out2),
                &emu.url("interop/b.db"),
            ],
        );
        assert_same_content(
            &db2,
            &out2,
            &format!("{name}: replicad restores Litestream's"),
        );
    }
}

/// After start, an idle database sends no request to its gs or abs replica (counted by a
/// proxy in front of the emulator); a commit then costs a handful.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_database_sends_no_request_on_each_backend() {
    for emu in emulators() {
        let name = emu.name();
        let proxy = common::emulators::CountingProxy::start(emu.port);
        let dir = TestDir::new(&format!("obj-idle-{name}"));
        let db = dir.join("app.db");
        let mut w = Writer::open(&db, common::seed(&format!("obj-idle-{name}")));
        w.step();
        let url = emu.url_via(&proxy, "idle/app.db");
        let mut d = spawn(
            &emu,
            dir.path(),
            &[
                "replicate",
                "--monitor-interval",
                "50ms",
                common::s(&db),
                &url,
            ],
            "d.log",
        );
        // Start: lease, listing, the first segment; seen straight at the emulator (not
        // through the proxy), then a moment for the round to finish.
        let direct = emu.client("idle/app.db");
        wait_for_replica_txid(&direct, 1, name).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let settled = proxy.requests();
        assert!(settled > 0, "{name}: the proxy saw the start");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle = proxy.requests() - settled;
        assert_eq!(idle, 0, "{name}: requests in 5 s of idle (100 ticks)");
        let before = wait_for_replica_txid(&direct, 1, name).await;
        w.commit_txn();
        wait_for_replica_txid(&direct, before + 1, name).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let commit = proxy.requests() - settled;
        assert!(
            (1..=6).contains(&commit),
            "{name}: one commit cost {commit} requests"
        );
        stop_ok(&mut d, dir.path(), "d.log");
        eprintln!("{name}: start {settled} requests, idle 0, one commit {commit}");
    }
}

/// Bad input on each backend gets one line naming the replica: a missing bucket or
/// container, a wrong account key (Azure; fake-gcs-server checks no credentials), and a
/// server that is down at start, which the daemon reports and keeps retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_named_on_each_backend() {
    for emu in emulators() {
        let name = emu.name();
        let dir = TestDir::new(&format!("obj-bad-{name}"));
        let out = dir.join("out.db");

        // A missing bucket or container (WebDAV has neither: see sftp_webdav_errors).
        if emu.service != Service::Webdav {
            let url = emu
                .url("x/app.db")
                .replacen(&emu.bucket, "no-such-bucket", 1);
            let o = run(&emu, &["restore", "--to", common::s(&out), &url]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{name}: {err}");
            assert!(
                err.contains("`no-such-bucket` does not exist") && err.trim().lines().count() == 1,
                "{name}: missing bucket:\n{err}"
            );
        }

        // A wrong key.
        if emu.service == Service::Azure {
            let o = Command::new(common::bin())
                .args(["restore", "--to", common::s(&out), &emu.url("x/app.db")])
                .env(
                    "LITESTREAM_AZURE_ACCOUNT_KEY",
                    "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=",
                )
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{name}: {err}");
            assert!(
                err.contains(&format!("abs://{AZURITE_ACCOUNT}@{}/", emu.bucket))
                    && err.contains("hint:")
                    && err.trim().lines().count() == 1
                    && !err.contains("d3Jvbmcta2V5"),
                "{name}: wrong key:\n{err}"
            );
        }

        // The server down at start: the daemon runs, says so, and keeps trying.
        let db = dir.join("app.db");
        let _w = Writer::open(&db, 1);
        let closed = common::http::free_port();
        let down = emu.url("down/app.db").replace(
            &format!("127.0.0.1:{}", emu.port),
            &format!("127.0.0.1:{closed}"),
        );
        let mut d = spawn(
            &emu,
            dir.path(),
            &[
                "replicate",
                "--monitor-interval",
                "50ms",
                "--shutdown-sync-timeout",
                "2s",
                common::s(&db),
                &down,
            ],
            "down.log",
        );
        let reach = format!("cannot reach http://127.0.0.1:{closed}");
        common::wait_log(&dir.join("down.log"), &reach).await;
        assert!(
            d.try_wait().unwrap().is_none(),
            "{name}: the daemon exited with its replica down"
        );
        common::sigterm(&d);
        let st = common::wait_timeout(&mut d, Duration::from_secs(60)).expect("stop");
        assert_eq!(
            st.code(),
            Some(1),
            "{name}: not protected at shutdown is exit 1"
        );
    }
}

/// A WebDAV server that asks for a password: a wrong one gets one line naming the replica and
/// the keys to check, never the password; the right one restores (an empty replica: exit 1,
/// "no backup", not a credentials error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdav_credentials_are_checked_and_never_shown() {
    let Some(emu) = Emulator::webdav(true) else {
        return;
    };
    let dir = TestDir::new("obj-webdav-auth");
    let db = dir.join("app.db");
    let (user, pass) = emu.auth.clone().unwrap();
    let restore = |password: &str| {
        let cfg = dir.join("replicad.yml");
        std::fs::write(
            &cfg,
            format!(
                "dbs:\n  - path: {}\n    replica:\n      type: webdav\n      webdav-url: {}\n      webdav-username: {user}\n      webdav-password: {password}\n      path: auth/app.db\n",
                db.display(),
                emu.endpoint
            ),
        )
        .unwrap();
        let out = dir.join("out.db");
        let o = run(
            &emu,
            &[
                "restore",
                "--config",
                common::s(&cfg),
                "--to",
                common::s(&out),
                common::s(&db),
            ],
        );
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, err) = restore("wrong-password-xyz");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.trim().lines().count() == 1
            && err.contains(&format!("webdav://127.0.0.1:{}/auth/app.db", emu.port))
            && err.contains("credentials were refused")
            && err.contains("webdav-password")
            && !err.contains("wrong-password-xyz"),
        "wrong password:\n{err}"
    );
    let (code, err) = restore(&pass);
    assert_eq!(code, Some(1), "{err}");
    assert!(!err.contains("credentials"), "right password:\n{err}");
}

/// A WebDAV server that refuses writes (rclone `--read-only` answers MKCOL of a nested
/// collection with 409): the daemon keeps running and trying, says in its log which replica
/// fails, with the server's answer and what to check (not "cannot reach"), and exits 1 when
/// stopped with its database unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdav_read_only_server_is_named() {
    let Some(emu) = Emulator::webdav_read_only() else {
        return;
    };
    let dir = TestDir::new("obj-webdav-denied");
    let db = dir.join("app.db");
    let _w = Writer::open(&db, 1);
    let mut d = spawn(
        &emu,
        dir.path(),
        &["replicate", common::s(&db), &emu.url("denied/app.db")],
        "d.log",
    );
    let named = format!("webdav://127.0.0.1:{}/denied/app.db", emu.port);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(dir.join("d.log")).unwrap_or_default();
        if log.contains("HTTP 409") {
            break log;
        }
        assert!(std::time::Instant::now() < deadline, "{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let line = log.lines().find(|l| l.contains("HTTP 409")).unwrap();
    assert!(
        line.contains(&named)
            && line.contains("hint: check that the server is writable")
            && !line.contains("cannot reach"),
        "{log}"
    );
    assert!(d.try_wait().unwrap().is_none(), "{log}");
    common::sigterm(&d);
    let st = common::wait_timeout(&mut d, Duration::from_secs(60)).expect("stop");
    assert_eq!(st.code(), Some(1), "exit code with an unprotected database");
}

/// A lease write under way on WebDAV (its `replicad.lease.<pid>-<random>.tmp`, between the
/// write and the MOVE that deletes the old lease first) is seen by one listing; GCS and Azure
/// replace in one step, so nothing is listed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_write_under_way_is_seen_on_webdav() {
    let Some(dav) = Emulator::webdav(false) else {
        return;
    };
    let client = dav.client("inflight");
    assert!(!client.aux_write_in_flight("replicad.lease").await.unwrap());
    client
        .write_aux("other.1-2.tmp", b"x".to_vec())
        .await
        .unwrap();
    client
        .write_aux("replicad.lease", b"{}".to_vec())
        .await
        .unwrap();
    assert!(!client.aux_write_in_flight("replicad.lease").await.unwrap());
    // As a crashed or slow writer leaves it.
    client
        .write_aux("replicad.lease.77-00000000000000ff.tmp", b"{}".to_vec())
        .await
        .unwrap();
    assert!(client.aux_write_in_flight("replicad.lease").await.unwrap());
}
