"""fsdp::replicate against PyTorch's DistributedDataParallel: the same
residual MLP (replicate_probe.cpp, ddp_train.py), initial weights and
global batches, AdamW, W ranks. Every step's loss (averaged over the ranks)
within 1e-5 relative, and every trained tensor within 1e-5 relative
(||ours - theirs|| / ||theirs||).

  ddp_alignment_test.py --world W
"""
import os

import torch
from safetensors.torch import load_file, save_file

import ddp_train
import harness

STEPS, DIM, BLOCKS, ROWS = 20, 32, 3, 8
BOUND = 1e-5


def main():
    args = harness.parse_args(__doc__, lambda p: p.add_argument("--world", type=int, default=2))
    work = harness.work_dir(args)
    init, data = os.path.join(work, "init.safetensors"), os.path.join(work, "data.safetensors")
    save_file({k: v.contiguous() for k, v in ddp_train.initial_weights(DIM, BLOCKS).items()}, init)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, ROWS * args.world, DIM, generator=generator)
    save_file({"x": x, "y": x.sum(2, keepdim=True).sin()}, data)

    ours, theirs = os.path.join(work, "ours.safetensors"), os.path.join(work, "theirs.safetensors")
    # fsdp.cpp with buckets of about 20 KB (several per model: their order
    # and overlap are exercised); DDP with its default 25 MB.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ours_env = dict(env, FSDP_PROBE_BUCKET_MB="0.02")
    harness.run([args.fsdp, "launch", "-n", str(args.world), "--",
                 os.path.join(args.build_dir, "tests", "fsdp_replicate_probe"), init, data, ours], env=ours_env)
    harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                 str(args.world), os.path.join(os.path.dirname(__file__), "ddp_train.py"), init, data, theirs], env=env)
    a, b = load_file(ours), load_file(theirs)
    assert set(a) == set(b), f"different tensors: {sorted(set(a) ^ set(b))}"
    loss_a, loss_b = a.pop("loss"), b.pop("loss")
    print("losses (fsdp.cpp, DDP):", [f"{u:.6f}/{v:.6f}" for u, v in zip(loss_a.tolist(), loss_b.tolist())][:5], "...")
    harness.check("largest relative loss difference", float(((loss_a - loss_b).abs() / loss_b.abs()).max()), BOUND)
    if not float(loss_b[-1]) < float(loss_b[0]):
        harness.fail("the loss did not fall: the comparison would mean little")
    worst = max((float((a[k] - b[k]).norm() / b[k].norm()), k) for k in b)
    harness.check(f"largest relative weight difference ({worst[1]})", worst[0], BOUND)


if __name__ == "__main__":
    main()
