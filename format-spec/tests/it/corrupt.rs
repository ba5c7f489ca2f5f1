//! Hand-corrupted corpora, one per rule: each is rejected with the exact message a user sees,
//! and valid variants the writer does not produce are accepted. Corruptions that target a rule
//! behind a checksum repair the checksums first (or rebuild the file around new section
//! contents), so that only the rule they target is broken. The Python reference reader gets the
//! same files and must reach the same verdicts.

use std::process::Command;

use asr_corpus::layout::{header_offset as ho, SECTION_ENTRY_BYTES};
use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, SectionKind, UtteranceIn, WriterOptions};
use zstd::zstd_safe::CParameter;

use crate::common::{
    check, put_u16, put_u32, put_u64, range, raw_text_blocks, refresh_checksums, synth_bytes,
    tiny_bytes, with_metadata, with_text_frame, with_text_frames,
};

/// The golden corpus after `mutate`, with checksums repaired if `repair`.
fn bad(mutate: impl FnOnce(&mut Vec<u8>), repair: bool) -> Vec<u8> {
    let mut b = tiny_bytes();
    mutate(&mut b);
    if repair {
        refresh_checksums(&mut b);
    }
    b
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

/// The golden corpus with its METADATA JSON text edited (the file rebuilt around it).
fn meta(edit: impl FnOnce(&str) -> String) -> Vec<u8> {
    with_metadata(&tiny_bytes(), edit)
}

/// `json` with `from` replaced by `to` exactly once.
fn replace_once(json: &str, from: &str, to: &str) -> String {
    assert_eq!(json.matches(from).count(), 1, "{from} in {json}");
    json.replacen(from, to, 1)
}

/// `json` with `member` (`"name":value`) added as the top-level object's first member.
fn add_member(json: &str, member: &str) -> String {
    format!("{{{member},{}", &json[1..])
}

/// Arrays nested `depth` deep.
fn nested(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

/// Text block 0 of the golden corpus, decompressed.
fn raw_block0() -> Vec<u8> {
    raw_text_blocks(&tiny_bytes()).swap_remove(0)
}

/// `raw` as one zstd frame, compressed with the given parameters on top of level 9.
fn frame_with(raw: &[u8], params: &[CParameter]) -> Vec<u8> {
    let mut c = zstd::bulk::Compressor::new(9).unwrap();
    for &p in params {
        c.set_parameter(p).unwrap();
    }
    c.compress(raw).unwrap()
}

/// The golden corpus with text block 0 stored as `frame`.
fn block0_as(frame: Vec<u8>) -> Vec<u8> {
    with_text_frame(&tiny_bytes(), 0, frame, raw_block0().len())
}

/// A skippable zstd frame (RFC 8878 section 3.1.2) holding `data`.
fn skippable(data: &[u8]) -> Vec<u8> {
    let mut f = vec![0x50, 0x2a, 0x4d, 0x18];
    f.extend_from_slice(&(data.len() as u32).to_le_bytes());
    f.extend_from_slice(data);
    f
}

/// `frame` (single-segment, without a dictionary id) rewritten to carry a 1-byte Dictionary_ID.
fn with_dictionary_id(frame: &[u8], id: u8) -> Vec<u8> {
    let fhd = frame[4];
    assert_eq!(fhd & 0x23, 0x20, "single segment, no dictionary id: {fhd:#04x}");
    let mut f = frame[..4].to_vec();
    f.push(fhd | 1);
    f.push(id);
    f.extend_from_slice(&frame[5..]);
    f
}

/// Block 0 with the boundary between record 1's segment id ("tiny-1") and its text (which starts
/// with a 3-byte character) moved one byte into the character: each string is then invalid
/// UTF-8 while the string area as a whole is unchanged and valid.
fn block0_with_split_character() -> Vec<u8> {
    let mut raw = raw_block0();
    let k = 2;
    let at = 4 * 3; // offs[3]: end of record 1's segment id, start of its text
    let off = u32::from_le_bytes(raw[at..at + 4].try_into().unwrap());
    raw[at..at + 4].copy_from_slice(&(off + 1).to_le_bytes());
    let area = &raw[4 * (2 * k + 1)..];
    assert!(std::str::from_utf8(area).is_ok());
    assert!(std::str::from_utf8(&area[off as usize..off as usize + 1]).is_err());
    block0_as(zstd::bulk::compress(&raw, 9).unwrap())
}

/// The golden corpus with `stats.hours` multiplied by `factor`.
fn hours_scaled(factor: f64) -> Vec<u8> {
    meta(|j| {
        let h = asr_corpus::meta::hours(15);
        let from = format!("\"hours\":{},\"per_language\"", serde_json::to_string(&h).unwrap());
        let to =
            format!("\"hours\":{},\"per_language\"", serde_json::to_string(&(h * factor)).unwrap());
        replace_once(j, &from, &to)
    })
}

/// Corrupted files and the message each must be rejected with.
fn rejected_cases() -> Vec<(&'static str, Vec<u8>, String)> {
    let raw0 = raw_block0();
    let frame0 = zstd::bulk::compress(&raw0, 9).unwrap();
    let frame0_checksummed = frame_with(&raw0, &[CParameter::ChecksumFlag(true)]);
    let mut frame0_bad_checksum = frame0_checksummed.clone();
    *frame0_bad_checksum.last_mut().unwrap() ^= 1;
    let golden_json = {
        let b = tiny_bytes();
        let c = Corpus::from_bytes(&b).unwrap();
        String::from_utf8(c.section_bytes(SectionKind::Metadata).to_vec()).unwrap()
    };
    let tokenizer_object = {
        let start = golden_json.find("{\"kind\"").unwrap();
        let end = start + golden_json[start..].find('}').unwrap() + 1;
        golden_json[start..end].to_string()
    };
    let second_frame = zstd::bulk::compress(&[], 9).unwrap();
    let after_frame = |extra: usize| {
        format!(
            "text block 0 (utterances 0..): its zstd frame ends at byte {} of {}",
            frame0.len(),
            frame0.len() + extra
        )
    };
    let two_frames = after_frame(second_frame.len());
    let frame_then_skippable = after_frame(skippable(b"note").len());
    let content_size_not_raw_len = format!(
        "text block 0 (utterances 0..): zstd frame declares a content size of {}, raw_len is {}",
        raw0.len(),
        raw0.len() + 4
    );
    let raw1 = raw_text_blocks(&tiny_bytes()).swap_remove(1);
    let frame1 = (zstd::bulk::compress(&raw1, 9).unwrap(), raw1.len() as u32);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated header", bad(|b| b.truncate(100), false),
         "file is 100 bytes, shorter than the 4096-byte header"),
        ("bad magic", bad(|b| b[0] = b'P', false),
         "bad magic at byte 0: expected 89 41 53 52 43 0d 0a 1a, found 50 41 53 52 43 0d 0a 1a"),
        ("byte-swapped endian marker", bad(|b| put_u32(b, 16, 0x0403_0201), false),
         "endian marker at byte 16 is 0x04030201, expected 0x01020304"),
        ("future reader version", bad(|b| { put_u32(b, 8, 3); put_u32(b, 12, 2) }, true),
         "unsupported format version 3 (needs a reader of version >= 2; this reader supports 1..=1)"),
        ("min_reader_version 0", bad(|b| put_u32(b, 12, 0), true),
         "header field min_reader_version at byte 12: expected 1..=1 (format_version), found 0"),
        ("header bit flip", bad(|b| b[40] ^= 4, false),
         "header checksum mismatch"),
        ("reserved byte set", bad(|b| b[80] = 7, true),
         "header field reserved at byte 80: expected 0, found 7"),
        ("wrong sample rate", bad(|b| put_u32(b, 56, 8000), true),
         "header field sample_rate at byte 56: expected 16000, found 8000"),
        ("token width not matching vocab", bad(|b| put_u32(b, 60, 4), true),
         "header field token_width at byte 60: expected 2 for vocab_size 40, found 4"),
        ("section moved", bad(|b| put_u64(b, entry_at(1) + 8, 4096 * 7), true),
         "section table entry 1 (NUM_SAMPLES): offset 28672, expected 8192"),
        ("trailing bytes", bad(|b| b.extend_from_slice(&[0; 4096]), false),
         "bytes, the section table says"),
        ("truncated last page", bad(|b| { let n = b.len() - 4096; b.truncate(n) }, false),
         "the section table says"),
        ("unknown required kind", bad(|b| put_u32(b, entry_at(0), 99), true),
         "section table entry 0: unknown required section kind 99"),
        ("optional unknown kind replacing PCM", bad(|b| { put_u32(b, entry_at(0), 99); put_u32(b, entry_at(0) + 4, 1) }, true),
         "required section PCM is missing from the section table"),
        ("undefined flag", bad(|b| put_u32(b, entry_at(2) + 4, 2), true),
         "section table entry 2 (PCM_OFFSETS): flags are 0x2, expected 0 (every kind this version defines is required)"),
        ("OPTIONAL flag on a known kind", bad(|b| put_u32(b, entry_at(2) + 4, 1), true),
         "section table entry 2 (PCM_OFFSETS): flags are 0x1, expected 0 (every kind this version defines is required)"),
        ("undefined flag on an unknown optional kind", bad(|b| { put_u32(b, entry_at(0), 99); put_u32(b, entry_at(0) + 4, 3) }, true),
         "section table entry 0 (kind 99): flags are 0x3, expected 0 or 0x1 (OPTIONAL)"),
        ("duplicate section", bad(|b| put_u32(b, entry_at(2), 3), true),
         "section NUM_SAMPLES appears twice (table entries 1 and 2)"),
        ("wrong array length", bad(|b| { put_u64(b, 32, 2) }, true),
         "section NUM_SAMPLES is 12 bytes, expected 8"),
        ("TEXT_INDEX length follows K", bad(|b| put_u32(b, ho::TEXT_BLOCK_SIZE, 3), true),
         "section TEXT_INDEX is 32 bytes, expected 16"),
        ("zero-length utterance", bad(|b| { let r = range(b, SectionKind::NumSamples); put_u32(b, r.start + 4, 0) }, true),
         "NUM_SAMPLES[1]: is 0, expected 1..=9600000"),
        ("overlapping PCM", bad(|b| { let r = range(b, SectionKind::PcmOffsets); put_u64(b, r.start + 16, 3) }, true),
         "PCM_OFFSETS[2]: is 3, expected 12 (utterances are back to back)"),
        ("decreasing token offsets", bad(|b| { let r = range(b, SectionKind::TokenOffsets); put_u64(b, r.start + 16, 1) }, true),
         "TOKEN_OFFSETS[2]: is 1 after 3: utterance 1 would have -2 tokens, expected 0..=16384"),
        ("language id out of table", bad(|b| { let r = range(b, SectionKind::Languages); put_u16(b, r.start, 7) }, true),
         "LANGUAGES[0]: is 7, expected < 2 (entries in the metadata table)"),
        ("metadata disagrees with header", bad(|b| replace_in_metadata(b, "\"utterances\":3", "\"utterances\":4"), true),
         "METADATA: stats.utterances is 4, the header and section table say 3"),
        ("metadata not JSON", bad(|b| { let r = range(b, SectionKind::Metadata); b[r.start] = b'x' }, true),
         "METADATA: invalid JSON"),
        ("repeated unknown member", meta(|j| add_member(j, "\"x\":1,\"x\":2")),
         "METADATA: invalid JSON: member name \"x\" is repeated in one object"),
        ("repeated known member", meta(|j| add_member(j, "\"sources\":[]")),
         "METADATA: invalid JSON: member name \"sources\" is repeated in one object"),
        ("repeated member inside compile", meta(|j| replace_once(j, "\"lang_prefix\":\"never\"", "\"lang_prefix\":\"never\",\"lang_prefix\":\"auto\"")),
         "METADATA: invalid JSON: member name \"lang_prefix\" is repeated in one object"),
        ("NaN", meta(|j| add_member(j, "\"x\":NaN")),
         "METADATA: invalid JSON: expected value"),
        ("Infinity", meta(|j| add_member(j, "\"x\":-Infinity")),
         "METADATA: invalid JSON: invalid number"),
        ("number out of range in an unknown member", meta(|j| add_member(j, "\"x\":[1e400]")),
         "METADATA: invalid JSON: number out of range"),
        ("integer out of range in an unknown member", meta(|j| add_member(j, &format!("\"x\":1{}", "0".repeat(400)))),
         "METADATA: invalid JSON: number out of range"),
        ("lone surrogate in an unknown member", meta(|j| add_member(j, "\"x\":\"\\ud800\"")),
         "METADATA: invalid JSON: unexpected end of hex escape"),
        ("lone low surrogate in a member name", meta(|j| add_member(j, "\"\\udc00\":1")),
         "METADATA: invalid JSON: lone leading surrogate in hex escape"),
        ("nesting 128 deep in an unknown member", meta(|j| add_member(j, &format!("\"x\":{}", nested(127)))),
         "METADATA: invalid JSON: recursion limit exceeded"),
        ("-0 as an integer member", meta(|j| replace_once(j, "\"tokens\":0,", "\"tokens\":-0,")),
         "METADATA: members missing or of the wrong type: invalid type: floating point `-0.0`, expected u64"),
        ("3.0 as an integer member", meta(|j| replace_once(j, "\"utterances\":3,", "\"utterances\":3.0,")),
         "METADATA: members missing or of the wrong type: invalid type: floating point `3.0`, expected u64"),
        ("true as an integer member", meta(|j| replace_once(j, "\"utterances\":1,", "\"utterances\":true,")),
         "METADATA: members missing or of the wrong type: invalid type: boolean `true`, expected u64"),
        ("string as hours", meta(|j| replace_once(j, "\"hours\":1.3888888888888888e-7", "\"hours\":\"1.3888888888888888e-7\"")),
         "METADATA: members missing or of the wrong type: invalid type: string"),
        ("object given as an array", meta(|j| replace_once(j, &tokenizer_object, "[\"sentencepiece\",40,\"d777adf30f4c3811\",55]")),
         "METADATA: tokenizer is missing or not a JSON object"),
        ("per-language entry given as an array", meta(|j| replace_once(j, "{\"utterances\":1,\"samples\":7,\"tokens\":0,\"hours\":1.2152777777777777e-7}", "[1,7,0,1.2152777777777777e-7]")),
         "METADATA: stats.per_language[\"hi\"] is missing or not a JSON object"),
        ("empty language code", meta(|j| replace_once(j, "[\"en\",\"hi\"]", "[\"en\",\"\"]")),
         "METADATA: languages[1] is empty"),
        ("repeated source name", meta(|j| replace_once(j, "[\"read\",\"conversational\"]", "[\"read\",\"read\"]")),
         "METADATA: sources[1] \"read\" is repeated"),
        ("text frame misplaced", bad(|b| { let r = range(b, SectionKind::TextIndex); put_u64(b, r.start + 16, 5) }, true),
         "TEXT_INDEX[1]: offset is 5, expected"),
        ("PCM bit flip", bad(|b| { let r = range(b, SectionKind::Pcm); b[r.start + 3] ^= 1 }, false),
         "section PCM (bytes 4096..4126): checksum mismatch"),
        ("PCM edited, checksum repaired", bad(|b| { let r = range(b, SectionKind::Pcm); b[r.start + 3] ^= 1 }, true),
         "utterance 0: audio hash stored"),
        ("token out of vocabulary", bad(|b| { let r = range(b, SectionKind::Tokens); put_u16(b, r.start + 8, 40) }, true),
         "utterance 2: token 1 is 40, expected < vocab_size 40"),
        ("padding byte set", bad(|b| { let r = range(b, SectionKind::Pcm); b[r.end + 10] = 1 }, false),
         "padding byte at offset 4136 is 0x01, expected 0"),
        ("text frame garbled", bad(|b| { let r = range(b, SectionKind::TextBlocks); b[r.start + 6] ^= 0xff }, true),
         "text block 0 (utterances 0..)"),
        ("text block of two frames", block0_as([frame0.clone(), second_frame.clone()].concat()),
         &two_frames),
        ("skippable frame after the text frame", block0_as([frame0.clone(), skippable(b"note")].concat()),
         &frame_then_skippable),
        ("skippable frame before the text frame", block0_as([skippable(b"note"), frame0.clone()].concat()),
         "text block 0 (utterances 0..): starts with 50 2a 4d 18, expected the zstd frame magic 28 b5 2f fd"),
        ("frame without its content size", block0_as(frame_with(&raw0, &[CParameter::ContentSizeFlag(false)])),
         "text block 0 (utterances 0..): zstd frame does not declare its content size"),
        ("frame content size is not raw_len", with_text_frames(&tiny_bytes(), &[(frame0.clone(), raw0.len() as u32 + 4), frame1]),
         &content_size_not_raw_len),
        ("frame needs a dictionary", block0_as(with_dictionary_id(&frame0, 7)),
         "text block 0 (utterances 0..): zstd frame needs dictionary 7, text frames use none"),
        ("frame checksum wrong", block0_as(frame0_bad_checksum),
         "text block 0 (utterances 0..): zstd frame does not decompress"),
        ("character split between segment id and text", block0_with_split_character(),
         "text block 0 (utterances 0..): record 1: segment id is not valid UTF-8 at byte 6 of it"),
        ("tokenizer edited", bad(|b| { let r = range(b, SectionKind::Tokenizer); b[r.start] ^= 1 }, true),
         "METADATA: tokenizer.model_xxh3 is"),
        ("stats.hours 2e-9 off", hours_scaled(1.0 + 2e-9),
         "METADATA: stats.hours is "),
    ];
    cases.into_iter().map(|(name, bytes, want)| (name, bytes, want.to_string())).collect()
}

/// Valid files that differ from what the writer makes in ways the format allows.
fn accepted_cases() -> Vec<(&'static str, Vec<u8>)> {
    let raw0 = raw_block0();
    let frame0 = zstd::bulk::compress(&raw0, 9).unwrap();
    vec![
        ("golden", tiny_bytes()),
        ("synthetic, 4 languages, no tokenizer", synth_bytes(40, &SynthSpec::default(), 3)),
        ("empty corpus", {
            let w = CorpusWriter::in_memory(WriterOptions::new(10, "none", Vec::new())).unwrap();
            w.finish().unwrap().data.unwrap()
        }),
        ("checksummed text frame", block0_as(frame_with(&raw0, &[CParameter::ChecksumFlag(true)]))),
        ("text frame with Dictionary_ID 0", block0_as(with_dictionary_id(&frame0, 0))),
        ("stats.hours 0.5e-9 off", hours_scaled(1.0 + 0.5e-9)),
        (
            "nesting 127 deep in an unknown member, a scalar at 128",
            meta(|j| add_member(j, &format!("\"x\":{}1{}", "[".repeat(126), "]".repeat(126)))),
        ),
        (
            "unknown members of any JSON type",
            meta(|j| {
                add_member(j, "\"x\":[-0,1e-400,1.5,null,true,{\"y\":\"\\ud83d\\ude00\\u0000\"}]")
            }),
        ),
        (
            "members in another order, with whitespace",
            meta(|j| {
                let v: serde_json::Value = serde_json::from_str(j).unwrap();
                serde_json::to_string_pretty(&v).unwrap()
            }),
        ),
        (
            "unknown members in per-language entries",
            meta(|j| replace_once(j, "\"tokens\":0,", "\"tokens\":0,\"note\":\"\",")),
        ),
    ]
}

#[test]
fn each_corruption_gets_its_precise_message() {
    let mut failures = Vec::new();
    for (name, bytes, want) in rejected_cases() {
        match check(&bytes) {
            None => failures.push(format!("{name}: accepted")),
            Some(got) if !got.contains(&want) => {
                failures.push(format!("{name}:\n  got:  {got}\n  want: {want}"))
            }
            Some(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn valid_variants_are_accepted() {
    for (name, bytes) in accepted_cases() {
        assert_eq!(check(&bytes), None, "{name}");
    }
}

#[test]
fn test_helpers_rebuild_the_golden_file_exactly() {
    let g = tiny_bytes();
    let frames: Vec<(Vec<u8>, u32)> = raw_text_blocks(&g)
        .iter()
        .map(|raw| (zstd::bulk::compress(raw, 9).unwrap(), raw.len() as u32))
        .collect();
    assert!(with_text_frames(&g, &frames) == g);
    assert!(with_metadata(&g, str::to_owned) == g);
}

/// Whether `python3` can run the reference reader (numpy, zstandard and xxhash installed).
fn python_reader_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, zstandard, xxhash"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The Python reference reader reaches the same verdict on every case above.
#[test]
fn python_reader_agrees_on_every_case() {
    // The reference reader's modules are part of the test setup (scripts/setup.sh installs
    // them): without them this test fails rather than passing without checking anything.
    assert!(
        python_reader_available(),
        "python3 with numpy, zstandard and xxhash is needed: bash scripts/setup.sh"
    );
    let reader = std::path::Path::new(
        &std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("reference/read_corpus.py");
    let dir = tempfile::tempdir().unwrap();
    let expected = rejected_cases()
        .into_iter()
        .map(|(name, bytes, _)| (name, bytes, 1))
        .chain(accepted_cases().into_iter().map(|(name, bytes)| (name, bytes, 0)));
    let mut failures = Vec::new();
    for (i, (name, bytes, want)) in expected.enumerate() {
        let path = dir.path().join(format!("case-{i}.asrcorpus"));
        std::fs::write(&path, &bytes).unwrap();
        let out = Command::new("python3").arg(&reader).arg(&path).output().unwrap();
        if out.status.code() != Some(want) {
            failures.push(format!(
                "{name}: exit {:?}, expected {want}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
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
