//! What a replica compacts and deletes: pure planning over an in-memory index of its files.
//!
//! The index is filled by one listing at start and kept current by the replica's own puts and
//! deletes, so planning costs no request (an idle replica makes none at all).
//!
//! Invariants:
//! - Compaction into level L takes a contiguous run of level L-1 files that starts after what
//!   L already holds; its output replaces nothing (inputs are deleted only by retention).
//! - Retention never removes a file that a restore to any time inside the retention window
//!   needs: it keeps every snapshot newer than the window's start *and* the newest one older
//!   than it (the base of restores early in the window), deletes lower-level files only when
//!   that base covers them, and always keeps the newest file of each level. Level-0 files
//!   are deleted only once level 1 covers them and they are older than `l0-retention`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::ltx::TxId;
use crate::storage::{LtxFileInfo, SNAPSHOT_LEVEL};

/// The files of one replica, per level, sorted by (min, max) TXID.
#[derive(Debug, Clone, Default)]
pub struct RemoteIndex {
    levels: [Vec<LtxFileInfo>; SNAPSHOT_LEVEL as usize + 1],
}

impl RemoteIndex {
    /// Records a stored file (replacing one with the same key).
    pub fn insert(&mut self, f: LtxFileInfo) {
        let level = &mut self.levels[f.level as usize];
        match level.binary_search_by_key(&(f.min_txid, f.max_txid), |x| (x.min_txid, x.max_txid)) {
            Ok(i) => level[i] = f,
            Err(i) => level.insert(i, f),
        }
    }

    /// Forgets deleted files.
    pub fn remove(&mut self, files: &[LtxFileInfo]) {
        for f in files {
            self.levels[f.level as usize]
                .retain(|x| (x.min_txid, x.max_txid) != (f.min_txid, f.max_txid));
        }
    }

    /// One level's files.
    pub fn level(&self, level: u8) -> &[LtxFileInfo] {
        &self.levels[level as usize]
    }

    /// Highest TXID in a level (0 if empty).
    pub fn max_txid(&self, level: u8) -> TxId {
        self.levels[level as usize]
            .iter()
            .map(|f| f.max_txid)
            .max()
            .unwrap_or_default()
    }

    /// Highest TXID anywhere.
    pub fn tip(&self) -> TxId {
        (0..=SNAPSHOT_LEVEL)
            .map(|l| self.max_txid(l))
            .max()
            .unwrap_or_default()
    }

    /// Every file, all levels.
    pub fn all(&self) -> Vec<LtxFileInfo> {
        self.levels.iter().flatten().cloned().collect()
    }
}

/// The inputs of a compaction into `level` (1..=8): the contiguous run of level-(L-1) files
/// that start after what `level` holds. Empty when there is nothing new.
pub fn compaction_inputs(index: &RemoteIndex, level: u8) -> Vec<LtxFileInfo> {
    debug_assert!((1..SNAPSHOT_LEVEL).contains(&level));
    let seek = index.max_txid(level).0;
    let mut run: Vec<LtxFileInfo> = Vec::new();
    for f in index
        .level(level - 1)
        .iter()
        .filter(|f| f.min_txid.0 > seek)
    {
        if run
            .last()
            .is_some_and(|prev| f.min_txid.0 != prev.max_txid.0 + 1)
        {
            break;
        }
        run.push(f.clone());
    }
    run
}

/// Retention settings.
#[derive(Debug, Clone, Copy)]
pub struct RetentionPolicy {
    /// Snapshots are kept this long (plus the base of the window).
    pub snapshot_retention: Duration,
    /// Level-0 files are kept this long after level 1 covers them (0: forever).
    pub l0_retention: Duration,
}

/// Files that may be deleted now.
pub fn retention_deletes(
    index: &RemoteIndex,
    now: DateTime<Utc>,
    policy: RetentionPolicy,
) -> Vec<LtxFileInfo> {
    let mut out = Vec::new();
    let snapshots = index.level(SNAPSHOT_LEVEL);
    let cutoff = now
        - chrono::Duration::from_std(policy.snapshot_retention).unwrap_or(chrono::Duration::MAX);
    // The base: the newest snapshot taken before the window opened.
    let base = snapshots
        .iter()
        .filter(|s| s.created_at < cutoff)
        .max_by_key(|s| (s.max_txid, s.created_at));
    if let Some(base) = base {
        out.extend(
            snapshots
                .iter()
                .filter(|s| {
                    s.created_at < cutoff
                        && (s.max_txid, s.created_at) < (base.max_txid, base.created_at)
                })
                .cloned(),
        );
        // Restores in the window start at the base or later: files it covers are not needed.
        for level in 1..SNAPSHOT_LEVEL {
            let files = index.level(level);
            let newest = files.iter().map(|f| f.max_txid).max();
            out.extend(
                files
                    .iter()
                    .filter(|f| f.max_txid <= base.max_txid && Some(f.max_txid) != newest)
                    .cloned(),
            );
        }
    }
    if !policy.l0_retention.is_zero() {
        let l1 = index.max_txid(1);
        let old =
            now - chrono::Duration::from_std(policy.l0_retention).unwrap_or(chrono::Duration::MAX);
        let l0 = index.level(0);
        let newest = l0.iter().map(|f| f.max_txid).max();
        out.extend(
            l0.iter()
                .filter(|f| f.max_txid <= l1 && f.created_at < old && Some(f.max_txid) != newest)
                .cloned(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(level: u8, min: u64, max: u64, age_s: i64, now: DateTime<Utc>) -> LtxFileInfo {
        LtxFileInfo {
            level,
            min_txid: TxId(min),
            max_txid: TxId(max),
            size: 1,
            created_at: now - chrono::Duration::seconds(age_s),
            encrypted: false,
        }
    }

    #[test]
    fn compaction_takes_the_contiguous_run_after_the_destination() {
        let now = Utc::now();
        let mut idx = RemoteIndex::default();
        for t in 1..=9 {
            idx.insert(f(0, t, t, 0, now));
        }
        let got: Vec<u64> = compaction_inputs(&idx, 1)
            .iter()
            .map(|f| f.min_txid.0)
            .collect();
        assert_eq!(got, (1..=9).collect::<Vec<_>>());
        idx.insert(f(1, 1, 6, 0, now));
        let got: Vec<u64> = compaction_inputs(&idx, 1)
            .iter()
            .map(|f| f.min_txid.0)
            .collect();
        assert_eq!(got, vec![7, 8, 9]);
        idx.remove(&[f(0, 8, 8, 0, now)]);
        let got: Vec<u64> = compaction_inputs(&idx, 1)
            .iter()
            .map(|f| f.min_txid.0)
            .collect();
        assert_eq!(got, vec![7], "stops at a gap");
        idx.insert(f(1, 7, 9, 0, now));
        assert!(compaction_inputs(&idx, 1).is_empty(), "nothing new");
        assert_eq!(compaction_inputs(&idx, 2).len(), 2);
    }

    #[test]
    fn retention_keeps_the_base_of_the_window_and_the_newest_of_each_level() {
        let now = Utc::now();
        let day = 86_400;
        let mut idx = RemoteIndex::default();
        idx.insert(f(9, 1, 100, 3 * day, now));
        idx.insert(f(9, 1, 200, 2 * day - 60, now)); // older than the base: deleted
        idx.insert(f(9, 1, 300, day + 60, now)); // the base (just before the window)
        idx.insert(f(9, 1, 400, 600, now));
        for (min, max, age) in [
            (150, 199, 2 * day),
            (201, 300, day + 100),
            (301, 350, day / 2),
            (351, 420, 60),
        ] {
            idx.insert(f(1, min, max, age, now));
        }
        let policy = RetentionPolicy {
            snapshot_retention: Duration::from_secs(day as u64),
            l0_retention: Duration::ZERO,
        };
        let mut got: Vec<(u8, u64)> = retention_deletes(&idx, now, policy)
            .iter()
            .map(|f| (f.level, f.max_txid.0))
            .collect();
        got.sort();
        assert_eq!(got, vec![(1, 199), (1, 300), (9, 100), (9, 200)]);
    }

    #[test]
    fn l0_goes_only_when_l1_covers_it_and_it_is_old_enough() {
        let now = Utc::now();
        let mut idx = RemoteIndex::default();
        for t in 1..=10 {
            idx.insert(f(0, t, t, if t <= 5 { 600 } else { 10 }, now));
        }
        idx.insert(f(1, 1, 8, 0, now));
        let policy = RetentionPolicy {
            snapshot_retention: Duration::from_secs(86_400),
            l0_retention: Duration::from_secs(300),
        };
        let got: Vec<u64> = retention_deletes(&idx, now, policy)
            .iter()
            .map(|f| f.max_txid.0)
            .collect();
        assert_eq!(got, vec![1, 2, 3, 4, 5]);
        let off = RetentionPolicy {
            l0_retention: Duration::ZERO,
            ..policy
        };
        assert!(retention_deletes(&idx, now, off).is_empty());
    }
}
