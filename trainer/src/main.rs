//! `asrt` command-line entry point: parse, dispatch, map errors to exit codes.

use std::process::ExitCode;

use asr_trainer::Cli;
use clap::Parser;

// Training allocates and frees tensors of tens to hundreds of megabytes per operation. glibc's
// malloc serves those with mmap and returns them with munmap, so every operation page-faults its
// output in again; mimalloc, set up by `allocator::configure_for_training`, keeps freed memory
// for reuse (bench/RESULTS.md, "Allocator").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    #[cfg(not(feature = "system-allocator"))]
    asr_trainer::allocator::configure_for_training();
    let cli = Cli::parse();
    asr_trainer::run_command(&cli).unwrap_or_else(|e| {
        eprintln!("asrt: error: {e:#}");
        ExitCode::from(2)
    })
}
