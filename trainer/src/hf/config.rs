//! The JSON files of a transformers Parakeet-TDT directory, and what transformers' Parakeet
//! cannot express.
//!
//! transformers (5.x, `models/parakeet`) fixes some of what NeMo and this model configure: the
//! joint's hidden width is the prediction network's (`decoder_hidden_size` serves both), greedy
//! decoding advances by the duration logit's index (so the durations must be `0, 1, ..., n-1`),
//! and the front end's log guard is 2^-24. A model that differs is refused rather than exported
//! to something that decodes otherwise. Its configuration classes check field types strictly:
//! integers are written as integers and rates as floats.

use serde_json::json;

use super::tokenizer::Built;
use super::HfError;
use crate::model::ModelConfig;

/// The JSON files, as text.
pub struct Files {
    /// `config.json`.
    pub config: String,
    /// `generation_config.json`.
    pub generation: String,
    /// `processor_config.json`.
    pub processor: String,
    /// `tokenizer_config.json`.
    pub tokenizer_config: String,
}

/// Refuses a model transformers' Parakeet-TDT would compute or decode differently.
pub fn check(cfg: &ModelConfig) -> Result<(), HfError> {
    let (j, h) = (cfg.joint.joint_hidden, cfg.decoder.pred_hidden);
    if j != h {
        return Err(HfError::Unsupported {
            setting: "model.joint.joint_hidden",
            value: j.to_string(),
            assumes: format!("the prediction network's width, model.decoder.pred_hidden = {h}"),
        });
    }
    let natural: Vec<usize> = (0..cfg.durations.len()).collect();
    if cfg.durations != natural {
        return Err(HfError::Unsupported {
            setting: "model.durations",
            value: format!("{:?}", cfg.durations),
            assumes: format!(
                "{natural:?}: its greedy decoding advances by the duration logit's index"
            ),
        });
    }
    let guard = cfg.preprocessor.log_zero_guard_value;
    if guard != 2f64.powi(-24) {
        return Err(HfError::Unsupported {
            setting: "model.preprocessor.log_zero_guard_value",
            value: guard.to_string(),
            assumes: "2^-24 (5.960464477539063e-8)".to_owned(),
        });
    }
    if !cfg.encoder.subsampling_factor.is_power_of_two() || cfg.encoder.subsampling_factor < 2 {
        return Err(HfError::Unsupported {
            setting: "model.encoder.subsampling_factor",
            value: cfg.encoder.subsampling_factor.to_string(),
            assumes: "a power of two (stride-2 stages)".to_owned(),
        });
    }
    Ok(())
}

fn pretty(v: &serde_json::Value) -> String {
    // A Value always serializes.
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The JSON files for a model of `cfg` (already [`check`]ed) whose tokenizer has `vocab` pieces
/// (the blank is `vocab`) and the special tokens of `tok`.
pub fn files(cfg: &ModelConfig, vocab: usize, tok: &Built) -> Files {
    let pad_id = tok.pad_id;
    let e = &cfg.encoder;
    let p = &cfg.preprocessor;
    let blank = vocab;
    let n_dur = cfg.durations.len();
    let config = json!({
        "architectures": ["ParakeetForTDT"],
        "model_type": "parakeet_tdt",
        // transformers counts the blank among the tokens; it is the last of them, as in NeMo.
        "vocab_size": vocab + 1,
        "blank_token_id": blank,
        "pad_token_id": pad_id,
        "decoder_hidden_size": cfg.decoder.pred_hidden,
        "num_decoder_layers": cfg.decoder.pred_rnn_layers,
        "durations": cfg.durations,
        // The joint's activation (this model's joint is ReLU, as Parakeet's).
        "hidden_act": "relu",
        "max_symbols_per_step": cfg.max_symbols.unwrap_or(10),
        "is_encoder_decoder": true,
        "encoder_config": {
            "model_type": "parakeet_encoder",
            "hidden_size": e.d_model,
            "num_hidden_layers": e.n_layers,
            "num_attention_heads": e.n_heads,
            "num_key_value_heads": e.n_heads,
            "intermediate_size": e.ff_dim,
            "hidden_act": "silu",
            "attention_bias": true,
            "convolution_bias": true,
            "conv_kernel_size": e.conv_kernel_size,
            "subsampling_factor": e.subsampling_factor,
            "subsampling_conv_channels": e.subsampling_conv_channels,
            "subsampling_conv_kernel_size": 3,
            "subsampling_conv_stride": 2,
            "num_mel_bins": p.features,
            "scale_input": e.xscaling,
            "max_position_embeddings": 5000,
            "dropout": e.dropout,
            "dropout_positions": 0.0,
            "attention_dropout": e.dropout,
            "activation_dropout": e.dropout,
            "layerdrop": 0.0,
        },
    });
    let generation = json!({
        // Decoding starts from the blank's embedding row, as NeMo's and ours do.
        "decoder_start_token_id": blank,
        "pad_token_id": pad_id,
        // The duration logits follow the tokens' in the joint's output; generic greedy search
        // would otherwise pick one of them as a token.
        "suppress_tokens": (vocab + 1..vocab + 1 + n_dur).collect::<Vec<_>>(),
    });
    let processor = json!({
        "processor_class": "ParakeetProcessor",
        "blank_token": "<blank>",
        "decoder_type": "tdt",
        "feature_extractor": {
            "feature_extractor_type": "ParakeetFeatureExtractor",
            "feature_size": p.features,
            "sampling_rate": p.sample_rate,
            "hop_length": p.window_stride,
            "win_length": p.window_size,
            "n_fft": p.n_fft,
            "preemphasis": p.preemph,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": true,
        },
    });
    let tokenizer_config = json!({
        "backend": "tokenizers",
        "tokenizer_class": "ParakeetTokenizer",
        "processor_class": "ParakeetProcessor",
        "clean_up_tokenization_spaces": false,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
    });
    Files {
        config: pretty(&config),
        generation: pretty(&generation),
        processor: pretty(&processor),
        tokenizer_config: pretty(&tokenizer_config),
    }
}
