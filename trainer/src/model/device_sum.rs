//! Sums over one axis of an f32 tensor (or of its squares) on the trainer's CubeCL types, in
//! passes of partial sums: the linear layers' bias gradients, the normalisations' and
//! convolutions' parameter sums over blocks of rows, the gradients' global norm.
//!
//! Burn's reduction over an axis that is not the last gave each output one unit that walks the
//! whole axis: on an H200 the 0.6B preset's 451 reductions a step took 177 us each, 17 % of
//! the step's device time, and its sum over all 600 million gradients (the norm) 12 ms, adding
//! every cube's partial to one address (bench/RESULTS.md, "The step on the device"). Here an
//! axis of up to 4,096 rows (a bias's gradient over the batch's frames) is one launch,
//! [`sum_lanes`]: a cube per 8 columns, its 32 lanes each summing every 32nd row, then the
//! lanes added in shared memory. A longer axis takes passes: a pass splits it into chunks of
//! at least [`MIN_CHUNK`] rows, one unit per (outer, chunk, inner) element, reading along
//! `inner` (coalesced); the chunks' sums are the next pass's axis, until one chunk is left. An
//! axis with nothing inside it (`inner == 1`, the flat norm) is first read as rows of
//! [`LANES`] elements, whose columns the last passes sum.
//!
//! Invariants: the input is read as contiguous `[outer, n, inner]` (a view is made contiguous
//! first); the result is `[outer, inner]` in Burn's `sum_dim` shape (the axis kept, of size 1);
//! each launch's output is written whole by its units, and a cube adds its lanes in a fixed
//! order (no atomics: the same input gives the same bits); an empty axis gives zeros.

use asr_tdt::fusion::in_stream;
use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, FloatDType, Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    contiguous, cube_index, cubes, empty, grid, on_cube_types, unit_index, CUBE,
};
use super::host_depthwise::{cast, float};

/// Units a pass aims for: enough to fill a large GPU (an H200 keeps 270,000 resident).
const TARGET_UNITS: usize = 1 << 17;
/// Fewest rows a unit sums in a pass that leaves more than one chunk: each pass shrinks the
/// axis at least this many times.
const MIN_CHUNK: usize = 64;
/// Width of the rows a flat axis is read as (a divisor of its length; see the module).
const LANES: usize = 128;

/// One unit per `(o, c, i)`: the sum over rows `[c * chunk, (c + 1) * chunk)` of `x[o, r, i]`
/// (squared when `square`), written to `out[o, c, i]`.
#[cube(launch)]
pub fn sum_chunks(
    x: &Array<f32>,
    out: &mut Array<f32>,
    n: u32,
    inner: u32,
    chunk: u32,
    chunks: u32,
    units: u32,
    #[comptime] square: bool,
) {
    let u = unit_index();
    if u < units {
        let i = u % inner;
        let rest = u / inner;
        let c = rest % chunks;
        let o = rest / chunks;
        let first = c * chunk;
        let end = u32::min(first + chunk, n);
        let base = o * n * inner + i;
        let mut acc = 0.0f32;
        for r in first..end {
            let v = x[(base + r * inner) as usize];
            if square {
                acc += v * v;
            } else {
                acc += v;
            }
        }
        out[((o * chunks + c) * inner + i) as usize] = acc;
    }
}

/// Columns a cube of [`sum_lanes`] sums side by side (32 bytes of a row: one memory sector);
/// the cube's other units are its row lanes, [`CUBE`] / `LANE_COLS` of them.
pub(crate) const LANE_COLS: u32 = 8;
/// Most rows a unit of [`sum_lanes`] reads; a longer axis takes [`sum_chunks`]' passes.
const LANE_MAX_ROWS: usize = 128;

/// Whether a sum over `rows` rows is one launch of a lanes kernel ([`sum_lanes`], and the
/// layer normalisation's parameter sums): each of a cube's lanes then reads at most
/// [`LANE_MAX_ROWS`] rows.
pub(crate) fn in_lanes(rows: usize) -> bool {
    rows <= (CUBE / LANE_COLS) as usize * LANE_MAX_ROWS
}

/// The sum over a cube's row lanes of each unit's `value` (the cube's units being
/// [`LANE_COLS`] columns side by side, lane after lane), by a tree in shared memory of
/// [`CUBE`] values, always in the same order; lane 0's units get their column's sum. Every
/// unit of the cube must call it (it waits at barriers).
#[cube]
pub fn lanes_sum(shared: &mut SharedMemory<f32>, value: f32) -> f32 {
    let lane = UNIT_POS / LANE_COLS;
    shared[UNIT_POS as usize] = value;
    sync_cube();
    let mut stride = CUBE_DIM / LANE_COLS / 2;
    while stride > 0 {
        if lane < stride {
            let other = shared[(UNIT_POS + stride * LANE_COLS) as usize];
            shared[UNIT_POS as usize] += other;
        }
        sync_cube();
        stride /= 2;
    }
    let out = shared[(UNIT_POS % LANE_COLS) as usize];
    sync_cube();
    out
}

/// [`lanes_sum`] of each unit's `value`, written by lane 0 to `out[at]` where `inside` (its
/// column exists): how every lanes kernel ends. Every unit of the cube must call it.
#[cube]
pub fn lanes_sum_to(out: &mut Array<f32>, at: u32, inside: bool, value: f32) {
    let mut shared = SharedMemory::<f32>::new(CUBE as usize);
    let sum = lanes_sum(&mut shared, value);
    if inside && UNIT_POS / LANE_COLS == 0 {
        out[at as usize] = sum;
    }
}

/// One cube per `(o, block of LANE_COLS columns)`: each unit sums every `lanes`-th row of its
/// column (squared when `square`), then the cube adds its lanes by a tree in shared memory,
/// always in the same order, and writes `out[o, i]`. Every unit reaches every barrier (the
/// bounds are tested around the reads and the write only).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn sum_lanes(
    x: &Array<f32>,
    out: &mut Array<f32>,
    n: u32,
    inner: u32,
    blocks: u32,
    sums: u32,
    #[comptime] square: bool,
) {
    let cube = cube_index();
    let o = cube / blocks;
    let col = UNIT_POS % LANE_COLS;
    let lane = UNIT_POS / LANE_COLS;
    let lanes = CUBE_DIM / LANE_COLS;
    let i = (cube % blocks) * LANE_COLS + col;
    let inside = cube < sums && i < inner;
    let mut acc = 0.0f32;
    if inside {
        let base = o * n * inner + i;
        for r in range_stepped(lane, n, lanes) {
            let v = x[(base + r * inner) as usize];
            if square {
                acc += v * v;
            } else {
                acc += v;
            }
        }
    }
    lanes_sum_to(out, o * inner + i, inside, acc);
}

/// The chunk length and count for one pass over an axis of `n` with `width` (outer times inner)
/// sums beside it.
fn plan(n: usize, width: usize) -> (usize, usize) {
    let chunk = MIN_CHUNK.max((n * width).div_ceil(TARGET_UNITS));
    if chunk >= n {
        return (n.max(1), 1);
    }
    (chunk, n.div_ceil(chunk))
}

/// The sum over the middle axis of contiguous `[outer, n, inner]` (of the squares when
/// `square`), `[outer, inner]`, in passes (see the module).
pub fn sum_middle<R: CubeRuntime>(
    x: CubeTensor<R>,
    outer: usize,
    n: usize,
    inner: usize,
    square: bool,
) -> CubeTensor<R> {
    let x = contiguous(x);
    let (client, device) = (x.client.clone(), x.device.clone());
    if inner == 1 && n >= LANES * MIN_CHUNK && n.is_multiple_of(LANES) {
        // A flat axis as rows of LANES: the rows' sums are coalesced, then their columns.
        let columns = sum_middle(x, outer, n / LANES, LANES, square);
        return sum_middle(columns, outer, LANES, 1, false);
    }
    if in_lanes(n) {
        // One launch, not two or more: a linear layer's bias gradient sums its B x T rows
        // (about 2,000 at the 0.6B preset) into `inner` columns, and each launch is host work
        // on CubeCL's device thread (and fusion's) in a step that the host bounds on an H200
        // (bench/RESULTS.md, 2026-11-30 evening; this change's section, 2026-12-07).
        let blocks = inner.div_ceil(LANE_COLS as usize);
        let sums = outer * blocks;
        let out = empty::<R>(&client, &device, vec![outer, 1, inner]);
        if sums > 0 {
            sum_lanes::launch::<R>(
                &client,
                cubes(sums),
                CubeDim::new_1d(CUBE),
                x.into_array_arg(),
                out.clone().into_array_arg(),
                n as u32,
                inner as u32,
                blocks as u32,
                sums as u32,
                square,
            );
        }
        return out;
    }
    let (mut x, mut n, mut square) = (x, n, square);
    loop {
        let (chunk, chunks) = plan(n, outer * inner);
        let units = outer * chunks * inner;
        let out = empty::<R>(&client, &device, vec![outer, chunks, inner]);
        if units > 0 {
            sum_chunks::launch::<R>(
                &client,
                grid(units),
                CubeDim::new_1d(CUBE),
                x.into_array_arg(),
                out.clone().into_array_arg(),
                n as u32,
                inner as u32,
                chunk as u32,
                chunks as u32,
                units as u32,
                square,
            );
        }
        if chunks == 1 {
            return out;
        }
        (x, n, square) = (out, chunks, false);
    }
}

/// The outer, axis and inner lengths of `dims` around `axis`.
fn split(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

/// Sums over an axis as passes of partial sums (see the module): the backends that have them.
pub trait DeviceSum: Backend {
    /// `x` (f32) summed over `axis`, of its squares when `square`, the axis kept (size 1), as
    /// Burn's `sum_dim`.
    fn sum_axis(x: FloatTensor<Self>, axis: usize, square: bool) -> FloatTensor<Self>;

    /// `x` (f32) viewed as rows of `shape` (its trailing elements; their count divides
    /// `x`'s), the rows summed, shaped `shape`: a bias's gradient from its output's. The views
    /// are the backend's tensors' (no copy where `x` is contiguous), inside the one operation
    /// under fusion: its stream holds no reshape beside the sum (two a bias a step before,
    /// bench/RESULTS.md, 2026-12-01).
    fn sum_rows(x: FloatTensor<Self>, shape: Vec<usize>) -> FloatTensor<Self> {
        let cols = shape.iter().product::<usize>();
        let rows = x.shape().num_elements().checked_div(cols).unwrap_or(0);
        let x = super::device_op::as_matrix::<Self>(x, rows, cols);
        Self::float_reshape(Self::sum_axis(x, 0, false), shape.into())
    }
}

impl<R, F, I, BT> DeviceSum for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn sum_axis(x: FloatTensor<Self>, axis: usize, square: bool) -> FloatTensor<Self> {
        let mut dims = x.shape().to_vec();
        let (outer, n, inner) = split(&dims, axis);
        dims[axis] = 1;
        if n == 0 {
            // Nothing to read (and an empty buffer is not a valid binding on every device).
            return Self::float_zeros(Shape::from(dims), &x.device, FloatDType::F32);
        }
        let sums = sum_middle(x, outer, n, inner, square);
        CubeTensor::new_contiguous(
            sums.client.clone(),
            sums.device.clone(),
            Shape::from(dims),
            sums.handle,
            DType::F32,
        )
    }
}

impl<B> DeviceSum for Fusion<B>
where
    B: FusionBackend + DeviceSum,
{
    fn sum_axis(x: FloatTensor<Self>, axis: usize, square: bool) -> FloatTensor<Self> {
        let mut dims = x.shape.to_vec();
        if let Some(d) = dims.get_mut(axis) {
            *d = 1;
        }
        let [sums] = in_stream::<B, _, 1, 1>("sum_axis", [x], [(dims, DType::F32)], move |[x]| {
            [B::sum_axis(x, axis, square)]
        });
        sums
    }

    fn sum_rows(x: FloatTensor<Self>, shape: Vec<usize>) -> FloatTensor<Self> {
        let out = (shape.clone(), DType::F32);
        let [sums] = in_stream::<B, _, 1, 1>("sum_rows", [x], [out], move |[x]| {
            [B::sum_rows(x, shape.clone())]
        });
        sums
    }
}

/// The sum of the squares of `x`'s elements, `[1]`, as passes of partial sums where the
/// backend is one of the trainer's CubeCL types (bare) and `x` is f32; `None` elsewhere.
pub fn sum_of_squares<B: Backend>(x: &Tensor<B, 1>) -> Option<Tensor<B, 1>> {
    if x.dtype() != DType::F32 {
        return None;
    }
    on_cube_types!(B, T, { None }, {
        let x = float(cast::<_, Tensor<T, 1>>(x.clone())?);
        cast(Tensor::<T, 1>::from_primitive(TensorPrimitive::Float(T::sum_axis(x, 0, true))))
    });
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// The sums against float64 sums of the same values, over each axis of shapes whose axes
    /// take one launch of `sum_lanes` (up to 4,096 rows, with column blocks cut short and
    /// several outer sums), one pass or several of `sum_chunks` (longer axes), and the flat
    /// form (`LANES`); with and without fusion, of the values and of their squares. Returns
    /// the largest error relative to the sum of magnitudes.
    fn against_f64<B: DeviceSum>() -> f64 {
        let device = Default::default();
        B::seed(&device, 5);
        let mut worst = 0.0f64;
        let shapes: [&[usize]; 7] = [
            &[3, 70, 5],
            &[1, 9000, 40],
            &[2, 1, 3],
            &[LANES * MIN_CHUNK * 3],
            &[4100],
            &[2, 4096, 13],
            &[1, 300, 70],
        ];
        for dims in shapes {
            let total: usize = dims.iter().product();
            let x = Tensor::<B, 1>::random([total], Distribution::Normal(0.3, 1.0), &device);
            let values: Vec<f64> =
                x.to_data().into_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
            for axis in 0..dims.len() {
                for square in [false, true] {
                    let got = B::sum_axis(
                        B::float_reshape(float(x.clone()), Shape::from(dims.to_vec())),
                        axis,
                        square,
                    );
                    let mut kept = dims.to_vec();
                    kept[axis] = 1;
                    assert_eq!(got.shape().to_vec(), kept, "{dims:?} over {axis}");
                    let got = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(got))
                        .into_data()
                        .into_vec::<f32>()
                        .unwrap();
                    let (outer, n, inner) = split(dims, axis);
                    for o in 0..outer {
                        for i in 0..inner {
                            let (mut want, mut magnitude) = (0.0f64, 0.0f64);
                            for r in 0..n {
                                let v = values[(o * n + r) * inner + i];
                                let v = if square { v * v } else { v };
                                want += v;
                                magnitude += v.abs();
                            }
                            let g = f64::from(got[o * inner + i]);
                            worst = worst.max((g - want).abs() / magnitude);
                        }
                    }
                }
            }
        }
        worst
    }

    #[test]
    fn sums_match_float64_on_wgpu_with_and_without_fusion() {
        let plain = against_f64::<burn::backend::Wgpu>();
        let fused = against_f64::<Fusion<burn::backend::Wgpu>>();
        eprintln!(
            "largest error relative to the sum of magnitudes: {plain:.2e}, fused {fused:.2e}"
        );
        // Measured 2.4e-7 either way (f32 sums of up to 24,576 terms; 3.6e-7 while axes of
        // up to 4,096 rows took two passes). Bound: about 4x that.
        for (name, e) in [("wgpu", plain), ("fused wgpu", fused)] {
            assert!(e <= 1.0e-6, "{name}: {e:.2e}");
        }
    }

    #[test]
    fn an_empty_axis_sums_to_zeros() {
        type B = burn::backend::Wgpu;
        let device = Default::default();
        let x = Tensor::<B, 3>::zeros([2, 0, 3], &device);
        let got = B::sum_axis(float(x), 1, false);
        assert_eq!(got.shape().to_vec(), vec![2, 1, 3]);
        let got = Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(got));
        assert_eq!(got.into_data().into_vec::<f32>().unwrap(), vec![0.0; 6]);
    }

    #[test]
    fn the_sum_of_squares_is_the_norm_s_square() {
        type B = burn::backend::Wgpu;
        let device = Default::default();
        let n = LANES * MIN_CHUNK * 2 + LANES;
        let values: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 7.0).collect();
        let want: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let x = Tensor::<B, 1>::from_floats(values.as_slice(), &device);
        let got = sum_of_squares(&x).expect("wgpu takes the device sum").into_scalar();
        let error = (f64::from(got) - want).abs() / want;
        eprintln!("sum of squares {got} against {want}: {error:.2e}");
        // Measured 4.5e-8 (7.4e-8 while its last 128 rows took passes). Bound: under 5x that.
        assert!(error <= 2.0e-7, "{error:.2e}");
        let cpu = Tensor::<burn::backend::NdArray, 1>::zeros([4], &Default::default());
        assert!(sum_of_squares(&cpu).is_none(), "NdArray keeps Burn's sum");
    }
}
