"""Preference training (--objective dpo) against TRL's DPOTrainer
(tests/reference/trl_dpo.py).

The same tiny Qwen3 as sft_test (hf_models' shape with the real Qwen3
tokenizer and chat template), the same {"prompt", "chosen", "rejected"}
records (conversational, some prompts of several turns, and plain), one
pair per rank and micro-step, accumulation 2, file order, fp32, AdamW at a
constant rate, clipping at 1, beta 0.1:
- `fsdp data prepare` writes each pair as two examples whose tokens are
  TRL's prompt_ids + chosen_ids and prompt_ids + rejected_ids, and whose
  loss masks cover TRL's chosen_ids and rejected_ids;
- `fsdp train --objective dpo` makes TRL's per-step losses within
  LOSS_BOUND, its logged rewards (chosen, rejected, margins) within
  METRIC_BOUND, and its reward accuracies exactly:
  - full fine-tuning, the reference a frozen copy of the starting model,
    at W = 1 and 2;
  - LoRA from a PEFT adapter whose B is not zero, the reference the base
    (the adapters off), at W = 1 and 2;
  - plain-text pairs (the EOS appended), and the IPO loss, at W = 1.
- a run stopped after step 2 and resumed makes the losses of one that
  ran through, with and without LoRA;
- a run that evaluates on held-out pairs reports, at step 0, the DPO loss
  of a model equal to its reference: log 2 for every pair.
"""
import json
import math
import os

import numpy as np

import harness
import lora_test
import sft_test

LOSS_BOUND = 1e-5
# The rewards are beta times differences of sums of log-probabilities
# (about -100 each here, in fp32 on both sides): rounding alone moves them
# by 1e-5. Accuracies are counts, compared exactly.
METRIC_BOUND = 1e-4
STEPS = 4

CHOSEN = sft_test.ANSWERS
REJECTED = ["London.", "Nine is one.", "Hund.", "Six.", "Go away.", "Green, always.", "House.", "124."]


def conversational_pairs():
    out = []
    for k, (q, good, bad) in enumerate(zip(sft_test.QUESTIONS * 2, CHOSEN * 2, REJECTED * 2)):
        prompt = [{"role": "user", "content": q if k < 8 else q + " Please."}]
        if k % 3 == 0:
            prompt = [{"role": "system", "content": "You answer in one line."}] + prompt
        if k % 4 == 1:  # a prompt of several turns: an earlier exchange before the question
            prompt = [{"role": "user", "content": "Are you ready?"},
                      {"role": "assistant", "content": "Yes, ask away."}] + prompt
        out.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": good}],
                    "rejected": [{"role": "assistant", "content": bad}]})
    return out


def plain_pairs():
    return [{"prompt": f"Question: {q}\nAnswer:", "chosen": f" {good}", "rejected": f" {bad}"}
            for q, good, bad in zip(sft_test.QUESTIONS * 2, CHOSEN * 2, REJECTED * 2)]


def metrics(out):
    lines = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return ([x for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x],
            [x for x in lines if x.get("split") == "val"])


def run_trl(directory, world, runs, work):
    """TRL's results for each of RUNS ((data, folder, extra arguments)), at WORLD ranks in one torchrun."""
    jobs = os.path.join(work, f"trl-dpo-jobs-w{world}.jsonl")
    with open(jobs, "w") as f:
        for data, folder, extra in runs:
            os.makedirs(folder, exist_ok=True)
            f.write(json.dumps(["--model", directory, "--data", data, "--out", os.path.join(folder, "trl.json"),
                                "--work", os.path.join(folder, "trl-run"), "--steps", str(STEPS), *extra]) + "\n")
    harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                 os.path.join(os.path.dirname(__file__), "trl_dpo.py"), "--jobs", jobs])
    return [json.load(open(os.path.join(folder, "trl.json"))) for _, folder, _ in runs]


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    directory = sft_test.tiny_qwen3(work, sft_test.qwen3_tokenizer_or_skip())
    adapter = os.path.join(work, "initial-adapter")
    lora_test.initial_adapter(directory, adapter)
    lora = ["--lora-rank", str(lora_test.RANK), "--lora-alpha", str(lora_test.ALPHA), "--lora-init-from", adapter]

    records = {"conversational": conversational_pairs(), "plain": plain_pairs()}
    inputs = {name: sft_test.prepared(args, r, work, "dpo-" + name, directory) for name, r in records.items()}
    # (name, data, fsdp's arguments, TRL's arguments, worlds)
    cases = [("full", "conversational", [], [], (1, 2)),
             ("lora", "conversational", lora, ["--adapter", adapter], (1, 2)),
             ("plain", "plain", [], [], (1,)),
             ("ipo", "conversational", ["--dpo-loss", "ipo"], ["--loss-type", "ipo"], (1,))]
    folder = {(name, world): os.path.join(work, f"{name}-w{world}") for name, *_, worlds in cases for world in worlds}
    trl = {}
    for world in (1, 2):
        runs = [case for case in cases if world in case[4]]
        results = run_trl(directory, world, [(inputs[data][0], folder[name, world], theirs)
                                             for name, data, _, theirs, _ in runs], work)
        for (name, *_), result in zip(runs, results):
            trl[name, world] = result

    for name, data, ours_args, _, worlds in cases:
        for world in worlds:
            theirs = trl[name, world]
            if world == 1 and name in ("full", "plain"):
                # Each pair: chosen then rejected, TRL's prompt before each, the loss on the answer.
                expected = []
                for t in theirs["tokenized"]:
                    for side in ("chosen_ids", "rejected_ids"):
                        expected.append((t["prompt_ids"] + t[side], [0] * len(t["prompt_ids"]) + [1] * len(t[side])))
                ours = inputs[data][2]
                harness.check(f"{data} pairs: examples whose tokens differ from TRL's prompt + answer ids",
                              sum(a[0] != b[0] for a, b in zip(ours, expected)) + abs(len(ours) - len(expected)), 0)
                harness.check(f"{data} pairs: examples whose loss mask is not TRL's answer",
                              sum(a[1] != b[1] for a, b in zip(ours, expected)), 0)
            out = folder[name, world]
            harness.run([args.fsdp, "launch", "-n", str(world), "--", args.fsdp, "train", "--init-from", directory,
                         "--data", inputs[data][1], "--out-dir", os.path.join(out, "fsdp-run"), "--objective", "dpo",
                         "--dpo-beta", "0.1", *sft_test.SETTINGS, *ours_args])
            steps, _ = metrics(os.path.join(out, "fsdp-run"))
            reference = theirs["steps"]
            if len(steps) != STEPS or len(reference) != STEPS:
                harness.fail(f"{name} W={world}: expected {STEPS} steps, got {len(steps)} (fsdp) and "
                             f"{len(reference)} (TRL)")
            losses = np.array([x["loss"] for x in steps])
            their_losses = np.array([x["loss"] for x in reference])
            print(f"{name} W={world}: TRL {np.round(their_losses, 6).tolist()}, fsdp {np.round(losses, 6).tolist()}")
            harness.check(f"{name} W={world}: largest relative loss difference from TRL",
                          float((np.abs(losses - their_losses) / np.abs(their_losses)).max()), LOSS_BOUND)
            for key, bound in (("rewards/chosen", METRIC_BOUND), ("rewards/rejected", METRIC_BOUND),
                               ("rewards/margins", METRIC_BOUND), ("rewards/accuracies", 0.0)):
                ours_v = np.array([x[key] for x in steps])
                theirs_v = np.array([x[key] for x in reference])
                harness.check(f"{name} W={world}: largest difference in {key} from TRL",
                              float(np.abs(ours_v - theirs_v).max()), bound)
            if name == "full":
                # The comparison is not vacuous: the policy left its reference.
                moved = float(np.abs([x["rewards/margins"] for x in steps[1:]]).max())
                print(f"{name} W={world}: the largest reward margin after step 1 is {moved:.3g}")
                if moved < 1e-3:
                    harness.fail(f"{name} W={world}: the policy barely moved from its reference ({moved:.3g})")

    # A run stopped after step 2 and resumed makes the uninterrupted run's
    # losses: the reference is rebuilt as the run started (the starting
    # model; under LoRA the adapters of --lora-init-from, not the
    # checkpoint's).
    for name, data, ours_args, _, _ in cases[:2]:
        out = os.path.join(work, f"{name}-resumed")
        command = [args.fsdp, "train", "--init-from", directory, "--data", inputs[data][1], "--out-dir", out,
                   "--objective", "dpo", *sft_test.SETTINGS, *ours_args]
        harness.run(command + ["--steps", "2", "--save-every", "2"])
        harness.run(command)
        resumed = np.array([x["loss"] for x in metrics(out)[0]])
        whole = np.array([x["loss"] for x in metrics(os.path.join(folder[name, 1], "fsdp-run"))[0]])
        harness.check(f"{name}: resumed after step 2, largest loss difference from the uninterrupted run",
                      float(np.abs(resumed[-2:] - whole[-2:]).max()) + abs(len(resumed) - STEPS), 0.0)

    # Evaluation on held-out pairs: at step 0 the policy is its reference,
    # so every pair's sigmoid loss is log 2 and no reward is won.
    data, tokens, _ = inputs["conversational"]
    held = os.path.join(work, "dpo-held-out")
    harness.run([args.fsdp, "data", "prepare", "--input", data, "--out-dir", held, "--tokenizer", directory,
                 "--val-fraction", "0.25"])
    out = os.path.join(work, "eval-run")
    harness.run([args.fsdp, "train", "--init-from", directory, "--data", os.path.join(held, "train.bin"),
                 "--val-data", os.path.join(held, "val.bin"), "--eval-every", "2", "--eval-batches", "all",
                 "--out-dir", out, "--objective", "dpo", *sft_test.SETTINGS])
    _, evals = metrics(out)
    harness.check("evaluation at step 0: DPO loss minus log 2", abs(evals[0]["loss"] - math.log(2)), 1e-6)
    harness.check("evaluation at step 0: largest reward margin", abs(evals[0]["rewards/margins"]), 1e-6)
    harness.check("evaluation after training: pairs with no reward margin (the evaluation measures nothing)",
                  int(abs(evals[-1]["rewards/margins"]) < 1e-4), 0)


if __name__ == "__main__":
    main()
