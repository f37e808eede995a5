#!/usr/bin/env python3
"""Packing against one example a row, on the same chat data, side by side.

The model is a small Qwen3 that `transformers` writes (tests/reference/
hf_models.py's shape, the real Qwen3 tokenizer and chat template from
data/qwen3); the data, N conversations of one to four turns drawn with a
fixed seed from a few questions and answers, prepared once. Each mode
trains one epoch (`--epochs 1`) at the same batch size and sequence
length: one example a row (padded), or `--pack` (consecutive examples
share a row while they fit). Read from metrics.jsonl: the steps an epoch
takes, their summed time, and the trained tokens per second (the tokens
the loss covers, the same in both). Put `lscpu`'s model name beside the
figures.

    .venv/bin/python bench/packing.py [--examples 400] [--seq-len 512] [--batch-size 4] [--reps 1]

Writes out/bench/packing.{json,md}.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))

import hf_models  # noqa: E402
import sft_test  # noqa: E402  (its questions and answers)
import torch  # noqa: E402
import transformers  # noqa: E402
from machine import cpu_model  # noqa: E402


def conversations(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "You answer in one line."}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 4)):
            k = rng.randrange(len(sft_test.QUESTIONS))
            messages += [{"role": "user", "content": sft_test.QUESTIONS[k]},
                         {"role": "assistant", "content": sft_test.ANSWERS[k]}]
        out.append({"messages": messages})
    return out


def train(args, model, tokens, out, pack):
    shutil.rmtree(out, ignore_errors=True)
    command = [args.fsdp, "train", "--init-from", model, "--data", tokens, "--out-dir", out, "--epochs", "1",
               "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--log-every", "1",
               "--tensorboard=false", "--warmup-steps", "0"] + (["--pack"] if pack else [])
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [s for s in steps if "loss" in s and "event" not in s and s.get("split", "train") == "train"]
    return {"steps": len(steps), "seconds": sum(s["step_time_s"] for s in steps)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dir", default=os.path.join(ROOT, "out", "bench", "packing"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    model = os.path.join(args.dir, "qwen3")
    config = hf_models.config("qwen3")
    config.vocab_size = 151936
    config.max_position_embeddings = max(config.max_position_embeddings, args.seq_len)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ROOT, "data", "qwen3", name), model)
    data = os.path.join(args.dir, "chat.jsonl")
    with open(data, "w") as f:
        for record in conversations(args.examples, seed=0):
            f.write(json.dumps(record) + "\n")
    tokens = os.path.join(args.dir, "tokens")
    subprocess.run([args.fsdp, "data", "prepare", "--input", data, "--tokenizer", model, "--out-dir", tokens,
                    "--val-fraction", "0"], check=True, stdout=subprocess.DEVNULL)
    trained = 0
    import numpy as np
    mask = np.fromfile(os.path.join(tokens, "train.mask"), dtype=np.uint8, offset=1024)
    trained = int((mask & 1).sum())
    runs = {"padded": [], "packed": []}
    for _ in range(args.reps):
        for name in runs:
            runs[name].append(train(args, model, os.path.join(tokens, "train.bin"), os.path.join(args.dir, name),
                                    name == "packed"))
    summary = {name: {"steps": r[0]["steps"], "seconds": statistics.median(x["seconds"] for x in r)}
               for name, r in runs.items()}
    for s in summary.values():
        s["trained_tokens_per_s"] = trained / s["seconds"]
    report = {"cpu": cpu_model(), "settings": vars(args), "trained_tokens": trained, "runs": runs, "median": summary}
    with open(args.dir + ".json", "w") as f:
        json.dump(report, f, indent=2)
    p, q = summary["padded"], summary["packed"]
    text = (f"{args.examples} conversations ({trained} trained tokens), one epoch, batch {args.batch_size} x "
            f"{args.seq_len}, the tiny Qwen3; {report['cpu']}\n\n"
            "| | one example a row | packed | packed / padded |\n|---|---|---|---|\n"
            f"| steps in the epoch | {p['steps']} | {q['steps']} | {q['steps'] / p['steps']:.3f} |\n"
            f"| time of the epoch's steps (s) | {p['seconds']:.3g} | {q['seconds']:.3g} | {q['seconds'] / p['seconds']:.3f} |\n"
            f"| trained tokens per second | {p['trained_tokens_per_s']:.4g} | {q['trained_tokens_per_s']:.4g} | "
            f"{q['trained_tokens_per_s'] / p['trained_tokens_per_s']:.2f} |\n")
    with open(args.dir + ".md", "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
