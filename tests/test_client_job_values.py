"""A job's priority, max_attempts and args, checked by the Python client
before anything is sent, on every enqueue path (single, many, COPY, sync and
async), against real PostgreSQL 17 and 18. Sent as they were, a priority of
2.6 was stored as 3, 70000 failed with 22003 "smallint out of range" and
True with 42846, naming neither the field nor the job. The client's ranges
are the server's, at both edges.
"""

from __future__ import annotations

import asyncio
import re

import psycopg
import pytest

import awa_sql
from awa_sql.client import MAX_ATTEMPTS, PRIORITIES


def ready(db) -> list[tuple]:
    with db.connect() as su:
        return su.execute("select priority, max_attempts, args from awa.ready"
                          " order by job_id").fetchall()


def _async(db, login, call):
    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn(login)) as conn:
            await call(conn)
    asyncio.run(go())


def send(db, login, path: str, job: dict) -> None:
    """``job`` through ``path``; in the calls of many, as their second job."""
    jobs = [{"kind": "k"}, {"kind": "k", **job}]
    single = {"priority": job.get("priority", 2), "max_attempts": job.get("max_attempts", 25)}
    if path == "enqueue_async":
        _async(db, login, lambda c: awa_sql.enqueue_async(c, "k", job.get("args"), queue="v",
                                                          **single))
        return
    if path == "enqueue_many_async":
        _async(db, login, lambda c: awa_sql.enqueue_many_async(c, jobs, queue="v"))
        return
    with db.connect(login) as conn:
        if path == "enqueue":
            awa_sql.enqueue(conn, "k", job.get("args"), queue="v", **single)
        elif path == "enqueue_many":
            awa_sql.enqueue_many(conn, jobs, queue="v")
        else:
            awa_sql.enqueue_many_copy(conn, jobs, queue="v")


PATHS = ["enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async",
         "enqueue_many_copy"]
PRIORITY = "priority must be an int between 1 (highest) and 4 (lowest), got"
ATTEMPTS = "max_attempts must be an int between 1 and 1000, got"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("job", "error", "message"), [
    ({"priority": 2.6}, TypeError, f"{PRIORITY} 2.6 (float)"),
    ({"priority": 3.0}, TypeError, f"{PRIORITY} 3.0 (float)"),
    ({"priority": True}, TypeError, f"{PRIORITY} True (bool)"),
    ({"priority": "1"}, TypeError, f"{PRIORITY} '1' (str)"),
    ({"priority": 70000}, ValueError, f"{PRIORITY} 70000"),
    ({"priority": 0}, ValueError, f"{PRIORITY} 0"),
    ({"max_attempts": 2**31}, ValueError, f"{ATTEMPTS} 2147483648"),
    ({"max_attempts": 1001}, ValueError, f"{ATTEMPTS} 1001"),
    ({"max_attempts": 10.0}, TypeError, f"{ATTEMPTS} 10.0 (float)"),
], ids=["float", "whole float", "bool", "str", "past smallint", "below", "past integer",
        "above", "float attempts"])
def test_a_value_the_server_would_change_or_refuse_is_refused_before_sending(
        db, logins, path, job, error, message):
    where = "" if path in ("enqueue", "enqueue_async") else "job 2 (1-based): "
    with pytest.raises(error, match=f"^{re.escape(where + message)}$"):
        send(db, logins.producer, path, job)
    assert ready(db) == []


@pytest.mark.parametrize(("field", "bounds"), [("priority", PRIORITIES),
                                               ("max_attempts", MAX_ATTEMPTS)])
def test_the_clients_ranges_are_the_servers_at_both_edges(db, logins, field, bounds):
    """Each edge value and the one past it, through awa.enqueue itself and
    through the client: the server takes a value exactly when the client
    does, and stores it as given."""
    low, high = bounds
    sql_type = "smallint" if field == "priority" else "integer"
    taken = {}
    with db.connect(logins.producer) as p:
        for value in (low - 1, low, high, high + 1):
            try:
                p.execute(f"select * from awa.enqueue('edge', 'k', {field} => %s::{sql_type})",
                          [value])
                server = True
            except psycopg.errors.InvalidParameterValue:
                server = False
            try:
                awa_sql.enqueue(p, "k", queue="edge", **{field: value})
                client = True
            except ValueError:
                client = False
            taken[value] = (server, client)
    assert taken == {low - 1: (False, False), low: (True, True), high: (True, True),
                     high + 1: (False, False)}
    column = 0 if field == "priority" else 1
    assert [r[column] for r in ready(db)] == [low, low, high, high]


@pytest.mark.parametrize("path", PATHS)
def test_values_at_the_edges_and_finite_args_go_through_unchanged(db, logins, path):
    send(db, logins.producer, path, {"priority": 4, "max_attempts": 1000,
                                     "args": {"f": 1.5, "big": 10**30, "n": [None, True]}})
    assert ready(db)[-1] == (4, 1000, {"f": 1.5, "big": 10**30, "n": [None, True]})
