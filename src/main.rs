//! The `replicad` binary: parse the command line, set up logging and the runtime, run, and
//! turn the outcome into an exit code (0 ok, 1 runtime failure, 2 usage or config error).

use std::io::IsTerminal;

use clap::Parser;
use replicad::cli::{self, Cli};

fn main() {
    // Litestream-style (Go flag) command lines: `-config FILE` is `--config FILE`.
    let cli = Cli::parse_from(cli::golang_flags::normalize(std::env::args_os().collect()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal: logs in files and journals stay plain text.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(cli::run(cli)) {
        eprintln!("error: {e}");
        std::process::exit(e.exit_code());
    }
}
