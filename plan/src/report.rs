//! What a plan will do, before a GPU starts: batches and hours per bucket, language, source and
//! corpus shares before and after temperature, padding, per-step cost imbalance across ranks, the largest batch, and
//! what truncation and trimming drop.

use serde::Serialize;

use super::sampler::{for_each_cell, Durations, EpochPlan, Mix, PlanError, SamplerConfig, IDLE};
use super::shape::ShapePolicy;

/// One duration bucket.
#[derive(Debug, Clone, Serialize)]
pub struct BucketReport {
    /// `[lo, hi)` in seconds.
    pub range: String,
    /// Batches used in the epoch.
    pub batches: u64,
    /// Utterances in those batches.
    pub utterances: u64,
    /// Hours of audio in those batches.
    pub hours: f64,
    /// Mean utterances per batch.
    pub mean_batch_size: f64,
}

/// One language.
#[derive(Debug, Clone, Serialize)]
pub struct LanguageReport {
    /// Language code.
    pub language: String,
    /// Utterances in the corpus.
    pub utterances: u64,
    /// Hours in the corpus.
    pub hours: f64,
    /// Share of the corpus's utterances.
    pub corpus_share: f64,
    /// Share after temperature (`count^T`, normalised): what the weighting aims for.
    pub target_share: f64,
    /// Share of utterances in the first tenth of the epoch's steps.
    pub early_share: f64,
    /// Share of the utterances the whole epoch uses (repeats counted): what the epoch realises.
    /// In `seed` mode every utterance is used once, so it is the corpus share minus what
    /// truncation drops; in `temperature` mode, the target share.
    pub epoch_share: f64,
    /// Uses of the language's most used utterance in the epoch (above 1: upsampled).
    pub max_repeats: u64,
    /// Of the language's utterances, how many the epoch does not use (downsampled, or dropped
    /// by truncation).
    pub unused: u64,
}

/// One source, or one corpus of a training set.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// Source name, or corpus path.
    pub name: String,
    /// Utterances in the input.
    pub utterances: u64,
    /// Hours in the input.
    pub hours: f64,
    /// Share of the input's utterances.
    pub corpus_share: f64,
    /// Share the sampler aims for: each utterance's cell's target share (see `Mix`), spread
    /// evenly over the cell's utterances.
    pub target_share: f64,
    /// Share of the utterances the whole epoch uses (repeats counted).
    pub epoch_share: f64,
    /// Uses of the group's most used utterance in the epoch.
    pub max_repeats: u64,
    /// Of the group's utterances, how many the epoch does not use.
    pub unused: u64,
}

/// The batch with the highest cost.
#[derive(Debug, Clone, Serialize)]
pub struct LargestBatch {
    /// Batch id (position in cost order).
    pub id: u32,
    /// Utterances.
    pub utterances: u64,
    /// Longest utterance, seconds.
    pub longest_seconds: f64,
    /// Total audio, seconds.
    pub seconds: f64,
    /// Padded audio samples (utterances x padded length).
    pub padded_samples: u64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// Sampler mode.
    pub mode: String,
    /// Epoch.
    pub epoch: u64,
    /// Ranks (of the first segment).
    pub world_size: u32,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
    /// Utterances in the input.
    pub utterances: u64,
    /// Hours in the input.
    pub hours: f64,
    /// Batches formed by packing.
    pub batches_formed: u64,
    /// Batches the epoch uses (all ranks).
    pub batches_used: u64,
    /// Optimizer steps in the epoch.
    pub steps: u64,
    /// Utterances in batches dropped by truncation to the world size and accumulation trimming.
    pub dropped_utterances: u64,
    /// Their hours.
    pub dropped_hours: f64,
    /// Per bucket.
    pub buckets: Vec<BucketReport>,
    /// Per language.
    pub languages: Vec<LanguageReport>,
    /// Per source (the input's source names; empty when none were given).
    pub sources: Vec<GroupReport>,
    /// Per corpus of a training set (empty for one corpus).
    pub corpora: Vec<GroupReport>,
    /// Fraction of padded audio samples that are padding.
    pub audio_padding_fraction: f64,
    /// Fraction of padded token slots that are padding (when token counts were given).
    pub token_padding_fraction: Option<f64>,
    /// Mean over steps of (max rank cost / mean rank cost).
    pub imbalance_mean: f64,
    /// Worst step's (max rank cost / mean rank cost).
    pub imbalance_worst: f64,
    /// The step where it happens.
    pub imbalance_worst_step: u64,
    /// The costliest batch.
    pub largest_batch: Option<LargestBatch>,
}

/// Inputs a report needs besides the plan.
#[derive(Debug, Clone, Copy)]
pub struct ReportInput<'a> {
    /// Durations the plan was built from.
    pub durations: Durations<'a>,
    /// Language ids the plan was built from.
    pub languages: &'a [u16],
    /// Code of each language id.
    pub language_names: &'a [String],
    /// Corpora, weights and sources the plan was built with (`Mix::default()`: one corpus).
    pub mix: Mix<'a>,
    /// Name of each source id of `mix.sources` (empty: no source rows).
    pub source_names: &'a [String],
    /// Path of each corpus of `mix` (rows only for more than one).
    pub corpus_names: &'a [String],
    /// Tokens per utterance, if known.
    pub tokens: Option<&'a [u32]>,
    /// Samples per second of the durations, to express padded lengths in samples.
    pub sample_rate: f64,
    /// Padding policy (the training config's `[shape]`).
    pub shape: ShapePolicy,
}

/// Builds the report of `plan` (built from `input`'s arrays and mix with `config`).
pub fn report(
    plan: &EpochPlan,
    config: &SamplerConfig,
    input: &ReportInput<'_>,
) -> Result<PlanReport, PlanError> {
    let d = input.durations;
    let first = plan.segments()[0];
    let steps = plan.steps();
    let w_max = plan.segments().iter().map(|s| s.world_size).max().unwrap_or(1);

    // Which batches the epoch uses, and per-step rank costs.
    let mut used = vec![false; plan.len()];
    let mut imbalance_sum = 0.0;
    let (mut worst, mut worst_step) = (0.0f64, 0u64);
    let early_steps = steps.div_ceil(10);
    let mut early_counts = vec![0u64; 1 << 16];
    let mut early_total = 0u64;
    // Uses of each utterance over the epoch (saturating: a count is only ever compared).
    let mut uses = vec![0u16; input.languages.len()];
    for step in 0..steps {
        let mut costs = Vec::with_capacity(w_max as usize);
        let world = plan.layout_at(step).map_or(0, |s| s.world_size);
        for rank in 0..world {
            let mut c = 0.0;
            for &b in plan.step_batches(step, rank) {
                if b == IDLE {
                    continue;
                }
                used[b as usize] = true;
                c += plan.cost(b);
                for &i in plan.batch(b) {
                    uses[i as usize] = uses[i as usize].saturating_add(1);
                    if step < early_steps {
                        early_counts[input.languages[i as usize] as usize] += 1;
                        early_total += 1;
                    }
                }
            }
            costs.push(c);
        }
        let mean = costs.iter().sum::<f64>() / costs.len().max(1) as f64;
        let max = costs.iter().copied().fold(0.0, f64::max);
        let ratio = if mean > 0.0 { max / mean } else { 1.0 };
        imbalance_sum += ratio;
        if ratio > worst {
            worst = ratio;
            worst_step = step;
        }
    }

    let nb = config.boundaries.len() + 1;
    let mut buckets: Vec<BucketReport> = (0..nb)
        .map(|b| {
            let lo = if b == 0 { 0.0 } else { config.boundaries[b - 1] };
            let hi = config.boundaries.get(b).map_or("inf".to_string(), |h| format!("{h}"));
            BucketReport {
                range: format!("[{lo}, {hi})"),
                batches: 0,
                utterances: 0,
                hours: 0.0,
                mean_batch_size: 0.0,
            }
        })
        .collect();
    let (mut padded_audio, mut real_audio) = (0u64, 0u64);
    let (mut padded_tok, mut real_tok) = (0u64, 0u64);
    let (mut dropped_utts, mut dropped_secs) = (0u64, 0.0f64);
    let mut largest: Option<LargestBatch> = None;
    let to_samples = |s: f64| (s * input.sample_rate).round() as u64;
    for id in 0..plan.len() as u32 {
        let items = plan.batch(id);
        let secs: f64 = items.iter().map(|&i| d.get(i as usize)).sum();
        if !used[id as usize] {
            dropped_utts += items.len() as u64;
            dropped_secs += secs;
            continue;
        }
        let bucket = &mut buckets[plan.bucket(id)];
        bucket.batches += 1;
        bucket.utterances += items.len() as u64;
        bucket.hours += secs / 3600.0;
        let t = input.shape.padded_samples(to_samples(plan.longest(id)), input.sample_rate);
        let padded = t * items.len() as u64;
        padded_audio += padded;
        real_audio += items.iter().map(|&i| to_samples(d.get(i as usize))).sum::<u64>();
        if let Some(tokens) = input.tokens {
            let u = items.iter().map(|&i| u64::from(tokens[i as usize])).max().unwrap_or(0);
            padded_tok += input.shape.padded_tokens(u) * items.len() as u64;
            real_tok += items.iter().map(|&i| u64::from(tokens[i as usize])).sum::<u64>();
        }
        if largest.as_ref().is_none_or(|l| plan.cost(id) > plan.cost(l.id)) {
            largest = Some(LargestBatch {
                id,
                utterances: items.len() as u64,
                longest_seconds: plan.longest(id),
                seconds: secs,
                padded_samples: padded,
            });
        }
    }
    for b in &mut buckets {
        b.mean_batch_size =
            if b.batches > 0 { b.utterances as f64 / b.batches as f64 } else { 0.0 };
    }

    let (languages, sources, corpora) = shares(input, config, &early_counts, early_total, &uses)?;
    Ok(PlanReport {
        mode: config.mode.name().to_owned(),
        epoch: plan.epoch(),
        world_size: first.world_size,
        grad_accum: first.grad_accum,
        utterances: d.len() as u64,
        // `+ 0.0` turns the empty sum's -0.0 into 0.0.
        hours: (0..d.len()).map(|i| d.get(i)).sum::<f64>() / 3600.0 + 0.0,
        batches_formed: plan.len() as u64,
        batches_used: used.iter().filter(|&&u| u).count() as u64,
        steps,
        dropped_utterances: dropped_utts,
        dropped_hours: dropped_secs / 3600.0,
        buckets,
        languages,
        sources,
        corpora,
        audio_padding_fraction: fraction(padded_audio - real_audio.min(padded_audio), padded_audio),
        token_padding_fraction: input
            .tokens
            .map(|_| fraction(padded_tok - real_tok.min(padded_tok), padded_tok)),
        imbalance_mean: if steps > 0 { imbalance_sum / steps as f64 } else { 1.0 },
        imbalance_worst: worst.max(1.0),
        imbalance_worst_step: worst_step,
        largest_batch: largest,
    })
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Per-group tallies over the input's utterances.
#[derive(Clone, Default)]
struct Tally {
    utterances: u64,
    seconds: f64,
    target: f64,
    epoch: u64,
    max_repeats: u64,
    unused: u64,
}

impl Tally {
    fn add(&mut self, seconds: f64, uses: u64, target: f64) {
        self.utterances += 1;
        self.seconds += seconds;
        self.target += target;
        self.epoch += uses;
        self.max_repeats = self.max_repeats.max(uses);
        self.unused += u64::from(uses == 0);
    }

    fn group(&self, name: String, n: f64, epoch_total: u64) -> GroupReport {
        GroupReport {
            name,
            utterances: self.utterances,
            hours: self.seconds / 3600.0,
            corpus_share: self.utterances as f64 / n,
            target_share: self.target,
            epoch_share: fraction(self.epoch, epoch_total),
            max_repeats: self.max_repeats,
            unused: self.unused,
        }
    }
}

/// The language, source and corpus rows of a report.
type Rows = (Vec<LanguageReport>, Vec<GroupReport>, Vec<GroupReport>);

/// Language, source and corpus rows. A language's target is the sum of its cells' targets (for
/// one corpus: its share after temperature); a source's spreads each cell's target evenly over
/// the cell's utterances.
fn shares(
    input: &ReportInput<'_>,
    config: &SamplerConfig,
    early_counts: &[u64],
    early_total: u64,
    uses: &[u16],
) -> Result<Rows, PlanError> {
    let mix = &input.mix;
    let with_sources = !input.source_names.is_empty() && !mix.sources.is_empty();
    let mut by_language = vec![Tally::default(); 1 << 16];
    let mut by_source = vec![Tally::default(); if with_sources { 1 << 16 } else { 0 }];
    let mut by_corpus = vec![Tally::default(); mix.corpus_ends.len().max(1)];
    let cells = for_each_cell(input.languages, mix, config, |i, cell| {
        let (secs, u) = (input.durations.get(i), u64::from(uses[i]));
        by_language[input.languages[i] as usize].add(secs, u, 0.0);
        by_corpus[cell.corpus as usize].add(secs, u, 0.0);
        if with_sources {
            by_source[mix.sources[i] as usize].add(secs, u, cell.target / cell.utterances as f64);
        }
    })?;
    for c in &cells {
        by_language[c.language as usize].target += c.target;
        by_corpus[c.corpus as usize].target += c.target;
    }
    let epoch_total: u64 = by_language.iter().map(|t| t.epoch).sum();
    let n = input.languages.len() as f64;
    let name =
        |names: &[String], k: usize| names.get(k).cloned().unwrap_or_else(|| format!("#{k}"));
    let mut languages: Vec<LanguageReport> = by_language
        .iter()
        .enumerate()
        .filter(|(_, t)| t.utterances > 0)
        .map(|(l, t)| {
            let g = t.group(name(input.language_names, l), n, epoch_total);
            LanguageReport {
                language: g.name,
                utterances: g.utterances,
                hours: g.hours,
                corpus_share: g.corpus_share,
                target_share: g.target_share,
                early_share: fraction(early_counts[l], early_total),
                epoch_share: g.epoch_share,
                max_repeats: g.max_repeats,
                unused: g.unused,
            }
        })
        .collect();
    languages.sort_by(|a, b| b.utterances.cmp(&a.utterances).then(a.language.cmp(&b.language)));
    let groups = |tallies: &[Tally], names: &[String]| -> Vec<GroupReport> {
        tallies
            .iter()
            .enumerate()
            .filter(|(_, t)| t.utterances > 0)
            .map(|(k, t)| t.group(name(names, k), n, epoch_total))
            .collect()
    };
    let mut sources = groups(&by_source, input.source_names);
    sources.sort_by(|a, b| b.utterances.cmp(&a.utterances).then(a.name.cmp(&b.name)));
    // Corpora in training-set order (their ids are positions).
    let corpora = if by_corpus.len() > 1 {
        let names = input.corpus_names;
        by_corpus.iter().enumerate().map(|(k, t)| t.group(name(names, k), n, epoch_total)).collect()
    } else {
        Vec::new()
    };
    Ok((languages, sources, corpora))
}
