"""Lint is part of the suite: ruff, sqlfluff, pglast and pgspot."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pglast
import pytest

from awa_sql import migrate
from awa_sql.roles import Roles
from awa_sql.source import NO_TRANSACTION_MARK, load_migrations
from tests.support.catalog import INLINED_FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SQL_FILES = sorted([*ROOT.glob("sql/*.sql"), *ROOT.glob("migrations/*.sql")])


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff():
    result = _run(str(BIN / "ruff"), "check", "installer", "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_sqlfluff():
    result = _run(str(BIN / "sqlfluff"), "lint", "sql", "migrations", "--disable-progress-bar")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sql_file_parses_with_pglast(path: Path):
    try:
        pglast.parse_sql(path.read_text())
    except pglast.parser.ParseError as err:
        pytest.fail(f"{path.relative_to(ROOT)} does not parse: {err}")


PLPGSQL_FILES = [p for p in SQL_FILES if "language plpgsql" in p.read_text()]


@pytest.mark.parametrize("path", PLPGSQL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plpgsql_bodies_parse(path: Path):
    """pglast checks the PL/pgSQL inside each function too, naming the file."""
    text = path.read_text()
    try:
        pglast.parse_plpgsql(text)
    except pglast.parser.ParseError as err:
        pytest.fail(f"{path.relative_to(ROOT)}: PL/pgSQL does not parse: {err}")


def test_no_transaction_migrations_hold_one_statement():
    for m in load_migrations():
        if not m.transactional:
            assert len(pglast.split(m.text)) == 1, (
                f"{m.label}: a file marked {NO_TRANSACTION_MARK!r} runs statement by statement "
                "outside a transaction; keep it to one statement"
            )


def _unpinned_functions(script: str) -> list[str]:
    """The functions created without SET search_path, as pgspot names them: the
    inlined constants and predicates (sql/private.sql says why they may be;
    tests/test_inlined_functions.py checks what makes them safe)."""
    from pgspot.formatters import format_function

    found = []
    for stmt in pglast.parse_sql(script):
        node = stmt.stmt
        if isinstance(node, pglast.ast.CreateFunctionStmt) and not any(
            o.defname == "set" and o.arg.name == "search_path" for o in node.options or ()
        ):
            found.append(format_function(node))
    return found


def test_pgspot_finds_nothing_in_the_full_install_script(tmp_path):
    """pgspot reads the script a fresh install runs: bootstrap, migrations, layer.
    Only the inlined functions may lack a pinned search_path; pgspot still
    checks that their bodies qualify every name."""
    plan = migrate.plan_for(None, Roles(), create_roles=True)
    script = migrate.render_sql(plan).replace("\\set ON_ERROR_STOP on\n", "")
    path = tmp_path / "install.sql"
    path.write_text(script)
    unpinned = _unpinned_functions(script)
    assert sorted(u.split("(")[0] for u in unpinned) == sorted(
        f"awa.{name}" for name in INLINED_FUNCTIONS), unpinned
    allowed = [a for name in unpinned for a in ("--proc-without-search-path", name)]
    result = _run(str(BIN / "pgspot"), *allowed, str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Errors: 0 Warnings: 0 Unknown: 0" in result.stdout


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_test_module_imports_another():
    """Shared helpers live in tests/support/ and fixtures in tests/conftest.py."""
    modules = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    crossing = {
        f"{path.name} imports {name}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for name in _imported_modules(path)
        if any(part in modules for part in name.split("."))
    }
    assert not crossing, sorted(crossing)



# Words after "awa." in prose that name no object: placeholders and history.
NOT_OBJECTS = {
    "_check_",  # "awa._check_*", the family
    "anything", "f", "job",  # placeholders in examples
    "maintain",  # docs/observability.md: the metric names awa.maintain.*
    "_enqueue_slow",  # docs/benchmarks-history.md: a measurement from before it was retired
}


def test_comments_and_docs_name_only_objects_and_adrs_that_exist():
    """Every awa.<name> in a SQL comment or a doc is in docs/schema.sql (which
    test_schema_snapshot holds to the migrated schema), and every "ADR NNN" has
    its file."""
    schema = (ROOT / "docs" / "schema.sql").read_text()
    defined = set(re.findall(r"\bawa\.([a-z_][a-z0-9_]*)", schema))  # each name whole
    adrs = {p.name[:3] for p in (ROOT / "docs" / "adr").glob("[0-9][0-9][0-9]-*.md")}
    sources = [*ROOT.glob("sql/*.sql"), *ROOT.glob("docs/*.md"), ROOT / "README.md",
               *ROOT.glob("docs/adr/*.md")]
    stale = []
    for path in sources:
        if path.name in ("schema.sql", "retired.sql"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if path.suffix == ".sql":
                if "--" not in line:
                    continue
                line = line.split("--", 1)[1]
            where = f"{path.relative_to(ROOT)}:{number}"
            for adr in re.findall(r"\bADR (\d{3})\b", line):
                if adr not in adrs:
                    stale.append(f"{where}: ADR {adr}")
            if "adr" in path.parts:
                continue  # decisions record the names of their day
            for name in re.findall(r"\bawa\.([a-z_][a-z0-9_]*)", line):
                if name not in NOT_OBJECTS and name not in defined:
                    stale.append(f"{where}: awa.{name}")
    assert not stale, "\n".join(stale)
