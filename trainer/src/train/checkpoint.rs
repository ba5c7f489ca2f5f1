//! Checkpoints: `DIR/step-NNNNNNNN/{model.mpk, optim.mpk, state.json}`, written under a
//! temporary name and renamed into place, with `DIR/latest` naming the newest.

use std::path::{Path, PathBuf};

use burn::optim::Optimizer;
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::{TrainConfig, Trainer};
use crate::data::sampler::SamplerState;
use crate::tdt::op::TdtBackend;

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
    /// Steps skipped in all, and in a row.
    pub skipped: u64,
    /// Steps skipped in a row.
    pub consecutive_skips: u64,
    /// Vocabulary size (blank index).
    pub vocab: usize,
    /// The run's configuration.
    pub config: TrainConfig,
    /// Utterances in the training corpus, and its tokenizer's hash: a resume checks both.
    pub corpus_utterances: u64,
    /// `tokenizer.model_xxh3` of the corpus.
    pub tokenizer_xxh3: String,
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Writes a checkpoint atomically and prunes old ones; returns its directory.
pub fn save<B: AutodiffBackend + TdtBackend>(
    dir: &Path,
    trainer: &Trainer<B>,
    state: &TrainState,
    keep: usize,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| err("creating", dir, e))?;
    let name = format!("step-{:08}", state.step);
    let tmp = dir.join(format!(".{name}.tmp"));
    let done = dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| err("removing", &tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| err("creating", &tmp, e))?;
    trainer
        .model
        .clone()
        .save_file(tmp.join("model"), &recorder())
        .map_err(|e| err("writing", &tmp.join("model.mpk"), e))?;
    Recorder::<B>::record(&recorder(), trainer.optim.to_record(), tmp.join("optim"))
        .map_err(|e| err("writing", &tmp.join("optim.mpk"), e))?;
    let json = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
    std::fs::write(tmp.join("state.json"), json).map_err(|e| err("writing", &tmp, e))?;
    for f in ["model.mpk", "optim.mpk", "state.json"] {
        let p = tmp.join(f);
        std::fs::File::open(&p).and_then(|f| f.sync_all()).map_err(|e| err("syncing", &p, e))?;
    }
    if done.exists() {
        std::fs::remove_dir_all(&done).map_err(|e| err("removing", &done, e))?;
    }
    std::fs::rename(&tmp, &done).map_err(|e| err("renaming into", &done, e))?;
    let latest_tmp = dir.join(".latest.tmp");
    std::fs::write(&latest_tmp, format!("{name}\n")).map_err(|e| err("writing", &latest_tmp, e))?;
    std::fs::rename(&latest_tmp, dir.join("latest")).map_err(|e| err("writing", dir, e))?;
    if keep > 0 {
        let mut all: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| err("listing", dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")))
            .collect();
        all.sort();
        let excess = all.len().saturating_sub(keep);
        for old in &all[..excess] {
            let _ = std::fs::remove_dir_all(old);
        }
    }
    Ok(done)
}

/// The newest checkpoint in `dir`, if any.
pub fn latest(dir: &Path) -> Option<PathBuf> {
    let name = std::fs::read_to_string(dir.join("latest")).ok()?;
    let p = dir.join(name.trim());
    p.join("state.json").is_file().then_some(p)
}

/// Reads a checkpoint's state.
pub fn load_state(ckpt: &Path) -> Result<TrainState, String> {
    let p = ckpt.join("state.json");
    let text = std::fs::read_to_string(&p).map_err(|e| err("reading", &p, e))?;
    serde_json::from_str(&text).map_err(|e| err("parsing", &p, e))
}

/// Loads a checkpoint's model weights into `model`.
pub fn load_model<B: Backend, M: Module<B>>(
    ckpt: &Path,
    model: M,
    device: &B::Device,
) -> Result<M, String> {
    model
        .load_file(ckpt.join("model"), &recorder(), device)
        .map_err(|e| err("reading", &ckpt.join("model.mpk"), e))
}

/// Restores model, optimizer and counters of `trainer` from a checkpoint.
pub fn restore<B: AutodiffBackend + TdtBackend>(
    ckpt: &Path,
    trainer: &mut Trainer<B>,
    state: &TrainState,
) -> Result<(), String> {
    trainer.model = load_model(ckpt, trainer.model.clone(), &trainer.device)?;
    let record = Recorder::<B>::load(&recorder(), ckpt.join("optim"), &trainer.device)
        .map_err(|e| err("reading", &ckpt.join("optim.mpk"), e))?;
    let optim = std::mem::replace(
        &mut trainer.optim,
        burn::optim::AdamWConfig::new().init::<B, crate::model::TdtModel<B>>(),
    );
    trainer.optim = optim.load_record(record);
    trainer.step = state.step;
    trainer.micro = state.micro;
    trainer.loss.calls = state.loss_calls;
    trainer.skipped = state.skipped;
    trainer.consecutive_skips = state.consecutive_skips;
    Ok(())
}

/// Every float parameter of a checkpoint's model, in module order, read on the CPU backend
/// (for comparing runs value for value).
pub fn cpu_parameters(ckpt: &Path) -> Result<Vec<Vec<f32>>, String> {
    use burn::module::{ModuleVisitor, Param};
    type Cpu = burn::backend::NdArray;
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor<Cpu> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Cpu, D>>) {
            self.0.push(param.val().into_data().to_vec::<f32>().unwrap_or_default());
        }
    }
    let state = load_state(ckpt)?;
    let device = Default::default();
    let model = crate::model::TdtModel::<Cpu>::new(&state.config.model, state.vocab, 0, &device);
    let model = load_model(ckpt, model, &device)?;
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    Ok(c.0)
}
