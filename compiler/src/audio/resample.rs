//! Resampling to 16 kHz: a linear-phase Kaiser-windowed low-pass applied by FFT (overlap-save),
//! with the rate change done in the frequency domain.
//!
//! The filter is designed for the band that both rates carry, `B = min(rate, 16 kHz) / 2`: flat
//! to `0.925 B` (ripple below 0.001 dB), half power near `0.955 B`, and 110 dB down from
//! `0.99 B` (Kaiser window). That is the shape of sox's very-high-quality `rate` (from 48 kHz,
//! sox: -3.0 dB at 7.6 kHz, -19.8 dB at 7.75 kHz, -67 dB at 7.9 kHz; this filter: -2.2, -18.3
//! and -79 dB), and more than the 90 dB from `B` up that a 16 kHz corpus needs;
//! `compiler/tests/it/resample.rs` measures both tools per input rate. Output sample `k`
//! is the filtered signal at input position `k * rate / 16000`, so the first output sample is
//! aligned with the first input sample; outside the file the signal is taken as silence.
//!
//! How: with `rate / 16000 = M / L` in lowest terms, the input is cut into blocks of `c M`
//! samples, each read with `P` samples of context on either side (`P` at least the filter's half
//! length, a multiple of `M`). A block's real FFT of `N_in = (c + 2P/M) M` points is multiplied by
//! the filter's response, cut (or zero-padded) to the `N_out = (c + 2P/M) L` points of the output
//! grid, and transformed back; the middle `c L` output samples are exact, the context is
//! discarded. `c` is chosen so that both FFT lengths are even with prime factors of at most 7
//! where the rates allow. A resampler is cheap to reuse and costs a few FFT plans to build, so
//! [`Resampler`] keeps one per input rate; use one per thread.

use std::collections::HashMap;
use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{ComplexToReal, RealFftPlanner, RealToComplex};

/// The corpus sample rate.
pub const TARGET_RATE: u32 = 16_000;

/// Highest input rate taken (FLAC allows up to 1 048 575 Hz; real audio stops at 768 kHz).
const MAX_RATE: u32 = 768_000;
/// Stopband attenuation the filter is designed for, in dB.
const ATTENUATION_DB: f64 = 110.0;
/// Passband edge as a fraction of the shared band `B`.
const PASSBAND: f64 = 0.925;
/// Stopband edge as a fraction of the shared band `B`.
const STOPBAND: f64 = 0.99;

/// Why audio could not be resampled.
#[derive(Debug, thiserror::Error)]
pub enum ResampleError {
    /// The input rate cannot be resampled (zero, or absurdly high).
    #[error("cannot resample from {rate} Hz to {TARGET_RATE} Hz: {reason}")]
    Rate {
        /// The input rate.
        rate: u32,
        /// Why not.
        reason: String,
    },
}

/// Resamples mono f32 audio to 16 kHz, caching one [`Plan`] per input rate.
#[derive(Default)]
pub struct Resampler {
    by_rate: HashMap<u32, Plan>,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("rates", &self.by_rate.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Resampler {
    /// A resampler with no cached state.
    pub fn new() -> Resampler {
        Resampler::default()
    }

    /// `samples` at `rate` Hz, resampled to 16 kHz: `round(n * 16000 / rate)` samples, aligned
    /// with the input. Audio already at 16 kHz is returned unchanged.
    pub fn to_target(&mut self, samples: &[f32], rate: u32) -> Result<Vec<f32>, ResampleError> {
        if rate == TARGET_RATE {
            return Ok(samples.to_vec());
        }
        if rate == 0 || rate > MAX_RATE {
            return Err(ResampleError::Rate {
                rate,
                reason: format!("the rate must be between 1 and {MAX_RATE} Hz"),
            });
        }
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.by_rate.entry(rate).or_insert_with(|| Plan::new(rate)).run(samples))
    }
}

/// Samples at 16 kHz for `n` samples at `rate`, rounded to nearest.
pub fn output_len(n: usize, rate: u32) -> usize {
    let (n, rate) = (n as u128, u128::from(rate));
    ((n * u128::from(TARGET_RATE) + rate / 2) / rate) as usize
}

/// Everything one input rate needs: block geometry, FFT plans, the filter's response and
/// scratch buffers.
struct Plan {
    /// The input rate.
    rate: u32,
    /// Input samples per output block of `out_hop` samples (`c M`).
    in_hop: usize,
    /// Output samples per block (`c L`).
    out_hop: usize,
    /// Input context on each side of a block (`P`).
    context: usize,
    /// Output samples that correspond to the leading context (`P L / M`).
    out_context: usize,
    forward: Arc<dyn RealToComplex<f32>>,
    inverse: Arc<dyn ComplexToReal<f32>>,
    /// The filter's real, zero-phase response on the bins both spectra share, including the
    /// 1 / N_in the unnormalised transforms leave; zero at the last shared bin (it is a Nyquist
    /// bin of one of the grids, and the filter is 100 dB down there anyway).
    response: Vec<f32>,
    time_in: Vec<f32>,
    spectrum_in: Vec<Complex<f32>>,
    spectrum_out: Vec<Complex<f32>>,
    time_out: Vec<f32>,
    scratch_forward: Vec<Complex<f32>>,
    scratch_inverse: Vec<Complex<f32>>,
}

impl Plan {
    fn new(rate: u32) -> Plan {
        let g = gcd(rate, TARGET_RATE);
        let (m, l) = ((rate / g) as usize, (TARGET_RATE / g) as usize);
        let taps = kaiser_half_length(rate);
        let context = taps.div_ceil(m) * m;
        let blocks = block_count(m, l, taps, context);
        let (n_in, n_out) = (blocks * m, blocks * l);
        let context_blocks = 2 * context / m;
        let c = blocks - context_blocks;

        let mut planner = RealFftPlanner::<f32>::new();
        let forward = planner.plan_fft_forward(n_in);
        let inverse = planner.plan_fft_inverse(n_out);
        let shared = n_in.min(n_out) / 2 + 1;
        let response = filter_response(rate, taps, n_in, shared);
        Plan {
            rate,
            in_hop: c * m,
            out_hop: c * l,
            context,
            out_context: context / m * l,
            time_in: forward.make_input_vec(),
            spectrum_in: forward.make_output_vec(),
            scratch_forward: forward.make_scratch_vec(),
            spectrum_out: inverse.make_input_vec(),
            time_out: inverse.make_output_vec(),
            scratch_inverse: inverse.make_scratch_vec(),
            forward,
            inverse,
            response,
        }
    }

    fn run(&mut self, x: &[f32]) -> Vec<f32> {
        let rate_len = output_len(x.len(), self.rate);
        let mut out = Vec::with_capacity(rate_len + self.out_hop);
        let mut start = 0usize; // input position of the block's first valid sample
        while out.len() < rate_len {
            // The block reads x[start - P .. start + in_hop + P], silence outside the file.
            self.time_in.fill(0.0);
            let from = start.saturating_sub(self.context);
            let to = (start + self.in_hop + self.context).min(x.len());
            if from < to {
                let at = from + self.context - start;
                self.time_in[at..at + (to - from)].copy_from_slice(&x[from..to]);
            }
            // The lengths are the plan's own; the transforms cannot fail on them.
            self.forward
                .process_with_scratch(
                    &mut self.time_in,
                    &mut self.spectrum_in,
                    &mut self.scratch_forward,
                )
                .expect("buffers made by the plan have the plan's lengths");
            self.spectrum_out.fill(Complex::new(0.0, 0.0));
            for ((y, &xk), &h) in
                self.spectrum_out.iter_mut().zip(&self.spectrum_in).zip(&self.response)
            {
                *y = xk * h;
            }
            // A real signal's DC and Nyquist bins are real; drop rounding noise there.
            self.spectrum_out[0].im = 0.0;
            if let Some(last) = self.spectrum_out.last_mut() {
                last.im = 0.0;
            }
            self.inverse
                .process_with_scratch(
                    &mut self.spectrum_out,
                    &mut self.time_out,
                    &mut self.scratch_inverse,
                )
                .expect("buffers made by the plan have the plan's lengths, DC and Nyquist real");
            let valid = &self.time_out[self.out_context..self.out_context + self.out_hop];
            let keep = valid.len().min(rate_len - out.len());
            out.extend_from_slice(&valid[..keep]);
            start += self.in_hop;
        }
        out
    }
}

/// The filter's half length in input samples for `rate`: Kaiser's estimate of the length that
/// reaches [`ATTENUATION_DB`] over the transition band `[PASSBAND B, STOPBAND B]`.
fn kaiser_half_length(rate: u32) -> usize {
    let band = f64::from(rate.min(TARGET_RATE)) / 2.0;
    let transition = 2.0 * std::f64::consts::PI * (STOPBAND - PASSBAND) * band / f64::from(rate);
    let length = (ATTENUATION_DB - 7.95) / (2.285 * transition);
    (length / 2.0).ceil() as usize + 1
}

/// The FFT length in units of the reduced rates: `k` such that `N_in = k M` and `N_out = k L`.
/// The two contexts plus at least 8 times the filter's length and 8192 input samples of output
/// (so that most of each FFT is output), even, and with prime factors of at most 7 when there is
/// such a `k` close above (rustfft is several times slower on lengths with a large prime factor).
fn block_count(m: usize, l: usize, half: usize, context: usize) -> usize {
    let context_blocks = 2 * context / m;
    let least = context_blocks + (16 * half).max(8192).div_ceil(m);
    let smooth = |k: usize| largest_prime_factor(k * m) <= 7 && largest_prime_factor(k * l) <= 7;
    let first_even = least + least % 2;
    (first_even..first_even + 256).step_by(2).find(|&k| smooth(k)).unwrap_or(first_even)
}

/// The zero-phase response of the windowed-sinc kernel, on the first `bins` bins of an
/// `n`-point real FFT, scaled by `1 / n`; the last bin is set to zero.
fn filter_response(rate: u32, half: usize, n: usize, bins: usize) -> Vec<f32> {
    let fs = f64::from(rate);
    let band = f64::from(rate.min(TARGET_RATE)) / 2.0;
    // The cutoff sits in the middle of the transition band.
    let cutoff = (PASSBAND + STOPBAND) / 2.0 * band / fs; // cycles per input sample
    let beta = 0.1102 * (ATTENUATION_DB - 8.7);
    let i0_beta = bessel_i0(beta);
    let tap = |t: usize| -> f64 {
        let t = t as f64;
        let x = t / half as f64;
        let window = bessel_i0(beta * (1.0 - x * x).max(0.0).sqrt()) / i0_beta;
        let arg = 2.0 * std::f64::consts::PI * cutoff * t;
        let sinc = if t == 0.0 { 2.0 * cutoff } else { arg.sin() / (std::f64::consts::PI * t) };
        sinc * window
    };
    let kernel: Vec<f64> = (0..=half).map(tap).collect();
    // Response of the symmetric kernel: h0 + 2 sum h_t cos(2 pi j t / n), computed with a
    // cosine recurrence per bin (in f64, so the 100 dB stopband is not lost to rounding).
    (0..bins)
        .map(|j| {
            if j + 1 == bins {
                return 0.0;
            }
            let w = 2.0 * std::f64::consts::PI * j as f64 / n as f64;
            let (c1, mut c_prev, mut c) = (w.cos(), 1.0f64, w.cos());
            let mut sum = kernel[0];
            for &h in &kernel[1..] {
                sum += 2.0 * h * c;
                let next = 2.0 * c1 * c - c_prev;
                (c_prev, c) = (c, next);
            }
            (sum / n as f64) as f32
        })
        .collect()
}

/// The modified Bessel function of the first kind, order 0 (power series; converges for the
/// arguments a Kaiser window uses).
fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let (mut term, mut sum, mut k) = (1.0f64, 1.0f64, 1.0f64);
    while term > sum * 1e-17 {
        term *= q / (k * k);
        sum += term;
        k += 1.0;
    }
    sum
}

fn largest_prime_factor(mut n: usize) -> usize {
    let mut largest = 1;
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            largest = p;
            n /= p;
        }
        p += 1;
    }
    largest.max(n)
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bessel_i0_matches_known_values() {
        // Abramowitz and Stegun, table 9.8: I0(1) = 1.266065878, I0(10) = 2815.716628.
        assert!((bessel_i0(1.0) - 1.266_065_878).abs() < 1e-9);
        assert!((bessel_i0(10.0) / 2_815.716_628 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn blocks_are_even_and_smooth_for_common_rates() {
        for rate in [8_000u32, 11_025, 22_050, 24_000, 32_000, 44_100, 48_000, 96_000] {
            let g = gcd(rate, TARGET_RATE);
            let (m, l) = ((rate / g) as usize, (TARGET_RATE / g) as usize);
            let context = kaiser_half_length(rate).div_ceil(m) * m;
            let half = kaiser_half_length(rate);
            let k = block_count(m, l, half, context);
            assert!(k.is_multiple_of(2) && k > 2 * context / m, "{rate}: {k}");
            assert!(largest_prime_factor(k * m) <= 7 && largest_prime_factor(k * l) <= 7);
        }
    }
}
