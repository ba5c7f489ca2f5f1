//! `Trainer::encoder_surrogate` (`asrt-bench train-step --part encoder`, the encoder measured
//! against PyTorch's): its loss is the mean square of the encoder's output, recomputed here from
//! the public pieces (the mel front end, `TdtModel::encode`) and summed in float64 on the host,
//! with dither, SpecAugment and dropout off so that both sides see the same features.

use asr_trainer::{
    assemble, Audio, AudioFormat, DataSpec, MelFrontend, ShapePolicy, TrainConfig, Trainer,
    TrainingSet,
};

type Ad = burn::backend::Autodiff<burn::backend::NdArray>;

/// Relative difference between the trainer's f32 mean and the float64 sum of the same squares.
const BOUND: f64 = 1e-6;

#[test]
fn encoder_surrogate_is_the_mean_square_of_the_encoder_output() {
    let _turn = crate::serial();
    let dir = tempfile::tempdir().unwrap();
    let set = TrainingSet::open(&[DataSpec::new(crate::parallel::corpus(dir.path(), 12))]).unwrap();
    let vocab = set.tokenizer().0 as usize;
    let batch = assemble(&set, &[0, 3, 5], ShapePolicy::default(), AudioFormat::I16);
    let cfg = TrainConfig::from_toml(
        "[model.encoder]\nn_layers = 1\ndropout = 0.0\n[model.preprocessor]\ndither = 0.0\n\
         [model.spec_augment]\nfreq_masks = 0\ntime_masks = 0\n",
    )
    .unwrap();
    let mut t = Trainer::<Ad>::new(cfg.clone(), vocab, Default::default()).unwrap();
    let got = t.encoder_surrogate(&batch, true).unwrap();
    assert_eq!(t.micro, 1, "one micro-batch done");
    let Audio::I16(pcm) = &batch.audio else { panic!("assembled as i16") };
    let frontend = MelFrontend::<Ad>::new(&cfg.model.preprocessor, &t.device);
    let (feats, lens) = frontend.forward(pcm, batch.size(), &batch.audio_lens, None, &t.device);
    let (enc, _) = t.model.encode(&cfg.model, feats, &lens);
    let v: Vec<f32> = enc.into_data().to_vec().unwrap();
    let want = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / v.len() as f64;
    let rel = (got - want).abs() / want;
    eprintln!("encoder surrogate {got} vs {want}: relative {rel:.2e}");
    assert!(want > 0.0 && rel <= BOUND, "encoder surrogate {got} vs float64 {want}: {rel:.2e}");
    // A second call is the next micro-batch.
    t.encoder_surrogate(&batch, false).unwrap();
    assert_eq!(t.micro, 2);
}
