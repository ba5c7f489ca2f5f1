#!/usr/bin/env bash
# TDT loss forward + backward at B=8, T=200, U=60, V=1024+1, D=5 on the CPU backend, against one
# log-softmax pass over the same logits (Burn's NdArray, and a plain Rust loop), in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo build --quiet --release -p asr-trainer --bin asrt-bench
"$CARGO_TARGET_DIR/release/asrt-bench" tdt --repeats "${1:-5}"
