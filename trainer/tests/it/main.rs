//! Integration tests of the trainer's data feed: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod parity;
mod plan_cli;
mod resume;

use asr_corpus::synth::SplitMix64;

/// Durations log-normal (median `median` s, log-sd 0.6) clipped to [0.5, 20], and languages with
/// Zipf(1.1) shares over `n_langs` ids, as the benchmarks use.
pub fn synthetic(n: usize, n_langs: u16, seed: u64, median: f64) -> (Vec<f64>, Vec<u16>) {
    let mut rng = SplitMix64::new(seed);
    let zipf: Vec<f64> = (1..=n_langs).map(|k| 1.0 / f64::from(k).powf(1.1)).collect();
    let total: f64 = zipf.iter().sum();
    let mut durations = Vec::with_capacity(n);
    let mut langs = Vec::with_capacity(n);
    for _ in 0..n {
        // Box-Muller normal.
        let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        durations.push((median.ln() + 0.6 * z).exp().clamp(0.5, 20.0));
        let mut x = rng.next_f64() * total;
        let mut l = 0;
        while l + 1 < zipf.len() && x >= zipf[l] {
            x -= zipf[l];
            l += 1;
        }
        langs.push(l as u16);
    }
    (durations, langs)
}
