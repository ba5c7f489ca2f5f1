//! Padded batches: audio `[B, T]` (i16 or f32), tokens `[B, U]`, lengths and language ids,
//! assembled from the memory-mapped corpus by background threads into a bounded, ordered queue,
//! with `madvise(WILLNEED)` on the audio of the batches coming next.
//!
//! Each utterance's samples are copied once, from the mapping into the batch buffer (converted to
//! f32 during that copy when asked); nothing else copies audio.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use asr_corpus::TokenSlice;

use super::sampler::{EpochPlan, IDLE};
use super::set::UtteranceSource;
use super::shape::ShapePolicy;

/// Sample type of the padded audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AudioFormat {
    /// Signed 16-bit, as stored (the model's front end converts on the device).
    #[default]
    I16,
    /// f32 in [-1, 1): sample / 32768.
    F32,
}

/// Padded audio, row-major `[batch, frames]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Audio {
    /// 16-bit samples.
    I16(Vec<i16>),
    /// f32 samples.
    F32(Vec<f32>),
}

/// One padded micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedBatch {
    /// Utterance indices (of the corpus, or of the training set), in batch order.
    pub indices: Vec<u32>,
    /// Audio `[indices.len(), max_samples]`, zero padded.
    pub audio: Audio,
    /// Padded audio length T (rounded up by the shape policy).
    pub max_samples: usize,
    /// Samples of each utterance.
    pub audio_lens: Vec<u32>,
    /// Tokens `[indices.len(), max_tokens]`, padded with 0.
    pub tokens: Vec<u32>,
    /// Padded token length U (rounded up by the shape policy).
    pub max_tokens: usize,
    /// Tokens of each utterance.
    pub token_lens: Vec<u32>,
    /// Language id of each utterance.
    pub languages: Vec<u16>,
    /// Audio seconds in the batch (the realized batch size in time).
    pub seconds: f64,
}

impl PaddedBatch {
    /// Utterances in the batch (the realized batch size).
    pub fn size(&self) -> usize {
        self.indices.len()
    }
}

/// Copies the utterances `indices` of `corpus` (a corpus or a training set) into a padded batch.
pub fn assemble<S: UtteranceSource + ?Sized>(
    corpus: &S,
    indices: &[u32],
    shape: ShapePolicy,
    format: AudioFormat,
) -> PaddedBatch {
    let b = indices.len();
    let audio_lens: Vec<u32> = indices.iter().map(|&i| corpus.pcm(i).len() as u32).collect();
    let token_lens: Vec<u32> = indices.iter().map(|&i| corpus.tokens(i).len() as u32).collect();
    let rate = corpus.sample_rate();
    let max_samples = shape
        .padded_samples(u64::from(audio_lens.iter().copied().max().unwrap_or(0)), rate)
        as usize;
    let max_tokens =
        shape.padded_tokens(u64::from(token_lens.iter().copied().max().unwrap_or(0))) as usize;

    let audio = match format {
        AudioFormat::I16 => {
            let mut buf = vec![0i16; b * max_samples];
            for (row, &i) in buf.chunks_exact_mut(max_samples.max(1)).zip(indices) {
                let pcm = corpus.pcm(i);
                row[..pcm.len()].copy_from_slice(pcm);
            }
            Audio::I16(buf)
        }
        AudioFormat::F32 => {
            let mut buf = vec![0f32; b * max_samples];
            for (row, &i) in buf.chunks_exact_mut(max_samples.max(1)).zip(indices) {
                let pcm = corpus.pcm(i);
                for (o, &s) in row.iter_mut().zip(pcm) {
                    *o = f32::from(s) * (1.0 / 32768.0);
                }
            }
            Audio::F32(buf)
        }
    };
    let mut tokens = vec![0u32; b * max_tokens];
    for (row, &i) in tokens.chunks_exact_mut(max_tokens.max(1)).zip(indices) {
        match corpus.tokens(i) {
            TokenSlice::U16(t) => row.iter_mut().zip(t).for_each(|(o, &x)| *o = u32::from(x)),
            TokenSlice::U32(t) => row[..t.len()].copy_from_slice(t),
        }
    }
    let languages = indices.iter().map(|&i| corpus.language(i)).collect();
    let seconds = audio_lens.iter().map(|&n| f64::from(n)).sum::<f64>() / rate;
    PaddedBatch {
        indices: indices.to_vec(),
        audio,
        max_samples,
        audio_lens,
        tokens,
        max_tokens,
        token_lens,
        languages,
        seconds,
    }
}

/// One slot of a rank's schedule, as the loader delivers it.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    /// Optimizer step within the epoch.
    pub step: u64,
    /// Position within the step, `0..grad_accum`.
    pub slot: u32,
    /// The batch, or `None` for an idle slot (after a re-deal, a rank with nothing to do: it
    /// still takes part in the step, contributing no gradient).
    pub batch: Option<PaddedBatch>,
}

/// How the loader assembles batches.
#[derive(Debug, Clone, Copy)]
pub struct LoaderConfig {
    /// Padding policy.
    pub shape: ShapePolicy,
    /// Audio sample type.
    pub format: AudioFormat,
    /// Background assembly threads (at least 1).
    pub workers: usize,
    /// Finished batches each worker may hold ahead of the consumer (at least 1).
    pub depth: usize,
}

impl Default for LoaderConfig {
    fn default() -> LoaderConfig {
        LoaderConfig {
            shape: ShapePolicy::default(),
            format: AudioFormat::I16,
            workers: 2,
            depth: 2,
        }
    }
}

/// Background loader of one rank's micro-batches from a step to the end of the epoch, in order.
///
/// Worker `w` assembles slots `w, w + workers, ...` into its own bounded channel and, before
/// each batch, advises the kernel about the audio of its next one; the iterator reads the
/// channels round robin, so batches arrive in schedule order and at most `workers * depth`
/// finished batches wait in memory. Dropping the loader stops the workers.
pub struct Loader {
    receivers: Vec<Receiver<MicroBatch>>,
    next: usize,
    remaining: usize,
    /// Optimizer steps still to deliver, with their slot counts, in order.
    steps: VecDeque<(u64, usize)>,
    workers: Vec<JoinHandle<()>>,
}

/// One optimizer step of a rank's schedule: its batches, in slot order.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedStep {
    /// Optimizer step within the epoch.
    pub step: u64,
    /// The step's batches (its idle slots left out).
    pub batches: Vec<PaddedBatch>,
    /// Idle slots of the step (a rank with nothing to do after a re-deal).
    pub idle: usize,
}

/// Why the loader could not deliver a step.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoaderError {
    /// A worker stopped before delivering all of its batches (it panicked).
    #[error("the batch loader stopped before slot {slot} of step {step} (a loader thread died)")]
    Stopped {
        /// The step being assembled.
        step: u64,
        /// Slots of that step received.
        slot: usize,
    },
}

impl Loader {
    /// Starts loading rank `rank`'s micro-batches of `plan` from optimizer step `from`.
    pub fn start<S: UtteranceSource + 'static>(
        corpus: Arc<S>,
        plan: Arc<EpochPlan>,
        rank: u32,
        from: u64,
        config: LoaderConfig,
    ) -> Loader {
        let mut jobs: Vec<(u64, u32, u32)> = Vec::new();
        let mut steps = VecDeque::new();
        for step in from..plan.steps() {
            let batches = plan.step_batches(step, rank);
            steps.push_back((step, batches.len()));
            for (slot, &b) in batches.iter().enumerate() {
                jobs.push((step, slot as u32, b));
            }
        }
        let jobs = Arc::new(jobs);
        let n = config.workers.max(1);
        let mut receivers = Vec::with_capacity(n);
        let mut workers = Vec::with_capacity(n);
        for w in 0..n {
            let (tx, rx) = sync_channel(config.depth.max(1));
            receivers.push(rx);
            let (corpus, plan, jobs) = (Arc::clone(&corpus), Arc::clone(&plan), Arc::clone(&jobs));
            workers
                .push(std::thread::spawn(move || work(&*corpus, &plan, &jobs, w, n, config, &tx)));
        }
        Loader { remaining: jobs.len(), receivers, next: 0, steps, workers }
    }

    /// The rest of the schedule, one optimizer step at a time (the loader knows where steps
    /// end; the training loop need not ask the plan).
    pub fn steps(self) -> Steps {
        Steps { loader: self }
    }
}

/// Iterator over a [`Loader`]'s optimizer steps.
pub struct Steps {
    loader: Loader,
}

impl Iterator for Steps {
    type Item = Result<LoadedStep, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (step, slots) = self.loader.steps.pop_front()?;
        let mut out = LoadedStep { step, batches: Vec::with_capacity(slots), idle: 0 };
        for slot in 0..slots {
            match self.loader.next() {
                Some(mb) if mb.step == step => match mb.batch {
                    Some(b) => out.batches.push(b),
                    None => out.idle += 1,
                },
                _ => {
                    self.loader.steps.clear();
                    return Some(Err(LoaderError::Stopped { step, slot }));
                }
            }
        }
        Some(Ok(out))
    }
}

fn work<S: UtteranceSource + ?Sized>(
    corpus: &S,
    plan: &EpochPlan,
    jobs: &[(u64, u32, u32)],
    first: usize,
    stride: usize,
    config: LoaderConfig,
    tx: &SyncSender<MicroBatch>,
) {
    let prefetch = |j: usize| {
        if let Some(&(_, _, b)) = jobs.get(j) {
            if b != IDLE {
                for &i in plan.batch(b) {
                    corpus.prefetch(i);
                }
            }
        }
    };
    prefetch(first);
    for j in (first..jobs.len()).step_by(stride) {
        prefetch(j + stride);
        let (step, slot, b) = jobs[j];
        let batch =
            (b != IDLE).then(|| assemble(corpus, plan.batch(b), config.shape, config.format));
        if tx.send(MicroBatch { step, slot, batch }).is_err() {
            return; // The loader was dropped.
        }
    }
}

impl Iterator for Loader {
    type Item = MicroBatch;

    fn next(&mut self) -> Option<MicroBatch> {
        if self.remaining == 0 {
            return None;
        }
        let n = self.receivers.len();
        let mb = self.receivers[self.next % n].recv().ok()?;
        self.next += 1;
        self.remaining -= 1;
        Some(mb)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the channels makes every worker's next send fail, so each one returns.
        self.receivers.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
