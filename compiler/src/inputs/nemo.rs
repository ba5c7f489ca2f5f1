//! NeMo JSON-lines manifests, plain and tarred.
//!
//! One JSON object per line: `audio_filepath` (or `audio_filename`), `duration`, `text` (or
//! `normalized_text`), `lang` (or `language`), `offset` (seconds into the recording; the row is
//! then the segment `offset .. offset + duration`). An id is taken from `segment_id`, `utt_id`
//! or `id` when the line has one, else made from the audio file's stem (and the offset).
//! Relative audio paths resolve against the manifest's directory (or `--audio-root`).
//!
//! Tarred (`--format nemo-tarred`): `audio_filepath` names a member of the tar archive that
//! the line's `shard_id` picks from `--tarred-audio-filepaths`, a pattern NeMo writes as
//! `audio__OP_0..7_CL_.tar` (or `audio_{0..7}.tar`). A line without `shard_id` looks in every
//! archive, first match wins.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::tar::TarCache;
use super::{malformed, resolve, stem, AudioRef, InputError};
use crate::audio::segment::Segment;
use crate::manifest::ManifestRow;
use crate::reason::Reason;

/// How NeMo manifests are read.
#[derive(Debug, Clone, Default)]
pub struct NemoOptions {
    /// Base directory of relative audio paths instead of each manifest's directory.
    pub audio_root: Option<PathBuf>,
    /// Source name of every row (default: the manifest's file stem).
    pub source: Option<String>,
    /// The tarred audio pattern (`--tarred-audio-filepaths`), for NeMo tarred datasets.
    pub tarred_audio_filepaths: Option<String>,
}

/// NeMo's shard patterns expanded: `_OP_a..b_CL_` and `{a..b}` give one path per number, in
/// order; a pattern without either is one path.
pub fn expand_shards(pattern: &str) -> Result<Vec<PathBuf>, String> {
    let p = pattern.replace("_OP_", "{").replace("_CL_", "}");
    let Some(open) = p.find('{') else {
        return Ok(vec![PathBuf::from(p)]);
    };
    let close = p[open..].find('}').map(|c| open + c).ok_or_else(|| {
        format!("{pattern:?}: a brace opens and never closes (expected {{a..b}} or _OP_a..b_CL_)")
    })?;
    let inner = &p[open + 1..close];
    let (a, b) = inner
        .split_once("..")
        .and_then(|(a, b)| Some((a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?)))
        .ok_or_else(|| format!("{pattern:?}: {inner:?} is not a range a..b of numbers"))?;
    if b < a {
        return Err(format!("{pattern:?}: the range {a}..{b} is empty"));
    }
    let (head, tail) = (&p[..open], &p[close + 1..]);
    let mut out = Vec::new();
    for i in a..=b {
        // A pattern may hold further ranges (rare); expand them too.
        out.extend(expand_shards(&format!("{head}{i}{tail}"))?);
    }
    Ok(out)
}

/// A field as text: strings as they are, numbers written out.
fn text_field(obj: &serde_json::Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| match obj.get(*k)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

/// A numeric field (a number, or a string holding one).
fn number_field(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(Value::String(s)) => {
            s.trim().parse().map(Some).map_err(|_| format!("`{key}` is {s:?}, not a number"))
        }
        Some(v) => Err(format!("`{key}` is {v}, not a number")),
    }
}

/// Reads every line of `manifests`, in order; rows are numbered across them from 0.
pub fn read(
    manifests: &[PathBuf],
    opts: &NemoOptions,
    tars: &TarCache,
) -> Result<Vec<ManifestRow>, InputError> {
    let shards = match &opts.tarred_audio_filepaths {
        None => None,
        Some(p) => {
            let list = expand_shards(p).map_err(|message| InputError::Invalid {
                path: PathBuf::from(p),
                message: format!("--tarred-audio-filepaths {message}"),
            })?;
            for t in &list {
                // Index every archive now: a missing or damaged one stops the compile here,
                // naming it, rather than rejecting each of its rows.
                if let Err(e) = tars.index(t).as_ref() {
                    return Err(InputError::Tar(e.clone()));
                }
            }
            Some(list)
        }
    };
    let mut rows = Vec::new();
    for manifest in manifests {
        let file = std::fs::File::open(manifest).map_err(InputError::io(manifest))?;
        let base = match &opts.audio_root {
            Some(root) => root.clone(),
            None => manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        };
        let source = opts.source.clone().unwrap_or_else(|| stem(manifest));
        for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(InputError::io(manifest))?;
            if line.trim().is_empty() {
                continue;
            }
            let row = rows.len() as u64;
            let origin = format!("{}:{}", manifest.display(), n + 1);
            rows.push(
                parse_line(&line, row, &base, &source, shards.as_deref(), tars).unwrap_or_else(
                    |detail| malformed(row, origin.clone(), Reason::MalformedLine, detail),
                ),
            );
            if let Some(r) = rows.last_mut() {
                r.origin = Some(origin);
            }
        }
    }
    Ok(rows)
}

/// One manifest line as a row, or what is wrong with it.
fn parse_line(
    line: &str,
    row: u64,
    base: &Path,
    source: &str,
    shards: Option<&[PathBuf]>,
    tars: &TarCache,
) -> Result<ManifestRow, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err(format!("a JSON {}, not an object", json_kind(&value)));
    };
    let audio = text_field(&obj, &["audio_filepath", "audio_filename"])
        .filter(|a| !a.is_empty())
        .ok_or("no `audio_filepath` (or `audio_filename`)")?;
    let duration = number_field(&obj, "duration")?;
    let offset = number_field(&obj, "offset")?;
    let segment = offset.map(|offset| Segment { offset, duration });
    let id = text_field(&obj, &["segment_id", "utt_id", "id"]).unwrap_or_else(|| {
        let s = stem(Path::new(&audio));
        match offset {
            Some(o) => format!("{s}@{o}"),
            None => s,
        }
    });
    let shard_id = text_field(&obj, &["shard_id"]);
    let audio_ref = match shards {
        None => AudioRef::File(resolve(base, &audio)),
        Some(list) => tarred_member(list, shard_id.as_deref(), &audio, tars)?,
    };
    Ok(ManifestRow {
        row,
        segment_id: Some(id),
        shard_id,
        text: text_field(&obj, &["text", "normalized_text"]),
        lang: text_field(&obj, &["lang", "language"]),
        source: Some(source.to_owned()),
        duration,
        audio: Some(audio_ref),
        segment,
        ..Default::default()
    })
}

/// Where a tarred line's audio is: member `member` of the shard `shard_id` names, or of the
/// first archive that holds it.
fn tarred_member(
    shards: &[PathBuf],
    shard_id: Option<&str>,
    member: &str,
    tars: &TarCache,
) -> Result<AudioRef, String> {
    let tar = match shard_id {
        Some(id) => {
            let i: usize = id.parse().map_err(|_| format!("`shard_id` is {id:?}, not a number"))?;
            shards.get(i).cloned().ok_or_else(|| {
                format!(
                    "`shard_id` {i}, but --tarred-audio-filepaths names {} archives",
                    shards.len()
                )
            })?
        }
        None => shards
            .iter()
            .find(|t| tars.index(t).as_ref().as_ref().is_ok_and(|ix| ix.get(member).is_some()))
            .or(shards.first())
            .cloned()
            .ok_or("--tarred-audio-filepaths names no archive")?,
    };
    let span = tars.index(&tar).as_ref().as_ref().ok().and_then(|ix| ix.get(member));
    Ok(AudioRef::Member { tar, member: member.to_owned(), span })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_patterns_expand_as_nemo_writes_them() {
        let got = expand_shards("d/audio__OP_0..2_CL_.tar").unwrap();
        assert_eq!(got, ["d/audio_0.tar", "d/audio_1.tar", "d/audio_2.tar"].map(PathBuf::from));
        assert_eq!(
            expand_shards("a_{3..4}.tar").unwrap(),
            ["a_3.tar", "a_4.tar"].map(PathBuf::from)
        );
        assert_eq!(expand_shards("one.tar").unwrap(), [PathBuf::from("one.tar")]);
        assert!(expand_shards("a_{x..2}.tar").is_err());
        assert!(expand_shards("a_{2..1}.tar").is_err());
        assert!(expand_shards("a_{0..1.tar").is_err());
    }

    #[test]
    fn a_bad_line_says_what_is_wrong() {
        let tars = TarCache::default();
        let parse = |l: &str| parse_line(l, 0, Path::new("/m"), "s", None, &tars);
        assert!(parse("{\"audio_filepath\": ").unwrap_err().starts_with("not JSON"));
        assert_eq!(parse("[1]").unwrap_err(), "a JSON array, not an object");
        assert!(parse("{\"text\": \"x\"}").unwrap_err().contains("audio_filepath"));
        let e = parse("{\"audio_filepath\": \"a.wav\", \"duration\": \"long\"}").unwrap_err();
        assert_eq!(e, "`duration` is \"long\", not a number");
        let row = parse(
            "{\"audio_filepath\": \"x/a.wav\", \"duration\": 1.5, \"offset\": 2, \"text\": \"hi\"}",
        )
        .unwrap();
        assert_eq!(row.segment_id.as_deref(), Some("a@2"));
        assert_eq!(row.audio, Some(AudioRef::File(PathBuf::from("/m/x/a.wav"))));
        assert_eq!(row.segment, Some(Segment { offset: 2.0, duration: Some(1.5) }));
    }
}
