//! The training loop over a corpus: epochs of batch plans, the background loader, optimizer
//! steps, metrics, checkpoints, resume.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use asr_corpus::Corpus;
use burn::tensor::backend::AutodiffBackend;

use super::checkpoint::{self, TrainState};
use super::metrics::{MetricsLog, StepMetrics};
use super::{TrainConfig, TrainError, Trainer};
use crate::data::batcher::{AudioFormat, Loader, LoaderConfig, PaddedBatch};
use crate::data::sampler::{Durations, EpochPlan};
use crate::tdt::op::TdtBackend;

/// Where and how to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Training corpus.
    pub corpus: PathBuf,
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

fn other(e: impl std::fmt::Display) -> TrainError {
    TrainError::Other(e.to_string())
}

/// Trains on `device`; `on_step` sees every step's metrics and the steps to do in all.
pub fn run<B: AutodiffBackend + TdtBackend>(
    cfg: TrainConfig,
    opts: &RunOptions,
    device: B::Device,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    let corpus = Arc::new(
        Corpus::open(&opts.corpus).map_err(|e| other(format!("{}: {e}", opts.corpus.display())))?,
    );
    let meta = corpus.metadata();
    let vocab = meta.tokenizer.vocab_size as usize;
    if vocab == 0 {
        return Err(other("the corpus has no tokenizer vocabulary"));
    }
    let ckpt_dir = opts.out.join("checkpoints");
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| other(format!("{}: {e}", opts.out.display())))?;
    let mut trainer = Trainer::<B>::new(cfg.clone(), vocab, device)?;
    let durations = Durations::Samples {
        samples: corpus.num_samples(),
        rate: f64::from(corpus.header().sample_rate),
    };
    let languages = corpus.languages().to_vec();
    let tokenizer_xxh3 = meta.tokenizer.model_xxh3.clone();

    let (mut plan, mut epoch_step) = match opts
        .resume
        .then(|| checkpoint::latest(&ckpt_dir))
        .flatten()
    {
        Some(ckpt) => {
            let state = checkpoint::load_state(&ckpt).map_err(other)?;
            if state.config.model != cfg.model || state.vocab != vocab {
                return Err(other(format!(
                    "{} was trained with another model configuration or vocabulary",
                    ckpt.display()
                )));
            }
            if state.corpus_utterances != corpus.len() as u64
                || state.tokenizer_xxh3 != tokenizer_xxh3
            {
                return Err(other(format!(
                    "{} was trained on another corpus ({} utterances, tokenizer {})",
                    ckpt.display(),
                    state.corpus_utterances,
                    state.tokenizer_xxh3
                )));
            }
            checkpoint::restore(&ckpt, &mut trainer, &state).map_err(other)?;
            let plan = EpochPlan::restore(durations, &languages, &cfg.sampler, &state.sampler)
                .map_err(other)?;
            (plan, state.sampler.step)
        }
        None => {
            let plan =
                EpochPlan::build(durations, &languages, &cfg.sampler, 0, 1, cfg.train.grad_accum)
                    .map_err(other)?;
            (plan, 0)
        }
    };
    let mut log = MetricsLog::open(&opts.out, trainer.step).map_err(other)?;
    let val = match &opts.val_corpus {
        Some(p) => {
            let c = Corpus::open(p).map_err(|e| other(format!("{}: {e}", p.display())))?;
            if c.metadata().tokenizer.vocab_size as usize != vocab {
                return Err(other(format!(
                    "{}: another vocabulary than the training corpus",
                    p.display()
                )));
            }
            Some(c)
        }
        None => None,
    };
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
            corpus_utterances: corpus.len() as u64,
            tokenizer_xxh3: tokenizer_xxh3.clone(),
        };
        checkpoint::save(&ckpt_dir, trainer, &state, cfg.train.keep_checkpoints).map_err(other)
    };
    while trainer.step < target {
        if plan.steps() == 0 {
            return Err(other(format!(
                "an epoch of this corpus has no optimizer step: {} utterances, \
                 sampler.max_batch_seconds {} and train.grad_accum {} leave no complete step \
                 (lower either)",
                corpus.len(),
                cfg.sampler.max_batch_seconds,
                cfg.train.grad_accum
            )));
        }
        let plan_arc = Arc::new(plan.clone());
        let loader = Loader::start(
            Arc::clone(&corpus),
            Arc::clone(&plan_arc),
            0,
            epoch_step,
            LoaderConfig {
                format: AudioFormat::I16,
                workers: cfg.train.loader_workers.max(1),
                ..LoaderConfig::default()
            },
        );
        let mut pending: Vec<PaddedBatch> = Vec::new();
        for mb in loader {
            let slots = plan_arc.step_batches(mb.step, 0).len();
            if let Some(b) = mb.batch {
                pending.push(b);
            }
            if mb.slot as usize + 1 < slots {
                continue;
            }
            let mut m = trainer.train_step(&pending, &corpus, plan.epoch())?;
            pending.clear();
            let every = cfg.train.val_every;
            if let (Some(vc), true) = (&val, every > 0 && trainer.step % every == 0) {
                let n = cfg.train.val_utterances.min(vc.len());
                let indices: Vec<usize> = (0..n).collect();
                let model = burn::module::AutodiffModule::valid(&trainer.model);
                let e =
                    crate::eval::evaluate(&model, &cfg.model, vc, &indices, 60.0, &trainer.device)
                        .map_err(other)?;
                m.validation = Some(serde_json::json!({
                    "utterances": n, "wer": e.overall.wer, "cer": e.overall.cer,
                    "languages": e.languages.iter().map(|(l, r)| (l.clone(), serde_json::json!({"wer": r.wer, "cer": r.cer}))).collect::<serde_json::Map<_, _>>(),
                }));
            }
            epoch_step = mb.step + 1;
            log.push(&m).map_err(other)?;
            on_step(&m, target);
            summary.metrics.push(m);
            let every = cfg.train.checkpoint_every;
            if (every > 0 && trainer.step % every == 0) || trainer.step >= target {
                summary.checkpoint = Some(save(&trainer, &plan, epoch_step)?);
                log.plot().map_err(other)?;
            }
            if trainer.step >= target {
                break;
            }
        }
        if trainer.step >= target {
            break;
        }
        // Next epoch.
        plan = EpochPlan::build(
            durations,
            &languages,
            &cfg.sampler,
            plan.epoch() + 1,
            1,
            cfg.train.grad_accum,
        )
        .map_err(other)?;
        epoch_step = 0;
    }
    log.plot().map_err(other)?;
    summary.steps = trainer.step;
    summary.skipped = trainer.skipped;
    Ok(summary)
}

/// The checkpoint directory of a training output directory.
pub fn checkpoint_dir(out: &Path) -> PathBuf {
    out.join("checkpoints")
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
