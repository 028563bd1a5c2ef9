"""The bulk job tools take what their count saw, and bounded bytes a call.

`awa jobs retry|cancel --queue Q` counts the jobs, then calls
awa.retry_jobs / awa.cancel_jobs in batches. Each call took whatever was
first at that moment: a retried job that failed again kept its id and was
retried again by the next batch instead of the jobs not reached, and new
ready jobs used up a cancel's count before the counted scheduled ones. Now
the CLI reads the server's clock in the snapshot of its count and gives
each call that bound (finished_before, enqueued_before), and loops until a
call finds none left before it.

Each call also stops at awa._pass_bytes() of payload (awa._job_bytes), as
promote, rescue and the carry do: 10,000 jobs of 110 KB args made every
retry fail 54000 (a jsonb[] over 1 GB). These tests lower the bound in
their own database, so that their payloads stay small.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from psycopg.types.json import Jsonb

from awa_sql.cli import jobs as cli_jobs
from awa_sql.cli import main
from tests.support.jobs import claim, claim_all, enqueue

# --- the bound of what the count saw -------------------------------------------------


def _fail_ready(w, queue: str) -> list[int]:
    """Claims every ready job of `queue` and fails each attempt."""
    failed = []
    for job_id, lease, *_ in claim_all(w, [queue], 1000):
        assert w.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease]).fetchone()[0]
        failed.append(job_id)
    return failed


def _state(su, job_id: int) -> str | None:
    row = su.execute("select state from awa.job(%s)", [job_id]).fetchone()
    return None if row is None else row[0]


def test_retry_jobs_with_finished_before_passes_over_a_job_that_failed_again(db, logins):
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, "again", max_attempts=1)[0] for _ in range(4)]
    with db.connect(logins.worker) as w:
        assert sorted(_fail_ready(w, "again")) == ids
    with db.connect(logins.operator) as op, db.connect(logins.worker) as w:
        before = op.execute("select clock_timestamp()").fetchone()[0]
        retry = "select awa.retry_jobs('again', max_jobs => 2, finished_before => %s)"
        assert op.execute(retry, [before]).fetchone()[0] == 2
        assert sorted(_fail_ready(w, "again")) == ids[:2]  # failed again, after the bound
        assert op.execute(retry, [before]).fetchone()[0] == 2
        assert sorted(_fail_ready(w, "again")) == ids[2:]
        assert op.execute(retry, [before]).fetchone()[0] == 0
        # Without the bound, the lowest ids first, as before.
        assert op.execute("select awa.retry_jobs('again', max_jobs => 2)").fetchone()[0] == 2
        assert sorted(c[0] for c in claim(w, ["again"])) == ids[:2]


def test_cancel_jobs_with_enqueued_before_leaves_the_jobs_enqueued_after(db, logins):
    with db.connect(logins.producer) as p:
        counted = [enqueue(p, "flood")[0] for _ in range(2)]
        counted += [enqueue(p, "flood", run_at="2999-01-01")[0] for _ in range(2)]
    with db.connect(logins.operator) as op, db.connect(logins.producer) as p, \
            db.connect() as su:
        before = op.execute("select clock_timestamp()").fetchone()[0]
        later = [enqueue(p, "flood")[0] for _ in range(3)]
        cancel = "select awa.cancel_jobs('flood', max_jobs => 2, enqueued_before => %s)"
        assert [op.execute(cancel, [before]).fetchone()[0] for _ in range(3)] == [2, 2, 0]
        assert [_state(su, j) for j in counted] == ["cancelled"] * 4
        assert [_state(su, j) for j in later] == ["ready"] * 3


@contextmanager
def _cli_with(monkeypatch, between):
    """`awa jobs` run in this process, `between()` run after each transaction
    its connection commits (the count's, each batch's): a worker or a
    producer acting between batches, deterministically."""
    connect = cli_jobs._connect

    class Between:
        def __init__(self, conn):
            self._conn = conn

        def __getattr__(self, name):
            return getattr(self._conn, name)

        def __enter__(self):
            self._conn.__enter__()
            return self

        def __exit__(self, *exc):
            return self._conn.__exit__(*exc)

        @contextmanager
        def transaction(self):
            with self._conn.transaction() as tx:
                yield tx
            between()

    monkeypatch.setattr(cli_jobs, "_connect",
                        lambda dsn, autocommit=False: Between(connect(dsn, autocommit)))
    yield


@pytest.mark.one_version
def test_the_cli_retry_with_a_worker_failing_each_retried_job_at_once_retries_each_once(
        db, logins, monkeypatch, capsys):
    """t5 of the review: 300 failed jobs, a worker failing them again at
    once, --batch 50: "retried 300 jobs", but 61 never ran and 61 ran twice.
    Here 9 jobs, --batch 3, and the worker fails what is ready after each
    batch."""
    with db.connect(logins.producer) as p:
        ids = [enqueue(p, "poison", max_attempts=1)[0] for _ in range(9)]
    runs = dict.fromkeys(ids, 0)
    with db.connect(logins.worker) as w:
        assert sorted(_fail_ready(w, "poison")) == ids

        def work():
            for job_id in _fail_ready(w, "poison"):
                runs[job_id] += 1

        with _cli_with(monkeypatch, work):
            code = main(["jobs", "retry", "--dsn", db.dsn(logins.operator), "--queue", "poison",
                         "--batch", "3", "--yes", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out) == {"queue": "poison", "kind": None, "state": "failed",
                                   "retried": 9, "more": False}
    assert out.err == ""
    assert runs == dict.fromkeys(ids, 1)


@pytest.mark.one_version
def test_the_cli_cancel_while_producers_enqueue_cancels_the_jobs_it_counted(
        db, logins, monkeypatch, capsys):
    """t4 of the review: new ready jobs used up the count (a cancel takes
    ready jobs first) and the 300 scheduled ones counted were never
    reached. Here 3 ready and 3 scheduled, --batch 2, and a producer
    enqueues 2 ready jobs after the count and after each batch."""
    with db.connect(logins.producer) as p:
        ready = [enqueue(p, "flood")[0] for _ in range(3)]
        scheduled = [enqueue(p, "flood", run_at="2999-01-01")[0] for _ in range(3)]
    later: list[int] = []
    with db.connect(logins.producer) as p:
        def produce():
            later.extend(enqueue(p, "flood")[0] for _ in range(2))

        with _cli_with(monkeypatch, produce):
            code = main(["jobs", "cancel", "--dsn", db.dsn(logins.operator), "--queue", "flood",
                         "--batch", "2", "--yes"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out == "cancelled 6 jobs of flood\n"
    assert out.err == ""
    with db.connect() as su:
        assert [_state(su, j) for j in ready + scheduled] == ["cancelled"] * 6
        assert len(later) >= 6
        assert {_state(su, j) for j in later} == {"ready"}


@pytest.mark.one_version
def test_the_cli_cancel_says_so_when_it_took_a_job_back_from_a_failed_attempt(
        db, logins, monkeypatch, capsys):
    """A job running at the count is not counted; back to wait after a
    failed attempt it keeps its first enqueue time, which is before the
    bound, so the cancel takes it too and says so."""
    with db.connect(logins.producer) as p:
        running = enqueue(p, "mixed")[0]
    with db.connect(logins.worker) as w:
        [(job_id, lease, *_)] = claim(w, ["mixed"])
        assert job_id == running
    with db.connect(logins.producer) as p:
        waiting = [enqueue(p, "mixed", run_at="2999-01-01")[0] for _ in range(2)]
    failed_once = []
    with db.connect(logins.worker) as w:
        def fail_the_running_one():
            if not failed_once:
                failed_once.append(
                    w.execute("select awa.fail(%s, %s, 'boom')", [running, lease]).fetchone()[0])

        with _cli_with(monkeypatch, fail_the_running_one):
            code = main(["jobs", "cancel", "--dsn", db.dsn(logins.operator), "--queue", "mixed",
                         "--yes"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert failed_once == [True]
    assert out.out == "cancelled 3 jobs of mixed\n"
    assert "1 job cancelled beyond the 2 ready or scheduled jobs counted: it was being " \
           "enqueued as the count ran, or came back to wait since (a failed attempt, a " \
           "retry)" in out.err, out.err
    with db.connect() as su:
        assert [_state(su, j) for j in [running, *waiting]] == ["cancelled"] * 3


# --- the payload bound ----------------------------------------------------------------

# The bound of this test's database: a few jobs of about 8 KB pass it.
BOUND = 20_000
# Random hex: neither pglz nor lz4 compresses it, so the stored size is the size.
BLOB = ("select pg_catalog.jsonb_build_object('blob', string_agg(md5(random()::text), ''))"
        " from generate_series(1, 256)")


@pytest.fixture
def small_bound(db) -> int:
    """awa._pass_bytes() of this database lowered to BOUND (calls made on
    connections opened after this plan it anew)."""
    with db.connect() as su:
        su.execute(f"""
            create or replace function awa._pass_bytes()
            returns bigint
            language sql
            immutable parallel safe
            as $$ select {BOUND}::pg_catalog.int8 $$""")
        assert su.execute("select awa._pass_bytes()").fetchone()[0] == BOUND
    return BOUND


def _big(p, queue: str, n: int, **kw) -> list[int]:
    args = Jsonb(p.execute(BLOB).fetchone()[0])
    return [enqueue(p, queue, "k", args=args, **kw)[0] for _ in range(n)]


def _sizes(su, table: str, ids: list[int]) -> list[int]:
    rows = su.execute(f"select awa._job_bytes(kind, args, last_error) from awa.{table}"
                      " where job_id = any(%s) order by job_id", [ids]).fetchall()
    return [r[0] for r in rows]


def test_retry_jobs_stops_at_the_pass_bytes_then_takes_the_rest(db, logins, small_bound):
    with db.connect(logins.producer) as p:
        ids = _big(p, "bytes", 5)
    with db.connect(logins.operator) as op:
        assert [op.execute("select awa.cancel_jobs('bytes')").fetchone()[0]
                for _ in range(3)] == [3, 2, 0]
    with db.connect() as su:
        sizes = _sizes(su, "finished", ids)
    # Three a call: the third starts below the bound, a fourth would not.
    assert all(small_bound // 3 < s < small_bound // 2 for s in sizes), sizes
    with db.connect(logins.operator) as op, db.connect(logins.worker) as w:
        retry = "select awa.retry_jobs('bytes', state => 'cancelled')"
        assert op.execute(retry).fetchone()[0] == 3
        assert sorted(c[0] for c in claim(w, ["bytes"])) == ids[:3]
        assert [op.execute(retry).fetchone()[0] for _ in range(2)] == [2, 0]
        assert sorted(c[0] for c in claim(w, ["bytes"])) == ids[3:]


def test_cancel_jobs_stops_at_the_pass_bytes_across_ready_and_scheduled(db, logins,
                                                                         small_bound):
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('bytes', 1)")  # one lane: its order
    with db.connect(logins.producer) as p:
        ready = _big(p, "bytes", 5)
    with db.connect(logins.operator) as op, db.connect() as su:
        assert all(small_bound // 3 < s < small_bound // 2
                   for s in _sizes(su, "ready", ready))
        cancel = "select awa.cancel_jobs('bytes')"
        assert op.execute(cancel).fetchone()[0] == 3
        assert [_state(su, j) for j in ready] == ["cancelled"] * 3 + ["ready"] * 2
        # Two ready and three scheduled: the scheduled ones go on from the
        # payload the ready ones copied.
        with db.connect(logins.producer) as p:
            scheduled = _big(p, "bytes", 3, run_at="2999-01-01")
        assert [op.execute(cancel).fetchone()[0] for _ in range(3)] == [3, 2, 0]
        assert [_state(su, j) for j in ready + scheduled] == ["cancelled"] * 8


def test_one_job_over_the_bound_is_still_retried_and_cancelled(db, logins, small_bound):
    with db.connect(logins.producer) as p:
        job = enqueue(p, "huge", "k", args=Jsonb(p.execute(BLOB.replace("256", "1024"))
                                                 .fetchone()[0]))[0]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_jobs('huge')").fetchone()[0] == 1
        assert op.execute("select awa.retry_jobs('huge', state => 'cancelled')"
                          ).fetchone()[0] == 1
    with db.connect() as su:
        assert _sizes(su, "ready", [job])[0] > small_bound
        assert _state(su, job) == "ready"


@pytest.mark.one_version
def test_the_cli_goes_on_past_a_call_that_stopped_at_the_bound(db, logins, small_bound):
    """A call that stopped at the payload bound took fewer than --batch: the
    command calls again until a call finds none left."""
    with db.connect(logins.producer) as p:
        ids = _big(p, "bytes", 5)
    db.awa("jobs", "cancel", "--queue", "bytes", "--yes", user=logins.operator, check=True)
    done = db.awa("jobs", "retry", "--queue", "bytes", "--state", "cancelled", "--yes",
                  user=logins.operator, check=True)
    assert done.stdout == "retried 5 jobs of bytes\n" and done.stderr == ""
    with db.connect() as su:
        assert [_state(su, j) for j in ids] == ["ready"] * 5
