"""An operator's change of a setting every member of a queue's family carries
(pause, retention, retry policy, max run time, shard mode) against another
transaction that is making new members (stripes or partitions): the change
waits for it and covers the new members too. A new member copies its
family's settings as it is made; a change that read the members before the
maker committed left the new ones with the old setting (an unpaused stripe of
a paused queue)."""

from __future__ import annotations

import pytest

from tests.support.jobs import Call, behind, waits_for_a_lock
from tests.support.waiting import wait_until

FAMILY = "select count(*) from awa.queue_meta where queue = 'orders' or root_queue = 'orders'"

SETTERS = {
    "pause": ("select awa.pause_queue('orders')", "paused", "true"),
    "retention": ("select awa.set_retention('orders', '2 hours', '3 days')",
                  "retain_completed", "02:00:00"),
    "retry policy": ("select awa.set_retry_policy('orders', '5 seconds', '10 minutes', 0.25)",
                     "retry_base", "00:00:05"),
    "max run time": ("select awa.set_max_run_time('orders', '90 seconds')",
                     "max_run_time", "00:01:30"),
    "shard mode": ("select * from awa.set_shard_mode('orders', 'shadow', 8)",
                   "shard_mode", "shadow"),
}

MAKERS = {
    # Stripes of a partition: the root's row is not the one the maker locks.
    "stripes of a partition": ("select awa.set_queue_stripes('orders__p1', 3)", 3),
    "stripes of the root": ("select awa.set_queue_stripes('orders', 3)", 3),
    "more partitions": ("select awa.set_queue_partitions('orders', 4)", 2),
}


@pytest.mark.parametrize("maker", MAKERS)
@pytest.mark.parametrize("setter", SETTERS)
def test_a_family_setting_covers_members_made_while_it_waited(db, logins, setter, maker):
    change, column, value = SETTERS[setter]
    make, new_members = MAKERS[maker]
    with db.connect(logins.operator) as op, db.connect() as su:
        op.execute("select awa.set_queue_partitions('orders', 2)")
        before = su.execute(FAMILY).fetchone()[0]
        holder = db.connect(logins.operator, autocommit=False)
        holder.execute(make)
        call = behind(db, holder, db.connect(logins.operator, autocommit=False),
                      lambda c: c.execute(change).fetchall())
        holder.close()
        assert call.error is None, call.error
        assert su.execute(FAMILY).fetchone()[0] == before + new_members
        left = su.execute(
            f"select queue, {column} from awa.queue_meta"
            " where (queue = 'orders' or root_queue = 'orders')"
            f" and {column}::text is distinct from %s order by queue", [value]).fetchall()
        assert left == []


def test_a_change_that_waits_for_a_row_holds_up_no_other_queue(db, logins):
    """A pause waits for its queue's row while a producer's open transaction
    holds it (its first keyed job marked the queue). It holds nothing that
    the creation of another queue or a change of another queue's settings
    waits for: taking the provisioning lock first, it held them all."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('a', 'k')")
        p.execute("select awa.enqueue('c', 'k')")
    holder = db.connect(logins.producer, autocommit=False)
    holder.execute("select awa.enqueue('a', 'k', unique_key => 'order-1'::bytea)")
    pause = Call(db.connect(logins.operator, autocommit=False),
                 lambda c: c.execute("select awa.pause_queue('a')").fetchone()[0])
    pause.start()
    try:
        with db.connect() as watch:
            wait_until(lambda: waits_for_a_lock(watch, pause.pid), 15, "the pause to wait")
        with db.connect(logins.producer) as p, db.connect(logins.operator) as op:
            for conn in (p, op):
                conn.execute("set lock_timeout = '5s'")
            p.execute("select awa.enqueue('b', 'k')")
            assert op.execute("select awa.pause_queue('c')").fetchone()[0] is True
            op.execute("select awa.set_retention('c', '1 hour', '1 day')")
            op.execute("select * from awa.set_enqueue_shards('c', 2)")
    finally:
        holder.commit()
        pause.join(30)
    assert pause.error is None and pause.result is True


def test_a_change_of_a_partition_that_makes_no_member_waits_for_no_root_row(db, logins):
    """A change of S of a partition takes the provisioning lock and the
    partition's row; it makes no member, so it does not wait for the root's
    row, which a producer's open transaction holds (its first keyed job
    marked the root), while holding every queue's creation."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('orders', 2)")
        key = next(k for i in range(100) if op.execute(
            "select awa.partition_for_ordering_key(%s, 2)", [k := f"c{i}".encode()]
        ).fetchone()[0] == 0)  # the root's partition
    holder = db.connect(logins.producer, autocommit=False)
    holder.execute("select awa.enqueue('orders', 'k', ordering_key => %s,"
                   " unique_key => 'order-1'::bytea)", [key])
    try:
        with db.connect(logins.operator) as op, db.connect(logins.producer) as p:
            for conn in (op, p):
                conn.execute("set lock_timeout = '5s'")
            op.execute("select * from awa.set_enqueue_shards('orders__p1', 2)")
            p.execute("select awa.enqueue('fresh', 'k')")
    finally:
        holder.rollback()
        holder.close()
