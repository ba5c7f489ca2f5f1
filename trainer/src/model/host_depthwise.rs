//! The encoder's depthwise convolutions as one host operation each on the CPU backend.
//!
//! `conv.rs` writes the subsampling's 3x3 stride-2 depthwise stages and the Conformer's
//! depthwise 1-D convolution as a sum over the kernel taps of shifted views times per-channel
//! weights: correct and fast on every backend, but on NdArray each tap is a slice, a product and
//! a sum over the output (and a copy for the strided views), and each slice's backward
//! allocates an input-sized zero tensor (9 % of the 0.6B-width CPU step; bench/RESULTS.md,
//! "Training step against PyTorch on the CPU: the joint on the host"). Here the convolution is
//! one pass over its input forward, and one over the input and one over the output backward,
//! as a Burn autodiff operation with its own backward (as the TDT loss is, `asr_tdt::op`).
//!
//! Which backend: the model is generic over Burn's `Backend`, so [`on_host`] compares the
//! backend's type with NdArray's (bare: evaluation; under autodiff: training) and otherwise
//! returns `None`, and the caller runs the tap form. Only f32 tensors take this path.
//!
//! Invariants:
//! - the same geometry as the tap form: output `[B, Ho, Wo, C]`, `Ho = (H + 2 ph - kh) / sh + 1`,
//!   taps reading zero outside the input (tested against it, values and all three gradients);
//! - every output row, input-gradient row and partial weight sum is one task with a fixed
//!   order, and the partial sums are added in row order: the same bits at any thread count.

use std::any::{Any, TypeId};
use std::borrow::Cow;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use rayon::prelude::*;

/// A depthwise kernel's shape, stride and zero padding over `[B, H, W, C]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Kernel rows and columns (the weight is `[kh * kw, C]`, row-major over the taps).
    pub kernel: [usize; 2],
    /// Strides over rows and columns.
    pub stride: [usize; 2],
    /// Zero padding before the first row and column (and as much after).
    pub padding: [usize; 2],
}

impl Geometry {
    /// Output rows and columns for an input of `h` x `w`.
    pub fn output(&self, h: usize, w: usize) -> [usize; 2] {
        let out = |n: usize, d: usize| {
            (n + 2 * self.padding[d]).saturating_sub(self.kernel[d]) / self.stride[d] + 1
        };
        [out(h, 0), out(w, 1)]
    }

    /// Input index read by output index `o` at tap `t` along dimension `d`, if inside `n`.
    fn source(&self, o: usize, t: usize, d: usize, n: usize) -> Option<usize> {
        (o * self.stride[d] + t).checked_sub(self.padding[d]).filter(|&i| i < n)
    }
}

/// `x` `[B, H, W, C]` (or `[B, H, W, 1]`, its one channel read by every output channel)
/// convolved depthwise with `weight` `[kh * kw, C]` plus `bias` `[C]`, as one host operation,
/// where the backend is NdArray (bare or under autodiff) and the tensors f32; `None` elsewhere
/// (the caller runs the tap form). With `relu_rows`, the output is `relu` of that, zero on
/// every output row at or past `relu_rows[b]` of item `b` (a subsampling stage's ReLU and time
/// mask in the same pass).
pub fn on_host<B: Backend>(
    x: &Tensor<B, 4>,
    weight: &Tensor<B, 2>,
    bias: &Tensor<B, 1>,
    g: Geometry,
    relu_rows: Option<&[usize]>,
) -> Option<Tensor<B, 4>> {
    if relu_rows.is_some_and(|rows| rows.len() != x.dims()[0]) {
        return None;
    }
    let id = TypeId::of::<B>();
    if id == TypeId::of::<Autodiff<NdArray>>() {
        let (x, w, b) = (
            cast::<_, Tensor<Autodiff<NdArray>, 4>>(x.clone())?,
            cast(weight.clone())?,
            cast(bias.clone())?,
        );
        return cast(tracked(x, w, b, g, relu_rows)?);
    }
    if id == TypeId::of::<NdArray>() {
        let (x, w, b) = (
            cast::<_, Tensor<NdArray, 4>>(x.clone())?,
            cast::<_, Tensor<NdArray, 2>>(weight.clone())?,
            cast::<_, Tensor<NdArray, 1>>(bias.clone())?,
        );
        let dims = x.dims();
        let out = forward(&float(x), &float(w), &float(b), dims, g, relu_rows)?;
        return cast(Tensor::<NdArray, 4>::from_primitive(TensorPrimitive::Float(out)));
    }
    None
}

/// `a` as `T`: `Some` exactly when `A` is `T` (the caller compared the backend types).
pub(crate) fn cast<A: 'static, T: 'static>(a: A) -> Option<T> {
    (Box::new(a) as Box<dyn Any>).downcast::<T>().ok().map(|t| *t)
}

/// `a` as `T` where `A` is `T`: for a branch of `device_op::on_cube_types`, which compared the
/// backend types first (a mismatch is a bug there).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn same<A: 'static, T: 'static>(a: A) -> T {
    cast(a).unwrap_or_else(|| unreachable!("on_cube_types compared the types"))
}

pub(crate) fn float<B: Backend, const D: usize>(t: Tensor<B, D>) -> B::FloatTensorPrimitive {
    t.into_primitive().tensor()
}

/// Runs `f` over `t`'s values as f32 in row-major order (without a copy when they are f32 in
/// that order already); `None` for a tensor that is not a float one.
pub(crate) fn with_values<R>(t: &NdArrayTensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    match t {
        NdArrayTensor::F32(storage) => {
            let view = storage.view();
            if let Some(values) = view.as_slice() {
                return Some(f(values));
            }
            view.as_standard_layout().as_slice().map(f)
        }
        NdArrayTensor::F64(storage) => {
            storage.view().as_standard_layout().mapv(|v| v as f32).as_slice().map(f)
        }
        _ => None,
    }
}

pub(crate) fn tensor(values: Vec<f32>, shape: &[usize]) -> NdArrayTensor {
    NdArrayTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// The operation on `Autodiff<NdArray>`: the forward on the host, and a backward step that
/// keeps the input and weight, and with the ReLU the output (shared, not copied).
fn tracked(
    x: Tensor<Autodiff<NdArray>, 4>,
    w: Tensor<Autodiff<NdArray>, 2>,
    b: Tensor<Autodiff<NdArray>, 1>,
    g: Geometry,
    relu_rows: Option<&[usize]>,
) -> Option<Tensor<Autodiff<NdArray>, 4>> {
    let dims = x.dims();
    let (x, w, b) = (float(x), float(w), float(b));
    let out = forward(&x.primitive, &w.primitive, &b.primitive, dims, g, relu_rows)?;
    let nodes = [x.node.clone(), w.node.clone(), b.node.clone()];
    let out = match DepthwiseBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            // The ReLU's gate is the output's sign (a masked row is zero, so gated too).
            let gate = relu_rows.map(|_| out.clone());
            prep.finish(State { x: x.primitive, w: w.primitive, dims, g, gate }, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// The forward pass on the host: `[B, Ho, Wo, C]`.
fn forward(
    x: &NdArrayTensor,
    w: &NdArrayTensor,
    b: &NdArrayTensor,
    dims: [usize; 4],
    g: Geometry,
    relu_rows: Option<&[usize]>,
) -> Option<NdArrayTensor> {
    let [n, h, wd, cin] = dims;
    let [ho, wo] = g.output(h, wd);
    let [kh, kw] = g.kernel;
    if !matches!(x, NdArrayTensor::F32(_)) {
        return None;
    }
    let mut out = Vec::new();
    with_values(x, |xs| {
        with_values(w, |ws| {
            with_values(b, |bs| {
                let c = bs.len();
                if ws.len() != kh * kw * c || (cin != c && cin != 1) {
                    return None;
                }
                // Zeroed by the allocator (fresh pages at these sizes), written over the pool.
                // Each output is summed in a per-task buffer and then written once: a first
                // touch that reads (`+=` into the fresh vector) maps the shared zero page and
                // then faults again to copy it, with a TLB shootdown to every core, which
                // `perf` showed as 8 % of an encoder step's samples.
                out = vec![0f32; n * ho * wo * c];
                let rows = out.par_chunks_mut((wo * c).max(1)).enumerate();
                rows.for_each_init(
                    || vec![0f32; c],
                    |acc, (row, out)| {
                        let (bi, i) = (row / ho.max(1), row % ho.max(1));
                        if relu_rows.is_some_and(|rows| i >= rows[bi]) {
                            return;
                        }
                        for (j, o) in out.chunks_exact_mut(c).enumerate() {
                            acc.fill(0.0);
                            for r in 0..kh {
                                let Some(y) = g.source(i, r, 0, h) else { continue };
                                for k in 0..kw {
                                    let Some(z) = g.source(j, k, 1, wd) else { continue };
                                    let xr = &xs[((bi * h + y) * wd + z) * cin..][..cin];
                                    let wr = &ws[(r * kw + k) * c..][..c];
                                    if let [v] = xr {
                                        acc.iter_mut().zip(wr).for_each(|(a, w)| *a += v * w);
                                    } else {
                                        acc.iter_mut()
                                            .zip(xr.iter().zip(wr))
                                            .for_each(|(a, (x, w))| *a += x * w);
                                    }
                                }
                            }
                            o.iter_mut().zip(acc.iter().zip(bs)).for_each(|(o, (a, b))| *o = a + b);
                            if relu_rows.is_some() {
                                // As Burn's `relu`: a NaN stays NaN (`max` would hide it).
                                o.iter_mut().filter(|o| **o < 0.0).for_each(|o| *o = 0.0);
                            }
                        }
                    },
                );
                Some(c)
            })
        })
    })
    .flatten()
    .flatten()
    .flatten()
    .map(|c| tensor(out, &[n, ho, wo, c]))
}

/// What the backward step keeps of the forward (shared with it, not copied).
#[derive(Clone, Debug)]
struct State {
    /// The input.
    x: NdArrayTensor,
    /// The weight.
    w: NdArrayTensor,
    /// The input's dimensions.
    dims: [usize; 4],
    g: Geometry,
    /// The output, when a ReLU followed the convolution: its gradient passes where the output
    /// is not `<= 0`, as Burn's `relu` backward.
    gate: Option<NdArrayTensor>,
}

/// The backward step: the input's, the weight's and the bias's gradients from the output's.
#[derive(Debug)]
struct DepthwiseBackward;

impl Backward<NdArray, 3> for DepthwiseBackward {
    type State = State;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [px, pw, pb] = ops.parents;
        let upstream = grads.consume::<NdArray>(&ops.node);
        let state = ops.state;
        // The forward ran on f32 input and weight (`forward` takes no other), and NdArray's
        // float gradients are f32 or f64, which `with_values` reads: this cannot fail.
        let Grads { dx, dw, db } = gradients(&state, &upstream, px.is_some())
            .expect("the depthwise convolution's tensors are float");
        let [n, h, wd, cin] = state.dims;
        let [kh, kw] = state.g.kernel;
        let c = db.len();
        if let (Some(p), Some(dx)) = (px, dx) {
            grads.register::<NdArray>(p.id, tensor(dx, &[n, h, wd, cin]));
        }
        if let Some(p) = pw {
            grads.register::<NdArray>(p.id, tensor(dw, &[kh * kw, c]));
        }
        if let Some(p) = pb {
            grads.register::<NdArray>(p.id, tensor(db, &[c]));
        }
    }
}

/// The gradients of one call: the input's (when wanted), the weight's and the bias's.
struct Grads {
    dx: Option<Vec<f32>>,
    dw: Vec<f32>,
    db: Vec<f32>,
}

/// The output's gradient through the ReLU: zero where the output is `<= 0`.
fn gated(dy: &[f32], out: &[f32]) -> Vec<f32> {
    const CHUNK: usize = 1 << 14;
    dy.par_iter()
        .zip(out.par_iter())
        .with_min_len(CHUNK)
        .map(|(&g, &o)| if o <= 0.0 { 0.0 } else { g })
        .collect()
}

/// `(dx, dw, db)` from the output's gradient `dy` `[B, Ho, Wo, C]`; `dx` only when `want_dx`
/// (the first stage reads the features, which need none).
fn gradients(state: &State, dy: &NdArrayTensor, want_dx: bool) -> Option<Grads> {
    let State { x, w, dims, g, gate } = state;
    with_values(dy, |gs| {
        let dy: Cow<'_, [f32]> = match gate {
            Some(out) => Cow::Owned(
                with_values(out, |os| (os.len() == gs.len()).then(|| gated(gs, os))).flatten()?,
            ),
            None => Cow::Borrowed(gs),
        };
        with_values(x, |xs| with_values(w, |ws| host_gradients(xs, ws, &dy, *dims, *g, want_dx)))??
    })
    .flatten()
}

/// [`gradients`] over the values.
fn host_gradients(
    xs: &[f32],
    ws: &[f32],
    gs: &[f32],
    dims: [usize; 4],
    g: Geometry,
    want_dx: bool,
) -> Option<Grads> {
    let [n, h, wd, cin] = dims;
    let [ho, wo] = g.output(h, wd);
    let [kh, kw] = g.kernel;
    let taps = kh * kw;
    let c = ws.len() / taps.max(1);
    if gs.len() != n * ho * wo * c || ws.len() != taps * c || (cin != c && cin != 1) {
        return None;
    }
    // dx: each input row gathers from the output rows whose taps read it (one input channel:
    // the sum over the output channels).
    let dx = want_dx.then(|| {
        let mut dx = vec![0f32; n * h * wd * cin];
        // Summed in a per-task row and written once (see `forward`).
        dx.par_chunks_mut((wd * cin).max(1)).enumerate().for_each_init(
            || vec![0f32; wd * cin],
            |acc, (row, dx)| {
                let (bi, y) = (row / h.max(1), row % h.max(1));
                acc.fill(0.0);
                for r in 0..kh {
                    let Some(i) = gather(y, r, g, 0, ho) else { continue };
                    for (z, d) in acc.chunks_exact_mut(cin).enumerate() {
                        for k in 0..kw {
                            let Some(j) = gather(z, k, g, 1, wo) else { continue };
                            let gr = &gs[((bi * ho + i) * wo + j) * c..][..c];
                            let wr = &ws[(r * kw + k) * c..][..c];
                            if let [d] = d {
                                *d += gr.iter().zip(wr).map(|(g, w)| g * w).sum::<f32>();
                            } else {
                                d.iter_mut()
                                    .zip(gr.iter().zip(wr))
                                    .for_each(|(d, (g, w))| *d += g * w);
                            }
                        }
                    }
                }
                dx.copy_from_slice(acc);
            },
        );
        dx
    });
    // dw and db: one partial sum per output row, added in row order.
    let partials: Vec<Vec<f32>> = (0..n * ho)
        .into_par_iter()
        .map(|row| {
            let (bi, i) = (row / ho, row % ho);
            let mut acc = vec![0f32; (taps + 1) * c];
            for j in 0..wo {
                let gr = &gs[((bi * ho + i) * wo + j) * c..][..c];
                for r in 0..kh {
                    let Some(y) = g.source(i, r, 0, h) else { continue };
                    for k in 0..kw {
                        let Some(z) = g.source(j, k, 1, wd) else { continue };
                        let xr = &xs[((bi * h + y) * wd + z) * cin..][..cin];
                        let a = &mut acc[(r * kw + k) * c..][..c];
                        if let [v] = xr {
                            a.iter_mut().zip(gr).for_each(|(a, g)| *a += g * v);
                        } else {
                            a.iter_mut().zip(gr.iter().zip(xr)).for_each(|(a, (g, x))| *a += g * x);
                        }
                    }
                }
                let a = &mut acc[taps * c..];
                a.iter_mut().zip(gr).for_each(|(a, g)| *a += g);
            }
            acc
        })
        .collect();
    let mut total = vec![0f64; (taps + 1) * c];
    for p in &partials {
        total.iter_mut().zip(p).for_each(|(t, v)| *t += f64::from(*v));
    }
    let dw = total[..taps * c].iter().map(|&v| v as f32).collect();
    let db = total[taps * c..].iter().map(|&v| v as f32).collect();
    Some(Grads { dx, dw, db })
}

/// The output index whose tap `t` reads input index `i` along dimension `d`, if any.
fn gather(i: usize, t: usize, g: Geometry, d: usize, outputs: usize) -> Option<usize> {
    let at = (i + g.padding[d]).checked_sub(t)?;
    (at % g.stride[d] == 0).then_some(at / g.stride[d]).filter(|&o| o < outputs)
}
