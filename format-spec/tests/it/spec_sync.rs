//! SPEC.md and `layout.rs` agree: the tables of limits, section kinds and header fields are
//! compared with the constants, so neither can change without the other.

use std::collections::BTreeMap;

use asr_corpus::layout::{self, header_offset as ho, SectionKind};

/// Rows of the SPEC.md table between `<!-- table: NAME -->` and `<!-- end table -->`, as cells.
fn table(name: &str) -> Vec<Vec<String>> {
    let spec = include_str!("../../SPEC.md");
    let start = spec.find(&format!("<!-- table: {name} -->")).expect("table marker in SPEC.md");
    let body = &spec[start..];
    let end = body.find("<!-- end table -->").expect("end marker");
    body[..end]
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .skip(1) // header row
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

#[test]
fn limits_table_matches_constants() {
    let rows: BTreeMap<String, String> =
        table("limits").into_iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    let consts: BTreeMap<String, String> = [
        ("MAX_SECTIONS", layout::MAX_SECTIONS as u64),
        ("MAX_UTTERANCES", layout::MAX_UTTERANCES),
        ("MAX_UTTERANCE_SAMPLES", layout::MAX_UTTERANCE_SAMPLES as u64),
        ("MAX_TOKENS_PER_UTTERANCE", layout::MAX_TOKENS_PER_UTTERANCE),
        ("MAX_METADATA_BYTES", layout::MAX_METADATA_BYTES),
        ("MAX_TOKENIZER_BYTES", layout::MAX_TOKENIZER_BYTES),
        ("MAX_TEXT_BLOCK_UTTERANCES", layout::MAX_TEXT_BLOCK_UTTERANCES as u64),
        ("MAX_TEXT_BLOCK_RAW_BYTES", layout::MAX_TEXT_BLOCK_RAW_BYTES as u64),
        ("MAX_SEGMENT_ID_BYTES", layout::MAX_SEGMENT_ID_BYTES as u64),
        ("MAX_TEXT_BYTES", layout::MAX_TEXT_BYTES as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(rows, consts);
}

#[test]
fn section_kinds_table_matches_enum() {
    let rows: Vec<(u32, String)> =
        table("section-kinds").into_iter().map(|r| (r[0].parse().unwrap(), r[1].clone())).collect();
    let mut kinds: Vec<(u32, String)> =
        SectionKind::WRITE_ORDER.iter().map(|k| (k.code(), k.name().to_string())).collect();
    kinds.sort();
    assert_eq!(rows, kinds);
}

#[test]
fn header_table_matches_offsets() {
    let rows: BTreeMap<String, (usize, usize)> = table("header")
        .into_iter()
        .map(|r| (r[3].clone(), (r[0].parse().unwrap(), r[1].parse().unwrap_or(0))))
        .collect();
    let fields = [
        ("magic", 0, 8),
        ("format_version", ho::FORMAT_VERSION, 4),
        ("min_reader_version", ho::MIN_READER_VERSION, 4),
        ("endian_marker", ho::ENDIAN_MARKER, 4),
        ("header_size", ho::HEADER_SIZE, 4),
        ("section_align", ho::SECTION_ALIGN, 4),
        ("section_count", ho::SECTION_COUNT, 4),
        ("n_utterances", ho::N_UTTERANCES, 8),
        ("n_samples", ho::N_SAMPLES, 8),
        ("n_tokens", ho::N_TOKENS, 8),
        ("sample_rate", ho::SAMPLE_RATE, 4),
        ("token_width", ho::TOKEN_WIDTH, 4),
        ("vocab_size", ho::VOCAB_SIZE, 4),
        ("text_block_size", ho::TEXT_BLOCK_SIZE, 4),
        ("reserved", ho::RESERVED, ho::HEADER_CHECKSUM - ho::RESERVED),
        ("header_checksum", ho::HEADER_CHECKSUM, 8),
    ];
    for (name, offset, size) in fields {
        assert_eq!(rows.get(name), Some(&(offset, size)), "SPEC.md header row for {name}");
    }
    assert_eq!(rows["section table"].0, ho::SECTION_TABLE);
    // The fixed fields are contiguous and end where the section table starts.
    let mut sorted: Vec<_> = fields.iter().map(|&(_, o, s)| (o, s)).collect();
    sorted.sort();
    for w in sorted.windows(2) {
        assert_eq!(w[0].0 + w[0].1, w[1].0, "gap or overlap in the header fields");
    }
    assert_eq!(ho::HEADER_CHECKSUM + 8, layout::FIXED_HEADER_BYTES);
}

#[test]
fn entry_tables_match_sizes() {
    let sizes = |name| table(name).iter().map(|r| r[1].parse::<usize>().unwrap()).sum::<usize>();
    assert_eq!(sizes("section-entry"), layout::SECTION_ENTRY_BYTES);
    assert_eq!(sizes("text-index-entry"), layout::TEXT_INDEX_ENTRY_BYTES);
}
