"""awa.promote_due serves every queue: a lane that one producer's open
transaction holds delays only that lane's due jobs, and a busy lane's short
transactions still let it through, on real PostgreSQL 17 and 18.

A producer holds its lane from its enqueue to its commit, and an application
that enqueues inside its own transaction may hold it for as long as that
transaction lasts. The promote pass waited for every due row's lane: one such
transaction at S = 1 stopped the promotion of every queue until its statement
timeout rolled the pass back, at every pass. It waits a second in line now,
and leaves the lanes one transaction held all that second.
"""

from __future__ import annotations

import psycopg

from awa_sql import routing
from tests.support.jobs import Call, enqueue, waits_for_a_lock
from tests.support.waiting import wait_until

# A promote that waited for the held lane would fail here (57014), not hang.
GUARD = "set statement_timeout = '5s'"


def due_later_job(conn, queue: str, ordering_key: bytes | None = None) -> int:
    return conn.execute(
        "select job_id from awa.enqueue(%s, 'later', ordering_key => %s,"
        " run_at => now() + interval '1 hour')", [queue, ordering_key]).fetchone()[0]


def make_due(db) -> None:
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = now() - interval '1 second'")


def ready_ids(db) -> set[int]:
    with db.connect() as su:
        return {r[0] for r in su.execute("select job_id from awa.ready")}


def test_a_held_lane_leaves_its_jobs_and_the_other_queues_are_promoted(db, logins):
    with db.connect(logins.producer) as p:
        held_job = due_later_job(p, "held")
        free_job = due_later_job(p, "free")
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as open_tx, \
            db.connect(logins.maintenance, autocommit=False) as m:
        in_flight = enqueue(open_tx, "held")[0]  # holds held's one lane (S = 1)
        m.execute(GUARD)
        m.execute("set local lock_timeout = '7s'")
        # One job a call, and the held lane's comes first: chosen out, not
        # filling the call.
        assert m.execute("select awa.promote_due(1)").fetchone()[0] == 1
        assert m.execute("show lock_timeout").fetchone()[0] == "7s"  # the caller's, back
        m.commit()
        assert ready_ids(db) == {free_job}
        open_tx.commit()
        m.execute(GUARD)
        assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
        m.commit()
    with db.connect() as su:
        lane = su.execute(
            "select job_id from awa.ready r join awa.queue_meta q using (queue_id)"
            " where q.queue = 'held' order by lane_seq").fetchall()
    # In lane order: the producer's job, committed first, then the promoted one.
    assert [r[0] for r in lane] == [in_flight, held_job]


def test_a_held_key_lane_leaves_that_key_and_promotes_the_queues_other_keys(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('keys', 4)")
    a = b"key-1"
    b = next(k for i in range(2, 50) if routing.shard_for_ordering_key(k := f"key-{i}".encode(), 4)
             != routing.shard_for_ordering_key(a, 4))
    with db.connect(logins.producer) as p:
        job_a = due_later_job(p, "keys", a)
        job_b = due_later_job(p, "keys", b)
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as open_tx, \
            db.connect(logins.maintenance) as m:
        enqueue(open_tx, "keys", ordering_key=a)  # holds key a's lane only
        m.execute(GUARD)
        assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
        assert ready_ids(db) >= {job_b} and job_a not in ready_ids(db)
        with db.connect() as su:
            assert su.execute("select count(*) from awa.scheduled where job_id = %s",
                              [job_a]).fetchone()[0] == 1
        open_tx.commit()
        assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
    assert job_a in ready_ids(db)


def lane_of(db, queue: str, shard: int = 0, priority: int = 2) -> int:
    with db.connect() as su:
        return su.execute("select lane_ids[%s][%s] from awa.queue_meta where queue = %s",
                          [priority, shard, queue]).fetchone()[0]


def promote_while(db, logins, action, max_jobs: int = 1000) -> int:
    """awa.promote_due in a thread; ``action()`` once it waits for a lane."""
    with db.connect(logins.maintenance, autocommit=False) as m, db.connect() as watch:
        m.execute(GUARD)
        promote = Call(m, lambda c: c.execute("select awa.promote_due(%s)",
                                              [max_jobs]).fetchone()[0])
        promote.start()
        wait_until(lambda: waits_for_a_lock(watch, promote.pid), what="the promote to wait")
        action()
        promote.join(timeout=30)
        assert promote.error is None, promote.error
        return promote.result


def test_a_busy_lane_of_short_transactions_is_waited_for(db, logins):
    """Holders that come and go are not a stuck lane: the pass waits its turn
    (a first version of this fix gave up after 100 ms, and a lane of short
    but steady transactions was never promoted)."""
    with db.connect(logins.producer) as p:
        job = due_later_job(p, "busy")
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as first, \
            db.connect(logins.producer, autocommit=False) as second, db.connect() as watch:
        enqueue(first, "busy")
        # The next producer, in line before the pass, holds the lane 0.3 s
        # once it has it (the premise: transactions of some length).
        nxt = Call(second, lambda c: (enqueue(c, "busy"), c.execute("select pg_sleep(0.3)")))
        nxt.start()
        wait_until(lambda: waits_for_a_lock(watch, nxt.pid), what="the producer to wait")
        moved = promote_while(db, logins, first.commit)
        nxt.join(timeout=30)
    assert moved == 1 and job in ready_ids(db)


def test_a_lane_class_lock_that_is_no_lane_id_is_not_read(db, logins):
    """pg_locks shows a negative key as an oid above 2^31: read as a lane id,
    it made every pass that waited fail (22003)."""
    with db.connect(logins.producer) as p:
        due_later_job(p, "stuck-neg")
        free_job = due_later_job(p, "free-neg")
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as open_tx, db.connect() as odd:
        odd.execute("select pg_advisory_lock(awa._lock_class_lane(), -1)")
        enqueue(open_tx, "stuck-neg")
        with db.connect(logins.maintenance) as m:
            m.execute(GUARD)
            assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
    assert free_job in ready_ids(db)


def test_a_lock_of_another_database_is_no_lane_of_this_one(db, logins, cluster):
    with db.connect(logins.producer) as p:
        due_later_job(p, "stuck")
        other_job = due_later_job(p, "innocent")
    make_due(db)
    innocent = lane_of(db, "innocent")
    with db.connect(logins.producer, autocommit=False) as open_tx, \
            psycopg.connect(cluster.dsn("postgres"), autocommit=True) as elsewhere:
        enqueue(open_tx, "stuck")
        elsewhere.execute("select pg_advisory_lock(1635213644, %s)", [innocent])
        with db.connect(logins.maintenance) as m:
            m.execute(GUARD)
            assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 1
    assert other_job in ready_ids(db)


def test_unkeyed_rows_take_the_free_lanes_beside_a_stuck_one(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('mixed', 4)")
    key = b"key-1"
    with db.connect(logins.producer) as p:
        keyed = due_later_job(p, "mixed", key)
        unkeyed = {due_later_job(p, "mixed") for _ in range(3)}
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as open_tx:
        enqueue(open_tx, "mixed", ordering_key=key)  # holds the key's lane only
        with db.connect(logins.maintenance) as m:
            m.execute(GUARD)
            assert m.execute("select awa.promote_due(1000)").fetchone()[0] == 3
    assert unkeyed <= ready_ids(db) and keyed not in ready_ids(db)


def test_a_second_promoter_while_one_waits_for_a_lane_moves_nothing(db, logins):
    """Jobs A then B of one key are due, after C of another queue, whose
    lane a producer's open transaction holds. Promoter 1 (two jobs a call)
    locks C and A and waits for C's lane. A second promoter skipped the
    locked rows, moved B into the key's lane and committed first: B ran
    before A. One call at a time now: the second returns 0, and promoter 1,
    leaving C's held lane, moves A then B."""
    with db.connect(logins.producer) as p:
        enqueue(p, "first", "warm")  # made first: its lanes lock first
        c = due_later_job(p, "first")
        a = due_later_job(p, "keyed", b"k")
        b = due_later_job(p, "keyed", b"k")
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = now() - interval '2 seconds'"
                   " where job_id = %s", [c])
        su.execute("update awa.scheduled set run_at = now() - interval '1 second'"
                   " where job_id in (%s, %s)", [a, b])
    with db.connect() as admin, db.connect(logins.producer, autocommit=False) as open_tx, \
            db.connect(logins.maintenance) as second:
        enqueue(open_tx, "first")  # holds first's one lane (S = 1)
        promoter = Call(db.connect(logins.maintenance, autocommit=False),
                        lambda conn: conn.execute("select awa.promote_due(2)").fetchone()[0])
        promoter.start()
        wait_until(lambda: waits_for_a_lock(admin, promoter.pid),
                   what="promoter 1 to wait for first's lane")
        assert second.execute("select awa.promote_due(10)").fetchone()[0] == 0
        promoter.join(timeout=30)  # C's lane is held all along: left, past 200 ms
        assert promoter.error is None, promoter.error
        assert promoter.result == 2
        open_tx.commit()
        keyed = [r[0] for r in admin.execute(
            "select r.job_id from awa.ready as r join awa.queue_meta as m using (queue_id)"
            " where m.queue = 'keyed' order by r.lane_seq")]
        assert keyed == [a, b]
