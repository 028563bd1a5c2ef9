"""awa-sql: a PostgreSQL job-queue storage contract that lives in schema ``awa``.

The Python package installs and upgrades the SQL (``awa_sql.migrate``) and
carries the operator surfaces (the ``awa`` CLI).
"""

from awa_sql.client import (
    Enqueued,
    Producer,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    enqueue_many_copy,
)
from awa_sql.partitions import PartitionedQueue
from awa_sql.shards import (
    Decision,
    LaneStatus,
    QueueStatus,
    ShardChange,
    autoscale_tick,
    set_enqueue_shards,
    set_shard_mode,
    show,
)
from awa_sql.unique import unique_key
from awa_sql.version import __version__
from awa_sql.worker import Retry

__all__ = [
    "Decision",
    "Enqueued",
    "LaneStatus",
    "PartitionedQueue",
    "Producer",
    "QueueStatus",
    "Retry",
    "ShardChange",
    "__version__",
    "autoscale_tick",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "enqueue_many_copy",
    "set_enqueue_shards",
    "set_shard_mode",
    "show",
    "unique_key",
]
