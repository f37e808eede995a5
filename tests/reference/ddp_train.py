"""PyTorch's DistributedDataParallel on the residual MLP of
replicate_probe.cpp, run by torchrun: the peer of fsdp::replicate.

  torchrun --standalone --nproc-per-node W ddp_train.py INIT.safetensors DATA.safetensors OUT.safetensors [BENCH_STEPS]

Same files and outputs as replicate_probe.cpp. DDP as a careful user runs
it on CPU: Gloo, gradients as bucket views, fused AdamW, one thread per rank.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim, blocks):
        super().__init__()
        self.blocks = blocks
        for i in range(blocks):
            setattr(self, f"block{i}", Block(dim))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for i in range(self.blocks):
            x = getattr(self, f"block{i}")(x)
        return self.head(x)


def initial_weights(dim, blocks, seed=0):
    torch.manual_seed(seed)
    return Net(dim, blocks).state_dict()


def main():
    init_path, data_path, out_path = sys.argv[1:4]
    bench_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    init = load_file(init_path)
    data = load_file(data_path)
    x, y = data["x"], data["y"]
    blocks = sum(1 for name in init if name.endswith(".norm.weight"))
    model = Net(x.shape[2], blocks)
    model.load_state_dict(init)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    rows = x.shape[1] // world

    def step(s):
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(x[s, rank * rows:(rank + 1) * rows]), y[s, rank * rows:(rank + 1) * rows])
        loss.backward()
        optimizer.step()
        return loss.detach().clone()

    losses = []
    for s in range(x.shape[0]):
        loss = step(s)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss)
    if bench_steps:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(bench_steps):
            step(x.shape[0] - 1)
        dist.barrier()
        if rank == 0:
            print(f"rows/s {bench_steps * x.shape[1] / (time.perf_counter() - start):.1f}", flush=True)
    if rank == 0:
        out = {"loss": torch.stack(losses)}
        out.update({name: p.detach().contiguous() for name, p in model.named_parameters()})
        save_file(out, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown, as fsdp2_train.py does: now
    # and then a worker of this PyTorch aborts there ("terminate called
    # without an active exception", then a segmentation fault) after every
    # result was written, failing a run that had completed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
