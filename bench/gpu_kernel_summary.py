#!/usr/bin/env python3
"""GPU time of profiled steps, side by side: where one trainer's step differs from another's.

Reads Chrome traces with CUDA activity (`fsdp train --profile-steps A:B`'s
traces/rank0.json, `bench/pytorch_peer.py --profile-step N --trace FILE`;
gzipped or not) and prints, per trace, the GPU's busy time and idle time
within the step, kernel time by kind of work, and the kernels with the most
time. Kernels overlap only across streams, so busy time is the union of
their intervals, not their sum.

    python3 bench/gpu_kernel_summary.py out/A/traces/rank0.json peer.json [--names fsdp.cpp FSDP2] [--steps 1 1]
"""

import argparse
import collections
import gzip
import json
import re

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# First match wins: the kind of work a kernel's name says it does.
KINDS = (
    ("collectives", r"nccl"),
    ("attention", r"flash|fmha|sdpa|attention|cudnn"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_.*tensorop|ampere_|hopper"),
    ("optimizer", r"adam|multi_tensor"),
    ("loss and softmax", r"softmax|cross_entropy|nll_loss|log_softmax"),
    ("norm", r"norm|rms"),
    ("reduction", r"reduce|sum|mean"),
    ("copies and casts", r"memcpy|memset|copy|cast|fill|to_copy|cat|index"),
    ("element-wise", r"elementwise|vectorized|unrolled|pointwise|triton"),
)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]


def kind_of(name):
    lowered = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, lowered):
            return kind
    return "other"


def short(name, width=100):
    """ATen's kernels are templates named by their functor and element type: keep those."""
    name = name.removeprefix("void ")
    if len(name) <= width:
        return name
    base, _, rest = name.partition("<")
    rest = re.sub(r"^\d+, ", "", rest)
    rest = rest.replace("at::native::", "").replace("(anonymous namespace)::", "").replace("gpu_kernel_impl_nocast<", "")
    functor = re.split(r"[(<,]", rest, maxsplit=1)[0]
    types = re.findall(r"lambda\(([\w:]+)\)", name) or re.findall(r"<(float|double|c10::BFloat16|c10::Half)[,>]", name)
    label = f"{base.split('::')[-1]}[{functor}{' ' + types[-1] if types else ''}]"
    return label if len(label) <= width else label[: width - 3] + "..."


def busy_us(events):
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(events, steps):
    first = min(e["ts"] for e in events)
    last = max(e["ts"] + e.get("dur", 0) for e in events)
    by_kind, by_name, count = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        by_kind[kind_of(e["name"])] += e.get("dur", 0)
        by_name[short(e["name"])] += e.get("dur", 0)
        count[short(e["name"])] += 1
    busy = busy_us(events)
    return {"span": (last - first) / steps / 1e3, "busy": busy / steps / 1e3, "launches": len(events) / steps,
            "kinds": {k: v / steps / 1e3 for k, v in by_kind.items()},
            "names": {k: v / steps / 1e3 for k, v in by_name.items()}, "count": count}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--names", nargs="+", help="a column name per trace (default: the file names)")
    p.add_argument("--steps", nargs="+", type=int, help="steps each trace covers (times are per step)")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    names = a.names or a.traces
    steps = a.steps or [1] * len(a.traces)
    if len(names) != len(a.traces) or len(steps) != len(a.traces):
        p.error("--names and --steps take one value per trace")
    runs = []
    for path, n in zip(a.traces, steps):
        events = load(path)
        if not events:
            p.error(f"{path}: no GPU activity (kernel, gpu_memcpy, gpu_memset events) in the trace")
        runs.append(summarize(events, n))

    header = "| ms per step | " + " | ".join(names) + " |"
    rule = "| --- |" + " --- |" * len(names)
    print(header + "\n" + rule)
    for label, key in (("first kernel to last", "span"), ("GPU busy", "busy")):
        print(f"| {label} | " + " | ".join(f"{r[key]:.2f}" for r in runs) + " |")
    print("| GPU idle in the step | " + " | ".join(f"{r['span'] - r['busy']:.2f}" for r in runs) + " |")
    print("| launches | " + " | ".join(f"{r['launches']:.0f}" for r in runs) + " |")
    kinds = sorted({k for r in runs for k in r["kinds"]}, key=lambda k: -max(r["kinds"].get(k, 0) for r in runs))
    for k in kinds:
        print(f"| {k} | " + " | ".join(f"{r['kinds'].get(k, 0):.2f}" for r in runs) + " |")
    for name, r in zip(names, runs):
        print(f"\n{name}: the {a.top} kernels with the most time (ms per step, launches)\n")
        for kernel, ms in sorted(r["names"].items(), key=lambda kv: -kv[1])[: a.top]:
            print(f"  {ms:8.2f}  {r['count'][kernel]:5d}  {kernel}")


if __name__ == "__main__":
    main()
