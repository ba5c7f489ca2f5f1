#!/usr/bin/env bash
# Rebuilds this example from sentences.tsv: speech synthesised with espeak-ng in the row's true
# language (the id's prefix; the label column may be wrong on purpose), written as FLAC at the
# row's rate, channel count and bit depth with sox; then manifest.parquet (with deliberately bad
# rows appended, see make_manifest.py) and a SentencePiece model.
#
# Needs: espeak-ng, sox, flac, sentencepiece (spm_train), python3 with pyarrow.
# The committed files were made with eSpeak NG 1.51, SoX 14.4.2 and SentencePiece 0.1.97
# (Debian 12). Output is not bit-reproducible across espeak-ng versions.
set -euo pipefail
cd "$(dirname "$0")"

shard=audio/shard-000
rm -rf audio && mkdir -p "$shard"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

while IFS=$'\t' read -r id label text rate channels bits; do
  [[ -z $id || $id == \#* ]] && continue
  voice=${id%%-*}
  espeak-ng -v "$voice" -w "$tmp/$id.wav" "$text"
  # -D: no dither, so the same input gives the same samples.
  sox -D "$tmp/$id.wav" -b "$bits" "$shard/$id.flac" channels "$channels" rate -v "$rate"
done < sentences.tsv

# Broken audio for the compiler's reject paths.
head -c 3000 "$shard/en-0002.flac" > "$shard/broken-truncated.flac"
# An AIFF file under a FLAC name: a codec asrc does not decode (it tells codecs by their bytes).
sox -D "$tmp/en-0004.wav" -t aiff "$shard/broken-aiff.flac"
# The same samples as en-0001, encoded differently (different bytes, same audio).
flac -s -d -c --force-raw-format --endian=little --sign=signed "$shard/en-0001.flac" | flac -s -0 --force-raw-format --endian=little --sign=signed \
  --channels=1 --bps=16 --sample-rate=16000 -o "$shard/en-0001-copy.flac" -

python3 make_manifest.py
# The tokenizer: every language tag is one piece, so `<|lang|> text` tokenizes as the pipeline's
# text did.
python3 - > "$tmp/text.txt" <<'PY'
import csv
for row in csv.reader(open("sentences.tsv", encoding="utf-8"), delimiter="\t"):
    if row and not row[0].startswith("#"):
        print(row[2])
PY
tags=$(printf '<|%s|>,' as bn en gu hi kn ml mr or pa ta te)
spm_train --input="$tmp/text.txt" --model_prefix=spm --vocab_size=320 --hard_vocab_limit=false \
  --character_coverage=1.0 --model_type=unigram --user_defined_symbols="${tags%,}" \
  --bos_id=-1 --eos_id=-1 --seed_sentencepiece_size=10000 --minloglevel=2
rm -f spm.vocab
du -ch audio manifest.parquet spm.model | tail -1
