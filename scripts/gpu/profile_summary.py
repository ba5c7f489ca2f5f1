#!/usr/bin/env python3
"""Sums CubeCL's per-kernel profile (CUBECL_DEBUG_LOG=FILE) by kernel: seconds and launches, the
first launch after each compilation (which includes it) counted apart.

    profile_summary.py LOG                                   the whole log, as tables
    profile_summary.py LOG --minus LOG1 --steps N [--json F] one steady step: LOG's run of K + N
                                                             steps less LOG1's run of K steps
                                                             (same plan), divided by N

A launch's time is the device's, as CubeCL's profiler measures it; launches counts every launch,
including the first after a compilation, whose time is left out of the seconds (it includes the
compilation). Standard library only: the GPU machine has no network.
"""
import argparse
import collections
import json
import re

UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
# One launch: `| DURATION | KERNEL...`. The profiler's periodic summary tables have rows that
# start with `| ` too, but end with `|`.
LAUNCH = re.compile(r"^\| ([0-9.]+)(ns|µs|us|ms|s) *\| (\w+)(.*)")


class Profile:
    """One log's launches by kernel name."""

    def __init__(self, path):
        self.seconds = collections.Counter()
        self.launches = collections.Counter()
        self.detail = collections.Counter()
        self.compilations = 0
        self.first_launch_seconds = 0.0  # launches right after a compilation: they include it
        self.order = []
        just_compiled = False
        for line in open(path, errors="replace"):
            if line.startswith("[START_KERNEL_COMPILATION]"):
                self.compilations += 1
                just_compiled = True
                continue
            if line.rstrip().endswith("|"):
                continue
            m = LAUNCH.match(line)
            if not m:
                continue
            v = float(m.group(1)) * UNIT[m.group(2)]
            name = m.group(3)
            self.launches[name] += 1
            if just_compiled:
                just_compiled = False
                self.first_launch_seconds += v
                continue
            fams = " ".join(re.findall(r"(\w+(?:Family|Kernel|Args|Op))", m.group(4)))[:120]
            self.seconds[name] += v
            self.detail[(name, fams)] += v
            self.order.append((name, v))


def tables(p):
    print(f"kernel compilations: {p.compilations}, their first launches {p.first_launch_seconds:.2f} s; "
          f"other launches {len(p.order)}, {sum(p.seconds.values()):.2f} s")
    print("\nby kernel:")
    for k, v in p.seconds.most_common(40):
        n = max(1, p.launches[k])
        print(f"{v:9.3f} s {p.launches[k]:8d} launches  {v / n * 1e6:10.1f} us/launch  {k}")
    print("\nby kernel and variant:")
    for (k, f), v in p.detail.most_common(30):
        print(f"{v:9.3f} s  {k}  {f}")
    # Launches longer than 50 ms (first launches include compilation).
    print("\nlaunches over 50 ms:", sum(1 for _, v in p.order if v > 0.05),
          f"({sum(v for _, v in p.order if v > 0.05):.2f} s)")


def step(longer, shorter, steps):
    """One step's launches and device time: (longer - shorter) / steps, by kernel."""
    names = set(longer.launches) | set(shorter.launches)
    rows = []
    for k in names:
        rows.append({"kernel": k,
                     "launches_per_step": (longer.launches[k] - shorter.launches[k]) / steps,
                     "seconds_per_step": (longer.seconds[k] - shorter.seconds[k]) / steps})
    rows.sort(key=lambda r: -r["seconds_per_step"])
    return {
        "steps": steps,
        "launches_per_step": (sum(longer.launches.values()) - sum(shorter.launches.values())) / steps,
        "device_seconds_per_step": (sum(longer.seconds.values()) - sum(shorter.seconds.values())) / steps,
        "compilations_per_step": (longer.compilations - shorter.compilations) / steps,
        "by_kernel": rows,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("--minus", help="the log of the same run with fewer steps")
    ap.add_argument("--steps", type=int, default=1, help="how many more steps LOG ran than --minus's")
    ap.add_argument("--json", help="write the step's figures here")
    a = ap.parse_args()
    longer = Profile(a.log)
    if not a.minus:
        tables(longer)
        return
    s = step(longer, Profile(a.minus), max(1, a.steps))
    print(f"one step ({a.log} less {a.minus}, over {s['steps']}): {s['launches_per_step']:.0f} launches, "
          f"{s['device_seconds_per_step']:.4f} s of device time, {s['compilations_per_step']:.1f} compilations")
    print("\nby kernel, per step:")
    for r in s["by_kernel"][:40]:
        n = r["launches_per_step"]
        per = f"{r['seconds_per_step'] / n * 1e6:10.1f} us/launch" if n > 0 else " " * 20
        print(f"{r['seconds_per_step']:9.4f} s {n:9.1f} launches {per}  {r['kernel']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()
