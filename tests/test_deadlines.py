"""Deadlines (ADR 026) on real PostgreSQL 17 and 18: a job's max run time, its
own or its queue's, becomes a deadline at the claim; the lease never passes
it, heartbeat or not; the real ``awa maintain`` retries a job past it with
'deadline exceeded after N s'; the value rides every enqueue path and the
job's retries; bad values are refused; and the Python Worker cancels an
async handler at the deadline and lets a plain one run on without a lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta

import psycopg
import pytest
from psycopg.types.json import Jsonb

import awa_sql
from awa_sql.worker import Worker
from tests.support.jobs import claim, copy_rows, enqueue, function_calls
from tests.support.maintain import MaintainProcess
from tests.support.waiting import wait_until

RUNNING = ("select claimed_at, deadline_at, lease_expires_at, max_run_time from awa.running"
           " where job_id = %s")
SCHEDULED = "select attempt, last_error, max_run_time, run_at from awa.scheduled where job_id = %s"


def timed(conn, queue, kind="job", *, max_run_time, max_attempts=None, ordering_key=None,
          run_at=None) -> int:
    """One job with a max run time of its own: a batch of one (awa.enqueue takes none)."""
    return conn.execute(
        "select job_id from awa.enqueue_batch(array[%s::text], array[%s::text],"
        " ordering_keys => array[%s::bytea], run_ats => array[%s::timestamptz],"
        " max_attempts => array[%s::integer], max_run_times => array[%s::interval])",
        [queue, kind, ordering_key, run_at, max_attempts, max_run_time]).fetchone()[0]


def running(admin, job_id):
    return admin.execute(RUNNING, [job_id]).fetchone()


def server_past(admin, moment) -> bool:
    return admin.execute("select clock_timestamp() > %s", [moment]).fetchone()[0]


def test_the_claim_gives_each_job_its_own_max_run_time_else_its_queues(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "dq", "seed")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_max_run_time('dq', '1 hour')")
    with db.connect(logins.producer) as p:
        default = enqueue(p, "dq", "default")[0]
        own = timed(p, "dq", "own", max_run_time="90 seconds")
        day = timed(p, "dq", "day", max_run_time="1 day")
        none = enqueue(p, "plain", "none")[0]
    with db.connect(logins.worker) as w, db.connect() as admin:
        claimed = {c[0]: c for c in claim(w, ["dq", "plain"], lease="5 minutes")}
        assert set(claimed) >= {default, own, day, none}
        for job_id, expected in ((default, timedelta(hours=1)), (own, timedelta(seconds=90)),
                                 (day, timedelta(hours=24))):
            claimed_at, deadline_at, lease_until, _ = running(admin, job_id)
            assert deadline_at == claimed_at + expected
            # awa.claimed says it too (its last column).
            assert claimed[job_id][-1] == deadline_at
            assert lease_until == min(claimed_at + timedelta(minutes=5), deadline_at)
        assert running(admin, own)[2] == running(admin, own)[1]  # the lease ends at it
        claimed_at, deadline_at, lease_until, _ = running(admin, none)
        assert deadline_at is None and claimed[none][-1] is None
        assert lease_until == claimed_at + timedelta(minutes=5)
        # The job's own value is kept on its running row, in seconds; the
        # queue's is not copied.
        assert admin.execute("select max_run_time::text from awa.running where job_id = %s",
                             [day]).fetchone()[0] == "24:00:00"
        assert running(admin, default)[3] is None
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_max_run_time('dq', null)")
    with db.connect(logins.producer) as p:
        later = enqueue(p, "dq", "later")[0]
    with db.connect(logins.worker) as w, db.connect() as admin:
        claim(w, ["dq"])
        assert running(admin, later)[1] is None


def test_set_max_run_time_covers_partitions_and_stripes_and_checks_its_input(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('dparts', 2)")
        op.execute("select awa.set_queue_stripes('dstripes', 2)")
        op.execute("select awa.set_max_run_time('dparts', '2 minutes')")
        op.execute("select awa.set_max_run_time('dstripes', '3 minutes')")
        # A partition made later takes the logical queue's value, as it takes S.
        op.execute("select awa.set_queue_partitions('dparts', 3)")
    with db.connect(logins.producer) as p:
        for i in range(8):
            enqueue(p, "dstripes", ordering_key=b"k%d" % i)
    with db.connect() as admin:
        rows = dict(admin.execute(
            "select queue, max_run_time::text from awa.queue_meta"
            " where 'dparts' in (queue, logical_queue, root_queue)"
            "    or 'dstripes' in (queue, logical_queue, root_queue)").fetchall())
    assert rows == {"dparts": "00:02:00", "dparts__p1": "00:02:00", "dparts__p2": "00:02:00",
                    "dstripes": "00:03:00", "dstripes#0": "00:03:00",
                    "dstripes#1": "00:03:00"}
    with db.connect(logins.operator) as op:
        for bad, shown in (("0 seconds", "00:00:00"), ("999 milliseconds", "00:00:00.999"),
                           ("30 days 1 second", "30 days 00:00:01"),
                           ("-1 hour", "-01:00:00")):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                op.execute("select awa.set_max_run_time('dparts', %s::interval)", [bad])
            assert err.value.diag.message_primary == (
                f"max_run_time must be between 1 second and 30 days, got {shown}")
        with pytest.raises(psycopg.errors.UndefinedObject, match="queue 'nope' does not exist"):
            op.execute("select awa.set_max_run_time('nope', '1 hour')")
    for login in (logins.producer, logins.worker, logins.maintenance, logins.reader):
        with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select awa.set_max_run_time('dparts', '1 hour')")


def test_a_heartbeating_job_past_its_deadline_is_rescued_by_awa_maintain(db, logins):
    """Heartbeats return true but never move the lease past the deadline; after
    it, the real awa maintain retries the job, the attempt counted."""
    with db.connect(logins.producer) as p:
        job = enqueue(p, "beat", "stuck")[0]
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_max_run_time('beat', '2 seconds')")
        # Retries wait long enough to be looked at in awa.scheduled.
        op.execute("select awa.set_retry_policy('beat', '10 minutes', null, null)")
    beats = []
    with db.connect(logins.worker) as w, db.connect() as admin:
        ((job_id, lease, *_),) = claim(w, ["beat"], lease="1 hour")
        assert job_id == job
        _, deadline_at, lease_until, _ = running(admin, job)
        assert lease_until == deadline_at  # the claim's lease stops there too

        def beat():
            alive, at = w.execute("select awa.heartbeat(%s, %s, '1 hour'), clock_timestamp()",
                                  [job, lease]).fetchone()
            row = running(admin, job)
            beats.append((alive, at, row[2] if row else None))
            return not alive

        with MaintainProcess(db.dsn(logins.maintenance), "--rescue-every", "200ms",
                             "--promote-every", "off") as m:
            m.wait(beat, "the heartbeating job to be rescued", 30)
            m.wait_for_handled("rescue", 1)
    # A beat's lease as read just after it; gone (None) when the rescue came
    # between the two reads.
    alive = [b for b in beats if b[0] and b[2] is not None]
    assert alive, "no heartbeat returned true"
    assert all(until == deadline_at for _, _, until in alive), "a heartbeat passed the deadline"
    assert beats[-1][1] > deadline_at  # rescued after the deadline, not before
    with db.connect() as admin:
        attempt, error, own, run_at = admin.execute(SCHEDULED, [job]).fetchone()
    assert (attempt, error, own) == (1, "deadline exceeded after 2 s", None)
    # The queue's backoff: 10 minutes, half of it drawn at random.
    assert deadline_at + timedelta(minutes=5) <= run_at <= beats[-1][1] + timedelta(minutes=10)


def test_past_its_deadline_on_its_last_attempt_a_job_fails_for_good(db, logins):
    with db.connect(logins.producer) as p:
        job = timed(p, "last", max_attempts=1, max_run_time="1.5 seconds")
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        claim(w, ["last"])
        deadline_at = running(admin, job)[1]
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 0
        wait_until(lambda: server_past(admin, deadline_at), what="the deadline")
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
        assert admin.execute(
            "select state, attempt, last_error, max_run_time from awa.finished"
            " where job_id = %s", [job]).fetchone() == (
            "failed", 1, "deadline exceeded after 1.5 s", timedelta(seconds=1.5))


def test_a_lease_that_ends_before_the_deadline_is_a_lease_expiry(db, logins):
    with db.connect(logins.producer) as p:
        job = timed(p, "early", max_run_time="1 hour")
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        claim(w, ["early"], lease="300 milliseconds")
        lease_until = running(admin, job)[2]
        wait_until(lambda: server_past(admin, lease_until), what="the lease to end")
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
        attempt, error, own, _ = admin.execute(SCHEDULED, [job]).fetchone()
    assert (attempt, error, own) == (1, "lease expired", timedelta(hours=1))


def test_a_jobs_own_max_run_time_rides_every_path_and_its_retries(db, logins):
    with db.connect(logins.producer) as p:
        batch = [r[0] for r in p.execute(
            "select * from awa.enqueue_batch(array['ride', 'ride', 'ride'], array['a', 'b', 'c'],"
            " max_run_times => array[null, '5 seconds', '1 day']::interval[])").fetchall()]
        with p.transaction():
            copy_rows(p, [("ride", None, None, "copied", Jsonb({}), None, None, "2 minutes"),
                          ("ride", None, None, "plain", Jsonb({}), None, None, None)])
        later = timed(p, "ride", "later", run_at="2100-01-01T00:00:00Z", max_run_time="2 days")
    with db.connect() as admin:
        stored = dict(admin.execute(
            "select kind, max_run_time::text from awa.ready union all"
            " select kind, max_run_time::text from awa.scheduled").fetchall())
    assert stored == {"a": None, "b": "00:00:05", "c": "24:00:00", "copied": "00:02:00",
                      "plain": None, "later": "48:00:00"}
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        claimed = {c[0]: c for c in claim(w, ["ride"])}
        job, lease = batch[1], claimed[batch[1]][1]
        assert w.execute("select awa.fail(%s, %s, 'boom', now())", [job, lease]).fetchone()[0]
        assert admin.execute(SCHEDULED, [job]).fetchone()[2] == timedelta(seconds=5)
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
        (again,) = claim(w, ["ride"])
        claimed_at, deadline_at, _, own = running(admin, job)
        assert again[0] == job and own == timedelta(seconds=5)
        assert deadline_at == claimed_at + timedelta(seconds=5) == again[-1]
    assert later not in claimed


def test_one_job_with_its_own_max_run_time_is_a_batch_of_one(db, logins):
    """awa.enqueue keeps its signature and its fast path (a test there would cost
    every call, ADR 026): a job with its own max run time is a batch of one,
    which the general way serves; without one the batch takes its lane range."""
    with db.connect(logins.producer) as p:
        enqueue(p, "fastrun", "seed")
        with pytest.raises(psycopg.errors.UndefinedFunction):
            p.execute("select awa.enqueue('fastrun', 'k', max_run_time => '1 minute')")
    with db.connect(autocommit=False) as conn:
        conn.execute("set local track_functions = 'all'")
        conn.execute(f"set local role {logins.producer}")
        timed(conn, "fastrun", max_run_time="1 minute")
        assert function_calls(conn, "awa._enqueue_rows") == 1
        conn.execute("select awa.enqueue_batch(array['fastrun'], array['k'],"
                     " max_run_times => array[null]::interval[])")
        assert function_calls(conn, "awa._enqueue_rows") == 1
        conn.commit()


def _one(extra: str, run_time: str) -> str:
    return ("select awa.enqueue_batch(array['bad'], array['k']" + extra
            + f", max_run_times => array['{run_time}']::interval[])")


BAD = [
    (_one("", "0 seconds"),
     "batch element 1 (1-based): max_run_time must be between 1 second and 30 days,"
     " got 00:00:00"),
    (_one("", "31 days"),
     "batch element 1 (1-based): max_run_time must be between 1 second and 30 days,"
     " got 31 days"),
    (_one(", ordering_keys => array['x']::bytea[]", "-1 second"),
     "batch element 1 (1-based): max_run_time must be between 1 second and 30 days,"
     " got -00:00:01"),
    (_one(", run_ats => array[now() + interval '1 day']", "0.5 seconds"),
     "batch element 1 (1-based): max_run_time must be between 1 second and 30 days,"
     " got 00:00:00.5"),
    ("select awa.enqueue_batch(array['bad', 'bad'], array['k', 'k'],"
     " max_run_times => array['1 minute', '0 seconds']::interval[])",
     "batch element 2 (1-based): max_run_time must be between 1 second and 30 days,"
     " got 00:00:00"),
    ("select awa.enqueue_batch(array['bad'], array['k'],"
     " max_run_times => array['1 minute', '1 minute']::interval[])",
     "array max_run_times has 2 elements but queues has 1"),
]


@pytest.mark.parametrize(("statement", "message"), BAD)
def test_a_bad_max_run_time_is_refused_and_writes_nothing(db, logins, statement, message):
    with db.connect(logins.producer) as p, pytest.raises(psycopg.errors.InvalidParameterValue) \
            as err:
        p.execute(statement)
    assert err.value.diag.message_primary == message
    with db.connect() as admin:
        assert admin.execute("select (select count(*) from awa.ready)"
                             " + (select count(*) from awa.scheduled)").fetchone()[0] == 0


def test_a_bad_max_run_time_in_a_copy_names_its_row(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "badcopy", "seed")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err, p.transaction():
            copy_rows(p, [("badcopy", None, None, "k", Jsonb({}), None, None, "1 minute"),
                          ("badcopy", None, None, "k", Jsonb({}), None, None, "40 days")])
            p.execute("select awa.enqueue_copied()")
    assert err.value.diag.message_primary == (
        "COPY row 2 (1-based): max_run_time must be between 1 second and 30 days, got 40 days")


def test_the_old_signatures_keep_working(db, logins):
    with db.connect(logins.producer) as p:
        one = p.execute("select job_id from awa.enqueue('old'::text, 'k'::text, '{}'::jsonb,"
                        " 2::smallint, null::bytea, null::timestamptz, 25)").fetchone()
        many = p.execute("select count(*) from awa.enqueue_batch(array['old'], array['k'],"
                         " array['{}']::jsonb[], array[2]::smallint[], array[null]::bytea[],"
                         " array[null]::timestamptz[], array[25])").fetchone()
    assert one[0] and many[0] == 1
    with db.connect(logins.worker) as w:
        cur = w.execute("select * from awa.claim(array['old'], 10, 'w')")
        names = [c.name for c in cur.description]
        assert len(cur.fetchall()) == 2
    assert names[-1] == "deadline_at" and names[:2] == ["job_id", "run_lease"]


def test_the_python_client_passes_max_run_time_on_every_path(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        awa_sql.enqueue(conn, "one", queue="py", max_run_time=timedelta(seconds=30))
        awa_sql.enqueue(conn, "none", queue="py")
        awa_sql.enqueue_many(conn, [{"kind": "many", "max_run_time": timedelta(minutes=1)},
                                    {"kind": "many-none"}], queue="py")
        awa_sql.enqueue_many_copy(conn, [{"kind": "copied",
                                          "max_run_time": timedelta(hours=1)}], queue="py")
        conn.commit()
    with db.connect() as admin:
        stored = dict(admin.execute("select kind, max_run_time from awa.ready").fetchall())
    assert stored == {"one": timedelta(seconds=30), "none": None, "many": timedelta(minutes=1),
                      "many-none": None, "copied": timedelta(hours=1)}


# -- the Python Worker -----------------------------------------------------------------


def _start(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def test_the_worker_cancels_an_async_handler_at_its_deadline(db, logins, caplog):
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as p:
        job = timed(p, "acancel", "slow", max_run_time="1 second")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('acancel', '1 hour', '1 hour', 0)")
    cancelled = threading.Event()

    async def slow(_job):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    worker = Worker(db.dsn(logins.worker), queues=["acancel"], handlers={"slow": slow},
                    snapshot_every=None, poll_interval=0.05)
    t = _start(worker)
    try:
        with db.connect() as admin:
            row = wait_until(lambda: admin.execute(SCHEDULED, [job]).fetchone(), 15,
                             "the cancelled job to be failed for a retry")
            # When awa.fail ran (the retry comes an hour later, no jitter),
            # from the enqueue.
            ran_for = admin.execute(
                "select run_at - interval '1 hour' - enqueued_at from awa.scheduled"
                " where job_id = %s", [job]).fetchone()[0]
    finally:
        worker.stop()
        t.join(timeout=30)
    assert cancelled.is_set()
    assert row[:3] == (1, "deadline exceeded after 1 s", timedelta(seconds=1))
    # The worker failed the attempt itself, at the deadline (no rescue runs here).
    assert timedelta(seconds=1) <= ran_for < timedelta(seconds=10)
    assert worker.failed == 1 and worker.completed == 0
    assert f"job {job} (slow): deadline exceeded after 1 s; its handler was cancelled" \
        in caplog.text


def test_a_plain_handler_runs_on_past_its_deadline_without_a_lease(db, logins, caplog):
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    with db.connect(logins.producer) as p:
        job = timed(p, "sync", "blocking", max_run_time="1 second")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('sync', '1 hour', '1 hour', 0)")
    started, release = threading.Event(), threading.Event()

    def blocking(_job):
        started.set()
        release.wait(60)

    worker = Worker(db.dsn(logins.worker), queues=["sync"], handlers={"blocking": blocking},
                    snapshot_every=None, poll_interval=0.05,
                    heartbeat_every=timedelta(milliseconds=100))
    t = _start(worker)
    try:
        wait_until(started.is_set, 15, "the handler to start")
        wait_until(lambda: "cannot be interrupted" in caplog.text, 15,
                   "the worker to log that the deadline passed")
        with db.connect() as admin, db.connect(logins.maintenance) as m:
            _, deadline_at, lease_until, _ = running(admin, job)
            assert lease_until == deadline_at  # heartbeats never moved it past
            wait_until(lambda: server_past(admin, deadline_at), what="the deadline")
            assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
            assert admin.execute(SCHEDULED, [job]).fetchone()[:2] == (
                1, "deadline exceeded after 1 s")
        release.set()
        wait_until(lambda: "no longer running under this lease" in caplog.text, 15,
                   "the late completion to be refused")
    finally:
        release.set()
        worker.stop()
        t.join(timeout=30)
    assert worker.completed == 0


def test_the_job_tools_keep_a_jobs_own_max_run_time(db, logins):
    """A failed job retried, and a waiting job cancelled then retried, by the
    operators' job tools (ADR 025) run again with their own max run time."""
    with db.connect(logins.producer) as p:
        failing = timed(p, "tools", "fails", max_attempts=1, max_run_time="3 minutes")
        waiting = timed(p, "tools", "waits", run_at="2100-01-01T00:00:00Z",
                        max_run_time="4 minutes")
    with db.connect(logins.worker) as w:
        ((job_id, lease, *_),) = claim(w, ["tools"])
        assert job_id == failing
        w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [waiting]).fetchone()[0]
        assert op.execute("select awa.retry_job(%s)", [waiting]).fetchone()[0]
        assert op.execute("select awa.retry_jobs('tools')").fetchone()[0] == 1
    with db.connect() as admin:
        assert dict(admin.execute("select job_id, max_run_time from awa.ready").fetchall()) == {
            failing: timedelta(minutes=3), waiting: timedelta(minutes=4)}
