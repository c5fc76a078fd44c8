//! Unit tests of the configuration reader, one file per part of the file format; the
//! helpers every part uses are here.

mod entries;
mod notify;
mod object;
mod remote;
mod s3;
mod settings;
mod top_level;

use super::load::{expand_vars, unset_vars};
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
