//! Settings, compaction keys, durations and numbers.

use super::*;

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
            object: None,
            sftp: None,
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
verify-recheck-interval: 2h
replica-check-interval: 6h
min-sync-interval: 0s
shutdown-sync-timeout: 1m
dbs:
  - path: /data/a.db
    monitor-interval: 500ms
    verify-recheck-interval: 0s
    replica-check-interval: 0s
    min-sync-interval: 250ms
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
            verify_recheck_interval: Duration::ZERO,
            replica_check_interval: Duration::ZERO,
            min_sync_interval: Duration::from_millis(250),
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
            verify_recheck_interval: Duration::from_secs(7200),
            replica_check_interval: Duration::from_secs(6 * 3600),
            min_sync_interval: Duration::ZERO,
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
    // Past 100 years: such values overflowed the clocks and dates they were added to (a
    // panic in a task of the running daemon, exit 101 for a retention rule's warning).
    assert_fail(
        &format!("{MINIMAL}levels:\n  - interval: 500000000000years\n"),
        6,
        &[
            "duration \"500000000000years\" is longer than 100 years",
            "(key `interval` in levels[0])",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}snapshot:\n  retention: 1000000years\n"),
        6,
        &["is longer than 100 years", "(key `retention` in snapshot)"],
    );
    assert_fail(
        &format!("verify-interval: 101y\n{MINIMAL}"),
        1,
        &[
            "is longer than 100 years",
            "(key `verify-interval` at the top level)",
        ],
    );
    assert!(
        parse(&format!("{MINIMAL}snapshot:\n  retention: 100y\n")).is_ok(),
        "100 years is taken"
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
        &["unknown key `check-interval` in retention (expected one of `enabled`, `window`"],
    );
    assert_fail(
        &format!("{MINIMAL}retention: 24h\n"),
        5,
        &[
            "`retention` takes a map with the keys `enabled`, `window`, `hourly`, `daily`, \
             `weekly`, `monthly`, found \"24h\"",
            "`retention` inside `snapshot`",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}retention:\n  daily: -1\n"),
        6,
        &["how many restore points to keep, 0 to 3660, found -1 (key `daily` in retention)"],
    );
    assert_fail(
        &format!("{MINIMAL}retention:\n  weekly: 2w\n"),
        6,
        &["found \"2w\" (key `weekly` in retention)"],
    );
    assert_fail(
        &format!("{MINIMAL}retention:\n  window: 0s\n"),
        6,
        &["must be greater than zero (key `window` in retention)"],
    );
    for text in [
        format!("snapshot: {{retention: 24h}}\nretention: {{window: 48h}}\n{MINIMAL}"),
        format!("retention: {{window: 48h}}\nsnapshot: {{retention: 24h}}\n{MINIMAL}"),
    ] {
        let (_, msg) = fail(&text);
        assert!(msg.contains("are the same setting"), "{msg}");
    }
}

#[test]
fn calendar_retention_and_its_window() {
    let c = parse(&format!(
        "retention: {{window: 2d, hourly: 24, daily: 7, weekly: 4, monthly: 12}}\n{MINIMAL}"
    ))
    .unwrap();
    let s = &c.dbs[0].settings;
    assert_eq!(s.snapshot_retention, Duration::from_secs(2 * 86_400));
    assert_eq!(
        s.calendar,
        Calendar {
            hourly: 24,
            daily: 7,
            weekly: 4,
            monthly: 12
        }
    );
    assert!(s.retention_enabled);
    let c = parse(&format!("retention: {{daily: 30}}\n{MINIMAL}")).unwrap();
    let s = &c.dbs[0].settings;
    assert_eq!(s.calendar.daily, 30);
    assert_eq!(
        s.snapshot_retention,
        DbSettings::default().snapshot_retention
    );
    assert!(!DbSettings::default().calendar.is_set());
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
        ("7d", Duration::from_secs(7 * 86_400)),
        ("2w", Duration::from_secs(14 * 86_400)),
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
    // Past u64, YAML gives a u128: said as out of range, not as a type error.
    assert_fail(
        &format!("{MINIMAL}    dormant-max-size: 18446744073709551616\n"),
        5,
        &[
            "18446744073709551616 is out of range (at most 18446744073709551615 bytes)",
            "key `dormant-max-size` in dbs[0]",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}    dormant-max-size: 340282366920938463463374607431768211455\n"),
        5,
        &[
            "340282366920938463463374607431768211455 is out of range",
            "key `dormant-max-size` in dbs[0]",
        ],
    );
    assert_fail(
        &format!("{MINIMAL}    min-checkpoint-page-count: 18446744073709551616\n"),
        5,
        &["18446744073709551616 is out of range"],
    );
}
