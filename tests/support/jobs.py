"""Calling the SQL API as the runtime roles: their logins, enqueue, claim,
COPY ingestion, and the lane locks producers wait on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from awa_sql import routing
from tests.support.waiting import wait_until

LANE_CLASS = 1635213644  # the advisory-lock class of a lane ('awaL' as an int4)
COPY_COLUMNS = "queue, priority, ordering_key, kind, args, run_at, max_attempts"
COPY_SQL = f"copy awa.copy_staging ({COPY_COLUMNS}) from stdin"


@dataclass
class Logins:
    """One new login per runtime role (the ``logins`` fixture in conftest.py)."""

    producer: str
    worker: str
    maintenance: str
    operator: str
    reader: str


def valid_job(queue, kind, priority, max_attempts) -> bool:
    """The row rule of awa._job_ok, as a Python oracle (no defaults applied)."""
    return (queue is not None and 1 <= len(queue.encode()) <= 200 and "#" not in queue
            and kind is not None and priority is not None and 1 <= priority <= 4
            and max_attempts is not None and 1 <= max_attempts <= 1000)


def function_calls(conn, function: str) -> int:
    """Calls of `function` so far in this transaction (needs track_functions)."""
    return conn.execute("select coalesce(pg_stat_get_xact_function_calls(%s::regproc), 0)",
                        [function]).fetchone()[0]


def enqueue(conn, queue, kind="job", **kw):
    cols = ", ".join(f"{k} => %({k})s" for k in kw)
    query = f"select * from awa.enqueue(%(queue)s, %(kind)s{', ' if kw else ''}{cols})"
    return conn.execute(query, {"queue": queue, "kind": kind, **kw}).fetchone()


def claim(conn, queues, n=100, worker="w", lease="5 minutes"):
    return conn.execute("select * from awa.claim(%s, %s, %s, %s::interval)",
                        [queues, n, worker, lease]).fetchall()


def claim_all(conn, queues, n=100):
    out = []
    while batch := claim(conn, queues, n):
        out += batch
    return out


def copy_rows(conn: psycopg.Connection, rows) -> None:
    """COPY rows of COPY_COLUMNS; rows of one value more carry max_run_time too."""
    rows = list(rows)
    statement = COPY_SQL
    if rows and len(rows[0]) == len(COPY_COLUMNS.split(", ")) + 1:
        statement = f"copy awa.copy_staging ({COPY_COLUMNS}, max_run_time) from stdin"
    with conn.cursor().copy(statement) as cp:
        for row in rows:
            cp.write_row(row)


def key_for_shard(shard: int, shards: int) -> bytes:
    for i in range(100_000):
        key = f"key-{i}".encode()
        if routing.shard_for_ordering_key(key, shards) == shard:
            return key
    raise AssertionError(f"no key for shard {shard} of {shards}")


def lane_waiters(db, queue: str) -> int:
    """Backends waiting (ungranted) for one of the queue's lane locks."""
    with db.connect() as admin:
        return admin.execute(
            "select count(*) from pg_locks k join awa.lanes l on l.lane_id = k.objid::integer"
            " join awa.queue_meta m using (queue_id)"
            " where k.locktype = 'advisory' and k.classid = %s and not k.granted"
            # Lane ids repeat in every database cloned from the template.
            " and k.database = (select oid from pg_database where datname = current_database())"
            " and m.queue = %s", [LANE_CLASS, queue]).fetchone()[0]


def waits_for_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    """Whether backend ``pid`` is waiting for a lock right now."""
    return conn.execute(
        "select exists (select from pg_locks where pid = %s and not granted)", [pid]
    ).fetchone()[0]


class Call(threading.Thread):
    """Runs ``work(conn)`` then commits, in a thread; keeps its result or error."""

    def __init__(self, conn: psycopg.Connection, work: Callable[[psycopg.Connection], object]):
        super().__init__(daemon=True)
        self.conn, self.work = conn, work
        self.pid = conn.execute("select pg_backend_pid()").fetchone()[0]
        self.result: object = None
        self.error: psycopg.Error | None = None

    def run(self) -> None:
        try:
            self.result = self.work(self.conn)
            self.conn.commit()
        except psycopg.Error as err:
            self.error = err
            self.conn.rollback()


def in_turn_behind(watch: psycopg.Connection, holder: psycopg.Connection,
                   calls: list[Call]) -> None:
    """Starts each call once the one before it waits for a lock (``holder``'s
    open transaction holds what the first waits for), commits ``holder``, and
    waits for every call to end; ``watch`` reads pg_locks."""
    for call in calls:
        call.start()
        wait_until(lambda call=call: waits_for_a_lock(watch, call.pid),
                   what=f"backend {call.pid} to wait")
    holder.commit()
    for call in calls:
        call.join(timeout=30)
        assert not call.is_alive()


def behind(db, holder: psycopg.Connection, conn: psycopg.Connection,
           work: Callable[[psycopg.Connection], object]) -> Call:
    """Runs ``work(conn)`` in a Call while ``holder``'s open transaction holds
    a lock it waits for; commits ``holder`` once it waits; the ended Call."""
    call = Call(conn, work)
    with db.connect() as watch:
        in_turn_behind(watch, holder, [call])
    return call


def seed_hints(conn: psycopg.Connection, mode: str) -> None:
    """Claim hints as the claim tests' scenarios set them: "first", each lane's
    first ready row; "stacked", that and older hints below it (claims read a
    lane's highest only); any other mode, none."""
    if mode not in ("first", "stacked"):
        return
    conn.execute("insert into awa.lane_hints select lane_id, min(lane_seq) from awa.ready"
                 " group by lane_id")
    if mode == "stacked":
        conn.execute("insert into awa.lane_hints select f.lane_id, h from"
                     " (select lane_id, min(lane_seq) as m from awa.ready group by lane_id)"
                     " as f, generate_series(0, f.m - 1, 7) as h")
