//! SentencePiece tokenization of cleaned transcripts, with the `<|lang|>` prefix policy.
//!
//! The text fed to the model is `<|lang|> cleaned text` when the prefix applies, else the
//! cleaned text alone. `--lang-prefix auto` applies it when the model has `<|lang|>` as one
//! piece (a user-defined symbol), `always` applies it regardless (it may then split into several
//! pieces), `never` leaves it out. Sequences longer than the limit are truncated (and counted by
//! the caller).

use std::path::Path;

use sentencepiece::SentencePieceProcessor;

use crate::text::with_language_tag;

/// When the `<|lang|>` prefix is part of the tokenized text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LangPrefix {
    /// When the model has the tag as one piece.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The model file could not be read.
    #[error("cannot read tokenizer model {path}: {source}")]
    Io {
        /// Model path.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A `.nemo` archive without a usable SentencePiece tokenizer.
    #[error("{0}")]
    Nemo(String),
    /// The bytes are not a SentencePiece model.
    #[error("{path} is not a SentencePiece model: {reason}")]
    Model {
        /// Model path.
        path: String,
        /// What SentencePiece said.
        reason: String,
    },
    /// Encoding failed (a NUL byte in the text, for instance).
    #[error("cannot tokenize {text:?}: {reason}")]
    Encode {
        /// The text, shortened.
        text: String,
        /// What SentencePiece said.
        reason: String,
    },
}

/// A loaded SentencePiece model. Thread-safe: one instance serves every worker.
pub struct Tokenizer {
    spp: SentencePieceProcessor,
    model: Vec<u8>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size()).finish_non_exhaustive()
    }
}

/// Tokens of one transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Whether the sequence was cut at the limit.
    pub truncated: bool,
    /// Whether the `<|lang|>` prefix was included.
    pub prefixed: bool,
}

impl Tokenizer {
    /// Loads a SentencePiece `.model` file, or the tokenizer inside a NeMo `.nemo` archive (the
    /// member its `tokenizer.model_path` names); the model's bytes are kept to be embedded in
    /// the corpus.
    pub fn open(path: &Path) -> Result<Tokenizer, TokenizeError> {
        let shown = path.display().to_string();
        let is_nemo = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("nemo"));
        let model = if is_nemo {
            asr_nemo::Archive::open(path)
                .and_then(|a| a.tokenizer_model().map(<[u8]>::to_vec))
                .map_err(|e| TokenizeError::Nemo(e.to_string()))?
        } else {
            std::fs::read(path)
                .map_err(|source| TokenizeError::Io { path: shown.clone(), source })?
        };
        let spp = SentencePieceProcessor::from_serialized_proto(&model)
            .map_err(|e| TokenizeError::Model { path: shown, reason: e.to_string() })?;
        Ok(Tokenizer { spp, model })
    }

    /// The model file's bytes.
    pub fn model_bytes(&self) -> &[u8] {
        &self.model
    }

    /// Number of pieces.
    pub fn vocab_size(&self) -> u32 {
        self.spp.len() as u32
    }

    /// Whether `piece` is one piece of the vocabulary (not mapped to unknown).
    pub fn has_piece(&self, piece: &str) -> bool {
        matches!(self.spp.piece_to_id(piece), Ok(Some(id)) if id != self.spp.unk_id())
    }

    /// Tokenizes `text` (cleaned, without tag) of language `lang`, keeping at most `max_tokens`.
    pub fn encode(
        &self,
        lang: &str,
        text: &str,
        prefix: LangPrefix,
        max_tokens: usize,
    ) -> Result<Encoded, TokenizeError> {
        let tag = format!("<|{lang}|>");
        let prefixed = match prefix {
            LangPrefix::Always => true,
            LangPrefix::Never => false,
            LangPrefix::Auto => self.has_piece(&tag),
        };
        let input = if prefixed { with_language_tag(lang, text) } else { text.to_owned() };
        let pieces = self.spp.encode(&input).map_err(|e| TokenizeError::Encode {
            text: input.chars().take(80).collect(),
            reason: e.to_string(),
        })?;
        let mut ids: Vec<u32> = pieces.into_iter().map(|p| p.id).collect();
        let truncated = ids.len() > max_tokens;
        ids.truncate(max_tokens);
        Ok(Encoded { ids, truncated, prefixed })
    }

    /// The text of token ids (for inspection and tests).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.spp
            .decode_piece_ids(ids)
            .map_err(|e| TokenizeError::Encode { text: format!("{ids:?}"), reason: e.to_string() })
    }
}
