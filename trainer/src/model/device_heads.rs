//! The attention's heads as one operation each way on the CubeCL backends (wgpu, CUDA; fused or
//! not): a projection `[B, T, H * dk]` laid out head by head, `[B, H, T, dk]`, with up to two
//! biases added (the projection's own `[H * dk]`, left out of its product, and for the queries
//! a position bias `[H, dk]`, `u` or `v`; [`HeadBias`]), and the heads' context back to
//! `[B, T, H * dk]` (`encoder::split_heads`, `encoder::merge_heads`).
//!
//! As views (a reshape and a swap of axes) the heads cost nothing, but CubeCL's matrix product
//! copies an operand whose batch axes interleave with its rows ("highly permuted" in
//! cubecl-std's `matrix_batch_layout`): each head-split operand was copied by the product that
//! read it, forward and again backward, and the gradients coming back were copied once more to
//! be reshaped; the query's two biases were two sums forward and four reductions backward. Here
//! the split writes the head-major layout once, so the products read contiguous or transposed
//! operands, and adds the biases, the projection's included, in the same pass; each backward is
//! one kernel (the inverse permutation), plus, with biases, one sum of that gradient's rows,
//! which is every bias's gradient: one operation of fusion's stream with both outputs
//! ([`DeviceHeads::heads_grads`]), and up to 4,096 rows one kernel ([`swap_middle_sums`]). Each bias keeps its own shape, both ways: a projection's
//! bias reshaped to `[H, dk]` was an operation of fusion's stream forward and one backward, 96
//! a step at the 0.6B preset's 24 layers, beside their drops (bench/RESULTS.md, 2026-12-01,
//! "The old parameters released"). Only where the two biases' shapes differ (the queries') is
//! the one sum reshaped for the second, outside that operation: two outputs of one operation
//! must not share a buffer, which fusion does not know of, and an operation holding the last
//! handle of one (the bias's gradient sum, say) may write over it.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors of fewer than `2^32` elements; `None` elsewhere, and the
//! caller runs the views.
//!
//! Invariants: `split(x, [b1, b2])[b, h, t, j] = (x[b, t, h * dk + j] + b1[h * dk + j]) +
//! b2[h * dk + j]`, each bias read as its elements in row-major order whatever its shape (the
//! views' sums in their order, bit for bit); `merge` is the inverse permutation without a bias;
//! the input's gradient is the inverse permutation of the output's, and each bias's is the
//! output's gradient summed over `b` and `t`, in the bias's shape.

use asr_tdt::fusion::in_stream;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    self, contiguous, cube_index, cubes, empty, grid, on_cube_types, unit_index, DeviceBackward,
    DeviceOp, CUBE,
};
use super::device_sum::{in_lanes, lanes_sum_to, DeviceSum, LANE_COLS};
use super::encoder::HeadBias;
use super::host_depthwise::{float, same};

/// One unit per element of `y` `[A, Q, P, R]` from `x` `[A, P, Q, R]` (the middle axes
/// swapped), plus `b1[q, r]` and then `b2[q, r]` for the first `biases` of the two.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swap_middle(
    x: &Array<f32>,
    b1: &Array<f32>,
    b2: &Array<f32>,
    y: &mut Array<f32>,
    p: u32,
    q: u32,
    r: u32,
    units: u32,
    #[comptime] biases: u32,
) {
    let pos = unit_index();
    if pos < units {
        let ri = pos % r;
        let pi = (pos / r) % p;
        let qi = (pos / (r * p)) % q;
        let a = pos / (r * p * q);
        let mut v = x[(((a * p + pi) * q + qi) * r + ri) as usize];
        if biases > 0 {
            v += b1[(qi * r + ri) as usize];
        }
        if biases > 1 {
            v += b2[(qi * r + ri) as usize];
        }
        y[pos as usize] = v;
    }
}

/// One cube per block of [`LANE_COLS`] columns of `y` `[A * Q, P * R]` (rows `(a, q)`, columns
/// `(p, r)`) from `x` `[A, P, Q, R]`: each unit writes its column of [`swap_middle`]'s output
/// (without biases) on every `lanes`-th row and sums what it wrote; the cube adds its lanes
/// ([`lanes_sum`]) and writes `sums[column]`, the biases' gradient. The swap back and the sum of
/// its rows (`device_sum`'s `sum_lanes`) in one launch, with their bits. Every unit reaches every
/// barrier.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swap_middle_sums(
    x: &Array<f32>,
    y: &mut Array<f32>,
    sums: &mut Array<f32>,
    p: u32,
    q: u32,
    r: u32,
    rows: u32,
    blocks: u32,
) {
    let cube = cube_index();
    let lane = UNIT_POS / LANE_COLS;
    let c = cube * LANE_COLS + UNIT_POS % LANE_COLS;
    let cols = p * r;
    let inside = cube < blocks && c < cols;
    let (pi, ri) = (c / r, c % r);
    let mut acc = 0.0f32;
    if inside {
        for row in range_stepped(lane, rows, CUBE_DIM / LANE_COLS) {
            let (a, qi) = (row / q, row % q);
            let v = x[(((a * p + pi) * q + qi) * r + ri) as usize];
            y[(row * cols + c) as usize] = v;
            acc += v;
        }
    }
    lanes_sum_to(sums, c, inside, acc);
}

/// The operation (see the module): the backends that have it.
pub trait DeviceHeads: DeviceSum {
    /// `x` viewed as `[A, P, Q, R]` (`view`) with its middle axes swapped, plus `biases` (at
    /// most two, `[Q, R]` each, in order), shaped `dims`.
    fn heads_swap(
        x: FloatTensor<Self>,
        biases: Vec<FloatTensor<Self>>,
        view: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self>;

    /// A swap's input gradient from the output's `dy` (`dy` viewed as `view`, swapped back,
    /// shaped `dims`) and the sum of that gradient's rows shaped `bias` (`[Q * R]` or `[Q, R]`),
    /// a bias's gradient. Under fusion one operation, not two ([`Fusion`]'s override).
    fn heads_grads(
        dy: FloatTensor<Self>,
        view: [usize; 4],
        dims: Vec<usize>,
        bias: Vec<usize>,
    ) -> [FloatTensor<Self>; 2] {
        swap_then_sum::<Self>(dy, view, dims, bias)
    }
}

/// The swap back, then the sum of its rows: [`DeviceHeads::heads_grads`] in two kernels.
fn swap_then_sum<B: DeviceHeads>(
    dy: FloatTensor<B>,
    view: [usize; 4],
    dims: Vec<usize>,
    bias: Vec<usize>,
) -> [FloatTensor<B>; 2] {
    let dx = B::heads_swap(dy, Vec::new(), view, dims);
    let db = B::sum_rows(dx.clone(), bias);
    [dx, db]
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
        biases: Vec<FloatTensor<Self>>,
        [_, p, q, r]: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self> {
        let units = dims.iter().product::<usize>();
        let x = contiguous(x);
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let count = biases.len().min(2) as u32;
        // The kernel reads only the first `count` biases: the input stands in for the others.
        let mut biases = biases.into_iter().map(contiguous);
        let b1 = biases.next().unwrap_or_else(|| x.clone());
        let b2 = biases.next().unwrap_or_else(|| x.clone());
        // Each unit writes its own element and reads one of `x` and of each bias; the checked
        // launch bounds every access anyway.
        swap_middle::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            b1.into_array_arg(),
            b2.into_array_arg(),
            y.clone().into_array_arg(),
            p as u32,
            q as u32,
            r as u32,
            units as u32,
            count,
        );
        y
    }

    /// The swap back and the bias's sum in one kernel up to 4,096 rows (`B x T`): 96 of the
    /// step's launches at 24 layers (bench/RESULTS.md, 2026-12-07, "The heads' swap back and
    /// their biases' sum").
    fn heads_grads(
        dy: FloatTensor<Self>,
        view: [usize; 4],
        dims: Vec<usize>,
        bias: Vec<usize>,
    ) -> [FloatTensor<Self>; 2] {
        let [a, p, q, r] = view;
        let (rows, cols) = (a * q, p * r);
        if rows == 0 || cols == 0 || !in_lanes(rows) {
            return swap_then_sum::<Self>(dy, view, dims, bias);
        }
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let dx = empty::<R>(&client, &dy.device, dims);
        let db = empty::<R>(&client, &dy.device, bias);
        let blocks = cols.div_ceil(LANE_COLS as usize);
        swap_middle_sums::launch::<R>(
            &client,
            cubes(blocks),
            CubeDim::new_1d(CUBE),
            dy.into_array_arg(),
            dx.clone().into_array_arg(),
            db.clone().into_array_arg(),
            p as u32,
            q as u32,
            r as u32,
            rows as u32,
            blocks as u32,
        );
        [dx, db]
    }
}

impl<B> DeviceHeads for Fusion<B>
where
    B: FusionBackend + DeviceHeads,
{
    fn heads_swap(
        x: FloatTensor<Self>,
        biases: Vec<FloatTensor<Self>>,
        view: [usize; 4],
        dims: Vec<usize>,
    ) -> FloatTensor<Self> {
        let out = (dims.clone(), DType::F32);
        // The biases are 0, 1 or 2 tensors; each count is its own operation's arity.
        let run =
            move |x, biases: Vec<FloatTensor<B>>| B::heads_swap(x, biases, view, dims.clone());
        let mut biases = biases.into_iter();
        let [y] = match (biases.next(), biases.next()) {
            (None, _) => {
                in_stream::<B, _, 1, 1>("heads_swap", [x], [out], move |[x]| [run(x, Vec::new())])
            }
            (Some(b0), None) => {
                in_stream::<B, _, 2, 1>("heads_swap", [x, b0], [out], move |[x, b0]| {
                    [run(x, vec![b0])]
                })
            }
            (Some(b0), Some(b1)) => {
                in_stream::<B, _, 3, 1>("heads_swap", [x, b0, b1], [out], move |[x, b0, b1]| {
                    [run(x, vec![b0, b1])]
                })
            }
        };
        y
    }

    /// One operation of fusion's stream: 96 of the 0.6B step's were the biases' sums
    /// (bench/RESULTS.md, 2026-12-06).
    fn heads_grads(
        dy: FloatTensor<Self>,
        view: [usize; 4],
        dims: Vec<usize>,
        bias: Vec<usize>,
    ) -> [FloatTensor<Self>; 2] {
        let outs = [(dims.clone(), DType::F32), (bias.clone(), DType::F32)];
        in_stream::<B, _, 1, 2>("heads_grads", [dy], outs, move |[dy]| {
            B::heads_grads(dy, view, dims.clone(), bias.clone())
        })
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
        [self.input_grad::<B>(dy)]
    }
}

impl<B: DeviceHeads> DeviceOp<B, 1> for Swap {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, ()) {
        (B::heads_swap(x, Vec::new(), self.view, self.out.clone()), ())
    }
}

impl Swap {
    /// The input's gradient from the output's: the inverse permutation.
    fn input_grad<B: DeviceHeads>(&self, dy: FloatTensor<B>) -> FloatTensor<B> {
        B::heads_swap(dy, Vec::new(), self.back_view(), self.dims.clone())
    }

    /// The input's gradient and every bias's: the sum of the input's gradient's rows (each
    /// bias element `(q, r)` adds to the input's column `q * R + r` of every row), shaped
    /// `bias` (`[Q * R]` or `[Q, R]`).
    fn grads_with_bias<B: DeviceHeads>(
        &self,
        dy: FloatTensor<B>,
        bias: &[usize],
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let [dx, db] = B::heads_grads(dy, self.back_view(), self.dims.clone(), bias.to_vec());
        (dx, db)
    }
}

/// [`Swap`] plus one bias of `Q * R` elements, its second input, shaped as the second field.
#[derive(Debug, Clone)]
struct BiasedSwap(Swap, Vec<usize>);

impl<B: DeviceHeads> DeviceBackward<B, 2> for BiasedSwap {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        let (dx, db) = self.0.grads_with_bias::<B>(dy, &self.1);
        [dx, db]
    }
}

impl<B: DeviceHeads> DeviceOp<B, 2> for BiasedSwap {
    fn forward(&self, [x, b]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, ()) {
        (B::heads_swap(x, vec![b], self.0.view, self.0.out.clone()), ())
    }
}

/// [`Swap`] plus two biases, its second and third inputs, shaped as the second field's (one
/// gradient for both, reshaped for the second where their shapes differ).
#[derive(Debug, Clone)]
struct TwiceBiasedSwap(Swap, [Vec<usize>; 2]);

impl<B: DeviceHeads> DeviceBackward<B, 3> for TwiceBiasedSwap {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        let [first, second] = &self.1;
        let (dx, db) = self.0.grads_with_bias::<B>(dy, first);
        let db2 = if first == second {
            db.clone()
        } else {
            B::float_reshape(db.clone(), second.clone().into())
        };
        [dx, db, db2]
    }
}

impl<B: DeviceHeads> DeviceOp<B, 3> for TwiceBiasedSwap {
    fn forward(&self, [x, b1, b2]: [FloatTensor<B>; 3]) -> (FloatTensor<B>, ()) {
        (B::heads_swap(x, vec![b1, b2], self.0.view, self.0.out.clone()), ())
    }
}

/// `swap` of `x` plus `biases` without autodiff.
fn run<T: DeviceHeads>(
    swap: Swap,
    x: FloatTensor<T>,
    biases: Vec<FloatTensor<T>>,
) -> FloatTensor<T> {
    T::heads_swap(x, biases, swap.view, swap.out)
}

/// `swap` of `x` plus `biases` (at most two) under autodiff: one node with the input and the
/// biases as parents.
fn tracked<T: DeviceHeads>(
    swap: Swap,
    x: FloatTensor<Autodiff<T>>,
    biases: Vec<FloatTensor<Autodiff<T>>>,
) -> FloatTensor<Autodiff<T>> {
    let dims = |b: &FloatTensor<Autodiff<T>>| b.shape().to_vec();
    let mut biases = biases.into_iter();
    match (biases.next(), biases.next()) {
        (None, _) => device_op::tracked(swap, [x]),
        (Some(b1), None) => device_op::tracked(BiasedSwap(swap, dims(&b1)), [x, b1]),
        (Some(b1), Some(b2)) => {
            let shapes = [dims(&b1), dims(&b2)];
            device_op::tracked(TwiceBiasedSwap(swap, shapes), [x, b1, b2])
        }
    }
}

/// Whether the operations take these tensors: f32, under `2^32` elements.
fn fits<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    x.dtype() == DType::F32 && x.shape().num_elements() <= u32::MAX as usize
}

/// Whether [`split`] and [`merge`] run as one operation for `x`: one of the trainer's CubeCL
/// types (bare or under autodiff), f32, under `2^32` elements (the caller then leaves a
/// projection's bias to the split).
pub fn takes<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    if !fits(x) {
        return false;
    }
    on_cube_types!(B, T, { true }, { true });
    false
}

/// `u`'s elements' count.
fn bias_elements<B: Backend>(u: &HeadBias<B>) -> usize {
    match u {
        HeadBias::Flat(t) => t.shape().num_elements(),
        HeadBias::Heads(t) => t.shape().num_elements(),
    }
}

/// Whether the operations take `u`: f32, under `2^32` elements.
fn bias_fits<B: Backend>(u: &HeadBias<B>) -> bool {
    match u {
        HeadBias::Flat(t) => fits(t),
        HeadBias::Heads(t) => fits(t),
    }
}

/// `u`'s primitive on `T`, whatever its rank, in a branch of `on_cube_types` (`B` is `T`).
fn bias_primitive<B: Backend, T: Backend>(u: &HeadBias<B>) -> FloatTensor<T> {
    match u {
        HeadBias::Flat(t) => float(same::<_, Tensor<T, 1>>(t.clone())),
        HeadBias::Heads(t) => float(same::<_, Tensor<T, 2>>(t.clone())),
    }
}

/// `x` `[B, T, H * dk]` as `[B, H, T, dk]` (`heads` = `H`) plus `biases` (at most two, `H * dk`
/// elements each, added in order), as one operation where [`takes`] says so and the shapes
/// agree; `x` given back elsewhere. `x` is taken, not borrowed: where the caller held its last
/// handle the operation holds it (under fusion, queued read-write), where a clone left the
/// caller's to be dropped after, a drop operation of fusion's stream (bench/RESULTS.md,
/// 2026-12-01, "The old parameters released").
pub fn split<B: Backend>(
    x: Tensor<B, 3>,
    biases: &[HeadBias<B>],
    heads: usize,
) -> Result<Tensor<B, 4>, Tensor<B, 3>> {
    let [b, t, d] = x.dims();
    if heads == 0 || !d.is_multiple_of(heads) || biases.len() > 2 || !takes(&x) {
        return Err(x);
    }
    let dk = d / heads;
    if biases.iter().any(|u| bias_elements(u) != d || !bias_fits(u)) {
        return Err(x);
    }
    let swap = Swap { view: [b, t, heads, dk], dims: vec![b, t, d], out: vec![b, heads, t, dk] };
    on_cube_types!(
        B,
        T,
        {
            let parts = biases.iter().map(bias_primitive::<B, Autodiff<T>>).collect();
            let x = float(same::<_, Tensor<Autodiff<T>, 3>>(x));
            let y = tracked::<T>(swap, x, parts);
            Ok(same(Tensor::<Autodiff<T>, 4>::from_primitive(TensorPrimitive::Float(y))))
        },
        {
            let parts = biases.iter().map(bias_primitive::<B, T>).collect();
            let x = float(same::<_, Tensor<T, 3>>(x));
            let y = run::<T>(swap, x, parts);
            Ok(same(Tensor::<T, 4>::from_primitive(TensorPrimitive::Float(y))))
        }
    );
    Err(x)
}

/// `y` `[B, H, T, dk]` as `[B, T, H * dk]`, the inverse of [`split`] without a bias, as one
/// operation where [`takes`] says so; `y` given back elsewhere (taken as [`split`] takes `x`).
pub fn merge<B: Backend>(y: Tensor<B, 4>) -> Result<Tensor<B, 3>, Tensor<B, 4>> {
    let [b, h, t, dk] = y.dims();
    if !takes(&y) {
        return Err(y);
    }
    let swap = Swap { view: [b, h, t, dk], dims: vec![b, h, t, dk], out: vec![b, t, h * dk] };
    on_cube_types!(
        B,
        T,
        {
            let y = float(same::<_, Tensor<Autodiff<T>, 4>>(y));
            let x = tracked::<T>(swap, y, Vec::new());
            Ok(same(Tensor::<Autodiff<T>, 3>::from_primitive(TensorPrimitive::Float(x))))
        },
        {
            let y = float(same::<_, Tensor<T, 4>>(y));
            let x = run::<T>(swap, y, Vec::new());
            Ok(same(Tensor::<T, 3>::from_primitive(TensorPrimitive::Float(x))))
        }
    );
    Err(y)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference;
    use burn::tensor::Distribution;

    /// Split (the queries with two biases, a projection's `[H * dk]` and a position bias
    /// `[H, dk]`; the keys with one, `[H * dk]`), products and merge as the attention runs
    /// them, against the views on the same backend: the output, and the gradients of the input
    /// and the biases under a weighted sum (each in its bias's shape). Returns the gradients'
    /// largest differences relative to their largest values, input then biases (the outputs
    /// must be the same bits).
    fn against_the_views<B: DeviceHeads>(b: usize, t: usize, heads: usize, dk: usize) -> [f32; 4] {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 21);
        let d = heads * dk;
        let normal =
            |n: usize| Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 1.0), &device);
        let x = normal(b * t * d).reshape([b, t, d]);
        let [c, e] = [0, 1].map(|_| normal(d));
        let u = normal(d).reshape([heads, dk]);
        let weights = normal(b * t * d).reshape([b, t, d]);
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let [ca, ea] =
                [&c, &e].map(|t| Tensor::<A<B>, 1>::from_inner(t.clone()).require_grad());
            let ua = Tensor::<A<B>, 2>::from_inner(u.clone()).require_grad();
            let q_biases = [HeadBias::Flat(ca.clone()), HeadBias::Heads(ua.clone())];
            let k_biases = [HeadBias::Flat(ea.clone())];
            let (q, k) = if device_form {
                (
                    split(xa.clone(), &q_biases, heads).expect("a CubeCL type"),
                    split(xa.clone(), &k_biases, heads).expect("a CubeCL type"),
                )
            } else {
                let v = xa.clone().reshape([b, t, heads, dk]);
                let [qc, qu] = q_biases.map(|u| u.per_head(heads, dk));
                let [ke] = k_biases.map(|u| u.per_head(heads, dk));
                ((v.clone() + qc + qu).swap_dims(1, 2), (v + ke).swap_dims(1, 2))
            };
            // The scores and a context from them, merged back.
            let ctx = q.matmul(k.clone().swap_dims(2, 3)).matmul(k);
            let y = if device_form {
                merge(ctx).expect("a CubeCL type")
            } else {
                ctx.swap_dims(1, 2).reshape([b, t, d])
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let [dc, de] = [&ca, &ea].map(|t| t.grad(&grads).unwrap());
            let du = ua.grad(&grads).unwrap();
            assert_eq!(du.dims(), [heads, dk], "the position bias's gradient in its shape");
            (y.inner(), xa.grad(&grads).unwrap(), [dc, du.reshape([d]), de])
        };
        let (y, dx, [dc, du, de]) = run(true);
        let (y0, dx0, [dc0, du0, de0]) = run(false);
        let values = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        assert_eq!(values(y), values(y0), "outputs");
        [
            relative_difference(dx, dx0),
            relative_difference(dc, dc0),
            relative_difference(du, du0),
            relative_difference(de, de0),
        ]
    }

    /// The swap back and the biases' sum in one kernel give the bits of the swap then
    /// `device_sum`'s sum of its rows, for a bias of either shape, at blocks of columns across
    /// heads, at the most rows one launch takes, and beyond (the two kernels).
    #[test]
    fn the_swap_back_with_the_bias_sum_is_the_swap_then_the_sum_bit_for_bit() {
        type W = burn::backend::Wgpu;
        let device = Default::default();
        for (b, t, heads, dk) in [(3, 29, 4, 6), (2, 2048, 2, 5), (1, 4097, 3, 4)] {
            let dy =
                Tensor::<W, 4>::random([b, heads, t, dk], Distribution::Normal(0.0, 1.0), &device);
            let (view, dims) = ([b, heads, t, dk], vec![b, t, heads * dk]);
            for bias in [vec![heads * dk], vec![heads, dk]] {
                let prim = || dy.clone().into_primitive().tensor();
                let [dx, db] = W::heads_grads(prim(), view, dims.clone(), bias.clone());
                let dx0 = W::heads_swap(prim(), Vec::new(), view, dims.clone());
                let db0 = W::sum_rows(dx0.clone(), bias.clone());
                let values = |t: FloatTensor<W>| {
                    let t = Tensor::<W, 1>::from_primitive(TensorPrimitive::Float(t));
                    t.into_data().into_vec::<f32>().unwrap()
                };
                assert_eq!(db.shape().to_vec(), bias, "the bias's shape");
                let what = format!("[{b}, {heads}, {t}, {dk}], bias {bias:?}");
                assert_eq!(values(dx), values(dx0), "{what}: the swap");
                assert_eq!(values(db), values(db0), "{what}: the sums");
            }
        }
    }

    #[test]
    fn split_and_merge_match_the_views_and_their_gradients_on_wgpu_with_and_without_fusion() {
        type Fused = Fusion<burn::backend::Wgpu>;
        type Wgpu = burn::backend::Wgpu;
        // One frame, one head; several heads over more rows than a cube.
        let cases = [(1, 1, 1, 4), (2, 7, 2, 8), (3, 50, 4, 16)];
        let mut worst = [0f32; 2];
        for (b, t, h, dk) in cases {
            for (backend, d) in [
                ("wgpu", against_the_views::<Wgpu>(b, t, h, dk)),
                ("fused wgpu", against_the_views::<Fused>(b, t, h, dk)),
            ] {
                eprintln!(
                    "[{b}, {t}, {h}x{dk}], {backend}: dx {:.1e}, biases {:.1e} {:.1e} {:.1e}",
                    d[0], d[1], d[2], d[3]
                );
                worst = [worst[0].max(d[0]), worst[1].max(d[1]).max(d[2]).max(d[3])];
            }
        }
        // Measured (fused or not): the input's gradient the same bits in every case; the
        // biases' up to 0, 1.4e-7 and 4.2e-7 (rows summed in another order than the views'
        // reductions). Bound: under 5x the largest.
        assert!(worst[0] == 0.0, "input's gradient differs by {:.2e}", worst[0]);
        assert!(worst[1] <= 1.2e-6, "a bias's gradient differs by {:.2e}", worst[1]);
    }

    #[test]
    fn other_types_and_shapes_are_left_to_the_views() {
        let x = Tensor::<burn::backend::NdArray, 3>::zeros([1, 2, 4], &Default::default());
        assert!(split(x.clone(), &[], 2).is_err() && !takes(&x), "not a CubeCL type");
        let x = Tensor::<burn::backend::Wgpu, 3>::zeros([1, 2, 6], &Default::default());
        assert!(takes(&x));
        assert!(split(x.clone(), &[], 4).is_err(), "6 channels in 4 heads");
        let heads = |dims: [usize; 2]| {
            HeadBias::Heads(Tensor::<burn::backend::Wgpu, 2>::zeros(dims, &Default::default()))
        };
        let flat = |n: usize| {
            HeadBias::Flat(Tensor::<burn::backend::Wgpu, 1>::zeros([n], &Default::default()))
        };
        assert!(split(x.clone(), &[heads([2, 2])], 2).is_err(), "a bias of another size");
        assert!(split(x.clone(), &[flat(4)], 2).is_err(), "a flat bias of another size");
        let u = heads([2, 3]);
        assert!(split(x.clone(), &[u.clone(), u.clone(), u.clone()], 2).is_err(), "three biases");
        assert!(split(x.clone(), &[u.clone(), u], 2).is_ok());
        assert!(split(x.clone(), &[flat(6), heads([2, 3])], 2).is_ok());
    }
}
