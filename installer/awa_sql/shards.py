"""The shard operations: an operator's calls on enqueue shards (S), the shard
mode and the auto-scaler (``awa storage ...`` on the command line).

Each function takes an open psycopg connection (sync) and uses only the
public SQL API, so the calling role needs awa_operator (changes) or
awa_reader (reads), nothing more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

import psycopg

from awa_sql.queues import covered_by

ORDERING_NOTE = (
    "S > 1 makes {queue} partitioned FIFO: order holds per lane and per ordering key; "
    "keys remap now, so per-key order resumes once the old lanes drain."
)
STRICT_NOTE = (
    "S = 1 makes {queue} strict FIFO per priority again once the lanes above shard 0 drain; "
    "until then claims also take from the draining lanes."
)


def ordering_consequence(queue: str, old: int, new: int) -> str:
    if new == old:
        return f"S stays {new}: nothing changes."
    return (STRICT_NOTE if new == 1 else ORDERING_NOTE).format(queue=queue)


@dataclass(frozen=True)
class ShardChange:
    physical_queue: str
    old_shards: int
    new_shards: int
    lanes_created: int


@dataclass(frozen=True)
class LaneStatus:
    priority: int
    shard: int
    lane_id: int
    ready: int
    lag_seconds: float | None
    next_seq: int
    claim_position: int | None
    draining: bool
    walked: bool  # claims still visit it (false once awa.retire_lanes took it out)


@dataclass
class QueueStatus:
    queue: str
    logical_queue: str
    enqueue_shards: int
    shard_mode: str
    max_shards: int | None
    paused: bool
    stripes: int
    ready: int
    running: int
    scheduled: int
    failed: int
    completed: int
    oldest_ready_age_seconds: float | None
    lanes: list[LaneStatus] = field(default_factory=list)
    signal: dict | None = None
    last_decision: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    queue: str
    decided_at: datetime
    mode: str
    samples: int
    mean_waiters: float | None
    wait_share: float | None
    enqueue_rate: float | None
    busiest_held: int | None
    current_shards: int
    proposed_shards: int
    action: str
    reason: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["decided_at"] = self.decided_at.isoformat()
        return d

    def summary(self) -> str:
        return (f"{self.queue}: {self.action} S {self.current_shards} -> {self.proposed_shards}"
                f" ({self.mode}): {self.reason}")


# last_decided_at: a run of identical holds is one row of the log (its latest tick).
DECISION_COLUMNS = (
    "queue, last_decided_at, mode, samples, mean_waiters::float8, wait_share::float8,"
    " enqueue_rate::float8, busiest_held, current_shards, proposed_shards, action, reason"
)


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def set_enqueue_shards(conn: psycopg.Connection, queue: str, shards: int) -> list[ShardChange]:
    """Set S for ``queue`` and all its stripes, in the caller's transaction."""
    rows = conn.execute(
        "select physical_queue, old_shards, new_shards, lanes_created"
        " from awa.set_enqueue_shards(%s::text, %s::integer)", [queue, shards]
    ).fetchall()
    return [ShardChange(*r) for r in rows]


def _known_queue(conn: psycopg.Connection, queue: str) -> bool:
    """Whether ``queue`` names a queue. A name set_enqueue_shards refuses
    (null, too long, a stripe's ``#``) raises the database's error, as the
    change would; any awa role may ask."""
    try:
        with conn.transaction():  # a savepoint: an unknown name leaves the caller's going
            conn.execute("select awa.enqueue_shards(%s::text)", [queue])
    except psycopg.errors.UndefinedObject:
        return False
    return True


def plan_enqueue_shards(conn: psycopg.Connection, queue: str, shards: int) -> list[ShardChange]:
    """What ``set_enqueue_shards`` would do, changing nothing (for --dry-run
    and the admin API's plan): one row per physical queue it changes.

    The physical queues ``awa._physical_queues`` gives the change, each at
    its own S: those the name covers (``awa.covered_queues``: the queue
    itself, a logical queue's partitions, the stripes of either). ``lanes_created``
    counts the lanes the change would provision: those missing below the
    new S when it differs from the current one. Needs awa_reader or
    awa_operator.
    """
    if not _known_queue(conn, queue):
        # A queue seen for the first time is created with S = 1 and 4 lanes.
        return [ShardChange(queue, 1, shards, 4 * shards)]
    rows = conn.execute(
        f"""
        select o.queue, o.enqueue_shards,
               case when o.enqueue_shards = %(shards)s then 0
                    else (4 * %(shards)s
                          - (select count(*) from awa.lane_overview as l
                              where l.queue = o.queue and l.shard < %(shards)s))::integer
               end
          from awa.queue_overview as o
         where {covered_by("o.queue")}
         order by o.queue <> %(queue)s, o.queue
        """,
        {"queue": queue, "shards": shards},
    ).fetchall()
    return [ShardChange(q, old, shards, created) for q, old, created in rows]


def show(conn: psycopg.Connection, queue: str | None = None) -> list[QueueStatus]:
    """Every physical queue with its lanes, or those ``queue`` names: itself (a
    partition's or stripe's own name included) and, for a logical queue, its
    partitions and stripes."""
    where = (f"where {covered_by('o.queue')}"
             if queue is not None else "")
    queues = conn.execute(
        f"""
        select o.queue, o.logical_queue, o.enqueue_shards, o.shard_mode, o.max_shards,
               o.paused, o.stripes, o.ready, o.running, o.scheduled, o.failed, o.completed,
               o.oldest_ready_age
          from awa.queue_overview as o {where}
         order by o.logical_queue, o.queue
        """,
        {"queue": queue},
    ).fetchall()
    result = {
        q[0]: QueueStatus(*q[:12], oldest_ready_age_seconds=_seconds(q[12])) for q in queues
    }
    lane_where = (f"where {covered_by('l.queue')}"
                  if queue is not None else "")
    for row in conn.execute(
        f"""
        select l.queue, l.priority, l.shard, l.lane_id, l.ready, l.lag, l.next_seq,
               l.claim_position, l.draining, l.walked
          from awa.lane_overview as l {lane_where}
         order by l.queue, l.priority, l.shard
        """,
        {"queue": queue},
    ):
        if row[0] in result:
            result[row[0]].lanes.append(LaneStatus(
                priority=row[1], shard=row[2], lane_id=row[3], ready=row[4],
                lag_seconds=_seconds(row[5]), next_seq=row[6], claim_position=row[7],
                draining=row[8], walked=row[9],
            ))
    _attach_autoscale(conn, result)
    return list(result.values())


MODE_NOTES = {
    "manual": "manual: S changes only when an operator sets it.",
    "shadow": "shadow: the auto-scaler logs what it would do (up to S = {max}) and changes "
              "nothing.",
    "auto": "auto: the auto-scaler raises S under lane contention (doubled up to three "
            "times in one step, as the demand calls for, up to {max}) and lowers it (/2) when "
            "contention is gone; S > 1 makes {queue} partitioned FIFO (order per lane and per "
            "ordering key).",
}


def mode_consequence(queue: str, mode: str, max_shards: int | None) -> str:
    return MODE_NOTES[mode].format(queue=queue, max=max_shards)


def set_shard_modes(conn: psycopg.Connection, queue: str, mode: str,
                    max_shards: int | None = None) -> list[tuple[str, str, int | None]]:
    """Opt a queue into ``shadow`` or ``auto`` (or back to ``manual``), in the
    caller's transaction: (queue, mode, max_shards) for each queue it set,
    the logical queue first."""
    return conn.execute(
        "select logical_queue, shard_mode, max_enqueue_shards"
        " from awa.set_shard_mode(%s::text, %s::text, %s::integer)", [queue, mode, max_shards]
    ).fetchall()


def set_shard_mode(conn: psycopg.Connection, queue: str, mode: str,
                   max_shards: int | None = None) -> tuple[str, str, int | None]:
    """As set_shard_modes; returns the logical queue's (queue, mode, max_shards)."""
    return set_shard_modes(conn, queue, mode, max_shards)[0]


def autoscale_tick(conn: psycopg.Connection) -> list[Decision]:
    """One controller tick; empty when another process holds the leader lock."""
    rows = conn.execute(f"select {DECISION_COLUMNS} from awa.autoscale_tick()").fetchall()
    return [Decision(*r) for r in rows]


def _attach_autoscale(conn: psycopg.Connection, queues: dict[str, QueueStatus]) -> None:
    for row in conn.execute(
        """
        select c.queue, c.samples, c.mean_waiters_per_held_lane::float8,
               c.wait_share::float8, c.enqueue_rate::float8
          from awa.lane_contention as c
        """
    ):
        if row[0] in queues:
            queues[row[0]].signal = {
                "samples": row[1], "mean_waiters_per_held_lane": row[2],
                "wait_share": row[3], "enqueue_rate": row[4],
            }
    for row in conn.execute(
        # Each queue's latest decision from the top of its index: one probe
        # per queue, not a sort of every decision the log keeps.
        f"""
        select {DECISION_COLUMNS}
          from unnest(%s::text[]) as n (name)
         cross join lateral (
             select x.* from awa.autoscale_decisions as x
              where x.queue = n.name
              order by x.decided_at desc, x.decision_id desc limit 1
         ) as d
        """,
        [list(queues)],
    ):
        queues[row[0]].last_decision = Decision(*row).as_dict()
