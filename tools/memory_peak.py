#!/usr/bin/env python3
"""What was held at the peak of a memory snapshot (`fsdp train
--memory-snapshot N` writes <run folder>/memory/rank<R>.pickle): the live
blocks at the moment of the most tensor bytes, summed by the phase that
allocated them. Standard library only.

    python3 tools/memory_peak.py RUN/memory/rank0.pickle [--top 10] [--json]
"""
import argparse
import collections
import json
import pickle
import sys


def replay(snapshot):
    """(bytes at the peak, {addr: (size, phase)} live then, peak event's phase, bytes at start)."""
    # alloc and free_completed are the blocks; segment_* mirror them.
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live = {}
    for seg in snapshot["segments"]:
        for block in seg["blocks"]:
            live[block["address"]] = (block["size"], block["frames"][0]["name"] if block["frames"] else "?")
    # Walk back from the end to the start: undo each event.
    for e in reversed(trace):
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
        else:
            live[e["addr"]] = (e["size"], "before recording")
    held = dict(live)
    start = current = sum(size for size, _ in held.values())
    peak, peak_held, peak_phase = current, dict(held), "start"
    for e in trace:
        phase = e["frames"][0]["name"] if e["frames"] else "?"
        if e["action"] == "alloc":
            held[e["addr"]] = (e["size"], phase)
            current += e["size"]
            if current > peak:
                peak, peak_held, peak_phase = current, dict(held), phase
        else:
            size, _ = held.pop(e["addr"], (e["size"], ""))
            current -= size
    return peak, peak_held, peak_phase, start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot")
    parser.add_argument("--top", type=int, default=12, help="phases listed")
    parser.add_argument("--json", action="store_true", help="print bytes as JSON")
    args = parser.parse_args()
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
        snapshot["device_traces"][0]
    except (OSError, pickle.UnpicklingError, KeyError, IndexError, EOFError) as e:
        print(f"error: {args.snapshot}: not a memory snapshot ({e})", file=sys.stderr)
        return 1
    peak, held, phase, start = replay(snapshot)
    if args.json:
        by = collections.Counter()
        for size, p in held.values():
            by[p] += size
        print(json.dumps({"peak_bytes": peak, "peak_phase": phase, "bytes_at_start": start,
                          "recorded_peak_bytes": snapshot.get("fsdp_cpp", {}).get("peak_bytes"),
                          "by_phase": dict(by.most_common())}))
        return 0
    mib = 1 << 20
    print(f"peak {peak / mib:.1f} MiB of tensors, reached in '{phase}' (held at the start: {start / mib:.1f} MiB)")
    by_phase = collections.Counter()
    blocks = collections.Counter()
    for size, p in held.values():
        by_phase[p] += size
        blocks[p] += 1
    print(f"{'MiB':>9}  {'blocks':>6}  allocated in")
    for p, size in by_phase.most_common(args.top):
        print(f"{size / mib:9.1f}  {blocks[p]:6d}  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
