//! Training configuration: a model preset, overridden by a TOML file with NeMo-like names.
//!
//! ```toml
//! preset = "tiny"                 # or "parakeet-tdt-0.6b"
//! [model.encoder]                 # any field of the preset may be overridden
//! n_layers = 4
//! [optim]
//! lr = 1e-3
//! [train]
//! max_steps = 500
//! [sampler]
//! max_batch_seconds = 60.0
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::config::ModelConfigError;
use crate::model::ModelConfig;
use asr_plan::sampler::SamplerConfig;
use asr_plan::set::DataSpec;
use asr_plan::shape::{ShapeError, ShapePolicy};
use asr_tdt::{TdtError, TdtOptions};

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A problem in a named file.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// The problem.
        source: Box<ConfigError>,
    },
    /// Not TOML, or a key or value of the wrong kind (the message names it).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// The configuration could not be turned into TOML to merge the overrides (a bug).
    #[error("merging the overrides: {0}")]
    Merge(#[from] toml::ser::Error),
    /// `preset` names no preset.
    #[error("unknown preset {0:?} (known: tiny, parakeet-tdt-0.6b)")]
    UnknownPreset(String),
    /// The loss options are out of range.
    #[error("loss: {0}")]
    Loss(#[from] TdtError),
    /// The model's sizes do not fit together.
    #[error("model: {0}")]
    Model(#[from] ModelConfigError),
    /// The shape policy is out of range.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The loss and the model disagree on the duration set.
    #[error("loss.durations {loss:?} must equal model.durations {model:?}")]
    Durations {
        /// `loss.durations`.
        loss: Vec<usize>,
        /// `model.durations`.
        model: Vec<usize>,
    },
    /// A step count that must be at least 1 is 0.
    #[error("train.{key} must be at least 1")]
    ZeroCount {
        /// `grad_accum` or `max_steps`.
        key: &'static str,
    },
    /// A `[[data]]` entry names no file.
    #[error("data[{index}]: path is empty")]
    EmptyDataPath {
        /// The entry's position in the list.
        index: usize,
    },
    /// A `[[data]]` entry's weight is not a positive number.
    #[error("data[{index}] ({}): weight {weight} must be a positive number", path.display())]
    DataWeight {
        /// The entry's position in the list.
        index: usize,
        /// Its corpus.
        path: PathBuf,
        /// The weight given.
        weight: f64,
    },
}

/// Optimizer and learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate (of phase 2 when the encoder starts frozen).
    pub lr: f64,
    /// Linear warmup steps to `lr` (counted from `unfreeze_step` in phase 2).
    pub warmup_steps: u64,
    /// Floor of the cosine decay, reached at `max_steps`.
    pub min_lr: f64,
    /// Encoder frozen for optimizer steps `[0, unfreeze_step)` (0: never frozen).
    pub unfreeze_step: u64,
    /// Peak learning rate while the encoder is frozen.
    pub phase1_lr: f64,
    /// Warmup steps of phase 1.
    pub phase1_warmup_steps: u64,
    /// AdamW betas.
    pub betas: (f64, f64),
    /// AdamW epsilon.
    pub eps: f64,
    /// AdamW decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (0: off).
    pub grad_clip: f64,
    /// Scale the learning rate by (realized step audio seconds / reference_batch_seconds).
    pub scale_lr_by_batch: bool,
    /// Reference audio seconds per optimizer step for that scaling.
    pub reference_batch_seconds: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-3,
            warmup_steps: 20,
            min_lr: 1e-5,
            unfreeze_step: 0,
            phase1_lr: 3e-4,
            phase1_warmup_steps: 20,
            betas: (0.9, 0.98),
            eps: 1e-8,
            weight_decay: 1e-3,
            grad_clip: 1.0,
            scale_lr_by_batch: false,
            reference_batch_seconds: 360.0,
        }
    }
}

impl OptimConfig {
    /// Learning rate of optimizer step `step` (0-based) out of `max_steps`: linear warmup, then
    /// cosine decay to `min_lr`; with a frozen phase, phase 1 has its own warmup to `phase1_lr`
    /// and phase 2 restarts with `warmup_steps` to `lr`. A pure function of the step, so resuming
    /// needs no scheduler state.
    pub fn lr_at(&self, step: u64, max_steps: u64) -> f64 {
        let warm = |s: u64, w: u64, peak: f64| {
            if w == 0 {
                peak
            } else {
                peak * ((s + 1) as f64 / w as f64).min(1.0)
            }
        };
        if step < self.unfreeze_step {
            return warm(step, self.phase1_warmup_steps, self.phase1_lr);
        }
        let s = step - self.unfreeze_step;
        let total = max_steps.saturating_sub(self.unfreeze_step).max(1);
        if s < self.warmup_steps {
            return warm(s, self.warmup_steps, self.lr);
        }
        let span = total.saturating_sub(self.warmup_steps).max(1);
        let progress = ((s - self.warmup_steps) as f64 / span as f64).min(1.0);
        self.min_lr
            + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// The loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopConfig {
    /// Optimizer steps to train.
    pub max_steps: u64,
    /// Micro-batches per optimizer step (the sampler trims each rank's batches to a multiple).
    pub grad_accum: u32,
    /// Checkpoint every this many optimizer steps (0: only at the end).
    pub checkpoint_every: u64,
    /// Checkpoints kept (oldest removed first; 0: keep all).
    pub keep_checkpoints: usize,
    /// Abort after this many skipped (non-finite) optimizer steps in a row.
    pub max_consecutive_skips: u64,
    /// Validate every this many optimizer steps when a validation corpus is given (0: off).
    pub val_every: u64,
    /// Utterances decoded per validation.
    pub val_utterances: usize,
    /// Seed of everything random (sampler, dither, SpecAugment, loss branch draws).
    pub seed: u64,
    /// Background batch-assembly threads.
    pub loader_workers: usize,
    /// Utterances per joint call (NeMo's `joint.fused_batch_size`; 0: the whole micro-batch at
    /// once). With `k`, the joint and loss run on `k` utterances at a time, each part cropped to
    /// its own longest lengths and its backward run at once, so at most one part's joint output
    /// is alive: the step's largest tensor shrinks about `batch / k` times for the same
    /// gradient.
    pub fused_batch_size: usize,
    /// Data-parallel runs: how long a rank waits for the others at a step (or to connect) before
    /// stopping with the name of the missing rank (covers validation, which rank 0 runs alone).
    pub collective_timeout_seconds: f64,
    /// The type of the model's matrix products: `f32`, `bf16-mixed` or `f16-mixed` (weights,
    /// optimizer state, normalisations, softmax, front end and the loss's sums stay f32;
    /// ARCHITECTURE.md, "Mixed precision").
    pub precision: crate::model::precision::Precision,
    /// Where the joint's output layer and the loss run: `auto` (on the CPU backends in f32,
    /// together on the host over each utterance's valid lattice, `asr_tdt::joint`; elsewhere as
    /// tensor operations) or `graph` (always as tensor operations, in parts with
    /// `fused_batch_size`). The gradient is the same up to the order of f32 sums.
    pub joint: JointPath,
}

/// Where the joint's output layer and the loss run in training (`train.joint`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JointPath {
    /// On the host on the CPU backends in f32 (`asr_tdt::joint`), as tensor operations elsewhere.
    #[default]
    Auto,
    /// Always as tensor operations (Burn's graph).
    Graph,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            max_steps: 100,
            grad_accum: 4,
            checkpoint_every: 50,
            keep_checkpoints: 3,
            max_consecutive_skips: 20,
            val_every: 0,
            val_utterances: 200,
            seed: 0,
            loader_workers: 2,
            fused_batch_size: 0,
            collective_timeout_seconds: 600.0,
            precision: crate::model::precision::Precision::F32,
            joint: JointPath::Auto,
        }
    }
}

/// Everything `asrt train` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Base model preset (`tiny`, `parakeet-tdt-0.6b`).
    pub preset: String,
    /// The model (the preset with the file's overrides).
    pub model: ModelConfig,
    /// Optimizer and schedule.
    pub optim: OptimConfig,
    /// Loop.
    pub train: LoopConfig,
    /// Batch plan.
    pub sampler: SamplerConfig,
    /// TDT loss (its `durations` are the model's).
    pub loss: TdtOptions,
    /// How padded batch shapes are rounded (`asrt plan` reports the same policy).
    pub shape: ShapePolicy,
    /// The training set, when the config gives it (`[[data]]`: path, weight, language, source);
    /// otherwise the command line's corpora.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<DataSpec>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig::for_preset("tiny").expect("\"tiny\" is one of ModelConfig::preset's names")
    }
}

/// Merges `over` into `base`, table by table.
fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

impl TrainConfig {
    /// The defaults of a preset: its model, and for `tiny` micro-batches of 8 audio seconds (a
    /// CPU-sized batch, so that the bundled example's 68 seconds make whole optimizer steps);
    /// the 0.6B preset keeps the pipeline's 90 seconds.
    pub fn for_preset(name: &str) -> Option<TrainConfig> {
        let model = ModelConfig::preset(name)?;
        let mut sampler = SamplerConfig::default();
        if name == "tiny" {
            sampler.max_batch_seconds = 8.0;
        }
        Some(TrainConfig {
            preset: name.to_owned(),
            model,
            optim: OptimConfig::default(),
            train: LoopConfig::default(),
            sampler,
            loss: TdtOptions::default(),
            shape: ShapePolicy::default(),
            data: Vec::new(),
        })
    }

    /// Parses a TOML config: `preset` chooses the base model, every other key overrides it.
    /// Unknown keys are errors (naming the key).
    pub fn from_toml(text: &str) -> Result<TrainConfig, ConfigError> {
        TrainConfig::from_toml_with(text, None)
    }

    /// [`TrainConfig::from_toml`] for a run that starts from a trained model (`--init`): the
    /// model is `start`'s whatever the text says, and `start`'s loss options are the base that
    /// the text's `[loss]` keys override (so sigma, omega and the rest carry over unless set).
    pub fn from_toml_with(
        text: &str,
        start: Option<(&ModelConfig, &TdtOptions)>,
    ) -> Result<TrainConfig, ConfigError> {
        let over: toml::Value = toml::from_str(text)?;
        let preset = over.get("preset").and_then(|p| p.as_str()).unwrap_or("tiny").to_owned();
        let mut base =
            TrainConfig::for_preset(&preset).ok_or(ConfigError::UnknownPreset(preset))?;
        if let Some((model, loss)) = start {
            base.model = model.clone();
            base.loss = loss.clone();
        }
        let mut value = toml::Value::try_from(&base)?;
        merge(&mut value, over);
        let mut cfg: TrainConfig = value.try_into()?;
        if let Some((model, _)) = start {
            cfg.model = model.clone();
        }
        cfg.loss.durations = cfg.model.durations.clone();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a TOML config file ([`TrainConfig::from_toml`]); errors name the file. Relative
    /// `[[data]]` paths are taken relative to the file's directory.
    pub fn from_file(path: &Path) -> Result<TrainConfig, ConfigError> {
        TrainConfig::from_file_with(path, None)
    }

    /// [`TrainConfig::from_file`] for a run that starts from a trained model
    /// ([`TrainConfig::from_toml_with`]).
    pub fn from_file_with(
        path: &Path,
        start: Option<(&ModelConfig, &TdtOptions)>,
    ) -> Result<TrainConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut cfg = TrainConfig::from_toml_with(&text, start)
            .map_err(|e| ConfigError::InFile { path: path.to_owned(), source: Box::new(e) })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        for d in &mut cfg.data {
            if d.path.is_relative() {
                d.path = dir.join(&d.path);
            }
        }
        Ok(cfg)
    }

    /// Checks the parts fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        self.loss.validate()?;
        if self.loss.durations != self.model.durations {
            return Err(ConfigError::Durations {
                loss: self.loss.durations.clone(),
                model: self.model.durations.clone(),
            });
        }
        if self.train.grad_accum == 0 {
            return Err(ConfigError::ZeroCount { key: "grad_accum" });
        }
        if self.train.max_steps == 0 {
            return Err(ConfigError::ZeroCount { key: "max_steps" });
        }
        self.shape.validate()?;
        for (k, d) in self.data.iter().enumerate() {
            if d.path.as_os_str().is_empty() {
                return Err(ConfigError::EmptyDataPath { index: k });
            }
            if !(d.weight.is_finite() && d.weight > 0.0) {
                return Err(ConfigError::DataWeight {
                    index: k,
                    path: d.path.clone(),
                    weight: d.weight,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_the_preset_and_rejects_unknown_keys() {
        let c = TrainConfig::from_toml(
            "preset = \"parakeet-tdt-0.6b\"\n[model.encoder]\nn_layers = 2\n[optim]\nlr = 0.5\n",
        )
        .unwrap();
        assert_eq!(c.model.encoder.n_layers, 2);
        assert_eq!(c.model.encoder.d_model, 1024, "the rest of the preset stays");
        assert_eq!(c.optim.lr, 0.5);
        let e = TrainConfig::from_toml("[optim]\nlearning_rate = 1.0\n").unwrap_err();
        assert!(e.to_string().contains("learning_rate"), "{e}");
        let e = TrainConfig::from_toml("preset = \"huge\"").unwrap_err();
        assert!(matches!(&e, ConfigError::UnknownPreset(p) if p == "huge"), "{e}");
        // Each preset brings its own sampler defaults.
        assert_eq!(c.sampler.max_batch_seconds, 90.0);
        let tiny = TrainConfig::from_toml("[optim]\nlr = 0.5\n").unwrap();
        assert_eq!(tiny.sampler.max_batch_seconds, 8.0);
        let shaped = TrainConfig::from_toml("[shape]\naudio_quantum_seconds = 0.5\n").unwrap();
        assert_eq!(shaped.shape.audio_quantum_seconds, 0.5);
        assert!(matches!(
            TrainConfig::from_toml("[shape]\naudio_quantum_seconds = -1.0\n"),
            Err(ConfigError::Shape(ShapeError::AudioQuantum(q))) if q == -1.0
        ));
    }

    /// `--init`: the model is the initial model's whatever the file says; its loss options are
    /// the base the file's `[loss]` keys override (sigma and omega used to be dropped).
    #[test]
    fn a_run_from_a_model_keeps_its_model_and_loss_options_unless_set() {
        let mut model = ModelConfig::tiny();
        model.encoder.n_layers = 3;
        let loss = TdtOptions { sigma: 0.05, omega: 0.25, ..TdtOptions::default() };
        let c = TrainConfig::from_toml_with("", Some((&model, &loss))).unwrap();
        assert_eq!((c.model.encoder.n_layers, c.loss.sigma, c.loss.omega), (3, 0.05, 0.25));
        let c = TrainConfig::from_toml_with(
            "[model.encoder]\nn_layers = 9\n[loss]\nomega = 0.0\n",
            Some((&model, &loss)),
        )
        .unwrap();
        assert_eq!(c.model, model, "the initial model's configuration wins");
        assert_eq!((c.loss.sigma, c.loss.omega), (0.05, 0.0), "a [loss] key overrides");
        let plain = TrainConfig::from_toml("").unwrap();
        assert_eq!(plain.loss.sigma, TdtOptions::default().sigma);
    }

    #[test]
    fn values_that_do_not_fit_together_are_named_by_variant() {
        let mut c = TrainConfig::from_toml("").unwrap();
        c.loss.durations = vec![0, 1, 2];
        let e = c.validate().unwrap_err();
        assert!(
            matches!(&e, ConfigError::Durations { loss, model } if loss == &[0, 1, 2] && model.len() == 5),
            "{e}"
        );
        let e = TrainConfig::from_toml("[train]\ngrad_accum = 0\n").unwrap_err();
        assert!(matches!(e, ConfigError::ZeroCount { key: "grad_accum" }), "{e}");
        let e = TrainConfig::from_toml("[train]\nmax_steps = 0\n").unwrap_err();
        assert!(matches!(e, ConfigError::ZeroCount { key: "max_steps" }), "{e}");
        let e = TrainConfig::from_toml("[model.encoder]\nconv_kernel_size = 8\n").unwrap_err();
        assert!(matches!(e, ConfigError::Model(ModelConfigError::EvenConvKernel(8))), "{e}");
        let e = TrainConfig::from_toml("[model.encoder]\ndropout = 1.0\n").unwrap_err();
        assert!(matches!(e, ConfigError::Model(ModelConfigError::Dropout(p)) if p == 1.0), "{e}");
        let e = TrainConfig::from_toml("[[data]]\npath = \"a.asrcorpus\"\nweight = -2.0\n")
            .unwrap_err();
        assert!(
            matches!(e, ConfigError::DataWeight { index: 0, weight, .. } if weight == -2.0),
            "{e}"
        );
    }

    #[test]
    fn file_errors_name_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "[train]\nmax_steps = \"many\"\n").unwrap();
        let msg = TrainConfig::from_file(&p).unwrap_err().to_string();
        assert_eq!(msg.matches("bad.toml").count(), 1, "{msg}");
        assert!(msg.contains("max_steps"), "{msg}");
        let missing = dir.path().join("missing.toml");
        let msg = TrainConfig::from_file(&missing).unwrap_err().to_string();
        assert_eq!(msg.matches("missing.toml").count(), 1, "{msg}");
    }

    #[test]
    fn schedule_warms_up_decays_and_restarts_after_unfreezing() {
        let o = OptimConfig { lr: 1.0, warmup_steps: 10, min_lr: 0.0, ..OptimConfig::default() };
        assert!((o.lr_at(0, 100) - 0.1).abs() < 1e-12);
        assert!((o.lr_at(9, 100) - 1.0).abs() < 1e-12);
        assert!(o.lr_at(50, 100) < 1.0 && o.lr_at(50, 100) > 0.0);
        assert!(o.lr_at(99, 100) < 0.01);
        let f = OptimConfig { unfreeze_step: 20, phase1_lr: 0.3, phase1_warmup_steps: 5, ..o };
        assert!((f.lr_at(4, 100) - 0.3).abs() < 1e-12);
        assert!((f.lr_at(20, 100) - 0.1).abs() < 1e-12, "phase 2 warms up again");
    }
}
