"""Runtime snapshots: a Producer or Worker tells the database it is alive.

Every ``every`` seconds (10 by default) a daemon thread calls
``awa.publish_runtime`` on its own connection with the process's host, pid,
version, jobs in flight, and per queue how long ago it last enqueued, claimed
a job or polled there (a worker's claim call, with or without a job: a
worker on an idle queue is listed under it). The database dates that by its
own clock and records the queue's S at that moment; the admin page,
``GET /api/runtimes`` and ``awa runtimes`` read it (``live``). A snapshot
that fails is logged and retried next round: it never stops the runtime.

A snapshot holds what awa.publish_runtime takes: the queues used in the last
day (MAX_ACTIVITY_AGE; an older one is forgotten, so a process that runs for
months remembers a day's queues, not every queue it ever used), at most
MAX_ACTIVITIES of them, the latest. An age or a count past those had the
server refuse every snapshot from then on.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from awa_sql.connect import (
    connect,
    network_defaults,
    read_only_error,
    read_only_reason,
    resolve_dsn,
)
from awa_sql.queues import covered_by
from awa_sql.version import __version__

log = logging.getLogger("awa_sql.runtimes")

# awa.publish_runtime's bounds on its activity array.
MAX_ACTIVITY_AGE = 86_400.0  # seconds
MAX_ACTIVITIES = 1000

POLLS_RETRY_AFTER = 600.0  # seconds between tries of polls a contract refused
PUBLISH_SQL = (
    "select awa.publish_runtime(%s::uuid, %s::text, %s::text, %s::integer, %s::text,"
    " %s::integer, %s::jsonb)"
)


def _why(conn: psycopg.Connection | None, err: psycopg.Error) -> str:
    """The error of a snapshot; on a server that takes no writes (a
    standby), that, in an operator's words."""
    if conn is not None and not conn.closed and not isinstance(err, psycopg.OperationalError):
        try:
            if (reason := read_only_reason(conn)) is not None:
                return read_only_error(reason, "a runtime snapshot")
        except psycopg.Error:
            pass
    return str(err).strip()


def check_every(every: float) -> None:
    """Refuses a snapshot cadence that is not a positive number of seconds:
    at 0 or below the publisher would publish without a pause (a thousand
    writes a second)."""
    if (isinstance(every, bool) or not isinstance(every, int | float)
            or not (math.isfinite(every) and every > 0)):
        raise ValueError("snapshot_every must be a positive number of seconds, or None for off,"
                         f" got {every!r}")


class RuntimePublisher:
    def __init__(self, dsn: str, kind: str, *, every: float = 10.0,
                 in_flight: Callable[[], int] = lambda: 0) -> None:
        check_every(every)
        self.dsn = dsn
        self.kind = kind
        self.every = every
        self.in_flight = in_flight
        self.instance_id = uuid.uuid4()
        self._last: dict[tuple[str, str], float] = {}  # (queue, activity) -> monotonic
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = 0
        self._polls_refused_at: float | None = None  # monotonic; see _publish

    def note(self, queue: str, activity: str) -> None:
        """Record an enqueue or claim on a physical queue, or a poll of a name
        a worker claims by (cheap: a dict write)."""
        at = time.monotonic()
        with self._lock:
            self._last[(queue, activity)] = at

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="awa-runtime", daemon=True)
            self._thread.start()

    def publish_now(self) -> None:
        """Ask for a snapshot now instead of at the next tick."""
        self._wake.set()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        self._thread = None

    def _activities(self, now: float) -> list[tuple[tuple[str, str], float]]:
        """The activities a snapshot sends, the latest first; those older
        than MAX_ACTIVITY_AGE are forgotten."""
        with self._lock:
            for key in [k for k, at in self._last.items() if now - at > MAX_ACTIVITY_AGE]:
                del self._last[key]
            items = list(self._last.items())
        items.sort(key=lambda item: item[1], reverse=True)
        return items[:MAX_ACTIVITIES]

    def _snapshot(self) -> list:
        now = time.monotonic()
        items = self._activities(now)
        activity = [{"queue": q, "activity": a, "age_seconds": round(max(now - t, 0), 3)}
                    for (q, a), t in items]
        return [self.instance_id, self.kind, socket.gethostname(), os.getpid(), __version__,
                max(int(self.in_flight()), 0), Jsonb(activity)]

    def _publish(self, conn: psycopg.Connection) -> None:
        *head, activity = self._snapshot()
        kept = [a for a in activity.obj if a["activity"] != "poll"]
        refused = self._polls_refused_at
        if refused is not None and time.monotonic() - refused < POLLS_RETRY_AFTER:
            conn.execute(PUBLISH_SQL, [*head, Jsonb(kept)])
            return
        try:
            conn.execute(PUBLISH_SQL, [*head, activity])
            self._polls_refused_at = None
        except psycopg.errors.InvalidParameterValue:
            # A contract before migration 0037 takes no poll: until awa
            # migrate has run, the snapshots go without them (asked again
            # every POLLS_RETRY_AFTER, not every snapshot: each refusal is
            # an ERROR in the server's log).
            if len(kept) == len(activity.obj):
                raise
            conn.execute(PUBLISH_SQL, [*head, Jsonb(kept)])
            self._polls_refused_at = time.monotonic()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        failing = None  # the error last logged: the same again is not (a standby's)
        try:
            while True:
                try:
                    if conn is None or conn.closed:
                        # Bounded, as the worker's and producer's own: a host
                        # that never answers held this thread, and stop()
                        # gave up joining it.
                        conn = connect(self.dsn, autocommit=True,
                                       application_name="awa-runtime",
                                       **network_defaults(resolve_dsn(self.dsn)))
                    if self._stop.is_set():
                        conn.execute("select awa.remove_runtime(%s::uuid)",
                                     [self.instance_id])
                        return
                    self._publish(conn)
                    self.published += 1
                    failing = None
                except psycopg.Error as err:
                    said = _why(conn, err)
                    if said != failing:
                        log.warning("runtime snapshot failed: %s", said)
                    failing = said
                    if conn is not None:
                        conn.close()
                    conn = None
                    if self._stop.is_set():
                        return
                self._wake.wait(self.every)
                self._wake.clear()
        finally:
            if conn is not None:
                conn.close()


# LIVE_SQL, then QUEUE_FILTER when a queue is asked for (named only then, so
# that the unfiltered list works on a contract without it), then LIVE_ORDER.
LIVE_SQL = """
select r.instance_id::text as instance_id, r.kind, r.hostname, r.pid, r.version, r.in_flight,
       r.started_at, r.last_seen,
       extract(epoch from pg_catalog.statement_timestamp() - r.last_seen)::float8
           as last_seen_age_seconds,
       q.queue, q.activity, q.last_at, q.shards,
       extract(epoch from pg_catalog.statement_timestamp() - q.last_at)::float8 as age_seconds
  from awa.runtime_overview as r
  left join awa.runtime_queue_overview as q on q.instance_id = r.instance_id
"""
LIVE_ORDER = """
 order by r.kind, r.hostname, r.pid, r.instance_id, q.queue, q.activity
"""
QUEUE_FILTER = f"where {covered_by('q.queue')}"
RUNTIME_COLUMNS = ("instance_id", "kind", "hostname", "pid", "version", "in_flight",
                   "started_at", "last_seen", "last_seen_age_seconds")
QUEUE_COLUMNS = ("queue", "activity", "last_at", "shards", "age_seconds")


def live(conn: psycopg.Connection, queue: str | None = None) -> list[dict]:
    """The live runtimes (awa.runtime_overview: a snapshot in the last 30 s),
    each with the queues it enqueued to or claimed from (``queues``: the
    physical queue, the activity, when, the S then), read in one statement.
    ``queue``: only the runtimes that work on it (a logical name covers its
    partitions and stripes), with only its queues; the database's error for
    an unknown queue (42704) or a bad name (22xxx). Needs awa_reader or
    awa_operator."""
    if queue is not None:
        conn.execute("select awa.enqueue_shards(%s::text)", [queue])
    runtimes: dict[str, dict] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        query = LIVE_SQL + ("" if queue is None else QUEUE_FILTER) + LIVE_ORDER
        for row in cur.execute(query, {"queue": queue}):
            runtime = runtimes.setdefault(
                row["instance_id"], {**{c: row[c] for c in RUNTIME_COLUMNS}, "queues": []})
            if row["queue"] is not None:
                runtime["queues"].append({c: row[c] for c in QUEUE_COLUMNS})
    return list(runtimes.values())
