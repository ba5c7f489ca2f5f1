#!/usr/bin/env bash
# The trainer's device operations resolved on the training thread (ASRT_FUSION_QUEUE=0) against
# queued in fusion's stream (ASRT_FUSION_QUEUE=1, the default), one binary, alternated twice in one invocation: the 0.6B preset's
# structure (24 layers) at width 64 on DEVICE (default wgpu), 40 steps of 2 x 6 s utterances;
# per run the median step time over steps 11-40, the last loss and the busiest threads
# (scripts/gpu/threads.py). bench/RESULTS.md, 2026-11-29 (21:24 session).
#
#   bash bench/ab_fusion_queue.sh [ASRT] [DEVICE]     ASRT defaults to the release build
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
target="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
asrt="${1:-$target/release/asrt}"
device="${2:-wgpu}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$target/release/make-synthetic-corpus" "$work/fixed.asrcorpus" --utterances 64 --vocab 1024 \
  --min-seconds 6 --max-seconds 6 --max-tokens 30 > /dev/null
printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nd_model = 64\nn_heads = 2\nff_dim = 128\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 1\n[model.joint]\njoint_hidden = 32\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 12.0\n' > "$work/ab.toml"
for round in 1 2; do
  for queue in 0 1; do
    run="$work/q$queue-$round"
    ASRT_FUSION_QUEUE=$queue "$asrt" train "$work/fixed.asrcorpus" --config "$work/ab.toml" --out "$run" \
      --device "$device" --max-steps 40 --quiet > "$run.log" 2>&1 &
    pid=$!
    python3 scripts/gpu/threads.py sample "$pid" "$run.threads" --metrics "$run/metrics.jsonl"
    wait "$pid" || { cat "$run.log"; exit 1; }
    python3 - "$run" "$queue" "$round" "$repo" <<'PY'
import json, statistics, subprocess, sys
run, queue, rnd, repo = sys.argv[1:]
ms = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
steps = [m["ranks"][0]["step_seconds"] for m in ms[10:]]
t = json.loads(subprocess.run([sys.executable, f"{repo}/scripts/gpu/threads.py", "summary", f"{run}.threads",
                               "--from-step", "11"], capture_output=True, text=True).stdout)
busy = ", ".join(f"{g['thread']} x{g['count']} {100 * g['busy']:.0f} %" for g in t.get("by_name", [])[:3])
print(f"{'queued' if queue == '1' else 'resolved'}, round {rnd}: steps 11-40 median "
      f"{statistics.median(steps):.4f} s, loss at step {len(ms)} {ms[-1]['loss']:.4f}; busy: {busy}")
PY
  done
done
