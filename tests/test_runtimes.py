"""Runtime snapshots and the lane evidence of shard changes, on PostgreSQL 17 and 18."""

from __future__ import annotations

import json
import os
import re
import threading
import uuid

import psycopg
import pytest

import awa_sql
from awa_sql import runtimes
from awa_sql.runtimes import RuntimePublisher
from awa_sql.worker import Worker
from tests.support.admin import client_for, enqueue_jobs, reader_login, wait_for
from tests.support.jobs import Call, behind, in_turn_behind
from tests.support.waiting import wait_until

PUBLISH = ("select awa.publish_runtime(%s::uuid, %s, 'h', 42, '0.1.0', 0,"
           " %s::jsonb)")


def _runtime_rows(db, kind: str) -> list[tuple]:
    with db.connect() as conn:
        return conn.execute(
            "select q.queue, q.activity, q.shards, r.in_flight from awa.runtime_overview r"
            " join awa.runtime_queue_overview q using (instance_id) where r.kind = %s"
            " order by q.queue", [kind]).fetchall()


def _producers(db, queue: str) -> dict:
    with client_for(db.dsn(reader_login(db)), writable=False) as client:
        return client.get(f"/api/queues/{queue}").json()["runtimes"]


def test_producer_snapshots_say_which_s_it_enqueued_with(db):
    producer_login = db.login_role("awa_producer")
    enqueue_jobs(db, "rq", 1)
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=0.1) as producer:
        producer.enqueue("t", queue="rq")
        wait_for(lambda: _runtime_rows(db, "producer") == [("rq", "enqueue", 1, 0)],
                 what="the producer's first snapshot")
        assert _producers(db, "rq")["producers"] == {
            "live": 1, "on_current_s": None, "shards": 1, "since": None}

        with db.connect() as conn:
            conn.execute("select awa.set_enqueue_shards('rq', 4)")
        # Its last enqueue came before the change: 0 of 1.
        counts = _producers(db, "rq")["producers"]
        assert (counts["live"], counts["on_current_s"], counts["shards"]) == (1, 0, 4)

        producer.enqueue("t", queue="rq", ordering_key="a")
        wait_for(lambda: _runtime_rows(db, "producer") == [("rq", "enqueue", 4, 0)],
                 what="a snapshot after the change")
        assert _producers(db, "rq")["producers"]["on_current_s"] == 1
        instance = producer.runtime.instance_id
    with db.connect() as conn:  # closing the producer removes its snapshot
        assert conn.execute("select count(*) from awa.runtimes where instance_id = %s",
                            [instance]).fetchone()[0] == 0


def test_lane_evidence_counts_enqueues_since_the_change(db):
    enqueue_jobs(db, "ev", 10)
    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('ev', 4)")
    enqueue_jobs(db, "ev", 40)  # a producer that is not ours: plain SQL
    evidence = _producers(db, "ev")["lane_evidence"]
    assert (evidence["shards"], evidence["enqueues_since"], evidence["below_s"],
            evidence["at_or_above_s"]) == (4, 40, 40, 0)
    assert 0 < evidence["on_new_lanes"] < 40  # keys spread onto the lanes the raise added

    with db.connect() as conn:
        conn.execute("select awa.set_enqueue_shards('ev', 2)")
    enqueue_jobs(db, "ev", 30)
    evidence = _producers(db, "ev")["lane_evidence"]
    assert (evidence["shards"], evidence["enqueues_since"], evidence["below_s"],
            evidence["at_or_above_s"], evidence["on_new_lanes"]) == (2, 30, 30, 0, 0)


def test_worker_snapshot_has_claims_and_in_flight(db):
    worker_login = db.login_role("awa_worker")
    enqueue_jobs(db, "wq", 1)
    release = threading.Event()
    worker = Worker(db.dsn(worker_login), queues=["wq"],
                    handlers={"t": lambda _j: release.wait(30)},
                    poll_interval=0.05, snapshot_every=0.1)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_for(lambda: _runtime_rows(db, "worker") == [("wq", "claim", 1, 1),
                                                         ("wq", "poll", 1, 1)],
                 what="a worker snapshot with one job in flight")
    finally:
        release.set()
        worker.stop()
        runner.join(30)
    assert _runtime_rows(db, "worker") == []


def test_a_worker_on_an_idle_queue_is_listed_under_it(db, logins):
    """A worker whose claims find nothing (a nightly queue, a worker just
    started) was listed with no queue, and not under `--queue`: its polls
    name the queue. A logical name is recorded for each physical queue it
    covers, as awa.claim reads it; a name no queue has yet, as itself."""
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('idle', 1)")
        su.execute("select awa.set_queue_partitions('parted', 2)")
        physical = [r[0] for r in su.execute(
            "select queue from awa.queue_meta where 'parted' in (queue, root_queue,"
            " logical_queue) order by queue")]
    assert physical == ["parted", "parted__p1"]
    worker = Worker(db.dsn(logins.worker), queues=["idle", "parted", "later"],
                    handlers={"t": lambda _j: None}, poll_interval=0.05, snapshot_every=0.1)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        want = sorted([("idle", "poll", 1, 0), ("later", "poll", None, 0)]
                      + [(q, "poll", 1, 0) for q in physical])
        wait_for(lambda: _runtime_rows(db, "worker") == want,
                 what="a snapshot naming every queue polled, no job claimed")
        with db.connect(logins.reader) as r:
            for asked in ("idle", "parted", physical[1]):
                listed = runtimes.live(r, asked)
                assert [rt["pid"] for rt in listed] == [os.getpid()], asked
                assert {q["activity"] for q in listed[0]["queues"]} == {"poll"}, asked
    finally:
        worker.stop()
        runner.join(30)
        assert not runner.is_alive()


def test_a_snapshots_polls_are_bounded_whatever_the_names_cover(db, logins):
    """A poll is expanded to the physical queues its name covers: 1,000
    copies of one name write its queues once, not 1,000 times; a snapshot
    writes at most 1,000 rows, its enqueues and claims first; only a worker
    polls. A refused snapshot leaves the last one in place."""
    with db.connect() as su:
        su.execute("select awa.set_queue_partitions('wide', 3)")
        su.execute("select awa.set_queue_stripes('wide__p1', 2)")
        wide = [r[0] for r in su.execute(
            "select queue from awa.queue_meta"
            " where awa._names_cover(array['wide'], queue, logical_queue, root_queue)"
            " order by queue")]
    assert len(wide) == 5  # wide, wide__p1, its two stripes, wide__p2
    instance = uuid.uuid4()

    def entry(queue: str, activity: str, age: float = 1) -> dict:
        return {"queue": queue, "activity": activity, "age_seconds": age}

    with db.connect(logins.worker) as w:
        w.execute(PUBLISH, [instance, "worker", json.dumps(
            [entry("wide", "poll", age=n % 50) for n in range(1000)])])
    assert _activity(db, instance) == wide
    with db.connect() as su:
        ages = su.execute("select max(now() - last_at) < interval '1 second'"
                          " from awa.runtime_queues where instance_id = %s",
                          [instance]).fetchone()[0]
    assert ages  # the latest of its copies (age 0)
    with db.connect(logins.worker) as w:
        w.execute(PUBLISH, [instance, "worker", json.dumps(
            [entry(f"c{n:03d}", "claim") for n in range(998)] + [entry("wide", "poll")])])
    listed = _activity(db, instance)
    assert len(listed) == 1000
    assert [q for q in listed if q.startswith("c")] == [f"c{n:03d}" for n in range(998)]
    assert len(set(listed) & set(wide)) == 2  # the polls up to the cap
    with db.connect(logins.worker) as w:  # the latest polls first
        w.execute(PUBLISH, [instance, "worker", json.dumps(
            [entry(f"c{n:03d}", "claim") for n in range(996)]
            + [entry("wide", "poll", age=40), entry("fresh", "poll", age=0)])])
    assert "fresh" in _activity(db, instance) and len(_activity(db, instance)) == 1000
    with db.connect(logins.producer) as p:  # a producer cannot turn into a worker
        other = uuid.uuid4()
        p.execute(PUBLISH, [other, "producer", "[]"])
        with pytest.raises(psycopg.errors.InvalidParameterValue,
                           match=f"runtime {other} is a producer, not a worker"):
            p.execute(PUBLISH, [other, "worker", json.dumps([entry("wide", "poll")])])
    listed = _activity(db, instance)
    with db.connect(logins.producer) as p, pytest.raises(
            psycopg.errors.InvalidParameterValue, match="poll is a worker's activity"):
        p.execute(PUBLISH, [uuid.uuid4(), "producer", json.dumps([entry("wide", "poll")])])
    with db.connect(logins.worker) as w, pytest.raises(psycopg.errors.InvalidParameterValue):
        w.execute(PUBLISH, [instance, "worker", json.dumps([entry("wide", "sleep")])])
    assert _activity(db, instance) == listed


def test_a_worker_on_a_contract_before_polls_publishes_without_them(db, logins, caplog):
    """Workers of this package on a database not yet migrated to 0037, whose
    awa.publish_runtime refuses a poll (22023): each snapshot goes again
    without its polls, so the worker stays listed until awa migrate runs."""
    with db.connect() as su:
        made = su.execute("select pg_get_functiondef('awa.publish_runtime(uuid, text, text,"
                          " integer, text, integer, jsonb)'::regprocedure)").fetchone()[0]
        before = made.replace("in ('enqueue', 'claim', 'poll')", "in ('enqueue', 'claim')")
        assert before != made
        su.execute(before)  # the activities it took before 0037
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('old', 't')")
    worker = Worker(db.dsn(logins.worker), queues=["old"], handlers={"t": lambda _j: None},
                    poll_interval=0.05, snapshot_every=0.1)
    runner = threading.Thread(target=worker.run)
    with caplog.at_level("WARNING", logger="awa_sql.runtimes"):
        runner.start()
        try:
            wait_for(lambda: _runtime_rows(db, "worker") == [("old", "claim", 1, 0)],
                     what="a snapshot with the claim, without the polls")
        finally:
            worker.stop()
            runner.join(30)
    assert "runtime snapshot failed" not in caplog.text


class _Clock:
    """``time`` as awa_sql.runtimes reads it: monotonic() is what the test sets."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _activity(db, instance: uuid.UUID) -> list[str]:
    with db.connect() as conn:
        return [r[0] for r in conn.execute(
            "select queue from awa.runtime_queues where instance_id = %s order by queue",
            [instance])]


def test_a_queue_untouched_for_a_day_leaves_the_snapshot_and_the_runtime(db, monkeypatch):
    """A long-lived producer or worker that once used a queue it has not
    touched for a day: the queue's age passed what awa.publish_runtime takes
    (86,400 s), and every snapshot from then on was refused (22023), so the
    runtime vanished from the admin page for good. The queue is left out of
    the snapshot and forgotten: what a runtime remembers is bounded."""
    clock = _Clock()
    monkeypatch.setattr(runtimes, "time", clock)
    publisher = RuntimePublisher(db.dsn(db.login_role("awa_producer")), "producer", every=0.05)
    publisher.note("weekly", "enqueue")
    clock.now += 86_400.5
    publisher.note("busy", "enqueue")
    publisher.start()
    try:
        wait_for(lambda: publisher.published and _activity(db, publisher.instance_id),
                 what="a snapshot taken")
        assert _activity(db, publisher.instance_id) == ["busy"]
        assert list(publisher._last) == [("busy", "enqueue")]
    finally:
        publisher.stop()


def test_a_snapshot_carries_the_newest_thousand_queues(db, monkeypatch):
    """awa.publish_runtime takes at most 1000 activities: a runtime that had
    used more queues within the day had every snapshot refused (22023). It
    sends the 1000 it used last."""
    clock = _Clock()
    monkeypatch.setattr(runtimes, "time", clock)
    publisher = RuntimePublisher(db.dsn(db.login_role("awa_producer")), "producer", every=0.05)
    for n in range(1001):
        clock.now += 1
        publisher.note(f"q{n:04d}", "enqueue")
    publisher.start()
    try:
        wait_for(lambda: publisher.published and _activity(db, publisher.instance_id),
                 what="a snapshot taken")
        assert _activity(db, publisher.instance_id) == [f"q{n:04d}" for n in range(1, 1001)]
    finally:
        publisher.stop()


def test_publish_runtime_checks_its_input_and_the_owner(db):
    a = db.login_role("awa_producer")
    b = db.login_role("awa_producer")
    instance = uuid.uuid4()
    with db.connect(a) as conn:
        conn.execute(PUBLISH, [instance, "producer", '[{"queue": "x", "activity": "enqueue",'
                                                     ' "age_seconds": 1}]'])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="kind must be"):
            conn.execute(PUBLISH, [uuid.uuid4(), "robot", "[]"])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="activity must be"):
            conn.execute(PUBLISH, [uuid.uuid4(), "producer", '[{"queue": "x"}]'])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="activity must be"):
            conn.execute(PUBLISH, [uuid.uuid4(), "producer", '[{"queue": "x", "activity":'
                                                             ' "sleep", "age_seconds": 1}]'])
        # A key missing or of another type is refused as a whole element: a
        # missing one let it through to the insert (23502).
        for element in ('{"activity": "enqueue", "age_seconds": 1}',
                        '{"queue": "x", "activity": "claim"}',
                        '{"queue": "x", "activity": "claim", "age_seconds": "1"}',
                        '{"queue": 7, "activity": "claim", "age_seconds": 1}',
                        '"claim"'):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="activity must be"):
                conn.execute(PUBLISH, [uuid.uuid4(), "producer", f"[{element}]"])
        # A partition's stripe of a 200-byte name is 211 bytes: '__p32766#63'.
        conn.execute(PUBLISH, [uuid.uuid4(), "producer", '[{"queue": "' + "a" * 200
                               + '__p32766#63", "activity": "enqueue", "age_seconds": 1}]'])
        # In range, and no double precision: it failed with 22003 and all its digits.
        conn.execute(PUBLISH, [uuid.uuid4(), "producer", '[{"queue": "x", "activity":'
                                                         ' "claim", "age_seconds": 1e-400}]'])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select * from awa.runtimes")
    with db.connect(b) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege,
                                               match="belongs to login"):
        conn.execute(PUBLISH, [instance, "producer", "[]"])
    with db.connect(b) as conn:
        assert conn.execute("select awa.remove_runtime(%s)", [instance]).fetchone()[0] is False


def test_a_login_has_at_most_a_thousand_live_runtimes(db):
    """Every watch reads the live runtimes: a login that publishes under a
    new id at every call (9,572 runtimes in 20 s) filled what the admin page
    reads. The 1,001st live id of a login is refused (53400); its live ones
    refresh, another login is not counted with it, and once its runtimes
    are stale (30 s) it may make new ones."""
    flooder = db.login_role("awa_producer")
    other = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("insert into awa.runtimes (instance_id, kind, hostname, pid, version,"
                   " in_flight, owner_login) select gen_random_uuid(), 'producer', 'h', 1,"
                   " 'v', 0, %s from generate_series(1, 999)", [flooder])
    with db.connect(flooder) as conn:
        kept = uuid.uuid4()
        conn.execute(PUBLISH, [kept, "producer", "[]"])
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="1000 live runtimes"):
            conn.execute(PUBLISH, [uuid.uuid4(), "producer", "[]"])
        conn.execute(PUBLISH, [kept, "producer", "[]"])
    with db.connect(other) as conn:
        conn.execute(PUBLISH, [uuid.uuid4(), "producer", "[]"])
    with db.connect() as su:
        su.execute("update awa.runtimes set last_seen = now() - interval '1 minute'"
                   " where owner_login = %s", [flooder])
    with db.connect(flooder) as conn:
        conn.execute(PUBLISH, [uuid.uuid4(), "producer", "[]"])


def test_two_logins_making_one_instance_id_at_once_leave_it_to_the_first(db):
    """The owner check reads no row while the first login's insert is not
    committed; the second waits at its own insert, then must neither take
    the row over nor rewrite its queues."""
    a = db.login_role("awa_producer")
    b = db.login_role("awa_producer")
    instance = uuid.uuid4()
    with db.connect(a, autocommit=False) as first, db.connect(b, autocommit=False) as second:
        first.execute(PUBLISH, [instance, "producer", '[{"queue": "mine", "activity":'
                                                      ' "enqueue", "age_seconds": 1}]'])
        call = behind(db, first, second, lambda c: c.execute(
            PUBLISH, [instance, "producer", '[{"queue": "theirs", "activity": "enqueue",'
                                            ' "age_seconds": 1}]']))
    assert isinstance(call.error, psycopg.errors.InsufficientPrivilege), call.result
    assert "belongs to another login" in str(call.error)
    with db.connect() as su:
        assert su.execute("select r.owner_login, array_agg(q.queue) from awa.runtimes r"
                          " join awa.runtime_queues q using (instance_id)"
                          " where r.instance_id = %s group by 1", [instance]).fetchone() == (
            a, ["mine"])


def test_stale_snapshots_are_hidden_then_removed(db):
    login = db.login_role("awa_producer")
    old, fresh = uuid.uuid4(), uuid.uuid4()
    with db.connect(login) as conn:
        conn.execute(PUBLISH, [old, "producer", "[]"])
    with db.connect() as conn:
        conn.execute("update awa.runtimes set last_seen = now() - interval '31 seconds'"
                     " where instance_id = %s", [old])
    with db.connect(reader_login(db)) as conn:
        assert conn.execute("select count(*) from awa.runtime_overview").fetchone()[0] == 0
    with db.connect(login) as conn:
        assert conn.execute(PUBLISH, [fresh, "producer", "[]"]).fetchone()[0] == 1
    with db.connect() as conn:
        assert [r[0] for r in conn.execute("select instance_id from awa.runtimes")] == [fresh]


def test_two_stale_runtimes_publishing_at_once_do_not_deadlock(db):
    """Two runtimes whose rows are stale (a database back after 30 s away)
    publish at once: each holds its own row, then removes the stale rows,
    the other's included, which the other holds. Waiting for it deadlocked
    (40P01); a row another publish holds is being refreshed, not stale."""
    login = db.login_role("awa_producer")
    a, b = uuid.uuid4(), uuid.uuid4()
    activity = '[{"queue": "x", "activity": "enqueue", "age_seconds": 1}]'
    with db.connect(login) as conn:
        for instance in (a, b):
            conn.execute(PUBLISH, [instance, "producer", activity])
    with db.connect() as su:
        su.execute("update awa.runtimes set last_seen = now() - interval '1 minute'")
    # Each publish stops at its own awa.runtime_queues rows, its runtime row
    # already locked, until the holder commits; then both remove stale rows.
    with db.connect(autocommit=False) as holder, db.connect(login, autocommit=False) as one, \
            db.connect(login, autocommit=False) as two, db.connect() as watch:
        holder.execute("select from awa.runtime_queues for update")
        calls = [Call(one, lambda c: c.execute(PUBLISH, [a, "producer", activity])),
                 Call(two, lambda c: c.execute(PUBLISH, [b, "producer", activity]))]
        in_turn_behind(watch, holder, calls)
    assert [call.error for call in calls] == [None, None]
    with db.connect() as su:
        assert su.execute("select count(*) from awa.runtimes where last_seen > now()"
                          " - interval '30 seconds'").fetchone()[0] == 2


def test_a_publisher_of_a_host_that_never_answers_gives_up_connecting(monkeypatch, caplog):
    """libpq waits for ever to connect unless told otherwise: a publisher of
    a host that accepts and never answers sat in its first connect, and
    stop() gave up joining it after 10 s. It waits RECONNECT_TIMEOUT, as the
    worker's and producer's connections do, logs, and stops when asked."""
    import logging
    import socket
    import time

    from awa_sql import connect as connect_module
    from awa_sql.runtimes import RuntimePublisher

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.setattr(connect_module, "RECONNECT_TIMEOUT", 2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        publisher = RuntimePublisher(f"postgresql://p@127.0.0.1:{port}/app", "producer",
                                     every=3600)
        with caplog.at_level(logging.WARNING, logger="awa_sql.runtimes"):
            publisher.start()
            thread = publisher._thread
            wait_until(lambda: "runtime snapshot failed" in caplog.text, 30,
                       "the publisher to give up its connect")
            started = time.monotonic()
            publisher.stop()
            # One more connect (RECONNECT_TIMEOUT, 2 s here) to remove its row;
            # stop() itself gives up joining at 10 s.
            assert time.monotonic() - started < 8
            assert not thread.is_alive()


# -- awa runtimes ----------------------------------------------------------------------------


def _publish(db, login: str, kind: str, host: str, pid: int,
             activity: list[tuple[str, str]]) -> str:
    instance = str(uuid.uuid4())
    with db.connect(login) as conn:
        conn.execute("select awa.publish_runtime(%s::uuid, %s, %s, %s, '0.1.0', 2, %s::jsonb)",
                     [instance, kind, host, pid, json.dumps(
                         [{"queue": q, "activity": a, "age_seconds": 1} for q, a in activity])])
    return instance


@pytest.mark.one_version
def test_awa_runtimes_lists_the_live_runtimes_for_people_and_scripts(db, logins):
    """The runbook's "which workers are alive" without SQL: one line per
    live runtime and queue it works on, --queue for one queue's, --json with
    what GET /api/runtimes answers."""
    none = db.awa("runtimes", user=logins.reader, check=True)
    assert none.stdout.startswith("no live runtimes"), none.stdout
    enqueue_jobs(db, "ca", 1)
    enqueue_jobs(db, "cb", 1)
    p = _publish(db, logins.producer, "producer", "host-1", 11, [("ca", "enqueue")])
    w = _publish(db, logins.worker, "worker", "host-2", 22, [("cb", "claim"), ("ca", "claim")])
    _publish(db, logins.worker, "worker", "host-3", 33, [])

    shown = db.awa("runtimes", user=logins.reader, check=True)
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["kind", "host", "pid", "version", "in", "flight", "last",
                                "seen", "queue", "activity", "last", "S"], shown.stdout
    rows = [line.split() for line in lines[2:]]
    assert [[r[i] for i in (0, 1, 2, 3, 4, 6, 7, 9)] for r in rows] == [
        ["producer", "host-1", "11", "0.1.0", "2", "ca", "enqueue", "1"],
        ["worker", "host-2", "22", "0.1.0", "2", "ca", "claim", "1"],
        ["worker", "host-2", "22", "0.1.0", "2", "cb", "claim", "1"],
        ["worker", "host-3", "33", "0.1.0", "2", "-", "-", "-"],
    ], shown.stdout
    assert all(re.fullmatch(r"\d+\.\ds", r[5]) for r in rows), shown.stdout  # last seen
    assert all(re.fullmatch(r"\d+\.\ds", r[8]) for r in rows[:3]), shown.stdout
    assert rows[3][8] == "-"

    of_ca = json.loads(db.awa("runtimes", "--queue", "ca", "--json", user=logins.reader,
                              check=True).stdout)
    assert of_ca["queue"] == "ca"
    assert [(r["instance_id"], r["kind"], r["pid"], r["in_flight"],
             [(q["queue"], q["activity"], q["shards"]) for q in r["queues"]])
            for r in of_ca["runtimes"]] == [(p, "producer", 11, 2, [("ca", "enqueue", 1)]),
                                            (w, "worker", 22, 2, [("ca", "claim", 1)])]
    everything = json.loads(db.awa("runtimes", "--json", user=logins.reader,
                                   check=True).stdout)
    with client_for(db.dsn(reader_login(db)), writable=False) as client:
        api = client.get("/api/runtimes").json()
    assert [(r["instance_id"], [q["queue"] for q in r["queues"]])
            for r in everything["runtimes"]] == [
        (r["instance_id"], [q["queue"] for q in r["queues"]]) for r in api["runtimes"]]

    unknown = db.awa("runtimes", "--queue", "nosuch", user=logins.reader)
    assert (unknown.returncode, unknown.stderr) == (
        2, "awa: queue 'nosuch' does not exist [42704]\n")
    bad = db.awa("runtimes", "--queue", "a#b", user=logins.reader)
    assert bad.returncode == 2 and "must not contain '#'" in bad.stderr, bad.stderr
    refused = db.awa("runtimes", user=logins.worker)
    assert refused.returncode == 7, refused.stderr
    assert "needs a login that holds awa_reader or awa_operator" in refused.stderr
