//! The sum of a step's micro-batch gradients (`train.grad_accum`), kept flat on the device
//! backends.
//!
//! Burn's `GradientsAccumulator` adds each parameter's gradient on its own: one addition per
//! parameter tensor for every micro-batch after the first, each an operation of fusion's stream
//! with its host cost on two threads (922 a micro-batch at bench/fusion_ops.sh's preset, the
//! 0.6B preset's structure; bench/RESULTS.md, "Gradients summed flat"). [`GradientSum`] keeps the sum as [`FlatGrads`]: each
//! trainable parameter's gradient at its aligned place in flat f32 tensors, one per chunk (as
//! `flat_adamw` places parameters, `flat_adamw::next_place`). A micro-batch's gradients are
//! laid out into a chunk's form in one operation (`device_layout`) and added to it in one
//! more; the sum goes back to the optimizer as views of the chunks (one `split` each under
//! fusion). The first micro-batch's gradients are held as they are until a second arrives, so
//! a step of one micro-batch costs nothing here.
//!
//! Invariants:
//! - The sum is Burn's `GradientsAccumulator`'s, bit for bit: each element is the same f32
//!   additions in the same order (element-wise additions do not see the layout). Where a
//!   micro-batch has no gradient for a parameter, the layout's zeros stand for it (`x + 0` is
//!   `x`, except that -0 becomes +0); the trainer's model gives every trainable parameter a
//!   gradient in every micro-batch.
//! - A parameter that no micro-batch gave a gradient has none in the sum (the optimizer leaves
//!   it alone, as with Burn's accumulator).
//! - Only backends that lay out in one operation take the flat form
//!   (`device_layout::lays_out_on_device`: the trainer's CubeCL types); elsewhere (NdArray) the
//!   sum is Burn's accumulator, where an addition costs no more than a copy into a layout would.
//! - Memory: the sum holds the gradients once, as Burn's does; while a micro-batch is added, a
//!   chunk's layout of its gradients (at most `flat_adamw::CHUNK_BYTES`) is alive beside them.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorPrimitive;

use super::flat_adamw::{chunk_elements, elements, laid, next_place, split, ALIGN};

/// A trainable parameter's place in the chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Place {
    chunk: usize,
    start: usize,
    len: usize,
    /// Whether some micro-batch gave it a gradient.
    seen: bool,
}

/// A module's gradients laid out flat: one f32 tensor per chunk, each trainable parameter's
/// gradient at its place (module order), zeros between them and where a parameter has none.
pub struct FlatGrads<I: Backend> {
    places: Vec<Place>,
    chunks: Vec<Tensor<I, 1>>,
}

/// A trainable parameter's gradient, taken: its element count, and its elements in f32 if
/// there was one.
type Taken<I> = (usize, Option<FloatTensor<I>>);

/// Each trainable parameter's gradient taken from `grads`, in module order.
fn take<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &mut GradientsParams,
) -> Vec<Taken<B::InnerBackend>> {
    struct Take<'a, I: Backend> {
        grads: &'a mut GradientsParams,
        out: Vec<Taken<I>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if value.is_require_grad() {
                let n = value.shape().num_elements();
                self.out.push((n, self.grads.remove::<B::InnerBackend, D>(param.id).map(elements)));
            }
        }
    }
    let mut take = Take::<B::InnerBackend> { grads, out: Vec::new() };
    module.visit(&mut take);
    take.out
}

/// Each trainable parameter's shape, in module order.
fn shapes<B: AutodiffBackend, M: Module<B>>(module: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if value.is_require_grad() {
                self.0.push(value.dims().to_vec());
            }
        }
    }
    let mut shapes = Shapes(Vec::new());
    module.visit(&mut shapes);
    shapes.0
}

impl<I: Backend> FlatGrads<I> {
    /// `module`'s gradients from `grads` (taking them), on `device`, in chunks of at most
    /// `chunk` elements (every chunk, zeros where no parameter of it has a gradient).
    pub fn lay_out<B, M>(
        module: &M,
        mut grads: GradientsParams,
        chunk: usize,
        device: &I::Device,
    ) -> Self
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: Module<B>,
    {
        let taken = take::<B, M>(module, &mut grads);
        let mut places: Vec<Place> = Vec::with_capacity(taken.len());
        for (len, g) in &taken {
            let last = places.last().map(|p| (p.chunk, p.start + p.len));
            let (at_chunk, start) = next_place(last, *len, chunk);
            places.push(Place { chunk: at_chunk, start, len: *len, seen: g.is_some() });
        }
        let mut flat = FlatGrads { places, chunks: Vec::new() };
        let parts = flat.by_chunk(taken);
        flat.chunks = parts
            .into_iter()
            .zip(flat.chunk_lens())
            .map(|(parts, len)| laid(parts, len, device))
            .collect();
        flat
    }

    /// Adds `grads` (taking them), parameter by parameter: per chunk one layout of the new
    /// gradients and one addition.
    pub fn add<B, M>(&mut self, module: &M, mut grads: GradientsParams)
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: Module<B>,
    {
        let taken = take::<B, M>(module, &mut grads);
        for (place, (_, g)) in self.places.iter_mut().zip(&taken) {
            place.seen |= g.is_some();
        }
        let lens = self.chunk_lens();
        let parts = self.by_chunk(taken);
        let old = std::mem::take(&mut self.chunks);
        self.chunks = old
            .into_iter()
            .zip(parts.into_iter().zip(lens))
            .map(|(sum, (parts, len))| {
                if parts.is_empty() {
                    sum
                } else {
                    let device = sum.device();
                    sum.add(laid(parts, len, &device))
                }
            })
            .collect();
    }

    /// The gradients of `module`'s parameters that some micro-batch gave, as views of the
    /// chunks (one split per chunk under fusion).
    pub fn into_grads<B, M>(self, module: &M) -> GradientsParams
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: Module<B>,
    {
        let mut pieces: Vec<Vec<(usize, Vec<usize>)>> =
            self.chunks.iter().map(|_| Vec::new()).collect();
        let mut owners: Vec<Vec<usize>> = self.chunks.iter().map(|_| Vec::new()).collect();
        for (k, (place, dims)) in self.places.iter().zip(shapes::<B, M>(module)).enumerate() {
            if place.seen {
                pieces[place.chunk].push((place.start, dims));
                owners[place.chunk].push(k);
            }
        }
        let mut views: Vec<Option<FloatTensor<I>>> = self.places.iter().map(|_| None).collect();
        for ((chunk, pieces), owners) in self.chunks.into_iter().zip(pieces).zip(owners) {
            if pieces.is_empty() {
                continue;
            }
            for (k, view) in
                owners.into_iter().zip(split::<I>(chunk.into_primitive().tensor(), pieces))
            {
                views[k] = Some(view);
            }
        }
        struct Give<I: Backend> {
            views: std::vec::IntoIter<Option<FloatTensor<I>>>,
            out: GradientsParams,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Give<B::InnerBackend> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if !param.val().is_require_grad() {
                    return;
                }
                if let Some(Some(view)) = self.views.next() {
                    let g =
                        Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(view));
                    self.out.register::<B::InnerBackend, D>(param.id, g);
                }
            }
        }
        let mut give = Give::<I> { views: views.into_iter(), out: GradientsParams::new() };
        module.visit(&mut give);
        give.out
    }

    /// Per trainable parameter (module order), 1 where some micro-batch gave it a gradient,
    /// else 0: what the ranks of a data-parallel step sum, for [`Self::set_presence`].
    pub fn presence(&self) -> Vec<f32> {
        self.places.iter().map(|p| f32::from(u8::from(p.seen))).collect()
    }

    /// Marks the parameters whose `presence` (as [`Self::presence`] gives it, summed over
    /// ranks) is positive as having a gradient: some rank had one.
    pub fn set_presence(&mut self, presence: &[f32]) {
        for (place, &p) in self.places.iter_mut().zip(presence) {
            place.seen = p > 0.0;
        }
    }

    /// The flat tensors, one per chunk (lengths [`Self::chunk_lens`]), taken out to be summed
    /// over ranks; [`Self::put_chunks`] puts the sums back.
    pub fn take_chunks(&mut self) -> Vec<Tensor<I, 1>> {
        std::mem::take(&mut self.chunks)
    }

    /// Puts back chunks of the same lengths as [`Self::take_chunks`] took.
    pub fn put_chunks(&mut self, chunks: Vec<Tensor<I, 1>>) {
        debug_assert!(chunks.iter().map(|c| c.dims()[0]).eq(self.chunk_lens()));
        self.chunks = chunks;
    }

    /// Each chunk's length: the aligned end of its last place.
    pub fn chunk_lens(&self) -> Vec<usize> {
        let mut lens = Vec::new();
        for p in &self.places {
            if p.chunk == lens.len() {
                lens.push(0);
            }
            lens[p.chunk] = (p.start + p.len).next_multiple_of(ALIGN);
        }
        lens
    }

    /// The gradients present, with their offsets, grouped by chunk (every chunk, empty or not).
    fn by_chunk(&self, taken: Vec<Taken<I>>) -> Vec<Vec<(usize, FloatTensor<I>)>> {
        // Places are in chunk order: the last one's chunk is the last chunk.
        let count = self.places.last().map_or(0, |p| p.chunk + 1);
        let mut parts: Vec<Vec<(usize, FloatTensor<I>)>> = (0..count).map(|_| Vec::new()).collect();
        for (place, (_, g)) in self.places.iter().zip(taken) {
            if let Some(g) = g {
                parts[place.chunk].push((place.start, g));
            }
        }
        parts
    }
}

/// The state of a [`GradientSum`].
enum Sum<B: AutodiffBackend, M> {
    /// No micro-batch's gradients yet.
    Empty,
    /// The first micro-batch's, as its backward gave them.
    One(GradientsParams),
    /// Two or more, flat (the device backends).
    Flat(FlatGrads<B::InnerBackend>),
    /// Two or more, per parameter (Burn's accumulator: the other backends).
    Burn(GradientsAccumulator<M>),
}

/// The sum of a step's micro-batch gradients of a module `M` (see the module).
pub struct GradientSum<B: AutodiffBackend, M> {
    sum: Sum<B, M>,
    /// Elements per chunk of the flat form.
    chunk: usize,
    device: B::Device,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> GradientSum<B, M> {
    /// An empty sum, flat in chunks of the optimizer's size on `device` where the backend lays
    /// out in one operation.
    pub fn new(device: &B::Device) -> Self {
        Self { sum: Sum::Empty, chunk: chunk_elements(device), device: device.clone() }
    }

    /// Chunks of `elements` (rounded up to [`ALIGN`]) instead of the device's.
    #[cfg(test)]
    pub fn with_chunk(mut self, elements: usize) -> Self {
        self.chunk = elements.max(1).next_multiple_of(ALIGN);
        self
    }

    /// Adds one micro-batch's gradients of `module` (taking them).
    pub fn add(&mut self, module: &M, grads: GradientsParams) {
        self.sum = match std::mem::replace(&mut self.sum, Sum::Empty) {
            Sum::Empty => Sum::One(grads),
            Sum::One(first) if flat_on::<B::InnerBackend>() => {
                let mut flat = FlatGrads::lay_out::<B, M>(module, first, self.chunk, &self.device);
                flat.add::<B, M>(module, grads);
                Sum::Flat(flat)
            }
            Sum::One(first) => {
                let mut accum = GradientsAccumulator::<M>::new();
                accum.accumulate(module, first);
                accum.accumulate(module, grads);
                Sum::Burn(accum)
            }
            Sum::Flat(mut flat) => {
                flat.add::<B, M>(module, grads);
                Sum::Flat(flat)
            }
            Sum::Burn(mut accum) => {
                accum.accumulate(module, grads);
                Sum::Burn(accum)
            }
        };
    }

    /// The sum (none for a parameter no micro-batch gave a gradient).
    pub fn finish(self, module: &M) -> GradientsParams {
        match self.sum {
            Sum::Empty => GradientsParams::new(),
            Sum::One(grads) => grads,
            Sum::Flat(flat) => flat.into_grads::<B, M>(module),
            Sum::Burn(mut accum) => accum.grads(),
        }
    }
}

/// Whether `I` takes the flat form: one of the backends that lay out in one operation.
fn flat_on<I: Backend>() -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    return super::device_layout::lays_out_on_device::<I>();
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        a: Linear<B>,
        norm: BatchNorm<B>,
        b: Linear<B>,
        c: Param<Tensor<B, 3>>,
    }

    fn net<B: AutodiffBackend>(device: &B::Device) -> Net<B> {
        Net {
            a: LinearConfig::new(70, 33).init(device),
            norm: BatchNormConfig::new(33).init(device),
            b: LinearConfig::new(33, 5).with_bias(false).init(device),
            c: Param::from_tensor(Tensor::zeros([3, 4, 5], device)),
        }
    }

    /// Micro-batch `mb`'s gradients: deterministic values of several magnitudes and signs
    /// (-0 included where every micro-batch has one); none for `a` in micro-batch 0 (it joins
    /// later) and none for `c` in 2.
    fn gradients<B: AutodiffBackend>(m: &Net<B>, mb: usize) -> GradientsParams {
        struct Make(GradientsParams, usize, usize);
        impl<B: AutodiffBackend> ModuleVisitor<B> for Make {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let value = p.val();
                let k = self.2;
                self.2 += 1;
                // Visit order: a.weight, a.bias, norm's four (two trainable), b.weight, c.
                if !value.is_require_grad() || (k < 2 && self.1 == 0) || (k == 7 && self.1 == 2) {
                    return;
                }
                let n = value.shape().num_elements();
                let scale = [1e-3f32, 1.0, 1e3, 1e-6, 0.1][(self.1 + k) % 5];
                let g: Vec<f32> = (0..n)
                    .map(|i| {
                        let x = ((i * 7919 + k * 104729 + self.1 * 1299709) % 2003) as f32;
                        // -0 only where every micro-batch has a gradient (see the module).
                        if x == 1001.0 && (2..7).contains(&k) {
                            -0.0
                        } else {
                            (x / 1001.0 - 1.0) * scale
                        }
                    })
                    .collect();
                let g = Tensor::<B::InnerBackend, D>::from_data(
                    TensorData::new(g, value.shape()),
                    &value.device(),
                );
                self.0.register::<B::InnerBackend, D>(p.id, g);
            }
        }
        let mut make = Make(GradientsParams::new(), mb, 0);
        m.visit(&mut make);
        make.0
    }

    /// Per float parameter, its gradient's bits (`None` where it has none).
    fn bits<B: AutodiffBackend>(m: &Net<B>, g: &GradientsParams) -> Vec<Option<Vec<u32>>> {
        struct Read<'a>(&'a GradientsParams, Vec<Option<Vec<u32>>>);
        impl<B: AutodiffBackend> ModuleVisitor<B> for Read<'_> {
            fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
                let g = self.0.get::<B::InnerBackend, D>(p.id);
                self.1.push(g.map(|g| {
                    assert_eq!(g.dims(), p.val().dims(), "a gradient's shape");
                    let v = g.into_data().convert::<f32>().into_vec::<f32>().unwrap();
                    v.iter().map(|x| x.to_bits()).collect()
                }));
            }
        }
        let mut read = Read(g, Vec::new());
        m.visit(&mut read);
        read.1
    }

    /// Burn's accumulator over micro-batches `0..n`.
    fn burn_s<B: AutodiffBackend>(m: &Net<B>, n: usize) -> Vec<Option<Vec<u32>>> {
        let mut accum = GradientsAccumulator::<Net<B>>::new();
        for mb in 0..n {
            accum.accumulate(m, gradients(m, mb));
        }
        bits(m, &accum.grads())
    }

    /// [`GradientSum`] over micro-batches `0..n` in chunks of `chunk` elements, and whether it
    /// took the flat form.
    fn ours<B: AutodiffBackend>(
        m: &Net<B>,
        n: usize,
        chunk: usize,
    ) -> (Vec<Option<Vec<u32>>>, bool) {
        let mut sum = GradientSum::<B, Net<B>>::new(&m.b.weight.val().device()).with_chunk(chunk);
        let mut flat = false;
        for mb in 0..n {
            sum.add(m, gradients(m, mb));
            flat |= matches!(sum.sum, Sum::Flat(_));
        }
        (bits(m, &sum.finish(m)), flat)
    }

    /// The flat form itself on NdArray (its layouts a fill and a copy per tensor there), in one
    /// chunk and in chunks smaller than some parameters: Burn's sums, bit for bit, with `a`
    /// joining at the second micro-batch and `c` missing from the third.
    #[test]
    fn the_flat_sum_is_burn_s_bit_for_bit() {
        type B = Autodiff<NdArray>;
        let device = Default::default();
        let m = net::<B>(&device);
        for n in [1, 2, 3, 4] {
            for chunk in [1 << 20, 2 * ALIGN, 1] {
                let want = burn_s(&m, n);
                let mut flat: Option<FlatGrads<NdArray>> = None;
                for mb in 0..n {
                    let g = gradients(&m, mb);
                    match &mut flat {
                        None => flat = Some(FlatGrads::lay_out::<B, _>(&m, g, chunk, &device)),
                        Some(f) => f.add::<B, _>(&m, g),
                    }
                }
                let got = bits(&m, &flat.expect("a micro-batch").into_grads::<B, _>(&m));
                assert!(got == want, "{n} micro-batches, chunks of {chunk}");
                // Micro-batch 0 has no gradient for `a`: with one micro-batch it has none.
                assert_eq!(got[0].is_none(), n == 1);
                // The running statistics never have one.
                assert!(got[4].is_none() && got[5].is_none());
            }
        }
    }

    /// A parameter no micro-batch gave a gradient has none, and a sum of nothing is empty.
    #[test]
    fn what_no_micro_batch_gave_stays_absent() {
        type B = Autodiff<NdArray>;
        let device = Default::default();
        let m = net::<B>(&device);
        let mut flat = FlatGrads::lay_out::<B, _>(&m, GradientsParams::new(), 256, &device);
        // Every chunk is there, zeros, with nothing marked present.
        assert_eq!(flat.chunks.len(), flat.chunk_lens().len());
        assert!(flat.chunks.len() > 1 && flat.presence().iter().all(|&p| p == 0.0));
        let none = FlatGrads::lay_out::<B, _>(&m, GradientsParams::new(), 256, &device);
        assert!(none.into_grads::<B, _>(&m).is_empty());
        flat.add::<B, _>(&m, gradients(&m, 0));
        flat.add::<B, _>(&m, GradientsParams::new());
        let got = bits(&m, &flat.into_grads::<B, _>(&m));
        assert_eq!(got, burn_s(&m, 1));
        let sum = GradientSum::<B, Net<B>>::new(&Default::default());
        assert!(sum.finish(&m).is_empty());
    }

    /// On NdArray the sum is Burn's accumulator (no flat form).
    #[test]
    fn ndarray_sums_as_burn_does() {
        type B = Autodiff<NdArray>;
        let m = net::<B>(&Default::default());
        let (got, flat) = ours(&m, 3, 1 << 20);
        assert!(!flat);
        assert!(got == burn_s(&m, 3));
    }

    /// On wgpu, with and without fusion, two or more micro-batches take the flat form, and the
    /// sums are Burn's bit for bit.
    #[cfg(feature = "wgpu")]
    #[test]
    fn device_sums_are_flat_and_burn_s_bit_for_bit() {
        fn check<B: AutodiffBackend>(name: &str) {
            let m = net::<B>(&Default::default());
            for n in [1, 2, 3] {
                for chunk in [1 << 20, 2 * ALIGN] {
                    let (got, flat) = ours(&m, n, chunk);
                    assert_eq!(flat, n > 1, "{name}: {n} micro-batches");
                    assert!(got == burn_s(&m, n), "{name}: {n} micro-batches, chunks of {chunk}");
                }
            }
        }
        check::<Autodiff<burn::backend::Wgpu>>("wgpu");
        check::<Autodiff<burn_fusion::Fusion<burn::backend::Wgpu>>>("fused wgpu");
    }
}
