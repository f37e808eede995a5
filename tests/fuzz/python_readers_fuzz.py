"""Fuzzes the two readers of untrusted files that are Python, not C++
(libFuzzer's targets are in this folder): a DCP directory's byte entries,
as `fsdp ckpt import --format dcp` reads them (tools/dcp_convert.py,
DataOnlyLoadPlanner.load_bytes), and a Parquet file, as `fsdp data
prepare` reads it (tools/parquet_text.py).

  python_readers_fuzz.py [--seconds N] [--seed S] [--keep DIR]

Each target mutates its seeds (bytes flipped, inserted, deleted, cut,
spliced) for N seconds (default 10 each) and holds the reader to its
promise:

- dcp_bytes: an entry is loaded as plain data (numbers, strings, tensors
  and containers of them) or refused with the tool's message naming it;
  never anything else, and no code runs (seeds include pickles that call
  os.mkdir on a marker path, which must never appear);
- parquet: the file's texts are printed, or one line names the file and
  what is wrong with it (exit 1, or 2 for a missing column); never a
  Python traceback.

A failing input is written to --keep (default: a temporary folder) and
named; the run exits 1. Deterministic for a given --seed.
"""
import argparse
import contextlib
import io
import os
import pickle
import random
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools")
sys.path.insert(0, TOOLS)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

import dcp_convert  # noqa: E402
import parquet_text  # noqa: E402


def mutate(rng, data, seeds):
    data = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(6)
        if op == 0 and data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == 1 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 2:
            at = rng.randrange(len(data) + 1)
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3 and len(data) > 1:
            at = rng.randrange(len(data))
            del data[at:at + rng.randint(1, 16)]
        elif op == 4 and data:
            del data[rng.randrange(len(data)):]
        else:
            other = rng.choice(seeds)
            at, start = rng.randrange(len(data) + 1), rng.randrange(len(other) + 1)
            data[at:] = other[start:start + rng.randint(1, 64)] + data[at:]
    return bytes(data)


def fuzz(name, seeds, check, seconds, rng, keep):
    """Runs CHECK(input) on mutated seeds until SECONDS pass; CHECK returns
    None, or what went wrong."""
    start, count = time.monotonic(), 0
    for seed in seeds:  # every seed as it is, first
        problem = check(seed)
        if problem:
            return report(name, seed, problem, keep)
    while time.monotonic() - start < seconds:
        data = mutate(rng, rng.choice(seeds), seeds)
        count += 1
        problem = check(data)
        if problem:
            return report(name, data, problem, keep)
    print(f"{name}: {count} inputs in {seconds} s, every one read or refused as promised", flush=True)
    return True


def report(name, data, problem, keep):
    path = os.path.join(keep, f"{name}-failure.bin")
    with open(path, "wb") as f:
        f.write(data)
    print(f"FAIL: {name}: {problem} (the input: {path})", flush=True)
    return False


class Payload:
    """A pickle that runs code: os.mkdir(marker) when loaded unchecked."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class ReadItem:
    class Index:
        fqn = "train_state.step"

    dest_index = Index()


PLAIN = (int, float, str, bytes, bool, type(None), torch.Tensor)


def plain(value):
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(plain(k) and plain(v) for k, v in value.items())
    return isinstance(value, PLAIN)


def dcp_bytes_seeds(marker):
    seeds = []
    for value in (4, 1 << 40, 3.5, "step", {"step": 4, "tokens_seen": 2048}, [1, 2, 3], torch.arange(4)):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        seeds.append(buffer.getvalue())
    seeds.append(pickle.dumps(Payload(marker)))
    buffer = io.BytesIO()
    torch.save({"step": Payload(marker)}, buffer)
    seeds.append(buffer.getvalue())
    return seeds


def check_dcp_bytes(marker):
    def check(data):
        planner = dcp_convert.DataOnlyLoadPlanner()
        planner.flatten_state_dict = False
        planner.state_dict = {}
        try:
            planner.load_bytes(ReadItem(), io.BytesIO(data))
        except Exception:  # noqa: BLE001 - refused: the tool must have said why
            if not (planner.refused or "").startswith("the DCP entry train_state.step is not plain data"):
                return "an entry was refused without the tool's message"
        else:
            if not plain(planner.state_dict.get("train_state.step")):
                return f"loaded as {type(planner.state_dict.get('train_state.step')).__name__}, not plain data"
        if os.path.exists(marker):
            return "the pickle's code ran"
        return None
    return check


def check_dictionary_column(work):
    """A dictionary-encoded text column is read as its texts (it was
    refused as "no text column")."""
    path = os.path.join(work, "dictionary.parquet")
    pq.write_table(pa.table({"text": pa.array(["x", "y", "x"]).dictionary_encode()}), path)
    argv, sys.argv = sys.argv, ["parquet_text.py", path, "text"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            parquet_text.main()
    finally:
        sys.argv = argv
    if out.getvalue() != '"x"\n"y"\n"x"\n':
        print(f"FAIL: a dictionary-encoded text column gave {out.getvalue()!r}", flush=True)
        return False
    print("parquet: a dictionary-encoded text column reads as its texts", flush=True)
    return True


def parquet_seeds(work):
    seeds = []
    tables = [pa.table({"text": ["a document", "another one", None, "ünïcode"]}),
              pa.table({"text": pa.array(["x", "y", "x"]).dictionary_encode(), "n": [1, 2, 3]}),
              pa.table({"body": ["only a body"]})]
    for i, table in enumerate(tables):
        for compression in ("none", "snappy"):
            path = os.path.join(work, f"seed{i}-{compression}.parquet")
            pq.write_table(table, path, compression=compression, row_group_size=2)
            with open(path, "rb") as f:
                seeds.append(f.read())
    return seeds


def check_parquet(work):
    path = os.path.join(work, "input.parquet")

    def check(data):
        with open(path, "wb") as f:
            f.write(data)
        argv, sys.argv = sys.argv, ["parquet_text.py", path, "text"]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                parquet_text.main()
        except SystemExit as e:
            message = e.code if isinstance(e.code, str) else err.getvalue().strip()
            if e.code not in (None, 0) and not str(message).startswith(f"error: '{path}'"):
                return f"exit {e.code} without naming the file: {message!r}"
        except Exception as e:  # noqa: BLE001 - the failure under test
            return f"a traceback: {type(e).__name__}: {e}"
        finally:
            sys.argv = argv
        return None
    return check


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="folder for a failing input (default: a temporary one, kept on failure)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # torch.load's notes on odd pickle protocols, one per input
    work = tempfile.mkdtemp(prefix="fsdp-python-fuzz-")
    keep = args.keep or work
    os.makedirs(keep, exist_ok=True)
    rng = random.Random(args.seed)
    marker = os.path.join(work, "the-pickle-ran")
    ok = fuzz("dcp_bytes", dcp_bytes_seeds(marker), check_dcp_bytes(marker), args.seconds, rng, keep)
    ok = check_dictionary_column(work) and ok
    ok = fuzz("parquet", parquet_seeds(work), check_parquet(work), args.seconds, rng, keep) and ok
    if ok and not args.keep:
        import shutil
        shutil.rmtree(work)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
