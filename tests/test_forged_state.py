"""No definer acts on state its caller can set: forged settings change nothing.

A producer can set any custom setting, including the ones the enqueue paths
read: the held-lane memo ``awa.lane_<queue id>_<priority>`` and the wait
total ``awa.lane_lock_wait_us``. For every entry point (single row keyed and
unkeyed, batch on its fast and its general path, COPY with
``enqueue_copied()`` and with commit only) and every kind of name (plain,
partitioned, striped), a plain login with ``awa_producer`` only forges every
memo to a lane another open transaction holds, to a lane of another queue, to
a lane of another priority, and to values that are no lane at all. Its jobs
must land in a free lane of their own (queue, priority), with no error.
(A keyed single row never read the memo; its case guards that it never
does.) Jobs with a max run time of their own, and jobs with unique keys, take the
batch and COPY paths too. And no heartbeat, whatever its extend or the settings around it, moves
a lease past its job's deadline.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.support.jobs import (
    LANE_CLASS,
    copy_rows,
    function_calls,
    key_for_shard,
    waits_for_a_lock,
)
from tests.support.waiting import wait_until

S = 4
FREE_SHARD = 3  # every other priority-2 lane of the target is held by another transaction
KEY = key_for_shard(FREE_SHARD, S)


def _copy(conn, queue, kind, rows, max_run_time=None):
    copy_rows(conn, [(queue, priority, key, kind, Jsonb({}), None, None,
                      *([max_run_time] if max_run_time else []))
                     for priority, key in rows])


def _copy_unique(conn, queue, kind, rows, keyed=None):
    """`rows` with a fresh unique key on each of the first `keyed` (all by
    default)."""
    with conn.cursor().copy("copy awa.copy_staging (queue, priority, ordering_key, kind,"
                            " unique_key) from stdin") as cp:
        for i, (priority, key) in enumerate(rows):
            unique = uuid.uuid4().bytes if keyed is None or i < keyed else None
            cp.write_row([queue, priority, key, kind, unique])


def _fresh_keys(n):
    return [uuid.uuid4().bytes for _ in range(n)]


# Mixed calls put their keyed row at priority 1, so that it cannot overwrite
# the forged priority-2 memo before the unkeyed rows read it.
MIXED = [(2, None), (1, KEY), (2, None)]


ENTRY_POINTS = {
    "enqueue": lambda c, q, kind: c.execute("select awa.enqueue(%s, %s)", [q, kind]),
    "enqueue keyed": lambda c, q, kind: c.execute(
        "select awa.enqueue(%s, %s, ordering_key => %s)", [q, kind, KEY]),
    "batch": lambda c, q, kind: c.execute(
        "select * from awa.enqueue_batch(%s::text[], %s::text[])", [[q] * 3, [kind] * 3]),
    "batch mixed": lambda c, q, kind: c.execute(
        "select * from awa.enqueue_batch(%s::text[], %s::text[], priorities => %s::smallint[],"
        " ordering_keys => %s::bytea[])",
        [[q] * 3, [kind] * 3, [p for p, _ in MIXED], [k for _, k in MIXED]]),
    "copy enqueue_copied": lambda c, q, kind: (
        _copy(c, q, kind, MIXED), c.execute("select awa.enqueue_copied()")),
    "copy commit": lambda c, q, kind: _copy(c, q, kind, MIXED),
    "batch max_run_times": lambda c, q, kind: c.execute(
        "select * from awa.enqueue_batch(%s::text[], %s::text[],"
        " max_run_times => array['1 minute', null, '1 hour']::interval[])", [[q] * 3, [kind] * 3]),
    "copy max_run_time": lambda c, q, kind: (
        _copy(c, q, kind, MIXED, "1 minute"), c.execute("select awa.enqueue_copied()")),
    # Unique keys take the general paths (ADR 027).
    "enqueue unique": lambda c, q, kind: c.execute(
        "select awa.enqueue(%s, %s, unique_key => %s)", [q, kind, uuid.uuid4().bytes]),
    "batch unique": lambda c, q, kind: c.execute(
        "select * from awa.enqueue_batch(%s::text[], %s::text[], priorities => %s::smallint[],"
        " ordering_keys => %s::bytea[], unique_keys => %s::bytea[])",
        [[q] * 3, [kind] * 3, [p for p, _ in MIXED], [k for _, k in MIXED], _fresh_keys(3)]),
    "copy unique": lambda c, q, kind: (
        _copy_unique(c, q, kind, MIXED), c.execute("select awa.enqueue_copied()")),
    # More than 10,000 rows: the batch mover's passes, its lanes taken before
    # the first (ADR 042). One unique key sends the whole load there.
    "copy several passes": lambda c, q, kind: (
        _copy_unique(c, q, kind, MIXED * 3334, keyed=1),
        c.execute("select awa.enqueue_copied()")),
}
NAMES = {"plain": "fq", "partitioned": "fpart", "striped": "fstripe"}
# The forgeries that name a real lane. A load of several passes reads the
# memos as the one-pass COPY entries do (the values that are no lane are
# theirs to try); what it adds is the lanes it takes before its first pass.
LANE_FORGERIES = ("held lane", "other queue's lane", "other priority's lane")
LANES_ONLY = {"copy several passes"}


@pytest.fixture
def forged(db):
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_queue_partitions('fpart', 2)")
        su.execute("select awa.set_queue_stripes('fstripe', 2)")
        for q in (*NAMES.values(), "other"):
            su.execute("select awa.set_enqueue_shards(%s, %s)", [q, S])
    return db, producer


def _physical(admin, name):
    return [r[0] for r in admin.execute(
        "select queue_id from awa.queue_meta where %s in (queue, root_queue, logical_queue)",
        [name])]


def _lane(admin, queue_id, priority, shard):
    return admin.execute(
        "select lane_id from awa.lanes where queue_id = %s and priority = %s and shard = %s",
        [queue_id, priority, shard]).fetchone()[0]


def _forgeries(admin, name):
    """Value for every memo, by what it forges."""
    target = _physical(admin, name)[0]
    other = _physical(admin, "other")[0]
    return {
        "held lane": str(_lane(admin, target, 2, 0)),
        "held shard": "0",
        "other queue's lane": str(_lane(admin, other, 2, FREE_SHARD)),
        "other priority's lane": str(_lane(admin, target, 1, FREE_SHARD)),
        "not a number": "lane 7; drop table awa.ready",
        "huge": "99999999999999999999999",
        "negative": "-1",
        "empty": "",
    }


def _forge_everything(conn, admin, value):
    for (qid,) in admin.execute("select queue_id from awa.queue_meta"):
        for p in range(1, 5):
            conn.execute("select set_config(%s, %s, true)", [f"awa.lane_{qid}_{p}", value])
    conn.execute("select set_config('awa.lane_lock_wait_us', %s, true)", [value])
    # Whether the transaction has a memo: any value sends awa.enqueue to
    # awa._take_lane, an empty one lets its fast path take the sticky lane.
    conn.execute("select set_config('awa.lane_memo', %s, true)", [value])


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_forged_memos_never_move_a_job_out_of_its_own_free_lane(forged, entry, name):
    db, producer = forged
    queue = NAMES[name]
    with db.connect() as admin, db.connect(autocommit=False) as hold:
        held = {_lane(admin, qid, 2, shard)
                for qid in _physical(admin, queue) for shard in range(FREE_SHARD)}
        for lane in sorted(held):
            hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lane])
        for what, value in _forgeries(admin, queue).items():
            if entry in LANES_ONLY and what not in LANE_FORGERIES:
                continue
            kind = f"forged {what}"
            with db.connect(producer, autocommit=False) as p:
                # A call that waited for a held lane would be a failure too.
                p.execute("set local lock_timeout = '5s'")
                _forge_everything(p, admin, value)
                ENTRY_POINTS[entry](p, queue, kind)
                p.commit()
            landed = admin.execute(
                "select r.queue_id, r.priority, l.queue_id, l.priority, l.lane_id"
                " from awa.ready r join awa.lanes l using (lane_id) where r.kind = %s",
                [kind]).fetchall()
            assert landed, what
            for job_queue, job_priority, lane_queue, lane_priority, lane in landed:
                assert (lane_queue, lane_priority) == (job_queue, job_priority), what
                assert lane not in held, f"{what}: a job went into a lane another transaction holds"


def test_a_load_of_more_than_a_pass_with_one_unique_key_takes_the_batch_mover(forged):
    """The premise of "copy several passes" above: one unique key sends a
    load of 10,002 rows to COPY's batch mover, which moves it in two passes."""
    db, producer = forged
    with db.connect(autocommit=False) as conn:
        conn.execute("set local track_functions = 'all'")
        conn.execute(sql.SQL("set local role {}").format(sql.Identifier(producer)))
        _copy_unique(conn, NAMES["plain"], "premise", MIXED * 3334, keyed=1)
        conn.execute("select awa.enqueue_copied()")
        assert function_calls(conn, "awa._enqueue_rows") == 2


def test_a_forged_wait_total_is_ignored_when_the_call_waits(db):
    """awa.lane_lock_wait_us forged to a non-number: a call that has to wait
    for its lane still succeeds and reports only its own wait."""
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('fw', 1)")
    with db.connect() as admin, db.connect(producer, autocommit=False) as hold:
        hold.execute("select awa.enqueue('fw', 'hold')")
        outcome = {}

        def produce():
            with db.connect(producer, autocommit=False) as p:
                outcome["pid"] = p.execute("select pg_backend_pid()").fetchone()[0]
                p.execute("select set_config('awa.lane_lock_wait_us', 'not-a-number', true)")
                try:
                    started = time.monotonic_ns()
                    p.execute("select awa.enqueue('fw', 'waited')")
                    outcome["elapsed_us"] = (time.monotonic_ns() - started) / 1000
                    outcome["wait"] = p.execute(
                        "select current_setting('awa.lane_lock_wait_us')").fetchone()[0]
                    p.commit()
                except psycopg.Error as err:
                    outcome["error"] = err

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        wait_until(lambda: "pid" in outcome and waits_for_a_lock(admin, outcome["pid"]),
                   what="the producer to wait for the lane")
        hold.commit()
        t.join(timeout=30)
    assert not t.is_alive(), "the producer never got its lane"
    assert "error" not in outcome, outcome.get("error")
    # Its own wait, the forged value counted as 0: more than nothing (it
    # waited for the holder's commit), no more than the whole call took.
    assert 0 < int(outcome["wait"]) <= outcome["elapsed_us"], outcome


# The operators' retries take lanes through the same choice (awa._lock_lanes,
# awa._take_lane): a forged memo must not send a retried job anywhere else.
RETRIES = {
    "retry_job": lambda c, q, ids: [c.execute("select awa.retry_job(%s)", [i]) for i in ids],
    "retry_jobs": lambda c, q, ids: c.execute("select awa.retry_jobs(%s)", [q]),
}

FAILED = """
    insert into awa.finished (job_id, slot, queue_id, priority, kind, state, attempt,
                              max_attempts, enqueued_at, args, ordering_key)
    select nextval('awa.job_id_seq'), awa._finished_slot('failed', now()), q.id, 2, %(kind)s,
           'failed', 1, 1, now(), '{}', k.key
      from unnest(%(queues)s::integer[]) as q (id),
           unnest(array[null, null, %(key)s::bytea]) as k (key)
    returning job_id
"""


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("entry", list(RETRIES))
def test_forged_memos_never_move_a_retried_job_out_of_its_own_free_lane(forged, entry, name):
    db, _producer = forged
    operator = db.login_role("awa_operator")
    queue = NAMES[name]
    with db.connect() as admin, db.connect(autocommit=False) as hold:
        physical = _physical(admin, queue)
        held = {_lane(admin, qid, 2, shard) for qid in physical for shard in range(FREE_SHARD)}
        for lane in sorted(held):
            hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lane])
        for what, value in _forgeries(admin, queue).items():
            kind = f"retried {what}"
            # Two unkeyed and one keyed failed job in every physical queue.
            ids = [r[0] for r in admin.execute(
                FAILED, {"kind": kind, "queues": physical, "key": KEY}).fetchall()]
            with db.connect(operator, autocommit=False) as op:
                op.execute("set local lock_timeout = '5s'")
                _forge_everything(op, admin, value)
                RETRIES[entry](op, queue, ids)
                op.commit()
            landed = admin.execute(
                "select r.queue_id, r.priority, l.queue_id, l.priority, l.lane_id, l.shard,"
                " r.ordering_key is not null from awa.ready r join awa.lanes l using (lane_id)"
                " where r.kind = %s", [kind]).fetchall()
            assert len(landed) == len(ids), what
            for job_queue, job_priority, lane_queue, lane_priority, lane, shard, keyed in landed:
                assert (lane_queue, lane_priority) == (job_queue, job_priority), what
                assert lane not in held, f"{what}: a retried job went into a held lane"
                assert not keyed or shard == FREE_SHARD, what


def test_no_heartbeat_moves_a_lease_past_its_deadline(db):
    """A worker controls the extend and every setting around its calls; the
    deadline is the claim's, in a row it cannot write."""
    worker = db.login_role("awa_worker")
    with db.connect() as su:
        su.execute("select awa.enqueue_batch(array['fdl'], array['k'],"
                   " max_run_times => array['1 hour']::interval[])")
    with db.connect(worker) as w, db.connect() as admin:
        (job_id, lease) = w.execute(
            "select job_id, run_lease from awa.claim(array['fdl'], 1, 'w', '1 minute')").fetchone()
        for name in ("awa.max_run_time", "awa.deadline_at", "awa.lane_memo", "awa.extend"):
            w.execute("select set_config(%s, '1000 years', false)", [name])
        # The longest extend a heartbeat takes, 720 times the deadline's hour.
        assert w.execute("select awa.heartbeat(%s, %s, '30 days')",
                         [job_id, lease]).fetchone()[0]
        until, deadline = admin.execute(
            "select lease_expires_at, deadline_at from awa.running where job_id = %s",
            [job_id]).fetchone()
        assert until == deadline
