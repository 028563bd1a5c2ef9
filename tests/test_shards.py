"""awa.set_enqueue_shards, striped queues, the Python calls and the CLI."""

from __future__ import annotations

import collections
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

import awa_sql
from awa_sql import routing
from tests.support.jobs import claim_all, enqueue
from tests.support.waiting import wait_until


def set_shards(conn, queue, shards):
    return conn.execute("select * from awa.set_enqueue_shards(%s, %s)", [queue, shards]).fetchall()


def test_atomic_raise_and_lower_under_load(db, logins):
    """8 producers of two login roles enqueue keyed and unkeyed jobs while an
    operator moves S 1 -> 4 -> 8 -> 2 -> 1, each change once 100 jobs and a
    batch were acknowledged at the S before it (and the last S gets as many):
    the calls made wholly at one S routed by it, to more than one shard
    above S = 1 and none at or past S."""
    role_b = db.login_role("awa_producer")
    with db.connect(logins.producer) as p:
        enqueue(p, "hot")
    with db.connect() as admin:
        deadlocks_before = admin.execute(
            "select deadlocks from pg_stat_database where datname = current_database()"
        ).fetchone()[0]
    stop = threading.Event()
    acked: list[int] = []
    failures: list[str] = []
    # The test bumps ``changing`` before each change and ``epoch`` once it
    # committed: a call that read ``epoch`` before it began and ``changing``
    # as the same number after its commit ran wholly at that epoch's S. Their
    # (jobs, batches, shards) acknowledged, by epoch.
    epoch = changing = 0
    phases: dict[int, tuple[int, int, set[int]]] = collections.defaultdict(
        lambda: (0, 0, set()))
    lock = threading.Lock()

    def produce(i):
        rng = random.Random(i)
        role = logins.producer if i % 2 else role_b
        with db.connect(role, autocommit=False) as conn:
            while not stop.is_set():
                at = epoch
                try:
                    if rng.random() < 0.5:
                        rows = [enqueue(conn, "hot", ordering_key=(
                            f"k{rng.randint(0, 50)}".encode() if rng.random() < 0.5 else None))]
                    else:
                        n = rng.randint(2, 20)
                        keys = [f"k{rng.randint(0, 50)}".encode() if rng.random() < 0.5
                                else None for _ in range(n)]
                        rows = conn.execute(
                            "select * from awa.enqueue_batch(%s, %s, ordering_keys => %s::bytea[])",
                            [["hot"] * n, ["k"] * n, keys]).fetchall()
                    conn.commit()
                    with lock:
                        acked.extend(r[0] for r in rows)
                        if changing != at:
                            continue
                        jobs, batches, shards = phases[at]
                        phases[at] = (jobs + len(rows), batches + (len(rows) > 1),
                                      shards | {r[3] for r in rows})
                except psycopg.Error as err:
                    conn.rollback()
                    with lock:
                        failures.append(f"{err.sqlstate}: {err}")

    def phase_ran(at: int) -> bool:
        with lock:
            jobs, batches, _ = phases[at]
            return bool(failures) or (jobs >= 100 and batches >= 1)

    steps = (4, 8, 2, 1)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(produce, i) for i in range(8)]
        try:
            with db.connect(logins.operator) as op:
                for shards in steps:
                    wait_until(lambda e=epoch: phase_ran(e), 60, f"the producers at epoch {epoch}")
                    changing += 1
                    (row,) = set_shards(op, "hot", shards)
                    assert row[2] == shards
                    epoch += 1
            wait_until(lambda: phase_ran(epoch), 60, "the producers at S = 1")
        finally:
            stop.set()
            for f in futures:
                f.result()
    assert failures == []
    for at, shards in enumerate((1, *steps)):
        jobs, batches, used = phases[at]
        assert jobs >= 100 and batches >= 1, (shards, phases[at])
        assert used <= set(range(shards)), (shards, used)
        assert len(used) > 1 or shards == 1, (shards, used)
    with db.connect() as admin:
        late = admin.execute(
            "select count(*) from awa.ready r join awa.lanes l using (lane_id)"
            " where l.xmin <> r.xmin"
            "   and pg_xact_commit_timestamp(l.xmin) >= pg_xact_commit_timestamp(r.xmin)"
        ).fetchone()[0]
        # Every job's lane was committed before the job (or with it, by the
        # transaction that created the queue).
        assert late == 0
        deadlocks_after = admin.execute(
            "select deadlocks from pg_stat_database where datname = current_database()"
        ).fetchone()[0]
        assert deadlocks_after == deadlocks_before
        shard_changes = admin.execute(
            "select old_shards, new_shards from awa.shard_changes where queue = 'hot'"
            " order by change_id").fetchall()
        assert shard_changes == [(1, 4), (4, 8), (8, 2), (2, 1)]
    with db.connect(logins.worker) as w:
        drained = [c[0] for c in claim_all(w, ["hot"], 500)]
    assert len(drained) == len(set(drained))
    assert set(acked) <= set(drained)
    assert len(drained) == len(acked) + 1  # the first job enqueued before the producers


def test_idempotent_and_sixteen_concurrent_identical_calls(db, logins):
    with db.connect(logins.operator) as op:
        first = set_shards(op, "idem", 8)
        assert first == [("idem", 1, 8, 32)]  # the queue is new: all its lanes
        with db.connect() as admin:
            snapshot = admin.execute(
                "select lane_id, priority, shard, seq::text from awa.lanes order by 1").fetchall()
        assert set_shards(op, "idem", 8) == [("idem", 8, 8, 0)]
    errors: list[str] = []
    barrier = threading.Barrier(16)

    def call(_):
        with db.connect(logins.operator) as op:
            barrier.wait()
            try:
                return set_shards(op, "idem16", 16)
            except psycopg.Error as err:
                errors.append(err.sqlstate)
                return None

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(16)))
    assert errors == []
    created = sorted(r[0][3] for r in results)
    assert created == [0] * 15 + [64]  # one call created the queue's 64 lanes
    with db.connect() as admin:
        assert admin.execute(
            "select lane_id, priority, shard, seq::text from awa.lanes"
            " where queue_id = (select queue_id from awa.queue_meta where queue = 'idem')"
            " order by 1").fetchall() == [r for r in snapshot]
        assert admin.execute(
            "select count(*), count(distinct (priority, shard)) from awa.lanes l"
            " join awa.queue_meta m using (queue_id) where m.queue = 'idem16'").fetchone() == (
                64, 64)
        assert admin.execute(
            "select count(*) from awa.shard_changes where queue = 'idem16'").fetchone()[0] == 1


def test_lowering_four_to_two_drains_every_shard(db, logins):
    with db.connect(logins.operator) as op:
        set_shards(op, "lower", 4)
    keys = [f"key-{i}".encode() for i in range(40)]
    with db.connect(logins.producer) as p:
        sent = [enqueue(p, "lower", ordering_key=k) for k in keys]
    assert {r[3] for r in sent} == {0, 1, 2, 3}
    with db.connect(logins.operator) as op:
        assert set_shards(op, "lower", 2) == [("lower", 4, 2, 0)]
    with db.connect(logins.producer) as p:
        after = [enqueue(p, "lower", ordering_key=k) for k in keys]
    assert {r[3] for r in after} == {0, 1}
    with db.connect(logins.worker) as w:
        done = claim_all(w, ["lower"], 7)
        for c in done:
            assert w.execute("select awa.complete(%s, %s)", [c[0], c[1]]).fetchone()[0]
    assert sorted(c[0] for c in done) == sorted(r[0] for r in sent + after)


def test_an_open_producer_connection_sees_the_new_s_at_its_next_statement(db, logins):
    key = b"customer-42"  # shard 0 at S = 1, shard 4 at S = 8
    with db.connect(logins.producer) as p, db.connect(logins.operator) as op:
        assert enqueue(p, "live", ordering_key=key)[3] == 0
        set_shards(op, "live", 8)
        assert enqueue(p, "live", ordering_key=key)[3] == 4
        set_shards(op, "live", 1)
        assert enqueue(p, "live", ordering_key=key)[3] == 0


def test_striped_queue_every_stripe_gets_the_new_s(db, logins):
    with db.connect(logins.operator) as op:
        stripes = op.execute("select * from awa.set_queue_stripes('striped', 3)").fetchall()
        assert [s[0] for s in stripes] == ["striped#0", "striped#1", "striped#2"]
        rows = set_shards(op, "striped", 4)
    assert sorted(r[0] for r in rows) == ["striped", "striped#0", "striped#1", "striped#2"]
    assert all(r[2] == 4 and r[3] == 12 for r in rows)
    keys = [f"s{i}".encode() for i in range(60)]
    with db.connect(logins.producer) as p:
        sent = [enqueue(p, "striped", ordering_key=k) for k in keys]
    for k, r in zip(keys, sent, strict=True):
        assert r[1] == f"striped#{routing.stripe_for_ordering_key(k, 3)}"
        assert r[3] == routing.shard_for_ordering_key(k, 4)
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.pause_queue('striped')").fetchone()[0]
        paused = op.execute("select bool_and(paused) from awa.queue_overview"
                            " where logical_queue = 'striped'").fetchone()[0]
        assert paused is True
        op.execute("select awa.resume_queue('striped')")
    with db.connect(logins.worker) as w:
        got = claim_all(w, ["striped"])
    assert sorted(c[0] for c in got) == sorted(r[0] for r in sent)


@pytest.mark.parametrize(("shards", "sqlstate", "message"), [
    (0, "22023", "between 1 and 64, got 0"),
    (65, "22023", "between 1 and 64, got 65"),
    (-1, "22023", "got -1"),
    (None, "22004", "must not be null"),
])
def test_validation(db, logins, shards, sqlstate, message):
    with db.connect(logins.operator) as op, pytest.raises(psycopg.Error) as err:
        set_shards(op, "valid", shards)
    assert err.value.sqlstate == sqlstate and message in str(err.value)


@pytest.mark.parametrize("grants", [(), ("awa_producer",), ("awa_reader",), ("awa_worker",)])
def test_only_operators_may_change_s(db, grants):
    login = db.login_role(*grants)
    with db.connect(login) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        set_shards(conn, "guarded", 4)


def test_python_api(db, logins):
    with db.connect(logins.operator, autocommit=False) as conn:
        changes = awa_sql.set_enqueue_shards(conn, "py", 4)
        conn.commit()
    assert changes == [awa_sql.ShardChange("py", 1, 4, 16)]
    with db.connect(logins.producer) as p:
        enqueue(p, "py", ordering_key=b"order:1001")
    with db.connect(logins.reader) as conn:
        (status,) = awa_sql.show(conn, "py")
    assert isinstance(status, awa_sql.QueueStatus)
    assert (status.queue, status.enqueue_shards, status.ready) == ("py", 4, 1)
    assert len(status.lanes) == 16
    (busy,) = [ln for ln in status.lanes if ln.ready]
    assert (busy.priority, busy.shard, busy.claim_position) == (2, 1, 1)


# -- the CLI, end to end ------------------------------------------------------------------


@pytest.mark.one_version
def test_cli_set_enqueue_shards_dry_run_refusal_and_apply(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "cli")
    dry = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shards", "4",
                 "--dry-run", user=logins.operator, check=True)
    assert "lanes to create" in dry.stdout and "12" in dry.stdout
    assert "partitioned FIFO" in dry.stdout and "nothing changed" in dry.stdout
    refused = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shards", "4",
                     user=logins.operator)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    with db.connect() as admin:
        assert admin.execute("select enqueue_shards from awa.queue_meta where queue = 'cli'"
                             ).fetchone()[0] == 1
    done = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shards", "4", "--yes",
                  user=logins.operator, check=True)
    assert "lanes created" in done.stdout
    with db.connect() as admin:
        assert admin.execute("select enqueue_shards from awa.queue_meta where queue = 'cli'"
                             ).fetchone()[0] == 4
    bad = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shards", "65", "--yes",
                 user=logins.operator)
    assert bad.returncode == 2 and "between 1 and 64" in bad.stderr
    denied = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shards", "2", "--yes",
                    user=logins.producer)
    assert denied.returncode == 7 and "42501" in denied.stderr


@pytest.mark.one_version
def test_cli_dry_run_of_a_partition_states_its_real_s(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('orders', 2)")
        set_shards(op, "orders", 4)
    dry = db.awa("storage", "set-enqueue-shards", "--queue", "orders__p1", "--shards", "8",
                 "--dry-run", user=logins.operator, check=True)
    rows = [line.split() for line in dry.stdout.splitlines() if line.startswith("orders")]
    assert rows == [["orders__p1", "4", "8", "16"]], dry.stdout
    done = db.awa("storage", "set-enqueue-shards", "--queue", "orders__p1", "--shards", "8",
                  "--yes", user=logins.operator, check=True)
    assert [line.split() for line in done.stdout.splitlines()
            if line.startswith("orders")][-1] == ["orders__p1", "4", "8", "16"], done.stdout


def _layouts(conn):
    """Queues of every shape set_enqueue_shards takes: a partitioned queue whose
    second partition has stripes, a striped queue, a plain one."""
    conn.execute("select awa.set_queue_partitions('orders', 3)")
    conn.execute("select * from awa.set_enqueue_shards('orders', 4)")
    conn.execute("select awa.set_queue_stripes('orders__p1', 2)")
    conn.execute("select awa.set_queue_stripes('striped', 3)")
    conn.execute("select * from awa.set_enqueue_shards('striped', 2)")
    conn.execute("select * from awa.set_enqueue_shards('plain', 1)")


def _by_queue(changes):
    return sorted(changes, key=lambda c: c.physical_queue)


@pytest.mark.parametrize("queue", ["orders", "orders__p1", "orders__p2", "striped", "plain",
                                   "new"])
def test_plan_is_what_the_change_does_for_every_name(db, logins, queue):
    with db.connect(logins.operator) as op:
        _layouts(op)
    for shards in (1, 2, 4, 8):
        with db.connect(logins.operator, autocommit=False) as op:
            plan = awa_sql.shards.plan_enqueue_shards(op, queue, shards)
            done = awa_sql.shards.set_enqueue_shards(op, queue, shards)
            op.rollback()
        assert _by_queue(plan) == _by_queue(done), shards
        with db.connect(logins.reader, autocommit=False) as reader:  # a reader may plan
            assert _by_queue(awa_sql.shards.plan_enqueue_shards(reader, queue, shards)) == \
                _by_queue(done)


def test_plan_refuses_a_stripe_or_a_bad_name_as_the_change_does(db, logins):
    with db.connect(logins.operator) as op:
        _layouts(op)
    for name in ("striped#0", "orders__p1#1", "no#such", "x" * 201):
        with db.connect(logins.operator, autocommit=False) as op:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as planned:
                awa_sql.shards.plan_enqueue_shards(op, name, 2)
            op.rollback()
            with pytest.raises(psycopg.errors.InvalidParameterValue) as changed:
                awa_sql.shards.set_enqueue_shards(op, name, 2)
        assert planned.value.diag.message_primary == changed.value.diag.message_primary


@pytest.mark.one_version
def test_cli_show_text_and_json(db, logins):
    with db.connect(logins.operator) as op:
        set_shards(op, "shown", 4)
    with db.connect(logins.producer) as p:
        enqueue(p, "shown", ordering_key=b"order:1001")  # shard 1 at S = 4
    with db.connect(logins.operator) as op:
        set_shards(op, "shown", 1)
    text = db.awa("storage", "show", "--queue", "shown", user=logins.reader, check=True).stdout
    assert "lanes of shown (S = 1)" in text
    draining = [ln for ln in text.splitlines() if "draining" in ln]
    assert len(draining) == 1 and draining[0].split()[:3] == ["2", "1", "1"]
    doc = json.loads(db.awa("storage", "show", "--json", user=logins.reader, check=True).stdout)
    (q,) = [q for q in doc["queues"] if q["queue"] == "shown"]
    assert q["enqueue_shards"] == 1 and q["ready"] == 1
    assert [ln["shard"] for ln in q["lanes"] if ln["draining"]] == [1]
    assert set(q) >= {"queue", "logical_queue", "enqueue_shards", "shard_mode", "paused",
                      "stripes", "ready", "running", "lanes"}
    for fmt in ((), ("--json",)):
        missing = db.awa("storage", "show", "--queue", "no-such", *fmt, user=logins.reader)
        assert missing.returncode == 2, missing  # bad input, not 1 ("pending")
        assert "no queue 'no-such'" in missing.stderr and not missing.stdout


@pytest.mark.one_version
def test_cli_show_of_a_partition_shows_that_partition(db, logins):
    """A partition's own name (the admin page links to each) shows it: the
    filter read only the logical queue's name, and said there was no queue."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_queue_partitions('orders', 2)")
        set_shards(op, "orders", 4)
    doc = json.loads(db.awa("storage", "show", "--queue", "orders__p1", "--json",
                            user=logins.reader, check=True).stdout)
    assert [(q["queue"], q["enqueue_shards"], len(q["lanes"])) for q in doc["queues"]] == [
        ("orders__p1", 4, 16)]
    whole = json.loads(db.awa("storage", "show", "--queue", "orders", "--json",
                              user=logins.reader, check=True).stdout)
    assert {q["queue"] for q in whole["queues"]} == {"orders", "orders__p1"}


def test_enqueue_shards_reads_s_for_every_role(db, logins):
    with db.connect(logins.operator) as op:
        set_shards(op, "readable", 8)
    for role in (logins.producer, logins.worker, logins.maintenance, logins.reader):
        with db.connect(role) as conn:
            assert conn.execute("select awa.enqueue_shards('readable')").fetchone()[0] == 8
    with db.connect(logins.reader) as conn, pytest.raises(psycopg.errors.UndefinedObject):
        conn.execute("select awa.enqueue_shards('no such queue')")


@pytest.mark.parametrize("own", ["stripes", "partitions"])
def test_a_queue_with_partitions_or_stripes_of_its_own_cannot_join_another(db, logins, own):
    """A queue named as another's partition (solo__p1) made before it, with
    stripes or partitions of its own: it cannot become the partition (its
    own would stay linked to it, out of the family's claims): 0A000 naming
    both, and nothing changes. A plain queue of that name joins."""
    with db.connect(logins.operator) as op, db.connect() as su:
        if own == "stripes":
            op.execute("select awa.set_queue_stripes('solo__p1', 2)")
        else:
            op.execute("select awa.set_queue_partitions('solo__p1', 2)")
        op.execute("select awa.set_enqueue_shards('solo', 1)")
        before = su.execute("select queue, root_queue, logical_queue, partitions"
                            " from awa.queue_meta order by queue").fetchall()
        with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
            op.execute("select * from awa.set_queue_partitions('solo', 2)")
        assert err.value.diag.message_primary == (
            "queue 'solo__p1' has partitions or stripes of its own: it cannot become a"
            " partition of 'solo'")
        # drop_queue refuses such a queue too: the hint must not send the operator there
        assert err.value.diag.message_hint == (
            "Name the logical queue otherwise: a queue that has had partitions or stripes"
            " cannot be dropped yet.")
        assert su.execute("select queue, root_queue, logical_queue, partitions"
                          " from awa.queue_meta order by queue").fetchall() == before
        op.execute("select awa.set_enqueue_shards('plain__p1', 1)")
        op.execute("select * from awa.set_queue_partitions('plain', 2)")
        assert su.execute("select root_queue from awa.queue_meta where queue = 'plain__p1'"
                          ).fetchone()[0] == "plain"
