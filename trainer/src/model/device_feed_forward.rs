//! A Conformer block's feed-forward module with the residual connection and the layer
//! normalisation after it (`encoder::FeedForward`, then `residual_then_norm`) as one autodiff
//! node, and under fusion one operation each way, on the CubeCL backends (wgpu, CUDA; fused or
//! not) in f32 under autodiff.
//!
//! Run as two operations, the module's first layer with its Swish and dropout
//! (`device_matmul::linear_gated`) and its second layer with the residual and the normalisation
//! (`device_residual_norm`), they are two operations of fusion's stream each way: 8 of a
//! block's (its two feed-forward modules), 192 of a step's at the 0.6B preset's 24 layers,
//! where a GPU step is bound by the host's cost per operation (bench/RESULTS.md, "The kit on
//! an H200: cuBLAS's products bring the 0.6B step to PyTorch's"). Here they are one operation
//! each way, which launches the same kernels in the same order on the same inputs: the bits of
//! the two.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff, with f32 tensors, both layers with a bias and both dropouts drawing (training);
//! the residual's input is given back elsewhere, with no dropout drawn, and the caller runs the
//! two operations. It is a link of `device_residual_norm`'s chain (`encoder::ConformerLayer`
//! takes it only where the chain fits, and `ASRT_RESIDUAL_NORM_OP=0` turns both off): its
//! output is the normalised, the residual's output is given back untracked, and the handoffs
//! are that module's.
//!
//! Invariants: the dropouts' rules are drawn in the two operations' order (the module's, then
//! the residual's); the backward keeps what the two kept (the module's input and first weight,
//! the Swish's input, the hidden layer, the second weight, the residual's output and the
//! normalisation's statistics) and computes the normalisation's, the second layer's, then the
//! first layer's gradients, each only where needed.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_gates::{After, Gate};
use super::device_layer_norm::{self, DeviceLayerNorm};
use super::device_matmul::{chosen, DeviceMatmul, Kernel};
use super::device_op::{self, on_cube_types, DeviceBackward};
use super::device_residual_norm::{self, Links};
use super::dropout::{Dropout, NextNorm, Rule};
use super::handoff::Handoff;
use super::host_depthwise::{float, same};

/// The operation's settings: the layers' kernel, the module's dropout rule, the residual's
/// (times its factor) and the normalisation's epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    kernel: Kernel,
    up_rule: Rule,
    rule: Rule,
    eps: f64,
}

/// What the backward needs: the first layer's input and weight and the Swish's input, then
/// `device_residual_norm`'s (the hidden layer, the second weight, the normalisation's).
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    n: FloatTensor<B>,
    w_up: FloatTensor<B>,
    gate_in: FloatTensor<B>,
    rest: device_residual_norm::Saved<B>,
}

impl<B: Backend> Saved<B> {
    /// From the first layer's input and weight, the Swish's input, and `[the residual's
    /// output, the scale, the statistics, the hidden layer, the second weight]`.
    fn new(
        n: FloatTensor<B>,
        w_up: FloatTensor<B>,
        gate_in: FloatTensor<B>,
        [r, gamma, stats, g, w_down]: [FloatTensor<B>; 5],
    ) -> Self {
        let norm = device_layer_norm::Saved { x: r, gamma, stats };
        Saved { n, w_up, gate_in, rest: device_residual_norm::Saved { norm, h: g, w: w_down } }
    }
}

/// The module with its residual and normalisation as one operation (see the module): the
/// backends that have it. The provided methods run the parts on `Self`; under fusion
/// ([`Fusion`]'s override) on the inner backend inside one operation of the stream.
pub trait DeviceFeedForward: DeviceMatmul + DeviceLayerNorm {
    /// From `[x, n, w_up, b_up, w_down, b_down, gamma, beta]` (the residual's input, the
    /// module's input, its layers, the normalisation's scale and shift): the normalised, the
    /// residual's output and what the backward needs.
    fn feed_forward_forward(
        [x, n, w_up, b_up, w_down, b_down, gamma, beta]: [FloatTensor<Self>; 8],
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        // `device_matmul::linear_gated`'s `LinearGate`, then `linear_residual_norm`'s forward.
        let after = After::Dropout(s.up_rule);
        let [g, gate_in] =
            Self::linear_gate_forward(n.clone(), w_up.clone(), b_up, Gate::Swish, after, s.kernel);
        let norm = [gamma.clone(), beta];
        let (x, h, w) = (x, g.clone(), w_down.clone());
        let [r, normed, stats] =
            Self::linear_residual_norm_forward(x, h, w, b_down, s.rule, s.kernel, norm, s.eps);
        let rest = [r.clone(), gamma, stats, g, w_down];
        (normed, r, Saved::new(n, w_up, gate_in, rest))
    }

    /// The gradients of the eight inputs that `asked` names, from the normalised's `dy` and
    /// `addend`, the residual's output's other gradient.
    fn feed_forward_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; 8],
    ) -> [Option<FloatTensor<Self>>; 8] {
        let Saved { n, w_up, gate_in, rest } = saved;
        let device_residual_norm::Saved { norm, h: g, w: w_down } = rest;
        let (rest_asked, up_asked) = split(asked);
        let down = [rest_asked[1].then_some(w_down), rest_asked[2].then_some(g)];
        let up = [up_asked[0].then_some(w_up), up_asked[1].then_some(n)];
        grads::<Self>(norm, down, gate_in, up, dy, addend, s, asked)
    }
}

/// What `device_residual_norm::grads` is asked for (the hidden layer's gradient wherever the
/// first layer needs one), and the first layer's input's and weight's.
fn split(asked: [bool; 8]) -> ([bool; 6], [bool; 2]) {
    let hidden = asked[1] || asked[2] || asked[3];
    ([asked[0], hidden, asked[4], asked[5], asked[6], asked[7]], [asked[1], asked[2]])
}

/// The backward on `B`: the normalisation's and the second layer's (`device_residual_norm`),
/// then the first layer's with its Swish and dropout (`LinearGate`'s), each operand given only
/// where read (`[w_down, g]`, `[w_up, n]`: a layer's input's gradient reads its weight, its
/// weight's its input).
#[allow(clippy::too_many_arguments)]
fn grads<B: DeviceMatmul + DeviceLayerNorm>(
    norm: device_layer_norm::Saved<B>,
    [w_down, g]: [Option<FloatTensor<B>>; 2],
    gate_in: FloatTensor<B>,
    [w_up, n]: [Option<FloatTensor<B>>; 2],
    dy: FloatTensor<B>,
    addend: Option<FloatTensor<B>>,
    s: Settings,
    asked: [bool; 8],
) -> [Option<FloatTensor<B>>; 8] {
    let (rest_asked, _) = split(asked);
    let settings = (s.rule, s.kernel);
    let [dr, dg, dw_down, db_down, d_gamma, d_beta] =
        device_residual_norm::grads::<B>(norm, w_down, g, dy, addend, settings, rest_asked);
    let [dn, dw_up, db_up] = match dg {
        Some(dg) => {
            let after = After::Dropout(s.up_rule);
            B::linear_gate_grads(dg, gate_in, w_up, n, asked[3], Gate::Swish, after, s.kernel)
        }
        None => [None, None, None],
    };
    [dr, dn, dw_up, db_up, dw_down, db_down, d_gamma, d_beta]
}

impl<R, F, I, BT> DeviceFeedForward for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceFeedForward for Fusion<B>
where
    B: FusionBackend + DeviceFeedForward,
{
    /// One operation of fusion's stream, its outputs the normalised, the residual's output and
    /// what the backward reads: the normalisation's statistics, the hidden layer and the
    /// Swish's input.
    fn feed_forward_forward(
        inputs: [FloatTensor<Self>; 8],
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        let dims = inputs[0].shape.to_vec();
        let (rows, _) = device_layer_norm::rows_and_width(&dims);
        let mut hidden = inputs[1].shape.to_vec();
        if let (Some(last), Some(&ff)) = (hidden.last_mut(), inputs[2].shape.to_vec().last()) {
            *last = ff;
        }
        let shapes = [dims.clone(), dims, vec![rows, 2], hidden.clone(), hidden];
        let outputs = shapes.into_iter().map(|s| (s, DType::F32)).collect();
        let [n, w_up, w_down, gamma] = [1, 2, 4, 6].map(|i| inputs[i].clone());
        let run = move |ins: Vec<FloatTensor<B>>| {
            let Ok(ins) = <[FloatTensor<B>; 8]>::try_from(ins) else {
                unreachable!("the feed-forward module: eight inputs")
            };
            let (normed, r, saved) = B::feed_forward_forward(ins, s);
            let stats = saved.rest.norm.stats;
            vec![normed, r, stats, saved.rest.h, saved.gate_in]
        };
        let outs = in_stream_vec::<B, _>("feed-forward module", inputs.into(), outputs, run);
        let Ok([normed, r, stats, g, gate_in]) = <[FloatTensor<Self>; 5]>::try_from(outs) else {
            unreachable!("the feed-forward module: five outputs were declared")
        };
        let rest = [r.clone(), gamma, stats, g, w_down];
        (normed, r, Saved::new(n, w_up, gate_in, rest))
    }

    /// One operation of fusion's stream, its inputs `dy`, the addend, what the forward kept
    /// and the operands read, its outputs the gradients asked for.
    fn feed_forward_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; 8],
    ) -> [Option<FloatTensor<Self>>; 8] {
        let Saved { n, w_up, gate_in, rest } = saved;
        let device_residual_norm::Saved { norm, h: g, w: w_down } = rest;
        let device_layer_norm::Saved { x: r, gamma, stats } = norm;
        let width = gamma.shape.to_vec();
        let ff = vec![w_up.shape.to_vec().last().copied().unwrap_or(1)];
        let shapes = [r.shape.to_vec(), n.shape.to_vec(), w_up.shape.to_vec(), ff];
        let shapes = shapes.into_iter().chain([w_down.shape.to_vec(), width.clone()]);
        let shapes = shapes.chain([width.clone(), width]);
        let outputs: Vec<_> =
            shapes.zip(asked).filter(|(_, a)| *a).map(|(s, _)| (s, DType::F32)).collect();
        let (rest_asked, up_asked) = split(asked);
        let has_addend = addend.is_some();
        // An operand the backward does not read is not held for it.
        let down = [rest_asked[1].then_some(w_down), rest_asked[2].then_some(g)];
        let up = [up_asked[0].then_some(w_up), up_asked[1].then_some(n)];
        let inputs = [dy].into_iter().chain(addend).chain([r, gamma, stats, gate_in]);
        let inputs = inputs.chain(down.into_iter().flatten()).chain(up.into_iter().flatten());
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let mut next = || match ins.next() {
                Some(t) => t,
                None => unreachable!("the feed-forward module's backward: its inputs"),
            };
            let dy = next();
            let addend = has_addend.then(&mut next);
            let (r, gamma, stats, gate_in) = (next(), next(), next(), next());
            let down = [rest_asked[1].then(&mut next), rest_asked[2].then(&mut next)];
            let up = [up_asked[0].then(&mut next), up_asked[1].then(&mut next)];
            let norm = device_layer_norm::Saved { x: r, gamma, stats };
            let grads = grads::<B>(norm, down, gate_in, up, dy, addend, s, asked);
            grads.into_iter().flatten().collect()
        };
        let name = "feed-forward module backward";
        let mut grads = in_stream_vec::<B, _>(name, inputs.collect(), outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The operation as an autodiff node: its settings and `device_residual_norm`'s handoffs.
#[derive(Debug, Clone)]
struct FeedForward {
    settings: Settings,
    links: Links,
}

impl<B: DeviceFeedForward> DeviceBackward<B, 8> for FeedForward {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 8] {
        self.backward_tracked(saved, dy, [true; 8]).map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; 8],
    ) -> [Option<FloatTensor<B>>; 8] {
        self.links.backward::<B, _>(tracked, |addend, asked| {
            B::feed_forward_backward(saved, dy, addend, self.settings, asked)
        })
    }
}

/// `x + factor * dropout(down(dropout(swish(up(n)))))`, then `next`'s normalisation of it:
/// `[the residual's output, untracked; the normalised]`, one node with `x`, `n`, the layers'
/// weights and biases and the normalisation's scale and shift as parents, claiming
/// `next.handoff` and handing `x`'s gradient over `handoff` where claimed, as
/// `device_residual_norm::linear_residual_then_norm` does. `dropouts` are the module's and the
/// residual's. `x` given back elsewhere (see the module), with no dropout drawn.
#[allow(clippy::too_many_arguments)]
pub fn train_on_device<B: Backend>(
    [up, down]: [&Linear<B>; 2],
    [module_dropout, dropout]: [&Dropout; 2],
    factor: f32,
    x: Tensor<B, 3>,
    n: &Tensor<B, 3>,
    handoff: Option<&Handoff>,
    next: NextNorm<'_, B>,
) -> Result<[Tensor<B, 3>; 2], Tensor<B, 3>> {
    let (Some(b_up), Some(b_down)) = (&up.bias, &down.bias) else {
        return Err(x);
    };
    let (w_up, w_down) = (up.weight.val(), down.weight.val());
    let (b_up, b_down) = (b_up.val(), b_down.val());
    let ([d, ff], [ff_b], [ff_down, d_down], [d_b]) =
        (w_up.dims(), b_up.dims(), w_down.dims(), b_down.dims());
    let vectors = [&next.gamma, &next.beta];
    let f32s = [x.dtype(), n.dtype(), w_up.dtype(), b_up.dtype(), w_down.dtype()]
        .into_iter()
        .chain([b_down.dtype()])
        .chain(vectors.iter().map(|t| t.dtype()))
        .all(|t| t == DType::F32);
    let rows = n.shape().num_elements() / d.max(1);
    let fits = x.dims() == n.dims()
        && n.dims()[2] == d
        && ff_b == ff
        && ff_down == ff
        && d_down == d
        && d_b == d
        && vectors.iter().all(|t| t.dims() == [d])
        && rows * ff.max(d) <= u32::MAX as usize;
    let device = x.device();
    let draws = module_dropout.draws::<B>(&device) && dropout.draws::<B>(&device);
    if !f32s || !fits || !draws {
        return Err(x);
    }
    on_cube_types!(
        B,
        T,
        {
            type A = Autodiff<T>;
            // The rules in the two operations' order (see the module); both draw (above).
            let rules = (module_dropout.draw::<B>(&device), dropout.draw::<B>(&device));
            let (Some(up_rule), Some(rule)) = rules else {
                unreachable!("both dropouts draw in training (Dropout::draws)")
            };
            let settings =
                Settings { kernel: chosen(), up_rule, rule: rule.times(factor), eps: next.eps };
            let op = FeedForward { settings, links: Links::new(handoff, next.handoff) };
            let t3 = |t: Tensor<B, 3>| float(same::<_, Tensor<A, 3>>(t));
            let t2 = |t: &Tensor<B, 2>| float(same::<_, Tensor<A, 2>>(t.clone()));
            let t1 = |t: &Tensor<B, 1>| float(same::<_, Tensor<A, 1>>(t.clone()));
            let inputs = [
                t3(x),
                t3(n.clone()),
                t2(&w_up),
                t1(&b_up),
                t2(&w_down),
                t1(&b_down),
                t1(&next.gamma),
                t1(&next.beta),
            ];
            let (normed, r) = device_op::tracked_with_more(op, inputs, |op, inputs| {
                let (normed, r, saved) = T::feed_forward_forward(inputs, op.settings);
                (normed, saved, r)
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
    use crate::model::device_matmul::{linear_gated, GateMask};
    use crate::model::device_residual_norm::linear_residual_then_norm;
    use crate::model::dropout::seed_stream;
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// The block's way: its input normalised (claiming the first handoff), then the module
    /// with its residual and the next normalisation as this operation, against
    /// `linear_gated` then `linear_residual_then_norm` (the two operations it replaces) from the
    /// same dropout seeds; then a second residual connection reading the untracked output,
    /// which hands its gradient back. The normalised outputs and the gradients of the block's
    /// input and every parameter under a weighted sum, bit for bit, bare and fused wgpu, one
    /// row and 3 x 17; no gradient lost.
    #[test]
    fn the_module_with_its_residual_is_its_two_operations_bit_for_bit() {
        type A<B> = Autodiff<B>;
        fn check<B: DeviceFeedForward>(name: &str, lead: [usize; 2]) {
            let device = Default::default();
            B::seed(&device, 23);
            let (d, ff) = (16, 40);
            let normal = |dims: [usize; 3], mean: f64| {
                Tensor::<B, 3>::random(dims, Distribution::Normal(mean, 1.0), &device)
            };
            let x = normal([lead[0], lead[1], d], 0.3).mul_scalar(2.0);
            let (weights, h2) =
                (normal([lead[0], lead[1], d], 0.0), normal([lead[0], lead[1], 8], 0.0));
            let vector = |n: usize, mean: f64| normal([1, 1, n], mean).reshape([n]);
            let matrix = |i: usize, o: usize| normal([1, i, o], 0.0).reshape([i, o]);
            let (w_up, w_down, w2) = (matrix(d, ff), matrix(ff, d), matrix(8, d));
            let (b_up, b_down, b2) = (vector(ff, 0.0), vector(d, 0.0), vector(d, 0.0));
            let [g0, g1, g2] = [0, 1, 2].map(|_| vector(d, 1.0));
            let [s0, s1, s2] = [0, 1, 2].map(|_| vector(d, 0.0));
            let (module_dropout, dropout) = (Dropout::new(0.2), Dropout::new(0.1));
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
                let (up, down, second) =
                    (layer(&w_up, &b_up), layer(&w_down, &b_down), layer(&w2, &b2));
                let vectors = [&g0, &g1, &g2, &s0, &s1, &s2].map(t1);
                let [g0a, g1a, g2a, s0a, s1a, s2a] = vectors.clone();
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
                    let layers = [&up, &down];
                    let dropouts = [&module_dropout, &dropout];
                    train_on_device(
                        layers,
                        dropouts,
                        0.5,
                        xa.clone(),
                        &n0,
                        link.first(),
                        next(&g1a, &s1a, 1),
                    )
                    .map_err(|_| "refused")
                    .expect("a CubeCL type")
                } else {
                    let (w, b) = (up.weight.val(), up.bias.as_ref().expect("a bias").val());
                    let h =
                        linear_gated(&n0, &w, &b, Gate::Swish, GateMask::Dropout(&module_dropout))
                            .expect("a CubeCL type");
                    let rule = dropout.draw::<A<B>>(&device).expect("training").times(0.5);
                    let (w, b) = (down.weight.val(), down.bias.as_ref().expect("a bias").val());
                    linear_residual_then_norm(
                        xa.clone(),
                        &h,
                        &w,
                        &b,
                        rule,
                        link.first(),
                        next(&g1a, &s1a, 1),
                    )
                    .map_err(|_| "refused")
                    .expect("a CubeCL type")
                };
                let tracked =
                    |t: &Tensor<A<B>, 3>| t.clone().into_primitive().tensor().is_tracked();
                assert!(!tracked(&r1), "{name}: the residual's output is untracked");
                // The second connection reads the untracked output and a branch of the
                // normalised, and hands its input's gradient back.
                let h2 = h2a.clone() + n1.clone().slice([0..lead[0], 0..lead[1], 0..8]);
                let rule = Rule::new(5, 0.9);
                let (w, b) = (second.weight.val(), second.bias.as_ref().expect("a bias").val());
                let [_, n2] = linear_residual_then_norm(
                    r1,
                    &h2,
                    &w,
                    &b,
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
                let g2 = |l: &burn::nn::Linear<A<B>>| {
                    bits2(l.weight.val().grad(&grads).expect("tracked"))
                };
                let gb = |l: &burn::nn::Linear<A<B>>| {
                    bits1(l.bias.as_ref().expect("a bias").val().grad(&grads).expect("tracked"))
                };
                let mut all = vec![bits(n2.inner()), bits(n1.inner()), g3(&xa), g3(&h2a)];
                all.extend([g2(&up), g2(&down), g2(&second)]);
                all.extend([gb(&up), gb(&down), gb(&second)]);
                all.extend(vectors.iter().map(|t| bits1(t.grad(&grads).expect("tracked"))));
                all
            };
            let (one, two) = (run(true), run(false));
            let what =
                ["output", "normalised", "x", "h2", "w_up", "w_down", "w2", "b_up", "b_down"];
            let what = what.iter().chain(&["b2", "g0", "g1", "g2", "s0", "s1", "s2"]);
            assert_eq!(one.len(), two.len());
            for (k, what) in what.enumerate() {
                assert_eq!(one[k], two[k], "{name}, {lead:?}: {what}");
            }
        }
        let ((), failures) = crate::device_failure::captured(|| {
            for lead in [[1, 1], [3, 17]] {
                check::<burn::backend::Wgpu>("wgpu", lead);
                check::<Fusion<burn::backend::Wgpu>>("fused wgpu", lead);
            }
        });
        assert_eq!(failures, Vec::<String>::new(), "no gradient lost");
    }
}
