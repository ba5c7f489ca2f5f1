//! AdamW with one pass over each parameter on the CPU backends.
//!
//! Burn's `AdamW` updates a parameter with about fifteen tensor operations (two moments, their
//! bias corrections, the square root, the division, the decay and the step), each a pass over
//! the parameter: 9.5 % of the 0.6B-width CPU step went there (bench/RESULTS.md, "Training step
//! against PyTorch on the CPU: the joint on the host"). [`HostAdamW`] computes the same update
//! in one pass over the parameter, its gradient and both moments, on the host, where the CPU
//! backends keep their tensors anyway.
//!
//! It is Burn's AdamW, not another optimizer:
//! - its state is Burn's `AdamWState`, so checkpoints are the same bytes either way and either
//!   resumes the other's;
//! - every element goes through the same f32 operations in the same order as Burn's tensor
//!   operations (no fused multiply-add, the scalars rounded to f32 as the backends round them),
//!   so the update is the same bits (tested against Burn's `AdamW` on NdArray);
//! - elsewhere (the GPU backends, a tensor that is not f32) it is Burn's `AdamW` itself.

use burn::optim::{AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, SimpleOptimizer};
use burn::prelude::*;
use burn::tensor::DType;
use rayon::prelude::*;

/// Elements per parallel task: large enough that a task's start costs nothing next to it.
const CHUNK: usize = 1 << 16;

/// AdamW's settings, as `AdamWConfig` takes them (no AMSGrad, no cautious decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWSettings {
    /// First-moment decay.
    pub beta_1: f32,
    /// Second-moment decay.
    pub beta_2: f32,
    /// Added to the second moment's root.
    pub epsilon: f32,
    /// Decoupled weight decay (times the learning rate).
    pub weight_decay: f32,
}

/// Burn's AdamW, computed in one host pass per parameter where `host` is set (see the module).
#[derive(Clone)]
pub struct HostAdamW {
    settings: AdamWSettings,
    /// Burn's own, for the backends whose tensors are not on the host.
    graph: AdamW,
    host: bool,
}

impl HostAdamW {
    /// AdamW with `settings`; `host`: update on the host (a CPU backend).
    pub fn new(settings: AdamWSettings, host: bool) -> Self {
        HostAdamW { settings, graph: Self::burn(settings), host }
    }

    /// Burn's own AdamW with `settings`.
    pub fn burn(settings: AdamWSettings) -> AdamW {
        AdamWConfig::new()
            .with_beta_1(settings.beta_1)
            .with_beta_2(settings.beta_2)
            .with_epsilon(settings.epsilon)
            .with_weight_decay(settings.weight_decay)
            .build()
    }
}

impl<B: Backend> SimpleOptimizer<B> for HostAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let f32_only = tensor.dtype() == DType::F32
            && grad.dtype() == DType::F32
            && state.as_ref().is_none_or(|s| {
                s.momentum.moment_1.dtype() == DType::F32
                    && s.momentum.moment_2.dtype() == DType::F32
                    && s.momentum.max_moment_2.is_none()
            });
        if !self.host || !f32_only {
            return self.graph.step(lr, tensor, grad, state);
        }
        let (param, state) = host_step(&self.settings, lr, tensor, grad, state.map(|s| s.momentum));
        (param, Some(AdamWState { momentum: state }))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}

/// Reads an f32 tensor to the host.
fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    // `HostAdamW::step` sends only f32 tensors here, whose data is f32.
    t.into_data().into_vec::<f32>().expect("an f32 tensor's data reads as f32")
}

/// One AdamW step of `tensor` on the host: the new parameter and moments.
fn host_step<B: Backend, const D: usize>(
    s: &AdamWSettings,
    lr: f64,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: Option<AdaptiveMomentumState<B, D>>,
) -> (Tensor<B, D>, AdaptiveMomentumState<B, D>) {
    let device = tensor.device();
    let shape = tensor.shape();
    let n = shape.num_elements();
    // The decay first, as Burn's f32 product (Burn skips it at a zero rate, where the product by
    // one changes nothing). The parameter is shared with the model the trainer still holds:
    // reading it with `into_data` goes element by element (a quarter of a 0.6B-width CPU step),
    // so on NdArray the product reads it in place over rayon's pool (`mul_scalar` had run on the
    // calling thread: 4 % of its samples in a release step), and elsewhere the product's result
    // is the optimizer's own and is read without a copy.
    let decay_rate = lr * f64::from(s.weight_decay);
    let decay = if decay_rate == 0.0 { 1.0 } else { 1.0 - decay_rate };
    let mut p = match super::grads::scaled_on_host(&tensor, decay) {
        Some(p) => p,
        None => values(tensor.mul_scalar(decay)),
    };
    let g = values(grad);
    let (time, mut m, mut v) = match state {
        Some(st) => (st.time + 1, values(st.moment_1), values(st.moment_2)),
        // Burn starts the moments at (1 - beta) g and (1 - beta) g^2: zero moments updated.
        None => (1, vec![0.0; n], vec![0.0; n]),
    };
    let first = time == 1;
    // The scalars as Burn's operations see them: its scalar arguments become the element type
    // (f32) before the operation.
    let (b1, b2, eps) = (s.beta_1, s.beta_2, s.epsilon);
    let (f1, f2) = (1.0 - b1, 1.0 - b2);
    let c1 = 1f32 - b1.powi(time as i32);
    let c2 = 1f32 - b2.powi(time as i32);
    let lr32 = lr as f32;
    p.par_chunks_mut(CHUNK)
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK))
        .for_each(|(((p, m), v), g)| {
            for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
                // The same f32 operations, in the same order, as `AdamW::step` and
                // `AdaptiveMomentumW::transform`.
                if first {
                    *m = g * f1;
                    *v = (g * g) * f2;
                } else {
                    *m = *m * b1 + g * f1;
                    *v = *v * b2 + (g * g) * f2;
                }
                let delta = (*m / c1) / ((*v / c2).sqrt() + eps);
                *p -= delta * lr32;
            }
        });
    let tensor =
        |values: Vec<f32>| Tensor::from_data(TensorData::new(values, shape.clone()), &device);
    let state = AdaptiveMomentumState {
        time,
        moment_1: tensor(m),
        moment_2: tensor(v),
        max_moment_2: None,
    };
    (tensor(p), state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::tensor::Distribution;

    type B = NdArray;

    /// Several steps of both, from the same parameter and gradients (with zeros, tiny and large
    /// values, and a learning rate that changes), give the same bits: parameter and moments.
    #[test]
    fn the_host_pass_is_burn_s_adamw_bit_for_bit() {
        let device = Default::default();
        for weight_decay in [0.0, 1e-3] {
            let settings = AdamWSettings { beta_1: 0.9, beta_2: 0.98, epsilon: 1e-9, weight_decay };
            let host = HostAdamW::new(settings, true);
            let graph = HostAdamW::new(settings, false);
            // More than one chunk, and not a multiple of it.
            let n = CHUNK * 2 + 1234;
            let start = Tensor::<B, 2>::random([n / 2, 2], Distribution::Normal(0.0, 1.0), &device);
            let (mut ph, mut pg) = (start.clone(), start);
            let (mut sh, mut sg) = (None, None);
            for step in 0..4 {
                let mut grad =
                    Tensor::<B, 2>::random([n / 2, 2], Distribution::Normal(0.0, 1e-3), &device);
                if step == 1 {
                    grad = grad.mul_scalar(1e6);
                }
                if step == 2 {
                    let half = Tensor::cat(
                        vec![
                            Tensor::<B, 2>::ones([n / 4, 2], &device),
                            Tensor::zeros([n / 2 - n / 4, 2], &device),
                        ],
                        0,
                    );
                    grad = grad * half;
                }
                let lr = 1e-3 * (step + 1) as f64;
                let (a, sa) = SimpleOptimizer::<B>::step(&host, lr, ph, grad.clone(), sh);
                let (b, sb) = SimpleOptimizer::<B>::step(&graph, lr, pg, grad, sg);
                let bits = |t: &Tensor<B, 2>| -> Vec<u32> {
                    t.to_data().to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()
                };
                let (ma, mb) = (sa.as_ref().unwrap(), sb.as_ref().unwrap());
                assert_eq!(ma.momentum.time, mb.momentum.time);
                assert!(bits(&a) == bits(&b), "parameter, step {step}, decay {weight_decay}");
                assert!(
                    bits(&ma.momentum.moment_1) == bits(&mb.momentum.moment_1),
                    "first moment, step {step}"
                );
                assert!(
                    bits(&ma.momentum.moment_2) == bits(&mb.momentum.moment_2),
                    "second moment, step {step}"
                );
                (ph, pg, sh, sg) = (a, b, sa, sb);
            }
        }
    }
}
