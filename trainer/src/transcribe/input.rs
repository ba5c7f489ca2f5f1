//! What `asrt transcribe` reads: audio files (any codec `asrc` decodes), directories of them,
//! NeMo manifests (each line's fields kept for the output, `offset`/`duration` cut a segment,
//! `text` the reference), and corpora (their 16 kHz samples and transcripts). Audio is decoded,
//! cut, downmixed and resampled to 16 kHz exactly as `asrc compile` does it, by its own code.

use std::path::{Path, PathBuf};

use asr_compiler::{
    decode_stream, to_i16, DecodeOptions, Decoded, Reject, Resampler, Segment, MAX_SECONDS,
};
use asr_corpus::Corpus;
use serde_json::{Map, Value};

use super::TranscribeError;

/// File extensions a directory is searched for.
pub const AUDIO_EXTENSIONS: [&str; 8] = ["flac", "wav", "mp3", "ogg", "opus", "oga", "m4a", "aac"];

/// Where an item's samples are.
#[derive(Debug, Clone)]
pub enum Samples {
    /// An audio file, or a segment of one.
    File {
        /// The file.
        path: PathBuf,
        /// The part of it, from a manifest's `offset` and `duration`.
        segment: Option<Segment>,
    },
    /// Utterance `index` of input corpus `corpus`.
    Corpus {
        /// Position of the corpus among the inputs' corpora.
        corpus: usize,
        /// The utterance.
        index: usize,
    },
}

/// One thing to transcribe.
#[derive(Debug, Clone)]
pub struct Item {
    /// The name the output gives it: the path as given, a manifest's `audio_filepath` as
    /// written, or `CORPUS#INDEX`.
    pub name: String,
    /// A manifest line's own fields, carried into the output.
    pub fields: Map<String, Value>,
    /// The reference transcript, when the input has one.
    pub reference: Option<String>,
    /// Where the samples are.
    pub samples: Samples,
}

/// The items of `inputs`, in order, and the corpora they name.
pub fn items(inputs: &[PathBuf]) -> Result<(Vec<Item>, Vec<Corpus>), TranscribeError> {
    let mut items = Vec::new();
    let mut corpora = Vec::new();
    for input in inputs {
        let name =
            input.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        if input.is_dir() {
            let mut files = Vec::new();
            walk(input, &mut files)?;
            files.sort();
            if files.is_empty() {
                return Err(TranscribeError::Input {
                    path: input.clone(),
                    message: format!(
                        "no audio files (.{}) in the directory or below",
                        AUDIO_EXTENSIONS.join(", .")
                    ),
                });
            }
            items.extend(files.into_iter().map(|p| file_item(p, None)));
        } else if name.ends_with(".asrcorpus") {
            let corpus = Corpus::open(input).map_err(|e| TranscribeError::Input {
                path: input.clone(),
                message: e.to_string(),
            })?;
            let c = corpora.len();
            for index in 0..corpus.len() {
                let (id, text) = corpus.text(index).map_err(|e| TranscribeError::Input {
                    path: input.clone(),
                    message: e.to_string(),
                })?;
                let mut fields = Map::new();
                fields.insert("segment_id".into(), Value::String(id));
                items.push(Item {
                    name: format!("{}#{index}", input.display()),
                    fields,
                    reference: Some(text),
                    samples: Samples::Corpus { corpus: c, index },
                });
            }
            corpora.push(corpus);
        } else if name.ends_with(".json") || name.ends_with(".jsonl") {
            manifest(input, &mut items)?;
        } else {
            items.push(file_item(input.clone(), None));
        }
    }
    Ok((items, corpora))
}

fn file_item(path: PathBuf, segment: Option<Segment>) -> Item {
    Item {
        name: path.display().to_string(),
        fields: Map::new(),
        reference: None,
        samples: Samples::File { path, segment },
    }
}

/// The audio files under `dir`.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), TranscribeError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| TranscribeError::Input { path: dir.to_path_buf(), message: e.to_string() })?;
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p
            .extension()
            .is_some_and(|x| AUDIO_EXTENSIONS.iter().any(|a| x.eq_ignore_ascii_case(a)))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// A NeMo manifest's lines as items; a line that cannot be read is an item that fails.
fn manifest(path: &Path, items: &mut Vec<Item>) -> Result<(), TranscribeError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TranscribeError::Input { path: path.to_path_buf(), message: e.to_string() })?;
    let base = path.parent().unwrap_or(Path::new(""));
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let fields = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(o)) => o,
            _ => {
                items.push(Item {
                    name: at,
                    fields: Map::new(),
                    reference: None,
                    samples: Samples::File { path: PathBuf::new(), segment: None },
                });
                continue;
            }
        };
        let audio = ["audio_filepath", "audio_filename"]
            .iter()
            .find_map(|k| fields.get(*k).and_then(Value::as_str))
            .unwrap_or("")
            .to_owned();
        let num = |k: &str| fields.get(k).and_then(Value::as_f64);
        let segment = num("offset").map(|offset| Segment { offset, duration: num("duration") });
        let resolved = if audio.is_empty() {
            PathBuf::new()
        } else if Path::new(&audio).is_absolute() {
            PathBuf::from(&audio)
        } else {
            base.join(&audio)
        };
        let reference = ["text", "normalized_text"]
            .iter()
            .find_map(|k| fields.get(*k).and_then(Value::as_str))
            .map(str::to_owned);
        items.push(Item {
            name: if audio.is_empty() { at } else { audio },
            fields,
            reference,
            samples: Samples::File { path: resolved, segment },
        });
    }
    Ok(())
}

/// An item's 16 kHz samples, or why there are none (reason name and detail). Longer than
/// `max_seconds` is refused.
pub fn load(
    item: &Item,
    corpora: &[Corpus],
    resampler: &mut Resampler,
    max_seconds: f64,
) -> Result<Vec<i16>, (String, String)> {
    let reject = |r: Reject| (r.reason().name().to_owned(), r.detail().to_owned());
    let pcm = match &item.samples {
        Samples::Corpus { corpus, index } => corpora[*corpus].pcm(*index).to_vec(),
        Samples::File { path, .. } if path.as_os_str().is_empty() => {
            return Err((
                "malformed_line".into(),
                "not a JSON object with an audio_filepath".into(),
            ))
        }
        Samples::File { path, segment } => {
            let bytes = std::fs::read(path)
                .map_err(|e| ("missing_file".to_owned(), format!("{}: {e}", path.display())))?;
            let opts = DecodeOptions {
                max_seconds: if segment.is_some() {
                    3600
                } else {
                    MAX_SECONDS.max(max_seconds.ceil() as u64 + 1)
                },
                ..DecodeOptions::default()
            };
            let decoded = Decoded::from_stream(&decode_stream(bytes, &opts).map_err(reject)?);
            let samples = match segment {
                Some(s) => {
                    let range = s.range(decoded.samples.len(), decoded.rate).map_err(reject)?;
                    &decoded.samples[range]
                }
                None => &decoded.samples[..],
            };
            let resampled = resampler
                .to_target(samples, decoded.rate)
                .map_err(|e| ("unsupported_audio".to_owned(), e.to_string()))?;
            to_i16(&resampled)
        }
    };
    let seconds = pcm.len() as f64 / 16_000.0;
    if seconds > max_seconds {
        return Err((
            "too_long".into(),
            format!(
                "{seconds:.1} s of audio, more than --max-seconds {max_seconds}: the encoder attends \
                 over the whole utterance (memory grows with its square), so long audio is refused \
                 rather than chunked; cut it into segments (a NeMo manifest with offset and \
                 duration) or raise --max-seconds"
            ),
        ));
    }
    if pcm.is_empty() {
        return Err(("no_samples".into(), "no samples".into()));
    }
    Ok(pcm)
}
