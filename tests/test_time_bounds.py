"""Times and leases a caller gives are bounded, on real PostgreSQL 17 and 18.

A run_at (enqueue, batch, COPY) or a retry_at (awa.fail) must be before
9999-12-31 00:00 UTC: a later one, infinity included, would never run, and
clients that hold dates in four-digit years (Python's datetime) could not
read the job: awa.jobs, and the CLI and admin API over it, failed on the
whole queue. A lease (awa.claim) or an extension (awa.heartbeat) is at most
30 days, so that the lease a job tool shows is a date too. Refused with
22023 naming the value and the bound, nothing written; the bound itself is
refused and a time just before it taken.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.jobs import claim, copy_rows

BOUND = "run_at must be before 9999-12-31 00:00:00+00, got"
TOO_LATE = {
    "infinity": "infinity UTC",
    "12000-01-01 00:00:00+00": "12000-01-01 00:00:00 UTC",
    "9999-12-31 00:00:00+00": "9999-12-31 00:00:00 UTC",
    # Before the bound in its own zone, at it in UTC.
    "9999-12-31 05:00:00+05": "9999-12-31 00:00:00 UTC",
}
LAST = "9999-12-30 23:59:59+00"


def nothing_written(db) -> None:
    with db.connect() as su:
        assert su.execute("select (select count(*) from awa.ready)"
                          " + (select count(*) from awa.scheduled)"
                          " + (select count(*) from awa.copy_staging)").fetchone()[0] == 0


@pytest.mark.parametrize("run_at", TOO_LATE)
def test_a_single_enqueue_refuses_a_run_at_past_the_bound(db, logins, run_at):
    with db.connect(logins.producer) as p, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        p.execute("select awa.enqueue('tb', 'k', run_at => %s::timestamptz)", [run_at])
    assert err.value.diag.message_primary == f"{BOUND} {TOO_LATE[run_at]}"
    nothing_written(db)


def test_a_run_at_just_before_the_bound_is_scheduled_and_the_job_tools_read_it(db, logins):
    with db.connect(logins.producer) as p:
        job = p.execute("select (awa.enqueue('tb', 'k', run_at => %s::timestamptz)).job_id",
                        [LAST]).fetchone()[0]
    with db.connect(logins.operator) as op:
        state, run_at = op.execute("select state, run_at from awa.job(%s)", [job]).fetchone()
        listed = op.execute("select job_id from awa.jobs('tb')").fetchall()
    assert state == "scheduled"
    assert run_at == datetime(9999, 12, 30, 23, 59, 59, tzinfo=UTC)
    assert listed == [(job,)]


def test_a_batch_names_the_element_whose_run_at_is_past_the_bound(db, logins):
    with db.connect(logins.producer) as p, \
            pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        p.execute("select * from awa.enqueue_batch(array['tb', 'tb', 'tb'], array['k', 'k', 'k'],"
                  " run_ats => array[null, %s, 'infinity']::timestamptz[])", [LAST])
    assert err.value.diag.message_primary == f"batch element 3 (1-based): {BOUND} infinity UTC"
    nothing_written(db)


@pytest.mark.parametrize("rows", [2, 3])
def test_a_copy_names_the_row_whose_run_at_is_past_the_bound(db, logins, rows):
    """Both movers: rows of one queue and priority (the set-based mover) and
    a mixed set (the general one)."""
    staged = [("tbc", None, None, "k", Jsonb({}), None, None),
              ("tbc", None, None, "k", Jsonb({}), "infinity", None),
              ("tbc2", 1, None, "k", Jsonb({}), None, None)][:rows]
    with (db.connect(logins.producer) as p,
          pytest.raises(psycopg.errors.InvalidParameterValue) as err, p.transaction()):
        copy_rows(p, staged)
        p.execute("select awa.enqueue_copied()")
    assert err.value.diag.message_primary == f"COPY row 2 (1-based): {BOUND} infinity UTC"
    nothing_written(db)


def test_a_retry_at_past_the_bound_is_refused_and_the_run_left_as_it_was(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('tbf', 'k', max_attempts => 5)")
    with db.connect(logins.worker) as w:
        [job] = claim(w, ["tbf"], 1)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            w.execute("select awa.fail(%s, %s, 'boom', 'infinity')", [job[0], job[1]])
        assert err.value.diag.message_primary == (
            "retry_at must be before 9999-12-31 00:00:00+00, got infinity UTC")
        assert w.execute("select awa.fail(%s, %s, 'boom', %s::timestamptz)",
                         [job[0], job[1], LAST]).fetchone()[0]
    with db.connect() as su:
        assert su.execute("select run_at from awa.scheduled where job_id = %s",
                          [job[0]]).fetchone()[0] == datetime(9999, 12, 30, 23, 59, 59,
                                                              tzinfo=UTC)


@pytest.mark.parametrize("lease", ["31 days", "1 year", "infinity", "0", "-1 second"])
def test_a_claim_refuses_a_lease_outside_its_range_and_takes_nothing(db, logins, lease):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('tbl', 'k')")
    with db.connect(logins.worker) as w:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            claim(w, ["tbl"], 1, lease=lease)
        shown = w.execute("select %s::interval::text", [lease]).fetchone()[0]
        assert err.value.diag.message_primary == (
            f"lease must be a positive interval of at most 30 days, got {shown}")
        with pytest.raises(psycopg.errors.NullValueNotAllowed, match="lease must not be null"):
            w.execute("select * from awa.claim(array['tbl'], 1, 'w', null)")
        [job] = claim(w, ["tbl"], 1, lease="30 days")
    with db.connect() as su:
        assert su.execute("select lease_expires_at - claimed_at from awa.running"
                          " where job_id = %s", [job[0]]).fetchone()[0].days == 30


def test_a_lease_is_checked_and_applied_in_seconds(db, logins):
    """PostgreSQL compares intervals with a month of 30 days and a year of
    360, but adds a month to a time by the calendar: a lease is checked and
    applied as its seconds (a month 30 days, a year 365.25), so the lease a
    claim or heartbeat sets is the one checked, whatever the month."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array['tbs', 'tbs'], array['k', 'k'])")
    with db.connect(logins.worker) as w:
        # 25 days by comparison, 30.25 in seconds.
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            claim(w, ["tbs"], 1, lease="1 year -335 days")
        [job] = claim(w, ["tbs"], 1, lease="1 mon -30 days 1 second")
        assert w.execute("select awa.heartbeat(%s, %s, '1 mon -29 days')",
                         [job[0], job[1]]).fetchone()[0]
        [second] = claim(w, ["tbs"], 1, lease="1 mon -30 days 1 second")
    with db.connect() as su:
        leases = dict(su.execute("select job_id, lease_expires_at - heartbeat_at"
                                 " from awa.running where queue_id = (select queue_id"
                                 " from awa.queue_meta where queue = 'tbs')").fetchall())
    assert leases == {job[0]: timedelta(days=1), second[0]: timedelta(seconds=1)}


def test_a_heartbeat_refuses_an_extension_outside_its_range(db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('tbh', 'k')")
    with db.connect(logins.worker) as w:
        [job] = claim(w, ["tbh"], 1)
        for extend, shown in (("31 days", "31 days"), ("infinity", "infinity"),
                              ("0", "00:00:00")):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                w.execute("select awa.heartbeat(%s, %s, %s::interval)", [job[0], job[1], extend])
            assert err.value.diag.message_primary == (
                f"extend must be a positive interval of at most 30 days, got {shown}")
        assert w.execute("select awa.heartbeat(%s, %s, '30 days')",
                         [job[0], job[1]]).fetchone()[0]


# Durations PostgreSQL compares with a month of 30 days and a year of 360,
# whose seconds (a year 365.25 days, as every duration is applied) say
# otherwise: (value, days by comparison, days in seconds).
MISREAD = [("-1 year 361 days", 1, -4.25), ("1 year -335 days", 25, 30.25)]

CALLS = {
    "batch max_run_times": (
        "producer", "select * from awa.enqueue_batch(array['tbd'], array['k'],"
                    " max_run_times => array[%s::interval])"),
    "set_max_run_time": ("operator", "select awa.set_max_run_time('tbd', %s::interval)"),
    "retry base": (
        "operator", "select awa.set_retry_policy('tbd', %s::interval, '30 days', 0.5)"),
    "retry cap": (
        "operator", "select awa.set_retry_policy('tbd', '1 second', %s::interval, 0.5)"),
    "prune_shard_changes": ("maintenance", "select awa.prune_shard_changes(%s::interval)"),
    "failure_summary": ("reader", "select * from awa.failure_summary(since => %s::interval)"),
}
# Which of MISREAD each call must refuse: the bounds (1 second to 30 days;
# retry base up to 1 day; at least 1 day of history; 0 to 10 years back).
REFUSED = {
    "batch max_run_times": {"-1 year 361 days", "1 year -335 days"},
    "set_max_run_time": {"-1 year 361 days", "1 year -335 days"},
    "retry base": {"-1 year 361 days", "1 year -335 days"},
    "retry cap": {"-1 year 361 days", "1 year -335 days"},
    "prune_shard_changes": {"-1 year 361 days"},
    "failure_summary": {"-1 year 361 days"},
}


@pytest.mark.parametrize("call", CALLS)
def test_every_duration_a_caller_gives_is_checked_in_the_seconds_it_is_applied_in(
        db, logins, call):
    """Each duration is checked as its seconds, as it is stored or added to
    a time: '-1 year 361 days' passed a check of at least a second or a day
    as one day and was applied as minus 4.25 days (a job's lease already
    expired at its claim; a retry delay below 0; a prune of the whole
    history of S changes); '1 year -335 days' passed the 30 days' bound.
    Refused with 22023, nothing changed."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('tbd', 'k')")
    role, statement = CALLS[call]
    with db.connect() as su:
        before = su.execute("select (select count(*) from awa.ready), m.max_run_time,"
                            " m.retry_base, m.retry_cap from awa.queue_meta m"
                            " where m.queue = 'tbd'").fetchone()
    with db.connect(getattr(logins, role)) as conn:
        for value, _, _ in MISREAD:
            if value in REFUSED[call]:
                with pytest.raises(psycopg.errors.InvalidParameterValue):
                    conn.execute(statement, [value])
            else:
                conn.execute(statement, [value])
    with db.connect() as su:
        after = su.execute("select (select count(*) from awa.ready), m.max_run_time,"
                           " m.retry_base, m.retry_cap from awa.queue_meta m"
                           " where m.queue = 'tbd'").fetchone()
    assert after == before
