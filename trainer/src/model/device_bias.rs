//! A linear layer's bias added to its product's rows, as one operation on the CubeCL backends
//! (wgpu, CUDA; fused or not), whose backward sums the rows of the output's gradient in passes
//! (`device_sum`).
//!
//! As Burn's broadcast addition the bias's gradient is Burn's reduction over the rows, one unit
//! per column walking every row: on an H200 that and the other reductions over a leading axis
//! took 17 % of a 0.6B step's device time (bench/RESULTS.md, "The step on the device"). Here the
//! forward is one kernel and the backward one pass of partial sums per 64-fold of rows (two at
//! the 0.6B preset), the input's gradient being the output's own (no copy).
//!
//! In f32 the kernel runs inside the linear layer's own operation (`device_matmul::linear`:
//! the product and the bias one operation each way); this operation of its own adds the bias
//! to mixed precision's products (`device_mixed`).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 tensors; `None` elsewhere, and the caller adds Burn's way.
//!
//! Invariants: `y[r, c] = x[r, c] + b[c]`; the input's gradient is the output's (the same
//! tensor), the bias's the sum of its rows, computed only where the bias is tracked.

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
use super::device_sum::DeviceSum;
use super::host_depthwise::{float, same};

/// One unit per element of `y` `[.., cols]`: `y = x + b[column]`.
#[cube(launch)]
pub fn bias_add(x: &Array<f32>, b: &Array<f32>, y: &mut Array<f32>, cols: u32, units: u32) {
    let pos = unit_index();
    if pos < units {
        y[pos as usize] = x[pos as usize] + b[(pos % cols) as usize];
    }
}

/// The bias added as one kernel: the backends that have it.
pub trait DeviceBias: DeviceSum {
    /// `x` `[.., cols]` plus `b` `[cols]` on every row (the leading axes are the rows).
    fn bias_add(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl<R, F, I, BT> DeviceBias for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn bias_add(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, b) = (contiguous(x), contiguous(b));
        let dims = x.shape().to_vec();
        let (client, device) = (x.client.clone(), x.device.clone());
        let y = empty::<R>(&client, &device, dims.clone());
        let units = dims.iter().product::<usize>();
        if units > 0 {
            bias_add::launch::<R>(
                &client,
                grid(units),
                CubeDim::new_1d(CUBE),
                x.into_array_arg(),
                b.into_array_arg(),
                y.clone().into_array_arg(),
                dims.last().copied().unwrap_or(1) as u32,
                units as u32,
            );
        }
        y
    }
}

impl<B> DeviceBias for Fusion<B>
where
    B: FusionBackend + DeviceBias,
{
    fn bias_add(x: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), DType::F32);
        let [y] = in_stream::<B, _, 2, 1>("bias_add", [x, b], [out], |[x, b]| [B::bias_add(x, b)]);
        y
    }
}

/// The addition, as a [`DeviceOp`] of the rows and the bias.
#[derive(Debug, Clone, Copy)]
struct BiasAdd;

impl<B: DeviceBias> DeviceBackward<B, 2> for BiasAdd {
    type Saved = ();

    fn backward(&self, _: (), dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        let db = bias_grad::<B>(dy.clone());
        [dy, db]
    }

    fn backward_tracked(
        &self,
        _: (),
        dy: FloatTensor<B>,
        [want_x, want_b]: [bool; 2],
    ) -> [Option<FloatTensor<B>>; 2] {
        let db = want_b.then(|| bias_grad::<B>(dy.clone()));
        [want_x.then_some(dy), db]
    }
}

/// The bias's gradient: the rows of `dy` `[.., cols]` summed, `[cols]`, one operation (here
/// and in `device_matmul`'s linear layer).
pub(crate) fn bias_grad<B: DeviceBias>(dy: FloatTensor<B>) -> FloatTensor<B> {
    let cols = dy.shape().as_slice().last().copied().unwrap_or(1);
    B::sum_rows(dy, vec![cols])
}

impl<B: DeviceBias> DeviceOp<B, 2> for BiasAdd {
    fn forward(&self, [x, b]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, ()) {
        (B::bias_add(x, b), ())
    }
}

/// `x` `[.., cols]` plus `b` `[cols]` on every row, as one operation where the backend is one
/// of the trainer's CubeCL types (bare or under autodiff) and the tensors are f32; `x` given
/// back elsewhere. `x` is taken, not borrowed: the callers add the bias to a product they
/// made, whose last handle the addition then holds (under fusion, queued read-write), where a
/// clone left the caller's to be dropped after, a drop operation of fusion's stream (168 a step
/// at bench/fusion_ops.sh's preset; bench/RESULTS.md, 2026-12-01, "The old parameters
/// released").
pub fn on_device<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    b: &Tensor<B, 1>,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    if D == 0
        || x.dims()[D - 1] != b.dims()[0]
        || x.dtype() != DType::F32
        || b.dtype() != DType::F32
    {
        return Err(x);
    }
    on_cube_types!(B, T, { Ok(same(tracked::<T, D>(same(x), same(b.clone())))) }, {
        Ok(same(bare::<T, D>(same(x), same(b.clone()))))
    });
    Err(x)
}

/// The addition under autodiff: one node with the rows and the bias as parents.
fn tracked<B: DeviceBias, const D: usize>(
    x: Tensor<Autodiff<B>, D>,
    b: Tensor<Autodiff<B>, 1>,
) -> Tensor<Autodiff<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(device_op::tracked(
        BiasAdd,
        [float(x), float(b)],
    )))
}

/// The addition without autodiff (evaluation).
fn bare<B: DeviceBias, const D: usize>(x: Tensor<B, D>, b: Tensor<B, 1>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(B::bias_add(float(x), float(b))))
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::device_op::relative_difference as difference;
    use burn::tensor::Distribution;

    /// The operation against Burn's broadcast addition on the same backend, with its gradients
    /// under a weighted sum of the outputs, at a width of one column and of several cubes, with
    /// enough rows for two passes of the bias's sum; and with the bias alone tracked. Returns
    /// the output's and the input gradient's difference from Burn's, and the bias gradient's
    /// largest error against float64 sums relative to the largest of them, ours and Burn's.
    fn against_burn<B: DeviceBias>(rows: usize, cols: usize) -> [f64; 4] {
        let device = Default::default();
        B::seed(&device, 3);
        type A<B> = Autodiff<B>;
        let x = Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), &device);
        let b = Tensor::<B, 1>::random([cols], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), &device);
        let run = |ours: bool| {
            let xa = Tensor::<A<B>, 2>::from_inner(x.clone()).require_grad();
            let ba = Tensor::<A<B>, 1>::from_inner(b.clone()).require_grad();
            let y = if ours {
                on_device(xa.clone(), &ba).expect("wgpu takes the device addition")
            } else {
                xa.clone() + ba.clone().unsqueeze_dim::<2>(0)
            };
            let grads = (y.clone() * Tensor::from_inner(w.clone())).sum().backward();
            (y.inner(), xa.grad(&grads).unwrap(), ba.grad(&grads).unwrap())
        };
        let (y, dx, db) = run(true);
        let (y0, dx0, db0) = run(false);
        // The bias alone tracked: its gradient as before.
        let ba = Tensor::<A<B>, 1>::from_inner(b.clone()).require_grad();
        let y1 = on_device(Tensor::<A<B>, 2>::from_inner(x.clone()), &ba).unwrap();
        let grads = (y1 * Tensor::from_inner(w.clone())).sum().backward();
        assert_eq!(
            ba.grad(&grads).unwrap().into_data().into_vec::<f32>().unwrap(),
            db.clone().into_data().into_vec::<f32>().unwrap()
        );
        let bare = on_device(x.clone(), &b).expect("bare wgpu too");
        assert_eq!(
            bare.into_data().into_vec::<f32>().unwrap(),
            y0.clone().into_data().into_vec::<f32>().unwrap(),
            "the addition is exact either way"
        );
        // The bias's gradient is the column sums of the weights (the output's gradient).
        let w = w.into_data().into_vec::<f32>().unwrap();
        let want: Vec<f64> =
            (0..cols).map(|c| (0..rows).map(|r| f64::from(w[r * cols + c])).sum()).collect();
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let error = |got: Tensor<B, 1>| {
            let got = got.into_data().into_vec::<f32>().unwrap();
            got.iter().zip(&want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max)
                / scale
        };
        [f64::from(difference(y, y0)), f64::from(difference(dx, dx0)), error(db), error(db0)]
    }

    /// Rows with leading axes, `[3, 50, 7]`: the output and both gradients are those of the
    /// same rows as `[150, 7]`, bit for bit (the same kernels over the same memory), bare and
    /// fused.
    #[test]
    fn leading_axes_are_rows() {
        fn check<B: DeviceBias>() {
            let device = Default::default();
            type A<B> = Autodiff<B>;
            let random = |dims: [usize; 3]| {
                Tensor::<B, 3>::random(dims, Distribution::Normal(0.0, 1.0), &device)
            };
            let (x, w) = (random([3, 50, 7]), random([3, 50, 7]));
            let b = Tensor::<B, 1>::random([7], Distribution::Normal(0.0, 1.0), &device);
            let values = |t: Tensor<B, 1>| t.into_data().into_vec::<f32>().unwrap();
            let flat = |t: Tensor<B, 3>| values(t.reshape([3 * 50 * 7]));
            let ba = Tensor::<A<B>, 1>::from_inner(b.clone()).require_grad();
            let xa = Tensor::<A<B>, 3>::from_inner(x.clone()).require_grad();
            let y = on_device(xa.clone(), &ba).expect("wgpu takes the device addition");
            let grads = (y.clone() * Tensor::from_inner(w.clone())).sum().backward();
            let (dx, db) = (xa.grad(&grads).unwrap(), ba.grad(&grads).unwrap());
            let ba = Tensor::<A<B>, 1>::from_inner(b.clone()).require_grad();
            let xa = Tensor::<A<B>, 2>::from_inner(x.clone().reshape([150, 7])).require_grad();
            let y2 = on_device(xa.clone(), &ba).unwrap();
            let grads = (y2.clone() * Tensor::from_inner(w.reshape([150, 7]))).sum().backward();
            let (dx2, db2) = (xa.grad(&grads).unwrap(), ba.grad(&grads).unwrap());
            assert_eq!(y.dims(), [3, 50, 7]);
            assert_eq!(flat(y.clone().inner()), values(y2.inner().reshape([150 * 7])));
            assert_eq!(flat(dx), values(dx2.reshape([150 * 7])));
            assert_eq!(values(db), values(db2));
            assert_eq!(flat(on_device(x.clone(), &b).unwrap()), flat(y.inner()), "bare");
        }
        check::<burn::backend::Wgpu>();
        check::<Fusion<burn::backend::Wgpu>>();
    }

    #[test]
    fn matches_burn_s_broadcast_addition_and_its_gradients_on_wgpu_with_and_without_fusion() {
        let cases = [
            ("wgpu, 1 column", against_burn::<burn::backend::Wgpu>(300, 1)),
            ("wgpu, 600 columns", against_burn::<burn::backend::Wgpu>(5000, 600)),
            ("fused wgpu, 600 columns", against_burn::<Fusion<burn::backend::Wgpu>>(5000, 600)),
        ];
        for (name, d) in cases {
            eprintln!(
                "{name}: y {:.1e}, dx {:.1e}, db against float64 {:.1e} (Burn's {:.1e})",
                d[0], d[1], d[2], d[3]
            );
            assert_eq!(d[0], 0.0, "{name}: the output");
            assert_eq!(d[1], 0.0, "{name}: the input's gradient is the output's");
            // Measured 8.6e-7 at one column of 300 rows, 2.1e-7 at 600 columns of 5000 rows
            // (Burn's sums 4.3e-7 and 2.1e-6). Bound: near the largest.
            assert!(d[2] <= 1.2e-6, "{name}: the bias's gradient is off by {:.2e}", d[2]);
        }
    }
}
