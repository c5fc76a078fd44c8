//! Google Cloud Storage and Azure Blob Storage replicas: Litestream's keys, the URL forms,
//! keys of other backends refused, destinations and secrets.

use super::*;
use crate::storage::object::{ObjectConfig, Service};

#[test]
fn gs_replica_by_keys_and_by_url() {
    let c = parse(
        "dbs:\n  - path: /data/a.db\n    replica:\n      type: gs\n      bucket: my-bucket\n      path: /backups/a/\n",
    )
    .unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(
        (r.name.as_str(), r.url.as_str()),
        ("gs", "gs://my-bucket/backups/a")
    );
    assert_eq!(
        r.object.as_ref(),
        Some(&ObjectConfig::new(Service::Gcs, "my-bucket", "backups/a"))
    );
    assert!(matches!(r.client(), Ok(AnyClient::Object(_))));

    let c = parse(
        "dbs:\n  - path: /data/a.db\n    replica:\n      url: gs://my-bucket/backups/a?endpoint=http://127.0.0.1:4443\n",
    )
    .unwrap();
    let o = c.dbs[0].replicas[0].object.clone().unwrap();
    assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:4443"));
    assert_eq!(c.dbs[0].replicas[0].url, "gs://my-bucket/backups/a");
}

#[test]
fn abs_replica_with_litestreams_keys() {
    let text = "dbs:
  - path: /data/a.db
    replica:
      type: abs
      account-name: acct
      bucket: cont
      path: app
      account-key: c2VjcmV0LWFjY291bnQta2V5
      endpoint: http://127.0.0.1:10000/acct
";
    let c = parse(text).unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(
        (r.name.as_str(), r.url.as_str()),
        ("abs", "abs://acct@cont/app")
    );
    let o = r.object.clone().unwrap();
    assert_eq!(o.service, Service::Azure);
    assert_eq!(o.account_name.as_deref(), Some("acct"));
    assert_eq!(
        o.account_key.as_ref().map(|k| k.0.as_str()),
        Some("c2VjcmV0LWFjY291bnQta2V5")
    );
    assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:10000/acct"));
    let shown = format!("{c:?}");
    assert!(!shown.contains("c2VjcmV0LWFjY291bnQta2V5"), "{shown}");
    // The secret key is skipped by commands that never contact the replica.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("replicad.yml");
    std::fs::write(&file, text).unwrap();
    let c = Config::load_without_credentials(&file, false).unwrap();
    assert_eq!(
        c.dbs[0].replicas[0].object.as_ref().unwrap().account_key,
        None
    );

    // The URL form names the account and the container; a SAS token as a key.
    let c = parse(
        "dbs:\n  - path: /data/a.db\n    replica:\n      url: abs://acct@cont/app\n      sas-token: sv=2024&sig=abc\n",
    )
    .unwrap();
    let o = c.dbs[0].replicas[0].object.clone().unwrap();
    assert_eq!((o.bucket.as_str(), o.path.as_str()), ("cont", "app"));
    assert_eq!(o.sas_token.map(|t| t.0), Some("sv=2024&sig=abc".into()));
}

#[test]
fn keys_of_other_backends_are_refused() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: gs\n      bucket: b\n      region: eu\n",
        4,
        &["key `region` applies only to s3 replicas, not to a gs replica"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      account-name: a\n",
        4,
        &["key `account-name` applies only to abs replicas"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: abs\n      bucket: b\n",
        4,
        &["an abs replica needs `account-name`"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: gs\n      path: x\n",
        4,
        &["missing key `bucket`"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: gs://b/x\n      bucket: c\n",
        4,
        &["keys `url` and `bucket` are mutually exclusive"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: abs://cont/x\n",
        4,
        &["abs://ACCOUNT@CONTAINER/PATH"],
    );
}

#[test]
fn two_databases_on_one_gs_path_are_refused() {
    let (_, msg) = fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: gs://b/x\n  - path: /b.db\n    replica:\n      type: gs\n      bucket: b\n      path: x\n",
    );
    assert!(msg.contains("used by two databases"), "{msg}");
}
