"""awa.compact_lane_hints (ADR 035), on real PostgreSQL 17 and 18: once
awa.lane_hints' heap outgrows what its lanes need, the table is rewritten
as each lane's highest hint, with TRUNCATE, so dead hints go while a
snapshot is held; the claims that follow take the same jobs they would
have; a call skips while a claim in flight holds the table, refuses a
snapshot older than its lock, is for maintenance only, and loses no job
while workers claim around it.

The table is grown as the superuser: rows of hints below each lane's
highest, inserted and deleted (dead under a held snapshot) or left
(live). A claim reads only a lane's highest hint, so neither kind changes
what it takes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import claim

HINTS = "select lane_id, max(head_seq) from awa.lane_hints group by lane_id order by lane_id"


def size(su) -> int:
    return su.execute("select pg_relation_size('awa.lane_hints')").fetchone()[0]


def allowed(su) -> int:
    return su.execute("select awa._lane_hints_bytes_allowed()").fetchone()[0]


def grow(su, rows: int, dead: bool) -> None:
    """`rows` hints below each hinted lane's highest (at 0), dead or live."""
    su.execute("insert into awa.lane_hints (lane_id, head_seq)"
               " select h.lane_id, 0 from (select distinct lane_id from awa.lane_hints) h,"
               " generate_series(1, %s)", [rows])
    if dead:
        su.execute("delete from awa.lane_hints where head_seq = 0")


@pytest.fixture
def su(db, logins):
    """Two queues whose lanes have hints: 300 jobs each, 200 claimed and
    completed, so each lane's hint has moved up to its live rows."""
    with db.connect() as conn, db.connect(logins.producer) as p, \
            db.connect(logins.worker) as w:
        for queue in ("hq1", "hq2"):
            p.execute("select awa.enqueue_batch(array_fill(%s::text, array[300]),"
                      " array_fill('k'::text, array[300]))", [queue])
            for _ in range(2):
                w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                          " from awa.claim(array[%s], 100, 'w') c", [queue])
        assert len(conn.execute(HINTS).fetchall()) >= 2
        yield conn


def test_a_table_within_its_allowance_is_left_as_it_is(db, su, logins):
    before = su.execute(HINTS).fetchall()
    grow(su, 20, dead=False)
    assert size(su) <= allowed(su)
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 0
    assert su.execute("select count(*) from awa.lane_hints where head_seq = 0"
                      ).fetchone()[0] == 20 * len(before)


def test_dead_hints_go_while_a_snapshot_is_held_and_each_lanes_highest_stays(db, su, logins):
    before = su.execute(HINTS).fetchall()
    with db.connect(autocommit=False) as horizon, db.connect(logins.maintenance) as m, \
            db.connect(logins.worker) as w:
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")
        grow(su, 3000, dead=True)
        grow(su, 5, dead=False)
        su.execute("vacuum awa.lane_hints")
        assert size(su) > allowed(su)  # vacuum removed nothing: the horizon holds them
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 1
        assert size(su) <= 8192
        assert su.execute("select lane_id, head_seq from awa.lane_hints order by lane_id"
                          ).fetchall() == before
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 0
        # The claims after it take each queue's next jobs in order.
        for queue in ("hq1", "hq2"):
            jobs = claim(w, [queue], 100)
            ids = [j[0] for j in jobs]
            assert len(ids) == 100 and ids == sorted(ids)
            first = su.execute("select min(job_id) from awa.ready r join awa.queue_meta q"
                               " using (queue_id) where q.queue = %s", [queue]).fetchone()[0]
            assert first is None or first > ids[-1]
        horizon.rollback()


def test_a_table_held_by_a_claim_in_flight_is_skipped_then_compacted(db, su, logins):
    grow(su, 3000, dead=False)
    with db.connect(logins.worker, autocommit=False) as held, \
            db.connect(logins.maintenance) as m:
        m.execute("set statement_timeout = '10s'")  # a wait past the lock's 100 ms fails
        (job_id, lease, *_), = claim(held, ["hq1"], 1)  # its transaction stays open
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 0
        assert size(su) > allowed(su)
        assert held.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        held.commit()
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 1
    assert size(su) <= allowed(su)


def test_a_second_call_while_a_rewrite_holds_the_table_returns_0(db, su, logins):
    """Its first read of the table's size waits for the lock too: outside
    the handler, a rewrite in flight made the second call fail 55P03."""
    grow(su, 3000, dead=False)
    with db.connect(autocommit=False) as rewrite, db.connect(logins.maintenance) as m:
        rewrite.execute("lock table awa.lane_hints in access exclusive mode")
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 0
        rewrite.rollback()
        assert m.execute("select awa.compact_lane_hints()").fetchone()[0] == 1


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_snapshot_older_than_the_lock_is_refused(db, su, logins, isolation):
    grow(su, 3000, dead=False)
    assert_refused_outside_read_committed(db, logins.maintenance,
                                          "awa.compact_lane_hints()", isolation)
    assert size(su) > allowed(su)


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_only_maintenance_may_compact(db, su, logins, role):
    with db.connect(getattr(logins, role)) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute("select awa.compact_lane_hints()")
    assert err.value.sqlstate == "42501"


def test_no_job_is_lost_or_taken_twice_while_hints_are_compacted_under_workers(db, su, logins):
    """4 workers claim 5 jobs at a time from a queue at S = 4 and complete
    each; meanwhile the superuser grows awa.lane_hints past its allowance
    and a maintenance login compacts it, again and again. Every job ends
    in awa.finished once; nothing is left."""
    total = 3000
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('spin', 4)")
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('spin'::text, array[%s]),"
                  " array_fill('k'::text, array[%s]), ordering_keys =>"
                  " array(select ('k' || i %% 16)::bytea from generate_series(1, %s) i))",
                  [total, total, total])
    stop = threading.Event()
    compacted: list[int] = []

    def compact() -> None:
        with db.connect() as grower, db.connect(logins.maintenance) as m:
            while not stop.is_set():
                grow(grower, 3000 // max(1, len(grower.execute(HINTS).fetchall())), dead=True)
                compacted.append(m.execute("select awa.compact_lane_hints()").fetchone()[0])

    def work() -> int:
        done = 0
        with db.connect(logins.worker) as w:
            while rows := claim(w, ["spin"], 5):
                for job_id, lease, *_ in rows:
                    assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
                    done += 1
        return done

    with ThreadPoolExecutor(5) as pool:
        compactor = pool.submit(compact)
        workers = [pool.submit(work) for _ in range(4)]
        try:
            assert sum(f.result() for f in workers) == total
        finally:
            stop.set()
        compactor.result()
    assert sum(compacted) >= 3, compacted
    assert su.execute("select count(*), count(distinct job_id) from awa.finished f"
                      " join awa.queue_meta m using (queue_id) where m.queue = 'spin'"
                      ).fetchone() == (total, total)
    assert su.execute("select count(*) from awa.ready r join awa.queue_meta m"
                      " using (queue_id) where m.queue = 'spin'").fetchone()[0] == 0
