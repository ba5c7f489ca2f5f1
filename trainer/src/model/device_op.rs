//! What the trainer's own CubeCL operations (`device_lstm`, `device_layer_norm`, and the other
//! `device_*` modules of `model`) share: the launch grid, buffers, a sum and a maximum over a
//! cube, the dispatch on the backend type, and the autodiff node ([`DeviceOp`], [`tracked`]).
//!
//! Invariants: a grid is at most 65,535 cubes along x (wgpu's limit) and spills into y; a
//! kernel finds its unit with [`unit_index`] (one unit per element) or its cube with
//! [`cube_index`] (one cube per row), and returns at once past its count. A kernel indexes its
//! buffers densely, so it takes inputs through [`contiguous`] and writes only buffers of
//! [`empty`], never a tensor Burn made (`Tensor::zeros` and products are pitched on CUDA: a
//! row of 96 f32 in 128, the padding never written). Buffers from [`empty`] are not
//! initialised: the kernel writing them writes every element read later.
//! Under autodiff each operation is one node whose parents are its inputs, in order.

use std::fmt::Debug;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::prelude::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::device_sum::DeviceSum;

/// Units per cube.
pub const CUBE: u32 = 256;
/// wgpu's limit on cubes per dimension.
const MAX_CUBES_X: usize = 65_535;

/// The grid for `cubes` cubes.
pub fn cubes(cubes: usize) -> CubeCount {
    let cubes = cubes.max(1);
    let x = cubes.min(MAX_CUBES_X);
    CubeCount::Static(x as u32, cubes.div_ceil(x) as u32, 1)
}

/// The grid for one unit per element of `units`.
pub fn grid(units: usize) -> CubeCount {
    cubes(units.div_ceil(CUBE as usize))
}

/// The unit's index in the grid of [`grid`].
#[cube]
pub fn unit_index() -> u32 {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) * CUBE_DIM + UNIT_POS
}

/// The cube's index in the grid of [`cubes`].
#[cube]
pub fn cube_index() -> u32 {
    CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X
}

/// The sum over the cube of one value per unit, by a tree in shared memory of `CUBE` values;
/// every unit gets it. Every unit of the cube must call it (it waits at barriers).
#[cube]
pub fn cube_sum(shared: &mut SharedMemory<f32>, value: f32) -> f32 {
    asr_tdt::cube_reduce(shared, value, false)
}

/// The largest over the cube of one value per unit, as [`cube_sum`].
#[cube]
pub fn cube_max(shared: &mut SharedMemory<f32>, value: f32) -> f32 {
    asr_tdt::cube_reduce(shared, value, true)
}

/// A tensor's primitive as a contiguous CubeCL tensor (no copy when it is one).
pub fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    burn_cubecl::kernel::into_contiguous(t)
}

/// `t` viewed as the matrix `[rows, cols]` of as many elements (itself where it has that
/// shape): a view of a contiguous CubeCL tensor, no copy.
pub fn as_matrix<B: Backend>(t: FloatTensor<B>, rows: usize, cols: usize) -> FloatTensor<B> {
    if t.shape().as_slice() == [rows, cols] {
        t
    } else {
        B::float_reshape(t, [rows, cols].into())
    }
}

/// A new f32 buffer of `dims`, not initialised (see the module), or NaN in every element where
/// [`poisoned`] says so.
pub fn empty<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    dims: Vec<usize>,
) -> CubeTensor<R> {
    let n: usize = dims.iter().product();
    let handle = if poisoned() {
        // Uploaded with the allocation: no kernel of its own to compile and launch.
        let nan: Vec<u8> = f32::NAN.to_ne_bytes().repeat(n);
        client.create_from_slice(&nan)
    } else {
        client.empty(n * std::mem::size_of::<f32>())
    };
    CubeTensor::new_contiguous(client.clone(), device.clone(), dims.into(), handle, DType::F32)
}

/// Whether [`empty`] fills its buffers with NaN: where `ASRT_POISON_BUFFERS` is `1` (`0`: not),
/// and when it is unset in this crate's unit tests, where the operations are tested. A buffer
/// from the memory pool holds what its last user left: on lavapipe often zeros or a like
/// tensor's values, on CUDA another operation's. A kernel that reads an element no kernel wrote
/// then gives NaN on every backend instead of a value that depends on the pool (the GPU kit's
/// step cg compares a run with it and one without).
///
/// Not for a run that must go on after an out-of-memory: on lavapipe, after a decoding
/// batch's allocation failed with poisoned buffers, the next, smaller batch found the device
/// in an invalid state (a missing memory page); without them it decodes.
pub fn poisoned() -> bool {
    static POISONED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *POISONED.get_or_init(|| match std::env::var("ASRT_POISON_BUFFERS").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => cfg!(test),
    })
}

/// The gradients of a weight `[taps, C]` and a bias `[C]` from partial sums over blocks of rows
/// `[taps + 1, blocks, C]` (the bias's last), summed over the blocks (`device_sum`).
pub fn weight_and_bias_sums<B: DeviceSum>(
    parts: FloatTensor<B>,
    taps: usize,
    channels: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    weight_and_bias::<B>(B::sum_axis(parts, 1, false), taps, channels)
}

/// The weight `[taps, C]` and the bias `[C]` in `sums` (`[taps + 1, 1, C]` or
/// `[taps + 1, C]`, the bias's last), as views.
pub fn weight_and_bias<B: Backend>(
    sums: FloatTensor<B>,
    taps: usize,
    channels: usize,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let sums = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(
        sums,
        [taps + 1, channels].into(),
    )));
    let dw = sums.clone().narrow(0, 0, taps).into_primitive().tensor();
    let db = sums.narrow(0, taps, 1).reshape([channels]).into_primitive().tensor();
    (dw, db)
}

/// In a function returning `Option`: returns `$tracked` where the backend `$b` is `Autodiff<T>`
/// and `$bare` where it is `T`, for `T` each of the trainer's CubeCL types (`Wgpu`,
/// `Fusion<Wgpu>`, `Cuda`, `Fusion<Cuda>`, as the features have them), named `$t` in both;
/// goes on past it where `$b` is none of them.
macro_rules! on_cube_types {
    ($b:ty, $t:ident, $tracked:block, $bare:block) => {
        #[cfg(feature = "wgpu")]
        {
            $crate::model::device_op::on_cube_types!(@one $b, $t, burn::backend::Wgpu, $tracked, $bare);
            $crate::model::device_op::on_cube_types!(
                @one $b, $t, burn_fusion::Fusion<burn::backend::Wgpu>, $tracked, $bare
            );
        }
        #[cfg(feature = "cuda")]
        {
            $crate::model::device_op::on_cube_types!(@one $b, $t, burn::backend::Cuda, $tracked, $bare);
            $crate::model::device_op::on_cube_types!(
                @one $b, $t, burn_fusion::Fusion<burn::backend::Cuda>, $tracked, $bare
            );
        }
    };
    (@one $b:ty, $t:ident, $ty:ty, $tracked:block, $bare:block) => {{
        type $t = $ty;
        let id = std::any::TypeId::of::<$b>();
        if id == std::any::TypeId::of::<burn::backend::Autodiff<$t>>() {
            return $tracked;
        }
        if id == std::any::TypeId::of::<$t>() {
            return $bare;
        }
    }};
}
pub(crate) use on_cube_types;

/// The backward of one of the device operations on the inner backend `B` with `N` float
/// inputs: the inputs' gradients from the output's.
pub trait DeviceBackward<B: Backend, const N: usize>: Debug + Send + 'static {
    /// What the forward keeps for the backward.
    type Saved: Clone + Debug + Send + 'static;

    /// The inputs' gradients, in the inputs' order, from the output's gradient `dy`.
    fn backward(&self, saved: Self::Saved, dy: FloatTensor<B>) -> [FloatTensor<B>; N];

    /// The gradients of the inputs that are `tracked` (the others' are not used): by default
    /// all of [`Self::backward`]'s; an operation whose inputs' gradients cost a launch each
    /// computes only those asked for.
    fn backward_tracked(
        &self,
        saved: Self::Saved,
        dy: FloatTensor<B>,
        _tracked: [bool; N],
    ) -> [Option<FloatTensor<B>>; N] {
        self.backward(saved, dy).map(Some)
    }
}

/// One of the device operations whose forward is a function of its inputs alone.
pub trait DeviceOp<B: Backend, const N: usize>: DeviceBackward<B, N> {
    /// The output, and what the backward needs.
    fn forward(&self, inputs: [FloatTensor<B>; N]) -> (FloatTensor<B>, Self::Saved);
}

/// The backward step of `O`: each tracked input's gradient.
#[derive(Debug)]
struct OpBackward<O>(O);

impl<B: Backend, O: DeviceBackward<B, N>, const N: usize> Backward<B, N> for OpBackward<O> {
    type State = O::Saved;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<B>(&ops.node);
        let tracked = ops.parents.each_ref().map(Option::is_some);
        let inputs = self.0.backward_tracked(ops.state, dy, tracked);
        for (parent, grad) in ops.parents.into_iter().zip(inputs) {
            if let (Some(p), Some(g)) = (parent, grad) {
                grads.register::<B>(p.id, g);
            }
        }
    }
}

/// The next of `tensors`, which the caller declared (`what`): an operation's inputs or
/// outputs under fusion, unpacked in the order it packed them.
pub(crate) fn next_of<T>(tensors: &mut impl Iterator<Item = T>, what: &str) -> T {
    match tensors.next() {
        Some(t) => t,
        None => unreachable!("{what}"),
    }
}

/// `op` under autodiff with the forward `forward`: the output and what `op`'s backward keeps
/// from the inputs' primitives, then one node with `inputs` as parents, in order, keeping the
/// saved part only where one of them is tracked.
///
/// The primitives are moved out of `inputs`, not cloned: where the caller gave up its last
/// handle on an input, the forward holds it, and under fusion the operation that reads it
/// last is queued read-write and frees it. A clone left the autodiff tensor's own handle to be
/// dropped after the forward, which fusion records as a drop operation of its own, explored
/// and executed like any other. With the entry points that now take their inputs by value,
/// about 490 of a step's 1,572 drops at bench/fusion_ops.sh's preset (bench/RESULTS.md,
/// 2026-12-01, "The old parameters released"). The inputs' nodes and reference counts are
/// held until the node is made, as the tensors were.
pub fn tracked_with<B, O, F, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<B>>; N],
    forward: F,
) -> FloatTensor<Autodiff<B>>
where
    B: Backend,
    O: DeviceBackward<B, N>,
    F: FnOnce(&O, [FloatTensor<B>; N]) -> (FloatTensor<B>, O::Saved),
{
    let (y, ()) = tracked_with_more(op, inputs, |op, x| {
        let (y, saved) = forward(op, x);
        (y, saved, ())
    });
    y
}

/// [`tracked_with`] whose forward also makes tensors that are not the node's output (`more`:
/// the next operation's, computed in the same kernel), returned beside it.
pub fn tracked_with_more<B, O, F, M, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<B>>; N],
    forward: F,
) -> (FloatTensor<Autodiff<B>>, M)
where
    B: Backend,
    O: DeviceBackward<B, N>,
    F: FnOnce(&O, [FloatTensor<B>; N]) -> (FloatTensor<B>, O::Saved, M),
{
    let parents = inputs.each_ref().map(|t| t.node.clone());
    let counts = inputs.each_ref().map(|t| t.rc.clone());
    let (y, saved, more) = forward(&op, inputs.map(|t| t.primitive));
    let y = match OpBackward(op).prepare::<NoCheckpointing>(parents).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(saved, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    drop(counts);
    (y, more)
}

/// `op` under autodiff: its forward, and one node with the inputs as parents
/// ([`tracked_with`]).
pub fn tracked<B: Backend, O: DeviceOp<B, N>, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<B>>; N],
) -> FloatTensor<Autodiff<B>> {
    tracked_with(op, inputs, |op, x| op.forward(x))
}

/// Largest |a - b| relative to the largest |b| (the device operations' tests).
#[cfg(test)]
pub fn relative_difference<B: burn::prelude::Backend, const D: usize>(
    a: burn::tensor::Tensor<B, D>,
    b: burn::tensor::Tensor<B, D>,
) -> f32 {
    assert_eq!(a.dims(), b.dims(), "the tensors compared differ in shape");
    let a = a.into_data().into_vec::<f32>().unwrap();
    let b = b.into_data().into_vec::<f32>().unwrap();
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use burn::backend::wgpu::WgpuRuntime;

    /// In the unit tests a new buffer is NaN in every element (unless `ASRT_POISON_BUFFERS=0`), so
    /// the kernels' tests fail on a read of an element their kernel did not write. Taken from a
    /// pool that held ones just before, so zeros left there would not pass either.
    #[test]
    fn new_buffers_are_nan_in_the_unit_tests() {
        if std::env::var("ASRT_POISON_BUFFERS").as_deref() == Ok("0") {
            eprintln!("skipped: ASRT_POISON_BUFFERS=0");
            return;
        }
        assert!(poisoned());
        let device = Default::default();
        let ones =
            Tensor::<burn::backend::Wgpu, 1>::ones([1000], &device).into_primitive().tensor();
        let client = ones.client.clone();
        drop(ones);
        let t: CubeTensor<WgpuRuntime> = empty(&client, &device, vec![10, 100]);
        let values = Tensor::<burn::backend::Wgpu, 2>::from_primitive(TensorPrimitive::Float(t))
            .into_data()
            .into_vec::<f32>()
            .unwrap();
        assert_eq!(values.len(), 1000);
        assert!(values.iter().all(|v| v.is_nan()), "{:?}", &values[..8]);
    }

    type Fused = burn_fusion::Fusion<burn::backend::Wgpu>;
    type Ad = Autodiff<Fused>;

    /// `values` (`rows` x `width`, row-major) as a tracked tensor whose rows sit `pitch` apart
    /// in its buffer, the padding 1e6: the layout cubecl-cuda gives a tensor Burn makes (a row
    /// of 96 f32 in 128), made by hand on wgpu, which lays every tensor out dense. Dense where
    /// `pitch` is `width`.
    fn pitched_rows(values: &[f32], rows: usize, width: usize, pitch: usize) -> Tensor<Ad, 2> {
        let device = Default::default();
        let data = burn::tensor::TensorData::new(values.to_vec(), [rows, width]);
        let dense = Tensor::<burn::backend::Wgpu, 2>::from_floats(data, &device);
        let prim: CubeTensor<WgpuRuntime> = dense.into_primitive().tensor();
        let mut buffer = vec![1.0e6f32; rows * pitch];
        for r in 0..rows {
            buffer[r * pitch..r * pitch + width]
                .copy_from_slice(&values[r * width..(r + 1) * width]);
        }
        let bytes: Vec<u8> = buffer.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let handle = prim.client.create_from_slice(&bytes);
        let mut meta = (*prim.meta).clone();
        meta.strides[0] = pitch;
        let t = CubeTensor::new(prim.client.clone(), handle, meta, prim.device.clone(), DType::F32);
        let like = Tensor::<Fused, 2>::zeros([1, 1], &device).into_primitive().tensor();
        let fused = asr_tdt::fusion::adopt::<burn::backend::Wgpu>(&like.client, t);
        Tensor::<Ad, 2>::from_inner(Tensor::from_primitive(TensorPrimitive::Float(fused)))
            .require_grad()
    }

    /// `values` of `dims`, tracked.
    fn tracked<const D: usize>(values: &[f32], dims: [usize; D]) -> Tensor<Ad, D> {
        let data = burn::tensor::TensorData::new(values.to_vec(), dims);
        Tensor::<Ad, D>::from_floats(data, &Default::default()).require_grad()
    }

    fn host<const D: usize>(t: Option<Tensor<Fused, D>>) -> Vec<f32> {
        t.expect("tracked").into_data().into_vec::<f32>().unwrap()
    }

    /// Under fusion an operation saves its inputs and hands them again to the backward, not
    /// the dense copies its forward made. A weight Burn made on CUDA (`tiny`'s depthwise
    /// `[9, 96]`, rows of 128) reached the backward kernels pitched while they index densely, and
    /// the gradients into the first layer's convolution module came out wrong (the GPU kit's cg
    /// on an H200, 2026-11-29). With a pitched input each operation's gradients must be the
    /// dense input's, bit for bit.
    #[test]
    fn fused_backwards_read_a_pitched_input_as_a_dense_one() {
        use super::super::{device_depthwise, device_layer_norm};
        let (b, t, c, k) = (2usize, 5usize, 96usize, 9usize);
        let xs: Vec<f32> = (0..b * t * c).map(|i| ((i * 37) % 101) as f32 * 0.02 - 1.0).collect();
        let ws: Vec<f32> = (0..k * c).map(|i| ((i * 13) % 29) as f32 * 0.05 - 0.7).collect();
        let vs: Vec<f32> = (0..c).map(|i| i as f32 * 0.01 - 0.3).collect();
        let rs: Vec<f32> = (0..b * t * c).map(|i| ((i * 7) % 23) as f32 * 0.1 - 1.1).collect();
        let depthwise = |pitch: usize| {
            let (x, w, bias) =
                (tracked(&xs, [b, t, c]), pitched_rows(&ws, k, c, pitch), tracked(&vs, [c]));
            let y = device_depthwise::on_device(&x, &w, &bias).expect("on wgpu");
            let grads = (y * tracked(&rs, [b, t, c])).sum().backward();
            [
                host(x.grad(&grads).map(|g| g.reshape([b * t, c]))),
                host(w.grad(&grads)),
                host(bias.grad(&grads)),
            ]
        };
        let layer_norm = |pitch: usize| {
            let (x, gamma, beta) =
                (pitched_rows(&xs, b * t, c, pitch), tracked(&ws[..c], [c]), tracked(&vs, [c]));
            let y =
                device_layer_norm::on_device(&x, &gamma, Some(&beta), 1e-5, None).expect("on wgpu");
            let grads = (y * tracked(&rs, [b * t, c])).sum().backward();
            [host(x.grad(&grads)), host(gamma.grad(&grads)), host(beta.grad(&grads))]
        };
        let mut failures = Vec::new();
        for (op, pitched, dense) in [
            ("depthwise", depthwise(128), depthwise(c)),
            ("layer norm", layer_norm(128), layer_norm(c)),
        ] {
            for ((what, p), d) in ["input", "weight", "bias"].iter().zip(&pitched).zip(&dense) {
                let wrong = p.iter().zip(d).filter(|(x, y)| x != y).count();
                eprintln!("{op}, {what} gradient: {wrong} of {} elements differ", p.len());
                if wrong > 0 {
                    failures.push(format!("{op}, {what} gradient: {wrong} of {} differ", p.len()));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
