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
- JIT code: code in no file (`perf-PID.map`, `[unknown]`): on lavapipe the kernels themselves,
  which CubeCL's device thread runs, so that thread's work is its launches' host side;
- kernel: the operating system's side (`[k]` symbols: yields, sleeps, page faults);
- work: the rest, with its busiest symbols listed.

A build may inline the producer's spin anywhere else (the 2026-12-07 release build put it in
CubeCL's `ComputeClient::launch_inner`, `do_empty` and `do_create`, whose samples the rules
above counted as work: fusion's thread read 1.3 s of work a step instead of 0.09). So with
`--script` it reads `perf script`'s samples and the code's mappings instead, and a sample whose
instruction follows a `pause` (x86's spin hint, `f3 90`) within SPIN_WINDOW bytes of the same
function is spin wherever it was inlined: enqueue or idle spin (by the rules above) in
CubeCL's, fusion's and the loss's enqueue, other spin elsewhere (a lock's). Other spin also
holds the C library's side of a yield or a sleep, with which the rings' spins back off.

    host_profile.py REPORT.txt --frequency HZ --steps N [--json OUT]
        REPORT.txt: perf report --no-children --sort comm,dso,sym -n --stdio -g none
    host_profile.py --script SCRIPT.txt --frequency HZ --steps N [--json OUT]
        SCRIPT.txt: perf script --show-mmap-events -F comm,tid,ip,sym,symoff,dso (the binaries
        read where the recording found them)
"""

import argparse
import json
import re
import sys

# "    12.34%      1234  asrt     asrt               [.] symbol..." (a shared object's name may
# hold spaces: "[JIT] tid 15744").
LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+(.+?)\s+\[(.)\]\s+(.*)$")

CLASSES = ("work", "enqueue spin", "idle spin", "other spin", "CUDA driver", "JIT code", "kernel")

# Code compiled at run time, which perf finds in no file of its own: on lavapipe the device's
# kernels, which CubeCL's device thread runs itself (LLVM's `/tmp/perf-PID.map`, or none).
JIT = re.compile(r"^(perf-\d+\.map|\[unknown\]|//anon|anon|\[JIT\].*)$")

# `perf script -F comm,tid,ip,sym,symoff,dso` sample lines and `--show-mmap-events`' mappings:
#   "   DSU-4-0  7821  55fe91eda05a cubecl_runtime::...::launch_inner+0x1a (/tmp/asrt)"
#   "   spin PERF_RECORD_MMAP2 7820/7820: [0x55fe91eda000(0x1000) @ 0x1000 fe:00 1 2]: r-xp /tmp/spin"
SAMPLE = re.compile(r"^\s*(.+?)\s+(\d+)\s+([0-9a-f]+)\s+(.*?)\s+\(([^()]*)\)\s*$")
MMAP = re.compile(r"PERF_RECORD_MMAP2? \d+/\d+: \[0x([0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|\d+)"
                  r"[^\]]*\]: (\S+) (.+)$")
PAUSE = b"\xf3\x90"
# How far after a `pause` a spin's samples land: the loop's few instructions after it, plus the
# sample's skid. On lavapipe (2026-12-07, bench/RESULTS.md) the training thread's and fusion's
# samples within 64 bytes after one lay 2 to 27 bytes after it, but for 13 of 29,000 (42-58).
SPIN_WINDOW = 32
# Where CubeCL's, fusion's and the loss's enqueue spins are inlined.
ENQUEUE_CODE = re.compile(r"cubecl|burn_fusion|asr_tdt::fusion")


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
    if JIT.match(dso):
        return "JIT code"
    if mark == "k" or dso.startswith("[kernel"):
        return "kernel"
    # The C library's side of a yield or a sleep (the rings' spins back off with both): waiting.
    if re.search(r"(^|_)(sched_yield|nanosleep)(@.*)?$"
                 r"|^std::(thread::(functions::)?|sys::thread::unix::)(sleep|yield_now)$", symbol):
        return "other spin"
    return "work"


class Code:
    """The bytes before a sampled instruction, read from the file mapped where the process ran it."""

    def __init__(self):
        self.maps = []  # (start, end, file offset, path), executable mappings
        self.files = {}
        self.cache = {}

    def mapped(self, line):
        m = MMAP.search(line)
        if not m:
            return
        start, length = int(m.group(1), 16), int(m.group(2), 16)
        off = m.group(3)
        off = int(off, 16) if off.startswith("0x") else int(off)
        if "x" in m.group(4):
            self.maps.append((start, start + length, off, m.group(5).strip()))

    def read(self, path, lo, hi):
        """Bytes [lo, hi) of the file at `path`, or None where it cannot be read."""
        if path not in self.files:
            try:
                self.files[path] = open(path, "rb")
            except OSError:
                self.files[path] = None
        f = self.files[path]
        if f is None or hi <= lo:
            return None
        f.seek(lo)
        return f.read(hi - lo)

    def before_in(self, path, offset, n):
        """The n bytes before `offset` in the file at `path`: `perf script`'s call chains give
        each frame's address as its offset in its file (the sampled address less its
        mapping's start, plus the mapping's file offset)."""
        key = (path, offset, n)
        if key not in self.cache:
            self.cache[key] = self.read(path, max(0, offset - n), offset) if path.startswith("/") else None
        return self.cache[key]

    def before(self, ip, n):
        """The n bytes before a sampled address (`perf script -F ip`: where the process ran
        it) in its mapped file, or None (no mapping, no file, the kernel)."""
        key = (ip, n)
        if key not in self.cache:
            got = None
            for start, end, off, path in reversed(self.maps):
                if start <= ip < end:
                    at = ip - start + off
                    got = self.read(path, max(off, at - n), at)
                    break
            self.cache[key] = got
        return self.cache[key]


def in_kernel(ip, dso):
    """Whether a sample is the operating system's: its address, or perf's name for its code."""
    return ip >= 0xffff800000000000 or dso.startswith("[kernel")


def classify_sample(dso, kernel, symbol, before):
    """`classify`, and a sample within SPIN_WINDOW bytes after a `pause` is spin wherever it is."""
    c = classify(dso, "k" if kernel else ".", symbol)
    if c == "work" and before and PAUSE in before:
        if "Server::start" in symbol:
            return "idle spin"
        return "enqueue spin" if ENQUEUE_CODE.search(symbol) else "other spin"
    return c


def samples_of_script(lines, code):
    """(comm, dso, mark, symbol, count, class) for each sample of `perf script`'s text."""
    for line in lines:
        if "PERF_RECORD_MMAP" in line:
            code.mapped(line)
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        comm, _, ip, sym, path = m.groups()
        ip, dso = int(ip, 16), path.rsplit("/", 1)[-1]
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym.strip())
        kernel = in_kernel(ip, dso)
        before = None if kernel else code.before(ip, SPIN_WINDOW)
        yield comm, dso, "k" if kernel else ".", sym, 1, classify_sample(dso, kernel, sym, before)


def samples_of_report(lines):
    """(comm, dso, mark, symbol, count, class) for each row of `perf report`'s flat text."""
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        _, samples, comm, dso, mark, symbol = m.groups()
        yield comm, dso, mark, symbol.strip(), int(samples), classify(dso, mark, symbol.strip())


def thread_group(comm):
    """Threads by role: CubeCL names its runners DSU-<type>-<index> and DSD-<type>-<index>."""
    return re.sub(r"-\d+-\d+$", "", comm) if re.match(r"DS[UD]-", comm) else comm


def summarise(lines, frequency, steps, script=False):
    """Each thread group's CPU time per step by class; `lines` is perf report's flat text, or
    with `script` perf script's samples and mappings."""
    threads = {}
    rows = samples_of_script(lines, Code()) if script else samples_of_report(lines)
    for comm, dso, mark, symbol, n, c in rows:
        t = threads.setdefault(thread_group(comm), {"samples": 0, "classes": {c: 0 for c in CLASSES},
                                                    "work_symbols": {}})
        t["samples"] += n
        t["classes"][c] += n
        if c == "work":
            name = (re.sub(r"<.*", "", symbol) or symbol)[:90]
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
    ap.add_argument("report", nargs="?")
    ap.add_argument("--script", help="perf script's text (see above) instead of perf report's")
    ap.add_argument("--frequency", type=float, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    path = a.script or a.report
    if not path:
        ap.error("give perf report's text, or perf script's with --script")
    with open(path, errors="replace") as f:
        result = summarise(f, a.frequency, a.steps, script=bool(a.script))
    if not result["threads"]:
        print(f"host_profile: no samples in {path}", file=sys.stderr)
        sys.exit(1)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    for t in result["threads"][:4]:
        shares = ", ".join(f"{c} {100 * v:.0f} %" for c, v in t["shares"].items() if v >= 0.005)
        print(f"{t['thread']}: {t['cpu_seconds_per_step']:.3f} s/step ({shares})")


if __name__ == "__main__":
    main()
