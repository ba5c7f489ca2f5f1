//! FLAC decoding: any sample rate, 1 to 8 channels, 4 to 32 bits, downmixed to mono by the mean
//! of the channels.
//!
//! Two decoders: libFLAC, the reference decoder, by default ([`Decoder::Libflac`], module
//! `libflac`), and symphonia, in pure Rust ([`Decoder::Symphonia`]). Both return the stream's
//! integer samples ([`decode_pcm`]), which [`decode`] downmixes. A decoded stream is only kept
//! when nothing is known to be wrong with it: the samples match the MD5 that STREAMINFO records
//! (when the encoder recorded one), every frame has STREAMINFO's format, no frame was damaged,
//! and the stream holds the samples its header announces.
//!
//! A file that is not usable is a [`Reject`], not an error: the compiler counts it, reports it
//! with its reason and detail, and goes on. Corrupt frames are rejects too (the file is dropped,
//! not patched with silence), and so is a stream that ends before the sample count its header
//! announces.

use std::io::Cursor;
use std::path::Path;

use md5::{Digest, Md5};
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use super::libflac;
pub use super::libflac::Pcm;
use crate::reason::Reason;

/// Most audio taken from one file, in seconds: a corpus utterance holds at most 10 minutes
/// (SPEC.md section 7); a second more lets the format limit, not the decoder, name the reject.
pub const MAX_SECONDS: u64 = 601;

/// Which FLAC decoder `asrc` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Decoder {
    /// libFLAC, the reference decoder: every valid stream, MD5 checked (the default).
    #[default]
    Libflac,
    /// symphonia, pure Rust: 1 to 8 channels, up to 24 bits, MD5 checked here; rejects 32-bit
    /// streams and fails some valid ones (see README, "Audio").
    Symphonia,
}

impl Decoder {
    /// The decoder's name, as the command line and the report spell it.
    pub fn name(self) -> &'static str {
        match self {
            Decoder::Libflac => "libflac",
            Decoder::Symphonia => "symphonia",
        }
    }
}

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
    /// A valid FLAC this compiler does not take (a bit depth the chosen decoder cannot read).
    Unsupported(String),
    /// The sample rate, channel count or bit depth changes between frames.
    FormatChange(String),
    /// More audio than a corpus utterance may hold.
    TooLong(String),
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
            | Reject::Unsupported(d)
            | Reject::FormatChange(d)
            | Reject::TooLong(d) => d,
        }
    }

    /// A frame whose `what` (rate, channel count, bit depth) is `frame` where STREAMINFO says
    /// `stream`, at sample `at` (either decoder).
    pub(crate) fn format_change(
        what: &str,
        frame: u32,
        stream: u32,
        at: impl std::fmt::Display,
    ) -> Reject {
        Reject::FormatChange(format!(
            "the {what} changes mid-stream: {frame} in the frame at sample {at}, {stream} in \
             STREAMINFO; the file holds more than one format and is not kept in part"
        ))
    }

    /// The decoded samples do not match STREAMINFO's MD5 (either decoder).
    pub(crate) fn md5_mismatch() -> Reject {
        Reject::CorruptFlac(
            "the decoded samples do not match the MD5 that STREAMINFO records".into(),
        )
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
            Reject::FormatChange(_) => Reason::FormatChange,
            Reject::TooLong(_) => Reason::Unstorable,
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

impl Decoded {
    /// `pcm` downmixed to mono.
    fn from_pcm(pcm: &Pcm) -> Decoded {
        Decoded { samples: downmix(pcm), rate: pcm.rate, channels: pcm.channels, bits: pcm.bits }
    }
}

/// Checks the samples per channel decoded against the count STREAMINFO announces (0: unknown),
/// for either decoder: fewer is a truncation, more is not kept either (`flac -d` stops at the
/// announced count; which part is right is not known).
pub(crate) fn check_length(frames: u64, announced: u64) -> Result<(), Reject> {
    if announced != 0 && frames < announced {
        return Err(Reject::TruncatedFlac(format!(
            "decoded {frames} of the {announced} samples per channel the header announces"
        )));
    }
    if announced != 0 && frames > announced {
        return Err(Reject::CorruptFlac(format!(
            "the stream holds {frames} samples per channel, more than the {announced} its header \
             announces"
        )));
    }
    Ok(())
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

/// Reads and decodes the FLAC file at `path` with libFLAC.
pub fn decode_file(path: &Path) -> Result<Decoded, Reject> {
    decode_file_with(path, Decoder::default(), true)
}

/// Reads and decodes the FLAC file at `path` with `decoder`, checking STREAMINFO's MD5 when
/// `verify_md5` (and the stream records one).
pub fn decode_file_with(
    path: &Path,
    decoder: Decoder,
    verify_md5: bool,
) -> Result<Decoded, Reject> {
    let pcm = decode_pcm_with(read_file(path)?, decoder, verify_md5)?;
    Ok(Decoded::from_pcm(&pcm))
}

/// The bytes of the file at `path`, or a `MissingFile` reject naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>, Reject> {
    std::fs::read(path).map_err(|e| Reject::MissingFile(format!("{}: {e}", path.display())))
}

/// Decodes FLAC bytes with libFLAC, downmixed to mono.
pub fn decode(bytes: Vec<u8>) -> Result<Decoded, Reject> {
    decode_with(bytes, Decoder::default())
}

/// Decodes FLAC bytes with `decoder`, downmixed to mono.
pub fn decode_with(bytes: Vec<u8>, decoder: Decoder) -> Result<Decoded, Reject> {
    Ok(Decoded::from_pcm(&decode_pcm(bytes, decoder)?))
}

/// Decodes FLAC bytes to the stream's interleaved integer samples, before any downmix: what
/// `flac -d` writes and what STREAMINFO's MD5 covers (checked).
pub fn decode_pcm(bytes: Vec<u8>, decoder: Decoder) -> Result<Pcm, Reject> {
    decode_pcm_with(bytes, decoder, true)
}

/// [`decode_pcm`], checking STREAMINFO's MD5 only when `verify_md5`: the check is about a third
/// of the decoding time (bench/RESULTS.md); without it a damaged file is still caught by the
/// frames' CRCs, but not a wrong decode.
pub fn decode_pcm_with(
    mut bytes: Vec<u8>,
    decoder: Decoder,
    verify_md5: bool,
) -> Result<Pcm, Reject> {
    let kind = sniff(&bytes);
    if kind != "flac" {
        let head: String =
            bytes.iter().take(4).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
        return Err(Reject::NotFlac(format!(
            "{kind} data (first bytes {head}), expected a FLAC stream"
        )));
    }
    match decoder {
        Decoder::Libflac => libflac::decode(&bytes, MAX_SECONDS, verify_md5),
        Decoder::Symphonia => {
            let md5 = streaminfo_md5(&bytes).filter(|_| verify_md5);
            // symphonia ends a stream quietly at a frame it cannot follow (a change of format,
            // for one): only the announced length or the MD5 shows that something is missing.
            if md5.is_none() && streaminfo_total(&bytes).unwrap_or(0) == 0 {
                return Err(Reject::Unsupported(
                    "STREAMINFO records neither the stream's length nor its MD5, so the \
                     symphonia decoder's output cannot be checked (the default decoder, libFLAC, \
                     checks every frame)"
                        .into(),
                ));
            }
            normalize_streaminfo(&mut bytes);
            let mut pcm = decode_symphonia(bytes)?;
            pcm.md5_checked = md5.is_some();
            if md5.is_some_and(|expected| md5_of(&pcm) != expected) {
                return Err(Reject::md5_mismatch());
            }
            Ok(pcm)
        }
    }
}

/// The mean of the channels, scaled to [-1, 1) by the bit depth (in f64, so that a 32-bit or
/// 8-channel sum loses nothing before the one rounding to f32).
pub fn downmix(pcm: &Pcm) -> Vec<f32> {
    let channels = pcm.channels.max(1) as usize;
    let scale = 1.0 / (f64::from(1u32 << (pcm.bits.clamp(1, 32) - 1)) * channels as f64);
    if channels == 1 {
        return pcm.samples.iter().map(|&v| (f64::from(v) * scale) as f32).collect();
    }
    pcm.samples
        .chunks_exact(channels)
        .map(|frame| (frame.iter().map(|&v| f64::from(v)).sum::<f64>() * scale) as f32)
        .collect()
}

/// The 34-byte STREAMINFO body when the stream starts with a STREAMINFO block ("fLaC", then a
/// block header of type 0).
fn streaminfo(bytes: &[u8]) -> Option<&[u8]> {
    (bytes.get(4).map(|b| b & 0x7f) == Some(0)).then(|| bytes.get(8..8 + 34)).flatten()
}

/// STREAMINFO's MD5 (the body's last 16 bytes) when it records one.
fn streaminfo_md5(bytes: &[u8]) -> Option<[u8; 16]> {
    let md5: [u8; 16] = streaminfo(bytes)?[18..34].try_into().ok()?;
    md5.iter().any(|&b| b != 0).then_some(md5)
}

/// STREAMINFO's total sample count (0: unknown): the low 4 bits of body byte 13, then bytes
/// 14-17, 36 bits.
fn streaminfo_total(bytes: &[u8]) -> Option<u64> {
    let t = &streaminfo(bytes)?[13..18];
    Some(t[1..].iter().fold(u64::from(t[0] & 0x0f), |acc, &b| acc << 8 | u64::from(b)))
}

/// The MD5 of the samples as FLAC defines it: each sample little-endian in (bits + 7) / 8 bytes,
/// interleaved.
pub fn md5_of(pcm: &Pcm) -> [u8; 16] {
    let width = pcm.bits.div_ceil(8).clamp(1, 4) as usize;
    let mut hasher = Md5::new();
    let mut buf = Vec::with_capacity(4096 * width);
    for chunk in pcm.samples.chunks(4096) {
        buf.clear();
        for &v in chunk {
            buf.extend_from_slice(&v.to_le_bytes()[..width]);
        }
        hasher.update(&buf);
    }
    hasher.finalize().into()
}

/// symphonia's decode of a stream `sniff` called FLAC.
fn decode_symphonia(bytes: Vec<u8>) -> Result<Pcm, Reject> {
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
    if !(1..=8).contains(&channels) {
        return Err(Reject::CorruptFlac(format!("{channels} channels, FLAC allows 1 to 8")));
    }
    if !(4..=24).contains(&bits) {
        return Err(Reject::Unsupported(format!(
            "{bits} bits per sample: the symphonia decoder reads 4 to 24 (use the default decoder, \
             libFLAC)"
        )));
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| corrupt("creating the decoder", e))?;

    // The header's sample count, when it has one, sizes the buffer once (bounded so that a
    // corrupt header cannot ask for gigabytes).
    let expected = announced.unwrap_or(0).min(1 << 26) as usize * channels as usize;
    let mut interleaved: Vec<i32> = Vec::with_capacity(expected);
    let limit = MAX_SECONDS.saturating_mul(u64::from(rate)).saturating_mul(u64::from(channels));
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
        check_frame_format(&packet.data, rate, channels, bits, ts)?;
        let buf = decoder.decode(&packet).map_err(|e| corrupt("decoding a frame", e))?;
        let at = interleaved.len();
        interleaved.resize(at + buf.samples_interleaved(), 0);
        // symphonia scales every sample to the full i32 range; shift back to the stream's depth.
        buf.copy_to_slice_interleaved(&mut interleaved[at..]);
        for v in &mut interleaved[at..] {
            *v >>= 32 - bits;
        }
        if interleaved.len() as u64 > limit {
            return Err(Reject::TooLong(format!(
                "more than {MAX_SECONDS} s of audio: longer than a corpus utterance may be"
            )));
        }
    }
    let frames = interleaved.len() / channels as usize;
    if let Some((want, got)) = skipped {
        return Err(Reject::CorruptFlac(format!(
            "damaged frames skipped: the stream jumps from sample {want} to sample {got}"
        )));
    }
    check_length(frames as u64, announced.unwrap_or(0))?;
    if frames == 0 {
        return Err(Reject::NoSamples("the stream holds no samples".into()));
    }
    Ok(Pcm { samples: interleaved, rate, channels, bits, md5_checked: false })
}

/// Checks a frame's header (the first bytes of a symphonia packet) against STREAMINFO's format:
/// symphonia decodes a frame of another rate, bit depth or channel count with the stream's, so
/// a stream that changes format mid-way would be kept wrong. Header codes per RFC 9639 section
/// 9.1; a code that defers to STREAMINFO, or a header too short to read, is left to the decoder.
fn check_frame_format(
    frame: &[u8],
    rate: u32,
    channels: u32,
    bits: u32,
    at: i64,
) -> Result<(), Reject> {
    let change =
        |what: &str, frame: u32, stream: u32| Reject::format_change(what, frame, stream, at);
    let (Some(&b2), Some(&b3)) = (frame.get(2), frame.get(3)) else { return Ok(()) };
    let frame_channels = match b3 >> 4 {
        n @ 0..=7 => u32::from(n) + 1,
        8..=10 => 2,
        _ => return Ok(()), // reserved: the decoder rejects it
    };
    if frame_channels != channels {
        return Err(change("channel count", frame_channels, channels));
    }
    let frame_bits = match (b3 >> 1) & 7 {
        1 => 8,
        2 => 12,
        4 => 16,
        5 => 20,
        6 => 24,
        7 => 32,
        _ => bits, // 0: from STREAMINFO; 3: reserved
    };
    if frame_bits != bits {
        return Err(change("bit depth", frame_bits, bits));
    }
    // The rate: a table code, or a value stored after the coded frame number and block size.
    let code = b2 & 0x0f;
    let frame_rate = match code {
        1 => 88_200,
        2 => 176_400,
        3 => 192_000,
        4 => 8_000,
        5 => 16_000,
        6 => 22_050,
        7 => 24_000,
        8 => 32_000,
        9 => 44_100,
        10 => 48_000,
        11 => 96_000,
        12..=14 => {
            // The coded number is 1 byte, or as many bytes as its first byte's leading ones.
            let Some(&first) = frame.get(4) else { return Ok(()) };
            let number_len = match first.leading_ones() {
                0 => 1,
                n @ 2..=7 => n as usize,
                _ => return Ok(()),
            };
            let block_extra = match b2 >> 4 {
                6 => 1,
                7 => 2,
                _ => 0,
            };
            let at = 4 + number_len + block_extra;
            let byte = |i: usize| frame.get(at + i).map(|&b| u32::from(b));
            let value = match code {
                12 => byte(0).map(|k| k * 1000),
                13 => byte(0).zip(byte(1)).map(|(h, l)| h << 8 | l),
                _ => byte(0).zip(byte(1)).map(|(h, l)| (h << 8 | l) * 10),
            };
            match value {
                Some(v) => v,
                None => return Ok(()),
            }
        }
        _ => rate, // 0: from STREAMINFO; 15: invalid, the decoder rejects it
    };
    if frame_rate != rate {
        return Err(change("sample rate (Hz)", frame_rate, rate));
    }
    Ok(())
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
