#!/usr/bin/env python3
"""The PyTorch peer of `fsdp train` for side-by-side benchmarks.

The same GPT-2 as fsdp.cpp's (Hugging Face layout: Conv1D weights [in, out],
tanh GELU, tied head), the same AdamW (betas 0.9/0.95, eps 1e-8, decay on
matrices only), the same batch and sequence, trained in eager mode on one
process or with DistributedDataParallel over Gloo (launch it with
`fsdp launch -n 2 -- python3 bench/pytorch_gpt2.py --ddp`). Writes one JSON
line per step: {"step", "loss", "step_time_s", "tokens_per_s"}.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = Conv1D(c, 3 * c)
        self.c_proj = Conv1D(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = Conv1D(c, 4 * c)
        self.c_proj2 = Conv1D(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.heads))
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.c_proj2(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab, positions, c, layers, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(positions, c)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True): without it AdamW's tiny values go subnormal and slow every op")
    p.add_argument("--bf16", action="store_true",
                   help="torch.autocast('cpu', torch.bfloat16) around forward and loss (fp32 master weights)")
    p.add_argument("--foreach", action="store_true",
                   help="AdamW(foreach=True): the multi-tensor AdamW (torch 1.13 has no fused AdamW on CPU)")
    p.add_argument("--metrics", required=True)
    a = p.parse_args()
    if a.flush_denormal:
        torch.set_flush_denormal(True)

    threads = int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))
    torch.set_num_threads(threads)
    world, rank = 1, 0
    torch.manual_seed(0)
    model = GPT2(a.vocab, 1024, a.dim, a.layers, a.heads)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=a.foreach or None)
    gen = torch.Generator().manual_seed(1 + rank)
    out = open(a.metrics, "a") if rank == 0 else None
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch_size, a.seq_len + 1), generator=gen)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        if out:
            out.write(json.dumps({"step": step + 1, "loss": loss.item(), "step_time_s": seconds,
                                  "tokens_per_s": world * a.batch_size * a.seq_len / seconds}) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
