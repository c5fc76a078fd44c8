//! Client-side encryption with age, end to end with the real binary: an encrypted S3 replica
//! (in-process server) whose raw objects hide the data while a plain file replica of the same
//! database shows it; restores with the identity (config and URL forms), without it, and with
//! the wrong one; a missing recipients file at startup; `age-keygen`; and a replica switched
//! from plain to encrypted, restored before and after the switch.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::{TestDir, content_hash, integrity_ok, s, spawn_replicate, write_file};
use replicad::storage::s3::{S3Client, S3Config, Secret};
use replicad::storage::{AnyClient, ReplicaClient, SNAPSHOT_LEVEL};
use rusqlite::{Connection, params};
use tokio::io::AsyncReadExt;

const MARKER: &str = "ZEBRA-MARKER-7f3a91";

/// Runs `replicad ARGS...` with the server's credentials in the AWS variables.
fn replicad(server: Option<&S3Server>, args: &[&str]) -> Output {
    let mut c = Command::new(common::bin());
    c.args(args).env("NO_COLOR", "1");
    if let Some(server) = server {
        c.env("AWS_ACCESS_KEY_ID", &server.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &server.secret_key);
    }
    c.output().expect("run replicad")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn new_db(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);")
        .unwrap();
    conn
}

fn insert(conn: &Connection, from: i64, n: i64) {
    let tx = conn.unchecked_transaction().unwrap();
    for i in from..from + n {
        tx.execute(
            "INSERT INTO t (id, v) VALUES (?1, ?2)",
            params![i, format!("{MARKER}-{i:06}-{}", "payload ".repeat(8))],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// Every LTX file of a directory replica, plain and encrypted: (level, min, max, encrypted).
fn dir_files(replica: &Path) -> Vec<(u8, u64, u64, bool)> {
    let mut out = Vec::new();
    for level in 0..=SNAPSHOT_LEVEL {
        let Ok(rd) = std::fs::read_dir(replica.join("ltx").join(level.to_string())) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let (base, enc) = match name.strip_suffix(".age") {
                Some(b) => (b.to_string(), true),
                None => (name.clone(), false),
            };
            if let Some((min, max)) = common::parse_ltx_name(&base) {
                out.push((level, min, max, enc));
            }
        }
    }
    out.sort();
    out
}

fn dir_max(replica: &Path) -> u64 {
    dir_files(replica).iter().map(|f| f.2).max().unwrap_or(0)
}

/// Waits until `f` returns more than `than`.
fn wait_above(what: &str, mut f: impl FnMut() -> u64, than: u64) {
    let deadline = Instant::now() + common::WAIT;
    while f() <= than {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls until `f` holds a value that stays the same for 300 ms.
fn wait_stable(what: &str, mut f: impl FnMut() -> u64, min: u64) -> u64 {
    let deadline = Instant::now() + common::WAIT;
    let (mut last, mut since) = (f(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(25));
        let now = f();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        if last >= min && since.elapsed() >= Duration::from_millis(300) {
            return last;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} (at {last})"
        );
    }
}

fn raw_s3(server: &S3Server, prefix: &str) -> S3Client {
    let cfg = S3Config::from_url(&server.url(prefix)).unwrap();
    S3Client::new(S3Config {
        access_key_id: Some(server.access_key.clone()),
        secret_access_key: Some(Secret(server.secret_key.clone())),
        ..cfg
    })
}

/// Every object of the replica as stored (no decryption): (name, bytes).
async fn raw_objects(c: &S3Client) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for view in [AnyClient::S3(c.clone()), AnyClient::S3(c.sealed_view())] {
        for f in view.list_all().await.unwrap() {
            let mut body = view.open(f.level, f.min_txid, f.max_txid, 0).await.unwrap();
            let mut bytes = Vec::new();
            body.read_to_end(&mut bytes).await.unwrap();
            let name = format!(
                "{}/{:016x}-{:016x} encrypted={}",
                f.level, f.min_txid.0, f.max_txid.0, f.encrypted
            );
            out.push((name, bytes));
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn no_output_left(to: &Path) {
    let parent = to.parent().unwrap();
    let stem = to.file_name().unwrap().to_string_lossy().to_string();
    let left: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&stem))
        .collect();
    assert!(left.is_empty(), "restore left files behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_s3_replica_hides_the_data_and_restores_only_with_the_identity() {
    let server = S3Server::start().await;
    let dir = TestDir::new("age-s3");
    let db = dir.join("app.db");
    let backup = dir.join("backup");
    let identity = dir.join("key.txt");
    let public = common::age_keygen(&identity);
    let recipients = dir.join("recipients.txt");
    write_file(&recipients, &format!("# the ops team\n{public}\n"));
    let prefix = "age/app.db";
    let config = dir.join("replicad.yml");
    write_file(
        &config,
        &format!(
            "min-sync-interval: 50ms\ndbs:\n  - path: {db}\n    monitor-interval: 50ms\n    replicas:\n      - path: {backup}\n      - name: s3\n        type: s3\n        bucket: {bucket}\n        path: {path}\n        endpoint: {endpoint}\n        region: {region}\n        access-key-id: {key}\n        secret-access-key: {secret}\n        age:\n          recipients: [{recipients}]\n          identities:\n            - {identity}\n",
            db = db.display(),
            backup = backup.display(),
            bucket = server.bucket,
            path = server.key(prefix),
            endpoint = server.endpoint,
            region = server.region,
            key = server.access_key,
            secret = server.secret_key,
            recipients = recipients.display(),
            identity = identity.display(),
        ),
    );
    let conn = new_db(&db);
    insert(&conn, 0, 200);
    let daemon = spawn_replicate(dir.path(), &["--config", s(&config)]);
    wait_stable("the initial snapshot", || dir_max(&backup), 1);
    for batch in 1..4 {
        // One TXID per batch: the next batch waits for this one to ship.
        let shipped = dir_max(&backup);
        insert(&conn, batch * 200, 200);
        wait_above("the batch", || dir_max(&backup), shipped);
    }
    let txid = wait_stable("the file replica", || dir_max(&backup), 4);
    let raw = raw_s3(&server, prefix);
    let sealed = AnyClient::S3(raw.sealed_view());
    let deadline = Instant::now() + common::WAIT;
    loop {
        let files = sealed.list_all().await.unwrap();
        if files.iter().map(|f| f.max_txid.0).max() == Some(txid) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "s3 replica never reached {txid}: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.stop_ok();
    drop(conn);
    let source_hash = content_hash(&db);

    // Control: the plain file replica shows the marker, so the check below can fail.
    let plain_bytes: Vec<u8> = dir_files(&backup)
        .iter()
        .flat_map(|(l, min, max, _)| {
            std::fs::read(backup.join(format!("ltx/{l}/{min:016x}-{max:016x}.ltx"))).unwrap()
        })
        .collect();
    assert!(
        contains(&plain_bytes, MARKER.as_bytes()),
        "control: the plain replica shows no marker"
    );

    let objects = raw_objects(&raw).await;
    assert!(objects.len() >= 4, "{} objects", objects.len());
    for (name, bytes) in &objects {
        assert!(
            name.ends_with("encrypted=true"),
            "plain object on an encrypted replica: {name}"
        );
        assert!(
            bytes.starts_with(b"age-encryption.org/v1\n"),
            "{name} is not an age file"
        );
        assert!(
            !contains(bytes, b"SQLite format 3"),
            "{name} shows the SQLite header"
        );
        assert!(
            !contains(bytes, MARKER.as_bytes()),
            "{name} shows row content"
        );
        assert!(
            !contains(bytes, b"payload payload"),
            "{name} shows row content"
        );
    }
    let note = String::from_utf8(raw.get_small("age-recipients.txt").await.unwrap()).unwrap();
    assert!(note.contains(&public), "recipients note: {note}");

    // Config form: the replica's own identities.
    let out = dir.join("restored.db");
    let o = replicad(
        None,
        &[
            "restore",
            "--config",
            s(&config),
            "--replica",
            "s3",
            "--to",
            s(&out),
            s(&db),
        ],
    );
    assert!(o.status.success(), "restore --config: {}", text(&o));
    assert_eq!(content_hash(&out), source_hash);
    assert!(integrity_ok(&out));

    // URL form with --age-identity.
    let url = server.url(prefix);
    let out2 = dir.join("restored-url.db");
    let o = replicad(
        Some(&server),
        &[
            "restore",
            "--age-identity",
            s(&identity),
            "--to",
            s(&out2),
            &url,
        ],
    );
    assert!(o.status.success(), "restore --age-identity: {}", text(&o));
    assert_eq!(content_hash(&out2), source_hash);
    assert!(integrity_ok(&out2));

    // No identity: exit 1, names how to give one and the recipient; nothing written.
    let none = dir.join("none.db");
    let o = replicad(Some(&server), &["restore", "--to", s(&none), &url]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--age-identity") && err.contains(&public),
        "{err}"
    );
    no_output_left(&none);

    // A wrong identity: names the file tried; nothing written.
    let other = dir.join("other-key.txt");
    common::age_keygen(&other);
    let wrong = dir.join("wrong.db");
    let o = replicad(
        Some(&server),
        &[
            "restore",
            "--age-identity",
            s(&other),
            "--to",
            s(&wrong),
            &url,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(s(&other)) && err.contains(&public), "{err}");
    assert!(
        !err.contains("AGE-SECRET-KEY"),
        "a secret in the message: {err}"
    );
    no_output_left(&wrong);

    // The daemon logged no secret.
    let secret = std::fs::read_to_string(&identity).unwrap();
    let secret = secret.lines().last().unwrap();
    assert!(
        !common::logs(dir.path()).contains(secret),
        "the identity was logged"
    );
}

#[test]
fn missing_recipients_file_fails_at_startup_with_exit_2() {
    let dir = TestDir::new("age-missing");
    let db = dir.join("app.db");
    drop(new_db(&db));
    let identity = dir.join("key.txt");
    common::age_keygen(&identity);
    let missing = dir.join("no-such-recipients.txt");
    let config = dir.join("replicad.yml");
    write_file(
        &config,
        &format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n      age:\n        recipients:\n          - {}\n        identities: [{}]\n",
            db.display(),
            dir.join("backup").display(),
            missing.display(),
            identity.display()
        ),
    );
    let mut daemon = spawn_replicate(dir.path(), &["--config", s(&config)]);
    let status = common::wait_timeout(&mut daemon.child, common::WAIT).expect("daemon exits");
    assert_eq!(status.code(), Some(2));
    let log = daemon.log_text();
    assert!(
        log.contains("age.recipients[0]") && log.contains(s(&missing)) && log.contains("line "),
        "{log}"
    );
    assert!(!dir.join("backup").exists(), "something was replicated");
}

#[test]
fn age_keygen_writes_a_private_identity_and_refuses_to_overwrite() {
    let dir = TestDir::new("age-keygen");
    let key = dir.join("key.txt");
    let public = common::age_keygen(&key);
    let content = std::fs::read_to_string(&key).unwrap();
    let lines: Vec<&str> = content.lines().collect();
    assert!(lines[0].starts_with("# created: "), "{content}");
    assert_eq!(lines[1], format!("# public key: {public}"));
    assert!(
        lines[2].starts_with("AGE-SECRET-KEY-1") && lines.len() == 3,
        "{content}"
    );
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Refuses an existing file and leaves it unchanged.
    let o = replicad(None, &["age-keygen", "-o", s(&key)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&key).unwrap(), content);
    // A write cut short (no room for a byte: `ulimit -f 0`) leaves no file, neither under
    // the name, where a second run would refuse it as a key, nor under a temporary one.
    let cut = dir.join("cut.txt");
    let o = std::process::Command::new("sh")
        .args([
            "-c",
            "trap '' XFSZ; ulimit -f 0; exec \"$0\" age-keygen -o \"$1\"",
        ])
        .args([common::bin(), s(&cut)])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("cut.txt"))
        .collect();
    assert!(left.is_empty(), "{left:?}: {}", text(&o));
    // Without -o: the identity on stdout.
    let o = replicad(None, &["age-keygen"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("AGE-SECRET-KEY-1"));
    // Accepted by the config: public key inline and in a recipients file, identity file.
    let recipients = dir.join("recipients.txt");
    write_file(&recipients, &format!("{public}\n"));
    let config = dir.join("replicad.yml");
    write_file(
        &config,
        &format!(
            "dbs:\n  - path: {}\n    replica:\n      path: {}\n      age:\n        recipients: [{public}, {}]\n        identities: [{}]\n",
            dir.join("app.db").display(),
            dir.join("backup").display(),
            recipients.display(),
            key.display()
        ),
    );
    let o = replicad(None, &["databases", "--config", s(&config)]);
    assert!(o.status.success(), "{}", text(&o));
}

/// Restores a directory replica through its config (identities from the config).
fn restore_config(config: &Path, db: &Path, out: &Path, txid: Option<u64>) {
    let txid = txid.map(|t| format!("{t:016x}"));
    let mut args = vec!["restore", "--config", s(config), "--to", s(out)];
    if let Some(t) = &txid {
        args.extend(["--txid", t]);
    }
    args.push(s(db));
    let o = replicad(None, &args);
    assert!(o.status.success(), "restore {txid:?}: {}", text(&o));
}

#[test]
fn switching_a_replica_from_plain_to_encrypted_starts_a_chain_with_a_snapshot() {
    let dir = TestDir::new("age-switch");
    let db = dir.join("app.db");
    let backup = dir.join("backup");
    let identity = dir.join("key.txt");
    let public = common::age_keygen(&identity);
    let base = format!(
        "dbs:\n  - path: {}\n    monitor-interval: 50ms\n    replica:\n      path: {}\n",
        db.display(),
        backup.display()
    );
    let plain_cfg = dir.join("plain.yml");
    write_file(&plain_cfg, &base);
    let age_cfg = dir.join("age.yml");
    write_file(
        &age_cfg,
        &format!(
            "{base}      age:\n        recipients: [{public}]\n        identities: [{}]\n",
            identity.display()
        ),
    );

    let conn = new_db(&db);
    insert(&conn, 0, 100);
    let daemon = spawn_replicate(dir.path(), &["--config", s(&plain_cfg)]);
    wait_stable("the initial snapshot", || dir_max(&backup), 1);
    let shipped = dir_max(&backup);
    insert(&conn, 100, 50);
    wait_above("the first batch", || dir_max(&backup), shipped);
    insert(&conn, 150, 50);
    wait_stable("plain replication", || dir_max(&backup), 3);
    daemon.stop_ok();
    let before = dir_max(&backup);
    let before_copy: PathBuf = dir.join("before.db");
    {
        let c = Connection::open(&db).unwrap();
        c.execute("VACUUM INTO ?1", [s(&before_copy)]).unwrap();
    }
    let before_hash = content_hash(&before_copy);

    let daemon = spawn_replicate(dir.path(), &["--config", s(&age_cfg)]);
    wait_stable("the switch snapshot", || dir_max(&backup), before + 1);
    insert(&conn, 200, 100);
    let after = wait_stable("encrypted replication", || dir_max(&backup), before + 2);
    daemon.stop_ok();
    drop(conn);
    let log = common::logs(dir.path());
    assert!(log.contains("REPLICA ENCRYPTION CHANGED"), "{log}");
    assert!(log.contains("replica switched to age encryption"), "{log}");

    let files = dir_files(&backup);
    for (level, min, max, enc) in &files {
        assert_eq!(
            *enc,
            *min > before,
            "L{level} {min:x}-{max:x}: encrypted={enc}, switch after {before:x}"
        );
    }
    // `replicad ltx` lists both kinds and says which is which.
    let o = replicad(None, &["ltx", "--json", s(&backup)]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<(u64, bool)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let min = u64::from_str_radix(r["min_txid"].as_str().unwrap(), 16).unwrap();
            (min, r["encrypted"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(listed.len(), files.len(), "{listed:?}");
    assert!(
        listed.iter().all(|(min, enc)| *enc == (*min > before)),
        "{listed:?}"
    );

    // The first encrypted file is a full snapshot of the database.
    let first = backup.join(format!("ltx/0/{0:016x}-{0:016x}.ltx.age", before + 1));
    let keys = replicad::storage::age::keys::AgeKeys::from_identity_files(&[&identity]).unwrap();
    let mut plain = Vec::new();
    std::io::Read::read_to_end(
        &mut keys
            .decrypt(std::io::BufReader::new(
                std::fs::File::open(&first).unwrap(),
            ))
            .unwrap(),
        &mut plain,
    )
    .unwrap();
    let mut dec = replicad::ltx::Decoder::new(&plain[..]).unwrap();
    let commit = dec.header().commit;
    let mut buf = vec![0u8; dec.header().page_size as usize];
    let mut pages = Vec::new();
    while let Some(pgno) = dec.next_page(&mut buf).unwrap() {
        pages.push(pgno);
    }
    assert_eq!(
        pages,
        (1..=commit).collect::<Vec<_>>(),
        "the switch segment holds every page"
    );
    assert!(
        log.contains(&format!(
            "txid={:016x} reason=\"replica switched to age encryption\"",
            before + 1
        )),
        "{log}"
    );

    let out = dir.join("latest.db");
    restore_config(&age_cfg, &db, &out, None);
    assert_eq!(content_hash(&out), content_hash(&db));
    assert!(integrity_ok(&out));
    let out = dir.join("before-switch.db");
    restore_config(&age_cfg, &db, &out, Some(before));
    assert_eq!(content_hash(&out), before_hash);
    assert!(integrity_ok(&out));
    assert!(after > before);

    // Without the identity, the pre-switch state still restores (plain files only), the
    // latest does not.
    let url = backup.display().to_string();
    let out = dir.join("plain-only.db");
    let txid = format!("{before:016x}");
    let o = replicad(None, &["restore", "--txid", &txid, "--to", s(&out), &url]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(content_hash(&out), before_hash);
    let out = dir.join("no-key.db");
    let o = replicad(None, &["restore", "--to", s(&out), &url]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    no_output_left(&out);
}
