#!/usr/bin/env python3
"""Checkpoint I/O against the disk and against PyTorch's Distributed
Checkpoint (DCP), on the same state in the same run.

The state is a W-rank training run's: GPT-2 small's parameters and both
AdamW moments (1.49 GB), sharded over W = 2 ranks. Measured, each
`--reps` times, interleaved:

- the disk: `dd` writing the checkpoint's size as W files at once (one
  per rank, as both savers write), fsynced (`conv=fsync`, as both savers
  do), once through the page cache and once past it (`oflag=direct`, as
  fsdp.cpp writes), the faster of the two kept as the disk's rate; and
  reading them back cold;
- fsdp.cpp: `fsdp train --ckpt-dir` saving (the trainer's own "saved ...
  (X s)": every file written and fsynced, the directory renamed into place)
  and `--resume` loading ("loaded in X s": read, checksums verified, into
  the shards);
- DCP: the same tensors (`fsdp ckpt export --format dcp` of that
  checkpoint), as DTensors sharded on dim 0 over the same W ranks under
  `fsdp launch` (gloo), `dcp.save` into a new directory and `dcp.load`
  back, each timed between barriers on every rank (the slowest rank's time).
  DCP runs with its FileSystemWriter defaults (files fsynced) and with one
  writer thread per rank and two, the faster kept.

Loads are cold for everyone: before each, every file of the checkpoint is
evicted from the page cache (fsync, then posix_fadvise DONTNEED), as the
disk's read is. Rates are the checkpoint's bytes over the time.

    python3 bench/checkpoint_io.py [--reps 3] [--world 2] [--dir out/bench/checkpoint_io]

Writes out/bench/checkpoint_io.{json,md}.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDP = os.path.join(ROOT, "build", "fsdp")
VENV_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
GB = 1e9


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def evict(path):
    """Drops PATH's files (a file or a tree) from the page cache."""
    os.sync()
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout + out.stderr


def disk(directory, nbytes, streams):
    """dd's write (fsynced; through the cache and past it, the faster) and
    cold read of NBYTES in STREAMS files at once, as the savers write one
    file per rank; seconds."""
    block = 16 << 20
    count = -(-nbytes // (block * streams))
    paths = [os.path.join(directory, f"dd.{i}.bin") for i in range(streams)]

    def parallel(commands):
        start = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
        for p in procs:
            if p.wait() != 0:
                sys.exit(f"dd failed: {p.stderr.read().decode()}")
        return time.perf_counter() - start

    write = min(parallel([["dd", "if=/dev/zero", f"of={p}", f"bs={block}", f"count={count}", "conv=fsync",
                            "status=none", *flags] for p in paths])
                for flags in ([], ["oflag=direct"]))
    for p in paths:
        evict(p)
    read = parallel([["dd", f"if={p}", "of=/dev/null", f"bs={block}", "status=none"] for p in paths])
    for p in paths:
        os.remove(p)
    return write, read


def fsdp_train(world, ckpt, out, extra):
    train = [FSDP, "train", "--model", "gpt2", "--seq-len", "64", "--batch-size", "1", "--ckpt-dir", ckpt,
             "--out-dir", out, "--tensorboard=false", "--sample-tokens", "0", "--data", "synthetic", *extra]
    return run([FSDP, "launch", "-n", str(world), "--", *train])


def fsdp_save(world, ckpt, out):
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    text = fsdp_train(world, ckpt, out, ["--steps", "1"])
    return float(re.search(r"saved \S+ \(([\d.]+) s\)", text).group(1))


def fsdp_load(world, ckpt, out):
    evict(ckpt)
    text = fsdp_train(world, ckpt, out, ["--steps", "1", "--resume"])
    return float(re.search(r"loaded in ([\d.]+) s", text).group(1))


def dcp_peer(a):
    """One rank of DCP's save and load of the tensors in a.source."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    metadata = dcp.FileSystemReader(a.source).read_metadata()
    state = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not hasattr(meta, "size"):
            continue  # bytes entries (none expected)
        full = torch.empty(meta.size, dtype=meta.properties.dtype)
        placement = Shard(0) if full.dim() > 0 and full.shape[0] >= world else Replicate()
        state[key] = distribute_tensor(full, mesh, [placement])

    def timed(fn):
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    if rank == 0:
        evict(a.source)
    dist.barrier()
    load = timed(lambda: dcp.load(state, checkpoint_id=a.source))
    saves = {}
    for threads in (1, 2):
        target = f"{a.target}.{threads}"
        if rank == 0:
            shutil.rmtree(target, ignore_errors=True)
        dist.barrier()
        writer = dcp.FileSystemWriter(target, thread_count=threads)
        saves[threads] = timed(lambda: dcp.save(state, storage_writer=writer))
    if rank == 0:
        print(json.dumps({"load_s": load, "save_s": saves}))
        sys.stdout.flush()
    dist.barrier()
    os._exit(0)  # no teardown in the timing's process


def dcp_run(world, source, target):
    text = run([FSDP, "launch", "-n", str(world), "--", VENV_PYTHON, os.path.abspath(__file__), "--peer",
                "--source", source, "--target", target], env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads([line[line.index("{"):] for line in text.splitlines() if "{" in line][-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--dir", default=os.path.join(ROOT, "out", "bench", "checkpoint_io"))
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.peer:
        return dcp_peer(a)

    os.makedirs(a.dir, exist_ok=True)
    ckpt, out, dcp_dir = (os.path.join(a.dir, n) for n in ("ckpt", "run", "dcp"))
    cpu = next((l.split(":", 1)[1].strip() for l in run(["lscpu"]).splitlines() if l.startswith("Model name")), "?")
    rows = {"disk write": [], "disk read": [], "fsdp save": [], "fsdp load": [], "dcp save": [], "dcp load": []}
    nbytes = 0
    for rep in range(a.reps):
        rows["fsdp save"].append(fsdp_save(a.world, ckpt, out))
        step = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
        nbytes = tree_bytes(step)
        rows["fsdp load"].append(fsdp_load(a.world, ckpt, out))
        write, read = disk(a.dir, nbytes, a.world)
        rows["disk write"].append(write)
        rows["disk read"].append(read)
        shutil.rmtree(dcp_dir, ignore_errors=True)
        run([FSDP, "ckpt", "export", step, dcp_dir, "--format", "dcp"])
        peer = dcp_run(a.world, dcp_dir, os.path.join(a.dir, "dcp_saved"))
        rows["dcp save"].append(min(peer["save_s"].values()))
        rows["dcp load"].append(peer["load_s"])
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()), flush=True)

    median = {k: statistics.median(v) for k, v in rows.items()}
    rate = {k: nbytes / GB / s for k, s in median.items()}
    result = {"cpu": cpu, "world": a.world, "bytes": nbytes, "reps": a.reps, "seconds": rows,
              "median_s": median, "GB_per_s": rate}
    md = [f"Checkpoint I/O, GPT-2 small with AdamW state ({nbytes / GB:.2f} GB) at W = {a.world} "
          f"({cpu}); median of {a.reps}, cold loads.", "",
          "| | save s | save GB/s | load s | load GB/s |", "| --- | --- | --- | --- | --- |"]
    for name, save, load in (("disk (dd)", "disk write", "disk read"), ("fsdp.cpp", "fsdp save", "fsdp load"),
                             ("DCP", "dcp save", "dcp load")):
        md.append(f"| {name} | {median[save]:.2f} | {rate[save]:.2f} | {median[load]:.2f} | {rate[load]:.2f} |")
    md += ["", f"fsdp.cpp save / disk write: {median['fsdp save'] / median['disk write']:.2f}x the time; "
           f"load / disk read: {median['fsdp load'] / median['disk read']:.2f}x; "
           f"DCP / fsdp.cpp: save {median['dcp save'] / median['fsdp save']:.2f}x, "
           f"load {median['dcp load'] / median['fsdp load']:.2f}x"]
    os.makedirs(os.path.join(ROOT, "out", "bench"), exist_ok=True)
    with open(os.path.join(ROOT, "out", "bench", "checkpoint_io.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(ROOT, "out", "bench", "checkpoint_io.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
