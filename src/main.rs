//! The `replicad` binary: parse the command line, set up logging and the runtime, run, and
//! turn the outcome into an exit code (0 ok, 1 runtime failure, 2 usage or config error).
//!
//! `replicate` reads its configuration before logging starts, so that the file's `logging`
//! map can shape it; a configuration error is printed to stderr and exits 2. With `exec`, the
//! exit code is the child's (see [`replicad::cli::replicate::run_config`]).
//!
//! Log level precedence: `RUST_LOG`, then `--log-level` when given on the command line, then
//! the file's `logging.level`, then `info`. Logs always go to stderr.

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use replicad::cli::{self, Cli, Command};
use replicad::config::LogFormat;

fn main() {
    replicad::util::malloc::configure_malloc();
    replicad::replicate::db::configure_sqlite_memory();
    // Litestream-style (Go flag) command lines: `-config FILE` is `--config FILE`.
    let matches = Cli::command()
        .get_matches_from(cli::golang_flags::normalize(std::env::args_os().collect()));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let level_given = matches.value_source("log_level") == Some(ValueSource::CommandLine);
    match cli.command {
        Command::Replicate(args) => {
            let config = args.load_config().unwrap_or_else(|e| fail(&e));
            let level = match (&config.logging.level, level_given) {
                (Some(level), false) => level.as_str(),
                _ => cli.log_level.as_str(),
            };
            init_tracing(level, config.logging.format);
            args.warn_unset_vars();
            let rt = runtime();
            let code = rt
                .block_on(cli::replicate::run_config(config))
                .unwrap_or_else(|e| fail(&e));
            shut_down(rt);
            std::process::exit(code);
        }
        command => {
            init_tracing(&cli.log_level, LogFormat::Text);
            let cli = Cli {
                log_level: cli.log_level,
                command,
            };
            let rt = runtime();
            let result = rt.block_on(cli::run(cli));
            shut_down(rt);
            if let Err(e) = result {
                fail(&e);
            }
        }
    }
}

/// How long the binary waits at exit for blocking work whose owner is gone.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends the runtime, waiting at most [`EXIT_WAIT`] for blocking work: a stopped restore's
/// threads remove their temporary output, while work abandoned for good (a write to a hung
/// NFS replica, say) would hold a plain drop without end.
fn shut_down(rt: tokio::runtime::Runtime) {
    let started = std::time::Instant::now();
    rt.shutdown_timeout(EXIT_WAIT);
    if started.elapsed() >= EXIT_WAIT {
        tracing::warn!(waited = ?EXIT_WAIT, "blocking work was still running at exit; abandoned");
    }
}

/// Prints `e` and exits with its code.
fn fail(e: &cli::CliError) -> ! {
    eprintln!("error: {e}");
    std::process::exit(e.exit_code());
}

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    }
}

/// Logs to stderr at `level` (`RUST_LOG` overrides it) in `format`.
fn init_tracing(level: &str, format: LogFormat) {
    // `--log-level DEBUG` is accepted as typed.
    let level = level.to_ascii_lowercase();
    let level = level.as_str();
    // The AWS SDK's and reqsign's credential chains warn once per provider they try; what
    // matters reaches the user as one error line, so their own logs show only at debug.
    let sdk_quiet = if matches!(level, "debug" | "trace") {
        ""
    } else {
        ",aws_config=off,aws_smithy_runtime=off,reqsign_core=off"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level}{sdk_quiet}")));
    // At trace the request signer logs every header as it is, an SSE-C key among them: never,
    // whatever RUST_LOG asks (a filter of its own, which no directive, however narrow, undoes).
    let no_signer_trace = tracing_subscriber::filter::filter_fn(|m| {
        !(*m.level() == tracing::Level::TRACE && m.target().starts_with("aws_sigv4"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            // Colour only on a terminal: logs in files and journals stay plain text.
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .finish()
            .with(no_signer_trace)
            .init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .finish()
            .with(no_signer_trace)
            .init(),
    }
}
