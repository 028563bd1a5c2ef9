"""awa.compact_ready (ADR 036), on real PostgreSQL 17 and 18: once
awa.ready holds many more dead rows than vacuum leaves (a held snapshot),
and a backlog of at most 100,000, it is rewritten with its live rows only,
by TRUNCATE, each row unchanged; the claims that follow take the same jobs
in the same order. A call skips while an enqueue in flight holds the
table, leaves a larger backlog alone (whatever statistics the caller's
transaction has kept), refuses a snapshot older than its
lock, is for maintenance only, and loses no job while producers and
workers run around it.

Dead rows are made as the superuser: rows of a lane id no lane has,
inserted and deleted while a snapshot is held, so that vacuum cannot
remove them and no claim reads them.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.support.dead_rows import NO_LANE, junk
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import behind, claim
from tests.support.reads import blocks_read

READY = "select * from awa.ready order by lane_id, lane_seq"


def filenode(su) -> int:
    return su.execute("select pg_relation_filenode('awa.ready')").fetchone()[0]


def compact(conn) -> int:
    return conn.execute("select awa.compact_ready()").fetchone()[0]


@pytest.fixture
def su(db, logins):
    """Two queues with a backlog, the first 100 of each claimed and completed,
    one job running, and one ready row that entered its lane late (a retry)."""
    with db.connect() as conn, db.connect(logins.producer) as p, \
            db.connect(logins.worker) as w:
        for queue in ("rq1", "rq2"):
            p.execute("select awa.enqueue_batch(array_fill(%s::text, array[300]),"
                      " array_fill('k'::text, array[300]))", [queue])
            w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                      " from awa.claim(array[%s], 100, 'w') c", [queue])
        (job_id, lease, *_), = claim(w, ["rq1"], 1)
        w.execute("select awa.fail(%s::bigint, %s::bigint, 'again', retry_at => now())",
                  [job_id, lease])
        conn.execute("select awa.promote_due()")
        assert conn.execute("select count(*) from awa.ready_late").fetchone()[0] == 1
        yield conn


@pytest.fixture
def horizon(db):
    with db.connect(autocommit=False) as conn:
        conn.execute("begin isolation level repeatable read")
        conn.execute("select 1")
        yield conn
        conn.rollback()


def test_a_few_dead_rows_are_left_to_vacuum(db, su, logins, horizon):
    junk(su, 5_000)
    before = filenode(su)
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 0
    assert filenode(su) == before


def test_dead_rows_go_while_a_snapshot_is_held_and_every_live_row_stays(db, su, logins,
                                                                         horizon):
    rows = su.execute(READY).fetchall()
    late = su.execute("select * from awa.ready_late").fetchall()
    junk(su, 210_000)
    su.execute("vacuum awa.ready")
    dead = su.execute("select pg_stat_get_dead_tuples('awa.ready'::regclass)").fetchone()[0]
    assert dead >= 210_000  # vacuum removed nothing: the horizon holds them
    with db.connect(logins.maintenance) as m, db.connect(logins.worker) as w:
        assert compact(m) == 1
        assert su.execute(READY).fetchall() == rows
        assert su.execute("select * from awa.ready_late").fetchall() == late
        assert su.execute("select pg_relation_size('awa.ready')").fetchone()[0] < 200_000
        assert su.execute("select count(*) from awa.ready_rewrite").fetchone()[0] == 0
        assert compact(m) == 0
        # The claims after it take each queue's next jobs, in order: the
        # retried job first in rq1's lane order, then the backlog.
        for queue in ("rq1", "rq2"):
            expected = [r[2] for r in rows if r[3] == su.execute(
                "select queue_id from awa.queue_meta where queue = %s", [queue]).fetchone()[0]]
            taken = [j[0] for j in claim(w, [queue], 500)]
            assert taken == expected and len(taken) >= 200


def test_a_backlog_above_100000_is_left_alone(db, su, logins, horizon):
    junk(su, 100_001, dead=False)
    su.execute("insert into awa.ready (lane_id, lane_seq, job_id, queue_id, priority, kind,"
               " args, attempt, max_attempts, enqueued_at)"
               " select %s, g, -g, 0, 2, 'junk', '{}', 0, 1, now()"
               " from generate_series(200001, 520000) g", [NO_LANE])
    su.execute("select pg_stat_force_next_flush()")
    su.execute("delete from awa.ready where lane_id = %s and lane_seq > 200000", [NO_LANE])
    su.execute("select 1")
    assert su.execute("select awa._ready_compaction_due()").fetchone()[0] is False
    before = filenode(su)
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 0
    assert filenode(su) == before


def test_a_backlog_whose_payload_passes_the_bound_is_left_alone(db, su, logins, horizon):
    """Enqueues and claims wait for the rewrite's copies: past awa._pass_bytes()
    of payload they would wait until the call's statement timeout, every call."""
    budget = su.execute("select awa._pass_bytes()").fetchone()[0]
    with db.connect(logins.producer) as p:
        for _ in range(2):  # random hex: stored as it is, uncompressed
            p.execute("select awa.enqueue('rq1', 'big', (select jsonb_build_object('blob',"
                      " string_agg(md5(random()::text), '')) from generate_series(1, %s)))",
                      [budget * 55 // 100 // 32])
    junk(su, 210_000)
    assert su.execute("select awa._ready_compaction_due()").fetchone()[0] is True
    before = filenode(su)
    heap = su.execute("select pg_relation_size('awa.ready') / 8192").fetchone()[0]
    with db.connect(logins.maintenance) as m:
        # It reads the backlog lane by lane from the claim hints, not the
        # dead rows it would rewrite away (a scan read every block, at every
        # call while the snapshot was held).
        read = blocks_read(m, ["awa.ready", "awa.ready_pkey"], "select awa.compact_ready()")
        assert read < 100 < heap
    assert filenode(su) == before
    su.execute("select awa.cancel_jobs('rq1', 'big', 10)")
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 1


def heap_bound(su, size: int) -> None:
    """awa._rewrite_heap_bytes() of this database set to ``size`` (calls made
    on connections opened after this plan it anew)."""
    su.execute(f"""
        create or replace function awa._rewrite_heap_bytes()
        returns bigint
        language sql
        immutable parallel safe
        as $$ select {size}::pg_catalog.int8 $$""")


def test_a_file_past_the_bound_is_left_to_vacuum_and_a_second_call_returns_0(
        db, su, logins, horizon):
    """The copy reads the dead rows too, under the lock: a file of millions
    of them held enqueues and claims for seconds, or past the statement
    timeout, rolled back to do it again. And a second call while a first
    rewrote failed 55P03 at its read of the backlog, waiting on the lock."""
    junk(su, 210_000)
    size = su.execute("select pg_relation_size('awa.ready')").fetchone()[0]
    heap_bound(su, size - 1)
    before = filenode(su)
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 0
    assert filenode(su) == before
    heap_bound(su, size)
    with db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        assert compact(first) == 1  # its lock held until it commits
        # Due by the statistics (the file's size waits for the lock).
        assert su.execute("select pg_stat_get_dead_tuples('awa.ready'::regclass) > 200000"
                          " + pg_stat_get_live_tuples('awa.ready'::regclass)").fetchone()[0]
        assert compact(second) == 0
        first.commit()
    assert filenode(su) != before


def test_a_callers_statistics_snapshot_does_not_make_a_large_backlog_look_small(
        db, su, logins, horizon):
    """A caller may keep a snapshot of the statistics for its transaction
    (stats_fetch_consistency = snapshot) taken while the table looked due;
    the call reads them afresh, sees the backlog now above 100,000 and
    leaves the table alone."""
    junk(su, 300_000)
    with db.connect(logins.maintenance, autocommit=False) as m:
        m.execute("set local stats_fetch_consistency = snapshot")
        live, dead = m.execute("select pg_stat_get_live_tuples('awa.ready'::regclass),"
                               " pg_stat_get_dead_tuples('awa.ready'::regclass)").fetchone()
        assert dead > 200_000 + live and live <= 100_000  # due, in its snapshot
        su.execute("insert into awa.ready (lane_id, lane_seq, job_id, queue_id, priority, kind,"
                   " args, attempt, max_attempts, enqueued_at)"
                   " select %s, g, -g, 0, 2, 'junk', '{}', 0, 1, now()"
                   " from generate_series(400001, 500001) g", [NO_LANE])
        su.execute("select pg_stat_force_next_flush()")
        su.execute("select 1")
        assert su.execute("select awa._ready_compaction_due()").fetchone()[0] is False
        before = filenode(su)
        assert compact(m) == 0
        m.rollback()
    assert filenode(su) == before


def test_a_table_held_by_an_enqueue_in_flight_is_skipped_then_rewritten(db, su, logins,
                                                                       horizon):
    junk(su, 210_000)
    with db.connect(logins.producer, autocommit=False) as held, \
            db.connect(logins.maintenance) as m:
        m.execute("set statement_timeout = '10s'")  # a wait past the lock's 100 ms fails
        (job_id,) = held.execute("select job_id from awa.enqueue('rq2', 'k')").fetchone()
        before = filenode(su)
        assert compact(m) == 0
        assert filenode(su) == before
        held.commit()
        assert compact(m) == 1
    assert su.execute("select count(*) from awa.ready where job_id = %s",
                      [job_id]).fetchone()[0] == 1


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_snapshot_older_than_the_lock_is_refused(db, su, logins, isolation):
    assert_refused_outside_read_committed(db, logins.maintenance, "awa.compact_ready()",
                                          isolation)


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_only_maintenance_may_compact(db, su, logins, role):
    with db.connect(getattr(logins, role)) as conn, pytest.raises(psycopg.Error) as err:
        compact(conn)
    assert err.value.sqlstate == "42501"


def test_the_rewrite_table_has_readys_columns_in_order(db):
    with db.connect() as conn:
        columns = {t: conn.execute(
            "select attname, format_type(atttypid, atttypmod), attnotnull from pg_attribute"
            " where attrelid = %s::regclass and attnum > 0 and not attisdropped"
            " order by attnum", [t]).fetchall() for t in ("awa.ready", "awa.ready_rewrite")}
    assert columns["awa.ready"] == columns["awa.ready_rewrite"]


def test_no_job_is_lost_or_taken_twice_while_ready_is_rewritten_under_load(db, su, logins,
                                                                          horizon):
    """2 producers enqueue one job at a time into a queue at S = 4, until
    the table has been rewritten 3 times (the superuser making its dead
    rows each time), while 3 workers claim and complete them. Every job
    enqueued ends in awa.finished once."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('spin', 4)")
    stop = threading.Event()
    produced = threading.Event()
    rewrites: list[int] = []

    def rewrite() -> None:
        with db.connect() as maker, db.connect(logins.maintenance) as m:
            # No more dead rows once the producers may stop: the workers'
            # drain would wait behind them.
            while not stop.is_set() and sum(rewrites) < 3:
                junk(maker, 210_000)
                rewrites.append(compact(m))

    def produce(n: int) -> int:
        i = 0
        with db.connect(logins.producer) as p:
            while sum(rewrites) < 3 or i < 500:
                p.execute("select awa.enqueue('spin', 'k', ordering_key => %s)",
                          [f"p{n}-{i % 8}".encode()])
                i += 1
        return i

    def work() -> list[tuple[int, int]]:
        seen = []
        with db.connect(logins.worker) as w:
            while True:
                # Read before the claim: an empty claim means done only if it
                # began after every producer had committed its last job.
                last = produced.is_set()
                rows = claim(w, ["spin"], 5)
                if not rows and last:
                    return seen
                for job_id, lease, *_ in rows:
                    assert w.execute("select awa.complete(%s, %s)",
                                     [job_id, lease]).fetchone()[0]
                    seen.append(job_id)

    with ThreadPoolExecutor(6) as pool:
        rewriter = pool.submit(rewrite)
        producers = [pool.submit(produce, n) for n in range(2)]
        workers = [pool.submit(work) for _ in range(3)]
        try:
            total = sum(f.result() for f in producers)
            produced.set()
            done = [j for f in workers for j in f.result()]
        finally:
            stop.set()
            produced.set()
        rewriter.result()
    assert sum(rewrites) == 3, rewrites
    assert len(done) == len(set(done)) == total
    assert su.execute("select count(*), count(distinct job_id) from awa.finished f"
                      " join awa.queue_meta m using (queue_id) where m.queue = 'spin'"
                      ).fetchone() == (total, total)


def test_exact_counts_read_behind_a_rewrite_count_the_rows_it_left(db, su, logins, horizon):
    """awa.queue_counts (exact, read on purpose: a drop's question) that
    waited for the rewrite's lock counts the ready rows the rewrite left. A
    stable function read with its statement's snapshot, taken before the
    wait: the truncated table empty, the rows copied back not yet committed
    for it, 0 ready."""
    ready = su.execute("select count(*) from awa.ready r join awa.queue_meta m"
                       " using (queue_id) where m.queue = 'rq1'").fetchone()[0]
    assert ready > 0
    junk(su, 210_000)
    with db.connect(logins.reader) as r, \
            db.connect(logins.maintenance, autocommit=False) as m:
        assert compact(m) == 1
        call = behind(db, m, r, lambda c: c.execute(
            "select ready from awa.queue_counts('rq1')").fetchone()[0])
    assert (call.error, call.result) == (None, ready)


def test_a_drop_that_waited_behind_a_rewrite_still_finds_the_jobs(db, su, logins, horizon):
    """awa.drop_queue reads what the queue holds; one that waited for the
    rewrite's lock read with a snapshot taken before it, saw awa.ready
    emptied by the TRUNCATE and dropped a queue with ready jobs (its kept
    terminal jobs discarded). It holds the tables a TRUNCATE empties before
    it reads: 55006, nothing dropped, nothing discarded."""
    junk(su, 210_000)
    with db.connect(logins.operator) as op, \
            db.connect(logins.maintenance, autocommit=False) as m:
        assert compact(m) == 1
        call = behind(db, m, op, lambda c: c.execute(
            "select awa.drop_queue('rq2', discard_finished => true)").fetchone()[0])
    assert call.error is not None and call.error.sqlstate == "55006", call.error
    assert "200 ready" in call.error.diag.message_primary
    assert su.execute("select count(*) from awa.queue_meta where queue = 'rq2'"
                      ).fetchone()[0] == 1
    assert su.execute("select count(*) from awa.finished f join awa.queue_meta m"
                      " using (queue_id) where m.queue = 'rq2'").fetchone()[0] == 100
