//! The committed golden file: the writer still produces it byte for byte, and the reader decodes
//! it to the table it was made from.

use std::path::PathBuf;

use asr_corpus::{layout, Corpus};

use crate::common::{tiny_bytes, tiny_table, TINY_MODEL};

fn golden_path() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("run through cargo test"))
        .join("testdata/v1/tiny.asrcorpus")
}

/// Reads the golden file. With `ASR_BLESS=1` a missing file is created (for a new format version
/// only: an existing golden file is never rewritten by this test).
fn golden() -> Vec<u8> {
    let path = golden_path();
    if !path.exists() && std::env::var_os("ASR_BLESS").is_some() {
        std::fs::write(&path, tiny_bytes()).unwrap();
    }
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn writer_output_is_byte_stable() {
    let golden = golden();
    let now = tiny_bytes();
    assert_eq!(golden.len(), now.len(), "writer output length changed: bump FORMAT_VERSION");
    if let Some(at) = golden.iter().zip(&now).position(|(a, b)| a != b) {
        panic!(
            "writer output differs from testdata/v1/tiny.asrcorpus at byte {at}: a byte-level \
             change needs a FORMAT_VERSION bump and a new golden file"
        );
    }
}

#[test]
fn golden_file_decodes_to_its_table() {
    let c = Corpus::from_bytes(&golden()).unwrap();
    assert_eq!(c.header().format_version, layout::FORMAT_VERSION);
    let table = tiny_table();
    assert_eq!(c.len(), table.len());
    for (i, (id, text, lang, src, pcm, tokens)) in table.into_iter().enumerate() {
        assert_eq!(c.text(i).unwrap(), (id.to_string(), text.to_string()));
        assert_eq!(c.language_code(i), lang);
        assert_eq!(c.source_name(i), src);
        assert_eq!(c.pcm(i), &pcm[..]);
        assert_eq!(c.tokens(i).to_vec(), tokens);
        assert_eq!(c.audio_hashes()[i], asr_corpus::audio_hash(&pcm));
    }
    assert_eq!(c.tokenizer_model(), TINY_MODEL);
    assert_eq!(c.metadata().languages, ["en", "hi"]);
    assert_eq!(c.metadata().stats.per_language["en"].utterances, 2);
    let report = c.verify().unwrap();
    assert_eq!(report.text_blocks, 2);
    assert_eq!(report.sections.len(), 12);
}

#[test]
fn golden_file_maps_from_disk_like_memory() {
    let c = Corpus::open(golden_path()).unwrap();
    let m = Corpus::from_bytes(&golden()).unwrap();
    assert_eq!(c.verify().unwrap(), m.verify().unwrap());
    assert_eq!(c.pcm_all(), m.pcm_all());
}

#[test]
fn golden_header_matches_spec_worked_example() {
    // SPEC.md section 10 shows these first 48 bytes.
    let g = golden();
    let expect: [u8; 40] = [
        0x89, 0x41, 0x53, 0x52, 0x43, 0x0d, 0x0a, 0x1a, 1, 0, 0, 0, 1, 0, 0, 0, //
        4, 3, 2, 1, 0, 0x10, 0, 0, 0, 0x10, 0, 0, 12, 0, 0, 0, //
        3, 0, 0, 0, 0, 0, 0, 0,
    ];
    assert_eq!(&g[..40], &expect);
}
