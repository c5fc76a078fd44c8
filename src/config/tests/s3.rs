//! S3 replicas: every key, defaults, the URL form, errors, destinations and secrets.

use super::*;

/// Every S3 key of a replica map.
const S3_ALL_KEYS: &str = "dbs:
  - path: /data/a.db
    replicas:
      - type: s3
        name: offsite
        bucket: my-bucket
        path: /backups/a/
        region: eu-west-1
        endpoint: http://localhost:9000
        force-path-style: false
        access-key-id: AKIDEXAMPLE
        secret-access-key: wJalrXUtnFEMIsecretKEY
        part-size: 10MiB
        concurrency: 8
        storage-class: STANDARD_IA
        sse-customer-key: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=
        skip-verify: false
";

#[test]
fn s3_replica_every_key() {
    let c = parse(S3_ALL_KEYS).unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(r.name, "offsite");
    assert_eq!(r.url, "s3://my-bucket/backups/a");
    let want = S3Config {
        bucket: "my-bucket".into(),
        path: "backups/a".into(),
        region: Some("eu-west-1".into()),
        endpoint: Some("http://localhost:9000".into()),
        force_path_style: false,
        access_key_id: Some("AKIDEXAMPLE".into()),
        secret_access_key: Some(Secret("wJalrXUtnFEMIsecretKEY".into())),
        part_size: 10 * 1024 * 1024,
        concurrency: 8,
        storage_class: Some("STANDARD_IA".into()),
        sse_kms_key_id: None,
        sse_customer_key: Some(Secret(
            "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".into(),
        )),
    };
    assert_eq!(r.s3.as_ref(), Some(&want));
    match r.client().unwrap() {
        AnyClient::S3(client) => assert_eq!(client.config(), &want),
        other => panic!("expected an S3 client, got {other:?}"),
    }
    // sse-kms-key-id (exclusive with sse-customer-key) and an integer part-size.
    let c = parse(
            "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      sse-kms-key-id: alias/replicad\n      part-size: 6000000\n",
        )
        .unwrap();
    let s3 = c.dbs[0].replicas[0].s3.clone().unwrap();
    assert_eq!(s3.sse_kms_key_id.as_deref(), Some("alias/replicad"));
    assert_eq!(s3.part_size, 6_000_000);
    // File replicas have no S3 settings and a file client.
    let c = parse(MINIMAL).unwrap();
    assert!(matches!(
        c.dbs[0].replicas[0].client(),
        Ok(AnyClient::File(_))
    ));
}

#[test]
fn s3_defaults() {
    let c = parse(
        "dbs:
  - path: /data/a.db
    replicas:
      - type: s3
        bucket: b1
      - type: s3
        bucket: b2
        path: x
        endpoint: minio:9000
      - type: s3
        bucket: b3
        endpoint: http://minio:9000
        force-path-style: false
      - type: s3
        bucket: b4
        force-path-style: true
",
    )
    .unwrap();
    let r = &c.dbs[0].replicas;
    assert_eq!(
        r.iter()
            .map(|r| (r.name.as_str(), r.url.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("s3", "s3://b1"),
            ("s3-2", "s3://b2/x"),
            ("s3-3", "s3://b3"),
            ("s3-4", "s3://b4")
        ]
    );
    let s3: Vec<&S3Config> = r.iter().map(|r| r.s3.as_ref().unwrap()).collect();
    assert_eq!(
        *s3[0],
        S3Config {
            bucket: "b1".into(),
            ..S3Config::default()
        }
    );
    assert_eq!(s3[0].path, "");
    assert!(!s3[0].force_path_style, "no endpoint: virtual-hosted style");
    assert_eq!(s3[0].part_size, 5 * 1024 * 1024);
    assert_eq!(s3[0].concurrency, 5);
    assert_eq!(s3[0].region, None);
    assert_eq!(s3[0].access_key_id, None, "the AWS chain is used");
    assert_eq!(s3[0].secret_access_key, None);
    assert!(s3[1].force_path_style, "an endpoint implies path style");
    assert!(!s3[2].force_path_style, "unless said otherwise");
    assert!(s3[3].force_path_style);
}

#[test]
fn s3_url_form() {
    let c = parse(
            "dbs:
  - path: /data/a.db
    replicas:
      - url: s3://bucket/db/a?endpoint=http://localhost:9000&region=auto&part-size=8MiB&concurrency=2
        access-key-id: AKID
        secret-access-key: s3cr3t
        skip-verify: false
      - url: s3://bucket
",
        )
        .unwrap();
    let r = &c.dbs[0].replicas[0];
    assert_eq!(r.name, "s3");
    assert_eq!(r.url, "s3://bucket/db/a", "no query, no credentials");
    assert_eq!(
        r.s3,
        Some(S3Config {
            bucket: "bucket".into(),
            path: "db/a".into(),
            region: Some("auto".into()),
            endpoint: Some("http://localhost:9000".into()),
            force_path_style: true,
            access_key_id: Some("AKID".into()),
            secret_access_key: Some(Secret("s3cr3t".into())),
            part_size: 8 * 1024 * 1024,
            concurrency: 2,
            ..S3Config::default()
        })
    );
    let r = &c.dbs[0].replicas[1];
    assert_eq!((r.name.as_str(), r.url.as_str()), ("s3-2", "s3://bucket"));
    assert_eq!(r.s3.as_ref().unwrap().path, "");
    // `type: s3` with an s3 URL is fine; with a file URL it is not.
    parse("dbs:\n  - path: /a.db\n    replica: {type: s3, url: s3://b/p}\n").unwrap();
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica: {type: s3, url: /b}\n",
        3,
        &["`type: s3` does not match the URL file:///b in dbs[0].replica"],
    );
}

#[test]
fn s3_value_errors_name_the_key_and_line() {
    let s3 = |extra: &str| {
        format!("dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n{extra}")
    };
    assert_fail(
        &s3("      part-size: 10 MB please\n"),
        6,
        &["unknown size unit", "(key `part-size` in dbs[0].replica)"],
    );
    assert_fail(
        &s3("      part-size: 1MiB\n"),
        6,
        &[
            "part size 1048576 bytes is below S3's minimum of 5 MiB",
            "key `part-size`",
        ],
    );
    assert_fail(
        &s3("      part-size: 6GiB\n"),
        6,
        &["above S3's maximum of 5 GiB", "key `part-size`"],
    );
    assert_fail(
        &s3("      part-size: -5\n"),
        6,
        &["-5 is not a size in bytes", "key `part-size`"],
    );
    assert_fail(
        &s3("      skip-verify: true\n"),
        6,
        &[
            "skip-verify is not supported",
            "(key `skip-verify` in dbs[0].replica)",
        ],
    );
    assert_fail(
        &s3("      skip-verify: \"no\"\n"),
        6,
        &["expected true or false, found \"no\"", "key `skip-verify`"],
    );
    assert_fail(
        &s3("      force-path-style: 1\n"),
        6,
        &["expected true or false", "key `force-path-style`"],
    );
    assert_fail(
        &s3("      concurrency: 0\n"),
        6,
        &["must be at least 1", "key `concurrency`"],
    );
    assert_fail(
        &s3("      region: \"\"\n"),
        6,
        &["the value is empty (key `region` in dbs[0].replica)"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b/prefix\n",
        5,
        &[
            "contains `/`: give the key prefix in `path`",
            "key `bucket`",
        ],
    );
    // An `@` in a bucket would make the replica URL read `s3://user@host/...`.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: my-app-b@ckups\n      path: app\n",
        5,
        &[
            "bucket \"my-app-b@ckups\" is not a valid bucket name",
            "key `bucket`",
        ],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: s3://b%40x/p\n",
        4,
        &["is not a valid bucket name", "key `url`"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: s3://b/p?skip-verify=true\n",
        4,
        &["skip-verify is not supported", "key `url`"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: s3://b/p?part-size=1MiB\n",
        4,
        &["below S3's minimum", "key `url`"],
    );
}

#[test]
fn s3_key_rules() {
    // `url` with `bucket` or `path`, as Litestream.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: s3://b/p\n        bucket: b\n",
        4,
        &["keys `url` and `bucket` are mutually exclusive in dbs[0].replicas[0]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: s3://b/p\n        path: p\n",
        4,
        &["keys `url` and `path` are mutually exclusive in dbs[0].replicas[0]"],
    );
    // Other S3 keys go in the URL's query.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: s3://b/p\n      region: eu-west-1\n",
        4,
        &[
            "key `region` cannot be combined with `url` in dbs[0].replica",
            "s3://BUCKET/PATH?region=...",
        ],
    );
    // S3 keys on a file replica, whether the type is given, implied by the URL or the
    // default.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - url: /c\n        bucket: x\n",
        5,
        &["key `bucket` applies only to s3 replicas, not to a file replica in dbs[0].replicas[1]"],
    );
    assert_fail(
        &format!("{MINIMAL}      access-key-id: x\n"),
        4,
        &[
            "key `access-key-id` applies only to s3 replicas, not to a file replica in dbs[0].replica",
        ],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: file\n      path: /b\n      skip-verify: false\n",
        4,
        &["key `skip-verify` applies only to s3 replicas"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      bucket: b\n      path: p\n",
        4,
        &[
            "key `bucket` applies only to s3 replicas",
            "(add `type: s3`",
        ],
    );
    // The bucket is required.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      path: bucket/x\n",
        4,
        &["missing key `bucket` in dbs[0].replica", "s3://BUCKET/PATH"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: s3:///x\n",
        4,
        &["no bucket in \"s3:///x\" (key `url` in dbs[0].replica)"],
    );
    // S3Config::validate, at the replica's line.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      access-key-id: AKID\n",
        4,
        &["access-key-id and secret-access-key go together in dbs[0].replica"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      sse-customer-key: c2hvcnQ=\n",
        4,
        &["sse-customer-key must be 32 bytes (base64) in dbs[0].replica"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      sse-kms-key-id: k\n      sse-customer-key: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n",
        4,
        &["keys `sse-kms-key-id` and `sse-customer-key` are mutually exclusive"],
    );
    // Credentials in the URL are refused.
    let (line, msg) =
        fail("dbs:\n  - path: /a.db\n    replica:\n      url: s3://AKID:topsecret@b/p\n");
    assert_eq!(line, Some(4), "{msg}");
    assert!(
        msg.contains("credentials do not belong in a replica URL"),
        "{msg}"
    );
    assert!(!msg.contains("topsecret"), "{msg}");
}

#[test]
fn s3_destinations_are_endpoint_bucket_and_path() {
    assert_fail(
        "dbs:
  - path: /a.db
    replica:
      url: s3://b/x?endpoint=minio:9000
  - path: /c.db
    replica:
      type: s3
      endpoint: HTTPS://minio:9000/
      bucket: b
      path: /x/
",
        7,
        &[
            "s3 destination s3://b/x at endpoint https://minio:9000 is used by two databases: dbs[0] (/a.db) and dbs[1] (/c.db)",
        ],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: s3://b/x\n      - {type: s3, bucket: b, path: x, region: us-west-2}\n",
        5,
        &["s3 destination s3://b/x is used twice by dbs[0] (/a.db)"],
    );
    // Another endpoint, bucket or path is another destination; a file replica with the
    // same path is unrelated.
    let c = parse(
        "dbs:
  - path: /a.db
    replicas:
      - url: s3://b/x
      - url: s3://b/x?endpoint=http://localhost:9000
      - url: s3://b/y
      - url: s3://c/x
      - url: s3://b
      - path: /x
",
    )
    .unwrap();
    assert_eq!(c.dbs[0].replicas.len(), 6);
}

#[test]
fn single_accepts_s3_urls() {
    let urls = vec![
        "s3://bucket/db?endpoint=http://127.0.0.1:9000".to_string(),
        "/backup/a".to_string(),
    ];
    let c = Config::single(PathBuf::from("/a.db"), &urls, DbSettings::default()).unwrap();
    let r = &c.dbs[0].replicas;
    assert_eq!(
        (r[0].name.as_str(), r[0].url.as_str()),
        ("s3", "s3://bucket/db")
    );
    let s3 = r[0].s3.as_ref().unwrap();
    assert_eq!(s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert!(s3.force_path_style);
    assert_eq!(s3.access_key_id, None);
    assert!(matches!(r[0].client(), Ok(AnyClient::S3(_))));
    assert_eq!((r[1].name.as_str(), r[1].s3.as_ref()), ("file-2", None));
}

#[test]
fn secrets_never_appear_in_errors_or_debug() {
    const SECRET: &str = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY";
    const SSE_C: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let with = |extra: &str| {
        format!(
            "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      access-key-id: AKID\n      secret-access-key: {SECRET}\n      sse-customer-key: {SSE_C}\n{extra}"
        )
    };
    let config = parse(&with("")).unwrap();
    let dbg = format!(
        "{config:?} {:?}",
        config.dbs[0].replicas[0].client().unwrap()
    );
    assert!(!dbg.contains(SECRET) && !dbg.contains(SSE_C), "{dbg}");
    assert!(dbg.contains("<redacted>"), "{dbg}");
    for extra in [
        "      part-size: 1KiB\n",
        "      skip-verify: true\n",
        "      region: eu-west-1\n      url: s3://b/p\n",
        "      sse-kms-key-id: k\n",
        "      concurrency: 0\n",
        "      bogus: 1\n",
        "      secret-access-key: again\n",
        "    replica: {url: /x}\n",
    ] {
        let (_, msg) = fail(&with(extra));
        assert!(
            !msg.contains(SECRET) && !msg.contains(SSE_C),
            "secret in {msg:?}"
        );
    }
    // Errors on the secret itself do not echo it.
    for (value, want) in [
        ("123456789012.5", "the value is not a string: quote it"),
        ("123456789012", "the value is not a string: quote it"),
        ("0x1F2E3D", "the value is not a string: quote it"),
        ("true", "the value is not a string: quote it"),
        ("[a]", "found a list"),
    ] {
        let text = format!(
            "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      access-key-id: AKID\n      secret-access-key: {value}\n"
        );
        let (line, msg) = fail(&text);
        assert_eq!(line, Some(7), "{msg}");
        assert!(msg.contains(want), "{msg}");
        assert!(msg.contains("key `secret-access-key`"), "{msg}");
        assert!(!msg.contains(value), "secret in {msg:?}");
    }
    // A secret in the config's own error (validate) is not shown either.
    let (_, msg) = fail(&format!(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      bucket: b\n      secret-access-key: {SECRET}\n"
    ));
    assert!(msg.contains("go together"), "{msg}");
    assert!(!msg.contains(SECRET), "{msg}");
}

#[test]
fn env_expansion_of_secrets() {
    let text = "dbs:
  - path: /a.db
    replica:
      type: s3
      bucket: ${BUCKET}
      access-key-id: $KEY_ID
      secret-access-key: ${SECRET}
";
    let lookup = |name: &str| match name {
        "BUCKET" => Some("my-bucket".to_string()),
        "KEY_ID" => Some("AKID".to_string()),
        "SECRET" => Some("s3cr3t/with+chars=".to_string()),
        _ => None,
    };
    let c = Config::parse_with_env(text, "t", lookup).unwrap();
    let s3 = c.dbs[0].replicas[0].s3.as_ref().unwrap();
    assert_eq!(s3.bucket, "my-bucket");
    assert_eq!(s3.access_key_id.as_deref(), Some("AKID"));
    assert_eq!(
        s3.secret_access_key,
        Some(Secret("s3cr3t/with+chars=".into()))
    );
    // Without expansion the text is taken as it is (and `${BUCKET}` is no bucket name).
    let e = parse(text).unwrap_err().to_string();
    assert!(
        e.contains("\"${BUCKET}\" is not a valid bucket name"),
        "{e}"
    );
    let c = parse(&text.replace("${BUCKET}", "my-bucket")).unwrap();
    let s3 = c.dbs[0].replicas[0].s3.as_ref().unwrap();
    assert_eq!(s3.secret_access_key, Some(Secret("${SECRET}".into())));
    // An unset variable leaves the key empty: an error, not a silent fallback to the AWS
    // chain.
    let e = Config::parse_with_env(text, "t", |n| lookup(n).filter(|_| n != "SECRET"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 7: the value is empty (key `secret-access-key` in dbs[0].replica)"),
        "{e}"
    );
}

#[test]
fn a_shown_url_hides_its_credentials_and_query_values() {
    use crate::storage::s3::redact_url;
    for (url, shown) in [
        ("s3://b/p", "s3://b/p"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("s3://K:S@b/p", "s3://<redacted>@b/p"),
        // A password that holds `?`, `/` or `@`; an Azure key (base64) holds `/`.
        ("sftp://u:p?w@h/x", "sftp://<redacted>@h/x"),
        ("sftp://u:p@w/@h/x", "sftp://<redacted>@h/x"),
        ("abs://a:k/e/y==@c/p", "abs://<redacted>@c/p"),
        ("alice:secret@host/dav", "<redacted>@host/dav"),
        (
            "abs://c/p?sv=1&sig=S&flag",
            "abs://c/p?sv=<redacted>&sig=<redacted>&flag",
        ),
        (
            "s3://b/p?endpoint=http://h:9&region=r",
            "s3://b/p?endpoint=<redacted>&region=<redacted>",
        ),
    ] {
        assert_eq!(redact_url(url), shown, "{url}");
    }
}
