//! Integration tests of the trainer: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod device_inputs;
mod fused_joint;
mod greedy_device;
mod hf;
mod mel;
mod model_source;
mod nemo;
mod out_of_memory;
mod padded;
mod parallel;
mod plan_cli;
mod precision;
mod resume;
mod tidy;
mod transcribe;
mod wgpu_training;

/// The Python of an optional reference tool: `$env`, else `~/.cache/VENV/bin/python`, when it
/// runs `check` (a `python -c` program importing what the test needs).
pub fn venv_python(env: &str, venv: &str, check: &str) -> Option<std::path::PathBuf> {
    let p = std::env::var_os(env).map(std::path::PathBuf::from).or_else(|| {
        std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache").join(venv).join("bin/python"))
    })?;
    let ok = std::process::Command::new(&p)
        .args(["-c", check])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// Durations and languages as the benchmarks use them.
pub fn synthetic(n: usize, n_langs: u16, seed: u64, median: f64) -> (Vec<f64>, Vec<u16>) {
    asr_trainer::lognormal_zipf(n, n_langs, seed, median)
}

/// Every test of this binary holds this while it runs, so they take turns. Many train models
/// on the CPU backend, and a thread's training shares with every other thread of the process
/// Burn's global state (the backend's generator, the autodiff graph server) and rayon's pool,
/// whose reductions split work by the threads' timing. One run of the suite saw the
/// data-parallel comparison (`parallel::four_ranks_...`, normally 99.75 % of parameters within
/// 1e-6, the same in 4 runs alone) fail with another test training beside it; taking turns
/// removes that coupling from the comparisons.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked holding the lock has failed already; the next one may run.
    TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The example's SentencePiece model (`examples/espeak/spm.model`), for corpora whose
/// hypotheses must decode to text.
pub fn example_spm() -> Vec<u8> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    std::fs::read(std::path::Path::new(&dir).join("../examples/espeak/spm.model"))
        .expect("the example's spm.model")
}
