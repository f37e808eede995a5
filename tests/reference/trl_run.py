"""What the TRL runners (trl_sft.py, trl_dpo.py) share: the model as a
careful user loads it for an exact comparison (fp32; with an adapter, the
base with that PEFT LoRA adapter, trainable), its tokenizer, and the
`--jobs` loop that runs several trainings in one start of Python, TRL and
the process group."""
import argparse
import os
import sys

import torch
import transformers

import harness


def parser(description):
    """The arguments every runner takes; each adds its own."""
    p = argparse.ArgumentParser(description=description)
    for name in ("--model", "--data", "--out", "--work"):
        p.add_argument(name, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--adapter", help="a PEFT LoRA adapter directory to train on the base")
    return p


def exact_settings(args):
    """The trainer arguments of an exact comparison: one example per rank
    and micro-step in file order, fp32 on the CPU, AdamW at a constant
    rate, clipping at 1, a log line per step, nothing saved."""
    return dict(output_dir=args.work, per_device_train_batch_size=1, gradient_accumulation_steps=args.grad_accum,
                max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
                weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                logging_steps=1, report_to=[], save_strategy="no", train_sampling_strategy="sequential", use_cpu=True,
                seed=0, max_length=None, bf16=False, fp16=False, dataset_num_proc=None, disable_tqdm=True,
                dataloader_num_workers=0)


def model_and_tokenizer(model_dir, adapter=None):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
    return model, transformers.AutoTokenizer.from_pretrained(model_dir)


def is_rank0():
    return int(os.environ.get("RANK", "0")) == 0


def main(train):
    for argv in harness.job_argvs(sys.argv[1:]):
        train(argv)
