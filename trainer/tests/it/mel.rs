//! The mel front end against a float64 numpy reference (tests/reference/mel_reference.py: numpy's
//! FFT, its own Slaney filterbank), on a padded batch of two utterances of different lengths.

use std::io::Write;
use std::process::{Command, Stdio};

use asr_corpus::synth::SplitMix64;
use asr_trainer::MelFrontend;
use asr_trainer::PreprocessorConfig;
use burn::backend::NdArray;

fn speechlike(n: usize, seed: u64) -> Vec<i16> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let t = i as f64 / 16_000.0;
            let env = 0.5 + 0.5 * (t * 3.0).sin();
            let v = env
                * (0.3 * (t * 2.0 * std::f64::consts::PI * 220.0).sin()
                    + 0.2 * (t * 2.0 * std::f64::consts::PI * 1375.0).sin()
                    + 0.1 * (t * 2.0 * std::f64::consts::PI * 3900.0).sin())
                + 0.02 * (rng.next_f64() - 0.5);
            (v * 32767.0) as i16
        })
        .collect()
}

#[test]
fn features_match_a_float64_numpy_reference() {
    let _turn = crate::serial();
    let script = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap())
        .join("tests/reference/mel_reference.py");
    let (a, b) = (speechlike(16_000, 1), speechlike(9_731, 2));
    let features = 64;
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with numpy is needed (bash scripts/setup.sh installs it)");
    let req = serde_json::json!({"pcm": [a, b], "features": features});
    child.stdin.take().unwrap().write_all(req.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let reference: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let cfg = PreprocessorConfig { features, dither: 0.0, ..PreprocessorConfig::default() };
    let device = Default::default();
    let mut pcm = a.clone();
    pcm.extend(b.iter().copied());
    pcm.extend(std::iter::repeat_n(0, a.len() - b.len()));
    // Both forms of the front end: on the host (NdArray's default: a real FFT, f64) and as
    // tensor operations (the devices' form: a DFT product in f32).
    let host = MelFrontend::<NdArray>::new(&cfg, &device);
    assert!(host.runs_on_host());
    let tensor = MelFrontend::<NdArray>::new(&cfg, &device).on_device();
    // (form, largest and mean |difference| allowed): within 5x of what each measured,
    // 2026-11-26: host 2.4e-7 and 1.7e-8 (the features' f32 rounding), tensor 1.1e-4 and 4.2e-6.
    for (name, fe, max_ok, mean_ok) in [("host", host, 1e-6, 8e-8), ("tensor", tensor, 5e-4, 2e-5)]
    {
        let (feats, lens) = fe.forward(&pcm, 2, &[a.len() as u32, b.len() as u32], None, &device);
        let [_, t, f] = feats.dims();
        let ours = feats.into_data().to_vec::<f32>().unwrap();
        let (mut worst, mut sum, mut n) = (0f64, 0f64, 0usize);
        for u in 0..2 {
            let want_len = reference["lens"][u].as_u64().unwrap() as usize;
            assert_eq!(lens[u], want_len);
            for i in 0..t {
                for k in 0..f {
                    let got = f64::from(ours[(u * t + i) * f + k]);
                    if i >= want_len {
                        assert_eq!(got, 0.0, "{name}: padding frame {i} of utterance {u}");
                        continue;
                    }
                    let want = reference["features"][u][i][k].as_f64().unwrap();
                    let d = (got - want).abs();
                    worst = worst.max(d);
                    sum += d;
                    n += 1;
                }
            }
        }
        let mean = sum / n as f64;
        eprintln!(
            "mel front end ({name}) vs float64 numpy: max |diff| {worst:.2e}, mean {mean:.2e} \
             over {n} values"
        );
        assert!(worst < max_ok && mean < mean_ok, "{name}: max {worst}, mean {mean}");
    }
}

/// The host form takes the dither from the same draw as the tensor form: with dither,
/// pre-emphasis and a padded batch, the two give the same features within the tensor form's
/// rounding, and the autodiff backend over NdArray (training's) runs on the host too.
#[test]
fn host_and_tensor_forms_agree_with_dither() {
    let _turn = crate::serial();
    type Ad = burn::backend::Autodiff<NdArray>;
    let cfg = PreprocessorConfig { dither: 1e-3, ..PreprocessorConfig::default() };
    let device = Default::default();
    let (a, b) = (speechlike(24_000, 3), speechlike(13_217, 4));
    let mut pcm = a.clone();
    pcm.extend(b.iter().copied());
    pcm.extend(std::iter::repeat_n(0, a.len() - b.len()));
    let lens = [a.len() as u32, b.len() as u32];
    let host = MelFrontend::<Ad>::new(&cfg, &device);
    assert!(host.runs_on_host());
    let tensor = MelFrontend::<Ad>::new(&cfg, &device).on_device();
    assert!(!tensor.runs_on_host());
    let run = |fe: &MelFrontend<Ad>, seed| {
        let (x, lens) = fe.forward(&pcm, 2, &lens, seed, &device);
        (x.into_data().to_vec::<f32>().unwrap(), lens)
    };
    let (h, hl) = run(&host, Some(5));
    let (t, tl) = run(&tensor, Some(5));
    assert_eq!(hl, tl);
    assert_eq!(h.len(), t.len());
    let worst = h.iter().zip(&t).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    eprintln!("mel front end, host against tensor form with dither: max |diff| {worst:.2e}");
    // Measured 2026-11-26: 3.1e-4 (the tensor form's f32 arithmetic).
    assert!(worst < 1.2e-3, "max {worst}");
    // Another seed is other dither on the host too.
    let (other, _) = run(&host, Some(6));
    assert_ne!(h, other);
}
