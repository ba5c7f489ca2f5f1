#!/usr/bin/env bash
# The main job on the bundled example, from a fresh machine: install what is missing, build,
# compile the corpus, validate it, show the batch plan, train the tiny model for a short while,
# evaluate it, and say where the report, metrics, loss plot and checkpoint are.
#
#   bash scripts/quickstart.sh [OUT]      (default OUT: out/quickstart)
#
# It builds the same (test) profile the test suite builds, so after `bash .ci/run` nothing is
# compiled again.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
out="${1:-out/quickstart}"
example=examples/espeak

step() { printf '\n== %s\n' "$*"; }

step "setup"
bash scripts/setup.sh

step "build (cargo build --workspace --bins)"
cargo build --quiet --locked --workspace --bins
bin="$CARGO_TARGET_DIR/debug"

step "compile $example/manifest.parquet"
mkdir -p "$out"
# Exit 1 means more rejects than --max-reject-fraction; the example's 9 bad rows are on purpose.
"$bin/asrc" compile "$example/manifest.parquet" --tokenizer "$example/spm.model" \
  -o "$out/espeak.asrcorpus" --max-reject-fraction 0.5

step "validate"
"$bin/asrc" validate "$out/espeak.asrcorpus"

step "plan (the plan training will run: asrt plan --config)"
"$bin/asrt" plan "$out/espeak.asrcorpus" --config "$example/train.toml"

step "train the tiny model ($example/train.toml)"
rm -rf "$out/run"
"$bin/asrt" train "$out/espeak.asrcorpus" --config "$example/train.toml" --out "$out/run"

step "evaluate"
"$bin/asrt" eval "$out/espeak.asrcorpus" --checkpoint "$out/run" | tee "$out/eval.txt"

step "memorise five utterances (examples/espeak/memorise.toml: the WER falls; training data, not held out)"
"$bin/asrc" compile "$example/manifest.parquet" --tokenizer "$example/spm.model" \
  -o "$out/five.asrcorpus" --max-duration 1.78 --max-reject-fraction 1.0 > "$out/five.compile.log"
rm -rf "$out/memorise"
"$bin/asrt" train "$out/five.asrcorpus" --config "$example/memorise.toml" --val-corpus "$out/five.asrcorpus" \
  --out "$out/memorise" --quiet
# The validation WER after every 25 steps, from the metrics.
python3 - "$out/memorise/metrics.jsonl" <<'PY' | tee "$out/memorise.txt"
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    v = m.get("validation")
    if v:
        print(f"step {m['step']:>3}: WER {100 * v['wer']:6.2f} %, CER {100 * v['cer']:6.2f} % on the 5 memorised utterances")
PY

step "transcribe one file (asrt transcribe: text, token, word and segment times)"
"$bin/asrt" transcribe "$example/audio/shard-000/en-0001.flac" --checkpoint "$out/run" \
  -o "$out/transcript.jsonl"
"$bin/asrt" transcribe "$example/audio/shard-000/en-0001.flac" --checkpoint "$out/run" --format text

step "outputs"
cat <<TXT
corpus           $out/espeak.asrcorpus
compile report   $out/espeak.asrcorpus.report.json (every dropped, retagged or flagged row: $out/espeak.asrcorpus.report.jsonl)
training metrics $out/run/metrics.jsonl (one JSON line per optimizer step; TensorBoard: tensorboard --logdir $out/run)
loss plot        $out/run/loss.svg
checkpoint       $(cat "$out/run/checkpoints/latest" 2>/dev/null | sed "s|^|$out/run/checkpoints/|")
evaluation       $out/eval.txt
memorisation     $out/memorise.txt (validation WER of the five-utterance run as it learns)
transcript       $out/transcript.jsonl (NeMo-style JSON line with timestamps)
TXT
