//! A micro-batch the device has no memory for stops training with an error that names the batch
//! and suggests a `sampler.max_batch_seconds`, instead of training on the garbage a failed
//! CubeCL allocation leaves behind. Run for real on wgpu (Mesa's lavapipe), whose largest
//! storage buffer is 128 MiB: the joint's hidden activations of 12 utterances of 6-8 s
//! (`[12, ~100, ~60, 640]` f32, about 180 MiB) cannot be allocated there, while one utterance's
//! fit; with and without Burn's fusion. The run uses its own wgpu device (`WgpuDevice::Cpu`), so the failure does not touch the
//! default device that other tests share.

use asr_corpus::synth::SynthSpec;
use asr_corpus::{CorpusWriter, WriterOptions};
use asr_trainer::{
    assemble, lattice_cells, AudioFormat, DataSpec, ShapePolicy, TrainConfig, TrainError, Trainer,
    TrainingSet,
};

#[test]
fn a_micro_batch_too_large_for_the_device_is_named_with_a_batch_size_that_fits() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        min_samples: 96_000,
        max_samples: 128_000,
        vocab_size: 48,
        max_tokens: 60,
        ..SynthSpec::default()
    };
    let path = dir.path().join("long.asrcorpus");
    let mut w = CorpusWriter::create(
        &path,
        WriterOptions::new(spec.vocab_size, "sentencepiece", b"m".to_vec()),
    )
    .unwrap();
    for i in 0..12 {
        w.push(&spec.utterance(i).as_input()).unwrap();
    }
    w.finish().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(path)]).unwrap();
    train_out_of_memory::<burn::backend::Autodiff<burn::backend::Wgpu>>(&set, "wgpu");
    train_out_of_memory::<burn::backend::Autodiff<asr_trainer::FusedWgpu>>(&set, "fused wgpu");
}

/// The body of the test above on backend `B`: one utterance trains, all twelve are refused.
fn train_out_of_memory<B>(set: &TrainingSet, name: &str)
where
    B: burn::tensor::backend::AutodiffBackend<Device = burn::backend::wgpu::WgpuDevice>
        + asr_tdt::op::TdtBackend,
{
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
         [model.joint]\njoint_hidden = 640\n[sampler]\nmax_batch_seconds = 100.0\n",
    )
    .unwrap();
    let vocab = set.tokenizer().0 as usize;
    let mut t = Trainer::<B>::new(cfg, vocab, burn::backend::wgpu::WgpuDevice::Cpu).unwrap();

    let one = assemble(set, &[3], ShapePolicy::default(), AudioFormat::I16);
    let g = t.gradients_at(std::slice::from_ref(&one), &[0], 1.0).unwrap();
    assert!(g.loss.is_finite());

    let all: Vec<u32> = (0..12).collect();
    let big = assemble(set, &all, ShapePolicy::default(), AudioFormat::I16);
    let err = match t.gradients_at(std::slice::from_ref(&big), &[1], 1.0) {
        Err(TrainError::OutOfMemory(r)) => r,
        Err(e) => panic!("{name}: another error: {e}"),
        Ok(g) => panic!("{name}: the batch ran (loss {}): no failure was seen", g.loss),
    };
    let message = err.to_string();
    eprintln!("{name}: {message}");
    assert_eq!((err.micro_batch, err.utterances), (1, 12));
    let longest = *big.audio_lens.iter().max().unwrap() as f64 / 16_000.0;
    assert!((err.longest_seconds - longest).abs() < 1e-9);
    assert_eq!(err.tokens, big.token_lens.iter().map(|&n| u64::from(n)).sum::<u64>());
    assert!(err.bytes > 128 << 20, "{} bytes", err.bytes);
    // This batch's audio (below the setting of 100 s) scaled from the one-utterance batch that
    // fitted, with a 10 % margin.
    let ratio = lattice_cells(&one) as f64 / lattice_cells(&big) as f64;
    assert!(big.seconds < 100.0);
    assert!((err.suggested - (big.seconds * ratio * 0.9 * 10.0).floor() / 10.0).abs() < 1e-9);
    assert!(err.suggested > 0.0 && err.suggested < 100.0);
    assert!(message.contains(&format!("sampler.max_batch_seconds = {:.1}", err.suggested)));
    assert!(message.contains("12 utterances"), "{message}");
}

/// Decoding a batch the device has no memory for is an error naming the batch and the flag to
/// change (`asrt eval --batch-seconds`), with and without fusion; the device decodes a smaller
/// batch afterwards. Twelve 30 s utterances through a `tiny` encoder with 128 subsampling
/// channels: the first subsampling stage's output (`[12, 1500, 32, 128]` f32, 295 MB) is past
/// lavapipe's largest buffer, one utterance's (25 MB) is not.
#[test]
fn a_decoding_batch_too_large_for_the_device_is_named() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let spm = crate::example_spm();
    let spec = SynthSpec {
        min_samples: 480_000,
        max_samples: 480_000,
        vocab_size: 320,
        max_tokens: 8,
        ..SynthSpec::default()
    };
    let path = dir.path().join("long.asrcorpus");
    spec.write_corpus(&path, 12, &spm).unwrap();
    let corpus = asr_corpus::Corpus::open(&path).unwrap();
    let mut cfg = asr_trainer::ModelConfig::tiny();
    cfg.encoder.n_layers = 1;
    cfg.encoder.subsampling_conv_channels = 128;
    decode_out_of_memory::<burn::backend::Wgpu>(&cfg, &corpus, "wgpu");
    decode_out_of_memory::<asr_trainer::FusedWgpu>(&cfg, &corpus, "fused wgpu");
}

fn decode_out_of_memory<
    B: burn::tensor::backend::Backend<Device = burn::backend::wgpu::WgpuDevice>,
>(
    cfg: &asr_trainer::ModelConfig,
    corpus: &asr_corpus::Corpus,
    name: &str,
) {
    use asr_trainer::{evaluate, EvalError};
    let device = burn::backend::wgpu::WgpuDevice::Cpu;
    let model = asr_trainer::TdtModel::<B>::new(cfg, 320, 3, &device);
    let all: Vec<usize> = (0..12).collect();
    match evaluate(&model, cfg, corpus, &all, 400.0, &device) {
        Err(e @ EvalError::Device { .. }) => {
            let message = e.to_string();
            eprintln!("{name}: {message}");
            assert!(message.contains("12 utterances"), "{name}: {message}");
            assert!(message.contains("asrt eval --batch-seconds"), "{name}: {message}");
            assert!(message.contains("could not allocate"), "{name}: {message}");
        }
        Err(e) => panic!("{name}: another error: {e}"),
        Ok(_) => panic!("{name}: the batch decoded: no failure was seen"),
    }
    let one = evaluate(&model, cfg, corpus, &[0], 31.0, &device).unwrap();
    assert_eq!(one.utterances.len(), 1, "{name}");
}
