"""How much of a table one statement read, from the backend's statistics:
the tests of read paths that must cost what the queue's shape costs."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg import sql

_RETURNED = sql.SQL("""
    select coalesce(sum(pg_stat_get_xact_tuples_returned(o.oid)), 0)
      from (select {table}::regclass::oid
             union all
            select i.indexrelid from pg_index as i
             where i.indrelid = {table}::regclass) as o (oid)
""")


def rows_read(conn: psycopg.Connection, table: str, statement: str) -> int:
    """Rows of ``table`` and entries of its indexes that ``statement`` read,
    functions it calls included."""
    return rows_read_by(conn, table, lambda: conn.execute(statement).fetchall())


def rows_read_by(conn: psycopg.Connection, table: str, reads: Callable[[], object]) -> int:
    """Rows of ``table`` and entries of its indexes that the statements
    ``reads`` runs on ``conn`` read. A difference within one transaction: the
    backend's statistics not yet reported may still hold earlier ones'."""
    returned = _RETURNED.format(table=sql.Literal(table))
    with conn.transaction():
        before = conn.execute(returned).fetchone()[0]
        reads()
        return conn.execute(returned).fetchone()[0] - before


_FETCHED = ("select coalesce(sum(pg_stat_get_xact_blocks_fetched(r::regclass)), 0)::int"
            " from unnest(%s::text[]) as r")


def blocks_read(conn: psycopg.Connection, relations: list[str], statement: str) -> int:
    """Blocks of ``relations`` that ``statement`` read (dead rows' blocks
    too, which rows_read does not count), in one transaction."""
    with conn.transaction():
        before = conn.execute(_FETCHED, [relations]).fetchone()[0]
        conn.execute(statement).fetchall()
        return conn.execute(_FETCHED, [relations]).fetchone()[0] - before
