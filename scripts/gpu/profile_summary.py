#!/usr/bin/env python3
"""Sums CubeCL's per-kernel profile (CUBECL_DEBUG_LOG=FILE) by kernel: seconds and launches, the
first launch after each compilation (which includes it) counted apart."""
import collections
import re
import sys

UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
total, count, detail = collections.Counter(), collections.Counter(), collections.Counter()
compiles = 0
order = []
first_launch = 0.0  # launches right after a compilation: they include it
just_compiled = False
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("[START_KERNEL_COMPILATION]"):
        compiles += 1
        just_compiled = True
        continue
    m = re.match(r"^\| ([0-9.]+)(ns|µs|us|ms|s) *\| (\w+)(.*)", line)
    if not m:
        continue
    v = float(m.group(1)) * UNIT[m.group(2)]
    name = m.group(3)
    if just_compiled:
        just_compiled = False
        first_launch += v
        continue
    fams = " ".join(re.findall(r"(\w+(?:Family|Kernel|Args|Op))", m.group(4)))[:120]
    total[name] += v
    count[name] += 1
    detail[(name, fams)] += v
    order.append((name, v))
print(f"kernel compilations: {compiles}, their first launches {first_launch:.2f} s; other launches "
      f"{len(order)}, {sum(total.values()):.2f} s")
print("\nby kernel:")
for k, v in total.most_common(40):
    print(f"{v:9.3f} s {count[k]:8d} launches  {v / count[k] * 1e6:10.1f} us/launch  {k}")
print("\nby kernel and variant:")
for (k, f), v in detail.most_common(30):
    print(f"{v:9.3f} s  {k}  {f}")
# Launches longer than 50 ms (first launches include compilation).
print("\nlaunches over 50 ms:", sum(1 for _, v in order if v > 0.05), f"({sum(v for _, v in order if v > 0.05):.2f} s)")
