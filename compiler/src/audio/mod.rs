//! Audio: decoding FLAC, WAV, MP3, Ogg Vorbis, Ogg Opus and AAC, cutting segments, and resampling
//! to the corpus rate.
//!
//! `decode` is the front door (codec sniffing, the FLAC decoder choice, downmix to mono); its
//! backends are `libflac` (the reference decoder, through its C API), `symphonia_flac` (pure
//! Rust), `wav`, `lossy` (MP3, Vorbis and AAC through symphonia, with `mp4` reading the edit
//! list symphonia does not apply) and `opus` (libopus, over the `ogg` page reader); `pcm` holds what they share (samples, rejects, MD5, the length check), so
//! the backends depend on it and never on the front door. `segment` cuts an offset and duration
//! out of a decoded recording.

pub mod decode;
// The C API's callbacks need `unsafe`; the module states each use's reason.
#[allow(unsafe_code)]
mod libflac;
mod lossy;
mod mp4;
mod ogg;
mod opus;
pub mod pcm;
pub mod resample;
pub mod segment;
mod symphonia_flac;
mod wav;
