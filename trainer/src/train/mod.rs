//! Training one rank: AdamW with warmup and cosine decay, the two-phase schedule (encoder frozen
//! until `unfreeze_step`), gradient accumulation, global-norm clipping, non-finite detection,
//! atomic checkpoints and exact resume; and the data-parallel step over several ranks.
//!
//! An optimizer step takes the micro-batches one rank was dealt
//! (`EpochPlan::step_batches(step, rank)`); `parallel_step` sums the ranks' gradients between
//! `gradients_at` and `apply` ([`collective`], [`parallel`]), so every rank applies the same
//! update. One rank is the case of a world of one.
//!
//! Everything random is a pure function of (seed, counter): SpecAugment intervals are drawn on
//! the host from (seed, micro-batch number) and made into masks on the device, dither is drawn
//! on the device from the backend's generator seeded with (seed, micro-batch number) under a
//! process-wide lock, the loss's `omega` comes from the same number, initial weights from the
//! seed, drawn on the host whatever the device (`TdtModel::new`, under the same lock). Dropout
//! uses the backend's generator, reseeded before each micro-batch; it is process-global, so ranks
//! that are threads of one process interleave their dropout draws (the tiny preset has no
//! dropout; such runs stay consistent across ranks but are not bit-reproducible). With the
//! checkpointed model, optimizer state, counters and sampler position, a resumed run repeats the
//! uninterrupted one bit for bit on the CPU backend.

pub mod adamw;
pub mod collective;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod device_layout;
pub mod device_memory;
pub mod flat_adamw;
pub mod flat_grads;
pub mod fused;
pub mod grad_norms;
pub mod grads;
pub mod graph_join;
pub mod graph_release;
pub mod host_joint;
pub mod host_time;
pub mod kernel_limit;
pub mod metrics;
pub mod optimizer;
pub mod out_of_memory;
pub mod parallel;
pub mod run;
pub mod tensorboard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use adamw::AdamWSettings;

use crate::checkpoint::{self, CheckpointError, TrainState};
use crate::config::{ConfigError, JointPath, TrainConfig};
use crate::device_failure::DeviceFailure;
use crate::eval::EvalError;
use crate::loss_scale::Verdict;
use crate::model::augment::SpecAugmentDraws;
use crate::model::mel::MelFrontend;
use crate::model::precision::PrecisionError;
use crate::model::{ModelConfig, TdtModel};
use crate::model_source::TokenizerId;
use asr_plan::batcher::{Audio, LoaderError, PaddedBatch};
use asr_plan::rng::{self, Stream};
use asr_plan::sampler::PlanError;
use asr_plan::set::{CorpusIdentity, SetError, TrainingSet};
use asr_tdt::op::{TdtBackend, TdtLoss};
use metrics::StepMetrics;
pub use out_of_memory::OutOfMemory;

/// How a checkpoint's run differs from the one resuming it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResumeMismatch {
    /// Another model configuration or vocabulary.
    #[error("trained with another model configuration or vocabulary")]
    Model,
    /// Another training set (utterance count or tokenizer).
    #[error(
        "trained on another training set ({saved_utterances} utterances, tokenizer \
         {saved_tokenizer}) than {corpora} ({utterances} utterances, tokenizer {tokenizer})"
    )]
    TrainingSet {
        /// Utterances the checkpoint's set had.
        saved_utterances: u64,
        /// Its tokenizer.
        saved_tokenizer: TokenizerId,
        /// The corpora resuming.
        corpora: String,
        /// Their utterances.
        utterances: u64,
        /// Their tokenizer.
        tokenizer: TokenizerId,
    },
    /// Another number of corpora.
    #[error(
        "trained on {} corpora ({}), resumed with {} ({})",
        saved.len(),
        paths(saved),
        now.len(),
        paths(now)
    )]
    CorpusCount {
        /// The checkpoint's corpora.
        saved: Vec<PathBuf>,
        /// The corpora resuming.
        now: Vec<PathBuf>,
    },
    /// Another corpus at a position of the set.
    #[error(
        "corpus {index} of the training set was {} ({} utterances, {} samples), now {} ({} \
         utterances, {} samples): the same corpora, in the same order, are needed",
        saved.path.display(),
        saved.utterances,
        saved.samples,
        now.path.display(),
        now.utterances,
        now.samples
    )]
    Corpus {
        /// Its position.
        index: usize,
        /// The checkpoint's.
        saved: Box<CorpusIdentity>,
        /// The one resuming.
        now: Box<CorpusIdentity>,
    },
    /// Another weight or override for a corpus of the set.
    #[error(
        "corpus {index} of the training set ({}) had weight {} and overrides {:?}/{:?}, now {} \
         and {:?}/{:?}: the epoch plans would differ",
        now.path.display(),
        saved.weight,
        saved.language,
        saved.source,
        now.weight,
        now.language,
        now.source
    )]
    Mix {
        /// Its position.
        index: usize,
        /// The checkpoint's.
        saved: Box<CorpusIdentity>,
        /// The one resuming.
        now: Box<CorpusIdentity>,
    },
}

fn paths(l: &[PathBuf]) -> String {
    l.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Why training stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The precision cannot run on this backend and device.
    #[error(transparent)]
    Precision(#[from] PrecisionError),
    /// The gradient norms `ASRT_GRAD_NORMS` asks for could not be written.
    #[error(transparent)]
    GradNorms(#[from] grad_norms::GradNormsError),
    /// Too many optimizer steps in a row had a non-finite loss or gradient.
    #[error(
        "{steps} optimizer steps in a row had a non-finite loss or gradient (limit \
         train.max_consecutive_skips); the last one's utterances: {utterances}"
    )]
    NonFinite {
        /// Steps skipped in a row.
        steps: u64,
        /// Segment ids of the last skipped step's batch.
        utterances: String,
    },
    /// The loss rejected a batch's shapes (a bug or a corrupt batch).
    #[error("TDT loss: {0}")]
    Loss(#[from] asr_tdt::TdtError),
    /// The configuration cannot be used.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// The initial `.nemo` model could not be read.
    #[error("initial model: {0}")]
    Import(#[from] crate::nemo::ImportError),
    /// A checkpoint could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// Validation decoding failed.
    #[error("validation: {0}")]
    Eval(#[from] EvalError),
    /// The corpus and sampler options make no plan.
    #[error("batch plan: {0}")]
    Plan(#[from] PlanError),
    /// The batch loader stopped.
    #[error("{0}")]
    Loader(#[from] LoaderError),
    /// The ranks of a data-parallel run could not synchronise.
    #[error("data-parallel: {0}")]
    Collective(#[from] collective::CollectiveError),
    /// The training set cannot be used.
    #[error("{0}")]
    Set(#[from] SetError),
    /// A corpus could not be opened.
    #[error("{}", asr_plan::set::open_message(path, source))]
    Corpus {
        /// The corpus.
        path: PathBuf,
        /// Why.
        source: asr_corpus::FormatError,
    },
    /// The validation corpus was compiled with another tokenizer than the training set.
    #[error(
        "{}: tokenized with another model ({corpus}) than the training set ({set})",
        path.display()
    )]
    ValTokenizer {
        /// The validation corpus.
        path: PathBuf,
        /// Its tokenizer.
        corpus: TokenizerId,
        /// The training set's.
        set: TokenizerId,
    },
    /// The checkpoint to resume from belongs to another run.
    #[error("{}: {why}", checkpoint.display())]
    Resume {
        /// The checkpoint.
        checkpoint: PathBuf,
        /// What differs.
        why: Box<ResumeMismatch>,
    },
    /// Writing the run's outputs (metrics, plot) failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An epoch of the training set has no complete optimizer step.
    #[error(
        "an epoch of the training set has no optimizer step: {utterances} utterances, \
         sampler.max_batch_seconds {max_batch_seconds} and train.grad_accum {grad_accum} leave \
         no complete step (lower either)"
    )]
    NoSteps {
        /// Utterances in the training set.
        utterances: usize,
        /// The sampler's batch size in seconds.
        max_batch_seconds: f64,
        /// Micro-batches per step.
        grad_accum: u32,
    },
    /// The `--init` model could not be used.
    #[error("--init: {0}")]
    Source(#[from] crate::model_source::ModelSourceError),
    /// The run's model configuration is not the `--init` model's.
    #[error("--init {}: the run's model configuration is not the model's", path.display())]
    InitModel {
        /// The model source.
        path: PathBuf,
    },
    /// No device was given to train on.
    #[error("no device to train on")]
    NoDevice,
    /// This process's rank is not one of the group's.
    #[error("process rank {rank} is outside {count} processes")]
    ProcessRank {
        /// This process's rank.
        rank: usize,
        /// Processes in the group.
        count: usize,
    },
    /// The device had no memory for a micro-batch.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// A micro-batch, or one of its utterances, that no kernel can launch over.
    #[error(transparent)]
    KernelLimit(#[from] kernel_limit::KernelLimitError),
    /// The device reported a failure while running a micro-batch.
    #[error("{during}: {failure}")]
    Device {
        /// What ran: "micro-batch 5 (step 2)", "the optimizer update of step 2".
        during: String,
        /// What the device reported.
        failure: DeviceFailure,
    },
    /// A batch in a form the trainer does not take (a bug in the caller).
    #[error("the trainer takes 16-bit audio batches")]
    BatchFormat,
}

impl TrainError {
    /// An I/O error of the run's outputs.
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TrainError {
        let path = path.to_owned();
        move |source| TrainError::Io { action, path, source }
    }
}

/// One rank's share of an optimizer step.
pub struct RankBatches<'a, B: Backend> {
    /// The rank's batches (its idle slots left out).
    pub batches: &'a [PaddedBatch],
    /// The run's micro-batch number of each batch.
    pub slots: &'a [u64],
    /// Micro-batches of the step over all ranks.
    pub divisor: usize,
    /// The micro-batch counter after the step (the same on every rank).
    pub next_micro: u64,
    /// Every rank's device, in rank order, when all ranks are devices of this process (the
    /// backend may then sum gradients on the devices, e.g. NCCL); empty otherwise.
    pub peers: &'a [B::Device],
}

/// One optimizer step's gradients before they are applied.
pub struct StepGradients {
    /// Accumulated gradients (mean over the micro-batches).
    pub grads: GradientsParams,
    /// Mean loss over the finite micro-batches.
    pub loss: f64,
    /// Sum of the finite micro-batches' losses.
    pub loss_sum: f64,
    /// Finite micro-batches.
    pub finite: u64,
    /// Whether a micro-batch had a non-finite loss.
    pub non_finite: bool,
    /// Audio seconds and utterances.
    pub audio_seconds: f64,
    /// Utterances.
    pub utterances: u64,
}

/// Model, optimizer, front end and counters of one device.
pub struct Trainer<B: AutodiffBackend + TdtBackend> {
    /// The configuration.
    pub cfg: TrainConfig,
    /// The model.
    pub model: TdtModel<B>,
    /// AdamW (Burn's: in one host pass per parameter on the CPU backends, all parameters at
    /// once on the device backends; [`optimizer`]).
    pub optim: optimizer::Optim<B>,
    /// The loss (its call count is part of the run's state).
    pub loss: TdtLoss,
    frontend: MelFrontend<B>,
    /// Device.
    pub device: B::Device,
    /// Tokens in the vocabulary (blank is this index).
    pub vocab: usize,
    /// Optimizer steps done.
    pub step: u64,
    /// Micro-batches done.
    pub micro: u64,
    /// Steps skipped in all.
    pub skipped: u64,
    /// Steps skipped in a row.
    pub consecutive_skips: u64,
    /// The dynamic loss scale (f16-mixed only).
    pub loss_scale: Option<crate::loss_scale::LossScale>,
    /// How gradients travel between processes when the backend has its own way (NCCL).
    pub node_transport: Option<Box<dyn parallel::HostSum>>,
    /// The largest lattice of a micro-batch that ran on this device
    /// ([`out_of_memory::lattice_cells`]), for the out-of-memory report's suggestion.
    largest_fit: Option<u128>,
    /// Each parameter's gradient norm per step, where `ASRT_GRAD_NORMS` names a file
    /// ([`grad_norms`]).
    grad_norms: Option<grad_norms::GradNormLog>,
    /// The device memory of the step under way ([`device_memory`]).
    memory: device_memory::MemoryWatch,
    /// The step under way's wall time on this thread by phase ([`host_time`]).
    host: host_time::HostSeconds,
}

/// A batch encoded up to the joint (see [`Trainer::encode_batch`]).
struct Encoded<B: Backend> {
    /// Encoder output projected by the joint, `[B, T, J]`.
    enc: Tensor<B, 3>,
    /// Prediction output projected by the joint, `[B, U + 1, J]`.
    pred: Tensor<B, 3>,
    /// Valid encoder frames.
    enc_lens: Vec<usize>,
    /// Valid targets.
    token_lens: Vec<usize>,
}

impl<B: Backend> Encoded<B> {
    /// The joint's inputs with `batch`'s targets.
    fn joint_inputs<'a>(&'a self, batch: &'a PaddedBatch) -> fused::JointInputs<'a, B> {
        fused::JointInputs {
            enc: self.enc.clone(),
            pred: self.pred.clone(),
            tokens: &batch.tokens,
            enc_lens: &self.enc_lens,
            token_lens: &self.token_lens,
        }
    }
}

impl<B: AutodiffBackend + TdtBackend> Trainer<B> {
    /// A fresh model and optimizer for a vocabulary of `vocab` tokens.
    pub fn new(cfg: TrainConfig, vocab: usize, device: B::Device) -> Result<Self, TrainError> {
        cfg.validate()?;
        crate::device_failure::watch();
        let precision = cfg.train.precision;
        precision.check::<B>(&device, &format!("{device:?}"))?;
        let model =
            TdtModel::new(&cfg.model, vocab, rng::derive(cfg.train.seed, Stream::Init, 0), &device)
                .with_precision(precision);
        let o = &cfg.optim;
        let settings = AdamWSettings {
            beta_1: o.betas.0 as f32,
            beta_2: o.betas.1 as f32,
            epsilon: o.eps as f32,
            weight_decay: o.weight_decay as f32,
        };
        // Where the tensors live on the host (the backends whose joint runs there too).
        let optim = optimizer::Optim::new(settings, B::joint_on_host());
        let loss = TdtLoss::new(cfg.loss.clone(), cfg.train.seed)?;
        let frontend = MelFrontend::new(&cfg.model.preprocessor, &device);
        Ok(Trainer {
            cfg,
            model,
            optim,
            loss,
            frontend,
            device,
            vocab,
            step: 0,
            micro: 0,
            skipped: 0,
            consecutive_skips: 0,
            loss_scale: precision.scales_loss().then(crate::loss_scale::LossScale::default),
            node_transport: None,
            largest_fit: None,
            grad_norms: grad_norms::GradNormLog::from_env(),
            memory: device_memory::MemoryWatch::default(),
            host: host_time::HostSeconds::default(),
        })
    }

    /// The batch's features `[B, T, F]` and valid frames, as training makes them (dither and
    /// SpecAugment drawn from the micro-batch) or, with `train` false, as evaluation does.
    fn features(
        &self,
        batch: &PaddedBatch,
        train: bool,
    ) -> Result<(Tensor<B, 3>, Vec<usize>), TrainError> {
        let dither = train.then(|| rng::derive(self.cfg.train.seed, Stream::Dither, self.micro));
        let Audio::I16(pcm) = &batch.audio else {
            return Err(TrainError::BatchFormat);
        };
        let (feats, frame_lens) =
            self.frontend.forward(pcm, batch.size(), &batch.audio_lens, dither, &self.device);
        if !train {
            return Ok((feats, frame_lens));
        }
        let f = feats.dims()[2];
        let seed = rng::derive(self.cfg.train.seed, Stream::SpecAugment, self.micro);
        let feats =
            SpecAugmentDraws::draw(&self.cfg.model.spec_augment, &frame_lens, f, seed).apply(feats);
        Ok((feats, frame_lens))
    }

    /// Front end, SpecAugment (when training), encoder and prediction network of a batch, both
    /// projected for the joint: everything of the forward pass before the joint's largest
    /// tensor.
    fn encode_batch(&mut self, batch: &PaddedBatch, train: bool) -> Result<Encoded<B>, TrainError> {
        let cfg: &ModelConfig = &self.cfg.model;
        let b = batch.size();
        let (feats, frame_lens) = self.features(batch, train)?;
        // Before the forward's first operation meets a parameter (graph_join's module doc):
        // the parameters of this forward, not the joint's output layer, which the joint's parts
        // each run after a detach, with a backward of their own (`graph_join::join_visited`).
        graph_join::join_visited(|params| visit_forward(&self.model, params));
        let (enc, enc_lens) = self.model.encode(cfg, feats, &frame_lens);
        let u = batch.max_tokens;
        let ids: Vec<i64> = batch.tokens.iter().map(|&x| i64::from(x)).collect();
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, u]), &self.device);
        let pred = self.model.prediction.forward(targets);
        Ok(Encoded {
            enc: self.model.joint.project_encoder(enc),
            pred: self.model.joint.project_prediction(pred),
            enc_lens,
            token_lens: batch.token_lens.iter().map(|&n| n as usize).collect(),
        })
    }

    /// The loss of an encoded batch, its joint run whole.
    fn whole_loss(
        &mut self,
        e: Encoded<B>,
        batch: &PaddedBatch,
    ) -> Result<Tensor<B, 1>, TrainError> {
        let logits = self.model.joint.lattice(e.enc.unsqueeze_dim(2), e.pred.unsqueeze_dim(1));
        let out = self.loss.forward(logits, &batch.tokens, &e.enc_lens, &e.token_lens)?;
        Ok(out.loss)
    }

    /// The loss of one micro-batch as training computes it (SpecAugment, dither and dropout on,
    /// the joint as training runs it: whole, or on the host), without backward or update: the
    /// forward half of a step, for benchmarks. Advances the micro-batch counter as a step would.
    pub fn forward_loss(&mut self, batch: &PaddedBatch) -> Result<f64, TrainError> {
        self.begin_micro(self.micro);
        let e = self.encode_batch(batch, true)?;
        let value = if self.joint_on_host() {
            let rnnt = self.loss.next_branch();
            let x = e.joint_inputs(batch);
            let value =
                host_joint::host_joint_loss(self.model.joint.output_layer(), &self.loss, x, rnnt)?;
            // A live tensor keeps its graph: the encoder's output goes before the release.
            drop(e);
            value
        } else {
            let loss: f32 = self.whole_loss(e, batch)?.into_scalar().elem();
            f64::from(loss)
        };
        // No backward follows: without this, Burn would keep the forward's graph.
        graph_release::release(&self.model);
        self.micro += 1;
        Ok(value)
    }

    /// The encoder alone, as training runs it (dither, SpecAugment and dropout on): the mel
    /// front end and the FastConformer, then a surrogate loss, the mean square of the encoder's
    /// output, and with `backward` its gradients (computed, then dropped; no update). For
    /// benchmarks that compare the encoder with another implementation's on the same loss
    /// (`asrt-bench train-step --part encoder`, bench/peer_step.py's `--part encoder`): at
    /// Parakeet-TDT-0.6B's 24 layers the encoder is nearly all of a step. Advances the
    /// micro-batch counter as a step would.
    pub fn encoder_surrogate(
        &mut self,
        batch: &PaddedBatch,
        backward: bool,
    ) -> Result<f64, TrainError> {
        self.begin_micro(self.micro);
        let (feats, frame_lens) = self.features(batch, true)?;
        graph_join::join(&self.model);
        let (enc, _) = self.model.encode(&self.cfg.model, feats, &frame_lens);
        let loss = enc.powi_scalar(2).mean();
        let value: f32 = loss.clone().into_scalar().elem();
        if backward {
            drop(loss.backward());
        } else {
            drop(loss);
            graph_release::release(&self.model);
        }
        self.micro += 1;
        Ok(f64::from(value))
    }

    /// Whether the joint's output layer and the loss run on the host (`train.joint = "auto"` on
    /// a CPU backend in f32; [`host_joint`]).
    fn joint_on_host(&self) -> bool {
        self.cfg.train.joint == JointPath::Auto
            && B::joint_on_host()
            && self.cfg.train.precision == crate::model::precision::Precision::F32
    }

    /// Makes micro-batch `slot` the current one: its number, its loss branch, the backend's
    /// generator seeded from it (dropout).
    fn begin_micro(&mut self, slot: u64) {
        self.micro = slot;
        self.loss.calls = slot;
        let seed = rng::derive(self.cfg.train.seed, Stream::Backend, slot);
        crate::model::seed_backend::<B>(&self.device, seed);
    }

    /// Utterances per joint call for `e` ([`kernel_limit::utterances_per_call`]), `configured`
    /// lowered to what a kernel can launch over and to what the memory pool's shared pages hold
    /// ([`kernel_limit::pool_bound`]; on CubeCL devices whose largest page is 4 GiB or more).
    fn joint_part(&self, e: &Encoded<B>, configured: usize) -> Result<usize, TrainError> {
        let [b, frames, _] = e.enc.dims();
        let [_, positions, _] = e.pred.dims();
        let pool = device_memory::largest_buffer(&self.device).and_then(kernel_limit::pool_bound);
        Ok(kernel_limit::utterances_per_call(
            frames,
            positions,
            self.model.joint.widest(),
            configured,
            b,
            pool,
        )?)
    }

    /// The loss of one micro-batch and its gradients (the loss divided by `divisor` before
    /// backward), or `None` when the loss is not finite (nothing is then computed backward).
    /// With `train.fused_batch_size` below the batch size, or a joint too large for one kernel
    /// ([`kernel_limit`]), the joint runs in parts ([`Trainer::fused_gradients`]).
    fn micro_batch_gradients(
        &mut self,
        batch: &PaddedBatch,
        divisor: f64,
    ) -> Result<Option<(f64, GradientsParams)>, TrainError> {
        let m = &self.cfg.model;
        kernel_limit::check_subsampling(
            batch.size(),
            batch.seconds,
            crate::model::mel::padded_frames(&m.preprocessor, batch.max_samples),
            m.preprocessor.features,
            m.encoder.subsampling_conv_channels,
        )?;
        let mut lap = host_time::Lap::start();
        let e = self.encode_batch(batch, true)?;
        if self.joint_on_host() {
            let rnnt = self.loss.next_branch();
            let layer = self.model.joint.output_layer();
            let x = e.joint_inputs(batch);
            let out =
                host_joint::host_joint_gradients(&self.model, layer, &self.loss, x, rnnt, divisor)?;
            lap.to(&mut self.host.forward);
            return Ok(out);
        }
        let part = self.joint_part(&e, self.cfg.train.fused_batch_size)?;
        if part < batch.size() {
            let out = self.fused_gradients(e, batch, part, divisor)?;
            lap.to(&mut self.host.forward);
            return Ok(out);
        }
        let loss = self.whole_loss(e, batch)?;
        // Every forward operation launched, so allocated: its activations are all live here.
        self.memory.sample_queued(device_memory::Phase::Forward, &loss.clone().inner());
        lap.to(&mut self.host.forward);
        // The backward is queued before the loss is read (unless `ASRT_LOSS_READ=forward`):
        // reading it waits for the device, and a host that queues the step's operations no
        // faster than the device runs them (an H200's 0.6B step, bench/RESULTS.md, 2026-11-30)
        // would leave the device idle while it then queued the backward. A loss that is not
        // finite costs a backward whose gradients are dropped, as the step is then skipped.
        let first: Option<f32> = read_loss_first().then(|| loss.clone().into_scalar().elem());
        lap.to(&mut self.host.loss_read);
        if first.is_some_and(|v| !v.is_finite()) {
            return Ok(None);
        }
        let grads = loss.clone().div_scalar(divisor).backward();
        lap.to(&mut self.host.backward);
        let value = first.unwrap_or_else(|| loss.into_scalar().elem());
        lap.to(&mut self.host.loss_read);
        if !value.is_finite() {
            return Ok(None);
        }
        let grads = GradientsParams::from_grads(grads, &self.model);
        lap.to(&mut self.host.backward);
        Ok(Some((f64::from(value), grads)))
    }

    /// Waits for the device to finish micro-batch `slot` and turns what it reports into an error
    /// naming the batch ([`crate::device_failure`]): without this a failed allocation would
    /// leave garbage in the gradients.
    fn check_device(&mut self, batch: &PaddedBatch, slot: u64) -> Result<(), TrainError> {
        match crate::device_failure::check::<B>(&self.device) {
            Ok(()) => {
                self.memory.sample(device_memory::Phase::Gradients, &self.device);
                let cells = out_of_memory::lattice_cells(batch);
                self.largest_fit = Some(self.largest_fit.map_or(cells, |c| c.max(cells)));
                Ok(())
            }
            Err(failure) => Err(self.device_error(batch, slot, failure)),
        }
    }

    /// The error for a failure of micro-batch `slot`: out of memory names the batch and a
    /// `max_batch_seconds` that fits.
    fn device_error(&self, batch: &PaddedBatch, slot: u64, failure: DeviceFailure) -> TrainError {
        match failure {
            DeviceFailure::OutOfMemory { bytes } => TrainError::OutOfMemory(Box::new(
                OutOfMemory::new(batch, slot, self.step, bytes, &self.cfg, self.largest_fit),
            )),
            failure => TrainError::Device {
                during: format!("micro-batch {slot} (step {})", self.step),
                failure,
            },
        }
    }

    /// The joint and loss over parts of `part` utterances ([`fused::joint_in_parts`]); one
    /// loss branch for the whole micro-batch.
    fn fused_gradients(
        &mut self,
        e: Encoded<B>,
        batch: &PaddedBatch,
        part: usize,
        divisor: f64,
    ) -> Result<Option<(f64, GradientsParams)>, TrainError> {
        let rnnt = self.loss.next_branch();
        let inputs = fused::JointInputs {
            enc: e.enc,
            pred: e.pred,
            tokens: &batch.tokens,
            enc_lens: &e.enc_lens,
            token_lens: &e.token_lens,
        };
        Ok(fused::joint_in_parts(
            &self.model,
            &self.model.joint,
            &self.loss,
            inputs,
            part,
            rnnt,
            divisor,
        )?)
    }

    /// Writes a checkpoint of this trainer with `state` into `dir` (see [`checkpoint::save`]).
    pub fn save(
        &self,
        dir: &Path,
        state: &TrainState,
        keep: usize,
    ) -> Result<PathBuf, CheckpointError> {
        checkpoint::save(dir, &self.model, self.optim.to_record(&self.model), state, keep)
    }

    /// Restores model, optimizer and counters from a checkpoint whose state is `state`.
    pub fn restore(&mut self, ckpt: &Path, state: &TrainState) -> Result<(), CheckpointError> {
        self.model = checkpoint::load_model(ckpt, self.model.clone(), &self.device)?;
        let record = checkpoint::load_optim::<B, _>(ckpt, &self.device)?;
        self.optim = self.optim.clone().load_record(record);
        self.step = state.step;
        self.micro = state.micro;
        self.loss.calls = state.loss_calls;
        self.skipped = state.skipped;
        self.consecutive_skips = state.consecutive_skips;
        // A checkpoint of another precision (or from before f16-mixed) starts the scaler afresh.
        if self.loss_scale.is_some() {
            self.loss_scale = Some(state.loss_scale.unwrap_or_default());
        }
        Ok(())
    }

    /// Forward and backward over micro-batches that are numbers `slots` of the run (batch `k`
    /// draws its dither, SpecAugment masks, backend seed and loss branches from `slots[k]`), each
    /// loss divided by `divisor` before backward: with the step's micro-batch count over all
    /// ranks, the ranks' summed gradients are the step's mean, as one rank accumulating every
    /// micro-batch would compute it. Leaves the counters past the last slot.
    pub fn gradients_at(
        &mut self,
        batches: &[PaddedBatch],
        slots: &[u64],
        divisor: f64,
    ) -> Result<StepGradients, TrainError> {
        // Under f16-mixed the loss is multiplied by the scale before backward (`loss_scale`):
        // the division by the micro-batch count carries it.
        let n = divisor.max(1.0) / self.scale();
        let mut sum = flat_grads::GradientSum::<B, TdtModel<B>>::new(&self.device);
        let (mut loss_sum, mut finite, mut non_finite) = (0.0, 0u64, false);
        let (mut audio_seconds, mut utterances) = (0.0, 0u64);
        for (batch, &slot) in batches.iter().zip(slots) {
            self.begin_micro(slot);
            let result =
                match crate::device_failure::contain(|| self.micro_batch_gradients(batch, n)) {
                    Ok(result) => result?,
                    Err(failure) => return Err(self.device_error(batch, slot, failure)),
                };
            let mut lap = host_time::Lap::start();
            self.check_device(batch, slot)?;
            lap.to(&mut self.host.device_check);
            self.micro += 1;
            audio_seconds += batch.seconds;
            utterances += batch.size() as u64;
            let Some((value, grads)) = result else {
                // Where the loss was read first, backward did not run, and its graph would stay
                // while the next micro-batch runs (after a backward this finds nothing to free).
                graph_release::release(&self.model);
                non_finite = true;
                continue;
            };
            loss_sum += value;
            finite += 1;
            sum.add(&self.model, grads);
            lap.to(&mut self.host.backward);
        }
        Ok(StepGradients {
            grads: sum.finish(&self.model),
            loss: if finite > 0 { loss_sum / finite as f64 } else { f64::NAN },
            loss_sum,
            finite,
            non_finite,
            audio_seconds,
            utterances,
        })
    }

    /// Learning rate of the current step for a step of `audio_seconds`.
    pub fn lr(&self, audio_seconds: f64) -> f64 {
        let o = &self.cfg.optim;
        let base = o.lr_at(self.step, self.cfg.train.max_steps);
        if o.scale_lr_by_batch && o.reference_batch_seconds > 0.0 {
            base * audio_seconds / o.reference_batch_seconds
        } else {
            base
        }
    }

    /// The factor the loss is multiplied by before backward (1 unless f16-mixed).
    pub fn scale(&self) -> f64 {
        self.loss_scale.map_or(1.0, |s| s.scale)
    }

    /// Clips and applies gradients, or skips the step when they are not finite. Returns the
    /// metrics (without throughput fields) and, when skipped, nothing applied. Under f16-mixed
    /// the gradients arrive multiplied by the loss scale: the norm and the update divide it
    /// out, and a non-finite step lowers the scale (a skip that does not count towards
    /// `max_consecutive_skips` while the scale can still fall).
    pub fn apply(&mut self, mut g: StepGradients) -> (f64, f64, bool) {
        if self.step < self.cfg.optim.unfreeze_step {
            grads::drop_grads(&self.model.encoder, &mut g.grads);
        }
        let scale = self.scale();
        let lr = self.lr(g.audio_seconds);
        let clip = self.cfg.optim.grad_clip;
        let (non_finite, loss) = (g.non_finite, g.loss);
        let loss_scale = &mut self.loss_scale;
        let mut verdict = Verdict::NonFinite;
        let begun = std::time::Instant::now();
        // When the norm was read (the update is queued after it).
        let mut read = None;
        let decide = |raw: f64| {
            read = Some(std::time::Instant::now());
            let norm = raw / scale;
            let finite = !(non_finite || !norm.is_finite() || loss.is_nan());
            verdict = match loss_scale {
                Some(s) => s.update(finite),
                None if finite => Verdict::Apply,
                None => Verdict::NonFinite,
            };
            (verdict == Verdict::Apply).then(|| {
                let mut factor = 1.0 / scale;
                if clip > 0.0 && norm > clip {
                    factor *= clip / norm;
                }
                (lr, factor)
            })
        };
        let (model, raw, retired) =
            self.optim.apply(self.model.clone(), g.grads, &self.device, decide);
        // The old model's handles go first, so that the release holds the last of each.
        self.model = model;
        retired.release();
        let read = read.unwrap_or_else(std::time::Instant::now);
        self.host.norm += read.duration_since(begun).as_secs_f64();
        self.host.update += read.elapsed().as_secs_f64();
        let norm = raw / scale;
        let skip = verdict != Verdict::Apply;
        match verdict {
            Verdict::Apply => self.consecutive_skips = 0,
            Verdict::Backoff => self.skipped += 1,
            Verdict::NonFinite => {
                self.skipped += 1;
                self.consecutive_skips += 1;
            }
        }
        self.step += 1;
        (lr, norm, skip)
    }

    /// One optimizer step over `batches` (utterance indices of `set`) on this rank alone, with
    /// the metrics record.
    pub fn train_step(
        &mut self,
        batches: &[PaddedBatch],
        set: &TrainingSet,
        epoch: u64,
    ) -> Result<StepMetrics, TrainError>
    where
        B::InnerBackend: parallel::DeviceAllReduce,
    {
        let slots: Vec<u64> = (self.micro..self.micro + batches.len() as u64).collect();
        let next = self.micro + batches.len() as u64;
        let step = RankBatches {
            batches,
            slots: &slots,
            divisor: batches.len(),
            next_micro: next,
            peers: &[],
        };
        self.parallel_step(&step, set, epoch, &mut collective::Solo, 0.0)
    }

    /// One optimizer step of a data-parallel run: this rank's `step.batches` (micro-batch
    /// numbers `step.slots` of the run, losses divided by the step's micro-batch count over all
    /// ranks), gradients and statistics summed over the ranks of `coll`, the same update applied
    /// on every rank, the counters moved to `step.next_micro`; the metrics record covers every
    /// rank (`wait_seconds`: how long this rank waited for its batches).
    pub fn parallel_step(
        &mut self,
        step: &RankBatches<'_, B>,
        set: &TrainingSet,
        epoch: u64,
        coll: &mut dyn collective::Collective,
        wait_seconds: f64,
    ) -> Result<StepMetrics, TrainError>
    where
        B::InnerBackend: parallel::DeviceAllReduce,
    {
        let started = std::time::Instant::now();
        self.host = host_time::HostSeconds::default();
        let batches = step.batches;
        let g = self.gradients_at(batches, step.slots, step.divisor as f64)?;
        let mine_utterances = g.utterances;
        let mine_seconds = g.audio_seconds;
        let node = self.node_transport.as_deref_mut();
        let mut lap = host_time::Lap::start();
        let g = parallel::reduce(&self.model, g, coll, &self.device, step.peers, node)?;
        lap.to(&mut self.host.reduce);
        if self.grad_norms.is_some() && coll.rank() == 0 {
            let norms = grad_norms::by_path(&self.model, &g.grads, self.scale());
            if let Some(log) = &mut self.grad_norms {
                log.write(self.step + 1, &norms)?;
            }
        }
        let (loss, audio_seconds, utterances) = (g.loss, g.audio_seconds, g.utterances);
        // A micro-batch whose loss was not finite makes the step's loss unknown; a step the
        // f16 loss scale backs off from (its scaled gradients overflowed) had a finite loss.
        let loss_non_finite = g.non_finite;
        let loss_scale = self.loss_scale.map(|s| s.scale);
        let (lr, grad_norm, skipped) = self.apply(g);
        let mut lap = host_time::Lap::start();
        crate::device_failure::check::<B>(&self.device).map_err(|failure| TrainError::Device {
            during: format!("the optimizer update of step {}", self.step - 1),
            failure,
        })?;
        lap.to(&mut self.host.update_check);
        self.memory.sample(device_memory::Phase::Update, &self.device);
        let (model, _) = parallel::sync_buffers(self.model.clone(), coll)?;
        self.model = model;
        self.micro = step.next_micro;
        self.loss.calls = step.next_micro;
        let mine = parallel::RankStep {
            wait_seconds,
            step_seconds: started.elapsed().as_secs_f64(),
            utterances: mine_utterances,
            audio_seconds: mine_seconds,
            ids: batches
                .iter()
                .map(|b| b.indices.iter().map(|&g| <[u32; 2]>::from(set.locate(g))).collect())
                .collect(),
        };
        let mut ranks = parallel::gather_steps(&mine, coll)?;
        let ids: Vec<Vec<[u32; 2]>> = ranks.iter_mut().flat_map(|r| r.ids.drain(..)).collect();
        let all = || ids.iter().flatten().map(|&[c, i]| set.global(c, i));
        // Every rank counts the same skips, so every rank stops here together.
        if skipped && self.consecutive_skips > self.cfg.train.max_consecutive_skips {
            let names: Vec<String> = all().map(|g| set.segment_id(g)).collect();
            return Err(TrainError::NonFinite {
                steps: self.consecutive_skips,
                utterances: names.join(", "),
            });
        }
        let mut languages = BTreeMap::new();
        for g in all() {
            *languages.entry(set.language_name(g).to_owned()).or_insert(0u64) += 1;
        }
        let wall = started.elapsed().as_secs_f64().max(1e-9);
        Ok(StepMetrics {
            step: self.step,
            micro_batches: self.micro,
            loss: if skipped && loss_non_finite { f64::NAN } else { loss },
            lr,
            grad_norm,
            skipped,
            loss_scale,
            audio_seconds,
            utterances,
            audio_seconds_per_second: audio_seconds / wall,
            languages,
            epoch,
            ids,
            world_size: coll.world() as u32,
            ranks,
            device_memory: self.memory.take(),
            host_seconds: Some(self.host),
            validation: None,
        })
    }
}

/// Whether a micro-batch's loss is read before its backward is queued (`ASRT_LOSS_READ=forward`,
/// for A/B runs; read once per process) rather than after (the default): the same bits either
/// way, one wait for the device fewer a micro-batch the default way.
fn read_loss_first() -> bool {
    static FIRST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FIRST.get_or_init(|| std::env::var("ASRT_LOSS_READ").as_deref() == Ok("forward"))
}

/// Shows `visitor` the parameters of a micro-batch's forward before the joint's largest tensor,
/// which `encode_batch` joins into one graph: every parameter but the joint's output layer's,
/// which the joint's parts each run after a detach, with a backward of their own
/// (`graph_join::join_visited` says what joining it did).
fn visit_forward<B: Backend, V: burn::module::ModuleVisitor<B>>(
    model: &TdtModel<B>,
    visitor: &mut V,
) {
    model.encoder.visit(visitor);
    model.prediction.visit(visitor);
    model.joint.visit_projections(visitor);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Ad = burn::backend::Autodiff<burn::backend::NdArray>;

    /// The parameters a visitor is shown, by id.
    struct Ids(Vec<burn::module::ParamId>);

    impl<B: Backend> burn::module::ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<B, D>>) {
            self.0.push(p.id);
        }
    }

    /// The join's parameters are the model's less the joint's output layer, each once: joining
    /// the output layer too lost the prediction network's gradient in about one run in ten
    /// (tests/it/fused_joint.rs, which catches it only by chance; this does every time).
    #[test]
    fn the_forward_joins_every_parameter_but_the_joint_output_layer() {
        let cfg = TrainConfig::from_toml("[model.encoder]\nn_layers = 2\n").expect("config");
        let model = TdtModel::<Ad>::new(&cfg.model, 48, 7, &Default::default());
        let (mut all, mut joined, mut out) = (Ids(vec![]), Ids(vec![]), Ids(vec![]));
        model.visit(&mut all);
        visit_forward(&model, &mut joined);
        model.joint.output_layer().visit(&mut out);
        assert_eq!(out.0.len(), 2, "the output layer's weight and bias");
        let want: Vec<_> = all.0.into_iter().filter(|id| !out.0.contains(id)).collect();
        let got = joined.0;
        assert!(want.len() > 20, "the encoder, prediction network and projections");
        let extra = got.iter().filter(|id| !want.contains(id)).count();
        let missing = want.iter().filter(|id| !got.contains(id)).count();
        assert_eq!((extra, missing), (0, 0), "parameters joined that should not be, and missed");
        assert_eq!(got.len(), want.len(), "each joined once");
    }

    /// The 0.6B preset's forward (24 layers; the widths do not change the count) has fewer
    /// parameters than one join node takes, so they are joined in one merge (graph_join's
    /// module doc says why a tree of nodes leaves merges in the forward).
    #[test]
    fn the_0_6b_preset_s_forward_joins_in_one_node() {
        let cfg = TrainConfig::from_toml(
            "preset = \"parakeet-tdt-0.6b\"\n[model.encoder]\nd_model = 16\nn_heads = 2\n\
             ff_dim = 16\nsubsampling_conv_channels = 4\n[model.decoder]\npred_hidden = 8\n\
             [model.joint]\njoint_hidden = 8\n",
        )
        .expect("config");
        assert_eq!(cfg.model.encoder.n_layers, 24);
        let model = TdtModel::<Ad>::new(&cfg.model, 16, 5, &Default::default());
        let mut joined = Ids(vec![]);
        visit_forward(&model, &mut joined);
        let n = joined.0.len();
        assert!((800..=graph_join::PARENTS).contains(&n), "{n} parameters joined");
    }

    /// [`Trainer::encoder_surrogate`] (`asrt-bench train-step --part encoder`, the encoder
    /// measured against PyTorch's): its loss is the mean square of the encoder's output,
    /// recomputed here from the public pieces (the mel front end, `TdtModel::encode`) and summed
    /// in float64, with dither, SpecAugment and dropout off so that both see the same features.
    #[test]
    fn encoder_surrogate_is_the_mean_square_of_the_encoder_output() {
        let cfg = TrainConfig::from_toml(
            "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
             [model.spec_augment]\nfreq_masks = 0\ntime_masks = 0\n",
        )
        .expect("config");
        // Three utterances of 0.5-1.5 s of tones, padded to the longest.
        let lens = [8_000u32, 24_000, 15_000];
        let max = 24_000usize;
        let mut pcm = vec![0i16; lens.len() * max];
        for (i, &n) in lens.iter().enumerate() {
            for t in 0..n as usize {
                let x = (t as f64 * 0.013 * (i + 1) as f64).sin() * 6_000.0;
                pcm[i * max + t] = x as i16;
            }
        }
        let batch = PaddedBatch {
            indices: vec![0, 1, 2],
            audio: Audio::I16(pcm.clone()),
            max_samples: max,
            audio_lens: lens.to_vec(),
            tokens: vec![1, 2, 3, 4, 5, 6],
            max_tokens: 2,
            token_lens: vec![2, 2, 2],
            languages: vec![0; 3],
            seconds: lens.iter().map(|&n| f64::from(n) / 16_000.0).sum(),
        };
        let mut t = Trainer::<Ad>::new(cfg.clone(), 48, Default::default()).expect("trainer");
        let got = t.encoder_surrogate(&batch, true).expect("surrogate");
        assert_eq!(t.micro, 1, "one micro-batch done");
        let frontend = MelFrontend::<Ad>::new(&cfg.model.preprocessor, &t.device);
        let (feats, frames) = frontend.forward(&pcm, 3, &lens, None, &t.device);
        let (enc, _) = t.model.encode(&cfg.model, feats, &frames);
        let v: Vec<f32> = enc.into_data().to_vec().expect("f32");
        let want = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / v.len() as f64;
        let rel = (got - want).abs() / want;
        eprintln!("encoder surrogate {got} vs float64 {want}: relative {rel:.2e} over {}", v.len());
        // The f32 mean against the float64 sum: measured 2026-11-27, 2.4e-7 relative over
        // 5,472 values (the model's initialisation is seeded, so the same each run); the
        // bound is about 4x that.
        assert!(want > 0.0 && rel <= BOUND, "{got} vs {want}: {rel:.2e}");
        t.encoder_surrogate(&batch, false).expect("forward only");
        assert_eq!(t.micro, 2, "the next micro-batch");
    }

    const BOUND: f64 = 1e-6;
}
