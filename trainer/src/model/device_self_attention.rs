//! The relative-position self-attention from its input to its merged context
//! (`encoder::RelPositionAttention::context`): the three projections and their heads
//! (`device_qkv`), then the context from the heads (`device_context`), as one operation each way
//! on the CubeCL backends (wgpu, CUDA; fused or not), bare or under autodiff.
//!
//! Run one after the other these are two operations of fusion's stream forward and two
//! backward a Conformer layer, and five autodiff nodes (`device_qkv`'s four, one per head, and
//! the context's): 96 of a step's operations at the 0.6B preset's 24 layers, where a GPU step is
//! bound by the host's cost per operation (bench/RESULTS.md, "The kit on an H200: cuBLAS's
//! products bring the 0.6B step to PyTorch's"). Here they are one operation each way and one
//! node, which launch the same kernels, in the same order, on the same inputs: the bits of the
//! two operations.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors, where both parts take their shapes (`device_qkv::fits`,
//! `device_context::takes`); the positions are given back elsewhere, and the caller runs the
//! parts.
//!
//! On by default, off with `ASRT_ATTENTION_OP=0` ([`enabled`]): the GPU kit's `xa` step
//! alternates the two where it is meant to pay, a GPU step bound by the host. (One lavapipe
//! A/B found the step slower with it; five pairs on a quiet machine found it 1 % faster,
//! bench/RESULTS.md, 2026-12-07.)
//!
//! Invariants: the output is `device_context`'s of `device_qkv`'s heads; the backward keeps
//! what the two kept (the input, the weights side by side, and the context's `Saved`),
//! computes the context's gradients of all four heads and of the positions and their weight
//! where tracked, then the group's nine, and hands out those of the tracked inputs.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_context::{self, Attend, DeviceContext};
use super::device_heads;
use super::device_matmul::{self, Kernel};
use super::device_op::{self, next_of, on_cube_types, DeviceBackward};
use super::device_qkv::{self, DeviceQkv};
use super::dropout::Dropout;
use super::host_depthwise::{cast, float, same};

/// The node's parents, in order: the input, the three weights and biases (query, key,
/// value), the position biases `u` and `v`, the positions and their weight.
const PARENTS: usize = 11;

/// The operation's settings: the heads, the projections' kernel and the context's.
#[derive(Debug, Clone, Copy)]
pub struct SelfAttention {
    pub(crate) heads: usize,
    pub(crate) kernel: Kernel,
    pub(crate) context: Attend,
}

/// What the forward keeps for the backward: what the two operations kept.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    x: FloatTensor<B>,
    /// The three weights side by side, `[d, 3 d]`.
    w: FloatTensor<B>,
    context: device_context::Saved<B>,
}

/// The operation (see the module): the backends that have it. The provided methods run the
/// parts on `Self`; under fusion ([`Fusion`]'s override) they run on the inner backend inside
/// one operation of the stream.
pub trait DeviceSelfAttention: DeviceQkv + DeviceContext {
    /// The merged context `[B, T, d]` from the [`PARENTS`] and `keep` `[B, T, 1]`, and what the
    /// backward needs.
    fn self_attention_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        op: SelfAttention,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let [x, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos] = inputs;
        let (w, b) = ([wq, wk, wv], [bq, bk, bv]);
        let [q_u, q_v, k, v, w] = Self::qkv_forward(x.clone(), w, b, [u, v], op.heads, op.kernel);
        let (y, context) = Self::context_forward([q_u, q_v, k, v, pos, w_pos, keep], op.context);
        (y, Saved { x, w, context })
    }

    /// The gradients of the [`PARENTS`] that `asked` names, from the output's `dy`.
    fn self_attention_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        op: SelfAttention,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let Saved { x, w, context } = saved;
        // The heads' gradients wherever one of the group's inputs is tracked, as the group's
        // nodes, all four tracked then, asked the context for them.
        let group = asked[..9].iter().any(|&a| a);
        let want = [group, group, group, group, asked[9], asked[10]];
        let [dq_u, dq_v, dk, dv, d_pos, d_w_pos] =
            Self::context_backward(context, dy, op.context, want);
        let mut all: [Option<FloatTensor<Self>>; PARENTS] = Default::default();
        if let (Some(dq_u), Some(dq_v), Some(dk), Some(dv)) = (dq_u, dq_v, dk, dv) {
            let nine = Self::qkv_backward([dq_u, dq_v, dk, dv], x, w, op.heads, op.kernel);
            for ((slot, g), yes) in all.iter_mut().zip(nine).zip(asked) {
                *slot = yes.then_some(g);
            }
        }
        [all[9], all[10]] = [d_pos, d_w_pos];
        all
    }
}

impl<R, F, I, BT> DeviceSelfAttention for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceSelfAttention for Fusion<B>
where
    B: FusionBackend + DeviceSelfAttention,
{
    /// One operation of fusion's stream, its outputs what the forward makes ([`made_shapes`]).
    fn self_attention_forward(
        inputs: [FloatTensor<Self>; PARENTS],
        keep: FloatTensor<Self>,
        op: SelfAttention,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let outputs = made_shapes(inputs[0].shape.dims::<3>(), op);
        let x = inputs[0].clone();
        let (pos, w_pos) = (inputs[9].clone(), inputs[10].clone());
        let all = inputs.into_iter().chain([keep.clone()]).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let Ok(ins) = <[FloatTensor<B>; PARENTS + 1]>::try_from(ins) else {
                unreachable!("the self-attention: twelve inputs")
            };
            let [x, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos, keep] = ins;
            let inputs = [x, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos];
            let (y, saved) = B::self_attention_forward(inputs, keep, op);
            made(y, saved)
        };
        let outs = in_stream_vec::<B, _>("self-attention", all, outputs, run);
        from_made(&mut outs.into_iter(), [x, pos, w_pos, keep], op)
    }

    /// One operation of fusion's stream, its inputs `dy` and what the forward kept
    /// ([`read`]), its outputs the gradients asked for.
    fn self_attention_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        op: SelfAttention,
        asked: [bool; PARENTS],
    ) -> [Option<FloatTensor<Self>>; PARENTS] {
        let shapes = grad_shapes(&saved, op);
        let outputs: Vec<_> =
            shapes.into_iter().zip(asked).filter(|(_, a)| *a).map(|(s, _)| s).collect();
        if outputs.is_empty() {
            return Default::default();
        }
        let inputs = [dy].into_iter().chain(read(saved)).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let dy = next_of(&mut ins, "the self-attention's backward: its inputs");
            let saved = from_read(&mut ins, op);
            B::self_attention_backward(saved, dy, op, asked).into_iter().flatten().collect()
        };
        let grads = in_stream_vec::<B, _>("self-attention backward", inputs, outputs, run);
        let mut grads = grads.into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

/// The shapes of what the forward makes besides its inputs, as fusion's stream declares them:
/// the context, the weights side by side and what the context's backward reads (the four
/// heads, the positions' heads, the weights and, with a dropout, the dropped weights).
pub(crate) fn made_shapes([b, t, d]: [usize; 3], op: SelfAttention) -> Vec<(Vec<usize>, DType)> {
    let (h, dk) = (op.heads, d / op.heads);
    let head = (vec![b, h, t, dk], DType::F32);
    let weights = (vec![b, h, t, t], DType::F32);
    let mut outputs = vec![
        (vec![b, t, d], DType::F32),
        (vec![d, 3 * d], DType::F32),
        head.clone(),
        head.clone(),
        head.clone(),
        head,
        (vec![1, h, 2 * t - 1, dk], DType::F32),
        weights.clone(),
    ];
    if op.context.rule.is_some() {
        outputs.push(weights);
    }
    outputs
}

/// The forward's output `y` and what it kept, as [`made_shapes`] declares them.
pub(crate) fn made<B: Backend>(y: FloatTensor<B>, saved: Saved<B>) -> Vec<FloatTensor<B>> {
    let Saved { w, context: c, .. } = saved;
    let kept = [y, w, c.q_u, c.q_v, c.k, c.v, c.r, c.w];
    kept.into_iter().chain(c.dropped).collect()
}

/// The output and what the backward needs from [`made`]'s tensors (taken from `made`) and the
/// inputs the backward reads, `[x, pos, w_pos, keep]`.
pub(crate) fn from_made<B: Backend>(
    made: &mut impl Iterator<Item = FloatTensor<B>>,
    [x, pos, w_pos, keep]: [FloatTensor<B>; 4],
    op: SelfAttention,
) -> (FloatTensor<B>, Saved<B>) {
    let mut next = || next_of(made, "the self-attention: its outputs");
    let (y, w, q_u, q_v, k, v, r, weights) =
        (next(), next(), next(), next(), next(), next(), next(), next());
    let dropped = op.context.rule.map(|_| next());
    let context =
        device_context::Saved { q_u, q_v, k, v, pos, w_pos, r, w: weights, dropped, keep };
    (y, Saved { x, w, context })
}

/// The shapes of the [`PARENTS`]' gradients (f32) for what the forward kept.
pub(crate) fn grad_shapes<B: Backend>(
    saved: &Saved<B>,
    op: SelfAttention,
) -> [(Vec<usize>, DType); PARENTS] {
    let [b, t, d] = saved.x.shape().dims::<3>();
    let [x, wq, wk, wv, bq, bk, bv, u, v] = device_qkv::grad_shapes([b, t, d], op.heads);
    let pos = (saved.context.pos.shape().to_vec(), DType::F32);
    [x, wq, wk, wv, bq, bk, bv, u, v, pos, (vec![d, d], DType::F32)]
}

/// What the forward kept, as the backward's operation takes it as inputs.
pub(crate) fn read<B: Backend>(saved: Saved<B>) -> Vec<FloatTensor<B>> {
    let Saved { x, w, context } = saved;
    let device_context::Saved { q_u, q_v, k, v, pos, w_pos, r, w: weights, dropped, keep } =
        context;
    let inputs = [x, w, q_u, q_v, k, v, pos, w_pos, r, weights, keep];
    inputs.into_iter().chain(dropped).collect()
}

/// What the forward kept, from [`read`]'s tensors (taken from `ins`).
pub(crate) fn from_read<B: Backend>(
    ins: &mut impl Iterator<Item = FloatTensor<B>>,
    op: SelfAttention,
) -> Saved<B> {
    let mut next = || next_of(ins, "the self-attention's backward: its inputs");
    let (x, w, q_u, q_v, k, v) = (next(), next(), next(), next(), next(), next());
    let (pos, w_pos, r, weights, keep) = (next(), next(), next(), next(), next());
    let dropped = op.context.rule.map(|_| next());
    let context =
        device_context::Saved { q_u, q_v, k, v, pos, w_pos, r, w: weights, dropped, keep };
    Saved { x, w, context }
}

impl<B: DeviceSelfAttention> DeviceBackward<B, PARENTS> for SelfAttention {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; PARENTS] {
        B::self_attention_backward(saved, dy, *self, [true; PARENTS])
            .map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; PARENTS],
    ) -> [Option<FloatTensor<B>>; PARENTS] {
        B::self_attention_backward(saved, dy, *self, tracked)
    }
}

/// The self-attention's [`PARENTS`] as `C`'s primitives, `C` being `B` (a branch of
/// `on_cube_types`): the group's (`device_qkv::primitives`), then the positions and their
/// weight.
pub(crate) fn primitives<B: Backend, C: Backend>(
    group: GroupInputs<'_, B>,
    pos: Tensor<B, 3>,
    w_pos: &Tensor<B, 2>,
) -> Option<[FloatTensor<C>; PARENTS]> {
    let [x, wq, wk, wv, bq, bk, bv, u, v] = device_qkv::primitives::<B, C>(group)?;
    let pos = float(cast::<_, Tensor<C, 3>>(pos)?);
    let w_pos = float(cast::<_, Tensor<C, 2>>(w_pos.clone())?);
    Some([x, wq, wk, wv, bq, bk, bv, u, v, pos, w_pos])
}

/// The projections' weights and biases where the whole attention takes these shapes (see
/// [`on_device`]): each projection has its bias, and both parts take their shapes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fits<B: Backend>(
    x: &Tensor<B, 3>,
    layers: [&Linear<B>; 3],
    pos_biases: &[Tensor<B, 2>; 2],
    heads: usize,
    pos: &Tensor<B, 3>,
    w_pos: &Tensor<B, 2>,
    keep: &Tensor<B, 3>,
) -> Option<Projections<B>> {
    let [b, t, d] = x.dims();
    let weights = layers.map(|l| l.weight.val());
    let biases = layers.map(|l| l.bias.as_ref().map(|b| b.val()));
    let [Some(bq), Some(bk), Some(bv)] = biases else {
        return None;
    };
    let biases = [bq, bk, bv];
    let fits = device_qkv::fits(x, &weights, &biases, pos_biases, heads)
        && device_context::takes([b, heads, t, d / heads], pos, w_pos, keep)
        && device_heads::takes(x)
        && device_heads::takes(pos);
    fits.then_some((weights, biases))
}

/// The projections' weights and biases (query, key, value).
pub(crate) type Projections<B> = ([Tensor<B, 2>; 3], [Tensor<B, 1>; 3]);

/// The projections' group's inputs as `device_qkv::primitives` takes them.
pub(crate) type GroupInputs<'a, B> =
    (&'a Tensor<B, 3>, [Tensor<B, 2>; 3], [Tensor<B, 1>; 3], [Tensor<B, 2>; 2]);

/// Whether the encoder takes this operation: unless `ASRT_ATTENTION_OP=0` (read once; see the
/// module).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("ASRT_ATTENTION_OP").as_deref() != Ok("0"))
}

/// The self-attention under autodiff: one node with the [`PARENTS`] as parents (`keep` takes no
/// gradient).
fn tracked<B: DeviceSelfAttention>(
    inputs: [FloatTensor<Autodiff<B>>; PARENTS],
    keep: Tensor<Autodiff<B>, 3>,
    op: SelfAttention,
) -> Tensor<Autodiff<B>, 3> {
    let keep = float(keep.inner());
    let y = device_op::tracked_with(op, inputs, |op, inputs| {
        B::self_attention_forward(inputs, keep, *op)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The attention's merged context (see the module) of `x` `[B, T, d]` under the projections
/// `layers` (query, key, value, each with its bias), the query's position biases `pos_biases`
/// (`u`, `v`: `[H, dk]`, `heads` = `H`), the positions `pos` `[1, 2T - 1, d]` and their linear
/// layer's weight `w_pos` (no bias), `keep` `[B, T, 1]`, the scores divided by `divisor`, the
/// weights through `dropout`: `[B, T, d]` as one operation each way where the backend is one of
/// the trainer's CubeCL types (bare or under autodiff), the tensors f32 and both parts take
/// their shapes; `pos` given back elsewhere (and the dropout has taken no seed).
#[allow(clippy::too_many_arguments)]
pub fn on_device<B: Backend>(
    x: &Tensor<B, 3>,
    layers: [&Linear<B>; 3],
    pos_biases: [Tensor<B, 2>; 2],
    heads: usize,
    pos: Tensor<B, 3>,
    w_pos: &Tensor<B, 2>,
    keep: &Tensor<B, 3>,
    divisor: f64,
    dropout: &Dropout,
) -> Result<Tensor<B, 3>, Tensor<B, 3>> {
    let Some((weights, biases)) = fits(x, layers, &pos_biases, heads, &pos, w_pos, keep) else {
        return Err(pos);
    };
    let (kernel, stacks) = (device_matmul::chosen(), device_matmul::stack_kernel());
    let divisor = divisor as f32;
    let group = (x, weights, biases, pos_biases);
    on_cube_types!(
        B,
        T,
        {
            let Some(inputs) = primitives::<B, Autodiff<T>>(group, pos.clone(), w_pos) else {
                return Err(pos);
            };
            let keep = same::<_, Tensor<Autodiff<T>, 3>>(keep.clone());
            // The seed is taken only once the operation is sure to run: a fallback draws its own.
            let rule = dropout.draw::<Autodiff<T>>(&keep.device());
            let context = Attend { divisor, rule, kernel: stacks, linear: kernel };
            Ok(same(tracked::<T>(inputs, keep, SelfAttention { heads, kernel, context })))
        },
        {
            let Some(inputs) = primitives::<B, T>(group, pos.clone(), w_pos) else {
                return Err(pos);
            };
            let keep = float(same::<_, Tensor<T, 3>>(keep.clone()));
            let context = Attend { divisor, rule: None, kernel: stacks, linear: kernel };
            let op = SelfAttention { heads, kernel, context };
            let (y, _) = T::self_attention_forward(inputs, keep, op);
            Ok(same(Tensor::<T, 3>::from_primitive(TensorPrimitive::Float(y))))
        }
    );
    Err(pos)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::dropout::seed_stream;
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// The self-attention over random inputs (`lens` the utterances' frames, `t` the longest)
    /// as one operation and as its two (`device_qkv::project_heads`, then
    /// `device_context::on_device`), under autodiff with `dropout`: the output and the eleven
    /// inputs' gradients under a weighted sum of the output, each pair as bits; and the bare
    /// form's output against the tracked one's without a dropout.
    fn against_its_parts<B: DeviceSelfAttention>(
        lens: &[usize],
        t: usize,
        h: usize,
        dk: usize,
        p: f64,
    ) {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 37);
        let (b, d) = (lens.len(), h * dk);
        let normal = |s| Distribution::Normal(0.0, s);
        // Drawn once: the device's generator is shared by the tests running beside this one.
        let x = Tensor::<B, 3>::random([b, t, d], normal(1.0), &device);
        let ws: [Tensor<B, 2>; 3] =
            std::array::from_fn(|_| Tensor::random([d, d], normal(0.3), &device));
        let bs: [Tensor<B, 1>; 3] =
            std::array::from_fn(|_| Tensor::random([d], normal(0.3), &device));
        let uv: [Tensor<B, 2>; 2] =
            std::array::from_fn(|_| Tensor::random([h, dk], normal(0.3), &device));
        let pos = Tensor::<B, 3>::random([1, 2 * t - 1, d], normal(1.0), &device);
        let w_pos = Tensor::<B, 2>::random([d, d], normal(0.2), &device);
        let weights = Tensor::<B, 3>::random([b, t, d], normal(1.0), &device);
        let keep = crate::model::mask::valid::<B>(lens, t, &device).float().reshape([b, t, 1]);
        let divisor = (dk as f64).sqrt();
        let dropout = Dropout::new(p);
        let run = |one: bool| {
            let layers: [Linear<A<B>>; 3] = std::array::from_fn(|i| {
                let mut l = LinearConfig::new(d, d).init::<A<B>>(&device);
                l.weight = Param::from_tensor(Tensor::from_inner(ws[i].clone()));
                l.bias = Some(Param::from_tensor(Tensor::from_inner(bs[i].clone())));
                l
            });
            let leaf = |t: Tensor<B, 2>| Tensor::<A<B>, 2>::from_inner(t).require_grad();
            let [u, v] = uv.clone().map(leaf);
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let pos_a = Tensor::<A<B>, 3>::from_inner(pos.clone()).require_grad();
            let w_a = leaf(w_pos.clone());
            let keep = Tensor::<A<B>, 3>::from_inner(keep.clone());
            let refs = [&layers[0], &layers[1], &layers[2]];
            seed_stream(7);
            let y = if one {
                let biases = [u.clone(), v.clone()];
                on_device(&xa, refs, biases, h, pos_a.clone(), &w_a, &keep, divisor, &dropout)
                    .expect("it runs")
            } else {
                let heads = device_qkv::project_heads(&xa, refs, [u.clone(), v.clone()], h)
                    .expect("the projections");
                device_context::on_device(heads, pos_a.clone(), &w_a, &keep, divisor, &dropout)
                    .expect("the context")
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let g2 = |t: &Tensor<A<B>, 2>| t.grad(&grads).expect("a gradient").into_data();
            let mut g = vec![xa.grad(&grads).expect("x's gradient").into_data()];
            g.extend(layers.iter().map(|l| g2(&l.weight.val())));
            g.extend(layers.iter().map(|l| {
                let b = l.bias.as_ref().expect("a bias").val();
                b.grad(&grads).expect("a bias's gradient").into_data()
            }));
            g.extend([g2(&u), g2(&v)]);
            g.push(pos_a.grad(&grads).expect("pos's gradient").into_data());
            g.push(g2(&w_a));
            (y.inner().into_data(), g)
        };
        let (y, g) = run(true);
        let (y0, g0) = run(false);
        let what = format!("{lens:?} of {t} frames, {h} heads of {dk}, dropout {p}");
        assert_eq!(y, y0, "{what}: the output");
        let names = ["x", "wq", "wk", "wv", "bq", "bk", "bv", "u", "v", "pos", "w_pos"];
        for (i, name) in names.iter().enumerate() {
            assert_eq!(g[i], g0[i], "{what}: {name}'s gradient");
        }
        if p == 0.0 {
            let layers: [Linear<B>; 3] = std::array::from_fn(|i| {
                let mut l = LinearConfig::new(d, d).init::<B>(&device);
                l.weight = Param::from_tensor(ws[i].clone());
                l.bias = Some(Param::from_tensor(bs[i].clone()));
                l
            });
            let refs = [&layers[0], &layers[1], &layers[2]];
            let plain =
                on_device(&x, refs, uv.clone(), h, pos.clone(), &w_pos, &keep, divisor, &dropout)
                    .expect("bare");
            assert_eq!(plain.into_data(), y, "{what}: bare and tracked forwards");
        }
    }

    #[test]
    fn the_self_attention_is_its_projections_then_its_context_bit_for_bit() {
        type W = burn::backend::Wgpu;
        type F = Fusion<W>;
        against_its_parts::<W>(&[9, 6], 9, 2, 8, 0.0);
        against_its_parts::<F>(&[9, 6], 9, 2, 8, 0.0);
        against_its_parts::<W>(&[9, 6], 9, 2, 8, 0.25);
        against_its_parts::<F>(&[9, 6], 9, 2, 8, 0.25);
        against_its_parts::<F>(&[1], 1, 4, 4, 0.0);
    }

    /// A projection without its bias is refused, the positions given back.
    #[test]
    fn a_projection_without_its_bias_is_refused() {
        type A = Autodiff<burn::backend::Wgpu>;
        let device = Default::default();
        let (h, dk, t) = (2, 4, 3);
        let d = h * dk;
        let with = LinearConfig::new(d, d).init::<A>(&device);
        let without = LinearConfig::new(d, d).with_bias(false).init::<A>(&device);
        let x = Tensor::<A, 3>::ones([1, t, d], &device);
        let uv = [Tensor::<A, 2>::zeros([h, dk], &device), Tensor::<A, 2>::zeros([h, dk], &device)];
        let pos = Tensor::<A, 3>::ones([1, 2 * t - 1, d], &device);
        let w_pos = Tensor::<A, 2>::ones([d, d], &device);
        let keep = Tensor::<A, 3>::ones([1, t, 1], &device);
        let dropout = Dropout::new(0.0);
        let layers = [&with, &without, &with];
        let back = on_device(&x, layers, uv, h, pos.clone(), &w_pos, &keep, 2.0, &dropout)
            .expect_err("refused");
        assert_eq!(back.into_data(), pos.into_data(), "the positions given back");
    }
}
