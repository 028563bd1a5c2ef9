"""The enqueue-shard control as a review found it wanting: the auto-scaler's
window after a change of S held open, waits more lanes cannot relieve,
lanes_created beside other changes in a transaction, a policy set on a
partition, and partitions and stripes made after awa.set_shard_mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.support.jobs import enqueue, key_for_shard, lane_waiters
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
    assert ("where a backend waited the lanes held + waiters were 4.00 per physical queue,"
            " at most S = 4: more lanes would not relieve them") in got[-1][6]
    assert shards_of(db, "one-key") == 4
    with db.connect() as admin:
        rows = admin.execute("select action, reason_code, repeats from awa.autoscale_decisions"
                             " where queue = 'one-key'").fetchall()
        assert rows == [("held", "demand_within_s", 2)]  # a run of holds: one row
        assert admin.execute("select count(*) from awa.shard_changes"
                             " where queue = 'one-key' and source = 'auto'").fetchone()[0] == 0


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
