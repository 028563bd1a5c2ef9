"""Retention of terminal jobs and their removal by rotation, on real
PostgreSQL 17 and 18: what a finished row keeps, awa.set_retention's
checks, awa.prune_finished emptying whole slots (at once when everything in
a slot is past retention; the ring's next slot after carrying the rows still
kept), skipping a slot it cannot lock at once, one prune at a time, and no
job lost while workers complete jobs during prunes.

Rows from the past are written straight into awa.finished as the superuser,
in the slot awa._finished_slot gives for the moment they finished: the
state a queue that ran at that time would have left.
"""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.finished import (
    INSERT_PAST,
    carried_on_time,
    kept,
    next_slot,
    past,
    slot_of,
    slots_of,
)
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import claim, enqueue
from tests.support.waiting import wait_until


@pytest.fixture
def su(db):
    with db.connect() as conn:
        for q in ("short", "long"):
            conn.execute("select awa.set_enqueue_shards(%s, 1)", [q])
        yield conn


def test_a_failed_job_keeps_what_a_retry_needs_and_a_completed_one_stays_narrow(db, logins):
    with db.connect(logins.producer) as p:
        done = enqueue(p, "keep", args=Jsonb({"n": 1}), ordering_key=b"k1")[0]
        failed = enqueue(p, "keep", args=Jsonb({"n": 2}), ordering_key=b"k2", max_attempts=1)[0]
    with db.connect(logins.worker) as w:
        jobs = {c[0]: c for c in claim(w, ["keep"])}
        assert w.execute("select awa.complete(%s, %s)", [done, jobs[done][1]]).fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, 'boom')", [failed, jobs[failed][1]]).fetchone()[0]
    with db.connect() as su:
        rows = dict((r[0], r[1:]) for r in su.execute(
            "select job_id, state, args, ordering_key, max_attempts, attempt, last_error, slot"
            " from awa.finished").fetchall())
        assert rows[done][:6] == ("completed", None, None, 25, 1, None)
        assert rows[failed][:6] == ("failed", {"n": 2}, b"k2", 1, 1, "boom")
        assert rows[done][6] < 32 <= rows[failed][6]
        counts = su.execute("select completed, failed, cancelled from awa.queue_overview"
                            " where queue = 'keep'").fetchone()
    assert counts == (1, 1, 0)


def test_finished_rows_keep_a_known_slot_and_state_without_check_constraints(db, su, logins):
    """awa.finished has no CHECK constraints (compiled again for every insert
    routed to a partition): a slot outside 0-63 has no partition, and
    awa._finish refuses a state other than failed or cancelled, writing
    nothing."""
    assert su.execute("select count(*) from pg_constraint c join pg_class t on t.oid = c.conrelid"
                      " join pg_namespace n on n.oid = t.relnamespace"
                      " where n.nspname = 'awa' and t.relname ~ '^finished(_[0-9]+)?$'"
                      " and c.contype = 'c'").fetchone()[0] == 0
    for slot in (-1, 96):
        with pytest.raises(psycopg.errors.CheckViolation, match="no partition"), su.transaction():
            su.execute(INSERT_PAST.replace("awa._finished_slot(%(state)s, %(at)s)", str(slot)),
                       {"queue": "short", "state": "failed", "at": "2026-01-01", "n": 1})
    with db.connect(logins.producer) as p:
        job = enqueue(p, "short")[0]
    with db.connect(logins.worker) as w:
        lease = claim(w, ["short"])[0][1]
    for state in ("completed", "ready", None):
        with pytest.raises(psycopg.errors.InvalidParameterValue,
                           match=f"state must be failed or cancelled, got {state or 'null'}"), \
                su.transaction():
            su.execute("select awa._finish(r, %s, 'boom') from awa.running r where r.job_id = %s",
                       [state, job])
    finished = su.execute("select count(*) from awa.finished where job_id = %s", [job])
    assert finished.fetchone() == (0,)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.fail(%s, %s, 'boom', now())", [job, lease]).fetchone()[0]


def test_set_retention_checks_its_input_and_covers_every_partition(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('parts', 3)")
        op.execute("select awa.set_retention('parts', '2 hours', '3 days')")
        rows = op.execute("select queue, retain_completed, retain_failed from awa.queue_overview"
                          " where logical_queue = 'parts' order by queue").fetchall()
        assert [r[0] for r in rows] == ["parts", "parts__p1", "parts__p2"]
        assert len({r[1:] for r in rows}) == 1
        assert str(rows[0][1]) == "2:00:00" and rows[0][2].days == 3
        for bad in (("0 seconds", "1 day"), ("1 hour", "-1 day"), ("11 years", "1 day")):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="retention must"):
                op.execute("select awa.set_retention('parts', %s, %s)", bad)
        with pytest.raises(psycopg.errors.UndefinedObject, match="queue 'nope' does not exist"):
            op.execute("select awa.set_retention('nope', '1 hour', '1 day')")
        op.execute("select awa.set_retention('parts', null, null)")
        assert op.execute("select retain_completed, retain_failed from awa.queue_overview"
                          " where queue = 'parts__p2'").fetchone() == (
            op.execute("select interval '24 hours', interval '7 days'").fetchone())
    for login in (logins.producer, logins.worker, logins.maintenance, logins.reader):
        with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select awa.set_retention('parts', '1 hour', '1 day')")


def test_a_partition_made_after_set_retention_keeps_the_queues_retention(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('later', 2)")
        op.execute("select awa.set_retention('later', '2 hours', '3 days')")
        op.execute("select awa.set_queue_partitions('later', 4)")
        rows = op.execute("select queue, retain_completed, retain_failed from awa.queue_overview"
                          " where logical_queue = 'later' order by queue").fetchall()
    assert [r[0] for r in rows] == ["later", "later__p1", "later__p2", "later__p3"]
    assert {(str(r[1]), r[2].days) for r in rows} == {("2:00:00", 3)}


def test_a_slot_past_every_retention_goes_whole(db, su, logins):
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '1 hour', '1 day')")
    old = past(su, "short", "completed", "now() - interval '3 hours'", 50)
    recent = past(su, "long", "completed", "now()", 5)
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 50
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert kept(su, old) == set()
    assert kept(su, recent) == set(recent)


def test_a_slot_with_a_job_still_in_retention_stays_until_its_ring_comes_round(db, su, logins):
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    both = past(su, "short", "completed", "now() - interval '3 hours'")
    both += past(su, "long", "completed", "now() - interval '3 hours'")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert kept(su, both) == set(both)


@pytest.mark.parametrize("state, keep, drop", [
    ("completed", "48 hours", "1 hour"),
    ("failed", "10 days", "1 day"),
    ("cancelled", "10 days", "1 day"),
])
def test_the_next_slot_keeps_what_is_still_retained_and_drops_the_rest(
        db, su, logins, state, keep, drop):
    """The ring's next slot was last written one ring ago (31 hours for
    completed jobs, 7.75 days for failed and cancelled ones): before it is
    written again, its rows still within their queue's retention move to the
    current slot, and the rest go."""
    completed = state == "completed"
    su.execute("select awa.set_retention('long', %s, %s)",
               [keep, "1 day"] if completed else ["1 hour", keep])
    su.execute("select awa.set_retention('short', %s, %s)",
               [drop, "1 day"] if completed else ["1 hour", drop])
    target = next_slot(su, state)
    ago = "now() - interval '31 hours'" if completed else "now() - interval '186 hours'"
    kept_ids = past(su, "long", state, ago, 3)
    dropped = past(su, "short", state, ago, 4)
    assert slots_of(su, kept_ids + dropped) == {target}
    # Every column but the slot moves with the row (the catalog's list: a
    # column the move forgets fails here).
    rows = ("select to_jsonb(f) - 'slot' from awa.finished f"
            " where job_id = any(%s) order by job_id")
    before = su.execute(rows, [kept_ids]).fetchall()
    assert all(v is not None for r in before for v in r[0].values())
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 4
    assert kept(su, kept_ids + dropped) == set(kept_ids)
    assert carried_on_time(su, kept_ids, state)
    assert su.execute(rows, [kept_ids]).fetchall() == before


def test_a_prune_carries_before_it_empties_a_slot(db, su, logins):
    """An emptied slot stays locked (ACCESS EXCLUSIVE) until the prune ends,
    and every reader of awa.finished (the job tools, awa.run_outcome) waits
    for it: the batches of a carry come before the first TRUNCATE. A trigger
    on the slot the carry writes to fails the prune if it holds such a lock
    on a slot of awa.finished when it carries (it did: the slots in order,
    the completed ring's due slot emptied before the failed ring's next one
    was carried, and readers waited up to awa._carry_time())."""
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '1 hour', '10 days')")
    old = past(su, "short", "completed", "now() - interval '3 hours'", 5)
    carried = past(su, "long", "failed", "now() - interval '186 hours'", 3)
    assert slots_of(su, carried) == {next_slot(su, "failed")}
    current = su.execute("select awa._finished_slot('failed', now())").fetchone()[0]
    su.execute("""
        create function public.no_carry_behind_a_truncate() returns trigger
        language plpgsql as $$
        begin
            if exists (select from pg_locks as l join pg_class as c on c.oid = l.relation
                        where l.pid = pg_backend_pid() and l.mode = 'AccessExclusiveLock'
                          and c.relnamespace = 'awa'::regnamespace
                          and c.relname like 'finished\\_%') then
                raise exception 'carried while a slot of awa.finished was held';
            end if;
            return null;
        end $$""")
    su.execute(f"create trigger no_carry_behind_a_truncate after insert"
               f" on awa.finished_{current:02d} for each row"
               f" execute function public.no_carry_behind_a_truncate()")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 5
    assert kept(su, old) == set()
    assert carried_on_time(su, carried, "failed")


def test_a_slot_a_reader_holds_is_skipped_then_pruned(db, su, logins):
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '1 hour', '1 day')")
    old = past(su, "short", "completed", "now() - interval '3 hours'", 10)
    part = f"awa.finished_{slot_of(su, old[0]):02d}"
    last_run = "select last_at from awa.maintenance_runs where name = 'prune'"
    su.execute("update awa.maintenance_runs set last_at = now() - interval '1 hour'"
               " where name = 'prune'")
    before = su.execute(last_run).fetchone()[0]
    with db.connect(autocommit=False) as reader, db.connect(logins.maintenance) as m:
        reader.execute(f"select count(*) from {part}")  # holds its AccessShareLock
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
        assert kept(su, old) == set(old)
        # A due slot held: no run recorded, so that a slot held for good
        # shows as a prune that does not run (AwaMaintenanceNotRunning).
        assert su.execute(last_run).fetchone()[0] == before
        reader.rollback()
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 10
    assert kept(su, old) == set()
    assert su.execute(last_run).fetchone()[0] > before


def test_one_prune_at_a_time(db, su, logins):
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '1 hour', '1 day')")
    old = past(su, "short", "completed", "now() - interval '3 hours'", 10)
    with db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        assert first.execute("select awa.prune_finished()").fetchone()[0] == 10
        assert second.execute("select awa.prune_finished()").fetchone()[0] == 0
        first.rollback()
    assert kept(su, old) == set(old)


def test_no_job_is_lost_while_workers_complete_jobs_during_prunes(db, su, logins):
    """4 workers claim and complete 2,000 jobs while a maintenance login
    prunes in a loop; rows put in the ring's next slot, some to drop and
    some to carry, keep the prunes busy. Every completed job is in
    awa.finished at the end, and the counter says 2,000."""
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    total = 2000
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('work'::text, array[%s]),"
                  " array_fill('k'::text, array[%s]))", [total, total])
    stop = threading.Event()
    removed: list[int] = []

    def prune() -> None:
        with db.connect(logins.maintenance) as m:
            while not stop.is_set():
                past(su_thread, "short", "completed", "now() - interval '31 hours'", 20)
                past(su_thread, "long", "completed", "now() - interval '31 hours'", 5)
                removed.append(m.execute("select awa.prune_finished()").fetchone()[0])

    def work() -> int:
        done = 0
        with db.connect(logins.worker) as w:
            while rows := claim(w, ["work"], 5):
                for job_id, lease, *_ in rows:
                    assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
                    done += 1
        return done

    with db.connect() as su_thread, ThreadPoolExecutor(5) as pool:
        pruner = pool.submit(prune)
        workers = [pool.submit(work) for _ in range(4)]
        assert sum(f.result() for f in workers) == total
        stop.set()
        pruner.result()
    assert sum(removed) > 0
    assert su.execute("select count(*), count(distinct job_id) from awa.finished f"
                      " join awa.queue_meta m using (queue_id) where m.queue = 'work'"
                      ).fetchone() == (total, total)
    assert su.execute("select completed from awa.queue_overview where queue = 'work'"
                      ).fetchone()[0] == total


# Completed slots of 2 seconds: a period turns within a test.
SHORT_SLOTS = """
    create or replace function awa._finished_slot_seconds(state text)
    returns integer
    language sql
    immutable parallel safe
    as $$
        select case when state operator(pg_catalog.=) 'completed' then 2 else 21600 end
    $$
"""


def test_a_prune_begun_before_the_slot_turned_keeps_the_jobs_completed_since(db, su, logins):
    """A prune decides which slots are due from the clock once it holds a
    slot's lock, not from its transaction's start. Here a maintenance
    transaction begins in one period of the completed ring (2 s, this
    database's own), workers complete jobs after the next period has begun,
    then the transaction prunes: by its start time the jobs' slot is the
    ring's oldest, and with a retention of 30 s, due at once. They stay."""
    su.execute(SHORT_SLOTS)
    su.execute("select awa.set_enqueue_shards('work', 1)")
    for q in ("short", "long", "work"):
        su.execute("select awa.set_retention(%s, '30 seconds', '1 day')", [q])
    with db.connect(logins.producer) as p:
        for _ in range(3):
            enqueue(p, "work")
    with db.connect(logins.maintenance, autocommit=False) as m, \
            db.connect(logins.worker) as w:
        began = su.execute("select awa._finished_slot('completed', %s)",
                           m.execute("select now()").fetchone()).fetchone()[0]
        wait_until(lambda: su.execute("select awa._finished_slot('completed', clock_timestamp())"
                                      ).fetchone()[0] != began,
                   10, "the next period of the completed ring")
        done = []
        for job_id, lease, *_ in claim(w, ["work"], 3):
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
            done.append(job_id)
        assert len(done) == 3
        assert began not in slots_of(su, done)
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
        m.commit()
    assert kept(su, done) == set(done)


@pytest.mark.parametrize("call", ["awa.prune_finished()", "awa.carry_finished()"])
@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_prune_from_a_snapshot_older_than_its_locks_is_refused(
        db, su, logins, isolation, call):
    """Its copy of the rows still retained would read with the transaction's
    snapshot, taken before the slot's lock, and miss rows committed between
    the two; the TRUNCATE would then remove them."""
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '1 hour', '1 day')")
    old = past(su, "short", "completed", "now() - interval '3 hours'", 5)
    assert_refused_outside_read_committed(db, logins.maintenance, call, isolation)
    assert kept(su, old) == set(old)


def test_queue_counts_counts_every_row_for_a_reader_and_the_overview_agrees(db, logins):
    """awa.queue_counts (reader, operator) counts each state's rows exactly,
    partitions included; the overview's lane span and counters agree on a
    queue whose producers committed; runtime roles other than these may
    not call it."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('counted', 2)")
    with db.connect(logins.producer) as p:
        for i in range(12):
            enqueue(p, "counted", ordering_key=f"k{i}".encode())
        enqueue(p, "counted", run_at="2999-01-01T00:00:00Z")
    with db.connect(logins.worker) as w:
        jobs = claim(w, ["counted"], 5)
        for job_id, lease, *_ in jobs[:3]:
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, 'x')", jobs[3][:2]).fetchone()[0]
    with db.connect(logins.reader) as r:
        rows = r.execute("select * from awa.queue_counts('counted')").fetchall()
        totals = [sum(col) for col in zip(*(row[1:] for row in rows), strict=True)]
        overview = r.execute(
            "select sum(ready), sum(running), sum(scheduled), sum(completed), sum(failed)"
            " from awa.queue_overview where logical_queue = 'counted'").fetchone()
    assert [row[0] for row in rows] == ["counted", "counted__p1"]
    # ready, running, scheduled (the future job and the failed one's retry), kept terminal
    assert totals == [7, 1, 2, 3, 0, 0]
    assert list(overview) == [7, 1, 2, 3, 0]
    for login in (logins.producer, logins.worker, logins.maintenance):
        with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select * from awa.queue_counts('counted')")


def test_set_retention_checks_and_stores_the_seconds_it_applies(db, logins):
    """A retention was checked by PostgreSQL's comparison of intervals (a
    month 30 days, a year 360) but added to finished_at by the calendar, and
    a day by the session's time zone: '-1 year 363 days' passed as 3 days
    and kept a job until 2 days before it finished; '1 mon' kept 28 to 31
    days. It is checked and stored as its seconds now (awa._in_seconds: a
    month 30 days, a year 365.25), as the retry policy and max run time are."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('kept', 1)")
        for bad in (("-1 year 363 days", "1 day"), ("1 hour", "1 mon -30 days"),
                    ("1 hour", "10 years 1 second")):
            with pytest.raises(psycopg.errors.InvalidParameterValue,
                               match="retention must be above 0 and at most 10 years"):
                op.execute("select awa.set_retention('kept', %s, %s)", bad)
        op.execute("select awa.set_retention('kept', '1 mon', '10 years')")
        assert op.execute("select retain_completed::text, retain_failed::text"
                          " from awa.queue_overview where queue = 'kept'").fetchone() == (
            "720:00:00", "87660:00:00")


def test_the_default_failed_retention_is_168_hours_in_any_time_zone(db, su, logins):
    """The default was interval '7 days', added in the pruning session's
    time zone: across a change of clocks that day is shorter, and a failed
    job went while it still had hours of its retention left. The zone here
    moves its clocks 12 hours forward three days ago (a POSIX rule, so the
    test needs no real zone's calendar)."""
    day = min((datetime.date.today() - datetime.timedelta(days=3)).timetuple().tm_yday, 365)
    zone = f"XST6XDT-6,J{day}/0,J{(day + 179) % 365 + 1}/0"
    kept_for_now = past(su, "short", "failed", "now() - interval '167 hours'")
    gone = past(su, "short", "failed", "now() - interval '176 hours'")
    with db.connect(logins.maintenance) as m:
        m.execute("select set_config('timezone', %s, false)", [zone])
        assert m.execute("select now() - interval '7 days' < now() - interval '160 hours'"
                         ).fetchone()[0] is False, "the zone changes no clock this week"
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
    assert kept(su, kept_for_now + gone) == set(kept_for_now)
