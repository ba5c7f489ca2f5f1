#!/usr/bin/env bash
# Installs what building, running and testing need on a fresh Debian machine. Idempotent: it
# installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# libsentencepiece-dev and libopus-dev (the Opus decoder) are linked through pkg-config; cmake builds the libFLAC sources that
# libflac-sys bundles; sox, flac and sentencepiece (spm_train, spm_encode) are the reference
# tools the tests compare against; mesa-vulkan-drivers is Mesa's software Vulkan driver
# (lavapipe), on which the wgpu backend runs the TDT kernels when there is no GPU; patch and curl
# make vendor/cubecl-cuda (below).
apt_packages=(pkg-config cmake libsentencepiece-dev libopus-dev sentencepiece sox flac mesa-vulkan-drivers patch curl)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

if ! python3 -c 'import numpy, zstandard, xxhash' 2>/dev/null; then
  echo "setup: installing Python packages for the reference reader"
  python3 -m pip install --quiet --disable-pip-version-check -r format-spec/reference/requirements.txt
fi

# TensorBoard's own event-file reader checks the event files asrt writes (trainer tests).
if ! python3 -c 'import tensorboard' 2>/dev/null; then
  echo "setup: installing TensorBoard (its reader checks asrt's event files)"
  python3 -m pip install --quiet --disable-pip-version-check tensorboard
fi

# The patched cubecl-cuda the workspace's Cargo.toml points at: no cargo command works without it.
bash scripts/vendor.sh

command -v cargo >/dev/null || { echo "setup: cargo not found; install a Rust toolchain" >&2; exit 1; }
echo "setup: ok"
