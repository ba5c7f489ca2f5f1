//! The resampler against its specification and against sox's very-high-quality `rate` effect,
//! the reference tool, for every common input rate: tones in the passband come through within
//! 0.1 dB and clean to 90 dB, tones in the stopband are 90 dB down, white noise comes out with
//! the spectrum sox gives it, and a band-limited signal matches both sox and its exact values at
//! the output instants.

use std::process::Command;

use asr_compiler::{Resampler, TARGET_RATE};

const RATES: [u32; 8] = [8_000, 11_025, 22_050, 24_000, 32_000, 44_100, 48_000, 96_000];

/// Output samples ignored at each end, where each tool pads differently.
const EDGE: usize = 800;

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

/// Deterministic white noise, uniform in [-0.5, 0.5).
fn white_noise(n: usize, mut state: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f64 / (1u64 << 24) as f64 - 0.5) as f32
        })
        .collect()
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

/// SNR in dB of `y` against `reference`, away from the edges.
fn snr(y: &[f32], reference: impl Fn(usize) -> f64) -> f64 {
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (k, &v) in y.iter().enumerate().take(y.len() - EDGE).skip(EDGE) {
        let r = reference(k);
        signal += r * r;
        noise += (f64::from(v) - r).powi(2);
    }
    10.0 * (signal / noise).log10()
}

/// The tone of frequency `f` (Hz) that best fits `y` (16 kHz) away from the edges, by least
/// squares: its amplitude, and the power of what is left, relative to the tone's.
fn fit_tone(y: &[f32], f: f64) -> (f64, f64) {
    let w = 2.0 * std::f64::consts::PI * f / f64::from(TARGET_RATE);
    let mid = &y[EDGE..y.len() - EDGE];
    let (mut cc, mut ss, mut cs, mut yc, mut ys) = (0.0f64, 0.0, 0.0, 0.0, 0.0);
    for (k, &v) in mid.iter().enumerate() {
        let (s, c) = ((w * k as f64).sin(), (w * k as f64).cos());
        let v = f64::from(v);
        (cc, ss, cs, yc, ys) = (cc + c * c, ss + s * s, cs + c * s, yc + v * c, ys + v * s);
    }
    let det = cc * ss - cs * cs;
    let (a, b) = ((yc * ss - ys * cs) / det, (ys * cc - yc * cs) / det);
    let residual: f64 = mid
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let fit = a * (w * k as f64).cos() + b * (w * k as f64).sin();
            (f64::from(v) - fit).powi(2)
        })
        .sum::<f64>()
        / mid.len() as f64;
    let amplitude = (a * a + b * b).sqrt();
    (amplitude, residual / (amplitude * amplitude / 2.0))
}

fn db(power_ratio: f64) -> f64 {
    10.0 * power_ratio.log10()
}

/// Mean power of `y` away from the edges.
fn power(y: &[f32]) -> f64 {
    let mid = &y[EDGE..y.len() - EDGE];
    mid.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / mid.len() as f64
}

#[test]
fn passband_flat_to_a_tenth_of_a_db_and_stopband_90_db_down_at_every_rate() {
    let mut r = Resampler::new();
    for rate in RATES {
        let band = f64::from(rate.min(TARGET_RATE)) / 2.0;
        // Passband: gain within 0.1 dB up to 0.9 B, and nothing else in the output (aliases
        // of a downsampled tone, images of an upsampled one) above -90 dB.
        for fraction in [0.02, 0.25, 0.5, 0.75, 0.85, 0.9] {
            let f = fraction * band;
            let x = tones(rate, 1.0, &[f]);
            for (tool, y) in [("asrc", r.to_target(&x, rate).unwrap()), ("sox", sox(&x, rate))] {
                let (amplitude, rest) = fit_tone(&y, f);
                let gain = 20.0 * (amplitude / 0.8).log10();
                eprintln!(
                    "{rate} Hz, {f:.0} Hz tone: {tool} gain {gain:+.4} dB, rest {:.1} dB",
                    db(rest)
                );
                if tool == "asrc" {
                    assert!(gain.abs() <= 0.1, "{rate} Hz, {f:.0} Hz: gain {gain:+.3} dB");
                    assert!(db(rest) <= -90.0, "{rate} Hz, {f:.0} Hz: rest {:.1} dB", db(rest));
                }
            }
        }
        // Stopband (only a rate above 16 kHz has one): a tone from 8 kHz up to just below the
        // input's Nyquist frequency leaves at most -90 dB of output.
        if rate > TARGET_RATE {
            let nyquist = f64::from(rate) / 2.0;
            for fraction in [0.0, 0.01, 0.05, 0.2, 0.5, 0.8, 0.98] {
                let f = band + fraction * (nyquist - band);
                let x = tones(rate, 1.0, &[f]);
                let input = 0.8f64 * 0.8 / 2.0;
                for (tool, y) in [("asrc", r.to_target(&x, rate).unwrap()), ("sox", sox(&x, rate))]
                {
                    let level = db(power(&y) / input);
                    eprintln!("{rate} Hz, {f:.0} Hz tone: {tool} output {level:.1} dB");
                    if tool == "asrc" {
                        assert!(level <= -90.0, "{rate} Hz, {f:.0} Hz: output {level:.1} dB");
                    }
                }
            }
        }
    }
}

/// Power of `y` (16 kHz) in bands of `width` Hz, averaged over Hann-windowed 1024-sample
/// periodograms that overlap by half, away from the edges.
fn band_powers(y: &[f32], width: f64) -> Vec<f64> {
    use realfft::RealFftPlanner;
    let n = 1024;
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n);
    let window: Vec<f64> =
        (0..n).map(|i| (std::f64::consts::PI * i as f64 / n as f64).sin().powi(2)).collect();
    let mid = &y[EDGE..y.len() - EDGE];
    let mut bins = vec![0.0f64; n / 2 + 1];
    let (mut input, mut output) = (fft.make_input_vec(), fft.make_output_vec());
    for start in (0..mid.len() - n).step_by(n / 2) {
        for (i, v) in input.iter_mut().enumerate() {
            *v = f64::from(mid[start + i]) * window[i];
        }
        fft.process(&mut input, &mut output).unwrap();
        for (b, c) in bins.iter_mut().zip(&output) {
            *b += c.norm_sqr();
        }
    }
    let hz_per_bin = f64::from(TARGET_RATE) / n as f64;
    let bands = (f64::from(TARGET_RATE) / 2.0 / width).round() as usize;
    let mut out = vec![0.0f64; bands];
    for (j, b) in bins.iter().enumerate().take(n / 2) {
        out[((j as f64 * hz_per_bin) / width) as usize] += b;
    }
    out
}

#[test]
fn white_noise_comes_out_with_the_spectrum_sox_gives_it() {
    let mut r = Resampler::new();
    for rate in RATES {
        let band = f64::from(rate.min(TARGET_RATE)) / 2.0;
        let x = white_noise(3 * rate as usize, u64::from(rate));
        let ours = band_powers(&r.to_target(&x, rate).unwrap(), 250.0);
        let reference = band_powers(&sox(&x, rate), 250.0);
        let full: f64 = reference.iter().take((0.9 * band / 250.0) as usize).sum::<f64>()
            / (0.9 * band / 250.0).floor();
        for (k, (o, s)) in ours.iter().zip(&reference).enumerate() {
            let (lo, hi) = (k as f64 * 250.0, (k + 1) as f64 * 250.0);
            let (ours_db, sox_db) = (db(o / full), db(s / full));
            if hi <= 0.9 * band {
                // Passband: the same power as sox's output, band by band.
                assert!(
                    (ours_db - sox_db).abs() <= 0.1,
                    "{rate} Hz, {lo}-{hi} Hz: {ours_db:.2} dB, sox {sox_db:.2} dB"
                );
            } else if lo >= band {
                // Above the band the input and output share (an upsampled signal's images):
                // as clean as sox.
                assert!(
                    ours_db <= sox_db.max(-90.0) + 3.0,
                    "{rate} Hz, {lo}-{hi} Hz: {ours_db:.1} dB, sox {sox_db:.1} dB"
                );
            } else if lo >= 0.96 * band {
                eprintln!("{rate} Hz, {lo}-{hi} Hz: asrc {ours_db:.1} dB, sox {sox_db:.1} dB");
                // The top of the transition band, where the old resampler let 24-31 dB more
                // through than sox: not more than sox plus 3 dB.
                assert!(
                    ours_db <= sox_db + 3.0,
                    "{rate} Hz, {lo}-{hi} Hz: {ours_db:.1} dB, sox {sox_db:.1} dB"
                );
            }
        }
    }
}

#[test]
fn matches_sox_and_the_exact_signal() {
    let mut r = Resampler::new();
    for rate in RATES {
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
        assert!(vs_sox >= 60.0, "{rate} Hz: SNR {vs_sox:.1} dB against sox");
        assert!(vs_exact >= 90.0, "{rate} Hz: SNR {vs_exact:.1} dB against the exact signal");
    }
}

#[test]
fn lengths_round_to_nearest_for_short_and_odd_inputs() {
    let mut r = Resampler::new();
    for rate in [8_000u32, 44_100, 48_000, 44_101, 96_000] {
        for n in [1usize, 2, 5, 441, 1000, 12_345] {
            let x = white_noise(n, 7);
            let y = r.to_target(&x, rate).unwrap();
            let expected = (n as f64 * f64::from(TARGET_RATE) / f64::from(rate)).round() as usize;
            assert_eq!(y.len(), expected, "{rate} Hz, {n} samples");
            assert!(y.iter().all(|v| v.is_finite() && v.abs() < 2.0), "{rate} Hz, {n} samples");
        }
    }
}

#[test]
fn sixteen_khz_passes_through_and_empty_stays_empty() {
    let mut r = Resampler::new();
    let x = tones(16_000, 0.1, &[440.0]);
    assert_eq!(r.to_target(&x, 16_000).unwrap(), x);
    assert!(r.to_target(&[], 44_100).unwrap().is_empty());
    assert!(r.to_target(&x, 0).is_err());
    assert!(r.to_target(&x, 1_000_000).is_err());
}
