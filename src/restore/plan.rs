//! Choosing the files to restore: the shortest chain of snapshots and segments that reaches
//! the target without a gap.

#[allow(unused_imports)]
use super::*;

/// Chooses the files that restore `target_txid` (or the newest state) from `files`, which may
/// span every level in any order. Pure: no I/O.
pub fn calc_plan(
    files: &[LtxFileInfo],
    target_txid: Option<TxId>,
) -> Result<Vec<LtxFileInfo>, RestoreError> {
    let limit = target_txid.unwrap_or(TxId(u64::MAX));
    let mut plan = Vec::new();
    let snapshot = files
        .iter()
        .filter(|f| f.level == SNAPSHOT_LEVEL && f.max_txid <= limit)
        .max_by_key(|f| (f.max_txid, std::cmp::Reverse(f.created_at)));
    let mut current = 0u64;
    if let Some(s) = snapshot {
        current = s.max_txid.0;
        plan.push(s.clone());
    }
    while current < limit.0 {
        let next = files
            .iter()
            .filter(|f| {
                f.level < SNAPSHOT_LEVEL
                    && f.min_txid.0 <= current.saturating_add(1)
                    && f.max_txid.0 > current
                    && f.max_txid <= limit
            })
            // Furthest reach first; then the smaller start, the higher level, the older file.
            .max_by_key(|f| {
                (
                    f.max_txid,
                    std::cmp::Reverse(f.min_txid),
                    f.level,
                    std::cmp::Reverse(f.created_at),
                )
            });
        match next {
            Some(f) => {
                current = f.max_txid.0;
                plan.push(f.clone());
            }
            None => break,
        }
    }
    let beyond = files
        .iter()
        .filter(|f| f.min_txid.0 > current.saturating_add(1) && f.min_txid <= limit)
        .map(|f| f.min_txid)
        .min();
    if plan.is_empty() && beyond.is_some() {
        // Nothing to start from: the history before the oldest snapshot was retired.
        let oldest = files
            .iter()
            .filter(|f| f.level == SNAPSHOT_LEVEL || f.min_txid.0 == 1)
            .map(|f| f.max_txid)
            .min();
        return Err(RestoreError::NotAvailable {
            target: target_txid.map_or("the latest state".into(), |t| format!("TXID {t}")),
            reason: match oldest {
                Some(o) => format!(
                    "it is older than the oldest restorable TXID {o} (retention removed what came before)"
                ),
                None => "the replica holds no snapshot and no chain starting at TXID 1".into(),
            },
        });
    }
    if let Some(next_min) = beyond {
        let (from, to) = (TxId(current.saturating_add(1)), TxId(next_min.0 - 1));
        // Not a hole: a compaction past the target (the chain would have taken one before
        // it) holds the whole gap.
        if let Some(t) = target_txid
            && !plan.is_empty()
            && compaction_spans(files, from, to)
        {
            return Err(RestoreError::NotAvailable {
                target: format!("TXID {t}"),
                reason: format!(
                    "no file chain ends exactly at it (the nearest restorable TXID below is \
                     {current}); older TXIDs are only kept at compaction boundaries"
                ),
            });
        }
        return Err(RestoreError::Gap { from, to });
    }
    let newest = files.iter().map(|f| f.max_txid).max();
    match (target_txid, plan.last()) {
        (_, None) => Err(RestoreError::NotAvailable {
            target: target_txid.map_or("the latest state".into(), |t| format!("TXID {t}")),
            reason: "no snapshot or chain starting at TXID 1 reaches it".into(),
        }),
        (Some(t), Some(last)) if last.max_txid != t => Err(RestoreError::NotAvailable {
            target: format!("TXID {t}"),
            reason: match newest {
                Some(n) if n < t => format!("the newest TXID on the replica is {n}"),
                _ => format!(
                    "no file chain ends exactly at it (the nearest restorable TXID below is {}); \
                     older TXIDs are only kept at compaction boundaries",
                    last.max_txid
                ),
            },
        }),
        _ => Ok(plan),
    }
}

/// Lists the replica and plans a restore for `target`, reading file headers when the target
/// is a time.
pub async fn plan(client: &AnyClient, target: Target) -> Result<Vec<LtxFileInfo>, RestoreError> {
    let mut files = client.list_all().await?;
    if files.is_empty() {
        return Err(RestoreError::NoBackups(client.location()));
    }
    match target {
        Target::Latest => calc_plan(&files, None),
        Target::TxId(t) => calc_plan(&files, Some(t)),
        Target::Before(ts) => {
            let cutoff = ts.timestamp_millis();
            let (mut kept, mut later) = (Vec::with_capacity(files.len()), Vec::new());
            let mut oldest: Option<i64> = None;
            for f in files.drain(..) {
                let h = client.read_header(&f).await?;
                if f.level == SNAPSHOT_LEVEL || f.min_txid.0 == 1 {
                    oldest = Some(oldest.map_or(h.timestamp, |o| o.min(h.timestamp)));
                }
                if h.timestamp < cutoff {
                    kept.push(f);
                } else {
                    later.push(f);
                }
            }
            if kept.is_empty() {
                let oldest = oldest
                    .and_then(DateTime::<Utc>::from_timestamp_millis)
                    .map_or("unknown".into(), |t| {
                        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    });
                return Err(RestoreError::NotAvailable {
                    target: format!("time {}", ts.to_rfc3339()),
                    reason: format!("the oldest restorable time is just after {oldest}"),
                });
            }
            calc_plan_before(&kept, &later)
        }
    }
}

/// Whether a file of `files` holds every TXID of the gap `from..=to`: a compaction (levels
/// 1..8, a merge of the TXIDs it spans) whose first level-0 files retention removed. A
/// snapshot (`1-<txid>`) says nothing about a gap below its end.
fn compaction_spans(files: &[LtxFileInfo], from: TxId, to: TxId) -> bool {
    files
        .iter()
        .any(|f| f.level > 0 && f.level < SNAPSHOT_LEVEL && f.min_txid <= from && f.max_txid >= to)
}

/// Plans the newest state before a time from the files written before it (`kept`) and after
/// (`later`). A time inside a compaction whose first level-0 files retention removed keeps
/// the level-0 files after them but not the compaction: the kept chain stops at a gap that
/// only the later file bridges, and the newest state before the time that the replica holds
/// is where the chain stops. A gap no compaction spans is a hole in the history, and an error.
pub(crate) fn calc_plan_before(
    kept: &[LtxFileInfo],
    later: &[LtxFileInfo],
) -> Result<Vec<LtxFileInfo>, RestoreError> {
    match calc_plan(kept, None) {
        Err(RestoreError::Gap { from, to }) if from.0 > 1 && compaction_spans(later, from, to) => {
            let reached = TxId(from.0 - 1);
            tracing::info!(txid = %reached, "the time falls inside a compaction whose first files retention removed: restoring the newest state before it that the replica holds");
            calc_plan(kept, Some(reached))
        }
        planned => planned,
    }
}
