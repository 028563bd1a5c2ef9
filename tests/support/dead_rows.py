"""Dead rows in awa.ready that no claim reads, made as the superuser: rows of
a lane id no lane has, inserted and deleted while the caller holds a
snapshot open, so that vacuum cannot remove them."""

from __future__ import annotations

NO_LANE = 2_000_000_000
JUNK = ("insert into awa.ready (lane_id, lane_seq, job_id, queue_id, priority, kind, args,"
        " attempt, max_attempts, enqueued_at)"
        " select %s, g, -g, 0, 2, 'junk', '{}', 0, 1, now() from generate_series(1, %s) g")


def junk(su, rows: int, dead: bool = True) -> None:
    """`rows` rows no claim reads; deleted (dead while a snapshot is held) or left."""
    su.execute("select pg_stat_force_next_flush()")
    su.execute("delete from awa.ready where lane_id = %s", [NO_LANE])
    su.execute(JUNK, [NO_LANE, rows])
    if dead:
        su.execute("select pg_stat_force_next_flush()")
        su.execute("delete from awa.ready where lane_id = %s", [NO_LANE])
    su.execute("select pg_stat_force_next_flush()")
    su.execute("select 1")  # the counts above are flushed at the end of this statement
