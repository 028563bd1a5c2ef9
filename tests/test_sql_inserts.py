"""Every INSERT into a table of the job row gives that table's full column list.

The job's tables (awa.ready, awa.scheduled, awa.running, awa.finished) are
written by many functions, fast paths and general ones. A column added by a
migration and forgotten by one of them would be filled by its default (or
null) on that path alone, which no test of another path sees. So every
INSERT into these tables in sql/*.sql names every column of its table,
giving a column with a default its default expression (``now()``) and a
nullable one ``null`` where the path has no value: a new column then fails
here, naming each statement that must say what it stores.

The statements are read with the reader of tests/support/sql_headers.py
(pglast: PL/pgSQL bodies with parse_plpgsql, their SQL, CTEs and dynamic
SQL's format strings with parse_sql); the columns of each table come from
docs/schema.sql, which tests/test_schema_snapshot.py keeps equal to a
migrated database's catalog. No server needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pglast import parser

from tests.support import sql_headers

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "docs" / "schema.sql"
JOB_TABLES = ("awa.ready", "awa.scheduled", "awa.running", "awa.finished")


def schema_columns(text: str) -> dict[str, tuple[str, ...]]:
    """Each table of a CREATE TABLE script and its columns, in order."""
    out = {}
    for raw in json.loads(parser.parse_sql_json(text))["stmts"]:
        create = raw["stmt"].get("CreateStmt")
        if not create:
            continue
        rel = create["relation"]
        name = ".".join(p for p in (rel.get("schemaname"), rel["relname"]) if p)
        out[name] = tuple(e["ColumnDef"]["colname"] for e in create.get("tableElts", ())
                          if "ColumnDef" in e)
    return out


def insert_problems(files: list[sql_headers.SqlFile],
                    columns: dict[str, tuple[str, ...]]) -> list[str]:
    out = []
    for sf in files:
        for f in sf.functions:
            for ins in sql_headers.inserts(f.uses):
                if ins.table not in columns:
                    continue
                where = f"sql/{sf.name}:{f.create_line + 1}: {f.name}: insert into {ins.table}"
                if not ins.static:
                    where += " (dynamic SQL)"
                statement = " ".join(ins.sql.split())[:160]
                if ins.columns is None:
                    out.append(f"{where} gives no column list: {statement}")
                    continue
                missing = [c for c in columns[ins.table] if c not in ins.columns]
                unknown = [c for c in ins.columns if c not in columns[ins.table]]
                if missing:
                    out.append(f"{where} omits {', '.join(missing)} (give each its value, "
                               f"its default or null): {statement}")
                if unknown:
                    out.append(f"{where} names {', '.join(unknown)}, not columns of the "
                               f"table: {statement}")
    return out


@pytest.fixture(scope="module")
def columns() -> dict[str, tuple[str, ...]]:
    found = schema_columns(SCHEMA.read_text())
    return {t: found[t] for t in JOB_TABLES}


@pytest.fixture(scope="module")
def files() -> list[sql_headers.SqlFile]:
    return sql_headers.read_all()


def test_every_insert_into_a_job_table_names_every_column(files, columns):
    problems = insert_problems(files, columns)
    assert not problems, "\n".join(problems)


def test_the_reader_finds_the_inserts(files, columns):
    """Each table is written somewhere, CTEs and dynamic SQL included, so an
    empty list above means the statements were read and found complete."""
    found = {(f.name, i.table, i.static) for sf in files for f in sf.functions
             for i in sql_headers.inserts(f.uses)}
    assert {t for _, t, _ in found} >= set(JOB_TABLES)
    # A CTE's INSERT (awa._insert_jobs), a PL/pgSQL statement's (awa.enqueue)
    # and dynamic SQL's (the carry's move in awa._carry_batch).
    assert ("awa._insert_jobs", "awa.ready", True) in found
    assert ("awa._insert_jobs", "awa.scheduled", True) in found
    assert ("awa.enqueue", "awa.ready", True) in found
    assert ("awa._carry_batch", "awa.finished", False) in found
    assert len(columns["awa.ready"]) >= 14 and "max_run_time" in columns["awa.ready"]


BODIES = {
    "plpgsql": """
        create function awa.t() returns void language plpgsql as $$
        begin
            insert into awa.ready (lane_id, lane_seq) values (1, 2);
        end $$""",
    "cte": """
        create function awa.t() returns void language plpgsql as $$
        begin
            with x as (insert into awa.scheduled (job_id) values (1) returning 1)
            select count(*) from x;
        end $$""",
    "dynamic": """
        create function awa.t() returns void language plpgsql as $$
        begin
            execute format('insert into awa.finished (job_id) select job_id from %s', 'x');
        end $$""",
    "sql": """
        create function awa.t() returns void language sql as $$
            insert into awa.running select * from awa.running
        $$""",
}


@pytest.mark.parametrize("shape", BODIES)
def test_an_insert_that_omits_a_column_is_named(columns, shape):
    uses = sql_headers.body_uses(BODIES[shape])
    f = sql_headers.Function(name="awa.t", file="x.sql", create_line=0, header_start=None,
                             header=[], signature_lines=0, generated_start=0, uses=uses)
    sf = sql_headers.SqlFile(name="x.sql", text="", purpose="", top_comment=[],
                             functions=[f], views=[])
    problems = insert_problems([sf], columns)
    assert len(problems) == 1 and "sql/x.sql:1: awa.t: insert into awa." in problems[0]
    assert ("gives no column list" if shape == "sql" else "omits") in problems[0]


def test_the_schema_reader_reads_columns_in_order():
    assert schema_columns("create table awa.x (a int, b text default 'y', "
                          "constraint k primary key (a));") == {"awa.x": ("a", "b")}
