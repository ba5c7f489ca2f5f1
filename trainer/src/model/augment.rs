//! SpecAugment made on the device from a few numbers per utterance.
//!
//! The host draws each utterance's masked bands and frames from (seed, micro-batch), the only
//! thing random about them: `2 x (freq_masks + time_masks)` integers per utterance, uploaded as
//! one small tensor. The device turns them into keep masks by comparing them with band and frame
//! indices, and multiplies them into the features. The draws are the same SplitMix64 sequence
//! as a host-built `[B, T, F]` mask ([`SpecAugmentDraws::host_mask`], kept as the reference the
//! tests hold the device masks to), so a resumed run masks exactly what the uninterrupted run
//! did.

use burn::prelude::*;

use super::config::SpecAugmentConfig;
use asr_plan::rng::SplitMix64;

/// One micro-batch's SpecAugment intervals, `[start, end)` each.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecAugmentDraws {
    /// Utterances.
    pub rows: usize,
    /// Masked feature bands, `freq_masks` per utterance.
    pub freq: Vec<[usize; 2]>,
    /// Masked frames, `time_masks` per utterance.
    pub time: Vec<[usize; 2]>,
    /// Bands per utterance in `freq`.
    pub freq_masks: usize,
    /// Frame intervals per utterance in `time`.
    pub time_masks: usize,
}

impl SpecAugmentDraws {
    /// Draws the intervals of utterances with `frame_lens` valid frames over `f` bands: per
    /// utterance, each band mask (width up to `freq_width`, then start), then each frame mask
    /// (width up to `time_width` of the utterance's own frames, then start).
    pub fn draw(cfg: &SpecAugmentConfig, frame_lens: &[usize], f: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut below = |n: usize| rng.below(n as u64) as usize;
        let mut freq = Vec::with_capacity(frame_lens.len() * cfg.freq_masks);
        let mut time = Vec::with_capacity(frame_lens.len() * cfg.time_masks);
        for &len in frame_lens {
            for _ in 0..cfg.freq_masks {
                let w = below(cfg.freq_width + 1).min(f);
                let f0 = below(f - w + 1);
                freq.push([f0, f0 + w]);
            }
            let max_w = ((cfg.time_width * len as f64) as usize).max(1);
            for _ in 0..cfg.time_masks {
                let w = below(max_w + 1).min(len);
                let t0 = below(len - w + 1);
                time.push([t0, t0 + w]);
            }
        }
        SpecAugmentDraws {
            rows: frame_lens.len(),
            freq,
            time,
            freq_masks: cfg.freq_masks,
            time_masks: cfg.time_masks,
        }
    }

    /// The keep mask `[rows, t, f]` (1 keep, 0 masked) built on the host.
    pub fn host_mask(&self, t: usize, f: usize) -> Vec<f32> {
        let mut mask = vec![1f32; self.rows * t * f];
        for b in 0..self.rows {
            let m = &mut mask[b * t * f..(b + 1) * t * f];
            for &[f0, f1] in &self.freq[b * self.freq_masks..(b + 1) * self.freq_masks] {
                for row in m.chunks_exact_mut(f) {
                    row[f0..f1].fill(0.0);
                }
            }
            for &[t0, t1] in &self.time[b * self.time_masks..(b + 1) * self.time_masks] {
                m[t0 * f..t1 * f].fill(0.0);
            }
        }
        mask
    }

    /// Features `[rows, T, F]` with the masked bands and frames zeroed, the masks made on the
    /// device (two broadcast products, no `[B, T, F]` mask).
    pub fn apply<B: Backend>(&self, feats: Tensor<B, 3>) -> Tensor<B, 3> {
        let [rows, t, f] = feats.dims();
        let device = feats.device();
        let keep_f = outside::<B>(&self.freq, rows, self.freq_masks, f, &device);
        let keep_t = outside::<B>(&self.time, rows, self.time_masks, t, &device);
        let mut feats = feats;
        if let Some(k) = keep_f {
            feats = feats * k.unsqueeze_dim::<3>(1);
        }
        if let Some(k) = keep_t {
            feats = feats * k.unsqueeze_dim::<3>(2);
        }
        feats
    }
}

/// `[rows, n]`: 1 where index `i` lies outside every one of the row's `k` intervals, 0 inside
/// one; `None` without intervals.
fn outside<B: Backend>(
    intervals: &[[usize; 2]],
    rows: usize,
    k: usize,
    n: usize,
    device: &B::Device,
) -> Option<Tensor<B, 2>> {
    if k == 0 || rows == 0 || n == 0 {
        return None;
    }
    // Integers below 2^24 are exact in f32; frame and band counts are far below.
    let bounds: Vec<f32> = intervals.iter().flat_map(|&[a, b]| [a as f32, b as f32]).collect();
    let bounds = Tensor::<B, 4>::from_data(TensorData::new(bounds, [rows, k, 1, 2]), device);
    let start = bounds.clone().slice([0..rows, 0..k, 0..1, 0..1]).reshape([rows, k, 1]);
    let end = bounds.slice([0..rows, 0..k, 0..1, 1..2]).reshape([rows, k, 1]);
    let index = Tensor::<B, 1, Int>::arange(0..n as i64, device).float().reshape([1, 1, n]);
    let index = index.expand([rows, k, n]);
    let inside = index
        .clone()
        .greater_equal(start.expand([rows, k, n]))
        .bool_and(index.lower(end.expand([rows, k, n])));
    Some(inside.float().sum_dim(1).reshape([rows, n]).equal_elem(0.0).float())
}
