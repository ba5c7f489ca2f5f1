//! Stage 1, the rows policy (one thread, input order): null checks, row and segment-id
//! deduplication, the duration and quality filters, text cleaning, language normalisation and
//! retagging. Each row comes out either ready for its audio or dropped with its report entry.

use std::path::PathBuf;

use crate::dedup::Deduper;
use crate::inputs::AudioRef;
use crate::lang;
use crate::manifest::ManifestRow;
use crate::text;

use super::report::{Entry, Reason, Retag};
use super::CompileOptions;

/// A row that passed stage 1: what stages 2 and 3 need.
pub(super) struct Ready {
    /// The input row.
    pub(super) row: ManifestRow,
    /// Its (non-empty) segment id.
    pub(super) segment_id: String,
    /// The cleaned transcript.
    pub(super) text: String,
    /// The final language code.
    pub(super) language: String,
    /// Where the audio is.
    pub(super) audio: AudioRef,
}

/// A row stage 1 keeps, with the entries the report lists for it (flags, then the retag).
pub(super) struct Kept {
    /// The row.
    pub(super) ready: Ready,
    /// Its flagged and retagged entries, in the order the report lists them.
    pub(super) notes: Vec<Entry>,
}

/// The hours a row claims, under its normalised label (for the report's "hours in"), whatever
/// becomes of the row.
pub(super) fn claimed_hours(row: &ManifestRow) -> Option<(String, f64)> {
    let label = lang::normalize(row.lang.as_deref()?);
    let d = row.duration?;
    (d.is_finite() && d > 0.0).then(|| (label.code, d / 3600.0))
}

/// Stage 1's policy and state: the options it applies and the rows and ids seen so far.
pub(super) struct Rows<'a> {
    opts: &'a CompileOptions,
    audio_base: PathBuf,
    /// Rows and segment ids seen (the audio table of this deduper stays empty).
    dedup: Deduper,
}

impl Rows<'_> {
    /// A policy applying `opts`, resolving relative audio paths against `audio_base`.
    pub(super) fn new(opts: &CompileOptions, audio_base: PathBuf) -> Rows<'_> {
        Rows { opts, audio_base, dedup: Deduper::new() }
    }

    /// Records a row of an earlier part (`--part`) for row and segment-id deduplication, as
    /// [`Rows::prepare`] would, without preparing it: a later part then drops what one compile
    /// of the whole input would.
    pub(super) fn remember(&mut self, row: &ManifestRow) {
        // A malformed row is dropped before its ids are looked at (`prepare`).
        if row.malformed.is_some() {
            return;
        }
        // Only the deduper's state matters here, not the verdict on the row.
        let _ = self.check_ids(row);
    }

    /// The row's segment id, or why the row is dropped: a null or empty id, or a duplicate of an
    /// earlier row (rules 1 and 2 of `dedup`, which records the row).
    fn check_ids(&mut self, row: &ManifestRow) -> Result<String, Box<Entry>> {
        let Some(segment_id) = row.segment_id.clone().filter(|s| !s.is_empty()) else {
            let detail = "segment_id is null or empty".into();
            return Err(Box::new(Entry::new(row, Reason::NullSegmentId, detail)));
        };
        let fields = row.fields();
        let field_refs: Vec<&str> = fields.iter().map(String::as_str).collect();
        if let Some(dup) = self.dedup.check_row(row.row, &segment_id, &field_refs) {
            return Err(Box::new(Entry::new(row, dup.reason(), dup.detail())));
        }
        Ok(segment_id)
    }

    /// Stage 1 for one row, in input order: the row ready for its audio, or its drop entry.
    pub(super) fn prepare(&mut self, row: ManifestRow) -> Result<Kept, Box<Entry>> {
        let drop = |row: &ManifestRow, reason: Reason, detail: String| {
            Box::new(Entry::new(row, reason, detail))
        };
        if let Some((reason, detail)) = &row.malformed {
            return Err(drop(&row, *reason, detail.clone()));
        }
        let segment_id = self.check_ids(&row)?;
        if let Some(e) = self.filter(&row) {
            return Err(Box::new(e));
        }
        let Some(raw_text) = row.text.as_deref() else {
            return Err(drop(&row, Reason::NullText, "text is null".into()));
        };
        let (tag, body) = text::strip_language_tag(raw_text);
        let cleaned = text::clean(body);
        if cleaned.is_empty() {
            let detail = format!("nothing left after cleaning {raw_text:?}");
            return Err(drop(&row, Reason::EmptyText, detail));
        }
        // The label: the lang column, else the text's tag.
        let label = row.lang.as_deref().or(tag).map(lang::normalize);
        // No label is the empty code: `decide` may still find a language in the script, and a
        // row that ends without one is dropped (`no_language`).
        let label_code = match &label {
            Some(l) => l.code.clone(),
            None => String::new(),
        };
        let mut flags = Vec::new();
        if let Some(l) = &label {
            if !l.known {
                flags.push((
                    Reason::UnknownLanguage,
                    format!("label {:?} is not a known language", l.code),
                ));
            }
        }
        if let (Some(t), Some(l)) = (tag, &label) {
            let t = lang::normalize(t).code;
            if t != l.code {
                flags
                    .push((Reason::TagMismatch, format!("text tag <|{t}|> but lang {:?}", l.code)));
            }
        }
        let decision = if self.opts.retag {
            lang::decide(&label_code, &cleaned)
        } else {
            lang::Decision {
                language: label_code.clone(),
                retagged: false,
                method: None,
                confidence: 1.0,
                script: None,
            }
        };
        if decision.language.is_empty() {
            let detail = "no language label and no script that decides one".into();
            return Err(drop(&row, Reason::NoLanguage, detail));
        }
        let Some(audio) = row.audio_ref(&self.audio_base) else {
            return Err(if row.audio_dir.is_some() {
                drop(
                    &row,
                    Reason::NoAudioIndex,
                    "the shard's audio_index.parquet has no row for this segment".into(),
                )
            } else {
                drop(&row, Reason::MissingFile, "tar_member_name is null or empty".into())
            });
        };
        let mut notes: Vec<Entry> =
            flags.into_iter().map(|(reason, detail)| Entry::new(&row, reason, detail)).collect();
        // `decide` names its method whenever it changes the label.
        if let Some(method) = decision.method.filter(|_| decision.retagged) {
            let mut e = Entry::new(
                &row,
                Reason::Retagged,
                format!(
                    "{:?} -> {:?} by {} (confidence {:.3})",
                    label_code,
                    decision.language,
                    method.name(),
                    decision.confidence
                ),
            );
            e.retag = Some(Retag {
                from: label_code,
                to: decision.language.clone(),
                method,
                confidence: decision.confidence,
            });
            notes.push(e);
        }
        let ready = Ready { segment_id, text: cleaned, language: decision.language, audio, row };
        Ok(Kept { ready, notes })
    }

    /// The duration and quality filters.
    fn filter(&self, row: &ManifestRow) -> Option<Entry> {
        let o = self.opts;
        let drop = |detail| Some(Entry::new(row, Reason::FilteredDuration, detail));
        if o.min_duration.is_some() || o.max_duration.is_some() {
            let Some(d) = row.duration else {
                return drop("duration is null".into());
            };
            let (lo, hi) = (
                o.min_duration.unwrap_or(f64::NEG_INFINITY),
                o.max_duration.unwrap_or(f64::INFINITY),
            );
            // NaN fails both comparisons and is filtered too.
            if !(d >= lo && d <= hi) {
                return drop(format!("duration {d} s outside [{lo}, {hi}]"));
            }
        }
        if let Some(min) = o.min_quality {
            match row.quality {
                Some(q) if q >= min => {}
                q => {
                    return Some(Entry::new(
                        row,
                        Reason::FilteredQuality,
                        format!("quality score {q:?} below {min}"),
                    ))
                }
            }
        }
        None
    }
}
