#!/usr/bin/env bash
# asrt's training step against PyTorch's (transformers' ParakeetForTDT, bench/peer_step.py) on the
# CPU: the same model shape, utterance lengths, tokens, batch audio and optimizer, both on the same
# thread count, alternating in one invocation; prints one line per run and a median table.
#   bash bench/peer.sh [ROUNDS] [CASES]   CASES: any of tiny,wide,forward,encoder,encoder-forward
#                                         (default tiny,wide,forward)
# tiny:    the `tiny` preset, 60 s of audio per step, 6 timed steps.
# wide:    the Parakeet-TDT-0.6B shape at full width (d_model 1024, 8 heads, ff 4096, 640-wide
#          prediction network and joint, 128 mels, 1024 pieces + blank, dropout 0.1) with
#          $PEER_LAYERS encoder layers (default 2 of its 24: all 24 take minutes per step on 2
#          cores), 20 s of audio per step, 4 timed steps.
# forward: wide's forward pass and loss only (the graph built as in training, no backward).
# encoder: wide's features and encoder alone, forward and backward of a surrogate loss (the mean
#          square of the encoder's output), no update: the models compared free of the joint and
#          the loss, whose implementations differ most (--part encoder on both sides).
# encoder-forward: the same, forward only.
# Needs torch and transformers with ParakeetForTDT: $PEER_PYTHON, else ~/.cache/asr-torch-venv.
# $PEER_ASRT_BENCH: an asrt-bench binary to time instead of building the release one.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"; cases="${2:-tiny,wide,forward}"
layers="${PEER_LAYERS:-2}"; threads="${PEER_THREADS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
py="${PEER_PYTHON:-$HOME/.cache/asr-torch-venv/bin/python}"
if ! "$py" -c "import torch, transformers; from transformers import ParakeetForTDT" 2>/dev/null; then
  echo "peer.sh: no torch with transformers' ParakeetForTDT at $py (set PEER_PYTHON)" >&2
  exit 3
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# The release asrt-bench, as PyTorch is its release build. Until 2026-11-27 this was the test
# profile's, optimised but with debug assertions in every dependency (5.5 % of a wide step's
# samples in precondition and overflow checks): the ratios before then are pessimistic for asrt.
# $PEER_ASRT_BENCH names a binary already built (an A/B of two commits) instead.
bench="${PEER_ASRT_BENCH:-$CARGO_TARGET_DIR/release/asrt-bench}"
if [ -z "${PEER_ASRT_BENCH:-}" ]; then
  cargo build --quiet --locked --release -p asr-trainer --bin asrt-bench
fi
# The peer's utterances, drawn alike: uniform 5-20 s, at most 80 tokens of 1024 pieces.
cargo run --quiet --locked -p asr-examples --bin make-synthetic-corpus -- "$work/syn.asrcorpus" \
  --utterances 200 --vocab 1024 --min-seconds 5 --max-seconds 20 --max-tokens 80 >/dev/null
# asrt's rayon pool and torch's intra-op pool get the same number of threads.
export RAYON_NUM_THREADS="$threads"
for round in $(seq "$rounds"); do
  for c in ${cases//,/ }; do
    case "$c" in
      tiny) a=(--max-batch-seconds 60 --steps 6); p=(--preset tiny --batch-seconds 60 --steps 7) ;;
      wide) a=(--preset parakeet-tdt-0.6b --layers "$layers" --dropout 0.1 --max-batch-seconds 20 --steps 4)
            p=(--preset parakeet-tdt-0.6b --layers "$layers" --batch-seconds 20 --steps 5) ;;
      forward) a=(--preset parakeet-tdt-0.6b --layers "$layers" --dropout 0.1 --max-batch-seconds 20 --steps 4 --forward-only)
               p=(--preset parakeet-tdt-0.6b --layers "$layers" --batch-seconds 20 --steps 5 --forward-only) ;;
      encoder|encoder-forward)
               a=(--preset parakeet-tdt-0.6b --layers "$layers" --dropout 0.1 --max-batch-seconds 20 --steps 4 --part encoder)
               p=(--preset parakeet-tdt-0.6b --layers "$layers" --batch-seconds 20 --steps 5 --part encoder)
               if [ "$c" = encoder-forward ]; then a+=(--forward-only); p+=(--forward-only); fi ;;
      *) echo "peer.sh: unknown case $c (tiny, wide, forward, encoder, encoder-forward)" >&2; exit 2 ;;
    esac
    "$bench" train-step "$work/syn.asrcorpus" "${a[@]}" > "$work/a.json"
    "$py" bench/peer_step.py --device cpu --threads "$threads" --precisions f32 "${p[@]}" \
      --json-out "$work/p.json" >/dev/null 2>"$work/p.err" || { cat "$work/p.err" >&2; exit 1; }
    python3 - "$round" "$c" "$work/a.json" "$work/p.json" <<'EOF' | tee -a "$work/rows"
import json, sys
r, c, a, p = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
q = p["runs"]["f32"]
print(f"{c} {r} asrt {a['step_seconds_median']:.3f} {a['audio_seconds_per_second_median']:.2f} "
      f"{a['audio_seconds_median']:.1f} {a['parameters']} "
      f"torch {q['median_step_seconds']:.3f} {q['audio_seconds_per_second']:.2f} "
      f"{q['audio_seconds_per_step']:.1f} {q['parameters']}")
EOF
  done
done
python3 - "$work/rows" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
# Columns of a row: case round asrt s/step audio-s/s audio params torch s/step audio-s/s audio params.
print("| case | rounds | asrt s/step | asrt audio-s/s | PyTorch s/step | PyTorch audio-s/s | asrt's audio-s/s over PyTorch's |")
print("|---|---|---|---|---|---|---|")
for c in dict.fromkeys(r[0] for r in rows):
    rs = [r for r in rows if r[0] == c]
    med = lambda i: statistics.median(float(r[i]) for r in rs)
    print(f"| {c} | {len(rs)} | {med(3):.3f} | {med(4):.2f} | {med(8):.3f} | {med(9):.2f} | {med(4) / med(9):.2f} |")
EOF
