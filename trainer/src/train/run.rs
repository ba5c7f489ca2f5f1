//! The training loop over a training set (one or more corpora), on one rank or many: epochs of
//! batch plans, the background loader, optimizer steps (gradients summed over the ranks),
//! metrics, checkpoints, resume (on another world size: the rest of the epoch re-dealt).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asr_corpus::Corpus;
use burn::tensor::backend::AutodiffBackend;

use super::collective::{Collective, CollectiveError, LocalGroup, Rendezvous, Solo, TcpGroup};
use super::metrics::{MetricsLog, StepMetrics};
use super::parallel::{DeviceAllReduce, HostSum};
use super::{RankBatches, ResumeMismatch, TrainError, Trainer};
use crate::checkpoint::{self, checkpoint_dir, TrainState};
use crate::config::TrainConfig;
use crate::model_source::{Expected, InitWeights, ModelSource, TokenizerId};
use asr_plan::batcher::{AudioFormat, Loader, LoaderConfig};
use asr_plan::sampler::EpochPlan;
use asr_plan::sampler::IDLE;
use asr_plan::set::CorpusIdentity;
use asr_plan::set::{DataSpec, TrainingSet};
use asr_tdt::op::TdtBackend;

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
    /// Initial weights of a fresh run: a `.nemo` file or an imported directory (`asrt import`),
    /// whose model configuration `cfg.model` must already be and whose tokenizer must be the
    /// training set's. Ignored when resuming (the checkpoint has the weights).
    pub init: Option<PathBuf>,
    /// Let `.nemo` state-dict keys that map to no parameter through.
    pub allow_unmapped: bool,
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

/// Where the other processes of a multi-process run are, and which one this is. Every process
/// runs as many devices as this one; global rank = process rank x devices + device index.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessGroup {
    /// This process's rank among the processes.
    pub rank: usize,
    /// Processes in all.
    pub count: usize,
    /// Where process 0 listens (`MASTER_ADDR:MASTER_PORT`).
    pub addr: String,
}

/// Trains on `device`; `on_step` sees every step's metrics and the steps to do in all.
pub fn run<B: AutodiffBackend + TdtBackend>(
    cfg: TrainConfig,
    opts: &RunOptions,
    device: B::Device,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError>
where
    B::InnerBackend: DeviceAllReduce,
{
    run_ranks::<B>(cfg, opts, vec![device], None, on_step)
}

/// What every rank of this process reads.
struct Shared<'a> {
    cfg: TrainConfig,
    opts: &'a RunOptions,
    set: Arc<TrainingSet>,
    vocab: usize,
    tokenizer_xxh3: String,
    identity: Vec<CorpusIdentity>,
    val: Option<Corpus>,
    resume: Option<(PathBuf, TrainState)>,
    init: Option<InitWeights>,
    plan: EpochPlan,
    epoch_step: u64,
    target: u64,
    world: u32,
}

/// What a run calls after every step with its metrics and the steps to do in all.
type OnStep<'a> = &'a mut dyn FnMut(&StepMetrics, u64);

/// How a rank reaches the others.
enum Member {
    Ready(Box<dyn Collective>),
    Tcp(Rendezvous),
}

/// Data-parallel training: one rank per device of `devices` in this process (threads), times
/// the processes of `processes` (one per node, started by Slurm or a torchrun-style launcher).
/// Each rank trains its share of every step (the plan deals it), gradients are summed over all
/// ranks, and every rank applies the same update. Global rank 0 writes the metrics, plots and
/// checkpoints; `on_step` runs on this process's first rank.
pub fn run_ranks<B: AutodiffBackend + TdtBackend>(
    cfg: TrainConfig,
    opts: &RunOptions,
    devices: Vec<B::Device>,
    processes: Option<ProcessGroup>,
    on_step: &mut dyn FnMut(&StepMetrics, u64),
) -> Result<RunSummary, TrainError>
where
    B::InnerBackend: DeviceAllReduce,
{
    let local = devices.len();
    if local == 0 {
        return Err(TrainError::NoDevice);
    }
    let (process, processes_n) = processes.as_ref().map_or((0, 1), |p| (p.rank, p.count));
    if process >= processes_n {
        return Err(TrainError::ProcessRank { rank: process, count: processes_n });
    }
    let world = local * processes_n;
    let lead = process == 0;
    // Every input is checked before anything is written.
    let set = Arc::new(TrainingSet::open(&opts.data)?);
    let (vocab, tokenizer_xxh3) = set.tokenizer();
    let (vocab, tokenizer_xxh3) = (vocab as usize, tokenizer_xxh3.to_owned());
    let identity = set.identity();
    let set_tokenizer = TokenizerId { xxh3: tokenizer_xxh3.clone(), vocab };
    let val = match (&opts.val_corpus, lead) {
        (Some(p), true) => Some(open_val(p, &set_tokenizer)?),
        _ => None,
    };
    let ckpt_dir = checkpoint_dir(&opts.out);
    let resume = match opts.resume.then(|| checkpoint::latest(&ckpt_dir)).flatten() {
        Some(ckpt) => {
            let state = checkpoint::load_state(&ckpt)?;
            check_resume(&ckpt, &state, &cfg, &set, &set_tokenizer, &identity)?;
            Some((ckpt, state))
        }
        None => None,
    };
    // The initial weights, read once for every local rank (a resume has its own); their
    // tokenizer is checked against the training set's before any weight is read.
    let init_source = opts.init.as_deref().map(ModelSource::resolve).transpose()?;
    let init = match &init_source {
        Some(source) if resume.is_none() => {
            Some(InitWeights::read(source, &set_tokenizer, opts.allow_unmapped)?)
        }
        _ => None,
    };
    if let Some(source) = &init_source {
        let info = match &init {
            Some(w) => w.info.clone(),
            None => source.describe()?,
        };
        source.check_tokenizer(&info, &set_tokenizer, Expected::TrainingSet)?;
        if info.model != cfg.model {
            return Err(TrainError::InitModel { path: source.path().to_owned() });
        }
    }
    let (durations, languages, mix) = (set.durations(), set.languages(), set.mix());
    let accum = cfg.train.grad_accum;
    let (plan, epoch_step) = match &resume {
        Some((_, state)) => {
            let mut plan =
                EpochPlan::restore_mixed(durations, languages, &mix, &cfg.sampler, &state.sampler)?;
            let step = state.sampler.step;
            // Another world size (or accumulation) than the checkpoint's: the rest of the epoch
            // is dealt again, to these ranks.
            let now = plan.segments().last().map(|s| (s.world_size, s.grad_accum));
            if now != Some((world as u32, accum)) {
                plan.redeal(step, world as u32, accum)?;
            }
            (plan, step)
        }
        None => (
            EpochPlan::build_mixed(
                durations,
                languages,
                &mix,
                &cfg.sampler,
                0,
                world as u32,
                accum,
            )?,
            0,
        ),
    };
    if lead {
        std::fs::create_dir_all(&opts.out).map_err(TrainError::io("creating", &opts.out))?;
    }
    let timeout = Duration::from_secs_f64(cfg.train.collective_timeout_seconds.max(0.001));
    let mut members: Vec<Member> = match &processes {
        None if local == 1 => vec![Member::Ready(Box::new(Solo))],
        None => LocalGroup::new(local, timeout)
            .into_iter()
            .map(|m| Member::Ready(Box::new(m) as Box<dyn Collective>))
            .collect(),
        Some(p) => {
            let fingerprint = fingerprint(&cfg, &identity, local);
            (0..local)
                .map(|k| {
                    Member::Tcp(Rendezvous {
                        addr: p.addr.clone(),
                        rank: p.rank * local + k,
                        world,
                        timeout,
                        fingerprint,
                    })
                })
                .collect()
        }
    };
    let target = opts.stop_at.unwrap_or(cfg.train.max_steps).min(cfg.train.max_steps);
    let shared = Shared {
        cfg,
        opts,
        set,
        vocab,
        tokenizer_xxh3,
        identity,
        val,
        resume,
        init,
        plan,
        epoch_step,
        target,
        world: world as u32,
    };
    let first = members.remove(0);
    // All ranks in this process: the backend may sum on the devices (CUDA: NCCL).
    let peers: Vec<B::Device> = if processes.is_none() { devices.clone() } else { Vec::new() };
    std::thread::scope(|s| {
        let (shared, peers) = (&shared, &peers[..]);
        let mut devices = devices.into_iter();
        let device0 = devices.next();
        let handles: Vec<_> = devices
            .zip(members)
            .map(|(device, member)| {
                s.spawn(move || rank_main::<B>(shared, device, peers, member, None))
            })
            .collect();
        let mine = match device0 {
            Some(d) => rank_main::<B>(shared, d, peers, first, Some(on_step)),
            None => Err(TrainError::NoDevice),
        };
        let mut results = vec![mine];
        for h in handles {
            results.push(h.join().unwrap_or_else(|_| {
                Err(TrainError::Collective(CollectiveError::PeerLeft {
                    rank: 0,
                    why: "a rank's thread panicked".into(),
                }))
            }));
        }
        // The error that started it, rather than the others' reports of a rank stopping.
        let cause = |e: &TrainError| !matches!(e, TrainError::Collective(_));
        match results.iter().position(|r| r.as_ref().is_err_and(cause)) {
            Some(k) => results.swap_remove(k),
            None => results.swap_remove(0),
        }
    })
}

/// One rank: joins the others, trains, and tells them if it stops early.
fn rank_main<B: AutodiffBackend + TdtBackend>(
    shared: &Shared<'_>,
    device: B::Device,
    peers: &[B::Device],
    member: Member,
    on_step: Option<OnStep<'_>>,
) -> Result<RunSummary, TrainError>
where
    B::InnerBackend: DeviceAllReduce,
{
    let (mut coll, processes): (Box<dyn Collective>, bool) = match member {
        Member::Ready(c) => (c, false),
        Member::Tcp(r) => (Box::new(TcpGroup::join(&r)?), true),
    };
    let node = match processes {
        true => B::InnerBackend::node_transport(&device, &mut *coll)?,
        false => None,
    };
    let result = rank_loop::<B>(shared, device, peers, node, &mut *coll, on_step);
    match &result {
        Ok(_) => coll.finish(),
        Err(e) => coll.abort(&e.to_string()),
    }
    result
}

fn rank_loop<B: AutodiffBackend + TdtBackend>(
    sh: &Shared<'_>,
    device: B::Device,
    peers: &[B::Device],
    node: Option<Box<dyn HostSum>>,
    coll: &mut dyn Collective,
    mut on_step: Option<OnStep<'_>>,
) -> Result<RunSummary, TrainError>
where
    B::InnerBackend: DeviceAllReduce,
{
    let (cfg, opts, target) = (&sh.cfg, sh.opts, sh.target);
    let rank = coll.rank() as u32;
    let lead = rank == 0;
    let mut trainer = Trainer::<B>::new(cfg.clone(), sh.vocab, device)?;
    trainer.node_transport = node;
    if let Some((ckpt, state)) = &sh.resume {
        trainer.restore(ckpt, state)?;
    } else if let Some(init) = &sh.init {
        trainer.model = init.apply(trainer.model.clone())?;
    }
    let (mut plan, mut epoch_step) = (sh.plan.clone(), sh.epoch_step);
    let mut log = match lead {
        true => Some(
            MetricsLog::open(&opts.out, trainer.step)
                .map_err(TrainError::io("opening the metrics in", &opts.out))?,
        ),
        false => None,
    };
    let mut summary =
        RunSummary { steps: trainer.step, skipped: 0, checkpoint: None, metrics: Vec::new() };
    let ckpt_dir = checkpoint_dir(&opts.out);
    let save = |trainer: &Trainer<B>, plan: &EpochPlan, epoch_step: u64| {
        let state = TrainState {
            step: trainer.step,
            micro: trainer.micro,
            sampler: plan.state(epoch_step),
            loss_calls: trainer.loss.calls,
            skipped: trainer.skipped,
            consecutive_skips: trainer.consecutive_skips,
            vocab: sh.vocab,
            config: cfg.clone(),
            corpus_utterances: sh.set.len() as u64,
            tokenizer_xxh3: sh.tokenizer_xxh3.clone(),
            corpora: sh.identity.clone(),
            loss_scale: trainer.loss_scale,
        };
        trainer.save(&ckpt_dir, &state, cfg.train.keep_checkpoints)
    };
    let plot = |log: &MetricsLog| {
        log.plot().map_err(TrainError::io("writing the loss plot in", &opts.out))
    };
    let (durations, languages, mix) = (sh.set.durations(), sh.set.languages(), sh.set.mix());
    while trainer.step < target {
        if plan.steps() == 0 {
            return Err(TrainError::NoSteps {
                utterances: sh.set.len(),
                max_batch_seconds: cfg.sampler.max_batch_seconds,
                grad_accum: cfg.train.grad_accum,
            });
        }
        let shared_plan = Arc::new(plan.clone());
        let loader = Loader::start(
            Arc::clone(&sh.set),
            Arc::clone(&shared_plan),
            rank,
            epoch_step,
            LoaderConfig {
                format: AudioFormat::I16,
                shape: cfg.shape,
                workers: cfg.train.loader_workers.max(1),
                ..LoaderConfig::default()
            },
        );
        let mut steps = loader.steps();
        loop {
            let waiting = Instant::now();
            let Some(loaded) = steps.next() else { break };
            let loaded = loaded?;
            let wait = waiting.elapsed().as_secs_f64();
            let (world, g) = plan
                .layout_at(loaded.step)
                .map_or((1, 1), |s| (s.world_size as usize, s.grad_accum as usize));
            // Slot j of rank r is the run's micro-batch base + r g + j, whatever the world size,
            // so its random draws are those of the same slot of one rank accumulating all.
            let base = trainer.micro;
            let row = plan.step_batches(loaded.step, rank);
            let slots: Vec<u64> = (0..row.len())
                .filter(|&j| row[j] != IDLE)
                .map(|j| base + (rank as usize * g + j) as u64)
                .collect();
            let divisor = (0..world as u32)
                .map(|r| plan.step_batches(loaded.step, r).iter().filter(|&&b| b != IDLE).count())
                .sum();
            let share = RankBatches {
                batches: &loaded.batches,
                slots: &slots,
                divisor,
                next_micro: base + (world * g) as u64,
                peers,
            };
            let mut m = trainer.parallel_step(&share, &sh.set, plan.epoch(), coll, wait)?;
            let every = cfg.train.val_every;
            if let (Some(vc), true) = (&sh.val, every > 0 && trainer.step % every == 0) {
                let n = cfg.train.val_utterances.min(vc.len());
                let indices: Vec<usize> = (0..n).collect();
                let model = burn::module::AutodiffModule::valid(&trainer.model);
                let e =
                    crate::eval::evaluate(&model, &cfg.model, vc, &indices, 60.0, &trainer.device)?;
                m.validation = Some(e.summary());
            }
            epoch_step = loaded.step + 1;
            if let Some(log) = &mut log {
                log.push(&m).map_err(TrainError::io("appending to the metrics in", &opts.out))?;
            }
            if let Some(f) = on_step.as_mut() {
                f(&m, target);
            }
            summary.metrics.push(m);
            let every = cfg.train.checkpoint_every;
            if let (Some(log), true) =
                (&log, (every > 0 && trainer.step % every == 0) || trainer.step >= target)
            {
                summary.checkpoint = Some(save(&trainer, &plan, epoch_step)?);
                plot(log)?;
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
            sh.world,
            cfg.train.grad_accum,
        )?;
        epoch_step = 0;
    }
    if let Some(log) = &log {
        plot(log)?;
    }
    summary.steps = trainer.step;
    summary.skipped = trainer.skipped;
    Ok(summary)
}

/// Opens the validation corpus and checks it shares the training set's tokenizer.
fn open_val(p: &Path, set: &TokenizerId) -> Result<Corpus, TrainError> {
    let c = open_corpus(p)?;
    let corpus = TokenizerId::of_corpus(&c);
    if corpus != *set {
        return Err(TrainError::ValTokenizer { path: p.to_owned(), corpus, set: set.clone() });
    }
    Ok(c)
}

/// Refuses a checkpoint of another model or training set.
fn check_resume(
    ckpt: &Path,
    state: &TrainState,
    cfg: &TrainConfig,
    set: &TrainingSet,
    tokenizer: &TokenizerId,
    identity: &[CorpusIdentity],
) -> Result<(), TrainError> {
    let saved_tokenizer = TokenizerId { xxh3: state.tokenizer_xxh3.clone(), vocab: state.vocab };
    let why = if state.config.model != cfg.model || state.vocab != tokenizer.vocab {
        Some(ResumeMismatch::Model)
    } else if state.corpus_utterances != set.len() as u64 || saved_tokenizer != *tokenizer {
        Some(ResumeMismatch::TrainingSet {
            saved_utterances: state.corpus_utterances,
            saved_tokenizer,
            corpora: set.corpus_names().join(", "),
            utterances: set.len() as u64,
            tokenizer: tokenizer.clone(),
        })
    } else {
        identity_mismatch(&state.corpora, identity)
    };
    match why {
        Some(why) => Err(TrainError::Resume { checkpoint: ckpt.to_owned(), why: Box::new(why) }),
        None => Ok(()),
    }
}

/// What every process of a multi-process run must agree on: this binary, the config (without
/// the corpora's paths, which may differ between nodes), the training set, the devices per
/// process.
fn fingerprint(cfg: &TrainConfig, identity: &[CorpusIdentity], local: usize) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut cfg = cfg.clone();
    cfg.data.clear();
    let corpora: Vec<String> = identity
        .iter()
        .map(|c| {
            format!("{} {} {} {:?} {:?}", c.utterances, c.samples, c.weight, c.language, c.source)
        })
        .collect();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut h);
    serde_json::to_string(&cfg).unwrap_or_default().hash(&mut h);
    corpora.hash(&mut h);
    local.hash(&mut h);
    h.finish()
}

/// Why a checkpoint's training set is not `now` (`None`: it is, or the checkpoint predates
/// training sets and the utterance count and tokenizer, checked by the caller, are all it has).
fn identity_mismatch(saved: &[CorpusIdentity], now: &[CorpusIdentity]) -> Option<ResumeMismatch> {
    if saved.is_empty() {
        return None;
    }
    if saved.len() != now.len() {
        let paths = |l: &[CorpusIdentity]| l.iter().map(|c| c.path.clone()).collect();
        return Some(ResumeMismatch::CorpusCount { saved: paths(saved), now: paths(now) });
    }
    for (index, (a, b)) in saved.iter().zip(now).enumerate() {
        if (a.utterances, a.samples) != (b.utterances, b.samples) {
            return Some(ResumeMismatch::Corpus {
                index,
                saved: Box::new(a.clone()),
                now: Box::new(b.clone()),
            });
        }
        if (a.weight, &a.language, &a.source) != (b.weight, &b.language, &b.source) {
            return Some(ResumeMismatch::Mix {
                index,
                saved: Box::new(a.clone()),
                now: Box::new(b.clone()),
            });
        }
    }
    None
}
