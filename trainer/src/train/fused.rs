//! The joint and the loss over parts of a batch (`train.fused_batch_size`, NeMo's
//! `joint.fused_batch_size`).
//!
//! The joint's output `[B, T, U + 1, V + 1 + D]` is the largest tensor of a step. Run whole, it
//! lives from the joint's forward to the end of the backward, with the joint's hidden
//! activations beside it. Here the encoder and prediction outputs (projected by the joint, a
//! few MB) are computed once; each part of the batch then runs the joint, the loss and its own
//! backward at once, cropped to the part's longest frames and targets, so one part's joint
//! tensors are alive at a time. The parts' gradients with respect to the projected inputs are
//! summed, and one backward of `sum(enc * d_enc) + sum(pred * d_pred)` carries them through the
//! encoder and the prediction network (the chain rule, without a second joint).

use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::model::decoder::Joint;
use asr_tdt::batch::reduction_factors;
use asr_tdt::op::{TdtBackend, TdtLoss};
use asr_tdt::TdtError;

/// A batch up to the joint.
pub struct JointInputs<'a, B: Backend> {
    /// Encoder output projected by the joint, `[B, T, J]`, still attached to the graph.
    pub enc: Tensor<B, 3>,
    /// Prediction output projected by the joint, `[B, U + 1, J]`, still attached.
    pub pred: Tensor<B, 3>,
    /// Targets `[B, U]`, row-major.
    pub tokens: &'a [u32],
    /// Valid encoder frames per utterance.
    pub enc_lens: &'a [usize],
    /// Valid targets per utterance.
    pub token_lens: &'a [usize],
}

type InnerSum<B> = Option<Tensor<<B as AutodiffBackend>::InnerBackend, 3>>;

fn add<B: AutodiffBackend>(sum: &mut InnerSum<B>, g: InnerSum<B>) {
    if let Some(g) = g {
        *sum = Some(match sum.take() {
            Some(s) => s + g,
            None => g,
        });
    }
}

/// The batch loss (reduction factors of the whole batch, branch `rnnt`) and the gradients of
/// `loss / divisor` with respect to `module`'s parameters, the joint run on `part` utterances
/// at a time; `None` as soon as a part's loss is not finite (nothing more is computed). The
/// gradients are those of the whole batch at once, up to the order of f32 sums.
pub fn joint_in_parts<B, M>(
    module: &M,
    joint: &Joint<B>,
    loss: &TdtLoss,
    x: JointInputs<'_, B>,
    part: usize,
    rnnt: bool,
    divisor: f64,
) -> Result<Option<(f64, GradientsParams)>, TdtError>
where
    B: AutodiffBackend + TdtBackend,
    M: AutodiffModule<B>,
{
    let batch = x.enc_lens.len();
    let [b_enc, _, _] = x.enc.dims();
    let [b_pred, u1, _] = x.pred.dims();
    if batch == 0 || b_enc != batch || b_pred != batch || x.token_lens.len() != batch {
        return Err(TdtError::JointInputs {
            encoder: b_enc,
            prediction: b_pred,
            frame_lens: batch,
            target_lens: x.token_lens.len(),
        });
    }
    let u_max = u1 - 1;
    if x.tokens.len() != batch * u_max {
        return Err(TdtError::TargetsLen { got: x.tokens.len(), batch, u_max });
    }
    let factors = reduction_factors(x.token_lens, loss.options.reduction);
    // Leaves: each part's backward stops here and leaves its gradient on them.
    let enc = x.enc.clone().detach().require_grad();
    let pred = x.pred.clone().detach().require_grad();
    let mut accum = GradientsAccumulator::<M>::new();
    let (mut d_enc, mut d_pred): (InnerSum<B>, InnerSum<B>) = (None, None);
    let mut total = 0.0;
    for start in (0..batch).step_by(part.max(1)) {
        let end = (start + part.max(1)).min(batch);
        let frames = &x.enc_lens[start..end];
        let lens = &x.token_lens[start..end];
        let t = frames.iter().copied().max().unwrap_or(1).max(1);
        let u = lens.iter().copied().max().unwrap_or(0).min(u_max);
        let targets: Vec<u32> =
            (start..end).flat_map(|r| x.tokens[r * u_max..r * u_max + u].iter().copied()).collect();
        let logits = joint.lattice(
            enc.clone().slice([start..end, 0..t]).unsqueeze_dim(2),
            pred.clone().slice([start..end, 0..u + 1]).unsqueeze_dim(1),
        );
        let (part_loss, _) =
            loss.part(logits, &targets, frames, lens, &factors[start..end], rnnt)?;
        let value: f32 = part_loss.clone().into_scalar().elem();
        if !value.is_finite() {
            return Ok(None);
        }
        total += f64::from(value);
        let grads = part_loss.div_scalar(divisor).backward();
        add::<B>(&mut d_enc, enc.grad(&grads));
        add::<B>(&mut d_pred, pred.grad(&grads));
        accum.accumulate(module, GradientsParams::from_grads(grads, module));
    }
    let mut surrogate: Option<Tensor<B, 1>> = None;
    for (input, g) in [(x.enc, d_enc), (x.pred, d_pred)] {
        if let Some(g) = g {
            let term = (input * Tensor::from_inner(g)).sum();
            surrogate = Some(match surrogate {
                Some(s) => s + term,
                None => term,
            });
        }
    }
    if let Some(s) = surrogate {
        accum.accumulate(module, GradientsParams::from_grads(s.backward(), module));
    }
    Ok(Some((total, accum.grads())))
}
