//! `asrt`: reads corpus files, plans epochs (bucketed, temperature-balanced, exactly resumable)
//! and assembles padded batches ahead of the trainer.
#![forbid(unsafe_code)]

pub mod cli;
pub mod commands;
pub mod data;
pub mod eval;
pub mod model;
pub mod tdt;
pub mod train;
