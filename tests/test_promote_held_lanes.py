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

import time

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


def test_a_lane_a_transaction_holds_for_half_a_second_is_waited_for(db, logins):
    """A busy lane's holders come and go: the pass waits its turn, as before
    (it gave up after 100 ms in a first version of this fix, and a lane of
    short but steady transactions was never promoted)."""
    with db.connect(logins.producer) as p:
        job = due_later_job(p, "slow-tx")
    make_due(db)
    with db.connect(logins.producer, autocommit=False) as slow, \
            db.connect(logins.maintenance, autocommit=False) as m, db.connect() as watch:
        enqueue(slow, "slow-tx")
        m.execute(GUARD)
        promote = Call(m, lambda c: c.execute("select awa.promote_due(1000)").fetchone()[0])
        promote.start()
        wait_until(lambda: waits_for_a_lock(watch, promote.pid), what="the promote to wait")
        time.sleep(0.5)  # the premise: a transaction of half a second, not a wait for it
        slow.commit()
        promote.join(timeout=30)
        assert promote.error is None and promote.result == 1
    assert job in ready_ids(db)
