//! Dropout whose keep-mask is a pure function of one drawn seed and each element's index.
//!
//! Burn's `Dropout` draws a Bernoulli tensor from the backend's generator and multiplies twice
//! (by the draws, then by `1 / keep`). On NdArray the draw is one ChaCha sample and one
//! `Bernoulli::new` per element, in sequence on the calling thread: 8.5 % of that thread's
//! samples in a 0.6B-width release step (bench/RESULTS.md, "Release builds against PyTorch").
//!
//! Here, on the CPU training backend (`Autodiff<NdArray>`), one seed is drawn from the backend's
//! generator per call (so the mask stays a function of the micro-batch's seed, as before) and
//! the mask is a counter-based hash of (seed, element index), filled over rayon's pool, already
//! holding `0` or `1 / keep`: one product forward and one backward. On every other backend
//! Burn's own draw runs on the device (a host mask would cross the bus).
//!
//! Invariants:
//! - identity when autodiff is off (evaluation) or `prob == 0`;
//! - element `i` is kept exactly when the 32-bit word `i` of the hash stream is below
//!   `round(keep * 2^32)`: the mask is the same bits at any thread count;
//! - kept elements are scaled by `1 / keep`, so the expectation is the input.

use std::any::TypeId;

use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use rayon::prelude::*;

/// Elements per parallel task at least: large enough that a task outweighs its scheduling.
const CHUNK: usize = 1 << 15;

/// Zeroes each element with probability `prob` and scales the rest by `1 / (1 - prob)`, in
/// training only. `prob` lies in `[0, 1)` (the model configuration checks it).
#[derive(Module, Clone, Debug)]
pub struct Dropout {
    /// Probability of zeroing an element.
    pub prob: f64,
}

impl Dropout {
    /// Dropout with probability `prob`.
    pub fn new(prob: f64) -> Self {
        Dropout { prob }
    }

    /// `x` with the dropout applied (training) or `x` itself (evaluation, or `prob == 0`).
    pub fn forward<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let device = x.device();
        if !B::ad_enabled(&device) || self.prob == 0.0 {
            return x;
        }
        let keep = 1.0 - self.prob;
        if TypeId::of::<B>() != TypeId::of::<Autodiff<NdArray>>() {
            return x.clone().random_like(Distribution::Bernoulli(keep)) * x / keep;
        }
        let seed = draw_seed::<B>(&device);
        let shape = x.shape();
        let mask = mask(seed, keep, shape.num_elements());
        x * Tensor::from_data(TensorData::new(mask, shape), &device)
    }
}

/// One 64-bit seed from the backend's generator (two draws of 32 bits).
fn draw_seed<B: Backend>(device: &B::Device) -> u64 {
    let words =
        Tensor::<B, 1, Int>::random([2], Distribution::Uniform(0.0, 4_294_967_296.0), device)
            .into_data();
    words.iter::<i64>().fold(0u64, |seed, w| (seed << 32) | (w as u64 & 0xffff_ffff))
}

/// The mask of `n` elements for `seed`: `1 / keep` where kept, else `0`.
pub fn mask(seed: u64, keep: f64, n: usize) -> Vec<f32> {
    // Kept when the word is below the threshold: probability threshold / 2^32, exact to 2^-32.
    let threshold = (keep * 4_294_967_296.0).round().clamp(0.0, 4_294_967_296.0) as u64;
    let scale = (1.0 / keep) as f32;
    // Collected in place over the pool (no zeroing pass on the calling thread). Each element
    // computes its pair's hash: twice the hashing, a few nanoseconds, and no shared state.
    (0..n)
        .into_par_iter()
        .with_min_len(CHUNK)
        .map(|i| {
            let h = splitmix64(seed, (i / 2) as u64);
            let word = if i % 2 == 0 { h & 0xffff_ffff } else { h >> 32 };
            if word < threshold {
                scale
            } else {
                0.0
            }
        })
        .collect()
}

/// Output `index` of the SplitMix64 sequence started at `seed` (Steele, Lea and Flood, 2014):
/// a counter-based generator, so any element's word is computed without its predecessors.
fn splitmix64(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Train = Autodiff<NdArray>;

    /// How far `observed` kept elements of `n` lie from `keep * n`, in standard deviations.
    fn deviations(observed: usize, n: usize, keep: f64) -> f64 {
        (observed as f64 - keep * n as f64).abs() / (n as f64 * keep * (1.0 - keep)).sqrt()
    }

    #[test]
    fn the_mask_keeps_the_asked_share_independently_of_neighbours_and_of_other_seeds() {
        let n = 1 << 20;
        for keep in [0.9, 0.5, 0.2] {
            let a = mask(17, keep, n);
            let b = mask(18, keep, n);
            let kept = |m: &[f32], i: usize| m[i] != 0.0;
            let count = (0..n).filter(|&i| kept(&a, i)).count();
            // Adjacent words come from one hash (pairs) or two (across pairs): both must be
            // independent, as must the same element under the next seed.
            let pairs = (0..n - 1).filter(|&i| kept(&a, i) && kept(&a, i + 1)).count();
            let across = (0..n).filter(|&i| kept(&a, i) && kept(&b, i)).count();
            // A binomial count lies beyond 5 standard deviations with probability 6e-7.
            assert!(deviations(count, n, keep) < 5.0, "keep {keep}: {count} of {n} kept");
            assert!(deviations(pairs, n - 1, keep * keep) < 5.0, "keep {keep}: {pairs} pairs");
            assert!(deviations(across, n, keep * keep) < 5.0, "keep {keep}: {across} across");
            let scale = (1.0 / keep) as f32;
            assert!(a.iter().all(|&v| v == 0.0 || v == scale));
        }
    }

    #[test]
    fn the_mask_is_the_same_at_any_thread_count_and_a_serial_recount() {
        let n = 3 * CHUNK + 5;
        let parallel = mask(99, 0.7, n);
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool")
            .install(|| mask(99, 0.7, n));
        assert_eq!(parallel, single);
        // The same rule written element by element, without chunks.
        let threshold = (0.7f64 * 4_294_967_296.0).round() as u64;
        for (i, v) in parallel.iter().enumerate() {
            let h = splitmix64(99, (i / 2) as u64);
            let word = if i % 2 == 0 { h & 0xffff_ffff } else { h >> 32 };
            assert_eq!(*v != 0.0, word < threshold, "element {i}");
        }
    }

    #[test]
    fn training_masks_and_scales_forward_and_backward_and_evaluation_passes_through() {
        let device = Default::default();
        let dropout = Dropout::new(0.25);
        let values: Vec<f32> = (0..4096).map(|i| 1.0 + (i % 7) as f32).collect();
        let x = Tensor::<Train, 2>::from_data(TensorData::new(values.clone(), [64, 64]), &device)
            .require_grad();
        // Drawn under the lock that seeding takes: other tests draw from the same generator.
        let (y, second, third) = crate::model::draw_seeded::<Train, _>(&device, 5, || {
            (dropout.forward(x.clone()), dropout.forward(x.clone()), dropout.forward(x.clone()))
        });
        let repeat =
            crate::model::draw_seeded::<Train, _>(&device, 5, || dropout.forward(x.clone()));
        let out: Vec<f32> = y.clone().into_data().to_vec().expect("f32 output");
        let grads = (y * 3.0).sum().backward();
        let gx: Vec<f32> = x.grad(&grads).expect("a gradient").into_data().to_vec().expect("f32");
        let mut kept = 0;
        for ((&v, &o), &g) in values.iter().zip(&out).zip(&gx) {
            if o == 0.0 {
                assert_eq!(g, 0.0);
            } else {
                kept += 1;
                assert_eq!(o, v * (1.0f32 / 0.75));
                assert_eq!(g, 3.0 * (1.0f32 / 0.75));
            }
        }
        assert!(deviations(kept, 4096, 0.75) < 5.0, "{kept} of 4096 kept");
        // The same seed gives the same mask; the calls after it other masks.
        let values_of = |t: Tensor<Train, 2>| t.into_data().to_vec::<f32>().expect("f32");
        assert_eq!(values_of(repeat), out);
        let (second, third) = (values_of(second), values_of(third));
        assert_ne!(second, out);
        assert_ne!(third, second);
        // Without autodiff (evaluation) and at probability 0 the input passes through.
        let bare =
            Tensor::<NdArray, 2>::from_data(TensorData::new(values.clone(), [64, 64]), &device);
        assert_eq!(dropout.forward(bare).into_data().to_vec::<f32>().expect("f32"), values);
        let off = Dropout::new(0.0).forward(x).into_data().to_vec::<f32>().expect("f32");
        assert_eq!(off, values);
    }
}
