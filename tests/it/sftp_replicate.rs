//! Replication to an SFTP server end to end, against a real OpenSSH sshd on 127.0.0.1 (see
//! `common::sshd`), configured by YAML as users configure it (key file, host key): replicate,
//! kill -9, replicate again, restore; an age-encrypted round trip; Litestream restoring
//! replicad's replica and the reverse; no traffic while idle; and bad input (unknown or
//! changed host key, refused key, permission denied, server down at start) named in one line.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::emulators::CountingProxy;
use common::sshd::Sshd;
use common::{TestDir, Writer, assert_same_content, steps, wait_for_replica_txid};
use replicad::storage::{AnyClient, ReplicaClient};

fn replicad(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(common::bin());
    // An empty HOME: nothing from the user's own ~/.ssh is used by accident.
    c.args(args).env("NO_COLOR", "1").env("HOME", dir);
    c
}

fn spawn(dir: &Path, args: &[&str], log: &str) -> Child {
    let log = std::fs::File::create(dir.join(log)).unwrap();
    replicad(dir, args)
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

fn run(dir: &Path, args: &[&str]) -> Output {
    replicad(dir, args).output().unwrap()
}

fn run_ok(dir: &Path, args: &[&str]) -> Output {
    let o = run(dir, args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Writes a replicad config for `db` with one replica given by `replica` (YAML lines at six
/// spaces) and returns its path.
fn config(dir: &Path, name: &str, db: &Path, extra: &str, replica: &str) -> PathBuf {
    let cfg = dir.join(name);
    std::fs::write(
        &cfg,
        format!(
            "monitor-interval: 50ms\n{extra}dbs:\n  - path: {}\n    replica:\n{replica}",
            db.display()
        ),
    )
    .unwrap();
    cfg
}

/// `replicad restore --config CFG --to OUT DB`.
fn restore(dir: &Path, cfg: &Path, out: &Path, db: &Path) -> Output {
    run(
        dir,
        &[
            "restore",
            "--config",
            common::s(cfg),
            "--to",
            common::s(out),
            common::s(db),
        ],
    )
}

/// replicate -> kill -9 -> replicate again -> SIGTERM -> restore equals the source; a point
/// in time from the first run restores too; the run stopped by SIGTERM left no temporary
/// file on the server (the killed one may have: an upload cut by kill -9 is never listed),
/// and the second run swept the leftovers of an older crash (a day old or more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_replicate_kill9_and_restore() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("sftp-e2e");
    let db = dir.join("app.db");
    let mut w = Writer::open(&db, common::seed("sftp-e2e"));
    w.step();
    let cfg = config(
        dir.path(),
        "replicad.yml",
        &db,
        "l0-retention-check-interval: 200ms\n",
        &sshd.replica_yaml("e2e", sshd.port, 6),
    );
    let args = ["replicate", "--config", common::s(&cfg)];
    let mut first = spawn(dir.path(), &args, "first.log");
    // Its temporary files: `<name>.<pid>.<ns>.tmp` (segments), `<name>.<pid>-<random>.tmp`.
    let killed = [format!(".{}.", first.id()), format!(".{}-", first.id())];
    steps(&mut w, 25).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    common::kill9(&mut first);
    steps(&mut w, 25).await;
    // An older crash's leftovers: a put's and a lease write's, three days old.
    let root = sshd.root.join("e2e");
    let crashed = [
        root.join("ltx/0/0000000000000001-0000000000000001.ltx.4242.1700000000000000000.tmp"),
        root.join("replicad.lease.4242-0123456789abcdef.tmp"),
    ];
    for p in &crashed {
        std::fs::write(p, b"cut").unwrap();
        let days_ago = std::time::SystemTime::now() - Duration::from_secs(3 * 86_400);
        std::fs::File::options()
            .write(true)
            .open(p)
            .and_then(|f| f.set_modified(days_ago))
            .unwrap();
    }
    let mut second = spawn(dir.path(), &args, "second.log");
    steps(&mut w, 25).await;
    common::wait_until(&dir, "the second run to sweep the old leftovers", || {
        crashed.iter().all(|p| !p.exists())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_ok(&mut second, dir.path(), "second.log");

    let out = dir.join("restored.db");
    let restore = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "restore",
            "--config",
            common::s(&cfg),
            "--to",
            common::s(out),
        ];
        a.extend_from_slice(extra);
        a.push(common::s(&db));
        run_ok(dir.path(), &a)
    };
    restore(&out, &[]);
    assert_same_content(&db, &out, "sftp: restore after kill -9");
    let at2 = dir.join("at-2.db");
    restore(&at2, &["--txid", "0000000000000002"]);
    assert!(common::integrity_ok(&at2), "sftp: TXID 2");
    let leftovers: Vec<_> = walk(&sshd.root.join("e2e"))
        .into_iter()
        .filter(|p| p.ends_with(".tmp") && !killed.iter().any(|k| p.contains(k.as_str())))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// An age-encrypted SFTP replica: the files are `.ltx.age`, and restore needs and uses the
/// identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_age_encrypted_round_trip() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("sftp-age");
    let (identity, public) = replicad::storage::age::keys::generate_identity();
    let id = dir.join("id.txt");
    std::fs::write(&id, identity).unwrap();
    let db = dir.join("app.db");
    let mut w = Writer::open(&db, common::seed("sftp-age"));
    w.step();
    let replica = format!(
        "{}      age:\n        recipients: [{public}]\n        identities: [{}]\n",
        sshd.replica_yaml("age", sshd.port, 6),
        id.display()
    );
    let cfg = config(dir.path(), "replicad.yml", &db, "", &replica);
    let mut d = spawn(
        dir.path(),
        &["replicate", "--config", common::s(&cfg)],
        "d.log",
    );
    steps(&mut w, 20).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_ok(&mut d, dir.path(), "d.log");
    let files: Vec<_> = walk(&sshd.root.join("age/ltx"));
    assert!(
        !files.is_empty() && files.iter().all(|f| f.ends_with(".ltx.age")),
        "{files:?}"
    );
    // Without the identity: the same replica through a config that has none.
    let bare = config(
        dir.path(),
        "bare.yml",
        &db,
        "",
        &sshd.replica_yaml("age", sshd.port, 6),
    );
    let out = dir.join("no-key.db");
    let o = restore(dir.path(), &bare, &out, &db);
    assert_eq!(o.status.code(), Some(1), "restore without the identity");
    let out = dir.join("restored.db");
    let o = restore(dir.path(), &cfg, &out, &db);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_content(&db, &out, "sftp: age round trip");
}

/// Litestream (0.5.17, from PyPI) restores replicad's SFTP replica (lz4), and replicad
/// restores Litestream's, both through the same sshd with the same config keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litestream_and_replicad_read_each_others_sftp_replicas() {
    let Some(ls) = common::litestream_bin() else {
        return;
    };
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("sftp-interop");
    // The ECDSA host key: Litestream's Go client asks for ECDSA first and checks `host-key`
    // against whatever the server presents (a server with an Ed25519 and an ECDSA key fails
    // its check with the Ed25519 one); replicad asks for the type it is given.
    let yaml = |rel: &str| {
        sshd.replica_yaml(rel, sshd.port, 6)
            .replace(&sshd.host_key, &sshd.host_key_ecdsa)
    };

    // replicad writes (lz4), Litestream restores.
    let db = dir.join("a.db");
    let mut w = Writer::open(&db, common::seed("sftp-interop-a"));
    w.step();
    let cfg = config(
        dir.path(),
        "replicad.yml",
        &db,
        "compression: lz4\n",
        &yaml("a"),
    );
    let mut d = spawn(
        dir.path(),
        &["replicate", "--config", common::s(&cfg)],
        "r.log",
    );
    steps(&mut w, 25).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_ok(&mut d, dir.path(), "r.log");
    let ls_cfg = dir.join("litestream-a.yml");
    std::fs::write(
        &ls_cfg,
        format!(
            "dbs:\n  - path: {}\n    replica:\n{}",
            db.display(),
            yaml("a")
        ),
    )
    .unwrap();
    let out = dir.join("a-by-litestream.db");
    let o = Command::new(&ls)
        .args([
            "restore",
            "-config",
            common::s(&ls_cfg),
            "-o",
            common::s(&out),
        ])
        .arg(&db)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "litestream restore: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_same_content(&db, &out, "sftp: Litestream restores replicad's");

    // Litestream writes, replicad restores.
    let db2 = dir.join("b.db");
    let mut w2 = Writer::open(&db2, common::seed("sftp-interop-b"));
    w2.step();
    let ls_cfg_b = dir.join("litestream-b.yml");
    std::fs::write(
        &ls_cfg_b,
        format!(
            "dbs:\n  - path: {}\n    monitor-interval: 100ms\n    replica:\n{}",
            db2.display(),
            yaml("b")
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("litestream.log")).unwrap();
    let mut ls_child = Command::new(&ls)
        .args(["replicate", "-config", common::s(&ls_cfg_b)])
        .stderr(log)
        .spawn()
        .unwrap();
    steps(&mut w2, 20).await;
    let cfg_b = config(dir.path(), "replicad-b.yml", &db2, "", &yaml("b"));
    tokio::task::block_in_place(|| {
        common::wait_restores(&dir, &db2, "Litestream's replica", |out| {
            restore(dir.path(), &cfg_b, out, &db2).status.success()
        })
    });
    common::sigterm(&ls_child);
    let st = common::wait_timeout(&mut ls_child, Duration::from_secs(30)).expect("stop");
    assert!(
        st.success(),
        "litestream exit {st:?}: {}",
        std::fs::read_to_string(dir.join("litestream.log")).unwrap_or_default()
    );
    drop(w2);
    let out2 = dir.join("b-by-replicad.db");
    let o = restore(dir.path(), &cfg_b, &out2, &db2);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_content(&db2, &out2, "sftp: replicad restores Litestream's");
}

/// After start, an idle database sends nothing at all to its SFTP replica (bytes counted by
/// a proxy in front of sshd: SSH is encrypted, so bytes, not requests); a commit then does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_database_sends_nothing_over_sftp() {
    let Some(sshd) = Sshd::start() else { return };
    let proxy = CountingProxy::start(sshd.port);
    let dir = TestDir::new("sftp-idle");
    let db = dir.join("app.db");
    let mut w = Writer::open(&db, common::seed("sftp-idle"));
    w.step();
    let cfg = config(
        dir.path(),
        "replicad.yml",
        &db,
        "",
        &sshd.replica_yaml("idle", proxy.port, 6),
    );
    let mut d = spawn(
        dir.path(),
        &["replicate", "--config", common::s(&cfg)],
        "d.log",
    );
    let direct = sshd.client("idle");
    wait_for_replica_txid(&direct, 1, "sftp").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = proxy.bytes();
    assert!(settled > 0, "the proxy saw the start");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        proxy.bytes() - settled,
        0,
        "bytes in 5 s of idle (100 ticks)"
    );
    let before = wait_for_replica_txid(&direct, 1, "sftp").await;
    w.commit_txn();
    wait_for_replica_txid(&direct, before + 1, "sftp").await;
    assert!(proxy.bytes() > settled, "the commit went through the proxy");
    stop_ok(&mut d, dir.path(), "d.log");
    eprintln!(
        "sftp: start {settled} bytes, idle 0, one commit {} bytes",
        proxy.bytes() - settled
    );
}

/// Bad input gets one line naming the replica and what to do: an unknown host key (the
/// ssh-keyscan hint), a host key that does not match `host-key`, a key the server refuses,
/// a directory the user may not write (the daemon exits 1 at start), and a server down at
/// start, which the daemon reports and keeps retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_bad_input_is_named() {
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("sftp-bad");
    let db = dir.join("app.db");
    let _w = Writer::open(&db, 1);
    let out = dir.join("out.db");
    let base = sshd.replica_yaml("bad", sshd.port, 6);
    let without = |key: &str| {
        base.lines()
            .filter(|l| !l.trim_start().starts_with(key))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let one_line_error = |name: &str, replica: &str, wants: &[&str]| {
        let cfg = config(dir.path(), &format!("{name}.yml"), &db, "", replica);
        let o = restore(dir.path(), &cfg, &out, &db);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: one line:\n{err}");
        assert!(
            err.contains(&format!("sftp://{}@127.0.0.1:{}", sshd.user, sshd.port)),
            "{name}: names the replica:\n{err}"
        );
        for w in wants {
            assert!(err.contains(w), "{name}: wants {w:?}:\n{err}");
        }
        err
    };

    // No host-key and an empty known_hosts (HOME is the test directory).
    one_line_error(
        "unknown-host",
        &without("host-key"),
        &[
            "host key of 127.0.0.1:",
            "is unknown",
            "ssh-keyscan -p",
            "host-key:",
        ],
    );
    // A known_hosts naming another key for this server.
    let other = TestDir::new("sftp-bad-other-key");
    let other_key = other.join("k");
    Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", common::s(&other_key)])
        .status()
        .unwrap();
    let other_pub = std::fs::read_to_string(other.join("k.pub")).unwrap();
    let other_pub: Vec<&str> = other_pub.split_whitespace().take(2).collect();
    let kh = dir.join("known_hosts");
    std::fs::write(
        &kh,
        format!("[127.0.0.1]:{} {}\n", sshd.port, other_pub.join(" ")),
    )
    .unwrap();
    one_line_error(
        "changed-host",
        &format!(
            "{}      known-hosts-path: {}\n",
            without("host-key"),
            kh.display()
        ),
        &["HOST KEY CHANGED", "line 1"],
    );
    one_line_error(
        "wrong-host-key",
        &format!(
            "{}      host-key: {}\n",
            without("host-key"),
            other_pub.join(" ")
        ),
        &["does not match `host-key`"],
    );
    // A key the server does not know.
    one_line_error(
        "refused-key",
        &format!(
            "{}      key-path: {}\n",
            without("key-path"),
            other_key.display()
        ),
        &["refused the key", "authorized_keys"],
    );
    // A directory no one may write (sysfs refuses even root).
    let denied = base.replace(
        &format!("path: {}/bad", sshd.root.display()),
        "path: /sys/replicad-test",
    );
    let cfg = config(dir.path(), "denied.yml", &db, "", &denied);
    let mut d = spawn(
        dir.path(),
        &["replicate", "--config", common::s(&cfg)],
        "denied.log",
    );
    // A permanent refusal at start is a configuration error: the daemon says so and exits.
    let st = common::wait_timeout(&mut d, Duration::from_secs(60)).expect("exit");
    let log = std::fs::read_to_string(dir.join("denied.log")).unwrap();
    assert_eq!(st.code(), Some(1), "denied: {log}");
    let error: Vec<&str> = log.lines().filter(|l| l.starts_with("error:")).collect();
    assert!(
        error.len() == 1
            && error[0].contains("sftp://")
            && error[0].contains("permission denied; hint: user"),
        "denied: {log}"
    );

    // The server down at start: the daemon runs, says so, and keeps trying.
    let closed = common::http::free_port();
    let down = sshd.replica_yaml("down", closed, 6);
    let cfg = config(dir.path(), "down.yml", &db, "", &down);
    let mut d = spawn(
        dir.path(),
        &["replicate", "--config", common::s(&cfg)],
        "down.log",
    );
    common::wait_log(
        &dir.join("down.log"),
        &format!("cannot reach 127.0.0.1:{closed}"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        d.try_wait().unwrap().is_none(),
        "the daemon exited with its replica down"
    );
    common::sigterm(&d);
    let st = common::wait_timeout(&mut d, Duration::from_secs(60)).expect("stop");
    assert_eq!(st.code(), Some(1), "exit code with an unprotected database");
}

/// Password login (the `password` key, no key file): a replica is written and read back; a
/// wrong password is refused by name, and the password never appears in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_password_login() {
    use replicad::storage::s3::Secret;
    use replicad::storage::sftp::{HostKeyCheck, SftpClient, SftpConfig};
    let Some(sshd) = Sshd::start() else { return };
    let Some((user, password, dir, _keep)) = sshd.password_user() else {
        return;
    };
    let client = |password: &str| {
        let mut cfg = SftpConfig::new("127.0.0.1", sshd.port, &user, common::s(&dir));
        cfg.password = Some(Secret(password.into()));
        cfg.host_key = HostKeyCheck::Key(sshd.host_key.clone());
        AnyClient::Sftp(SftpClient::new(cfg))
    };
    let good = client(&password);
    good.write_aux("replicad.lease", b"by password".to_vec())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sshd.log()));
    assert_eq!(
        good.read_aux("replicad.lease").await.unwrap().as_deref(),
        Some(&b"by password"[..])
    );
    assert!(
        dir.join("replicad.lease").exists(),
        "written where configured"
    );
    let err = client("not-the-password-42")
        .read_aux("replicad.lease")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        !err.is_retryable(),
        "a refused password is permanent: {text}"
    );
    assert!(
        text.contains(&format!("refused the password for user `{user}`"))
            && !text.contains("not-the-password-42"),
        "{text}"
    );
}

/// A server with two host keys (Ed25519 and ECDSA) and a known_hosts file that records only
/// the ECDSA one: replicad asks for the recorded type, as OpenSSH does, and connects; with
/// `host-key` set to the ECDSA key as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_asks_for_the_host_key_type_it_knows() {
    use replicad::storage::sftp::{HostKeyCheck, SftpClient};
    let Some(sshd) = Sshd::start() else { return };
    let dir = TestDir::new("sftp-keytype");
    let kh = dir.join("known_hosts");
    std::fs::write(
        &kh,
        format!("[127.0.0.1]:{} {}\n", sshd.port, sshd.host_key_ecdsa),
    )
    .unwrap();
    for check in [
        HostKeyCheck::KnownHosts(Some(kh.clone())),
        HostKeyCheck::Key(sshd.host_key_ecdsa.clone()),
    ] {
        let mut cfg = sshd.config("keytype");
        cfg.host_key = check.clone();
        let c = AnyClient::Sftp(SftpClient::new(cfg));
        c.write_aux("replicad.lease", b"x".to_vec())
            .await
            .unwrap_or_else(|e| panic!("{check:?}: {e}"));
    }
}

/// A lease write under way on SFTP (its `replicad.lease.<pid>-<random>.tmp` beside the lease,
/// between the remove of the old one and the rename) is seen by one listing: a lease missing
/// then is read again before it counts as free. Other temporary files do not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_write_under_way_is_seen_on_sftp() {
    let Some(sshd) = Sshd::start() else { return };
    let client = sshd.client("inflight");
    let root = sshd.root.join("inflight");
    assert!(
        !client.aux_write_in_flight("replicad.lease").await.unwrap(),
        "no directory yet"
    );
    std::fs::create_dir_all(root.join("ltx/0")).unwrap();
    std::fs::write(
        root.join("ltx/0/0000000000000001-0000000000000001.ltx.1.2.tmp"),
        b"x",
    )
    .unwrap();
    std::fs::write(root.join("other.1-2.tmp"), b"x").unwrap();
    assert!(!client.aux_write_in_flight("replicad.lease").await.unwrap());
    std::fs::write(root.join("replicad.lease.77-00000000000000ff.tmp"), b"{}").unwrap();
    assert!(client.aux_write_in_flight("replicad.lease").await.unwrap());
}
