//! Tests for `replicad restore` against replicas written by the real Litestream go here:
//! every step of every golden scenario must restore to the exact bytes Litestream produced.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/litestream-v0.5")
}

fn replicad(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_replicad"))
        .args(args)
        .output()
        .expect("run replicad")
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(fs::read(path).unwrap()))
}

struct Step {
    txid: u64,
    restored_db_sha256: String,
    rows: i64,
}

fn steps(scenario: &str) -> Vec<Step> {
    let v: serde_json::Value =
        serde_json::from_slice(&fs::read(data_dir().join(scenario).join("expected.json")).unwrap())
            .unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Step {
            txid: s["txid"].as_u64().unwrap(),
            restored_db_sha256: s["restored_db_sha256"].as_str().unwrap().to_string(),
            rows: s["rows"].as_i64().unwrap(),
        })
        .collect()
}

fn check_scenario(scenario: &str) {
    let replica = data_dir().join(scenario).join("replica");
    let dir = tempfile::tempdir().unwrap();
    let steps = steps(scenario);
    assert!(!steps.is_empty());
    for step in &steps {
        let out = dir.path().join(format!("txid-{}.db", step.txid));
        let txid = format!("{:016x}", step.txid);
        let o = replicad(&[
            "restore",
            "--txid",
            &txid,
            "--to",
            out.to_str().unwrap(),
            replica.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{scenario} txid {txid}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            sha256(&out),
            step.restored_db_sha256,
            "{scenario} txid {txid}"
        );
        let conn = rusqlite::Connection::open(&out).unwrap();
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, step.rows, "{scenario} txid {txid}");
    }
    // Latest equals the last step; the file:// URL form works too.
    let latest = dir.path().join("latest.db");
    let url = format!("file://{}", replica.display());
    let o = replicad(&["restore", "-o", latest.to_str().unwrap(), &url]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        sha256(&latest),
        steps.last().unwrap().restored_db_sha256,
        "{scenario} latest"
    );
}

#[test]
fn basic_4k_every_txid_matches_litestream() {
    check_scenario("basic-4k");
}

#[test]
fn basic_64k_every_txid_matches_litestream() {
    check_scenario("basic-64k");
}

#[test]
fn legacy_frames_every_txid_matches_litestream() {
    check_scenario("legacy-frames-4k");
}

#[test]
fn compacted_every_txid_matches_litestream() {
    check_scenario("compacted-4k");
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let replica = data_dir().join("basic-4k/replica");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.db");
    let o = replicad(&[
        "restore",
        "--dry-run",
        "--json",
        "--to",
        out.to_str().unwrap(),
        replica.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let files = v["files"].as_array().unwrap();
    // Newest snapshot (1-6 at level 9), then L0 files 7, 8, 9.
    let got: Vec<(u64, &str, &str)> = files
        .iter()
        .map(|f| {
            (
                f["level"].as_u64().unwrap(),
                f["min_txid"].as_str().unwrap(),
                f["max_txid"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (9, "0000000000000001", "0000000000000006"),
            (0, "0000000000000007", "0000000000000007"),
            (0, "0000000000000008", "0000000000000008"),
            (0, "0000000000000009", "0000000000000009"),
        ]
    );
    assert_eq!(v["txid"], "0000000000000009");
    assert!(!out.exists());
    let text = replicad(&["restore", "--dry-run", replica.to_str().unwrap()]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("4 files"));
}
