"""awa-sql: a PostgreSQL job-queue storage contract that lives in schema ``awa``.

The Python package installs and upgrades the SQL (``awa_sql.migrate``) and
carries the operator surfaces (the ``awa`` CLI).
"""

__version__ = "0.1.0"

from awa_sql.partitions import PartitionedQueue
from awa_sql.storage import (
    LaneStatus,
    QueueStatus,
    ShardChange,
    set_enqueue_shards,
    show,
)

__all__ = [
    "LaneStatus",
    "PartitionedQueue",
    "QueueStatus",
    "ShardChange",
    "__version__",
    "set_enqueue_shards",
    "show",
]
