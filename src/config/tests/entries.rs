//! `dbs` entries and replicas: forms, unknown and duplicate keys, paths, `$VAR`, the
//! command line, loading files and the example file.

use super::*;

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
            object: None,
            sftp: None,
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
        "dbs:\n  - path: /a.db\n    replica: {type: oss, path: /x}\n",
        3,
        &["replica type oss is not supported yet (key `type` in dbs[0].replica)"],
    );
    assert_fail(
        "dbs:\n  - path: /a.db\n    replica:\n      name: bus\n      url: nats://host/db\n",
        5,
        &["replica type nats is not supported yet (key `url` in dbs[0].replica)"],
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
                object: None,
                sftp: None,
                age: None,
            },
            ReplicaConfig {
                name: "file-2".into(),
                url: format!("file://{}", cwd().join("rel/b").display()),
                s3: None,
                object: None,
                sftp: None,
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
        msg(&["oss://bucket/a"], d()),
        "config command line: replica type oss is not supported yet (replica URL \"oss://bucket/a\")"
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
    let text = include_str!("../../../config/replicad.yml");
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
        // Every value the example sets is the default: copying it switches nothing on.
        assert_eq!(app.settings, DbSettings::default());
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
                region: None,
                endpoint: None,
                force_path_style: false,
                access_key_id: None,
                secret_access_key: None,
                part_size: crate::storage::s3::DEFAULT_PART_SIZE,
                concurrency: crate::storage::s3::DEFAULT_CONCURRENCY,
                storage_class: None,
                sse_kms_key_id: None,
                sse_customer_key: None,
            }
        );
        // The URL form shown in a comment is valid and sets what its query says.
        let url = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("#   - url: "))
            .expect("the example shows the URL form");
        let from_url = S3Config::from_url(url).unwrap();
        assert_eq!(
            from_url,
            S3Config {
                region: Some("eu-west-1".into()),
                part_size: 10 * 1024 * 1024,
                storage_class: Some("STANDARD_IA".into()),
                ..s3.clone()
            }
        );
        let audit = &c.dbs[1];
        assert_eq!(audit.settings, DbSettings::default());
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
        // The section's lines: indented, comments or list items; a key shown commented out
        // (one that conflicts with another) is documented too.
        let body: String = body
            .lines()
            .take_while(|l| l.starts_with(' ') || l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches([' ', '-', '#'])))
            .collect();
        for key in keys {
            assert!(
                body.contains(&format!("\n{key}:")) || body.starts_with(&format!("{key}:")),
                "example lacks `{key}` in `{section}`"
            );
        }
    }
}

#[test]
fn unset_variables_are_named_outside_comments() {
    let text = "# ${IN_COMMENT}\ndbs:\n  - path: ${ROOT}/a.db # ${ALSO_COMMENT}\n    \
                replica: {path: $ROOT/r, x: \"${SET}\"}\n";
    let set = |n: &str| n == "SET";
    assert_eq!(unset_vars(text, set), ["ROOT"]);
}
