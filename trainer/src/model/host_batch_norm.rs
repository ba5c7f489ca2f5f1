//! Batch normalisation in training, over a channels-last tensor, as one host operation on the
//! CPU backend.
//!
//! The Conformer's convolution module normalises `[B, T, C]` over its channels. Burn 0.21's
//! `BatchNorm` wants the channels second, so the call was `norm(x.swap_dims(1, 2))` and a swap
//! back. On NdArray its training forward is about a dozen tensor operations, two of them
//! reshapes of a transposed view (copies), each a serial pass on the calling thread, and as many
//! again backward. In the 0.6B-width encoder's forward it was 5 % of the calling thread's
//! samples (bench/RESULTS.md, "Reshapes without copies"). Here, on the rows of the channels-last
//! tensor, the forward is two passes and the backward two, split over rayon's pool, with no
//! transposition.
//!
//! Which backend: NdArray under autodiff (training) with f32 tensors; `None` elsewhere, and the
//! caller runs Burn's `BatchNorm` (evaluation reads the running statistics, a cheap path).
//!
//! Invariants: Burn's training semantics. The batch's mean and biased variance per channel
//! normalise; the running statistics become `(1 - momentum) * running + momentum * batch`,
//! without gradient. The gradient flows through the batch statistics. Per-channel sums are
//! float64, over fixed blocks of rows added in order, so the bits are the same at any thread
//! count. The variance is `E[x²] - mean²` in float64: for f32 inputs its cancellation error is
//! far below f32's resolution.

use super::host_depthwise::{cast, float, tensor, with_values};
use super::host_layer_norm::{backward, State};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::{Autodiff, NdArray};
use burn::nn::BatchNorm;
use burn::prelude::*;
use burn::tensor::{TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

/// Rows per parallel task (and per partial sum).
const ROWS: usize = 32;

type Train = Autodiff<NdArray>;

/// `norm`'s training forward over `x`'s last dimension (the channels), updating its running
/// statistics, as one host operation where the backend is NdArray under autodiff and the
/// tensors f32; `None` elsewhere (nothing is then updated).
pub fn train_on_host<B: Backend, const D: usize>(
    norm: &BatchNorm<B>,
    x: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    let c = norm.gamma.dims()[0];
    if D == 0
        || x.dims()[D - 1] != c
        || std::any::TypeId::of::<B>() != std::any::TypeId::of::<Train>()
    {
        return None;
    }
    let xt = float(cast::<_, Tensor<Train, D>>(x.clone())?);
    let g = float(cast::<_, Tensor<Train, 1>>(norm.gamma.val())?);
    let b = float(cast::<_, Tensor<Train, 1>>(norm.beta.val())?);
    let read = |t: Tensor<B, 1>| t.into_data().to_vec::<f32>().ok();
    let (running_mean, running_var) =
        (read(norm.running_mean.value_sync())?, read(norm.running_var.value_sync())?);
    let (out, stats) = forward(&xt.primitive, &g.primitive, &b.primitive, norm.epsilon)?;
    let m = norm.momentum;
    let blend = |running: &[f32], batch: &[f64]| -> Vec<f32> {
        running
            .iter()
            .zip(batch)
            .map(|(&r, &v)| (f64::from(r) * (1.0 - m) + v * m) as f32)
            .collect()
    };
    let device = x.device();
    let update =
        |values: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(values, [c]), &device);
    super::running_stats::replace(&norm.running_mean, update(blend(&running_mean, &stats.mean)));
    super::running_stats::replace(&norm.running_var, update(blend(&running_var, &stats.var)));
    let state = State {
        x: xt.primitive.clone(),
        gamma: g.primitive.clone(),
        stats: backward_stats(&stats),
    };
    let nodes = [xt.node.clone(), g.node.clone(), b.node.clone()];
    let out = match NormBackward.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    cast(Tensor::<Train, D>::from_primitive(TensorPrimitive::Float(out)))
}

/// The batch's statistics per channel.
struct Stats {
    mean: Vec<f64>,
    /// Biased.
    var: Vec<f64>,
    rstd: Vec<f64>,
}

/// What the backward needs: each channel's mean and `1 / sqrt(var + eps)`, in float64: the
/// scale gradient's sum cancels (the normalised values sum to zero), so f32 normalised values
/// would cost it digits.
fn backward_stats(stats: &Stats) -> Vec<(f64, f64)> {
    stats.mean.iter().copied().zip(stats.rstd.iter().copied()).collect()
}

/// Per-channel sums of `f(row)` over fixed blocks of `ROWS` rows, the blocks added in order.
fn channel_sums<const K: usize>(
    rows: usize,
    c: usize,
    f: impl Fn(usize, &mut [[f64; K]]) + Sync,
) -> Vec<[f64; K]> {
    let partial: Vec<Vec<[f64; K]>> = (0..rows.div_ceil(ROWS))
        .into_par_iter()
        .map(|task| {
            let mut sums = vec![[0f64; K]; c];
            for r in task * ROWS..((task + 1) * ROWS).min(rows) {
                f(r, &mut sums);
            }
            sums
        })
        .collect();
    let mut total = vec![[0f64; K]; c];
    for block in &partial {
        for (t, p) in total.iter_mut().zip(block) {
            for k in 0..K {
                t[k] += p[k];
            }
        }
    }
    total
}

/// The forward pass and the batch's statistics; `None` when a tensor is not f32.
fn forward(
    x: &NdArrayTensor,
    gamma: &NdArrayTensor,
    beta: &NdArrayTensor,
    eps: f64,
) -> Option<(NdArrayTensor, Stats)> {
    if !matches!(x, NdArrayTensor::F32(_)) {
        return None;
    }
    let dims = x.shape().to_vec();
    let c = *dims.last()?;
    with_values(x, |xs| {
        with_values(gamma, |gs| {
            with_values(beta, |bs| {
                let rows = xs.len().checked_div(c)?;
                let n = rows.max(1) as f64;
                let sums = channel_sums::<2>(rows, c, |r, sums| {
                    for (s, &v) in sums.iter_mut().zip(&xs[r * c..(r + 1) * c]) {
                        let v = f64::from(v);
                        s[0] += v;
                        s[1] += v * v;
                    }
                });
                let mean: Vec<f64> = sums.iter().map(|s| s[0] / n).collect();
                let var: Vec<f64> =
                    sums.iter().zip(&mean).map(|(s, m)| (s[1] / n - m * m).max(0.0)).collect();
                let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
                // y = x * scale + shift per channel.
                let scale: Vec<f32> =
                    rstd.iter().zip(gs).map(|(&r, &g)| (r * f64::from(g)) as f32).collect();
                let shift: Vec<f32> = (0..c)
                    .map(|j| (f64::from(bs[j]) - mean[j] * rstd[j] * f64::from(gs[j])) as f32)
                    .collect();
                let mut out = vec![0f32; xs.len()];
                out.par_chunks_mut(c * ROWS).zip(xs.par_chunks(c * ROWS)).for_each(|(o, x)| {
                    for (o, x) in o.chunks_mut(c).zip(x.chunks(c)) {
                        for j in 0..c {
                            o[j] = x[j] * scale[j] + shift[j];
                        }
                    }
                });
                Some((tensor(out, &dims), Stats { mean, var, rstd }))
            })
        })
    })
    .flatten()
    .flatten()
    .flatten()
}

#[derive(Debug)]
struct NormBackward;

impl Backward<NdArray, 3> for NormBackward {
    type State = State<Vec<(f64, f64)>>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        backward(ops, grads, |xs, gs, dy, stats: &Vec<_>| gradients(xs, gs, dy, stats));
    }
}

/// `(dx, dgamma, dbeta)`. With `n = (x - mean) * rstd` per channel over the `N` rows,
/// `dbeta = sum(dy)`, `dgamma = sum(dy * n)` and
/// `dx = gamma * rstd * (dy - dbeta / N - n * dgamma / N)`.
fn gradients(
    xs: &[f32],
    gs: &[f32],
    dy: &[f32],
    stats: &[(f64, f64)],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let c = gs.len();
    let rows = xs.len() / c.max(1);
    let sums = channel_sums::<2>(rows, c, |r, sums| {
        let (x, g) = (&xs[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
        for j in 0..c {
            let (m, rs) = stats[j];
            let g = f64::from(g[j]);
            sums[j][0] += g;
            sums[j][1] += g * (f64::from(x[j]) - m) * rs;
        }
    });
    let n = rows.max(1) as f64;
    let a: Vec<f32> = sums.iter().map(|s| (s[0] / n) as f32).collect();
    let b: Vec<f32> = sums.iter().map(|s| (s[1] / n) as f32).collect();
    let k: Vec<f32> = (0..c).map(|j| (f64::from(gs[j]) * stats[j].1) as f32).collect();
    let short: Vec<(f32, f32)> = stats.iter().map(|&(m, r)| (m as f32, r as f32)).collect();
    let mut dx = vec![0f32; xs.len()];
    dx.par_chunks_mut(c * ROWS).enumerate().for_each(|(task, out)| {
        for (i, o) in out.chunks_mut(c).enumerate() {
            let r = task * ROWS + i;
            let (x, g) = (&xs[r * c..(r + 1) * c], &dy[r * c..(r + 1) * c]);
            for j in 0..c {
                let (m, rs) = short[j];
                o[j] = k[j] * (g[j] - a[j] - (x[j] - m) * rs * b[j]);
            }
        }
    });
    let db = sums.iter().map(|s| s[0] as f32).collect();
    let dg = sums.iter().map(|s| s[1] as f32).collect();
    (dx, dg, db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::BatchNormConfig;

    #[test]
    fn matches_float64_and_burn_s_batch_norm_with_its_running_statistics() {
        let device = Default::default();
        let (batch, frames, c) = (3, 2 * ROWS / 3 + 7, 24); // several blocks, the last short
        let rows = batch * frames;
        let values: Vec<f32> = (0..rows * c)
            .map(|i| ((i * 7919) % 2003) as f32 / 100.0 - 10.0 + (i % c) as f32 * 0.7)
            .collect();
        let mix: Vec<f32> = (0..rows * c).map(|i| 0.5 + (i % 13) as f32 * 0.2).collect();
        let gamma: Vec<f32> = (0..c).map(|j| 0.5 + j as f32 * 0.03).collect();
        let beta: Vec<f32> = (0..c).map(|j| j as f32 * 0.01 - 0.2).collect();
        let init = || {
            let mut norm = BatchNormConfig::new(c).init::<Train>(&device);
            norm.gamma = burn::module::Param::from_tensor(Tensor::from_data(
                TensorData::new(gamma.clone(), [c]),
                &device,
            ));
            norm.beta = burn::module::Param::from_tensor(Tensor::from_data(
                TensorData::new(beta.clone(), [c]),
                &device,
            ));
            norm
        };
        let (host_norm, burn_norm) = (init(), init());
        let leaf = || {
            Tensor::<Train, 3>::from_data(
                TensorData::new(values.clone(), [batch, frames, c]),
                &device,
            )
            .require_grad()
        };
        let weights = Tensor::<Train, 3>::from_data(
            TensorData::new(mix.clone(), [batch, frames, c]),
            &device,
        );
        let (xh, xb) = (leaf(), leaf());
        let host =
            train_on_host(&host_norm, &xh).expect("NdArray under autodiff takes the host path");
        let burn = burn_norm.forward(xb.clone().swap_dims(1, 2)).swap_dims(1, 2);
        let gh = (host.clone() * weights.clone()).sum().backward();
        let gb = (burn.clone() * weights).sum().backward();
        let read3 = |t: Tensor<Train, 3>| t.into_data().to_vec::<f32>().expect("f32");
        let read = |t: Tensor<NdArray, 3>| t.into_data().to_vec::<f32>().expect("f32");
        let read1 = |t: Tensor<NdArray, 1>| t.into_data().to_vec::<f32>().expect("f32");
        let state = |t: Tensor<Train, 1>| t.into_data().to_vec::<f32>().expect("f32");
        let (yh, yb) = (read3(host), read3(burn));
        let (dxh, dxb) = (read(xh.grad(&gh).expect("dx")), read(xb.grad(&gb).expect("dx")));
        let dgh = read1(host_norm.gamma.val().grad(&gh).expect("dgamma"));
        let dbh = read1(host_norm.beta.val().grad(&gh).expect("dbeta"));
        let dgb = read1(burn_norm.gamma.val().grad(&gb).expect("dgamma"));
        // The float64 oracle.
        let n = rows as f64;
        let (mut mean, mut var) = (vec![0f64; c], vec![0f64; c]);
        for r in 0..rows {
            for j in 0..c {
                mean[j] += f64::from(values[r * c + j]) / n;
            }
        }
        for r in 0..rows {
            for j in 0..c {
                var[j] += (f64::from(values[r * c + j]) - mean[j]).powi(2) / n;
            }
        }
        let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();
        let norm_at = |i: usize| (f64::from(values[i]) - mean[i % c]) * rstd[i % c];
        let (mut dg, mut db) = (vec![0f64; c], vec![0f64; c]);
        for i in 0..rows * c {
            dg[i % c] += f64::from(mix[i]) * norm_at(i);
            db[i % c] += f64::from(mix[i]);
        }
        let y: Vec<f64> = (0..rows * c)
            .map(|i| norm_at(i) * f64::from(gamma[i % c]) + f64::from(beta[i % c]))
            .collect();
        let dx: Vec<f64> = (0..rows * c)
            .map(|i| {
                let j = i % c;
                f64::from(gamma[j])
                    * rstd[j]
                    * (f64::from(mix[i]) - db[j] / n - norm_at(i) * dg[j] / n)
            })
            .collect();
        let worst = |got: &[f32], want: &[f64]| {
            let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            got.iter().zip(want).fold(0f64, |m, (&a, b)| m.max((f64::from(a) - b).abs() / scale))
        };
        let eh = [worst(&yh, &y), worst(&dxh, &dx), worst(&dgh, &dg), worst(&dbh, &db)];
        let eb = [worst(&yb, &y), worst(&dxb, &dx), worst(&dgb, &dg)];
        // Running statistics after one step, from 0 and 1 at momentum 0.1: Burn's update.
        let want_mean: Vec<f64> = mean.iter().map(|m| 0.1 * m).collect();
        let want_var: Vec<f64> = var.iter().map(|v| 0.9 + 0.1 * v).collect();
        let er = [
            worst(&state(host_norm.running_mean.value_sync()), &want_mean),
            worst(&state(host_norm.running_var.value_sync()), &want_var),
        ];
        let ebr = [
            worst(&state(burn_norm.running_mean.value_sync()), &want_mean),
            worst(&state(burn_norm.running_var.value_sync()), &want_var),
        ];
        println!(
            "host y dx dgamma dbeta {eh:?} running {er:?}; burn y dx dgamma {eb:?} running {ebr:?}"
        );
        // Measured, relative to the largest float64 value: y 1.5e-7, dx 1.3e-7, dgamma 3.9e-8,
        // dbeta 5.2e-8, running mean 3.1e-8 and variance 5.4e-8. The bounds are 5x those.
        assert!(eh[0] < 7.5e-7 && eh[1] < 6.6e-7 && eh[2] < 2e-7 && eh[3] < 2.6e-7, "host {eh:?}");
        assert!(er[0] < 1.6e-7 && er[1] < 2.7e-7, "running {er:?}");
        // Burn's own form, a second truth, measured y 2.6e-7, dx 7.8e-7, dgamma 5.3e-6 (its
        // sums in f32), running statistics 1.6e-7: within 5x of its largest.
        assert!(eb.iter().chain(&ebr).all(|&e| e < 2.7e-5), "burn {eb:?} {ebr:?}");
        // Evaluation (no autodiff) is not taken here.
        let bare =
            Tensor::<NdArray, 3>::from_data(TensorData::new(values, [batch, frames, c]), &device);
        let eval_norm = BatchNormConfig::new(c).init::<NdArray>(&device);
        assert!(train_on_host(&eval_norm, &bare).is_none());
    }
}
