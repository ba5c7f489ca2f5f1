#!/usr/bin/env bash
# An A/B of one of the trainer's switches read from the environment (ASRT_FUSION_QUEUE,
# ASRT_GRAPH_JOIN, ...): VAR=0 against VAR=1 with one binary, alternated twice in one
# invocation, on the 0.6B preset's structure (24 layers) at width 64 on DEVICE (default wgpu),
# AB_STEPS steps (default 40) of 2 x 6 s utterances. Per run: the median step time from step 11
# on (from step 6 when AB_STEPS is under 30), the last loss, the training thread's median wall
# seconds by phase (asrt's `host_seconds`, where the build records them),
# and where perf is present each host thread's CPU time per step over those steps, split into
# work and spinning on CubeCL's task rings (scripts/gpu/host_profile.py); else the busiest
# threads (scripts/gpu/threads.py). bench/RESULTS.md, 2026-11-29 (21:24) and 2026-11-30.
#
#   bash bench/ab_env.sh VAR [ASRT] [DEVICE]     ASRT defaults to the release build
#
# AB_VALUES (default "0 1") and AB_ROUNDS (default 2) choose the runs; AB_THREADS (default 3)
# how many of the busiest threads a run's line names; AB_KEEP=DIR keeps each run's log and perf
# samples (perf script's text) as DIR/VALUE-ROUND.{log,report}; AB_ARGS adds arguments
# to every run's `asrt train` (`AB_ARGS="--fusion off"`). AB_CALLGRAPH=DIR records
# call chains instead (`perf record --call-graph dwarf`, 199 Hz) and writes each run's
# bench/host_frames.py reading of its threads' own work to DIR/VALUE-ROUND.frames, keeping the
# recording as DIR/VALUE-ROUND.perf (hundreds of MB) for `host_frames.py --match`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
var="${1:?usage: bench/ab_env.sh VAR [ASRT] [DEVICE]}"
target="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
asrt="${2:-$target/release/asrt}"
device="${3:-wgpu}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$work}"
"$target/release/make-synthetic-corpus" "$work/fixed.asrcorpus" --utterances 64 --vocab 1024 \
  --min-seconds 6 --max-seconds 6 --max-tokens 30 > /dev/null
printf 'preset = "parakeet-tdt-0.6b"\n[model.encoder]\nd_model = 64\nn_heads = 2\nff_dim = 128\nsubsampling_conv_channels = 16\n[model.decoder]\npred_hidden = 32\npred_rnn_layers = 1\n[model.joint]\njoint_hidden = 32\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 12.0\n' > "$work/ab.toml"
freq=499
steps="${AB_STEPS:-40}"
frames="${AB_CALLGRAPH:-}"
if [ -n "$frames" ]; then
  freq=199
  mkdir -p "$frames"
fi
skip=10
[ "$steps" -lt 30 ] && skip=5
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for value in ${AB_VALUES:-0 1}; do
    run="$work/v$value-$round"
    env "$var=$value" "$asrt" train "$work/fixed.asrcorpus" --config "$work/ab.toml" --out "$run" \
      --device "$device" --max-steps "$steps" --quiet ${AB_ARGS:-} > "$run.log" 2>&1 &
    pid=$!
    if command -v perf > /dev/null; then
      # From step skip + 1 on: the first steps compile kernels and fill the memory pool.
      while kill -0 "$pid" 2> /dev/null && [ "$(cat "$run/metrics.jsonl" 2> /dev/null | wc -l)" -lt "$skip" ]; do
        sleep 0.05
      done
      if [ -n "$frames" ]; then
        perf record -F "$freq" -e cpu-clock --call-graph dwarf,16384 -o "$run.perf" -p "$pid" \
          > "$run.perf.log" 2>&1 || true
      else
        perf record -F "$freq" -e cpu-clock -o "$run.perf" -p "$pid" > "$run.perf.log" 2>&1 || true
      fi
      # perf script's samples, not perf report's symbols: host_profile.py finds the ring's spin
      # by the code before each sample, wherever the build inlined it.
      perf script -i "$run.perf" --show-mmap-events -G -F comm,tid,ip,sym,symoff,dso \
        > "$run.report" 2> /dev/null || true
    else
      python3 scripts/gpu/threads.py sample "$pid" "$run.threads" --metrics "$run/metrics.jsonl"
    fi
    wait "$pid" || { cat "$run.log"; exit 1; }
    [ -n "${AB_KEEP:-}" ] && mkdir -p "$AB_KEEP" && cp "$run.log" "$AB_KEEP/$value-$round.log" \
      && { [ ! -f "$run.report" ] || cp "$run.report" "$AB_KEEP/$value-$round.report"; }
    if [ -n "$frames" ] && [ -s "$run.perf" ]; then
      mv "$run.perf" "$frames/$value-$round.perf"
      perf script -i "$frames/$value-$round.perf" --show-mmap-events 2> /dev/null \
        | python3 bench/host_frames.py --frequency "$freq" --steps "$((steps - skip))" --top 40 \
        > "$frames/$value-$round.frames" || true
    fi
    python3 - "$run" "$var=$value" "$round" "$repo" "$freq" "$skip" <<'PY'
import json, os, statistics, subprocess, sys
run, label, rnd, repo, freq, skip = sys.argv[1:]
skip = int(skip)
ms = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
steps = [m["ranks"][0]["step_seconds"] for m in ms[skip:]]
line = (f"{label}, round {rnd}: steps {skip + 1}-{len(ms)} median {statistics.median(steps):.4f} s, "
        f"loss at step {len(ms)} {ms[-1]['loss']:.4f}")
# The training thread's wall time by phase (asrt's `host_seconds`), where the build records it.
hs = [m["host_seconds"] for m in ms[skip:] if m.get("host_seconds")]
if hs:
    line += "; phases: " + ", ".join(f"{k} {statistics.median([h[k] for h in hs]):.4f}" for k in hs[0])
if os.path.exists(f"{run}.report"):
    sys.path.insert(0, f"{repo}/scripts/gpu")
    from host_profile import summarise
    with open(f"{run}.report", errors="replace") as f:
        p = summarise(f, float(freq), len(ms) - skip, script=True)
    parts = []
    for t in p["threads"][:int(os.environ.get("AB_THREADS", "3"))]:
        sh = t["shares"]
        parts.append(f"{t['thread']} {t['cpu_seconds_per_step']:.3f} s/step, work "
                     f"{t['work_seconds_per_step']:.3f} (spin {100 * (sh.get('enqueue spin', 0) + sh.get('idle spin', 0) + sh.get('other spin', 0)):.0f} %)")
    line += "; perf: " + "; ".join(parts)
else:
    t = json.loads(subprocess.run([sys.executable, f"{repo}/scripts/gpu/threads.py", "summary", f"{run}.threads",
                                   "--from-step", str(skip + 1)], capture_output=True, text=True).stdout)
    line += "; busy: " + ", ".join(f"{g['thread']} x{g['count']} {100 * g['busy']:.0f} %" for g in t.get("by_name", [])[:3])
print(line)
PY
  done
done
