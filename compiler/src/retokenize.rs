//! Re-tokenizing a corpus with another SentencePiece model without touching its audio: every
//! utterance's PCM, segment id, transcript, language and source are copied from the input
//! corpus; only the token ids, the embedded tokenizer and the metadata that describes them
//! change. Nothing is decoded or resampled, so it costs a read of the corpus and a write.

use std::path::{Path, PathBuf};

use asr_corpus::{Corpus, FormatError, WriteError, WriterOptions};

use crate::records::{create_writer, for_each_record, utterance};
use crate::tokenize::{LangPrefix, TokenizeError, Tokenizer};

/// What to re-tokenize, with what, and where to.
#[derive(Debug, Clone)]
pub struct RetokenizeOptions {
    /// The corpus to read.
    pub input: PathBuf,
    /// The new SentencePiece model.
    pub tokenizer: PathBuf,
    /// The corpus to write (not the input).
    pub output: PathBuf,
    /// When the `<|lang|>` prefix is tokenized.
    pub lang_prefix: LangPrefix,
    /// Token sequences are cut at this length.
    pub max_tokens: usize,
}

/// What a re-tokenization did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetokenizeSummary {
    /// Utterances in the input.
    pub utterances: u64,
    /// Utterances written.
    pub kept: u64,
    /// Utterances the new model cannot tokenize: (index, segment id, reason); not written.
    pub dropped: Vec<(u64, String, String)>,
    /// Token sequences cut at `max_tokens`.
    pub truncated: u64,
    /// Utterances tokenized with the `<|lang|>` prefix.
    pub prefixed: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// Why a re-tokenization could not run.
#[derive(Debug, thiserror::Error)]
pub enum RetokenizeError {
    /// The input corpus cannot be opened or read.
    #[error("reading {path}: {source}")]
    Input {
        /// The input corpus.
        path: PathBuf,
        /// What the reader said.
        source: FormatError,
    },
    /// The tokenizer cannot be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
    /// The output cannot be written.
    #[error("writing {path}: {source}")]
    Output {
        /// The output corpus.
        path: PathBuf,
        /// What the writer said.
        source: WriteError,
    },
    /// An option no run can use.
    #[error("{0}")]
    Options(String),
}

/// Re-tokenizes `opts.input` into `opts.output` (written atomically: on an error nothing is
/// left at `opts.output`).
pub fn retokenize(opts: &RetokenizeOptions) -> Result<RetokenizeSummary, RetokenizeError> {
    if opts.max_tokens == 0 {
        return Err(RetokenizeError::Options("--max-tokens must be at least 1".into()));
    }
    if same_file(&opts.input, &opts.output) {
        return Err(RetokenizeError::Options(format!(
            "the output {} is the input: write the re-tokenized corpus to a new file",
            opts.output.display()
        )));
    }
    let input_err = |source| RetokenizeError::Input { path: opts.input.clone(), source };
    let output_err = |source| RetokenizeError::Output { path: opts.output.clone(), source };
    let corpus = Corpus::open(&opts.input).map_err(input_err)?;
    let tokenizer = Tokenizer::open(&opts.tokenizer)?;

    let mut wopts = WriterOptions::new(
        tokenizer.vocab_size(),
        "sentencepiece",
        tokenizer.model_bytes().to_vec(),
    );
    wopts.text_block_size = corpus.header().text_block_size;
    wopts.compile = params(&corpus, opts);
    let mut writer = create_writer(&opts.output, wopts).map_err(output_err)?;

    let mut summary = RetokenizeSummary { utterances: corpus.len() as u64, ..Default::default() };
    for_each_record(&corpus, input_err, |i, record| {
        let language = corpus.language_code(i);
        let encoded =
            match tokenizer.encode(language, record.text, opts.lang_prefix, opts.max_tokens) {
                Ok(e) if !e.ids.is_empty() => e,
                Ok(_) => {
                    let why = "the new model gives no tokens".to_owned();
                    summary.dropped.push((i as u64, record.segment_id.to_owned(), why));
                    return Ok(());
                }
                Err(e) => {
                    summary.dropped.push((i as u64, record.segment_id.to_owned(), e.to_string()));
                    return Ok(());
                }
            };
        summary.truncated += u64::from(encoded.truncated);
        summary.prefixed += u64::from(encoded.prefixed);
        writer.push(&utterance(&corpus, i, &record, &encoded.ids)).map_err(output_err)?;
        summary.kept += 1;
        Ok(())
    })?;
    let written = writer.finish().map_err(output_err)?;
    summary.bytes = written.bytes;
    Ok(summary)
}

/// The input's `metadata.compile`, with the tokenization parameters replaced and where the
/// corpus came from added.
fn params(corpus: &Corpus, opts: &RetokenizeOptions) -> serde_json::Value {
    let name = |p: &Path| p.file_name().map_or(String::new(), |n| n.to_string_lossy().into());
    let mut p = match &corpus.metadata().compile {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    p.insert("tokenizer".into(), name(&opts.tokenizer).into());
    p.insert(
        "lang_prefix".into(),
        serde_json::to_value(opts.lang_prefix)
            .expect("a unit enum variant serializes to a JSON string"),
    );
    p.insert("max_tokens".into(), opts.max_tokens.into());
    p.insert("retokenized_from".into(), name(&opts.input).into());
    serde_json::Value::Object(p)
}

/// Whether two paths name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}
