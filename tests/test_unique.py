"""Unique jobs (ADR 027) on PostgreSQL 17 and 18, each call made by a login
holding only the role it names: a unique key refuses a second live job of
the same logical queue on every enqueue path (single, batch, COPY), across
partitions and stripes; the key is free again when its job ends (after its
window, for a completed job), and a retry takes it back; concurrent
producers and workers never see two live jobs share a key, and nothing
deadlocks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from awa_sql import routing
from tests.support.jobs import Call, claim, claim_all, enqueue, in_turn_behind, waits_for_a_lock
from tests.support.waiting import wait_until

ENQUEUED = ["job_id", "queue", "priority", "enqueue_shard", "lane_seq", "duplicate"]


def put(conn, queue, key, kind="job", **kw) -> dict:
    return dict(zip(ENQUEUED, enqueue(conn, queue, kind, unique_key=key, **kw), strict=True))


def batch(conn, queues, keys, windows=None, **kw) -> list[dict]:
    kinds = ["job"] * len(queues)
    extra = "".join(f", {k} => %({k})s" for k in kw)
    rows = conn.execute(
        "select * from awa.enqueue_batch(%(queues)s, %(kinds)s, unique_keys => %(keys)s,"
        f" unique_windows => %(windows)s::interval[]{extra})",
        {"queues": queues, "kinds": kinds, "keys": keys, "windows": windows, **kw}).fetchall()
    return [dict(zip(ENQUEUED, r, strict=True)) for r in rows]


def live(conn, queue_like="%") -> int:
    return conn.execute(
        "select (select count(*) from awa.ready r join awa.queue_meta m using (queue_id)"
        "         where m.queue like %(q)s)"
        "     + (select count(*) from awa.scheduled s join awa.queue_meta m using (queue_id)"
        "         where m.queue like %(q)s)"
        "     + (select count(*) from awa.running r join awa.queue_meta m using (queue_id)"
        "         where m.queue like %(q)s)", {"q": queue_like}).fetchone()[0]


def finish(worker, queue, how="complete"):
    (job_id, lease, *_), = claim(worker, [queue], 1)
    if how == "complete":
        assert worker.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
    else:
        assert worker.execute("select awa.fail(%s, %s, 'boom')", [job_id, lease]).fetchone()[0]
    return job_id


# -- one enqueue at a time ------------------------------------------------------------------


def test_a_second_enqueue_of_a_key_inserts_nothing_and_returns_the_holder(db, logins):
    with db.connect(logins.producer) as p:
        first = put(p, "u", b"order-1", args=Jsonb({"n": 1}))
        again = put(p, "u", b"order-1", args=Jsonb({"n": 2}))
        other = put(p, "u", b"order-2")
        plain = dict(zip(ENQUEUED, enqueue(p, "u", "job"), strict=True))
    assert first["duplicate"] is False and first["lane_seq"] is not None
    assert again == {"job_id": first["job_id"], "queue": "u", "priority": 2,
                     "enqueue_shard": None, "lane_seq": None, "duplicate": True}
    assert other["duplicate"] is False and other["job_id"] != first["job_id"]
    assert plain["duplicate"] is False
    with db.connect() as su:
        assert live(su, "u") == 3
        assert su.execute("select args from awa.ready where job_id = %s",
                          [first["job_id"]]).fetchone()[0] == {"n": 1}


def test_a_key_is_held_while_scheduled_ready_and_running_and_through_retries(db, logins):
    with db.connect(logins.producer) as p:
        later = put(p, "hold", b"k-later", run_at="2999-01-01")
        assert later["duplicate"] is False and later["enqueue_shard"] is None
        assert put(p, "hold", b"k-later")["duplicate"] is True
        job = put(p, "hold", b"k-run", max_attempts=3)["job_id"]
    with db.connect(logins.worker) as w:
        (claimed,) = claim(w, ["hold"], 1)
        assert claimed[0] == job
        with db.connect(logins.producer) as p:
            assert put(p, "hold", b"k-run")["duplicate"] is True  # running
        # A failed attempt with attempts left is a retry: the key stays taken.
        assert w.execute("select awa.fail(%s, %s, 'try again', now())",
                         [job, claimed[1]]).fetchone()[0]
    with db.connect(logins.producer) as p:
        assert put(p, "hold", b"k-run") == {
            "job_id": job, "queue": "hold", "priority": 2, "enqueue_shard": None,
            "lane_seq": None, "duplicate": True}
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
    with db.connect(logins.producer) as p:
        assert put(p, "hold", b"k-run")["job_id"] == job


@pytest.mark.parametrize("end", ["complete", "fail for good", "cancel ready",
                                 "cancel scheduled", "cancel running"])
def test_the_key_is_free_again_when_its_job_ends(db, logins, end):
    with db.connect(logins.producer) as p:
        first = put(p, "free", b"k", max_attempts=1,
                    run_at="2999-01-01" if end == "cancel scheduled" else None)["job_id"]
    with db.connect(logins.worker) as w:
        if end in ("complete", "fail for good"):
            assert finish(w, "free", "complete" if end == "complete" else "fail") == first
        elif end == "cancel running":
            (claimed,) = claim(w, ["free"], 1)
        if end.startswith("cancel"):
            with db.connect(logins.operator) as op:
                assert op.execute("select awa.cancel_job(%s)", [first]).fetchone()[0]
        if end == "cancel running":
            assert w.execute("select awa.complete(%s, %s)",
                             [first, claimed[1]]).fetchone()[0] is False
    with db.connect(logins.producer) as p:
        second = put(p, "free", b"k")
    assert second["duplicate"] is False and second["job_id"] != first
    with db.connect() as su:
        assert su.execute("select job_id from awa.unique_keys where unique_key = 'k'"
                          ).fetchall() == [(second["job_id"],)]


def test_a_completed_job_with_a_window_holds_its_key_until_the_window_ends(db, logins):
    with db.connect(logins.producer) as p:
        first = put(p, "win", b"hourly", unique_window="1 hour")["job_id"]
    with db.connect(logins.worker) as w:
        assert finish(w, "win") == first
    with db.connect(logins.producer) as p:
        assert put(p, "win", b"hourly") == {
            "job_id": first, "queue": "win", "priority": 2, "enqueue_shard": None,
            "lane_seq": None, "duplicate": True}
    with db.connect() as su:
        held_until, = su.execute(
            "select held_until - now() from awa.unique_keys where unique_key = 'hourly'"
        ).fetchone()
        assert held_until.total_seconds() == pytest.approx(3600, abs=60)
        # The hour passes.
        su.execute("update awa.unique_keys set held_until = now() - interval '1 second'"
                   " where unique_key = 'hourly'")
    with db.connect(logins.producer) as p:
        second = put(p, "win", b"hourly")
    assert second["duplicate"] is False and second["job_id"] != first
    with db.connect() as su:
        assert su.execute("select job_id, held_until, unique_window from awa.unique_keys"
                          " where unique_key = 'hourly'").fetchone() == (
                              second["job_id"], None, None)


def test_the_window_counts_from_the_complete_not_from_the_workers_transaction_start(
        db, logins):
    """A worker may complete a job in a transaction begun long before; the
    key stays held for the whole window from the complete itself."""
    with db.connect(logins.producer) as p:
        put(p, "late", b"daily", unique_window="1 day")
    with db.connect(logins.worker, autocommit=False) as w:
        began = w.execute("select now()").fetchone()[0]
        wait_until(lambda: w.execute("select clock_timestamp() - now() > interval '0.2 s'"
                                     ).fetchone()[0], 10, "0.2 s into the transaction")
        before = w.execute("select clock_timestamp()").fetchone()[0]
        finish(w, "late")
        w.commit()
    with db.connect() as su:
        held_until, window = su.execute("select held_until, unique_window from awa.unique_keys"
                                        " where unique_key = 'daily'").fetchone()
    assert held_until >= before + window > began + window


def test_a_failed_job_gives_its_key_back_despite_a_window(db, logins):
    with db.connect(logins.producer) as p:
        first = put(p, "winf", b"w", unique_window="1 day", max_attempts=1)["job_id"]
    with db.connect(logins.worker) as w:
        assert finish(w, "winf", "fail") == first
    with db.connect(logins.producer) as p:
        assert put(p, "winf", b"w")["duplicate"] is False


def test_prune_unique_keys_removes_only_rows_whose_window_passed(db, logins):
    with db.connect(logins.producer) as p:
        ids = [put(p, "prune", k.encode(), unique_window="1 hour")["job_id"]
               for k in ("a", "b", "c")]
    with db.connect(logins.worker) as w:
        for _ in ids[:2]:
            finish(w, "prune")
    with db.connect() as su:
        su.execute("update awa.unique_keys set held_until = now() - interval '1 minute'"
                   " where unique_key = 'a'")
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.prune_unique_keys()").fetchone()[0] == 1
        assert m.execute("select awa.prune_unique_keys()").fetchone()[0] == 0
    with db.connect() as su:
        assert sorted(k for k, in su.execute(
            "select convert_from(unique_key, 'UTF8') from awa.unique_keys").fetchall()) == [
                "b", "c"]


# -- batches, COPY, partitions and stripes --------------------------------------------------


def test_in_a_batch_the_first_row_of_a_key_wins_and_the_rest_are_duplicates(db, logins):
    with db.connect(logins.producer) as p:
        held = put(p, "b", b"held")["job_id"]
        rows = batch(p, ["b"] * 6, [b"x", None, b"x", b"held", b"y", None])
    assert [r["duplicate"] for r in rows] == [False, False, True, True, False, False]
    assert rows[2]["job_id"] == rows[0]["job_id"]
    assert rows[3]["job_id"] == held and rows[3]["lane_seq"] is None
    assert len({r["job_id"] for r in rows}) == 5
    with db.connect() as su:
        assert live(su, "b") == 5


def test_copy_rows_take_keys_like_a_batch(db, logins):
    with db.connect(logins.producer) as p:
        held = put(p, "c", b"held")["job_id"]
        with p.transaction():
            with p.cursor().copy("copy awa.copy_staging (queue, kind, args, unique_key)"
                                 " from stdin") as cp:
                for i, key in enumerate([b"x", b"x", None, b"held", b"z"]):
                    cp.write_row(["c", "job", Jsonb({"i": i}), key])
            assert p.execute("select awa.enqueue_copied()").fetchone()[0] == 5
    with db.connect() as su:
        assert sorted(a["i"] for a, in su.execute(
            "select r.args from awa.ready r join awa.queue_meta m using (queue_id)"
            " where m.queue = 'c' and r.job_id <> %s", [held]).fetchall()) == [0, 2, 4]
        assert su.execute("select count(*) from awa.unique_keys where queue = 'c'"
                          ).fetchone()[0] == 3


def test_a_key_is_unique_across_the_partitions_and_stripes_of_a_logical_queue(db, logins):
    with db.connect() as su:
        su.execute("select awa.set_queue_partitions('parts', 4)")
        su.execute("select awa.set_queue_stripes('striped', 4)")
    with db.connect(logins.producer) as p:
        # Different ordering keys route to different partitions (and stripes).
        first = put(p, "parts", b"same", ordering_key=b"route-1")
        seconds = [put(p, "parts", b"same", ordering_key=f"route-{i}".encode())
                   for i in range(2, 12)]
        partitions = {put(p, "parts", f"k{i}".encode(), ordering_key=f"route-{i}".encode())
                      ["queue"] for i in range(12)}
        s_first = put(p, "striped", b"same", ordering_key=b"route-1")
        s_seconds = batch(p, ["striped"] * 5, [b"same"] * 5,
                          ordering_keys=[f"route-{i}".encode() for i in range(5)])
        # The same key in another logical queue is another key.
        elsewhere = put(p, "u2", b"same")
    assert len(partitions) > 1
    assert all(s["duplicate"] and s["job_id"] == first["job_id"] for s in seconds)
    assert all(s["duplicate"] and s["job_id"] == s_first["job_id"] for s in s_seconds)
    assert elsewhere["duplicate"] is False


def test_a_retried_job_takes_its_key_back_or_stays_failed_when_it_is_held(db, logins):
    with db.connect(logins.producer) as p:
        a = put(p, "r", b"ka", args=Jsonb({"n": 1}), ordering_key=b"ok", max_attempts=1)
        b = put(p, "r", b"kb", max_attempts=1)
    with db.connect(logins.worker) as w:
        finish(w, "r", "fail")
        finish(w, "r", "fail")
    with db.connect(logins.producer) as p:
        taken = put(p, "r", b"kb")  # the key is free: another job takes it
    assert taken["duplicate"] is False
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.retry_job(%s)", [a["job_id"]]).fetchone()[0] is True
        assert op.execute("select awa.retry_job(%s)", [b["job_id"]]).fetchone()[0] is False
        assert op.execute("select state from awa.job(%s)", [b["job_id"]]).fetchone()[0] == "failed"
    with db.connect(logins.producer) as p:
        assert put(p, "r", b"ka")["job_id"] == a["job_id"]
    with db.connect(logins.worker) as w:
        got = {c[0]: (c[7], c[10]) for c in claim_all(w, ["r"])}
    assert got[a["job_id"]] == ({"n": 1}, b"ok")


def test_bulk_retry_skips_jobs_whose_key_is_held_and_retries_the_rest(db, logins):
    with db.connect(logins.producer) as p:
        ids = [put(p, "rb", f"k{i}".encode(), max_attempts=1)["job_id"] for i in range(6)]
    with db.connect(logins.worker) as w:
        for _ in ids:
            finish(w, "rb", "fail")
    with db.connect(logins.producer) as p:
        assert put(p, "rb", b"k0")["duplicate"] is False
        assert put(p, "rb", b"k3")["duplicate"] is False
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.retry_jobs('rb')").fetchone()[0] == 4
        assert op.execute("select awa.retry_jobs('rb')").fetchone()[0] == 0
        states = {i: op.execute("select state from awa.job(%s)", [i]).fetchone()[0] for i in ids}
    assert [states[i] for i in ids] == ["failed", "ready", "ready", "failed", "ready", "ready"]


def test_bulk_retry_of_cancelled_jobs_skips_those_whose_key_is_held_and_retries_the_rest(
        db, logins):
    """A cancel gives a job's key back; a job enqueued with it meanwhile holds
    it, and the cancelled one stays cancelled (not changed, not counted as
    retried), as a failed one stays failed. The others take their keys
    back: an enqueue of one of them is a duplicate of the retried job."""
    with db.connect(logins.producer) as p:
        ids = [put(p, "rbc", f"k{i}".encode())["job_id"] for i in range(5)]
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.cancel_jobs('rbc')").fetchone()[0] == 5
    with db.connect(logins.producer) as p:
        assert put(p, "rbc", b"k1")["duplicate"] is False
        assert put(p, "rbc", b"k4")["duplicate"] is False
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.retry_jobs('rbc')").fetchone()[0] == 0  # failed: none
        assert op.execute("select awa.retry_jobs('rbc', state => 'cancelled')"
                          ).fetchone()[0] == 3
        assert op.execute("select awa.retry_jobs('rbc', state => 'cancelled')"
                          ).fetchone()[0] == 0
        states = {i: op.execute("select state from awa.job(%s)", [i]).fetchone()[0] for i in ids}
    assert [states[i] for i in ids] == ["ready", "cancelled", "ready", "ready", "cancelled"]
    with db.connect(logins.producer) as p:
        again = put(p, "rbc", b"k2")
    assert again["duplicate"] is True and again["job_id"] == ids[2]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    ("select awa.enqueue('q', 'k', unique_window => '1 hour')",
     "unique_window 01:00:00 needs a unique_key"),
    ("select awa.enqueue('q', 'k', unique_key => '')", "1 to 1024 bytes, got 0"),
    ("select awa.enqueue('q', 'k', unique_key => convert_to(repeat('x', 1025), 'UTF8'))",
     "got 1025"),
    ("select awa.enqueue('q', 'k', unique_key => 'k', unique_window => '0 seconds')",
     "1 second to 365 days (31,536,000 s), got 00:00:00 (0 s)"),
    ("select awa.enqueue('q', 'k', unique_key => 'k', unique_window => '366 days')",
     "got 366 days"),
    # Held as its seconds: a year is 365.25 days, over the bound (an interval
    # comparison counts it 360 and let it through).
    ("select awa.enqueue('q', 'k', unique_key => 'k', unique_window => '1 year')",
     "got 1 year (31557600 s)"),
    ("select awa.enqueue('q', 'k', unique_key => 'k', unique_window => '12 mons 5 days')",
     "got 1 year 5 days"),
    ("select awa.enqueue_batch(array['q', 'q'], array['k', 'k'],"
     " unique_keys => array['a', '']::bytea[])",
     "batch element 2 (1-based): unique_key must be 1 to 1024 bytes, got 0"),
    ("select awa.enqueue_batch(array['q'], array['k'], unique_keys => array['a', 'b']::bytea[])",
     "array unique_keys has 2 elements but queues has 1"),
    ("select awa.enqueue_batch(array['q'], array['k'],"
     " unique_windows => array['1 hour']::interval[])",
     "batch element 1 (1-based): unique_window 01:00:00 needs a unique_key"),
])
def test_bad_unique_keys_and_windows_are_refused_with_22023_naming_them(db, logins, call,
                                                                         message):
    with db.connect(logins.producer) as p:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            p.execute(call)
        assert message in str(err.value)
    with db.connect() as su:
        assert su.execute("select count(*) from awa.unique_keys").fetchone()[0] == 0


def test_a_bad_copy_row_with_a_key_is_named_and_nothing_is_enqueued(db, logins):
    copy = "copy awa.copy_staging (queue, kind, unique_key, unique_window) from stdin"
    with (db.connect(logins.producer) as p,
          pytest.raises(psycopg.errors.InvalidParameterValue, match="COPY row 2"),
          p.transaction()):
        with p.cursor().copy(copy) as cp:
            cp.write_row(["cb", "job", b"a", None])
            cp.write_row(["cb", "job", None, "1 hour"])
        p.execute("select awa.enqueue_copied()")
    with db.connect() as su:
        assert su.execute("select count(*) from awa.unique_keys").fetchone()[0] == 0


# -- concurrency ----------------------------------------------------------------------------

KEYS = [f"key-{i}".encode() for i in range(12)]
QUEUES = ["cq1", "cq2", "cq3"]


CALLS = st.tuples(
    st.sampled_from(["single", "batch", "copy"]), st.sampled_from(QUEUES),
    st.lists(st.one_of(st.none(), st.sampled_from(KEYS)), min_size=1, max_size=6))
PLANS = st.lists(st.lists(CALLS, min_size=4, max_size=12), min_size=16, max_size=16)


def _produce(conn: psycopg.Connection, calls) -> list[bool]:
    """Single, batch and COPY calls, keyed and unkeyed, each its own transaction;
    the duplicate flag of each row single and batch calls returned."""
    made = []
    for how, queue, keys in calls:
        args = [Jsonb({"key": None if k is None else k.decode(), "queue": queue}) for k in keys]
        if how == "single":
            row = conn.execute("select duplicate from awa.enqueue(%s, 'job', %s,"
                               " unique_key => %s)", [queue, args[0], keys[0]]).fetchone()
            made.append(row[0])
        elif how == "batch":
            made += [r[0] for r in conn.execute(
                "select duplicate from awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                " array_fill('job'::text, array[%s]), %s::jsonb[], unique_keys => %s::bytea[])",
                [queue, len(keys), len(keys), args, keys]).fetchall()]
        else:
            with conn.cursor().copy("copy awa.copy_staging (queue, kind, args, unique_key)"
                                    " from stdin") as cp:
                for a, k in zip(args, keys, strict=True):
                    cp.write_row([queue, "job", a, k])
        conn.commit()
    return made


LIVE_KEYS_SHARED = """
    select a.args->>'queue', a.args->>'key', count(*)
      from (select args from awa.ready union all select args from awa.scheduled
            union all select args from awa.running) as a
     where a.args->>'key' is not null
     group by 1, 2
    having count(*) > 1
"""


@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plans=PLANS)
def test_concurrent_producers_and_workers_never_see_two_live_jobs_share_a_key(db, logins,
                                                                              plans):
    errors: list[BaseException] = []
    stop = threading.Event()
    completed: list[int] = []
    duplicates: list[bool] = []
    with db.connect() as su:
        done_before = su.execute("select count(*) from awa.finished").fetchone()[0]

    go = threading.Event()  # the sampler is connected: a fast plan cannot end unseen

    def producer(calls) -> None:
        try:
            with db.connect(logins.producer, autocommit=False) as conn:
                assert go.wait(60), "the sampler never connected"
                duplicates.extend(_produce(conn, calls))
        except BaseException as exc:
            errors.append(exc)

    def worker() -> None:
        try:
            with db.connect(logins.worker) as w:
                while True:
                    # Set once the producers are done: then an empty claim means done.
                    last = stop.is_set()
                    rows = claim(w, QUEUES, 5)
                    if last and not rows:
                        return
                    for job_id, lease, *_ in rows:
                        if w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]:
                            completed.append(job_id)
                    if not rows:
                        stop.wait(0.01)  # an idle worker's poll interval
        except BaseException as exc:
            errors.append(exc)

    producers = [threading.Thread(target=producer, args=(calls,)) for calls in plans]
    workers = [threading.Thread(target=worker) for _ in range(3)]
    for t in producers + workers:
        t.start()
    samples = 0
    with db.connect() as su:
        go.set()
        while any(t.is_alive() for t in producers):
            assert su.execute(LIVE_KEYS_SHARED).fetchall() == []
            samples += 1
        stop.set()
        for t in producers + workers:
            t.join(timeout=120)
        assert not [t.name for t in producers + workers if t.is_alive()], "a thread never ended"
        assert not errors, errors
        assert samples > 0
        assert su.execute(LIVE_KEYS_SHARED).fetchall() == []
        assert live(su) == 0
        # Every job ran once; no key is held once its job is done.
        assert len(completed) == len(set(completed)) > 0
        assert su.execute("select count(*) from awa.unique_keys").fetchone()[0] == 0
        assert su.execute("select count(*) from awa.finished where state = 'completed'"
                          ).fetchone()[0] == done_before + len(completed)
    assert len(duplicates) > 0


def test_a_claim_that_read_its_queue_before_the_first_keyed_job_gives_the_key_back(
        db, logins):
    """A claim by one queue's name reads the queue's row, then walks its
    lanes in a later statement, with a newer snapshot. The first keyed job
    of the queue marks the queue as keyed in its own transaction, which
    can commit between the two: the claim then takes the job while the row
    it read says no job of the queue has a key. The job's end must still
    give the key back. The claim is held between its two statements by a
    lock on awa.lane_hints, which only the walk reads."""
    with db.connect() as su:
        su.execute("select awa.set_enqueue_shards('firstkey', 1)")
        assert su.execute("select unique_jobs from awa.queue_meta where queue = 'firstkey'"
                          ).fetchone() == (False,)
    with db.connect(autocommit=False) as holder, db.connect(logins.worker) as w, \
            db.connect(logins.producer) as p, db.connect() as watch, \
            ThreadPoolExecutor(1) as pool:
        holder.execute("lock table awa.lane_hints in access exclusive mode")
        claimed = pool.submit(claim, w, ["firstkey"], 1)
        wait_until(lambda: watch.execute(
            "select exists (select from pg_locks where pid = %s and not granted"
            " and relation = 'awa.lane_hints'::regclass)", [w.info.backend_pid]).fetchone()[0],
            10, "the claim to wait for awa.lane_hints")
        first = put(p, "firstkey", b"k")
        holder.rollback()
        (job_id, lease, *_), = claimed.result(timeout=30)
        assert job_id == first["job_id"]
        assert w.execute("select awa.complete(%s, %s)", [job_id, lease]).fetchone()[0]
        second = put(p, "firstkey", b"k")
    assert second["duplicate"] is False and second["job_id"] != first["job_id"]


# -- the Python client ----------------------------------------------------------------------


def test_the_python_client_takes_unique_keys_on_every_path(db, logins):
    import asyncio
    from datetime import timedelta

    import awa_sql

    with db.connect(logins.producer) as conn:
        first = awa_sql.enqueue(conn, "send", {"n": 1}, queue="py", unique_key="k1")
        again = awa_sql.enqueue(conn, "send", {"n": 2}, queue="py", unique_key=b"k1")
        windowed = awa_sql.enqueue(conn, "send", queue="py", unique_key="w",
                                   unique_window=timedelta(hours=1),
                                   max_run_time=timedelta(minutes=5))
        many = awa_sql.enqueue_many(conn, [{"kind": "a", "unique_key": "k2"},
                                           {"kind": "b", "unique_key": "k2"},
                                           {"kind": "c"}, {"kind": "d", "unique_key": "k1"}],
                                    queue="py")
        copied = awa_sql.enqueue_many_copy(conn, [{"kind": "e", "unique_key": "k3"},
                                                  {"kind": "f", "unique_key": "k3"}], queue="py")
        plain = awa_sql.enqueue(conn, "send", queue="py")

    async def in_async():
        async with await psycopg.AsyncConnection.connect(db.dsn(logins.producer),
                                                         autocommit=True) as aconn:
            return await awa_sql.enqueue_async(aconn, "send", queue="py", unique_key="k1")

    from_async = asyncio.run(in_async())
    assert first.duplicate is False and plain.duplicate is False
    assert again == awa_sql.Enqueued(first.job_id, "py", 2, None, None, True)
    assert windowed.duplicate is False
    assert [m.duplicate for m in many] == [False, True, False, True]
    assert many[1].job_id == many[0].job_id and many[3].job_id == first.job_id
    assert copied == 2 and from_async.job_id == first.job_id and from_async.duplicate
    with db.connect() as su:
        assert su.execute("select count(*) from awa.ready r join awa.queue_meta m"
                          " using (queue_id) where m.queue = 'py'").fetchone()[0] == 6
        assert su.execute("select unique_window from awa.unique_keys where unique_key = 'w'"
                          ).fetchone()[0] == timedelta(hours=1)


def test_a_derived_key_is_stable_and_follows_kind_and_args():
    from awa_sql import unique_key

    # A fixed value: the recipe may never change (other languages reproduce it).
    assert unique_key("email.send", {"to": "a@b", "n": 1}).hex() == (
        "ce16aecf8d619456e44167b914556541457f64f2d62ff979b3b5af190382c47c")
    assert unique_key("email.send", {"n": 1, "to": "a@b"}) == unique_key(
        "email.send", {"to": "a@b", "n": 1})
    assert unique_key("email.send", {"to": "a@b"}) != unique_key("email.sent", {"to": "a@b"})
    assert unique_key("k", {"a": 1}) != unique_key("k", {"a": "1"})
    assert unique_key("k") == unique_key("k", {}) and len(unique_key("k")) == 32
    with pytest.raises(ValueError, match="kind must be a non-empty string"):
        unique_key("")


# -- no deadlock with a holder's end or a queue's first key -------------------------------


def _fast_deadlock_detection(db) -> None:
    with db.connect() as su:
        su.execute(sql.SQL("alter database {} set deadlock_timeout = '50ms'").format(
            sql.Identifier(db.name)))


def test_a_batch_with_a_duplicate_does_not_deadlock_the_worker_completing_its_holder(
        db, logins):
    """A worker that enqueues a follow-up and completes its job in one
    transaction holds the queue's lane, then gives the job's key back. A
    batch [that key, another job] read the holder's key row with a lock and
    then waited for the worker's lane, while the worker's complete waited for
    that lock: 40P01. The holder's row is read without a lock now."""
    _fast_deadlock_detection(db)
    both = db.login_role("awa_worker", "awa_producer")
    with db.connect(logins.producer) as p:
        enqueue(p, "wq", "job", unique_key=b"U")
    with db.connect() as admin, db.connect(both, autocommit=False) as w:
        (job, lease, *_), = claim(w, ["wq"], 1)
        w.commit()
        enqueue(w, "wq", "follow-up")
        producer = Call(db.connect(logins.producer, autocommit=False), lambda c: c.execute(
            "select * from awa.enqueue_batch(array['wq', 'wq'], array['a', 'b'],"
            " unique_keys => array['U', null]::bytea[])").fetchall())
        producer.start()
        wait_until(lambda: waits_for_a_lock(admin, producer.pid),
                   what="the batch to wait for the worker's lane")
        assert w.execute("select awa.complete(%s, %s)", [job, lease]).fetchone()[0]
        w.commit()
        producer.join(timeout=30)
        assert not producer.is_alive() and producer.error is None, producer.error
        # The key was held when the batch read it: its element is a duplicate.
        assert live(admin, "wq") == 2  # the follow-up and 'b'


def test_a_queues_first_keyed_enqueue_does_not_deadlock_another_keys_producer(db, logins):
    """The first keyed enqueue of a queue marks it (queue_meta.unique_jobs).
    Marked before its lane, the row lock was held while it waited for a lane
    another producer held, and that producer's own keyed enqueue of another
    key waited for the mark: 40P01. The mark comes after the lanes now."""
    _fast_deadlock_detection(db)
    with db.connect(logins.producer) as p:
        enqueue(p, "uq", "seed")
    with db.connect() as admin, db.connect(logins.producer, autocommit=False) as t2:
        enqueue(t2, "uq", "plain")
        t1 = Call(db.connect(logins.producer, autocommit=False),
                   lambda c: enqueue(c, "uq", "b", unique_key=b"u1"))
        t1.start()
        wait_until(lambda: waits_for_a_lock(admin, t1.pid), what="T1 to wait for the lane")
        enqueue(t2, "uq", "c", unique_key=b"u2")
        t2.commit()
        t1.join(timeout=30)
        assert not t1.is_alive() and t1.error is None, t1.error
        assert admin.execute("select unique_jobs from awa.queue_meta where queue = 'uq'"
                             ).fetchone()[0]
        assert live(admin, "uq") == 4


@pytest.mark.parametrize("change", [
    "select * from awa.set_enqueue_shards('uq', 2)",
    "select * from awa.set_queue_partitions('uq', 2)",
    "select * from awa.set_queue_stripes('uq', 2)",
    "select awa.drop_queue('uq')",
])
def test_a_batch_that_creates_a_queue_and_marks_another_does_not_deadlock_a_change(
        db, logins, change):
    """A batch that creates a queue holds the provisioning lock until it
    commits; its first keyed job of another queue marks that queue's row
    once it holds the lane. A change that locked the row and then waited
    for the provisioning lock closed the cycle: 40P01, two single calls.
    The change takes the provisioning lock first now. A third producer
    holds uq's lane only so that the batch waits there."""
    _fast_deadlock_detection(db)
    with db.connect(logins.producer) as p:
        enqueue(p, "uq", "seed")
    with db.connect() as admin, db.connect(logins.producer, autocommit=False) as holder:
        enqueue(holder, "uq", "plain")
        calls = [
            Call(db.connect(logins.producer, autocommit=False), lambda c: c.execute(
                "select duplicate from awa.enqueue_batch(array['zz-new', 'uq'],"
                " array['a', 'b'], unique_keys => array[null, 'k1']::bytea[])").fetchall()),
            Call(db.connect(logins.operator, autocommit=False),
                 lambda c: c.execute(change).fetchall()),
        ]
        in_turn_behind(admin, holder, calls)
        batch, op = calls
        assert batch.error is None, batch.error
        assert batch.result == [(False,), (False,)]
        if "drop_queue" in change:
            assert op.error is not None and op.error.sqlstate == "55006", op.error
        else:
            assert op.error is None, op.error
        assert admin.execute("select unique_jobs from awa.queue_meta where queue = 'uq'"
                             ).fetchone()[0]


@pytest.mark.parametrize("change", [
    "select awa.pause_queue('fam')",
    "select awa.set_retention('fam', '1 hour', '1 day')",
    "select awa.set_retry_policy('fam', '1 second', '1 minute', 0.1)",
    "select awa.set_max_run_time('fam', '1 hour')",
    "select * from awa.set_shard_mode('fam', 'shadow', 8)",
])
def test_a_family_change_and_a_first_keyed_batch_lock_the_rows_in_one_order(
        db, logins, change):
    """A change of a logical queue updates the row of each of its
    partitions; a producer's first keyed batch over two partitions marks
    their rows (queue_meta.unique_jobs) in queue_id order. The change locked
    them in the order it found them, the heap's, which an update of a row
    reshuffles: with fam__p2's row before fam__p1's, the change held p2 and
    waited for p1 while the batch held p1 and waited for p2, 40P01 from two
    single calls. Both lock in queue_id order now. A third session holds
    p1's row only so that both calls wait there, the batch first."""
    _fast_deadlock_detection(db)
    with db.connect() as su:
        su.execute("select * from awa.set_queue_partitions('fam', 3)")
        # A new version of p1's row, after p2's in the heap.
        su.execute("update awa.queue_meta set paused = paused where queue = 'fam__p1'")
        order = [r[0] for r in su.execute(
            "select queue from awa.queue_meta where queue like 'fam%' order by ctid")]
        assert order.index("fam__p2") < order.index("fam__p1"), order
    with db.connect() as admin, db.connect(autocommit=False) as holder:
        holder.execute("select from awa.queue_meta where queue = 'fam__p1' for no key update")
        calls = [
            Call(db.connect(logins.producer, autocommit=False), lambda c: c.execute(
                "select duplicate from awa.enqueue_batch(array['fam__p1', 'fam__p2'],"
                " array['a', 'b'], unique_keys => array['k1', 'k2']::bytea[])").fetchall()),
            Call(db.connect(logins.operator, autocommit=False),
                 lambda c: c.execute(change).fetchall()),
        ]
        in_turn_behind(admin, holder, calls)
        batch, op = calls
        assert batch.error is None, batch.error
        assert op.error is None, op.error
        assert batch.result == [(False,), (False,)]
        assert admin.execute("select count(*) from awa.queue_meta"
                             " where queue like 'fam__p%' and unique_jobs").fetchone()[0] == 2


def _key_of_partition(partition: int) -> bytes:
    return next(k for k in (f"o{i}".encode() for i in range(1000))
                if routing.partition_for_ordering_key(k, 2) == partition)


@pytest.mark.parametrize("first", [
    "select awa.set_retention('low', '1 hour', '1 day')",
    # One job in each partition, by their ordering keys.
    "select duplicate from awa.enqueue_batch(array['low', 'low'], array['a', 'b'],"
    " ordering_keys => array[%s, %s]::bytea[], unique_keys => array['k1', 'k2']::bytea[])",
], ids=["retention", "first keyed batch"])
def test_a_partition_older_than_its_root_is_locked_after_it_by_every_call(db, logins, first):
    """low__p1 was a queue of its own before low was made, then joined it
    as a partition: its queue_id is below its root's. A pause locks the
    row it is named by (the root) first, then the family; a retention or a
    first keyed batch locked the family by queue_id, the partition first.
    With the partition's row held by a third session, the first call waits
    for it, the pause behind the first call (or, by queue_id, holding the
    root and waiting for the partition): once the holder ends, both
    finish, where by queue_id they deadlocked (40P01). Every call locks a
    family's rows root first, then partitions, then stripes."""
    _fast_deadlock_detection(db)
    with db.connect(logins.producer) as p:
        enqueue(p, "low__p1", "first")
        enqueue(p, "low", "then")
    with db.connect() as su:
        su.execute("select * from awa.set_queue_partitions('low', 2)")
        ids = dict(su.execute("select queue, queue_id from awa.queue_meta"
                              " where queue in ('low', 'low__p1')").fetchall())
        assert ids["low__p1"] < ids["low"], ids
        role = logins.producer if "enqueue_batch" in first else logins.operator
    with db.connect() as admin, db.connect(autocommit=False) as holder:
        holder.execute("select from awa.queue_meta where queue = 'low__p1' for no key update")
        calls = [
            Call(db.connect(role, autocommit=False), lambda c: c.execute(
                first, [_key_of_partition(0), _key_of_partition(1)] if "%s" in first else None
            ).fetchall()),
            Call(db.connect(logins.operator, autocommit=False),
                 lambda c: c.execute("select awa.pause_queue('low')").fetchall()),
        ]
        in_turn_behind(admin, holder, calls)
        for call in calls:
            assert call.error is None, call.error
        assert admin.execute("select bool_and(paused) from awa.queue_meta"
                             " where queue in ('low', 'low__p1')").fetchone()[0]
        if "enqueue_batch" in first:
            assert admin.execute("select count(*) from awa.queue_meta where unique_jobs"
                                 " and queue in ('low', 'low__p1')").fetchone()[0] == 2


def test_a_key_given_back_while_a_batch_waits_for_an_earlier_key_is_taken(db, logins):
    """A batch settles its keys one at a time, in key order. While it waits
    for the row of its first key (K1, whose window has passed, locked by
    another transaction), the live holder of its second key (K2) fails for
    good, which deletes K2's row: the batch then takes K2 for its own job,
    which must not go in holding no key."""
    with db.connect(logins.producer) as p:
        enqueue(p, "gone", "done", unique_key=b"K1", unique_window="1 hour")
        enqueue(p, "gone", "held", unique_key=b"K2", max_attempts=1)
    with db.connect() as admin, db.connect(logins.worker, autocommit=False) as w, \
            db.connect(autocommit=False) as locker:
        jobs = {r[6]: r for r in claim(w, ["gone"], 2)}
        assert w.execute("select awa.complete(%s, %s)", jobs["done"][:2]).fetchone()[0]
        w.commit()
        admin.execute("update awa.unique_keys set held_until = now() - interval '1 second'"
                      " where unique_key = 'K1'")
        locker.execute("select from awa.unique_keys where unique_key = 'K1' for update")
        producer = Call(db.connect(logins.producer, autocommit=False), lambda c: c.execute(
            "select * from awa.enqueue_batch(array['gone', 'gone'], array['a', 'b'],"
            " unique_keys => array['K2', 'K1']::bytea[])").fetchall())
        producer.start()
        wait_until(lambda: waits_for_a_lock(admin, producer.pid),
                   what="the batch to wait for K1's row")
        # A batch that locked K2's row would hold this fail until it
        # commits, which waits for K1: the timeout makes that a failure.
        w.execute("set local lock_timeout = '5s'")
        w.execute("select awa.fail(%s, %s, 'boom')", jobs["held"][:2])
        w.commit()
        locker.rollback()
        producer.join(timeout=30)
        assert not producer.is_alive() and producer.error is None, producer.error
        held = dict(admin.execute("select u.unique_key, r.kind from awa.unique_keys as u"
                                  " join awa.ready as r using (job_id)").fetchall())
        assert held == {b"K1": "b", b"K2": "a"}


def test_a_key_given_back_behind_a_batch_does_not_deadlock_it_with_another(db, logins):
    """Two single-call transactions never deadlock over keys. A batch [A, B, D]
    once took its keys in one INSERT, in key order, then took again, in a
    second pass, any key given back meanwhile: holding B, it waited for A,
    which a second batch [A, B] had taken after A's holder was cancelled,
    while that batch waited for B: 40P01. Each key is settled before the
    next now: A was held when the first batch read it, so its element is a
    duplicate, and the second batch takes A and waits for B, then finds it
    held."""
    _fast_deadlock_detection(db)
    with db.connect(logins.producer) as p:
        x = put(p, "dk", b"A")
    with db.connect() as admin, db.connect(logins.producer, autocommit=False) as t0, \
            db.connect(logins.operator) as op:
        d = put(t0, "dk", b"D")

        def both(keys):
            return lambda c: batch(c, ["dk"] * len(keys), keys)

        t1 = Call(db.connect(logins.producer, autocommit=False), both([b"A", b"B", b"D"]))
        t1.start()
        wait_until(lambda: waits_for_a_lock(admin, t1.pid), what="batch 1 to wait for D")
        assert op.execute("select awa.cancel_job(%s)", [x["job_id"]]).fetchone()[0]
        t2 = Call(db.connect(logins.producer, autocommit=False), both([b"A", b"B"]))
        t2.start()
        wait_until(lambda: waits_for_a_lock(admin, t2.pid), what="batch 2 to wait for B")
        t0.commit()
        for t in (t1, t2):
            t.join(timeout=30)
            assert not t.is_alive() and t.error is None, t.error
        first, second = t1.result, t2.result
        assert [r["duplicate"] for r in first] == [True, False, True]
        assert first[0]["job_id"] == x["job_id"] and first[2]["job_id"] == d["job_id"]
        assert [r["duplicate"] for r in second] == [False, True]
        assert second[1]["job_id"] == first[1]["job_id"]
        holders = dict(admin.execute("select unique_key, job_id from awa.unique_keys"
                                     " where queue = 'dk'").fetchall())
        assert holders == {b"A": second[0]["job_id"], b"B": first[1]["job_id"],
                           b"D": d["job_id"]}


def test_a_copy_of_several_passes_takes_its_keys_before_its_first_lane(db, logins):
    """COPY's batch mover moves a load 10,000 rows a pass. Each pass took its
    own rows' keys, the second while it held the first's lanes: a single
    keyed enqueue that took the second pass's key and waited for a lane the
    first pass held deadlocked with the load (40P01). A load of several
    passes takes all its keys before its first lane now: the single
    enqueue waits for the load's key instead, and is its duplicate."""
    _fast_deadlock_detection(db)
    with db.connect(logins.producer) as p:
        enqueue(p, "kp", "seed")
    with db.connect() as admin, db.connect(logins.producer, autocommit=False) as holder:
        lanes = admin.execute("select lane_ids[1][0], lane_ids[2][0] from awa.queue_meta"
                              " where queue = 'kp'").fetchone()
        # The first pass takes the lanes of priorities 1 and 2 in lane order:
        # with the higher one held, it holds the lower one and waits.
        low = 1 if lanes[0] < lanes[1] else 2
        enqueue(holder, "kp", "holder", priority=3 - low)

        def load(c: psycopg.Connection) -> int:
            with c.cursor().copy("copy awa.copy_staging (queue, priority, kind, unique_key)"
                                 " from stdin") as cp:
                for i in range(10_000):
                    cp.write_row(["kp", 1 + i % 2, "row", None])
                cp.write_row(["kp", low, "keyed", b"k"])  # COPY row 10,001: the second pass
                cp.write_row(["kp", low, "row", None])
            return c.execute("select awa.enqueue_copied()").fetchone()[0]

        copy = Call(db.connect(logins.producer, autocommit=False), load)
        copy.start()
        wait_until(lambda: waits_for_a_lock(admin, copy.pid),
                   what="the load's first pass to wait for the held lane")
        single = Call(db.connect(logins.producer, autocommit=False),
                      lambda c: put(c, "kp", b"k", priority=low))
        single.start()
        wait_until(lambda: waits_for_a_lock(admin, single.pid),
                   what="the single enqueue to wait (for the load's key)")
        holder.commit()
        for t in (copy, single):
            t.join(timeout=30)
            assert not t.is_alive() and t.error is None, t.error
        assert copy.result == 10_002
        keyed, = admin.execute("select job_id from awa.ready where kind = 'keyed'").fetchone()
        assert single.result["duplicate"] and single.result["job_id"] == keyed
        assert admin.execute("select job_id from awa.unique_keys where queue = 'kp'"
                             ).fetchall() == [(keyed,)]
        assert live(admin, "kp") == 10_004  # the seed, the holder's job and the load


def test_the_keys_of_a_queue_that_joins_a_family_stay_unique_in_it(db, logins):
    """jq__p1, a queue of its own with a ready job holding key K, becomes
    partition 1 of jq (made after it): its key moves to jq's scope, so an
    enqueue of K to either name reports the holder instead of taking K a
    second time."""
    with db.connect(logins.producer) as p:
        held = enqueue(p, "jq__p1", "held", unique_key=b"K")[0]
        enqueue(p, "jq", "other")
    with db.connect() as su:
        su.execute("select * from awa.set_queue_partitions('jq', 2)")
        assert su.execute("select queue, job_id from awa.unique_keys where unique_key = 'K'"
                          ).fetchall() == [("jq", held)]
    with db.connect(logins.producer) as p:
        for name in ("jq__p1", "jq"):
            again = p.execute("select job_id, duplicate from awa.enqueue(%s, 'again',"
                              " unique_key => 'K')", [name]).fetchone()
            assert again == (held, True), name


def test_a_key_the_family_takes_while_a_queue_joins_it_is_the_same_refusal(db, logins):
    """kq__p1 holds K; a producer's transaction takes K in kq (keyed jobs
    there already) and is open while kq__p1 joins kq: the join's check does
    not see it, its move of K waits for it at the key's index entry, and
    when it commits the move failed with 23505 from the index. It is the
    same clash, 55006, and nothing changes."""
    with db.connect(logins.producer) as p:
        enqueue(p, "kq", "seed", unique_key=b"S")
        enqueue(p, "kq__p1", "a", unique_key=b"K")
    holder = db.connect(logins.producer, autocommit=False)
    enqueue(holder, "kq", "b", unique_key=b"K")
    join = Call(db.connect(logins.operator, autocommit=False),
                lambda c: c.execute("select * from awa.set_queue_partitions('kq', 2)").fetchall())
    with db.connect() as watch:
        in_turn_behind(watch, holder, [join])
    assert join.error is not None and join.error.sqlstate == "55006", join.error
    assert join.error.diag.message_primary == (
        "queue 'kq__p1' and 'kq' both hold a unique key: 'kq__p1' cannot join 'kq'")
    with db.connect() as su:
        assert su.execute("select queue from awa.unique_keys where unique_key = 'K'"
                          " order by queue").fetchall() == [("kq",), ("kq__p1",)]
        assert su.execute("select partitions from awa.queue_meta where queue = 'kq'"
                          ).fetchone()[0] == 1


def test_a_queue_whose_keys_its_new_family_holds_too_joins_it_once_one_holds_nothing(
        db, logins):
    """kq__p1 and kq each have a job holding key K: as one family they could
    not both be unique, so kq__p1 cannot become kq's partition (55006 naming
    the key) and nothing changes. Once kq's job completed and its window
    passed, its row of K holds nothing, gives way, and kq__p1 joins with K."""
    with db.connect(logins.producer) as p:
        held = enqueue(p, "kq__p1", "a", unique_key=b"K")[0]
        enqueue(p, "kq", "b", unique_key=b"K", unique_window="1 second")
    with db.connect() as su:
        before = su.execute("select * from awa.unique_keys order by queue").fetchall()
        with pytest.raises(psycopg.errors.ObjectInUse) as err:
            su.execute("select * from awa.set_queue_partitions('kq', 2)")
        assert err.value.diag.message_primary == (
            "queue 'kq__p1' and 'kq' both hold unique key \\x4b: 'kq__p1' cannot join 'kq'")
        assert su.execute("select * from awa.unique_keys order by queue").fetchall() == before
        assert su.execute("select partitions from awa.queue_meta where queue = 'kq'"
                          ).fetchone()[0] == 1
    with db.connect(logins.worker) as w:
        [job] = claim(w, ["kq"], 1)
        assert w.execute("select awa.complete(%s, %s)", job[:2]).fetchone()[0]
    with db.connect() as su:
        su.execute("update awa.unique_keys set held_until = now() - interval '1 second'"
                   " where queue = 'kq'")
        su.execute("select * from awa.set_queue_partitions('kq', 2)")
        assert su.execute("select queue, job_id from awa.unique_keys where unique_key = 'K'"
                          ).fetchall() == [("kq", held)]


@pytest.mark.parametrize("path", ["single", "batch"])
def test_a_key_held_in_a_partition_made_by_the_holders_transaction_is_a_duplicate(
        db, logins, path):
    """One transaction partitions uq and takes key U in a partition it just
    made; a producer's enqueue of U waits for it. The single call read the
    holder's queue in the statement that waited, whose snapshot cannot see
    that partition: it found no holder and inserted a second job of U."""
    queue = f"uq_{path}"
    call = {
        "single": "select job_id, queue, duplicate from awa.enqueue(%s, 'again',"
                  " unique_key => 'U')",
        "batch": "select job_id, queue, duplicate from awa.enqueue_batch(array[%s],"
                 " array['again'], unique_keys => array['U']::bytea[])",
    }[path]
    with db.connect(logins.producer) as p:
        enqueue(p, queue, "warm")
    with db.connect() as admin, db.connect(autocommit=False) as holder:
        holder.execute("select * from awa.set_queue_partitions(%s, 4)", [queue])
        held, partition, _ = holder.execute(
            "select job_id, queue, duplicate from awa.enqueue(%s, 'held', ordering_key => %s,"
            " unique_key => 'U')", [queue, routing_key_of_partition(3, 4)]).fetchone()
        assert partition == f"{queue}__p3"
        producer = Call(db.connect(logins.producer, autocommit=False),
                        lambda c: c.execute(call, [queue]).fetchall())
        in_turn_behind(admin, holder, [producer])
        assert producer.error is None, producer.error
        assert producer.result == [(held, partition, True)]
        assert admin.execute(
            "select count(*) from awa.ready as r join awa.queue_meta as m using (queue_id)"
            " where r.kind in ('held', 'again')").fetchone()[0] == 1


def routing_key_of_partition(partition: int, partitions: int) -> bytes:
    return next(k for k in (f"y{i}".encode() for i in range(1000))
                if routing.partition_for_ordering_key(k, partitions) == partition)
