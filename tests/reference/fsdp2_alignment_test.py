"""fsdp.cpp's `fsdp train` against PyTorch FSDP2 (fsdp2_train.py) on the
same Hugging Face directories, token file and settings: per-step losses
over 20 steps and the trained weights.

  fsdp2_alignment_test.py --world W [--hsdp R] [--grad-accum A] [--precision fp32|bf16]
                          [--reshard-after-forward K] [--shard-placement rows|columns] [--families ...]

fp32: every step's loss within 1e-5 relative, and every trained tensor
within 1e-4 relative (||ours - theirs|| / ||theirs||; measured up to
8.6e-6, in zero-initialised biases and rarely seen embedding rows). One slice is left out of the
weights: GPT-2's key bias (the middle third of `c_attn.bias`). Softmax
over a query's scores is unchanged by adding the same q.b_k to all of
them, so that bias's gradient is zero up to rounding, and Adam, dividing
each step by the gradient's running RMS, turns the two sides' different
rounding noise into full-size, unrelated updates (measured: 0.14 apart,
every other tensor within 7.4e-7).

Mixture-of-Experts models route each token to its k likeliest experts, a
discontinuous choice: where two experts' router logits come closer than
the two sides' rounding differences, the sides may route a token
differently, and from then on train slightly different models. FSDP2's
side records each step's smallest gap between the k-th and (k+1)-th router
logit (fsdp2_train.py, routing_margin); from the first step where it falls
below ROUTING_TIE (a hundred times the sides' rounding differences),
losses are held to AFTER_TIE_BOUND and weights are not compared, and the
test says so, and says when that leaves fewer than half of the steps
compared.

bf16: both sides compute in bf16 with fp32 reduction and fp32 master
weights, and both are compared with an fp64 run of the same training
(FSDP2, same mesh). fsdp.cpp passes when its largest per-step loss distance
from fp64 is within BF16_FACTOR times FSDP2's: as close to the exact
answer as FSDP2's own bf16, up to the spread of bf16 rounding. Measured at
W = 2 (fsdp.cpp, FSDP2): GPT-2 8.1e-4, 4.8e-4; Llama 1.1e-3, 1.7e-3; Qwen3
1.3e-3, 8.9e-4; Qwen3-MoE 7.3e-3, 5.2e-3; the largest ratio is 1.7. With
attention's scores and weights in float (MKL's bf16 products): GPT-2
3.4e-4, 4.8e-4; Llama 1.1e-3, 1.7e-3; Qwen3-MoE 5.8e-3, 5.2e-3; Llama 4
4.1e-3, 3.9e-3; the largest ratio 1.12.
"""
import json
import os

import numpy as np
from safetensors.numpy import load_file

import harness
import hf_models
import token_files

LOSS_BOUND, WEIGHT_BOUND = 1e-5, 1e-4
ROUTING_TIE, AFTER_TIE_BOUND = 1e-4, 1e-3
BF16_FACTOR = 2.5
STEPS = 20
SETTINGS = dict(steps=STEPS, seq_len=32, batch_size=2, lr=3e-3, warmup_steps=5, min_lr_ratio=0.1, weight_decay=0.1,
                beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0)


def flags(settings):
    return [x for key, value in settings.items() for x in ("--" + key.replace("_", "-"), str(value))]


def run_fsdp(args, directory, tokens, out):
    command = [args.fsdp, "launch", "-n", str(args.world), "--", args.fsdp, "train", "--init-from", directory,
               "--data", tokens, "--out-dir", out, "--export-hf", os.path.join(out, "hf"), "--log-every", "1",
               "--tensorboard=false", "--precision", args.precision, "--grad-accum", str(args.grad_accum),
               "--device", args.device]
    command += flags(SETTINGS)
    if args.hsdp:
        command += ["--sharding", "hybrid_shard", "--fsdp-size", str(args.world // args.hsdp)]
    if args.reshard_after_forward:
        command += ["--reshard-after-forward", str(args.reshard_after_forward)]
    if args.shard_placement:
        command += ["--shard-placement", args.shard_placement]
    harness.run(command)
    lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    losses = [x["loss"] for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x]
    return np.array(losses), load_file(os.path.join(out, "hf", "model.safetensors"))


def fsdp2_arguments(args, directory, tokens, out, precision):
    """One FSDP2 run's arguments to fsdp2_train.py, writing into OUT."""
    os.makedirs(out, exist_ok=True)
    command = ["--init-from", directory, "--data", tokens, "--losses", os.path.join(out, "losses.jsonl"),
               "--final", os.path.join(out, "final"), "--precision", precision,
               "--grad-accum", str(args.grad_accum), "--device", args.device]
    command += flags(SETTINGS)
    if args.hsdp:
        command += ["--hsdp", str(args.hsdp)]
    if args.reshard_after_forward:
        command += ["--reshard-after-forward", str(args.reshard_after_forward)]
    if args.shard_placement == "columns":
        command += ["--shard-placement", "columns"]
    return command


def run_fsdp2(args, runs, work):
    """Trains RUNS ((directory, tokens, out, precision) each) under FSDP2 in
    one torchrun, one after another from fresh models (fsdp2_train.py
    --jobs); returns each one's (losses, trained weights, routing margins)."""
    jobs = os.path.join(work, "fsdp2-jobs.jsonl")
    with open(jobs, "w") as f:
        for run in runs:
            f.write(json.dumps(fsdp2_arguments(args, *run)) + "\n")
    harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                 str(args.world), os.path.join(os.path.dirname(__file__), "fsdp2_train.py"), "--jobs", jobs])
    results = []
    for _, _, out, _ in runs:
        records = [json.loads(line) for line in open(os.path.join(out, "losses.jsonl"))]
        results.append((np.array([r["loss"] for r in records]),
                        load_file(os.path.join(out, "final", "model.safetensors")),
                        [r.get("routing_margin") for r in records]))
    return results


def relative(a, b):
    return np.abs(a - b) / np.abs(b)


def weight_difference(ours, theirs, family):
    extra = sorted(set(ours) - set(theirs))
    if extra:
        harness.fail(f"{family}: fsdp's export has tensors FSDP2's model lacks: {extra}")
    def comparable(name, tensor):
        if name.endswith("attn.c_attn.bias"):  # GPT-2: leave out the key bias (above)
            third = tensor.shape[0] // 3
            return np.concatenate([tensor[:third], tensor[2 * third:]])
        return tensor

    return max((float(np.linalg.norm(comparable(k, ours[k]) - comparable(k, theirs[k])) /
                      np.linalg.norm(comparable(k, theirs[k]))), k) for k in ours)


def main():
    def extra(parser):
        parser.add_argument("--world", type=int, required=True)
        parser.add_argument("--hsdp", type=int, default=0, help="replicas (hybrid_shard, 2-D mesh)")
        parser.add_argument("--grad-accum", type=int, default=1)
        parser.add_argument("--reshard-after-forward", type=int, default=0,
                            help="blocks keep their parameters sharded over this many ranks after forward")
        parser.add_argument("--shard-placement", choices=("flat", "rows", "columns"), default="",
                            help="fsdp's layout; FSDP2 places its parameters the same way for columns (matrices "
                                 "on Shard(1)) and keeps its own, every parameter on Shard(0), otherwise")
        parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
        parser.add_argument("--families", nargs="+", default=list(hf_models.FAMILIES))
        parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                            help="both sides on GPU LOCAL_RANK over NCCL (a CUDA build of fsdp)")

    args = harness.parse_args(__doc__, extra)
    work = harness.work_dir(args)
    tokens = os.path.join(work, "tokens.bin")
    token_files.write(tokens, token_files.learnable_stream(16384, hf_models.VOCAB))
    shape = f"W={args.world}" + (f" ({args.hsdp}x{args.world // args.hsdp} HSDP)" if args.hsdp else "") + \
        (f", {args.grad_accum} micro-steps" if args.grad_accum > 1 else "") + \
        (f", blocks kept over {args.reshard_after_forward} ranks after forward" if args.reshard_after_forward else "") + \
        (f", fsdp's parameters placed as {args.shard_placement}" if args.shard_placement else "") + \
        f", {args.precision}"
    ours = {}
    for family in args.families:
        directory = os.path.join(work, family)
        hf_models.write_model(family, directory)
        ours[family] = run_fsdp(args, directory, tokens, os.path.join(work, family + "-fsdp"))
    # FSDP2's runs, every family's (and fp64's beside bf16) in one torchrun.
    runs = [(os.path.join(work, family), tokens, os.path.join(work, family + "-fsdp2"), args.precision)
            for family in args.families]
    if args.precision == "bf16":
        runs += [(os.path.join(work, family), tokens, os.path.join(work, family + "-fp64"), "fp64")
                 for family in args.families]
    results = dict(zip([(run[0], run[3]) for run in runs], run_fsdp2(args, runs, work)))
    rows = []
    for family in args.families:
        (ours_losses, our_weights), directory = ours[family], os.path.join(work, family)
        theirs, their_weights, margins = results[directory, args.precision]
        if len(ours_losses) != STEPS or len(theirs) != STEPS:
            harness.fail(f"{family}: expected {STEPS} losses, got {len(ours_losses)} (fsdp) and {len(theirs)} (FSDP2)")
        loss_gap = float(relative(ours_losses, theirs).max())
        weight_gap, worst_tensor = weight_difference(our_weights, their_weights, family)
        print(f"{family} {shape}: losses {theirs[0]:.4f} -> {theirs[-1]:.4f}; largest loss difference "
              f"{loss_gap:.2e}, weights {weight_gap:.2e} ({worst_tensor})", flush=True)
        if args.precision == "fp32":
            tie = next((i for i, m in enumerate(margins) if m is not None and m < ROUTING_TIE), STEPS)
            if tie < STEPS // 2:
                # Fewer than half the steps held to LOSS_BOUND: said as such.
                print(f"{family}: only steps 1 to {tie} of {STEPS} compared at {LOSS_BOUND} (a routing near-tie "
                      f"at step {tie + 1}); the rest are not a comparison of the two implementations")
            harness.check(f"{family}: loss, relative, steps 1 to {tie}",
                          float(relative(ours_losses, theirs)[:tie].max()), LOSS_BOUND)
            if tie < STEPS:
                print(f"{family}: a routing near-tie at step {tie + 1} (router logits {margins[tie]:.1e} apart): "
                      f"from there the sides may route a token differently; steps {tie + 1} to {STEPS} are held "
                      f"to {AFTER_TIE_BOUND} only, and the weights are not compared")
                harness.check(f"{family}: loss, relative, steps {tie + 1} to {STEPS}",
                              float(relative(ours_losses, theirs)[tie:].max()), AFTER_TIE_BOUND)
            else:
                harness.check(f"{family}: weights, relative", weight_gap, WEIGHT_BOUND)
        else:
            exact = results[directory, "fp64"][0]
            our_error, their_error = float(relative(ours_losses, exact).max()), float(relative(theirs, exact).max())
            print(f"{family}: distance from fp64: fsdp.cpp bf16 {our_error:.2e}, FSDP2 bf16 {their_error:.2e}")
            harness.check(f"{family}: fsdp.cpp bf16 distance from fp64 over FSDP2 bf16's", our_error / their_error,
                          BF16_FACTOR)
        rows.append((family, loss_gap, weight_gap))
    print(f"\n| family | {shape}: largest loss difference | weights |\n| --- | --- | --- |")
    for family, loss_gap, weight_gap in rows:
        print(f"| {family} | {loss_gap:.1e} | {weight_gap:.1e} |")


if __name__ == "__main__":
    main()
