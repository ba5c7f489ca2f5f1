//! Integration tests of the TDT loss and greedy decoding: one binary, one module per concern.

// Test helpers outside #[test] functions may unwrap: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::type_complexity, missing_docs)]

mod cases;
// Burn's current CPU backend: the host path with half-precision logits.
mod flex;
// The joint's output layer and the loss on the host.
mod joint;
mod tdt;
// The kernels run on Burn's wgpu backend (Mesa's lavapipe without a GPU).
#[cfg(feature = "wgpu")]
mod tdt_kernel;
