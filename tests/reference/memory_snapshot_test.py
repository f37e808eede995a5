"""PyTorch's own memory viewer on fsdp's snapshots: a two-rank run records
every CPU tensor allocation over its steps (--memory-snapshot), and each
rank's file is read by `torch.cuda._memory_viz` (the module behind
pytorch.org/memory_viz's Python side): the text summaries, the segment
flame-graph lines and both HTML viewers. Replaying rank 0's trace (here,
independently of the writer) gives the peak the trainer's accounting
reported in metrics.jsonl, to the byte.

With --device cuda (a CUDA build on a GPU), the two ranks share one GPU
and each file is the CUDA caching allocator's own history
(torch.cuda.memory._record_memory_history's): read by the same viewers,
with GPU blocks in it, and a replayed peak no higher than the allocator's
peak the trainer reported (peak_device_mb, which also counts start-up).
"""
import collections
import json
import os
import pickle

from torch.cuda import _memory_viz

import harness


def replayed_peak(snapshot):
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live = sum(seg["allocated_size"] for seg in snapshot["segments"])
    live -= sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace)
    peak = live
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"]
        peak = max(peak, live)
    return peak


def main():
    args = harness.parse_args(__doc__, lambda p: p.add_argument("--device", choices=("cpu", "cuda"), default="cpu"))
    run = os.path.join(harness.work_dir(args), "run")
    harness.run([args.fsdp, "launch", "-n", "2", "--", args.fsdp, "train", "--model", "llama-tiny", "--data",
                 "synthetic", "--steps", "2", "--log-every", "1", "--memory-snapshot", "2", "--out-dir", run,
                 "--tensorboard=false", "--device", args.device])
    if args.device == "cuda":
        return check_gpu_snapshots(run)
    for rank in (0, 1):
        path = os.path.join(run, "memory", f"rank{rank}.pickle")
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        trace = snapshot["device_traces"][0]
        if not trace or not snapshot["segments"]:
            harness.fail(f"{path}: no trace entries or no segments")
        for name, html in (("trace_plot", _memory_viz.trace_plot(snapshot)),
                           ("segment_plot", _memory_viz.segment_plot(snapshot))):
            if "<script" not in html or len(html) < 1000:
                harness.fail(f"{path}: _memory_viz.{name} made no viewer")
        text = _memory_viz.segsum(snapshot) + _memory_viz.trace(snapshot)
        lines = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
        held = sum(int(line.rsplit(" ", 1)[1]) for line in lines.splitlines() if line.strip())
        at_end = sum(seg["allocated_size"] for seg in snapshot["segments"])
        if held != at_end:
            harness.fail(f"{path}: _memory_viz.memory counts {held} bytes held at the end, the segments {at_end}")
        phases = {e["frames"][0]["name"] for e in trace}
        for phase in ("forward model.layers.0", "backward model.layers.1", "post-backward <root>", "optimizer"):
            if phase not in phases:
                harness.fail(f"{path}: no allocation labelled '{phase}' (labels: {sorted(phases)})")
        print(f"rank {rank}: {len(trace)} events, {len(snapshot['segments'])} blocks held at the end, "
              f"{len(text)} characters of _memory_viz summaries, both viewers built")
    with open(os.path.join(run, "memory", "rank0.pickle"), "rb") as f:
        snapshot = pickle.load(f)
    metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if '"allocated_peak_mb"' in line]
    accounting = metrics[-1]["allocated_peak_mb"] * (1 << 20)
    peak = replayed_peak(snapshot)
    if peak != accounting or snapshot["fsdp_cpp"]["peak_bytes"] != accounting:
        harness.fail(f"replayed peak {peak}, recorded {snapshot['fsdp_cpp']['peak_bytes']}, "
                     f"the trainer's accounting {accounting}")
    print(f"rank 0's replayed peak equals the accounting's: {peak} bytes")


def check_gpu_snapshots(run):
    metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if '"peak_device_mb"' in line]
    reported = metrics[-1]["peak_device_mb"] * (1 << 20)
    for rank in (0, 1):
        path = os.path.join(run, "memory", f"rank{rank}.pickle")
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        # Both ranks share cuda:0, the one GPU of the machine.
        traces = snapshot["device_traces"]
        if not traces or not traces[0] or any(traces[1:]) or not snapshot["segments"]:
            harness.fail(f"{path}: expected a trace of cuda:0 alone and its segments")
        if any(seg["device"] != 0 for seg in snapshot["segments"]):
            harness.fail(f"{path}: segments on another device than cuda:0")
        for name, html in (("trace_plot", _memory_viz.trace_plot(snapshot)),
                           ("segment_plot", _memory_viz.segment_plot(snapshot))):
            if "<script" not in html or len(html) < 1000:
                harness.fail(f"{path}: _memory_viz.{name} made no viewer")
        # The caching allocator keeps freed blocks in its segments
        # ("inactive"): the viewer's allocated blocks are what the segments
        # say is allocated, and all its blocks what they reserve.
        by_state = collections.Counter()
        for line in _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines).splitlines():
            if line.strip():
                by_state[line.split(";")[1]] += int(line.rsplit(" ", 1)[1])
        allocated = sum(seg["allocated_size"] for seg in snapshot["segments"])
        reserved = sum(seg["total_size"] for seg in snapshot["segments"])
        if by_state["active_allocated"] != allocated or sum(by_state.values()) != reserved:
            harness.fail(f"{path}: _memory_viz.memory counts {by_state['active_allocated']} bytes allocated and "
                         f"{sum(by_state.values())} in all at the end, the segments {allocated} and {reserved} "
                         f"({dict(by_state)})")
        peak = replayed_peak(snapshot)
        if rank == 0 and not 0 < peak <= reported + (1 << 20):
            harness.fail(f"{path}: replayed peak {peak} bytes, the trainer reported {reported}")
        print(f"rank {rank}: {len(traces[0])} GPU allocator events, {len(snapshot['segments'])} segments, "
              f"replayed peak {peak / (1 << 20):.1f} MiB, both viewers built")


if __name__ == "__main__":
    main()
