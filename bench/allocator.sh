#!/usr/bin/env bash
# asrt train with glibc's malloc, with mimalloc's defaults, and with mimalloc as asrt sets it up
# (freed memory kept for reuse: trainer/src/allocator.rs), alternating, on a synthetic corpus of
# 200 utterances of 2-15 s with up to 80 tokens each (vocabulary 1024), default tiny config.
#   bash bench/allocator.sh [RUNS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"; steps="${2:-8}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# The test profile's asrt (the trainer at opt-level 1 there since 2026-12-06, its dependencies at 3;
# both binaries alike, so the ratio stands), with and without mimalloc.
cargo build --quiet --locked -p asr-trainer --bin asrt --features system-allocator
cp "$CARGO_TARGET_DIR/debug/asrt" "$work/asrt-glibc"
cargo build --quiet --locked -p asr-trainer --bin asrt
cp "$CARGO_TARGET_DIR/debug/asrt" "$work/asrt"
cargo run --quiet --locked -p asr-examples --bin make-synthetic-corpus -- "$work/c.asrcorpus" \
  --utterances 200 --min-seconds 2 --max-seconds 15 --vocab 1024 --max-tokens 80 2>/dev/null
for i in $(seq "$runs"); do
  for which in glibc mimalloc-default mimalloc-asrt; do
    bin="$work/asrt"; env=()
    case "$which" in
      glibc) bin="$work/asrt-glibc" ;;
      # mimalloc 3's own defaults; the environment overrides what asrt sets.
      mimalloc-default) env=(MIMALLOC_PURGE_DELAY=1000 MIMALLOC_ARENA_EAGER_COMMIT=2) ;;
    esac
    rm -rf "$work/run"
    env "${env[@]}" /usr/bin/time -f "$which wall %e user %U sys %S maxrss_kb %M minor_faults %R" \
      "$bin" train "$work/c.asrcorpus" --out "$work/run" --max-steps "$steps" -q 2>&1 >/dev/null \
      | tail -1
  done
done
