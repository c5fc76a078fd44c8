//! Calendar retention over a simulated year: real snapshots of a real database on a directory
//! replica, pruned with an injected clock by the daemon's own rule
//! ([`retention_deletes`]) and client; then `replicad restore --list` names exactly what is
//! left, and every kept restore point restores to its state.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use replicad::config::Calendar;
use replicad::ltx::checksum::{DbChecksum, page_checksum};
use replicad::ltx::{self, Codec, Encoder, Header, TxId};
use replicad::replicate::maintenance::schedule::{RemoteIndex, RetentionPolicy, retention_deletes};
use replicad::storage::file::FileClient;
use replicad::storage::{AnyClient, LtxFileInfo, ReplicaClient, SNAPSHOT_LEVEL};

use crate::common::{self, TestDir, bin, s};

/// Writes the database file `db` (rollback journal: the file is the whole state) as the
/// snapshot `1-txid` of `replica`, stored at `at`.
fn write_snapshot(db: &Path, replica: &Path, txid: u64, at: DateTime<Utc>) -> LtxFileInfo {
    let bytes = fs::read(db).unwrap();
    let page_size = match u16::from_be_bytes([bytes[16], bytes[17]]) {
        1 => 65_536,
        n => u32::from(n),
    };
    let pages = (bytes.len() / page_size as usize) as u32;
    let header = Header {
        page_size,
        commit: pages,
        min_txid: TxId(1),
        max_txid: TxId(txid),
        timestamp: at.timestamp_millis(),
        ..Header::default()
    };
    let mut enc = Encoder::new(Vec::new(), header, Codec::Lz4).unwrap();
    let mut sum = DbChecksum::default();
    for pgno in 1..=pages {
        let page =
            &bytes[(pgno - 1) as usize * page_size as usize..pgno as usize * page_size as usize];
        enc.encode_page(pgno, page).unwrap();
        sum.toggle(page_checksum(pgno, page));
    }
    let (out, _) = enc.finish(sum.value()).unwrap();
    let dir = replica.join("ltx/9");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join(ltx::format_filename(TxId(1), TxId(txid)));
    fs::write(&path, &out).unwrap();
    let file = fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::from(at)).unwrap();
    LtxFileInfo {
        level: SNAPSHOT_LEVEL,
        min_txid: TxId(1),
        max_txid: TxId(txid),
        size: out.len() as u64,
        created_at: at,
        encrypted: false,
    }
}

#[tokio::test]
async fn a_simulated_year_keeps_the_calendar_points_and_each_restores() {
    let dir = TestDir::new("retention-calendar");
    let db = dir.join("app.db");
    let replica = dir.join("replica");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);",
    )
    .unwrap();
    let client = AnyClient::File(FileClient::new(replica.clone()));
    let calendar = Calendar {
        hourly: 24,
        daily: 7,
        weekly: 4,
        monthly: 12,
    };
    let policy = RetentionPolicy {
        snapshot_retention: Duration::from_secs(86_400),
        l0_retention: Duration::ZERO,
        calendar,
    };
    let start = DateTime::parse_from_rfc3339("2025-03-01T01:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    // A snapshot every 3 hours for 400 days, the daemon's retention rule after each.
    let steps = 400 * 8;
    let mut idx = RemoteIndex::default();
    let mut deleted = 0;
    for n in 1..=steps {
        let now = start + chrono::Duration::hours(3 * (n as i64 - 1));
        conn.execute(
            "INSERT INTO t(id, v) VALUES (?1, ?2)",
            rusqlite::params![n as i64, format!("step-{n}")],
        )
        .unwrap();
        idx.insert(write_snapshot(&db, &replica, n, now));
        let doomed = retention_deletes(&idx, now, policy);
        client.delete(&doomed).await.unwrap();
        idx.remove(&doomed);
        deleted += doomed.len();
    }
    let kept: Vec<u64> = idx
        .level(SNAPSHOT_LEVEL)
        .iter()
        .map(|f| f.max_txid.0)
        .collect();
    assert!(deleted > 3000, "{deleted} deleted");
    // The window (8 snapshots of the last day and its base), 24 hourly points (3 hours apart:
    // 72 hours back), 7 daily, 4 weekly and 12 monthly, overlapping.
    assert!(
        kept.len() >= 30 && kept.len() <= 50,
        "{} kept: {kept:?}",
        kept.len()
    );
    let oldest = idx
        .level(SNAPSHOT_LEVEL)
        .iter()
        .map(|f| f.created_at)
        .min()
        .unwrap();
    // The twelfth month back ends about 310 days before the last step (2026-04-05).
    assert_eq!(
        oldest.format("%Y-%m").to_string(),
        "2025-05",
        "oldest {oldest}"
    );

    // `restore --list` names exactly the kept snapshots, with the rules that keep them.
    let cfg = dir.join("replicad.yml");
    fs::write(
        &cfg,
        format!(
            "retention: {{window: 1d, hourly: 24, daily: 7, weekly: 4, monthly: 12}}\n\
             dbs:\n  - path: {}\n    replica:\n      url: {}\n",
            db.display(),
            replica.display()
        ),
    )
    .unwrap();
    let o = Command::new(bin())
        .args(["restore", "--list", "--json", "--config", s(&cfg), s(&db)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<u64> = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u64::from_str_radix(s["txid"].as_str().unwrap(), 16).unwrap())
        .collect();
    assert_eq!(listed, kept);
    assert_eq!(v["txids"], kept.len() as u64, "{v}");
    let newest = v["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(
        newest["rules"],
        serde_json::json!(["hourly", "daily", "weekly", "monthly"])
    );
    // Each rule labels as many snapshots as it keeps (every period had snapshots).
    let labelled = |rule: &str| {
        v["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["rules"].as_array().unwrap().iter().any(|r| r == rule))
            .count()
    };
    for (rule, n) in [("hourly", 24), ("daily", 7), ("weekly", 4), ("monthly", 12)] {
        assert_eq!(labelled(rule), n, "{rule}: {v}");
    }
    // Every kept snapshot is labelled, or in the window (the last day and its base).
    let unlabelled = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["rules"].as_array().unwrap().is_empty())
        .count();
    assert!(unlabelled <= 9, "{unlabelled} unlabelled: {v}");
    let o = Command::new(bin())
        .args(["restore", "--list", s(&replica)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains(&format!("{} snapshots", kept.len())),
        "{text}"
    );
    // A pruned point is gone, and restore says so.
    let pruned = (1..=steps).find(|t| !kept.contains(t)).unwrap();
    let out = dir.join("pruned.db");
    let o = common::restore(s(&replica), &out, Some(pruned));
    assert_eq!(o.status.code(), Some(1), "restoring pruned TXID {pruned}");
    assert!(!out.exists());

    // Every kept point restores, to its own state.
    for &txid in &kept {
        let out = dir.join(&format!("at-{txid}.db"));
        common::restore_ok(s(&replica), &out, Some(txid));
        let c = rusqlite::Connection::open(&out).unwrap();
        let (count, last): (i64, String) = c
            .query_row(
                "SELECT count(*), (SELECT v FROM t ORDER BY id DESC LIMIT 1) FROM t",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((count as u64, last), (txid, format!("step-{txid}")));
        fs::remove_file(&out).unwrap();
    }
}
