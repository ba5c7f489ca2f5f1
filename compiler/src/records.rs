//! Walking a corpus's text records in utterance order (for the commands that rewrite a corpus).

use asr_corpus::{Corpus, FormatError, TextRecord};

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
