//! Tokenization against the reference `spm_encode` tool, the `<|lang|>` prefix policy and
//! truncation. The model is trained in the test by `spm_train` on a small bilingual text.

use std::path::{Path, PathBuf};
use std::process::Command;

use asr_compiler::{LangPrefix, Tokenizer};

const SENTENCES: [&str; 8] = [
    "the quick brown fox jumps over the lazy dog",
    "speech recognition models learn from many hours of audio",
    "a corpus file is compiled once and read many times",
    "every utterance has a language and a transcript",
    "मैं आज बाजार जा रहा हूँ",
    "उसने कहा कि वह कल आएगा",
    "हम सब मिलकर काम करते हैं",
    "यह एक छोटा सा वाक्य है",
];

fn train(dir: &Path) -> PathBuf {
    let text = dir.join("train.txt");
    let lines: Vec<String> =
        (0..40).flat_map(|i| SENTENCES.iter().map(move |s| format!("{s} {i}"))).collect();
    std::fs::write(&text, lines.join("\n")).unwrap();
    let prefix = dir.join("tiny");
    let status = Command::new("spm_train")
        .arg(format!("--input={}", text.display()))
        .arg(format!("--model_prefix={}", prefix.display()))
        .args(["--vocab_size=120", "--model_type=bpe", "--character_coverage=1.0"])
        .args(["--user_defined_symbols=<|en|>,<|hi|>", "--minloglevel=2"])
        .status()
        .expect("spm_train is needed for this test (bash scripts/setup.sh installs it)");
    assert!(status.success());
    prefix.with_extension("model")
}

fn spm_encode(model: &Path, text: &str) -> Vec<u32> {
    let out = Command::new("spm_encode")
        .arg(format!("--model={}", model.display()))
        .arg("--output_format=id")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(format!("{text}\n").as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect()
}

#[test]
fn ids_match_spm_encode_and_the_prefix_policy_holds() {
    let dir = tempfile::tempdir().unwrap();
    let model = train(dir.path());
    let tok = Tokenizer::open(&model).unwrap();
    assert_eq!(tok.vocab_size(), 120);
    assert_eq!(tok.model_bytes(), std::fs::read(&model).unwrap());
    assert!(tok.has_piece("<|hi|>") && tok.has_piece("<|en|>"));
    assert!(!tok.has_piece("<|ta|>"));

    for text in ["the lazy dog reads audio", "मैं आज काम करते हैं"] {
        // Auto with a tag the model has: the tag is the first piece, then the text's pieces.
        let lang = if text.is_ascii() { "en" } else { "hi" };
        let e = tok.encode(lang, text, LangPrefix::Auto, 512).unwrap();
        assert!(e.prefixed && !e.truncated);
        assert_eq!(e.ids, spm_encode(&model, &format!("<|{lang}|> {text}")), "{text}");
        assert_eq!(tok.decode(&e.ids).unwrap(), format!("<|{lang}|> {text}"));
        // Never: the text alone.
        let e = tok.encode(lang, text, LangPrefix::Never, 512).unwrap();
        assert!(!e.prefixed);
        assert_eq!(e.ids, spm_encode(&model, text));
    }
    // Auto with a tag the model lacks: no prefix. Always: prefixed anyway, in several pieces.
    let auto = tok.encode("ta", "the dog", LangPrefix::Auto, 512).unwrap();
    assert!(!auto.prefixed);
    let always = tok.encode("ta", "the dog", LangPrefix::Always, 512).unwrap();
    assert!(always.prefixed && always.ids.len() > auto.ids.len() + 1);
    assert_eq!(always.ids, spm_encode(&model, "<|ta|> the dog"));

    // Truncation keeps the first pieces and says so.
    let full = tok.encode("en", SENTENCES[1], LangPrefix::Auto, 512).unwrap();
    let cut = tok.encode("en", SENTENCES[1], LangPrefix::Auto, 5).unwrap();
    assert!(cut.truncated && full.ids.len() > 5);
    assert_eq!(cut.ids, full.ids[..5]);
}

#[test]
fn bad_models_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.model");
    std::fs::write(&junk, b"not a model").unwrap();
    assert!(Tokenizer::open(&junk)
        .unwrap_err()
        .to_string()
        .contains("is not a SentencePiece model"));
    assert!(Tokenizer::open(&dir.path().join("missing.model"))
        .unwrap_err()
        .to_string()
        .contains("cannot read tokenizer model"));
}
