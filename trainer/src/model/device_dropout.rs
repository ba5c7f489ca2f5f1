//! Dropout (`model::dropout`) as one operation on the CubeCL backends (wgpu, CUDA; fused or
//! not).
//!
//! Burn's form draws a Bernoulli tensor, multiplies by it and divides by the keep share: three
//! launches forward, two backward, and the drawn mask kept from the forward to the backward,
//! the size of the input (for the attention's probabilities, `[B, H, T, T]`). A Conformer layer
//! runs eight dropouts, and a GPU step is bound by the host's cost per launch
//! (bench/RESULTS.md). Here the mask is never stored: one kernel hashes each element's index
//! with the call's seed ([`dropout::word`]) and multiplies, forward; the same kernel on the
//! output's gradient is the backward. A residual connection through a dropout
//! (`x + factor * dropout(f)`, [`dropout::Dropout::residual_linear`]'s fallback) is one
//! kernel too, forward (`residual_apply`, the factor folded into the rule's scale); its
//! backward passes the output's gradient to `x` as it is and runs `dropout_apply` on it for
//! `f`. With the linear layer's bias before it (`bias_residual_apply`) it is the forward's
//! second kernel of `device_matmul::linear_residual`, whose backward masks the gradient and
//! sums its rows (the bias's gradient) in one kernel ([`DeviceDropout::dropout_row_sums`]).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff (dropout is the identity without it), with f32 tensors of fewer than `2^32`
//! elements; `None` elsewhere, and the caller runs Burn's form.
//!
//! Invariants: element `i` (in the tensor's logical row-major order) of the output is
//! `x[i] * m` with `m` the rule's scale where [`Rule::keeps`]`(i)` and `0` elsewhere: the CPU
//! backend's mask for the same seed, bit for bit; the backward is the same product on the
//! gradient and keeps only the rule (two words and two scalars). The residual's output is
//! `x[i] + f[i] * m`, one product and one sum (a target may contract them into one fused
//! multiply-add, as NVRTC does by default: then within an ulp of the CPU's sum).

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
#[cfg(doc)]
use super::dropout;
use super::dropout::Rule;
use super::host_depthwise::{float, same};

/// [`dropout::lowbias32`] in the kernel (u32 products wrap on every CubeCL target).
#[cube]
fn lowbias32(x: u32) -> u32 {
    let mut x = x;
    x ^= x >> 16u32;
    x *= 0x7feb_352du32;
    x ^= x >> 15u32;
    x *= 0x846c_a68bu32;
    x ^ (x >> 16u32)
}

/// Element `pos`'s factor: `scale` where its word (below `2^32` elements, [`dropout::word`])
/// is under `threshold`, else `0`. Also the attention's weights' dropout (`device_attention`).
#[cube]
pub fn mask_factor(pos: u32, k0: u32, k1: u32, threshold: u32, scale: f32) -> f32 {
    let word = lowbias32(lowbias32(pos ^ k0) ^ k1);
    let mut m = 0.0f32;
    if word < threshold {
        m = scale;
    }
    m
}

/// One unit per element: `y = x * m`, `m` [`mask_factor`].
#[cube(launch)]
pub fn dropout_apply(
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
        y[pos as usize] = x[pos as usize] * mask_factor(pos, k0, k1, threshold, scale);
    }
}

/// One unit per element: `y = x + f * m`, `m` [`mask_factor`] (a residual connection).
#[cube(launch)]
pub fn residual_apply(
    x: &Array<f32>,
    f: &Array<f32>,
    y: &mut Array<f32>,
    k0: u32,
    k1: u32,
    threshold: u32,
    scale: f32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let i = pos as usize;
        y[i] = x[i] + f[i] * mask_factor(pos, k0, k1, threshold, scale);
    }
}

/// One unit per element of `y` `[.., cols]`: `y = x + (p + b[column]) * m`, `m`
/// [`mask_factor`]: a linear layer's bias (`device_bias::bias_add`) and the residual after it
/// ([`residual_apply`]) in one launch, with the same bits.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn bias_residual_apply(
    x: &Array<f32>,
    p: &Array<f32>,
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
        let i = pos as usize;
        let f = p[i] + b[(pos % cols) as usize];
        y[i] = x[i] + f * mask_factor(pos, k0, k1, threshold, scale);
    }
}

/// One cube per block of [`LANE_COLS`] columns of `dy` `[n, cols]`: each unit writes
/// `g = dy * m` (`m` [`mask_factor`]) on every `lanes`-th row of its column and sums what it
/// wrote, then the cube adds its lanes ([`lanes_sum`]) and writes `sums[column]`. The dropout's
/// kernel on a linear layer's output gradient and its bias's gradient (`device_sum`'s
/// `sum_lanes` over the rows) in one launch: the same masked values, summed in the same order.
/// Every unit reaches every barrier (the bounds are tested around the reads and writes only).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn dropout_sum_lanes(
    dy: &Array<f32>,
    g: &mut Array<f32>,
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
    let col = UNIT_POS % LANE_COLS;
    let lane = UNIT_POS / LANE_COLS;
    let lanes = CUBE_DIM / LANE_COLS;
    let i = cube * LANE_COLS + col;
    let inside = cube < blocks && i < cols;
    let mut acc = 0.0f32;
    if inside {
        for r in range_stepped(lane, n, lanes) {
            let pos = r * cols + i;
            let v = dy[pos as usize] * mask_factor(pos, k0, k1, threshold, scale);
            g[pos as usize] = v;
            acc += v;
        }
    }
    lanes_sum_to(sums, i, inside, acc);
}

/// The operations (see the module): the backends that have them.
pub trait DeviceDropout: Backend {
    /// `x` times `rule`'s mask, element by element in `x`'s logical order.
    fn dropout_apply(rule: Rule, x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `x + f` times `rule`'s mask, `x` and `f` of one shape.
    fn residual_apply(rule: Rule, x: FloatTensor<Self>, f: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `x + (p + b)` times `rule`'s mask, `x` and `p` `[.., cols]` of one shape, `b` `[cols]`
    /// added to every row: a linear layer's bias and the residual after it, one kernel.
    fn bias_residual_apply(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// `dy` `[.., cols]` times `rule`'s mask, and that product's rows summed (`[cols]`, a
    /// linear layer's bias gradient), in one kernel ([`dropout_sum_lanes`]); `dy` given back
    /// where the backend or the row count has no such kernel (more rows than one launch of
    /// lanes sums), and the caller runs [`Self::dropout_apply`] and the sum.
    fn dropout_row_sums(
        rule: Rule,
        dy: FloatTensor<Self>,
    ) -> Result<[FloatTensor<Self>; 2], FloatTensor<Self>> {
        let _ = rule;
        Err(dy)
    }
}

impl<R, F, I, BT> DeviceDropout for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn dropout_apply(rule: Rule, x: FloatTensor<Self>) -> FloatTensor<Self> {
        let dims = x.shape().to_vec();
        let units = dims.iter().product::<usize>();
        let x = contiguous(x);
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let (k0, k1, threshold, scale) = rule.kernel_args();
        // Each unit reads and writes its own element; the checked launch bounds every access
        // anyway.
        dropout_apply::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            y.clone().into_array_arg(),
            k0,
            k1,
            threshold,
            scale,
            units as u32,
        );
        y
    }

    fn residual_apply(rule: Rule, x: FloatTensor<Self>, f: FloatTensor<Self>) -> FloatTensor<Self> {
        let dims = x.shape().to_vec();
        let units = dims.iter().product::<usize>();
        let (x, f) = (contiguous(x), contiguous(f));
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let (k0, k1, threshold, scale) = rule.kernel_args();
        residual_apply::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            f.into_array_arg(),
            y.clone().into_array_arg(),
            k0,
            k1,
            threshold,
            scale,
            units as u32,
        );
        y
    }

    fn bias_residual_apply(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let dims = x.shape().to_vec();
        let units = dims.iter().product::<usize>();
        let cols = dims.last().copied().unwrap_or(1).max(1);
        let (x, p, b) = (contiguous(x), contiguous(p), contiguous(b));
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, dims);
        let (k0, k1, threshold, scale) = rule.kernel_args();
        bias_residual_apply::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            p.into_array_arg(),
            b.into_array_arg(),
            y.clone().into_array_arg(),
            k0,
            k1,
            threshold,
            scale,
            cols as u32,
            units as u32,
        );
        y
    }

    fn dropout_row_sums(
        rule: Rule,
        dy: FloatTensor<Self>,
    ) -> Result<[FloatTensor<Self>; 2], FloatTensor<Self>> {
        let dims = dy.shape().to_vec();
        let cols = dims.last().copied().unwrap_or(1);
        let rows = dims.iter().rev().skip(1).product::<usize>();
        if cols == 0 || rows == 0 || !in_lanes(rows) {
            return Err(dy);
        }
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let g = empty::<R>(&client, &dy.device, dims);
        let sums = empty::<R>(&client, &dy.device, vec![cols]);
        let blocks = cols.div_ceil(LANE_COLS as usize);
        let (k0, k1, threshold, scale) = rule.kernel_args();
        dropout_sum_lanes::launch::<R>(
            &client,
            cubes(blocks),
            CubeDim::new_1d(CUBE),
            dy.into_array_arg(),
            g.clone().into_array_arg(),
            sums.clone().into_array_arg(),
            k0,
            k1,
            threshold,
            scale,
            rows as u32,
            cols as u32,
            blocks as u32,
        );
        Ok([g, sums])
    }
}

impl<B> DeviceDropout for Fusion<B>
where
    B: FusionBackend + DeviceDropout,
{
    fn dropout_apply(rule: Rule, x: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), DType::F32);
        let [y] = in_stream::<B, _, 1, 1>("dropout_apply", [x], [out], move |[x]| {
            [B::dropout_apply(rule, x)]
        });
        y
    }

    fn residual_apply(rule: Rule, x: FloatTensor<Self>, f: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), DType::F32);
        let [y] = in_stream::<B, _, 2, 1>("residual_apply", [x, f], [out], move |[x, f]| {
            [B::residual_apply(rule, x, f)]
        });
        y
    }

    fn bias_residual_apply(
        rule: Rule,
        x: FloatTensor<Self>,
        p: FloatTensor<Self>,
        b: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), DType::F32);
        let [y] = in_stream::<B, _, 3, 1>("bias_residual", [x, p, b], [out], move |[x, p, b]| {
            [B::bias_residual_apply(rule, x, p, b)]
        });
        y
    }
}

/// The dropout as a [`DeviceOp`] of its input, keeping nothing but the rule.
impl<B: DeviceDropout> DeviceBackward<B, 1> for Rule {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 1] {
        [B::dropout_apply(*self, dy)]
    }
}

impl<B: DeviceDropout> DeviceOp<B, 1> for Rule {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, ()) {
        (B::dropout_apply(*self, x), ())
    }
}

/// The dropout under autodiff: one node with the input as parent.
fn tracked<B: DeviceDropout, const D: usize>(
    rule: Rule,
    x: Tensor<Autodiff<B>, D>,
) -> Tensor<Autodiff<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(rule, [float(x)])))
}

/// The residual connection `x + f * mask` as a [`DeviceOp`] of `x` and `f`: `x`'s gradient is
/// the output's, `f`'s the output's times the mask; nothing kept but the rule.
#[derive(Debug, Clone, Copy)]
struct Residual(Rule);

impl<B: DeviceDropout> DeviceBackward<B, 2> for Residual {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        [dy.clone(), B::dropout_apply(self.0, dy)]
    }
}

impl<B: DeviceDropout> DeviceOp<B, 2> for Residual {
    fn forward(&self, [x, f]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, ()) {
        (B::residual_apply(self.0, x, f), ())
    }
}

/// `x + f * mask` as one operation where the backend is one of the trainer's CubeCL types under
/// autodiff, `x` and `f` f32 of one shape and under `2^32` elements; both given back elsewhere.
/// They are taken, not borrowed: where the caller held the last handle, the operation holds it
/// (under fusion, queued read-write), where a clone left the caller's handle to be dropped after,
/// one drop operation of fusion's stream each (bench/RESULTS.md, 2026-12-01, "The old
/// parameters released").
pub fn residual_on_device<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    f: Tensor<B, D>,
    rule: Rule,
) -> Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    if x.dtype() != DType::F32
        || f.dtype() != DType::F32
        || x.dims() != f.dims()
        || x.shape().num_elements() > u32::MAX as usize
    {
        return Err((x, f));
    }
    on_cube_types!(
        B,
        T,
        {
            let x: Tensor<Autodiff<T>, D> = same(x);
            let f: Tensor<Autodiff<T>, D> = same(f);
            let inputs = [float(x), float(f)];
            Ok(same(Tensor::<Autodiff<T>, D>::from_primitive(TensorPrimitive::Float(
                device_op::tracked(Residual(rule), inputs),
            ))))
        },
        { Err((x, f)) }
    );
    Err((x, f))
}

/// `x` times `rule`'s mask as one operation where the backend is one of the trainer's CubeCL
/// types under autodiff, `x` f32 and under `2^32` elements; `x` given back elsewhere. Taken, not
/// borrowed, as [`residual_on_device`]'s inputs are.
pub fn on_device<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    rule: Rule,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if x.dtype() != DType::F32 || x.shape().num_elements() > u32::MAX as usize {
        return Err(x);
    }
    on_cube_types!(
        B,
        T,
        {
            let x = same(x);
            Ok(same(tracked::<T, D>(rule, x)))
        },
        { Err(x) }
    );
    Err(x)
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::dropout;
    use burn::tensor::Distribution;

    /// The operation's output and input gradient (under a weighted sum of the output) against
    /// the CPU backend's mask for the same rule, computed on the host: the same bits. The input
    /// is a transposed view (not contiguous), so the mask must follow the logical order.
    fn against_the_host_mask<B: DeviceDropout>(dims: [usize; 3], rule: Rule) {
        let device = Default::default();
        B::seed(&device, 9);
        let [a, b, c] = dims;
        let x = Tensor::<B, 3>::random([a, c, b], Distribution::Normal(0.0, 1.0), &device)
            .swap_dims(1, 2);
        let weights = Tensor::<B, 3>::random(dims, Distribution::Normal(0.0, 1.0), &device);
        let xa = Tensor::<Autodiff<B>, 3>::from_inner(x.clone()).require_grad();
        let y = tracked::<B, 3>(rule, xa.clone());
        let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
        let values = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        let mask = rule.mask(a * b * c);
        let times_mask = |v: Vec<f32>| v.iter().zip(&mask).map(|(v, m)| v * m).collect::<Vec<_>>();
        let what = format!("{dims:?}, seed {:#x}", rule.seed);
        assert_eq!(values(y.inner()), times_mask(values(x)), "{what}: outputs");
        let dx = values(xa.grad(&grads).unwrap());
        assert_eq!(dx, times_mask(values(weights)), "{what}: input gradients");
        let kept = mask.iter().filter(|&&m| m != 0.0).count();
        assert!(kept > 0 && kept < mask.len(), "{what}: {kept} of {} kept", mask.len());
    }

    #[test]
    fn is_the_cpu_mask_bit_for_bit_forward_and_backward_on_wgpu_with_and_without_fusion() {
        // One element short of a cube, several cubes, and a seed whose halves both matter.
        let cases = [
            ([1, 5, 51], Rule::new(3, 0.9)),
            ([3, 29, 66], Rule::new(0xfeed_0000_0000_beef, 0.5)),
            ([2, 300, 17], Rule::new(u64::MAX, 0.2)),
        ];
        for (dims, rule) in cases {
            against_the_host_mask::<burn::backend::Wgpu>(dims, rule);
            against_the_host_mask::<Fusion<burn::backend::Wgpu>>(dims, rule);
        }
    }

    /// The residual's output and both gradients against the host mask; returns the output's
    /// largest difference relative to its largest value (gradients must be the same bits).
    fn residual_against_the_host_mask<B: DeviceDropout>(dims: [usize; 3], rule: Rule) -> f32 {
        let device = Default::default();
        B::seed(&device, 11);
        let [a, b, c] = dims;
        let normal =
            |d: [usize; 3]| Tensor::<B, 3>::random(d, Distribution::Normal(0.0, 1.0), &device);
        let x = normal(dims);
        let f = normal([a, c, b]).swap_dims(1, 2);
        let weights = normal(dims);
        let xa = Tensor::<Autodiff<B>, 3>::from_inner(x.clone()).require_grad();
        let fa = Tensor::<Autodiff<B>, 3>::from_inner(f.clone()).require_grad();
        let y =
            residual_on_device(xa.clone(), fa.clone(), rule).expect("the trainer's CubeCL type");
        let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
        let values = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        let mask = rule.mask(a * b * c);
        let times_mask = |v: Vec<f32>| v.iter().zip(&mask).map(|(v, m)| v * m).collect::<Vec<_>>();
        let what = format!("{dims:?}, seed {:#x}", rule.seed);
        let host: Vec<f32> =
            values(x).iter().zip(times_mask(values(f))).map(|(x, fm)| x + fm).collect();
        let n = host.len();
        let host = Tensor::<B, 1>::from_data(TensorData::new(host, [n]), &device);
        let got = y.inner().reshape([a * b * c]);
        assert_eq!(
            values(xa.grad(&grads).unwrap()),
            values(weights.clone()),
            "{what}: x's gradient"
        );
        assert_eq!(
            values(fa.grad(&grads).unwrap()),
            times_mask(values(weights)),
            "{what}: f's gradient"
        );
        device_op::relative_difference(got, host)
    }

    #[test]
    fn the_residual_is_the_cpu_mask_s_sum_and_its_gradients_the_same_bits() {
        let cases = [
            ([1, 5, 51], Rule::new(3, 0.9).times(0.5)),
            ([3, 29, 66], Rule::new(0xfeed_0000_0000_beef, 0.5)),
            ([2, 300, 17], Rule::new(u64::MAX, 0.2).times(0.5)),
        ];
        let mut worst = 0.0f32;
        for (dims, rule) in cases {
            worst = worst.max(residual_against_the_host_mask::<burn::backend::Wgpu>(dims, rule));
            worst = worst
                .max(residual_against_the_host_mask::<Fusion<burn::backend::Wgpu>>(dims, rule));
        }
        println!("residual output against the host: {worst:e}");
        assert!(worst == 0.0, "{worst:e}");
    }

    /// The masked gradient and its rows' sums in one kernel: the masked values are the host
    /// mask's bits (the input a transposed view), and each column's sum is within the lanes
    /// sum's bound of float64's sum of those values (relative to the sum of their magnitudes),
    /// at one partial block of columns, several blocks, and the most rows one launch takes;
    /// more rows are given back. Returns the worst error and whether every sum had the bits of
    /// the dropout's kernel then `device_sum`'s.
    fn row_sums_against_float64<B: DeviceDropout + crate::model::device_sum::DeviceSum>(
        dims: [usize; 3],
        rule: Rule,
    ) -> Option<(f64, bool)> {
        let device = Default::default();
        B::seed(&device, 13);
        let [a, b, c] = dims;
        let dy = Tensor::<B, 3>::random([a, c, b], Distribution::Normal(0.0, 1.0), &device)
            .swap_dims(1, 2);
        let values = |t: Tensor<B, 3>| t.into_data().into_vec::<f32>().unwrap();
        let [g, sums] = B::dropout_row_sums(rule, dy.clone().into_primitive().tensor()).ok()?;
        let g = values(Tensor::from_primitive(TensorPrimitive::Float(g)));
        let sums = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(sums));
        let sums = sums.into_data().into_vec::<f32>().unwrap();
        let mask = rule.mask(a * b * c);
        let want: Vec<f32> = values(dy.clone()).iter().zip(&mask).map(|(v, m)| v * m).collect();
        let what = format!("{dims:?}, seed {:#x}", rule.seed);
        assert_eq!(g, want, "{what}: the masked gradient");
        assert_eq!(sums.len(), c, "{what}: one sum a column");
        let mut worst = 0.0f64;
        for (col, got) in sums.iter().enumerate() {
            let column = want.iter().skip(col).step_by(c).map(|v| f64::from(*v));
            let (sum, size) = column.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
            worst = worst.max((f64::from(*got) - sum).abs() / size.max(f64::MIN_POSITIVE));
        }
        let apart = B::dropout_apply(rule, dy.into_primitive().tensor());
        let apart = B::sum_rows(apart, vec![c]);
        let apart = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(apart));
        Some((worst, apart.into_data().into_vec::<f32>().unwrap() == sums))
    }

    #[test]
    fn the_masked_gradient_and_its_row_sums_are_the_host_mask_and_float64_sums() {
        type W = burn::backend::Wgpu;
        let cases = [
            ([1, 5, 7], Rule::new(3, 0.9)),
            ([3, 29, 66], Rule::new(0xfeed_0000_0000_beef, 0.5).times(0.5)),
            ([2, 2048, 13], Rule::new(u64::MAX, 0.2)),
        ];
        let mut worst = 0.0f64;
        for (dims, rule) in cases {
            let (error, same_bits) = row_sums_against_float64::<W>(dims, rule)
                .unwrap_or_else(|| panic!("{dims:?}: one launch takes 4,096 rows"));
            println!("{dims:?}: sums {error:.1e} from float64, the two kernels' bits: {same_bits}");
            worst = worst.max(error);
        }
        // Measured 6.5e-8 (at 5 rows; 8.7e-9 at 4,096), with the bits of the two kernels
        // apart at every case. Bound: 5x the measured.
        assert!(worst <= 3.0e-7, "the sums are off by {worst:.2e}");
        let long = row_sums_against_float64::<W>([2, 2049, 3], Rule::new(5, 0.5));
        assert!(long.is_none(), "4,098 rows are more than one launch of lanes");
        let fused = row_sums_against_float64::<Fusion<W>>([1, 5, 7], Rule::new(3, 0.9));
        assert!(fused.is_none(), "fusion runs the kernel inside the layer's operation only");
    }

    #[test]
    fn the_module_gives_the_cpu_backend_s_values_on_wgpu_and_passes_through_without_autodiff() {
        let dropout = dropout::Dropout::new(0.25);
        let values: Vec<f32> = (0..3000).map(|i| (i % 13) as f32 - 6.0).collect();
        let run_on = |cpu: bool| -> Vec<Vec<f32>> {
            // Two calls after one seeding: the stream's first two seeds.
            dropout::seed_stream(41);
            let data = || TensorData::new(values.clone(), [30, 100]);
            (0..2)
                .map(|_| {
                    if cpu {
                        type A = Autodiff<burn::backend::NdArray>;
                        let x = Tensor::<A, 2>::from_data(data(), &Default::default());
                        dropout.forward(x).into_data().into_vec::<f32>().unwrap()
                    } else {
                        type A = Autodiff<burn::backend::Wgpu>;
                        let x = Tensor::<A, 2>::from_data(data(), &Default::default());
                        dropout.forward(x).into_data().into_vec::<f32>().unwrap()
                    }
                })
                .collect()
        };
        let (wgpu, cpu) = (run_on(false), run_on(true));
        assert_eq!(wgpu, cpu);
        assert_ne!(wgpu[0], wgpu[1], "two calls, two masks");
        let bare = Tensor::<burn::backend::Wgpu, 2>::from_data(
            TensorData::new(values.clone(), [30, 100]),
            &Default::default(),
        );
        assert!(on_device(bare.clone(), Rule::new(1, 0.5)).is_err());
        assert_eq!(dropout.forward(bare).into_data().into_vec::<f32>().unwrap(), values);
    }
}
