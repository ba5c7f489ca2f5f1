//! `asrc compile`: run the compiler with a progress bar, write the report, print a summary.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::about_path;
use crate::cli::CompileArgs;
use crate::compile::report::Summary;
use crate::compile::{compile, report_paths, CompileOptions, Input, Progress};
use crate::inputs::Format;
use crate::output::print;

/// Exit status when more rows than `--max-reject-fraction` allows were dropped.
pub const EXIT_TOO_MANY_REJECTS: u8 = 1;

fn options(args: &CompileArgs) -> anyhow::Result<CompileOptions> {
    let input = match (args.inputs.as_slice(), &args.shards) {
        ([], Some(s)) => Input::Shards(s.clone()),
        ([], None) => anyhow::bail!("give an INPUT or --shards DIR"),
        (paths, None) => {
            let tarred = args.tarred_audio_filepaths.is_some();
            let format = match args.format {
                Some(f) => f,
                None => Format::detect(paths, tarred)?,
            };
            match (format, paths) {
                (Format::Seed, [m]) => Input::Manifest(m.clone()),
                (Format::Seed, _) => {
                    anyhow::bail!("a seed manifest is one parquet file, {} were given", paths.len())
                }
                (format, paths) => Input::Dataset { format, paths: paths.to_vec() },
            }
        }
        (_, Some(_)) => anyhow::bail!("give either an INPUT or --shards DIR, not both"),
    };
    let mut o = CompileOptions::new(input, args.output.clone(), args.tokenizer.clone());
    if let Some(report) = &args.report {
        o.entries_path = report.with_extension("jsonl");
    }
    o.audio_root = args.audio_root.clone();
    o.lang_prefix = args.lang_prefix;
    o.max_tokens = args.max_tokens;
    o.min_duration = args.min_duration;
    o.max_duration = args.max_duration;
    o.min_quality = args.min_quality;
    o.duration_tolerance = args.duration_tolerance;
    o.retag = !args.no_retag;
    o.decoder = args.decoder;
    o.verify_md5 = !args.no_md5_check;
    o.part = args.part;
    o.chunk_rows = args.chunk_rows.max(1);
    if let Some(j) = args.jobs {
        o.jobs = j;
    }
    if let Some(s) = &args.source {
        o.shard_source = s.clone();
        o.source = Some(s.clone());
    }
    o.tarred_audio_filepaths = args.tarred_audio_filepaths.clone();
    o.columns = crate::inputs::hf::HfColumns {
        id: args.id_column.clone(),
        text: args.text_column.clone(),
        lang: args.lang_column.clone(),
        duration: args.duration_column.clone(),
        audio: args.audio_column.clone(),
    };
    o.allow_pipes = args.allow_pipes;
    if let Some(f) = args.max_reject_fraction {
        anyhow::ensure!(
            (0.0..=1.0).contains(&f),
            "--max-reject-fraction must be in [0, 1], got {f}"
        );
    }
    Ok(o)
}

/// Shows progress: a bar on a terminal, a line every 10 seconds otherwise.
struct Reporter {
    bar: Option<ProgressBar>,
    quiet: bool,
    started: Instant,
    last_line: Instant,
}

impl Reporter {
    fn new(quiet: bool) -> Reporter {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} rows  {msg}  ETA {eta}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Reporter { bar, quiet, started: Instant::now(), last_line: Instant::now() }
    }

    fn update(&mut self, p: &Progress) {
        let msg = format!("{:.2} h kept", p.hours_kept);
        if let Some(bar) = &self.bar {
            bar.set_length(p.rows_total);
            bar.set_position(p.rows_done);
            bar.set_message(msg);
        } else if !self.quiet && self.last_line.elapsed() >= Duration::from_secs(10) {
            self.last_line = Instant::now();
            let elapsed = self.started.elapsed().as_secs_f64();
            let frac = p.rows_done as f64 / p.rows_total.max(1) as f64;
            let eta = if frac > 0.0 { elapsed * (1.0 - frac) / frac } else { f64::NAN };
            eprintln!(
                "asrc: {}/{} rows ({:.1} %), {msg}, {elapsed:.0} s elapsed, ETA {eta:.0} s",
                p.rows_done,
                p.rows_total,
                100.0 * frac
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn human(s: &Summary, summary_path: &std::path::Path) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "wrote {} ({:.1} MB)", s.output, s.corpus_bytes as f64 / 1e6);
    let _ = writeln!(
        o,
        "rows {}: kept {}, dropped {} ({:.2} %), retagged {}, token sequences truncated {}",
        s.rows,
        s.kept,
        s.dropped,
        100.0 * s.reject_fraction(),
        s.retagged,
        s.truncated
    );
    for (reason, n) in &s.dropped_by_reason {
        let _ = writeln!(o, "  dropped {reason:<20} {n}");
    }
    for (reason, n) in &s.flagged_by_reason {
        let _ = writeln!(o, "  flagged {reason:<20} {n}");
    }
    for (pair, n) in &s.retags {
        let _ = writeln!(o, "  retag   {pair:<20} {n}");
    }
    let _ = writeln!(o, "{:<8} {:>12} {:>12}", "language", "hours in", "hours kept");
    let mut langs: Vec<&String> = s.hours_before.keys().chain(s.hours_after.keys()).collect();
    langs.sort();
    langs.dedup();
    for l in langs {
        let get = |m: &std::collections::BTreeMap<String, f64>| m.get(l).copied().unwrap_or(0.0);
        let _ = writeln!(o, "{l:<8} {:>12.3} {:>12.3}", get(&s.hours_before), get(&s.hours_after));
    }
    let st = &s.stage_seconds;
    let _ = writeln!(
        o,
        "{:.2} h decoded in {:.1} s: {:.0}x real time ({:.0}x per thread, {} threads)",
        s.decoded_hours, s.wall_seconds, s.realtime_factor, s.realtime_factor_per_job, s.jobs
    );
    let _ = writeln!(
        o,
        "cpu seconds: read {:.2}, text+language {:.2}, decode {:.2}, resample {:.2}, \
         tokenize {:.2}, hash {:.2}, write {:.2}",
        st.read_input, st.text_and_language, st.decode, st.resample, st.tokenize, st.hash, st.write
    );
    let _ = writeln!(
        o,
        "report: {} (rows dropped, retagged, flagged: {})",
        summary_path.display(),
        s.entries_file
    );
    o
}

/// Runs the command.
pub fn run(args: &CompileArgs) -> anyhow::Result<ExitCode> {
    let opts = options(args)?;
    let summary_path = args.report.clone().unwrap_or_else(|| report_paths(&opts.output).0);
    let mut reporter = Reporter::new(args.quiet);
    let result = compile(&opts, &mut |p| reporter.update(p));
    reporter.finish();
    let summary = about_path(result, "compiling", &opts.output)?;
    let json = serde_json::to_vec_pretty(&summary)?;
    if let Some(dir) = summary_path.parent() {
        // The empty parent of a bare file name is the current directory: nothing to create.
        about_path(std::fs::create_dir_all(dir), "creating directory", dir)?;
    }
    about_path(std::fs::write(&summary_path, json), "writing", &summary_path)?;
    if !args.quiet {
        print(&human(&summary, &summary_path))?;
    }
    if let Some(max) = args.max_reject_fraction {
        if summary.reject_fraction() > max {
            eprintln!(
                "asrc: {} of {} rows dropped ({:.2} %), more than --max-reject-fraction {max}; \
                 see {}",
                summary.dropped,
                summary.rows,
                100.0 * summary.reject_fraction(),
                summary.entries_file
            );
            return Ok(ExitCode::from(EXIT_TOO_MANY_REJECTS));
        }
    }
    Ok(ExitCode::SUCCESS)
}
