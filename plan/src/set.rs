//! A training set: one or more corpora read as one. Utterance `g` of the set is utterance `i` of
//! corpus `c`, the corpora taken in the order given (`g` = `i` plus the sizes of the corpora
//! before `c`); the plan, the loader and the model see `g`, metrics and errors name `(c, i)`.
//!
//! The corpora must agree on everything a batch mixes: the tokenizer (its model hash, kind and
//! vocabulary), the sample rate and the format version. Each corpus's language and source
//! tables are merged into the set's, by name (the first corpus's ids are kept), so a language is
//! one language whichever corpus it comes from; a corpus may override every utterance's language
//! or source (`language = "de"`), and carries a sampling weight.

use std::path::{Path, PathBuf};

use asr_corpus::{Corpus, TokenSlice};
use serde::{Deserialize, Serialize};

use super::sampler::{Durations, Mix};

/// One corpus of a training set, as `[[data]]` in a training config gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    /// The corpus file (relative paths in a config file are relative to that file).
    pub path: PathBuf,
    /// Sampling weight: the corpus counts `weight` times its utterances wherever utterance
    /// counts decide shares (`sampler.mode = "temperature"` only).
    #[serde(default = "one")]
    pub weight: f64,
    /// Every utterance of the corpus counts as this language (plan, quotas, metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Every utterance of the corpus counts as from this source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

fn one() -> f64 {
    1.0
}

impl DataSpec {
    /// A corpus of weight 1 with no overrides.
    pub fn new(path: impl Into<PathBuf>) -> DataSpec {
        DataSpec { path: path.into(), weight: 1.0, language: None, source: None }
    }
}

/// What a checkpoint records of each corpus of its training set; a resume must find the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CorpusIdentity {
    /// The path it was opened from (informative: a moved corpus is still the same corpus).
    pub path: PathBuf,
    /// Utterances.
    pub utterances: u64,
    /// Samples of audio in all.
    pub samples: u64,
    /// Sampling weight.
    pub weight: f64,
    /// Language override.
    pub language: Option<String>,
    /// Source override.
    pub source: Option<String>,
}

/// Why a training set cannot be used. Each error names the corpus files concerned.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// No corpus was given.
    #[error(
        "no training corpus: give one or more CORPUS arguments, or a [[data]] list in the \
         training config"
    )]
    Empty,
    /// Corpora given both on the command line and in the config.
    #[error(
        "training corpora given both on the command line ({cli}) and in the config's [[data]] \
         ({config}): give them in one place"
    )]
    TwoLists {
        /// The command line's corpora.
        cli: String,
        /// The config's corpora.
        config: String,
    },
    /// A corpus could not be opened.
    #[error("{}", open_message(path, source))]
    Open {
        /// The corpus.
        path: PathBuf,
        /// Why.
        source: asr_corpus::FormatError,
    },
    /// The same file twice.
    #[error(
        "{} is listed twice in the training set (list it once; `weight` upsamples it)",
        path.display()
    )]
    Duplicate {
        /// The corpus.
        path: PathBuf,
    },
    /// A weight that is not a positive number.
    #[error("{}: weight {weight} must be a positive number", path.display())]
    Weight {
        /// The corpus.
        path: PathBuf,
        /// The weight given.
        weight: f64,
    },
    /// An override that is empty.
    #[error("{}: the {what} override is empty", path.display())]
    EmptyOverride {
        /// The corpus.
        path: PathBuf,
        /// "language" or "source".
        what: &'static str,
    },
    /// A corpus without a tokenizer.
    #[error("{}: the corpus has no tokenizer vocabulary (compile it with --tokenizer)", path.display())]
    NoTokenizer {
        /// The corpus.
        path: PathBuf,
    },
    /// Two corpora tokenized with different models.
    #[error(
        "{} and {} were tokenized with different models ({first_tokenizer} and \
         {other_tokenizer}); one training set needs one tokenizer (`asrc retokenize` rewrites a \
         corpus's tokens with another model)",
        first.display(),
        other.display()
    )]
    Tokenizer {
        /// The first corpus.
        first: PathBuf,
        /// Its tokenizer (kind, vocabulary, model hash).
        first_tokenizer: String,
        /// The corpus that differs.
        other: PathBuf,
        /// Its tokenizer.
        other_tokenizer: String,
    },
    /// Two corpora with different sample rates.
    #[error(
        "{} is {first_rate} Hz but {} is {other_rate} Hz; one training set needs one sample rate",
        first.display(),
        other.display()
    )]
    SampleRate {
        /// The first corpus.
        first: PathBuf,
        /// Its rate.
        first_rate: u32,
        /// The corpus that differs.
        other: PathBuf,
        /// Its rate.
        other_rate: u32,
    },
    /// Two corpora of different format versions.
    #[error(
        "{} is corpus format version {first_version} but {} is version {other_version}; \
         recompile one so that both have the same",
        first.display(),
        other.display()
    )]
    FormatVersion {
        /// The first corpus.
        first: PathBuf,
        /// Its version.
        first_version: u32,
        /// The corpus that differs.
        other: PathBuf,
        /// Its version.
        other_version: u32,
    },
    /// More names of one table than a 16-bit id can name.
    #[error("the training set has more than 65536 {what} names")]
    TooManyNames {
        /// "language" or "source".
        what: &'static str,
    },
    /// More corpora than a 16-bit id can name.
    #[error("{count} corpora in one training set (at most {max})", max = u16::MAX)]
    TooManyCorpora {
        /// Corpora given.
        count: usize,
    },
    /// More utterances than a plan's `u32` indices can name (two values are reserved).
    #[error("{count} utterances in the training set (at most {max})", max = u32::MAX - 1)]
    TooManyUtterances {
        /// Utterances in all corpora.
        count: usize,
    },
}

/// An open error that names the corpus once (I/O errors name it themselves).
pub fn open_message(path: &Path, e: &asr_corpus::FormatError) -> String {
    match e {
        asr_corpus::FormatError::Io { .. } => e.to_string(),
        _ => format!("{}: {e}", path.display()),
    }
}

/// The corpora of a run: those of the command line (weight 1, no overrides) or the config's
/// `[[data]]` list, not both.
pub fn resolve_specs(cli: &[PathBuf], data: &[DataSpec]) -> Result<Vec<DataSpec>, SetError> {
    let list = |paths: &mut dyn Iterator<Item = &PathBuf>| {
        paths.map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    };
    match (cli.is_empty(), data.is_empty()) {
        (true, true) => Err(SetError::Empty),
        (false, false) => Err(SetError::TwoLists {
            cli: list(&mut cli.iter()),
            config: list(&mut data.iter().map(|d| &d.path)),
        }),
        (false, true) => Ok(cli.iter().map(DataSpec::new).collect()),
        (true, false) => Ok(data.to_vec()),
    }
}

/// One open corpus of a set.
#[derive(Debug)]
struct Member {
    spec: DataSpec,
    corpus: Corpus,
}

/// Several corpora read as one (see the module documentation).
#[derive(Debug)]
pub struct TrainingSet {
    members: Vec<Member>,
    /// End (exclusive) of each corpus's utterances in the set.
    ends: Vec<u32>,
    weights: Vec<f64>,
    num_samples: Vec<u32>,
    languages: Vec<u16>,
    sources: Vec<u16>,
    language_names: Vec<String>,
    source_names: Vec<String>,
    corpus_names: Vec<String>,
    sample_rate: u32,
}

/// A name table being merged: names to set ids, first come first numbered.
#[derive(Default)]
struct Names {
    names: Vec<String>,
    ids: std::collections::HashMap<String, u16>,
}

impl Names {
    fn id(&mut self, name: &str, what: &'static str) -> Result<u16, SetError> {
        if let Some(&id) = self.ids.get(name) {
            return Ok(id);
        }
        let id = u16::try_from(self.names.len()).map_err(|_| SetError::TooManyNames { what })?;
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), id);
        Ok(id)
    }
}

/// A corpus's tokenizer as an error message shows it.
fn tokenizer_name(c: &Corpus) -> String {
    let t = &c.metadata().tokenizer;
    format!("{} V={} xxh3 {}", t.kind, t.vocab_size, t.model_xxh3)
}

impl TrainingSet {
    /// Opens the corpora of `specs` and checks they fit together. Nothing is written.
    pub fn open(specs: &[DataSpec]) -> Result<TrainingSet, SetError> {
        if specs.is_empty() {
            return Err(SetError::Empty);
        }
        if specs.len() > usize::from(u16::MAX) {
            return Err(SetError::TooManyCorpora { count: specs.len() });
        }
        let mut seen = std::collections::HashSet::new();
        let mut members: Vec<Member> = Vec::with_capacity(specs.len());
        for spec in specs {
            if !(spec.weight.is_finite() && spec.weight > 0.0) {
                return Err(SetError::Weight { path: spec.path.clone(), weight: spec.weight });
            }
            for (what, o) in [("language", &spec.language), ("source", &spec.source)] {
                if o.as_deref().is_some_and(|s| s.trim().is_empty()) {
                    return Err(SetError::EmptyOverride { path: spec.path.clone(), what });
                }
            }
            // The same file under two names (a symlink, `./a` and `a`) is still listed twice.
            let key = std::fs::canonicalize(&spec.path).unwrap_or_else(|_| spec.path.clone());
            if !seen.insert(key) {
                return Err(SetError::Duplicate { path: spec.path.clone() });
            }
            let corpus = Corpus::open(&spec.path)
                .map_err(|source| SetError::Open { path: spec.path.clone(), source })?;
            if corpus.metadata().tokenizer.vocab_size == 0 {
                return Err(SetError::NoTokenizer { path: spec.path.clone() });
            }
            if let Some(first) = members.first() {
                let (a, b) = (&first.corpus, &corpus);
                let (ta, tb) = (&a.metadata().tokenizer, &b.metadata().tokenizer);
                if (&ta.model_xxh3, &ta.kind, ta.vocab_size)
                    != (&tb.model_xxh3, &tb.kind, tb.vocab_size)
                {
                    return Err(SetError::Tokenizer {
                        first: first.spec.path.clone(),
                        first_tokenizer: tokenizer_name(a),
                        other: spec.path.clone(),
                        other_tokenizer: tokenizer_name(b),
                    });
                }
                if a.header().format_version != b.header().format_version {
                    return Err(SetError::FormatVersion {
                        first: first.spec.path.clone(),
                        first_version: a.header().format_version,
                        other: spec.path.clone(),
                        other_version: b.header().format_version,
                    });
                }
                if a.header().sample_rate != b.header().sample_rate {
                    return Err(SetError::SampleRate {
                        first: first.spec.path.clone(),
                        first_rate: a.header().sample_rate,
                        other: spec.path.clone(),
                        other_rate: b.header().sample_rate,
                    });
                }
            }
            members.push(Member { spec: spec.clone(), corpus });
        }
        let total: usize = members.iter().map(|m| m.corpus.len()).sum();
        if total > u32::MAX as usize - 1 {
            return Err(SetError::TooManyUtterances { count: total });
        }

        let (mut languages, mut sources) = (Names::default(), Names::default());
        let mut set = TrainingSet {
            ends: Vec::with_capacity(members.len()),
            weights: members.iter().map(|m| m.spec.weight).collect(),
            num_samples: Vec::with_capacity(total),
            languages: Vec::with_capacity(total),
            sources: Vec::with_capacity(total),
            language_names: Vec::new(),
            source_names: Vec::new(),
            corpus_names: members.iter().map(|m| m.spec.path.display().to_string()).collect(),
            sample_rate: members[0].corpus.header().sample_rate,
            members: Vec::new(),
        };
        for m in &members {
            let c = &m.corpus;
            set.num_samples.extend_from_slice(c.num_samples());
            // Each table maps the corpus's ids to the set's; an override maps them all to one.
            let table = |names: &mut Names,
                         own: &[String],
                         over: &Option<String>,
                         what: &'static str|
             -> Result<Vec<u16>, SetError> {
                match over {
                    Some(name) => Ok(vec![names.id(name, what)?; own.len().max(1)]),
                    None => own.iter().map(|n| names.id(n, what)).collect(),
                }
            };
            let lang =
                table(&mut languages, &c.metadata().languages, &m.spec.language, "language")?;
            let src = table(&mut sources, &c.metadata().sources, &m.spec.source, "source")?;
            // `Corpus::open` checked every id against its table (rule R11), so the lookups hold;
            // an override applies to every utterance whatever its id.
            let pick =
                |map: &[u16], id: u16| map.get(id as usize).or(map.first()).copied().unwrap_or(0);
            set.languages.extend(c.languages().iter().map(|&l| pick(&lang, l)));
            set.sources.extend(c.sources().iter().map(|&s| pick(&src, s)));
            set.ends.push(set.num_samples.len() as u32);
        }
        set.language_names = languages.names;
        set.source_names = sources.names;
        set.members = members;
        Ok(set)
    }

    /// Utterances in all.
    pub fn len(&self) -> usize {
        self.num_samples.len()
    }

    /// Whether there is no utterance.
    pub fn is_empty(&self) -> bool {
        self.num_samples.is_empty()
    }

    /// Number of corpora.
    pub fn corpora(&self) -> usize {
        self.members.len()
    }

    /// Corpus `c`.
    pub fn corpus(&self, c: usize) -> &Corpus {
        &self.members[c].corpus
    }

    /// Corpus `c`'s entry as given.
    pub fn spec(&self, c: usize) -> &DataSpec {
        &self.members[c].spec
    }

    /// The corpora's paths, as given.
    pub fn corpus_names(&self) -> &[String] {
        &self.corpus_names
    }

    /// (corpus, index in that corpus) of utterance `g` of the set.
    #[inline]
    pub fn locate(&self, g: u32) -> (u32, u32) {
        let c = self.ends.partition_point(|&e| e <= g);
        let start = if c == 0 { 0 } else { self.ends[c - 1] };
        (c as u32, g - start)
    }

    /// The set's index of utterance `i` of corpus `c` (the inverse of [`TrainingSet::locate`]).
    pub fn global(&self, c: u32, i: u32) -> u32 {
        let start = if c == 0 { 0 } else { self.ends[c as usize - 1] };
        start + i
    }

    /// Samples of every utterance.
    pub fn num_samples(&self) -> &[u32] {
        &self.num_samples
    }

    /// Set language id of every utterance (overrides applied).
    pub fn languages(&self) -> &[u16] {
        &self.languages
    }

    /// Set source id of every utterance (overrides applied).
    pub fn sources(&self) -> &[u16] {
        &self.sources
    }

    /// Language codes of the set's language ids.
    pub fn language_names(&self) -> &[String] {
        &self.language_names
    }

    /// Source names of the set's source ids.
    pub fn source_names(&self) -> &[String] {
        &self.source_names
    }

    /// Samples per second (the same in every corpus).
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Utterance durations, for the plan.
    pub fn durations(&self) -> Durations<'_> {
        Durations::Samples { samples: &self.num_samples, rate: f64::from(self.sample_rate) }
    }

    /// Corpus boundaries, weights and sources, for the plan.
    pub fn mix(&self) -> Mix<'_> {
        Mix { corpus_ends: &self.ends, weights: &self.weights, sources: &self.sources }
    }

    /// Tokens of every utterance (the corpora's token counts), for the plan's report.
    pub fn token_counts(&self) -> Vec<u32> {
        self.members
            .iter()
            .flat_map(|m| m.corpus.token_offsets().windows(2).map(|w| (w[1] - w[0]) as u32))
            .collect()
    }

    /// Language code of utterance `g`.
    pub fn language_name(&self, g: u32) -> &str {
        self.language_names.get(self.languages[g as usize] as usize).map_or("", String::as_str)
    }

    /// Segment id of utterance `g`, or `corpus:index` when its text cannot be read.
    pub fn segment_id(&self, g: u32) -> String {
        let (c, i) = self.locate(g);
        self.corpus(c as usize).text(i as usize).map(|t| t.0).unwrap_or_else(|_| format!("{c}:{i}"))
    }

    /// The tokenizer every corpus shares: vocabulary size and model hash.
    pub fn tokenizer(&self) -> (u32, &str) {
        let t = &self.members[0].corpus.metadata().tokenizer;
        (t.vocab_size, &t.model_xxh3)
    }

    /// What a checkpoint records of the set.
    pub fn identity(&self) -> Vec<CorpusIdentity> {
        self.members
            .iter()
            .map(|m| CorpusIdentity {
                path: m.spec.path.clone(),
                utterances: m.corpus.len() as u64,
                samples: m.corpus.header().n_samples,
                weight: m.spec.weight,
                language: m.spec.language.clone(),
                source: m.spec.source.clone(),
            })
            .collect()
    }
}

/// What batch assembly reads of utterances: a corpus, or a training set of several.
pub trait UtteranceSource: Send + Sync {
    /// Samples per second.
    fn sample_rate(&self) -> f64;
    /// 16-bit PCM of utterance `i`.
    fn pcm(&self, i: u32) -> &[i16];
    /// Token ids of utterance `i`.
    fn tokens(&self, i: u32) -> TokenSlice<'_>;
    /// Language id of utterance `i`.
    fn language(&self, i: u32) -> u16;
    /// Tells the kernel the PCM of utterance `i` will be read soon.
    fn prefetch(&self, i: u32);
}

impl UtteranceSource for Corpus {
    fn sample_rate(&self) -> f64 {
        f64::from(self.header().sample_rate)
    }
    fn pcm(&self, i: u32) -> &[i16] {
        Corpus::pcm(self, i as usize)
    }
    fn tokens(&self, i: u32) -> TokenSlice<'_> {
        Corpus::tokens(self, i as usize)
    }
    fn language(&self, i: u32) -> u16 {
        self.languages()[i as usize]
    }
    fn prefetch(&self, i: u32) {
        self.prefetch_pcm(i as usize..i as usize + 1);
    }
}

impl UtteranceSource for TrainingSet {
    fn sample_rate(&self) -> f64 {
        f64::from(self.sample_rate)
    }
    fn pcm(&self, g: u32) -> &[i16] {
        let (c, i) = self.locate(g);
        self.corpus(c as usize).pcm(i as usize)
    }
    fn tokens(&self, g: u32) -> TokenSlice<'_> {
        let (c, i) = self.locate(g);
        self.corpus(c as usize).tokens(i as usize)
    }
    fn language(&self, g: u32) -> u16 {
        self.languages[g as usize]
    }
    fn prefetch(&self, g: u32) {
        let (c, i) = self.locate(g);
        self.corpus(c as usize).prefetch_pcm(i as usize..i as usize + 1);
    }
}
