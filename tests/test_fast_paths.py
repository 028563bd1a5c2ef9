"""docs/fast-paths.md, the registry of fast paths, agrees with sql/ and the tests.

Every function whose header in sql/ calls itself "a fast path" has a row;
every row names a function defined in sql/ whose header says so (and the
inlined predicates that test its eligibility, which it calls), general
twins defined in sql/ (or "none"), tests that exist, and an ADR that
exists. No server needed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import sql_headers
from tests.support.catalog import INLINED_FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "docs" / "fast-paths.md"
COLUMNS = ["path", "function", "shape it serves", "general twin", "test", "ADR"]
# How a header calls its function a fast path.
CALLS_ITSELF = re.compile(r"\ba fast path\b", re.IGNORECASE)
NAME = re.compile(r"`(awa\.[a-z_][a-z0-9_]*)`")
TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
ADR = re.compile(r"\[ADR (\d{3})\]\((adr/[\w.-]+\.md)\)")


def registry_rows(text: str) -> list[dict[str, str]]:
    """The rows of the registry's table, as {column: cell}."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(COLUMNS), line
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return registry_rows(REGISTRY.read_text())


@pytest.fixture(scope="module")
def functions() -> dict[str, sql_headers.Function]:
    return {f.name: f for sf in sql_headers.read_all() for f in sf.functions}


def _function(row: dict[str, str]) -> str:
    """The row's function: the first name in its cell (the others are its tests)."""
    names = NAME.findall(row["function"])
    assert names, f"{row['path']}: name its function, got {row['function']!r}"
    return names[0]


def _predicates(row: dict[str, str]) -> list[str]:
    """The named predicates the row gives for its eligibility, after the function."""
    return NAME.findall(row["function"])[1:]


def test_every_function_that_calls_itself_a_fast_path_is_registered(rows, functions):
    registered = {_function(r) for r in rows}
    claims = {name for name, f in functions.items() if CALLS_ITSELF.search(" ".join(f.prose))}
    assert claims - registered == set(), "add a row to docs/fast-paths.md for each"
    # And the converse: a registered function's header says what it is.
    assert registered - claims == set(), \
        "say 'A fast path (docs/fast-paths.md)' in each one's header"


def test_every_row_names_functions_tests_and_an_adr_that_exist(rows, functions):
    assert rows, "docs/fast-paths.md has no rows"
    for row in rows:
        where = f"docs/fast-paths.md, {row['path']}"
        assert _function(row) in functions, f"{where}: no function {_function(row)} in sql/"
        for predicate in _predicates(row):
            # An eligibility test is an inlined predicate: free at run time.
            assert predicate in functions, f"{where}: no function {predicate} in sql/"
            assert predicate.removeprefix("awa.") in INLINED_FUNCTIONS, \
                f"{where}: {predicate} is not an inlined function (tests/support/catalog.py)"
            assert predicate in functions[_function(row)].uses.calls, \
                f"{where}: {_function(row)} does not call {predicate}"
        twins = NAME.findall(row["general twin"])
        assert twins or row["general twin"].startswith("none"), \
            f"{where}: name its general twin, or say none"
        for twin in twins:
            assert twin in functions, f"{where}: no function {twin} in sql/"
        tests = TEST.findall(row["test"])
        assert tests, f"{where}: name its test as `tests/file.py::test_name`"
        for file, name in tests:
            path = ROOT / file
            assert path.is_file(), f"{where}: no {file}"
            defined = {n.name for n in ast.walk(ast.parse(path.read_text()))
                       if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            assert name in defined, f"{where}: no test {name} in {file}"
        adrs = ADR.findall(row["ADR"])
        assert adrs, f"{where}: link its ADR as [ADR NNN](adr/NNN-....md)"
        for number, link in adrs:
            target = ROOT / "docs" / link
            assert target.is_file(), f"{where}: no {link}"
            assert target.name.startswith(number), f"{where}: ADR {number} links {link}"


def test_the_registry_reader_reads_a_table():
    text = ("| " + " | ".join(COLUMNS) + " |\n|---|---|---|---|---|---|\n"
            "| p | `awa.x` | s | none | `tests/t.py::test_a` | [ADR 001](adr/001-a.md) |\n")
    (row,) = registry_rows(text)
    assert _function(row) == "awa.x" and _predicates(row) == []
    assert TEST.findall(row["test"]) == [("tests/t.py", "test_a")]
    assert ADR.findall(row["ADR"]) == [("001", "adr/001-a.md")]
