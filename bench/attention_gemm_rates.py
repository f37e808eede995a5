#!/usr/bin/env python3
"""The per-head products of fsdp.cpp's CPU attention (src/models/attention.cpp),
one thread, three ways: MKL's `sgemm_` on fp32, MKL's `gemm_bf16bf16f32_`
on bf16 (float result), both called as the kernel calls them (row-major
through the Fortran interface), and ATen's bf16 `mm` (what bf16 attention
runs where the process has no bf16 gemm). Shapes m x n x k are a block of
query rows against keys (scores, n = keys) and weights against values
(k = keys), at head size 64.

Each way runs twice, in child processes: with MKL's vendor check answered
as fsdp.cpp's programs answer it (kernels chosen by the CPU's features,
run_benchmarks.mkl_shim), and left to MKL (on AMD CPUs, its generic path).

    python3 bench/attention_gemm_rates.py [--reps 2000]
"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

from run_benchmarks import VENV_PYTHON, cpu_model, mkl_shim

SHAPES = [(64, 64, 64), (64, 256, 64), (256, 256, 64), (64, 64, 256), (256, 64, 256)]


def measure(reps):
    import torch
    torch.set_num_threads(1)
    lib = ctypes.CDLL(os.path.join(torch.__path__[0], "lib", "libtorch_cpu.so"), mode=ctypes.RTLD_GLOBAL)
    I, F, P, C = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_char_p

    def rows(gemm, m, n, k, a, b, c):  # row-major c = a b^T, as column-major c^T = b a^T
        gemm(C(b"T"), C(b"N"), ctypes.byref(I(n)), ctypes.byref(I(m)), ctypes.byref(I(k)), ctypes.byref(F(1.0)),
             P(b.data_ptr()), ctypes.byref(I(k)), P(a.data_ptr()), ctypes.byref(I(k)), ctypes.byref(F(0.0)),
             P(c.data_ptr()), ctypes.byref(I(n)))

    def timed(call):
        call()
        start = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - start) / reps

    for m, n, k in SHAPES:
        a, b, c = torch.randn(m, k), torch.randn(n, k), torch.empty(m, n)
        a16, b16, c16 = a.bfloat16(), b.bfloat16(), torch.empty(m, n, dtype=torch.bfloat16)
        rows(lib.gemm_bf16bf16f32_, m, n, k, a16, b16, c)
        error = (c.double() - a16.double() @ b16.double().t()).abs().max().item()
        assert error < 1e-3 * k, f"gemm_bf16bf16f32_ is off by {error}"
        seconds = {"sgemm_ fp32": timed(lambda: rows(lib.sgemm_, m, n, k, a, b, c)),
                   "MKL bf16": timed(lambda: rows(lib.gemm_bf16bf16f32_, m, n, k, a16, b16, c)),
                   "ATen bf16 mm": timed(lambda: torch.mm(a16, b16.t(), out=c16))}
        print(f"{m}x{n}x{k}".ljust(13) + "".join(f"{2 * m * n * k / s / 1e9:>16.0f}" for s in seconds.values()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.reps)
        return
    print(f"# {cpu_model()}; GFLOP/s, one thread")
    for title, preload in (("chosen by the CPU's features", mkl_shim()), ("chosen by MKL's vendor check", None)):
        print(f"\n# MKL's kernels {title}\n" + "m x n x k".ljust(13) +
              "".join(w.rjust(16) for w in ("sgemm_ fp32", "MKL bf16", "ATen bf16 mm")), flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if preload:
            env["LD_PRELOAD"] = preload
        subprocess.run([VENV_PYTHON, os.path.abspath(__file__), "--child", "--reps", str(args.reps)], env=env,
                       check=True)


if __name__ == "__main__":
    sys.exit(main())
