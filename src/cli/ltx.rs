//! `replicad ltx`: lists the segments of a replica or of a database's staging.

use std::path::Path;

use anyhow::anyhow;
use clap::Args;

use super::CliError;
use crate::replica_client::{AnyClient, ReplicaClient};

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
        let meta = crate::db::default_meta_path(as_db);
        AnyClient::from_url(&meta.display().to_string()).map_err(CliError::Usage)?
    } else {
        // Seen through both plain and `.ltx.age` names (listing needs no key).
        AnyClient::from_url(&args.target)
            .map_err(CliError::Usage)?
            .with_age(Default::default())
    };
    let files = client.list_all().await.map_err(|e| anyhow!(e))?;
    if args.json {
        let rows: Vec<_> = files
            .iter()
            .map(|f| {
                serde_json::json!({
                    "level": f.level, "min_txid": f.min_txid.to_string(), "max_txid": f.max_txid.to_string(),
                    "size": f.size, "created": f.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "encrypted": f.encrypted,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "{:<6} {:<17} {:<17} {:>12}  created",
        "level", "min_txid", "max_txid", "size"
    );
    for f in &files {
        println!(
            "{:<6} {:<17} {:<17} {:>12}  {}{}",
            f.level,
            f.min_txid.to_string(),
            f.max_txid.to_string(),
            f.size,
            f.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            if f.encrypted { "  age" } else { "" }
        );
    }
    eprintln!("{} files on {}", files.len(), client.location());
    Ok(())
}
