"""PartitionedQueue and the composition of the partition and shard hashes."""

from __future__ import annotations

import pytest

from awa_sql import PartitionedQueue, routing


def test_names_and_routing():
    pq = PartitionedQueue("orders", 4)
    assert pq.physical_queues == ("orders", "orders__p1", "orders__p2", "orders__p3")
    assert pq.partitions == 4
    assert pq.queue_for_key("customer-42") == "orders__p3"  # partition 3 of 4
    assert pq.queue_for_key(b"order:1001") == "orders"  # partition 0
    assert pq.route_by_key("customer-42") == {"queue": "orders__p3",
                                              "ordering_key": b"customer-42"}
    assert pq.route_by_index(2) == {"queue": "orders__p2"}
    assert pq.queue_for_index(0) == "orders"
    with pytest.raises(IndexError, match="between 0 and 3, got 4"):
        pq.queue_for_index(4)
    assert PartitionedQueue("solo", 1).physical_queues == ("solo",)


def test_from_physical_queues_and_configs():
    pq = PartitionedQueue.from_physical_queues("legacy", ["a", "b", "c"])
    assert (pq.logical, pq.partitions, pq.queue_for_index(1)) == ("legacy", 3, "b")
    configs = pq.queue_configs(max_workers_per_partition=4, min_workers_per_partition=1,
                               rate_limit_per_partition=50.0)
    assert configs == [{"queue": q, "max_workers": 4, "min_workers": 1, "rate_limit": 50.0,
                        "family": False} for q in ["a", "b", "c"]]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: PartitionedQueue("", 2), "must not be empty"),
    (lambda: PartitionedQueue("q", 0), "between 1 and 32767, got 0"),
    (lambda: PartitionedQueue("q", 32768), "between 1 and 32767, got 32768"),
    (lambda: PartitionedQueue.from_physical_queues("q", []), "must not be empty"),
    (lambda: PartitionedQueue.from_physical_queues("q", ["a", ""]), "name 1 is empty"),
    (lambda: PartitionedQueue.from_physical_queues("q", ["a", "b", "a"]), "repeated: ['a']"),
    (lambda: PartitionedQueue("q", 2).queue_configs(max_workers_per_partition=1,
                                                    min_workers_per_partition=2),
     "must not exceed"),
])
def test_validation(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_partitions_and_shards_compose_and_the_correlated_scheme_does_not():
    """P = S = 4, 10,000 keys: inside every partition keyed traffic reaches
    every shard. Reducing one hash twice (shard = hash64 mod S inside
    partition hash64 mod P) would put each partition on one shard."""
    keys = [f"customer-{i}".encode() for i in range(10_000)]
    cells = {(routing.partition_for_ordering_key(k, 4), routing.shard_for_ordering_key(k, 4))
             for k in keys}
    assert cells == {(p, s) for p in range(4) for s in range(4)}
    correlated = {(routing.ordering_key_hash64(k) % 4, routing.ordering_key_hash64(k) % 4)
                  for k in keys}
    assert correlated == {(p, p) for p in range(4)}  # 4 of 16 cells: the failure it prevents


def test_every_cell_is_reached_for_p_up_to_16_and_s_up_to_64():
    """20,000 keys reach every (partition, shard) cell, for each P and S; the
    keys of each (P, S) are read only until its P * S cells are filled."""
    keys = [f"k{i}".encode() for i in range(20_000)]
    hashes = [(routing.partition_hash64(k), routing.ordering_key_hash64(k)) for k in keys]
    for p in range(1, 17):
        partitions = [ph % p for ph, _ in hashes]
        for s in range(1, 65):
            cells: set[tuple[int, int]] = set()
            for partition, (_, h) in zip(partitions, hashes, strict=True):
                cells.add((partition, h % s))
                if len(cells) == p * s:
                    break
            assert len(cells) == p * s, (p, s)


def test_python_and_sql_agree_on_partition_and_shard_for_10000_keys(db):
    keys = [f"order-{i}".encode() for i in range(10_000)]
    with db.connect(db.login_role("awa_producer")) as conn:
        rows = conn.execute(
            "select awa.partition_for_ordering_key(k, 4), awa.shard_for_ordering_key(k, 4)"
            " from unnest(%s::bytea[]) with ordinality as u (k, i) order by i", [keys]
        ).fetchall()
    assert rows == [(routing.partition_for_ordering_key(k, 4),
                     routing.shard_for_ordering_key(k, 4)) for k in keys]


# -- server side: a registered logical queue ---------------------------------------------


def test_server_side_partitions_route_every_enqueue_path(db):
    from psycopg.types.json import Jsonb

    operator, producer, worker = (db.login_role(f"awa_{c}")
                                  for c in ("operator", "producer", "worker"))
    pq = PartitionedQueue("orders", 4)
    with db.connect(operator) as op:
        parts = op.execute("select * from awa.set_queue_partitions('orders', 4)").fetchall()
        assert parts == list(enumerate(pq.physical_queues))
        changed = op.execute("select physical_queue from awa.set_enqueue_shards('orders', 4)"
                             ).fetchall()
        assert sorted(q for (q,) in changed) == sorted(pq.physical_queues)
    keys = [f"customer-{i}".encode() for i in range(200)]
    with db.connect(producer, autocommit=False) as p:
        single = [p.execute("select * from awa.enqueue('orders', 'k', ordering_key => %s)",
                            [k]).fetchone() for k in keys[:50]]
        batch = p.execute("select * from awa.enqueue_batch(%s, %s, ordering_keys => %s)",
                          [["orders"] * 50, ["k"] * 50, keys[50:100]]).fetchall()
        with p.cursor().copy("copy awa.copy_staging (queue, ordering_key, kind, args)"
                             " from stdin") as cp:
            for k in keys[100:]:
                cp.write_row(("orders", k, "k", Jsonb({"key": k.decode()})))
        assert p.execute("select awa.enqueue_copied()").fetchone()[0] == 100
        unkeyed = p.execute("select * from awa.enqueue('orders', 'k')").fetchone()
        p.commit()
    for k, row in zip(keys[:100], single + batch, strict=True):
        assert row[1] == pq.queue_for_key(k)
        assert row[3] == routing.shard_for_ordering_key(k, 4)
    assert unkeyed[1] in pq.physical_queues
    with db.connect(worker) as w:
        claimed = w.execute("select queue, enqueue_shard, ordering_key"
                            " from awa.claim(array['orders'], 500, 'w')").fetchall()
    assert len(claimed) == 201  # the logical name covers every partition
    for queue, shard, key in claimed:
        if key is not None:
            assert queue == pq.queue_for_key(key)
            assert shard == routing.shard_for_ordering_key(key, 4)


def test_unkeyed_jobs_of_consecutive_backends_reach_every_partition_stripe_and_lane(db):
    """A backend's sticky partition and stripe were pid % P and pid % K, as
    its sticky lane is pid % S: at P = S = 4 every producer of partition p
    started on lane p, and unkeyed jobs met on 4 of 16 (partition, lane)
    cells. The levels above the lanes spread the pid apart (awa._spread);
    an unkeyed job goes where it says for the backend that enqueues it."""
    with db.connect() as su:
        reached, correlated = su.execute(
            "select count(distinct (awa._spread(pid, 4, 1), awa._spread(pid, 2, 2), pid % 4)),"
            "       count(distinct (pid % 4, pid % 2, pid % 4))"
            "  from generate_series(1000, 1127) as pid").fetchone()
        assert (reached, correlated) == (32, 4)
    with db.connect(db.login_role("awa_operator")) as op:
        op.execute("select * from awa.set_queue_partitions('orders', 4)")
        op.execute("select * from awa.set_enqueue_shards('orders', 4)")
        op.execute("select * from awa.set_queue_stripes('striped', 2)")
    with db.connect(db.login_role("awa_producer")) as p:
        pid = p.execute("select pg_backend_pid()").fetchone()[0]
        partition = p.execute("select queue, enqueue_shard from awa.enqueue('orders', 'k')"
                              ).fetchone()
        stripe = p.execute("select queue from awa.enqueue('striped', 'k')").fetchone()[0]
    with db.connect() as su:
        want_partition, want_stripe = su.execute(
            "select awa._spread(%s, 4, 1), awa._spread(%s, 2, 2)", [pid, pid]).fetchone()
    assert partition == (PartitionedQueue("orders", 4).physical_queues[want_partition], pid % 4)
    assert stripe == f"striped#{want_stripe}"


@pytest.mark.parametrize(("value", "sqlstate"), [(0, "22023"), (32768, "22023"),
                                                 (None, "22004")])
def test_set_queue_partitions_validation(db, value, sqlstate):
    import psycopg

    with db.connect(db.login_role("awa_operator")) as op, pytest.raises(psycopg.Error) as err:
        op.execute("select * from awa.set_queue_partitions('p', %s)", [value])
    assert err.value.sqlstate == sqlstate


def test_only_operators_may_partition(db):
    import psycopg

    with db.connect(db.login_role("awa_producer")) as p, pytest.raises(
            psycopg.errors.InsufficientPrivilege):
        p.execute("select * from awa.set_queue_partitions('p', 2)")


def test_batch_routing_equals_routing_one_row_at_a_time(db):
    """awa._route_rows routes a call set-based (each partition and stripe it
    reaches looked up once); awa._route_queue, awa.enqueue's, one row at a
    time. The same rows, in one session (unkeyed rows take its sticky
    partition and stripe), over plain, partitioned, striped, partitioned and
    striped, and new queues, keyed and not: the same physical queue for each,
    and the partitions and stripes created on the way the same."""
    import random

    rng = random.Random(27)
    with db.connect() as su:
        su.execute("select awa.set_queue_partitions('rp', 4)")
        su.execute("select awa.set_queue_partitions('rps', 3)")
        su.execute("select awa.set_queue_stripes('rps', 2)")
        su.execute("select awa.set_queue_stripes('rps__p1', 2)")  # a partition's own stripes
        su.execute("select awa.set_queue_stripes('rs', 3)")
        su.execute("select awa.set_enqueue_shards('rplain', 4)")
        names = ["rp", "rps", "rs", "rplain", "rnew"]
        queues = [rng.choice(names) for _ in range(2000)]
        keys = [None if rng.random() < 0.3 else f"k{rng.randrange(300)}".encode()
                for _ in queues]
        su.execute("begin")
        batch = su.execute("select r.routed, r.queue_ids, r.key_shards"
                           " from awa._route_rows(%s::text[], %s::bytea[]) as r",
                           [queues, keys]).fetchone()
        created = su.execute("select array_agg(queue order by queue) from awa.queue_meta"
                             " where xmin = pg_current_xact_id()::xid").fetchone()[0]
        su.execute("rollback")
        su.execute("begin")
        one = [su.execute("select (awa._route_queue(awa._ensure_queue(%s), %s)).queue",
                          [q, k]).fetchone()[0] for q, k in zip(queues, keys, strict=True)]
        created_one = su.execute("select array_agg(queue order by queue) from awa.queue_meta"
                                 " where xmin = pg_current_xact_id()::xid").fetchone()[0]
        su.execute("rollback")
    assert list(batch[0]) == one
    assert created == created_one and "rnew" in created
    assert len(set(one)) > 10  # partitions, stripes and partitions' stripes were reached


def test_every_per_partition_config_claims_its_partition_alone():
    """queue_configs() marks each config "family": False, partition 0's (the
    logical name) too, so that the Worker claims it with awa.claim(...,
    family => false); a plain name keeps the family claim (no key: true)."""
    from awa_sql.partitions import iter_configs

    for pq in (PartitionedQueue("orders", 4),
               PartitionedQueue.from_physical_queues("legacy", ["a", "b"])):
        assert [c["family"] for c in pq.queue_configs()] == [False] * pq.partitions
        assert iter_configs(pq) == pq.queue_configs()
    assert iter_configs(["orders"]) == [{"queue": "orders"}]


def test_route_by_index_0_is_the_logical_name_which_the_server_routes(db):
    """route_by_index(0) names the logical queue: registered, an unkeyed job
    enqueued by it goes where an unkeyed enqueue to the logical name goes,
    the connection's sticky partition, not necessarily partition 0;
    route_by_index(k), k > 0, names partition k's queue, which keeps the
    job. Consecutive backends reach more than partition 0."""
    import awa_sql

    pq = PartitionedQueue("orders", 4)
    assert pq.route_by_index(0) == {"queue": "orders"}
    with db.connect(db.login_role("awa_operator")) as op:
        op.execute("select awa.set_queue_partitions('orders', 4)")
    producer = db.login_role("awa_producer")
    reached = set()
    for _ in range(16):
        with db.connect(producer) as p:
            by_index = [awa_sql.enqueue(p, "k", {}, **pq.route_by_index(i)).queue
                        for i in range(4)]
            by_name = awa_sql.enqueue(p, "k", {}, queue="orders").queue
        assert by_index[0] == by_name
        assert by_index[1:] == list(pq.physical_queues[1:])
        reached.add(by_index[0])
    assert reached - {"orders"}, reached
