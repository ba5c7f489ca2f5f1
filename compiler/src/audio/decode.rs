//! FLAC decoding with symphonia: any sample rate, 1 or 2 channels, 16 or 24 bits, downmixed to
//! mono by averaging the channels.
//!
//! A file that is not usable is a [`Reject`], not an error: the compiler counts it, reports it
//! with its reason and detail, and goes on. Corrupt frames are rejects too (the file is dropped,
//! not patched with silence), and so is a stream that ends before the sample count its header
//! announces.

use std::io::Cursor;
use std::path::Path;

use symphonia::core::audio::sample::Sample as _;
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::reason::Reason;

/// Why an audio file was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// The file does not exist or cannot be read.
    MissingFile(String),
    /// The bytes are another format (`wav`, `ogg`, `mp3`, `mp4`) or none recognised.
    NotFlac(String),
    /// The FLAC stream is damaged: a frame fails to decode or the headers are invalid.
    CorruptFlac(String),
    /// The stream ends before the sample count its header announces.
    TruncatedFlac(String),
    /// The stream decodes to no samples.
    NoSamples(String),
    /// A valid FLAC this compiler does not take (more than 2 channels).
    Unsupported(String),
}

impl Reject {
    /// What exactly is wrong, for the report.
    pub fn detail(&self) -> &str {
        match self {
            Reject::MissingFile(d)
            | Reject::NotFlac(d)
            | Reject::CorruptFlac(d)
            | Reject::TruncatedFlac(d)
            | Reject::NoSamples(d)
            | Reject::Unsupported(d) => d,
        }
    }

    /// The reason's name, as the report counts it.
    pub fn reason(&self) -> Reason {
        match self {
            Reject::MissingFile(_) => Reason::MissingFile,
            Reject::NotFlac(_) => Reason::NotFlac,
            Reject::CorruptFlac(_) => Reason::CorruptFlac,
            Reject::TruncatedFlac(_) => Reason::TruncatedFlac,
            Reject::NoSamples(_) => Reason::NoSamples,
            Reject::Unsupported(_) => Reason::UnsupportedAudio,
        }
    }
}

/// Decoded audio, downmixed to mono.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Mono samples in [-1, 1).
    pub samples: Vec<f32>,
    /// Sample rate of the file.
    pub rate: u32,
    /// Channels of the file.
    pub channels: u32,
    /// Bits per sample of the file.
    pub bits: u32,
}

/// The container a file's first bytes announce.
fn sniff(bytes: &[u8]) -> &'static str {
    let at = |o: usize, m: &[u8]| bytes.get(o..o + m.len()) == Some(m);
    if at(0, b"fLaC") {
        "flac"
    } else if at(0, b"RIFF") && at(8, b"WAVE") {
        "wav"
    } else if at(0, b"OggS") {
        "ogg"
    } else if at(0, b"ID3") {
        // FLAC with a leading ID3v2 tag exists in the wild: look behind the tag.
        let size = bytes
            .get(6..10)
            .map_or(0, |s| s.iter().fold(0usize, |acc, &b| (acc << 7) | usize::from(b & 0x7f)));
        if bytes.get(10 + size..14 + size) == Some(b"fLaC") {
            "flac"
        } else {
            "mp3"
        }
    } else if at(4, b"ftyp") {
        "mp4"
    } else if bytes.len() >= 2 && bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0 {
        "mp3"
    } else {
        "unknown"
    }
}

/// Reads and decodes the FLAC file at `path`.
pub fn decode_file(path: &Path) -> Result<Decoded, Reject> {
    let bytes =
        std::fs::read(path).map_err(|e| Reject::MissingFile(format!("{}: {e}", path.display())))?;
    decode(bytes)
}

/// Decodes FLAC bytes.
pub fn decode(mut bytes: Vec<u8>) -> Result<Decoded, Reject> {
    let kind = sniff(&bytes);
    if kind != "flac" {
        let head: String =
            bytes.iter().take(4).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        return Err(Reject::NotFlac(format!(
            "{kind} data (first bytes {head}), expected a FLAC stream"
        )));
    }
    normalize_streaminfo(&mut bytes);
    let corrupt = |what: &str, e: Error| Reject::CorruptFlac(format!("{what}: {e}"));
    let mss = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut format = symphonia::default::get_probe()
        .probe(&Hint::new(), mss, FormatOptions::default(), MetadataOptions::default())
        .map_err(|e| match e {
            Error::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                Reject::TruncatedFlac(
                    "the file ends in or right after the stream header, before any audio frame"
                        .into(),
                )
            }
            e => corrupt("reading the stream header", e),
        })?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| Reject::CorruptFlac("no audio track".into()))?;
    let (track_id, announced) = (track.id, track.num_frames);
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| Reject::CorruptFlac("no audio codec parameters".into()))?
        .clone();
    let rate = params.sample_rate.ok_or_else(|| Reject::CorruptFlac("no sample rate".into()))?;
    let channels = params.channels.as_ref().map_or(0, |c| c.count() as u32);
    let bits = params.bits_per_sample.unwrap_or(0);
    if !(1..=2).contains(&channels) {
        return Err(Reject::Unsupported(format!("{channels} channels, expected 1 or 2")));
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| corrupt("creating the decoder", e))?;

    // The header's sample count, when it has one, sizes the buffer once (bounded so that a
    // corrupt header cannot ask for gigabytes).
    let expected = announced.unwrap_or(0).min(1 << 26) as usize * channels as usize;
    let mut interleaved: Vec<f32> = Vec::with_capacity(expected);
    // The demuxer skips a frame it cannot parse and resynchronises on the next one; a jump in
    // the packets' timestamps is how that shows, and it means corruption, not truncation.
    let mut next_ts: i64 = 0;
    let mut skipped: Option<(i64, i64)> = None;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(corrupt("reading a frame", e)),
        };
        if packet.track_id != track_id {
            continue;
        }
        let ts = packet.pts.get();
        if ts != next_ts && skipped.is_none() {
            skipped = Some((next_ts, ts));
        }
        next_ts = ts.saturating_add(i64::try_from(packet.dur.get()).unwrap_or(i64::MAX));
        let buf = decoder.decode(&packet).map_err(|e| corrupt("decoding a frame", e))?;
        let at = interleaved.len();
        interleaved.resize(at + buf.samples_interleaved(), f32::MID);
        buf.copy_to_slice_interleaved(&mut interleaved[at..]);
    }
    let frames = interleaved.len() / channels as usize;
    if let Some((want, got)) = skipped {
        return Err(Reject::CorruptFlac(format!(
            "damaged frames skipped: the stream jumps from sample {want} to sample {got}"
        )));
    }
    if let Some(n) = announced {
        if (frames as u64) < n {
            return Err(Reject::TruncatedFlac(format!(
                "decoded {frames} of the {n} samples per channel the header announces"
            )));
        }
    }
    if frames == 0 {
        return Err(Reject::NoSamples("the stream holds no samples".into()));
    }
    let samples = if channels == 1 {
        interleaved
    } else {
        interleaved.chunks_exact(2).map(|c| (c[0] + c[1]) * 0.5).collect()
    };
    Ok(Decoded { samples, rate, channels, bits })
}

/// Works around a reader limitation: symphonia 0.6 fails with "unexpected end of file" on a
/// fixed-block-size stream whose STREAMINFO gives a minimum block size below the maximum, which
/// encoders that count the short last block write (the FLAC specification excludes the last
/// block from the minimum; `flac -t` accepts such files). For a fixed-block-size stream the
/// minimum carries no information the decoder needs, so it is set to the maximum in the
/// in-memory copy. Variable-block-size streams and anything unexpected are left alone.
fn normalize_streaminfo(bytes: &mut [u8]) {
    // "fLaC", then metadata blocks: 1 byte (last flag, type), 3 bytes length, body.
    let mut at = 4usize;
    let Some(&[t, ..]) = bytes.get(at..at + 4) else { return };
    if t & 0x7f != 0 {
        return; // the first block must be STREAMINFO
    }
    let streaminfo = at + 4;
    loop {
        let Some(h) = bytes.get(at..at + 4) else { return };
        let last = h[0] & 0x80 != 0;
        let len = usize::from(h[1]) << 16 | usize::from(h[2]) << 8 | usize::from(h[3]);
        at += 4 + len;
        if last {
            break;
        }
    }
    // First frame header: sync 0xFFF8 for fixed block size, 0xFFF9 for variable.
    let fixed = bytes.get(at..at + 2) == Some(&[0xFF, 0xF8]);
    if let Some(si) = bytes.get_mut(streaminfo..streaminfo + 4) {
        let (min, max) = (u16::from_be_bytes([si[0], si[1]]), u16::from_be_bytes([si[2], si[3]]));
        if fixed && min < max {
            si.copy_within(2..4, 0);
        }
    }
}

/// Mono f32 in [-1, 1) to 16-bit PCM: scaled by 32768, rounded, clamped. 16-bit sources come
/// back unchanged.
pub fn to_i16(samples: &[f32]) -> Vec<i16> {
    samples
        .iter()
        .map(|&x| {
            // Round half away from zero without a libm call: in f64 the sum is exact, so
            // truncation rounds exactly as `f32::round` would.
            let v = f64::from(x) * 32768.0;
            (v + 0.5f64.copysign(v)).clamp(-32768.0, 32767.0) as i16
        })
        .collect()
}
