"""The Python Worker through a stop and lost connections, on real PostgreSQL 17
and 18: held jobs are heartbeated until their slots finish them, after stop()
too; the heartbeat, the claimer and the slots each open their connection again
when it was lost; a slot survives an outcome it could not record, whose job
then is no longer heartbeated and comes back through awa.rescue_expired; and a
handler's error with a NUL byte is recorded, escaped."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

import awa_sql
from awa_sql.maintain import Maintainer
from awa_sql.worker import Worker
from tests.support.crash import Hold
from tests.support.jobs import Call, waits_for_a_lock
from tests.support.waiting import wait_until

# The Python Worker's own handling of lost connections, outages and servers
# that take no writes; the functions it calls are tested on every version
# (test_claim, test_run_outcome, test_backoff): ADR 051.
pytestmark = pytest.mark.one_version

FAST = {"poll_interval": 0.05, "snapshot_every": None}
SHORT_LEASE = {"lease": timedelta(seconds=2), "heartbeat_every": timedelta(seconds=0.2)}


@contextmanager
def running(worker: Worker, *releases: threading.Event) -> Iterator[threading.Thread]:
    """``worker.run()`` in a thread; on the way out the handlers are released,
    the worker stopped and the thread joined."""
    runner = threading.Thread(target=worker.run, name="test-worker-run")
    runner.start()
    try:
        yield runner
    finally:
        for release in releases:
            release.set()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive(), "run() did not return after stop()"


@contextmanager
def _thread(target, stop) -> Iterator[None]:
    thread = threading.Thread(target=target)
    thread.start()
    try:
        yield
    finally:
        stop()
        thread.join(30)


def blocking(started: threading.Event, release: threading.Event):
    def handler(_job):
        started.set()
        release.wait(60)
    return handler


def counted_blocking():
    """(started, release, runs, handler): the handler appends to runs, sets
    started and blocks until release."""
    started, release = threading.Event(), threading.Event()
    runs = []

    def handler(_job):
        runs.append(1)
        started.set()
        release.wait(60)

    return started, release, runs, handler


def two_in_turn():
    """(started, release, handler): the handler's first call sets
    started[0], its second started[1]; each blocks until release."""
    started, release = [threading.Event(), threading.Event()], threading.Event()
    runs = []

    def handler(_job):
        started[len(runs)].set()
        runs.append(1)
        release.wait(60)

    return started, release, handler


def job_row(db, job_id: int):
    """(state, attempt, lease_expires_at) of the job, or None."""
    with db.connect() as conn:
        return conn.execute("select state, attempt, lease_expires_at from awa.job(%s)",
                            [job_id]).fetchone()


def lease(db, job_id: int):
    row = job_row(db, job_id)
    return None if row is None else row[2]


def state(db, job_id: int) -> str | None:
    row = job_row(db, job_id)
    return None if row is None else row[0]


def terminate(db, login: str, role: str) -> None:
    """Ends the worker's connection named ``awa-sql worker <role>`` once it exists."""
    def pid():
        with db.connect() as conn:
            row = conn.execute(
                "select pid from pg_stat_activity where usename = %s and application_name = %s",
                [login, f"awa-sql worker {role}"]).fetchone()
        return row and row[0]

    found = wait_until(pid, 10, f"the worker's {role} connection")
    with db.connect() as conn:
        assert conn.execute("select pg_terminate_backend(%s)", [found]).fetchone()[0]


def test_held_jobs_are_heartbeated_until_their_slots_finish_after_stop(
        db, logins):
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "slow", queue="hb-stop")
    started, release = threading.Event(), threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["hb-stop"],
                    handlers={"slow": blocking(started, release)}, **FAST, **SHORT_LEASE)
    with running(worker, release) as runner:
        assert started.wait(30)
        worker.stop()
        at_stop = lease(db, job.job_id)
        wait_until(lambda: lease(db, job.job_id) > at_stop + timedelta(seconds=1), 6,
                   "the lease of the held job to be extended after stop()")
        assert runner.is_alive()
        release.set()
        runner.join(30)
    assert job_row(db, job.job_id)[:2] == ("completed", 1)


def test_the_heartbeat_survives_a_lost_connection(db, logins):
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "slow", queue="hb-lost")
    started, release = threading.Event(), threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["hb-lost"],
                    handlers={"slow": blocking(started, release)}, **FAST, **SHORT_LEASE)
    with running(worker, release):
        assert started.wait(30)
        terminate(db, logins.worker, "heartbeat")
        at_kill = lease(db, job.job_id)
        wait_until(lambda: lease(db, job.job_id) > at_kill + timedelta(seconds=1), 8,
                   "the lease to be extended after the heartbeat connection was lost")
        release.set()
        wait_until(lambda: state(db, job.job_id) == "completed", 10, "the job to complete")
    assert job_row(db, job.job_id)[:2] == ("completed", 1)


def test_the_claimer_survives_a_lost_connection(db, logins):
    ran = threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["claimlost"],
                    handlers={"ok": lambda _job: ran.set()}, **FAST)
    with running(worker) as runner:
        terminate(db, logins.worker, "claimer")
        with db.connect(logins.producer) as conn:
            job = awa_sql.enqueue(conn, "ok", queue="claimlost")
        assert ran.wait(15), (
            f"the job enqueued after the loss never ran; run() alive: {runner.is_alive()}")
        wait_until(lambda: state(db, job.job_id) == "completed", 10, "the job to complete")


def test_a_slot_whose_connection_was_lost_records_its_job_and_takes_the_next(
        db, logins):
    started, release, ran = threading.Event(), threading.Event(), threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["slotconn"],
                    handlers={"warm": lambda _job: None, "held": blocking(started, release),
                              "next": lambda _job: ran.set()}, **FAST)
    with db.connect(logins.producer) as conn:
        warm = awa_sql.enqueue(conn, "warm", queue="slotconn")
    with running(worker, release):
        # The slot opens its connection at its first complete.
        wait_until(lambda: state(db, warm.job_id) == "completed", 15, "the first job")
        with db.connect(logins.producer) as conn:
            held = awa_sql.enqueue(conn, "held", queue="slotconn")
        assert started.wait(15)
        terminate(db, logins.worker, "slot")
        release.set()
        # Completed on a new connection, at its first attempt: not left to a rescue.
        wait_until(lambda: state(db, held.job_id) == "completed", 10,
                   "the held job to be completed after its slot's connection was lost")
        with db.connect(logins.producer) as conn:
            after = awa_sql.enqueue(conn, "next", queue="slotconn")
        if not ran.wait(15):
            raise AssertionError(f"the next job never ran; it is {job_row(db, after.job_id)}")
    assert job_row(db, held.job_id)[:2] == ("completed", 1)


def test_a_handler_error_with_a_nul_is_recorded_and_the_queue_goes_on(
        db, logins):
    with db.connect(logins.producer) as conn:
        bad = awa_sql.enqueue(conn, "nul", queue="slotdeath", max_attempts=1)
        second = awa_sql.enqueue(conn, "ok", queue="slotdeath")
    ran = threading.Event()

    def nul(_job):
        raise ValueError("bad byte \x00 in input")

    worker = Worker(db.dsn(logins.worker), queues=["slotdeath"],
                    handlers={"nul": nul, "ok": lambda _job: ran.set()}, **FAST)
    with running(worker):
        if not ran.wait(15):
            raise AssertionError(f"the second job never ran; it is {job_row(db, second.job_id)}")
        wait_until(lambda: state(db, bad.job_id) == "failed", 10, "the first job to fail")
    with db.connect() as conn:
        error = conn.execute("select last_error from awa.finished where job_id = %s",
                             [bad.job_id]).fetchone()[0]
    assert error == "ValueError: bad byte \\x00 in input"


def test_a_job_whose_complete_was_not_recorded_is_no_longer_heartbeated(
        db, logins):
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "twice", queue="unrecorded")
    started, release, again = threading.Event(), threading.Event(), threading.Event()
    runs = []

    def twice(_job):
        runs.append(1)
        if len(runs) == 1:
            started.set()
            release.wait(60)
        else:
            again.set()

    worker = Worker(db.dsn(logins.worker), queues=["unrecorded"], handlers={"twice": twice},
                    **FAST, **SHORT_LEASE)
    complete = "function awa.complete(bigint, bigint)"
    with running(worker, release), db.connect() as admin:
        assert started.wait(30)
        # The slot's awa.complete fails (its connection stays up, and the
        # heartbeat's works on).
        admin.execute(f"revoke execute on {complete} from awa_worker")
        release.set()
        # The lease ends within 2 s once the heartbeat leaves the job alone.
        wait_until(lambda: admin.execute("select awa.rescue_expired()").fetchone()[0], 10,
                   "the job's lease to expire and awa.rescue_expired to take it")
        assert job_row(db, job.job_id)[:2] == ("scheduled", 1)
        admin.execute(f"grant execute on {complete} to awa_worker")
        # Its retry is due after the backoff (1 to 2 s): the same slot runs it.
        wait_until(lambda: admin.execute("select awa.promote_due()").fetchone()[0]
                   or again.is_set(), 10, "the retry to be due")
        if not again.wait(15):
            raise AssertionError(f"the retry never ran; it is {job_row(db, job.job_id)}")
        wait_until(lambda: state(db, job.job_id) == "completed", 10, "the retry to complete")
    assert job_row(db, job.job_id)[:2] == ("completed", 2)
    assert len(runs) == 2


def test_a_completion_lost_before_its_commit_while_the_job_was_cancelled_is_not_counted(
        db, logins, caplog):
    """The slot's awa.complete has deleted the running row but not committed
    (held by a trigger) when an operator cancels the job (waiting for that
    row) and the slot's connection is lost: the complete rolls back, the
    cancel commits, and the worker's second send answers false. The first
    send might have committed, as far as the worker knows: awa.run_outcome
    says the run was not completed ('gone'), and the worker says the
    completion was not recorded and does not count it."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    started, release = threading.Event(), threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["indoubt"],
                    handlers={"held": blocking(started, release)}, **FAST)
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "held", queue="indoubt")
    with running(worker, release), db.connect() as admin:
        assert started.wait(15)
        # awa.complete deletes from the run's slot by name (awa.cancel_job
        # through awa.running, which this statement trigger does not see).
        assert admin.execute("select slot from awa.running where job_id = %s",
                             [job.job_id]).fetchone()[0] == 0
        hold = Hold(admin, "awa.running_0", "delete")
        # The worker's second send, on a new connection, stops at this gate
        # until the cancel has committed: it could otherwise take the row as
        # the slot's transaction ends, before the cancel's wait is woken.
        gate = Hold(admin, "awa.running_0", "delete", before=True, shut=False)
        try:
            release.set()

            def slot_pid(stopped_at: Hold) -> int | None:
                row = admin.execute(
                    "select pid from pg_stat_activity where usename = %s"
                    " and application_name = 'awa-sql worker slot'", [logins.worker]).fetchone()
                return row[0] if row and stopped_at.waiting(row[0]) else None

            pid = wait_until(lambda: slot_pid(hold), 15,
                             "the slot's complete to wait in the trigger")
            gate.shut()
            cancel = Call(db.connect(logins.operator, autocommit=False),
                          lambda c: c.execute("select awa.cancel_job(%s)",
                                              [job.job_id]).fetchone()[0])
            cancel.start()
            wait_until(lambda: waits_for_a_lock(admin, cancel.pid), 15,
                       "the cancel to wait for the running row")
            assert admin.execute("select pg_terminate_backend(%s)", [pid]).fetchone()[0]
            cancel.join(30)
            assert cancel.error is None and cancel.result is True
            wait_until(lambda: slot_pid(gate), 15, "the worker's second send")
        finally:
            gate.close()
            hold.close()  # the second send goes through the trigger too
        wait_until(lambda: any("was lost" in r.getMessage() for r in caplog.records), 15,
                   "the worker to hear back")
    said = [r.getMessage() for r in caplog.records if f"job {job.job_id} " in r.getMessage()]
    assert said[-1] == (f"job {job.job_id} (held): its completion was sent as the connection"
                        " was lost and was not recorded (awa.run_outcome: gone): the run was"
                        " cancelled or rescued meanwhile; not counted"), said
    assert job_row(db, job.job_id)[:2] == ("cancelled", 1)
    assert worker.completed == 0


def test_a_reconnect_gives_up_after_ten_seconds_unless_told_otherwise(monkeypatch):
    """The worker and awa maintain connect again by themselves: without a
    connect_timeout, a host that drops packets would hang a reconnect."""
    from awa_sql.connect import network_defaults

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert network_defaults("host=db dbname=app")["connect_timeout"] == 10
    assert network_defaults("host=db dbname=app", 5)["connect_timeout"] == 5
    assert "connect_timeout" not in network_defaults("postgresql://db/app?connect_timeout=3")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    assert "connect_timeout" not in network_defaults("host=db dbname=app")


def test_keepalives_the_dsn_sets_are_left_to_it(monkeypatch):
    from awa_sql.connect import KEEPALIVES, network_defaults

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert network_defaults("host=db") == {**KEEPALIVES, "connect_timeout": 10}
    mine = network_defaults("host=db keepalives_idle=5 tcp_user_timeout=0")
    assert "keepalives_idle" not in mine and "tcp_user_timeout" not in mine
    assert mine["keepalives_count"] == KEEPALIVES["keepalives_count"]


def _keepalive_timers() -> dict[int, float]:
    """Local TCP port -> seconds left on its socket's keepalive timer, for the
    IPv4 and IPv6 sockets of this machine whose keepalive timer is armed."""
    timers = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            timer, when = fields[5].split(":")
            if timer == "02":  # the keepalive timer, in clock ticks
                port = int(fields[1].rsplit(":", 1)[1], 16)
                timers[port] = int(when, 16) / os.sysconf("SC_CLK_TCK")
    return timers


def test_long_lived_connections_probe_a_silent_server_within_a_minute(db, logins):
    """A connection to a host that vanished without a word (a failover that
    moved the address, a NAT that forgot the flow) fails only when TCP says
    so: with the kernel's default, a keepalive probe after two hours idle.
    The worker's, the producer's, the runtime publisher's and awa maintain's
    connections probe after 30 s: each one's socket, found by the port its
    backend reports, has its keepalive timer at 30 s or less, not the
    kernel's 7,200."""
    worker = Worker(db.dsn(logins.worker), queues=["q"], handlers={}, poll_interval=1.0,
                    snapshot_every=60.0)
    maintainer = Maintainer(db.dsn(logins.maintenance), every={"promote": 60})
    names = ("awa-sql worker claimer", "awa-runtime",
             "awa-sql maintain", "awa-sql")
    with running(worker), awa_sql.Producer(db.dsn(logins.producer), snapshot_every=None), \
            _thread(maintainer.run, maintainer.stop):
        def ports() -> dict[str, int] | None:
            with db.connect() as conn:
                rows = conn.execute(
                    "select application_name, client_port from pg_stat_activity"
                    " where datname = current_database() and application_name = any(%s)",
                    [list(names)]).fetchall()
            found = dict(rows)
            return found if set(found) == set(names) else None

        found = wait_until(ports, 20, "every long-lived connection")

        def probed() -> dict[str, float] | None:
            timers = _keepalive_timers()
            left = {name: timers.get(port) for name, port in found.items()}
            # A socket sending at that moment has its retransmit timer armed instead.
            return left if None not in left.values() else None

        left = wait_until(probed, 10, "every connection's keepalive timer")
    assert all(seconds <= 30 for seconds in left.values()), left


def test_a_handler_raising_a_base_exception_fails_its_job_and_the_slot_goes_on(
        db, logins):
    """SystemExit, KeyboardInterrupt and a CancelledError of an async handler
    fail the attempt like any exception; the queue's one slot takes the next job."""
    with db.connect(logins.producer) as conn:
        bad = [awa_sql.enqueue(conn, kind, queue="baseexc", max_attempts=1)
               for kind in ("exit", "interrupt", "cancelled")]
        last = awa_sql.enqueue(conn, "ok", queue="baseexc")
    ran = threading.Event()

    def leave(_job):
        raise SystemExit(3)

    def interrupt(_job):
        raise KeyboardInterrupt

    async def cancelled(_job):
        raise asyncio.CancelledError

    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "baseexc", "max_workers": 1}],
                    handlers={"exit": leave, "interrupt": interrupt, "cancelled": cancelled,
                              "ok": lambda _job: ran.set()}, **FAST)
    with running(worker):
        if not ran.wait(15):
            raise AssertionError(f"the last job never ran; it is {job_row(db, last.job_id)}")
        for job in bad:
            wait_until(lambda job=job: state(db, job.job_id) == "failed", 10,
                       f"job {job.job_id} to fail")
    with db.connect() as conn:
        errors = [conn.execute("select last_error from awa.finished where job_id = %s",
                               [job.job_id]).fetchone()[0] for job in bad]
    assert errors == ["SystemExit: 3", "KeyboardInterrupt", "asyncio.exceptions.CancelledError"]
    assert worker.failed == 3


def test_a_job_claimed_again_while_its_old_attempt_runs_on_stays_heartbeated(
        db, logins, caplog):
    """A plain handler past its deadline runs on; its job is rescued and
    claimed again by another slot of the same worker. When the old attempt
    ends, the new one keeps its heartbeat."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "hang", queue="reclaim")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_max_run_time('reclaim', '1 second')")
    started = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    runs = []

    def hang(_job):
        n = len(runs)
        runs.append(n)
        started[n].set()
        release[n].wait(60)

    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "reclaim", "max_workers": 2}],
                    handlers={"hang": hang}, **FAST, lease=timedelta(seconds=2),
                    heartbeat_every=timedelta(seconds=0.1))
    with running(worker, *release), db.connect(logins.maintenance) as m, \
            db.connect(logins.operator) as op:
        assert started[0].wait(15)
        wait_until(lambda: m.execute("select awa.rescue_expired()").fetchone()[0], 10,
                   "the first attempt to pass its deadline and be rescued")
        op.execute("select awa.set_max_run_time('reclaim', null)")

        def claimed_again() -> bool:
            m.execute("select awa.promote_due()")
            return started[1].is_set()

        wait_until(claimed_again, 15, "the retry to be claimed by the other slot")
        release[0].set()
        wait_until(lambda: "no longer running under this lease" in caplog.text, 10,
                   "the first attempt's late completion to be refused")
        at = lease(db, job.job_id)
        wait_until(lambda: lease(db, job.job_id) > at + timedelta(seconds=1), 6,
                   "the second attempt's lease to be extended after the first one ended")
        release[1].set()
        wait_until(lambda: state(db, job.job_id) == "completed", 10, "the retry to complete")
    assert job_row(db, job.job_id)[:2] == ("completed", 2)
    assert runs == [0, 1]


def test_an_outcome_is_recorded_once_the_database_takes_connections_again(
        db, logins, caplog):
    """The slot's connection is lost while its handler runs, and the server
    refuses new ones (a restart, max_connections): the completion is tried
    again, under the job's lease, until it is recorded; the job does not run twice."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        warm = awa_sql.enqueue(conn, "warm", queue="outage")
        job = awa_sql.enqueue(conn, "held", queue="outage")
    started, release, runs, held = counted_blocking()
    worker = Worker(db.dsn(logins.worker), queues=["outage"],
                    handlers={"warm": lambda _job: None, "held": held}, **FAST)
    with running(worker, release), db.connect() as admin:
        assert started.wait(15)
        wait_until(lambda: state(db, warm.job_id) == "completed", 10, "the first job")
        admin.execute(f'alter role "{logins.worker}" nologin')
        terminate(db, logins.worker, "slot")
        release.set()
        wait_until(lambda: any(str(job.job_id) in r.getMessage() and r.levelno >= logging.WARNING
                               for r in caplog.records), 10,
                   "the slot to find that it cannot record the outcome")
        admin.execute(f'alter role "{logins.worker}" login')
        wait_until(lambda: state(db, job.job_id) == "completed", 10,
                   "the completion to be recorded once the server takes connections")
    assert job_row(db, job.job_id)[:2] == ("completed", 1)
    assert runs == [1]


def test_an_outcome_refused_by_a_server_that_takes_no_writes_is_sent_again(
        db, logins, caplog):
    """The slot connects while its server takes no writes (a failover whose
    DNS still names the old primary: here, a read-only login): the
    completion, refused 25006, was given up at once and the connection kept
    for good, so that job, and every later one of the slot, ran again at
    each lease's end. Now the connection is closed and the completion sent
    again, under the job's lease, until a server takes it."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "held", queue="readonly")
    started, release, runs, held = counted_blocking()
    worker = Worker(db.dsn(logins.worker), queues=["readonly"], handlers={"held": held},
                    **FAST)
    with running(worker, release), db.connect() as admin:
        assert started.wait(15)
        # The slot's connection opens at its first statement: this completion.
        admin.execute(f'alter role "{logins.worker}" set default_transaction_read_only = on')
        release.set()
        wait_until(lambda: any(f"job {job.job_id} (held): its completion could not be recorded:"
                               f" cannot execute" in r.getMessage() for r in caplog.records),
                   10, "the slot to meet the read-only server")
        admin.execute(f'alter role "{logins.worker}" reset default_transaction_read_only')
        wait_until(lambda: state(db, job.job_id) == "completed", 10,
                   "the completion to be recorded once the server takes writes")
    assert job_row(db, job.job_id)[:2] == ("completed", 1)
    assert runs == [1]
    assert worker.completed == 1


def test_one_job_whose_heartbeat_fails_does_not_starve_the_others(db, logins):
    """Under default_transaction_isolation = repeatable read, awa.heartbeat
    raises for a run that is gone (an operator cancelled it) instead of
    returning false; the other held jobs are heartbeated all the same."""
    with db.connect() as admin:
        admin.execute(f'alter role "{logins.worker}"'
                      " set default_transaction_isolation = 'repeatable read'")
    with db.connect(logins.producer) as conn:
        first = awa_sql.enqueue(conn, "slow", queue="hbiso")
    started, release, slow = two_in_turn()
    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "hbiso", "max_workers": 2}],
                    handlers={"slow": slow}, **FAST, **SHORT_LEASE)
    with running(worker, release), db.connect(logins.operator) as op:
        assert started[0].wait(15)
        with db.connect(logins.producer) as conn:
            second = awa_sql.enqueue(conn, "slow", queue="hbiso")
        assert started[1].wait(15)
        assert op.execute("select awa.cancel_job(%s)", [first.job_id]).fetchone()[0]
        at = lease(db, second.job_id)
        wait_until(lambda: lease(db, second.job_id) > at + timedelta(seconds=1), 6,
                   "the other job's lease to be extended")
        release.set()
        wait_until(lambda: state(db, second.job_id) == "completed", 10, "the other job")


def test_a_job_whose_args_python_cannot_decode_fails_alone_and_the_queue_goes_on(
        db, logins):
    """jsonb nested deeper than Python's json decoder goes (valid jsonb, which
    a producer in another language may enqueue): that job fails with why,
    the job claimed in the same batch runs, and so do the jobs after them."""
    deep = "2000"
    with db.connect(logins.producer) as conn:
        bad = conn.execute(
            "select job_id from awa.enqueue('deepargs', 'deep',"
            " ('{\"a\": ' || repeat('[', %s::int) || repeat(']', %s::int) || '}')::jsonb,"
            " max_attempts => 1)", [deep, deep]).fetchone()[0]
        same_batch = awa_sql.enqueue(conn, "ok", {"n": 1}, queue="deepargs")
    seen, ran = [], threading.Event()

    def ok(job):
        seen.append(job.args["n"])
        if len(seen) == 2:
            ran.set()

    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "deepargs", "max_workers": 2}],
                    handlers={"deep": lambda _job: None, "ok": ok}, **FAST)
    with running(worker) as runner:
        wait_until(lambda: state(db, same_batch.job_id) == "completed", 10,
                   "the job claimed with it to complete")
        with db.connect(logins.producer) as conn:
            awa_sql.enqueue(conn, "ok", {"n": 2}, queue="deepargs")
        assert ran.wait(10), f"the next job never ran; run() alive: {runner.is_alive()}"
        wait_until(lambda: state(db, bad) == "failed", 10, "the undecodable job to fail")
    with db.connect() as conn:
        error = conn.execute("select last_error from awa.finished where job_id = %s",
                             [bad]).fetchone()[0]
    assert error.startswith("its args could not be decoded: RecursionError"), error
    assert sorted(seen) == [1, 2]


def test_a_job_whose_run_another_transaction_holds_does_not_stop_the_heartbeat(db, logins):
    """An operator's cancel of a running job left open (BEGIN; cancel; no
    commit) holds its run's row: the heartbeat of that job waits for it at
    most RUN_LOCK_TIMEOUT and is skipped for that pass; the job after
    it is heartbeated all the same. Before, the heartbeat thread waited
    until the operator's transaction ended: no held job was heartbeated and
    a shutdown never handed any back."""
    with db.connect(logins.producer) as conn:
        first = awa_sql.enqueue(conn, "slow", queue="hbheld")
    started, release, slow = two_in_turn()
    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "hbheld", "max_workers": 2}],
                    handlers={"slow": slow}, lease=timedelta(seconds=60),
                    heartbeat_every=timedelta(seconds=0.2), **FAST)
    with running(worker, release), db.connect(logins.operator, autocommit=False) as op:
        assert started[0].wait(15)
        with db.connect(logins.producer) as conn:
            second = awa_sql.enqueue(conn, "slow", queue="hbheld")
        assert started[1].wait(15)
        assert op.execute("select awa.cancel_job(%s)", [first.job_id]).fetchone()[0]
        at = lease(db, second.job_id)
        wait_until(lambda: lease(db, second.job_id) > at + timedelta(seconds=1), 30,
                   "the other job's lease to be extended while the first's run is held")
        op.rollback()
        release.set()
        wait_until(lambda: state(db, second.job_id) == "completed", 10, "the other job")


def test_a_heartbeat_that_could_not_reach_the_server_is_tried_again_soon(
        db, logins, caplog):
    """Connections refused (the login cannot log in, as during a restart or
    a failover): the failed pass is tried again after HEARTBEAT_RETRY_MIN,
    doubled at each failure, not a whole heartbeat_every later, so a server
    that comes back extends the leases before they end. Once it can log in
    again, the lease is extended."""
    caplog.set_level(logging.WARNING, logger="awa_sql.worker")
    with db.connect(logins.producer) as conn:
        job = awa_sql.enqueue(conn, "slow", queue="hbdown")
    started, release = threading.Event(), threading.Event()
    worker = Worker(db.dsn(logins.worker), queues=["hbdown"],
                    handlers={"slow": blocking(started, release)}, lease=timedelta(seconds=120),
                    heartbeat_every=timedelta(seconds=3), **FAST)
    with running(worker, release), db.connect() as admin:
        assert started.wait(30)
        # Its connection is made at its first beat.
        wait_until(lambda: admin.execute(
            "select 1 from pg_stat_activity where usename = %s and application_name = %s",
            [logins.worker, "awa-sql worker heartbeat"]).fetchone(), 20,
            "the heartbeat's connection")
        admin.execute(f'alter role "{logins.worker}" nologin')
        try:
            terminate(db, logins.worker, "heartbeat")
            failed = wait_until(lambda: [r.getMessage() for r in caplog.records
                                         if r.getMessage().startswith("heartbeat failed")],
                                30, "a heartbeat pass to fail")
        finally:
            admin.execute(f'alter role "{logins.worker}" login')
        # heartbeat_every would be 3.0 s.
        assert failed[0].endswith("trying again in 1.0 s"), failed
        at = lease(db, job.job_id)
        wait_until(lambda: lease(db, job.job_id) > at, 20,
                   "the lease to be extended once the server took connections again")


def test_a_job_whose_heartbeat_times_out_does_not_stop_the_pass(db, logins, caplog):
    """Under a statement_timeout shorter than RUN_LOCK_TIMEOUT, the heartbeat
    of a job whose run an operator's open transaction holds is cancelled
    (QueryCanceled, a psycopg OperationalError, its connection up all the
    same): that job is logged and the pass goes on to the job after it.
    Before, it was taken for a lost connection and every pass stopped at that
    job: the other held jobs' leases ran out while their handlers ran."""
    caplog.set_level(logging.WARNING, logger="awa_sql.worker")
    with db.connect() as admin:
        admin.execute(f"alter role \"{logins.worker}\" set statement_timeout = '300ms'")
    with db.connect(logins.producer) as conn:
        first = awa_sql.enqueue(conn, "slow", queue="hbtimeout")
    started, release, slow = two_in_turn()
    worker = Worker(db.dsn(logins.worker), queues=[{"queue": "hbtimeout", "max_workers": 2}],
                    handlers={"slow": slow}, lease=timedelta(seconds=10),
                    heartbeat_every=timedelta(seconds=0.2), **FAST)
    with running(worker, release), db.connect(logins.operator, autocommit=False) as op:
        assert started[0].wait(15)
        # Held first, the first job is the first of every pass.
        with db.connect(logins.producer) as conn:
            second = awa_sql.enqueue(conn, "slow", queue="hbtimeout")
        assert started[1].wait(15)
        assert op.execute("select awa.cancel_job(%s)", [first.job_id]).fetchone()[0]
        at = lease(db, second.job_id)
        wait_until(lambda: lease(db, second.job_id) > at + timedelta(seconds=1), 10,
                   "the other job's lease to be extended while the first's heartbeat times out")
        op.rollback()
        release.set()
        for job in (first, second):
            wait_until(lambda job=job: state(db, job.job_id) == "completed", 10,
                       f"job {job.job_id} to complete")
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"job {first.job_id}: heartbeat failed: canceling statement due to"
                            " statement timeout") and m.endswith("tried again at the next pass")
               for m in logged), logged
    # No pass failed as a whole (the log of a pass that could not reach the server).
    assert not [m for m in logged if m.startswith("heartbeat failed")], logged
    assert [job_row(db, job.job_id)[:2] for job in (first, second)] == [("completed", 1)] * 2
