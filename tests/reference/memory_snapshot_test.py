"""PyTorch's own memory viewer on fsdp's snapshots: a two-rank run records
every CPU tensor allocation over its steps (--memory-snapshot), and each
rank's file is read by `torch.cuda._memory_viz` (the module behind
pytorch.org/memory_viz's Python side): the text summaries, the segment
flame-graph lines and both HTML viewers. Replaying rank 0's trace (here,
independently of the writer) gives the peak the trainer's accounting
reported in metrics.jsonl, to the byte.
"""
import json
import os
import pickle

from torch.cuda import _memory_viz

import harness


def replayed_peak(snapshot):
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live = sum(seg["total_size"] for seg in snapshot["segments"])
    live -= sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace)
    peak = live
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"]
        peak = max(peak, live)
    return peak


def main():
    args = harness.parse_args(__doc__)
    run = os.path.join(harness.work_dir(args), "run")
    harness.run([args.fsdp, "launch", "-n", "2", "--", args.fsdp, "train", "--model", "llama-tiny", "--data",
                 "synthetic", "--steps", "2", "--log-every", "1", "--memory-snapshot", "2", "--out-dir", run,
                 "--tensorboard=false"])
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


if __name__ == "__main__":
    main()
