//! Secrets never reach a message: bad input that holds a password, an account key, a SAS
//! signature, an age identity or an expanded token is refused (exit 2) or logged without it.
//! Each case runs the real binary and reads all it printed.

use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::http::make_db;
use crate::common::s3::S3Server;
use crate::common::{TestDir, age_keygen, bin, s, spawn_replicate_env};

fn printed(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `args`; asserts the exit code, that `secret` is nowhere in what it printed and that
/// `said` is (the case failed where it was meant to, not earlier).
fn refused(args: &[&str], code: i32, secret: &str, said: &str) {
    let o = output_within(Command::new(bin()).args(args));
    let out = printed(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {out}");
    assert!(!out.contains(secret), "{args:?} printed {secret:?}: {out}");
    assert!(out.contains(said), "{args:?} did not say {said:?}: {out}");
}

/// The command's output; it must end within 30 s (a case that loads starts the daemon).
fn output_within(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd:?} still ran after 30 s: {}", printed(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_replica_url_with_credentials_or_a_signature_is_refused_without_them() {
    let dir = TestDir::new("secret-urls");
    let out = dir.join("out.db");
    let to = s(&out);
    // An Azure account key holds `/` (base64); a password may hold `?`.
    for (url, secret, said) in [
        (
            "abs://acct:Eby8vdM02x/NOcqF/K1SZFPTOtr==@container/db",
            "NOcqF",
            "credentials in a replica URL are refused",
        ),
        (
            "abs://acct@container/db?sv=2024&sig=SIGSECRET",
            "SIGSECRET",
            "unknown parameter",
        ),
        (
            "sftp://u:pa?ssWORD1@host/db",
            "ssWORD1",
            "sftp://<redacted>@host",
        ),
        (
            "webdav://u:pa?ssWORD2@host/db",
            "ssWORD2",
            "<redacted>@host",
        ),
        (
            "https://user:PWSECRET@dav/db",
            "PWSECRET",
            "unsupported replica URL scheme",
        ),
    ] {
        refused(&["restore", "--to", to, url], 2, secret, said);
    }
}

#[test]
fn a_config_value_in_the_wrong_place_is_not_echoed() {
    let dir = TestDir::new("secret-config");
    let db = dir.join("app.db");
    let cfg = dir.join("replicad.yml");
    let identity = dir.join("key.txt");
    let public = age_keygen(&identity);
    let key = fs::read_to_string(&identity).unwrap();
    let key = key.lines().last().unwrap().to_string();
    assert!(key.starts_with("AGE-SECRET-KEY-1"), "{key}");
    let age = |identities: &str| {
        format!(
            "replica:\n      path: {}\n      age:\n        recipients: [{public}]\n        \
             identities:{identities}\n",
            s(&dir.join("replica"))
        )
    };
    // Lower case is a valid identity (bech32); one changed letter makes it a bad one.
    let mut lower = key.to_ascii_lowercase();
    let last = if lower.ends_with('q') { "p" } else { "q" };
    lower.replace_range(lower.len() - 1.., last);
    let pasted = format!(
        "\n          - |\n            # created: 2026-11-29\n            # public key: {public}\n            {key}"
    );
    for (replica, secret, said) in [
        (
            "replicas: \"s3://AKID:CFGSECRET1@bucket/db\"\n".to_string(),
            "CFGSECRET1".to_string(),
            "`replicas` takes a list of maps",
        ),
        (
            "replica: s3://AKID:CFGSECRET2@bucket/db\n".into(),
            "CFGSECRET2".into(),
            "a replica is a map",
        ),
        (
            "replicas:\n      - \"s3://AKID:CFGSECRET3@bucket/db\"\n".into(),
            "CFGSECRET3".into(),
            "a replica is a map",
        ),
        (
            format!(
                "replica:\n      path: {}\n      age: {key}\n",
                s(&dir.join("r"))
            ),
            key.clone(),
            "`age` takes a map",
        ),
        (
            age(&format!(" [{lower}]")),
            lower[20..60].to_string(),
            "identities[0]",
        ),
        (age(&pasted), key[20..60].to_string(), "identities[0]"),
        // An identity where a recipient goes.
        (
            format!(
                "replica:\n      path: {}\n      age:\n        recipients: [{lower}]\n",
                s(&dir.join("replica"))
            ),
            lower[20..60].to_string(),
            "recipients[0]",
        ),
        // Credentials without a scheme where the server's URL goes.
        (
            "replica:\n      type: webdav\n      webdav-url: alice:WDSECRET@host\n      \
             path: db\n"
                .into(),
            "WDSECRET".into(),
            "webdav-url <redacted>@host",
        ),
    ] {
        fs::write(
            &cfg,
            format!("dbs:\n  - path: {}\n    {replica}", db.display()),
        )
        .unwrap();
        refused(&["replicate", "--config", s(&cfg)], 2, &secret, said);
    }
    // A database given as a string: serde's own message, its quoted value left out.
    fs::write(&cfg, "dbs:\n  - \"s3://AKID:CFGSECRET4@bucket/db\"\n").unwrap();
    refused(
        &["replicate", "--config", s(&cfg)],
        2,
        "CFGSECRET4",
        "a string",
    );
}

/// The `exec` command line comes from a config whose `${VAR}`s were expanded: its arguments
/// are not logged, nor echoed when it does not parse.
#[test]
fn an_exec_token_is_not_logged() {
    let dir = TestDir::new("secret-exec");
    let db = dir.join("app.db");
    make_db(&db);
    let cfg = dir.join("replicad.yml");
    let write = |exec: &str| {
        fs::write(
            &cfg,
            format!(
                "exec: \"{exec}\"\ndbs:\n  - path: {}\n    replica:\n      path: {}\n",
                db.display(),
                dir.join("replica").display()
            ),
        )
        .unwrap()
    };
    let run = || {
        Command::new(bin())
            .args(["replicate", "--config", s(&cfg)])
            .env("REPLICAD_TEST_TOKEN", "tok-SECRET-123")
            .output()
            .unwrap()
    };
    write("sh -c true ${REPLICAD_TEST_TOKEN}");
    let o = run();
    let out = printed(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("exec: child started"), "{out}");
    assert!(!out.contains("tok-SECRET-123"), "{out}");
    // An open quote: the command does not parse.
    write("sh -c 'true ${REPLICAD_TEST_TOKEN}");
    let o = run();
    let out = printed(&o);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains("invalid command"), "{out}");
    assert!(!out.contains("tok-SECRET-123"), "{out}");
}

/// At `--log-level trace` the S3 request signer would log each header as it is, the SSE-C
/// key among them (the key goes with object reads and writes, not with listings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_hold_no_sse_customer_key() {
    let server = S3Server::start().await;
    let dir = TestDir::new("secret-trace");
    let db = dir.join("app.db");
    make_db(&db);
    // 32 bytes, base64.
    let sse = "U1NFQ1NFQ1JFVEtFWV9JU19ISURERU5fMTIzNDU2Nzg=";
    // The level, and a RUST_LOG naming the signer's own module (a narrower directive).
    for (n, env) in [
        ("level", None),
        ("rust-log", Some("info,aws_sigv4::http_request::sign=trace")),
    ] {
        let cfg = dir.join(&format!("{n}.yml"));
        let prefix = server.key(&format!("secret-trace-{n}"));
        fs::write(
            &cfg,
            format!(
                "dbs:\n  - path: {}\n    replica:\n      type: s3\n      bucket: {}\n      \
                 path: {prefix}\n      endpoint: {}\n      region: {}\n      \
                 force-path-style: true\n      access-key-id: {}\n      \
                 secret-access-key: {}\n      sse-customer-key: {sse}\n",
                db.display(),
                server.bucket,
                server.endpoint,
                server.region,
                server.access_key,
                server.secret_key,
            ),
        )
        .unwrap();
        let env: Vec<(&str, &str)> = env.map(|v| ("RUST_LOG", v)).into_iter().collect();
        let d = spawn_replicate_env(
            dir.path(),
            &["--log-level", "trace", "--config", s(&cfg)],
            &env,
        );
        // A segment stored: its request was signed, with the key in a header.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stored = || async {
            let keys = server.list_keys(&format!("secret-trace-{n}")).await;
            keys.iter().any(|k| k.ends_with(".ltx"))
        };
        while !stored().await {
            assert!(
                Instant::now() < deadline,
                "{n}: nothing stored: {}",
                d.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = d.log_text();
        d.stop();
        if env.is_empty() {
            assert!(log.contains("PutObject"), "{n}: {log}");
        }
        for secret in [sse, server.secret_key.as_str()] {
            assert!(!log.contains(secret), "{n}: {secret:?} logged: {log}");
        }
    }
}
