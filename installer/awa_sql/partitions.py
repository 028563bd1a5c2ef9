"""Partitioned queues on the client side: one logical queue carried by N
ordinary queues (ADR-031 of Awa; docs/concepts.md).

A partition is the ordering scope across partitions: jobs with one ordering
key go to one partition (``partition_hash64(key) mod N``) and, inside it, to
one enqueue shard (``hash64(key) mod S``). The two hashes are independent, so
keyed traffic inside each partition still reaches every shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from awa_sql import routing
from awa_sql.routing import MAX_PARTITIONS

# The most bytes (UTF-8) a queue name may have: awa._queue_name_ok's limit
# (sql/queues.sql), held to it by tests/test_partition_names.py.
MAX_QUEUE_NAME_BYTES = 200


@dataclass(frozen=True)
class PartitionedQueue:
    """``PartitionedQueue("orders", 4)`` is carried by ``orders``,
    ``orders__p1``, ``orders__p2`` and ``orders__p3``."""

    logical: str
    physical_queues: tuple[str, ...]

    def __init__(self, logical: str, partitions: int) -> None:
        _check_logical(logical)
        if not isinstance(partitions, int) or isinstance(partitions, bool):
            raise TypeError(f"partitions must be an int, got {partitions!r}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )
        names = routing.partition_queue_names(logical, partitions)
        _check_name_lengths(logical, names)
        object.__setattr__(self, "logical", logical)
        object.__setattr__(self, "physical_queues", tuple(names))

    @classmethod
    def from_physical_queues(cls, logical: str, names: Sequence[str]) -> PartitionedQueue:
        """A partitioned queue over explicitly named queues (e.g. ones that
        were created before a naming scheme existed). Order matters: key
        routing uses the index."""
        _check_logical(logical)
        names = list(names)
        if not names:
            raise ValueError("physical queue names must not be empty")
        if len(names) > MAX_PARTITIONS:
            raise ValueError(
                f"at most {MAX_PARTITIONS} physical queues, got {len(names)}"
            )
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise ValueError(f"physical queue name {i} is empty")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"physical queue names must be distinct, repeated: {duplicates}")
        self = object.__new__(cls)
        object.__setattr__(self, "logical", logical)
        object.__setattr__(self, "physical_queues", tuple(names))
        return self

    @property
    def partitions(self) -> int:
        return len(self.physical_queues)

    def index_for_key(self, ordering_key: routing.Key) -> int:
        return routing.partition_for_ordering_key(ordering_key, self.partitions)

    def queue_for_key(self, ordering_key: routing.Key) -> str:
        return self.physical_queues[self.index_for_key(ordering_key)]

    def queue_for_index(self, index: int) -> str:
        if not 0 <= index < self.partitions:
            raise IndexError(
                f"partition index must be between 0 and {self.partitions - 1}, got {index}"
            )
        return self.physical_queues[index]

    def route_by_key(self, ordering_key: routing.Key) -> dict:
        """Enqueue options that send a job to its key's partition and keep the
        key as its ordering key inside it."""
        key = routing.key_bytes(ordering_key, "ordering_key")
        return {"queue": self.queue_for_key(key), "ordering_key": key}

    def route_by_index(self, index: int) -> dict:
        """``{"queue": queue_for_index(index)}``: enqueue options naming that
        partition's queue. An unkeyed job enqueued to index 1 and up stays in
        that partition. Index 0's queue is the logical name itself: once the
        queue is registered (``awa.set_queue_partitions``), the database
        routes an unkeyed job enqueued by that name to the producer
        connection's sticky partition, which may be any of them, so these
        options do not pin a job to partition 0, and no enqueue option
        does. Only an unregistered name is an ordinary queue, which keeps
        the job."""
        return {"queue": self.queue_for_index(index)}

    def queue_configs(
        self,
        *,
        max_workers_per_partition: int | None = None,
        min_workers_per_partition: int | None = None,
        rate_limit_per_partition: float | None = None,
    ) -> list[dict]:
        """One worker configuration per partition, for ``Worker(queues=...)``.
        The Worker runs ``max_workers`` slots per queue (None: 1) and refuses a
        configuration with ``min_workers`` or ``rate_limit`` set: it does not
        implement them. Each is marked ``"family": False``: its claims take
        its own partition's jobs alone. Partition 0's queue is the logical
        name, and a claim by that name with family (``awa.claim``'s
        default) takes every partition's."""
        if (min_workers_per_partition is not None and max_workers_per_partition is not None
                and min_workers_per_partition > max_workers_per_partition):
            raise ValueError(
                "min_workers_per_partition must not exceed max_workers_per_partition, got "
                f"{min_workers_per_partition} > {max_workers_per_partition}"
            )
        for name, value in (("max_workers_per_partition", max_workers_per_partition),
                            ("min_workers_per_partition", min_workers_per_partition),
                            ("rate_limit_per_partition", rate_limit_per_partition)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value}")
        return [
            {
                "queue": q,
                "max_workers": max_workers_per_partition,
                "min_workers": min_workers_per_partition,
                "rate_limit": rate_limit_per_partition,
                "family": False,
            }
            for q in self.physical_queues
        ]


def _check_logical(logical: str) -> None:
    if not isinstance(logical, str) or not logical:
        raise ValueError("the logical queue name must not be empty")


def _check_name_lengths(logical: str, names: Sequence[str]) -> None:
    """Refuses names producers could not enqueue to: the logical name, or the
    last partition's (the longest), over MAX_QUEUE_NAME_BYTES; worded as
    ``awa.set_queue_partitions`` refuses them."""
    size = len(logical.encode("utf-8"))
    if size > MAX_QUEUE_NAME_BYTES:
        raise ValueError(f"queue name must be 1 to {MAX_QUEUE_NAME_BYTES} bytes, got {size}"
                         f" bytes: {logical!r}")
    size = len(names[-1].encode("utf-8"))
    if size > MAX_QUEUE_NAME_BYTES:
        raise ValueError(f"{len(names)} partitions of queue {logical!r} would name the last"
                         f" one {names[-1]!r}, {size} bytes: a queue name is at most"
                         f" {MAX_QUEUE_NAME_BYTES} bytes")


def iter_configs(queues: Iterable) -> list[dict]:
    """Normalise what ``Worker(queues=...)`` accepts: a name, a config dict, a
    PartitionedQueue, or a list of them (the dicts
    ``PartitionedQueue.queue_configs()`` returns among them). A name becomes
    ``{"queue": name}``, claimed with family (the default: a logical name's
    partitions and stripes too); a PartitionedQueue becomes its
    ``queue_configs()``, one partition each (``"family": False``). Anything
    else raises ValueError naming it."""
    # One name or one config, not its letters or keys: Worker(queues="emails")
    # once claimed from queues "e", "m", ..., and a lone dict from queues
    # "queue" and "max_workers".
    if isinstance(queues, str | Mapping | PartitionedQueue):
        queues = [queues]
    elif not isinstance(queues, Iterable) or isinstance(queues, bytes | bytearray):
        raise ValueError(f"queues must be a queue name, a config dict, a PartitionedQueue"
                         f" or a list of them, got {queues!r}")
    out = []
    for n, q in enumerate(queues, 1):
        if isinstance(q, str):
            out.append({"queue": q})
        elif isinstance(q, Mapping):
            out.append(dict(q))
        elif isinstance(q, PartitionedQueue):
            out.extend(q.queue_configs())
        else:
            raise ValueError(f"queues item {n} (1-based) must be a queue name, a config dict"
                             f" or a PartitionedQueue, got {q!r}")
    return out
