//! `replicad restore --list`: the restore points of a replica, read from one listing; with
//! `--config`, each snapshot is labelled with the calendar rules of `retention` that keep it.

use anyhow::anyhow;
use chrono::{DateTime, SecondsFormat, Utc};

use super::CliError;
use crate::config::Calendar;
use crate::replicate::maintenance::schedule::calendar_keeps;
use crate::restore::points::restore_points;
use crate::storage::{AnyClient, ReplicaClient};

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Prints the restore points of `client`; `calendar` labels the snapshots it keeps.
pub async fn run(
    client: &AnyClient,
    calendar: Option<Calendar>,
    json: bool,
) -> Result<(), CliError> {
    let files = client.list_all().await.map_err(|e| anyhow!(e))?;
    if files.is_empty() {
        return Err(anyhow!("no backups found on {}", client.location()).into());
    }
    let points = restore_points(&files);
    let labels = calendar
        .filter(Calendar::is_set)
        .map(|c| calendar_keeps(&points.snapshots, c))
        .unwrap_or_default();
    let rules_of = |s: &crate::storage::LtxFileInfo| -> Vec<&'static str> {
        labels
            .iter()
            .find(|(k, _)| k.max_txid == s.max_txid)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    };
    if json {
        let snapshots: Vec<serde_json::Value> = points
            .snapshots
            .iter()
            .map(|s| {
                serde_json::json!({
                    "txid": s.max_txid.to_string(), "stored": at(s.created_at), "rules": rules_of(s),
                })
            })
            .collect();
        let spans: Vec<serde_json::Value> = points
            .spans
            .iter()
            .map(|s| {
                serde_json::json!({
                    "from": s.from.to_string(), "to": s.to.to_string(),
                    "from_stored": at(s.from_stored), "to_stored": at(s.to_stored),
                    "txids": s.to.0 - s.from.0 + 1,
                })
            })
            .collect();
        let v = serde_json::json!({
            "replica": client.location(), "snapshots": snapshots, "spans": spans,
            "txids": points.count(),
        });
        out!("{v}");
        return Ok(());
    }
    out!(
        "restore points of {}: {} snapshot{}, {} TXIDs in {} run{}",
        client.location(),
        points.snapshots.len(),
        if points.snapshots.len() == 1 { "" } else { "s" },
        points.count(),
        points.spans.len(),
        if points.spans.len() == 1 { "" } else { "s" },
    );
    out!("snapshots (each restores on its own: --txid TXID):");
    if points.snapshots.is_empty() {
        out!("  none yet (one is written every snapshot.interval)");
    }
    for s in &points.snapshots {
        let rules = rules_of(s);
        let rules = if rules.is_empty() {
            String::new()
        } else {
            format!("  kept as {}", rules.join(", "))
        };
        out!("  {}  stored {}{rules}", s.max_txid, at(s.created_at));
    }
    out!(
        "TXIDs a restore reaches (--txid TXID for an exact point; the times are when the \
         storage stored each file):"
    );
    for s in &points.spans {
        if s.from == s.to {
            out!("  {}  stored {}", s.from, at(s.from_stored));
        } else {
            out!(
                "  {} .. {}  ({} TXIDs)  stored {} .. {}",
                s.from,
                s.to,
                s.to.0 - s.from.0 + 1,
                at(s.from_stored),
                at(s.to_stored)
            );
        }
    }
    Ok(())
}
