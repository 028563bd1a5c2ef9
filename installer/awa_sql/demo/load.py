"""The load ``awa demo`` runs: producers that contend for lanes, a worker,
and the auto-scaler ticking in shadow mode, all in background threads."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import psycopg

from awa_sql import client, shards
from awa_sql.worker import Worker

log = logging.getLogger(__name__)

KINDS = ("send_welcome", "send_receipt", "send_digest")
KEYS = [f"customer-{i}".encode() for i in range(8)]


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
        self.worker = Worker(dsn, queues=[{"queue": queue, "max_workers": 2}],
                             handlers={k: self._handle for k in KINDS}, poll_interval=0.1)
        self.errors: list[str] = []

    @staticmethod
    def _handle(_job) -> None:
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

    def _tick(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(self.tick_every):
                shards.autoscale_tick(conn)

    def start(self) -> None:
        targets = [lambda i=i: self._produce(i) for i in range(self.producers)]
        targets += [self.worker.run, self._tick]
        for i, target in enumerate(targets):
            t = threading.Thread(target=self._guard(target), name=f"awa-demo-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.worker.stop()
        for t in self._threads:
            t.join(timeout)
