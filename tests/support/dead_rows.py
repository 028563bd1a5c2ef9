"""Dead rows in awa.ready that no claim reads, made as the superuser: rows of
a lane id no lane has, inserted and deleted while the caller holds a
snapshot open, so that vacuum cannot remove them. And in awa.scheduled,
rows that no promotion reads (junk_scheduled)."""

from __future__ import annotations

NO_LANE = 2_000_000_000
JUNK = ("insert into awa.ready (lane_id, lane_seq, job_id, queue_id, priority, kind, args,"
        " attempt, max_attempts, enqueued_at)"
        " select %s, g, -g, 0, 2, 'junk', '{}', 0, 1, now() from generate_series(1, %s) g")


def exact_counts(su, table: str) -> None:
    """Keeps `table`'s row counts in the cumulative statistics exact: no
    autovacuum, whose ANALYZE would replace them with an estimate from a
    sample (off by a few hundred rows at these sizes, and the tests set
    counts one row past a threshold). Each test has a database of its own."""
    su.execute(f"alter table {table} set (autovacuum_enabled = off)")


def junk(su, rows: int, dead: bool = True) -> None:
    """`rows` rows no claim reads; deleted (dead while a snapshot is held) or left."""
    exact_counts(su, "awa.ready")
    su.execute("select pg_stat_force_next_flush()")
    su.execute("delete from awa.ready where lane_id = %s", [NO_LANE])
    su.execute(JUNK, [NO_LANE, rows])
    if dead:
        su.execute("select pg_stat_force_next_flush()")
        su.execute("delete from awa.ready where lane_id = %s", [NO_LANE])
    su.execute("select pg_stat_force_next_flush()")
    su.execute("select 1")  # the counts above are flushed at the end of this statement



# The same in awa.scheduled: rows of the queue JUNK_QUEUE with negative job
# ids, due in a hundred years (no promotion reads them) unless said. The
# queue is made by a definer, owned by the schema's owner as any queue is.
JUNK_QUEUE = "junk"
MAKE_JUNK_QUEUE = ("select awa.set_enqueue_shards(%s, 1)"
                   " where not exists (select from awa.queue_meta where queue = %s)")
JUNK_SCHEDULED = (
    "insert into awa.scheduled (job_id, queue_id, priority, kind, args, attempt, max_attempts,"
    " enqueued_at, run_at)"
    " select -g, (select queue_id from awa.queue_meta where queue = %s), 2, 'junk', '{}', 0,"
    " 1, now(),"
    " now() + %s::interval from generate_series(%s::integer, %s::integer) g")
LATER = "100 years"
DELETE_JUNK_SCHEDULED = "delete from awa.scheduled where job_id < 0"


def junk_scheduled(su, rows: int, dead: bool = True, due_in: str = LATER) -> None:
    """`rows` rows of awa.scheduled, due in `due_in` (by default none a
    promotion reads; '-1 hour': as promoted jobs leave them, below every job
    due now in the run_at index); deleted (dead while a snapshot is held) or
    left."""
    su.execute(MAKE_JUNK_QUEUE, [JUNK_QUEUE, JUNK_QUEUE])
    exact_counts(su, "awa.scheduled")
    su.execute("select pg_stat_force_next_flush()")
    su.execute(DELETE_JUNK_SCHEDULED)
    su.execute(JUNK_SCHEDULED, [JUNK_QUEUE, due_in, 1, rows])
    if dead:
        su.execute("select pg_stat_force_next_flush()")
        su.execute(DELETE_JUNK_SCHEDULED)
    su.execute("select pg_stat_force_next_flush()")
    su.execute("select 1")  # the counts above are flushed at the end of this statement
