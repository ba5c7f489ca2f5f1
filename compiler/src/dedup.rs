//! Deduplication, first occurrence wins, in manifest order:
//!
//! 1. an exact duplicate row (every manifest field equal to an earlier row's);
//! 2. a reused segment id (an earlier row has the same id with other content);
//! 3. identical decoded audio under another id: the same samples (same count and xxh3-64 of the
//!    16 kHz PCM, the hash the corpus stores), however different the source files' bytes are.
//!
//! Memory grows by a few dozen bytes per row (hashes and ids), never by audio.

use std::collections::HashMap;

use crate::reason::Reason;

/// Why a row is a duplicate, and of what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Duplicate {
    /// Every field equals an earlier row's.
    Row {
        /// Manifest row of the first occurrence.
        first_row: u64,
    },
    /// The segment id was used by an earlier row with other content.
    ReusedSegmentId {
        /// Manifest row of the first occurrence.
        first_row: u64,
    },
    /// The decoded audio equals an earlier kept row's.
    Audio {
        /// Segment id of the first occurrence.
        first_segment_id: String,
    },
}

impl Duplicate {
    /// What it duplicates, for the report.
    pub fn detail(&self) -> String {
        match self {
            Duplicate::Row { first_row } => {
                format!("every field equals row {first_row}'s")
            }
            Duplicate::ReusedSegmentId { first_row } => {
                format!("segment id already used by row {first_row} with other content")
            }
            Duplicate::Audio { first_segment_id } => {
                format!("decoded audio identical to segment {first_segment_id:?}'s")
            }
        }
    }

    /// The reason's name, as the report counts it.
    pub fn reason(&self) -> Reason {
        match self {
            Duplicate::Row { .. } => Reason::DuplicateRow,
            Duplicate::ReusedSegmentId { .. } => Reason::ReusedSegmentId,
            Duplicate::Audio { .. } => Reason::DuplicateAudio,
        }
    }
}

/// Tracks what has been seen.
#[derive(Debug, Default)]
pub struct Deduper {
    rows: HashMap<u64, u64>,
    ids: HashMap<String, (u64, u64)>,
    audio: HashMap<(u64, usize), String>,
}

impl Deduper {
    /// An empty deduper.
    pub fn new() -> Deduper {
        Deduper::default()
    }

    /// Checks manifest row `row` (its id and all its fields, in a fixed column order) against
    /// the rows before it, and records it. Rules 1 and 2.
    pub fn check_row(&mut self, row: u64, segment_id: &str, fields: &[&str]) -> Option<Duplicate> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f.as_bytes());
        }
        let key = h.digest();
        // The same content hash under the same id is the same row; under another id, a hash
        // collision between different rows (the id is one of the fields), which is kept.
        if let Some(&first) = self.rows.get(&key) {
            if self.ids.get(segment_id).is_some_and(|&(_, k)| k == key) {
                return Some(Duplicate::Row { first_row: first });
            }
        }
        if let Some(&(first, _)) = self.ids.get(segment_id) {
            return Some(Duplicate::ReusedSegmentId { first_row: first });
        }
        self.rows.entry(key).or_insert(row);
        self.ids.insert(segment_id.to_owned(), (row, key));
        None
    }

    /// Checks a kept row's decoded audio (its xxh3-64 and sample count) against the audio of the
    /// rows kept before it, and records it. Rule 3.
    pub fn check_audio(
        &mut self,
        segment_id: &str,
        audio_hash: u64,
        samples: usize,
    ) -> Option<Duplicate> {
        match self.audio.get(&(audio_hash, samples)) {
            Some(first) => Some(Duplicate::Audio { first_segment_id: first.clone() }),
            None => {
                self.audio.insert((audio_hash, samples), segment_id.to_owned());
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_occurrence_wins() {
        let mut d = Deduper::new();
        assert_eq!(d.check_row(0, "a", &["a", "hello", "hi"]), None);
        assert_eq!(d.check_row(1, "b", &["b", "hello", "hi"]), None);
        assert_eq!(
            d.check_row(2, "a", &["a", "hello", "hi"]),
            Some(Duplicate::Row { first_row: 0 })
        );
        assert_eq!(
            d.check_row(3, "a", &["a", "other", "hi"]),
            Some(Duplicate::ReusedSegmentId { first_row: 0 })
        );
        // Field boundaries matter: ("ab", "c") is not ("a", "bc").
        assert_eq!(d.check_row(4, "x", &["x", "ab", "c"]), None);
        assert_eq!(d.check_row(5, "y", &["y", "a", "bc"]), None);
        assert_eq!(d.check_audio("a", 42, 100), None);
        assert_eq!(d.check_audio("b", 42, 101), None, "same hash, other length");
        assert_eq!(
            d.check_audio("x", 42, 100),
            Some(Duplicate::Audio { first_segment_id: "a".into() })
        );
        assert_eq!(Duplicate::Row { first_row: 0 }.reason(), Reason::DuplicateRow);
    }
}
