//! The convolution module's depthwise 1-D convolution (`conv::DepthwiseConv1d`: odd kernel `K`,
//! stride 1, `same` padding, channels last) as one operation on the CubeCL backends (wgpu,
//! CUDA; fused or not).
//!
//! Its tensor form sums `K` shifted views of a zero-padded copy, each times one row of the
//! weight: at `K = 9` about forty operations forward, and backward a product, a reduction and a
//! zero-filled copy per tap for the views and the weight's rows. On lavapipe that was the
//! largest share of a Conformer layer's launches after the optimizer (bench/RESULTS.md, "A GPU
//! step's launches cut"), and a GPU step is bound by the host's cost per operation. Here it is
//! one kernel forward, and one backward up to 4,096 rows (frames of all utterances): cubes of
//! two kinds side by side, a unit per element of the input's gradient, and a cube per tap and
//! 8 channels whose lanes split the rows for the weight's and bias's gradients
//! (`depthwise_backward_lanes`, as `device_sum`'s `sum_lanes`). More rows take three launches:
//! the input's gradient, partial sums over blocks of rows, and `device_sum`'s sum over the
//! blocks.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the tensor form.
//! Under fusion the operation runs through `asr_tdt::fusion::in_stream` (queued in fusion's
//! stream by default).
//!
//! Invariants: `y[b, t, c] = bias[c] + sum_j w[j, c] x[b, t + j - K/2, c]`, frames outside
//! `0..T` read as zero (the tensor form's padding); the weight is `[K, C]`. The backward keeps
//! the input and the weight (shared, not copied).

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
use super::device_sum::{in_lanes, lanes_sum_to, LANE_COLS};
use super::host_depthwise::{cast, float};

/// Rows (frames of all utterances) per partial sum of the weight's and bias's gradients.
const ROWS: usize = 32;

/// One unit per element of `y` `[B, T, C]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn depthwise_forward(
    x: &Array<f32>,
    weight: &Array<f32>,
    bias: &Array<f32>,
    y: &mut Array<f32>,
    frames: u32,
    channels: u32,
    taps: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let c = pos % channels;
        let row = pos / channels;
        let t = row % frames;
        let first = row - t;
        let half = taps / 2;
        let mut acc = bias[c as usize];
        for j in 0..taps {
            // Input frame `t + j - half`, in range when `half <= t + j < frames + half`.
            let s = t + j;
            if s >= half && s < frames + half {
                let at = ((first + s - half) * channels + c) as usize;
                acc += x[at] * weight[(j * channels + c) as usize];
            }
        }
        y[pos as usize] = acc;
    }
}

/// Element `pos` of the input's gradient `dx` `[B, T, C]`,
/// `dx[b, s, c] = sum_j w[j, c] dy[b, s - j + K/2, c]`: the body of both kernels that write it,
/// so they give the same bits.
#[cube]
#[allow(clippy::too_many_arguments)]
fn input_unit(
    dy: &Array<f32>,
    weight: &Array<f32>,
    dx: &mut Array<f32>,
    pos: u32,
    frames: u32,
    channels: u32,
    taps: u32,
) {
    let c = pos % channels;
    let row = pos / channels;
    let s = row % frames;
    let first = row - s;
    let half = taps / 2;
    let mut acc = 0.0f32;
    for j in 0..taps {
        // Output frame `s + half - j`, in range when `j <= s + half < frames + j`.
        let u = s + half;
        if u >= j && u < frames + j {
            let at = ((first + u - j) * channels + c) as usize;
            acc += dy[at] * weight[(j * channels + c) as usize];
        }
    }
    dx[pos as usize] = acc;
}

/// One unit per element of `dx` `[B, T, C]` ([`input_unit`]). Used past
/// `device_sum::in_lanes`' rows, where the parameters' gradients are summed by blocks of rows
/// ([`depthwise_backward_params`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn depthwise_backward_input(
    dy: &Array<f32>,
    weight: &Array<f32>,
    dx: &mut Array<f32>,
    frames: u32,
    channels: u32,
    taps: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        input_unit(dy, weight, dx, pos, frames, channels, taps);
    }
}

/// Row `row`'s term of parameter `j`'s gradient at channel `c`: `dy` for the bias (`j = K`),
/// else `dy` times the input `j - K/2` frames away, zero where that frame is outside the
/// utterance (the tap form's padding).
#[cube]
#[allow(clippy::too_many_arguments)]
fn param_term(
    x: &Array<f32>,
    dy: &Array<f32>,
    row: u32,
    frames: u32,
    channels: u32,
    c: u32,
    j: u32,
    taps: u32,
) -> f32 {
    let g = dy[(row * channels + c) as usize];
    let mut term = g;
    if j != taps {
        term = 0.0f32;
        let half = taps / 2;
        let t = row % frames;
        let s = t + j;
        if s >= half && s < frames + half {
            term = g * x[((row - t + s - half) * channels + c) as usize];
        }
    }
    term
}

/// One unit per `(tap or bias, block, channel)`: the weight's gradient of tap `j < K` (`dy`
/// times the input `j - K/2` frames away) or, at `j = K`, the bias's (`dy`), summed over the
/// block's rows, to `parts[j, block, channel]` of `[K + 1, blocks, C]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn depthwise_backward_params(
    x: &Array<f32>,
    dy: &Array<f32>,
    parts: &mut Array<f32>,
    rows: u32,
    frames: u32,
    channels: u32,
    taps: u32,
    blocks: u32,
    block_rows: u32,
) {
    let pos = unit_index();
    if pos < (taps + 1) * blocks * channels {
        let c = pos % channels;
        let block = (pos / channels) % blocks;
        let j = pos / (channels * blocks);
        let begin = block * block_rows;
        let end = u32::min(begin + block_rows, rows);
        let mut acc = 0.0f32;
        for row in begin..end {
            acc += param_term(x, dy, row, frames, channels, c, j, taps);
        }
        parts[pos as usize] = acc;
    }
}

/// The whole backward in one launch, two kinds of cube side by side (they read the same inputs
/// and write different outputs, so none waits for another): the first `input_cubes` a unit per
/// element of the input's gradient ([`input_unit`]); then one cube per `(tap or bias, block of
/// LANE_COLS channels)`, each unit summing, over every `lanes`-th row, the weight's gradient
/// term of tap `j < K` (`dy` times the input `j - K/2` frames away) or, at `j = K`, the bias's
/// (`dy`), the cube adding its lanes ([`lanes_sum_to`]) and writing `sums[j, channel]` of
/// `[K + 1, C]`. Every unit of a parameters' cube reaches every barrier. Used up to
/// `device_sum::in_lanes`' rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn depthwise_backward_lanes(
    x: &Array<f32>,
    dy: &Array<f32>,
    weight: &Array<f32>,
    dx: &mut Array<f32>,
    sums: &mut Array<f32>,
    rows: u32,
    frames: u32,
    channels: u32,
    taps: u32,
    blocks: u32,
    input_cubes: u32,
) {
    let cube = cube_index();
    // Which kind a cube is depends on its index only: the barriers stay uniform in each cube.
    if cube < input_cubes {
        let pos = cube * CUBE_DIM + UNIT_POS;
        if pos < rows * channels {
            input_unit(dy, weight, dx, pos, frames, channels, taps);
        }
    } else {
        let cube = cube - input_cubes;
        let j = cube / blocks;
        let c = (cube % blocks) * LANE_COLS + UNIT_POS % LANE_COLS;
        let lane = UNIT_POS / LANE_COLS;
        let inside = j <= taps && c < channels;
        let mut acc = 0.0f32;
        if inside {
            for row in range_stepped(lane, rows, CUBE_DIM / LANE_COLS) {
                acc += param_term(x, dy, row, frames, channels, c, j, taps);
            }
        }
        lanes_sum_to(sums, j * channels + c, inside, acc);
    }
}

/// What the forward keeps for the backward: the input and the weight.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    pub(crate) x: FloatTensor<B>,
    pub(crate) weight: FloatTensor<B>,
}

/// The convolution as one operation (see the module): the backends that have it.
pub trait DeviceDepthwise: Backend {
    /// The convolution of `x` `[B, T, C]` with `weight` `[K, C]` and `bias` `[C]`, and what the
    /// backward needs.
    fn depthwise_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>);

    /// The gradients of `x`, the weight and the bias from the output's gradient `dy`.
    fn depthwise_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl<R, F, I, BT> DeviceDepthwise for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn depthwise_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let [b, t, c] = x.shape().dims::<3>();
        let k = weight.shape().dims::<2>()[0];
        let (x, weight, bias) = (contiguous(x), contiguous(weight), contiguous(bias));
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, vec![b, t, c]);
        let units = b * t * c;
        // Every index the kernel reads is within `[B, T, C]`, `[K, C]` and `[C]` for the units it
        // runs (the others return at once); the checked launch bounds every access anyway.
        depthwise_forward::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.clone().into_array_arg(),
            weight.clone().into_array_arg(),
            bias.into_array_arg(),
            y.clone().into_array_arg(),
            t as u32,
            c as u32,
            k as u32,
            units as u32,
        );
        (y, Saved { x, weight })
    }

    fn depthwise_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let Saved { x, weight } = saved;
        // Under fusion the saved tensors are the operation's own inputs again: on
        // CUDA a tensor Burn made may have pitched rows (a weight of [9, 96] in rows of 128), and
        // the kernels index densely. A dense tensor passes through without a copy.
        let (x, weight) = (contiguous(x), contiguous(weight));
        let [b, t, c] = x.shape().dims::<3>();
        let k = weight.shape().dims::<2>()[0];
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let device = dy.device.clone();
        let dx = empty::<R>(&client, &device, vec![b, t, c]);
        let units = b * t * c;
        let rows = b * t;
        if rows > 0 && in_lanes(rows) {
            // One launch, not two (the input's gradient, then the parameters' sums; before that
            // three, with the partial sums' sum): 24 of the step's launches at 24 layers. On
            // lavapipe it takes about 15 % longer than the two did (bench/RESULTS.md,
            // 2026-12-07, "The backward's independent kernels").
            let blocks = c.div_ceil(LANE_COLS as usize);
            let input_cubes = units.div_ceil(CUBE as usize);
            let sums = empty::<R>(&client, &device, vec![k + 1, c]);
            depthwise_backward_lanes::launch::<R>(
                &client,
                cubes(input_cubes + (k + 1) * blocks),
                CubeDim::new_1d(CUBE),
                x.into_array_arg(),
                dy.into_array_arg(),
                weight.into_array_arg(),
                dx.clone().into_array_arg(),
                sums.clone().into_array_arg(),
                rows as u32,
                t as u32,
                c as u32,
                k as u32,
                blocks as u32,
                input_cubes as u32,
            );
            let (dw, db) = device_op::weight_and_bias::<Self>(sums, k, c);
            return (dx, dw, db);
        }
        depthwise_backward_input::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            dy.clone().into_array_arg(),
            weight.into_array_arg(),
            dx.clone().into_array_arg(),
            t as u32,
            c as u32,
            k as u32,
            units as u32,
        );
        let blocks = rows.div_ceil(ROWS).max(1);
        let parts = empty::<R>(&client, &device, vec![k + 1, blocks, c]);
        // Every unit writes its partial sum (zero for an empty block, only when there are no
        // rows).
        depthwise_backward_params::launch::<R>(
            &client,
            grid((k + 1) * blocks * c),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            dy.into_array_arg(),
            parts.clone().into_array_arg(),
            rows as u32,
            t as u32,
            c as u32,
            k as u32,
            blocks as u32,
            ROWS as u32,
        );
        let (dw, db) = device_op::weight_and_bias_sums::<Self>(parts, k, c);
        (dx, dw, db)
    }
}

impl<B> DeviceDepthwise for Fusion<B>
where
    B: FusionBackend + DeviceDepthwise,
{
    fn depthwise_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let out = (x.shape.to_vec(), DType::F32);
        let [y] = in_stream::<B, _, 3, 1>(
            "depthwise_forward",
            [x.clone(), weight.clone(), bias],
            [out],
            |[x, weight, bias]| [B::depthwise_forward(x, weight, bias).0],
        );
        (y, Saved { x, weight })
    }

    fn depthwise_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let channels = saved.weight.shape.to_vec().last().copied().unwrap_or(1);
        let outs = [
            (saved.x.shape.to_vec(), DType::F32),
            (saved.weight.shape.to_vec(), DType::F32),
            (vec![channels], DType::F32),
        ];
        let Saved { x, weight } = saved;
        let [dx, dw, db] = in_stream::<B, _, 3, 3>(
            "depthwise_backward",
            [x, weight, dy],
            outs,
            |[x, weight, dy]| {
                let (dx, dw, db) = B::depthwise_backward(Saved { x, weight }, dy);
                [dx, dw, db]
            },
        );
        (dx, dw, db)
    }
}

/// The convolution as a [`DeviceOp`] of the input, the weight and the bias.
#[derive(Debug, Clone, Copy)]
struct Depthwise;

impl<B: DeviceDepthwise> DeviceBackward<B, 3> for Depthwise {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        let (dx, dw, db) = B::depthwise_backward(saved, dy);
        [dx, dw, db]
    }
}

impl<B: DeviceDepthwise> DeviceOp<B, 3> for Depthwise {
    fn forward(&self, [x, weight, bias]: [FloatTensor<B>; 3]) -> (FloatTensor<B>, Saved<B>) {
        B::depthwise_forward(x, weight, bias)
    }
}

/// The convolution under autodiff: one node with the input, the weight and the bias as parents.
fn tracked<B: DeviceDepthwise>(
    x: Tensor<Autodiff<B>, 3>,
    weight: Tensor<Autodiff<B>, 2>,
    bias: Tensor<Autodiff<B>, 1>,
) -> Tensor<Autodiff<B>, 3> {
    let y = device_op::tracked(Depthwise, [float(x), float(weight), float(bias)]);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The convolution without autodiff (evaluation).
fn bare<B: DeviceDepthwise>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
) -> Tensor<B, 3> {
    let (y, _) = B::depthwise_forward(float(x), float(weight), float(bias));
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The depthwise convolution of `x` `[B, T, C]` with `weight` `[K, C]` (odd `K`) and `bias`
/// `[C]` (see the module), as one operation where the backend is one of the trainer's CubeCL
/// types (bare or under autodiff) and the tensors f32; `None` elsewhere.
pub fn on_device<B: Backend>(
    x: &Tensor<B, 3>,
    weight: &Tensor<B, 2>,
    bias: &Tensor<B, 1>,
) -> Option<Tensor<B, 3>> {
    let [k, c] = weight.dims();
    if k % 2 == 0
        || x.dims()[2] != c
        || bias.dims()[0] != c
        || [x.dtype(), weight.dtype(), bias.dtype()].iter().any(|d| *d != DType::F32)
    {
        return None;
    }
    on_cube_types!(
        B,
        T,
        { cast(tracked::<T>(cast(x.clone())?, cast(weight.clone())?, cast(bias.clone())?)) },
        { cast(bare::<T>(cast(x.clone())?, cast(weight.clone())?, cast(bias.clone())?)) }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::conv::DepthwiseConv1d;
    use crate::model::device_op::relative_difference as difference;
    use burn::tensor::Distribution;

    /// The operation against the tensor form (`DepthwiseConv1d::taps`) on the same backend, with
    /// utterances shorter than the kernel and more rows than one block of the partial sums: the
    /// outputs, and the gradients of the input, the weight and the bias under a weighted sum of
    /// the outputs.
    fn against_the_tensor_form<B: DeviceDepthwise>(frames: usize, taps: usize) -> [f32; 4] {
        let device = Default::default();
        B::seed(&device, 5);
        let (b, c) = (3, 40);
        let x = Tensor::<B, 3>::random([b, frames, c], Distribution::Normal(0.0, 1.0), &device);
        let weights =
            Tensor::<B, 3>::random([b, frames, c], Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let conv = DepthwiseConv1d::<A<B>>::new(c, taps, &device);
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let (w, bias) = (conv.weight.val(), conv.bias.val());
            let out = if device_form {
                tracked::<B>(xa.clone(), w.clone(), bias.clone())
            } else {
                conv.taps(xa.clone())
            };
            let loss = (out.clone() * Tensor::from_inner(weights.clone())).sum();
            let grads = loss.backward();
            let (dw, db) = (w.grad(&grads).unwrap(), bias.grad(&grads).unwrap());
            (out.inner(), xa.grad(&grads).unwrap(), dw, db)
        };
        let (y, dx, dw, db) = run(true);
        let (y0, dx0, dw0, db0) = run(false);
        let bare_y = bare::<B>(x, conv.weight.val().inner(), conv.bias.val().inner());
        assert_eq!(
            bare_y.into_data().into_vec::<f32>().unwrap(),
            y.clone().into_data().into_vec::<f32>().unwrap()
        );
        [difference(y, y0), difference(dx, dx0), difference(dw, dw0), difference(db, db0)]
    }

    #[test]
    fn matches_the_tensor_form_and_its_gradients_on_wgpu_with_and_without_fusion() {
        let cases = [
            ("wgpu, 50 frames, 9 taps", against_the_tensor_form::<burn::backend::Wgpu>(50, 9)),
            ("wgpu, 4 frames, 9 taps", against_the_tensor_form::<burn::backend::Wgpu>(4, 9)),
            ("wgpu, 50 frames, 1 tap", against_the_tensor_form::<burn::backend::Wgpu>(50, 1)),
            // 4,200 rows: the partial sums over blocks, beyond one launch of lanes.
            ("wgpu, 1400 frames, 9 taps", against_the_tensor_form::<burn::backend::Wgpu>(1400, 9)),
            (
                "fused wgpu, 50 frames, 9 taps",
                against_the_tensor_form::<Fusion<burn::backend::Wgpu>>(50, 9),
            ),
        ];
        for (name, d) in &cases {
            eprintln!("{name}: y {:.1e}, dx {:.1e}, dw {:.1e}, db {:.1e}", d[0], d[1], d[2], d[3]);
        }
        // Measured (the lanes' sums, up to 4,096 rows): at 50 frames and 9 taps 1.3e-7, 1.6e-7,
        // 3.3e-7, 2.1e-7 (fused 9.4e-8, 1.2e-7, 1.7e-7, 1.9e-7); at 4 frames 8.1e-8, 9.2e-8,
        // 7.5e-8, 5.4e-8; at 1 tap 0, 0, 2.0e-7, 2.1e-7 (f32 sums in another order). Bounds:
        // at most 5x the largest. At 4,200 rows (the blocks' partial sums) the parameters'
        // gradients 1.1e-6 and 1.2e-6, a sum 28 times as long: their bounds 5x those.
        for (name, d) in cases {
            let long = name.contains("1400");
            for (what, v, bound) in [
                ("output", d[0], 6.5e-7),
                ("input gradient", d[1], 8e-7),
                ("weight gradient", d[2], if long { 5.5e-6 } else { 1.1e-6 }),
                ("bias gradient", d[3], if long { 6e-6 } else { 9e-7 }),
            ] {
                assert!(v <= bound, "{name}: {what} differs by {v:.2e} (bound {bound:.1e})");
            }
        }
    }
}
