#!/usr/bin/env python3
"""Every `build/fsdp ...` command the documentation shows must still parse.

Usage: check_doc_commands.py FSDP_BINARY [--root DIR] [-v]

FSDP_BINARY is the built CLI (CTest passes $<TARGET_FILE:fsdp_cli>); --root
is the repository whose README.md and docs/*.md are read and in which the
binary runs (default: two folders above this file), so a copy of the docs
can be checked. Exits 0 when every command passes, 1 listing
`file:line: COMMAND` and what is wrong for each one that does not, 2 on a
usage error. Standard library only (CTest `doc_commands`, label cli).

Which lines are commands:
- Fenced code blocks tagged sh, bash, shell, zsh or console: each line,
  after joining `\\` continuations, dropping a `$ ` prompt and a `# comment`
  (a `#` that starts a word outside quotes). In `console` blocks only `$ `
  lines are commands (the rest is output). Lines starting with `[rank` are
  output and skipped everywhere.
- Untagged (or text) fenced blocks are output samples; only a line that
  itself starts with `build/fsdp` (or `$ build/fsdp`) is taken from them.
  Blocks in other languages (cpp, yaml, ...) are skipped.
- Inline code spans (which may wrap within a paragraph) that start with
  `build/fsdp` or `build-*/fsdp`, after optional `VAR=value` words, and
  have at least one more word (a bare `build/fsdp` names the program).
  Spans such as `fsdp train` or `fsdp ckpt export/import` are prose.
- A line is split into simple commands at unquoted `|`, `||`, `&&` and `;`.
  In each, the CLI is the first word that is `build/fsdp` or `build*/fsdp`
  (so `srun build/fsdp smoke`, `torchrun ... --no-python build/fsdp smoke`
  and `echo hi | build/fsdp data encode` count), or, in a shell block only,
  a bare `fsdp` as the first word (`fsdp launch: ...` is output: a
  subcommand word ending in `:` is skipped). A line that shlex cannot
  split (an unclosed quote) is skipped.
- `fsdp launch [OPTIONS] -- PROGRAM ARGS...`: launch's options are checked,
  and PROGRAM's command too when PROGRAM is the CLI; any other PROGRAM
  (`build/examples/...`, `PROGRAM`) is not checked.

What is checked, for each command (`--help` output is cached per subcommand):
- the subcommand path exists (`ckpt inspect`, `bench comm`), and one is given
  where the CLI requires it (`fsdp ckpt` alone is an error);
- every option (`--flag`, `--flag=value`, `-n`) is one that subcommand's
  `--help` lists; values are skipped as the help's types say (`INT`, `TEXT`,
  `a|b`: one value; `[BOOL]`: an optional true/false; `TEXT ...`: values up
  to the next option);
- the positional arguments are as many as the help's Positionals allow;
- `train` commands: `--model` must be one of the presets `train --help`
  lists (`--set model.name=X` too). Then the command itself is run with
  `--print-config` appended (without the launcher, cwd = the repository
  root, so `configs/...` resolve), which must exit 0, and the effective
  `model.name` it prints must be a preset unless `model.init_from` is set.
  That run is skipped, leaving the checks above, when the command depends
  on an earlier step or is not literal: it uses `--init-from`, `--resume` or
  `--resume-from`; a path given to `--config`, `--data`, `--val-data` or
  `--tokenizer` does not exist (a missing `configs/...` file is an error,
  not a skip: configs/ is in the repository); or a word is a placeholder
  (`N`, `DIR`, `P`: capitals only; `...`; `<x>`; `$VAR`).
"""

from __future__ import annotations

import argparse
import glob as globmod
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SHELL_TAGS = {"sh", "bash", "shell", "zsh", "console", "shell-session"}
OUTPUT_TAGS = {"", "text", "txt", "output", "plain"}
CLI_WORD = re.compile(r"^(?:\./)?build[\w.+-]*/fsdp$")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|\.\.\.|…|^<.*>$|^\[.*\]$|\$")
BOOL_WORDS = {"true", "false", "1", "0", "on", "off", "yes", "no"}
SEPARATORS = {"|", "||", "&&", ";", "&", "|&"}
# train options whose value is a file that may come from an earlier step.
PATH_OPTIONS = ("--config", "--data", "--val-data", "--tokenizer")
STEP_OPTIONS = ("--init-from", "--resume", "--resume-from")


@dataclass
class Command:
    file: str
    line: int
    text: str          # the command as the doc shows it (one line)
    args: list[str]    # the words after the CLI
    in_launch: bool = False


@dataclass
class OptSpec:
    value: str  # "none", "one", "optional", "many"


@dataclass
class Help:
    ok: bool
    options: dict[str, OptSpec] = field(default_factory=dict)
    subcommands: set[str] = field(default_factory=set)
    subcommand_required: bool = False
    positionals: list[tuple[str, bool, bool]] = field(default_factory=list)  # name, required, variadic
    text: str = ""


# ----------------------------------------------------------------------------
# Extraction


def strip_comment(line: str) -> str:
    """Drops a `# comment`: a `#` at the start of a word, outside quotes."""
    quote = None
    prev = " "
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                pass
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and prev.isspace():
            return line[:i].rstrip()
        prev = ch
    return line.rstrip()


def split_words(line: str) -> list[str] | None:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        return list(lex)
    except ValueError:
        return None


def commands_in_line(file: str, lineno: int, text: str, allow_bare: bool) -> list[Command]:
    words = split_words(text)
    if words is None:
        return []
    simple: list[list[str]] = [[]]
    for w in words:
        if w in SEPARATORS:
            simple.append([])
        else:
            simple[-1].append(w)
    found = []
    for ws in simple:
        start = None
        for i, w in enumerate(ws):
            if CLI_WORD.match(w) or (allow_bare and i == 0 and w == "fsdp"):
                start = i
                break
        if start is None:
            continue
        args = ws[start + 1:]
        if args and args[0].endswith(":"):
            continue  # `fsdp launch: rank 1 ...`: output
        found.append(Command(file, lineno, text.strip(), args))
    return found


def fenced_blocks(lines: list[str]):
    """Yields (tag, [(lineno, line), ...]) for each fenced block."""
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, tag = m.group(1), m.group(2).lower()
        body = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith(fence):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        yield tag, body


def logical_lines(body: list[tuple[int, str]]):
    """Joins `\\` continuations; yields (first line number, text)."""
    pending, first = "", None
    for lineno, line in body:
        if first is None:
            first = lineno
        stripped = strip_comment(line) if not line.lstrip().startswith("#") else ""
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield first, pending + stripped
        pending, first = "", None
    if first is not None and pending.strip():
        yield first, pending


def extract(path: Path, rel: str) -> list[Command]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Command] = []
    fenced_lines = set()
    for tag, body in fenced_blocks(lines):
        fenced_lines.update(n for n, _ in body)
        if tag not in SHELL_TAGS and tag not in OUTPUT_TAGS:
            continue
        for lineno, text in logical_lines(body):
            s = text.strip()
            if not s or s.startswith("[rank"):
                continue
            prompt = s.startswith("$ ")
            if prompt:
                s = s[2:]
            if tag == "console" and not prompt:
                continue
            if tag in OUTPUT_TAGS:
                first = s.split()[0] if s.split() else ""
                if not CLI_WORD.match(first):
                    continue
            found += commands_in_line(rel, lineno, s, allow_bare=tag in SHELL_TAGS)
    # Inline code outside fenced blocks.
    prose = "\n".join("" if (n + 1) in fenced_lines or re.match(r"^\s*(`{3,}|~{3,})", l) else l
                      for n, l in enumerate(lines))
    for m in re.finditer(r"(`+)(.+?)\1", prose, re.S):
        span = " ".join(m.group(2).split())
        words = span.split()
        while words and ENV_ASSIGN.match(words[0]):
            words.pop(0)
        if len(words) < 2 or not CLI_WORD.match(words[0]):
            continue  # not a command, or the bare program's name (`build/fsdp`)
        lineno = prose.count("\n", 0, m.start()) + 1
        found += commands_in_line(rel, lineno, " ".join(words), allow_bare=False)
    return sorted(found, key=lambda c: c.line)


# ----------------------------------------------------------------------------
# The CLI's help


class Cli:
    def __init__(self, binary: str, cwd: Path):
        self.binary = binary
        self.cwd = cwd
        self.cache: dict[tuple[str, ...], Help] = {}

    def help(self, path: tuple[str, ...]) -> Help:
        if path in self.cache:
            return self.cache[path]
        try:
            r = subprocess.run([self.binary, *path, "--help"], cwd=self.cwd, capture_output=True, text=True,
                               timeout=60)
            h = parse_help(r.stdout) if r.returncode == 0 else Help(ok=False, text=r.stdout + r.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            h = Help(ok=False, text=str(e))
        self.cache[path] = h
        return h


def parse_help(text: str) -> Help:
    h = Help(ok=True, text=text)
    section = None
    m = re.search(r"^Usage: .*$", text, re.M)
    if m and re.search(r"(?<!\[)SUBCOMMAND(?!\])", m.group(0)):
        h.subcommand_required = True
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
            continue
        if section == "Subcommands":
            m = re.match(r"^  (\S+)", line)
            if m:
                h.subcommands.add(m.group(1))
        elif section == "Positionals":
            m = re.match(r"^  (\S+) ?(.*)$", line)
            if m:
                rest = m.group(2)
                h.positionals.append((m.group(1), "REQUIRED" in rest, bool(re.match(r"^\S+ \.\.\.", rest))))
        elif section == "Options":
            m = re.match(r"^  (-\S+)(?: (\S.*?))?(?:\s{2,}.*)?$", line)
            if not m:
                continue
            kind = m.group(2) or ""
            if not kind or kind.startswith(("Excludes:", "Needs:")):
                spec = OptSpec("none")
            elif kind.startswith("["):
                spec = OptSpec("optional")
            elif re.match(r"^\S+ \.\.\.", kind):
                spec = OptSpec("many")
            else:
                spec = OptSpec("one")
            for name in m.group(1).split(","):
                if name.startswith("-"):
                    h.options[name] = spec
    return h


# ----------------------------------------------------------------------------
# Checking


class Checker:
    def __init__(self, cli: Cli, root: Path, verbose: bool):
        self.cli = cli
        self.root = root
        self.verbose = verbose
        self.presets: list[str] | None = None
        self.runs = 0

    def train_presets(self) -> list[str]:
        if self.presets is None:
            text = self.cli.help(("train",)).text
            m = re.search(r"presets:(.*?)\(default", text, re.S)
            self.presets = re.findall(r"([\w.\-]+) \(vocabulary \d+\)", m.group(1)) if m else []
        return self.presets

    def check(self, cmd: Command) -> list[str]:
        """Returns what is wrong with one command (empty: nothing)."""
        problems: list[str] = []
        path, parsed, inner = self.parse(cmd.args, problems)
        if problems:
            return problems
        if path == ("launch",) and inner is not None:
            if inner and CLI_WORD.match(inner[0]):
                return [f"(inside launch) {p}" for p in
                        self.check(Command(cmd.file, cmd.line, cmd.text, inner[1:], in_launch=True))]
            return []
        if path == ("train",):
            problems += self.check_train(cmd.args, parsed)
        return problems

    def parse(self, args: list[str], problems: list[str]):
        """Walks subcommands and options as the CLI's help describes them.

        Returns (subcommand path, {option: [values]}, words after `--` or the
        launched command for `launch`, else None)."""
        path: tuple[str, ...] = ()
        h = self.cli.help(path)
        if not h.ok:
            problems.append(f"`{self.cli.binary} --help` failed: {h.text.strip()[:200]}")
            return path, {}, None
        parsed: dict[str, list[str]] = {}
        positionals: list[str] = []
        problems_before = len(problems)
        inner = None
        i = 0
        asked_help = False
        while i < len(args):
            w = args[i]
            i += 1
            if w == "--":
                inner = args[i:]
                break
            if w.startswith("-") and w != "-":
                name, eq, inline = w.partition("=")
                spec = h.options.get(name)
                if spec is None:
                    where = "fsdp " + " ".join(path) if path else "fsdp"
                    problems.append(f"`{where}` has no option {name} (not in `{where} --help`)")
                    continue
                if name in ("-h", "--help", "--version"):
                    asked_help = True
                values = parsed.setdefault(name, [])
                if eq:
                    values.append(inline)
                elif spec.value == "one":
                    if i < len(args):
                        values.append(args[i])
                        i += 1
                    else:
                        problems.append(f"option {name} needs a value")
                elif spec.value == "optional":
                    if i < len(args) and args[i].lower() in BOOL_WORDS:
                        values.append(args[i])
                        i += 1
                elif spec.value == "many":
                    while i < len(args) and not args[i].startswith("-"):
                        values.append(args[i])
                        i += 1
                continue
            if h.subcommands and not positionals:
                if w not in h.subcommands:
                    where = "fsdp " + " ".join(path) if path else "fsdp"
                    problems.append(f"`{where}` has no subcommand '{w}' (it has: {', '.join(sorted(h.subcommands))})")
                    return path, parsed, None
                path += (w,)
                h = self.cli.help(path)
                if not h.ok:
                    problems.append(f"`fsdp {' '.join(path)} --help` failed: {h.text.strip()[:200]}")
                    return path, parsed, None
                parsed = {}
                continue
            positionals.append(w)
            if path == ("launch",):
                inner = args[i - 1:]  # launch's command starts at its first positional
                break
        if asked_help:
            return path, parsed, inner
        where = "fsdp " + " ".join(path) if path else "fsdp"
        if h.subcommands and h.subcommand_required:
            problems.append(f"`{where}` needs a subcommand (one of: {', '.join(sorted(h.subcommands))})")
        if path == ("launch",):
            if not inner:
                problems.append("`fsdp launch` is given no command to run")
            return path, parsed, inner
        variadic = any(v for _, _, v in h.positionals)
        required = sum(1 for _, r, _ in h.positionals if r)
        if len(problems) > problems_before:
            pass  # an unknown option's value would read as a positional: say nothing more
        elif len(positionals) < required:
            names = " ".join(n for n, _, _ in h.positionals)
            problems.append(f"`{where}` takes positional arguments {names}; given {len(positionals)}")
        elif not variadic and len(positionals) > len(h.positionals):
            extra = " ".join(positionals[len(h.positionals):])
            problems.append(f"`{where}` does not take the argument(s) {extra!r}")
        return path, parsed, inner

    def check_train(self, args: list[str], parsed: dict[str, list[str]]) -> list[str]:
        problems = []
        presets = self.train_presets()
        names = [("--model", n) for n in parsed.get("--model", [])]
        for s in parsed.get("--set", []):
            if s.startswith("model.name="):
                names.append(("--set model.name=", s.split("=", 1)[1]))
        for how, n in names:
            if not PLACEHOLDER.search(n) and n not in presets:
                sep = "" if how.endswith("=") else " "
                problems.append(f"{how}{sep}{n}: not a model preset (presets: {', '.join(presets)})")
        if problems:
            return problems
        reason = self.skip_run_reason(args, parsed)
        if reason:
            if self.verbose:
                print(f"    not run with --print-config: {reason}")
            return problems
        for c in parsed.get("--config", []):
            if not (self.root / c).exists():
                return [f"--config {c}: no such file"]
        argv = [self.cli.binary, *args]
        if "--print-config" not in parsed:
            argv.append("--print-config")
        self.runs += 1
        try:
            r = subprocess.run(argv, cwd=self.root, capture_output=True, text=True, timeout=120,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return ["`train ... --print-config` did not finish in 120 s"]
        if r.returncode != 0:
            msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
            return [f"`train ... --print-config` exited {r.returncode}: {' / '.join(msg[-3:])}"]
        model = re.search(r"^model:\n((?:[ \t].*\n?)*)", r.stdout, re.M)
        if model:
            name = re.search(r"^\s+name:\s*\"?([^\"\n]*)\"?", model.group(1), re.M)
            init = re.search(r"^\s+init_from:\s*\"?([^\"\n]*)\"?", model.group(1), re.M)
            if name and not (init and init.group(1)) and name.group(1) not in presets:
                problems.append(f"effective model.name '{name.group(1)}' is not a preset "
                                f"(presets: {', '.join(presets)})")
        return problems

    def skip_run_reason(self, args: list[str], parsed: dict[str, list[str]]) -> str | None:
        for o in STEP_OPTIONS:
            if o in parsed:
                return f"{o} needs an earlier step's output"
        for w in args:
            if PLACEHOLDER.search(w):
                return f"'{w}' is a placeholder"
        for o in PATH_OPTIONS:
            for v in parsed.get(o, []):
                if o == "--data" and v == "synthetic":
                    continue
                if o == "--config" and v.startswith("configs/"):
                    continue  # must exist: checked when run
                parts = [p for p in v.split(",") if p]
                if not all(globmod.glob(str(self.root / p)) for p in parts):
                    return f"{o} {v} does not exist here (an earlier step makes it)"
        return None


# ----------------------------------------------------------------------------


def main() -> int:
    here = Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary", help="the fsdp CLI to check the commands against")
    ap.add_argument("--root", default=str(here.parent.parent.parent),
                    help="repository root: README.md, docs/*.md and configs/ (default: %(default)s)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each command as it is checked")
    opts = ap.parse_args()
    root = Path(opts.root).resolve()
    binary = os.path.abspath(opts.binary)
    if not os.access(binary, os.X_OK):
        print(f"check_doc_commands: {opts.binary} is not an executable", file=sys.stderr)
        return 2
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    docs = [d for d in docs if d.is_file()]
    if not docs:
        print(f"check_doc_commands: no README.md or docs/*.md under {root}", file=sys.stderr)
        return 2

    commands: list[Command] = []
    for d in docs:
        commands += extract(d, str(d.relative_to(root)))
    checker = Checker(Cli(binary, root), root, opts.verbose)
    failures = []
    per_file: dict[str, int] = {}
    for c in commands:
        per_file[c.file] = per_file.get(c.file, 0) + 1
        if opts.verbose:
            print(f"{c.file}:{c.line}: {c.text}")
        for p in checker.check(c):
            failures.append((c, p))

    files = ", ".join(f"{f} ({n})" for f, n in per_file.items())
    print(f"check_doc_commands: {len(commands)} commands checked from {len(per_file)} files: {files}; "
          f"{checker.runs} train commands run with --print-config")
    if not commands:
        print("check_doc_commands: found no commands at all; is the extraction broken?", file=sys.stderr)
        return 1
    if failures:
        for c, p in failures:
            print(f"{c.file}:{c.line}: {c.text}\n    {p}", file=sys.stderr)
        print(f"check_doc_commands: {len(failures)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
