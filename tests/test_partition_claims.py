"""Claims by one partition of a logical queue: awa.claim(..., family => false).

A logical queue of P partitions is carried by the queue itself (partition 0,
the logical name) and name__p1 .. name__p(P-1). A claim by the logical name
covers every partition and every stripe of them (awa._names_cover); with
family false it covers the named queue and its own stripes only, so the
worker of partition 0 claims by the logical name and takes partition 0's
jobs alone. PartitionedQueue.queue_configs() marks its configs so, and the
Worker passes it on: one slot per partition then runs one key's jobs one at
a time (docs/python.md).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import psycopg
import pytest

import awa_sql
from awa_sql import PartitionedQueue, routing
from awa_sql.worker import Worker
from tests.support.waiting import wait_until

# orders: striped (2) before it was partitioned (4), so partition 0 is the
# queue and its stripes; orders__p1 striped (2) on its own; plain: striped
# (3), no partitions; lone: neither.
ORDERS_OWN = {"orders", "orders#0", "orders#1"}
P1_OWN = {"orders__p1", "orders__p1#0", "orders__p1#1"}
ORDERS_ALL = ORDERS_OWN | P1_OWN | {"orders__p2", "orders__p3"}
PLAIN = {"plain", "plain#0", "plain#1", "plain#2"}
CLAIMED_QUEUES = "select c.queue, c.job_id from awa.claim(%s, 1000, 'w', family => %s) c"


def _layout(db) -> dict[str, set[int]]:
    """The layout above, every physical queue with ready jobs; each queue's
    ready job ids."""
    with db.connect() as su:
        for q in ("orders", "orders", "plain", "lone"):  # before striping: the queue's own
            su.execute("select awa.enqueue(%s, 'k')", [q])
        su.execute("select awa.set_queue_stripes('orders', 2)")
        su.execute("select awa.set_queue_partitions('orders', 4)")
        su.execute("select awa.enqueue('orders__p1', 'k')")
        su.execute("select awa.set_queue_stripes('orders__p1', 2)")
        su.execute("select awa.set_queue_stripes('plain', 3)")
        keys = [f"k{i}".encode() for i in range(200)]
        for q in ("orders", "orders__p1", "plain"):
            su.execute("select count(*) from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                       " array_fill('k'::text, array[%s]), ordering_keys => %s::bytea[])",
                       [q, len(keys), len(keys), keys])
        ready: dict[str, set[int]] = defaultdict(set)
        for queue, job_id in su.execute("select m.queue, r.job_id from awa.ready r"
                                        " join awa.queue_meta m using (queue_id)"):
            ready[queue].add(job_id)
    assert set(ready) == ORDERS_ALL | PLAIN | {"lone"}, sorted(ready)
    return ready


@pytest.mark.parametrize(("names", "family", "covered"), [
    (["orders"], False, ORDERS_OWN),
    (["orders"], True, ORDERS_ALL),
    (["orders__p1"], False, P1_OWN),
    (["orders__p1"], True, P1_OWN),
    (["orders__p2"], False, {"orders__p2"}),
    (["plain"], False, PLAIN),
    (["plain"], True, PLAIN),
    (["lone"], False, {"lone"}),
    (["orders#1"], False, {"orders#1"}),
    (["orders", "orders__p3", "plain"], False, ORDERS_OWN | {"orders__p3"} | PLAIN),
    (["orders", "orders__p3", "plain"], True, ORDERS_ALL | PLAIN),
], ids=lambda v: ",".join(v) if isinstance(v, list) else str(v) if isinstance(v, bool) else "")
def test_a_claim_without_family_takes_the_named_queues_and_their_own_stripes(
        db, logins, names, family, covered):
    """family false: the named queues and their own stripes, every ready job
    of them, none of another partition's; the default covers the family."""
    ready = _layout(db)
    with db.connect(logins.worker, autocommit=False) as w:
        rows = w.execute(CLAIMED_QUEUES, [names, family]).fetchall()
        w.rollback()
    assert {q for q, _ in rows} == covered
    assert sorted(j for _, j in rows) == sorted(j for q in covered for j in ready[q])


def test_the_default_claim_is_the_family_claim(db, logins):
    """A claim that leaves family out, by position or by name, is a family
    claim: by the logical name it takes every partition's jobs."""
    ready = _layout(db)
    with db.connect(logins.worker, autocommit=False) as w:
        for call in ("select c.job_id from awa.claim(array['orders'], 1000, 'w') c",
                     "select c.job_id from awa.claim(array['orders'], 1000, 'w', '1 minute') c",
                     "select c.job_id from awa.claim(queues => array['orders'],"
                     " max_jobs => 1000, worker => 'w') c"):
            got = sorted(j for (j,) in w.execute(call).fetchall())
            w.rollback()
            assert got == sorted(j for q in ORDERS_ALL for j in ready[q]), call


@pytest.mark.parametrize(("args", "sqlstate", "message"), [
    ("array['q'], 1, 'w', family => null", "22004", "family must not be null"),
    ("null, 1, 'w', family => null", "22004", "queues must not be null"),
    ("array['q'], 1, null, family => null", "22004", "worker must not be null"),
    ("array['q'], -1, repeat('w', 256), family => null", "22004", "family must not be null"),
    # The checks' order, which the one condition that runs them all kept.
    ("array['q'], -1, repeat('w', 256), null", "22023", "worker must be at most 255 bytes"),
    ("array['q'], -1, 'w', '-1 second'", "22023", "max_jobs must be 0 or more, got -1"),
    ("array['q'], null, 'w', null", "22004", "max_jobs must not be null"),
    ("array['q'], 0, 'w', '31 days'", "22023", "lease"),
    ("array['q'], 1, 'w', null, false", "22004", "lease must not be null"),
])
def test_a_claims_arguments_are_checked_in_order(db, logins, args, sqlstate, message):
    """A null family is refused, naming it; the other checks come as they did."""
    with db.connect(logins.worker) as w, pytest.raises(psycopg.Error, match=message) as err:
        w.execute(f"select awa.claim({args})")
    assert err.value.sqlstate == sqlstate


def _key_for(pq: PartitionedQueue, partition: int, taken: set[str]) -> str:
    key = next(k for i in range(10_000) if (k := f"key-{i}") not in taken
               and routing.partition_for_ordering_key(k, pq.partitions) == partition)
    taken.add(key)
    return key


def test_one_slot_per_partition_runs_one_keys_jobs_one_at_a_time(db, logins):
    """queue_configs(max_workers_per_partition=1) over 4 partitions: the
    claimer of partition 0 claims by the logical name, and took the jobs of
    every partition (two jobs of one key of partition 2 ran at once, one on
    partition 0's slot). Every job runs on its own partition's slot, and no
    key ever has two jobs running.

    The held jobs keep the slots of partitions 1, 2 and 3 busy, so only
    partition 0's claimer claims; once it has made two claims after they
    started (the second begun after the first, so after the third job's
    claim committed), the second job of partition 2's key was free to it
    all along."""
    orders = PartitionedQueue("orders", 4)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('orders', 4)")
    taken: set[str] = set()
    held = {1: _key_for(orders, 1, taken), 3: _key_for(orders, 3, taken),
            2: _key_for(orders, 2, taken)}
    quick = _key_for(orders, 0, taken)
    jobs = [(held[1], 0), (held[3], 0), (held[2], 0), (held[2], 1), (quick, 0), (quick, 1)]
    with db.connect(logins.producer) as p:
        for key, n in jobs:
            awa_sql.enqueue(p, "step", {"key": key, "n": n, "hold": key in held.values()},
                            **orders.route_by_key(key))

    changed = threading.Condition()
    release = threading.Event()
    running: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    started: list[tuple[str, int]] = []
    done: list[tuple[str, int]] = []
    ran_on: list[tuple[str, str]] = []  # (the slot's config queue, the job's queue)

    def step(job):
        key, n = job.args["key"], job.args["n"]
        slot_queue = threading.current_thread().name.removeprefix("awa-").rsplit("-", 1)[0]
        with changed:
            running[key] += 1
            peak[key] = max(peak[key], running[key])
            started.append((key, n))
            ran_on.append((slot_queue, job.queue))
            changed.notify_all()
        try:
            if job.args["hold"]:
                assert release.wait(60), "never released"
        finally:
            with changed:
                running[key] -= 1
                done.append((key, n))
                changed.notify_all()

    def wrong() -> bool:
        """A job ran on another partition's slot, or beside its key's other."""
        return any(slot != queue for slot, queue in ran_on) or max(peak.values(), default=0) > 1

    configs = orders.queue_configs(max_workers_per_partition=1)
    assert [c["queue"] for c in configs] == list(orders.physical_queues)
    worker = Worker(db.dsn(logins.worker), queues=configs, handlers={"step": step},
                    poll_interval=0.05, snapshot_every=None)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        with changed:
            assert changed.wait_for(
                lambda: wrong() or ({(held[1], 0), (held[3], 0), (held[2], 0)} <= set(started)
                                    and {(quick, 0), (quick, 1)} <= set(done)),
                timeout=60), started
            assert not wrong(), f"(slot, job's queue): {ran_on}; most at once: {dict(peak)}"
        claims = worker.claims
        wait_until(lambda: worker.claims >= claims + 2,
                   what="two claims of partition 0's claimer, its slot free")
        with changed:
            assert (held[2], 1) not in started, "partition 2's second job ran beside its first"
        release.set()
        with changed:
            assert changed.wait_for(lambda: len(done) == len(jobs), timeout=60), done
    finally:
        release.set()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert all(n == 1 for n in peak.values()), dict(peak)
    for key in {k for k, _ in jobs}:
        assert [n for k, n in started if k == key] == sorted(n for k, n in jobs if k == key)
    assert all(slot == queue for slot, queue in ran_on), ran_on
    assert {slot for slot, _ in ran_on} == set(orders.physical_queues)


def test_a_config_without_family_claims_its_queue_alone_and_a_name_its_family(db, logins):
    """{"queue": "orders", "family": False} takes partition 0's jobs alone and
    leaves partition 1's; a plain name (family, the default) takes those. A
    family other than True or False is refused when the Worker is made."""
    with pytest.raises(ValueError, match=r"queue orders: family must be True \(.*\) or False"
                                         r" \(.*\), got 'no'"):
        Worker(db.dsn(logins.worker), queues=[{"queue": "orders", "family": "no"}],
               handlers={})
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('orders', 2)")
    with db.connect(logins.producer) as p:
        queues = [awa_sql.enqueue(p, "k", {}, queue="orders", ordering_key=f"k{i}").queue
                  for i in range(40)]
    assert set(queues) == {"orders", "orders__p1"}
    ran: dict[str, list[str]] = {}
    for which, config in (("own", [{"queue": "orders", "family": False}]),
                          ("name", ["orders"])):
        ran[which] = _run_until_drained(db, logins, config)
    # Partition 0's jobs, and then, the worker of the plain name, the rest.
    assert sorted(ran["own"]) == sorted(q for q in queues if q == "orders")
    assert sorted(ran["name"]) == sorted(q for q in queues if q == "orders__p1")


def _run_until_drained(db, logins, queues) -> list[str]:
    """Runs a Worker on ``queues`` until its claims find no job: two claims
    after the last job ended, or after it started, when none did (its one
    slot claims only when free: the second begun after the end); the queues
    of the jobs it ran."""
    ran: list[str] = []
    lock = threading.Lock()

    def record(job):
        with lock:
            ran.append(job.queue)

    worker = Worker(db.dsn(logins.worker), queues=queues, handlers={"k": record},
                    poll_interval=0.05, snapshot_every=None)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        last: list[int] = [-1, 0]  # jobs ended, claims then

        def drained() -> bool:
            with worker._lock:
                ended, claims = worker.completed, worker.claims
            if ended != last[0]:
                last[:] = [ended, claims]
            return claims >= last[1] + 2
        wait_until(drained, what=f"a worker of {queues} to drain its queues")
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    return ran
