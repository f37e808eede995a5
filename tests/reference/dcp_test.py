"""Checkpoints across the two systems, through PyTorch's Distributed
Checkpoint (`fsdp ckpt export --format dcp`, `fsdp ckpt import --format
dcp`, which run tools/dcp_convert.py):

- export: fsdp.cpp trains 8 steps at W = 2, saving at step 4; the step-4
  checkpoint, exported to DCP, is loaded by FSDP2 at W = 4 (resharded)
  with `dcp.load`, which trains on: its steps 5-8 equal fsdp.cpp's. The
  export writes each tensor on Shard(0) over the checkpoint's 2 ranks (and
  over 3 with --shards 3), as FSDP2 holds it, and both load to exactly
  the state the export through transformers' full tensors loads to
  (Qwen3-MoE, whose transformers layout fuses the experts, is exported
  whole);
- import: FSDP2 trains 8 steps at W = 4, saving at step 4 with
  `dcp.save`; the DCP directory, imported, is resumed by `fsdp train` at
  W = 2: its steps 5-8 equal FSDP2's own, which went on from the state
  it saved. (FSDP2 resuming from a DCP directory is the export's half.)

W = 2 with 2 rows per rank and W = 4 with 1 read the same 4 rows per step
(docs/training.md, "Data"), so the two sides train on the same global batch. Losses
agree within 1e-5 relative. Qwen3-MoE's FSDP2 side runs at W = 2 with 2
rows per rank instead: its load-balancing loss is computed over each
rank's own tokens (in transformers as in fsdp.cpp), so it depends on how
the batch is split across ranks, and another split is another loss
(measured: 1.8e-5 apart after 10 steps). Llama 4's experts, fused 3-D
tensors, are resharded like any other parameter (transformers' Llama 4
adds no load-balancing loss, so W = 4 applies). Also: an import into a model of another
architecture is refused, naming the tensors that differ, and writes
nothing; an export onto an existing folder is refused.
"""
import copy
import dataclasses
import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import torch

import fsdp2_alignment_test as alignment
import harness
import hf_models
import token_files

FAMILIES = ("gpt2", "llama", "qwen3_moe", "llama4")
BOUND = 1e-5
# Saved inside the warm-up (5 steps), resumed across its end: the
# schedule's position, AdamW's moments and step count all cross over.
SAVED_AT, STEPS = 4, 8


def fsdp_losses(metrics):
    lines = [json.loads(line) for line in open(metrics)]
    return {x["step"]: x["loss"] for x in lines if "loss" in x and x.get("split", "train") == "train" and "event" not in x}


def fsdp2(tokens, runs, world, jobs):
    """Trains RUNS ((directory, out, extra arguments) each) under FSDP2 at
    WORLD ranks, in one torchrun one after another (fsdp2_train.py --jobs);
    returns each one's losses by step."""
    settings = dict(alignment.SETTINGS, steps=STEPS, batch_size=4 // world)
    with open(jobs, "w") as f:
        for directory, out, extra in runs:
            os.makedirs(out, exist_ok=True)
            f.write(json.dumps(["--init-from", directory, "--data", tokens, "--losses",
                                os.path.join(out, "losses.jsonl")] + alignment.flags(settings) + extra) + "\n")
    harness.run([harness.sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                 os.path.join(os.path.dirname(__file__), "fsdp2_train.py"), "--jobs", jobs])
    return [{r["step"]: r["loss"] for r in map(json.loads, open(os.path.join(out, "losses.jsonl")))}
            for _, out, _ in runs]


def fsdp(args, directory, tokens, out, extra):
    settings = dict(alignment.SETTINGS, steps=STEPS, batch_size=2)
    harness.run([args.fsdp, "launch", "-n", "2", "--", args.fsdp, "train", "--init-from", directory, "--data", tokens,
                 "--out-dir", out, "--log-every", "1", "--tensorboard=false"] + alignment.flags(settings) + extra)
    return fsdp_losses(os.path.join(out, "metrics.jsonl"))


def compare(name, ours, theirs):
    steps = range(SAVED_AT + 1, STEPS + 1)
    missing = [s for s in steps if s not in ours or s not in theirs]
    if missing:
        harness.fail(f"{name}: no loss at steps {missing}")
    gap = max(abs(ours[s] - theirs[s]) / abs(theirs[s]) for s in steps)
    harness.check(f"{name}: steps {SAVED_AT + 1}-{STEPS}, largest loss difference", gap, BOUND)


def convert(fsdp_cli, command, *arguments):
    return subprocess.run([fsdp_cli, "ckpt", command, "--format", "dcp"] + list(arguments), capture_output=True,
                          text=True)


TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "dcp_convert.py")


def loaded_state(directory, model_dir):
    """What dcp.load puts into a fresh transformers model's and AdamW's
    state, by DCP key."""
    import torch
    import torch.distributed.checkpoint as dcp
    import transformers
    sys.path.insert(0, os.path.dirname(TOOL))
    import dcp_convert
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir),
                                                          dtype=torch.float32)
    state = dcp_convert.expected_state(model, dcp_convert.adamw(model))
    dcp.load(state, checkpoint_id=directory, no_dist=True)
    return dict(dcp_convert.flatten(state))


def chunks_per_tensor(directory):
    import torch.distributed.checkpoint as dcp
    saved = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    return {k: (len(v.chunks), v.size[0]) for k, v in saved.items() if hasattr(v, "chunks") and len(v.size) > 0}


def check_export_layouts(family, model_dir, checkpoints, exported, base):
    """The export in shards (FSDP2's Shard(0), the checkpoint's W = 2, or
    --shards 3) loads to exactly what the export through transformers'
    full tensors loads to; a model whose transformers layout differs from
    the checkpoint's (Qwen3-MoE's fused experts) is exported whole."""
    import torch
    whole = base + "whole.dcp"
    result = subprocess.run([sys.executable, TOOL, "export", checkpoints, whole, "--via-transformers"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        harness.fail(f"{family}: export --via-transformers exited {result.returncode}: {result.stderr}")
    three = base + "three.dcp"
    result = subprocess.run([sys.executable, TOOL, "export", checkpoints, three, "--shards", "3"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        harness.fail(f"{family}: export --shards 3 exited {result.returncode}: {result.stderr}")
    expected = loaded_state(whole, model_dir)
    fused = family == "qwen3_moe"
    for directory, ranks in ((exported, 2), (three, 3)):
        got = loaded_state(directory, model_dir)
        different = sorted(k for k, v in expected.items()
                           if isinstance(v, torch.Tensor) and not torch.equal(got[k], v))
        if set(got) != set(expected) or different:
            harness.fail(f"{family}: {directory} loads to another state than the whole export: "
                         f"{different[:5] or set(got) ^ set(expected)}")
        layout = chunks_per_tensor(directory)
        want = 1 if fused else None
        wrong = [f"{k} ({n} chunks, {rows} rows)" for k, (n, rows) in layout.items()
                 if n != (want or min(ranks, rows))]
        if wrong:
            harness.fail(f"{family}: {directory}: expected " + ("whole tensors" if fused else f"Shard(0) over {ranks}") +
                         f", got {wrong[:4]}")
        print(f"{family}: export " + ("whole (transformers' fused layout)" if fused else f"on Shard(0) over {ranks} ranks") +
              f" loads equal to the whole export ({len(expected)} keys)")


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    tokens = os.path.join(work, "tokens.bin")
    token_files.write(tokens, token_files.learnable_stream(16384, hf_models.VOCAB))
    def world_of(family):
        return 2 if family == "qwen3_moe" else 4

    ours = {}
    for family in FAMILIES:
        directory = os.path.join(work, family)
        hf_models.write_model(family, directory)
        base = os.path.join(work, family + "-")

        # fsdp.cpp -> DCP, for FSDP2 to resume below
        ours[family] = fsdp(args, directory, tokens, base + "fsdp", ["--save-every", str(SAVED_AT)])
        exported = base + "exported.dcp"
        result = convert(args.fsdp, "export", os.path.join(base + "fsdp", "checkpoints", f"step_{SAVED_AT:08d}"), exported)
        if result.returncode != 0:
            harness.fail(f"{family}: export exited {result.returncode}: {result.stdout} {result.stderr}")
        check_export_layouts(family, directory, os.path.join(base + "fsdp", "checkpoints", f"step_{SAVED_AT:08d}"),
                             exported, base)
        again = convert(args.fsdp, "export", os.path.join(base + "fsdp", "checkpoints"), exported)
        if again.returncode == 0 or "exists" not in again.stderr:
            harness.fail(f"{family}: an export onto an existing folder was not refused: {again.stderr}")

    # FSDP2, one torchrun per world size: it resumes each export, and trains
    # each family from the start, saving to DCP at SAVED_AT.
    for world in sorted({world_of(family) for family in FAMILIES}):
        families = [family for family in FAMILIES if world_of(family) == world]
        runs = []
        for family in families:
            directory, base = os.path.join(work, family), os.path.join(work, family + "-")
            runs.append((directory, base + "fsdp2-resumed", ["--resume-dcp", base + "exported.dcp"]))
            runs.append((directory, base + "fsdp2", ["--save-dcp", base + "fsdp2.dcp", "--save-dcp-at", str(SAVED_AT)]))
        losses = fsdp2(tokens, runs, world, os.path.join(work, f"fsdp2-jobs-w{world}.jsonl"))
        for i, family in enumerate(families):
            compare(f"{family}: fsdp.cpp checkpoint -> DCP -> FSDP2 (W=2 -> {world})", losses[2 * i], ours[family])
            ours[family, "continued"] = losses[2 * i + 1]

    # FSDP2 -> DCP -> fsdp.cpp
    for family in FAMILIES:
        directory, base = os.path.join(work, family), os.path.join(work, family + "-")
        imported = base + "imported"
        result = convert(args.fsdp, "import", base + "fsdp2.dcp", imported, "--model", directory)
        if result.returncode != 0:
            harness.fail(f"{family}: import exited {result.returncode}: {result.stdout} {result.stderr}")
        resumed = fsdp(args, directory, tokens, base + "fsdp-resumed", ["--ckpt-dir", imported])
        compare(f"{family}: FSDP2 DCP -> fsdp.cpp (W={world_of(family)} -> 2)", resumed, ours[family, "continued"])

    # Another architecture's DCP directory: refused by name, nothing written.
    wrong = os.path.join(work, "wrong-import")
    result = convert(args.fsdp, "import", os.path.join(work, "gpt2-fsdp2.dcp"), wrong, "--model", os.path.join(work, "llama"))
    if result.returncode == 0 or "missing" not in result.stderr or os.path.exists(wrong):
        harness.fail(f"a GPT-2 DCP directory imported as Llama was not refused by name: {result.stderr}")
    print("refused: " + result.stderr.strip().splitlines()[-1][:300])

    # [Note: DCP metadata is a pickle]: a .metadata naming code to run is
    # refused unread; the code runs only when the user says they trust it.
    hostile = os.path.join(work, "hostile.dcp")
    shutil.copytree(os.path.join(work, "gpt2-fsdp2.dcp"), hostile)
    marker = os.path.join(work, "the-pickle-ran")

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (marker,))

    with open(os.path.join(hostile, ".metadata"), "wb") as f:
        pickle.dump(Payload(), f)
    result = convert(args.fsdp, "import", hostile, os.path.join(work, "hostile-import"), "--model",
                     os.path.join(work, "gpt2"))
    if result.returncode == 0 or os.path.exists(marker) or "--trust-dcp-metadata" not in result.stderr:
        harness.fail(f"a .metadata that runs code was not refused unread: {result.stderr}")
    print("refused: " + result.stderr.strip().splitlines()[-1][:300])
    convert(args.fsdp, "import", hostile, os.path.join(work, "hostile-trusted"), "--model", os.path.join(work, "gpt2"),
            "--trust-dcp-metadata")
    if not os.path.exists(marker):
        harness.fail("--trust-dcp-metadata did not load the .metadata as given")

    # A .metadata of DCP's own classes that points past its entries: a byte
    # entry (train_state.step) moved to a pickle that runs code, appended to
    # the data file; a tensor read from a file outside the directory. Both
    # refused, nothing run, unless --trust-dcp-metadata.
    with open(os.path.join(work, "gpt2-fsdp2.dcp", ".metadata"), "rb") as f:
        honest = pickle.load(f)  # written by dcp.save in this test

    def forged(name, change):
        directory = os.path.join(work, name)
        shutil.copytree(os.path.join(work, "gpt2-fsdp2.dcp"), directory)
        meta = copy.deepcopy(honest)
        change(directory, meta)
        with open(os.path.join(directory, ".metadata"), "wb") as f:
            pickle.dump(meta, f)
        return directory

    byte_marker = os.path.join(work, "the-byte-entry-ran")

    class BytePayload:
        def __reduce__(self):
            return (os.mkdir, (byte_marker,))

    def code_in_step(directory, meta):
        index = next(i for i in meta.storage_data if i.fqn == "train_state.step")
        info = meta.storage_data[index]
        payload = pickle.dumps(BytePayload())
        data_file = os.path.join(directory, info.relative_path)
        offset = os.path.getsize(data_file)
        with open(data_file, "ab") as f:
            f.write(payload)
        meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(payload))

    def outside(directory, meta):
        index = next(i for i in meta.storage_data if i.fqn.startswith("model."))
        info = meta.storage_data[index]
        meta.storage_data[index] = dataclasses.replace(info, relative_path="../gpt2-fsdp2.dcp/" + info.relative_path)

    for name, change, expected in (("bytes", code_in_step, "train_state.step is not plain data"),
                                   ("outside", outside, "which is not a file of the directory")):
        directory = forged("hostile-" + name + ".dcp", change)
        out = os.path.join(work, "hostile-" + name + "-import")
        result = convert(args.fsdp, "import", directory, out, "--model", os.path.join(work, "gpt2"))
        if result.returncode == 0 or expected not in result.stderr or os.path.exists(byte_marker) \
                or os.path.exists(out):
            harness.fail(f"a forged DCP directory ({name}) was not refused: {result.stderr[-600:]}")
        print("refused: " + result.stderr.strip().splitlines()[-1][:300])
    convert(args.fsdp, "import", os.path.join(work, "hostile-bytes.dcp"), os.path.join(work, "hostile-bytes-trusted"),
            "--model", os.path.join(work, "gpt2"), "--trust-dcp-metadata")
    if not os.path.exists(byte_marker):
        harness.fail("--trust-dcp-metadata did not load the byte entry as given")

    # A data file that is a symbolic link out of the directory (to the
    # honest copy's own file, and to a file that is no DCP data at all), and
    # training state a checkpoint cannot hold: each refused in one line,
    # nothing written, with or without --trust-dcp-metadata for the links.
    def linked(target):
        def change(directory, meta):
            info = next(i for f, i in meta.storage_data.items() if f.fqn.startswith("model."))
            path = os.path.join(directory, info.relative_path)
            os.remove(path)
            os.symlink(target, path)
        return change

    not_dcp = os.path.join(work, "not-dcp.bin")
    with open(not_dcp, "wb") as f:
        f.write(b"\0" * 4096)

    def train_state(fqn, value):
        def change(directory, meta):
            index = next(i for i in meta.storage_data if i.fqn == fqn)
            info = meta.storage_data[index]
            blob = io.BytesIO()
            torch.save(value, blob)
            data_file = os.path.join(directory, info.relative_path)
            offset = os.path.getsize(data_file)
            with open(data_file, "ab") as f:
                f.write(blob.getvalue())
            meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob.getvalue()))
        return change

    honest_data = os.path.abspath(os.path.join(work, "gpt2-fsdp2.dcp", next(
        i.relative_path for f, i in honest.storage_data.items() if f.fqn.startswith("model."))))
    cases = [("link-out", linked(honest_data), "is a symbolic link", True),
             ("link-not-dcp", linked(not_dcp), "is a symbolic link", True)]
    for fqn, values in (("train_state.step", (2 ** 70, -5, "abc", float("nan"))),
                        ("train_state.tokens_seen", (2 ** 63 - 1, -1))):
        for i, value in enumerate(values):
            cases.append((f"{fqn.split('.')[1]}-{i}", train_state(fqn, value),
                          f"holds {fqn} = {value!r:.80}: expected a whole number from 0 to 2^62", False))
    for name, change, expected, also_trusted in cases:
        directory = forged("hostile-" + name + ".dcp", change)
        for trusted in ((False, True) if also_trusted else (False,)):
            out = os.path.join(work, f"hostile-{name}-import{'-trusted' if trusted else ''}")
            result = convert(args.fsdp, "import", directory, out, "--model", os.path.join(work, "gpt2"),
                             *(["--trust-dcp-metadata"] if trusted else []))
            if result.returncode == 0 or expected not in result.stderr or os.path.exists(out) \
                    or "Traceback" in result.stderr:
                harness.fail(f"{name} (trusted: {trusted}) was not refused in one line: {result.stderr[-800:]}")
            print("refused: " + result.stderr.strip().splitlines()[-1][:300])


if __name__ == "__main__":
    main()
