"""Terminal rows from the past, written straight into awa.finished as the
superuser in the slot awa._finished_slot gives for the moment they
finished: the state a queue that ran at that time would have left."""

from __future__ import annotations

# Every column set, as a failed job's row has them (a retry needs them all).
INSERT_PAST = """
    insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                              max_attempts, enqueued_at, finished_at, args, ordering_key,
                              last_error, max_run_time, unique_key, unique_window)
    select nextval('awa.job_id_seq'), awa._finished_slot(%(state)s, %(at)s), m.queue_id, 2,
           'past', %(state)s, 1, 1, %(at)s, %(at)s, jsonb_build_object('n', i), '\\x6b',
           'boom', interval '5 minutes', int4send(i), interval '1 hour'
      from awa.queue_meta m, generate_series(1, %(n)s) as i
     where m.queue = %(queue)s
    returning job_id
"""


def past(su, queue: str, state: str, at: str, n: int = 1) -> list[int]:
    """n terminal rows of `queue` that finished at `at` (an SQL timestamptz expression)."""
    at_value = su.execute(f"select {at}").fetchone()[0]
    rows = su.execute(INSERT_PAST, {"queue": queue, "state": state, "at": at_value, "n": n})
    return [r[0] for r in rows.fetchall()]


def kept(su, job_ids: list[int]) -> set[int]:
    return {r[0] for r in su.execute("select job_id from awa.finished where job_id = any(%s)",
                                     [job_ids]).fetchall()}


def slot_of(su, job_id: int) -> int:
    return su.execute("select slot from awa.finished where job_id = %s", [job_id]).fetchone()[0]


def slots_of(su, job_ids: list[int]) -> set[int]:
    """The slots that hold these jobs, in one read; each job must be in
    awa.finished exactly once."""
    rows = su.execute("select job_id, slot from awa.finished where job_id = any(%s)",
                      [job_ids]).fetchall()
    assert sorted(r[0] for r in rows) == sorted(job_ids), "a job is missing or there twice"
    return {r[1] for r in rows}


def next_slot(su, state: str) -> int:
    """The slot of `state`'s ring that is written to next, and when it last was."""
    return su.execute("select awa._finished_slot(%s, now() + awa._finished_slot_seconds(%s)"
                      " * interval '1 second')", [state, state]).fetchone()[0]


def current(su, state: str) -> set[int]:
    """The slots a row carried in the last few seconds may be in: the
    current one, and the one before it when a slot began since (a test
    that runs across a slot's boundary)."""
    return {r[0] for r in su.execute(
        "select awa._finished_slot(%s, t)"
        " from unnest(array[now() - interval '1 minute', now()]) as t", [state])}


RING_BASE = {"completed": 0, "failed": 32, "cancelled": 32, "long": 64}
RING_SLOTS = 32


def carried_on_time(su, job_ids: list[int], ring: str) -> bool:
    """The jobs are in one slot of `ring`, the one a carry puts them in so
    that they go on time: the slot whose next carry begins after their
    retention ends, within two of the ring's periods of it; or, where no
    slot of the ring turns late enough, its current one (carried again at
    its turn). In the long ring a slot last written too soon after the job
    finished is passed over (its drop would come early), so there only
    "after their retention ends" is checked: the drop that takes it then is
    test_a_carried_job_goes_within_two_periods_of_its_retention_and_never_before's.
    Checked at now and a minute before (a test that runs across a period's
    boundary)."""
    slots = slots_of(su, job_ids)
    if len(slots) != 1:
        return False
    [slot] = slots
    index = slot - RING_BASE[ring]
    if not 0 <= index < RING_SLOTS:
        return False
    rows = su.execute(
        "select extract(epoch from f.finished_at"
        " + awa._retention(f.state, m.retain_completed, m.retain_failed))::float8,"
        " extract(epoch from now())::float8, awa._finished_slot_seconds(%s)"
        " from awa.finished f join awa.queue_meta m using (queue_id)"
        " where f.job_id = any(%s)", [ring, job_ids]).fetchall()

    def on_time(kept_until: float, now: float, width: int) -> bool:
        period = int(now // width)
        turn = period + ((index - period) % RING_SLOTS or RING_SLOTS)
        carry_begins = (turn - 1) * width
        if turn == period + RING_SLOTS:
            return True
        return kept_until < carry_begins and (
            ring == "long" or carry_begins <= kept_until + 2 * width)

    return all(any(on_time(k, t, w) for t in (now, now - 60)) for k, now, w in rows)
