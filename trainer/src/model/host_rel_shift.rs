//! Transformer-XL's relative shift as one host operation on the CPU backend.
//!
//! The attention's position scores `[B, H, T, 2T-1]` (against positions `T-1 .. -(T-1)`)
//! become scores against keys `[B, H, T, T]`: entry `(i, j)` is the score against position
//! `i - j`, found at column `T-1-i+j`, so each output row is one contiguous run of its input
//! row. The tensor form (`encoder::rel_shift`: a concatenation, two reshapes and two slices)
//! makes three copies of the scores on NdArray forward, and as many backward; in the 0.6B-width
//! encoder's forward its concatenation alone was 5 % of the calling thread's samples
//! (bench/RESULTS.md, "Reshapes without copies"). Here the forward copies each run once and the
//! backward writes each run into a zero row, both split over rayon's pool.
//!
//! Which backend: NdArray bare or under autodiff, f32 tensors (as `host_depthwise`, whose
//! helpers this shares); `None` elsewhere, and the caller runs the tensor form.
//!
//! Invariant: the same values and gradients as the tensor form, exactly (tested: both only move
//! values).

use super::host_depthwise::{cast, float, tensor, with_values};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use rayon::prelude::*;

/// Rows per parallel task (a row is `2T-1` values, a few thousand at most).
const ROWS: usize = 64;

/// `x` `[B, H, T, 2T-1]` shifted to `[B, H, T, T]`, as one host operation where the backend is
/// NdArray (bare or under autodiff) and the tensor f32; `None` elsewhere or for a last
/// dimension other than `2T-1`.
pub fn on_host<B: Backend>(x: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    let dims = x.dims();
    if dims[2] == 0 || dims[3] != 2 * dims[2] - 1 {
        return None;
    }
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
        let x = float(cast::<_, Tensor<Autodiff<NdArray>, 4>>(x.clone())?);
        let out = forward(&x.primitive, dims)?;
        let out = match ShiftBackward
            .prepare::<NoCheckpointing>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(dims, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        return cast(Tensor::<Autodiff<NdArray>, 4>::from_primitive(TensorPrimitive::Float(out)));
    }
    if id == std::any::TypeId::of::<NdArray>() {
        let x = float(cast::<_, Tensor<NdArray, 4>>(x.clone())?);
        let out = forward(&x, dims)?;
        return cast(Tensor::<NdArray, 4>::from_primitive(TensorPrimitive::Float(out)));
    }
    None
}

/// The forward pass over `[B, H, T, 2T-1]` values; `None` for a tensor that is not a float one.
fn forward(x: &NdArrayTensor, dims: [usize; 4]) -> Option<NdArrayTensor> {
    let [b, h, t, n] = dims;
    let out = with_values(x, |xs| {
        let mut out = vec![0f32; b * h * t * t];
        out.par_chunks_mut(t * ROWS).enumerate().for_each(|(task, rows)| {
            for (k, row) in rows.chunks_mut(t).enumerate() {
                let r = task * ROWS + k; // row of [B * H * T]
                let i = r % t;
                let start = r * n + (t - 1 - i);
                row.copy_from_slice(&xs[start..start + t]);
            }
        });
        out
    })?;
    Some(tensor(out, &[b, h, t, t]))
}

#[derive(Debug)]
struct ShiftBackward;

impl Backward<NdArray, 1> for ShiftBackward {
    /// The input's shape, `[B, H, T, 2T-1]`.
    type State = [usize; 4];

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let upstream = grads.consume::<NdArray>(&ops.node);
        let [b, h, t, n] = ops.state;
        // Each input column is read by at most one output entry per row: the gradient is the
        // output row's run written back in place, zero elsewhere.
        let dx = with_values(&upstream, |dy| {
            (dy.len() == b * h * t * t).then(|| {
                let mut dx = vec![0f32; b * h * t * n];
                dx.par_chunks_mut(n * ROWS).enumerate().for_each(|(task, rows)| {
                    for (k, row) in rows.chunks_mut(n).enumerate() {
                        let r = task * ROWS + k;
                        let i = r % t;
                        row[t - 1 - i..2 * t - 1 - i].copy_from_slice(&dy[r * t..(r + 1) * t]);
                    }
                });
                dx
            })
        })
        .flatten()
        // The forward ran on an f32 tensor, the output's gradient has the output's shape, and
        // NdArray's float gradients are f32 or f64, which `with_values` reads.
        .expect("the shift's gradient is a float tensor of the output's shape");
        if let [Some(p)] = &ops.parents {
            grads.register::<NdArray>(p.id, tensor(dx, &ops.state));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Train = Autodiff<NdArray>;

    #[test]
    fn matches_the_tensor_form_and_its_gradient_exactly() {
        let device = Default::default();
        // Enough rows for several tasks, and T = 1 (one position, no shift).
        for (b, h, t) in [(2, 3, 37), (1, 1, 1), (3, 2, 50)] {
            let n = 2 * t - 1;
            let values: Vec<f32> =
                (0..b * h * t * n).map(|i| ((i * 7919) % 1009) as f32 / 37.0 - 13.0).collect();
            let mix: Vec<f32> = (0..b * h * t * t).map(|i| 0.5 + (i % 11) as f32 * 0.25).collect();
            let leaf = || {
                Tensor::<Train, 4>::from_data(
                    TensorData::new(values.clone(), [b, h, t, n]),
                    &device,
                )
                .require_grad()
            };
            let weights =
                Tensor::<Train, 4>::from_data(TensorData::new(mix, [b, h, t, t]), &device);
            let (xh, xt) = (leaf(), leaf());
            let host = on_host(&xh).expect("NdArray takes the host path");
            let form = super::super::encoder::rel_shift_tensor_form(xt.clone(), t);
            let read = |t: Tensor<Train, 4>| t.into_data().to_vec::<f32>().expect("f32");
            assert_eq!(read(host.clone()), read(form.clone()), "values at {b}x{h}x{t}");
            let gh = (host * weights.clone()).sum().backward();
            let gt = (form * weights).sum().backward();
            let grad = |x: &Tensor<Train, 4>, g| {
                x.grad(g).expect("gradient").into_data().to_vec::<f32>().expect("f32")
            };
            assert_eq!(grad(&xh, &gh), grad(&xt, &gt), "gradients at {b}x{h}x{t}");
            // Evaluation (no autodiff) takes the same forward.
            let bare = Tensor::<NdArray, 4>::from_data(
                TensorData::new(values.clone(), [b, h, t, n]),
                &device,
            );
            let eval = on_host(&bare).expect("NdArray takes the host path");
            assert_eq!(
                eval.into_data().to_vec::<f32>().expect("f32"),
                read(on_host(&leaf()).expect("host"))
            );
        }
    }
}
