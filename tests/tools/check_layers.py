#!/usr/bin/env python3
"""Every layer includes only the layers below it.

Usage: check_layers.py [REPO_ROOT]   (default: two folders above this file)

Reads the `#include "fsdp/<layer>/..."` lines (and `#include "kernels/..."`,
the private kernels' own form) of every file under include/fsdp/<layer>/ and
src/<layer>/, src/kernels/ included. Exit 0 when each names only its own
layer or one that ALLOWED lists for it; 1 listing `file:line: layer includes
other (allowed: ...)` for each that does not, or for a layer folder that
ALLOWED does not know. Standard library only, so it runs without the venv.
apps/, tests/ and bench/ (the folder at the top) may include any layer and
are not read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Layer -> the layers it may include, from CONTRIBUTING.md's order (common,
# distributed, launch, core, optim, kernels, then the rest). A layer always may
# include itself.
ALLOWED: dict[str, tuple[str, ...]] = {
    "common": (),
    # Element loops without LibTorch: nothing of the project.
    "kernels": (),
    "io": ("common",),
    "distributed": ("common",),
    # The launcher: included by apps/ only.
    "launch": ("common", "io", "distributed"),
    "core": ("common", "distributed", "kernels"),
    "optim": ("common", "kernels"),
    # The layers models are built from; FSDP (core) comes after, in models.
    "nn": ("common", "kernels"),
    "data": ("common", "io"),
    "checkpoint": ("common", "io", "distributed", "core"),
    # Layers cut across ranks: nn's layers and the collectives under them.
    "tensor_parallel": ("common", "distributed", "nn"),
    # Models and their Hugging Face adapters, including a checkpoint's export.
    "models": ("common", "io", "distributed", "core", "kernels", "nn", "checkpoint", "tensor_parallel"),
    # plan: the model shapes (plan/memory_model.h) a step's matmuls are read from.
    "bench": ("common", "io", "distributed", "core", "optim", "nn", "data", "models", "plan"),
    "train": ("common", "io", "distributed", "core", "optim", "nn", "data", "checkpoint", "models"),
    # Predicting a run's memory from the model's shapes (fsdp plan).
    "plan": ("common", "io", "distributed", "core", "nn", "models", "train"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"(?:fsdp/([a-z_]+)/|(kernels)/)')
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".inc"}


def layer_files(root: Path):
    """(layer, path) for every source and header of a layer."""
    for base in (root / "include" / "fsdp", root / "src"):
        if not base.is_dir():
            continue
        for folder in sorted(p for p in base.iterdir() if p.is_dir()):
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                    yield folder.name, path


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    problems: list[str] = []
    checked = 0
    for layer, path in layer_files(root):
        rel = path.relative_to(root)
        if layer not in ALLOWED:
            problems.append(f"{rel}: layer '{layer}' is not in the matrix of tests/tools/check_layers.py; add it there "
                            "and to CONTRIBUTING.md's Layout")
            continue
        checked += 1
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if match is None:
                continue
            other = match.group(1) or match.group(2)
            if other == layer or other in ALLOWED[layer]:
                continue
            allowed = ", ".join(ALLOWED[layer]) or "no other layer"
            problems.append(f"{rel}:{number}: {layer} includes {other} ({line.strip()}); "
                            f"{layer} may include: {allowed}")
    if checked == 0:
        problems.append(f"no layer files under {root}/include/fsdp or {root}/src: wrong repository root?")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layer order (matrix in tests/tools/check_layers.py)")
        return 1
    print(f"check_layers: {checked} files, every include within its layer's allowed ones")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
