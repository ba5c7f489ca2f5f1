//! A few `tiny` training steps on Burn's wgpu backend (the TDT kernels, the model's ops on the
//! device) against the same steps on the CPU backend (NdArray, the float64 TDT path), from the
//! same initial weights and batches. Dropout and dither are off (the log-mel of near-silent
//! frames amplifies f32 differences in the dither); SpecAugment masks come from the host, so
//! both backends see the same inputs.
//!
//! Tolerances: per-step losses agree to 1e-5 relative and gradient norms to 1e-4 (measured:
//! 1e-7 and 1.4e-5; f32 rounding, and the TDT lattice in f32 instead of f64). This test found
//! that a rank-4 `Linear` got a wrong bias gradient on the CubeCL backend (the subsampling's
//! pointwise projections now run as rank-2 `Linear`s).

use asr_trainer::{
    assemble, AudioFormat, DataSpec, ShapePolicy, TrainConfig, Trainer, TrainingSet,
};
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};

type Cpu = burn::backend::Autodiff<burn::backend::NdArray>;
type Gpu = burn::backend::Autodiff<burn::backend::Wgpu>;

/// Every float parameter's values, in the module's order.
struct Values(Vec<Vec<f32>>);

impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Values {
    fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<burn::tensor::Tensor<B, D>>) {
        self.0.push(p.val().into_data().convert::<f32>().into_vec::<f32>().unwrap());
    }
}

fn initial_weights<B: burn::tensor::backend::Backend>(seed: u64) -> Vec<Vec<f32>> {
    let mut cfg = asr_trainer::ModelConfig::tiny();
    cfg.encoder.n_layers = 1;
    let model = asr_trainer::TdtModel::<B>::new(&cfg, 40, seed, &Default::default());
    let mut v = Values(Vec::new());
    model.visit(&mut v);
    v.0
}

/// One seed is one model on every backend: each backend draws from its own generator (the GPU
/// kit's first CUDA run started from another model than its CPU reference), so the weights are
/// drawn on the host and copied. Bit for bit, on wgpu against the CPU backend.
#[test]
fn one_seed_gives_the_same_initial_weights_on_every_backend() {
    let _turn = crate::serial();
    let cpu = initial_weights::<burn::backend::NdArray>(7);
    let gpu = initial_weights::<burn::backend::Wgpu>(7);
    assert!(cpu.len() > 20, "{} parameters", cpu.len());
    assert_eq!(cpu, gpu);
    // On the training backends too, and another seed is another model.
    assert_eq!(initial_weights::<Cpu>(7), cpu);
    assert_ne!(initial_weights::<burn::backend::NdArray>(8), cpu);
}

#[test]
fn tiny_steps_on_wgpu_match_the_cpu_backend() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 12))]).unwrap();
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
         [train]\ngrad_accum = 2\n\
         [sampler]\nmax_batch_seconds = 4.0\n[optim]\nlr = 1e-3\nwarmup_steps = 0\n",
    )
    .unwrap();
    let vocab = set.tokenizer().0 as usize;
    let steps: Vec<Vec<_>> = (0..3u32)
        .map(|s| {
            (0..2u32)
                .map(|k| {
                    let idx: Vec<u32> = (0..2).map(|j| (s * 4 + k * 2 + j) % 12).collect();
                    assemble(&set, &idx, ShapePolicy::default(), AudioFormat::I16)
                })
                .collect()
        })
        .collect();

    let mut cpu = Trainer::<Cpu>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let mut gpu = Trainer::<Gpu>::new(cfg, vocab, Default::default()).unwrap();
    // The backends draw initial weights from different generators: start the GPU model from
    // the CPU model's weights.
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(cpu.model.clone().into_record(), ()).unwrap();
    let record = recorder.load(bytes, &Default::default()).unwrap();
    gpu.model = gpu.model.clone().load_record(record);

    for (s, batches) in steps.iter().enumerate() {
        let a = cpu.train_step(batches, &set, 0).unwrap();
        let b = gpu.train_step(batches, &set, 0).unwrap();
        eprintln!(
            "step {s}: loss cpu {:.6} wgpu {:.6}, grad norm cpu {:.6} wgpu {:.6}",
            a.loss, b.loss, a.grad_norm, b.grad_norm
        );
        assert!(!a.skipped && !b.skipped);
        assert!(
            (a.loss - b.loss).abs() <= 1e-5 * a.loss.abs(),
            "step {s}: loss {} vs {}",
            a.loss,
            b.loss
        );
        assert!(
            (a.grad_norm - b.grad_norm).abs() <= 1e-4 * a.grad_norm,
            "step {s}: gradient norm {} vs {}",
            a.grad_norm,
            b.grad_norm
        );
    }
}

/// `asrt train --device wgpu`: the run trains and checkpoints on wgpu, and `asrt eval` decodes
/// the corpus with its checkpoint on wgpu as on the CPU: the same hypotheses, the same rates.
/// The corpus carries a real SentencePiece model (the example's), so hypotheses are text.
#[test]
fn asrt_trains_and_evaluates_on_wgpu() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let spm = std::fs::read(
        std::path::Path::new(
            &std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        )
        .join("../examples/espeak/spm.model"),
    )
    .unwrap();
    let spec = asr_corpus::synth::SynthSpec {
        min_samples: 4_000,
        max_samples: 24_000,
        vocab_size: 320,
        max_tokens: 8,
        ..asr_corpus::synth::SynthSpec::default()
    };
    let corpus = dir.path().join("c.asrcorpus");
    spec.write_corpus(&corpus, 12, &spm).unwrap();
    let config = dir.path().join("train.toml");
    std::fs::write(
        &config,
        "[model.encoder]\nn_layers = 1\n[train]\ngrad_accum = 1\ncheckpoint_every = 3\n\
         [sampler]\nmax_batch_seconds = 4.0\n",
    )
    .unwrap();
    let run = dir.path().join("run");
    let asrt = |args: &[&std::ffi::OsStr]| {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_asrt")).args(args).output().unwrap();
        assert!(out.status.success(), "asrt {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    asrt(&[
        os("train").as_os_str(),
        corpus.as_os_str(),
        os("--config").as_os_str(),
        config.as_os_str(),
        os("--out").as_os_str(),
        run.as_os_str(),
        os("--max-steps").as_os_str(),
        os("3").as_os_str(),
        os("--device").as_os_str(),
        os("wgpu").as_os_str(),
        os("--quiet").as_os_str(),
    ]);
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> =
        metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for m in &lines {
        assert_eq!(m["skipped"], false, "{m}");
        assert!(m["loss"].as_f64().unwrap().is_finite(), "{m}");
    }
    assert!(run.join("checkpoints").join("latest").is_file());

    let eval = |device: &str| -> serde_json::Value {
        let out = asrt(&[
            os("eval").as_os_str(),
            corpus.as_os_str(),
            os("--checkpoint").as_os_str(),
            run.as_os_str(),
            os("--json").as_os_str(),
            os("--device").as_os_str(),
            os(device).as_os_str(),
        ]);
        serde_json::from_str(&out).unwrap()
    };
    let (on_wgpu, on_cpu) = (eval("wgpu"), eval("cpu"));
    let hypotheses = |e: &serde_json::Value| -> Vec<String> {
        e["utterances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["hypothesis"].as_str().unwrap().to_owned())
            .collect()
    };
    let h = hypotheses(&on_wgpu);
    assert_eq!(h.len(), 12);
    eprintln!("wgpu hypotheses: {h:?}");
    assert_eq!(h, hypotheses(&on_cpu), "wgpu and the CPU decode differently");
    assert_eq!(on_wgpu["overall"], on_cpu["overall"]);
}
