#!/usr/bin/env python3
"""Independent reader of the ASR corpus format, version 1, written from format-spec/SPEC.md.

It shares no code with the Rust crate: CI runs both on the same files and compares their
summaries, so the specification and the implementation cannot drift apart silently.

Usage:
    read_corpus.py CORPUS            validate (rules R1-R13, V1-V8) and print a JSON summary
    read_corpus.py --layout CORPUS   print the header and section table, then validate

Exit status: 0 valid, 1 invalid (message on stderr), 2 unreadable or bad usage.

Needs numpy, zstandard and xxhash (pip install numpy zstandard xxhash).
"""

import json
import struct
import sys

import numpy as np
import xxhash
import zstandard

MAGIC = b"\x89ASRC\r\n\x1a"
HEADER_SIZE = 4096
ALIGN = 4096
READER_VERSION = 1
SAMPLE_RATE = 16000
OPTIONAL = 1

KINDS = {
    1: "METADATA", 2: "TOKENIZER", 3: "NUM_SAMPLES", 4: "PCM_OFFSETS", 5: "TOKEN_OFFSETS",
    6: "LANGUAGES", 7: "SOURCES", 8: "AUDIO_HASHES", 9: "TOKENS", 10: "PCM", 11: "TEXT_INDEX",
    12: "TEXT_BLOCKS",
}

MAX_SECTIONS = 124
MAX_UTTERANCES = 2**32 - 1
MAX_UTTERANCE_SAMPLES = 9_600_000
MAX_TOKENS_PER_UTTERANCE = 16_384
MAX_METADATA_BYTES = 16 * 1024 * 1024
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
MAX_TEXT_BLOCK_UTTERANCES = 65_536
MAX_TEXT_BLOCK_RAW_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_ID_BYTES = 1024
MAX_TEXT_BYTES = 65_536


class Invalid(Exception):
    """The file violates a rule of SPEC.md section 8."""


def xxh3(data):
    return xxhash.xxh3_64_intdigest(data)


def align_up(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def parse_header(buf, file_len):
    if file_len < HEADER_SIZE:
        raise Invalid(f"R1: file is {file_len} bytes, shorter than the header")
    h = bytes(buf[:HEADER_SIZE])
    if h[:8] != MAGIC:
        raise Invalid(f"R2: bad magic {h[:8].hex(' ')}")
    (fmt, min_reader, marker, header_size, align, count) = struct.unpack_from("<6I", h, 8)
    if marker != 0x01020304:
        raise Invalid(f"R3: endian marker {marker:#010x}")
    if sys.byteorder != "little":
        raise Invalid("R3: big-endian host")
    if fmt < 1 or min_reader < 1 or min_reader > fmt or min_reader > READER_VERSION:
        raise Invalid(f"R4: format_version {fmt}, min_reader_version {min_reader}")
    (stored,) = struct.unpack_from("<Q", h, 120)
    if xxh3(h[:120] + b"\0" * 8 + h[128:]) != stored:
        raise Invalid("R5: header checksum mismatch")
    if header_size != HEADER_SIZE or align != ALIGN:
        raise Invalid(f"R5: header_size {header_size}, section_align {align}")
    if any(h[72:120]):
        raise Invalid("R5: reserved header bytes are not zero")
    if count > MAX_SECTIONS:
        raise Invalid(f"R6: {count} sections")
    if any(h[128 + 32 * count:]):
        raise Invalid("R5: bytes after the section table are not zero")
    n, s, t = struct.unpack_from("<3Q", h, 32)
    rate, width, vocab, k = struct.unpack_from("<4I", h, 56)
    if rate != SAMPLE_RATE:
        raise Invalid(f"R9: sample_rate {rate}")
    if vocab < 1 or width != (2 if vocab <= 65536 else 4):
        raise Invalid(f"R9: vocab_size {vocab} with token_width {width}")
    if not 1 <= k <= MAX_TEXT_BLOCK_UTTERANCES:
        raise Invalid(f"R9: text_block_size {k}")
    if n > MAX_UTTERANCES:
        raise Invalid(f"R9: {n} utterances")
    sections = [struct.unpack_from("<IIQQQ", h, 128 + 32 * i) for i in range(count)]
    return dict(format_version=fmt, n=n, s=s, t=t, width=width, vocab=vocab, k=k,
                sections=sections)


def section_map(hdr, file_len):
    """R7, R8: name -> (offset, length)."""
    found = {}
    expected = HEADER_SIZE
    for i, (kind, flags, off, length, _) in enumerate(hdr["sections"]):
        if off != expected:
            raise Invalid(f"R7: section entry {i} at {off}, expected {expected}")
        name = KINDS.get(kind)
        if name is None:
            if not flags & OPTIONAL:
                raise Invalid(f"R8: unknown required section kind {kind}")
            if flags & ~OPTIONAL:
                raise Invalid(f"R8: entry {i} flags {flags:#x}")
        else:
            if flags:
                raise Invalid(f"R8: entry {i} ({name}) flags {flags:#x}")
            if name in found:
                raise Invalid(f"R8: section {name} twice")
            found[name] = (off, length)
        if off + length > file_len:
            raise Invalid(f"R7: entry {i} ends past the file")
        expected = align_up(off + length)
    if expected != file_len:
        raise Invalid(f"R7: file is {file_len} bytes, section table says {expected}")
    missing = sorted(set(KINDS.values()) - set(found))
    if missing:
        raise Invalid(f"R8: missing sections {missing}")
    return found


def array(buf, sections, name, dtype):
    off, length = sections[name]
    return np.frombuffer(buf, dtype=dtype, count=length // np.dtype(dtype).itemsize, offset=off)


def raw(buf, sections, name):
    off, length = sections[name]
    return bytes(buf[off:off + length])


def check_lengths(hdr, sec):
    """R10."""
    n, s, t = hdr["n"], hdr["s"], hdr["t"]
    blocks = -(-n // hdr["k"])
    want = {
        "NUM_SAMPLES": 4 * n, "PCM_OFFSETS": 8 * n, "TOKEN_OFFSETS": 8 * (n + 1),
        "LANGUAGES": 2 * n, "SOURCES": 2 * n, "AUDIO_HASHES": 8 * n,
        "TOKENS": hdr["width"] * t, "PCM": 2 * s, "TEXT_INDEX": 16 * blocks,
    }
    for name, length in want.items():
        if sec[name][1] != length:
            raise Invalid(f"R10: {name} is {sec[name][1]} bytes, expected {length}")
    if sec["METADATA"][1] > MAX_METADATA_BYTES or sec["TOKENIZER"][1] > MAX_TOKENIZER_BYTES:
        raise Invalid("R10: METADATA or TOKENIZER above its limit")


def parse_metadata(buf, hdr, sec):
    """R12."""
    try:
        meta = json.loads(raw(buf, sec, "METADATA").decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise Invalid(f"R12: METADATA is not JSON: {e}") from None
    try:
        langs, sources, tok, stats = meta["languages"], meta["sources"], meta["tokenizer"], meta["stats"]
        ok = (isinstance(langs, list) and all(isinstance(x, str) and x for x in langs)
              and isinstance(sources, list) and all(isinstance(x, str) for x in sources)
              and len(set(langs)) == len(langs) <= 65536
              and len(set(sources)) == len(sources) <= 65536
              and tok["kind"] in ("sentencepiece", "none")
              and isinstance(meta["compile"], dict)
              and isinstance(tok["model_xxh3"], str) and len(tok["model_xxh3"]) == 16
              and all(c in "0123456789abcdef" for c in tok["model_xxh3"]))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise Invalid("R12: METADATA members missing or malformed")
    checks = [
        (tok["vocab_size"], hdr["vocab"]), (tok["model_bytes"], sec["TOKENIZER"][1]),
        (stats["utterances"], hdr["n"]), (stats["samples"], hdr["s"]), (stats["tokens"], hdr["t"]),
    ]
    if any(a != b for a, b in checks):
        raise Invalid(f"R12: metadata counts {checks} disagree with the header")
    return meta


def check_arrays(buf, hdr, sec, meta):
    """R11."""
    n = hdr["n"]
    ns = array(buf, sec, "NUM_SAMPLES", "<u4").astype(np.uint64)
    if n and (ns.min() < 1 or ns.max() > MAX_UTTERANCE_SAMPLES):
        raise Invalid("R11: NUM_SAMPLES out of range")
    po = array(buf, sec, "PCM_OFFSETS", "<u8")
    starts = np.concatenate([[0], np.cumsum(ns)]).astype(np.uint64)
    if not np.array_equal(po, starts[:n]) or int(starts[n]) != hdr["s"]:
        raise Invalid("R11: PCM_OFFSETS are not back to back or do not sum to n_samples")
    to = array(buf, sec, "TOKEN_OFFSETS", "<u8").astype(np.int64)
    counts = np.diff(to)
    if to[0] != 0 or to[-1] != hdr["t"] or (n and (counts.min() < 0 or counts.max() > MAX_TOKENS_PER_UTTERANCE)):
        raise Invalid("R11: TOKEN_OFFSETS invalid")
    for name, table in (("LANGUAGES", meta["languages"]), ("SOURCES", meta["sources"])):
        ids = array(buf, sec, name, "<u2")
        if n and int(ids.max()) >= len(table):
            raise Invalid(f"R11: {name} id out of its table")
    return ns, po, to


def check_text_index(buf, hdr, sec):
    """R13."""
    n, k = hdr["n"], hdr["k"]
    entries = []
    at = 0
    for b in range(-(-n // k)):
        off, clen, rlen = struct.unpack_from("<QII", buf, sec["TEXT_INDEX"][0] + 16 * b)
        records = min(k, n - b * k)
        if off != at or clen < 1 or not 4 * (2 * records + 1) <= rlen <= MAX_TEXT_BLOCK_RAW_BYTES:
            raise Invalid(f"R13: TEXT_INDEX[{b}] invalid")
        at += clen
        entries.append((off, clen, rlen, records))
    if at != sec["TEXT_BLOCKS"][1]:
        raise Invalid("R13: text frames do not fill TEXT_BLOCKS")
    return entries


def verify(buf, hdr, sec, meta, ns, po, to, text_index):
    n = hdr["n"]
    # V1, V2
    for kind, _, off, length, checksum in hdr["sections"]:
        if xxh3(buf[off:off + length]) != checksum:
            raise Invalid(f"V1: section {KINDS.get(kind, kind)} checksum mismatch")
        if np.any(buf[off + length:align_up(off + length)]):
            raise Invalid(f"V2: non-zero padding after section {KINDS.get(kind, kind)}")
    # V3
    tokens = array(buf, sec, "TOKENS", "<u2" if hdr["width"] == 2 else "<u4")
    if len(tokens) and int(tokens.max()) >= hdr["vocab"]:
        raise Invalid("V3: token id out of the vocabulary")
    # V4
    hashes = array(buf, sec, "AUDIO_HASHES", "<u8")
    pcm_off = sec["PCM"][0]
    for i in range(n):
        a = pcm_off + 2 * int(po[i])
        if xxh3(buf[a:a + 2 * int(ns[i])]) != int(hashes[i]):
            raise Invalid(f"V4: utterance {i} audio hash mismatch")
    # V5, V6
    dctx = zstandard.ZstdDecompressor()
    blocks_off = sec["TEXT_BLOCKS"][0]
    seen = set()
    for b, (off, clen, rlen, k) in enumerate(text_index):
        frame = bytes(buf[blocks_off + off:blocks_off + off + clen])
        try:
            data = dctx.decompress(frame, max_output_size=rlen)
        except zstandard.ZstdError as e:
            raise Invalid(f"V5: text block {b} does not decompress: {e}") from None
        if len(data) != rlen:
            raise Invalid(f"V5: text block {b} is {len(data)} bytes, expected {rlen}")
        offs = struct.unpack_from(f"<{2 * k + 1}I", data, 0)
        area = data[4 * (2 * k + 1):]
        if offs[0] != 0 or offs[-1] != len(area) or any(y < x for x, y in zip(offs, offs[1:])):
            raise Invalid(f"V5: text block {b} offsets invalid")
        for j in range(k):
            sid, txt = area[offs[2 * j]:offs[2 * j + 1]], area[offs[2 * j + 1]:offs[2 * j + 2]]
            if not 1 <= len(sid) <= MAX_SEGMENT_ID_BYTES or len(txt) > MAX_TEXT_BYTES:
                raise Invalid(f"V5: text block {b} record {j} lengths out of range")
            try:
                sid.decode("utf-8")
                txt.decode("utf-8")
            except UnicodeDecodeError:
                raise Invalid(f"V5: text block {b} record {j} is not UTF-8") from None
            if sid in seen:
                raise Invalid(f"V6: segment id {sid!r} repeated")
            seen.add(sid)
    # V7
    model = raw(buf, sec, "TOKENIZER")
    if f"{xxh3(model):016x}" != meta["tokenizer"]["model_xxh3"]:
        raise Invalid("V7: tokenizer.model_xxh3 does not match the TOKENIZER section")
    if (meta["tokenizer"]["kind"] == "none") != (len(model) == 0):
        raise Invalid("V7: tokenizer.kind disagrees with the TOKENIZER section")
    # V8
    langs = array(buf, sec, "LANGUAGES", "<u2")
    per = {}
    counts = np.diff(to)
    for lid, code in enumerate(meta["languages"]):
        mask = langs == lid
        u = int(mask.sum())
        if u:
            samples = int(ns[mask].sum())
            per[code] = dict(utterances=u, samples=samples, tokens=int(counts[mask].sum()),
                             hours=samples / SAMPLE_RATE / 3600)
    stored = meta["stats"]["per_language"]
    if set(stored) != set(per):
        raise Invalid("V8: stats.per_language languages disagree with the utterances")
    for code, c in per.items():
        s = stored[code]
        if (s["utterances"], s["samples"], s["tokens"]) != (c["utterances"], c["samples"], c["tokens"]) \
                or abs(s["hours"] - c["hours"]) > 1e-9 * max(abs(c["hours"]), 1e-300):
            raise Invalid(f"V8: stats.per_language[{code!r}] disagrees with the utterances")
    hours = hdr["s"] / SAMPLE_RATE / 3600
    if abs(meta["stats"]["hours"] - hours) > 1e-9 * max(hours, 1e-300):
        raise Invalid("V8: stats.hours disagrees with the header")
    return per


def read(path, layout=False):
    buf = np.memmap(path, dtype=np.uint8, mode="r") if _size(path) else np.zeros(0, np.uint8)
    file_len = len(buf)
    hdr = parse_header(buf, file_len)
    if layout:
        print(f"format_version {hdr['format_version']}, {hdr['n']} utterances, {hdr['s']} samples, "
              f"{hdr['t']} tokens, vocab {hdr['vocab']}, token_width {hdr['width']}, "
              f"text_block_size {hdr['k']}")
        for i, (kind, flags, off, length, checksum) in enumerate(hdr["sections"]):
            print(f"  entry {i:3}: {KINDS.get(kind, kind):<13} offset {off:>12} length {length:>12} "
                  f"flags {flags} xxh3 {checksum:016x}")
    sec = section_map(hdr, file_len)
    check_lengths(hdr, sec)
    meta = parse_metadata(buf, hdr, sec)
    ns, po, to = check_arrays(buf, hdr, sec, meta)
    text_index = check_text_index(buf, hdr, sec)
    per = verify(buf, hdr, sec, meta, ns, po, to, text_index)
    return {
        "format_version": hdr["format_version"],
        "file_bytes": file_len,
        "utterances": hdr["n"],
        "samples": hdr["s"],
        "tokens": hdr["t"],
        "hours": hdr["s"] / SAMPLE_RATE / 3600,
        "vocab_size": hdr["vocab"],
        "token_width": hdr["width"],
        "text_blocks": len(text_index),
        "tokenizer": meta["tokenizer"]["kind"],
        "languages": dict(sorted(per.items())),
        "sections": [
            {"kind": KINDS.get(kind, f"kind {kind}"), "offset": off, "length": length,
             "checksum": f"{checksum:016x}"}
            for kind, _, off, length, checksum in hdr["sections"]
        ],
    }


def _size(path):
    with open(path, "rb") as f:
        f.seek(0, 2)
        return f.tell()


def main(argv):
    args = [a for a in argv if a != "--layout"]
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        summary = read(args[0], layout="--layout" in argv)
    except OSError as e:
        print(f"read_corpus: {args[0]}: {e}", file=sys.stderr)
        return 2
    except Invalid as e:
        print(f"read_corpus: {args[0]}: invalid corpus: {e}", file=sys.stderr)
        return 1
    except (struct.error, ValueError, IndexError, OverflowError, KeyError, TypeError) as e:
        # A structure the rules above did not anticipate; still a verdict, not a crash.
        print(f"read_corpus: {args[0]}: invalid corpus: malformed ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
