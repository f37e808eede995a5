#!/usr/bin/env python3
"""What MKL's vendor check costs on this CPU ([Note: MKL's vendor check],
src/common/mkl_vendor_check.cpp), fsdp.cpp and PyTorch alike.

PyTorch's wheels carry Intel MKL, which picks its fp32 matmul kernels by
the CPU's features only on Intel CPUs. fsdp.cpp's programs answer its
vendor check themselves (FSDP_MKL_VENDOR_CHECK=1 hands it back to MKL).
PyTorch gets the same answer from the same source file built as a
preloaded library (run_benchmarks.mkl_shim), so each side runs both ways. Measured,
interleaved, on gpt2-d6 (4 x 256 tokens per rank, fp32, fused AdamW):

  W=1   fsdp train, two threads          PyTorch eager
  W=2   fsdp train --sharding full_shard PyTorch DistributedDataParallel (Gloo)

and the step's matmul-limited time (`fsdp bench matmul`) both ways.

    python3 bench/mkl_vendor_check.py [--reps 2] [--steps 8] [--model gpt2-d6]

Writes out/bench/mkl_vendor_check.{json,md}.
"""
import argparse
import json
import os
import statistics
import tempfile

from run_benchmarks import ROOT, cpu_model, matmul_limit, ours, peer, run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--model", default="gpt2-d6")
    a = p.parse_args()
    out_dir = os.path.join(ROOT, "out", "bench")
    os.makedirs(out_dir, exist_ok=True)
    metrics = os.path.join(tempfile.mkdtemp(), "m.jsonl")
    mkl = lambda on: f"FSDP_MKL_VENDOR_CHECK={0 if on else 1}"
    # (case, world, [(side, feature-chosen kernels?, command)])
    cases = [
        ("W=1 fp32", 1, [
            ("fsdp.cpp", lambda on, m: f"{mkl(on)} {ours(a.model, 1, a.steps, m)}"),
            ("PyTorch eager", lambda on, m: peer(a.model, 1, a.steps, m, mkl_by_features=on)),
        ]),
        ("W=2 fp32", 2, [
            ("fsdp.cpp full_shard", lambda on, m: f"{mkl(on)} {ours(a.model, 2, a.steps, m, '--sharding full_shard')}"),
            ("PyTorch DDP", lambda on, m: peer(a.model, 2, a.steps, m, "--ddp", mkl_by_features=on)),
        ]),
    ]
    result = {"cpu": cpu_model(), "model": a.model, "reps": a.reps, "cases": []}
    print(f"# {result['cpu']}", flush=True)
    for case, world, sides in cases:
        runs = [(name, on, command) for name, command in sides for on in (True, False)]
        samples = {(name, on): [] for name, on, _ in runs}
        for rep in range(a.reps):
            k = rep % len(runs)
            for name, on, command in runs[k:] + runs[:k]:
                samples[(name, on)].append(run(command(on, metrics), metrics)["step_s"])
        limits = {}
        for on in (True, False):
            os.environ["FSDP_MKL_VENDOR_CHECK"] = "0" if on else "1"  # matmul_limit's `fsdp bench` inherits it
            limits[on] = matmul_limit(a.model, world, "fp32")["matmul_limited_s"]
        os.environ.pop("FSDP_MKL_VENDOR_CHECK", None)
        row = {"case": case, "limit_s": {"features": limits[True], "vendor": limits[False]}, "sides": {}}
        for name, _ in sides:
            row["sides"][name] = {"features": statistics.median(samples[(name, True)]),
                                  "vendor": statistics.median(samples[(name, False)]),
                                  "all": {"features": samples[(name, True)], "vendor": samples[(name, False)]}}
        result["cases"].append(row)
        print(json.dumps(row), flush=True)
    json.dump(result, open(os.path.join(out_dir, "mkl_vendor_check.json"), "w"), indent=1)
    md = [f"MKL's kernels chosen by the CPU's features or by its vendor, {a.model}, fp32, "
          f"median of {a.reps} interleaved runs ({result['cpu']}).", "",
          "| case | side | step s, by features | step s, by vendor | vendor / features |",
          "| --- | --- | --- | --- | --- |"]
    for row in result["cases"]:
        lim = row["limit_s"]
        md.append(f"| {row['case']} | matmul-limited time | {lim['features']:.3f} | {lim['vendor']:.3f} | "
                  f"{lim['vendor'] / lim['features']:.2f} |")
        for name, s in row["sides"].items():
            md.append(f"| {row['case']} | {name} | {s['features']:.3f} | {s['vendor']:.3f} | "
                      f"{s['vendor'] / s['features']:.2f} |")
    for row in result["cases"]:
        first, second = list(row["sides"])
        f, v = row["sides"][first], row["sides"][second]
        md.append(f"\n{row['case']}: {first} over {second}: {v['features'] / f['features']:.2f}x with both on "
                  f"features, {v['vendor'] / f['features']:.2f}x against {second} as shipped, "
                  f"{v['vendor'] / f['vendor']:.2f}x with both on the vendor check.")
    open(os.path.join(out_dir, "mkl_vendor_check.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
