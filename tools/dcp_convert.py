#!/usr/bin/env python3
"""Converts an fsdp.cpp checkpoint into a PyTorch Distributed Checkpoint
(DCP) directory that an FSDP2 job loads, at any world size:

  tools/dcp_convert.py export CHECKPOINT OUT [--shards N] [--via-transformers]
  tools/dcp_convert.py import DCP_DIR --model HF_DIR OUT


CHECKPOINT is a checkpoint directory (`step_N/`) or the folder holding
`latest` (`--ckpt-dir`, or a run's `checkpoints/`). OUT gets what
`torch.distributed.checkpoint.save` writes for

  {"model": get_model_state_dict(model),
   "optim": get_optimizer_state_dict(model, optimizer),
   "train_state": {"step": N, "tokens_seen": T}}

with `model` the checkpoint's architecture as `transformers` builds it and
`optimizer` AdamW: the keys an FSDP2 training script saves with the DCP
API (PyTorch's FSDP2 example with --dcp-api, torchtitan), so the same
script loads it with `dcp.load` into its sharded model and optimizer.
Where the checkpoint's tensors are the model's, each is written as FSDP2
holds it, Shard(0) over the checkpoint's world size (--shards N for
another), by that many processes each reading only its rows: no full
tensor is made ([Note: exporting shards as they are]). Otherwise, and
with --via-transformers, the tensors are loaded whole through transformers.

`import` reads such a DCP directory (an FSDP2 run's, saved at any world
size) into the model HF_DIR/config.json describes and writes OUT as a
`--ckpt-dir` that `fsdp train` resumes from: one rank's checkpoint, which
any world size and strategy reads (resharding on load). A DCP directory
whose tensors do not match the model (names or shapes) is refused with
the names that differ, and nothing is written.

Why Python: DCP's `.metadata` is a pickle of PyTorch's own Python classes,
and its layout has changed between releases; `dcp.save` writes what the
installed PyTorch reads. The model's names and layouts (transformers' fused
expert tensors, for one) come from transformers' own loading, applied to
the weights and to each AdamW moment alike. Training stays free of Python:
this runs once, after it.

Needs the venv scripts/setup.sh makes (torch, transformers, safetensors).
"""
import argparse
import faulthandler
import json
import os
import pickle
import sys
import tempfile
import warnings
import zlib

import torch
import torch.distributed.checkpoint as dcp
import transformers
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

# dcp.save/load without a process group say they assume one process: they do.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

MOMENTS = ("exp_avg", "exp_avg_sq")


def fail(message):
    sys.exit(f"error: {message}")


def checkpoint_dir(path):
    latest = os.path.join(path, "latest")
    if os.path.exists(latest):
        target = os.readlink(latest) if os.path.islink(latest) else open(latest).read().strip()
        path = os.path.join(path, target) if not os.path.isabs(target) else target
    if not os.path.isfile(os.path.join(path, "metadata.json")):
        fail(f"'{path}' is not an fsdp.cpp checkpoint (expected metadata.json, or a folder with 'latest')")
    return path


def read_metadata(path):
    """metadata.json, with each parameter's AdamW step as "adam_step" and
    "tensor_prefix" naming where its tensors lie in the rank files: versions
    1-2 held the trainer's AdamW alone ("exp_avg/<name>", params[].adam_step);
    version 3 holds any optimizer, the trainer's named "optimizer"
    ("optimizer/optimizer/exp_avg/<name>", optimizers.optimizer.state)."""
    meta = json.load(open(os.path.join(path, "metadata.json")))
    if meta.get("format") != "fsdp.cpp-checkpoint":
        fail(f"{path}/metadata.json: format {meta.get('format')!r}, expected 'fsdp.cpp-checkpoint'")
    if meta.get("version", 1) >= 3:
        optimizer = meta.get("optimizers", {}).get("optimizer")
        if optimizer is None or optimizer.get("kind") != "adamw":
            kind = "none" if optimizer is None else optimizer.get("kind")
            fail(f"{path}: a DCP export carries the trainer's AdamW (an optimizer named 'optimizer'); this "
                 f"checkpoint's is {kind}")
        for name, p in meta["params"].items():
            p["adam_step"] = optimizer["state"].get(name, {}).get("step", 0)
        meta["tensor_prefix"] = {"model": "model/", **{k: f"optimizer/optimizer/{k}/" for k in MOMENTS}}
    else:
        meta["tensor_prefix"] = {k: f"{k}/" for k in ("model",) + MOMENTS}
    for name, p in meta["params"].items():
        p["tensor_names"] = {kind: prefix + name for kind, prefix in meta["tensor_prefix"].items()}
    return meta


def open_rank_files(path, meta):
    files = {}
    for f in meta["files"]:
        name = os.path.join(path, f["name"])
        if not os.path.isfile(name) or os.path.getsize(name) != f["bytes"]:
            fail(f"{name}: missing, or not the {f['bytes']} bytes metadata.json records")
        files[f["rank"]] = safe_open(name, "pt")
    return files


def read_checkpoint(path):
    """(metadata, {kind: {name: full tensor}}) for kind in model, exp_avg, exp_avg_sq."""
    meta = read_metadata(path)
    files = open_rank_files(path, meta)
    tensors = {kind: {} for kind in ("model",) + MOMENTS}
    for name, p in meta["params"].items():
        for kind in tensors:
            pieces = sorted(p["shards"], key=lambda s: s["begin"])
            flat = [files[s["rank"]].get_tensor(meta["tensor_prefix"][kind] + name) for s in pieces if s["count"] > 0]
            full = torch.cat(flat) if flat else torch.zeros(0)
            numel = 1
            for d in p["shape"]:
                numel *= d
            if full.numel() != numel:
                fail(f"{path}: {kind}/{name} has {full.numel()} elements in the rank files, its shape {p['shape']} "
                     f"needs {numel}")
            tensors[kind][name] = full.view(p["shape"]).float()
    return meta, tensors


def as_transformers(config, tensors, work, label):
    """`tensors` (Hugging Face checkpoint names) loaded by transformers into
    the model `config` describes: its state, in its own names and layouts."""
    directory = os.path.join(work, label)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(config)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "model.safetensors"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                                     output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        fail(f"transformers loading the checkpoint's {label}: {problems}")
    return model


def export(args):
    path = checkpoint_dir(args.checkpoint)
    if os.path.exists(args.out):
        fail(f"'{args.out}' exists; DCP output goes to a new folder")
    meta = read_metadata(path)
    if not args.via_transformers:
        sources = direct_sources(meta)
        if sources is not None:
            return export_shards(path, meta, sources, args.out, args.shards or meta["world_size"])
    meta, tensors = read_checkpoint(path)
    config = yaml.safe_load(meta["config"])["optim"]  # the run's config.yaml, as fsdp.cpp wrote it
    with tempfile.TemporaryDirectory() as work:
        model = as_transformers(meta["hf_config"], tensors["model"], work, "model")
        moments = {k: dict(as_transformers(meta["hf_config"], tensors[k], work, k).named_parameters()) for k in MOMENTS}
        params = dict(model.named_parameters())
        optimizer = adamw(model, float(config["weight_decay"]), float(config["lr"]),
                          (float(config["beta1"]), float(config["beta2"])), float(config["eps"]))
        steps = {p["adam_step"] for p in meta["params"].values() if p["adam_step"] > 0}
        for name, p in params.items():
            optimizer.state[p] = {"step": torch.tensor(float(max(steps, default=0))),
                                  **{k: moments[k][name].detach().clone() for k in MOMENTS}}
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
                 "train_state": {"step": meta["step"], "tokens_seen": meta["trainer"]["tokens_seen"]}}
        dcp.save(state, checkpoint_id=args.out + ".tmp", no_dist=True)
        os.rename(args.out + ".tmp", args.out)  # the folder appears whole
    print(f"wrote {args.out}: DCP checkpoint of step {meta['step']} ({len(state['model'])} model tensors, "
          f"AdamW state for {len(state['optim']['state'])}), from {path}")


# [Note: exporting shards as they are]
# When every tensor of the model's state (as transformers names and shapes
# it) is one of the checkpoint's parameters, the export writes each in
# FSDP2's own layout, Shard(0) over N ranks (the checkpoint's world size
# unless --shards says otherwise): N processes, each reading only its rows
# of each parameter and moment from the rank files (a row chunk is one
# range of the flattened parameter, whatever layout saved it), saving them
# as DTensors with dcp.save. No process holds a full tensor. Models whose
# transformers layout differs from the checkpoint's (Qwen3-MoE's fused
# experts) go through transformers' own loading, with full tensors, as
# --via-transformers does for any model; both load to the same state.
def meta_model(hf_config):
    """The model hf_config describes, on the meta device: names and shapes, no memory."""
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "config.json"), "w") as f:
            f.write(hf_config)
        config = transformers.AutoConfig.from_pretrained(work)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def direct_sources(meta):
    """{model state key: checkpoint parameter} when every key is a checkpoint
    parameter of the same shape (a tied key: the parameter it shares, so
    both read one source) and every checkpoint parameter is used, else None."""
    model = meta_model(meta["hf_config"])
    state = get_model_state_dict(model)
    params = meta["params"]
    sources = {}
    first_name = {id(p): name for name, p in model.named_parameters()}  # a tied parameter's first name
    for key, tensor in state.items():
        try:
            same = [first_name.get(id(model.get_parameter(key)), key), key]
        except AttributeError:  # a buffer
            same = [key]
        found = [k for k in same if k in params and list(tensor.shape) == params[k]["shape"]]
        if not found:
            return None
        sources[key] = found[0]
    return sources if set(sources.values()) == set(params) else None


def read_rows(files, entry, kind, name, begin_row, rows):
    """Rows [begin_row, begin_row + rows) of a saved tensor: one range of its
    flattened elements, copied from the rank files' pieces that overlap it."""
    shape = entry["shape"]
    inner = 1
    for d in shape[1:]:
        inner *= d
    lo, n = begin_row * inner, rows * inner
    out = torch.empty(n, dtype=torch.float32)
    covered = 0
    for piece in entry["shards"]:
        pb, pn = piece["begin"], piece["count"]
        a, b = max(lo, pb), min(lo + n, pb + pn)
        if b <= a:
            continue
        out[a - lo:b - lo] = files[piece["rank"]].get_slice(entry["tensor_names"][kind])[a - pb:b - pb].float()
        covered += b - a
    if covered != n:
        fail(f"{kind}/{name}: the rank files hold {covered} elements for rows {begin_row}..{begin_row + rows}'s {n} "
             "(a piece missing or overlapping)")
    return out.view([rows] + shape[1:])


def export_rank(rank, world, port, path, meta, sources, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    mesh = init_device_mesh("cpu", (world,))
    files = open_rank_files(path, meta)
    params = meta["params"]

    def local(kind, name):
        entry = params[name]
        shape = entry["shape"]
        if not shape:
            return DTensor.from_local(read_rows(files, dict(entry, shape=[1]), kind, name, 0, 1).view([]), mesh,
                                      [Replicate()], run_check=False)
        chunk = -(-shape[0] // world)
        begin = min(rank * chunk, shape[0])
        rows = min(chunk, shape[0] - begin)
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(read_rows(files, entry, kind, name, begin, rows), mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size(shape), stride=stride)

    model = meta_model(meta["hf_config"])
    config = yaml.safe_load(meta["config"])["optim"]
    optimizer = adamw(model, float(config["weight_decay"]), float(config["lr"]),
                      (float(config["beta1"]), float(config["beta2"])), float(config["eps"]))
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    steps = {p["adam_step"] for p in params.values() if p["adam_step"] > 0}
    step = torch.tensor(float(max(steps, default=0)))
    named = [name for name, _ in model.named_parameters()]
    state = {"model": {key: local("model", source) for key, source in sources.items()},
             "optim": {"state": {name: {"step": step.clone(), **{k: local(k, sources[name]) for k in MOMENTS}}
                                 for name in named},
                       "param_groups": groups},
             "train_state": {"step": meta["step"], "tokens_seen": meta["trainer"]["tokens_seen"]}}
    dcp.save(state, checkpoint_id=out + ".tmp")
    torch.distributed.barrier()
    if rank == 0:
        os.rename(out + ".tmp", out)  # the folder appears whole
    torch.distributed.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def export_shards(path, meta, sources, out, world):
    import torch.multiprocessing
    # Forked, not spawned: each rank starts with torch and transformers
    # already imported (a spawned one imports them again, seconds each).
    # Before this point only meta-device tensors were made (direct_sources),
    # which start no intra-op thread pool, so none is copied half-way into
    # the children. A CPU tensor operation added before this call must go
    # after it, or the ranks must be spawned again.
    torch.multiprocessing.start_processes(export_rank, args=(world, free_port(), path, meta, sources, out),
                                          nprocs=world, start_method="fork")
    print(f"wrote {out}: DCP checkpoint of step {meta['step']} ({len(sources)} model tensors with their AdamW "
          f"state), each on Shard(0) over {world} ranks as FSDP2 holds it, from {path}")


def expected_state(model, optimizer):
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer),
            "train_state": {"step": 0, "tokens_seen": 0}}


def adamw(model, weight_decay=0.1, lr=3e-4, betas=(0.9, 0.95), eps=1e-8):
    """AdamW with fsdp.cpp's groups: decay on parameters of 2 or more dimensions."""
    params = [p for p in model.parameters()]
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)


def check_compatible(directory, state):
    """Refuses a DCP directory whose tensors are not the model's, naming them."""
    saved = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    wanted = {}
    for key, value in flatten(state):
        wanted[key] = tuple(value.shape) if isinstance(value, torch.Tensor) else None
    missing = sorted(k for k in wanted if k not in saved)
    unexpected = sorted(k for k in saved if k not in wanted and k.startswith(("model.", "optim.state.")))
    shapes = sorted(f"{k} {tuple(saved[k].size)} (the model: {wanted[k]})" for k in wanted
                    if k in saved and wanted[k] is not None and hasattr(saved[k], "size")
                    and tuple(saved[k].size) != wanted[k])
    problems = [f"{label}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
                for label, names in (("missing", missing), ("not in the model", unexpected),
                                     ("of another shape", shapes)) if names]
    if problems:
        fail(f"'{directory}' does not hold this model's state; " + "; ".join(problems))


def flatten(value, prefix=""):
    """DCP's key for each leaf (its flatten_state_dict naming: dotted paths)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}{k}.")
    elif isinstance(value, list) and prefix.endswith("param_groups."):
        return  # saved as one object, not compared
    else:
        yield prefix[:-1], value


def metadata_checksum(meta):
    """fsdp.cpp's seal of metadata.json (docs/checkpoints.md): CRC-32 of its
    compact JSON without the key, keys sorted, UTF-8 as is."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    text = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return f"crc32:{zlib.crc32(text.encode('utf-8')):08x}"


# [Note: DCP metadata is a pickle]
# dcp.load reads `.metadata` with pickle.load, which runs whatever code the
# file names: a DCP directory from elsewhere could run anything here. Read
# it first with an unpickler that admits only the classes DCP itself
# writes there; anything else is refused unless --trust-dcp-metadata says
# the directory is the user's own.
DCP_PICKLE_CLASSES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        import torch.distributed.checkpoint.metadata as dcp_metadata
        if module == "torch.distributed.checkpoint.metadata" and isinstance(getattr(dcp_metadata, name, None), type):
            return getattr(dcp_metadata, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        if (module, name) in DCP_PICKLE_CLASSES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


TRUST_HINT = "If the directory is your own, --trust-dcp-metadata loads it anyway"


def check_files_are_the_directorys(directory, meta):
    """Every file the import reads is a regular file of DIRECTORY itself: a
    symbolic link would read another folder's file (or a FIFO block)."""
    names = {".metadata"} | {str(getattr(info, "relative_path", ""))
                             for info in (getattr(meta, "storage_data", None) or {}).values()}
    for name in sorted(names):
        path = os.path.join(directory, name)
        if os.path.islink(path):
            fail(f"'{path}' is a symbolic link; a DCP directory's files are read only as files of the directory "
                 f"itself (copy the file in instead)")
        if os.path.exists(path) and not os.path.isfile(path):
            fail(f"'{path}' is not a regular file (expected a file dcp.save wrote)")


def check_dcp_metadata_is_data(directory, trusted):
    check_files_are_the_directorys(directory, None)
    if trusted:
        # Its code is trusted to run; its files still must be the directory's own.
        check_files_are_the_directorys(directory, dcp.FileSystemReader(directory).read_metadata())
        return
    try:
        with open(os.path.join(directory, ".metadata"), "rb") as f:
            meta = DcpMetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        fail(f"'{directory}/.metadata' names {e}, which is not one of the classes DCP writes there; a pickle "
             f"runs the code it names, so it was not loaded. {TRUST_HINT}")
    except Exception as e:  # noqa: BLE001 - any other damage is named, not a traceback
        fail(f"'{directory}/.metadata' is not DCP metadata ({type(e).__name__}: {e})")
    # Every storage entry names a file of this directory: DCP writes flat
    # file names (`__0_0.distcp`), and a path that leaves the directory
    # would read another one's files.
    for index, info in (getattr(meta, "storage_data", None) or {}).items():
        name = str(getattr(info, "relative_path", ""))
        if not name or name in (".", "..") or os.path.basename(name) != name:
            fail(f"'{directory}/.metadata' stores {getattr(index, 'fqn', index)} at '{name}', which is not a file "
                 f"of the directory (DCP writes plain file names there). {TRUST_HINT}")
    check_files_are_the_directorys(directory, meta)


# fsdp.cpp's checkpoints count steps and tokens up to 2^62
# (kMaxCheckpointCount, include/fsdp/checkpoint/metadata.h).
MAX_COUNT = 2 ** 62


def train_count(directory, state, name):
    """train_state.NAME as a count fsdp.cpp's checkpoint can hold, or a refusal naming it."""
    value = state["train_state"][name]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        fail(f"'{directory}' holds train_state.{name} = {value!r:.80}: expected a whole number from 0 to 2^62 "
             f"(a checkpoint of fsdp.cpp counts steps and tokens that far); nothing was written")
    return value


class DataOnlyLoadPlanner(dcp.DefaultLoadPlanner):
    """DCP's default planner, with byte entries (`train_state.step`, any
    non-tensor value) read by `torch.load(weights_only=True)`: the default
    reads them with `weights_only=False`, which runs whatever code the
    bytes name."""

    refused = None  # why an entry was not loaded; DCP wraps the exception raised for it

    def load_bytes(self, read_item, value):
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as e:
            self.refused = (f"the DCP entry {read_item.dest_index.fqn} is not plain data: torch.load with "
                            f"weights_only=True refuses what its pickle names ({type(e).__name__}), and a pickle "
                            f"runs the code it names, so it was not loaded. {TRUST_HINT}")
            raise
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def write_fsdp_checkpoint(out, step, tokens_seen, hf_config, tensors, adam_steps):
    """OUT/step_N/ (metadata.json, rank_00000.safetensors) and OUT/latest, in
    fsdp.cpp's checkpoint format (docs/checkpoints.md; version 2, sealed), as
    one rank with every element."""
    name = f"step_{step:08d}"
    final = os.path.join(out, name)
    tmp = final + ".tmp"
    os.makedirs(tmp)
    data = {}
    for fqn, weight in tensors["model"].items():
        data["model/" + fqn] = weight.reshape(-1).contiguous()
        for kind in MOMENTS:
            data[f"{kind}/{fqn}"] = tensors[kind][fqn].reshape(-1).contiguous()
    data["rng/cpu"] = torch.Generator().manual_seed(0).get_state()
    rank_file = os.path.join(tmp, "rank_00000.safetensors")
    save_file(data, rank_file)
    blob = open(rank_file, "rb").read()
    meta = {"format": "fsdp.cpp-checkpoint", "version": 2, "step": step, "world_size": 1,
            "sharding": "full_shard", "mesh": [1, 1], "config": "", "hf_config": hf_config,
            "trainer": {"tokens_seen": tokens_seen, "loss_scale": 0.0},
            "files": [{"rank": 0, "name": "rank_00000.safetensors", "bytes": len(blob), "crc32": zlib.crc32(blob)}],
            "params": {fqn: {"shape": list(w.shape), "dtype": "F32", "adam_step": adam_steps[fqn],
                             "shards": [{"rank": 0, "begin": 0, "count": w.numel()}]}
                       for fqn, w in tensors["model"].items()}}
    meta["checksum"] = metadata_checksum(meta)
    with open(os.path.join(tmp, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=1)
    os.rename(tmp, final)
    with open(os.path.join(out, "latest.tmp"), "w") as f:
        f.write(name + "\n")
    os.rename(os.path.join(out, "latest.tmp"), os.path.join(out, "latest"))
    return final


def checkpoint_layout(model, values, work, label):
    """VALUES ({parameter name: tensor}, in the model's names and layouts)
    as transformers saves them: the checkpoint's names and layouts."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(values[name])
    directory = os.path.join(work, label)
    model.save_pretrained(directory)
    from safetensors.torch import load_file
    return load_file(os.path.join(directory, "model.safetensors"))


def import_(args):
    if not os.path.isfile(os.path.join(args.dcp, ".metadata")):
        fail(f"'{args.dcp}' is not a DCP checkpoint (expected the .metadata that dcp.save writes)")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        fail(f"--model '{args.model}' has no config.json (expected a Hugging Face model directory)")
    if os.path.exists(os.path.join(args.out, "latest")):
        fail(f"'{args.out}' already holds checkpoints; import into a new folder")
    hf_config = open(os.path.join(args.model, "config.json")).read()
    config = transformers.AutoConfig.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    optimizer = adamw(model)
    state = expected_state(model, optimizer)
    check_dcp_metadata_is_data(args.dcp, args.trust_dcp_metadata)
    check_compatible(args.dcp, state)
    planner = None if args.trust_dcp_metadata else DataOnlyLoadPlanner()
    try:
        dcp.load(state, checkpoint_id=args.dcp, no_dist=True, planner=planner)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        if planner is not None and planner.refused:
            fail(planner.refused)
        last = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        fail(f"'{args.dcp}' could not be read as a DCP checkpoint of this model ({type(e).__name__}: {last[:300]})")
    step = train_count(args.dcp, state, "step")
    tokens_seen = train_count(args.dcp, state, "tokens_seen")
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    params = dict(model.named_parameters())
    weights = {name: p.detach().clone() for name, p in params.items()}
    with tempfile.TemporaryDirectory() as work:
        tensors = {"model": checkpoint_layout(model, weights, work, "model")}
        for kind in MOMENTS:
            tensors[kind] = checkpoint_layout(model, {n: optimizer.state[p][kind] for n, p in params.items()}, work, kind)
    steps = {int(optimizer.state[p]["step"]) for p in params.values()}
    adam_steps = {fqn: max(steps, default=0) for fqn in tensors["model"]}
    os.makedirs(args.out, exist_ok=True)
    final = write_fsdp_checkpoint(args.out, step, tokens_seen, hf_config, tensors, adam_steps)
    print(f"wrote {final}: step {step}, {len(tensors['model'])} parameters with their AdamW moments, from {args.dcp}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="fsdp.cpp checkpoint -> DCP directory")
    e.add_argument("checkpoint")
    e.add_argument("out")
    e.add_argument("--shards", type=int, default=0,
                   help="ranks the export's Shard(0) chunks are cut for (default: the checkpoint's world size)")
    e.add_argument("--via-transformers", action="store_true",
                   help="load full tensors through transformers and save them whole, as for models whose "
                        "transformers layout differs from the checkpoint's")
    i = sub.add_parser("import", help="DCP directory -> fsdp.cpp checkpoint folder (--ckpt-dir)")
    i.add_argument("dcp")
    i.add_argument("out")
    i.add_argument("--model", required=True, help="Hugging Face directory whose config.json describes the model")
    i.add_argument("--trust-dcp-metadata", action="store_true",
                   help="load a .metadata that names classes other than DCP's own (it runs their code)")
    args = parser.parse_args()
    {"export": export, "import": import_}[args.command](args)


if __name__ == "__main__":
    faulthandler.enable()  # a crash in a native library still says where
    main()
    # Leave without the interpreter's teardown, where PyTorch's native
    # threads have been seen to abort a finished run (tests/reference/fsdp2_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
