//! Lhotse manifests (`.jsonl` or `.jsonl.gz`): a cut set of `MonoCut`s, each a segment
//! (`start`, `duration`) of its recording with its supervisions; or a recording set with a
//! supervision set, each supervision then a segment of its recording. Which a file is, is told
//! by its first line.
//!
//! A row's text is its supervisions' texts joined by spaces, its language the first
//! supervision's. A recording's first source is read: `file` (relative paths resolve against
//! the manifest's directory or `--audio-root`; lhotse itself resolves them against its working
//! directory), `command` (with `--allow-pipes`, as Kaldi pipes). Not read, each a named reject:
//! `url` sources (no network), several sources (one file per channel), a cut that selects one
//! channel of several (asrc downmixes every channel), cut types other than `MonoCut`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{malformed, resolve, AudioRef, InputError};
use crate::audio::segment::Segment;
use crate::manifest::ManifestRow;
use crate::reason::Reason;

/// How Lhotse manifests are read.
#[derive(Debug, Clone, Default)]
pub struct LhotseOptions {
    /// Base directory of relative paths instead of each manifest's directory.
    pub audio_root: Option<PathBuf>,
    /// Source name of every row (default: the first manifest's name up to its first dot).
    pub source: Option<String>,
    /// Whether `command` sources are run.
    pub allow_pipes: bool,
}

/// The lines of a manifest, gzip or not, with their numbers; blank lines left out.
pub(super) fn lines(path: &Path) -> Result<Vec<(usize, String)>, InputError> {
    let file = std::fs::File::open(path).map_err(InputError::io(path))?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut out = Vec::new();
    for (n, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.map_err(InputError::io(path))?;
        if !line.trim().is_empty() {
            out.push((n + 1, line));
        }
    }
    Ok(out)
}

/// What a manifest holds, told by its first line.
#[derive(Debug, PartialEq)]
enum Kind {
    Cuts,
    Recordings,
    Supervisions,
}

fn kind_of(path: &Path, first: Option<&(usize, String)>) -> Result<Kind, InputError> {
    let v: Value = first.and_then(|(_, l)| serde_json::from_str(l).ok()).ok_or_else(|| {
        InputError::Invalid {
            path: path.to_path_buf(),
            message: "the first line is not a JSON object: not a Lhotse manifest".into(),
        }
    })?;
    if v.get("supervisions").is_some()
        || v.get("type").and_then(Value::as_str).is_some_and(|t| t.ends_with("Cut"))
    {
        Ok(Kind::Cuts)
    } else if v.get("sources").is_some() {
        Ok(Kind::Recordings)
    } else if v.get("recording_id").is_some() {
        Ok(Kind::Supervisions)
    } else {
        Err(InputError::Invalid {
            path: path.to_path_buf(),
            message: "the first line is neither a cut (`supervisions`), a recording (`sources`) \
                      nor a supervision (`recording_id`)"
                .into(),
        })
    }
}

pub(super) fn num(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(format!("`{key}` is {v}, not a number")),
    }
}

pub(super) fn string(o: &Map<String, Value>, key: &str) -> Option<String> {
    o.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A recording's audio, or why it cannot be read.
fn recording_audio(
    rec: &Map<String, Value>,
    channel: Option<&Value>,
    base: &Path,
    allow_pipes: bool,
) -> Result<AudioRef, (Reason, String)> {
    let id = string(rec, "id").unwrap_or_default();
    let sources = rec
        .get("sources")
        .and_then(Value::as_array)
        .ok_or((Reason::MalformedLine, format!("recording {id:?} has no `sources` list")))?;
    let [source] = sources.as_slice() else {
        return Err((
            Reason::UnsupportedAudio,
            format!(
                "recording {id:?} has {} sources (one file per channel); asrc reads one",
                sources.len()
            ),
        ));
    };
    let channels = rec.get("channel_ids").and_then(Value::as_array).map_or(1, Vec::len);
    if channels > 1 && channel.is_some_and(Value::is_number) {
        return Err((
            Reason::UnsupportedAudio,
            format!(
                "the cut selects channel {} of recording {id:?}'s {channels}; asrc downmixes every \
                 channel",
                channel.map(Value::to_string).unwrap_or_default()
            ),
        ));
    }
    let kind = source.get("type").and_then(Value::as_str).unwrap_or("");
    let src = source.get("source").and_then(Value::as_str).unwrap_or("");
    match kind {
        "file" => Ok(AudioRef::File(resolve(base, src))),
        "command" if allow_pipes => {
            Ok(AudioRef::Pipe { command: src.to_owned(), dir: base.to_path_buf() })
        }
        "command" => Err((
            Reason::PipeRefused,
            format!("recording {id:?} is a command ({src:?}); pass --allow-pipes to run it"),
        )),
        "url" => Err((
            Reason::MissingFile,
            format!("recording {id:?} is a URL ({src}); asrc fetches nothing"),
        )),
        other => Err((
            Reason::UnsupportedAudio,
            format!(
                "recording {id:?} has a source of type {other:?}; asrc reads `file` and `command`"
            ),
        )),
    }
}

/// Text and language of a list of supervisions.
pub(super) fn supervised(sups: &[Value]) -> (Option<String>, Option<String>) {
    let texts: Vec<&str> =
        sups.iter().filter_map(|s| s.get("text").and_then(Value::as_str)).collect();
    let text = (!texts.is_empty()).then(|| texts.join(" "));
    let lang =
        sups.iter().find_map(|s| s.get("language").and_then(Value::as_str)).map(str::to_owned);
    (text, lang)
}

/// A cut manifest's line as a `MonoCut` object (a line without `type` is one), or why not.
pub(super) fn mono_cut(line: &str) -> Result<Map<String, Value>, (Reason, String)> {
    let bad = |d: String| (Reason::MalformedLine, d);
    let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(cut) = v else { return Err(bad("not a JSON object".into())) };
    let kind = string(&cut, "type").unwrap_or_else(|| "MonoCut".into());
    if kind != "MonoCut" {
        return Err((Reason::UnsupportedAudio, format!("a {kind}; asrc reads MonoCut")));
    }
    Ok(cut)
}

/// One cut as a row.
fn cut_row(
    line: &str,
    row: u64,
    base: &Path,
    source: &str,
    allow_pipes: bool,
) -> Result<ManifestRow, (Reason, String)> {
    let bad = |d: String| (Reason::MalformedLine, d);
    let cut = &mono_cut(line)?;
    let rec = cut
        .get("recording")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("the cut has no `recording`".into()))?;
    let audio = recording_audio(rec, cut.get("channel"), base, allow_pipes)?;
    let sups = cut.get("supervisions").and_then(Value::as_array).cloned().unwrap_or_default();
    span_row(row, cut, audio, &sups, source)
}

/// The row of a cut or supervision `o` (its `id`, `start`, `duration`) of `audio`, with the
/// text and language of `sups`.
fn span_row(
    row: u64,
    o: &Map<String, Value>,
    audio: AudioRef,
    sups: &[Value],
    source: &str,
) -> Result<ManifestRow, (Reason, String)> {
    let bad = |d: String| (Reason::MalformedLine, d);
    let start = num(o, "start").map_err(bad)?.unwrap_or(0.0);
    let duration = num(o, "duration").map_err(bad)?;
    let (text, lang) = supervised(sups);
    Ok(ManifestRow {
        row,
        segment_id: string(o, "id"),
        text,
        lang,
        source: Some(source.to_owned()),
        duration,
        audio: Some(audio),
        segment: Some(Segment { offset: start, duration }),
        ..Default::default()
    })
}

/// Reads the manifests: cut sets in order, or supervision sets joined with the recordings of
/// every recording set given.
pub fn read(paths: &[PathBuf], opts: &LhotseOptions) -> Result<Vec<ManifestRow>, InputError> {
    let source = opts.source.clone().unwrap_or_else(|| {
        paths
            .first()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().split('.').next().unwrap_or("").to_owned())
            .unwrap_or_default()
    });
    let mut files = Vec::new();
    for p in paths {
        let l = lines(p)?;
        let kind = kind_of(p, l.first())?;
        let base = opts
            .audio_root
            .clone()
            .unwrap_or_else(|| p.parent().map(Path::to_path_buf).unwrap_or_default());
        files.push((p, kind, l, base));
    }
    // Recordings by id, with their directory, for the supervision sets.
    let mut recordings: HashMap<String, (Map<String, Value>, PathBuf)> = HashMap::new();
    for (_, kind, l, base) in &files {
        if *kind == Kind::Recordings {
            for (_, line) in l {
                if let Ok(Value::Object(r)) = serde_json::from_str::<Value>(line) {
                    if let Some(id) = string(&r, "id") {
                        recordings.insert(id, (r, base.clone()));
                    }
                }
            }
        }
    }
    let has_sups = files.iter().any(|f| f.1 == Kind::Supervisions);
    if has_sups && recordings.is_empty() {
        return Err(InputError::Invalid {
            path: paths[0].clone(),
            message: "a supervision set needs its recording set too (give both manifests)".into(),
        });
    }
    if !has_sups && !files.iter().any(|f| f.1 == Kind::Cuts) {
        return Err(InputError::Invalid {
            path: paths[0].clone(),
            message:
                "recordings alone have no transcripts: give the supervision set too, or a cut set"
                    .into(),
        });
    }
    let mut rows = Vec::new();
    for (p, kind, l, base) in &files {
        for (n, line) in l {
            let row = rows.len() as u64;
            let origin = format!("{}:{n}", p.display());
            let parsed = match kind {
                Kind::Recordings => continue,
                Kind::Cuts => cut_row(line, row, base, &source, opts.allow_pipes),
                Kind::Supervisions => {
                    supervision_row(line, row, &recordings, &source, opts.allow_pipes)
                }
            };
            let r = parsed
                .unwrap_or_else(|(reason, detail)| malformed(row, origin.clone(), reason, detail));
            rows.push(ManifestRow { origin: Some(origin), ..r });
        }
    }
    Ok(rows)
}

/// One supervision, with its recording, as a row.
fn supervision_row(
    line: &str,
    row: u64,
    recordings: &HashMap<String, (Map<String, Value>, PathBuf)>,
    source: &str,
    allow_pipes: bool,
) -> Result<ManifestRow, (Reason, String)> {
    let bad = |d: String| (Reason::MalformedLine, d);
    let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let sup = v.as_object().ok_or_else(|| bad("not a JSON object".into()))?;
    let rec_id = string(sup, "recording_id").ok_or_else(|| bad("no `recording_id`".into()))?;
    let (rec, base) = recordings.get(&rec_id).ok_or_else(|| {
        (Reason::MissingFile, format!("recording {rec_id:?} is in no recording set given"))
    })?;
    let audio = recording_audio(rec, sup.get("channel"), base, allow_pipes)?;
    span_row(row, sup, audio, std::slice::from_ref(&v), source)
}
