"""A small worker loop for the awa SQL contract.

Per queue, one claimer thread and ``max_workers`` slot threads, each with its
own connection. The claimer claims as many jobs as there are free slots (at
most ``batch``) in one ``awa.claim`` call and hands them to the slots, which
run the handlers and complete or fail the jobs. A handler is a function or
an ``async def``; a coroutine runs in an event loop of its slot. On an empty claim the claimer
backs off, from 10 ms doubling up to ``poll_interval``, and is back at 10 ms
as soon as a claim returns a job: one poller per queue, no busy loop, and a
job that arrives in an idle queue waits at most ``poll_interval``. It polls
rather than LISTENs because workers run behind transaction-pooling PgBouncer
(docs/python.md). A single heartbeat thread extends the leases of running
jobs, never past a job's deadline (``deadline_at``, from its max run time):
at the deadline an async handler is cancelled and the attempt failed, while
a plain function, which Python cannot interrupt, runs on without a lease
until ``awa.rescue_expired`` takes the job. A handler that raises
``Retry(at=...)`` or ``Retry(after=...)`` chooses when its job runs again.
``stop()`` (or SIGTERM or SIGINT when ``run()`` is on the main thread) stops the
claimers and gives every held job's handler ``shutdown_timeout`` to finish,
heartbeating the job meanwhile; a job whose handler still runs then (or at a
second signal) is handed back with awa.fail, a retry due at once, and
``run()`` returns without waiting for that handler (an async one is cancelled;
a plain one runs on in its daemon thread, which Python cannot stop; a late
outcome is refused under the dead lease). With
``maintain=True`` a thread runs the loop of ``awa maintain``
(awa_sql.maintain.Maintainer) beside them.

Each thread opens its connection when it first needs one and opens it again
when it was lost (_Link). A claim that fails is retried with back-off (0.5 s
up to 30 s), a heartbeat pass at the next beat. A complete or fail that cannot
reach the server is sent again while the job's lease may be current (_record);
when a send was lost with its answer and the next finds the run ended,
awa.run_outcome says whether that first send recorded it (_settle);
one that still could not be recorded is logged and the slot takes the next
job; the job it held is no longer heartbeated, so its lease expires and
``awa.rescue_expired`` retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import queue as queue_mod
import secrets
import signal
import socket
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from awa_sql.connect import (
    connect,
    network_defaults,
    one_line,
    parse_dsn,
    prepared_mode,
    read_only_error,
    read_only_reason,
    resolve_dsn,
)
from awa_sql.defaults import EVERY_MAX, EVERY_MIN
from awa_sql.jsonb import Undecodable, decode_apart
from awa_sql.maintain import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    TASK_NAMES,
    Backoff,
    Maintainer,
    missing_grant,
)
from awa_sql.metrics import client_metrics
from awa_sql.partitions import iter_configs
from awa_sql.runtimes import RuntimePublisher

log = logging.getLogger("awa_sql.worker")

# deadline_at - statement_timestamp() is the job's max run time by the
# server's clock: the claim counts its deadline from its statement's start.
# The last parameter, awa.claim's family, is False for a config of one
# partition (queue_configs()): partition 0's name is the logical queue's,
# whose claim with family covers every partition.
CLAIM_SQL = (
    "select job_id, run_lease, queue, priority, enqueue_shard, lane_seq, kind, args, attempt,"
    " max_attempts, ordering_key, deadline_at, deadline_at - statement_timestamp()"
    " from awa.claim(%s::text[], %s, %s::text, %s::interval, %s::boolean)"
)
MIN_POLL = 0.01  # seconds; the first wait after an empty claim
# The bounds awa.claim (sql/claim.sql) puts on its lease (awa._lease_ok:
# at most 30 days, in seconds) and on its worker name (bytes, in awa's UTF-8
# database): checked when the Worker is made, not refused at every claim.
# tests/test_client_inputs.py holds them to what the server takes.
MAX_LEASE = timedelta(days=30)
MAX_NAME_BYTES = 255
RECORD_BACKOFF_MAX = 5.0  # seconds between tries to record an outcome, at most
# After a heartbeat pass that could not reach the server, the next try comes
# after this, doubled at each failure up to heartbeat_every: a server back
# from a restart or a failover extends the leases long before they end.
HEARTBEAT_RETRY_MIN = 1.0
# How long a heartbeat or a shutdown's hand-back waits for a run another
# transaction holds (an operator's cancel left open in psql): past it that
# job is skipped (until the next pass; for a hand-back, left to its lease's
# end), so it holds back neither the other jobs nor a shutdown. Set for the
# statement's own transaction (one statement: a transaction pooler may send
# each to another server connection); the first parameter of both statements.
RUN_LOCK_TIMEOUT = "5s"
_BOUNDED = ("with bound as materialized (select set_config('lock_timeout', %s, true))"
            " select {} from bound")
HEARTBEAT_SQL = _BOUNDED.format("awa.heartbeat(%s, %s, %s)")
HAND_BACK_SQL = _BOUNDED.format("awa.fail(%s, %s, %s, now())")
# Seconds a held job's handler gets after stop() before its job is handed
# back: under Kubernetes' default grace period of 30 s before SIGKILL, with
# time left to hand the jobs back (ADR 046).
SHUTDOWN_TIMEOUT = 25.0
# The first line of a handed-back job's last error (what awa.failure_summary
# groups by); the second says after how long and which worker.
HAND_BACK_ERROR = "handed back at worker shutdown: its handler was still running"
QUEUE_KEYS = ("queue", "max_workers", "family")
# Keys PartitionedQueue.queue_configs() writes that the Worker does not
# implement: taken when None, refused otherwise.
UNSUPPORTED_QUEUE_KEYS = ("min_workers", "rate_limit")


@dataclass(frozen=True)
class Job:
    job_id: int
    run_lease: int
    queue: str
    priority: int
    enqueue_shard: int
    lane_seq: int
    kind: str
    args: dict
    attempt: int
    max_attempts: int
    ordering_key: bytes | None
    deadline_at: datetime | None = None  # the server's; None: no deadline
    max_run_time: timedelta | None = None  # deadline_at less the claim's time


class Retry(Exception):
    """Raised by a handler: this attempt failed, run the job again at ``at``
    (an aware datetime) or ``after`` from now (the server's clock); with
    neither, after the queue's backoff, as for any exception. The attempt
    counts: after ``max_attempts`` the job fails for good."""

    def __init__(self, reason: str = "retry requested", *, at: datetime | None = None,
                 after: timedelta | None = None) -> None:
        if at is not None and after is not None:
            raise ValueError("Retry takes at= or after=, not both")
        if at is not None and at.tzinfo is None:
            raise ValueError("Retry(at=...) needs an aware datetime (with tzinfo)")
        if after is not None and after < timedelta(0):
            raise ValueError("Retry(after=...) must not be negative")
        super().__init__(reason)
        self.at = at
        self.after = after


class DeadlineExceeded(Exception):
    """An async handler was cancelled at its job's deadline."""


class _BadArgs(Exception):
    """A job whose args could not be decoded: its handler is not called."""


def deadline_message(max_run_time: timedelta) -> str:
    """'deadline exceeded after N s', N as awa.rescue_expired writes it (trim_scale)."""
    seconds, micros = divmod(max_run_time // timedelta(microseconds=1), 1_000_000)
    n = str(seconds) if not micros else f"{seconds}.{micros:06d}".rstrip("0")
    return f"deadline exceeded after {n} s"


@dataclass
class _Held:
    """A job a slot holds (keyed by job id and run lease in Worker._running):
    its lease and its deadline on this host's monotonic clock."""

    deadline: float | None
    # When the server's lease surely ends (this host's monotonic clock): the
    # claim's or last heartbeat's answer plus the lease.
    lease_until: float = float("inf")
    passed: bool = False  # the heartbeat thread saw the deadline pass
    is_async: bool = False
    kind: str = ""  # for the shutdown's log of the jobs it hands back
    last_attempt: bool = False
    # An async handler's task cancelled from another thread (the hand-back).
    cancel: Callable[[], object] | None = None


# Held jobs as Worker._running holds them: ((job_id, run_lease), _Held).
_HeldJobs = list[tuple[tuple[int, int], _Held]]


def _cancel_in(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    """Cancels a task of another thread's loop; a loop closed since has no task left."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(task.cancel)


async def _within(awaitable: Awaitable[Any], seconds: float | None) -> Any:
    """Awaits the handler's coroutine, cancelled after ``seconds`` (None: never)."""
    if seconds is None:
        return await awaitable
    try:
        async with asyncio.timeout(max(seconds, 0.0)) as scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            raise DeadlineExceeded from None
        raise


def _sendable(text: str) -> str:
    """Text psycopg will send: a NUL or a lone surrogate (which it refuses) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _shown(value: object) -> str:
    return str(value) if isinstance(value, timedelta) else repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_timing(lease: object, heartbeat_every: object, poll_interval: object,
                  batch: object) -> None:
    if not isinstance(lease, timedelta) or not timedelta(0) < lease <= MAX_LEASE:
        raise ValueError(f"lease must be a positive timedelta of at most {MAX_LEASE.days} days,"
                         f" got {_shown(lease)}")
    if not isinstance(heartbeat_every, timedelta) or not timedelta(0) < heartbeat_every < lease:
        raise ValueError(f"heartbeat_every must be more than 0 and less than the lease ({lease}),"
                         f" got {_shown(heartbeat_every)}")
    if not _is_number(poll_interval) or not 0 < poll_interval < float("inf"):
        raise ValueError(f"poll_interval must be more than 0 seconds, got {poll_interval!r}")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an integer of 1 or more, got {batch!r}")


def _check_name(name: object) -> None:
    """A name awa.claim takes; None or '' stands for a generated one."""
    if name is None or name == "":
        return
    if not isinstance(name, str):
        raise ValueError(f"name must be a str (or None: generated), got {name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, which psycopg cannot send
        size = None
    if size is None or "\x00" in name:
        raise ValueError("name must be text PostgreSQL can store (no NUL, no lone surrogate),"
                         f" got {name!r}")
    if size > MAX_NAME_BYTES:
        raise ValueError(f"name must be at most {MAX_NAME_BYTES} bytes in UTF-8, got {size}"
                         f" bytes: {name[:64]!r}{'...' if len(name) > 64 else ''}")


def _check_shutdown_timeout(seconds: object) -> None:
    if seconds is not None and (not _is_number(seconds) or not 0 <= seconds < float("inf")):
        raise ValueError("shutdown_timeout must be 0 or more seconds (or None: wait for every"
                         f" handler), got {_shown(seconds)}")


def _check_maintain(maintain: object) -> None:
    """Cadences awa maintain would take; unknown tasks are left to Maintainer."""
    if maintain is None or isinstance(maintain, bool):
        return
    if not isinstance(maintain, Mapping):
        raise TypeError("maintain takes True, False or {task: seconds or None},"
                        f" got {maintain!r}")
    for task, seconds in maintain.items():
        if task not in TASK_NAMES or seconds is None:
            continue
        if not _is_number(seconds) or not EVERY_MIN <= seconds <= EVERY_MAX:
            raise ValueError(
                f"maintain: the cadence of {task} must be between {EVERY_MIN:g} and"
                f" {EVERY_MAX:g} seconds, or None (off), got {seconds!r}")


def _check_configs(configs: list[dict]) -> None:
    takes = ", ".join(QUEUE_KEYS[:-1]) + " and " + QUEUE_KEYS[-1]
    for n, config in enumerate(configs, 1):
        name = config.get("queue")
        if not isinstance(name, str) or not name:
            raise ValueError(f"queue config {n} (1-based) has no queue name: {config!r}")
        for key, value in config.items():
            if key in UNSUPPORTED_QUEUE_KEYS:
                if value is not None:
                    raise ValueError(
                        f"queue {name}: {key} {value!r} is not supported: the Worker runs"
                        f" max_workers slots per queue and takes {takes}")
            elif key not in QUEUE_KEYS:
                raise ValueError(f"queue {name}: unknown key {key!r} (value {value!r});"
                                 f" the Worker takes {takes}")
        slots = config.get("max_workers")
        if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool)
                                  or slots < 1):
            raise ValueError(f"queue {name}: max_workers must be an integer of 1 or more"
                             f" (or None: 1), got {slots!r}")
        family = config.get("family", True)
        if not isinstance(family, bool):
            raise ValueError(f"queue {name}: family must be True (claim its partitions and"
                             f" stripes too) or False (the queue and its own stripes only),"
                             f" got {family!r}")


def _log_gone(job: Job, outcome: str, handed_back: bool = False,
              in_doubt: str | None = None) -> None:
    """awa.complete or awa.fail found the run gone: its lease is no longer current.
    ``in_doubt``: the outcome was sent before, on a connection lost before
    its answer came, so that call may have recorded it (a crash after its
    commit, a synchronous standby that never answered it), and
    awa.run_outcome could not tell (the error it raised)."""
    if in_doubt is not None:
        log.warning("job %s (%s): its %s was sent as the connection was lost and may have been"
                    " recorded then (awa.run_outcome could not tell: %s): the run has ended"
                    " since (or was cancelled or rescued meanwhile); not counted", job.job_id,
                    job.kind, outcome, in_doubt)
        return
    if handed_back:
        log.warning("job %s (%s): handed back at shutdown while its handler ran; its %s was not"
                    " recorded and is not counted", job.job_id, job.kind, outcome)
        return
    log.warning("job %s (%s): no longer running under this lease (cancelled, rescued or"
                " finished elsewhere); its %s was not recorded and is not counted",
                job.job_id, job.kind, outcome)


def _log_settled(job: Job, outcome: str, held: str) -> None:
    """An in-doubt outcome (Worker._settle) that awa.run_outcome settled:
    ``held`` is what the database holds for the run."""
    if outcome == "completion" and held == "completed":
        log.info("job %s (%s): its completion was sent as the connection was lost and was"
                 " recorded then (awa.run_outcome: completed); counted", job.job_id, job.kind)
    elif outcome == "failure" and held == "failed":
        log.info("job %s (%s): its failure was sent as the connection was lost; attempt %s is"
                 " recorded as failed (awa.run_outcome: failed; by that send, or by the rescue"
                 " if the lease had run out meanwhile); counted", job.job_id, job.kind,
                 job.attempt)
    else:
        log.warning("job %s (%s): its %s was sent as the connection was lost and was not"
                    " recorded (awa.run_outcome: %s): the run was cancelled or rescued"
                    " meanwhile; not counted", job.job_id, job.kind, outcome, held)


class _Link:
    """One thread's connection, opened at its first statement. When the
    connection turns out lost, the statement is sent once more on a new one.
    That is safe for every statement the worker sends: a complete, fail or
    heartbeat under a stale lease changes nothing, and the jobs of a claim
    whose answer was lost come back when their lease expires (the attempt
    counted, as at any lease's end). A server that refuses a statement
    because it takes no writes is out of reach like a lost one: the
    connection is closed, and the next statement connects again."""

    def __init__(self, open_connection: Callable[[], psycopg.Connection]) -> None:
        self._open = open_connection
        self._conn: psycopg.Connection | None = None
        # Set when a statement went out on a connection that was then lost
        # without an answer: the server may have run it. The caller clears it.
        self.lost_after_send = False
        # Why the server refused the last statement for taking no writes
        # (read_only_reason's words); None when it did not.
        self.read_only: str | None = None

    def execute(self, statement: str, params: list) -> psycopg.Cursor:
        self.read_only = None
        if self._conn is None or self._conn.closed:
            self._conn = self._open()
        try:
            return self._send(statement, params)
        except psycopg.Error as err:
            # A server that takes no writes refuses in more than one way: 25006
            # (a standby, a read-only login), 0A000 (awa.lane_hints is
            # unlogged), 25000 (no transaction id in recovery). Its connection
            # is closed: the next statement may reach the primary (a failover,
            # target_session_attrs), where a connection kept would stay on the
            # old server for good.
            if not isinstance(err, psycopg.OperationalError) and not self._conn.closed:
                self.read_only = self._read_only_reason()
            raise

    def _send(self, statement: str, params: list) -> psycopg.Cursor:
        try:
            return self._conn.execute(statement, params)
        except psycopg.OperationalError as err:
            if not self._conn.closed:
                raise
            self.lost_after_send = True
            log.warning("connection lost: %s; connecting again", one_line(err))
        self._conn = self._open()
        return self._conn.execute(statement, params)

    def lost(self) -> bool:
        """Whether no connection is open: after an error, the server is out of
        reach (or takes no writes). Otherwise the error was the statement's
        own (a statement timeout or a cancel, a lock timeout, a deadlock:
        psycopg's OperationalError too), and the next statement may well
        succeed."""
        return self._conn is None or self._conn.closed

    def _read_only_reason(self) -> str | None:
        try:
            reason = read_only_reason(self._conn)
        except psycopg.Error:
            return None
        if reason is not None:
            self._conn.close()
        return reason

    def __enter__(self) -> _Link:
        return self

    def __exit__(self, *_: object) -> None:
        if self._conn is not None:
            self._conn.close()


class Worker:
    def __init__(
        self,
        dsn: str | None = None,
        *,
        queues: Iterable | Any,
        handlers: Mapping[str, Callable[[Job], Any]],
        lease: timedelta = timedelta(minutes=5),
        heartbeat_every: timedelta | None = None,
        poll_interval: float = 0.2,
        batch: int = 10,
        name: str | None = None,
        snapshot_every: float | None = 10.0,
        prepared_statements: str | bool | None = None,
        maintain: bool | Mapping[str, float | None] = False,
        shutdown_timeout: float | None = SHUTDOWN_TIMEOUT,
    ) -> None:
        self.dsn = resolve_dsn(dsn)
        parse_dsn(self.dsn)  # a malformed DSN fails here, not at every claim's back-off
        # Every call runs in autocommit (one transaction per statement), so a
        # transaction pooler may serve each from another server connection.
        self.prepared_statements = prepared_mode(prepared_statements)
        self.configs = iter_configs(queues)
        if not self.configs:
            raise ValueError("a worker needs at least one queue")
        _check_configs(self.configs)
        self.handlers = dict(handlers)
        if heartbeat_every is None and isinstance(lease, timedelta):
            heartbeat_every = lease / 3
        _check_timing(lease, heartbeat_every, poll_interval, batch)
        _check_maintain(maintain)
        _check_shutdown_timeout(shutdown_timeout)
        _check_name(name)
        self.shutdown_timeout = shutdown_timeout
        self.lease = lease
        self.heartbeat_every = heartbeat_every
        self.poll_interval = poll_interval
        self.batch = batch
        self.claims = 0  # awa.claim calls, empty ones included
        # New at every start: a restarted container often has the same hostname
        # and pid, and awa.release_worker ends the leases of every job claimed
        # under the name it is given.
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._stop = threading.Event()  # the claimers stop
        self._stopped_at: float | None = None  # the first stop, on the monotonic clock
        self._hand_back = threading.Event()  # hand the held jobs back now
        self._hand_back_at = ""  # what asked for it, for the log
        self._wake = threading.Event()  # the heartbeat thread looks again (_heartbeat)
        self._signals = self._signals_seen = 0  # _on_signal
        self._in_signal = False
        # Under _lock: the slots still running; once closing, the jobs held
        # were handed back, and so are those claimed after.
        self._slots_left = 0
        self._closing = False
        self._handed_back: set[tuple[int, int]] = set()
        # (job_id, run_lease) -> lease and deadline. Not job_id alone: a plain
        # handler past its deadline runs on while its job, rescued, may be
        # claimed again by another slot of this worker.
        self._running: dict[tuple[int, int], _Held] = {}
        self._lock = threading.Lock()
        self.completed = 0
        self.failed = 0
        # A snapshot for the admin page every snapshot_every seconds (None: off).
        self.runtime = None if snapshot_every is None else RuntimePublisher(
            self.dsn, "worker", every=snapshot_every, in_flight=lambda: len(self._running))
        # The maintenance loop in-process (its login needs awa_maintenance too):
        # True for the default cadences, or {task: seconds or None} for others.
        self.maintainer = None if maintain is None or maintain is False else Maintainer(
            self.dsn, every=None if maintain is True else maintain)

    def stop(self, *, hand_back: bool = False) -> None:
        """Stops claiming at once. ``run()`` returns when every held job's
        handler has finished, or at ``shutdown_timeout`` after the first stop,
        handing back the jobs whose handlers still run; ``hand_back=True``
        hands them back now."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()
        if hand_back:
            self._request_hand_back("at stop(hand_back=True)")
        self._wake.set()

    def _request_hand_back(self, what: str) -> None:
        if not self._hand_back.is_set():
            self._hand_back_at = what
        self._hand_back.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        """SIGTERM or SIGINT: the first stops, one during the shutdown hands
        back at once. A signal that comes while this handler runs (Python may
        run it between two of its bytecodes) is only counted, for the outer
        call to act on: setting an Event whose lock the outer call holds would
        never return."""
        self._signals += 1
        if self._in_signal:
            return
        self._in_signal = True
        try:
            while self._signals_seen < self._signals:
                self._signals_seen += 1
                if self._stop.is_set():
                    self._request_hand_back(
                        f"at {signal.Signals(signum).name} during the shutdown")
                    self._wake.set()
                else:
                    self.stop()
        finally:
            self._in_signal = False

    def run(self) -> None:
        """Blocks until ``stop()``, SIGTERM or SIGINT (when on the main thread),
        then until every held job's handler has finished or was handed back
        (``shutdown_timeout``, a second signal)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # SIGINT too: its KeyboardInterrupt would leave run() while the
            # claimers and slots went on claiming.
            previous = {sig: signal.signal(sig, self._on_signal)
                        for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _run(self) -> None:
        # Daemon threads all: a handler still running when its job was handed
        # back must not keep the process from exiting.
        heartbeat = threading.Thread(target=self._heartbeat, name="awa-heartbeat", daemon=True)
        threads = []
        for config in self.configs:
            name, slots = config["queue"], config.get("max_workers") or 1
            family = config.get("family", True)
            free = threading.Semaphore(slots)
            jobs: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
            threads.append(threading.Thread(target=self._claimer,
                                             args=(name, family, slots, free, jobs),
                                             name=f"awa-{name}-claim", daemon=True))
            threads += [threading.Thread(target=self._slot, args=(free, jobs),
                                         name=f"awa-{name}-{slot}", daemon=True)
                        for slot in range(slots)]
        self._slots_left = len(threads) - len(self.configs)
        if self.runtime is not None:
            self.runtime.start()
        maintaining = None
        if self.maintainer is not None:
            # As `awa maintain` refuses to start: every pass would fail with
            # permission denied, logged pass after pass.
            if (missing := missing_grant(self.dsn)) is not None:
                log.warning("maintain: %s; this worker runs no maintenance", missing)
            else:
                maintaining = self.maintainer.start()
        heartbeat.start()
        for t in threads:
            t.start()
        heartbeat.join()  # every slot has finished, or the jobs held were handed back
        if not self._closing:
            for t in threads:
                t.join()
        if maintaining is not None:
            self.maintainer.stop()
            maintaining.join()
        if self.runtime is not None:
            self.runtime.stop()

    def _link(self, role: str,
              prepare: Callable[[psycopg.Connection], None] | None = None) -> _Link:
        """A connection named ``awa-sql worker <role>`` (application_name)."""
        def open_connection() -> psycopg.Connection:
            conn = connect(
                self.dsn, autocommit=True, prepared_statements=self.prepared_statements,
                application_name=f"awa-sql worker {role}", **network_defaults(self.dsn))
            if prepare is not None:
                prepare(conn)
            return conn
        return _Link(open_connection)

    def _claimer(self, queue: str, family: bool, slots: int, free: threading.Semaphore,
                 jobs: queue_mod.SimpleQueue) -> None:
        """Claims for free slots only, so no claimed job waits for a slot;
        ``family`` is awa.claim's (False: ``queue`` and its own stripes only)."""
        delay, backoff = MIN_POLL, Backoff(self._stop)
        read_only = False  # the last claim met a server that takes no writes
        lease_seconds = self.lease.total_seconds()
        try:
            with self._link("claimer", decode_apart) as conn:
                while not self._stop.is_set():
                    if not free.acquire(timeout=MIN_POLL * 10):
                        continue
                    want = 1
                    while want < min(slots, self.batch) and free.acquire(blocking=False):
                        want += 1
                    try:
                        rows = conn.execute(
                            CLAIM_SQL, [[queue], want, self.name, self.lease, family]).fetchall()
                    except psycopg.Error as err:
                        for _ in range(want):
                            free.release()
                        reason = conn.read_only
                        if reason is None:
                            log.warning("queue %s: claim failed: %s; trying again in %.1f s",
                                        queue, one_line(err), backoff.delay)
                        elif not read_only:  # said once, until a claim works again
                            log.warning("queue %s: %s; no claim runs until it takes writes:"
                                        " connecting again in %.1f s, then with back-off up"
                                        " to %g s", queue, read_only_error(reason, "a worker"),
                                        backoff.delay, BACKOFF_MAX)
                        read_only = reason is not None
                        backoff.wait()
                        continue
                    backoff.reset()
                    read_only = False
                    with self._lock:
                        self.claims += 1
                    if self.runtime is not None:  # polled, whatever the claim returned
                        self.runtime.note(queue, "poll")
                    for _ in range(want - len(rows)):
                        free.release()
                    claimed = [Job(*row) for row in rows]
                    if late := self._hold(claimed, lease_seconds):
                        for _ in claimed:
                            free.release()
                        self._give_back(conn, late, "claimed after the hand-back",
                                        running=False)
                    for job in () if late else claimed:
                        jobs.put(job)
                    if rows:
                        delay = MIN_POLL
                    else:
                        self._stop.wait(delay)
                        delay = min(delay * 2, self.poll_interval)
        finally:
            for _ in range(slots):
                jobs.put(None)

    def _hold(self, claimed: list[Job], lease_seconds: float) -> _HeldJobs:
        """Records the jobs of a claim as held, for the slots to run. Once the
        shutdown has handed back the held jobs, a claim that was in flight
        then is answered late: its jobs are returned, to be handed back too."""
        claimed_at = time.monotonic()
        held = {(job.job_id, job.run_lease): _Held(
            None if job.max_run_time is None else claimed_at + job.max_run_time.total_seconds(),
            claimed_at + lease_seconds, kind=job.kind,
            last_attempt=job.attempt >= job.max_attempts) for job in claimed}
        for job in claimed:
            if self.runtime is not None:
                self.runtime.note(job.queue, "claim")
            client_metrics.job_claimed(job)
        with self._lock:
            if self._closing:
                self._handed_back.update(held)
                return list(held.items())
            self._running.update(held)
        return []

    def _slot_ended(self) -> None:
        """The heartbeat thread looks whether every slot has ended."""
        with self._lock:
            self._slots_left -= 1
        self._wake.set()

    def _slot(self, free: threading.Semaphore, jobs: queue_mod.SimpleQueue) -> None:
        try:
            # The slot's event loop, made for its first async handler.
            with self._link("slot") as conn, asyncio.Runner() as loop:
                while (job := jobs.get()) is not None:
                    try:
                        if self._was_handed_back(job):
                            # Handed back while it waited for this slot: its
                            # next run is another's, its handler must not start.
                            continue
                        self._handle(conn, job, loop)
                    except Exception as err:  # the job is no longer heartbeated (_handle)
                        log.error("job %s (%s): its outcome could not be recorded: %s; once"
                                  " its lease expires, awa.rescue_expired will retry it",
                                  job.job_id, job.kind, one_line(err))
                    finally:
                        free.release()
        finally:
            self._slot_ended()

    def _call(self, job: Job, loop: asyncio.Runner) -> None:
        """Runs the job's handler; a coroutine it returns runs until the job's
        deadline, then is cancelled (DeadlineExceeded)."""
        if isinstance(job.args, Undecodable):
            raise _BadArgs(f"its args could not be decoded: {job.args.error}")
        handler = self.handlers.get(job.kind)
        if handler is None:
            raise LookupError(f"no handler for kind {job.kind!r}")
        result = handler(job)
        if inspect.isawaitable(result):
            loop.run(self._awaited(job, result))

    async def _awaited(self, job: Job, awaitable: Awaitable[Any]) -> Any:
        """The handler's coroutine, in its slot's event loop: cancelled at the
        job's deadline (_within) or when the job is handed back."""
        task, running = asyncio.current_task(), asyncio.get_running_loop()
        with self._lock:
            held = self._running.get((job.job_id, job.run_lease))
            if held is not None:
                held.is_async = True
                held.cancel = functools.partial(_cancel_in, running, task)
            elif (job.job_id, job.run_lease) in self._handed_back:
                task.cancel()  # raised at the await below
        left = None if held is None or held.deadline is None \
            else held.deadline - time.monotonic()
        return await _within(awaitable, left)

    def _record(self, conn: _Link, job: Job, outcome: str, statement: str,
                params: list) -> bool | None:
        """Sends awa.complete or awa.fail and returns its answer. When the
        server cannot be reached (a restart, a lost connection, connections
        refused) or takes no writes (a failover under way), it is sent again
        after a back-off for as long as the job's lease may be current: the
        job is still held, so the heartbeat goes on extending its lease. Once
        the lease has surely ended, the error is raised: the job is left to
        awa.rescue_expired. When an earlier send went out on a connection lost
        before its answer and a later one answers false, that one may have
        recorded the outcome: the answer is
        then _settle's, None for one it logged as not recorded."""
        backoff = BACKOFF_MIN
        conn.lost_after_send = False
        while True:
            try:
                answer = conn.execute(statement, params).fetchone()[0]
                if not answer and conn.lost_after_send:
                    return self._settle(conn, job, outcome)
                return answer
            except psycopg.Error as err:
                if not (isinstance(err, psycopg.OperationalError) or conn.read_only):
                    raise
                with self._lock:
                    held = self._running.get((job.job_id, job.run_lease))
                if held is None or time.monotonic() + backoff >= held.lease_until:
                    raise
                log.warning("job %s (%s): its %s could not be recorded: %s; trying again in"
                            " %.1f s while its lease lasts", job.job_id, job.kind, outcome,
                            one_line(err), backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, RECORD_BACKOFF_MAX)

    def _settle(self, conn: _Link, job: Job, outcome: str) -> bool | None:
        """Whether the first send of an outcome, lost with its connection,
        recorded it, as awa.run_outcome reads the run now: a completion if
        the job completed at this attempt, a failure if this attempt ended
        failed. True: recorded; None: not, or not known (the read failed
        too: the doubt stays). Either way logged here."""
        try:
            held = conn.execute("select awa.run_outcome(%s, %s, %s)",
                                [job.job_id, job.run_lease, job.attempt]).fetchone()[0]
        except psycopg.Error as err:
            _log_gone(job, outcome, in_doubt=one_line(err))
            return None
        _log_settled(job, outcome, held)
        return True if held == ("completed" if outcome == "completion" else "failed") else None

    def _fail(self, conn: _Link, job: Job, error: str, retry: Retry | None = None) -> None:
        error = _sendable(error)
        if retry is not None and retry.at is not None:
            statement, params = ("select awa.fail(%s, %s, %s, %s::timestamptz)",
                                 [job.job_id, job.run_lease, error, retry.at])
        elif retry is not None and retry.after is not None:
            # Seconds, not the interval psycopg sends ('1 day'), which now()
            # would add by the session's calendar: 23 or 25 hours across a
            # clock change.
            statement, params = ("select awa.fail(%s, %s, %s,"
                                 " now() + make_interval(secs => %s::float8))",
                                 [job.job_id, job.run_lease, error,
                                  retry.after.total_seconds()])
        else:
            statement, params = ("select awa.fail(%s, %s, %s)", [job.job_id, job.run_lease, error])
        try:
            done = self._record(conn, job, "failure", statement, params)
        except psycopg.DataError as err:
            if retry is None:
                raise
            # A time the server refuses (at or past 9999-12-31, or past what a
            # timestamp holds: 22023, 22008): the failure
            # is recorded all the same, retried after the queue's backoff,
            # not left held until its lease ends.
            log.warning("job %s (%s): its Retry time was refused: %s; it is retried after the"
                        " queue's backoff instead", job.job_id, job.kind, one_line(err))
            retry = None
            done = self._record(conn, job, "failure", "select awa.fail(%s, %s, %s)",
                                [job.job_id, job.run_lease, error])
        if not done:
            if done is not None:  # None: settled and logged (_settle)
                _log_gone(job, "failure", self._was_handed_back(job))
            return
        with self._lock:
            self.failed += 1
        client_metrics.job_failed(job)
        # awa.fail says only whether the lease was current; the attempt decides
        # the rest, as in awa._retry_or_fail.
        if retry is None:
            return
        if job.attempt >= job.max_attempts:
            log.warning("job %s (%s) asked for a retry, but attempt %s of %s was its last: it"
                        " failed for good: %s", job.job_id, job.kind, job.attempt,
                        job.max_attempts, retry)
        else:
            log.info("job %s (%s) asked for a retry%s: %s", job.job_id, job.kind,
                     f" at {retry.at}" if retry.at is not None
                     else f" after {retry.after}" if retry.after is not None else "", retry)

    def _handle(self, conn: _Link, job: Job, loop: asyncio.Runner) -> None:
        try:
            self._call(job, loop)
        except DeadlineExceeded:
            error = deadline_message(job.max_run_time or timedelta(0))
            log.warning("job %s (%s): %s; its handler was cancelled", job.job_id, job.kind,
                        error)
            self._fail(conn, job, error)
        except Retry as retry:
            self._fail(conn, job, str(retry), retry)
        except _BadArgs as err:
            log.warning("job %s (%s) failed: %s", job.job_id, job.kind, err)
            self._fail(conn, job, str(err))
        except BaseException as err:
            # SystemExit, KeyboardInterrupt or CancelledError too: raised in a
            # slot's thread, they would end the slot with its job unrecorded,
            # and a queue's last slot with its queue (its claimer claiming on).
            error = "".join(traceback.format_exception_only(err)).strip()
            log.warning("job %s (%s) failed: %s", job.job_id, job.kind, error)
            self._fail(conn, job, error)
        else:
            done = self._record(conn, job, "completion", "select awa.complete(%s, %s)",
                                [job.job_id, job.run_lease])
            if done:
                with self._lock:
                    self.completed += 1
                client_metrics.job_completed(job)
            elif done is not None:  # None: settled and logged (_settle)
                _log_gone(job, "completion", self._was_handed_back(job))
        finally:
            with self._lock:
                self._running.pop((job.job_id, job.run_lease), None)

    def _was_handed_back(self, job: Job) -> bool:
        with self._lock:
            return (job.job_id, job.run_lease) in self._handed_back

    def _heartbeat(self) -> None:
        """Extends the lease of every held job until its deadline, not after: the
        server would not extend it anyway (awa.heartbeat); a pass that could
        not reach the server is tried again after HEARTBEAT_RETRY_MIN, doubled
        at each failure up to heartbeat_every. After stop() it goes on until
        every slot has finished, or until the jobs still held are handed back
        (_hand_back_due); then run() returns."""
        every = self.heartbeat_every.total_seconds()
        beat_at = time.monotonic() + every
        retry = HEARTBEAT_RETRY_MIN
        told = False
        with self._link("heartbeat") as conn:
            while True:
                self._wake.clear()  # before looking: a wake from here on is seen
                if time.monotonic() >= beat_at:
                    try:
                        self._beat(conn, self.lease.total_seconds())
                    except psycopg.Error as err:
                        wait = min(retry, every)
                        log.warning("heartbeat failed: %s; trying again in %.1f s",
                                    one_line(err), wait)
                        beat_at, retry = time.monotonic() + wait, retry * 2
                    else:
                        beat_at, retry = time.monotonic() + every, HEARTBEAT_RETRY_MIN
                if self._stop.is_set():
                    with self._lock:
                        if self._slots_left == 0:
                            return
                    if not told:
                        self._log_stopping()
                        told = True
                    if (why := self._hand_back_due()) is not None:
                        self._hand_back_held(conn, why)
                        return
                self._wake.wait(self._next_look(beat_at))

    def _log_stopping(self) -> None:
        with self._lock:
            held = len(self._running)
        if self.shutdown_timeout is None:
            grace = "as long as they take (shutdown_timeout None)"
        else:
            grace = f"{self.shutdown_timeout:g} s (shutdown_timeout)"
        log.info("shutdown: stopping; claiming has stopped, and the %d job(s) held get %s to"
                 " finish before they are handed back; a second SIGTERM or SIGINT hands them"
                 " back at once", held, grace)

    def _hand_back_due(self) -> str | None:
        """Why the jobs still held are handed back now, or None: not yet."""
        since = time.monotonic() - (self._stopped_at or 0.0)
        if self._hand_back.is_set():
            return f"{self._hand_back_at} after {since:.1f} s"
        if self.shutdown_timeout is not None and since >= self.shutdown_timeout:
            return f"after {self.shutdown_timeout:g} s"
        return None

    def _next_look(self, beat_at: float) -> float:
        """Seconds to the next beat, or to the shutdown timeout when sooner."""
        now = time.monotonic()
        wait = beat_at - now
        if self._stopped_at is not None and self.shutdown_timeout is not None:
            wait = min(wait, self._stopped_at + self.shutdown_timeout - now)
        return max(wait, 0.0)

    def _hand_back_held(self, conn: _Link, why: str) -> None:
        """Hands back every job still held: from here on, none is heartbeated,
        and the jobs of a claim answered late are handed back by their claimer."""
        with self._lock:
            self._closing = True
            held = list(self._running.items())
            self._running.clear()
            self._handed_back.update(key for key, _ in held)
        self._give_back(conn, held, why)
        for _, h in held:
            if h.cancel is not None:
                h.cancel()

    def _give_back(self, conn: _Link, held: _HeldJobs, why: str, *,
                   running: bool = True) -> None:
        """awa.fail with a retry due now, for each job, and one log line of
        those handed back (``running``: their handlers were still running).
        The attempt counts, as at a lease's end; the job is ready again at the
        next promote pass."""
        error = f"{HAND_BACK_ERROR}\n{why}; worker {self.name}"
        back, done = [], []
        for n, ((job_id, run_lease), h) in enumerate(held):
            try:
                failed = conn.execute(HAND_BACK_SQL, [RUN_LOCK_TIMEOUT, job_id, run_lease, error]
                                      ).fetchone()[0]
            except psycopg.Error as err:
                if conn.lost():  # out of reach: so for the jobs after it
                    log.error("shutdown: could not hand back %s: %s; once their leases expire,"
                              " awa.rescue_expired will retry them",
                              ", ".join(f"{key[0]} ({x.kind})" for key, x in held[n:]),
                              one_line(err))
                    break
                cause = (f"it waited {RUN_LOCK_TIMEOUT} for its run, which another"
                         " transaction holds (a cancel not yet committed?)"
                         if isinstance(err, psycopg.errors.LockNotAvailable) else one_line(err))
                log.error("shutdown: could not hand back %s (%s): %s; once its lease expires,"
                          " awa.rescue_expired will retry it", job_id, h.kind, cause)
                continue
            if not failed:
                done.append(f"{job_id} ({h.kind})")
            else:
                back.append(f"{job_id} ({h.kind}; its last attempt: failed for good)"
                            if h.last_attempt else f"{job_id} ({h.kind})")
        if back:
            many = len(back) != 1
            if running:
                why = f"whose handler{'s were' if many else ' was'} still running {why}"
            log.warning("shutdown: handed back %d job%s %s: %s", len(back), "s" if many else "",
                        why, ", ".join(back))
        if done:
            log.info("shutdown: not handed back, finished meanwhile (or cancelled): %s",
                     ", ".join(done))

    def _beat(self, conn: _Link, lease_seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            held = list(self._running.items())
        for (job_id, run_lease), h in held:
            if h.deadline is not None and now >= h.deadline:
                if not h.passed and not h.is_async:
                    log.warning(
                        "job %s passed its deadline; its handler is a plain function,"
                        " which cannot be interrupted: its lease is no longer extended,"
                        " and awa.rescue_expired will retry the job", job_id)
                h.passed = True
                continue
            try:
                extended = conn.execute(
                    HEARTBEAT_SQL,
                    [RUN_LOCK_TIMEOUT, job_id, run_lease, self.lease]).fetchone()[0]
            except psycopg.Error as err:
                if conn.lost():
                    raise  # the server is out of reach: so for every other job
                # This job's error (a statement timeout, awa.heartbeat raising
                # for a gone run outside read committed): the jobs after it are
                # heartbeated all the same.
                if isinstance(err, psycopg.errors.LockNotAvailable):
                    log.warning("job %s: heartbeat waited %s for its run, which another"
                                " transaction holds (a cancel not yet committed?); tried again"
                                " at the next pass", job_id, RUN_LOCK_TIMEOUT)
                else:
                    log.warning("job %s: heartbeat failed: %s; tried again at the next pass",
                                job_id, one_line(err))
                continue
            if extended:
                h.lease_until = time.monotonic() + lease_seconds
