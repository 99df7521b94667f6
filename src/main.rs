//! The `flagpost` binary: parse flags, set up logging, run the library, map the
//! outcome to an exit code.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::allocator::start_report();
    // The allocator serves the heaps of `support::heaps`.
    flagpost::support::heaps::enable();
    disable_transparent_huge_pages();
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
    flagpost::support::idle::set_action(collect_freed_memory);
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flagpost: {e}");
            ExitCode::FAILURE
        }
    }
}

#[global_allocator]
static ALLOCATOR: cli::allocator::Counting = cli::allocator::Counting;

/// Opt this process out of transparent huge pages, before the allocator maps much.
/// mimalloc advises huge pages for its arenas, and a 2 MiB huge page stays resident
/// while any part of it is in use, so memory the allocator purges after a burst is
/// not given back. After a million events, 44 MiB of the resident set at rest were
/// huge pages; without them it fell from about 150 MiB to about 105 MiB.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes a flag of
    // this process; it fails harmlessly (EINVAL) on kernels without it.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// When a thread goes quiet, mimalloc collects its heap and purges at once the memory
/// it freed, rather than after its delay the next time the thread allocates: a
/// server going quiet after a burst otherwise keeps the burst's peak resident.
fn collect_freed_memory() {
    // SAFETY: mi_collect takes no pointers and works on the calling thread's heap.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
