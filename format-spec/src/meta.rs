//! The METADATA section (SPEC.md section 6.6): language and source tables, tokenizer identity,
//! compile parameters and statistics, as JSON.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::error::FormatError;

/// Tokenizer identity recorded in a corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// `"sentencepiece"`, or `"none"` when the corpus embeds no model.
    pub kind: String,
    /// Vocabulary size; equals the header's.
    pub vocab_size: u32,
    /// xxh3 of the model bytes, 16 lowercase hex digits.
    pub model_xxh3: String,
    /// Length of the model bytes.
    pub model_bytes: u64,
}

/// Counts for one language, or for the whole corpus.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LanguageStats {
    /// Utterances.
    pub utterances: u64,
    /// PCM samples.
    pub samples: u64,
    /// Tokens.
    pub tokens: u64,
    /// Hours of audio: samples / 16000 / 3600.
    pub hours: f64,
}

/// Corpus-wide statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Utterances, N.
    pub utterances: u64,
    /// Samples, S.
    pub samples: u64,
    /// Tokens, T.
    pub tokens: u64,
    /// Hours of audio.
    pub hours: f64,
    /// Per language code, for languages with at least one utterance.
    pub per_language: BTreeMap<String, LanguageStats>,
}

/// The decoded METADATA section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Language codes; language id i is `languages[i]`.
    pub languages: Vec<String>,
    /// Source names; source id i is `sources[i]`.
    pub sources: Vec<String>,
    /// Tokenizer identity.
    pub tokenizer: TokenizerInfo,
    /// Parameters of the run that made the corpus (free-form).
    pub compile: serde_json::Value,
    /// Statistics.
    pub stats: Stats,
}

/// Hours of audio in `samples` samples at 16 kHz.
pub fn hours(samples: u64) -> f64 {
    samples as f64 / f64::from(crate::layout::SAMPLE_RATE) / 3600.0
}

/// Most entries in the language or source table: ids are `u16`.
pub const MAX_TABLE_ENTRIES: usize = 1 << 16;

impl Metadata {
    /// Parses and checks the members' shapes (R12, the parts that need no other section).
    pub(crate) fn parse(bytes: &[u8]) -> Result<Metadata, FormatError> {
        let meta: Metadata = serde_json::from_slice(bytes)
            .map_err(|e| FormatError::Metadata { message: format!("invalid JSON: {e}") })?;
        check_table("languages", &meta.languages, false)?;
        check_table("sources", &meta.sources, true)?;
        if !matches!(meta.tokenizer.kind.as_str(), "sentencepiece" | "none") {
            return Err(FormatError::Metadata {
                message: format!(
                    "tokenizer.kind is {:?}, expected \"sentencepiece\" or \"none\"",
                    meta.tokenizer.kind
                ),
            });
        }
        let h = &meta.tokenizer.model_xxh3;
        if h.len() != 16 || !h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
            return Err(FormatError::Metadata {
                message: format!("tokenizer.model_xxh3 is {h:?}, expected 16 lowercase hex digits"),
            });
        }
        if !meta.compile.is_object() {
            return Err(FormatError::Metadata { message: "compile is not a JSON object".into() });
        }
        Ok(meta)
    }

    /// The metadata as the bytes the writer stores: compact JSON, members in a fixed order.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serialising plain structs, strings, numbers and a `Value` cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn check_table(name: &str, table: &[String], allow_empty_string: bool) -> Result<(), FormatError> {
    if table.len() > MAX_TABLE_ENTRIES {
        return Err(FormatError::Metadata {
            message: format!(
                "{name} has {} entries, at most {MAX_TABLE_ENTRIES} allowed",
                table.len()
            ),
        });
    }
    let mut seen = HashSet::with_capacity(table.len());
    for (i, s) in table.iter().enumerate() {
        if s.is_empty() && !allow_empty_string {
            return Err(FormatError::Metadata { message: format!("{name}[{i}] is empty") });
        }
        if !seen.insert(s.as_str()) {
            return Err(FormatError::Metadata {
                message: format!("{name}[{i}] {s:?} is repeated"),
            });
        }
    }
    Ok(())
}

/// Lowercase 16-digit hex of a hash, as JSON stores it.
pub fn hash_hex(h: u64) -> String {
    format!("{h:016x}")
}
