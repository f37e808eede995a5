#!/usr/bin/env python3
"""Greedy generation speed: `fsdp generate` against transformers' `generate`
(with its key/value cache, as users run it) on the same exported model,
CPU and threads.

Each side's rate is per new token, without start-up: (N - 1) / (time for N
new tokens - time for 1), medians of --reps runs, the sides interleaved.
The model is a preset trained one step and exported (`fsdp train
--export-hf`) unless --model-dir names one.

  python3 bench/generate_vs_transformers.py [--preset gpt2-d6] [--new-tokens 128] [--reps 3]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

import torch
import transformers

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fsdp_seconds(fsdp, model_dir, prompt, new_tokens, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.perf_counter()
    subprocess.run([fsdp, "generate", "--from", model_dir, "--prompt", prompt, "--temperature", "0", "--ignore-eos",
                    "--max-new-tokens", str(new_tokens)], check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def transformers_seconds(model, ids, new_tokens):
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, use_cache=True)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(SOURCE_DIR, "build"))
    p.add_argument("--preset", default="gpt2-d6")
    p.add_argument("--model-dir", help="an exported model directory (default: the preset, trained one step)")
    p.add_argument("--prompt", default="Fellow citizens,")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    fsdp = os.path.join(a.build_dir, "fsdp")
    work = tempfile.TemporaryDirectory(prefix="fsdp-generate-bench-")
    model_dir = a.model_dir
    if not model_dir:
        model_dir = os.path.join(work.name, "hf")
        subprocess.run([fsdp, "train", "--model", a.preset, "--data", "synthetic", "--steps", "1", "--seq-len", "16",
                        "--batch-size", "1", "--out-dir", os.path.join(work.name, "run"), "--tensorboard=false",
                        "--export-hf", model_dir], check=True, capture_output=True)
    torch.set_num_threads(a.threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(a.prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    transformers_seconds(model, ids, 4)  # warm-up
    ours, theirs = [], []
    for _ in range(a.reps):
        ours.append((a.new_tokens - 1) / (fsdp_seconds(fsdp, model_dir, a.prompt, a.new_tokens, a.threads) -
                                          fsdp_seconds(fsdp, model_dir, a.prompt, 1, a.threads)))
        theirs.append((a.new_tokens - 1) / (transformers_seconds(model, ids, a.new_tokens) -
                                            transformers_seconds(model, ids, 1)))
    ours_rate, theirs_rate = statistics.median(ours), statistics.median(theirs)
    print(f"{a.preset if not a.model_dir else model_dir}: {a.new_tokens} new tokens after a {ids.shape[1]}-token "
          f"prompt, {a.threads} threads, median of {a.reps}")
    print(f"  fsdp generate (cache):        {ours_rate:8.1f} tokens/s  {[round(x, 1) for x in ours]}")
    print(f"  transformers generate (cache): {theirs_rate:8.1f} tokens/s  {[round(x, 1) for x in theirs]}")
    print(f"  ratio: {ours_rate / theirs_rate:.2f}x")


if __name__ == "__main__":
    main()
