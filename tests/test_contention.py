"""The lane-contention signal: awa.sample_lane_contention() and awa.lane_contention."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.support.jobs import enqueue, lane_waiters
from tests.support.waiting import wait_until


def test_a_waiting_producer_shows_in_the_sample(db):
    producer = db.login_role("awa_producer")
    maintenance = db.login_role("awa_maintenance")
    reader = db.login_role("awa_reader")
    with db.connect(producer) as p:
        for _ in range(20):
            enqueue(p, "contended", ordering_key=b"hot")
    holder = db.connect(producer, autocommit=False)
    enqueue(holder, "contended", ordering_key=b"hot")  # holds the lane until commit
    waiting = threading.Event()
    done = threading.Event()

    def blocked():
        with db.connect(producer) as c:
            waiting.set()
            enqueue(c, "contended", ordering_key=b"hot")  # waits for the holder
            done.set()

    t = threading.Thread(target=blocked)
    t.start()
    assert waiting.wait(30), "the second producer never connected"
    wait_until(lambda: lane_waiters(db, "contended") == 1,
               what="the second producer to queue on the lane lock")
    try:
        with db.connect(maintenance) as m:
            assert m.execute("select awa.sample_lane_contention()").fetchone()[0] >= 1
        with db.connect() as admin:
            row = admin.execute(
                "select s.lanes, s.lanes_held, s.lanes_waited, s.waiters, s.enqueued"
                " from awa.contention_samples s join awa.queue_meta m using (queue_id)"
                " where m.queue = 'contended'").fetchone()
        assert row[0] == 4 and row[1] == 1 and row[2] == 1 and row[3] == 1
        assert row[4] is None  # a sample taken alone reads no lane's sequence
    finally:
        holder.commit()
        holder.close()
        t.join(30)
    assert done.is_set(), "the second producer's enqueue never ended"
    # The tick's samples count the lanes: the sum of their sequences.
    with db.connect(maintenance) as m:
        m.execute("select awa.autoscale_tick()")
    with db.connect(producer) as p:
        for _ in range(30):
            enqueue(p, "contended")
    with db.connect(maintenance) as m:
        m.execute("select awa.autoscale_tick()")
    with db.connect() as admin:
        counters = [r[0] for r in admin.execute(
            "select s.enqueued from awa.contention_samples s join awa.queue_meta m"
            " using (queue_id) where m.queue = 'contended' order by s.sampled_at")]
        lane_sum = admin.execute(
            "select sum(pg_sequence_last_value(l.seq)) from awa.lanes l join awa.queue_meta m"
            " using (queue_id) where m.queue = 'contended'").fetchone()[0]
    assert counters[0] is None and counters[2] - counters[1] == 30
    assert counters[2] == lane_sum
    with db.connect(reader) as r:
        view = r.execute("select samples, wait_share, enqueue_rate from awa.lane_contention"
                         " where queue = 'contended'").fetchone()
    assert view[0] == 3 and float(view[1]) == pytest.approx(1 / 3) and view[2] > 0


def test_only_maintenance_samples(db):
    with db.connect(db.login_role("awa_producer")) as p, pytest.raises(
            psycopg.errors.InsufficientPrivilege):
        p.execute("select awa.sample_lane_contention()")
