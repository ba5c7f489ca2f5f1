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
//!
//! The parts: `cells` (quota cells, target shares and each epoch's draws), `pack` (bucketing,
//! weighted order and greedy packing), `plan` (the epoch plan: dealing, trimming, shuffling,
//! re-dealing, resume); here the options, the inputs and their checks.

mod cells;
mod pack;
mod plan;

use serde::{Deserialize, Serialize};

use cells::CellTable;
pub use cells::{
    epoch_draws, epoch_draws_mixed, language_weights, quota_cells, target_shares, Cell,
};
pub use plan::{EpochPlan, SamplerState, Segment};

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
    /// More utterances than a plan's `u32` indices can name (two values are reserved).
    #[error("{0} utterances: a plan holds at most 2^32 - 2")]
    TooManyUtterances(usize),
    /// The world size or the gradient accumulation is 0.
    #[error("world size {world_size} and grad accumulation {grad_accum} must both be >= 1")]
    ZeroWorld {
        /// Ranks.
        world_size: u32,
        /// Micro-batches per rank and step.
        grad_accum: u32,
    },
    /// `max_batch_seconds` is not a positive number.
    #[error("invalid sampler option: max batch seconds {0} must be > 0")]
    MaxBatchSeconds(f64),
    /// The bucket boundaries are not finite and strictly ascending, or more than 254.
    #[error("invalid sampler option: bucket boundaries {0:?} must be finite and strictly ascending (at most 254)")]
    Boundaries(Vec<f64>),
    /// The language temperature is infinite or NaN.
    #[error("invalid sampler option: temperature {0} must be finite")]
    Temperature(f64),
    /// The source temperature is infinite or NaN.
    #[error("invalid sampler option: source temperature {0} must be finite")]
    SourceTemperature(f64),
    /// Corpora x sources x languages exceed the quota cells a plan can code.
    #[error(
        "{corpora} corpora x {sources} sources x {languages} languages make more than {max} quota cells"
    )]
    TooManyCells {
        /// Corpora in the mix.
        corpora: usize,
        /// Sources (1 when sources are not balanced).
        sources: usize,
        /// Languages.
        languages: usize,
        /// The most cells a plan can code.
        max: usize,
    },
    /// The mix's corpus boundaries do not partition the utterances.
    #[error("corpus ends {ends:?} do not partition {utterances} utterances")]
    CorpusEnds {
        /// The exclusive end of each corpus.
        ends: Vec<u32>,
        /// Utterances in the arrays.
        utterances: usize,
    },
    /// The mix has a weight count other than its corpus count.
    #[error("{weights} weights for {corpora} corpora")]
    WeightCount {
        /// Weights given.
        weights: usize,
        /// Corpora in the mix.
        corpora: usize,
    },
    /// A corpus weight is not a positive finite number.
    #[error("corpus {corpus}'s weight {weight} must be > 0 and finite")]
    CorpusWeight {
        /// The corpus's position in the mix.
        corpus: usize,
        /// Its weight.
        weight: f64,
    },
    /// The mix has a source id count other than the utterance count.
    #[error("{sources} source ids for {utterances} utterances (one per utterance expected)")]
    SourceCount {
        /// Source ids given.
        sources: usize,
        /// Utterances in the arrays.
        utterances: usize,
    },
    /// Corpus weights other than 1 in seed mode, which uses every utterance once.
    #[error(
        "corpus weights need sampler mode \"temperature\" (seed mode uses every utterance once \
         per epoch)"
    )]
    WeightsNeedTemperature,
    /// Per-source quotas in seed mode.
    #[error("per-source quotas (source_temperature) need sampler mode \"temperature\"")]
    SourceQuotasNeedTemperature,
    /// A resume state without any segment.
    #[error("cannot resume: the sampler state has no segment")]
    NoSegment,
    /// A resume state whose first segment does not start the epoch.
    #[error("cannot resume: the first segment starts at step {0}, not 0")]
    FirstSegmentStart(u64),
    /// A resume step past the epoch's end.
    #[error("cannot resume: step {step} is past the epoch's {steps} steps")]
    StepPastEpoch {
        /// The saved step.
        step: u64,
        /// Steps in the epoch.
        steps: u64,
    },
    /// A re-deal at a step outside the current segment.
    #[error("cannot resume: step {step} is outside the current segment (steps {start}..={end})")]
    StepOutsideSegment {
        /// The step asked for.
        step: u64,
        /// The segment's first step.
        start: u64,
        /// Its end.
        end: u64,
    },
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
        return Err(PlanError::TooManyUtterances(durations.len()));
    }
    if world_size == 0 || grad_accum == 0 {
        return Err(PlanError::ZeroWorld { world_size, grad_accum });
    }
    if config.max_batch_seconds.is_nan() || config.max_batch_seconds <= 0.0 {
        return Err(PlanError::MaxBatchSeconds(config.max_batch_seconds));
    }
    if config.boundaries.len() > 254
        || config
            .boundaries
            .windows(2)
            .any(|w| w[0].partial_cmp(&w[1]) != Some(std::cmp::Ordering::Less))
        || config.boundaries.iter().any(|b| !b.is_finite())
    {
        return Err(PlanError::Boundaries(config.boundaries.clone()));
    }
    if !config.temperature.is_finite() {
        return Err(PlanError::Temperature(config.temperature));
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
        return Err(PlanError::CorpusEnds { ends: mix.corpus_ends.to_vec(), utterances: n });
    }
    if !mix.weights.is_empty() && mix.weights.len() != mix.corpora() {
        return Err(PlanError::WeightCount { weights: mix.weights.len(), corpora: mix.corpora() });
    }
    if let Some((c, w)) =
        mix.weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0))
    {
        return Err(PlanError::CorpusWeight { corpus: c, weight: *w });
    }
    if !mix.sources.is_empty() && mix.sources.len() != n {
        return Err(PlanError::SourceCount { sources: mix.sources.len(), utterances: n });
    }
    if let Some(t) = config.source_temperature.filter(|t| !t.is_finite()) {
        return Err(PlanError::SourceTemperature(t));
    }
    if config.mode == SamplerMode::Seed {
        if mix.weights.iter().any(|&w| w != 1.0) {
            return Err(PlanError::WeightsNeedTemperature);
        }
        if config.source_temperature.is_some() {
            return Err(PlanError::SourceQuotasNeedTemperature);
        }
    }
    Ok(())
}
