use super::load::expand_vars;
use super::url::{absolutize, file_url};
use super::yaml::{DB_KEYS, LEVEL_KEYS, REPLICA_KEYS, RETENTION_KEYS, ROOT_KEYS, SNAPSHOT_KEYS};
use super::*;

/// Parses `text` (no env expansion) from a fake file.
fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "/etc/replicad.yml", false)
}

/// The line and the rendered message of a rejected config.
fn fail(text: &str) -> (Option<usize>, String) {
    match parse(text) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => {
            let ConfigError::Invalid { line, .. } = &e else {
                panic!("unexpected error {e:?}")
            };
            (*line, e.to_string())
        }
    }
}

/// Asserts an error at `line` whose message contains every part of `parts`.
#[track_caller]
fn assert_fail(text: &str, line: usize, parts: &[&str]) {
    let (l, msg) = fail(text);
    assert_eq!(l, Some(line), "wrong line in: {msg}");
    assert!(
        msg.starts_with(&format!("config /etc/replicad.yml: line {line}: ")),
        "bad prefix: {msg}"
    );
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not contain {p:?}");
    }
}

fn cwd() -> PathBuf {
    std::env::current_dir().unwrap()
}

const MINIMAL: &str = "dbs:\n  - path: /data/a.db\n    replica:\n      url: file:///backup/a\n";

#[test]
fn lease_ttl_is_a_setting_of_at_least_one_second() {
    let c = parse(&format!("lease-ttl: 2s\n{MINIMAL}    lease-ttl: 90s\n")).unwrap();
    assert_eq!(c.dbs[0].settings.lease_ttl, Duration::from_secs(90));
    let c = parse(&format!("lease-ttl: 2s\n{MINIMAL}")).unwrap();
    assert_eq!(c.dbs[0].settings.lease_ttl, Duration::from_secs(2));
    assert_eq!(
        parse(MINIMAL).unwrap().dbs[0].settings.lease_ttl,
        DEFAULT_LEASE_TTL
    );
    assert_fail(
        &format!("lease-ttl: 500ms\n{MINIMAL}"),
        1,
        &["must be at least 1s", "key `lease-ttl`"],
    );
}

#[test]
fn defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.shutdown_sync_timeout, Duration::from_secs(30));
    assert_eq!(c.dbs.len(), 1);
    let db = &c.dbs[0];
    assert_eq!(db.path, PathBuf::from("/data/a.db"));
    assert_eq!(db.meta_path, None);
    assert_eq!(
        db.replicas,
        vec![ReplicaConfig {
            name: "file".into(),
            url: "file:///backup/a".into(),
            s3: None,
            age: None,
        }]
    );
    let d = DbSettings::default();
    // No key only replicad reads: a Litestream config, which writes Litestream's codec.
    assert_eq!(db.codec, CodecOrigin::LitestreamFile);
    assert_eq!(
        db.settings,
        DbSettings {
            compression: Codec::Lz4,
            ..d.clone()
        }
    );
    assert_eq!(d.monitor_interval, Duration::from_secs(1));
    assert_eq!(d.checkpoint_interval, Duration::from_secs(60));
    assert_eq!(d.min_checkpoint_page_count, 1000);
    assert_eq!(d.truncate_page_n, 121_359);
    assert_eq!(d.full_verify_interval, Duration::from_secs(60));
    assert_eq!(d.compression, Codec::Zstd(3));
    assert_eq!(d.heartbeat_interval, Duration::from_secs(60));
    assert_eq!(
        d.levels,
        vec![
            Duration::from_secs(30),
            Duration::from_secs(300),
            Duration::from_secs(3600)
        ]
    );
    assert_eq!(d.snapshot_interval, Duration::from_secs(86_400));
    assert_eq!(d.snapshot_retention, Duration::from_secs(86_400));
    assert_eq!(d.l0_retention, Duration::from_secs(300));
    assert_eq!(d.l0_retention_check_interval, Duration::from_secs(15));
    assert!(d.retention_enabled);
}

#[test]
fn settings_precedence_db_over_global_over_default() {
    let c = parse(
        "monitor-interval: 2s
checkpoint-interval: 2m
min-checkpoint-page-count: 50
truncate-page-n: 5000
full-verify-interval: 10m
compression: lz4
heartbeat-interval: 5s
shutdown-sync-timeout: 1m
dbs:
  - path: /data/a.db
    monitor-interval: 500ms
    checkpoint-interval: 0s
    min-checkpoint-page-count: 7
    truncate-page-n: 9
    full-verify-interval: 1h30m
    compression: gzip:9
    heartbeat-interval: 24h
    replica: {url: /backup/a}
  - path: /data/b.db
    compression: none
    replica: {url: /backup/b}
",
    )
    .unwrap();
    assert_eq!(c.shutdown_sync_timeout, Duration::from_secs(60));
    assert_eq!(
        c.dbs[0].settings,
        DbSettings {
            monitor_interval: Duration::from_millis(500),
            checkpoint_interval: Duration::ZERO,
            min_checkpoint_page_count: 7,
            truncate_page_n: 9,
            full_verify_interval: Duration::from_secs(5400),
            compression: Codec::Gzip(9),
            heartbeat_interval: Duration::from_secs(86_400),
            ..DbSettings::default()
        }
    );
    assert_eq!(
        c.dbs[1].settings,
        DbSettings {
            monitor_interval: Duration::from_secs(2),
            checkpoint_interval: Duration::from_secs(120),
            min_checkpoint_page_count: 50,
            truncate_page_n: 5000,
            full_verify_interval: Duration::from_secs(600),
            compression: Codec::None,
            heartbeat_interval: Duration::from_secs(5),
            ..DbSettings::default()
        }
    );
}

#[test]
fn global_settings_may_follow_dbs() {
    let c = parse(&format!("{MINIMAL}monitor-interval: 3s\n")).unwrap();
    assert_eq!(c.dbs[0].settings.monitor_interval, Duration::from_secs(3));
}

/// Every compaction, snapshot and retention key, with values other than the defaults.
const COMPACTION_ALL_KEYS: &str = "levels:
  - interval: 10s
  - interval: 1m30s
snapshot:
  interval: 6h
  retention: 168h
l0-retention: 0s
l0-retention-check-interval: 1m
retention:
  enabled: false
dbs:
  - path: /data/a.db
    monitor-interval: 2s
    replica: {url: /backup/a}
  - path: /data/b.db
    replica: {url: /backup/b}
";

#[test]
fn compaction_keys_are_parsed_and_copied_to_every_database() {
    let c = parse(COMPACTION_ALL_KEYS).unwrap();
    let want = DbSettings {
        levels: vec![Duration::from_secs(10), Duration::from_secs(90)],
        snapshot_interval: Duration::from_secs(6 * 3600),
        snapshot_retention: Duration::from_secs(168 * 3600),
        l0_retention: Duration::ZERO,
        l0_retention_check_interval: Duration::from_secs(60),
        retention_enabled: false,
        compression: Codec::Lz4,
        ..DbSettings::default()
    };
    assert_eq!(
        c.dbs[0].settings,
        DbSettings {
            monitor_interval: Duration::from_secs(2),
            ..want.clone()
        }
    );
    assert_eq!(c.dbs[1].settings, want);
    // After `dbs`, in flow style, one key at a time: the others keep their defaults.
    let one = |extra: &str| {
        parse(&format!("{MINIMAL}{extra}")).unwrap().dbs[0]
            .settings
            .clone()
    };
    // Litestream's keys only: Litestream's codec.
    let d = || DbSettings {
        compression: Codec::Lz4,
        ..DbSettings::default()
    };
    assert_eq!(
            one("levels: [{interval: 1s}, {interval: 2s}, {interval: 3s}, {interval: 4s}, {interval: 5s}, {interval: 6s}, {interval: 7s}, {interval: 8s}]\n").levels,
            (1..=8).map(Duration::from_secs).collect::<Vec<_>>()
        );
    assert_eq!(
        one("levels:\n- interval: 1h\n"),
        DbSettings {
            levels: vec![Duration::from_secs(3600)],
            ..d()
        }
    );
    assert_eq!(
        one("snapshot: {interval: 1h}\n"),
        DbSettings {
            snapshot_interval: Duration::from_secs(3600),
            ..d()
        }
    );
    assert_eq!(
        one("snapshot:\n  retention: 72h\n"),
        DbSettings {
            snapshot_retention: Duration::from_secs(72 * 3600),
            ..d()
        }
    );
    assert_eq!(
        one("l0-retention: 10m\n"),
        DbSettings {
            l0_retention: Duration::from_secs(600),
            ..d()
        }
    );
    assert_eq!(
        one("l0-retention-check-interval: 500ms\n"),
        DbSettings {
            l0_retention_check_interval: Duration::from_millis(500),
            ..d()
        }
    );
    assert_eq!(
        one("retention: {enabled: true}\n"),
        DbSettings {
            retention_enabled: true,
            ..d()
        }
    );
    // A section with every key commented out (or `{}`) means the defaults, as Litestream.
    for empty in [
        "snapshot:\n#  interval: 1h\n",
        "snapshot: {}\n",
        "retention:\n",
        "retention: {}\n",
    ] {
        assert_eq!(one(empty), d(), "{empty:?}");
    }
}

#[test]
fn compaction_keys_are_top_level_only() {
    for (key, value) in [
        ("levels", "[{interval: 1s}]"),
        ("snapshot", "{interval: 1h}"),
        ("l0-retention", "5m"),
        ("l0-retention-check-interval", "15s"),
        ("retention", "{enabled: false}"),
    ] {
        assert_fail(
            &format!("dbs:\n  - path: /a.db\n    replica: {{url: /b}}\n    {key}: {value}\n"),
            4,
            &[
                &format!("key `{key}` in dbs[0] is top-level only, as in Litestream"),
                "move it to the top level",
            ],
        );
    }
    // In a replica they are unknown keys, as any other.
    assert_fail(
        &format!("{MINIMAL}      retention: 24h\n"),
        5,
        &["unknown key `retention` in dbs[0].replica (expected one of"],
    );
}

#[test]
fn levels_errors() {
    let levels = |n: usize| -> String {
        (0..n)
            .map(|i| format!("  - interval: {}s\n", i + 1))
            .collect()
    };
    // Empty: `[]`, or no value at all (every level commented out).
    assert_fail(
        &format!("{MINIMAL}levels: []\n"),
        5,
        &[
            "`levels` is empty: give at least one compaction level",
            "remove the key",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n#  - interval: 30s\nmonitor-interval: 1s\n"),
        5,
        &["`levels` is empty"],
    );
    // Eight levels are fine; the ninth is refused at its line.
    assert_eq!(
        parse(&format!("{MINIMAL}levels:\n{}", levels(8)))
            .unwrap()
            .dbs[0]
            .settings
            .levels
            .len(),
        8
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n{}", levels(10)),
        14,
        &[
            "too many levels (levels[8])",
            "at most 8 compaction levels (L1..L8; level 9 is the snapshot level",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n{}  - interval: 0s\n", levels(2)),
        8,
        &["must be greater than zero (key `interval` in levels[2])"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: 30\n"),
        6,
        &[
            "30 is a bare number: add a unit",
            "(key `interval` in levels[0])",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: soon\n"),
        6,
        &["invalid duration \"soon\"", "(key `interval` in levels[0])"],
    );
    // Unknown, duplicate and missing keys in an entry.
    assert_fail(
        &format!("{MINIMAL}levels:\n  - level: 1\n    interval: 30s\n"),
        6,
        &["unknown key `level` in levels[0] (expected one of `interval`)"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: 30s\n  - interval: 1m\n    interval: 2m\n"),
        8,
        &["duplicate key `interval` in levels[1]"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: 30s\n  - {{}}\n"),
        7,
        &["missing key `interval` in levels[1]"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: 30s\n  -\n"),
        7,
        &["missing key `interval` in levels[1]"],
    );
    // Bad types.
    assert_fail(
        &format!("{MINIMAL}levels:\n  - 30s\n"),
        6,
        &[
            "`levels[0]` takes a map with the key `interval`, found \"30s\" (write `- interval: 30s`)",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - [30s]\n"),
        6,
        &["`levels[0]` takes a map with the key `interval`, found a list"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: [30s]\n"),
        6,
        &["found a list (key `interval` in levels[0])"],
    );
    assert_fail(
        &format!("{MINIMAL}levels: 30s\n"),
        5,
        &["`levels` takes a list of maps such as `- interval: 30s`, found \"30s\""],
    );
    assert_fail(
        &format!("{MINIMAL}levels: 30\n"),
        5,
        &["`levels` takes a list of maps", "found 30"],
    );
    assert_fail(
        &format!("{MINIMAL}levels:\n  interval: 30s\n"),
        6,
        &["`levels` takes a list of maps such as `- interval: 30s`, found a map"],
    );
    assert_fail(
        &format!("{MINIMAL}levels: [{{interval: 1s}}]\nlevels: [{{interval: 2s}}]\n"),
        6,
        &["duplicate key `levels` at the top level"],
    );
}

#[test]
fn snapshot_and_retention_errors() {
    for (key, line) in [("interval", 6), ("retention", 7)] {
        let other = if key == "interval" {
            "retention"
        } else {
            "interval"
        };
        let text = |value: &str| {
            if key == "interval" {
                format!("{MINIMAL}snapshot:\n  {key}: {value}\n  {other}: 1h\n")
            } else {
                format!("{MINIMAL}snapshot:\n  {other}: 1h\n  {key}: {value}\n")
            }
        };
        assert_fail(
            &text("0s"),
            line,
            &[&format!(
                "must be greater than zero (key `{key}` in snapshot)"
            )],
        );
        assert_fail(
            &text("24"),
            line,
            &["24 is a bare number", &format!("(key `{key}` in snapshot)")],
        );
        assert_fail(
            &text("true"),
            line,
            &[
                "expected a duration, found true",
                &format!("(key `{key}` in snapshot)"),
            ],
        );
    }
    assert_fail(
        &format!("{MINIMAL}snapshot:\n  interval: 1h\n  intervall: 2h\n"),
        7,
        &["unknown key `intervall` in snapshot (expected one of `interval`, `retention`)"],
    );
    assert_fail(
        &format!("{MINIMAL}snapshot:\n  interval: 1h\n  interval: 2h\n"),
        7,
        &["duplicate key `interval` in snapshot"],
    );
    assert_fail(
        &format!("{MINIMAL}snapshot: 24h\n"),
        5,
        &["`snapshot` takes a map with the keys `interval`, `retention`, found \"24h\""],
    );
    assert_fail(
        &format!("{MINIMAL}snapshot:\n  - interval: 24h\n"),
        6,
        &["`snapshot` takes a map with the keys `interval`, `retention`, found a list"],
    );
    // l0-retention: 0 is allowed (no deletion of L0 files); the check interval is not.
    assert_fail(
        &format!("{MINIMAL}l0-retention: 5\n"),
        5,
        &[
            "5 is a bare number",
            "(key `l0-retention` at the top level)",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}l0-retention: {{after: 5m}}\n"),
        5,
        &["found a map (key `l0-retention` at the top level)"],
    );
    assert_fail(
        &format!("{MINIMAL}l0-retention-check-interval: 0s\n"),
        5,
        &["must be greater than zero (key `l0-retention-check-interval` at the top level)"],
    );
    assert_fail(
        &format!("{MINIMAL}l0-retention-check-interval: often\n"),
        5,
        &[
            "invalid duration \"often\"",
            "key `l0-retention-check-interval`",
        ],
    );
    // retention.
    assert_fail(
        &format!("{MINIMAL}retention:\n  enabled: no\n"),
        6,
        &["expected true or false, found \"no\" (key `enabled` in retention)"],
    );
    assert_fail(
        &format!("{MINIMAL}retention:\n  enabled: 1\n"),
        6,
        &["expected true or false, found 1 (key `enabled` in retention)"],
    );
    assert_fail(
        &format!("{MINIMAL}retention:\n  enabled: false\n  check-interval: 1h\n"),
        7,
        &["unknown key `check-interval` in retention (expected one of `enabled`)"],
    );
    assert_fail(
        &format!("{MINIMAL}retention: 24h\n"),
        5,
        &[
            "`retention` takes a map with the key `enabled`, found \"24h\"",
            "`retention` inside `snapshot`",
        ],
    );
}

#[test]
fn single_checks_compaction_settings() {
    let urls = vec!["/b".to_string()];
    let msg = |s: DbSettings| match Config::single(PathBuf::from("/a.db"), &urls, s) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e.to_string(),
    };
    let d = DbSettings::default;
    let c = Config::single(PathBuf::from("/a.db"), &urls, d()).unwrap();
    assert_eq!(c.dbs[0].settings, d());
    assert_eq!(
        msg(DbSettings {
            levels: vec![],
            ..d()
        }),
        format!("config command line: {EMPTY_LEVELS}")
    );
    assert!(
        msg(DbSettings {
            levels: vec![Duration::from_secs(1); 9],
            ..d()
        })
        .contains("`levels` has 9 entries: at most 8 compaction levels"),
    );
    assert_eq!(
        msg(DbSettings {
            levels: vec![Duration::from_secs(1), Duration::ZERO],
            ..d()
        }),
        "config command line: levels[1] (L2): interval must be greater than zero"
    );
    for (s, key) in [
        (
            DbSettings {
                snapshot_interval: Duration::ZERO,
                ..d()
            },
            "snapshot.interval",
        ),
        (
            DbSettings {
                snapshot_retention: Duration::ZERO,
                ..d()
            },
            "snapshot.retention",
        ),
        (
            DbSettings {
                l0_retention_check_interval: Duration::ZERO,
                ..d()
            },
            "l0-retention-check-interval",
        ),
    ] {
        assert_eq!(
            msg(s),
            format!("config command line: {key} must be greater than zero")
        );
    }
    // l0_retention 0 and retention disabled are valid.
    let s = DbSettings {
        l0_retention: Duration::ZERO,
        retention_enabled: false,
        ..d()
    };
    let c = Config::single(PathBuf::from("/a.db"), &urls, s.clone()).unwrap();
    assert_eq!(c.dbs[0].settings, s);
}

#[test]
fn truncate_page_n_zero_means_not_set() {
    let c = parse(&format!("{MINIMAL}    truncate-page-n: 0\n")).unwrap();
    assert_eq!(c.dbs[0].settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
    let c = parse(&format!(
        "truncate-page-n: 5000\n{MINIMAL}    truncate-page-n: 0\n"
    ))
    .unwrap();
    assert_eq!(c.dbs[0].settings.truncate_page_n, 5000);
    let c = parse(&format!("truncate-page-n: 0\n{MINIMAL}")).unwrap();
    assert_eq!(c.dbs[0].settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
}

#[test]
fn durations_in_go_syntax() {
    for (text, want) in [
        ("500ms", Duration::from_millis(500)),
        ("10s", Duration::from_secs(10)),
        ("1m", Duration::from_secs(60)),
        ("24h", Duration::from_secs(86_400)),
        ("1h30m", Duration::from_secs(5400)),
        ("\"2s\"", Duration::from_secs(2)),
    ] {
        let c = parse(&format!("monitor-interval: {text}\n{MINIMAL}")).unwrap();
        assert_eq!(c.dbs[0].settings.monitor_interval, want, "{text}");
    }
}

#[test]
fn bare_number_duration_asks_for_a_unit() {
    assert_fail(
        &format!("{MINIMAL}    checkpoint-interval: 10\n"),
        5,
        &[
            "10 is a bare number: add a unit, e.g. `10s`",
            "key `checkpoint-interval` in dbs[0]",
        ],
    );
    assert_fail(
        &format!("shutdown-sync-timeout: 30\n{MINIMAL}"),
        1,
        &["add a unit", "key `shutdown-sync-timeout` at the top level"],
    );
}

#[test]
fn bad_durations() {
    assert_fail(
        &format!("{MINIMAL}monitor-interval: soon\n"),
        5,
        &[
            "invalid duration \"soon\"",
            "Go duration syntax",
            "key `monitor-interval`",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}monitor-interval: -1s\n"),
        5,
        &["invalid duration \"-1s\"", "key `monitor-interval`"],
    );
    assert_fail(
        &format!("{MINIMAL}    monitor-interval: 0s\n"),
        5,
        &[
            "must be greater than zero",
            "key `monitor-interval` in dbs[0]",
        ],
    );
    assert_fail(
        &format!("heartbeat-interval: 0s\n{MINIMAL}"),
        1,
        &[
            "must be greater than zero",
            "key `heartbeat-interval` at the top level",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}full-verify-interval: [1s]\n"),
        5,
        &["found a list", "key `full-verify-interval`"],
    );
}

#[test]
fn bad_numbers_and_compression() {
    assert_fail(
        &format!("{MINIMAL}    min-checkpoint-page-count: -1\n"),
        5,
        &[
            "-1 is out of range",
            "key `min-checkpoint-page-count` in dbs[0]",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}truncate-page-n: many\n"),
        5,
        &[
            "expected a whole number",
            "key `truncate-page-n` at the top level",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}compression: brotli\n"),
        5,
        &["unknown compression \"brotli\"", "key `compression`"],
    );
    assert_fail(
        &format!("{MINIMAL}    compression: zstd:42\n"),
        5,
        &["must be 1..=19", "key `compression` in dbs[0]"],
    );
}

#[test]
fn replica_forms() {
    let c = parse(
        "dbs:
  - path: /data/a.db
    meta-path: /meta/a
    replicas:
      - url: file:///backup/one/
      - url: /backup/two
      - path: /backup/three
      - type: file
        path: /backup/./four//
        name: four
      - url: rel/five
  - path: data/b.db
    replica:
      type: file
      path: rel/six
",
    )
    .unwrap();
    let cwd = cwd();
    let a = &c.dbs[0];
    assert_eq!(a.meta_path, Some(PathBuf::from("/meta/a")));
    let got: Vec<(&str, &str)> = a
        .replicas
        .iter()
        .map(|r| (r.name.as_str(), r.url.as_str()))
        .collect();
    let five = format!("file://{}", cwd.join("rel/five").display());
    assert_eq!(
        got,
        vec![
            ("file", "file:///backup/one"),
            ("file-2", "file:///backup/two"),
            ("file-3", "file:///backup/three"),
            ("four", "file:///backup/four"),
            ("file-5", five.as_str()),
        ]
    );
    let b = &c.dbs[1];
    assert_eq!(b.path, cwd.join("data/b.db"));
    assert_eq!(
        b.replicas,
        vec![ReplicaConfig {
            name: "file".into(),
            url: format!("file://{}", cwd.join("rel/six").display()),
            s3: None,
            age: None,
        }]
    );
    for r in c.dbs.iter().flat_map(|d| &d.replicas) {
        AnyClient::from_url(&r.url).unwrap();
    }
}

#[test]
fn home_is_expanded_in_paths() {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return;
    };
    let home = PathBuf::from(home);
    let c = parse("dbs:\n  - path: ~/a.db\n    replica: {path: ~/backup}\n").unwrap();
    assert_eq!(c.dbs[0].path, absolutize(&home.join("a.db")).unwrap());
    assert_eq!(
        c.dbs[0].replicas[0].url,
        file_url(&absolutize(&home.join("backup")).unwrap())
    );
}

#[test]
fn unknown_keys_name_the_key_and_line() {
    let (line, msg) = fail(
        "dbs:
  - path: /data/a.db
    replica:
      url: /backup/a


    retention-foo: 24h
",
    );
    assert_eq!(line, Some(7));
    assert!(
            msg.starts_with(
                "config /etc/replicad.yml: line 7: unknown key `retention-foo` in dbs[0] (expected one of `path`"
            ),
            "{msg}"
        );
    assert_fail(
        &format!("# comment\nmcp-addr: \":3001\"\n{MINIMAL}"),
        2,
        &[
            "unknown key `mcp-addr` at the top level",
            "`dbs`",
            "`shutdown-sync-timeout`",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}      acess-key-id: x\n"),
        5,
        &[
            "unknown key `acess-key-id` in dbs[0].replica",
            "`url`",
            "`access-key-id`",
            "`skip-verify`",
        ],
    );
    // Keys that belong elsewhere are unknown too, but for top-level keys in a database.
    assert_fail(
        &format!("{MINIMAL}      shutdown-sync-timeout: 1s\n"),
        5,
        &["unknown key `shutdown-sync-timeout` in dbs[0].replica"],
    );
    assert_fail(
        &format!("{MINIMAL}    shutdown-sync-timeout: 1s\n"),
        5,
        &["key `shutdown-sync-timeout` in dbs[0] is top-level only"],
    );
    // Flow style: still the right line.
    assert_fail(
        "dbs: [{path: /a.db, replica: {url: /b}},\n  {path: /c.db, replica: {url: /d, sync-interval: 1s}}]\n",
        2,
        &["unknown key `sync-interval` in dbs[1].replica"],
    );
}

#[test]
fn duplicate_keys() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    path: /b.db\n    replica: {url: /b}\n",
        3,
        &["duplicate key `path` in dbs[0]"],
    );
    assert_fail(
        &format!("{MINIMAL}monitor-interval: 1s\nmonitor-interval: 2s\n"),
        6,
        &["duplicate key `monitor-interval` at the top level"],
    );
}

#[test]
fn unsupported_replica_types() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica: {type: sftp, path: /x}\n",
        3,
        &["replica type sftp is not supported yet (key `type` in dbs[0].replica)"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      name: gcs\n      url: gs://bucket/db\n",
        5,
        &["replica type gs is not supported yet (key `url` in dbs[0].replica)"],
    );
}

#[test]
fn replica_url_and_path_rules() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n        path: /c\n",
        4,
        &["keys `url` and `path` are mutually exclusive in dbs[0].replicas[0]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - name: x\n",
        5,
        &["missing key `url` or `path` in dbs[0].replicas[1]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      url: file://relative/x\n",
        4,
        &[
            "must be absolute (file:///path)",
            "key `url` in dbs[0].replica",
        ],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      path: \"\"\n",
        4,
        &["the value is empty (key `path` in dbs[0].replica)"],
    );
}

#[test]
fn databases_need_dbs_path_and_replicas() {
    assert_fail(
        "dbs: []\n",
        1,
        &["`dbs` is empty: configure at least one database"],
    );
    assert_fail("\n\ndbs:\n", 3, &["`dbs` is empty"]);
    assert_fail(
        "# nothing but\nmonitor-interval: 1s\n",
        2,
        &["missing key `dbs`: configure at least one database"],
    );
    let (_, msg) = fail("");
    assert!(msg.contains("configure at least one database"), "{msg}");
    let (_, msg) = fail("# only a comment\n");
    assert!(msg.contains("configure at least one database"), "{msg}");
    assert_fail(
        "dbs:\n  - replica: {url: /b}\n",
        2,
        &["missing key `path` in dbs[0]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    monitor-interval: 1s\n",
        2,
        &["dbs[0] (/a.db) has no replica: add `replica` (one map) or `replicas` (a list)"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas: []\n",
        3,
        &["`replicas` is empty in dbs[0]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n",
        3,
        &["`replicas` is empty in dbs[0]"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas: {url: /b}\n",
        3,
        &["`replicas` takes a list (`- url: ...`); use `replica` for a single map (in dbs[0])"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      - url: /b\n",
        4,
        &["`replica` takes one map; use `replicas` for a list (in dbs[0])"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica: {url: /b}\n    replicas:\n      - url: /c\n",
        2,
        &["keys `replica` and `replicas` are mutually exclusive in dbs[0]"],
    );
}

#[test]
fn duplicate_database_paths() {
    assert_fail(
        "dbs:
  - path: /data/a.db
    replica: {url: /b1}
  - path: /data/./a.db
    replica: {url: /b2}
",
        4,
        &["database /data/a.db is configured twice: dbs[0] and dbs[1] (key `path` in dbs[1])"],
    );
    assert_fail(
        "dbs:
  - path: /data/a.db
    meta-path: /meta
    replica: {url: /b1}
  - path: /data/b.db
    meta-path: /meta/
    replica: {url: /b2}
",
        6,
        &["meta-path /meta is used by two databases: dbs[0] (/data/a.db) and dbs[1]"],
    );
}

#[test]
fn replica_destination_shared_by_two_databases() {
    assert_fail(
        "dbs:
  - path: /data/a.db
    replicas:
      - url: file:///backup/x
  - path: /data/b.db
    replicas:
      - url: /backup/y
      - path: /backup/x/
",
        8,
        &[
            "replica path /backup/x is used by two databases: dbs[0] (/data/a.db) and dbs[1] (/data/b.db)",
            "dbs[1].replicas[1]",
        ],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - url: /b\n      - url: file:///b\n",
        5,
        &["replica path /b is used twice by dbs[0] (/a.db)"],
    );
}

#[test]
fn replica_names_are_unique_within_a_database() {
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - {url: /b, name: x}\n      - {url: /c, name: x}\n",
        2,
        &["replica name `x` is used twice in dbs[0]", "key `name`"],
    );
    // An explicit name may collide with a default one.
    assert_fail(
        "dbs:\n  - path: /a.db\n    replicas:\n      - {url: /b, name: file-2}\n      - {url: /c}\n",
        2,
        &["replica name `file-2` is used twice in dbs[0]"],
    );
    // The same names in two databases are fine.
    let c = parse(
        "dbs:\n  - path: /a.db\n    replica: {url: /b}\n  - path: /c.db\n    replica: {url: /d}\n",
    )
    .unwrap();
    assert_eq!(c.dbs[0].replicas[0].name, c.dbs[1].replicas[0].name);
}

#[test]
fn yaml_syntax_errors_have_a_line() {
    let (line, msg) = fail("dbs:\n  - path: /a.db\n    replica: {url: /b\n\n");
    assert!(line.is_some(), "{msg}");
    assert!(msg.starts_with("config /etc/replicad.yml: line "), "{msg}");
    // The error's own location moves to the prefix; libyaml's context keeps its own.
    let line = line.unwrap_or_default();
    assert!(
        !msg.contains(&format!("at line {line} column")),
        "location left in the message: {msg}"
    );
    assert!(
        msg.contains("while parsing a flow mapping at line 3"),
        "{msg}"
    );
    let (line, msg) = fail("dbs:\n  - path /a.db\n");
    assert_eq!(line, Some(2), "{msg}");
    assert!(msg.contains("dbs[0]"), "{msg}");
}

#[test]
fn expand_vars_rules() {
    let lookup = |n: &str| match n {
        "A" => Some("x".to_string()),
        "DIR_1" => Some("/srv".to_string()),
        _ => None,
    };
    assert_eq!(
        expand_vars("$A ${A} $DIR_1/a ${DIR_1}b", lookup),
        "x x /srv/a /srvb"
    );
    assert_eq!(expand_vars("[$UNSET] [${UNSET}]", lookup), "[] []");
    assert_eq!(
        expand_vars("$Ab", lookup),
        "",
        "the name is as long as possible"
    );
    assert_eq!(expand_vars("${A}b", lookup), "xb");
    assert_eq!(
        expand_vars("cost $ 5, $1, ${, ${ A}, ${}, end $", lookup),
        "cost $ 5, $1, ${, ${ A}, ${}, end $"
    );
    assert_eq!(expand_vars("é$A€", lookup), "éx€");
    assert_eq!(expand_vars("$$A", lookup), "$x");
}

#[test]
fn env_expansion_on_and_off() {
    // A variable that exists with a path-safe value (the environment cannot be set safely
    // from a test).
    let Some((name, value)) = std::env::vars().find(|(k, v)| {
        !v.is_empty()
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c))
    }) else {
        return;
    };
    let text = format!(
        "dbs:\n  - path: /data/${{{name}}}/a.db\n    replica: {{url: /b/${name}/$REPLICAD_TEST_SURELY_UNSET_4711x}}\n"
    );
    let on = Config::parse(&text, "t", true).unwrap();
    assert_eq!(
        on.dbs[0].path,
        absolutize(Path::new(&format!("/data/{value}/a.db"))).unwrap()
    );
    assert_eq!(
        on.dbs[0].replicas[0].url,
        file_url(&absolutize(Path::new(&format!("/b/{value}"))).unwrap())
    );
    let off = Config::parse(&text, "t", false).unwrap();
    assert_eq!(
        off.dbs[0].path,
        PathBuf::from(format!("/data/${{{name}}}/a.db"))
    );
    assert_eq!(
        off.dbs[0].replicas[0].url,
        format!("file:///b/${name}/$REPLICAD_TEST_SURELY_UNSET_4711x")
    );
}

#[test]
fn single_from_command_line() {
    let settings = DbSettings {
        monitor_interval: Duration::from_millis(250),
        truncate_page_n: 0,
        ..DbSettings::default()
    };
    let urls = vec!["file:///backup/a".to_string(), "rel/b".to_string()];
    let c = Config::single(PathBuf::from("data/x.db"), &urls, settings.clone()).unwrap();
    assert_eq!(c.shutdown_sync_timeout, DEFAULT_SHUTDOWN_SYNC_TIMEOUT);
    let db = &c.dbs[0];
    assert_eq!(db.path, cwd().join("data/x.db"));
    assert_eq!(db.meta_path, None);
    assert_eq!(db.settings.monitor_interval, Duration::from_millis(250));
    assert_eq!(db.settings.truncate_page_n, DEFAULT_TRUNCATE_PAGE_N);
    assert_eq!(
        db.replicas,
        vec![
            ReplicaConfig {
                name: "file".into(),
                url: "file:///backup/a".into(),
                s3: None,
                age: None,
            },
            ReplicaConfig {
                name: "file-2".into(),
                url: format!("file://{}", cwd().join("rel/b").display()),
                s3: None,
                age: None,
            },
        ]
    );
    assert_eq!(c.find_db(Path::new("data/x.db")), Some(db));
}

#[test]
fn single_errors() {
    let msg = |urls: &[&str], s: DbSettings| {
        let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
        match Config::single(PathBuf::from("/a.db"), &urls, s) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    };
    let d = DbSettings::default;
    assert_eq!(
        msg(&[], d()),
        "config command line: no replica URL given for /a.db"
    );
    assert_eq!(
        msg(&["sftp://host/a"], d()),
        "config command line: replica type sftp is not supported yet (replica URL \"sftp://host/a\")"
    );
    assert_eq!(
        msg(&["s3://b/a", "s3://b/a/"], d()),
        "config command line: s3 destination s3://b/a is given twice"
    );
    assert_eq!(
        msg(&["s3:///a"], d()),
        "config command line: no bucket in \"s3:///a\" (replica URL \"s3:///a\")"
    );
    // Credentials in a URL: refused, and not echoed.
    let m = msg(&["s3://AKID:hunter2secret@b/a"], d());
    assert!(
        m.contains("credentials do not belong in a replica URL"),
        "{m}"
    );
    assert!(m.contains("s3://<redacted>@b/a"), "{m}");
    assert!(!m.contains("hunter2secret") && !m.contains("AKID"), "{m}");
    assert!(msg(&["file://rel"], d()).contains("must be absolute"));
    assert_eq!(
        msg(&["/b", "file:///b/"], d()),
        "config command line: replica path /b is given twice"
    );
    let s = DbSettings {
        heartbeat_interval: Duration::ZERO,
        ..d()
    };
    assert_eq!(
        msg(&["/b"], s),
        "config command line: heartbeat-interval must be greater than zero"
    );
}

#[test]
fn find_db_compares_absolute_paths() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    std::fs::write(&real, b"").unwrap();
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let text = format!(
        "dbs:\n  - path: {}\n    replica: {{url: /b}}\n  - path: rel/c.db\n    replica: {{url: /c}}\n",
        real.display()
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.find_db(&real).unwrap().path, real);
    assert_eq!(
        c.find_db(&dir.path().join(".").join("real.db"))
            .unwrap()
            .path,
        real
    );
    assert_eq!(c.find_db(&link).unwrap().path, real, "symbolic link");
    assert_eq!(
        c.find_db(&cwd().join("rel/c.db")).unwrap().path,
        cwd().join("rel/c.db")
    );
    assert_eq!(
        c.find_db(Path::new("rel/./c.db")).unwrap().replicas[0].url,
        "file:///c"
    );
    assert!(c.find_db(Path::new("/nowhere.db")).is_none());
}

#[test]
fn load_reads_files_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("replicad.yml");
    std::fs::write(&path, MINIMAL).unwrap();
    assert_eq!(Config::load(&path, true).unwrap(), parse(MINIMAL).unwrap());
    std::fs::write(&path, format!("{MINIMAL}bogus: 1\n")).unwrap();
    let e = Config::load(&path, false).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "config {}: line 5: unknown key `bogus`",
            path.display()
        )),
        "{e}"
    );
    let missing = dir.path().join("missing.yml");
    let e = Config::load(&missing, true).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with(&format!("config {}: cannot read: ", missing.display())),
        "{e}"
    );
}

#[test]
fn example_file_parses() {
    let text = include_str!("../../config/replicad.yml");
    for expand in [false, true] {
        let c = Config::parse(text, "config/replicad.yml", expand).unwrap();
        assert_eq!(c.shutdown_sync_timeout, DEFAULT_SHUTDOWN_SYNC_TIMEOUT);
        assert_eq!(c.dbs.len(), 2);
        assert_eq!(c.dirs.len(), 1);
        let tenants = &c.dirs[0];
        assert_eq!(tenants.dir, PathBuf::from("/var/lib/tenants"));
        assert_eq!(
            (tenants.pattern.as_str(), tenants.recursive, tenants.watch),
            ("*.db", true, true)
        );
        assert_eq!(tenants.replicas[0].url, "file:///backup/tenants");
        let app = &c.dbs[0];
        assert_eq!(app.path, PathBuf::from("/var/lib/app/app.db"));
        assert_eq!(
            app.meta_path,
            Some(PathBuf::from("/var/lib/app/.app.db-replicad"))
        );
        assert_eq!(
            app.settings,
            DbSettings {
                checkpoint_interval: Duration::from_secs(300),
                compression: Codec::Lz4,
                ..DbSettings::default()
            }
        );
        let names: Vec<(&str, &str)> = app
            .replicas
            .iter()
            .map(|r| (r.name.as_str(), r.url.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("local", "file:///backup/app"),
                ("file-2", "file:///mnt/offsite/app"),
                ("s3-3", "s3://my-backups/app"),
            ]
        );
        assert_eq!(app.replicas[0].s3, None);
        let s3 = app.replicas[2].s3.as_ref().unwrap();
        assert_eq!(
            *s3,
            S3Config {
                bucket: "my-backups".into(),
                path: "app".into(),
                region: Some("eu-west-1".into()),
                endpoint: None,
                force_path_style: false,
                access_key_id: None,
                secret_access_key: None,
                part_size: 10 * 1024 * 1024,
                concurrency: 5,
                storage_class: Some("STANDARD_IA".into()),
                sse_kms_key_id: Some(
                    "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
                        .into()
                ),
                sse_customer_key: None,
            }
        );
        // The URL form shown in a comment is valid and means the same (but for SSE-KMS).
        let url = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("#   - url: "))
            .expect("the example shows the URL form");
        let from_url = S3Config::from_url(url).unwrap();
        assert_eq!(
            from_url,
            S3Config {
                sse_kms_key_id: None,
                ..s3.clone()
            }
        );
        let audit = &c.dbs[1];
        assert_eq!(audit.settings.monitor_interval, Duration::from_secs(5));
        assert_eq!(audit.replicas[0].url, "file:///backup/audit");
    }
    // The example documents every key the parser knows.
    for key in ROOT_KEYS.iter().chain(DB_KEYS).chain(REPLICA_KEYS) {
        assert!(text.contains(&format!("{key}:")), "example lacks `{key}`");
    }
    for (section, keys) in [
        ("levels", LEVEL_KEYS),
        ("snapshot", SNAPSHOT_KEYS),
        ("retention", RETENTION_KEYS),
    ] {
        let body = text
            .split_once(&format!("\n{section}:\n"))
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("example lacks `{section}`"));
        // The section's lines: indented, comments or list items.
        let body: String = body
            .lines()
            .take_while(|l| l.starts_with(' ') || l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches([' ', '-'])))
            .collect();
        for key in keys {
            assert!(
                body.contains(&format!("\n{key}:")) || body.starts_with(&format!("{key}:")),
                "example lacks `{key}` in `{section}`"
            );
        }
    }
}

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
    for (text, line, parts) in [
        (
            format!("socket:\n  enabled: yes please\n{MINIMAL}"),
            2,
            vec!["expected true or false", "key `enabled` in socket"],
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
