#!/usr/bin/env bash
# Builds the GPU kit, here (a machine with Rust): everything scripts/gpu/run.sh needs on the GPU
# machine, which has no Rust and no network, in one git-ignored folder under the device tool's
# 64 MiB per call:
#
#   gpu-kit/bin/{asrt-bench,make-synthetic-corpus}.xz        --features cuda, release, symbols only;
#                                                            asrt-bench started as asrt is asrt
#   gpu-kit/data/espeak.asrcorpus                            the example corpus
#   gpu-kit/reference/init/                                  `tiny` after one CPU step: the start
#   gpu-kit/reference/metrics.jsonl                          the CPU run of `tiny` from init/
#   gpu-kit/reference/eval.txt                               the quickstart's evaluation
#   gpu-kit/perf.tar.xz                                      this machine's perf, its libraries
#                                                            and loader (step hp), if it has one
#
#   bash scripts/gpu/bundle.sh            then run with the carries it prints:
#   bash scripts/gpu/run.sh               (on the GPU machine; see its header)
#
# Before packing it checks, on this machine (no GPU), that the CUDA binaries refuse cleanly: no
# driver, a device listed twice, an unknown device.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The GPU machine's driver (580) is CUDA 13.0. Without nvcc here cudarc would bind CUDA 13.4's
# API, whose newer entry points that driver lacks.
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
kit=gpu-kit
limit_mib=62

step() { printf '\n== bundle: %s\n' "$*"; }

step "setup (the C libraries the build links)"
bash scripts/setup.sh

step "build --release --features cuda (asrt-bench, which is also asrt; make-synthetic-corpus)"
# One binary for both: asrt-bench started under the name asrt is asrt (its main), and the two
# share most of their code, so the kit carries 8.6 MB less than with both (asrt-bench.xz 20.1 MB
# against 15.7 + 13.0 for the two).
cargo build --release --locked --features cuda -p asr-trainer --bin asrt-bench
cargo build --release --locked -p asr-examples --bin make-synthetic-corpus
rel="$CARGO_TARGET_DIR/release"
# asrt as the kit runs it: a link named asrt to asrt-bench (run.sh makes the same link).
links="$(mktemp -d)"
ln -s "$rel/asrt-bench" "$links/asrt"
asrt="$links/asrt"

step "refusals of the CUDA build on this machine (no GPU)"
# check_refusal EXIT-CODE MESSAGE COMMAND...: the command exits with that code, says the message
# and does not panic.
check_refusal() {
  local code="$1" want="$2"; shift 2
  local log; log="$(mktemp)"
  set +e
  timeout 60 "$@" >"$log" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne "$code" ] || ! grep -q -- "$want" "$log" || grep -q "panicked" "$log"; then
    echo "bundle: '$*' should exit $code saying '$want' (no panic); it exited $rc:" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "refused as expected: $* -> $(grep -m1 -- "$want" "$log")"
  rm -f "$log"
}
check_refusal 2 "listed twice" "$asrt" train examples/espeak/manifest.parquet --devices cuda:0,cuda:0
check_refusal 2 "cuda:N or wgpu" "$asrt" eval x.asrcorpus --checkpoint y --device tpu:0
if ! ldconfig -p | grep -q 'libcuda\.so'; then
  quick="$(mktemp -d)"
  "$rel/make-synthetic-corpus" "$quick/s.asrcorpus" --utterances 8 >/dev/null
  check_refusal 2 "libcuda could not be loaded" \
    "$asrt" train "$quick/s.asrcorpus" --out "$quick/run" --max-steps 1 --device cuda:0 --quiet
  check_refusal 1 "libcuda could not be loaded" "$rel/asrt-bench" tdt-check --device cuda:0 --sizes small
  rm -rf "$quick"
fi

step "the example corpus and the CPU reference run (scripts/quickstart.sh)"
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/data" "$kit/reference"
bash scripts/quickstart.sh "$kit/quickstart" > "$kit/quickstart.log" 2>&1 || {
  cat "$kit/quickstart.log"; exit 1; }
cp "$kit/quickstart/espeak.asrcorpus" "$kit/data/"
cp "$kit/quickstart/eval.txt" "$kit/reference/"
# The reference the GPU run is compared with starts from weights both runs load (--init): the
# initial weights are drawn from each backend's own generator, so the same seed gives another
# model on CUDA than on the CPU (the first H100 run's losses differed by 2 % at step 1 for that
# reason alone). The weights after one CPU step serve as that common start.
"$asrt" train "$kit/data/espeak.asrcorpus" --config examples/espeak/train.toml \
  --out "$kit/quickstart/init-run" --max-steps 1 --device cpu --quiet
cp -r "$kit/quickstart/init-run/checkpoints/step-00000001" "$kit/reference/init"
"$asrt" train "$kit/data/espeak.asrcorpus" --config examples/espeak/train.toml \
  --init "$kit/reference/init" --out "$kit/quickstart/ref-run" --device cpu --quiet
cp "$kit/quickstart/ref-run/metrics.jsonl" "$kit/reference/"
rm -rf "$kit/quickstart" "$kit/quickstart.log" "$links"

step "strip and compress"
# Debug information out, symbols kept: a panic on the GPU machine then shows where it happened
# (the first out-of-memory panic there could not be placed with fully stripped binaries).
for b in asrt-bench make-synthetic-corpus; do
  strip --strip-debug -o "$kit/bin/$b" "$rel/$b"
  # The x86 branch filter before LZMA2: 3 % smaller on asrt-bench (20.1 -> 19.5 MB); xz and
  # Python's lzma (run.sh's fallback) both decode it.
  xz -T0 --x86 --lzma2=preset=9e -f "$kit/bin/$b"
done
step "perf with its libraries and loader, for the host's profile (run.sh's hp), if this machine has it"
# The GPU machine has no perf. This one's, with every library it links and the loader that
# runs it, so that it needs nothing of the GPU machine's system (run.sh starts it through
# that loader). Without perf here the kit goes without, and hp says so.
if command -v perf >/dev/null; then
  pk="$(mktemp -d)"
  mkdir -p "$pk/perf/lib"
  cp "$(readlink -f "$(command -v perf)")" "$pk/perf/perf"
  ldd "$pk/perf/perf" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' \
    | while read -r lib; do cp -L "$lib" "$pk/perf/lib/"; done
  [ -f "$pk/perf/lib/ld-linux-x86-64.so.2" ] || { echo "bundle: perf's loader not found" >&2; exit 1; }
  "$pk/perf/lib/ld-linux-x86-64.so.2" --library-path "$pk/perf/lib" "$pk/perf/perf" --version
  tar -C "$pk" -cf - perf | xz -T0 -9 > "$kit/perf.tar.xz"
  rm -rf "$pk"
else
  echo "no perf on this machine: the kit's hp step will be skipped (apt-get install linux-perf)"
fi
# The commit, marked when the working tree differs from it (what the binaries were built from).
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!gpu-kit' || echo '+changes')" > "$kit/commit"
du -b "$kit"/bin/* "$kit"/data/* "$kit"/reference/*
# A call carries the working tree (tracked files and untracked ones git does not ignore) with
# the paths named in carry, 64 MiB in all. The tree is about 23 MiB and the kit with perf about
# 37 MiB, so each call carries the whole kit: a call that finds a fresh machine (the last one
# given back) still has everything. Should the kit outgrow that, perf goes alone in the second
# call, which then relies on the first call's binaries being still there (the device tool keeps
# ignored files between calls on one machine).
tree_b=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
kit_b=$(du -sb "$kit" | cut -f1)
perf_b=0
[ -f "$kit/perf.tar.xz" ] && perf_b=$(stat -c %s "$kit/perf.tar.xz")
mib() { echo $(( ($1 + 1048575) / 1048576 )); }
limit_b=$(( limit_mib * 1048576 ))
call1=$(( tree_b + kit_b ))
call2=$call1
carry1='["gpu-kit"]'
carry2='["gpu-kit"]'
if [ "$call1" -gt "$limit_b" ]; then
  echo "bundle: the tree and the whole kit are $(mib "$call1") MiB, over the $limit_mib MiB a call may carry here: perf goes alone in call 2, which needs call 1's machine still held" >&2
  call1=$(( tree_b + kit_b - perf_b ))
  call2=$(( tree_b + perf_b ))
  carry1='["gpu-kit/bin", "gpu-kit/data", "gpu-kit/reference", "gpu-kit/commit"]'
  carry2='["gpu-kit/perf.tar.xz"]'
  for what in "call 1:$call1" "call 2:$call2"; do
    if [ "${what##*:}" -gt "$limit_b" ]; then
      echo "bundle: ${what%:*} carries $(mib "${what##*:}") MiB, over the $limit_mib MiB this kit allows (64 MiB per call)" >&2
      exit 1
    fi
  done
fi
cat <<TXT

bundle: $kit is $(mib "$kit_b") MiB ($(cat "$kit/commit")); the working tree $(mib "$tree_b") MiB.
Run it on the GPU machine with the device tool (scripts/gpu/run.sh's header gives the calls):
  call 1, carry $carry1 ($(mib "$call1") MiB):
    bash scripts/gpu/run.sh --short --work /tmp/asrt-kit
  call 2 at once, carry $carry2 ($(mib "$call2") MiB):
    bash scripts/gpu/run.sh --only hp,xl,xj,xk,db --budget SECONDS --work /tmp/asrt-kit
TXT
