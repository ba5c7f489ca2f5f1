//! What an MP4 (M4A) file says about its audio track that symphonia's reader does not apply:
//! the edit list, which names the samples that are the recording.
//!
//! An AAC encoder starts with priming samples (1024 for ffmpeg's and Apple's encoders) and pads
//! the last frame; the muxer's edit list (`moov/trak/edts/elst`) says where the recording
//! starts in the track (`media_time`, in the track's timescale) and how long it is
//! (`segment_duration`, in the movie's timescale). ISO/IEC 14496-12 8.6.6. symphonia 0.6 reads
//! the atom but does not apply it ("edits are not currently supported"), so the decoder's
//! output is trimmed here.
//!
//! Only what a muxer writes for one recording is taken: empty edits (`media_time` -1, a delay
//! before the presentation, which holds no samples) and then at most one edit at rate 1. Other
//! lists (several pieces of the track played in turn, or at another rate) are refused rather
//! than decoded whole.

use super::pcm::Reject;

/// The samples of the track that are the recording, in the track's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trim {
    /// Samples to drop at the start (the encoder's priming).
    pub(crate) skip: u64,
    /// Samples to keep after those; `None` for all (no edit list, or an edit to the end).
    pub(crate) keep: Option<u64>,
    /// How many samples `keep` may exceed what the track holds by the rounding of a duration
    /// in the movie's timescale (one of its units, often a millisecond).
    pub(crate) slack: u64,
}

/// One audio track's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AudioTrack {
    /// `tkhd`'s track id (symphonia's track id).
    pub(crate) id: u32,
    /// `mdhd`'s timescale: the track's time units per second.
    pub(crate) timescale: u32,
    /// The edit list's entries as `(segment_duration, media_time, rate)`, `rate` 16.16.
    pub(crate) edits: Vec<(u64, i64, i32)>,
}

/// The audio tracks (`hdlr` `soun`) of the MP4 `bytes` and the movie's timescale, or a
/// `CorruptAudio` reject naming the atom that does not parse.
pub(crate) fn audio_tracks(bytes: &[u8]) -> Result<(u32, Vec<AudioTrack>), Reject> {
    let moov = child(bytes, b"moov", "the file")?
        .ok_or_else(|| corrupt("no moov atom (the file's index)"))?;
    let mvhd = child(moov, b"mvhd", "moov")?.ok_or_else(|| corrupt("no moov/mvhd atom"))?;
    let movie_timescale = after_times(mvhd, "mvhd")?;
    let mut tracks = Vec::new();
    for trak in children(moov, "moov")?.filter(|(kind, _)| kind == b"trak").map(|(_, b)| b) {
        let Some(mdia) = child(trak, b"mdia", "trak")? else { continue };
        let is_audio = match child(mdia, b"hdlr", "mdia")? {
            // version and flags (4), pre_defined (4), then the handler type.
            Some(hdlr) => hdlr.get(8..12) == Some(b"soun".as_slice()),
            None => false,
        };
        if !is_audio {
            continue;
        }
        let tkhd = child(trak, b"tkhd", "trak")?.ok_or_else(|| corrupt("a trak without tkhd"))?;
        let id = after_times(tkhd, "tkhd")?;
        let mdhd = child(mdia, b"mdhd", "mdia")?.ok_or_else(|| corrupt("a trak without mdhd"))?;
        let timescale = after_times(mdhd, "mdhd")?;
        let edits = match child(trak, b"edts", "trak")? {
            Some(edts) => match child(edts, b"elst", "edts")? {
                Some(elst) => edit_list(elst)?,
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        tracks.push(AudioTrack { id, timescale, edits });
    }
    Ok((movie_timescale, tracks))
}

/// The trim the edit list of `track` asks for, at `rate` samples per second of decoded audio
/// (the track's timescale is usually the sample rate, but need not be).
pub(crate) fn trim(track: &AudioTrack, movie_timescale: u32, rate: u32) -> Result<Trim, Reject> {
    let mut edits = track.edits.iter().skip_while(|(_, media_time, _)| *media_time == -1);
    let Some(&(duration, media_time, speed)) = edits.next() else {
        return Ok(Trim { skip: 0, keep: None, slack: 0 });
    };
    let n = track.edits.len();
    if edits.next().is_some() || speed != 1 << 16 || media_time < 0 {
        return Err(Reject::Unsupported(format!(
            "MP4: the audio track's edit list of {n} edit{} plays the track in pieces or at \
             another rate (first played edit: media time {media_time}, rate {speed}/65536); \
             asrc takes one edit at rate 1",
            if n == 1 { "" } else { "s" }
        )));
    }
    if track.timescale == 0 || movie_timescale == 0 {
        return Err(corrupt("a timescale of 0"));
    }
    let scale = |t: u64, from: u32| -> u64 {
        (u128::from(t) * u128::from(rate) / u128::from(from)).try_into().unwrap_or(u64::MAX)
    };
    let skip = scale(media_time as u64, track.timescale);
    // A duration of 0 in a single edit means "to the end of the track" in files written by
    // some muxers (ffmpeg reads it so too).
    let keep = (duration != 0).then(|| scale(duration, movie_timescale));
    let slack = u64::from(rate.div_ceil(movie_timescale));
    Ok(Trim { skip, keep, slack })
}

/// `elst`'s entries.
fn edit_list(elst: &[u8]) -> Result<Vec<(u64, i64, i32)>, Reject> {
    let short = || corrupt("elst is shorter than its entry count");
    let version = *elst.first().ok_or_else(short)?;
    let count = be_u32(elst, 4).ok_or_else(short)? as usize;
    let size = if version == 1 { 20 } else { 12 };
    let body = elst.get(8..).ok_or_else(short)?;
    if body.len() / size < count {
        return Err(short());
    }
    Ok(body
        .chunks_exact(size)
        .take(count)
        .map(|e| {
            let (duration, media_time, at) = if version == 1 {
                (be_u64(e, 0).unwrap_or(0), be_u64(e, 8).unwrap_or(0) as i64, 16)
            } else {
                (
                    u64::from(be_u32(e, 0).unwrap_or(0)),
                    i64::from(be_u32(e, 4).unwrap_or(0) as i32),
                    8,
                )
            };
            (duration, media_time, be_u32(e, at).unwrap_or(0) as i32)
        })
        .collect())
}

/// The 32-bit field after a full atom's creation and modification times: `mvhd`'s and
/// `mdhd`'s timescale, `tkhd`'s track id.
fn after_times(atom: &[u8], name: &str) -> Result<u32, Reject> {
    // After version and flags: creation and modification times, 4 or 8 bytes each.
    let at = if atom.first() == Some(&1) { 20 } else { 12 };
    be_u32(atom, at).ok_or_else(|| corrupt(&format!("{name} is too short")))
}

/// The first child atom of `kind` in `parent`'s body.
fn child<'a>(parent: &'a [u8], kind: &[u8; 4], name: &str) -> Result<Option<&'a [u8]>, Reject> {
    for (k, body) in children(parent, name)? {
        if &k == kind {
            return Ok(Some(body));
        }
    }
    Ok(None)
}

/// The atoms in `parent`'s body as `(type, body)`, or a reject where a size runs past the end.
fn children<'a>(
    parent: &'a [u8],
    name: &str,
) -> Result<impl Iterator<Item = ([u8; 4], &'a [u8])>, Reject> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= parent.len() {
        let size32 = be_u32(parent, at).unwrap_or(0);
        let kind: [u8; 4] = parent[at + 4..at + 8].try_into().unwrap_or(*b"    ");
        let (header, size) = match size32 {
            // A 64-bit size follows the type.
            1 => (16, be_u64(parent, at + 8).ok_or_else(|| corrupt("an atom's size is cut"))?),
            // The atom runs to the end of its parent.
            0 => (8, (parent.len() - at) as u64),
            s => (8, u64::from(s)),
        };
        let end = usize::try_from(size).ok().and_then(|s| at.checked_add(s));
        let body = match end {
            Some(end) if size >= header as u64 && end <= parent.len() => &parent[at + header..end],
            _ => {
                return Err(Reject::TruncatedAudio(format!(
                    "MP4: the {} atom at byte {at} of {name} says {size} bytes, {} remain",
                    String::from_utf8_lossy(&kind),
                    parent.len() - at
                )))
            }
        };
        out.push((kind, body));
        at += body.len() + header;
    }
    Ok(out.into_iter())
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

fn corrupt(what: &str) -> Reject {
    Reject::CorruptAudio(format!("MP4: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn atom(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        v.extend_from_slice(kind);
        v.extend_from_slice(body);
        v
    }

    /// A version-0 full atom's body with `timescale` where mvhd and mdhd keep it.
    fn with_timescale(timescale: u32) -> Vec<u8> {
        let mut b = vec![0u8; 12];
        b.extend_from_slice(&timescale.to_be_bytes());
        b.extend_from_slice(&[0u8; 8]);
        b
    }

    fn movie(edits: &[(u32, i32)], track_timescale: u32) -> Vec<u8> {
        let mut elst = vec![0u8, 0, 0, 0];
        elst.extend_from_slice(&(edits.len() as u32).to_be_bytes());
        for &(d, t) in edits {
            elst.extend_from_slice(&d.to_be_bytes());
            elst.extend_from_slice(&t.to_be_bytes());
            elst.extend_from_slice(&(1u32 << 16).to_be_bytes());
        }
        let mut tkhd = vec![0u8; 12];
        tkhd.extend_from_slice(&7u32.to_be_bytes());
        let mut hdlr = vec![0u8; 8];
        hdlr.extend_from_slice(b"soun");
        let mdia = [atom(b"mdhd", &with_timescale(track_timescale)), atom(b"hdlr", &hdlr)].concat();
        let trak =
            [atom(b"tkhd", &tkhd), atom(b"edts", &atom(b"elst", &elst)), atom(b"mdia", &mdia)]
                .concat();
        let moov = [atom(b"mvhd", &with_timescale(1000)), atom(b"trak", &trak)].concat();
        [atom(b"ftyp", b"M4A \0\0\0\0"), atom(b"moov", &moov)].concat()
    }

    #[test]
    fn one_edit_trims_the_priming_and_the_padding() {
        // What ffmpeg's muxer writes for 0.3 s at 16 kHz: 300 ms from media time 1024.
        let (ts, tracks) = audio_tracks(&movie(&[(300, 1024)], 16000)).unwrap();
        assert_eq!((ts, tracks.len(), tracks[0].id), (1000, 1, 7));
        assert_eq!(
            trim(&tracks[0], ts, 16000).unwrap(),
            Trim { skip: 1024, keep: Some(4800), slack: 16 }
        );
        // A track timescale other than the rate: converted.
        let (ts, tracks) = audio_tracks(&movie(&[(300, 2048)], 32000)).unwrap();
        assert_eq!(
            trim(&tracks[0], ts, 16000).unwrap(),
            Trim { skip: 1024, keep: Some(4800), slack: 16 }
        );
    }

    #[test]
    fn empty_edits_are_skipped_and_pieces_refused() {
        let (ts, tracks) = audio_tracks(&movie(&[(50, -1), (300, 1024)], 16000)).unwrap();
        assert_eq!(
            trim(&tracks[0], ts, 16000).unwrap(),
            Trim { skip: 1024, keep: Some(4800), slack: 16 }
        );
        let (ts, tracks) = audio_tracks(&movie(&[], 16000)).unwrap();
        assert_eq!(trim(&tracks[0], ts, 16000).unwrap(), Trim { skip: 0, keep: None, slack: 0 });
        let (ts, tracks) = audio_tracks(&movie(&[(100, 1024), (100, 8000)], 16000)).unwrap();
        let r = trim(&tracks[0], ts, 16000).unwrap_err();
        assert!(matches!(&r, Reject::Unsupported(d) if d.contains("2 edits")), "{r:?}");
    }

    #[test]
    fn a_size_past_the_end_is_named() {
        let mut m = movie(&[(300, 1024)], 16000);
        m.truncate(m.len() - 5);
        let r = audio_tracks(&m).unwrap_err();
        assert!(matches!(&r, Reject::TruncatedAudio(d) if d.contains("moov")), "{r:?}");
    }
}
