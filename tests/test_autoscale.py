"""The enqueue-shard auto-scaler: awa.set_shard_mode, awa.autoscale_tick and
its decision log, with lane waits made by real producers blocked on real
lane locks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest

from awa_sql import shards
from tests.support.jobs import (
    Call,
    claim,
    claim_all,
    enqueue,
    key_for_shard,
    lane_waiters,
    waits_for_a_lock,
)
from tests.support.reads import rows_read
from tests.support.waiting import wait_until


def shards_of(db, queue: str) -> int:
    with db.connect() as admin:
        return admin.execute("select enqueue_shards from awa.queue_meta where queue = %s",
                             [queue]).fetchone()[0]


POLICY_TYPES = {"grow_window": "interval", "grow_wait_share": "numeric",
                "grow_waiters": "numeric", "shrink_window": "interval",
                "shrink_wait_share": "numeric", "cooldown": "interval", "min_samples": "integer"}


def policy_args(settings: dict) -> str:
    return ", ".join(f"{k} => %({k})s::{POLICY_TYPES[k]}" for k in settings)


def policy(db, operator: str, queue: str, **settings) -> None:
    args = policy_args(settings)
    with db.connect(operator) as op:
        op.execute(f"select awa.set_autoscale_policy(%(queue)s, {args})",
                   {"queue": queue, **settings})


class Contention:
    """Real lane waits on every active lane of a queue: one producer holds
    each lane in an open transaction and ``waiters`` more queue behind it."""

    def __init__(self, db, role: str, queue: str, waiters: int = 2):
        self.db, self.role, self.queue, self.waiters = db, role, queue, waiters
        self.holders: list[psycopg.Connection] = []
        self.pool = ThreadPoolExecutor(64)
        self.futures = []

    def _wait_behind(self, key: bytes) -> None:
        with self.db.connect(self.role) as conn:
            enqueue(conn, self.queue, ordering_key=key)

    def __enter__(self) -> Contention:
        shards = shards_of(self.db, self.queue)
        for shard in range(shards):
            key = key_for_shard(shard, shards)
            holder = self.db.connect(self.role, autocommit=False)
            enqueue(holder, self.queue, ordering_key=key)
            self.holders.append(holder)
            self.futures += [self.pool.submit(self._wait_behind, key)
                             for _ in range(self.waiters)]
        wait_until(lambda: lane_waiters(self.db, self.queue) >= shards * self.waiters,
                   what="lane waiters")
        return self

    def __exit__(self, *exc) -> None:
        for holder in self.holders:
            holder.commit()
            holder.close()
        for f in self.futures:
            f.result(timeout=30)
        self.pool.shutdown()


def decisions(db, queue: str) -> list[tuple]:
    with db.connect() as admin:
        return admin.execute(
            "select action, current_shards, proposed_shards, reason, decided_at"
            " from awa.autoscale_decisions where queue = %s order by decision_id",
            [queue]).fetchall()


def opt_in(db, logins, queue: str, mode: str = "auto", max_shards: int = 8) -> None:
    with db.connect(logins.producer) as p:
        enqueue(p, queue)
    with db.connect(logins.operator) as op:
        assert shards.set_shard_mode(op, queue, mode, max_shards) == (queue, mode, max_shards)


def test_raises_to_the_s_the_demand_calls_for_in_one_step_never_past_max(db, logins):
    opt_in(db, logins, "hot", "auto", 8)
    policy(db, logins.operator, "hot", cooldown="0", min_samples=1)
    seen = []
    with db.connect(logins.maintenance) as m:
        # One lane held, six backends behind it: seven producers want a lane.
        with Contention(db, logins.producer, "hot", waiters=6):
            seen += shards.autoscale_tick(m)
        with Contention(db, logins.producer, "hot", waiters=2):
            seen += shards.autoscale_tick(m)
    assert [(d.action, d.current_shards, d.proposed_shards) for d in seen] == [
        ("raised", 1, 8), ("held", 8, 8)]
    assert ("demand 7.00 (lanes held + waiters in the busiest priority per sample) calls for"
            " S = 8: 1 -> 8 in one step") in seen[0].reason
    assert "max_shards = 8" in seen[1].reason
    assert shards_of(db, "hot") == 8
    with db.connect() as admin:
        changes = admin.execute(
            "select old_shards, new_shards, source, lanes_created from awa.shard_changes"
            " where queue = 'hot' order by change_id").fetchall()
        assert changes == [(1, 8, "auto", 28)]


def test_a_raise_takes_at_most_three_doublings_and_one_when_one_is_enough(db, logins):
    opt_in(db, logins, "big", "auto", 64)
    opt_in(db, logins, "small", "auto", 64)
    for q in ("big", "small"):
        policy(db, logins.operator, q, cooldown="0", min_samples=1)
    steps = []
    with db.connect(logins.maintenance) as m:
        with Contention(db, logins.producer, "big", waiters=12), \
                Contention(db, logins.producer, "small", waiters=1):
            steps += shards.autoscale_tick(m)  # big: demand 13 -> 16, capped to 8
        with Contention(db, logins.producer, "big", waiters=2):
            steps += shards.autoscale_tick(m)  # 8 held + 16 waiting: 24 -> 32
    got = [(d.queue, d.current_shards, d.proposed_shards) for d in steps]
    assert got == [("big", 1, 8), ("small", 1, 2), ("big", 8, 32), ("small", 2, 2)]
    assert "calls for S = 16: 1 -> 8 in one step (at most 3 doublings" in steps[0].reason
    assert "in one step" not in steps[1].reason  # one doubling needs no explanation
    assert "calls for S = 32: 8 -> 32 in one step" in steps[2].reason


def test_repeated_holds_fold_into_one_row_steps_and_new_reasons_do_not(db, logins):
    opt_in(db, logins, "fold", "auto", 2)
    policy(db, logins.operator, "fold", cooldown="0", min_samples=1, grow_wait_share=0.2)
    with db.connect(logins.maintenance) as m:
        ticks = [shards.autoscale_tick(m)[0] for _ in range(3)]  # no waits: steady
        for _ in range(3):  # waits in 1 of 4 samples: raise; then refused, S at max
            with Contention(db, logins.producer, "fold"):
                ticks += shards.autoscale_tick(m)
        ticks += [shards.autoscale_tick(m)[0] for _ in range(2)]  # waits in the window
    # Each tick returns its own decision, at its own time.
    assert [t.decided_at for t in ticks] == sorted({t.decided_at for t in ticks})
    with db.connect() as admin:
        rows = admin.execute(
            "select action, reason_code, current_shards, repeats, decided_at,"
            " last_decided_at, reason from awa.autoscale_decisions where queue = 'fold'"
            " order by decision_id").fetchall()
    assert [r[:4] for r in rows] == [("held", "steady", 1, 3), ("raised", "grow", 1, 1),
                                     ("held", "at_max", 2, 4)]
    steady, _, at_max = rows
    assert (steady[4], steady[5]) == (ticks[0].decided_at, ticks[2].decided_at)
    assert (at_max[4], at_max[5]) == (ticks[4].decided_at, ticks[-1].decided_at)
    assert at_max[6] == ticks[-1].reason  # the latest signal and reason


def test_no_contention_no_growth(db, logins):
    opt_in(db, logins, "idle", "auto", 8)
    policy(db, logins.operator, "idle", cooldown="0", min_samples=1)
    with db.connect(logins.maintenance) as m:
        for _ in range(3):
            (d,) = shards.autoscale_tick(m)
            assert d.action == "held" and d.current_shards == 1
    assert shards_of(db, "idle") == 1


def test_shrinks_one_step_per_cooldown_never_while_lanes_above_s_hold_rows(db, logins):
    opt_in(db, logins, "calm", "auto", 8)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('calm', 4)")
    with db.connect(logins.producer) as p:
        above = [enqueue(p, "calm", ordering_key=key_for_shard(shard, 4))[0]
                 for shard in (2, 3) for _ in range(5)]
    cooldown = 0.3
    policy(db, logins.operator, "calm", cooldown=f"{cooldown}s", shrink_window=f"{cooldown}s",
           min_samples=1)

    with db.connect(logins.maintenance) as m:
        def lowered() -> bool:
            return any(d.action == "lowered" for d in shards.autoscale_tick(m))

        wait_until(lowered, what="the first lower")
        assert shards_of(db, "calm") == 2
        first = decisions(db, "calm")[-1]
        assert first[:3] == ("lowered", 4, 2)
        # Well past the cooldown and the shrink window: still no step, because
        # lanes 2 and 3 hold ready rows.
        wait_until(lambda: shards.autoscale_tick(m)[0].decided_at
                   > first[4] + timedelta(seconds=4 * cooldown), what="time to pass")
        held = [d for d in decisions(db, "calm") if d[4] > first[4]]
        assert held and all(d[0] == "held" for d in held)
        assert "still hold ready rows (up to shard 3)" in held[-1][3]
        assert shards_of(db, "calm") == 2

        with db.connect(logins.worker) as w:
            jobs = claim_all(w, ["calm"])
            for job in jobs:
                w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
        wait_until(lowered, what="the second lower")
    steps = [d for d in decisions(db, "calm") if d[0] == "lowered"]
    assert [(d[1], d[2]) for d in steps] == [(4, 2), (2, 1)]
    assert (steps[1][4] - steps[0][4]).total_seconds() >= cooldown
    with db.connect() as admin:
        completed = admin.execute(
            "select count(*) from awa.finished where state = 'completed' and job_id = any(%s)",
            [above]).fetchone()[0]
    assert completed == 10


def test_shadow_logs_the_same_decisions_and_never_changes_s(db, logins):
    opt_in(db, logins, "acting", "auto", 8)
    opt_in(db, logins, "watching", "shadow", 8)
    for q in ("acting", "watching"):
        policy(db, logins.operator, q, cooldown="1 hour", min_samples=1)
    with db.connect(logins.maintenance) as m:
        with Contention(db, logins.producer, "acting"), \
                Contention(db, logins.producer, "watching"):
            got = {d.queue: d for d in shards.autoscale_tick(m)}
        assert (got["acting"].action, got["watching"].action) == ("raised", "would_raise")
        assert got["acting"].reason == got["watching"].reason
        assert (got["watching"].current_shards, got["watching"].proposed_shards) == (1, 4)
        # A shadow step starts a cooldown of its own, as the real step does.
        with Contention(db, logins.producer, "watching"):
            again = {d.queue: d for d in shards.autoscale_tick(m)}
        assert again["watching"].action == "held" and "cooldown" in again["watching"].reason
    assert shards_of(db, "watching") == 1
    with db.connect() as admin:
        assert admin.execute("select count(*) from awa.shard_changes"
                             " where queue = 'watching'").fetchone()[0] == 0


def test_two_controllers_ticking_at_once_make_one_decision(db, logins):
    opt_in(db, logins, "q", "auto", 8)
    first = db.connect(logins.maintenance, autocommit=False)
    try:
        assert len(shards.autoscale_tick(first)) == 1  # leader lock held until commit
        with db.connect(db.login_role("awa_maintenance")) as second:
            assert shards.autoscale_tick(second) == []
        first.commit()
    finally:
        first.close()
    assert len(decisions(db, "q")) == 1


def test_a_manual_queue_is_never_touched(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "by-hand")
    policy(db, logins.operator, "by-hand", cooldown="0", min_samples=1)
    with db.connect(logins.maintenance) as m, Contention(db, logins.producer, "by-hand"):
        assert shards.autoscale_tick(m) == []
    with db.connect(logins.operator) as op:  # opted out again after opting in
        shards.set_shard_mode(op, "by-hand", "auto", 4)
        shards.set_shard_mode(op, "by-hand", "manual")
    with db.connect(logins.maintenance) as m, Contention(db, logins.producer, "by-hand"):
        assert shards.autoscale_tick(m) == []
    assert shards_of(db, "by-hand") == 1
    assert decisions(db, "by-hand") == []


def test_live_producers_and_workers_while_the_controller_acts(db, logins):
    """Producers (single and batch, keyed and unkeyed, on connections kept
    open) and a worker run while the controller raises S to 8 and, once max
    drops to 2, lowers it step by step as the lanes drain."""
    opt_in(db, logins, "live", "auto", 8)
    policy(db, logins.operator, "live", cooldown="0.2s", grow_wait_share=0, grow_waiters=0,
           min_samples=1)
    stop = threading.Event()
    acked: dict[int, list[tuple[int, int, float]]] = {}  # job, shard, call started
    failures: list[str] = []
    completed: list[int] = []

    def produce(i: int) -> None:
        rng = random.Random(i)
        mine = acked.setdefault(i, [])
        with db.connect(logins.producer, autocommit=False) as conn:
            while not stop.is_set():
                try:
                    started = time.monotonic()
                    if rng.random() < 0.5:
                        key = f"k{rng.randint(0, 40)}".encode() if rng.random() < 0.5 else None
                        rows = [enqueue(conn, "live", ordering_key=key)]
                    else:
                        n = rng.randint(2, 10)
                        keys = [f"k{rng.randint(0, 40)}".encode() if rng.random() < 0.5
                                else None for _ in range(n)]
                        rows = conn.execute(
                            "select * from awa.enqueue_batch(%s, %s, ordering_keys => %s::bytea[])",
                            [["live"] * n, ["k"] * n, keys]).fetchall()
                    conn.commit()
                    mine.extend((r[0], r[3], started) for r in rows)
                except psycopg.Error as err:
                    conn.rollback()
                    failures.append(f"{err.sqlstate}: {err}")

    def work() -> None:
        with db.connect(logins.worker) as w:
            while not stop.is_set():
                for job in claim(w, ["live"], 50):
                    w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
                    completed.append(job[0])

    def tick() -> None:
        with db.connect(logins.maintenance) as m:
            while not stop.is_set():
                shards.autoscale_tick(m)
                time.sleep(0.05)  # the tick interval, not a synchronisation

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(produce, i) for i in range(4)]
        futures.append(pool.submit(tick))
        try:
            wait_until(lambda: shards_of(db, "live") == 8, what="S = 8")
            with db.connect() as admin:
                # No committed job sits in a lane committed after it.
                assert admin.execute(
                    "select count(*) from awa.ready r join awa.lanes l using (lane_id)"
                    " where l.xmin <> r.xmin and pg_xact_commit_timestamp(l.xmin)"
                    "  >= pg_xact_commit_timestamp(r.xmin)").fetchone()[0] == 0
            futures.append(pool.submit(work))
            # Every producer connection, open throughout, uses shards that
            # exist only at S = 8: it sees the raises at their commit without
            # reconnecting. (Waited for before lowering: on a loaded machine
            # a producer may commit nothing while S = 8 lasts.)
            wait_until(lambda: all(any(r[1] >= 4 for r in list(acked.get(i, ())))
                                   for i in range(4)), what="every producer at S = 8")
            with db.connect(logins.operator) as op:
                shards.set_shard_mode(op, "live", "auto", 2)
            wait_until(lambda: shards_of(db, "live") == 2, what="S = 2")
            final_lower_seen = time.monotonic()
            wait_until(lambda: sum(started > final_lower_seen for rows in acked.values()
                                   for *_, started in list(rows)) >= 4,
                       what="enqueues that started after S = 2 was seen")
        finally:
            stop.set()
            for f in futures:
                f.result()
    assert failures == []
    with db.connect() as admin:
        changes = admin.execute(
            "select old_shards, new_shards, source from awa.shard_changes"
            " where queue = 'live' order by change_id").fetchall()
        # Up to 8 in raises of one or more doublings (as many as the demand
        # called for), then down one halving per step.
        *raises, down1, down2 = changes
        assert [c[2] for c in changes] == ["auto"] * len(changes)
        assert raises[0][0] == 1 and raises[-1][1] == 8
        assert all(b % a == 0 and b // a in (2, 4, 8) for a, b, _ in raises)
        steps = [*raises, down1]
        assert all(x[1] == y[0] and x[1] > x[0] for x, y in zip(raises, steps[1:], strict=True))
        assert (down1[:2], down2[:2]) == ((8, 4), (4, 2))
    with db.connect(logins.worker) as w:
        for job in claim_all(w, ["live"], 500):
            w.execute("select awa.complete(%s, %s)", [job[0], job[1]])
            completed.append(job[0])
    # A call that started once this test had seen S = 2 committed took its
    # snapshot after that commit was visible. (Commit timestamps are no
    # boundary: one is recorded just before its commit becomes visible.)
    after_lower = [shard for rows in acked.values() for _, shard, started in rows
                   if started > final_lower_seen]
    assert after_lower, "no enqueue after the last lower"
    assert max(after_lower) < 2
    enqueued = [job for rows in acked.values() for job, _, _ in rows]
    assert len(completed) == len(set(completed))
    assert set(enqueued) <= set(completed)


@pytest.mark.parametrize(("mode", "max_shards", "sqlstate", "message"), [
    (None, 4, "22004", "mode must not be null"),
    ("turbo", 4, "22023", "mode must be one of manual, shadow, auto; got 'turbo'"),
    ("auto", 0, "22023", "max_shards must be between 1 and 64, got 0"),
    ("auto", 65, "22023", "max_shards must be between 1 and 64, got 65"),
    ("auto", None, "22004", "max_shards is required for mode auto"),
    ("shadow", None, "22004", "max_shards is required for mode shadow"),
])
def test_set_shard_mode_validation(db, logins, mode, max_shards, sqlstate, message):
    with db.connect(logins.producer) as p:
        enqueue(p, "v")
    with db.connect(logins.operator) as op:
        with pytest.raises(psycopg.Error) as err:
            shards.set_shard_mode(op, "v", mode, max_shards)
        assert err.value.sqlstate == sqlstate
        assert message in str(err.value)
    with db.connect() as admin:
        assert admin.execute("select shard_mode, max_shards from awa.queue_meta"
                          " where queue = 'v'").fetchone() == ("manual", None)


def test_set_shard_mode_unknown_queue_and_partition_names(db, logins):
    with db.connect(logins.operator) as op:
        with pytest.raises(psycopg.errors.UndefinedObject):
            shards.set_shard_mode(op, "nope", "auto", 4)
        op.execute("select awa.set_queue_partitions('parted', 2)")
        with pytest.raises(psycopg.Error) as err:
            shards.set_shard_mode(op, "parted__p1", "auto", 4)
        assert err.value.sqlstate == "22023" and "set the mode on 'parted'" in str(err.value)
        shards.set_shard_mode(op, "parted", "shadow", 4)
        rows = op.execute("select queue, shard_mode, max_shards from awa.queue_overview"
                          " where logical_queue = 'parted' order by queue").fetchall()
    assert rows == [("parted", "shadow", 4), ("parted__p1", "shadow", 4)]
    with db.connect() as admin:
        accepted = admin.execute("select partitioned_fifo_accepted_by from awa.queue_meta"
                                 " where queue = 'parted'").fetchone()[0]
    assert accepted == logins.operator


def test_policy_validation(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "pv")
    """The message names the argument, its value and its range."""
    with db.connect(logins.operator) as op:
        for bad, message in (
                ({"cooldown": "-1s"}, "cooldown must be between 0 and 1 day, got -00:00:01"),
                ({"cooldown": "infinity"}, "cooldown must be between 0 and 1 day, got infinity"),
                ({"cooldown": "1 day 1 second"},
                 "cooldown must be between 0 and 1 day, got 1 day 00:00:01"),
                ({"grow_wait_share": 1.5}, "grow_wait_share must be between 0 and 1, got 1.5"),
                ({"grow_waiters": -1},
                 "grow_waiters must be a finite number of at least 0, got -1"),
                ({"grow_waiters": "NaN"},
                 "grow_waiters must be a finite number of at least 0, got NaN"),
                ({"grow_waiters": "Infinity"},
                 "grow_waiters must be a finite number of at least 0, got Infinity"),
                # One hour by PostgreSQL's comparison of intervals (a year is 360
                # days), five days and more in seconds (365.25).
                ({"grow_window": "1 year -360 days 1 hour"},
                 "grow_window must be above 0 and at most 1 hour,"
                 " got 1 year -360 days +01:00:00"),
                ({"min_samples": 0}, "min_samples must be between 1 and 10000, got 0"),
                ({"shrink_window": "0"},
                 "shrink_window must be above 0 and at most 1 hour, got 00:00:00"),
                ({"grow_window": "2 hours"},
                 "grow_window must be above 0 and at most 1 hour, got 02:00:00"),
                ({"shrink_wait_share": -0.5, "min_samples": 0},
                 "shrink_wait_share must be between 0 and 1, got -0.5")):
            args = policy_args(bad)
            with pytest.raises(psycopg.Error) as err:
                op.execute(f"select awa.set_autoscale_policy('pv', {args})", bad)
            assert err.value.sqlstate == "22023"
            assert err.value.diag.message_primary == (
                f"autoscale policy for queue 'pv': {message}")
        # A window given with a month is stored as the seconds it was checked as.
        op.execute("select awa.set_autoscale_policy('pv', grow_window => '1 mon -30 days 1 minute',"
                   " cooldown => '1 mon -29 days')")
    with db.connect() as admin:
        assert admin.execute(
            "select grow_window, cooldown from awa.autoscale_policy p"
            " join awa.queue_meta m using (queue_id) where m.queue = 'pv'").fetchone() == (
                timedelta(minutes=1), timedelta(days=1))


def test_an_operator_and_a_reader_see_each_queues_policy_by_name(db, logins):
    with db.connect(logins.operator) as op:
        for queue in ("policy-a", "policy-b"):
            op.execute("select awa.set_enqueue_shards(%s, 1)", [queue])
        op.execute("select awa.set_autoscale_policy('policy-b', cooldown => '2 minutes')")
        rows = op.execute("select queue, cooldown, grow_window from awa.autoscale_policies"
                          ).fetchall()
    assert rows == [("policy-b", timedelta(minutes=2), None)]
    with db.connect(logins.reader) as r:
        assert r.execute("select queue from awa.autoscale_policies").fetchall() == [
            ("policy-b",)]


def test_roles(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "r")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            p.execute("select awa.autoscale_tick()")
    with db.connect(logins.maintenance) as m, pytest.raises(
            psycopg.errors.InsufficientPrivilege):
        m.execute("select awa.set_shard_mode('r', 'auto', 4)")
    opt_in(db, logins, "r2", "shadow", 4)
    with db.connect(logins.maintenance) as m:
        shards.autoscale_tick(m)
    with db.connect(logins.reader) as r:
        assert r.execute("select count(*) from awa.autoscale_decisions").fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            r.execute("select awa.autoscale_tick()")


def test_a_waiting_enqueue_reports_its_lane_lock_wait(db, logins):
    with db.connect(logins.producer, autocommit=False) as calm:
        enqueue(calm, "w", ordering_key=b"k")
        assert calm.execute(
            "select current_setting('awa.lane_lock_wait_us', true)").fetchone()[0] in (None, "")
        calm.commit()
    holder = db.connect(logins.producer, autocommit=False)
    enqueue(holder, "w", ordering_key=b"k")
    result = {}

    def blocked():
        with db.connect(logins.producer, autocommit=False) as c:
            enqueue(c, "w", ordering_key=b"k")
            result["us"] = c.execute(
                "select current_setting('awa.lane_lock_wait_us', true)::bigint").fetchone()[0]
            c.commit()

    t = threading.Thread(target=blocked)
    t.start()
    wait_until(lambda: lane_waiters(db, "w") == 1,
               what="the second producer to wait")
    started = time.monotonic()
    wait_until(lambda: time.monotonic() - started > 0.2, what="a measurable wait")
    holder.commit()
    holder.close()
    t.join(30)
    assert not t.is_alive(), "the waiting enqueue never ended"
    assert result["us"] >= 200_000


@pytest.mark.one_version
def test_cli_modes_show_and_run(db, logins):
    with db.connect(logins.producer) as p:
        enqueue(p, "cli")
    op = logins.operator
    bad = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--auto", user=op)
    assert bad.returncode == 2 and "--auto needs --max N" in bad.stderr
    refused = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--auto", "--max", "4",
                     user=op)
    assert refused.returncode == 2 and "not changed" in refused.stderr
    ok = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--shadow", "--max", "4",
                "--yes", user=op, check=True)
    assert "cli: mode shadow, max 4" in ok.stdout
    env = {**os.environ, "AWA_DATABASE_URL": db.dsn(logins.maintenance)}
    runner = subprocess.Popen(
        [sys.executable, "-m", "awa_sql", "storage", "autoscale", "run", "--interval", "100ms",
         "--verbose"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: decisions(db, "cli"), what="a decision from the runner")
    finally:
        runner.send_signal(signal.SIGTERM)
        out, err = runner.communicate(timeout=20)
    assert runner.returncode == 0, err
    assert "cli: held S 1 -> 1 (shadow)" in out and "auto-scaler stopped" in out
    shown = db.awa("storage", "show", "--queue", "cli", user=logins.reader, check=True).stdout
    assert "cli: mode shadow, max 4" in shown and "last decision" in shown
    # Back to manual with a new S: the change of S is shown and asked about
    # as a plain --shards is (the lanes it creates, what ordering it keeps).
    planned = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--manual", "--shards",
                     "2", "--dry-run", user=op, check=True)
    assert "lanes to create" in planned.stdout and "partitioned FIFO" in planned.stdout
    assert "dry run: nothing changed" in planned.stdout and shards_of(db, "cli") == 1
    manual = db.awa("storage", "set-enqueue-shards", "--queue", "cli", "--manual", "--shards",
                    "2", "--yes", user=op, check=True)
    assert "cli: mode manual" in manual.stdout
    assert shards_of(db, "cli") == 2


def test_a_tick_probes_a_backlog_left_above_s_and_never_counts_it(db, logins):
    """The draining hold needs to know only that lanes >= S hold a ready row:
    a tick every few seconds probes each from its claim hint. It counted
    them, up to 10,000 (and walked from each lane's start: a held snapshot's
    dead rows too)."""
    opt_in(db, logins, "deep", "auto", 8)
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('deep', 4)")
    key = key_for_shard(3, 4)
    with db.connect() as admin:
        admin.execute("select count(*) from awa.enqueue_batch("
                      " array_fill('deep'::text, array[25000]),"
                      " array_fill('k'::text, array[25000]),"
                      " ordering_keys => array_fill(%s::bytea, array[25000]))", [key])
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('deep', 2)")
    policy(db, logins.operator, "deep", cooldown="0s", min_samples=1)
    with db.connect(logins.maintenance) as m:
        read = rows_read(m, "awa.ready", "select * from awa.autoscale_tick()")
    assert read < 100, read
    assert "still hold ready rows (up to shard 3)" in decisions(db, "deep")[-1][3]


def test_a_step_does_not_wait_for_a_transaction_that_creates_a_queue(db, logins):
    """A producer whose open transaction created a queue holds the provisioning
    lock until it ends, as every change of S needs it. The tick's raise used
    to wait for it, holding awa maintain's loop until its statement timeout.
    It now logs would_raise in auto mode, saying why, and changes nothing; the
    next tick, the lock free, raises."""
    opt_in(db, logins, "hot-new", "auto", 8)
    policy(db, logins.operator, "hot-new", cooldown="0", min_samples=1)
    with (db.connect(logins.producer, autocommit=False) as creator,
          db.connect(logins.maintenance) as m):
        m.execute("set statement_timeout = '5s'")  # the old tick waited: fail, not hang
        enqueue(creator, "made-in-a-long-transaction")
        with Contention(db, logins.producer, "hot-new", waiters=6):
            first = [d for d in shards.autoscale_tick(m) if d.queue == "hot-new"]
        assert shards_of(db, "hot-new") == 1
        creator.commit()
        with Contention(db, logins.producer, "hot-new", waiters=6):
            second = [d for d in shards.autoscale_tick(m) if d.queue == "hot-new"]
    assert [(d.action, d.current_shards, d.proposed_shards) for d in first] == [
        ("would_raise", 1, 8)]
    assert "not taken: another transaction holds the provisioning lock" in first[0].reason
    assert [(d.action, d.current_shards, d.proposed_shards) for d in second] == [
        ("raised", 1, 8)]
    assert shards_of(db, "hot-new") == 8


def test_a_step_neither_waits_for_nor_deadlocks_with_a_transaction_holding_the_queue(
        db, logins):
    """An operator's open transaction that changed the queue's row (a pause)
    and then drops it, or changes S, takes the row, then the provisioning
    lock, as every change of S does. The tick took the provisioning lock
    first and then waited for the row: the drop then waited for the tick,
    a deadlock (40P01), and meanwhile no queue could be created. The tick
    takes the rows without waiting now, logs the step as one it would take,
    and holds nothing the operator waits for."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('held', 2)")
        op.execute("select * from awa.set_shard_mode('held', 'auto', 1)")
    policy(db, logins.operator, "held", cooldown="0")
    with db.connect() as admin:
        held_id = admin.execute("select queue_id from awa.queue_meta where queue = 'held'"
                                ).fetchone()[0]
    with (db.connect(logins.operator, autocommit=False) as op,
          db.connect(logins.maintenance, autocommit=False) as m,
          db.connect() as watch):
        op.execute("select awa.pause_queue('held')")
        tick = Call(m, lambda c: c.execute("select * from awa.autoscale_tick()").fetchall())
        tick.start()
        wait_until(lambda: not tick.is_alive() or waits_for_a_lock(watch, tick.pid),
                   what="the tick to end or wait")
        try:
            dropped = op.execute("select awa.drop_queue('held')").fetchone()[0]
            op.commit()
        finally:
            tick.join(timeout=30)
        assert not tick.is_alive()
    assert tick.error is None, tick.error
    assert dropped is True
    steps = [(d[13], d[9], d[10]) for d in tick.result if d[1] == "held"]
    assert steps == [("above_max", 2, 1)], tick.result
    # The decision went with the queue's row when it was dropped (ADR 044).
    assert decisions(db, "held") == []
    (logged,) = decisions(db, f"#dropped#{held_id}")
    assert logged[:3] == ("would_lower", 2, 1)
    assert "not taken: another transaction holds the queue" in logged[3]


def test_a_step_takes_a_queue_whose_jobs_for_later_are_being_enqueued(db, logins):
    """An enqueue of a job for later holds a key share of the queue's row (the
    foreign key of awa.scheduled) until it commits; a queue whose producers
    schedule jobs all the time always has one. A step locks the row against
    other changes of the queue, not against those: it neither waits for the
    producer nor gives the step up."""
    with db.connect(logins.operator) as op:
        op.execute("select * from awa.set_enqueue_shards('later', 2)")
        op.execute("select * from awa.set_shard_mode('later', 'auto', 1)")
    policy(db, logins.operator, "later", cooldown="0")
    with (db.connect(logins.producer, autocommit=False) as p,
          db.connect(logins.maintenance, autocommit=False) as m,
          db.connect() as watch):
        p.execute("select awa.enqueue('later', 'k', run_at => now() + interval '1 hour')")
        tick = Call(m, lambda c: c.execute("select * from awa.autoscale_tick()").fetchall())
        tick.start()
        wait_until(lambda: not tick.is_alive() or waits_for_a_lock(watch, tick.pid),
                   what="the tick to end or wait")
        waited = tick.is_alive()
        p.commit()
        tick.join(timeout=30)
        m.commit()
    assert not waited, "the step waited for the producer's transaction"
    assert tick.error is None, tick.error
    assert [d[:3] for d in decisions(db, "later")] == [("lowered", 2, 1)]
    assert shards_of(db, "later") == 1


def test_a_tick_reads_each_queues_lanes_once_whatever_the_samples_statistics_say(
        db, logins):
    """The tick's per-lane counts (awa._count_lanes) join every queue's lane
    states to the samples it took at one instant. After an ANALYZE that saw
    only a few instants (a fresh install, samples pruned after maintenance
    was off, statistics reset by a crash), that instant is estimated at one
    row: the plan read the lane states of every queue again for each sample
    row, queues x queues calls (300 queues: 10 s a tick, past awa
    maintain's statement timeout). Counted in the tick's transaction."""
    queues = 40
    with db.connect(logins.producer) as p:
        for i in range(queues):
            enqueue(p, f"tick-{i:02d}")
    with db.connect(logins.maintenance) as m:
        for _ in range(3):
            m.execute("select count(*) from awa.autoscale_tick()")
    with db.connect(autocommit=False) as su:
        su.execute("analyze awa.contention_samples")
        su.commit()
        su.execute("set local track_functions = 'all'")
        su.execute("select count(*) from awa.autoscale_tick()")
        calls = su.execute("select pg_stat_get_xact_function_calls("
                           "'awa._lane_states(integer)'::regprocedure)").fetchone()[0]
        su.rollback()
    assert calls is not None and queues <= calls <= 2 * queues


def test_a_tick_leaves_an_old_decision_another_transaction_holds_to_a_later_tick(db, logins):
    """The tick deletes decisions older than 24 hours. One another
    transaction holds (a drop renaming the queue's history) was waited for,
    and the drop, waiting in turn for a count the tick held, closed a cycle
    (40P01). The tick skips it; a later one deletes it."""
    with db.connect(logins.operator) as op:
        op.execute("select awa.set_enqueue_shards('aged', 1)")
        op.execute("select awa.set_shard_mode('aged', 'shadow', 8)")
    with db.connect(logins.maintenance) as m:
        m.execute("select * from awa.autoscale_tick()").fetchall()  # the latest decision
    with db.connect() as su:
        su.execute(
            "insert into awa.autoscale_decisions (queue, decided_at, last_decided_at, mode,"
            " samples, current_shards, proposed_shards, action, reason_code, reason)"
            " values ('aged', now() - interval '25 hours', now() - interval '25 hours',"
            " 'shadow', 0, 1, 1, 'held', 'few_samples', 'old')")
    old = "select count(*) from awa.autoscale_decisions where reason = 'old'"
    holder = db.connect(autocommit=False)
    holder.execute("select 1 from awa.autoscale_decisions where reason = 'old' for update")
    try:
        with db.connect(logins.maintenance) as m:
            m.execute("set lock_timeout = '5s'")
            m.execute("select * from awa.autoscale_tick()").fetchall()
        with db.connect() as su:
            assert su.execute(old).fetchone()[0] == 1
    finally:
        holder.rollback()
        holder.close()
    with db.connect(logins.maintenance) as m:
        m.execute("select * from awa.autoscale_tick()").fetchall()
    with db.connect() as su:
        assert su.execute(old).fetchone()[0] == 0
