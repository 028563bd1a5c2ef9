"""Dropping an empty queue in two steps (ADR 044), on real PostgreSQL 17 and
18: awa.drop_queue renames the queue's row out of every lookup and pauses
it; awa.finish_drops removes it (lanes, sequences, rows, its place under the
queue limit) once no session can still route a job to it, and puts it back,
never away, when a job came late. No job is lost or stranded."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from awa_sql.maintain import TASKS
from awa_sql.metrics import render
from tests.support.finished import kept, past
from tests.support.isolation import OLDER_SNAPSHOTS, assert_refused_outside_read_committed
from tests.support.jobs import (
    Call,
    behind,
    claim,
    claim_all,
    copy_rows,
    enqueue,
    in_turn_behind,
    waits_for_a_lock,
)
from tests.support.waiting import wait_until


@pytest.fixture
def su(db):
    with db.connect() as conn:
        yield conn


@pytest.fixture
def op(db, logins):
    with db.connect(logins.operator) as conn:
        yield conn


def drop(op, queue: str, **kw) -> bool:
    extra = "".join(f", {k} => %({k})s" for k in kw)
    return op.execute(f"select awa.drop_queue(%(queue)s{extra})",
                      {"queue": queue, **kw}).fetchone()[0]


def finish(db, logins) -> list[tuple]:
    with db.connect(logins.maintenance) as m:
        return m.execute("select * from awa.finish_drops()").fetchall()


def sequences(su) -> set[str]:
    return {r[0] for r in su.execute(
        "select relname from pg_class where relkind = 'S'"
        " and relnamespace = 'awa'::regnamespace").fetchall()}


def queue_row(su, queue_id: int):
    return su.execute("select queue, paused, dropped_name from awa.queue_meta"
                      " where queue_id = %s", [queue_id]).fetchone()


def queue_id(su, queue: str) -> int:
    return su.execute("select queue_id from awa.queue_meta where queue = %s",
                      [queue]).fetchone()[0]


def counted(su) -> int:
    return su.execute("select queues from awa.queue_limit").fetchone()[0]


def refused(conn, call: str, params=()) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(call, params)
    return err.value


def test_refusals_name_the_queue_and_what_it_holds(db, logins, su, op):
    assert refused(op, "select awa.drop_queue('nope')").sqlstate == "42704"
    assert refused(op, "select awa.drop_queue(null)").sqlstate == "22004"
    assert refused(op, "select awa.drop_queue('a#0')").sqlstate == "22023"
    assert refused(op, "select awa.drop_queue('x', null)").sqlstate == "22004"
    op.execute("select * from awa.set_queue_partitions('parts', 2)")
    err = refused(op, "select awa.drop_queue('parts')")
    assert (err.sqlstate, "not supported yet" in str(err)) == ("0A000", True)
    err = refused(op, "select awa.drop_queue('parts__p1')")
    assert err.sqlstate == "0A000" and "'parts__p1' is a partition or stripe of 'parts'" in str(err)
    op.execute("select * from awa.set_queue_stripes('striped', 2)")
    assert refused(op, "select awa.drop_queue('striped')").sqlstate == "0A000"
    with db.connect(logins.producer) as p:
        enqueue(p, "busy")
        enqueue(p, "later", run_at="2100-01-01T00:00:00Z")
        enqueue(p, "done", unique_key=b"k", unique_window="1 hour")
    err = refused(op, "select awa.drop_queue('busy')")
    assert err.sqlstate == "55006"
    assert err.diag.message_primary == (
        "queue 'busy' is not empty: 1 ready, 0 scheduled, 0 running, 0 unique keys held,"
        " 0 terminal jobs kept")
    assert "1 scheduled" in str(refused(op, "select awa.drop_queue('later')"))
    with db.connect(logins.worker) as w:
        (job,) = claim(w, ["busy"])
        assert "1 running" in str(refused(op, "select awa.drop_queue('busy')"))
        w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
        (done,) = claim(w, ["done"])
        w.execute("select awa.complete(%s, %s)", [done[0], done[1]])
    assert "1 terminal jobs kept" in str(refused(op, "select awa.drop_queue('busy')"))
    assert "1 unique keys held, 1 terminal" in str(refused(op, "select awa.drop_queue('done')"))
    # Nothing a refusal did stays: the rows are all there.
    assert su.execute("select count(*) from awa.finished").fetchone()[0] == 2
    assert drop(op, "busy", discard_finished=True) is True
    assert drop(op, "done", discard_finished=True) is True
    assert su.execute("select count(*) from awa.finished").fetchone()[0] == 0
    assert su.execute("select count(*) from awa.unique_keys").fetchone()[0] == 0
    assert refused(op, "select awa.drop_queue('busy')").sqlstate == "42704"


@pytest.mark.parametrize("role", ["producer", "worker", "maintenance", "reader"])
def test_only_operators_drop(db, logins, role):
    with db.connect(logins.producer) as p:
        enqueue(p, "q")
    with db.connect(getattr(logins, role)) as conn:
        assert refused(conn, "select awa.drop_queue('q')").sqlstate == "42501"


@pytest.mark.parametrize("role", ["producer", "worker", "operator", "reader"])
def test_only_maintenance_finishes(db, logins, role):
    with db.connect(getattr(logins, role)) as conn:
        assert refused(conn, "select * from awa.finish_drops()").sqlstate == "42501"


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_a_drop_refuses_a_snapshot_older_than_the_call(db, logins, isolation):
    """Its read of what the queue holds would miss the jobs committed after
    the transaction's snapshot."""
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('rrq', 'k')")
    with db.connect(logins.operator, autocommit=False) as op:
        op.execute(f"begin isolation level {isolation}")
        with pytest.raises(psycopg.errors.InvalidTransactionState) as err:
            op.execute("select awa.drop_queue('rrq')")
        assert err.value.diag.message_primary == (
            f"awa.drop_queue() needs a read committed transaction, got {isolation}")


@pytest.mark.parametrize("isolation", OLDER_SNAPSHOTS)
def test_finish_refuses_a_snapshot_older_than_the_call(db, logins, isolation):
    assert_refused_outside_read_committed(db, logins.maintenance, "awa.finish_drops()",
                                          isolation)


def test_a_drop_then_a_finish_removes_the_queue_and_frees_its_place(db, logins, su, op):
    before = (counted(su), sequences(su))
    with db.connect(logins.producer) as p:
        enqueue(p, "gone")
        enqueue(p, "kept")
    with db.connect(logins.worker) as w:
        for job in claim_all(w, ["gone"]):
            w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
    op.execute("select awa.set_autoscale_policy('gone', cooldown => '1 minute')")
    # Changes of S, whose history names its lanes (and is kept).
    op.execute("select awa.set_enqueue_shards('gone', 2)")
    op.execute("select awa.set_enqueue_shards('gone', 1)")
    gone = queue_id(su, "gone")
    lanes = [r[0] for r in su.execute("select lane_id from awa.lanes where queue_id = %s",
                                      [gone]).fetchall()]
    assert len(lanes) == 8
    su.execute("insert into awa.lane_hints select unnest(%s::integer[]), 1", [lanes])
    own = sequences(su) - before[1]
    assert len(own) == 20  # two queues of eight, and four lanes of shard 1
    assert drop(op, "gone", discard_finished=True) is True
    assert queue_row(su, gone) == (f"#dropped#{gone}", True, "gone")
    # A lookup by the old name misses it; the overview shows it paused.
    assert refused(op, "select awa.enqueue_shards('gone')").sqlstate == "42704"
    assert op.execute("select * from awa.queue_counts('gone')").fetchall() == []
    assert counted(su) == before[0] + 2  # still a place until removed
    # The watches read a dropped queue: the overview, awa storage show, metrics.
    assert ("#dropped#" + str(gone), True) in op.execute(
        "select queue, paused from awa.queue_overview").fetchall()
    db.awa("storage", "show", user=logins.operator, check=True)
    db.awa("storage", "show", "--json", user=logins.operator, check=True)
    with db.connect(logins.reader) as r:
        assert f'queue="#dropped#{gone}"' in render(r)[0].decode()
    assert finish(db, logins) == [("gone", gone, "removed", None)]
    assert queue_row(su, gone) is None
    assert counted(su) == before[0] + 1
    for table in ("lanes", "autoscale_policy", "contention_samples", "ready_late",
                  "unique_keys"):
        assert su.execute(f"select count(*) from awa.{table} where queue_id = %s",
                          [gone]).fetchone()[0] == 0
    assert su.execute("select count(*) from awa.lane_hints where lane_id = any(%s)",
                      [lanes]).fetchone()[0] == 0
    # The sequences go a call later, once no snapshot reads the rows that named them.
    assert len(sequences(su) - before[1]) == 20
    assert finish(db, logins) == []
    assert len(sequences(su) - before[1]) == 8
    assert su.execute("select count(*) from awa.dropped_sequences").fetchone()[0] == 0
    assert all(s.startswith(("lane_seq_", "queue_")) for s in own)
    # Every watch still reads.
    with db.connect(logins.reader) as r:
        r.execute("select * from awa.queue_overview").fetchall()
        r.execute("select * from awa.lane_overview").fetchall()
        # The changes of S went with the row's name (a new queue of the name
        # starts its own history).
        evidence = "select * from awa.shard_change_evidence where queue = %s"
        assert len(r.execute(evidence, [f"#dropped#{gone}"]).fetchall()) == 2
        assert r.execute(evidence, ["gone"]).fetchall() == []


def test_an_enqueue_after_the_drop_makes_a_new_queue_and_the_finish_leaves_it(db, logins, su,
                                                                              op):
    with db.connect(logins.producer) as p:
        enqueue(p, "again")
        old = queue_id(su, "again")
        su.execute("delete from awa.ready")
        drop(op, "again")
        job = enqueue(p, "again")[0]
    new = queue_id(su, "again")
    assert new != old
    assert finish(db, logins) == [("again", old, "removed", None)]
    assert queue_row(su, new) == ("again", False, None)
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["again"])] == [job]


def late_job(db, logins, su, op, queue: str, take_name: bool) -> tuple[int, int, int | None]:
    """A repeatable read producer whose snapshot predates the drop routes a
    job into the dropped queue; (old queue id, the job, the new queue id)."""
    with db.connect(logins.producer) as p:
        enqueue(p, queue)
        old = queue_id(su, queue)
    su.execute("delete from awa.ready")
    with db.connect(logins.producer, autocommit=False) as late:
        late.execute("begin isolation level repeatable read")
        late.execute("select 1")
        drop(op, queue)
        new = None
        if take_name:
            with db.connect(logins.producer) as p:
                enqueue(p, queue, run_at="2100-01-01T00:00:00Z")
            new = queue_id(su, queue)
        # Not while a snapshot predates the drop: it still reads the old row,
        # by the old name, and routes its job there.
        assert finish(db, logins) == []
        job = enqueue(late, queue)[0]
        assert finish(db, logins) == []
        assert queue_row(su, old)[2] == queue
        late.commit()
    return old, job, new


def test_a_late_job_puts_the_queue_back_under_its_name(db, logins, su, op):
    old, job, _ = late_job(db, logins, su, op, "late", take_name=False)
    assert finish(db, logins) == [("late", old, "restored", "late")]
    assert queue_row(su, old) == ("late", False, None)
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["late"])] == [job]
    assert finish(db, logins) == []


def test_a_late_jobs_unique_key_goes_back_with_its_queue(db, logins, su, op):
    """A read committed enqueue reads the queue's row in one statement and
    takes its unique key in another: a drop committed between the two left
    the key under the dropped name, and once the queue was put back a second
    job took the same key."""
    old, job, _ = late_job(db, logins, su, op, "late-key", take_name=False)
    su.execute("select * from awa._take_unique_keys(array['k'::bytea], array[%s::bigint],"
               " array[%s::integer], array[2::smallint], array[null::interval])", [job, old])
    held_under = "select queue from awa.unique_keys where job_id = %s"
    assert su.execute(held_under, [job]).fetchone()[0] == f"#dropped#{old}"
    assert finish(db, logins) == [("late-key", old, "restored", "late-key")]
    assert su.execute(held_under, [job]).fetchone()[0] == "late-key"
    with db.connect(logins.producer) as p:
        again = enqueue(p, "late-key", unique_key=b"k")
    assert (again[0], again[5]) == (job, True)  # a duplicate of the late job


def test_a_late_job_puts_the_queue_back_under_a_recovery_name_when_the_name_is_taken(
        db, logins, su, op):
    old, job, new = late_job(db, logins, su, op, "taken", take_name=True)
    name = f"taken~dropped-{old}"
    assert finish(db, logins) == [("taken", old, "renamed", name)]
    assert queue_row(su, old) == (name, False, None)
    assert queue_row(su, new) == ("taken", False, None)
    with db.connect(logins.worker) as w:
        (claimed,) = claim_all(w, [name])
        assert claimed[0] == job
        assert claim_all(w, ["taken"]) == []
        w.execute("select awa.complete(%s, %s)", [claimed[0], claimed[1]])
    # Empty now: it can be dropped and removed like any queue.
    drop(op, name, discard_finished=True)
    assert finish(db, logins) == [(name, old, "removed", None)]


def test_a_recovery_name_fits_in_200_bytes_and_avoids_taken_names(db, su):
    long = "é" * 100  # 200 bytes
    assert su.execute("select awa._recovery_name(%s, 7)", [long]).fetchone()[0] == (
        "é" * 95 + "~dropped-7")
    su.execute("insert into awa.queue_meta (queue) values ('q~dropped-7')")
    assert su.execute("select awa._recovery_name('q', 7)").fetchone()[0] == "q~dropped-7-2"


def test_an_uncommitted_enqueue_holding_a_lane_keeps_the_queue_until_it_ends(db, logins, su,
                                                                            op):
    with db.connect(logins.producer) as p:
        enqueue(p, "held")
    old = queue_id(su, "held")
    su.execute("delete from awa.ready")
    with db.connect(logins.producer, autocommit=False) as p:
        enqueue(p, "held")
        # A simple-protocol statement drops the enqueue's portal, whose
        # snapshot psycopg's extended protocol leaves open until the next.
        p.pgconn.exec_(b"select 1")
        drop(op, "held")
        assert finish(db, logins) == []  # the lane is held: skipped
        assert queue_row(su, old)[2] == "held"
        p.rollback()
    assert finish(db, logins) == [("held", old, "removed", None)]


def test_an_uncommitted_enqueue_that_commits_puts_the_queue_back(db, logins, su, op):
    with db.connect(logins.producer) as p:
        enqueue(p, "held")
    old = queue_id(su, "held")
    su.execute("delete from awa.ready")
    with db.connect(logins.producer, autocommit=False) as p:
        job = enqueue(p, "held")[0]
        p.pgconn.exec_(b"select 1")
        drop(op, "held")
        assert finish(db, logins) == []
        p.commit()
    assert finish(db, logins) == [("held", old, "restored", "held")]
    with db.connect(logins.worker) as w:
        assert [c[0] for c in claim_all(w, ["held"])] == [job]


def test_a_drop_waits_for_an_uncommitted_scheduled_job_and_then_sees_it(db, logins, su, op):
    with db.connect(logins.producer) as p:
        enqueue(p, "sched")
    su.execute("delete from awa.ready")
    with db.connect(logins.producer, autocommit=False) as p, \
            db.connect(logins.operator, autocommit=False) as dropper:
        enqueue(p, "sched", run_at="2100-01-01T00:00:00Z")
        call = behind(db, p, dropper, lambda c: drop(c, "sched"))
    assert call.error is not None and call.error.sqlstate == "55006"
    assert "1 scheduled" in str(call.error)


def test_a_drop_that_discards_terminal_jobs_deletes_what_a_carry_moved_while_it_waited(
        db, logins, su, op):
    """A carry moves a row by deleting it and inserting a copy: the drop's
    delete, whose snapshot was taken before the carry committed, skipped the
    rows it waited for and could not see their copies, and the drop refused
    with "50 terminal jobs kept" although told to discard them."""
    op.execute("select awa.set_enqueue_shards('carried', 1)")
    op.execute("select awa.set_retention('carried', '1 hour', '30 days')")
    failed = past(su, "carried", "failed", "now() - interval '186 hours'", 50)
    with db.connect(logins.maintenance, autocommit=False) as m, \
            db.connect(logins.operator, autocommit=False) as dropper:
        assert m.execute("select awa.carry_finished()").fetchone()[0] == 50
        call = behind(db, m, dropper, lambda c: drop(c, "carried", discard_finished=True))
    assert call.error is None and call.result is True
    assert kept(su, failed) == set()


def test_every_job_is_found_once_while_a_queue_is_dropped_under_load(db, logins, su):
    """Producers (read committed, and repeatable read ones whose snapshot is
    taken before their enqueue) enqueue to one queue in a loop, workers claim
    and complete from it and from any recovery name, an operator drops it
    whenever it is empty and maintenance finishes drops in a loop. Then every
    job enqueued was claimed once, or is still in some queue, once."""
    stop = threading.Event()
    produced: list[int] = []
    claimed: list[int] = []
    outcomes: list[tuple] = []
    drops = [0]

    def produce(n: int) -> None:
        rng = random.Random(n)
        isolation = "repeatable read" if n % 2 else "read committed"
        with db.connect(logins.producer) as p:
            while not stop.is_set():
                p.execute(f"begin isolation level {isolation}")
                try:
                    # The snapshot, then the producer's own work: the queue
                    # may be dropped before its job goes where the row sent it.
                    p.execute("select pg_sleep(%s)", [rng.random() / 50])
                    job = enqueue(p, "dq")[0]
                    p.execute("commit")
                except psycopg.Error as err:
                    # A repeatable read producer racing a new queue's creation
                    # (ADR 039): its job is rolled back, not lost.
                    assert isolation == "repeatable read", err
                    p.execute("rollback")
                    continue
                produced.append(job)
                p.execute("select pg_sleep(%s)", [rng.random() / 4])

    def operate() -> None:
        with db.connect(logins.operator) as op:
            while not stop.is_set():
                try:
                    drop(op, "dq", discard_finished=True)
                    drops[0] += 1
                except psycopg.Error as err:
                    assert err.sqlstate in ("55006", "42704"), err
                op.execute("select pg_sleep(0.01)")

    def maintain() -> None:
        with db.connect(logins.maintenance) as m:
            while not stop.is_set():
                outcomes.extend(m.execute("select * from awa.finish_drops()").fetchall())

    def work() -> None:
        with db.connect(logins.worker) as w, db.connect(logins.reader) as reader:
            while not stop.is_set():
                names = [row[0] for row in reader.execute(
                    "select queue from awa.queue_overview where queue like 'dq%'").fetchall()]
                for job in claim(w, names, 10) if names else []:
                    w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
                    claimed.append(job[0])

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(produce, n) for n in range(4)]
        futures += [pool.submit(operate), pool.submit(maintain), pool.submit(work),
                    pool.submit(work)]
        try:
            wait_until(lambda: drops[0] >= 10 and len(produced) >= 200, timeout=120,
                       what="drops under load")
        except AssertionError as err:
            raise AssertionError(f"{err}: {drops[0]} drops, {len(produced)} jobs") from None
        finally:
            stop.set()
        for f in futures:
            f.result()
    # Every drop finished: removed, or put back with its late jobs.
    wait_until(lambda: (finish(db, logins), su.execute(
        "select count(*) from awa.queue_meta where dropped_xact is not null").fetchone()[0]
        == 0)[1], what="the drops to finish")
    left = []
    with db.connect(logins.worker) as w:
        names = [r[0] for r in su.execute("select queue from awa.queue_meta").fetchall()]
        left = [c[0] for c in claim_all(w, names)]
    found = Counter(claimed + left)
    assert set(found) == set(produced)
    assert max(found.values()) == 1
    assert su.execute("select count(*) from awa.ready").fetchone()[0] == 0
    # Both ways were taken (some 60 removals and 30 put back in a run of 100 drops).
    kinds = Counter(o[2] for o in outcomes)
    assert kinds["removed"] and kinds["restored"] + kinds["renamed"], kinds


def test_awa_maintain_finishes_drops_and_names_a_queue_it_put_back(db, logins, su, op):
    (task,) = [t for t in TASKS if t.name == "drops"]
    assert (task.function, task.every, task.flag) == ("awa.finish_drops()", 60.0,
                                                      "--drops-every")
    late_job(db, logins, su, op, "m2", take_name=False)
    with db.connect(logins.producer) as p:
        enqueue(p, "m1")
    su.execute("delete from awa.ready where queue_id = %s", [queue_id(su, "m1")])
    drop(op, "m1")
    with db.connect(logins.maintenance) as m:
        assert task.call(m) == (2, "removed 1 dropped queue(s); put dropped queue 'm2' back"
                                   " as 'm2': a job came to it late")
        assert task.call(m) == (0, "")


@pytest.mark.one_version
def test_awa_storage_drop_asks_refuses_and_drops(db, logins, su):
    with db.connect(logins.producer) as p:
        enqueue(p, "cli")
    unconfirmed = db.awa("storage", "drop", "cli", user=logins.operator)
    assert unconfirmed.returncode == 2
    assert "not dropped (Drop queue 'cli'?)" in unconfirmed.stderr
    full = db.awa("storage", "drop", "cli", "--yes", user=logins.operator)
    assert full.returncode == 9
    assert "queue 'cli' is not empty: 1 ready, 0 scheduled" in full.stderr
    assert db.awa("storage", "drop", "nosuch", "--yes", user=logins.operator).returncode == 2
    assert db.awa("storage", "drop", "cli", "--yes", user=logins.reader).returncode == 7
    with db.connect(logins.worker) as w:
        for job in claim_all(w, ["cli"]):
            w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
    kept = db.awa("storage", "drop", "cli", "--yes", user=logins.operator)
    assert kept.returncode == 9 and "1 terminal jobs kept" in kept.stderr
    assert "--discard-finished deletes" in kept.stderr  # the hint, in the CLI's flags
    done = db.awa("storage", "drop", "cli", "--discard-finished", "--yes", "--json",
                  user=logins.operator, check=True)
    assert json.loads(done.stdout) == {"queue": "cli", "dropped": True}
    assert su.execute("select dropped_name from awa.queue_meta where dropped_name is not null"
                      ).fetchall() == [("cli",)]


def test_a_late_scheduled_job_fails_to_serialize_and_is_not_lost(db, logins, su, op):
    """A repeatable read producer whose snapshot predates the drop sends a
    job for later into awa.scheduled by the old row: its foreign key's check
    meets the renamed row, and the transaction fails (40001) rather than
    leave a job behind."""
    with db.connect(logins.producer) as p:
        enqueue(p, "later")
    old = queue_id(su, "later")
    su.execute("delete from awa.ready")
    with db.connect(logins.producer, autocommit=False) as late:
        late.execute("begin isolation level repeatable read")
        late.execute("select 1")
        drop(op, "later")
        err = refused(late, "select awa.enqueue('later', 'k', run_at => now() + interval '1 h')")
        assert err.sqlstate == "40001"
    assert finish(db, logins) == [("later", old, "removed", None)]



@pytest.mark.parametrize("change, layout", [
    ("set_enqueue_shards('resized', 4)", (4, 1, 1)),
    ("set_queue_partitions('resized', 2)", (1, 2, 1)),
    ("set_queue_stripes('resized', 2)", (1, 1, 2)),
])
def test_a_layout_change_waiting_for_a_drop_changes_a_new_queue_of_the_name(
        db, logins, su, op, change, layout):
    """A change of S, partitions or stripes that looked the queue up before a
    drop committed waits for the drop's row lock. It then took the row by
    its id, renamed by the drop, and changed the dropped queue: a change of
    S provisioned lanes for it, returned '#dropped#<id>' as its queue and
    wrote that name into the history of changes of S; a change of
    partitions left the dropped row with P partitions and a new queue of the
    name with one, and their links. After the drop the name is no queue's,
    and a layout change to a new name creates the queue: so does this one."""
    op.execute("select * from awa.set_enqueue_shards('resized', 1)")
    old = queue_id(su, "resized")
    with db.connect(logins.operator, autocommit=False) as dropper, \
            db.connect(logins.operator, autocommit=False) as changer:
        assert drop(dropper, "resized") is True
        call = behind(db, dropper, changer,
                      lambda c: c.execute(f"select * from awa.{change}").fetchall())
    assert call.error is None, call.error
    assert not any("#dropped#" in str(row) for row in call.result), call.result
    new = queue_id(su, "resized")
    assert new != old
    layout_of = ("select enqueue_shards, partitions, stripes, (select count(*) from awa.lanes"
                 " as l where l.queue_id = m.queue_id) from awa.queue_meta as m"
                 " where m.queue_id = %s")
    assert su.execute(layout_of, [new]).fetchone()[:3] == layout
    assert su.execute(layout_of, [old]).fetchone() == (1, 1, 1, 4)
    assert queue_row(su, old) == (f"#dropped#{old}", True, "resized")
    assert su.execute("select count(*) from awa.shard_changes where queue like '#%%'"
                      ).fetchone()[0] == 0
    assert finish(db, logins) == [("resized", old, "removed", None)]


@pytest.mark.parametrize("change", [
    "pause_queue('switched')",
    "resume_queue('switched')",
    "set_shard_mode('switched', 'auto', 4)",
])
def test_a_switch_waiting_for_a_drop_finds_no_queue(db, logins, su, op, change):
    """A pause, a resume or a change of shard mode that looked the queue up
    before a drop committed waits for the drop's row lock. A pause or resume
    then found the row renamed and said 'nothing changed' (already paused,
    not paused) of a queue that was gone; a change of mode changed the
    dropped queue and returned '#dropped#<id>' as its queue. After the drop
    the name is no queue's: 42704, as for a call after the commit."""
    op.execute("select * from awa.set_enqueue_shards('switched', 1)")
    if change.startswith("resume"):
        op.execute("select awa.pause_queue('switched')")
    old = queue_id(su, "switched")
    with db.connect(logins.operator, autocommit=False) as dropper, \
            db.connect(logins.operator, autocommit=False) as switcher:
        assert drop(dropper, "switched") is True
        call = behind(db, dropper, switcher,
                      lambda c: c.execute(f"select * from awa.{change}").fetchall())
    assert call.error is not None and call.error.sqlstate == "42704", (call.error, call.result)
    assert "queue 'switched' does not exist" in str(call.error)
    assert su.execute("select shard_mode, paused, dropped_paused from awa.queue_meta"
                      " where queue_id = %s", [old]).fetchone() == (
        "manual", True, change.startswith("resume"))


def changes_of(su, queue: str) -> int:
    return su.execute("select count(*) from awa.shard_changes where queue = %s",
                      [queue]).fetchone()[0]


def test_a_new_queue_of_a_dropped_name_has_its_own_history_of_s(db, logins, su, op):
    """The history of S is read by name (awa._shards_at, the auto-scaler's
    cooldown, the admin's history). A dropped queue's changes go with its
    row's name, so a new queue of the name (an enqueue after the drop) does
    not read the old queue's S as its own."""
    op.execute("select * from awa.set_enqueue_shards('resown', 4)")
    op.execute("select * from awa.set_shard_mode('resown', 'auto', 8)")
    old = queue_id(su, "resown")
    drop(op, "resown")
    assert changes_of(su, "resown") == 0
    assert changes_of(su, f"#dropped#{old}") == 1
    with db.connect(logins.producer) as p:
        enqueue(p, "resown")
    assert su.execute("select awa._shards_at('resown', now())").fetchone()[0] == 1
    assert finish(db, logins) == [("resown", old, "removed", None)]
    assert changes_of(su, "resown") == 0


@pytest.mark.parametrize("take_name", [False, True])
def test_a_queue_put_back_takes_its_history_of_s_with_it(db, logins, su, op, take_name):
    op.execute("select * from awa.set_enqueue_shards('kept', 2)")
    old, _, _ = late_job(db, logins, su, op, "kept", take_name=take_name)
    (_, _, outcome, name), = finish(db, logins)
    assert outcome == ("renamed" if take_name else "restored")
    assert changes_of(su, name) == 1
    assert changes_of(su, f"#dropped#{old}") == 0
    if take_name:
        assert changes_of(su, "kept") == 0


def decision_counts(su, queue: str) -> list[tuple]:
    return su.execute("select action, decisions from awa.autoscale_decision_counts"
                      " where queue = %s order by action", [queue]).fetchall()


def tick(db, logins, times: int = 1) -> None:
    with db.connect(logins.maintenance) as m:
        for _ in range(times):
            m.execute("select * from awa.autoscale_tick()").fetchall()


def decision_series(db, logins, queue: str) -> list[str]:
    with db.connect(logins.reader) as r:
        return [line for line in render(r)[0].decode().splitlines()
                if line.startswith("awa_autoscale_decisions")
                and f'queue="{queue}"' in line]


def shadow_queue(op, queue: str) -> None:
    op.execute("select * from awa.set_enqueue_shards(%s, 1)", [queue])
    op.execute("select * from awa.set_shard_mode(%s, 'shadow', 8)", [queue])


def test_a_new_queue_of_a_dropped_name_starts_its_decision_counts_from_0(db, logins, su,
                                                                          op):
    """The counts are the metrics' counters, by name. The drop deletes them:
    kept until a tick found no queue of the name, a queue made again under
    it before that tick (here a manual one) kept the old queue's counts, and
    its awa_autoscale_decisions_* series, for good."""
    shadow_queue(op, "recount")
    tick(db, logins, 3)
    assert decision_counts(su, "recount") == [("held", 3)]
    drop(op, "recount")
    assert decision_counts(su, "recount") == []
    with db.connect(logins.producer) as p:
        enqueue(p, "recount")  # a new, manual queue, before any tick
    tick(db, logins, 2)
    assert decision_counts(su, "recount") == []
    assert decision_series(db, logins, "recount") == []
    # Made auto-scaled again, it counts from 0.
    shadow_queue(op, "recount")
    tick(db, logins)
    assert decision_counts(su, "recount") == [("held", 1)]
    assert 'awa_autoscale_decisions_total{action="held",queue="recount"} 1.0' in (
        decision_series(db, logins, "recount"))


def test_a_queue_put_back_starts_its_decision_counts_from_0(db, logins, su, op):
    shadow_queue(op, "recount")
    tick(db, logins)
    old, _, _ = late_job(db, logins, su, op, "recount", take_name=False)
    assert finish(db, logins) == [("recount", old, "restored", "recount")]
    assert decision_counts(su, "recount") == []
    tick(db, logins)
    assert decision_counts(su, "recount") == [("held", 1)]


def test_a_drop_waits_for_a_tick_counting_the_queue_and_deletes_its_count(db, logins, su, op):
    """A tick that folds a hold into the queue's latest decision holds that
    row until it commits: the drop's rename of the history waits for it,
    then its delete takes the tick's count too, and no deadlock."""
    shadow_queue(op, "recount")
    tick(db, logins)
    with (db.connect(logins.maintenance, autocommit=False) as m,
          db.connect(logins.operator, autocommit=False) as dropper,
          db.connect() as watch):
        m.execute("select * from awa.autoscale_tick()").fetchall()
        assert decision_counts(su, "recount") == [("held", 1)]  # the tick's is not committed
        dropping = Call(dropper, lambda c: drop(c, "recount"))
        in_turn_behind(watch, m, [dropping])
    assert dropping.error is None, dropping.error
    assert dropping.result is True
    assert decision_counts(su, "recount") == []
    with db.connect(logins.producer) as p:
        enqueue(p, "recount")
    tick(db, logins)
    assert decision_counts(su, "recount") == []


def test_a_tick_that_counts_a_queue_dropped_in_flight_deletes_the_count(db, logins, su, op):
    """The other way round: the drop's transaction holds the renamed decision
    the tick would fold into; the tick waits for it, then counts under a name
    no queue has any more, and its own prune of those takes the count."""
    shadow_queue(op, "recount")
    tick(db, logins)
    with (db.connect(logins.operator, autocommit=False) as dropper,
          db.connect(logins.maintenance, autocommit=False) as m,
          db.connect() as watch):
        drop(dropper, "recount")
        ticking = Call(m, lambda c: c.execute("select * from awa.autoscale_tick()").fetchall())
        in_turn_behind(watch, dropper, [ticking])
    assert ticking.error is None, ticking.error
    assert len(ticking.result) == 1  # it decided, folding into the renamed row
    assert decision_counts(su, "recount") == []


@pytest.mark.parametrize("change", [
    "pause_queue('later')",
    "set_shard_mode('later', 'auto', 4)",
    "set_enqueue_shards('later', 2)",
])
def test_a_change_does_not_wait_for_an_enqueue_of_a_job_for_later(db, logins, su, op, change):
    """An enqueue of a job for later holds a key share of its queue's row
    until it commits; a change of the queue locks the row against other
    changes and drops only (no key update), so it does not wait for it. The
    drop does (test_a_drop_waits_for_an_uncommitted_scheduled_job_...)."""
    with db.connect(logins.producer) as p:
        enqueue(p, "later")
    with db.connect(logins.producer, autocommit=False) as p:
        enqueue(p, "later", run_at="2100-01-01T00:00:00Z")
        op.execute("set lock_timeout = '5s'")  # a wait fails the test, not hangs it
        op.execute(f"select * from awa.{change}")
        p.commit()


def test_a_queue_dropped_again_while_the_finish_waits_for_its_row_is_left(db, logins, su, op):
    """awa.finish_drops lists the drops every snapshot is past, then locks
    each row. A queue put back and dropped again meanwhile (here: its row's
    drop rewritten by a transaction the lock waits for) carries a drop that
    older snapshots are not past: the row, re-read after the wait, is left
    to a later call, which removes it."""
    op.execute("select awa.set_enqueue_shards('again', 1)")
    again = queue_id(su, "again")
    assert drop(op, "again") is True
    with db.connect(autocommit=False) as holder, \
            db.connect(logins.maintenance, autocommit=False) as m:
        holder.execute("update awa.queue_meta set dropped_xact = pg_current_xact_id()"
                       " where queue_id = %s", [again])
        call = behind(db, holder, m,
                      lambda c: c.execute("select * from awa.finish_drops()").fetchall())
    assert call.error is None, call.error
    assert call.result == []
    assert queue_row(su, again) == (f"#dropped#{again}", True, "again")
    assert [(r[1], r[2]) for r in finish(db, logins)] == [(again, "removed")]
    assert queue_row(su, again) is None


def copy_two_queues(queues):
    """A COPY load for the general mover: one unkeyed row per queue."""
    def work(conn):
        copy_rows(conn, [(q, 2, None, "job", json.dumps({"q": q}), None, 25) for q in queues])
        return conn.execute("select awa.enqueue_copied()").fetchone()[0]
    return work


def batch_two_queues(queues):
    def work(conn):
        return [r[0] for r in conn.execute(
            "select job_id from awa.enqueue_batch(%s::text[], %s::text[])",
            [queues, ["job"] * len(queues)]).fetchall()]
    return work


@pytest.mark.parametrize("path", ["copy", "batch"])
def test_a_multi_queue_load_that_waits_for_a_drop_enqueues_every_row(db, logins, su, op, path):
    """A load for an existing queue and a new one reads which queues exist,
    then waits for the provisioning lock to create the new one; a drop of the
    existing one holds that lock and commits meanwhile. The load then finds
    the name no queue's: its row goes to a new queue of the name, like any
    enqueue after a drop, and none is lost (the movers once looked the queues
    up by name again, statement by statement, and left the row out)."""
    with db.connect(logins.producer) as p:
        enqueue(p, "dl")
    su.execute("delete from awa.ready")
    old = queue_id(su, "dl")
    queues = ["dl", "dl-new"]
    work = copy_two_queues(queues) if path == "copy" else batch_two_queues(queues)
    with db.connect(logins.operator, autocommit=False) as holder, \
            db.connect(logins.producer, autocommit=False) as p:
        drop(holder, "dl")
        call = behind(db, holder, p, work)
    assert call.error is None, call.error
    assert call.result == (2 if path == "copy" else call.result)
    counts = dict(su.execute(
        "select m.queue, count(*) from awa.ready r join awa.queue_meta m using (queue_id)"
        " group by 1").fetchall())
    assert counts == {"dl": 1, "dl-new": 1}
    assert queue_id(su, "dl") != old
    assert finish(db, logins) == [("dl", old, "removed", None)]


def test_a_drop_waiting_for_a_queue_creation_lets_enqueues_of_jobs_for_later_through(
        db, logins, su):
    """Three single calls and a drop: a batch holds a lane of dx and waits for
    a lane of dx2 (which a transaction holds), then writes a job for later to
    dd; a batch that creates a queue (holding the provisioning lock until it
    commits) waits for that lane of dx; the drop of dd waits for the
    provisioning lock. The drop once took dd's row for update before that
    wait, so the first batch's job for later (a key share of the row, by the
    foreign key) waited for the drop: a cycle of waits, and one call ended
    with a deadlock (40P01). The drop now takes its row for update once it
    holds the provisioning lock: the batches commit, and the drop sees the
    job for later and refuses (55006)."""
    with db.connect(logins.producer) as p:
        for queue in ("dd", "dx", "dx2"):  # in this order: dx's lanes below dx2's
            enqueue(p, queue)
    su.execute("delete from awa.ready")
    later = "2100-01-01T00:00:00Z"
    with db.connect(logins.producer, autocommit=False) as holder, \
            db.connect(logins.producer, autocommit=False) as p2, \
            db.connect(logins.producer, autocommit=False) as p1, \
            db.connect(logins.operator, autocommit=False) as op, \
            db.connect() as watch:
        enqueue(holder, "dx2")
        calls = [
            Call(p2, lambda c: c.execute(
                "select job_id from awa.enqueue_batch(array['dx', 'dx2', 'dd'],"
                " array['job', 'job', 'job'], run_ats => array[null, null, %s]::timestamptz[])",
                [later]).fetchall()),
            Call(p1, lambda c: c.execute(
                "select job_id from awa.enqueue_batch(array['dy-new', 'dx'],"
                " array['job', 'job'])").fetchall()),
            Call(op, lambda c: drop(c, "dd")),
        ]
        in_turn_behind(watch, holder, calls)
    p2_call, p1_call, drop_call = calls
    assert p2_call.error is None, p2_call.error
    assert p1_call.error is None, p1_call.error
    assert drop_call.error is not None and drop_call.error.sqlstate == "55006", drop_call.error
    assert "1 scheduled" in str(drop_call.error)


def test_a_finish_that_puts_a_queue_back_never_waits_for_a_creation(db, logins, su, op):
    """A finish removed one dropped queue (holding awa.queue_limit's row until
    it commits), and a creation of a queue took the provisioning lock and
    waits for that row. The finish then finds a late job in another dropped
    queue: putting it back takes the provisioning lock. Waited for, that was
    a cycle (the finish waits for the creation, which waits for the finish),
    which PostgreSQL's deadlock check ends by failing a call: the producer's,
    when its own check ran first (the chaos harness met it). The finish now
    tries the lock and leaves the queue to its next call. Two finish calls in
    one transaction stand for one that reaches the second queue after the
    first; a short deadlock_timeout makes the finish's own check find the
    cycle within its 100 ms lock_timeout."""
    with db.connect(logins.producer) as p:
        enqueue(p, "fa")
        enqueue(p, "fb")
    su.execute("delete from awa.ready")
    removed_id, late_id = queue_id(su, "fa"), queue_id(su, "fb")
    su.execute(f'alter role "{logins.maintenance}" set deadlock_timeout = \'20ms\'')
    drop(op, "fa")
    with db.connect(logins.producer, autocommit=False) as late:
        late.execute("begin isolation level repeatable read")
        late.execute("select 1")
        drop(op, "fb")
        enqueue(late, "fb")  # to the dropped row, by its snapshot
        with db.connect(logins.maintenance, autocommit=False) as fin, \
                db.connect(logins.producer, autocommit=False) as creator, \
                db.connect() as watch:
            # The late job's snapshot keeps fb from this call: only fa goes.
            assert fin.execute("select * from awa.finish_drops()").fetchall() == [
                ("fa", removed_id, "removed", None)]
            late.commit()
            create = Call(creator, lambda c: enqueue(c, "fc-new"))
            create.start()
            wait_until(lambda: waits_for_a_lock(watch, create.pid), what="the creation to wait")
            put_back = fin.execute("select * from awa.finish_drops()").fetchall()
            fin.commit()
            create.join(timeout=30)
            assert not create.is_alive()
            assert create.error is None, create.error
    assert put_back == []
    assert finish(db, logins) == [("fb", late_id, "restored", "fb")]


def test_a_drop_that_discards_terminal_jobs_waits_for_a_retry_of_them_holding_nothing(
        db, logins, su, op):
    """A retry of a queue's cancelled jobs holds their rows and waits for a
    lane of the queue that a batch holds; the batch waits for another lane,
    then writes a job for later to the queue; a drop with discard_finished
    waits for the cancelled rows. The drop once locked the queue's row for
    update before that delete, so the batch's job for later (a key share of
    the row) waited for the drop: a cycle, and the retry failed with 40P01
    (the chaos harness met it). The drop now deletes first and locks the row
    for update after: the batch and the retry commit, and the drop refuses
    (55006)."""
    with db.connect(logins.producer) as p:
        for queue in ("rd", "rx2"):  # in this order: rd's lanes below rx2's
            enqueue(p, queue)
    su.execute("delete from awa.ready")
    with db.connect(logins.producer) as p:
        enqueue(p, "rd", priority=2)
    assert op.execute("select awa.cancel_jobs('rd')").fetchone()[0] == 1
    later = "2100-01-01T00:00:00Z"
    with db.connect(logins.producer, autocommit=False) as holder, \
            db.connect(logins.producer, autocommit=False) as batch, \
            db.connect(logins.operator, autocommit=False) as retrier, \
            db.connect(logins.operator, autocommit=False) as dropper, \
            db.connect() as watch:
        enqueue(holder, "rx2")
        calls = [
            Call(batch, lambda c: c.execute(
                "select job_id from awa.enqueue_batch(array['rd', 'rx2', 'rd'],"
                " array['job', 'job', 'job'], run_ats => array[null, null, %s]::timestamptz[])",
                [later]).fetchall()),
            Call(retrier, lambda c: c.execute(
                "select awa.retry_jobs('rd', state => 'cancelled')").fetchone()[0]),
            Call(dropper, lambda c: drop(c, "rd", discard_finished=True)),
        ]
        in_turn_behind(watch, holder, calls)
    batch_call, retry_call, drop_call = calls
    assert batch_call.error is None, batch_call.error
    assert retry_call.error is None, retry_call.error
    assert retry_call.result == 1
    assert drop_call.error is not None and drop_call.error.sqlstate == "55006", drop_call.error
