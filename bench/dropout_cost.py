#!/usr/bin/env python3
"""What dropout costs a training step: `fsdp train` with --dropout P against
the same run with --dropout 0, interleaved.

GPT-2's checkpoints ship with dropout 0.1 on the embeddings, the attention
probabilities and the residuals, so a fine-tuning run pays for it at every
step. Each repetition runs both settings (W = 1, random tokens, the step
time's median over steps 3 to --steps); the table gives the medians over
repetitions and their ratio.

    python3 bench/dropout_cost.py [--model gpt2-d6] [--reps 3] [--dropout 0.1] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")


def step_time(a, dropout):
    with tempfile.TemporaryDirectory() as out:
        cmd = [FSDP, "train", "--model", a.model, "--data", "synthetic", "--steps", str(a.steps),
               "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--log-every", "1",
               "--tensorboard=false", "--dropout", str(dropout), "--out-dir", out]
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    times = [r["step_time_s"] for r in rows if "step_time_s" in r and r["step"] >= 3]
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2-d6")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if not os.path.exists(FSDP):
        p.error(f"{FSDP} not found: run scripts/build.sh first")
    off, on = [], []
    for _ in range(a.reps):
        off.append(step_time(a, 0.0))
        on.append(step_time(a, a.dropout))
    print(f"| {a.model}, {a.batch_size} x {a.seq_len}, {a.threads} threads | step s |")
    print("| --- | --- |")
    print(f"| --dropout 0 | {statistics.median(off):.3f} (runs: {', '.join(f'{t:.3f}' for t in off)}) |")
    print(f"| --dropout {a.dropout} | {statistics.median(on):.3f} (runs: {', '.join(f'{t:.3f}' for t in on)}) |")
    print(f"| ratio | {statistics.median(on) / statistics.median(off):.3f} |")


if __name__ == "__main__":
    main()
