//! FLAC decoding with libFLAC, the reference decoder (through `libflac-sys`, built from its
//! bundled libFLAC sources). The only module of the compiler that uses `unsafe`: the C API's
//! callbacks.
//!
//! libFLAC decodes every valid stream, of any bit depth from 4 to 32 and 1 to 8 channels, and
//! checks the decoded samples against the MD5 that STREAMINFO records. This module adds what the
//! library leaves to its caller (the `flac` command line does the same checks): every frame must
//! have the sample rate, channel count and bit depth STREAMINFO gives (`FormatChange` otherwise:
//! a stream that changes format mid-way is never kept in part), any error libFLAC reports while
//! decoding rejects the file (it would otherwise resynchronise and go on), and decoding stops
//! with `TooLong` once the stream holds more audio than a corpus utterance may, so that a small
//! file of constant frames cannot ask for unbounded memory.

use std::os::raw::{c_uint, c_void};
use std::ptr;

use libflac_sys as ffi;

use super::pcm::{check_length, Pcm, Reject};

/// The stream's format as STREAMINFO gives it.
#[derive(Debug, Clone, Copy)]
struct Format {
    rate: u32,
    channels: u32,
    bits: u32,
    total: u64,
    has_md5: bool,
}

/// What the callbacks share: the input, what was decoded, and the first problem seen.
struct State<'a> {
    input: &'a [u8],
    at: usize,
    format: Option<Format>,
    samples: Vec<i32>,
    /// Samples per channel decoded so far.
    frames: u64,
    /// Most samples per channel taken, from the stream's rate (set with the format).
    limit: u64,
    max_seconds: u64,
    problem: Option<Reject>,
}

/// Decodes a FLAC stream. `max_seconds` bounds the audio taken (more is `TooLong`);
/// `verify_md5` has libFLAC check the samples against STREAMINFO's MD5.
pub fn decode(bytes: &[u8], max_seconds: u64, verify_md5: bool) -> Result<Pcm, Reject> {
    let mut state = State {
        input: bytes,
        at: 0,
        format: None,
        samples: Vec::new(),
        frames: 0,
        limit: 0,
        max_seconds,
        problem: None,
    };
    let decoder = Decoder::new()?;
    // SAFETY: `decoder.0` is a live decoder (checked non-null in `Decoder::new`) in the
    // uninitialised state these setters require. `state` outlives every call that can reach
    // the callbacks: it is declared before `decoder`, the decoder is finished below before
    // `state` is read, and it is dropped (deleted) before `state` on every path.
    let (init, finished_ok, end_state) = unsafe {
        ffi::FLAC__stream_decoder_set_md5_checking(decoder.0, i32::from(verify_md5));
        let init = ffi::FLAC__stream_decoder_init_stream(
            decoder.0,
            Some(read),
            None,
            None,
            None,
            None,
            Some(write),
            Some(metadata),
            Some(error),
            ptr::addr_of_mut!(state).cast::<c_void>(),
        );
        if init != ffi::FLAC__STREAM_DECODER_INIT_STATUS_OK {
            (init, true, ffi::FLAC__STREAM_DECODER_UNINITIALIZED)
        } else {
            ffi::FLAC__stream_decoder_process_until_end_of_stream(decoder.0);
            let end_state = ffi::FLAC__stream_decoder_get_state(decoder.0);
            // `finish` is false when the MD5 check ran and failed.
            let ok = ffi::FLAC__stream_decoder_finish(decoder.0) != 0;
            (init, ok, end_state)
        }
    };
    drop(decoder);
    if init != ffi::FLAC__STREAM_DECODER_INIT_STATUS_OK {
        return Err(Reject::CorruptFlac(format!("libFLAC refused to start (init status {init})")));
    }
    if let Some(problem) = state.problem {
        return Err(problem);
    }
    let Some(format) = state.format else {
        return Err(Reject::CorruptFlac(
            "no STREAMINFO block: the stream's format and MD5 are unknown".into(),
        ));
    };
    if end_state != ffi::FLAC__STREAM_DECODER_END_OF_STREAM {
        return Err(Reject::CorruptFlac(format!(
            "libFLAC stopped before the end of the stream (decoder state {})",
            state_name(end_state)
        )));
    }
    // A stream cut short also fails its MD5: the length is checked first, to name the cause.
    check_length(state.frames, format.total)?;
    if !finished_ok {
        return Err(Reject::md5_mismatch());
    }
    if state.frames == 0 {
        return Err(Reject::NoSamples("the stream holds no samples".into()));
    }
    Ok(Pcm {
        samples: state.samples,
        rate: format.rate,
        channels: format.channels,
        bits: format.bits,
        md5_checked: format.has_md5 && verify_md5,
    })
}

/// Owns a libFLAC decoder; deletes it when dropped.
struct Decoder(*mut ffi::FLAC__StreamDecoder);

impl Decoder {
    fn new() -> Result<Decoder, Reject> {
        // SAFETY: no preconditions; null means out of memory, checked below.
        let d = unsafe { ffi::FLAC__stream_decoder_new() };
        if d.is_null() {
            return Err(Reject::CorruptFlac("libFLAC could not allocate a decoder".into()));
        }
        Ok(Decoder(d))
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `FLAC__stream_decoder_new` and is deleted once, here;
        // deleting finishes the decoder first if it is still initialised.
        unsafe { ffi::FLAC__stream_decoder_delete(self.0) }
    }
}

/// The `State` behind a callback's client data.
///
/// # Safety
/// `client` must be the pointer `decode` registered, whose `State` is alive and not otherwise
/// borrowed while libFLAC runs a callback (libFLAC calls them one at a time, on this thread).
unsafe fn state<'s>(client: *mut c_void) -> &'s mut State<'s> {
    // SAFETY: as the caller guarantees.
    unsafe { &mut *client.cast::<State<'s>>() }
}

unsafe extern "C" fn read(
    _decoder: *const ffi::FLAC__StreamDecoder,
    buffer: *mut ffi::FLAC__byte,
    bytes: *mut usize,
    client: *mut c_void,
) -> ffi::FLAC__StreamDecoderReadStatus {
    // SAFETY: `client` is `decode`'s state; libFLAC passes a buffer of `*bytes` bytes.
    let (s, wanted) = unsafe { (state(client), *bytes) };
    let rest = s.input.get(s.at..).unwrap_or_default();
    let n = wanted.min(rest.len());
    // SAFETY: `n` is at most the buffer's size and the input's remaining length; the buffer
    // is libFLAC's own and does not overlap the input.
    unsafe {
        ptr::copy_nonoverlapping(rest.as_ptr(), buffer, n);
        *bytes = n;
    }
    s.at += n;
    if n == 0 {
        ffi::FLAC__STREAM_DECODER_READ_STATUS_END_OF_STREAM
    } else {
        ffi::FLAC__STREAM_DECODER_READ_STATUS_CONTINUE
    }
}

unsafe extern "C" fn metadata(
    _decoder: *const ffi::FLAC__StreamDecoder,
    block: *const ffi::FLAC__StreamMetadata,
    client: *mut c_void,
) {
    // SAFETY: `client` is `decode`'s state; `block` is valid for this call.
    let (s, block) = unsafe { (state(client), &*block) };
    if block.type_ != ffi::FLAC__METADATA_TYPE_STREAMINFO || s.format.is_some() {
        return;
    }
    // SAFETY: the type says the union holds STREAMINFO.
    let info = unsafe { block.data.stream_info };
    s.format = Some(Format {
        rate: info.sample_rate,
        channels: info.channels,
        bits: info.bits_per_sample,
        total: info.total_samples,
        has_md5: info.md5sum.iter().any(|&b| b != 0),
    });
    s.limit = s.max_seconds.saturating_mul(u64::from(info.sample_rate));
}

unsafe extern "C" fn write(
    _decoder: *const ffi::FLAC__StreamDecoder,
    frame: *const ffi::FLAC__Frame,
    buffer: *const *const ffi::FLAC__int32,
    client: *mut c_void,
) -> ffi::FLAC__StreamDecoderWriteStatus {
    const ABORT: ffi::FLAC__StreamDecoderWriteStatus = ffi::FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
    // SAFETY: `client` is `decode`'s state; `frame` is valid for this call.
    let (s, header) = unsafe { (state(client), &(*frame).header) };
    let Some(f) = s.format else {
        s.problem = Some(Reject::CorruptFlac(
            "an audio frame before any STREAMINFO block: the stream's format is unknown".into(),
        ));
        return ABORT;
    };
    let at = s.frames;
    let change =
        |what: &str, frame: u32, stream: u32| Reject::format_change(what, frame, stream, at);
    if header.sample_rate != f.rate {
        s.problem = Some(change("sample rate (Hz)", header.sample_rate, f.rate));
        return ABORT;
    }
    if header.channels != f.channels {
        s.problem = Some(change("channel count", header.channels, f.channels));
        return ABORT;
    }
    if header.bits_per_sample != f.bits {
        s.problem = Some(change("bit depth", header.bits_per_sample, f.bits));
        return ABORT;
    }
    let (block, channels) = (header.blocksize as usize, f.channels as usize);
    s.frames += block as u64;
    if s.frames > s.limit {
        s.problem = Some(Reject::TooLong(format!(
            "more than {} s of audio (at sample {at}): longer than a corpus utterance may be",
            s.max_seconds
        )));
        return ABORT;
    }
    // The channels' planes, without an allocation per frame (FLAC has at most 8 channels, and
    // the count equals STREAMINFO's, which libFLAC has checked).
    let mut planes: [&[i32]; 8] = [&[]; 8];
    // SAFETY: libFLAC passes one pointer per channel of the frame (the count checked equal to
    // STREAMINFO's above), each to `blocksize` samples, valid for this call.
    unsafe {
        for (plane, &p) in planes.iter_mut().zip(std::slice::from_raw_parts(buffer, channels)) {
            *plane = std::slice::from_raw_parts(p, block);
        }
    }
    let planes = &planes[..channels.min(8)];
    s.samples.reserve(block * channels);
    for i in 0..block {
        s.samples.extend(planes.iter().map(|plane| plane[i]));
    }
    ffi::FLAC__STREAM_DECODER_WRITE_STATUS_CONTINUE
}

unsafe extern "C" fn error(
    _decoder: *const ffi::FLAC__StreamDecoder,
    status: ffi::FLAC__StreamDecoderErrorStatus,
    client: *mut c_void,
) {
    // SAFETY: `client` is `decode`'s state.
    let s = unsafe { state(client) };
    if s.problem.is_none() {
        let what = match status {
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_LOST_SYNC => {
                "lost sync (bytes that are not a frame)"
            }
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_BAD_HEADER => "a frame header is invalid",
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_FRAME_CRC_MISMATCH => {
                "a frame's CRC does not match"
            }
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_UNPARSEABLE_STREAM => {
                "the stream cannot be parsed"
            }
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_BAD_METADATA => "a metadata block is invalid",
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_OUT_OF_BOUNDS => "a residual is out of bounds",
            ffi::FLAC__STREAM_DECODER_ERROR_STATUS_MISSING_FRAME => "a frame is missing",
            _ => "an unknown decoding error",
        };
        s.problem = Some(Reject::CorruptFlac(format!(
            "{what} (libFLAC error {status}) after {} samples per channel, near byte {}",
            s.frames, s.at
        )));
    }
}

fn state_name(state: c_uint) -> &'static str {
    match state {
        ffi::FLAC__STREAM_DECODER_SEARCH_FOR_METADATA => "search for metadata",
        ffi::FLAC__STREAM_DECODER_READ_METADATA => "read metadata",
        ffi::FLAC__STREAM_DECODER_SEARCH_FOR_FRAME_SYNC => "search for frame sync",
        ffi::FLAC__STREAM_DECODER_READ_FRAME => "read frame",
        ffi::FLAC__STREAM_DECODER_END_OF_STREAM => "end of stream",
        ffi::FLAC__STREAM_DECODER_OGG_ERROR => "ogg error",
        ffi::FLAC__STREAM_DECODER_SEEK_ERROR => "seek error",
        ffi::FLAC__STREAM_DECODER_ABORTED => "aborted",
        ffi::FLAC__STREAM_DECODER_MEMORY_ALLOCATION_ERROR => "memory allocation error",
        ffi::FLAC__STREAM_DECODER_UNINITIALIZED => "uninitialised",
        _ => "unknown",
    }
}
