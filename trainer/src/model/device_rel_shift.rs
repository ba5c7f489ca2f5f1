//! The attention's relative shift (`encoder::rel_shift`) as one operation on the CubeCL
//! backends (wgpu, CUDA; fused or not).
//!
//! Its tensor form is a zero column, a concatenation, two reshapes (one of a sliced view, a
//! copy) and two slices: about five launches forward and about eight backward, once per
//! Conformer layer, and a GPU step is bound by the host's cost per launch (bench/RESULTS.md,
//! "Fewer launches per Conformer layer"). It only moves values: each output element is one
//! input element. Here it is one kernel forward (a gather) and one backward (the gather's
//! transpose, zeros where no output read the input).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller runs the tensor form.
//!
//! Invariants: for `x` `[B, H, T, 2T - 1]` (scores against positions `T - 1 .. -(T - 1)`),
//! `y[b, h, i, j] = x[b, h, i, T - 1 - i + j]` `[B, H, T, T]` (key `j` of query `i` is position
//! `i - j`); the backward keeps only the input's shape.

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
    self, contiguous, empty, grid, on_cube_types, unit_index, DeviceBackward, DeviceOp, CUBE,
};
use super::host_depthwise::{cast, float};

/// One unit per element of `y` `[rows, T, T]` over `x` `[rows, T, 2T - 1]`.
#[cube(launch)]
pub fn rel_shift_forward(x: &Array<f32>, y: &mut Array<f32>, t: u32, units: u32) {
    let pos = unit_index();
    if pos < units {
        let j = pos % t;
        let row = pos / t; // (b, h, i)
        let i = row % t;
        let n = 2 * t - 1;
        y[pos as usize] = x[(row * n + t - 1 - i + j) as usize];
    }
}

/// One unit per element of `dx` `[rows, T, 2T - 1]`: the output gradient that read it, or zero.
#[cube(launch)]
pub fn rel_shift_backward(dy: &Array<f32>, dx: &mut Array<f32>, t: u32, units: u32) {
    let pos = unit_index();
    if pos < units {
        let n = 2 * t - 1;
        let p = pos % n;
        let row = pos / n;
        let i = row % t;
        // Output column `j = p - (T - 1) + i`, in range when `T - 1 - i <= p < 2T - 1 - i`.
        let mut g = 0.0f32;
        if p + i >= t - 1 && p + i < n {
            g = dy[(row * t + p + i + 1 - t) as usize];
        }
        dx[pos as usize] = g;
    }
}

/// The shift as one operation (see the module): the backends that have it.
pub trait DeviceRelShift: Backend {
    /// `x` `[B, H, T, 2T - 1]` shifted to `[B, H, T, T]`.
    fn rel_shift_forward(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradient of `x` (of `dims`) from the output's gradient `dy`.
    fn rel_shift_backward(dims: [usize; 4], dy: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl<R, F, I, BT> DeviceRelShift for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rel_shift_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let [b, h, t, _] = x.shape().dims::<4>();
        let x = contiguous(x);
        let client = x.client.clone();
        let y = empty::<R>(&client, &x.device, vec![b, h, t, t]);
        let units = b * h * t * t;
        // Each unit reads one element of its own row of `x`; the checked launch bounds every
        // access anyway.
        rel_shift_forward::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            x.into_array_arg(),
            y.clone().into_array_arg(),
            t as u32,
            units as u32,
        );
        y
    }

    fn rel_shift_backward(dims: [usize; 4], dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let dy = contiguous(dy);
        let client = dy.client.clone();
        let dx = empty::<R>(&client, &dy.device, dims.to_vec());
        let units = dims.iter().product::<usize>();
        rel_shift_backward::launch::<R>(
            &client,
            grid(units),
            CubeDim::new_1d(CUBE),
            dy.into_array_arg(),
            dx.clone().into_array_arg(),
            dims[2] as u32,
            units as u32,
        );
        dx
    }
}

impl<B> DeviceRelShift for Fusion<B>
where
    B: FusionBackend + DeviceRelShift,
{
    fn rel_shift_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        // [rows.., T, 2T - 1] -> [rows.., T, T]
        let mut dims = x.shape.to_vec();
        let t = dims.iter().rev().nth(1).copied().unwrap_or(0);
        if let Some(last) = dims.last_mut() {
            *last = t;
        }
        let [y] = in_stream::<B, _, 1, 1>("rel_shift_forward", [x], [(dims, DType::F32)], |[x]| {
            [B::rel_shift_forward(x)]
        });
        y
    }

    fn rel_shift_backward(dims: [usize; 4], dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (dims.to_vec(), DType::F32);
        let [dx] = in_stream::<B, _, 1, 1>("rel_shift_backward", [dy], [out], move |[dy]| {
            [B::rel_shift_backward(dims, dy)]
        });
        dx
    }
}

/// The shift as a [`DeviceOp`] of its input, keeping the input's shape.
#[derive(Debug, Clone, Copy)]
struct RelShift;

impl<B: DeviceRelShift> DeviceBackward<B, 1> for RelShift {
    type Saved = [usize; 4];

    fn backward(&self, dims: [usize; 4], dy: FloatTensor<B>) -> [FloatTensor<B>; 1] {
        [B::rel_shift_backward(dims, dy)]
    }
}

impl<B: DeviceRelShift> DeviceOp<B, 1> for RelShift {
    fn forward(&self, [x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, [usize; 4]) {
        let dims = x.shape().dims::<4>();
        (B::rel_shift_forward(x), dims)
    }
}

/// The shift under autodiff: one node with the input as parent.
fn tracked<B: DeviceRelShift>(x: Tensor<Autodiff<B>, 4>) -> Tensor<Autodiff<B>, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(RelShift, [float(x)])))
}

/// The shift without autodiff (evaluation).
fn bare<B: DeviceRelShift>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(B::rel_shift_forward(float(x))))
}

/// `x` `[B, H, T, 2T - 1]` shifted to `[B, H, T, T]` (see the module) as one operation where the
/// backend is one of the trainer's CubeCL types (bare or under autodiff) and `x` f32; `None`
/// elsewhere.
pub fn on_device<B: Backend>(x: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    let [_, _, t, n] = x.dims();
    if t == 0 || n != 2 * t - 1 || x.dtype() != DType::F32 {
        return None;
    }
    on_cube_types!(B, T, { cast(tracked::<T>(cast(x.clone())?)) }, {
        cast(bare::<T>(cast(x.clone())?))
    });
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::encoder::rel_shift_tensor_form;
    use burn::tensor::Distribution;

    /// The operation against the tensor form on the same backend, for one and several frames:
    /// the outputs and the input's gradient under a weighted sum of the outputs must be the same
    /// bits (both only move values; the backward adds nothing to a gradient).
    fn against_the_tensor_form<B: DeviceRelShift>(t: usize) {
        let device = Default::default();
        B::seed(&device, 5);
        let dims = [2, 3, t, 2 * t - 1];
        let x = Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), &device);
        let weights = Tensor::<B, 4>::random([2, 3, t, t], Distribution::Normal(0.0, 1.0), &device);
        type A<B> = Autodiff<B>;
        let run = |device_form: bool| {
            let xa = Tensor::<A<B>, 4>::from_inner(x.clone()).require_grad();
            let out = if device_form {
                tracked::<B>(xa.clone())
            } else {
                rel_shift_tensor_form(xa.clone(), t)
            };
            let grads = (out.clone() * Tensor::from_inner(weights.clone())).sum().backward();
            let values = |t: Tensor<B, 4>| t.into_data().into_vec::<f32>().unwrap();
            (values(out.inner()), values(xa.grad(&grads).unwrap()))
        };
        let (y, dx) = run(true);
        let (y0, dx0) = run(false);
        assert_eq!(y, y0, "{t} frames: outputs");
        assert_eq!(dx, dx0, "{t} frames: input gradients");
        assert_eq!(bare::<B>(x).into_data().into_vec::<f32>().unwrap(), y, "{t} frames: bare");
    }

    #[test]
    fn equals_the_tensor_form_and_its_gradient_on_wgpu_with_and_without_fusion() {
        for t in [1, 2, 37] {
            against_the_tensor_form::<burn::backend::Wgpu>(t);
            against_the_tensor_form::<Fusion<burn::backend::Wgpu>>(t);
        }
    }
}
