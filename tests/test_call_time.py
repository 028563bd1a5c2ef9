"""The times a call sets count from the call, not from its transaction's
start, on real PostgreSQL 17 and 18.

A worker may complete or fail a job in the transaction of its handler's own
effects, and a producer may enqueue in a long transaction of its own. Counted
from ``now()`` (the transaction's start), a retry's backoff, a claim's lease
and a lease's extension were short by the transaction's age (a lease could
be over when its claim committed), and a unique key whose window had ended
still held against a producer whose transaction began before that end. Each
test holds a transaction open for longer than the span it checks
(``pg_sleep`` inside the transaction is the premise, not a wait for another
session).
"""

from __future__ import annotations

import psycopg
import pytest

from tests.support.jobs import claim, enqueue

AGE = "select pg_sleep(1.5)"  # the transaction's age before the call


def test_a_retry_backoff_counts_from_the_fail(db, logins):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "backoff-call")[0]
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('backoff-call', '1 second', '1 second', 0)")
    with db.connect(logins.worker, autocommit=False) as w:
        (c,) = claim(w, ["backoff-call"])
        w.commit()
        w.execute(AGE)
        assert w.execute("select awa.fail(%s, %s, 'boom')", [job, c[1]]).fetchone()[0]
        w.commit()
    with db.connect() as su:
        ahead = su.execute("select extract(epoch from run_at - now()) from awa.scheduled"
                           " where job_id = %s", [job]).fetchone()[0]
    assert 0.5 < ahead <= 1.0  # a full second from the fail, not 1 s from its BEGIN


def test_a_retry_at_already_past_is_kept_as_the_fail_time(db, logins):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "past-retry")[0]
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["past-retry"])
        assert w.execute("select awa.fail(%s, %s, 'x', '-infinity')",
                         [job, c[1]]).fetchone()[0]
    with db.connect() as su:
        at = su.execute("select run_at, run_at <= now() from awa.scheduled where job_id = %s",
                        [job]).fetchone()
    assert at[1] is True and at[0].year >= 2026  # readable by a client, and due at once


def test_a_lease_and_its_extension_count_from_the_call(db, logins):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "lease-call")[0]
    with db.connect(logins.worker, autocommit=False) as w:
        w.execute(AGE)
        (c,) = claim(w, ["lease-call"], lease="2 seconds")
        w.commit()
        with db.connect() as su:
            left = su.execute("select extract(epoch from lease_expires_at - now())"
                              " from awa.running where job_id = %s", [job]).fetchone()[0]
        assert 1.0 < left <= 2.0
        w.execute(AGE)
        assert w.execute("select awa.heartbeat(%s, %s, '2 seconds')",
                         [job, c[1]]).fetchone()[0]
        w.commit()
    with db.connect() as su:
        left = su.execute("select extract(epoch from lease_expires_at - now())"
                          " from awa.running where job_id = %s", [job]).fetchone()[0]
    assert 1.0 < left <= 2.0


def test_a_unique_window_ended_after_the_producers_begin_gives_the_key_back(db, logins):
    with db.connect(logins.producer) as p:
        first = enqueue(p, "window-call", unique_key=b"k", unique_window="1 second")[0]
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["window-call"])
        assert w.execute("select awa.complete(%s, %s)", [first, c[1]]).fetchone()[0]
    with db.connect(logins.producer, autocommit=False) as p:
        p.execute("select 1")  # its transaction begins inside the window
        p.execute(AGE)
        again = enqueue(p, "window-call", unique_key=b"k", unique_window="1 second")
        p.commit()
    assert again[0] != first and again[5] is False  # a new job, not a duplicate of the first


@pytest.mark.parametrize("call", [
    "select awa.complete(null, 1)",
    "select awa.fail(1, null, 'x')",
    "select awa.heartbeat(null, null, '1 minute')",
])
def test_a_null_job_or_lease_is_refused_not_taken_for_a_stale_lease(db, logins, call):
    with db.connect(logins.worker) as w, pytest.raises(psycopg.errors.NullValueNotAllowed,
                                                       match="must not be null"):
        w.execute(call)
