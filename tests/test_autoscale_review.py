"""The enqueue-shard control as a review found it wanting: the auto-scaler's
window after a change of S held open, waits more lanes cannot relieve (at
one priority beside producers of another too), a raise sized from the
producers of every priority at once, a step past a max lowered while the
tick ran, lanes above S read from their start, lanes_created beside other
changes in a transaction, a policy set on a partition, and partitions and
stripes made after awa.set_shard_mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest

from tests.support.jobs import (
    Call,
    claim_all,
    enqueue,
    key_for_shard,
    lane_waiters,
    waits_for_a_lock,
)
from tests.support.reads import blocks_read
from tests.support.waiting import wait_until

DECISION = "queue, action, current_shards, proposed_shards, reason_code, samples, reason"


def shards_of(db, queue: str) -> int:
    with db.connect() as admin:
        return admin.execute("select enqueue_shards from awa.queue_meta where queue = %s",
                             [queue]).fetchone()[0]


def tick(db, logins) -> list[tuple]:
    with db.connect(logins.maintenance) as m:
        return m.execute(f"select {DECISION} from awa.autoscale_tick()").fetchall()


@contextlib.contextmanager
def one_lane_waited(db, role: str, queue: str, key: bytes, waiters: int) -> Iterator[None]:
    """Real lane waits on one lane: a producer holds the lane of ``key`` in an
    open transaction and ``waiters`` more, of the same key, wait behind it."""
    holder = db.connect(role, autocommit=False)

    def wait_behind() -> None:
        with db.connect(role) as conn:
            enqueue(conn, queue, ordering_key=key)

    with ThreadPoolExecutor(waiters) as pool:
        try:
            enqueue(holder, queue, ordering_key=key)
            futures = [pool.submit(wait_behind) for _ in range(waiters)]
            wait_until(lambda: lane_waiters(db, queue) >= waiters, what="lane waiters")
            yield
        finally:
            holder.commit()
            holder.close()
        for f in futures:
            f.result(timeout=30)


def test_a_change_of_s_held_open_is_judged_on_samples_taken_at_the_new_s(db, logins):
    """A change of S is stamped with its transaction's start. The ticks
    while the operator's transaction stayed open sampled the queue at the
    old S (S = 1, its one lane held and four backends waiting: a demand of
    5); they came after the stamp, so the first tick after the commit
    judged S = 4 on them and raised it to 8 at once. Only the samples taken
    at S = 4 count now: one, too few."""
    with db.connect(logins.producer) as p:
        enqueue(p, "slow-commit")
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_autoscale_policy('slow-commit', cooldown => '0',"
                   " min_samples => 3)")
    with db.connect(logins.operator, autocommit=False) as op:
        op.execute("select awa.set_shard_mode('slow-commit', 'auto', 16)")
        op.execute("select * from awa.set_enqueue_shards('slow-commit', 4)")
        with one_lane_waited(db, logins.producer, "slow-commit", b"k", waiters=4):
            for _ in range(3):  # the queue is manual at S = 1 until the commit
                assert tick(db, logins) == []
        op.commit()
    (decision,) = tick(db, logins)
    assert decision[:6] == ("slow-commit", "held", 4, 4, "few_samples", 1), decision
    assert "1 samples at S = 4 since" in decision[6]
    assert shards_of(db, "slow-commit") == 4
    with db.connect() as admin:
        stale = admin.execute(
            "select count(*) from awa.contention_samples s"
            " join awa.queue_meta m using (queue_id)"
            " join awa.shard_changes c on c.queue = m.queue"
            " where m.queue = 'slow-commit' and s.sampled_at > c.changed_at"
            " and s.enqueue_shards = 1 and s.waiters = 4").fetchone()[0]
    assert stale == 3  # in the window by time, left out by their S


def test_waits_more_lanes_cannot_relieve_do_not_raise_s(db, logins):
    """Producers of one ordering key wait for one lane whatever S is: one
    lane held and three backends behind it is a demand of 4, which S = 4
    lanes already meet. A raise took S to 8, then 16, remapping every key
    each time, the waits unchanged. The controller holds, and says why."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('one-key', 4)")
        op.execute("select * from awa.set_shard_mode('one-key', 'auto', 16)")
        op.execute("select awa.set_autoscale_policy('one-key', cooldown => '0',"
                   " min_samples => 1)")
    key = key_for_shard(2, 4)
    with one_lane_waited(db, logins.producer, "one-key", key, waiters=3):
        got = [d for _ in range(2) for d in tick(db, logins)]
    assert [d[:5] for d in got] == [("one-key", "held", 4, 4, "demand_within_s")] * 2
    assert ("where a backend waited the lanes held + waiters in the busiest priority were"
            " 4.00 per physical queue, at most S = 4: more lanes would not relieve them"
            ) in got[-1][6]
    assert shards_of(db, "one-key") == 4
    with db.connect() as admin:
        rows = admin.execute("select action, reason_code, repeats from awa.autoscale_decisions"
                             " where queue = 'one-key'").fetchall()
        assert rows == [("held", "demand_within_s", 2)]  # a run of holds: one row
        assert admin.execute("select count(*) from awa.shard_changes"
                             " where queue = 'one-key' and source = 'auto'").fetchone()[0] == 0


@contextlib.contextmanager
def producers(db, role: str, queue: str, hold: list[tuple[int, bytes | None]],
              wait: list[tuple[int, bytes | None]]) -> Iterator[None]:
    """Real lane holders and waiters by priority: a producer for each
    (priority, ordering key or None) of ``hold`` holds a lane in an open
    transaction, in that order; then one for each of ``wait`` enqueues and
    waits for a lane, until the block ends."""
    def one(conn: psycopg.Connection, priority: int, key: bytes | None) -> None:
        enqueue(conn, queue, priority=priority, **({"ordering_key": key} if key else {}))

    def wait_for_a_lane(priority: int, key: bytes | None) -> None:
        with db.connect(role) as conn:
            one(conn, priority, key)

    holders: list[psycopg.Connection] = []
    futures: list[Future] = []
    with ThreadPoolExecutor(max(len(wait), 1)) as pool:
        try:
            for priority, key in hold:
                holders.append(db.connect(role, autocommit=False))
                one(holders[-1], priority, key)
            futures = [pool.submit(wait_for_a_lane, *w) for w in wait]
            wait_until(lambda: lane_waiters(db, queue) >= len(wait), what="lane waiters")
            yield
        finally:
            for holder in holders:
                holder.commit()
                holder.close()
        for f in futures:
            f.result(timeout=30)


def test_a_hot_key_at_one_priority_beside_producers_of_another_does_not_raise_s(db, logins):
    """S lanes are per priority. Three producers of one key at priority 1
    (one holds its lane, two wait) and two unkeyed producers holding two of
    priority 2's four lanes, none waiting there: the waited demand added the
    priorities up (3 + 2 = 5 > S = 4) and raised S 4 -> 8, remapping every
    key for waits no lane relieves. The busiest priority's demand is 3."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('mixed', 4)")
        op.execute("select * from awa.set_shard_mode('mixed', 'auto', 16)")
        op.execute("select awa.set_autoscale_policy('mixed', cooldown => '0',"
                   " min_samples => 1)")
    with producers(db, logins.producer, "mixed", hold=[(2, None), (2, None), (1, b"hot")],
                   wait=[(1, b"hot")] * 2):
        got = [d for _ in range(2) for d in tick(db, logins)]
    assert [d[:5] for d in got] == [("mixed", "held", 4, 4, "demand_within_s")] * 2, got
    assert "in the busiest priority were 3.00 per physical queue, at most S = 4" in got[-1][6]
    assert history(db, "mixed") == [(1, 4, 16)]  # the operator's, no other


def test_a_raise_is_sized_from_the_busiest_priority_not_every_priority_at_once(db, logins):
    """At S = 1, in each of the four priorities one producer holds the lane
    and one waits: two per priority, which S = 2 gives a lane each. The
    demand added the priorities up (8) and raised S 1 -> 8 in one step; the
    shrink rule, which reads the busiest priority, then halved it back to 2:
    three remaps of every key for one need."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('four', 1)")
        op.execute("select * from awa.set_shard_mode('four', 'auto', 16)")
        op.execute("select awa.set_autoscale_policy('four', cooldown => '0',"
                   " min_samples => 1)")
    every = [(priority, None) for priority in (1, 2, 3, 4)]
    with producers(db, logins.producer, "four", hold=every, wait=every):
        (step,) = tick(db, logins)
    assert step[:5] == ("four", "raised", 1, 2, "grow"), step
    assert "in one step" not in step[6]
    assert history(db, "four") == [(1, 2, 4)]


def test_a_step_is_not_taken_past_a_max_lowered_while_the_tick_ran(db, logins):
    """A tick reads the queues once, then decides each in turn. An operator's
    awa.set_shard_mode(max 2) committed while the tick waited on an earlier
    queue was missed by the check made under the queue's row (S, mode and
    drop only): the tick raised S 1 -> 4, past the new max. The check reads
    max_shards too: the step is logged as not taken, and the next tick
    raises to the new max."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('first', 1)")
        op.execute("select * from awa.set_shard_mode('first', 'auto', 8)")
    tick(db, logins)  # first's row of decision counts, which the tick will wait on
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('capped', 1)")
        op.execute("select * from awa.set_shard_mode('capped', 'auto', 16)")
        op.execute("select awa.set_autoscale_policy('capped', cooldown => '0',"
                   " min_samples => 1)")
    with (one_lane_waited(db, logins.producer, "capped", b"k", waiters=3),
          db.connect(autocommit=False) as blocker,
          db.connect(logins.maintenance, autocommit=False) as m,
          db.connect() as watch):
        blocker.execute("select from awa.autoscale_decision_counts where queue = 'first'"
                        " for update")
        call = Call(m, lambda c: c.execute(f"select {DECISION} from awa.autoscale_tick()"
                                           ).fetchall())
        call.start()
        # Decided in the order of the queues' ids: first, then capped.
        wait_until(lambda: waits_for_a_lock(watch, call.pid), what="the tick to wait")
        with db.connect(logins.operator) as op:
            op.execute("select * from awa.set_shard_mode('capped', 'auto', 2)")
        blocker.rollback()
        call.join(timeout=30)
        assert not call.is_alive() and call.error is None, call.error
        (late,) = [d for d in call.result if d[0] == "capped"]
        again = [d for d in tick(db, logins) if d[0] == "capped"]
    assert late[1:5] == ("would_raise", 1, 4, "grow"), late
    assert ("not taken: the queue was dropped or its S, mode or max_shards changed since this"
            " tick read it") in late[6]
    assert [d[1:5] for d in again] == [("raised", 1, 2, "grow")], again
    assert history(db, "capped") == [(1, 2, 4)]


def test_a_tick_probes_the_lanes_above_s_from_their_claim_hints(db, logins):
    """Whether lanes >= S still hold ready rows was a count read from each
    lane's start: while a snapshot was held open it walked every row claimed
    from those lanes since, at every tick (in a cooldown too). A probe from
    each lane's claim hint (awa._shards_in_use) reads past none of them."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('drained', 4)")
        op.execute("select * from awa.set_shard_mode('drained', 'auto', 8)")
    jobs = 20_000
    with db.connect(logins.producer) as p:
        p.execute("select count(*) from awa.enqueue_batch(array_fill('drained'::text, array[%s]),"
                  " array_fill('k'::text, array[%s]),"
                  " ordering_keys => array_fill(%s::bytea, array[%s]))",
                  [jobs, jobs, key_for_shard(3, 4), jobs])
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('drained', 2)")
        op.execute("select awa.set_autoscale_policy('drained', cooldown => '0',"
                   " min_samples => 1)")
    with (db.connect(autocommit=False) as horizon, db.connect(logins.worker) as w,
          db.connect(logins.maintenance) as m, db.connect() as su):
        horizon.execute("begin isolation level repeatable read")
        horizon.execute("select 1")
        assert len(claim_all(w, ["drained"], 1000)) == jobs
        heap = su.execute("select pg_relation_size('awa.ready') / 8192").fetchone()[0]
        read = blocks_read(m, ["awa.ready", "awa.ready_pkey"], "select * from awa.autoscale_tick()")
        horizon.rollback()
    # The claimed rows fill some 270 heap blocks (the count read 410 blocks
    # of the table and its index); the probes read past the lane's hint,
    # where the last claim's 1,000 rows were, and 85 blocks in all.
    assert read < 150 < heap, (read, heap)
    with db.connect() as admin:
        code = admin.execute("select reason_code from awa.autoscale_decisions"
                             " where queue = 'drained'").fetchall()
    assert code == [("steady",)]


def history(db, queue: str) -> list[tuple]:
    with db.connect() as admin:
        return admin.execute(
            "select old_shards, new_shards, lanes_created from awa.shard_changes"
            " where queue = %s order by change_id", [queue]).fetchall()


def test_lanes_created_counts_the_lanes_of_this_call_in_a_savepoint_and_a_repeat(db, logins):
    """lanes_created counted the lanes whose xmin was the top-level
    transaction's: none made in a savepoint (its own xid), and in a
    transaction that changed S before, the earlier call's too."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('sp', 1)")
        op.execute("begin")
        op.execute("savepoint a")
        raised = op.execute("select * from awa.set_enqueue_shards('sp', 4)").fetchall()
        op.execute("release a")
        op.execute("commit")
        assert raised == [("sp", 1, 4, 12)]
        assert history(db, "sp") == [(1, 4, 12)]

        with op.transaction():
            got = [op.execute("select * from awa.set_enqueue_shards('rep', %s)",
                              [s]).fetchone() for s in (1, 4, 4, 8, 2, 8)]
    assert got == [("rep", 1, 1, 4),  # a new queue's first four lanes
                   ("rep", 1, 4, 12), ("rep", 4, 4, 0), ("rep", 4, 8, 16),
                   ("rep", 8, 2, 0), ("rep", 2, 8, 0)]
    assert history(db, "rep") == [(1, 4, 12), (4, 8, 16), (8, 2, 0), (2, 8, 0)]
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.lanes l join awa.queue_meta m"
                             " using (queue_id) where m.queue = 'rep'").fetchone()[0] == 32


def test_an_autoscale_policy_is_set_on_the_logical_queue_not_a_partition(db, logins):
    """The controller reads the logical queue's policy: one stored for a
    partition was never read."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_queue_partitions('orders', 2)")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            op.execute("select awa.set_autoscale_policy('orders__p1', cooldown => '0')")
        assert err.value.diag.message_primary == (
            "queue 'orders__p1' is a partition or stripe of 'orders'; set the policy on"
            " 'orders'")
        op.execute("select awa.set_autoscale_policy('orders', cooldown => '0')")
    with db.connect() as admin:
        assert admin.execute("select m.queue from awa.autoscale_policy p"
                             " join awa.queue_meta m using (queue_id)").fetchall() == [("orders",)]


FAMILY = ("select queue, shard_mode, max_shards, partitioned_fifo_accepted_by"
          " from awa.queue_meta where queue = 'orders' or root_queue = 'orders' order by queue")


def test_partitions_and_stripes_made_after_set_shard_mode_follow_it(db, logins):
    """They were made manual with no max_shards, so the tick never sampled
    their ready depth and lag, and a queue that joined as a partition kept
    its own mode; one left so by an earlier layer takes its root's mode
    when the layer is applied again."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('orders__p1', 2)")  # joins below
        op.execute("select * from awa.set_enqueue_shards('orders', 2)")
        op.execute("select * from awa.set_shard_mode('orders', 'auto', 8)")
        op.execute("select * from awa.set_queue_partitions('orders', 3)")
        op.execute("select * from awa.set_queue_stripes('orders', 2)")
    with db.connect() as admin:
        family = admin.execute(FAMILY).fetchall()
    assert [q for q, *_ in family] == ["orders", "orders#0", "orders#1", "orders__p1",
                                       "orders__p2"]
    assert {tuple(rest) for _, *rest in family} == {("auto", 8, logins.operator)}
    tick(db, logins)
    with db.connect(logins.reader) as r:
        sampled = r.execute("select queue, ready from awa.queue_history"
                            " where logical_queue = 'orders' order by queue").fetchall()
    assert sampled == [(q, 0) for q, *_ in family]  # null: not counted

    # One partition as an earlier layer left it; the layer applied again.
    with db.connect() as admin:
        admin.execute("update awa.queue_meta set shard_mode = 'manual', max_shards = null,"
                      " partitioned_fifo_accepted_by = null where queue = 'orders__p2'")
        admin.execute("update awa.schema_functions set checksum = 'changed'"
                      " where file = 'private.sql'")
    db.awa("migrate", check=True)
    with db.connect() as admin:
        assert admin.execute(FAMILY).fetchall() == family
