#!/usr/bin/env python3
"""Side-by-side benchmark: fsdp.cpp against PyTorch in Python, same machine,
same GPT-2 (6 layers, 384 wide, 6 heads, vocab 50257), same batch (4 x 256
tokens per rank), same threads, same AdamW. Runs interleave (ours, theirs,
ours, theirs, ...) so machine drift cancels; each run's first two steps are
warm-up. Writes out/bench/results.json and out/bench/results.md.

    python3 bench/run_benchmarks.py [--reps 3] [--steps 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")
PEER = os.path.join(ROOT, "bench", "pytorch_gpt2.py")
MODEL = "--model gpt2-d6 --data synthetic --seq-len 256 --batch-size 4 --log-every 1 --grad-clip 1.0"


def ours(world, steps, metrics, extra=""):
    # The run folder sits beside the metrics file; each run replaces the last.
    run_dir = os.path.splitext(metrics)[0] + "-run"
    train = f"{FSDP} train {MODEL} --steps {steps} --metrics {metrics} --out-dir {run_dir} {extra}"
    if world == 1:
        return f"OMP_NUM_THREADS=2 {train}"
    return f"{FSDP} launch -n {world} -- {train}"  # the launcher gives each rank 2/world threads


# PyTorch at its best on this machine, as a careful user would run it:
# denormals flushed, glibc keeping freed memory (fsdp.cpp keeps large blocks
# in its own cache instead), and the multi-tensor AdamW (foreach=True; 1.13
# has no fused AdamW for CPU). "default" is the same script as it runs out
# of the box, reported beside.
PEER_BEST_ENV = "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296"


def theirs(world, steps, metrics, best=True, extra=""):
    peer = f"/usr/bin/python3 {PEER} --steps {steps} --metrics {metrics} {extra}"
    if best:
        peer = f"env {PEER_BEST_ENV} {peer} --flush-denormal --foreach"
    if world == 1:
        return f"OMP_NUM_THREADS=2 {peer}"
    return f"{FSDP} launch -n {world} -- {peer} --ddp"


CASES = [
    ("W=1, 2 threads, fp32", "fsdp.cpp (FSDP full_shard)", lambda s, m: ours(1, s, m),
     "PyTorch eager at its best", lambda s, m: theirs(1, s, m)),
    ("W=2, 1 thread each, fp32", "fsdp.cpp FULL_SHARD", lambda s, m: ours(2, s, m),
     "PyTorch DDP (Gloo) at its best", lambda s, m: theirs(2, s, m)),
    ("W=1, 2 threads, bf16", "fsdp.cpp --precision bf16", lambda s, m: ours(1, s, m, "--precision bf16"),
     "PyTorch eager, autocast bf16, at its best", lambda s, m: theirs(1, s, m, extra="--bf16")),
    ("W=1, 2 threads, fp32", "fsdp.cpp (FSDP full_shard)", lambda s, m: ours(1, s, m),
     "PyTorch eager, default settings", lambda s, m: theirs(1, s, m, best=False)),
]


def tokens_per_s(command, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
    timed = [l["tokens_per_s"] for l in lines[2:]]  # the first two steps warm up
    return statistics.median(timed)


# This project's strategies on the same model: (label, world, extra flags),
# each with activation checkpointing and bf16 compute off and on.
STRATEGIES = [
    ("W1 full_shard", 1, "--sharding full_shard"),
    ("W1 no_shard", 1, "--sharding no_shard"),
    ("W2 no_shard", 2, "--sharding no_shard"),
    ("W2 full_shard", 2, "--sharding full_shard"),
    ("W2 shard_grad_op", 2, "--sharding shard_grad_op"),
    ("W2 hybrid 2x1", 2, "--sharding hybrid_shard --fsdp-size 1"),
]
VARIANTS = [("", ""), (" +AC", " --activation-checkpoint"), (" bf16", " --precision bf16")]
SWEEP = [(label + vlabel, world, flags + vflags) for label, world, flags in STRATEGIES for vlabel, vflags in VARIANTS]


def sweep(steps, reps, tmp):
    # Round-robin over the configurations, `reps` times, so drift spreads evenly.
    samples = {label: [] for label, _, _ in SWEEP}
    for _ in range(reps):
        for label, world, extra in SWEEP:
            metrics = os.path.join(tmp, "sweep.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            subprocess.run(ours(world, steps, metrics, extra), shell=True, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            samples[label].append([json.loads(l) for l in open(metrics) if '"step_time_s"' in l][2:])
    rows = []
    for label, _, _ in SWEEP:
        runs = samples[label]
        med = lambda key: statistics.median(statistics.median(l[key] for l in run) for run in runs)
        tps = [statistics.median(l["tokens_per_s"] for l in run) for run in runs]
        rows.append({"config": label, "tokens_per_s": statistics.median(tps), "tokens_per_s_min": min(tps),
                     "tokens_per_s_max": max(tps), "step_time_s": med("step_time_s"), "data_s": med("data_s"),
                     "forward_backward_s": med("forward_backward_s"), "optimizer_s": med("optimizer_s"),
                     "comm_wait_s": med("comm_wait_s"), "state_mb_per_rank": runs[-1][-1]["sharded_state_mb"],
                     "peak_rss_mb": max(run[-1]["peak_rss_mb"] for run in runs)})
        print(json.dumps(rows[-1]))
    return rows


def main():
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode != 0:
        raise SystemExit("run_benchmarks: the PyTorch peer needs Debian's python3-torch: sudo apt-get install python3-torch")
    if not os.path.exists(FSDP):
        raise SystemExit("run_benchmarks: build/fsdp is missing: run scripts/build.sh first")
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    out_dir = os.path.join(ROOT, "out", "bench")
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp()
    results = []
    for name, a_name, a_cmd, b_name, b_cmd in CASES:
        a_runs, b_runs = [], []
        for rep in range(a.reps):
            # Alternate which side goes first as well.
            order = [(a_runs, a_cmd), (b_runs, b_cmd)] if rep % 2 == 0 else [(b_runs, b_cmd), (a_runs, a_cmd)]
            for runs, cmd in order:
                metrics = os.path.join(tmp, "m.jsonl")
                runs.append(tokens_per_s(cmd(a.steps, metrics), metrics))
        results.append({"case": name, "ours": a_name, "theirs": b_name,
                        "ours_tokens_per_s": {"median": statistics.median(a_runs), "min": min(a_runs), "max": max(a_runs)},
                        "theirs_tokens_per_s": {"median": statistics.median(b_runs), "min": min(b_runs), "max": max(b_runs)},
                        "ratio": statistics.median(a_runs) / statistics.median(b_runs)})
        print(json.dumps(results[-1]))
    rows = sweep(a.steps, a.reps, tmp)
    comm = subprocess.run(f"{FSDP} launch -n 2 -- {FSDP} bench comm -b 4096 -e 16777216 -f 16",
                          shell=True, check=True, capture_output=True, text=True).stdout
    json.dump({"peers": results, "strategies": rows}, open(os.path.join(out_dir, "results.json"), "w"), indent=1)
    import charts
    plain = [r for r in rows if "+" not in r["config"] and "bf16" not in r["config"]]
    charts.bars(os.path.join(out_dir, "memory_by_strategy.svg"), [(r["config"], r["state_mb_per_rank"]) for r in plain],
                "MB per rank", "Parameters + gradients + AdamW state per rank")
    charts.bars(os.path.join(out_dir, "throughput_by_strategy.svg"), [(r["config"], r["tokens_per_s"]) for r in plain],
                "tokens/s", "Throughput by strategy",
                spread=[(r["tokens_per_s_min"], r["tokens_per_s_max"]) for r in plain])
    with open(os.path.join(out_dir, "results.md"), "w") as md:
        md.write("| case | fsdp.cpp tokens/s (median, min-max) | PyTorch tokens/s (median, min-max) | ratio |\n")
        md.write("| --- | --- | --- | --- |\n")
        for r in results:
            o, t = r["ours_tokens_per_s"], r["theirs_tokens_per_s"]
            md.write(f"| {r['case']}: {r['ours']} vs {r['theirs']} | {o['median']:.0f} ({o['min']:.0f}-{o['max']:.0f}) "
                     f"| {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | {r['ratio']:.2f}x |\n")
        md.write("\n| fsdp.cpp config | tokens/s (median, min-max) | step s | data s | fwd+bwd s | optimizer s | exposed comm s "
                 "| params+grads+optimizer MB/rank | peak RSS MB |\n")
        md.write("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            md.write(f"| {r['config']} | {r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}) "
                     f"| {r['step_time_s']:.2f} | {r['data_s']:.4f} "
                     f"| {r['forward_backward_s']:.2f} | {r['optimizer_s']:.2f} | {r['comm_wait_s']:.3f} "
                     f"| {r['state_mb_per_rank']:.0f} | {r['peak_rss_mb']:.0f} |\n")
        md.write("\n```\n" + "\n".join(l.replace("[rank 0] ", "", 1) for l in comm.splitlines() if l.strip() != "[rank 0] #")
                 + "\n```\n")
    print(open(os.path.join(out_dir, "results.md")).read())


if __name__ == "__main__":
    main()
