"""awa.run_outcome on PostgreSQL 17 and 18, called by a worker's login: what
the database holds for one run (job id, run lease, attempt) in each state a
run can end in, or still be in: completed by this run, failed with a retry
(scheduled, then ready, then claimed again), failed for good, rescued and
claimed again, cancelled while it ran or while it waited for its retry,
still running, an unknown or removed job, a wrong lease or attempt; bad
input; who may call it; and what it reads (the queue's shape, not its
backlog)."""

from __future__ import annotations

import psycopg
import pytest

from tests.support.jobs import claim, enqueue
from tests.support.reads import rows_read

OUTCOME = "select awa.run_outcome(%s, %s, %s)"


def outcome(conn, job_id, lease, attempt):
    return conn.execute(OUTCOME, [job_id, lease, attempt]).fetchone()[0]


def one_run(db, logins, queue="oc", **kw) -> tuple[int, int, int]:
    """A job enqueued and claimed: (job id, run lease, attempt)."""
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, queue, **kw)[0]
    with db.connect(logins.worker) as w:
        (run,) = [r for r in claim(w, [queue]) if r[0] == job_id]
    return run[0], run[1], run[8]


def claim_again(db, logins, job_id, queue="oc") -> tuple[int, int]:
    """The job's retry made due, promoted and claimed: (run lease, attempt)."""
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = now() where job_id = %s", [job_id])
    with db.connect(logins.maintenance) as m:
        m.execute("select awa.promote_due()")
    with db.connect(logins.worker) as w:
        (run,) = [r for r in claim(w, [queue]) if r[0] == job_id]
    return run[1], run[8]


def rescue(db, logins) -> None:
    """Every run of worker 'w' rescued: its lease ended now, then the rescue pass."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.release_worker('w')")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] >= 1


def test_a_run_that_holds_its_lease_is_running_and_no_other_is(db, logins):
    job_id, lease, attempt = one_run(db, logins)
    assert attempt == 1
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "running"
        # Another lease of the same attempt, or another attempt: not this run.
        assert outcome(w, job_id, lease + 1, 1) == "gone"
        assert outcome(w, job_id, lease, 2) == "gone"


def test_a_run_that_completed_is_completed_under_its_attempt_only(db, logins):
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        # What a worker's second send sees: false, and the outcome settles it.
        assert not w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "completed"
        # Its lease is gone with its running row: the attempt names the run.
        assert outcome(w, job_id, lease + 1, 1) == "completed"
        assert outcome(w, job_id, lease, 2) == "gone"


def test_a_failure_with_a_retry_is_failed_while_it_waits_is_ready_and_runs_again(db, logins):
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "failed"  # scheduled, at attempt 1
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = now() where job_id = %s", [job_id])
    with db.connect(logins.maintenance) as m:
        m.execute("select awa.promote_due()")
    with db.connect() as su:
        assert su.execute("select state, attempt from awa.job(%s)",
                          [job_id]).fetchone() == ("ready", 1)
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "failed"
        (run,) = [r for r in claim(w, ["oc"]) if r[0] == job_id]
        second_lease, second = run[1], run[8]
        assert second == 2
        assert outcome(w, job_id, lease, 1) == "failed"
        assert outcome(w, job_id, second_lease, 2) == "running"
        assert w.execute("select awa.complete(%s, %s)", [job_id, second_lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "failed"
        assert outcome(w, job_id, second_lease, 2) == "completed"
        assert outcome(w, job_id, lease, 3) == "gone"


def test_a_failure_for_good_is_failed(db, logins):
    job_id, lease, _ = one_run(db, logins, max_attempts=1)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.fail(%s, %s, 'boom', now())", [job_id, lease]).fetchone()[0]
    with db.connect() as su:
        assert su.execute("select state, attempt from awa.job(%s)",
                          [job_id]).fetchone() == ("failed", 1)
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "failed"
        assert outcome(w, job_id, lease, 2) == "gone"


def test_a_rescued_run_ended_failed_and_the_next_run_is_its_own(db, logins):
    """The rescue counts the attempt as failed, as awa.fail does: the rows
    do not tell the two apart. Never 'completed': a worker whose complete
    answered false after a lost send learns it was not recorded."""
    job_id, lease, _ = one_run(db, logins)
    rescue(db, logins)
    with db.connect(logins.worker) as w:
        assert not w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "failed"
    second_lease, second = claim_again(db, logins, job_id)
    assert second == 2
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "failed"
        assert outcome(w, job_id, second_lease, 2) == "running"
        assert w.execute("select awa.complete(%s, %s)", [job_id, second_lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "failed"


def test_a_run_rescued_on_its_last_attempt_ended_failed(db, logins):
    job_id, lease, _ = one_run(db, logins, max_attempts=1)
    rescue(db, logins)
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "failed"


def test_a_run_cancelled_while_it_ran_is_gone(db, logins):
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0]
    with db.connect(logins.worker) as w:
        assert not w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        assert outcome(w, job_id, lease, 1) == "gone"


@pytest.mark.parametrize(("where", "operator", "error"), [
    ("scheduled", "plain", "boom"), ("ready", "plain", "boom"), ("scheduled", "ops;eu", "boom"),
    # An attempt's own error that reads like a cancel's note is kept whole.
    ("scheduled", "plain", "cancelled by upstream: deadline"),
    # An attempt that failed with no error failed all the same.
    ("ready", "plain", None),
])
def test_a_failure_cancelled_while_it_waited_for_its_retry_is_failed(db, logins, where,
                                                                     operator, error):
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.fail(%s, %s, %s)", [job_id, lease, error]).fetchone()[0]
    if where == "ready":
        with db.connect() as su:
            su.execute("update awa.scheduled set run_at = now() where job_id = %s", [job_id])
        with db.connect(logins.maintenance) as m:
            m.execute("select awa.promote_due()")
    # A login's name may hold a ';', as the cancel's error names it.
    login = logins.operator if operator == "plain" else db.login_role(
        "awa_operator", prefix=f"{operator}_")
    with db.connect(login) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0]
        assert op.execute("select state, attempt, last_error from awa.job(%s)",
                          [job_id]).fetchone() == (
            "cancelled", 1, f"cancelled by {login}; last error: {error or ''}")
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "failed"


def test_a_job_never_claimed_cancelled_or_unknown_is_gone(db, logins):
    with db.connect(logins.producer) as p:
        waiting = enqueue(p, "oc")[0]
        later = enqueue(p, "oc", run_at="2999-01-01")[0]
        stopped = enqueue(p, "oc")[0]
    with db.connect(logins.operator) as op:
        op.execute("select awa.cancel_job(%s)", [stopped])
    with db.connect(logins.worker) as w:
        for job_id in (waiting, later, stopped):  # attempt 0: no run at attempt 1
            assert outcome(w, job_id, 1, 1) == "gone"
        assert outcome(w, later + 1_000_000, 1, 1) == "gone"  # above every id
        assert outcome(w, -1, 1, 1) == "gone"


def test_a_completed_job_removed_since_is_gone(db, logins):
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    with db.connect() as su:  # as retention removes it
        su.execute("delete from awa.finished where job_id = %s", [job_id])
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "gone"


def test_a_run_carried_to_slot_2_is_still_running(db, logins):
    """awa.rotate_running moves the runs it finds to slot 2: looked for there too."""
    job_id, lease, _ = one_run(db, logins)
    with db.connect() as su:
        su.execute("update awa.running set slot = 2 where job_id = %s", [job_id])
    with db.connect(logins.worker) as w:
        assert outcome(w, job_id, lease, 1) == "running"


def test_bad_input_is_refused_with_its_name(db, logins):
    with db.connect(logins.worker) as w:
        for args, name in [([None, 1, 1], "job_id"), ([1, None, 1], "run_lease"),
                           ([1, 1, None], "attempt")]:
            with pytest.raises(psycopg.errors.NullValueNotAllowed, match=f"{name} must not"):
                w.execute(OUTCOME, args)
        for attempt in (0, -1):
            with pytest.raises(psycopg.errors.InvalidParameterValue,
                               match=rf"attempt must be 1 or more .*got {attempt}\b"):
                w.execute(OUTCOME, [1, 1, attempt])


def test_outside_read_committed_it_refuses(db, logins):
    """A snapshot older than a rotation of awa.running or a prune could miss
    the rows they moved: refused, as the worker calls refuse a gone run."""
    job_id, lease, _ = one_run(db, logins)
    with db.connect(logins.worker, autocommit=False) as w:
        w.execute("set transaction isolation level repeatable read")
        with pytest.raises(psycopg.errors.InvalidTransactionState, match="read committed"):
            outcome(w, job_id, lease, 1)


@pytest.mark.parametrize("cap", ["producer", "maintenance", "operator", "reader"])
def test_only_a_worker_may_call_it(db, logins, cap):
    with db.connect(getattr(logins, cap)) as conn, \
            pytest.raises(psycopg.errors.InsufficientPrivilege):
        outcome(conn, 1, 1, 1)
    with db.connect(logins.worker) as w:
        assert outcome(w, 1, 1, 1) == "gone"
    with db.connect() as su:
        assert su.execute(
            "select p.prosecdef, p.provolatile, p.proconfig from pg_proc as p"
            " where p.oid = 'awa.run_outcome(bigint, bigint, integer)'::regprocedure"
        ).fetchone() == (True, "v", ["search_path=pg_catalog, pg_temp", "enable_seqscan=off"])


def test_it_reads_the_queues_shape_not_their_backlog(db, logins):
    """A ready job (a retry promoted), an unknown one and a completed one
    behind a backlog of 2,000 ready jobs: the call reads a bisection of the
    lanes of awa.ready, never the backlog."""
    job_id, lease, _ = one_run(db, logins)
    done_id, done_lease, _ = one_run(db, logins)
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.fail(%s, %s, 'boom', now())", [job_id, lease]).fetchone()[0]
        assert w.execute("select awa.complete(%s, %s)", [done_id, done_lease]).fetchone()[0]
    with db.connect(logins.producer, autocommit=False) as p:
        unknown_id = enqueue(p, "oc")[0]  # an id handed out, its job rolled back
        p.rollback()
        p.execute("select awa.enqueue_batch(array_fill('oc'::text, array[2000]),"
                  " array_fill('job'::text, array[2000]))")
    with db.connect(logins.maintenance) as m:
        m.execute("select awa.promote_due()")
    with db.connect(logins.worker) as w:
        ready = rows_read(w, "awa.ready", f"select awa.run_outcome({job_id}, {lease}, 1)")
        unknown = rows_read(w, "awa.ready", f"select awa.run_outcome({unknown_id}, 1, 1)")
        done = rows_read(w, "awa.ready", f"select awa.run_outcome({done_id}, {done_lease}, 1)")
        assert outcome(w, job_id, lease, 1) == "failed"
        assert outcome(w, unknown_id, 1, 1) == "gone"
    assert 0 < ready < 40, ready
    assert 0 < unknown < 40, unknown
    assert done == 0
