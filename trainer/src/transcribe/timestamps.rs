//! Token, word and segment times of a TDT hypothesis, computed by the rules of NeMo 2.7.3's
//! `transcribe(timestamps=True)` (`rnnt_decoding.py` `compute_rnnt_timestamps`,
//! `timestamp_utils.py` `get_words_offsets`, `get_segment_offsets`,
//! `process_timestamp_outputs`; cited line by line in
//! `trainer/tests/data/nemo/transcribe/README.md`, and tested against NeMo's own output):
//!
//! - a token spans encoder frames `[frame, frame + duration)`, its predicted duration (0 allowed);
//! - a token after the first whose text starts with a punctuation mark of the vocabulary (every
//!   Unicode `P*` character of the ordinary pieces) is moved to the previous token's end, with
//!   no length: TDT often predicts punctuation after a silence;
//! - a word starts at a token whose piece differs from its text (a `▁` piece, the bare `▁`
//!   included) and that is not punctuation; it ends where the token before the next word ends;
//!   punctuation is glued to the word it follows;
//! - a segment closes after a word that ends with `.`, `?` or `!` (or is one), and at the end;
//! - seconds are `(frames * hop seconds) * subsampling`, in that order, as NeMo evaluates it.

use std::collections::BTreeSet;

use asr_tdt::greedy::Hypothesis;
use serde::Serialize;

use crate::model::ModelConfig;
use crate::tokenizer::Pieces;

/// Characters that close a segment (NeMo's default `segment_seperators`).
pub const SEGMENT_DELIMITERS: [char; 3] = ['.', '?', '!'];

/// One token's time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenTime {
    /// Token id.
    pub id: u32,
    /// Its piece, as the tokenizer writes it.
    pub piece: String,
    /// First encoder frame.
    pub start_offset: usize,
    /// End frame (exclusive; equal to the start for a token of no length).
    pub end_offset: usize,
    /// Seconds.
    pub start: f64,
    /// Seconds.
    pub end: f64,
}

/// One word's or segment's time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    /// The word, or the segment's words joined by spaces.
    pub text: String,
    /// First encoder frame.
    pub start_offset: usize,
    /// End frame.
    pub end_offset: usize,
    /// Seconds.
    pub start: f64,
    /// Seconds.
    pub end: f64,
}

/// Token, word and segment times of one hypothesis.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timestamps {
    /// Per token (NeMo's `char` list).
    pub token: Vec<TokenTime>,
    /// Per word.
    pub word: Vec<Span>,
    /// Per segment.
    pub segment: Vec<Span>,
}

/// How frames become seconds: the front end's hop in seconds and the encoder's subsampling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameTime {
    /// Hop between feature frames, seconds.
    pub hop_seconds: f64,
    /// Feature frames per encoder frame.
    pub subsampling: f64,
}

impl FrameTime {
    /// The model's frame period.
    pub fn of(cfg: &ModelConfig) -> FrameTime {
        FrameTime {
            hop_seconds: cfg.preprocessor.window_stride as f64
                / f64::from(cfg.preprocessor.sample_rate),
            subsampling: cfg.encoder.subsampling_factor as f64,
        }
    }

    /// Seconds at encoder frame `offset`, evaluated as NeMo does: `(offset * hop) * subsampling`.
    pub fn seconds(&self, offset: usize) -> f64 {
        offset as f64 * self.hop_seconds * self.subsampling
    }
}

/// Whether `c` is Unicode punctuation (general category `P*`).
fn is_punctuation_char(c: char) -> bool {
    static P: std::sync::OnceLock<Option<regex::Regex>> = std::sync::OnceLock::new();
    P.get_or_init(|| regex::Regex::new(r"^\p{P}$").ok())
        .as_ref()
        .is_some_and(|re| re.is_match(c.encode_utf8(&mut [0; 4])))
}

/// The punctuation marks of a vocabulary: every `P*` character of its ordinary pieces (not
/// `[..]`, `<..>`, `##..`, `▁..` or blank pieces), as NeMo's `extract_punctuation_from_vocab`.
pub fn vocabulary_punctuation(pieces: &Pieces) -> BTreeSet<char> {
    let mut set = BTreeSet::new();
    for id in 0..pieces.len() {
        let p = pieces.piece(id);
        let special = (p.starts_with('[') && p.ends_with(']'))
            || (p.starts_with('<') && p.ends_with('>'))
            || p.starts_with("##")
            || p.starts_with('\u{2581}')
            || p.trim().is_empty();
        if !special {
            set.extend(p.chars().filter(|&c| is_punctuation_char(c)));
        }
    }
    set
}

/// The text of a run of pieces, as SentencePiece's `decode_pieces` gives it: concatenated,
/// `▁` as a space, the leading space dropped.
fn decode_pieces(pieces: &[&str]) -> String {
    let joined: String = pieces.concat().replace('\u{2581}', " ");
    joined.strip_prefix(' ').unwrap_or(&joined).to_owned()
}

/// A word under construction: its tokens' pieces and its first token's start.
struct Open<'a> {
    pieces: Vec<&'a str>,
    start: usize,
}

/// The times of `h`'s tokens, words and segments.
pub fn compute(
    h: &Hypothesis,
    pieces: &Pieces,
    punctuation: &BTreeSet<char>,
    time: FrameTime,
) -> Timestamps {
    let n = h.tokens.len();
    let piece: Vec<&str> = h.tokens.iter().map(|&id| pieces.piece(id)).collect();
    let text: Vec<String> = piece.iter().map(|p| decode_pieces(&[p])).collect();
    let is_punct = |t: &str| {
        let mut c = t.chars();
        matches!((c.next(), c.next()), (Some(ch), None) if punctuation.contains(&ch))
    };
    let mut start: Vec<usize> = h.frames.clone();
    let mut end: Vec<usize> = (0..n).map(|i| h.frames[i] + h.durations[i]).collect();
    for i in 1..n {
        if text[i].chars().next().is_some_and(|c| punctuation.contains(&c)) {
            start[i] = end[i - 1];
            end[i] = start[i];
        }
    }
    let token = (0..n)
        .map(|i| TokenTime {
            id: h.tokens[i] as u32,
            piece: piece[i].to_owned(),
            start_offset: start[i],
            end_offset: end[i],
            start: time.seconds(start[i]),
            end: time.seconds(end[i]),
        })
        .collect();

    // Words: (text, start offset, end offset).
    let mut words: Vec<(String, usize, usize)> = Vec::new();
    let mut open: Option<Open<'_>> = None;
    let mut closed_any = false;
    for i in 0..n {
        let punct = is_punct(&text[i]);
        if piece[i] != text[i] && !punct {
            if let Some(w) = open.take().filter(|w| !w.pieces.is_empty()) {
                words.push((decode_pieces(&w.pieces), w.start, end[i - 1]));
                closed_any = true;
            }
            open = Some(Open { pieces: vec![piece[i]], start: start[i] });
        } else if punct {
            match open.as_mut().filter(|w| !w.pieces.is_empty()) {
                Some(w) => {
                    if w.pieces.last() == Some(&"\u{2581}") {
                        w.pieces.pop();
                    }
                    w.pieces.push(piece[i]);
                }
                None => match words.last_mut() {
                    Some(last) => {
                        let trimmed = last.0.trim_end().to_owned();
                        last.0 = trimmed + &text[i];
                        last.2 = end[i];
                    }
                    None => open = Some(Open { pieces: vec![piece[i]], start: start[i] }),
                },
            }
        } else {
            match open.as_mut() {
                Some(w) if !w.pieces.is_empty() => w.pieces.push(piece[i]),
                _ => open = Some(Open { pieces: vec![piece[i]], start: start[i] }),
            }
        }
    }
    if n > 0 {
        if !closed_any {
            // No word boundary at all: every token is one word.
            words.clear();
            words.push((decode_pieces(&piece), start[0], end[n - 1]));
        } else {
            if let Some(first) = words.first_mut() {
                first.1 = start[0];
            }
            if let Some(w) = open.filter(|w| !w.pieces.is_empty()) {
                words.push((decode_pieces(&w.pieces), w.start, end[n - 1]));
            }
        }
    }
    let span = |text: String, s: usize, e: usize| Span {
        text,
        start_offset: s,
        end_offset: e,
        start: time.seconds(s),
        end: time.seconds(e),
    };
    let mut segment = Vec::new();
    let mut current: Vec<&(String, usize, usize)> = Vec::new();
    for w in &words {
        current.push(w);
        let closes = w.0.chars().last().is_some_and(|c| SEGMENT_DELIMITERS.contains(&c));
        if closes {
            let text = current.iter().map(|w| w.0.as_str()).collect::<Vec<_>>().join(" ");
            segment.push(span(text, current[0].1, w.2));
            current.clear();
        }
    }
    if let (Some(first), Some(last)) = (current.first(), current.last()) {
        let text = current.iter().map(|w| w.0.as_str()).collect::<Vec<_>>().join(" ");
        segment.push(span(text, first.1, last.2));
    }
    let word = words.into_iter().map(|(t, s, e)| span(t, s, e)).collect();
    Timestamps { token, word, segment }
}

/// The hypothesis text as NeMo gives it: the pieces decoded, then the one space before a
/// punctuation mark removed.
pub fn text(h: &Hypothesis, pieces: &Pieces, punctuation: &BTreeSet<char>) -> String {
    let decoded = pieces.decode(&h.tokens);
    let mut out = String::with_capacity(decoded.len());
    let mut chars = decoded.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() && chars.peek().is_some_and(|n| punctuation.contains(n)) {
            continue;
        }
        out.push(c);
    }
    out
}
