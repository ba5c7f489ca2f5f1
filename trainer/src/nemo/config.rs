//! NeMo's `model_config.yaml` to our [`ModelConfig`] and back.
//!
//! Import reads the keys that fix the architecture and refuses, naming the key and its value,
//! anything this model does not implement (another subsampling, absolute positions, limited
//! attention context, a layer-norm convolution module, ...). Export writes a complete
//! configuration for NeMo's `EncDecRNNTBPEModel` with the TDT loss and greedy TDT decoding.

use asr_nemo::{Archive, Yaml};

use super::ImportError;
use crate::model::config::{
    EncoderConfig, JointConfig, PredictionConfig, PreprocessorConfig, SpecAugmentConfig,
};
use crate::model::ModelConfig;
use asr_tdt::TdtOptions;

/// What a `.nemo` configuration says about the model.
#[derive(Debug, Clone, PartialEq)]
pub struct NemoConfig {
    /// The model.
    pub model: ModelConfig,
    /// The TDT loss options of `loss.tdt_kwargs` (durations are the model's).
    pub loss: TdtOptions,
    /// Vocabulary size (tokens; the blank is this index).
    pub vocab: usize,
    /// The model class (`target`).
    pub class: String,
    /// Parts of the file that were not imported, with the reason.
    pub ignored: Vec<String>,
    /// State-dict key prefixes of those parts.
    pub ignored_prefixes: Vec<(String, String)>,
}

struct Reader<'a>(&'a Archive);

impl Reader<'_> {
    fn err(&self, key: &str, detail: impl Into<String>) -> ImportError {
        ImportError::Nemo(self.0.config_error(key, detail))
    }

    fn int(&self, key: &str, default: Option<i64>) -> Result<i64, ImportError> {
        match self.0.get(key) {
            Some(Yaml::Integer(v)) => Ok(*v),
            Some(other) => Err(self.err(key, format!("expected an integer, found {other:?}"))),
            None => default.ok_or_else(|| self.err(key, "missing (expected an integer)")),
        }
    }

    fn usize(&self, key: &str, default: Option<i64>) -> Result<usize, ImportError> {
        let v = self.int(key, default)?;
        usize::try_from(v).map_err(|_| self.err(key, format!("{v} is negative")))
    }

    fn float(&self, key: &str, default: Option<f64>) -> Result<f64, ImportError> {
        match self.0.get(key) {
            Some(Yaml::Integer(v)) => Ok(*v as f64),
            Some(Yaml::Real(_)) => {
                self.0.get(key).and_then(Yaml::as_f64).ok_or_else(|| self.err(key, "not a number"))
            }
            Some(other) => Err(self.err(key, format!("expected a number, found {other:?}"))),
            None => default.ok_or_else(|| self.err(key, "missing (expected a number)")),
        }
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Yaml::as_str)
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool, ImportError> {
        match self.0.get(key) {
            Some(Yaml::Boolean(b)) => Ok(*b),
            Some(other) => Err(self.err(key, format!("expected true or false, found {other:?}"))),
            None => Ok(default),
        }
    }

    /// A string key that must have one of `allowed` values (`default` when absent).
    fn expect(
        &self,
        key: &str,
        default: &str,
        allowed: &[&str],
        what: &str,
    ) -> Result<(), ImportError> {
        let v = self.str(key).unwrap_or(default);
        if allowed.contains(&v) {
            Ok(())
        } else {
            Err(self.err(key, format!("{v:?}: only {allowed:?} is supported ({what})")))
        }
    }

    fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>, ImportError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Yaml::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_i64().and_then(|x| usize::try_from(x).ok()).ok_or_else(|| {
                        self.err(key, format!("expected non-negative integers, found {v:?}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.err(key, format!("expected a list, found {other:?}"))),
        }
    }
}

/// Reads the model configuration of a `.nemo` archive whose tokenizer has `vocab` pieces.
pub fn read(archive: &Archive, vocab: usize) -> Result<NemoConfig, ImportError> {
    let r = Reader(archive);
    let class = r.str("target").unwrap_or("(no target)").to_owned();
    let mut ignored = Vec::new();
    let mut ignored_prefixes = Vec::new();
    if archive.get("joint").is_none() || archive.get("decoder.prednet").is_none() {
        return Err(r.err(
            "joint",
            format!("{class} has no transducer decoder and joint (a CTC-only model): only TDT models import"),
        ));
    }
    if archive.get("aux_ctc").is_some() {
        let why = "the CTC head of a hybrid TDT-CTC model (aux_ctc, ctc_decoder.*)".to_owned();
        ignored.push(why.clone());
        ignored_prefixes.push(("ctc_decoder.".to_owned(), why));
    }
    let durations = match r.usize_list("model_defaults.tdt_durations")? {
        Some(d) => d,
        None => match r.usize_list("decoding.durations")? {
            Some(d) => d,
            None => r.usize_list("loss.tdt_kwargs.durations")?.ok_or_else(|| {
                r.err(
                    "decoding.durations",
                    "missing: an RNN-T model without durations is not a TDT model (only TDT models import)",
                )
            })?,
        },
    };
    let extra = r.usize("joint.num_extra_outputs", Some(0))?;
    if extra != durations.len() {
        return Err(r.err(
            "joint.num_extra_outputs",
            format!("{extra}, but the model has {} durations {durations:?}", durations.len()),
        ));
    }
    if r.str("loss.loss_name").is_some_and(|n| n != "tdt") {
        return Err(r.err("loss.loss_name", "only the `tdt` loss is supported"));
    }

    // Preprocessor.
    let sr = r.usize("preprocessor.sample_rate", Some(16_000))?;
    let secs = |key: &str, default: f64| -> Result<usize, ImportError> {
        let s = r.float(key, Some(default))?;
        let n = s * sr as f64;
        if (n - n.round()).abs() > 1e-6 || n < 1.0 {
            return Err(r.err(key, format!("{s} s is not a whole number of samples at {sr} Hz")));
        }
        Ok(n.round() as usize)
    };
    let window_size = secs("preprocessor.window_size", 0.02)?;
    let window_stride = secs("preprocessor.window_stride", 0.01)?;
    let n_fft = match archive.get("preprocessor.n_fft") {
        Some(_) => r.usize("preprocessor.n_fft", None)?,
        None => window_size.next_power_of_two(),
    };
    let features = match archive.get("preprocessor.features") {
        Some(_) => r.usize("preprocessor.features", None)?,
        None => r.usize("preprocessor.nfilt", Some(64))?,
    };
    r.expect(
        "preprocessor.normalize",
        "per_feature",
        &["per_feature"],
        "per-utterance per-band normalisation",
    )?;
    r.expect("preprocessor.window", "hann", &["hann"], "the Hann window")?;
    r.expect("preprocessor.log_zero_guard_type", "add", &["add"], "log(x + guard)")?;
    r.expect("preprocessor.mel_norm", "slaney", &["slaney"], "Slaney-normalised filters")?;
    if !r.bool("preprocessor.log", true)? {
        return Err(r.err("preprocessor.log", "false: only log-mel features are supported"));
    }
    if r.usize("preprocessor.frame_splicing", Some(1))? != 1 {
        return Err(r.err("preprocessor.frame_splicing", "only 1 is supported"));
    }
    if r.float("preprocessor.mag_power", Some(2.0))? != 2.0 {
        return Err(r.err("preprocessor.mag_power", "only 2 (power spectrum) is supported"));
    }
    if r.bool("preprocessor.exact_pad", false)? {
        return Err(r.err("preprocessor.exact_pad", "true: only centred frames are supported"));
    }
    if r.float("preprocessor.lowfreq", Some(0.0))? != 0.0
        || archive.get("preprocessor.highfreq").is_some_and(|v| v.as_f64() != Some(sr as f64 / 2.0))
    {
        return Err(r.err(
            "preprocessor.lowfreq",
            "only filters from 0 Hz to the Nyquist frequency are supported",
        ));
    }
    let guard = match archive.get("preprocessor.log_zero_guard_value") {
        Some(Yaml::String(s)) if s == "tiny" => f64::from(f32::MIN_POSITIVE),
        Some(Yaml::String(s)) if s == "eps" => f64::from(f32::EPSILON),
        Some(_) => r.float("preprocessor.log_zero_guard_value", None)?,
        None => 2f64.powi(-24),
    };
    let preprocessor = PreprocessorConfig {
        sample_rate: sr as u32,
        n_fft,
        window_size,
        window_stride,
        features,
        preemph: r.float("preprocessor.preemph", Some(0.97))?,
        log_zero_guard_value: guard,
        dither: r.float("preprocessor.dither", Some(1e-5))?,
    };

    let spec_augment = if archive.get("spec_augment").is_some() {
        if matches!(archive.get("spec_augment.time_width"), Some(Yaml::Integer(_))) {
            return Err(r.err(
                "spec_augment.time_width",
                "an absolute width in frames is not supported (give a fraction of the utterance)",
            ));
        }
        SpecAugmentConfig {
            freq_masks: r.usize("spec_augment.freq_masks", Some(0))?,
            freq_width: r.usize("spec_augment.freq_width", Some(10))?,
            time_masks: r.usize("spec_augment.time_masks", Some(0))?,
            time_width: r.float("spec_augment.time_width", Some(0.05))?,
        }
    } else {
        SpecAugmentConfig { freq_masks: 0, freq_width: 0, time_masks: 0, time_width: 0.0 }
    };

    // Encoder.
    if !r.str("encoder._target_").unwrap_or("").ends_with("ConformerEncoder") {
        return Err(r.err(
            "encoder._target_",
            format!(
                "{:?}: only ConformerEncoder (FastConformer) is supported",
                r.str("encoder._target_")
            ),
        ));
    }
    r.expect(
        "encoder.subsampling",
        "striding",
        &["dw_striding"],
        "FastConformer's depthwise-striding subsampling",
    )?;
    r.expect(
        "encoder.self_attention_model",
        "rel_pos",
        &["rel_pos"],
        "relative-position attention",
    )?;
    r.expect(
        "encoder.conv_norm_type",
        "batch_norm",
        &["batch_norm"],
        "batch norm in the convolution module",
    )?;
    if !r.bool("encoder.untie_biases", true)? {
        return Err(
            r.err("encoder.untie_biases", "false: only per-layer position biases are supported")
        );
    }
    if r.bool("encoder.causal_downsampling", false)? {
        return Err(
            r.err("encoder.causal_downsampling", "true: only non-causal subsampling is supported")
        );
    }
    if let Some(ctx) = archive.get("encoder.att_context_size") {
        let unlimited = matches!(ctx, Yaml::Array(v) if v.iter().all(|x| x.as_i64() == Some(-1)));
        if !unlimited {
            return Err(r.err(
                "encoder.att_context_size",
                format!("{ctx:?}: only unlimited context [-1, -1] is supported"),
            ));
        }
    }
    if archive.get("encoder.reduction").is_some() {
        return Err(r.err("encoder.reduction", "an extra reduction layer is not supported"));
    }
    if archive.get("encoder.conv_context_size").is_some() {
        return Err(
            r.err("encoder.conv_context_size", "only centred convolutions (null) are supported")
        );
    }
    if r.int("encoder.feat_out", Some(-1))? != -1 {
        return Err(r.err("encoder.feat_out", "an output projection is not supported (-1 only)"));
    }
    if r.float("encoder.stochastic_depth_drop_prob", Some(0.0))? > 0.0 {
        ignored.push(
            "encoder.stochastic_depth_drop_prob (training-time layer dropping is not implemented: \
             fine-tuning runs without it)"
                .to_owned(),
        );
    }
    let d_model = r.usize("encoder.d_model", None)?;
    if r.usize("encoder.feat_in", Some(features as i64))? != features {
        return Err(
            r.err("encoder.feat_in", format!("must equal preprocessor.features {features}"))
        );
    }
    let ff = r.float("encoder.ff_expansion_factor", Some(4.0))?;
    let channels = r.int("encoder.subsampling_conv_channels", Some(-1))?;
    let encoder = EncoderConfig {
        d_model,
        n_layers: r.usize("encoder.n_layers", None)?,
        n_heads: r.usize("encoder.n_heads", Some(4))?,
        ff_dim: (d_model as f64 * ff).round() as usize,
        subsampling_conv_channels: if channels == -1 {
            d_model
        } else {
            r.usize("encoder.subsampling_conv_channels", None)?
        },
        subsampling_factor: r.usize("encoder.subsampling_factor", Some(4))?,
        conv_kernel_size: r.usize("encoder.conv_kernel_size", Some(31))?,
        dropout: r.float("encoder.dropout", Some(0.1))?,
        xscaling: r.bool("encoder.xscaling", true)?,
    };

    // Prediction network and joint.
    if !r.bool("decoder.blank_as_pad", true)? {
        return Err(
            r.err("decoder.blank_as_pad", "false: only a blank that embeds to zeros is supported")
        );
    }
    if archive.get("decoder.normalization_mode").is_some() {
        return Err(r.err("decoder.normalization_mode", "only null is supported"));
    }
    let decoder = PredictionConfig {
        pred_hidden: r.usize("decoder.prednet.pred_hidden", None)?,
        pred_rnn_layers: r.usize("decoder.prednet.pred_rnn_layers", Some(1))?,
    };
    r.expect("joint.jointnet.activation", "relu", &["relu"], "a ReLU joint")?;
    let joint = JointConfig { joint_hidden: r.usize("joint.jointnet.joint_hidden", None)? };
    // This prediction network and joint have no dropout: a fine-tune runs without theirs.
    for key in ["decoder.prednet.dropout", "joint.jointnet.dropout"] {
        let p = r.float(key, Some(0.0))?;
        if p > 0.0 {
            ignored.push(format!("{key} {p} (not implemented: fine-tuning runs without it)"));
        }
    }
    let max_symbols = match archive.get("decoding.greedy.max_symbols") {
        Some(Yaml::Null) => None,
        Some(_) => Some(r.usize("decoding.greedy.max_symbols", None)?),
        // NeMo's default for greedy TDT decoding.
        None => Some(10),
    };
    for key in ["decoder.vocab_size", "joint.num_classes"] {
        if let Some(v) = archive.get(key).and_then(Yaml::as_i64) {
            if v != vocab as i64 {
                return Err(r.err(key, format!("{v}, but the tokenizer has {vocab} pieces")));
            }
        }
    }

    let defaults = TdtOptions::default();
    let kw = "loss.tdt_kwargs";
    let loss = TdtOptions {
        durations: durations.clone(),
        sigma: r.float(&format!("{kw}.sigma"), Some(0.0))?,
        omega: r.float(&format!("{kw}.omega"), Some(0.0))?,
        fastemit_lambda: r.float(&format!("{kw}.fastemit_lambda"), Some(0.0))?,
        clamp: r.float(&format!("{kw}.clamp"), Some(-1.0))?,
        ..defaults
    };
    let model =
        ModelConfig { preprocessor, spec_augment, encoder, decoder, joint, durations, max_symbols };
    model.validate().map_err(|e| r.err("encoder", e.to_string()))?;
    Ok(NemoConfig { model, loss, vocab, class, ignored, ignored_prefixes })
}

/// A YAML string (double-quoted, escaped).
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    format!("[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// Members of an exported archive that the configuration names.
#[derive(Debug, Clone)]
pub struct ArtifactNames {
    /// The SentencePiece model.
    pub tokenizer_model: String,
    /// NeMo's `vocab.txt`.
    pub vocab_txt: String,
    /// SentencePiece's `tokenizer.vocab` (piece and score per line).
    pub spe_vocab: String,
}

/// The optimizer settings an export records, where the source has them (a training checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimSettings {
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW betas.
    pub betas: (f64, f64),
    /// AdamW epsilon.
    pub eps: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
}

/// `model_config.yaml` for NeMo's `EncDecRNNTBPEModel` with this model, loss and tokenizer.
/// Every value is the model's own: dropout 0 in the prediction network and joint (this model has
/// none there), its `max_symbols`, its loss options, and the optimizer it was trained with when
/// known (`optim` is left out otherwise: NeMo reads it only to train). The dataset sections
/// (`train_ds`, `validation_ds`, `test_ds`) name no manifest: NeMo's `transcribe()` reads
/// `validation_ds` (its `use_start_end_token`) and stops with `ConfigAttributeError` when it is
/// missing; the others are there for `setup_training_data` and friends to fill in.
pub fn write(
    cfg: &ModelConfig,
    loss: &TdtOptions,
    optim: Option<&OptimSettings>,
    pieces: &[String],
    names: &ArtifactNames,
) -> String {
    let p = &cfg.preprocessor;
    let e = &cfg.encoder;
    let sr = f64::from(p.sample_rate);
    let vocab = pieces.len();
    let labels: String = pieces.iter().map(|s| format!("- {}\n", quoted(s))).collect();
    let durations = list(&cfg.durations);
    format!(
        "\
sample_rate: {sample_rate}
compute_eval_loss: false
rnnt_reduction: mean_batch
labels:
{labels}model_defaults:
  enc_hidden: {d_model}
  pred_hidden: {pred_hidden}
  joint_hidden: {joint_hidden}
  tdt_durations: {durations}
  num_tdt_durations: {n_durations}
tokenizer:
  dir: null
  type: bpe
  model_path: nemo:{tokenizer_model}
  vocab_path: nemo:{vocab_txt}
  spe_tokenizer_vocab: nemo:{spe_vocab}
preprocessor:
  _target_: nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor
  sample_rate: {sample_rate}
  normalize: per_feature
  window_size: {window_size}
  window_stride: {window_stride}
  window: hann
  features: {features}
  n_fft: {n_fft}
  log: true
  frame_splicing: 1
  dither: {dither}
  preemph: {preemph}
  log_zero_guard_type: add
  log_zero_guard_value: {guard:e}
  pad_to: 0
  pad_value: 0.0
spec_augment:
  _target_: nemo.collections.asr.modules.SpectrogramAugmentation
  freq_masks: {freq_masks}
  time_masks: {time_masks}
  freq_width: {freq_width}
  time_width: {time_width}
encoder:
  _target_: nemo.collections.asr.modules.ConformerEncoder
  feat_in: {features}
  feat_out: -1
  n_layers: {n_layers}
  d_model: {d_model}
  subsampling: dw_striding
  subsampling_factor: {subsampling_factor}
  subsampling_conv_channels: {channels}
  causal_downsampling: false
  ff_expansion_factor: {ff_factor}
  self_attention_model: rel_pos
  n_heads: {n_heads}
  att_context_size: [-1, -1]
  xscaling: {xscaling}
  untie_biases: true
  pos_emb_max_len: 5000
  conv_kernel_size: {conv_kernel}
  conv_norm_type: batch_norm
  conv_context_size: null
  dropout: {dropout}
  dropout_pre_encoder: {dropout}
  dropout_emb: 0.0
  dropout_att: {dropout}
decoder:
  _target_: nemo.collections.asr.modules.RNNTDecoder
  normalization_mode: null
  random_state_sampling: false
  blank_as_pad: true
  vocab_size: {vocab}
  prednet:
    pred_hidden: {pred_hidden}
    pred_rnn_layers: {pred_layers}
    t_max: null
    dropout: 0.0
joint:
  _target_: nemo.collections.asr.modules.RNNTJoint
  log_softmax: null
  preserve_memory: false
  fuse_loss_wer: false
  num_classes: {vocab}
  num_extra_outputs: {n_durations}
  jointnet:
    joint_hidden: {joint_hidden}
    activation: relu
    dropout: 0.0
    encoder_hidden: {d_model}
    pred_hidden: {pred_hidden}
decoding:
  strategy: greedy_batch
  model_type: tdt
  durations: {durations}
  greedy:
    max_symbols: {max_symbols}
loss:
  loss_name: tdt
  tdt_kwargs:
    fastemit_lambda: {fastemit}
    clamp: {clamp}
    durations: {durations}
    sigma: {sigma}
    omega: {omega}
train_ds:
  manifest_filepath: null
  sample_rate: {sample_rate}
  batch_size: 16
  shuffle: true
  num_workers: 8
  pin_memory: true
  use_start_end_token: false
  is_tarred: false
  tarred_audio_filepaths: null
validation_ds:
  manifest_filepath: null
  sample_rate: {sample_rate}
  batch_size: 16
  shuffle: false
  num_workers: 8
  pin_memory: true
  use_start_end_token: false
test_ds:
  manifest_filepath: null
  sample_rate: {sample_rate}
  batch_size: 16
  shuffle: false
  num_workers: 8
  pin_memory: true
  use_start_end_token: false
{optim}target: nemo.collections.asr.models.rnnt_bpe_models.EncDecRNNTBPEModel
",
        max_symbols = cfg.max_symbols.map_or("null".to_owned(), |m| m.to_string()),
        optim = optim.map_or(String::new(), |o| format!(
            "optim:\n  name: adamw\n  lr: {:e}\n  betas: [{}, {}]\n  eps: {:e}\n  weight_decay: {}\n",
            o.lr, o.betas.0, o.betas.1, o.eps, o.weight_decay
        )),
        sample_rate = p.sample_rate,
        d_model = e.d_model,
        pred_hidden = cfg.decoder.pred_hidden,
        joint_hidden = cfg.joint.joint_hidden,
        n_durations = cfg.durations.len(),
        tokenizer_model = names.tokenizer_model,
        vocab_txt = names.vocab_txt,
        spe_vocab = names.spe_vocab,
        window_size = p.window_size as f64 / sr,
        window_stride = p.window_stride as f64 / sr,
        features = p.features,
        n_fft = p.n_fft,
        dither = p.dither,
        preemph = p.preemph,
        guard = p.log_zero_guard_value,
        freq_masks = cfg.spec_augment.freq_masks,
        time_masks = cfg.spec_augment.time_masks,
        freq_width = cfg.spec_augment.freq_width,
        time_width = cfg.spec_augment.time_width,
        n_layers = e.n_layers,
        subsampling_factor = e.subsampling_factor,
        channels = e.subsampling_conv_channels,
        ff_factor = e.ff_dim as f64 / e.d_model as f64,
        n_heads = e.n_heads,
        xscaling = e.xscaling,
        conv_kernel = e.conv_kernel_size,
        dropout = e.dropout,
        pred_layers = cfg.decoder.pred_rnn_layers,
        fastemit = loss.fastemit_lambda,
        clamp = loss.clamp,
        sigma = loss.sigma,
        omega = loss.omega,
    )
}
