#!/usr/bin/env python3
"""Plots from an `fsdp train --metrics` file: loss against step and against
time (train and validation), and throughput against step. Writes SVGs.

    python3 bench/plot_metrics.py out/gpt2-sotu/metrics.jsonl out/plots
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charts  # noqa: E402


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: plot_metrics.py METRICS.jsonl OUT_DIR")
    try:
        lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    except OSError as e:
        raise SystemExit(f"plot_metrics: cannot read {sys.argv[1]}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"plot_metrics: {sys.argv[1]} is not JSON lines ({e})")
    # A file may hold several runs (each begins with a "start" event; a
    # "resume" continues its run): plot the last one.
    starts = [i for i, l in enumerate(lines) if l.get("event") == "start"]
    if len(starts) > 1:
        print(f"plot_metrics: {sys.argv[1]} holds {len(starts)} runs; plotting the last")
        lines = lines[starts[-1]:]
    train = [l for l in lines if "step_time_s" in l]
    val = [l for l in lines if l.get("split") == "val"]
    if not train:
        raise SystemExit(f"plot_metrics: {sys.argv[1]} has no training lines")
    os.makedirs(sys.argv[2], exist_ok=True)
    # Elapsed time at each logged step, from the logged steps' own rates.
    elapsed, last_step, t = {}, 0, 0.0
    for l in train:
        t += (l["step"] - last_step) * l["step_time_s"]
        elapsed[l["step"]] = t
        last_step = l["step"]
    charts.lines(os.path.join(sys.argv[2], "loss_vs_step.svg"),
                   {"train": [(l["step"], l["loss"]) for l in train], "val": [(l["step"], l["loss"]) for l in val]},
                   "step", "loss", "Loss")
    at = lambda step: min(elapsed.items(), key=lambda kv: abs(kv[0] - step))[1] if step else 0.0
    charts.lines(os.path.join(sys.argv[2], "loss_vs_time.svg"),
                   {"train": [(elapsed[l["step"]], l["loss"]) for l in train],
                    "val": [(at(l["step"]), l["loss"]) for l in val]},
                   "seconds of training", "loss", "Loss against time")
    charts.lines(os.path.join(sys.argv[2], "throughput.svg"),
                   {"tokens/s": [(l["step"], l["tokens_per_s"]) for l in train]}, "step", "tokens/s", "Throughput")
    print(f"plot_metrics: wrote loss_vs_step.svg, loss_vs_time.svg, throughput.svg to {sys.argv[2]}")


if __name__ == "__main__":
    main()
