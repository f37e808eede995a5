#!/usr/bin/env python3
"""fsdp plan against measured runs: for each configuration of a grid (GPT-2
and Llama-style models, a tied head at a large vocabulary, Qwen3-MoE and
Llama 4; W = 1, 2, 4; every sharding strategy; fp32 and
bf16; activation checkpointing and chunked loss on and off) this predicts
the per-rank peak with `fsdp plan --json` and trains 3 steps with the same
flags, then compares:

- the tensors' peak: predicted against the trainer's own accounting
  (`allocated_peak_mb` in metrics.jsonl: every CPU tensor block, FSDP's
  buffers included, counted by the allocator), the figure the prediction
  targets;
- the total: predicted tensors plus the runtime overhead `fsdp plan`
  measures, against peak RSS (`peak_rss_mb`, VmHWM).

Both from rank 0. Writes out/bench/memory_validation.{json,md}.

With --moments NAME, one configuration is also recorded with
--memory-snapshot and every moment of the predicted timeline (forward
block i, the loss, its backward, backward block i, the root's
post-backward, the optimizer) is compared with the most tensor memory held
during the matching phases of the recording (step 3).

    python3 bench/memory_validation.py [--only NAME] [--steps 3] [--moments NAME]
"""
import argparse
import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")
DATA = "--data synthetic --seq-len 256 --batch-size 4"

# (name, world size, flags): the grid.
GRID = [
    ("gpt2-d6 W1 fp32", 1, "--model gpt2-d6"),
    ("gpt2-d6 W1 fp32 +AC", 1, "--model gpt2-d6 --activation-checkpoint"),
    ("gpt2-d6 W1 fp32 chunked loss", 1, "--model gpt2-d6 --chunk-loss"),
    ("gpt2-d6 W1 bf16", 1, "--model gpt2-d6 --precision bf16"),
    ("gpt2-d6 W2 full_shard fp32", 2, "--model gpt2-d6 --sharding full_shard"),
    ("gpt2-d6 W2 shard_grad_op fp32", 2, "--model gpt2-d6 --sharding shard_grad_op"),
    ("gpt2-d6 W2 no_shard fp32", 2, "--model gpt2-d6 --sharding no_shard"),
    ("gpt2-d6 W2 full_shard bf16 +AC", 2, "--model gpt2-d6 --precision bf16 --activation-checkpoint"),
    ("gpt2-d6 W2 full_shard fp32, 2 micro-steps", 2, "--model gpt2-d6 --grad-accum 2"),
    ("gpt2-d6 W4 full_shard fp32", 4, "--model gpt2-d6 --sharding full_shard"),
    ("gpt2-d6 W4 hybrid 2x2 fp32", 4, "--model gpt2-d6 --sharding hybrid_shard --fsdp-size 2"),
    ("llama-d6 W1 fp32", 1, "--model llama-d6"),
    ("llama-d6 W1 bf16 +AC", 1, "--model llama-d6 --precision bf16 --activation-checkpoint"),
    ("llama-d6 W2 full_shard bf16", 2, "--model llama-d6 --precision bf16"),
    ("llama-d6 W2 full_shard fp32 +AC chunked loss", 2, "--model llama-d6 --activation-checkpoint --chunk-loss"),
    ("llama-d6 W4 shard_grad_op fp32", 4, "--model llama-d6 --sharding shard_grad_op"),
    ("llama-d6 W4 hybrid 2x2 bf16", 4, "--model llama-d6 --sharding hybrid_shard --fsdp-size 2 --precision bf16"),
    # A tied head at a large vocabulary (32000 x 768).
    ("llama-w768 W1 fp32 tied", 1, "--model llama-w768"),
    ("llama-w768 W2 full_shard fp32 tied", 2, "--model llama-w768"),
    ("llama-w768 W2 full_shard fp32 tied, 2 x 128", 2, "--model llama-w768 --seq-len 128 --batch-size 2"),
    ("llama-w768 W2 full_shard bf16 tied +AC", 2, "--model llama-w768 --precision bf16 --activation-checkpoint"),
    # Mixture-of-Experts: Qwen3-MoE's routed experts, Llama 4's with a shared one.
    ("qwen3-moe-tiny W1 fp32", 1, "--model qwen3-moe-tiny --seq-len 128 --batch-size 16"),
    ("qwen3-moe-tiny W2 full_shard bf16", 2, "--model qwen3-moe-tiny --seq-len 128 --batch-size 16 --precision bf16"),
    ("llama4-tiny W1 fp32", 1, "--model llama4-tiny --seq-len 128 --batch-size 16"),
    ("llama4-tiny W2 full_shard fp32 +AC", 2,
     "--model llama4-tiny --seq-len 128 --batch-size 16 --activation-checkpoint"),
]

MIB = 1 << 20


def predict(world, flags):
    out = subprocess.run([FSDP, "plan", "--json", "--world-size", str(world), *shlex.split(DATA), *shlex.split(flags)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def measure(world, flags, steps, folder):
    train = [FSDP, "train", *shlex.split(DATA), *shlex.split(flags), "--steps", str(steps), "--log-every", "1",
             "--out-dir", folder, "--tensorboard=false"]
    command = train if world == 1 else [FSDP, "launch", "-n", str(world), "--", *train]
    env = dict(os.environ)
    if world == 1:
        env["OMP_NUM_THREADS"] = "2"
    subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if '"allocated_peak_mb"' in line]
    return lines[-1]


def step_start(trace, step):
    """The time of step `step`'s first event (1-based): steps begin with "data" after an "optimizer"."""
    starts = [trace[0]["time_us"]] if trace else [0]
    for prev, e in zip(trace, trace[1:]):
        if prev["frames"][0]["name"] == "optimizer" and e["frames"][0]["name"] == "data":
            starts.append(e["time_us"])
    return starts[step - 1] if len(starts) >= step else starts[-1]


def phase_maxima(snapshot_path, step_start_us):
    """{plan moment: most bytes held during its phases} from a recording, after step_start_us."""
    with open(snapshot_path, "rb") as f:
        snapshot = pickle.load(f)
    trace = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live = sum(seg["total_size"] for seg in snapshot["segments"])
    live -= sum(e["size"] if e["action"] == "alloc" else -e["size"] for e in trace)
    maxima = {}
    blocks_done = False  # block 0's post-backward seen: what backward runs next is the root's (the embedding's)
    for e in trace:
        live += e["size"] if e["action"] == "alloc" else -e["size"]
        if e["time_us"] < step_start_us:
            continue
        phase = e["frames"][0]["name"]
        index = re.search(r"\.(\d+)$", phase)
        if phase.startswith("post-backward ") and index and index.group(1) == "0":
            blocks_done = True
        elif phase in ("optimizer", "data"):
            blocks_done = False
        if phase.startswith("forward ") and index:
            moment = f"forward block {index.group(1)}"
        elif phase.split(" ")[0] in ("backward", "recompute") and index:
            moment = f"backward block {index.group(1)}"
        elif phase.startswith("post-backward ") and index:
            moment = f"post-backward block {index.group(1)}"
        elif phase == "post-backward <root>" or (phase == "backward" and blocks_done):
            moment = "backward root"
        elif phase == "backward":
            moment = "loss backward"
        elif phase in ("loss", "optimizer"):
            moment = phase
        else:
            continue
        maxima[moment] = max(maxima.get(moment, 0), live)
    return maxima


def moments(name, world, flags, folder):
    plan = predict(world, flags)
    train = [FSDP, "train", *shlex.split(DATA), *shlex.split(flags), "--steps", "3", "--memory-snapshot", "3",
             "--out-dir", folder, "--tensorboard=false"]
    command = train if world == 1 else [FSDP, "launch", "-n", str(world), "--", *train]
    subprocess.run(command, check=True, capture_output=True, text=True)
    # Step 3: its first event is the first "data" one after step 2's optimizer.
    with open(os.path.join(folder, "memory", "rank0.pickle"), "rb") as f:
        step3 = step_start(pickle.load(f)["device_traces"][0], 3)
    measured = phase_maxima(os.path.join(folder, "memory", "rank0.pickle"), step3)
    rows = []
    for m in plan["timeline"]:
        if m["phase"] in measured:
            got = measured[m["phase"]]
            rows.append((m["phase"], m["bytes"] / MIB, got / MIB, m["bytes"] / got - 1))
    lines = ["", f"Moments of {name} (step 3 of a recording; predicted against the most held in the matching phases):",
             "", "| moment | predicted MiB | measured MiB | error |", "| --- | --- | --- | --- |"]
    lines += [f"| {p} | {a:.1f} | {b:.1f} | {e:+.1%} |" for p, a, b, e in rows]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the configurations whose name contains this")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--moments", help="also compare every moment of this configuration's timeline")
    args = parser.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, world, flags in GRID:
            if args.only and args.only not in name:
                continue
            plan = predict(world, flags)
            got = measure(world, flags, args.steps, os.path.join(tmp, str(len(rows))))
            row = {
                "name": name,
                "world": world,
                "flags": flags,
                "predicted_tensor_mib": plan["tensor_peak_bytes"] / MIB,
                "measured_tensor_mib": got["allocated_peak_mb"],
                "predicted_phase": plan["peak_phase"],
                "overhead_mib": plan["overhead_bytes"] / MIB,
                "predicted_total_mib": plan["tensors_plus_overhead_bytes"] / MIB,
                "peak_rss_mib": got["peak_rss_mb"],
            }
            row["tensor_error"] = row["predicted_tensor_mib"] / row["measured_tensor_mib"] - 1
            row["rss_error"] = row["predicted_total_mib"] / row["peak_rss_mib"] - 1
            rows.append(row)
            print(f"{name}: tensors predicted {row['predicted_tensor_mib']:.1f} MiB, measured "
                  f"{row['measured_tensor_mib']:.1f} ({row['tensor_error']:+.1%}); total predicted "
                  f"{row['predicted_total_mib']:.1f}, peak RSS {row['peak_rss_mib']:.1f} ({row['rss_error']:+.1%})",
                  flush=True)
    out_dir = os.path.join(ROOT, "out", "bench")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "memory_validation.json"), "w") as f:
        json.dump({"cpu": model_name, "rows": rows}, f, indent=2)
    lines = [f"CPU: {model_name}. Tokens: 4 x 256 per rank per micro-step. Rank 0.", "",
             "| configuration | tensors predicted MiB | tensors measured MiB | error | predicted peak at | "
             "tensors + overhead MiB | peak RSS MiB | difference |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['predicted_tensor_mib']:.1f} | {r['measured_tensor_mib']:.1f} | "
                     f"{r['tensor_error']:+.1%} | {r['predicted_phase']} | {r['predicted_total_mib']:.1f} | "
                     f"{r['peak_rss_mib']:.1f} | {r['rss_error']:+.1%} |")
    worst = max(abs(r["tensor_error"]) for r in rows) if rows else 0
    lines += ["", f"Largest tensor error: {worst:.1%}."]
    if args.moments:
        chosen = [g for g in GRID if g[0] == args.moments]
        if not chosen:
            print(f"error: --moments '{args.moments}' is not a configuration of the grid", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            lines += moments(*chosen[0], tmp)
    with open(os.path.join(out_dir, "memory_validation.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
