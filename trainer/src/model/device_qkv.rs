//! The attention's three projections (query, key, value) and their heads as one product and
//! one kernel each way on the CubeCL backends (wgpu, CUDA; fused or not), in f32 under
//! autodiff or bare.
//!
//! Apart, a layer's attention inputs were three products forward and six backward, the four
//! head splits (the query's twice, with the position biases `u` and `v`) forward and their four
//! swaps back with the biases' sums, and autodiff's sums of the gradients that meet: the
//! query's two, its bias's two, and the input's three (four additions). Here the three weights
//! are laid side by side, `[d, 3 d]` (one kernel), and multiplied once; one kernel splits the
//! product into the four heads' tensors, adding the biases. Backward one kernel lays the four
//! heads' gradients back into the product's layout, the query's two added, and sums the five
//! biases' gradients; then the input's gradient is one product of depth `3 d` and the weights'
//! one product, split into the three by one kernel. That is 20 launches a layer down to 7.
//!
//! One autodiff node per output, as Burn's autodiff has one output a node: the four nodes
//! share their parents (the input, the three weights and biases, `u` and `v`) and one pending
//! state. Each node's backward leaves its output's gradient there; the last of the four to run
//! computes every parent's gradient. The four have the same parents, so the same depth, and
//! autodiff runs a depth's nodes before any of a lower depth: every parent's gradient is
//! complete before the parent's own backward. A group whose outputs do not all reach the loss
//! would lose its gradients: its state, dropped with some but not all gradients left there,
//! records a device failure (`device_failure::defer`), and the next check fails the step. The
//! encoder's attention reads all four.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), with
//! f32 tensors, where the heads divide the width, the rows (`B x T`) are at most the lanes
//! kernels' (`device_sum::in_lanes`, 4,096) and the product's elements fit in `u32`; `None`
//! elsewhere, and the caller runs the projections one by one (`encoder`).
//!
//! Invariants: the outputs are `split_heads` of the projections, `q_u = (x w_q + b_q) + u`
//! head by head, `q_v` likewise with `v`, `k = x w_k + b_k`, `v = x w_v + b_v`; the biases'
//! gradients are the sums of the heads' gradients over `B` and `T`, `b_q`'s the sum of `u`'s and
//! `v`'s, with the bits of the swap-back kernels' lanes sums (`device_heads`); the input's and
//! the weights' gradients are the products' within their rounding (the input's sums its three
//! products in one, of depth `3 d`).

use std::sync::{Arc, Mutex};

use asr_tdt::fusion::in_stream;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_matmul::{chosen, DeviceMatmul, Form, Kernel};
use super::device_op::{
    contiguous, cube_index, cubes, empty, grid, on_cube_types, unit_index, CUBE,
};
use super::device_sum::{in_lanes, lanes_sum, LANE_COLS};
use super::host_depthwise::{cast, float};

/// The group's parents, in order: the input, the three weights, the three biases, `u`, `v`.
pub(crate) const PARENTS: usize = 9;
/// The group's outputs, in order: `q_u`, `q_v`, `k`, `v`.
const OUTPUTS: usize = 4;

/// One unit per element of `w` `[rows, 3 cols]`: column block `k` of each row is that row of
/// the `k`-th of `a`, `b`, `c` (`[rows, cols]` each).
#[cube(launch)]
pub fn concat_columns(
    a: &Array<f32>,
    b: &Array<f32>,
    c: &Array<f32>,
    w: &mut Array<f32>,
    cols: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let width = 3 * cols;
        let (row, col) = (pos / width, pos % width);
        let at = (row * cols + col % cols) as usize;
        let part = col / cols;
        // The three are the same shape: `at` lies in each.
        let mut v = a[at];
        if part == 1 {
            v = b[at];
        } else if part == 2 {
            v = c[at];
        }
        w[pos as usize] = v;
    }
}

/// [`concat_columns`] backward: one unit per element of `w` `[rows, 3 cols]`, written to the
/// row of `a`, `b` or `c` its column block names.
#[cube(launch)]
pub fn split_columns(
    w: &Array<f32>,
    a: &mut Array<f32>,
    b: &mut Array<f32>,
    c: &mut Array<f32>,
    cols: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let width = 3 * cols;
        let (row, col) = (pos / width, pos % width);
        let at = (row * cols + col % cols) as usize;
        let part = col / cols;
        let v = w[pos as usize];
        if part == 0 {
            a[at] = v;
        } else if part == 1 {
            b[at] = v;
        } else {
            c[at] = v;
        }
    }
}

/// One unit per element `(b, h, t, j)` of the heads `[B, H, T, dk]` from the product `p`
/// `[B, T, 3 d]` (the query's, the key's and the value's columns side by side, `d = H dk`):
/// `q_u = (p_q + b_q) + u`, `q_v = (p_q + b_q) + v`, `k = p_k + b_k`, `v = p_v + b_v`, each bias
/// read at column `h dk + j` (`device_heads`' `swap_middle` with its biases, the same sums).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn qkv_heads(
    p: &Array<f32>,
    bq: &Array<f32>,
    bk: &Array<f32>,
    bv: &Array<f32>,
    pos_u: &Array<f32>,
    pos_v: &Array<f32>,
    q_u: &mut Array<f32>,
    q_v: &mut Array<f32>,
    k: &mut Array<f32>,
    v: &mut Array<f32>,
    t: u32,
    heads: u32,
    dk: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let j = pos % dk;
        let ti = (pos / dk) % t;
        let hi = (pos / (dk * t)) % heads;
        let b = pos / (dk * t * heads);
        let d = heads * dk;
        let c = hi * dk + j;
        let row = (b * t + ti) * 3 * d;
        let ci = c as usize;
        let at = pos as usize;
        let q = p[(row + c) as usize] + bq[ci];
        q_u[at] = q + pos_u[ci];
        q_v[at] = q + pos_v[ci];
        k[at] = p[(row + d + c) as usize] + bk[ci];
        v[at] = p[(row + 2 * d + c) as usize] + bv[ci];
    }
}

/// One cube per block of [`LANE_COLS`] columns of `dp` `[B T, 3 d]` (the product's gradient):
/// each unit writes its column from the heads' gradients `[B, H, T, dk]` on every `lanes`-th
/// row (the query's columns `g_qu + g_qv`, the key's `g_k`, the value's `g_v`) and sums what it
/// read; the cube adds its lanes and writes the biases' gradients: `u`'s and `v`'s the sums of
/// `g_qu` and `g_qv`, `b_q`'s their sum, `b_k`'s and `b_v`'s. [`qkv_heads`] backward in one
/// launch, with the bits of `device_heads`' `swap_middle_sums` and autodiff's additions. Every
/// unit reaches every barrier.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn qkv_heads_grads(
    g_qu: &Array<f32>,
    g_qv: &Array<f32>,
    g_k: &Array<f32>,
    g_v: &Array<f32>,
    dp: &mut Array<f32>,
    d_bq: &mut Array<f32>,
    d_bk: &mut Array<f32>,
    d_bv: &mut Array<f32>,
    d_u: &mut Array<f32>,
    d_v: &mut Array<f32>,
    rows: u32,
    t: u32,
    heads: u32,
    dk: u32,
    blocks: u32,
) {
    let cube = cube_index();
    let lane = UNIT_POS / LANE_COLS;
    let d = heads * dk;
    let cols = 3 * d;
    let col = cube * LANE_COLS + UNIT_POS % LANE_COLS;
    let inside = cube < blocks && col < cols;
    let part = col / d;
    let c = col % d;
    let (hi, j) = (c / dk, c % dk);
    let mut acc_a = 0.0f32;
    let mut acc_b = 0.0f32;
    if inside {
        for row in range_stepped(lane, rows, CUBE_DIM / LANE_COLS) {
            let (b, ti) = (row / t, row % t);
            let src = (((b * heads + hi) * t + ti) * dk + j) as usize;
            let out = (row * cols + col) as usize;
            if part == 0 {
                let a = g_qu[src];
                let e = g_qv[src];
                dp[out] = a + e;
                acc_a += a;
                acc_b += e;
            } else if part == 1 {
                let g = g_k[src];
                dp[out] = g;
                acc_a += g;
            } else {
                let g = g_v[src];
                dp[out] = g;
                acc_a += g;
            }
        }
    }
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    let sum_a = lanes_sum(&mut shared, acc_a);
    let sum_b = lanes_sum(&mut shared, acc_b);
    if inside && lane == 0 {
        let ci = c as usize;
        if part == 0 {
            d_u[ci] = sum_a;
            d_v[ci] = sum_b;
            d_bq[ci] = sum_a + sum_b;
        } else if part == 1 {
            d_bk[ci] = sum_a;
        } else {
            d_bv[ci] = sum_a;
        }
    }
}

/// The group's operations: the backends that have them.
pub trait DeviceQkv: DeviceMatmul {
    /// The heads `[q_u, q_v, k, v]` (`[B, H, T, dk]` each, `heads` = `H`) of `x` `[B, T, d]`
    /// under the weights `w` (`[d, d]` each: query, key, value), the biases `b` (`[d]` each) and
    /// the position biases `pos` (`u`, `v`: `[H, dk]`), then the weights side by side
    /// `[d, 3 d]`, which the backward reads. Under fusion one operation of its stream.
    fn qkv_forward(
        x: FloatTensor<Self>,
        w: [FloatTensor<Self>; 3],
        b: [FloatTensor<Self>; 3],
        pos: [FloatTensor<Self>; 2],
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 5];

    /// Every parent's gradient, in [`PARENTS`]' order (the input, the three weights, the three
    /// biases, `u`, `v`), from the heads' gradients `dy` (in the outputs' order), the input `x`
    /// and the weights side by side `w` `[d, 3 d]`. Under fusion one operation of its stream.
    fn qkv_backward(
        dy: [FloatTensor<Self>; 4],
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 9];
}

impl<R, F, I, BT> DeviceQkv for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn qkv_forward(
        x: FloatTensor<Self>,
        [wq, wk, wv]: [FloatTensor<Self>; 3],
        [bq, bk, bv]: [FloatTensor<Self>; 3],
        [pos_u, pos_v]: [FloatTensor<Self>; 2],
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 5] {
        let [b, t, d] = x.shape().dims::<3>();
        let dk = d / heads;
        let client = x.client.clone();
        let device = x.device.clone();
        let (wq, wk, wv) = (contiguous(wq), contiguous(wk), contiguous(wv));
        let w = empty::<R>(&client, &device, vec![d, 3 * d]);
        let units = 3 * d * d;
        // Each unit writes its own element of `w` and reads one of a weight; the checked
        // launch bounds every access anyway.
        concat_columns::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            wq.into_array_arg(),
            wk.into_array_arg(),
            wv.into_array_arg(),
            w.clone().into_array_arg(),
            d as u32,
            units as u32,
        );
        let p = contiguous(Self::linear_product(x, w.clone(), Form::Forward, kernel));
        let (bq, bk, bv) = (contiguous(bq), contiguous(bk), contiguous(bv));
        let (pos_u, pos_v) = (contiguous(pos_u), contiguous(pos_v));
        let out = || empty::<R>(&client, &device, vec![b, heads, t, dk]);
        let (q_u, q_v, k, v) = (out(), out(), out(), out());
        let units = b * t * d;
        qkv_heads::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            p.into_array_arg(),
            bq.into_array_arg(),
            bk.into_array_arg(),
            bv.into_array_arg(),
            pos_u.into_array_arg(),
            pos_v.into_array_arg(),
            q_u.clone().into_array_arg(),
            q_v.clone().into_array_arg(),
            k.clone().into_array_arg(),
            v.clone().into_array_arg(),
            t as u32,
            heads as u32,
            dk as u32,
            units as u32,
        );
        [q_u, q_v, k, v, w]
    }

    fn qkv_backward(
        [g_qu, g_qv, g_k, g_v]: [FloatTensor<Self>; 4],
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 9] {
        let [b, h, t, dk] = g_qu.shape().dims::<4>();
        let d = h * dk;
        let client = g_qu.client.clone();
        let device = g_qu.device.clone();
        let (g_qu, g_qv) = (contiguous(g_qu), contiguous(g_qv));
        let (g_k, g_v) = (contiguous(g_k), contiguous(g_v));
        let dp = empty::<R>(&client, &device, vec![b, t, 3 * d]);
        let bias = || empty::<R>(&client, &device, vec![d]);
        let (d_bq, d_bk, d_bv) = (bias(), bias(), bias());
        let pos = || empty::<R>(&client, &device, vec![heads, dk]);
        let (d_u, d_v) = (pos(), pos());
        let blocks = (3 * d).div_ceil(LANE_COLS as usize);
        qkv_heads_grads::launch::<R>(
            &client,
            cubes(blocks),
            CubeDim::new_1d(CUBE),
            g_qu.into_array_arg(),
            g_qv.into_array_arg(),
            g_k.into_array_arg(),
            g_v.into_array_arg(),
            dp.clone().into_array_arg(),
            d_bq.clone().into_array_arg(),
            d_bk.clone().into_array_arg(),
            d_bv.clone().into_array_arg(),
            d_u.clone().into_array_arg(),
            d_v.clone().into_array_arg(),
            (b * t) as u32,
            t as u32,
            h as u32,
            dk as u32,
            blocks as u32,
        );
        let dx = Self::linear_product(dp.clone(), w, Form::InputGradient, kernel);
        let dw = contiguous(Self::linear_product(x, dp, Form::WeightGradient, kernel));
        let weight = || empty::<R>(&client, &device, vec![d, d]);
        let (d_wq, d_wk, d_wv) = (weight(), weight(), weight());
        let units = 3 * d * d;
        split_columns::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            dw.into_array_arg(),
            d_wq.clone().into_array_arg(),
            d_wk.clone().into_array_arg(),
            d_wv.clone().into_array_arg(),
            d as u32,
            units as u32,
        );
        [dx, d_wq, d_wk, d_wv, d_bq, d_bk, d_bv, d_u, d_v]
    }
}

impl<B> DeviceQkv for Fusion<B>
where
    B: FusionBackend + DeviceQkv,
{
    fn qkv_forward(
        x: FloatTensor<Self>,
        [wq, wk, wv]: [FloatTensor<Self>; 3],
        [bq, bk, bv]: [FloatTensor<Self>; 3],
        [pos_u, pos_v]: [FloatTensor<Self>; 2],
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 5] {
        let [b, t, d] = x.shape.dims::<3>();
        let head = (vec![b, heads, t, d / heads], DType::F32);
        let outs = [head.clone(), head.clone(), head.clone(), head, (vec![d, 3 * d], DType::F32)];
        in_stream::<B, _, 9, 5>(
            "qkv_forward",
            [x, wq, wk, wv, bq, bk, bv, pos_u, pos_v],
            outs,
            move |[x, wq, wk, wv, bq, bk, bv, pos_u, pos_v]| {
                B::qkv_forward(x, [wq, wk, wv], [bq, bk, bv], [pos_u, pos_v], heads, kernel)
            },
        )
    }

    fn qkv_backward(
        [g_qu, g_qv, g_k, g_v]: [FloatTensor<Self>; 4],
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        heads: usize,
        kernel: Kernel,
    ) -> [FloatTensor<Self>; 9] {
        let [b, t, d] = x.shape.dims::<3>();
        in_stream::<B, _, 6, 9>(
            "qkv_backward",
            [g_qu, g_qv, g_k, g_v, x, w],
            grad_shapes([b, t, d], heads),
            move |[g_qu, g_qv, g_k, g_v, x, w]| {
                B::qkv_backward([g_qu, g_qv, g_k, g_v], x, w, heads, kernel)
            },
        )
    }
}

/// The shapes of the [`PARENTS`]' gradients (f32) for an input `[B, T, d]` in `heads` heads.
pub(crate) fn grad_shapes([b, t, d]: [usize; 3], heads: usize) -> [(Vec<usize>, DType); PARENTS] {
    let f32s = |dims: Vec<usize>| (dims, DType::F32);
    let (w, bias, pos) = (vec![d, d], vec![d], vec![heads, d / heads]);
    [
        f32s(vec![b, t, d]),
        f32s(w.clone()),
        f32s(w.clone()),
        f32s(w),
        f32s(bias.clone()),
        f32s(bias.clone()),
        f32s(bias),
        f32s(pos.clone()),
        f32s(pos),
    ]
}

/// What the group's backward needs, and the heads' gradients left by its nodes so far.
#[derive(Debug)]
struct Pending<B: Backend> {
    /// The input and the weights side by side, until the backward takes them.
    saved: Option<(FloatTensor<B>, FloatTensor<B>)>,
    /// Each output's gradient, once its node's backward has run.
    grads: [Option<FloatTensor<B>>; OUTPUTS],
    heads: usize,
    kernel: Kernel,
}

impl<B: Backend> Pending<B> {
    /// Why the parents' gradients are lost, where they are: some but not all of the outputs'
    /// gradients came back, and the backward never ran (see the module).
    fn lost(&self) -> Option<String> {
        let left = self.grads.iter().filter(|g| g.is_some()).count();
        (left > 0 && self.saved.is_some()).then(|| {
            format!(
                "the attention's projections lost their gradients: {left} of their {OUTPUTS} \
                 outputs reached the loss (device_qkv needs all of them to)"
            )
        })
    }
}

impl<B: Backend> Drop for Pending<B> {
    /// The next device check fails the step naming what [`Pending::lost`] says.
    fn drop(&mut self) {
        if let Some(why) = self.lost() {
            crate::device_failure::defer(why);
        }
    }
}

/// The state the group's nodes share.
type Shared<B> = Arc<Mutex<Pending<B>>>;

/// One of the group's nodes: output `index`.
#[derive(Debug)]
struct Member {
    index: usize,
}

impl<B: DeviceQkv> Backward<B, PARENTS> for Member {
    type State = Shared<B>;

    fn backward(
        self,
        ops: Ops<Self::State, PARENTS>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<B>(&ops.node);
        // A poisoned lock means another node's backward panicked: that panic is the error.
        let mut pending = ops.state.lock().unwrap_or_else(|e| e.into_inner());
        pending.grads[self.index] = Some(dy);
        // The last of the four nodes to run takes every gradient; the others leave theirs.
        if pending.grads.iter().any(Option::is_none) {
            return;
        }
        let (Some((x, w)), [Some(g_qu), Some(g_qv), Some(g_k), Some(g_v)]) =
            (pending.saved.take(), std::mem::take(&mut pending.grads))
        else {
            return;
        };
        let dy = [g_qu, g_qv, g_k, g_v];
        let (heads, kernel) = (pending.heads, pending.kernel);
        drop(pending);
        let all = B::qkv_backward(dy, x, w, heads, kernel);
        for (parent, grad) in ops.parents.into_iter().zip(all) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// The group under autodiff: the forward, then one node per output with every input as a
/// parent and the shared [`Pending`] state.
fn tracked<B: DeviceQkv>(
    inputs: [FloatTensor<Autodiff<B>>; PARENTS],
    heads: usize,
    kernel: Kernel,
) -> [FloatTensor<Autodiff<B>>; OUTPUTS] {
    let parents = inputs.each_ref().map(|t| t.node.clone());
    let counts = inputs.each_ref().map(|t| t.rc.clone());
    let [x, wq, wk, wv, bq, bk, bv, pos_u, pos_v] = inputs.map(|t| t.primitive);
    let [q_u, q_v, k, v, w] =
        B::qkv_forward(x.clone(), [wq, wk, wv], [bq, bk, bv], [pos_u, pos_v], heads, kernel);
    let state: Shared<B> = Arc::new(Mutex::new(Pending {
        saved: Some((x, w)),
        grads: Default::default(),
        heads,
        kernel,
    }));
    let mut index = 0;
    let outputs = [q_u, q_v, k, v].map(|y| {
        let member = Member { index };
        index += 1;
        match member.prepare::<NoCheckpointing>(parents.clone()).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state.clone(), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    });
    drop(counts);
    outputs
}

/// The query's, key's and value's heads of `x` `[B, T, d]` under `layers` (query, key, value,
/// each with its bias) and the query's position biases `pos` (`u`, `v`: `[H, dk]`), as
/// `[q_u, q_v, k, v]` (`[B, H, T, dk]` each), by one product and one kernel each way (see the
/// module) where the backend and the shapes allow; `None` elsewhere.
pub fn project_heads<B: Backend>(
    x: &Tensor<B, 3>,
    layers: [&Linear<B>; 3],
    pos: [Tensor<B, 2>; 2],
    heads: usize,
) -> Option<[Tensor<B, 4>; OUTPUTS]> {
    let weights = layers.map(|l| l.weight.val());
    let biases = layers.map(|l| l.bias.as_ref().map(|b| b.val()));
    let [Some(bq), Some(bk), Some(bv)] = biases else {
        return None;
    };
    let biases = [bq, bk, bv];
    if !fits(x, &weights, &biases, &pos, heads) {
        return None;
    }
    let kernel = chosen();
    let inputs = (x, weights, biases, pos);
    on_cube_types!(
        B,
        T,
        {
            heads_of::<Autodiff<T>, B>(tracked::<T>(
                primitives::<B, Autodiff<T>>(inputs)?,
                heads,
                kernel,
            ))
        },
        {
            let [x, wq, wk, wv, bq, bk, bv, pu, pv] = primitives::<B, T>(inputs)?;
            let [q_u, q_v, k, v, _] =
                T::qkv_forward(x, [wq, wk, wv], [bq, bk, bv], [pu, pv], heads, kernel);
            heads_of::<T, B>([q_u, q_v, k, v])
        }
    );
    None
}

/// Whether the group takes `x` `[B, T, d]`, the `weights` (`[d, d]`), the `biases` (`[d]`) and
/// the position biases `pos` (`[H, dk]`, `heads` = `H`): f32, the heads dividing the width, the
/// rows within the lanes kernels' and the product's elements within `u32` (see the module).
pub(crate) fn fits<B: Backend>(
    x: &Tensor<B, 3>,
    weights: &[Tensor<B, 2>; 3],
    biases: &[Tensor<B, 1>; 3],
    pos: &[Tensor<B, 2>; 2],
    heads: usize,
) -> bool {
    let [b, t, d] = x.dims();
    let Some(dk) = d.checked_div(heads) else {
        return false;
    };
    d.is_multiple_of(heads)
        && b * t > 0
        && in_lanes(b * t)
        && (b * t * 3 * d).max(3 * d * d) <= u32::MAX as usize
        && weights.iter().all(|w| w.dims() == [d, d] && w.dtype() == DType::F32)
        && biases.iter().all(|b| b.dims() == [d] && b.dtype() == DType::F32)
        && pos.iter().all(|p| p.dims() == [heads, dk] && p.dtype() == DType::F32)
        && x.dtype() == DType::F32
}

/// The group's inputs (the input, the three weights, the three biases, `u` and `v`) as `C`'s
/// primitives in [`PARENTS`]' order, `C` being `B` itself (a branch of `on_cube_types`);
/// `None` elsewhere.
#[allow(clippy::type_complexity)]
pub(crate) fn primitives<B: Backend, C: Backend>(
    (x, [wq, wk, wv], [bq, bk, bv], [pu, pv]): (
        &Tensor<B, 3>,
        [Tensor<B, 2>; 3],
        [Tensor<B, 1>; 3],
        [Tensor<B, 2>; 2],
    ),
) -> Option<[FloatTensor<C>; PARENTS]> {
    let two = |t: Tensor<B, 2>| cast::<_, Tensor<C, 2>>(t).map(float);
    let one = |t: Tensor<B, 1>| cast::<_, Tensor<C, 1>>(t).map(float);
    let x = float(cast::<_, Tensor<C, 3>>(x.clone())?);
    Some([x, two(wq)?, two(wk)?, two(wv)?, one(bq)?, one(bk)?, one(bv)?, two(pu)?, two(pv)?])
}

/// The group's outputs, `C`'s primitives, as `B`'s tensors (`C` being `B`); `None` elsewhere.
fn heads_of<C: Backend, B: Backend>(
    y: [FloatTensor<C>; OUTPUTS],
) -> Option<[Tensor<B, 4>; OUTPUTS]> {
    let tensor = |y| cast(Tensor::<C, 4>::from_primitive(TensorPrimitive::Float(y)));
    let [q_u, q_v, k, v] = y;
    Some([tensor(q_u)?, tensor(q_v)?, tensor(k)?, tensor(v)?])
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference;
    use crate::model::encoder::HeadBias;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// What a form gives: the four heads, then the gradients of the input, the three weights,
    /// the three biases, `u` and `v` under a weighted sum of the heads.
    type Results<B> = ([Tensor<B, 4>; 4], Vec<Tensor<B, 1>>);

    /// Random inputs for `b` utterances of `t` frames, `heads` heads of `dk`: the input, the
    /// three weights and biases, `u` and `v`, and the heads' weights in the loss. Drawn once
    /// for both forms: the tests beside this one draw from the same device's generator.
    struct Inputs<B: Backend> {
        x: Tensor<B, 3>,
        w: [Tensor<B, 2>; 3],
        b: [Tensor<B, 1>; 3],
        pos: [Tensor<B, 2>; 2],
        weights: [Tensor<B, 4>; 4],
        heads: usize,
    }

    fn inputs<B: Backend>(b: usize, t: usize, heads: usize, dk: usize) -> Inputs<B> {
        let device = Default::default();
        B::seed(&device, 5);
        let d = heads * dk;
        let normal = Distribution::Normal(0.0, 1.0);
        Inputs {
            x: Tensor::random([b, t, d], normal, &device),
            w: [0, 1, 2].map(|_| Tensor::random([d, d], normal, &device)),
            b: [0, 1, 2].map(|_| Tensor::random([d], normal, &device)),
            pos: [0, 1].map(|_| Tensor::random([heads, dk], normal, &device)),
            weights: [0, 1, 2, 3].map(|_| Tensor::random([b, heads, t, dk], normal, &device)),
            heads,
        }
    }

    /// The heads of `inputs` and the gradients, by this module's group (`grouped`) or by each
    /// projection and its split (`device_matmul::linear` without its bias, then
    /// `device_heads::split` adding it: the encoder's form before the group), on `B` under
    /// autodiff.
    fn run<B: DeviceQkv>(grouped: bool, inputs: &Inputs<B>) -> Results<B> {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        let heads = inputs.heads;
        let [_, _, d] = inputs.x.dims();
        let x = Tensor::<A<B>, 3>::from_inner(inputs.x.clone()).require_grad();
        let mut layers = [0, 1, 2].map(|_| LinearConfig::new(d, d).init::<A<B>>(&device));
        for (k, layer) in layers.iter_mut().enumerate() {
            let w = Tensor::from_inner(inputs.w[k].clone()).require_grad();
            layer.weight = burn::module::Param::from_tensor(w);
            let bias = Tensor::from_inner(inputs.b[k].clone()).require_grad();
            layer.bias = Some(burn::module::Param::from_tensor(bias));
        }
        let [pu, pv] = inputs.pos.clone().map(|p| Tensor::<A<B>, 2>::from_inner(p).require_grad());
        let weights = inputs.weights.clone().map(Tensor::<A<B>, 4>::from_inner);
        let out = if grouped {
            let layers = [&layers[0], &layers[1], &layers[2]];
            project_heads(&x, layers, [pu.clone(), pv.clone()], heads).expect("wgpu takes it")
        } else {
            let split = |layer: &Linear<A<B>>, extra: Option<&Tensor<A<B>, 2>>| {
                let w = layer.weight.val();
                let y = crate::model::device_matmul::linear(&x, &w, None).expect("wgpu");
                let bias = layer.bias.as_ref().map(|b| b.val()).expect("a bias");
                let mut biases = vec![HeadBias::Flat(bias)];
                biases.extend(extra.map(|e| HeadBias::Heads(e.clone())));
                crate::model::device_heads::split(y, &biases, heads).expect("wgpu")
            };
            [
                split(&layers[0], Some(&pu)),
                split(&layers[0], Some(&pv)),
                split(&layers[1], None),
                split(&layers[2], None),
            ]
        };
        let loss = out.iter().zip(&weights).map(|(y, w)| (y.clone() * w.clone()).sum());
        let grads = loss.reduce(|a, b| a + b).expect("four terms").backward();
        let flat = |g: Tensor<B, 2>| g.reshape([-1]);
        let mut all = vec![x.grad(&grads).expect("x").reshape([-1])];
        all.extend(layers.iter().map(|l| flat(l.weight.val().grad(&grads).expect("a weight"))));
        all.extend(layers.iter().map(|l| {
            l.bias.as_ref().expect("a bias").val().grad(&grads).expect("a bias's gradient")
        }));
        all.extend([&pu, &pv].map(|p| flat(p.grad(&grads).expect("a position bias"))));
        (out.map(|y| y.inner()), all)
    }

    fn bits<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Vec<u32> {
        t.to_data().into_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The group against each projection and its split, bare and fused: the heads and the
    /// biases' gradients bit for bit; the input's and the weights' gradients (other sums of
    /// the same products) within a bound. Returns the input's and the weights' largest
    /// differences.
    fn against_the_projections<B: DeviceQkv>(name: &str, b: usize, t: usize) -> [f32; 2] {
        let inputs = inputs::<B>(b, t, 4, 8);
        let (grouped, grouped_grads) = run::<B>(true, &inputs);
        let (apart, apart_grads) = run::<B>(false, &inputs);
        for (k, (g, a)) in grouped.iter().zip(&apart).enumerate() {
            assert_eq!(bits(g), bits(a), "{name}: head {k}");
        }
        let what = ["b_q", "b_k", "b_v", "u", "v"];
        for (k, what) in what.iter().enumerate() {
            let (g, a) = (&grouped_grads[4 + k], &apart_grads[4 + k]);
            assert_eq!(bits(g), bits(a), "{name}: {what}'s gradient");
        }
        let dx = relative_difference(grouped_grads[0].clone(), apart_grads[0].clone());
        let dw = (1..4)
            .map(|k| relative_difference(grouped_grads[k].clone(), apart_grads[k].clone()))
            .fold(0.0f32, f32::max);
        eprintln!("{name}, {b} x {t} rows: input {dx:.1e}, weights {dw:.1e}");
        [dx, dw]
    }

    #[test]
    fn the_group_is_the_three_projections_and_their_heads() {
        type Fused = Fusion<burn::backend::Wgpu>;
        let cases = [
            against_the_projections::<burn::backend::Wgpu>("wgpu", 2, 7),
            against_the_projections::<Fused>("fused wgpu", 2, 7),
            // More rows than a cube has lanes (each lane reads several).
            against_the_projections::<burn::backend::Wgpu>("wgpu", 3, 300),
        ];
        // Measured (bare and fused the same): at 14 rows 2.7e-7 and 2.0e-7, at 900 rows 4.3e-7
        // and 9.3e-7 (the weights' product over `[d, 3 d]` tiles its sums otherwise than over
        // `[d, d]`). Bounds: 5x the larger.
        for [dx, dw] in cases {
            assert!(dx <= 2.1e-6, "the input's gradient differs by {dx:.2e}");
            assert!(dw <= 4.6e-6, "a weight's gradient differs by {dw:.2e}");
        }
    }

    #[test]
    fn the_group_is_refused_past_the_lanes_rows_and_for_a_layer_without_bias() {
        type A = Autodiff<burn::backend::Wgpu>;
        let device = Default::default();
        let (heads, d) = (2, 8);
        let layers = [0, 1, 2].map(|_| LinearConfig::new(d, d).init::<A>(&device));
        let pos = || [0, 1].map(|_| Tensor::<A, 2>::zeros([heads, d / heads], &device));
        let refs = [&layers[0], &layers[1], &layers[2]];
        let small = Tensor::<A, 3>::zeros([2, 3, d], &device);
        assert!(project_heads(&small, refs, pos(), heads).is_some());
        let long = Tensor::<A, 3>::zeros([1, 4097, d], &device);
        assert!(project_heads(&long, refs, pos(), heads).is_none(), "4,097 rows");
        assert!(project_heads(&small, refs, pos(), 3).is_none(), "3 heads do not divide 8");
        let bare = LinearConfig::new(d, d).with_bias(false).init::<A>(&device);
        let refs = [&layers[0], &bare, &layers[2]];
        assert!(project_heads(&small, refs, pos(), heads).is_none(), "no bias");
    }

    #[test]
    fn a_group_whose_outputs_do_not_all_reach_the_loss_says_so() {
        type W = burn::backend::Wgpu;
        let device = Default::default();
        let some = || Some(Tensor::<W, 1>::zeros([2], &device).into_primitive().tensor());
        let mut pending = Pending::<W> {
            saved: Some((some().unwrap(), some().unwrap())),
            grads: [some(), None, some(), None],
            heads: 1,
            kernel: Kernel::Burn,
        };
        let why = pending.lost().expect("two of four came back");
        assert!(why.contains("2 of their 4 outputs"), "{why}");
        // Before any gradient, or after the backward took them all, nothing is lost.
        pending.grads = Default::default();
        assert_eq!(pending.lost(), None);
        pending.grads = [some(), some(), some(), some()];
        pending.saved = None;
        assert_eq!(pending.lost(), None);
        pending.grads = Default::default();
    }
}
