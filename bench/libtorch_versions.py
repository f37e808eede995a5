#!/usr/bin/env python3
"""fsdp.cpp built on two LibTorch versions, step time side by side: GPT-2 d6
(6 layers, 384 wide, vocabulary 50257), 4 x 256 tokens, one rank with two
threads, fp32 and bf16. Runs interleave (a, b, a, b, ...) so machine drift
cancels; each run's first two steps are warm-up, the median of the rest is
its step time, and the median over repetitions is reported.

    python3 bench/libtorch_versions.py [--a build/fsdp] [--b build-1.13/fsdp] [--reps 3] [--steps 6]

Debian's LibTorch 1.13 runs on the system's libblas.so.3; at its best that
is OpenBLAS's OpenMP build (one thread pool with LibTorch's), which
--b-env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp selects
when the pthread build is the system default.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "--model gpt2-d6 --data synthetic --seq-len 256 --batch-size 4 --log-every 1 --tensorboard=false"


def version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("LibTorch"))


def step_time(binary, env, precision, steps, folder):
    metrics = os.path.join(folder, "metrics.jsonl")
    cmd = (f"{env} OMP_NUM_THREADS=2 {binary} train {MODEL} --precision {precision} --steps {steps} "
           f"--metrics {metrics} --out-dir {folder}/run")
    subprocess.run(cmd, shell=True, check=True, capture_output=True)
    times = []
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if "step_time_s" in record:
                times.append(record["step_time_s"])
    return statistics.median(times[2:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", default=os.path.join(ROOT, "build", "fsdp"))
    parser.add_argument("--b", default=os.path.join(ROOT, "build-1.13", "fsdp"))
    parser.add_argument("--a-env", default="", help="VAR=VALUE ... for a's runs")
    parser.add_argument("--b-env", default="", help="VAR=VALUE ... for b's runs")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if l.startswith("Model name")), "?")
    print(f"CPU: {cpu}")
    binaries = {"a": args.a, "b": args.b}
    envs = {"a": args.a_env, "b": args.b_env}
    names = {k: version(v) for k, v in binaries.items()}
    for k in binaries:
        blas = subprocess.run(f"{envs[k]} {binaries[k]} --version", shell=True, capture_output=True, text=True).stdout
        print(f"{k}: {names[k]}, " + next(l for l in blas.splitlines() if l.startswith("BLAS")))
    print("| precision | " + " | ".join(f"{names[k]} step (s)" for k in binaries) + " | a / b |")
    print("| --- | --- | --- | --- |")
    for precision in ("fp32", "bf16"):
        runs = {k: [] for k in binaries}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps):
                for k, binary in binaries.items():
                    runs[k].append(step_time(binary, envs[k], precision, args.steps + 2, os.path.join(tmp, f"{k}{rep}")))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"| {precision} | {med['a']:.3f} | {med['b']:.3f} | {med['a'] / med['b']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
