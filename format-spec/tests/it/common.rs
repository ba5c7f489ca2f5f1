//! Fixtures and byte-level helpers shared by the test modules.

use asr_corpus::layout::{self, header_offset as ho, SectionEntry, SECTION_ENTRY_BYTES};
use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, SectionKind, UtteranceIn, WriterOptions};

/// Model bytes of the golden fixture: not a real SentencePiece model, only opaque bytes to hash.
pub const TINY_MODEL: &[u8] = b"fixture tokenizer bytes: not a real sentencepiece model";

/// The utterances of `testdata/v1/tiny.asrcorpus`.
pub fn tiny_table(
) -> Vec<(&'static str, &'static str, &'static str, &'static str, Vec<i16>, Vec<u32>)> {
    vec![
        ("tiny-0", "hello world", "en", "read", vec![0, 1000, -1000, 32767, -32768], vec![1, 2, 3]),
        ("tiny-1", "नमस्ते दुनिया", "hi", "conversational", vec![5, -5, 5, -5, 5, -5, 7], vec![]),
        ("tiny-2", "", "en", "read", vec![1, 2, 3], vec![39, 0]),
    ]
}

pub fn tiny_options() -> WriterOptions {
    let mut o = WriterOptions::new(40, "sentencepiece", TINY_MODEL.to_vec());
    o.text_block_size = 2;
    o.compile = serde_json::json!({ "fixture": "tiny golden corpus", "lang_prefix": "never" });
    o
}

/// The golden corpus as this version of the writer produces it.
pub fn tiny_bytes() -> Vec<u8> {
    let mut w = CorpusWriter::in_memory(tiny_options()).unwrap();
    for (id, text, lang, src, pcm, tokens) in tiny_table() {
        w.push(&UtteranceIn {
            segment_id: id,
            text,
            language: lang,
            source: src,
            pcm: &pcm,
            tokens: &tokens,
        })
        .unwrap();
    }
    w.finish().unwrap().data.unwrap()
}

/// A synthetic corpus of `n` utterances.
pub fn synth_bytes(n: u64, spec: &SynthSpec, block: u32) -> Vec<u8> {
    let mut o = WriterOptions::new(spec.vocab_size, "none", Vec::new());
    o.text_block_size = block;
    let mut w = CorpusWriter::in_memory(o).unwrap();
    for i in 0..n {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    w.finish().unwrap().data.unwrap()
}

/// Byte range of a section, read from a valid corpus.
pub fn range(bytes: &[u8], kind: SectionKind) -> std::ops::Range<usize> {
    Corpus::from_bytes(bytes).unwrap().section_range(kind)
}

pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Recomputes every section checksum (for sections inside the file) and the header checksum,
/// so that a deliberate corruption reaches the rule it targets instead of a checksum rule.
pub fn refresh_checksums(b: &mut [u8]) {
    if b.len() < layout::HEADER_SIZE as usize {
        return;
    }
    let count = u32::from_le_bytes(b[ho::SECTION_COUNT..ho::SECTION_COUNT + 4].try_into().unwrap());
    for i in 0..(count.min(layout::MAX_SECTIONS) as usize) {
        let at = ho::SECTION_TABLE + i * SECTION_ENTRY_BYTES;
        let mut e = SectionEntry::from_bytes(b[at..at + SECTION_ENTRY_BYTES].try_into().unwrap());
        let end = e.offset.checked_add(e.length);
        if let Some(end) = end.filter(|&end| end <= b.len() as u64) {
            e.checksum = xxhash_rust::xxh3::xxh3_64(&b[e.offset as usize..end as usize]);
            b[at..at + SECTION_ENTRY_BYTES].copy_from_slice(&e.to_bytes());
        }
    }
    let sum = layout::header_checksum(&b[..layout::HEADER_SIZE as usize]);
    put_u64(b, ho::HEADER_CHECKSUM, sum);
}

/// Opens and verifies; the first error's message, or `None` if the corpus is valid.
pub fn check(bytes: &[u8]) -> Option<String> {
    match Corpus::from_bytes(bytes).and_then(|c| c.verify().map(|_| ())) {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// Rebuilds a valid corpus with new contents for some sections: the others are copied, every
/// section is placed back to back again and every checksum is recomputed, so that the result
/// breaks only the rule the new contents break.
pub fn with_sections(bytes: &[u8], replace: &[(SectionKind, Vec<u8>)]) -> Vec<u8> {
    let c = Corpus::from_bytes(bytes).unwrap();
    let mut header = c.header().clone();
    let mut body = Vec::new();
    let mut pos = layout::HEADER_SIZE;
    for e in &mut header.sections {
        let kind = SectionKind::from_code(e.kind).unwrap();
        let data = match replace.iter().find(|(k, _)| *k == kind) {
            Some((_, d)) => d.clone(),
            None => c.section_bytes(kind).to_vec(),
        };
        e.offset = pos;
        e.length = data.len() as u64;
        e.checksum = xxhash_rust::xxh3::xxh3_64(&data);
        body.extend_from_slice(&data);
        let end = layout::align_up(pos + e.length).unwrap();
        body.resize((end - layout::HEADER_SIZE) as usize, 0);
        pos = end;
    }
    let mut out = header.to_bytes().unwrap();
    out.extend_from_slice(&body);
    out
}

/// Replaces the METADATA JSON text (`edit` gets the writer's compact JSON).
pub fn with_metadata(bytes: &[u8], edit: impl FnOnce(&str) -> String) -> Vec<u8> {
    let c = Corpus::from_bytes(bytes).unwrap();
    let json = std::str::from_utf8(c.section_bytes(SectionKind::Metadata)).unwrap();
    with_sections(bytes, &[(SectionKind::Metadata, edit(json).into_bytes())])
}

/// The decompressed bytes of every text block, with its record count.
pub fn raw_text_blocks(bytes: &[u8]) -> Vec<Vec<u8>> {
    let c = Corpus::from_bytes(bytes).unwrap();
    let index = c.section_bytes(SectionKind::TextIndex);
    let blocks = c.section_bytes(SectionKind::TextBlocks);
    index
        .chunks_exact(layout::TEXT_INDEX_ENTRY_BYTES)
        .map(|e| {
            let e = layout::TextIndexEntry::from_bytes(e);
            let frame = &blocks[e.offset as usize..][..e.compressed_len as usize];
            zstd::bulk::decompress(frame, e.raw_len as usize).unwrap()
        })
        .collect()
}

/// Replaces TEXT_BLOCKS by `frames` (stored bytes and raw_len of each block) and rewrites
/// TEXT_INDEX to match.
pub fn with_text_frames(bytes: &[u8], frames: &[(Vec<u8>, u32)]) -> Vec<u8> {
    let (mut index, mut blocks) = (Vec::new(), Vec::new());
    for (frame, raw_len) in frames {
        let e = layout::TextIndexEntry {
            offset: blocks.len() as u64,
            compressed_len: frame.len() as u32,
            raw_len: *raw_len,
        };
        index.extend_from_slice(&e.to_bytes());
        blocks.extend_from_slice(frame);
    }
    with_sections(bytes, &[(SectionKind::TextIndex, index), (SectionKind::TextBlocks, blocks)])
}

/// Replaces text block `b` by `frame` (which decompresses to `raw_len` bytes); the other blocks
/// are compressed as the writer does.
pub fn with_text_frame(bytes: &[u8], b: usize, frame: Vec<u8>, raw_len: usize) -> Vec<u8> {
    let frames: Vec<(Vec<u8>, u32)> = raw_text_blocks(bytes)
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            if i == b {
                (frame.clone(), raw_len as u32)
            } else {
                (zstd::bulk::compress(&raw, 9).unwrap(), raw.len() as u32)
            }
        })
        .collect();
    with_text_frames(bytes, &frames)
}
