//! `asrc validate`: open a corpus (structural rules), then verify every byte.

use std::fmt::Write as _;
use std::process::ExitCode;

use asr_corpus::{Corpus, FormatError, VerifyReport};

use crate::cli::ValidateArgs;
use crate::output::print;

/// Exit status for a corpus that is not valid.
pub const EXIT_INVALID: u8 = 1;
/// Exit status for a corpus that cannot be read, or a usage error.
pub const EXIT_ERROR: u8 = 2;

/// The JSON document `--json` prints.
#[derive(Debug, serde::Serialize)]
struct JsonOutcome<'a> {
    path: String,
    valid: bool,
    /// `"valid"`, `"invalid"` (exit 1) or `"unreadable"` (exit 2).
    status: &'static str,
    error: Option<String>,
    structure_only: bool,
    report: Option<&'a VerifyReport>,
}

/// Runs the command; the exit code says valid (0), invalid (1) or unreadable (2).
pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let outcome = Corpus::open(&args.corpus).and_then(|c| {
        if args.structure_only {
            Ok((c, None))
        } else {
            let report = c.verify()?;
            Ok((c, Some(report)))
        }
    });
    let path = args.corpus.display().to_string();
    let (code, status, error) = match &outcome {
        Ok(_) => (0, "valid", None),
        Err(e) if e.is_invalid_data() => (EXIT_INVALID, "invalid", Some(e)),
        Err(e) => (EXIT_ERROR, "unreadable", Some(e)),
    };
    let report = outcome.as_ref().ok().and_then(|(_, r)| r.as_ref());
    if args.json {
        let doc = JsonOutcome {
            path,
            valid: code == 0,
            status,
            error: error.map(ToString::to_string),
            structure_only: args.structure_only,
            report,
        };
        print(&(serde_json::to_string_pretty(&doc)? + "\n"))?;
    } else {
        match (&outcome, error) {
            (Ok((corpus, _)), _) => print(&human_summary(&path, corpus, report))?,
            // The path once: an unreadable file's error names it already.
            (Err(_), Some(e)) if e.to_string().contains(&path) => {
                eprintln!("asrc validate: {}", describe(e));
            }
            (Err(_), Some(e)) => eprintln!("asrc validate: {path}: {}", describe(e)),
            (Err(_), None) => {}
        }
    }
    Ok(ExitCode::from(code))
}

fn describe(e: &FormatError) -> String {
    if e.is_invalid_data() {
        format!("invalid corpus: {e}")
    } else {
        e.to_string()
    }
}

fn human_summary(path: &str, c: &Corpus, report: Option<&VerifyReport>) -> String {
    let h = c.header();
    let m = c.metadata();
    let mut s = String::new();
    let checked =
        if report.is_some() { "valid (all checks)" } else { "structure valid (--structure-only)" };
    let _ = writeln!(s, "{path}: {checked}");
    let _ = writeln!(
        s,
        "  format v{}, {} utterances, {:.3} hours, {} tokens (vocab {}, u{}), {} bytes",
        h.format_version,
        h.n_utterances,
        m.stats.hours,
        h.n_tokens,
        h.vocab_size,
        h.token_width * 8,
        c.as_bytes().len()
    );
    let _ = writeln!(
        s,
        "  tokenizer: {} ({} bytes, xxh3 {})",
        m.tokenizer.kind, m.tokenizer.model_bytes, m.tokenizer.model_xxh3
    );
    let _ =
        writeln!(s, "  {:<10} {:>12} {:>10} {:>12}", "language", "utterances", "hours", "tokens");
    for (code, l) in &m.stats.per_language {
        let _ = writeln!(s, "  {code:<10} {:>12} {:>10.3} {:>12}", l.utterances, l.hours, l.tokens);
    }
    s
}
