//! Transcript cleaning: the Python pipeline's rules, completed for Unicode punctuation.
//!
//! Rules, in order (README.md "Text cleaning" lists them with examples):
//! 1. Bracket tags are removed: `[` up to the nearest `]` on the same line (`[laugh]`,
//!    `[music]`, `[singing]`, `[2 speakers]`).
//! 2. Punctuation is removed (deleted, not replaced by a space, as the pipeline does): every
//!    character of Unicode general category P (connector, dash, open, close, initial and final
//!    quote, other: `.,!?;:'"-()…।॥“”‘’–—«»¿¡·` and the rest), plus the symbols the pipeline's
//!    character class lists (`% / + = $ * @ # & _ ^ > < | \ ` ~`).
//! 3. Whitespace runs (any Unicode white space) become one space; leading and trailing white
//!    space is removed.
//!
//! Digits, letters (any script, any case), combining marks and format characters such as the
//! zero-width joiner are kept.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::Regex;

fn tags() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"\[[^\n]*?\]")
            .expect("a constant, valid pattern; every test of `clean` compiles it")
    })
}

fn punctuation() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"[\p{P}%/+=$*@#&_^><|\\`~]+")
            .expect("a constant, valid pattern; \\p{P} is in regex's default Unicode tables")
    })
}

fn whitespace() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"\s+").expect("a constant, valid pattern; every test of `clean` compiles it")
    })
}

/// Cleans one transcript (rules 1-3 above). An empty result means the row has no text left.
pub fn clean(text: &str) -> String {
    let t: Cow<'_, str> = tags().replace_all(text, "");
    let t = punctuation().replace_all(&t, "");
    whitespace().replace_all(&t, " ").trim().to_owned()
}

/// Removes a leading `<|xx|>` language tag (and the space after it), as the training-ready
/// manifest's `text` column carries one; returns the tag's code, if any, and the rest.
pub fn strip_language_tag(text: &str) -> (Option<&str>, &str) {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("<|") {
        if let Some(end) = rest.find("|>") {
            let code = &rest[..end];
            if !code.is_empty() && code.len() <= 16 && !code.contains(char::is_whitespace) {
                return (Some(code), rest[end + 2..].trim_start());
            }
        }
    }
    (None, text)
}

/// The tagged form the tokenizer sees: `<|lang|> text`.
pub fn with_language_tag(lang: &str, text: &str) -> String {
    format!("<|{lang}|> {text}")
}
