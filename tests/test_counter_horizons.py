"""The counters and identifiers awa keeps, at the far end of their range, on
real PostgreSQL 17 and 18 (docs/operations.md, "Counters and their
horizons"): every operation that uses one still works with it near its
limit, and one that runs out fails with a clear error and leaves nothing
behind.

The ends are reached as the superuser moves a sequence (or sets a column):
the values ten years of a busy installation, or far more, would have left.
"""

from __future__ import annotations

import os
import shutil

import psycopg
import pytest

from awa_sql import migrate, shards
from awa_sql.demo import embedded
from awa_sql.roles import Roles
from tests.support import pgtools, scratch
from tests.support.cluster import ensure_binaries
from tests.support.jobs import COPY_SQL, claim, enqueue

INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1
LANE_IDS = "awa.lanes_lane_id_seq"
QUEUE_IDS = "awa.queue_meta_queue_id_seq"


def next_value(su, seq: str, value: int) -> None:
    """The next value `seq` hands out is `value`."""
    su.execute("select setval(%s, %s, false)", [seq, value])


def refused(conn, query: str, params=None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(query, params)
    return err.value


@pytest.fixture
def su(db):
    with db.connect() as conn:
        yield conn


def exercise(db, logins, queue: str) -> None:
    """Every operation on a queue's jobs once: enqueue (one, keyed, for later,
    unique, a batch, COPY), claim, complete, fail and retry, rescue, the job
    tools, the maintenance passes and a drop; asserting each did its work."""
    with db.connect(logins.producer) as p:
        enqueue(p, queue)
        enqueue(p, queue, ordering_key=b"k1")
        enqueue(p, queue, unique_key=b"u1")
        p.execute("select awa.enqueue_batch(array_fill(%s::text, array[5]),"
                  " array_fill('b'::text, array[5]))", [queue])
        with p.cursor().copy(COPY_SQL) as cp:
            for i in range(3):
                cp.write_row([queue, 2, f"c{i}".encode(), "copied", "{}", None, 25])
    with db.connect(logins.worker) as w:
        jobs = claim(w, [queue], 100)
        assert len(jobs) == 11
        (j1, l1, *_), (j2, l2, *_), (j3, l3, *_), *rest = jobs
        assert w.execute("select awa.complete(%s, %s)", [j1, l1]).fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, 'boom', now())", [j2, l2]).fetchone()[0]
        assert w.execute("select awa.heartbeat(%s, %s, '1 minute')", [j3, l3]).fetchone()[0]
        for job_id, lease, *_ in rest:
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    with db.connect() as admin:
        admin.execute("update awa.running set lease_expires_at = now() - interval '1 s'"
                      " where job_id = %s", [j3])
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
        # The rescued job's retry is due after its backoff: due now.
        m.execute("select 1")
    with db.connect() as admin:
        admin.execute("update awa.scheduled set run_at = now() - interval '1 s'")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 2
        m.execute("select awa.sample_lane_contention()")
        m.execute("select awa.rotate_running()")
        m.execute("select awa.prune_finished()")
        m.execute("select awa.compact_lane_hints()")
        m.execute("select awa.retire_lanes()")
    with db.connect(logins.operator) as op:
        assert op.execute("select state from awa.job(%s)", [j1]).fetchone()[0] == "completed"
        assert op.execute("select state from awa.job(%s)", [j2]).fetchone()[0] == "ready"
        assert op.execute("select awa.cancel_job(%s)", [j2]).fetchone()[0]
        assert op.execute("select awa.retry_job(%s)", [j2]).fetchone()[0]
        found = op.execute("select count(*) from awa.jobs(%s)", [queue]).fetchone()[0]
        assert found == 11
    with db.connect(logins.worker) as w:
        again = claim(w, [queue], 100)
        assert sorted(j[0] for j in again) == sorted([j2, j3])
        for job_id, lease, *_ in again:
            assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    with db.connect(logins.reader) as r:
        counts = r.execute("select ready, running from awa.queue_counts(%s)",
                           [queue]).fetchone()
        assert counts == (0, 0)


def test_lane_ids_at_the_top_of_int4(db, logins, su):
    next_value(su, LANE_IDS, INT4_MAX - 19)
    with db.connect(logins.operator) as op:
        rows = op.execute("select * from awa.set_enqueue_shards('top', 4)").fetchall()
        assert rows == [("top", 1, 4, 16)]
    lanes = su.execute("select min(lane_id), max(lane_id) from awa.lanes l"
                       " join awa.queue_meta m using (queue_id) where m.queue = 'top'"
                       ).fetchone()
    assert lanes == (INT4_MAX - 19, INT4_MAX - 4)
    exercise(db, logins, "top")


def test_queue_ids_at_the_top_of_int4(db, logins, su):
    next_value(su, QUEUE_IDS, INT4_MAX)
    exercise(db, logins, "last")
    assert su.execute("select queue_id from awa.queue_meta where queue = 'last'"
                      ).fetchone()[0] == INT4_MAX


def test_job_ids_leases_and_lane_positions_past_int4_and_2_53(db, logins, su):
    big = 2**62
    next_value(su, "awa.job_id_seq", big)
    next_value(su, "awa.run_lease_seq", big)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('wide', 2)")
    for (seq,) in su.execute("select seq::text from awa.lanes").fetchall():
        next_value(su, seq, big)
    exercise(db, logins, "wide")


def tick(m) -> tuple:
    """One tick of the auto-scaler: its one decision's id, action, reason code
    and repeats."""
    return m.execute("select decision_id, action, reason_code, repeats"
                     " from awa.autoscale_tick()").fetchone()


def test_a_hold_repeated_int4_times_starts_a_new_row(db, logins, su):
    """A held decision folds its repeats into one row (ADR 008): a queue held
    for long enough filled the int4 count, and every tick after, for every
    queue, failed on it (22003). The full row stays; the next hold starts
    one of its own."""
    with db.connect(logins.producer) as p:
        enqueue(p, "calm")
    with db.connect(logins.operator) as op:
        shards.set_shard_mode(op, "calm", "auto", 4)
        op.execute("select awa.set_autoscale_policy('calm', cooldown => interval '0',"
                   " min_samples => 1)")
    with db.connect(logins.maintenance) as m:
        first = tick(m)
        su.execute("update awa.autoscale_decisions set repeats = %s - 1", [INT4_MAX])
        assert tick(m) == (*first[:3], INT4_MAX)
        again = tick(m)
        assert tick(m) == (*again[:3], 2)
    assert first[1] == "held" and again[1:] == (*first[1:3], 1)
    rows = su.execute("select decision_id, repeats from awa.autoscale_decisions"
                      " order by decision_id").fetchall()
    assert rows == [(first[0], INT4_MAX), (again[0], 2)]


def ids_used(su) -> tuple:
    """How far the lane id and queue id sequences have gone, and how many
    sequences exist."""
    return su.execute(
        "select pg_sequence_last_value(%s), pg_sequence_last_value(%s),"
        " (select count(*) from pg_class where relkind = 'S')",
        [LANE_IDS, QUEUE_IDS]).fetchone()


@pytest.mark.parametrize("unique", [
    "unique_key => 'k'::bytea, unique_window => interval '-1 s'",
    "unique_key => ''::bytea",
    "unique_window => interval '1 hour'",
])
def test_an_enqueue_refused_for_its_unique_key_uses_up_no_ids(db, logins, su, unique):
    """Lane and queue ids are never given back, and a rolled-back creation of
    a queue uses up its four lane ids. An enqueue to a new name created the
    queue before it checked its unique key: a producer retrying such a call
    used up four lane ids a try (at 100 tries a second, all of them in 62
    days). It is refused first now."""
    before = ids_used(su)
    with db.connect(logins.producer) as p:
        assert refused(p, f"select awa.enqueue('fresh', 'k', {unique})").sqlstate == "22023"
    assert ids_used(su) == before


def test_lane_ids_run_out_with_a_clear_error_and_nothing_made(db, logins, su):
    """The last lane ids: a raise of S, a partition or a new queue that needs
    more lanes than there are ids left is refused before it makes any
    (2200H, naming what it needs and what is left); what fits still goes."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('full', 2)")
    next_value(su, LANE_IDS, INT4_MAX - 5)  # six left

    def used_up(conn, call: str, needs: int, left: int) -> None:
        err = refused(conn, call)
        assert (err.sqlstate, err.diag.message_primary) == (
            "2200H", f"lane ids used up: {needs} more lanes needed, {left} of the lane ids"
                     f" up to {INT4_MAX} left")
        assert "never given back" in err.diag.message_hint

    with db.connect(logins.operator) as op, db.connect(logins.producer) as p:
        before = ids_used(su)
        used_up(op, "select awa.set_enqueue_shards('full', 4)", 8, 6)
        used_up(op, "select awa.set_queue_partitions('full', 3)", 8, 6)  # the first one's
        # No lane id taken, no sequence made (a partition's row took its
        # queue id before: queue ids outlast lane ids four times over).
        assert ids_used(su)[0::2] == before[0::2]
        enqueue(p, "new")  # four fit
        used_up(p, "select awa.enqueue_batch(array['other'], array['k'])", 4, 2)
        used_up(p, "select awa.enqueue('other', 'k')", 4, 2)
    assert su.execute("select count(*), max(lane_id) from awa.lanes").fetchone() == (
        12, INT4_MAX - 2)
    assert su.execute("select count(*) from awa.queue_meta").fetchone()[0] == 2


def test_queue_ids_run_out_with_the_sequences_error(db, logins, su):
    """Every queue takes four lane ids or more and one queue id: lane ids
    run out first. Past the last queue id, the identity's own error."""
    next_value(su, QUEUE_IDS, INT4_MAX)
    with db.connect(logins.producer) as p:
        enqueue(p, "last")
        before = ids_used(su)
        err = refused(p, "select awa.enqueue('another', 'k')")
    assert (err.sqlstate, err.diag.message_primary) == (
        "2200H", 'nextval: reached maximum value of sequence "queue_meta_queue_id_seq"'
                 f" ({INT4_MAX})")
    assert ids_used(su) == before
    assert su.execute("select queues from awa.queue_limit").fetchone()[0] == 1


class OwnServer:
    """A PostgreSQL 18 server of a test's own, database wrap migrated, whose
    transaction ids can be moved (reset): every row frozen, then
    pg_resetwal sets the next id and its epoch."""

    def __init__(self, workdir, tools):
        self.tools = tools
        self.server = embedded.LocalServer(ensure_binaries(18), workdir / "pg18",
                                           settings={"autovacuum": "off", "fsync": "off"})
        self.server.start()
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute("create database wrap")
        with self.connect() as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)

    def connect(self, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(self.server.dsn(dbname="wrap"), autocommit=autocommit)

    def reset(self, epoch: int, xid: int) -> None:
        for dbname in ("wrap", "postgres", "template1"):
            with psycopg.connect(self.server.dsn(dbname=dbname), autocommit=True) as conn:
                conn.execute("vacuum freeze")
        with psycopg.connect(self.server.dsn(), autocommit=True) as conn:
            conn.execute("checkpoint")
        self.server.stop()
        # The commit log's segment of the new id (2^20 ids a file), zeroed
        # when no transaction reached it yet.
        segment = self.server.data_dir / "pg_xact" / f"{xid >> 20:04X}"
        if not segment.exists():
            segment.write_bytes(bytes(2**20 // 4))  # two status bits an id
            if user := embedded.server_os_user():
                os.chown(segment, user.pw_uid, user.pw_gid)
            segment.chmod(0o600)
        self.server._run(str(self.tools / "pg_resetwal"), "--epoch", str(epoch),
                         "--next-transaction-id", str(xid), str(self.server.data_dir))
        self.server.start()


@pytest.fixture
def own_server():
    tools = pgtools.client_bin(18, ("pg_resetwal",))
    if pgtools._major(tools, "pg_resetwal") != 18:
        pytest.skip("needs PostgreSQL 18's pg_resetwal for the suite's 18 server")
    workdir = scratch.mkdtemp("awa-sql-xids-")
    own = None
    try:
        own = OwnServer(workdir, tools)
        yield own
    finally:
        if own is not None:
            own.server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_lanes_made_2_32_transactions_before_are_not_counted_as_made_now(own_server):
    """A change of S counts the lanes its transaction made by their xmin, a
    32-bit id: at 10,000 jobs a second the ids go round every 40 hours or
    so, and a frozen row keeps its raw xmin. A queue's lanes made 2^32
    transactions before counted as made by the change. The next id is set
    back to the one that made the lanes, in the next epoch."""
    with own_server.connect() as conn:
        for i in range(20):  # one transaction each
            conn.execute("select awa.set_enqueue_shards(%s, 1)", [f"q{i}"])
        made = dict(conn.execute(
            "select distinct l.xmin::text::bigint, m.queue from awa.lanes as l"
            " join awa.queue_meta as m using (queue_id)").fetchall())
    assert len(made) == 20
    own_server.reset(1, min(made))
    with own_server.connect(autocommit=False) as conn:
        xid = conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]
        assert xid >> 32 == 1 and xid % 2**32 in made
        queue = made[xid % 2**32]
        assert conn.execute("select lanes_created from awa.set_enqueue_shards(%s, 2)",
                            [queue]).fetchone()[0] == 4
        conn.commit()
        assert conn.execute("select lanes_created from awa.shard_changes"
                            " where queue = %s", [queue]).fetchone()[0] == 4


def test_a_snapshot_from_before_the_ids_went_round_is_widened_to_its_epoch(own_server):
    """awa._oldest_snapshot widens another session's 32-bit backend_xmin to an
    xid8 by its distance from the next id (awa.retire_lanes and
    awa.finish_drops compare it with a change's or a drop's xid8): a
    snapshot taken just before the 32-bit ids went round is the epoch
    before the next id's, and a change made after it is not before it."""
    own_server.reset(0, 2**32 - 8)
    with own_server.connect(autocommit=False) as holder, own_server.connect() as other:
        holder.execute("set transaction isolation level repeatable read")
        held = holder.execute(
            "select pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()[0]
        for _ in range(12):
            other.execute("select pg_current_xact_id()")  # a transaction each
        after = other.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]
        assert held < 2**32 < after
        assert other.execute("select awa._oldest_snapshot()::text::bigint"
                             ).fetchone()[0] == held
        assert other.execute("select awa._before_every_snapshot(%s::text::xid8,"
                             " awa._oldest_snapshot())", [after]).fetchone()[0] is False
        holder.rollback()
        assert other.execute("select awa._oldest_snapshot()").fetchone()[0] is None
