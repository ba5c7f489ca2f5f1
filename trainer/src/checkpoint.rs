//! Checkpoints: `DIR/step-NNNNNNNN/{model.mpk, optim.mpk, state.json}`, written under a
//! temporary name and renamed into place, with `DIR/latest` naming the newest. Every read and
//! write of a checkpoint goes through this module (training, resume, evaluation, comparison).

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Record, Recorder, RecorderError};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::model::TdtModel;
use asr_plan::sampler::SamplerState;
use asr_plan::set::CorpusIdentity;

/// Everything besides tensors that a resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps done.
    pub step: u64,
    /// Micro-batches done.
    pub micro: u64,
    /// Sampler position (epoch, step in epoch, segments).
    pub sampler: SamplerState,
    /// TDT loss calls made (the `omega` draws).
    pub loss_calls: u64,
    /// Steps skipped in all.
    pub skipped: u64,
    /// Steps skipped in a row.
    pub consecutive_skips: u64,
    /// Vocabulary size (blank index).
    pub vocab: usize,
    /// The run's configuration.
    pub config: TrainConfig,
    /// Utterances in the training set, and its tokenizer's hash: a resume checks both.
    pub corpus_utterances: u64,
    /// `tokenizer.model_xxh3` of the corpus.
    pub tokenizer_xxh3: String,
    /// Each corpus of the training set, in order (empty in checkpoints written before training
    /// sets: one corpus, checked by the two fields above).
    #[serde(default)]
    pub corpora: Vec<CorpusIdentity>,
    /// The dynamic loss scale of an f16-mixed run (absent otherwise, and in older checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::loss_scale::LossScale>,
}

/// Why a checkpoint could not be written or read. Each names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("creating", "renaming into", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Burn could not write or read a tensor record.
    #[error("{action} {}: {source}", path.display())]
    Record {
        /// "writing" or "reading".
        action: &'static str,
        /// The record file.
        path: PathBuf,
        /// Why.
        source: RecorderError,
    },
    /// `state.json` is not a training state of this version.
    #[error("parsing {}: {source}", path.display())]
    State {
        /// The state file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// No checkpoint where one was expected.
    #[error(
        "{}: no checkpoint (expected state.json, or a `latest` file in it or in its checkpoints/)",
        path.display()
    )]
    NotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A tensor of the checkpoint could not be read back as f32.
    #[error("{}: parameter {index} is not an f32 tensor: {detail}", path.display())]
    Parameter {
        /// The checkpoint.
        path: PathBuf,
        /// Position of the parameter in module order.
        index: usize,
        /// Burn's description of the problem.
        detail: String,
    },
}

fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io { action, path: path.to_owned(), source }
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// The checkpoint directory of a training output directory.
pub fn checkpoint_dir(out: &Path) -> PathBuf {
    out.join("checkpoints")
}

/// Writes a checkpoint of `model`, the optimizer's `optim` record and `state` into `dir`
/// atomically, and prunes all but the newest `keep` (0: keep all); returns its directory.
pub fn save<B: Backend, M: Module<B>, R: Record<B>>(
    dir: &Path,
    model: &M,
    optim: R,
    state: &TrainState,
    keep: usize,
) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let name = format!("step-{:08}", state.step);
    let tmp = dir.join(format!(".{name}.tmp"));
    let done = dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io("creating", &tmp))?;
    let record_err =
        |path: PathBuf| move |source| CheckpointError::Record { action: "writing", path, source };
    model
        .clone()
        .save_file(tmp.join("model"), &recorder())
        .map_err(record_err(tmp.join("model.mpk")))?;
    Recorder::<B>::record(&recorder(), optim, tmp.join("optim"))
        .map_err(record_err(tmp.join("optim.mpk")))?;
    let state_path = tmp.join("state.json");
    let json = serde_json::to_vec_pretty(state)
        .map_err(|source| CheckpointError::State { path: state_path.clone(), source })?;
    std::fs::write(&state_path, json).map_err(io("writing", &state_path))?;
    for f in ["model.mpk", "optim.mpk", "state.json"] {
        let p = tmp.join(f);
        std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(io("syncing", &p))?;
    }
    if done.exists() {
        std::fs::remove_dir_all(&done).map_err(io("removing", &done))?;
    }
    std::fs::rename(&tmp, &done).map_err(io("renaming into", &done))?;
    let latest_tmp = dir.join(".latest.tmp");
    std::fs::write(&latest_tmp, format!("{name}\n")).map_err(io("writing", &latest_tmp))?;
    let latest = dir.join("latest");
    std::fs::rename(&latest_tmp, &latest).map_err(io("renaming into", &latest))?;
    if keep > 0 {
        let mut all: Vec<PathBuf> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io("listing", dir))? {
            let p = e.map_err(io("listing", dir))?.path();
            if p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")) {
                all.push(p);
            }
        }
        all.sort();
        let excess = all.len().saturating_sub(keep);
        for old in &all[..excess] {
            std::fs::remove_dir_all(old).map_err(io("removing", old))?;
        }
    }
    Ok(done)
}

/// The newest checkpoint in `dir`, if `dir/latest` names one that exists.
pub fn latest(dir: &Path) -> Option<PathBuf> {
    let name = std::fs::read_to_string(dir.join("latest")).ok()?;
    let p = dir.join(name.trim());
    p.join("state.json").is_file().then_some(p)
}

/// A checkpoint directory from a checkpoint, a checkpoints directory, or a training output
/// directory (its newest checkpoint).
pub fn resolve(p: &Path) -> Result<PathBuf, CheckpointError> {
    if p.join("state.json").is_file() {
        return Ok(p.to_path_buf());
    }
    [p.to_path_buf(), checkpoint_dir(p)]
        .iter()
        .find_map(|d| latest(d))
        .ok_or_else(|| CheckpointError::NotFound { path: p.to_owned() })
}

/// Reads a checkpoint's state.
pub fn load_state(ckpt: &Path) -> Result<TrainState, CheckpointError> {
    let p = ckpt.join("state.json");
    let text = std::fs::read_to_string(&p).map_err(io("reading", &p))?;
    serde_json::from_str(&text).map_err(|source| CheckpointError::State { path: p, source })
}

/// Loads a checkpoint's model weights into `model`.
pub fn load_model<B: Backend, M: Module<B>>(
    ckpt: &Path,
    model: M,
    device: &B::Device,
) -> Result<M, CheckpointError> {
    model.load_file(ckpt.join("model"), &recorder(), device).map_err(|source| {
        CheckpointError::Record { action: "reading", path: ckpt.join("model.mpk"), source }
    })
}

/// Reads a checkpoint's optimizer record.
pub fn load_optim<B: Backend, R: Record<B>>(
    ckpt: &Path,
    device: &B::Device,
) -> Result<R, CheckpointError> {
    Recorder::<B>::load(&recorder(), ckpt.join("optim"), device).map_err(|source| {
        CheckpointError::Record { action: "reading", path: ckpt.join("optim.mpk"), source }
    })
}

/// A checkpoint's model on `device`, with its state: what evaluation and export start from.
pub fn load_for_inference<B: Backend>(
    ckpt: &Path,
    device: &B::Device,
) -> Result<(TdtModel<B>, TrainState), CheckpointError> {
    let state = load_state(ckpt)?;
    let model = TdtModel::<B>::new(&state.config.model, state.vocab, 0, device);
    Ok((load_model(ckpt, model, device)?, state))
}

/// Every float parameter of a checkpoint's model, in module order, read on the CPU backend
/// (for comparing runs value for value).
pub fn cpu_parameters(ckpt: &Path) -> Result<Vec<Vec<f32>>, CheckpointError> {
    let (model, _) = load_for_inference::<burn::backend::NdArray>(ckpt, &Default::default())?;
    parameters(&model).map_err(|(index, detail)| CheckpointError::Parameter {
        path: ckpt.to_owned(),
        index,
        detail,
    })
}

/// Every float parameter of a model, in module order; an error names the first that is not
/// f32 by position.
pub fn parameters<B: Backend, M: Module<B>>(model: &M) -> Result<Vec<Vec<f32>>, (usize, String)> {
    struct Collect(Vec<Result<Vec<f32>, String>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().into_data().to_vec::<f32>().map_err(|e| format!("{e:?}")));
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0.into_iter().enumerate().map(|(i, p)| p.map_err(|d| (i, d))).collect()
}
