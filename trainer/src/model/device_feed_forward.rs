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
//! The module's input is given (a parent: the previous node's normalised output), or, for the
//! block's first module, the residual's input normalised inside the node (the block's first
//! layer normalisation, `encoder::ConformerLayer::norm_ff1`, its scale and shift parents):
//! that normalisation's forward runs first and its backward last, with the residual's input's
//! gradient as its addend, which its own node received over a handoff: 2 fewer of a block's
//! operations, 48 of a step's.
//!
//! Invariants: the dropouts' rules are drawn in the two operations' order (the module's, then
//! the residual's); the backward keeps what the two (three) kept (the module's input and first
//! weight, the Swish's input, the hidden layer, the second weight, the residual's output and
//! the normalisation's statistics; the first normalisation's statistics) and computes the
//! normalisation's, the second layer's, the first layer's, then the first normalisation's
//! gradients, each only where needed.

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

/// The inputs' and gradients' slots, whichever the module's input: `[x, n, gamma1, beta1,
/// w_up, b_up, w_down, b_down, gamma, beta]` (the residual's input, the module's input, the
/// first normalisation's scale and shift, the layers, the normalisation's scale and shift).
/// A node has the slots of its form: `n` where given, `gamma1` and `beta1` where normalised
/// inside.
const SLOTS: usize = 10;

/// The operation's settings: the layers' kernel, the module's dropout rule, the residual's
/// (times its factor) and the normalisation's epsilon.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    kernel: Kernel,
    up_rule: Rule,
    rule: Rule,
    eps: f64,
}

/// The module's input: given (`n`), or the residual's input normalised inside the node under
/// `[gamma1, beta1]` with epsilon `eps` (the forward's only: the backward reads the rows'
/// statistics).
#[derive(Debug, Clone)]
pub enum Input<B: Backend> {
    Given(FloatTensor<B>),
    Normalised { params: [FloatTensor<B>; 2], eps: f64 },
}

/// What the backward needs: the first layer's input and weight and the Swish's input, then
/// `device_residual_norm`'s (the hidden layer, the second weight, the normalisation's), and
/// the first normalisation's where it ran inside.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    n: FloatTensor<B>,
    w_up: FloatTensor<B>,
    gate_in: FloatTensor<B>,
    rest: device_residual_norm::Saved<B>,
    first: Option<device_layer_norm::Saved<B>>,
}

impl<B: Backend> Saved<B> {
    /// From the first layer's input and weight, the Swish's input, `[the residual's output,
    /// the scale, the statistics, the hidden layer, the second weight]` and the first
    /// normalisation's.
    fn new(
        [n, w_up, gate_in]: [FloatTensor<B>; 3],
        [r, gamma, stats, g, w_down]: [FloatTensor<B>; 5],
        first: Option<device_layer_norm::Saved<B>>,
    ) -> Self {
        let norm = device_layer_norm::Saved { x: r, gamma, stats };
        let rest = device_residual_norm::Saved { norm, h: g, w: w_down };
        Saved { n, w_up, gate_in, rest, first }
    }
}

/// The module with its residual and normalisation as one operation (see the module): the
/// backends that have it. The provided methods run the parts on `Self`; under fusion
/// ([`Fusion`]'s override) on the inner backend inside one operation of the stream.
pub trait DeviceFeedForward: DeviceMatmul + DeviceLayerNorm {
    /// From `x` (the residual's input), the module's `input` and `[w_up, b_up, w_down, b_down,
    /// gamma, beta]` (its layers, the normalisation's scale and shift): the normalised, the
    /// residual's output and what the backward needs.
    fn feed_forward_forward(
        x: FloatTensor<Self>,
        input: Input<Self>,
        [w_up, b_up, w_down, b_down, gamma, beta]: [FloatTensor<Self>; 6],
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        let (n, first) = match input {
            Input::Given(n) => (n, None),
            Input::Normalised { params: [gamma1, beta1], eps } => {
                let (n, saved) = Self::layer_norm_forward(x.clone(), gamma1, beta1, eps);
                (n, Some(saved))
            }
        };
        // `device_matmul::linear_gated`'s `LinearGate`, then `linear_residual_norm`'s forward.
        let after = After::Dropout(s.up_rule);
        let [g, gate_in] =
            Self::linear_gate_forward(n.clone(), w_up.clone(), b_up, Gate::Swish, after, s.kernel);
        let norm = [gamma.clone(), beta];
        let (x, h, w) = (x, g.clone(), w_down.clone());
        let [r, normed, stats] =
            Self::linear_residual_norm_forward(x, h, w, b_down, s.rule, s.kernel, norm, s.eps);
        let rest = [r.clone(), gamma, stats, g, w_down];
        (normed, r, Saved::new([n, w_up, gate_in], rest, first))
    }

    /// The gradients of the [`SLOTS`] that `asked` names, from the normalised's `dy` and
    /// `addend`, the residual's output's other gradient.
    fn feed_forward_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; SLOTS],
    ) -> [Option<FloatTensor<Self>>; SLOTS] {
        let Saved { n, w_up, gate_in, rest, first } = saved;
        let device_residual_norm::Saved { norm, h: g, w: w_down } = rest;
        let (rest_asked, up_asked) = split(asked, first.is_some());
        let down = [rest_asked[1].then_some(w_down), rest_asked[2].then_some(g)];
        let up = [up_asked[0].then_some(w_up), up_asked[1].then_some(n)];
        grads::<Self>(norm, down, gate_in, up, first, dy, addend, s, asked)
    }
}

/// What `device_residual_norm::grads` is asked for (the residual's input's wherever the first
/// normalisation needs it as its addend; the hidden layer's wherever the first layer needs
/// one), and the first layer's input's (wherever the first normalisation, run inside, needs
/// it) and weight's.
fn split(asked: [bool; SLOTS], first: bool) -> ([bool; 6], [bool; 2]) {
    let before = first && (asked[0] || asked[2] || asked[3]);
    let input = asked[1] || before;
    let hidden = input || asked[4] || asked[5];
    let rest = [asked[0] || before, hidden, asked[6], asked[7], asked[8], asked[9]];
    (rest, [input, asked[4]])
}

/// The backward on `B`: the normalisation's and the second layer's (`device_residual_norm`),
/// then the first layer's with its Swish and dropout (`LinearGate`'s), then the first
/// normalisation's where it ran inside (the residual's input's gradient its addend), each
/// operand given only where read (`[w_down, g]`, `[w_up, n]`: a layer's input's gradient reads
/// its weight, its weight's its input).
#[allow(clippy::too_many_arguments)]
fn grads<B: DeviceMatmul + DeviceLayerNorm>(
    norm: device_layer_norm::Saved<B>,
    [w_down, g]: [Option<FloatTensor<B>>; 2],
    gate_in: FloatTensor<B>,
    [w_up, n]: [Option<FloatTensor<B>>; 2],
    first: Option<device_layer_norm::Saved<B>>,
    dy: FloatTensor<B>,
    addend: Option<FloatTensor<B>>,
    s: Settings,
    asked: [bool; SLOTS],
) -> [Option<FloatTensor<B>>; SLOTS] {
    let (rest_asked, _) = split(asked, first.is_some());
    let settings = (s.rule, s.kernel);
    let [dr, dg, dw_down, db_down, d_gamma, d_beta] =
        device_residual_norm::grads::<B>(norm, w_down, g, dy, addend, settings, rest_asked);
    let [dn, dw_up, db_up] = match dg {
        Some(dg) => {
            let after = After::Dropout(s.up_rule);
            B::linear_gate_grads(dg, gate_in, w_up, n, asked[5], Gate::Swish, after, s.kernel)
        }
        None => [None, None, None],
    };
    let [dx, dn, d_gamma1, d_beta1] = match (first, dn) {
        (Some(first), Some(dn)) => {
            let (dx, d_gamma1, d_beta1) = B::layer_norm_backward(first, dn, dr);
            [Some(dx), None, Some(d_gamma1), Some(d_beta1)]
        }
        (_, dn) => [dr, dn, None, None],
    };
    let mut all = [dx, dn, d_gamma1, d_beta1, dw_up, db_up, dw_down, db_down, d_gamma, d_beta];
    for (g, yes) in all.iter_mut().zip(asked) {
        if !yes {
            *g = None;
        }
    }
    all
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
    /// Swish's input, and where the first normalisation runs inside, its output (the module's
    /// input) and statistics.
    fn feed_forward_forward(
        x: FloatTensor<Self>,
        input: Input<Self>,
        rest: [FloatTensor<Self>; 6],
        s: Settings,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Saved<Self>) {
        let dims = x.shape.to_vec();
        let (rows, _) = device_layer_norm::rows_and_width(&dims);
        let mut hidden = dims.clone();
        if let (Some(last), Some(&ff)) = (hidden.last_mut(), rest[0].shape.to_vec().last()) {
            *last = ff;
        }
        // The first normalisation's epsilon where it runs inside.
        let inside = match &input {
            Input::Normalised { eps, .. } => Some(*eps),
            Input::Given(_) => None,
        };
        let mut shapes = vec![dims.clone(), dims.clone(), vec![rows, 2], hidden.clone(), hidden];
        if inside.is_some() {
            shapes.extend([dims, vec![rows, 2]]);
        }
        let outputs = shapes.into_iter().map(|s| (s, DType::F32)).collect();
        let [w_up, w_down, gamma] = [0, 2, 4].map(|i| rest[i].clone());
        // What the backward keeps of the inputs: the module's input where given, else the
        // first normalisation's input and scale.
        let kept = match &input {
            Input::Given(n) => Ok(n.clone()),
            Input::Normalised { params: [gamma1, _], .. } => Err((x.clone(), gamma1.clone())),
        };
        let inputs = match input {
            Input::Given(n) => vec![x, n],
            Input::Normalised { params: [gamma1, beta1], .. } => vec![x, gamma1, beta1],
        };
        let inputs = inputs.into_iter().chain(rest).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let mut next = || match ins.next() {
                Some(t) => t,
                None => unreachable!("the feed-forward module: its inputs"),
            };
            let x = next();
            let input = match inside {
                Some(eps) => Input::Normalised { params: [next(), next()], eps },
                None => Input::Given(next()),
            };
            let rest = [(); 6].map(|_| next());
            let (normed, r, saved) = B::feed_forward_forward(x, input, rest, s);
            let Saved { n, gate_in, rest, first, .. } = saved;
            let outs = vec![normed, r, rest.norm.stats, rest.h, gate_in];
            match first {
                Some(first) => outs.into_iter().chain([n, first.stats]).collect(),
                None => outs,
            }
        };
        let outs = in_stream_vec::<B, _>("feed-forward module", inputs, outputs, run);
        let mut outs = outs.into_iter();
        let mut next = || match outs.next() {
            Some(t) => t,
            None => unreachable!("the feed-forward module: its declared outputs"),
        };
        let [normed, r, stats, g, gate_in] = [(); 5].map(|_| next());
        let (n, first) = match kept {
            Ok(n) => (n, None),
            Err((x, gamma)) => {
                let n = next();
                (n, Some(device_layer_norm::Saved { x, gamma, stats: next() }))
            }
        };
        let rest = [r.clone(), gamma, stats, g, w_down];
        (normed, r, Saved::new([n, w_up, gate_in], rest, first))
    }

    /// One operation of fusion's stream, its inputs `dy`, the addend, what the forward kept
    /// and the operands read, its outputs the gradients asked for.
    fn feed_forward_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        s: Settings,
        asked: [bool; SLOTS],
    ) -> [Option<FloatTensor<Self>>; SLOTS] {
        let Saved { n, w_up, gate_in, rest, first } = saved;
        let device_residual_norm::Saved { norm, h: g, w: w_down } = rest;
        let device_layer_norm::Saved { x: r, gamma, stats } = norm;
        let width = gamma.shape.to_vec();
        let ff = vec![w_up.shape.to_vec().last().copied().unwrap_or(1)];
        let shapes = [r.shape.to_vec(), n.shape.to_vec(), width.clone(), width.clone()];
        let shapes = shapes.into_iter().chain([w_up.shape.to_vec(), ff, w_down.shape.to_vec()]);
        let shapes = shapes.chain([width.clone(), width.clone(), width]);
        let outputs: Vec<_> =
            shapes.zip(asked).filter(|(_, a)| *a).map(|(s, _)| (s, DType::F32)).collect();
        let inside = first.is_some();
        let (rest_asked, up_asked) = split(asked, inside);
        let has_addend = addend.is_some();
        // An operand the backward does not read is not held for it.
        let down = [rest_asked[1].then_some(w_down), rest_asked[2].then_some(g)];
        let up = [up_asked[0].then_some(w_up), up_asked[1].then_some(n)];
        let first = first.map(|f| [f.x, f.gamma, f.stats]).into_iter().flatten();
        let inputs = [dy].into_iter().chain(addend).chain([r, gamma, stats, gate_in]);
        let inputs = inputs.chain(down.into_iter().flatten()).chain(up.into_iter().flatten());
        let inputs = inputs.chain(first).collect();
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
            let first = inside.then(|| device_layer_norm::Saved {
                x: next(),
                gamma: next(),
                stats: next(),
            });
            let norm = device_layer_norm::Saved { x: r, gamma, stats };
            let grads = grads::<B>(norm, down, gate_in, up, first, dy, addend, s, asked);
            grads.into_iter().flatten().collect()
        };
        let name = "feed-forward module backward";
        let mut grads = in_stream_vec::<B, _>(name, inputs, outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The operation as an autodiff node: its settings and `device_residual_norm`'s handoffs; its
/// `N` parents the [`SLOTS`] of its form ([`slots`]).
#[derive(Debug, Clone)]
struct FeedForward<const N: usize> {
    settings: Settings,
    links: Links,
}

/// Where a node's `N` parents sit among the [`SLOTS`]: `n` given (8), or normalised inside (9).
fn slots<const N: usize>() -> [usize; N] {
    let given = [0, 1, 4, 5, 6, 7, 8, 9];
    let inside = [0, 2, 3, 4, 5, 6, 7, 8, 9];
    std::array::from_fn(|i| if N == 8 { given[i] } else { inside[i] })
}

impl<B: DeviceFeedForward, const N: usize> DeviceBackward<B, N> for FeedForward<N> {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; N] {
        self.backward_tracked(saved, dy, [true; N]).map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; N],
    ) -> [Option<FloatTensor<B>>; N] {
        let slots = slots::<N>();
        self.links.backward::<B, _>(tracked, |addend, asked| {
            let mut all = [false; SLOTS];
            for (&slot, yes) in slots.iter().zip(asked) {
                all[slot] = yes;
            }
            let mut grads = B::feed_forward_backward(saved, dy, addend, self.settings, all);
            slots.map(|slot| grads[slot].take())
        })
    }
}

/// The module's input as [`train_on_device`] takes it: given, or the residual's input
/// normalised inside the node (the block's first normalisation, whose scale and shift become
/// the node's parents).
pub enum ModuleInput<'a, B: Backend> {
    Given(&'a Tensor<B, 3>),
    Normalised { gamma: Tensor<B, 1>, beta: Tensor<B, 1>, eps: f64 },
}

/// `x + factor * dropout(down(dropout(swish(up(n)))))`, then `next`'s normalisation of it:
/// `[the residual's output, untracked; the normalised]`, one node with `x`, the module's input
/// `n` (or, normalised inside, that normalisation's scale and shift), the layers' weights and
/// biases and the normalisation's scale and shift as parents, claiming `next.handoff` and
/// handing `x`'s gradient over `handoff` where claimed, as
/// `device_residual_norm::linear_residual_then_norm` does. `dropouts` are the module's and the
/// residual's. `x` given back elsewhere (see the module), with no dropout drawn.
#[allow(clippy::too_many_arguments)]
pub fn train_on_device<B: Backend>(
    [up, down]: [&Linear<B>; 2],
    [module_dropout, dropout]: [&Dropout; 2],
    factor: f32,
    x: Tensor<B, 3>,
    input: ModuleInput<'_, B>,
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
    let mut vectors = vec![&next.gamma, &next.beta];
    let given = match &input {
        ModuleInput::Given(n) => Some(*n),
        ModuleInput::Normalised { gamma, beta, .. } => {
            vectors.extend([gamma, beta]);
            None
        }
    };
    let f32s = [x.dtype(), w_up.dtype(), b_up.dtype(), w_down.dtype(), b_down.dtype()]
        .into_iter()
        .chain(given.map(|n| n.dtype()))
        .chain(vectors.iter().map(|t| t.dtype()))
        .all(|t| t == DType::F32);
    let rows = x.shape().num_elements() / d.max(1);
    let fits = given.is_none_or(|n| n.dims() == x.dims())
        && x.dims()[2] == d
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
            let kernel = chosen();
            let rule = rule.times(factor);
            let settings = Settings { kernel, up_rule, rule, eps: next.eps };
            let t3 = |t: Tensor<B, 3>| float(same::<_, Tensor<A, 3>>(t));
            let t2 = |t: &Tensor<B, 2>| float(same::<_, Tensor<A, 2>>(t.clone()));
            let t1 = |t: &Tensor<B, 1>| float(same::<_, Tensor<A, 1>>(t.clone()));
            let rest = [t2(&w_up), t1(&b_up), t2(&w_down), t1(&b_down)];
            let rest = rest.into_iter().chain([t1(&next.gamma), t1(&next.beta)]);
            let forward = |x, input, rest: [FloatTensor<T>; 6]| {
                T::feed_forward_forward(x, input, rest, settings)
            };
            let (normed, r) = match input {
                ModuleInput::Given(n) => {
                    let links = Links::new(handoff, next.handoff);
                    let op = FeedForward::<8> { settings, links };
                    let inputs = [t3(x), t3(n.clone())].into_iter().chain(rest);
                    let Ok(inputs) = <[_; 8]>::try_from(inputs.collect::<Vec<_>>()) else {
                        unreachable!("eight parents")
                    };
                    device_op::tracked_with_more(op, inputs, |_, inputs| {
                        let [x, n, w_up, b_up, w_down, b_down, gamma, beta] = inputs;
                        let rest = [w_up, b_up, w_down, b_down, gamma, beta];
                        let (normed, r, saved) = forward(x, Input::Given(n), rest);
                        (normed, saved, r)
                    })
                }
                ModuleInput::Normalised { gamma, beta, eps } => {
                    // The residual's input's gradient is the first normalisation's addend,
                    // inside the node: nothing is handed over.
                    let links = Links::new(None, next.handoff);
                    let op = FeedForward::<9> { settings, links };
                    let inputs = [t3(x), t1(&gamma), t1(&beta)].into_iter().chain(rest);
                    let Ok(inputs) = <[_; 9]>::try_from(inputs.collect::<Vec<_>>()) else {
                        unreachable!("nine parents")
                    };
                    device_op::tracked_with_more(op, inputs, |_, inputs| {
                        let [x, gamma1, beta1, w_up, b_up, w_down, b_down, gamma, beta] = inputs;
                        let rest = [w_up, b_up, w_down, b_down, gamma, beta];
                        let input = Input::Normalised { params: [gamma1, beta1], eps };
                        let (normed, r, saved) = forward(x, input, rest);
                        (normed, saved, r)
                    })
                }
            };
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
    /// which hands its gradient back. The same with the block's first normalisation inside
    /// the operation. The normalised outputs and the gradients of the block's input and every
    /// parameter under a weighted sum, bit for bit, bare and fused wgpu, one row and 3 x 17; no
    /// gradient lost.
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
            // 0: the parts; 1: the node after the first normalisation's; 2: the node with
            // the first normalisation inside.
            let run = |mode: u8| {
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
                let n0 = (mode < 2).then(|| {
                    device_layer_norm::on_device(&xa, &g0a, Some(&s0a), 1e-5, Some(&link[0]))
                        .expect("a CubeCL type")
                });
                let next = |gamma: &Tensor<A<B>, 1>, beta: &Tensor<A<B>, 1>, at: usize| NextNorm {
                    gamma: gamma.clone(),
                    beta: beta.clone(),
                    eps: 1e-5,
                    handoff: link.get(at),
                    chain: true,
                };
                let [r1, n1] = if mode > 0 {
                    let layers = [&up, &down];
                    let dropouts = [&module_dropout, &dropout];
                    let input = match &n0 {
                        Some(n0) => ModuleInput::Given(n0),
                        None => ModuleInput::Normalised {
                            gamma: g0a.clone(),
                            beta: s0a.clone(),
                            eps: 1e-5,
                        },
                    };
                    let handoff = n0.as_ref().and(link.first());
                    let next = next(&g1a, &s1a, 1);
                    train_on_device(layers, dropouts, 0.5, xa.clone(), input, handoff, next)
                        .map_err(|_| "refused")
                        .expect("a CubeCL type")
                } else {
                    let n0 = n0.expect("the parts' normalisation");
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
            let (two, one, inside) = (run(0), run(1), run(2));
            let what =
                ["output", "normalised", "x", "h2", "w_up", "w_down", "w2", "b_up", "b_down"];
            let what = what.iter().chain(&["b2", "g0", "g1", "g2", "s0", "s1", "s2"]);
            assert_eq!(one.len(), two.len());
            assert_eq!(inside.len(), two.len());
            for (k, what) in what.enumerate() {
                assert_eq!(one[k], two[k], "{name}, {lead:?}: {what}");
                assert_eq!(inside[k], two[k], "{name}, {lead:?}, normalised inside: {what}");
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
