//! Synthetic (duration, language) arrays with realistic shapes, for tests and benchmarks of the
//! planner without a corpus: durations log-normal (median and log-sd given) clipped to
//! [0.5, 20] s; languages with Zipf(1.1) shares.

use crate::rng::SplitMix64;

/// `n` durations (log-normal, median `median` s, log-sd 0.6, clipped to [0.5, 20] s) and
/// languages drawn with Zipf(1.1) weights over `n_langs` ids. Deterministic in `seed`.
pub fn lognormal_zipf(n: usize, n_langs: u16, seed: u64, median: f64) -> (Vec<f64>, Vec<u16>) {
    let mut rng = SplitMix64::new(seed);
    let zipf: Vec<f64> = (1..=n_langs.max(1)).map(|k| 1.0 / f64::from(k).powf(1.1)).collect();
    let cumulative: Vec<f64> = zipf
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w;
            Some(*acc)
        })
        .collect();
    let total = cumulative.last().copied().unwrap_or(1.0);
    let mut durations = Vec::with_capacity(n);
    let mut langs = Vec::with_capacity(n);
    for _ in 0..n {
        // Box-Muller: one standard normal from two uniforms.
        let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        durations.push((median.ln() + 0.6 * z).exp().clamp(0.5, 20.0));
        let x = rng.next_f64() * total;
        let l = cumulative.partition_point(|&c| c <= x).min(cumulative.len() - 1);
        langs.push(l as u16);
    }
    (durations, langs)
}
