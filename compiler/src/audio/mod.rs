//! Audio: FLAC decoding (libFLAC or symphonia) and resampling to the corpus rate.

pub mod decode;
// The C API's callbacks need `unsafe`; the module states each use's reason.
#[allow(unsafe_code)]
mod libflac;
pub mod resample;
