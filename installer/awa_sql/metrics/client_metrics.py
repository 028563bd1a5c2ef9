"""Producer and worker metrics of the Python client, on a prometheus_client registry.

OpenTelemetry-style names, exposed the way OpenTelemetry's Prometheus
exporter spells them (dots to underscores, the unit as a suffix, ``_total``
on counters):

==========================  ==========================================  =================
name                        Prometheus series                           labels
==========================  ==========================================  =================
awa.enqueue.duration        awa_enqueue_duration_seconds (histogram)    queue, method
awa.enqueue.batch_size      awa_enqueue_batch_size (histogram)          queue, method
awa.enqueue.lane_lock_wait  awa_enqueue_lane_lock_wait_seconds (hist.)  queue, method
awa.job.claimed             awa_job_claimed_total                       queue, awa_enqueue_shard
awa.job.completed           awa_job_completed_total                     queue
awa.job.failed              awa_job_failed_total                        queue
==========================  ==========================================  =================

``method`` is ``enqueue``, ``batch`` or ``copy``. A batch or COPY whose jobs
go to more than one queue is labelled ``queue="(several)"``.

Everything records to prometheus_client's default registry unless
``use_registry(registry)`` picks another. Expose it with
``prometheus_client.start_http_server(port)`` or mount
``prometheus_client.make_wsgi_app()`` / ``make_asgi_app()`` in your own app.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

SEVERAL = "(several)"
M = TypeVar("M")

# Appended to the select list of every enqueue statement, so the lane wait is
# read in the same statement, after the function ran: this transaction's
# running total of lane lock wait in microseconds, and its id.
WAIT_COLUMNS = (
    "pg_catalog.current_setting('awa.lane_lock_wait_us', true),"
    " pg_catalog.pg_current_xact_id_if_assigned()::text"
)

DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


class ClientMetrics:
    """The client's metric objects on one registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY):
        self.registry = registry
        enqueue_labels = ["queue", "method"]
        self.enqueue_duration = Histogram(
            "awa_enqueue_duration_seconds",
            "awa.enqueue.duration: time one enqueue call took, round trip included.",
            enqueue_labels, buckets=DURATION_BUCKETS, registry=registry)
        self.enqueue_batch_size = Histogram(
            "awa_enqueue_batch_size",
            "awa.enqueue.batch_size: jobs per enqueue call (1 for a single enqueue).",
            enqueue_labels, buckets=BATCH_BUCKETS, registry=registry)
        self.enqueue_lane_lock_wait = Histogram(
            "awa_enqueue_lane_lock_wait_seconds",
            "awa.enqueue.lane_lock_wait: time one enqueue call waited for lane locks "
            "(0 when it took free lanes).",
            enqueue_labels, buckets=WAIT_BUCKETS, registry=registry)
        self.job_claimed = Counter(
            "awa_job_claimed",
            "awa.job.claimed: jobs claimed by this process's workers, by the enqueue shard "
            "(attribute awa.enqueue.shard) they came from.",
            ["queue", "awa_enqueue_shard"], registry=registry)
        self.job_completed = Counter(
            "awa_job_completed", "awa.job.completed: jobs completed by this process's workers.",
            ["queue"], registry=registry)
        self.job_failed = Counter(
            "awa_job_failed",
            "awa.job.failed: job attempts that failed in this process's workers "
            "(retried or not).",
            ["queue"], registry=registry)


_lock = threading.Lock()
# Per registry, each metrics class made once (a registry refuses a second
# metric of one name): ClientMetrics, awa_sql.maintain.MaintainMetrics.
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, dict[type, Any]] = (
    weakref.WeakKeyDictionary())
_current: ClientMetrics | None = None
# Per connection: (transaction id, running lane-wait total in µs) last seen.
_last_wait: weakref.WeakKeyDictionary[Any, tuple[str | None, int]] = weakref.WeakKeyDictionary()


def on_registry(kind: type[M], registry: CollectorRegistry | None = None) -> M:
    """``kind(registry)`` (default registry: prometheus_client's), made once per registry."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        made = _by_registry.setdefault(registry, {})
        if kind not in made:
            made[kind] = kind(registry)
        return made[kind]


def metrics(registry: CollectorRegistry | None = None) -> ClientMetrics:
    """The client metrics on ``registry`` (default: prometheus_client's), made once."""
    return on_registry(ClientMetrics, registry)


def use_registry(registry: CollectorRegistry | None) -> ClientMetrics:
    """Record the client's and workers' metrics on ``registry`` from now on
    (``None``: prometheus_client's default registry)."""
    global _current
    chosen = metrics(registry)
    _current = chosen
    return chosen


def current() -> ClientMetrics:
    return _current if _current is not None else use_registry(None)


def queue_label(queues: str | Iterable[str | None]) -> str:
    if isinstance(queues, str):
        return queues
    distinct = set(queues)
    if len(distinct) == 1:
        (only,) = distinct
        return only if only is not None else SEVERAL
    return SEVERAL


def lane_wait_seconds(conn: Any, wait: Sequence[Any]) -> float:
    """This call's lane lock wait from the transaction's running total.

    The total (``awa.lane_lock_wait_us``) counts from the start of the
    transaction, so a call made in the same transaction as an earlier one
    on this connection (same transaction id) subtracts what that one saw.
    """
    setting, xid = wait
    total = int(setting) if setting else 0
    with _lock:
        before = _last_wait.get(conn)
        _last_wait[conn] = (xid, total)
    if before is not None and xid is not None and before[0] == xid:
        total -= before[1]
    return max(total, 0) / 1_000_000


def enqueued(conn: Any, queues: str | Iterable[str | None], method: str, jobs: int,
             started: float, wait: Sequence[Any]) -> None:
    """Record one enqueue call: ``started`` is its ``time.perf_counter()`` at the
    start, ``wait`` the WAIT_COLUMNS values its statement returned."""
    elapsed = time.perf_counter() - started
    m = current()
    labels = (queue_label(queues), method)
    m.enqueue_duration.labels(*labels).observe(elapsed)
    m.enqueue_batch_size.labels(*labels).observe(jobs)
    m.enqueue_lane_lock_wait.labels(*labels).observe(lane_wait_seconds(conn, wait))


def job_claimed(job: Any) -> None:
    current().job_claimed.labels(job.queue, str(job.enqueue_shard)).inc()


def job_completed(job: Any) -> None:
    current().job_completed.labels(job.queue).inc()


def job_failed(job: Any) -> None:
    current().job_failed.labels(job.queue).inc()
