"""Supervised fine-tuning against TRL's SFTTrainer (tests/reference/trl_sft.py).

The same tiny Qwen3 directory (hf_models' shape with the real Qwen3
tokenizer and chat template, data/qwen3), the same records, batch 1 per
rank, accumulation 2, file order, fp32, AdamW at a constant rate, clipping
at 1:
- `fsdp data prepare` writes, example by example, TRL's input_ids, and a
  loss mask that is TRL's completion_mask (from JSONL, and from the same
  records in Parquet) (conversational pairs under the
  chat template, and plain-text pairs with the EOS appended). A
  conversation of one question and its answer ({"messages": [...]}) is
  masked as the same pair is (from JSONL, Parquet and a `datasets`
  save_to_disk folder alike), special tokens inside answers included (the
  whole assistant turn is trained, through its end-of-turn token, in the
  first of two turns too).
- packed several to a row (--pack), the same examples make the losses of
  one example a row, step by step, when every step reads all of them, and
  both count the same real and trained tokens in metrics.jsonl (padding
  is not throughput);
- `fsdp train` on them (one example a row, the loss on the completions,
  averaged over every trained token of every rank and micro-step) makes
  TRL's per-step losses within LOSS_BOUND at W = 1 and W = 2;
- conversations of two and three assistant turns, special tokens inside
  some answers, rendered with TRL's training variant of the Qwen3 template
  (its {% generation %} spans around each assistant turn): `data prepare`
  masks each token as TRL's assistant_only_loss does, and the losses agree
  within LOSS_BOUND at W = 1 and 2.
"""
import argparse
import json
import os
import shutil

import datasets
import numpy as np
import torch
import transformers

import harness
import hf_models
import token_files

LOSS_BOUND = 1e-5
STEPS = 4
PACK_T = 128
ROW_T = 64
SETTINGS = ["--steps", str(STEPS), "--batch-size", "1", "--grad-accum", "2", "--seq-len", "128", "--lr", "1e-3",
            "--lr-schedule", "constant", "--warmup-steps", "0", "--weight-decay", "0", "--beta1", "0.9", "--beta2",
            "0.999", "--eps", "1e-8", "--grad-clip", "1.0", "--precision", "fp32", "--log-every", "1",
            "--tensorboard=false", "--sample-tokens", "0"]

QUESTIONS = ["What is the capital of France?", "Name a prime number above 10.", "Translate 'cat' into German.",
             "How many legs has a spider?", "Say hello.", "What colour is the sky on a clear day?",
             "Give me a word that rhymes with tree.", "What is 12 times 12?"]
ANSWERS = ["Paris.", "Thirteen is one.", "Katze.", "Eight.", "Hello!", "Blue, mostly.",
           "Bee, or sea, or free.", "144."]


def conversational_pairs():
    out = []
    for k, (q, a) in enumerate(zip(QUESTIONS * 2, ANSWERS * 2)):
        prompt = ([{"role": "system", "content": "You answer in one line."}] if k % 3 == 0 else []) + \
                 [{"role": "user", "content": q if k < 8 else q + " Please."}]
        out.append({"prompt": prompt, "completion": [{"role": "assistant", "content": a}]})
    return out


def plain_pairs():
    return [{"prompt": f"Question: {q}\nAnswer:", "completion": f" {a}"} for q, a in zip(QUESTIONS * 2, ANSWERS * 2)]


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def prepared(args, records, work, name, directory, extra=()):
    """The examples `fsdp data prepare` makes of RECORDS: (tokens, mask) each."""
    data = os.path.join(work, name + ".jsonl")
    write_jsonl(data, records)
    out = os.path.join(work, name + "-tokens")
    harness.run([args.fsdp, "data", "prepare", "--input", data, "--out-dir", out, "--tokenizer", directory,
                 "--val-fraction", "0", *extra])
    if extra:
        return data, os.path.join(out, "train_*.bin"), None
    tokens = token_files.read(os.path.join(out, "train.bin"))
    mask = np.fromfile(os.path.join(out, "train.mask"), dtype=np.uint8, offset=1024)
    starts = list(np.flatnonzero(mask & 2)) + [len(tokens)]
    examples = [(tokens[a:b].tolist(), (mask[a:b] & 1).tolist()) for a, b in zip(starts, starts[1:])]
    return data, os.path.join(out, "train.bin"), examples


def run_trl(directory, world, runs, work):
    """TRL's results (trl.json) for each of RUNS ((data, folder) pairs, or
    (data, folder, model directory, extra arguments)), all trained at WORLD
    ranks in one torchrun (trl_sft.py --jobs)."""
    jobs = os.path.join(work, f"trl-jobs-w{world}.jsonl")
    with open(jobs, "w") as f:
        for data, folder, *rest in runs:
            model, extra = rest if rest else (directory, [])
            os.makedirs(folder, exist_ok=True)
            f.write(json.dumps(["--model", model, "--data", data, "--out", os.path.join(folder, "trl.json"),
                                "--work", os.path.join(folder, "trl-run"), "--steps", str(STEPS), *extra]) + "\n")
    harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                 os.path.join(os.path.dirname(__file__), "trl_sft.py"), "--jobs", jobs])
    return [json.load(open(os.path.join(run[1], "trl.json"))) for run in runs]


def run_fsdp(args, directory, tokens, world, work):
    out = os.path.join(work, "fsdp-run")
    harness.run([args.fsdp, "launch", "-n", str(world), "--", args.fsdp, "train", "--init-from", directory,
                 "--data", tokens, "--out-dir", out] + SETTINGS)
    lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [x["loss"] for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x]


def multi_turn_conversations():
    """Conversations of two and three assistant turns, a system message in
    some, a special token inside some answers."""
    out = []
    for k in range(16):
        q = [QUESTIONS[(k + j) % 8] for j in range(3)]
        a = [ANSWERS[(k + j) % 8] for j in range(3)]
        if k % 4 == 1:
            a[0] = "Arr, hello <|box_start|>!"
        messages = [{"role": "system", "content": "You answer in one line."}] if k % 3 == 0 else []
        for turn in range(2 + k % 2):
            messages += [{"role": "user", "content": q[turn]}, {"role": "assistant", "content": a[turn]}]
        out.append({"messages": messages})
    return out


def with_training_template(work, directory):
    """A copy of DIRECTORY whose chat template is TRL's training variant of
    Qwen3's ({% generation %} around each assistant turn), which both sides
    render: TRL's assistant_only_loss masks by its spans."""
    import trl
    out = os.path.join(work, "qwen3-training-template")
    shutil.copytree(directory, out)
    template = os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen3_training.jinja")
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = open(template).read()
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return out


def qwen3_tokenizer_or_skip():
    """data/qwen3 (the real Qwen3 tokenizer and chat template), or a skip (exit 77) without it."""
    tokenizer_dir = os.path.join(harness.SOURCE_DIR, "data", "qwen3")
    if not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        print("SKIP: data/qwen3 is missing (scripts/fetch_data.sh fetches it)")
        raise SystemExit(77)
    return tokenizer_dir


def tiny_qwen3(work, tokenizer_dir):
    """hf_models' Qwen3 with Qwen3's vocabulary, tokenizer and chat template, saved in WORK/qwen3."""
    directory = os.path.join(work, "qwen3")
    config = hf_models.config("qwen3")
    config.vocab_size = 151936  # Qwen3's own: every id of its tokenizer
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), directory)
    return directory


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    directory = tiny_qwen3(work, qwen3_tokenizer_or_skip())

    # One question and its answer as a conversation: masked as the pair is.
    pairs = conversational_pairs()
    _, _, as_pairs = prepared(args, pairs[:3], work, "pairs3", directory)
    _, _, as_messages = prepared(args, [{"messages": p["prompt"] + p["completion"]} for p in pairs[:3]], work,
                                 "messages3", directory)
    harness.check("conversations of one answer: examples (tokens, mask) unlike the same pairs'",
                  sum(a != b for a, b in zip(as_pairs, as_messages)), 0)

    # A special token inside an answer is the answer's: the turn is trained
    # whole, through its <|im_end|> and line break, as TRL trains it (a
    # pair's completion mask is TRL's, checked below), in a conversation of
    # one answer and in the first of two.
    special = [{"prompt": [{"role": "user", "content": "Greet me as a pirate."}],
                "completion": [{"role": "assistant", "content": "Arr, hello <|box_start|>!"}]},
               {"prompt": [{"role": "user", "content": "Mark a box."}],
                "completion": [{"role": "assistant", "content": "<|box_start|>here<|box_end|> it is."}]}]
    _, _, special_pairs = prepared(args, special, work, "special-pairs", directory)
    _, _, special_messages = prepared(args, [{"messages": p["prompt"] + p["completion"]} for p in special], work,
                                      "special-messages", directory)
    harness.check("answers holding a special token: conversations masked unlike the same pairs",
                  sum(a != b for a, b in zip(special_pairs, special_messages)), 0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    two_turns = [{"role": "user", "content": "Greet me as a pirate."},
                 {"role": "assistant", "content": "Arr, hello <|box_start|>!"},
                 {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Ahoy."}]
    _, _, (multi,) = prepared(args, [{"messages": two_turns}], work, "special-two-turns", directory)
    trained_text = tokenizer.decode([t for t, m in zip(*multi) if m])
    harness.check(f"two turns, a special token in the first answer: {trained_text!r} lacks the first turn's end",
                  int("Arr, hello <|box_start|>!<|im_end|>\n" not in trained_text), 0)
    harness.check(f"two turns: {trained_text!r} trains a user's words",
                  int("Again" in trained_text or "pirate" in trained_text), 0)

    # The same records as a Parquet file (as Hugging Face datasets ship
    # them; pyarrow writes it): the same examples as from JSONL.
    import pyarrow
    import pyarrow.parquet
    for name, records in (("pairs", pairs), ("messages", [{"messages": p["prompt"] + p["completion"]} for p in pairs])):
        folder = os.path.join(work, name + "-parquet")
        os.makedirs(folder, exist_ok=True)
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), os.path.join(folder, "data.parquet"))
        from_parquet = os.path.join(work, name + "-parquet-tokens")
        harness.run([args.fsdp, "data", "prepare", "--input", folder, "--out-dir", from_parquet, "--tokenizer",
                     directory, "--val-fraction", "0"])
        _, _, from_jsonl = prepared(args, records, work, name + "-jsonl", directory)
        tokens = token_files.read(os.path.join(from_parquet, "train.bin"))
        mask = np.fromfile(os.path.join(from_parquet, "train.mask"), dtype=np.uint8, offset=1024)
        expected_tokens = [t for example, _ in from_jsonl for t in example]
        expected_mask = [m for _, trained in from_jsonl for m in trained]
        harness.check(f"{name} from Parquet: tokens or loss mask other than from JSONL",
                      int(tokens.tolist() != expected_tokens) + int((mask & 1).tolist() != expected_mask), 0)
        # The same records as `datasets` saves them to disk (Arrow files).
        saved = os.path.join(work, name + "-saved")
        datasets.Dataset.from_list(records).save_to_disk(saved)
        from_arrow = os.path.join(work, name + "-saved-tokens")
        harness.run([args.fsdp, "data", "prepare", "--input", saved, "--out-dir", from_arrow, "--tokenizer",
                     directory, "--val-fraction", "0"])
        tokens = token_files.read(os.path.join(from_arrow, "train.bin"))
        mask = np.fromfile(os.path.join(from_arrow, "train.mask"), dtype=np.uint8, offset=1024)
        harness.check(f"{name} from a saved dataset: tokens or loss mask other than from JSONL",
                      int(tokens.tolist() != expected_tokens) + int((mask & 1).tolist() != expected_mask), 0)

    # Packed (--pack): several examples to a row, positions restarting and
    # attention kept inside each. Every step here reads all 16 examples
    # (one a row: batch 16; packed: batch = the rows they fill), so the
    # steps' losses are the same sums over the same tokens either way.
    _, all_tokens, examples = prepared(args, pairs, work, "pack", directory)
    rows, used = 1, 0
    for tokens, _ in examples:  # the packing rule, worked out here: inputs (L - 1 each) while they fit T
        if used + len(tokens) - 1 > PACK_T:
            rows, used = rows + 1, 0
        used += len(tokens) - 1
    # One a row, each example is padded to ROW_T only: the loss is the same
    # sum over the trained tokens, and the head (Qwen3's 151,936 ids) runs
    # over half the padding that PACK_T would add.
    if max(len(tokens) for tokens, _ in examples) - 1 > ROW_T:
        harness.fail(f"an example is longer than the {ROW_T} tokens of a row one example a row")
    full_batch = []
    for extra, batch, seq_len in (([], len(examples), ROW_T), (["--pack"], rows, PACK_T),
                                  (["--pack", "--activation-checkpoint"], rows, PACK_T)):
        out = os.path.join(work, "pack-run" + "".join(extra))
        harness.run([args.fsdp, "train", "--init-from", directory, "--data", all_tokens, "--out-dir", out,
                     *SETTINGS, "--seq-len", str(seq_len), "--batch-size", str(batch), "--grad-accum", "1", *extra])
        lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        steps = [x for x in lines if "loss" in x and "event" not in x and x.get("split", "train") == "train"]
        full_batch.append(np.array([x["loss"] for x in steps]))
        # tok/s counts data, not padding: every step reads every example,
        # whose L - 1 tokens are inputs with a target, in either layout.
        real = sum(len(tokens) - 1 for tokens, _ in examples)
        trained = sum(sum(mask[1:]) for _, mask in examples)
        harness.check(f"{' '.join(extra) or 'one example a row'}: steps whose metrics count other than "
                      f"{real} real tokens and {trained} trained",
                      sum(x["tokens"] != real or x["trained_tokens"] != trained for x in steps), 0)
    print(f"{len(examples)} examples packed into {rows} rows of {PACK_T}: losses {np.round(full_batch[1], 6).tolist()}, "
          f"one a row {np.round(full_batch[0], 6).tolist()}")
    if rows >= len(examples) // 2:
        harness.fail(f"{rows} packed rows for {len(examples)} examples: packing put too few in a row to test it")
    harness.check("packed rows against one example a row: largest relative loss difference",
                  float((np.abs(full_batch[1] - full_batch[0]) / full_batch[0]).max()), LOSS_BOUND)
    harness.check("packed rows with activation checkpointing: largest relative loss difference",
                  float((np.abs(full_batch[2] - full_batch[0]) / full_batch[0]).max()), LOSS_BOUND)

    # Conversations of several turns train as TRL's assistant_only_loss
    # trains them, under a template with {% generation %} markers.
    training_template = with_training_template(work, directory)
    model_of = {"conversational pairs": directory, "plain pairs": directory, "multi-turn": training_template}
    trl_extra = {"multi-turn": ["--assistant-only-loss"]}
    cases = [("conversational pairs", pairs, (1, 2)), ("plain pairs", plain_pairs(), (1,)),
             ("multi-turn", multi_turn_conversations(), (1, 2))]
    inputs = {name: prepared(args, records, work, name.replace(" ", "-"), model_of[name])
              for name, records, _ in cases}
    folder = {(name, world): os.path.join(work, f"{name.replace(' ', '-')}-w{world}")
              for name, _, worlds in cases for world in worlds}
    trl = {}
    for world in (1, 2):
        runs = [name for name, _, worlds in cases if world in worlds]
        for name, result in zip(runs, run_trl(directory, world, [(inputs[name][0], folder[name, world], model_of[name],
                                                                  trl_extra.get(name, [])) for name in runs], work)):
            trl[name, world] = result
    for name, records, worlds in cases:
        data, tokens, ours = inputs[name]
        directory = model_of[name]
        for world in worlds:
            case_work = folder[name, world]
            theirs = trl[name, world]
            if world == worlds[0]:
                expected = [(t["input_ids"], t["completion_mask"]) for t in theirs["tokenized"]]
                harness.check(f"{name}: examples whose tokens differ from TRL's input_ids",
                              sum(a[0] != b[0] for a, b in zip(ours, expected)) + abs(len(ours) - len(expected)), 0)
                harness.check(f"{name}: examples whose loss mask differs from TRL's completion_mask",
                              sum(a[1] != b[1] for a, b in zip(ours, expected)), 0)
            losses = np.array(run_fsdp(args, directory, tokens, world, case_work))
            reference = np.array(theirs["losses"])
            if len(losses) != STEPS or len(reference) != STEPS:
                harness.fail(f"{name} W={world}: expected {STEPS} losses, got {len(losses)} (fsdp) and "
                             f"{len(reference)} (TRL)")
            print(f"{name} W={world}: TRL {np.round(reference, 6).tolist()}, fsdp {np.round(losses, 6).tolist()}")
            harness.check(f"{name} W={world}: largest relative loss difference from TRL",
                          float((np.abs(losses - reference) / np.abs(reference)).max()), LOSS_BOUND)
            if name == "conversational pairs" and world == 1:
                # Shards of 100 tokens cut examples; each is still read whole.
                _, shards, _ = prepared(args, records, work, "sharded", directory, ("--shard-tokens", "100"))
                sharded = np.array(run_fsdp(args, directory, shards, 1, os.path.join(work, "sharded-w1")))
                harness.check("the same pairs in shards of 100 tokens: largest loss difference from one file",
                              float(np.abs(sharded - losses).max()), 0.0)


if __name__ == "__main__":
    main()
