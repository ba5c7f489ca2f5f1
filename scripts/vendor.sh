#!/usr/bin/env bash
# Makes vendor/cubecl-cuda: crates.io's cubecl-cuda 0.10.0, checked against its checksum, with
# patches/cubecl-cuda-0.10.0.patch applied. The workspace's Cargo.toml points cargo at it
# ([patch.crates-io]), so it must exist before any cargo command; scripts/setup.sh runs this.
#
# Why a patch: CubeCL 0.10 keeps the CUDA streams it enqueues kernels on to itself, and
# `--matmul cublas` (trainer/src/model/cublas_product.rs) must enqueue cuBLAS on the same one.
# The patch adds the stream to the resource `ComputeClient::get_resource` returns and makes that
# type nameable (README, "Matmul kernels"). Only the patch lives in this repository; the crate is
# fetched. Idempotent: it does nothing when vendor/cubecl-cuda holds this patch already.
set -euo pipefail
cd "$(dirname "$0")/.."
name=cubecl-cuda
version=0.10.0
# crates.io's checksum of cubecl-cuda-0.10.0.crate (the one Cargo.lock recorded before the patch).
sha256=b6b0a69ff45688d322ad8e92c8bf645167b9ca490fa8fa087fc6adac8c5e46be
patch_file="patches/$name-$version.patch"
dest="vendor/$name"
stamp="$dest/.asr-patch"
want="$version $(sha256sum "$patch_file" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
crate=""
for c in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate"; do
  [ -f "$c" ] && crate="$c" && break
done
if [ -z "$crate" ]; then
  echo "vendor: downloading $name $version from crates.io"
  crate="$tmp/$name-$version.crate"
  curl -sSfL --retry 3 "https://static.crates.io/crates/$name/$name-$version.crate" -o "$crate"
fi
if ! echo "$sha256  $crate" | sha256sum -c --status; then
  echo "vendor: $crate is not crates.io's $name $version (sha256 $(sha256sum "$crate" | cut -d' ' -f1), want $sha256)" >&2
  exit 1
fi
tar -xzf "$crate" -C "$tmp"
if ! patch -d "$tmp/$name-$version" -p1 --quiet --forward < "$patch_file"; then
  echo "vendor: $patch_file does not apply to $name $version" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p vendor
mv "$tmp/$name-$version" "$dest"
echo "$want" > "$stamp"
echo "vendor: $dest is $name $version with $patch_file"
