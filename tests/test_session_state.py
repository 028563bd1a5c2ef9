"""No session state in the SQL contract (issue 9): nothing in sql/, migrations/
or the Python package's SQL may leave state on a server connection that a
transaction pooler hands to someone else next.

Forbidden: session advisory locks, set_config(..., false), plain SET/RESET
(SET LOCAL and function-level SET are fine), LISTEN, temporary objects,
SQL-level PREPARE, cursors WITH HOLD.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pglast
import pytest

ROOT = Path(__file__).resolve().parent.parent
SQL_FILES = sorted((ROOT / "sql").glob("*.sql")) + sorted((ROOT / "migrations").glob("*.sql"))
PACKAGE = ROOT / "installer" / "awa_sql"
PY_FILES = sorted(PACKAGE.rglob("*.py"))  # subpackages too (cli/, demo/, admin/, metrics/)

# The one place that needs a session: a `-- awa:no-transaction` migration,
# which the runner applies only over a direct connection (ADR 006).
ALLOWED = {
    ("migrate.py", "_apply_outside_transaction"),
    ("migrate.py", "_migration_step"),
    ("migrate.py", "_step_script"),
}

ANYWHERE = [
    ("session advisory lock",
     re.compile(r"\bpg_(try_)?advisory_(un)?lock(_shared|_all)?\s*\(", re.I)),
    ("set_config(..., false)",
     re.compile(r"\bset_config\s*\((?:[^()]|\([^()]*\))*,\s*false\s*\)", re.I)),
    ("LISTEN", re.compile(r"(^|;)\s*(un)?listen\s+[\w\"*]", re.I | re.M)),
    ("temporary object",
     re.compile(r"\bcreate\s+(or\s+replace\s+)?((global|local)\s+)?temp(orary)?\s+"
                r"(table|view|sequence)\b", re.I)),
    ("SQL-level PREPARE", re.compile(r"(^|;)\s*prepare\s+\w+\s*(\(|as\b)", re.I | re.M)),
    ("cursor WITH HOLD", re.compile(r"\bwith\s+hold\b", re.I)),
]
# A SET or RESET statement that is not SET LOCAL, at the start of a statement.
STATEMENT_SET = re.compile(
    r"(\A|;|\bbegin\b|\bthen\b|\belse\b|\bloop\b)\s*(set\s+(?!local\b)(session\s+)?"
    r"(role\b|[a-z_.]+\s*(=|to\b))|reset\s+\w+)", re.I | re.M)


def _strip_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def _function_bodies(text: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r"(\$[a-z_]*\$)(.*?)\1", text, re.S | re.I)]


def _top_level(text: str) -> str:
    return re.sub(r"(\$[a-z_]*\$)(.*?)\1", "''", text, flags=re.S | re.I)


def session_state_in_sql(text: str) -> list[str]:
    """What in ``text`` would leave state on the session."""
    text = _strip_comments(text)
    found = [name for name, pattern in ANYWHERE if pattern.search(text)]
    # Top level: function-level SET clauses are part of CREATE FUNCTION.
    for stmt in pglast.parse_sql(_top_level(text)):
        node = stmt.stmt
        if isinstance(node, pglast.ast.VariableSetStmt) and not node.is_local:
            found.append(f"plain SET/RESET {node.name}")
    for body in _function_bodies(text):
        if STATEMENT_SET.search(body):
            found.append("plain SET/RESET in a function body")
    return found


def session_state_in_string(text: str, executed: bool) -> list[str]:
    """``executed``: the string is sent as a statement as it is (``.execute``)."""
    text = _strip_comments(text)
    found = [name for name, pattern in ANYWHERE if pattern.search(text)]
    if executed and STATEMENT_SET.search(text):
        found.append("plain SET/RESET")
    return found


class _Strings(ast.NodeVisitor):
    def __init__(self) -> None:
        self.function = "<module>"
        self.hits: list[tuple[str, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "execute" and node.args:
            first = node.args[0]
            parts = first.values if isinstance(first, ast.JoinedStr) else [first]
            text = "".join(p.value for p in parts
                           if isinstance(p, ast.Constant) and isinstance(p.value, str))
            self.hits += [(self.function, h) for h in session_state_in_string(text, True)]
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.hits += [(self.function, h)
                          for h in session_state_in_string(node.value, False)]


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sql_leaves_no_session_state(path: Path):
    assert session_state_in_sql(path.read_text()) == []


@pytest.mark.parametrize("path", PY_FILES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_python_sql_leaves_no_session_state(path: Path):
    visitor = _Strings()
    visitor.visit(ast.parse(path.read_text()))
    name = path.relative_to(PACKAGE).as_posix()
    leaks = [(fn, hit) for fn, hit in visitor.hits if (name, fn) not in ALLOWED]
    assert leaks == []


@pytest.mark.parametrize("bad", [
    "select pg_advisory_lock(1, 2);",
    "select pg_catalog.pg_try_advisory_lock(1635213644, 7);",
    "select set_config('awa.lane_1_2', '5', false);",
    "set search_path = pg_catalog;",
    "set session lock_timeout = '1s';",
    "reset role;",
    "listen awa_jobs;",
    "create temp table t (a int);",
    "prepare q as select 1;",
    "declare c cursor with hold for select 1;",
    "create function f() returns void language plpgsql as $$\n"
    "begin\n    set statement_timeout = 0;\nend\n$$;",
])
def test_the_check_catches(bad: str):
    assert session_state_in_sql(bad) != []


@pytest.mark.parametrize("good", [
    "select pg_advisory_xact_lock(1, 2); select pg_try_advisory_xact_lock(1, 2);",
    "select set_config('awa.lane_1_2', '5', true);",
    "set local search_path = pg_catalog; set local role awa_owner;",
    "create function f() returns void language sql\n"
    "set search_path = pg_catalog, pg_temp\nas $$select 1$$;",
    "update t set a = 1;",
])
def test_the_check_allows(good: str):
    assert session_state_in_sql(good) == []


def test_the_check_reads_python():
    visitor = _Strings()
    visitor.visit(ast.parse(
        "def f(conn):\n"
        "    conn.execute('set search_path = pg_catalog')\n"
        "    conn.execute(\"select pg_catalog.set_config('lock_timeout', %s, false)\", ['1s'])\n"
        "    conn.execute(f'select pg_advisory_lock({KEY})')\n"))
    assert {h for _, h in visitor.hits} == {
        "plain SET/RESET", "set_config(..., false)", "session advisory lock"}
