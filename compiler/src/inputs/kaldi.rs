//! A Kaldi data directory: `wav.scp` (`RECORDING PATH`, or `RECORDING CMD |`), `text`
//! (`UTT TRANSCRIPT`), and when present `segments` (`UTT RECORDING START END`, END -1 for the
//! end of the recording), `utt2lang` (`UTT LANG`) and `utt2dur` (`UTT SECONDS`).
//!
//! With `segments`, there is one row per segment, in its order; without, one per `wav.scp`
//! line, the recording id being the utterance id. Relative paths resolve against the data
//! directory (or `--audio-root`). A pipe entry is refused (`pipe_refused`) unless
//! `--allow-pipes` asks for it to run under `sh -c`. An archive entry (`foo.ark:1234`, what
//! `wav-copy ark:... ark,scp:...` and kaldiio write) is the WAV file that starts at that byte of
//! the archive, read in place: Kaldi's wave holder writes the RIFF file itself, with no binary
//! marker before it, so the `RIFF` header's size says where it ends. Bytes other than a RIFF
//! header at the offset (a feature matrix, a wrong offset) are named rejects.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{malformed, resolve, AudioRef, InputError};
use crate::audio::decode::Reject;
use crate::audio::segment::Segment;
use crate::manifest::ManifestRow;
use crate::reason::Reason;

/// How a Kaldi directory is read.
#[derive(Debug, Clone, Default)]
pub struct KaldiOptions {
    /// Base directory of relative paths instead of the data directory.
    pub audio_root: Option<PathBuf>,
    /// Source name of every row (default: the directory's name).
    pub source: Option<String>,
    /// Whether `cmd |` entries of `wav.scp` are run.
    pub allow_pipes: bool,
}

/// A line's key and the rest, or `None` for a line with no second field.
fn key_rest(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    let (k, rest) = line.split_once(char::is_whitespace)?;
    Some((k, rest.trim()))
}

/// The lines of `dir/name` (`None` when the file does not exist), with their line numbers.
fn lines(dir: &Path, name: &str) -> Result<Option<Vec<(usize, String)>>, InputError> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(InputError::io(&path))?;
    Ok(Some(
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| (i + 1, l.to_owned()))
            .collect(),
    ))
}

/// A `KEY VALUE` table (`text`, `utt2lang`, `utt2dur`); a line with a key and no value maps to
/// the empty string.
fn table(dir: &Path, name: &str) -> Result<HashMap<String, String>, InputError> {
    let mut map = HashMap::new();
    for (_, l) in lines(dir, name)?.unwrap_or_default() {
        let (k, v) = key_rest(&l).unwrap_or((l.trim(), ""));
        map.insert(k.to_owned(), v.to_owned());
    }
    Ok(map)
}

/// A `wav.scp` entry: where its audio is, or why it cannot be read (reason and detail).
type ScpEntry = Result<AudioRef, (Reason, String)>;

/// Where a `wav.scp` entry's audio is, or why it cannot be read.
fn audio_of(base: &Path, entry: &str, allow_pipes: bool) -> ScpEntry {
    if let Some(cmd) = entry.strip_suffix('|') {
        if !allow_pipes {
            return Err((
                Reason::PipeRefused,
                format!("the entry is a command ({entry:?}); pass --allow-pipes to run it"),
            ));
        }
        // Kaldi runs pipes from the recipe directory; here they run from the data directory
        // (or --audio-root), where the relative paths of plain entries resolve too.
        return Ok(AudioRef::Pipe { command: cmd.trim().to_owned(), dir: base.to_path_buf() });
    }
    if entry.split_whitespace().count() > 1 {
        return Err((
            Reason::MalformedLine,
            format!("a path with spaces is not a Kaldi entry: {entry:?}"),
        ));
    }
    let ark = entry
        .rsplit_once(':')
        .filter(|(_, off)| !off.is_empty() && off.chars().all(|c| c.is_ascii_digit()));
    if let Some((path, off)) = ark {
        let offset = off.parse::<u64>().map_err(|_| {
            (Reason::MalformedLine, format!("the archive offset of {entry:?} is too large"))
        })?;
        return Ok(AudioRef::ArkWav { ark: resolve(base, path), offset });
    }
    Ok(AudioRef::File(resolve(base, entry)))
}

/// The WAV file at byte `offset` of the Kaldi archive `ark`: its RIFF header and as many bytes
/// as the header's size says (fewer where the archive ends first: the WAV decoder then names
/// the cut chunk).
pub(crate) fn read_ark_wav(ark: &Path, offset: u64) -> Result<Vec<u8>, Reject> {
    use std::os::unix::fs::FileExt;
    let name = ark.display();
    let missing = |e: std::io::Error| Reject::MissingFile(format!("{name}: {e}"));
    let file = std::fs::File::open(ark).map_err(missing)?;
    let len = file.metadata().map_err(missing)?.len();
    let mut head = [0u8; 12];
    let got = file.read_at(&mut head, offset).map_err(missing)?;
    if offset.saturating_add(12) > len || got < 12 {
        return Err(Reject::TruncatedAudio(format!(
            "{name}: the entry's offset {offset} leaves {} of the {len}-byte archive, less than a \
             WAV header",
            len.saturating_sub(offset)
        )));
    }
    if &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        // A feature archive's binary matrices start with "\0B" and a type token.
        let what = if head.starts_with(b"\0B") {
            "a binary Kaldi object (a feature matrix or vector, not a wave)"
        } else {
            "no RIFF/WAVE header"
        };
        let hex: Vec<String> = head[..8].iter().map(|b| format!("{b:02x}")).collect();
        return Err(Reject::UnsupportedCodec(format!(
            "{name}: at byte {offset}, {what} (first bytes {}); wav.scp's archive entries must \
             point at a WAV file, as wav-copy writes them",
            hex.join(" ")
        )));
    }
    let riff = u64::from(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
    super::tar::read_span(ark, super::Span { offset, size: (riff + 8).min(len - offset) })
}

/// Reads the data directory `dir`.
pub fn read(dir: &Path, opts: &KaldiOptions) -> Result<Vec<ManifestRow>, InputError> {
    let scp = lines(dir, "wav.scp")?.ok_or_else(|| InputError::Invalid {
        path: dir.to_path_buf(),
        message: "no wav.scp: a Kaldi data directory has wav.scp, text and optionally \
                  segments, utt2lang and utt2dur"
            .into(),
    })?;
    let base = opts.audio_root.clone().unwrap_or_else(|| dir.to_path_buf());
    let source = opts.source.clone().unwrap_or_else(|| super::stem(dir));
    let texts = table(dir, "text")?;
    let langs = table(dir, "utt2lang")?;
    let durs = table(dir, "utt2dur")?;
    let scp_origin = |n: usize| format!("{}:{n}", dir.join("wav.scp").display());
    // Recording id to its audio (or why it has none) and the wav.scp line.
    let mut recordings: HashMap<String, (ScpEntry, usize)> = HashMap::new();
    let mut order = Vec::new();
    for (n, l) in &scp {
        match key_rest(l) {
            Some((rec, entry)) => {
                recordings.insert(rec.to_owned(), (audio_of(&base, entry, opts.allow_pipes), *n));
                order.push((rec.to_owned(), *n));
            }
            None => order.push((String::new(), *n)),
        }
    }
    let make =
        |row: u64, utt: &str, audio: AudioRef, segment: Option<Segment>, duration| ManifestRow {
            row,
            segment_id: Some(utt.to_owned()),
            text: texts.get(utt).cloned(),
            lang: langs.get(utt).cloned(),
            source: Some(source.clone()),
            duration,
            audio: Some(audio),
            segment,
            ..Default::default()
        };
    let dur_of = |utt: &str| durs.get(utt).and_then(|d| d.parse::<f64>().ok());
    let mut rows = Vec::new();
    match lines(dir, "segments")? {
        None => {
            for (rec, n) in order {
                let row = rows.len() as u64;
                let origin = scp_origin(n);
                let r = match recordings.get(&rec) {
                    Some((Ok(audio), _)) if !rec.is_empty() => {
                        make(row, &rec, audio.clone(), None, dur_of(&rec))
                    }
                    Some((Err((reason, detail)), _)) => {
                        let mut m = malformed(row, origin.clone(), *reason, detail.clone());
                        m.segment_id = Some(rec.clone());
                        m
                    }
                    _ => malformed(
                        row,
                        origin.clone(),
                        Reason::MalformedLine,
                        "a recording id without a path".into(),
                    ),
                };
                rows.push(ManifestRow { origin: Some(origin), ..r });
            }
        }
        Some(segments) => {
            let seg_path = dir.join("segments");
            for (n, l) in segments {
                let row = rows.len() as u64;
                let origin = format!("{}:{n}", seg_path.display());
                let fields: Vec<&str> = l.split_whitespace().collect();
                let parsed = match fields.as_slice() {
                    [utt, rec, start, end] => match (start.parse::<f64>(), end.parse::<f64>()) {
                        (Ok(s), Ok(e)) if e == -1.0 || e > s => Ok((*utt, *rec, s, e)),
                        _ => Err(format!("start {start:?} and end {end:?} are not a time range")),
                    },
                    _ => Err(format!("{} fields, expected UTT RECORDING START END", fields.len())),
                };
                let r = match parsed {
                    Err(detail) => malformed(row, origin.clone(), Reason::MalformedLine, detail),
                    Ok((utt, rec, start, end)) => {
                        let duration = (end != -1.0).then_some(end - start);
                        match recordings.get(rec) {
                            Some((Ok(audio), _)) => make(
                                row,
                                utt,
                                audio.clone(),
                                Some(Segment { offset: start, duration }),
                                duration,
                            ),
                            Some((Err((reason, detail)), line)) => {
                                let mut m = malformed(
                                    row,
                                    origin.clone(),
                                    *reason,
                                    format!("{detail} (wav.scp line {line})"),
                                );
                                m.segment_id = Some(utt.to_owned());
                                m
                            }
                            None => {
                                let mut m = malformed(
                                    row,
                                    origin.clone(),
                                    Reason::MissingFile,
                                    format!("recording {rec:?} is not in wav.scp"),
                                );
                                m.segment_id = Some(utt.to_owned());
                                m
                            }
                        }
                    }
                };
                rows.push(ManifestRow { origin: Some(origin), ..r });
            }
        }
    }
    Ok(rows)
}
