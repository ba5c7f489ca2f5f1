#!/usr/bin/env bash
# Decode throughput per codec: `asrc probe` (asrc's decoders, one thread, the whole file decoded
# and checked, nothing written) against `ffmpeg -threads 1` decoding the same file to float
# samples into /dev/null, alternating, in one invocation; medians of RUNS.
#
# The input: 540 s of a speech-like signal (sox: a gliding harmonic tone, noise bursts, an
# amplitude envelope), 16 kHz mono for FLAC, WAV and MP3 (lame 32 kb/s, the rate of speech
# datasets such as Common Voice), Ogg Vorbis (oggenc -q 3), Ogg Opus (opusenc 24 kb/s) and AAC-LC
# in M4A (ffmpeg's encoder, 32 kb/s); 44.1 kHz stereo WAV, MP3 (-V 4) and M4A (96 kb/s) too.
# 540 s: under the 601 s a single file may hold.
#
# usage: bash bench/codecs.sh [RUNS]   (needs ffmpeg, sox, flac, lame, oggenc, opusenc)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/asr-target}"
# Incremental caches in the shared target directory grew past 20 GB and filled the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
runs="${1:-3}"
dir="${BENCH_DIR:-$HOME/.cache/asr-bench/codecs}"
mkdir -p "$dir"
for tool in ffmpeg sox flac lame oggenc opusenc; do
  command -v "$tool" >/dev/null || { echo "codecs bench: $tool not found (apt-get install ffmpeg sox flac lame vorbis-tools opus-tools)" >&2; exit 2; }
done
if [ ! -f "$dir/aac_44k_stereo.m4a" ]; then
  # -R: sox's repeatable random numbers, so the same input every time.
  sox -R -n -r 16000 -c 1 -b 16 "$dir/src_16k.wav" synth 540 sine 120-180 sine 240-360 \
    whitenoise tremolo 4 60 gain -12
  sox -R -n -r 44100 -c 2 -b 16 "$dir/src_44k.wav" synth 540 sine 120-180 sine 240-360 \
    whitenoise tremolo 4 60 gain -12
  cp "$dir/src_16k.wav" "$dir/wav_16k.wav"
  cp "$dir/src_44k.wav" "$dir/wav_44k_stereo.wav"
  flac -s -f -o "$dir/flac_16k.flac" "$dir/src_16k.wav"
  lame --quiet --cbr -b 32 "$dir/src_16k.wav" "$dir/mp3_16k.mp3"
  lame --quiet -V 4 "$dir/src_44k.wav" "$dir/mp3_44k_stereo.mp3"
  oggenc --quiet -q 3 -o "$dir/vorbis_16k.ogg" "$dir/src_16k.wav"
  opusenc --quiet --bitrate 24 "$dir/src_16k.wav" "$dir/opus_16k.opus"
  ffmpeg -nostdin -v error -y -i "$dir/src_16k.wav" -c:a aac -b:a 32k "$dir/aac_16k.m4a"
  ffmpeg -nostdin -v error -y -i "$dir/src_44k.wav" -c:a aac -b:a 96k "$dir/aac_44k_stereo.m4a"
fi
cargo build --quiet --release -p asr-compiler --bin asrc
asrc="$CARGO_TARGET_DIR/release/asrc"
cat "$dir"/* > /dev/null  # page cache warm for both
t=$(mktemp)
trap 'rm -f "$t"' EXIT
wall() { /usr/bin/time -f "%e" -o "$t" "$@" > /dev/null 2>&1; cat "$t"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
echo "| file | asrc probe median s | ffmpeg median s | asrc runs | ffmpeg runs | asrc audio-s/s | ffmpeg audio-s/s | ffmpeg / asrc |"
echo "|---|---|---|---|---|---|---|---|"
for f in wav_16k.wav wav_44k_stereo.wav flac_16k.flac mp3_16k.mp3 mp3_44k_stereo.mp3 vorbis_16k.ogg opus_16k.opus \
  aac_16k.m4a aac_44k_stereo.m4a; do
  a=(); b=()
  for _ in $(seq "$runs"); do
    a+=("$(wall "$asrc" probe "$dir/$f")")
    b+=("$(wall ffmpeg -nostdin -threads 1 -i "$dir/$f" -f f32le -y /dev/null)")
  done
  ma=$(median "${a[@]}"); mb=$(median "${b[@]}")
  awk -v f="$f" -v ma="$ma" -v mb="$mb" -v ra="${a[*]}" -v rb="${b[*]}" 'BEGIN {
    printf "| %s | %.3f | %.3f | %s | %s | %.0f | %.0f | %.2f |\n", f, ma, mb, ra, rb,
      540 / (ma > 0 ? ma : 1e-3), 540 / (mb > 0 ? mb : 1e-3), mb / (ma > 0 ? ma : 1e-3) }'
done
