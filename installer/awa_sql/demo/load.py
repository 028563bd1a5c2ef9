"""The load ``awa demo`` runs: producers that contend for lanes, now and then
a job for later and one that fails its first attempt, and a worker that runs
the ``awa maintain`` loop too (the auto-scaler ticking in shadow mode, due
jobs and retries promoted), all in background threads."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from awa_sql import client, shards
from awa_sql.worker import Worker

log = logging.getLogger(__name__)

KINDS = ("send_welcome", "send_receipt", "send_digest")
KEYS = [f"customer-{i}".encode() for i in range(8)]
LATER = timedelta(seconds=3)  # how far ahead a producer now and then schedules a job


def prepare_queue(dsn: str, queue: str, max_shards: int = 8) -> None:
    """The demo queue in shadow mode with a policy quick enough to show
    decisions within a minute."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        client.enqueue(conn, "send_welcome", {"user": 0}, queue=queue)
        shards.set_shard_mode(conn, queue, "shadow", max_shards)
        conn.execute(
            "select awa.set_autoscale_policy(%s, grow_window => '20 seconds',"
            " cooldown => '20 seconds', shrink_window => '2 minutes')", [queue])


class DemoLoad:
    def __init__(self, dsn: str, queue: str = "emails", producers: int = 6,
                 tick_every: float = 2.0) -> None:
        self.dsn, self.queue, self.producers, self.tick_every = dsn, queue, producers, tick_every
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Eight slots: enough to keep up at S = 4, the S the demo suggests trying.
        self.worker = Worker(dsn, queues=[{"queue": queue, "max_workers": 8}],
                             handlers={k: self._handle for k in KINDS}, poll_interval=0.1,
                             maintain={"autoscale": tick_every})
        self.errors: list[str] = []

    @staticmethod
    def _handle(job) -> None:
        if job.args.get("flaky") and job.attempt == 1:
            raise RuntimeError("demo: fails its first attempt, retried in 2 s")
        time.sleep(0.004)  # the work a job stands for

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as err:  # shown by the demo, never raised in a thread
                if not self._stop.is_set():
                    self.errors.append(f"{type(err).__name__}: {err}")
                    log.exception("demo load thread failed")
        return run

    def _produce(self, index: int) -> None:
        rng = random.Random(index)  # noqa: S311 - a demo's load, not a secret
        with psycopg.connect(self.dsn) as conn:
            while not self._stop.is_set():
                # Two jobs of one customer in one transaction, a short pause
                # between them: the lane stays held, and others queue behind it.
                with conn.transaction():
                    key = rng.choice(KEYS) if rng.random() < 0.7 else None
                    for _ in range(2):
                        client.enqueue(conn, rng.choice(KINDS), {"n": rng.randrange(10**6)},
                                       queue=self.queue, ordering_key=key)
                        time.sleep(0.01)
                if rng.random() < 0.1:
                    client.enqueue_many(conn, [{"kind": "send_digest", "args": {"i": i}}
                                               for i in range(20)], queue=self.queue)
                    conn.commit()
                self._stop.wait(0.02)

    def _later(self) -> None:
        """Every few seconds a job for later and one that fails its first
        attempt: the maintenance loop promotes both when they are due."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                client.enqueue(conn, "send_digest", {"later": True}, queue=self.queue,
                               run_at=datetime.now(UTC) + LATER)
                client.enqueue(conn, "send_receipt", {"flaky": True}, queue=self.queue)
                if self._stop.wait(LATER.total_seconds()):
                    return

    def start(self) -> None:
        targets = [lambda i=i: self._produce(i) for i in range(self.producers)]
        targets += [self.worker.run, self._later]
        for i, target in enumerate(targets):
            t = threading.Thread(target=self._guard(target), name=f"awa-demo-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.worker.stop()
        for t in self._threads:
            t.join(timeout)
