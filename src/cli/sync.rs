//! `replicad sync`: asks a running daemon, over its control socket (config key `socket`), to
//! sync a database now (`POST /sync`, see [`crate::ops::control`]); with `--wait`, returns once
//! every replica holds the database's latest TXID. Meant for Kubernetes preStop hooks and
//! backup scripts. Prints the daemon's JSON answer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::CliError;
use super::status::parse_response;
use crate::config::{Config, DEFAULT_SOCKET_PATH};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Margin over `--timeout` for the whole exchange.
const MARGIN: Duration = Duration::from_secs(10);

/// Arguments of `replicad sync`.
#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Database to sync (as named in the daemon's configuration).
    #[arg(value_name = "DB_PATH")]
    pub db: PathBuf,
    /// Wait until every replica holds the database's latest TXID.
    #[arg(long)]
    pub wait: bool,
    /// With --wait, give up after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(..=crate::config::MAX_DURATION.as_secs()))]
    pub timeout: u64,
    /// Path of the daemon's control socket.
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub socket: Option<PathBuf>,
    /// YAML configuration file of the daemon; its `socket.path` key says where to ask.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Runs `replicad sync`.
pub async fn run(args: SyncArgs) -> Result<(), CliError> {
    let socket = match (&args.socket, &args.config) {
        (Some(s), _) => s.clone(),
        (None, Some(path)) => {
            let socket = Config::load_without_credentials(path, true)
                .map_err(|e| CliError::Usage(e.to_string()))?
                .socket;
            if !socket.enabled {
                return Err(CliError::Usage(format!(
                    "{} does not enable the control socket: the daemon it configures cannot \
                     be asked (set `socket: {{enabled: true}}`, or pass --socket PATH)",
                    path.display()
                )));
            }
            socket.path
        }
        (None, None) => PathBuf::from(DEFAULT_SOCKET_PATH),
    };
    let db = std::path::absolute(&args.db)
        .map_err(|e| CliError::Usage(format!("{}: {e}", args.db.display())))?;
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("db", &db.to_string_lossy());
    if args.wait {
        query.append_pair("wait", "true");
        query.append_pair("timeout", &args.timeout.to_string());
    }
    let path = format!("/sync?{}", query.finish());
    let limit = Duration::from_secs(args.timeout) + MARGIN;
    let (code, body) = post(&socket, &path, limit).await?;
    match code {
        200 => {
            super::print_text(&body)?;
            Ok(())
        }
        504 => Err(CliError::Runtime(anyhow!(
            "timed out after {}s waiting for the replicas of {}: {}",
            args.timeout,
            db.display(),
            body.trim()
        ))),
        _ => Err(CliError::Runtime(anyhow!(
            "replicad at {} answered HTTP {code}: {}",
            socket.display(),
            body.trim()
        ))),
    }
}

/// `POST path` over the Unix socket at `socket`: (status code, body).
async fn post(socket: &Path, path: &str, limit: Duration) -> anyhow::Result<(u16, String)> {
    let unreachable = |e: &dyn std::fmt::Display| {
        anyhow!(
            "cannot reach replicad at {}: {e} (is `replicad replicate` running with \
             `socket: {{enabled: true}}`?)",
            socket.display()
        )
    };
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(socket))
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))?;
    let raw = tokio::time::timeout(limit, async {
        stream
            .write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    })
    .await
    .map_err(|_| anyhow!("no answer from replicad at {}", socket.display()))?
    .with_context(|| format!("talking to replicad at {}", socket.display()))?;
    parse_response(&raw).with_context(|| format!("replicad at {}", socket.display()))
}
