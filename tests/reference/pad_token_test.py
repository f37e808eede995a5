"""pad_token_id as transformers takes it: every decoder family builds its
embedding with padding_idx=config.pad_token_id (GPT-2 does not), so a fresh
model's pad row is zero and the lookup never gives it a gradient. A model
written by transformers with a pad id, trained a few steps by `fsdp train`
and by transformers' own model code (fsdp2_train.py, W = 1) on a token file
where the pad id separates every document (as `fsdp data prepare` puts
Qwen's <|endoftext|> between documents): every step's loss and gradient
norm within 1e-5 relative; the export loads in transformers with the same
pad id and padding row.

Before fsdp.cpp honoured the id, the zero row trained: a zero vector
through the first RMSNorm has a gradient near 1/sqrt(eps), so the first
step's gradient norm was thousands of times transformers' and clipping
shrank every other gradient with it.

  pad_token_test.py [--families ...]
"""
import json
import os

import numpy as np
import torch
import transformers

import fsdp2_alignment_test as alignment
import harness
import hf_models
import token_files

BOUND = 1e-5
STEPS = 4
PAD = 7


def stream_with_pad(count):
    """The learnable stream cut into documents of 11 to 40 tokens, the pad
    id between each two."""
    tokens = token_files.learnable_stream(count, hf_models.VOCAB)
    rng = np.random.default_rng(1)
    out, i = [], 0
    while len(out) < count:
        length = int(rng.integers(11, 41))
        out.extend(int(t) for t in tokens[i:i + length] if t != PAD)
        out.append(PAD)
        i += length
    return np.array(out[:count])


def metrics(path):
    lines = [json.loads(line) for line in open(path)]
    rows = [x for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x]
    return np.array([x["loss"] for x in rows]), np.array([x["grad_norm"] for x in rows])


def expect_padding(family):
    """transformers' GPT-2 builds its embedding without a padding row."""
    return family != "gpt2"


def main():
    def extra(parser):
        parser.add_argument("--families", nargs="+", default=list(hf_models.FAMILIES))

    args = harness.parse_args(__doc__, extra)
    args.world, args.hsdp, args.grad_accum, args.precision, args.device = 1, 0, 1, "fp32", "cpu"
    args.reshard_after_forward, args.shard_placement = 0, ""
    alignment.SETTINGS = dict(alignment.SETTINGS, steps=STEPS)
    work = harness.work_dir(args)
    tokens = os.path.join(work, "tokens.bin")
    stream = stream_with_pad(8192)
    token_files.write(tokens, stream)
    print(f"token file: {len(stream)} tokens, {int((stream == PAD).sum())} of them the pad id {PAD}")
    for family in args.families:
        directory = os.path.join(work, family)
        config = hf_models.config(family)
        config.pad_token_id = PAD
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(directory)
        embedding = model.get_input_embeddings()
        if (embedding.padding_idx == PAD) != expect_padding(family):
            harness.fail(f"{family}: transformers' embedding has padding_idx {embedding.padding_idx}; this test "
                         f"expects {'the pad id' if expect_padding(family) else 'none'}")
        alignment.run_fsdp(args, directory, tokens, os.path.join(work, family + "-fsdp"))
    # transformers' side, every family in one torchrun.
    runs = [(os.path.join(work, family), tokens, os.path.join(work, family + "-hf"), "fp32")
            for family in args.families]
    theirs = alignment.run_fsdp2(args, runs, work)
    for family, (their_loss, _, _) in zip(args.families, theirs):
        ours_dir = os.path.join(work, family + "-fsdp")
        our_loss, our_norm = metrics(os.path.join(ours_dir, "metrics.jsonl"))
        records = [json.loads(line) for line in open(os.path.join(work, family + "-hf", "losses.jsonl"))]
        their_norm = np.array([r["grad_norm"] for r in records])
        if len(our_loss) != STEPS or len(their_loss) != STEPS:
            harness.fail(f"{family}: expected {STEPS} steps, got {len(our_loss)} (fsdp) and {len(their_loss)}")
        print(f"{family}: step 1 loss {their_loss[0]:.4f}, gradient norm {their_norm[0]:.3f} (transformers), "
              f"{our_norm[0]:.3f} (fsdp.cpp)")
        # The export keeps the id, and transformers builds the same padding row from it.
        exported = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(ours_dir, "hf"))
        padding_idx = exported.get_input_embeddings().padding_idx
        if exported.config.pad_token_id != PAD or (padding_idx == PAD) != expect_padding(family):
            harness.fail(f"{family}: the export loads with pad_token_id {exported.config.pad_token_id} and "
                         f"padding_idx {padding_idx} (expected {PAD})")
        harness.check(f"{family}: loss, relative", float(alignment.relative(our_loss, their_loss).max()), BOUND)
        harness.check(f"{family}: gradient norm, relative", float(alignment.relative(our_norm, their_norm).max()),
                      BOUND)

if __name__ == "__main__":
    main()
