//! Rank-2 linear layers as one host operation on the CPU backend.
//!
//! Burn's `linear` on NdArray is a product plus a broadcast bias pass, and its backward takes
//! the weight's and the input's transposes as views that NdArray's product copies into
//! contiguous arrays first (`reshape` inside `matmul`): at the 0.6B width those copies were 7 %
//! of the training step (bench/RESULTS.md, "The linear layers on the host"). Here the forward
//! starts the product from the bias rows, and the backward passes the transposes to the
//! product as strides: `dx = dy W^T`, `dW = x^T dy`, `db` the column sums of `dy`. The products
//! are `host_product`'s, split over rayon's threads.
//!
//! Which backend: as `host_depthwise` (whose helpers this shares), NdArray bare or under
//! autodiff, f32 tensors; `None` elsewhere, and the caller runs Burn's `linear`.
//!
//! Invariant: Burn's layout, the weight `[in, out]`; values and gradients within f32 rounding
//! of Burn's `linear` (tested).

use super::host_depthwise::{cast, float, tensor, with_values};
use super::host_product::{product, View};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;

/// `x W + b` for `x` `[rows, in]`, `weight` `[in, out]` and `bias` `[out]`, as one host
/// operation where the backend is NdArray (bare or under autodiff) and the tensors f32; `None`
/// elsewhere.
pub fn on_host<B: Backend>(
    x: &Tensor<B, 2>,
    weight: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
) -> Option<Tensor<B, 2>> {
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
        let x = cast::<_, Tensor<Autodiff<NdArray>, 2>>(x.clone())?;
        let w = cast::<_, Tensor<Autodiff<NdArray>, 2>>(weight.clone())?;
        let b = match bias {
            Some(b) => Some(cast::<_, Tensor<Autodiff<NdArray>, 1>>(b.clone())?),
            None => None,
        };
        return cast(tracked(x, w, b)?);
    }
    if id == std::any::TypeId::of::<NdArray>() {
        let x = cast::<_, Tensor<NdArray, 2>>(x.clone())?;
        let w = cast::<_, Tensor<NdArray, 2>>(weight.clone())?;
        let b = match bias {
            Some(b) => Some(float(cast::<_, Tensor<NdArray, 1>>(b.clone())?)),
            None => None,
        };
        let out = forward(&float(x), &float(w), b.as_ref())?;
        return cast(Tensor::<NdArray, 2>::from_primitive(TensorPrimitive::Float(out)));
    }
    None
}

/// A tensor under autodiff, as the host operations take them apart.
type Tracked = burn::tensor::ops::FloatTensor<Autodiff<NdArray>>;

fn tracked(
    x: Tensor<Autodiff<NdArray>, 2>,
    w: Tensor<Autodiff<NdArray>, 2>,
    b: Option<Tensor<Autodiff<NdArray>, 1>>,
) -> Option<Tensor<Autodiff<NdArray>, 2>> {
    let (x, w) = (float(x), float(w));
    let b = b.map(float);
    let out = forward(&x.primitive, &w.primitive, b.as_ref().map(|b| &b.primitive))?;
    let out = match &b {
        Some(b) => record([&x, &w, b], x.primitive.clone(), w.primitive.clone(), out),
        None => record([&x, &w], x.primitive.clone(), w.primitive.clone(), out),
    };
    Some(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// Records the step with its parents (the input, the weight and, when there is one, the bias)
/// and the state its backward reads.
fn record<const N: usize>(
    parents: [&Tracked; N],
    x: NdArrayTensor,
    w: NdArrayTensor,
    out: NdArrayTensor,
) -> Tracked {
    let nodes = parents.map(|p| p.node.clone());
    match LinearBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((x, w), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// `[rows, in]` and `[in, out]` from the tensors' lengths; `None` when they disagree.
fn shapes(x: &[f32], w: &[f32], out: usize) -> Option<(usize, usize)> {
    let inputs = w.len().checked_div(out)?;
    let rows = x.len().checked_div(inputs)?;
    (rows * inputs == x.len() && inputs * out == w.len()).then_some((rows, inputs))
}

fn out_features(w: &NdArrayTensor) -> usize {
    burn::tensor::TensorMetadata::shape(w).dims::<2>()[1]
}

/// The forward product; `None` when a tensor is not f32 or the shapes disagree.
fn forward(
    x: &NdArrayTensor,
    w: &NdArrayTensor,
    b: Option<&NdArrayTensor>,
) -> Option<NdArrayTensor> {
    if !matches!(x, NdArrayTensor::F32(_)) {
        return None;
    }
    let out = out_features(w);
    with_values(x, |xs| {
        with_values(w, |ws| {
            let (rows, inputs) = shapes(xs, ws, out)?;
            // The product starts from the bias rows (accumulated into): no second pass over
            // the output, and no zeros written first.
            let mut y = match b {
                Some(b) => with_values(b, |bs| (bs.len() == out).then(|| bs.repeat(rows)))??,
                None => vec![0f32; rows * out],
            };
            let (xv, wv) = (View::row_major(xs, rows, inputs)?, View::row_major(ws, inputs, out)?);
            product(&mut y, xv, wv, b.is_some())?;
            Some(tensor(y, &[rows, out]))
        })?
    })?
}

/// The backward step: the gradients of the input, the weight and (when there is one) the bias.
#[derive(Debug)]
struct LinearBackward;

impl<const N: usize> Backward<NdArray, N> for LinearBackward {
    /// The input and the weight (shared with the forward, not copied).
    type State = (NdArrayTensor, NdArrayTensor);

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let upstream = grads.consume::<NdArray>(&ops.node);
        let (x, w) = ops.state;
        let out = out_features(&w);
        // The forward ran on f32 tensors of these shapes, and NdArray's float gradients are
        // f32 or f64, which `with_values` reads: this cannot fail.
        let (dx, dw, db, rows, inputs) = with_values(&x, |xs| {
            with_values(&w, |ws| with_values(&upstream, |dy| gradients(xs, ws, dy, out)).flatten())
                .flatten()
        })
        .flatten()
        .expect("the linear layer's tensors are f32 of the forward's shapes");
        let parents = ops.parents;
        if let Some(p) = &parents[0] {
            grads.register::<NdArray>(p.id, tensor(dx, &[rows, inputs]));
        }
        if let Some(p) = &parents[1] {
            grads.register::<NdArray>(p.id, tensor(dw, &[inputs, out]));
        }
        if let Some(Some(p)) = parents.get(2) {
            grads.register::<NdArray>(p.id, tensor(db, &[out]));
        }
    }
}

type Grads = (Vec<f32>, Vec<f32>, Vec<f32>, usize, usize);

/// `(dx, dW, db, rows, inputs)` from the output's gradient `dy` `[rows, out]`.
fn gradients(xs: &[f32], ws: &[f32], dy: &[f32], out: usize) -> Option<Grads> {
    let (rows, inputs) = shapes(xs, ws, out)?;
    if dy.len() != rows * out {
        return None;
    }
    let xv = View::row_major(xs, rows, inputs)?;
    let wv = View::row_major(ws, inputs, out)?;
    let gv = View::row_major(dy, rows, out)?;
    let mut dx = vec![0f32; rows * inputs];
    product(&mut dx, gv, wv.t(), false)?;
    let mut dw = vec![0f32; inputs * out];
    product(&mut dw, xv.t(), gv, false)?;
    // The bias gradient in f64, rows in order: the same bits at any thread count.
    let mut db = vec![0f64; out];
    for r in dy.chunks_exact(out.max(1)) {
        db.iter_mut().zip(r).for_each(|(s, &v)| *s += f64::from(v));
    }
    let db = db.into_iter().map(|v| v as f32).collect();
    Some((dx, dw, db, rows, inputs))
}
