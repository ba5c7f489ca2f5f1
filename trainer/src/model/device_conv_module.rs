//! The Conformer convolution module's chain in training (`encoder::ConvModule::hidden`): the
//! first pointwise layer with its GLU and time mask, the depthwise convolution, and the batch
//! normalisation with its Swish, as one operation each way on the CubeCL backends (wgpu, CUDA;
//! fused or not) under autodiff.
//!
//! Run one by one these are three operations of fusion's stream forward
//! (`device_matmul::linear_gated`, `device_depthwise`, `device_batch_norm`) and three backward:
//! 6 a Conformer layer, 144 of a step's at the 0.6B preset's 24 layers. A GPU step is bound by
//! the host's cost per operation (bench/RESULTS.md, "The kit on an H200: cuBLAS's products
//! bring the 0.6B step to PyTorch's": the training thread and fusion's 76-85 % busy, the device
//! 35-50 %). Here they are one operation forward and one backward, which launch the same
//! kernels, in the same order, on the same inputs: the bits of the operations they replace.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff, with f32 tensors and a pointwise layer with a bias (mixed precision keeps the
//! operations one by one); `None` elsewhere, and the caller runs them one by one. Evaluation
//! (no autodiff) normalises with the running statistics, which is not this chain.
//!
//! Invariants: with `h` `[B, T, d]`, the pointwise layer's `w` `[d, 2d]` and `b` `[2d]`, `keep`
//! `[B, T, 1]`, the depthwise weight `[K, d]` and bias `[d]`, the normalisation's scale and
//! shift `[d]`: the output is `swish(bn(depthwise(glu(h · w + b) * keep)))` `[B, T, d]`, each
//! part as its own operation computes it; the running statistics are replaced as
//! `device_batch_norm` replaces them; the backward keeps what those operations kept (`h`, `w`,
//! the GLU's input, `keep`, the depthwise convolution's input and weight, the normalisation's
//! input, scale, shift and statistics, the retired running statistics) and computes the
//! pointwise layer's gradients only where they are tracked.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::{BatchNorm, Linear};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::conv::DepthwiseConv1d;
use super::device_batch_norm::{self, Activation, DeviceBatchNorm};
use super::device_depthwise::{self, DeviceDepthwise};
use super::device_gates::{After, Gate};
use super::device_matmul::{self, DeviceMatmul, Kernel};
use super::device_op::{self, next_of, on_cube_types, DeviceBackward};
use super::host_depthwise::{cast, float};
use super::running_stats;

/// The operation's settings: the pointwise layer's kernel and the normalisation's epsilon and
/// momentum.
#[derive(Debug, Clone, Copy)]
pub struct Chain {
    pub(crate) kernel: Kernel,
    pub(crate) eps: f64,
    pub(crate) momentum: f64,
}

/// What the forward keeps for the backward: what the three operations kept.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    pub(crate) h: FloatTensor<B>,
    pub(crate) w: FloatTensor<B>,
    /// The GLU's input, `h · w + b`.
    pub(crate) gate_in: FloatTensor<B>,
    pub(crate) keep: FloatTensor<B>,
    /// The depthwise convolution's input (the masked GLU) and weight.
    pub(crate) depthwise: device_depthwise::Saved<B>,
    /// The normalisation's input (the convolution), scale, shift, statistics and retired
    /// running statistics.
    pub(crate) norm: device_batch_norm::Saved<B>,
}

/// The forward's results: the output, what the backward needs, and the new running mean and
/// variance.
pub struct Forward<B: Backend> {
    pub(crate) y: FloatTensor<B>,
    pub(crate) saved: Saved<B>,
    pub(crate) running: [FloatTensor<B>; 2],
}

/// The chain as one operation (see the module): the backends that have it. The provided
/// methods run the parts on `Self`; under fusion ([`Fusion`]'s override) they run on the inner
/// backend inside one operation of the stream.
pub trait DeviceConvModule: DeviceMatmul + DeviceDepthwise + DeviceBatchNorm {
    /// The chain's output from `[h, w, b, depthwise weight, depthwise bias, scale, shift]`, the
    /// time mask `keep` and the running `[mean, variance]`.
    fn conv_module_forward(
        [h, w, b, dw_weight, dw_bias, gamma, beta]: [FloatTensor<Self>; 7],
        keep: FloatTensor<Self>,
        running: [FloatTensor<Self>; 2],
        chain: Chain,
    ) -> Forward<Self> {
        // `device_matmul::linear_gated`'s `LinearGate` forward.
        let after = After::Mask(keep.clone());
        let [g, gate_in] =
            Self::linear_gate_forward(h.clone(), w.clone(), b, Gate::Glu, after, chain.kernel);
        let (z, depthwise) = Self::depthwise_forward(g, dw_weight, dw_bias);
        let (eps, momentum) = (chain.eps, chain.momentum);
        let f = Self::batch_norm_forward(z, gamma, beta, running, eps, momentum, Activation::Swish);
        let saved = Saved { h, w, gate_in, keep, depthwise, norm: f.saved };
        Forward { y: f.y, saved, running: [f.running_mean, f.running_var] }
    }

    /// The gradients of the seven inputs of [`Self::conv_module_forward`] that `asked` names,
    /// from the output's `dy`.
    fn conv_module_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        chain: Chain,
        asked: [bool; 7],
    ) -> [Option<FloatTensor<Self>>; 7] {
        let Saved { h, w, gate_in, keep, depthwise, norm } = saved;
        let (w, h) = (asked[0].then_some(w), asked[1].then_some(h));
        grads::<Self>(dy, gate_in, keep, depthwise, norm, [w, h], chain, asked)
    }
}

/// The chain's backward on `B`, the parts' backward in reverse order: the normalisation's and
/// the convolution's gradients come from the same launches whether asked or not (an unasked one
/// is dropped); the pointwise layer's input's gradient reads `w` and its weight's `h`, each
/// given only where asked (`LinearGate`'s backward).
#[allow(clippy::too_many_arguments)]
fn grads<B: DeviceMatmul + DeviceDepthwise + DeviceBatchNorm>(
    dy: FloatTensor<B>,
    gate_in: FloatTensor<B>,
    keep: FloatTensor<B>,
    depthwise: device_depthwise::Saved<B>,
    norm: device_batch_norm::Saved<B>,
    [w, h]: [Option<FloatTensor<B>>; 2],
    chain: Chain,
    asked: [bool; 7],
) -> [Option<FloatTensor<B>>; 7] {
    let [dz, d_gamma, d_beta] = B::batch_norm_backward(norm, dy);
    let (dg, d_dw_weight, d_dw_bias) = B::depthwise_backward(depthwise, dz);
    let after = After::Mask(keep);
    let [dh, dw, db] =
        B::linear_gate_grads(dg, gate_in, w, h, asked[2], Gate::Glu, after, chain.kernel);
    let params = [d_dw_weight, d_dw_bias, d_gamma, d_beta];
    let [p3, p4, p5, p6] = params.map(Some);
    let mut all = [dh, dw, db, p3, p4, p5, p6];
    for (g, yes) in all.iter_mut().zip(asked) {
        if !yes {
            *g = None;
        }
    }
    all
}

impl<R, F, I, BT> DeviceConvModule for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceConvModule for Fusion<B>
where
    B: FusionBackend + DeviceConvModule,
{
    /// One operation of fusion's stream, its outputs what the forward makes ([`made_shapes`]).
    fn conv_module_forward(
        inputs: [FloatTensor<Self>; 7],
        keep: FloatTensor<Self>,
        running: [FloatTensor<Self>; 2],
        chain: Chain,
    ) -> Forward<Self> {
        let outputs = made_shapes(&inputs[0].shape.to_vec());
        let [h, w, dw_weight, gamma, beta] = [0, 1, 3, 5, 6].map(|i| inputs[i].clone());
        let all = inputs.into_iter().chain([keep.clone()]).chain(running).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let Ok([h, w, b, dw_weight, dw_bias, gamma, beta, keep, mean, var]) =
                <[FloatTensor<B>; 10]>::try_from(ins)
            else {
                unreachable!("the convolution module: ten inputs")
            };
            let inputs = [h, w, b, dw_weight, dw_bias, gamma, beta];
            made(B::conv_module_forward(inputs, keep, [mean, var], chain))
        };
        let outs = in_stream_vec::<B, _>("convolution module", all, outputs, run);
        from_made(&mut outs.into_iter(), [h, w, keep, dw_weight, gamma, beta])
    }

    /// One operation of fusion's stream, its inputs `dy` and what the backward reads
    /// ([`read`]), its outputs the gradients asked for.
    fn conv_module_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        chain: Chain,
        asked: [bool; 7],
    ) -> [Option<FloatTensor<Self>>; 7] {
        let shapes = grad_shapes(&saved);
        let outputs: Vec<_> =
            shapes.into_iter().zip(asked).filter(|(_, a)| *a).map(|(s, _)| s).collect();
        let (read, retired) = read(saved, asked);
        let inputs = [dy].into_iter().chain(read).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let dy = next_of(&mut ins, "the convolution module's backward: its inputs");
            grads_from_read::<B>(&mut ins, dy, chain, asked, retired)
                .into_iter()
                .flatten()
                .collect()
        };
        let grads = in_stream_vec::<B, _>("convolution module backward", inputs, outputs, run);
        let mut grads = grads.into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The shapes of what the forward makes from an input of `dims`, as fusion's stream declares
/// them: the chain's output, the new running statistics and what the backward reads (the GLU's
/// input, the masked GLU, the convolution and the normalisation's statistics).
pub(crate) fn made_shapes(dims: &[usize]) -> Vec<(Vec<usize>, DType)> {
    let d = dims.last().copied().unwrap_or(1);
    let mut gate_dims = dims.to_vec();
    if let Some(last) = gate_dims.last_mut() {
        *last *= 2;
    }
    let shapes = [dims.to_vec(), vec![d], vec![d], gate_dims, dims.to_vec(), dims.to_vec()];
    shapes.into_iter().chain([vec![d, 2]]).map(|s| (s, DType::F32)).collect()
}

/// The forward's results as [`made_shapes`] declares them.
pub(crate) fn made<B: Backend>(f: Forward<B>) -> Vec<FloatTensor<B>> {
    let [mean, var] = f.running;
    let s = f.saved;
    vec![f.y, mean, var, s.gate_in, s.depthwise.x, s.norm.x, s.norm.stats]
}

/// The forward's results from [`made`]'s tensors (taken from `made`) and the inputs the
/// backward reads, `[h, w, keep, the depthwise weight, the scale, the shift]`; no retired
/// running statistics yet.
pub(crate) fn from_made<B: Backend>(
    made: &mut impl Iterator<Item = FloatTensor<B>>,
    [h, w, keep, dw_weight, gamma, beta]: [FloatTensor<B>; 6],
) -> Forward<B> {
    let mut next = || next_of(made, "the convolution module: its outputs");
    let (y, mean, var, gate_in, g, z, stats) =
        (next(), next(), next(), next(), next(), next(), next());
    let depthwise = device_depthwise::Saved { x: g, weight: dw_weight };
    let activation = Activation::Swish;
    let norm = device_batch_norm::Saved { x: z, gamma, beta, stats, activation, retired: None };
    let saved = Saved { h, w, gate_in, keep, depthwise, norm };
    Forward { y, saved, running: [mean, var] }
}

/// The shapes of the seven inputs' gradients (f32) for what the forward kept.
pub(crate) fn grad_shapes<B: Backend>(saved: &Saved<B>) -> [(Vec<usize>, DType); 7] {
    let d = saved.norm.gamma.shape().to_vec();
    let bias = saved.gate_in.shape().to_vec().last().map(|&o| vec![o]).unwrap_or_default();
    [
        saved.h.shape().to_vec(),
        saved.w.shape().to_vec(),
        bias,
        saved.depthwise.weight.shape().to_vec(),
        d.clone(),
        d.clone(),
        d,
    ]
    .map(|s| (s, DType::F32))
}

/// What the backward of the gradients `asked` for reads, as its operation takes it as inputs,
/// and how many of them are the retired running statistics (inputs only so that their last
/// handles end in it, as in `device_batch_norm`). A pointwise operand the backward does not
/// read is not held for it.
pub(crate) fn read<B: Backend>(saved: Saved<B>, asked: [bool; 7]) -> (Vec<FloatTensor<B>>, usize) {
    let Saved { h, w, gate_in, keep, depthwise, norm } = saved;
    let device_batch_norm::Saved { x: z, gamma, beta, stats, retired, .. } = norm;
    let device_depthwise::Saved { x: g, weight: dw_weight } = depthwise;
    let retired: Vec<_> = retired.into_iter().flatten().collect();
    let count = retired.len();
    let (w, h) = (asked[0].then_some(w), asked[1].then_some(h));
    let inputs = [gate_in, keep, g, dw_weight, z, gamma, beta, stats].into_iter();
    (inputs.chain(w).chain(h).chain(retired).collect(), count)
}

/// The gradients `asked` for from the output's `dy` and [`read`]'s tensors (taken from `ins`,
/// `retired` of them the retired statistics, dropped here).
pub(crate) fn grads_from_read<B: DeviceConvModule>(
    ins: &mut impl Iterator<Item = FloatTensor<B>>,
    dy: FloatTensor<B>,
    chain: Chain,
    asked: [bool; 7],
    retired: usize,
) -> [Option<FloatTensor<B>>; 7] {
    let mut next = || next_of(ins, "the convolution module's backward: its inputs");
    let (gate_in, keep, g, dw_weight) = (next(), next(), next(), next());
    let (z, gamma, beta, stats) = (next(), next(), next(), next());
    let w = asked[0].then(&mut next);
    let h = asked[1].then(&mut next);
    (0..retired).for_each(|_| drop(next()));
    let depthwise = device_depthwise::Saved { x: g, weight: dw_weight };
    let activation = Activation::Swish;
    let norm = device_batch_norm::Saved { x: z, gamma, beta, stats, activation, retired: None };
    grads::<B>(dy, gate_in, keep, depthwise, norm, [w, h], chain, asked)
}

impl<B: DeviceConvModule> DeviceBackward<B, 7> for Chain {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 7] {
        B::conv_module_backward(saved, dy, *self, [true; 7])
            .map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; 7],
    ) -> [Option<FloatTensor<B>>; 7] {
        B::conv_module_backward(saved, dy, *self, tracked)
    }
}

/// The module's parts under autodiff on `B`.
pub(crate) struct Parts<'a, B: Backend> {
    pointwise: &'a Linear<Autodiff<B>>,
    depthwise: &'a DepthwiseConv1d<Autodiff<B>>,
    pub(crate) norm: &'a BatchNorm<Autodiff<B>>,
}

impl<'a, B: Backend> Parts<'a, B> {
    /// The parts, on `C`, as `Autodiff<B>`'s: `None` where `C` is not that type.
    pub(crate) fn of<C: Backend>(
        pointwise: &'a Linear<C>,
        depthwise: &'a DepthwiseConv1d<C>,
        norm: &'a BatchNorm<C>,
    ) -> Option<Self> {
        use std::any::Any;
        let pointwise = (pointwise as &dyn Any).downcast_ref::<Linear<Autodiff<B>>>()?;
        let depthwise = (depthwise as &dyn Any).downcast_ref::<DepthwiseConv1d<Autodiff<B>>>()?;
        let norm = (norm as &dyn Any).downcast_ref::<BatchNorm<Autodiff<B>>>()?;
        Some(Parts { pointwise, depthwise, norm })
    }

    /// The chain's seven parents: `h`, the pointwise layer's weight and bias `b`, the depthwise
    /// convolution's weight and bias, the normalisation's scale and shift.
    pub(crate) fn parents(
        &self,
        b: Tensor<Autodiff<B>, 1>,
        h: Tensor<Autodiff<B>, 3>,
    ) -> [FloatTensor<Autodiff<B>>; 7] {
        let Parts { pointwise, depthwise, norm } = self;
        [
            float(h),
            float(pointwise.weight.val()),
            float(b),
            float(depthwise.weight.val()),
            float(depthwise.bias.val()),
            float(norm.gamma.val()),
            float(norm.beta.val()),
        ]
    }
}

/// The chain under autodiff: one node with `h` and the six parameters as parents (`keep` takes
/// no gradient); the running statistics replaced in `norm` (`running_stats`), the old ones
/// carried to the backward (`device_batch_norm::Saved`'s `retired`).
fn tracked<B: DeviceConvModule>(
    parts: Parts<'_, B>,
    b: Tensor<Autodiff<B>, 1>,
    h: Tensor<Autodiff<B>, 3>,
    keep: Tensor<Autodiff<B>, 3>,
    chain: Chain,
) -> Tensor<Autodiff<B>, 3> {
    let keep = float(keep.inner());
    let inputs = parts.parents(b, h);
    let norm = parts.norm;
    let running = running::<B>(norm);
    let y = device_op::tracked_with(chain, inputs, |chain, inputs| {
        let mut out = B::conv_module_forward(inputs, keep, running, *chain);
        out.saved.norm.retired = Some(retire::<B>(norm, out.running));
        (out.y, out.saved)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// `norm`'s running statistics read as the forward's inputs, `[mean, variance]`.
pub(crate) fn running<B: Backend>(norm: &BatchNorm<Autodiff<B>>) -> [FloatTensor<B>; 2] {
    [norm.running_mean.value_sync(), norm.running_var.value_sync()].map(|t| float(t.inner()))
}

/// `norm`'s running statistics replaced with the forward's `[mean, variance]` (`running_stats`):
/// the old ones, for the backward to carry (`device_batch_norm::Saved`'s `retired`).
pub(crate) fn retire<B: Backend>(
    norm: &BatchNorm<Autodiff<B>>,
    [mean, var]: [FloatTensor<B>; 2],
) -> [FloatTensor<B>; 2] {
    let replace = |state, t| {
        let new =
            Tensor::<Autodiff<B>, 1>::from_inner(Tensor::from_primitive(TensorPrimitive::Float(t)));
        float(running_stats::replace(state, new).inner())
    };
    [replace(&norm.running_mean, mean), replace(&norm.running_var, var)]
}

/// Whether [`train_on_device`] takes these: f32 tensors of its shapes, the pointwise layer with
/// its bias, `keep` untracked, `h` not empty and the indices within 32 bits.
pub(crate) fn fits<B: Backend>(
    pointwise: &Linear<B>,
    depthwise: &DepthwiseConv1d<B>,
    norm: &BatchNorm<B>,
    h: &Tensor<B, 3>,
    keep: &Tensor<B, 3>,
) -> bool {
    let Some(bias) = pointwise.bias.as_ref() else {
        return false;
    };
    let [b, t, d] = h.dims();
    let [k, c] = depthwise.weight.dims();
    let f32s = [
        h.dtype(),
        keep.dtype(),
        pointwise.weight.val().dtype(),
        bias.val().dtype(),
        depthwise.weight.val().dtype(),
        depthwise.bias.val().dtype(),
        norm.gamma.val().dtype(),
        norm.beta.val().dtype(),
    ];
    b * t > 0
        && pointwise.weight.dims() == [d, 2 * d]
        && bias.dims() == [2 * d]
        && keep.dims() == [b, t, 1]
        && !keep.is_require_grad()
        && k % 2 == 1
        && c == d
        && depthwise.bias.dims() == [d]
        && norm.gamma.dims() == [d]
        && f32s.iter().all(|&x| x == DType::F32)
        && b * t * 2 * d <= u32::MAX as usize
}

/// The convolution module's chain in training (see the module) over `h` `[B, T, d]` with the
/// time mask `keep` `[B, T, 1]` (1 on valid frames, not tracked): `pointwise` `d -> 2d` with its
/// bias, its GLU times `keep`, `depthwise`, then `norm` with its Swish, updating `norm`'s
/// running statistics, as one operation each way where the backend is one of the trainer's
/// CubeCL types under autodiff, the tensors f32 of those shapes, `h` not empty and the indices
/// within 32 bits; `None` elsewhere (nothing is then updated), and the caller runs the parts.
pub fn train_on_device<B: Backend>(
    pointwise: &Linear<B>,
    depthwise: &DepthwiseConv1d<B>,
    norm: &BatchNorm<B>,
    h: &Tensor<B, 3>,
    keep: &Tensor<B, 3>,
) -> Option<Tensor<B, 3>> {
    if !fits(pointwise, depthwise, norm, h, keep) {
        return None;
    }
    let bias = pointwise.bias.as_ref()?;
    let kernel = device_matmul::chosen();
    let chain = Chain { kernel, eps: norm.epsilon, momentum: norm.momentum };
    on_cube_types!(
        B,
        T,
        {
            let parts = Parts::<T>::of(pointwise, depthwise, norm)?;
            let bias = cast(bias.val())?;
            cast(tracked::<T>(parts, bias, cast(h.clone())?, cast(keep.clone())?, chain))
        },
        { None }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_gates::Gate;
    use crate::model::device_matmul::GateMask;
    use burn::module::Param;
    use burn::nn::{BatchNormConfig, LinearConfig};
    use burn::tensor::Distribution;

    /// The chain over random inputs (`lens` the utterances' frames, `t` the longest, `d`
    /// channels, `k` taps) as one operation and as its three operations one by one, under
    /// autodiff: the output, the seven gradients under a weighted sum of the output and the
    /// running statistics after, each pair as bits. With `h` not tracked its gradient is not
    /// computed (nor the pointwise weight read for it).
    fn against_its_parts<B: DeviceConvModule>(
        lens: &[usize],
        t: usize,
        [d, k]: [usize; 2],
        track_h: bool,
    ) {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 31);
        let b = lens.len();
        let normal = |s| Distribution::Normal(0.0, s);
        // Drawn once: the device's generator is shared by the tests running beside this one.
        let h = Tensor::<B, 3>::random([b, t, d], normal(1.0), &device);
        let w = Tensor::<B, 2>::random([d, 2 * d], normal(0.3), &device);
        let bias = Tensor::<B, 1>::random([2 * d], normal(0.3), &device);
        let dw_weight = Tensor::<B, 2>::random([k, d], normal(0.4), &device);
        let dw_bias = Tensor::<B, 1>::random([d], normal(0.3), &device);
        let gamma = Tensor::<B, 1>::random([d], Distribution::Normal(1.0, 0.3), &device);
        let beta = Tensor::<B, 1>::random([d], normal(0.3), &device);
        let weights = Tensor::<B, 3>::random([b, t, d], normal(1.0), &device);
        let keep = crate::model::mask::valid::<B>(lens, t, &device).float().reshape([b, t, 1]);
        let run = |one: bool| {
            let param1 = |x: &Tensor<B, 1>| Param::from_tensor(Tensor::from_inner(x.clone()));
            let param2 = |x: &Tensor<B, 2>| Param::from_tensor(Tensor::from_inner(x.clone()));
            let mut pointwise = LinearConfig::new(d, 2 * d).init::<A<B>>(&device);
            pointwise.weight = param2(&w);
            pointwise.bias = Some(param1(&bias));
            let mut depthwise = DepthwiseConv1d::<A<B>>::new(d, k, &device);
            depthwise.weight = param2(&dw_weight);
            depthwise.bias = param1(&dw_bias);
            let mut norm = BatchNormConfig::new(d).with_momentum(0.3).init::<A<B>>(&device);
            norm.gamma = param1(&gamma);
            norm.beta = param1(&beta);
            let ha = Tensor::<A<B>, 3>::from_inner(h.clone());
            let ha = if track_h { ha.require_grad() } else { ha };
            let keep = Tensor::<A<B>, 3>::from_inner(keep.clone());
            let y = if one {
                train_on_device(&pointwise, &depthwise, &norm, &ha, &keep).expect("it runs")
            } else {
                let (w, b) = (pointwise.weight.val(), pointwise.bias.as_ref().expect("a bias"));
                let g = device_matmul::linear_gated(
                    &ha,
                    &w,
                    &b.val(),
                    Gate::Glu,
                    GateMask::Mask(&keep),
                )
                .expect("the pointwise layer");
                let z =
                    device_depthwise::on_device(&g, &depthwise.weight.val(), &depthwise.bias.val())
                        .expect("the depthwise convolution");
                device_batch_norm::train_on_device(&norm, &z, Activation::Swish)
                    .expect("the normalisation")
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let data2 =
                |p: &Param<Tensor<A<B>, 2>>| p.val().grad(&grads).expect("a gradient").into_data();
            let data1 =
                |p: &Param<Tensor<A<B>, 1>>| p.val().grad(&grads).expect("a gradient").into_data();
            let dh = ha.grad(&grads);
            assert_eq!(dh.is_some(), track_h, "h's gradient where h is tracked");
            let g = vec![
                dh.map_or_else(|| TensorData::from([0f32]), |g| g.into_data()),
                data2(&pointwise.weight),
                data1(pointwise.bias.as_ref().expect("a bias")),
                data2(&depthwise.weight),
                data1(&depthwise.bias),
                data1(&norm.gamma),
                data1(&norm.beta),
                norm.running_mean.value_sync().inner().into_data(),
                norm.running_var.value_sync().inner().into_data(),
            ];
            (y.inner().into_data(), g)
        };
        let (y, g) = run(true);
        let (y0, g0) = run(false);
        let what = format!("{lens:?} of {t} frames, {d} channels, {k} taps, h tracked {track_h}");
        assert_eq!(y, y0, "{what}: the output");
        let names = ["h", "w", "b", "depthwise weight", "depthwise bias", "scale", "shift"];
        let names = names.iter().map(|n| format!("{n}'s gradient"));
        let names: Vec<_> =
            names.chain(["running mean".into(), "running variance".into()]).collect();
        for (i, name) in names.iter().enumerate() {
            assert_eq!(g[i], g0[i], "{what}: {name}");
        }
        // Not vacuous: the statistics moved from their initial zeros and ones.
        let mean = g[7].to_vec::<f32>().expect("f32");
        assert!(mean.iter().any(|&m| m != 0.0), "{what}: the running mean was updated");
    }

    #[test]
    fn the_convolution_module_is_its_three_operations_bit_for_bit() {
        type W = burn::backend::Wgpu;
        type F = Fusion<W>;
        against_its_parts::<W>(&[7, 4], 7, [16, 5], true);
        against_its_parts::<F>(&[7, 4], 7, [16, 5], true);
        against_its_parts::<W>(&[7, 4], 7, [16, 5], false);
        against_its_parts::<F>(&[7, 4], 7, [16, 5], false);
        against_its_parts::<F>(&[1], 1, [8, 3], true);
        // More rows than a cube of the normalisation's and convolution's kernels.
        against_its_parts::<F>(&[150, 97, 120], 150, [24, 9], true);
    }

    /// The chain refuses what it does not take, and updates nothing then.
    #[test]
    fn a_layer_without_its_bias_or_a_tracked_mask_is_refused() {
        type A = Autodiff<burn::backend::Wgpu>;
        let device = Default::default();
        let (d, k) = (8, 3);
        let pointwise = LinearConfig::new(d, 2 * d).with_bias(false).init::<A>(&device);
        let depthwise = DepthwiseConv1d::<A>::new(d, k, &device);
        let norm = BatchNormConfig::new(d).init::<A>(&device);
        let h = Tensor::<A, 3>::ones([2, 4, d], &device);
        let keep = Tensor::<A, 3>::ones([2, 4, 1], &device);
        assert!(train_on_device(&pointwise, &depthwise, &norm, &h, &keep).is_none());
        let pointwise = LinearConfig::new(d, 2 * d).init::<A>(&device);
        let tracked_keep = keep.clone().require_grad();
        assert!(train_on_device(&pointwise, &depthwise, &norm, &h, &tracked_keep).is_none());
        let wrong = Tensor::<A, 3>::ones([2, 4, d + 1], &device);
        assert!(train_on_device(&pointwise, &depthwise, &norm, &wrong, &keep).is_none());
        let mean = norm.running_mean.value_sync().into_data().to_vec::<f32>().expect("f32");
        assert!(mean.iter().all(|&m| m == 0.0), "nothing was updated");
        // The bare backend (evaluation) is not taken either.
        let bare = LinearConfig::new(d, 2 * d).init::<burn::backend::Wgpu>(&device);
        let dw = DepthwiseConv1d::<burn::backend::Wgpu>::new(d, k, &device);
        let bn = BatchNormConfig::new(d).init::<burn::backend::Wgpu>(&device);
        let h = Tensor::<burn::backend::Wgpu, 3>::ones([2, 4, d], &device);
        let keep = Tensor::<burn::backend::Wgpu, 3>::ones([2, 4, 1], &device);
        assert!(train_on_device(&bare, &dw, &bn, &h, &keep).is_none());
    }
}
