"""awa-sql: a PostgreSQL job-queue storage contract that lives in schema ``awa``.

The Python package installs and upgrades the SQL (``awa_sql.migrate``) and
carries the operator surfaces (the ``awa`` CLI).

The names below are imported on first use (PEP 562), so that the ``awa``
CLI, which needs few of them, starts without the client, worker and
metrics modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from awa_sql.version import __version__

# Each public name and the module that defines it.
_HOMES = {
    "Enqueued": "awa_sql.client",
    "Producer": "awa_sql.client",
    "enqueue": "awa_sql.client",
    "enqueue_async": "awa_sql.client",
    "enqueue_many": "awa_sql.client",
    "enqueue_many_async": "awa_sql.client",
    "enqueue_many_copy": "awa_sql.client",
    "PartitionedQueue": "awa_sql.partitions",
    "Decision": "awa_sql.shards",
    "LaneStatus": "awa_sql.shards",
    "QueueStatus": "awa_sql.shards",
    "ShardChange": "awa_sql.shards",
    "autoscale_tick": "awa_sql.shards",
    "set_enqueue_shards": "awa_sql.shards",
    "set_shard_mode": "awa_sql.shards",
    "show": "awa_sql.shards",
    "unique_key": "awa_sql.unique",
    "Retry": "awa_sql.worker",
}

# The submodules `import awa_sql` loaded when it imported every name at once,
# and so could be reached as attributes; any other is imported by name.
_SUBMODULES = frozenset({
    "client", "connect", "defaults", "hosts", "listen", "maintain", "metrics",
    "partitions", "routing", "runtimes", "shards", "unique", "worker",
})

if TYPE_CHECKING:
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
    from awa_sql.worker import Retry


def __getattr__(name: str) -> object:
    """A public name, or one of _SUBMODULES (``awa_sql.shards`` after
    ``import awa_sql``), loaded now. Anything else, ``__main__`` (the CLI)
    or an extra's module among them, is no attribute until imported."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"awa_sql.{name}")
    else:
        raise AttributeError(f"module 'awa_sql' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
