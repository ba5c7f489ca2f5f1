//! Lhotse Shar directories: shards of a cut set, each a cut manifest `cuts.NNNNNN.jsonl.gz`
//! beside one tar archive per field, of which asrc reads `recording.NNNNNN.tar` (without
//! sharding, `cuts.jsonl.gz` and `recording.tar`). Lhotse's Shar writer stores each cut's own
//! audio, already cut (the manifest's cuts start at 0), as the member `CUT_ID.EXT` (FLAC, WAV,
//! MP3 or Opus) followed by `CUT_ID.json`, its recording's manifest; a cut without audio has
//! the placeholders `CUT_ID.nodata` and `CUT_ID.nometa`. Other fields' archives (features,
//! custom arrays) are not read.
//!
//! A row is one cut: its text and language from its supervisions as for a cut set
//! ([`super::lhotse`]), its audio the member named by its id, read in place at stage 2. Each
//! cut finds its member by id, so a shard whose archive lost or reordered members still gives
//! its other cuts. Rows that are dropped, with the shard and the cut named: a cut whose
//! archive is missing or cannot be indexed, has no member for it or only the placeholder, a
//! line that is not a `MonoCut`; and an audio member that no cut names (no transcript).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::lhotse::{lines, mono_cut, num, string, supervised};
use super::tar::{Span, TarCache};
use super::{malformed, AudioRef, InputError};
use crate::manifest::ManifestRow;
use crate::reason::Reason;

/// How Shar directories are read.
#[derive(Debug, Clone, Default)]
pub struct SharOptions {
    /// Source name of every row (default: the first directory's name).
    pub source: Option<String>,
}

/// One shard: its cut manifest and its recording archive's path (which may be missing).
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// `cuts{suffix}.jsonl.gz` (or `.jsonl`).
    pub cuts: PathBuf,
    /// `recording{suffix}.tar` beside it.
    pub recording: PathBuf,
}

/// The recording archive of the shard whose cut manifest has `suffix`, in `dir`.
fn recording_path(dir: &Path, suffix: &str) -> PathBuf {
    dir.join(format!("recording{suffix}.tar"))
}

/// The shard suffix of a cut manifest's file name (`.000003` in `cuts.000003.jsonl.gz`, the
/// empty string in `cuts.jsonl.gz`), or `None` for another file.
fn cuts_suffix(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("cuts")?;
    rest.strip_suffix(".jsonl.gz").or_else(|| rest.strip_suffix(".jsonl"))
}

/// Whether `dir` looks like a Shar directory: a cut manifest named as Lhotse's Shar writer
/// names them, and a field's tar archive (a Shar written without its `recording` field is
/// one too, and [`shards`] refuses it by name).
pub fn is_shar(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.iter().any(|n| cuts_suffix(n).is_some()) && names.iter().any(|n| n.ends_with(".tar"))
}

/// The shards of the Shar directory `dir`, in shard order (by number: `.000010` after
/// `.000009`, and any width).
pub fn shards(dir: &Path) -> Result<Vec<Shard>, InputError> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .map_err(InputError::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            cuts_suffix(&name).map(|s| (s.to_owned(), p.clone()))
        })
        .collect();
    if found.is_empty() {
        return Err(InputError::Invalid {
            path: dir.to_path_buf(),
            message: "no cut manifest (cuts.NNNNNN.jsonl.gz or cuts.jsonl.gz): not a Lhotse Shar \
                      directory"
                .into(),
        });
    }
    found.sort_by(|a, b| (a.0.len(), &a.0).cmp(&(b.0.len(), &b.0)));
    let shards: Vec<Shard> = found
        .into_iter()
        .map(|(suffix, cuts)| Shard { cuts, recording: recording_path(dir, &suffix) })
        .collect();
    if shards.iter().all(|s| !s.recording.is_file()) {
        return Err(InputError::Invalid {
            path: dir.to_path_buf(),
            message: "no recording archive (recording.NNNNNN.tar beside cuts.NNNNNN.jsonl.gz): \
                      asrc reads the audio of the Shar's `recording` field, which this Shar was \
                      written without"
                .into(),
        });
    }
    Ok(shards)
}

/// The member name without its last extension (Lhotse's writer names members
/// `{cut id}.{format}`, and a cut id may hold dots), and that extension.
fn split_last(name: &str) -> (&str, &str) {
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].rfind('.') {
        Some(dot) => (&name[..slash + dot], &name[slash + dot + 1..]),
        None => (name, ""),
    }
}

/// What an archive holds for one cut id.
#[derive(Debug, Clone, PartialEq)]
enum Held {
    /// An audio member.
    Audio(String, Span),
    /// The writer's placeholder for a cut without audio.
    Nothing,
}

/// The archive's members by cut id, in archive order; manifests (`.json`, `.nometa`) left
/// out. A member of another extension is kept as audio: stage 2 names its codec if it has
/// none asrc decodes.
fn held(members: &[(String, Span)]) -> Vec<(String, Held)> {
    members
        .iter()
        .filter_map(|(name, span)| {
            let (key, ext) = split_last(name);
            let key = key.to_owned();
            match ext.to_ascii_lowercase().as_str() {
                "json" | "nometa" => None,
                "nodata" => Some((key, Held::Nothing)),
                _ => Some((key, Held::Audio(name.clone(), *span))),
            }
        })
        .collect()
}

/// Reads every cut of every shard of every directory, in order.
pub fn read(
    dirs: &[PathBuf],
    opts: &SharOptions,
    tars: &TarCache,
) -> Result<Vec<ManifestRow>, InputError> {
    let source = opts.source.clone().unwrap_or_else(|| {
        dirs.first()
            .and_then(|d| d.canonicalize().ok().or_else(|| Some(d.clone())))
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default()
    });
    let mut rows = Vec::new();
    for dir in dirs {
        for shard in shards(dir)? {
            read_shard(&shard, &source, tars, &mut rows)?;
        }
    }
    Ok(rows)
}

/// One shard's rows: a row per cut, then a row per audio member no cut names.
fn read_shard(
    shard: &Shard,
    source: &str,
    tars: &TarCache,
    rows: &mut Vec<ManifestRow>,
) -> Result<(), InputError> {
    let lines = lines(&shard.cuts)?;
    // The archive's members by id, or why the shard has none.
    let tar = &shard.recording;
    let members: Result<Vec<(String, Held)>, (Reason, String)> = if !tar.is_file() {
        let name = tar.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        Err((
            Reason::MissingFile,
            format!(
                "{} has no recording archive beside it ({name} is missing)",
                shard.cuts.display()
            ),
        ))
    } else {
        match tars.index(tar).as_ref() {
            Ok(index) => Ok(held(&index.members)),
            Err(e) => Err((Reason::MissingFile, e.to_string())),
        }
    };
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    if let Ok(m) = &members {
        for (i, (key, _)) in m.iter().enumerate() {
            by_id.entry(key.as_str()).or_insert(i);
        }
    }
    let mut used = vec![false; members.as_ref().map_or(0, Vec::len)];
    for (n, line) in &lines {
        let row = rows.len() as u64;
        let origin = format!("{}:{n}", shard.cuts.display());
        let r = match &members {
            Err((reason, detail)) => Err((*reason, detail.clone())),
            Ok(m) => cut_row(line, row, source, shard, |id| {
                let i = *by_id.get(id)?;
                used[i] = true;
                Some(m[i].1.clone())
            }),
        };
        let r = r.unwrap_or_else(|(reason, detail)| malformed(row, origin.clone(), reason, detail));
        rows.push(ManifestRow { origin: Some(origin), ..r });
    }
    if let Ok(m) = &members {
        for ((key, h), _) in m.iter().zip(&used).filter(|(_, u)| !**u) {
            if let Held::Audio(name, _) = h {
                let row = rows.len() as u64;
                let mut r = malformed(
                    row,
                    format!("{}:{name}", tar.display()),
                    Reason::MalformedLine,
                    format!(
                        "audio member {name:?} belongs to no cut of {} (no transcript)",
                        shard.cuts.display()
                    ),
                );
                r.segment_id = Some(key.clone());
                rows.push(r);
            }
        }
    }
    Ok(())
}

/// One cut as a row, its audio found by `find` (the archive's entry for an id).
fn cut_row(
    line: &str,
    row: u64,
    source: &str,
    shard: &Shard,
    mut find: impl FnMut(&str) -> Option<Held>,
) -> Result<ManifestRow, (Reason, String)> {
    let bad = |d: String| (Reason::MalformedLine, d);
    let cut = &mono_cut(line)?;
    let id = string(cut, "id").ok_or_else(|| bad("the cut has no `id`".into()))?;
    let duration = num(cut, "duration").map_err(bad)?;
    let tar = shard.recording.clone();
    let audio = match find(&id) {
        Some(Held::Audio(member, span)) => AudioRef::Member { tar, member, span: Some(span) },
        Some(Held::Nothing) => {
            return Err((
                Reason::MissingMember,
                format!(
                    "{} holds no audio for cut {id:?} (the writer's .nodata placeholder)",
                    tar.display()
                ),
            ))
        }
        None => {
            return Err((
                Reason::MissingMember,
                format!("{} has no member for cut {id:?}", tar.display()),
            ))
        }
    };
    let sups = cut.get("supervisions").and_then(Value::as_array).cloned().unwrap_or_default();
    let (text, lang) = supervised(&sups);
    Ok(ManifestRow {
        row,
        segment_id: Some(id),
        text,
        lang,
        source: Some(source.to_owned()),
        duration,
        audio: Some(audio),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::wds::AUDIO_EXTENSIONS;

    #[test]
    fn shard_suffixes_and_member_keys() {
        assert_eq!(cuts_suffix("cuts.000003.jsonl.gz"), Some(".000003"));
        assert_eq!(cuts_suffix("cuts.jsonl.gz"), Some(""));
        assert_eq!(cuts_suffix("cuts.000001.jsonl"), Some(".000001"));
        assert_eq!(cuts_suffix("recording.000001.tar"), None);
        assert_eq!(cuts_suffix("supervisions.jsonl.gz"), None);
        // A cut id may hold dots: the member's key ends at its last one.
        assert_eq!(split_last("utt1.seg2.flac"), ("utt1.seg2", "flac"));
        assert_eq!(split_last("a.b/utt1.nodata"), ("a.b/utt1", "nodata"));
        assert_eq!(
            recording_path(Path::new("/x"), ".000002"),
            Path::new("/x/recording.000002.tar")
        );
        assert_eq!(recording_path(Path::new(""), ""), Path::new("recording.tar"));
    }

    #[test]
    fn shards_are_in_number_order_whatever_their_width() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["cuts.000010.jsonl.gz", "cuts.000009.jsonl.gz", "cuts.1000000.jsonl.gz"] {
            std::fs::write(dir.path().join(n), b"").unwrap();
        }
        std::fs::write(dir.path().join("recording.000009.tar"), b"").unwrap();
        let got: Vec<_> = shards(dir.path())
            .unwrap()
            .into_iter()
            .map(|s| {
                (s.cuts.file_name().unwrap().to_string_lossy().into_owned(), s.recording.is_file())
            })
            .collect();
        assert_eq!(
            got,
            [
                ("cuts.000009.jsonl.gz".to_owned(), true),
                ("cuts.000010.jsonl.gz".to_owned(), false),
                ("cuts.1000000.jsonl.gz".to_owned(), false)
            ]
        );
        assert!(is_shar(dir.path()));
    }

    #[test]
    fn a_shar_without_recordings_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cuts.000000.jsonl.gz"), b"").unwrap();
        std::fs::write(dir.path().join("features.000000.tar"), b"").unwrap();
        let e = shards(dir.path()).unwrap_err().to_string();
        assert!(e.contains("`recording` field"), "{e}");
        assert!(is_shar(dir.path()));
        std::fs::remove_file(dir.path().join("features.000000.tar")).unwrap();
        assert!(!is_shar(dir.path()), "a cut manifest alone is no Shar");
        let empty = tempfile::tempdir().unwrap();
        assert!(shards(empty.path()).unwrap_err().to_string().contains("no cut manifest"));
    }

    /// `AUDIO_EXTENSIONS` is what the WebDataset reader chooses among; every one of them is
    /// kept as audio here too.
    #[test]
    fn members_by_id_leave_manifests_out() {
        let span = |o| Span { offset: o, size: 1 };
        let mut members: Vec<(String, Span)> = AUDIO_EXTENSIONS
            .iter()
            .enumerate()
            .flat_map(|(i, e)| {
                [
                    (format!("c{i}.{e}"), span(2 * i as u64)),
                    (format!("c{i}.json"), span(2 * i as u64 + 1)),
                ]
            })
            .collect();
        members.push(("gone.nodata".into(), span(100)));
        members.push(("gone.nometa".into(), span(101)));
        let h = held(&members);
        assert_eq!(h.len(), AUDIO_EXTENSIONS.len() + 1);
        assert_eq!(h[0], ("c0".to_owned(), Held::Audio("c0.flac".into(), span(0))));
        assert_eq!(h.last().unwrap(), &("gone".to_owned(), Held::Nothing));
    }
}
