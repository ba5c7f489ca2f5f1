//! Integration tests of the trainer: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod device_inputs;
mod fused_joint;
mod greedy_device;
mod mel;
mod model_source;
mod nemo;
mod out_of_memory;
mod parallel;
mod plan_cli;
mod resume;
mod tidy;
mod wgpu_training;

/// Durations and languages as the benchmarks use them.
pub fn synthetic(n: usize, n_langs: u16, seed: u64, median: f64) -> (Vec<f64>, Vec<u16>) {
    asr_trainer::lognormal_zipf(n, n_langs, seed, median)
}
