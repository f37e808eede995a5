#!/usr/bin/env python3
"""How a step's cost grows: fsdp.cpp against PyTorch eager (its
`scaled_dot_product_attention`, the CPU flash kernel) along four axes, each
point run on both sides, interleaved, in the same run:

  seq     sequence length 256 to 4096, one sequence a step (GPT-2 d6's
          shape: 6 blocks, width 384, 6 heads; 4096 positions)
  depth   3 to 24 blocks at width 384, 4 x 256 tokens
  width   192 to 768 wide (heads of 64), 6 blocks, 4 x 256 tokens
  world   W = 1 against W = 2 at the same global batch (4 x 256): FULL_SHARD
          against FSDP2 eager, 2 sequences per rank

Step time is each run's median after its warm-up steps, then the median over
repetitions; peak RSS per rank beside it (each process's own, interpreter
and libraries included). fsdp.cpp trains a Hugging Face directory of the
shape (made once with `transformers`, dropout off), PyTorch the same shape
in `bench/pytorch_peer.py`. Both: fused AdamW, clipping at 1.0, denormals
flushed, 2 threads per machine. Writes out/bench/curves.{json,md} and one
SVG per curve.

    scripts/setup.sh && scripts/build.sh     # once
    python3 bench/cost_curves.py [--curves seq,depth,width,world] [--reps 2] [--precision fp32|bf16]
    python3 bench/cost_curves.py --replot out/bench/curves.json --out DIR   # charts only
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_benchmarks import FSDP, PEER, ROOT, VENV_PYTHON, cpu_model, peer_env, run  # noqa: E402

BASE = {"layers": 6, "width": 384, "heads": 6}


def points(curve):
    """(label, shape overrides, seq len, batch per rank, world) for each point."""
    if curve == "seq":
        return [(T, {}, T, 1, 1) for T in (256, 512, 1024, 2048, 4096)]
    if curve == "depth":
        return [(L, {"layers": L}, 256, 4, 1) for L in (3, 6, 12, 24)]
    if curve == "width":
        return [(C, {"width": C, "heads": C // 64}, 256, 4, 1) for C in (192, 384, 768)]
    if curve == "world":
        return [(W, {}, 256, 4 // W, W) for W in (1, 2)]
    raise SystemExit(f"cost_curves: unknown curve '{curve}': expected seq, depth, width or world")


def hf_directory(shape, positions, cache):
    """A GPT-2 directory of this shape with random weights (transformers'
    own initialisation), made once per shape."""
    key = f"gpt2-l{shape['layers']}-c{shape['width']}-h{shape['heads']}-p{positions}"
    path = os.path.join(cache, key)
    if not os.path.exists(os.path.join(path, "config.json")):
        script = (
            "import sys, transformers\n"
            "l, c, h, p, out = map(str, sys.argv[1:])\n"
            "cfg = transformers.GPT2Config(n_layer=int(l), n_embd=int(c), n_head=int(h), n_positions=int(p),\n"
            "    vocab_size=50257, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)\n"
            "transformers.GPT2LMHeadModel(cfg).save_pretrained(out)\n")
        subprocess.run([VENV_PYTHON, "-c", script, str(shape["layers"]), str(shape["width"]), str(shape["heads"]),
                        str(positions), path], check=True, stdout=subprocess.DEVNULL)
    return path


def commands(shape, model_dir, seq, batch, world, steps, bf16, metrics):
    threads = f"OMP_NUM_THREADS={2 // world}"
    ours = (f"{FSDP} train --init-from {model_dir} --data synthetic --seq-len {seq} --batch-size {batch} "
            f"--steps {steps} --log-every 1 --grad-clip 1.0 --tensorboard=false --metrics {metrics} "
            f"--out-dir {os.path.splitext(metrics)[0]}-run" + (" --precision bf16" if bf16 else "")
            + (" --sharding full_shard" if world > 1 else ""))
    peer = (f"env {peer_env()} {VENV_PYTHON} {PEER} --model gpt2-d6 --layers {shape['layers']} "
            f"--width {shape['width']} --heads {shape['heads']} --seq-len {seq} --batch-size {batch} "
            f"--steps {steps} --metrics {metrics} --flush-denormal --adamw fused" + (" --bf16" if bf16 else "")
            + (" --fsdp2" if world > 1 else ""))
    wrap = (lambda c: f"{FSDP} launch -n {world} -- {c}") if world > 1 else (lambda c: f"{threads} {c}")
    return {"fsdp.cpp": wrap(ours), "PyTorch": wrap(peer)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--curves", default="seq,depth,width,world")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "bench"))
    p.add_argument("--replot", metavar="CURVES_JSON", help="draw the charts of an earlier run's curves.json, run nothing")
    a = p.parse_args()
    if a.replot:
        with open(a.replot) as f:
            earlier = json.load(f)
        os.makedirs(a.out, exist_ok=True)
        for curve, rows in earlier["curves"].items():
            chart(curve, rows, earlier["precision"], a.out)
        return
    if not os.path.exists(FSDP):
        p.error(f"{FSDP} not found: run scripts/build.sh first")
    os.makedirs(a.out, exist_ok=True)
    cache = os.path.join(ROOT, "out", "bench", "curve-models")
    results = {"cpu": cpu_model(), "precision": a.precision, "curves": {}}
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        for curve in a.curves.split(","):
            rows = []
            for label, overrides, seq, batch, world in points(curve):
                shape = dict(BASE, **overrides)
                model_dir = hf_directory(shape, 4096 if curve == "seq" else 1024, cache)
                sides = commands(shape, model_dir, seq, batch, world, a.steps, a.precision == "bf16", metrics)
                samples = {side: [] for side in sides}
                for rep in range(a.reps):
                    order = list(sides) if rep % 2 == 0 else list(reversed(sides))
                    for side in order:
                        samples[side].append(run(sides[side], metrics, a.warmup))
                row = {"point": label, "seq": seq, "batch": batch, "world": world, **shape}
                for side, got in samples.items():
                    row[side] = {"step_s": statistics.median(g["step_s"] for g in got),
                                 "peak_rss_mb": max(g["peak_rss_mb"] for g in got), "runs": [g["step_s"] for g in got]}
                row["ratio"] = row["PyTorch"]["step_s"] / row["fsdp.cpp"]["step_s"]
                rows.append(row)
                print(f"{curve} {label}: fsdp.cpp {row['fsdp.cpp']['step_s']:.3f} s "
                      f"({row['fsdp.cpp']['peak_rss_mb']:.0f} MB), PyTorch {row['PyTorch']['step_s']:.3f} s "
                      f"({row['PyTorch']['peak_rss_mb']:.0f} MB): {row['ratio']:.2f}x", flush=True)
            results["curves"][curve] = rows
            chart(curve, rows, a.precision, a.out)
    with open(os.path.join(a.out, "curves.json"), "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(os.path.join(a.out, "curves.md"), "w") as f:
        f.write(table)
    print(table)


AXES = {"seq": "sequence length (1 sequence a step)", "depth": "blocks (width 384)",
        "width": "width (6 blocks, heads of 64)", "world": "ranks W (global batch 4 x 256)"}


def chart(curve, rows, precision, out):
    """Step time against the curve's axis; for the sequence, peak RSS too."""
    try:
        import charts
    except ImportError:
        print("cost_curves: no matplotlib (scripts/setup.sh installs python3-matplotlib); chart skipped")
        return
    sides = ("fsdp.cpp", "PyTorch")
    charts.lines(os.path.join(out, f"curve_{curve}.svg"),
                 {side: [(r["point"], r[side]["step_s"]) for r in rows] for side in sides}, AXES[curve],
                 "step time, s", f"step time against {curve}, {precision}")
    if curve == "seq":
        charts.lines(os.path.join(out, "curve_seq_memory.svg"),
                     {side: [(r["point"], r[side]["peak_rss_mb"]) for r in rows] for side in sides}, AXES[curve],
                     "peak RSS, MB", f"peak memory against sequence length, {precision}")


def markdown(results):
    out = [f"{results['cpu']}, {results['precision']}\n"]
    for curve, rows in results["curves"].items():
        out.append(f"\n{AXES[curve]}:\n\n| {curve} | fsdp.cpp s | PyTorch s | PyTorch / fsdp.cpp | "
                   "fsdp.cpp peak RSS MB | PyTorch peak RSS MB |\n| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            out.append(f"| {r['point']} | {r['fsdp.cpp']['step_s']:.3f} | {r['PyTorch']['step_s']:.3f} | "
                       f"{r['ratio']:.2f}x | {r['fsdp.cpp']['peak_rss_mb']:.0f} | {r['PyTorch']['peak_rss_mb']:.0f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
