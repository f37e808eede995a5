#!/usr/bin/env python3
"""The PyTorch peer of `fsdp train` for side-by-side benchmarks.

The same models as fsdp.cpp's presets (gpt2-d6: Hugging Face's GPT-2 layout,
Conv1D weights [in, out], tanh GELU, tied head; llama-w768: Llama 3.2's form,
RMSNorm, RoPE, grouped keys and values, SwiGLU, tied head), the same AdamW
(betas 0.9/0.95, eps 1e-8, decay on matrices only), clipping at 1.0, the
same batch and sequence, random tokens. Runs

  - eager or compiled (`--compile`, inductor; `--compile-mode` picks the mode);
  - on one process, or at W ranks with FSDP2 (`--fsdp2`: fully_shard on each
    block, then the root) or DistributedDataParallel (`--ddp`, for torch
    versions without FSDP2), launched by `fsdp launch -n W -- python3 ...`
    (or torchrun).

Writes one JSON line per step: {"step", "loss", "step_time_s",
"tokens_per_s", "peak_rss_mb"} (rank 0; peak RSS is rank 0's). The first
step's time includes compilation.
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0

MODELS = {
    # vocab, width, layers, heads, kv heads, mlp width
    "gpt2-d6": ("gpt2", 50257, 384, 6, 6, 6, 4 * 384),
    "llama-w768": ("llama", 32000, 768, 6, 12, 4, 2048),
    "gpt2": ("gpt2", 50257, 768, 12, 12, 12, 4 * 768),  # GPT-2 124M
    "llama3.2-1b": ("llama", 128256, 2048, 16, 32, 8, 8192),
    "llama3.2-3b": ("llama", 128256, 3072, 28, 24, 8, 8192),
}


def attention(q, k, v):
    """q (B, heads, T, hs), k and v (B, kv heads, T, hs): causal attention."""
    grouped = k.shape[1] != q.shape[1]
    if HAS_SDPA and grouped and "enable_gqa" in F.scaled_dot_product_attention.__doc__:
        # torch >= 2.5: grouped heads without copies (fwd+bwd of one
        # llama-w768 layer, 2 threads: 20.4-21.1 ms against 22.6-23.1 with
        # repeat_interleave).
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if grouped:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    return att @ v


class Conv1D(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class GPT2Block(nn.Module):
    def __init__(self, c, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = Conv1D(c, 3 * c)
        self.c_proj = Conv1D(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = Conv1D(c, ffn)
        self.c_proj2 = Conv1D(ffn, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.c_proj2(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    def __init__(self, c, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, c // heads
        self.input_layernorm = RMSNorm(c)
        self.q_proj = nn.Linear(c, heads * self.hs, bias=False)
        self.k_proj = nn.Linear(c, kv_heads * self.hs, bias=False)
        self.v_proj = nn.Linear(c, kv_heads * self.hs, bias=False)
        self.o_proj = nn.Linear(heads * self.hs, c, bias=False)
        self.post_attention_layernorm = RMSNorm(c)
        self.gate_proj = nn.Linear(c, ffn, bias=False)
        self.up_proj = nn.Linear(c, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, c, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.heads, self.hs).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        y = attention(rotate(q, cos, sin), rotate(k, cos, sin), v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def model_shape(name, layers=0, width=0, heads=0):
    """MODELS[name], with the layers, width and heads given (0: the preset's);
    a new width keeps the preset's MLP ratio, and GPT-2's key/value heads
    follow its heads."""
    family, vocab, c, n_layers, n_heads, kv_heads, ffn = MODELS[name]
    if width:
        ffn, c = ffn * width // c, width
    if heads:
        kv_heads, n_heads = (heads if family == "gpt2" else kv_heads), heads
    return family, vocab, c, layers or n_layers, n_heads, kv_heads, ffn


class CausalLM(nn.Module):
    def __init__(self, shape, max_positions=1024):
        super().__init__()
        family, vocab, c, layers, heads, kv_heads, ffn = shape
        self.family = family
        self.wte = nn.Embedding(vocab, c)
        nn.init.normal_(self.wte.weight, std=0.02)
        if family == "gpt2":
            self.wpe = nn.Embedding(max_positions, c)
            nn.init.normal_(self.wpe.weight, std=0.01)
            self.h = nn.ModuleList(GPT2Block(c, heads, ffn) for _ in range(layers))
            self.ln_f = nn.LayerNorm(c)
        else:
            self.h = nn.ModuleList(LlamaBlock(c, heads, kv_heads, ffn) for _ in range(layers))
            self.ln_f = RMSNorm(c)
            hs = c // heads
            inv = 1.0 / (500000.0 ** (torch.arange(0, hs, 2).float() / hs))
            angles = torch.outer(torch.arange(max_positions).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens)
        if self.family == "gpt2":
            x = x + self.wpe(torch.arange(T, device=tokens.device))
            for block in self.h:
                x = block(x)
        else:
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
            for block in self.h:
                x = block(x, cos, sin)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2-d6")
    p.add_argument("--layers", type=int, default=0, help="blocks (0: the preset's)")
    p.add_argument("--width", type=int, default=0, help="hidden width (0: the preset's; the MLP keeps its ratio)")
    p.add_argument("--heads", type=int, default=0, help="attention heads (0: the preset's)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel over Gloo")
    p.add_argument("--fsdp2", action="store_true", help="FSDP2 fully_shard (each block, then the root) over Gloo")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile: model and loss together on one process; each block (torchtitan's way) "
                        "under FSDP2")
    p.add_argument("--compile-mode", default=None, help="torch.compile's mode (default: inductor's default)")
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True): without it AdamW's tiny values go subnormal and slow every op")
    p.add_argument("--bf16", action="store_true",
                   help="torch.autocast('cpu', torch.bfloat16) around forward and loss (fp32 master weights)")
    p.add_argument("--adamw", choices=["default", "foreach", "fused"], default="default",
                   help="AdamW's implementation (fused: torch >= 2.4 on CPU)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the model on GPU LOCAL_RANK, FSDP2/DDP over NCCL, --bf16 as FSDP2's "
                        "MixedPrecisionPolicy (bf16 parameters, fp32 reduction) or CUDA autocast on one process")
    p.add_argument("--cpu-offload", action="store_true",
                   help="with --fsdp2: CPUOffloadPolicy(pin_memory=True), its optimizer stepping on the host")
    p.add_argument("--metrics", required=True)
    p.add_argument("--profile-step", type=int, default=0,
                   help="record this step (1-based) with torch.profiler, host calls and CUDA kernels")
    p.add_argument("--trace", default="", help="where --profile-step's Chrome trace goes (rank 0)")
    a = p.parse_args()
    if a.profile_step and not a.trace:
        p.error("--profile-step needs --trace FILE")
    if a.flush_denormal:
        torch.set_flush_denormal(True)

    threads = int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))
    torch.set_num_threads(threads)
    world, rank = 1, 0
    torch.manual_seed(0)
    cuda = a.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    shape = model_shape(a.model, a.layers, a.width, a.heads)
    model = CausalLM(shape, max_positions=max(1024, a.seq_len)).to(device)
    vocab = shape[1]
    if a.ddp or a.fsdp2:
        import torch.distributed as dist
        dist.init_process_group("nccl" if cuda else "gloo")
        world, rank = dist.get_world_size(), dist.get_rank()
    # On the GPU FSDP2 takes bf16 as its own policy: parameters gathered in
    # bf16, gradients reduced in fp32 (no autocast).
    policy_bf16 = a.fsdp2 and a.bf16 and cuda
    if a.fsdp2:
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        kwargs = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
            if policy_bf16 else {}
        if a.cpu_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        for i, block in enumerate(model.h):
            if a.compile:
                block = torch.compile(block, mode=a.compile_mode)
                model.h[i] = block
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    # Decay on matrices, after wrapping: FSDP2's parameters are DTensors of the same rank.
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    if a.ddp:
        # Gradients as views into the buckets: no copy into them and back,
        # DDP's fastest setting.
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    options = {"foreach": True} if a.adamw == "foreach" else {"fused": True} if a.adamw == "fused" else {}
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **options)

    def forward_loss(inputs, targets):
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    if a.compile and not a.fsdp2:
        forward_loss = torch.compile(forward_loss, mode=a.compile_mode)
    gen = torch.Generator().manual_seed(1 + rank)
    out = open(a.metrics, "a") if rank == 0 else None
    for step in range(a.steps):
        tokens = torch.randint(0, vocab, (a.batch_size, a.seq_len + 1), generator=gen).to(device)
        if cuda:
            torch.cuda.synchronize()
        profiler = None
        if a.profile_step == step + 1 and rank == 0:
            activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            profiler = torch.profiler.profile(activities=activities)
            profiler.start()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.bf16 and not policy_bf16):
            loss = forward_loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if profiler:
            profiler.stop()
            profiler.export_chrome_trace(a.trace)
        if out:
            record = {"step": step + 1, "loss": loss_value, "step_time_s": seconds,
                      "tokens_per_s": world * a.batch_size * a.seq_len / seconds, "peak_rss_mb": peak_rss_mb()}
            if cuda:
                record["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            out.write(json.dumps(record) + "\n")
            out.flush()
    if a.ddp or a.fsdp2:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
