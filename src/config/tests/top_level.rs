//! Top-level keys (`addr`, `socket`, `exec`, `logging`, global replica defaults),
//! directory entries and the Litestream-compatibility codec rule.

use super::*;

#[test]
fn addr_and_max_lag() {
    use std::net::SocketAddr;
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.addr, None);
    assert_eq!(c.max_lag, DEFAULT_MAX_LAG);
    let sa = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
    for (value, want) in [
        ("\":9090\"", sa("127.0.0.1:9090")),
        ("\"9090\"", sa("127.0.0.1:9090")),
        ("9090", sa("127.0.0.1:9090")),
        ("\"0.0.0.0:9090\"", sa("0.0.0.0:9090")),
        ("\"10.1.2.3:80\"", sa("10.1.2.3:80")),
        ("\"[::]:9090\"", sa("[::]:9090")),
        ("\"[::1]:9090\"", sa("[::1]:9090")),
        ("\"localhost:9090\"", sa("127.0.0.1:9090")),
        ("\"\"", None),
        ("", None),
    ] {
        let c = parse(&format!("addr: {value}\n{MINIMAL}")).unwrap();
        assert_eq!(c.addr, want, "addr: {value}");
    }
    let c = parse(&format!("max-lag: 1m30s\n{MINIMAL}")).unwrap();
    assert_eq!(c.max_lag, Duration::from_secs(90));
    let c = parse(&format!("max-lag: 0s\n{MINIMAL}")).unwrap();
    assert_eq!(c.max_lag, Duration::ZERO);
    let c = Config::single(
        PathBuf::from("/a.db"),
        &["/b".to_string()],
        DbSettings::default(),
    )
    .unwrap();
    assert_eq!((c.addr, c.max_lag), (None, DEFAULT_MAX_LAG));

    for (text, line, parts) in [
        (
            format!("{MINIMAL}addr: \":99999\"\n"),
            5,
            vec![
                "invalid port in address \":99999\"",
                "key `addr` at the top level",
            ],
        ),
        (
            format!("addr: \"example.com:9090\"\n{MINIMAL}"),
            1,
            vec!["host \"example.com\"", "not an IP address or `localhost`"],
        ),
        (
            format!("addr: \"nonsense\"\n{MINIMAL}"),
            1,
            vec!["invalid address \"nonsense\"", "key `addr`"],
        ),
        (
            format!("addr: true\n{MINIMAL}"),
            1,
            vec!["expected an address, found true"],
        ),
        (
            format!("max-lag: 60\n{MINIMAL}"),
            1,
            vec!["add a unit", "key `max-lag` at the top level"],
        ),
        (
            format!("addr: \":1\"\naddr: \":2\"\n{MINIMAL}"),
            2,
            vec!["duplicate key `addr` at the top level"],
        ),
        (
            format!("{MINIMAL}    addr: \":9090\"\n"),
            5,
            vec!["key `addr` in dbs[0] is top-level only"],
        ),
        (
            format!("{MINIMAL}    max-lag: 1s\n"),
            5,
            vec!["key `max-lag` in dbs[0] is top-level only"],
        ),
    ] {
        assert_fail(&text, line, &parts);
    }
}

#[test]
fn socket_key() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.socket, SocketConfig::default());
    assert_eq!(c.socket.path, Path::new("/var/run/replicad.sock"));
    let c = parse(&format!(
        "socket:\n  enabled: true\n  path: /tmp/r.sock\n  permissions: \"0660\"\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        c.socket,
        SocketConfig {
            enabled: true,
            path: PathBuf::from("/tmp/r.sock"),
            permissions: 0o660,
        }
    );
    // Unquoted with a leading zero it stays text (YAML 1.2), as Litestream's files write it.
    let c = parse(&format!("socket:\n  permissions: 0640\n{MINIMAL}")).unwrap();
    assert_eq!(c.socket.permissions, 0o640);
    for (text, line, parts) in [
        (
            format!("socket:\n  enabled: yes please\n{MINIMAL}"),
            2,
            vec!["expected true or false", "key `enabled` in socket"],
        ),
        (
            format!("socket:\n  permissions: 0o640\n{MINIMAL}"),
            2,
            vec!["invalid permissions 416: write the octal mode as a quoted string"],
        ),
        (
            format!("socket:\n  permissions: 600\n{MINIMAL}"),
            2,
            vec!["invalid permissions 600", "key `permissions` in socket"],
        ),
        (
            format!("socket:\n  permissions: \"0999\"\n{MINIMAL}"),
            2,
            vec!["invalid permissions", "key `permissions` in socket"],
        ),
        (format!("socket:\n  bogus: 1\n{MINIMAL}"), 2, vec!["bogus"]),
        (
            format!("socket: true\n{MINIMAL}"),
            1,
            vec!["`socket` takes a map"],
        ),
        (
            format!("{MINIMAL}    socket: {{enabled: true}}\n"),
            5,
            vec!["key `socket` in dbs[0] is top-level only"],
        ),
    ] {
        assert_fail(&text, line, &parts);
    }
}

#[test]
fn exec_key() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.exec, None);
    let c = parse(&format!(
        "exec: \"app serve --port '8 0' a\\\\ b\"\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        c.exec,
        Some(vec![
            "app".to_string(),
            "serve".into(),
            "--port".into(),
            "8 0".into(),
            "a b".into()
        ])
    );
    assert_fail(
        &format!("{MINIMAL}exec: \"\"\n"),
        5,
        &["the value is empty", "key `exec` at the top level"],
    );
    assert_fail(
        &format!("{MINIMAL}exec: \"  \"\n"),
        5,
        &["the command is empty", "key `exec`"],
    );
    assert_fail(
        &format!("exec: \"sh -c 'x\"\n{MINIMAL}"),
        1,
        &["invalid command", "key `exec` at the top level"],
    );
    assert_fail(
        &format!("exec: [a, b]\n{MINIMAL}"),
        1,
        &["found a list", "key `exec`"],
    );
    assert_fail(
        &format!("{MINIMAL}    exec: app\n"),
        5,
        &["key `exec` in dbs[0] is top-level only"],
    );
}

#[test]
fn logging_key() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.logging, LoggingConfig::default());
    assert_eq!(c.logging.format, LogFormat::Text);
    let c = parse(&format!(
        "logging:\n  level: DEBUG\n  type: json\n  stderr: true\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        c.logging,
        LoggingConfig {
            level: Some("debug".into()),
            format: LogFormat::Json,
            stderr: true,
        }
    );
    let c = parse(&format!("logging: {{type: pretty}}\n{MINIMAL}")).unwrap();
    assert_eq!(c.logging.format, LogFormat::Text);
    assert_eq!(c.logging.level, None);
    // Every sub-key commented out: the defaults.
    let c = parse(&format!("logging:\n  # level: info\n{MINIMAL}")).unwrap();
    assert_eq!(c.logging, LoggingConfig::default());
    assert_fail(
        &format!("{MINIMAL}logging:\n  level: info\n  type: xml\n"),
        7,
        &["invalid log type \"xml\"", "key `type` in logging"],
    );
    assert_fail(
        &format!("logging:\n  level: loud\n{MINIMAL}"),
        2,
        &["invalid log level \"loud\"", "key `level` in logging"],
    );
    assert_fail(
        &format!("logging:\n  stderr: yes please\n{MINIMAL}"),
        2,
        &["expected true or false", "key `stderr` in logging"],
    );
    assert_fail(
        &format!("logging:\n  source: true\n{MINIMAL}"),
        2,
        &["unknown key `source` in logging", "`level`"],
    );
    assert_fail(
        &format!("logging:\n  type: json\n  type: text\n{MINIMAL}"),
        3,
        &["duplicate key `type` in logging"],
    );
    assert_fail(
        &format!("logging: json\n{MINIMAL}"),
        1,
        &["`logging` takes a map"],
    );
    assert_fail(
        &format!("{MINIMAL}    logging:\n      type: json\n"),
        5,
        &["key `logging` in dbs[0] is top-level only"],
    );
}

#[test]
fn global_replica_defaults() {
    const SECRET: &str = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY";
    const SSE_C: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    // Top-level keys after `dbs` count as much as before it.
    let text = format!(
        "access-key-id: AKID
secret-access-key: {SECRET}
region: eu-west-1
endpoint: http://127.0.0.1:9000
dbs:
  - path: /a.db
    replicas:
      - type: s3
        path: a
      - type: s3
        bucket: own
        path: b
        region: us-east-1
        force-path-style: false
        access-key-id: OWN
        secret-access-key: ownsecret
        part-size: 10MiB
        concurrency: 2
        storage-class: GLACIER
        sse-customer-key: {SSE_C}
      - path: /backup/a
      - url: s3://u/c?region=ap-south-1
bucket: global
part-size: 6MiB
concurrency: 3
storage-class: STANDARD_IA
sse-kms-key-id: kms
skip-verify: false
"
    );
    let c = parse(&text).unwrap();
    let r = &c.dbs[0].replicas;
    let g = r[0].s3.as_ref().unwrap();
    assert_eq!((g.bucket.as_str(), g.path.as_str()), ("global", "a"));
    assert_eq!(g.region.as_deref(), Some("eu-west-1"));
    assert_eq!(g.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert!(g.force_path_style, "endpoint set: path style by default");
    assert_eq!(g.access_key_id.as_deref(), Some("AKID"));
    assert_eq!(g.secret_access_key, Some(Secret(SECRET.into())));
    assert_eq!((g.part_size, g.concurrency), (6 * 1024 * 1024, 3));
    assert_eq!(g.storage_class.as_deref(), Some("STANDARD_IA"));
    assert_eq!(g.sse_kms_key_id.as_deref(), Some("kms"));
    assert_eq!(g.sse_customer_key, None);
    assert_eq!(r[0].url, "s3://global/a");
    // The replica's own values win; the encryption pair is not mixed.
    let o = r[1].s3.as_ref().unwrap();
    assert_eq!(o.bucket, "own");
    assert_eq!(o.region.as_deref(), Some("us-east-1"));
    assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert!(!o.force_path_style);
    assert_eq!(o.access_key_id.as_deref(), Some("OWN"));
    assert_eq!(o.secret_access_key, Some(Secret("ownsecret".into())));
    assert_eq!((o.part_size, o.concurrency), (10 * 1024 * 1024, 2));
    assert_eq!(o.storage_class.as_deref(), Some("GLACIER"));
    assert_eq!(o.sse_kms_key_id, None);
    assert_eq!(o.sse_customer_key, Some(Secret(SSE_C.into())));
    // File replicas ignore them.
    assert_eq!(
        (r[2].url.as_str(), r[2].s3.as_ref()),
        ("file:///backup/a", None)
    );
    // A URL replica keeps its URL and takes the credentials (and encryption) only.
    let u = r[3].s3.as_ref().unwrap();
    assert_eq!(u.bucket, "u");
    assert_eq!(u.region.as_deref(), Some("ap-south-1"));
    assert_eq!(u.endpoint, None);
    assert_eq!(u.access_key_id.as_deref(), Some("AKID"));
    assert_eq!(u.sse_kms_key_id.as_deref(), Some("kms"));
    assert_eq!(u.part_size, DEFAULT_PART_SIZE);
    // Debug never shows the secrets.
    let dbg = format!("{c:?}");
    assert!(!dbg.contains(SECRET) && !dbg.contains(SSE_C), "{dbg}");

    // A global bucket makes `bucket` optional on the replica; without one it is missing.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      type: s3\n      path: x\n",
        4,
        &[
            "missing key `bucket` in dbs[0].replica",
            "top-level `bucket`",
        ],
    );

    // Same validation as on a replica, at the key's line, naming the key.
    for (text, line, parts) in [
        (
            format!("part-size: 1KiB\n{MINIMAL}"),
            1,
            vec!["below S3's minimum", "key `part-size` at the top level"],
        ),
        (
            format!("{MINIMAL}concurrency: 0\n"),
            5,
            vec!["key `concurrency` at the top level"],
        ),
        (
            format!("skip-verify: true\n{MINIMAL}"),
            1,
            vec!["key `skip-verify` at the top level"],
        ),
        (
            format!("bucket: a/b\n{MINIMAL}"),
            1,
            vec!["contains `/`", "key `bucket` at the top level"],
        ),
        (
            format!("force-path-style: maybe\n{MINIMAL}"),
            1,
            vec![
                "expected true or false",
                "key `force-path-style` at the top level",
            ],
        ),
        (
            format!("region: a\nregion: b\n{MINIMAL}"),
            2,
            vec!["duplicate key `region` at the top level"],
        ),
        (
            format!("{MINIMAL}secret-access-key: 12345\n"),
            5,
            vec!["not a string", "key `secret-access-key` at the top level"],
        ),
        (
            format!("{MINIMAL}    bucket: b\n"),
            5,
            vec!["unknown key `bucket` in dbs[0]"],
        ),
    ] {
        assert_fail(&text, line, &parts);
    }
    // Rules on several keys, named; the secrets are never shown.
    for (extra, want) in [
        (
            format!("secret-access-key: {SECRET}\n"),
            "keys `access-key-id` and `secret-access-key` go together at the top level",
        ),
        (
            format!("sse-kms-key-id: k\nsse-customer-key: {SSE_C}\n"),
            "keys `sse-kms-key-id` and `sse-customer-key` are mutually exclusive at the top level",
        ),
        (
            "sse-customer-key: c2hvcnQ=\n".to_string(),
            "sse-customer-key must be 32 bytes (base64) at the top level",
        ),
    ] {
        let (line, msg) = fail(&format!("{extra}{MINIMAL}"));
        assert!(line.is_some(), "{msg}");
        assert!(msg.contains(want), "{msg}");
        assert!(!msg.contains(SECRET) && !msg.contains(SSE_C), "{msg}");
    }
}

#[test]
fn dir_entries_discover_databases() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().display().to_string();
    let c = parse(&format!(
        "dbs:\n  - dir: {d}\n    pattern: \"*.db\"\n    recursive: true\n    watch: true\n    \
             monitor-interval: 3s\n    replica:\n      url: /backup/x\n  - path: /a.db\n    \
             replica:\n      url: /backup/a\n"
    ))
    .unwrap();
    assert_eq!(c.dbs.len(), 1);
    let dir = &c.dirs[0];
    assert_eq!(dir.dir, tmp.path());
    assert_eq!(
        (dir.pattern.as_str(), dir.recursive, dir.watch),
        ("*.db", true, true)
    );
    assert_eq!(dir.settings.monitor_interval, Duration::from_secs(3));
    assert_eq!(dir.replicas[0].url, "file:///backup/x");
    let found = c.find_discovered(&tmp.path().join("s/t.db")).unwrap();
    assert_eq!(found.replicas[0].url, "file:///backup/x/s/t.db");
    assert!(c.find_discovered(&tmp.path().join("t.txt")).is_none());
    let defaults = parse(&format!(
        "dbs:\n  - dir: {d}\n    replica:\n      url: /b\n"
    ))
    .unwrap();
    let dir = &defaults.dirs[0];
    assert_eq!(
        (dir.pattern.as_str(), dir.recursive, dir.watch),
        ("*", false, false)
    );
    assert!(defaults.dbs.is_empty());
    assert!(
        defaults
            .find_discovered(&tmp.path().join("s/t.db"))
            .is_none()
    );

    assert_fail(
        &format!("dbs:\n  - path: /x.db\n    dir: {d}\n    replica: {{url: /b}}\n"),
        3,
        &["keys `path` and `dir` are mutually exclusive"],
    );
    assert_fail(
        &format!("dbs:\n  - dir: {d}\n    path: /x.db\n    replica: {{url: /b}}\n"),
        3,
        &["keys `path` and `dir` are mutually exclusive"],
    );
    assert_fail(
        &format!("dbs:\n  - dir: {d}\n    meta-path: /m\n    replica: {{url: /b}}\n"),
        3,
        &["keys `meta-path` and `dir` are mutually exclusive"],
    );
    assert!(c.check_dirs().is_ok());
    let missing = parse(&format!(
        "dbs:\n  - dir: {d}/missing\n    replica: {{url: /b}}\n"
    ))
    .unwrap();
    let e = missing.check_dirs().unwrap_err();
    assert!(
        e.contains(&format!("dir {d}/missing: ")) && e.contains("No such file"),
        "{e}"
    );
    assert_fail(
        &format!("dbs:\n  - dir: {d}\n    pattern: \"[a\"\n    replica: {{url: /b}}\n"),
        3,
        &["invalid pattern \"[a\""],
    );
    let (_, msg) = fail("dbs:\n  - path: /x.db\n    watch: true\n    replica: {url: /b}\n");
    assert!(msg.contains("key `watch` needs `dir`"), "{msg}");
}

#[test]
fn a_litestream_config_writes_lz4_unless_a_codec_is_set() {
    // Litestream's own keys only: lz4, so Litestream can still restore the replica.
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.dbs[0].settings.compression, Codec::Lz4);
    assert_eq!(c.dbs[0].codec, CodecOrigin::LitestreamFile);
    // One key only replicad reads, at any depth, makes it a replicad config: its default.
    for extra in ["max-lag: 30s\n", "dormant-after: 1m\n"] {
        let c = parse(&format!("{extra}{MINIMAL}")).unwrap();
        assert_eq!(c.dbs[0].settings.compression, Codec::Zstd(3), "{extra}");
        assert_eq!(c.dbs[0].codec, CodecOrigin::Default, "{extra}");
    }
    let c = parse(&format!("{MINIMAL}    verify-interval: 1h\n")).unwrap();
    assert_eq!(c.dbs[0].codec, CodecOrigin::Default);
    // A codec set at the top level or for the database is always honoured.
    let c = parse(&format!("compression: gzip\n{MINIMAL}")).unwrap();
    assert_eq!(c.dbs[0].settings.compression, Codec::Gzip(6));
    assert_eq!(c.dbs[0].codec, CodecOrigin::Set);
    let c = parse(&format!("{MINIMAL}    compression: zstd:3\n")).unwrap();
    assert_eq!(c.dbs[0].settings.compression, Codec::Zstd(3));
    assert_eq!(c.dbs[0].codec, CodecOrigin::Set);
    assert!(super::load::litestream_file(
        "dbs: [{path: /a.db, replica: {url: /b}}]"
    ));
    assert!(!super::load::litestream_file(
        "dbs: [{path: /a.db, replica: {url: /b, age: {recipients: [x]}}}]"
    ));
}
