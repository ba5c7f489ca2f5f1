//! Joining the parts of a compile (`asrc compile --part I/N`) into the corpus one compile of the
//! whole input writes.
//!
//! Each part already dropped what it duplicates of the rows before it (row and segment-id
//! deduplication saw every earlier row); what is left is the audio rule across parts: an
//! utterance whose decoded audio (sample count and xxh3-64 of the PCM, as the corpus stores
//! them) equals an earlier part's kept utterance is dropped, first part wins, exactly as one
//! compile's stage 3 would have. Utterances keep their order, part after part, and go through the
//! same writer with the same parameters, so the merged file is byte for byte the single compile's.
//!
//! The parts' reports are merged too: counts and hours summed (each part counted only its own
//! rows), the drops across parts added, the entries concatenated in part order (row order) with
//! the cross-part drops at the end (naming their part: the corpus does not keep manifest rows).

use std::path::{Path, PathBuf};

use asr_corpus::{Corpus, FormatError, WriteError, WriterOptions};

use crate::compile::report::{Reason, Summary};
use crate::dedup::Deduper;
use crate::records::{create_writer, for_each_record, utterance};

/// What a merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeSummary {
    /// Parts joined.
    pub parts: u32,
    /// Utterances in the parts.
    pub utterances: u64,
    /// Utterances written.
    pub kept: u64,
    /// Dropped as `duplicate_audio` of an earlier part's utterance: (segment id, the report's
    /// detail naming the first occurrence).
    pub duplicate_audio: Vec<(String, String)>,
    /// Bytes written.
    pub bytes: u64,
}

/// Why parts cannot be merged. Nothing is written then.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A part cannot be read.
    #[error("reading {path}: {source}")]
    Input {
        /// The part.
        path: PathBuf,
        /// What the reader said.
        source: FormatError,
    },
    /// The files are not the parts of one compile.
    #[error("{0}")]
    Parts(String),
    /// A part's report (`<part>.report.json` / `.report.jsonl`) cannot be read, or the merged
    /// one written.
    #[error("{action} {path}: {message}")]
    Report {
        /// What was being done.
        action: &'static str,
        /// The report file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The output cannot be written.
    #[error("writing {path}: {source}")]
    Output {
        /// The output corpus.
        path: PathBuf,
        /// What the writer said.
        source: WriteError,
    },
}

/// Merges `parts` (any order) into `output`.
pub fn merge(parts: &[PathBuf], output: &Path) -> Result<MergeSummary, MergeError> {
    let mut opened: Vec<(u32, &PathBuf, Corpus)> = Vec::with_capacity(parts.len());
    let mut count: Option<(u32, &PathBuf)> = None;
    for path in parts {
        let corpus = Corpus::open(path)
            .map_err(|source| MergeError::Input { path: path.clone(), source })?;
        let (i, n) = part_of(&corpus).ok_or_else(|| {
            MergeError::Parts(format!(
                "{} is not a part: its metadata.compile has no \"part\" (compile it with --part I/N)",
                path.display()
            ))
        })?;
        match count {
            Some((m, first)) if m != n => {
                return Err(MergeError::Parts(format!(
                    "{} is a part of {n}, {} a part of {m}: not the same compile",
                    path.display(),
                    first.display()
                )))
            }
            _ => count = Some((n, path)),
        }
        if let Some((_, other, _)) = opened.iter().find(|(j, _, _)| *j == i) {
            return Err(MergeError::Parts(format!(
                "{} and {} are both part {i}/{n}: the parts overlap",
                other.display(),
                path.display()
            )));
        }
        opened.push((i, path, corpus));
    }
    let Some((n, _)) = count else {
        return Err(MergeError::Parts("no parts given".into()));
    };
    let missing: Vec<String> = (0..n)
        .filter(|i| !opened.iter().any(|(j, _, _)| j == i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::Parts(format!("missing part(s) {}", missing.join(", "))));
    }
    opened.sort_by_key(|(i, _, _)| *i);

    // Every part must come from the same compile: same tokenizer, format and parameters.
    let (_, first_path, first) = &opened[0];
    let params = without_part(&first.metadata().compile);
    for (_, path, c) in &opened[1..] {
        let differs = |what: &str| {
            MergeError::Parts(format!(
                "{} and {} differ in {what}: not parts of the same compile",
                first_path.display(),
                path.display()
            ))
        };
        if c.tokenizer_model() != first.tokenizer_model() {
            return Err(differs("their tokenizer model"));
        }
        if c.header().format_version != first.header().format_version
            || c.header().sample_rate != first.header().sample_rate
            || c.header().text_block_size != first.header().text_block_size
        {
            return Err(differs("format version, sample rate or text block size"));
        }
        if without_part(&c.metadata().compile) != params {
            return Err(differs("their compile parameters (metadata.compile)"));
        }
    }

    // The parts' reports, read before anything is written.
    let mut reports = Vec::with_capacity(opened.len());
    for (_, path, _) in &opened {
        let (json, jsonl) = crate::compile::report_paths(path);
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| MergeError::Report {
                action: "reading the part's report",
                path: p.to_owned(),
                message: e.to_string(),
            })
        };
        let summary: Summary =
            serde_json::from_str(&read(&json)?).map_err(|e| MergeError::Report {
                action: "reading the part's report",
                path: json.clone(),
                message: e.to_string(),
            })?;
        reports.push((summary, read(&jsonl)?));
    }

    let info = &first.metadata().tokenizer;
    let mut wopts =
        WriterOptions::new(info.vocab_size, &info.kind, first.tokenizer_model().to_vec());
    wopts.text_block_size = first.header().text_block_size;
    wopts.compile = params;
    let output_err = |source| MergeError::Output { path: output.to_owned(), source };
    let mut writer = create_writer(output, wopts).map_err(output_err)?;
    let mut summary = MergeSummary { parts: n, ..Default::default() };
    let mut dedup = Deduper::new();
    let mut dropped_hours: Vec<(Reason, String, f64)> = Vec::new();
    let mut drop_entries = String::new();
    for (part, path, c) in &opened {
        let input_err = |source| MergeError::Input { path: (*path).clone(), source };
        for_each_record(c, input_err, |i, record| {
            summary.utterances += 1;
            // Stage 3's rule, with one compile's deduper: within a part the compile already
            // dropped duplicates, so what it finds repeats an earlier part's utterance.
            let samples = c.num_samples()[i];
            if let Some(dup) =
                dedup.check_audio(record.segment_id, c.audio_hashes()[i], samples as usize)
            {
                let detail = dup.detail();
                let hours = f64::from(samples) / f64::from(c.header().sample_rate) / 3600.0;
                dropped_hours.push((dup.reason(), c.language_code(i).to_owned(), hours));
                let entry = serde_json::json!({
                    "segment_id": record.segment_id,
                    "kind": "dropped",
                    "reason": dup.reason(),
                    "detail": detail,
                    "part": part,
                });
                drop_entries.push_str(&entry.to_string());
                drop_entries.push('\n');
                summary.duplicate_audio.push((record.segment_id.to_owned(), detail));
                return Ok(());
            }
            let tokens = c.tokens(i).to_vec();
            writer.push(&utterance(c, i, &record, &tokens)).map_err(output_err)?;
            summary.kept += 1;
            Ok(())
        })?;
    }
    summary.bytes = writer.finish().map_err(output_err)?.bytes;
    write_report(output, &reports, &summary, &dropped_hours, &drop_entries)?;
    Ok(summary)
}

/// The merged `<output>.report.json` and `.report.jsonl`: the parts' summaries added up
/// ([`Summary::add`]), less the rows dropped here as duplicates of an earlier part's audio.
fn write_report(
    output: &Path,
    reports: &[(Summary, String)],
    summary: &MergeSummary,
    dropped: &[(Reason, String, f64)],
    drop_entries: &str,
) -> Result<(), MergeError> {
    let (json_path, jsonl_path) = crate::compile::report_paths(output);
    let mut merged = reports.first().map(|r| r.0.clone()).unwrap_or_default();
    for (r, _) in reports.iter().skip(1) {
        merged.add(r);
    }
    for (reason, language, hours) in dropped {
        merged.drop_kept(*reason, language, *hours);
    }
    // The merged file's own.
    merged.output = output.display().to_string();
    merged.entries_file = jsonl_path.display().to_string();
    merged.corpus_bytes = summary.bytes;
    merged.parts = Some(reports.len() as u32);
    merged.set_realtime_factors();
    let write = |p: &Path, text: &str| {
        std::fs::write(p, text).map_err(|e| MergeError::Report {
            action: "writing the merged report",
            path: p.to_owned(),
            message: e.to_string(),
        })
    };
    let mut lines: String = reports.iter().map(|r| r.1.as_str()).collect();
    lines.push_str(drop_entries);
    write(&jsonl_path, &lines)?;
    let text = serde_json::to_string_pretty(&merged).map_err(|e| MergeError::Report {
        action: "encoding the merged report",
        path: json_path.clone(),
        message: e.to_string(),
    })?;
    write(&json_path, &(text + "\n"))
}

/// `(I, N)` from a part's `metadata.compile.part` ("I/N").
fn part_of(c: &Corpus) -> Option<(u32, u32)> {
    let s = c.metadata().compile.get("part")?.as_str()?;
    let (i, n) = s.split_once('/')?;
    let (i, n) = (i.parse().ok()?, n.parse().ok()?);
    (i < n).then_some((i, n))
}

/// A compile's parameters without its `part`.
fn without_part(compile: &serde_json::Value) -> serde_json::Value {
    let mut v = compile.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("part");
    }
    v
}
