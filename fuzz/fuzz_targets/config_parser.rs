//! Arbitrary text through the YAML config loader (`Config::parse`, with and without `$VAR`
//! expansion): a config or a `ConfigError`, never a panic.
//!
//! Checked on every `Ok(config)`, the rules `src/config/` promises: at least one database,
//! each with at least one replica and an absolute path, no database path twice, a client can
//! be built from every replica, no replica URL carries credentials in its authority, and every
//! error message renders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replicad::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for expand in [false, true] {
        match Config::parse(text, "fuzz.yml", expand) {
            Ok(config) => check(&config),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("config fuzz.yml: "), "{msg}");
            }
        }
    }
});

fn check(config: &Config) {
    assert!(!config.dbs.is_empty(), "a config without databases");
    for (i, db) in config.dbs.iter().enumerate() {
        assert!(db.path.is_absolute(), "dbs[{i}] path {:?}", db.path);
        assert!(!db.replicas.is_empty(), "dbs[{i}] has no replica");
        assert!(
            config.dbs[..i].iter().all(|o| o.path != db.path),
            "database {:?} twice",
            db.path
        );
        for r in &db.replicas {
            // Credentials would sit in the authority (`s3://key:secret@host/...`); an `@` in a
            // path (`file:///b@ckup/x`) is just a file name.
            let authority = r
                .url
                .split_once("://")
                .map_or("", |(_, rest)| rest.split(['/', '?']).next().unwrap_or(""));
            assert!(!authority.contains('@'), "credentials in {:?}", r.url);
            r.client()
                .unwrap_or_else(|e| panic!("accepted replica {:?} has no client: {e}", r.url));
        }
    }
}
