"""awa.claim under concurrency, and the Python Worker's claim loop, on real
PostgreSQL 17 and 18: no short claim while claimable rows exist, FIFO within
every lane, what a claimer's rollback does to that order, and a cost that
does not follow the dead rows."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

import awa_sql
from awa_sql.worker import Worker
from tests.support.waiting import wait_until

CLAIM = ("select job_id, run_lease, queue, priority, enqueue_shard, lane_seq"
         " from awa.claim(%s, %s, %s)")


@pytest.fixture
def logins(db) -> dict[str, str]:
    return {cap: db.login_role(f"awa_{cap}") for cap in ("producer", "worker", "operator")}


def fill(db, logins, queue: str, jobs: int, shards: int, priorities=(2,)) -> None:
    """``jobs`` keyed jobs spread over ``shards`` lanes per priority."""
    with db.connect(logins["operator"]) as op:
        op.execute("select awa.set_enqueue_shards(%s, %s)", [queue, shards])
    rng = random.Random(jobs)
    with db.connect(logins["producer"]) as p:
        for start in range(0, jobs, 500):
            n = min(500, jobs - start)
            p.execute("select awa.enqueue_batch(array_fill(%s::text, array[%s]),"
                      " array_fill('job'::text, array[%s]), priorities => %s::smallint[],"
                      " ordering_keys => %s::bytea[])",
                      [queue, n, n, [rng.choice(priorities) for _ in range(n)],
                       [f"k{rng.randrange(10_000)}".encode() for _ in range(n)]])


@pytest.mark.parametrize("max_jobs", [1, 10])
@pytest.mark.parametrize("workers", [2, 8])
@pytest.mark.parametrize("shards, priorities", [(4, (2,)), (1, (1, 2, 3, 4))],
                         ids=["S4", "S1"])
def test_workers_drain_with_no_empty_claim_and_fifo_per_lane(
        db, logins, workers, max_jobs, shards, priorities):
    """4 lanes hold jobs (S = 4 at one priority: claims walk them from a random lane; S = 1 at
    four priorities: claims go lane by lane); 2 workers (fewer than the
    lanes) or 8 (more) claim and complete in separate transactions. A claim
    comes back short only once every job is claimed or held by another
    worker's claim in flight; every job completes exactly once; within a
    lane, a job is never claimed after a later one of its lane was claimed
    by a claim that ended before this one began."""
    total = 3000
    fill(db, logins, "drain", total, shards=shards, priorities=priorities)
    lock = threading.Lock()
    claimed_count = 0
    short_claims: list[int] = []  # jobs still unclaimed when a claim came back short
    # (lane, lane_seq) -> (job_id, worker, call start, call end)
    seen: dict[tuple, tuple[int, int, float, float]] = {}
    per_worker: dict[int, dict[tuple, list[int]]] = defaultdict(lambda: defaultdict(list))

    def work(index: int) -> None:
        nonlocal claimed_count
        with db.connect(logins["worker"]) as conn:
            while True:
                start = time.monotonic()
                rows = conn.execute(CLAIM, [["drain"], max_jobs, f"w{index}"]).fetchall()
                end = time.monotonic()
                with lock:
                    claimed_count += len(rows)
                    remaining = total - claimed_count
                    if len(rows) < max_jobs:
                        short_claims.append(remaining)
                    for job_id, _lease, queue, priority, shard, seq in rows:
                        lane = (queue, priority, shard)
                        assert (lane, seq) not in seen
                        seen[(lane, seq)] = (job_id, index, start, end)
                        per_worker[index][lane].append(seq)
                for job_id, lease, *_ in rows:
                    assert conn.execute("select awa.complete(%s, %s)",
                                        [job_id, lease]).fetchone()[0]
                if remaining == 0 and not rows:
                    return

    with ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(work, i) for i in range(workers)]:
            f.result()

    # A short claim while jobs remained: only the rows other workers' claims
    # held at that moment may be missing from it.
    in_flight = (workers - 1) * max_jobs
    assert all(r <= in_flight for r in short_claims), sorted(short_claims)[-5:]
    assert len(seen) == total
    with db.connect() as admin:
        assert admin.execute("select count(*), count(distinct job_id) from awa.finished"
                             " where state = 'completed'").fetchone() == (total, total)
        assert admin.execute("select count(*) from awa.ready").fetchone()[0] == 0
    lanes: dict[tuple, list[tuple[int, float, float]]] = defaultdict(list)
    for (lane, seq), (_job, _w, start, end) in seen.items():
        lanes[lane].append((seq, start, end))
    assert len(lanes) == 4
    for rows in lanes.values():
        rows.sort()
        # No job was claimed by a call that began after the call that claimed
        # a later job of its lane had ended: it was free then, and skipped.
        latest_start = float("-inf")
        for _seq, start, end in rows:
            assert latest_start <= end
            latest_start = max(latest_start, start)
    for lanes_of_worker in per_worker.values():  # one worker's claims per lane: in order
        for seqs in lanes_of_worker.values():
            assert seqs == sorted(seqs)


def test_rows_other_claims_hold_never_shorten_a_claim(db, logins):
    """Open claims hold the heads of every lane (more rows than one round
    reads); a claim of 10 still gets 10, the first free ones of each lane, by
    priority first."""
    fill(db, logins, "held", 400, shards=4, priorities=(1, 2, 3))
    holders = [db.connect(logins["worker"], autocommit=False) for _ in range(6)]
    try:
        held = {r[0] for h in holders for r in h.execute(CLAIM, [["held"], 5, "h"]).fetchall()}
        assert len(held) == 30
        with db.connect(logins["worker"]) as w:
            got = w.execute(CLAIM, [["held"], 10, "w"]).fetchall()
        assert len(got) == 10 and not {r[0] for r in got} & held
        # Nothing of a higher priority was left behind, and within each lane
        # no free row was skipped: every ready row ranks after what was taken.
        assert {r[3] for r in got} == {1}
        taken = {(r[2], r[3], r[4]): max(x[5] for x in got if x[2:5] == r[2:5]) for r in got}
        with db.connect() as admin:
            for (queue, priority, shard), seq in taken.items():
                assert admin.execute(
                    "select count(*) from awa.ready r join awa.lanes l using (lane_id)"
                    " join awa.queue_meta m on m.queue_id = l.queue_id"
                    " where m.queue = %s and l.priority = %s and l.shard = %s"
                    "   and r.lane_seq < %s and r.job_id <> all(%s)",
                    [queue, priority, shard, seq, list(held)]).fetchone()[0] == 0
    finally:
        for h in holders:
            h.rollback()
            h.close()


def test_a_rolled_back_claim_puts_the_job_back_at_its_place(db, logins):
    """FIFO per lane, and a claimer's rollback: the job is claimable again,
    with the same attempt, and the next claim takes it before the later jobs
    of its lane still waiting, though jobs behind it were claimed meanwhile."""
    with db.connect(logins["producer"]) as p:
        ids = [p.execute("select job_id from awa.enqueue('rb', 'job')").fetchone()[0]
               for _ in range(4)]
    with db.connect(logins["worker"], autocommit=False) as a, db.connect(logins["worker"]) as b:
        (first,) = a.execute(CLAIM, [["rb"], 1, "a"]).fetchall()
        assert first[0] == ids[0]
        assert [r[0] for r in b.execute(CLAIM, [["rb"], 1, "b"]).fetchall()] == [ids[1]]
        a.rollback()
        again = b.execute("select job_id, attempt from awa.claim(%s, 2, 'b')",
                          [["rb"]]).fetchall()
    assert again == [(ids[0], 1), (ids[2], 1)]


# Where a claim walks dead rows: the lanes and their hints.
LANE_RELATIONS = ["awa.ready", "awa.ready_pkey", "awa.lane_hints", "awa.lane_hints_lane_idx"]
FETCHED = ("select sum(pg_stat_get_xact_blocks_fetched(r::regclass))::int"
           " from unnest(%s::text[]) as r")


def claim_buffers(conn, queue: str, n: int = 1) -> int:
    """Buffers one claim of `n` reads from the lanes and their hints. Not
    awa.running's indexes: the claim inserts into them, and with the horizon
    held they gain a level once their dead entries fill one (a buffer per row
    claimed, a step in log scale, whatever the lanes hold)."""
    with conn.transaction():  # the counters of one transaction only grow
        before = conn.execute(FETCHED, [LANE_RELATIONS]).fetchone()[0]
        assert len(conn.execute("select from awa.claim(%s, %s, 'cost')",
                                [[queue], n]).fetchall()) == n
        return conn.execute(FETCHED, [LANE_RELATIONS]).fetchone()[0] - before


@pytest.mark.parametrize("shards", [1, 4])
def test_claim_cost_does_not_follow_dead_rows(db, logins, shards):
    """No vacuum runs, and an open transaction keeps every dead row visible
    to someone, so not even index entries can be marked dead: a claim after
    20,000 jobs went through the lanes reads what it read after 1,000, lane
    by lane at S = 1 and at S = 4."""
    fill(db, logins, "dead", 25_000, shards=shards)
    with db.connect() as admin, db.connect(autocommit=False) as horizon:
        admin.execute("alter table awa.ready set (autovacuum_enabled = off)")
        horizon.execute("select pg_current_xact_id()")
        with db.connect(logins["worker"]) as w:
            def run(jobs: int) -> None:
                for _ in range(jobs // 100):
                    w.execute("select awa.complete(job_id, run_lease)"
                              " from awa.claim(array['dead'], 100, 'w')")
            def typical(n: int) -> int:
                # At S > 1 each claim starts at a lane drawn at random, and the
                # lanes' hints stand at different distances from their heads:
                # the median of five claims, not one draw.
                return statistics.median(claim_buffers(w, "dead", n) for _ in range(5))

            run(1000)
            claim_buffers(w, "dead")
            early = typical(1), typical(10)
            run(20_000)
            claim_buffers(w, "dead")
            late = typical(1), typical(10)
        # The workers' statistics reach the counter when their backends flush them.
        wait_until(lambda: admin.execute(
            "select n_dead_tup >= 20000 from pg_stat_user_tables"
            " where relid = 'awa.ready'::regclass").fetchone()[0], what="20,000 dead rows")
        horizon.rollback()
    # Between a lane's hint and its first live row lie up to a hint step of
    # dead rows, a heap fetch each, in the early claims as in the late; at
    # S > 1 the lane drawn decides how many. Following the dead rows would
    # cost thousands (20,000 over the lanes).
    with db.connect() as admin:
        step = admin.execute("select awa._claim_hint_step()").fetchone()[0]
    slack = 10 + (step if shards > 1 else 0)
    assert late[0] <= early[0] + slack and late[1] <= early[1] + slack, (early, late)


HINT_ENTRIES = ("select pg_stat_get_xact_tuples_returned('awa.lane_hints_lane_idx'::regclass)"
                "::int")


def test_a_claim_reads_one_hint_however_often_the_hints_moved(db, logins):
    """Claim hints are rows inserted, never updated (ADR 030). With a
    transaction holding the horizon, no hint a claim moved up from can be
    removed; after hundreds of moves, a claim still reads one hint entry per
    lane it walks, from the top of the lane's index range, and each lane has
    one live hint."""
    fill(db, logins, "hints", 30_000, shards=1)
    with db.connect() as admin, db.connect(autocommit=False) as horizon:
        horizon.execute("select pg_current_xact_id()")
        with db.connect(logins["worker"]) as w:
            # A claim of 65 passes its lane's hint by 64 or more: each moves it.
            for _ in range(400):
                w.execute("select awa.complete(job_id, run_lease)"
                          " from awa.claim(array['hints'], 65, 'w')")
            with w.transaction():
                before = w.execute(HINT_ENTRIES).fetchone()[0]
                assert len(w.execute("select from awa.claim(array['hints'], 1, 'w')")
                           .fetchall()) == 1
                read = w.execute(HINT_ENTRIES).fetchone()[0] - before
        hints = admin.execute(
            "select count(*), min(head_seq) from awa.lane_hints h join awa.lanes l using (lane_id)"
            " join awa.queue_meta m using (queue_id) where m.queue = 'hints'").fetchone()
        horizon.rollback()
    # Priority 1's lane (no hint, nothing ready) and priority 2's.
    assert read <= 2, read
    assert hints[0] == 1 and hints[1] >= 400 * 64, hints


def test_concurrent_claims_move_a_lanes_hint_one_at_a_time(db, logins):
    """8 workers claim one job at a time from one lane (S = 1), so most claims
    find its hint passed and try to move it at once: none waits for another
    (each skips a hint another claim is moving), no claim comes back empty,
    the lane keeps few hints (one more for each claim that gave it its first
    hint at the same time as another: up to one per worker; claims read only
    the highest), and no hint stands above a job still ready."""
    fill(db, logins, "race", 3_000, shards=1)

    def work(_: int) -> int:
        # 2,000 of the 3,000 in all: the hints are checked against the rest.
        with db.connect(logins["worker"]) as w:
            return sum(w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                                 " from awa.claim(array['race'], 1, 'w') c").fetchone()[0]
                       for _ in range(250))

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(work, range(8))) == 2_000
    with db.connect() as admin:
        hints = admin.execute(
            "select l.lane_id, count(h.lane_id), max(h.head_seq) from awa.lanes l"
            " join awa.queue_meta m"
            " using (queue_id) left join awa.lane_hints h using (lane_id)"
            " where m.queue = 'race' and l.priority = 2 group by l.lane_id").fetchall()
        passed = admin.execute(
            "select count(*) from awa.ready r join (select lane_id, max(head_seq) as head_seq"
            " from awa.lane_hints group by lane_id) h using (lane_id)"
            " where r.lane_seq < h.head_seq").fetchone()[0]
        left = admin.execute("select count(*) from awa.ready").fetchone()[0]
    # The hint moved with the claims: some 2,000 rows up, within a step of the
    # first row still ready.
    assert len(hints) == 1 and 1 <= hints[0][1] <= 8 and hints[0][2] >= 1_900, hints
    assert left == 1_000 and passed == 0
    # That no claim waited is shown by the next test, deterministically.


def test_a_claim_does_not_wait_for_a_hint_another_claim_is_moving(db, logins):
    """Claim A moves its lane's hint and stays open; claim B, which finds the
    same hint passed and would move it too, skips it: under a lock_timeout of
    500 ms it returns its job at once instead of waiting for A (55P03)."""
    fill(db, logins, "race", 300, shards=1)
    with db.connect(logins["worker"]) as w:
        # The lane's first hint, at 101.
        assert w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                         " from awa.claim(array['race'], 100, 'w') c").fetchone()[0] == 100
    with db.connect() as admin:
        # 100 rows above the hint go without a claim (which moves no hint): the
        # next claim finds the hint a step or more behind the lane's head.
        admin.execute("delete from awa.ready"
                      " where lane_seq < (select min(lane_seq) + 100 from awa.ready)")
        step = admin.execute("select awa._claim_hint_step()").fetchone()[0]
        before = admin.execute("select max(head_seq) from awa.lane_hints").fetchone()[0]
    assert step <= 100, step
    with db.connect(logins["worker"], autocommit=False) as a, \
            db.connect(logins["worker"], autocommit=False) as b:
        (seq_a,) = a.execute("select lane_seq from awa.claim(array['race'], 1, 'a')").fetchone()
        # A holds the hint it moves up from (locked, then deleted): its xmax is A's.
        xid_a = a.execute("select pg_current_xact_id_if_assigned()::text::xid").fetchone()[0]
        with db.connect() as admin:
            moved_by = admin.execute("select xmax from awa.lane_hints where head_seq = %s",
                                     [before]).fetchone()[0]
        b.execute("set local lock_timeout = '500ms'")
        got = b.execute("select lane_seq from awa.claim(array['race'], 1, 'b')").fetchall()
        a.rollback()
        b.rollback()
    assert (before, seq_a) == (101, 201)
    assert moved_by == xid_a, "claim A did not move the hint"
    assert got == [(202,)]


# awa.running's slots (ADR 034): the statistics are kept by partition.
RUNNING_SLOTS = "select relid from pg_partition_tree('awa.running') where isleaf"


def running_buffers(conn, statement: str, params) -> int:
    """Heap buffers of awa.running's slots that one call reads."""
    with conn.transaction():
        fetched = (f"select sum(pg_stat_get_xact_blocks_fetched(relid))::int"
                   f" from ({RUNNING_SLOTS}) as s")
        before = conn.execute(fetched).fetchone()[0]
        assert conn.execute(statement, params).fetchone()[0] is True
        return conn.execute(fetched).fetchone()[0] - before


def test_finishing_a_job_does_not_follow_dead_rows(db, logins):
    """awa.running is small and churns, so autovacuum's statistics often
    see it nearly empty, and a plan built on them would scan its heap. With
    5,000 dead rows held (no vacuum can remove them), complete, fail and
    heartbeat each read a few of its buffers (the row by primary key; an
    update also looks for room for the new version), not every page."""
    fill(db, logins, "fin", 5_100, shards=1)
    with db.connect() as admin, db.connect(autocommit=False) as horizon:
        for (slot,) in admin.execute(RUNNING_SLOTS).fetchall():
            admin.execute(f"alter table {slot} set (autovacuum_enabled = off)")
        admin.execute("vacuum analyze awa.running")  # the statistics of an empty table
        horizon.execute("select pg_current_xact_id()")
        with db.connect(logins["worker"]) as w:
            for _ in range(50):
                w.execute("select awa.complete(job_id, run_lease)"
                          " from awa.claim(array['fin'], 100, 'w')")
            pages = admin.execute(f"select sum(pg_relation_size(relid))"
                                  f" / current_setting('block_size')::int"
                                  f" from ({RUNNING_SLOTS}) as s").fetchone()[0]
            assert pages > 50
            jobs = w.execute("select job_id, run_lease from awa.claim(array['fin'], 3, 'w')"
                             " order by job_id").fetchall()
            # Each twice: the second call of a statement in a session is the
            # one that runs the plan it keeps.
            reads = [running_buffers(w, "select awa.heartbeat(%s, %s, '1 minute')", jobs[0])
                     for _ in range(2)]
            reads.append(running_buffers(w, "select awa.complete(%s, %s)", jobs[0]))
            reads.append(running_buffers(w, "select awa.fail(%s, %s, 'e')", jobs[1]))
            reads.append(running_buffers(w, "select awa.complete(%s, %s)", jobs[2]))
        horizon.rollback()
    assert max(reads) <= 8, (pages, reads)


def test_worker_claims_in_batches_idles_quietly_and_wakes_for_new_jobs(db, logins):
    """The first claim fills all 4 slots at once (the 4 first handlers meet at
    a barrier, so they run at the same time); an idle worker polls once per
    queue with back-off, not once per slot in a loop; a job that arrives
    later is picked up."""
    with db.connect(logins["producer"]) as p:
        awa_sql.enqueue_many(p, [{"kind": "job"}] * 300, queue="wq")
    done: list[int] = []
    started: list[int] = []
    lock = threading.Lock()
    claims_when_4_ran: list[int] = []
    barrier = threading.Barrier(4, action=lambda: claims_when_4_ran.append(worker.claims))

    def handle(job):
        # The first four handlers to start, not the first four to finish: a
        # slot past the barrier may start its next job before the others
        # have recorded theirs.
        with lock:
            started.append(job.job_id)
            first_four = len(started) <= 4
        if first_four:
            barrier.wait(timeout=20)
        with lock:
            done.append(job.job_id)

    worker = Worker(db.dsn(logins["worker"]), queues=[{"queue": "wq", "max_workers": 4}],
                    handlers={"job": handle}, poll_interval=0.2, snapshot_every=None)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_until(lambda: len(done) == 300, what="300 jobs done")
        assert claims_when_4_ran == [1]
        # Idle: one claimer backing off to poll_interval, not 4 slots spinning.
        before = worker.claims
        time.sleep(1.0)  # the window observed, not a synchronisation
        assert worker.claims - before <= 12
        with db.connect(logins["producer"]) as p:
            awa_sql.enqueue(p, "job", queue="wq")
        wait_until(lambda: len(done) == 301, timeout=10, what="the late job")
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert len(set(done)) == 301 and worker.completed == 301
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.running").fetchone()[0] == 0


def test_claim_takes_family_last_by_position_or_by_name_with_the_grants_it_had(db, logins):
    """awa.claim took family as a fifth argument; its four-argument form is
    dropped (sql/retired.sql), and every call that named it by position or
    by name reaches the new one, which awa_worker alone may execute, as
    before."""
    with db.connect(logins["producer"]) as p:
        p.execute("select awa.enqueue_batch(array_fill('fam'::text, array[6]),"
                  " array_fill('k'::text, array[6]))")
    calls = [
        "awa.claim(array['fam'], 1, 'w')",
        "awa.claim(array['fam'], 1, 'w', '1 minute')",
        "awa.claim(array['fam'], 1, 'w', '1 minute', false)",
        "awa.claim(array['fam'], 1, 'w', family => false)",
        "awa.claim(queues => array['fam'], max_jobs => 1, worker => 'w', lease => '1 minute')",
        "awa.claim(family => true, worker => 'w', max_jobs => 1, queues => array['fam'])",
    ]
    with db.connect(logins["worker"]) as w:
        for call in calls:
            assert len(w.execute(f"select * from {call}").fetchall()) == 1, call
    with db.connect() as su:
        old, acl, complete_acl = su.execute(
            "select to_regprocedure('awa.claim(text[], integer, text, interval)'),"
            " (select proacl::text from pg_proc"
            "   where oid = 'awa.claim(text[], integer, text, interval, boolean)'::regprocedure),"
            " (select proacl::text from pg_proc"
            "   where oid = 'awa.complete(bigint, bigint)'::regprocedure)").fetchone()
        assert old is None
        # The grants awa._grant_execute(..., 'worker') gives: awa.complete's.
        assert acl == complete_acl and "awa_worker=X/" in acl
        assert su.execute("select count(*) from pg_proc where proname = 'claim'"
                          " and pronamespace = 'awa'::regnamespace").fetchone()[0] == 1
    with db.connect(logins["producer"]) as p, pytest.raises(
            psycopg.errors.InsufficientPrivilege):
        p.execute("select * from awa.claim(array['fam'], 1, 'w', family => false)")
