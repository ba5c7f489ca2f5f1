//! SPEC.md and `layout.rs` agree: the tables of limits, section kinds and header fields are
//! compared with the constants, so neither can change without the other. The validation rules
//! are numbered without gaps, and every rule number the code and the Python reader cite exists.

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
        ("MAX_JSON_DEPTH", layout::MAX_JSON_DEPTH as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(rows, consts);
}

const PYTHON_READER: &str = include_str!("../../reference/read_corpus.py");

/// Value of a Python constant written as `NAME = <integer expression>` at the start of a line:
/// digits with `_`, joined by `*`, `**` and `-` (as the reader writes its limits).
fn python_constant(name: &str) -> Option<u64> {
    let line = PYTHON_READER.lines().find(|l| l.starts_with(&format!("{name} = ")))?;
    let expr = line.split_once(" = ")?.1.replace('_', "");
    let mut terms = expr.split(" - ").map(|term| {
        term.split(" * ").try_fold(1u64, |acc, factor| {
            let v = match factor.trim().split_once("**") {
                Some((b, e)) => {
                    b.trim().parse::<u64>().ok()?.checked_pow(e.trim().parse().ok()?)?
                }
                None => factor.trim().parse().ok()?,
            };
            acc.checked_mul(v)
        })
    });
    let first = terms.next()??;
    terms.try_fold(first, |acc, t| acc.checked_sub(t?))
}

#[test]
fn python_reader_limits_match_the_table() {
    for row in table("limits") {
        assert_eq!(
            python_constant(&row[0]).map(|v| v.to_string()),
            Some(row[1].clone()),
            "{} in reference/read_corpus.py",
            row[0]
        );
    }
}

/// Numbers of the rules SPEC.md section 8 defines with `- R<n>.` (or `- V<n>.`), in order.
fn spec_rules(prefix: char) -> Vec<u32> {
    let spec = include_str!("../../SPEC.md");
    spec.lines()
        .filter_map(|l| l.strip_prefix("- ")?.strip_prefix(prefix)?.split_once('.')?.0.parse().ok())
        .collect()
}

/// Every rule number cited as `R<n>` or `V<n>` in `text`, ranges `R1-R13` included.
fn cited_rules(text: &str, prefix: char) -> Vec<u32> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        let before_ok = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let digits: String = text[i + 1..].chars().take_while(|c| c.is_ascii_digit()).collect();
        let after = i + 1 + digits.len();
        let after_ok = !(after < b.len() && (b[after].is_ascii_alphanumeric() || b[after] == b'_'));
        if before_ok && after_ok && !digits.is_empty() {
            out.push(digits.parse().unwrap());
        }
    }
    out
}

#[test]
fn rules_are_numbered_without_gaps_and_citations_exist() {
    let sources = [
        ("SPEC.md", include_str!("../../SPEC.md")),
        ("reference/read_corpus.py", PYTHON_READER),
        ("src/error.rs", include_str!("../../src/error.rs")),
        ("src/read.rs", include_str!("../../src/read.rs")),
        ("src/verify.rs", include_str!("../../src/verify.rs")),
        ("src/meta.rs", include_str!("../../src/meta.rs")),
        ("src/text.rs", include_str!("../../src/text.rs")),
        ("src/lib.rs", include_str!("../../src/lib.rs")),
    ];
    for (prefix, count) in [('R', 13), ('V', 8)] {
        let defined = spec_rules(prefix);
        assert_eq!(defined, (1..=count).collect::<Vec<_>>(), "SPEC.md's {prefix} rules");
        for (name, text) in sources {
            for n in cited_rules(text, prefix) {
                assert!((1..=count).contains(&n), "{name} cites {prefix}{n}, which SPEC.md lacks");
            }
        }
    }
    // Where the code names the whole set of rules, it names the last one.
    for (name, text, whole) in [
        ("src/read.rs", include_str!("../../src/read.rs"), "R1-R13"),
        ("src/verify.rs", include_str!("../../src/verify.rs"), "V1-V8"),
        ("reference/read_corpus.py", PYTHON_READER, "R1-R13, V1-V8"),
    ] {
        assert!(text.contains(whole), "{name} does not mention {whole}");
    }
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
