"""awa.claim's two walks take the same jobs for the same draw.

A claim by one name of a queue no other queue links to reads that queue's
row first and walks its lanes with the queue as parameters; any other call
reads the named queues inside the walk's statement (ADR 033). Naming the
same queue twice takes the general walk over the same one queue. Random
states (S = 1, 4 or 8, jobs over the four priorities, a prefix claimed for
good, hints, rows another transaction holds, deadlines, a queue with keyed
jobs, a paused queue, claimed with family or without) go through both in one
transaction, each in a savepoint rolled back after it, with the same random
seed, so both draw the same lane order. What they return, the running rows they
store, the hints they leave and the rows left ready must be equal but for
the run_lease each draws from its sequence (compared as its rank) and the
times, counted from each claim's statement (compared as offsets from it). Each
call's scans of queue_meta's name indexes show which walk it took.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.jobs import seed_hints, waits_for_a_lock
from tests.support.waiting import wait_until

QUEUE = "cd"
# A claim's times count from its statement (statement_timestamp()): each is
# compared as its offset from its claim's statement.
CLAIMED = ("select (to_jsonb(c) - 'run_lease' - 'deadline_at')"
           " || jsonb_build_object('deadline_in', c.deadline_at - statement_timestamp()),"
           " c.run_lease, statement_timestamp() from awa.claim(%s, %s, 'w', family => %s) c")
RUNNING = ("select (to_jsonb(r) - 'run_lease' - 'claimed_at' - 'heartbeat_at'"
           " - 'lease_expires_at' - 'deadline_at')"
           " || jsonb_build_object('claimed_in', r.claimed_at - %(t0)s::timestamptz,"
           " 'heartbeat_in', r.heartbeat_at - %(t0)s::timestamptz,"
           " 'lease_in', r.lease_expires_at - %(t0)s::timestamptz,"
           " 'deadline_in', r.deadline_at - %(t0)s::timestamptz),"
           " r.run_lease from awa.running r order by r.job_id")
HINTS = "select lane_id, head_seq from awa.lane_hints order by lane_id, head_seq"
READY = "select job_id from awa.ready order by job_id"
# The indexes only the general walk reads (its queue lookup matches the
# names against logical_queue and root_queue too); this transaction's scans.
LINK_SCANS = """
    select pg_stat_get_xact_numscans('awa.queue_meta_logical_queue_idx'::regclass)
         + pg_stat_get_xact_numscans('awa.queue_meta_root_queue_idx'::regclass)
"""

scenario = st.fixed_dictionaries({
    "shards": st.sampled_from([1, 4, 8]),
    "priorities": st.lists(st.sampled_from([1, 2, 3, 4]), max_size=90),
    "dead": st.integers(0, 70),
    "hint": st.sampled_from(["none", "first", "stacked"]),
    "held": st.sets(st.integers(0, 89), max_size=20),
    "max_jobs": st.sampled_from([1, 2, 3, 10, 60]),
    "queue_run_time": st.sampled_from([None, "1 hour"]),
    "own_run_time": st.booleans(),
    "keyed": st.booleans(),
    "paused": st.sampled_from([False, False, False, True]),
    # A queue no other links to covers itself alone either way; the general
    # walk's lookup without family matches no name against root_queue.
    "family": st.booleans(),
    "seed": st.floats(-1, 1),
})


def _prepare(admin, s) -> None:
    """The state of scenario `s`, committed."""
    admin.execute("truncate awa.ready, awa.running, awa.lane_hints, awa.unique_keys")
    admin.execute("select awa.set_enqueue_shards(%s, %s)", [QUEUE, s["shards"]])
    admin.execute("select awa.set_max_run_time(%s, %s)", [QUEUE, s["queue_run_time"]])
    admin.execute("update awa.queue_meta set unique_jobs = %s where queue = %s",
                  [s["keyed"], QUEUE])
    n = len(s["priorities"])
    if n:
        run_times = [("10 minutes" if s["own_run_time"] and i % 3 == 0 else None)
                     for i in range(n)]
        admin.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                      " array_fill('k'::text, array[%s]), priorities => %s::smallint[],"
                      " ordering_keys => %s::bytea[], max_run_times => %s::interval[])",
                      [QUEUE, n, n, s["priorities"], [f"k{i}".encode() for i in range(n)],
                       run_times])
    admin.execute("delete from awa.ready where job_id in"
                  " (select job_id from awa.ready order by job_id limit %s)", [s["dead"]])
    seed_hints(admin, s["hint"])
    admin.execute("update awa.queue_meta set paused = %s where queue = %s",
                  [s["paused"], QUEUE])


def _ranked(rows):
    """Rows with their run_lease replaced by its rank among them."""
    order = sorted(r[1] for r in rows)
    return [(r[0], order.index(r[1])) for r in rows]


def _claim(conn, queues, s):
    """What one claim returns, stores and leaves, in a rolled-back savepoint."""
    conn.execute("savepoint walk")
    try:
        conn.execute("select setseed(%s)", [s["seed"]])
        before = conn.execute(LINK_SCANS).fetchone()[0]
        claimed = conn.execute(CLAIMED, [queues, s["max_jobs"], s["family"]]).fetchall()
        scans = conn.execute(LINK_SCANS).fetchone()[0] - before
        t0 = claimed[0][2] if claimed else None
        return {
            "claimed": _ranked([r[:2] for r in claimed]),
            "running": _ranked(conn.execute(RUNNING, {"t0": t0}).fetchall()),
            "hints": conn.execute(HINTS).fetchall(),
            "ready": conn.execute(READY).fetchall(),
        }, scans
    finally:
        conn.execute("rollback to savepoint walk")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=scenario)
@example(s={"shards": 8, "priorities": [2, 3] * 45, "dead": 30, "hint": "stacked",
            "held": set(range(0, 40, 3)), "max_jobs": 60, "queue_run_time": "1 hour",
            "own_run_time": True, "keyed": True, "paused": False, "family": True,
            "seed": 0.25})
@example(s={"shards": 4, "priorities": [1] * 90, "dead": 70, "hint": "none",
            "held": {0, 1}, "max_jobs": 1, "queue_run_time": None,
            "own_run_time": False, "keyed": False, "paused": False, "family": True,
            "seed": -0.5})
@example(s={"shards": 8, "priorities": [1, 2, 3, 4] * 20, "dead": 10, "hint": "first",
            "held": set(range(0, 30, 4)), "max_jobs": 60, "queue_run_time": "1 hour",
            "own_run_time": True, "keyed": True, "paused": False, "family": False,
            "seed": 0.5})
def test_claim_of_one_queue_equals_the_general_walk(db, s):
    with db.connect() as admin:
        _prepare(admin, s)
        ready = [r[0] for r in admin.execute(READY).fetchall()]
        held = [ready[i] for i in s["held"] if i < len(ready)]
        with db.connect(autocommit=False) as holder, db.connect(autocommit=False) as conn:
            holder.execute("select from awa.ready where job_id = any(%s) for update", [held])
            try:
                solo, solo_scans = _claim(conn, [QUEUE], s)
                general, general_scans = _claim(conn, [QUEUE, QUEUE], s)
            finally:
                conn.rollback()
                holder.rollback()
    assert solo_scans == 0, "a claim by one plain queue's name took the general walk"
    assert general_scans > 0, "a claim by two names took the walk of one queue"
    assert solo == general
    free = len(ready) - len(held)
    assert len(solo["claimed"]) == (0 if s["paused"] else min(s["max_jobs"], free))


@pytest.mark.parametrize("layout", ["partitions", "stripes"])
def test_a_queue_others_link_to_is_claimed_with_them(db, layout):
    """A claim by the name of a queue with partitions or stripes takes the
    general walk, which reaches every queue linked to it, whatever layer
    linked them (has_linked is counted again at every layer apply)."""
    name = f"cd_{layout}"
    with db.connect() as admin:
        setter = "set_queue_partitions" if layout == "partitions" else "set_queue_stripes"
        admin.execute(f"select awa.{setter}(%s, 3)", [name])
        members = [q for (q,) in admin.execute(
            "select queue from awa.queue_meta where logical_queue = %s or root_queue = %s",
            [name, name]).fetchall()]
        assert len(members) >= 2
        flagged = {q for (q,) in admin.execute(
            "select queue from awa.queue_meta where has_linked").fetchall()}
        assert name in flagged and not flagged & set(members)
        # As if an older function layer had linked them: the flag missed, then
        # counted again as the layer does when it is applied.
        admin.execute("update awa.queue_meta set has_linked = false where queue = %s", [name])
        admin.execute("select awa._count_linked()")
        assert admin.execute("select has_linked from awa.queue_meta where queue = %s",
                             [name]).fetchone()[0]
        admin.execute("truncate awa.ready, awa.running")
        rows = admin.execute(
            "select e.job_id, e.queue from generate_series(1, 20) as i,"
            " awa.enqueue(%s, 'k', ordering_key => convert_to('key' || i, 'UTF8')) as e",
            [name]).fetchall()
        assert len({queue for _, queue in rows}) >= 2
        enqueued = {job_id for job_id, _ in rows}
        claimed = {r[0] for r in admin.execute("select job_id from awa.claim(%s, 20, 'w')",
                                               [[name]]).fetchall()}
    assert claimed == enqueued


@pytest.mark.parametrize(("linker_lock", "layer_count"), [
    # This layer's link (awa._ensure_linked) holds the leader row.
    ("select awa._lock_leader('provisioning')", "select awa._count_linked()"),
    # A layer before migration 0026 held the advisory lock, which the
    # function layer's apply waits for before it counts (sql/queues.sql).
    ("select pg_advisory_xact_lock(awa._lock_class_provisioning(), 0)",
     "select pg_advisory_xact_lock(awa._lock_class_provisioning(), 0);"
     " select awa._count_linked()"),
], ids=["this-layer", "layer-before-0026"])
def test_a_link_in_flight_is_counted_once_it_commits(db, linker_lock, layer_count):
    """A link awa._ensure_linked makes while the function layer is applied:
    it holds the provisioning lock until it commits, and the count the layer
    runs waits for that lock, so it sees the link, not a table read before
    the link committed."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('cd_late', 1)")
        with db.connect(autocommit=False) as linker, db.connect() as layer:
            linker.execute(linker_lock)
            linker.execute("insert into awa.queue_meta (queue, root_queue)"
                           " values ('cd_late__p1', 'cd_late')")
            errors: list[BaseException] = []

            def count() -> None:
                try:
                    layer.execute(layer_count)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            counter = threading.Thread(target=count)
            counter.start()
            try:
                wait_until(lambda: waits_for_a_lock(admin, layer.info.backend_pid),
                           what="the count to wait for the link's provisioning lock")
                linker.commit()
            finally:
                linker.rollback()
                counter.join(timeout=30)
            assert not errors and not counter.is_alive()
        assert admin.execute("select has_linked from awa.queue_meta where queue = 'cd_late'"
                             ).fetchone()[0]


def test_a_hostile_worker_claims_one_queue_as_anyone_would(db, logins):
    """The claim of one queue as awa_worker, with planner settings forged and
    a temporary table named as the one the claim reads: it takes the job by
    the queue's row in awa, and its pinned settings keep the index lookups."""
    with db.connect() as admin:
        admin.execute("select awa.set_enqueue_shards('cd_hostile', 2)")
        job = admin.execute("select e.job_id from awa.enqueue('cd_hostile', 'k') e").fetchone()[0]
    with db.connect(logins.worker) as w:
        w.execute("create temp table queue_meta (queue text, has_linked boolean, paused boolean)")
        w.execute("insert into queue_meta values ('cd_hostile', false, true)")
        w.execute("set enable_indexscan = off; set enable_bitmapscan = off;"
                  " set plan_cache_mode = force_custom_plan")
        claimed = w.execute("select job_id from awa.claim(array['cd_hostile'], 5, 'w')"
                            ).fetchall()
    assert claimed == [(job,)]
