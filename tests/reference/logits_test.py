"""fsdp.cpp's forward and greedy generation against `transformers`, on
directories `transformers` wrote; then the other way, directories
`fsdp train --export-hf` wrote, loaded by `transformers`.

For each family (hf_models.py): the logits of two 27-token rows agree
within 1e-5 relative to the largest logit, and greedy generation of 8
tokens (transformers' `generate`, with its KV cache; ours without) gives
the same tokens.
"""
import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file

import harness
import hf_models

LOGITS_BOUND = 1e-5
# 27 prompt tokens: Llama 4's chunks of 8 end in a partial window.
ROWS, PROMPT_TOKENS, NEW_TOKENS = 2, 27, 8


def transformers_side(model, ids):
    with torch.no_grad():
        logits = model(ids).logits.float()
    model.generation_config.eos_token_id = None  # generate all NEW_TOKENS
    model.generation_config.pad_token_id = 0
    greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return logits, greedy[:, PROMPT_TOKENS:]


def fsdp_side(args, directory, ids, work):
    inputs, outputs = os.path.join(work, "ids.safetensors"), os.path.join(work, "fsdp.safetensors")
    save_file({"input_ids": ids.contiguous()}, inputs)
    harness.run([os.path.join(args.build_dir, "tests", "fsdp_logits_probe"), directory, inputs, outputs,
                 str(NEW_TOKENS)])
    out = load_file(outputs)
    return out["logits"], out["greedy"]


def compare(args, name, directory, model, work):
    ids = torch.randint(0, hf_models.VOCAB, (ROWS, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    theirs, their_tokens = transformers_side(model, ids)
    ours, our_tokens = fsdp_side(args, directory, ids, work)
    harness.check(f"{name}: logits, relative to the largest", harness.relative_difference(ours, theirs),
                  LOGITS_BOUND)
    if not torch.equal(ours.argmax(-1), theirs.argmax(-1)):
        harness.fail(f"{name}: the most likely token differs at some position")
    if not torch.equal(our_tokens, their_tokens):
        harness.fail(f"{name}: greedy tokens differ:\n  fsdp         {our_tokens.tolist()}\n"
                     f"  transformers {their_tokens.tolist()}")
    print(f"{name}: greedy tokens equal ({our_tokens[0].tolist()} ...)")


def export_roundtrip(args, family, directory, work):
    """fsdp trains two steps from DIRECTORY and exports; transformers loads
    the export with nothing missing, unexpected or mismatched."""
    run_dir, export = os.path.join(work, "run"), os.path.join(work, "export")
    harness.run([args.fsdp, "train", "--init-from", directory, "--data", "synthetic", "--seq-len", "32",
                 "--batch-size", "2", "--steps", "2", "--lr", "1e-2", "--warmup-steps", "0",
                 "--out-dir", run_dir, "--export-hf", export, "--tensorboard=false", "--sample-tokens", "0"])
    model, info = hf_models.load_model(export)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        harness.fail(f"{family}: transformers loading the export reports {problems}")
    config = json.load(open(os.path.join(export, "config.json")))
    print(f"{family}: export loads in transformers as {type(model).__name__} ({config['model_type']}), "
          "no missing, unexpected or mismatched keys")
    original, _ = hf_models.load_model(directory)
    with torch.no_grad():
        moved = max(harness.relative_difference(a, b) for a, b in zip(model.parameters(), original.parameters()))
    if moved == 0:
        harness.fail(f"{family}: the exported weights equal the initial ones; training did not reach the export")
    compare(args, f"{family} export", export, model, work)


def refused_by_name(args, work):
    """Directories transformers writes with features fsdp.cpp lacks: the
    load fails naming the feature, rather than building another model."""
    cases = {
        "yarn": (hf_models.config("llama"), "rope_parameters", dict(rope_type="yarn", factor=4.0,
                                                                     original_max_position_embeddings=32,
                                                                     rope_theta=10000.0), "yarn"),
        "attention_bias": (hf_models.config("qwen3"), "attention_bias", True, "attention_bias"),
        "router_jitter_noise": (hf_models.config("llama4"), "router_jitter_noise", 0.1, "router_jitter_noise"),
        # Mistral 7B v0.1's window, shorter than its positions.
        "sliding_window": (hf_models.config("mistral"), "sliding_window", 64, "sliding_window"),
    }
    for name, (config, key, value, expected) in cases.items():
        setattr(config, key, value)
        directory = os.path.join(work, "refused-" + name)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
        result = harness.subprocess.run([args.fsdp, "train", "--init-from", directory, "--data", "synthetic",
                                         "--steps", "1", "--out-dir", directory + "-run"],
                                        capture_output=True, text=True)
        if result.returncode != 1 or expected not in result.stderr:
            harness.fail(f"{name}: expected exit 1 naming '{expected}', got {result.returncode}: {result.stderr}")
        print(f"{name}: refused: {result.stderr.strip().splitlines()[-1]}")


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    for family in hf_models.FAMILIES:
        directory = os.path.join(work, family)
        model = hf_models.write_model(family, directory)
        compare(args, family, directory, model, work)
        export_roundtrip(args, family, directory, os.path.join(work, family + "-export"))
    # The published Llama 4 checkpoints: the language model is loaded from
    # under language_model., the vision tower's tensors are skipped.
    directory = os.path.join(work, "llama4-multimodal")
    compare(args, "llama4 (Llama4ForConditionalGeneration)", directory,
            hf_models.write_llama4_multimodal(directory), work)
    # Training from it says what it leaves out.
    started = harness.run([args.fsdp, "train", "--init-from", directory, "--data", "synthetic", "--steps", "1",
                           "--seq-len", "16", "--batch-size", "1", "--out-dir", directory + "-run",
                           "--sample-tokens", "0"])
    if "the vision tower and projector (vision_model., multi_modal_projector.) are not read" not in started.stdout:
        harness.fail(f"training from a Llama4ForConditionalGeneration directory did not say the vision tower is "
                     f"left out:\n{started.stdout}")
    print("llama4 (Llama4ForConditionalGeneration): training says the vision tower is not read")
    refused_by_name(args, work)


if __name__ == "__main__":
    main()
