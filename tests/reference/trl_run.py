"""What the TRL runners (trl_sft.py, trl_dpo.py) share: the model as a
careful user loads it for an exact comparison (fp32; with an adapter, the
base with that PEFT LoRA adapter, trainable), its tokenizer, and the
`--jobs` loop that runs several trainings in one start of Python, TRL and
the process group."""
import os
import sys

import torch
import transformers

import harness


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
