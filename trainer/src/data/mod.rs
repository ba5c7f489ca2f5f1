//! The data feed: the training set of one or more corpora (`set`), the epoch plan (`sampler`),
//! its report (`report`), the Python-compatible random stream it draws from (`pyrandom`), the
//! padding policy (`shape`), batch assembly and prefetch (`batcher`), and synthetic inputs for
//! tests and benchmarks (`synthetic`).

pub mod batcher;
pub mod pyrandom;
pub mod report;
pub mod sampler;
pub mod set;
pub mod shape;
pub mod synthetic;
