#!/usr/bin/env bash
# Operations fusion's stream executes in one training step of bench/ab_env.sh's preset (the
# 0.6B preset's 24 layers at width 64, 2 x 6 s utterances a step, wgpu by default): two runs
# with BURN_FUSION_LOG=full, of STEPS and STEPS + 1 steps, differenced by bench/fusion_ops.py.
# Each operation in fusion's stream costs host work on the training thread (registering it)
# and on fusion's thread (exploring, executing); bench/RESULTS.md, 2026-12-01.
#
#   bash bench/fusion_ops.sh [ASRT] [DEVICE] [-- fusion_ops.py arguments]
#
# FUSION_OPS_STEPS (default 2) is the shorter run's length; FUSION_OPS_ACCUM (default 1) is
# train.grad_accum (micro-batches a step); FUSION_OPS_KEEP=DIR keeps the logs. ASRT may be a
# debug build (the counts do not depend on the profile): make-synthetic-corpus is taken from
# beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
target="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
asrt="$target/release/asrt"
device="wgpu"
[ $# -gt 0 ] && [ "$1" != "--" ] && { asrt="$1"; shift; }
[ $# -gt 0 ] && [ "$1" != "--" ] && { device="$1"; shift; }
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
work="${FUSION_OPS_KEEP:-$(mktemp -d)}"
mkdir -p "$work"
[ -z "${FUSION_OPS_KEEP:-}" ] && trap 'rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work}"
"$(dirname "$asrt")/make-synthetic-corpus" "$work/fixed.asrcorpus" --utterances 64 --vocab 1024 \
  --min-seconds 6 --max-seconds 6 --max-tokens 30 > /dev/null
printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nd_model = 64\nn_heads = 2\nff_dim = 128\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 1\n[model.joint]\njoint_hidden = 32\n[train]\ngrad_accum = %s\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 12.0\n' "${FUSION_OPS_ACCUM:-1}" > "$work/ab.toml"
short="${FUSION_OPS_STEPS:-2}"
for steps in "$short" $((short + 1)); do
  rm -rf "$work/run$steps"
  BURN_FUSION_LOG=full "$asrt" train "$work/fixed.asrcorpus" --config "$work/ab.toml" \
    --out "$work/run$steps" --device "$device" --max-steps "$steps" --quiet \
    > "$work/steps$steps.log" 2>&1 || { tail -5 "$work/steps$steps.log"; exit 1; }
done
python3 "$repo/bench/fusion_ops.py" "$work/steps$short.log" "$work/steps$((short + 1)).log" "$@"
