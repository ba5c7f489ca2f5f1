//! FLAC decoding: every rate/channel/depth combination made by a Rust FLAC encoder, a file made
//! by the reference `flac` tool compared with `flac -d`, and deliberately broken files.

use std::process::Command;

use asr_compiler::{decode, decode_file, to_i16, Reject};
use asr_corpus::synth::SplitMix64;

use flacenc::component::BitRepr;
use flacenc::error::Verify;

/// Interleaved test samples at full scale for `bits`.
fn signal(frames: usize, channels: usize, bits: u32, seed: u64) -> Vec<i32> {
    let mut rng = SplitMix64::new(seed);
    let amp = f64::from((1i32 << (bits - 1)) - 1);
    (0..frames * channels)
        .map(|i| {
            let t = (i / channels) as f64;
            let tone = (t * 0.01 * (1 + i % channels) as f64).sin() * 0.6;
            ((tone + 0.3 * (rng.next_f64() - 0.5)) * amp).round() as i32
        })
        .collect()
}

fn encode(samples: &[i32], channels: usize, bits: usize, rate: usize) -> Vec<u8> {
    let config = flacenc::config::Encoder::default().into_verified().unwrap();
    let source = flacenc::source::MemSource::from_samples(samples, channels, bits, rate);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size).unwrap();
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).unwrap();
    sink.as_slice().to_vec()
}

#[test]
fn every_rate_channel_and_depth_decodes_exactly() {
    for rate in [8_000usize, 16_000, 22_050, 44_100, 48_000] {
        for channels in [1usize, 2] {
            for bits in [16u32, 24] {
                let frames = rate / 4 + 37;
                let src = signal(frames, channels, bits, rate as u64 + bits as u64);
                let d = decode(encode(&src, channels, bits as usize, rate)).unwrap();
                assert_eq!(
                    (d.rate, d.channels, d.bits),
                    (rate as u32, channels as u32, Some(bits))
                );
                assert_eq!(d.samples.len(), frames, "{rate} Hz {channels} ch {bits} bit");
                let scale = f64::from(1u32 << (bits - 1));
                for (k, &got) in d.samples.iter().enumerate() {
                    let want = (0..channels).map(|c| f64::from(src[k * channels + c])).sum::<f64>()
                        / channels as f64
                        / scale;
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-7,
                        "{rate} Hz {channels} ch {bits} bit, sample {k}: {got} vs {want}"
                    );
                }
                if bits == 16 && channels == 1 {
                    // 16-bit mono comes back to the same integers.
                    let back: Vec<i32> = to_i16(&d.samples).into_iter().map(i32::from).collect();
                    assert_eq!(back, src);
                }
            }
        }
    }
}

#[test]
fn matches_the_reference_flac_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let src: Vec<i16> = signal(20_000, 2, 16, 5).into_iter().map(|s| s as i16).collect();
    let raw = dir.path().join("in.raw");
    std::fs::write(&raw, src.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let flac = dir.path().join("x.flac");
    let ok = Command::new("flac")
        .args([
            "--silent",
            "--force-raw-format",
            "--endian=little",
            "--sign=signed",
            "--channels=2",
            "--bps=16",
            "--sample-rate=44100",
            "-o",
        ])
        .arg(&flac)
        .arg(&raw)
        .status()
        .expect("flac is needed for this test (bash scripts/setup.sh installs it)");
    assert!(ok.success());
    let out = dir.path().join("out.raw");
    let ok = Command::new("flac")
        .args(["--silent", "-d", "--force-raw-format", "--endian=little", "--sign=signed", "-o"])
        .arg(&out)
        .arg(&flac)
        .status()
        .unwrap();
    assert!(ok.success());
    let reference: Vec<i16> = std::fs::read(&out)
        .unwrap()
        .chunks_exact(2)
        .map(|c| i16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(reference, src, "flac round trip");
    let d = decode_file(&flac).unwrap();
    assert_eq!((d.rate, d.channels), (44_100, 2));
    for (k, &got) in d.samples.iter().enumerate() {
        let want = (f32::from(reference[2 * k]) / 32768.0
            + f32::from(reference[2 * k + 1]) / 32768.0)
            * 0.5;
        assert_eq!(got, want, "sample {k}");
    }
}

#[test]
fn broken_files_are_rejected_with_their_reason() {
    let good = encode(&signal(8_000, 1, 16, 9), 1, 16, 16_000);
    let dir = tempfile::tempdir().unwrap();
    let mut wav = b"RIFF\x24\x00\x00\x00WAVEfmt ".to_vec();
    wav.extend_from_slice(&[0; 64]);
    let mut flipped = good.clone();
    let mid = good.len() / 2;
    for b in &mut flipped[mid..mid + 16] {
        *b ^= 0x5a;
    }
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "truncated_flac"),
        ("bit-flipped frames", flipped, "corrupt_flac"),
        ("header only", good[..42].to_vec(), "truncated_flac"),
        // The codec is told by the bytes, not the name: a broken WAV named .flac is a broken WAV.
        ("wav renamed", wav, "corrupt_audio"),
        (
            "ogg renamed",
            b"OggS\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00rest".to_vec(),
            "unsupported_codec",
        ),
        ("empty file", Vec::new(), "unsupported_codec"),
        ("text file", b"this is not audio".to_vec(), "unsupported_codec"),
    ];
    for (name, bytes, reason) in cases {
        let path = dir.path().join(format!("{}.flac", name.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        match decode_file(&path) {
            Ok(d) => panic!("{name}: accepted ({} samples)", d.samples.len()),
            Err(r) => assert_eq!(r.reason().name(), reason, "{name}: {r:?}"),
        }
    }
    let missing = decode_file(&dir.path().join("nope.flac")).unwrap_err();
    assert!(matches!(missing, Reject::MissingFile(_)));
    let wav_reason = decode(b"RIFF\x24\x00\x00\x00WAVEfmt ".to_vec()).unwrap_err();
    assert!(
        matches!(&wav_reason, Reject::TruncatedAudio(d) if d.starts_with("WAV: the file ends at byte 16")),
        "{wav_reason:?}"
    );
}
