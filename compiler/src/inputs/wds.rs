//! WebDataset and WeNet tar shards: consecutive members sharing a key (the member name up to
//! the first dot of its file name) are one sample. The sample's audio is its `wav`, `flac`,
//! `mp3`, `ogg`, `opus`, `m4a` or `aac` member (read in place at stage 2, never extracted), its transcript
//! the `txt` (or `text`) member, its language a `lang` member or the `lang`/`language` field
//! of a `json` member.
//!
//! The input is one or more `.tar` files, a directory (its `.tar` files in name order), or a
//! list file such as WeNet's `data.list`: one archive path per line, relative to the list's
//! directory.

use std::path::{Path, PathBuf};

use super::tar::{read_span, TarCache, TarIndex};
use super::{malformed, resolve, AudioRef, InputError};
use crate::manifest::ManifestRow;
use crate::reason::Reason;

/// The audio member extensions, in the order one is chosen when a sample has several.
pub const AUDIO_EXTENSIONS: [&str; 7] = ["flac", "wav", "opus", "ogg", "mp3", "m4a", "aac"];

/// How shards are read.
#[derive(Debug, Clone, Default)]
pub struct WdsOptions {
    /// Source name of every row (default: the first input's stem).
    pub source: Option<String>,
}

/// The `.tar` files directly in `dir`, in name order.
pub fn tars_in(dir: &Path) -> Result<Vec<PathBuf>, InputError> {
    let mut tars: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(InputError::io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "tar") && p.is_file())
        .collect();
    tars.sort();
    Ok(tars)
}

/// The archives the inputs name: tar files as they are, directories' tar files, list files'
/// lines.
pub fn archives(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            out.extend(tars_in(p)?);
        } else if p.extension().is_some_and(|e| e == "tar") {
            out.push(p.clone());
        } else {
            let text = std::fs::read_to_string(p).map_err(InputError::io(p))?;
            let base = p.parent().unwrap_or(Path::new(""));
            out.extend(
                text.lines().map(str::trim).filter(|l| !l.is_empty()).map(|l| resolve(base, l)),
            );
        }
    }
    if out.is_empty() {
        return Err(InputError::Invalid {
            path: inputs.first().cloned().unwrap_or_default(),
            message: "no .tar archives found".into(),
        });
    }
    Ok(out)
}

/// A member name's sample key and extension: `a/b.c.flac` is `a/b` and `c.flac`.
fn split_key(name: &str) -> (&str, &str) {
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].find('.') {
        Some(dot) => (&name[..slash + dot], &name[slash + dot + 1..]),
        None => (name, ""),
    }
}

/// A small member's text (transcript, language, JSON), lossily decoded from UTF-8.
fn member_text(tar: &Path, span: super::Span) -> Result<String, String> {
    if span.size > 1 << 20 {
        return Err(format!("a text member of {} bytes (more than 1 MiB)", span.size));
    }
    let bytes = read_span(tar, span).map_err(|r| r.detail().to_owned())?;
    String::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 at byte {}", e.utf8_error().valid_up_to()))
}

/// Reads every sample of every archive, in order.
pub fn read(
    inputs: &[PathBuf],
    opts: &WdsOptions,
    tars: &TarCache,
) -> Result<Vec<ManifestRow>, InputError> {
    let source = opts
        .source
        .clone()
        .unwrap_or_else(|| inputs.first().map(|p| super::stem(p)).unwrap_or_default());
    let mut rows = Vec::new();
    for tar in archives(inputs)? {
        let index = tars.index(&tar);
        let index: &TarIndex = index.as_ref().as_ref().map_err(|e| InputError::Tar(e.clone()))?;
        let mut i = 0;
        while i < index.members.len() {
            let (key, _) = split_key(&index.members[i].0);
            let start = i;
            while i < index.members.len() && split_key(&index.members[i].0).0 == key {
                i += 1;
            }
            let row = rows.len() as u64;
            rows.push(sample(&tar, key, &index.members[start..i], row, &source));
        }
    }
    Ok(rows)
}

/// One sample (its members) as a row.
fn sample(
    tar: &Path,
    key: &str,
    members: &[(String, super::Span)],
    row: u64,
    source: &str,
) -> ManifestRow {
    let origin = format!("{}:{key}", tar.display());
    let find = |exts: &[&str]| {
        exts.iter()
            .find_map(|e| members.iter().find(|(n, _)| split_key(n).1.eq_ignore_ascii_case(e)))
    };
    let Some((audio_name, audio_span)) = find(&AUDIO_EXTENSIONS) else {
        let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
        let mut m = malformed(
            row,
            origin,
            Reason::MissingMember,
            format!("sample {key:?} has no audio member (.flac, .wav, .opus, .ogg, .mp3, .m4a or .aac); members: {names:?}"),
        );
        m.segment_id = Some(key.to_owned());
        return m;
    };
    let mut bad = None;
    let mut text_of = |exts: &[&str]| -> Option<String> {
        let (name, span) = find(exts)?;
        match member_text(tar, *span) {
            Ok(t) => Some(t.trim().to_owned()),
            Err(e) => {
                bad.get_or_insert(format!("{name}: {e}"));
                None
            }
        }
    };
    let text = text_of(&["txt", "text"]);
    let mut lang = text_of(&["lang", "language"]);
    if lang.is_none() {
        if let Some(json) = text_of(&["json"]) {
            match serde_json::from_str::<serde_json::Value>(&json) {
                Ok(v) => {
                    lang = ["lang", "language"]
                        .iter()
                        .find_map(|k| v.get(k).and_then(|l| l.as_str()).map(str::to_owned));
                }
                Err(e) => {
                    bad.get_or_insert(format!("the json member is not JSON: {e}"));
                }
            }
        }
    }
    if let Some(detail) = bad {
        let mut m = malformed(row, origin, Reason::MalformedLine, detail);
        m.segment_id = Some(key.to_owned());
        return m;
    }
    let id = key.rsplit('/').next().unwrap_or(key).to_owned();
    ManifestRow {
        row,
        segment_id: Some(id),
        text,
        lang,
        source: Some(source.to_owned()),
        audio: Some(AudioRef::Member {
            tar: tar.to_path_buf(),
            member: audio_name.clone(),
            span: Some(*audio_span),
        }),
        origin: Some(origin),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::split_key;

    #[test]
    fn keys_end_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("utt1.flac"), ("utt1", "flac"));
        assert_eq!(split_key("dir.v2/utt1.seg.txt"), ("dir.v2/utt1", "seg.txt"));
        assert_eq!(split_key("noext"), ("noext", ""));
    }
}
