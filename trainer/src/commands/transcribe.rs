//! `asrt transcribe`: run the model on audio files, directories, NeMo manifests or corpora and
//! write NeMo-style JSON lines (the input's fields, `pred_text`, token ids, token, word and
//! segment times), plain text or SRT; WER and CER when the input has references.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};

use crate::checkpoint;
use crate::cli::{TranscribeArgs, TranscriptFormat};
use crate::device::{dispatch, TranscribeOn};
use crate::eval::ErrorRates;
use crate::model_source::ModelSource;
use crate::transcribe::{items, Span, Timestamps, TranscribeOptions, Transcript};

/// The JSON line of a transcript: the input's fields, then ours.
pub fn json_line(t: &Transcript) -> Value {
    let mut o: Map<String, Value> = t.fields.clone();
    o.entry("audio_filepath").or_insert_with(|| Value::String(t.name.clone()));
    match &t.result {
        Ok(h) => {
            o.entry("duration").or_insert_with(|| json!(h.duration));
            o.insert("pred_text".into(), json!(h.text));
            o.insert("tokens".into(), json!(h.tokens));
            o.insert("timestamps".into(), timestamps_json(&h.timestamps));
        }
        Err((reason, detail)) => {
            o.insert("error".into(), json!(reason));
            o.insert("error_detail".into(), json!(detail));
        }
    }
    Value::Object(o)
}

/// Timestamps as NeMo's `timestamp` dict names them: `char` (tokens), `word`, `segment`, each
/// with encoder-frame offsets and seconds.
fn timestamps_json(t: &Timestamps) -> Value {
    let spans = |key: &str, list: &[Span]| -> Vec<Value> {
        list.iter()
            .map(|s| {
                json!({key: s.text, "start_offset": s.start_offset, "end_offset": s.end_offset,
                       "start": s.start, "end": s.end})
            })
            .collect()
    };
    let chars: Vec<Value> = t
        .token
        .iter()
        .map(|c| {
            json!({"id": c.id, "piece": c.piece, "start_offset": c.start_offset,
                   "end_offset": c.end_offset, "start": c.start, "end": c.end})
        })
        .collect();
    json!({"char": chars, "word": spans("word", &t.word), "segment": spans("segment", &t.segment)})
}

/// `HH:MM:SS,mmm`.
fn srt_time(seconds: f64) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!("{:02}:{:02}:{:02},{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

/// A transcript's segments as an SRT document.
pub fn srt(segments: &[Span]) -> String {
    let mut s = String::new();
    for (i, seg) in segments.iter().enumerate() {
        s.push_str(&format!(
            "{}\n{} --> {}\n{}\n\n",
            i + 1,
            srt_time(seg.start),
            srt_time(seg.end),
            seg.text
        ));
    }
    s
}

/// The tokenizer a checkpoint trained with, from its first corpus (a checkpoint carries none).
fn checkpoint_tokenizer(source: &ModelSource) -> anyhow::Result<Option<Vec<u8>>> {
    let ModelSource::Checkpoint(p) = source else { return Ok(None) };
    let state = checkpoint::load_state(p)?;
    let Some(corpus) = state.corpora.first() else {
        bail!(
            "{}: the checkpoint names no corpus; give the tokenizer with --tokenizer",
            p.display()
        );
    };
    Ok(Some(super::nemo::tokenizer_from(&corpus.path).with_context(|| {
        format!("the tokenizer (from {}); or give it with --tokenizer", corpus.path.display())
    })?))
}

/// Runs `asrt transcribe`.
pub fn run(args: &TranscribeArgs) -> anyhow::Result<ExitCode> {
    for (name, v) in [("--batch-seconds", args.batch_seconds), ("--max-seconds", args.max_seconds)]
    {
        if !(v.is_finite() && v > 0.0) {
            bail!("{name} {v}: expected a positive number of seconds");
        }
    }
    let source = ModelSource::resolve(&args.checkpoint)?;
    let tokenizer = match &args.tokenizer {
        Some(p) => Some(super::nemo::tokenizer_from(p)?),
        None => checkpoint_tokenizer(&source)?,
    };
    let (items, corpora) = items(&args.inputs)?;
    if items.is_empty() {
        bail!("nothing to transcribe in {:?}", args.inputs);
    }
    let several = items.len() > 1;
    if args.format == TranscriptFormat::Srt && several && args.output.is_none() {
        bail!("--format srt with several inputs writes one .srt file each: give --output DIR");
    }
    let devices = args.device.one()?;
    args.device.prepare(&devices, false)?;
    let mut out: Box<dyn Write> = match (&args.output, args.format) {
        (Some(dir), TranscriptFormat::Srt) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            Box::new(std::io::sink())
        }
        (Some(file), _) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(file).with_context(|| format!("creating {}", file.display()))?,
        )),
        (None, _) => Box::new(std::io::stdout().lock()),
    };
    let mut rates = ErrorRates::default();
    let (mut failed, mut done) = (0usize, 0usize);
    let mut io_error: Option<anyhow::Error> = None;
    let mut emit = |t: Transcript| {
        done += 1;
        let written = match (&t.result, args.format) {
            (Err((reason, detail)), _) => {
                failed += 1;
                eprintln!("asrt: {}: {reason}: {detail}", t.name);
                match args.format {
                    TranscriptFormat::Jsonl => {
                        writeln!(out, "{}", json_line(&t)).map_err(Into::into)
                    }
                    _ => Ok(()),
                }
            }
            (Ok(_), TranscriptFormat::Jsonl) => {
                writeln!(out, "{}", json_line(&t)).map_err(anyhow::Error::from)
            }
            (Ok(h), TranscriptFormat::Text) if several => {
                writeln!(out, "{}\t{}", t.name, h.text).map_err(Into::into)
            }
            (Ok(h), TranscriptFormat::Text) => writeln!(out, "{}", h.text).map_err(Into::into),
            (Ok(h), TranscriptFormat::Srt) => match &args.output {
                Some(dir) => {
                    let stem = Path::new(&t.name)
                        .file_stem()
                        .map_or_else(|| format!("{done}"), |s| s.to_string_lossy().into_owned());
                    let path: PathBuf = dir.join(format!("{stem}.srt"));
                    std::fs::write(&path, srt(&h.timestamps.segment))
                        .with_context(|| format!("writing {}", path.display()))
                }
                None => write!(out, "{}", srt(&h.timestamps.segment)).map_err(Into::into),
            },
        };
        if let (Ok(h), Some(r)) = (&t.result, &t.reference) {
            rates.add(r, &h.text);
        }
        if let Err(e) = written {
            io_error.get_or_insert(e);
        }
    };
    let opts = TranscribeOptions {
        batch_seconds: args.batch_seconds,
        max_seconds: args.max_seconds,
        group: 256,
    };
    dispatch(
        &devices,
        TranscribeOn {
            source: &source,
            tokenizer: tokenizer.as_deref(),
            items: &items,
            corpora: &corpora,
            opts,
            emit: &mut emit,
        },
    )?;
    out.flush()?;
    if let Some(e) = io_error {
        return Err(e.context("writing the transcripts"));
    }
    if rates.utterances > 0 {
        eprintln!(
            "asrt: {} utterances with references: WER {:.2} %, CER {:.2} %",
            rates.utterances,
            100.0 * rates.wer,
            100.0 * rates.cer
        );
    }
    if failed > 0 {
        eprintln!("asrt: {failed} of {done} inputs could not be transcribed (listed above)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
