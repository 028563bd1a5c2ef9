"""Retry backoff with jitter (ADR 026) on real PostgreSQL 17 and 18: after failed
attempt n a job waits min(cap, base * 2^(n-1)) * (1 - jitter * r), r uniform
in [0, 1); jobs that fail together come back spread over that window, not in
one instant; awa.set_retry_policy sets base, cap and jitter per queue (its
partitions and stripes too) and checks them; retry_at still decides; and
the Python Worker passes a handler's Retry(at=...) or Retry(after=...)
through.
"""

from __future__ import annotations

import calendar
import threading
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest

import awa_sql
from awa_sql.worker import Worker
from tests.support.jobs import claim, enqueue
from tests.support.waiting import wait_until

HERD = 1000
SCHEDULED = "select attempt, last_error, run_at from awa.scheduled where job_id = %s"


def fail_together(db, logins, queue: str, jobs: int = HERD) -> tuple[datetime, list[timedelta]]:
    """`jobs` jobs of `queue` claimed, then failed in one statement (a backoff
    counts from the call's statement_timestamp()); that moment, and each
    job's delay until its retry."""
    with db.connect(logins.producer) as p:
        p.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                  " array_fill('k'::text, array[%s]))", [queue, jobs, jobs])
    with db.connect(logins.worker, autocommit=False) as w:
        claimed = claim(w, [queue], n=jobs)
        w.commit()
        assert len(claimed) == jobs
        failed, failed_at = w.execute(
            "select count(*) filter (where awa.fail(u.job_id, u.run_lease, 'downstream is down')),"
            " statement_timestamp()"
            " from unnest(%s::bigint[], %s::bigint[]) as u (job_id, run_lease)",
            [[c[0] for c in claimed], [c[1] for c in claimed]]).fetchone()
        assert failed == jobs
        w.commit()
    with db.connect() as admin:
        run_ats = [r[0] for r in admin.execute(
            "select s.run_at from awa.scheduled s join awa.queue_meta m using (queue_id)"
            " where m.queue = %s", [queue]).fetchall()]
    assert len(run_ats) == jobs
    return failed_at, [r - failed_at for r in run_ats]


def assert_spread(delays: list[timedelta], longest: timedelta, jitter: float) -> None:
    """Every delay within (longest * (1 - jitter), longest]; spread over that window."""
    window = longest * jitter
    shortest = longest - window
    tick = timedelta(microseconds=1)  # a delay is rounded to microseconds
    assert all(shortest - tick <= d <= longest + tick for d in delays), (
        min(delays), max(delays), shortest, longest)
    # Not one instant: (almost) all distinct (a microsecond clock; the
    # birthday bound for 1,000 draws in a 1 s window is one pair in two),
    # spanning at least half the window, with each half of it holding a fair
    # share (uniform: 50%, one standard deviation 1.6 points).
    assert len(set(delays)) >= len(delays) - 10
    assert max(delays) - min(delays) >= window / 2
    low = sum(d < shortest + window / 2 for d in delays) / len(delays)
    assert 0.4 <= low <= 0.6, low


def test_a_thousand_jobs_failing_at_once_come_back_spread_over_the_default_window(
        db, logins):
    # The default after attempt 1: 2 s, half of it drawn at random.
    _, delays = fail_together(db, logins, "herd")
    assert_spread(delays, timedelta(seconds=2), 0.5)


def test_a_queues_policy_sets_the_window(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "herd-policy", "seed")
    with db.connect(logins.worker) as w:
        ((seed, lease, *_),) = claim(w, ["herd-policy"])
        w.execute("select awa.complete(%s, %s)", [seed, lease])
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('herd-policy', '1 minute', null, 1)")
    # Full jitter: anywhere in (0, 60 s].
    _, delays = fail_together(db, logins, "herd-policy")
    assert_spread(delays, timedelta(minutes=1), 1.0)


def _fail_again(w, m, admin, job: int, lease: int) -> tuple[int, timedelta, int]:
    """Fails the held attempt and claims its retry at once: the new lease, the
    delay the backoff gave, the attempt that failed."""
    failed_at = w.execute("select clock_timestamp()").fetchone()[0]
    assert w.execute("select awa.fail(%s, %s, 'again')", [job, lease]).fetchone()[0]
    attempt, _, run_at = admin.execute(SCHEDULED, [job]).fetchone()
    admin.execute("update awa.scheduled set run_at = now() where job_id = %s", [job])
    assert m.execute("select awa.promote_due()").fetchone()[0] == 1
    ((again, new_lease, *_),) = claim(w, ["ladder"])
    assert again == job
    return new_lease, run_at - failed_at, attempt


def test_without_jitter_the_delay_doubles_up_to_the_cap(db, logins):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "ladder", max_attempts=10)[0]
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('ladder', '10 seconds', '1 minute', 0)")
    seen = []
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        ((_, lease, *_),) = claim(w, ["ladder"])
        for _ in range(5):
            lease, delay, attempt = _fail_again(w, m, admin, job, lease)
            seen.append((attempt, round(delay.total_seconds())))
    assert seen == [(1, 10), (2, 20), (3, 40), (4, 60), (5, 60)]


def test_retry_at_overrides_the_backoff(db, logins):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "override")[0]
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('override', '1 second', '2 seconds', 1)")
    at = datetime(2100, 1, 1, tzinfo=UTC)
    with db.connect(logins.worker) as w, db.connect() as admin:
        ((_, lease, *_),) = claim(w, ["override"])
        assert w.execute("select awa.fail(%s, %s, 'later', %s)", [job, lease, at]).fetchone()[0]
        assert admin.execute(SCHEDULED, [job]).fetchone() == (1, "later", at)


def test_the_policy_covers_partitions_and_stripes_and_null_restores_the_default(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('rparts', 2)")
        op.execute("select awa.set_retry_policy('rparts', '1 minute', '2 hours', 0.25)")
        op.execute("select awa.set_queue_partitions('rparts', 3)")  # a later one takes it
        policy = ("select queue, retry_base, retry_cap, retry_jitter from awa.queue_overview"
                  " where logical_queue = 'rparts' order by queue")
        rows = op.execute(policy).fetchall()
        assert rows == [(q, timedelta(minutes=1), timedelta(hours=2), 0.25)
                        for q in ("rparts", "rparts__p1", "rparts__p2")]
        op.execute("select awa.set_retry_policy('rparts', null, null, null)")
        # The overview shows the defaults in force.
        assert {r[1:] for r in op.execute(policy).fetchall()} == {
            (timedelta(seconds=2), timedelta(hours=1), 0.5)}
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.queue_meta where 'rparts' in"
                             " (queue, root_queue) and num_nulls(retry_base, retry_cap,"
                             " retry_jitter) = 3").fetchone()[0] == 3
    for login in (logins.producer, logins.worker, logins.maintenance, logins.reader):
        with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select awa.set_retry_policy('rparts', null, null, null)")


BAD_POLICY = [
    (("0 seconds", None, None), "retry base must be above 0 and at most 1 day, got 00:00:00"),
    (("25 hours", "2 days", None), "retry base must be above 0 and at most 1 day, got 25:00:00"),
    ((None, "-1 minute", None), "retry cap must be above 0 and at most 30 days, got -00:01:00"),
    ((None, "31 days", None), "retry cap must be above 0 and at most 30 days, got 31 days"),
    ((None, None, -0.1), "retry jitter must be between 0 and 1, got -0.1"),
    ((None, None, 1.5), "retry jitter must be between 0 and 1, got 1.5"),
    (("2 minutes", "1 minute", None),
     "retry base must not be above the cap, got base 00:02:00, cap 00:01:00"),
    (("2 hours", None, None),
     "retry base must not be above the cap, got base 02:00:00, cap 01:00:00 (the default)"),
    ((None, "1 second", None),
     "retry base must not be above the cap, got base 00:00:02 (the default), cap 00:00:01"),
]


@pytest.mark.parametrize(("policy", "message"), BAD_POLICY)
def test_a_bad_policy_is_refused_naming_the_value_and_its_range(db, logins, policy, message):
    with db.connect(logins.producer) as p:
        enqueue(p, "rbad", "seed")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_retry_policy('rbad', '1 second', '3 seconds', 0)")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            op.execute("select awa.set_retry_policy('rbad', %s::interval, %s::interval,"
                       " %s::numeric)", policy)
        assert err.value.diag.message_primary == message
        # Nothing changed.
        assert op.execute("select retry_base, retry_cap, retry_jitter from awa.queue_overview"
                          " where queue = 'rbad'").fetchone() == (
            timedelta(seconds=1), timedelta(seconds=3), 0)
        with pytest.raises(psycopg.errors.UndefinedObject, match="queue 'nope' does not exist"):
            op.execute("select awa.set_retry_policy('nope', null, null, null)")


# -- the Python Worker's Retry ---------------------------------------------------------


def test_a_handlers_retry_time_is_passed_through(db, logins):
    at = datetime(2100, 1, 1, tzinfo=UTC)
    with db.connect(logins.producer) as p:
        at_job = enqueue(p, "wretry", "at")[0]
        after_job = enqueue(p, "wretry", "after")[0]
        last_job = enqueue(p, "wretry", "last", max_attempts=1)[0]

    def retry_at(_job):
        raise awa_sql.Retry("the mail server said later", at=at)

    def retry_after(_job):
        raise awa_sql.Retry(after=timedelta(minutes=7))

    worker = Worker(db.dsn(logins.worker), queues=["wretry"], snapshot_every=None,
                    handlers={"at": retry_at, "after": retry_after, "last": retry_at},
                    poll_interval=0.05)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        with db.connect() as admin:
            wait_until(lambda: worker.failed == 3, 15, "the three attempts to fail")
            assert admin.execute(SCHEDULED, [at_job]).fetchone() == (
                1, "the mail server said later", at)
            # after= is counted from the server's now() at awa.fail.
            attempt, error, run_at = admin.execute(SCHEDULED, [after_job]).fetchone()
            assert (attempt, error) == (1, "retry requested")
            waited = admin.execute("select %s - now()", [run_at]).fetchone()[0]
            assert timedelta(minutes=6) < waited <= timedelta(minutes=7)
            # The attempt counts: on its last one the job fails for good.
            assert admin.execute("select state, last_error from awa.finished where job_id = %s",
                                 [last_job]).fetchone() == ("failed", "the mail server said later")
    finally:
        worker.stop()
        t.join(timeout=30)


def _posix_day(d: date) -> int:
    """``d`` as a POSIX TZ rule's Jn: 1 to 365, February 29 never counted."""
    leap = calendar.isleap(d.year) and d > date(d.year, 2, 28)
    return d.timetuple().tm_yday - leap


def test_a_retry_after_a_day_is_24_hours_in_any_time_zone(db, logins):
    """Retry(after=timedelta(days=1)) went as interval '1 day', which now()
    adds by the session's calendar: across a change of clocks the job came
    back hours early. The worker's login here is in a zone that moves its
    clocks 12 hours forward at the next midnight (a POSIX rule, so the test
    needs no real zone's calendar)."""
    # Tomorrow in the zone's standard time (UTC-6), not the machine's: after
    # 18:00 UTC the two dates differ.
    tomorrow = (datetime.now(UTC) - timedelta(hours=6)).date() + timedelta(days=1)
    zone = (f"XST6XDT-6,J{_posix_day(tomorrow)}/0,"
            f"J{_posix_day(tomorrow + timedelta(days=180))}/0")
    with db.connect() as admin:
        admin.execute(f'alter role "{logins.worker}" set timezone = \'{zone}\'')
    with db.connect(logins.worker) as w:
        assert w.execute("select now() + interval '1 day' - now() < interval '20 hours'"
                         ).fetchone()[0], "the zone changes no clock by tomorrow"
    with db.connect(logins.producer) as p:
        job = enqueue(p, "wday", "day")[0]

    def a_day_later(_job):
        raise awa_sql.Retry(after=timedelta(days=1))

    worker = Worker(db.dsn(logins.worker), queues=["wday"], snapshot_every=None,
                    handlers={"day": a_day_later}, poll_interval=0.05)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: worker.failed == 1, 15, "the attempt to fail")
    finally:
        worker.stop()
        t.join(timeout=30)
    with db.connect() as admin:
        run_at = admin.execute(SCHEDULED, [job]).fetchone()[2]
        waited = admin.execute("select %s - now()", [run_at]).fetchone()[0]
    assert timedelta(hours=23, minutes=59) < waited <= timedelta(hours=24)


def test_a_retry_time_the_server_refuses_is_a_failure_after_the_queues_backoff(db, logins):
    """Retry(at=datetime.max) as "never", or an after= past what a timestamp
    holds: awa.fail refuses the time (22023, 22008). The attempt is
    recorded all the same, retried after the queue's backoff, with the
    handler's reason; before, the job stayed held until its lease ended."""
    with db.connect(logins.producer) as p:
        jobs = {kind: enqueue(p, "wfar", kind)[0] for kind in ("max", "huge")}

    def never(_job):
        raise awa_sql.Retry("never again", at=datetime.max.replace(tzinfo=UTC))

    def huge(_job):
        raise awa_sql.Retry("much later", after=timedelta(days=999_999_999))

    worker = Worker(db.dsn(logins.worker), queues=["wfar"], snapshot_every=None,
                    handlers={"max": never, "huge": huge}, poll_interval=0.05)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        with db.connect() as admin:
            wait_until(lambda: worker.failed == 2, 15, "the two attempts to be recorded")
            for kind, reason in (("max", "never again"), ("huge", "much later")):
                attempt, error, run_at = admin.execute(SCHEDULED, [jobs[kind]]).fetchone()
                assert (attempt, error) == (1, reason)
                assert admin.execute("select %s - now() < interval '1 minute'",
                                     [run_at]).fetchone()[0]  # the backoff's, 2 s or so
    finally:
        worker.stop()
        t.join(timeout=30)


def test_retry_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match="not both"):
        awa_sql.Retry(at=datetime.now(UTC), after=timedelta(seconds=1))
    with pytest.raises(ValueError, match="aware"):
        awa_sql.Retry(at=datetime(2100, 1, 1))
    with pytest.raises(ValueError, match="negative"):
        awa_sql.Retry(after=timedelta(seconds=-1))
