#!/usr/bin/env bash
# Epoch plan for N synthetic utterances: asrt's planner and the Python sampler it replaces, on the
# same inputs, in one run. Usage: bash bench/plan.sh [N]   (default 20000000)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
n="${1:-20000000}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cargo build --quiet --release -p asr-trainer --bin asrt-bench
echo "== asrt planner, seed mode: the Python sampler's plan (world size 8, grad accum 4, 3 runs)"
"$CARGO_TARGET_DIR/release/asrt-bench" plan --utterances "$n" --repeats 3 --mode seed --write-inputs "$dir"
echo "== asrt planner, temperature mode (the default; 3 runs)"
"$CARGO_TARGET_DIR/release/asrt-bench" plan --utterances "$n" --repeats 3 --mode temperature
echo "== Python sampler, rank 0 of 8 (one rank's build; every rank repeats it)"
python3 bench/python_sampler.py "$dir/durations.f64" "$dir/languages.u16" \
  --world-size 8 --grad-accum 4 --time --out /dev/null
