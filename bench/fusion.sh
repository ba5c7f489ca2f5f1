#!/usr/bin/env bash
# Burn's fusion against one kernel per operation, on wgpu (Mesa's lavapipe without a GPU):
# `asrt train --device wgpu --fusion on|off`, the same `tiny` run alternating in one invocation,
# the kernel cache warm (a first run of each compiles its kernels and is not timed). Prints each
# run's median step time (steps after the first) and the medians over the rounds.
#   bash bench/fusion.sh [ROUNDS] [STEPS]       (default 3 rounds of 8 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"; steps="${2:-8}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# The test profile's asrt: every dependency at opt-level 3, the trainer at 1 since 2026-12-06 (at 3
# before; Cargo.toml says why). Both sides of the comparison are the same binary.
cargo build --quiet --locked -p asr-trainer --bin asrt
asrt="$CARGO_TARGET_DIR/debug/asrt"
cargo run --quiet --locked -p asr-examples --bin make-synthetic-corpus -- "$work/syn.asrcorpus" \
  --utterances 64 --vocab 256 --min-seconds 2 --max-seconds 6 --max-tokens 30 >/dev/null
printf '[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 16.0\n' > "$work/t.toml"
export ASRT_KERNEL_CACHE="$work/kernels"
run() { # run FUSION NAME STEPS
  rm -rf "$work/$2"
  "$asrt" train "$work/syn.asrcorpus" --config "$work/t.toml" --out "$work/$2" --device wgpu \
    --fusion "$1" --max-steps "$3" --quiet
}
run on warm-on 2; run off warm-off 2
for r in $(seq "$rounds"); do
  for f in on off; do
    run "$f" "$f-$r" "$steps"
    python3 - "$f" "$r" "$work/$f-$r/metrics.jsonl" <<'PY' | tee -a "$work/rows"
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[3])][1:]
s = statistics.median(m["ranks"][0]["step_seconds"] for m in ms)
a = statistics.median(m["audio_seconds_per_second"] for m in ms)
print(f"fusion {sys.argv[1]} round {sys.argv[2]}: {s:.3f} s/step, {a:.2f} audio-s/s")
PY
  done
done
python3 - "$work/rows" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {f: statistics.median(float(r[4]) for r in rows if r[1] == f) for f in ("on", "off")}
print(f"| fusion | median s/step |\n|---|---|\n| on | {med['on']:.3f} |\n| off | {med['off']:.3f} |")
print(f"off / on: {med['off'] / med['on']:.2f}x")
PY
