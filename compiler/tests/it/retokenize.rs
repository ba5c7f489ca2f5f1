//! `asrc retokenize`: the bundled example compiled with its model, then re-tokenized with a model
//! trained here by `spm_train`: token ids equal what `spm_encode` gives for each transcript, and
//! everything else (PCM, audio hashes, ids, texts, languages, sources) is the input's.

use std::path::Path;
use std::process::Command;

use asr_compiler::with_language_tag;
use asr_corpus::Corpus;

use crate::{asrc, example, refused};

/// A BPE model of about 400 pieces trained on the corpus's transcripts, with two of its languages'
/// tags as pieces (so the `auto` prefix policy differs between languages).
fn train(dir: &Path, corpus: &Corpus) -> std::path::PathBuf {
    let text = dir.join("texts.txt");
    let lines: Vec<String> = (0..corpus.len()).map(|i| corpus.text(i).unwrap().1).collect();
    std::fs::write(&text, lines.join("\n")).unwrap();
    let prefix = dir.join("new");
    let status = Command::new("spm_train")
        .arg(format!("--input={}", text.display()))
        .arg(format!("--model_prefix={}", prefix.display()))
        .args(["--vocab_size=400", "--model_type=bpe", "--character_coverage=1.0"])
        .args([
            "--user_defined_symbols=<|en|>,<|hi|>",
            "--minloglevel=2",
            "--hard_vocab_limit=false",
        ])
        .status()
        .expect("spm_train is needed for this test (bash scripts/setup.sh installs it)");
    assert!(status.success());
    prefix.with_extension("model")
}

/// `spm_encode`'s ids for each line.
fn spm_encode(model: &Path, lines: &[String], dir: &Path) -> Vec<Vec<u32>> {
    let input = dir.join("encode.txt");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let out = Command::new("spm_encode")
        .arg(format!("--model={}", model.display()))
        .arg("--output_format=id")
        .arg(format!("--input={}", input.display()))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect()
}

#[test]
fn new_tokens_match_spm_encode_and_the_audio_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let old_path = dir.path().join("old.asrcorpus");
    let o = asrc(&[
        "compile",
        &example("manifest.parquet"),
        "--tokenizer",
        &example("spm.model"),
        "-o",
        old_path.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let old = Corpus::open(&old_path).unwrap();
    let model = train(dir.path(), &old);
    let new_path = dir.path().join("sub/new.asrcorpus");
    let o = asrc(&[
        "retokenize",
        old_path.to_str().unwrap(),
        "--tokenizer",
        model.to_str().unwrap(),
        "-o",
        new_path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains(&format!("kept {}, left out 0", old.len())), "{said}");

    let new = Corpus::open(&new_path).unwrap();
    assert_eq!(new.len(), old.len());
    assert_eq!(new.pcm_all(), old.pcm_all());
    assert_eq!(new.num_samples(), old.num_samples());
    assert_eq!(new.audio_hashes(), old.audio_hashes());
    assert_eq!(new.tokenizer_model(), std::fs::read(&model).unwrap().as_slice());
    let compile = &new.metadata().compile;
    assert_eq!(compile["tokenizer"], "new.model");
    assert_eq!(compile["retokenized_from"], "old.asrcorpus");
    assert_eq!(compile["resampler"], old.metadata().compile["resampler"]);

    // The reference: spm_encode on what `auto` feeds the model (the tag for en and hi only).
    let inputs: Vec<String> = (0..old.len())
        .map(|i| {
            let (_, text) = old.text(i).unwrap();
            let lang = old.language_code(i);
            if lang == "en" || lang == "hi" {
                with_language_tag(lang, &text)
            } else {
                text
            }
        })
        .collect();
    let want = spm_encode(&model, &inputs, dir.path());
    let mut differs = 0;
    for i in 0..old.len() {
        assert_eq!(new.text(i).unwrap(), old.text(i).unwrap());
        assert_eq!(new.language_code(i), old.language_code(i));
        assert_eq!(new.source_name(i), old.source_name(i));
        assert_eq!(new.tokens(i).to_vec(), want[i], "utterance {i}: {}", inputs[i]);
        differs += usize::from(new.tokens(i).to_vec() != old.tokens(i).to_vec());
    }
    assert!(differs > old.len() / 2, "the new model should change most sequences");
    let v = asrc(&["validate", new_path.to_str().unwrap()]);
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));
}

#[test]
fn bad_invocations_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let golden = crate::golden();
    let copy = dir.path().join("in.asrcorpus");
    std::fs::copy(&golden, &copy).unwrap();
    let before = std::fs::read(&copy).unwrap();
    // The output is the input.
    let o = asrc(&[
        "retokenize",
        copy.to_str().unwrap(),
        "--tokenizer",
        &example("spm.model"),
        "-o",
        copy.to_str().unwrap(),
    ]);
    refused(&o, "is the input");
    assert_eq!(std::fs::read(&copy).unwrap(), before);
    // A missing tokenizer: named, and no output.
    let out = dir.path().join("out.asrcorpus");
    let o = asrc(&[
        "retokenize",
        copy.to_str().unwrap(),
        "--tokenizer",
        "/nonexistent/x.model",
        "-o",
        out.to_str().unwrap(),
    ]);
    refused(&o, "/nonexistent/x.model");
    assert!(!out.exists());
    // A file that is not a corpus: named.
    let o = asrc(&[
        "retokenize",
        &example("spm.model"),
        "--tokenizer",
        &example("spm.model"),
        "-o",
        out.to_str().unwrap(),
    ]);
    refused(&o, "spm.model");
    assert!(!out.exists());
}
