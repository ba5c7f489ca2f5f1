#!/usr/bin/env bash
# Start-up of the trainer's data side: open a corpus and plan an epoch, for a corpus of 20k and
# one of 20M utterances (tiny ones: 16 samples each, so the 20M file stays near 2 GB).
# Usage: bash bench/startup.sh [DIR]   (DIR keeps the corpora; default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
dir="${1:-}"
if [ -z "$dir" ]; then dir="$(mktemp -d)"; trap 'rm -rf "$dir"' EXIT; fi
cargo build --quiet --release -p asr-trainer --bin asrt-bench -p asr-examples
bin="$CARGO_TARGET_DIR/release"
for n in 20000 20000000; do
  f="$dir/tiny-$n.asrcorpus"
  [ -f "$f" ] || "$bin/make-synthetic-corpus" "$f" --utterances "$n" --min-seconds 0.001 --max-seconds 0.001
  cat "$f" > /dev/null   # page-cache it: this measures the warm start a second rank sees
  for i in 1 2 3; do "$bin/asrt-bench" startup "$f"; done
done
