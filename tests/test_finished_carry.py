"""The carry of a long retention in batches (ADR 040), on real PostgreSQL 17
and 18: a slot's rows still retained move to the slot they go with (ADR 057) a bounded
batch at a time (heap blocks, payload bytes), the prune truncates only once
the batches have read the whole slot and takes what they left (rows written
after, a retention raised meanwhile) under the slot's lock, and a retry
that waited for a row the carry moved finds it where it went.

Rows from the past are written straight into awa.finished as the superuser
(tests/support/finished.py).
"""

from __future__ import annotations

import psycopg
import pytest

from tests.support.finished import (
    carried_on_time,
    current,
    kept,
    next_slot,
    past,
    slot_of,
    slots_of,
)
from tests.support.jobs import behind

BLOCK = "(f.ctid::text::point)[0]"


@pytest.fixture
def su(db):
    with db.connect() as conn:
        for q in ("short", "long"):
            conn.execute("select awa.set_enqueue_shards(%s, 1)", [q])
        yield conn


def batch(su, slot: int) -> tuple[int, bool]:
    """One batch of the slot's carry (a time already passed: one batch)."""
    return su.execute("select carried, done from awa._carry_slot(%s, '-infinity')",
                      [slot]).fetchone()


def big_args(su, job_ids: list[int]) -> None:
    """Args of about 6 MB each once stored (md5 text does not compress much)."""
    su.execute("update awa.finished set args = jsonb_build_object('s', (select string_agg("
               "md5(i::text || j::text), '') from generate_series(1, 200000) as i))"
               " from (select 1) as x (j) where job_id = any(%s)", [job_ids])


def test_a_slot_is_carried_a_bounded_batch_of_blocks_at_a_time_and_then_emptied(
        db, su, logins):
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    target = next_slot(su, "completed")
    ago = "now() - interval '31 hours'"
    keep = past(su, "long", "completed", ago, 30000)
    drop = past(su, "short", "completed", ago, 10000)
    part = f"awa.finished_{target:02d}"
    blocks = su.execute("select awa._carry_blocks()").fetchone()[0]
    heap = su.execute(f"select max({BLOCK}) + 1 from {part} as f").fetchone()[0]
    assert heap > 2 * blocks  # several batches' worth
    first = su.execute(f"select array_agg(job_id) from {part} f join awa.queue_meta m"
                       f" using (queue_id) where m.queue = 'long' and {BLOCK} < %s",
                       [blocks]).fetchone()[0]
    # The first batch moves the retained rows of the first blocks, no other.
    assert batch(su, target) == (len(first), False)
    assert carried_on_time(su, first, "completed")
    assert su.execute(f"select count(*) from {part} f where f.job_id = any(%s)",
                      [first]).fetchone()[0] == 0
    # A prune of the slot before the batches are through makes one more
    # batch and truncates nothing.
    assert su.execute("select awa._prune_slot(%s, '-infinity')", [target]).fetchone()[0] == 0
    assert kept(su, drop) == set(drop)
    moved = su.execute("select count(*) from awa.finished f join awa.queue_meta m"
                       " using (queue_id) where m.queue = 'long' and f.slot <> %s",
                       [target]).fetchone()[0]
    assert len(first) < moved < len(keep)
    with db.connect(logins.maintenance) as m:
        while carried := m.execute("select awa.carry_finished()").fetchone()[0]:
            moved += carried
        assert moved == len(keep)
        # A row a transaction begun one ring ago writes after the batches
        # have passed: the prune's last look under the lock carries it.
        late = past(su, "long", "completed", ago, 1)
        assert m.execute("select awa.prune_finished()").fetchone()[0] == len(drop)
    assert kept(su, keep + late + drop) == set(keep + late)
    assert carried_on_time(su, keep + late, "completed")
    assert su.execute("select count(*), count(distinct job_id) from awa.finished").fetchone() \
        == (len(keep) + 1, len(keep) + 1)
    assert su.execute("select count(*) from awa.finished_carry").fetchone()[0] == 0


def test_a_batch_stops_at_the_pass_bytes_of_payload(db, su, logins):
    """Failed rows carry their args: a batch moves at most awa._pass_bytes()
    of them before its last row, and the next batch goes on in the same
    blocks from the row after."""
    su.execute("select awa.set_retention('long', '1 hour', '10 days')")
    target = next_slot(su, "failed")
    ids = past(su, "long", "failed", "now() - interval '186 hours'", 5)
    big_args(su, ids)
    sizes = [r[0] for r in su.execute(
        f"select pg_column_size(args) from awa.finished_{target:02d} order by ctid").fetchall()]
    limit = su.execute("select awa._pass_bytes()").fetchone()[0]
    assert all(4_000_000 < s < limit for s in sizes)
    batches = []
    done = False
    while not done:
        carried, done = batch(su, target)
        if carried:
            batches.append(carried)
    assert sum(batches) == 5 and len(batches) >= 2
    start = 0
    for carried in batches:
        assert carried >= 1 and sum(sizes[start:start + carried - 1]) < limit
        if start + carried < 5:  # cut: one more row would pass the bound
            assert sum(sizes[start:start + carried]) >= limit
        start += carried
    assert carried_on_time(su, ids, "failed")


def test_a_retry_that_waited_for_the_carry_finds_the_job_where_it_went(db, su, logins):
    """The carry deletes the row from its slot and inserts it in the current
    one: a retry locking it waits, then finds it gone from its statement's
    view; its second look, with a snapshot taken after the carry's commit,
    retries the job."""
    su.execute("select awa.set_retention('long', '1 hour', '10 days')")
    target = next_slot(su, "failed")
    [job] = past(su, "long", "failed", "now() - interval '186 hours'")
    with db.connect(autocommit=False) as carrier, db.connect(logins.operator) as op:
        assert carrier.execute("select carried from awa._carry_slot(%s, '-infinity')",
                               [target]).fetchone()[0] == 1
        call = behind(db, carrier, op,
                      lambda c: c.execute("select awa.retry_job(%s)", [job]).fetchone()[0])
    assert call.error is None and call.result is True
    assert kept(su, [job]) == set()
    assert su.execute("select count(*) from awa.ready where job_id = %s", [job]
                      ).fetchone()[0] == 1


def test_a_retention_raised_after_the_batches_is_kept_by_the_truncate(db, su, logins):
    """The batches judged the rows at their time; under the slot's lock the
    prune judges them again. More than awa._carry_rows_locked() still
    retained then: it truncates nothing and the batches read the slot again."""
    su.execute("select awa.set_retention('short', '1 hour', '1 day')")
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    target = next_slot(su, "completed")
    ago = "now() - interval '31 hours'"
    over = su.execute("select awa._carry_rows_locked()").fetchone()[0] + 1
    raised = past(su, "short", "completed", ago, over)
    keep = past(su, "long", "completed", ago, 10)
    with db.connect(logins.maintenance) as m:
        while m.execute("select awa.carry_finished()").fetchone()[0]:
            pass
        assert kept(su, keep) == set(keep) and slot_of(su, keep[0]) != target
        su.execute("select awa.set_retention('short', '48 hours', '1 day')")
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
        assert kept(su, raised) == set(raised)
        assert m.execute("select awa.carry_finished()").fetchone()[0] == over
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert kept(su, raised + keep) == set(raised + keep)
    assert carried_on_time(su, raised, "completed")


def test_the_carry_runs_for_the_maintenance_role_only_and_one_at_a_time(db, su, logins):
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    past(su, "long", "completed", "now() - interval '31 hours'", 10)
    for login in (logins.producer, logins.worker, logins.operator, logins.reader):
        with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select awa.carry_finished()")
    with db.connect(logins.maintenance, autocommit=False) as first, \
            db.connect(logins.maintenance) as second:
        assert first.execute("select awa.prune_finished()").fetchone()[0] == 0
        assert second.execute("select awa.carry_finished()").fetchone()[0] == 0
        first.rollback()
        assert second.execute("select awa.carry_finished()").fetchone()[0] == 10


def test_awa_maintain_carries_again_at_once_while_the_carry_moves_rows(db, su, logins):
    """A carry pass that moved rows runs again at once (here with a cadence
    of 60 minutes, the second pass comes only that way), until one moves
    none; the prune is off, so the carry alone moved them."""
    from tests.support.maintain import MaintainProcess

    su.execute("select awa.set_retention('long', '1 hour', '10 days')")
    target = next_slot(su, "failed")
    ids = past(su, "long", "failed", "now() - interval '186 hours'", 4)
    with MaintainProcess(db.dsn(logins.maintenance), "--carry-every", "60m",
                         "--prune-every", "off") as m:
        m.wait(lambda: m.handled("carry") == 4 and m.passes("carry", "ran") == 2,
               "the carry and the pass after it", timeout=60)
    assert carried_on_time(su, ids, "failed") and target not in slots_of(su, ids)


def test_a_slot_whose_every_row_the_carry_moved_is_truncated(db, su, logins):
    """Moved, its rows are dead versions, which only its TRUNCATE removes
    (a held snapshot would keep them from vacuum)."""
    su.execute("select awa.set_retention('long', '48 hours', '1 day')")
    target = next_slot(su, "completed")
    part = f"awa.finished_{target:02d}"
    keep = past(su, "long", "completed", "now() - interval '31 hours'", 20000)
    with db.connect(logins.maintenance) as m:
        while m.execute("select awa.carry_finished()").fetchone()[0]:
            pass
        assert su.execute(f"select count(*) from {part}").fetchone()[0] == 0
        assert su.execute("select pg_relation_size(%s)", [part]).fetchone()[0] > 0
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert kept(su, keep) == set(keep)
    assert su.execute("select pg_relation_size(%s)", [part]).fetchone()[0] == 0
    assert su.execute("select count(*) from awa.finished_carry where slot = %s",
                      [target]).fetchone()[0] == 0


def test_the_last_look_under_the_lock_carries_no_more_payload_than_a_batch(db, su, logins):
    """A retention raised after the batches leaves the last look 32 MB of
    failed jobs' args to carry: past awa._pass_bytes() it truncates nothing
    and the batches move them, a bounded batch at a time."""
    su.execute("select awa.set_retention('short', '1 hour', '10 days')")
    su.execute("select awa.set_retention('long', '1 hour', '1 day')")
    target = next_slot(su, "failed")
    ids = past(su, "long", "failed", "now() - interval '186 hours'", 5)
    big_args(su, ids)
    limit = su.execute("select awa._pass_bytes()").fetchone()[0]
    assert su.execute("select sum(pg_column_size(args)) from awa.finished"
                      " where job_id = any(%s)", [ids]).fetchone()[0] > limit
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.carry_finished()").fetchone()[0] == 0
        su.execute("select awa.set_retention('long', '1 hour', '10 days')")
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
        assert slots_of(su, ids) == {target}
        moved = 0
        while carried := m.execute("select awa.carry_finished()").fetchone()[0]:
            moved += carried
        assert moved == 5
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert carried_on_time(su, ids, "failed")


def test_retry_jobs_waits_for_rows_a_carry_holds_rather_than_say_none_is_left(
        db, su, logins):
    """A 0 from awa.retry_jobs means none is left to retry: rows a carry
    holds (moving them out of the slot) are waited for, then retried
    where they went."""
    su.execute("select awa.set_retention('long', '1 hour', '10 days')")
    target = next_slot(su, "failed")
    ids = past(su, "long", "failed", "now() - interval '186 hours'", 3)
    with db.connect(autocommit=False) as carrier, db.connect(logins.operator) as op:
        assert carrier.execute("select carried from awa._carry_slot(%s, '-infinity')",
                               [target]).fetchone()[0] == 3
        call = behind(db, carrier, op,
                      lambda c: c.execute("select awa.retry_jobs('long')").fetchone()[0])
    assert call.error is None and call.result == 3
    assert kept(su, ids) == set()
    assert su.execute("select count(*) from awa.ready where job_id = any(%s)", [ids]
                      ).fetchone()[0] == 3


@pytest.mark.parametrize("state, ago", [("completed", "31 hours"), ("failed", "186 hours")])
def test_a_job_kept_past_its_rings_next_turn_is_carried_to_the_long_ring(
        db, su, logins, state, ago):
    """Kept past the current slot's next turn (31 hours on for a completed
    job, 7.75 days for a failed one), a job goes to the long ring, whose
    day-wide slots come round every 32 days: copied once a month at most,
    not every ring round. Kept less, it stays in its own ring."""
    completed = state == "completed"
    su.execute("select awa.set_retention('long', %s, %s)",
               ["30 days", "1 day"] if completed else ["1 hour", "30 days"])
    su.execute("select awa.set_retention('short', %s, %s)",
               ["48 hours", "1 day"] if completed else ["1 hour", "9 days"])
    long_kept = past(su, "long", state, f"now() - interval '{ago}'", 3)
    short_kept = past(su, "short", state, f"now() - interval '{ago}'", 3)
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    assert kept(su, long_kept + short_kept) == set(long_kept + short_kept)
    assert carried_on_time(su, long_kept, "long")
    assert all(64 <= slot <= 95 for slot in current(su, "long"))
    assert carried_on_time(su, short_kept, state)


def test_the_long_ring_drops_a_slot_past_every_retention_and_carries_its_next(
        db, su, logins):
    su.execute("select awa.set_retention('long', '90 days', '1 day')")
    su.execute("select awa.set_retention('short', '10 days', '1 day')")
    # A day 20 days ago: within the longest retention (90 days), kept.
    [recent] = past(su, "short", "completed", "now() - interval '25 days'")
    su.execute("update awa.finished set slot = awa._finished_slot('long', now()"
               " - interval '20 days') where job_id = %s", [recent])
    # The long ring's next slot, written 31 days ago: carried, each by its
    # own retention.
    target = su.execute("select awa._finished_slot('long', now() + interval '1 day')"
                        ).fetchone()[0]
    [kept_long] = past(su, "long", "completed", "now() - interval '40 days'")
    [gone] = past(su, "short", "completed", "now() - interval '40 days'")
    su.execute("update awa.finished set slot = %s where job_id = any(%s)",
               [target, [kept_long, gone]])
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
    assert kept(su, [recent, kept_long, gone]) == {recent, kept_long}
    assert slot_of(su, kept_long) in current(su, "long")
    su.execute("select awa.set_retention('long', '15 days', '1 day')")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
    assert kept(su, [recent, kept_long]) == {kept_long}


@pytest.mark.parametrize("state, retention, finished, carried_after", [
    # Kept 30 days, carried at its failed slot's turn (7.75 days on): not
    # held 30 days from the long slot's day.
    ("failed", ("1 hour", "30 days"), "35 days", "186 hours"),
    # Kept 3 days, carried at 31 hours: not held by the 7 days failed jobs
    # are kept by default.
    ("completed", ("3 days", None), "108 hours", "31 hours"),
])
def test_a_job_in_the_long_ring_goes_within_a_day_of_its_retention(
        db, su, logins, state, retention, finished, carried_after):
    """A long slot's drop counts the time its jobs had spent before they got
    there (30 periods of their own ring at least), so a job goes once its
    retention and its day-wide slot are past."""
    su.execute("select awa.set_retention('long', %s, %s)", list(retention))
    [job] = past(su, "long", state, f"now() - interval '{finished}'")
    slot = su.execute(
        "select awa._carried_slot(f.state, f.finished_at, f.finished_at + awa._retention(f.state,"
        " m.retain_completed, m.retain_failed), f.finished_at + %s::interval)"
        " from awa.finished f join awa.queue_meta m using (queue_id) where f.job_id = %s",
        [carried_after, job]).fetchone()[0]
    assert 64 <= slot <= 95
    su.execute("update awa.finished set slot = %s where job_id = %s", [slot, job])
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
    with db.connect(logins.reader) as r:
        assert r.execute("select count(*) from awa.job(%s)", [job]).fetchone()[0] == 0
        assert r.execute("select awa.count_jobs('long', %s)", [state]).fetchone()[0] == 0
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.retry_job(%s)", [job]).fetchone()[0] is False
    assert kept(su, [job]) == set()


WIDTH = {"completed": 3600, "failed": 21600, "cancelled": 21600, "long": 86400}


@pytest.mark.parametrize("state, retention", [
    ("completed", "32 hours"), ("completed", "48 hours"), ("completed", "33 days"),
    ("completed", "45 days"), ("failed", "8 days"), ("failed", "10 days"),
    ("failed", "30 days"), ("cancelled", "38 days"), ("failed", "90 days"),
])
@pytest.mark.parametrize("hour", ["07:27", "20:41"])
def test_a_carried_job_goes_within_two_periods_of_its_retention_and_never_before(
        db, su, state, retention, hour):
    """One job's life through the rings, time given to the real prune
    decision (awa._prune_action) and carry (awa._carry_batch) a period at
    a time. A carry put a job in the current slot, which lives as long as
    the jobs that finish there now: kept 32 hours it stayed until about 62,
    kept 33 days until about 63 days (into the long ring again). Now it goes
    at the turn of the slot that turns first after its retention ends."""
    completed = state == "completed"
    su.execute("select awa.set_retention('long', %s, %s)",
               [retention, None] if completed else ["1 hour", retention])
    # Two times of day: a day-wide slot's bounds fall on either side of the
    # margins the long ring counts.
    [job] = past(su, "long", state, f"date_trunc('day', now()) + interval '{hour}'")
    finished, kept_until = su.execute(
        "select f.finished_at, f.finished_at + awa._retention(f.state, m.retain_completed,"
        " m.retain_failed) from awa.finished f join awa.queue_meta m using (queue_id)"
        " where f.job_id = %s", [job]).fetchone()
    at, gone, copies = finished, None, 0
    while gone is None:
        slot = slot_of(su, job)
        width = WIDTH[su.execute("select awa._finished_ring(%s)", [slot]).fetchone()[0]]
        # The middle of the ring's next period: inside each carry window.
        at = su.execute("select to_timestamp((floor(extract(epoch from %s::timestamptz) / %s)"
                        " + 1.5) * %s)", [at, width, width]).fetchone()[0]
        action = su.execute("select awa._prune_action(%s, %s)", [slot, at]).fetchone()[0]
        if action == "drop":
            gone = at
        elif action == "carry":
            moved = su.execute("select moved from awa._carry_batch(%s, '(0,0)',"
                               " '(4294967295,0)', %s)", [slot, at]).fetchone()[0]
            copies += moved
            if not moved:  # left to the TRUNCATE at the slot's turn
                gone = su.execute("select to_timestamp(ceil(extract(epoch from %s::timestamptz)"
                                  " / %s) * %s)", [at, width, width]).fetchone()[0]
    assert gone >= kept_until, (gone, kept_until)
    assert (gone - kept_until).total_seconds() <= 2.5 * width, (gone - kept_until, width)
    su.execute("delete from awa.finished where job_id = %s", [job])
