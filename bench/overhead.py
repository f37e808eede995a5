#!/usr/bin/env python3
"""FSDP's framework overhead: fsdp.cpp against FSDP2 eager on models of
many small units, where the per-unit work of the hooks shows.

The model is the example transformer of `fsdp bench step` (PyTorch's FSDP2
example: LayerNorm, attention without biases, a GELU feed-forward, an
untied head), in two shapes: 64 blocks of width 64 and 16 of width 256;
batch 4 x 64 tokens per rank, vocabulary 512, one thread per rank. Each
block is a unit, then the root. fsdp.cpp runs `fsdp bench step`, which at
W = 1 interleaves the same model unsharded (LibTorch) with the sharded
one; the peer runs this file's twin of the model, plain and under
`fully_shard`, interleaved the same way, with PyTorch at its best (fused
AdamW, scaled_dot_product_attention). Repetitions alternate fsdp.cpp and
the peer. Per-unit overhead = (sharded step - unsharded step) / units, at
W = 1, each against its own unsharded step. At W = 2 fsdp.cpp also runs
with FSDP_SHARED_MEMORY=0 (its collectives over Gloo's TCP, as the peer's
are): the share of the lead its shared-memory transport gives.

    python3 bench/overhead.py [--reps 3] [--iters 20]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from run_benchmarks import mkl_preload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
SHAPES = {"64x64": (64, 64, 4), "16x256": (16, 256, 4)}  # blocks, width, heads
BATCH, SEQ, VOCAB = 4, 64, 512


def peer_main(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)

    class Block(nn.Module):
        def __init__(self, c, heads):
            super().__init__()
            self.heads = heads
            self.attention_norm = nn.LayerNorm(c)
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(c, c, bias=False) for _ in range(4))
            self.ffn_norm = nn.LayerNorm(c)
            self.w1 = nn.Linear(c, 4 * c)
            self.w2 = nn.Linear(4 * c, c)

        def forward(self, x):
            B, T, C = x.shape
            h = self.attention_norm(x)
            q, k, v = (w(h).view(B, T, self.heads, C // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.wo(y)
            return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))

    class Transformer(nn.Module):
        def __init__(self, layers, c, heads):
            super().__init__()
            self.tok_embeddings = nn.Embedding(VOCAB, c)
            self.pos_embeddings = nn.Embedding(SEQ, c)
            self.layers = nn.ModuleList(Block(c, heads) for _ in range(layers))
            self.norm = nn.LayerNorm(c)
            self.output = nn.Linear(c, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1]))
            for layer in self.layers:
                x = layer(x)
            return self.output(self.norm(x))

    layers, c, heads = SHAPES[a.shape]
    import torch.distributed as dist
    dist.init_process_group("gloo")  # FSDP2 needs a process group at W = 1 too
    world = dist.get_world_size()
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    sharded = Transformer(layers, c, heads)
    mesh = init_device_mesh("cpu", (world,))
    for layer in sharded.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    plain = Transformer(layers, c, heads) if world == 1 else None
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
              for name, m in (("sharded", sharded), ("plain", plain)) if m is not None}
    gen = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)

    def step(model, optim):
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times = {"sharded": [], "plain": []}
    for i in range(a.warmup + a.iters):
        p = step(plain, optims["plain"]) if plain is not None else 0.0
        dist.barrier()
        s = step(sharded, optims["sharded"])
        if i >= a.warmup:
            times["plain"].append(p)
            times["sharded"].append(s)
    t = torch.tensor(times["sharded"], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    times["sharded"] = t.tolist()
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({k: statistics.median(v) for k, v in times.items() if v and max(v) > 0}), flush=True)
    # Gloo's threads can abort the interpreter's teardown on some rank
    # ("terminate called without an active exception"): the result is out.
    os._exit(0)


def ours(shape, world, iters, shared_memory=True):
    layers, c, heads = SHAPES[shape]
    cmd = (f"{FSDP} bench step --layers {layers} --dim {c} --heads {heads} --seq-len {SEQ} --batch-size {BATCH} "
           f"--vocab {VOCAB} -w 3 -i {iters}")
    if world > 1:
        cmd = f"{FSDP} launch -n {world} -- {cmd}"
    env = "" if shared_memory else "FSDP_SHARED_MEMORY=0 "
    out = subprocess.run(f"{env}OMP_NUM_THREADS=1 {cmd}", shell=True, check=True, capture_output=True,
                         text=True).stdout
    result = {}
    for line in out.splitlines():
        line = line.split("] ", 1)[-1]
        if line.startswith("unsharded (LibTorch)"):
            result["plain"] = float(line.split()[2])
        elif line.startswith("fsdp full_shard"):
            result["sharded"] = float(line.split()[2])
    return result


def peer(shape, world, iters):
    # MKL as fsdp.cpp's programs have it: kernels chosen by the CPU's features.
    cmd = (f"{FSDP} launch -n {world} -- env {mkl_preload()} {VENV_PYTHON} {os.path.abspath(__file__)} "
           f"--peer --shape {shape} --iters {iters}")
    out = subprocess.run(f"OMP_NUM_THREADS=1 {cmd}", shell=True, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1].split("] ", 1)[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=sorted(SHAPES), default="64x64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if a.peer:
        peer_main(a)
        return
    cpu = subprocess.run("lscpu | sed -n 's/^Model name: *//p'", shell=True, capture_output=True, text=True).stdout
    print(f"# {cpu.strip()}; batch {BATCH} x {SEQ}, vocabulary {VOCAB}, one thread per rank; medians over {a.reps} "
          f"repetitions of each run's median over {a.iters} steps")
    print(f"{'model':8} {'W':>2} {'side':17} {'unsharded s':>12} {'sharded s':>10} {'per unit ms':>12}")
    for shape in SHAPES:
        units = SHAPES[shape][0] + 1
        for world in (1, 2):
            runs = {"fsdp.cpp": [], "FSDP2": []}
            if world > 1:
                runs["fsdp.cpp over TCP"] = []
            for _ in range(a.reps):
                runs["fsdp.cpp"].append(ours(shape, world, a.iters))
                if world > 1:
                    runs["fsdp.cpp over TCP"].append(ours(shape, world, a.iters, shared_memory=False))
                runs["FSDP2"].append(peer(shape, world, a.iters))
            for side, rs in runs.items():
                sharded = statistics.median(r["sharded"] for r in rs)
                plain = statistics.median(r["plain"] for r in rs) if world == 1 else None
                per_unit = f"{(sharded - plain) / units * 1e3:12.3f}" if plain is not None else f"{'':12}"
                plain_text = f"{plain:12.4f}" if plain is not None else f"{'':12}"
                print(f"{shape:8} {world:>2} {side:17} {plain_text} {sharded:10.4f} {per_unit}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
