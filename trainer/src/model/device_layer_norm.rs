//! Layer normalisation over the last dimension as one operation on the CubeCL backends (wgpu,
//! CUDA; fused or not).
//!
//! Burn 0.21's `layer_norm` is nine tensor operations forward (two means, a subtraction, two
//! products, a square root, a division, then the scale and shift), and under autodiff about
//! twice as many backward, three of them reductions. The Conformer block runs five, so at the
//! 0.6B preset's 24 layers they are thousands of a step's operations, and a GPU step is bound
//! by the host's cost per operation (bench/RESULTS.md, "Where a GPU step's launches come
//! from"). Here the forward is one kernel, and so is the backward: two kinds of cube side by
//! side in one launch, a cube per row for the input's gradient and a cube per 8 columns whose
//! lanes split the rows for the scale's and shift's gradients (up to 4,096 rows; beyond, three
//! launches: the input's gradient, partial sums over blocks of rows, then `device_sum`'s sum
//! of them).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors and a shift; `None` elsewhere, and the caller runs Burn's
//! form. Under fusion the operation runs through `asr_tdt::fusion::in_stream`: queued in
//! fusion's stream by default, its inputs resolved on the calling thread with
//! `ASRT_FUSION_QUEUE=0`.
//!
//! Invariants: Burn's formula, `(x - mean) / sqrt(var + eps) * gamma + beta` with the biased
//! variance, computed in two passes (the mean, then the squared deviations from it); one cube
//! per row forward and for the input's gradient; the forward keeps each row's mean and
//! reciprocal deviation for the backward, which reads the input again rather than keeping the
//! normalised values (one tensor of the input's size less held per normalisation).

use asr_tdt::fusion::in_stream;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_dropout::mask_factor;
use super::device_op::{
    self, contiguous, cube_index, cube_sum, cubes, empty, grid, on_cube_types, unit_index,
    DeviceBackward, DeviceOp, CUBE,
};
use super::device_sum::{in_lanes, lanes_sum_to, LANE_COLS};
use super::dropout::Rule;
use super::handoff::Handoff;
use super::host_depthwise::{cast, float};

/// Rows per partial sum of the scale's and shift's gradients: each unit of that kernel sums one
/// column over this many rows, so a wide batch still has many units.
const ROWS: usize = 32;

/// `[rows, width]` of a tensor of shape `dims` normalised over its last axis (no rows where it
/// has no elements).
pub(crate) fn rows_and_width(dims: &[usize]) -> (usize, usize) {
    let width = dims.last().copied().unwrap_or(1);
    (dims.iter().product::<usize>() / width.max(1), width)
}

/// One cube per row of `x` `[rows, width]`: `y = (x - mean) * rstd * gamma + beta`, and the
/// row's `mean` and `rstd` in `stats[2 row]` and `stats[2 row + 1]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_forward(
    x: &Array<f32>,
    gamma: &Array<f32>,
    beta: &Array<f32>,
    y: &mut Array<f32>,
    stats: &mut Array<f32>,
    width: u32,
    rows: u32,
    eps: f32,
) {
    let row = cube_index();
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    // The condition is the same for every unit of a cube: the barriers in the sums are uniform.
    if row < rows {
        let mut part = 0.0f32;
        for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
            part += x[(row * width + c) as usize];
        }
        normalise_row(x, gamma, beta, y, stats, &mut shared, part, row, width, eps);
    }
}

/// Row `row` of `x` `[rows, width]` normalised to `y`, and its mean and reciprocal deviation to
/// `stats`, by the cube, each unit reading the columns `UNIT_POS, UNIT_POS + CUBE_DIM, ...`
/// (those it wrote where `x` is a kernel's own output) with `part` its sum of them: the
/// layer normalisation's forward in every kernel that has one, so they give the same bits.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn normalise_row(
    x: &Array<f32>,
    gamma: &Array<f32>,
    beta: &Array<f32>,
    y: &mut Array<f32>,
    stats: &mut Array<f32>,
    shared: &mut SharedMemory<f32>,
    part: f32,
    row: u32,
    width: u32,
    eps: f32,
) {
    let base = (row * width) as usize;
    let mean = cube_sum(shared, part) / f32::cast_from(width);
    let mut dev = 0.0f32;
    for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
        let d = x[base + c as usize] - mean;
        dev += d * d;
    }
    let var = cube_sum(shared, dev) / f32::cast_from(width);
    let rstd = 1.0 / f32::sqrt(var + eps);
    for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
        let at = base + c as usize;
        y[at] = (x[at] - mean) * rstd * gamma[c as usize] + beta[c as usize];
    }
    if UNIT_POS == 0 {
        stats[(2 * row) as usize] = mean;
        stats[(2 * row + 1) as usize] = rstd;
    }
}

/// One cube per row of `x` `[rows, width]`: the residual after a linear layer,
/// `r = x + (p + b[column]) * m` (`m` `device_dropout::mask_factor`; the bits of
/// `bias_residual_apply`), to `r`, then `r`'s layer normalisation ([`normalise_row`]) to `y`
/// and `stats`: the residual's kernel and the next normalisation's forward in one launch.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn bias_residual_norm(
    x: &Array<f32>,
    p: &Array<f32>,
    b: &Array<f32>,
    gamma: &Array<f32>,
    beta: &Array<f32>,
    r: &mut Array<f32>,
    y: &mut Array<f32>,
    stats: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    width: u32,
    rows: u32,
    eps: f32,
) {
    let row = cube_index();
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    if row < rows {
        let mut part = 0.0f32;
        for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
            let pos = row * width + c;
            let i = pos as usize;
            let f = p[i] + b[c as usize];
            let v = x[i] + f * mask_factor(pos, k0, k1, threshold, scale);
            r[i] = v;
            part += v;
        }
        normalise_row(r, gamma, beta, y, stats, &mut shared, part, row, width, eps);
    }
}

/// Row `row`'s input gradient, `rstd * (g - mean(g) - xhat * mean(g * xhat))` with
/// `g = dy * gamma` and `xhat = (x - mean) * rstd`, plus `addend` where `add` (another
/// gradient of the input, handed over: `handoff`), by the cube: the body of both backward
/// kernels that write the input's gradient, so they give the same bits. Every unit of the cube
/// must call it (it waits at barriers).
#[cube]
#[allow(clippy::too_many_arguments)]
fn input_row(
    x: &Array<f32>,
    gamma: &Array<f32>,
    stats: &Array<f32>,
    dy: &Array<f32>,
    addend: &Array<f32>,
    dx: &mut Array<f32>,
    row: u32,
    width: u32,
    #[comptime] add: bool,
) {
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    let base = (row * width) as usize;
    let mean = stats[(2 * row) as usize];
    let rstd = stats[(2 * row + 1) as usize];
    let mut part_g = 0.0f32;
    let mut part_gx = 0.0f32;
    for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
        let at = base + c as usize;
        let g = dy[at] * gamma[c as usize];
        part_g += g;
        part_gx += g * (x[at] - mean) * rstd;
    }
    let n = f32::cast_from(width);
    let mean_g = cube_sum(&mut shared, part_g) / n;
    let mean_gx = cube_sum(&mut shared, part_gx) / n;
    for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
        let at = base + c as usize;
        let g = dy[at] * gamma[c as usize];
        let xhat = (x[at] - mean) * rstd;
        let v = rstd * (g - mean_g - xhat * mean_gx);
        if add {
            dx[at] = v + addend[at];
        } else {
            dx[at] = v;
        }
    }
}

/// One cube per row: the input's gradient ([`input_row`]). Used past `device_sum::in_lanes`'
/// rows, where the scale's and shift's gradients are summed by blocks of rows
/// ([`layer_norm_backward_params`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_input(
    x: &Array<f32>,
    gamma: &Array<f32>,
    stats: &Array<f32>,
    dy: &Array<f32>,
    addend: &Array<f32>,
    dx: &mut Array<f32>,
    width: u32,
    rows: u32,
    #[comptime] add: bool,
) {
    let row = cube_index();
    // The condition is the same for every unit of a cube: the barriers in the sums are uniform.
    if row < rows {
        input_row(x, gamma, stats, dy, addend, dx, row, width, add);
    }
}

/// The whole backward in one launch, the two kinds of cube side by side (they read the same
/// inputs and write different outputs, so none waits for another): cubes `0..rows` the input's
/// gradient of their row ([`input_row`]); the next `ceil(width / LANE_COLS)` the scale's and
/// shift's gradients of `LANE_COLS` columns, each unit summing every `lanes`-th row, then the
/// cube adding its lanes ([`lanes_sum_to`]) and writing `sums[0, column]` (`sum dy * xhat`) and
/// `sums[1, column]` (`sum dy`) of `[2, width]`. Used up to `device_sum::in_lanes`' rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_lanes(
    x: &Array<f32>,
    gamma: &Array<f32>,
    stats: &Array<f32>,
    dy: &Array<f32>,
    addend: &Array<f32>,
    dx: &mut Array<f32>,
    sums: &mut Array<f32>,
    width: u32,
    rows: u32,
    #[comptime] add: bool,
) {
    let cube = cube_index();
    // Which kind a cube is depends on its index only: the barriers stay uniform in each cube.
    if cube < rows {
        input_row(x, gamma, stats, dy, addend, dx, cube, width, add);
    } else {
        let lane = UNIT_POS / LANE_COLS;
        let c = (cube - rows) * LANE_COLS + UNIT_POS % LANE_COLS;
        let inside = c < width;
        let mut d_gamma = 0.0f32;
        let mut d_beta = 0.0f32;
        if inside {
            for r in range_stepped(lane, rows, CUBE_DIM / LANE_COLS) {
                let at = (r * width + c) as usize;
                let xhat = (x[at] - stats[(2 * r) as usize]) * stats[(2 * r + 1) as usize];
                d_gamma += dy[at] * xhat;
                d_beta += dy[at];
            }
        }
        lanes_sum_to(sums, c, inside, d_gamma);
        lanes_sum_to(sums, width + c, inside, d_beta);
    }
}

/// One unit per `(block, column)`: the scale's and shift's gradients summed over the block's
/// `ROWS` rows, to `parts[0, block, column]` (`dy * xhat`) and `parts[1, block, column]` (`dy`),
/// `parts` being `[2, blocks, width]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_params(
    x: &Array<f32>,
    stats: &Array<f32>,
    dy: &Array<f32>,
    parts: &mut Array<f32>,
    width: u32,
    rows: u32,
    blocks: u32,
    block_rows: u32,
) {
    let pos = unit_index();
    if pos < blocks * width {
        let block = pos / width;
        let c = pos % width;
        let first = block * block_rows;
        let end = u32::min(first + block_rows, rows);
        let mut d_gamma = 0.0f32;
        let mut d_beta = 0.0f32;
        for r in first..end {
            let at = (r * width + c) as usize;
            let xhat = (x[at] - stats[(2 * r) as usize]) * stats[(2 * r + 1) as usize];
            d_gamma += dy[at] * xhat;
            d_beta += dy[at];
        }
        parts[pos as usize] = d_gamma;
        parts[(blocks * width + pos) as usize] = d_beta;
    }
}

/// What the forward keeps for the backward: the input, the scale, and each row's mean and
/// reciprocal deviation `[rows, 2]`.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    pub(crate) x: FloatTensor<B>,
    pub(crate) gamma: FloatTensor<B>,
    pub(crate) stats: FloatTensor<B>,
}

/// The normalisation as one operation (see the module): the backends that have it.
pub trait DeviceLayerNorm: Backend {
    /// The normalised, scaled and shifted `x` (any rank, normalised over its last axis of
    /// `gamma`'s and `beta`'s length), and what the backward needs.
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, Saved<Self>);

    /// The residual after a linear layer, `r = x + (p + b)` times `rule`'s mask (`x` and `p`
    /// `[.., width]`, `b` `[width]`), then `r` normalised: `[r, y, stats]`, `stats` what
    /// [`Saved`] keeps. One kernel ([`bias_residual_norm`]); under fusion one operation.
    #[allow(clippy::too_many_arguments)]
    fn bias_residual_norm(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> [FloatTensor<Self>; 3];

    /// The gradients of `x`, `gamma` and `beta` from the output's gradient `dy`, `addend`
    /// (another gradient of `x`, `handoff`'s) added to `x`'s as it is written.
    fn layer_norm_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl<R, F, I, BT> DeviceLayerNorm for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let dims = x.shape().to_vec();
        let (rows, width) = rows_and_width(&dims);
        let x = contiguous(x);
        let gamma = contiguous(gamma);
        let beta = contiguous(beta);
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let stats = empty::<R>(&client, &x.device, vec![rows, 2]);
        // The kernel reads and writes within row `row < rows` of `[rows, width]` and of
        // `stats`, and column `c < width` of `gamma` and `beta`; the checked launch bounds every
        // access anyway.
        layer_norm_forward::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            x.clone().into_array_arg(),
            gamma.clone().into_array_arg(),
            beta.into_array_arg(),
            y.clone().into_array_arg(),
            stats.clone().into_array_arg(),
            width as u32,
            rows as u32,
            eps as f32,
        );
        (y, Saved { x, gamma, stats })
    }

    fn bias_residual_norm(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> [FloatTensor<Self>; 3] {
        let dims = x.shape().to_vec();
        let (rows, width) = rows_and_width(&dims);
        let (x, p, b) = (contiguous(x), contiguous(p), contiguous(b));
        let (gamma, beta) = (contiguous(gamma), contiguous(beta));
        let client = x.client.clone();
        let device = x.device.clone();
        let r = empty::<R>(&client, &device, dims.clone());
        let y = empty::<R>(&client, &device, dims);
        let stats = empty::<R>(&client, &device, vec![rows, 2]);
        let (k0, k1, threshold, scale) = rule.kernel_args();
        // Each cube reads and writes its own row; the checked launch bounds every access.
        bias_residual_norm::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            p.into_array_arg(),
            b.into_array_arg(),
            gamma.into_array_arg(),
            beta.into_array_arg(),
            r.clone().into_array_arg(),
            y.clone().into_array_arg(),
            stats.clone().into_array_arg(),
            k0,
            k1,
            threshold,
            scale,
            width as u32,
            rows as u32,
            eps as f32,
        );
        [r, y, stats]
    }

    fn layer_norm_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let Saved { x, gamma, stats } = saved;
        // Under fusion the saved tensors are the operation's own inputs again: on
        // CUDA a tensor Burn made may have pitched rows (a row of 96 f32 in 128), and
        // the kernels index densely. A dense tensor passes through without a copy.
        let (x, gamma, stats) = (contiguous(x), contiguous(gamma), contiguous(stats));
        let dims = x.shape().to_vec();
        let (rows, width) = rows_and_width(&dims);
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let device = dy.device.clone();
        let dx = empty::<R>(&client, &device, dims);
        let add = addend.is_some();
        // Without an addend the kernel reads none: the input stands in for it.
        let addend = addend.map(contiguous).unwrap_or_else(|| x.clone());
        if in_lanes(rows) {
            // One launch, not two (the input's gradient, then the scale's and shift's sums):
            // five normalisations a Conformer block, 120 of the 0.6B step's launches at 24
            // layers. On lavapipe it takes 14-18 % longer than the two did (not verified why:
            // llvmpipe may run both kinds' code masked; bench/RESULTS.md, 2026-12-07, "The
            // backward's independent kernels"); on CUDA the branch is uniform per block.
            let sums = empty::<R>(&client, &device, vec![2, width]);
            layer_norm_backward_lanes::launch::<R>(
                &client,
                cubes(rows + width.div_ceil(LANE_COLS as usize)),
                CubeDim::new_1d(CUBE),
                x.into_array_arg(),
                gamma.into_array_arg(),
                stats.into_array_arg(),
                dy.into_array_arg(),
                addend.into_array_arg(),
                dx.clone().into_array_arg(),
                sums.clone().into_array_arg(),
                width as u32,
                rows as u32,
                add,
            );
            let (d_gamma, d_beta) = device_op::weight_and_bias::<Self>(sums, 1, width);
            return (dx, Self::float_reshape(d_gamma, [width].into()), d_beta);
        }
        layer_norm_backward_input::launch::<R>(
            &client,
            cubes(rows),
            CubeDim::new_1d(CUBE),
            x.clone().into_array_arg(),
            gamma.into_array_arg(),
            stats.clone().into_array_arg(),
            dy.clone().into_array_arg(),
            addend.into_array_arg(),
            dx.clone().into_array_arg(),
            width as u32,
            rows as u32,
            add,
        );
        let blocks = rows.div_ceil(ROWS).max(1);
        let parts = empty::<R>(&client, &device, vec![2, blocks, width]);
        // Every `(block, column)` unit writes both of its partial sums (an empty block, only
        // when there are no rows, writes zeros).
        layer_norm_backward_params::launch::<R>(
            &client,
            grid(blocks * width),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            stats.into_array_arg(),
            dy.into_array_arg(),
            parts.clone().into_array_arg(),
            width as u32,
            rows as u32,
            blocks as u32,
            ROWS as u32,
        );
        // The scale's partial sums are a one-tap "weight", the shift's its "bias".
        let (d_gamma, d_beta) = device_op::weight_and_bias_sums::<Self>(parts, 1, width);
        (dx, Self::float_reshape(d_gamma, [width].into()), d_beta)
    }
}

impl<B> DeviceLayerNorm for Fusion<B>
where
    B: FusionBackend + DeviceLayerNorm,
{
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, Saved<Self>) {
        let dims = x.shape.to_vec();
        let (rows, _) = rows_and_width(&dims);
        let outs = [(dims, DType::F32), (vec![rows, 2], DType::F32)];
        let [y, stats] = in_stream::<B, _, 3, 2>(
            "layer_norm_forward",
            [x.clone(), gamma.clone(), beta],
            outs,
            move |[x, gamma, beta]| {
                let (y, saved) = B::layer_norm_forward(x, gamma, beta, eps);
                [y, saved.stats]
            },
        );
        (y, Saved { x, gamma, stats })
    }

    fn bias_residual_norm(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> [FloatTensor<Self>; 3] {
        let dims = x.shape.to_vec();
        let (rows, _) = rows_and_width(&dims);
        let outs = [(dims.clone(), DType::F32), (dims, DType::F32), (vec![rows, 2], DType::F32)];
        in_stream::<B, _, 5, 3>(
            "bias_residual_norm",
            [x, p, b, gamma, beta],
            outs,
            move |[x, p, b, gamma, beta]| B::bias_residual_norm(rule, x, p, b, gamma, beta, eps),
        )
    }

    fn layer_norm_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        addend: Option<FloatTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let dims = saved.x.shape.to_vec();
        let width = dims.last().copied().unwrap_or(1);
        let outs = [(dims, DType::F32), (vec![width], DType::F32), (vec![width], DType::F32)];
        let Saved { x, gamma, stats } = saved;
        let run = |x, gamma, stats, dy, addend| {
            let (dx, d_gamma, d_beta) =
                B::layer_norm_backward(Saved { x, gamma, stats }, dy, addend);
            [dx, d_gamma, d_beta]
        };
        let [dx, d_gamma, d_beta] = match addend {
            Some(addend) => in_stream::<B, _, 5, 3>(
                "layer_norm_backward",
                [x, gamma, stats, dy, addend],
                outs,
                move |[x, gamma, stats, dy, addend]| run(x, gamma, stats, dy, Some(addend)),
            ),
            None => in_stream::<B, _, 4, 3>(
                "layer_norm_backward",
                [x, gamma, stats, dy],
                outs,
                move |[x, gamma, stats, dy]| run(x, gamma, stats, dy, None),
            ),
        };
        (dx, d_gamma, d_beta)
    }
}

/// The normalisation with its `eps`, as a [`DeviceOp`] of the input, the scale and the shift;
/// with a claimed `handoff` the input's gradient adds what the residual connection reading
/// the same input hands over (`handoff`).
#[derive(Debug, Clone)]
struct LayerNorm {
    eps: f64,
    handoff: Option<Handoff>,
}

impl<B: DeviceLayerNorm> DeviceBackward<B, 3> for LayerNorm {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        let addend = self.handoff.as_ref().and_then(|h| h.take::<FloatTensor<B>>());
        let (dx, d_gamma, d_beta) = B::layer_norm_backward(saved, dy, addend);
        [dx, d_gamma, d_beta]
    }
}

impl<B: DeviceLayerNorm> DeviceOp<B, 3> for LayerNorm {
    fn forward(&self, [x, gamma, beta]: [FloatTensor<B>; 3]) -> (FloatTensor<B>, Saved<B>) {
        B::layer_norm_forward(x, gamma, beta, self.eps)
    }
}

/// The normalisation under autodiff: one node with the input, the scale and the shift as
/// parents, claiming `handoff` where given.
fn tracked<B: DeviceLayerNorm, const D: usize>(
    x: Tensor<Autodiff<B>, D>,
    gamma: Tensor<Autodiff<B>, 1>,
    beta: Tensor<Autodiff<B>, 1>,
    eps: f64,
    handoff: Option<&Handoff>,
) -> Tensor<Autodiff<B>, D> {
    let op = LayerNorm { eps, handoff: Handoff::receive(handoff) };
    let y = device_op::tracked(op, [float(x), float(gamma), float(beta)]);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The normalisation of `x` under autodiff whose forward already ran (`y` and its `stats`,
/// from [`DeviceLayerNorm::bias_residual_norm`]): one node with the input, the scale and the
/// shift as parents, as [`tracked`] makes, claiming `handoff` where given; no launch.
pub fn tracked_from<B: DeviceLayerNorm, const D: usize>(
    x: Tensor<Autodiff<B>, D>,
    gamma: Tensor<Autodiff<B>, 1>,
    beta: Tensor<Autodiff<B>, 1>,
    eps: f64,
    handoff: Option<&Handoff>,
    [y, stats]: [FloatTensor<B>; 2],
) -> Tensor<Autodiff<B>, D> {
    let op = LayerNorm { eps, handoff: Handoff::receive(handoff) };
    let inputs = [float(x), float(gamma), float(beta)];
    let y = device_op::tracked_with(op, inputs, |_, [x, gamma, _]| (y, Saved { x, gamma, stats }));
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The normalisation without autodiff (evaluation).
fn bare<B: DeviceLayerNorm, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let (y, _) = B::layer_norm_forward(float(x), float(gamma), float(beta), eps);
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// `layer_norm(x) * gamma + beta` over `x`'s last dimension, as one operation where the backend
/// is one of the trainer's CubeCL types (bare or under autodiff), the tensors f32 and there is
/// a shift; `None` elsewhere. Under autodiff it claims `handoff` where given: its backward
/// adds the gradient handed over there to the input's (`handoff`).
pub fn on_device<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    gamma: &Tensor<B, 1>,
    beta: Option<&Tensor<B, 1>>,
    eps: f64,
    handoff: Option<&Handoff>,
) -> Option<Tensor<B, D>> {
    let beta = beta?;
    if D == 0
        || x.dims()[D - 1] != gamma.dims()[0]
        || beta.dims() != gamma.dims()
        || [x.dtype(), gamma.dtype(), beta.dtype()].iter().any(|d| *d != DType::F32)
    {
        return None;
    }
    on_cube_types!(
        B,
        T,
        {
            let (x, gamma, beta) = (cast(x.clone())?, cast(gamma.clone())?, cast(beta.clone())?);
            cast(tracked::<T, D>(x, gamma, beta, eps, handoff))
        },
        { cast(bare::<T, D>(cast(x.clone())?, cast(gamma.clone())?, cast(beta.clone())?, eps)) }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use burn::module::Param;
    use burn::nn::LayerNormConfig;
    use burn::tensor::Distribution;

    /// The operation against Burn's `LayerNorm` on the same backend, over `3 x t` rows of
    /// `width`: the outputs, and the gradients of the input, the scale and the shift under a
    /// weighted sum of the outputs.
    fn against_burn<B: DeviceLayerNorm>(width: usize, t: usize) -> [f32; 4] {
        let device = Default::default();
        B::seed(&device, 11);
        let eps = 1e-5;
        // An offset and scale per row, as activations have, so the mean matters.
        let x = Tensor::<B, 3>::random([3, t, width], Distribution::Normal(0.0, 1.0), &device)
            .mul_scalar(2.5)
            .add_scalar(0.7);
        let weights =
            Tensor::<B, 3>::random([3, t, width], Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let mut norm = LayerNormConfig::new(width).with_epsilon(eps).init::<A<B>>(&device);
        let gamma = Tensor::<B, 1>::random([width], Distribution::Normal(1.0, 0.5), &device);
        let beta = Tensor::<B, 1>::random([width], Distribution::Normal(0.0, 0.5), &device);
        norm.gamma = Param::from_tensor(Tensor::from_inner(gamma));
        norm.beta = Some(Param::from_tensor(Tensor::from_inner(beta)));
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let gamma = norm.gamma.val();
            let beta = norm.beta.as_ref().unwrap().val();
            let out = if device_form {
                tracked::<B, 3>(xa.clone(), gamma.clone(), beta.clone(), eps, None)
            } else {
                norm.forward(xa.clone())
            };
            let loss = (out.clone() * Tensor::from_inner(weights.clone())).sum();
            let grads = loss.backward();
            let dg = gamma.grad(&grads).unwrap();
            let db = beta.grad(&grads).unwrap();
            (out.inner(), xa.grad(&grads).unwrap(), dg, db)
        };
        let (y, dx, dg, db) = run(true);
        let (y0, dx0, dg0, db0) = run(false);
        let bare_y = bare::<B, 3>(
            x.clone(),
            norm.gamma.val().inner(),
            norm.beta.as_ref().unwrap().val().inner(),
            eps,
        );
        assert_eq!(
            bare_y.into_data().into_vec::<f32>().unwrap(),
            y.clone().into_data().into_vec::<f32>().unwrap()
        );
        [difference(y, y0), difference(dx, dx0), difference(dg, dg0), difference(db, db0)]
    }

    /// Rows narrower and wider than a cube; 111 rows, whose parameter sums take one launch
    /// (at widths 72 and 600 every column block is whole; at 20 the last is cut short), and 4,200, which take partial sums
    /// over blocks of rows and then their sum.
    #[test]
    fn matches_burn_s_layer_norm_and_its_gradients_on_wgpu_with_and_without_fusion() {
        let cases = [
            ("wgpu, width 72", against_burn::<burn::backend::Wgpu>(72, 37)),
            ("wgpu, width 600", against_burn::<burn::backend::Wgpu>(600, 37)),
            ("fused wgpu, width 600", against_burn::<Fusion<burn::backend::Wgpu>>(600, 37)),
            ("wgpu, width 20, 4,200 rows", against_burn::<burn::backend::Wgpu>(20, 1400)),
        ];
        for (name, d) in &cases {
            eprintln!(
                "{name}: y {:.1e}, dx {:.1e}, dgamma {:.1e}, dbeta {:.1e}",
                d[0], d[1], d[2], d[3]
            );
        }
        // Measured: wgpu at width 72 1.1e-7, 1.8e-7, 1.5e-7, 1.5e-7; at width 600 (fused or not)
        // 1.5e-7, 1.9e-7, 2.4e-7, 2.3e-7; 4,200 rows 1.3e-7, 2.5e-7, 4.4e-7, 6.1e-7 (two f32
        // evaluations of the same arithmetic, summed in another order). Bounds: 2x to 5x the
        // largest.
        for (name, d) in cases {
            for (what, v, bound) in [
                ("output", d[0], 7.5e-7),
                ("input gradient", d[1], 9.5e-7),
                ("scale gradient", d[2], 1.4e-6),
                ("shift gradient", d[3], 1.3e-6),
            ] {
                assert!(v <= bound, "{name}: {what} differs by {v:.2e} (bound {bound:.1e})");
            }
        }
    }

    /// A pre-norm residual block, `x + layer(norm(x))` with the residual's dropout, through
    /// the normalisation's and the residual's operations: with the residual's input gradient
    /// handed to the normalisation's backward (`handoff`) the gradients of the input, the scale
    /// and the shift are autodiff's sum's bits, bare and fused; with the normalisation not
    /// claiming the handoff the residual registers its gradient itself.
    #[test]
    fn the_residual_s_gradient_handed_over_is_autodiff_s_sum_bit_for_bit() {
        use crate::model::device_matmul::linear_residual;
        use crate::model::dropout::Rule;
        type A<B> = Autodiff<B>;
        fn check<B: crate::model::device_matmul::DeviceMatmul + DeviceLayerNorm>(name: &str) {
            let device = Default::default();
            B::seed(&device, 3);
            let (rows, d) = (37, 24);
            let normal = |dims: [usize; 2]| {
                Tensor::<B, 2>::random(dims, Distribution::Normal(0.0, 1.0), &device)
            };
            let (x, w, dy) = (normal([rows, d]), normal([d, d]), normal([rows, d]));
            let [gamma, beta, b] = [0, 1, 2].map(|_| normal([1, d]).reshape([d]));
            let rule = Rule::new(0x5eed, 0.8).times(0.5);
            let bits = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
            let bits1 = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
            // `claim`: whether the normalisation takes the handoff; `give`: whether the
            // residual is offered it.
            let run = |claim: bool, give: bool| {
                let xa = Tensor::<A<B>, 2>::from_inner(x.clone()).require_grad();
                let [ga, ba] =
                    [&gamma, &beta].map(|t| Tensor::from_inner(t.clone()).require_grad());
                let (wa, bb) = (Tensor::from_inner(w.clone()), Tensor::from_inner(b.clone()));
                let handoff = Handoff::new();
                let normed = on_device(&xa, &ga, Some(&ba), 1e-5, claim.then_some(&handoff))
                    .expect("a CubeCL type");
                let offer = give.then_some(&handoff);
                let y = linear_residual(xa.clone(), &normed, &wa, &bb, rule, offer)
                    .expect("a CubeCL type");
                let grads = (y * Tensor::from_inner(dy.clone())).sum().backward();
                let g = |t: &Tensor<A<B>, 1>| bits1(t.grad(&grads).expect("tracked"));
                [bits(xa.grad(&grads).expect("tracked")), g(&ga), g(&ba)]
            };
            let summed = run(false, false);
            for (what, got) in [("handed over", run(true, true)), ("not claimed", run(false, true))]
            {
                for (k, part) in ["input", "scale", "shift"].iter().enumerate() {
                    assert_eq!(got[k], summed[k], "{name}, {what}: the {part}'s gradient");
                }
            }
            // Claimed but not offered: the residual registers it, the normalisation adds none.
            assert_eq!(run(true, false)[0], summed[0], "{name}: claimed, not offered");
        }
        check::<burn::backend::Wgpu>("wgpu");
        check::<Fusion<burn::backend::Wgpu>>("fused wgpu");
    }

    /// The residual after a linear layer and the next normalisation's forward in one kernel
    /// (`device_matmul::linear_residual_norm`) against the residual's operation then the
    /// normalisation's: the residual's output, the normalised, and the gradients of the
    /// residual's input, the layer's input, weight and bias, and the scale and shift under
    /// weighted sums of both outputs, bit for bit, bare and fused.
    #[test]
    fn the_residual_with_the_next_normalisation_is_the_two_bit_for_bit() {
        use crate::model::device_matmul::{linear_residual, linear_residual_norm};
        use crate::model::dropout::{NextNorm, Rule};
        type A<B> = Autodiff<B>;
        fn check<B: crate::model::device_matmul::DeviceMatmul + DeviceLayerNorm>(name: &str) {
            let device = Default::default();
            B::seed(&device, 9);
            let (rows, k, d) = (41, 20, 24);
            let normal = |dims: [usize; 2]| {
                Tensor::<B, 2>::random(dims, Distribution::Normal(0.0, 1.0), &device)
            };
            let (x, h, w) = (normal([rows, d]), normal([rows, k]), normal([k, d]));
            let (dy, dn) = (normal([rows, d]), normal([rows, d]));
            let [gamma, beta, b] = [0, 1, 2].map(|_| normal([1, d]).reshape([d]));
            let rule = Rule::new(0x5eed, 0.8).times(0.5);
            let bits = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
            let bits1 = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
            let run = |one: bool| {
                let track2 =
                    |t: &Tensor<B, 2>| Tensor::<A<B>, 2>::from_inner(t.clone()).require_grad();
                let track1 =
                    |t: &Tensor<B, 1>| Tensor::<A<B>, 1>::from_inner(t.clone()).require_grad();
                let (xa, ha, wa) = (track2(&x), track2(&h), track2(&w));
                let (ba, ga, bea) = (track1(&b), track1(&gamma), track1(&beta));
                let [y, normed] = if one {
                    let next = NextNorm {
                        gamma: ga.clone(),
                        beta: bea.clone(),
                        eps: 1e-5,
                        handoff: None,
                        chain: false,
                    };
                    linear_residual_norm(xa.clone(), &ha, &wa, &ba, rule, None, next)
                        .expect("a CubeCL type")
                } else {
                    let y = linear_residual(xa.clone(), &ha, &wa, &ba, rule, None)
                        .expect("a CubeCL type");
                    let normed = on_device(&y, &ga, Some(&bea), 1e-5, None).expect("a CubeCL type");
                    [y, normed]
                };
                let loss = (y.clone() * Tensor::from_inner(dy.clone())).sum()
                    + (normed.clone() * Tensor::from_inner(dn.clone())).sum();
                let grads = loss.backward();
                let g2 = |t: &Tensor<A<B>, 2>| bits(t.grad(&grads).expect("tracked"));
                let g1 = |t: &Tensor<A<B>, 1>| bits1(t.grad(&grads).expect("tracked"));
                [
                    bits(y.inner()),
                    bits(normed.inner()),
                    g2(&xa),
                    g2(&ha),
                    g2(&wa),
                    g1(&ba),
                    g1(&ga),
                    g1(&bea),
                ]
            };
            let (one, two) = (run(true), run(false));
            let what = ["output", "normalised", "x", "h", "w", "b", "gamma", "beta"];
            for (k, what) in what.iter().enumerate() {
                assert_eq!(one[k], two[k], "{name}: {what}");
            }
        }
        check::<burn::backend::Wgpu>("wgpu");
        check::<Fusion<burn::backend::Wgpu>>("fused wgpu");
    }
}
