#!/usr/bin/env python3
"""Side-by-side benchmark: fsdp.cpp against PyTorch 2.x at its best, same
machine, same models, same batch (4 x 256 tokens per rank), same threads,
same AdamW. For each model (gpt2-d6; llama-w768, Llama 3.2's form wide
enough that matmuls dominate) and each case it runs fsdp.cpp and its peers
interleaved (the order rotates every repetition, so machine drift spreads
evenly) and reports medians over repetitions of each run's median step:

  W=1 fp32   fsdp train            PyTorch eager, torch.compile
  W=1 bf16   fsdp train bf16       eager and compiled CPU autocast
  W=2 fp32   fsdp train full_shard FSDP2 fully_shard, eager and compiled;
                                   PyTorch DDP (replication, no sharding)

Each run's first 3 steps are warm-up (the first compiles). Beside every
row: the step's matmul-limited time (`fsdp bench matmul`: each of the
step's matmuls at the rate this machine sustains for its shape) and peak
RSS per rank. Writes out/bench/results.{json,md} and SVG charts.

    scripts/setup.sh && scripts/build.sh     # once
    python3 bench/run_benchmarks.py [--reps 3] [--steps 8] [--models gpt2-d6,llama-w768]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from machine import cpu_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")
PEER = os.path.join(ROOT, "bench", "pytorch_peer.py")
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
WARMUP = 3

# PyTorch at its best on this machine, as a careful user runs it: MKL's
# kernels chosen by the CPU's features as in fsdp.cpp (mkl_shim), denormals
# flushed, glibc keeping freed memory (fsdp.cpp keeps large blocks in its
# own cache instead), the fused AdamW (measured here: 9.8 ms a step for
# gpt2-d6's 30.3M parameters, foreach 54.9 ms, the default 81.5 ms),
# scaled_dot_product_attention, bf16 through CPU autocast.
PEER_ENV = "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296"
MKL_SHIM_SOURCE = os.path.join(ROOT, "src", "common", "mkl_vendor_check.cpp")


def mkl_shim():
    """fsdp.cpp's answer to MKL's vendor check ([Note: MKL's vendor check])
    as a library PyTorch preloads: the peers' MKL then picks its kernels by
    the CPU's features as fsdp.cpp's does (on AMD, 1.3-1.4x faster fp32
    steps: bench/mkl_vendor_check.py), so a comparison is not won by it."""
    shim = os.path.join(ROOT, "out", "bench", "libmkl_vendor_check.so")
    if not os.path.exists(shim) or os.path.getmtime(shim) < os.path.getmtime(MKL_SHIM_SOURCE):
        os.makedirs(os.path.dirname(shim), exist_ok=True)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", MKL_SHIM_SOURCE, "-o", shim, "-ldl"], check=True)
    return shim


def mkl_preload():
    """The assignment that preloads mkl_shim, added to a preload the caller
    already has (a shell expansion: the commands run through the shell)."""
    return f"LD_PRELOAD={mkl_shim()}${{LD_PRELOAD:+:$LD_PRELOAD}}"


def peer_env(mkl_by_features=True):
    """The environment a PyTorch peer runs in (env's assignments)."""
    return PEER_ENV + (f" {mkl_preload()}" if mkl_by_features else "")


def shape_flags(model):
    return f"--model {model} --seq-len 256 --batch-size 4"


def ours(model, world, steps, metrics, extra=""):
    run_dir = os.path.splitext(metrics)[0] + "-run"  # each run replaces the last
    train = (f"{FSDP} train {shape_flags(model)} --data synthetic --log-every 1 --grad-clip 1.0 --steps {steps} "
             f"--metrics {metrics} --out-dir {run_dir} {extra}")
    if world == 1:
        return f"OMP_NUM_THREADS=2 {train}"
    return f"{FSDP} launch -n {world} -- {train}"  # the launcher gives each rank 2/world threads


def peer(model, world, steps, metrics, extra="", mkl_by_features=True):
    command = (f"env {peer_env(mkl_by_features)} {VENV_PYTHON} {PEER} {shape_flags(model)} --steps {steps} --metrics {metrics} "
               f"--flush-denormal --adamw fused {extra}")
    if world == 1:
        return f"OMP_NUM_THREADS=2 {command}"
    return f"{FSDP} launch -n {world} -- {command}"


# (case, world, dtype of the matmul limit, [(side, command builder)]); the
# first side is fsdp.cpp, the ratio's numerator.
CASES = [
    ("W=1 fp32", 1, "fp32", [
        ("fsdp.cpp", lambda m, s, f: ours(m, 1, s, f)),
        ("PyTorch eager", lambda m, s, f: peer(m, 1, s, f)),
        ("torch.compile", lambda m, s, f: peer(m, 1, s, f, "--compile")),
    ]),
    ("W=1 bf16", 1, "bf16", [
        ("fsdp.cpp --precision bf16", lambda m, s, f: ours(m, 1, s, f, "--precision bf16")),
        ("PyTorch eager autocast", lambda m, s, f: peer(m, 1, s, f, "--bf16")),
        ("torch.compile autocast", lambda m, s, f: peer(m, 1, s, f, "--bf16 --compile")),
    ]),
    ("W=2 FULL_SHARD fp32", 2, "fp32", [
        ("fsdp.cpp full_shard", lambda m, s, f: ours(m, 2, s, f, "--sharding full_shard")),
        ("FSDP2 eager", lambda m, s, f: peer(m, 2, s, f, "--fsdp2")),
        ("FSDP2 compiled", lambda m, s, f: peer(m, 2, s, f, "--fsdp2 --compile")),
        # Replication, where sharding is not needed: one all-reduce of the
        # gradients against FULL_SHARD's two gathers and a reduce-scatter.
        ("PyTorch DDP", lambda m, s, f: peer(m, 2, s, f, "--ddp")),
    ]),
]


def run(command, metrics, warmup=WARMUP):
    """Runs one side; its median step after `warmup` steps, first step and peak RSS."""
    tool = os.path.basename(sys.argv[0])
    if os.path.exists(metrics):
        os.remove(metrics)
    done = subprocess.run(command, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tool}: `{command}` failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
    if len(lines) <= warmup:
        raise SystemExit(f"{tool}: `{command}` wrote {len(lines)} steps; --steps must exceed {warmup}")
    step = statistics.median(l["step_time_s"] for l in lines[warmup:])
    return {"step_s": step, "first_step_s": lines[0]["step_time_s"], "peak_rss_mb": lines[-1]["peak_rss_mb"]}


def matmul_limit(model, world, dtype):
    # Each rank's threads: 2 at W=1, 1 per rank at W=2 (as `fsdp launch` gives them).
    threads = 2 // world
    out = subprocess.run(f"OMP_NUM_THREADS={threads} {FSDP} bench matmul {shape_flags(model)} --dtypes {dtype} --json",
                         shell=True, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def summary(samples, tokens):
    steps = [s["step_s"] for s in samples]
    tps = sorted(tokens / s for s in steps)
    return {"tokens_per_s": statistics.median(tps), "tokens_per_s_min": tps[0], "tokens_per_s_max": tps[-1],
            "step_s": statistics.median(steps), "first_step_s": statistics.median(s["first_step_s"] for s in samples),
            "peak_rss_mb": max(s["peak_rss_mb"] for s in samples)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--models", default="gpt2-d6,llama-w768")
    p.add_argument("--cases", default=",".join(c[0] for c in CASES), help="a comma list of the case names")
    a = p.parse_args()
    for path, what in ((FSDP, "run scripts/build.sh"), (VENV_PYTHON, "run scripts/setup.sh")):
        if not os.path.exists(path):
            raise SystemExit(f"run_benchmarks: {path} is missing: {what} first")
    out_dir = os.path.join(ROOT, "out", "bench")
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp()
    metrics = os.path.join(tmp, "m.jsonl")
    torch_version = subprocess.run([VENV_PYTHON, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    results = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch_version, "rows": []}
    print(f"# {results['cpu']}, {results['cores']} CPUs, PyTorch {torch_version}", flush=True)
    wanted = a.cases.split(",")
    for model in a.models.split(","):
        for case, world, dtype, sides in CASES:
            if case not in wanted:
                continue
            limit = matmul_limit(model, world, dtype)
            samples = {name: [] for name, _ in sides}
            for rep in range(a.reps):
                k = rep % len(sides)
                for name, command in sides[k:] + sides[:k]:
                    samples[name].append(run(command(model, a.steps, metrics), metrics))
            tokens = world * 4 * 256
            row = {"model": model, "case": case, "world": world, "matmul_limited_s": limit["matmul_limited_s"],
                   "matmul_flops_per_s": limit["flops_per_s"], "sides": {}}
            for name, _ in sides:
                row["sides"][name] = summary(samples[name], tokens)
            ours_tps = row["sides"][sides[0][0]]["tokens_per_s"]
            for name, _ in sides[1:]:
                row["sides"][name]["ours_over_this"] = ours_tps / row["sides"][name]["tokens_per_s"]
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    comm = subprocess.run(f"{FSDP} launch -n 2 -- {FSDP} bench comm -b 4096 -e 16777216 -f 16",
                          shell=True, check=True, capture_output=True, text=True).stdout
    results["comm"] = comm
    json.dump(results, open(os.path.join(out_dir, "results.json"), "w"), indent=1)
    write_markdown(results, os.path.join(out_dir, "results.md"))
    draw_charts(results, out_dir)
    print(open(os.path.join(out_dir, "results.md")).read())


def write_markdown(results, path):
    with open(path, "w") as md:
        md.write(f"Machine: {results['cpu']}, {results['cores']} CPUs; PyTorch {results['torch']}.\n\n")
        md.write("| model | case | side | tokens/s (median, min-max) | step s | matmul-limited s | step / limit "
                 "| fsdp.cpp's ratio | first step s | peak RSS MB/rank |\n")
        md.write("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in results["rows"]:
            for name, s in r["sides"].items():
                ratio = f"{s['ours_over_this']:.2f}x" if "ours_over_this" in s else ""
                md.write(f"| {r['model']} | {r['case']} | {name} | {s['tokens_per_s']:.0f} "
                         f"({s['tokens_per_s_min']:.0f}-{s['tokens_per_s_max']:.0f}) | {s['step_s']:.3f} "
                         f"| {r['matmul_limited_s']:.3f} | {s['step_s'] / r['matmul_limited_s']:.2f} | {ratio} "
                         f"| {s['first_step_s']:.1f} | {s['peak_rss_mb']:.0f} |\n")
        md.write("\n```\n" + "\n".join(l.replace("[rank 0] ", "", 1) for l in results["comm"].splitlines()
                                        if l.strip() != "[rank 0] #") + "\n```\n")


def draw_charts(results, out_dir):
    try:
        import charts
    except ImportError:
        print("run_benchmarks: no matplotlib (scripts/setup.sh installs python3-matplotlib); charts skipped")
        return
    # One chart per model: fsdp.cpp's tokens/s over each peer's, and over
    # the matmul limit's, case by case (above 1: fsdp.cpp is faster).
    for model in dict.fromkeys(r["model"] for r in results["rows"]):
        rows = [r for r in results["rows"] if r["model"] == model]
        limit = "matmul-limited time over step time (1: at the limit)"
        series = {"over PyTorch eager (FSDP2 at W=2)": [], "over torch.compile": [], limit: []}
        for r in rows:
            sides = list(r["sides"].values())
            series["over PyTorch eager (FSDP2 at W=2)"].append(sides[1]["ours_over_this"])
            series["over torch.compile"].append(sides[2]["ours_over_this"])
            series[limit].append(r["matmul_limited_s"] / sides[0]["step_s"])
        charts.grouped_bars(os.path.join(out_dir, f"speed_{model}.svg"), [r["case"] for r in rows], series,
                            "fsdp.cpp tokens/s ratio", f"{model}: fsdp.cpp against PyTorch {results['torch']}, "
                            f"{results['cpu']}", reference=1.0)


if __name__ == "__main__":
    main()
