#!/usr/bin/env bash
# Diagnoses on the GPU machine (device tool, carry ["gpu-kit"]) beside the kit's steps: where the
# out-of-memory run of step f panics, if it does (backtrace), and which kernels a step of the
# 0.6B preset spends its time in (CubeCL's per-kernel profile, CUBECL_DEBUG_LOG, summed by
# scripts/gpu/profile_summary.py). Writes f-sym.log, d-prof.log and d-profile.txt to $OUT.
# (The first version of this script ran `tiny` with CUBECL_AUTOTUNE_LEVEL=minimal and
# CUBECL_DEBUG_LOG, summed the same way: bench/RESULTS.md, "First run on a GPU".)
set -u
mkdir -p /tmp/b; for f in gpu-kit/bin/*.xz; do xz -dc $f > /tmp/b/$(basename $f .xz); done; chmod +x /tmp/b/*
# The kit carries asrt-bench alone: started under the name asrt, it is asrt.
ln -sfn asrt-bench /tmp/b/asrt
export ASRT_KERNEL_CACHE=/tmp/kc RUST_BACKTRACE=1
/tmp/b/make-synthetic-corpus /tmp/same.asrcorpus --utterances 400 --vocab 1024 --min-seconds 19 --max-seconds 20 --max-tokens 80 > /dev/null
printf 'preset = "parakeet-tdt-0.6b"\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 100000.0\n' > /tmp/oom.toml
timeout 90 /tmp/b/asrt train /tmp/same.asrcorpus --config /tmp/oom.toml --out /tmp/f --device cuda:0 --max-steps 1 > /tmp/f.log 2>&1
echo "exit $?" >> /tmp/f.log
{ head -n 40 /tmp/f.log; echo "..."; grep -A40 "thread 'main'" /tmp/f.log; tail -n 5 /tmp/f.log; } > $OUT/f-sym.log
/tmp/b/make-synthetic-corpus /tmp/long.asrcorpus --utterances 48 --vocab 1024 --min-seconds 5 --max-seconds 20 --max-tokens 80 > /dev/null
printf 'preset = "parakeet-tdt-0.6b"\n[train]\ngrad_accum = 1\ncheckpoint_every = 0\n[sampler]\nmax_batch_seconds = 120.0\n' > /tmp/d.toml
CUBECL_DEBUG_LOG=/tmp/prof.log timeout 150 /tmp/b/asrt train /tmp/long.asrcorpus --config /tmp/d.toml --out /tmp/d --device cuda:0 --max-steps 3 > $OUT/d-prof.log 2>&1
echo "exit $?" >> $OUT/d-prof.log
python3 scripts/gpu/profile_summary.py /tmp/prof.log > $OUT/d-profile.txt 2>&1
