//! Joining the parts of a compile (`asrc compile --part I/N`) into the corpus one compile of the
//! whole input writes.
//!
//! Each part already dropped what it duplicates of the rows before it (row and segment-id
//! deduplication saw every earlier row); what is left is the audio rule across parts: an
//! utterance whose decoded audio (sample count and xxh3-64 of the PCM, as the corpus stores
//! them) equals an earlier part's kept utterance is dropped, first part wins, exactly as one
//! compile's stage 3 would have. Utterances keep their order, part after part, and go through the
//! same writer with the same parameters, so the merged file is byte for byte the single compile's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use asr_corpus::{Corpus, CorpusWriter, FormatError, UtteranceIn, WriteError, WriterOptions};

use crate::records::for_each_record;

/// What a merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeSummary {
    /// Parts joined.
    pub parts: u32,
    /// Utterances in the parts.
    pub utterances: u64,
    /// Utterances written.
    pub kept: u64,
    /// Dropped as `duplicate_audio` of an earlier part's utterance: (segment id, the first
    /// occurrence's segment id).
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

    let info = &first.metadata().tokenizer;
    let mut wopts =
        WriterOptions::new(info.vocab_size, &info.kind, first.tokenizer_model().to_vec());
    wopts.text_block_size = first.header().text_block_size;
    wopts.compile = params;
    let output_err = |source| MergeError::Output { path: output.to_owned(), source };
    if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| {
            output_err(WriteError::Io {
                action: "creating the directory",
                path: parent.into(),
                source,
            })
        })?;
    }
    let mut writer = CorpusWriter::create(output, wopts).map_err(output_err)?;
    let mut summary = MergeSummary { parts: n, ..Default::default() };
    let mut seen: HashMap<(u64, u32), String> = HashMap::new();
    for (_, path, c) in &opened {
        let input_err = |source| MergeError::Input { path: (*path).clone(), source };
        for_each_record(c, input_err, |i, record| {
            summary.utterances += 1;
            let key = (c.audio_hashes()[i], c.num_samples()[i]);
            if let Some(first_id) = seen.get(&key) {
                // Within a part the compile already dropped duplicates; this one repeats an
                // earlier part's.
                summary.duplicate_audio.push((record.segment_id.to_owned(), first_id.clone()));
                return Ok(());
            }
            let tokens = c.tokens(i).to_vec();
            writer
                .push(&UtteranceIn {
                    segment_id: record.segment_id,
                    text: record.text,
                    language: c.language_code(i),
                    source: c.source_name(i),
                    pcm: c.pcm(i),
                    tokens: &tokens,
                })
                .map_err(output_err)?;
            summary.kept += 1;
            seen.insert(key, record.segment_id.to_owned());
            Ok(())
        })?;
    }
    summary.bytes = writer.finish().map_err(output_err)?.bytes;
    Ok(summary)
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
