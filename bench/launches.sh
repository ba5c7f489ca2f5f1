#!/usr/bin/env bash
# Kernel launches of a training run on wgpu without fusion (one logged CubeCL kernel per tensor
# operation), to attribute a GPU step's launches without a GPU (bench/RESULTS.md, "A GPU step's
# launches cut"). Differences between runs attribute them: 3 steps less 2 is one step, 2 layers
# less 1 one Conformer layer, more tokens the prediction network.
#
#   bash bench/launches.sh ASRT LAYERS STEPS          prints the launch count
#   TOK=40 bash bench/launches.sh ...                 utterances of up to 40 target tokens (20)
#   KERNELS=FILE bash bench/launches.sh ...           also writes the launches by kernel name
#   FUSION=on bash bench/launches.sh ...              through Burn's fusion (a GPU run's default):
#                                                     each fused kernel counts once
#   PRECISION=f16-mixed bash bench/launches.sh ...    products in f16 (lavapipe has no bf16)
#
# The run: `asrt train --device wgpu --fusion off` on 8 synthetic utterances of 5-6 s, 12 s of
# audio per step, the 0.6B preset's structure at a small width (launches do not depend on
# width). Needs make-synthetic-corpus beside ASRT (a workspace build) and a Vulkan driver
# (lavapipe will do). On lavapipe a matrix product's "highly permuted" operand is copied twice
# (the product's CMMA attempt copies, fails, and the fallback copies again); a GPU with CMMA
# copies once, so copies before products count double here (bench/RESULTS.md, "The residual
# connections, the attention's heads").
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,20p' "$0"; exit 2; }
bin=$1 layers=$2 steps=$3 tok=${TOK:-20}
work=$(mktemp -d "${TMPDIR:-/tmp}/launches.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$(dirname "$bin")/make-synthetic-corpus" "$work/c.asrcorpus" --utterances 8 --vocab 1024 \
  --min-seconds 5 --max-seconds 6 --max-tokens "$tok" > "$work/corpus.log" 2>&1 || { cat "$work/corpus.log" >&2; exit 1; }
printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nn_layers = %s\nd_model = 64\nn_heads = 2\nff_dim = 128\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 2\n[model.joint]\njoint_hidden = 32\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 12.0\n' \
  "$layers" > "$work/cfg.toml"
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work}" CUBECL_DEBUG_LOG="$work/cl.log" CUBECL_DEBUG_OPTION=profile-full \
  "$bin" train "$work/c.asrcorpus" --config "$work/cfg.toml" --out "$work/run" --device wgpu \
  --fusion "${FUSION:-off}" --precision "${PRECISION:-f32}" --max-steps "$steps" --quiet > "$work/out.log" 2>&1 || { tail -n 5 "$work/out.log" >&2; exit 1; }
# One line `| DURATION | KERNEL` per launch; the profile's summary tables, printed now and then,
# have rows that start with `| ` too but end with `|`.
grep '^| ' "$work/cl.log" | grep -v '|[[:space:]]*$' > "$work/launches.log" || true
wc -l < "$work/launches.log"
if [ -n "${KERNELS:-}" ]; then
  # The kernel's name without its generic arguments.
  sed -e 's/^| [^|]*| *//' -e 's/<.*//' "$work/launches.log" | sort | uniq -c | sort -rn > "$KERNELS"
fi
