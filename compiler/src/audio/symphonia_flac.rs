//! FLAC through symphonia, in pure Rust ([`super::decode::Decoder::Symphonia`]): the checks
//! libFLAC does itself, done here (STREAMINFO's MD5, every frame header against STREAMINFO,
//! the announced length), and the STREAMINFO fields symphonia would misread, normalised first.

use std::io::Cursor;

use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use super::pcm::{check_length, md5_of, Pcm, Reject, MAX_SECONDS};

/// Decodes a stream `sniff` called FLAC, checking STREAMINFO's MD5 when `verify_md5`.
pub(crate) fn decode(mut bytes: Vec<u8>, verify_md5: bool) -> Result<Pcm, Reject> {
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
