//! `replicad ltx`: lists the segments of a replica or of a database's staging, each with its
//! TXID range, size, its own timestamp (the header's, which `restore --timestamp` compares)
//! and when it was stored.

use std::path::Path;

use anyhow::anyhow;
use clap::Args;
use futures_util::StreamExt;

use super::CliError;
use crate::storage::{AnyClient, ReplicaClient};

/// Arguments of `replicad ltx`.
#[derive(Debug, Args)]
pub struct LtxArgs {
    /// A replica URL, or a database path (lists its local staging).
    #[arg(value_name = "REPLICA_URL|DB_PATH")]
    pub target: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `replicad ltx`.
pub async fn run(args: LtxArgs) -> Result<(), CliError> {
    let as_db = Path::new(&args.target);
    let client = if as_db.is_file() {
        let meta = crate::replicate::db::default_meta_path(as_db);
        AnyClient::from_url(&meta.display().to_string()).map_err(CliError::Usage)?
    } else {
        // Seen through both plain and `.ltx.age` names (listing needs no key).
        AnyClient::from_url(&args.target)
            .map_err(CliError::Usage)?
            .with_age(Default::default())
    };
    // An empty listing of a directory that is not there would read as a replica with nothing.
    if let Some(root) = client.local_root().filter(|r| !r.exists()) {
        return Err(CliError::Runtime(anyhow!(
            "{} does not exist (a typo? for a database, its staging: has it been replicated \
             here?)",
            root.display()
        )));
    }
    let files = client.list_all().await.map_err(|e| anyhow!(e))?;
    // The segment's own time (its header's, the one `restore --timestamp` uses), read with a
    // few requests at a time; an encrypted file without its identity shows none.
    let stamps: Vec<Option<i64>> = futures_util::stream::iter(&files)
        .map(|f| {
            let client = &client;
            async move { client.read_header(f).await.ok().map(|h| h.timestamp) }
        })
        .buffered(HEADER_READS)
        .collect()
        .await;
    let time = |ms: Option<i64>| {
        ms.and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    };
    if args.json {
        let rows: Vec<_> = files
            .iter()
            .zip(&stamps)
            .map(|(f, ts)| {
                serde_json::json!({
                    "level": f.level, "min_txid": f.min_txid.to_string(), "max_txid": f.max_txid.to_string(),
                    "size": f.size, "timestamp": time(*ts),
                    "stored": f.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "encrypted": f.encrypted,
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    out!(
        "{:<6} {:<17} {:<17} {:>12}  {:<24}  stored",
        "level",
        "min_txid",
        "max_txid",
        "size",
        "timestamp"
    );
    for (f, ts) in files.iter().zip(&stamps) {
        out!(
            "{:<6} {:<17} {:<17} {:>12}  {:<24}  {}{}",
            f.level,
            f.min_txid.to_string(),
            f.max_txid.to_string(),
            f.size,
            time(*ts).unwrap_or_else(|| "-".into()),
            f.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            if f.encrypted { "  age" } else { "" }
        );
    }
    let plural = if files.len() == 1 { "" } else { "s" };
    eprintln!("{} file{plural} on {}", files.len(), client.location());
    Ok(())
}

/// Header reads in flight at once.
const HEADER_READS: usize = 16;
