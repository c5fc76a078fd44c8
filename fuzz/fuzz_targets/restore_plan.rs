//! Arbitrary replica listings through `restore::calc_plan` (a pure function): it must return
//! a plan or an error, never panic, and any plan it returns must be a real chain.
//!
//! Checked on every `Ok(plan)`: the plan is non-empty; only its first file may be a level-9
//! snapshot; it starts at a snapshot or at TXID 1; each next file starts inside the range
//! restored so far and reaches strictly further; nothing passes the target; and with a TXID
//! target the plan ends exactly at it.
#![no_main]

use arbitrary::Arbitrary;
use chrono::{DateTime, Utc};
use libfuzzer_sys::fuzz_target;
use replicad::ltx::TxId;
use replicad::storage::{LtxFileInfo, SNAPSHOT_LEVEL};
use replicad::restore::calc_plan;

#[derive(Debug, Arbitrary)]
struct RawFile {
    level: u8,
    min: u64,
    /// `max = min + span` (wrapping): mostly small forward spans, but also `max < min` and
    /// values near `u64::MAX`, which a listing of hand-named files can hold.
    span: i16,
    size: u32,
    created_ms: i32,
}

#[derive(Debug, Arbitrary)]
struct Input {
    target: Option<u64>,
    /// Map TXIDs into 0..64 so that chains actually connect (the raw form reaches the edges).
    small: bool,
    files: Vec<RawFile>,
}

fuzz_target!(|input: Input| {
    let txid = |v: u64| if input.small { v % 64 } else { v };
    let files: Vec<LtxFileInfo> = input
        .files
        .iter()
        .take(256)
        .map(|f| {
            let min = txid(f.min);
            LtxFileInfo {
                level: f.level % (SNAPSHOT_LEVEL + 1),
                min_txid: TxId(min),
                max_txid: TxId(min.wrapping_add(f.span as i64 as u64)),
                size: u64::from(f.size),
                created_at: DateTime::<Utc>::from_timestamp_millis(i64::from(f.created_ms))
                    .unwrap_or_default(),
                encrypted: false,
            }
        })
        .collect();
    let target = input.target.map(|t| TxId(txid(t)));
    // Chains reaching TXID u64::MAX once overflowed calc_plan (fuzz/regressions/restore_plan/);
    // they are checked like any other listing now.
    let Ok(plan) = calc_plan(&files, target) else {
        return;
    };
    let limit = target.unwrap_or(TxId(u64::MAX));
    let first = plan.first().expect("Ok with an empty plan");
    assert!(
        first.level == SNAPSHOT_LEVEL || first.min_txid.0 <= 1,
        "plan starts with {first:?}"
    );
    let mut reached = first.max_txid.0;
    assert!(first.max_txid <= limit);
    for f in &plan[1..] {
        assert!(f.level < SNAPSHOT_LEVEL, "snapshot inside a plan: {f:?}");
        assert!(
            f.min_txid.0 <= reached.saturating_add(1),
            "gap before {f:?}"
        );
        assert!(
            f.max_txid.0 > reached,
            "{f:?} does not advance past {reached}"
        );
        assert!(f.max_txid <= limit);
        reached = f.max_txid.0;
    }
    if let Some(t) = target {
        assert_eq!(TxId(reached), t);
    }
    for f in &plan {
        assert!(files.contains(f), "plan invents {f:?}");
    }
});
