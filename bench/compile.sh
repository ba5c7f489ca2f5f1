#!/usr/bin/env bash
# Compile benchmark: `asrc compile` against the Python peer (bench/python_compile.py: soundfile +
# soxr + sentencepiece, 2 processes) on the same ~1 h of mixed-rate FLAC, alternating, in one
# invocation, with asrc's default decoder (libFLAC, MD5 checked), with `--no-md5-check` and with
# `--decoder symphonia`; then asrc's peak RSS at 1 h and 2 h of input.
#
# usage: bash bench/compile.sh [RUNS]      (input generated on first use, ~1 minute)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
dir="${BENCH_DIR:-$HOME/.cache/asr-bench/compile}"
runs="${1:-3}"
[ -f "$dir/manifest-2h.parquet" ] || python3 bench/make_compile_input.py "$dir" --hours 1 2
cargo build --quiet --release -p asr-compiler --bin asrc
asrc="$CARGO_TARGET_DIR/release/asrc"
model=examples/espeak/spm.model
out="$(mktemp -d "${TMPDIR:-/tmp}/asrc-bench.XXXXXX")"
trap 'rm -rf "$out"' EXIT
cat "$dir"/audio/* > /dev/null  # page cache warm for both

timed() { /usr/bin/time -f "%e %M" -o "$out/time" "$@" > /dev/null; cat "$out/time"; }
rust=(); python=(); symph=(); nomd5=()
for i in $(seq "$runs"); do
  read -r wall rss < <(timed "$asrc" compile "$dir/manifest-1h.parquet" --tokenizer "$model" \
    -o "$out/c1.asrcorpus" --quiet --jobs 2)
  rust+=("$wall"); echo "run $i: asrc   ${wall} s, peak RSS $((rss / 1024)) MiB"
  cp "$out/c1.asrcorpus.report.json" "$out/libflac.report.json"
  read -r wall rss < <(timed "$asrc" compile "$dir/manifest-1h.parquet" --tokenizer "$model" \
    -o "$out/c1s.asrcorpus" --quiet --jobs 2 --decoder symphonia)
  symph+=("$wall"); echo "run $i: asrc --decoder symphonia ${wall} s, peak RSS $((rss / 1024)) MiB"
  read -r wall rss < <(timed "$asrc" compile "$dir/manifest-1h.parquet" --tokenizer "$model" \
    -o "$out/c1n.asrcorpus" --quiet --jobs 2 --no-md5-check)
  nomd5+=("$wall"); echo "run $i: asrc --no-md5-check ${wall} s, peak RSS $((rss / 1024)) MiB"
  read -r wall rss < <(timed python3 bench/python_compile.py "$dir/manifest-1h.parquet" "$model" \
    "$out/py" --workers 2)
  python+=("$wall"); echo "run $i: python ${wall} s, peak RSS (largest process) $((rss / 1024)) MiB"
done
read -r wall2 rss2 < <(timed "$asrc" compile "$dir/manifest-2h.parquet" --tokenizer "$model" \
  -o "$out/c2.asrcorpus" --quiet --jobs 2)
read -r wall1 rss1 < <(timed "$asrc" compile "$dir/manifest-1h.parquet" --tokenizer "$model" \
  -o "$out/c1.asrcorpus" --quiet --jobs 2)
python3 - "$out/c1.asrcorpus.report.json" "${rust[*]}" "${python[*]}" "$rss1" "$rss2" "$wall1" "$wall2" \
  "${symph[*]}" "$out/c1s.asrcorpus.report.json" "${nomd5[*]}" "$out/c1n.asrcorpus.report.json" <<'PY'
import json, statistics, sys
rep = json.load(open(sys.argv[1]))
rust = [float(x) for x in sys.argv[2].split()]
py = [float(x) for x in sys.argv[3].split()]
rss1, rss2, w1, w2 = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
symph = [float(x) for x in sys.argv[8].split()]
srep = json.load(open(sys.argv[9]))
nomd5 = [float(x) for x in sys.argv[10].split()]
nrep = json.load(open(sys.argv[11]))
audio = rep["decoded_hours"] * 3600
mr, mp = statistics.median(rust), statistics.median(py)
print(f"input: {rep['rows']} rows, {rep['decoded_hours']:.3f} h decoded, kept {rep['kept']}")
print(f"asrc   median {mr:.2f} s: {audio / mr:.0f}x real time, {audio / mr / 2:.0f}x per core (2 threads)")
print(f"python median {mp:.2f} s: {audio / mp:.0f}x real time, {audio / mp / 2:.0f}x per core (2 processes)")
print(f"asrc / python speed: {mp / mr:.2f}x")
ms = statistics.median(symph)
print(f"asrc --decoder symphonia median {ms:.2f} s: {audio / ms:.0f}x real time; python / it: {mp / ms:.2f}x")
mn = statistics.median(nomd5)
print(f"asrc --no-md5-check median {mn:.2f} s: {audio / mn:.0f}x real time; python / it: {mp / mn:.2f}x")
print(f"decode CPU seconds (last run each): libflac {rep['stage_seconds']['decode']:.2f}, "
      f"libflac without MD5 {nrep['stage_seconds']['decode']:.2f}, "
      f"symphonia {srep['stage_seconds']['decode']:.2f}; kept {rep['kept']}, {nrep['kept']}, {srep['kept']}")
st = rep["stage_seconds"]
tot = sum(st.values())
print("asrc CPU seconds by stage (last 1 h run): " + ", ".join(
    f"{k} {v:.2f} ({100 * v / tot:.0f} %)" for k, v in st.items()))
print(f"asrc peak RSS: 1 h input {rss1 / 1024:.0f} MiB ({w1:.1f} s), 2 h input {rss2 / 1024:.0f} MiB ({w2:.1f} s)")
PY
