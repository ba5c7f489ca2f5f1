//! Swish (SiLU, `x * sigmoid(x)`) as one host operation on the CPU backend.
//!
//! Burn's `silu` is a sigmoid and a product, and NdArray's sigmoid is `exp(-log1p(exp(-x)))`:
//! three passes forward, more backward, each a fresh allocation on the calling thread. At the
//! 0.6B width the feed-forward halves apply it to `[B, T, 4096]`, and its exponentials and
//! logarithms were 8 % of the calling thread's samples in a release step (bench/RESULTS.md,
//! "Release builds against PyTorch"). Here the forward is one pass and the backward one pass
//! (recomputing the sigmoid from the kept input), each split over rayon's pool.
//!
//! Which backend: as `host_depthwise` (whose helpers this shares), NdArray bare or under
//! autodiff, f32 tensors; `None` elsewhere, and the caller runs Burn's `silu`.
//!
//! Invariants: Burn's `silu` and its gradient within f32 rounding (tested); elementwise, so the
//! same bits at any thread count.

use super::host_depthwise::{cast, float, tensor, with_values};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::{TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `x * sigmoid(x)` as one host operation where the backend is NdArray (bare or under autodiff)
/// and the tensor f32; `None` elsewhere.
pub fn on_host<B: Backend, const D: usize>(x: &Tensor<B, D>) -> Option<Tensor<B, D>> {
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
        let x = float(cast::<_, Tensor<Autodiff<NdArray>, D>>(x.clone())?);
        let out = forward(&x.primitive)?;
        let out = match SiluBackward
            .prepare::<NoCheckpointing>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(x.primitive, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        return cast(Tensor::<Autodiff<NdArray>, D>::from_primitive(TensorPrimitive::Float(out)));
    }
    if id == std::any::TypeId::of::<NdArray>() {
        let x = float(cast::<_, Tensor<NdArray, D>>(x.clone())?);
        let out = forward(&x)?;
        return cast(Tensor::<NdArray, D>::from_primitive(TensorPrimitive::Float(out)));
    }
    None
}

/// The logistic function, as Burn's `sigmoid` computes it up to rounding.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The forward pass; `None` when the tensor is not f32.
fn forward(x: &NdArrayTensor) -> Option<NdArrayTensor> {
    if !matches!(x, NdArrayTensor::F32(_)) {
        return None;
    }
    let shape = x.shape().to_vec();
    // Collected in place over the pool (no zeroing pass on the calling thread).
    let out = with_values(x, |xs| {
        xs.par_iter().with_min_len(CHUNK).map(|&x| x * sigmoid(x)).collect::<Vec<f32>>()
    })?;
    Some(tensor(out, &shape))
}

#[derive(Debug)]
struct SiluBackward;

impl Backward<NdArray, 1> for SiluBackward {
    /// The input (shared with the forward, not copied).
    type State = NdArrayTensor;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let upstream = grads.consume::<NdArray>(&ops.node);
        let x = ops.state;
        let shape = x.shape().to_vec();
        // d/dx x s(x) = s + x s (1 - s).
        let dx = with_values(&x, |xs| {
            with_values(&upstream, |dy| {
                (xs.len() == dy.len()).then(|| {
                    xs.par_iter()
                        .zip(dy.par_iter())
                        .with_min_len(CHUNK)
                        .map(|(&x, &g)| {
                            let s = sigmoid(x);
                            g * (s + x * s * (1.0 - s))
                        })
                        .collect::<Vec<f32>>()
                })
            })
            .flatten()
        })
        .flatten()
        // The forward ran on an f32 tensor of this shape, and NdArray's float gradients are
        // f32 or f64, which `with_values` reads: this cannot fail.
        .expect("the activation's input and gradient are float tensors of one shape");
        if let [Some(p)] = &ops.parents {
            grads.register::<NdArray>(p.id, tensor(dx, &shape));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::silu;

    type Train = Autodiff<NdArray>;

    #[test]
    fn matches_burn_s_silu_and_its_gradient_against_float64() {
        let device = Default::default();
        // Values across the sigmoid's range, a non-contiguous view (the convolution module's
        // input is a transpose), and an upstream gradient that is not all ones.
        let n = 7 * (3 * CHUNK / 7 + 1); // over three tasks, rows of 7
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2001) as f32 / 100.0 - 10.0).collect();
        let mix: Vec<f32> = (0..n).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
        let shape = [n / 7, 7];
        let make =
            |v: &[f32]| Tensor::<Train, 2>::from_data(TensorData::new(v.to_vec(), shape), &device);
        let x = make(&values).require_grad();
        let xt = x.clone().swap_dims(0, 1);
        let host = on_host(&xt).expect("NdArray takes the host path").swap_dims(0, 1);
        let burn = silu(x.clone().swap_dims(0, 1)).swap_dims(0, 1);
        let gh = (host.clone() * make(&mix)).sum().backward();
        let gb = (burn.clone() * make(&mix)).sum().backward();
        let read = |t: Tensor<Train, 2>| t.into_data().to_vec::<f32>().expect("f32");
        let read_inner = |t: Tensor<NdArray, 2>| t.into_data().to_vec::<f32>().expect("f32");
        let (yh, yb) = (read(host), read(burn));
        let (dh, db) = (
            read_inner(x.grad(&gh).expect("host gradient")),
            read_inner(x.grad(&gb).expect("burn gradient")),
        );
        let (mut worst_y, mut worst_d, mut burn_y, mut burn_d) = (0f64, 0f64, 0f64, 0f64);
        for i in 0..values.len() {
            let x = f64::from(values[i]);
            let s = 1.0 / (1.0 + (-x).exp());
            let (y, d) = (x * s, f64::from(mix[i]) * (s + x * s * (1.0 - s)));
            let err = |a: f32, b: f64| (f64::from(a) - b).abs() / b.abs().max(1.0);
            worst_y = worst_y.max(err(yh[i], y));
            worst_d = worst_d.max(err(dh[i], d));
            burn_y = burn_y.max(err(yb[i], y));
            burn_d = burn_d.max(err(db[i], d));
        }
        // Measured (relative to float64, the larger of |y| and 1): host 1.3e-7 forward and 7.3e-7
        // backward, Burn's own form 1.3e-7 and 6.9e-7; the bounds are 5x the larger.
        assert!(worst_y < 6.7e-7 && worst_d < 3.6e-6, "host {worst_y:e} {worst_d:e}");
        assert!(burn_y < 6.7e-7 && burn_d < 3.6e-6, "burn {burn_y:e} {burn_d:e}");
        // Evaluation (no autodiff) takes the same forward.
        let bare = Tensor::<NdArray, 2>::from_data(TensorData::new(values.clone(), shape), &device);
        let eval = on_host(&bare).expect("NdArray takes the host path");
        assert_eq!(eval.into_data().to_vec::<f32>().expect("f32"), yh);
    }
}
