#!/usr/bin/env python3
"""Code the docs show as a whole program is a file the build compiles.

Usage: check_snippets.py [REPO_ROOT]   (default: two folders above this file)

In README.md and docs/*.md, a fenced block right after a line
`<!-- compiled: PATH -->` must equal PATH (relative to the root) from its
first `#include` line to its end. PATH is built and run by the test suite,
so the block compiles as shown. Exit 0 when every such block matches and at
least one exists; 1 naming each that does not. Standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MARK = re.compile(r"^<!-- compiled: (\S+) -->$")


def blocks(text: str):
    """(line number, path, block text) for each marked block."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        match = MARK.match(line.strip())
        if match is None:
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            yield i + 1, match.group(1), None
            continue
        body = []
        for rest in lines[i + 2:]:
            if rest.startswith("```"):
                break
            body.append(rest)
        yield i + 1, match.group(1), "".join(body)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    problems: list[str] = []
    found = 0
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for number, path, body in blocks(doc.read_text(encoding="utf-8")):
            found += 1
            where = f"{doc.relative_to(root)}:{number}"
            source = root / path
            if body is None:
                problems.append(f"{where}: the compiled: mark is not followed by a fenced block")
                continue
            if not source.is_file():
                problems.append(f"{where}: {path} does not exist")
                continue
            text = source.read_text(encoding="utf-8")
            start = text.find("#include")
            if start < 0 or text[start:] != body:
                problems.append(f"{where}: the block differs from {path} (from its first #include on); "
                                f"copy the file into the block")
    if found == 0:
        problems.append("no <!-- compiled: PATH --> block in README.md or docs/*.md")
    for p in problems:
        print(p)
    if not problems:
        print(f"{found} compiled block(s) match their files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
