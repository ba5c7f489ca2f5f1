//! One way to load a model: a training checkpoint, a `.nemo` and an imported directory resolve
//! through `ModelSource`, and every use checks the tokenizer by hash as well as size.

use std::path::Path;

use asr_corpus::synth::SynthSpec;
use asr_corpus::Corpus;
use asr_trainer::model_source::{Expected, ModelSource, ModelSourceError, TokenizerId};
use asr_trainer::{
    evaluate_model_cpu, run_cpu, DataSpec, EvalError, RunOptions, TrainConfig, TrainError,
};

fn nemo_fixture() -> std::path::PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/nemo/tiny-tdt.nemo")
}

/// A 2-step run on a corpus tokenized by `model` (48 pieces).
fn train(dir: &Path, model: &[u8]) -> (std::path::PathBuf, std::path::PathBuf) {
    let spec = SynthSpec {
        min_samples: 4_000,
        max_samples: 16_000,
        vocab_size: 48,
        max_tokens: 6,
        ..SynthSpec::default()
    };
    let corpus = dir.join("train.asrcorpus");
    spec.write_corpus(&corpus, 8, model).unwrap();
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\n[train]\nmax_steps = 2\ngrad_accum = 1\n\
         checkpoint_every = 2\n[sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let out = dir.join("run");
    let opts = RunOptions {
        data: vec![DataSpec::new(&corpus)],
        out: out.clone(),
        resume: false,
        stop_at: None,
        val_corpus: None,
        init: None,
        allow_unmapped: false,
    };
    run_cpu(cfg, &opts, &mut |_, _| {}).unwrap();
    (corpus, out)
}

#[test]
fn sources_resolve_to_their_kind_and_describe_their_settings() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let (corpus, run) = train(dir.path(), b"model one");
    // A run directory resolves to its newest checkpoint.
    let source = ModelSource::resolve(&run).unwrap();
    assert!(
        matches!(&source, ModelSource::Checkpoint(p) if p.ends_with("step-00000002")),
        "{source:?}"
    );
    let info = source.describe().unwrap();
    let corpus = Corpus::open(&corpus).unwrap();
    assert_eq!(info.tokenizer, TokenizerId::of_corpus(&corpus));
    assert_eq!(info.step, Some(2));
    let nemo = ModelSource::resolve(&nemo_fixture()).unwrap();
    assert!(matches!(nemo, ModelSource::Nemo(_)));
    let info = nemo.describe().unwrap();
    assert_eq!((info.tokenizer.vocab, info.loss.sigma, info.step), (320, 0.05, None));
    // Anything else is named as not a model.
    let e = ModelSource::resolve(dir.path()).unwrap_err();
    assert!(matches!(&e, ModelSourceError::NotAModel { path } if path == dir.path()), "{e}");
}

/// A checkpoint used to be checked against a corpus by vocabulary size alone: a corpus of the
/// same size from another tokenizer was decoded with the wrong pieces.
#[test]
fn a_checkpoint_refuses_a_corpus_of_another_tokenizer_of_the_same_size() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let (_, run) = train(dir.path(), b"model one");
    let spec = SynthSpec { vocab_size: 48, max_tokens: 6, ..SynthSpec::default() };
    let other = dir.path().join("other.asrcorpus");
    spec.write_corpus(&other, 4, b"model two").unwrap();
    let other = Corpus::open(&other).unwrap();
    let e = evaluate_model_cpu(&run, &other, None, 60.0).unwrap_err();
    let EvalError::Source(ModelSourceError::Tokenizer { model, expected, what, .. }) = &e else {
        panic!("expected a tokenizer mismatch, got {e}");
    };
    assert_eq!((model.vocab, expected.vocab, *what), (48, 48, Expected::Corpus));
    assert_ne!(model.xxh3, expected.xxh3);
    assert!(e.to_string().contains("is not the corpus's"), "{e}");
}

/// `--init` takes a training checkpoint too, and refuses one of another tokenizer.
#[test]
fn init_takes_a_checkpoint_and_checks_its_tokenizer() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let (corpus, run) = train(dir.path(), b"model one");
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\n[train]\nmax_steps = 1\ngrad_accum = 1\n\
         checkpoint_every = 0\n[sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let opts = |data: &Path, out: &str| RunOptions {
        data: vec![DataSpec::new(data)],
        out: dir.path().join(out),
        resume: false,
        stop_at: None,
        val_corpus: None,
        init: Some(run.clone()),
        allow_unmapped: false,
    };
    let s = run_cpu(cfg.clone(), &opts(&corpus, "from-checkpoint"), &mut |_, _| {}).unwrap();
    assert_eq!(s.steps, 1);
    let spec = SynthSpec { vocab_size: 48, max_tokens: 6, ..SynthSpec::default() };
    let other = dir.path().join("other.asrcorpus");
    spec.write_corpus(&other, 8, b"model two").unwrap();
    let e = run_cpu(cfg, &opts(&other, "refused"), &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(
            &e,
            TrainError::Source(ModelSourceError::Tokenizer { what: Expected::TrainingSet, .. })
        ),
        "{e}"
    );
    assert!(!dir.path().join("refused").join("metrics.jsonl").exists());
}
