//! `replicad databases`: lists configured databases and their replicas, with the databases
//! that `dir` entries find now ([`crate::daemon::discovery`]).

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use crate::config::Config;
use crate::daemon::discovery::Discovery;

/// Arguments of `replicad databases`.
#[derive(Debug, Args)]
pub struct DatabasesArgs {
    /// YAML configuration file.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Do not expand $VAR and ${VAR} in the configuration file.
    #[arg(long)]
    pub no_expand_env: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `replicad databases`.
pub async fn run(args: DatabasesArgs) -> Result<(), CliError> {
    let mut config = Config::load_without_credentials(&args.config, !args.no_expand_env)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    for dir in &config.dirs {
        let discovery = Discovery::new(dir.clone()).map_err(CliError::Usage)?;
        for path in discovery.scan(&|_| false) {
            if config.dbs.iter().any(|d| d.path == path) {
                continue;
            }
            if let Ok(rel) = path.strip_prefix(&dir.dir) {
                config.dbs.push(dir.db(rel));
            }
        }
    }
    if args.json {
        let rows: Vec<_> = config
            .dbs
            .iter()
            .map(|d| {
                let replicas: Vec<_> = d
                    .replicas
                    .iter()
                    .map(|r| serde_json::json!({"name": r.name, "url": r.url}))
                    .collect();
                serde_json::json!({"path": d.path, "replicas": replicas})
            })
            .collect();
        out!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    out!("{:<40} {:<12} url", "path", "replica");
    for d in &config.dbs {
        for r in &d.replicas {
            out!("{:<40} {:<12} {}", d.path.display(), r.name, r.url);
        }
    }
    Ok(())
}
