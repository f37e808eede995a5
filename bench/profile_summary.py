#!/usr/bin/env python3
"""Per-operator self time of a profiled step, by kind of work and phase.

Reads the Chrome trace `fsdp train --profile-steps A:B` writes
(traces/rank<N>.json, LibTorch's profiler) and prints two Markdown tables:
self time by category (matmuls, the fused attention, element-wise, softmax and loss, layer norm,
the optimizer's update, allocation and copies, framework overhead) split by
the trainer's phases
(the train::forward / train::backward / train::optimizer ranges), and the
operators with the most self time. Self time is an event's duration less
its children's on the same thread, so nothing is counted twice.

    python3 bench/profile_summary.py out/RUN/traces/rank0.json [--steps N] [--top K]

With --waits it prints instead where a sharded step waits for its
collectives (FSDP's FSDP::*_wait ranges), step by step: the root's gather
(each step's first), the blocks' gathers, the blocks' reduce-scatters, the
root's reduce-scatter (each step's last) and the replicas' all-reduces,
each as milliseconds per step (median over the steps, and their range).
"""

import argparse
import collections
import json

PHASES = ("train::forward", "train::backward", "train::optimizer")
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot",
           "aten::mkldnn_matmul", "aten::_mkldnn_matmul"}
ALLOCATION = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::copy_",
              "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::zeros", "aten::zeros_like",
              "aten::zero_", "aten::fill_", "aten::set_", "aten::detach", "aten::detach_", "aten::cat"}
ATTENTION = {"fsdp::causal_attention", "fsdp::causal_attention_backward"}
CATEGORIES = ("matmul", "attention (per-head matmuls and causal softmax)", "element-wise", "softmax and loss",
              "layer norm", "optimizer update",
              "allocation and copies", "framework (autograd, dispatch, FSDP ranges)")


def category(name):
    if name in MATMULS:
        return "matmul"
    # The fused attention runs its matmuls on every thread with profiler
    # events off, so its range holds the whole core: matmuls and softmax.
    if name in ATTENTION:
        return CATEGORIES[1]
    if "softmax" in name or "nll_loss" in name or "cross_entropy" in name:
        return "softmax and loss"
    if "layer_norm" in name:
        return "layer norm"
    if name in ("fsdp::fused_adamw", "fsdp::grad_norm") or name.startswith("Optimizer.step"):
        return "optimizer update"
    if name in ALLOCATION:
        return "allocation and copies"
    if name.startswith("aten::") or name.startswith("fsdp::gelu"):
        return "element-wise"
    return "framework (autograd, dispatch, FSDP ranges)"


def self_times(events):
    """(name, self microseconds, enclosing phase) for every event."""
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by_thread[e.get("tid")].append(e)
    out = []
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, children's time]
        def close(item):
            event, children = item
            phases = [s[0]["name"] for s in stack + [item] if s[0]["name"] in PHASES]
            out.append((event["name"], event["dur"] - children, phases[-1] if phases else "other"))
        for e in thread:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                close(stack.pop())
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        while stack:
            close(stack.pop())
    return out


WAITS = {"FSDP::all_gather_wait": "all-gather", "FSDP::reduce_scatter_wait": "reduce-scatter",
         "FSDP::all_reduce_wait": "all-reduce"}
WAIT_PARTS = ("the root's all-gather (the step's first)", "the blocks' all-gathers", "the blocks' reduce-scatters",
              "the root's reduce-scatter (the step's last)", "replica all-reduces")


def wait_breakdown(events):
    """Per step (ended by a train::optimizer range), milliseconds blocked in each of WAIT_PARTS."""
    spans = [e for e in events if e.get("ph") == "X"]
    ends = sorted(e["ts"] + e["dur"] for e in spans if e["name"] == "train::optimizer")
    waits = sorted((e for e in spans if e["name"] in WAITS), key=lambda e: e["ts"])
    steps, start = [], float("-inf")
    for end in ends:
        mine = [e for e in waits if start <= e["ts"] < end]
        start = end
        gathers = [e["dur"] for e in mine if WAITS[e["name"]] == "all-gather"]
        scatters = [e["dur"] for e in mine if WAITS[e["name"]] == "reduce-scatter"]
        reduces = [e["dur"] for e in mine if WAITS[e["name"]] == "all-reduce"]
        if not gathers or not scatters:
            continue
        steps.append(dict(zip(WAIT_PARTS, (v / 1000.0 for v in (
            gathers[0], sum(gathers[1:]), sum(scatters[:-1]), scatters[-1], sum(reduces))))))
    return steps


def print_waits(steps):
    import statistics
    if not steps:
        raise SystemExit("profile_summary: no step with FSDP's gathers and reduce-scatters in the trace")
    print(f"| blocked in | ms per step (median of {len(steps)}) | min-max |")
    print("| --- | --- | --- |")
    for part in WAIT_PARTS + ("all",):
        values = [sum(s.values()) if part == "all" else s[part] for s in steps]
        if part != "all" and max(values) == 0:
            continue  # replicas' all-reduces: HSDP only
        print(f"| {part} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace covers (times are per step)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--waits", action="store_true", help="where the step waits for FSDP's collectives")
    args = parser.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    if args.waits:
        print_waits(wait_breakdown(trace["traceEvents"] if isinstance(trace, dict) else trace))
        return
    # LibTorch 2.x writes {"traceEvents": [...], ...}; 1.13 a bare list.
    times = self_times(trace["traceEvents"] if isinstance(trace, dict) else trace)
    columns = ("train::forward", "train::backward", "train::optimizer", "other")
    table = collections.defaultdict(float)
    per_op = collections.Counter()
    for name, self_us, phase in times:
        if name.startswith("PyTorch Profiler"):
            continue  # the profiler's own range around the window (2.x), not work
        table[(category(name), phase)] += self_us
        per_op[name] += self_us
    total = sum(table.values())
    ms = lambda us: us / 1000.0 / args.steps
    print("| self time per step | forward ms | backward ms | optimizer ms | other ms | total ms | share |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for c in CATEGORIES:
        row = [table[(c, p)] for p in columns]
        print(f"| {c} | " + " | ".join(f"{ms(v):.0f}" for v in row) + f" | {ms(sum(row)):.0f} | {100 * sum(row) / total:.1f}% |")
    phase_totals = [sum(table[(c, p)] for c in CATEGORIES) for p in columns]
    print("| all | " + " | ".join(f"{ms(v):.0f}" for v in phase_totals) + f" | {ms(total):.0f} | 100% |")
    print()
    print("| operator | self ms per step | share |")
    print("| --- | --- | --- |")
    for name, us in per_op.most_common(args.top):
        print(f"| `{name}` | {ms(us):.1f} | {100 * us / total:.1f}% |")


if __name__ == "__main__":
    main()
