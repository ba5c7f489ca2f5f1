//! A Conformer block's self-attention module with the residual connection and the layer
//! normalisation after it (`encoder::RelPositionAttention::context`, then its output layer in
//! `residual_then_norm`) as one autodiff node, and under fusion one operation each way, on the
//! CubeCL backends (wgpu, CUDA; fused or not) in f32 under autodiff.
//!
//! Run as two operations, the whole self-attention (`device_self_attention`) and its output
//! layer with the residual and the normalisation (`device_residual_norm`), they are two
//! operations of fusion's stream each way: 4 of a block's, 96 of a step's at the 0.6B preset's
//! 24 layers, where a GPU step is bound by the host's cost per operation (bench/RESULTS.md,
//! "The kit on an H200: cuBLAS's products bring the 0.6B step to PyTorch's"). Here they are one
//! operation each way, which launches the same kernels in the same order on the same inputs:
//! the bits of the two.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff, with f32 tensors, where the self-attention takes its shapes
//! (`device_self_attention::fits`), the output layer has a bias and the residual's dropout
//! draws (training); the residual's input and the positions are given back elsewhere, and the
//! caller runs the two operations. It is a link of `device_residual_norm`'s chain, as
//! `device_feed_forward` is (`encoder::ConformerLayer` takes it only where the chain fits;
//! `ASRT_RESIDUAL_NORM_OP=0` or `ASRT_ATTENTION_OP=0` turns it off): its output is the
//! normalised, the residual's output is given back untracked, and the handoffs are that
//! module's.
//!
//! Invariants: the dropouts' rules are drawn in the two operations' order (the attention's
//! weights', then the residual's); the backward keeps what the two kept (the self-attention's
//! `Saved`, the context, the output layer's weight, the residual's output and the
//! normalisation's statistics) and computes the normalisation's and the output layer's
//! gradients, then the self-attention's, each only where needed.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_context::Attend;
use super::device_layer_norm;
use super::device_matmul::{self, chosen, Kernel};
use super::device_op::{self, next_of, on_cube_types, DeviceBackward};
use super::device_residual_norm::{self, Links};
use super::device_self_attention::{self as attention, DeviceSelfAttention, SelfAttention};
use super::dropout::{Dropout, NextNorm, Rule};
use super::handoff::Handoff;
use super::host_depthwise::{float, same};

/// The node's parents, in order: the residual's input, the self-attention's eleven
/// (`device_self_attention`'s, its input first), the output layer's weight and bias, and the
/// normalisation's scale and shift.
const PARENTS: usize = 16;

/// The self-attention's parents' place among the node's.
const ATTENTION: std::ops::Range<usize> = 1..12;

/// The operation's settings: the self-attention's, the output layer's kernel, the residual's
/// dropout rule and the normalisation's epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    attention: SelfAttention,
    kernel: Kernel,
    rule: Rule,
    eps: f64,
}

/// What the backward needs: the self-attention's, then `device_residual_norm`'s (the context,
/// the output layer's weight, the normalisation's).
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    attention: attention::Saved<B>,
    rest: device_residual_norm::Saved<B>,
}

/// The module with its residual and normalisation as one operation (see the module): the
/// backends that have it. The provided methods run the parts on `Self`; under fusion
/// ([`Fusion`]'s override) on the inner backend inside one operation of the stream.
pub trait DeviceAttentionModule: DeviceSelfAttention {
    /// From the [`PARENTS`] and `keep` `[B, T, 1]`: the normalised, the residual's output and
    /// what the backward needs.
    fn attention_module_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        let [x, n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos, w_out, b_out, gamma, beta] = inputs;
        let parts = [n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos];
        let (h, attention) = Self::self_attention_forward(parts, keep, s.attention);
        let norm = [gamma.clone(), beta];
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
        (normed, r, Saved { attention, rest })
    }

    /// The gradients of the [`PARENTS`] that `asked` names, from the normalised's `dy` and
    /// `addend`, the residual's output's other gradient.
    fn attention_module_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let Saved { attention, rest } = saved;
        let device_residual_norm::Saved { norm, h, w } = rest;
        let rest_asked = split(asked);
        let (w, h) = (rest_asked[1].then_some(w), rest_asked[2].then_some(h));
        let attention = rest_asked[1].then_some(attention);
        grads::<Self>(norm, [w, h], attention, dy, addend, s, asked)
    }
}

/// What `device_residual_norm::grads` is asked for: the context's gradient wherever one of the
/// self-attention's parents is tracked.
fn split(asked: [bool; PARENTS]) -> [bool; 6] {
    let hidden = asked[ATTENTION].iter().any(|&a| a);
    [asked[0], hidden, asked[12], asked[13], asked[14], asked[15]]
}

/// The backward on `B`: the normalisation's and the output layer's (`device_residual_norm`),
/// then the self-attention's from the context's gradient, each operand given only where read
/// (`[w_out, h]`: the layer's input's gradient reads its weight, its weight's its input; the
/// self-attention's `Saved` where the context's gradient is asked for).
fn grads<B: DeviceSelfAttention>(
    norm: device_layer_norm::Saved<B>,
    [w_out, h]: [Option<FloatTensor<B>>; 2],
    attention: Option<attention::Saved<B>>,
    dy: FloatTensor<B>,
    addend: Option<FloatTensor<B>>,
    s: Settings,
    asked: [bool; PARENTS],
) -> [Option<FloatTensor<B>>; PARENTS] {
    let settings = (s.rule, s.kernel);
    let [dr, dh, dw_out, db_out, d_gamma, d_beta] =
        device_residual_norm::grads::<B>(norm, w_out, h, dy, addend, settings, split(asked));
    let mut all: [Option<FloatTensor<B>>; PARENTS] = Default::default();
    if let (Some(dh), Some(saved)) = (dh, attention) {
        let mut parts = [false; 11];
        parts.copy_from_slice(&asked[ATTENTION]);
        let grads = B::self_attention_backward(saved, dh, s.attention, parts);
        for (slot, g) in all[ATTENTION].iter_mut().zip(grads) {
            *slot = g;
        }
    }
    all[0] = dr;
    [all[12], all[13], all[14], all[15]] = [dw_out, db_out, d_gamma, d_beta];
    all
}

impl<R, F, I, BT> DeviceAttentionModule for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceAttentionModule for Fusion<B>
where
    B: FusionBackend + DeviceAttentionModule,
{
    /// One operation of fusion's stream, its outputs the normalised, the residual's output,
    /// the normalisation's statistics and what the self-attention makes
    /// (`device_self_attention::made_shapes`, the context first).
    fn attention_module_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        let dims = inputs[0].shape.to_vec();
        let (rows, _) = device_layer_norm::rows_and_width(&dims);
        let made = attention::made_shapes(inputs[1].shape.dims::<3>(), s.attention);
        let ours = [dims.clone(), dims, vec![rows, 2]].map(|s| (s, DType::F32));
        let outputs = ours.into_iter().chain(made).collect();
        let [n, pos, w_pos, w_out, gamma] = [1, 10, 11, 12, 14].map(|i| inputs[i].clone());
        let all = inputs.into_iter().chain([keep.clone()]).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let Ok(ins) = <[FloatTensor<B>; PARENTS + 1]>::try_from(ins) else {
                unreachable!("the self-attention module: seventeen inputs")
            };
            let [x, n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos, w_out, b_out, gamma, beta, keep] =
                ins;
            let inputs =
                [x, n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos, w_out, b_out, gamma, beta];
            let (normed, r, saved) = B::attention_module_forward(inputs, keep, s);
            let Saved { attention, rest } = saved;
            let made = attention::made(rest.h, attention);
            [normed, r, rest.norm.stats].into_iter().chain(made).collect()
        };
        let outs = in_stream_vec::<B, _>("self-attention module", all, outputs, run);
        let mut outs = outs.into_iter();
        let what = "the self-attention module: its outputs";
        let [normed, r, stats] = [(); 3].map(|_| next_of(&mut outs, what));
        let (h, attention) = attention::from_made(&mut outs, [n, pos, w_pos, keep], s.attention);
        let norm = device_layer_norm::Saved { x: r.clone(), gamma, stats };
        let rest = device_residual_norm::Saved { norm, h, w: w_out };
        (normed, r, Saved { attention, rest })
    }

    /// One operation of fusion's stream, its inputs `dy`, the addend, what the forward kept
    /// and the operands read, its outputs the gradients asked for.
    fn attention_module_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let Saved { attention, rest } = saved;
        let device_residual_norm::Saved { norm, h, w: w_out } = rest;
        let device_layer_norm::Saved { x: r, gamma, stats } = norm;
        let width = gamma.shape.to_vec();
        let parts = attention::grad_shapes(&attention, s.attention);
        let shapes = [(r.shape.to_vec(), DType::F32)].into_iter().chain(parts);
        let ours = [w_out.shape.to_vec(), width.clone(), width.clone(), width];
        let shapes = shapes.chain(ours.map(|s| (s, DType::F32)));
        let outputs: Vec<_> = shapes.zip(asked).filter(|(_, a)| *a).map(|(s, _)| s).collect();
        let rest_asked = split(asked);
        let has_addend = addend.is_some();
        // An operand the backward does not read is not held for it.
        let (w_out, h) = (rest_asked[1].then_some(w_out), rest_asked[2].then_some(h));
        let attention = rest_asked[1].then(|| attention::read(attention)).into_iter().flatten();
        let inputs = [dy].into_iter().chain(addend).chain([r, gamma, stats]);
        let inputs = inputs.chain(w_out).chain(h).chain(attention).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let what = "the self-attention module's backward: its inputs";
            let dy = next_of(&mut ins, what);
            let addend = has_addend.then(|| next_of(&mut ins, what));
            let [r, gamma, stats] = [(); 3].map(|_| next_of(&mut ins, what));
            let w_out = rest_asked[1].then(|| next_of(&mut ins, what));
            let h = rest_asked[2].then(|| next_of(&mut ins, what));
            let saved = rest_asked[1].then(|| attention::from_read(&mut ins, s.attention));
            let norm = device_layer_norm::Saved { x: r, gamma, stats };
            let grads = grads::<B>(norm, [w_out, h], saved, dy, addend, s, asked);
            grads.into_iter().flatten().collect()
        };
        let name = "self-attention module backward";
        let mut grads = in_stream_vec::<B, _>(name, inputs, outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The operation as an autodiff node: its settings and `device_residual_norm`'s handoffs.
#[derive(Debug, Clone)]
struct AttentionModule {
    settings: Settings,
    links: Links,
}

impl<B: DeviceAttentionModule> DeviceBackward<B, PARENTS> for AttentionModule {
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
            B::attention_module_backward(saved, dy, addend, self.settings, asked)
        })
    }
}

/// The self-attention's parts as `encoder::RelPositionAttention` holds them, as
/// `device_self_attention::on_device` takes them: the projections (query, key, value), the
/// query's position biases `u` and `v` (`[H, dk]`, `heads` = `H`), the positions' layer's
/// weight (no bias), the scores' divisor and the weights' dropout.
#[derive(Debug)]
pub struct Attention<'a, B: Backend> {
    pub layers: [&'a Linear<B>; 3],
    pub pos_biases: [Tensor<B, 2>; 2],
    pub heads: usize,
    pub w_pos: Tensor<B, 2>,
    pub divisor: f64,
    pub dropout: &'a Dropout,
}

/// What a refusal gives back: the residual's input and the positions.
pub type GivenBack<B> = (Tensor<B, 3>, Tensor<B, 3>);

/// `x + dropout(out(attention(n)))`, then `next`'s normalisation of it (`pos` the positions
/// `[1, 2T - 1, d]`, `keep` `[B, T, 1]`): `[the residual's output, untracked; the normalised]`,
/// one node with `x`, the self-attention's parents, `out`'s weight and bias and the
/// normalisation's scale and shift as parents, claiming `next.handoff` and handing `x`'s
/// gradient over `handoff` where claimed, as `device_residual_norm::linear_residual_then_norm`
/// does; `(x, pos)` given back elsewhere (see the module), with no dropout drawn.
#[allow(clippy::too_many_arguments)]
pub fn train_on_device<B: Backend>(
    att: Attention<'_, B>,
    out: &Linear<B>,
    dropout: &Dropout,
    x: Tensor<B, 3>,
    n: &Tensor<B, 3>,
    pos: Tensor<B, 3>,
    keep: &Tensor<B, 3>,
    handoff: Option<&Handoff>,
    next: NextNorm<'_, B>,
) -> Result<[Tensor<B, 3>; 2], GivenBack<B>> {
    let Some(b_out) = &out.bias else {
        return Err((x, pos));
    };
    let (w_out, b_out) = (out.weight.val(), b_out.val());
    let (layers, heads) = (att.layers, att.heads);
    let parts = attention::fits(n, layers, &att.pos_biases, heads, &pos, &att.w_pos, keep);
    // The context has the attention's input's shape.
    let fits = parts.is_some() && device_matmul::residual_norm_fits(&x, n, &w_out, &b_out, &next);
    let device = x.device();
    let (Some((weights, biases)), true, true) = (parts, fits, dropout.draws::<B>(&device)) else {
        return Err((x, pos));
    };
    let (kernel, stacks) = (chosen(), device_matmul::stack_kernel());
    let divisor = att.divisor as f32;
    let group = (n, weights, biases, att.pos_biases);
    on_cube_types!(
        B,
        T,
        {
            type A = Autodiff<T>;
            let Some(parts) = attention::primitives::<B, A>(group, pos.clone(), &att.w_pos) else {
                return Err((x, pos));
            };
            // The rules in the two operations' order (see the module); the residual's draws
            // (above).
            let weights_rule = att.dropout.draw::<B>(&device);
            let Some(rule) = dropout.draw::<B>(&device) else {
                unreachable!("the residual's dropout draws in training (Dropout::draws)")
            };
            let context = Attend { divisor, rule: weights_rule, kernel: stacks, linear: kernel };
            let attention = SelfAttention { heads, kernel, context };
            let settings = Settings { attention, kernel, rule, eps: next.eps };
            let op = AttentionModule { settings, links: Links::new(handoff, next.handoff) };
            let t1 = |t: Tensor<B, 1>| float(same::<_, Tensor<A, 1>>(t));
            let x = float(same::<_, Tensor<A, 3>>(x));
            let w_out = float(same::<_, Tensor<A, 2>>(w_out));
            let [b_out, gamma, beta] = [b_out, next.gamma, next.beta].map(t1);
            let [n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos] = parts;
            let inputs =
                [x, n, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos, w_out, b_out, gamma, beta];
            let keep = float(same::<_, Tensor<A, 3>>(keep.clone()).inner());
            let (normed, r) = device_op::tracked_with_more(op, inputs, |op, inputs| {
                let (normed, r, saved) = T::attention_module_forward(inputs, keep, op.settings);
                (normed, saved, r)
            });
            Ok(device_residual_norm::outputs::<T, 3>(r, normed).map(same))
        },
        { Err((x, pos)) }
    );
    Err((x, pos))
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_residual_norm::linear_residual_then_norm;
    use crate::model::dropout::seed_stream;
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// The block's way: its input normalised (claiming the first handoff), then the
    /// self-attention with its output layer, residual and the next normalisation as this
    /// operation, against `device_self_attention::on_device` then `linear_residual_then_norm`
    /// (the two operations it replaces) from the same dropout seeds; then a second residual
    /// connection reading the untracked output, which hands its gradient back. The normalised
    /// outputs and the gradients of the block's input, the positions and every parameter under
    /// a weighted sum, bit for bit, bare and fused wgpu; no gradient lost.
    fn against_its_parts<B: DeviceAttentionModule>(lens: &[usize], t: usize, h: usize, dk: usize) {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 41);
        let (b, d) = (lens.len(), h * dk);
        let normal = |dims: [usize; 3], s: f64| {
            Tensor::<B, 3>::random(dims, Distribution::Normal(0.0, s), &device)
        };
        let matrix = |i: usize, o: usize, s: f64| normal([1, i, o], s).reshape([i, o]);
        let vector = |n: usize, mean: f64| normal([1, 1, n], 0.3).reshape([n]).add_scalar(mean);
        // Drawn once: the device's generator is shared by the tests running beside this one.
        let x = normal([b, t, d], 1.0).mul_scalar(2.0);
        let (weights, h2) = (normal([b, t, d], 1.0), normal([b, t, 8], 1.0));
        let ws: [Tensor<B, 2>; 5] = std::array::from_fn(|_| matrix(d, d, 0.3));
        let bs: [Tensor<B, 1>; 5] = std::array::from_fn(|_| vector(d, 0.0));
        let uv: [Tensor<B, 2>; 2] = std::array::from_fn(|_| matrix(h, dk, 0.3));
        let pos = normal([1, 2 * t - 1, d], 1.0);
        let w2 = matrix(8, d, 0.3);
        let [g0, g1, g2] = [0, 1, 2].map(|_| vector(d, 1.0));
        let [s0, s1, s2] = [0, 1, 2].map(|_| vector(d, 0.0));
        let keep = crate::model::mask::valid::<B>(lens, t, &device).float().reshape([b, t, 1]);
        let divisor = (dk as f64).sqrt();
        let (weights_dropout, dropout) = (Dropout::new(0.2), Dropout::new(0.1));
        let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        let bits2 = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
        let bits1 = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
        let run = |one: bool| {
            seed_stream(99);
            let t3 = |t: &Tensor<B, 3>| Tensor::<A<B>, 3>::from_inner(t.clone()).require_grad();
            let t2 = |t: &Tensor<B, 2>| Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad();
            let t1 = |t: &Tensor<B, 1>| Tensor::<A<B>, 1>::from_inner(t.clone()).require_grad();
            let (xa, h2a, pos_a) = (t3(&x), t3(&h2), t3(&pos));
            let layer = |w: &Tensor<B, 2>, b: Option<&Tensor<B, 1>>| {
                let [i, o] = w.dims();
                let mut l = LinearConfig::new(i, o).init::<A<B>>(&device);
                l.weight = Param::from_tensor(t2(w));
                l.bias = b.map(|b| Param::from_tensor(t1(b)));
                l
            };
            let qkvo: [_; 4] = std::array::from_fn(|i| layer(&ws[i], Some(&bs[i])));
            let positions = layer(&ws[4], None);
            let second = layer(&w2, Some(&bs[4]));
            let [u, v] = uv.each_ref().map(t2);
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
            let layers = [&qkvo[0], &qkvo[1], &qkvo[2]];
            let w_pos = positions.weight.val();
            let out = &qkvo[3];
            let [r1, n1] = if one {
                let att = Attention {
                    layers,
                    pos_biases: [u.clone(), v.clone()],
                    heads: h,
                    w_pos: w_pos.clone(),
                    divisor,
                    dropout: &weights_dropout,
                };
                let (x, n, p) = (xa.clone(), &n0, pos_a.clone());
                train_on_device(
                    att,
                    out,
                    &dropout,
                    x,
                    n,
                    p,
                    &keep,
                    link.first(),
                    next(&g1a, &s1a, 1),
                )
                .map_err(|_| "refused")
                .expect("a CubeCL type")
            } else {
                let biases = [u.clone(), v.clone()];
                let on = attention::on_device;
                let c = on(
                    &n0,
                    layers,
                    biases,
                    h,
                    pos_a.clone(),
                    &w_pos,
                    &keep,
                    divisor,
                    &weights_dropout,
                )
                .map_err(|_| "refused")
                .expect("the self-attention");
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
            let mut all = vec![bits(n2.inner()), bits(n1.inner()), g3(&xa), g3(&h2a), g3(&pos_a)];
            all.extend(qkvo.iter().chain([&second]).map(gw));
            all.extend(qkvo.iter().chain([&second]).map(gb));
            all.push(gw(&positions));
            all.extend([&u, &v].map(|t| bits2(t.grad(&grads).expect("tracked"))));
            all.extend(vectors.iter().map(|t| bits1(t.grad(&grads).expect("tracked"))));
            all
        };
        let (one, two) = (run(true), run(false));
        let what = ["output", "normalised", "x", "h2", "pos", "wq", "wk", "wv", "w_out", "w2"];
        let what = what.iter().chain(&["bq", "bk", "bv", "b_out", "b2", "w_pos", "u", "v"]);
        let what = what.chain(&["g0", "g1", "g2", "s0", "s1", "s2"]);
        assert_eq!(one.len(), two.len());
        for (k, what) in what.enumerate() {
            assert_eq!(one[k], two[k], "{lens:?} of {t}, {h} heads of {dk}: {what}");
        }
    }

    #[test]
    fn the_module_with_its_residual_is_its_two_operations_bit_for_bit() {
        type W = burn::backend::Wgpu;
        let ((), failures) = crate::device_failure::captured(|| {
            against_its_parts::<W>(&[9, 6], 9, 2, 8);
            against_its_parts::<Fusion<W>>(&[9, 6], 9, 2, 8);
            against_its_parts::<Fusion<W>>(&[1], 1, 4, 4);
        });
        assert_eq!(failures, Vec::<String>::new(), "no gradient lost");
    }
}
