"""Ready jobs listed exactly, by job id, at the cost of the page (ADR 029),
on PostgreSQL 17 and 18.

awa.jobs finds where a lane's jobs above a cursor start by bisecting the
lane on f (a row's stamp in awa.ready_late, else its job id). That rests on
one invariant, checked here on the rows every enqueue path and every move
writes, with producers running at once: within a lane f never falls as
lane_seq rises, and is never below the row's job id. Then random states go
through every path (single, batch, keyed, unique, COPY, scheduled and
promoted, failed and retried, cancelled, claimed and completed, pruned) and
every page of awa.jobs must be what sorting the tables gives, and awa.job
of each job its state; a page deep
in a long lane reads what a page at its front reads; awa.prune_ready_late
removes the rows of jobs gone and keeps the others.
"""

from __future__ import annotations

import random
import statistics
import threading
from datetime import UTC, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awa_sql import client
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import claim, copy_rows
from tests.support.waiting import wait_until

# Rows whose f is below an earlier row's f in the same lane, or below their
# own job id: the invariant's breaches (none expected).
BREACHES = """
    select r.lane_id, r.lane_seq, r.job_id, r.f, r.before
      from (
          select x.lane_id, x.lane_seq, x.job_id, greatest(x.job_id, y.stamp) as f,
                 max(greatest(x.job_id, y.stamp)) over (
                     partition by x.lane_id order by x.lane_seq
                     rows between unbounded preceding and 1 preceding
                 ) as before
            from awa.ready as x
            left join awa.ready_late as y
              on y.job_id = x.job_id and y.lane_id = x.lane_id and y.lane_seq = x.lane_seq
      ) as r
     where r.f < r.before or r.f < r.job_id
"""
ALL_JOBS = """
    select job_id, 'scheduled' from awa.scheduled where queue_id = any(%(q)s)
    union all select job_id, 'ready' from awa.ready where queue_id = any(%(q)s)
    union all select job_id, 'running' from awa.running where queue_id = any(%(q)s)
    union all select job_id, state from awa.finished where queue_id = any(%(q)s)
    order by 1
"""


def pages(conn, queue, state, n, after=None) -> list[tuple[int, str]]:
    out = []
    while rows := conn.execute("select job_id, state from awa.jobs(%s, %s, null, %s, %s)",
                               [queue, state, after, n]).fetchall():
        assert len(rows) <= n
        out += [tuple(r) for r in rows]
        after = rows[-1][0]
    return out


def queue_ids(conn, queue) -> list[int]:
    return [r[0] for r in conn.execute(
        "select queue_id from awa.queue_meta where queue = %s or logical_queue = %s"
        " or root_queue = %s", [queue, queue, queue]).fetchall()]


def promote_all(admin) -> int:
    admin.execute("update awa.scheduled set run_at = now() - interval '1 second'"
                  " where run_at > now() - interval '1 second'")
    return admin.execute("select awa.promote_due()").fetchone()[0]


def fail_and_retry(admin, queue, n) -> None:
    """Claims n jobs, fails each for good and retries them: they enter a
    lane again with the ids they had."""
    for job_id, lease, *_ in claim(admin, [queue], n):
        admin.execute("select awa.fail(%s, %s, 'x')", [job_id, lease])
    admin.execute("select awa.retry_jobs(%s)", [queue])


def _produce(dsn, queue, seed, rounds, errors) -> None:
    rng = random.Random(seed)
    later = datetime(2999, 1, 1, tzinfo=UTC)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(rounds):
                key = f"k{rng.randrange(12)}".encode() if rng.random() < 0.5 else None
                way = rng.randrange(5)
                if way == 0:
                    client.enqueue(conn, "j", queue=queue, ordering_key=key)
                elif way == 1:
                    client.enqueue_many(conn, [
                        {"kind": "j", "ordering_key": f"b{seed}-{i}-{n}".encode()
                         if rng.random() < 0.5 else None}
                        for n in range(rng.randrange(1, 20))], queue=queue)
                elif way == 2:
                    client.enqueue(conn, "j", queue=queue, ordering_key=key,
                                   unique_key=f"u{seed}-{i}".encode())
                elif way == 3:
                    client.enqueue_many_copy(conn, [{"kind": "j"}] * rng.randrange(1, 10),
                                             queue=queue, ordering_key=key)
                else:
                    client.enqueue(conn, "j", queue=queue, ordering_key=key, run_at=later)
    except Exception as exc:
        errors.append(exc)


def test_f_never_falls_within_a_lane_with_producers_at_once(db):
    """Four producers on every enqueue path at once, and a mover promoting
    and retrying jobs into the same lanes (S = 3): within each lane f rises
    with lane_seq, and no row's f is below its job id."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('inv', 3)")
    errors: list[Exception] = []
    producers = [threading.Thread(target=_produce, args=(db.dsn(), "inv", s, 60, errors))
                 for s in range(4)]
    for t in producers:
        t.start()
    with db.connect() as mover:
        while any(t.is_alive() for t in producers):
            promote_all(mover)
            fail_and_retry(mover, "inv", 5)
        for t in producers:
            t.join()
        promote_all(mover)
        fail_and_retry(mover, "inv", 20)
        assert not errors
        assert mover.execute("select count(*) from awa.ready_late").fetchone()[0] > 0
        assert mover.execute(BREACHES).fetchall() == []


step = st.one_of(
    st.tuples(st.just("enqueue"), st.integers(1, 30), st.booleans()),
    st.tuples(st.just("batch"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("unique"), st.integers(1, 10), st.booleans()),
    st.tuples(st.just("copy"), st.integers(1, 20), st.booleans()),
    st.tuples(st.just("later"), st.integers(1, 15), st.booleans()),
    st.tuples(st.just("promote"), st.just(0), st.booleans()),
    st.tuples(st.just("retry"), st.integers(1, 15), st.booleans()),
    st.tuples(st.just("complete"), st.integers(1, 40), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("prune"), st.just(0), st.booleans()),
)


def _apply(admin, queue, counter, op, n, keyed) -> None:
    counter[0] += 1
    keys = [f"k{counter[0]}-{i}".encode() if keyed else None for i in range(n)]
    if op == "enqueue":
        for key in keys:
            admin.execute("select awa.enqueue(%s, 'j', ordering_key => %s)", [queue, key])
    elif op == "batch":
        admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                      " array_fill('j'::text, array[%s]), ordering_keys => %s::bytea[])",
                      [queue, n, n, keys])
    elif op == "unique":
        for i in range(n):
            admin.execute("select awa.enqueue(%s, 'j', unique_key => %s, ordering_key => %s)",
                          [queue, f"u{counter[0]}-{i % 4}".encode(), keys[i]])
    elif op == "copy":
        copy_rows(admin, [(queue, None, key, "j", None, None, None) for key in keys])
        admin.execute("select awa.move_staged()")
    elif op == "later":
        for key in keys:
            admin.execute("select awa.enqueue(%s, 'j', ordering_key => %s,"
                          " run_at => '2999-01-01')", [queue, key])
    elif op == "promote":
        promote_all(admin)
    elif op == "retry":
        fail_and_retry(admin, queue, n)
    elif op == "complete":
        for job_id, lease, *_ in claim(admin, [queue], n):
            admin.execute("select awa.complete(%s, %s)", [job_id, lease])
    elif op == "cancel":
        for (job_id,) in admin.execute(
                "select job_id from awa.ready where queue_id = any(%s)"
                " order by random() limit %s", [queue_ids(admin, queue), n]).fetchall():
            admin.execute("select awa.cancel_job(%s)", [job_id])
    else:
        admin.execute("select awa.prune_ready_late()")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shards=st.sampled_from([1, 4]), steps=st.lists(step, min_size=1, max_size=14),
       page_size=st.sampled_from([1, 3, 10, 100]), cursor=st.integers(0, 400))
def test_every_page_is_what_sorting_the_tables_gives(db, shards, steps, page_size, cursor):
    queue = f"pg{shards}"
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])
        for q in queue_ids(admin, queue):
            for table in ("ready", "scheduled", "running", "finished", "ready_late"):
                admin.execute(f"delete from awa.{table} where queue_id = %s", [q])
        counter = [0]
        for op, n, keyed in steps:
            _apply(admin, queue, counter, op, n, keyed)
        assert admin.execute(BREACHES).fetchall() == []
        every = [tuple(r) for r in admin.execute(ALL_JOBS, {"q": queue_ids(admin, queue)})]
        ready = [r for r in every if r[1] == "ready"]
        assert pages(admin, queue, "ready", page_size) == ready
        assert pages(admin, queue, None, page_size) == every
        after = every[cursor % len(every)][0] if every else cursor
        assert pages(admin, queue, "ready", page_size, after) == [r for r in ready
                                                                    if r[0] > after]
        # One job by id finds each where it is, ready ones by bisection (ADR 031).
        assert [tuple(r) for r in admin.execute(
            "select j.job_id, j.state from unnest(%s::bigint[]) as x (id)"
            " cross join lateral awa.job(x.id) as j order by 1",
            [[r[0] for r in every]])] == every


def test_prune_removes_the_rows_of_jobs_gone_and_keeps_the_others(db, logins):
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('pr', 2)")
        admin.execute("select awa.enqueue_batch(array_fill('pr'::text, array[40]),"
                      " array_fill('j'::text, array[40]), run_ats =>"
                      " array_fill('2999-01-01'::timestamptz, array[40]))")
        promote_all(admin)
        late = admin.execute("select count(*) from awa.ready_late").fetchone()[0]
        assert late == 40
        done = claim(admin, ["pr"], 25)
        for job_id, lease, *_ in done:
            admin.execute("select awa.complete(%s, %s)", [job_id, lease])
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_ready_late()").fetchone()[0] == 25
        assert m.execute("select awa.prune_ready_late()").fetchone()[0] == 0
    with db.connect() as admin:
        kept = admin.execute("select count(*) from awa.ready_late y join awa.ready r"
                             " using (job_id, lane_id, lane_seq)").fetchone()[0]
        assert kept == admin.execute("select count(*) from awa.ready_late").fetchone()[0] == 15
        with pytest.raises(Exception, match="max_rows must be 0 or more, got -1"):
            admin.execute("select awa.prune_ready_late(-1)")
    for role in ("producer", "worker", "reader", "operator"):
        with db.connect(getattr(logins, role)) as c, pytest.raises(Exception, match="permission"):
            c.execute("select awa.prune_ready_late()")


LANE_BLOCKS = ("select sum(pg_stat_get_xact_blocks_fetched(r::regclass))::int from unnest("
               "array['awa.ready', 'awa.ready_pkey', 'awa.ready_late', 'awa.ready_late_pkey',"
               " 'awa.ready_late_queue_job_idx'])"
               " as r")


def page_blocks(conn, after: int) -> int:
    with conn.transaction():
        before = conn.execute(LANE_BLOCKS).fetchone()[0]
        rows = conn.execute("select job_id from awa.jobs('long', 'ready', null, %s, 100)",
                            [after]).fetchall()
        assert len(rows) == 100 and rows[0][0] > after
        return conn.execute(LANE_BLOCKS).fetchone()[0] - before


def test_a_page_deep_in_a_long_lane_reads_what_one_at_its_front_reads(db, logins):
    """40,000 ready jobs in one lane, a tenth of them moved in late: a page of
    100 after a job at the back reads about what a page after one at the
    front reads (the bisection adds a probe per halving, not a row per job)."""
    with db.connect() as admin:
        ids = []
        for _ in range(8):
            ids += [r[0] for r in admin.execute(
                "select job_id from awa.enqueue_batch(array_fill('long'::text, array[4500]),"
                " array_fill('j'::text, array[4500]))").fetchall()]
            admin.execute("select awa.enqueue_batch(array_fill('long'::text, array[500]),"
                          " array_fill('j'::text, array[500]), run_ats =>"
                          " array_fill('2999-01-01'::timestamptz, array[500]))")
            promote_all(admin)
        admin.execute("vacuum analyze awa.ready, awa.ready_late")
    with db.connect(logins.reader) as r:
        front = statistics.median(page_blocks(r, ids[i]) for i in (10, 20, 30))
        back = statistics.median(page_blocks(r, ids[i]) for i in (-1000, -2000, -3000))
    assert back <= front + 40, (front, back)


def test_job_ids_are_handed_out_one_at_a_time(db):
    """The invariant needs ids in the order backends take them: a cache per
    backend would hand out ranges that interleave (ADR 029)."""
    with db.connect() as admin:
        assert admin.execute("select seqcache from pg_sequence"
                             " where seqrelid = 'awa.job_id_seq'::regclass").fetchone()[0] == 1


def test_the_first_layer_after_0020_records_the_rows_already_moved_in(db):
    """Rows an earlier function layer moved into lanes (before migration 0020,
    or while the upgrade ran) are recorded by this layer's first apply after
    0020, which finds those whose id is below an earlier one of their lane;
    with them every page is exact. A later apply leaves the table alone."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('bf', 2)")
        for _ in range(3):
            admin.execute("select awa.enqueue_batch(array_fill('bf'::text, array[30]),"
                          " array_fill('j'::text, array[30]), run_ats =>"
                          " array_fill('2999-01-01'::timestamptz, array[30]))")
            admin.execute("select awa.enqueue_batch(array_fill('bf'::text, array[40]),"
                          " array_fill('j'::text, array[40]))")
        promote_all(admin)
        admin.execute("delete from awa.ready_late")  # as the earlier layer left them
        assert admin.execute(BREACHES).fetchall() != []
        # As if the layer had last been applied before 0020: none recorded.
        admin.execute("delete from awa.schema_functions")
    db.awa("migrate", check=True)
    with db.connect() as admin:
        assert admin.execute(BREACHES).fetchall() == []
        every = [tuple(r) for r in admin.execute(ALL_JOBS, {"q": queue_ids(admin, "bf")})]
        assert pages(admin, "bf", "ready", 7) == every
        admin.execute("delete from awa.ready_late")
        # A later layer change: applied again, its last apply after 0020.
        admin.execute("update awa.schema_functions set checksum = 'stale'")
    assert "function layer" in db.awa("migrate", check=True).stdout
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.schema_functions"
                             " where checksum = 'stale'").fetchone()[0] == 0
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready_late").fetchone()[0] == 0


def test_a_move_in_flight_across_the_upgrade_is_recorded(db):
    """The earlier layer's awa._insert_jobs (no recording) promotes a job in a
    transaction still open when the first layer apply after 0020 starts: the
    apply waits for it (it has written awa.scheduled), then scans, and the
    job is recorded; a move started meanwhile reaches this layer's
    awa._insert_jobs."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('up', 1)")
        later = admin.execute("select job_id from awa.enqueue('up', 'j', run_at => '2999-01-01')"
                              ).fetchone()[0]
        admin.execute("select awa.enqueue_batch(array_fill('up'::text, array[3]),"
                      " array_fill('j'::text, array[3]))")
        admin.execute("update awa.scheduled set run_at = now() - interval '1 second'")
        # The earlier layer: the same awa._insert_jobs without its last statement.
        body = admin.execute("select pg_get_functiondef('awa._insert_jobs(integer[], bigint[],"
                             " integer[], smallint[], text[], jsonb[], bytea[], integer[],"
                             " timestamptz[], bigint[], integer[], timestamptz[], text[],"
                             " interval[])'::regprocedure)").fetchone()[0]
        start = body.index("    if job_ids is not null then")
        admin.execute(body[:start] + body[body.index("    end if;\n", start) + 12:])
        admin.execute("delete from awa.schema_functions")  # the layer predates 0020
    with db.connect(autocommit=False) as mover, db.connect() as watcher:
        assert mover.execute("select awa.promote_due()").fetchone()[0] == 1
        ran = []
        migration = threading.Thread(target=lambda: ran.append(db.awa("migrate").returncode))
        migration.start()
        wait_until(lambda: watcher.execute(
            "select exists (select from pg_locks where not granted and mode = 'ExclusiveLock'"
            " and relation = 'awa.scheduled'::regclass)").fetchone()[0],
            what="the layer waiting for the mover")
        assert watcher.execute("select count(*) from awa.ready_late").fetchone()[0] == 0
        mover.commit()
        migration.join(60)
        assert ran == [0]
        assert watcher.execute("select job_id from awa.ready_late").fetchall() == [(later,)]
        assert watcher.execute(BREACHES).fetchall() == []
        every = [tuple(r) for r in watcher.execute(ALL_JOBS, {"q": queue_ids(watcher, "up")})]
        assert pages(watcher, "up", "ready", 1) == every


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_the_prune_of_late_rows_refuses_a_snapshot_older_than_the_call(db, isolation):
    """A snapshot from before a rewrite of awa.ready sees it empty, every
    lane's head at its next lane_seq, and would remove the rows that find
    jobs still ready."""
    assert_refused_outside_read_committed(db, db.login_role("awa_maintenance"),
                                          "awa.prune_ready_late()", isolation)
