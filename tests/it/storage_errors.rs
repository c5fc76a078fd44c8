//! Storage errors a person can read: the common S3 failures (no credentials, an unreachable
//! endpoint, a wrong secret, a missing bucket, access denied) reach the terminal and the log
//! as one line that names the replica and the operation, says the cause in words and gives a
//! hint; the SDK's debug dump appears only at `--log-level debug`.

use crate::common;

use std::process::{Command, Output};

use common::TestDir;
use common::s3::S3Server;

/// Fragments of the SDK's debug form, which must not reach a user below `debug`.
const SDK_DEBUG: &[&str] = &[
    "DispatchFailure",
    "ConnectorError",
    "ServiceError {",
    "ProviderError(",
    "SdkBody",
    "Some(",
];

/// `replicad ARGS` with no AWS credentials anywhere in its environment (no variables, no
/// profile files, no instance metadata), plus `env`.
fn run(dir: &TestDir, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(common::bin());
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "LITESTREAM_ACCESS_KEY_ID",
        "LITESTREAM_SECRET_ACCESS_KEY",
        "RUST_LOG",
    ] {
        c.env_remove(var);
    }
    // A HOME without `.aws/` has no profile files.
    c.env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_CONFIG_FILE")
        .env_remove("AWS_SHARED_CREDENTIALS_FILE")
        .env("HOME", dir.path())
        .envs(env.iter().copied())
        .args(args);
    c.output().expect("run replicad")
}

fn with_keys<'a>(id: &'a str, secret: &'a str) -> [(&'a str, &'a str); 2] {
    [("AWS_ACCESS_KEY_ID", id), ("AWS_SECRET_ACCESS_KEY", secret)]
}

/// `restore` failed (exit 1) with exactly one line on stderr that names `replica_at` and the
/// operation, contains every fragment of `says`, gives a hint, and carries no SDK debug form.
fn assert_one_readable_line(o: &Output, replica_at: &str, says: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
    assert_eq!(o.status.code(), Some(1), "expected exit 1:\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "expected one line:\n{stderr}");
    assert!(
        stderr.starts_with("error: list "),
        "operation named:\n{stderr}"
    );
    assert!(stderr.contains(replica_at), "replica named:\n{stderr}");
    for s in says {
        assert!(stderr.contains(s), "expected {s:?} in:\n{stderr}");
    }
    assert!(stderr.contains("; hint: "), "a hint:\n{stderr}");
    for d in SDK_DEBUG {
        assert!(!stderr.contains(d), "SDK debug form {d:?} in:\n{stderr}");
    }
    stderr
}

fn restore_args<'a>(out: &'a str, url: &'a str) -> [&'a str; 4] {
    ["restore", "--to", out, url]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credentials_says_so_and_where_to_put_them() {
    let server = S3Server::start().await;
    let dir = TestDir::new("err-nocreds");
    let out = dir.join("out.db");
    let url = server.url("app");
    let o = run(&dir, &restore_args(common::s(&out), &url), &[]);
    assert_one_readable_line(
        &o,
        &format!("s3://{}/", server.bucket),
        &["no AWS credentials found", "AWS_ACCESS_KEY_ID"],
    );
    assert_eq!(server.request_count(), 0, "nothing unsigned was sent");
    assert!(!out.exists());
}

#[test]
fn an_unreachable_endpoint_is_named_with_the_reason() {
    let dir = TestDir::new("err-unreachable");
    let out = dir.join("out.db");
    let port = common::http::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let url = format!("s3://bkt/app?endpoint={endpoint}&region=us-east-1");
    let keys = with_keys("id", "secret");
    let o = run(&dir, &restore_args(common::s(&out), &url), &keys);
    assert_one_readable_line(
        &o,
        "s3://bkt/app/",
        &[
            &format!("cannot reach {endpoint}"),
            "Connection refused",
            "check the endpoint",
        ],
    );

    // The SDK's own account is there for whoever asks for it.
    let mut args = vec!["--log-level", "debug"];
    args.extend(restore_args(common::s(&out), &url));
    let o = run(&dir, &args, &keys);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("DispatchFailure") || stderr.contains("ConnectorError"),
        "at debug the SDK's error is logged in full:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_called_a_wrong_secret_in_restore_and_replicate() {
    let server = S3Server::start().await;
    let dir = TestDir::new("err-secret");
    let out = dir.join("out.db");
    let url = server.url("app");
    let keys = with_keys(&server.access_key, "not-the-secret");
    let o = run(&dir, &restore_args(common::s(&out), &url), &keys);
    assert_one_readable_line(
        &o,
        &format!("s3://{}/", server.bucket),
        &["secret access key is wrong", "AWS_SECRET_ACCESS_KEY"],
    );

    // An unknown key ID is told apart from a wrong secret.
    let keys = with_keys("NOSUCHKEYID", &server.secret_key);
    let o = run(&dir, &restore_args(common::s(&out), &url), &keys);
    assert_one_readable_line(
        &o,
        &format!("s3://{}/", server.bucket),
        &["does not know this access key ID"],
    );

    // The daemon refuses to start on it, and its log says the same in one line per event.
    let db = dir.join("app.db");
    let _ = common::Writer::open(&db, 1);
    let keys = with_keys(&server.access_key, "not-the-secret");
    let o = run(&dir, &["replicate", common::s(&db), &url], &keys);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let about: Vec<&str> = stderr.lines().filter(|l| l.contains("signature")).collect();
    assert!(!about.is_empty(), "the cause is logged:\n{stderr}");
    for l in about {
        assert!(l.contains("; hint: "), "{l}");
        assert!(l.contains(&format!("s3://{}/", server.bucket)), "{l}");
    }
    for d in SDK_DEBUG {
        assert!(!stderr.contains(d), "SDK debug form {d:?} in:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_named() {
    let server = S3Server::start().await;
    let dir = TestDir::new("err-bucket");
    let out = dir.join("out.db");
    let url = server
        .url("app")
        .replacen(&server.bucket, "no-such-bucket-here", 1);
    let keys = with_keys(&server.access_key, &server.secret_key);
    let o = run(&dir, &restore_args(common::s(&out), &url), &keys);
    assert_one_readable_line(
        &o,
        "s3://no-such-bucket-here/",
        &[
            "bucket `no-such-bucket-here` does not exist",
            "correct the bucket name",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_names_the_permissions_needed() {
    let server = S3Server::start().await;
    server.deny_access(true);
    let dir = TestDir::new("err-denied");
    let out = dir.join("out.db");
    let url = server.url("app");
    let keys = with_keys(&server.access_key, &server.secret_key);
    let o = run(&dir, &restore_args(common::s(&out), &url), &keys);
    assert_one_readable_line(
        &o,
        &format!("s3://{}/", server.bucket),
        &[
            &format!("access denied to bucket `{}`", server.bucket),
            "s3:ListBucket",
            "s3:PutObject",
        ],
    );
}
