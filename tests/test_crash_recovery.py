"""Crash recovery, on real PostgreSQL 17 and 18: a server of the module's own
(tests/support/crash.py) is stopped in immediate mode, or loses one backend
to SIGKILL in the middle of a maintenance step (the postmaster then ends
every backend and recovers). After the restart: every enqueue whose commit
the client saw is there exactly once and nothing uncommitted is; every
complete and fail that committed stayed; a job that was running is rescued
when its lease runs out and completes once; the claim hints (unlogged) are
gone and the sequences may have jumped, and claims still take each lane in
order, skipping nothing; the next pass of the interrupted step finishes it;
`awa status --check` is clean; the Python Worker and Producer carry on by
themselves."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg.types.json import Jsonb

import awa_sql
from awa_sql import maintain
from awa_sql.worker import Worker
from tests.support.crash import CrashServer, Hold, Step, crash_server, drop_holds
from tests.support.dead_rows import NO_LANE, junk, junk_scheduled
from tests.support.finished import carried_on_time
from tests.support.jobs import COPY_SQL
from tests.support.waiting import wait_until

ROLES = ("awa_producer", "awa_worker", "awa_maintenance", "awa_operator")


@pytest.fixture(scope="module", params=[
    pytest.param(17, marks=pytest.mark.pg17, id="pg17"),
    pytest.param(18, marks=pytest.mark.pg18, id="pg18"),
])
def server(request) -> Iterator[CrashServer]:
    with crash_server(request.param) as s:
        yield s


class Db:
    """One database of the crash server, and a login per runtime role."""

    def __init__(self, server: CrashServer):
        self.server = server
        self.name = server.new_database()
        self.login = dict(zip(ROLES, (server.login(r) for r in ROLES), strict=True))

    def dsn(self, role: str | None = None) -> str:
        return self.server.dsn(self.name, self.login[role] if role else None)

    def connect(self, role: str | None = None, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(self.dsn(role), autocommit=autocommit)


@pytest.fixture
def db(server) -> Db:
    return Db(server)


# -- reading the state -----------------------------------------------------------------

WHERE = """
    select job_id, 'ready' as state, attempt from awa.ready
    union all select job_id, 'scheduled', attempt from awa.scheduled
    union all select job_id, 'running', attempt from awa.running
    union all select job_id, state, attempt from awa.finished
"""


def places(conn: psycopg.Connection) -> dict[int, list[tuple[str, int]]]:
    """Every job's rows, by job id: one each, unless something went wrong."""
    out: dict[int, list[tuple[str, int]]] = {}
    for job_id, state, attempt in conn.execute(WHERE).fetchall():
        out.setdefault(job_id, []).append((state, attempt))
    return out


def copied_ids(conn: psycopg.Connection, tag: str) -> list[int]:
    return [r[0] for r in conn.execute(
        "select job_id from awa.ready where args->>'tag' = %s order by (args->>'i')::int",
        [tag]).fetchall()]


def copy_jobs(conn: psycopg.Connection, queue: str, tag: str, n: int) -> None:
    with conn.cursor().copy(COPY_SQL) as cp:
        for i in range(n):
            cp.write_row((queue, None, None, "job", Jsonb({"tag": tag, "i": i}), None, None))


def claim(conn: psycopg.Connection, queue: str, n: int, lease: str = "5 minutes") -> list:
    return conn.execute(
        "select job_id, run_lease, attempt, lane_seq from awa.claim(%s::text[], %s, 'w',"
        " %s::interval)", [[queue], n, lease]).fetchall()


def awa_status_check(db: Db) -> tuple[int, str]:
    """`awa status --check` as the superuser: its exit code and output."""
    env = {**os.environ, "AWA_DATABASE_URL": db.dsn()}
    env.pop("DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "awa_sql", "status", "--check"], env=env,
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout + done.stderr


# -- an immediate stop with every kind of work in flight ---------------------------------


def test_an_immediate_stop_keeps_every_commit_and_nothing_else_and_the_lanes_go_on(db):
    """Producers (single, batch, COPY), workers (claim, complete, fail with a
    retry, heartbeat) and an open transaction of each kind at the crash."""
    p = db.connect("awa_producer", autocommit=False)
    w = db.connect("awa_worker")
    op = db.connect("awa_operator")
    acked: list[int] = []  # in enqueue order: one lane (S = 1, one priority)
    for i in range(150):
        acked.append(p.execute("select job_id from awa.enqueue('fifo', 'job', %s)",
                               [Jsonb({"i": i})]).fetchone()[0])
        p.commit()
    acked += [r[0] for r in p.execute(
        "select job_id from awa.enqueue_batch(array_fill('fifo'::text, array[100]),"
        " array_fill('job'::text, array[100]))").fetchall()]
    p.commit()
    copy_jobs(p, "fifo", "copied", 100)
    p.commit()
    with db.connect() as su:
        acked += copied_ids(su, "copied")
    assert len(acked) == 350

    # Workers: 120 claimed in small claims (the lane's hint moves), 100 of
    # them completed, 10 failed with a retry due at once, 10 left running:
    # 5 heartbeated for long, 5 with a lease of 2 s.
    taken = []
    while len(taken) < 120:
        taken += claim(w, "fifo", min(7, 120 - len(taken)))
    assert [t[0] for t in taken] == acked[:120]
    for job_id, lease, *_ in taken[:100]:
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    for job_id, lease, *_ in taken[100:110]:
        assert w.execute("select awa.fail(%s, %s, 'again', retry_at => now())",
                         [job_id, lease]).fetchone()[0]
    for job_id, lease, *_ in taken[110:115]:
        assert w.execute("select awa.heartbeat(%s, %s, interval '1 hour')",
                         [job_id, lease]).fetchone()[0]
    for job_id, lease, *_ in taken[115:120]:
        assert w.execute("select awa.heartbeat(%s, %s, interval '2 seconds')",
                         [job_id, lease]).fetchone()[0]

    # In flight at the crash, none committed: an enqueue, a COPY, a claim,
    # a complete.
    with db.connect() as su:
        before = su.execute(
            "select (select count(*) from awa.lane_hints),"
            " (select max(lane_seq) from awa.ready),"
            " (select completed from awa.queue_overview where queue = 'fifo')").fetchone()
    assert before[0] > 0, "the claims left a hint to lose"
    open_enqueue = db.connect("awa_producer", autocommit=False)
    open_enqueue.execute("select awa.enqueue('fifo', 'lost')")
    open_copy = db.connect("awa_producer", autocommit=False)
    copy_jobs(open_copy, "fifo", "lost", 50)
    open_claim = db.connect("awa_worker", autocommit=False)
    assert claim(open_claim, "fifo", 3)
    open_complete = db.connect("awa_worker", autocommit=False)
    job_id, lease, *_ = taken[110]
    assert open_complete.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]

    db.server.stop_immediately_and_start()
    for conn in (p, w, op, open_enqueue, open_copy, open_claim, open_complete):
        conn.close()

    with db.connect() as su:
        where = places(su)
        assert sorted(where) == sorted(acked), "exactly the acknowledged jobs"
        assert all(len(rows) == 1 for rows in where.values()), "each job once"
        assert {where[j][0] for j, *_ in taken[:100]} == {("completed", 1)}
        assert {where[j][0] for j, *_ in taken[100:110]} == {("scheduled", 1)}
        assert {where[j][0] for j, *_ in taken[110:120]} == {("running", 1)}
        assert copied_ids(su, "lost") == []
        assert su.execute("select count(*) from awa.lane_hints").fetchone()[0] == 0
        assert su.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0
        completed = su.execute(
            "select completed from awa.queue_overview where queue = 'fifo'").fetchone()[0]
        assert completed >= 100

    # The lane goes on after the jump of its sequence: new jobs come after
    # the old, and a claim takes them all in order from the lane's start.
    p = db.connect("awa_producer")
    later = [p.execute("select job_id, lane_seq from awa.enqueue('fifo', 'job')").fetchone()
             for _ in range(30)]
    assert later[0][1] > before[1]
    w = db.connect("awa_worker")
    order = []
    while batch := claim(w, "fifo", 9):
        order += [j for j, *_ in batch]
        w.execute("select count(awa.complete(j, l)) from unnest(%s::bigint[], %s::bigint[])"
                  " as x(j, l)", [[b[0] for b in batch], [b[1] for b in batch]])
    assert order == acked[120:] + [j for j, _ in later]
    gap = later[0][1] - before[1]

    # The runs of before the crash: the heartbeated ones complete; the
    # others are rescued once their lease runs out, and complete once; the
    # failed ones come back for their retry.
    for job_id, lease, *_ in taken[110:115]:
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    m, su = db.connect("awa_maintenance"), db.connect()
    wait_until(lambda: su.execute("select count(*) from awa.running where lease_expires_at < now()"
                                  ).fetchone()[0] == 5, 30, "the short leases to run out")
    assert m.execute("select awa.rescue_expired()").fetchone()[0] == 5
    wait_until(lambda: m.execute("select awa.promote_due()").fetchone()[0] > 0 and
               su.execute("select count(*) from awa.scheduled").fetchone()[0] == 0, 30,
               "the retries to come due")
    again = []
    while batch := claim(w, "fifo", 9):
        again += batch
    for job_id, lease, attempt, _ in again:
        assert attempt == 2
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    with db.connect() as su:
        where = places(su)
        assert all(rows == [("completed", 1)] or rows == [("completed", 2)]
                   for rows in where.values()), where
        assert len(where) == len(acked) + len(later)
    assert gap >= 1
    code, out = awa_status_check(db)
    assert code == 0, out


def test_keyed_lanes_keep_each_keys_order_across_an_immediate_stop(db):
    """S = 4, eight ordering keys over its lanes, the lanes' hints moved by
    claims before the crash: after it, every key's jobs, old and new, are
    claimed in the order they were enqueued, none skipped, none twice."""
    with db.connect("awa_operator") as op:
        op.execute("select awa.set_enqueue_shards('keyed', 4)")
    p, w = db.connect("awa_producer"), db.connect("awa_worker")
    order: dict[bytes, list[int]] = {}

    def enqueue_some(n: int) -> None:
        for i in range(n):
            key = f"k{i % 8}".encode()
            job_id = p.execute("select job_id from awa.enqueue('keyed', 'job',"
                               " ordering_key => %s)", [key]).fetchone()[0]
            order.setdefault(key, []).append(job_id)
        keys = [f"k{i % 8}".encode() for i in range(n)]
        for key, job_id in zip(keys, [r[0] for r in p.execute(
                "select job_id from awa.enqueue_batch(array_fill('keyed'::text, array[%s]),"
                " array_fill('job'::text, array[%s]), ordering_keys => %s)",
                [n, n, keys]).fetchall()], strict=True):
            order[key].append(job_id)

    enqueue_some(200)  # 100 a lane
    taken = []
    while len(taken) < 320:  # 80 a lane: their hints move
        batch = claim(w, "keyed", 8)
        complete_all(w, batch)
        taken += [j for j, *_ in batch]
    with db.connect() as su:
        assert su.execute("select count(*) from awa.lane_hints").fetchone()[0] > 0
    db.server.stop_immediately_and_start()
    p, w = db.connect("awa_producer"), db.connect("awa_worker")
    enqueue_some(40)
    while batch := claim(w, "keyed", 7):
        complete_all(w, batch)
        taken += [j for j, *_ in batch]
    assert sorted(taken) == sorted(j for ids in order.values() for j in ids)
    position = {j: i for i, j in enumerate(taken)}
    for ids in order.values():
        assert sorted(ids, key=position.get) == ids


# -- SIGKILL of a backend in the middle of a maintenance step -----------------------------


def run_pass(conn: psycopg.Connection, name: str) -> int:
    """One pass of `awa maintain`'s task ``name``, as its loop makes it: the
    prologue, the pass lock, the call, in one transaction."""
    task = next(t for t in maintain.TASKS if t.name == name)
    with conn.transaction():
        conn.execute(maintain.PROLOGUE, ["10s", "60s", task.function, maintain.LOCK_FUNCTION])
        assert conn.execute(maintain.TAKE_LOCK, [name]).fetchone()[0]
        return task.call(conn)[0]


def complete_all(w: psycopg.Connection, jobs: list) -> None:
    for job_id, lease, *_ in jobs:
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]


def backlog(db: Db, queue: str, n: int) -> None:
    with db.connect("awa_producer") as p:
        p.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                  " array_fill('job'::text, array[%s]))", [queue, n, n])


class Scenario:
    """A step with work to do, the table and event its hold goes on, and
    what the test checks once the crash has undone it and once the next
    pass has done it."""

    task: str
    table: str
    event: str

    def __init__(self, db: Db):
        self.db = db

    def prepare(self) -> None: ...

    def undone(self, su: psycopg.Connection) -> None: ...

    def done(self, su: psycopg.Connection, handled: int) -> None: ...


def ready_rows(su: psycopg.Connection) -> list:
    return su.execute("select lane_id, lane_seq, job_id, attempt from awa.ready"
                      " where lane_id <> %s order by lane_id, lane_seq",
                      [NO_LANE]).fetchall()


class ReadyRewrite(Scenario):
    """awa.compact_ready, held right after its TRUNCATE of awa.ready: the
    live rows are then only in the unlogged awa.ready_rewrite."""

    task, table, event = "ready_rewrite", "awa.ready", "truncate"

    def prepare(self) -> None:
        backlog(self.db, "rw", 300)
        with self.db.connect("awa_worker") as w:
            complete_all(w, claim(w, "rw", 100))
        self.snapshot = self.db.connect(autocommit=False)  # no vacuum of the dead rows
        self.snapshot.execute("set transaction isolation level repeatable read")
        self.snapshot.execute("select 1")
        with self.db.connect() as su:
            junk(su, 210_000)
            self.rows = ready_rows(su)

    def undone(self, su: psycopg.Connection) -> None:
        assert ready_rows(su) == self.rows
        assert su.execute("select count(*) from awa.ready_rewrite").fetchone()[0] == 0
        # The statistics went with the crash: the dead rows are vacuum's
        # again (no snapshot survives a crash); a new held snapshot counts
        # them from 0 and a rewrite comes after as many again.
        assert not su.execute("select awa._ready_compaction_due()").fetchone()[0]
        self.snapshot = self.db.connect(autocommit=False)
        self.snapshot.execute("set transaction isolation level repeatable read")
        self.snapshot.execute("select 1")
        junk(su, 210_000)

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        assert ready_rows(su) == self.rows


def scheduled_rows(su: psycopg.Connection) -> list:
    return su.execute("select job_id, run_at, attempt, args from awa.scheduled"
                      " where job_id > 0 order by job_id").fetchall()


class ScheduledRewrite(Scenario):
    """awa.compact_scheduled, held right after its TRUNCATE of awa.scheduled:
    the jobs for later are then only in the unlogged awa.scheduled_rewrite."""

    task, table, event = "scheduled_rewrite", "awa.scheduled", "truncate"

    def hold_snapshot(self) -> None:
        self.snapshot = self.db.connect(autocommit=False)  # no vacuum of the dead rows
        self.snapshot.execute("set transaction isolation level repeatable read")
        self.snapshot.execute("select 1")

    def prepare(self) -> None:
        with self.db.connect("awa_producer") as p:
            p.execute("select awa.enqueue_batch(array_fill('sr'::text, array[300]),"
                      " array_fill('job'::text, array[300]),"
                      " run_ats => array_fill(now() + interval '1 day', array[300]))")
        self.hold_snapshot()
        with self.db.connect() as su:
            junk_scheduled(su, 210_000)
            self.rows = scheduled_rows(su)

    def undone(self, su: psycopg.Connection) -> None:
        assert len(self.rows) == 300 and scheduled_rows(su) == self.rows
        assert su.execute("select count(*) from awa.scheduled_rewrite").fetchone()[0] == 0
        # As for awa.ready: the statistics went with the crash.
        assert not su.execute("select awa._scheduled_compaction_due()").fetchone()[0]
        self.hold_snapshot()
        junk_scheduled(su, 210_000)

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        assert scheduled_rows(su) == self.rows


class LaneHints(Scenario):
    """awa.compact_lane_hints, held right after its TRUNCATE of awa.lane_hints."""

    task, table, event = "lane_hints", "awa.lane_hints", "truncate"

    def prepare(self) -> None:
        backlog(self.db, "lh", 200)
        with self.db.connect("awa_worker") as w:
            for _ in range(10):
                complete_all(w, claim(w, "lh", 10))
        with self.db.connect() as su:
            # Stale hints below each lane's highest, as a held snapshot leaves them.
            su.execute("insert into awa.lane_hints select lane_id, 0 from awa.lanes,"
                       " generate_series(1, 5000)")

    def undone(self, su: psycopg.Connection) -> None:
        assert su.execute("select count(*) from awa.lane_hints").fetchone()[0] == 0

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 0  # nothing left to compact: the crash emptied it
        with self.db.connect("awa_worker") as w:
            taken = []
            while batch := claim(w, "lh", 30):
                taken += batch
                complete_all(w, batch)
        assert [t[3] for t in taken] == list(range(101, 201))


class RunningSlots(Scenario):
    """awa.rotate_running, held right after its TRUNCATE of the idle slot,
    whose runs it moved to slot 2 in the same transaction."""

    task, table, event = "running_slots", "awa.running_1", "truncate"

    def prepare(self) -> None:
        backlog(self.db, "rs", 5)
        with self.db.connect() as su:
            su.execute("select setval('awa.run_lease_seq', 65536 + 10)")  # block 1: slot 1
            with self.db.connect("awa_worker") as w:
                self.runs = claim(w, "rs", 5)
            su.execute("select setval('awa.run_lease_seq', 2 * 65536 + 40000)")  # half of 2

    def slots(self, su: psycopg.Connection) -> list[int]:
        return [r[0] for r in su.execute(
            "select slot from awa.running order by job_id").fetchall()]

    def undone(self, su: psycopg.Connection) -> None:
        assert self.slots(su) == [1] * 5

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        assert self.slots(su) == [2] * 5
        with self.db.connect("awa_worker") as w:
            complete_all(w, self.runs)


class Prune(Scenario):
    """awa.prune_finished, held right after its TRUNCATE of a slot past
    retention."""

    task, event = "prune", "truncate"

    def prepare(self) -> None:
        backlog(self.db, "pr", 3)
        with self.db.connect("awa_worker") as w:
            complete_all(w, claim(w, "pr", 3))
        with self.db.connect() as su:
            slot = su.execute("select awa._finished_slot('completed', now() - interval '26 hours')"
                              ).fetchone()[0]
            su.execute("update awa.finished set finished_at = now() - interval '26 hours',"
                       " slot = %s", [slot])
            self.table = su.execute("select awa._finished_part(%s)", [slot]).fetchone()[0]

    def undone(self, su: psycopg.Connection) -> None:
        assert su.execute("select count(*) from awa.finished").fetchone()[0] == 3

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 3
        assert su.execute("select count(*) from awa.finished").fetchone()[0] == 0


class Carry(Scenario):
    """awa.carry_finished, held right after it recorded how far its batches
    got (awa.finished_carry), the rows moved to the slot they go with."""

    task, table, event = "carry", "awa.finished_carry", "insert"

    def prepare(self) -> None:
        backlog(self.db, "ca", 3)
        with self.db.connect("awa_worker") as w:
            complete_all(w, claim(w, "ca", 3))
        with self.db.connect("awa_operator") as op:
            op.execute("select awa.set_retention('ca', interval '48 hours', null)")
        with self.db.connect() as su:  # written 31 hours ago: the ring's next slot
            su.execute("update awa.finished set finished_at = now() - interval '31 hours',"
                       " slot = awa._finished_slot('completed', now() - interval '31 hours')")
            self.slot = self.slots(su)[0]

    def slots(self, su: psycopg.Connection) -> list[int]:
        return [r[0] for r in su.execute("select slot from awa.finished order by job_id")]

    def job_ids(self, su: psycopg.Connection) -> list[int]:
        return [r[0] for r in su.execute("select job_id from awa.finished")]

    def undone(self, su: psycopg.Connection) -> None:
        assert self.slots(su) == [self.slot] * 3
        assert su.execute("select count(*) from awa.finished_carry").fetchone()[0] == 0

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 3
        slots = self.slots(su)
        assert len(slots) == 3 and carried_on_time(su, self.job_ids(su), "completed")


class RetireLanes(Scenario):
    """awa.retire_lanes, held right after its update of the queue's lane_shards."""

    task, table, event = "retire_lanes", "awa.queue_meta", "update"

    def prepare(self) -> None:
        with self.db.connect("awa_operator") as op:
            op.execute("select awa.set_enqueue_shards('rl', 8)")
            op.execute("select awa.set_enqueue_shards('rl', 1)")

    def lane_shards(self, su: psycopg.Connection) -> int:
        return su.execute("select lane_shards from awa.queue_meta where queue = 'rl'"
                          ).fetchone()[0]

    def undone(self, su: psycopg.Connection) -> None:
        assert self.lane_shards(su) == 8

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        assert self.lane_shards(su) == 1


class Drops(Scenario):
    """awa.finish_drops, held right after it deleted the dropped queue's lanes."""

    task, table, event = "drops", "awa.lanes", "delete"

    def prepare(self) -> None:
        backlog(self.db, "gone", 2)
        with self.db.connect("awa_worker") as w:
            complete_all(w, claim(w, "gone", 2))
        with self.db.connect("awa_operator") as op:
            op.execute("select awa.drop_queue('gone', discard_finished => true)")
        with self.db.connect() as su:
            self.qid, self.seqs = su.execute(
                "select m.queue_id, array_agg(l.seq::text) from awa.queue_meta m"
                " join awa.lanes l using (queue_id) where m.dropped_name = 'gone'"
                " group by m.queue_id").fetchone()

    def undone(self, su: psycopg.Connection) -> None:
        assert su.execute("select queue from awa.queue_meta where queue_id = %s",
                          [self.qid]).fetchone() == (f"#dropped#{self.qid}",)
        assert su.execute("select count(*) from awa.lanes where queue_id = %s",
                          [self.qid]).fetchone()[0] == 4  # a lane per priority

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        assert su.execute("select count(*) from awa.queue_meta where queue_id = %s",
                          [self.qid]).fetchone()[0] == 0
        with self.db.connect("awa_maintenance") as m:
            run_pass(m, "drops")  # the sequences go once the removal has committed
        assert su.execute("select count(*) from unnest(%s::text[]) as s(name)"
                          " where to_regclass(s.name) is not null", [self.seqs]).fetchone()[0] == 0
        with self.db.connect("awa_producer") as p:  # the name is free
            p.execute("select awa.enqueue('gone', 'job')")


class Autoscale(Scenario):
    """The auto-scaler's tick raising S, held right after it made the new lanes."""

    task, table, event = "autoscale", "awa.lanes", "insert"

    def prepare(self) -> None:
        backlog(self.db, "as", 1)
        with self.db.connect("awa_operator") as op:
            op.execute("select awa.set_shard_mode('as', 'auto', 4)")
            op.execute("select awa.set_autoscale_policy('as', min_samples => 1,"
                       " cooldown => interval '0')")
        with self.db.connect() as su:  # lanes waited for, as contention leaves them sampled
            su.execute("insert into awa.contention_samples (sampled_at, queue_id, lanes,"
                       " lanes_held, lanes_waited, waiters, busiest_priority_held)"
                       " select now() - g * interval '1 second', queue_id, 1, 1, 1, 8, 1"
                       " from awa.queue_meta, generate_series(1, 20) g where queue = 'as'")

    def shards(self, su: psycopg.Connection) -> tuple:
        return su.execute("select m.enqueue_shards, count(l.*) from awa.queue_meta m"
                          " join awa.lanes l using (queue_id) where m.queue = 'as'"
                          " group by m.enqueue_shards").fetchone()

    def undone(self, su: psycopg.Connection) -> None:
        assert self.shards(su) == (1, 4)  # a lane per priority

    def done(self, su: psycopg.Connection, handled: int) -> None:
        assert handled == 1
        s, lanes = self.shards(su)
        assert s > 1 and lanes == 4 * s
        with self.db.connect("awa_producer") as p:
            p.execute("select awa.enqueue('as', 'job', ordering_key => %s)",
                      [b"k" * 3])


SCENARIOS = [ReadyRewrite, ScheduledRewrite, LaneHints, RunningSlots, Prune, Carry,
             RetireLanes, Drops, Autoscale]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.task for s in SCENARIOS])
def test_a_step_killed_in_its_middle_is_undone_and_the_next_pass_does_it(db, scenario):
    case = scenario(db)
    case.prepare()
    with db.connect() as su:
        hold = Hold(su, case.table, case.event)
    step = Step(db.dsn("awa_maintenance"), lambda conn: run_pass(conn, case.task))
    step.start()
    wait_until(lambda: hold.waiting(step.pid) or not step.is_alive(), 30,
               f"{case.task} to reach its hold")
    assert step.is_alive(), f"{case.task} ended before its hold: {step.error!r}"
    db.server.kill_backend(step.pid)
    step.join(30)
    assert isinstance(step.error, psycopg.OperationalError)
    hold.close()
    with db.connect() as su:
        drop_holds(su, case.table)
        case.undone(su)
        with db.connect("awa_maintenance") as m:
            handled = run_pass(m, case.task)
        case.done(su, handled)
    code, out = awa_status_check(db)
    assert code == 0, out


# -- the Python Worker and Producer across a crash ----------------------------------------


def test_the_worker_and_producer_carry_on_and_the_outcome_in_flight_is_recorded(db):
    """A Worker (with its maintenance loop) runs a job whose handler is in
    the middle of its work when the server crashes; the handler ends after
    the restart: its completion is recorded, under the lease it had, and the
    job ran once. The Producer's next calls, single, batch and COPY, go
    through on a new connection, and the Worker takes those jobs too."""
    login = db.server.login("awa_worker", "awa_maintenance")
    started, release = threading.Event(), threading.Event()
    runs: dict[int, int] = {}

    def handle(job) -> None:
        runs[job.job_id] = runs.get(job.job_id, 0) + 1
        if job.args.get("hold"):
            started.set()
            release.wait(60)

    worker = Worker(db.server.dsn(db.name, login), queues=["py"], handlers={"job": handle},
                    poll_interval=0.05, snapshot_every=0.2,
                    maintain={"promote": 0.2, "rescue": 0.2})
    runner = threading.Thread(target=worker.run)
    runner.start()
    producer = awa_sql.Producer(db.dsn("awa_producer"), snapshot_every=0.2)
    try:
        before = [producer.enqueue("job", {"i": i}, queue="py").job_id for i in range(20)]
        held = producer.enqueue("job", {"hold": True}, queue="py").job_id
        assert started.wait(30)
        db.server.stop_immediately_and_start()
        release.set()
        with db.connect() as su:
            wait_until(lambda: su.execute("select count(*) from awa.finished where job_id = %s",
                                          [held]).fetchone()[0] == 1, 60,
                       "the completion of the job in flight to be recorded")
        after = [producer.enqueue("job", {"i": i}, queue="py").job_id for i in range(10)]
        after += [e.job_id for e in producer.enqueue_many(
            [{"kind": "job", "args": {"i": i}} for i in range(10)], queue="py")]
        assert producer.enqueue_many_copy(
            [{"kind": "job", "args": {"copied": i}} for i in range(10)], queue="py") == 10
        with db.connect() as su:
            wait_until(lambda: su.execute("select count(*) from awa.finished").fetchone()[0]
                       == 51, 60, "every job to be completed")
            assert su.execute("select count(*) from awa.finished where state = 'completed'"
                              " and attempt = 1").fetchone()[0] == 51
            # Both published their snapshot again since the restart.
            wait_until(lambda: su.execute(
                "select count(*) from awa.runtimes where last_seen > pg_postmaster_start_time()"
            ).fetchone()[0] == 2, 30, "both runtimes to publish again")
    finally:
        release.set()
        producer.close()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert runs[held] == 1
    assert all(runs[j] == 1 for j in before + after)
    assert worker.completed == 51


IN_DOUBT = {
    "completion": ("completed", "its completion was sent as the connection was lost and was"
                   " recorded then (awa.run_outcome: completed); counted"),
    "failure": ("scheduled", "its failure was sent as the connection was lost; attempt 1 is"
                " recorded as failed (awa.run_outcome: failed; by that send, or by the rescue"
                " if the lease had run out meanwhile); counted"),
    # awa.run_outcome refused too: the doubt stays, as before it existed.
    "unreadable": ("completed", "its completion was sent as the connection was lost and may"
                   " have been recorded then (awa.run_outcome could not tell: permission denied"
                   " for function run_outcome): the run has ended since (or was cancelled or"
                   " rescued meanwhile); not counted"),
}


@pytest.mark.parametrize("case", sorted(IN_DOUBT))
def test_an_outcome_committed_as_the_server_crashed_is_known_to_be_recorded(db, caplog, case):
    """The commit of a completion (or failure) is in the WAL when the server
    crashes, but its answer never reaches the worker: its commit waits for a
    synchronous standby that never answers, as it would for a standby lost
    with the primary. After the restart the worker sends it again and
    awa.complete (awa.fail) answers false: the run is gone, it ended then.
    awa.run_outcome tells the worker that this attempt completed (failed):
    the worker says the outcome was recorded and counts it, once. If that
    read fails too, the worker says only that it may have been recorded."""
    caplog.set_level(logging.INFO, logger="awa_sql.worker")
    login = db.server.login("awa_worker")
    started, release = threading.Event(), threading.Event()
    state, message = IN_DOUBT[case]

    def handle(_job) -> None:
        started.set()
        release.wait(60)
        if case == "failure":
            raise ValueError("boom")

    with db.connect("awa_producer") as p:
        job_id = p.execute("select job_id from awa.enqueue('doubt', 'job')").fetchone()[0]
    if case == "unreadable":
        with db.connect() as su:
            su.execute("revoke execute on function awa.run_outcome(bigint, bigint, integer)"
                       " from awa_worker")
    worker = Worker(db.server.dsn(db.name, login), queues=["doubt"], handlers={"job": handle},
                    poll_interval=0.05, snapshot_every=None, lease=timedelta(seconds=60))
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert started.wait(30)
        with db.connect() as su:
            su.execute("alter system set synchronous_standby_names = 'never_answers'")
            su.execute("select pg_reload_conf()")
            # Commits wait for the standby once the checkpointer has read the
            # setting: a probe commits until its commit waits.
            probe = _Committer(db.dsn())
            probe.start()
            wait_until(lambda: su.execute("select wait_event from pg_stat_activity where pid = %s",
                                          [probe.pid]).fetchone()[0] == "SyncRep", 30,
                       "commits to wait for the standby")
            release.set()
            wait_until(lambda: su.execute(
                "select count(*) from pg_stat_activity where wait_event = 'SyncRep'"
                " and application_name = 'awa-sql worker slot'").fetchone()[0] == 1, 30,
                "the outcome's commit to wait for the standby")
            su.execute("alter system reset synchronous_standby_names")  # for the restart
        db.server.stop_immediately_and_start()
        with db.connect() as su:
            assert places(su)[job_id] == [(state, 1)]
        wait_until(lambda: any(r.getMessage().startswith(f"job {job_id} (job): ")
                               and "was lost" in r.getMessage() for r in caplog.records), 30,
                   "the worker to hear back")
    finally:
        release.set()
        worker.stop()
        runner.join(30)
    said = [r.getMessage() for r in caplog.records if f"job {job_id} " in r.getMessage()]
    assert said[-1] == f"job {job_id} (job): {message}", said
    assert not any("not recorded" in s for s in said), said
    counted = (worker.completed, worker.failed)
    assert counted == {"completion": (1, 0), "failure": (0, 1), "unreadable": (0, 0)}[case]


class _Committer(threading.Thread):
    """Commits a transaction with an id again and again, until one fails
    (the crash ends it) or never ends."""

    def __init__(self, dsn: str):
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self.conn.execute("select pg_backend_pid()").fetchone()[0]

    def run(self) -> None:
        try:
            while True:
                self.conn.execute("select pg_current_xact_id()")
        except psycopg.Error:
            pass


def test_a_copy_committed_in_replica_mode_is_enqueued_at_its_commit_and_survives(db):
    """A producer whose session runs with session_replication_role = replica
    (a login granted SET on it, a tool that loads in that mode): triggers
    that fire only in origin mode would leave its committed rows in
    awa.copy_staging, an unlogged table, until awa.move_staged, and a crash
    before that pass empties the table: the commit was acknowledged and the
    jobs were gone."""
    with db.connect() as su:
        su.execute("grant set on parameter session_replication_role to {}".format(
            db.login["awa_producer"]))
    with db.connect("awa_producer", autocommit=False) as p:
        p.execute("set session_replication_role = replica")
        copy_jobs(p, "replica", "replica", 40)
        p.commit()
    db.server.stop_immediately_and_start()
    with db.connect() as su:
        assert len(copied_ids(su, "replica")) == 40
        assert su.execute("select count(*) from awa.copy_staging").fetchone()[0] == 0


def test_a_copy_killed_while_its_commit_moves_its_rows_leaves_nothing(db):
    """The producer's backend is killed while its commit's deferred trigger
    moves the staged rows into the lane: the client saw no commit, and after
    the recovery nothing of the load is anywhere; the lane then takes the
    next load in order."""
    with db.connect("awa_producer") as p:
        p.execute("select awa.enqueue('mid', 'job')")  # the queue and its lane
    with db.connect() as su:
        hold = Hold(su, "awa.ready", "insert")

    def load(conn: psycopg.Connection) -> None:
        with conn.transaction():
            copy_jobs(conn, "mid", "killed", 100)

    step = Step(db.dsn("awa_producer"), load)
    step.start()
    wait_until(lambda: hold.waiting(step.pid) or not step.is_alive(), 30,
               "the commit to reach its hold")
    assert step.is_alive(), f"the load ended before its hold: {step.error!r}"
    db.server.kill_backend(step.pid)
    step.join(30)
    assert isinstance(step.error, psycopg.OperationalError)
    hold.close()
    with db.connect() as su:
        drop_holds(su, "awa.ready")
        assert copied_ids(su, "killed") == []
        for table in ("copy_staging", "copy_pending"):
            assert su.execute(f"select count(*) from awa.{table}").fetchone()[0] == 0
    with db.connect("awa_producer", autocommit=False) as p:
        copy_jobs(p, "mid", "next", 100)
        p.commit()
    with db.connect() as su:
        loaded = copied_ids(su, "next")
    assert len(loaded) == 100
    with db.connect("awa_worker") as w:
        taken = []
        while batch := claim(w, "mid", 30):
            taken += batch
    assert [t[0] for t in taken[1:]] == loaded
