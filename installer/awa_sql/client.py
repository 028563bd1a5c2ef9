"""A thin Python producer for the awa SQL contract (psycopg 3, sync and async).

Each function takes a connection and runs inside its current transaction, so
an enqueue commits or rolls back with the caller's own writes
(transactional enqueue). ``Producer`` opens its own connection and commits
each call instead.
"""

from __future__ import annotations

import logging
import operator
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from time import perf_counter
from typing import Any

import psycopg
from psycopg import pq
from psycopg.abc import Buffer
from psycopg.copy import Copy, Writer
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from awa_sql import routing
from awa_sql.connect import (
    connect,
    network_defaults,
    parse_dsn,
    read_only_error,
    read_only_reason,
    resolve_dsn,
)
from awa_sql.metrics import client_metrics
from awa_sql.metrics.client_metrics import WAIT_COLUMNS
from awa_sql.runtimes import RuntimePublisher, check_every

log = logging.getLogger("awa_sql.client")

Key = routing.Key | None

RESULT = f"job_id, queue, priority, enqueue_shard, lane_seq, duplicate, {WAIT_COLUMNS}"
WAITS = 6  # the row's index of the first of WAIT_COLUMNS
ENQUEUE_SQL = (
    f"select {RESULT} from awa.enqueue("
    "%(queue)s::text, %(kind)s::text, %(args)s::jsonb, %(priority)s::smallint,"
    " %(ordering_key)s::bytea, %(run_at)s::timestamptz, %(max_attempts)s::integer)"
)
# A job with its own max run time or a unique key: a batch of one, as
# awa.enqueue takes no max run time (ADR 026) and takes a unique key the
# batch's way (ADR 027). The statement of the others stays as it was.
ENQUEUE_OPTIONS_SQL = (
    f"select {RESULT}"
    " from awa.enqueue_batch(array[%(queue)s::text], array[%(kind)s::text],"
    " array[%(args)s::jsonb], array[%(priority)s::smallint], array[%(ordering_key)s::bytea],"
    " array[%(run_at)s::timestamptz], array[%(max_attempts)s::integer],"
    " array[%(max_run_time)s::interval], array[%(unique_key)s::bytea],"
    " array[%(unique_window)s::interval])"
)
BATCH_SQL = (
    f"select {RESULT}"
    " from awa.enqueue_batch("
    "%s::text[], %s::text[], %s::jsonb[], %s::smallint[], %s::bytea[], %s::timestamptz[],"
    " %s::integer[])"
)
# By how many columns a batch sends: the optional ones only when a job has one.
BATCH_SQLS = {
    7: BATCH_SQL,
    8: BATCH_SQL[:-1] + ", %s::interval[])",
    10: BATCH_SQL[:-1] + ", %s::interval[], %s::bytea[], %s::interval[])",
}
COPY_COLUMNS = "queue, priority, ordering_key, kind, args, run_at, max_attempts"
COPY_SQLS = {
    7: f"copy awa.copy_staging ({COPY_COLUMNS}) from stdin",
    8: f"copy awa.copy_staging ({COPY_COLUMNS}, max_run_time) from stdin",
    10: f"copy awa.copy_staging ({COPY_COLUMNS}, max_run_time, unique_key, unique_window)"
        " from stdin",
}
COPY_SQL = COPY_SQLS[7]
_NO_OVERRIDE: Mapping[str, Any] = {}
COPIED_SQL = f"select n, {WAIT_COLUMNS} from awa.enqueue_copied() as n"
JOB_FIELDS = ("kind", "args", "queue", "priority", "ordering_key", "run_at", "max_attempts",
              "max_run_time", "unique_key", "unique_window")
_JOB_FIELD_SET = frozenset(JOB_FIELDS)


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue did. ``duplicate``: the job was not inserted because
    another job holds its unique key; ``job_id``, ``queue`` and ``priority``
    are then that job's, ``enqueue_shard`` and ``lane_seq`` None."""

    job_id: int
    queue: str
    priority: int
    enqueue_shard: int | None
    lane_seq: int | None
    duplicate: bool = False


# The values the server takes (awa._priority_ok and awa._max_attempts_ok,
# sql/queues.sql), mirrored to refuse a value before it is sent: the server
# casts first, so it rounded a float (a priority of 2.6 was stored as 3),
# and a cast's error named neither the field nor the job (22003 "smallint
# out of range", 42846 for a bool). tests/test_client_job_values.py holds
# them to the server's.
PRIORITIES = (1, 4)
MAX_ATTEMPTS = (1, 1000)


def _whole(where: str, field: str, value: Any, bounds: tuple[int, int], range_text: str) -> Any:
    """``value`` as an int in ``bounds``, or None (the default, or the
    server's own error for a null): an int, not a bool nor a float."""
    if value is None:
        return None
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None:
        raise TypeError(f"{where}{field} must be an int {range_text}, got {value!r}"
                        f" ({type(value).__name__})")
    if not bounds[0] <= number <= bounds[1]:
        raise ValueError(f"{where}{field} must be an int {range_text}, got {value!r}")
    return number


def _times(where: str, run_at: Any, max_run_time: Any, unique_window: Any) -> None:
    """Refuses a run_at that is not an aware datetime and a max_run_time or
    unique_window that is not a timedelta (None: the default). The server
    would read a str or a date in its session's TimeZone (as a naive
    datetime, which Retry(at=...) refuses too), and would take an int as
    seconds through COPY but fail the others' casts, aborting the
    transaction."""
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"{where}run_at must be an aware datetime (with tzinfo) or None,"
                            f" got {run_at!r} ({type(run_at).__name__})")
        if run_at.utcoffset() is None:
            raise ValueError(
                f"{where}run_at must be an aware datetime (with tzinfo), got {run_at!r}")
    for field, value in (("max_run_time", max_run_time), ("unique_window", unique_window)):
        if value is not None and not isinstance(value, timedelta):
            raise TypeError(f"{where}{field} must be a timedelta or None, got {value!r}"
                            f" ({type(value).__name__})")


def _job_values(where: str, priority: Any, max_attempts: Any, args: Any, run_at: Any,
                max_run_time: Any, unique_window: Any
                ) -> tuple[int | None, int | None, Jsonb]:
    """The priority, max_attempts and args of one job as sent, its run_at,
    max_run_time and unique_window checked (_times): the one place every
    enqueue path goes through (enqueue and enqueue_async by _params,
    enqueue_many by _columns, enqueue_many_copy by _copy_rows). ``where``
    names the job of a call of many ("job 3 (1-based): ")."""
    _times(where, run_at, max_run_time, unique_window)
    return (_whole(where, "priority", priority, PRIORITIES,
                   f"between {PRIORITIES[0]} (highest) and {PRIORITIES[1]} (lowest)"),
            _whole(where, "max_attempts", max_attempts, MAX_ATTEMPTS,
                   f"between {MAX_ATTEMPTS[0]} and {MAX_ATTEMPTS[1]}"),
            # Encoded by psycopg's JSON dumps, the one its caller may have set.
            Jsonb(args if type(args) is dict else dict(args or {})))


def _key(key: Key, what: str) -> bytes | None:
    return None if key is None else routing.key_bytes(key, what)


def _check_job(job: Mapping[str, Any], n: int, kind: Any, queue: Any) -> None:
    """Refuses job ``n`` (1-based, as the SQL errors count) before anything is
    sent: a field no enqueue reads (a typo would be dropped silently), no
    kind or queue once defaults are applied."""
    if not job.keys() <= _JOB_FIELD_SET:
        unknown = sorted(set(job) - _JOB_FIELD_SET)
        raise TypeError(f"job {n} (1-based): unknown job fields {unknown};"
                        f" allowed: {', '.join(JOB_FIELDS)}")
    if kind is None:
        raise ValueError(f"job {n} (1-based) has no kind")
    if queue is None:
        raise ValueError(f"job {n} (1-based) has no queue: pass queue= or set it per job")


def _params(kind: str, args: Mapping[str, Any] | None, queue: str, priority: int,
            ordering_key: Key, run_at: datetime | None, max_attempts: int,
            max_run_time: timedelta | None, unique_key: Key,
            unique_window: timedelta | None) -> dict:
    priority, max_attempts, encoded = _job_values("", priority, max_attempts, args, run_at,
                                                  max_run_time, unique_window)
    return {"queue": queue, "kind": kind, "args": encoded,
            "priority": priority, "ordering_key": _key(ordering_key, "ordering_key"),
            "run_at": run_at, "max_attempts": max_attempts, "max_run_time": max_run_time,
            "unique_key": _key(unique_key, "unique_key"), "unique_window": unique_window}


def _enqueue_sql(params: Mapping[str, Any]) -> str:
    options = ("max_run_time", "unique_key", "unique_window")
    return ENQUEUE_SQL if all(params[o] is None for o in options) else ENQUEUE_OPTIONS_SQL


# What awa.enqueue_batch puts before the error of its one element.
_BATCH_OF_ONE = "batch element 1 (1-based): "


@contextmanager
def _as_one_job(conn: psycopg.Connection | psycopg.AsyncConnection) -> Iterator[None]:
    """The error of a single enqueue, whichever statement it went as. A job
    with options goes as a batch of one (ENQUEUE_OPTIONS_SQL), whose checks
    name the element: "batch element 1 (1-based): max_run_time must be ...",
    of a batch the caller never made. Raised again as the same class with
    the same diagnostics (SQLSTATE, context), the prefix taken off."""
    try:
        yield
    except psycopg.Error as error:
        message = error.diag.message_primary
        result = error.pgresult
        if result is None or message is None or not message.startswith(_BATCH_OF_ONE):
            raise
        encoding = conn.info.encoding
        info = {field: result.error_field(field) for field in pq.DiagnosticField}
        info[pq.DiagnosticField.MESSAGE_PRIMARY] = message.removeprefix(
            _BATCH_OF_ONE).encode(encoding)
        raise type(error)(str(error).replace(_BATCH_OF_ONE, "", 1), info=info,
                          encoding=encoding) from None


def enqueue(conn: psycopg.Connection, kind: str, args: Mapping[str, Any] | None = None, *,
            queue: str, priority: int = 2, ordering_key: Key = None,
            run_at: datetime | None = None, max_attempts: int = 25,
            max_run_time: timedelta | None = None, unique_key: Key = None,
            unique_window: timedelta | None = None) -> Enqueued:
    """One job, in ``conn``'s current transaction. ``max_run_time``: the job's own
    (None: its queue's, ``awa.set_max_run_time``). ``unique_key`` (bytes or str,
    see ``awa_sql.unique_key``): while another job of the logical queue holds
    it, nothing is inserted and the result is that job, ``duplicate`` True;
    ``unique_window``: how long a completed job keeps holding it."""
    started = perf_counter()
    params = _params(kind, args, queue, priority, ordering_key, run_at, max_attempts,
                     max_run_time, unique_key, unique_window)
    with _as_one_job(conn):
        row = conn.execute(_enqueue_sql(params), params).fetchone()
    client_metrics.enqueued(conn, queue, "enqueue", 1, started, row[WAITS:])
    return Enqueued(*row[:WAITS])


def _columns(jobs: Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]) -> list[list]:
    unknown = set(defaults) - _JOB_FIELD_SET
    if unknown:
        raise TypeError(f"unknown job fields: {sorted(unknown)}; allowed: {', '.join(JOB_FIELDS)}")
    _times("the default ", defaults.get("run_at"), defaults.get("max_run_time"),
           defaults.get("unique_window"))
    cols: dict[str, list] = {f: [] for f in JOB_FIELDS}
    for n, job in enumerate(jobs, 1):
        merged = {**defaults, **job}
        _check_job(job, n, merged.get("kind"), merged.get("queue"))
        merged["priority"], merged["max_attempts"], merged["args"] = _job_values(
            f"job {n} (1-based): ", merged.get("priority"), merged.get("max_attempts"),
            merged.get("args"), merged.get("run_at"), merged.get("max_run_time"),
            merged.get("unique_window"))
        for f in JOB_FIELDS:
            value = merged.get(f)
            if f in ("ordering_key", "unique_key"):
                value = _key(value, f"job {n} (1-based): {f}")
            cols[f].append(value)
    return _optional([cols[f] for f in (
        "queue", "kind", "args", "priority", "ordering_key", "run_at", "max_attempts",
        "max_run_time", "unique_key", "unique_window")])


def _optional(columns: list[list]) -> list[list]:
    """The seven columns every job has, then the optional ones (max run time,
    unique key and window) only as far as a job gives one (BATCH_SQLS, COPY_SQLS)."""
    if any(v is not None for col in columns[8:] for v in col):
        return columns
    if any(v is not None for v in columns[7]):
        return columns[:8]
    return columns[:7]


def _batch_sql(columns: list[list]) -> str:
    return BATCH_SQLS[len(columns)]


def enqueue_many(conn: psycopg.Connection, jobs: Sequence[Mapping[str, Any]],
                 **defaults: Any) -> list[Enqueued]:
    """Many jobs in one round trip (``awa.enqueue_batch``), results in input order.

    Each job is a mapping with ``kind`` and any of ``args``, ``queue``,
    ``priority``, ``ordering_key``, ``run_at``, ``max_attempts``,
    ``max_run_time``, ``unique_key``, ``unique_window``; ``defaults`` fill
    what a job leaves out. Of jobs with one unique key, the first is inserted
    and the others come back as duplicates of it.
    """
    columns = _columns(jobs, defaults)
    if not jobs:
        return []
    started = perf_counter()
    rows = conn.execute(_batch_sql(columns), columns).fetchall()
    client_metrics.enqueued(conn, columns[0], "batch", len(rows), started, rows[-1][WAITS:])
    return [Enqueued(*r[:WAITS]) for r in rows]


def enqueue_many_copy(conn: psycopg.Connection, jobs: Sequence[Mapping[str, Any]], *,
                      queue: str | None = None, ordering_key: Key = None,
                      opts: Sequence[Mapping[str, Any] | None] | None = None) -> int:
    """Bulk enqueue through COPY and ``awa.enqueue_copied()``; returns the count.

    ``opts``, if given, is aligned with ``jobs``: each entry may override
    ``queue`` and ``ordering_key`` for its job. The COPY and the call that
    enqueues its rows share one transaction: the caller's, or on an
    autocommit connection one of their own (so a transaction pooler keeps
    them on one server connection). A job may carry ``max_run_time``,
    ``unique_key`` and ``unique_window``; the count includes duplicates of a
    unique key, which COPY does not report one by one.
    """
    return _enqueue_many_copy(conn, jobs, queue, ordering_key, opts)[0]


def _enqueue_many_copy(conn: psycopg.Connection, jobs: Sequence[Mapping[str, Any]],
                       queue: str | None = None, ordering_key: Key = None,
                       opts: Sequence[Mapping[str, Any] | None] | None = None
                       ) -> tuple[int, set[str]]:
    """enqueue_many_copy's count, and the names of the queues its rows were sent to."""
    # Read more than once (the widest row, then the rows): a generator would
    # be used up by the first read and its jobs silently dropped.
    jobs = list(jobs)
    if opts is not None and len(opts) != len(jobs):
        raise ValueError(
            f"opts has {len(opts)} entries but jobs has {len(jobs)}; they must be aligned"
        )
    with conn.transaction() if conn.autocommit else nullcontext():
        return _copy_and_enqueue(conn, jobs, queue, ordering_key, opts)


def _copy_rows(jobs: Sequence[Mapping[str, Any]], queue: str | None, ordering_key: Key,
               opts: Sequence[Mapping[str, Any] | None] | None, queues: set[str]
               ) -> Iterator[tuple]:
    """The COPY rows of ``jobs``, each job checked as its row is made; the
    queues they go to are added to ``queues``."""
    for i, job in enumerate(jobs):
        override = (opts[i] or _NO_OVERRIDE) if opts is not None else _NO_OVERRIDE
        if override and not override.keys() <= {"queue", "ordering_key"}:
            bad = sorted(set(override) - {"queue", "ordering_key"})
            raise ValueError(f"opts[{i}] may set queue and ordering_key, not {bad}")
        row_queue = override.get("queue", job.get("queue", queue))
        _check_job(job, i + 1, job.get("kind"), row_queue)
        queues.add(row_queue)
        key = override.get("ordering_key", job.get("ordering_key", ordering_key))
        priority, max_attempts, args = _job_values(
            f"job {i + 1} (1-based): ", job.get("priority"), job.get("max_attempts"),
            job.get("args"), job.get("run_at"), job.get("max_run_time"),
            job.get("unique_window"))
        yield (row_queue, priority,
               _key(key, f"job {i + 1} (1-based): ordering_key"), job["kind"], args,
               job.get("run_at"), max_attempts, job.get("max_run_time"),
               _key(job.get("unique_key"), f"job {i + 1} (1-based): unique_key"),
               job.get("unique_window"))


# COPY data kept in memory up to this size, beyond it in a temporary file.
KEPT_IN_MEMORY = 16 * 1024 * 1024
SEND_CHUNK = 1024 * 1024


class _Kept(Writer):
    """Keeps the data a Copy formats, to send later: in memory up to
    KEPT_IN_MEMORY bytes, then in a temporary file, so that a load of a
    gigabyte does not need a gigabyte more of the client's memory."""

    def __init__(self, spool: tempfile.SpooledTemporaryFile) -> None:
        self.spool = spool

    def write(self, data: Buffer) -> None:
        self.spool.write(data)


def _copy_data(conn: psycopg.Connection, spool: tempfile.SpooledTemporaryFile,
               jobs: Sequence[Mapping[str, Any]], queue: str | None, ordering_key: Key,
               opts: Sequence[Mapping[str, Any] | None] | None, width: int) -> set[str]:
    """The COPY data of ``jobs`` and the queues they go to, made before the
    COPY starts by the formatting COPY itself uses (a Copy that writes to a
    list): a value it cannot send (args json.dumps refuses, a NUL or a lone
    surrogate in a text field) raises the error enqueue and enqueue_many give
    for it, and the caller's transaction stays usable, which a COPY cut off
    half way leaves failed. The data goes to ``spool``."""
    queues: set[str] = set()
    with conn.cursor() as cur, Copy(cur, writer=_Kept(spool)) as staged:
        for row in _copy_rows(jobs, queue, ordering_key, opts, queues):
            staged.write_row(row[:width])
    return queues


def _copy_and_enqueue(conn: psycopg.Connection, jobs: Sequence[Mapping[str, Any]],
                      queue: str | None, ordering_key: Key,
                      opts: Sequence[Mapping[str, Any] | None] | None) -> tuple[int, set[str]]:
    started = perf_counter()
    width = 7
    if any(job.get(f) is not None for job in jobs for f in ("unique_key", "unique_window")):
        width = 10
    elif any(job.get("max_run_time") is not None for job in jobs):
        width = 8
    with tempfile.SpooledTemporaryFile(max_size=KEPT_IN_MEMORY) as spool:
        queues = _copy_data(conn, spool, jobs, queue, ordering_key, opts, width)
        spool.seek(0)
        with conn.cursor() as cur, cur.copy(COPY_SQLS[width]) as cp:
            while chunk := spool.read(SEND_CHUNK):
                cp.write(chunk)
    row = conn.execute(COPIED_SQL).fetchone()
    client_metrics.enqueued(conn, queues, "copy", row[0], started, row[1:])
    return row[0], queues


class Producer:
    """Owns a connection; every call is its own committed transaction.

    A connection it opened and then lost (a server restart, a terminated
    backend) is opened again at the next call. The call that found it lost
    raises, unless it found it at its BEGIN, before any of its statements was
    sent: that call runs on the new connection. A call cut off later raises,
    as its transaction may have committed; it is never sent again.

    It may be shared by threads: their calls take turns on its connection.
    A connection passed as ``conn`` must be idle at each call (no transaction
    open): one inside the caller's transaction is refused, as a call would
    commit nothing of its own there (``awa_sql.enqueue(conn, ...)`` enqueues
    in the caller's transaction).

    Given a DSN, it also publishes a runtime snapshot every ``snapshot_every``
    seconds on a second connection, for the admin page (None: off; off as well
    when given only ``conn``, whose password psycopg does not expose).
    ``prepared_statements`` (``"auto"``, ``"on"``, ``"off"``; default from
    ``AWA_PREPARED_STATEMENTS``, else auto) applies to the connections it opens;
    a connection passed as ``conn`` is used as it is, and not opened again.
    """

    def __init__(self, dsn: str | None = None, *, conn: psycopg.Connection | None = None,
                 snapshot_every: float | None = 10.0,
                 prepared_statements: str | bool | None = None):
        self._dsn = resolve_dsn(dsn)
        if conn is None or dsn is not None:
            parse_dsn(self._dsn)  # a malformed DSN fails here, without its text
        if snapshot_every is not None:
            check_every(snapshot_every)
        self._prepared = prepared_statements
        self._owned = conn is None
        self._closed = False
        self._lock = threading.Lock()  # one call at a time on the connection
        self._conn = conn if conn is not None else connect(
            self._dsn, prepared_statements=prepared_statements,
            **network_defaults(self._dsn))
        if self._owned:
            self._refuse_read_only()
        self.runtime = None
        if snapshot_every is not None and (conn is None or dsn is not None):
            self.runtime = RuntimePublisher(resolve_dsn(dsn), "producer", every=snapshot_every)
            self.runtime.start()

    def _refuse_read_only(self) -> None:
        """A server that takes no writes (a standby) would fail every call
        with 25006: refused here, with what to do, before anything starts."""
        try:
            reason = read_only_reason(self._conn)
        except BaseException:
            self._conn.close()
            raise
        if reason is not None:
            self._conn.close()
            raise psycopg.errors.ReadOnlySqlTransaction(read_only_error(reason, "a Producer"))

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        if self.runtime is not None:
            self.runtime.stop()
        self._conn.close()

    def _run(self, fn, *args, **kwargs):
        with self._lock, ExitStack() as stack:
            conn = self._begin(stack)
            return fn(conn, *args, **kwargs)

    def _lost(self) -> bool:
        """The connection is one it opened and it was lost (not closed by close())."""
        return self._owned and not self._closed and self._conn.closed

    def _reopen(self) -> None:
        self._conn = connect(self._dsn, prepared_statements=self._prepared,
                             **network_defaults(self._dsn))

    def _begin(self, stack: ExitStack) -> psycopg.Connection:
        """Enters the call's transaction, on a new connection if the last was lost."""
        if self._lost():
            self._reopen()
        try:
            self._refuse_busy()
            stack.enter_context(self._conn.transaction())
        except psycopg.OperationalError as err:
            if not self._lost():
                raise
            # Lost at BEGIN: nothing of this call was sent, so it may go on a new one.
            log.warning("producer: connection lost: %s; connecting again",
                        " ".join(str(err).split()))
            self._reopen()
            stack.enter_context(self._conn.transaction())
        return self._conn

    def _refuse_busy(self) -> None:
        """A connection inside a transaction would take the call's as a
        savepoint of it, and the call would commit nothing of its own: a
        ``conn`` given so is refused; one of its own (left so by a use
        outside its calls) is rolled back."""
        if self._conn.closed:
            return  # BEGIN raises, or finds it lost
        status = self._conn.info.transaction_status
        if status == TransactionStatus.IDLE:
            return
        if not self._owned:
            raise psycopg.ProgrammingError(
                "the connection given as Producer(conn=...) is not idle (transaction status"
                f" {status.name}): a Producer commits each call as a transaction of its own,"
                " which it cannot inside yours; to enqueue inside your own transaction, use"
                " awa_sql.enqueue(conn, ...) (or enqueue_many, enqueue_many_copy)")
        log.warning("producer: its connection was left in a transaction (%s); rolling it back",
                    status.name)
        self._conn.rollback()

    def _note(self, queues: Iterable[str]) -> None:
        if self.runtime is not None:
            for q in set(queues):
                self.runtime.note(q, "enqueue")

    def enqueue(self, kind: str, args: Mapping[str, Any] | None = None, **kw) -> Enqueued:
        result = self._run(enqueue, kind, args, **kw)
        self._note([result.queue])
        return result

    def enqueue_many(self, jobs: Sequence[Mapping[str, Any]], **defaults) -> list[Enqueued]:
        results = self._run(enqueue_many, jobs, **defaults)
        self._note(r.queue for r in results)
        return results

    def enqueue_many_copy(self, jobs: Sequence[Mapping[str, Any]], **kw) -> int:
        count, queues = self._run(_enqueue_many_copy, jobs, **kw)
        # COPY reports no physical queue: the names its rows were sent to are noted.
        self._note(queues)
        return count


# -- async -------------------------------------------------------------------------------


async def enqueue_async(conn: psycopg.AsyncConnection, kind: str,
                        args: Mapping[str, Any] | None = None, *, queue: str,
                        priority: int = 2, ordering_key: Key = None,
                        run_at: datetime | None = None, max_attempts: int = 25,
                        max_run_time: timedelta | None = None, unique_key: Key = None,
                        unique_window: timedelta | None = None) -> Enqueued:
    started = perf_counter()
    params = _params(kind, args, queue, priority, ordering_key, run_at, max_attempts,
                     max_run_time, unique_key, unique_window)
    with _as_one_job(conn):
        cur = await conn.execute(_enqueue_sql(params), params)
        row = await cur.fetchone()
    client_metrics.enqueued(conn, queue, "enqueue", 1, started, row[WAITS:])
    return Enqueued(*row[:WAITS])


async def enqueue_many_async(conn: psycopg.AsyncConnection,
                             jobs: Sequence[Mapping[str, Any]], **defaults: Any
                             ) -> list[Enqueued]:
    columns = _columns(jobs, defaults)
    if not jobs:
        return []
    started = perf_counter()
    cur = await conn.execute(_batch_sql(columns), columns)
    rows = await cur.fetchall()
    client_metrics.enqueued(conn, columns[0], "batch", len(rows), started, rows[-1][WAITS:])
    return [Enqueued(*r[:WAITS]) for r in rows]

