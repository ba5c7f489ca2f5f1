//! Whatever is written reads back identically, from memory and from a mapped file, and the file
//! writer and the in-memory writer produce the same bytes.

use asr_corpus::synth::SynthSpec;
use asr_corpus::{Corpus, CorpusWriter, UtteranceIn, WriteError, WriterOptions};
use proptest::prelude::*;

use crate::common::synth_bytes;

#[derive(Debug, Clone)]
struct Utt {
    text: String,
    language: u8,
    source: u8,
    pcm: Vec<i16>,
    tokens: Vec<u32>,
}

fn utt(vocab: u32) -> impl Strategy<Value = Utt> {
    (
        ".{0,40}",
        0u8..5,
        0u8..3,
        prop::collection::vec(any::<i16>(), 1..300),
        prop::collection::vec(0..vocab, 0..30),
    )
        .prop_map(|(text, language, source, pcm, tokens)| Utt {
            text,
            language,
            source,
            pcm,
            tokens,
        })
}

fn case() -> impl Strategy<Value = (u32, u32, Vec<Utt>)> {
    (prop_oneof![Just(50u32), Just(65_536), Just(70_000)], 1u32..6).prop_flat_map(
        |(vocab, block)| (Just(vocab), Just(block), prop::collection::vec(utt(vocab), 0..25)),
    )
}

const LANGS: [&str; 5] = ["en", "hi", "ta", "bn", "as"];
const SOURCES: [&str; 3] = ["", "read", "conversational"];

fn write(vocab: u32, block: u32, utts: &[Utt]) -> Vec<u8> {
    let mut o = WriterOptions::new(vocab, "none", Vec::new());
    o.text_block_size = block;
    let mut w = CorpusWriter::in_memory(o).unwrap();
    for (i, u) in utts.iter().enumerate() {
        let id = format!("seg-{i}");
        w.push(&UtteranceIn {
            segment_id: &id,
            text: &u.text,
            language: LANGS[u.language as usize],
            source: SOURCES[u.source as usize],
            pcm: &u.pcm,
            tokens: &u.tokens,
        })
        .unwrap();
    }
    w.finish().unwrap().data.unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn written_utterances_read_back((vocab, block, utts) in case()) {
        let bytes = write(vocab, block, &utts);
        prop_assert_eq!(bytes.len() % 4096, 0);
        let c = Corpus::from_bytes(&bytes).unwrap();
        let report = c.verify().unwrap();
        prop_assert_eq!(c.len(), utts.len());
        prop_assert_eq!(report.token_width, if vocab <= 65_536 { 2 } else { 4 });
        for (i, u) in utts.iter().enumerate() {
            prop_assert_eq!(c.pcm(i), &u.pcm[..]);
            prop_assert_eq!(c.tokens(i).to_vec(), u.tokens.clone());
            prop_assert_eq!(c.language_code(i), LANGS[u.language as usize]);
            prop_assert_eq!(c.source_name(i), SOURCES[u.source as usize]);
            prop_assert_eq!(c.text(i).unwrap(), (format!("seg-{i}"), u.text.clone()));
            prop_assert_eq!(c.duration_seconds(i), u.pcm.len() as f64 / 16000.0);
        }
        let samples: u64 = utts.iter().map(|u| u.pcm.len() as u64).sum();
        prop_assert_eq!(c.metadata().stats.samples, samples);
        // Determinism: the same input gives the same bytes.
        prop_assert_eq!(write(vocab, block, &utts), bytes);
    }
}

#[test]
fn file_writer_matches_memory_writer_and_maps() {
    let spec = SynthSpec::default();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("synth.asrcorpus");
    let mut o = WriterOptions::new(spec.vocab_size, "none", Vec::new());
    o.text_block_size = 7;
    let mut w = CorpusWriter::create(&path, o).unwrap();
    for i in 0..300 {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    let written = w.finish().unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(written.bytes, on_disk.len() as u64);
    assert_eq!(on_disk, synth_bytes(300, &spec, 7));
    let c = Corpus::open(&path).unwrap();
    c.verify().unwrap();
    c.prefetch_pcm(10..20);
    assert_eq!(c.pcm(299), &spec.utterance(299).pcm[..]);
    // Only the corpus is left in the directory: no temporary or spool files.
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("synth.asrcorpus")]);
}

#[test]
fn unfinished_writer_leaves_nothing_and_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.asrcorpus");
    std::fs::write(&path, b"previous corpus").unwrap();
    {
        let mut w =
            CorpusWriter::create(&path, WriterOptions::new(10, "none", Vec::new())).unwrap();
        w.push(&SynthSpec { vocab_size: 10, ..SynthSpec::default() }.utterance(0).as_input())
            .unwrap();
        // Dropped without finish, as after an error or a crash of the producing run.
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"previous corpus");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn invalid_utterances_are_refused_and_the_writer_goes_on() {
    let mut w = CorpusWriter::in_memory(WriterOptions::new(10, "none", Vec::new())).unwrap();
    let good = UtteranceIn {
        segment_id: "a",
        text: "",
        language: "en",
        source: "",
        pcm: &[1],
        tokens: &[9],
    };
    let cases: [(UtteranceIn<'_>, &str); 4] = [
        (UtteranceIn { pcm: &[], ..good }, "0 samples"),
        (UtteranceIn { tokens: &[10], ..good }, "token 0 is 10, expected < vocab_size 10"),
        (UtteranceIn { segment_id: "", ..good }, "segment id is 0 bytes"),
        (UtteranceIn { language: "", ..good }, "empty language code"),
    ];
    for (u, msg) in cases {
        let e = w.push(&u).unwrap_err();
        assert!(matches!(e, WriteError::InvalidUtterance { .. }));
        assert!(e.to_string().contains(msg), "{e}");
    }
    w.push(&good).unwrap();
    let c = Corpus::from_bytes(&w.finish().unwrap().data.unwrap()).unwrap();
    assert_eq!(c.len(), 1);
    c.verify().unwrap();
}

#[test]
fn empty_corpus_is_valid() {
    let w = CorpusWriter::in_memory(WriterOptions::new(10, "none", Vec::new())).unwrap();
    let bytes = w.finish().unwrap().data.unwrap();
    let c = Corpus::from_bytes(&bytes).unwrap();
    assert!(c.is_empty());
    assert_eq!(c.verify().unwrap().utterances, 0);
    // SPEC.md section 5: empty sections take no bytes and share the next section's offset; the
    // checksum of an empty section is xxh3 of nothing.
    let sections = &c.header().sections;
    let empty: Vec<_> = sections.iter().filter(|s| s.length == 0).collect();
    assert_eq!(empty.len(), 10, "all but TOKEN_OFFSETS and METADATA are empty");
    for s in empty {
        assert_eq!(s.checksum, 0x2d06_8005_38d3_94c2);
    }
    assert!(sections.windows(2).any(|w| w[0].offset == w[1].offset));
    assert_eq!(sections[0].offset, 4096);
    assert_eq!(bytes.len(), 3 * 4096, "header, TOKEN_OFFSETS' page, METADATA's page");
}

#[test]
fn bad_writer_options_are_refused() {
    let mut o = WriterOptions::new(10, "sentencepiece", Vec::new());
    assert!(CorpusWriter::in_memory(o.clone()).is_err());
    o.tokenizer_kind = "none".into();
    o.text_block_size = 0;
    assert!(CorpusWriter::in_memory(o).is_err());
    assert!(CorpusWriter::in_memory(WriterOptions::new(0, "none", Vec::new())).is_err());
}
