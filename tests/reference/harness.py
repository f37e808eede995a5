"""What every reference test shares: where the built programs are, running
them with a clear failure, and comparing numbers with a stated tolerance.

Each test is a script CTest runs with the venv's Python (label
`reference`): `python TEST.py --build-dir BUILD`. A script exits 0 when
every comparison holds, 1 naming the first that does not.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(description, extra=None):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--build-dir", default=os.path.join(SOURCE_DIR, "build"))
    parser.add_argument("--work-dir", help="keep the files here (default: a temporary folder, removed)")
    if extra:
        extra(parser)
    args = parser.parse_args()
    args.fsdp = os.path.join(args.build_dir, "fsdp")
    return args


def work_dir(args):
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        return args.work_dir
    holder = tempfile.TemporaryDirectory(prefix="fsdp-reference-")
    args._holder = holder  # removed when the script ends
    return holder.name


def run(command, **kwargs):
    """Runs COMMAND (a list); on a non-zero exit prints its output and fails."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-6000:])
        sys.stderr.write(result.stderr[-6000:])
        fail(f"{' '.join(map(str, command))} exited {result.returncode}")
    return result


def job_argvs(argv):
    """The runs a training script is asked for: ARGV itself, or with
    `--jobs FILE` each line of FILE (a JSON list of arguments), to run one
    after another in the same processes."""
    if len(argv) == 2 and argv[0] == "--jobs":
        with open(argv[1]) as f:
            return [json.loads(line) for line in f if line.strip()]
    return [argv]


def fail(message):
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def relative_difference(ours, theirs):
    """max |ours - theirs| / max |theirs|: one number for a whole tensor."""
    scale = float(theirs.abs().max())
    return float((ours - theirs).abs().max()) / (scale if scale > 0 else 1.0)


def check(name, value, bound):
    print(f"{name}: {value:.3g} (bound {bound:.2g})", flush=True)
    if not value <= bound:
        fail(f"{name}: {value:.3g} exceeds {bound:.2g}")
