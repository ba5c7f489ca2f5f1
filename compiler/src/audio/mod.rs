//! Audio: decoding FLAC, WAV, MP3, Ogg Vorbis and Ogg Opus, cutting segments, and resampling
//! to the corpus rate.
//!
//! `decode` is the front door (codec sniffing, the FLAC decoder choice, downmix to mono); its
//! backends are `libflac` (the reference decoder, through its C API), `symphonia_flac` (pure
//! Rust), `wav`, `lossy` (MP3 and Vorbis through symphonia) and `opus` (libopus, over the
//! `ogg` page reader); `pcm` holds what they share (samples, rejects, MD5, the length check), so
//! the backends depend on it and never on the front door. `segment` cuts an offset and duration
//! out of a decoded recording.

pub mod decode;
// The C API's callbacks need `unsafe`; the module states each use's reason.
#[allow(unsafe_code)]
mod libflac;
mod lossy;
mod ogg;
mod opus;
pub mod pcm;
pub mod resample;
pub mod segment;
mod symphonia_flac;
mod wav;
