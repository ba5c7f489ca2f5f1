//! The METADATA section (SPEC.md section 6.6): language and source tables, tokenizer identity,
//! compile parameters and statistics, as JSON.

use std::collections::{BTreeMap, HashSet};

use serde::de::DeserializeSeed;
use serde::{Deserialize, Serialize};

use crate::error::FormatError;
use crate::layout::MAX_JSON_DEPTH;

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
    /// Parses and checks the members' shapes (R11, the parts that need no other section).
    pub(crate) fn parse(bytes: &[u8]) -> Result<Metadata, FormatError> {
        let invalid =
            |e: serde_json::Error| FormatError::Metadata { message: format!("invalid JSON: {e}") };
        check_json(bytes).map_err(invalid)?;
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(invalid)?;
        check_objects(&value)?;
        let meta: Metadata = serde_json::from_value(value).map_err(|e| FormatError::Metadata {
            message: format!("members missing or of the wrong type: {e}"),
        })?;
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
        Ok(meta)
    }

    /// The metadata as the bytes the writer stores: compact JSON, members in a fixed order.
    ///
    /// Statistics computed from sample counts are always finite; a non-finite `hours` set by
    /// hand would be written as `null` (serde_json's rendering), which no reader accepts.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect(
            "serialising Metadata cannot fail: its map keys are strings, its fields are strings, \
             integers, floats (serde_json writes non-finite ones as null rather than failing) \
             and a serde_json::Value, and writing into a Vec cannot fail",
        )
    }
}

/// The JSON rules of SPEC.md section 6.6 that serde's typed parse does not apply everywhere:
/// no repeated member name in any object, nesting at most [`MAX_JSON_DEPTH`] deep, every number
/// finite as an `f64`, no lone surrogate escape. The typed parse checks these only in members it
/// reads (repeated names only for struct fields, depth and numbers not at all in ignored
/// members), so this pass walks the whole document, unknown members included.
fn check_json(bytes: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    JsonCheck { depth: 1 }.deserialize(&mut de)?;
    de.end()
}

/// A value at nesting depth `depth`: the top-level value is at depth 1, and the elements and
/// member values of an array or object at depth d are at depth d + 1.
#[derive(Clone, Copy)]
struct JsonCheck {
    depth: usize,
}

impl JsonCheck {
    /// Called for an array or object at `self.depth`; the checker for its contents.
    fn inner<E: serde::de::Error>(self) -> Result<JsonCheck, E> {
        if self.depth > MAX_JSON_DEPTH {
            return Err(E::custom(format_args!(
                "arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"
            )));
        }
        Ok(JsonCheck { depth: self.depth + 1 })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for JsonCheck {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // serde_json parses every number and string fully here: an out-of-range number or a
        // lone surrogate escape is an error, as it is in members the typed parse reads.
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonCheck {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("number out of range"))
        }
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.inner()?;
        let mut names = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if let Some(name) = names.replace(name) {
                return Err(serde::de::Error::custom(format_args!(
                    "member name {name:?} is repeated in one object"
                )));
            }
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

/// The members SPEC.md declares as objects are JSON objects: serde would also accept an array of
/// a struct's field values, which the format does not allow.
fn check_objects(v: &serde_json::Value) -> Result<(), FormatError> {
    let not_object = |name: String| FormatError::Metadata {
        message: format!("{name} is missing or not a JSON object"),
    };
    if !v.is_object() {
        return Err(not_object("the top-level value".into()));
    }
    for name in ["tokenizer", "compile", "stats"] {
        if !v[name].is_object() {
            return Err(not_object(name.into()));
        }
    }
    let Some(per_language) = v["stats"]["per_language"].as_object() else {
        return Err(not_object("stats.per_language".into()));
    };
    for (code, s) in per_language {
        if !s.is_object() {
            return Err(not_object(format!("stats.per_language[{code:?}]")));
        }
    }
    Ok(())
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
