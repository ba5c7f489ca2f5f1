//! Audio: FLAC decoding and resampling to the corpus rate.
//!
//! `decode` is the front door (format sniffing, the decoder choice, downmix to mono); its
//! backends are `libflac` (the reference decoder, through its C API) and `symphonia_flac`
//! (pure Rust); `pcm` holds what they share (samples, rejects, MD5, the length check), so
//! the backends depend on it and never on the front door.

pub mod decode;
// The C API's callbacks need `unsafe`; the module states each use's reason.
#[allow(unsafe_code)]
mod libflac;
pub mod pcm;
pub mod resample;
mod symphonia_flac;
