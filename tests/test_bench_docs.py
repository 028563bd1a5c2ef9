"""bench/_docs.py, the writer of docs/benchmarks.md's Current numbers, and every
bench's place in it. No bench runs here."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
from bench import _docs

ROOT = Path(__file__).resolve().parent.parent
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))

DOC = """\
# Benchmarks

Intro.

## Current numbers

<!-- bench:one -->
### One

old one
<!-- /bench:one -->

<!-- bench:two -->
### Two

```text
## not a heading: inside a fence
```
<!-- /bench:two -->

## Running them

Notes.
"""


def _outside(text: str, name: str) -> tuple[str, str]:
    start, end = _docs.markers(name)
    return text.split(start + "\n")[0], text.split("\n" + end)[1]


def test_a_block_is_replaced_and_nothing_else():
    new = _docs.replace_block(DOC, "one", "### One\n\nnew one\n")
    assert "new one" in new and "old one" not in new
    assert _outside(new, "one") == _outside(DOC, "one")
    assert _docs.replace_block(new, "one", "### One\n\nold one") == DOC


def test_a_block_behind_a_fenced_heading_is_found_and_kept_whole():
    new = _docs.replace_block(DOC, "two", "### Two\n\n| a |\n|---|\n| 1 |")
    assert _outside(new, "two") == _outside(DOC, "two")
    assert "not a heading" not in new and "old one" in new


def test_an_empty_block_can_be_filled():
    empty = DOC.replace("### One\n\nold one\n", "")
    assert _docs.replace_block(empty, "one", "### One\n\nold one") == DOC


def test_write_block_changes_only_its_block(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOC)
    _docs.write_block("two", "### Two\n\nnew two", docs)
    text = docs.read_text()
    assert "new two" in text
    assert _outside(text, "two") == _outside(DOC, "two")
    assert not list(tmp_path.glob("*.tmp"))


SWAPPED = DOC.replace("<!-- bench:one -->\n### One\n\nold one\n<!-- /bench:one -->",
                      "<!-- /bench:one -->\n### One\n\nold one\n<!-- bench:one -->")


@pytest.mark.parametrize(("doc", "message"), [
    (DOC.replace("<!-- bench:one -->\n", ""), "expected one line <!-- bench:one -->, found 0"),
    (DOC.replace("<!-- /bench:one -->\n", ""), "expected one line <!-- /bench:one -->, found 0"),
    (DOC + "<!-- bench:one -->\n", "expected one line <!-- bench:one -->, found 2"),
    (SWAPPED, "<!-- /bench:one --> comes before <!-- bench:one -->"),
    (DOC.replace("## Current numbers", "## Something else"), "is not in '## Current numbers'"),
    (DOC.replace("old one", "## A heading\n\nold one"), "crosses a heading"),
])
def test_a_missing_doubled_or_misplaced_marker_fails_clearly(doc, message):
    with pytest.raises(_docs.BlockError, match=re.escape(message)):
        _docs.replace_block(doc, "one", "### One")


def test_printed_tables_stay_tables_and_other_lines_go_in_text_blocks():
    printed = ("# bench: a header line\n| cell | k |\n|---|---:|\n| a | 1.0 |\n\n"
               "ratio: 1.50\n\n## 16 clients\n")
    assert _docs.render_output(printed) == (
        "```text\n# bench: a header line\n```\n\n"
        "| cell | k |\n|---|---:|\n| a | 1.0 |\n\n"
        "```text\nratio: 1.50\n\n## 16 clients\n```")


def test_a_block_writes_the_run_and_its_targets(tmp_path, monkeypatch, capsys):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOC.replace("bench:one", "bench:claim_instructions"))
    monkeypatch.setattr(sys, "argv", ["bench/claim_instructions.py", "--write-docs", "--x", "a b"])
    block = _docs.Block("bench/claim_instructions.py", "Claims", True, docs=docs)
    print("| cell | k |\n|---|---:|\n| claim 1 | 662.1 |")
    block.write([_docs.Target("S = 16 / S = 1 <= 1.30x", False, "1.50x"),
                  _docs.Target("within 2% of REF", None, "needs --before REF")])
    assert sys.stdout is not block._tee
    text = docs.read_text()
    assert _outside(text, "claim_instructions") == _outside(DOC, "one")
    block = text.split("<!-- bench:claim_instructions -->\n")[1].split("<!-- /bench")[0]
    assert block.startswith("### Claims (`bench/claim_instructions.py`)\n")
    assert ".venv/bin/python bench/claim_instructions.py --x 'a b'\n" in block
    assert f"\nAt {_docs.commit()}, " in block
    assert "| claim 1 | 662.1 |" in block
    assert "| S = 16 / S = 1 <= 1.30x | missed, 1.50x |" in block
    assert "| within 2% of REF | not measured, needs --before REF |" in block
    assert "| claim 1 | 662.1 |" in capsys.readouterr().out


def test_a_block_without_its_block_fails_before_the_run(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOC)
    with pytest.raises(_docs.BlockError, match="bench:claim_cost"):
        _docs.Block("bench/claim_cost.py", "Claim cost", True, docs=docs)
    _docs.Block("bench/claim_cost.py", "Claim cost", False, docs=docs).write()
    assert docs.read_text() == DOC


@pytest.mark.parametrize("script", BENCHES, ids=lambda p: p.name)
def test_every_bench_has_a_block_and_takes_write_docs(script, monkeypatch, capsys):
    _docs.replace_block(_docs.DOCS.read_text(), script.stem, "checked")
    # Checked first: a script without the flag may have no parser to stop at --help.
    assert "_docs.add_argument(" in script.read_text(), f"{script.name} takes no --write-docs"
    # As `python bench/NAME.py --help`: argparse prints and exits before any work.
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_.value.code == 0
    assert "--write-docs" in capsys.readouterr().out
