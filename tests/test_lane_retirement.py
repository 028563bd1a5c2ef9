"""awa.retire_lanes (ADR 041), on real PostgreSQL 17 and 18: after S is
lowered, the lanes at or above it leave the claim walk
(queue_meta.lane_shards) once they are empty and no enqueue can reach them:
not while a session keeps a snapshot older than the change of S (it routes
by the S before), nor while an enqueue holds one of them (its job is not
committed yet). Never waits, refuses a snapshot older than the call, and is
for maintenance only. No job is left where no claim walks."""

from __future__ import annotations

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from awa_sql import routing
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import claim_all


def key_for(shard: int, shards: int) -> bytes:
    """An ordering key whose jobs go to `shard` at S = `shards`."""
    return next(k for i in range(10_000)
                if routing.shard_for_ordering_key(k := f"k{i}".encode(), shards) == shard)


def walked(conn, queue: str) -> tuple[int, int]:
    """(S, lane_shards) of a queue, once awa.lane_overview's walked column
    was checked against the claim's own rule (awa._walked_shards), which the
    view writes out again."""
    view = conn.execute(
        "select o.walked, o.shard < awa._walked_shards(m.lane_shards, m.enqueue_shards)"
        "  from awa.lane_overview as o join awa.queue_meta as m on m.queue = o.queue"
        " where o.queue = %s", [queue]).fetchall()
    assert view and all(shown == rule for shown, rule in view), view
    return conn.execute("select enqueue_shards, lane_shards from awa.queue_meta"
                        " where queue = %s", [queue]).fetchone()


def retire(db, logins) -> int:
    with db.connect(logins.maintenance) as m:
        return m.execute("select awa.retire_lanes()").fetchone()[0]


def enqueue_keyed(conn, queue: str, key: bytes) -> int:
    return conn.execute("select (awa.enqueue(%s, 'k', ordering_key => %s)).job_id",
                        [queue, key]).fetchone()[0]


@pytest.fixture
def su(db):
    with db.connect() as conn:
        yield conn


@pytest.fixture
def op(db, logins):
    with db.connect(logins.operator) as conn:
        yield conn


def set_shards(op, queue: str, shards: int) -> None:
    op.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])


def test_drained_lanes_above_s_leave_the_walk_and_a_raise_brings_them_back(db, logins, su,
                                                                            op):
    set_shards(op, "lr", 8)
    with db.connect(logins.producer) as p:
        jobs = {enqueue_keyed(p, "lr", key_for(s, 8)) for s in range(8)}
    set_shards(op, "lr", 2)
    assert retire(db, logins) == 0  # every lane above S holds a job
    assert walked(su, "lr") == (2, 8)
    with db.connect(logins.worker) as w:
        assert {c[0] for c in claim_all(w, ["lr"])} == jobs
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (2, 2)
    assert retire(db, logins) == 0
    with db.connect(logins.producer) as p:
        again = {enqueue_keyed(p, "lr", key_for(s, 2)) for s in range(2)}
    with db.connect(logins.worker) as w:
        assert {c[0] for c in claim_all(w, ["lr"])} == again
    # A raise walks every lane again; the ones above the new S go once drained.
    set_shards(op, "lr", 4)
    assert walked(su, "lr") == (4, 8)
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (4, 4)


def test_the_shards_up_to_the_highest_that_holds_a_job_stay(db, logins, su, op):
    set_shards(op, "lr", 8)
    with db.connect(logins.producer) as p:
        job = enqueue_keyed(p, "lr", key_for(5, 8))
    set_shards(op, "lr", 1)
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (1, 6)
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["lr"])] == [job]
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (1, 1)


def test_a_snapshot_older_than_the_change_of_s_keeps_every_lane(db, logins, su, op):
    """A repeatable read producer reads the S before the change for its whole
    transaction: its job goes to a lane above the new S, which must still be
    walked when the job commits."""
    set_shards(op, "lr", 8)
    with db.connect(logins.producer, autocommit=False) as late:
        late.execute("begin isolation level repeatable read")
        late.execute("select 1")
        set_shards(op, "lr", 1)
        assert retire(db, logins) == 0
        assert walked(su, "lr") == (1, 8)
        job, shard = late.execute(
            "select (e).job_id, (e).enqueue_shard from awa.enqueue('lr', 'k',"
            " ordering_key => %s) as e", [key_for(5, 8)]).fetchone()
        assert shard == 5
        late.commit()
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (1, 6)
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["lr"])] == [job]


def test_a_lane_an_enqueue_holds_is_not_retired(db, logins, su, op):
    """A read committed producer that enqueued before the change holds no
    snapshot between statements, but its job is not committed yet: the lane
    it holds stays walked."""
    set_shards(op, "lr", 8)
    with db.connect(logins.producer, autocommit=False) as p:
        job = enqueue_keyed(p, "lr", key_for(5, 8))
        # A simple-protocol statement drops the enqueue's portal, whose
        # snapshot psycopg's extended protocol leaves open until the next.
        p.pgconn.exec_(b"select 1")
        assert su.execute("select backend_xmin from pg_stat_activity where pid = %s",
                          [p.info.backend_pid]).fetchone()[0] is None
        set_shards(op, "lr", 1)
        assert retire(db, logins) == 0
        assert walked(su, "lr") == (1, 8)
        p.commit()
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (1, 6)
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["lr"])] == [job]


def test_a_queue_whose_settings_row_is_being_changed_is_skipped_without_waiting(db, logins,
                                                                                 su, op):
    set_shards(op, "lr", 8)
    set_shards(op, "lr", 2)
    with db.connect(logins.operator, autocommit=False) as raising:
        raising.execute("select awa.set_enqueue_shards('lr', 4)")
        assert retire(db, logins) == 0
        raising.commit()
    assert walked(su, "lr") == (4, 8)
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (4, 4)


def test_only_queues_walking_more_than_s_are_touched(db, logins, su, op):
    set_shards(op, "lr", 4)
    with db.connect(logins.producer) as p:
        enqueue_keyed(p, "plain", b"x")
    assert retire(db, logins) == 0
    assert walked(su, "lr") == (4, 4)
    assert walked(su, "plain") == (1, 1)


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_refuses_a_snapshot_older_than_the_call(db, logins, isolation):
    assert_refused_outside_read_committed(db, logins.maintenance, "awa.retire_lanes()",
                                          isolation)


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_is_for_maintenance_only(db, logins, role):
    with db.connect(getattr(logins, role)) as conn, pytest.raises(psycopg.Error) as err:
        conn.execute("select awa.retire_lanes()")
    assert err.value.sqlstate == "42501"


def test_no_job_is_stranded_while_s_moves_and_lanes_retire_under_load(db, logins, su):
    """Producers (read committed, and repeatable read, one of them with
    transactions of several jobs: only one, as two such transactions may
    deadlock over lanes taken in opposite orders) enqueue keyed jobs while an
    operator moves S between 1 and 8 and maintenance retires lanes in a loop;
    then every job is claimed once."""
    stop = threading.Event()
    done = threading.Event()  # every producer has committed its last job
    produced: list[int] = []
    retired: list[int] = []

    def produce(n: int) -> None:
        rng = random.Random(n)
        isolation = "repeatable read" if n % 2 else "read committed"
        with db.connect(logins.producer, autocommit=False) as p:
            while not stop.is_set():
                p.execute(f"begin isolation level {isolation}")
                if n % 2:
                    # The snapshot taken, then the producer's own work: S may
                    # change before its jobs go where the S before sends them.
                    p.execute("select pg_sleep(0.01)")
                ids = [enqueue_keyed(p, "lr", f"k{rng.randrange(64)}".encode())
                       for _ in range(rng.randrange(1, 4) if n == 1 else 1)]
                p.commit()
                produced.extend(ids)

    def move_s() -> None:
        with db.connect(logins.operator) as op:
            for shards in (8, 2, 6, 1, 8, 1, 4, 1) * 3:
                set_shards(op, "lr", shards)
                # A few jobs at each S, so lanes fill and drain in turn.
                start = len(produced)
                while len(produced) < start + 20:
                    op.execute("select pg_sleep(0.005)")
        stop.set()

    def retire_loop() -> None:
        with db.connect(logins.maintenance) as m:
            while not stop.is_set():
                retired.append(m.execute("select awa.retire_lanes()").fetchone()[0])

    def work() -> list[int]:
        seen = []
        with db.connect(logins.worker) as w:
            while True:
                last = done.is_set()
                rows = claim_all(w, ["lr"], 10)
                seen += [r[0] for r in rows]
                if last and not rows:
                    return seen

    set_shards(su, "lr", 1)
    with ThreadPoolExecutor(8) as pool:
        producers = [pool.submit(produce, n) for n in range(4)]
        mover = pool.submit(move_s)
        retirer = pool.submit(retire_loop)
        workers = [pool.submit(work) for _ in range(2)]
        try:
            mover.result()
            for f in producers:
                f.result()
        finally:
            stop.set()
            done.set()
        retirer.result()
        taken = [j for f in workers for j in f.result()]
    assert sum(retired) > 0, retired
    assert sorted(taken) == sorted(produced)
    assert len(set(taken)) == len(taken)
    assert su.execute("select count(*) from awa.ready").fetchone()[0] == 0


def test_a_snapshot_newer_than_the_callers_does_not_hide_an_older_one(db):
    """backend_xmin is 32 bits: widened by its distance from the caller's next
    xid, a snapshot taken after the caller's (an xmin above it) must not
    come out as the oldest."""
    with db.connect(autocommit=False) as old, db.connect(autocommit=False) as caller, \
            db.connect(autocommit=False) as new, db.connect() as other:
        old.execute("begin isolation level repeatable read")
        oldest = int(old.execute("select pg_snapshot_xmin(pg_current_snapshot())::text"
                                 ).fetchone()[0])
        caller.execute("begin isolation level repeatable read")
        caller.execute("select 1")
        for _ in range(3):
            other.execute("select pg_current_xact_id()")
        new.execute("begin isolation level repeatable read")
        newer = int(new.execute("select pg_snapshot_xmin(pg_current_snapshot())::text"
                                ).fetchone()[0])
        assert newer > int(caller.execute("select pg_snapshot_xmax(pg_current_snapshot())::text"
                                          ).fetchone()[0])
        assert int(caller.execute("select awa._oldest_snapshot()::text").fetchone()[0]) == oldest
        old.rollback()
        caller.execute("select pg_stat_clear_snapshot()")
        assert int(caller.execute("select awa._oldest_snapshot()::text").fetchone()[0]) == newer


def test_a_change_of_s_in_the_callers_own_transaction_retires_nothing(db, logins, su):
    """Uncommitted, the change is not seen by the snapshots taken after the
    check (a producer that starts then routes by the S before): a login that
    may both change S and retire lanes (an operator with maintenance, or the
    auto-scaler's tick) does so in two transactions."""
    both = db.login_role("awa_operator", "awa_maintenance")
    set_shards(su, "lr", 8)
    with db.connect(both, autocommit=False) as conn:
        conn.execute("select awa.set_enqueue_shards('lr', 1)")
        assert conn.execute("select awa.retire_lanes()").fetchone()[0] == 0
        conn.commit()
    assert walked(su, "lr") == (1, 8)
    assert retire(db, logins) == 1


def test_queues_that_keep_a_job_above_s_take_no_lane_lock(db, logins, su):
    """Five queues lowered from 64 to 1 keep a job in shard 63: they lock
    nothing, so the call reaches the empty queue after them."""
    for q in ("a1", "a2", "a3", "a4", "a5", "zz"):
        set_shards(su, q, 64)
    with db.connect(logins.producer) as p:
        for q in ("a1", "a2", "a3", "a4", "a5"):
            enqueue_keyed(p, q, key_for(63, 64))
    for q in ("a1", "a2", "a3", "a4", "a5", "zz"):
        set_shards(su, q, 1)
    with db.connect(logins.maintenance, autocommit=False) as m:
        assert m.execute("select awa.retire_lanes()").fetchone()[0] == 1
        assert m.execute("select count(*) from pg_locks where pid = pg_backend_pid()"
                         " and locktype = 'advisory'").fetchone()[0] == 63 * 4
        m.commit()
    assert walked(su, "zz") == (1, 1)
    assert walked(su, "a1") == (1, 64)


@pytest.mark.parametrize("table", ["awa.ready", "awa.lane_hints"])
def test_a_rewrite_holding_its_table_leaves_the_call_to_the_next(db, logins, su, table):
    """awa.compact_ready or awa.compact_lane_hints holding its table: the call
    returns 0 after its lock timeout, with nothing changed, not an error."""
    set_shards(su, "lr", 8)
    set_shards(su, "lr", 1)
    with db.connect(autocommit=False) as rewrite:
        rewrite.execute(f"lock table {table} in access exclusive mode")
        assert retire(db, logins) == 0
        rewrite.rollback()
    assert walked(su, "lr") == (1, 8)
    assert retire(db, logins) == 1


def test_a_function_layer_install_counts_a_change_an_earlier_layer_made(db, logins, su):
    """During an upgrade, the layer before migration 0032 lowers S without
    recording the change; the new layer's install counts it from then."""
    set_shards(su, "lr", 8)
    changed = su.execute("select shards_changed_xact::text from awa.queue_meta"
                         " where queue = 'lr'").fetchone()[0]
    su.execute("update awa.queue_meta set enqueue_shards = 1 where queue = 'lr'")
    su.execute("drop function awa.retire_lanes()")  # a layer before it
    su.execute("delete from awa.schema_functions")  # the layer is applied again
    db.awa("migrate", check=True)
    assert int(su.execute("select shards_changed_xact::text from awa.queue_meta"
                          " where queue = 'lr'").fetchone()[0]) > int(changed)
    assert retire(db, logins) == 1


def test_a_function_layer_install_does_not_wait_for_a_lowered_queues_row(db, op, su):
    """Over a layer that records changes of S, the install leaves them as
    they are: it used to rewrite every lowered queue's row at each apply,
    and an operator's open transaction on one (a pause) made awa migrate
    time out."""
    set_shards(op, "lr", 8)
    set_shards(op, "lr", 1)
    changed = su.execute("select shards_changed_xact::text from awa.queue_meta"
                         " where queue = 'lr'").fetchone()[0]
    su.execute("delete from awa.schema_functions")  # the layer is applied again
    with db.connect(autocommit=False) as holder:
        holder.execute("select awa.pause_queue('lr')")
        applied = db.awa("migrate", "--lock-timeout", "2s")
        holder.rollback()
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert su.execute("select shards_changed_xact::text from awa.queue_meta"
                      " where queue = 'lr'").fetchone()[0] == changed


def test_a_function_layer_install_keeps_the_lanes_retired(db, logins, su, op):
    """The layer counted every queue's lanes again at each install, which
    put the lanes awa.retire_lanes had taken out back into every claim's
    walk until its next pass. Counted once, at the first install after
    migration 0019."""
    set_shards(op, "lr", 8)
    set_shards(op, "lr", 1)
    assert retire(db, logins) == 1
    assert walked(su, "lr") == (1, 1)
    su.execute("update awa.schema_functions set checksum = 'changed' where file = 'views.sql'")
    db.awa("migrate", check=True)
    assert su.execute("select count(*) from awa.schema_functions where checksum = 'changed'"
                      ).fetchone()[0] == 0  # the layer was installed again
    assert walked(su, "lr") == (1, 1)


def test_the_lane_views_tell_drained_lanes_from_retired_ones(db, logins, su):
    """awa.lane_overview.walked, `awa storage show` and the admin API: a lane
    above S is drained while claims still visit it, retired once out."""
    set_shards(su, "lr", 4)
    set_shards(su, "lr", 2)

    def walked_by_shard():
        return dict(su.execute("select shard, bool_and(walked) from awa.lane_overview"
                               " where queue = 'lr' group by shard order by shard").fetchall())

    def states():
        out = db.awa("storage", "show", "--queue", "lr", user=logins.reader, check=True).stdout
        return {s for s in ("active", "drained", "retired", "draining") if s in out}

    assert walked_by_shard() == {0: True, 1: True, 2: True, 3: True}
    assert states() == {"active", "drained"}
    assert retire(db, logins) == 1
    assert walked_by_shard() == {0: True, 1: True, 2: False, 3: False}
    assert states() == {"active", "retired"}
    shown = db.awa("storage", "show", "--queue", "lr", "--json", user=logins.reader,
                   check=True).stdout
    lanes = json.loads(shown)["queues"][0]["lanes"]
    assert {(lane["shard"], lane["walked"]) for lane in lanes} == {
        (0, True), (1, True), (2, False), (3, False)}
