"""The job tools against the maintenance calls that rewrite a table by
TRUNCATE (awa.rotate_running, awa.compact_ready, awa.prune_finished), on real
PostgreSQL 17 and 18, in read committed.

Each rewrite holds its table's lock, copies the rows it keeps, truncates and
commits. A job tool that waited for that lock must read the table as the
rewrite left it: a read with the snapshot of the statement that called it,
taken before the wait, finds the table empty and the copied rows invisible,
so awa.cancel_job answered false for a running job (whose worker then
completed it) and for a ready one (which was then claimed), and awa.job,
awa.jobs and awa.count_jobs lost the job.

Also: awa.count_jobs of a terminal state reads at most `up_to` rows of the
history, not every row the queue has in that state.
"""

from __future__ import annotations

import pytest

from tests.support.dead_rows import junk
from tests.support.jobs import behind, claim, enqueue
from tests.support.reads import rows_read

BLOCK = 65_536  # run leases per slot of awa.running (awa._running_block_leases)


def read_behind(db, holder, login, query, args=()):
    """The row `query` returns as `login`, run while `holder` holds a lock it
    waits for (committed once it waits)."""
    with db.connect(login) as c:
        call = behind(db, holder, c, lambda conn: conn.execute(query, args).fetchone())
    assert call.error is None, call.error
    return call.result


def running_in_a_slot_due_to_rotate(db, logins):
    """One running job in slot 0 of awa.running, with the lease sequence moved
    on so that awa.rotate_running carries it to the current slot."""
    with db.connect() as su, db.connect(logins.producer) as p, db.connect(logins.worker) as w:
        job_id = enqueue(p, "rot", "k")[0]
        su.execute("select setval('awa.run_lease_seq', %s)", [4 * BLOCK - 1])
        ((_, lease, *_),) = claim(w, ["rot"], 1)
        su.execute("select setval('awa.run_lease_seq', %s)", [5 * BLOCK + BLOCK // 2])
    return job_id, lease


def test_a_running_job_cancelled_while_its_slot_rotates_is_cancelled(db, logins):
    job_id, lease = running_in_a_slot_due_to_rotate(db, logins)
    with db.connect(logins.maintenance, autocommit=False) as m:
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        (cancelled,) = read_behind(db, m, logins.operator, "select awa.cancel_job(%s)", [job_id])
    with db.connect(logins.worker) as w:
        completed = w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    assert (cancelled, completed) == (True, False)


@pytest.mark.parametrize(("query", "expected"), [
    ("select state from awa.job(%s)", ("running",)),
    ("select count(*) from awa.jobs('rot', 'running') where %s > 0", (1,)),
    ("select awa.count_jobs('rot', 'running') where %s > 0", (1,)),
])
def test_a_running_job_read_while_its_slot_rotates_is_found(db, logins, query, expected):
    job_id, _ = running_in_a_slot_due_to_rotate(db, logins)
    with db.connect(logins.maintenance, autocommit=False) as m:
        assert m.execute("select awa.rotate_running()").fetchone()[0] == 1
        assert read_behind(db, m, logins.reader, query, [job_id]) == expected


def test_a_ready_job_cancelled_while_ready_is_rewritten_is_never_claimed(db, logins):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "cq", "k")[0]
    with db.connect() as su, db.connect(autocommit=False) as horizon:
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")  # keeps the junk rows dead, not removable
        junk(su, 210_000)
        with db.connect(logins.maintenance, autocommit=False) as m:
            assert m.execute("select awa.compact_ready()").fetchone()[0] == 1
            (cancelled,) = read_behind(db, m, logins.operator, "select awa.cancel_job(%s)",
                                       [job_id])
        horizon.rollback()
    with db.connect(logins.worker) as w:
        claimed = [c[0] for c in claim(w, ["cq"])]
    assert (cancelled, claimed) == (True, [])


@pytest.mark.parametrize(("query", "expected"), [
    ("select awa.retry_job(%s)", (True,)),
    ("select state from awa.job(%s)", ("failed",)),
])
def test_a_failed_job_carried_by_a_prune_is_found(db, logins, query, expected):
    with db.connect(logins.producer) as p, db.connect(logins.worker) as w:
        job_id = enqueue(p, "pc", "k", max_attempts=1)[0]
        ((_, lease, *_),) = claim(w, ["pc"], 1)
        w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect() as su:
        # In the slot of the failed ring the next prune empties, and still
        # within the queue's retention: the prune carries it.
        su.execute("select awa.set_retention('pc', null, '30 days')")
        su.execute("update awa.finished set finished_at = now() - interval '186 hours',"
                   " slot = awa._finished_slot('failed', now() - interval '186 hours')")
    with db.connect(logins.maintenance, autocommit=False) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
        assert read_behind(db, m, logins.operator, query, [job_id]) == expected


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_count_jobs_reads_at_most_up_to_rows_of_the_history(db, logins, state):
    with db.connect() as su:
        su.execute("select awa.enqueue('hist', 'k')")
        su.execute("insert into awa.finished (job_id, slot, queue_id, priority, kind, state,"
                   " attempt, max_attempts, enqueued_at, finished_at, args)"
                   " select nextval('awa.job_id_seq'), awa._finished_slot(%(s)s, now()),"
                   " m.queue_id, 2, 'h', %(s)s, 1, 1, now(), now(), '{}' from awa.queue_meta m,"
                   " generate_series(1, 100000) where m.queue = 'hist'", {"s": state})
        su.execute("analyze awa.finished")
        part = su.execute("select 'awa.finished_' || lpad(awa._finished_slot(%s, now())::text,"
                          " 2, '0')", [state]).fetchone()[0]
    with db.connect(logins.operator) as op:
        call = f"select awa.count_jobs('hist', '{state}', up_to => 10)"
        assert op.execute(call).fetchone()[0] == 10
        assert rows_read(op, part, call) <= 100
