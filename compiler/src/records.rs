//! What the commands that rewrite a corpus (`asrc merge`, `asrc retokenize`) share: walking its
//! text records in utterance order, copying an utterance, and creating the output.

use std::path::Path;

use asr_corpus::{
    Corpus, CorpusWriter, FormatError, TextRecord, UtteranceIn, WriteError, WriterOptions,
};

/// Calls `f(i, record)` for every utterance `i` in order, decompressing each text block once.
/// A block that cannot be read becomes `input_err`'s error; `f`'s errors are returned as they are.
pub(crate) fn for_each_record<E>(
    corpus: &Corpus,
    input_err: impl Fn(FormatError) -> E,
    mut f: impl FnMut(usize, TextRecord<'_>) -> Result<(), E>,
) -> Result<(), E> {
    for b in 0..corpus.text_block_count() {
        let block = corpus.text_block(b).map_err(&input_err)?;
        let first = block.first_utterance() as usize;
        for j in 0..block.len() {
            let record = block.get(j).ok_or_else(|| {
                input_err(FormatError::TextBlock {
                    block: b as u64,
                    first: first as u64,
                    message: format!("has no record for utterance {}", first + j),
                })
            })?;
            f(first + j, record)?;
        }
    }
    Ok(())
}

/// Utterance `i` of `corpus` (its `record`) as the writer takes it, with `tokens`.
pub(crate) fn utterance<'a>(
    corpus: &'a Corpus,
    i: usize,
    record: &TextRecord<'a>,
    tokens: &'a [u32],
) -> UtteranceIn<'a> {
    UtteranceIn {
        segment_id: record.segment_id,
        text: record.text,
        language: corpus.language_code(i),
        source: corpus.source_name(i),
        pcm: corpus.pcm(i),
        tokens,
    }
}

/// A writer for `output`, the missing directories above it created first.
pub(crate) fn create_writer(
    output: &Path,
    opts: WriterOptions,
) -> Result<CorpusWriter, WriteError> {
    crate::output::create_parent(output).map_err(|(path, source)| WriteError::Io {
        action: "creating the directory",
        path,
        source,
    })?;
    CorpusWriter::create(output, opts)
}
