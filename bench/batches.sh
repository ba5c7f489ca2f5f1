#!/usr/bin/env bash
# Padded batches from a page-cached corpus, one core: asrt's batch assembly and the Python
# pipeline's per-sample FLAC loading, on the same utterances and batches, in one run.
# Usage: bash bench/batches.sh [UTTERANCES]   (default 1500, about 3.5 hours of audio)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
n="${1:-1500}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cargo build --quiet --release -p asr-trainer --bin asrt-bench --bin asrt -p asr-examples
bin="$CARGO_TARGET_DIR/release"
"$bin/make-synthetic-corpus" "$dir/c.asrcorpus" --utterances "$n" --min-seconds 1 --max-seconds 16
"$bin/asrt" plan "$dir/c.asrcorpus" --grad-accum 1 --batches > "$dir/batches.json"
echo "== asrt batch assembly, i16 and f32 (one thread)"
"$bin/asrt-bench" batches "$dir/c.asrcorpus"
"$bin/asrt-bench" batches "$dir/c.asrcorpus" --f32
echo "== Python per-sample FLAC loading + collate (one process)"
python3 bench/python_loader.py export "$dir/c.asrcorpus" "$dir/flac" > /dev/null
python3 bench/python_loader.py load "$dir/flac" "$dir/batches.json" --repeats 3
