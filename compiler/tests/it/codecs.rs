//! Every codec against a reference decoder, on files made by reference encoders
//! (`tests/data/codecs/`, made by its `make_fixtures.py`: sox, flac, lame, oggenc, opusenc,
//! ffmpeg's AAC encoder; the references decoded by sox, `flac -d`, ffmpeg and opusdec). Lossless codecs must match bit
//! for bit; lossy ones within 60 dB SNR of the reference decoder's output, with the same sample
//! count. The deliberately broken files must be rejected with their reason.

use std::path::PathBuf;

use asr_compiler::{decode_stream, DecodeOptions, Reject, StreamSamples};

fn dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/codecs")
}

fn index() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir().join("index.json")).unwrap()).unwrap()
}

fn decode(file: &str) -> Result<asr_compiler::Stream, Reject> {
    decode_stream(std::fs::read(dir().join(file)).unwrap(), &DecodeOptions::default())
}

fn raw<T, const N: usize>(file: &str, f: fn([u8; N]) -> T) -> Vec<T> {
    let bytes = std::fs::read(dir().join(file)).unwrap();
    bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap())).collect()
}

/// SNR in dB of `got` against `want`.
fn snr_db(got: &[f32], want: &[f32]) -> f64 {
    let signal: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum();
    let noise: f64 =
        got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - f64::from(w)).powi(2)).sum();
    if noise == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

#[test]
fn every_codec_matches_its_reference_decoder() {
    let index = index();
    let files = index["files"].as_array().unwrap();
    let mut lossy = Vec::new();
    for f in files {
        let name = f["file"].as_str().unwrap();
        let reference = f["reference_file"].as_str().unwrap();
        let s = decode(name).unwrap_or_else(|r| panic!("{name}: rejected: {r:?}"));
        assert_eq!(s.codec.name(), f["codec"].as_str().unwrap(), "{name}");
        assert_eq!(u64::from(s.rate), f["rate"].as_u64().unwrap(), "{name}: rate");
        assert_eq!(u64::from(s.channels), f["channels"].as_u64().unwrap(), "{name}: channels");
        // An Ogg stream's length is its last granule position (RFC 3533, and RFC 7845 for
        // Opus); where the reference decoder gives more (ffmpeg 5.1 does not trim a Vorbis
        // stream whose audio is all in its last page), its first samples are compared.
        // Likewise an MP4's is its edit list's (ISO/IEC 14496-12 8.6.6), where ffmpeg 5.1 keeps
        // the last AAC frame's padding.
        let frames = f["last_granule_position"]
            .as_u64()
            .or(f["edit_list_frames"].as_u64())
            .unwrap_or(f["frames"].as_u64().unwrap());
        assert_eq!(s.frames(), frames, "{name}: samples per channel");
        let kept = frames as usize * s.channels as usize;
        match (&s.samples, f["sample_format"].as_str().unwrap()) {
            (StreamSamples::Int(got), "s32") => {
                assert_eq!(s.bits, f["bits"].as_u64().map(|b| b as u32), "{name}: bits");
                let want = raw(reference, i32::from_le_bytes);
                assert!(got == &want, "{name}: samples differ from {reference}");
            }
            (StreamSamples::F32(got), "f32") if f["lossless"] == true => {
                let want = raw(reference, f32::from_le_bytes);
                assert!(got == &want, "{name}: samples differ from {reference}");
            }
            (StreamSamples::F64(got), "f64") => {
                let want = raw(reference, f64::from_le_bytes);
                assert!(got == &want, "{name}: samples differ from {reference}");
            }
            (StreamSamples::F32(got), "f32") => {
                let want = raw(reference, f32::from_le_bytes);
                assert!(want.len() >= kept, "{name}: the reference is shorter");
                let snr = snr_db(got, &want[..kept]);
                lossy.push(format!("{name}: {snr:.1} dB"));
                assert!(snr >= 60.0, "{name}: {snr:.1} dB SNR against {reference}");
            }
            (got, format) => panic!("{name}: decoded as {got:?}, reference is {format}"),
        }
    }
    println!("lossy codecs, SNR against the reference decoder: {}", lossy.join(", "));
    assert!(lossy.len() >= 9, "the index lists the MP3, Vorbis, Opus and AAC files");
}

#[test]
fn broken_files_are_rejected_with_their_reason() {
    let cases = [
        ("bad_truncated.wav", "truncated_audio"),
        ("bad_zero_channels.wav", "corrupt_audio"),
        ("bad_unknown_format.wav", "unsupported_codec"),
        ("bad_garbage.mp3", "corrupt_audio"),
        ("bad_truncated.opus", "truncated_audio"),
        ("bad_not_audio.txt", "unsupported_codec"),
        ("bad_truncated.m4a", "truncated_audio"),
        ("bad_he_aac.m4a", "unsupported_codec"),
        ("bad_edit_list.m4a", "unsupported_audio"),
        ("bad_alac.m4a", "unsupported_codec"),
    ];
    for (file, reason) in cases {
        match decode(file) {
            Ok(s) => panic!("{file}: accepted ({} samples)", s.samples.len()),
            Err(r) => assert_eq!(r.reason().name(), reason, "{file}: {r:?}"),
        }
    }
}

/// Damaged copies of every fixture (bytes overwritten, or the file cut short) are decoded or
/// rejected, never a panic: 300 seeded damages a file.
#[test]
fn damaged_files_never_panic_the_decoders() {
    let index = index();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        // xorshift64*: a fixed sequence, so a failure names a reproducible case.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut panics = Vec::new();
    let (mut kept, mut rejected) = (0, 0);
    for f in index["files"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap();
        let good = std::fs::read(dir().join(name)).unwrap();
        for case in 0..300 {
            let mut bytes = good.clone();
            if case % 4 == 3 {
                bytes.truncate((next() % good.len() as u64) as usize);
            } else {
                for _ in 0..1 + next() % 8 {
                    let at = (next() % bytes.len() as u64) as usize;
                    bytes[at] = next() as u8;
                }
            }
            let result =
                std::panic::catch_unwind(|| decode_stream(bytes, &DecodeOptions::default()));
            match result {
                Ok(Ok(_)) => kept += 1,
                Ok(Err(_)) => rejected += 1,
                Err(_) => panics.push(format!("{name} case {case}")),
            }
        }
    }
    println!("damaged files: {kept} decoded, {rejected} rejected, {} panics", panics.len());
    assert!(panics.is_empty(), "{} panics: {:?}", panics.len(), &panics[..panics.len().min(20)]);
}
