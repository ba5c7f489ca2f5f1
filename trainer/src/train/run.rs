//! The training loop over a corpus: epochs of batch plans, the background loader, optimizer
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
    let corpus = Arc::new(open_corpus(&opts.corpus)?);
    let meta = corpus.metadata();
    let vocab = meta.tokenizer.vocab_size as usize;
    if vocab == 0 {
        return Err(TrainError::WrongCorpus {
            path: opts.corpus.clone(),
            why: "the corpus has no tokenizer vocabulary".into(),
        });
    }
    let ckpt_dir = checkpoint_dir(&opts.out);
    std::fs::create_dir_all(&opts.out).map_err(TrainError::io("creating", &opts.out))?;
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
            let state = checkpoint::load_state(&ckpt)?;
            if state.config.model != cfg.model || state.vocab != vocab {
                return Err(TrainError::WrongCorpus {
                    path: ckpt,
                    why: "trained with another model configuration or vocabulary".into(),
                });
            }
            if state.corpus_utterances != corpus.len() as u64
                || state.tokenizer_xxh3 != tokenizer_xxh3
            {
                return Err(TrainError::WrongCorpus {
                    why: format!(
                        "trained on another corpus ({} utterances, tokenizer {}) than {} ({} \
                         utterances, tokenizer {tokenizer_xxh3})",
                        state.corpus_utterances,
                        state.tokenizer_xxh3,
                        opts.corpus.display(),
                        corpus.len()
                    ),
                    path: ckpt,
                });
            }
            trainer.restore(&ckpt, &state)?;
            let plan = EpochPlan::restore(durations, &languages, &cfg.sampler, &state.sampler)?;
            (plan, state.sampler.step)
        }
        None => {
            let plan =
                EpochPlan::build(durations, &languages, &cfg.sampler, 0, 1, cfg.train.grad_accum)?;
            (plan, 0)
        }
    };
    let mut log = MetricsLog::open(&opts.out, trainer.step)
        .map_err(TrainError::io("opening the metrics in", &opts.out))?;
    let val = match &opts.val_corpus {
        Some(p) => {
            let c = open_corpus(p)?;
            if c.metadata().tokenizer.vocab_size as usize != vocab {
                return Err(TrainError::WrongCorpus {
                    path: p.clone(),
                    why: "another vocabulary than the training corpus".into(),
                });
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
        trainer.save(&ckpt_dir, &state, cfg.train.keep_checkpoints)
    };
    let plot = |log: &MetricsLog| {
        log.plot().map_err(TrainError::io("writing the loss plot in", &opts.out))
    };
    while trainer.step < target {
        if plan.steps() == 0 {
            return Err(TrainError::NoSteps {
                utterances: corpus.len(),
                max_batch_seconds: cfg.sampler.max_batch_seconds,
                grad_accum: cfg.train.grad_accum,
            });
        }
        let loader = Loader::start(
            Arc::clone(&corpus),
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
            let mut m = trainer.train_step(&loaded.batches, &corpus, plan.epoch())?;
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
        plan = EpochPlan::build(
            durations,
            &languages,
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

/// [`run`] on the CPU backend. Instantiated here, in this (optimised) crate, so that callers in
/// other crates do not compile the whole training step themselves.
pub fn run_cpu(
    cfg: TrainConfig,
    opts: &RunOptions,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError> {
    run::<burn::backend::Autodiff<burn::backend::NdArray>>(cfg, opts, Default::default(), on_step)
}
