#!/usr/bin/env python3
"""Cut a FLAC file at a frame boundary (keeps original encoder's frames byte-exact).

usage: trunc.py IN OUT MAX_BYTES
Keeps all metadata blocks, then as many whole frames as fit into MAX_BYTES total,
then patches STREAMINFO total_samples and MD5 (MD5 computed by md5wav.py from the
reference `flac -d` WAV output of the cut file). Streams without fLaC marker
are cut after any leading junk + whole frames, without patching.
"""
import hashlib, subprocess, sys, tempfile, os

def crc8(b):
    c = 0
    for x in b:
        c ^= x
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else (c << 1) & 0xFF
    return c

T16 = []
for i in range(256):
    c = i << 8
    for _ in range(8):
        c = ((c << 1) ^ 0x8005) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
    T16.append(c)

def crc16(b):
    c = 0
    for x in b:
        c = ((c << 8) & 0xFFFF) ^ T16[(c >> 8) ^ x]
    return c

def parse_header(d, p):
    """Return (header_len, blocksize) if a valid frame header starts at p, else None."""
    if p + 6 > len(d) or d[p] != 0xFF or (d[p + 1] & 0xFE) != 0xF8:
        return None
    bs_code, sr_code = d[p + 2] >> 4, d[p + 2] & 0xF
    ch, ss, res = d[p + 3] >> 4, (d[p + 3] >> 1) & 7, d[p + 3] & 1
    if bs_code == 0 or sr_code == 0xF or ch > 10 or res:
        return None
    q = p + 4
    # UTF-8-like coded number
    b0 = d[q]
    if b0 < 0x80: n = 0
    elif 0xC0 <= b0 < 0xE0: n = 1
    elif 0xE0 <= b0 < 0xF0: n = 2
    elif 0xF0 <= b0 < 0xF8: n = 3
    elif 0xF8 <= b0 < 0xFC: n = 4
    elif 0xFC <= b0 < 0xFE: n = 5
    elif b0 == 0xFE: n = 6
    else: return None
    q += 1
    for _ in range(n):
        if q >= len(d) or (d[q] & 0xC0) != 0x80:
            return None
        q += 1
    if bs_code == 1: bs = 192
    elif 2 <= bs_code <= 5: bs = 576 << (bs_code - 2)
    elif bs_code == 6: bs = d[q] + 1; q += 1
    elif bs_code == 7: bs = (d[q] << 8 | d[q + 1]) + 1; q += 2
    else: bs = 256 << (bs_code - 8)
    if sr_code == 12: q += 1
    elif sr_code in (13, 14): q += 2
    if q >= len(d) or crc8(d[p:q]) != d[q]:
        return None
    return q + 1 - p, bs

def main():
    src, dst, maxb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    d = open(src, 'rb').read()
    p, si = 4, None
    if d[:4] != b'fLaC':  # raw frame stream (uncommon/10) or junk + frames (uncommon/11): keep prefix as is
        p = next(i for i in range(len(d) - 1) if parse_header(d, i))
    while d[:4] == b'fLaC':
        last, typ = d[p] >> 7, d[p] & 0x7F
        ln = int.from_bytes(d[p + 1:p + 4], 'big')
        if typ == 0: si = p + 4
        p += 4 + ln
        if last: break
    first = p
    # candidate headers
    cands = [i for i in range(first, len(d) - 1) if d[i] == 0xFF and (d[i + 1] & 0xFE) == 0xF8 and parse_header(d, i)]
    cands.append(len(d))
    frames, start, total = [], first, 0
    ci = 0
    while start < len(d):
        # next true boundary: the first candidate > start such that CRC-16 over [start, cand) == 0
        ci = next(k for k in range(ci, len(cands)) if cands[k] > start)
        k = ci
        while k < len(cands) and crc16(d[start:cands[k]]) != 0:
            k += 1
        if k == len(cands):
            break
        end = cands[k]
        frames.append((start, end, parse_header(d, start)[1], d[start + 2] & 0xF, d[start + 3]))
        start = end
    for a, b in zip(frames, frames[1:]):
        key = lambda f: (f[3], min(f[4] >> 4, 7) if f[4] >> 4 < 8 else 1, f[4] & 0x0E)  # rate code, channels-1 (stereo modes -> 1), bps code
        if key(a) != key(b):
            print(f'  param change at byte {b[0]} (rate code {a[3]}->{b[3]}, ch/bps byte {a[4]:#04x}->{b[4]:#04x})')
    keep = [f for f in frames if f[1] <= maxb]
    if not keep:
        keep = frames[:1]
    cut = keep[-1][1]
    nsamp = sum(f[2] for f in keep)
    out = bytearray(d[:cut])
    print(f'{src}: {len(frames)} frames total, keeping {len(keep)} frames, {nsamp} samples, {cut} bytes')
    # patch total samples (36 bits at STREAMINFO byte 13 low nibble .. byte 17)
    orig_total = int.from_bytes(d[si + 13:si + 18], 'big') & 0xFFFFFFFFF if si is not None else 0
    orig_md5 = d[si + 18:si + 34] if si is not None else bytes(16)
    if si is not None and orig_total == 0 and orig_md5 == bytes(16):
        si = None  # 'unknown' total and MD5 (e.g. uncommon/01-04): leave STREAMINFO as is
    if si is not None:
        b13 = out[si + 13] & 0xF0
        out[si + 13] = b13 | ((nsamp >> 32) & 0xF)
        out[si + 14:si + 18] = (nsamp & 0xFFFFFFFF).to_bytes(4, 'big')
        if orig_total == 0:  # keep 'unknown total samples' (subset/45)
            out[si + 13] = b13; out[si + 14:si + 18] = bytes(4)
        out[si + 18:si + 34] = bytes(16)  # MD5 unknown while decoding
    if si is None:
        open(dst, 'wb').write(out)
        return
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, 'x.flac')
        open(tmp, 'wb').write(out)
        bps = ((out[si + 12] & 1) << 4 | out[si + 13] >> 4) + 1
        md5 = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'md5wav.py'), tmp, str(bps)],
                             check=True, capture_output=True, text=True).stdout.split()[0]
    out[si + 18:si + 34] = bytes.fromhex(md5)
    open(dst, 'wb').write(out)

if __name__ == '__main__':
    main()
