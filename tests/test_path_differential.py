"""Each fast path stores what its general path stores, for the same input.

awa.enqueue writes one row in its own frame (general: awa._check_job, then
awa._enqueue_rows); awa.enqueue_batch serves valid, unkeyed, due rows of one
plain queue at one priority with one lane range (general: awa._enqueue_rows);
COPY's dispatcher moves one-queue loads with awa._move_staged_one_lane /
_by_key and others with awa._move_staged_sets (general: the batch path,
awa._move_staged_in_batches). A job's own max run time goes through each of
them but awa.enqueue, which takes none (stored in seconds, compared as
text). Random
inputs, biased to the shapes the fast paths serve, go through both in rolled
back transactions of one backend (so the sticky lane is the same): the
stored rows, their lanes, their order within each lane and the errors must
be equal, and both must agree with a Python oracle of what is valid, so a
check weakened on either path fails here. The stored rows are compared
column by column from the catalog (every column of awa.ready and
awa.scheduled but those NOT_COMPARED says differ by nature), so a column a
new migration adds and one path forgets fails here too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tests.support.jobs import LANE_CLASS, copy_rows, valid_job

QUEUES = ["dp", "dp1", "dpart", "fresh", "dp#1", "", "x" * 201, None]
NOW_QUEUES = ["dp", "dp1"]
# The columns of awa.ready and awa.scheduled that two runs of the same input
# store differently by nature, and what is compared instead. Every other
# column, read from the catalog, is compared as text (a max run time is
# stored in seconds: 24:00:00, not 1 day).
NOT_COMPARED = {
    "job_id": "drawn from a sequence: compared as its rank among the jobs stored",
    "lane_seq": "drawn from the lane's sequence: compared as the offset from the lane's "
                "first row stored",
    "lane_id": "a lane's id: compared as its (queue, priority, shard)",
    "queue_id": "a queue created in one run is created again, with a new id, in the next "
                "(each run is rolled back): compared as the queue's name",
    "enqueued_at": "a timestamp of the run (now())",
    "ready_at": "a timestamp of the run (clock_timestamp())",
}
JOB_TABLES = ("ready", "scheduled")
CATALOG_COLUMNS = """
    select c.relname, a.attname
      from pg_attribute a join pg_class c on c.oid = a.attrelid
     where c.relnamespace = 'awa'::regnamespace and c.relname = any(%s)
       and a.attnum > 0 and not a.attisdropped
     order by array_position(%s, c.relname::text), a.attnum
"""
_STORED: dict[int, tuple[list[str], str]] = {}


def compared_columns(conn) -> list[str]:
    """The columns compared, in the catalog's order (awa.ready's first)."""
    return _stored(conn)[0]


def _stored(conn) -> tuple[list[str], str]:
    """The compared columns, and the query of what this transaction stored:
    job_id, the lane (queue, priority, shard; nulls for awa.scheduled),
    lane_seq, then each compared column as text (null where a table has none)."""
    key = conn.info.server_version
    if key not in _STORED:
        rows = conn.execute(CATALOG_COLUMNS, [list(JOB_TABLES), list(JOB_TABLES)]).fetchall()
        have = {t: [c for r, c in rows if r == t] for t in JOB_TABLES}
        columns = list(dict.fromkeys(c for _, c in rows if c not in NOT_COMPARED))

        def values(table, alias):
            return ", ".join(f"{alias}.{c}::text" if c in have[table] else "null::text"
                             for c in columns)
        query = f"""
            select r.job_id, m.queue, l.priority, l.shard, r.lane_seq, {values("ready", "r")}
              from awa.ready r join awa.lanes l using (lane_id)
              join awa.queue_meta m on m.queue_id = r.queue_id
             where r.xmin = pg_current_xact_id()::xid
            union all
            select s.job_id, m.queue, null, null, null, {values("scheduled", "s")}
              from awa.scheduled s join awa.queue_meta m using (queue_id)
             where s.xmin = pg_current_xact_id()::xid
        """
        _STORED[key] = (columns, query)
    return _STORED[key]
FUTURE = datetime(2999, 1, 1, tzinfo=UTC)
PAST = datetime(2000, 1, 1, tzinfo=UTC)
MIN_RUN, MAX_RUN = timedelta(seconds=1), timedelta(days=30)
# Max run times: none, in range (a day is stored as 24:00:00), at and past the limits.
RUN_TIMES = [None, MIN_RUN, timedelta(minutes=5), timedelta(days=1), MAX_RUN,
             timedelta(milliseconds=999), MAX_RUN + timedelta(microseconds=1), timedelta(0),
             timedelta(seconds=-5)]

job = st.fixed_dictionaries({
    "queue": st.sampled_from(QUEUES),
    "kind": st.sampled_from(["k", "other", None]),
    "args": st.sampled_from([None, {"n": 1}]),
    "priority": st.sampled_from([None, 0, 1, 2, 4, 5]),
    "key": st.sampled_from([None, b"a", b"customer-42", b""]),
    "run_at": st.sampled_from([None, PAST, FUTURE]),
    "max_attempts": st.sampled_from([None, 0, 1, 25, 1001]),
    "max_run_time": st.sampled_from(RUN_TIMES),
})


@st.composite
def fast_shaped(draw):
    """Rows the fast paths serve (one plain queue, one priority and max_attempts,
    unkeyed, due), or would if their one priority or max_attempts were in range."""
    queue = draw(st.sampled_from(NOW_QUEUES))
    priority = draw(st.sampled_from([None, 1, 3, 4, 0, 5]))
    attempts = draw(st.sampled_from([None, 1, 1000, 0, 1001]))
    keyed = draw(st.booleans())
    run_time = draw(st.sampled_from([None, None, None, *RUN_TIMES]))
    return [{"queue": queue, "kind": "k", "args": {"i": i}, "priority": priority,
             "key": (b"key-%d" % (i % 3)) if keyed else None, "run_at": None,
             "max_attempts": attempts, "max_run_time": run_time}
            for i in range(draw(st.integers(1, 12)))]


jobs = st.one_of(fast_shaped(), st.lists(job, min_size=1, max_size=8))


def _shaped(**change):
    """Two rows of the fast shape, with `change` applied to both."""
    return [{"queue": "dp", "kind": "k", "args": None, "priority": None, "key": None,
             "run_at": None, "max_attempts": None, "max_run_time": None, **change}
            for _ in range(2)]


# Each limit the fast paths check, just inside and just outside.
EDGES = [_shaped(), _shaped(priority=1), _shaped(priority=4), _shaped(priority=0),
         _shaped(priority=5), _shaped(max_attempts=1), _shaped(max_attempts=1000),
         _shaped(max_attempts=0), _shaped(max_attempts=1001), _shaped(kind=None),
         _shaped(queue="dp#1"), _shaped(key=b"a"), _shaped(run_at=FUTURE),
         _shaped(max_run_time=MIN_RUN), _shaped(max_run_time=MAX_RUN),
         _shaped(max_run_time=timedelta(milliseconds=999)),
         _shaped(max_run_time=MAX_RUN + timedelta(microseconds=1)),
         _shaped(max_run_time=timedelta(days=1)),
         _shaped(max_run_time=timedelta(days=1), key=b"a"),
         _shaped(max_run_time=timedelta(days=1), run_at=FUTURE)]


def edges(test):
    for rows in reversed(EDGES):
        test = example(rows=rows)(test)
    return test


def _valid(j) -> bool:
    """A null priority or max_attempts takes its default, as in a batch or COPY;
    a null max run time is none of the job's own."""
    return valid_job(j["queue"], j["kind"],
                     j["priority"] if j["priority"] is not None else 2,
                     j["max_attempts"] if j["max_attempts"] is not None else 25) and (
        j["max_run_time"] is None or MIN_RUN <= j["max_run_time"] <= MAX_RUN)


def _normalise(stored):
    """Job ids as ranks; lane_seq as the offset from the lane's first row in the call."""
    ids = sorted(r[0] for r in stored)
    first = {}
    for r in stored:
        if r[4] is not None:
            lane = (r[1], r[2], r[3])
            first[lane] = min(first.get(lane, r[4]), r[4])
    return sorted((ids.index(r[0]), *r[1:4], None if r[4] is None else r[4] - first[r[1:4]],
                   *r[5:]) for r in stored)


def _in_returned_order(returned, stored):
    """The stored rows, without id and lane_seq, in the order the call returned their ids."""
    if returned is None:
        return None
    by_id = {r[0]: (*r[1:4], *r[5:]) for r in stored}
    return [by_id.get(r[0]) for r in returned]


def _without_ids(outcome):
    if outcome[0] != "ok":
        return outcome
    return (outcome[0], sorted((r[1:] for r in outcome[1]), key=repr), outcome[2])


def _attempt(conn, steps):
    """Runs `steps(conn)` in a transaction that is rolled back; what it stored, or its error."""
    try:
        returned = steps(conn)
        stored = conn.execute(_stored(conn)[1]).fetchall()
        outcome = ("ok", _normalise(stored), _in_returned_order(returned, stored))
    except psycopg.Error as err:
        outcome = ("error", err.sqlstate, err.diag.message_primary)
    conn.rollback()
    return outcome


@pytest.fixture
def conn(db):
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('dp', 4)")
        su.execute("select awa.set_enqueue_shards('dp1', 1)")
        su.execute("select awa.set_queue_partitions('dpart', 2)")
    with db.connect(autocommit=False) as c:
        _stored(c)
        c.rollback()
        yield c


def _arrays(rows):
    return [[r["queue"] for r in rows], [r["kind"] for r in rows],
            [Jsonb(r["args"]) if r["args"] is not None else None for r in rows],
            [r["priority"] for r in rows], [r["key"] for r in rows], [r["run_at"] for r in rows],
            [r["max_attempts"] for r in rows], [r["max_run_time"] for r in rows]]


BATCH = ("select * from awa.enqueue_batch(%s::text[], %s::text[], %s::jsonb[], %s::smallint[],"
         " %s::bytea[], %s::timestamptz[], %s::integer[], %s::interval[])")
ROWS = ("select * from awa._enqueue_rows(%s::text[], %s::text[], %s::jsonb[], %s::smallint[],"
        " %s::bytea[], %s::timestamptz[], %s::integer[], %s::interval[], null, null,"
        " 'batch element', 0)")
CHECK_PROFILE = settings(max_examples=60, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])


@CHECK_PROFILE
@given(rows=jobs)
@edges
def test_batch_fast_path_equals_the_general_path(conn, rows):
    fast = _attempt(conn, lambda c: c.execute(BATCH, _arrays(rows)).fetchall())
    general = _attempt(conn, lambda c: c.execute(ROWS, _arrays(rows)).fetchall())
    assert fast == general
    assert (fast[0] == "ok") == all(_valid(r) for r in rows), fast


SINGLE = ("select * from awa.enqueue(%s, %s, %s, %s::smallint, %s, %s, %s)")


def single_edges(test):
    for rows in reversed(EDGES):
        if rows[0]["max_run_time"] is None:
            test = example(j=rows[0])(test)
    return test


def _single_params(j):
    return [j["queue"], j["kind"], Jsonb(j["args"]) if j["args"] is not None else None,
            j["priority"] if j["priority"] is not None else 2, j["key"], j["run_at"],
            j["max_attempts"] if j["max_attempts"] is not None else 25]


def _single_general(c, params):
    c.execute("select awa._check_job(%s, %s, %s::smallint, %s)",
              [params[0], params[1], params[3], params[6]])
    return c.execute(ROWS, [*([v] for v in params), None]).fetchall()


# awa.enqueue takes no max run time (a job with one is a batch of one, ADR 026).
single_job = st.one_of(fast_shaped().map(lambda rows: rows[0]), job).map(
    lambda j: dict(j, max_run_time=None))


@CHECK_PROFILE
@given(j=single_job)
@single_edges
def test_single_row_fast_path_equals_the_general_path(conn, j):
    params = _single_params(j)
    fast = _attempt(conn, lambda c: c.execute(SINGLE, params).fetchall())
    assert fast == _attempt(conn, lambda c: _single_general(c, params))
    assert (fast[0] == "ok") == _valid(j), fast


@CHECK_PROFILE
@given(js=st.lists(single_job, min_size=2, max_size=6))
@example(js=[dict(EDGES[11][0]), dict(EDGES[0][0]), dict(EDGES[0][0])])
def test_single_rows_in_one_transaction_equal_the_general_path(conn, js):
    """Lane memos carry from call to call within a transaction: a keyed job's
    lane, or a lane other than the sticky one, takes the transaction's later
    unkeyed jobs of that queue and priority, whichever path wrote it."""
    fast = _attempt(conn, lambda c: [c.execute(SINGLE, _single_params(j)).fetchall()
                                     for j in js])
    assert fast == _attempt(conn, lambda c: [_single_general(c, _single_params(j))
                                             for j in js])
    assert (fast[0] == "ok") == all(_valid(j) for j in js), fast


HOLD = """
    select count(pg_advisory_xact_lock(%s, l.lane_id))
      from awa.lanes l join awa.queue_meta m using (queue_id)
     where m.queue = 'dp' and l.shard = any(%s)
"""


@pytest.fixture
def holder(db):
    with db.connect(autocommit=False) as h:
        yield h


def _calls(call, js):
    """Steps that make one call per job, with the rows they return in call order."""
    return lambda c: [row for j in js for row in call(c, _single_params(j))]


@CHECK_PROFILE
@given(js=st.lists(single_job.map(lambda j: dict(j, key=None)), min_size=1, max_size=4),
       held=st.sets(st.integers(0, 3), min_size=1, max_size=3))
@example(js=[dict(EDGES[0][0])], held={0})
@example(js=[dict(EDGES[0][0]), dict(EDGES[0][0], priority=4)], held={0, 1, 2})
@example(js=[dict(EDGES[0][0]), dict(EDGES[0][0])], held={1})
def test_single_rows_with_lanes_held_equal_the_general_path(conn, holder, js, held):
    """Another transaction holds some of queue dp's lanes (never all four;
    `held` counts in this backend's turn, 0 being its sticky lane): where the
    sticky lane is taken, awa.enqueue tries the others in turn and writes a
    memo for the one it takes, choosing as awa._take_lane does. Unkeyed jobs
    only: a keyed job whose lane is held would wait on either path."""
    sticky = conn.execute("select pg_backend_pid() % 4").fetchone()[0]
    conn.rollback()
    holder.execute(HOLD, [LANE_CLASS, [(sticky + i) % 4 for i in held]])
    fast = _attempt(conn, _calls(lambda c, params: c.execute(SINGLE, params).fetchall(), js))
    general = _attempt(conn, _calls(_single_general, js))
    holder.rollback()
    assert fast == general
    assert (fast[0] == "ok") == all(_valid(j) for j in js), fast


def _copy(rows, mover):
    def steps(c):
        copy_rows(c, [(r["queue"], r["priority"], r["key"], r["kind"],
                       Jsonb(r["args"]) if r["args"] is not None else None,
                       r["run_at"], r["max_attempts"], r["max_run_time"]) for r in rows])
        c.execute(mover)
    return steps


@CHECK_PROFILE
@given(rows=jobs)
@edges
def test_copy_fast_movers_equal_the_general_mover(conn, rows):
    # COPY carries no null queue for a dispatcher to see differently; the
    # batch tests cover it.
    rows = [r for r in rows if r["queue"] is not None] or [dict(rows[0], queue="dp")]
    fast = _attempt(conn, _copy(rows, "select awa.enqueue_copied()"))
    sets = _attempt(conn, _copy(rows, "select awa._move_staged_sets(pg_current_xact_id())"))
    general = _attempt(conn, _copy(
        rows, "select awa._move_staged_in_batches(pg_current_xact_id())"))
    assert fast == sets
    # The set-based movers draw job ids in lane order, the batch path in COPY
    # order: a job id promises uniqueness, lane_seq the order.
    assert _without_ids(sets) == _without_ids(general)
    assert (fast[0] == "ok") == all(_valid(r) for r in rows), fast


def test_the_oracle_knows_the_limits():
    base = {"queue": "q", "kind": "k", "args": None, "priority": None, "key": None,
            "run_at": None, "max_attempts": None, "max_run_time": None}
    assert _valid(base)
    assert not _valid(dict(base, priority=5)) and not _valid(dict(base, max_attempts=0))
    assert not _valid(dict(base, priority=0))
    assert not _valid(dict(base, queue="a#b")) and not _valid(dict(base, kind=None))
    assert _valid(dict(base, run_at=datetime.now(UTC) + timedelta(days=1)))
    assert _valid(dict(base, max_run_time=MIN_RUN)) and _valid(dict(base, max_run_time=MAX_RUN))
    assert not _valid(dict(base, max_run_time=timedelta(milliseconds=999)))
    assert not _valid(dict(base, max_run_time=MAX_RUN + timedelta(microseconds=1)))


def test_every_column_is_compared_but_those_that_differ_by_nature(conn):
    """NOT_COMPARED names only columns the tables have, and the rest, all of
    them, are compared: a column added to awa.ready or awa.scheduled is
    compared without a change here."""
    rows = conn.execute(CATALOG_COLUMNS, [list(JOB_TABLES), list(JOB_TABLES)]).fetchall()
    conn.rollback()
    every = {c for _, c in rows}
    assert set(NOT_COMPARED) <= every
    assert set(compared_columns(conn)) == every - set(NOT_COMPARED)
    assert {"priority", "kind", "args", "ordering_key", "attempt", "max_attempts", "run_at",
            "last_error", "max_run_time"} <= set(compared_columns(conn))
