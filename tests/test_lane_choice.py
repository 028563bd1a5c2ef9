"""Lane choice: two lane-locking calls never deadlock each other.

A call waits for a lane lock only above every lane lock it holds and takes
any other lane with a try-lock (sql/lanes.sql). These tests cross calls that
would deadlock under any other order: the case that did on 0.x (an unkeyed
group waiting below a keyed lane it held), and random crossed batches over
queues of several S, keyed and unkeyed, two priorities, with a third
transaction holding random lanes so that the calls really wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from awa_sql import routing
from tests.support.jobs import LANE_CLASS, key_for_shard, waits_for_a_lock
from tests.support.jobs import Call as Work
from tests.support.waiting import wait_until

BATCH_SQL = ("select * from awa.enqueue_batch(%s::text[], %s::text[], priorities => %s::smallint[],"
             " ordering_keys => %s::bytea[])")


def _fast_deadlock_detection(db) -> None:
    with db.connect() as su:
        su.execute(sql.SQL("alter database {} set deadlock_timeout = '20ms'").format(
            sql.Identifier(db.name)))


class Call(threading.Thread):
    """One producer transaction in a thread: a batch, then commit."""

    def __init__(self, db, login: str, rows: list[tuple[str, int, bytes | None]]):
        super().__init__(daemon=True)
        self.conn = db.connect(login, autocommit=False)
        self.pid = self.conn.execute("select pg_backend_pid()").fetchone()[0]
        self.conn.commit()
        self.rows = rows
        self.error: Exception | None = None
        self.result: list | None = None

    def run(self) -> None:
        try:
            self.result = self.conn.execute(BATCH_SQL, [
                [q for q, _, _ in self.rows], ["crossed"] * len(self.rows),
                [p for _, p, _ in self.rows], [k for _, _, k in self.rows],
            ]).fetchall()
            self.conn.commit()
        except psycopg.Error as err:
            self.error = err
            self.conn.rollback()
        finally:
            self.conn.close()


def _cross(db, login, admin, first_rows, second_rows, hold) -> tuple[Call, Call]:
    """`hold` commits once both calls have started and are waiting or done."""
    first, second = Call(db, login, first_rows), Call(db, login, second_rows)
    for call in (first, second):
        call.start()
        wait_until(lambda c=call: not c.is_alive() or waits_for_a_lock(admin, c.pid),
                   what="the call to wait or finish")
    hold.commit()
    for call in (first, second):
        call.join(timeout=30)
        assert not call.is_alive()
    return first, second


def test_the_crossed_batches_that_deadlocked_do_not(db):
    """qb (S = 1) was created before qa (S = 4), so qb's lane id is lower. A
    holder keeps qb's lane; P2 batches [qb keyed, qa 'customer-42'] and waits
    for qb; P1 batches [qa 'customer-42', qb unkeyed]. P1 used to take qa's
    lane and then wait for qb below it: P2, granted qb first, then waited for
    qa, and one of them got 40P01."""
    _fast_deadlock_detection(db)
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('qb', 1)")
        su.execute("select awa.set_enqueue_shards('qa', 4)")
    with db.connect() as admin, db.connect(producer, autocommit=False) as hold:
        hold.execute("select awa.enqueue('qb', 'hold')")
        p2, p1 = _cross(db, producer, admin,
                        [("qb", 2, b"x"), ("qa", 2, b"customer-42")],
                        [("qa", 2, b"customer-42"), ("qb", 2, None)], hold)
        assert p2.error is None and p1.error is None, (p2.error, p1.error)
        assert len(p2.result) == 2 and len(p1.result) == 2
        # Both wrote to the lanes of their rows: qb's only lane, qa's shard 0.
        assert {(r[1], r[3]) for r in p1.result + p2.result} == {("qb", 0), ("qa", 0)}


QUEUES = {"d1": 1, "d2": 2, "d4": 4, "e1": 1}  # created in this order, each at its S
KEYS = [None, b"a", b"b", b"c", b"customer-42", b"order:1001"]
row = st.tuples(st.sampled_from(sorted(QUEUES)), st.sampled_from([1, 2]), st.sampled_from(KEYS))
batch = st.lists(row, min_size=1, max_size=5)


@pytest.fixture
def crossed(db):
    _fast_deadlock_detection(db)
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        for q, s in QUEUES.items():
            su.execute("select awa.set_enqueue_shards(%s, %s)", [q, s])
        lanes = [r[0] for r in su.execute(
            "select l.lane_id from awa.lanes l join awa.queue_meta m using (queue_id)"
            " where m.queue = any(%s) and l.priority <= 2 order by 1", [list(QUEUES)])]
    return db, producer, lanes


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=batch, second=batch, held=st.data())
@example(first=[("d1", 2, b"x"), ("d4", 2, b"customer-42")],
         second=[("d4", 2, b"customer-42"), ("d1", 2, None)], held=None)
def test_random_crossed_batches_never_deadlock(crossed, first, second, held):
    db, producer, lanes = crossed
    with db.connect() as admin, db.connect(autocommit=False) as hold:
        if held is None:  # the @example: hold d1's priority-2 lane, the one both need
            chosen = [r[0] for r in admin.execute(
                "select l.lane_id from awa.lanes l join awa.queue_meta m using (queue_id)"
                " where m.queue = 'd1' and l.priority = 2")]
        else:
            chosen = held.draw(st.lists(st.sampled_from(lanes), max_size=4, unique=True))
        for lane in sorted(chosen):
            hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lane])
        a, b = _cross(db, producer, admin, first, second, hold)
    assert a.error is None and b.error is None, (a.error, b.error)
    for call in (a, b):
        assert [(r[1], r[2]) for r in call.result] == [(q, p) for q, p, _ in call.rows]


def _lanes(conn, queue: str) -> list[int]:
    return [r[0] for r in conn.execute(
        "select l.lane_id from awa.lanes l join awa.queue_meta m using (queue_id)"
        " where m.queue = %s and l.priority = 2 order by l.shard", [queue])]


def test_a_call_waits_only_above_the_lanes_it_holds(db):
    """An unkeyed group whose lanes are all taken is served before a keyed
    group on a higher lane, so the call waits for it holding nothing, not
    for its sticky lane below the keyed one it took first."""
    _fast_deadlock_detection(db)
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('low', 2)")
        su.execute("select awa.set_enqueue_shards('high', 1)")
        low = _lanes(su, "low")
        [high] = _lanes(su, "high")
    assert low[0] < low[1] < high
    with db.connect() as admin, db.connect(autocommit=False) as hold:
        for lane in low:
            hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lane])
        call = Call(db, producer, [("high", 2, b"k"), ("low", 2, None)])
        call.start()
        wait_until(lambda: waits_for_a_lock(admin, call.pid), what="the call to wait")
        # It waits for a lane of 'low' before it takes 'high' (lane order):
        # holding 'high' while it waits would invert the order.
        held_by_call = admin.execute(
            "select objid::int from pg_locks where pid = %s and locktype = 'advisory'"
            " and classid = %s and granted", [call.pid, LANE_CLASS]).fetchall()
        waited = admin.execute(
            "select objid::int from pg_locks where pid = %s and not granted",
            [call.pid]).fetchone()[0]
        assert held_by_call == [] and waited in low
        hold.commit()
        call.join(timeout=30)
        assert not call.is_alive()
    assert call.error is None and len(call.result) == 2


UNKEYED = {
    "enqueue": "select enqueue_shard from awa.enqueue('memo', 'k')",
    "enqueue_batch": "select distinct enqueue_shard from awa.enqueue_batch("
                     "array['memo', 'memo'], array['k', 'k'])",
}


@pytest.mark.parametrize("call", list(UNKEYED))
def test_a_transaction_keeps_writing_to_the_lane_it_took_first(db, call):
    """The fast paths of awa.enqueue and awa.enqueue_batch take the sticky lane
    only while the transaction has no lane memo: once a keyed job or a busy
    sticky lane sent it to another lane, its later unkeyed jobs of that queue
    and priority go there too, even after the sticky lane is free again."""
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('memo', 4)")
        lanes = _lanes(su, "memo")
    unkeyed = UNKEYED[call]
    with db.connect(producer, autocommit=False) as conn, db.connect(autocommit=False) as hold:
        sticky = conn.execute("select pg_backend_pid() % 4").fetchone()[0]
        conn.commit()
        other = (sticky + 1) % 4
        keyed = conn.execute("select enqueue_shard from awa.enqueue('memo', 'k',"
                             " ordering_key => %s)", [key_for_shard(other, 4)]).fetchone()[0]
        after_keyed = conn.execute(unkeyed).fetchall()
        conn.rollback()
        assert (keyed, after_keyed) == (other, [(other,)])

        hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lanes[sticky]])
        first = conn.execute(unkeyed).fetchall()
        hold.commit()
        later = [conn.execute(unkeyed).fetchall() for _ in range(3)]
        conn.rollback()
        assert first != [(sticky,)] and later == [first] * 3

        # Without a memo the sticky lane is taken, and taken again.
        again = [conn.execute(unkeyed).fetchall() for _ in range(3)]
        conn.rollback()
        assert again == [[(sticky,)]] * 3


WAITING_FOR = """
    select objid::integer from pg_locks
     where pid = %s and not granted and locktype = 'advisory' and classid = %s
"""


@pytest.mark.parametrize("shards", [1, 3])
def test_an_unkeyed_call_with_every_lane_taken_waits_for_its_sticky_lane(db, shards):
    """awa.enqueue whose every lane is held waits for its sticky lane, not
    another (as awa._take_lane does), even once the others are free; then it
    writes there, counts the wait, and keeps to that lane in the transaction."""
    producer = db.login_role("awa_producer")
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('every', %s)", [shards])
        lanes = _lanes(su, "every")
    with (db.connect(producer, autocommit=False) as conn, db.connect() as admin,
          db.connect(autocommit=False) as on_sticky, db.connect(autocommit=False) as on_others):
        pid, sticky = conn.execute("select pg_backend_pid(), pg_backend_pid() %% %s",
                                   [shards]).fetchone()
        conn.commit()
        on_sticky.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, lanes[sticky]])
        on_others.execute("select count(pg_advisory_xact_lock(%s, l)) from unnest(%s::int[]) l",
                          [LANE_CLASS, [lane for i, lane in enumerate(lanes) if i != sticky]])
        done: dict = {}

        def enqueue():
            try:
                done["shards"] = [conn.execute(
                    "select enqueue_shard from awa.enqueue('every', 'k')").fetchone()[0]
                    for _ in range(2)]
                done["waited"] = conn.execute(
                    "select current_setting('awa.lane_lock_wait_us')::bigint").fetchone()[0]
                conn.commit()
            except psycopg.Error as err:
                done["error"] = err

        call = threading.Thread(target=enqueue, daemon=True)
        call.start()
        wait_until(lambda: waits_for_a_lock(admin, pid), what="the call to wait")
        on_others.commit()
        assert admin.execute(WAITING_FOR, [pid, LANE_CLASS]).fetchall() == [(lanes[sticky],)]
        on_sticky.commit()
        call.join(timeout=30)
        assert not call.is_alive() and "error" not in done, done
        assert done["shards"] == [sticky, sticky] and done["waited"] > 0


# -- COPY loads of several passes ------------------------------------------------------------

PASS = 10_000  # rows per pass of COPY's batch mover


def _load(rows: list[tuple[str, bytes | None, bool]]) -> Callable[[psycopg.Connection], object]:
    """A COPY load of (queue, ordering key, unique) rows, moved by
    awa.enqueue_copied(); a unique row gets a key of its own."""

    def work(conn: psycopg.Connection) -> object:
        with conn.cursor().copy("copy awa.copy_staging (queue, ordering_key, kind, unique_key)"
                                " from stdin") as cp:
            for n, (q, k, unique) in enumerate(rows):
                cp.write_row((q, k, "load", f"u{conn.info.backend_pid}-{n}" if unique else None))
        return conn.execute("select awa.enqueue_copied()").fetchone()[0]

    return work


@pytest.mark.parametrize("shape", ["partitions", "unkeyed", "unique keys"])
def test_copy_loads_of_several_passes_in_opposite_lane_orders_do_not_deadlock(db, shape):
    """Two loads of more than one pass (partitioned queues and unique keys go
    through COPY's batch mover, 10,000 rows a pass): A's first pass writes to
    a high lane, its second to a low one; B's passes the other way round. The
    high lane is partition 1's (partitions), or shard 1's of a queue at S = 2
    (unique keys); the low one partition 0's, shard 0's, or (unkeyed, A's
    second pass) a plain queue's created before. B waits behind a holder for
    the low lane, then A for it; the holder ends and B gets it. Taken a pass
    at a time, A held the high lane while it waited, B then waited for it:
    40P01. A load takes every lane of its passes, in lane order, before its
    first pass."""
    _fast_deadlock_detection(db)
    producer = db.login_role("awa_producer")
    keys = [f"k{i}".encode() for i in range(1000)]
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('lowq', 1)")
        if shape == "unique keys":
            su.execute("select awa.set_enqueue_shards('pair', 2)")
            low = ("pair", key_for_shard(0, 2), True)
            high = ("pair", key_for_shard(1, 2), True)
            low_lane, high_lane = _lanes(su, "pair")
        else:
            su.execute("select awa.set_queue_partitions('split', 2)")
            high = ("split", next(k for k in keys
                                  if routing.partition_for_ordering_key(k, 2) == 1), False)
            low = ("lowq", None, False) if shape == "unkeyed" else (
                "split", next(k for k in keys
                              if routing.partition_for_ordering_key(k, 2) == 0), False)
            [low_lane] = _lanes(su, low[0])
            [high_lane] = _lanes(su, "split__p1")
    assert low_lane < high_lane
    a_rows = [high] * PASS + [low] * 10
    b_rows = [low] * PASS + [high] * 10
    with db.connect() as admin, db.connect(autocommit=False) as hold:
        hold.execute("select pg_advisory_xact_lock(%s, %s)", [LANE_CLASS, low_lane])
        b = Work(db.connect(producer, autocommit=False), _load(b_rows))
        b.start()
        wait_until(lambda: waits_for_a_lock(admin, b.pid), what="B to wait for the low lane")
        a = Work(db.connect(producer, autocommit=False), _load(a_rows))
        a.start()
        wait_until(lambda: waits_for_a_lock(admin, a.pid), what="A to wait for the low lane")
        hold.commit()
        for call in (a, b):
            call.join(timeout=60)
            assert not call.is_alive()
            call.conn.close()
    assert a.error is None and b.error is None, (a.error, b.error)
    assert (a.result, b.result) == (PASS + 10, PASS + 10)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 2 * (PASS + 10)


def test_move_staged_does_not_deadlock_a_producer_over_two_staging_transactions(db, logins):
    """Two staging transactions left for awa.move_staged: the older one's rows
    for 'hi', the newer one's for 'lo', whose lane is below. A producer holds
    'lo''s lane, then enqueues to 'hi'. Moving both in one transaction, the
    mover held 'hi''s lane and waited for 'lo''s, the producer waited for
    'hi''s: 40P01. A call moves one staging transaction and commits; the
    producer waits for it, then the next call moves the other."""
    _fast_deadlock_detection(db)
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('lo', 1)")
        su.execute("select awa.set_enqueue_shards('hi', 1)")
        [lo], [hi] = _lanes(su, "lo"), _lanes(su, "hi")
        assert lo < hi
        # No commit-time move: its trigger fires in every replication role.
        su.execute("alter table awa.copy_staging disable trigger copy_staging_note")
        for queue in ("hi", "lo"):
            su.execute("insert into awa.copy_staging (queue, kind)"
                       " select %s, 'left' from generate_series(1, 3)", [queue])
            su.commit()
    with (db.connect(logins.producer, autocommit=False) as producer, db.connect() as admin):
        producer.execute("select awa.enqueue('lo', 'k')")
        mover = Work(db.connect(logins.maintenance, autocommit=False),
                     lambda c: c.execute("select awa.move_staged()").fetchone()[0])
        mover.start()
        wait_until(lambda: not mover.is_alive() or waits_for_a_lock(admin, mover.pid),
                   what="the mover to finish or wait")
        producer.execute("select awa.enqueue('hi', 'k')")
        producer.commit()
        mover.join(timeout=30)
        assert not mover.is_alive()
        mover.conn.close()
    assert mover.error is None and mover.result == 3
    with db.connect(logins.maintenance) as m:
        assert [m.execute("select awa.move_staged()").fetchone()[0] for _ in range(2)] == [3, 0]
    with db.connect() as admin:
        assert admin.execute(
            "select m.queue, count(*) from awa.ready r join awa.queue_meta m using (queue_id)"
            " group by 1 order by 1").fetchall() == [("hi", 4), ("lo", 4)]
