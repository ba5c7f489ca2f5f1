//! End-to-end checks across implementations and packages: the Rust reader and the independent
//! Python reader (format-spec/reference/read_corpus.py, written from SPEC.md) agree on every
//! corpus the Rust writer makes, and both reject corrupted ones; the bundled example compiles,
//! trains, checkpoints, resumes exactly and evaluates (`training` module).

#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, WriterOptions};

mod training;

fn python_reader() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("run through cargo test"),
    )
    .join("../format-spec/reference/read_corpus.py")
}

/// Runs the Python reader: (exit code, stdout, stderr).
fn python(path: &Path) -> (i32, String, String) {
    let out = Command::new("python3")
        .arg(python_reader())
        .arg(path)
        .output()
        .expect("python3 is needed (see README: Development)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("ModuleNotFoundError"),
        "the Python reader's modules are missing: pip install -r \
         format-spec/reference/requirements.txt\n{stderr}"
    );
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

fn write_synth(path: &Path, n: u64, vocab: u32, block: u32, seed: u64) {
    let spec = SynthSpec { seed, vocab_size: vocab, max_samples: 4000, ..SynthSpec::default() };
    let mut o = WriterOptions::new(vocab, "sentencepiece", b"opaque model bytes".to_vec());
    o.text_block_size = block;
    let mut w = CorpusWriter::create(path, o).unwrap();
    for i in 0..n {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn python_reader_agrees_with_rust_reader() {
    let dir = tempfile::tempdir().unwrap();
    for (n, vocab, block, seed) in
        [(0, 10, 1, 1), (1, 10, 4, 2), (257, 1024, 16, 3), (120, 70_000, 7, 4)]
    {
        let path = dir.path().join(format!("c{n}-{vocab}.asrcorpus"));
        write_synth(&path, n, vocab, block, seed);
        let rust = serde_json::to_value(Corpus::open(&path).unwrap().verify().unwrap()).unwrap();
        let (code, stdout, stderr) = python(&path);
        assert_eq!(code, 0, "python rejected a valid corpus ({n} utterances): {stderr}");
        let py: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(py, rust, "summaries differ for {n} utterances, vocab {vocab}");
    }
}

#[test]
fn both_readers_reject_corruptions() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.asrcorpus");
    write_synth(&good, 50, 300, 8, 9);
    let bytes = std::fs::read(&good).unwrap();
    let c = Corpus::open(&good).unwrap();
    let pcm = c.section_range(asr_corpus::SectionKind::Pcm);
    let text = c.section_range(asr_corpus::SectionKind::TextBlocks);
    let cases: Vec<(&str, Box<dyn Fn(&mut Vec<u8>)>)> = vec![
        ("truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 1))),
        ("header flip", Box::new(|b: &mut Vec<u8>| b[33] ^= 1)),
        ("pcm flip", Box::new(move |b: &mut Vec<u8>| b[pcm.start + 1000] ^= 0x40)),
        ("text flip", Box::new(move |b: &mut Vec<u8>| b[text.start + 3] ^= 0x01)),
        (
            "padding",
            Box::new(|b: &mut Vec<u8>| {
                let n = b.len();
                b[n - 1] = 9
            }),
        ),
    ];
    for (name, mutate) in cases {
        let mut b = bytes.clone();
        mutate(&mut b);
        let path = dir.path().join(format!("{}.asrcorpus", name.replace(' ', "-")));
        std::fs::write(&path, &b).unwrap();
        let rust = Corpus::open(&path).and_then(|c| c.verify().map(|_| ()));
        assert!(rust.is_err(), "{name}: Rust reader accepted it");
        let (code, _, stderr) = python(&path);
        assert_eq!(code, 1, "{name}: Python reader exit {code}: {stderr}");
    }
}
