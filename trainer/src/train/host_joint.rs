//! The joint's output layer and the loss on the host (`train.joint = "auto"` on the CPU
//! backends in f32; ARCHITECTURE.md, "The joint on the host").
//!
//! The graph runs up to the joint's projected inputs (`[B, T, J]`, `[B, U + 1, J]`, a few MB).
//! Those and the output layer's parameters are read to the host; `asr_tdt::joint` computes the
//! loss and its gradients with respect to all four over each utterance's valid lattice; one
//! backward of `sum(enc * d_enc) + sum(pred * d_pred) + sum(W * d_W) + sum(b * d_b)` then
//! carries them into every parameter (the chain rule, as the joint in parts does for its
//! inputs). No logits tensor exists in the graph.

use burn::module::AutodiffModule;
use burn::nn::Linear;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use super::fused::JointInputs;
use asr_tdt::batch::reduction_factors;
use asr_tdt::joint::{joint_loss, JointInput, JointOutput};
use asr_tdt::op::TdtLoss;
use asr_tdt::TdtError;

/// A tensor's values as host f32 (`what` names it in the error).
fn host<B: AutodiffBackend, const D: usize>(
    t: &Tensor<B, D>,
    what: &str,
) -> Result<Vec<f32>, TdtError> {
    t.clone()
        .inner()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| TdtError::ReadLogits(format!("the joint's {what}: {e:?}")))
}

/// Runs `asr_tdt::joint` on the batch: costs, and with `weights` the gradients.
fn run<B: AutodiffBackend>(
    layer: &Linear<B>,
    loss: &TdtLoss,
    x: &JointInputs<'_, B>,
    rnnt: bool,
    weights: Option<&[f64]>,
) -> Result<JointOutput, TdtError> {
    let [batch, t_max, hidden] = x.enc.dims();
    let [b_pred, u1, _] = x.pred.dims();
    let outputs = layer.weight.dims()[1];
    if b_pred != batch || x.enc_lens.len() != batch || x.token_lens.len() != batch {
        return Err(TdtError::JointInputs {
            encoder: batch,
            prediction: b_pred,
            frame_lens: x.enc_lens.len(),
            target_lens: x.token_lens.len(),
        });
    }
    let enc = host(&x.enc, "encoder side")?;
    let pred = host(&x.pred, "prediction side")?;
    let weight = host(&layer.weight.val(), "output weight")?;
    let bias = layer.bias.as_ref().map(|b| host(&b.val(), "output bias")).transpose()?;
    let input = JointInput {
        enc: &enc,
        pred: &pred,
        weight: &weight,
        bias: bias.as_deref(),
        batch,
        t_max,
        u_max: u1 - 1,
        hidden,
        outputs,
        targets: x.tokens,
        frame_lens: x.enc_lens,
        target_lens: x.token_lens,
    };
    joint_loss(&input, &loss.options, rnnt, weights)
}

/// The batch loss (reduction factors of the whole batch, branch `rnnt`), without gradients.
pub fn host_joint_loss<B: AutodiffBackend>(
    layer: &Linear<B>,
    loss: &TdtLoss,
    x: JointInputs<'_, B>,
    rnnt: bool,
) -> Result<f64, TdtError> {
    let out = run(layer, loss, &x, rnnt, None)?;
    let factors = reduction_factors(x.token_lens, loss.options.reduction);
    Ok(out.costs.iter().zip(&factors).map(|(c, f)| c * f).sum())
}

/// The batch loss and the gradients of `loss / divisor` with respect to `module`'s parameters;
/// `None` when the loss is not finite (nothing is then computed backward).
pub fn host_joint_gradients<B, M>(
    module: &M,
    layer: &Linear<B>,
    loss: &TdtLoss,
    x: JointInputs<'_, B>,
    rnnt: bool,
    divisor: f64,
) -> Result<Option<(f64, GradientsParams)>, TdtError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let factors = reduction_factors(x.token_lens, loss.options.reduction);
    let weights: Vec<f64> = factors.iter().map(|f| f / divisor).collect();
    let out = run(layer, loss, &x, rnnt, Some(&weights))?;
    let total: f64 = out.costs.iter().zip(&factors).map(|(c, f)| c * f).sum();
    if !total.is_finite() {
        return Ok(None);
    }
    let g = out.grads.ok_or(TdtError::NoGradient)?;
    let device = x.enc.device();
    let enc_dims = x.enc.dims();
    let pred_dims = x.pred.dims();
    let constant = |v: Vec<f32>, shape: Vec<usize>| TensorData::new(v, shape);
    let mut surrogate = (x.enc
        * Tensor::<B, 3>::from_data(constant(g.enc, enc_dims.to_vec()), &device))
    .sum()
        + (x.pred * Tensor::<B, 3>::from_data(constant(g.pred, pred_dims.to_vec()), &device)).sum();
    let w = layer.weight.val();
    let w_dims = w.dims().to_vec();
    surrogate =
        surrogate + (w * Tensor::<B, 2>::from_data(constant(g.weight, w_dims), &device)).sum();
    if let Some(bias) = &layer.bias {
        let len = g.bias.len();
        surrogate = surrogate
            + (bias.val() * Tensor::<B, 1>::from_data(constant(g.bias, vec![len]), &device)).sum();
    }
    Ok(Some((total, GradientsParams::from_grads(surrogate.backward(), module))))
}
