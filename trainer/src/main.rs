//! `asrt` command-line entry point (`asr_trainer::cli_main`: parse, dispatch, map errors to exit
//! codes), with the allocator training wants.

use std::process::ExitCode;

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
    asr_trainer::cli_main()
}
