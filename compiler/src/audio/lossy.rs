//! MP3 and Ogg Vorbis through symphonia (pure Rust), decoded to float, with the encoder's delay
//! and padding removed where the stream records them (LAME's Xing/Info tag; Vorbis's granule
//! positions), as ffmpeg does.
//!
//! A packet that fails to decode rejects the file (`corrupt_audio`): players conceal a damaged
//! frame with silence, a training corpus should not.

use std::io::Cursor;

use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use super::pcm::{Codec, Reject, StreamSamples};

/// A decoded MP3 or Vorbis stream.
pub(crate) struct Lossy {
    pub(crate) rate: u32,
    pub(crate) channels: u32,
    pub(crate) samples: StreamSamples,
}

/// Decodes `bytes` as `codec` (MP3 or Vorbis); `max_seconds` bounds the audio taken.
pub(crate) fn decode(bytes: Vec<u8>, codec: Codec, max_seconds: u64) -> Result<Lossy, Reject> {
    let name = match codec {
        Codec::Mp3 => "MP3",
        _ => "Ogg Vorbis",
    };
    let corrupt = |what: &str, e: Error| Reject::CorruptAudio(format!("{name}: {what}: {e}"));
    let mut hint = Hint::new();
    hint.with_extension(if codec == Codec::Mp3 { "mp3" } else { "ogg" });
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
    let samples = StreamSamples::F32(out);
    if !samples.all_finite() {
        return Err(Reject::CorruptAudio(format!("{name}: a decoded sample is not finite")));
    }
    Ok(Lossy { rate, channels, samples })
}
