//! NeMo `.nemo` models in and out: `asrt import`, `asrt train --init`, `asrt export`.
//!
//! An import reads the archive ([`asr_nemo::Archive`]), maps `model_config.yaml` to our
//! [`ModelConfig`] ([`config::read`]), reads the state dict with Burn's PyTorch reader and sets
//! every parameter through one table of keys ([`weights::entries`]), and writes an *imported
//! model directory*:
//!
//! ```text
//! DIR/model.mpk          the weights (Burn's named MessagePack, as checkpoints keep them)
//! DIR/nemo.json          ModelInfo: model and loss configuration, vocabulary, tokenizer hash,
//!                        the source file and what was ignored
//! DIR/tokenizer.model    the SentencePiece model from the archive
//! DIR/model_config.yaml  the archive's configuration, as it was
//! ```
//!
//! Written under a temporary name and renamed: a failed import leaves nothing. Export writes a
//! `.nemo` for NeMo's `EncDecRNNTBPEModel` from a checkpoint or an imported directory.

pub mod config;
pub mod torch_file;
pub mod weights;

use std::path::{Path, PathBuf};

use asr_nemo::Archive;
use burn::module::Module;
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use serde::{Deserialize, Serialize};

use crate::model::{ModelConfig, TdtModel};
use crate::tokenizer::Pieces;
use asr_tdt::TdtOptions;

pub use weights::{LoadOptions, WeightReport};

/// Why a model could not be imported or exported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The archive or its configuration.
    #[error(transparent)]
    Nemo(#[from] asr_nemo::NemoError),
    /// The state dict could not be read.
    #[error("{file}: the state dict could not be read: {detail}")]
    StateDict {
        /// Where it came from.
        file: String,
        /// The reader's message.
        detail: String,
    },
    /// A tensor the model needs is not in the state dict.
    #[error("state dict: no key {key:?} (expected shape {shape:?})")]
    MissingKey {
        /// The key.
        key: String,
        /// The shape it should have.
        shape: Vec<usize>,
    },
    /// A tensor has another shape than the configuration implies.
    #[error("state dict: {key:?} has shape {found:?}, the configuration implies {expected:?}")]
    Shape {
        /// The key.
        key: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// Keys with no meaning for this model.
    #[error(
        "state dict: {} key(s) map to no parameter of this model: {} (pass --allow-unmapped to \
         import anyway)",
        keys.len(),
        keys.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
    )]
    Unmapped {
        /// The keys.
        keys: Vec<String>,
    },
    /// A preprocessor constant differs from the one this front end computes.
    #[error("state dict: {key}: {detail}")]
    Constant {
        /// The key.
        key: String,
        /// What differs.
        detail: String,
    },
    /// The tokenizer is unusable.
    #[error("{file}: tokenizer: {detail}")]
    Tokenizer {
        /// Where it came from.
        file: String,
        /// What is wrong.
        detail: String,
    },
    /// A file-system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Burn could not write or read the weights record.
    #[error("{}: {detail}", path.display())]
    Record {
        /// The record.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// Our parameter table and model disagree (a bug).
    #[error("internal: {0}")]
    Internal(String),
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ImportError + 'a {
    move |source| ImportError::Io { action, path: path.to_owned(), source }
}

/// What an imported model directory records besides the weights (`nemo.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The model.
    pub model: ModelConfig,
    /// The loss options of the source configuration.
    pub loss: TdtOptions,
    /// Vocabulary size.
    pub vocab: usize,
    /// xxh3-64 of the tokenizer model, as corpora record it (`tokenizer.model_xxh3`).
    pub tokenizer_xxh3: String,
    /// The `.nemo` it came from.
    pub source: String,
    /// The source's model class.
    pub class: String,
    /// What was not imported, and why.
    pub ignored: Vec<String>,
}

/// The hash corpora keep of their tokenizer model.
pub fn tokenizer_hash(model: &[u8]) -> String {
    asr_corpus::meta::hash_hex(xxhash_rust::xxh3::xxh3_64(model))
}

/// A model read from a `.nemo`.
pub struct Imported<B: Backend> {
    /// The weights.
    pub model: TdtModel<B>,
    /// Configuration and provenance.
    pub info: ModelInfo,
    /// The tokenizer's SentencePiece model.
    pub tokenizer: Vec<u8>,
    /// The archive's configuration text.
    pub config_text: String,
    /// What loading the weights did.
    pub report: WeightReport,
}

/// Reads a `.nemo` into a model on `device`.
pub fn import<B: Backend>(
    path: &Path,
    allow_unmapped: bool,
    device: &B::Device,
) -> Result<Imported<B>, ImportError> {
    let archive = Archive::open(path)?;
    let (info, cfg) = archive_info(&archive)?;
    let sd = weights::read_archive_state_dict(&archive)?;
    let model = TdtModel::<B>::new(&info.model, info.vocab, 0, device);
    let opts = LoadOptions { ignore_prefixes: cfg.ignored_prefixes, allow_unmapped };
    let (model, report) = weights::load(model, &info.model, info.vocab, &sd, &opts)?;
    let tokenizer = archive.tokenizer_model()?.to_vec();
    Ok(Imported { model, info, tokenizer, config_text: archive.config_text().to_owned(), report })
}

/// What an opened archive's configuration and tokenizer say (no weights read).
fn archive_info(archive: &Archive) -> Result<(ModelInfo, config::NemoConfig), ImportError> {
    let source = archive.path().display().to_string();
    let tokenizer = archive.tokenizer_model()?;
    let pieces = Pieces::parse(tokenizer)
        .map_err(|e| ImportError::Tokenizer { file: source.clone(), detail: e.to_string() })?;
    let cfg = config::read(archive, pieces.len())?;
    let info = ModelInfo {
        model: cfg.model.clone(),
        loss: cfg.loss.clone(),
        vocab: cfg.vocab,
        tokenizer_xxh3: tokenizer_hash(tokenizer),
        source,
        class: cfg.class.clone(),
        ignored: cfg.ignored.clone(),
    };
    Ok((info, cfg))
}

/// An imported directory's `nemo.json`.
fn read_info(dir: &Path) -> Result<ModelInfo, ImportError> {
    let p = dir.join("nemo.json");
    let text = std::fs::read_to_string(&p).map_err(io("reading", &p))?;
    serde_json::from_str(&text)
        .map_err(|e| ImportError::Record { path: p.clone(), detail: e.to_string() })
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// Writes an imported model directory at `dir` (which must not exist), atomically.
pub fn write_dir<B: Backend>(imported: &Imported<B>, dir: &Path) -> Result<(), ImportError> {
    if dir.exists() {
        return Err(ImportError::Io {
            action: "writing into",
            path: dir.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already exists"),
        });
    }
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.with_file_name(format!(".{name}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = (|| {
        std::fs::create_dir_all(&tmp).map_err(io("creating", &tmp))?;
        imported.model.clone().save_file(tmp.join("model"), &recorder()).map_err(|e| {
            ImportError::Record { path: tmp.join("model.mpk"), detail: e.to_string() }
        })?;
        let json = serde_json::to_string_pretty(&imported.info)
            .map_err(|e| ImportError::Internal(e.to_string()))?;
        let p = tmp.join("nemo.json");
        std::fs::write(&p, json + "\n").map_err(io("writing", &p))?;
        let p = tmp.join("tokenizer.model");
        std::fs::write(&p, &imported.tokenizer).map_err(io("writing", &p))?;
        let p = tmp.join("model_config.yaml");
        std::fs::write(&p, &imported.config_text).map_err(io("writing", &p))?;
        std::fs::rename(&tmp, dir).map_err(io("renaming into", dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Whether `path` is an imported model directory.
pub fn is_imported_dir(path: &Path) -> bool {
    path.join("nemo.json").is_file() && path.join("model.mpk").is_file()
}

/// Reads an imported model directory: model, info and tokenizer.
pub fn read_dir<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(TdtModel<B>, ModelInfo, Vec<u8>), ImportError> {
    let info = read_info(dir)?;
    let model = TdtModel::<B>::new(&info.model, info.vocab, 0, device)
        .load_file(dir.join("model"), &recorder(), device)
        .map_err(|e| ImportError::Record { path: dir.join("model.mpk"), detail: e.to_string() })?;
    let p = dir.join("tokenizer.model");
    let tokenizer = std::fs::read(&p).map_err(io("reading", &p))?;
    Ok((model, info, tokenizer))
}

/// The configuration and tokenizer hash of a `.nemo` file or imported directory, without
/// reading the weights.
pub fn describe(path: &Path) -> Result<ModelInfo, ImportError> {
    if path.is_dir() {
        return read_info(path);
    }
    Ok(archive_info(&Archive::open(path)?)?.0)
}

/// NeMo's `vocab.txt` for SentencePiece pieces (a word-initial piece without its `▁`, others
/// prefixed `##`).
fn vocab_txt(pieces: &[String]) -> String {
    pieces
        .iter()
        .map(|p| match p.strip_prefix('\u{2581}') {
            Some(rest) => format!("{rest}\n"),
            None => format!("##{p}\n"),
        })
        .collect()
}

/// Writes `model` as a `.nemo` at `out` (atomically): configuration, state dict, tokenizer.
pub fn export<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    loss: &TdtOptions,
    optim: Option<&config::OptimSettings>,
    tokenizer: &[u8],
    out: &Path,
) -> Result<(), ImportError> {
    let pieces = Pieces::parse(tokenizer).map_err(|e| ImportError::Tokenizer {
        file: out.display().to_string(),
        detail: e.to_string(),
    })?;
    let vocab = pieces.len();
    let texts: Vec<String> = (0..vocab).map(|i| pieces.piece(i).to_owned()).collect();
    let hash = tokenizer_hash(tokenizer);
    let names = config::ArtifactNames {
        tokenizer_model: format!("{hash}_tokenizer.model"),
        vocab_txt: format!("{hash}_vocab.txt"),
        spe_vocab: format!("{hash}_tokenizer.vocab"),
    };
    // SentencePiece's own vocabulary listing: piece, tab, score.
    let spe_vocab: String =
        (0..vocab).map(|i| format!("{}\t{}\n", pieces.piece(i), pieces.score(i))).collect();
    let yaml = config::write(cfg, loss, optim, &texts, &names);
    let sd = weights::state_dict(model, cfg, vocab)?;
    let mut ckpt = std::io::Cursor::new(Vec::new());
    torch_file::write_state_dict(&mut ckpt, "model_weights", &sd)
        .map_err(|e| ImportError::Internal(format!("writing the state dict: {e}")))?;
    let ckpt = ckpt.into_inner();
    let vocab_txt = vocab_txt(&texts);
    asr_nemo::write_archive(
        out,
        &[
            (asr_nemo::CONFIG_MEMBER, yaml.as_bytes()),
            (asr_nemo::WEIGHTS_MEMBER, &ckpt),
            (&names.tokenizer_model, tokenizer),
            (&names.vocab_txt, vocab_txt.as_bytes()),
            (&names.spe_vocab, spe_vocab.as_bytes()),
        ],
    )
    .map_err(io("writing", out))
}
