//! The mel front end on the host, for the CPU backends, whose tensors are host memory anyway.
//!
//! The same steps as [`super::mel::MelFrontend`]'s tensor form, with the spectrum from a real
//! FFT instead of a product with the `[n_fft, 2 * bins]` DFT basis: at the `tiny` shape that
//! product was about a tenth of a CPU training step (bench/RESULTS.md, "Training step against
//! PyTorch on the CPU: the joint on the host"), and an FFT of 512 points costs about a
//! fortieth of it. Only the valid frames of each utterance are transformed (the padded frames'
//! features are zero either way).
//!
//! Invariants:
//! - the dither is the tensor form's draw from the backend's generator (the same seed gives the
//!   same noise on either form);
//! - from the samples on the arithmetic is f64 (pre-emphasis, FFT, power, filterbank, log,
//!   normalisation) and the features are rounded to f32 once, so this form is closer to a
//!   float64 reference than the tensor form (both tested against one, `tests/it/mel.rs`);
//! - each utterance is one task with its own buffers: the result does not depend on the thread
//!   count or scheduling (exact resume compares bits).

use std::sync::Arc;

use rayon::prelude::*;
use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use super::config::PreprocessorConfig;
use super::mel::STD_EPS;

/// The front end's constants on the host.
#[derive(Clone)]
pub struct HostMel {
    cfg: PreprocessorConfig,
    /// `n_fft` values: the Hann window centred in `n_fft`, zero outside.
    window: Vec<f64>,
    /// Per mel band, its first FFT bin and its weights over the following bins (the triangles
    /// are sparse: each bin feeds at most two bands).
    bands: Vec<(usize, Vec<f64>)>,
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for HostMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMel").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// One utterance's buffers.
struct Scratch {
    frame: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
    fft: Vec<Complex<f64>>,
    power: Vec<f64>,
}

impl HostMel {
    /// The constants for `cfg`.
    pub fn new(cfg: &PreprocessorConfig) -> HostMel {
        let n_fft = cfg.n_fft;
        let bins = n_fft / 2 + 1;
        let window = super::mel::centred_window(cfg);
        let fb = super::mel::mel_filterbank(cfg.sample_rate, n_fft, cfg.features);
        let bands = (0..cfg.features)
            .map(|m| {
                let column: Vec<f64> = (0..bins).map(|k| fb[k * cfg.features + m]).collect();
                let first = column.iter().position(|&w| w != 0.0).unwrap_or(0);
                let last = column.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
                (first, column[first..last].to_vec())
            })
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
        HostMel { cfg: cfg.clone(), window, bands, fft }
    }

    /// Features `[batch, n_frames, features]` (row-major) of `x`, the scaled, dithered,
    /// pre-emphasised and masked signal `[batch, samples]`, for utterances of `frame_lens`
    /// valid frames; frames at or past an utterance's length are zero.
    pub fn features(
        &self,
        x: &[f64],
        batch: usize,
        n_frames: usize,
        frame_lens: &[usize],
    ) -> Vec<f32> {
        let samples = x.len() / batch.max(1);
        let f = self.cfg.features;
        let mut out = vec![0f32; batch * n_frames * f];
        if n_frames == 0 || f == 0 {
            return out;
        }
        out.par_chunks_mut(n_frames * f).enumerate().for_each(|(b, out)| {
            let signal = &x[b * samples..(b + 1) * samples];
            self.utterance(signal, frame_lens[b].min(n_frames), out);
        });
        out
    }

    /// Log-mel of the first `valid` frames, normalised over them, into `out` (`[frames, F]`).
    fn utterance(&self, signal: &[f64], valid: usize, out: &mut [f32]) {
        let (n_fft, hop, f) = (self.cfg.n_fft, self.cfg.window_stride, self.cfg.features);
        let pad = n_fft / 2;
        let mut s = Scratch {
            frame: self.fft.make_input_vec(),
            spectrum: self.fft.make_output_vec(),
            fft: self.fft.make_scratch_vec(),
            power: vec![0.0; n_fft / 2 + 1],
        };
        let mut logmel = vec![0f64; valid * f];
        for (t, row) in logmel.chunks_exact_mut(f).enumerate() {
            // Frame t covers samples [t * hop - pad, t * hop - pad + n_fft) of the signal,
            // zero outside it (centred STFT).
            for (n, (v, w)) in s.frame.iter_mut().zip(&self.window).enumerate() {
                let at = (t * hop + n).checked_sub(pad);
                let sample = at.and_then(|i| signal.get(i)).copied().unwrap_or(0.0);
                *v = sample * w;
            }
            // The lengths are the plan's own buffers', so the transform cannot fail.
            self.fft
                .process_with_scratch(&mut s.frame, &mut s.spectrum, &mut s.fft)
                .expect("the FFT's buffers have the plan's lengths");
            for (p, c) in s.power.iter_mut().zip(&s.spectrum) {
                *p = c.re * c.re + c.im * c.im;
            }
            for (m, (first, weights)) in row.iter_mut().zip(&self.bands) {
                let mel: f64 = weights.iter().zip(&s.power[*first..]).map(|(w, p)| w * p).sum();
                *m = (mel + self.cfg.log_zero_guard_value).ln();
            }
        }
        // Per-feature normalisation over the valid frames: mean, unbiased std + 1e-5.
        let count = valid.max(1) as f64;
        let dof = (valid.max(2) - 1) as f64;
        for m in 0..f {
            let mean = (0..valid).map(|t| logmel[t * f + m]).sum::<f64>() / count;
            let var = (0..valid).map(|t| (logmel[t * f + m] - mean).powi(2)).sum::<f64>() / dof;
            let std = var.sqrt() + STD_EPS;
            for t in 0..valid {
                out[t * f + m] = ((logmel[t * f + m] - mean) / std) as f32;
            }
        }
    }
}
