//! A Conformer block's convolution module with the residual connection and the layer
//! normalisation after it (`encoder::ConvModule::hidden`, then its last pointwise layer in
//! `residual_then_norm`) as one autodiff node, and under fusion one operation each way, on the
//! CubeCL backends (wgpu, CUDA; fused or not) in f32 under autodiff.
//!
//! Run as two operations, the module's chain (`device_conv_module`) and its last layer with the
//! residual and the normalisation (`device_residual_norm`), they are two operations of fusion's
//! stream each way: 4 of a block's, 96 of a step's at the 0.6B preset's 24 layers, where a GPU
//! step is bound by the host's cost per operation (bench/RESULTS.md, "The kit on an H200:
//! cuBLAS's products bring the 0.6B step to PyTorch's"). Here they are one operation each way,
//! which launches the same kernels in the same order on the same inputs: the bits of the two.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff, with f32 tensors, where the chain takes its shapes (`device_conv_module::fits`),
//! the last layer has a bias and the residual's dropout draws (training); the residual's input
//! is given back elsewhere, and the caller runs the two operations. It is a link of
//! `device_residual_norm`'s chain, as `device_feed_forward` is (`encoder::ConformerLayer` takes
//! it only where the chain fits, and `ASRT_RESIDUAL_NORM_OP=0` turns it off): its output is the
//! normalised, the residual's output is given back untracked, and the handoffs are that
//! module's.
//!
//! Invariants: the batch normalisation's running statistics are replaced as
//! `device_conv_module` replaces them, the old ones carried to the backward; the residual's
//! dropout rule is drawn once the operation is sure to run; the backward keeps what the two
//! kept (the chain's `Saved`, the chain's output, the last layer's weight, the residual's output
//! and the normalisation's statistics) and computes the normalisation's and the last layer's
//! gradients, then the chain's, each only where needed.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::{BatchNorm, Linear};
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::conv::DepthwiseConv1d;
use super::device_conv_module::{self as conv, Chain, DeviceConvModule, Parts};
use super::device_layer_norm;
use super::device_matmul::{self, chosen, Kernel};
use super::device_op::{self, next_of, on_cube_types, DeviceBackward};
use super::device_residual_norm::{self, Links};
use super::dropout::{Dropout, NextNorm, Rule};
use super::handoff::Handoff;
use super::host_depthwise::{cast, float, same};

/// The node's parents, in order: the residual's input, the chain's seven
/// (`device_conv_module`'s, its input first), the last layer's weight and bias, and the
/// normalisation's scale and shift.
const PARENTS: usize = 12;

/// The chain's parents' place among the node's.
const CHAIN: std::ops::Range<usize> = 1..8;

/// The operation's settings: the chain's, the last layer's kernel, the residual's dropout rule
/// and the normalisation's epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    chain: Chain,
    kernel: Kernel,
    rule: Rule,
    eps: f64,
}

/// What the backward needs: the chain's, then `device_residual_norm`'s (the chain's output,
/// the last layer's weight, the normalisation's).
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    chain: conv::Saved<B>,
    rest: device_residual_norm::Saved<B>,
}

/// The forward's results: the normalised, the residual's output, what the backward needs and
/// the new running mean and variance.
pub struct Forward<B: Backend> {
    normed: FloatTensor<B>,
    r: FloatTensor<B>,
    saved: Saved<B>,
    running: [FloatTensor<B>; 2],
}

/// The module with its residual and normalisation as one operation (see the module): the
/// backends that have it. The provided methods run the parts on `Self`; under fusion
/// ([`Fusion`]'s override) on the inner backend inside one operation of the stream.
pub trait DeviceConvResidual: DeviceConvModule {
    /// From the [`PARENTS`], the time mask `keep` `[B, T, 1]` and the running `[mean,
    /// variance]`.
    fn conv_residual_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        running: [FloatTensor<Self>; 2],
        s: Settings,
    ) -> Forward<Self> {
        let [x, n, w, b, dw_weight, dw_bias, bn_gamma, bn_beta, w_out, b_out, gamma, beta] = inputs;
        let parts = [n, w, b, dw_weight, dw_bias, bn_gamma, bn_beta];
        let f = Self::conv_module_forward(parts, keep, running, s.chain);
        let (h, norm) = (f.y, [gamma.clone(), beta]);
        let (x, w) = (x, w_out.clone());
        let [r, normed, stats] = Self::linear_residual_norm_forward(
            x,
            h.clone(),
            w,
            b_out,
            s.rule,
            s.kernel,
            norm,
            s.eps,
        );
        let norm = device_layer_norm::Saved { x: r.clone(), gamma, stats };
        let rest = device_residual_norm::Saved { norm, h, w: w_out };
        Forward { normed, r, saved: Saved { chain: f.saved, rest }, running: f.running }
    }

    /// The gradients of the [`PARENTS`] that `asked` names, from the normalised's `dy` and
    /// `addend`, the residual's output's other gradient.
    fn conv_residual_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let Saved { chain, rest } = saved;
        let device_residual_norm::Saved { norm, h, w } = rest;
        let rest_asked = split(asked);
        let (w, h) = (rest_asked[1].then_some(w), rest_asked[2].then_some(h));
        let (chain, retired) = match rest_asked[1] {
            true => conv::read(chain, chain_asked(asked)),
            false => (Vec::new(), 0),
        };
        grads::<Self>(norm, [w, h], chain, retired, dy, addend, s, asked)
    }
}

/// What `device_residual_norm::grads` is asked for: the chain's output's gradient wherever one
/// of the chain's parents is tracked.
fn split(asked: [bool; PARENTS]) -> [bool; 6] {
    let hidden = asked[CHAIN].iter().any(|&a| a);
    [asked[0], hidden, asked[8], asked[9], asked[10], asked[11]]
}

/// The chain's parents' part of `asked`.
fn chain_asked(asked: [bool; PARENTS]) -> [bool; 7] {
    let mut part = [false; 7];
    part.copy_from_slice(&asked[CHAIN]);
    part
}

/// The backward on `B`: the normalisation's and the last layer's (`device_residual_norm`),
/// then the chain's from its output's gradient (`device_conv_module::grads_from_read` over
/// `chain`, `device_conv_module::read`'s tensors, `retired` of them the retired statistics),
/// each operand given only where read (`[w_out, h]`: the layer's input's gradient reads its
/// weight, its weight's its input; the chain's where its output's gradient is asked for).
#[allow(clippy::too_many_arguments)]
fn grads<B: DeviceConvModule>(
    norm: device_layer_norm::Saved<B>,
    [w_out, h]: [Option<FloatTensor<B>>; 2],
    chain: Vec<FloatTensor<B>>,
    retired: usize,
    dy: FloatTensor<B>,
    addend: Option<FloatTensor<B>>,
    s: Settings,
    asked: [bool; PARENTS],
) -> [Option<FloatTensor<B>>; PARENTS] {
    let settings = (s.rule, s.kernel);
    let [dr, dh, dw_out, db_out, d_gamma, d_beta] =
        device_residual_norm::grads::<B>(norm, w_out, h, dy, addend, settings, split(asked));
    let mut all: [Option<FloatTensor<B>>; PARENTS] = Default::default();
    if let Some(dh) = dh {
        let mut chain = chain.into_iter();
        let part = chain_asked(asked);
        let grads = conv::grads_from_read::<B>(&mut chain, dh, s.chain, part, retired);
        for (slot, g) in all[CHAIN].iter_mut().zip(grads) {
            *slot = g;
        }
    }
    all[0] = dr;
    [all[8], all[9], all[10], all[11]] = [dw_out, db_out, d_gamma, d_beta];
    all
}

impl<R, F, I, BT> DeviceConvResidual for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceConvResidual for Fusion<B>
where
    B: FusionBackend + DeviceConvResidual,
{
    /// One operation of fusion's stream, its outputs the normalised, the residual's output,
    /// the normalisation's statistics and what the chain makes
    /// (`device_conv_module::made_shapes`, its output first).
    fn conv_residual_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        running: [FloatTensor<Self>; 2],
        s: Settings,
    ) -> Forward<Self> {
        let dims = inputs[0].shape.to_vec();
        let (rows, _) = device_layer_norm::rows_and_width(&dims);
        let made = conv::made_shapes(&inputs[1].shape.to_vec());
        let ours = [dims.clone(), dims, vec![rows, 2]].map(|s| (s, DType::F32));
        let outputs = ours.into_iter().chain(made).collect();
        let [n, w, dw_weight, bn_gamma, bn_beta, w_out, gamma] =
            [1, 2, 4, 6, 7, 8, 10].map(|i| inputs[i].clone());
        let all = inputs.into_iter().chain([keep.clone()]).chain(running).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let inputs = [(); PARENTS].map(|_| next_of(&mut ins, "the module: its inputs"));
            let keep = next_of(&mut ins, "the module: its mask");
            let running = [(); 2].map(|_| next_of(&mut ins, "the module: its statistics"));
            let f = B::conv_residual_forward(inputs, keep, running, s);
            let Saved { chain, rest } = f.saved;
            let made = conv::Forward { y: rest.h, saved: chain, running: f.running };
            [f.normed, f.r, rest.norm.stats].into_iter().chain(conv::made(made)).collect()
        };
        let outs = in_stream_vec::<B, _>("convolution module with its residual", all, outputs, run);
        let mut outs = outs.into_iter();
        let what = "the convolution module with its residual: its outputs";
        let [normed, r, stats] = [(); 3].map(|_| next_of(&mut outs, what));
        let kept = [n, w, keep, dw_weight, bn_gamma, bn_beta];
        let f = conv::from_made(&mut outs, kept);
        let norm = device_layer_norm::Saved { x: r.clone(), gamma, stats };
        let rest = device_residual_norm::Saved { norm, h: f.y, w: w_out };
        Forward { normed, r, saved: Saved { chain: f.saved, rest }, running: f.running }
    }

    /// One operation of fusion's stream, its inputs `dy`, the addend, what the forward kept
    /// and the operands read, its outputs the gradients asked for.
    fn conv_residual_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let Saved { chain, rest } = saved;
        let device_residual_norm::Saved { norm, h, w: w_out } = rest;
        let device_layer_norm::Saved { x: r, gamma, stats } = norm;
        let width = gamma.shape.to_vec();
        let parts = conv::grad_shapes(&chain);
        let shapes = [(r.shape().to_vec(), DType::F32)].into_iter().chain(parts);
        let ours = [w_out.shape.to_vec(), width.clone(), width.clone(), width];
        let shapes = shapes.chain(ours.map(|s| (s, DType::F32)));
        let outputs: Vec<_> = shapes.zip(asked).filter(|(_, a)| *a).map(|(s, _)| s).collect();
        let rest_asked = split(asked);
        let has_addend = addend.is_some();
        // An operand the backward does not read is not held for it.
        let (w_out, h) = (rest_asked[1].then_some(w_out), rest_asked[2].then_some(h));
        let (chain, retired) = match rest_asked[1] {
            true => conv::read(chain, chain_asked(asked)),
            false => (Vec::new(), 0),
        };
        let chain_count = chain.len();
        let inputs = [dy].into_iter().chain(addend).chain([r, gamma, stats]);
        let inputs = inputs.chain(w_out).chain(h).chain(chain).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let what = "the convolution module with its residual's backward: its inputs";
            let dy = next_of(&mut ins, what);
            let addend = has_addend.then(|| next_of(&mut ins, what));
            let [r, gamma, stats] = [(); 3].map(|_| next_of(&mut ins, what));
            let w_out = rest_asked[1].then(|| next_of(&mut ins, what));
            let h = rest_asked[2].then(|| next_of(&mut ins, what));
            let chain = (0..chain_count).map(|_| next_of(&mut ins, what)).collect();
            let norm = device_layer_norm::Saved { x: r, gamma, stats };
            let grads = grads::<B>(norm, [w_out, h], chain, retired, dy, addend, s, asked);
            grads.into_iter().flatten().collect()
        };
        let name = "convolution module with its residual backward";
        let mut grads = in_stream_vec::<B, _>(name, inputs, outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The operation as an autodiff node: its settings and `device_residual_norm`'s handoffs.
#[derive(Debug, Clone)]
struct ConvResidual {
    settings: Settings,
    links: Links,
}

impl<B: DeviceConvResidual> DeviceBackward<B, PARENTS> for ConvResidual {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; PARENTS] {
        self.backward_tracked(saved, dy, [true; PARENTS])
            .map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; PARENTS],
    ) -> [Option<FloatTensor<B>>; PARENTS] {
        self.links.backward::<B, _>(tracked, |addend, asked| {
            B::conv_residual_backward(saved, dy, addend, self.settings, asked)
        })
    }
}

/// `x + dropout(out(chain(n)))`, then `next`'s normalisation of it, `chain` the convolution
/// module's (`pointwise` with its GLU times `keep` `[B, T, 1]`, `depthwise`, `norm` with its
/// Swish, updating `norm`'s running statistics): `[the residual's output, untracked; the
/// normalised]`, one node with `x`, the chain's parents, `out`'s weight and bias and the
/// normalisation's scale and shift as parents, claiming `next.handoff` and handing `x`'s
/// gradient over `handoff` where claimed, as `device_residual_norm::linear_residual_then_norm`
/// does; `x` given back elsewhere (see the module), with no dropout drawn and nothing updated.
#[allow(clippy::too_many_arguments)]
pub fn train_on_device<B: Backend>(
    [pointwise, out]: [&Linear<B>; 2],
    depthwise: &DepthwiseConv1d<B>,
    norm: &BatchNorm<B>,
    dropout: &Dropout,
    x: Tensor<B, 3>,
    n: &Tensor<B, 3>,
    keep: &Tensor<B, 3>,
    handoff: Option<&Handoff>,
    next: NextNorm<'_, B>,
) -> Result<[Tensor<B, 3>; 2], Tensor<B, 3>> {
    let (Some(b_out), Some(bias)) = (&out.bias, &pointwise.bias) else {
        return Err(x);
    };
    let (w_out, b_out) = (out.weight.val(), b_out.val());
    // The chain's output has its input's shape.
    let fits = conv::fits(pointwise, depthwise, norm, n, keep)
        && device_matmul::residual_norm_fits(&x, n, &w_out, &b_out, &next);
    let device = x.device();
    if !fits || !dropout.draws::<B>(&device) {
        return Err(x);
    }
    let (kernel, eps, momentum) = (chosen(), norm.epsilon, norm.momentum);
    let chain = Chain { kernel, eps, momentum };
    on_cube_types!(
        B,
        T,
        {
            type A = Autodiff<T>;
            let (Some(parts), Some(bias), Some(n)) = (
                Parts::<T>::of(pointwise, depthwise, norm),
                cast::<_, Tensor<A, 1>>(bias.val()),
                cast::<_, Tensor<A, 3>>(n.clone()),
            ) else {
                return Err(x);
            };
            // The seed is taken only once the operation is sure to run: a fallback draws its own.
            let Some(rule) = dropout.draw::<B>(&device) else {
                unreachable!("the residual's dropout draws in training (Dropout::draws)")
            };
            let settings = Settings { chain, kernel, rule, eps: next.eps };
            let op = ConvResidual { settings, links: Links::new(handoff, next.handoff) };
            let t1 = |t: Tensor<B, 1>| float(same::<_, Tensor<A, 1>>(t));
            let x = float(same::<_, Tensor<A, 3>>(x));
            let w_out = float(same::<_, Tensor<A, 2>>(w_out));
            let [b_out, gamma, beta] = [b_out, next.gamma, next.beta].map(t1);
            let [n, w, b, dw_weight, dw_bias, bn_gamma, bn_beta] = parts.parents(bias, n);
            let inputs =
                [x, n, w, b, dw_weight, dw_bias, bn_gamma, bn_beta, w_out, b_out, gamma, beta];
            let keep = float(same::<_, Tensor<A, 3>>(keep.clone()).inner());
            let running = conv::running::<T>(parts.norm);
            let (normed, r) = device_op::tracked_with_more(op, inputs, |op, inputs| {
                let mut f = T::conv_residual_forward(inputs, keep, running, op.settings);
                f.saved.chain.norm.retired = Some(conv::retire::<T>(parts.norm, f.running));
                (f.normed, f.saved, f.r)
            });
            Ok(device_residual_norm::outputs::<T, 3>(r, normed).map(same))
        },
        { Err(x) }
    );
    Err(x)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_residual_norm::linear_residual_then_norm;
    use crate::model::dropout::seed_stream;
    use burn::module::Param;
    use burn::nn::{BatchNormConfig, LinearConfig};
    use burn::tensor::Distribution;

    /// The block's way: its input normalised (claiming the first handoff), then the convolution
    /// module with its last layer, residual and the next normalisation as this operation,
    /// against `device_conv_module::train_on_device` then `linear_residual_then_norm` (the two
    /// operations it replaces) from the same dropout seed; then a second residual connection
    /// reading the untracked output, which hands its gradient back. The normalised outputs, the
    /// gradients of the block's input and every parameter under a weighted sum, and the running
    /// statistics after, bit for bit, bare and fused wgpu; no gradient lost.
    fn against_its_parts<B: DeviceConvResidual>(lens: &[usize], t: usize, [d, k]: [usize; 2]) {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 43);
        let b = lens.len();
        let normal = |dims: [usize; 3], s: f64| {
            Tensor::<B, 3>::random(dims, Distribution::Normal(0.0, s), &device)
        };
        let matrix = |i: usize, o: usize, s: f64| normal([1, i, o], s).reshape([i, o]);
        let vector = |n: usize, mean: f64| normal([1, 1, n], 0.3).reshape([n]).add_scalar(mean);
        // Drawn once: the device's generator is shared by the tests running beside this one.
        let x = normal([b, t, d], 1.0).mul_scalar(2.0);
        let (weights, h2) = (normal([b, t, d], 1.0), normal([b, t, 8], 1.0));
        let (w1, b1, w_out, b_out) =
            (matrix(d, 2 * d, 0.3), vector(2 * d, 0.0), matrix(d, d, 0.3), vector(d, 0.0));
        let (dw, dw_b) = (matrix(k, d, 0.3), vector(d, 0.0));
        let (bn_g, bn_b) = (vector(d, 1.0), vector(d, 0.0));
        let (w2, b2) = (matrix(8, d, 0.3), vector(d, 0.0));
        let [g0, g1, g2] = [0, 1, 2].map(|_| vector(d, 1.0));
        let [s0, s1, s2] = [0, 1, 2].map(|_| vector(d, 0.0));
        let keep = crate::model::mask::valid::<B>(lens, t, &device).float().reshape([b, t, 1]);
        let dropout = Dropout::new(0.1);
        let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        let bits2 = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
        let bits1 = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
        let run = |one: bool| {
            seed_stream(99);
            let t3 = |t: &Tensor<B, 3>| Tensor::<A<B>, 3>::from_inner(t.clone()).require_grad();
            let t2 = |t: &Tensor<B, 2>| Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad();
            let t1 = |t: &Tensor<B, 1>| Tensor::<A<B>, 1>::from_inner(t.clone()).require_grad();
            let (xa, h2a) = (t3(&x), t3(&h2));
            let layer = |w: &Tensor<B, 2>, b: &Tensor<B, 1>| {
                let [i, o] = w.dims();
                let mut l = LinearConfig::new(i, o).init::<A<B>>(&device);
                l.weight = Param::from_tensor(t2(w));
                l.bias = Some(Param::from_tensor(t1(b)));
                l
            };
            let (pointwise, out, second) =
                (layer(&w1, &b1), layer(&w_out, &b_out), layer(&w2, &b2));
            let mut depthwise = DepthwiseConv1d::<A<B>>::new(d, k, &device);
            depthwise.weight = Param::from_tensor(t2(&dw));
            depthwise.bias = Param::from_tensor(t1(&dw_b));
            let mut norm = BatchNormConfig::new(d).init::<A<B>>(&device);
            norm.gamma = Param::from_tensor(t1(&bn_g));
            norm.beta = Param::from_tensor(t1(&bn_b));
            let vectors = [&g0, &g1, &g2, &s0, &s1, &s2].map(t1);
            let [g0a, g1a, g2a, s0a, s1a, s2a] = vectors.clone();
            let keep = Tensor::<A<B>, 3>::from_inner(keep.clone());
            let link = [Handoff::new(), Handoff::new()];
            let n0 = device_layer_norm::on_device(&xa, &g0a, Some(&s0a), 1e-5, Some(&link[0]))
                .expect("a CubeCL type");
            let next = |gamma: &Tensor<A<B>, 1>, beta: &Tensor<A<B>, 1>, at: usize| NextNorm {
                gamma: gamma.clone(),
                beta: beta.clone(),
                eps: 1e-5,
                handoff: link.get(at),
                chain: true,
            };
            let [r1, n1] = if one {
                let layers = [&pointwise, &out];
                let x = xa.clone();
                train_on_device(
                    layers,
                    &depthwise,
                    &norm,
                    &dropout,
                    x,
                    &n0,
                    &keep,
                    link.first(),
                    next(&g1a, &s1a, 1),
                )
                .map_err(|_| "refused")
                .expect("a CubeCL type")
            } else {
                let c = conv::train_on_device(&pointwise, &depthwise, &norm, &n0, &keep)
                    .expect("the chain");
                let rule = dropout.draw::<A<B>>(&device).expect("training");
                let (w, b) = (out.weight.val(), out.bias.as_ref().expect("a bias").val());
                linear_residual_then_norm(
                    xa.clone(),
                    &c,
                    &w,
                    &b,
                    rule,
                    link.first(),
                    next(&g1a, &s1a, 1),
                )
                .map_err(|_| "refused")
                .expect("a CubeCL type")
            };
            let tracked = |t: &Tensor<A<B>, 3>| t.clone().into_primitive().tensor().is_tracked();
            assert!(!tracked(&r1), "the residual's output is untracked");
            // The second connection reads the untracked output and a branch of the
            // normalised, and hands its input's gradient back.
            let h2 = h2a.clone() + n1.clone().slice([0..b, 0..t, 0..8]);
            let (w, bias) = (second.weight.val(), second.bias.as_ref().expect("a bias").val());
            let rule = Rule::new(5, 0.9);
            let [_, n2] = linear_residual_then_norm(
                r1,
                &h2,
                &w,
                &bias,
                rule,
                link.get(1),
                next(&g2a, &s2a, 2),
            )
            .map_err(|_| "refused")
            .expect("a CubeCL type");
            let loss = (n2.clone() * Tensor::from_inner(weights.clone())).sum()
                + (n1.clone() * Tensor::from_inner(weights.clone())).sum().mul_scalar(0.25);
            let grads = loss.backward();
            let g3 = |t: &Tensor<A<B>, 3>| bits(t.grad(&grads).expect("tracked"));
            let gw = |l: &Linear<A<B>>| bits2(l.weight.val().grad(&grads).expect("tracked"));
            let gb = |l: &Linear<A<B>>| {
                bits1(l.bias.as_ref().expect("a bias").val().grad(&grads).expect("tracked"))
            };
            let g1 = |t: Tensor<A<B>, 1>| bits1(t.grad(&grads).expect("tracked"));
            let mut all = vec![bits(n2.inner()), bits(n1.inner()), g3(&xa), g3(&h2a)];
            all.extend([&pointwise, &out, &second].map(gw));
            all.extend([&pointwise, &out, &second].map(gb));
            all.push(bits2(depthwise.weight.val().grad(&grads).expect("tracked")));
            all.push(g1(depthwise.bias.val()));
            all.extend([g1(norm.gamma.val()), g1(norm.beta.val())]);
            all.extend(vectors.iter().map(|t| bits1(t.grad(&grads).expect("tracked"))));
            let running = [norm.running_mean.value_sync(), norm.running_var.value_sync()];
            all.extend(running.map(|t| bits1(t.inner())));
            all
        };
        let (one, two) = (run(true), run(false));
        let what = ["output", "normalised", "x", "h2", "w_pw1", "w_out", "w2", "b_pw1", "b_out"];
        let what = what.iter().chain(&["b2", "depthwise", "depthwise bias", "bn gamma", "bn beta"]);
        let what = what.chain(&["g0", "g1", "g2", "s0", "s1", "s2", "running mean", "running var"]);
        assert_eq!(one.len(), two.len());
        for (k, what) in what.enumerate() {
            assert_eq!(one[k], two[k], "{lens:?} of {t}: {what}");
        }
    }

    #[test]
    fn the_module_with_its_residual_is_its_two_operations_bit_for_bit() {
        type W = burn::backend::Wgpu;
        let ((), failures) = crate::device_failure::captured(|| {
            against_its_parts::<W>(&[9, 6], 9, [16, 5]);
            against_its_parts::<Fusion<W>>(&[9, 6], 9, [16, 5]);
            against_its_parts::<Fusion<W>>(&[1], 1, [8, 3]);
        });
        assert_eq!(failures, Vec::<String>::new(), "no gradient lost");
    }
}
