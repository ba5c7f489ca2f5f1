//! The epoch plan: duration buckets, language temperature, weighted random order, greedy packing,
//! cost-sorted dealing to ranks, grad-accumulation trimming and a per-rank shuffle, with exactly
//! the semantics (and, for the same seed, the same batches) of the Python sampler it replaces.
//! On top of that: exact resume, re-dealing the rest of an epoch to a new world size, and a
//! shortest-first curriculum.
//!
//! Two modes. `seed` is the Python sampler: every utterance once per epoch, in an order weighted
//! by language temperature, so the epoch's language mix is the corpus's whatever the
//! temperature. `temperature` (the default) realises the temperature's target shares: each
//! epoch, each language gets a quota of draws in proportion to its target share (the epoch keeps
//! the corpus's utterance count), taken from an endless sequence of permutations of that
//! language's utterances (without replacement until the language is exhausted, then a fresh
//! permutation: a small language is upsampled, a large one is downsampled and its next epoch
//! continues where this one stopped); the draws are then bucketed, packed, cost-sorted, dealt and
//! trimmed exactly as in `seed` mode.
//!
//! Pure computation over plain arrays of (duration, language): no corpus, no tensors.
//!
//! The plan of an epoch is a function of `(config, epoch, segments)`. Segment 0 starts at step 0
//! with the run's world size and gradient accumulation. A resume on another world size at step
//! `k` appends a segment: the batches the previous segment had not yet consumed are dealt again,
//! in cost order, to the new ranks. Every batch of the epoch is then seen exactly once, and the
//! sampler state that reproduces all of it is the list of segments plus the step.

use serde::{Deserialize, Serialize};

use super::pyrandom::PyRandom;
use crate::rng::{cell_seed, quota_key, quota_seed};

/// Duration bucket boundaries of the Python sampler, in seconds.
pub const DEFAULT_BOUNDARIES: [f64; 5] = [3.0, 5.0, 8.0, 12.0, 16.0];
/// Marks an idle micro-batch slot: a rank with nothing to do at that slot after a re-deal.
pub const IDLE: u32 = u32::MAX;

/// How an epoch's utterances are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SamplerMode {
    /// The Python sampler's: every utterance once per epoch, temperature weighting only the
    /// order (same batches as the Python sampler for the same seed).
    Seed,
    /// Per-language quotas from the temperature's target shares, upsampling small languages and
    /// downsampling large ones: the epoch's mix is the target mix.
    #[default]
    Temperature,
}

impl SamplerMode {
    /// The mode a saved config without a `mode` key was made with: the only one there was.
    fn before_modes() -> SamplerMode {
        SamplerMode::Seed
    }

    /// The mode's name, as configs spell it.
    pub fn name(self) -> &'static str {
        match self {
            SamplerMode::Seed => "seed",
            SamplerMode::Temperature => "temperature",
        }
    }
}

/// Everything that shapes an epoch plan except the world size and gradient accumulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// How the epoch's utterances are chosen.
    #[serde(default = "SamplerMode::before_modes")]
    pub mode: SamplerMode,
    /// Bucket boundaries in seconds, ascending; a duration equal to a boundary goes to the higher
    /// bucket (`bisect_right`).
    pub boundaries: Vec<f64>,
    /// Language temperature T: language weight `count^T`; 0 or less gives every language the
    /// same weight.
    pub temperature: f64,
    /// Audio seconds per micro-batch; an utterance longer than this forms its own batch.
    pub max_batch_seconds: f64,
    /// Seed; epoch e draws from `random.Random(seed + e)`.
    pub seed: u64,
    /// For this many optimizer steps at the start of each epoch, each rank takes its shortest
    /// batches first, shortest to longest (0: off, the Python sampler's behaviour).
    pub curriculum_steps: u64,
    /// `temperature` mode only: also give each source its own quota inside each language, the
    /// sources' shares of the language being `(weighted count)^source_temperature`, normalised
    /// (1: in proportion to their size, 0: equal). Unset: a language's quota is split between
    /// the corpora of a training set in proportion to their weighted counts, sources ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_temperature: Option<f64>,
}

impl Default for SamplerConfig {
    fn default() -> SamplerConfig {
        SamplerConfig {
            mode: SamplerMode::default(),
            boundaries: DEFAULT_BOUNDARIES.to_vec(),
            temperature: 0.3,
            max_batch_seconds: 90.0,
            seed: 0,
            curriculum_steps: 0,
            source_temperature: None,
        }
    }
}

/// Why a plan cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// Durations and languages have different lengths.
    #[error("{durations} durations but {languages} languages")]
    LengthMismatch {
        /// Number of durations.
        durations: usize,
        /// Number of languages.
        languages: usize,
    },
    /// An option is out of range.
    #[error("invalid sampler option: {0}")]
    Invalid(String),
    /// A resume state does not fit this plan.
    #[error("cannot resume: {0}")]
    Resume(String),
}

/// Durations, either in seconds or as sample counts at a rate.
#[derive(Debug, Clone, Copy)]
pub enum Durations<'a> {
    /// Seconds per utterance.
    Seconds(&'a [f64]),
    /// Samples per utterance at `rate` samples per second (a corpus's NUM_SAMPLES).
    Samples {
        /// Sample counts.
        samples: &'a [u32],
        /// Samples per second.
        rate: f64,
    },
}

impl Durations<'_> {
    /// Number of utterances.
    pub fn len(&self) -> usize {
        match self {
            Durations::Seconds(s) => s.len(),
            Durations::Samples { samples, .. } => samples.len(),
        }
    }

    /// Whether there is no utterance.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Duration of utterance `i` in seconds.
    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Durations::Seconds(s) => s[i],
            Durations::Samples { samples, rate } => f64::from(samples[i]) / rate,
        }
    }
}

/// What a training set of several corpora adds to the (duration, language) arrays: where each
/// corpus's utterances are, the corpora's weights and every utterance's source. The default is
/// one corpus of weight 1 and one source.
///
/// `temperature` mode draws its quotas per *cell*: the utterances of one language in one corpus
/// (and, with `source_temperature`, from one source). A language's size before temperature is
/// the weighted count of its utterances (weight x count, summed over corpora), and its quota is
/// split between its cells in proportion to their weighted counts (or their power
/// `source_temperature` when sources are split). `seed` mode takes every utterance of every
/// corpus once and accepts neither weights nor per-source quotas.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mix<'a> {
    /// End (exclusive) of each corpus's utterances in the arrays, ascending, the last equal to the
    /// utterance count; empty: one corpus.
    pub corpus_ends: &'a [u32],
    /// Weight of each corpus (> 0, finite); empty: all 1.
    pub weights: &'a [f64],
    /// Source id of each utterance (read only with `source_temperature`); empty: one source.
    pub sources: &'a [u16],
}

impl Mix<'_> {
    fn corpora(&self) -> usize {
        self.corpus_ends.len().max(1)
    }

    fn weight(&self, corpus: usize) -> f64 {
        self.weights.get(corpus).copied().unwrap_or(1.0)
    }
}

/// One quota cell of `temperature` mode (see [`Mix`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Language id.
    pub language: u16,
    /// Corpus of the training set.
    pub corpus: u16,
    /// Source id, when sources are split (`source_temperature`); otherwise 0.
    pub source: u16,
    /// Utterances in the cell.
    pub utterances: u64,
    /// Weight of the cell's corpus.
    pub weight: f64,
    /// The cell's target share of an epoch: its language's share after temperature times the
    /// cell's share of that language.
    pub target: f64,
    /// Draws per epoch (largest remainders: within one draw of `target x utterances`).
    pub quota: u64,
}

/// The cells of a training set, in first-appearance order, and how to find an utterance's cell.
struct CellTable {
    cells: Vec<Cell>,
    /// Dense (corpus, source, language) code -> cell, `u32::MAX` where no utterance falls.
    cell_of_code: Vec<u32>,
    /// Language id -> dense language; `None`: the identity (one corpus, one source).
    dense_language: Option<Vec<u32>>,
    /// Source id -> dense source, when sources are split.
    dense_source: Option<Vec<u32>>,
    n_languages: usize,
    n_sources: usize,
    /// Languages in first-appearance order, each with its cells in first-appearance order.
    by_language: Vec<(u16, Vec<u32>)>,
}

/// At most this many (corpus, source, language) codes: bounds the table's memory (16 MiB).
const MAX_CELL_CODES: usize = 1 << 22;

/// Ids in first-appearance order -> 0, 1, 2, ... (`u32::MAX` for absent ids), and their count.
fn dense_ids(ids: &[u16]) -> (Vec<u32>, usize) {
    let mut map = vec![u32::MAX; 1 << 16];
    let mut n = 0u32;
    for &x in ids {
        if map[x as usize] == u32::MAX {
            map[x as usize] = n;
            n += 1;
        }
    }
    (map, n as usize)
}

impl CellTable {
    /// The cells of `languages` under `mix` (checked by [`check_mix`]), with each cell's target
    /// share and quota for an epoch of `languages.len()` draws.
    fn build(
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
    ) -> Result<CellTable, PlanError> {
        let split = config.source_temperature.is_some() && !mix.sources.is_empty();
        let (dense_source, n_sources) = if split {
            let (map, n) = dense_ids(mix.sources);
            (Some(map), n.max(1))
        } else {
            (None, 1)
        };
        // One corpus and one source: the language id is the code (no remapping pass).
        let (dense_language, n_languages) = if mix.corpora() * n_sources == 1 {
            (None, 1 << 16)
        } else {
            let (map, n) = dense_ids(languages);
            (Some(map), n.max(1))
        };
        let codes = mix.corpora() * n_sources * n_languages;
        if codes > MAX_CELL_CODES {
            return Err(PlanError::Invalid(format!(
                "{} corpora x {n_sources} sources x {n_languages} languages make more than \
                 {MAX_CELL_CODES} quota cells",
                mix.corpora(),
            )));
        }
        let mut t = CellTable {
            cells: Vec::new(),
            cell_of_code: vec![u32::MAX; codes],
            dense_language,
            dense_source,
            n_languages,
            n_sources,
            by_language: Vec::new(),
        };
        for (corpus, range) in corpus_ranges(mix, languages.len()) {
            for i in range {
                let code = t.code(corpus, i, languages, mix);
                let mut cell = t.cell_of_code[code];
                if cell == u32::MAX {
                    cell = t.cells.len() as u32;
                    t.cell_of_code[code] = cell;
                    t.cells.push(Cell {
                        language: languages[i],
                        corpus: corpus as u16,
                        source: if split { mix.sources[i] } else { 0 },
                        utterances: 0,
                        weight: mix.weight(corpus),
                        target: 0.0,
                        quota: 0,
                    });
                }
                t.cells[cell as usize].utterances += 1;
            }
        }
        let mut slot = vec![u32::MAX; 1 << 16];
        for (c, cell) in t.cells.iter().enumerate() {
            let l = cell.language as usize;
            if slot[l] == u32::MAX {
                slot[l] = t.by_language.len() as u32;
                t.by_language.push((cell.language, Vec::new()));
            }
            t.by_language[slot[l] as usize].1.push(c as u32);
        }

        // Languages' shares after temperature, over their weighted counts, summed in
        // first-appearance order (for one corpus: exactly the Python sampler's shares).
        let size = |c: &Cell| c.weight * c.utterances as f64;
        let language_sizes: Vec<f64> = t
            .by_language
            .iter()
            .map(|(_, cells)| cells.iter().map(|&c| size(&t.cells[c as usize])).sum())
            .collect();
        let shares = powered_shares(&language_sizes, config.temperature);
        let total = languages.len() as u64;
        let exact: Vec<f64> = shares.iter().map(|s| s * total as f64).collect();
        let quotas = largest_remainder(&exact, total);
        let within = if split { config.source_temperature.unwrap_or(1.0) } else { 1.0 };
        for (k, (_, cells)) in t.by_language.iter().enumerate() {
            if let [c] = cells[..] {
                let cell = &mut t.cells[c as usize];
                (cell.target, cell.quota) = (shares[k], quotas[k]);
                continue;
            }
            let sizes: Vec<f64> = cells.iter().map(|&c| size(&t.cells[c as usize])).collect();
            let fractions = powered_shares(&sizes, within);
            let exact: Vec<f64> = fractions.iter().map(|f| f * quotas[k] as f64).collect();
            let cell_quotas = largest_remainder(&exact, quotas[k]);
            for ((&c, f), q) in cells.iter().zip(&fractions).zip(cell_quotas) {
                let cell = &mut t.cells[c as usize];
                (cell.target, cell.quota) = (shares[k] * f, q);
            }
        }
        Ok(t)
    }

    /// The dense code of utterance `i`, of corpus `corpus`.
    #[inline]
    fn code(&self, corpus: usize, i: usize, languages: &[u16], mix: &Mix<'_>) -> usize {
        let s = self.dense_source.as_ref().map_or(0, |m| m[mix.sources[i] as usize] as usize);
        let l = languages[i] as usize;
        let l = self.dense_language.as_ref().map_or(l, |m| m[l] as usize);
        (corpus * self.n_sources + s) * self.n_languages + l
    }

    /// Calls `f(utterance, its cell)` for every utterance, in order.
    fn for_each(&self, languages: &[u16], mix: &Mix<'_>, mut f: impl FnMut(usize, u32)) {
        for (corpus, range) in corpus_ranges(mix, languages.len()) {
            for i in range {
                f(i, self.cell_of_code[self.code(corpus, i, languages, mix)]);
            }
        }
    }

    /// Epoch `epoch`'s draws (see [`epoch_draws_mixed`]).
    fn draws(
        &self,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        epoch: u64,
    ) -> Vec<u32> {
        // Utterances of each cell, in index order (a counting sort over the cells).
        let mut start = vec![0usize; self.cells.len() + 1];
        for (c, cell) in self.cells.iter().enumerate() {
            start[c + 1] = start[c] + cell.utterances as usize;
        }
        let mut members = vec![0u32; languages.len()];
        let mut fill = start.clone();
        self.for_each(languages, mix, |i, c| {
            let c = c as usize;
            members[fill[c]] = i as u32;
            fill[c] += 1;
        });
        drop(fill);

        let mut draws = Vec::with_capacity(languages.len());
        let mut keys: Vec<u64> = Vec::new();
        for &c in self.by_language.iter().flat_map(|(_, cells)| cells) {
            let cell = &self.cells[c as usize];
            let members = &members[start[c as usize]..start[c as usize + 1]];
            let (n, q) = (cell.utterances, cell.quota);
            let base = cell_seed(config.seed, cell.corpus, cell.source);
            let (mut pos, end) =
                (epoch.saturating_mul(q), epoch.saturating_add(1).saturating_mul(q));
            while pos < end {
                let cycle = pos / n;
                let from = (pos - cycle * n) as usize;
                let to = (end.min((cycle + 1) * n) - cycle * n) as usize;
                // (key, position) packed in a u64: distinct, and ordered as the permutation is.
                let cycle_seed = quota_seed(base, cell.language, cycle);
                keys.clear();
                keys.extend(
                    (0..members.len() as u64)
                        .map(|k| u64::from(quota_key(cycle_seed, k)) << 32 | k),
                );
                // The permutation's places `from..to`: the `to` smallest keys, less the `from`
                // smallest of those.
                if to < keys.len() {
                    keys.select_nth_unstable(to);
                    keys.truncate(to);
                }
                if from > 0 {
                    keys.select_nth_unstable(from);
                }
                draws.extend(keys[from..].iter().map(|&x| members[(x & 0xFFFF_FFFF) as usize]));
                pos = (cycle + 1) * n;
            }
        }
        draws
    }
}

/// Each corpus of `mix` with its range of utterance indices.
fn corpus_ranges<'a>(
    mix: &'a Mix<'_>,
    n: usize,
) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
    let end = move |c: usize| mix.corpus_ends.get(c).map_or(n, |&e| e as usize);
    (0..mix.corpora()).map(move |c| (c, if c == 0 { 0 } else { end(c - 1) }..end(c)))
}

/// One stretch of an epoch run with one world size and gradient accumulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// First optimizer step of the segment, counted from the start of the epoch.
    pub start_step: u64,
    /// Ranks.
    pub world_size: u32,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
}

/// What a checkpoint stores to resume the sampler exactly: a few numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Epoch.
    pub epoch: u64,
    /// Optimizer steps completed in this epoch.
    pub step: u64,
    /// The epoch's segments so far (at least one).
    pub segments: Vec<Segment>,
}

/// Slot layout of one segment: `world_size` rows of `slots` batch ids (or [`IDLE`]).
#[derive(Debug, Clone)]
struct SegmentPlan {
    seg: Segment,
    slots: usize,
    order: Vec<u32>,
}

impl SegmentPlan {
    fn row(&self, rank: u32) -> &[u32] {
        let r = rank as usize * self.slots;
        &self.order[r..r + self.slots]
    }

    fn steps(&self) -> u64 {
        (self.slots / self.seg.grad_accum as usize) as u64
    }
}

/// The plan of one epoch.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    epoch: u64,
    config: SamplerConfig,
    /// Utterance indices of every batch, grouped by bucket in packing order.
    items: Vec<u32>,
    /// Where batch `id` (its rank in cost-descending order) starts in `items`, and its length.
    start: Vec<u64>,
    size: Vec<u32>,
    /// `len(batch) * longest duration`, descending.
    cost: Vec<f64>,
    /// Longest duration of each batch, seconds.
    longest: Vec<f64>,
    /// Bucket of each batch.
    bucket: Vec<u8>,
    segments: Vec<SegmentPlan>,
}

impl EpochPlan {
    /// Builds epoch `epoch`'s plan for `world_size` ranks accumulating `grad_accum` micro-batches
    /// per optimizer step. Cost: one pass to bucket, one random draw and one `powf` per
    /// utterance, one sort per bucket, one sort of the batches.
    pub fn build(
        durations: Durations<'_>,
        languages: &[u16],
        config: &SamplerConfig,
        epoch: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<EpochPlan, PlanError> {
        let mix = Mix::default();
        EpochPlan::build_mixed(durations, languages, &mix, config, epoch, world_size, grad_accum)
    }

    /// [`EpochPlan::build`] for a training set of several corpora (see [`Mix`]): the arrays are
    /// the corpora's, concatenated in order.
    pub fn build_mixed(
        durations: Durations<'_>,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        epoch: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<EpochPlan, PlanError> {
        check(&durations, languages, config, world_size, grad_accum)?;
        check_mix(languages.len(), mix, config)?;
        let mut rng = PyRandom::new(config.seed.wrapping_add(epoch));
        let packed = match config.mode {
            SamplerMode::Seed => {
                let weights = language_weights(languages, config.temperature);
                let weight = |i: usize| weights[languages[i] as usize];
                pack(&durations, None, weight, config, &mut rng)
            }
            SamplerMode::Temperature => {
                let draws =
                    CellTable::build(languages, mix, config)?.draws(languages, mix, config, epoch);
                pack(&durations, Some(draws), |_| 1.0, config, &mut rng)
            }
        };

        // Sort batches by cost, descending; the sort is stable, as Python's is. Batches stay
        // where packing put them: only the small per-batch arrays are reordered.
        let n_batches = packed.start.len();
        let mut by_cost: Vec<(f64, u32)> = (0..n_batches)
            .map(|b| (f64::from(packed.size[b]) * packed.longest[b], b as u32))
            .collect();
        by_cost.sort_by(|a, b| b.0.total_cmp(&a.0));
        let pick = |b: &(f64, u32)| b.1 as usize;
        let start = by_cost.iter().map(|b| packed.start[pick(b)]).collect();
        let size = by_cost.iter().map(|b| packed.size[pick(b)]).collect();
        let longest = by_cost.iter().map(|b| packed.longest[pick(b)]).collect();
        let bucket = by_cost.iter().map(|b| packed.bucket[pick(b)]).collect();
        let cost = by_cost.iter().map(|b| b.0).collect();
        drop(by_cost);

        let mut plan = EpochPlan {
            epoch,
            config: config.clone(),
            items: packed.items,
            start,
            size,
            cost,
            longest,
            bucket,
            segments: Vec::new(),
        };
        let first = plan.deal_first(world_size, grad_accum, &mut rng);
        plan.segments.push(first);
        Ok(plan)
    }

    /// Rebuilds the plan a [`SamplerState`] describes (same input and config as the run that
    /// saved it).
    pub fn restore(
        durations: Durations<'_>,
        languages: &[u16],
        config: &SamplerConfig,
        state: &SamplerState,
    ) -> Result<EpochPlan, PlanError> {
        EpochPlan::restore_mixed(durations, languages, &Mix::default(), config, state)
    }

    /// [`EpochPlan::restore`] for a training set of several corpora.
    pub fn restore_mixed(
        durations: Durations<'_>,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        state: &SamplerState,
    ) -> Result<EpochPlan, PlanError> {
        let first = state.segments.first().ok_or_else(|| PlanError::Resume("no segment".into()))?;
        if first.start_step != 0 {
            return Err(PlanError::Resume("the first segment must start at step 0".into()));
        }
        let mut plan = EpochPlan::build_mixed(
            durations,
            languages,
            mix,
            config,
            state.epoch,
            first.world_size,
            first.grad_accum,
        )?;
        for s in &state.segments[1..] {
            plan.redeal(s.start_step, s.world_size, s.grad_accum)?;
        }
        if state.step > plan.steps() {
            return Err(PlanError::Resume(format!(
                "step {} is past the epoch's {} steps",
                state.step,
                plan.steps()
            )));
        }
        Ok(plan)
    }

    /// The seed's dealing: batches `r, r + W, ...` to rank r, truncated so every rank has the
    /// same count, trimmed to a multiple of the accumulation, one shuffle applied to every rank.
    fn deal_first(&self, world_size: u32, grad_accum: u32, rng: &mut PyRandom) -> SegmentPlan {
        let w = world_size as usize;
        let per_rank = self.len() / w;
        let slots =
            if grad_accum > 1 { per_rank - per_rank % grad_accum as usize } else { per_rank };
        // Every rank's list has the same length and Python shuffles each with the generator in
        // the same state, so one permutation serves all ranks.
        let mut perm: Vec<u32> = (0..slots as u32).collect();
        rng.shuffle(&mut perm);
        let mut order = Vec::with_capacity(w * slots);
        for r in 0..w {
            let start = order.len();
            order.extend(perm.iter().map(|&p| (p as usize * w + r) as u32));
            self.curriculum(&mut order[start..], grad_accum);
        }
        SegmentPlan { seg: Segment { start_step: 0, world_size, grad_accum }, slots, order }
    }

    /// Moves a rank's shortest batches to the front of its list, shortest first, for the
    /// configured number of steps; the other batches keep their shuffled order. Ranks' lists are
    /// interleaved from one cost ranking, so their k-th shortest batches are alike and steps stay
    /// balanced.
    fn curriculum(&self, row: &mut [u32], grad_accum: u32) {
        let n = (self.config.curriculum_steps.saturating_mul(u64::from(grad_accum)) as usize)
            .min(row.len());
        if n == 0 {
            return;
        }
        let mut by_len: Vec<(usize, u32)> = row.iter().copied().enumerate().collect();
        by_len.sort_by(|a, b| {
            self.longest[a.1 as usize].total_cmp(&self.longest[b.1 as usize]).then(a.0.cmp(&b.0))
        });
        let mut chosen = vec![false; row.len()];
        for &(pos, _) in &by_len[..n] {
            chosen[pos] = true;
        }
        let rest: Vec<u32> =
            row.iter().zip(&chosen).filter(|(_, &c)| !c).map(|(&b, _)| b).collect();
        for (slot, &(_, b)) in row.iter_mut().zip(&by_len[..n]) {
            *slot = b;
        }
        row[n..].copy_from_slice(&rest);
    }

    /// Re-deals the rest of the epoch from optimizer step `at_step` to `world_size` ranks
    /// accumulating `grad_accum` micro-batches: every batch the current segment had not consumed
    /// by then is dealt, in cost order, round robin to the new ranks, and one permutation drawn
    /// from `(seed, epoch, at_step)` orders every rank. Ranks left short at the end get [`IDLE`]
    /// slots, so no batch is dropped or repeated.
    pub fn redeal(
        &mut self,
        at_step: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<(), PlanError> {
        if world_size == 0 || grad_accum == 0 {
            return Err(PlanError::Invalid("world size and grad accumulation must be >= 1".into()));
        }
        let last = self.segments.last().ok_or_else(|| PlanError::Resume("no segment".into()))?;
        let end = last.seg.start_step + last.steps();
        if at_step < last.seg.start_step || at_step > end {
            return Err(PlanError::Resume(format!(
                "step {at_step} is outside the current segment (steps {}..={end})",
                last.seg.start_step
            )));
        }
        let consumed = ((at_step - last.seg.start_step) * u64::from(last.seg.grad_accum)) as usize;
        let mut remaining: Vec<u32> = (0..last.seg.world_size)
            .flat_map(|r| last.row(r)[consumed..].iter().copied())
            .filter(|&b| b != IDLE)
            .collect();
        remaining.sort_unstable();
        let w = world_size as usize;
        let per_rank = remaining.len().div_ceil(w);
        let slots = per_rank.div_ceil(grad_accum as usize) * grad_accum as usize;
        let mut perm: Vec<u32> = (0..slots as u32).collect();
        PyRandom::new(crate::rng::redeal_seed(self.config.seed, self.epoch, at_step))
            .shuffle(&mut perm);
        let mut order = Vec::with_capacity(w * slots);
        for r in 0..w {
            order.extend(
                perm.iter().map(|&p| remaining.get(p as usize * w + r).copied().unwrap_or(IDLE)),
            );
        }
        // The current segment now ends at `at_step`. (A re-deal at a segment's first step
        // leaves it with no slots; it stays in the list so the state replays the same calls.)
        if let Some(last) = self.segments.last_mut() {
            let rows: Vec<u32> =
                (0..last.seg.world_size).flat_map(|r| last.row(r)[..consumed].to_vec()).collect();
            last.order = rows;
            last.slots = consumed;
        }
        let seg = Segment { start_step: at_step, world_size, grad_accum };
        self.segments.push(SegmentPlan { seg, slots, order });
        Ok(())
    }

    /// The epoch number.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of batches formed (before truncation and trimming).
    pub fn len(&self) -> usize {
        self.start.len()
    }

    /// Whether no batch was formed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Utterance indices of batch `id` (ids are positions in cost-descending order).
    pub fn batch(&self, id: u32) -> &[u32] {
        let start = self.start[id as usize] as usize;
        &self.items[start..start + self.size[id as usize] as usize]
    }

    /// `len * longest duration` of batch `id`.
    pub fn cost(&self, id: u32) -> f64 {
        self.cost[id as usize]
    }

    /// Longest duration in batch `id`, seconds.
    pub fn longest(&self, id: u32) -> f64 {
        self.longest[id as usize]
    }

    /// Duration bucket of batch `id`.
    pub fn bucket(&self, id: u32) -> usize {
        self.bucket[id as usize] as usize
    }

    /// Optimizer steps in the epoch.
    pub fn steps(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.seg.start_step + s.steps())
    }

    /// The segments so far.
    pub fn segments(&self) -> Vec<Segment> {
        self.segments.iter().map(|s| s.seg).collect()
    }

    /// The state to save after `step` optimizer steps of this epoch.
    pub fn state(&self, step: u64) -> SamplerState {
        SamplerState { epoch: self.epoch, step, segments: self.segments() }
    }

    fn segment_at(&self, step: u64) -> Option<&SegmentPlan> {
        self.segments
            .iter()
            .rev()
            .find(|s| s.seg.start_step <= step && step < s.seg.start_step + s.steps())
    }

    /// World size and accumulation in force at `step`, or `None` past the end of the epoch.
    pub fn layout_at(&self, step: u64) -> Option<Segment> {
        self.segment_at(step).map(|s| s.seg)
    }

    /// Batch ids rank `rank` runs at optimizer step `step`: `grad_accum` entries, [`IDLE`] for
    /// an idle slot. Empty past the end of the epoch or for a rank outside the world.
    pub fn step_batches(&self, step: u64, rank: u32) -> &[u32] {
        match self.segment_at(step) {
            Some(s) if rank < s.seg.world_size => {
                let g = s.seg.grad_accum as usize;
                let k = (step - s.seg.start_step) as usize;
                &s.row(rank)[k * g..(k + 1) * g]
            }
            _ => &[],
        }
    }

    /// Every batch id rank `rank` runs from step `from` to the end of the epoch, in order.
    pub fn rank_batches(&self, rank: u32, from: u64) -> Vec<u32> {
        (from..self.steps()).flat_map(|s| self.step_batches(s, rank).to_vec()).collect()
    }
}

fn check(
    durations: &Durations<'_>,
    languages: &[u16],
    config: &SamplerConfig,
    world_size: u32,
    grad_accum: u32,
) -> Result<(), PlanError> {
    if durations.len() != languages.len() {
        return Err(PlanError::LengthMismatch {
            durations: durations.len(),
            languages: languages.len(),
        });
    }
    if durations.len() > u32::MAX as usize - 1 {
        return Err(PlanError::Invalid("more than 2^32 - 2 utterances".into()));
    }
    if world_size == 0 || grad_accum == 0 {
        return Err(PlanError::Invalid("world size and grad accumulation must be >= 1".into()));
    }
    if config.max_batch_seconds.is_nan() || config.max_batch_seconds <= 0.0 {
        return Err(PlanError::Invalid(format!(
            "max batch seconds {} must be > 0",
            config.max_batch_seconds
        )));
    }
    if config.boundaries.len() > 254
        || config
            .boundaries
            .windows(2)
            .any(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less))
        || config.boundaries.iter().any(|b| !b.is_finite())
    {
        return Err(PlanError::Invalid(
            "bucket boundaries must be strictly ascending (at most 254)".into(),
        ));
    }
    if !config.temperature.is_finite() {
        return Err(PlanError::Invalid("temperature must be finite".into()));
    }
    Ok(())
}

/// Builds the quota cells of a training set and calls `f(utterance, its cell)` for every
/// utterance in order; returns the cells (see [`quota_cells`]).
pub(crate) fn for_each_cell(
    languages: &[u16],
    mix: &Mix<'_>,
    config: &SamplerConfig,
    mut f: impl FnMut(usize, &Cell),
) -> Result<Vec<Cell>, PlanError> {
    check_mix(languages.len(), mix, config)?;
    let t = CellTable::build(languages, mix, config)?;
    t.for_each(languages, mix, |i, c| f(i, &t.cells[c as usize]));
    Ok(t.cells)
}

/// Checks that `mix` describes `n` utterances and fits the mode.
fn check_mix(n: usize, mix: &Mix<'_>, config: &SamplerConfig) -> Result<(), PlanError> {
    if !mix.corpus_ends.is_empty()
        && (mix.corpus_ends.windows(2).any(|w| w[0] > w[1])
            || mix.corpus_ends.last().map(|&e| e as usize) != Some(n))
    {
        return Err(PlanError::Invalid(format!(
            "corpus ends {:?} do not partition {n} utterances",
            mix.corpus_ends
        )));
    }
    if !mix.weights.is_empty() && mix.weights.len() != mix.corpora() {
        return Err(PlanError::Invalid(format!(
            "{} weights for {} corpora",
            mix.weights.len(),
            mix.corpora()
        )));
    }
    if let Some((c, w)) =
        mix.weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0))
    {
        return Err(PlanError::Invalid(format!("corpus {c}'s weight {w} must be > 0 and finite")));
    }
    if !mix.sources.is_empty() && mix.sources.len() != n {
        return Err(PlanError::Invalid(format!(
            "{} source ids for {n} utterances (one per utterance expected)",
            mix.sources.len()
        )));
    }
    if config.source_temperature.is_some_and(|t| !t.is_finite()) {
        return Err(PlanError::Invalid("source temperature must be finite".into()));
    }
    if config.mode == SamplerMode::Seed {
        if mix.weights.iter().any(|&w| w != 1.0) {
            return Err(PlanError::Invalid(
                "corpus weights need sampler mode \"temperature\" (seed mode uses every \
                 utterance once per epoch)"
                    .into(),
            ));
        }
        if config.source_temperature.is_some() {
            return Err(PlanError::Invalid(
                "per-source quotas (source_temperature) need sampler mode \"temperature\"".into(),
            ));
        }
    }
    Ok(())
}

/// Target share of each language id after temperature: `count^T` normalised (every present
/// language 1 when `T <= 0`), 0 for absent ids. The sum runs in first-appearance order, as the
/// Python sampler sums its dict, so the shares are bit-identical to its.
pub fn target_shares(languages: &[u16], temperature: f64) -> (Vec<f64>, Vec<u64>) {
    let (counts, order) = language_counts(languages);
    let sizes: Vec<f64> = order.iter().map(|&l| counts[l as usize] as f64).collect();
    let mut shares = vec![0.0; 1 << 16];
    for (&l, s) in order.iter().zip(powered_shares(&sizes, temperature)) {
        shares[l as usize] = s;
    }
    (shares, counts)
}

/// The quota cells of a training set in `temperature` mode: language, corpus, source, size,
/// weight, target share and quota of each (first-appearance order).
pub fn quota_cells(
    languages: &[u16],
    mix: &Mix<'_>,
    config: &SamplerConfig,
) -> Result<Vec<Cell>, PlanError> {
    check_mix(languages.len(), mix, config)?;
    Ok(CellTable::build(languages, mix, config)?.cells)
}

/// Utterances per language id, and the ids present in first-appearance order.
fn language_counts(languages: &[u16]) -> (Vec<u64>, Vec<u16>) {
    let mut counts = vec![0u64; 1 << 16];
    let mut order: Vec<u16> = Vec::new();
    for &l in languages {
        if counts[l as usize] == 0 {
            order.push(l);
        }
        counts[l as usize] += 1;
    }
    (counts, order)
}

/// `size^T` normalised (every entry the same when `T <= 0`), summed in order.
fn powered_shares(sizes: &[f64], temperature: f64) -> Vec<f64> {
    let w = |s: f64| if temperature <= 0.0 { 1.0 } else { s.powf(temperature) };
    let ws: f64 = sizes.iter().map(|&s| w(s)).sum();
    sizes.iter().map(|&s| w(s) / ws).collect()
}

/// Per-utterance sampling weight of each language id, as the Python sampler computes it: the
/// language's target share (see [`target_shares`]) divided by its actual share.
pub fn language_weights(languages: &[u16], temperature: f64) -> Vec<f64> {
    let (mut weights, counts) = target_shares(languages, temperature);
    let total = languages.len() as f64;
    for (w, &c) in weights.iter_mut().zip(&counts) {
        if c > 0 {
            *w /= c as f64 / total;
        }
    }
    weights
}

/// Epoch `epoch`'s draws in `temperature` mode: utterance indices, grouped by language (in
/// first-appearance order), as many as the corpus has utterances. Language `l` with `n` utterances
/// gets a quota `q` of the draws in proportion to its target share (largest remainders, so the
/// quotas sum to the utterance count); its draws for epoch `e` are positions `e q .. (e + 1) q`
/// of the concatenation of permutations `0, 1, 2, ...` of its utterances. Permutation `c` orders
/// the language's `k`-th utterance by ([`quota_key`]`(`[`quota_seed`]`(seed, l, c), k)`, `k`);
/// a slice of it is found by selection, not by sorting (the draws' order does not matter: packing
/// orders them). Cost: per permutation the epoch reaches into, one key per utterance of the
/// language and two linear-time selections, all sequential in memory.
pub fn epoch_draws(
    languages: &[u16],
    config: &SamplerConfig,
    epoch: u64,
) -> Result<Vec<u32>, PlanError> {
    epoch_draws_mixed(languages, &Mix::default(), config, epoch)
}

/// [`epoch_draws`] for a training set: the same per cell (one language of one corpus, and of
/// one source with `source_temperature`; see [`Mix`]), a cell's permutations seeded with
/// [`quota_seed`]`(`[`cell_seed`]`(seed, corpus, source), l, c)`; languages in first-appearance
/// order, each with its cells in first-appearance order.
pub fn epoch_draws_mixed(
    languages: &[u16],
    mix: &Mix<'_>,
    config: &SamplerConfig,
    epoch: u64,
) -> Result<Vec<u32>, PlanError> {
    check_mix(languages.len(), mix, config)?;
    Ok(CellTable::build(languages, mix, config)?.draws(languages, mix, config, epoch))
}

/// Largest remainders: `exact` rounded down, the draws left (`total` less their sum) to the
/// largest fractional parts (ties to the earlier entry).
fn largest_remainder(exact: &[f64], total: u64) -> Vec<u64> {
    let mut q: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let left = total.saturating_sub(q.iter().sum());
    let mut by_fraction: Vec<usize> = (0..exact.len()).collect();
    by_fraction.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b))
    });
    for &k in by_fraction.iter().take(left as usize) {
        q[k] += 1;
    }
    q
}

/// Batches in creation order, as packing makes them.
struct Packed {
    /// Utterances grouped by bucket, each bucket in key order.
    items: Vec<u32>,
    /// Start and length of each batch in `items`.
    start: Vec<u64>,
    size: Vec<u32>,
    bucket: Vec<u8>,
    /// Longest duration of each batch.
    longest: Vec<f64>,
}

/// Buckets, orders (by a random key weighted with `weight(utterance)`) and packs every utterance
/// once, or with `draws`, the utterances drawn (an utterance drawn twice is packed twice).
fn pack(
    durations: &Durations<'_>,
    draws: Option<Vec<u32>>,
    weight: impl Fn(usize) -> f64,
    config: &SamplerConfig,
    rng: &mut PyRandom,
) -> Packed {
    let n = draws.as_ref().map_or(durations.len(), Vec::len);
    let id = |k: usize| draws.as_ref().map_or(k as u32, |d| d[k]);
    let nb = config.boundaries.len() + 1;
    let bucket_of = |d: f64| config.boundaries.partition_point(|&b| b <= d);
    // Counting sort of utterances by bucket, draw order kept inside each bucket.
    let mut counts = vec![0usize; nb];
    let mut first_seen: Vec<usize> = Vec::new();
    let mut b_of = Vec::with_capacity(n);
    for k in 0..n {
        let b = bucket_of(durations.get(id(k) as usize));
        if counts[b] == 0 {
            first_seen.push(b);
        }
        counts[b] += 1;
        b_of.push(b as u8);
    }
    let mut start = vec![0usize; nb + 1];
    for b in 0..nb {
        start[b + 1] = start[b] + counts[b];
    }
    let mut items = vec![0u32; n];
    let mut fill = start.clone();
    for (k, &b) in b_of.iter().enumerate() {
        items[fill[b as usize]] = id(k);
        fill[b as usize] += 1;
    }
    drop(b_of);
    // `items` holds the draws now: their list is not needed during the packing's peak.
    drop(draws);

    let mut batch_start = Vec::new();
    let mut batch_size = Vec::new();
    let mut batch_bucket = Vec::new();
    let mut longest = Vec::new();
    let mut keyed: Vec<u128> = Vec::new();
    // Gather buffer: durations are read in key order a chunk at a time, as independent loads
    // that overlap in the memory system (loads interleaved with the packing decisions would not).
    const CHUNK: usize = 4096;
    let mut ds = [0f64; CHUNK];
    // Buckets in first-appearance order: Python iterates a dict filled in index order.
    for &b in &first_seen {
        let region = start[b]..start[b + 1];
        keyed.clear();
        keyed.reserve(region.len());
        for &i in &items[region.clone()] {
            let w = weight(i as usize).max(1e-12);
            let key = rng.random().powf(1.0 / w);
            // Non-negative floats order like their bit patterns; (key, index) descending is
            // Python's `sort(reverse=True)` on (key, index) tuples.
            keyed.push((u128::from(key.to_bits()) << 32) | u128::from(i));
        }
        keyed.sort_unstable_by(|a, b| b.cmp(a));
        // The bucket's region of `items` is rewritten in key order, batch after batch.
        let mut pos = region.start;
        let mut open_at = pos;
        let mut batch_seconds = 0.0f64;
        let mut batch_longest = f64::MIN;
        for chunk in keyed.chunks(CHUNK) {
            for (d, &k) in ds.iter_mut().zip(chunk) {
                *d = durations.get(k as u32 as usize);
            }
            for (&k, &d) in chunk.iter().zip(&ds) {
                if batch_seconds + d > config.max_batch_seconds && pos > open_at {
                    batch_start.push(open_at as u64);
                    batch_size.push((pos - open_at) as u32);
                    batch_bucket.push(b as u8);
                    longest.push(batch_longest);
                    open_at = pos;
                    batch_seconds = 0.0;
                    batch_longest = f64::MIN;
                }
                items[pos] = k as u32;
                pos += 1;
                batch_seconds += d;
                batch_longest = batch_longest.max(d);
            }
        }
        if pos > open_at {
            batch_start.push(open_at as u64);
            batch_size.push((pos - open_at) as u32);
            batch_bucket.push(b as u8);
            longest.push(batch_longest);
        }
    }
    Packed { items, start: batch_start, size: batch_size, bucket: batch_bucket, longest }
}
