//! MP3, Ogg Vorbis and AAC (in MP4/M4A or ADTS) through symphonia (pure Rust), decoded to float,
//! with the encoder's delay and padding removed where the stream records them (LAME's Xing/Info
//! tag; Vorbis's granule positions; MP4's edit list, applied here by `mp4`).
//!
//! A packet that fails to decode rejects the file (`corrupt_audio`): players conceal a damaged
//! frame with silence, a training corpus should not.

use std::io::Cursor;

use symphonia::core::codecs::audio::{well_known, AudioDecoderOptions};
use symphonia::core::errors::Error;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use super::mp4;
use super::pcm::{Codec, Reject, StreamSamples};

/// A decoded MP3, Vorbis or AAC stream.
pub(crate) struct Lossy {
    pub(crate) rate: u32,
    pub(crate) channels: u32,
    pub(crate) samples: StreamSamples,
}

/// Decodes `bytes` as `codec` (MP3, Vorbis or AAC); `max_seconds` bounds the audio taken.
pub(crate) fn decode(bytes: Vec<u8>, codec: Codec, max_seconds: u64) -> Result<Lossy, Reject> {
    // AAC comes in an MP4 file (told by its `ftyp` atom) or as bare ADTS frames.
    let is_mp4 = bytes.get(4..8) == Some(b"ftyp".as_slice());
    let (name, extension) = match codec {
        Codec::Mp3 => ("MP3", "mp3"),
        Codec::Aac if is_mp4 => ("MP4", "m4a"),
        Codec::Aac => ("ADTS AAC", "aac"),
        _ => ("Ogg Vorbis", "ogg"),
    };
    // Read before symphonia takes the bytes: its reader does not apply the edit list.
    let mp4_tracks = if is_mp4 { Some(mp4::audio_tracks(&bytes)?) } else { None };
    let corrupt = |what: &str, e: Error| Reject::CorruptAudio(format!("{name}: {what}: {e}"));
    let mut hint = Hint::new();
    hint.with_extension(extension);
    let mss = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    let mut format = symphonia::default::get_probe()
        .probe(&hint, mss, FormatOptions::default(), MetadataOptions::default())
        .map_err(|e| match e {
            Error::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                Reject::TruncatedAudio(format!("{name}: the file ends before the first frame"))
            }
            // The bytes were sniffed as this codec: no reader taking them means damage.
            e => corrupt("no frame could be read where the header announces the codec", e),
        })?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| Reject::CorruptAudio(format!("{name}: no audio track")))?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| Reject::UnsupportedCodec(format!("{name}: no audio codec parameters")))?
        .clone();
    // An MP4 may hold other codecs (Apple Lossless, MP3, Opus, AC-3); one the compiled decoders
    // could read would otherwise be decoded under AAC's name.
    if codec == Codec::Aac && params.codec != well_known::CODEC_ID_AAC {
        let held = match params.codec {
            well_known::CODEC_ID_ALAC => "Apple Lossless (ALAC)".to_owned(),
            well_known::CODEC_ID_MP3 => "MP3".to_owned(),
            well_known::CODEC_ID_OPUS => "Opus".to_owned(),
            well_known::CODEC_ID_FLAC => "FLAC".to_owned(),
            well_known::CODEC_ID_AC3 | well_known::CODEC_ID_EAC3 => "AC-3".to_owned(),
            other => format!("symphonia's codec {other}"),
        };
        return Err(Reject::UnsupportedCodec(format!(
            "{name}: the audio track holds {held}, not AAC; asrc reads AAC-LC in MP4"
        )));
    }
    let rate = params
        .sample_rate
        .ok_or_else(|| Reject::CorruptAudio(format!("{name}: no sample rate")))?;
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| match e {
            Error::Unsupported(what) => Reject::UnsupportedCodec(format!("{name}: {what}")),
            e => corrupt("creating the decoder", e),
        })?;
    let mut channels = params.channels.as_ref().map_or(0, |c| c.count() as u32);
    let mut out: Vec<f32> = Vec::new();
    let mut frame_buf: Vec<f32> = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(Error::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(corrupt("reading a packet", e)),
        };
        if packet.track_id != track_id {
            continue;
        }
        let (valid, trim_start, trim_end) =
            (packet.dur.get(), packet.trim_start.get(), packet.trim_end.get());
        let buf = decoder.decode(&packet).map_err(|e| corrupt("decoding a packet", e))?;
        let ch = buf.spec().channels().count();
        if channels == 0 {
            channels = ch as u32;
        }
        if ch as u32 != channels || ch == 0 {
            return Err(Reject::FormatChange(format!(
                "{name}: the channel count changes from {channels} to {ch} mid-stream"
            )));
        }
        let limit = max_seconds.saturating_mul(u64::from(rate)).saturating_mul(u64::from(channels));
        frame_buf.resize(buf.samples_interleaved(), 0.0);
        buf.copy_to_slice_interleaved(&mut frame_buf[..]);
        let frames = buf.frames() as u64;
        // Whether the decoder trimmed the delay and padding itself: then it returns only the
        // valid frames; otherwise the packet's trims are applied here.
        let (skip, take) = if frames == valid + trim_start + trim_end && frames != valid {
            (trim_start, valid)
        } else {
            (0, frames)
        };
        let (skip, take) = (skip as usize * ch, take as usize * ch);
        out.extend_from_slice(&frame_buf[skip..skip + take]);
        if out.len() as u64 > limit {
            return Err(Reject::TooLong(format!("{name}: more than {max_seconds} s of audio")));
        }
    }
    if channels == 0 {
        return Err(Reject::NoSamples(format!("{name}: no audio packets")));
    }
    if let Some((movie_timescale, tracks)) = &mp4_tracks {
        let track = tracks.iter().find(|t| t.id == track_id).ok_or_else(|| {
            Reject::CorruptAudio(format!("{name}: track {track_id} has no audio handler"))
        })?;
        // HE-AAC's core decodes at half the stream's rate, and the track's timescale is then
        // the stream's rate: symphonia's decoder has no SBR, and would give the core band only.
        if u64::from(track.timescale) == 2 * u64::from(rate) {
            return Err(Reject::UnsupportedCodec(format!(
                "{name}: HE-AAC (SBR; core rate {rate} Hz, track timescale {} Hz); asrc's AAC \
                 decoder reads AAC-LC",
                track.timescale
            )));
        }
        out = apply_trim(out, mp4::trim(track, *movie_timescale, rate)?, channels, name)?;
    }
    let samples = StreamSamples::F32(out);
    if !samples.all_finite() {
        return Err(Reject::CorruptAudio(format!("{name}: a decoded sample is not finite")));
    }
    Ok(Lossy { rate, channels, samples })
}

/// `out` (interleaved, `channels`) cut to the samples the edit list names. An edit that names
/// more than the track decodes to is a cut file, unless the excess is the movie timescale's
/// rounding (the duration is often in milliseconds).
fn apply_trim(
    mut out: Vec<f32>,
    trim: mp4::Trim,
    channels: u32,
    name: &str,
) -> Result<Vec<f32>, Reject> {
    let ch = channels as usize;
    let frames = (out.len() / ch) as u64;
    let skip = trim.skip.min(frames);
    let keep = match trim.keep {
        None => frames - skip,
        Some(keep) if keep <= frames - skip => keep,
        Some(keep) if keep - (frames - skip) <= trim.slack => frames - skip,
        Some(keep) => {
            return Err(Reject::TruncatedAudio(format!(
                "{name}: the edit list names {keep} samples from sample {}, the track decodes \
                 to {frames}",
                trim.skip
            )))
        }
    };
    out.truncate((skip + keep) as usize * ch);
    out.drain(..skip as usize * ch);
    Ok(out)
}
