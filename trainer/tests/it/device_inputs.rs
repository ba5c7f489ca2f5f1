//! What the trainer makes on the device from small uploads, against host references: the PCM
//! unpacked from 16-bit pairs, SpecAugment masks from their intervals, and dither drawn from a
//! seed. On the CPU backend (64-bit integers) and on wgpu (32-bit integers, Mesa's lavapipe).

use asr_trainer::{unpack_pcm, SpecAugmentConfig, SpecAugmentDraws};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use asr_corpus::synth::SplitMix64;

fn pcm_cases() -> Vec<(usize, usize, Vec<i16>)> {
    let mut rng = SplitMix64::new(5);
    let mut cases = Vec::new();
    // Odd and even sample counts, odd batch sizes (a pair can straddle two rows), the extremes.
    for (batch, samples) in [(1, 1), (1, 2), (3, 7), (2, 1600), (5, 333)] {
        let mut pcm: Vec<i16> =
            (0..batch * samples).map(|_| rng.below(65_536) as i64 as i16).collect();
        for (k, v) in [i16::MIN, i16::MAX, -1, 0, 1, -32_767, 32_766].into_iter().enumerate() {
            if k < pcm.len() {
                pcm[k] = v;
            }
        }
        cases.push((batch, samples, pcm));
    }
    cases
}

fn check_pcm<B: Backend>(device: &B::Device) {
    for (batch, samples, pcm) in pcm_cases() {
        let got: Vec<f32> = unpack_pcm::<B>(&pcm, batch, samples, device)
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap();
        let want: Vec<f32> = pcm.iter().map(|&s| f32::from(s)).collect();
        assert_eq!(got, want, "{batch} x {samples}");
    }
}

fn check_spec_augment<B: Backend>(device: &B::Device) {
    let mut rng = SplitMix64::new(9);
    let configs = [
        SpecAugmentConfig::default(),
        SpecAugmentConfig { freq_masks: 0, freq_width: 27, time_masks: 3, time_width: 0.3 },
        SpecAugmentConfig { freq_masks: 4, freq_width: 80, time_masks: 0, time_width: 0.05 },
        SpecAugmentConfig { freq_masks: 1, freq_width: 200, time_masks: 20, time_width: 1.0 },
    ];
    for (c, cfg) in configs.iter().enumerate() {
        let mut masked = 0;
        for seed in 0..4u64 {
            let (b, t, f) = (1 + rng.below(5) as usize, 1 + rng.below(300) as usize, 80);
            let lens: Vec<usize> = (0..b).map(|_| 1 + rng.below(t as u64) as usize).collect();
            let draws = SpecAugmentDraws::draw(cfg, &lens, f, seed);
            let feats: Vec<f32> = (0..b * t * f).map(|i| 1.0 + (i % 7) as f32).collect();
            let x = Tensor::<B, 1>::from_floats(feats.as_slice(), device).reshape([b, t, f]);
            let got: Vec<f32> = draws.apply(x).into_data().convert::<f32>().to_vec().unwrap();
            let mask = draws.host_mask(t, f);
            let want: Vec<f32> = feats.iter().zip(&mask).map(|(x, m)| x * m).collect();
            assert_eq!(got, want, "config {c}, seed {seed}, [{b}, {t}, {f}]");
            masked += mask.iter().filter(|&&m| m == 0.0).count();
        }
        assert!(masked > 0, "config {c}: nothing masked in any draw");
    }
}

/// Dither from the same seed is the same noise (what exact resume needs); another seed gives
/// other noise.
fn check_dither<B: Backend>(device: &B::Device) {
    use asr_trainer::{MelFrontend, PreprocessorConfig};
    let cfg = PreprocessorConfig { dither: 1e-3, ..PreprocessorConfig::default() };
    let front = MelFrontend::<B>::new(&cfg, device);
    let pcm = vec![0i16; 2 * 8000];
    let feats = |seed: Option<u64>| -> Vec<f32> {
        front
            .forward(&pcm, 2, &[8000, 6000], seed, device)
            .0
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap()
    };
    let (a, b, c, none) = (feats(Some(11)), feats(Some(11)), feats(Some(12)), feats(None));
    assert_eq!(a, b, "the same seed draws the same dither");
    assert_ne!(a, c, "another seed draws other dither");
    assert_ne!(a, none, "dither changes silence's features");
}

#[test]
fn cpu_backend() {
    let _turn = crate::serial();
    let device = Default::default();
    check_pcm::<burn::backend::NdArray>(&device);
    check_spec_augment::<burn::backend::NdArray>(&device);
    check_dither::<burn::backend::NdArray>(&device);
}

#[test]
fn wgpu_backend() {
    let _turn = crate::serial();
    let device = Default::default();
    check_pcm::<burn::backend::Wgpu>(&device);
    check_spec_augment::<burn::backend::Wgpu>(&device);
    check_dither::<burn::backend::Wgpu>(&device);
}
