#!/usr/bin/env python3
"""Offload on the CPU, side by side: where the optimizer's step goes.

Two ranks train the same job (llama-w768 by default, fp32, synthetic
tokens) five ways, interleaved over the repetitions so that the machine's
drift falls on all of them alike:

  plain        no offload, --grad-clip 0
  optimizer    --optimizer-offload (AdamW's moments on the host), --grad-clip 0
  cpu          --cpu-offload, the host step after backward, --grad-clip 0
  overlapped   --cpu-offload --overlap-host-step: each unit's update during backward
  cpu_clip     --cpu-offload with --grad-clip 1: the step waits for the global norm

Read from each run's metrics.jsonl (steps after the first two): the median
step time, and its forward+backward and optimizer parts. On a CPU the
"host" and the compute device are the same cores, so what offload costs
here is its copies and, for the overlapped step, the worker's core taken
from backward; what it saves on a GPU is the device's memory
(scripts/device_check.sh, phase offload). Put `lscpu`'s model name beside
the figures.

    .venv/bin/python bench/offload_cpu.py [--model llama-w768] [--seq-len 256] [--batch-size 2] [--steps 12] [--reps 2]

Writes out/bench/offload_cpu.{json,md}.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
from machine import cpu_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = {
    "plain": ["--grad-clip", "0"],
    "optimizer": ["--optimizer-offload", "--grad-clip", "0"],
    "cpu": ["--cpu-offload", "--grad-clip", "0"],
    "overlapped": ["--cpu-offload", "--overlap-host-step", "--grad-clip", "0"],
    "cpu_clip": ["--cpu-offload", "--grad-clip", "1"],
}


def run(args, mode, out):
    shutil.rmtree(out, ignore_errors=True)
    command = [args.fsdp, "launch", "-n", "2", "--", args.fsdp, "train", "--model", args.model, "--data", "synthetic",
               "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--log-every", "1", "--tensorboard=false", "--out-dir", out] + MODES[mode]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if line.strip()]
    steps = [r for r in rows if "step_time_s" in r][2:]
    return {key: statistics.median(r[key] for r in steps)
            for key in ("step_time_s", "forward_backward_s", "optimizer_s")} | {
        "host_state_mb": steps[-1]["host_state_mb"], "allocated_peak_mb": steps[-1]["allocated_peak_mb"],
        "loss": steps[-1]["loss"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    p.add_argument("--model", default="llama-w768")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {mode: [] for mode in MODES}
    for rep in range(args.reps):
        for mode in MODES:
            results[mode].append(run(args, mode, os.path.join(args.out, "offload_cpu_runs", f"{mode}_{rep}")))
    summary = {mode: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for mode, runs in results.items()}
    doc = {"cpu": cpu_model(), "model": args.model, "seq_len": args.seq_len, "batch_size": args.batch_size,
           "world": 2, "steps": args.steps, "reps": args.reps, "modes": {m: " ".join(f) for m, f in MODES.items()},
           "summary": summary, "runs": results}
    with open(os.path.join(args.out, "offload_cpu.json"), "w") as f:
        json.dump(doc, f, indent=2)
    base = summary["plain"]["step_time_s"]
    lines = [f"{args.model}, W = 2, {args.batch_size} x {args.seq_len} per rank, fp32; {cpu_model()}; "
             f"medians of steps 3-{args.steps} over {args.reps} runs each", "",
             "| mode | step (s) | vs plain | forward+backward (s) | optimizer (s) | host state (MiB) | "
             "allocated peak (MiB) |", "|---|---|---|---|---|---|---|"]
    for mode, s in summary.items():
        lines.append(f"| {mode} | {s['step_time_s']:.3f} | {s['step_time_s'] / base:.2f}x | "
                     f"{s['forward_backward_s']:.3f} | {s['optimizer_s']:.3f} | {s['host_state_mb']:.1f} | "
                     f"{s['allocated_peak_mb']:.1f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "offload_cpu.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
