//! Where a trained model comes from, decided once: a training checkpoint, a NeMo `.nemo`, or a
//! directory written by `asrt import`. `asrt train --init`, `asrt eval` and `asrt export` (and
//! anything added later) resolve their model argument here, describe it without its weights,
//! and load it through [`ModelSource::load`], which checks the tokenizer the same way for all
//! three kinds: by the hash of its SentencePiece model *and* its size, never by size alone (two
//! tokenizers of one size number their pieces differently).

use std::fmt;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn_store::ModuleSnapshot;

use crate::checkpoint::{self, CheckpointError};
use crate::model::{ModelConfig, TdtModel};
use crate::nemo::config::OptimSettings;
use crate::nemo::{self, ImportError};
use asr_tdt::TdtOptions;

/// A tokenizer as corpora and models record it: the xxh3-64 of its SentencePiece model
/// (`tokenizer.model_xxh3`) and its number of pieces (the blank id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerId {
    /// `tokenizer.model_xxh3`.
    pub xxh3: String,
    /// Pieces (the model's blank id).
    pub vocab: usize,
}

impl TokenizerId {
    /// The tokenizer a corpus was compiled with.
    pub fn of_corpus(corpus: &asr_corpus::Corpus) -> TokenizerId {
        let t = &corpus.metadata().tokenizer;
        TokenizerId { xxh3: t.model_xxh3.clone(), vocab: t.vocab_size as usize }
    }
}

impl fmt::Display for TokenizerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model_xxh3 {}, {} pieces", self.xxh3, self.vocab)
    }
}

/// Whose tokenizer a model's is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The corpus being decoded.
    Corpus,
    /// The training set of a run (`--init`).
    TrainingSet,
    /// A tokenizer given on the command line (`asrt export --tokenizer`) or found for a
    /// checkpoint.
    Given,
}

impl Expected {
    fn noun(self) -> &'static str {
        match self {
            Expected::Corpus => "the corpus's",
            Expected::TrainingSet => "the training set's",
            Expected::Given => "the one given",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Expected::Corpus | Expected::TrainingSet => {
                ": compile with the model's tokenizer (asrc compile --tokenizer MODEL.nemo)"
            }
            Expected::Given => ": give the tokenizer the model was trained with (--tokenizer)",
        }
    }
}

/// The three kinds of model source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A training checkpoint directory (`state.json` + `model.mpk`); a run's output directory
    /// or its `checkpoints/` resolve to the latest one.
    Checkpoint(PathBuf),
    /// A NeMo `.nemo` archive.
    Nemo(PathBuf),
    /// A directory written by `asrt import` (`nemo.json` + `model.mpk`).
    Imported(PathBuf),
}

/// A source's settings, read without its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceInfo {
    /// The model's configuration.
    pub model: ModelConfig,
    /// The loss options it was trained (or configured) with.
    pub loss: TdtOptions,
    /// Its tokenizer.
    pub tokenizer: TokenizerId,
    /// Optimizer steps done, for a checkpoint.
    pub step: Option<u64>,
    /// The optimizer it was trained with, for a checkpoint.
    pub optim: Option<OptimSettings>,
}

/// A checkpoint's settings from its state.
fn from_state(state: crate::checkpoint::TrainState) -> SourceInfo {
    let o = &state.config.optim;
    SourceInfo {
        tokenizer: TokenizerId { xxh3: state.tokenizer_xxh3, vocab: state.vocab },
        optim: Some(OptimSettings {
            lr: o.lr,
            betas: o.betas,
            eps: o.eps,
            weight_decay: o.weight_decay,
        }),
        model: state.config.model,
        loss: state.config.loss,
        step: Some(state.step),
    }
}

/// A loaded model with its settings.
pub struct Loaded<B: Backend> {
    /// The weights.
    pub model: TdtModel<B>,
    /// Its settings.
    pub info: SourceInfo,
    /// The SentencePiece model, where the source carries it (`.nemo`, imported directories;
    /// a checkpoint names its corpora instead).
    pub tokenizer_model: Option<Vec<u8>>,
}

/// Why a model source could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelSourceError {
    /// The path is none of the three kinds.
    #[error(
        "{}: not a model: expected a training checkpoint (or a run directory with one), a \
         .nemo file or a directory written by asrt import",
        path.display()
    )]
    NotAModel {
        /// The path given.
        path: PathBuf,
    },
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The `.nemo` or imported directory could not be read.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The model's tokenizer is not the one the data (or the caller) uses.
    #[error(
        "{}: the model's tokenizer ({model}) is not {} ({expected}){}",
        path.display(),
        what.noun(),
        what.hint()
    )]
    Tokenizer {
        /// The model source.
        path: PathBuf,
        /// The model's tokenizer.
        model: TokenizerId,
        /// The tokenizer expected.
        expected: TokenizerId,
        /// Whose tokenizer is expected.
        what: Expected,
    },
}

impl ModelSource {
    /// Decides what `path` is. A path that is none of the three kinds is refused.
    pub fn resolve(path: &Path) -> Result<ModelSource, ModelSourceError> {
        if nemo::is_imported_dir(path) {
            return Ok(ModelSource::Imported(path.to_owned()));
        }
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("nemo")) {
            return Ok(ModelSource::Nemo(path.to_owned()));
        }
        match checkpoint::resolve(path) {
            Ok(ckpt) => Ok(ModelSource::Checkpoint(ckpt)),
            Err(CheckpointError::NotFound { .. }) => {
                Err(ModelSourceError::NotAModel { path: path.to_owned() })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The path: for a checkpoint, the resolved checkpoint directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Checkpoint(p) | ModelSource::Nemo(p) | ModelSource::Imported(p) => p,
        }
    }

    /// The source's settings, without reading its weights.
    pub fn describe(&self) -> Result<SourceInfo, ModelSourceError> {
        Ok(match self {
            ModelSource::Checkpoint(p) => from_state(checkpoint::load_state(p)?),
            ModelSource::Nemo(p) | ModelSource::Imported(p) => from_model_info(nemo::describe(p)?),
        })
    }

    /// Checks the source's tokenizer against `expected` (hash and size).
    pub fn check_tokenizer(
        &self,
        info: &SourceInfo,
        expected: &TokenizerId,
        what: Expected,
    ) -> Result<(), ModelSourceError> {
        if info.tokenizer != *expected {
            return Err(ModelSourceError::Tokenizer {
                path: self.path().to_owned(),
                model: info.tokenizer.clone(),
                expected: expected.clone(),
                what,
            });
        }
        Ok(())
    }

    /// Loads the model on `device`. With `expected`, the tokenizer is checked first (before
    /// any weight is read). `allow_unmapped` lets a `.nemo`'s unknown state-dict keys through.
    pub fn load<B: Backend>(
        &self,
        expected: Option<(&TokenizerId, Expected)>,
        allow_unmapped: bool,
        device: &B::Device,
    ) -> Result<Loaded<B>, ModelSourceError> {
        if let Some((want, what)) = expected {
            self.check_tokenizer(&self.describe()?, want, what)?;
        }
        Ok(match self {
            ModelSource::Checkpoint(p) => {
                let (model, state) = checkpoint::load_for_inference::<B>(p, device)?;
                Loaded { model, info: from_state(state), tokenizer_model: None }
            }
            ModelSource::Imported(p) => {
                let (model, info, tok) = nemo::read_dir::<B>(p, device)?;
                Loaded { model, info: from_model_info(info), tokenizer_model: Some(tok) }
            }
            ModelSource::Nemo(p) => {
                let i = nemo::import::<B>(p, allow_unmapped, device)?;
                Loaded {
                    model: i.model,
                    info: from_model_info(i.info),
                    tokenizer_model: Some(i.tokenizer),
                }
            }
        })
    }
}

fn from_model_info(i: nemo::ModelInfo) -> SourceInfo {
    SourceInfo {
        tokenizer: TokenizerId { xxh3: i.tokenizer_xxh3, vocab: i.vocab },
        model: i.model,
        loss: i.loss,
        step: None,
        optim: None,
    }
}

/// Initial weights of a run, read once for all its ranks: every tensor's path and values on
/// the host (each rank copies them to its device with [`InitWeights::apply`]).
pub struct InitWeights {
    /// The source's settings.
    pub info: SourceInfo,
    tensors: Vec<(String, TensorData)>,
}

impl InitWeights {
    /// Reads a model source on the CPU, after checking its tokenizer against `expected`.
    pub fn read(
        source: &ModelSource,
        expected: &TokenizerId,
        allow_unmapped: bool,
    ) -> Result<InitWeights, ModelSourceError> {
        let loaded = source.load::<burn::backend::NdArray>(
            Some((expected, Expected::TrainingSet)),
            allow_unmapped,
            &Default::default(),
        )?;
        let tensors = loaded
            .model
            .collect(None, None, false)
            .into_iter()
            .map(|s| {
                let data = s.to_data().map_err(|e| ImportError::Internal(format!("{e:?}")))?;
                Ok((s.full_path(), data))
            })
            .collect::<Result<_, ImportError>>()?;
        Ok(InitWeights { info: loaded.info, tensors })
    }

    /// `model` (of this configuration) with these weights.
    pub fn apply<B: Backend>(&self, model: TdtModel<B>) -> Result<TdtModel<B>, ImportError> {
        nemo::weights::apply_tensors(model, self.tensors.clone())
    }
}
