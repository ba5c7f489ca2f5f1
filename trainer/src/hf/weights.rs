//! `model.safetensors`: NeMo's state dict under transformers' names.
//!
//! transformers' `convert_nemo_to_hf.py` only renames NeMo's keys: its modules keep PyTorch's
//! layouts (`[out, in]` linear weights, `[out, in/groups, k...]` convolutions, an LSTM's four
//! gates stacked in NeMo's order). So the NeMo state dict that `asrt export` writes
//! ([`crate::nemo::weights::state_dict`], the one table from our parameters to NeMo's) is
//! renamed here by the same rules, and nothing else is computed. The front end's window and
//! filterbank are not stored (transformers computes them), BatchNorm's `num_batches_tracked` is
//! (transformers' model has it, and would report it missing).

use std::collections::HashMap;
use std::path::Path;

use burn::prelude::*;
use safetensors::tensor::{Dtype, TensorView};

use super::HfError;
use crate::model::{ModelConfig, TdtModel};
use crate::nemo::torch_file::TorchTensor;
use crate::nemo::weights::state_dict;

/// Key prefixes and inner parts renamed as transformers' conversion renames them, in order.
const RENAMES: &[(&str, &str)] = &[
    ("encoder.pre_encode.conv.", "encoder.subsampling.layers."),
    ("encoder.pre_encode.out.", "encoder.subsampling.linear."),
    (".self_attn.linear_q.", ".self_attn.q_proj."),
    (".self_attn.linear_k.", ".self_attn.k_proj."),
    (".self_attn.linear_v.", ".self_attn.v_proj."),
    (".self_attn.linear_out.", ".self_attn.o_proj."),
    (".self_attn.linear_pos.", ".self_attn.relative_k_proj."),
    (".self_attn.pos_bias_u", ".self_attn.bias_u"),
    (".self_attn.pos_bias_v", ".self_attn.bias_v"),
    (".conv.batch_norm.", ".conv.norm."),
    ("decoder.prediction.embed.", "decoder.embedding."),
    ("decoder.prediction.dec_rnn.lstm.", "decoder.lstm."),
    ("joint.pred.", "decoder.decoder_projector."),
    ("joint.enc.", "encoder_projector."),
    // NeMo's joint without dropout is [ReLU, Linear]; transformers' head is that Linear.
    ("joint.joint_net.1.", "joint.head."),
];

/// transformers' name of a NeMo key; `None` for what transformers does not store.
pub fn hf_key(nemo: &str) -> Option<String> {
    if nemo.starts_with("preprocessor.") {
        return None;
    }
    let mut key = nemo.to_owned();
    for (from, to) in RENAMES {
        if let Some(at) = key.find(from) {
            key.replace_range(at..at + from.len(), to);
        }
    }
    Some(key)
}

/// The model's tensors under transformers' names, in NeMo's order.
pub fn hf_state_dict<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    vocab: usize,
) -> Result<Vec<(String, TorchTensor)>, HfError> {
    Ok(state_dict(model, cfg, vocab)?
        .into_iter()
        .filter_map(|(k, t)| hf_key(&k).map(|k| (k, t)))
        .collect())
}

/// Writes `tensors` as a safetensors file (with PyTorch's `format` metadata).
pub fn write_safetensors(tensors: &[(String, TorchTensor)], path: &Path) -> Result<(), HfError> {
    let bytes: Vec<(Dtype, &[usize], Vec<u8>)> = tensors
        .iter()
        .map(|(_, t)| match t {
            TorchTensor::F32 { shape, values } => (
                Dtype::F32,
                shape.as_slice(),
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            TorchTensor::I64 { shape, values } => (
                Dtype::I64,
                shape.as_slice(),
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        })
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, _), (dtype, shape, data)) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(*dtype, shape.to_vec(), data).map_err(|e| {
            HfError::Safetensors { path: path.to_owned(), detail: format!("{name}: {e}") }
        })?;
        views.push((name.as_str(), view));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::tensor::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| HfError::Safetensors { path: path.to_owned(), detail: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::hf_key;

    #[test]
    fn keys_are_renamed_as_transformers_conversion_renames_them() {
        let cases = [
            ("encoder.pre_encode.conv.0.weight", "encoder.subsampling.layers.0.weight"),
            ("encoder.pre_encode.out.bias", "encoder.subsampling.linear.bias"),
            (
                "encoder.layers.3.self_attn.linear_out.weight",
                "encoder.layers.3.self_attn.o_proj.weight",
            ),
            (
                "encoder.layers.0.self_attn.linear_pos.weight",
                "encoder.layers.0.self_attn.relative_k_proj.weight",
            ),
            ("encoder.layers.1.self_attn.pos_bias_v", "encoder.layers.1.self_attn.bias_v"),
            (
                "encoder.layers.1.conv.batch_norm.running_var",
                "encoder.layers.1.conv.norm.running_var",
            ),
            (
                "encoder.layers.1.conv.depthwise_conv.weight",
                "encoder.layers.1.conv.depthwise_conv.weight",
            ),
            (
                "encoder.layers.0.norm_feed_forward1.bias",
                "encoder.layers.0.norm_feed_forward1.bias",
            ),
            ("decoder.prediction.embed.weight", "decoder.embedding.weight"),
            ("decoder.prediction.dec_rnn.lstm.weight_hh_l1", "decoder.lstm.weight_hh_l1"),
            ("joint.pred.weight", "decoder.decoder_projector.weight"),
            ("joint.enc.bias", "encoder_projector.bias"),
            ("joint.joint_net.1.weight", "joint.head.weight"),
        ];
        for (nemo, hf) in cases {
            assert_eq!(hf_key(nemo).as_deref(), Some(hf), "{nemo}");
        }
        assert_eq!(hf_key("preprocessor.featurizer.fb"), None);
    }
}
