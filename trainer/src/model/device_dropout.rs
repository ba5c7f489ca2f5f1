//! Dropout (`model::dropout`) as one operation on the CubeCL backends (wgpu, CUDA; fused or
//! not).
//!
//! Burn's form draws a Bernoulli tensor, multiplies by it and divides by the keep share: three
//! launches forward, two backward, and the drawn mask kept from the forward to the backward,
//! the size of the input (for the attention's probabilities, `[B, H, T, T]`). A Conformer layer
//! runs eight dropouts, and a GPU step is bound by the host's cost per launch
//! (bench/RESULTS.md). Here the mask is never stored: one kernel hashes each element's index
//! with the call's seed ([`dropout::word`]) and multiplies, forward; the same kernel on the
//! output's gradient is the backward.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`) under
//! autodiff (dropout is the identity without it), with f32 tensors of fewer than `2^32`
//! elements; `None` elsewhere, and the caller runs Burn's form.
//!
//! Invariants: element `i` (in the tensor's logical row-major order) of the output is
//! `x[i] * m` with `m` the rule's scale where [`Rule::keeps`]`(i)` and `0` elsewhere: the CPU
//! backend's mask for the same seed, bit for bit; the backward is the same product on the
//! gradient and keeps only the rule (two words and two scalars).

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
use super::dropout::{self, Rule};
use super::host_depthwise::{cast, float};

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

/// One unit per element: `y = x * m`, `m = scale` where the element's word (below `2^32`
/// elements, [`dropout::word`]) is under `threshold`, else `0`.
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
        let word = lowbias32(lowbias32(pos ^ k0) ^ k1);
        let mut m = 0.0f32;
        if word < threshold {
            m = scale;
        }
        y[pos as usize] = x[pos as usize] * m;
    }
}

/// The operation (see the module): the backends that have it.
pub trait DeviceDropout: Backend {
    /// `x` times `rule`'s mask, element by element in `x`'s logical order.
    fn dropout_apply(rule: Rule, x: FloatTensor<Self>) -> FloatTensor<Self>;
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
        let [k0, k1] = dropout::keys(rule.seed);
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
            rule.threshold,
            rule.scale,
            units as u32,
        );
        y
    }
}

impl<B> DeviceDropout for Fusion<B>
where
    B: FusionBackend + DeviceDropout,
{
    fn dropout_apply(rule: Rule, x: FloatTensor<Self>) -> FloatTensor<Self> {
        let client = x.client.clone();
        let y = B::dropout_apply(rule, client.resolve_tensor_float::<B>(x));
        asr_tdt::fusion::adopt::<B>(&client, y)
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

/// `x` times `rule`'s mask as one operation where the backend is one of the trainer's CubeCL
/// types under autodiff, `x` f32 and under `2^32` elements; `None` elsewhere.
pub fn on_device<B: Backend, const D: usize>(x: &Tensor<B, D>, rule: Rule) -> Option<Tensor<B, D>> {
    if x.dtype() != DType::F32 || x.shape().num_elements() > u32::MAX as usize {
        return None;
    }
    on_cube_types!(B, T, { cast(tracked::<T, D>(rule, cast(x.clone())?)) }, { None });
    None
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
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
        assert!(on_device(&bare, Rule::new(1, 0.5)).is_none());
        assert_eq!(dropout.forward(bare).into_data().into_vec::<f32>().unwrap(), values);
    }
}
