"""The "Current numbers" of docs/benchmarks.md, written by the benches themselves.

Each bench owns one block of that section, between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``. Run with ``--write-docs``, a bench tees what it
prints and, once its run has finished, replaces its block with: a title, the
command, the commit and machine it ran on, the date, what it printed (its
markdown tables as tables, any other lines in a text block) and its targets'
status. Nothing else in the file changes. A missing or doubled marker fails
before the run starts, not after an hour of measuring.

    block = _docs.Block(__file__, "Claim throughput", args.write_docs)
    ...                                        # the run, printing as before
    block.write([_docs.Target("ahead of procrastinate", ratio > 1, f"{ratio:.2f}x")])
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench._server import machine

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Current numbers"


class BlockError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    """One target of a bench: what it asks, whether this run met it, and the
    measured value it was judged on. `met` is None where this run cannot tell
    (say, a before/after target without --before)."""

    target: str
    met: bool | None
    measured: str

    def status(self) -> str:
        word = {True: "met", False: "missed", None: "not measured"}[self.met]
        return f"{word}, {self.measured}" if self.measured else word


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write-docs", action="store_true",
                        help="after the run, replace this bench's block in the Current numbers"
                             " of docs/benchmarks.md")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def _block_span(text: str, name: str) -> tuple[int, int]:
    """Where the lines between NAME's markers start and end in `text`."""
    start, end = markers(name)
    lines = text.splitlines(keepends=True)
    found = {m: [i for i, line in enumerate(lines) if line.strip() == m] for m in (start, end)}
    for marker, at in found.items():
        if len(at) != 1:
            raise BlockError(f"docs/benchmarks.md: expected one line {marker}, found {len(at)}"
                             f" (the block of {name} is {start} ... {end} in {SECTION!r})")
    first, last = found[start][0], found[end][0]
    if last < first:
        raise BlockError(f"docs/benchmarks.md: {end} comes before {start}")
    section = None
    fenced = False
    for i, line in enumerate(lines[:last]):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            section = line.rstrip("\n")
        if i == first and section != SECTION:
            raise BlockError(f"docs/benchmarks.md: {start} is not in {SECTION!r}")
    if section != SECTION:
        raise BlockError(f"docs/benchmarks.md: the block of {name} crosses a heading")
    ends = list(itertools.accumulate(len(line) for line in lines))
    return ends[first], ends[last - 1]


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with NAME's block holding `body`, every other character as it was."""
    begin, end = _block_span(text, name)
    return text[:begin] + body.rstrip("\n") + "\n" + text[end:]


def render_output(printed: str) -> str:
    """A bench's stdout as markdown: runs of table lines as they are, the rest
    in text blocks (aligned columns, and '#' lines that are not headings here)."""
    parts = []
    for is_table, run in itertools.groupby(printed.splitlines(), lambda ln: ln.startswith("|")):
        text = "\n".join(run).strip("\n")
        if is_table:
            parts.append(text)
        elif text.strip():
            parts.append(f"```text\n{text}\n```")
    return "\n\n".join(parts)


def render_targets(targets: Sequence[Target]) -> str:
    rows = [f"| {t.target} | {t.status()} |" for t in targets]
    return "\n".join(["| target | status |", "|---|---|", *rows])


def commit() -> str:
    """HEAD's short hash, with '+ uncommitted changes' if any file outside
    docs/ and the markdown differs from it (a run that writes its block must
    not mark the next bench's run as dirty)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", ".", ":(exclude)docs", ":(exclude)*.md")
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit (no git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def command(script: str, argv: Sequence[str]) -> str:
    args = [a for a in argv if a != "--write-docs"]
    return " ".join([".venv/bin/python", f"bench/{Path(script).name}", *map(shlex.quote, args)])


def render(title: str, script: str, cmd: str, at: str, host: str, date: str, printed: str,
           targets: Sequence[Target]) -> str:
    parts = [f"### {title} (`bench/{Path(script).name}`)",
             f"```sh\n{cmd}\n```",
             f"At {at}, {date}, written by `--write-docs`. Machine: {host}.",
             render_output(printed)]
    if targets:
        parts.append(render_targets(targets))
    return "\n\n".join(p for p in parts if p)


def write_block(name: str, body: str, docs: Path = DOCS) -> None:
    text = docs.read_text()
    new = replace_block(text, name, body)
    tmp = docs.with_name(docs.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, docs)


class _Tee(io.TextIOBase):
    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.stream.flush()


class Block:
    """A bench's block. When enabled: its markers are checked and the commit
    and date taken now (what the run measures is the tree as it starts),
    stdout is teed from now on, and write() puts the block in
    docs/benchmarks.md. When not, write() does nothing. `variant` names a
    second block of the same script (e2e_pgbench's --long run)."""

    def __init__(self, script: str, title: str, enabled: bool, variant: str = "",
                 docs: Path = DOCS) -> None:
        self.script, self.title, self.docs = script, title, docs
        self.name = Path(script).stem + (f"-{variant}" if variant else "")
        self.argv = sys.argv[1:]
        self._tee: _Tee | None = None
        if enabled:
            _block_span(docs.read_text(), self.name)
            self.at, self.date = commit(), datetime.now(UTC).date().isoformat()
            self._tee = _Tee(sys.stdout)
            sys.stdout = self._tee

    def write(self, targets: Sequence[Target] = ()) -> None:
        if self._tee is None:
            return
        sys.stdout = self._tee.stream
        body = render(self.title, self.script, command(self.script, self.argv), self.at,
                      machine(), self.date, self._tee.copy.getvalue(), targets)
        write_block(self.name, body, self.docs)
        print(f"wrote the block {self.name} of {self.docs}", file=sys.stderr)
