"""LoRA fine-tuning against PEFT under TRL's SFTTrainer (trl_sft.py --adapter).

A tiny Qwen3 (sft_test's: hf_models' shape, the real Qwen3 tokenizer and
chat template) and an adapter PEFT makes on it (rank 4, alpha 8, every
attention and MLP projection, its B drawn non-zero so that both factors
train from step 1), saved with save_pretrained. Then, on sft_test's
conversational pairs, batch 1 per rank, accumulation 2, fp32:
- `fsdp train --lora-rank 4 --lora-alpha 8 --lora-init-from ADAPTER` makes
  TRL's per-step losses within LOSS_BOUND at W = 1 and W = 2 (the base
  frozen, AdamW on the adapters only);
- the adapter it exports (--export-hf) is a PEFT adapter: PeftModel loads
  it onto the base, and its logits equal those of TRL's trained adapter;
- --merge-lora exports a plain model that transformers loads, with the
  logits of the base with the adapter on it;
- `fsdp generate --from BASE --adapter ADAPTER` continues a prompt as
  PEFT's greedy generate does with that adapter, and as the merged export;
  an adapter given as --from is refused, naming --adapter;
- a run stopped after 2 steps and resumed for 2 more makes the 4 steps'
  losses of one run, exactly; its checkpoint holds the adapters alone and
  the base's identity, a resume on other base weights is refused by name,
  and `fsdp ckpt export` of it writes the adapter the run exports (and
  with --merge-lora the merged model).
"""
import json
import os
import shutil
import subprocess

import numpy as np
import peft
import torch
import transformers

import harness
import sft_test

LOSS_BOUND = 1e-5
LOGITS_BOUND = 1e-4
RANK, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def initial_adapter(base_dir, out):
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                             task_type="CAUSAL_LM")
    torch.manual_seed(1)
    model = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.save_pretrained(out)


def train_fsdp(args, base, tokens, world, out, extra=()):
    harness.run([args.fsdp, "launch", "-n", str(world), "--", args.fsdp, "train", "--init-from", base,
                 "--data", tokens, "--out-dir", out, "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA),
                 *sft_test.SETTINGS, *extra])
    lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [x["loss"] for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x]


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    base = sft_test.tiny_qwen3(work, sft_test.qwen3_tokenizer_or_skip())
    start = os.path.join(work, "initial-adapter")
    initial_adapter(base, start)
    records = sft_test.conversational_pairs()
    data, tokens, _ = sft_test.prepared(args, records, work, "pairs", base)

    results = {}
    for world in (1, 2):
        case = os.path.join(work, f"w{world}")
        exported = os.path.join(case, "adapter")
        losses = np.array(train_fsdp(args, base, tokens, world, os.path.join(case, "fsdp-run"),
                                     ("--lora-init-from", start, "--export-hf", exported)))
        theirs_adapter = os.path.join(case, "trl-adapter")
        out = os.path.join(case, "trl.json")
        harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                     str(world), os.path.join(os.path.dirname(__file__), "trl_sft.py"), "--model", base, "--data", data,
                     "--out", out, "--work", os.path.join(case, "trl-run"), "--steps", str(sft_test.STEPS),
                     "--adapter", start, "--save-adapter", theirs_adapter])
        theirs = json.load(open(out))
        reference = np.array(theirs["losses"])
        if len(losses) != sft_test.STEPS or len(reference) != sft_test.STEPS:
            harness.fail(f"W={world}: expected {sft_test.STEPS} losses, got {len(losses)} (fsdp) and "
                         f"{len(reference)} (TRL)")
        print(f"LoRA W={world}: TRL+PEFT {np.round(reference, 6).tolist()}, fsdp {np.round(losses, 6).tolist()}")
        harness.check(f"LoRA W={world}: largest relative loss difference from TRL with PEFT",
                      float((np.abs(losses - reference) / np.abs(reference)).max()), LOSS_BOUND)
        results[world] = (exported, theirs_adapter, losses, theirs["tokenized"][0]["input_ids"])

    exported, theirs_adapter, losses, ids = results[2]
    with open(os.path.join(exported, "adapter_config.json")) as f:
        config = json.load(f)
    harness.check("exported adapter_config: r, lora_alpha or peft_type other than the run's",
                  int(config["r"] != RANK) + int(config["lora_alpha"] != ALPHA) + int(config["peft_type"] != "LORA"), 0)
    base_model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    ours = peft.PeftModel.from_pretrained(base_model, exported)
    ours_logits = logits(ours, ids)
    base_model2 = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    reference_logits = logits(peft.PeftModel.from_pretrained(base_model2, theirs_adapter), ids)
    plain_logits = logits(transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), ids)
    scale = float(reference_logits.abs().max())
    harness.check("PEFT logits with the exported adapter against TRL's trained adapter (relative to the largest)",
                  float((ours_logits - reference_logits).abs().max()) / scale, LOGITS_BOUND)
    # The adapters changed the model: the check above compares something.
    moved = float((reference_logits - plain_logits).abs().max()) / scale
    print(f"the adapters move the logits by {moved:.3g} of the largest")
    if moved < 100 * LOGITS_BOUND:
        harness.fail(f"the trained adapters barely change the logits ({moved:.3g}): the comparison is vacuous")

    # --merge-lora: a plain model with the adapters folded in.
    merged_dir = os.path.join(work, "merged")
    merged_losses = train_fsdp(args, base, tokens, 2, os.path.join(work, "merged-run"),
                               ("--lora-init-from", start, "--export-hf", merged_dir, "--merge-lora"))
    harness.check("--merge-lora run: losses other than the adapter run's", float(np.abs(np.array(merged_losses) - losses).max()), 0.0)
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    harness.check("merged export's logits against the base with the exported adapter (relative)",
                  float((logits(merged, ids) - ours_logits).abs().max()) / scale, 1e-5)

    # `fsdp generate --adapter`: the exported adapter run on its base makes
    # PEFT's greedy continuation of the same prompt, and the merged export's;
    # the adapter given as --from is refused, naming --adapter.
    prompt = "The capital of France is"
    def generate(*flags):
        return harness.run([args.fsdp, "generate", *flags, "--prompt", prompt, "--temperature", "0",
                            "--max-new-tokens", "12", "--ignore-eos"]).stdout
    with_adapter = generate("--from", base, "--adapter", exported)
    prompt_ids = transformers.AutoTokenizer.from_pretrained(base)(prompt, return_tensors="pt").input_ids
    peft_ids = ours.generate(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=12,
                             min_new_tokens=12, do_sample=False)
    peft_text = prompt + transformers.AutoTokenizer.from_pretrained(base).decode(peft_ids[0, prompt_ids.shape[1]:]) + "\n"
    harness.check(f"generate --adapter: {with_adapter!r} other than PEFT's greedy {peft_text!r}",
                  int(with_adapter != peft_text), 0)
    harness.check(f"generate --adapter against the merged export's: {with_adapter!r}",
                  int(with_adapter != generate("--from", merged_dir)), 0)
    harness.check("generate --adapter: the base alone continues the same way (the adapter changes nothing)",
                  int(with_adapter == generate("--from", base)), 0)
    refused = subprocess.run([args.fsdp, "generate", "--from", exported, "--prompt", prompt], capture_output=True,
                             text=True)
    harness.check(f"generate --from ADAPTER: exit {refused.returncode}, not refused naming --adapter: {refused.stderr!r}",
                  int(refused.returncode == 0 or "--adapter" not in refused.stderr), 0)

    # Stopped after 2 steps, resumed for 2 more: the same losses as one run.
    resumed_dir = os.path.join(work, "resumed-run")
    first = train_fsdp(args, base, tokens, 2, resumed_dir, ("--lora-init-from", start, "--steps", "2", "--save-every", "2"))
    second = train_fsdp(args, base, tokens, 2, resumed_dir, ("--lora-init-from", start, "--save-every", "2"))
    harness.check("LoRA resume: steps whose loss differs from the uninterrupted run's",
                  int(np.sum(np.array(second[-2:]) != losses[2:])) + int(np.sum(np.array(first[:2]) != losses[:2])), 0)

    # The checkpoint holds the adapters and their AdamW state, and what the
    # base is (its weight files' sizes and CRC-32), not the base itself.
    ckpt = os.path.join(resumed_dir, "checkpoints", "step_00000004")
    with open(os.path.join(ckpt, "metadata.json")) as f:
        meta = json.load(f)
    harness.check("LoRA checkpoint: parameters held that are not adapters",
                  sum("lora_" not in name for name in meta["params"]), 0)
    harness.check("LoRA checkpoint: adapters held other than the run's 7 projections x 2 layers x A and B",
                  abs(len(meta["params"]) - len(TARGETS) * 2 * 2), 0)
    harness.check("LoRA checkpoint: the base's identity missing", int("weights" not in meta["extra"]["lora_base"]), 0)
    # A resume on other base weights is refused by name, and trains nothing.
    other = os.path.join(work, "other-base")
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    model.save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, name), other)
    refused = subprocess.run([args.fsdp, "train", "--init-from", other, "--data", tokens, "--out-dir", resumed_dir,
                              "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--lora-init-from", start,
                              *sft_test.SETTINGS, "--steps", "6"], capture_output=True, text=True)
    harness.check(f"resume on another base: exit {refused.returncode}, not refused naming the base: "
                  f"{refused.stderr[-400:]!r}",
                  int(refused.returncode == 0 or "were trained on the base" not in refused.stderr), 0)
    # `fsdp ckpt export` of the checkpoint: a PEFT adapter equal to the one
    # the uninterrupted run exported, and with --merge-lora the merged model.
    from_ckpt = os.path.join(work, "ckpt-adapter")
    harness.run([args.fsdp, "ckpt", "export", ckpt, from_ckpt])
    ckpt_logits = logits(peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), from_ckpt), ids)
    harness.check("ckpt export of the LoRA checkpoint: PEFT logits against the run's own export (relative)",
                  float((ckpt_logits - ours_logits).abs().max()) / scale, 1e-6)
    merged_from_ckpt = os.path.join(work, "ckpt-merged")
    harness.run([args.fsdp, "ckpt", "export", ckpt, merged_from_ckpt, "--merge-lora"])
    merged_ckpt = transformers.AutoModelForCausalLM.from_pretrained(merged_from_ckpt, dtype=torch.float32)
    harness.check("ckpt export --merge-lora: logits against the base with the exported adapter (relative)",
                  float((logits(merged_ckpt, ids) - ours_logits).abs().max()) / scale, 1e-5)


if __name__ == "__main__":
    main()
