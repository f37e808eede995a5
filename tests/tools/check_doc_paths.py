#!/usr/bin/env python3
"""Every repository path the documentation names must exist.

Usage: check_doc_paths.py [REPO_ROOT]   (default: two folders above this file)

Scans README.md, CONTRIBUTING.md and docs/*.md. Exits 0 when every path
exists, 1 listing `file:line: missing PATH` for each one that does not.
Standard library only, so it runs without the venv (CTest `doc_paths`).
A path exists when it is in the working tree (file or folder).

What is checked:
- Markdown link and image targets, `[text](target)` and `![alt](target)`,
  relative to the file that holds them. Targets with a scheme (https:,
  mailto:) are not checked. A `#anchor` into a Markdown file (or into the
  same file, `(#anchor)`) must be one of that file's headings, slugged as
  GitHub slugs them (lower case; backquotes and punctuation other than
  `-` and `_` dropped; spaces to `-`; repeats get `-1`, `-2`, ...).
- Words of inline code (`...`, which may wrap within a paragraph) and of
  fenced code blocks that look like repository paths, taken relative to
  the repository root: a word that starts with one of CHECKED_DIRS (those
  that exist) followed by `/`, or that is one of CHECKED_FILES. Quotes,
  brackets and trailing punctuation around a word are stripped first, and
  a `:LINE` suffix is dropped.

What is skipped, because it is not in a fresh clone or is not one path:
- words under any other folder: build outputs (`build/fsdp`,
  `build-cuda/`), run outputs (`out/...`, `OUT/...`, `DIR/...`), `data/`
  (fetched at run time by scripts/fetch_data.sh), `.venv/`, `/tmp/...`;
  a word is not taken apart, so `--config=configs/x.yaml` and
  `"fsdp/distributed/collectives.h"` (an #include) are not checked;
- globs and placeholders: a word containing `*`, `?`, `<`, `>`, `$`, `{`,
  `}`, `...` or `…` (`tests/fuzz/fuzz_<name>.cpp`, `requirements*.txt`),
  or with a path component in capitals only (`tests/FILE`);
- prose outside code spans and links.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Top-level folders whose paths are checked (those that exist are used).
CHECKED_DIRS = ("apps", "src", "include", "tests", "scripts", "docs", "bench", "tools", "cmake", "examples", ".ci",
                "configs", "proto")
# Top-level files a document may name without a folder.
CHECKED_FILES = ("CMakeLists.txt", "README.md", "CONTRIBUTING.md", "requirements.txt", "requirements-cuda.txt",
                 ".clang-format")

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
PLACEHOLDER = re.compile(r"[*?<>${}]|\.\.\.|…")
STRIP = "\"'`()[]{},;"


def slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    fence = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def candidate(word: str, dirs: tuple[str, ...] = CHECKED_DIRS) -> str | None:
    """The repository path a code word names, or None when it names none."""
    word = word.strip(STRIP).rstrip(".:,;")
    word = re.sub(r":\d+$", "", word)
    if not word or PLACEHOLDER.search(word):
        return None
    head = word.split("/", 1)[0]
    if "/" not in word:
        return word if word in CHECKED_FILES else None
    if head not in dirs:
        return None
    if any(re.fullmatch(r"[A-Z_]+", part) for part in word.split("/")[1:]):
        return None
    return word


def paragraphs(text: str):
    """(first line number, text, is_code) for each fenced block's line and
    each paragraph outside fences (code spans and links stay within one)."""
    fence = False
    para: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if para:
                yield start, "\n".join(para), False
                para = []
            fence = not fence
            continue
        if fence:
            yield number, line, True
        elif not line.strip():
            if para:
                yield start, "\n".join(para), False
                para = []
        else:
            if not para:
                start = number
            para.append(line)
    if para:
        yield start, "\n".join(para), False


def check(root: Path, checked: list[str] | None = None) -> list[str]:
    """Problems found, one line each; `checked` collects what was looked at."""
    dirs = tuple(d for d in CHECKED_DIRS if (root / d).is_dir())
    docs = [root / "README.md", root / "CONTRIBUTING.md"] + sorted((root / "docs").glob("*.md"))
    problems = []
    anchor_cache: dict[Path, set[str]] = {}
    for doc in docs:
        if not doc.exists():
            continue
        rel = doc.relative_to(root).as_posix()
        for first, text, is_code in paragraphs(doc.read_text(encoding="utf-8")):
            words: list[tuple[int, str]] = []  # (line number, word)
            if is_code:
                words = [(first, w) for w in text.split()]
            else:
                for m in INLINE_CODE.finditer(text):
                    number = first + text.count("\n", 0, m.start(2))
                    words += [(number, w) for w in m.group(2).split()]
                prose = INLINE_CODE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
                for m in LINK.finditer(prose):
                    number = first + prose.count("\n", 0, m.start(1))
                    target = m.group(1)
                    if SCHEME.match(target):
                        continue
                    if checked is not None:
                        checked.append(target)
                    path, _, anchor = target.partition("#")
                    file = (doc.parent / path).resolve() if path else doc
                    if path and not file.exists():
                        problems.append(f"{rel}:{number}: missing {target} (link)")
                        continue
                    if anchor and file.suffix == ".md" and file.is_file():
                        if file not in anchor_cache:
                            anchor_cache[file] = anchors(file)
                        if anchor not in anchor_cache[file]:
                            problems.append(f"{rel}:{number}: missing heading #{anchor} in {path or rel} (link)")
            for number, word in words:
                path = candidate(word, dirs)
                if path is not None and checked is not None:
                    checked.append(path)
                if path is not None and not (root / path).exists():
                    problems.append(f"{rel}:{number}: missing {path}")
    return problems


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]).resolve()
    if not (root / "README.md").is_file():
        print(f"check_doc_paths: no README.md in {root}", file=sys.stderr)
        return 1
    checked: list[str] = []
    problems = check(root, checked)
    for p in problems:
        print(p)
    if problems:
        print(f"check_doc_paths: {len(problems)} of {len(checked)} paths and links named in the docs do not exist")
        return 1
    print(f"check_doc_paths: all {len(checked)} paths and links named in README.md, CONTRIBUTING.md and docs/*.md "
          "exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
