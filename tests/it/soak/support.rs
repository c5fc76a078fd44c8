//! What the soak counts, and what it reads from a cycle's files: logs, replicas, staging.

use crate::common::parse_ltx_name;

use std::fs;
use std::path::Path;

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stats {
    pub(super) phases: u64,
    pub(super) writer_procs: u64,
    pub(super) kills: u64,
    pub(super) fault_runs: u64,
    pub(super) injected: u64,
    pub(super) s3_outages: u64,
    pub(super) startup_refusals: u64,
    pub(super) compared: u64,
    pub(super) pruned: u64,
    pub(super) wipes: u64,
    pub(super) added_replicas: u64,
    pub(super) staging_lost: u64,
    pub(super) publish_failures: u64,
    pub(super) replaced: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.phases += o.phases;
        self.writer_procs += o.writer_procs;
        self.kills += o.kills;
        self.fault_runs += o.fault_runs;
        self.injected += o.injected;
        self.s3_outages += o.s3_outages;
        self.startup_refusals += o.startup_refusals;
        self.compared += o.compared;
        self.pruned += o.pruned;
        self.wipes += o.wipes;
        self.added_replicas += o.added_replicas;
        self.staging_lost += o.staging_lost;
        self.publish_failures += o.publish_failures;
        self.replaced += o.replaced;
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "phases {} writer-procs {} kill-9 {} fault-runs {} injected-faults {} s3-outages {} \
             startup-refusals {} restores-compared {} pruned-points {} replica-wipes {} \
             replicas-added {} staging-lost-while-s3-down {} publish-failures {} \
             databases-replaced {}",
            self.phases,
            self.writer_procs,
            self.kills,
            self.fault_runs,
            self.injected,
            self.s3_outages,
            self.startup_refusals,
            self.compared,
            self.pruned,
            self.wipes,
            self.added_replicas,
            self.staging_lost,
            self.publish_failures,
            self.replaced
        )
    }
}

/// The highest TXID at which `replica` was re-seeded, from the daemons' logs (0: never).
pub(super) fn seeded_up_to(logs: &str, replica: &str) -> u64 {
    logs.lines()
        .filter(|l| l.contains("replica re-seeded") && l.contains(&format!("replica={replica} ")))
        .filter_map(|l| {
            let at = l.find(" txid=")? + " txid=".len();
            u64::from_str_radix(l[at..].split_whitespace().next()?, 16).ok()
        })
        .max()
        .unwrap_or(0)
}

/// Whether a `.tmp` file (a segment being written) is anywhere under `dir`.
pub(super) fn has_tmp(dir: &Path) -> bool {
    let Ok(rd) = fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            has_tmp(&p)
        } else {
            e.file_name().to_string_lossy().ends_with(".tmp")
        }
    })
}

/// The lowest max TXID of the snapshots in `level9` (`u64::MAX` when there is none).
pub(super) fn oldest_snapshot(level9: &Path) -> u64 {
    fs::read_dir(level9)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(parse_ltx_name))
        .map(|(_, max)| max)
        .min()
        .unwrap_or(u64::MAX)
}

/// The highest TXID of any `<min>-<max>.ltx` file under `dir` (any depth); 0 if none.
pub(super) fn max_txid_under(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    let mut max = 0;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            max = max.max(max_txid_under(&p));
        } else if let Some((_, b)) = e.file_name().to_str().and_then(parse_ltx_name) {
            max = max.max(b);
        }
    }
    max
}

/// Faults the drill daemons of this cycle injected: the last "faults injected so far" count
/// each of them logged.
pub(super) fn count_injected(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir.join("logs")) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("replicad-"))
        .filter_map(|e| {
            let text = fs::read_to_string(e.path()).unwrap_or_default();
            let line = text
                .lines()
                .rev()
                .find(|l| l.contains("faults injected so far"))?;
            let n = line.split("injected=").nth(1)?.split_whitespace().next()?;
            n.parse::<u64>().ok()
        })
        .sum()
}
