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
    flagpost::idle::set_action(collect_freed_memory);
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

/// When a thread goes quiet, mimalloc collects its heap and purges at once the memory
/// it freed, rather than after its delay the next time the thread allocates: a
/// server going quiet after a burst otherwise keeps the burst's peak resident.
fn collect_freed_memory() {
    // SAFETY: mi_collect takes no pointers and works on the calling thread's heap.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
