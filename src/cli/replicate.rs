//! `replicad replicate`: the daemon.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use rustix::process::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::CliError;
use crate::config::{Config, DbSettings};
use crate::daemon::Store;
use crate::ltx::Codec;
use crate::ops::notify::{self, Notify};
use crate::ops::{control, http};

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
    /// Ship a busy database at most this often (0s: every commit at once).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub min_sync_interval: Option<Duration>,
    /// Checkpoint after new data at least this often (0 disables).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub checkpoint_interval: Option<Duration>,
    /// Checkpoint when the WAL holds this many pages.
    #[arg(long, value_name = "PAGES")]
    pub min_checkpoint_page_count: Option<u32>,
    /// TRUNCATE checkpoint above this many WAL pages.
    #[arg(long, value_name = "PAGES")]
    pub truncate_page_n: Option<u32>,
    /// Page codec: lz4 (Litestream-compatible), zstd or zstd:LEVEL, gzip or gzip:LEVEL, none.
    #[arg(long, value_name = "CODEC")]
    pub compression: Option<Codec>,
    /// Run the full change verification at least this often even when idle.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub full_verify_interval: Option<Duration>,
    /// How long a shutdown waits for uploads to finish.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_sync_timeout: Option<Duration>,
    /// Run CMD as a child once every database is open (split with shell rules, no shell);
    /// SIGTERM/SIGINT are forwarded to it, and when it exits replicad does its final sync and
    /// exits with the child's exit code. Replaces the config file's `exec`.
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
}

/// Parses durations in Litestream's (Go) syntax: `1s`, `500ms`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::config::parse_duration(s)
        .map_err(|e| format!("{s:?}: {e} (use a unit, e.g. 1s or 500ms)"))
}

impl ReplicateArgs {
    fn overrides(&self, s: &mut DbSettings) {
        if let Some(v) = self.monitor_interval {
            s.monitor_interval = v;
        }
        if let Some(v) = self.min_sync_interval {
            s.min_sync_interval = v;
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

    /// Says which variables the config file names and the environment does not set (once
    /// logging is up: [`ReplicateArgs::load_config`] runs before it).
    pub fn warn_unset_vars(&self) {
        if let (Some(path), false) = (&self.config, self.no_expand_env)
            && let Ok(text) = std::fs::read_to_string(path)
        {
            crate::config::warn_unset_vars(&text, &path.display().to_string());
        }
    }

    /// The configuration these arguments describe.
    pub fn load_config(&self) -> Result<Config, CliError> {
        let mut config = match (&self.config, &self.db) {
            (Some(path), None) => {
                let config = Config::load(path, !self.no_expand_env)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                config
                    .check_dirs()
                    .map_err(|e| CliError::Usage(format!("config {}: {e}", path.display())))?;
                config
            }
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
        config.check_local_replicas().map_err(CliError::Usage)?;
        // Checked again: the file's checks ran before these values replaced its own.
        let invalid = |e: String| CliError::Usage(format!("command line: {e}"));
        for db in &mut config.dbs {
            self.overrides(&mut db.settings);
            db.settings.validate().map_err(invalid)?;
        }
        for dir in &mut config.dirs {
            self.overrides(&mut dir.settings);
            dir.settings.validate().map_err(invalid)?;
        }
        if self.compression.is_some() {
            let dbs = config.dbs.iter_mut().map(|d| &mut d.codec);
            for codec in dbs.chain(config.dirs.iter_mut().map(|d| &mut d.codec)) {
                *codec = crate::config::CodecOrigin::Set;
            }
        }
        if let Some(t) = self.shutdown_sync_timeout {
            config.shutdown_sync_timeout = t;
        }
        if let Some(cmd) = &self.exec {
            config.exec = Some(
                crate::config::split_exec(cmd)
                    .map_err(|e| CliError::Usage(format!("--exec: {e}")))?,
            );
        }
        Ok(config)
    }
}

/// Runs the daemon until SIGTERM or SIGINT (or, with `exec`, until the child exits); a
/// second signal aborts the shutdown drain. A child that exits non-zero is an error here;
/// the binary uses [`run_config`] to exit with the child's own code.
pub async fn run(args: ReplicateArgs) -> Result<(), CliError> {
    let config = args.load_config()?;
    match run_config(config).await? {
        0 => Ok(()),
        code => Err(CliError::Runtime(anyhow::anyhow!(
            "the exec command exited with code {code}"
        ))),
    }
}

/// Runs the daemon of `config` and returns the process exit code: 0 after a signal, or the
/// `exec` child's exit code (128+N when a signal N killed it; Litestream exits 1 for any
/// failure instead) once the child has exited and the shutdown drain is over.
///
/// With `exec`, the child starts once every database is open; SIGTERM and SIGINT are
/// forwarded to it, and the daemon shuts down when it exits. Without a child, the first signal
/// starts the shutdown. Either way a further signal during the drain aborts it. systemd is
/// notified along the way when `NOTIFY_SOCKET` is set ([`crate::ops::notify`]).
pub async fn run_config(config: Config) -> Result<i32, CliError> {
    // Read before anything binds: a malformed drill spec is a usage error.
    let drill = super::drill::wrapper_from_env().map_err(CliError::Usage)?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("install SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| anyhow::anyhow!("install SIGINT handler: {e}"))?;
    // Bound before the Store opens: a bad `addr` fails the start, before any replica work.
    let listener = match config.addr {
        Some(addr) => Some(http::bind(addr).await.map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let control_listener = if config.socket.enabled {
        Some(control::bind(&config.socket).map_err(|e| anyhow::anyhow!(e))?)
    } else {
        None
    };
    // Past this many open connections (and claims), idle databases go dormant at once rather
    // than after `dormant-after`.
    let budget = raise_fd_limit().map(|limit| {
        (limit.saturating_sub(1024) / crate::replicate::db::FDS_PER_AWAKE as u64) as usize
    });
    let store = Store::open_budgeted(&config, drill, budget)
        .await
        .map_err(|e| match e {
            e if e.is_config() => CliError::Usage(e.to_string()),
            e => CliError::Runtime(anyhow::anyhow!(e)),
        })?;
    let control_stop = tokio_util::sync::CancellationToken::new();
    let control_server = control_listener.map(|l| {
        tracing::info!(path = %config.socket.path.display(), "control socket: POST /sync");
        tokio::spawn(control::serve(
            l,
            store.registry().clone(),
            control_stop.clone(),
        ))
    });
    let http_stop = tokio_util::sync::CancellationToken::new();
    let server = listener.map(|l| {
        if let Ok(a) = l.local_addr() {
            tracing::info!(addr = %a, "http: /metrics /healthz /readyz /status");
        }
        let status = http::Status::new(&store, config.max_lag);
        tokio::spawn(http::serve(l, status, http_stop.clone()))
    });
    warn_sparse_calendar(&config);
    for db in store.registry().snapshot().iter() {
        let replicas: Vec<&str> = db.replicas.iter().map(|(n, _)| n.as_str()).collect();
        tracing::info!(db = %db.path.display(), ?replicas, "replicating");
    }
    let notify = Notify::start(store.registry().clone(), config.max_lag, store.started_ms());
    let alerts = crate::ops::alerts::Alerts::start(&config.notify, &store, config.max_lag);
    let mut failure = None;
    let code = match &config.exec {
        None => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: final sync and upload"),
                _ = int.recv() => tracing::info!("SIGINT: final sync and upload"),
            }
            0
        }
        Some(argv) => match spawn_child(argv) {
            Ok(child) => supervise(child, &mut term, &mut int).await,
            Err(e) => {
                failure = Some(e);
                1
            }
        },
    };
    if let Some(n) = &notify {
        n.stopping();
    }
    let second = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    // The endpoint stays up during the drain: /metrics shows its progress.
    // Kept during the drain as well: a preStop `replicad sync --wait` may still be waiting.
    let unprotected = store.shutdown(second).await;
    control_stop.cancel();
    if let Some(server) = control_server {
        let _ = server.await;
    }
    http_stop.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    if let Some(n) = notify {
        n.finish();
    }
    if let Some(a) = alerts {
        let mut left = unprotected.clone();
        if let Some(e) = &failure {
            left.push(format!("exec: {e}"));
        }
        // Signals were taken by the drain: listen again, so that one more cuts the wait.
        let abort = async {
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut t), Ok(mut i)) => tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                },
                _ => std::future::pending().await,
            }
        };
        a.finish(&left, abort).await;
    }
    match failure {
        Some(e) => Err(CliError::Runtime(e)),
        None if !unprotected.is_empty() => Err(CliError::Runtime(anyhow::anyhow!(
            "shutdown left {} thing{} not fully protected:\n  {}",
            unprotected.len(),
            if unprotected.len() == 1 { "" } else { "s" },
            unprotected.join("\n  ")
        ))),
        None => Ok(code),
    }
}

/// Calendar rules finer than the snapshots they pick from keep fewer points than they say:
/// said once at start (the keys are top level only, so every database has the same).
fn warn_sparse_calendar(config: &Config) {
    let Some(s) = config
        .dbs
        .iter()
        .map(|d| &d.settings)
        .chain(config.dirs.iter().map(|d| &d.settings))
        .next()
    else {
        return;
    };
    if s.calendar.is_set() && !s.retention_enabled {
        tracing::warn!(
            "retention.enabled is false: nothing is ever deleted, so the calendar rules \
             (hourly/daily/weekly/monthly) change nothing"
        );
    }
    for (rule, n, period) in [
        ("hourly", s.calendar.hourly, Duration::from_secs(3600)),
        ("daily", s.calendar.daily, Duration::from_secs(86_400)),
        ("weekly", s.calendar.weekly, Duration::from_secs(7 * 86_400)),
    ] {
        if n > 0 && s.snapshot_interval > period {
            tracing::warn!(
                "retention.{rule}: {n} points, but a snapshot is written every {}: they will \
                 be that far apart and span about {} (snapshot.interval {} or less gives one \
                 per period)",
                humantime::format_duration(s.snapshot_interval),
                humantime::format_duration(s.snapshot_interval.saturating_mul(n)),
                humantime::format_duration(period)
            );
        }
    }
}

/// Starts the `exec` child: our environment (minus the systemd notification variables),
/// stdin, stdout and stderr.
fn spawn_child(argv: &[String]) -> Result<Child, anyhow::Error> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("the exec command is empty"))?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    for var in notify::CHILD_ENV_REMOVE {
        cmd.env_remove(var);
    }
    let child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the exec command {program:?}: {e}"))?;
    // The program alone: its arguments may hold a token the config expanded.
    tracing::info!(pid = child.id(), program = %program, args = args.len(), "exec: child started");
    Ok(child)
}

/// Waits for the child, forwarding SIGTERM and SIGINT to it; returns its exit code.
async fn supervise(mut child: Child, term: &mut Signal, int: &mut Signal) -> i32 {
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw);
    loop {
        let (name, sig) = tokio::select! {
            status = child.wait() => return match status {
                Ok(status) => {
                    let code = exit_code(status);
                    tracing::info!(%status, code, "exec: child exited; final sync and upload");
                    code
                }
                Err(e) => {
                    tracing::error!(error = %e, "exec: waiting for the child failed");
                    1
                }
            },
            _ = term.recv() => ("SIGTERM", rustix::process::Signal::TERM),
            _ = int.recv() => ("SIGINT", rustix::process::Signal::INT),
        };
        tracing::info!("{name}: forwarding it to the exec child and waiting for it to exit");
        if let Some(pid) = pid
            && let Err(e) = rustix::process::kill_process(pid, sig)
        {
            tracing::warn!(error = %e, "exec: cannot signal the child");
        }
    }
}

/// A child's exit code, or 128+N when signal N killed it (as shells report it).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// Raises the open-file limit: each awake database holds about five descriptors (database,
/// WAL, shared memory, its claim, a replica connection or file), so 10,000 need 50,000, far above
/// the usual soft limit of 1024. The soft limit goes to the hard one; with CAP_SYS_RESOURCE
/// (root), both go to the kernel's per-process maximum (`fs.nr_open`). Go's runtime (so
/// Litestream) raises only the soft limit.
/// Returns the soft limit in force afterwards (None: unlimited).
fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let before = getrlimit(Resource::Nofile);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let hard = before.maximum;
    let wanted = match (nr_open, hard) {
        (Some(n), Some(h)) if n > h => Some(n),
        _ => hard,
    };
    let raised = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: wanted,
            maximum: wanted,
        },
    )
    .or_else(|_| {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: hard,
                maximum: hard,
            },
        )
    });
    let after = getrlimit(Resource::Nofile);
    match raised {
        Ok(()) => {
            tracing::debug!(soft = ?after.current, hard = ?after.maximum, "open-file limit raised")
        }
        Err(e) => {
            tracing::warn!(error = %e, soft = ?before.current, "could not raise the open-file limit")
        }
    }
    after.current
}
