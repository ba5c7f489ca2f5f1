//! The data feed: the epoch plan (`sampler`), its report (`report`), the Python-compatible random
//! stream it draws from (`pyrandom`) and batch assembly (`batcher`).

pub mod pyrandom;
pub mod report;
pub mod sampler;
