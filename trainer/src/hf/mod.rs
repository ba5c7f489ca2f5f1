//! The model out to Hugging Face transformers: a directory that transformers 5.x loads with
//! `ParakeetForTDT.from_pretrained(dir)` and `AutoProcessor.from_pretrained(dir)`.
//!
//! Files: `config.json` and `generation_config.json` (`config.rs`), `model.safetensors`
//! (`weights.rs`: NeMo's state dict under transformers' names), `processor_config.json` (the
//! feature extractor), `tokenizer.json` and `tokenizer_config.json` (`tokenizer.rs`). The
//! directory is written beside the target under a temporary name and renamed into place, so a
//! reader never sees half of it.

mod config;
mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};

use burn::prelude::*;

use crate::model::{ModelConfig, TdtModel};
use crate::nemo::ImportError;
use crate::tokenizer::Pieces;

pub use config::check as check_config;

/// Why a model could not be exported for transformers.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// The model has a setting transformers' Parakeet cannot express.
    #[error(
        "transformers' ParakeetForTDT cannot express this model: {setting} is {value}, and \
         transformers assumes {assumes}"
    )]
    Unsupported {
        /// The setting, by its TOML name.
        setting: &'static str,
        /// Its value here.
        value: String,
        /// What transformers' Parakeet assumes.
        assumes: String,
    },
    /// The tokenizer is unusable.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The target exists.
    #[error("{} exists (pass --force to replace it)", path.display())]
    Exists {
        /// The target.
        path: PathBuf,
    },
    /// The weights could not be collected (from the NeMo table that both exports share).
    #[error(transparent)]
    Weights(#[from] ImportError),
    /// The safetensors file could not be written.
    #[error("writing {}: {detail}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The writer's message.
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
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> HfError + 'a {
    move |source| HfError::Io { action, path: path.to_owned(), source }
}

/// The files of an export, in the order they are written.
pub const FILES: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "processor_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "model.safetensors",
];

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exported {
    /// Tensors in `model.safetensors`.
    pub tensors: usize,
}

/// Writes `model` as a transformers model directory at `out` (atomically). An existing `out` is
/// refused unless `force`, and then replaced as a whole.
pub fn export<B: Backend>(
    model: &TdtModel<B>,
    cfg: &ModelConfig,
    tokenizer_model: &[u8],
    out: &Path,
    force: bool,
) -> Result<Exported, HfError> {
    if out.exists() && !force {
        return Err(HfError::Exists { path: out.to_owned() });
    }
    config::check(cfg)?;
    let pieces = Pieces::parse(tokenizer_model).map_err(|e| HfError::Tokenizer(e.to_string()))?;
    let vocab = pieces.len();
    let tok = tokenizer::build(tokenizer_model, &pieces)?;
    let files = config::files(cfg, vocab, &tok);
    let tensors = weights::hf_state_dict(model, cfg, vocab)?;

    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-"))
        .tempdir_in(&parent)
        .map_err(io("creating a temporary directory in", &parent))?;
    let dir = tmp.path();
    let texts =
        [&files.config, &files.generation, &files.processor, &files.tokenizer_config, &tok.json];
    for (file, text) in FILES.iter().zip(texts) {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(io("writing", &path))?;
    }
    weights::write_safetensors(&tensors, &dir.join(FILES[5]))?;

    // Into place: the old directory moves aside first, so that `out` is at every moment either
    // the old export or the new one.
    let tmp = tmp.keep();
    if out.exists() {
        let aside = tempfile::Builder::new()
            .prefix(&format!(".{name}.old-"))
            .tempdir_in(&parent)
            .map_err(io("creating a temporary directory in", &parent))?
            .keep();
        let old = aside.join("old");
        std::fs::rename(out, &old).map_err(io("moving aside", out))?;
        std::fs::rename(&tmp, out).map_err(io("renaming into place", out))?;
        std::fs::remove_dir_all(&aside).map_err(io("removing", &aside))?;
    } else {
        std::fs::rename(&tmp, out).map_err(io("renaming into place", out))?;
    }
    Ok(Exported { tensors: tensors.len() })
}
