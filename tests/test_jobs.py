"""The operators' job tools (ADR 025) on PostgreSQL 17 and 18, each call made
by a login holding only the role it names: awa.job and awa.jobs (reader,
operator), awa.cancel_job / cancel_jobs and awa.retry_job / retry_jobs
(operator), by plain, partitioned and striped names; what a worker sees
after a cancel or a retry; bulk retry while workers run; bad input."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.jobs import behind, claim, claim_all, enqueue, waits_for_a_lock
from tests.support.reads import blocks_read, rows_read
from tests.support.waiting import wait_until

STATES = ["scheduled", "ready", "running", "completed", "failed", "cancelled"]
INFO = ["job_id", "queue", "logical_queue", "kind", "state", "priority", "ordering_key",
        "args", "attempt", "max_attempts", "enqueued_at", "run_at", "finished_at",
        "last_error", "worker", "lease_expires_at"]


def job(conn, job_id) -> dict | None:
    row = conn.execute("select * from awa.job(%s)", [job_id]).fetchone()
    return None if row is None else dict(zip(INFO, row, strict=True))


def page(conn, queue, state=None, kind=None, after=None, n=100) -> list[tuple[int, str]]:
    return [tuple(r) for r in conn.execute(
        "select job_id, state from awa.jobs(%s, %s, %s, %s, %s)",
        [queue, state, kind, after, n]).fetchall()]


def all_pages(conn, queue, state=None, kind=None, n=3) -> list[tuple[int, str]]:
    out, after = [], None
    while rows := page(conn, queue, state, kind, after, n):
        assert len(rows) <= n
        out += rows
        after = rows[-1][0]
    return out


def fail_all(conn, queue, error="boom") -> list[int]:
    """Claims every ready job of `queue` and fails each attempt."""
    failed = []
    for job_id, lease, *_ in claim_all(conn, [queue], 1000):
        assert conn.execute("select awa.fail(%s, %s, %s)", [job_id, lease, error]).fetchone()[0]
        failed.append(job_id)
    return failed


def one_of_each(db, logins, queue="mix") -> dict[str, int]:
    """One job in every state, made by the roles that make them."""
    with db.connect(logins.producer) as p:
        ids = {
            "scheduled": enqueue(p, queue, "later", run_at="2999-01-01")[0],
            "completed": enqueue(p, queue, "done")[0],
            "failed": enqueue(p, queue, "bad", args=Jsonb({"n": 3}), ordering_key=b"kf",
                              max_attempts=1)[0],
            "cancelled": enqueue(p, queue, "stop", args=Jsonb({"n": 4}))[0],
            "running": enqueue(p, queue, "busy")[0],
        }
    with db.connect(logins.worker) as w:
        leases = {c[0]: c[1] for c in claim(w, [queue])}
        assert w.execute("select awa.complete(%s, %s)",
                         [ids["completed"], leases[ids["completed"]]]).fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, 'it broke')",
                         [ids["failed"], leases[ids["failed"]]]).fetchone()[0]
        # Back to ready, so that the operator cancels a ready job.
        w.execute("select awa.fail(%s, %s, 'first try', now())",
                  [ids["cancelled"], leases[ids["cancelled"]]])
    with db.connect() as su:
        su.execute("select awa.promote_due()")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [ids["cancelled"]]).fetchone()[0]
    with db.connect(logins.producer) as p:
        ids["ready"] = enqueue(p, queue, "waiting", args=Jsonb({"n": 6}), ordering_key=b"kr")[0]
    return ids


# -- reading ------------------------------------------------------------------------------


def test_job_shows_every_state_and_nothing_for_unknown_or_pruned(db, logins):
    ids = one_of_each(db, logins)
    with db.connect(logins.reader) as r:
        seen = {state: job(r, job_id) for state, job_id in ids.items()}
        assert {s: j["state"] for s, j in seen.items()} == {s: s for s in ids}
        assert all(j["queue"] == j["logical_queue"] == "mix" for j in seen.values())
        ready, failed = seen["ready"], seen["failed"]
        assert (ready["args"], ready["ordering_key"], ready["attempt"]) == ({"n": 6}, b"kr", 0)
        assert ready["run_at"] is not None and ready["finished_at"] is None
        assert (failed["args"], failed["ordering_key"], failed["last_error"]) == (
            {"n": 3}, b"kf", "it broke")
        assert (failed["attempt"], failed["max_attempts"]) == (1, 1)
        assert failed["finished_at"] is not None and failed["worker"] is None
        running = seen["running"]
        assert running["worker"] == "w" and running["lease_expires_at"] is not None
        assert running["attempt"] == 1
        assert seen["scheduled"]["run_at"].year == 2999
        assert seen["completed"]["args"] is None  # completed rows are narrow
        cancelled = seen["cancelled"]
        assert cancelled["args"] == {"n": 4}
        assert cancelled["last_error"] == f"cancelled by {logins.operator}; last error: first try"
        assert job(r, 10**12) is None
        assert job(r, 0) is None
    with db.connect() as su:
        su.execute("delete from awa.finished where job_id = %s", [ids["completed"]])
    with db.connect(logins.operator) as op:
        assert job(op, ids["completed"]) is None


READY_SCANS = ("select coalesce(sum(seq_scan), 0) from pg_stat_xact_user_tables"
               " where relid = 'awa.ready'::regclass")


def test_job_finds_ready_jobs_lane_by_lane_without_scanning_awa_ready(db, logins):
    """awa.job of every ready job, its own lane's or moved in with an older id
    (promoted, retried), at a lane's head or deep in it, and of ids no table
    holds (rolled back, pruned): the right answer, and no sequential scan of
    awa.ready (ADR 031). awa.cancel_job of a deep ready job, the same."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('deep', 4)")
    with db.connect(logins.producer) as p:
        retried = [enqueue(p, "deep", "retried")[0] for _ in range(3)]
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["deep"]):
            w.execute("select awa.fail(%s, %s, 'again', now())", [job_id, lease])
    with db.connect(logins.producer) as p:
        later = [enqueue(p, "deep", "later", run_at="2999-01-01")[0] for _ in range(5)]
        p.execute("select count(*) from awa.enqueue_batch(array_fill('deep'::text, array[600]),"
                  " array_fill('job'::text, array[600]), ordering_keys => array("
                  "select convert_to('k' || i, 'UTF8') from generate_series(1, 600) as i))")
        with p.transaction():
            rolled_back = enqueue(p, "deep", "gone")[0]
            raise psycopg.Rollback()
    with db.connect(logins.worker) as w:
        done = [j for j, lease, *_ in claim(w, ["deep"], 60)
                if w.execute("select awa.complete(%s, %s)", [j, lease]).fetchone()[0]]
    with db.connect() as su:
        su.execute("update awa.scheduled set run_at = now() where job_id = any(%s)", [later])
        assert su.execute("select awa.promote_due()").fetchone()[0] == len(later + retried)
        su.execute("delete from awa.finished where job_id = %s", [done[0]])
        ready = {j for (j,) in su.execute("select job_id from awa.ready")}
        late = {j for (j,) in su.execute("select job_id from awa.ready_late")}
    assert set(later + retried) <= late & ready and len(ready) == 600 + 8 - 60
    with db.connect(logins.reader, autocommit=False) as r:
        before = r.execute(READY_SCANS).fetchone()[0]
        assert {j for j in ready if (job(r, j) or {}).get("state") == "ready"} == ready
        assert job(r, rolled_back) is None and job(r, done[0]) is None
        assert job(r, done[1])["state"] == "completed"
        assert r.execute(READY_SCANS).fetchone()[0] == before
    deep = sorted(ready)[len(ready) // 2]
    with db.connect(logins.operator, autocommit=False) as op:
        before = op.execute(READY_SCANS).fetchone()[0]
        assert op.execute("select awa.cancel_job(%s)", [deep]).fetchone()[0]
        assert op.execute(READY_SCANS).fetchone()[0] == before
        op.commit()
        assert job(op, deep)["state"] == "cancelled"


def test_job_reads_one_row_of_a_lane_for_an_id_it_does_not_hold(db, logins):
    """An id handed out and rolled back, and a ready job deep in a lane of
    2,000, in a database whose statistics of awa.ready were never gathered:
    awa.job reads the lane's bisection and the one row it lands on, not
    every row of awa.ready for the job id (as a plain join let the planner
    do)."""
    with db.connect(logins.producer, autocommit=False) as p:
        enqueue(p, "wide")
        p.commit()
        rolled_back = enqueue(p, "wide")[0]
        p.rollback()
        p.execute("select awa.enqueue_batch(array_fill('wide'::text, array[2000]),"
                  " array_fill('job'::text, array[2000]))")
        p.commit()
    deep = rolled_back + 1500  # the batch's ids follow the rolled-back one
    with db.connect(logins.reader) as r:
        assert job(r, deep)["state"] == "ready"
        missing = rows_read(r, "awa.ready", f"select * from awa.job({rolled_back})")
        found = rows_read(r, "awa.ready", f"select * from awa.job({deep})")
    assert missing < 40, missing
    assert found < 40, found


def test_jobs_pages_every_state_by_job_id_as_an_oracle_says(db, logins):
    ids = one_of_each(db, logins)
    with db.connect(logins.producer) as p:
        more = [enqueue(p, "mix", f"k{i % 3}")[0] for i in range(10)]
    with db.connect() as su:
        oracle = {}
        for table, state in [("scheduled", "'scheduled'"), ("ready", "'ready'"),
                             ("running", "'running'"), ("finished", "state")]:
            oracle.update(su.execute(f"select job_id, {state} from awa.{table}").fetchall())
    with db.connect(logins.reader) as r:
        for n in (1, 3, 100):
            assert all_pages(r, "mix", n=n) == sorted(oracle.items())
        for state in STATES:
            want = sorted((j, s) for j, s in oracle.items() if s == state)
            assert all_pages(r, "mix", state) == want, state
        assert [j for j, _ in all_pages(r, "mix", "ready", kind="k1")] == more[1::3]
        assert page(r, "mix", after=ids["ready"]) == [(j, "ready") for j in more]
        assert page(r, "mix", "failed", kind="nope") == []


def test_ready_jobs_page_through_the_whole_backlog(db, logins):
    """Ready jobs page by job_id through every lane to its end, jobs that
    entered their lane with an older id (retried) included (ADR 029)."""
    with db.connect(logins.producer) as p:
        ids = [r[0] for r in p.execute(
            "select job_id from awa.enqueue_batch(array_fill('deep'::text, array[1500]),"
            " array_fill('k'::text, array[1500]), max_attempts => array_fill(1, array[1500]))"
        ).fetchall()]
    with db.connect(logins.worker) as w:
        taken = claim(w, ["deep"], 200)
        assert [c[0] for c in taken] == ids[:200]
        for job_id, lease, *_ in taken[:50]:
            w.execute("select awa.fail(%s, %s, 'x')", [job_id, lease])
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.retry_jobs('deep')").fetchone()[0] == 50
    ready = ids[:50] + ids[200:]  # the retried ones at the end of the lane
    with db.connect(logins.reader) as r:
        assert [j for j, _ in all_pages(r, "deep", "ready", n=250)] == sorted(ready)
        assert [j for j, _ in all_pages(r, "deep", "ready", n=7)] == sorted(ready)
        assert [j for j, _ in page(r, "deep", "ready", after=ids[700], n=3)] == ids[701:704]
        assert [j for j, _ in page(r, "deep", "ready", after=ids[-1])] == []
        assert r.execute("select awa.count_jobs('deep', 'ready')").fetchone()[0] == 1350
        assert job(r, ids[-1])["state"] == "ready"


def test_partitioned_and_striped_queues_work_by_their_logical_name(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('parts', 3)")
        op.execute("select awa.set_queue_stripes('strips', 2)")
        op.execute("select awa.set_enqueue_shards('parts', 2)")
    for name in ("parts", "strips"):
        with db.connect(logins.producer) as p:
            keyed = [enqueue(p, name, "k", ordering_key=f"key-{i}".encode(),
                             args=Jsonb({"i": i}), max_attempts=1)[0] for i in range(24)]
        with db.connect(logins.reader) as r:
            rows = r.execute("select queue, logical_queue from awa.jobs(%s, 'ready')",
                             [name]).fetchall()
            assert len(rows) == 24 and {lq for _, lq in rows} == {name}
            homes = {j: q for j, q in r.execute(
                "select job_id, queue from awa.jobs(%s)", [name]).fetchall()}
            assert len(set(homes.values())) > 1  # the jobs are spread over its parts
        with db.connect(logins.worker) as w:
            assert sorted(fail_all(w, name)) == keyed
        with db.connect(logins.operator) as op:
            assert op.execute("select awa.count_jobs(%s, 'failed')", [name]).fetchone()[0] == 24
            assert op.execute("select awa.retry_jobs(%s, max_jobs => 10)",
                              [name]).fetchone()[0] == 10
            assert op.execute("select awa.retry_jobs(%s)", [name]).fetchone()[0] == 14
            after = {j: q for j, q in op.execute(
                "select job_id, queue from awa.jobs(%s, 'ready')", [name]).fetchall()}
            assert after == homes  # back in their own partition or stripe
            assert op.execute("select awa.cancel_jobs(%s, max_jobs => 20)",
                              [name]).fetchone()[0] == 20
            assert op.execute("select awa.cancel_jobs(%s)", [name]).fetchone()[0] == 4
            assert [s for _, s in all_pages(op, name, n=10)] == ["cancelled"] * 24
        with db.connect(logins.worker) as w:
            assert claim(w, [name]) == []


# -- cancel -------------------------------------------------------------------------------


def test_a_cancelled_ready_job_is_never_claimed(db, logins):
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, "c", "k", args=Jsonb({"i": i}))[0] for i in range(5)]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [ids[2]]).fetchone()[0] is True
        assert op.execute("select awa.cancel_job(%s)", [ids[2]]).fetchone()[0] is False
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["c"])] == ids[:2] + ids[3:]
    with db.connect(logins.reader) as r:
        cancelled = job(r, ids[2])
        assert (cancelled["state"], cancelled["args"]) == ("cancelled", {"i": 2})
        assert r.execute("select cancelled, ready from awa.queue_overview"
                         " where queue = 'c'").fetchone() == (1, 0)


def test_a_cancelled_waiting_job_whose_args_are_json_null_can_be_retried(db, logins):
    """An enqueue stores the args as given, 'null'::jsonb too (a client that
    sent JSON.stringify(null)). A cancel of a waiting job built its row
    through jsonb, which turned them into SQL null: kept without args, the
    job could never be retried. Its args stay JSON null, and it runs again."""
    with db.connect(logins.producer) as p:
        ready = p.execute("select job_id from awa.enqueue('cnull', 'k', 'null'::jsonb)"
                          ).fetchone()[0]
        later = p.execute("select job_id from awa.enqueue('cnull', 'k', 'null'::jsonb,"
                          " run_at => '2999-01-01')").fetchone()[0]
    with db.connect(logins.operator) as op:
        for job_id in (ready, later):
            assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0] is True
            assert op.execute("select args::text from awa.job(%s)", [job_id]
                              ).fetchone()[0] == "null"
            assert op.execute("select awa.retry_job(%s)", [job_id]).fetchone()[0] is True
    with db.connect(logins.worker) as w:
        taken = claim_all(w, ["cnull"])
    assert {c[0] for c in taken} == {ready, later}


def test_a_bulk_retry_waits_for_a_held_row_past_one_whose_key_is_held(db, logins):
    """Failed job A's unique key is held by a live job since, so a retry
    leaves A; failed job C is held by another transaction (a carry moving
    it, here a lock). The retry waits for C, not for A, which it locked at
    once and then returned 0 with C still failed."""
    with db.connect(logins.producer) as p:
        a = enqueue(p, "rk", "a", unique_key=b"K", max_attempts=1)[0]
        c = enqueue(p, "rk", "c", max_attempts=1)[0]
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, ["rk"], 2):
            w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease])
    with db.connect(logins.producer) as p:
        enqueue(p, "rk", "b", unique_key=b"K")  # holds K now
    with db.connect(logins.operator) as op, db.connect(autocommit=False) as holder:
        holder.execute("select from awa.finished where job_id = %s for update", [c])
        call = behind(db, holder, op, lambda conn: conn.execute(
            "select awa.retry_jobs('rk')").fetchone()[0])
    assert (call.error, call.result) == (None, 1)
    with db.connect(logins.reader) as r:
        assert job(r, c)["state"] == "ready" and job(r, a)["state"] == "failed"


def test_a_cancelled_scheduled_job_is_never_promoted(db, logins):
    with db.connect(logins.producer) as p:
        later = enqueue(p, "cs", "k", run_at="2999-01-01")
    with db.connect() as su:  # its time has come, and promote_due has not run yet
        su.execute("update awa.scheduled set run_at = now() - interval '1 second'")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [later[0]]).fetchone()[0] is True
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 0
    with db.connect(logins.worker) as w:
        assert claim(w, ["cs"]) == []


def test_a_cancelled_running_job_ends_cancelled_and_its_worker_gets_false(db, logins):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "cr", "k", args=Jsonb({"x": 1}))[0]
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["cr"])
        with db.connect(logins.operator) as op:
            assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0] is True
        assert w.execute("select awa.heartbeat(%s, %s, '1 minute')", [job_id, c[1]]).fetchone()[0] \
            is False
        assert w.execute("select awa.complete(%s, %s)", [job_id, c[1]]).fetchone()[0] is False
        assert w.execute("select awa.fail(%s, %s, 'x')", [job_id, c[1]]).fetchone()[0] is False
        assert claim(w, ["cr"]) == []
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 0
    with db.connect(logins.reader) as r:
        ended = job(r, job_id)
        assert (ended["state"], ended["attempt"], ended["args"]) == ("cancelled", 1, {"x": 1})
        assert ended["last_error"] == f"cancelled by {logins.operator}"


def test_a_second_cancel_keeps_the_first_ones_note_whole(db, logins):
    """A job cancelled while it ran, retried, and cancelled again before it
    ran: the second note keeps the first, whoever wrote it (a login may
    hold a ';')."""
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "c2", "k")[0]
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim(w, ["c2"])] == [job_id]
    second = db.login_role("awa_operator", prefix="ops;eu_")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0] is True
        assert op.execute("select awa.retry_job(%s)", [job_id]).fetchone()[0] is True
        assert job(op, job_id)["last_error"] == f"cancelled by {logins.operator}"
    with db.connect(second) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0] is True
        assert op.execute("select awa.retry_job(%s)", [job_id]).fetchone()[0] is True
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0] is True
        assert job(op, job_id)["last_error"] == (
            f"cancelled by {second}; last error: cancelled by {second}; "
            f"last error: cancelled by {logins.operator}")


@pytest.mark.parametrize("claim_commits", [True, False])
def test_cancel_waits_for_a_claim_in_flight_then_cancels_where_the_job_is(
        db, logins, claim_commits):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "cw", "k")[0]
    outcome = {}
    with db.connect(logins.worker, autocommit=False) as w, db.connect() as watch:
        (c,) = claim(w, ["cw"])  # holds the ready row until it ends

        def cancel():
            with db.connect(logins.operator) as op:
                outcome["pid"] = op.info.backend_pid
                op.execute("set lock_timeout = '30s'")
                outcome["cancelled"] = op.execute("select awa.cancel_job(%s)",
                                                  [job_id]).fetchone()[0]

        t = threading.Thread(target=cancel, daemon=True)
        t.start()
        wait_until(lambda: "pid" in outcome and waits_for_a_lock(watch, outcome["pid"]),
                   what="the cancel to wait for the claim")
        assert "cancelled" not in outcome
        if claim_commits:
            w.commit()
        else:
            w.rollback()
        t.join(timeout=30)
        assert not t.is_alive(), "the cancel never ended"
        assert outcome["cancelled"] is True
        assert w.execute("select awa.complete(%s, %s)", [job_id, c[1]]).fetchone()[0] is False
        assert claim(w, ["cw"]) == []
        w.commit()
    with db.connect(logins.reader) as r:
        ended = job(r, job_id)
        assert (ended["state"], ended["attempt"]) == ("cancelled", 1 if claim_commits else 0)


def test_cancel_of_a_terminal_or_unknown_job_is_false_and_changes_nothing(db, logins):
    ids = one_of_each(db, logins)
    with db.connect() as su:
        before = su.execute("select job_id, state, slot, last_error from awa.finished"
                            " order by job_id").fetchall()
    with db.connect(logins.operator) as op:
        for state in ("completed", "failed", "cancelled"):
            assert op.execute("select awa.cancel_job(%s)", [ids[state]]).fetchone()[0] is False
        assert op.execute("select awa.cancel_job(%s)", [10**12]).fetchone()[0] is False
    with db.connect() as su:
        assert su.execute("select job_id, state, slot, last_error from awa.finished"
                          " order by job_id").fetchall() == before


def test_bulk_cancel_takes_ready_and_scheduled_jobs_up_to_max_jobs_and_leaves_running(
        db, logins):
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('bc'::text, array[30]),"
                  " array(select 'k' || (i % 2) from generate_series(1, 30) i))")
        for _ in range(4):
            enqueue(p, "bc", "k0", run_at="2999-01-01")
    with db.connect(logins.worker) as w:
        running = claim(w, ["bc"], 6)
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_jobs('bc', 'k1', 5)").fetchone()[0] == 5
        # 19 ready left and 4 scheduled: 23, at most 10 per call.
        counts = [op.execute("select awa.cancel_jobs('bc', max_jobs => 10)").fetchone()[0]
                  for _ in range(4)]
        assert counts == [10, 10, 3, 0]
        states = [s for _, s in all_pages(op, "bc", n=7)]
    assert states.count("cancelled") == 28 and states.count("running") == 6
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in running:
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]


def _hint(conn, queue) -> int:
    """The claim hint of the one lane of `queue` (at S = 1) that holds jobs."""
    return conn.execute(
        "select coalesce(max(h.head_seq), 0) from awa.lane_hints as h"
        " where h.lane_id = (select r.lane_id from awa.ready as r join awa.queue_meta as m"
        "                     using (queue_id) where m.queue = %s limit 1)", [queue]).fetchone()[0]


def test_a_bulk_cancel_moves_the_claim_hint_past_what_it_cancelled(db, logins):
    """A mass cancel from the front of a lane, while another connection holds
    a snapshot (so vacuum cannot remove the rows, nor an index scan mark
    them dead): the next claim starts past the cancelled rows, not at the
    lane's old hint, from which it read every one of them, as did every
    claim and every lane view until the snapshot ended."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('flood'::text, array[3000]),"
                  " array_fill('bad'::text, array[3000]))")
        p.execute("select awa.enqueue_batch(array_fill('flood'::text, array[5]),"
                  " array_fill('good'::text, array[5]))")
    with db.connect(autocommit=False) as horizon, db.connect(logins.operator) as op, \
            db.connect(logins.worker) as w, db.connect() as su:
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")
        assert op.execute("select awa.cancel_jobs('flood', 'bad', 100000)").fetchone()[0] == 3000
        first_good = su.execute("select min(lane_seq) from awa.ready where kind = 'good'"
                                ).fetchone()[0]
        assert _hint(su, "flood") == first_good
        read = blocks_read(w, ["awa.ready", "awa.ready_pkey"],
                           "select * from awa.claim(array['flood'], 1, 'w')")
        # The 3,000 cancelled rows fill some 40 heap blocks and 10 index leaves.
        assert read < 15, read
        horizon.rollback()
        kinds = [r[6] for r in claim_all(w, ["flood"], 10)]
        assert kinds == ["good"] * 4


def test_a_bulk_cancel_never_moves_the_hint_past_a_row_a_claim_in_flight_holds(db, logins):
    """cancel_jobs skips the row a claim in flight holds. If that claim rolls
    back, the row is free again: the hint the cancel moved must not be past
    it, or no claim would ever take the job."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('held'::text, array[200]),"
                  " array_fill('job'::text, array[200]))")
    with db.connect(logins.worker, autocommit=False) as inflight, \
            db.connect(logins.operator) as op, db.connect(logins.worker) as w:
        (first, *_), = claim(inflight, ["held"], 1)
        assert op.execute("select awa.cancel_jobs('held')").fetchone()[0] == 199
        inflight.rollback()
        assert [r[0] for r in claim_all(w, ["held"], 10)] == [first]


def test_a_bulk_cancel_never_moves_the_hint_past_an_enqueue_in_flight(db, logins):
    """The rows of an enqueue still in flight are invisible to the cancel
    but lie above every row it can see (the lane's lock orders them): a
    lane whose visible rows were all cancelled keeps its hint."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('fl'::text, array[300]),"
                  " array_fill('bad'::text, array[300]))")
    with db.connect(logins.producer, autocommit=False) as e, \
            db.connect(logins.operator) as op, db.connect(logins.worker) as w:
        e.execute("select awa.enqueue_batch(array_fill('fl'::text, array[5]),"
                  " array_fill('good'::text, array[5]))")
        assert op.execute("select awa.cancel_jobs('fl', 'bad')").fetchone()[0] == 300
        e.commit()
        assert [r[6] for r in claim_all(w, ["fl"], 10)] == ["good"] * 5


def test_a_bulk_cancel_that_rolls_back_keeps_its_rows_under_another_cancels_hint(db, logins):
    """A second cancel sees the first's cancelled rows (not yet committed) as
    live and stops its hint at them: when the first rolls back, they are
    claimable again, in order."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('cr'::text, array[100]),"
                  " array_fill('a'::text, array[100]))")
        p.execute("select awa.enqueue_batch(array_fill('cr'::text, array[300]),"
                  " array_fill('b'::text, array[300]))")
    with db.connect(logins.operator, autocommit=False) as c1, \
            db.connect(logins.operator) as c2, db.connect(logins.worker) as w:
        assert c1.execute("select awa.cancel_jobs('cr', 'a')").fetchone()[0] == 100
        assert c2.execute("select awa.cancel_jobs('cr', 'b')").fetchone()[0] == 300
        c1.rollback()
        assert [r[6] for r in claim_all(w, ["cr"], 50)] == ["a"] * 100


# -- retry --------------------------------------------------------------------------------


def test_a_retried_job_reaches_a_worker_with_its_args_key_and_id_under_the_current_s(
        db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('r', 4)")
    with db.connect(logins.producer) as p:
        keyed = enqueue(p, "r", "charge", args=Jsonb({"order": 7}), ordering_key=b"cust-42",
                        priority=1, max_attempts=3)[0]
        plain = enqueue(p, "r", "plain", args=Jsonb({"n": 1}), max_attempts=1)[0]
    with db.connect(logins.worker) as w:
        for _ in range(3):  # three attempts of the keyed job: failed for good
            for job_id, lease, *_ in claim(w, ["r"]):
                w.execute("select awa.fail(%s, %s, 'declined', now())", [job_id, lease])
            with db.connect() as su:
                su.execute("select awa.promote_due()")
    with db.connect(logins.operator) as op:
        assert job(op, keyed)["state"] == "failed" and job(op, plain)["state"] == "failed"
        op.execute("select awa.set_enqueue_shards('r', 8)")
        assert op.execute("select awa.retry_job(%s)", [keyed]).fetchone()[0] is True
        assert op.execute("select awa.retry_job(%s)", [keyed]).fetchone()[0] is False
        again = job(op, keyed)
        assert (again["state"], again["attempt"], again["max_attempts"]) == ("ready", 0, 3)
        assert again["last_error"] == "declined"
    with db.connect() as su:
        shard = su.execute("select l.shard from awa.ready r join awa.lanes l using (lane_id)"
                           " where r.job_id = %s", [keyed]).fetchone()[0]
        expected = su.execute("select awa.shard_for_ordering_key('cust-42', 8)").fetchone()[0]
    assert shard == expected
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["r"])
        assert (c[0], c[3], c[4], c[7], c[8], c[9], c[10]) == (
            keyed, 1, expected, {"order": 7}, 1, 3, b"cust-42")
        assert w.execute("select awa.complete(%s, %s)", [c[0], c[1]]).fetchone()[0]
    with db.connect(logins.operator) as op:
        assert job(op, keyed)["state"] == "completed"
        assert op.execute("select awa.retry_job(%s)", [plain]).fetchone()[0] is True
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["r"])
        assert (c[0], c[4] < 8, c[7], c[10]) == (plain, True, {"n": 1}, None)


def test_a_cancelled_job_can_be_retried(db, logins):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "rc", "k", args=Jsonb({"a": 1}), ordering_key=b"k")[0]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0]
        assert op.execute("select awa.retry_jobs('rc')").fetchone()[0] == 0  # failed only
        assert op.execute("select awa.retry_job(%s)", [job_id]).fetchone()[0]
    with db.connect(logins.worker) as w:
        (c,) = claim(w, ["rc"])
        assert (c[0], c[7], c[10]) == (job_id, {"a": 1}, b"k")


def _cancelled_flood(db, logins, queue: str) -> dict[str, list[int]]:
    """A queue as the AwaJobsFailing runbook leaves it: kind 'bad' cancelled
    (a running one by id, its first attempt spent; ready and scheduled ones
    in bulk), two 'bad' jobs failed for good, and a 'good' job cancelled."""
    with db.connect(logins.producer) as p:
        run = enqueue(p, queue, "bad", args=Jsonb({"run": 1}))[0]
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim(w, [queue])] == [run]
    with db.connect(logins.producer) as p:
        failing = [enqueue(p, queue, "bad", max_attempts=1)[0] for _ in range(2)]
    with db.connect(logins.worker) as w:
        for job_id, lease, *_ in claim(w, [queue]):
            assert w.execute("select awa.fail(%s, %s, 'poison')", [job_id, lease]).fetchone()[0]
    with db.connect(logins.producer) as p:
        ready = [enqueue(p, queue, "bad", args=Jsonb({"i": i}),
                         ordering_key=b"acct-7" if i == 0 else None, priority=1,
                         max_attempts=4)[0] for i in range(5)]
        later = enqueue(p, queue, "bad", args=Jsonb({"later": True}), run_at="2999-01-01")[0]
        good = enqueue(p, queue, "good", args=Jsonb({"g": 1}))[0]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [run]).fetchone()[0]
        assert op.execute("select awa.cancel_jobs(%s, 'bad')", [queue]).fetchone()[0] == 6
        assert op.execute("select awa.cancel_job(%s)", [good]).fetchone()[0]
    return {"cancelled": [run, *ready, later], "failed": failing, "good": [good]}


def test_bulk_retry_of_cancelled_jobs_brings_them_back_as_retry_job_does(db, logins):
    """The runbook's way back after a fix: awa.retry_jobs(state => 'cancelled')
    takes the cancelled jobs of a queue and kind, and only those, as
    awa.retry_job takes one: ready now with attempt 0, their max_attempts,
    args, ordering key, priority and last error. The default stays failed."""
    ids = _cancelled_flood(db, logins, "cf")
    with db.connect(logins.reader) as r:
        assert r.execute("select awa.count_jobs('cf', 'cancelled', 'bad')").fetchone()[0] == 7
        before = {j: job(r, j) for j in ids["cancelled"]}
    with db.connect(logins.operator) as op:
        # One of them by id, for what awa.retry_job gives a job.
        assert op.execute("select awa.retry_job(%s)", [ids["cancelled"][0]]).fetchone()[0]
        one = job(op, ids["cancelled"][0])
        assert op.execute("select awa.retry_jobs('cf', 'bad', 2, 'cancelled')").fetchone()[0] == 2
        assert op.execute("select awa.retry_jobs('cf', 'bad', state => 'cancelled')"
                          ).fetchone()[0] == 4
        assert op.execute("select awa.retry_jobs('cf', 'bad', state => 'cancelled')"
                          ).fetchone()[0] == 0
        after = {j: job(op, j) for j in ids["cancelled"]}
        # The failed ones and the other kind stayed as they were.
        assert [job(op, j)["state"] for j in ids["failed"]] == ["failed"] * 2
        assert job(op, ids["good"][0])["state"] == "cancelled"
        assert op.execute("select awa.retry_jobs('cf', 'bad')").fetchone()[0] == 2
    assert one["state"] == "ready" and one["attempt"] == 0
    for j, row in after.items():
        was = before[j]
        assert row["state"] == "ready", (j, row)  # the scheduled one too: it runs now
        assert (row["attempt"], row["max_attempts"], row["priority"], row["args"],
                row["ordering_key"], row["last_error"]) == (
            one["attempt"], was["max_attempts"], was["priority"], was["args"],
            was["ordering_key"], was["last_error"]), (j, row, was)
        assert row["last_error"].startswith("cancelled by ")
    with db.connect(logins.worker) as w:
        got = {c[0]: (c[7], c[10]) for c in claim_all(w, ["cf"])}
    assert set(got) == {*ids["cancelled"], *ids["failed"]}
    assert got[ids["cancelled"][0]] == ({"run": 1}, None)
    assert got[ids["cancelled"][1]] == ({"i": 0}, b"acct-7")


def test_bulk_retry_of_cancelled_jobs_skips_rows_another_call_holds_then_waits_once(
        db, logins):
    """As for failed jobs: a cancelled row another transaction holds (a
    retry in flight) is skipped while others are left, and waited for once
    when it is all that is left, so that a 0 means none is left."""
    with db.connect(logins.producer) as p:
        # The held one in a lane of its own (priority 1): the retry in flight
        # holds its lane too, until it commits.
        ids = [enqueue(p, "ch", "k", args=Jsonb({"i": i}), priority=1 if i == 0 else 2)[0]
               for i in range(3)]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_jobs('ch')").fetchone()[0] == 3
    with db.connect(logins.operator, autocommit=False) as holder, \
            db.connect(logins.operator, autocommit=False) as op:
        assert holder.execute("select awa.retry_job(%s)", [ids[0]]).fetchone()[0]
        # Skipped without a wait: a wait would end in this lock timeout.
        op.execute("set local lock_timeout = '5s'")
        assert op.execute("select awa.retry_jobs('ch', state => 'cancelled')"
                          ).fetchone()[0] == 2
        op.commit()
        call = behind(db, holder, op, lambda c: c.execute(
            "select awa.retry_jobs('ch', state => 'cancelled')").fetchone()[0])
    assert call.error is None and call.result == 0
    with db.connect(logins.reader) as r:
        assert [job(r, j)["state"] for j in ids] == ["ready"] * 3
        assert r.execute("select awa.count_jobs('ch', 'ready')").fetchone()[0] == 3


def test_retry_of_a_job_in_any_other_state_is_false_and_changes_nothing(db, logins):
    ids = one_of_each(db, logins)
    with db.connect() as su:
        before = su.execute("select (select count(*) from awa.ready),"
                            " (select count(*) from awa.scheduled),"
                            " (select count(*) from awa.running),"
                            " (select count(*) from awa.finished)").fetchone()
    with db.connect(logins.operator) as op:
        for state in ("scheduled", "ready", "running", "completed"):
            assert op.execute("select awa.retry_job(%s)", [ids[state]]).fetchone()[0] is False
            assert job(op, ids[state])["state"] == state
        assert op.execute("select awa.retry_job(%s)", [10**12]).fetchone()[0] is False
    with db.connect() as su:
        assert su.execute("select (select count(*) from awa.ready),"
                          " (select count(*) from awa.scheduled),"
                          " (select count(*) from awa.running),"
                          " (select count(*) from awa.finished)").fetchone() == before


def test_a_row_a_prune_removed_meanwhile_is_not_found(db, logins):
    """A retry whose snapshot predates a prune that TRUNCATEd the row's slot
    cannot tell a removed row from one the prune carried on (the carry's
    copy is not in its snapshot): refused (40001), nothing written; in a new
    transaction, false."""
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "gone", "k", max_attempts=1)[0]
    with db.connect(logins.worker) as w:
        fail_all(w, "gone")
    with db.connect() as su:
        su.execute("select awa.set_retention('gone', '1 hour', '1 day')")
        su.execute("update awa.finished set finished_at = now() - interval '3 days',"
                   " slot = awa._finished_slot('failed', now() - interval '3 days')"
                   " where job_id = %s", [job_id])
    with db.connect(logins.operator, autocommit=False) as op:
        op.execute("set transaction isolation level repeatable read")
        # The snapshot is taken (from a view that does not lock awa.finished).
        op.execute("select count(*) from awa.queue_overview").fetchone()
        with db.connect(logins.maintenance) as m:
            assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
        with pytest.raises(psycopg.errors.SerializationFailure):
            op.execute("select awa.retry_job(%s)", [job_id])
        op.rollback()
        assert op.execute("select awa.retry_job(%s)", [job_id]).fetchone()[0] is False
        op.commit()
    with db.connect(logins.reader) as r:
        assert job(r, job_id) is None
        assert page(r, "gone") == []


def test_bulk_retry_of_10000_failed_jobs_while_workers_run_completes_each_once(db, logins):
    total = 10_000
    with db.connect(logins.producer) as p:
        ids = [r[0] for r in p.execute(
            "select job_id from awa.enqueue_batch(array_fill('bulk'::text, array[%s]),"
            " array_fill('k'::text, array[%s]),"
            " args => array(select jsonb_build_object('i', i) from generate_series(1, %s) i),"
            " max_attempts => array_fill(1, array[%s]))", [total] * 4).fetchall()]
    with db.connect(logins.worker) as w:
        claimed = claim(w, ["bulk"], total)
        assert w.execute("select count(*) filter (where awa.fail(j, l, 'boom'))"
                         " from unnest(%s::bigint[], %s::bigint[]) as u (j, l)",
                         [[c[0] for c in claimed], [c[1] for c in claimed]]).fetchone()[0] == total
    args = {c[0]: c[7] for c in claimed}
    with db.connect(logins.producer) as p:  # the workers have other work too
        p.execute("select awa.enqueue_batch(array_fill('bulk'::text, array[500]),"
                  " array_fill('other'::text, array[500]))")
    done: list[tuple[int, dict]] = []
    stop = threading.Event()

    def work() -> None:
        with db.connect(logins.worker) as w:
            while not stop.is_set():
                rows = claim(w, ["bulk"], 20)
                for job_id, lease, *rest in rows:
                    if w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]:
                        done.append((job_id, rest[5]))
                if not rows:
                    stop.wait(0.01)  # an idle worker's poll interval

    with ThreadPoolExecutor(4) as pool:
        workers = [pool.submit(work) for _ in range(3)]
        with db.connect(logins.operator) as op:
            calls = []
            while n := op.execute("select awa.retry_jobs('bulk', max_jobs => 3000)").fetchone()[0]:
                calls.append(n)
        try:
            wait_until(lambda: len(done) >= total + 500, timeout=180,
                       what="the workers to complete every job")
        finally:
            stop.set()
        for f in workers:
            f.result()
    assert calls == [3000, 3000, 3000, 1000]
    retried = [(j, a) for j, a in done if j in args]
    assert len(retried) == total and len({j for j, _ in retried}) == total
    assert all(a == args[j] for j, a in retried)
    with db.connect() as su:
        assert su.execute("select count(*), count(distinct job_id) from awa.finished"
                          " where job_id = any(%s) and state = 'completed'",
                          [ids]).fetchone() == (total, total)
        assert su.execute("select count(*) from awa.finished where state = 'failed'"
                          ).fetchone()[0] == 0


# -- retention ----------------------------------------------------------------------------


def test_a_cancelled_job_keeps_its_args_and_goes_with_the_failed_retention(db, logins):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "ret", "k", args=Jsonb({"keep": True}), ordering_key=b"rk")[0]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_job(%s)", [job_id]).fetchone()[0]
        op.execute("select awa.set_retention('ret', '1 hour', '3 days')")
    with db.connect() as su:
        row = su.execute("select state, args, ordering_key, slot = awa._finished_slot("
                         "'failed', finished_at) from awa.finished where job_id = %s",
                         [job_id]).fetchone()
        assert row == ("cancelled", {"keep": True}, b"rk", True)  # the failed ring's slot
        # Two days on: past the completed retention, within the failed one.
        su.execute("update awa.finished set finished_at = now() - interval '2 days',"
                   " slot = awa._finished_slot('cancelled', now() - interval '2 days')"
                   " where job_id = %s", [job_id])
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 0
    with db.connect(logins.operator) as op:
        assert job(op, job_id)["state"] == "cancelled"
        op.execute("select awa.set_retention('ret', '10 years', '1 day')")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_finished()").fetchone()[0] == 1
    with db.connect(logins.operator) as op:
        assert job(op, job_id) is None


# -- who may, and bad input -----------------------------------------------------------------

OPERATOR_CALLS = [
    "select awa.retry_job(1)", "select awa.cancel_job(1)",
    "select awa.retry_jobs('who')", "select awa.cancel_jobs('who')",
]
READER_CALLS = [
    "select * from awa.job(1)", "select * from awa.jobs('who')",
    "select awa.count_jobs('who', 'failed')",
]


@pytest.mark.parametrize("cap", ["producer", "worker", "maintenance", "operator", "reader"])
def test_who_may_call_the_job_tools(db, logins, cap):
    with db.connect() as su:
        su.execute("select awa.enqueue('who', 'k')")
    with db.connect(getattr(logins, cap)) as conn:
        for statement in OPERATOR_CALLS + READER_CALLS:
            allowed = cap == "operator" or (cap == "reader" and statement in READER_CALLS)
            if allowed:
                conn.execute(statement).fetchall()
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)


BAD = [
    ("select * from awa.job(null)", "22004", "job_id must not be null"),
    ("select awa.cancel_job(null)", "22004", "job_id must not be null"),
    ("select awa.retry_job(null)", "22004", "job_id must not be null"),
    ("select * from awa.jobs(null)", "22004", "queue must not be null"),
    ("select * from awa.jobs('nope')", "42704", "queue 'nope' does not exist"),
    ("select * from awa.jobs('bad', 'done')", "22023",
     "state must be one of scheduled, ready, running, completed, failed, cancelled, got 'done'"),
    ("select * from awa.jobs('bad', max_jobs => 0)", "22023",
     "max_jobs must be between 1 and 100000, got 0"),
    ("select * from awa.jobs('bad', max_jobs => 100001)", "22023", "got 100001"),
    ("select * from awa.jobs('bad', max_jobs => null)", "22004", "max_jobs must not be null"),
    ("select * from awa.jobs('bad', 'ready', worker => 'w-1')", "22023",
     "worker 'w-1' holds running jobs only: state must be running or null, got 'ready'"),
    ("select * from awa.jobs('bad', 'failed', worker => '')", "22023",
     "worker '' holds running jobs only: state must be running or null, got 'failed'"),
    ("select awa.count_jobs('bad', null)", "22004", "state must not be null"),
    ("select awa.count_jobs('bad', 'x')", "22023", "state must be one of"),
    ("select awa.count_jobs('bad', 'ready', up_to => -1)", "22023",
     "up_to must be between 1 and 100000, got -1"),
    ("select awa.retry_jobs('bad', max_jobs => 0)", "22023", "max_jobs must be between 1"),
    ("select awa.retry_jobs('bad', state => null)", "22004", "state must not be null"),
    ("select awa.retry_jobs('bad', state => 'ready')", "22023",
     "state must be failed or cancelled, got 'ready'"),
    ("select awa.retry_jobs('bad', 'k', 10, 'Cancelled')", "22023",
     "state must be failed or cancelled, got 'Cancelled'"),
    ("select awa.retry_jobs('nope', state => 'cancelled')", "42704", "does not exist"),
    ("select awa.cancel_jobs('bad', max_jobs => 200000)", "22023", "got 200000"),
    ("select awa.cancel_jobs('bad', max_jobs => null)", "22004", "max_jobs must not be null"),
    ("select awa.retry_jobs('nope')", "42704", "does not exist"),
    ("select awa.cancel_jobs(null)", "22004", "queue must not be null"),
]


@pytest.mark.parametrize(("statement", "sqlstate", "message"), BAD)
def test_bad_input_gets_a_clear_error_and_changes_nothing(db, logins, statement, sqlstate,
                                                         message):
    with db.connect(logins.producer) as p:
        enqueue(p, "bad", "k")
    with db.connect(logins.operator) as op, pytest.raises(psycopg.Error) as err:
        op.execute(statement).fetchall()
    assert err.value.sqlstate == sqlstate
    assert message in str(err.value)
    with db.connect() as su:
        assert su.execute("select count(*) from awa.ready").fetchone()[0] == 1
        assert su.execute("select count(*) from awa.finished").fetchone()[0] == 0


# -- cost ---------------------------------------------------------------------------------

HISTORY = """
    insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                              max_attempts, enqueued_at, args)
    select nextval('awa.job_id_seq'), awa._finished_slot(%(state)s, now()), m.queue_id, 2, 'h',
           %(state)s, 1, 1, now(), case when %(state)s <> 'completed' then '{}'::jsonb end
      from awa.queue_meta m, generate_series(1, %(n)s)
     where m.queue = %(queue)s
"""


def _blocks(conn) -> int:
    """Blocks of schema awa's tables and indexes this transaction has read
    so far: this backend's own, so an autovacuum of the history (which
    pg_statio_all_tables would count) cannot add to a page's."""
    return conn.execute(
        "select coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint"
        " from pg_class c where c.relnamespace = 'awa'::regnamespace"
        " and c.relkind in ('r', 'i')").fetchone()[0]


def test_a_page_reads_what_it_lists_not_the_queues_history(db, logins):
    """A page reads its rows by key: with 120,000 completed, 120,000 failed
    and 3 cancelled jobs in one slot each (and another queue's 120,000 failed
    ones beside them), 5,000 scheduled and 20,000 ready in one lane, every
    page of 100 reads a few hundred blocks at most, where walking any of
    those rows would read thousands. Catches a plan that walks the primary
    key or an index past other states (as a generic plan did, ADR 025)."""
    with db.connect() as su:
        su.execute("select awa.enqueue('hist', 'k'), awa.enqueue('beside', 'k')")
        for queue, state, n in [("hist", "completed", 120_000), ("hist", "failed", 120_000),
                                ("hist", "cancelled", 3), ("beside", "failed", 120_000)]:
            su.execute(HISTORY, {"queue": queue, "state": state, "n": n})
        su.execute("select count(*) from awa.enqueue_batch(array_fill('hist'::text,"
                   " array[20000]), array_fill('k'::text, array[20000]))")
        su.execute("select count(*) from awa.enqueue_batch(array_fill('hist'::text,"
                   " array[5000]), array_fill('k'::text, array[5000]),"
                   " run_ats => array_fill(now() + interval '1 day', array[5000]))")
        su.execute("analyze")
        for state in (*STATES, None):
            su.execute("select count(*) from awa.jobs('hist', %s)", [state])  # plan, cache
            reads = []
            # The fewer of two reads: a page planned again (an autovacuum of
            # the history invalidates the cached plan) reads its probes twice
            # (402 blocks seen for 201); a plan that walks rows reads
            # thousands every time.
            for _ in range(2):
                with su.transaction():
                    before = _blocks(su)
                    got = su.execute("select count(*) from awa.jobs('hist', %s)",
                                     [state]).fetchone()[0]
                    reads.append(_blocks(su) - before)
                assert got == (3 if state == "cancelled" else 0 if state == "running" else 100)
            # The ready window: 1,000 rows of the one lane with jobs; every
            # state's page also probes each of awa.finished's 96 slots.
            bound = {"ready": 600, None: 700}.get(state, 400)
            assert min(reads) < bound, (state, reads)


def test_jobs_of_one_worker_are_its_running_jobs_paged_by_job_id(db, logins):
    """What an operator reads before awa.release_worker: one worker's jobs,
    across the queue's stripes, every page full until the last (the worker
    is matched before the page's limit, not after)."""
    with db.connect() as su:
        su.execute("select awa.set_queue_stripes('wq', 2)")
    with db.connect(logins.producer) as p:
        for _ in range(7):
            enqueue(p, "wq")
    with db.connect(logins.worker) as w:
        held = {"a": [], "b": []}
        for name in ("a", "b", "a", "b", "a"):  # job ids interleave between the workers
            held[name] += [row[0] for row in claim(w, ["wq"], 1, worker=name)]
        [(failing, lease, *_)] = claim(w, ["wq"], 1, worker="a")
        assert w.execute("select awa.fail(%s, %s, 'x')", [failing, lease]).fetchone()[0]
    assert len(held["a"]) == 3 and len(held["b"]) == 2
    with db.connect(logins.reader) as r:
        def of(worker, state=None, after=None, n=100):
            return [tuple(row) for row in r.execute(
                "select job_id, state, worker from awa.jobs('wq', %s, null, %s, %s,"
                " worker => %s)", [state, after, n, worker]).fetchall()]

        assert of("a") == [(j, "running", "a") for j in sorted(held["a"])]
        assert of("a", "running") == of("a")
        assert of("b") == [(j, "running", "b") for j in sorted(held["b"])]
        pages, after = [], None
        while rows := of("a", after=after, n=2):
            pages.append([job_id for job_id, *_ in rows])
            after = rows[-1][0]
        assert pages == [sorted(held["a"])[:2], sorted(held["a"])[2:]]
        assert of("nobody") == []
        # Without a worker: every state, a's failed job (scheduled for its
        # retry) and the ready one too.
        assert {s for _, s in page(r, "wq")} == {"running", "scheduled", "ready"}


def test_release_worker_hands_a_dead_worker_s_jobs_to_the_next_rescue(db, logins):
    """A worker killed with hour-long leases: the operator ends them, the
    next rescue takes those jobs back (attempt counted) and no other
    worker's; the dead run's lease is stale; a heartbeat keeps a live job."""
    with db.connect(logins.producer) as p:
        for _ in range(4):
            enqueue(p, "rw", max_attempts=5)
    with db.connect(logins.worker) as w:
        dead = claim(w, ["rw"], 3, worker="dead-7", lease="1 hour")
        [alive] = claim(w, ["rw"], 1, worker="alive-1", lease="1 hour")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.release_worker('dead-7')").fetchone()[0] == 3
        assert op.execute("select awa.release_worker('dead-7')").fetchone()[0] == 0
        assert op.execute("select awa.release_worker('nobody')").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            op.execute("select awa.release_worker(null)")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 3
    with db.connect(logins.operator) as op:
        for job_id, *_ in dead:
            back = job(op, job_id)
            assert back["state"] in ("scheduled", "ready"), back
            assert back["last_error"] == "lease expired" and back["attempt"] == 1
        assert job(op, alive[0])["state"] == "running"
    with db.connect(logins.worker) as w:
        stale = dead[0]
        assert not w.execute("select awa.complete(%s, %s)", [stale[0], stale[1]]).fetchone()[0]
    # A live worker's heartbeat after a release keeps its job.
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.release_worker('alive-1')").fetchone()[0] == 1
    with db.connect(logins.worker) as w:
        assert w.execute("select awa.heartbeat(%s, %s, '1 hour')",
                         [alive[0], alive[1]]).fetchone()[0]
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 0
    for login in (logins.producer, logins.worker, logins.reader, logins.maintenance):
        with db.connect(login) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("select awa.release_worker('dead-7')")


def test_release_worker_waits_for_a_call_that_holds_a_run_and_two_releases_agree(db, logins):
    """A heartbeat in flight holds its row: the release waits for it (no
    error, no row skipped) and then ends that lease too; two operators
    releasing the same worker at once both finish, every lease ended."""
    with db.connect(logins.producer) as p:
        for _ in range(6):
            enqueue(p, "rwc")
    with db.connect(logins.worker) as w:
        runs = claim(w, ["rwc"], 6, worker="gone", lease="1 hour")
    holder = psycopg.connect(db.dsn(logins.worker))
    try:
        holder.execute("select awa.heartbeat(%s, %s, '1 hour')", [runs[2][0], runs[2][1]])
        release = behind(db, holder, psycopg.connect(db.dsn(logins.operator)),
                         lambda c: c.execute("select awa.release_worker('gone')").fetchone()[0])
    finally:
        holder.close()
    release.conn.close()
    assert release.error is None and release.result == 6
    with db.connect(logins.producer) as p:
        for _ in range(6):
            enqueue(p, "rwc")
    with db.connect(logins.worker) as w:
        claim(w, ["rwc"], 6, worker="gone-2", lease="1 hour")

    def both(_: int) -> int:
        with db.connect(logins.operator) as op:
            return op.execute("select awa.release_worker('gone-2')").fetchone()[0]

    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(both, range(2)))
    # The second waits for the first's rows, then may end them again (its
    # own now()): a count each, never an error or a deadlock.
    assert max(counts) >= 1
    with db.connect() as su:
        assert su.execute("select count(*) from awa.running where worker = 'gone-2'"
                          " and lease_expires_at > now()").fetchone()[0] == 0


@contextmanager
def snapshot_before_rewrite(db, login: str, *tables: str) -> Iterator[psycopg.Connection]:
    """``login``'s transaction in repeatable read, its snapshot taken, then
    each of ``tables`` (ready, scheduled) rewritten and committed, as
    awa.compact_ready and awa.compact_scheduled do it once due."""
    with db.connect(login, autocommit=False) as conn, db.connect(autocommit=False) as su:
        conn.execute("set transaction isolation level repeatable read")
        conn.execute("select 1")
        for table in tables:
            su.execute(f"select awa._rewrite_live('awa.{table}', 'awa.{table}_rewrite')")
        su.commit()
        yield conn


SNAPSHOT_READS = {
    "count": "select awa.count_jobs('snap', 'ready')",
    "page": "select count(*) from awa.jobs('snap', 'ready')",
    "job": "select count(*) from awa.job(%(job_id)s)",
}


@pytest.mark.parametrize("read", list(SNAPSHOT_READS))
def test_a_snapshot_older_than_a_rewrite_is_refused_by_the_job_tools(db, logins, read):
    """A rewrite (here of awa.ready, as awa.compact_ready makes it) truncates
    the table and copies its rows back: a repeatable read snapshot taken
    before it committed reads the table empty. The bulk tools count in such
    a snapshot, and counted 0 ready jobs; now every read of the job tools
    refuses it (40001: read again, in a new transaction)."""
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, "snap", "k")[0] for _ in range(5)]
    statement = SNAPSHOT_READS[read]
    with snapshot_before_rewrite(db, logins.reader, "ready") as r:
        with pytest.raises(psycopg.errors.SerializationFailure) as refused:
            r.execute(statement, {"job_id": ids[0]})
        assert refused.value.diag.message_primary == (
            "awa.ready was rewritten by maintenance after this transaction's snapshot was"
            " taken, which reads it empty")
        r.rollback()
        # In read committed, and in a snapshot taken since, the rows are there.
        assert r.execute(statement, {"job_id": ids[0]}).fetchone()[0] == (
            5 if read in ("count", "page") else 1)
        r.rollback()
        r.execute("set transaction isolation level repeatable read")
        assert r.execute(statement, {"job_id": ids[0]}).fetchone()[0] == (
            5 if read in ("count", "page") else 1)


def test_a_rewrite_of_a_table_a_call_does_not_read_refuses_no_snapshot(db, logins):
    """A failure summary reads awa.finished only: a rewrite of awa.ready
    after its snapshot changes nothing it answers. In read committed, a
    table the transaction has not read may be rewritten between a
    statement's snapshot and its catalog cache (the whole API at once
    refused a retry so): only tables the transaction holds count."""
    with db.connect(logins.producer) as p:
        enqueue(p, "snap", "k")
    with snapshot_before_rewrite(db, logins.reader, "ready") as r:
        assert r.execute("select count(*) from awa.failure_summary('snap')"
                         ).fetchone()[0] == 0


def test_a_rewrite_in_progress_or_rolled_back_refuses_no_snapshot(db, logins):
    with db.connect(logins.producer) as p:
        for _ in range(3):
            enqueue(p, "snap", "k")
    with db.connect(logins.reader) as r, db.connect(autocommit=False) as su:
        su.execute("select awa._rewrite_live('awa.ready', 'awa.ready_rewrite')")
        su.rollback()
        assert r.execute(SNAPSHOT_READS["count"]).fetchone()[0] == 3


@pytest.mark.one_version
def test_a_bulk_count_overtaken_by_a_rewrite_is_taken_again(db, logins):
    """`awa jobs cancel --queue` and the admin page's plan count in the
    snapshot of their bound (count_in_bound): one taken as a rewrite of
    awa.ready held the table counted 0 ready jobs, so the plan asked to
    cancel the 1 scheduled job, and the CLI went on to cancel every job.
    The count is refused (40001) and taken again in a new transaction."""
    from awa_sql.bulk_bound import count_in_bound
    with db.connect(logins.producer) as p:
        for _ in range(5):
            enqueue(p, "recount", "k")
        p.execute("select awa.enqueue('recount', 'k', run_at => now() + interval '1 hour')")
    with db.connect(autocommit=False) as su, db.connect(logins.operator) as op:
        su.execute("select awa._rewrite_live('awa.ready', 'awa.ready_rewrite')")
        call = behind(db, su, op, lambda c: count_in_bound(
            c, "recount", ("ready", "scheduled"), None, 100))
    assert call.error is None
    assert call.result[1] == {"ready": 5, "scheduled": 1}


@pytest.mark.one_version
@pytest.mark.parametrize("tool", ["cli", "admin"])
def test_the_job_tools_read_committed_whatever_the_logins_default(db, logins, tool):
    """With a login's default_transaction_isolation at repeatable read, a
    bulk cancel failed half way with 40001 as workers claimed beside it, and
    the job tools read a rewritten table empty."""
    with db.connect() as su:
        su.execute(f'alter role "{logins.operator}"'
                   " set default_transaction_isolation = 'repeatable read'")
    if tool == "cli":
        from awa_sql.cli.jobs import _connect
        with _connect(db.dsn(logins.operator)) as conn:
            level = conn.execute("show transaction_isolation").fetchone()[0]
    else:
        from awa_sql.admin.app import Settings, make_pool
        with make_pool(Settings(dsn=db.dsn(logins.operator)), open_now=True) as pool, \
                pool.connection() as conn:
            level = conn.execute("show transaction_isolation").fetchone()[0]
    assert level == "read committed"


SNAPSHOT_WRITES = {
    "cancel a ready job": "select awa.cancel_job(%(ready)s)",
    "cancel a scheduled job": "select awa.cancel_job(%(scheduled)s)",
    "cancel the queue's": "select awa.cancel_jobs('snapw')",
    "exact counts": "select ready + scheduled from awa.queue_counts('snapw')",
}


@pytest.mark.parametrize("call", list(SNAPSHOT_WRITES))
def test_an_operator_call_in_a_snapshot_older_than_a_rewrite_is_refused_and_changes_nothing(
        db, logins, call):
    """After a rewrite of awa.ready and awa.scheduled, a repeatable read
    snapshot taken before it found neither job: cancel_job answered false
    for a live job, cancel_jobs cancelled 0, queue_counts counted 0."""
    with db.connect(logins.producer) as p:
        ids = {"ready": enqueue(p, "snapw", "k")[0],
               "scheduled": enqueue(p, "snapw", "k", run_at=datetime_in_an_hour(p))[0]}
    statement = SNAPSHOT_WRITES[call]
    with snapshot_before_rewrite(db, logins.operator, "ready", "scheduled") as op:
        with pytest.raises(psycopg.errors.SerializationFailure):
            op.execute(statement, ids)
        op.rollback()
        assert [job(op, i)["state"] for i in ids.values()] == ["ready", "scheduled"]
        answer = op.execute(statement, ids).fetchone()[0]
    assert answer == (2 if call in ("cancel the queue's", "exact counts") else True)


def datetime_in_an_hour(conn):
    return conn.execute("select now() + interval '1 hour'").fetchone()[0]


def test_looking_up_a_job_keeps_no_lock_per_lane(db, logins):
    """awa.job of an id no table holds (rolled back, pruned) walks every lane
    with ready rows; awa.cancel_job and awa.run_outcome too. It read each
    lane's sequence, which PostgreSQL 17 keeps locked until the transaction
    ends: one lock for every lane of every queue, and at a few hundred
    queues the calls, and every other session beside them, failed 53200
    (the shared lock table full)."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array(select 'lk' || i from generate_series(1, 40)"
                  " as i), array_fill('k'::text, array[40]))")
    with db.connect(logins.producer, autocommit=False) as p:
        gone = enqueue(p, "lk1", "k")[0]
        p.rollback()
    with db.connect(logins.reader, autocommit=False) as r:
        assert job(r, gone) is None
        sequences = r.execute(
            "select count(*) from pg_locks as l join pg_class as c on c.oid = l.relation"
            " where l.pid = pg_backend_pid() and c.relkind = 'S'").fetchone()[0]
    assert sequences <= 1  # awa.job_id_seq, read once: not one a lane
