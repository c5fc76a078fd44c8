use super::*;

#[test]
fn url_form_parses_like_litestream() {
    let c =
        S3Config::from_url("s3://bkt/db/app.db?endpoint=http://127.0.0.1:9000&region=eu-west-1")
            .unwrap();
    assert_eq!((c.bucket.as_str(), c.path.as_str()), ("bkt", "db/app.db"));
    assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert!(c.force_path_style, "custom endpoints default to path style");
    let c = S3Config::from_url("s3://bkt/p?forcePathStyle=false&part-size=10MiB&concurrency=2")
        .unwrap();
    assert!(!c.force_path_style);
    assert_eq!((c.part_size, c.concurrency), (10 * 1024 * 1024, 2));
    let c = S3Config::from_url("s3://b/my%20db/caf%C3%A9.db").unwrap();
    assert_eq!(c.path, "my db/café.db");
    let err = S3Config::from_url("s3://AKID:topsecret@bkt/p").unwrap_err();
    assert!(!err.contains("topsecret"), "{err}");
    for bad in [
        "s3:///p",
        "s3://b/p?part-size=1MiB",
        "s3://b/p?skip-verify=true",
        "s3://b/p?nope=1",
        "file:///x",
    ] {
        assert!(S3Config::from_url(bad).is_err(), "{bad}");
    }
}

#[test]
fn keys_follow_litestream_layout_and_secrets_never_print() {
    let c = S3Client::new(S3Config {
        bucket: "b".into(),
        path: "db".into(),
        access_key_id: Some("AKIDEXAMPLE".into()),
        secret_access_key: Some(Secret("wJalrXUtnFEMIsecret".into())),
        ..S3Config::default()
    });
    assert_eq!(
        c.key(9, TxId(1), TxId(0x4d2)),
        "db/0009/0000000000000001-00000000000004d2.ltx"
    );
    let dbg = format!("{c:?} {}", c.location());
    assert!(!dbg.contains("wJalrXUtnFEMIsecret"), "{dbg}");
}

#[test]
fn a_ranged_get_must_answer_the_range() {
    assert!(range_honoured(
        Some("bytes 100-199/1000"),
        Some(100),
        100,
        Some(200)
    ));
    assert!(range_honoured(
        Some("bytes 100-999/1000"),
        Some(900),
        100,
        None
    ));
    // Ignored: the whole object, or another range.
    assert!(!range_honoured(None, Some(1000), 100, Some(200)));
    assert!(!range_honoured(
        Some("bytes 0-999/1000"),
        Some(1000),
        100,
        None
    ));
    assert!(!range_honoured(Some("garbage"), Some(1000), 100, None));
    // From 0: a whole object within the range is the range.
    assert!(range_honoured(None, Some(50), 0, Some(200)));
    assert!(!range_honoured(None, Some(500), 0, Some(200)));
}
