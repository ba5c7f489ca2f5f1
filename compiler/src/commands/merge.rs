//! `asrc merge`: the parts of a compile joined into one corpus.

use std::process::ExitCode;
use std::time::Instant;

use crate::cli::MergeArgs;
use crate::merge::merge;

/// Runs `asrc merge`.
pub fn run(args: &MergeArgs) -> anyhow::Result<ExitCode> {
    let t = Instant::now();
    let s = merge(&args.parts, &args.output)?;
    for (id, detail) in &s.duplicate_audio {
        eprintln!("asrc: dropped {id}: duplicate_audio: {detail}");
    }
    let seconds = t.elapsed().as_secs_f64();
    println!(
        "wrote {} ({:.1} MB) from {} parts in {:.2} s ({:.2} GB/s)",
        args.output.display(),
        s.bytes as f64 / 1e6,
        s.parts,
        seconds,
        s.bytes as f64 / 1e9 / seconds.max(1e-9)
    );
    println!(
        "utterances {}: kept {}, dropped {} (duplicate_audio across parts)",
        s.utterances,
        s.kept,
        s.duplicate_audio.len()
    );
    Ok(ExitCode::SUCCESS)
}
