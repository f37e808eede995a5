#!/usr/bin/env python3
"""fsdp::replicate against PyTorch's DistributedDataParallel at its best on
CPU (Gloo, gradients as bucket views, 25 MB buckets, fused AdamW, one
thread per rank; fsdp.cpp with its fused AdamW),
same machine, same residual MLP (tests/reference/replicate_probe.cpp and
ddp_train.py), same weights and batches, same AdamW, W ranks. The two run
interleaved, the order alternating each repetition; each run trains a few
steps (warm-up), then times BENCH_STEPS steps. Prints rows/s of each
(medians over repetitions) and their ratio.

    scripts/setup.sh && scripts/build.sh     # once
    .venv/bin/python bench/replicate_vs_ddp.py [--world 2] [--dim 512] [--blocks 4] [--rows 64] [--reps 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import ddp_train  # noqa: E402
from machine import cpu_model  # noqa: E402


def rows_per_second(command, env):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
        raise SystemExit(f"{command[0]} failed")
    return float(re.search(r"rows/s ([0-9.]+)", result.stdout).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rows", type=int, default=64, help="global batch rows")
    parser.add_argument("--bench-steps", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replicate-bench-") as work:
        init, data = os.path.join(work, "init.safetensors"), os.path.join(work, "data.safetensors")
        save_file({k: v.contiguous() for k, v in ddp_train.initial_weights(args.dim, args.blocks).items()}, init)
        x = torch.randn(3, args.rows, args.dim, generator=torch.Generator().manual_seed(1))
        save_file({"x": x, "y": x.sum(2, keepdim=True).sin()}, data)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        ours = [os.path.join(args.build_dir, "fsdp"), "launch", "-n", str(args.world), "--",
                os.path.join(args.build_dir, "tests", "fsdp_replicate_probe"), init, data,
                os.path.join(work, "ours.safetensors"), str(args.bench_steps)]
        theirs = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.world),
                  os.path.join(ROOT, "tests", "reference", "ddp_train.py"), init, data,
                  os.path.join(work, "theirs.safetensors"), str(args.bench_steps)]
        results = {"fsdp.cpp replicate": [], "PyTorch DDP": []}
        for rep in range(args.reps):
            order = [("fsdp.cpp replicate", ours), ("PyTorch DDP", theirs)]
            for name, command in order if rep % 2 == 0 else reversed(order):
                results[name].append(rows_per_second(command, env))
    params = sum(v.numel() for v in ddp_train.initial_weights(args.dim, args.blocks).values())
    print(f"CPU: {cpu_model()}; torch {torch.__version__}; W = {args.world}, one thread per rank; "
          f"MLP {args.blocks} x {args.dim} ({params / 1e6:.1f}M parameters), {args.rows} rows per step")
    for name, values in results.items():
        print(f"{name:20s} rows/s median {statistics.median(values):9.1f}  (runs: {', '.join(f'{v:.1f}' for v in values)})")
    ratio = statistics.median(results["fsdp.cpp replicate"]) / statistics.median(results["PyTorch DDP"])
    print(f"fsdp.cpp / DDP: {ratio:.2f}x")


if __name__ == "__main__":
    main()
