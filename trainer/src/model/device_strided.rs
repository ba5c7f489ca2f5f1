//! The subsampling's 3x3 stride-2 convolutions (`conv::Conv3x3S2`: from one input channel, or
//! depthwise; padding 1, channels last) as one operation on the CubeCL backends (wgpu, CUDA;
//! fused or not).
//!
//! Their tensor forms cut the input into nine strided views (reshapes, slices, a zero row and a
//! concatenation per dimension and row, copies on the device) and sum the views times the
//! weight's rows, or concatenate them into a product for one input channel: about forty launches
//! forward per convolution and twice as many backward (each slice's gradient a zero-filled
//! tensor and a slice assignment). The subsampling runs three such convolutions per step, on the
//! encoder's largest tensors, and a GPU step is bound by the host's cost per launch
//! (bench/RESULTS.md). Here: one kernel forward; backward one kernel for the input's gradient
//! (none when the input takes none, as the spectrogram), one for partial sums of the weight's
//! and bias's gradients over blocks of output positions, and Burn's sum over the blocks.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the tensor forms.
//!
//! Invariants: for `x` `[B, H, W, Cin]` (`Cin` 1 or `C`), `weight` `[9, C]` (tap `3 r + k`) and
//! `bias` `[C]`, the output `y` `[B, ceil(H/2), ceil(W/2), C]` at `(b, i, j, c)` is the sum over
//! the taps of `weight[3 r + k, c] x[b, 2i + r - 1, 2j + k - 1, c']`, plus `bias[c]`, with
//! `c' = 0` for one input channel and `c` otherwise, and positions outside the input read as
//! zero; the terms are added in tap order and the bias last (the depthwise tap form's order).
//! The backward keeps the input and the weight (shared, not copied).

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
    self, contiguous, empty, grid, on_cube_types, unit_index, DeviceBackward, CUBE,
};
use super::host_depthwise::{cast, float};

/// Output positions (over all items) per partial sum of the weight's and bias's gradients.
const ROWS: usize = 32;

/// Output length of a stride-2, kernel-3, padding-1 dimension of `n`.
fn out_len(n: usize) -> usize {
    n.div_ceil(2)
}

/// Element `pos` of a row-major `[B, rows, cols, channels]` as `(b, row, col, channel)`.
#[cube]
fn split(pos: u32, rows: u32, cols: u32, channels: u32) -> (u32, u32, u32, u32) {
    let rest = pos / channels;
    (rest / (cols * rows), (rest / cols) % rows, rest % cols, pos % channels)
}

/// One unit per element of `y` `[B, OH, OW, C]` over `x` `[B, H, W, Cin]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn strided_forward(
    x: &Array<f32>,
    weight: &Array<f32>,
    bias: &Array<f32>,
    y: &mut Array<f32>,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    cin: u32,
    channels: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let (b, i, j, c) = split(pos, oh, ow, channels);
        let mut ci = c;
        if cin == 1 {
            ci = 0;
        }
        let mut acc = 0.0f32;
        for r in 0..3u32 {
            // Input row `2i + r - 1`, in range when `1 <= 2i + r <= H`.
            let s = 2 * i + r;
            if s >= 1 && s <= h {
                for k in 0..3u32 {
                    let u = 2 * j + k;
                    if u >= 1 && u <= w {
                        let at = (((b * h + s - 1) * w + u - 1) * cin + ci) as usize;
                        acc += x[at] * weight[((r * 3 + k) * channels + c) as usize];
                    }
                }
            }
        }
        y[pos as usize] = acc + bias[c as usize];
    }
}

/// One unit per element of `dx` `[B, H, W, Cin]`: the output gradients that read it times their
/// taps' weights (over every output channel for one input channel).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn strided_backward_input(
    dy: &Array<f32>,
    weight: &Array<f32>,
    dx: &mut Array<f32>,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    cin: u32,
    channels: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < units {
        let (b, s, u, ci) = split(pos, h, w, cin);
        // One input channel: every output channel read it; else its own.
        let mut first = ci;
        let mut last = ci + 1;
        if cin == 1 {
            first = 0;
            last = channels;
        }
        let mut acc = 0.0f32;
        for r in 0..3u32 {
            // Output row `i` read input row `s` with tap `r` when `2i + r - 1 = s`.
            let twice = s + 1;
            if twice >= r && (twice - r) & 1 == 0 && (twice - r) / 2 < oh {
                let i = (twice - r) / 2;
                for k in 0..3u32 {
                    let twice_u = u + 1;
                    if twice_u >= k && (twice_u - k) & 1 == 0 && (twice_u - k) / 2 < ow {
                        let j = (twice_u - k) / 2;
                        let out = ((b * oh + i) * ow + j) * channels;
                        for c in first..last {
                            acc += dy[(out + c) as usize]
                                * weight[((r * 3 + k) * channels + c) as usize];
                        }
                    }
                }
            }
        }
        dx[pos as usize] = acc;
    }
}

/// One unit per `(tap or bias, block, channel)`: tap `t < 9`'s weight gradient (`dy` times the
/// input the tap read) or, at `t = 9`, the bias's (`dy`), summed over the block's output
/// positions, to `parts[t, block, channel]` of `[10, blocks, C]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn strided_backward_params(
    x: &Array<f32>,
    dy: &Array<f32>,
    parts: &mut Array<f32>,
    rows: u32,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    cin: u32,
    channels: u32,
    blocks: u32,
    block_rows: u32,
) {
    let pos = unit_index();
    if pos < 10 * blocks * channels {
        let c = pos % channels;
        let block = (pos / channels) % blocks;
        let tap = pos / (channels * blocks);
        let r = tap / 3;
        let k = tap % 3;
        let mut ci = c;
        if cin == 1 {
            ci = 0;
        }
        let begin = block * block_rows;
        let end = u32::min(begin + block_rows, rows);
        let mut acc = 0.0f32;
        for row in begin..end {
            let g = dy[(row * channels + c) as usize];
            if tap == 9 {
                acc += g;
            } else {
                let j = row % ow;
                let i = (row / ow) % oh;
                let b = row / (ow * oh);
                let s = 2 * i + r;
                let u = 2 * j + k;
                if s >= 1 && s <= h && u >= 1 && u <= w {
                    acc += g * x[(((b * h + s - 1) * w + u - 1) * cin + ci) as usize];
                }
            }
        }
        parts[pos as usize] = acc;
    }
}

/// What the forward keeps for the backward: the input and the weight.
#[derive(Debug, Clone)]
pub struct Saved<B: Backend> {
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
}

/// The convolution as one operation (see the module): the backends that have it.
pub trait DeviceStrided: Backend {
    /// The convolution of `x` `[B, H, W, Cin]` with `weight` `[9, C]` and `bias` `[C]`.
    fn strided_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// The gradients of the input (`None` when `input_grad` is false), the weight and the bias
    /// from the output's gradient `dy`.
    fn strided_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        input_grad: bool,
    ) -> (Option<FloatTensor<Self>>, FloatTensor<Self>, FloatTensor<Self>);
}

impl<R, F, I, BT> DeviceStrided for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn strided_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [b, h, w, cin] = x.shape().dims::<4>();
        let c = weight.shape().dims::<2>()[1];
        let (oh, ow) = (out_len(h), out_len(w));
        let (x, weight, bias) = (contiguous(x), contiguous(weight), contiguous(bias));
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, vec![b, oh, ow, c]);
        let units = b * oh * ow * c;
        // Every index the kernel reads lies within `x`, `weight` and `bias` for the units it runs
        // (the others return at once); the checked launch bounds every access anyway.
        strided_forward::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            weight.into_array_arg(),
            bias.into_array_arg(),
            y.clone().into_array_arg(),
            h as u32,
            w as u32,
            oh as u32,
            ow as u32,
            cin as u32,
            c as u32,
            units as u32,
        );
        y
    }

    fn strided_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        input_grad: bool,
    ) -> (Option<FloatTensor<Self>>, FloatTensor<Self>, FloatTensor<Self>) {
        let Saved { x, weight } = saved;
        let [b, h, w, cin] = x.shape().dims::<4>();
        let c = weight.shape().dims::<2>()[1];
        let (oh, ow) = (out_len(h), out_len(w));
        let (x, weight, dy) = (contiguous(x), contiguous(weight), contiguous(dy));
        let client = dy.client.clone();
        let device = dy.device.clone();
        let arg = |v: usize| v as u32;
        let dx = input_grad.then(|| {
            let dx = empty::<R>(&client, &device, vec![b, h, w, cin]);
            let units = b * h * w * cin;
            strided_backward_input::launch::<R>(
                &client,
                grid(units),
                CubeDim::new_1d(CUBE),
                dy.clone().into_array_arg(),
                weight.into_array_arg(),
                dx.clone().into_array_arg(),
                arg(h),
                arg(w),
                arg(oh),
                arg(ow),
                arg(cin),
                arg(c),
                arg(units),
            );
            dx
        });
        let rows = b * oh * ow;
        let blocks = rows.div_ceil(ROWS).max(1);
        let parts = empty::<R>(&client, &device, vec![10, blocks, c]);
        // Every unit writes its partial sum (zero for an empty block, only when there are no
        // output positions).
        strided_backward_params::launch::<R>(
            &client,
            grid(10 * blocks * c),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            dy.into_array_arg(),
            parts.clone().into_array_arg(),
            arg(rows),
            arg(h),
            arg(w),
            arg(oh),
            arg(ow),
            arg(cin),
            arg(c),
            arg(blocks),
            arg(ROWS),
        );
        let (dw, db) = device_op::weight_and_bias_sums::<Self>(parts, 9, c);
        (dx, dw, db)
    }
}

impl<B> DeviceStrided for Fusion<B>
where
    B: FusionBackend + DeviceStrided,
{
    fn strided_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [b, h, w, _] = x.shape().dims::<4>();
        let c = weight.shape().dims::<2>()[1];
        let out = vec![b, out_len(h), out_len(w), c];
        let [y] = in_stream::<B, _, 3, 1>(
            "strided_forward",
            [x, weight, bias],
            [(out, DType::F32)],
            |[x, weight, bias]| [B::strided_forward(x, weight, bias)],
        );
        y
    }

    fn strided_backward(
        saved: Saved<Self>,
        dy: FloatTensor<Self>,
        input_grad: bool,
    ) -> (Option<FloatTensor<Self>>, FloatTensor<Self>, FloatTensor<Self>) {
        let channels = saved.weight.shape.to_vec().last().copied().unwrap_or(1);
        let dx = (saved.x.shape.to_vec(), DType::F32);
        let dw = (saved.weight.shape.to_vec(), DType::F32);
        let db = (vec![channels], DType::F32);
        let Saved { x, weight } = saved;
        // Two arms: `in_stream`'s outputs are fixed in number, and without an input gradient
        // there is no `dx` to declare.
        if input_grad {
            let [dx, dw, db] = in_stream::<B, _, 3, 3>(
                "strided_backward",
                [x, weight, dy],
                [dx, dw, db],
                |[x, weight, dy]| match B::strided_backward(Saved { x, weight }, dy, true) {
                    (Some(dx), dw, db) => [dx, dw, db],
                    (None, ..) => unreachable!("strided_backward: asked for dx, given none"),
                },
            );
            (Some(dx), dw, db)
        } else {
            let [dw, db] = in_stream::<B, _, 3, 2>(
                "strided_backward",
                [x, weight, dy],
                [dw, db],
                |[x, weight, dy]| {
                    let (_, dw, db) = B::strided_backward(Saved { x, weight }, dy, false);
                    [dw, db]
                },
            );
            (None, dw, db)
        }
    }
}

/// The convolution's backward, a [`DeviceBackward`] of the input, the weight and the bias;
/// `input_grad` says whether the input takes a gradient.
#[derive(Debug, Clone, Copy)]
struct StridedBackward {
    input_grad: bool,
}

impl<B: DeviceStrided> DeviceBackward<B, 3> for StridedBackward {
    type Saved = Saved<B>;

    fn backward(&self, saved: Saved<B>, dy: FloatTensor<B>) -> [FloatTensor<B>; 3] {
        let (dx, dw, db) = B::strided_backward(saved, dy.clone(), self.input_grad);
        // Without an input gradient the input is not a tracked parent, so what stands in its
        // place is never registered: the output's gradient, a handle already held.
        [dx.unwrap_or(dy), dw, db]
    }
}

/// The convolution under autodiff: one node with the input, the weight and the bias as parents.
fn tracked<B: DeviceStrided>(
    x: Tensor<Autodiff<B>, 4>,
    weight: Tensor<Autodiff<B>, 2>,
    bias: Tensor<Autodiff<B>, 1>,
) -> Tensor<Autodiff<B>, 4> {
    let inputs = [float(x), float(weight), float(bias)];
    // Whether the input is a tracked parent (`is_require_grad` is true for leaves only).
    let input_grad = !inputs[0].node.requirement.is_none();
    let op = StridedBackward { input_grad };
    let y = device_op::tracked_with(op, inputs, |_, [x, weight, bias]| {
        (B::strided_forward(x.clone(), weight.clone(), bias), Saved { x, weight })
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The convolution without autodiff (evaluation).
fn bare<B: DeviceStrided>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 2>,
    bias: Tensor<B, 1>,
) -> Tensor<B, 4> {
    let y = B::strided_forward(float(x), float(weight), float(bias));
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// The 3x3 stride-2 convolution of `x` `[B, H, W, 1 or C]` with `weight` `[9, C]` and `bias`
/// `[C]` (see the module), as one operation where the backend is one of the trainer's CubeCL
/// types (bare or under autodiff) and the tensors f32; `None` elsewhere.
pub fn on_device<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 2>,
    bias: &Tensor<B, 1>,
) -> Option<Tensor<B, 4>> {
    let [nine, c] = weight.dims();
    let [b, h, w, cin] = x.dims();
    if nine != 9
        || !(cin == 1 || cin == c)
        || bias.dims()[0] != c
        || [x.dtype(), weight.dtype(), bias.dtype()].iter().any(|d| *d != DType::F32)
        || (b * h * w * cin).max(b * out_len(h) * out_len(w) * c) > u32::MAX as usize
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
    use crate::model::conv::Conv3x3S2;
    use crate::model::device_op::relative_difference as difference;
    use burn::tensor::Distribution;

    /// The operation against the tensor form (`Conv3x3S2::tap_form`) on the same backend: the
    /// outputs, and the gradients of the input, the weight and the bias under a weighted sum of
    /// the outputs.
    fn against_the_tensor_form<B: DeviceStrided>(dims: [usize; 4], c: usize) -> [f32; 4] {
        let device = Default::default();
        B::seed(&device, 17);
        let x = Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), &device);
        let [b, h, w, _] = dims;
        let out = [b, out_len(h), out_len(w), c];
        let weights = Tensor::<B, 4>::random(out, Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let conv = Conv3x3S2::<A<B>>::new(c, &device);
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 4>::from_inner(x.clone()).require_grad();
            let (wt, bias) = (conv.weight.val(), conv.bias.val());
            // An intermediate input (the second stage's), not a leaf: its gradient must flow on.
            let xin = xa.clone().mul_scalar(1.0);
            let y = if device_form {
                tracked::<B>(xin, wt.clone(), bias.clone())
            } else {
                conv.tap_form(xin)
            };
            let grads = (y.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let (dw, db) = (wt.grad(&grads).unwrap(), bias.grad(&grads).unwrap());
            (y.inner(), xa.grad(&grads).unwrap(), dw, db)
        };
        let (y, dx, dw, db) = run(true);
        let (y0, dx0, dw0, db0) = run(false);
        // Without an input gradient (the spectrogram's case) the parameters' are the same bits.
        let xa = Tensor::<A<B>, 4>::from_inner(x.clone());
        let (wt, bias) = (conv.weight.val(), conv.bias.val());
        let out = tracked::<B>(xa, wt.clone(), bias.clone());
        let grads = (out * Tensor::from_inner(weights.clone())).sum().backward();
        let values = |t: Tensor<B, 2>| t.into_data().into_vec::<f32>().unwrap();
        assert_eq!(values(wt.grad(&grads).unwrap()), values(dw.clone()));
        let db_alone = bias.grad(&grads).unwrap().into_data().into_vec::<f32>().unwrap();
        assert_eq!(db_alone, db.clone().into_data().into_vec::<f32>().unwrap());
        let bare_y = bare::<B>(x, conv.weight.val().inner(), conv.bias.val().inner());
        assert_eq!(
            bare_y.into_data().into_vec::<f32>().unwrap(),
            y.clone().into_data().into_vec::<f32>().unwrap()
        );
        [difference(y, y0), difference(dx, dx0), difference(dw, dw0), difference(db, db0)]
    }

    #[test]
    fn matches_the_tensor_forms_and_their_gradients_on_wgpu_with_and_without_fusion() {
        type Wgpu = burn::backend::Wgpu;
        type Fused = Fusion<Wgpu>;
        // Depthwise and from one channel; even and odd sizes; one row; more output positions
        // than a block of the partial sums.
        let cases = [
            ("wgpu, depthwise 2x7x9x6", against_the_tensor_form::<Wgpu>([2, 7, 9, 6], 6)),
            ("wgpu, depthwise 1x1x4x3", against_the_tensor_form::<Wgpu>([1, 1, 4, 3], 3)),
            ("wgpu, one channel 2x10x13x5", against_the_tensor_form::<Wgpu>([2, 10, 13, 1], 5)),
            ("fused, depthwise 2x7x9x6", against_the_tensor_form::<Fused>([2, 7, 9, 6], 6)),
            ("fused, one channel 2x10x13x5", against_the_tensor_form::<Fused>([2, 10, 13, 1], 5)),
        ];
        for (name, d) in &cases {
            eprintln!("{name}: y {:.1e}, dx {:.1e}, dw {:.1e}, db {:.1e}", d[0], d[1], d[2], d[3]);
        }
        // Measured (fused or not): outputs the same bits (the depthwise form's order of terms;
        // the one-channel product's too on lavapipe); gradients at most 1.2e-7, 1.6e-7, 2.6e-7
        // (f32 sums in another order). Bounds: the same bits, and 5x the largest.
        for (name, d) in cases {
            for (what, v, bound) in [
                ("output", d[0], 0.0),
                ("input gradient", d[1], 6e-7),
                ("weight gradient", d[2], 8e-7),
                ("bias gradient", d[3], 1.3e-6),
            ] {
                assert!(!v.is_nan(), "{name}: {what}: a NaN");
                assert!(v <= bound, "{name}: {what} differs by {v:.2e} (bound {bound:.1e})");
            }
        }
    }
}
