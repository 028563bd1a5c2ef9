"""A partition's name is a queue name, which producers and operators use: on
real PostgreSQL 17 and 18, awa.set_queue_partitions refuses (22023, before
it makes anything) partitions whose last name, queue__p(P-1), is longer than
a queue name may be, and PartitionedQueue refuses the same, at the same edge.
Such partitions were made, and a producer's enqueue to one
(PartitionedQueue.route_by_key), a pause and a change of S by its name were
refused where a claim took it. Stripes need no such check: no call takes a
stripe's name, each reaches them by their queue's name.
"""

from __future__ import annotations

import psycopg
import pytest

import awa_sql
from awa_sql import PartitionedQueue
from awa_sql.partitions import MAX_QUEUE_NAME_BYTES
from tests.support.jobs import claim_all, enqueue

TOO_LONG = psycopg.errors.InvalidParameterValue


def made(db) -> tuple[int, int]:
    """The queues there are and the lane ids spent: what a refused call must
    leave as it found it."""
    with db.connect() as su:
        return su.execute("select (select count(*) from awa.queue_meta),"
                          " (select last_value from awa.lanes_lane_id_seq)").fetchone()


@pytest.mark.parametrize(("name", "partitions", "last", "hint"), [
    # The review's case: 12 partitions of a 198-byte name made 'x…__p11', 203 bytes.
    ("x" * 198, 12, 203, "this name leaves no room for one"),
    # Bytes, not characters: 98 two-byte characters, 196 bytes.
    ("é" * 98, 11, 201, "this name takes at most 10 partitions"),
    ("o" * 193, 32767, 201, "this name takes at most 10000 partitions"),
], ids=["review", "two-byte", "most"])
def test_partitions_whose_last_name_is_too_long_are_refused_and_nothing_is_made(
        db, logins, name, partitions, last, hint):
    last_name = f"{name}__p{partitions - 1}"
    assert len(last_name.encode()) == last
    for existing in (False, True):
        if existing:  # a queue that exists keeps its one partition
            with db.connect(logins.producer) as p:
                enqueue(p, name)
        before = made(db)
        with db.connect(logins.operator) as op, pytest.raises(TOO_LONG) as err:
            op.execute("select * from awa.set_queue_partitions(%s, %s)", [name, partitions])
        assert err.value.diag.message_primary == (
            f"{partitions} partitions of queue '{name}' would name the last one"
            f" '{last_name}', {last} bytes: a queue name is at most 200 bytes")
        assert hint in err.value.diag.message_hint
        assert made(db) == before
        with db.connect() as su:
            assert su.execute("select partitions from awa.queue_meta where queue = %s",
                              [name]).fetchall() == ([(1,)] if existing else [])
        with pytest.raises(ValueError) as py:
            PartitionedQueue(name, partitions)
        assert str(py.value) == err.value.diag.message_primary


def test_python_and_sql_take_the_same_names_at_the_edge(db, logins):
    """MAX_QUEUE_NAME_BYTES is the server's limit: a name of that many bytes is
    a queue, one byte more is refused; 10 partitions of a name 4 bytes
    shorter end at exactly the limit ('__p9') and are taken by both, 11
    ('__p10') by neither. At the edge, each partition is a queue like any:
    a producer enqueues to it by its name, an operator pauses it by it."""
    with db.connect(logins.producer) as p:
        enqueue(p, "a" * MAX_QUEUE_NAME_BYTES)
        with pytest.raises(TOO_LONG, match=f"1 to {MAX_QUEUE_NAME_BYTES} bytes"):
            enqueue(p, "a" * (MAX_QUEUE_NAME_BYTES + 1))
    with pytest.raises(ValueError, match=f"1 to {MAX_QUEUE_NAME_BYTES} bytes, got 201 bytes"):
        PartitionedQueue("a" * (MAX_QUEUE_NAME_BYTES + 1), 1)
    name = "e" * (MAX_QUEUE_NAME_BYTES - 4)
    with db.connect(logins.operator) as op:
        with pytest.raises(TOO_LONG):
            op.execute("select * from awa.set_queue_partitions(%s, 11)", [name])
        with pytest.raises(ValueError, match="a queue name is at most 200 bytes"):
            PartitionedQueue(name, 11)
        parts = op.execute("select * from awa.set_queue_partitions(%s, 10)", [name]).fetchall()
    pq = PartitionedQueue(name, 10)
    assert parts == list(enumerate(pq.physical_queues))
    assert len(pq.physical_queues[-1].encode()) == MAX_QUEUE_NAME_BYTES
    key = next(f"k{i}" for i in range(10_000) if pq.index_for_key(f"k{i}") == 9)
    with db.connect(logins.producer) as p:
        assert awa_sql.enqueue(p, "k", **pq.route_by_key(key)).queue == pq.physical_queues[9]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.pause_queue(%s)", [pq.physical_queues[9]]).fetchone() == (
            True,)
        assert len(op.execute("select * from awa.set_enqueue_shards(%s, 2)",
                              [pq.physical_queues[9]]).fetchall()) == 1


def test_stripes_past_the_limit_are_reached_by_their_queues_name(db, logins):
    """A stripe's name ('name#k', a partition's 'name__pk#j') may pass the
    limit: no call takes it whatever its length ('#'), and every call by
    the queue's name reaches it."""
    plain, parted = "s" * MAX_QUEUE_NAME_BYTES, "t" * (MAX_QUEUE_NAME_BYTES - 4)
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_queue_stripes(%s, 16)", [plain])
        op.execute("select * from awa.set_queue_partitions(%s, 2)", [parted])
        op.execute("select * from awa.set_queue_stripes(%s, 16)", [parted + "__p1"])
    keys = [f"k{i}".encode() for i in range(64)]
    with db.connect(logins.producer) as p:
        sent = p.execute("select queue from awa.enqueue_batch(%s, %s, ordering_keys => %s)",
                         [[plain] * 64 + [parted] * 64, ["k"] * 128, keys + keys]).fetchall()
    assert max(len(q.encode()) for (q,) in sent) == MAX_QUEUE_NAME_BYTES + 3  # '#15'
    with db.connect(logins.operator) as op:
        for name in (plain, parted):
            op.execute("select awa.pause_queue(%s)", [name])
            op.execute("select awa.resume_queue(%s)", [name])
            op.execute("select * from awa.set_enqueue_shards(%s, 2)", [name])
    with db.connect() as su:
        stripes = su.execute("select count(*) from awa.queue_meta where queue like '%%#%%'"
                             " and enqueue_shards = 2").fetchone()[0]
    assert stripes == 32
    with db.connect(logins.worker) as w:
        assert len(claim_all(w, [plain, parted])) == 128
