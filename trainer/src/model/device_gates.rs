//! Swish (`x * sigmoid(x)`), the gated linear unit (`a * sigmoid(b)` over the two halves of
//! the last axis) and the ReLU as one operation each on the CubeCL backends (wgpu, CUDA; fused or
//! not).
//!
//! As Burn operations Swish is two operations forward and about six backward (the sigmoid's
//! backward, the product's two sides, the sum of the input's two gradients), the GLU two views
//! and two operations forward and about nine backward (each half's gradient written into a
//! zero-filled copy, then summed). A Conformer block runs three Swishes and one GLU, and a GPU
//! step is bound by the host's cost per operation (bench/RESULTS.md). Here each is one kernel
//! forward and one backward, which recomputes the sigmoid from the kept input.
//!
//! A dropout right after the gate (the feed-forward's, after its Swish) runs inside the gate's
//! operation ([`on_device_dropped`]): under fusion one operation of its stream each way, where
//! there were two (96 of the 0.6B step's operations; bench/RESULTS.md, 2026-12-06), with the
//! same bits. Likewise a mask right after the gate (the convolution module's time mask after
//! its GLU, [`on_device_masked`]). The CubeCL backend runs each of these two pairs as one
//! kernel each way (`swish_dropout_*`, `glu_mask_*`), not two (144 of the step's 3,781
//! launches; bench/RESULTS.md, 2026-12-07); any other pair as the gate's kernel then the
//! mask's (the dropout's kernel, or Burn's product). The one kernel does the two's arithmetic
//! in their order, so gives their bits.
//!
//! With the linear layer before either pair as one operation (`device_matmul::linear_gated`:
//! the feed-forward's first layer, the convolution module's first pointwise layer), the layer's
//! bias is added inside the gate's kernel, in place in the product the operation made
//! ([`DeviceGates::bias_gate_forward_then`]), and the gate's backward writes the bias's
//! gradient too, its rows summed by lanes as `device_sum`'s `sum_lanes` sums them
//! ([`DeviceGates::gate_backward_then_row_sums`]): 144 of the step's 3,053 launches at 24
//! layers (bench/RESULTS.md, 2026-12-07, "The bias inside the gate's kernel").
//!
//! The ReLU is here for what it keeps, not for its launches: Burn's keeps its input, and the
//! subsampling's stages (a convolution, its time mask, a ReLU, the next convolution, which keeps
//! its own input) then kept two tensors of each stage's size. This one keeps its output, which
//! is the next convolution's input: one tensor a stage (bench/RESULTS.md, "Activations against
//! PyTorch's").
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs Burn's `silu` and
//! `glu`. Under fusion the operations run through `asr_tdt::fusion::in_stream` (queued in
//! fusion's stream by default).
//!
//! Invariants: `sigmoid(x) = 1 / (1 + exp(-x))`; the GLU's first half is the value, the second
//! the gate (Burn's and PyTorch's order), over the last axis; the backward keeps the input
//! (shared, not copied), the ReLU's its output; the ReLU's gradient is the output's where the
//! output is above zero, else zero (Burn's, which tests the input, gives the same).

use asr_tdt::fusion::in_stream;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_bias::DeviceBias;
use super::device_dropout::{mask_factor, DeviceDropout};
use super::device_op::{
    self, contiguous, cube_index, cubes, empty, grid, on_cube_types, unit_index, DeviceBackward,
    DeviceOp, CUBE,
};
use super::device_sum::{in_lanes, lanes_sum_to, LANE_COLS};
use super::dropout::{Dropout, Rule};
use super::host_depthwise::{cast, float};

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + f32::exp(-x))
}

/// Swish at `v`, `v * sigmoid(v)`: every forward kernel's, so their bits agree by construction.
#[cube]
pub(super) fn swish(v: f32) -> f32 {
    v * sigmoid(v)
}

/// Swish's slope at `v`, `s + v s (1 - s)` with `s = sigmoid(v)`: the kernels with and without a
/// dropout share it, so their bits agree by construction.
#[cube]
pub(super) fn swish_slope(v: f32) -> f32 {
    let s = sigmoid(v);
    s + v * s * (1.0 - s)
}

/// Where output element `pos` of a GLU over rows of `2 * half` reads its value (its gate lies
/// `half` further on).
#[cube]
fn glu_at(pos: u32, half: u32) -> u32 {
    (pos / half) * 2 * half + pos % half
}

/// The GLU's backward for the value at `at` from its output's gradient `g`: `g * sigmoid(b)` to
/// the value's half and `g * a * s (1 - s)` to the gate's.
#[cube]
fn glu_grads(x: &Array<f32>, dx: &mut Array<f32>, at: u32, half: u32, g: f32) {
    let (a_at, b_at) = (at as usize, (at + half) as usize);
    let a = x[a_at];
    let s = sigmoid(x[b_at]);
    dx[a_at] = glu_value_grad(g, s);
    dx[b_at] = glu_gate_grad(g, a, s);
}

/// The GLU's value's gradient from the output's `g` and the gate's sigmoid `s`.
#[cube]
fn glu_value_grad(g: f32, s: f32) -> f32 {
    g * s
}

/// The GLU's gate's gradient from the output's `g`, the value `a` and the gate's sigmoid `s`.
#[cube]
fn glu_gate_grad(g: f32, a: f32, s: f32) -> f32 {
    g * a * s * (1.0 - s)
}

/// One unit per element: `y = x * sigmoid(x)`.
#[cube(launch)]
pub fn swish_forward(x: &Array<f32>, y: &mut Array<f32>, units: u32) {
    let pos = unit_index();
    if pos < units {
        y[pos as usize] = swish(x[pos as usize]);
    }
}

/// One unit per element: `dx = dy * (s + x s (1 - s))`, `s = sigmoid(x)`.
#[cube(launch)]
pub fn swish_backward(x: &Array<f32>, dy: &Array<f32>, dx: &mut Array<f32>, units: u32) {
    let pos = unit_index();
    if pos < units {
        dx[pos as usize] = dy[pos as usize] * swish_slope(x[pos as usize]);
    }
}

/// One unit per element of `y` `[rows, H]` over `x` `[rows, 2H]`: `y = a * sigmoid(b)`, `a` in
/// the first half of the row, `b` in the second.
#[cube(launch)]
pub fn glu_forward(x: &Array<f32>, y: &mut Array<f32>, half: u32, units: u32) {
    let pos = unit_index();
    if pos < units {
        let at = glu_at(pos, half) as usize;
        y[pos as usize] = x[at] * sigmoid(x[at + half as usize]);
    }
}

/// One unit per element of `dy` `[rows, H]`: both halves' gradients, `dy * sigmoid(b)` for `a`
/// and `dy * a * s (1 - s)` for `b`.
#[cube(launch)]
pub fn glu_backward(x: &Array<f32>, dy: &Array<f32>, dx: &mut Array<f32>, half: u32, units: u32) {
    let pos = unit_index();
    if pos < units {
        glu_grads(x, dx, glu_at(pos, half), half, dy[pos as usize]);
    }
}

/// One unit per element: `y = x * sigmoid(x) * m`, `m` the dropout's [`mask_factor`]: the
/// Swish's kernel then the dropout's, in one launch, with the same bits.
#[cube(launch)]
pub fn swish_dropout_forward(
    x: &Array<f32>,
    y: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let v = x[pos as usize];
        y[pos as usize] = swish(v) * mask_factor(pos, k0, k1, threshold, scale);
    }
}

/// One unit per element of `p` `[.., cols]`: the bias added in place, `p += b[column]` (the
/// Swish's input, which the backward keeps), then `y = p * sigmoid(p) * m`: a linear layer's
/// bias (`device_bias::bias_add`) and [`swish_dropout_forward`] in one launch, with their bits.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn bias_swish_dropout_forward(
    p: &mut Array<f32>,
    b: &Array<f32>,
    y: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    cols: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let v = p[pos as usize] + b[(pos % cols) as usize];
        p[pos as usize] = v;
        y[pos as usize] = swish(v) * mask_factor(pos, k0, k1, threshold, scale);
    }
}

/// One unit per element: `dx = (dy * m) * (s + x s (1 - s))`: the dropout's backward then the
/// Swish's, in one launch, with the same bits.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swish_dropout_backward(
    x: &Array<f32>,
    dy: &Array<f32>,
    dx: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let g = dy[pos as usize] * mask_factor(pos, k0, k1, threshold, scale);
        dx[pos as usize] = g * swish_slope(x[pos as usize]);
    }
}

/// One unit per element of `y` `[rows, H]`: the GLU's `a * sigmoid(b)` times `mask[row]` (a
/// mask of one value a row, as `[B, T, 1]` after a GLU over `[B, T, 2H]`): the GLU's kernel
/// then the broadcast product, in one launch, with the same bits.
#[cube(launch)]
pub fn glu_mask_forward(
    x: &Array<f32>,
    mask: &Array<f32>,
    y: &mut Array<f32>,
    half: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let at = glu_at(pos, half) as usize;
        let glu = x[at] * sigmoid(x[at + half as usize]);
        y[pos as usize] = glu * mask[(pos / half) as usize];
    }
}

/// One unit per element of `y` `[rows, H]` over `p` `[rows, 2H]`: its two inputs (the value
/// and the gate) take their bias `b` `[2H]` in place (the GLU's input, which the backward
/// keeps), then `y = a * sigmoid(g) * mask[row]`: a linear layer's bias
/// (`device_bias::bias_add`) and [`glu_mask_forward`] in one launch, with their bits.
#[cube(launch)]
pub fn bias_glu_mask_forward(
    p: &mut Array<f32>,
    b: &Array<f32>,
    mask: &Array<f32>,
    y: &mut Array<f32>,
    half: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let at = glu_at(pos, half);
        let (a_at, g_at) = (at as usize, (at + half) as usize);
        let a = p[a_at] + b[(at % (2 * half)) as usize];
        let g = p[g_at] + b[((at + half) % (2 * half)) as usize];
        p[a_at] = a;
        p[g_at] = g;
        y[pos as usize] = a * sigmoid(g) * mask[(pos / half) as usize];
    }
}

/// One unit per element of `dy` `[rows, H]`: the GLU's backward of `dy * mask[row]`, both
/// halves, in one launch, with the same bits as the product then [`glu_backward`].
#[cube(launch)]
pub fn glu_mask_backward(
    x: &Array<f32>,
    mask: &Array<f32>,
    dy: &Array<f32>,
    dx: &mut Array<f32>,
    half: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let g = dy[pos as usize] * mask[(pos / half) as usize];
        glu_grads(x, dx, glu_at(pos, half), half, g);
    }
}

/// One cube per block of [`LANE_COLS`] columns of the Swish's input `x` `[n, cols]`: each unit
/// writes the input's gradient on every `lanes`-th row of its column as
/// [`swish_dropout_backward`] writes it, and sums what it wrote; the cube adds its lanes
/// ([`lanes_sum`]) and writes `sums[column]`: the gate's backward and the bias gradient of the
/// linear layer before it (`device_sum`'s `sum_lanes`) in one launch, with their bits. Every
/// unit reaches every barrier.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn swish_dropout_backward_sums(
    x: &Array<f32>,
    dy: &Array<f32>,
    dx: &mut Array<f32>,
    sums: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    n: u32,
    cols: u32,
    blocks: u32,
) {
    let cube = cube_index();
    let lane = UNIT_POS / LANE_COLS;
    let i = cube * LANE_COLS + UNIT_POS % LANE_COLS;
    let inside = cube < blocks && i < cols;
    let mut acc = 0.0f32;
    if inside {
        for r in range_stepped(lane, n, CUBE_DIM / LANE_COLS) {
            let pos = r * cols + i;
            let g = dy[pos as usize] * mask_factor(pos, k0, k1, threshold, scale);
            let v = g * swish_slope(x[pos as usize]);
            dx[pos as usize] = v;
            acc += v;
        }
    }
    lanes_sum_to(sums, i, inside, acc);
}

/// As [`swish_dropout_backward_sums`], for the GLU over `x` `[n, 2 * half]` with a mask of
/// one value a row: each unit writes its column's half of [`glu_mask_backward`]'s gradient
/// (the value's or the gate's) and sums it.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn glu_mask_backward_sums(
    x: &Array<f32>,
    mask: &Array<f32>,
    dy: &Array<f32>,
    dx: &mut Array<f32>,
    sums: &mut Array<f32>,
    n: u32,
    half: u32,
    blocks: u32,
) {
    let cube = cube_index();
    let lane = UNIT_POS / LANE_COLS;
    let i = cube * LANE_COLS + UNIT_POS % LANE_COLS;
    let cols = 2 * half;
    let inside = cube < blocks && i < cols;
    let value = i < half;
    let mut j = i;
    if !value {
        j = i - half;
    }
    let mut acc = 0.0f32;
    if inside {
        for r in range_stepped(lane, n, CUBE_DIM / LANE_COLS) {
            let g = dy[(r * half + j) as usize] * mask[r as usize];
            let at = r * cols + j;
            let s = sigmoid(x[(at + half) as usize]);
            let mut v = glu_value_grad(g, s);
            if !value {
                v = glu_gate_grad(g, x[at as usize], s);
            }
            dx[(r * cols + i) as usize] = v;
            acc += v;
        }
    }
    lanes_sum_to(sums, i, inside, acc);
}

/// One unit per element: `y = max(x, 0)`.
#[cube(launch)]
pub fn relu_forward(x: &Array<f32>, y: &mut Array<f32>, units: u32) {
    let pos = unit_index();
    if pos < units {
        let v = x[pos as usize];
        let mut out = 0.0f32;
        if v > 0.0 {
            out = v;
        }
        y[pos as usize] = out;
    }
}

/// One unit per element, from the output `y`: `dx = dy` where `y > 0`, else 0.
#[cube(launch)]
pub fn relu_backward(y: &Array<f32>, dy: &Array<f32>, dx: &mut Array<f32>, units: u32) {
    let pos = unit_index();
    if pos < units {
        let mut g = 0.0f32;
        if y[pos as usize] > 0.0 {
            g = dy[pos as usize];
        }
        dx[pos as usize] = g;
    }
}

/// Which of the operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `x * sigmoid(x)`.
    Swish,
    /// `a * sigmoid(b)` over the halves of the last axis.
    Glu,
    /// `max(x, 0)`, keeping its output for the backward.
    Relu,
}

/// The operations (see the module): the backends that have them.
pub trait DeviceGates: DeviceBias + DeviceDropout {
    /// `gate` of `x` (for the GLU, the last axis of even length).
    fn gate_forward(gate: Gate, x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The input's gradient from the output's gradient `dy` and `kept`, what the forward kept:
    /// the input, or the output for the ReLU.
    fn gate_backward(
        gate: Gate,
        kept: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `gate` of `x`, then `after` (a dropout's mask, or a mask tensor). Under fusion one
    /// operation, not two ([`Fusion`]'s override).
    fn gate_forward_then(
        gate: Gate,
        after: After<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        after.apply(Self::gate_forward(gate, x))
    }

    /// [`Self::gate_backward`] of the output's gradient `dy` through `after`: the input's
    /// gradient through the mask and the gate. Under fusion one operation, not two.
    fn gate_backward_then(
        gate: Gate,
        after: After<Self>,
        kept: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::gate_backward(gate, kept, after.apply(dy))
    }

    /// [`Self::gate_backward_then`], and the rows of the input's gradient summed (`[cols]`,
    /// the bias gradient of a linear layer before the gate), in one kernel where the backend
    /// has it; `None` elsewhere (and beyond one launch of lanes sums, `device_sum`), and the
    /// caller runs the backward and the sum.
    fn gate_backward_then_row_sums(
        gate: Gate,
        after: &After<Self>,
        x: &FloatTensor<Self>,
        dy: &FloatTensor<Self>,
    ) -> Option<[FloatTensor<Self>; 2]> {
        let _ = (gate, after, x, dy);
        None
    }

    /// [`Self::gate_forward_then`] of `p + b`, `b` `[cols]` added to every row of `p`
    /// `[.., cols]` (a linear layer's bias): the output, and `p + b`, the gate's input, which
    /// its backward keeps. The bias's kernel then the gate's elsewhere.
    fn bias_gate_forward_then(
        gate: Gate,
        after: After<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        bias_then_gate::<Self>(gate, after, p, b)
    }
}

/// The bias's kernel, then the gate's with its mask: [`DeviceGates::bias_gate_forward_then`]
/// where there is no one kernel for the pair.
fn bias_then_gate<B: DeviceGates>(
    gate: Gate,
    after: After<B>,
    p: FloatTensor<B>,
    b: FloatTensor<B>,
) -> [FloatTensor<B>; 2] {
    let x = B::bias_add(p, b);
    [B::gate_forward_then(gate, after, x.clone()), x]
}

/// What a gate's output goes through inside the gate's operation: a dropout's mask (the
/// feed-forward's dropout after its Swish), or a mask tensor that is not tracked, multiplied
/// as Burn's product broadcasts (the convolution module's time mask `[B, T, 1]` after its GLU).
/// Either is a product by the same mask forward (the output) and backward (its gradient).
#[derive(Clone)]
pub enum After<B: Backend> {
    /// The dropout's mask for this rule.
    Dropout(Rule),
    /// This tensor.
    Mask(FloatTensor<B>),
}

impl<B: DeviceDropout> After<B> {
    /// `t` times the mask.
    fn apply(self, t: FloatTensor<B>) -> FloatTensor<B> {
        match self {
            After::Dropout(rule) => B::dropout_apply(rule, t),
            After::Mask(mask) => B::float_mul(t, mask),
        }
    }
}

impl<B: Backend> std::fmt::Debug for After<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            After::Dropout(rule) => f.debug_tuple("Dropout").field(rule).finish(),
            After::Mask(mask) => f.debug_tuple("Mask").field(&mask.shape()).finish(),
        }
    }
}

impl Gate {
    /// The output's shape for an input of `dims` (the GLU halves the last axis).
    pub(crate) fn output_dims(self, dims: &[usize]) -> Vec<usize> {
        let mut dims = dims.to_vec();
        if let (Gate::Glu, Some(last)) = (self, dims.last_mut()) {
            *last /= 2;
        }
        dims
    }
}

impl<R, F, I, BT> DeviceGates for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn gate_forward(gate: Gate, x: FloatTensor<Self>) -> FloatTensor<Self> {
        let mut dims = x.shape().to_vec();
        let x = contiguous(x);
        let client = x.client.clone();
        let cube = CubeDim::new_1d(CUBE);
        // Each unit reads and writes within its element (and, for the GLU, its row's other
        // half); the checked launch bounds every access anyway.
        match gate {
            Gate::Swish | Gate::Relu => {
                let units = dims.iter().product::<usize>();
                let y = empty::<R>(&client, &x.device, dims);
                let (xa, ya) = (x.clone().into_array_arg(), y.clone().into_array_arg());
                let (g, n) = (grid(units), units as u32);
                if gate == Gate::Swish {
                    swish_forward::launch::<R>(&client, g, cube, xa, ya, n);
                } else {
                    relu_forward::launch::<R>(&client, g, cube, xa, ya, n);
                }
                y
            }
            Gate::Glu => {
                let half = dims.last().copied().unwrap_or(0) / 2;
                if let Some(last) = dims.last_mut() {
                    *last = half;
                }
                let units = dims.iter().product::<usize>();
                let y = empty::<R>(&client, &x.device, dims);
                let (xa, ya) = (x.clone().into_array_arg(), y.clone().into_array_arg());
                let (h, n) = (half as u32, units as u32);
                glu_forward::launch::<R>(&client, grid(units), cube, xa, ya, h, n);
                y
            }
        }
    }

    fn gate_backward(gate: Gate, x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        // `x` is the kept tensor: the input, or the ReLU's output (of the input's shape).
        let dims = x.shape().to_vec();
        let (x, dy) = (contiguous(x), contiguous(dy));
        let client = x.client.clone();
        let dx = empty::<R>(&client, &x.device, dims.clone());
        let cube = CubeDim::new_1d(CUBE);
        let (xa, dya, dxa) =
            (x.clone().into_array_arg(), dy.clone().into_array_arg(), dx.clone().into_array_arg());
        let units = dims.iter().product::<usize>();
        match gate {
            Gate::Swish => {
                swish_backward::launch::<R>(&client, grid(units), cube, xa, dya, dxa, units as u32)
            }
            Gate::Relu => {
                relu_backward::launch::<R>(&client, grid(units), cube, xa, dya, dxa, units as u32)
            }
            Gate::Glu => {
                // One unit per output element writes both of its input's halves.
                let half = dims.last().copied().unwrap_or(0) / 2;
                let n = units / 2;
                let h = half as u32;
                glu_backward::launch::<R>(&client, grid(n), cube, xa, dya, dxa, h, n as u32)
            }
        }
        dx
    }

    /// The Swish and its dropout, or the GLU and a mask of one value a row, in one kernel;
    /// the gate's kernel then the mask's elsewhere. A kernel is host work on CubeCL's device
    /// thread (and on fusion's, which runs the operation) in a step that the host bounds on an
    /// H200: these were 96 of the 0.6B step's 3,781 launches (bench/RESULTS.md, 2026-12-07).
    fn gate_forward_then(
        gate: Gate,
        after: After<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let dims = gate.output_dims(&x.shape().to_vec());
        let units = dims.iter().product::<usize>();
        let cube = CubeDim::new_1d(CUBE);
        match (gate, after) {
            (Gate::Swish, After::Dropout(rule)) => {
                let x = contiguous(x);
                let client = x.client.clone();
                let y = empty::<R>(&client, &x.device, dims);
                let (k0, k1, threshold, scale) = rule.kernel_args();
                let (xa, ya) = (x.clone().into_array_arg(), y.clone().into_array_arg());
                let n = units as u32;
                swish_dropout_forward::launch::<R>(
                    &client,
                    grid(units),
                    cube,
                    xa,
                    ya,
                    k0,
                    k1,
                    threshold,
                    scale,
                    n,
                );
                y
            }
            (Gate::Glu, After::Mask(mask)) if row_mask(&mask, &dims) => {
                let (x, mask) = (contiguous(x), contiguous(mask));
                let client = x.client.clone();
                let half = dims.last().copied().unwrap_or(0);
                let y = empty::<R>(&client, &x.device, dims);
                let (xa, ma, ya) = (
                    x.clone().into_array_arg(),
                    mask.clone().into_array_arg(),
                    y.clone().into_array_arg(),
                );
                let (h, n) = (half as u32, units as u32);
                glu_mask_forward::launch::<R>(&client, grid(units), cube, xa, ma, ya, h, n);
                y
            }
            (gate, after) => after.apply(Self::gate_forward(gate, x)),
        }
    }

    /// As [`Self::gate_forward_then`], backward.
    fn gate_backward_then(
        gate: Gate,
        after: After<Self>,
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let dims = x.shape().to_vec();
        let cube = CubeDim::new_1d(CUBE);
        match (gate, after) {
            (Gate::Swish, After::Dropout(rule)) => {
                let (x, dy) = (contiguous(x), contiguous(dy));
                let client = x.client.clone();
                let units = dims.iter().product::<usize>();
                let dx = empty::<R>(&client, &x.device, dims);
                let (k0, k1, threshold, scale) = rule.kernel_args();
                let (xa, dya, dxa) = (
                    x.clone().into_array_arg(),
                    dy.clone().into_array_arg(),
                    dx.clone().into_array_arg(),
                );
                let n = units as u32;
                swish_dropout_backward::launch::<R>(
                    &client,
                    grid(units),
                    cube,
                    xa,
                    dya,
                    dxa,
                    k0,
                    k1,
                    threshold,
                    scale,
                    n,
                );
                dx
            }
            (Gate::Glu, After::Mask(mask)) if row_mask(&mask, &Gate::Glu.output_dims(&dims)) => {
                let (x, mask, dy) = (contiguous(x), contiguous(mask), contiguous(dy));
                let client = x.client.clone();
                let half = dims.last().copied().unwrap_or(0) / 2;
                // One unit per output element writes both of its input's halves.
                let units = dims.iter().product::<usize>() / 2;
                let dx = empty::<R>(&client, &x.device, dims);
                let (xa, ma, dya, dxa) = (
                    x.clone().into_array_arg(),
                    mask.clone().into_array_arg(),
                    dy.clone().into_array_arg(),
                    dx.clone().into_array_arg(),
                );
                let (h, n) = (half as u32, units as u32);
                glu_mask_backward::launch::<R>(&client, grid(units), cube, xa, ma, dya, dxa, h, n);
                dx
            }
            (gate, after) => Self::gate_backward(gate, x, after.apply(dy)),
        }
    }

    /// The Swish and its dropout, or the GLU and a row mask, backward with the bias's sum: 72
    /// of the step's launches at 24 layers (bench/RESULTS.md, 2026-12-07, "The bias inside the
    /// gate's kernel").
    fn gate_backward_then_row_sums(
        gate: Gate,
        after: &After<Self>,
        x: &FloatTensor<Self>,
        dy: &FloatTensor<Self>,
    ) -> Option<[FloatTensor<Self>; 2]> {
        let dims = x.shape().to_vec();
        let cols = dims.last().copied().unwrap_or(0);
        let rows = dims.iter().rev().skip(1).product::<usize>();
        // The pair is checked before the operands are made contiguous (a copy where they are
        // not), which a pair without the kernel would not use.
        let pair = match (gate, after) {
            (Gate::Swish, After::Dropout(_)) => true,
            (Gate::Glu, After::Mask(mask)) => {
                cols.is_multiple_of(2) && row_mask(mask, &Gate::Glu.output_dims(&dims))
            }
            _ => false,
        };
        if !pair || cols == 0 || rows == 0 || !in_lanes(rows) {
            return None;
        }
        let (x, dy) = (contiguous(x.clone()), contiguous(dy.clone()));
        let client = x.client.clone();
        let blocks = cols.div_ceil(LANE_COLS as usize);
        let (count, cube) = (cubes(blocks), CubeDim::new_1d(CUBE));
        match (gate, after) {
            (Gate::Swish, After::Dropout(rule)) => {
                let dx = empty::<R>(&client, &x.device, dims);
                let sums = empty::<R>(&client, &x.device, vec![cols]);
                let (k0, k1, threshold, scale) = rule.kernel_args();
                swish_dropout_backward_sums::launch::<R>(
                    &client,
                    count,
                    cube,
                    x.into_array_arg(),
                    dy.into_array_arg(),
                    dx.clone().into_array_arg(),
                    sums.clone().into_array_arg(),
                    k0,
                    k1,
                    threshold,
                    scale,
                    rows as u32,
                    cols as u32,
                    blocks as u32,
                );
                Some([dx, sums])
            }
            (Gate::Glu, After::Mask(mask)) => {
                let mask = contiguous(mask.clone());
                let dx = empty::<R>(&client, &x.device, dims);
                let sums = empty::<R>(&client, &x.device, vec![cols]);
                glu_mask_backward_sums::launch::<R>(
                    &client,
                    count,
                    cube,
                    x.into_array_arg(),
                    mask.into_array_arg(),
                    dy.into_array_arg(),
                    dx.clone().into_array_arg(),
                    sums.clone().into_array_arg(),
                    rows as u32,
                    (cols / 2) as u32,
                    blocks as u32,
                );
                Some([dx, sums])
            }
            _ => None,
        }
    }

    /// The Swish and its dropout, or the GLU and a row mask, with the bias added in place in
    /// the same kernel (`p` must be this operation's own: a product it made), where there were
    /// two: 72 of the step's launches at 24 layers (bench/RESULTS.md, 2026-12-07, "The bias
    /// inside the gate's kernel").
    fn bias_gate_forward_then(
        gate: Gate,
        after: After<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let dims = p.shape().to_vec();
        let out = gate.output_dims(&dims);
        let units = out.iter().product::<usize>();
        let cols = dims.last().copied().unwrap_or(0);
        let own = p.can_mut() && p.is_contiguous() && b.dtype == DType::F32;
        let cube = CubeDim::new_1d(CUBE);
        match (gate, after) {
            (Gate::Swish, After::Dropout(rule)) if own && cols > 0 => {
                let b = contiguous(b);
                let client = p.client.clone();
                let y = empty::<R>(&client, &p.device, out);
                let (k0, k1, threshold, scale) = rule.kernel_args();
                bias_swish_dropout_forward::launch::<R>(
                    &client,
                    grid(units),
                    cube,
                    p.clone().into_array_arg(),
                    b.into_array_arg(),
                    y.clone().into_array_arg(),
                    k0,
                    k1,
                    threshold,
                    scale,
                    cols as u32,
                    units as u32,
                );
                [y, p]
            }
            (Gate::Glu, After::Mask(mask)) if own && cols > 0 && row_mask(&mask, &out) => {
                let (b, mask) = (contiguous(b), contiguous(mask));
                let client = p.client.clone();
                let y = empty::<R>(&client, &p.device, out);
                let (pa, ba, ma, ya) = (
                    p.clone().into_array_arg(),
                    b.into_array_arg(),
                    mask.into_array_arg(),
                    y.clone().into_array_arg(),
                );
                let (h, n) = ((cols / 2) as u32, units as u32);
                bias_glu_mask_forward::launch::<R>(
                    &client,
                    grid(units),
                    cube,
                    pa,
                    ba,
                    ma,
                    ya,
                    h,
                    n,
                );
                [y, p]
            }
            (gate, after) => bias_then_gate::<Self>(gate, after, p, b),
        }
    }
}

/// Whether `mask` is an f32 tensor of one value per row of an output of `out` dims: the same
/// leading axes, the last of length 1 (`[B, T, 1]` for `[B, T, H]`), as the broadcast product
/// reads it.
fn row_mask<R: CubeRuntime>(mask: &burn_cubecl::tensor::CubeTensor<R>, out: &[usize]) -> bool {
    let dims = mask.shape().to_vec();
    mask.dtype == DType::F32
        && dims.len() == out.len()
        && dims.last() == Some(&1)
        && dims[..dims.len() - 1] == out[..out.len() - 1]
}

impl<B> DeviceGates for Fusion<B>
where
    B: FusionBackend + DeviceGates,
{
    fn gate_forward(gate: Gate, x: FloatTensor<Self>) -> FloatTensor<Self> {
        let dims = gate.output_dims(&x.shape);
        let [y] = in_stream::<B, _, 1, 1>("gate_forward", [x], [(dims, DType::F32)], move |[x]| {
            [B::gate_forward(gate, x)]
        });
        y
    }

    fn gate_backward(gate: Gate, x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), DType::F32);
        let [dx] = in_stream::<B, _, 2, 1>("gate_backward", [x, dy], [out], move |[x, dy]| {
            [B::gate_backward(gate, x, dy)]
        });
        dx
    }

    /// One operation of fusion's stream, whose inputs are the mask's tensor too where there is
    /// one: the feed-forward's dropout after its Swish was 96 of the 0.6B step's operations,
    /// the convolution module's time mask after its GLU 48, both ways (bench/RESULTS.md,
    /// 2026-12-06).
    fn gate_forward_then(
        gate: Gate,
        after: After<Self>,
        x: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = [(gate.output_dims(&x.shape), DType::F32)];
        let [y] = match after {
            After::Dropout(rule) => in_stream::<B, _, 1, 1>("gate_dropout", [x], out, move |[x]| {
                [B::gate_forward_then(gate, After::Dropout(rule), x)]
            }),
            After::Mask(m) => in_stream::<B, _, 2, 1>("gate_mask", [x, m], out, move |[x, m]| {
                [B::gate_forward_then(gate, After::Mask(m), x)]
            }),
        };
        y
    }

    fn gate_backward_then(
        gate: Gate,
        after: After<Self>,
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = [(x.shape.to_vec(), DType::F32)];
        let [dx] = match after {
            After::Dropout(rule) => {
                in_stream::<B, _, 2, 1>("gate_dropout_backward", [x, dy], out, move |[x, dy]| {
                    [B::gate_backward_then(gate, After::Dropout(rule), x, dy)]
                })
            }
            After::Mask(m) => {
                in_stream::<B, _, 3, 1>("gate_mask_backward", [x, m, dy], out, move |[x, m, dy]| {
                    [B::gate_backward_then(gate, After::Mask(m), x, dy)]
                })
            }
        };
        dx
    }
}

/// A gate as a [`DeviceOp`] of its input, which it keeps (the ReLU its output; shared, not
/// copied).
impl<B: DeviceGates> DeviceBackward<B, 1> for Gate {
    type Saved = FloatTensor<B>;

    fn backward(&self, kept: FloatTensor<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 1] {
        [B::gate_backward(*self, kept, dy)]
    }
}

impl<B: DeviceGates> DeviceOp<B, 1> for Gate {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, FloatTensor<B>) {
        if *self == Gate::Relu {
            let y = B::gate_forward(*self, x);
            return (y.clone(), y);
        }
        (B::gate_forward(*self, x.clone()), x)
    }
}

/// A gate (Swish or the GLU, which keep their input) followed by a mask ([`After`]), as a
/// [`DeviceOp`] of the gate's input: the mask applied inside the gate's operation forward, and
/// to the output's gradient inside its backward. A mask tensor is the operation's own, not a
/// parent.
#[derive(Debug)]
struct Then<B: Backend>(Gate, After<B>);

impl<B: DeviceGates> DeviceBackward<B, 1> for Then<B> {
    type Saved = FloatTensor<B>;

    fn backward(&self, x: FloatTensor<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 1] {
        [B::gate_backward_then(self.0, self.1.clone(), x, dy)]
    }
}

impl<B: DeviceGates> DeviceOp<B, 1> for Then<B> {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, FloatTensor<B>) {
        (B::gate_forward_then(self.0, self.1.clone(), x.clone()), x)
    }
}

/// The operation under autodiff: one node with the input as parent.
fn tracked<B: DeviceGates, const D: usize>(
    gate: Gate,
    x: Tensor<Autodiff<B>, D>,
) -> Tensor<Autodiff<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(gate, [float(x)])))
}

/// The operation without autodiff (evaluation).
fn bare<B: DeviceGates, const D: usize>(gate: Gate, x: Tensor<B, D>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::gate_forward(gate, float(x))))
}

/// `gate` of `x` (for the GLU over the last axis, of even length) as one operation where the
/// backend is one of the trainer's CubeCL types (bare or under autodiff) and `x` f32; `None`
/// elsewhere.
pub fn on_device<B: Backend, const D: usize>(gate: Gate, x: &Tensor<B, D>) -> Option<Tensor<B, D>> {
    if !takes(gate, x) {
        return None;
    }
    on_cube_types!(B, T, { cast(tracked::<T, D>(gate, cast(x.clone())?)) }, {
        cast(bare::<T, D>(gate, cast(x.clone())?))
    });
    None
}

/// Whether the operations take `x` for `gate` (the backend aside): f32, and for the GLU a last
/// axis of even length.
fn takes<B: Backend, const D: usize>(gate: Gate, x: &Tensor<B, D>) -> bool {
    D > 0 && x.dtype() == DType::F32 && (gate != Gate::Glu || x.dims()[D - 1].is_multiple_of(2))
}

/// `dropout` of `gate` of `x` (Swish or the GLU) as one operation each way where [`on_device`]
/// takes `x` (in training, the mask applied inside the gate's operation, forward and to the
/// output's gradient backward; the same bits as the two operations); `None` elsewhere and for
/// the ReLU (whose backward keeps the output, before the mask), with no dropout drawn, and
/// the caller runs both. The dropout is drawn where `Dropout::forward` would draw it.
pub fn on_device_dropped<B: Backend, const D: usize>(
    gate: Gate,
    x: &Tensor<B, D>,
    dropout: &Dropout,
) -> Option<Tensor<B, D>> {
    if gate == Gate::Relu || !takes(gate, x) {
        return None;
    }
    on_cube_types!(
        B,
        T,
        {
            let x: Tensor<Autodiff<T>, D> = cast(x.clone())?;
            match dropout.draw::<Autodiff<T>>(&x.device()) {
                Some(rule) => cast(tracked_then::<T, D>(gate, After::Dropout(rule), x)),
                None => cast(tracked::<T, D>(gate, x)),
            }
        },
        // Without autodiff the dropout is the identity (`Dropout::draw`).
        { cast(bare::<T, D>(gate, cast(x.clone())?)) }
    );
    None
}

/// `gate` of `x` (Swish or the GLU) times `mask`, a tensor that is not tracked, broadcast as
/// Burn's product broadcasts (the convolution module's time mask), as one operation each way
/// where [`on_device`] takes `x` and `mask` is f32 of as many axes (the same bits as the gate's
/// operation and Burn's product); `None` elsewhere, for the ReLU and for a tracked mask, and
/// the caller runs both.
pub fn on_device_masked<B: Backend, const D: usize>(
    gate: Gate,
    x: &Tensor<B, D>,
    mask: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    if gate == Gate::Relu || !takes(gate, x) || mask.dtype() != DType::F32 {
        return None;
    }
    on_cube_types!(
        B,
        T,
        {
            let mask: Tensor<Autodiff<T>, D> = cast(mask.clone())?;
            if mask.is_require_grad() {
                return None;
            }
            let x: Tensor<Autodiff<T>, D> = cast(x.clone())?;
            cast(tracked_then::<T, D>(gate, After::Mask(float(mask.inner())), x))
        },
        {
            let (x, mask): (Tensor<T, D>, Tensor<T, D>) = (cast(x.clone())?, cast(mask.clone())?);
            let y = T::gate_forward_then(gate, After::Mask(float(mask)), float(x));
            cast(Tensor::<T, D>::from_primitive(TensorPrimitive::Float(y)))
        }
    );
    None
}

/// [`Then`] under autodiff: one node with the input as parent.
fn tracked_then<B: DeviceGates, const D: usize>(
    gate: Gate,
    after: After<B>,
    x: Tensor<Autodiff<B>, D>,
) -> Tensor<Autodiff<B>, D> {
    let op = Then(gate, after);
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(op, [float(x)])))
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use burn::tensor::activation::{glu, relu, silu};
    use burn::tensor::Distribution;

    /// The operation against Burn's (`silu`, `glu` over the last axis) on the same backend, over
    /// inputs out to where the sigmoid saturates: the outputs and the input's gradient under a
    /// weighted sum of the outputs.
    fn against_burn<B: DeviceGates>(gate: Gate) -> [f32; 2] {
        let device = Default::default();
        B::seed(&device, 3);
        let x = Tensor::<B, 3>::random([3, 29, 66], Distribution::Normal(0.0, 6.0), &device);
        let out_dims = match gate {
            Gate::Swish | Gate::Relu => [3, 29, 66],
            Gate::Glu => [3, 29, 33],
        };
        let weights = Tensor::<B, 3>::random(out_dims, Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let out = match (device_form, gate) {
                (true, _) => tracked::<B, 3>(gate, xa.clone()),
                (false, Gate::Swish) => silu(xa.clone()),
                (false, Gate::Glu) => glu(xa.clone(), 2),
                (false, Gate::Relu) => relu(xa.clone()),
            };
            let grads = (out.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            (out.inner(), xa.grad(&grads).unwrap())
        };
        let (y, dx) = run(true);
        let (y0, dx0) = run(false);
        assert_eq!(
            bare::<B, 3>(gate, x).into_data().into_vec::<f32>().unwrap(),
            y.clone().into_data().into_vec::<f32>().unwrap()
        );
        [difference(y, y0), difference(dx, dx0)]
    }

    /// A gate with its dropout (one operation each way) gives the bits of the gate's operation
    /// followed by the dropout's (`device_dropout`, against the host's mask there): the output
    /// and the input's gradient under a weighted sum, for Swish and the GLU, bare and fused.
    #[test]
    fn a_gate_with_its_dropout_is_the_gate_then_the_dropout_bit_for_bit() {
        fn check<B: DeviceGates>(gate: Gate) {
            type A<B> = Autodiff<B>;
            let device = Default::default();
            B::seed(&device, 5);
            let x = Tensor::<B, 3>::random([3, 29, 66], Distribution::Normal(0.0, 3.0), &device);
            let out_dims = if gate == Gate::Glu { [3, 29, 33] } else { [3, 29, 66] };
            let weights = Tensor::<B, 3>::random(out_dims, Distribution::Normal(0.0, 1.0), &device);
            let rule = Rule::new(77, 0.9);
            let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
            let run = |one_op: bool| {
                let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
                let y = if one_op {
                    tracked_then::<B, 3>(gate, After::Dropout(rule), xa.clone())
                } else {
                    let y = tracked::<B, 3>(gate, xa.clone());
                    super::super::device_dropout::on_device(y, rule).expect("a CubeCL type")
                };
                let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
                (bits(y.inner()), bits(xa.grad(&grads).unwrap()))
            };
            let ((y, dx), (y0, dx0)) = (run(true), run(false));
            assert!(y.contains(&0.0), "{gate:?}: the mask drops elements");
            assert_eq!(y, y0, "{gate:?}: the output");
            assert_eq!(dx, dx0, "{gate:?}: the input's gradient");
        }
        for gate in [Gate::Swish, Gate::Glu] {
            check::<burn::backend::Wgpu>(gate);
            check::<Fusion<burn::backend::Wgpu>>(gate);
        }
    }

    /// A gate times a time mask `[B, T, 1]` (one operation each way) gives the bits of the
    /// gate's operation and Burn's product: the output and the input's gradient under a
    /// weighted sum, for Swish and the GLU, bare, under autodiff and fused.
    #[test]
    fn a_gate_times_a_mask_is_the_gate_then_burn_s_product_bit_for_bit() {
        fn check<B: DeviceGates>(gate: Gate) {
            type A<B> = Autodiff<B>;
            let device = Default::default();
            B::seed(&device, 6);
            let x = Tensor::<B, 3>::random([3, 29, 66], Distribution::Normal(0.0, 3.0), &device);
            let out_dims = if gate == Gate::Glu { [3, 29, 33] } else { [3, 29, 66] };
            let weights = Tensor::<B, 3>::random(out_dims, Distribution::Normal(0.0, 1.0), &device);
            let mask = Tensor::<B, 3>::random([3, 29, 1], Distribution::Bernoulli(0.7), &device);
            let bits = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
            let run = |one_op: bool| {
                let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
                let ma = Tensor::<A<B>, 3>::from_inner(mask.clone());
                let y = if one_op {
                    on_device_masked(gate, &xa, &ma).expect("a CubeCL type")
                } else {
                    tracked::<B, 3>(gate, xa.clone()) * ma
                };
                let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
                (bits(y.inner()), bits(xa.grad(&grads).unwrap()))
            };
            let ((y, dx), (y0, dx0)) = (run(true), run(false));
            assert!(y.contains(&0.0), "{gate:?}: the mask zeroes frames");
            assert_eq!(y, y0, "{gate:?}: the output");
            assert_eq!(dx, dx0, "{gate:?}: the input's gradient");
            let bare = on_device_masked(gate, &x, &mask).expect("bare too");
            assert_eq!(bits(bare), y0, "{gate:?}: bare");
            // A tracked mask is left to the caller.
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone());
            let ma = Tensor::<A<B>, 3>::from_inner(mask.clone()).require_grad();
            assert!(on_device_masked(gate, &xa, &ma).is_none());
        }
        for gate in [Gate::Swish, Gate::Glu] {
            check::<burn::backend::Wgpu>(gate);
            check::<Fusion<burn::backend::Wgpu>>(gate);
        }
    }

    #[test]
    fn match_burn_s_silu_glu_and_relu_and_their_gradients_on_wgpu_with_and_without_fusion() {
        type Fused = Fusion<burn::backend::Wgpu>;
        // The ReLU only moves values: the same bits as Burn's, output and gradient.
        for relu_case in
            [against_burn::<burn::backend::Wgpu>(Gate::Relu), against_burn::<Fused>(Gate::Relu)]
        {
            assert_eq!(relu_case, [0.0, 0.0]);
        }
        let cases = [
            ("wgpu swish", against_burn::<burn::backend::Wgpu>(Gate::Swish)),
            ("wgpu glu", against_burn::<burn::backend::Wgpu>(Gate::Glu)),
            ("fused wgpu swish", against_burn::<Fused>(Gate::Swish)),
            ("fused wgpu glu", against_burn::<Fused>(Gate::Glu)),
        ];
        for (name, d) in &cases {
            eprintln!("{name}: y {:.1e}, dx {:.1e}", d[0], d[1]);
        }
        // Measured (fused or not): Swish 9.3e-8, 6.0e-7; GLU 1.0e-7, 4.4e-7 (the sigmoid and the
        // gradient's arithmetic in another f32 order). Bounds: 5x the larger.
        for (name, d) in cases {
            for (what, v, bound) in [("output", d[0], 5e-7), ("input gradient", d[1], 3e-6)] {
                assert!(v <= bound, "{name}: {what} differs by {v:.2e} (bound {bound:.1e})");
            }
        }
    }
}
