"""Enqueue, claim and finish on real PostgreSQL 17 and 18, as the runtime roles;
``awa storage set-enqueue-shards`` with a bad or a new queue name; ``awa storage
pause`` and ``resume``."""

from __future__ import annotations

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest

from awa_sql import routing
from tests.support.jobs import claim, claim_all, enqueue


def test_s1_is_strict_fifo_in_commit_order_with_8_producers(db, logins):
    """claim order == lane_seq order == commit order at S = 1."""
    per_producer = 150

    def produce(p):
        with db.connect(logins.producer) as conn:
            for i in range(per_producer):
                enqueue(conn, "fifo", args=psycopg.types.json.Jsonb({"p": p, "i": i}))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(produce, range(8)))
    with db.connect() as admin:
        committed = admin.execute(
            "select r.lane_seq from awa.ready r order by pg_xact_commit_timestamp(r.xmin),"
            " r.lane_seq").fetchall()
    with db.connect(logins.worker) as conn:
        claimed = [c for batch in iter(lambda: claim(conn, ["fifo"], 37), []) for c in batch]
    seqs = [c[5] for c in claimed]
    assert len(seqs) == 8 * per_producer
    assert seqs == sorted(seqs)
    assert [s for (s,) in committed] == seqs
    for p in range(8):  # each producer's own jobs in its own order
        mine = [c[7]["i"] for c in claimed if c[7]["p"] == p]
        assert mine == list(range(per_producer))


def test_s4_fifo_within_each_lane_and_one_key_one_lane(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('orders', 4)")
    keys = [f"customer-{i}" for i in range(12)]
    sent = []
    with db.connect(logins.producer) as conn:
        for i in range(240):
            key = keys[i % len(keys)]
            row = enqueue(conn, "orders", ordering_key=key.encode(),
                          args=psycopg.types.json.Jsonb({"key": key, "i": i}))
            assert row[3] == routing.shard_for_ordering_key(key, 4)
            sent.append(row)
    with db.connect(logins.worker) as conn:
        claimed = claim_all(conn, ["orders"], 7)
    assert len(claimed) == 240
    by_shard: dict[int, list[int]] = {}
    by_key: dict[str, list[int]] = {}
    for c in claimed:
        by_shard.setdefault(c[4], []).append(c[5])
        by_key.setdefault(c[7]["key"], []).append(c[7]["i"])
    assert set(by_shard) == {0, 1, 2, 3}
    for seqs in by_shard.values():
        assert seqs == sorted(seqs)
    for key, order in by_key.items():
        assert order == sorted(order)
        assert {c[4] for c in claimed if c[7]["key"] == key} == {
            routing.shard_for_ordering_key(key, 4)}


def test_gaps_from_rolled_back_reservations_never_stall_a_lane(db, logins):
    with db.connect(logins.producer, autocommit=False) as conn:
        enqueue(conn, "gaps", args=psycopg.types.json.Jsonb({"n": 1}))
        conn.commit()
        enqueue(conn, "gaps", args=psycopg.types.json.Jsonb({"n": "rolled back"}))
        conn.rollback()
        enqueue(conn, "gaps", args=psycopg.types.json.Jsonb({"n": 2}))
        conn.commit()
    with db.connect(logins.worker) as conn:
        got = claim_all(conn, ["gaps"])
    assert [c[7]["n"] for c in got] == [1, 2]
    assert [c[5] for c in got] == [1, 3]  # seq 2 is a gap nobody waits for


def test_a_lane_at_or_above_the_current_s_is_still_claimed(db, logins):
    key = b"order:1001"  # shard 1 at S = 4
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('drain', 4)")
    with db.connect(logins.producer) as conn:
        row = enqueue(conn, "drain", ordering_key=key)
    assert row[3] == 1
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('drain', 1)")
        draining = op.execute(
            "select draining, ready from awa.lane_overview where queue = 'drain'"
            " and shard = 1 and priority = 2").fetchone()
        assert draining == (True, 1)
    with db.connect(logins.worker) as conn:
        got = claim_all(conn, ["drain"])
    assert [(c[0], c[4]) for c in got] == [(row[0], 1)]


def test_priority_first_then_fifo_within_each_lane(db, logins):
    """At S = 4: the priority 1 job first, the priority 4 job last, and the
    two jobs of customer-42 (one lane) in their order; between lanes of one
    priority there is no order (partitioned FIFO)."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('prio', 4)")
    with db.connect(logins.producer) as conn:
        low = enqueue(conn, "prio", priority=4, ordering_key=b"a")
        first = enqueue(conn, "prio", ordering_key=b"customer-42")
        second = enqueue(conn, "prio", ordering_key=b"order:1001")
        third = enqueue(conn, "prio", ordering_key=b"customer-42")
        urgent = enqueue(conn, "prio", priority=1)
    with db.connect(logins.worker) as conn:
        order = [c[0] for c in claim_all(conn, ["prio"], 2)]
    assert order[0] == urgent[0] and order[-1] == low[0]
    assert sorted(order[1:4]) == sorted([first[0], second[0], third[0]])
    assert order.index(first[0]) < order.index(third[0])


def test_unkeyed_rows_prefer_a_free_lane_and_a_transaction_keeps_its_lane(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('spread', 2)")
    a = db.connect(logins.producer, autocommit=False)
    a_first = enqueue(a, "spread")
    # b's sticky lane is the one a holds (pid mod S), so b must find the other.
    spare = []
    while True:
        b = db.connect(logins.producer, autocommit=False)
        if b.execute("select pg_backend_pid() % 2").fetchone()[0] == a_first[3]:
            break
        spare.append(b)
    for c in spare:
        c.close()
    try:
        b.execute("set lock_timeout = '200ms'")  # waiting would fail: it must not wait
        b_row = enqueue(b, "spread")
        assert b_row[3] != a_first[3]
        assert enqueue(a, "spread")[3] == a_first[3]
        assert enqueue(b, "spread")[3] == b_row[3]
        a.commit()
        b.commit()
    finally:
        a.close()
        b.close()


def test_paused_queue_yields_nothing_and_resumes(db, logins):
    with db.connect(logins.producer) as conn:
        enqueue(conn, "pausable")
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.pause_queue('pausable')").fetchone()[0] is True
        assert op.execute("select awa.pause_queue('pausable')").fetchone()[0] is False
    with db.connect(logins.worker) as conn:
        assert claim(conn, ["pausable"]) == []
    with db.connect(logins.operator) as op:
        assert op.execute("select awa.resume_queue('pausable')").fetchone()[0] is True
    with db.connect(logins.worker) as conn:
        assert len(claim(conn, ["pausable"])) == 1


def test_complete_fail_retry_heartbeat_and_stale_leases(db, logins):
    with db.connect(logins.producer) as conn:
        job = enqueue(conn, "life", max_attempts=2, ordering_key=b"k")[0]
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        (c1,) = claim(w, ["life"])
        assert c1[0] == job and c1[8] == 1
        assert w.execute("select awa.heartbeat(%s, %s, '1 hour')", [job, c1[1]]).fetchone()[0]
        assert not w.execute("select awa.heartbeat(%s, %s, '1 hour')",
                             [job, c1[1] + 999]).fetchone()[0]
        before = w.execute("select clock_timestamp()").fetchone()[0]
        assert w.execute("select awa.fail(%s, %s, 'boom')", [job, c1[1]]).fetchone()[0]
        after = w.execute("select clock_timestamp()").fetchone()[0]
        assert not w.execute("select awa.complete(%s, %s)", [job, c1[1]]).fetchone()[0]
        run_at, err = admin.execute(
            "select run_at, last_error from awa.scheduled where job_id = %s", [job]
        ).fetchone()
        # The default backoff after attempt 1: 2 s, half of it drawn at random.
        assert err == "boom"
        assert before + timedelta(seconds=1) <= run_at <= after + timedelta(seconds=2)
        assert claim(w, ["life"]) == []  # waits for its backoff
        admin.execute("update awa.scheduled set run_at = now() where job_id = %s", [job])
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
        (c2,) = claim(w, ["life"])
        assert c2[0] == job and c2[8] == 2 and c2[1] != c1[1] and c2[10] == b"k"
        assert w.execute("select awa.fail(%s, %s, 'boom again')", [job, c2[1]]).fetchone()[0]
        assert admin.execute(
            "select state, attempt, last_error from awa.finished where job_id = %s", [job]
        ).fetchone() == ("failed", 2, "boom again")


def test_future_jobs_wait_outside_the_lanes_until_promoted(db, logins):
    with db.connect(logins.producer) as conn:
        row = enqueue(conn, "later", run_at="2100-01-01T00:00:00Z")
    assert row[3] is None and row[4] is None
    with db.connect(logins.worker) as w, db.connect(logins.maintenance) as m, \
            db.connect() as admin:
        assert claim(w, ["later"]) == []
        assert m.execute("select awa.promote_due()").fetchone()[0] == 0
        admin.execute("update awa.scheduled set run_at = now() - interval '1 second'")
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
        assert [c[0] for c in claim(w, ["later"])] == [row[0]]


def test_a_retried_keyed_job_goes_to_its_key_shard_under_the_new_s(db, logins):
    key = b"customer-42"
    with db.connect(logins.producer) as conn:
        job = enqueue(conn, "remap", ordering_key=key)[0]
    with db.connect(logins.worker) as w, db.connect(logins.operator) as op, \
            db.connect(logins.maintenance) as m, db.connect() as admin:
        (c,) = claim(w, ["remap"])
        assert c[4] == 0
        w.execute("select awa.fail(%s, %s, 'x', now())", [job, c[1]])
        op.execute("select awa.set_enqueue_shards('remap', 8)")
        admin.execute("update awa.scheduled set run_at = now()")
        m.execute("select awa.promote_due()")
        (again,) = claim(w, ["remap"])
    assert again[4] == routing.shard_for_ordering_key(key, 8) == 4


def test_batch_returns_rows_in_input_order_with_one_range_per_lane(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('batch', 4)")
    keys = [f"k{i % 5}".encode() for i in range(50)]
    with db.connect(logins.producer) as conn:
        rows = conn.execute(
            "select * from awa.enqueue_batch(%s, %s, ordering_keys => %s)",
            [["batch"] * 50, [f"kind{i}" for i in range(50)], keys]).fetchall()
    assert [r[3] for r in rows] == [routing.shard_for_ordering_key(k, 4) for k in keys]
    for shard in {r[3] for r in rows}:
        seqs = [r[4] for r in rows if r[3] == shard]
        assert seqs == list(range(1, len(seqs) + 1))  # one contiguous range, input order
    with db.connect(logins.worker) as w:
        claimed = claim_all(w, ["batch"])
    assert sorted(c[6] for c in claimed) == sorted(f"kind{i}" for i in range(50))


def test_batch_calls_in_opposite_key_orders_never_deadlock(db, logins):
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('nodeadlock', 8)")
    keys = [f"key-{i}".encode() for i in range(40)]
    assert len({routing.shard_for_ordering_key(k, 8) for k in keys}) == 8
    with db.connect() as admin:
        before = admin.execute(
            "select deadlocks from pg_stat_database where datname = current_database()"
        ).fetchone()[0]
    errors = []

    def producer(i):
        order = keys if i % 2 else list(reversed(keys))
        with db.connect(logins.producer, autocommit=False) as conn:
            for _ in range(40):
                try:
                    conn.execute(
                        "select * from awa.enqueue_batch(%s, %s, ordering_keys => %s)",
                        [["nodeadlock"] * len(order), ["k"] * len(order), order])
                    conn.execute("select pg_sleep(0.001)")  # hold the lanes a moment
                    conn.commit()
                except psycopg.Error as err:
                    errors.append(err.sqlstate)
                    conn.rollback()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(producer, range(8)))
    assert errors == []
    with db.connect() as admin:
        after = admin.execute(
            "select deadlocks from pg_stat_database where datname = current_database()"
        ).fetchone()[0]
        assert after == before
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 8 * 40 * 40


def test_nothing_lost_nothing_doubled(db, logins):
    """8 producers x 5,000 jobs with random rollbacks, 4 claimers completing, and
    one worker that dies mid-lease: every committed job completes exactly once."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('history', 4)")
    committed: list[int] = []
    rolled_back: list[int] = []
    lock = threading.Lock()

    def produce(p):
        rng = random.Random(p)
        sent = 0
        with db.connect(logins.producer, autocommit=False) as conn:
            while sent < 5000:
                n = min(rng.randint(1, 40), 5000 - sent)
                keyed = rng.random() < 0.5
                keys = [f"c{rng.randint(0, 99)}".encode() if keyed else None for _ in range(n)]
                ids = [r[0] for r in conn.execute(
                    "select * from awa.enqueue_batch(%s, %s, ordering_keys => %s::bytea[])",
                    [["history"] * n, ["k"] * n, keys]).fetchall()]
                if rng.random() < 0.2:
                    conn.rollback()
                    with lock:
                        rolled_back.extend(ids)
                else:
                    conn.commit()
                    with lock:
                        committed.extend(ids)
                sent += n

    # The worker that dies: claims, then its connection goes away.
    with db.connect(logins.producer) as conn:
        doomed_job = enqueue(conn, "history")[0]
    with db.connect(logins.worker) as dying:
        (doomed,) = claim(dying, ["history"], 1, worker="dying", lease="50 milliseconds")
    assert doomed[0] == doomed_job

    completed: list[int] = []
    stop = threading.Event()

    def consume(_):
        with db.connect(logins.worker) as conn:
            while True:
                # Read before the claim: an empty claim means done only if it
                # began after stop was set, so after the promote committed.
                stopping = stop.is_set()
                batch = claim(conn, ["history"], 50)
                if not batch and stopping:
                    return
                for c in batch:
                    assert conn.execute("select awa.complete(%s, %s)",
                                        [c[0], c[1]]).fetchone()[0]
                    with lock:
                        completed.append(c[0])

    with ThreadPoolExecutor(12) as pool:
        consumers = [pool.submit(consume, i) for i in range(4)]
        list(pool.map(produce, range(8)))
        with db.connect() as admin, db.connect(logins.maintenance) as m:
            admin.execute("select pg_sleep(greatest(0, extract(epoch from"
                          " (select lease_expires_at - clock_timestamp() from awa.running"
                          "   where job_id = %s))))", [doomed_job])
            assert m.execute("select awa.rescue_expired()").fetchone()[0] == 1
            admin.execute("update awa.scheduled set run_at = now() where job_id = %s",
                          [doomed_job])
            assert m.execute("select awa.promote_due()").fetchone()[0] == 1
        stop.set()
        for f in consumers:
            f.result()
    with db.connect(logins.worker) as w:
        assert not w.execute("select awa.complete(%s, %s)",
                             [doomed[0], doomed[1]]).fetchone()[0]
    assert sorted(completed) == sorted([*committed, doomed_job])
    assert len(completed) == len(set(completed))
    assert not set(rolled_back) & set(completed)
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0
        assert admin.execute("select attempt from awa.finished where job_id = %s",
                             [doomed_job]).fetchone()[0] == 2


def test_claim_cost_follows_lanes_not_history(db, logins):
    """A claim after 20,000 jobs went through a queue costs about what it cost
    after 10,000: the cost follows lanes, not history. Both are measured after
    a VACUUM (what autovacuum does on its cadence; awa.ready and awa.running
    are tuned for it). Between vacuums dead heads do cost: docs/benchmarks-history.md
    has the number."""
    # The claiming transaction's own reads of each awa relation (tables and
    # indexes): no other backend's, so not autovacuum's.
    stats = (
        "select c.relname, pg_stat_get_xact_blocks_fetched(c.oid) from pg_class as c"
        " join pg_namespace as n on n.oid = c.relnamespace"
        " where n.nspname = 'awa' and c.relkind in ('r', 'i')"
    )

    def claim_buffers() -> dict[str, int]:
        with db.connect(logins.worker) as w, w.transaction():
            before = dict(w.execute(stats).fetchall())
            assert len(claim(w, ["history-cost"], 1)) == 1
            after = dict(w.execute(stats).fetchall())
        return {t: after[t] - before.get(t, 0) for t in after if after[t] != before.get(t, 0)}

    def run_jobs(count: int) -> None:
        with db.connect(logins.producer) as p, db.connect(logins.worker) as w:
            for _ in range(count // 200):
                p.execute("select awa.enqueue_batch(array_fill('history-cost'::text,"
                          " array[200]), array_fill('k'::text, array[200]))")
                # Claimed and completed in one statement: the same rows go
                # through the lanes, into history, as by a worker's calls.
                assert w.execute(
                    "select count(*) filter (where awa.complete(c.job_id, c.run_lease))"
                    " from awa.claim(array['history-cost'], 200, 'w') as c").fetchone()[0] == 200

    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue_batch(array_fill('history-cost'::text, array[3]),"
                  " array_fill('k'::text, array[3]))")
    with db.connect() as admin:
        run_jobs(10_000)
        admin.execute("vacuum awa.ready, awa.running")
        after_10k = claim_buffers()
        run_jobs(10_000)
        admin.execute("vacuum awa.ready, awa.running")
        after_20k = claim_buffers()
    assert after_10k.get("ready_pkey") and after_20k.get("ready_pkey"), (after_10k, after_20k)
    assert sum(after_20k.values()) <= sum(after_10k.values()) * 1.5 + 10, (after_10k, after_20k)


# -- awa storage set-enqueue-shards: names it refuses, queues it creates --------------------


def _queues(db) -> list[str]:
    with db.connect() as admin:
        return [q for (q,) in admin.execute("select queue from awa.queue_meta order by queue")]


@pytest.mark.one_version
@pytest.mark.parametrize(("queue", "says"), [
    ("", "queue name must be 1 to 200 bytes, got an empty name"),
    ("x" * 201, "queue name must be 1 to 200 bytes, got 201 bytes"),
    ("orders#0", "queue name must not contain '#'"),
])
@pytest.mark.parametrize("mode", [[], ["--dry-run"], ["--auto", "--max", "4"]])
def test_set_enqueue_shards_refuses_a_bad_queue_name_as_jobs_list_does(
        db, logins, queue, says, mode):
    before = _queues(db)
    shards = [] if "--auto" in mode else ["--shards", "2"]
    result = db.awa("storage", "set-enqueue-shards", "--queue", queue, *shards, *mode, "--yes",
                    user=logins.operator)
    listed = db.awa("jobs", "list", "--queue", queue, user=logins.operator)
    assert (result.returncode, listed.returncode) == (2, 2), result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"awa: {says}"), result.stderr
    assert result.stderr.splitlines()[-1] == listed.stderr.strip()
    assert "CONTEXT" not in result.stderr and "PL/pgSQL" not in result.stderr
    assert _queues(db) == before


@pytest.mark.one_version
def test_set_enqueue_shards_says_when_it_creates_the_queue(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "known")
    dry = db.awa("storage", "set-enqueue-shards", "--queue", "nosuch", "--shards", "2",
                 "--dry-run", user=logins.operator, check=True)
    rows = [line.split() for line in dry.stdout.splitlines() if line.startswith("nosuch")]
    assert rows == [["nosuch", "(new", "queue)", "1", "2", "8"]], dry.stdout
    assert "There is no queue 'nosuch' yet: this creates it with S = 2." in dry.stdout
    unconfirmed = db.awa("storage", "set-enqueue-shards", "--queue", "nosuch", "--shards", "2",
                         user=logins.operator)
    assert unconfirmed.returncode == 2
    assert "Set S = 2 for nosuch, creating the queue?" in unconfirmed.stderr
    assert "nosuch" not in _queues(db)
    done = db.awa("storage", "set-enqueue-shards", "--queue", "nosuch", "--shards", "2", "--yes",
                  user=logins.operator, check=True)
    assert [line.split() for line in done.stdout.splitlines()
            if line.startswith("nosuch")][-1] == ["nosuch", "(new", "queue)", "1", "2", "8"]
    assert "nosuch" in _queues(db)
    for queue in ("nosuch", "known"):  # now both exist: nothing is marked
        again = db.awa("storage", "set-enqueue-shards", "--queue", queue, "--shards", "3",
                       "--yes", user=logins.operator, check=True)
        assert "new queue" not in again.stdout and "no queue" not in again.stdout


# -- awa storage pause / resume ------------------------------------------------------------


def _paused(db, queue) -> list[bool]:
    with db.connect() as admin:
        return [p for (p,) in admin.execute(
            "select paused from awa.queue_meta where coalesce(root_queue, logical_queue, queue)"
            " = %s order by queue", [queue])]


@pytest.mark.one_version
def test_storage_pause_and_resume_say_whether_they_changed_anything(db, logins):
    with db.connect(logins.producer) as p:
        job_id = enqueue(p, "pq")[0]
    with db.connect() as admin:
        admin.execute("select awa.set_queue_stripes('pq', 2)")
    assert _paused(db, "pq") == [False] * 3
    paused = db.awa("storage", "pause", "pq", user=logins.operator, check=True)
    assert paused.stdout.strip() == "paused pq"
    assert _paused(db, "pq") == [True] * 3  # the queue and its stripes
    with db.connect(logins.worker) as w:
        assert claim(w, ["pq"]) == []
    again = db.awa("storage", "pause", "--queue", "pq", user=logins.operator, check=True)
    assert again.stdout.strip() == "pq was already paused: nothing changed"
    as_json = db.awa("storage", "pause", "pq", "--json", user=logins.operator, check=True)
    assert json.loads(as_json.stdout) == {"queue": "pq", "paused": True, "changed": False}
    resumed = db.awa("storage", "resume", "pq", "--json", user=logins.operator, check=True)
    assert json.loads(resumed.stdout) == {"queue": "pq", "paused": False, "changed": True}
    assert _paused(db, "pq") == [False] * 3
    with db.connect(logins.worker) as w:
        assert [row[0] for row in claim(w, ["pq"])] == [job_id]
    twice = db.awa("storage", "resume", "pq", user=logins.operator, check=True)
    assert twice.stdout.strip() == "pq was not paused: nothing changed"


@pytest.mark.one_version
@pytest.mark.parametrize("command", ["pause", "resume"])
@pytest.mark.parametrize(("queue", "says"), [
    ("nosuch", "queue 'nosuch' does not exist [42704]"),
    ("", "queue name must be 1 to 200 bytes, got an empty name"),
    ("orders#0", "queue name must not contain '#'"),
])
def test_storage_pause_and_resume_refuse_an_unknown_or_bad_queue_naming_it(
        db, logins, command, queue, says):
    before = _queues(db)
    result = db.awa("storage", command, queue, user=logins.operator)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]], result.stderr
    assert result.stderr.startswith(f"awa: {says}"), result.stderr
    assert "Traceback" not in result.stderr and "CONTEXT" not in result.stderr
    assert result.stdout == ""
    assert _queues(db) == before


@pytest.mark.one_version
@pytest.mark.parametrize(("args", "says"), [
    ([], "awa: give the queue to pause: awa storage pause QUEUE"),
    (["pq", "--queue", "other"], "awa: give the queue once: 'pq' or --queue 'other'"),
])
def test_storage_pause_needs_one_queue(db, logins, args, says):
    with db.connect(logins.producer) as p:
        enqueue(p, "pq")
    result = db.awa("storage", "pause", *args, user=logins.operator)
    assert (result.returncode, result.stderr.strip()) == (2, says)
    assert _paused(db, "pq") == [False]


@pytest.mark.one_version
def test_storage_pause_without_awa_operator_is_refused_as_the_other_commands_are(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "pq")
    refused = db.awa("storage", "pause", "pq", user=logins.reader)
    assert refused.returncode == 7, refused.stderr
    assert refused.stderr.startswith("awa: InsufficientPrivilege [42501]: permission denied "
                                     "for function pause_queue"), refused.stderr
    assert _paused(db, "pq") == [False]
