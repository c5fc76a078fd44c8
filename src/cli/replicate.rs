//! `replicad replicate`: the daemon.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::CliError;
use crate::config::{Config, DbSettings};
use crate::http;
use crate::ltx::Codec;
use crate::store::Store;

/// Arguments of `replicad replicate`.
#[derive(Debug, Args)]
pub struct ReplicateArgs {
    /// Database to replicate (with one or more REPLICA_URLs), instead of --config.
    #[arg(value_name = "DB_PATH")]
    pub db: Option<PathBuf>,
    /// Replica destinations: `file:///abs/path` or a directory path.
    #[arg(value_name = "REPLICA_URL")]
    pub replicas: Vec<String>,
    /// YAML configuration file (see config/replicad.yml).
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with = "db")]
    pub config: Option<PathBuf>,
    /// Do not expand $VAR and ${VAR} in the configuration file.
    #[arg(long)]
    pub no_expand_env: bool,
    /// How often each database's WAL is checked (e.g. 1s, 100ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub monitor_interval: Option<Duration>,
    /// Checkpoint after new data at least this often (0 disables).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Checkpoint when the WAL holds this many pages.
    #[arg(long, value_name = "PAGES")]
    pub min_checkpoint_page_count: Option<u32>,
    /// TRUNCATE checkpoint above this many WAL pages.
    #[arg(long, value_name = "PAGES")]
    pub truncate_page_n: Option<u32>,
    /// Page codec: lz4 (Litestream-compatible), zstd[:LEVEL], gzip[:LEVEL], none.
    #[arg(long, value_name = "CODEC")]
    pub compression: Option<Codec>,
    /// Run the full change verification at least this often even when idle.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub full_verify_interval: Option<Duration>,
    /// How long a shutdown waits for uploads to finish.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_sync_timeout: Option<Duration>,
}

/// Parses durations in Litestream's (Go) syntax: `1s`, `500ms`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (use a unit, e.g. 1s or 500ms)"))
}

impl ReplicateArgs {
    fn overrides(&self, s: &mut DbSettings) {
        if let Some(v) = self.monitor_interval {
            s.monitor_interval = v;
        }
        if let Some(v) = self.checkpoint_interval {
            s.checkpoint_interval = v;
        }
        if let Some(v) = self.min_checkpoint_page_count {
            s.min_checkpoint_page_count = v;
        }
        if let Some(v) = self.truncate_page_n {
            s.truncate_page_n = v;
        }
        if let Some(v) = self.compression {
            s.compression = v;
        }
        if let Some(v) = self.full_verify_interval {
            s.full_verify_interval = v;
        }
    }

    /// The configuration these arguments describe.
    pub fn load_config(&self) -> Result<Config, CliError> {
        let mut config = match (&self.config, &self.db) {
            (Some(path), None) => Config::load(path, !self.no_expand_env)
                .map_err(|e| CliError::Usage(e.to_string()))?,
            (None, Some(db)) => {
                if self.replicas.is_empty() {
                    return Err(CliError::Usage(
                        "replicate DB_PATH needs at least one REPLICA_URL".into(),
                    ));
                }
                let mut settings = DbSettings::default();
                self.overrides(&mut settings);
                Config::single(db.clone(), &self.replicas, settings)
                    .map_err(|e| CliError::Usage(e.to_string()))?
            }
            _ => {
                return Err(CliError::Usage(
                    "replicate needs --config FILE or DB_PATH REPLICA_URL...".into(),
                ));
            }
        };
        for db in &mut config.dbs {
            self.overrides(&mut db.settings);
        }
        if let Some(t) = self.shutdown_sync_timeout {
            config.shutdown_sync_timeout = t;
        }
        Ok(config)
    }
}

/// Runs the daemon until SIGTERM or SIGINT; a second signal aborts the shutdown drain.
pub async fn run(args: ReplicateArgs) -> Result<(), CliError> {
    let config = args.load_config()?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("install SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| anyhow::anyhow!("install SIGINT handler: {e}"))?;
    // Bound before the Store opens: a bad `addr` fails the start, before any replica work.
    let listener = match config.addr {
        Some(addr) => Some(http::bind(addr).await.map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let store = Store::open(&config).await.map_err(|e| anyhow::anyhow!(e))?;
    let http_stop = tokio_util::sync::CancellationToken::new();
    let server = listener.map(|l| {
        if let Ok(a) = l.local_addr() {
            tracing::info!(addr = %a, "http: /metrics /healthz /readyz");
        }
        let status = http::Status::new(&store, config.max_lag);
        tokio::spawn(http::serve(l, status, http_stop.clone()))
    });
    for db in store.dbs() {
        let replicas: Vec<&str> = db.replicas.iter().map(|(n, _)| n.as_str()).collect();
        tracing::info!(db = %db.path.display(), ?replicas, "replicating");
    }
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: final sync and upload"),
        _ = int.recv() => tracing::info!("SIGINT: final sync and upload"),
    }
    let second = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    // The endpoint stays up during the drain: /metrics shows its progress.
    store.shutdown(second).await;
    http_stop.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    Ok(())
}
