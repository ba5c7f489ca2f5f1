//! The TDT loss as a Burn operation.
//!
//! [`TdtBackend`] is the extension point: a backend computes per-utterance costs and, when asked,
//! their gradients with respect to the logits. The CPU backend does it with the float64 recursions
//! of `cpu.rs` (parallel over the batch); Burn's CubeCL backends (wgpu, CUDA) run the kernels of
//! `kernels.rs` (`cube.rs`). On `Autodiff<B>` the operation registers a backward step that scales the gradient
//! computed in the forward pass by the incoming gradient of each cost: the closed-form gradient,
//! never autodiff through the T x U lattice.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, Tensor, TensorData, TensorPrimitive};

use super::batch::{self, BatchInput};
use super::{TdtError, TdtOptions};

/// Everything about a loss call except the logits: host-side targets and lengths (the data feed
/// has them on the host already) and the options.
#[derive(Debug, Clone)]
pub struct TdtProblem {
    /// Targets `[batch, u_max]`, row-major.
    pub targets: Vec<u32>,
    /// Padded target length.
    pub u_max: usize,
    /// Valid encoder frames per utterance.
    pub frame_lens: Vec<usize>,
    /// Valid targets per utterance.
    pub target_lens: Vec<usize>,
    /// Loss options (durations, sigma, FastEmit, clamp, ...).
    pub options: TdtOptions,
    /// Compute the standard RNN-T loss on the token logits instead (the `omega` branch).
    pub rnnt: bool,
}

/// Backends that can compute the TDT loss.
pub trait TdtBackend: Backend {
    /// Per-utterance costs `[batch]` of logits `[batch, t_max, u_max + 1, V + D]`, and with
    /// `want_grad` the gradient of each cost with respect to its utterance's logits (same shape
    /// as the logits). On an autodiff backend the costs are differentiable and the returned
    /// gradient is `None`.
    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError>;

    /// Whether training runs the joint's output layer and the loss together on the host
    /// ([`crate::joint`]) instead of as tensor operations: the CPU backends, whose tensors are
    /// host memory already. The device backends keep the logits on the device.
    fn joint_on_host() -> bool {
        false
    }
}

impl TdtProblem {
    /// This problem over host logits of shape `[batch, t_max, u_max + 1, width]`, as the CPU
    /// path reads it ([`batch::loss`]).
    pub fn input<'a>(
        &'a self,
        logits: &'a [f32],
        dims: [usize; 4],
    ) -> Result<BatchInput<'a>, TdtError> {
        batch_input(logits, dims, self)
    }
}

/// The problem's batch layout for logits of shape `[batch, t_max, u_max + 1, width]`.
fn batch_input<'a>(
    logits: &'a [f32],
    [b, t_max, u1, width]: [usize; 4],
    problem: &'a TdtProblem,
) -> Result<BatchInput<'a>, TdtError> {
    let n_dur = problem.options.durations.len();
    if u1 != problem.u_max + 1 || width <= n_dur {
        return Err(TdtError::LogitsShape {
            dims: [b, t_max, u1, width],
            u_max: problem.u_max,
            durations: n_dur,
        });
    }
    Ok(BatchInput {
        logits,
        batch: b,
        t_max,
        u_max: problem.u_max,
        vocab: width - n_dur,
        n_dur,
        targets: &problem.targets,
        frame_lens: &problem.frame_lens,
        target_lens: &problem.target_lens,
    })
}

/// Runs the CPU recursions over host logits of shape `[batch, t_max, u_max + 1, width]`:
/// per-utterance costs and, with `want_grad`, gradients in the logits' layout.
fn run_on_host(
    logits: &[f32],
    dims: [usize; 4],
    problem: &TdtProblem,
    want_grad: bool,
) -> Result<(Vec<f32>, Option<Vec<f32>>), TdtError> {
    let input = batch_input(logits, dims, problem)?;
    let out = batch::loss(&input, &problem.options, problem.rnnt, want_grad)?;
    Ok((out.costs.iter().map(|&c| c as f32).collect(), out.grads))
}

/// [`run_on_host`] with the gradients written over `logits`.
fn run_in_place(
    logits: &mut [f32],
    dims: [usize; 4],
    problem: &TdtProblem,
) -> Result<Vec<f32>, TdtError> {
    let input = batch_input(&[], dims, problem)?;
    let costs = batch::loss_in_place(logits, &input, &problem.options, problem.rnnt)?;
    Ok(costs.iter().map(|&c| c as f32).collect())
}

/// Host implementation for any backend: copies the logits to the host (as f32, whatever their
/// type), runs the CPU recursions, copies costs and gradients back in the logits' own type, as
/// the kernels return them (a backend without a kernel can use it).
pub fn host_forward<B: Backend>(
    logits: FloatTensor<B>,
    problem: &TdtProblem,
    want_grad: bool,
) -> Result<(FloatTensor<B>, Option<FloatTensor<B>>), TdtError> {
    let logits: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(logits));
    let dims = logits.dims();
    let device = logits.device();
    let dtype = logits.dtype();
    let host: Vec<f32> = logits
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| TdtError::ReadLogits(format!("{e:?}")))?;
    let (costs, grads) = run_on_host(&host, dims, problem, want_grad)?;
    let back =
        |values: Vec<f32>, shape: Vec<usize>| TensorData::new(values, shape).convert_dtype(dtype);
    // Created in that type: `from_data` with only a device converts to the backend's default.
    let costs = Tensor::<B, 1>::from_data(back(costs, vec![dims[0]]), (&device, dtype));
    let grads = grads.map(|g| Tensor::<B, 4>::from_data(back(g, dims.to_vec()), (&device, dtype)));
    Ok((costs.into_primitive().tensor(), grads.map(|g| g.into_primitive().tensor())))
}

/// Burn's current CPU backend: the host path (its tensors live in host memory already, so the
/// copies are memory copies). f32, f16 and bf16 logits; costs and gradients come back in the
/// logits' type.
impl TdtBackend for burn::backend::Flex {
    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError> {
        host_forward::<Self>(logits, problem, want_grad)
    }

    fn joint_on_host() -> bool {
        true
    }
}

impl TdtBackend for burn::backend::NdArray {
    fn joint_on_host() -> bool {
        true
    }

    /// Writes the gradient over the logits when they are contiguous f32 that nothing else holds
    /// (the usual case: the joint's backward keeps its input, not its output), so the loss
    /// allocates no logits-sized buffer; otherwise reads them in place and allocates the
    /// gradient.
    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError> {
        use burn::backend::ndarray::NdArrayTensor;
        use burn::tensor::TensorMetadata;
        let dims = logits.shape().dims::<4>();
        let logits = match logits {
            NdArrayTensor::F32(storage) if want_grad && storage.is_unique() => {
                let mut array = storage.into_owned();
                if let Some(slice) = array.as_slice_mut() {
                    let costs = run_in_place(slice, dims, problem)?;
                    let costs = NdArrayTensor::from_data(TensorData::new(costs, [dims[0]]));
                    return Ok((costs, Some(NdArrayTensor::F32(array.into()))));
                }
                NdArrayTensor::F32(array.into())
            }
            other => other,
        };
        if let NdArrayTensor::F32(storage) = &logits {
            if let Some(slice) = storage.view().as_slice() {
                let (costs, grads) = run_on_host(slice, dims, problem, want_grad)?;
                let costs = NdArrayTensor::from_data(TensorData::new(costs, [dims[0]]));
                let grads = grads.map(|g| NdArrayTensor::from_data(TensorData::new(g, dims)));
                return Ok((costs, grads));
            }
        }
        host_forward::<Self>(logits, problem, want_grad)
    }
}

/// Backward step: `d loss / d logits[b] = (d loss / d cost_b) * d cost_b / d logits[b]`, with
/// the second factor computed in the forward pass.
#[derive(Debug)]
struct TdtBackward;

impl<B: Backend> Backward<B, 1> for TdtBackward {
    /// The per-utterance gradients and the batch size.
    type State = (FloatTensor<B>, usize);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [parent] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let (per_utterance, batch) = ops.state;
        if let Some(parent) = parent {
            let scale = B::float_reshape(upstream, Shape::new([batch, 1, 1, 1]));
            grads.register::<B>(parent.id, B::float_mul(per_utterance, scale));
        }
    }
}

impl<B: TdtBackend, C: CheckpointStrategy> TdtBackend for Autodiff<B, C> {
    fn joint_on_host() -> bool {
        B::joint_on_host()
    }

    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        _want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError> {
        let batch = problem.frame_lens.len();
        match TdtBackward.prepare::<C>([logits.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (costs, grads) = B::tdt_forward(logits.primitive, problem, true)?;
                let grads = grads.ok_or(TdtError::NoGradient)?;
                Ok((prep.finish((grads, batch), costs), None))
            }
            OpsKind::UnTracked(prep) => {
                let (costs, _) = B::tdt_forward(logits.primitive, problem, false)?;
                Ok((prep.finish(costs), None))
            }
        }
    }
}

/// Per-utterance costs of `logits` `[batch, t_max, u_max + 1, V + D]`; differentiable on an
/// autodiff backend.
pub fn tdt_costs<B: TdtBackend>(
    logits: Tensor<B, 4>,
    problem: &TdtProblem,
) -> Result<Tensor<B, 1>, TdtError> {
    let (costs, _) = B::tdt_forward(logits.into_primitive().tensor(), problem, false)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(costs)))
}

/// What one loss call computed.
#[derive(Debug, Clone)]
pub struct LossOutput<B: Backend> {
    /// The reduced loss (a scalar tensor, differentiable on an autodiff backend).
    pub loss: Tensor<B, 1>,
    /// Per-utterance costs.
    pub costs: Tensor<B, 1>,
    /// Whether this call used the RNN-T branch (`omega`).
    pub rnnt: bool,
}

/// The TDT loss with NeMo's `omega` mixing and reductions. The `omega` draw of call `n` is a
/// pure function of `(seed, n)`, so a resumed run that restores `calls` draws the same branches.
#[derive(Debug, Clone)]
pub struct TdtLoss {
    /// Loss options.
    pub options: TdtOptions,
    /// The run's seed: call `n` draws from `rng::Stream::LossBranch` at counter `n`.
    pub seed: u64,
    /// Loss calls made so far (checkpoint this to resume exactly).
    pub calls: u64,
}

impl TdtLoss {
    /// A loss with validated options.
    pub fn new(options: TdtOptions, seed: u64) -> Result<TdtLoss, TdtError> {
        options.validate()?;
        Ok(TdtLoss { options, seed, calls: 0 })
    }

    /// Whether call `n` uses the RNN-T branch: a uniform draw from `(seed, n)` below `omega`.
    pub fn rnnt_branch(&self, n: u64) -> bool {
        let mut r = asr_plan::rng::stream(self.seed, asr_plan::rng::Stream::LossBranch, n);
        r.next_f64() < self.options.omega
    }

    /// Draws the branch of the next call (see [`TdtLoss::rnnt_branch`]) and counts the call.
    pub fn next_branch(&mut self) -> bool {
        let rnnt = self.rnnt_branch(self.calls);
        self.calls += 1;
        rnnt
    }

    /// Computes the loss of a batch. `targets` is `[batch, u_max]` row-major.
    pub fn forward<B: TdtBackend>(
        &mut self,
        logits: Tensor<B, 4>,
        targets: &[u32],
        frame_lens: &[usize],
        target_lens: &[usize],
    ) -> Result<LossOutput<B>, TdtError> {
        let rnnt = self.next_branch();
        let factors = batch::reduction_factors(target_lens, self.options.reduction);
        let (loss, costs) = self.part(logits, targets, frame_lens, target_lens, &factors, rnnt)?;
        Ok(LossOutput { loss, costs, rnnt })
    }

    /// One part of a batch whose reduction factors (and branch) were taken for the whole batch:
    /// `sum_b factors[b] * cost_b` over the part's utterances, and their costs. The parts' sums
    /// add up to [`TdtLoss::forward`]'s loss of the whole batch. `targets` is
    /// `[part, u_max]` row-major with `u_max` the logits' `U`.
    pub fn part<B: TdtBackend>(
        &self,
        logits: Tensor<B, 4>,
        targets: &[u32],
        frame_lens: &[usize],
        target_lens: &[usize],
        factors: &[f64],
        rnnt: bool,
    ) -> Result<(Tensor<B, 1>, Tensor<B, 1>), TdtError> {
        if factors.len() != frame_lens.len() {
            return Err(TdtError::FactorCount {
                factors: factors.len(),
                utterances: frame_lens.len(),
            });
        }
        let device = logits.device();
        let u_max = logits.dims()[2] - 1;
        let problem = TdtProblem {
            targets: targets.to_vec(),
            u_max,
            frame_lens: frame_lens.to_vec(),
            target_lens: target_lens.to_vec(),
            options: self.options.clone(),
            rnnt,
        };
        // Half-precision logits give costs in their own type (as the kernels write them); the
        // reduction runs in f32 whatever that type, so the loss keeps f32's precision.
        let costs = tdt_costs(logits, &problem)?.cast(burn::tensor::FloatDType::F32);
        let factors: Vec<f32> = factors.iter().map(|&f| f as f32).collect();
        let factors =
            Tensor::<B, 1>::from_data(TensorData::new(factors, [frame_lens.len()]), &device);
        let loss = (costs.clone() * factors).sum();
        Ok((loss, costs))
    }
}
