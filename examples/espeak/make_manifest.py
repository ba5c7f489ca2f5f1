"""Writes manifest.parquet for the example: one training-ready row per line of sentences.tsv,
then rows that exercise the compiler's reject and flag paths."""
import csv
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

SHARD = "shard-000"
TAR = f"audio/{SHARD}/{SHARD}.tar"  # legacy pointer: only its directory is used


def duration(member):
    out = subprocess.run(["soxi", "-D", f"audio/{SHARD}/{member}"], capture_output=True, text=True)
    return round(float(out.stdout), 3) if out.returncode == 0 else 2.0


rows = []
for r in csv.reader(open("sentences.tsv", encoding="utf-8"), delimiter="\t"):
    if not r or r[0].startswith("#"):
        continue
    seg, label, text = r[0], r[1], r[2]
    rows.append(dict(segment_id=seg, shard_id=SHARD, text=f"<|{label.lower()}|> {text}",
                     duration=duration(f"{seg}.flac"), lang=label,
                     tar_member_name=f"{seg}.flac", tar_path=TAR, source="espeak-ng"))

first = dict(rows[0])
bad = [
    dict(first),                                                   # duplicate_row
    dict(first, text="<|en|> Another transcript entirely."),       # reused_segment_id
    dict(first, segment_id="en-0001-copy", tar_member_name="en-0001-copy.flac"),  # duplicate_audio
    dict(first, segment_id="broken-truncated", tar_member_name="broken-truncated.flac"),
    dict(first, segment_id="broken-aiff", tar_member_name="broken-aiff.flac"),   # unsupported_codec
    dict(first, segment_id="broken-missing", tar_member_name="missing.flac"),
    dict(first, segment_id="broken-null-text", text=None),
    dict(first, segment_id="broken-empty-text", text="<|en|> [music] ..."),
    dict(first, segment_id="broken-no-language", lang=None, text="1 2 3 4"),          # no_language
]
# A kept row whose claimed duration is wrong: flagged duration_mismatch, stored as decoded.
rows[3]["duration"] = round(rows[3]["duration"] + 3.0, 3)
rows += bad
table = pa.Table.from_pylist(rows, schema=pa.schema([
    ("segment_id", pa.string()), ("shard_id", pa.string()), ("text", pa.string()),
    ("duration", pa.float64()), ("lang", pa.string()), ("tar_member_name", pa.string()),
    ("tar_path", pa.string()), ("source", pa.string()),
]))
pq.write_table(table, "manifest.parquet", compression="zstd")
print(f"manifest.parquet: {len(rows)} rows")
