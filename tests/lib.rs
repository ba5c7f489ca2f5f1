//! End-to-end tests live in `e2e.rs`; this library is empty.
