#!/usr/bin/env python3
"""Reads CubeCL's memory log (`ASRT_MEMORY_LOG=FILE asrt train ...`) and says where the device
memory pool's reservations went: for each pool, its page size and largest slice, the pages it
took from the device and the bytes it reserved and had in use when it last took one, and the
buffers it was asked for (how many, the largest).

    pool_summary.py LOG [--json F] [--name "Main GPU Memory"]

Why: asrt's metrics give the pool's bytes in use and reserved by phase of a step; when reserved
is far above in use, this says which pool holds the difference and for which sizes. CubeCL's
default pools (cubecl-runtime 0.10, `MemoryConfiguration::SubSlices`) take whole pages from the
device, one size per pool, a quarter of the previous pool's, the largest a quarter of the
device's memory on CUDA; a buffer goes to the first pool whose largest slice holds it, or whose
page it fills to within 20 %.

The log: the pools as configured (`Using memory pool`, exact sizes), one line per buffer handed
out (`Reserved memory 4.20 MB using dynamic pool`, three significant digits), and each time a
pool takes a new page, the layout of every pool. Pages are only returned to the device by an
explicit cleanup, so the last layout is the largest; a cleanup shows as a later layout with
fewer pages, and the summary reports the layout with the most bytes reserved.

Standard library only: the GPU machine has no network.
"""
import argparse
import json
import re
import sys

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
SIZE = r"([0-9.]+) (B|KB|MB|GB|TB)"
POOL_OPTIONS = re.compile(
    r"pool_type: (SlicedPages \{ page_size: (\d+), max_slice_size: (\d+) \}|ExclusivePages \{ max_alloc_size: (\d+) \})")
RESERVED = re.compile(r"^\[(.+?)\] Reserved memory " + SIZE + " using dynamic pool")
RESERVED_PERSISTENT = re.compile(r"^\[(.+?)\] Reserved memory (\d+) using persistent memory")
NEW_PAGE = re.compile(r"^\[(.+?)\],? Allocated a new memory page")
SLICED = re.compile(r"^ - Sliced Pool page_size=" + SIZE + " max_alloc_size=" + SIZE)
EXCLUSIVE = re.compile(r"^ - Exclusive Pool max_alloc_size=" + SIZE)
SLICED_PAGE = re.compile(r"^   - Page StorageId\(\d+\) num_slices=(\d+) => " + SIZE + " free - " + SIZE + " full - " + SIZE + " total")
EXCLUSIVE_PAGE = re.compile(r"^   - Page " + SIZE + " is_free=(true|false)")
PERSISTENT_SLICES = re.compile(r"^  - Slices " + SIZE + r" =>  (\d+) free - (\d+) full - (\d+) total")
IN_USE = re.compile(r"^  Bytes in use: " + SIZE)
TOTAL = re.compile(r"^  Total bytes reserved: " + SIZE)


def size(number, unit):
    return float(number) * UNITS[unit]


class Pool:
    """One dynamic pool as configured: `page` None for an exclusive pool."""

    def __init__(self, page, largest):
        self.page, self.largest = page, largest

    def accepts(self, n):
        # cubecl-runtime 0.10's `SlicedPool::accept` and `ExclusiveMemoryPool::accept`.
        if self.page is None:
            return n <= self.largest
        return n <= self.largest or (self.page >= n and (self.page - n) * 5 < self.page)

    def name(self):
        if self.page is None:
            return f"exclusive, buffers up to {fmt(self.largest)}"
        return f"pages of {fmt(self.page)}, slices up to {fmt(self.largest)}"


def fmt(n):
    for unit in ("GB", "MB", "KB"):
        if n >= UNITS[unit]:
            return f"{n / UNITS[unit]:.2f} {unit}"
    return f"{n:.0f} B"


def parse_layout(lines):
    """One layout dump: the persistent pool's bytes and each dynamic pool's pages and bytes."""
    pools, current, section, persistent = [], None, None, {"reserved": 0.0, "in_use": 0.0, "slices": 0}
    summary = {}
    for line in lines:
        if line.startswith("## "):
            section = line[3:].strip()
            current = None
            continue
        m = SLICED.match(line)
        if m:
            current = {"kind": "sliced", "page": size(m[1], m[2]), "largest": size(m[3], m[4]), "pages": 0,
                       "reserved": 0.0, "in_use": 0.0}
            pools.append(current)
            continue
        m = EXCLUSIVE.match(line)
        if m:
            current = {"kind": "exclusive", "page": None, "largest": size(m[1], m[2]), "pages": 0,
                       "reserved": 0.0, "in_use": 0.0}
            pools.append(current)
            continue
        if (SLICED_PAGE.match(line) or EXCLUSIVE_PAGE.match(line)) and current is not None:
            current["pages"] += 1
            continue
        m = PERSISTENT_SLICES.match(line)
        if m and section == "Persistent":
            persistent["slices"] += int(m[5])
            continue
        m = IN_USE.match(line)
        if m:
            target = current if current is not None else (persistent if section == "Persistent" else summary)
            target["in_use"] = size(m[1], m[2])
            continue
        m = TOTAL.match(line)
        if m:
            target = current if current is not None else (persistent if section == "Persistent" else summary)
            target["reserved"] = size(m[1], m[2])
    return {"pools": pools, "persistent": persistent, "summary": summary}


def summarise(path, name):
    configured, requests, persistent_requests = [], [], []
    sets = 1
    layouts, dump = [], None

    def close():
        if dump is not None:
            layouts.append(parse_layout(dump))

    with open(path, errors="replace") as f:
        lines = iter(f.read().splitlines())
    for line in lines:
        if line.startswith(f"[{name}] Using memory pool"):
            m = POOL_OPTIONS.search(next(lines, ""))
            pool = None
            if m and m[2]:
                pool = Pool(int(m[2]), int(m[3]))
            elif m:
                pool = Pool(None, int(m[4]))
            # CUDA keeps one pool set per stream, each configured alike and logged under the
            # same name: the first set is the configuration, each repeat of its first pool one
            # more set.
            if pool is not None:
                if configured and (pool.page, pool.largest) == (configured[0].page, configured[0].largest):
                    sets += 1
                elif sets == 1:
                    configured.append(pool)
            continue
        if line.startswith("["):
            # A new log line ends the layout being read.
            close()
            dump = None
            m = NEW_PAGE.match(line)
            if m and m[1] == name:
                dump = []
                continue
            m = RESERVED.match(line)
            if m and m[1] == name:
                # The size as printed, less half its last digit: the smallest it can be (a
                # buffer within that of a pool's limit may be counted in the pool beside it).
                digits = m[2].split(".")[1] if "." in m[2] else ""
                requests.append(size(m[2], m[3]) - 0.5 * 10 ** -len(digits) * UNITS[m[3]])
                continue
            m = RESERVED_PERSISTENT.match(line)
            if m and m[1] == name:
                persistent_requests.append(int(m[2]))
            continue
        if dump is not None:
            dump.append(line)
    close()
    if not configured and not layouts:
        return None
    # The layout with the most bytes reserved (the last, unless the pool was cleaned up).
    layout = max(layouts, key=lambda l: l["summary"].get("reserved", 0.0)) if layouts else None
    by_pool = [[] for _ in configured]
    unplaced = []
    for n in requests:
        k = next((i for i, p in enumerate(configured) if p.accepts(n)), None)
        (by_pool[k] if k is not None else unplaced).append(n)
    rows = []
    # A sliced pool without pages is left out of a layout: match them by their (rounded) sizes.
    shown = layout["pools"] if layout else []

    def seen_of(p):
        for d in shown:
            ours = p.page if p.page is not None else p.largest
            theirs = d["page"] if d["page"] is not None else d["largest"]
            if (d["page"] is None) == (p.page is None) and abs(theirs - ours) <= 0.01 * max(ours, 1):
                return d
        return {}

    for i, p in enumerate(configured):
        seen = seen_of(p)
        page = p.page
        rows.append({
            "pool": p.name(),
            "page_bytes": page,
            "largest_slice_bytes": p.largest,
            "pages": seen.get("pages", 0),
            # Exact for a sliced pool (pages of one size); as the log prints it otherwise.
            "reserved_bytes": page * seen.get("pages", 0) if page is not None else seen.get("reserved", 0.0),
            "in_use_bytes": seen.get("in_use", 0.0),
            "requests": len(by_pool[i]),
            "largest_request_bytes": max(by_pool[i], default=0.0),
        })
    total = layout["summary"].get("reserved") if layout else None
    return {
        "log": path, "name": name, "layouts": len(layouts), "pool_sets": sets,
        "pools": rows,
        "persistent": {**(layout["persistent"] if layout else {}), "requests": len(persistent_requests),
                       "largest_request_bytes": max(persistent_requests, default=0)},
        "reserved_bytes": total,
        "in_use_bytes": layout["summary"].get("in_use") if layout else None,
        "requests": len(requests), "largest_request_bytes": max(requests, default=0.0),
        "requests_no_pool_accepts": len(unplaced),
    }


def table(s):
    sets = f" ({s['pool_sets']} sets of pools, one per stream: their logs mixed)" if s["pool_sets"] > 1 else ""
    out = [f"{s['layouts']} page(s) taken{sets}; at the largest layout {fmt(s['reserved_bytes'] or 0)} reserved, "
           f"{fmt(s['in_use_bytes'] or 0)} in use; {s['requests']} buffers asked for, the largest "
           f"{fmt(s['largest_request_bytes'])}",
           "",
           "| pool | pages | reserved | in use | buffers asked | largest asked |",
           "|---|---|---|---|---|---|"]
    for r in s["pools"]:
        out.append(f"| {r['pool']} | {r['pages']} | {fmt(r['reserved_bytes'])} | {fmt(r['in_use_bytes'])} | "
                   f"{r['requests']} | {fmt(r['largest_request_bytes'])} |")
    p = s["persistent"]
    if p.get("slices") or p.get("requests"):
        out.append(f"| persistent (exact sizes) | {p.get('slices', 0)} buffers | {fmt(p.get('reserved', 0.0))} | "
                   f"{fmt(p.get('in_use', 0.0))} | {p['requests']} | {fmt(p['largest_request_bytes'])} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--json", help="write the summary as JSON to this file")
    ap.add_argument("--name", default="Main GPU Memory", help="the memory management to read")
    a = ap.parse_args()
    s = summarise(a.log, a.name)
    if s is None:
        sys.exit(f"{a.log}: no pool of {a.name!r} in this log (was ASRT_MEMORY_LOG set, on wgpu or CUDA?)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    print(table(s))


if __name__ == "__main__":
    main()
