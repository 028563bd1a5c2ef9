"""A small worker loop for the awa SQL contract.

Per queue, one claimer thread and ``max_workers`` slot threads, each with its
own connection. The claimer claims as many jobs as there are free slots (at
most ``batch``) in one ``awa.claim`` call and hands them to the slots, which
run the handlers and complete or fail the jobs. On an empty claim the claimer
backs off, from 10 ms doubling up to ``poll_interval``, and is back at 10 ms
as soon as a claim returns a job: one poller per queue, no busy loop, and a
job that arrives in an idle queue waits at most ``poll_interval``. It polls
rather than LISTENs because workers run behind transaction-pooling PgBouncer
(docs/python.md). A single heartbeat thread extends the leases of running
jobs. ``stop()`` (or SIGTERM when ``run()`` is on the main thread) stops the
claimers, lets every slot finish the job it holds, then returns. With
``maintain=True`` a thread runs the loop of ``awa maintain``
(awa_sql.maintain.Maintainer) beside them.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import signal
import socket
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from awa_sql.connect import connect, prepared_mode, resolve_dsn
from awa_sql.maintain import Maintainer
from awa_sql.metrics import client_metrics
from awa_sql.partitions import iter_configs
from awa_sql.runtimes import RuntimePublisher

log = logging.getLogger("awa_sql.worker")

CLAIM_SQL = (
    "select job_id, run_lease, queue, priority, enqueue_shard, lane_seq, kind, args, attempt,"
    " max_attempts, ordering_key from awa.claim(%s::text[], %s, %s::text, %s::interval)"
)
MIN_POLL = 0.01  # seconds; the first wait after an empty claim


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
    ) -> None:
        self.dsn = resolve_dsn(dsn)
        # Every call runs in autocommit (one transaction per statement), so a
        # transaction pooler may serve each from another server connection.
        self.prepared_statements = prepared_mode(prepared_statements)
        self.configs = iter_configs(queues)
        if not self.configs:
            raise ValueError("a worker needs at least one queue")
        self.handlers = dict(handlers)
        self.lease = lease
        self.heartbeat_every = heartbeat_every or lease / 3
        if poll_interval <= 0 or batch < 1:
            raise ValueError("poll_interval must be > 0 and batch >= 1")
        self.poll_interval = poll_interval
        self.batch = batch
        self.claims = 0  # awa.claim calls, empty ones included
        self.name = name or f"{socket.gethostname()}:{threading.get_native_id()}"
        self._stop = threading.Event()
        self._running: dict[int, int] = {}  # job_id -> run_lease
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

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Blocks until ``stop()``; every held job is finished first."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        threads = [threading.Thread(target=self._heartbeat, name="awa-heartbeat", daemon=True)]
        for config in self.configs:
            name, slots = config["queue"], max(1, config.get("max_workers") or 1)
            free = threading.Semaphore(slots)
            jobs: queue_mod.SimpleQueue[Job | None] = queue_mod.SimpleQueue()
            threads.append(threading.Thread(target=self._claimer, args=(name, slots, free, jobs),
                                             name=f"awa-{name}-claim"))
            threads += [threading.Thread(target=self._slot, args=(free, jobs),
                                         name=f"awa-{name}-{slot}") for slot in range(slots)]
        if self.runtime is not None:
            self.runtime.start()
        maintaining = self.maintainer.start() if self.maintainer is not None else None
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join()
        self._stop.set()
        threads[0].join()
        if maintaining is not None:
            self.maintainer.stop()
            maintaining.join()
        if self.runtime is not None:
            self.runtime.stop()

    def _connect(self) -> psycopg.Connection:
        return connect(self.dsn, autocommit=True, prepared_statements=self.prepared_statements,
                       application_name="awa-sql worker")

    def _claimer(self, queue: str, slots: int, free: threading.Semaphore,
                 jobs: queue_mod.SimpleQueue) -> None:
        """Claims for free slots only, so no claimed job waits for a slot."""
        delay = MIN_POLL
        try:
            with self._connect() as conn:
                while not self._stop.is_set():
                    if not free.acquire(timeout=MIN_POLL * 10):
                        continue
                    want = 1
                    while want < min(slots, self.batch) and free.acquire(blocking=False):
                        want += 1
                    rows = conn.execute(CLAIM_SQL, [[queue], want, self.name, self.lease]
                                        ).fetchall()
                    with self._lock:
                        self.claims += 1
                    for _ in range(want - len(rows)):
                        free.release()
                    for row in rows:
                        job = Job(*row)
                        if self.runtime is not None:
                            self.runtime.note(job.queue, "claim")
                        client_metrics.job_claimed(job)
                        with self._lock:
                            self._running[job.job_id] = job.run_lease
                        jobs.put(job)
                    if rows:
                        delay = MIN_POLL
                    else:
                        self._stop.wait(delay)
                        delay = min(delay * 2, self.poll_interval)
        finally:
            for _ in range(slots):
                jobs.put(None)

    def _slot(self, free: threading.Semaphore, jobs: queue_mod.SimpleQueue) -> None:
        with self._connect() as conn:
            while (job := jobs.get()) is not None:
                try:
                    self._handle(conn, job)
                finally:
                    free.release()

    def _handle(self, conn: psycopg.Connection, job: Job) -> None:
        try:
            handler = self.handlers.get(job.kind)
            if handler is None:
                raise LookupError(f"no handler for kind {job.kind!r}")
            handler(job)
        except Exception as err:
            error = "".join(traceback.format_exception_only(err)).strip()
            conn.execute("select awa.fail(%s, %s, %s)", [job.job_id, job.run_lease, error])
            with self._lock:
                self.failed += 1
            client_metrics.job_failed(job)
            log.warning("job %s (%s) failed: %s", job.job_id, job.kind, error)
        else:
            done = conn.execute("select awa.complete(%s, %s)",
                                [job.job_id, job.run_lease]).fetchone()[0]
            if done:
                with self._lock:
                    self.completed += 1
                client_metrics.job_completed(job)
            else:
                log.warning("job %s: lease expired before completion; not counted",
                            job.job_id)
        finally:
            with self._lock:
                self._running.pop(job.job_id, None)

    def _heartbeat(self) -> None:
        with self._connect() as conn:
            while not self._stop.wait(self.heartbeat_every.total_seconds()):
                with self._lock:
                    held = list(self._running.items())
                for job_id, run_lease in held:
                    conn.execute("select awa.heartbeat(%s, %s, %s)",
                                 [job_id, run_lease, self.lease])
