//! Mixed precision's matrix products as one operation on the CubeCL backends (wgpu, CUDA; fused
//! or not): `a · b` with both f32 operands rounded to the compute type (bfloat16 or float16) and
//! the product accumulated and written in f32 (`Precision::linear`, `Precision::matmul`).
//!
//! As Burn operations a product under mixed precision is three casts and the product forward
//! (each operand down, the product back up) and two casts more backward (each operand's
//! gradient back up, after the output's gradient down): nine launches where f32 takes three,
//! and a mixed-precision Conformer layer launched 228 kernels to f32's 141 (bench/RESULTS.md).
//! Here the forward is one kernel rounding both operands and one product writing f32, the
//! backward one kernel rounding the output's gradient and the two products, each writing f32:
//! five launches. The product is no longer rounded to the compute type on its way back to
//! f32, so the result is closer to the f32 product than the casts' (the half type's rounding
//! of the operands stays).
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare or
//! under autodiff, with f32 operands of 2 to 4 axes whose leading axes agree (or are 1 in `b`,
//! broadcast over `a`'s, as in the attention's position product), the two operands together
//! and the output under `2^32` elements; `None` elsewhere, and the caller casts with Burn. An
//! operand that is a permutation of a whole buffer (a transposed view) is rounded in memory
//! order and keeps its strides, so a transposed operand is not copied; any other view is
//! copied first.
//!
//! A product of two matrices (the linear layers' and their gradients) runs the kernel
//! `--matmul` chose where one is and it runs on the device (`device_matmul::chosen_product`:
//! cubek's strategies take the half type in and write f32); a stack of four axes (the
//! attention's) runs cuBLAS's strided-batched calls under `--matmul cublas` with
//! `ASRT_CUBLAS_STACKS=1` (`device_matmul::chosen_stacked`); Burn's product elsewhere.
//!
//! Invariants: `product(a, b) = f32(Σ_k half(a)[.., i, k] · half(b)[.., k, j])`, accumulated
//! in f32; the gradients are `f32(half(dy) · half(b)ᵀ)` and `f32(half(a)ᵀ · half(dy))`, a
//! broadcast `b`'s summed over the axes it was broadcast along; the backward keeps the rounded
//! operands (half the bytes of the f32 ones). Where the product kernel cannot write f32 from
//! the half type, the product is written in the half type and cast up (Burn's operations),
//! which is the casts' result.

use asr_tdt::fusion::in_stream;
use burn::backend::Autodiff;
use burn::prelude::*;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::matmul::{matmul, MatmulStrategy};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::device_op::{
    self, contiguous, grid, on_cube_types, unit_index, DeviceBackward, DeviceOp, CUBE,
};
use super::device_sum::DeviceSum;
use super::host_depthwise::{cast, float};

/// One unit per element of `a` and then of `b` (`units` = both counts): each rounded to `F`,
/// in memory order.
#[cube(launch)]
pub fn round_pair<F: cubecl::prelude::Float>(
    a: &Array<f32>,
    b: &Array<f32>,
    a_low: &mut Array<F>,
    b_low: &mut Array<F>,
    a_units: u32,
    units: u32,
) {
    let pos = unit_index();
    if pos < a_units {
        a_low[pos as usize] = F::cast_from(a[pos as usize]);
    } else if pos < units {
        let i = pos - a_units;
        b_low[i as usize] = F::cast_from(b[i as usize]);
    }
}

/// One unit per element of `x`: rounded to `F`, in memory order.
#[cube(launch)]
pub fn round_one<F: cubecl::prelude::Float>(x: &Array<f32>, x_low: &mut Array<F>, units: u32) {
    let pos = unit_index();
    if pos < units {
        x_low[pos as usize] = F::cast_from(x[pos as usize]);
    }
}

/// The operation (see the module): the backends that have it.
pub trait DeviceMixed: DeviceSum {
    /// `a` and `b` rounded to `dtype`, in one launch.
    fn round_pair(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dtype: FloatDType,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `x` rounded to `dtype`.
    fn round_one(x: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self>;

    /// `a · b` of two half-type operands, written in f32.
    fn product_f32(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `x` as a whole buffer: itself when its elements fill its buffer (contiguous, or a
/// permutation of contiguous axes), else a contiguous copy.
fn whole<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    if x.is_contiguous_buffer() {
        x
    } else {
        contiguous(x)
    }
}

/// A new, uninitialised buffer for `x`'s elements rounded to `dtype`, with `x`'s shape and
/// strides (so the kernels can write it in `x`'s memory order).
fn low_like<R: CubeRuntime>(x: &CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    let n = x.meta.shape().num_elements();
    let handle = x.client.empty(n * dtype.size());
    CubeTensor::new(x.client.clone(), handle, (*x.meta).clone(), x.device.clone(), dtype)
}

impl<R, F, I, BT> DeviceMixed for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn round_pair(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dtype: FloatDType,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (a, b) = (whole(a), whole(b));
        let (a_units, b_units) = (a.meta.shape().num_elements(), b.meta.shape().num_elements());
        let units = a_units + b_units;
        let client = a.client.clone();
        let a_low = low_like(&a, DType::from(dtype));
        let b_low = low_like(&b, DType::from(dtype));
        // Each unit reads and writes one element of one pair; the checked launch bounds every
        // access anyway.
        macro_rules! launch {
            ($e:ty) => {
                round_pair::launch::<$e, R>(
                    &client,
                    grid(units),
                    CubeDim::new_1d(CUBE),
                    a.into_array_arg(),
                    b.into_array_arg(),
                    a_low.clone().into_array_arg(),
                    b_low.clone().into_array_arg(),
                    a_units as u32,
                    units as u32,
                )
            };
        }
        match dtype {
            FloatDType::BF16 => launch!(burn::tensor::bf16),
            _ => launch!(burn::tensor::f16),
        }
        (a_low, b_low)
    }

    fn round_one(x: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        let x = whole(x);
        let units = x.meta.shape().num_elements();
        let client = x.client.clone();
        let x_low = low_like(&x, DType::from(dtype));
        macro_rules! launch {
            ($e:ty) => {
                round_one::launch::<$e, R>(
                    &client,
                    grid(units),
                    CubeDim::new_1d(CUBE),
                    x.into_array_arg(),
                    x_low.clone().into_array_arg(),
                    units as u32,
                )
            };
        }
        match dtype {
            FloatDType::BF16 => launch!(burn::tensor::bf16),
            _ => launch!(burn::tensor::f16),
        }
        x_low
    }

    fn product_f32(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        // `--matmul`'s kernel where one was chosen and runs here (two matrices: the linear
        // layers' products and their gradients; stacks of four axes under `cublas` with `ASRT_CUBLAS_STACKS=1`).
        super::device_matmul::chosen_product::<Self>(&a, &b)
            .or_else(|| super::device_matmul::chosen_stacked::<Self>(&a, &b))
            .unwrap_or_else(|| burn_product_f32::<R, F, I, BT>(a, b))
    }
}

/// `a · b` of half-type operands written in f32 by Burn's product kernel (cubek's `Auto`), or
/// where that kernel cannot write f32 from the half type, the half product cast up (what Burn's
/// casts would have given).
pub(crate) fn burn_product_f32<R, F, I, BT>(a: CubeTensor<R>, b: CubeTensor<R>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    match matmul::<R>(a.clone(), b.clone(), None, MatmulStrategy::default(), DType::F32) {
        Ok(y) => y,
        Err(_) => Cube::<R, F, I, BT>::float_cast(
            Cube::<R, F, I, BT>::float_matmul(a, b),
            FloatDType::F32,
        ),
    }
}

impl<B> DeviceMixed for Fusion<B>
where
    B: FusionBackend + DeviceMixed,
{
    fn round_pair(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dtype: FloatDType,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outs = [(a.shape.to_vec(), dtype.into()), (b.shape.to_vec(), dtype.into())];
        let [a_low, b_low] = in_stream::<B, _, 2, 2>("round_pair", [a, b], outs, move |[a, b]| {
            let (a, b) = B::round_pair(a, b, dtype);
            [a, b]
        });
        (a_low, b_low)
    }

    fn round_one(x: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        let out = (x.shape.to_vec(), dtype.into());
        let [y] =
            in_stream::<B, _, 1, 1>("round_one", [x], [out], move |[x]| [B::round_one(x, dtype)]);
        y
    }

    fn product_f32(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        // [.., m, k] · [.., k, n] -> [.., m, n], a leading axis of size 1 broadcast.
        let (da, db) = (a.shape.to_vec(), b.shape.to_vec());
        let mut dims: Vec<usize> = da.iter().zip(&db).map(|(&x, &y)| x.max(y)).collect();
        if let (Some(last), Some(&n)) = (dims.last_mut(), db.last()) {
            *last = n;
        }
        if let (Some(m), Some(&rows)) = (dims.iter_mut().rev().nth(1), da.iter().rev().nth(1)) {
            *m = rows;
        }
        let out = (dims, DType::F32);
        let [y] =
            in_stream::<B, _, 2, 1>("product_f32", [a, b], [out], |[a, b]| [B::product_f32(a, b)]);
        y
    }
}

/// The product of operands rounded to `dtype`, keeping them for the backward.
#[derive(Debug, Clone)]
struct Mixed {
    dtype: FloatDType,
    /// The operands' axes (2 to 4).
    dims: usize,
    /// The leading axes along which `b` (of size 1 there) is broadcast over `a`.
    broadcast: Vec<usize>,
}

impl<B: DeviceMixed> DeviceBackward<B, 2> for Mixed {
    type Saved = (FloatTensor<B>, FloatTensor<B>);

    fn backward(&self, (a, b): Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; 2] {
        let dy = B::round_one(dy, self.dtype);
        [self.grad_a::<B>(dy.clone(), b), self.grad_b::<B>(a, dy)]
    }

    fn backward_tracked(
        &self,
        (a, b): Self::Saved,
        dy: FloatTensor<B>,
        [want_a, want_b]: [bool; 2],
    ) -> [Option<FloatTensor<B>>; 2] {
        let dy = B::round_one(dy, self.dtype);
        [want_a.then(|| self.grad_a::<B>(dy.clone(), b)), want_b.then(|| self.grad_b::<B>(a, dy))]
    }
}

impl Mixed {
    /// `x` with its last two axes swapped (a view).
    fn transposed<B: DeviceMixed>(&self, x: FloatTensor<B>) -> FloatTensor<B> {
        B::float_swap_dims(x, self.dims - 2, self.dims - 1)
    }

    /// `a`'s gradient from the rounded output gradient `dy`: `dy · bᵀ`.
    fn grad_a<B: DeviceMixed>(&self, dy: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
        B::product_f32(dy, self.transposed::<B>(b))
    }

    /// `b`'s gradient: `aᵀ · dy`, a broadcast `b`'s summed over its copies.
    fn grad_b<B: DeviceMixed>(&self, a: FloatTensor<B>, dy: FloatTensor<B>) -> FloatTensor<B> {
        let db = B::product_f32(self.transposed::<B>(a), dy);
        self.broadcast.iter().fold(db, |db, &axis| B::sum_axis(db, axis, false))
    }
}

impl<B: DeviceMixed> DeviceOp<B, 2> for Mixed {
    fn forward(&self, [a, b]: [FloatTensor<B>; 2]) -> (FloatTensor<B>, Self::Saved) {
        let (a, b) = B::round_pair(a, b, self.dtype);
        (B::product_f32(a.clone(), b.clone()), (a, b))
    }
}

/// Whether the operation takes these operands: f32, 2 to 4 axes, each leading axis of `b`
/// equal to `a`'s or 1 (broadcast), the inner ones agreeing; the two operands together, and
/// the output, under `2^32` elements (the rounding kernels index them with 32-bit integers).
fn fits<B: Backend, const D: usize>(a: &Tensor<B, D>, b: &Tensor<B, D>) -> bool {
    let (da, db) = (a.dims(), b.dims());
    if !(2..=4).contains(&D)
        || a.dtype() != DType::F32
        || b.dtype() != DType::F32
        || !da[..D - 2].iter().zip(&db[..D - 2]).all(|(x, y)| x == y || *y == 1)
        || da[D - 1] != db[D - 2]
    {
        return false;
    }
    let count = |d: &[usize]| d.iter().product::<usize>();
    let out = count(&da[..D - 1]) * db[D - 1];
    count(&da) + count(&db) <= u32::MAX as usize && out <= u32::MAX as usize
}

/// `a · b` with both operands rounded to `dtype` (bfloat16 or float16) and the product in f32,
/// as one operation where the backend and the operands allow (see the module); `None`
/// elsewhere.
pub fn product<B: Backend, const D: usize>(
    a: &Tensor<B, D>,
    b: &Tensor<B, D>,
    dtype: FloatDType,
) -> Option<Tensor<B, D>> {
    if !matches!(dtype, FloatDType::BF16 | FloatDType::F16) || !fits(a, b) {
        return None;
    }
    let (da, db) = (a.dims(), b.dims());
    let broadcast = (0..D - 2).filter(|&i| db[i] == 1 && da[i] > 1).collect();
    let op = Mixed { dtype, dims: D, broadcast };
    on_cube_types!(
        B,
        T,
        {
            let a = float(cast::<_, Tensor<Autodiff<T>, D>>(a.clone())?);
            let b = float(cast::<_, Tensor<Autodiff<T>, D>>(b.clone())?);
            let y = device_op::tracked::<T, _, 2>(op, [a, b]);
            cast(Tensor::<Autodiff<T>, D>::from_primitive(TensorPrimitive::Float(y)))
        },
        {
            let a = float(cast::<_, Tensor<T, D>>(a.clone())?);
            let b = float(cast::<_, Tensor<T, D>>(b.clone())?);
            let (y, _) = DeviceOp::<T, 2>::forward(&op, [a, b]);
            cast(Tensor::<T, D>::from_primitive(TensorPrimitive::Float(y)))
        }
    );
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    /// f16's rounding of `x` (lavapipe has float16 and no bfloat16).
    fn half(x: f32) -> f64 {
        f64::from(burn::tensor::f16::from_f32(x).to_f32())
    }

    /// `a · b` in float64 over `[.., M, K]` and `[.., K, N]` (row-major values).
    fn oracle(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut y = vec![0.0; batch * m * n];
        for p in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    y[(p * m + i) * n + j] = (0..k)
                        .map(|l| a[(p * m + i) * k + l] * b[(p * k + l) * n + j])
                        .sum::<f64>();
                }
            }
        }
        y
    }

    /// Row-major `[.., R, C]` values transposed to `[.., C, R]`.
    fn transpose(x: &[f64], batch: usize, r: usize, c: usize) -> Vec<f64> {
        let mut y = vec![0.0; x.len()];
        for p in 0..batch {
            for i in 0..r {
                for j in 0..c {
                    y[(p * c + j) * r + i] = x[(p * r + i) * c + j];
                }
            }
        }
        y
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    /// Largest |got - want| over the largest |want|.
    fn error(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        got.iter().zip(want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max) / scale
    }

    /// The product and both operands' gradients (under a weighted sum of the output) against
    /// float64 on the f16-rounded operands and output gradient. `b_transposed`: `b` is the
    /// transposed view of a contiguous `[.., N, K]` tensor (as attention's `k`). Returns the
    /// largest relative errors: output, `a`'s gradient, `b`'s gradient.
    fn against_float64<B: DeviceMixed>(
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        b_transposed: bool,
        b_broadcast: bool,
    ) -> [f64; 3] {
        type A<B> = Autodiff<B>;
        let device = Default::default();
        B::seed(&device, 5);
        let normal = Distribution::Normal(0.0, 1.0);
        let a = Tensor::<A<B>, 3>::random([batch, m, k], normal, &device).require_grad();
        let b_batch = if b_broadcast { 1 } else { batch };
        let b_leaf = if b_transposed {
            Tensor::<A<B>, 3>::random([b_batch, n, k], normal, &device).require_grad()
        } else {
            Tensor::<A<B>, 3>::random([b_batch, k, n], normal, &device).require_grad()
        };
        let b = if b_transposed { b_leaf.clone().swap_dims(1, 2) } else { b_leaf.clone() };
        let weights = Tensor::<A<B>, 3>::random([batch, m, n], normal, &device);
        let y = product(&a, &b, FloatDType::F16).expect("the operation takes f32 on wgpu");
        let got = values(y.clone());
        let grads = (y * weights.clone()).sum().backward();
        let ga = values(a.grad(&grads).expect("a's gradient"));
        let gb = values(b_leaf.grad(&grads).expect("b's gradient"));

        let a64: Vec<f64> = values(a.inner()).iter().map(|&x| half(x)).collect();
        let mut b64: Vec<f64> = values(b_leaf.inner()).iter().map(|&x| half(x)).collect();
        if b_transposed {
            b64 = transpose(&b64, b_batch, n, k);
        }
        if b_broadcast {
            b64 = b64.repeat(batch);
        }
        let dy: Vec<f64> = values(weights.inner()).iter().map(|&x| half(x)).collect();
        let want = oracle(&a64, &b64, batch, m, k, n);
        // da = dy · bᵀ, db = aᵀ · dy.
        let want_ga = oracle(&dy, &transpose(&b64, batch, k, n), batch, m, n, k);
        let mut want_gb = oracle(&transpose(&a64, batch, m, k), &dy, batch, k, m, n);
        if b_transposed {
            want_gb = transpose(&want_gb, batch, k, n);
        }
        if b_broadcast {
            // The sum of the copies' gradients.
            let size = k * n;
            want_gb = (0..size).map(|i| (0..batch).map(|p| want_gb[p * size + i]).sum()).collect();
        }
        [error(&got, &want), error(&ga, &want_ga), error(&gb, &want_gb)]
    }

    /// Measured on lavapipe (f32 accumulation over at most 300 terms): at most 6.6e-7 of the
    /// largest value. A product rounded to f16 on its way back (Burn's casts) is off by up to
    /// 2^-11 = 4.9e-4 of it, so the bound below also tells the two apart.
    #[test]
    fn products_and_gradients_match_float64_on_the_rounded_operands_with_and_without_fusion() {
        fn run<B: DeviceMixed>(name: &str) {
            for (batch, m, k, n, transposed, broadcast) in [
                (1, 1, 1, 1, false, false),
                (1, 37, 300, 19, false, false),
                (3, 40, 16, 40, true, false),
                (3, 20, 16, 39, true, true),
            ] {
                let e = against_float64::<B>(batch, m, k, n, transposed, broadcast);
                println!(
                    "{name} [{batch}, {m}, {k}] x [{k}, {n}] (transposed {transposed}, \
                     broadcast {broadcast}): {e:?}"
                );
                for x in e {
                    assert!(x < 2e-6, "{name}: errors {e:?}");
                }
            }
        }
        run::<burn::backend::Wgpu>("wgpu");
        run::<Fusion<burn::backend::Wgpu>>("fused wgpu");
    }

    /// With `a` untracked (as the position encoding, the input of the attention's position
    /// projection) only `b`'s gradient is computed, the same bits as with both tracked.
    #[test]
    fn an_untracked_operand_gets_no_gradient_and_the_other_the_same() {
        type A = Autodiff<Fusion<burn::backend::Wgpu>>;
        let device = Default::default();
        let normal = Distribution::Normal(0.0, 1.0);
        let a = Tensor::<A, 2>::random([5, 7], normal, &device);
        let b = Tensor::<A, 2>::random([7, 3], normal, &device).require_grad();
        let gb = |a: &Tensor<A, 2>| {
            let grads = product(a, &b, FloatDType::F16).expect("wgpu").sum().backward();
            (values(b.grad(&grads).expect("b's gradient")), a.grad(&grads).is_some())
        };
        let (alone, a_has) = gb(&a);
        assert!(!a_has, "an untracked operand has no gradient");
        let (both, a_has) = gb(&a.clone().require_grad());
        assert!(a_has);
        assert_eq!(alone, both);
    }

    #[test]
    fn other_types_and_shapes_are_left_to_the_caller() {
        type W = burn::backend::Wgpu;
        let device = Default::default();
        let a = Tensor::<W, 2>::ones([2, 3], &device);
        let b = Tensor::<W, 2>::ones([3, 4], &device);
        assert!(product(&a, &b, FloatDType::F32).is_none(), "f32 is not a half type");
        assert!(product(&a, &a, FloatDType::F16).is_none(), "inner axes disagree");
        let a3 = Tensor::<W, 3>::ones([1, 2, 3], &device);
        let b3 = Tensor::<W, 3>::ones([2, 3, 4], &device);
        assert!(product(&a3, &b3, FloatDType::F16).is_none(), "a broadcast `a`");
        let cpu = Tensor::<burn::backend::NdArray, 2>::ones([2, 3], &Default::default());
        let cpu_b = Tensor::<burn::backend::NdArray, 2>::ones([3, 4], &Default::default());
        assert!(product(&cpu, &cpu_b, FloatDType::F16).is_none(), "not a CubeCL type");
        let y = product(&a, &b, FloatDType::F16).expect("wgpu takes it");
        assert_eq!(y.dtype(), DType::F32);
        assert_eq!(values(y), vec![3.0; 8]);
    }
}
