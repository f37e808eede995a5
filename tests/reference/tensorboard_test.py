"""TensorBoard's own reader on a run folder: a two-rank run with
evaluation, stopped and resumed (so the folder holds the event files of
two processes), opened with `tensorboard`'s EventAccumulator. Every scalar
of metrics.jsonl is there at its step with its value (as float32, the
event format's), nothing else is, and the tags are listed, as TensorBoard
shows them.
"""
import glob
import json
import math
import os

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import harness


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


if __name__ == "__main__":
    main()
