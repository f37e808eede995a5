"""TensorBoard's own reader on a run folder: a two-rank run with
evaluation, stopped and resumed (so the folder holds the event files of
two processes), opened with `tensorboard`'s EventAccumulator. Every scalar
of metrics.jsonl is there at its step with its value (as float32, the
event format's), nothing else is, and the tags are listed, as TensorBoard
shows them. A run with --eval-samples puts each evaluation's completions
of validation prompts in TensorBoard's Text tab.
"""
import glob
import json
import math
import os

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import harness
import token_files


def expected_scalars(metrics):
    """{(tag, step): value}: what fsdp's telemetry says it sends, read from
    the JSON lines (src/train/telemetry.cpp: `split/key`, booleans as 0/1)."""
    out = {}
    for line in open(metrics):
        m = json.loads(line)
        if "event" in m or "step" not in m:
            continue
        for key, value in m.items():
            if key != "step" and isinstance(value, (int, float)):
                out[(m.get("split", "train") + "/" + key, m["step"])] = float(value)
    return out


def main():
    args = harness.parse_args(__doc__)
    run = os.path.join(harness.work_dir(args), "run")
    common = [args.fsdp, "launch", "-n", "2", "--", args.fsdp, "train", "--model", "gpt2-tiny", "--data", "synthetic",
              "--val-data", "synthetic", "--eval-every", "2", "--eval-batches", "1", "--log-every", "1",
              "--out-dir", run, "--ckpt-dir", os.path.join(run, "checkpoints")]
    harness.run(common + ["--steps", "3"])
    harness.run(common + ["--steps", "5"])  # resumes at step 3
    files = glob.glob(os.path.join(run, "tensorboard", "events.out.tfevents.*"))
    if len(files) != 2:
        harness.fail(f"expected two event files (the first run's and the resumed one's), found {files}")
    accumulator = EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = sorted(accumulator.Tags()["scalars"])
    found = {(tag, e.step): e.value for tag in tags for e in accumulator.Scalars(tag)}
    expected = expected_scalars(os.path.join(run, "metrics.jsonl"))
    for key, value in expected.items():
        if key not in found:
            harness.fail(f"{key[0]} at step {key[1]}: in metrics.jsonl, not in TensorBoard")
        if not (found[key] == np.float32(value) or (math.isnan(value) and math.isnan(found[key]))):
            harness.fail(f"{key[0]} at step {key[1]}: TensorBoard {found[key]}, metrics.jsonl {value}")
    extra = sorted(set(found) - set(expected))
    if extra:
        harness.fail(f"in TensorBoard, not in metrics.jsonl: {extra[:5]}")
    steps = sorted({step for tag, step in found if tag == "train/loss"})
    if steps != [1, 2, 3, 4, 5]:
        harness.fail(f"train/loss at steps {steps}, expected 1 to 5 across the resume")
    print(f"TensorBoard reads {len(found)} scalars from {len(files)} event files, all equal to metrics.jsonl")
    print("tags: " + ", ".join(tags))

    # --eval-samples: each evaluation's completions of validation prompts
    # are text in TensorBoard's Text tab, at the evaluation's step. The
    # prompts are a row's first 32 tokens, decoded here by the tokenizers
    # library's byte-level BPE over GPT-2's files, from the token file itself.
    import tokenizers
    work = harness.work_dir(args)
    text = " ".join(f"Sentence {k} of the validation text, about cats and dogs." for k in range(60))
    with open(os.path.join(work, "doc.txt"), "w") as f:
        f.write(text)
    tokens = os.path.join(work, "tokens")
    harness.run([args.fsdp, "data", "prepare", "--input", os.path.join(work, "doc.txt"), "--out-dir", tokens,
                 "--val-fraction", "0"])
    sampled = os.path.join(work, "sampled")
    harness.run([args.fsdp, "train", "--model", "gpt2-tiny", "--vocab-size", "50304", "--data", os.path.join(tokens, "train.bin"),
                 "--val-data", os.path.join(tokens, "train.bin"), "--seq-len", "64", "--batch-size", "2",
                 "--steps", "2", "--eval-every", "2", "--eval-samples", "2", "--eval-sample-tokens", "5",
                 "--out-dir", sampled])
    accumulator = EventAccumulator(os.path.join(sampled, "tensorboard"), size_guidance={"tensors": 0})
    accumulator.Reload()
    events = {e.step: e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors("val/samples")}
    if sorted(events) != [0, 2]:
        harness.fail(f"val/samples at steps {sorted(events)}, expected the evaluations' 0 and 2")
    gpt2_dir = os.path.join(harness.SOURCE_DIR, "data", "gpt2")
    gpt2 = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(os.path.join(gpt2_dir, "encoder.json"),
                                                                os.path.join(gpt2_dir, "vocab.bpe")))
    gpt2.decoder = tokenizers.decoders.ByteLevel()
    stream = token_files.read(os.path.join(tokens, "train.bin"))
    evals = [json.loads(line) for line in open(os.path.join(sampled, "metrics.jsonl"))]
    evals = [m for m in evals if m.get("split") == "val"]
    for m in evals:
        samples = m["samples"]
        if len(samples) != 2:
            harness.fail(f"step {m['step']}: {len(samples)} samples in metrics.jsonl, expected 2")
        for k, sample in enumerate(samples):
            expected = gpt2.decode(stream[k * 64:k * 64 + 32].tolist(), skip_special_tokens=False)
            if sample["prompt"] != expected:
                harness.fail(f"step {m['step']} sample {k + 1}: prompt {sample['prompt']!r}, expected row {k}'s "
                             f"first 32 tokens {expected!r}")
            if sample["prompt"] not in events[m["step"]] or sample["completion"] not in events[m["step"]]:
                harness.fail(f"step {m['step']} sample {k + 1}: not in TensorBoard's text {events[m['step']]!r}")
    print(f"TensorBoard's Text tab holds the validation samples of steps {sorted(events)}, as metrics.jsonl does")


if __name__ == "__main__":
    main()
