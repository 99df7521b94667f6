//! The `flagpost` binary: parse flags, set up logging, run the library, map the
//! outcome to an exit code.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli: cli::Cli = argh::from_env();
    if cli.version {
        println!("flagpost {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLAGPOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(cli.default_log_level())),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, never into journald.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flagpost: {e}");
            ExitCode::FAILURE
        }
    }
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
