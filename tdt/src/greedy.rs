//! NeMo's `greedy_batch` TDT decoding (label looping), over small traits so it can run with a
//! real model or with scripted joints.
//!
//! Per utterance: from frame 0 and the start-of-sequence prediction state, evaluate the joint;
//! token and duration are each the argmax of their logits. A blank with duration 0 is forced to
//! duration 1. Blanks advance the frame by their duration until a label is found; a label is
//! emitted with the frame it was found at, the prediction state advances with it, and the frame
//! advances by the label's duration (0 stays on the frame). After `max_symbols` labels on one
//! frame with duration 0, the frame advances by one. The last label is kept even if its duration
//! jumps past the end. Utterances run in lock step: every iteration evaluates the joint once for
//! each utterance still decoding.

/// A prediction network and joint, batched over utterances.
pub trait TdtDecoderModel {
    /// Prediction-network state of the utterances being decoded.
    type State;

    /// Start-of-sequence state for `batch` utterances.
    fn start(&mut self, batch: usize) -> Self::State;

    /// Joint logits `[V + D]` (tokens with blank last, then durations) for each utterance in
    /// `rows`, at encoder frame `frames[k]` for `rows[k]`, with its current prediction state.
    /// Returns `rows.len() * (V + D)` values, row-major.
    fn joint(&mut self, state: &Self::State, rows: &[usize], frames: &[usize]) -> Vec<f32>;

    /// Advances the prediction state of utterance `rows[k]` with label `labels[k]`.
    fn advance(&mut self, state: &mut Self::State, rows: &[usize], labels: &[usize]);

    /// The decision of each row of [`Self::joint`]: the arg-max token among the first `vocab`
    /// logits and the arg-max duration index among the rest (the first maximum wins on ties, as
    /// `torch.argmax` does on the CPU). A model that keeps its logits on a device overrides
    /// this to read back two integers per row instead of the logits.
    fn joint_argmax(
        &mut self,
        state: &Self::State,
        rows: &[usize],
        frames: &[usize],
        vocab: usize,
    ) -> Vec<(usize, usize)> {
        let logits = self.joint(state, rows, frames);
        let width = logits.len() / rows.len().max(1);
        logits
            .chunks_exact(width.max(1))
            .map(|z| (argmax(&z[..vocab]), argmax(&z[vocab..])))
            .collect()
    }
}

/// A decoded utterance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hypothesis {
    /// Token ids.
    pub tokens: Vec<usize>,
    /// Encoder frame at which each token was emitted.
    pub frames: Vec<usize>,
    /// Predicted duration of each token.
    pub durations: Vec<usize>,
}

/// Options of greedy decoding.
#[derive(Debug, Clone)]
pub struct GreedyOptions {
    /// Token classes including blank (blank is `vocab - 1`).
    pub vocab: usize,
    /// Duration set.
    pub durations: Vec<usize>,
    /// Most labels emitted on one frame with duration 0 before the frame is forced on (NeMo's
    /// `max_symbols`; Parakeet: 10). `None`: no limit.
    pub max_symbols: Option<usize>,
}

fn argmax(xs: &[f32]) -> usize {
    // First maximum wins, as torch.argmax does on CPU.
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// Decodes utterances with `frame_lens[b]` encoder frames each.
pub fn greedy_batch<M: TdtDecoderModel>(
    model: &mut M,
    frame_lens: &[usize],
    opts: &GreedyOptions,
) -> Vec<Hypothesis> {
    let n = frame_lens.len();
    let blank = opts.vocab - 1;
    let mut state = model.start(n);
    let mut hyps = vec![Hypothesis::default(); n];
    let mut t = vec![0usize; n];
    // Labels emitted at the current frame, for the max_symbols guard.
    let mut at_frame = vec![(usize::MAX, 0usize); n];
    loop {
        let rows: Vec<usize> = (0..n).filter(|&b| t[b] < frame_lens[b]).collect();
        if rows.is_empty() {
            break;
        }
        let frames: Vec<usize> = rows.iter().map(|&b| t[b]).collect();
        let decisions = model.joint_argmax(&state, &rows, &frames, opts.vocab);
        let mut emit_rows = Vec::new();
        let mut emit_labels = Vec::new();
        for (&b, &(token, di)) in rows.iter().zip(&decisions) {
            let mut d = opts.durations[di];
            if token == blank {
                t[b] += d.max(1);
                continue;
            }
            let t_lab = t[b];
            hyps[b].tokens.push(token);
            hyps[b].frames.push(t_lab);
            hyps[b].durations.push(d);
            emit_rows.push(b);
            emit_labels.push(token);
            let count = if at_frame[b].0 == t_lab { at_frame[b].1 + 1 } else { 1 };
            at_frame[b] = (t_lab, count);
            if d == 0 && opts.max_symbols.is_some_and(|m| count >= m) {
                d = 1;
            }
            t[b] = t_lab + d;
        }
        if !emit_rows.is_empty() {
            model.advance(&mut state, &emit_rows, &emit_labels);
        }
    }
    hyps
}
