"""awa.claim's lane-by-lane path (one queue that has only had S = 1, so one
lane per priority) against the general path, awa._claim_merged, fed the same
queues.

Random states (jobs over the four priorities, a prefix deleted for good, a
hint at 0, missing or at the first row, rows another transaction holds) go
through both in rolled-back transactions of one backend. Both must return
what a Python oracle picks, the first free rows by priority then lane_seq, in
that order and with run_lease in that order, and store the same running
rows; the hint either path leaves must not pass a row still there.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.jobs import function_calls

QUEUE = "cp"
RETURNED = "job_id, queue, priority, enqueue_shard, lane_seq, attempt, run_lease"
RUNNING = """
    select job_id, lane_id, lane_seq, priority, attempt, worker, lease_expires_at - claimed_at
      from awa.running order by run_lease
"""
HINT_PASSES_A_ROW = """
    select exists (select from awa.ready r join awa.lane_heads h using (lane_id)
                    where r.lane_seq < h.head_seq)
"""

scenario = st.fixed_dictionaries({
    "priorities": st.lists(st.sampled_from([1, 2, 3, 4]), max_size=150),
    "dead": st.integers(0, 110),
    "hint": st.sampled_from(["none", "zero", "first"]),
    "held": st.sets(st.integers(0, 149), max_size=25),
    "max_jobs": st.sampled_from([1, 2, 3, 10, 60]),
})


@pytest.fixture
def admin(db):
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards(%s, 1)", [QUEUE])
        yield su


def _prepare(admin, s) -> list[int]:
    """The state of scenario `s`, committed; returns the job ids still ready."""
    admin.execute("truncate awa.ready, awa.running, awa.lane_heads")
    n = len(s["priorities"])
    if n:
        admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                      " array_fill('k'::text, array[%s]), priorities => %s::smallint[])",
                      [QUEUE, n, n, s["priorities"]])
    admin.execute("delete from awa.ready where job_id in"
                  " (select job_id from awa.ready order by job_id limit %s)", [s["dead"]])
    if s["hint"] == "zero":
        admin.execute("insert into awa.lane_heads select l.lane_id, 0 from awa.lanes l"
                      " join awa.queue_meta m using (queue_id) where m.queue = %s", [QUEUE])
    elif s["hint"] == "first":
        admin.execute("insert into awa.lane_heads select lane_id, min(lane_seq) from awa.ready"
                      " group by lane_id")
    return [r[0] for r in admin.execute("select job_id from awa.ready order by job_id")]


def _run(conn, call, args):
    """What `call` returns and stores, in a transaction that is rolled back."""
    try:
        returned = conn.execute(f"select {RETURNED} from {call}", args).fetchall()
        outcome = (returned, conn.execute(RUNNING).fetchall(),
                   conn.execute(HINT_PASSES_A_ROW).fetchone()[0])
    finally:
        conn.rollback()
    return outcome


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=scenario)
@example(s={"priorities": [2] * 150, "dead": 100, "hint": "none", "held": {0, 1, 2},
            "max_jobs": 1})
@example(s={"priorities": [3, 1] * 75, "dead": 80, "hint": "zero", "held": set(range(10)),
            "max_jobs": 60})
@example(s={"priorities": [4, 4], "dead": 0, "hint": "first", "held": {0, 1}, "max_jobs": 1})
def test_lane_by_lane_claims_what_the_merge_claims(db, admin, s):
    ready = _prepare(admin, s)
    held = [ready[i] for i in s["held"] if i < len(ready)]
    with db.connect(autocommit=False) as holder, db.connect(autocommit=False) as conn:
        holder.execute("select from awa.ready where job_id = any(%s) for update", [held])
        fast = _run(conn, "awa.claim(%s, %s, 'w')", [[QUEUE], s["max_jobs"]])
        general = _run(conn, "awa._claim_merged(%s, %s, 'w', '5 minutes')",
                       [[QUEUE], s["max_jobs"]])
        oracle = [j for _, _, j in sorted(
            (p, j, j) for p, j in admin.execute(
                "select priority, job_id from awa.ready where job_id <> all(%s)", [held]))]
        holder.rollback()
    assert [r[:6] for r in fast[0]] == [r[:6] for r in general[0]]
    assert [r[0] for r in fast[0]] == oracle[:s["max_jobs"]]
    assert [r[1:] for r in fast[1]] == [r[1:] for r in general[1]]
    for returned, _running, passes in (fast, general):
        assert [r[6] for r in returned] == sorted(r[6] for r in returned)
        assert not passes
    with db.connect() as after:  # a rolled back claim took its hint update with it
        assert not after.execute(HINT_PASSES_A_ROW).fetchone()[0]


def _merged_calls(conn, queues, max_jobs) -> int:
    conn.execute("set track_functions = 'pl'")
    conn.execute("select from awa.claim(%s, %s, 'w')", [queues, max_jobs])
    return function_calls(conn, "awa._claim_merged")


def test_the_merge_runs_only_when_lanes_share_a_priority(db):
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('one', 1)")
        su.execute("select awa.set_enqueue_shards('other', 1)")
        su.execute("select awa.set_enqueue_shards('four', 4)")
        # Back at S = 1, but its shard 1 lanes may still drain.
        su.execute("select awa.set_enqueue_shards('lowered', 2)")
        su.execute("select awa.set_enqueue_shards('lowered', 1)")
        for q in ("one", "other", "four", "lowered"):
            su.execute("select awa.enqueue(%s, 'k')", [q])
    for queues, merged in ((["one"], 0), (["one", "one"], 0), (["four"], 1),
                           (["one", "other"], 1), (["lowered"], 1)):
        with db.connect(autocommit=False) as conn:
            try:
                assert _merged_calls(conn, queues, 1) == merged, queues
            finally:
                conn.rollback()
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.connect() as su:
        su.execute("set role awa_worker")
        su.execute("select from awa._claim_merged('{q}', 1, 'w', '1 minute')")
