//! Full verification (SPEC.md rules V1-V8): every checksum, every padding byte, every token id,
//! every audio hash, every text block, and the statistics. Reads the whole file once.

use std::collections::HashMap;

use serde::Serialize;

use crate::error::FormatError;
use crate::layout::{self, SectionKind};
use crate::meta::{hash_hex, hours, LanguageStats};
use crate::read::{Corpus, TokenSlice};

/// One section as the table describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SectionSummary {
    /// Kind name (or `kind N` for an optional kind this reader does not know).
    pub kind: String,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
    /// Checksum, 16 hex digits.
    pub checksum: String,
}

/// What a successful verification saw. Serialised by `asrc validate --json` and compared with the
/// Python reader's summary in CI.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    /// Format version of the file.
    pub format_version: u32,
    /// File length in bytes.
    pub file_bytes: u64,
    /// Utterances.
    pub utterances: u64,
    /// PCM samples.
    pub samples: u64,
    /// Tokens.
    pub tokens: u64,
    /// Hours of audio.
    pub hours: f64,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Bytes per token id.
    pub token_width: u32,
    /// Text blocks.
    pub text_blocks: u64,
    /// Tokenizer kind.
    pub tokenizer: String,
    /// Per language code.
    pub languages: std::collections::BTreeMap<String, LanguageStats>,
    /// The section table.
    pub sections: Vec<SectionSummary>,
}

impl Corpus {
    /// Checks every byte of the corpus (rules V1-V8). Cost: one read of the whole file, one
    /// xxh3 pass (several GB/s), one decompression of every text block, and a hash map of the
    /// segment ids (16 bytes per utterance).
    pub fn verify(&self) -> Result<VerifyReport, FormatError> {
        let sections = self.check_checksums_and_padding()?;
        self.check_token_ids()?;
        self.check_audio_hashes()?;
        self.check_text_blocks()?;
        self.check_tokenizer()?;
        let languages = self.check_stats()?;
        let h = self.header();
        Ok(VerifyReport {
            format_version: h.format_version,
            file_bytes: self.as_bytes().len() as u64,
            utterances: h.n_utterances,
            samples: h.n_samples,
            tokens: h.n_tokens,
            hours: hours(h.n_samples),
            vocab_size: h.vocab_size,
            token_width: h.token_width,
            text_blocks: self.text_block_count() as u64,
            tokenizer: self.metadata().tokenizer.kind.clone(),
            languages,
            sections,
        })
    }

    /// V1, V2.
    fn check_checksums_and_padding(&self) -> Result<Vec<SectionSummary>, FormatError> {
        let bytes = self.as_bytes();
        let mut out = Vec::with_capacity(self.header().sections.len());
        for s in &self.header().sections {
            let name = SectionKind::from_code(s.kind)
                .map_or_else(|| format!("kind {}", s.kind), |k| k.name().to_owned());
            // `open` checked these ranges lie inside the file (R7).
            let (start, end) = (s.offset as usize, (s.offset + s.length) as usize);
            let computed = xxhash_rust::xxh3::xxh3_64(&bytes[start..end]);
            if computed != s.checksum {
                return Err(FormatError::Checksum {
                    kind: name,
                    offset: s.offset,
                    end: s.offset + s.length,
                    stored: s.checksum,
                    computed,
                });
            }
            let pad_end = layout::align_up(end as u64).unwrap_or(u64::MAX) as usize;
            if let Some(i) = bytes[end..pad_end].iter().position(|&b| b != 0) {
                return Err(FormatError::NonZeroPadding {
                    offset: (end + i) as u64,
                    value: bytes[end + i],
                });
            }
            out.push(SectionSummary {
                kind: name,
                offset: s.offset,
                length: s.length,
                checksum: hash_hex(s.checksum),
            });
        }
        Ok(out)
    }

    /// V3.
    fn check_token_ids(&self) -> Result<(), FormatError> {
        let vocab = self.header().vocab_size;
        let bad = match self.tokens_all() {
            TokenSlice::U16(s) => first_at_or_above(s, vocab),
            TokenSlice::U32(s) => first_at_or_above(s, vocab),
        };
        if let Some((at, id)) = bad {
            let offsets = self.token_offsets();
            // The utterance whose token range contains `at`.
            let utt = offsets.partition_point(|&o| o <= at as u64).saturating_sub(1);
            return Err(FormatError::TokenOutOfRange {
                utterance: utt as u64,
                position: at as u64 - offsets[utt],
                id,
                vocab_size: vocab,
            });
        }
        Ok(())
    }

    /// V4.
    fn check_audio_hashes(&self) -> Result<(), FormatError> {
        for (i, &stored) in self.audio_hashes().iter().enumerate() {
            let computed = crate::audio_hash(self.pcm(i));
            if computed != stored {
                return Err(FormatError::AudioHash { utterance: i as u64, stored, computed });
            }
        }
        Ok(())
    }

    /// V5, V6.
    fn check_text_blocks(&self) -> Result<(), FormatError> {
        let mut first_by_hash: HashMap<u64, u64> = HashMap::with_capacity(self.len());
        // Ids whose 64-bit hash collided with a different id; compared exactly.
        let mut spill: HashMap<String, u64> = HashMap::new();
        for b in 0..self.text_block_count() {
            let block = self.text_block(b)?;
            for (j, rec) in block.iter().enumerate() {
                let i = block.first_utterance() + j as u64;
                let h = xxhash_rust::xxh3::xxh3_64(rec.segment_id.as_bytes());
                let Some(&first) = first_by_hash.get(&h) else {
                    first_by_hash.insert(h, i);
                    continue;
                };
                let (first_id, _) = self.text(first as usize)?;
                let dup = if first_id == rec.segment_id {
                    Some(first)
                } else {
                    spill.get(rec.segment_id).copied()
                };
                if let Some(first) = dup {
                    return Err(FormatError::DuplicateSegmentId {
                        id: rec.segment_id.to_owned(),
                        first,
                        second: i,
                    });
                }
                spill.insert(rec.segment_id.to_owned(), i);
            }
        }
        Ok(())
    }

    /// V7.
    fn check_tokenizer(&self) -> Result<(), FormatError> {
        let model = self.tokenizer_model();
        let info = &self.metadata().tokenizer;
        let computed = hash_hex(xxhash_rust::xxh3::xxh3_64(model));
        if computed != info.model_xxh3 {
            return Err(FormatError::Metadata {
                message: format!(
                    "tokenizer.model_xxh3 is {}, the TOKENIZER section hashes to {computed}",
                    info.model_xxh3
                ),
            });
        }
        if (info.kind == "none") != model.is_empty() {
            return Err(FormatError::Metadata {
                message: format!(
                    "tokenizer.kind is {:?} but the TOKENIZER section is {} bytes",
                    info.kind,
                    model.len()
                ),
            });
        }
        Ok(())
    }

    /// V8.
    fn check_stats(
        &self,
    ) -> Result<std::collections::BTreeMap<String, LanguageStats>, FormatError> {
        let meta = self.metadata();
        let mut per_id = vec![LanguageStats::default(); meta.languages.len()];
        let (ns, to) = (self.num_samples(), self.token_offsets());
        for (i, &l) in self.languages().iter().enumerate() {
            let s = &mut per_id[l as usize];
            s.utterances += 1;
            s.samples += u64::from(ns[i]);
            s.tokens += to[i + 1] - to[i];
        }
        let mut computed = std::collections::BTreeMap::new();
        for (code, mut s) in meta.languages.iter().zip(per_id) {
            if s.utterances > 0 {
                s.hours = hours(s.samples);
                computed.insert(code.clone(), s);
            }
        }
        let stored = &meta.stats.per_language;
        let same_keys = stored.len() == computed.len() && stored.keys().eq(computed.keys());
        if !same_keys {
            return Err(FormatError::Metadata {
                message: format!(
                    "stats.per_language has languages {:?}, the utterances have {:?}",
                    stored.keys().collect::<Vec<_>>(),
                    computed.keys().collect::<Vec<_>>()
                ),
            });
        }
        for (code, c) in &computed {
            let s = &stored[code];
            if (s.utterances, s.samples, s.tokens) != (c.utterances, c.samples, c.tokens)
                || !close(s.hours, c.hours)
            {
                return Err(FormatError::Metadata {
                    message: format!(
                        "stats.per_language[{code:?}] is {s:?}, the utterances give {c:?}"
                    ),
                });
            }
        }
        let total = hours(self.header().n_samples);
        if !close(meta.stats.hours, total) {
            return Err(FormatError::Metadata {
                message: format!("stats.hours is {}, the header gives {total}", meta.stats.hours),
            });
        }
        Ok(computed)
    }
}

/// Position and value of the first id `>= vocab`. Scans without branching per element in the
/// common all-valid case, then locates the culprit.
fn first_at_or_above<T: Copy + Into<u32>>(ids: &[T], vocab: u32) -> Option<(usize, u32)> {
    let max = ids.iter().fold(0u32, |m, &t| m.max(t.into()));
    if max < vocab {
        return None;
    }
    ids.iter().position(|&t| t.into() >= vocab).map(|p| (p, ids[p].into()))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
}
