"""The reference trainer: PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`)
training a Hugging Face directory with `transformers`' model code, on a
CPU device mesh over Gloo, the way `fsdp train` does it:

- data: the llm.c token file, unshuffled; rank r of W at step s, micro-step
  a of A reads B rows starting at sequence ((s*A + a)*W + r)*B, sequence i
  being the T+1 tokens from position i*T (docs/training.md, "Data");
- model: `fully_shard` on each block, then on the root; with --hsdp R, a
  2-D mesh (R replicas x W/R shards), as `--sharding hybrid_shard`;
- loss: mean cross-entropy over the micro-batch's tokens, plus the MoE
  load-balancing loss times router_aux_loss_coef where transformers
  adds one (config.json's output_router_logits; never for Llama 4); each micro-step's loss
  divided by A, gradients synchronised on the last micro-step only
  (`set_requires_gradient_sync`);
- optimizer: AdamW, weight decay on parameters of 2 or more dimensions,
  none on the rest; linear warmup, then cosine to min_lr_ratio * lr;
  gradients clipped to a global norm;
- bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).

Run under torchrun, for one run (the arguments below) or for several:
`fsdp2_train.py --jobs FILE`, FILE holding one JSON list of these
arguments per line, trains each in turn in the same process group, from
its own fresh model, as separate runs would: a test comparing several
models pays the interpreter's imports and the group's start-up once.
Rank 0 writes one JSON line per step ({"step", "loss",
"grad_norm": the global norm before clipping},
and for MoE models "routing_margin", routing_margin() below)
to --losses and, with --final, the trained model (save_pretrained).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import harness
import token_files


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-from", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--losses", required=True)
    p.add_argument("--final", help="directory for the trained model, as save_pretrained writes it (rank 0)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--precision", choices=("fp32", "bf16", "fp64"), default="fp32")
    p.add_argument("--hsdp", type=int, default=0, help="replicas of a 2-D mesh (0: 1-D)")
    p.add_argument("--reshard-after-forward", type=int, default=0,
                   help="blocks keep their parameters sharded over this many ranks between forward and backward")
    p.add_argument("--shard-placement", choices=("rows", "columns"), default="rows",
                   help="rows: FSDP2's default, every parameter on Shard(0); columns: matrices on Shard(1)")
    p.add_argument("--resume-dcp", help="start from this DCP checkpoint (tools/dcp_convert.py export)")
    p.add_argument("--save-dcp", help="save a DCP checkpoint here after step --save-dcp-at")
    p.add_argument("--save-dcp-at", type=int, default=0, help="the step --save-dcp saves after (0: the last)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: GPU LOCAL_RANK, a CUDA mesh over NCCL (TF32 off: fp32 is fp32)")
    p.add_argument("--gradient-divide-factor", type=float, default=0,
                   help="FSDP2's set_gradient_divide_factor (0: FSDP2's default)")
    return p.parse_args(argv)


def jobs_of(argv):
    """The runs named on the command line: one, or --jobs FILE's."""
    runs = [parse(a) for a in harness.job_argvs(argv)]
    if not runs or len({run.device for run in runs}) != 1:
        sys.exit(f"{' '.join(argv)}: expected one or more runs, all on one device")
    return runs


def lr_at(args, step):
    """fsdp.cpp's schedule (src/train/lr_schedule.cpp): warmup, then cosine."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    min_lr = args.lr * args.min_lr_ratio
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    return min_lr + 0.5 * (args.lr - min_lr) * (1 + math.cos(math.pi * progress))


def blocks(model):
    base = getattr(model, "model", None) or model.transformer
    return list(base.layers if hasattr(base, "layers") else base.h)


def batch(tokens, args, world, rank, step, micro):
    T, B = args.seq_len, args.batch_size
    first = ((step * args.grad_accum + micro) * world + rank) * B
    rows = [token_files.window(tokens, (first + j) * T, T + 1) for j in range(B)]
    data = torch.from_numpy(np.stack(rows).astype(np.int64)).to(args.torch_device)
    return data[:, :-1], data[:, 1:]


def load(directory, dtype):
    # transformers' default experts kernel (grouped_mm) has no float64.
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **extra)


def check_gradients_averaged(model, args, tokens, world, rank):
    """FSDP2's gradients on Gloo must be the mean over ranks, not the sum (an
    upstream report, pytorch#162338, had Gloo summing). Checked once, before
    training: one backward of the first global batch under FSDP2 against
    the same batch, all ranks' rows, in a plain unsharded copy. Exits
    naming the ratio when they differ; --gradient-divide-factor is the
    workaround then."""
    plain = load(args.init_from, torch.float64).to(args.torch_device)
    plain.train()
    rows = [batch(tokens, args, world, r, 0, 0) for r in range(world)]
    inputs, targets = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    F.cross_entropy(plain(input_ids=inputs).logits.flatten(0, 1), targets.flatten()).backward()
    inputs, targets = rows[rank]
    F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1), targets.flatten()).backward()
    expected = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        ours = p.grad.full_tensor().to(torch.float64)
        theirs = expected[name].grad
        ratio = float(ours.norm() / theirs.norm())
        if abs(ratio - 1) > 1e-4:
            raise SystemExit(f"FSDP2's gradient of {name} is {ratio:.4f} times the plain model's mean gradient "
                             f"(world {world}); summed instead of averaged? (pytorch#162338)")
    model.zero_grad(set_to_none=True)
    if rank == 0:
        print(f"FSDP2 averages gradients over the {world} ranks (checked against a plain model)", flush=True)


def load_dcp(model, optimizer, directory):
    """Loads model and optimizer from a DCP directory the way an FSDP2
    script does (torchtitan, PyTorch's FSDP2 example with --dcp-api);
    returns the step it was saved at."""
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
             "train_state": {"step": 0, "tokens_seen": 0}}
    dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    return int(state["train_state"]["step"])


def routing_margin(router_logits, k):
    """The smallest gap, over every token and MoE layer of a forward, between
    the k-th and the (k+1)-th router logit: how close a token came to
    being routed to another expert. Below the two sides' rounding
    differences, the two may route it differently."""
    gaps = [torch.topk(logits.detach().double(), k + 1, dim=-1).values for logits in router_logits]
    return min(float((g[:, k - 1] - g[:, k]).min()) for g in gaps)


def main():
    runs = jobs_of(sys.argv[1:])
    cuda = runs[0].device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(1)
    for args in runs:
        args.torch_device = device
        train(args, dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


def train(args, rank, world):
    """One run, from a fresh model, in the process group main started."""
    dtype = torch.float64 if args.precision == "fp64" else torch.float32
    model = load(args.init_from, dtype).to(args.torch_device)
    model.train()
    is_moe = getattr(model.config, "router_aux_loss_coef", None) is not None and hasattr(model.config, "num_experts_per_tok")

    if args.hsdp:
        mesh = init_device_mesh(args.device, (args.hsdp, world // args.hsdp), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(args.device, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.precision == "bf16" else MixedPrecisionPolicy()
    reshard = args.reshard_after_forward or True
    placement = (lambda p: Shard(1) if p.ndim >= 2 else Shard(0)) if args.shard_placement == "columns" else None
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, mp_policy=policy, shard_placement_fn=placement)
    if args.gradient_divide_factor:
        model.set_gradient_divide_factor(args.gradient_divide_factor)

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    tokens = token_files.read(args.data)
    first_step = 0
    if args.resume_dcp:
        first_step = load_dcp(model, optimizer, args.resume_dcp)
    elif world > 1 and args.precision != "bf16":
        check_gradients_averaged(model, args, tokens, world, rank)
    save_at = args.save_dcp_at or args.steps
    if args.save_dcp and not first_step < save_at <= args.steps:
        sys.exit(f"--save-dcp-at {save_at}: not a step this run trains (steps {first_step + 1}-{args.steps})")
    out = open(args.losses, "w") if rank == 0 else None
    for step in range(first_step, args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(args, step)
        lm_sum, margin = 0.0, math.inf
        for micro in range(args.grad_accum):
            model.set_requires_gradient_sync(micro == args.grad_accum - 1)
            inputs, targets = batch(tokens, args, world, rank, step, micro)
            output = model(input_ids=inputs, output_router_logits=True) if is_moe else model(input_ids=inputs)
            lm_loss = F.cross_entropy(output.logits.to(dtype).flatten(0, 1), targets.flatten())
            loss = lm_loss
            if is_moe:
                # Llama 4's transformers model computes no aux loss, and
                # transformers 4.x's returns no router logits either (a plain
                # CausalLMOutputWithPast): then no routing margin is known.
                aux_loss = getattr(output, "aux_loss", None)
                if aux_loss is not None and model.config.output_router_logits:
                    loss = loss + model.config.router_aux_loss_coef * aux_loss.to(dtype)
                router_logits = getattr(output, "router_logits", None)
                if router_logits is not None:
                    margin = min(margin, routing_margin(router_logits, model.config.num_experts_per_tok))
            (loss / args.grad_accum).backward()
            lm_sum += lm_loss.item() / args.grad_accum
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = torch.tensor([lm_sum], dtype=torch.float64, device=args.torch_device)
        dist.all_reduce(mean)
        record = {"step": step + 1, "loss": mean.item() / world, "grad_norm": float(grad_norm.full_tensor()
                  if hasattr(grad_norm, "full_tensor") else grad_norm)}
        if is_moe:
            smallest = torch.tensor([margin], dtype=torch.float64, device=args.torch_device)
            dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
            record["routing_margin"] = smallest.item()
        if out:
            out.write(json.dumps(record) + "\n")
            out.flush()
        if args.save_dcp and step + 1 == save_at:
            dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
                      "train_state": {"step": step + 1, "tokens_seen": (step + 1) * world * args.grad_accum
                                      * args.batch_size * args.seq_len}}, checkpoint_id=args.save_dcp)
    full = {name: p.full_tensor().cpu() for name, p in model.state_dict().items()}
    if rank == 0 and args.final:
        # save_pretrained writes the checkpoint's layout (per-expert tensors
        # where transformers computes with fused ones).
        plain = load(args.init_from, dtype)
        plain.load_state_dict(full)
        plain.save_pretrained(args.final)
    if out:
        out.close()
    dist.barrier()  # the next run starts when every rank has finished this one


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: now and then (twice in
    # about 200 runs here) a worker of this PyTorch aborted there with
    # "terminate called without an active exception", after every result
    # was written, failing a run that had completed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
