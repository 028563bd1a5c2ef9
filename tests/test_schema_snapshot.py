"""docs/schema.sql is what a fresh migrate builds, on PostgreSQL 17 and 18."""

from __future__ import annotations

import difflib

import psycopg

from tests.support.schema import SNAPSHOT, dump


def test_docs_schema_sql_matches_a_fresh_migrate(cluster, template_db):
    with psycopg.connect(cluster.dsn(template_db), autocommit=True) as conn:
        fresh = dump(conn)
    if fresh != SNAPSHOT.read_text():
        diff = "".join(difflib.unified_diff(
            SNAPSHOT.read_text().splitlines(keepends=True), fresh.splitlines(keepends=True),
            "docs/schema.sql", f"fresh migrate on PostgreSQL {cluster.major}", n=1))
        raise AssertionError("docs/schema.sql is out of date: run `make schema`\n" + diff[:6000])
