//! The command line: argument parsing and the mapping of failures to exit codes
//! (0 ok, 1 runtime failure, 2 usage or configuration error).

/// `println!` for the commands' output: a stdout that fails returns a runtime error from the
/// enclosing function (where `println!` panics and exits 101), and a reader that left
/// (`| head`) is no failure: the work is done, and was read as far as wanted.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::print_line(format_args!($($arg)*))?
    };
}

mod age_keygen;
mod databases;
pub mod drill;
pub mod golang_flags;
mod ltx;
pub mod replicate;
mod restore;
mod restore_list;
mod snapshot;
mod source;
mod status;
mod sync;
mod verify;

use clap::{Parser, Subcommand};

/// Continuous replication of SQLite databases, and point-in-time restore.
#[derive(Debug, Parser)]
#[command(name = "replicad", version, about, propagate_version = true)]
pub struct Cli {
    /// Log level (error, warn, info, debug, trace); `RUST_LOG` overrides it.
    // Checked here: any other word is a log target for the filter, which then drops every
    // line, errors included.
    #[arg(
        long,
        global = true,
        default_value = "info",
        ignore_case = true,
        value_parser = ["error", "warn", "info", "debug", "trace"]
    )]
    pub log_level: String,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replicate databases continuously (the daemon).
    Replicate(replicate::ReplicateArgs),
    /// Restore a database from a replica, at the latest state or a point in time.
    Restore(restore::RestoreArgs),
    /// List the LTX segments of a replica or of a database's local staging.
    Ltx(ltx::LtxArgs),
    /// List the databases and replicas of a configuration file.
    Databases(databases::DatabasesArgs),
    /// Export a plain SQLite database file (optionally .gz) of a replica's state.
    Snapshot(snapshot::SnapshotArgs),
    /// Check that a replica restores (and, with --config, whether it equals the live database).
    Verify(verify::VerifyArgs),
    /// Show the databases and replica lag of a running daemon (its HTTP endpoint, key `addr`).
    Status(status::StatusArgs),
    /// Make a running daemon sync a database now, optionally waiting for its replicas
    /// (its control socket, key `socket`).
    Sync(sync::SyncArgs),
    /// Generate an age identity (key pair) for encrypted replicas, in age-keygen's format.
    AgeKeygen(age_keygen::AgeKeygenArgs),
}

/// Writes one line of a command's output (see `out!`).
pub(crate) fn print_line(line: std::fmt::Arguments<'_>) -> Result<(), CliError> {
    print_text(&format!("{line}\n"))
}

/// Writes a command's output as it is (see `out!`).
pub(crate) fn print_text(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::anyhow!("write to stdout: {e}").into())
        }
        _ => Ok(()),
    }
}

/// A failure, classified by exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments or configuration: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// The work failed: exit code 1.
    #[error("{0}")]
    Runtime(#[from] anyhow::Error),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Runtime(_) => 1,
        }
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    // The daemon's and the restores' futures are boxed: unboxed, the layout of this one nests
    // every layer of theirs and exceeds the compiler's query depth on a clean build.
    match cli.command {
        Command::Replicate(args) => Box::pin(replicate::run(args)).await,
        Command::Restore(args) => Box::pin(restore::run(args)).await,
        Command::Ltx(args) => ltx::run(args).await,
        Command::Databases(args) => databases::run(args).await,
        Command::Snapshot(args) => until_stopped(Box::pin(snapshot::run(args))).await,
        Command::Verify(args) => until_stopped(Box::pin(verify::run(args))).await,
        Command::Status(args) => status::run(args).await,
        Command::Sync(args) => sync::run(args).await,
        Command::AgeKeygen(args) => age_keygen::run(args).await,
    }
}

/// Runs `work` until SIGINT or SIGTERM. A stop drops it: the restore inside stops its threads,
/// which remove their temporary files before the process exits (see `main`); an output
/// already published as the signal came stays (a stop waits for a publish under way).
async fn until_stopped(work: impl Future<Output = Result<(), CliError>>) -> Result<(), CliError> {
    let stopped = stop_signal().map_err(CliError::Runtime)?;
    tokio::select! {
        // Work that finished as the signal came reports what it wrote.
        biased;
        r = work => r,
        signal = stopped => Err(CliError::Runtime(anyhow::anyhow!(
            "{signal}: stopped before the end; nothing partial is left"
        ))),
    }
}

/// Resolves to the signal's name at the first SIGINT or SIGTERM (handlers installed now).
fn stop_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| anyhow::anyhow!("install SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| anyhow::anyhow!("install SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
