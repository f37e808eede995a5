#!/usr/bin/env python3
"""One example a row against TRL's SFTTrainer, on the data and the model
bench/packing.py prepared (--dir: its folder), one epoch at the same batch
size and --seq-len/max_length, fp32 on the CPU, side by side. TRL runs as a
careful user would: its collator pads each batch to its longest example
(padding_free off, as for a model without packed attention on the CPU),
completion-only loss, AdamW, no evaluation or saving, torch's threads as
the machine has cores. fsdp.cpp runs `fsdp train` on the prepared tokens.
Reported: each side's time of the epoch's steps and trained tokens per
second (the tokens the loss covers, the same on both sides). Put `lscpu`'s
model name beside the figures.

    .venv/bin/python bench/padding_vs_trl.py --dir out/bench/padding-after [--reps 2]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from machine import cpu_model  # noqa: E402


def trl_epoch(model, data, batch, seq_len, work):
    import datasets
    import torch
    import transformers
    import trl
    torch.manual_seed(0)
    dataset = datasets.load_dataset("json", data_files=data, split="train")
    config = trl.SFTConfig(
        output_dir=work, per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_train_epochs=1,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1000, report_to=[],
        save_strategy="no", use_cpu=True, seed=0, max_length=seq_len, packing=False, bf16=False, fp16=False,
        disable_tqdm=True, dataloader_num_workers=0)
    trainer = trl.SFTTrainer(model=transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                             args=config, train_dataset=dataset,
                             processing_class=transformers.AutoTokenizer.from_pretrained(model))
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def fsdp_epoch(fsdp, model, tokens, batch, seq_len, out):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([fsdp, "train", "--init-from", model, "--data", tokens, "--out-dir", out, "--epochs", "1",
                    "--seq-len", str(seq_len), "--batch-size", str(batch), "--log-every", "1", "--lr", "1e-3",
                    "--lr-schedule", "constant", "--tensorboard=false", "--warmup-steps", "0", "--precision", "fp32",
                    "--sample-tokens", "0"], check=True, stdout=subprocess.DEVNULL)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return sum(s["step_time_s"] for s in steps if "loss" in s and "event" not in s and s.get("split", "train") == "train")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--fsdp", default=os.path.join(ROOT, "build", "fsdp"))
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    settings = json.load(open(args.dir + ".json"))["settings"]
    batch, seq_len = settings["batch_size"], settings["seq_len"]
    model, data = os.path.join(args.dir, "qwen3"), os.path.join(args.dir, "chat.jsonl")
    tokens = os.path.join(args.dir, "tokens", "train.bin")
    import numpy as np
    trained = int((np.fromfile(os.path.join(args.dir, "tokens", "train.mask"), dtype=np.uint8, offset=1024) & 1).sum())
    times = {"fsdp.cpp": [], "TRL": []}
    for _ in range(args.reps):  # alternated
        times["fsdp.cpp"].append(fsdp_epoch(args.fsdp, model, tokens, batch, seq_len, os.path.join(args.dir, "vs-trl")))
        times["TRL"].append(trl_epoch(model, data, batch, seq_len, os.path.join(args.dir, "trl-run")))
    text = (f"one epoch, one example a row, batch {batch} x {seq_len}, {trained} trained tokens, the tiny Qwen3; "
            f"{cpu_model()}\n\n| | epoch's steps (s) | trained tokens/s |\n|---|---|---|\n")
    for name, t in times.items():
        median = statistics.median(t)
        text += f"| {name} | {median:.3g} | {trained / median:.4g} |\n"
    with open(os.path.join(args.dir, "vs-trl.md"), "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
