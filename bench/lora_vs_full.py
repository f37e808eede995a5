#!/usr/bin/env python3
"""LoRA against full fine-tuning of the same model on the same ranks:
memory per rank and step time, side by side in one run.

Each case is `fsdp train` on W ranks (`fsdp launch`), the same model,
data, precision and micro-batch, full fine-tuning or `--lora-rank R`
(every attention and MLP projection, the frozen base in bf16 under
`--precision bf16`), run alternately `--reps` times. Read from rank 0's
metrics.jsonl, over the steps after the first (warm-up): the tensor peak
(`allocated_peak_mb`, every CPU tensor block the allocator handed out),
the sharded state (parameters and AdamW moments), the process's peak RSS,
the collectives' traffic, and the median step time. Put `lscpu`'s model
name beside the figures: they are this machine's.

    python3 bench/lora_vs_full.py [--model qwen3-0.6b] [--world 2] [--rank 16] [--steps 4] [--reps 1]

Writes out/bench/lora_vs_full.{json,md}.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from machine import cpu_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, lora, out):
    shutil.rmtree(out, ignore_errors=True)
    command = [args.fsdp, "launch", "-n", str(args.world), "--", args.fsdp, "train", "--model", args.model,
               "--precision", args.precision, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
               "--steps", str(args.steps), "--log-every", "1", "--tensorboard=false", "--out-dir", out]
    if lora:
        command += ["--lora-rank", str(args.rank)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [s for s in steps if "loss" in s and "event" not in s and s.get("split", "train") == "train"][1:]
    return {"allocated_peak_mb": max(s["allocated_peak_mb"] for s in steps),
            "sharded_state_mb": steps[-1]["sharded_state_mb"],
            "peak_rss_mb": max(s["peak_rss_mb"] for s in steps),
            "fsdp_comm_mb": steps[-1]["fsdp_comm_mb"],
            "step_time_s": statistics.median(s["step_time_s"] for s in steps)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dir", default=os.path.join(ROOT, "out", "bench", "lora_vs_full"))
    args = parser.parse_args()
    results = {"full": [], "lora": []}
    for _ in range(args.reps):
        for name in ("full", "lora"):
            results[name].append(run(args, name == "lora", os.path.join(args.dir, name)))
    summary = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    report = {"cpu": cpu_model(), "settings": vars(args), "runs": results, "median": summary}
    os.makedirs(os.path.dirname(args.dir), exist_ok=True)
    with open(args.dir + ".json", "w") as f:
        json.dump(report, f, indent=2)
    rows = [("tensor peak per rank (MiB)", "allocated_peak_mb"), ("sharded state per rank (MiB)", "sharded_state_mb"),
            ("peak RSS per rank (MiB)", "peak_rss_mb"), ("collectives' traffic per step (MiB)", "fsdp_comm_mb"),
            ("step time (s, median)", "step_time_s")]
    lines = [f"{args.model}, W = {args.world}, {args.precision}, micro-batch {args.batch_size} x {args.seq_len}, "
             f"LoRA rank {args.rank}; {report['cpu']}", "",
             "| | full fine-tuning | LoRA | LoRA / full |", "|---|---|---|---|"]
    for label, key in rows:
        full, lora = summary["full"][key], summary["lora"][key]
        lines.append(f"| {label} | {full:.4g} | {lora:.4g} | {lora / full if full else float('nan'):.3f} |")
    text = "\n".join(lines) + "\n"
    with open(args.dir + ".md", "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
