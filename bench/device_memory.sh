#!/usr/bin/env bash
# Peak memory of a training run on wgpu over lavapipe, where the device's memory is the
# process's: the peak resident set of `asrt train --device wgpu` (bench/RESULTS.md, "The
# dropouts, the attention's weights and the subsampling's convolutions"). Differences between
# runs attribute it: 6 layers less 2, over 4, is one Conformer layer's activations.
#
#   bash bench/device_memory.sh ASRT LAYERS STEPS      prints the peak resident set in KiB
#   PRECISION=f16-mixed bash bench/device_memory.sh ...   products in f16 (lavapipe has no bf16)
#
# The run: 2 steps (or STEPS) of fused wgpu on 8 synthetic utterances of 18-20 s, 2 per batch,
# the 0.6B preset's structure at d_model 256, 8 heads, ff_dim 1024. Needs make-synthetic-corpus
# beside ASRT (a workspace build), a Vulkan driver (lavapipe will do) and /usr/bin/time.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,13p' "$0"; exit 2; }
bin=$1 layers=$2 steps=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/device_memory.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$(dirname "$bin")/make-synthetic-corpus" "$work/c.asrcorpus" --utterances 8 --vocab 1024 \
  --min-seconds 18 --max-seconds 20 --max-tokens 40 > "$work/corpus.log" 2>&1 || { cat "$work/corpus.log" >&2; exit 1; }
printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nn_layers = %s\nd_model = 256\nn_heads = 8\nff_dim = 1024\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 1\n[model.joint]\njoint_hidden = 32\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 40.0\n' \
  "$layers" > "$work/cfg.toml"
XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work}" /usr/bin/time -f "%M" -o "$work/rss" \
  "$bin" train "$work/c.asrcorpus" --config "$work/cfg.toml" --out "$work/run" --device wgpu \
  --precision "${PRECISION:-f32}" --max-steps "$steps" --quiet > "$work/out.log" 2>&1 || { tail -n 5 "$work/out.log" >&2; exit 1; }
cat "$work/rss"
