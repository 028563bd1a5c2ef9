"""The Python Worker's bounded shutdown, on real PostgreSQL 17 and 18: after
stop() a held job's handler gets ``shutdown_timeout`` to finish; a job whose
handler still runs then is handed back (awa.fail, retry due now: claimable by
another worker at the next promote pass, not after its lease), and run()
returns; the handler's late completion is refused and leaves the job's next
run alone, and an async handler is cancelled; ``stop(hand_back=True)``, or a
second SIGTERM or SIGINT, hands back at once, and the process exits though
the handler never returns."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

import awa_sql
from awa_sql import worker as worker_module
from awa_sql.worker import HAND_BACK_ERROR, Worker
from tests.support.waiting import wait_until

# The Python Worker's own shutdown and hand-back; the functions it calls are
# tested on every version (test_claim, test_run_outcome): ADR 051.
pytestmark = pytest.mark.one_version

FAST = {"poll_interval": 0.05, "snapshot_every": None}
# A lease far longer than any test: a job claimable again came back by the
# hand-back, not by its lease's end.
LONG_LEASE = {"lease": timedelta(minutes=10)}
CLAIM = "select job_id, run_lease, attempt from awa.claim(%s::text[], 1, 'other-worker')"


def job_state(db, job_id: int):
    """(state, attempt, worker, the first line of last_error) of the job."""
    with db.connect() as conn:
        return conn.execute(
            "select state, attempt, worker, split_part(last_error, E'\\n', 1)"
            " from awa.job(%s)", [job_id]).fetchone()


def claim_elsewhere(db, logins, queue: str):
    """The job another worker claims once the next promote pass has run."""
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
    with db.connect(logins.worker) as w:
        return w.execute(CLAIM, [[queue]]).fetchall()


def test_a_handler_still_running_at_the_timeout_has_its_job_handed_back(db, logins, caplog):
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "stuck", queue="shut")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    returned = threading.Event()

    def stuck(_job):
        started.set()
        release.wait(60)
        finished.set()

    worker = Worker(db.dsn(logins.worker), queues=["shut"], handlers={"stuck": stuck},
                    shutdown_timeout=0.5, **FAST, **LONG_LEASE)

    def run() -> None:
        worker.run()
        returned.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert started.wait(15)
        stopped = time.monotonic()
        worker.stop()
        assert returned.wait(10), "run() did not return at the shutdown timeout"
        took = time.monotonic() - stopped
        assert not finished.is_set()
        assert 0.5 <= took < 5, took
        # Handed back: a retry due now, the attempt counted, no longer held.
        assert job_state(db, job.job_id) == ("scheduled", 1, None, HAND_BACK_ERROR)
        assert (f"shutdown: handed back 1 job whose handler was still running after 0.5 s:"
                f" {job.job_id} (stuck)") in caplog.text
        # Claimable by another worker at once (the lease had ten minutes left).
        ((job_id, new_lease, attempt),) = claim_elsewhere(db, logins, "shut")
        assert (job_id, attempt) == (job.job_id, 2)
        # The first handler ends now; its complete, under the old lease, is refused.
        release.set()
        wait_until(lambda: f"job {job.job_id} (stuck): handed back at shutdown" in caplog.text,
                   10, "the late completion to be refused")
        assert job_state(db, job.job_id)[:3] == ("running", 2, "other-worker")
        with db.connect(logins.worker) as w:
            assert w.execute("select awa.complete(%s, %s)", [job.job_id, new_lease]
                             ).fetchone()[0]
    finally:
        release.set()
        worker.stop()
    assert job_state(db, job.job_id)[:2] == ("completed", 2)
    assert (worker.completed, worker.failed) == (0, 0)


def test_a_handler_that_finishes_in_the_grace_period_completes(db, logins, caplog):
    """Two slots: one handler finishes after stop() and its job completes;
    stop(hand_back=True) then hands back the other at once, with no timeout
    set (None: wait for every handler). That job was on its last attempt:
    it fails for good, and the log says so."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        quick = awa_sql.enqueue(conn, "quick", queue="grace")
        last = awa_sql.enqueue(conn, "stuck", queue="grace", max_attempts=1)
    started = {"quick": threading.Event(), "stuck": threading.Event()}
    release = {"quick": threading.Event(), "stuck": threading.Event()}
    returned = threading.Event()

    def handler(job):
        started[job.kind].set()
        release[job.kind].wait(60)

    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "grace", "max_workers": 2}],
                    handlers={"quick": handler, "stuck": handler}, shutdown_timeout=None,
                    **FAST, **LONG_LEASE)

    def run() -> None:
        worker.run()
        returned.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert started["quick"].wait(15) and started["stuck"].wait(15)
        worker.stop()
        release["quick"].set()
        # Counted after its commit: the worker's count, not the row, says the
        # slot is done with it.
        wait_until(lambda: worker.completed == 1, 10,
                   "the job whose handler finished after stop() to complete")
        assert not returned.is_set()
        worker.stop(hand_back=True)
        assert returned.wait(10), "run() did not return at stop(hand_back=True)"
    finally:
        release["quick"].set()
        release["stuck"].set()
    assert job_state(db, quick.job_id)[:2] == ("completed", 1)
    assert job_state(db, last.job_id) == ("failed", 1, None, HAND_BACK_ERROR)
    assert ("shutdown: handed back 1 job whose handler was still running at"
            " stop(hand_back=True) after") in caplog.text
    assert f"{last.job_id} (stuck; its last attempt: failed for good)" in caplog.text
    assert worker.completed == 1


def test_a_second_signal_hands_back_at_once_and_the_process_exits(db, logins, tmp_path):
    """SIGTERM starts the shutdown (an hour of grace); SIGINT, the second
    signal, hands the job back at once. The handler never returns: the
    process exits all the same."""
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "forever", queue="twice")
    script = f"""
import logging, sys, threading
from awa_sql.worker import Worker

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
def forever(job):
    print("started", flush=True)
    threading.Event().wait()
w = Worker({db.dsn(logins.worker)!r}, queues=["twice"], handlers={{"forever": forever}},
           poll_interval=0.05, snapshot_every=None, shutdown_timeout=3600)
w.run()
print("returned", flush=True)
"""
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=stdout, stderr=stderr,
                                text=True, env=dict(os.environ))
    try:
        wait_until(lambda: "started" in out.read_text() or proc.poll() is not None, 30,
                   "the handler to start")
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "shutdown: stopping" in err.read_text(), 15,
                   "the worker to log its shutdown")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err.read_text()
    assert out.read_text() == "started\nreturned\n"
    assert ("handed back 1 job whose handler was still running at SIGINT during the shutdown"
            " after") in err.read_text()
    assert took < 10, took
    assert job_state(db, job.job_id) == ("scheduled", 1, None, HAND_BACK_ERROR)


def test_an_async_handler_is_cancelled_when_its_job_is_handed_back(db, logins, caplog):
    """Its CancelledError fails the attempt under the dead lease: refused,
    and the job keeps the hand-back's error."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "waits", queue="ashut")
    started, cancelled = threading.Event(), threading.Event()

    async def waits(_job):
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    worker = Worker(db.dsn(logins.worker), queues=["ashut"], handlers={"waits": waits},
                    shutdown_timeout=0.2, **FAST, **LONG_LEASE)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    assert started.wait(15)
    worker.stop()
    runner.join(10)
    assert not runner.is_alive(), "run() did not return at the shutdown timeout"
    assert cancelled.wait(10), "the async handler was not cancelled"
    wait_until(lambda: f"job {job.job_id} (waits): handed back at shutdown" in caplog.text, 10,
               "the cancelled handler's failure to be refused")
    assert job_state(db, job.job_id) == ("scheduled", 1, None, HAND_BACK_ERROR)
    assert (worker.completed, worker.failed) == (0, 0)


def test_a_job_handed_back_while_it_waited_for_its_slot_is_not_run(db, logins):
    """A job claimed for a slot and handed back before the slot took it: its
    next run belongs to whoever claims it again, so its handler never starts
    here, and the slot is free again."""
    import queue as queue_mod

    from awa_sql.worker import Job

    ran = []
    worker = Worker(db.dsn(logins.worker), queues=["waited"],
                    handlers={"job": lambda job: ran.append(job.job_id)},
                    snapshot_every=None)
    job = Job(job_id=1, run_lease=7, queue="waited", priority=2, enqueue_shard=0, lane_seq=1,
              kind="job", args={}, attempt=1, max_attempts=25, ordering_key=None)
    worker._handed_back.add((job.job_id, job.run_lease))
    worker._slots_left = 1
    free, jobs = threading.Semaphore(0), queue_mod.SimpleQueue()
    jobs.put(job)
    jobs.put(None)
    worker._slot(free, jobs)
    assert ran == []
    assert free.acquire(blocking=False)


@pytest.mark.parametrize("bound", ["lock_timeout", "statement_timeout"])
def test_a_job_whose_run_another_transaction_holds_does_not_stop_the_hand_back(
        db, logins, caplog, monkeypatch, bound):
    """An operator's cancel of a held job left open (BEGIN; cancel; no
    commit) holds its run: that job's hand-back waits at most
    RUN_LOCK_TIMEOUT (shortened here), or the login's shorter
    statement_timeout, and fails alone, logged; the job after it is handed
    back all the same and run() returns while the operator's transaction is
    still open. Before, the hand-back waited for that transaction without
    limit (past shutdown_timeout, until a SIGKILL), and its statement
    timeout (QueryCanceled, a psycopg OperationalError) was taken for a
    lost connection: the jobs after it were left running until their
    leases expired."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    if bound == "lock_timeout":
        monkeypatch.setattr(worker_module, "RUN_LOCK_TIMEOUT", "300ms")
        why = "it waited 300ms for its run, which another transaction holds"
    else:
        with db.connect() as admin:
            admin.execute(f"alter role \"{logins.worker}\" set statement_timeout = '300ms'")
        why = "canceling statement due to statement timeout"
    started, release, returned = [threading.Event(), threading.Event()], threading.Event(), \
        threading.Event()

    def slow(job):
        started[job.args["n"]].set()
        release.wait(60)

    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "heldback", "max_workers": 2}],
                    handlers={"slow": slow}, shutdown_timeout=0.2, **FAST, **LONG_LEASE)

    def run() -> None:
        worker.run()
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    try:
        # Claimed one after the other: the first is handed back first.
        jobs = []
        for n in (0, 1):
            with db.connect(logins.producer) as conn:
                jobs.append(awa_sql.enqueue(conn, "slow", {"n": n}, queue="heldback"))
            assert started[n].wait(15)
        first, second = jobs
        with db.connect(logins.operator, autocommit=False) as op:
            assert op.execute("select awa.cancel_job(%s)", [first.job_id]).fetchone()[0]
            worker.stop()
            assert returned.wait(10), "run() did not return while a held job's run was locked"
            assert job_state(db, second.job_id) == ("scheduled", 1, None, HAND_BACK_ERROR)
            op.rollback()
        # Not handed back: still this worker's, under its lease.
        assert job_state(db, first.job_id)[:3] == ("running", 1, worker.name)
        assert (f"shutdown: could not hand back {first.job_id} (slow): {why}") in caplog.text
        assert (f"shutdown: handed back 1 job whose handler was still running after 0.2 s:"
                f" {second.job_id} (slow)") in caplog.text
        release.set()
        # Its handler, run on in its daemon thread, completes it under that
        # lease; the handed-back job's late completion is refused.
        wait_until(lambda: job_state(db, first.job_id)[0] == "completed", 10,
                   "the job not handed back to complete when its handler ends")
        wait_until(lambda: f"job {second.job_id} (slow): handed back at shutdown" in caplog.text,
                   10, "the handed-back job's late completion to be refused")
        assert job_state(db, second.job_id)[:2] == ("scheduled", 1)
    finally:
        release.set()
