"""awa.queue_overview and awa.lane_overview give the rows they gave when they
called five functions per queue (tests/support/views_before.sql, the views
and functions of commit 9df3c08): now one call per queue finds where each
lane's live rows start, the views probe awa.ready themselves and read a
sequence only for what they are asked, and the counters and the policy in
force are read in place.

One state holds every kind of queue the views describe: ready jobs at every
priority, running, scheduled (for later and retries), completed, failed,
cancelled and retried; S = 4 lowered to 2 with ready jobs left above it; S
lowered with the lanes above it retired; partitions and stripes; a paused
queue with its own retention, retry policy and max run time; a drained
queue with its hints at the top and dead rows under them; a rolled-back
enqueue after a live job; an empty queue; a dropped one. Both views are
read in one repeatable read transaction (one snapshot, one now()), the old
as the superuser, the new as a reader login, and must be equal row for
row, on PostgreSQL 17 (pg_sequence_last_value) and 18
(pg_get_sequence_data). The scrape's depth and lag, now summed from the
lanes, are the old overview's ready and oldest_ready_age.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from awa_sql.metrics import render
from awa_sql.metrics.database import SCRAPE_SQL
from tests.support.jobs import claim, key_for_shard
from tests.support.reads import rows_read

BEFORE = Path(__file__).resolve().parent / "support" / "views_before.sql"
ORDER = {"queue_overview": "queue", "lane_overview": "queue, priority, shard"}


def _enqueue(su: psycopg.Connection, queue: str, n: int, **kw) -> None:
    for i in range(n):
        args = {"priority": 1 + i % 4, **kw}
        cols = "".join(f", {k} => %({k})s" for k in args)
        su.execute(f"select awa.enqueue(%(q)s, 'job'{cols})", {"q": queue, **args})


def _finish(su: psycopg.Connection, jobs, how: str) -> None:
    for job_id, lease, *_ in jobs:
        if how == "complete":
            assert su.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        else:
            assert su.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease]).fetchone()[0]


def _state(db) -> None:
    with db.connect() as su:
        # S = 1: every state of a job.
        _enqueue(su, "plain", 2, max_attempts=1)
        _finish(su, claim(su, ["plain"], 2), "fail")  # failed for good
        _enqueue(su, "plain", 16)
        taken = claim(su, ["plain"], 7)
        _finish(su, taken[:3], "complete")
        _finish(su, taken[3:5], "fail")  # retried: scheduled again
        ready = su.execute("select r.job_id from awa.ready r join awa.queue_meta m"
                           " using (queue_id) where m.queue = 'plain' order by r.job_id"
                           " limit 1").fetchone()[0]
        assert su.execute("select awa.cancel_job(%s)", [ready]).fetchone()[0]
        su.execute("select awa.enqueue('plain', 'later', run_at => now() + interval '1 day')")

        # S = 4 over keyed jobs, claimed in part, then S = 2: lanes above S
        # still hold ready jobs (draining).
        su.execute("select awa.set_enqueue_shards('wide', 4)")
        for i in range(40):
            su.execute("select awa.enqueue('wide', 'job', priority => %s::smallint,"
                       " ordering_key => %s)", [1 + i % 2, key_for_shard(i % 4, 4)])
        claim(su, ["wide"], 11)
        su.execute("select awa.set_enqueue_shards('wide', 2)")

        # S lowered on an empty queue, the lanes above it retired (walked false).
        su.execute("select awa.set_enqueue_shards('retired', 4)")
        su.execute("select awa.set_enqueue_shards('retired', 1)")
        su.execute("select awa.retire_lanes()")

        # Partitions and stripes.
        su.execute("select awa.set_queue_partitions('parts', 3)")
        for i in range(12):
            su.execute("select awa.enqueue('parts', 'job', ordering_key => %s)",
                       [f"tenant-{i}".encode()])
        su.execute("select awa.set_queue_stripes('striped', 2)")
        _enqueue(su, "striped", 10)
        claim(su, ["striped"], 3)

        # Its own policy, paused.
        _enqueue(su, "policy", 3)
        su.execute("select awa.set_retention('policy', '2 hours', '3 days')")
        su.execute("select awa.set_retry_policy('policy', '5 seconds', '10 minutes', 0.25)")
        su.execute("select awa.set_max_run_time('policy', '30 minutes')")
        su.execute("select awa.pause_queue('policy')")

        # Drained: every job claimed and completed, the hints at the top.
        _enqueue(su, "drained", 30)
        _finish(su, claim(su, ["drained"], 30), "complete")

        # A live job, then an enqueue rolled back: the span counts its lane_seq.
        _enqueue(su, "rolled", 1, priority=3)
        su.execute("begin")
        _enqueue(su, "rolled", 2, priority=3)
        su.execute("rollback")

        su.execute("select awa.set_enqueue_shards('empty', 1)")
        su.execute("select awa.set_enqueue_shards('gone', 1)")
        assert su.execute("select awa.drop_queue('gone')").fetchone()[0] is True


def _read_both(db, login: str, view: str) -> tuple[list, list]:
    with db.connect() as su, su.transaction():
        su.execute("set transaction isolation level repeatable read")
        before = su.execute(f"select * from before.{view} order by {ORDER[view]}").fetchall()
        su.execute(f"set local role {login}")
        after = su.execute(f"select * from awa.{view} order by {ORDER[view]}").fetchall()
    return before, after


@pytest.fixture
def state(db):
    with db.connect() as su:
        su.execute(BEFORE.read_text())
    _state(db)


@pytest.mark.parametrize("view", ORDER)
def test_the_views_read_in_place_give_the_rows_of_the_per_queue_functions(
        db, logins, state, view):
    before, after = _read_both(db, logins.reader, view)
    assert after == before
    assert len(after) >= {"queue_overview": 14, "lane_overview": 60}[view]
    with db.connect() as su:
        kinds = su.execute(
            "select bool_or(ready > 0 and running > 0 and scheduled > 0 and completed > 0"
            "               and failed > 0 and cancelled > 0 and retried > 0),"
            "       bool_or(paused), bool_or(partitions > 1), bool_or(stripes > 1),"
            "       bool_or(queue like '#dropped#%%')"
            "  from awa.queue_overview").fetchone()
        lanes = su.execute(
            "select bool_or(draining), bool_or(not walked), bool_or(claim_position > 1)"
            "  from awa.lane_overview").fetchone()
    assert kinds == (True, True, True, True, True)
    assert lanes == (True, True, True)


def test_the_scrapes_depth_and_lag_are_the_overviews_ready_and_age(db, logins, state):
    """The scrape sums a queue's depth from its lanes and takes its oldest
    lane's lag; the old overview's ready is the same number (lag moves with
    the clock between the two reads, so it is checked against the lanes')."""
    with db.connect() as su:
        ready = dict(su.execute("select queue, ready from before.queue_overview"))
    with db.connect(logins.reader) as r:
        text = render(r)[0].decode()
    samples = [(s.name, s.labels, s.value)
               for f in text_string_to_metric_families(text) for s in f.samples]
    depth = {lb["queue"]: v for n, lb, v in samples if n == "awa_queue_depth"}
    assert depth == {q: float(n) for q, n in ready.items()}
    assert {lb["queue"]: v for n, lb, v in samples
            if n == "awa_queue_jobs" and lb["state"] == "ready"} == depth
    lane_lag: dict[str, float] = {}
    for n, lb, v in samples:
        if n == "awa_lane_lag_seconds":
            lane_lag[lb["queue"]] = max(lane_lag.get(lb["queue"], 0.0), v)
    lag = {lb["queue"]: v for n, lb, v in samples if n == "awa_queue_lag_seconds"}
    assert lag == {q: lane_lag.get(q, 0.0) for q in lag}
    assert lag["plain"] > 0


def test_the_views_read_no_more_of_the_backlog_than_before(db):
    """The probe of each lane's first live row is planned in the views now,
    not in a function that turned sequential scans off: with 20,000 ready
    jobs over 8 lanes and the first 4,000 claimed (dead entries under the
    lanes' hints, where a claim moved none), each view and the scrape read
    no more index entries and rows of awa.ready than the views before, a
    few a lane once a first read has marked the dead entries it met."""
    with db.connect() as su:
        su.execute(BEFORE.read_text())
        su.execute("select awa.set_enqueue_shards('deep', 2)")
        su.execute("select count(*) from awa.enqueue_batch(array_fill('deep'::text,"
                   " array[20000]), array_fill('k'::text, array[20000]), priorities =>"
                   " array(select (1 + i % 4)::smallint from generate_series(1, 20000) as i),"
                   " ordering_keys => array(select convert_to('k' || i, 'UTF8')"
                   " from generate_series(1, 20000) as i))")
        claim(su, ["deep"], 4000)
        su.execute("analyze awa.ready")
        old_scrape = SCRAPE_SQL.replace("awa.queue_overview", "before.queue_overview").replace(
            "awa.lane_overview", "before.lane_overview")
        for new, old in ((f"select * from awa.{v}", f"select * from before.{v}") for v in ORDER):
            su.execute(old).fetchall()  # the first read marks the dead entries it meets
            su.execute(new).fetchall()
            read = rows_read(su, "awa.ready", new)
            assert read <= rows_read(su, "awa.ready", old), (new, read)
            assert read <= 4 * 8, (new, read)  # a few entries a lane, not 16,000 rows
        assert rows_read(su, "awa.ready", SCRAPE_SQL) <= rows_read(su, "awa.ready", old_scrape)
