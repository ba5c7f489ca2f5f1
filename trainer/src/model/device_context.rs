//! The relative-position attention's context from its heads (`encoder::RelPositionAttention`):
//! the positions' projection and its heads, the content and position scores, the weights with
//! their dropout, the weights times the values and the heads merged back, as one operation each
//! way on the CubeCL backends (wgpu, CUDA; fused or not).
//!
//! Run one by one these are seven operations of fusion's stream forward (the positions' linear
//! layer and its split into heads, two stacks of products, `device_attention`'s weights, a
//! stack of products, `device_heads`' merge) and ten backward (the merge's swap back, two
//! products for the weights and the values, the weights' backward, two products for each score
//! part, the split's swap back, the positions' weight's product): 17 a Conformer layer, 408 of
//! a step's at the 0.6B preset's 24 layers. A GPU step is bound by the host's cost per operation (bench/RESULTS.md, "The kit
//! on an H200: cuBLAS's products bring the 0.6B step to PyTorch's": the training thread and
//! fusion's 76-85 % busy, the device 35-50 %). Here they are one operation forward and one
//! backward, which launch the same kernels, in the same order, on the same inputs: the bits of
//! the operations they replace.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors (mixed precision keeps the operations one by one); `None`
//! elsewhere, and the caller runs them one by one.
//!
//! Invariants: with `q_u`, `q_v`, `k`, `v` `[B, H, T, dk]`, the positions `pos`
//! `[1, 2T - 1, H * dk]`, the positions' weight `w_pos` `[H * dk, H * dk]` and `keep`
//! `[B, T, 1]`: with the positions' heads `r = split(pos · w_pos)` `[1, H, 2T - 1, dk]`, the
//! output is `merge(dropout(weights(q_u · kᵀ, q_v · rᵀ, keep)) · v)` `[B, T, H * dk]`, each
//! part as its own operation computes it (`device_matmul::linear` with the linear layers'
//! kernel, `device_heads::split`, `device_matmul::stacked` with the stacks' kernel,
//! `device_attention`, `device_heads::merge`); the backward keeps what those operations kept
//! (the four heads, `pos`, `w_pos`, `r`, the weights before and after the dropout, `keep`) and
//! computes only the gradients of the inputs that are tracked; `r`'s gradient is summed over
//! the batch, which read it whole.

use asr_tdt::fusion::in_stream_vec;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_attention::DeviceAttention;
use super::device_heads::{self, DeviceHeads};
use super::device_matmul::{self, DeviceMatmul, Kernel};
use super::device_op::{self, on_cube_types, DeviceBackward};
use super::dropout::{Dropout, Rule};
use super::host_depthwise::{float, same};

/// The operation's settings: the scores' divisor (`sqrt(dk)`), the weights' dropout (`None`
/// in evaluation), the stacks' kernel and the positions' linear layer's.
#[derive(Debug, Clone, Copy)]
pub struct Attend {
    pub(crate) divisor: f32,
    pub(crate) rule: Option<Rule>,
    pub(crate) kernel: Kernel,
    pub(crate) linear: Kernel,
}

/// What the forward keeps for the backward: what the five operations kept.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    pub(crate) q_u: FloatTensor<B>,
    pub(crate) q_v: FloatTensor<B>,
    pub(crate) k: FloatTensor<B>,
    pub(crate) v: FloatTensor<B>,
    pub(crate) pos: FloatTensor<B>,
    pub(crate) w_pos: FloatTensor<B>,
    /// The positions' heads.
    pub(crate) r: FloatTensor<B>,
    /// The weights before the dropout (its backward's input).
    pub(crate) w: FloatTensor<B>,
    /// The weights after the dropout (the values' product's operand); `None` without a
    /// dropout, where they are `w`.
    pub(crate) dropped: Option<FloatTensor<B>>,
    pub(crate) keep: FloatTensor<B>,
}

/// `[B, H, T, dk]` of the heads `q`.
fn head_dims<B: Backend>(q: &FloatTensor<B>) -> [usize; 4] {
    q.shape().dims::<4>()
}

/// The operation (see the module): the backends that have it. The provided methods run the
/// parts on `Self`; under fusion ([`Fusion`]'s override) they run on the inner backend inside
/// one operation of the stream.
pub trait DeviceContext: DeviceMatmul + DeviceAttention + DeviceHeads {
    /// The merged context `[B, T, H * dk]` from `[q_u, q_v, k, v, pos, w_pos, keep]`, and what
    /// the backward needs.
    fn context_forward(
        [q_u, q_v, k, v, pos, w_pos, keep]: [FloatTensor<Self>; 7],
        at: Attend,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let [b, h, t, dk] = head_dims::<Self>(&q_u);
        let kernel = at.kernel;
        // `device_matmul::linear`'s `Product` forward, then `device_heads::split`'s swap.
        let p = Self::linear_forward(pos.clone(), w_pos.clone(), None, at.linear);
        let n = 2 * t - 1;
        let r = Self::heads_swap(p, Vec::new(), [1, n, h, dk], vec![1, h, n, dk]);
        // Each product as `device_matmul`'s `Stacked` forward runs it.
        let scores = |a: &FloatTensor<Self>, b: &FloatTensor<Self>| {
            Self::stack_product(a.clone(), b.clone(), [false, true], false, kernel, "forward")
        };
        let (ac, bd) = (scores(&q_u, &k), scores(&q_v, &r));
        let (w, dropped) = Self::attention_forward(ac, bd, keep.clone(), at.divisor, at.rule);
        let o =
            Self::stack_product(dropped.clone(), v.clone(), [false; 2], false, kernel, "forward");
        // `device_heads::merge`'s swap.
        let y = Self::heads_swap(o, Vec::new(), [b, h, t, dk], vec![b, t, h * dk]);
        let dropped = at.rule.map(|_| dropped);
        (y, Saved { q_u, q_v, k, v, pos, w_pos, r, w, dropped, keep })
    }

    /// The gradients of `[q_u, q_v, k, v, pos, w_pos]` that `asked` names, from the output's
    /// `dy`.
    fn context_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        at: Attend,
        asked: [bool; 6],
    ) -> [Option<FloatTensor<Self>>; 6] {
        let Saved { q_u, q_v, k, v, pos, w_pos, r, w, dropped, keep } = saved;
        let [b, h, t, dk] = head_dims::<Self>(&q_u);
        let kernel = at.kernel;
        // Each gradient as `device_matmul`'s `Stacked` backward computes it: the first
        // operand's `dy · op(b)ᵀ`, the second's `aᵀ · dy` (`dyᵀ · a` where it is read
        // transposed), summed over the outer axis where the operand had one row of it.
        let product = |a: FloatTensor<Self>, b: FloatTensor<Self>, t: [bool; 2], sum: bool| {
            Self::stack_product(a, b, t, sum, kernel, "gradient")
        };
        // `device_heads::merge`'s backward: the swap back.
        let d_o = Self::heads_swap(dy, Vec::new(), [b, t, h, dk], vec![b, h, t, dk]);
        let dropped = dropped.unwrap_or_else(|| w.clone());
        let dv = asked[3].then(|| product(dropped, d_o.clone(), [true, false], false));
        let to_r = asked[4] || asked[5];
        if !(asked[0] || asked[1] || asked[2] || to_r) {
            return [None, None, None, dv, None, None];
        }
        let d_dropped = product(d_o, v, [false, true], false);
        let [d_ac, d_bd] = Self::attention_backward(w, keep, d_dropped, at.divisor, at.rule);
        let dq_u = asked[0].then(|| product(d_ac.clone(), k, [false, false], false));
        let d_k = asked[2].then(|| product(d_ac, q_u, [true, false], false));
        let dq_v = asked[1].then(|| product(d_bd.clone(), r.clone(), [false, false], false));
        if !to_r {
            return [dq_u, dq_v, d_k, dv, None, None];
        }
        let dr = product(d_bd, q_v, [true, false], b > 1);
        // `device_heads::split`'s backward, then `Product`'s.
        let n = 2 * t - 1;
        let dp = Self::heads_swap(dr, Vec::new(), [1, h, n, dk], vec![1, n, h * dk]);
        let (want_pos, want_w) = (asked[4], asked[5]);
        let [d_pos, d_w, _] = Self::linear_grads(
            dp,
            want_pos.then_some(w_pos),
            want_w.then_some(pos),
            false,
            at.linear,
        );
        [dq_u, dq_v, d_k, dv, d_pos, d_w]
    }
}

impl<R, F, I, BT> DeviceContext for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}

impl<B> DeviceContext for Fusion<B>
where
    B: FusionBackend + DeviceContext,
{
    /// One operation of fusion's stream, its outputs the context, the positions' heads, the
    /// weights and (with a dropout) the dropped weights: the backward's operation reads the
    /// last three.
    fn context_forward(
        inputs: [FloatTensor<Self>; 7],
        at: Attend,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let [b, h, t, dk] = head_dims::<Self>(&inputs[0]);
        let weights = (vec![b, h, t, t], DType::F32);
        let r = (vec![1, h, 2 * t - 1, dk], DType::F32);
        let mut outputs = vec![(vec![b, t, h * dk], DType::F32), r, weights.clone()];
        if at.rule.is_some() {
            outputs.push(weights);
        }
        let [q_u, q_v, k, v, pos, w_pos, keep] = inputs.clone();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let Ok(ins) = <[FloatTensor<B>; 7]>::try_from(ins) else {
                unreachable!("the attention's context: seven inputs")
            };
            let (y, saved) = B::context_forward(ins, at);
            [y, saved.r, saved.w].into_iter().chain(saved.dropped).collect()
        };
        let mut outs =
            in_stream_vec::<B, _>("attention context", inputs.into(), outputs, run).into_iter();
        let (Some(y), Some(r), Some(w)) = (outs.next(), outs.next(), outs.next()) else {
            unreachable!("the attention's context: its outputs")
        };
        let dropped = outs.next();
        (y, Saved { q_u, q_v, k, v, pos, w_pos, r, w, dropped, keep })
    }

    /// One operation of fusion's stream, its inputs `dy` and what the forward kept, its
    /// outputs the gradients asked for.
    fn context_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        at: Attend,
        asked: [bool; 6],
    ) -> [Option<FloatTensor<Self>>; 6] {
        let heads = (saved.q_u.shape.to_vec(), DType::F32);
        let pos = (saved.pos.shape.to_vec(), DType::F32);
        let w_pos = (saved.w_pos.shape.to_vec(), DType::F32);
        let shapes = [heads.clone(), heads.clone(), heads.clone(), heads, pos, w_pos];
        let outputs: Vec<_> =
            shapes.into_iter().zip(asked).filter(|(_, a)| *a).map(|(s, _)| s).collect();
        if outputs.is_empty() {
            return [None, None, None, None, None, None];
        }
        let Saved { q_u, q_v, k, v, pos, w_pos, r, w, dropped, keep } = saved;
        let inputs =
            [dy, q_u, q_v, k, v, pos, w_pos, r, w, keep].into_iter().chain(dropped).collect();
        let run = move |ins: Vec<FloatTensor<B>>| {
            let mut ins = ins.into_iter();
            let mut next = || match ins.next() {
                Some(t) => t,
                None => unreachable!("the attention's context backward: its inputs"),
            };
            let (dy, q_u, q_v, k, v) = (next(), next(), next(), next(), next());
            let (pos, w_pos, r, w, keep) = (next(), next(), next(), next(), next());
            let dropped = at.rule.map(|_| next());
            let saved = Saved { q_u, q_v, k, v, pos, w_pos, r, w, dropped, keep };
            B::context_backward(saved, dy, at, asked).into_iter().flatten().collect()
        };
        let mut grads =
            in_stream_vec::<B, _>("attention context backward", inputs, outputs, run).into_iter();
        asked.map(|yes| if yes { grads.next() } else { None })
    }
}

impl<B: DeviceContext> DeviceBackward<B, 6> for Attend {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 6] {
        B::context_backward(saved, dy, *self, [true; 6])
            .map(|g| g.expect("every gradient asked for"))
    }

    fn backward_tracked(
        &self,
        saved: Saved<B>,
        dy: FloatTensor<B>,
        tracked: [bool; 6],
    ) -> [Option<FloatTensor<B>>; 6] {
        B::context_backward(saved, dy, *self, tracked)
    }
}

/// The context under autodiff: one node with the four heads, `pos` and `w_pos` as parents
/// (`keep` takes no gradient).
fn tracked<B: DeviceContext>(
    heads: [Tensor<Autodiff<B>, 4>; 4],
    pos: Tensor<Autodiff<B>, 3>,
    w_pos: Tensor<Autodiff<B>, 2>,
    keep: Tensor<Autodiff<B>, 3>,
    at: Attend,
) -> Tensor<Autodiff<B>, 3> {
    let keep = float(keep).primitive;
    let [q_u, q_v, k, v] = heads.map(float);
    let inputs = [q_u, q_v, k, v, float(pos), float(w_pos)];
    let y = device_op::tracked_with(at, inputs, |at, [q_u, q_v, k, v, pos, w_pos]| {
        B::context_forward([q_u, q_v, k, v, pos, w_pos, keep], *at)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The context without autodiff (evaluation).
fn bare<B: DeviceContext>(
    heads: [Tensor<B, 4>; 4],
    pos: Tensor<B, 3>,
    w_pos: Tensor<B, 2>,
    keep: Tensor<B, 3>,
    at: Attend,
) -> Tensor<B, 3> {
    let [q_u, q_v, k, v] = heads.map(float);
    let inputs = [q_u, q_v, k, v, float(pos), float(w_pos), float(keep)];
    let (y, _) = B::context_forward(inputs, at);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// Whether the operation takes heads of `[B, H, T, dk]` with `pos`, `w_pos` and `keep` (see
/// [`on_device`]): their shapes, f32, and the position scores' index within 32 bits
/// (`device_attention`'s limit).
pub(crate) fn takes<B: Backend>(
    [b, h, t, dk]: [usize; 4],
    pos: &Tensor<B, 3>,
    w_pos: &Tensor<B, 2>,
    keep: &Tensor<B, 3>,
) -> bool {
    let d = h * dk;
    t > 0
        && pos.dims() == [1, 2 * t - 1, d]
        && w_pos.dims() == [d, d]
        && keep.dims() == [b, t, 1]
        && [pos.dtype(), w_pos.dtype(), keep.dtype()].iter().all(|x| *x == DType::F32)
        && b * h * t * (2 * t - 1) <= u32::MAX as usize
}

/// The attention's context (see the module) from `[q_u, q_v, k, v]` `[B, H, T, dk]`, the
/// positions `pos` `[1, 2T - 1, H * dk]` and their linear layer's weight `w_pos` (no bias),
/// `keep` `[B, T, 1]`, the scores divided by `divisor`, the weights through `dropout`:
/// `[B, T, H * dk]` as one operation each way where the backend is one of the trainer's CubeCL
/// types (bare or under autodiff), the tensors f32 and each part takes its shapes; the heads
/// and `pos` given back elsewhere (and the dropout has taken no seed). The heads and `pos` are
/// taken, not borrowed, as the parts take them.
#[allow(clippy::type_complexity)]
pub fn on_device<B: Backend>(
    heads: [Tensor<B, 4>; 4],
    pos: Tensor<B, 3>,
    w_pos: &Tensor<B, 2>,
    keep: &Tensor<B, 3>,
    divisor: f64,
    dropout: &Dropout,
) -> Result<Tensor<B, 3>, ([Tensor<B, 4>; 4], Tensor<B, 3>)> {
    let [b, h, t, dk] = heads[0].dims();
    let fits = heads[1..].iter().all(|x| x.dims() == [b, h, t, dk])
        && heads.iter().all(|x| x.dtype() == DType::F32)
        && takes([b, h, t, dk], &pos, w_pos, keep)
        && device_heads::takes(&heads[0])
        && device_heads::takes(&pos);
    if !fits {
        return Err((heads, pos));
    }
    let (kernel, linear) = (device_matmul::stack_kernel(), device_matmul::chosen());
    let divisor = divisor as f32;
    on_cube_types!(
        B,
        T,
        {
            let heads = heads.map(same::<_, Tensor<Autodiff<T>, 4>>);
            let pos = same::<_, Tensor<Autodiff<T>, 3>>(pos);
            let w_pos = same::<_, Tensor<Autodiff<T>, 2>>(w_pos.clone());
            let keep = same::<_, Tensor<Autodiff<T>, 3>>(keep.clone());
            // The seed is taken only once the operation is sure to run: a fallback draws its own.
            let rule = dropout.draw::<Autodiff<T>>(&keep.device());
            let at = Attend { divisor, rule, kernel, linear };
            Ok(same(tracked::<T>(heads, pos, w_pos, keep, at)))
        },
        {
            let heads = heads.map(same::<_, Tensor<T, 4>>);
            let pos = same::<_, Tensor<T, 3>>(pos);
            let w_pos = same::<_, Tensor<T, 2>>(w_pos.clone());
            let keep = same::<_, Tensor<T, 3>>(keep.clone());
            let at = Attend { divisor, rule: None, kernel, linear };
            Ok(same(bare::<T>(heads, pos, w_pos, keep, at)))
        }
    );
    Err((heads, pos))
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_attention;
    use crate::model::dropout::seed_stream;
    use burn::tensor::Distribution;

    /// The context of random heads and positions (`lens` the utterances' frames, `t` the
    /// longest) as one operation and as its seven operations one by one, under autodiff with
    /// `dropout`: the output and the six inputs' gradients under a weighted sum of the output,
    /// each pair as bits; and the bare form's output against the tracked one's without a
    /// dropout.
    fn against_its_parts<B: DeviceContext>(lens: &[usize], t: usize, h: usize, dk: usize, p: f64) {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 29);
        let (b, d) = (lens.len(), h * dk);
        let normal = Distribution::Normal(0.0, 1.0);
        // Drawn once: the device's generator is shared by the tests running beside this one.
        let heads: [Tensor<B, 4>; 4] =
            std::array::from_fn(|_| Tensor::random([b, h, t, dk], normal, &device));
        let pos = Tensor::<B, 3>::random([1, 2 * t - 1, d], normal, &device);
        let w_pos = Tensor::<B, 2>::random([d, d], Distribution::Normal(0.0, 0.2), &device);
        let weights = Tensor::<B, 3>::random([b, t, d], normal, &device);
        let keep = crate::model::mask::valid::<B>(lens, t, &device).float().reshape([b, t, 1]);
        let divisor = (dk as f64).sqrt();
        let dropout = Dropout::new(p);
        let run = |one: bool| {
            let leaves = heads.clone().map(|x| Tensor::<A<B>, 4>::from_inner(x).require_grad());
            let pos_a = Tensor::<A<B>, 3>::from_inner(pos.clone()).require_grad();
            let w_a = Tensor::<A<B>, 2>::from_inner(w_pos.clone()).require_grad();
            let keep = Tensor::<A<B>, 3>::from_inner(keep.clone());
            seed_stream(7);
            let y = if one {
                on_device(leaves.clone(), pos_a.clone(), &w_a, &keep, divisor, &dropout)
                    .expect("it runs")
            } else {
                let [q_u, q_v, k, v] = leaves.clone();
                let projected = device_matmul::linear(&pos_a, &w_a, None).expect("the positions");
                let r = device_heads::split(projected, &[], h).expect("their heads");
                let stacked = device_matmul::stacked::<A<B>>;
                let ac = stacked(&q_u, &k, true).expect("the content scores");
                let bd = stacked(&q_v, &r, true).expect("the position scores");
                let w = device_attention::on_device(ac, bd, &keep, divisor, &dropout)
                    .expect("the weights");
                let o = stacked(&w, &v, false).expect("the values' product");
                device_heads::merge(o).expect("the merge")
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let mut g: Vec<_> =
                leaves.iter().map(|x| x.grad(&grads).expect("a gradient").into_data()).collect();
            g.push(pos_a.grad(&grads).expect("pos's gradient").into_data());
            g.push(w_a.grad(&grads).expect("w_pos's gradient").into_data());
            (y.inner().into_data(), g)
        };
        let (y, g) = run(true);
        let (y0, g0) = run(false);
        let what = format!("{t} frames, {h} heads of {dk}, dropout {p}");
        assert_eq!(y, y0, "{what}: the output");
        for (i, name) in ["q_u", "q_v", "k", "v", "pos", "w_pos"].iter().enumerate() {
            assert_eq!(g[i], g0[i], "{what}: {name}'s gradient");
        }
        if p == 0.0 {
            let plain = on_device(heads.clone(), pos.clone(), &w_pos, &keep, divisor, &dropout)
                .expect("bare");
            assert_eq!(plain.into_data(), y, "{what}: bare and tracked forwards");
        }
    }

    #[test]
    fn the_context_is_its_seven_operations_bit_for_bit() {
        type Fused = Fusion<burn::backend::Wgpu>;
        type Wgpu = burn::backend::Wgpu;
        // Padded utterances, with and without the weights' dropout; one utterance of one frame
        // (`r`'s gradient not summed over a batch).
        for (lens, t, p) in
            [(&[37usize, 20, 1][..], 37, 0.1), (&[37, 20, 1], 37, 0.0), (&[1], 1, 0.1)]
        {
            against_its_parts::<Wgpu>(lens, t, 2, 16, p);
            against_its_parts::<Fused>(lens, t, 2, 16, p);
        }
    }

    /// Shapes the parts do not take come back whole: positions of the wrong length.
    #[test]
    fn heads_it_does_not_take_are_given_back() {
        type Wgpu = burn::backend::Wgpu;
        let device = Default::default();
        let q = Tensor::<Wgpu, 4>::zeros([2, 2, 5, 4], &device);
        let pos = Tensor::<Wgpu, 3>::zeros([1, 8, 8], &device);
        let w_pos = Tensor::<Wgpu, 2>::zeros([8, 8], &device);
        let keep = Tensor::<Wgpu, 3>::ones([2, 5, 1], &device);
        let heads = [q.clone(), q.clone(), q.clone(), q];
        let (_, back) =
            on_device(heads, pos, &w_pos, &keep, 2.0, &Dropout::new(0.1)).expect_err("refused");
        assert_eq!(back.dims(), [1, 8, 8]);
    }
}
