#!/usr/bin/env bash
# The GPU kit: one command that gets the most verified information out of a GPU machine's
# minutes (no Rust, no network there). Build the kit first, here: bash scripts/gpu/bundle.sh.
#
#   bash scripts/gpu/run.sh                 on the GPU machine (device tool: the carries bundle.sh prints)
#   bash scripts/gpu/run.sh --dry-run       anywhere: the same steps on wgpu/CPU with small sizes,
#                                           using the test-profile binaries (CI runs this)
#
# Options: --kit DIR (default gpu-kit), --out DIR (default $OUT, else out/gpu), --only a,c,...
# (steps to run), --budget SECONDS (each step's timeout is cut to what is left; default 1500),
# --cap SECONDS (no step runs longer; for calls shorter than the whole kit), --short (what one
# call of at most 10 minutes should run: --only env,g,cg,d,dw,e,xu --budget 560 --cap 260,
# and ASRT_PEER_RUNS=tf32+softmax-loss,bf16+softmax-loss unless set; options after it override
# it), --work DIR (keep the working folder for a later call on the same machine, see below).
#
# A session's device time is short (15 minutes, machine start included), and the idle machine
# is taken back after 30 s. bundle.sh prints each call's carry: the whole kit in each call while
# it fits with the working tree in the 64 MiB one call carries (a call that finds a fresh machine
# then has everything); else the binaries and data in call 1, and perf in call 2, which finds
# call 1's binaries where they were. Call 1:
#   bash scripts/gpu/run.sh --short --work /tmp/asrt-kit
# and at once, while the machine is still held, call 2 with what is left:
#   bash scripts/gpu/run.sh --only hp,xn,xa,xl,xj,xk,db --budget SECONDS --work /tmp/asrt-kit
# On an H200 (2026-11-30 evening) the steps took: env 6 s, g 2, cg 52, d 93, dw 36, e 30, mm 24
# (five kernels), dm 76, hp 41, mb 21, bm 82, ma 5, dc 35, ds 36; dk about as dm, dj as dw; so
# an alternated step about 4 x 36 s, and its variant's compiling run besides. Call 1 about
# 450 s; call 2's budget cuts it (hp, xn and xa, the two newest defaults, take about 330 s;
# then xl, xj, xk and db: db is bm with the default products, cuBLAS's on CUDA, so it needs no
# mb).
# With --work a call keeps in DIR the kernel cache, the synthetic corpora, d's configuration and
# parameter count, mm's timings and dm's kernel, and a later call with the same DIR reuses them: dm then
# compiles only its matmul kernels, not the whole preset again (about 100 s on an H200). What a
# call writes besides (runs, logs) is removed at its start. On a fresh machine DIR is empty and
# every step makes what it needs, except dm, which needs mm's timings (run mm,dm then), and dc
# and ds, which need dm's kernel.
#
# Steps, each under a timeout, with its own log and a one-line verdict:
#   env  the machine's facts: nvidia-smi, driver, nvcc, NVRTC and NCCL found, python's torch
#   a    the TDT kernels against the float64 CPU path on the device (f32, f16, bf16; Parakeet
#        sizes and edge sizes), and their time against one log-softmax (asrt-bench tdt-check)
#   b    the same logits through transformers' pure-PyTorch TDT loss (bench/tdt_peer.py)
#   c    `tiny` on the example corpus, 40 steps on the device, losses against the CPU reference,
#        then eval; again with the kernel cache warm
#   cg   c's first 3 steps from the same weights on the CPU, fused, with --fusion off and with
#        --matmul simple-unit, every
#        parameter's gradient norm written (ASRT_GRAD_NORMS): each step's global norm against
#        the CPU run's (bound: 2e-3 relative at step 1), every parameter's norm at step 1 (5e-2); each
#        global norm against its parameters' norms (5e-7); the fused run with poisoned buffers
#        (ASRT_POISON_BUFFERS=1) the same bits (a dry run does this on lavapipe)
#   d    the Parakeet-TDT-0.6B preset on synthetic 5-20 s utterances, a few optimizer steps:
#        step time, audio-s/s, peak device memory, data-wait share; each host thread's busy
#        share over steps 3.. and the GPU's utilisation (threads.py; also dw, dr, dj, dm, du, db,
#        d2)
#   dw   d again with the kernel cache d left (the same shapes): the steady step time
#   dk   dw with Burn's product (`--matmul burn`), run twice (the first compiles it): what
#        cuBLAS's product, the default on CUDA, gains
#        (d, dw, db, d2 and f train through Burn's fusion, asrt's default on a GPU)
#   dr   dw with the trainer's operations resolved on the training thread (ASRT_FUSION_QUEUE=0)
#        rather than queued in fusion's stream (the default): what queuing gains
#   dp   one steady step's kernels on the device: dw's run profiled by CubeCL
#        (CUBECL_DEBUG_LOG), 3 steps less 1, over 2: launches, their device time against the
#        step's wall time, and the kernels that take it (scripts/gpu/profile_summary.py; a dry run
#        profiles on wgpu)
#   dj   dw without the parameters joined into one autodiff graph before each forward
#        (ASRT_GRAPH_JOIN=0, train::graph_join): what the join gains
#   hp   dw's run under perf (the kit's own copy, bundled from the build machine; skipped where
#        perf cannot attach): each host thread's CPU time from step 3 on, split into work,
#        spinning on CubeCL's task rings, the CUDA driver and the kernel, with its busiest
#        symbols (scripts/gpu/host_profile.py): which of the training, fusion and device threads
#        bounds the step, where threads.py shows only how busy each is
#   du   dw with --fusion off (one kernel per operation): what fusion gains
#   xu   dw and du alternated, a b a b (du's kernels compiled first, unmeasured), each of steps
#        3-6 of du's runs over the same step of dw's beside it: one configuration's runs spread
#        about 10 %, so a single pair ranks nothing closer (check.py train-ab)
#   xl   the same for the loss read before the backward is queued (ASRT_LOSS_READ=forward;
#        the default queues the backward first, one wait for the device fewer a micro-batch)
#   xj   the same for dj (ASRT_GRAPH_JOIN=0)
#   xk   the same for dk (--matmul burn)
#   xa   the same for the whole self-attention as two operations each way, its projections'
#        group and its context (ASRT_ATTENTION_OP=0; one operation each way by default,
#        model::device_self_attention)
#   xn   the same for each residual connection and the normalisation after it as two nodes, two
#        operations backward, and each feed-forward module, self-attention and convolution
#        chain as their own operations each way before them, the block's first normalisation
#        as its own (ASRT_RESIDUAL_NORM_OP=0; one node, one operation each way by default,
#        model::device_residual_norm, model::device_feed_forward,
#        model::device_attention_module, model::device_conv_residual)
#   db   d's plan in bf16-mixed, run twice so that the second run finds its kernels compiled:
#        compare with dw (ASRT_DB_PRECISION; a dry run trains on the CPU, through burn-flex)
#   d2   the same at a larger batch (ASRT_D2_BATCH_SECONDS, default 360 s of audio): how the step
#        time scales with the batch
#   mm   the matmul kernels of `asrt train --matmul` (cubek's strategies, those in mm_kernels)
#        at the 0.6B preset's linear products, forward and both gradients' forms: time,
#        TFLOP/s, error against float64, the fastest correct one (asrt-bench matmul); then
#        PyTorch's product (cuBLAS, TF32) at the same cases where torch is (bench/matmul_peer.py)
#   ma   the attention's stacks of products (`[B, H, m, k] · [B or 1, H, k, n]`, forward and
#        gradients' forms) with Burn's product and cuBLAS's strided-batched calls, as
#        `--matmul cublas` takes them, and PyTorch's (asrt-bench matmul --sizes attention)
#   dm   dw with mm's fastest correct kernel other than Burn's (`--matmul`), run twice (the
#        first compiles it)
#   dc   where dm trained with `cublas`: dm's run again with ASRT_CUBLAS_WAIT=1 (each product
#        waits for its call on CubeCL's device thread): what not waiting gains; else skipped
#   ds   where dm trained with `cublas`: dm's run again with ASRT_CUBLAS_STACKS=1 (the
#        attention's stacks of products through cuBLAS's strided-batched calls, not Burn's
#        kernel, the default): what cuBLAS would gain on them; else skipped
#   mb   mm with mixed precision's operands, bf16 in and f32 out (`--operands bf16`), and
#        PyTorch's product on the same bf16 operands
#   bm   db with mb's fastest correct kernel other than Burn's for the linear layers' products,
#        run twice
#   e    the same shape and batch size in PyTorch: transformers' ParakeetForTDT in f32, TF32 and
#        bf16 autocast, with its TDT loss and with a log-softmax in its place (bench/peer_step.py);
#        d over e is the headline figure (ASRT_PEER_RUNS picks the runs; e runs right after dp)
#   f    out of memory: a huge max_batch_seconds must stop cleanly naming the batch, then a run
#        at the suggested value
#   g    (runs right after env: it takes seconds) refusals: a device listed twice, an ordinal
#        the machine lacks; NCCL at world size 1, the in-process all-reduce and the cudarc
#        communicator (asrt-bench nccl-check)
# Results: $OUT/results.json and $OUT/results.md (the summary table, last), $OUT/logs.tar.gz
# (every step's log and output), at most 8 files in all.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"

kit=gpu-kit
out="${OUT:-}"
dry=0
only=""
budget=1500
cap=0
keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --kit) kit="$2"; shift ;;
    --out) out="$2"; shift ;;
    --only) only="$2"; shift ;;
    --budget) budget="$2"; shift ;;
    --cap) cap="$2"; shift ;;
    --work) keep="$2"; shift ;;
    --short)
      # The first call: the checks (env, g, cg), the default step (dw) against PyTorch's (e),
      # and fusion against none (xu): the step is bound by the host, where fusion's thread may
      # cost more than its few saved launches. The products' kernels (mm, mb, ma, dm, dc, ds)
      # were measured on the last loan and c, dr, dp, db on earlier ones (bench/RESULTS.md); cg
      # checks c's gradients.
      only="env,g,cg,d,dw,e,xu"; budget=560; cap=260
      export ASRT_PEER_RUNS="${ASRT_PEER_RUNS:-tf32+softmax-loss,bf16+softmax-loss}" ;;
    -h|--help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || out=out/gpu
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ -n "$keep" ]; then
  mkdir -p "$keep"
  work="$(cd "$keep" && pwd)"
  # What a later call reuses (see --work above); the rest is this call's to write.
  find "$work" -mindepth 1 -maxdepth 1 ! -name kernel-cache ! -name '*.asrcorpus' \
    ! -name parakeet.toml ! -name d-shape.json ! -name mm.json ! -name dm.kernel -exec rm -rf {} +
  echo "run.sh: working in $work (kept: $(cd "$work" && ls | tr '\n' ' '))"
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/asrt-gpu.XXXXXX")"
fi
logs="$work/logs"
mkdir -p "$logs"
records="$work/records.tsv"
: > "$records"
started=$(date +%s)

say() { printf '%s\n' "$*" | tee -a "$logs/run.log"; }

# The Python that has torch and transformers: $ASRT_PEER_PYTHON, else the first of python3, the
# active venv's, this machine's cached venv of the optional PyTorch tests (README, Development) and
# the usual venv places that imports both.
peer_python="${ASRT_PEER_PYTHON:-}"
if [ -z "$peer_python" ]; then
  peer_python=python3
  for p in python3 ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$HOME/.cache/asr-torch-venv/bin/python" \
      /opt/venv/bin/python /venv/bin/python "$HOME/.venv/bin/python" "$HOME/venv/bin/python" \
      /opt/*/bin/python /workspace/*/bin/python /root/*/bin/python \
      $(find / -maxdepth 5 -path /proc -prune -o -path '*/bin/python3' -print 2>/dev/null | head -n 20); do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, transformers' >/dev/null 2>&1; then
      peer_python="$p"; break
    fi
  done
fi

# --- environment ---------------------------------------------------------------------------
if [ "$dry" = 1 ]; then
  # The kernels and the out-of-memory path on wgpu (lavapipe binds at most 128 MiB per buffer);
  # training steps on the CPU, where they take a fraction of a second.
  dev=wgpu
  train_dev=cpu
  sizes=small
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
  # The test-profile binaries, with `asrt` started as the kit starts it (below).
  bin="$work/bin"
  mkdir -p "$bin"
  for b in asrc asrt-bench make-synthetic-corpus; do ln -sfn "$CARGO_TARGET_DIR/debug/$b" "$bin/$b"; done
  corpus="$work/espeak.asrcorpus"
  "$bin/asrc" compile examples/espeak/manifest.parquet --tokenizer examples/espeak/spm.model \
    -o "$corpus" --max-reject-fraction 0.5 > "$logs/compile.log" 2>&1 \
    || { cat "$logs/compile.log"; echo "run.sh: the dry run needs the test-profile binaries (cargo build --workspace --bins)" >&2; exit 2; }
  reference=""
  train_steps=3
  # Mesa's software Vulkan has no XDG runtime directory to complain about.
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work}"
else
  dev=cuda:0
  train_dev=cuda:0
  sizes=parakeet
  [ -d "$kit/bin" ] || { echo "run.sh: no $kit/bin: build the kit with scripts/gpu/bundle.sh and carry it" >&2; exit 2; }
  bin="$work/bin"
  mkdir -p "$bin"
  for f in "$kit"/bin/*.xz; do
    b="$(basename "$f" .xz)"
    if command -v xz >/dev/null; then xz -dc "$f" > "$bin/$b"; else
      python3 -c 'import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" > "$bin/$b"; fi
    chmod +x "$bin/$b"
  done
  corpus="$kit/data/espeak.asrcorpus"
  reference="$kit/reference/metrics.jsonl"
  train_steps=40
  # The toolkit's headers (kernels include them) and its libraries first: its NVRTC matches the
  # driver, a newer one (pip's) would write PTX the driver refuses.
  if [ -z "${CUDA_PATH:-}" ]; then
    for d in /usr/local/cuda /usr/local/cuda-13.0 /opt/cuda; do
      [ -f "$d/include/cuda_runtime.h" ] && { export CUDA_PATH="$d"; break; }
    done
  fi
  libpath="${CUDA_PATH:+$CUDA_PATH/lib64}"
  # NCCL and NVRTC from the Python environment's NVIDIA wheels, after the toolkit's.
  py_nvidia="$("$peer_python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + "/nvidia")' 2>/dev/null || true)"
  if [ -n "$py_nvidia" ] && [ -d "$py_nvidia" ]; then
    for d in "$py_nvidia"/nccl/lib "$py_nvidia"/cu13/lib "$py_nvidia"/cuda_nvrtc/lib; do
      [ -d "$d" ] && libpath="$libpath:$d"
    done
  fi
  export LD_LIBRARY_PATH="${libpath#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The kit carries asrt-bench alone (the two binaries share most of their code, and a call
# carries 64 MiB): started under the name asrt, it is asrt. The dry run starts it the same way.
ln -sfn asrt-bench "$bin/asrt"
export ASRT_KERNEL_CACHE="$work/kernel-cache"
# perf for hp: the kit's copy (bundle.sh packs the build machine's perf with its libraries and
# loader, as the GPU machine has none), run through that loader; else one on the PATH.
perf_cmd=""
if [ -f "$kit/perf.tar.xz" ] && [ "$dry" != 1 ]; then
  mkdir -p "$work/perf-kit" && tar -C "$work/perf-kit" -xJf "$kit/perf.tar.xz" 2>/dev/null \
    && perf_cmd="$work/perf-kit/perf/lib/ld-linux-x86-64.so.2 --library-path $work/perf-kit/perf/lib $work/perf-kit/perf/perf"
fi
[ -z "$perf_cmd" ] && command -v perf >/dev/null && perf_cmd=perf
# Backtraces for panics (a bug to fix), not for errors (messages that already say what is wrong).
export RUST_BACKTRACE=1 RUST_LIB_BACKTRACE=0

# record NAME VERDICT SECONDS NOTE
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$records"; say "[$1] $2 ($3 s): $4"; }

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# run_step NAME TIMEOUT COMMAND...: runs the command with its output in logs/NAME.log; the step's
# checker (check_NAME, reading that log and $work) gives the verdict.
run_step() {
  local name="$1" limit="$2"; shift 2
  wanted "$name" || return 0
  local left=$(( budget - ($(date +%s) - started) ))
  if [ "$left" -lt 30 ]; then record "$name" skipped 0 "out of time (--budget $budget)"; return 0; fi
  [ "$limit" -gt "$left" ] && limit=$left
  [ "$cap" -gt 0 ] && [ "$limit" -gt "$cap" ] && limit=$cap
  say "== step $name (timeout ${limit} s): $*"
  local t0; t0=$(date +%s.%N)
  if declare -F "$1" > /dev/null; then
    # A step written as a function of this script: timeout runs programs, so a child bash
    # runs it (the functions and variables it needs are exported below).
    timeout --kill-after=10 "$limit" bash -c '"$0" "$@"' "$@" > "$logs/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" > "$logs/$name.log" 2>&1
  fi
  local rc=$?
  local secs; secs=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" TIMEOUT "$secs" "killed after $limit s; last lines: $(tail -n 3 "$logs/$name.log" | tr '\n' ' ')"
    return 0
  fi
  local verdict
  verdict="$("check_$name" "$rc" 2>>"$logs/$name.log")"
  record "$name" "${verdict%%:*}" "$secs" "${verdict#*: }"
}

# Each checker prints "VERDICT: one line".
py() { python3 "$repo/scripts/gpu/check.py" "$@"; }

# --- steps ---------------------------------------------------------------------------------
step_env() {
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat "$kit/commit" 2>/dev/null || git -C "$repo" rev-parse HEAD 2>/dev/null)"
  echo "CUDA_PATH=${CUDA_PATH:-}"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  # The host's CPU: with the launches of a step on one thread, its speed may bound the step.
  grep -m1 '^model name' /proc/cpuinfo 2>/dev/null || true
  for t in nsys ncu perf; do command -v "$t" >/dev/null && echo "profiler: $t at $(command -v "$t")"; done
  nvidia-smi 2>&1 | head -n 15 || true
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  for lib in libcuda.so.1 libnvrtc.so libnvrtc.so.13 libnccl.so libnccl.so.2 libcublas.so.13; do
    python3 -c 'import ctypes,sys; ctypes.CDLL(sys.argv[1]); print("loads:", sys.argv[1])' "$lib" 2>/dev/null \
      || echo "does not load: $lib"
  done
  echo "peer python: $peer_python"
  "$peer_python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 || true
  "$peer_python" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 || true
  nproc
}
check_env() {
  if [ "$1" -ne 0 ]; then echo "FAIL: exit $1"; return; fi
  local gpu; gpu="$(grep -m1 -A1 '^name, memory.total' "$logs/env.log" | tail -n 1)"
  echo "PASS: ${gpu:-no nvidia-smi}; $(grep -m1 '^torch' "$logs/env.log")"
}

check_a() { py tdt-check "$1" "$logs/a.log" "$work/a.json"; }
check_b() { py tdt-peer "$1" "$logs/b.log" "$work/b.json" "$work/a.json"; }

step_c() {
  local cfg=examples/espeak/train.toml
  # From the reference's starting weights when the kit has them (see bundle.sh).
  local init=()
  [ -n "$reference" ] && [ -d "$(dirname "$reference")/init" ] && init=(--init "$(dirname "$reference")/init")
  "$bin/asrt" train "$corpus" --config "$cfg" --out "$work/c-run" --device "$train_dev" \
    --max-steps "$train_steps" "${init[@]}" || return $?
  "$bin/asrt" eval "$corpus" --checkpoint "$work/c-run" --device "$train_dev" --json > "$work/c-eval.json" || return $?
  # Again, with the kernel cache warm.
  "$bin/asrt" train "$corpus" --config "$cfg" --out "$work/c-run2" --device "$train_dev" \
    --max-steps 3 || return $?
  ls -R "$ASRT_KERNEL_CACHE" 2>/dev/null | head -n 20
}
check_c() { py train-tiny "$1" "$logs/c.log" "$work" "${reference:-none}"; }

# Three steps of c from the reference's weights on the CPU, fused on the device and with
# --fusion off, each writing every parameter's gradient norm per step (ASRT_GRAD_NORMS): each
# step's global norm against the CPU reference's, and the parameters whose norms differ most
# from the CPU run's. On an H200 (2026-11-28) c's norm was 1 % off at step 1 and twice the
# reference's at step 2, where lavapipe's is within 1e-3: which parameter, and which side of
# fusion.
step_cg() {
  local cfg=examples/espeak/train.toml init
  if [ -n "$reference" ] && [ -d "$(dirname "$reference")/init" ]; then
    init="$(dirname "$reference")/init"
  else
    # A dry run has no bundled start: one CPU step makes one.
    "$bin/asrt" train "$corpus" --config "$cfg" --out "$work/cg-init" --device cpu --max-steps 1 \
      --quiet || return $?
    init="$work/cg-init/checkpoints/step-00000001"
  fi
  ASRT_GRAD_NORMS="$work/cg-cpu.jsonl" "$bin/asrt" train "$corpus" --config "$cfg" \
    --out "$work/cg-cpu" --device cpu --max-steps 3 --init "$init" || return $?
  # On the kernels' device: CUDA, or lavapipe in a dry run (3 steps of tiny take seconds there).
  ASRT_POISON_BUFFERS=0 ASRT_GRAD_NORMS="$work/cg-fused.jsonl" "$bin/asrt" train "$corpus" \
    --config "$cfg" --out "$work/cg-fused" --device "$dev" --max-steps 3 --init "$init" || return $?
  ASRT_GRAD_NORMS="$work/cg-unfused.jsonl" "$bin/asrt" train "$corpus" --config "$cfg" \
    --out "$work/cg-unfused" --device "$dev" --max-steps 3 --fusion off --init "$init" || return $?
  # The fused run with every linear layer's product and its gradients by cubek's plain unit
  # kernel (no tensor cores, no TF32, not autotuned) in place of Burn's autotuned product: on
  # lavapipe the same kernel as Burn's, so the same bits; on CUDA, where this run alone agrees
  # with the CPU's, the products are the cause.
  ASRT_GRAD_NORMS="$work/cg-unit.jsonl" "$bin/asrt" train "$corpus" --config "$cfg" \
    --out "$work/cg-unit" --device "$dev" --max-steps 3 --matmul simple-unit --init "$init" \
    || return $?
  # The fused run with cubek's simple cyclic CMMA kernel for those products: the kernel Burn's
  # unfused product runs on CUDA (TF32 tensor cores for f32), but written to a dense buffer of
  # the trainer's, where Burn's own product writes rows padded to CUDA's pitch (a row of 96 f32
  # takes 128) and fusion then reads them. Agreeing with the CPU's where the fused run does not
  # puts the cause in the padded layout, not in the product's arithmetic. (Lavapipe has no CMMA:
  # it falls back to Burn's product, so the fused run's bits.)
  ASRT_GRAD_NORMS="$work/cg-dense.jsonl" "$bin/asrt" train "$corpus" --config "$cfg" \
    --out "$work/cg-dense" --device "$dev" --max-steps 3 --matmul simple-cyclic-cmma --init "$init" \
    || return $?
  # The fused run again with the trainer's kernels' new buffers filled with NaN
  # (device_op::poisoned; the fused run above is without): the
  # same bits as the fused run unless a kernel reads an element no kernel wrote, which then
  # shows as NaN instead of whatever the memory pool held.
  ASRT_POISON_BUFFERS=1 ASRT_GRAD_NORMS="$work/cg-poisoned.jsonl" "$bin/asrt" train "$corpus" \
    --config "$cfg" --out "$work/cg-poisoned" --device "$dev" --max-steps 3 --init "$init" || return $?
  # The fused run with cuBLAS's products (`--matmul cublas`, TF32 as Burn's CUDA kernels): a
  # library call on CubeCL's stream, which this run checks in training, fused, where an ordering
  # fault would show as norms far from the CPU run's. Last, and its failure only said: the
  # verdict then finds no figures for it, and keeps the other runs'. (Lavapipe: cuBLAS runs on
  # CUDA only, so Burn's product and the fused run's bits.)
  ASRT_GRAD_NORMS="$work/cg-cublas.jsonl" "$bin/asrt" train "$corpus" --config "$cfg" \
    --out "$work/cg-cublas" --device "$dev" --max-steps 3 --matmul cublas --init "$init" \
    || echo "cg: the cublas run exited $?"
}
check_cg() { py grad-norms "$1" "$logs/cg.log" "$work"; }

# big_config FILE MAX_BATCH_SECONDS: the 0.6B preset (in a dry run its structure at a CPU's size).
big_config() {
  if [ "$dry" = 1 ]; then
    printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nn_layers = 1\nd_model = 64\nn_heads = 2\nff_dim = 128\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 1\n[model.joint]\njoint_hidden = 32\n' > "$1"
  else
    printf 'preset = "parakeet-tdt-0.6b"\n' > "$1"
  fi
  printf '[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = %s\n' "$2" >> "$1"
}

# Synthetic utterances of 5-20 s (tones and noise, random token ids of a 1024-piece vocabulary).
long_corpus() {
  [ -f "$work/long.asrcorpus" ] && return 0
  "$bin/make-synthetic-corpus" "$work/long.asrcorpus" --utterances "$([ "$dry" = 1 ] && echo 12 || echo 96)" \
    --vocab 1024 --min-seconds 5 --max-seconds 20 --max-tokens 80
}

# measured NAME COMMAND...: runs the command while nvidia-smi samples the device's memory and
# utilisation into $work/NAME-memory.csv (check.py's peak), where there is an nvidia-smi, and
# threads.py samples the process's threads' CPU time into $work/NAME-threads.jsonl, aligned with
# the steps of $work/NAME-run (check.py: each thread's busy share over the steady steps, and the
# GPU's utilisation over the same samples: is the step bound by the host or by the device?).
measured() {
  local name="$1" smi="" pid sampler rc; shift
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -lms 250 \
      > "$work/$name-memory.csv" 2>/dev/null &
    smi=$!
  fi
  "$@" &
  pid=$!
  python3 "$repo/scripts/gpu/threads.py" sample "$pid" "$work/$name-threads.jsonl" \
    --metrics "$work/$name-run/metrics.jsonl" --smi "$work/$name-memory.csv" &
  sampler=$!
  wait "$pid"
  rc=$?
  wait "$sampler" 2>/dev/null
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  return $rc
}

# d's corpus, configuration and the preset's parameter count (for the FLOPs of a step; check.py
# says how they are counted), made once by whichever of d, du and db runs first.
big_setup() {
  long_corpus || return $?
  [ -f "$work/parakeet.toml" ] || big_config "$work/parakeet.toml" "$([ "$dry" = 1 ] && echo 30.0 || echo 120.0)"
  # (Not in a dry run, whose model is the preset's structure at a small width.)
  [ "$dry" = 1 ] || [ -f "$work/d-shape.json" ] || "$bin/asrt-bench" model-shape \
    --preset parakeet-tdt-0.6b --seconds 1 --repeats 1 > "$work/d-shape.json" || true
}

step_d() {
  big_setup || return $?
  # With CubeCL's memory log: which of the pool's page sizes the reserved bytes are in, and for
  # which buffer sizes (pool_summary.py; d is the cold run, so the log costs no steady figure).
  # The dry run trains d on lavapipe, where there is a pool to log (dw and the others on the CPU).
  local ddev="$train_dev"
  [ "$dry" = 1 ] && ddev="$dev"
  rm -f "$work/d-memory.log" "$work/d-pool.json"
  ASRT_MEMORY_LOG="$work/d-memory.log" measured d "$bin/asrt" train "$work/long.asrcorpus" \
    --config "$work/parakeet.toml" --out "$work/d-run" \
    --device "$ddev" --max-steps "$([ "$dry" = 1 ] && echo 2 || echo 6)" || return $?
  python3 "$repo/scripts/gpu/pool_summary.py" "$work/d-memory.log" --json "$work/d-pool.json" || return $?
  rm -f "$work/d-memory.log"
}
check_d() { py train-big "$1" "$logs/d.log" "$work"; }

# d again, with the kernel cache d left: the same plan, so the same shapes. CubeCL compiles a
# kernel for each new shape; on an H200 d's steps took 3.4 s with compilation against 1.3 s
# without, so the steady step time is this step's.
step_dw() { warm_run dw "$train_dev"; }
# warm_run NAME DEVICE [ARGS...]: d's plan again on DEVICE, measured as NAME, with the kernels d
# compiled (and asrt train's further ARGS).
warm_run() {
  [ -f "$work/parakeet.toml" ] || { echo "$1 runs after d (it reuses d's corpus, configuration and kernels)"; return 2; }
  local name="$1" wdev="$2"
  shift 2
  measured "$name" "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/$name-run" \
    --device "$wdev" --max-steps "$([ "$dry" = 1 ] && echo 2 || echo 6)" "$@"
}
check_dw() { py train-big "$1" "$logs/dw.log" "$work" dw; }

# dw with Burn's product (`--matmul burn`), the default on CUDA before cuBLAS's (an H200's step:
# 0.290 s against 0.205 s with cuBLAS, bench/RESULTS.md, 2026-11-30 evening): the A/B for the
# default. Run twice, as dm is: d trained with cuBLAS, so the first run (dk0) compiles Burn's
# product kernels for d's shapes.
step_dk() {
  [ "$dry" = 1 ] || warm_run dk0 "$train_dev" --matmul burn --quiet || return $?
  warm_run dk "$train_dev" --matmul burn
}
check_dk() { py train-big "$1" "$logs/dk.log" "$work" dk; }

# dw with the trainer's own operations resolved on the training thread (ASRT_FUSION_QUEUE=0,
# asr_tdt::fusion::in_stream) instead of queued in fusion's stream, the default since an H200's
# step took 0.343 s queued against 0.426 s resolved (bench/RESULTS.md, 2026-11-30; queued was
# 7-10 % slower on lavapipe, where the device shares 2 cores): the A/B kept in every run.
step_dr() {
  # The dry run's dw trains on the CPU, which has no fusion: lavapipe instead.
  ASRT_FUSION_QUEUE=0 warm_run dr "$([ "$dry" = 1 ] && echo "$dev" || echo "$train_dev")"
}
check_dr() { py train-big "$1" "$logs/dr.log" "$work" dr; }

# dw without train::graph_join (ASRT_GRAPH_JOIN=0): Burn's autodiff then merges each
# parameter's graph into the forward's at its first use, which moved the whole forward graph
# about half the time and took most of the training thread's own work on lavapipe.
step_dj() { ASRT_GRAPH_JOIN=0 warm_run dj "$train_dev"; }
check_dj() { py train-big "$1" "$logs/dj.log" "$work" dj; }

# alternate NAME WARMUP ENV ARGS...: dw's run (the default, "a") and a variant ("b": asrt train
# with the environment assignments ENV, e.g. "ASRT_GRAPH_JOIN=0" or "", and ARGS) alternated,
# a b a b, as NAMEa1, NAMEb1, NAMEa2, NAMEb2. One configuration's runs spread about 10 % on an
# H200 (bench/RESULTS.md, 2026-11-30 evening), and single runs could not rank variants closer
# than that: check.py compares each of steps 3-6 of a variant's run with the same step (the
# same batch shape) of the default's run beside it, over both rounds. With WARMUP 1 the variant
# first runs once unmeasured (NAMEb0): its kernels are not the ones d compiled.
alternate() {
  local name="$1" warmup="$2" envs="$3" r
  shift 3
  [ -f "$work/parakeet.toml" ] || { echo "$name runs after d (it reuses d's corpus, configuration and kernels)"; return 2; }
  # variant RUN [ARGS...]: warm_run of the variant's run RUN, under its environment.
  variant() { local run="$1"; shift; env $envs bash -c '"$0" "$@"' warm_run "$run" "$train_dev" "$@"; }
  if [ "$warmup" = 1 ] && [ "$dry" != 1 ]; then
    variant "${name}b0" --quiet "$@" || return $?
  fi
  for r in 1 2; do
    warm_run "${name}a$r" "$train_dev" || return $?
    variant "${name}b$r" "$@" || return $?
  done
}
# The alternated A/Bs of the default (dw) against: --fusion off (xu), the loss read before the
# backward is queued (xl), no graph join (xj), Burn's product (xk), the attention as its two
# operations (xa), the residual connections and their normalisations as two nodes (xn).
step_xu() { alternate xu 1 "" --fusion off; }
check_xu() { py train-ab "$1" "$logs/xu.log" "$work" xu "--fusion off"; }
step_xl() { alternate xl 0 "ASRT_LOSS_READ=forward"; }
check_xl() { py train-ab "$1" "$logs/xl.log" "$work" xl "ASRT_LOSS_READ=forward"; }
step_xj() { alternate xj 0 "ASRT_GRAPH_JOIN=0"; }
check_xj() { py train-ab "$1" "$logs/xj.log" "$work" xj "ASRT_GRAPH_JOIN=0"; }
step_xk() { alternate xk 1 "" --matmul burn; }
check_xk() { py train-ab "$1" "$logs/xk.log" "$work" xk "--matmul burn"; }
step_xa() { alternate xa 0 "ASRT_ATTENTION_OP=0"; }
check_xa() { py train-ab "$1" "$logs/xa.log" "$work" xa "ASRT_ATTENTION_OP=0"; }
step_xn() { alternate xn 0 "ASRT_RESIDUAL_NORM_OP=0"; }
check_xn() { py train-ab "$1" "$logs/xn.log" "$work" xn "ASRT_RESIDUAL_NORM_OP=0"; }

# dw's run profiled: CubeCL logs every launch with its device time. The first steps of the
# two runs are the same batches, so 3 steps less 1 is two steady steps (their kernels compiled
# by d, or here in the 1-step run for the dry run's wgpu).
step_dp() {
  [ -f "$work/parakeet.toml" ] || { echo "dp runs after d (it reuses d's corpus, configuration and kernels)"; return 2; }
  local pdev="$train_dev" n
  # The dry run trains on the CPU, which CubeCL does not profile.
  [ "$dry" = 1 ] && pdev="$dev"
  for n in 1 3; do
    CUBECL_DEBUG_LOG="$work/dp$n-profile.log" "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" \
      --out "$work/dp$n-run" --device "$pdev" --max-steps "$n" --quiet || return $?
  done
  python3 "$repo/scripts/gpu/profile_summary.py" "$work/dp3-profile.log" --minus "$work/dp1-profile.log" \
    --steps 2 --json "$work/dp.json"
  local rc=$?
  rm -f "$work"/dp?-profile.log
  return $rc
}
check_dp() { py profile "$1" "$logs/dp.log" "$work" "$dry"; }

# dw's run under perf from its third step on (the first compiles what the cache lacks and
# allocates the pool's pages): samples of every thread of the process, each classed as work or
# as spinning on CubeCL's task rings (host_profile.py). Exit 3: no perf, or it cannot attach.
hp_freq=499
step_hp() {
  [ -f "$work/parakeet.toml" ] || { echo "hp runs after d (it reuses d's corpus, configuration and kernels)"; return 2; }
  [ -n "$perf_cmd" ] || { echo "no perf: neither the kit's (bundle.sh packs it when the build machine has one) nor on the PATH"; return 3; }
  # Whether perf may sample here at all (containers often forbid perf_event_open).
  $perf_cmd record -F "$hp_freq" -e cpu-clock -o "$work/hp-probe.data" -- true > "$work/hp-probe.log" 2>&1 \
    || { echo "perf cannot sample here: $(tail -n 2 "$work/hp-probe.log" | tr '\n' ' ')"; return 3; }
  # d's 6 steps, whose shapes d compiled: past them each new batch shape compiles kernels,
  # and NVRTC took the device thread's samples (an H200 run of 8 steps, 2026-11-30 evening).
  local pdev="$train_dev" steps=6 from=2 pid perf rc
  [ "$dry" = 1 ] && { pdev="$dev"; steps=4; }
  rm -rf "$work/hp-run"
  "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/hp-run" \
    --device "$pdev" --max-steps "$steps" --quiet &
  pid=$!
  # Wait for step $from's line, then record until the run ends.
  while kill -0 "$pid" 2>/dev/null && [ "$(cat "$work/hp-run/metrics.jsonl" 2>/dev/null | wc -l)" -lt "$from" ]; do
    sleep 0.05
  done
  $perf_cmd record -F "$hp_freq" -e cpu-clock -o "$work/hp.data" -p "$pid" > "$work/hp-record.log" 2>&1 &
  perf=$!
  wait "$pid"; rc=$?
  wait "$perf"
  [ "$rc" -eq 0 ] || { echo "the run failed (exit $rc)"; return "$rc"; }
  local done_steps; done_steps=$(wc -l < "$work/hp-run/metrics.jsonl")
  # The samples with the code's mappings, not perf report's symbols: host_profile.py tells the
  # rings' spin by the `pause` before a sample, wherever the build inlined it.
  $perf_cmd script -i "$work/hp.data" --show-mmap-events -G -F comm,tid,ip,sym,symoff,dso \
    > "$work/hp-script.txt" 2> "$work/hp-report.log" || { cat "$work/hp-report.log"; return 1; }
  python3 "$repo/scripts/gpu/host_profile.py" --script "$work/hp-script.txt" --frequency "$hp_freq" \
    --steps "$((done_steps - from))" --json "$work/hp.json"
  local prc=$?
  rm -f "$work/hp.data" "$work/hp-probe.data"
  return $prc
}
check_hp() { py host-profile "$1" "$logs/hp.log" "$work"; }

# The matmul kernels of `asrt train --matmul` at the 0.6B preset's linear products (cubek's
# strategies, bare): time, TFLOP/s, error against float64, the fastest correct (mm.json).
# Not every kernel (each costs its compilations, about 7 s each on an H200, in a call of
# minutes): Burn's; cuBLAS (`cublas`, the default on CUDA: on an H200, 0.23 ms over the five
# cases, 3.4x faster than the fastest cubek kernel, double-tma-mma, at 0.77 ms; bench/RESULTS.md, 2026-11-30
# evening); and the three cubek kernels that came nearest it (TMA-loaded, one warp-specialised).
# ASRT_MM_KERNELS overrides the list; "all" times every kernel.
mm_kernels="burn,cublas,double-tma-mma,double-tma-mma-specialized,specialized-tma-mma"
# matmul_kernels OPERANDS: asrt-bench matmul over mm_kernels with operands of that type.
matmul_kernels() {
  local list=(--kernels "${ASRT_MM_KERNELS:-$mm_kernels}")
  # A dry run times them all: lavapipe has no tensor cores, and runs only the unit kernels.
  { [ "${ASRT_MM_KERNELS:-}" = all ] || [ "$dry" = 1 ]; } && list=()
  "$bin/asrt-bench" matmul --device "$dev" --sizes "$sizes" --repeats 5 --operands "$1" "${list[@]}"
}
# matmul_peer OPERANDS NAME [SIZES]: PyTorch's product (cuBLAS on CUDA) at the cases of NAME.json
# (bench/matmul_peer.py, into NAME-peer.json) where torch is: what the device's own library
# reaches on the same products. The step's verdict stays its kernels'; a peer that cannot run
# says why in the step's log, and check.py says it was not timed.
matmul_peer() {
  local pdev=cuda
  [ "$dry" = 1 ] && pdev=cpu
  "$peer_python" bench/matmul_peer.py --sizes "${3:-$sizes}" --operands "$1" --device "$pdev" \
    --check "$work/$2.json" --json-out "$work/$2-peer.json"
  echo "matmul peer: exit $?"
}
# without_cublas OPERANDS NAME: NAME.json again without cublas, after asrt-bench failed with it
# in the list (its JSON comes at the end, so a crash in cuBLAS's call would lose every kernel's
# timings, and dm's and bm's kernel with them). The kernels compiled before are in the cache.
without_cublas() {
  local rc=$?
  # "all" names no list to take cublas out of.
  [ "${ASRT_MM_KERNELS:-}" = all ] && return $rc
  echo "$2: asrt-bench matmul exited $rc with cublas in the list; again without it"
  ASRT_MM_KERNELS="$(echo "${ASRT_MM_KERNELS:-$mm_kernels}" | tr ',' '\n' | grep -vx cublas | paste -sd,)" \
    matmul_kernels "$1" > "$work/$2.json"
}
step_mm() {
  matmul_kernels f32 > "$work/mm.json" || without_cublas f32 mm || return $?
  matmul_peer f32 mm
}
check_mm() { py matmul "$1" "$logs/mm.log" "$work" mm; }

# The attention's stacks of products (asrt-bench matmul --sizes attention): Burn's product and
# cuBLAS's strided-batched calls, as `--matmul cublas` takes them, and PyTorch's (ma.json).
step_ma() {
  local asizes=attention
  [ "$dry" = 1 ] && asizes=attention-small
  "$bin/asrt-bench" matmul --device "$dev" --sizes "$asizes" --repeats 5 --operands f32 \
    --kernels burn,cublas > "$work/ma.json" || return $?
  matmul_peer f32 ma "$asizes"
}
check_ma() { py matmul "$1" "$logs/ma.log" "$work" ma; }

# mm with mixed precision's operands: bf16 in, f32 out (f16 on a dry run: lavapipe has no
# bfloat16).
step_mb() {
  local operands=bf16
  [ "$dry" = 1 ] && operands=f16
  matmul_kernels "$operands" > "$work/mb.json" || without_cublas "$operands" mb || return $?
  matmul_peer "$operands" mb
}
check_mb() { py matmul "$1" "$logs/mb.log" "$work" mb; }

# fastest_kernel FILE [EXCLUDED]: the fastest correct kernel other than Burn's (and EXCLUDED) in
# an asrt-bench matmul JSON.
fastest_kernel() {
  python3 -c '
import json, sys
t = [x for x in json.load(open(sys.argv[1]))["totals"]
     if x["kernel"] not in ("burn", sys.argv[2]) and x["total_seconds"]]
print(min(t, key=lambda x: x["total_seconds"])["kernel"] if t else "")' "$1" "${2:-}" 2>/dev/null
}

# with_fastest NAME SOURCE DEVICE [ARGS...]: d's plan with SOURCE's (mm's or mb's) fastest correct
# kernel other than Burn's for the linear layers (`--matmul`), twice as db is: its kernels are
# new to the cache (the first run compiles them, the second, NAME's, is the steady figure). A dry
# run checks the flag's path once: lavapipe compiles as it goes.
with_fastest() {
  local name="$1" source="$2" mdev="$3" k steps="$([ "$dry" = 1 ] && echo 2 || echo 6)"
  shift 3
  k="$(fastest_kernel "$work/$source.json")"
  [ -n "$k" ] || { echo "$name runs after $source (it trains with $source's fastest correct kernel); $source found none"; return 2; }
  local rc
  while :; do
    echo "kernel: $k"
    rc=0
    [ "$dry" = 1 ] || "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" \
      --out "$work/${name}0-run" --device "$mdev" --max-steps "$steps" --matmul "$k" "$@" || rc=$?
    [ "$rc" = 0 ] && break
    # cuBLAS is a library call on CubeCL's stream, new to training on a GPU: where it fails,
    # the step still measures cubek's fastest.
    [ "$k" = cublas ] || return $rc
    k="$(fastest_kernel "$work/$source.json" cublas)"
    echo "$name with cublas exited $rc; again with the fastest other kernel: ${k:-none}"
    [ -n "$k" ] || return $rc
  done
  echo "$k" > "$work/$name.kernel"
  measured "$name" "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" \
    --out "$work/$name-run" --device "$mdev" --max-steps "$steps" --matmul "$k" "$@"
}

# dw with mm's fastest kernel. The dry run trains on the CPU, which has no CubeCL kernels:
# lavapipe instead.
step_dm() {
  big_setup || return $?
  with_fastest dm mm "$([ "$dry" = 1 ] && echo "$dev" || echo "$train_dev")"
}
check_dm() { py train-big "$1" "$logs/dm.log" "$work" dm; }

# cublas_variant NAME VAR=VALUE: dm's cuBLAS run again with VAR=VALUE set, only where dm
# trained with cublas, whose kernels are then compiled, so it runs once; exit 3 otherwise.
cublas_variant() {
  big_setup || return $?
  local k; k="$(cat "$work/dm.kernel" 2>/dev/null)"
  [ "$k" = cublas ] || { echo "$1 is an A/B of dm's cuBLAS run; dm trained with ${k:-nothing}"; return 3; }
  measured "$1" env "$2" "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" \
    --out "$work/$1-run" --device "$([ "$dry" = 1 ] && echo "$dev" || echo "$train_dev")" \
    --max-steps "$([ "$dry" = 1 ] && echo 2 || echo 6)" --matmul cublas
}
# dm's cuBLAS run with every product waiting for its call (one round trip to CubeCL's device
# thread each): the A/B for queuing them.
step_dc() { cublas_variant dc ASRT_CUBLAS_WAIT=1; }
# dm's cuBLAS run with the attention's stacks of products through cuBLAS's strided-batched
# calls (opt-in: an H200's step was as fast or faster with Burn's kernel for them, the
# default since; bench/RESULTS.md, 2026-11-30 evening): the A/B kept for the next loan.
step_ds() { cublas_variant ds ASRT_CUBLAS_STACKS=1; }
check_skippable() {
  if [ "$1" = 3 ]; then echo "SKIPPED: $(tail -n 1 "$logs/$2.log")"; else py train-big "$1" "$logs/$2.log" "$work" "$2"; fi
}
check_dc() { check_skippable "$1" dc; }
check_ds() { check_skippable "$1" ds; }

# dw without fusion: each tensor operation its own kernel, as every run before fusion was. Run
# twice, as db is: the unfused kernels are not in the cache d left.
step_du() {
  big_setup || return $?
  local steps="$([ "$dry" = 1 ] && echo 2 || echo 6)"
  "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/du0-run" \
    --device "$train_dev" --max-steps "$steps" --fusion off --quiet || return $?
  measured du "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/du-run" \
    --device "$train_dev" --max-steps "$steps" --fusion off
}
check_du() { py train-big "$1" "$logs/du.log" "$work" du; }

# d's plan in mixed precision, twice: the half-type kernels are new shapes to CubeCL, so the
# first run compiles them and the second (db-run) gives the steady step to compare with dw.
step_db() {
  big_setup || return $?
  local p="${ASRT_DB_PRECISION:-bf16-mixed}" steps="$([ "$dry" = 1 ] && echo 2 || echo 6)" dev="$train_dev"
  # The dry run's CPU backend (NdArray) has no half type; burn-flex, the other CPU backend, has.
  [ "$dry" = 1 ] && dev=flex
  "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/db0-run" \
    --device "$dev" --max-steps "$steps" --precision "$p" || return $?
  measured db "$bin/asrt" train "$work/long.asrcorpus" --config "$work/parakeet.toml" --out "$work/db-run" \
    --device "$dev" --max-steps "$steps" --precision "$p"
}
check_db() { py train-big "$1" "$logs/db.log" "$work" db; }

# db with mb's fastest kernel for the linear layers' mixed products. A dry run trains in
# f16-mixed on lavapipe, whose unit kernels take f16.
step_bm() {
  big_setup || return $?
  if [ "$dry" = 1 ]; then
    with_fastest bm mb wgpu --precision f16-mixed
  else
    with_fastest bm mb "$train_dev" --precision "${ASRT_DB_PRECISION:-bf16-mixed}"
  fi
}
check_bm() { py train-big "$1" "$logs/bm.log" "$work" bm; }

# The same preset at a larger batch (ASRT_D2_BATCH_SECONDS, default 360) over more utterances
# (the planner batches utterances of similar length: 96 give batches of about 110 s whatever the
# limit). A step bound by launching kernels from the host costs about the same at any batch.
step_d2() {
  if [ ! -f "$work/long2.asrcorpus" ]; then
    "$bin/make-synthetic-corpus" "$work/long2.asrcorpus" --utterances "$([ "$dry" = 1 ] && echo 24 || echo 400)" \
      --vocab 1024 --min-seconds 5 --max-seconds 20 --max-tokens 80 || return $?
  fi
  local cfg="$work/parakeet2.toml" secs="${ASRT_D2_BATCH_SECONDS:-360}"
  big_config "$cfg" "$([ "$dry" = 1 ] && echo 60.0 || echo "$secs")"
  measured d2 "$bin/asrt" train "$work/long2.asrcorpus" --config "$cfg" --out "$work/d2-run" --device "$train_dev" \
    --max-steps "$([ "$dry" = 1 ] && echo 2 || echo 4)"
}
check_d2() { py train-big "$1" "$logs/d2.log" "$work" d2; }

step_e() {
  if [ "$dry" = 1 ]; then
    "$peer_python" bench/peer_step.py --preset small --device cpu --precisions f32 --steps 2 --batch-seconds 30 \
      --json-out "$work/e.json"
  else
    # ASRT_PEER_RUNS: the runs (default: bench/peer_step.py's, with and without its TDT loss).
    "$peer_python" bench/peer_step.py --steps 6 --batch-seconds 120 --json-out "$work/e.json" \
      ${ASRT_PEER_RUNS:+--precisions "$ASRT_PEER_RUNS"}
  fi
}
check_e() { py peer-step "$1" "$logs/e.log" "$work"; }

step_f() {
  local cfg="$work/oom.toml"
  if [ "$dry" = 1 ]; then
    # lavapipe binds at most 128 MiB per buffer: a wide joint over a big batch exceeds it.
    printf 'preset = "tiny"\n[model.joint]\njoint_hidden = 640\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 100.0\n' > "$cfg"
  else
    printf 'preset = "parakeet-tdt-0.6b"\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 100000.0\n' > "$cfg"
  fi
  # Utterances of one length, so the sampler puts many in one micro-batch: 16 of 7-8 s for
  # lavapipe, 400 of 19-20 s for a GPU (about 300 MB of joint and loss per utterance).
  if [ "$dry" = 1 ]; then set -- 16 7 8 60; else set -- 400 19 20 80; fi
  "$bin/make-synthetic-corpus" "$work/same.asrcorpus" --utterances "$1" --vocab 1024 \
    --min-seconds "$2" --max-seconds "$3" --max-tokens "$4" || return $?
  # Two steps: the plan may put a small remainder batch first.
  "$bin/asrt" train "$work/same.asrcorpus" --config "$cfg" --out "$work/f-run" --device "$dev" \
    --max-steps 2 --quiet
  local rc=$?
  echo "first run exit: $rc"
  local suggested
  # Then the suggested setting, again while a run fails with a new suggestion (a batch over the
  # kernels' size limit is refused first; the suggestion under it may still be out of memory).
  local attempt rc2
  for attempt in 2 3 4; do
    suggested="$(grep -o 'max_batch_seconds = [0-9.]*' "$logs/f.log" | tail -n 1 | grep -o '[0-9.]*$')"
    [ -n "$suggested" ] || return 3
    sed -i "s/^max_batch_seconds = .*/max_batch_seconds = $suggested/" "$cfg"
    echo "second run at max_batch_seconds = $suggested (attempt $attempt)"
    "$bin/asrt" train "$work/same.asrcorpus" --config "$cfg" --out "$work/f-run$attempt" --device "$dev" \
      --max-steps 2 --quiet
    rc2=$?
    [ "$rc2" -eq 0 ] && return 0
  done
  return "$rc2"
}
check_f() { py oom "$1" "$logs/f.log"; }

step_g() {
  local twice="${dev},${dev}"
  [ "$dry" = 1 ] && twice="cuda:0,cuda:0"
  echo "--- devices $twice"
  "$bin/asrt" train "$corpus" --out "$work/g-run" --devices "$twice" --max-steps 1 --quiet
  echo "exit: $?"
  echo "--- device cuda:63"
  "$bin/asrt" train "$corpus" --out "$work/g-run" --device cuda:63 --max-steps 1 --quiet
  echo "exit: $?"
  echo "--- nccl-check $dev"
  "$bin/asrt-bench" nccl-check --device "$([ "$dry" = 1 ] && echo cuda:0 || echo "$dev")"
  echo "exit: $?"
  return 0
}
check_g() { py refusals "$1" "$logs/g.log" "$dry"; }

export -f measured warm_run alternate step_xu step_xl step_xj step_xk step_xa step_xn big_setup step_env step_c step_cg step_d step_dw step_dk step_dr step_dj step_dp step_hp step_du step_db step_d2 step_e step_f step_g step_mm step_ma step_dm step_dc step_ds cublas_variant step_mb step_bm matmul_kernels matmul_peer fastest_kernel with_fastest long_corpus big_config
export mm_kernels dev train_dev sizes bin corpus reference train_steps work logs dry kit repo peer_python perf_cmd hp_freq

run_step env 60 step_env
# g first after env: it takes seconds, and a call's budget may run out before the last steps
# (the H200's --short call of 2026-11-30 skipped it).
run_step g 60 step_g
run_step a 600 "$bin/asrt-bench" tdt-check --device "$dev" --sizes "$sizes" --repeats 3 --dump "$work/peer" \
  --json-out "$work/a.json"
run_step b 600 "$peer_python" bench/tdt_peer.py "$work/peer" --json-out "$work/b.json"
run_step c 600 step_c
run_step cg 240 step_cg
run_step d 600 step_d
run_step dw 300 step_dw
run_step dk 300 step_dk
run_step dr 300 step_dr
run_step dj 300 step_dj
run_step dp 240 step_dp
run_step hp 120 step_hp
# e before the other variants of d: d's warm run over e's is the headline figure.
run_step e 400 step_e
run_step xu 420 step_xu
run_step xl 300 step_xl
run_step xj 300 step_xj
run_step xk 420 step_xk
run_step xa 300 step_xa
run_step xn 300 step_xn
run_step mm 330 step_mm
run_step dm 400 step_dm
run_step du 300 step_du
run_step db 400 step_db
run_step mb 330 step_mb
run_step bm 400 step_bm
run_step ma 120 step_ma
# dc and ds last: A/Bs of a cuBLAS run that dm's figure may not need.
run_step dc 200 step_dc
run_step ds 200 step_ds
run_step d2 300 step_d2
run_step f 300 step_f

python3 scripts/gpu/check.py summary "$records" "$work" "$out" "$dry"
tar -czf "$out/logs.tar.gz" -C "$work" logs $(cd "$work" && ls ./*.json ./*.csv 2>/dev/null) 2>/dev/null
cat "$out/results.md"
[ -n "$keep" ] || rm -rf "$work"
