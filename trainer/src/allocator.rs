//! The process allocator's settings for training (the only `unsafe` code in the trainer).
//!
//! `asrt` allocates through mimalloc (`main.rs`). A training step allocates and frees tensors of
//! tens to hundreds of megabytes per operation; by default mimalloc gives freed memory back to
//! the kernel after a second (its "purge"), and the next operation then page-faults the same amount
//! in again, zero-filled by the kernel. Training reaches its peak footprint within a step and
//! stays there, so keeping freed memory mapped costs nothing and saves that system time
//! (bench/RESULTS.md, "Allocator"). An `MIMALLOC_PURGE_DELAY` or `MIMALLOC_ARENA_EAGER_COMMIT`
//! in the environment still takes precedence.

use std::os::raw::c_long;

/// `mi_option_arena_eager_commit` in mimalloc 3's `mimalloc.h` (`libmimalloc-sys` 0.1.49 does
/// not name it); the test below pins the number to the option through its documented default.
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
/// `mi_option_purge_delay` in mimalloc 3's `mimalloc.h`: milliseconds before freed memory is
/// returned to the kernel, -1 for never.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory mapped for reuse and commits arenas eagerly. Call once at start-up, before
/// other threads allocate.
pub fn configure_for_training() {
    set_default(PURGE_DELAY, -1);
    set_default(ARENA_EAGER_COMMIT, 1);
}

fn set_default(option: libmimalloc_sys::mi_option_t, value: c_long) {
    // SAFETY: `mi_option_set_default` writes one word of mimalloc's option table and is only
    // "not thread safe" against concurrent option writes; this module is the only writer and
    // runs before the trainer starts threads. The option numbers are checked by the test below.
    unsafe { libmimalloc_sys::mi_option_set_default(option, value) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(option: libmimalloc_sys::mi_option_t) -> c_long {
        // SAFETY: reading an option has no preconditions.
        unsafe { libmimalloc_sys::mi_option_get(option) }
    }

    // The option numbers are positions in a C enum that the binding does not export: if a
    // mimalloc upgrade moved them, these defaults (options.c: purge_delay 1000 ms,
    // arena_eager_commit 2) would no longer read back, and the settings above would change some other option.
    #[test]
    fn option_numbers_name_the_options_they_mean() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(PURGE_DELAY), 1000);
        }
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
            assert_eq!(get(ARENA_EAGER_COMMIT), 2);
        }
    }
}
