//! The attention's heads as one operation each way on the CubeCL backends (wgpu, CUDA; fused or
//! not): a projection `[B, T, H * dk]` laid out head by head, `[B, H, T, dk]` (with a bias per
//! head added where there is one: the position biases `u` and `v` on the queries), and the
//! heads' context back to `[B, T, H * dk]` (`encoder::split_heads`, `encoder::merge_heads`).
//!
//! As views (a reshape and a swap of axes) the heads cost nothing, but CubeCL's matrix product
//! copies an operand whose batch axes interleave with its rows ("highly permuted" in
//! cubecl-std's `matrix_batch_layout`): each head-split operand was copied by the product that
//! read it, forward and again backward, and the gradients coming back were copied once more to
//! be reshaped; the query's two biases were two sums forward and four reductions backward. Here
//! the split writes the head-major layout once, so the products read contiguous or transposed
//! operands; each backward is one kernel (the inverse permutation), plus, for a bias, one for
//! partial sums over blocks of rows and Burn's sum over the blocks.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors of fewer than `2^32` elements; `None` elsewhere, and the
//! caller runs the views.
//!
//! Invariants: `split(x, bias)[b, h, t, j] = x[b, t, h * dk + j] + bias[h, j]` (one f32 sum, the
//! views' value bit for bit); `merge` is the inverse permutation without a bias; the input's
//! gradient is the inverse permutation of the output's, and the bias's is the output's
//! gradient summed over `b` and `t`.

use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    self, contiguous, empty, grid, on_cube_types, unit_index, DeviceBackward, DeviceOp, CUBE,
};
use super::host_depthwise::{cast, float};

/// Rows of the bias's gradient summed by one unit before Burn sums the blocks.
const BLOCK_ROWS: usize = 64;

/// One unit per element of `y` `[A, Q, P, R]` from `x` `[A, P, Q, R]` (the middle axes
/// swapped), plus `bias[q, r]` when `biased`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swap_middle(
    x: &Array<f32>,
    bias: &Array<f32>,
    y: &mut Array<f32>,
    p: u32,
    q: u32,
    r: u32,
    units: u32,
    #[comptime] biased: bool,
) {
    let pos = unit_index();
    if pos < units {
        let ri = pos % r;
        let pi = (pos / r) % p;
        let qi = (pos / (r * p)) % q;
        let a = pos / (r * p * q);
        let mut v = x[(((a * p + pi) * q + qi) * r + ri) as usize];
        if biased {
            v += bias[(qi * r + ri) as usize];
        }
        y[pos as usize] = v;
    }
}

/// One unit per (block of rows, bias element `(q, r)`): the sum of `dy` `[A, Q, P, R]` over the
/// block's rows `a * P + p` (at most `block` of `rows = A * P`), to `parts` `[blocks, Q * R]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn bias_parts(
    dy: &Array<f32>,
    parts: &mut Array<f32>,
    block: u32,
    rows: u32,
    p: u32,
    q: u32,
    r: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let qr = q * r;
        let start = (pos / qr) * block;
        let qi = (pos % qr) / r;
        let ri = pos % r;
        let mut end = start + block;
        if end > rows {
            end = rows;
        }
        let mut sum = 0.0f32;
        for row in start..end {
            let a = row / p;
            let pi = row % p;
            sum += dy[(((a * q + qi) * p + pi) * r + ri) as usize];
        }
        parts[pos as usize] = sum;
    }
}

/// The operations (see the module): the backends that have them.
pub trait DeviceHeads: Backend {
    /// `x` viewed as `[A, P, Q, R]` (`view`) with its middle axes swapped, plus `bias` `[Q, R]`
    /// where given, shaped `dims`.
    fn heads_swap(
        x: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        view: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self>;

    /// The sum of `dy` viewed as `[A, Q, P, R]` (`view`) over `A` and `P`: `[Q, R]`.
    fn heads_bias_sum(dy: FloatTensor<Self>, view: [usize; 4]) -> FloatTensor<Self>;
}

impl<R, F, I, BT> DeviceHeads for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn heads_swap(
        x: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        [_, p, q, r]: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self> {
        let units = dims.iter().product::<usize>();
        let x = contiguous(x);
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let biased = bias.is_some();
        // Without a bias the kernel reads none: the input stands in for the argument.
        let bias = bias.map(contiguous).unwrap_or_else(|| x.clone());
        // Each unit writes its own element and reads one of `x` and `bias`; the checked launch
        // bounds every access anyway.
        swap_middle::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            bias.into_array_arg(),
            y.clone().into_array_arg(),
            p as u32,
            q as u32,
            r as u32,
            units as u32,
            biased,
        );
        y
    }

    fn heads_bias_sum(dy: FloatTensor<Self>, [a, q, p, r]: [usize; 4]) -> FloatTensor<Self> {
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let rows = a * p;
        let blocks = rows.div_ceil(BLOCK_ROWS).max(1);
        let parts = empty::<R>(&client, &dy.device, vec![blocks, q * r]);
        let units = blocks * q * r;
        bias_parts::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            dy.into_array_arg(),
            parts.clone().into_array_arg(),
            BLOCK_ROWS as u32,
            rows as u32,
            p as u32,
            q as u32,
            r as u32,
            units as u32,
        );
        let sums = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(parts)).sum_dim(0);
        sums.reshape([q, r]).into_primitive().tensor()
    }
}

impl<B> DeviceHeads for Fusion<B>
where
    B: FusionBackend + DeviceHeads,
{
    fn heads_swap(
        x: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        view: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self> {
        let client = x.client.clone();
        let resolve = |t| client.resolve_tensor_float::<B>(t);
        let y = B::heads_swap(resolve(x), bias.map(resolve), view, dims);
        asr_tdt::fusion::adopt::<B>(&client, y)
    }

    fn heads_bias_sum(dy: FloatTensor<Self>, view: [usize; 4]) -> FloatTensor<Self> {
        let client = dy.client.clone();
        let db = B::heads_bias_sum(client.resolve_tensor_float::<B>(dy), view);
        asr_tdt::fusion::adopt::<B>(&client, db)
    }
}

/// A swap of the middle axes of the input viewed as `view` `[A, P, Q, R]` (the output `[A, Q,
/// P, R]`, shaped `out`; the input shaped `dims`), keeping nothing.
#[derive(Debug, Clone)]
struct Swap {
    view: [usize; 4],
    dims: Vec<usize>,
    out: Vec<usize>,
}

impl Swap {
    /// The view of the output, whose swap is the backward's.
    fn back_view(&self) -> [usize; 4] {
        let [a, p, q, r] = self.view;
        [a, q, p, r]
    }
}

impl<B: DeviceHeads> DeviceBackward<B, 1> for Swap {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 1] {
        [B::heads_swap(dy, None, self.back_view(), self.dims.clone())]
    }
}

impl<B: DeviceHeads> DeviceOp<B, 1> for Swap {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, ()) {
        (B::heads_swap(x, None, self.view, self.out.clone()), ())
    }
}

/// [`Swap`] plus a bias `[Q, R]`, its second input.
#[derive(Debug, Clone)]
struct BiasedSwap(Swap);

impl<B: DeviceHeads> DeviceBackward<B, 2> for BiasedSwap {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        let view = self.0.back_view();
        let db = B::heads_bias_sum(dy.clone(), view);
        [B::heads_swap(dy, None, view, self.0.dims.clone()), db]
    }
}

impl<B: DeviceHeads> DeviceOp<B, 2> for BiasedSwap {
    fn forward(&self, [x, bias]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, ()) {
        (B::heads_swap(x, Some(bias), self.0.view, self.0.out.clone()), ())
    }
}

/// `swap` of `x` (plus `bias`) on `T`, under autodiff or bare.
fn run<T: DeviceHeads>(
    swap: Swap,
    x: FloatTensor<T>,
    bias: Option<FloatTensor<T>>,
) -> FloatTensor<T> {
    T::heads_swap(x, bias, swap.view, swap.out)
}

fn tracked<T: DeviceHeads>(
    swap: Swap,
    x: FloatTensor<Autodiff<T>>,
    bias: Option<FloatTensor<Autodiff<T>>>,
) -> FloatTensor<Autodiff<T>> {
    match bias {
        Some(bias) => device_op::tracked(BiasedSwap(swap), [x, bias]),
        None => device_op::tracked(swap, [x]),
    }
}

/// Whether the operations take these tensors: f32, under `2^32` elements.
fn fits<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    x.dtype() == DType::F32 && x.shape().num_elements() <= u32::MAX as usize
}

/// `x` `[B, T, H * dk]` as `[B, H, T, dk]` (`heads` = `H`), plus `bias` `[H, dk]` in each head,
/// as one operation where the backend is one of the trainer's CubeCL types (bare or under
/// autodiff) and the tensors f32; `None` elsewhere.
pub fn split<B: Backend>(
    x: &Tensor<B, 3>,
    bias: Option<&Tensor<B, 2>>,
    heads: usize,
) -> Option<Tensor<B, 4>> {
    let [b, t, d] = x.dims();
    if heads == 0 || !d.is_multiple_of(heads) || !fits(x) {
        return None;
    }
    let dk = d / heads;
    if bias.is_some_and(|u| u.dims() != [heads, dk] || !fits(u)) {
        return None;
    }
    let swap = Swap { view: [b, t, heads, dk], dims: vec![b, t, d], out: vec![b, heads, t, dk] };
    on_cube_types!(
        B,
        T,
        {
            let bias = match bias {
                Some(u) => Some(float(cast::<_, Tensor<Autodiff<T>, 2>>(u.clone())?)),
                None => None,
            };
            let x = float(cast::<_, Tensor<Autodiff<T>, 3>>(x.clone())?);
            cast(Tensor::<Autodiff<T>, 4>::from_primitive(TensorPrimitive::Float(tracked(
                swap, x, bias,
            ))))
        },
        {
            let bias = match bias {
                Some(u) => Some(float(cast::<_, Tensor<T, 2>>(u.clone())?)),
                None => None,
            };
            let x = float(cast::<_, Tensor<T, 3>>(x.clone())?);
            cast(Tensor::<T, 4>::from_primitive(TensorPrimitive::Float(run::<T>(swap, x, bias))))
        }
    );
    None
}

/// `y` `[B, H, T, dk]` as `[B, T, H * dk]`, the inverse of [`split`] without a bias, as one
/// operation where [`split`] is one; `None` elsewhere.
pub fn merge<B: Backend>(y: &Tensor<B, 4>) -> Option<Tensor<B, 3>> {
    let [b, h, t, dk] = y.dims();
    if !fits(y) {
        return None;
    }
    let swap = Swap { view: [b, h, t, dk], dims: vec![b, h, t, dk], out: vec![b, t, h * dk] };
    on_cube_types!(
        B,
        T,
        {
            let y = float(cast::<_, Tensor<Autodiff<T>, 4>>(y.clone())?);
            cast(Tensor::<Autodiff<T>, 3>::from_primitive(TensorPrimitive::Float(tracked(
                swap, y, None,
            ))))
        },
        {
            let y = float(cast::<_, Tensor<T, 4>>(y.clone())?);
            cast(Tensor::<T, 3>::from_primitive(TensorPrimitive::Float(run::<T>(swap, y, None))))
        }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference;
    use burn::tensor::Distribution;

    /// Split (with a bias), products and merge as the attention runs them, against the views
    /// on the same backend: the output, and the gradients of the input and the bias under a
    /// weighted sum. Returns the gradients' largest differences relative to their largest
    /// values (the outputs must be the same bits).
    fn against_the_views<B: DeviceHeads>(b: usize, t: usize, heads: usize, dk: usize) -> [f32; 2] {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 21);
        let d = heads * dk;
        let normal = |dims: Vec<usize>| {
            Tensor::<B, 1>::random(
                [dims.iter().product::<usize>()],
                Distribution::Normal(0.0, 1.0),
                &device,
            )
        };
        let x = normal(vec![b, t, d]).reshape([b, t, d]);
        let u = normal(vec![heads, dk]).reshape([heads, dk]);
        let weights = normal(vec![b, t, d]).reshape([b, t, d]);
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let ua = Tensor::<A<B>, 2>::from_inner(u.clone()).require_grad();
            let (q, k) = if device_form {
                (
                    split(&xa, Some(&ua), heads).expect("a CubeCL type"),
                    split(&xa, None, heads).expect("a CubeCL type"),
                )
            } else {
                let v = xa.clone().reshape([b, t, heads, dk]);
                (
                    (v.clone() + ua.clone().reshape([1, 1, heads, dk])).swap_dims(1, 2),
                    v.swap_dims(1, 2),
                )
            };
            // The scores and a context from them, merged back.
            let ctx = q.matmul(k.clone().swap_dims(2, 3)).matmul(k);
            let y = if device_form {
                merge(&ctx).expect("a CubeCL type")
            } else {
                ctx.swap_dims(1, 2).reshape([b, t, d])
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            (y.inner(), xa.grad(&grads).unwrap(), ua.grad(&grads).unwrap())
        };
        let (y, dx, du) = run(true);
        let (y0, dx0, du0) = run(false);
        let values = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        assert_eq!(values(y), values(y0), "outputs");
        [relative_difference(dx, dx0), relative_difference(du, du0)]
    }

    #[test]
    fn split_and_merge_match_the_views_and_their_gradients_on_wgpu_with_and_without_fusion() {
        type Fused = Fusion<burn::backend::Wgpu>;
        type Wgpu = burn::backend::Wgpu;
        // One frame, one head; rows in more than one block of the bias's sums (3 x 50 > 64).
        let cases = [(1, 1, 1, 4), (2, 7, 2, 8), (3, 50, 4, 16)];
        let mut worst = [0f32; 2];
        for (b, t, h, dk) in cases {
            for (backend, d) in [
                ("wgpu", against_the_views::<Wgpu>(b, t, h, dk)),
                ("fused wgpu", against_the_views::<Fused>(b, t, h, dk)),
            ] {
                eprintln!("[{b}, {t}, {h}x{dk}], {backend}: dx {:.1e}, du {:.1e}", d[0], d[1]);
                worst = [worst[0].max(d[0]), worst[1].max(d[1])];
            }
        }
        // Measured (fused or not): the input's gradient the same bits in every case (the same
        // products, the same sums); the bias's 0, 4.9e-8, 2.3e-7 (blocks of rows summed in
        // another order than Burn's reduction). Bound: 5x the largest.
        assert!(worst[0] == 0.0, "input's gradient differs by {:.2e}", worst[0]);
        assert!(worst[1] <= 1.2e-6, "bias's gradient differs by {:.2e}", worst[1]);
    }

    #[test]
    fn other_types_and_shapes_are_left_to_the_views() {
        let x = Tensor::<burn::backend::NdArray, 3>::zeros([1, 2, 4], &Default::default());
        assert!(split(&x, None, 2).is_none(), "not a CubeCL type");
        let x = Tensor::<burn::backend::Wgpu, 3>::zeros([1, 2, 6], &Default::default());
        assert!(split(&x, None, 4).is_none(), "6 channels in 4 heads");
        let u = Tensor::<burn::backend::Wgpu, 2>::zeros([2, 2], &Default::default());
        assert!(split(&x, Some(&u), 2).is_none(), "a bias of another shape");
        assert!(split(&x, None, 2).is_some());
    }
}
