"""The bound a bulk retry or cancel takes, so that it takes the jobs its
caller counted and none that came later (`awa jobs retry|cancel --queue`
and the admin API's bulk plan)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

# The argument of each call that takes the bound: a retry the jobs that
# finished before it, a cancel those first enqueued before it (a job back
# from a failed attempt or a retry keeps its first enqueue time).
BOUND_ARGUMENT = {"retry": "finished_before", "cancel": "enqueued_before"}


def read_bound(conn: psycopg.Connection) -> datetime:
    """Makes the caller's transaction repeatable read and read only and reads
    the server's clock as its first statement, which takes the snapshot the
    caller then counts in: a job counted entered its state in a transaction
    that committed before that snapshot, so began (its finished_at or
    enqueued_at) before the clock read; one that enters it after the count
    (fails again, is enqueued) in a transaction that began later. The calls
    given the bound take the jobs counted and those of transactions open as
    the snapshot was taken, never later ones; a transaction open then may
    also claim a retried job and fail it again under a finished_at before
    the bound, which a later call retries once more. Must run first in its
    transaction. Read in binary: the text form follows the login's
    DateStyle, which psycopg cannot parse in every style ('SQL, DMY')."""
    conn.execute("set transaction isolation level repeatable read, read only")
    with conn.cursor(binary=True) as cur:
        return cur.execute("select pg_catalog.clock_timestamp()").fetchone()[0]


# Counts taken again when a maintenance rewrite overtook the snapshot
# (awa.count_jobs refuses it, 40001); rewrites are minutes apart.
COUNT_TRIES = 3


def count_in_bound(conn: psycopg.Connection, queue: str, states: Iterable[str],
                   kind: str | None, up_to: int) -> tuple[datetime, dict[str, int]]:
    """The bound and, counted in its snapshot, the jobs of each state
    (awa.count_jobs, up to ``up_to``), in a transaction of its own: ``conn``
    must be idle. A snapshot taken as a maintenance rewrite of a job table
    committed would read that table empty; awa.count_jobs refuses it (40001)
    and the count is taken again in a new transaction."""
    for attempt in range(1, COUNT_TRIES + 1):
        try:
            with conn.transaction():
                before = read_bound(conn)
                counts = {state: conn.execute(
                    "select awa.count_jobs(%s::text, %s::text, %s::text, %s::integer)",
                    [queue, state, kind, up_to]).fetchone()[0] for state in states}
            return before, counts
        except psycopg.errors.SerializationFailure:
            if attempt == COUNT_TRIES:
                raise
    raise AssertionError("not reached: the last try returns or raises")
