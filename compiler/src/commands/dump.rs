//! `asrc dump`: one JSON object per utterance, and optionally its audio as a WAV file.

use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use asr_corpus::{Corpus, TextBlock};

use super::about_path;
use crate::cli::DumpArgs;

/// Runs the command.
pub fn run(args: &DumpArgs) -> anyhow::Result<ExitCode> {
    let c = about_path(Corpus::open(&args.corpus), "opening corpus", &args.corpus)?;
    if let Some(dir) = &args.pcm_dir {
        about_path(std::fs::create_dir_all(dir), "creating directory", dir)?;
    }
    let end = args.limit.map_or(c.len(), |n| args.start.saturating_add(n).min(c.len()));
    let k = c.header().text_block_size as usize;
    let rate = c.header().sample_rate;
    let mut out = BufWriter::new(io::stdout().lock());
    let mut block: Option<TextBlock> = None;
    for i in args.start.min(end)..end {
        if block.as_ref().is_none_or(|b| b.first_utterance() != (i / k * k) as u64) {
            block = Some(
                c.text_block(i / k)
                    .with_context(|| format!("reading the text of utterance {i}"))?,
            );
        }
        let rec = block.as_ref().and_then(|b| b.get(i % k));
        let (segment_id, text) = rec.map_or(("", ""), |r| (r.segment_id, r.text));
        let pcm_path = match &args.pcm_dir {
            Some(dir) => {
                let p = dir.join(format!("{i:08}.wav"));
                about_path(write_wav(&p, c.pcm(i), rate), "writing", &p)?;
                Some(p.display().to_string())
            }
            None => None,
        };
        let line = serde_json::json!({
            "index": i,
            "segment_id": segment_id,
            "lang": c.language_code(i),
            "source": c.source_name(i),
            "text": text,
            "tokens": c.tokens(i).to_vec(),
            "samples": c.num_samples()[i],
            "seconds": c.duration_seconds(i),
            "pcm": pcm_path,
        });
        match writeln!(out, "{line}") {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            r => r?,
        }
    }
    match out.flush() {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        r => r.map(|()| ExitCode::SUCCESS).map_err(Into::into),
    }
}

/// Writes 16-bit mono PCM as a canonical 44-byte-header WAV file.
fn write_wav(path: &Path, pcm: &[i16], rate: u32) -> io::Result<()> {
    let data_len = (pcm.len() * 2) as u32;
    let mut b = Vec::with_capacity(44 + pcm.len() * 2);
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&(36 + data_len).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes()); // fmt chunk size
    b.extend_from_slice(&1u16.to_le_bytes()); // PCM
    b.extend_from_slice(&1u16.to_le_bytes()); // mono
    b.extend_from_slice(&rate.to_le_bytes());
    b.extend_from_slice(&(rate * 2).to_le_bytes()); // byte rate
    b.extend_from_slice(&2u16.to_le_bytes()); // block align
    b.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data_len.to_le_bytes());
    for s in pcm {
        b.extend_from_slice(&s.to_le_bytes());
    }
    std::fs::write(path, b)
}
