//! Integration tests of the batch planner: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod batches;
mod parity;
mod temperature;
mod training_set;

/// Durations and languages as the benchmarks use them.
pub fn synthetic(n: usize, n_langs: u16, seed: u64, median: f64) -> (Vec<f64>, Vec<u16>) {
    asr_plan::lognormal_zipf(n, n_langs, seed, median)
}
