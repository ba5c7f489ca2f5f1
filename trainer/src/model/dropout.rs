//! Dropout whose keep-mask is a pure function of one seed and each element's index.
//!
//! Burn's `Dropout` draws a Bernoulli tensor from the backend's generator and multiplies twice
//! (by the draws, then by `1 / keep`). On NdArray the draw is one ChaCha sample and one
//! `Bernoulli::new` per element, in sequence on the calling thread: 8.5 % of that thread's
//! samples in a 0.6B-width release step (bench/RESULTS.md, "Release builds against PyTorch").
//! On a GPU it is five launches (the draw, two products forward, two backward) and a kept mask
//! the size of the input, eight times per Conformer layer.
//!
//! Here each call takes one seed from the calling thread's dropout stream (reseeded per
//! micro-batch with the backend, [`seed_stream`]), and element `i` is kept by a counter-based
//! hash of (seed, `i`) ([`Rule`]). On the CPU training backend (`Autodiff<NdArray>`) the mask is
//! filled over rayon's pool, already holding `0` or `1 / keep`: one product forward and one
//! backward. On the trainer's CubeCL backends with f32 inputs (`device_dropout`) one kernel
//! computes the hash and the product forward and the same kernel backward: nothing is kept
//! between them. Elsewhere (other backends, other types) Burn's own draw runs.
//!
//! Invariants:
//! - identity when autodiff is off (evaluation) or `prob == 0`;
//! - element `i` is kept exactly when [`word`]`(seed, i)` is below [`Rule::threshold`]: the
//!   mask is the same bits at any thread count and on the CPU and the CubeCL backends;
//! - kept elements are multiplied by `1 / keep` (as f32), so the expectation is the input;
//! - a thread's seeds are a function of the stream's seed and the calls since: ranks that are
//!   threads of one process do not take each other's draws.

use std::any::TypeId;
use std::cell::Cell;

use burn::backend::{Autodiff, NdArray};
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use rayon::prelude::*;

use super::handoff::Handoff;
use super::precision::Precision;

/// Elements per parallel task at least: large enough that a task outweighs its scheduling.
const CHUNK: usize = 1 << 15;

thread_local! {
    /// The thread's dropout stream: its seed, and the dropout calls since it was seeded.
    static STREAM: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Reseeds the calling thread's dropout stream (with the backend's generator, per
/// micro-batch: `model::seed_backend`).
pub fn seed_stream(seed: u64) {
    STREAM.with(|s| s.set((seed, 0)));
}

/// The next dropout call's seed on this thread.
fn next_seed() -> u64 {
    STREAM.with(|s| {
        let (seed, calls) = s.get();
        s.set((seed, calls + 1));
        splitmix64(seed, calls)
    })
}

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

    /// This call's rule, taking the thread's next seed, in training on `B` with `prob > 0`;
    /// `None` (no seed taken) where the dropout is the identity. For operations that apply the
    /// dropout inside themselves (`device_attention`).
    pub fn draw<B: Backend>(&self, device: &B::Device) -> Option<Rule> {
        if !self.draws::<B>(device) {
            return None;
        }
        Some(Rule::new(next_seed(), 1.0 - self.prob))
    }

    /// Whether [`Self::draw`] would draw a rule (and take a seed) on `B`: for an operation
    /// that must know before drawing whether it runs (`device_feed_forward`).
    pub fn draws<B: Backend>(&self, device: &B::Device) -> bool {
        B::ad_enabled(device) && self.prob != 0.0
    }

    /// `x` with the dropout applied (training) or `x` itself (evaluation, or `prob == 0`).
    pub fn forward<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let device = x.device();
        let Some(rule) = self.draw::<B>(&device) else {
            return x;
        };
        let keep = 1.0 - self.prob;
        if TypeId::of::<B>() == TypeId::of::<Autodiff<NdArray>>() {
            let shape = x.shape();
            let mask = rule.mask(shape.num_elements());
            return x * Tensor::from_data(TensorData::new(mask, shape), &device);
        }
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let x = match super::device_dropout::on_device(x, rule) {
            Ok(y) => return y,
            Err(x) => x,
        };
        x.clone().random_like(Distribution::Bernoulli(keep)) * x / keep
    }

    /// `x + factor * self.forward(layer(h))`, `x` of the layer's output's shape: a residual
    /// connection after a linear layer (the Conformer layer's four branches each end in one;
    /// two of the connections are halved). The mask is the one `forward` would draw at this
    /// call, and a kept element is `f * (scale * factor)`, `f` the layer's output: for a
    /// power-of-two factor the same value as `forward`'s times the factor.
    /// - On the trainer's CubeCL types in training, in f32 and with a bias: one operation each
    ///   way (`device_matmul::linear_residual`: the product, then the bias and the residual in
    ///   one kernel), where the layer and the residual were two operations and three kernels
    ///   forward, two operations backward.
    /// - Otherwise the layer (`Precision::linear`), then the residual: in training on the CPU
    ///   backend one product and one sum, the factor folded into the mask; on the CubeCL types
    ///   one kernel forward and one backward (`device_dropout`), where Burn's form is the
    ///   dropout's two, a product by the factor and the sum forward, and the dropout's and the
    ///   product's backward.
    ///
    /// `handoff`: where the layer normalisation reading `x` claimed it, the one operation hands
    /// `x`'s gradient to that normalisation's backward instead of autodiff's sum
    /// (`model::handoff`).
    ///
    /// `next`: the layer normalisation of the output, which the one operation runs in its
    /// residual's kernel (`device_matmul::linear_residual_norm`), returning it beside the
    /// output; `None` beside it where the caller must run it. In a chain (`NextNorm::chain`)
    /// the residual and the normalisation are one node (`device_residual_norm`) whose output
    /// is the normalised, and the residual's output is returned untracked.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_linear<B: Backend, const D: usize>(
        &self,
        x: Tensor<B, D>,
        layer: &Linear<B>,
        h: Tensor<B, D>,
        factor: f32,
        p: Precision,
        handoff: Option<&Handoff>,
        next: Option<NextNorm<'_, B>>,
    ) -> (Tensor<B, D>, Option<Tensor<B, D>>) {
        let rule = self.draw::<B>(&x.device());
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let x = match (rule, &layer.bias, p.compute()) {
            (Some(r), Some(b), None) => {
                use super::device_matmul::{linear_residual, linear_residual_norm};
                use super::device_residual_norm::linear_residual_then_norm;
                let (w, b) = (layer.weight.val(), b.val());
                let rule = r.times(factor);
                // Both refuse the same shapes; the layer and the residual alone then run.
                let x = match next {
                    Some(next) if next.chain => {
                        match linear_residual_then_norm(x, &h, &w, &b, rule, handoff, next) {
                            Ok([y, normed]) => return (y, Some(normed)),
                            Err(x) => x,
                        }
                    }
                    Some(next) => match linear_residual_norm(x, &h, &w, &b, rule, handoff, next) {
                        Ok([y, normed]) => return (y, Some(normed)),
                        Err(x) => x,
                    },
                    None => x,
                };
                match linear_residual(x, &h, &w, &b, rule, handoff) {
                    Ok(y) => return (y, None),
                    Err(x) => x,
                }
            }
            _ => x,
        };
        // Without the CubeCL backends neither is read.
        #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
        let _ = (handoff, next);
        (self.residual_drawn(rule, x, p.linear(layer, h), factor), None)
    }

    /// The residual connection `x + factor * dropout(f)` with its mask's `rule` drawn (`None`:
    /// the identity's).
    fn residual_drawn<B: Backend, const D: usize>(
        &self,
        rule: Option<Rule>,
        x: Tensor<B, D>,
        f: Tensor<B, D>,
        factor: f32,
    ) -> Tensor<B, D> {
        let device = x.device();
        let Some(rule) = rule else {
            return if factor == 1.0 { x + f } else { x + f.mul_scalar(factor) };
        };
        let keep = 1.0 - self.prob;
        let rule = rule.times(factor);
        if TypeId::of::<B>() == TypeId::of::<Autodiff<NdArray>>() {
            let shape = f.shape();
            let mask = rule.mask(shape.num_elements());
            return x + f * Tensor::from_data(TensorData::new(mask, shape), &device);
        }
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let (x, f) = match super::device_dropout::residual_on_device(x, f, rule) {
            Ok(y) => return y,
            Err(inputs) => inputs,
        };
        x + f.clone().random_like(Distribution::Bernoulli(keep)) * f * (factor as f64 / keep)
    }
}

/// The layer normalisation right after a residual connection
/// ([`Dropout::residual_linear`]'s `next`): its scale and shift, its epsilon, and the handoff it
/// claims for its input's gradient (`model::handoff`).
pub struct NextNorm<'a, B: Backend> {
    /// The scale, `[out]`.
    pub gamma: Tensor<B, 1>,
    /// The shift, `[out]`.
    pub beta: Tensor<B, 1>,
    /// Added to the variance.
    pub eps: f64,
    /// Claimed in the normalisation's forward, where given.
    pub handoff: Option<&'a Handoff>,
    /// The residual's output is read only by the next residual connection of a chain whose
    /// connections all take the device operation (`device_residual_norm::chain_fits`): the
    /// residual and the normalisation may be one node, the output untracked.
    pub chain: bool,
}

/// Which elements one dropout call keeps, and their factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// The call's seed.
    pub seed: u64,
    /// Element `i` is kept when `word(seed, i) < threshold`: `round(keep * 2^32)`, at most
    /// `2^32 - 1` (so a keep within `2^-33` of 1 keeps a share `2^-32` short of it).
    pub threshold: u32,
    /// The kept elements' factor, `1 / keep` as f32.
    pub scale: f32,
}

impl Rule {
    /// The rule for `seed` keeping a share `keep` in `(0, 1]`.
    pub fn new(seed: u64, keep: f64) -> Self {
        let threshold = (keep * 4_294_967_296.0).round().clamp(0.0, u32::MAX as f64) as u32;
        Rule { seed, threshold, scale: (1.0 / keep) as f32 }
    }

    /// The same mask with the kept elements' factor times `factor`.
    pub fn times(self, factor: f32) -> Self {
        Rule { scale: self.scale * factor, ..self }
    }

    /// What a kernel needs to draw this mask: the seed's two [`keys`], the threshold and the
    /// scale, in that order (`device_dropout::mask_factor`'s arguments).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub fn kernel_args(&self) -> (u32, u32, u32, f32) {
        let [k0, k1] = keys(self.seed);
        (k0, k1, self.threshold, self.scale)
    }

    /// Whether element `i` is kept.
    pub fn keeps(&self, i: u64) -> bool {
        word(self.seed, i) < self.threshold
    }

    /// The mask of `n` elements: `scale` where kept, else `0`.
    pub fn mask(&self, n: usize) -> Vec<f32> {
        // Collected in place over the pool (no zeroing pass on the calling thread).
        (0..n)
            .into_par_iter()
            .with_min_len(CHUNK)
            .map(|i| if self.keeps(i as u64) { self.scale } else { 0.0 })
            .collect()
    }
}

/// The two 32-bit keys of `seed`: its low half, and its high half xor the low half's hash (so
/// two seeds sharing a high half do not give masks that are permutations of each other).
pub fn keys(seed: u64) -> [u32; 2] {
    let low = seed as u32;
    [low, (seed >> 32) as u32 ^ lowbias32(low)]
}

/// Element `i`'s 32-bit word for `seed`: two rounds of [`lowbias32`] keyed by [`keys`]. Below
/// `2^32` elements the index's high half is zero and `lowbias32(0) = 0`, so the word is
/// `lowbias32(lowbias32(i ^ k0) ^ k1)`: what `device_dropout`'s kernel computes in 32-bit
/// arithmetic (WGSL has no 64-bit integers).
pub fn word(seed: u64, i: u64) -> u32 {
    let [k0, k1] = keys(seed);
    let high = lowbias32((i >> 32) as u32);
    lowbias32(lowbias32(i as u32 ^ k0) ^ k1 ^ high)
}

/// A 32-bit integer hash (Wellons, "Prospecting for Hash Functions", 2018: `lowbias32`), a
/// bijection with `lowbias32(0) = 0`.
pub fn lowbias32(x: u32) -> u32 {
    let mut x = x;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Output `index` of the SplitMix64 sequence started at `seed` (Steele, Lea and Flood, 2014):
/// a stream's seeds, each computed without its predecessors.
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
            // Seeds one apart (sharing a high half), and a high half alone changed.
            let a = Rule::new(17, keep).mask(n);
            for other in [18, 17 | (1 << 32)] {
                let b = Rule::new(other, keep).mask(n);
                let kept = |m: &[f32], i: usize| m[i] != 0.0;
                let count = (0..n).filter(|&i| kept(&a, i)).count();
                // Neighbours and elements a stride apart must be independent, as must the same
                // element under another seed.
                let pairs = (0..n - 1).filter(|&i| kept(&a, i) && kept(&a, i + 1)).count();
                let strided = (0..n - 64).filter(|&i| kept(&a, i) && kept(&a, i + 64)).count();
                let across = (0..n).filter(|&i| kept(&a, i) && kept(&b, i)).count();
                // A binomial count lies beyond 5 standard deviations with probability 6e-7.
                let kk = keep * keep;
                assert!(deviations(count, n, keep) < 5.0, "keep {keep}: {count} of {n} kept");
                assert!(deviations(pairs, n - 1, kk) < 5.0, "keep {keep}: {pairs} pairs");
                assert!(deviations(strided, n - 64, kk) < 5.0, "keep {keep}: {strided} strided");
                assert!(deviations(across, n, kk) < 5.0, "keep {keep}: {across} across {other}");
            }
            let scale = (1.0 / keep) as f32;
            assert!(a.iter().all(|&v| v == 0.0 || v == scale));
        }
    }

    #[test]
    fn the_mask_is_the_same_at_any_thread_count_and_a_serial_recount() {
        let n = 3 * CHUNK + 5;
        let rule = Rule::new(99, 0.7);
        let parallel = rule.mask(n);
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool")
            .install(|| rule.mask(n));
        assert_eq!(parallel, single);
        // The same rule written out element by element, in 64-bit arithmetic.
        let threshold = (0.7f64 * 4_294_967_296.0).round() as u64;
        for (i, v) in parallel.iter().enumerate() {
            let h = |x: u64| u64::from(lowbias32(x as u32));
            let word = h(h(i as u64 ^ 99) ^ h(99));
            assert_eq!(*v != 0.0, word < threshold, "element {i}");
        }
    }

    #[test]
    fn the_hash_is_the_published_lowbias32_and_the_word_folds_in_the_index_s_high_half() {
        // Reference values of Wellons's lowbias32 (computed from its published definition in
        // 64-bit arithmetic, masked to 32 bits).
        let reference = |x: u64| {
            let mask = 0xffff_ffffu64;
            let mut x = x;
            x ^= x >> 16;
            x = (x * 0x7feb_352d) & mask;
            x ^= x >> 15;
            x = (x * 0x846c_a68b) & mask;
            (x ^ (x >> 16)) as u32
        };
        for x in [0u32, 1, 2, 0xdead_beef, u32::MAX, 1 << 31] {
            assert_eq!(lowbias32(x), reference(u64::from(x)), "{x:#x}");
        }
        assert_eq!(lowbias32(0), 0);
        // Indices past 2^32 do not repeat the first 2^32.
        let seed = 0x0123_4567_89ab_cdef;
        let repeats = (0..4096u64).filter(|&i| word(seed, i) == word(seed, i + (1 << 32))).count();
        assert!(repeats <= 1, "{repeats} of 4096 words repeat 2^32 elements on");
    }

    #[test]
    fn training_masks_and_scales_forward_and_backward_and_evaluation_passes_through() {
        let device = Default::default();
        let dropout = Dropout::new(0.25);
        let values: Vec<f32> = (0..4096).map(|i| 1.0 + (i % 7) as f32).collect();
        let x = Tensor::<Train, 2>::from_data(TensorData::new(values.clone(), [64, 64]), &device)
            .require_grad();
        // The stream is the thread's own: no lock needed against other tests.
        seed_stream(5);
        let (y, second, third) =
            (dropout.forward(x.clone()), dropout.forward(x.clone()), dropout.forward(x.clone()));
        seed_stream(5);
        let repeat = dropout.forward(x.clone());
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
        // The first call's mask is the rule of the stream's first seed.
        let rule = Rule::new(splitmix64(5, 0), 0.75);
        let expected: Vec<f32> = values.iter().zip(rule.mask(4096)).map(|(v, m)| v * m).collect();
        assert_eq!(out, expected);
        // Another thread's stream is its own: seeding it leaves this one where it was.
        seed_stream(5);
        let _ = dropout.forward(x.clone());
        std::thread::scope(|s| {
            s.spawn(|| seed_stream(77));
        });
        assert_eq!(values_of(dropout.forward(x.clone())), second);
        // Without autodiff (evaluation) and at probability 0 the input passes through.
        let bare =
            Tensor::<NdArray, 2>::from_data(TensorData::new(values.clone(), [64, 64]), &device);
        assert_eq!(dropout.forward(bare).into_data().to_vec::<f32>().expect("f32"), values);
        let off = Dropout::new(0.0).forward(x).into_data().to_vec::<f32>().expect("f32");
        assert_eq!(off, values);
    }

    #[test]
    fn a_residual_is_the_input_plus_the_factor_times_the_dropout_of_the_same_call() {
        use burn::module::AutodiffModule;
        let device = Default::default();
        let dropout = Dropout::new(0.1);
        let data = |k: usize| {
            let v: Vec<f32> = (0..3000).map(|i| ((i * k) % 17) as f32 * 0.37 - 3.1).collect();
            TensorData::new(v, [30, 100])
        };
        let x = Tensor::<Train, 2>::from_data(data(3), &device).require_grad();
        let h = Tensor::<Train, 2>::from_data(data(5), &device).require_grad();
        let layer = burn::nn::LinearConfig::new(100, 100).init::<Train>(&device);
        const F32: Precision = Precision::F32;
        let weights = Tensor::<Train, 2>::from_data(data(7), &device);
        let values_of = |t: Tensor<Train, 2>| t.into_data().to_vec::<f32>().expect("f32");
        for factor in [0.5f32, 1.0] {
            // Against the unfused form from the same point of the stream: the same bits (a
            // power-of-two factor scales exactly), forward and backward.
            seed_stream(9);
            let (fused, _) =
                dropout.residual_linear(x.clone(), &layer, h.clone(), factor, F32, None, None);
            let gf = (fused.clone() * weights.clone()).sum().backward();
            seed_stream(9);
            let f = F32.linear(&layer, h.clone());
            let plain = x.clone() + dropout.forward(f).mul_scalar(factor);
            let gp = (plain.clone() * weights.clone()).sum().backward();
            assert_eq!(values_of(fused), values_of(plain), "factor {factor}");
            for t in [&x, &h] {
                let grad = |g| t.grad(g).expect("a gradient").into_data().to_vec::<f32>().unwrap();
                assert_eq!(grad(&gf), grad(&gp), "factor {factor}");
            }
        }
        // Evaluation: the plain sum.
        let bare = |k| Tensor::<NdArray, 2>::from_data(data(k), &device);
        let layer = layer.valid();
        let (eval, _) = dropout.residual_linear(bare(3), &layer, bare(5), 0.5, F32, None, None);
        let want = bare(3) + F32.linear(&layer, bare(5)).mul_scalar(0.5);
        assert_eq!(
            eval.into_data().to_vec::<f32>().unwrap(),
            want.into_data().to_vec::<f32>().unwrap()
        );
    }
}
