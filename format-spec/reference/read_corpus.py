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
MAX_JSON_DEPTH = 127

ZSTD_FRAME_MAGIC = b"\x28\xb5\x2f\xfd"


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
    if fmt < 1 or not 1 <= min_reader <= fmt or min_reader > READER_VERSION:
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
    """R7, R8: name -> (offset, length). Sections of length 0 share the next one's offset."""
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
            # Every kind of version 1 is required: its entry has no flag, not even OPTIONAL.
            if flags:
                raise Invalid(f"R8: entry {i} ({name}) flags {flags:#x}, expected 0")
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
    """R10: lengths from N, S, T, token_width and K."""
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


class NegativeZero(int):
    """The JSON integer `-0`: not an integer member's value (SPEC.md section 6.6)."""


def _json_int(text):
    value = int(text)
    float(value)  # OverflowError when out of binary64 range, as for any number
    return NegativeZero(0) if text.startswith("-") and value == 0 else value


def _json_float(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range")
    return value


def _json_constant(text):
    raise ValueError(f"{text} is not JSON")


def _json_object(pairs):
    obj = {}
    for name, value in pairs:
        if name in obj:
            raise ValueError(f"member name {name!r} is repeated in one object")
        obj[name] = value
    return obj


def load_metadata_json(data):
    """JSON as SPEC.md section 6.6 restricts it, applied to the whole document."""
    try:
        text = data.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int,
                         parse_float=_json_float, parse_constant=_json_constant)
    except (UnicodeDecodeError, ValueError, OverflowError, RecursionError) as e:
        raise Invalid(f"R11: METADATA is not valid JSON: {type(e).__name__}: {e}") from None
    # Depth: the top-level value is at depth 1, what an array or object at depth d holds at d + 1.
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                raise Invalid(f"R11: METADATA nests deeper than {MAX_JSON_DEPTH} levels")
            inner = list(value.values()) if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in inner)
            strings = list(value) if isinstance(value, dict) else []
        else:
            strings = [value] if isinstance(value, str) else []
        for text in strings:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise Invalid("R11: METADATA has a string with a lone surrogate") from None
    return doc


def _is_int(v, bits=64):
    # bool is a subclass of int and NegativeZero marks `-0`: neither is an integer member.
    return type(v) is int and 0 <= v < 2**bits


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_counts(d):
    return (isinstance(d, dict) and all(_is_int(d[k]) for k in ("utterances", "samples", "tokens"))
            and _is_number(d["hours"]))


def hours_close(stored, computed):
    """SPEC.md section 6.6: within 1e-9 relative."""
    return abs(stored - computed) <= 1e-9 * max(abs(stored), abs(computed), 1e-300)


def parse_metadata(buf, hdr, sec):
    """R11."""
    meta = load_metadata_json(raw(buf, sec, "METADATA"))
    try:
        langs, sources, tok, stats = meta["languages"], meta["sources"], meta["tokenizer"], meta["stats"]
        ok = (isinstance(langs, list) and all(isinstance(x, str) and x for x in langs)
              and isinstance(sources, list) and all(isinstance(x, str) for x in sources)
              and len(set(langs)) == len(langs) <= 65536
              and len(set(sources)) == len(sources) <= 65536
              and isinstance(tok, dict)
              and isinstance(tok["kind"], str) and tok["kind"] in ("sentencepiece", "none")
              and _is_int(tok["vocab_size"], 32) and _is_int(tok["model_bytes"])
              and isinstance(meta["compile"], dict)
              and isinstance(tok["model_xxh3"], str) and len(tok["model_xxh3"]) == 16
              and all(c in "0123456789abcdef" for c in tok["model_xxh3"])
              and _is_counts(stats) and isinstance(stats["per_language"], dict)
              and all(_is_counts(v) for v in stats["per_language"].values()))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise Invalid("R11: METADATA members missing or malformed")
    checks = [
        (tok["vocab_size"], hdr["vocab"]), (tok["model_bytes"], sec["TOKENIZER"][1]),
        (stats["utterances"], hdr["n"]), (stats["samples"], hdr["s"]), (stats["tokens"], hdr["t"]),
    ]
    if any(a != b for a, b in checks):
        raise Invalid(f"R11: metadata counts {checks} disagree with the header")
    return meta


def check_arrays(buf, hdr, sec, meta):
    """R12: NUM_SAMPLES, PCM_OFFSETS, TOKEN_OFFSETS, LANGUAGES and SOURCES."""
    n = hdr["n"]
    ns = array(buf, sec, "NUM_SAMPLES", "<u4").astype(np.uint64)
    if n and (ns.min() < 1 or ns.max() > MAX_UTTERANCE_SAMPLES):
        raise Invalid("R12: NUM_SAMPLES out of range")
    po = array(buf, sec, "PCM_OFFSETS", "<u8")
    starts = np.concatenate([[0], np.cumsum(ns)]).astype(np.uint64)
    if not np.array_equal(po, starts[:n]) or int(starts[n]) != hdr["s"]:
        raise Invalid("R12: PCM_OFFSETS are not back to back or do not sum to n_samples")
    to = array(buf, sec, "TOKEN_OFFSETS", "<u8").astype(np.int64)
    counts = np.diff(to)
    if to[0] != 0 or to[-1] != hdr["t"] or (n and (counts.min() < 0 or counts.max() > MAX_TOKENS_PER_UTTERANCE)):
        raise Invalid("R12: TOKEN_OFFSETS invalid")
    for name, table in (("LANGUAGES", meta["languages"]), ("SOURCES", meta["sources"])):
        ids = array(buf, sec, name, "<u2")
        if n and int(ids.max()) >= len(table):
            raise Invalid(f"R12: {name} id out of its table")
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


def zstd_frame_layout(frame):
    """(Frame_Content_Size or None, Dictionary_ID, length of the first frame) of a zstd frame,
    read from its frame header and block headers as RFC 8878 section 3.1.1 describes them."""
    if frame[:4] != ZSTD_FRAME_MAGIC:
        raise ValueError(f"starts with {frame[:4].hex(' ')}, not the zstd frame magic")
    if len(frame) < 5:
        raise ValueError("truncated frame header")
    fhd = frame[4]
    fcs_flag, single_segment, has_checksum, did_flag = fhd >> 6, fhd >> 5 & 1, fhd >> 2 & 1, fhd & 3
    pos = 5 + (0 if single_segment else 1)  # Window_Descriptor
    did_size = (0, 1, 2, 4)[did_flag]
    dictionary_id = int.from_bytes(frame[pos:pos + did_size], "little")
    pos += did_size
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    content_size = None
    if fcs_size:
        content_size = int.from_bytes(frame[pos:pos + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    pos += fcs_size
    while True:
        if pos + 3 > len(frame):
            raise ValueError("truncated block header")
        block_header = int.from_bytes(frame[pos:pos + 3], "little")
        last, block_type, block_size = block_header & 1, block_header >> 1 & 3, block_header >> 3
        if block_type == 3:
            raise ValueError("reserved block type")
        pos += 3 + (1 if block_type == 1 else block_size)  # an RLE block stores one byte
        if last:
            break
    pos += 4 if has_checksum else 0
    if pos > len(frame):
        raise ValueError("truncated frame")
    return content_size, dictionary_id, pos


def check_frame(frame, raw_len, b):
    """V5: a text block is exactly one zstd frame that declares raw_len and needs no dictionary."""
    try:
        content_size, dictionary_id, length = zstd_frame_layout(frame)
    except ValueError as e:
        raise Invalid(f"V5: text block {b} is not one zstd frame: {e}") from None
    if length != len(frame):
        raise Invalid(f"V5: text block {b}: its zstd frame ends at byte {length} of {len(frame)}")
    if content_size != raw_len:
        raise Invalid(f"V5: text block {b}: frame content size {content_size}, raw_len {raw_len}")
    if dictionary_id:
        raise Invalid(f"V5: text block {b}: frame needs dictionary {dictionary_id}")


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
        check_frame(frame, rlen, b)
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
                or not hours_close(s["hours"], c["hours"]):
            raise Invalid(f"V8: stats.per_language[{code!r}] disagrees with the utterances")
    hours = hdr["s"] / SAMPLE_RATE / 3600
    if not hours_close(meta["stats"]["hours"], hours):
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
