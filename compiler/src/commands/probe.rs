//! `asrc probe`: what `asrc compile` would make of audio files (FLAC, WAV, MP3, Ogg Vorbis,
//! Ogg Opus, AAC), decoded and checked alone.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::audio::decode::{decode_stream, read_file, DecodeOptions};
use crate::cli::ProbeArgs;
use crate::output::print;

/// One file's verdict.
#[derive(Debug, Serialize)]
struct Probe {
    file: String,
    kept: bool,
    /// The codec, when decoded.
    codec: Option<&'static str>,
    /// The reject reason, when not kept.
    reason: Option<String>,
    detail: Option<String>,
    rate: Option<u32>,
    channels: Option<u32>,
    /// Bits per sample of an integer stream (none for float and lossy streams).
    bits: Option<u32>,
    /// Samples per channel.
    samples: Option<u64>,
    seconds: Option<f64>,
    /// Whether the decode was checked against an MD5 the stream records.
    md5_checked: Option<bool>,
    /// MD5 of the decoded samples (with --md5): FLAC's definition for integer streams, the
    /// little-endian IEEE bytes of float ones.
    md5: Option<String>,
}

/// Runs `asrc probe`.
pub fn run(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    let mut all_kept = true;
    let mut out = String::new();
    for path in &args.files {
        let opts = DecodeOptions { flac: args.decoder, ..DecodeOptions::default() };
        let decoded = read_file(path).and_then(|bytes| decode_stream(bytes, &opts));
        let file = path.display().to_string();
        let p = match decoded {
            Ok(stream) => {
                let samples = stream.frames();
                Probe {
                    file,
                    kept: true,
                    codec: Some(stream.codec.name()),
                    reason: None,
                    detail: None,
                    rate: Some(stream.rate),
                    channels: Some(stream.channels),
                    bits: stream.bits,
                    samples: Some(samples),
                    seconds: Some(samples as f64 / f64::from(stream.rate.max(1))),
                    md5_checked: Some(stream.md5_checked),
                    md5: args
                        .md5
                        .then(|| stream.md5().iter().map(|b| format!("{b:02x}")).collect()),
                }
            }
            Err(r) => {
                all_kept = false;
                Probe {
                    file,
                    kept: false,
                    codec: None,
                    reason: Some(r.reason().name().to_owned()),
                    detail: Some(r.detail().to_owned()),
                    rate: None,
                    channels: None,
                    bits: None,
                    samples: None,
                    seconds: None,
                    md5_checked: None,
                    md5: None,
                }
            }
        };
        if args.json {
            out.push_str(&serde_json::to_string(&p)?);
            out.push('\n');
        } else if p.kept {
            let depth = p.bits.map_or("float".to_owned(), |b| format!("{b} bit"));
            let check = match (p.codec, p.md5_checked) {
                (_, Some(true)) => "MD5 checked",
                (Some("flac"), _) => "no MD5 recorded",
                _ => "no checksum in the format",
            };
            let _ = write!(
                out,
                "{}: ok, {}, {} Hz, {} ch, {depth}, {} samples ({:.3} s), {check}",
                p.file,
                p.codec.unwrap_or(""),
                p.rate.unwrap_or(0),
                p.channels.unwrap_or(0),
                p.samples.unwrap_or(0),
                p.seconds.unwrap_or(0.0),
            );
            if let Some(m) = &p.md5 {
                let _ = write!(out, ", md5 {m}");
            }
            out.push('\n');
        } else {
            let _ = writeln!(
                out,
                "{}: rejected, {}: {}",
                p.file,
                p.reason.as_deref().unwrap_or(""),
                p.detail.as_deref().unwrap_or("")
            );
        }
    }
    print(&out)?;
    Ok(if all_kept { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
