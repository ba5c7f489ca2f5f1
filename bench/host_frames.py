#!/usr/bin/env python3
"""Where a host thread's own work goes, by caller: `perf script` of a call-graph recording.

scripts/gpu/host_profile.py classes each sample by its leaf (work, spin on CubeCL's rings,
driver, kernel) from `perf script`'s flat samples. This reads `perf script`'s call chains
(`perf record --call-graph dwarf`) and, for each thread group's *work* samples (the same
classes, by the leaf), counts every function on the chain once per sample: a function's
inclusive share of the thread's own work. Generic arguments are dropped from the names, so
all of a function's instances count as one; the standard library's frames, and the threads'
entry points, are left out of the list (they include everything).

    perf script -i RUN.perf --show-mmap-events | host_frames.py --frequency HZ --steps N
        [--top K] [--json OUT]
        [--thread NAME] [--match SUBSTRING]

With --match, only the work samples whose chain holds SUBSTRING are counted (what calls it,
what it calls).
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu"))
from host_profile import SPIN_WINDOW, Code, classify_sample, in_kernel, thread_group  # noqa: E402

HEADER = re.compile(r"^(\S.*?)\s+(\d+)(?:/(\d+))?\s+(?:\[\d+\]\s+)?[\d.]+:")
FRAME = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
# Frames that include everything below them, or are plumbing of the standard library.
SKIP = re.compile(r"^(std::|core::|alloc::|__rust|_start|__libc_start|start_thread|clone3?$|"
                  r"<alloc::|<core::|<std::|\[unknown\]|main$|__clone|rust_begin)")


def short(symbol):
    s = re.sub(r"\+0x[0-9a-f]+$", "", symbol.strip())
    # Drop generic arguments, innermost first, so that `a::<b<c>>::f` becomes `a::f`.
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"<[^<>]*>", "", s)
    s = s.replace("::::", "::")
    s = re.sub(r"::h[0-9a-f]{16}$", "", s)
    return s[:110]


def samples(lines, code):
    """(comm, frames) per sample; each frame (address, symbol, dso). The mappings, where
    `perf script --show-mmap-events` printed them, go to `code`."""
    comm, frames = None, []
    for line in lines:
        if "PERF_RECORD_MMAP" in line:
            code.mapped(line)
            continue
        if not line.strip():
            if comm is not None:
                yield comm, frames
            comm, frames = None, []
            continue
        m = HEADER.match(line)
        if m and not line.startswith((" ", "\t")):
            if comm is not None:
                yield comm, frames
            comm, frames = m.group(1), []
            continue
        f = FRAME.match(line)
        if f and comm is not None:
            frames.append((int(f.group(1), 16), f.group(2), f.group(3)))
    if comm is not None:
        yield comm, frames


def summarise(lines, frequency, steps, top, match):
    threads = {}
    code = Code()
    for comm, frames in samples(lines, code):
        if not frames:
            continue
        g = threads.setdefault(thread_group(comm), {"samples": 0, "work": 0, "matched": 0,
                                                    "inclusive": {}, "leaf": {}})
        g["samples"] += 1
        ip, sym, path = frames[0]
        # An inlined leaf (`(inlined)`) is in the binary of the first real frame below it: perf
        # prints the inlined frames at the leaf's address, and then the caller.
        path = next((p for _, _, p in frames if p != "inlined"), path)
        dso = os.path.basename(path)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        kernel = in_kernel(ip, dso)
        # The leaf's class as host_profile.py gives it: spin by the `pause` before the sample
        # (with the mappings; call chains give addresses relative to the binary's load
        # address), wherever the build inlined the loop.
        before = None if kernel else code.before_in(path, ip, SPIN_WINDOW)
        if classify_sample(dso, kernel, sym, before) != "work":
            continue
        g["work"] += 1
        names = [short(s) for _, s, _ in frames]
        if match and not any(match in n for n in names):
            continue
        g["matched"] += 1
        g["leaf"][names[0]] = g["leaf"].get(names[0], 0) + 1
        for n in set(names):
            if not SKIP.match(n):
                g["inclusive"][n] = g["inclusive"].get(n, 0) + 1
    out = []
    for name, g in sorted(threads.items(), key=lambda kv: -kv[1]["work"]):
        base = g["matched"] or 1
        out.append({
            "thread": name,
            "samples": g["samples"],
            "work_samples": g["work"],
            "matched_samples": g["matched"],
            "work_seconds_per_step": g["work"] / frequency / steps,
            "inclusive": [{"function": f, "share": n / base, "seconds_per_step": n / frequency / steps}
                          for f, n in sorted(g["inclusive"].items(), key=lambda kv: -kv[1])[:top]],
            "leaf": [{"function": f, "share": n / base}
                     for f, n in sorted(g["leaf"].items(), key=lambda kv: -kv[1])[:top]],
        })
    return {"frequency": frequency, "steps": steps, "match": match, "threads": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frequency", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--threads", type=int, default=3, help="how many thread groups to print")
    ap.add_argument("--thread", help="print only this thread group (asrt, DSU, DSD)")
    ap.add_argument("--match")
    ap.add_argument("--json")
    a = ap.parse_args()
    result = summarise(sys.stdin, a.frequency, a.steps, a.top, a.match)
    if not result["threads"]:
        print("host_frames: no samples with call chains on standard input", file=sys.stderr)
        sys.exit(1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    shown = [t for t in result["threads"] if t["thread"] == a.thread] if a.thread else result["threads"]
    for t in shown[:a.threads]:
        extra = f", {t['matched_samples']} matching {a.match!r}" if a.match else ""
        print(f"== {t['thread']}: {t['samples']} samples, {t['work_samples']} work "
              f"({t['work_seconds_per_step']:.4f} s/step){extra}")
        for e in t["inclusive"]:
            print(f"  {100 * e['share']:5.1f} %  {e['seconds_per_step']:.4f} s/step  {e['function']}")
        print("  -- leaves:")
        for e in t["leaf"][:12]:
            print(f"  {100 * e['share']:5.1f} %  {e['function']}")


if __name__ == "__main__":
    main()
