#!/usr/bin/env python3
"""Where the training process's host threads spend their CPU time, from `perf report`'s text.

The GPU kit's step hp records the 0.6B preset's warm run with `perf record -F FREQ -p PID`
from its third step on, then reads `perf report --sort comm,dso,sym -n --stdio -g none`.
threads.py says how busy each thread is; it cannot say whether a thread works or waits
busily. CubeCL 0.10's channels between the training thread, fusion's thread (DSU-*) and the
device's (DSD-*) are double-buffered rings of 32 tasks whose producers spin while the ring is
full and whose consumers spin before they sleep, so a thread at 70 % may be spinning most of
that time. Each sample is classed by its symbol:

- enqueue spin: `ChannelDeviceHandle::submit_inner`, where the producer's spin on a full ring
  is inlined (its own work there, building a small closure, is a few instructions), and
  burn-fusion's `GlobalFusionClient::register`, where the compiler inlines that same spin
  (`perf annotate` on lavapipe, 2026-11-30: 76-88 % of each of its copies' samples on the
  instruction after the loop's `pause`; its own work, the outputs' handles, is a few
  allocations per operation);
- idle spin: `custom_channel::Server::start`, the consumer's spin on an empty ring;
- CUDA driver: anything in `libcuda` (launches, and the driver's own waits in a sync);
- kernel: the operating system's side (`[k]` symbols: yields, sleeps, page faults);
- work: the rest, with its busiest symbols listed.

    host_profile.py REPORT.txt --frequency HZ --steps N [--json OUT]
"""

import argparse
import json
import re
import sys

# "    12.34%      1234  asrt     asrt               [.] symbol..." (a shared object's name may
# hold spaces: "[JIT] tid 15744").
LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+(.+?)\s+\[(.)\]\s+(.*)$")

CLASSES = ("work", "enqueue spin", "idle spin", "CUDA driver", "kernel")


def classify(dso, mark, symbol):
    # (In an unoptimised build, as a dry run's, the loop is `DeviceClient::enqueue`, and the
    # `spin_loop` it calls, shared with the consumer's loop, counts as work.)
    if ("submit_inner" in symbol or "DeviceClient::enqueue" in symbol
            or re.search(r"GlobalFusionClient<.*>::register$", symbol)
            or re.search(r"asr_tdt::fusion::enqueue(<|$)", symbol)):
        return "enqueue spin"
    if "Server::start" in symbol:
        return "idle spin"
    if dso.startswith("libcuda"):
        return "CUDA driver"
    if mark == "k" or dso.startswith("[kernel"):
        return "kernel"
    return "work"


def thread_group(comm):
    """Threads by role: CubeCL names its runners DSU-<type>-<index> and DSD-<type>-<index>."""
    return re.sub(r"-\d+-\d+$", "", comm) if re.match(r"DS[UD]-", comm) else comm


def summarise(lines, frequency, steps):
    threads = {}
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        _, samples, comm, dso, mark, symbol = m.groups()
        t = threads.setdefault(thread_group(comm), {"samples": 0, "classes": {c: 0 for c in CLASSES},
                                                    "work_symbols": {}})
        n = int(samples)
        t["samples"] += n
        c = classify(dso, mark, symbol.strip())
        t["classes"][c] += n
        if c == "work":
            name = (re.sub(r"<.*", "", symbol.strip()) or symbol.strip())[:90]
            if re.fullmatch(r"0x[0-9a-f]+", name):
                name = f"unnamed code in {dso}"
            t["work_symbols"][name] = t["work_symbols"].get(name, 0) + n
    out = []
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["samples"]):
        total = t["samples"]
        seconds = total / frequency
        top = sorted(t["work_symbols"].items(), key=lambda kv: -kv[1])[:5]
        out.append({
            "thread": name,
            "cpu_seconds": seconds,
            "cpu_seconds_per_step": seconds / steps if steps else None,
            "shares": {c: n / total for c, n in t["classes"].items()} if total else {},
            "work_seconds_per_step": t["classes"]["work"] / frequency / steps if steps else None,
            "top_work": [{"symbol": s, "share_of_thread": n / total} for s, n in top],
        })
    return {"frequency": frequency, "steps": steps, "threads": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--frequency", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.report, errors="replace") as f:
        result = summarise(f, a.frequency, a.steps)
    if not result["threads"]:
        print(f"host_profile: no samples in {a.report}", file=sys.stderr)
        sys.exit(1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    for t in result["threads"][:4]:
        shares = ", ".join(f"{c} {100 * v:.0f} %" for c, v in t["shares"].items() if v >= 0.005)
        print(f"{t['thread']}: {t['cpu_seconds_per_step']:.3f} s/step ({shares})")


if __name__ == "__main__":
    main()
