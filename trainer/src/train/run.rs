//! The training loop over a training set (one or more corpora): epochs of batch plans, the background loader, optimizer
//! steps, metrics, checkpoints, resume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use asr_corpus::Corpus;
use burn::tensor::backend::AutodiffBackend;

use super::metrics::{MetricsLog, StepMetrics};
use super::{TrainError, Trainer};
use crate::checkpoint::{self, checkpoint_dir, TrainState};
use crate::config::TrainConfig;
use crate::data::batcher::{AudioFormat, Loader, LoaderConfig};
use crate::data::sampler::EpochPlan;
use crate::data::set::CorpusIdentity;
use crate::data::set::{DataSpec, TrainingSet};
use crate::tdt::op::TdtBackend;

/// Where and how to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The training set: one or more corpora, in order (their utterance ids are
    /// (position here, index in the corpus)).
    pub data: Vec<DataSpec>,
    /// Output directory (metrics, plot, checkpoints).
    pub out: PathBuf,
    /// Continue from the newest checkpoint in `out/checkpoints`.
    pub resume: bool,
    /// Stop (with a checkpoint) once this many optimizer steps are done, before `max_steps`.
    pub stop_at: Option<u64>,
    /// Corpus to decode every `train.val_every` steps (WER/CER into the metrics line).
    pub val_corpus: Option<PathBuf>,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Optimizer steps done (in all, including before a resume).
    pub steps: u64,
    /// Steps skipped.
    pub skipped: u64,
    /// Last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// The metrics of this run's steps.
    pub metrics: Vec<StepMetrics>,
}

/// Opens a corpus, naming it in the error.
fn open_corpus(path: &Path) -> Result<Corpus, TrainError> {
    Corpus::open(path).map_err(|source| TrainError::Corpus { path: path.to_owned(), source })
}

/// Trains on `device`; `on_step` sees every step's metrics and the steps to do in all.
pub fn run<B: AutodiffBackend + TdtBackend>(
    cfg: TrainConfig,
    opts: &RunOptions,
    device: B::Device,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    // Every input is checked before anything is written.
    let set = Arc::new(TrainingSet::open(&opts.data)?);
    let (vocab, tokenizer_xxh3) = set.tokenizer();
    let (vocab, tokenizer_xxh3) = (vocab as usize, tokenizer_xxh3.to_owned());
    let identity = set.identity();
    let set_name = || set.corpus_names().join(", ");
    let val = match &opts.val_corpus {
        Some(p) => {
            let c = open_corpus(p)?;
            let t = &c.metadata().tokenizer;
            if t.vocab_size as usize != vocab || t.model_xxh3 != tokenizer_xxh3 {
                return Err(TrainError::WrongCorpus {
                    path: p.clone(),
                    why: format!(
                        "tokenized with another model (xxh3 {}, V={}) than the training set \
                         (xxh3 {tokenizer_xxh3}, V={vocab})",
                        t.model_xxh3, t.vocab_size
                    ),
                });
            }
            Some(c)
        }
        None => None,
    };
    let (durations, languages, mix) = (set.durations(), set.languages(), set.mix());
    let ckpt_dir = checkpoint_dir(&opts.out);
    let resume_from = opts.resume.then(|| checkpoint::latest(&ckpt_dir)).flatten();
    let resume_state = match &resume_from {
        Some(ckpt) => {
            let state = checkpoint::load_state(ckpt)?;
            if state.config.model != cfg.model || state.vocab != vocab {
                return Err(TrainError::WrongCorpus {
                    path: ckpt.clone(),
                    why: "trained with another model configuration or vocabulary".into(),
                });
            }
            if state.corpus_utterances != set.len() as u64 || state.tokenizer_xxh3 != tokenizer_xxh3
            {
                return Err(TrainError::WrongCorpus {
                    why: format!(
                        "trained on another training set ({} utterances, tokenizer {}) than {} \
                         ({} utterances, tokenizer {tokenizer_xxh3})",
                        state.corpus_utterances,
                        state.tokenizer_xxh3,
                        set_name(),
                        set.len()
                    ),
                    path: ckpt.clone(),
                });
            }
            if let Some(why) = identity_mismatch(&state.corpora, &identity) {
                return Err(TrainError::WrongCorpus { path: ckpt.clone(), why });
            }
            Some(state)
        }
        None => None,
    };
    std::fs::create_dir_all(&opts.out).map_err(TrainError::io("creating", &opts.out))?;
    let mut trainer = Trainer::<B>::new(cfg.clone(), vocab, device)?;

    let (mut plan, mut epoch_step) = match (&resume_from, &resume_state) {
        (Some(ckpt), Some(state)) => {
            trainer.restore(ckpt, state)?;
            let plan =
                EpochPlan::restore_mixed(durations, languages, &mix, &cfg.sampler, &state.sampler)?;
            (plan, state.sampler.step)
        }
        _ => {
            let plan = EpochPlan::build_mixed(
                durations,
                languages,
                &mix,
                &cfg.sampler,
                0,
                1,
                cfg.train.grad_accum,
            )?;
            (plan, 0)
        }
    };
    let mut log = MetricsLog::open(&opts.out, trainer.step)
        .map_err(TrainError::io("opening the metrics in", &opts.out))?;
    let target = opts.stop_at.unwrap_or(cfg.train.max_steps).min(cfg.train.max_steps);
    let mut summary =
        RunSummary { steps: trainer.step, skipped: 0, checkpoint: None, metrics: Vec::new() };
    let save = |trainer: &Trainer<B>, plan: &EpochPlan, epoch_step: u64| {
        let state = TrainState {
            step: trainer.step,
            micro: trainer.micro,
            sampler: plan.state(epoch_step),
            loss_calls: trainer.loss.calls,
            skipped: trainer.skipped,
            consecutive_skips: trainer.consecutive_skips,
            vocab,
            config: cfg.clone(),
            corpus_utterances: set.len() as u64,
            tokenizer_xxh3: tokenizer_xxh3.clone(),
            corpora: identity.clone(),
        };
        trainer.save(&ckpt_dir, &state, cfg.train.keep_checkpoints)
    };
    let plot = |log: &MetricsLog| {
        log.plot().map_err(TrainError::io("writing the loss plot in", &opts.out))
    };
    while trainer.step < target {
        if plan.steps() == 0 {
            return Err(TrainError::NoSteps {
                utterances: set.len(),
                max_batch_seconds: cfg.sampler.max_batch_seconds,
                grad_accum: cfg.train.grad_accum,
            });
        }
        let loader = Loader::start(
            Arc::clone(&set),
            Arc::new(plan.clone()),
            0,
            epoch_step,
            LoaderConfig {
                format: AudioFormat::I16,
                shape: cfg.shape,
                workers: cfg.train.loader_workers.max(1),
                ..LoaderConfig::default()
            },
        );
        for loaded in loader.steps() {
            let loaded = loaded?;
            let mut m = trainer.train_step(&loaded.batches, &set, plan.epoch())?;
            let every = cfg.train.val_every;
            if let (Some(vc), true) = (&val, every > 0 && trainer.step % every == 0) {
                let n = cfg.train.val_utterances.min(vc.len());
                let indices: Vec<usize> = (0..n).collect();
                let model = burn::module::AutodiffModule::valid(&trainer.model);
                let e =
                    crate::eval::evaluate(&model, &cfg.model, vc, &indices, 60.0, &trainer.device)?;
                m.validation = Some(e.summary());
            }
            epoch_step = loaded.step + 1;
            log.push(&m).map_err(TrainError::io("appending to the metrics in", &opts.out))?;
            on_step(&m, target);
            summary.metrics.push(m);
            let every = cfg.train.checkpoint_every;
            if (every > 0 && trainer.step % every == 0) || trainer.step >= target {
                summary.checkpoint = Some(save(&trainer, &plan, epoch_step)?);
                plot(&log)?;
            }
            if trainer.step >= target {
                break;
            }
        }
        if trainer.step >= target {
            break;
        }
        // Next epoch.
        plan = EpochPlan::build_mixed(
            durations,
            languages,
            &mix,
            &cfg.sampler,
            plan.epoch() + 1,
            1,
            cfg.train.grad_accum,
        )?;
        epoch_step = 0;
    }
    plot(&log)?;
    summary.steps = trainer.step;
    summary.skipped = trainer.skipped;
    Ok(summary)
}

/// Why a checkpoint's training set is not `now` (`None`: it is, or the checkpoint predates
/// training sets and the utterance count and tokenizer, checked by the caller, are all it has).
fn identity_mismatch(saved: &[CorpusIdentity], now: &[CorpusIdentity]) -> Option<String> {
    if saved.is_empty() {
        return None;
    }
    let list = |l: &[CorpusIdentity]| {
        l.iter().map(|c| c.path.display().to_string()).collect::<Vec<_>>().join(", ")
    };
    if saved.len() != now.len() {
        return Some(format!(
            "trained on {} corpora ({}), resumed with {} ({})",
            saved.len(),
            list(saved),
            now.len(),
            list(now)
        ));
    }
    for (k, (a, b)) in saved.iter().zip(now).enumerate() {
        if (a.utterances, a.samples) != (b.utterances, b.samples) {
            return Some(format!(
                "corpus {k} of the training set was {} ({} utterances, {} samples), now {} ({} \
                 utterances, {} samples): the same corpora, in the same order, are needed",
                a.path.display(),
                a.utterances,
                a.samples,
                b.path.display(),
                b.utterances,
                b.samples
            ));
        }
        if (a.weight, &a.language, &a.source) != (b.weight, &b.language, &b.source) {
            return Some(format!(
                "corpus {k} of the training set ({}) had weight {} and overrides {:?}/{:?}, now \
                 {} and {:?}/{:?}: the epoch plans would differ",
                b.path.display(),
                a.weight,
                a.language,
                a.source,
                b.weight,
                b.language,
                b.source
            ));
        }
    }
    None
}

/// [`run`] on the CPU backend. Instantiated here, in this (optimised) crate, so that callers in
/// other crates do not compile the whole training step themselves.
pub fn run_cpu(
    cfg: TrainConfig,
    opts: &RunOptions,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    run::<burn::backend::Autodiff<burn::backend::NdArray>>(cfg, opts, Default::default(), on_step)
}
