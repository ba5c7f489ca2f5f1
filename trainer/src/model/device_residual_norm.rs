//! A Conformer block's residual connection after a linear layer and the layer normalisation of
//! its output as one autodiff node, and under fusion one operation each way, on the CubeCL
//! backends (wgpu, CUDA; fused or not) in f32 under autodiff.
//!
//! `device_matmul::linear_residual_norm` already runs both forwards in one kernel, but leaves
//! two nodes: the residual's, then the normalisation's (`device_layer_norm::tracked_from`), so
//! the backward is two operations of fusion's stream, the normalisation's and the layer's: 8 a
//! Conformer block (its four residual connections), 192 of a step's at the 0.6B preset's 24
//! layers. A GPU step is bound by the host's cost per operation (bench/RESULTS.md, "The kit on
//! an H200: cuBLAS's products bring the 0.6B step to PyTorch's"). Here the node's output is the
//! normalised; the residual's output is given back untracked, and its one other reader, the
//! block's next residual connection, hands its gradient over (`handoff`) where autodiff would
//! have carried it. The backward is one operation that launches the normalisation's kernels,
//! then the layer's, as the two nodes did: the bits of the two.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff, where `linear_residual_norm` takes the shapes; the residual's input is given back
//! elsewhere. The caller (`encoder::ConformerLayer`) takes it only where every one of its
//! residual connections will ([`chain_fits`]), because an untracked output read by an operation
//! that does not hand its gradient over would lose that gradient. On by default, off with
//! `ASRT_RESIDUAL_NORM_OP=0` ([`enabled`]); the GPU kit's `xn` step alternates the two.
//!
//! Invariants:
//! - the normalised output and every tracked input's gradient are those of
//!   `linear_residual_norm`'s two nodes, bit for bit;
//! - the residual's output is untracked; its gradient arrives only over the `next` handoff
//!   this node claims in its forward. A claimed handoff that holds nothing when the backward
//!   runs is a gradient lost: it records a device failure (`device_failure::defer`), which
//!   fails the step;
//! - the residual's input's gradient is handed over wherever a receiver claimed `handoff` (the
//!   previous node of the chain, or the normalisation reading the block's input), tracked or
//!   not, else registered where tracked.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_layer_norm::{self, DeviceLayerNorm};
use super::device_matmul::{self, chosen, DeviceMatmul, Kernel};
use super::device_op::{self, on_cube_types, DeviceBackward};
use super::dropout::{NextNorm, Rule};
use super::handoff::Handoff;
use super::host_depthwise::{float, same};

/// Whether the encoder takes this operation: unless `ASRT_RESIDUAL_NORM_OP=0` (read once; see
/// the module).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("ASRT_RESIDUAL_NORM_OP").as_deref() != Ok("0"))
}

/// Whether a chain of residual connections may take this operation: each of its linear layers
/// has a bias, as `Dropout::residual_linear`'s device path needs, so that where one takes it
/// (the same backend, precision, dropout and widths) all do, and each untracked output's
/// reader hands its gradient over.
pub fn chain_fits<B: Backend>(layers: &[&Linear<B>]) -> bool {
    enabled() && layers.iter().all(|l| l.bias.is_some())
}

/// The settings: the layer's kernel, the residual's mask rule, the normalisation's epsilon and
/// the node's handoffs.
#[derive(Debug, Clone)]
struct ResidualNorm {
    kernel: Kernel,
    rule: Rule,
    eps: f64,
    links: Links,
}

/// A node's two handoffs (see the module), this one's and `device_feed_forward`'s.
#[derive(Debug, Clone)]
pub(crate) struct Links {
    /// Where a receiver claimed it: the residual's input's gradient is handed over there.
    handoff: Option<Handoff>,
    /// Claimed in the forward: the residual's output's gradient from its other reader.
    next: Option<Handoff>,
}

impl Links {
    /// In the node's forward: `handoff` kept where a receiver claimed it, `next` claimed.
    pub(crate) fn new(handoff: Option<&Handoff>, next: Option<&Handoff>) -> Self {
        Links { handoff: Handoff::offered(handoff), next: Handoff::receive(next) }
    }

    /// The node's backward around `grads(addend, asked)`: `addend` the residual's output's
    /// gradient handed over `next`; `asked` the `tracked` inputs, and the residual's input
    /// (first) wherever a receiver claimed `handoff`, tracked or not (the previous node's
    /// untracked output). That gradient is then handed over instead of returned. Where `next`
    /// was claimed and nothing was given, the gradient is lost: a device failure is recorded
    /// (see the module).
    pub(crate) fn backward<B: Backend, const N: usize>(
        &self,
        tracked: [bool; N],
        grads: impl FnOnce(Option<FloatTensor<B>>, [bool; N]) -> [Option<FloatTensor<B>>; N],
    ) -> [Option<FloatTensor<B>>; N] {
        let addend = self.next.as_ref().and_then(|h| h.take::<FloatTensor<B>>());
        if self.next.is_some() && addend.is_none() {
            crate::device_failure::defer(
                "a residual connection's output was read by an operation that did not hand its \
                 gradient back: the gradient is lost (model::device_residual_norm)"
                    .to_string(),
            );
        }
        let mut asked = tracked;
        asked[0] |= self.handoff.is_some();
        let mut grads = grads(addend, asked);
        if let Some(handoff) = &self.handoff {
            if let Some(dx) = grads[0].take() {
                handoff.give(dx);
            }
        }
        grads
    }
}

/// What the backward needs: the normalisation's (the residual's output, the scale, the rows'
/// statistics) and the layer's input and weight.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    pub(crate) norm: device_layer_norm::Saved<B>,
    pub(crate) h: FloatTensor<B>,
    pub(crate) w: FloatTensor<B>,
}

/// The backward as one operation (see the module): the backends that have it. The provided
/// method runs the parts on `Self`; under fusion ([`Fusion`]'s override) on the inner backend
/// inside one operation of the stream.
pub trait DeviceResidualNorm: DeviceMatmul + DeviceLayerNorm {
    /// The gradients of `[x, h, w, b, gamma, beta]` that `asked` names, from the normalised's
    /// `dy` and `addend`, the residual's output's other gradient: the normalisation's backward
    /// (`addend` added to its input's gradient as it is written), then the layer's
    /// (`DeviceMatmul::linear_residual_grads`); `x`'s is the residual's output's.
    fn residual_norm_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        settings: (Rule, Kernel),
        asked: [bool; 6],
    ) -> [Option<FloatTensor<Self>>; 6] {
        let Saved { norm, h, w } = saved;
        let (w, h) = (asked[1].then_some(w), asked[2].then_some(h));
        grads::<Self>(norm, w, h, dy, addend, settings, asked)
    }
}

impl<R, F, I, BT> DeviceResidualNorm for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceResidualNorm for Fusion<B>
where
    B: FusionBackend + DeviceResidualNorm,
{
    /// One operation of fusion's stream, its inputs `dy`, the addend, what the forward kept
    /// and the layer's operands read, its outputs the gradients asked for.
    fn residual_norm_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
        settings: (Rule, Kernel),
        asked: [bool; 6],
    ) -> [Option<FloatTensor<Self>>; 6] {
        let Saved { norm, h, w } = saved;
        let device_layer_norm::Saved { x: r, gamma, stats } = norm;
        let width = gamma.shape.to_vec();
        let shapes = [r.shape.to_vec(), h.shape.to_vec(), w.shape.to_vec()];
        let shapes = shapes.into_iter().chain([width.clone(), width.clone(), width]);
        let outputs: Vec<_> =
            shapes.zip(asked).filter(|(_, a)| *a).map(|(s, _)| (s, DType::F32)).collect();
        let has_addend = addend.is_some();
        // An operand the backward does not read is not held for it.
        let (w, h) = (asked[1].then_some(w), asked[2].then_some(h));
        let inputs = [dy].into_iter().chain(addend).chain([r, gamma, stats]).chain(w).chain(h);
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let mut next = || match ins.next() {
                Some(t) => t,
                None => unreachable!("the residual and normalisation's backward: its inputs"),
            };
            let dy = next();
            let addend = has_addend.then(&mut next);
            let (r, gamma, stats) = (next(), next(), next());
            let w = asked[1].then(&mut next);
            let h = asked[2].then(&mut next);
            let norm = device_layer_norm::Saved { x: r, gamma, stats };
            grads::<B>(norm, w, h, dy, addend, settings, asked).into_iter().flatten().collect()
        };
        let name = "residual and normalisation backward";
        let mut grads = in_stream_vec::<B, _>(name, inputs.collect(), outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// [`DeviceResidualNorm::residual_norm_backward`] on `B`, with the layer's operands given only
/// where their gradients are asked for (its input's gradient reads `w`, its weight's `h`, as in
/// `LinearResidual`'s backward).
pub(crate) fn grads<B: DeviceMatmul + DeviceLayerNorm>(
    norm: device_layer_norm::Saved<B>,
    w: Option<FloatTensor<B>>,
    h: Option<FloatTensor<B>>,
    dy: FloatTensor<B>,
    addend: Option<FloatTensor<B>>,
    (rule, kernel): (Rule, Kernel),
    asked: [bool; 6],
) -> [Option<FloatTensor<B>>; 6] {
    let (dr, d_gamma, d_beta) = B::layer_norm_backward(norm, dy, addend);
    let [dh, dw, db] = B::linear_residual_grads(dr.clone(), w, h, asked[3], rule, kernel);
    let (d_gamma, d_beta) = (asked[4].then_some(d_gamma), asked[5].then_some(d_beta));
    [asked[0].then_some(dr), dh, dw, db, d_gamma, d_beta]
}

impl<B: DeviceResidualNorm> DeviceBackward<B, 6> for ResidualNorm {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 6] {
        self.backward_tracked(saved, dy, [true; 6]).map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; 6],
    ) -> [Option<FloatTensor<B>>; 6] {
        let settings = (self.rule, self.kernel);
        self.links.backward::<B, _>(tracked, |addend, asked| {
            B::residual_norm_backward(saved, dy, addend, settings, asked)
        })
    }
}

/// A node's two outputs as the encoder takes them: `[the residual's output, untracked; the
/// normalised, the node's output]`.
pub(crate) fn outputs<T: Backend, const D: usize>(
    r: FloatTensor<T>,
    normed: FloatTensor<Autodiff<T>>,
) -> [Tensor<Autodiff<T>, D>; 2] {
    let r = Tensor::<Autodiff<T>, D>::from_inner(Tensor::from_primitive(TensorPrimitive::Float(r)));
    [r, Tensor::from_primitive(TensorPrimitive::Float(normed))]
}

/// `x + (h · w + b)` times `rule`'s mask, then `next`'s layer normalisation of it:
/// `[the residual's output, untracked; the normalised]`, one node with `x`, `h`, `w`, `b` and
/// the normalisation's scale and shift as parents, claiming `next.handoff` for the residual's
/// output's gradient and handing `x`'s over `handoff` where claimed (see the module), where
/// `device_matmul::linear_residual_norm` would run under autodiff; `x` given back elsewhere.
pub fn linear_residual_then_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    h: &Tensor<B, D>,
    w: &Tensor<B, 2>,
    b: &Tensor<B, 1>,
    rule: Rule,
    handoff: Option<&Handoff>,
    next: NextNorm<'_, B>,
) -> Result<[Tensor<B, D>; 2], Tensor<B, D>> {
    if !device_matmul::residual_norm_fits(&x, h, w, b, &next) {
        return Err(x);
    }
    let links = Links::new(handoff, next.handoff);
    let op = ResidualNorm { kernel: chosen(), rule, eps: next.eps, links };
    on_cube_types!(
        B,
        T,
        {
            type A = Autodiff<T>;
            let x = float(same::<_, Tensor<A, D>>(x));
            let h = float(same::<_, Tensor<A, D>>(h.clone()));
            let w = float(same::<_, Tensor<A, 2>>(w.clone()));
            let b = float(same::<_, Tensor<A, 1>>(b.clone()));
            let gamma = float(same::<_, Tensor<A, 1>>(next.gamma));
            let beta = float(same::<_, Tensor<A, 1>>(next.beta));
            let inputs = [x, h, w, b, gamma, beta];
            let (normed, r) = device_op::tracked_with_more(op, inputs, |op, inputs| {
                let [x, h, w, b, gamma, beta] = inputs;
                let (rule, kernel, eps) = (op.rule, op.kernel, op.eps);
                let norm = [gamma.clone(), beta];
                let [r, normed, stats] = T::linear_residual_norm_forward(
                    x,
                    h.clone(),
                    w.clone(),
                    b,
                    rule,
                    kernel,
                    norm,
                    eps,
                );
                let norm = device_layer_norm::Saved { x: r.clone(), gamma, stats };
                (normed, Saved { norm, h, w }, r)
            });
            Ok(outputs::<T, D>(r, normed).map(same))
        },
        { Err(x) }
    );
    Err(x)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_matmul::linear_residual_norm;
    use burn::tensor::Distribution;

    /// A chain as a Conformer block runs it: the block's input normalised (claiming the first
    /// handoff), a branch, the first residual connection with the next normalisation, a
    /// branch of that, the second with its normalisation; as this operation (the first
    /// residual's output untracked, read by the second) against `linear_residual_norm`'s two
    /// nodes each. The second normalised output, and the gradients of the block's input and of
    /// every parameter under a weighted sum of it, bit for bit, bare and fused; and the second
    /// residual's output untracked.
    #[test]
    fn the_chain_is_the_residuals_and_normalisations_bit_for_bit() {
        type A<B> = Autodiff<B>;
        fn check<B: DeviceResidualNorm>(name: &str, rows: usize) {
            let device = Default::default();
            B::seed(&device, 17);
            let (k, d) = (20, 24);
            let normal = |dims: [usize; 2], mean: f64| {
                Tensor::<B, 2>::random(dims, Distribution::Normal(mean, 1.0), &device)
            };
            let x = normal([rows, d], 0.4).mul_scalar(2.0);
            let (w1, w2) = (normal([d, k], 0.0), normal([k, d], 0.0));
            let (w3, w4) = (normal([d, k], 0.0), normal([k, d], 0.0));
            let weights = normal([rows, d], 0.0);
            let vector = |mean: f64| normal([1, d], mean).reshape([d]);
            let [g0, g1, g2] = [0, 1, 2].map(|_| vector(1.0));
            let [s0, s1, s2, b2, b4] = [0, 1, 2, 3, 4].map(|_| vector(0.0));
            let rule = |seed| Rule::new(seed, 0.8).times(0.5);
            let bits = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
            let bits1 = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
            let run = |one: bool| {
                let t2 = |t: &Tensor<B, 2>| Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad();
                let t1 = |t: &Tensor<B, 1>| Tensor::<A<B>, 1>::from_inner(t.clone()).require_grad();
                let (xa, w1a, w2a, w3a, w4a) = (t2(&x), t2(&w1), t2(&w2), t2(&w3), t2(&w4));
                let ones = [&g0, &g1, &g2, &s0, &s1, &s2, &b2, &b4].map(t1);
                let [g0a, g1a, g2a, s0a, s1a, s2a, b2a, b4a] = ones.clone();
                let link = [Handoff::new(), Handoff::new()];
                let n0 = device_layer_norm::on_device(&xa, &g0a, Some(&s0a), 1e-5, Some(&link[0]))
                    .expect("a CubeCL type");
                let branch = |n: Tensor<A<B>, 2>, w: &Tensor<A<B>, 2>| {
                    burn::tensor::activation::relu(n.matmul(w.clone()))
                };
                let h1 = branch(n0, &w1a);
                let step = |x: Tensor<A<B>, 2>,
                            h: &Tensor<A<B>, 2>,
                            w: &Tensor<A<B>, 2>,
                            b: &Tensor<A<B>, 1>,
                            seed: u64,
                            at: usize,
                            [gamma, beta]: [&Tensor<A<B>, 1>; 2]| {
                    let next = NextNorm {
                        gamma: gamma.clone(),
                        beta: beta.clone(),
                        eps: 1e-5,
                        handoff: link.get(at + 1),
                        chain: true,
                    };
                    let given = link.get(at);
                    if one {
                        linear_residual_then_norm(x, h, w, b, rule(seed), given, next)
                    } else {
                        linear_residual_norm(x, h, w, b, rule(seed), given, next)
                    }
                    .map_err(|_| "refused")
                    .expect("a CubeCL type")
                };
                let [r1, n1] = step(xa.clone(), &h1, &w2a, &b2a, 5, 0, [&g1a, &s1a]);
                let tracked =
                    |t: &Tensor<A<B>, 2>| t.clone().into_primitive().tensor().is_tracked();
                assert_eq!(tracked(&r1), !one, "{name}: the first residual's output");
                let h2 = branch(n1, &w3a);
                let [r2, n2] = step(r1, &h2, &w4a, &b4a, 6, 1, [&g2a, &s2a]);
                assert_eq!(tracked(&r2), !one, "{name}: the second residual's output");
                let loss = (n2.clone() * Tensor::from_inner(weights.clone())).sum();
                let grads = loss.backward();
                let g2 = |t: &Tensor<A<B>, 2>| bits(t.grad(&grads).expect("tracked"));
                let mut all = vec![bits(n2.inner()), g2(&xa), g2(&w1a), g2(&w2a), g2(&w3a)];
                all.push(g2(&w4a));
                all.extend(ones.iter().map(|t| bits1(t.grad(&grads).expect("tracked"))));
                all
            };
            let (one, two) = (run(true), run(false));
            let what = ["output", "x", "w1", "w2", "w3", "w4", "g0", "g1", "g2", "s0", "s1", "s2"];
            let what = what.iter().chain(&["b2", "b4"]);
            assert_eq!(one.len(), two.len());
            for (k, what) in what.enumerate() {
                assert_eq!(one[k], two[k], "{name}, {rows} rows: {what}");
            }
        }
        let ((), failures) = crate::device_failure::captured(|| {
            for rows in [1, 41] {
                check::<burn::backend::Wgpu>("wgpu", rows);
                check::<Fusion<burn::backend::Wgpu>>("fused wgpu", rows);
            }
        });
        assert_eq!(failures, Vec::<String>::new(), "no gradient lost");
    }

    /// The residual's output read by Burn's addition, which hands nothing over: the backward
    /// records the lost gradient as a device failure rather than training on without it.
    #[test]
    fn an_output_read_without_a_handoff_is_a_device_failure() {
        type B = burn::backend::Wgpu;
        let device = Default::default();
        let (rows, k, d) = (5, 6, 8);
        let t2 = |dims: [usize; 2]| {
            Tensor::<A, 2>::from_inner(Tensor::random(dims, Distribution::Default, &device))
                .require_grad()
        };
        type A = Autodiff<B>;
        let (x, h, w) = (t2([rows, d]), t2([rows, k]), t2([k, d]));
        let t1 = |_| Tensor::<A, 1>::from_inner(Tensor::ones([d], &device)).require_grad();
        let [b, gamma, beta] = [0, 1, 2].map(t1);
        let link = Handoff::new();
        let next = NextNorm { gamma, beta, eps: 1e-5, handoff: Some(&link), chain: true };
        let rule = Rule::new(3, 0.9);
        let [r, n] = linear_residual_then_norm(x, &h, &w, &b, rule, None, next)
            .map_err(|_| "refused")
            .expect("a CubeCL type");
        // Burn's addition reads the untracked output: nothing is handed to the node.
        let loss = (n + r).sum();
        let (_, failures) = crate::device_failure::captured(|| loss.backward());
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("did not hand its gradient back"), "{failures:?}");
    }
}
