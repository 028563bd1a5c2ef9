"""awa.running's slots and their rotation (ADR 034), on real PostgreSQL 17
and 18: a claim writes the slot of its run lease's block; awa.rotate_running
empties the idle slot with TRUNCATE once the current block is half used,
carrying the jobs still running into slot 2, where their ends find them;
it removes dead rows while a snapshot is held, skips a slot it cannot lock
within its timeout, runs one at a time, refuses a snapshot older than its
lock, and loses no job while workers claim and complete across rotations.

Blocks are reached by moving awa.run_lease_seq forward as the superuser:
the leases a queue would have used up by then.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import behind, claim

BLOCK = 65_536
SLOT_TABLES = {0: "awa.running_0", 1: "awa.running_1", 2: "awa.running_carried"}
WHERE = ("select tableoid::regclass::text, slot, run_lease from awa.running"
         " where job_id = %s")


def slot_of(lease: int) -> int:
    """The rule of awa._running_slot, as a Python oracle."""
    return lease // BLOCK % 2


def lease_at(su, lease: int) -> None:
    """The next lease handed out is `lease`."""
    su.execute("select setval('awa.run_lease_seq', %s)", [lease - 1])


def into_second_half(su) -> None:
    """Moves the leases to the second half of the next block, where the
    rotation empties the slot the last claims wrote."""
    last = su.execute("select last_value from awa.run_lease_seq").fetchone()[0]
    lease_at(su, (last // BLOCK + 1) * BLOCK + BLOCK // 2)


def size(su, table: str) -> int:
    return su.execute("select pg_relation_size(%s)", [table]).fetchone()[0]


@pytest.fixture
def su(db, logins):
    with db.connect() as conn, db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('rot'::text, array[50]),"
                  " array_fill('k'::text, array[50]))")
        yield conn


def test_a_claim_writes_the_slot_of_its_leases_block(db, su, logins):
    lease_at(su, 3 * BLOCK - 2)
    with db.connect(logins.worker) as w:
        jobs = claim(w, ["rot"], 4)
    leases = [j[1] for j in jobs]
    assert leases == list(range(3 * BLOCK - 2, 3 * BLOCK + 2))
    for job_id, lease, *_ in jobs:
        table, slot, kept = su.execute(WHERE, [job_id]).fetchone()
        assert (slot, table, kept) == (slot_of(lease), SLOT_TABLES[slot_of(lease)], lease)
    assert {slot_of(x) for x in leases} == {0, 1}


def test_the_idle_slot_is_emptied_and_its_running_jobs_carried(db, su, logins):
    lease_at(su, 4 * BLOCK)  # slot 0
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m:
        jobs = claim(w, ["rot"], 10)
        for job_id, lease, *_ in jobs[:7]:
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        # Still the first half of the block: the idle slot (1) is empty, and
        # slot 0 is the one written.
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 0
        lease_at(su, 5 * BLOCK + BLOCK // 2 - 1)  # the claim below takes it: slot 1
        claim(w, ["rot"], 1)
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 0  # not half yet
        claim(w, ["rot"], 1)
        assert size(su, "awa.running_0") > 0
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        assert size(su, "awa.running_0") == 0
        for job_id, lease, *_ in jobs[7:]:
            assert su.execute(WHERE, [job_id]).fetchone() == ("awa.running_carried", 2, lease)
        # Nothing left to empty until the next block's second half.
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 0
        # The ends of a run find a carried job.
        (j1, l1, *_), (j2, l2, *_), (j3, l3, *_) = jobs[7:]
        assert w.execute("select awa.heartbeat(%s, %s, '1 minute')", [j1, l1]).fetchone()[0]
        assert w.execute("select awa.complete(%s, %s)", [j1, l1]).fetchone()[0]
        assert not w.execute("select awa.complete(%s, %s)", [j1, l1]).fetchone()[0]
        w.execute("select awa.fail(%s, %s, 'boom')", [j2, l2])
        assert w.execute("select awa.complete(%s, %s)", [j3, l3]).fetchone()[0]
    assert su.execute("select count(*) from awa.running_carried").fetchone()[0] == 0
    states = dict(su.execute("select state, count(*) from awa.finished group by state")
                  .fetchall())
    scheduled = su.execute("select count(*) from awa.scheduled").fetchone()[0]
    assert states.get("completed") == 9 and states.get("failed", 0) + scheduled == 1


def test_dead_rows_go_while_a_snapshot_is_held(db, su, logins):
    """The held snapshot keeps every row the completes delete: vacuum
    removes none, the TRUNCATE all."""
    lease_at(su, 6 * BLOCK)  # slot 0
    with db.connect(autocommit=False) as horizon, db.connect(logins.worker) as w, \
            db.connect(logins.maintenance) as m:
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")
        for _ in range(5):
            w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                      " from awa.claim(array['rot'], 8, 'w') c")
        su.execute("vacuum awa.running_0")
        dead = su.execute("select n_dead_tup from pg_stat_user_tables"
                          " where relid = 'awa.running_0'::regclass").fetchone()[0]
        assert size(su, "awa.running_0") > 0 and dead >= 40
        into_second_half(su)
        claim(w, ["rot"], 1)
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        assert size(su, "awa.running_0") == 0
        horizon.rollback()


def test_a_slot_held_by_a_claim_in_flight_is_skipped_then_emptied(db, su, logins):
    lease_at(su, 8 * BLOCK)  # slot 0
    with db.connect(logins.worker, autocommit=False) as held, \
            db.connect(logins.worker) as w, db.connect(logins.maintenance) as m:
        m.execute("set statement_timeout = '10s'")  # a wait past the lock's 100 ms fails
        (job_id, lease, *_), = claim(held, ["rot"], 1)  # its transaction stays open
        into_second_half(su)
        claim(w, ["rot"], 1)
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 0
        assert size(su, "awa.running_0") > 0
        assert held.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        held.commit()
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
    assert su.execute("select count(*) from awa.finished where job_id = %s",
                      [job_id]).fetchone()[0] == 1


def test_one_rotation_at_a_time(db, su, logins):
    lease_at(su, 10 * BLOCK)
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["rot"], 1)
        into_second_half(su)
        claim(w, ["rot"], 1)
    with db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        assert first.execute("select awa.rotate_running()").fetchone()[0] == 1
        assert second.execute("select awa.rotate_running()").fetchone()[0] == 0
        first.rollback()
    assert su.execute(WHERE, [job_id]).fetchone() == ("awa.running_0", 0, lease)


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_snapshot_older_than_the_slots_lock_is_refused(db, su, logins, isolation):
    lease_at(su, 12 * BLOCK)
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["rot"], 1)
        into_second_half(su)
        claim(w, ["rot"], 1)
    assert_refused_outside_read_committed(db, logins.maintenance, "awa.rotate_running()",
                                          isolation)
    assert su.execute(WHERE, [job_id]).fetchone() == ("awa.running_0", 0, lease)


WORKER_CALLS = {
    "complete": "select awa.complete(%s, %s)",
    "fail": "select awa.fail(%s, %s, 'boom')",
    "heartbeat": "select awa.heartbeat(%s, %s, '1 hour')",
}


@pytest.mark.parametrize("call", sorted(WORKER_CALLS))
def test_a_worker_call_older_than_a_rotation_refuses_instead_of_answering_stale(
        db, su, logins, call):
    """A repeatable read worker's statement takes its snapshot, then waits for
    the rotation that carries its run into slot 2: its snapshot sees the run
    in neither slot. It must not answer "stale lease" (false), which lets
    the worker's transaction commit while the rescue runs the job again; it
    raises 25000, and the run, still live, is found in read committed."""
    lease_at(su, 14 * BLOCK)  # slot 0
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["rot"], 1)
        into_second_half(su)
        claim(w, ["rot"], 1)
    with db.connect(logins.maintenance, autocommit=False) as m, \
            db.connect(logins.worker) as rr, db.connect(logins.worker) as rc:
        rr.execute("set default_transaction_isolation = 'repeatable read'")
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        waiting = behind(db, m, rr, lambda c: c.execute(WORKER_CALLS[call], [job_id, lease]))
        assert isinstance(waiting.error, psycopg.Error), waiting.result
        assert waiting.error.sqlstate == "25000"
        assert f"no run of job {job_id} with lease {lease}" in str(waiting.error)
        assert su.execute(WHERE, [job_id]).fetchone() == ("awa.running_carried", 2, lease)
        assert rc.execute(WORKER_CALLS[call], [job_id, lease]).fetchone()[0] is True


@pytest.mark.parametrize("call", sorted(WORKER_CALLS))
def test_a_stale_lease_is_false_in_read_committed_and_refused_outside_it(
        db, su, logins, call):
    with db.connect(logins.worker) as w:
        (job_id, lease, *_), = claim(w, ["rot"], 1)
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        assert w.execute(WORKER_CALLS[call], [job_id, lease]).fetchone()[0] is False
        w.execute("set default_transaction_isolation = 'repeatable read'")
        with pytest.raises(psycopg.Error) as err:
            w.execute(WORKER_CALLS[call], [job_id, lease])
        assert err.value.sqlstate == "25000"


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_only_maintenance_may_rotate(db, su, logins, role):
    with db.connect(getattr(logins, role)) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute("select awa.rotate_running()")
    assert err.value.sqlstate == "42501"


def test_no_job_is_lost_or_finished_twice_while_slots_rotate_under_workers(db, su, logins):
    """4 workers claim 5 jobs at a time and complete each in a transaction
    of its own, so jobs wait in awa.running between the two; meanwhile the
    leases jump to the next block's second half and a maintenance login
    rotates, again and again, carrying jobs mid-run. Every complete finds
    its job, once; every job ends in awa.finished once; nothing is left."""
    total = 3000
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('spin'::text, array[%s]),"
                  " array_fill('k'::text, array[%s]))", [total, total])
    stop = threading.Event()
    emptied: list[int] = []
    carried: list[int] = []

    def rotate() -> None:
        with db.connect() as jumper, db.connect(logins.maintenance) as m:
            while not stop.is_set():
                into_second_half(jumper)
                emptied.append(m.execute("select awa.rotate_running()").fetchone()[0])
                carried.append(
                    jumper.execute("select count(*) from awa.running_carried").fetchone()[0])

    def work() -> int:
        done = 0
        with db.connect(logins.worker) as w:
            while rows := claim(w, ["spin"], 5):
                for job_id, lease, *_ in rows:
                    assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
                    done += 1
        return done

    with ThreadPoolExecutor(5) as pool:
        rotator = pool.submit(rotate)
        workers = [pool.submit(work) for _ in range(4)]
        try:
            assert sum(f.result() for f in workers) == total
        finally:
            stop.set()
        rotator.result()
    assert sum(emptied) >= 5 and max(carried) > 0, (sum(emptied), max(carried))
    assert su.execute("select count(*), count(distinct job_id) from awa.finished f"
                      " join awa.queue_meta m using (queue_id) where m.queue = 'spin'"
                      ).fetchone() == (total, total)
    assert su.execute("select count(*) from awa.running r join awa.queue_meta m"
                      " using (queue_id) where m.queue = 'spin'").fetchone()[0] == 0
    assert su.execute("select completed from awa.queue_overview where queue = 'spin'"
                      ).fetchone()[0] == total


def test_the_completes_statements_differ_only_in_their_slot(db):
    """awa.complete has one statement per slot table (a DELETE through the
    partitioned table sets up all three at every call): they must stay
    alike but for the table they delete from."""
    with db.connect() as conn:
        source = conn.execute("select prosrc from pg_proc"
                              " where oid = 'awa.complete(bigint, bigint)'::regprocedure"
                              ).fetchone()[0]
    statements = re.findall(r"with done as \(.*?from done as d;", source, flags=re.S)
    tables = [re.search(r"delete from (awa\.\w+) as r", s).group(1) for s in statements]
    assert sorted(tables) == sorted(SLOT_TABLES.values())
    shapes = {re.sub(r"delete from awa\.\w+ as r", "delete from SLOT as r", s)
              for s in statements}
    assert len(shapes) == 1, shapes


def test_a_slot_whose_running_jobs_carry_more_than_the_bound_waits_for_them(
        db, su, logins):
    """Two jobs still running in the idle slot with more than
    awa._pass_bytes() of args between them: the carry would copy them under
    the slot's lock while every complete waited, so the slot is left; once
    one of them has ended, it is emptied."""
    budget = su.execute("select awa._pass_bytes()").fetchone()[0]
    with db.connect(logins.producer) as p:
        for _ in range(2):  # random hex: stored as it is, uncompressed
            p.execute("select awa.enqueue('big', 'big', (select jsonb_build_object('blob',"
                      " string_agg(md5(random()::text), '')) from generate_series(1, %s)))",
                      [budget * 55 // 100 // 32])
    lease_at(su, 6 * BLOCK)  # slot 0
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m:
        jobs = claim(w, ["big"], 2)
        into_second_half(su)
        claim(w, ["rot"], 1)  # slot 1 is written now; slot 0 is idle
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 0
        assert size(su, "awa.running_0") > 0
        assert w.execute("select awa.complete(%s, %s)", jobs[0][:2]).fetchone()[0]
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        assert size(su, "awa.running_0") == 0
        assert su.execute(WHERE, [jobs[1][0]]).fetchone() == (
            "awa.running_carried", 2, jobs[1][1])


@pytest.mark.parametrize("block", [6, 7], ids=["slot 0", "slot 1"])
def test_a_run_without_a_counter_completes_and_frees_its_unique_key(
        db, su, logins, block):
    """A running row with no completed_seq (one claimed by a layer older
    than the counters, committed after the upgrade's backfill) is completed
    all the same: the answer is true and the job's unique key is freed."""
    lease_at(su, block * BLOCK)
    with db.connect(logins.producer) as p, db.connect(logins.worker) as w:
        p.execute("select awa.enqueue('uncounted', 'k', unique_key => '\\x01'::bytea)")
        (job_id, lease, *_), = claim(w, ["uncounted"], 1)
        assert slot_of(lease) == block % 2
        su.execute("update awa.running set completed_seq = null where job_id = %s", [job_id])
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0] is True
        assert su.execute("select state from awa.finished where job_id = %s",
                          [job_id]).fetchone() == ("completed",)
        again = p.execute("select job_id from awa.enqueue('uncounted', 'k',"
                          " unique_key => '\\x01'::bytea)").fetchone()[0]
        assert again != job_id
