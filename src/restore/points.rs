//! The restore points of a replica (`replicad restore --list`): every TXID a restore can
//! reach exactly, from one listing. Pure: no I/O.
//!
//! A TXID is reachable when a chain of files ends exactly at it ([`super::calc_plan`] would
//! plan it): a snapshot on its own, or a reachable TXID (or the empty database, for a chain
//! that starts at TXID 1) followed by files of levels 0 to 8 without a gap. Computed in one
//! pass over the files in order of their last TXID, so a replica of many thousand files
//! lists at once.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::ltx::TxId;
use crate::storage::{LtxFileInfo, SNAPSHOT_LEVEL};

/// A run of consecutive reachable TXIDs: every TXID from `from` to `to` restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The first TXID of the run.
    pub from: TxId,
    /// The last TXID of the run.
    pub to: TxId,
    /// When the file ending at `from` was stored.
    pub from_stored: DateTime<Utc>,
    /// When the file ending at `to` was stored.
    pub to_stored: DateTime<Utc>,
}

/// What a replica can restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestorePoints {
    /// The snapshots, oldest first: each restores to its TXID on its own.
    pub snapshots: Vec<LtxFileInfo>,
    /// The reachable TXIDs as runs, oldest first (snapshot TXIDs included).
    pub spans: Vec<Span>,
}

impl RestorePoints {
    /// How many TXIDs are reachable.
    pub fn count(&self) -> u64 {
        self.spans.iter().map(|s| s.to.0 - s.from.0 + 1).sum()
    }

    /// Whether `txid` restores.
    pub fn contains(&self, txid: TxId) -> bool {
        self.spans.iter().any(|s| s.from <= txid && txid <= s.to)
    }
}

/// The restore points of a replica holding `files` (any levels, any order).
pub fn restore_points(files: &[LtxFileInfo]) -> RestorePoints {
    let mut snapshots: Vec<LtxFileInfo> = files
        .iter()
        .filter(|f| f.level == SNAPSHOT_LEVEL)
        .cloned()
        .collect();
    snapshots.sort_by_key(|s| (s.max_txid, s.created_at));
    snapshots.dedup_by_key(|s| s.max_txid);
    // Reachable end TXIDs, with when the file ending there was stored (0: the empty state a
    // chain from TXID 1 starts from, never listed).
    let mut reached: BTreeSet<u64> = snapshots.iter().map(|s| s.max_txid.0).collect();
    let mut stored: std::collections::BTreeMap<u64, DateTime<Utc>> = snapshots
        .iter()
        .map(|s| (s.max_txid.0, s.created_at))
        .collect();
    reached.insert(0);
    let mut chain: Vec<&LtxFileInfo> = files
        .iter()
        .filter(|f| f.level < SNAPSHOT_LEVEL && f.max_txid >= f.min_txid)
        .collect();
    chain.sort_by_key(|f| (f.max_txid, f.min_txid));
    for f in chain {
        let start = f.min_txid.0.saturating_sub(1);
        if reached.range(start..f.max_txid.0).next().is_some() {
            reached.insert(f.max_txid.0);
            stored.entry(f.max_txid.0).or_insert(f.created_at);
        }
    }
    if !snapshots.iter().any(|s| s.max_txid.0 == 0) {
        reached.remove(&0);
    }
    let mut spans: Vec<Span> = Vec::new();
    for t in reached {
        let at = stored.get(&t).copied().unwrap_or_default();
        match spans.last_mut() {
            Some(s) if s.to.0 + 1 == t => {
                s.to = TxId(t);
                s.to_stored = at;
            }
            _ => spans.push(Span {
                from: TxId(t),
                to: TxId(t),
                from_stored: at,
                to_stored: at,
            }),
        }
    }
    RestorePoints { snapshots, spans }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::restore::tests::file as f;

    fn spans(p: &RestorePoints) -> Vec<(u64, u64)> {
        p.spans.iter().map(|s| (s.from.0, s.to.0)).collect()
    }

    #[test]
    fn snapshots_and_chains_give_the_reachable_txids() {
        // L0 1..=5, compacted L1 1-5; retention removed L0 1..=3; snapshot at 5; L0 6..=8;
        // an old snapshot at 2 kept by the calendar; a stray L0 file after a gap.
        let files = vec![
            f(9, 1, 2),
            f(1, 1, 5),
            f(0, 4, 4),
            f(0, 5, 5),
            f(9, 1, 5),
            f(0, 6, 6),
            f(0, 7, 7),
            f(0, 8, 8),
            f(0, 11, 11),
        ];
        let p = restore_points(&files);
        // 3 and 4 are inside L1 1-5 only: not reachable (kept at compaction boundaries).
        assert_eq!(spans(&p), [(2, 2), (5, 8)]);
        assert_eq!(p.snapshots.len(), 2);
        assert_eq!(p.count(), 5);
        assert!(!p.contains(TxId(1)) && !p.contains(TxId(11)));
        // Every listed TXID plans, every other one does not.
        for t in 1..=12 {
            let plans = crate::restore::calc_plan(&files, Some(TxId(t))).is_ok();
            assert_eq!(plans, p.contains(TxId(t)), "TXID {t}");
        }
    }

    /// Random listings (overlaps, gaps, several snapshots, snapshots above later files): the
    /// reachable set is exactly what `calc_plan` plans.
    #[test]
    fn random_listings_agree_with_calc_plan() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..300 {
            let mut files = Vec::new();
            for _ in 0..1 + next(12) {
                let min = 1 + next(20);
                let len = next(4);
                let level = match next(6) {
                    0 => SNAPSHOT_LEVEL,
                    1 => 1,
                    _ => 0,
                };
                let min = if level == SNAPSHOT_LEVEL { 1 } else { min };
                files.push(f(
                    level,
                    min,
                    min + len + u64::from(level == SNAPSHOT_LEVEL) * next(20),
                ));
            }
            let p = restore_points(&files);
            for t in 1..=45 {
                let plans = crate::restore::calc_plan(&files, Some(TxId(t))).is_ok();
                assert_eq!(plans, p.contains(TxId(t)), "TXID {t} of {files:?}");
            }
        }
    }

    #[test]
    fn calendar_snapshots_alone_are_single_points() {
        let files = vec![f(9, 1, 10), f(9, 1, 20), f(9, 1, 30), f(0, 31, 31)];
        let p = restore_points(&files);
        assert_eq!(spans(&p), [(10, 10), (20, 20), (30, 31)]);
        assert_eq!(p.spans[2].to_stored, files[3].created_at);
        assert_eq!(restore_points(&[]), RestorePoints::default());
    }
}
