//! Hand-corrupted corpora, one per rule: each is rejected with the exact message a user sees.
//! Corruptions that target a rule behind a checksum repair the checksums first.

use asr_corpus::layout::{header_offset as ho, SECTION_ENTRY_BYTES};
use asr_corpus::{Corpus, CorpusWriter, SectionKind, UtteranceIn, WriterOptions};

use crate::common::{check, put_u16, put_u32, put_u64, range, refresh_checksums, tiny_bytes};

/// Applies `mutate` to the golden corpus and returns the first error.
fn corrupt(mutate: impl FnOnce(&mut Vec<u8>), repair: bool) -> String {
    let mut b = tiny_bytes();
    mutate(&mut b);
    if repair {
        refresh_checksums(&mut b);
    }
    check(&b).expect("corruption was accepted")
}

fn entry_at(i: usize) -> usize {
    ho::SECTION_TABLE + i * SECTION_ENTRY_BYTES
}

fn replace_in_metadata(b: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let r = range(b, SectionKind::Metadata);
    let text = std::str::from_utf8(&b[r.clone()]).unwrap().to_string();
    let at = text.find(from).unwrap_or_else(|| panic!("{from} not in {text}"));
    b[r.start + at..r.start + at + to.len()].copy_from_slice(to.as_bytes());
}

#[test]
fn each_corruption_gets_its_precise_message() {
    let cases: Vec<(&str, String, &str)> = vec![
        ("truncated header", corrupt(|b| b.truncate(100), false),
         "file is 100 bytes, shorter than the 4096-byte header"),
        ("bad magic", corrupt(|b| b[0] = b'P', false),
         "bad magic at byte 0: expected 89 41 53 52 43 0d 0a 1a, found 50 41 53 52 43 0d 0a 1a"),
        ("byte-swapped endian marker", corrupt(|b| put_u32(b, 16, 0x0403_0201), false),
         "endian marker at byte 16 is 0x04030201, expected 0x01020304"),
        ("future reader version", corrupt(|b| { put_u32(b, 8, 3); put_u32(b, 12, 2) }, true),
         "unsupported format version 3 (needs a reader of version >= 2; this reader supports 1..=1)"),
        ("header bit flip", corrupt(|b| b[40] ^= 4, false),
         "header checksum mismatch"),
        ("reserved byte set", corrupt(|b| b[80] = 7, true),
         "header field reserved at byte 80: expected 0, found 7"),
        ("wrong sample rate", corrupt(|b| put_u32(b, 56, 8000), true),
         "header field sample_rate at byte 56: expected 16000, found 8000"),
        ("token width not matching vocab", corrupt(|b| put_u32(b, 60, 4), true),
         "header field token_width at byte 60: expected 2 for vocab_size 40, found 4"),
        ("section moved", corrupt(|b| put_u64(b, entry_at(1) + 8, 4096 * 7), true),
         "section table entry 1 (NUM_SAMPLES): offset 28672, expected 8192"),
        ("trailing bytes", corrupt(|b| b.extend_from_slice(&[0; 4096]), false),
         "bytes, the section table says"),
        ("truncated last page", corrupt(|b| { let n = b.len() - 4096; b.truncate(n) }, false),
         "the section table says"),
        ("unknown required kind", corrupt(|b| put_u32(b, entry_at(0), 99), true),
         "section table entry 0: unknown required section kind 99"),
        ("optional unknown kind replacing PCM", corrupt(|b| { put_u32(b, entry_at(0), 99); put_u32(b, entry_at(0) + 4, 1) }, true),
         "required section PCM is missing from the section table"),
        ("undefined flag", corrupt(|b| put_u32(b, entry_at(2) + 4, 2), true),
         "section table entry 2 (PCM_OFFSETS): undefined flag bits 0x2"),
        ("duplicate section", corrupt(|b| put_u32(b, entry_at(2), 3), true),
         "section NUM_SAMPLES appears twice (table entries 1 and 2)"),
        ("wrong array length", corrupt(|b| { put_u64(b, 32, 2) }, true),
         "section NUM_SAMPLES is 12 bytes, expected 8"),
        ("zero-length utterance", corrupt(|b| { let r = range(b, SectionKind::NumSamples); put_u32(b, r.start + 4, 0) }, true),
         "NUM_SAMPLES[1]: is 0, expected 1..=9600000"),
        ("overlapping PCM", corrupt(|b| { let r = range(b, SectionKind::PcmOffsets); put_u64(b, r.start + 16, 3) }, true),
         "PCM_OFFSETS[2]: is 3, expected 12 (utterances are back to back)"),
        ("decreasing token offsets", corrupt(|b| { let r = range(b, SectionKind::TokenOffsets); put_u64(b, r.start + 16, 1) }, true),
         "TOKEN_OFFSETS[2]: is 1 after 3: utterance 1 would have -2 tokens, expected 0..=16384"),
        ("language id out of table", corrupt(|b| { let r = range(b, SectionKind::Languages); put_u16(b, r.start, 7) }, true),
         "LANGUAGES[0]: is 7, expected < 2 (entries in the metadata table)"),
        ("metadata disagrees with header", corrupt(|b| replace_in_metadata(b, "\"utterances\":3", "\"utterances\":4"), true),
         "METADATA: stats.utterances is 4, the header and section table say 3"),
        ("metadata not JSON", corrupt(|b| { let r = range(b, SectionKind::Metadata); b[r.start] = b'x' }, true),
         "METADATA: invalid JSON"),
        ("text frame misplaced", corrupt(|b| { let r = range(b, SectionKind::TextIndex); put_u64(b, r.start + 16, 5) }, true),
         "TEXT_INDEX[1]: offset is 5, expected"),
        ("PCM bit flip", corrupt(|b| { let r = range(b, SectionKind::Pcm); b[r.start + 3] ^= 1 }, false),
         "section PCM (bytes 4096..4126): checksum mismatch"),
        ("PCM edited, checksum repaired", corrupt(|b| { let r = range(b, SectionKind::Pcm); b[r.start + 3] ^= 1 }, true),
         "utterance 0: audio hash stored"),
        ("token out of vocabulary", corrupt(|b| { let r = range(b, SectionKind::Tokens); put_u16(b, r.start + 8, 40) }, true),
         "utterance 2: token 1 is 40, expected < vocab_size 40"),
        ("padding byte set", corrupt(|b| { let r = range(b, SectionKind::Pcm); b[r.end + 10] = 1 }, false),
         "padding byte at offset 4136 is 0x01, expected 0"),
        ("text frame garbled", corrupt(|b| { let r = range(b, SectionKind::TextBlocks); b[r.start + 6] ^= 0xff }, true),
         "text block 0 (utterances 0..)"),
        ("tokenizer edited", corrupt(|b| { let r = range(b, SectionKind::Tokenizer); b[r.start] ^= 1 }, true),
         "METADATA: tokenizer.model_xxh3 is"),
    ];
    let mut failures = Vec::new();
    for (name, got, want) in &cases {
        if !got.contains(want) {
            failures.push(format!("{name}:\n  got:  {got}\n  want: {want}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn stats_that_disagree_with_the_arrays_are_caught() {
    // Languages "en" and "hi" swapped in stats: same shapes, wrong counts.
    let mut b = tiny_bytes();
    let r = range(&b, SectionKind::Metadata);
    let text = std::str::from_utf8(&b[r.clone()]).unwrap().to_string();
    let swapped = text.replace("\"en\":{\"utterances\":2", "\"en\":{\"utterances\":1");
    assert_ne!(swapped, text);
    b[r].copy_from_slice(swapped.as_bytes());
    refresh_checksums(&mut b);
    let e = check(&b).unwrap();
    assert!(e.starts_with("METADATA: stats.per_language[\"en\"]"), "{e}");
}

#[test]
fn repeated_segment_ids_are_caught() {
    let mut o = WriterOptions::new(10, "none", Vec::new());
    o.text_block_size = 2;
    let mut w = CorpusWriter::in_memory(o).unwrap();
    for id in ["a", "b", "c", "b"] {
        w.push(&UtteranceIn {
            segment_id: id,
            text: "",
            language: "en",
            source: "",
            pcm: &[1],
            tokens: &[],
        })
        .unwrap();
    }
    let bytes = w.finish().unwrap().data.unwrap();
    let e = Corpus::from_bytes(&bytes).unwrap().verify().unwrap_err();
    assert_eq!(e.to_string(), "segment id \"b\" is used by utterances 1 and 3");
}

#[test]
fn misaligned_memory_is_refused_not_misread() {
    let good = tiny_bytes();
    let mut shifted = vec![0u8; good.len() + 1];
    shifted[1..].copy_from_slice(&good);
    // `from_bytes` copies into an aligned buffer, so any slice is fine...
    assert!(Corpus::from_bytes(&shifted[1..]).is_ok());
}
