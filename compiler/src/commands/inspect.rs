//! `asrc inspect`: what a corpus holds, from its per-utterance arrays (no audio is read).

use std::fmt::Write as _;
use std::process::ExitCode;

use asr_corpus::Corpus;
use serde::Serialize;

use super::about_path;
use crate::cli::InspectArgs;
use crate::output::print;

/// Upper edges of the duration histogram's bins, in seconds (the last bin is open).
pub const DURATION_BINS: [f64; 10] = [1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0, 20.0, 30.0, 60.0];

/// One language's figures.
#[derive(Debug, Serialize)]
pub struct LanguageSummary {
    /// Language code.
    pub language: String,
    /// Utterances.
    pub utterances: u64,
    /// Hours of audio.
    pub hours: f64,
    /// Share of the corpus's hours.
    pub hours_share: f64,
    /// Tokens.
    pub tokens: u64,
    /// Mean utterance duration, seconds.
    pub mean_seconds: f64,
}

/// One histogram bin.
#[derive(Debug, Serialize)]
pub struct Bin {
    /// `[lo, hi)` seconds.
    pub range: String,
    /// Utterances.
    pub utterances: u64,
    /// Hours.
    pub hours: f64,
}

/// Token statistics.
#[derive(Debug, Serialize)]
pub struct TokenSummary {
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Bytes per token id.
    pub token_width: u32,
    /// Total tokens.
    pub total: u64,
    /// Mean tokens per utterance.
    pub mean_per_utterance: f64,
    /// Median tokens per utterance.
    pub p50: u64,
    /// 95th percentile.
    pub p95: u64,
    /// Most tokens in one utterance.
    pub max: u64,
    /// Utterances with no token.
    pub empty_utterances: u64,
    /// Tokens per second of audio.
    pub per_second: f64,
}

/// The whole summary.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Format version.
    pub format_version: u32,
    /// File size.
    pub file_bytes: u64,
    /// Utterances.
    pub utterances: u64,
    /// Hours.
    pub hours: f64,
    /// Per language, most hours first.
    pub languages: Vec<LanguageSummary>,
    /// Duration histogram.
    pub durations: Vec<Bin>,
    /// Tokens.
    pub tokens: TokenSummary,
    /// Tokenizer kind.
    pub tokenizer: String,
    /// Compile parameters recorded in the corpus.
    pub compile: serde_json::Value,
}

/// Computes the summary of an opened corpus.
pub fn summarize(c: &Corpus) -> Summary {
    let rate = f64::from(c.header().sample_rate);
    let meta = c.metadata();
    let ns = c.num_samples();
    let to = c.token_offsets();
    let total_secs: f64 = ns.iter().map(|&n| f64::from(n)).sum::<f64>() / rate;
    let mut per_lang: Vec<(u64, f64, u64)> = vec![(0, 0.0, 0); meta.languages.len()];
    let mut bins = vec![(0u64, 0.0f64); DURATION_BINS.len() + 1];
    let mut counts: Vec<u64> = Vec::with_capacity(c.len());
    for (i, &l) in c.languages().iter().enumerate() {
        let secs = f64::from(ns[i]) / rate;
        let toks = to[i + 1] - to[i];
        let e = &mut per_lang[l as usize];
        e.0 += 1;
        e.1 += secs;
        e.2 += toks;
        let b = DURATION_BINS.partition_point(|&edge| edge <= secs);
        bins[b].0 += 1;
        bins[b].1 += secs;
        counts.push(toks);
    }
    let mut languages: Vec<LanguageSummary> = meta
        .languages
        .iter()
        .zip(per_lang)
        .filter(|(_, e)| e.0 > 0)
        .map(|(code, (u, s, t))| LanguageSummary {
            language: code.clone(),
            utterances: u,
            hours: s / 3600.0,
            hours_share: if total_secs > 0.0 { s / total_secs } else { 0.0 },
            tokens: t,
            mean_seconds: s / u as f64,
        })
        .collect();
    languages.sort_by(|a, b| b.hours.total_cmp(&a.hours).then(a.language.cmp(&b.language)));
    let durations = bins
        .iter()
        .enumerate()
        .map(|(k, &(u, s))| {
            let lo = if k == 0 { 0.0 } else { DURATION_BINS[k - 1] };
            let hi = DURATION_BINS.get(k).map_or("inf".to_string(), |h| h.to_string());
            Bin { range: format!("[{lo}, {hi})"), utterances: u, hours: s / 3600.0 }
        })
        .collect();
    counts.sort_unstable();
    let pct = |p: f64| {
        counts.get(((counts.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
    };
    let total_tokens = c.header().n_tokens;
    Summary {
        format_version: c.header().format_version,
        file_bytes: c.as_bytes().len() as u64,
        utterances: c.len() as u64,
        hours: total_secs / 3600.0 + 0.0,
        languages,
        durations,
        tokens: TokenSummary {
            vocab_size: c.header().vocab_size,
            token_width: c.header().token_width,
            total: total_tokens,
            mean_per_utterance: if c.is_empty() {
                0.0
            } else {
                total_tokens as f64 / c.len() as f64
            },
            p50: pct(0.5),
            p95: pct(0.95),
            max: counts.last().copied().unwrap_or(0),
            empty_utterances: counts.iter().take_while(|&&n| n == 0).count() as u64,
            per_second: if total_secs > 0.0 { total_tokens as f64 / total_secs } else { 0.0 },
        },
        tokenizer: meta.tokenizer.kind.clone(),
        compile: meta.compile.clone(),
    }
}

/// Runs the command.
pub fn run(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let c = about_path(Corpus::open(&args.corpus), "opening corpus", &args.corpus)?;
    let s = summarize(&c);
    if args.json {
        print(&(serde_json::to_string_pretty(&s)? + "\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: format v{}, {} utterances, {:.3} hours, {} bytes, tokenizer {}",
        args.corpus.display(),
        s.format_version,
        s.utterances,
        s.hours,
        s.file_bytes,
        s.tokenizer
    );
    let _ = writeln!(
        out,
        "\n  {:<10} {:>11} {:>10} {:>7} {:>11} {:>9}",
        "language", "utterances", "hours", "share", "tokens", "mean s"
    );
    for l in &s.languages {
        let _ = writeln!(
            out,
            "  {:<10} {:>11} {:>10.3} {:>6.1}% {:>11} {:>9.2}",
            l.language,
            l.utterances,
            l.hours,
            100.0 * l.hours_share,
            l.tokens,
            l.mean_seconds
        );
    }
    let _ = writeln!(out, "\n  {:<14} {:>11} {:>10}", "duration (s)", "utterances", "hours");
    for b in &s.durations {
        let _ = writeln!(out, "  {:<14} {:>11} {:>10.3}", b.range, b.utterances, b.hours);
    }
    let t = &s.tokens;
    let _ = writeln!(
        out,
        "\n  tokens: {} (vocab {}, u{}), per utterance mean {:.1}, p50 {}, p95 {}, max {}; {} empty; {:.2} per second",
        t.total,
        t.vocab_size,
        8 * t.token_width,
        t.mean_per_utterance,
        t.p50,
        t.p95,
        t.max,
        t.empty_utterances,
        t.per_second
    );
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}
