"""awa.compact_scheduled (ADR 047), on real PostgreSQL 17 and 18: once
awa.scheduled holds many more dead rows than vacuum leaves (a held
snapshot), and at most 100,000 live ones, it is rewritten with its live
rows only, by TRUNCATE, each row unchanged; awa.promote_due then reads a
few blocks again, not every dead row. A call skips while an enqueue in
flight holds the table, leaves a larger backlog or payload alone, refuses a
snapshot older than its lock, is for maintenance only, and no job is lost
or promoted twice while producers, promotions and workers run around it.

Dead rows are made as the superuser: rows of a queue no one enqueues to,
due in a hundred years, inserted and deleted while a snapshot is held, so
that vacuum cannot remove them and no promotion reads them
(tests/support/dead_rows.py).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.support.dead_rows import JUNK_QUEUE, JUNK_SCHEDULED, LATER, junk_scheduled
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import behind, claim
from tests.support.reads import blocks_read

SCHEDULED = "select * from awa.scheduled where job_id > 0 order by job_id"
INDEXES = ["awa.scheduled", "awa.scheduled_pkey", "awa.scheduled_run_at_idx",
           "awa.scheduled_queue_idx"]


def filenode(su) -> int:
    return su.execute("select pg_relation_filenode('awa.scheduled')").fetchone()[0]


def compact(conn) -> int:
    return conn.execute("select awa.compact_scheduled()").fetchone()[0]


def due(su) -> bool:
    return su.execute("select awa._scheduled_compaction_due()").fetchone()[0]


@pytest.fixture
def su(db, logins):
    """Two queues with jobs for later (args, keys, deadlines, priorities), one
    retry waiting with its attempt and last error, and three jobs already
    due that no promotion has moved yet."""
    with db.connect() as conn, db.connect(logins.producer) as p, \
            db.connect(logins.worker) as w:
        for queue in ("sq1", "sq2"):
            p.execute(
                "select count(*) from awa.enqueue_batch(array_fill(%s::text, array[300]),"
                " array_fill('k'::text, array[300]),"
                " args => array(select jsonb_build_object('n', i, 's', repeat('x', i %% 50))"
                "               from generate_series(1, 300) i),"
                " priorities => array(select (1 + i %% 4)::smallint"
                "                     from generate_series(1, 300) i),"
                " ordering_keys => array(select case when i %% 3 = 0"
                "                        then convert_to('key' || i, 'UTF8') end"
                "                        from generate_series(1, 300) i),"
                " run_ats => array(select now() + interval '1 day' + i * interval '1 second'"
                "                  from generate_series(1, 300) i),"
                " max_run_times => array(select case when i %% 5 = 0 then interval '1 minute'"
                "                        end from generate_series(1, 300) i))", [queue])
        p.execute("select awa.enqueue('sq1', 'retried', max_attempts => 5)")
        ((job_id, lease, *_),) = claim(w, ["sq1"], 1)
        w.execute("select awa.fail(%s::bigint, %s::bigint, 'again',"
                  " retry_at => now() + interval '1 hour')", [job_id, lease])
        p.execute("select count(*) from awa.enqueue_batch(array_fill('sq2'::text, array[3]),"
                  " array_fill('due'::text, array[3]),"
                  " run_ats => array_fill(now() + interval '1 second', array[3]))")
        retried = conn.execute("select attempt, last_error from awa.scheduled where job_id = %s",
                               [job_id]).fetchone()
        assert retried == (1, "again")
        time.sleep(1.1)  # the three due jobs are due now
        yield conn


@pytest.fixture
def horizon(db):
    with db.connect(autocommit=False) as conn:
        conn.execute("begin isolation level repeatable read")
        conn.execute("select 1")
        yield conn
        conn.rollback()


def test_a_few_dead_rows_are_left_to_vacuum(db, su, logins, horizon):
    junk_scheduled(su, 5_000)
    assert due(su) is False
    before = filenode(su)
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 0
    assert filenode(su) == before


def test_dead_rows_go_while_a_snapshot_is_held_and_every_live_row_stays(db, su, logins,
                                                                         horizon):
    rows = su.execute(SCHEDULED).fetchall()
    assert len(rows) == 604
    # As promotions leave them: below the jobs due now in the run_at index.
    junk_scheduled(su, 210_000, due_in="-1 hour")
    su.execute("vacuum awa.scheduled")
    dead = su.execute("select pg_stat_get_dead_tuples('awa.scheduled'::regclass)").fetchone()[0]
    assert dead >= 210_000  # vacuum removed nothing: the horizon holds them
    with db.connect(logins.maintenance) as m:
        # The promotion of the oldest due job walks every dead entry below
        # it in the run_at index, and their heap blocks.
        assert blocks_read(m, INDEXES, "select awa.promote_due(1)") > 1_000
        (first,) = su.execute("select job_id from awa.ready").fetchone()
        rows = [r for r in rows if r[0] != first]
        assert compact(m) == 1
        assert su.execute(SCHEDULED).fetchall() == rows
        assert su.execute("select count(*) from awa.scheduled where job_id < 0"
                          ).fetchone()[0] == 0
        assert su.execute("select pg_relation_size('awa.scheduled')").fetchone()[0] < 1_000_000
        assert su.execute("select count(*) from awa.scheduled_rewrite").fetchone()[0] == 0
        assert compact(m) == 0
        # Then it reads a few blocks, and moves the due jobs, each once, as
        # they were enqueued.
        assert blocks_read(m, INDEXES, "select awa.promote_due(1)") < 50
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
    promoted = su.execute("select job_id, kind, args, attempt from awa.ready"
                          " where job_id <> %s order by job_id", [first]).fetchall()
    assert promoted == [(r[0], r[3], r[4], r[6]) for r in rows if r[3] == "due"]
    assert su.execute(SCHEDULED).fetchall() == [r for r in rows if r[3] != "due"]


def test_the_backlog_read_counts_live_rows_up_to_its_cap_and_their_payload(db, su, horizon):
    junk_scheduled(su, 50_000)
    live, payload = su.execute("select count(*), sum(awa._job_bytes(kind, args, last_error))"
                               " from awa.scheduled").fetchone()
    assert su.execute("select payload, backlog from awa._scheduled_backlog(100001)"
                      ).fetchone() == (payload, live)
    assert su.execute("select backlog from awa._scheduled_backlog(10)").fetchone()[0] == 10


def test_a_backlog_above_100000_is_left_alone(db, su, logins, horizon):
    junk_scheduled(su, 100_001, dead=False)
    su.execute(JUNK_SCHEDULED, [JUNK_QUEUE, LATER, 200_001, 520_000])
    su.execute("select pg_stat_force_next_flush()")
    su.execute("delete from awa.scheduled where job_id <= -200001")
    su.execute("select pg_stat_force_next_flush()")
    su.execute("select 1")
    assert su.execute("select pg_stat_get_dead_tuples('awa.scheduled'::regclass)"
                      ).fetchone()[0] >= 320_000
    assert due(su) is False
    before = filenode(su)
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 0
    assert filenode(su) == before


def test_a_backlog_whose_payload_passes_the_bound_is_left_alone(db, su, logins, horizon):
    """Enqueues for later, retries and promotions wait for the rewrite's
    copies: past awa._pass_bytes() of payload they would wait until the
    call's statement timeout, every call. The read that finds it out reads
    the heap once, and none of the indexes' entries of dead rows."""
    budget = su.execute("select awa._pass_bytes()").fetchone()[0]
    with db.connect(logins.producer) as p:
        for _ in range(2):  # random hex: stored as it is, uncompressed
            p.execute("select awa.enqueue('sq1', 'big', (select jsonb_build_object('blob',"
                      " string_agg(md5(random()::text), '')) from generate_series(1, %s)),"
                      " run_at => now() + interval '1 day')",
                      [budget * 55 // 100 // 32])
    junk_scheduled(su, 210_000)
    assert due(su) is True
    before = filenode(su)
    heap = su.execute("select pg_relation_size('awa.scheduled') / 8192").fetchone()[0]
    with db.connect(logins.maintenance) as m:
        read = blocks_read(m, INDEXES, "select awa.compact_scheduled()")
        assert heap <= read < heap + 50
    assert filenode(su) == before
    su.execute("select awa.cancel_jobs('sq1', 'big', 10)")
    with db.connect(logins.maintenance) as m:
        assert compact(m) == 1
    assert filenode(su) != before


def test_a_callers_statistics_snapshot_does_not_make_a_large_backlog_look_small(
        db, su, logins, horizon):
    """A caller may keep a snapshot of the statistics for its transaction
    (stats_fetch_consistency = snapshot) taken while the table looked due;
    the call reads them afresh, sees the backlog now above 100,000 and
    leaves the table alone, without reading it (the read of the backlog
    would have found out too, at the cost of the heap)."""
    junk_scheduled(su, 300_000)
    with db.connect(logins.maintenance, autocommit=False) as m:
        m.execute("set local stats_fetch_consistency = snapshot")
        live, dead = m.execute("select pg_stat_get_live_tuples('awa.scheduled'::regclass),"
                               " pg_stat_get_dead_tuples('awa.scheduled'::regclass)").fetchone()
        assert dead > 200_000 + live and live <= 100_000  # due, in its snapshot
        su.execute(JUNK_SCHEDULED, [JUNK_QUEUE, LATER, 400_001, 500_001])
        su.execute("select pg_stat_force_next_flush()")
        su.execute("select 1")
        assert due(su) is False
        before = filenode(su)
        assert blocks_read(m, INDEXES, "select awa.compact_scheduled()") < 50
        m.rollback()
    assert filenode(su) == before


def test_a_table_held_by_an_enqueue_in_flight_is_skipped_then_rewritten(db, su, logins,
                                                                       horizon):
    junk_scheduled(su, 210_000)
    with db.connect(logins.producer, autocommit=False) as held, \
            db.connect(logins.maintenance) as m:
        m.execute("set statement_timeout = '10s'")  # a wait past the lock's 100 ms fails
        (job_id,) = held.execute("select job_id from awa.enqueue('sq2', 'k',"
                                 " run_at => now() + interval '1 day')").fetchone()
        before = filenode(su)
        assert compact(m) == 0
        assert filenode(su) == before
        held.commit()
        assert compact(m) == 1
    assert su.execute("select count(*) from awa.scheduled where job_id = %s",
                      [job_id]).fetchone()[0] == 1


def test_a_job_cancelled_while_scheduled_is_rewritten_is_never_promoted(db, su, logins,
                                                                       horizon):
    """A cancel that waited for the rewrite's lock reads the table as the
    rewrite left it (the job tools take their snapshot once they hold their
    tables), finds the job and removes it; so do awa.job and the overview."""
    (job_id,) = su.execute("select job_id from awa.scheduled where kind = 'due' limit 1"
                           ).fetchone()
    junk_scheduled(su, 210_000)
    with db.connect(logins.maintenance, autocommit=False) as m:
        assert compact(m) == 1
        with db.connect(logins.operator) as op:
            call = behind(db, m, op, lambda c: c.execute("select awa.cancel_job(%s)",
                                                         [job_id]).fetchone()[0])
    assert (call.error, call.result) == (None, True)
    junk_scheduled(su, 210_000)
    with db.connect(logins.reader) as r, \
            db.connect(logins.maintenance, autocommit=False) as m:
        assert compact(m) == 1
        call = behind(db, m, r, lambda c: c.execute(
            "select scheduled from awa.queue_overview where queue = 'sq1'").fetchone()[0])
    assert (call.error, call.result) == (None, 301)
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 2
    assert su.execute("select count(*) from awa.ready where job_id = %s",
                      [job_id]).fetchone()[0] == 0
    assert su.execute("select state from awa.job(%s)", [job_id]).fetchone()[0] == "cancelled"


def test_a_drop_is_finished_after_a_rewrite_not_beside_it(db, su, logins):
    """awa.finish_drops reads what a dropped queue holds with one snapshot:
    it holds awa.scheduled (ACCESS SHARE) from the start, so a rewrite in
    flight (its lock held here) makes it leave the drop to its next call,
    where it failed with 55P03 from its count of the queue's rows."""
    with db.connect(logins.producer) as p, db.connect(logins.operator) as op:
        p.execute("select awa.enqueue('gone', 'k')")
        su.execute("delete from awa.ready where queue_id ="
                   " (select queue_id from awa.queue_meta where queue = 'gone')")
        assert op.execute("select awa.drop_queue('gone')").fetchone()[0] is True
    with db.connect(autocommit=False) as rewrite, db.connect(logins.maintenance) as finisher:
        rewrite.execute("lock table awa.scheduled in access exclusive mode")
        assert finisher.execute("select * from awa.finish_drops()").fetchall() == []
        rewrite.commit()
        assert [r[2] for r in finisher.execute("select * from awa.finish_drops()")
                ] == ["removed"]


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_snapshot_older_than_the_lock_is_refused(db, su, logins, isolation):
    assert_refused_outside_read_committed(db, logins.maintenance, "awa.compact_scheduled()",
                                          isolation)


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_only_maintenance_may_compact(db, su, logins, role):
    with db.connect(getattr(logins, role)) as conn, pytest.raises(psycopg.Error) as err:
        compact(conn)
    assert err.value.sqlstate == "42501"


def test_the_rewrite_table_has_scheduleds_columns_in_order(db):
    with db.connect() as conn:
        columns = {t: conn.execute(
            "select attname, format_type(atttypid, atttypmod), attnotnull from pg_attribute"
            " where attrelid = %s::regclass and attnum > 0 and not attisdropped"
            " order by attnum", [t]).fetchall() for t in ("awa.scheduled",
                                                          "awa.scheduled_rewrite")}
        assert columns["awa.scheduled"] == columns["awa.scheduled_rewrite"]
        assert conn.execute("select relpersistence from pg_class"
                            " where oid = 'awa.scheduled_rewrite'::regclass").fetchone()[0] == "u"


REWRITES = 1  # it needs 210,000 dead rows made first, 5 to 15 s under this load


def test_no_job_is_lost_or_promoted_twice_while_scheduled_is_rewritten_under_load(
        db, su, logins, horizon):
    """2 producers enqueue jobs for later, due 0 to 4 s on, one at a time,
    until the table has been rewritten once (the superuser making its dead
    rows, then no more) and 300 jobs each; awa.promote_due runs
    all along; 3 workers claim and complete what it moves. Every job
    enqueued ends in awa.finished once, and some rewrite found jobs for
    later to keep."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('spin', 4)")
    stop = threading.Event()
    rewrites: list[int] = []
    kept: list[int] = []
    seen: list[int] = []
    seen_lock = threading.Lock()
    total: list[int] = []

    def rewrite() -> None:
        with db.connect() as maker, db.connect(logins.maintenance) as m:
            while not stop.is_set() and sum(rewrites) < REWRITES:
                junk_scheduled(maker, 210_000)
                waiting = maker.execute(
                    "select count(*) from awa.scheduled s join awa.queue_meta q"
                    " using (queue_id) where q.queue = 'spin'").fetchone()[0]
                rewrites.append(compact(m))
                if rewrites[-1]:
                    kept.append(waiting)

    def promote() -> None:
        with db.connect(logins.maintenance) as m:
            while not stop.is_set():
                if not m.execute("select awa.promote_due(100)").fetchone()[0]:
                    time.sleep(0.05)

    def produce(n: int) -> int:
        i = 0
        with db.connect(logins.producer) as p:
            while sum(rewrites) < REWRITES or i < 300:
                p.execute("select awa.enqueue('spin', 'k', ordering_key => %s,"
                          " run_at => now() + %s * interval '1 millisecond')",
                          [f"p{n}-{i % 8}".encode(), (i * 37) % 4000])
                i += 1
        return i

    def work() -> None:
        with db.connect(logins.worker) as w:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with seen_lock:
                    if total and len(seen) >= total[0]:
                        return
                rows = claim(w, ["spin"], 5)
                if not rows:
                    time.sleep(0.05)
                for job_id, lease, *_ in rows:
                    assert w.execute("select awa.complete(%s, %s)",
                                     [job_id, lease]).fetchone()[0]
                    with seen_lock:
                        seen.append(job_id)

    with ThreadPoolExecutor(7) as pool:
        rewriter = pool.submit(rewrite)
        promoter = pool.submit(promote)
        producers = [pool.submit(produce, n) for n in range(2)]
        workers = [pool.submit(work) for _ in range(3)]
        try:
            total.append(sum(f.result() for f in producers))
            for f in workers:
                f.result()
        finally:
            stop.set()
        rewriter.result()
        promoter.result()
    assert sum(rewrites) == REWRITES, rewrites
    assert any(kept), kept
    assert len(seen) == len(set(seen)) == total[0]
    assert su.execute("select count(*), count(distinct job_id) from awa.finished f"
                      " join awa.queue_meta m using (queue_id) where m.queue = 'spin'"
                      ).fetchone() == (total[0], total[0])
    assert su.execute("select count(*) from awa.scheduled s join awa.queue_meta m"
                      " using (queue_id) where m.queue = 'spin'").fetchone()[0] == 0
