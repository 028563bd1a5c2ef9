"""The Python producer and worker against real PostgreSQL 17 and 18."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta

import psycopg
import pytest

import awa_sql
from awa_sql import PartitionedQueue
from awa_sql.worker import Worker
from tests.support.waiting import wait_until


@pytest.fixture
def producer_login(db) -> str:
    return db.login_role("awa_producer")


@pytest.fixture
def worker_login(db) -> str:
    return db.login_role("awa_worker")


def test_enqueue_is_transactional(db, producer_login):
    with db.connect(producer_login, autocommit=False) as conn:
        kept = awa_sql.enqueue(conn, "send", {"to": "a"}, queue="mail", ordering_key="k")
        conn.commit()
        awa_sql.enqueue(conn, "send", {"to": "b"}, queue="mail")
        conn.rollback()
    assert kept.queue == "mail" and kept.lane_seq == 1
    with db.connect() as admin:
        assert admin.execute("select array_agg(args->>'to') from awa.ready").fetchone()[0] == [
            "a"]


def test_enqueue_many_uses_defaults_and_keeps_input_order(db, producer_login):
    with db.connect(producer_login, autocommit=False) as conn:
        rows = awa_sql.enqueue_many(
            conn, [{"kind": "a"}, {"kind": "b", "priority": 1}, {"kind": "c", "queue": "other"}],
            queue="many")
        conn.commit()
    assert [(r.queue, r.priority) for r in rows] == [("many", 2), ("many", 1), ("other", 2)]
    with pytest.raises(TypeError, match="unknown job fields"):
        awa_sql.enqueue_many(None, [{"kind": "x"}], color="red")


def test_enqueue_many_copy_with_per_job_opts(db, producer_login):
    jobs = [{"kind": "c", "args": {"i": i}} for i in range(30)]
    opts = [{"queue": f"copyq-{i % 3}", "ordering_key": f"k{i % 5}"} for i in range(30)]
    with db.connect(producer_login, autocommit=False) as conn:
        assert awa_sql.enqueue_many_copy(conn, jobs, opts=opts) == 30
        conn.commit()
    with db.connect() as admin:
        got = admin.execute(
            "select m.queue, r.ordering_key, (r.args->>'i')::int from awa.ready r"
            " join awa.queue_meta m using (queue_id)").fetchall()
    assert sorted((q, bytes(k), i) for q, k, i in got) == sorted(
        (f"copyq-{i % 3}", f"k{i % 5}".encode(), i) for i in range(30))
    with pytest.raises(ValueError, match="opts has 2 entries but jobs has 30"):
        awa_sql.enqueue_many_copy(None, jobs, opts=opts[:2])


def test_producer_commits_each_call(db, producer_login):
    with awa_sql.Producer(db.dsn(producer_login)) as producer:
        producer.enqueue("p", queue="own")
        producer.enqueue_many([{"kind": "q"}] * 3, queue="own")
        assert producer.enqueue_many_copy([{"kind": "r"}] * 2, queue="own") == 2
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 6


def backend_of(db, login: str) -> int:
    """The pid of the one connection ``login`` has open."""
    with db.connect() as admin:
        return admin.execute("select pid from pg_stat_activity where usename = %s",
                             [login]).fetchone()[0]


def terminate_backend(db, pid: int) -> None:
    with db.connect() as admin:  # waits until the backend has exited
        assert admin.execute("select pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]


def kinds_of(db, queue: str) -> list[str]:
    with db.connect() as admin:
        return [k for (k,) in admin.execute(
            "select r.kind from awa.ready r join awa.queue_meta m using (queue_id)"
            " where m.queue = %s order by r.job_id", [queue])]


def test_a_producer_whose_connection_was_lost_while_idle_connects_again(db, producer_login):
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=None) as producer:
        producer.enqueue("a", queue="idle-lost")
        terminate_backend(db, backend_of(db, producer_login))
        # Found lost at the call's BEGIN, before any of its statements was
        # sent: the call runs on a new connection.
        producer.enqueue("b", queue="idle-lost")
        producer.enqueue_many([{"kind": "c"}], queue="idle-lost")
        assert producer.enqueue_many_copy([{"kind": "d"}], queue="idle-lost") == 1
    assert kinds_of(db, "idle-lost") == ["a", "b", "c", "d"]


def test_a_producer_call_cut_off_by_a_lost_connection_raises_and_the_next_connects_again(
        db, producer_login):
    with awa_sql.Producer(db.dsn(producer_login), snapshot_every=None) as producer:
        producer.enqueue("a", queue="cut-off")
        pid = backend_of(db, producer_login)
        errors: list[BaseException] = []

        def cut_off():
            try:
                producer.enqueue("b", queue="cut-off")
            except BaseException as err:  # looked at below
                errors.append(err)

        with db.connect(autocommit=False) as admin:
            # The enqueue waits for this lock: the connection is lost while
            # its statement runs, when it cannot be known to the caller
            # whether the call committed.
            admin.execute("lock table awa.queue_meta in access exclusive mode")
            call = threading.Thread(target=cut_off)
            call.start()
            wait_until(lambda: admin.execute(
                "select wait_event_type = 'Lock' from pg_stat_activity where pid = %s",
                [pid]).fetchone()[0], 10, "the enqueue to wait for the lock")
            terminate_backend(db, pid)
            call.join(30)
            admin.rollback()
        assert len(errors) == 1 and isinstance(errors[0], psycopg.OperationalError), errors
        producer.enqueue("c", queue="cut-off")
    assert kinds_of(db, "cut-off") == ["a", "c"]


def test_async_enqueue(db, producer_login):
    async def go():
        async with await psycopg.AsyncConnection.connect(db.dsn(producer_login)) as conn:
            one = await awa_sql.enqueue_async(conn, "a", queue="async", ordering_key=b"x")
            many = await awa_sql.enqueue_many_async(conn, [{"kind": "b"}] * 2, queue="async")
            await conn.commit()
            return one, many

    one, many = asyncio.run(go())
    assert one.queue == "async" and [m.lane_seq for m in many] == [2, 3]


def test_worker_on_four_partitions_keeps_per_key_order(db, producer_login, worker_login):
    pq = PartitionedQueue("work", 4)
    keys = [f"account-{i}" for i in range(20)]
    with db.connect(producer_login, autocommit=False) as conn:
        for n in range(200):
            key = keys[n % len(keys)]
            awa_sql.enqueue(conn, "step", {"key": key, "n": n}, **pq.route_by_key(key))
        conn.commit()
    seen: list[tuple[str, str, int]] = []
    lock = threading.Lock()
    done = threading.Event()

    def step(job):
        with lock:
            seen.append((job.queue, job.args["key"], job.args["n"]))
            if len(seen) == 200:
                done.set()

    worker = Worker(db.dsn(worker_login), queues=pq.queue_configs(max_workers_per_partition=1),
                    handlers={"step": step}, poll_interval=0.05)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert done.wait(60), f"only {len(seen)} of 200 jobs ran"
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert {q for q, _, _ in seen} == set(pq.physical_queues)  # every partition
    for key in keys:
        ns = [n for _, k, n in seen if k == key]
        assert ns == sorted(ns)
        assert {q for q, k, _ in seen if k == key} == {pq.queue_for_key(key)}
    assert worker.completed == 200


def test_worker_fails_jobs_whose_handler_raises(db, producer_login, worker_login):
    with db.connect(producer_login) as conn:
        awa_sql.enqueue(conn, "boom", queue="failing", max_attempts=1)
        awa_sql.enqueue(conn, "unknown-kind", queue="failing", max_attempts=1)
    failed = threading.Event()

    def boom(job):
        raise RuntimeError("kaput")

    worker = Worker(db.dsn(worker_login), queues=["failing"], handlers={"boom": boom},
                    poll_interval=0.05)
    runner = threading.Thread(target=worker.run)
    runner.start()
    with db.connect() as admin:
        for _ in range(600):
            if admin.execute("select count(*) from awa.finished").fetchone()[0] == 2:
                failed.set()
                break
            admin.execute("select pg_sleep(0.05)")
    worker.stop()
    runner.join(30)
    assert failed.is_set()
    with db.connect() as admin:
        errors = dict(admin.execute("select kind, last_error from awa.finished").fetchall())
    assert "kaput" in errors["boom"] and "no handler" in errors["unknown-kind"]


def run_until(worker: Worker, condition, what: str) -> None:
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_until(condition, 15, what)
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()


def test_the_worker_logs_a_retry_asked_at_the_last_attempt_as_a_failure_for_good(
        db, producer_login, worker_login, caplog):
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(producer_login) as conn:
        last = awa_sql.enqueue(conn, "later", queue="lastlog", max_attempts=1)
        again = awa_sql.enqueue(conn, "later", queue="lastlog", max_attempts=2)

    def later(_job):
        raise awa_sql.Retry("busy", after=timedelta(seconds=3))

    worker = Worker(db.dsn(worker_login), queues=["lastlog"], handlers={"later": later},
                    poll_interval=0.05, snapshot_every=None)
    run_until(worker, lambda: worker.failed == 2, "both attempts to fail")
    assert (f"job {last.job_id} (later) asked for a retry, but attempt 1 of 1 was its last:"
            " it failed for good: busy") in caplog.text
    assert f"job {last.job_id} (later) asked for a retry after" not in caplog.text
    assert f"job {again.job_id} (later) asked for a retry after 0:00:03: busy" in caplog.text
    with db.connect() as admin:
        assert admin.execute("select job_id, state from awa.finished").fetchall() == [
            (last.job_id, "failed")]


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_the_worker_logs_a_job_cancelled_while_it_ran(db, logins, caplog, outcome):
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "held", queue="cancelled-log")
    started, release = threading.Event(), threading.Event()

    def held(_job):
        started.set()
        release.wait(60)
        if outcome == "raises":
            raise RuntimeError("too late")

    worker = Worker(db.dsn(logins.worker), queues=["cancelled-log"], handlers={"held": held},
                    poll_interval=0.05, snapshot_every=None)
    gone = (f"job {job.job_id} (held): no longer running under this lease (cancelled,"
            " rescued or finished elsewhere)")
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert started.wait(15)
        with db.connect(logins.operator) as op:
            assert op.execute("select awa.cancel_job(%s)", [job.job_id]).fetchone()[0]
        release.set()
        wait_until(lambda: gone in caplog.text, 15, "the worker to log the cancelled job")
    finally:
        release.set()
        worker.stop()
        runner.join(30)
    assert "lease expired" not in caplog.text
    assert (worker.completed, worker.failed) == (0, 0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_finishes_the_held_job_and_exits(db, producer_login, worker_login, tmp_path,
                                                       sig):
    """SIGINT (Ctrl-C) stops as SIGTERM does: it used to raise KeyboardInterrupt
    out of run() while the claimer and the slots went on claiming. The handler
    holds its job until the test has seen the worker stopping."""
    with db.connect(producer_login) as conn:
        awa_sql.enqueue(conn, "slow", queue="term")
    started, release = tmp_path / "started", tmp_path / "release"
    script = f"""
import logging, pathlib, sys, time
from datetime import timedelta
from awa_sql.worker import Worker
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
started, release = pathlib.Path({str(started)!r}), pathlib.Path({str(release)!r})
def slow(job):
    started.write_text("1")
    while not release.exists():  # written by the test once the signal was handled
        time.sleep(0.02)
w = Worker({db.dsn(worker_login)!r}, queues=["term"], handlers={{"slow": slow}},
           poll_interval=0.05, lease=timedelta(minutes=1))
w.run()
print("completed", w.completed)
"""
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=stdout, stderr=stderr,
                                text=True, env=dict(os.environ))
    try:
        wait_until(lambda: started.exists() or proc.poll() is not None, 30,
                   "the handler to start")
        assert proc.poll() is None, err.read_text()
        proc.send_signal(sig)
        wait_until(lambda: "shutdown: stopping" in err.read_text() or proc.poll() is not None,
                   15, "the worker to log its shutdown")
        # Logged while the handler still holds its job: it cannot end before
        # the release below.
        assert proc.poll() is None, err.read_text()
        assert ("shutdown: stopping; claiming has stopped, and the 1 job(s) held get"
                in err.read_text())
        release.write_text("1")
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err.read_text()
    assert "completed 1" in out.read_text()
    with db.connect() as admin:
        assert admin.execute("select state from awa.finished").fetchall() == [("completed",)]
