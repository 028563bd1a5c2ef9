"""docs/security.md, "bad input": any input to the public functions either works
or fails with a documented SQLSTATE, never a syntax error, a missing
relation or column, or an internal error."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Documented in docs/sql-api.md; 22003 is PostgreSQL's own smallint range check.
DOCUMENTED = {"22004", "22023", "22003", "42704"}
NEVER = {"42601", "42P01", "42703", "XX000"}

texts = st.one_of(st.none(), st.text(alphabet=st.characters(exclude_characters="\x00",
                                                                exclude_categories=("Cs",)),
                                     max_size=220))
# Short keys, and keys at and past the 1024-byte cap.
keys = st.one_of(st.none(), st.binary(max_size=64),
                 st.integers(min_value=1020, max_value=1030).map(lambda n: b"k" * n))
ints = st.one_of(st.none(), st.integers(min_value=-70000, max_value=70000))


@pytest.fixture
def producer_conn(db):
    with db.connect(db.login_role("awa_producer", "awa_operator", "awa_worker")) as conn:
        yield conn


def _call(conn, sql, params):
    try:
        conn.execute(sql, params).fetchall()
    except psycopg.Error as err:
        assert err.sqlstate not in NEVER, (err.sqlstate, str(err))
        assert err.sqlstate in DOCUMENTED, (err.sqlstate, str(err))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=texts, kind=texts, priority=ints, key=keys, attempts=ints)
def test_enqueue_inputs(producer_conn, queue, kind, priority, key, attempts):
    _call(producer_conn,
          "select * from awa.enqueue(%s::text, %s::text, '{}'::jsonb, %s::smallint,"
          " %s::bytea, null::timestamptz, %s::integer)",
          [queue, kind, priority if priority is None or abs(priority) < 32768 else None,
           key, attempts])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queues=st.lists(texts, max_size=5), kinds=st.lists(texts, max_size=5),
       keys_=st.one_of(st.none(), st.lists(keys, max_size=5)))
def test_enqueue_batch_inputs(producer_conn, queues, kinds, keys_):
    _call(producer_conn, "select * from awa.enqueue_batch(%s::text[], %s::text[],"
          " ordering_keys => %s::bytea[])", [queues, kinds, keys_])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=texts, shards=ints)
def test_operator_inputs(producer_conn, queue, shards):
    _call(producer_conn, "select * from awa.set_enqueue_shards(%s::text, %s::integer)",
          [queue, shards])
    _call(producer_conn, "select awa.pause_queue(%s::text)", [queue])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queues=st.lists(texts, max_size=4), n=ints, worker=texts)
def test_claim_inputs(producer_conn, queues, n, worker):
    _call(producer_conn, "select * from awa.claim(%s::text[], %s::integer, %s::text)",
          [queues, n, worker])


job_ids = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1))
states = st.one_of(st.none(), st.sampled_from(
    ["scheduled", "ready", "running", "completed", "failed", "cancelled"]), texts)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=texts, state=states, kind=texts, after=job_ids, n=ints, job_id=job_ids,
       worker=texts)
def test_job_tool_inputs(producer_conn, queue, state, kind, after, n, job_id, worker):
    _call(producer_conn, "select * from awa.jobs(%s::text, %s::text, %s::text, %s::bigint,"
          " %s::integer, %s::text)", [queue, state, kind, after, n, worker])
    _call(producer_conn, "select awa.count_jobs(%s::text, %s::text, %s::text, %s::integer)",
          [queue, state, kind, n])
    _call(producer_conn, "select * from awa.job(%s::bigint)", [job_id])
    _call(producer_conn, "select awa.cancel_job(%s::bigint)", [job_id])
    _call(producer_conn, "select awa.retry_job(%s::bigint)", [job_id])
    _call(producer_conn, "select awa.retry_jobs(%s::text, %s::text, %s::integer)",
          [queue, kind, n])
    _call(producer_conn, "select awa.cancel_jobs(%s::text, %s::text, %s::integer)",
          [queue, kind, n])


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=texts, since=st.one_of(st.none(), st.timedeltas()), n=ints)
def test_failure_summary_inputs(producer_conn, queue, since, n):
    _call(producer_conn, "select * from awa.failure_summary(%s::text, %s::interval,"
          " %s::integer)", [queue, since, n])
