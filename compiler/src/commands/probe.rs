//! `asrc probe`: what `asrc compile` would make of FLAC files, decoded and checked alone.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Serialize;

use crate::audio::decode::{decode_pcm, md5_of, read_file};
use crate::cli::ProbeArgs;
use crate::output::print;

/// One file's verdict.
#[derive(Debug, Serialize)]
struct Probe {
    file: String,
    kept: bool,
    /// The reject reason, when not kept.
    reason: Option<String>,
    detail: Option<String>,
    rate: Option<u32>,
    channels: Option<u32>,
    bits: Option<u32>,
    /// Samples per channel.
    samples: Option<u64>,
    seconds: Option<f64>,
    /// Whether the decode was checked against an MD5 the stream records.
    md5_checked: Option<bool>,
    /// MD5 of the decoded samples (with --md5).
    md5: Option<String>,
}

/// Runs `asrc probe`.
pub fn run(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    let mut all_kept = true;
    let mut out = String::new();
    for path in &args.files {
        let decoded = read_file(path).and_then(|bytes| decode_pcm(bytes, args.decoder));
        let file = path.display().to_string();
        let p = match decoded {
            Ok(pcm) => {
                let samples = (pcm.samples.len() / pcm.channels.max(1) as usize) as u64;
                Probe {
                    file,
                    kept: true,
                    reason: None,
                    detail: None,
                    rate: Some(pcm.rate),
                    channels: Some(pcm.channels),
                    bits: Some(pcm.bits),
                    samples: Some(samples),
                    seconds: Some(samples as f64 / f64::from(pcm.rate.max(1))),
                    md5_checked: Some(pcm.md5_checked),
                    md5: args
                        .md5
                        .then(|| md5_of(&pcm).iter().map(|b| format!("{b:02x}")).collect()),
                }
            }
            Err(r) => {
                all_kept = false;
                Probe {
                    file,
                    kept: false,
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
            let _ = write!(
                out,
                "{}: ok, {} Hz, {} ch, {} bit, {} samples ({:.3} s), {}",
                p.file,
                p.rate.unwrap_or(0),
                p.channels.unwrap_or(0),
                p.bits.unwrap_or(0),
                p.samples.unwrap_or(0),
                p.seconds.unwrap_or(0.0),
                if p.md5_checked == Some(true) { "MD5 checked" } else { "no MD5 recorded" }
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
