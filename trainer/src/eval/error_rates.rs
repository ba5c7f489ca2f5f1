//! Word and character error rates: Levenshtein distance over words (split on whitespace) and
//! over Unicode scalar values, summed per language.

use serde::Serialize;

/// Edit distance between two sequences.
pub fn edit_distance<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, x) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Error counts of one language.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ErrorRates {
    /// Utterances.
    pub utterances: u64,
    /// Word edits and reference words.
    pub word_errors: u64,
    /// Reference words.
    pub words: u64,
    /// Character edits.
    pub char_errors: u64,
    /// Reference characters.
    pub chars: u64,
    /// word_errors / words.
    pub wer: f64,
    /// char_errors / chars.
    pub cer: f64,
}

impl ErrorRates {
    /// Adds one utterance's reference and hypothesis.
    pub fn add(&mut self, reference: &str, hypothesis: &str) {
        let rw: Vec<&str> = reference.split_whitespace().collect();
        let hw: Vec<&str> = hypothesis.split_whitespace().collect();
        let rc: Vec<char> = reference.chars().collect();
        let hc: Vec<char> = hypothesis.chars().collect();
        self.utterances += 1;
        self.word_errors += edit_distance(&rw, &hw) as u64;
        self.words += rw.len() as u64;
        self.char_errors += edit_distance(&rc, &hc) as u64;
        self.chars += rc.len() as u64;
        self.wer = self.word_errors as f64 / self.words.max(1) as f64;
        self.cer = self.char_errors as f64 / self.chars.max(1) as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_substitutions_insertions_deletions() {
        assert_eq!(edit_distance(&["a", "b", "c"], &["a", "x", "c", "d"]), 2);
        assert_eq!(edit_distance::<char>(&[], &['a', 'b']), 2);
        assert_eq!(
            edit_distance(&['k', 'i', 't', 't', 'e', 'n'], &['s', 'i', 't', 't', 'i', 'n', 'g']),
            3
        );
    }
}
