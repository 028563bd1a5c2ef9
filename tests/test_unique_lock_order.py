"""Calls that lock several unique keys' rows lock them in one order,
(scope, key), so that two single calls never deadlock over them (ADR 027,
ADR 056): a queue joining a family (awa._join_unique_scope, which moves
its keys), awa.cancel_jobs and awa.rescue_expired (which give keys back).
In each case a worker's open complete holds one key's row, so that the
join stops between two keys, and the other call met the keys in another
order than the join (a lane's, the order its statements or its delete
returned the jobs): when the worker committed, the two waited for each
other (40P01) while the join locked keys in its scan's order and the
other call gave them back one job at a time."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.support.jobs import Call, claim, enqueue, in_turn_behind

JOIN = "select * from awa.set_queue_partitions('jd', 2)"


def _fast_deadlock_detection(db) -> None:
    with db.connect() as su:
        su.execute(sql.SQL("alter database {} set deadlock_timeout = '50ms'").format(
            sql.Identifier(db.name)))


def _keyed(p: psycopg.Connection, key: bytes, **kw) -> int:
    return enqueue(p, "jd__p1", key.decode(), unique_key=key, **kw)[0]


def _held_open(db, worker: str, job: tuple) -> psycopg.Connection:
    """A worker's transaction that has completed ``job`` and holds its key's row."""
    w = db.connect(worker, autocommit=False)
    assert w.execute("select awa.complete(%s, %s)", job[:2]).fetchone()[0]
    return w


def _joined_and_given_back(db, logins, other: Call, held: psycopg.Connection) -> None:
    """The join waits for the held row; ``other`` starts once it waits, and
    waits too; the worker commits. Both calls go through."""
    join = Call(db.connect(logins.operator, autocommit=False),
                lambda c: c.execute(JOIN).fetchall())
    with db.connect() as watch:
        in_turn_behind(watch, held, [join, other])
    held.close()
    for call in (join, other):
        assert call.error is None, call.error
    with db.connect() as su:
        assert su.execute("select partitions from awa.queue_meta where queue = 'jd'"
                          ).fetchone()[0] == 2


# The keyed jobs of jd__p1, in enqueue order: (key, priority, scheduled).
# The worker claims K2's job (priority 1); the cancel takes the others.
CANCELLED = {
    # The review's t8: K3's job in a lane before K1's. The cancel gave K3
    # back, then waited for K1, which the join held while it waited for K2,
    # then for K3.
    "lane order": [(b"K1", 3, False), (b"K2", 1, False), (b"K3", 2, False)],
    # K1's job scheduled: cancelled after the ready ones, and its key given
    # back after K3's (which one statement for each table did too).
    "scheduled after ready": [(b"K1", 1, True), (b"K2", 1, False), (b"K3", 2, False)],
    # The rows of the keys made in the order K3, K2, K1: the join moved them
    # in that order (its scan's) and waited for K1, which the cancel held,
    # giving back K1 (its lane is first) and waiting for K3.
    "heap order": [(b"K3", 3, False), (b"K2", 1, False), (b"K1", 2, False)],
}


@pytest.mark.parametrize("case", CANCELLED)
def test_a_join_and_a_cancel_of_the_queue_take_its_keys_in_one_order(db, logins, case):
    """jd__p1 holds K1, K2 and K3 and joins jd as its partition 1 while an
    operator cancels its jobs; a worker's complete of K2's job is open, so
    the join waits there. Both go through now: each takes K1 first, then
    K3, and the cancel waits for the join, which moves K1 and K3 to jd,
    where the cancel gives them back."""
    _fast_deadlock_detection(db)
    jobs = {}
    with db.connect(logins.producer) as p:
        enqueue(p, "jd", "seed")
        for key, priority, later in CANCELLED[case]:
            jobs[key] = _keyed(p, key, priority=priority,
                               run_at="2999-01-01 00:00:00+00" if later else None)
    with db.connect(logins.worker) as w:
        running, = claim(w, ["jd__p1"], 1)
    assert running[0] == jobs[b"K2"]
    held = _held_open(db, logins.worker, running)
    cancel = Call(db.connect(logins.operator, autocommit=False),
                  lambda c: c.execute("select awa.cancel_jobs('jd__p1')").fetchone()[0])
    _joined_and_given_back(db, logins, cancel, held)
    assert cancel.result == 2
    with db.connect() as su:
        assert su.execute("select queue, unique_key from awa.unique_keys").fetchall() == []
        # Kept for a retry, which takes the key back.
        assert dict(su.execute("select job_id, unique_key from awa.finished"
                               " where state = 'cancelled'").fetchall()) == {
            jobs[b"K1"]: b"K1", jobs[b"K3"]: b"K3"}


def test_a_join_and_a_rescue_that_fails_its_jobs_take_their_keys_in_one_order(db, logins):
    """jd__p1 holds K1, K2 and K3, each job on its last attempt and running,
    and joins jd while the rescue fails the jobs whose leases ran out; a
    worker's complete of K2's job is open, so the join waits there. One
    batch made the jobs in the order K3, K2, K1 and their keys' rows in key
    order: the rescue gave K3 back (its job first), then waited for K1,
    which the join held while it waited for K2, then for K3. Both go through
    now: the rescue takes K1 first and waits for the join."""
    _fast_deadlock_detection(db)
    keys = [b"K3", b"K2", b"K1"]
    with db.connect(logins.producer) as p:
        enqueue(p, "jd", "seed")
        made = p.execute(
            "select job_id from awa.enqueue_batch(array['jd__p1', 'jd__p1', 'jd__p1'],"
            " array['a', 'b', 'c'], priorities => array[2, 1, 2]::smallint[],"
            " max_attempts => array[1, 1, 1], unique_keys => %s)", [keys]).fetchall()
        jobs = dict(zip(keys, (j for j, in made), strict=True))
    with db.connect(logins.worker) as w:
        running, = claim(w, ["jd__p1"], 1)
        assert running[0] == jobs[b"K2"]
        assert len(claim(w, ["jd__p1"], 2)) == 2
    with db.connect() as su:
        su.execute("update awa.running set lease_expires_at = now() - interval '1 minute'"
                   " where job_id <> %s", [jobs[b"K2"]])
    held = _held_open(db, logins.worker, running)
    rescue = Call(db.connect(logins.maintenance, autocommit=False),
                  lambda c: c.execute("select awa.rescue_expired()").fetchone()[0])
    _joined_and_given_back(db, logins, rescue, held)
    assert rescue.result == 2
    with db.connect() as su:
        assert su.execute("select queue, unique_key from awa.unique_keys").fetchall() == []
        assert dict(su.execute("select job_id, unique_key from awa.finished"
                               " where state = 'failed'").fetchall()) == {
            jobs[b"K1"]: b"K1", jobs[b"K3"]: b"K3"}
