"""docs/security.md, "bad input": any input to the public functions either works
or fails with a documented SQLSTATE, never a syntax error, a missing
relation or column, or an internal error.

Most values drawn are valid (queues that exist, priorities 1 to 4, ...), with
values at and past each limit and wild ones mixed in, so that most calls get
past their checks and run the real path, the one that writes and reads the
tables: each test asserts that at least a third of its calls did. Drawn from
the whole range, nearly every call was refused up front and an internal error
behind the checks went unseen.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# Documented in docs/sql-api.md; 22003 is PostgreSQL's own smallint range check.
DOCUMENTED = {"22004", "22023", "22003", "42704"}
NEVER = {"42601", "42P01", "42703", "XX000"}

FUZZ = settings(deadline=None, derandomize=True)

texts = st.one_of(st.none(), st.text(alphabet=st.characters(exclude_characters="\x00",
                                                                exclude_categories=("Cs",)),
                                     max_size=220))
# Short keys, and keys at and past the 1024-byte cap.
keys = st.one_of(st.none(), st.binary(max_size=64),
                 st.integers(min_value=1020, max_value=1030).map(lambda n: b"k" * n))
ints = st.one_of(st.none(), st.integers(min_value=-70000, max_value=70000))
job_ids = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1))


def mostly(valid, edge, wild=None):
    """``valid`` 17 times in 20, ``edge`` (values at and past the limits) 2 in
    20, ``wild`` (anything of the type) 1 in 20."""
    edge = edge if isinstance(edge, st.SearchStrategy) else st.sampled_from(edge)
    wild = edge if wild is None else wild
    return st.integers(min_value=0, max_value=19).flatmap(
        lambda i: valid if i < 17 else edge if i < 19 else wild)


# Valid names that are awkward in SQL or in bytes; the fixtures below make
# each a queue with jobs.
QUEUES = ["emails", "with space", "quote'\"; drop table awa.ready; --", "\u00fcber",
          "u\u0308ber", "x" * 200, "\u00e9" * 100, "line\nbreak", "%s %(x)s {}", "\U0001f642"]
BAD_QUEUES = [None, "", "#", "a#b", "x" * 201, "\u00e9" * 101]
KINDS = ["send", "charge", "", "k\nind", "\u00fc"]
STATES = ["scheduled", "ready", "running", "completed", "failed", "cancelled"]
# Queue names a call may create: the pool, or any other valid name.
new_names = st.text(alphabet=st.characters(exclude_characters="\x00#",
                                           exclude_categories=("Cs",)),
                    min_size=1, max_size=50)
queue_names = mostly(st.one_of(st.sampled_from(QUEUES), new_names), BAD_QUEUES, texts)
# Queue names an operator call needs to exist.
existing_queues = mostly(st.sampled_from(QUEUES), BAD_QUEUES, texts)
kinds = mostly(st.sampled_from(KINDS), [None], texts)
priorities = mostly(st.integers(min_value=1, max_value=4), [None, -1, 0, 5, 32767, -32768], ints)
attempts = mostly(st.integers(min_value=1, max_value=1000), [None, -1, 0, 1001, 2**31 - 1],
                  ints)
ordering_keys = mostly(st.one_of(st.none(), st.binary(max_size=64)),
                       [b"", b"k" * 1024, b"k" * 1025], keys)
# Due now (past or none) or later; text for what a datetime cannot say.
run_ats = mostly(st.one_of(st.none(), st.timedeltas(min_value=timedelta(days=-1),
                                                   max_value=timedelta(days=30))
                           .map(lambda d: datetime.now(UTC) + d)),
                 ["infinity", "-infinity", "9999-12-31 23:59:59+00", "0001-01-01 00:00:00+00"],
                 st.datetimes(timezones=st.just(UTC)))
max_jobs = mostly(st.integers(min_value=1, max_value=1000),
                  [None, -1, 0, 100000, 100001, -(2**31), 2**31 - 1], ints)


def _call(conn, sql, params) -> bool:
    """True when the call worked, False when it was refused with a documented
    SQLSTATE; any other error fails the test."""
    try:
        conn.execute(sql, params).fetchall()
    except psycopg.Error as err:
        assert err.sqlstate not in NEVER, (err.sqlstate, str(err))
        assert err.sqlstate in DOCUMENTED, (err.sqlstate, str(err))
        return False
    return True


def _most_ran_the_real_path(ran: Counter, *functions: str) -> None:
    assert ran["examples"] >= 20, dict(ran)
    for function in functions:
        assert ran[function] * 3 >= ran["examples"], \
            f"awa.{function} worked in too few examples to test its real path: {dict(ran)}"


@pytest.fixture
def producer_conn(db):
    with db.connect(db.login_role("awa_producer", "awa_operator", "awa_worker")) as conn:
        yield conn


@pytest.fixture
def with_ready_jobs(producer_conn):
    """Every queue of QUEUES, with a ready job of every kind of KINDS."""
    jobs = producer_conn.execute(
        "select * from awa.enqueue_batch(array(select q from unnest(%(q)s::text[]) as q,"
        " unnest(%(k)s::text[]) as k), array(select k from unnest(%(q)s::text[]) as q,"
        " unnest(%(k)s::text[]) as k))", {"q": QUEUES, "k": KINDS}).fetchall()
    assert len(jobs) == len(QUEUES) * len(KINDS)
    return producer_conn


@pytest.fixture
def seeded(with_ready_jobs):
    """And a job in every other state in each queue."""
    conn = with_ready_jobs
    for sql in (
        "select awa.enqueue(q, 'send', priority => 1::smallint, max_attempts => 1)"
        " from unnest(%s::text[]) as q",
        "select awa.fail(c.job_id, c.run_lease, 'boom')"
        " from unnest(%s::text[]) as q, awa.claim(array[q], 1, 'seed') as c",
        "select awa.enqueue(q, 'send', priority => 1::smallint) from unnest(%s::text[]) as q",
        "select awa.complete(c.job_id, c.run_lease)"
        " from unnest(%s::text[]) as q, awa.claim(array[q], 1, 'seed') as c",
        "select awa.enqueue(q, 'send', priority => 1::smallint) from unnest(%s::text[]) as q",
        "select c.job_id from unnest(%s::text[]) as q, awa.claim(array[q], 1, 'w') as c",
        "select awa.cancel_job(e.job_id)"
        " from unnest(%s::text[]) as q, awa.enqueue(q, 'charge') as e",
        "select awa.enqueue(q, 'send', run_at => now() + interval '1 day')"
        " from unnest(%s::text[]) as q",
    ):
        assert len(conn.execute(sql, [QUEUES]).fetchall()) == len(QUEUES), sql
    return conn


def test_enqueue_inputs(producer_conn):
    ran = Counter()

    @settings(FUZZ, max_examples=60)
    @given(queue=queue_names, kind=kinds, priority=priorities, key=ordering_keys,
           run_at=run_ats, max_attempts=attempts)
    def check(queue, kind, priority, key, run_at, max_attempts):
        ran["examples"] += 1
        ran["enqueue"] += _call(
            producer_conn,
            "select * from awa.enqueue(%s::text, %s::text, '{}'::jsonb, %s::smallint,"
            " %s::bytea, %s::timestamptz, %s::integer)",
            [queue, kind, priority if priority is None or abs(priority) < 32768 else None,
             key, run_at, max_attempts])

    check()
    _most_ran_the_real_path(ran, "enqueue")


@st.composite
def batches(draw):
    """Arrays of one length, mostly; or of another length, or wild."""
    n = draw(st.integers(min_value=1, max_value=5))

    def array(valid, edge, wild):
        return draw(mostly(st.lists(valid, min_size=n, max_size=n),
                           st.lists(st.one_of(valid, edge), min_size=n, max_size=n)
                           | st.lists(valid, max_size=6),
                           st.lists(wild, max_size=5)))

    queues = array(st.sampled_from(QUEUES), st.sampled_from(BAD_QUEUES), texts)
    kinds_ = array(st.sampled_from(KINDS), st.none(), texts)
    keys_ = array(st.one_of(st.none(), st.binary(max_size=64)),
                  st.sampled_from([b"", b"k" * 1025]), keys) if draw(st.booleans()) else None
    return queues, kinds_, keys_


def test_enqueue_batch_inputs(producer_conn):
    ran = Counter()

    @settings(FUZZ, max_examples=40)
    @given(batch=batches())
    def check(batch):
        ran["examples"] += 1
        ran["enqueue_batch"] += _call(
            producer_conn, "select * from awa.enqueue_batch(%s::text[], %s::text[],"
            " ordering_keys => %s::bytea[])", list(batch))

    check()
    _most_ran_the_real_path(ran, "enqueue_batch")


def test_operator_inputs(producer_conn):
    ran = Counter()

    @settings(FUZZ, max_examples=40)
    @given(queue=queue_names,
           shards=mostly(st.integers(min_value=1, max_value=4),
                         [None, -1, 0, 1, 64, 65, 2**31 - 1], ints))
    def check(queue, shards):
        ran["examples"] += 1
        ran["set_enqueue_shards"] += _call(
            producer_conn, "select * from awa.set_enqueue_shards(%s::text, %s::integer)",
            [queue, shards])
        ran["pause_queue"] += _call(producer_conn, "select awa.pause_queue(%s::text)", [queue])

    check()
    _most_ran_the_real_path(ran, "set_enqueue_shards", "pause_queue")


def test_claim_inputs(with_ready_jobs):
    ran = Counter()

    @settings(FUZZ, max_examples=40)
    @given(queues=mostly(st.lists(st.sampled_from(QUEUES), min_size=1, max_size=4),
                         st.lists(st.sampled_from(BAD_QUEUES), max_size=2)
                         | st.lists(new_names, max_size=2),
                         st.one_of(st.none(), st.lists(texts, max_size=4))),
           n=mostly(st.integers(min_value=0, max_value=5), [None, -1, 2**31 - 1], ints),
           worker=mostly(st.sampled_from(["w", "", "host-3:4121", "\u00e9" * 127]),
                         [None, "w" * 255, "w" * 256, "\u00e9" * 128], texts))
    def check(queues, n, worker):
        ran["examples"] += 1
        ran["claim"] += _call(with_ready_jobs, "select * from awa.claim(%s::text[],"
                              " %s::integer, %s::text)", [queues, n, worker])

    check()
    _most_ran_the_real_path(ran, "claim")


def test_job_tool_inputs(seeded):
    ran = Counter()
    job_id = mostly(st.integers(min_value=1, max_value=200),
                    [None, -1, 0, 2**63 - 1, -(2**63)], job_ids)

    @settings(FUZZ, max_examples=40)
    @given(queue=existing_queues,
           state=mostly(st.sampled_from(STATES), [None, "", "done", "READY"], texts),
           kind=mostly(st.sampled_from([None, *KINDS]), ["no such kind"], texts),
           after=mostly(st.one_of(st.none(), st.integers(min_value=0, max_value=200)),
                        [-1, 2**63 - 1, -(2**63)], job_ids),
           n=max_jobs, job=job_id, worker=mostly(st.none(), ["w", "nobody"], texts))
    def check(queue, state, kind, after, n, job, worker):
        ran["examples"] += 1
        ran["jobs"] += _call(seeded, "select * from awa.jobs(%s::text, %s::text, %s::text,"
                             " %s::bigint, %s::integer, %s::text)",
                             [queue, state, kind, after, n, worker])
        ran["count_jobs"] += _call(seeded, "select awa.count_jobs(%s::text, %s::text,"
                                   " %s::text, %s::integer)", [queue, state, kind, n])
        ran["job"] += _call(seeded, "select * from awa.job(%s::bigint)", [job])
        ran["cancel_job"] += _call(seeded, "select awa.cancel_job(%s::bigint)", [job])
        ran["retry_job"] += _call(seeded, "select awa.retry_job(%s::bigint)", [job])
        ran["retry_jobs"] += _call(seeded, "select awa.retry_jobs(%s::text, %s::text,"
                                   " %s::integer)", [queue, kind, n])
        ran["cancel_jobs"] += _call(seeded, "select awa.cancel_jobs(%s::text, %s::text,"
                                    " %s::integer)", [queue, kind, n])

    check()
    _most_ran_the_real_path(ran, "jobs", "count_jobs", "job", "cancel_job", "retry_job",
                            "retry_jobs", "cancel_jobs")


def test_failure_summary_inputs(seeded):
    ran = Counter()

    @settings(FUZZ, max_examples=40)
    @given(queue=mostly(st.one_of(st.none(), st.sampled_from(QUEUES)), BAD_QUEUES, texts),
           since=mostly(st.one_of(st.none(), st.timedeltas(min_value=timedelta(0),
                                                           max_value=timedelta(days=3650))),
                        [timedelta(seconds=-1), timedelta(days=3653)], st.timedeltas()),
           n=max_jobs)
    def check(queue, since, n):
        ran["examples"] += 1
        ran["failure_summary"] += _call(
            seeded, "select * from awa.failure_summary(%s::text, %s::interval, %s::integer)",
            [queue, since, n])

    check()
    _most_ran_the_real_path(ran, "failure_summary")
