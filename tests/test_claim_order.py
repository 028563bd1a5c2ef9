"""What awa.claim promises about order, against a Python oracle of it.

Random states (jobs over the four priorities and, at S = 4, over four lanes
per priority; a prefix claimed for good; a hint at 0, missing or at a lane's
first row; rows another transaction holds) go through awa.claim in rolled-back
transactions. Whatever lane order the claim drew, it must:

- return min(max_jobs, free rows) jobs, by priority then run_lease;
- take every free row of a priority before any row of a lower one;
- take from each lane a prefix of its free rows, in lane_seq order;
- leave, within each priority, at most one lane it took from with free rows
  still in it (it walks lanes one by one and stops once it has max_jobs);
- store exactly the running rows it returned, and leave no hint past a row.

At S = 1 those rules leave one answer, strict FIFO per priority, which the
oracle checks exactly. A second test checks that the lane a claim tries first
is drawn afresh for every call (ADR 023).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.jobs import seed_hints

QUEUE = "cp"
RETURNED = "job_id, priority, enqueue_shard, lane_seq, run_lease"
RUNNING = "select job_id, run_lease from awa.running order by run_lease"
HINT_PASSES_A_ROW = """
    select exists (select from awa.ready r
                     join (select lane_id, max(head_seq) as head_seq from awa.lane_hints
                            group by lane_id) h using (lane_id)
                    where r.lane_seq < h.head_seq)
"""
READY = "select job_id, priority, lane_id, lane_seq from awa.ready order by lane_id, lane_seq"

scenario = st.fixed_dictionaries({
    "shards": st.sampled_from([1, 4]),
    "priorities": st.lists(st.sampled_from([1, 2, 3, 4]), max_size=150),
    "dead": st.integers(0, 110),
    "hint": st.sampled_from(["none", "zero", "first", "stacked"]),
    "held": st.sets(st.integers(0, 149), max_size=25),
    "max_jobs": st.sampled_from([1, 2, 3, 10, 60]),
})


def _prepare(admin, s) -> list[tuple[int, int, int, int]]:
    """The state of scenario `s`, committed; returns the ready rows."""
    admin.execute("truncate awa.ready, awa.running, awa.lane_hints")
    admin.execute("select awa.set_enqueue_shards(%s, %s)", [QUEUE, s["shards"]])
    n = len(s["priorities"])
    if n:
        admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                      " array_fill('k'::text, array[%s]), priorities => %s::smallint[],"
                      " ordering_keys => %s::bytea[])",
                      [QUEUE, n, n, s["priorities"], [f"k{i}".encode() for i in range(n)]])
    admin.execute("delete from awa.ready where job_id in"
                  " (select job_id from awa.ready order by job_id limit %s)", [s["dead"]])
    if s["hint"] == "zero":
        admin.execute("insert into awa.lane_hints select l.lane_id, 0 from awa.lanes l"
                      " join awa.queue_meta m using (queue_id) where m.queue = %s", [QUEUE])
    else:
        seed_hints(admin, s["hint"])
    return admin.execute(READY).fetchall()


def check_promise(ready, held: set[int], returned, max_jobs: int) -> None:
    free = [r for r in ready if r[0] not in held]
    taken = {r[0] for r in returned}
    assert len(returned) == len(taken) == min(max_jobs, len(free))
    assert taken <= {r[0] for r in free}
    assert returned == sorted(returned, key=lambda r: (r[1], r[4]))
    if taken:
        lowest = max(r[1] for r in returned)
        assert all(r[0] in taken for r in free if r[1] < lowest)
    lanes: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for job_id, priority, lane, _seq in free:  # in lane_seq order
        lanes[lane].append((job_id, priority))
    partial = Counter()
    for rows in lanes.values():
        flags = [job_id in taken for job_id, _ in rows]
        k = sum(flags)
        assert flags == [True] * k + [False] * (len(rows) - k), "not a prefix of its lane"
        if 0 < k < len(rows):
            partial[rows[0][1]] += 1
    assert all(n <= 1 for n in partial.values()), partial


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=scenario)
@example(s={"shards": 1, "priorities": [2] * 150, "dead": 100, "hint": "none",
            "held": {0, 1, 2}, "max_jobs": 1})
@example(s={"shards": 4, "priorities": [3, 1] * 75, "dead": 80, "hint": "zero",
            "held": set(range(10)), "max_jobs": 60})
@example(s={"shards": 4, "priorities": [4, 4], "dead": 0, "hint": "first",
            "held": {0, 1}, "max_jobs": 1})
def test_a_claim_keeps_the_promise_of_its_order(db, s):
    with db.connect() as admin:
        ready = _prepare(admin, s)
        held = {ready[i][0] for i in s["held"] if i < len(ready)}
        with db.connect(autocommit=False) as holder, db.connect(autocommit=False) as conn:
            holder.execute("select from awa.ready where job_id = any(%s) for update",
                           [list(held)])
            try:
                returned = conn.execute(f"select {RETURNED} from awa.claim(%s, %s, 'w')",
                                        [[QUEUE], s["max_jobs"]]).fetchall()
                running = conn.execute(RUNNING).fetchall()
                assert not conn.execute(HINT_PASSES_A_ROW).fetchone()[0]
            finally:
                conn.rollback()
                holder.rollback()
        assert not admin.execute(HINT_PASSES_A_ROW).fetchone()[0]
    check_promise(ready, held, returned, s["max_jobs"])
    assert [(r[0], r[4]) for r in returned] == running  # claim order is run_lease order
    if s["shards"] == 1:  # one lane per priority: strict FIFO per priority
        free = [(p, seq, j) for j, p, _lane, seq in ready if j not in held]
        assert [r[0] for r in returned] == [j for _, _, j in sorted(free)][:s["max_jobs"]]


@pytest.mark.parametrize("queues", [["fair"], ["fair", "other"]], ids=["one", "two"])
def test_the_lane_tried_first_is_drawn_for_every_call(db, queues):
    """Every lane of priority 2 (four lanes per queue, one or two queues) holds
    plenty of jobs; 40 claims of one per lane, each rolled back, so every
    claim sees the same state. Each lane must be the one some claims take
    from, and none may take more than three times its share (a claim that
    always started at the same lane would give it all of them)."""
    with db.connect() as admin:
        for q in queues:
            admin.execute("select awa.set_enqueue_shards(%s, 4)", [q])
            admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[400]),"
                          " array_fill('k'::text, array[400]), ordering_keys =>"
                          " array(select convert_to('key' || i, 'UTF8')"
                          " from generate_series(1, 400) i))", [q])
        lanes = admin.execute("select count(distinct lane_id) from awa.ready").fetchone()[0]
    assert lanes == 4 * len(queues)
    calls = 40 * lanes
    seen = Counter()
    with db.connect(autocommit=False) as conn:
        for _ in range(calls):
            (queue, shard), = conn.execute(
                "select queue, enqueue_shard from awa.claim(%s, 1, 'w')", [queues]).fetchall()
            seen[(queue, shard)] += 1
            conn.rollback()
    assert len(seen) == lanes, seen
    assert max(seen.values()) <= 3 * calls / lanes, seen


def test_priority_first_across_the_named_queues(db):
    """A claim naming several queues takes every free row of a priority, from
    all of them, before any row of a lower one: the walk loops over the
    priorities outermost (sql/claim.sql), whatever order it draws for the
    queues and their lanes."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('pa', 4)")
        admin.execute("select awa.set_enqueue_shards('pb', 2)")
        for queue, priority, n in [("pa", 3, 30), ("pb", 1, 7), ("pb", 4, 5), ("pa", 1, 6)]:
            admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                          " array_fill('k'::text, array[%s]),"
                          " priorities => array_fill(%s::smallint, array[%s]),"
                          " ordering_keys => array(select convert_to(%s || i, 'UTF8')"
                          " from generate_series(1, %s) i))",
                          [queue, n, n, priority, n, f"{queue}{priority}-", n])
        for _ in range(10):
            with admin.transaction(force_rollback=True):
                got = admin.execute("select priority from awa.claim(array['pa', 'pb'], 20, 'w')"
                                    ).fetchall()
                assert [p for (p,) in got] == [1] * 13 + [3] * 7
