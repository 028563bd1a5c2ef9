"""An operator's calls on whole queues besides S: dropping one (awa.drop_queue,
ADR 044) and the queue limit (awa.set_max_queues, ADR 039). ``awa storage
drop`` and ``awa storage queue-limit`` on the command line, the admin API's
drop and queue-limit routes.

Each function takes an open psycopg connection (sync) and uses only the public
SQL API: the database decides what may be dropped and which limits are in
range, and its errors are raised as they come.
"""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row


def covered_by(column: str, param: str = "queue") -> str:
    """SQL: ``column`` is one of the physical queues that the name in the
    parameter ``param`` covers (``awa.covered_queues``). Read into an array
    first, so that the planner probes each queue by its key: ``column in
    (select awa.covered_queues(...))`` is planned for a thousand names and
    worked out the overview of every queue in the database (156 ms at 3,000
    queues; on PostgreSQL 17 a lock on every lane's sequence read)."""
    return f"{column} = any(array(select awa.covered_queues(%({param})s::text)))"


COUNTS = ("ready", "running", "scheduled", "completed_kept", "failed_kept", "cancelled_kept")
KEPT = ("completed_kept", "failed_kept", "cancelled_kept")


def plan_drop(conn: psycopg.Connection, queue: str, discard_finished: bool) -> dict:
    """What a drop of ``queue`` meets: its exact job counts (awa.queue_counts,
    which reads every row: on demand only), the kept terminal jobs among them,
    and the question that confirms the drop. Changes nothing. Raises the
    database's error for an unknown queue (42704) or a bad name (22xxx). The
    drop itself decides whether the queue may go."""
    conn.execute("select awa.enqueue_shards(%s::text)", [queue])
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            f"select {', '.join(f'c.{c}' for c in COUNTS)}"
            " from awa.queue_counts(%s::text) as c where c.queue = %s::text",
            [queue, queue]).fetchone()
    counts = {c: (row[c] if row else 0) for c in COUNTS}
    kept = sum(counts[c] for c in KEPT)
    discards = (f", deleting its {kept} kept terminal job(s)"
                if discard_finished and kept else "")
    return {"queue": queue, "discard_finished": discard_finished, "counts": counts,
            "kept": kept, "question": f"Drop queue {queue!r}{discards}?"}


def drop(conn: psycopg.Connection, queue: str, discard_finished: bool) -> None:
    """awa.drop_queue: 55006 for a queue that is not empty, 0A000 for a
    partition, a stripe or a queue that has them; the caller commits."""
    conn.execute("select awa.drop_queue(%s::text, %s::boolean)", [queue, discard_finished])


def queue_limit(conn: psycopg.Connection) -> dict:
    """The queue limit and how many physical queues count under it."""
    max_queues, queues = conn.execute(
        "select l.max_queues, l.queues from awa.queue_limit as l").fetchone()
    return {"max_queues": max_queues, "queues": queues}


def set_queue_limit(conn: psycopg.Connection, max_queues: int) -> dict:
    """awa.set_max_queues, which checks the range (22023, naming it); with the
    limit it replaces, read in the same transaction just before."""
    previous = queue_limit(conn)["max_queues"]
    queues = conn.execute("select awa.set_max_queues(%s::integer)", [max_queues]).fetchone()[0]
    return {"max_queues": max_queues, "previous": previous, "queues": queues}
