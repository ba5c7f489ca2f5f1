//! Integration tests of the corpus format: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod common;
mod corrupt;
mod golden;
mod never_panics;
mod roundtrip;
mod spec_sync;
