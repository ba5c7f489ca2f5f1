//! Language labels: normalising codes, and retagging rows whose transcript says otherwise.
//!
//! - Codes are normalised to ISO 639-1 where one exists (`HI`, `hin`, `hi-IN`, `hi_IN`, `Hindi`
//!   all become `hi`); an unknown code is lower-cased and kept, and reported as unknown.
//! - A transcript whose letters are mostly (at least [`SCRIPT_SHARE`]) in a script that belongs
//!   to one language is tagged with that language whatever the label says: Tamil, Telugu,
//!   Kannada, Malayalam, Gujarati, Gurmukhi (Punjabi), Oriya (Odia), and Latin (English, unless
//!   the label is another language written in Latin script: French, German, Spanish, ... are
//!   kept, as datasets such as Common Voice and FLEURS label them).
//! - A script shared by several languages needs more: Devanagari (Hindi, Marathi, Nepali, ...)
//!   goes through a statistical language identifier ([`whatlang`]); Bengali script (Bengali,
//!   Assamese) through the letters only Assamese uses (ৰ, ৱ) against the letter only Bengali
//!   uses (র). The label is kept unless the evidence is confident.
//!
//! Every decision is returned with its method and confidence so the compiler can record it.

use serde::Serialize;

/// Share of a transcript's letters that must be in one script for the script to decide.
pub const SCRIPT_SHARE: f64 = 0.8;
/// Least whatlang confidence that overrides a label.
pub const LID_CONFIDENCE: f64 = 0.9;

/// Languages with their ISO 639-1 code, ISO 639-2/3 codes and English names (lower case).
const LANGUAGES: &[(&str, &[&str])] = &[
    ("as", &["asm", "assamese"]),
    ("ca", &["cat", "catalan"]),
    ("cs", &["ces", "cze", "czech"]),
    ("cy", &["cym", "wel", "welsh"]),
    ("da", &["dan", "danish"]),
    ("de", &["deu", "ger", "german"]),
    ("es", &["spa", "spanish"]),
    ("et", &["est", "estonian"]),
    ("eu", &["eus", "baq", "basque"]),
    ("fi", &["fin", "finnish"]),
    ("fr", &["fra", "fre", "french"]),
    ("ga", &["gle", "irish"]),
    ("hr", &["hrv", "croatian"]),
    ("hu", &["hun", "hungarian"]),
    ("id", &["ind", "indonesian"]),
    ("it", &["ita", "italian"]),
    ("lt", &["lit", "lithuanian"]),
    ("lv", &["lav", "latvian"]),
    ("ms", &["msa", "may", "malay"]),
    ("nl", &["nld", "dut", "dutch"]),
    ("no", &["nor", "nob", "norwegian"]),
    ("pl", &["pol", "polish"]),
    ("pt", &["por", "portuguese"]),
    ("ro", &["ron", "rum", "romanian"]),
    ("sk", &["slk", "slo", "slovak"]),
    ("sl", &["slv", "slovenian"]),
    ("sv", &["swe", "swedish"]),
    ("sw", &["swa", "swahili"]),
    ("tr", &["tur", "turkish"]),
    ("vi", &["vie", "vietnamese"]),
    ("bn", &["ben", "bengali", "bangla"]),
    ("en", &["eng", "english"]),
    ("gu", &["guj", "gujarati"]),
    ("hi", &["hin", "hindi"]),
    ("kn", &["kan", "kannada"]),
    ("ml", &["mal", "malayalam"]),
    ("mr", &["mar", "marathi"]),
    ("ne", &["nep", "npi", "nepali"]),
    ("or", &["ori", "ory", "odia", "oriya"]),
    ("pa", &["pan", "punjabi", "panjabi"]),
    ("sa", &["san", "sanskrit"]),
    ("sd", &["snd", "sindhi"]),
    ("ta", &["tam", "tamil"]),
    ("te", &["tel", "telugu"]),
    ("ur", &["urd", "urdu"]),
];

/// The known languages written in Latin script besides English: a Latin transcript keeps these
/// labels.
const LATIN_LANGUAGES: &[&str] = &[
    "ca", "cs", "cy", "da", "de", "es", "et", "eu", "fi", "fr", "ga", "hr", "hu", "id", "it", "lt",
    "lv", "ms", "nl", "no", "pl", "pt", "ro", "sk", "sl", "sv", "sw", "tr", "vi",
];

/// A normalised language code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    /// The code to use.
    pub code: String,
    /// Whether it is one this module knows (otherwise it was only lower-cased).
    pub known: bool,
}

/// Normalises a language label: ISO 639-1 where known, otherwise lower case.
pub fn normalize(label: &str) -> Code {
    let l = label.trim().to_ascii_lowercase();
    // `hi-IN`, `hi_IN`, `hin-Deva`: the language part is before the first separator.
    let base = l.split(['-', '_']).next().unwrap_or("");
    for (iso1, others) in LANGUAGES {
        if base == *iso1 || others.contains(&base) || others.contains(&l.as_str()) {
            return Code { code: (*iso1).to_owned(), known: true };
        }
    }
    Code { code: base.to_owned(), known: false }
}

/// Writing systems the retagger distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Script {
    /// Latin letters.
    Latin,
    /// Devanagari (hi, mr, ne, sa, ...).
    Devanagari,
    /// Bengali-Assamese script (bn, as).
    Bengali,
    /// Gurmukhi (pa).
    Gurmukhi,
    /// Gujarati (gu).
    Gujarati,
    /// Oriya (or).
    Oriya,
    /// Tamil (ta).
    Tamil,
    /// Telugu (te).
    Telugu,
    /// Kannada (kn).
    Kannada,
    /// Malayalam (ml).
    Malayalam,
}

impl Script {
    /// The script of a letter, by Unicode block.
    pub fn of(c: char) -> Option<Script> {
        Some(match c as u32 {
            0x0900..=0x097F | 0xA8E0..=0xA8FF => Script::Devanagari,
            0x0980..=0x09FF => Script::Bengali,
            0x0A00..=0x0A7F => Script::Gurmukhi,
            0x0A80..=0x0AFF => Script::Gujarati,
            0x0B00..=0x0B7F => Script::Oriya,
            0x0B80..=0x0BFF => Script::Tamil,
            0x0C00..=0x0C7F => Script::Telugu,
            0x0C80..=0x0CFF => Script::Kannada,
            0x0D00..=0x0D7F => Script::Malayalam,
            _ if c.is_ascii_alphabetic() => Script::Latin,
            0x00C0..=0x024F if c.is_alphabetic() => Script::Latin,
            _ => return None,
        })
    }

    /// The one language written in this script, if it has only one.
    pub fn sole_language(self) -> Option<&'static str> {
        match self {
            Script::Latin => Some("en"),
            Script::Gurmukhi => Some("pa"),
            Script::Gujarati => Some("gu"),
            Script::Oriya => Some("or"),
            Script::Tamil => Some("ta"),
            Script::Telugu => Some("te"),
            Script::Kannada => Some("kn"),
            Script::Malayalam => Some("ml"),
            Script::Devanagari | Script::Bengali => None,
        }
    }
}

/// The dominant script of a text and its share of the text's letters (digits, marks and
/// punctuation do not count; combining marks belong to their block but are not letters here).
pub fn dominant_script(text: &str) -> Option<(Script, f64)> {
    let mut counts: Vec<(Script, usize)> = Vec::new();
    let mut total = 0usize;
    for c in text.chars().filter(|c| c.is_alphabetic()) {
        if let Some(s) = Script::of(c) {
            total += 1;
            match counts.iter_mut().find(|(k, _)| *k == s) {
                Some((_, n)) => *n += 1,
                None => counts.push((s, 1)),
            }
        } else {
            total += 1; // a letter of a script this module does not track
        }
    }
    let (s, n) = counts.into_iter().max_by_key(|&(_, n)| n)?;
    Some((s, n as f64 / total as f64))
}

/// How a retag decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The script belongs to one language.
    Script,
    /// Statistical language identification (whatlang) within a shared script.
    Lid,
    /// Letters specific to one language of a shared script.
    ScriptLetters,
}

impl Ord for Method {
    /// By name, as reports list their counts.
    fn cmp(&self, other: &Method) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for Method {
    fn partial_cmp(&self, other: &Method) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Method {
    /// The method's name, as reports write it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Script => "script",
            Method::Lid => "lid",
            Method::ScriptLetters => "script_letters",
        }
    }
}

/// A language decision for one transcript.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The language the row gets.
    pub language: String,
    /// Whether it differs from the (normalised) label.
    pub retagged: bool,
    /// How it was decided; `None` when the label was kept for lack of evidence.
    pub method: Option<Method>,
    /// Confidence of the evidence in [0, 1].
    pub confidence: f64,
    /// The dominant script and its share of the letters, if any letters.
    pub script: Option<(Script, f64)>,
}

/// Decides the language of a cleaned transcript labelled `label` (already normalised).
pub fn decide(label: &str, text: &str) -> Decision {
    let keep = |script, confidence| Decision {
        language: label.to_owned(),
        retagged: false,
        method: None,
        confidence,
        script,
    };
    let Some((script, share)) = dominant_script(text) else {
        return keep(None, 0.0);
    };
    if share < SCRIPT_SHARE {
        return keep(Some((script, share)), share);
    }
    let decided = |language: &str, method, confidence| Decision {
        retagged: language != label,
        language: language.to_owned(),
        method: Some(method),
        confidence,
        script: Some((script, share)),
    };
    // A label that is another language written in Latin script stands: Latin does not decide
    // between them.
    if script == Script::Latin && LATIN_LANGUAGES.contains(&label) {
        return keep(Some((script, share)), share);
    }
    if let Some(lang) = script.sole_language() {
        return decided(lang, Method::Script, share);
    }
    // Languages written in the shared script: a label outside them is wrong whatever the
    // confidence, and the best guess replaces it.
    let (family, default): (&[&str], &str) = match script {
        Script::Bengali => (&["bn", "as"], "bn"),
        _ => (&["hi", "mr", "ne", "sa", "mai", "kok"], "hi"),
    };
    let label_fits = family.contains(&label);
    let guess: Option<(&str, Method, f64)> = match script {
        Script::Bengali => {
            let assamese = text.chars().filter(|&c| c == '\u{09F0}' || c == '\u{09F1}').count();
            let bengali = text.chars().filter(|&c| c == '\u{09B0}').count();
            match (assamese, bengali) {
                (a, 0) if a > 0 => Some(("as", Method::ScriptLetters, 1.0)),
                (0, b) if b > 0 => Some(("bn", Method::ScriptLetters, 1.0)),
                _ => None,
            }
        }
        _ => whatlang::detect(text).and_then(|i| {
            let code = match i.lang() {
                whatlang::Lang::Hin => "hi",
                whatlang::Lang::Mar => "mr",
                whatlang::Lang::Nep => "ne",
                _ => return None,
            };
            Some((code, Method::Lid, i.confidence()))
        }),
    };
    match guess {
        Some((code, method, conf)) if conf >= LID_CONFIDENCE || !label_fits => {
            decided(code, method, conf)
        }
        _ if !label_fits => decided(default, Method::Script, 0.5),
        Some((_, _, conf)) => keep(Some((script, share)), conf),
        None => keep(Some((script, share)), 0.0),
    }
}
