#!/usr/bin/env bash
# The whole test suite. Cheapest checks first.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"

cargo fmt --all -- --check
# --all-features also compiles the CUDA backend's code paths (no GPU needed to build them).
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
cargo test --workspace --locked
# The trainer's device operations again with fusion resolving their inputs on the calling
# thread (ASRT_FUSION_QUEUE=0, asr_tdt::fusion::in_stream; the default queues them in fusion's
# stream): fused and unfused must still agree, and fused training still match the CPU's.
# (--workspace, as above: the same features, so nothing is built again.)
ASRT_FUSION_QUEUE=0 cargo test --workspace --lib --locked -- device_
ASRT_FUSION_QUEUE=0 cargo test --workspace --test it --locked -- wgpu_training

# The two readers on a corpus the writer made: same verdict, same summary.
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cargo run --quiet --locked -p asr-examples --bin make-synthetic-corpus -- "$out/demo.asrcorpus" --utterances 500
"$CARGO_TARGET_DIR/debug/asrc" validate --json "$out/demo.asrcorpus" > "$out/rust.json"
python3 format-spec/reference/read_corpus.py "$out/demo.asrcorpus" > "$out/python.json"
python3 - "$out/rust.json" "$out/python.json" <<'PY'
import json, sys
rust = json.load(open(sys.argv[1]))
python = json.load(open(sys.argv[2]))
assert rust["valid"], rust
if rust["report"] != python:
    sys.exit(f"asrc validate and the Python reader disagree:\n{rust['report']}\n{python}")
print(f"cross-reader check: 1 passed, 0 failed ({python['utterances']} utterances agree)")
PY

# README's first command, end to end: it must finish and leave every output it lists.
bash scripts/quickstart.sh "$out/quickstart" > "$out/quickstart.log" 2>&1 || {
  cat "$out/quickstart.log"; echo "quickstart: FAILED" >&2; exit 1; }
for f in espeak.asrcorpus espeak.asrcorpus.report.json run/metrics.jsonl run/loss.svg \
  run/checkpoints/latest eval.txt transcript.jsonl; do
  [ -s "$out/quickstart/$f" ] || { cat "$out/quickstart.log"; echo "quickstart: no $f" >&2; exit 1; }
done
steps=$(wc -l < "$out/quickstart/run/metrics.jsonl")
[ "$steps" -eq 40 ] || { echo "quickstart: $steps training steps, expected 40" >&2; exit 1; }
grep -q '^all ' "$out/quickstart/eval.txt" || { echo "quickstart: no overall WER line" >&2; exit 1; }
grep -q '"pred_text"' "$out/quickstart/transcript.jsonl" || { echo "quickstart: no transcript" >&2; exit 1; }
ls "$out/quickstart/run"/events.out.tfevents.* >/dev/null || { echo "quickstart: no TensorBoard events" >&2; exit 1; }
# The memorising run shows learning: its last validation WER is below its first.
python3 - "$out/quickstart/memorise.txt" <<'PY' || { cat "$out/quickstart.log"; exit 1; }
import re, sys
wers = [float(m) for m in re.findall(r"WER +([0-9.]+) %", open(sys.argv[1]).read())]
if len(wers) != 4 or not wers[-1] < wers[0]:
    sys.exit(f"quickstart: the memorising run's WER did not fall: {wers}")
print(f"quickstart memorisation: WER {wers[0]:.1f} % -> {wers[-1]:.1f} % over steps 25-100")
PY
echo "quickstart: 1 passed, 0 failed ($steps steps trained, evaluated)"

# The GPU kit's run script end to end on wgpu (Mesa's software Vulkan) with small sizes, so it
# cannot rot between the sessions that have a GPU (scripts/gpu/run.sh --dry-run).
bash scripts/gpu/run.sh --dry-run --out "$out/gpu" > "$out/gpu.log" 2>&1 || {
  cat "$out/gpu.log"; echo "gpu kit dry run: FAILED" >&2; exit 1; }
if grep -q '| FAIL\|| TIMEOUT' "$out/gpu/results.md"; then
  cat "$out/gpu.log"; echo "gpu kit dry run: a step failed" >&2; exit 1
fi
echo "gpu kit dry run: $(grep -c '| PASS' "$out/gpu/results.md") steps passed, $(grep -c '| SKIPPED' "$out/gpu/results.md") skipped"
