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
//! - Calendar retention only ever keeps more: a snapshot it picks ([`calendar_keeps`]) is not
//!   deleted whatever its age, and restores to exactly its TXID on its own.

use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};

use crate::config::Calendar;
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
    /// Snapshots kept past the window as calendar restore points.
    pub calendar: Calendar,
}

/// The calendar rules a snapshot satisfies, by name, in the order they are checked.
pub const CALENDAR_RULES: [&str; 4] = ["hourly", "daily", "weekly", "monthly"];

/// The period of `t` under rule `rule` (an index into [`CALENDAR_RULES`]), in UTC: the hour,
/// the day, the ISO week or the month it falls in.
fn period(rule: usize, t: DateTime<Utc>) -> (i32, u32, u32, u32) {
    match rule {
        0 => (t.year(), t.ordinal(), t.hour(), 0),
        1 => (t.year(), t.ordinal(), 0, 0),
        2 => {
            let w = t.iso_week();
            (w.year(), w.week(), 0, 1)
        }
        _ => (t.year(), t.month(), 0, 2),
    }
}

/// The snapshots `calendar` keeps, each with the rules that keep it: for each rule, walking
/// from the newest snapshot back, the newest one of each period until that many periods have
/// one (periods with no snapshot do not count, as in borg's and restic's `keep-daily`).
pub fn calendar_keeps(
    snapshots: &[LtxFileInfo],
    calendar: Calendar,
) -> Vec<(LtxFileInfo, Vec<&'static str>)> {
    let mut newest_first: Vec<&LtxFileInfo> = snapshots.iter().collect();
    newest_first.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.max_txid)));
    let counts = [
        calendar.hourly,
        calendar.daily,
        calendar.weekly,
        calendar.monthly,
    ];
    let mut kept: Vec<(LtxFileInfo, Vec<&'static str>)> = Vec::new();
    for (rule, &count) in counts.iter().enumerate() {
        let mut last = None;
        let mut taken = 0;
        for s in &newest_first {
            if taken == count {
                break;
            }
            let p = period(rule, s.created_at);
            if last == Some(p) {
                continue;
            }
            last = Some(p);
            taken += 1;
            match kept.iter_mut().find(|(k, _)| k == *s) {
                Some((_, rules)) => rules.push(CALENDAR_RULES[rule]),
                None => kept.push(((*s).clone(), vec![CALENDAR_RULES[rule]])),
            }
        }
    }
    kept
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
        let keep = calendar_keeps(snapshots, policy.calendar);
        out.extend(
            snapshots
                .iter()
                .filter(|s| {
                    s.created_at < cutoff
                        && (s.max_txid, s.created_at) < (base.max_txid, base.created_at)
                        && !keep.iter().any(|(k, _)| k == *s)
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
            calendar: Calendar::default(),
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
            calendar: Calendar::default(),
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

    /// A year of hourly snapshots, pruned every hour with an injected clock, ends with the
    /// snapshots a one-shot selection over the whole history picks: every one of the window,
    /// its base, and the last one of each of the last 24 hours, 7 days, 4 ISO weeks and 12
    /// months.
    #[test]
    fn a_simulated_year_of_hourly_pruning_keeps_the_calendar_points() {
        use std::collections::{BTreeMap, BTreeSet};
        let start = DateTime::parse_from_rfc3339("2025-01-01T00:30:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let calendar = Calendar {
            hourly: 24,
            daily: 7,
            weekly: 4,
            monthly: 12,
        };
        let policy = RetentionPolicy {
            snapshot_retention: Duration::from_secs(6 * 3600),
            l0_retention: Duration::ZERO,
            calendar,
        };
        let hours = 366 * 24 + 5;
        let mut idx = RemoteIndex::default();
        let mut all = Vec::new();
        let snap = |txid: u64, at: DateTime<Utc>| LtxFileInfo {
            level: SNAPSHOT_LEVEL,
            min_txid: TxId(1),
            max_txid: TxId(txid),
            size: 1,
            created_at: at,
            encrypted: false,
        };
        let mut now = start;
        for h in 0..hours {
            now = start + chrono::Duration::hours(h);
            let s = snap(h as u64 + 1, now);
            all.push(s.clone());
            idx.insert(s);
            let doomed = retention_deletes(&idx, now, policy);
            idx.remove(&doomed);
        }
        let kept: BTreeSet<u64> = idx
            .level(SNAPSHOT_LEVEL)
            .iter()
            .map(|s| s.max_txid.0)
            .collect();

        // The same picks, from the whole history at once, grouped without `calendar_keeps`.
        let cutoff = now - chrono::Duration::hours(6);
        let mut want: BTreeSet<u64> = all
            .iter()
            .filter(|s| s.created_at >= cutoff)
            .map(|s| s.max_txid.0)
            .collect();
        let base = all
            .iter()
            .filter(|s| s.created_at < cutoff)
            .map(|s| s.max_txid.0)
            .max();
        want.extend(base);
        let last_per = |key: &dyn Fn(DateTime<Utc>) -> String, n: usize| -> Vec<u64> {
            let mut by: BTreeMap<String, u64> = BTreeMap::new();
            for s in &all {
                let e = by.entry(key(s.created_at)).or_default();
                *e = (*e).max(s.max_txid.0);
            }
            let mut lasts: Vec<u64> = by.into_values().collect();
            lasts.sort_unstable_by(|a, b| b.cmp(a));
            lasts.truncate(n);
            lasts
        };
        let hourly = last_per(&|t| t.format("%Y-%m-%d %H").to_string(), 24);
        let daily = last_per(&|t| t.format("%Y-%m-%d").to_string(), 7);
        let weekly = last_per(&|t| t.format("%G-W%V").to_string(), 4);
        let monthly = last_per(&|t| t.format("%Y-%m").to_string(), 12);
        for picks in [&hourly, &daily, &weekly, &monthly] {
            want.extend(picks.iter().copied());
        }
        assert_eq!(kept, want);
        // 12 months back: the oldest monthly point is a year old, the kept set stays small.
        assert_eq!(monthly.len(), 12);
        assert!(kept.len() < 60, "{} snapshots kept", kept.len());
        let oldest = idx
            .level(SNAPSHOT_LEVEL)
            .iter()
            .map(|s| s.created_at)
            .min()
            .unwrap();
        assert!(
            now - oldest > chrono::Duration::days(300),
            "oldest {oldest}"
        );
        // Labels: the newest snapshot answers every rule.
        let labels = calendar_keeps(idx.level(SNAPSHOT_LEVEL), calendar);
        let newest = labels
            .iter()
            .find(|(s, _)| s.max_txid.0 == hours as u64)
            .unwrap();
        assert_eq!(newest.1, CALENDAR_RULES);
    }

    #[test]
    fn without_calendar_rules_nothing_past_the_base_is_kept() {
        let now = Utc::now();
        let mut idx = RemoteIndex::default();
        for d in 0..10 {
            idx.insert(f(9, 1, 10 - d, d as i64 * 86_400 + 1, now));
        }
        let policy = RetentionPolicy {
            snapshot_retention: Duration::from_secs(86_400),
            l0_retention: Duration::ZERO,
            calendar: Calendar::default(),
        };
        let doomed = retention_deletes(&idx, now, policy);
        assert_eq!(doomed.len(), 8, "{doomed:?}");
        let daily = RetentionPolicy {
            calendar: Calendar {
                daily: 5,
                ..Calendar::default()
            },
            ..policy
        };
        // The newest 5 days each keep their one snapshot; the base is one of them.
        assert_eq!(retention_deletes(&idx, now, daily).len(), 5);
    }
}
