"""What the Python client refuses before it sends anything: job fields it does
not know and naive run_at datetimes. The enqueue cases run against real
PostgreSQL 17 and 18, where the same input used to be sent, its typo or its
time zone silently lost."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

import awa_sql

NAIVE = datetime(2999, 1, 1)


def ready_count(db) -> int:
    with db.connect() as admin:
        return admin.execute("select count(*) from awa.ready").fetchone()[0]


@pytest.mark.parametrize("call", ["enqueue_many", "enqueue_many_copy"])
def test_a_job_field_it_does_not_know_is_refused(db, logins, call):
    jobs = [{"kind": "a"}, {"kind": "a", "priorty": 1, "ordering_kye": "x"}]
    with db.connect(logins.producer) as conn, pytest.raises(TypeError) as raised:
        getattr(awa_sql, call)(conn, jobs, queue="typos")
    message = str(raised.value)
    assert "job 2 (1-based)" in message
    assert "['ordering_kye', 'priorty']" in message
    assert "allowed: kind, args, queue, priority, ordering_key" in message
    assert ready_count(db) == 0


def test_enqueue_many_counts_jobs_from_one(db, logins):
    with db.connect(logins.producer) as conn:
        with pytest.raises(ValueError, match=re.escape("job 1 (1-based) has no kind")):
            awa_sql.enqueue_many(conn, [{"args": {}}], queue="q")
        with pytest.raises(ValueError, match=re.escape("job 2 (1-based) has no queue")):
            awa_sql.enqueue_many(conn, [{"kind": "a", "queue": "q"}, {"kind": "b"}])
        with pytest.raises(ValueError, match=re.escape("job 2 (1-based) has no kind")):
            awa_sql.enqueue_many_copy(conn, [{"kind": "a"}, {}], queue="q")
    assert ready_count(db) == 0


@pytest.mark.parametrize("call", [
    lambda conn: awa_sql.enqueue(conn, "a", queue="naive", run_at=NAIVE),
    lambda conn: awa_sql.enqueue_many(conn, [{"kind": "a", "run_at": NAIVE}], queue="naive"),
    lambda conn: awa_sql.enqueue_many(conn, [{"kind": "a"}], queue="naive", run_at=NAIVE),
    lambda conn: awa_sql.enqueue_many_copy(conn, [{"kind": "a", "run_at": NAIVE}],
                                           queue="naive"),
], ids=["enqueue", "enqueue_many", "enqueue_many default", "enqueue_many_copy"])
def test_a_naive_run_at_is_refused(db, logins, call):
    with db.connect(logins.producer) as conn:
        with pytest.raises(ValueError, match=re.escape(
                "run_at must be an aware datetime (with tzinfo), got "
                "datetime.datetime(2999, 1, 1, 0, 0)")):
            call(conn)
        awa_sql.enqueue(conn, "a", queue="naive", run_at=datetime(2999, 1, 1, tzinfo=UTC))
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.scheduled").fetchone()[0] == 1
