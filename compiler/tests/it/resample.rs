//! The resampler against sox's very-high-quality `rate` effect, the reference tool (at least
//! 40 dB SNR for content below 0.9 x the lower Nyquist frequency), and against the exact values
//! of the band-limited test signal at the output instants.

use std::process::Command;

use asr_compiler::{Resampler, TARGET_RATE};

/// A sum of tones, evaluated exactly at time `t` seconds.
fn tone_value(freqs: &[f64], t: f64) -> f64 {
    let s: f64 = freqs
        .iter()
        .enumerate()
        .map(|(k, f)| (2.0 * std::f64::consts::PI * f * t + k as f64).sin())
        .sum();
    0.8 * s / freqs.len() as f64
}

fn tones(rate: u32, seconds: f64, freqs: &[f64]) -> Vec<f32> {
    let n = (f64::from(rate) * seconds) as usize;
    (0..n).map(|i| tone_value(freqs, i as f64 / f64::from(rate)) as f32).collect()
}

/// sox's resampling of `x` from `rate` to 16 kHz (32-bit float raw in and out).
fn sox(x: &[f32], rate: u32) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let (i, o) = (dir.path().join("in.f32"), dir.path().join("out.f32"));
    std::fs::write(&i, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let raw = |r: u32| {
        ["-t", "raw", "-e", "floating-point", "-b", "32", "-c", "1", "-r"]
            .map(String::from)
            .into_iter()
            .chain([r.to_string()])
    };
    let status = Command::new("sox")
        .args(raw(rate))
        .arg(&i)
        .args(raw(TARGET_RATE))
        .arg(&o)
        .args(["rate", "-v"])
        .status()
        .expect("sox is needed for this test (bash scripts/setup.sh installs it)");
    assert!(status.success());
    std::fs::read(&o)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// SNR in dB of `y` against `reference`, away from the edges where each tool pads differently.
fn snr(y: &[f32], reference: impl Fn(usize) -> f64) -> f64 {
    let edge = 800;
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (k, &v) in y.iter().enumerate().take(y.len() - edge).skip(edge) {
        let r = reference(k);
        signal += r * r;
        noise += (f64::from(v) - r).powi(2);
    }
    10.0 * (signal / noise).log10()
}

#[test]
fn matches_sox_and_the_exact_signal() {
    let mut r = Resampler::new();
    for rate in [8_000u32, 22_050, 44_100, 48_000, 11_025, 24_000, 32_000, 96_000] {
        let band = 0.9 * f64::from(rate.min(TARGET_RATE)) / 2.0;
        let freqs: Vec<f64> = [0.03, 0.2, 0.45, 0.7, 0.97].iter().map(|f| f * band).collect();
        let x = tones(rate, 2.0, &freqs);
        let ours = r.to_target(&x, rate).unwrap();
        let expected_len =
            (x.len() as f64 * f64::from(TARGET_RATE) / f64::from(rate)).round() as i64;
        assert!(
            ours.len() as i64 == expected_len,
            "{rate} Hz: {} samples, expected {expected_len}",
            ours.len()
        );
        let reference = sox(&x, rate);
        let n = ours.len().min(reference.len());
        let vs_sox = snr(&ours[..n], |k| f64::from(reference[k]));
        let vs_exact = snr(&ours, |k| tone_value(&freqs, k as f64 / f64::from(TARGET_RATE)));
        eprintln!("{rate} Hz -> 16 kHz: {vs_sox:.1} dB against sox, {vs_exact:.1} dB against the exact signal");
        assert!(vs_sox >= 40.0, "{rate} Hz: SNR {vs_sox:.1} dB against sox");
        assert!(vs_exact >= 60.0, "{rate} Hz: SNR {vs_exact:.1} dB against the exact signal");
    }
}

#[test]
fn sixteen_khz_passes_through_and_empty_stays_empty() {
    let mut r = Resampler::new();
    let x = tones(16_000, 0.1, &[440.0]);
    assert_eq!(r.to_target(&x, 16_000).unwrap(), x);
    assert!(r.to_target(&[], 44_100).unwrap().is_empty());
    assert!(r.to_target(&x, 0).is_err());
}
