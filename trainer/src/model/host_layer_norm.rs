//! Layer normalisation over the last dimension as one host operation on the CPU backend.
//!
//! Burn 0.21's `layer_norm` on NdArray is seven tensor operations (two means, a subtraction, a
//! product, a square root, a division, then the scale and shift), each a fresh array and a
//! serial pass on the calling thread, with as many steps again backward. The Conformer block
//! runs five of them; in the 0.6B-width encoder's forward they were 7 % of the calling
//! thread's samples (bench/RESULTS.md, "Reshapes without copies"). Here the forward is one pass
//! per row and the backward one pass, both split over rayon's pool; the backward keeps the
//! input (shared, not copied) and each row's mean and reciprocal deviation.
//!
//! Which backend: NdArray bare or under autodiff, f32 tensors (as `host_depthwise`, whose
//! helpers this shares); `None` elsewhere, and the caller runs Burn's `LayerNorm`.
//!
//! Invariants: Burn's formula, `(x - mean) / sqrt(var + eps) * gamma + beta` with the biased
//! variance; each row's statistics and the scale and shift gradients summed in float64, the
//! latter over fixed blocks of rows reduced in order, so the same bits at any thread count.

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

/// Rows per parallel task (and per partial sum of the scale and shift gradients).
const ROWS: usize = 16;

/// `layer_norm(x) * gamma + beta` over `x`'s last dimension, as one host operation where the
/// backend is NdArray (bare or under autodiff) and the tensors f32; `None` elsewhere.
pub fn on_host<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    gamma: &Tensor<B, 1>,
    beta: Option<&Tensor<B, 1>>,
    eps: f64,
) -> Option<Tensor<B, D>> {
    if D == 0
        || x.dims()[D - 1] != gamma.dims()[0]
        || beta.is_some_and(|b| b.dims() != gamma.dims())
    {
        return None;
    }
    let id = std::any::TypeId::of::<B>();
    if id == std::any::TypeId::of::<Autodiff<NdArray>>() {
        let x = float(cast::<_, Tensor<Autodiff<NdArray>, D>>(x.clone())?);
        let g = float(cast::<_, Tensor<Autodiff<NdArray>, 1>>(gamma.clone())?);
        let b = match beta {
            Some(b) => Some(float(cast::<_, Tensor<Autodiff<NdArray>, 1>>(b.clone())?)),
            None => None,
        };
        let (out, stats) =
            forward(&x.primitive, &g.primitive, b.as_ref().map(|b| &b.primitive), eps)?;
        let state = State { x: x.primitive.clone(), gamma: g.primitive.clone(), stats };
        let out = match &b {
            Some(b) => record([&x, &g, b], state, out),
            None => record([&x, &g], state, out),
        };
        return cast(Tensor::<Autodiff<NdArray>, D>::from_primitive(TensorPrimitive::Float(out)));
    }
    if id == std::any::TypeId::of::<NdArray>() {
        let x = float(cast::<_, Tensor<NdArray, D>>(x.clone())?);
        let g = float(cast::<_, Tensor<NdArray, 1>>(gamma.clone())?);
        let b = match beta {
            Some(b) => Some(float(cast::<_, Tensor<NdArray, 1>>(b.clone())?)),
            None => None,
        };
        let (out, _) = forward(&x, &g, b.as_ref(), eps)?;
        return cast(Tensor::<NdArray, D>::from_primitive(TensorPrimitive::Float(out)));
    }
    None
}

type Tracked = burn::tensor::ops::FloatTensor<Autodiff<NdArray>>;

/// Records the step with its parents (the input, the scale and, when there is one, the shift).
fn record<const N: usize>(
    parents: [&Tracked; N],
    state: State<Stats>,
    out: NdArrayTensor,
) -> Tracked {
    let nodes = parents.map(|p| p.node.clone());
    match NormBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// Each row's mean and `1 / sqrt(var + eps)`.
type Stats = Vec<(f32, f32)>;

/// The forward pass; `None` when a tensor is not f32.
fn forward(
    x: &NdArrayTensor,
    gamma: &NdArrayTensor,
    beta: Option<&NdArrayTensor>,
    eps: f64,
) -> Option<(NdArrayTensor, Stats)> {
    if !matches!(x, NdArrayTensor::F32(_)) {
        return None;
    }
    let dims = x.shape().to_vec();
    let d = *dims.last()?;
    let (out, stats) = with_values(x, |xs| {
        with_values(gamma, |gs| {
            let bs = match beta {
                Some(b) => with_values(b, |bs| bs.to_vec())?,
                None => vec![0f32; d],
            };
            let rows = xs.len().checked_div(d)?;
            let mut out = vec![0f32; rows * d];
            let mut stats = vec![(0f32, 0f32); rows];
            out.par_chunks_mut(d * ROWS).zip(stats.par_chunks_mut(ROWS)).enumerate().for_each(
                |(task, (outs, st))| {
                    for (k, (o, s)) in outs.chunks_mut(d).zip(st.iter_mut()).enumerate() {
                        let r = task * ROWS + k;
                        let row = &xs[r * d..(r + 1) * d];
                        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
                        let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>()
                            / d as f64;
                        let rstd = 1.0 / (var + eps).sqrt();
                        let (m, rs) = (mean as f32, rstd as f32);
                        for (((o, &v), &g), &b) in o.iter_mut().zip(row).zip(gs).zip(&bs) {
                            *o = (v - m) * rs * g + b;
                        }
                        *s = (m, rs);
                    }
                },
            );
            Some((out, stats))
        })?
    })??;
    Some((tensor(out, &dims), stats))
}

/// A host normalisation's backward state, shared with `host_batch_norm`.
#[derive(Debug, Clone)]
pub(super) struct State<S> {
    /// The input (shared with the forward, not copied) and the scale.
    pub(super) x: NdArrayTensor,
    pub(super) gamma: NdArrayTensor,
    /// What the gradients need of the forward's statistics.
    pub(super) stats: S,
}

#[derive(Debug)]
struct NormBackward;

impl<const N: usize> Backward<NdArray, N> for NormBackward {
    type State = State<Stats>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        backward(ops, grads, gradients);
    }
}

/// A host normalisation's backward, shared with `host_batch_norm`: `f(x, gamma, dy, stats)`
/// over the values gives `(dx, dgamma, dbeta)`, registered for the parents present (the input,
/// the scale and, when there is one, the shift; without a shift its gradient goes unused).
pub(super) fn backward<S, const N: usize>(
    ops: Ops<State<S>, N>,
    grads: &mut Gradients,
    f: impl FnOnce(&[f32], &[f32], &[f32], &S) -> (Vec<f32>, Vec<f32>, Vec<f32>),
) {
    let upstream = grads.consume::<NdArray>(&ops.node);
    let State { x, gamma, stats } = ops.state;
    let dims = x.shape().to_vec();
    // The forward ran on f32 tensors of these shapes, and NdArray's float gradients are f32 or
    // f64, which `with_values` reads: this cannot fail.
    let (dx, dg, db) = with_values(&x, |xs| {
        with_values(&gamma, |gs| {
            with_values(&upstream, |dy| (dy.len() == xs.len()).then(|| f(xs, gs, dy, &stats)))
                .flatten()
        })
        .flatten()
    })
    .flatten()
    .expect("the normalisation's tensors are f32 of the forward's shapes");
    let d = dg.len();
    let out = [tensor(dx, &dims), tensor(dg, &[d]), tensor(db, &[d])];
    for (parent, g) in ops.parents.iter().zip(out) {
        if let Some(p) = parent {
            grads.register::<NdArray>(p.id, g);
        }
    }
}

/// `(dx, dgamma, dbeta)`. With `n = (x - mean) * rstd` and `h = dy * gamma` per row,
/// `dx = rstd * (h - mean(h) - n * mean(h * n))`, `dgamma = sum(dy * n)`, `dbeta = sum(dy)`.
fn gradients(xs: &[f32], gs: &[f32], dy: &[f32], stats: &Stats) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d = gs.len();
    let mut dx = vec![0f32; xs.len()];
    let partial: Vec<(Vec<f64>, Vec<f64>)> = dx
        .par_chunks_mut(d * ROWS)
        .enumerate()
        .map(|(task, dxs)| {
            let (mut dg, mut db) = (vec![0f64; d], vec![0f64; d]);
            let mut n = vec![0f32; d];
            for (k, out) in dxs.chunks_mut(d).enumerate() {
                let r = task * ROWS + k;
                let (m, rs) = stats[r];
                let (row, g) = (&xs[r * d..(r + 1) * d], &dy[r * d..(r + 1) * d]);
                let (mut sum_h, mut sum_hn) = (0f64, 0f64);
                for j in 0..d {
                    n[j] = (row[j] - m) * rs;
                    let h = f64::from(g[j] * gs[j]);
                    sum_h += h;
                    sum_hn += h * f64::from(n[j]);
                    dg[j] += f64::from(g[j]) * f64::from(n[j]);
                    db[j] += f64::from(g[j]);
                }
                let (a, b) = ((sum_h / d as f64) as f32, (sum_hn / d as f64) as f32);
                for j in 0..d {
                    out[j] = rs * (g[j] * gs[j] - a - n[j] * b);
                }
            }
            (dg, db)
        })
        .collect();
    // The blocks' sums in order: the same bits whatever thread ran which block.
    let (mut dg, mut db) = (vec![0f64; d], vec![0f64; d]);
    for (pg, pb) in &partial {
        dg.iter_mut().zip(pg).for_each(|(s, v)| *s += v);
        db.iter_mut().zip(pb).for_each(|(s, v)| *s += v);
    }
    (dx, dg.into_iter().map(|v| v as f32).collect(), db.into_iter().map(|v| v as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::LayerNormConfig;

    type Train = Autodiff<NdArray>;

    #[test]
    fn matches_float64_and_burn_s_layer_norm() {
        let device = Default::default();
        let (rows, d) = (3 * ROWS + 5, 48); // several blocks, the last one short
        let values: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 7919) % 2003) as f32 / 100.0 - 10.0 + (i / d) as f32 * 0.5)
            .collect();
        let mix: Vec<f32> = (0..rows * d).map(|i| 0.5 + (i % 13) as f32 * 0.2).collect();
        let gamma: Vec<f32> = (0..d).map(|j| 0.5 + j as f32 * 0.03).collect();
        let beta: Vec<f32> = (0..d).map(|j| j as f32 * 0.01 - 0.2).collect();
        let eps = 1e-5;
        let mut norm = LayerNormConfig::new(d).with_epsilon(eps).init::<Train>(&device);
        norm.gamma = burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(gamma.clone(), [d]),
            &device,
        ));
        norm.beta = Some(burn::module::Param::from_tensor(Tensor::from_data(
            TensorData::new(beta.clone(), [d]),
            &device,
        )));
        let leaf = || {
            Tensor::<Train, 3>::from_data(TensorData::new(values.clone(), [1, rows, d]), &device)
                .require_grad()
        };
        let weights =
            Tensor::<Train, 3>::from_data(TensorData::new(mix.clone(), [1, rows, d]), &device);
        let (xh, xb) = (leaf(), leaf());
        let host =
            on_host(&xh, &norm.gamma.val(), norm.beta.as_ref().map(|b| b.val()).as_ref(), eps)
                .expect("NdArray takes the host path");
        let burn = norm.forward(xb.clone());
        let gh = (host.clone() * weights.clone()).sum().backward();
        let gb = (burn.clone() * weights).sum().backward();
        let read3 = |t: Tensor<Train, 3>| t.into_data().to_vec::<f32>().expect("f32");
        let read = |t: Tensor<NdArray, 3>| t.into_data().to_vec::<f32>().expect("f32");
        let read1 = |t: Tensor<NdArray, 1>| t.into_data().to_vec::<f32>().expect("f32");
        let (yh, yb) = (read3(host), read3(burn));
        let (dxh, dxb) = (read(xh.grad(&gh).expect("dx")), read(xb.grad(&gb).expect("dx")));
        let dgh = read1(norm.gamma.val().grad(&gh).expect("dgamma"));
        let dbh = read1(norm.beta.as_ref().expect("beta").val().grad(&gh).expect("dbeta"));
        // The float64 oracle.
        let (mut y, mut dx) = (vec![0f64; rows * d], vec![0f64; rows * d]);
        let (mut dg, mut db) = (vec![0f64; d], vec![0f64; d]);
        for r in 0..rows {
            let row: Vec<f64> = values[r * d..(r + 1) * d].iter().map(|&v| f64::from(v)).collect();
            let m = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / d as f64;
            let rs = 1.0 / (var + eps).sqrt();
            let n: Vec<f64> = row.iter().map(|v| (v - m) * rs).collect();
            let g: Vec<f64> = (0..d).map(|j| f64::from(mix[r * d + j])).collect();
            let h: Vec<f64> = (0..d).map(|j| g[j] * f64::from(gamma[j])).collect();
            let a = h.iter().sum::<f64>() / d as f64;
            let b = (0..d).map(|j| h[j] * n[j]).sum::<f64>() / d as f64;
            for j in 0..d {
                y[r * d + j] = n[j] * f64::from(gamma[j]) + f64::from(beta[j]);
                dx[r * d + j] = rs * (h[j] - a - n[j] * b);
                dg[j] += g[j] * n[j];
                db[j] += g[j];
            }
        }
        let worst = |got: &[f32], want: &[f64]| {
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            got.iter().zip(want).fold(0f64, |m, (&a, b)| m.max((f64::from(a) - b).abs() / scale))
        };
        let (eh, eb) = ([worst(&yh, &y), worst(&dxh, &dx)], [worst(&yb, &y), worst(&dxb, &dx)]);
        let (eg, ed) = (worst(&dgh, &dg), worst(&dbh, &db));
        println!(
            "host y {:e} dx {:e} dgamma {eg:e} dbeta {ed:e}; burn y {:e} dx {:e}",
            eh[0], eh[1], eb[0], eb[1]
        );
        // Measured, relative to the largest float64 value: y 1.3e-7, dx 1.9e-7, dgamma 8.9e-8,
        // dbeta 4.2e-8 (Burn's own form: y 2.6e-7, dx 1.3e-4, its means summed in f32 over rows
        // far from zero). The bounds are 5x the host's.
        assert!(
            eh[0] < 6.5e-7 && eh[1] < 9.7e-7 && eg < 4.5e-7 && ed < 2.1e-7,
            "host {eh:?} {eg:e} {ed:e}"
        );
        // Evaluation (no autodiff) takes the same forward.
        let bare =
            Tensor::<NdArray, 3>::from_data(TensorData::new(values.clone(), [1, rows, d]), &device);
        let g = Tensor::<NdArray, 1>::from_data(TensorData::new(gamma, [d]), &device);
        let b = Tensor::<NdArray, 1>::from_data(TensorData::new(beta, [d]), &device);
        let eval = on_host(&bare, &g, Some(&b), eps).expect("NdArray takes the host path");
        assert_eq!(read(eval), yh);
    }
}
