"""Metrics: the client's registry and the database exporter, scraped after a
real workload, and the Grafana dashboard checked against a live scrape."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode
from wsgiref.util import setup_testing_defaults

import psycopg
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import awa_sql
from awa_sql import shards
from awa_sql.maintain import MaintainMetrics
from awa_sql.metrics import DatabaseCollector, client_metrics, make_asgi_app, make_wsgi_app, render
from awa_sql.metrics.database import HOT_TABLES
from awa_sql.worker import Worker
from tests.support.admin import serve_cli
from tests.support.dashboard import ALERTS, DASHBOARD, dashboard_queries
from tests.support.jobs import Logins, claim, key_for_shard, lane_waiters
from tests.support.jobs import enqueue as raw_enqueue
from tests.support.ports import assert_cannot_listen, needs_ipv6, taken_port
from tests.support.reads import rows_read
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry the client and workers record to during the test."""
    fresh = CollectorRegistry()
    client_metrics.use_registry(fresh)
    yield fresh
    client_metrics.use_registry(None)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    return [Sample(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def values(samples: list[Sample], name: str, **labels: str) -> list[float]:
    return [s.value for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = values(samples, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def wait_hist(registry: CollectorRegistry, queue: str, method: str) -> tuple[float, float]:
    """(count, sum) of awa.enqueue.lane_lock_wait for one queue and method."""
    labels = {"queue": queue, "method": method}
    return (registry.get_sample_value("awa_enqueue_lane_lock_wait_seconds_count", labels) or 0,
            registry.get_sample_value("awa_enqueue_lane_lock_wait_seconds_sum", labels) or 0)


# -- client: lane lock wait -----------------------------------------------------------------

ENQUEUE_BY_METHOD = {
    "enqueue": lambda conn, key: awa_sql.enqueue(conn, "j", queue="w", ordering_key=key),
    "batch": lambda conn, key: awa_sql.enqueue_many(
        conn, [{"kind": "j", "ordering_key": key}] * 3, queue="w"),
    "copy": lambda conn, key: awa_sql.enqueue_many_copy(
        conn, [{"kind": "j"}] * 3, queue="w", ordering_key=key),
}


@pytest.mark.parametrize("method", ENQUEUE_BY_METHOD)
def test_a_blocked_enqueue_records_its_lane_lock_wait_an_uncontended_one_zero(
        db, logins, registry, method):
    enqueue = ENQUEUE_BY_METHOD[method]
    with db.connect(logins.producer, autocommit=False) as calm:
        enqueue(calm, b"k")
        calm.commit()
    assert wait_hist(registry, "w", method) == (1, 0)

    holder = db.connect(logins.producer, autocommit=False)
    raw_enqueue(holder, "w", ordering_key=b"k")  # not through the client: not counted
    errors = []

    def blocked():
        try:
            with db.connect(logins.producer, autocommit=False) as c:
                enqueue(c, b"k")
                # Same transaction, lane already held: this call waited 0,
                # though the transaction's running total is not 0.
                enqueue(c, b"k")
                c.commit()
        except Exception as err:  # surfaced below, not lost in the thread
            errors.append(err)

    t = threading.Thread(target=blocked)
    t.start()
    wait_until(lambda: lane_waiters(db, "w") == 1,
               what="the producer to wait for the lane")
    started = time.monotonic()
    wait_until(lambda: time.monotonic() - started > 0.2, what="a measurable wait")
    holder.commit()
    holder.close()
    t.join(30)
    assert not t.is_alive(), "the waiting enqueue never ended"
    assert not errors
    count, total = wait_hist(registry, "w", method)
    assert count == 3
    assert 0.2 <= total < 10
    zero_bucket = registry.get_sample_value(
        "awa_enqueue_lane_lock_wait_seconds_bucket", {"queue": "w", "method": method,
                                                      "le": "0.0001"})
    assert zero_bucket == 2  # the uncontended call and the second call in the transaction


def test_several_queues_in_one_batch_share_one_label(db, logins, registry):
    with db.connect(logins.producer) as p:
        awa_sql.enqueue_many(p, [{"kind": "a", "queue": "x"}, {"kind": "b", "queue": "y"}])
        awa_sql.enqueue_many(p, [{"kind": "a"}, {"kind": "b"}], queue="x")
    size = "awa_enqueue_batch_size_sum"
    assert registry.get_sample_value(size, {"queue": "(several)", "method": "batch"}) == 2
    assert registry.get_sample_value(size, {"queue": "x", "method": "batch"}) == 2


def test_async_enqueue_records_too(db, logins, registry):
    async def run():
        async with await psycopg.AsyncConnection.connect(
                db.dsn(logins.producer), autocommit=True) as conn:
            await awa_sql.enqueue_async(conn, "a", queue="aq")
            await awa_sql.enqueue_many_async(conn, [{"kind": "a"}] * 4, queue="aq")

    asyncio.run(run())
    for method, jobs in (("enqueue", 1), ("batch", 4)):
        labels = {"queue": "aq", "method": method}
        assert registry.get_sample_value("awa_enqueue_batch_size_sum", labels) == jobs
        assert registry.get_sample_value("awa_enqueue_duration_seconds_count", labels) == 1
        assert wait_hist(registry, "aq", method) == (1, 0)


# -- the workload both exporters are scraped after --------------------------------------------

TICKS = 3


@dataclass
class Workload:
    enqueued: int = 0
    claimed: int = 0


def run_workload(db, logins: Logins) -> Workload:
    """orders: S = 4, shadow mode, 16 jobs by every enqueue path, 6 claimed and
    left running; work: S = 2, a real Worker completes 4 jobs and fails 2."""
    w = Workload()
    with db.connect(logins.producer) as p:
        awa_sql.enqueue(p, "charge", queue="orders")
        w.enqueued += 1
    with db.connect(logins.operator) as op:
        shards.set_enqueue_shards(op, "orders", 4)
        shards.set_shard_mode(op, "orders", "shadow", 8)
    keys = [key_for_shard(shard, 4) for shard in range(4)]
    with db.connect(logins.producer, autocommit=False) as p:
        w.enqueued += len(awa_sql.enqueue_many(
            p, [{"kind": "charge", "ordering_key": keys[i % 4]} for i in range(10)],
            queue="orders"))
        w.enqueued += awa_sql.enqueue_many_copy(p, [{"kind": "charge"}] * 5, queue="orders")
        p.commit()
    with db.connect(logins.worker) as c:
        w.claimed = len(claim(c, ["orders"], n=6))

    with db.connect(logins.producer) as p:
        awa_sql.enqueue(p, "ok", queue="work")  # creates the queue
    with db.connect(logins.operator) as op:
        shards.set_enqueue_shards(op, "work", 2)
    work_keys = [key_for_shard(shard, 2) for shard in range(2)]
    with db.connect(logins.producer) as p:
        awa_sql.enqueue_many(p, [{"kind": "ok", "ordering_key": work_keys[i % 2]}
                                 for i in range(3)], queue="work")
        awa_sql.enqueue_many(p, [{"kind": "boom", "ordering_key": k, "max_attempts": 1}
                                 for k in work_keys], queue="work")

    def boom(_job):
        raise RuntimeError("boom")

    worker = Worker(db.dsn(logins.worker), queues=["work"],
                    handlers={"ok": lambda _job: None, "boom": boom}, poll_interval=0.02)
    t = threading.Thread(target=worker.run)
    t.start()
    try:
        wait_until(lambda: worker.completed == 4 and worker.failed == 2, what="the worker")
    finally:
        worker.stop()
        t.join(30)
    with db.connect(logins.maintenance) as m:
        for _ in range(TICKS):
            shards.autoscale_tick(m)
    return w


@contextmanager
def metrics_serve(dsn: str, *args: str, env: dict | None = None,
                  errors: list[str] | None = None) -> Iterator[str]:
    """`awa metrics serve` as a subprocess; yields its URL. ``env`` adds to
    the environment; ``errors`` gets its stderr, once it has stopped."""
    env = {**os.environ, "AWA_DATABASE_URL": dsn, **(env or {})}
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_sql", "metrics", "serve", "--port", "0", *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "awa metrics serve printed nothing in 30 s"
        line = proc.stdout.readline()
        match = re.search(r"http://\S+/metrics", line)
        assert match, f"no URL in {line!r}; stderr: {proc.stderr.read() if proc.poll() else ''}"
        yield match.group()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "metrics server stopped" in out
    if errors is not None:
        errors.extend(err.splitlines())


@pytest.fixture
def served(db, logins) -> Iterator[str]:
    """`awa metrics serve` as a subprocess, logged in with only awa_reader."""
    with metrics_serve(db.dsn(logins.reader),
                       env={"AWA_METRICS_ALLOWED_HOSTS": ""}) as url:
        yield url


def fetch(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (our own server)
        return response.read().decode(), response.headers["Content-Type"]


def test_both_exporters_report_the_workload(db, logins, registry, served):
    w = run_workload(db, logins)
    text, content_type = fetch(served)
    assert content_type.startswith("text/plain; version=0.0.4")
    s = parse(text)
    assert value(s, "awa_up") == 1
    orders = {"queue": "orders"}

    # Depth is the jobs enqueued and not claimed, in the queue and summed over its lanes.
    assert w.enqueued == 16 and w.claimed == 6
    assert value(s, "awa_queue_depth", **orders) == w.enqueued - w.claimed
    assert value(s, "awa_queue_jobs", **orders, state="running") == w.claimed
    assert sum(values(s, "awa_lane_depth", **orders)) == w.enqueued - w.claimed
    assert {ln.labels["shard"] for ln in s if ln.name == "awa_lane_depth"
            and ln.labels["queue"] == "orders" and ln.value > 0} <= {"0", "1", "2", "3"}
    assert 0 < value(s, "awa_queue_lag_seconds", **orders) < 120
    assert max(values(s, "awa_lane_lag_seconds", **orders)) == pytest.approx(
        value(s, "awa_queue_lag_seconds", **orders), abs=0.5)
    assert value(s, "awa_queue_depth", queue="work") == 0
    assert value(s, "awa_queue_lag_seconds", queue="work") == 0
    assert value(s, "awa_queue_finished_total", queue="work", state="completed") == 4
    assert value(s, "awa_queue_finished_total", queue="work", state="failed") == 2
    assert value(s, "awa_queue_finished_total", queue="work", state="cancelled") == 0

    # S and the mode are what was set.
    assert value(s, "awa_queue_enqueue_shards", **orders) == 4
    assert value(s, "awa_queue_enqueue_shards", queue="work") == 2
    assert value(s, "awa_queue_max_shards", **orders) == 8
    assert {m: value(s, "awa_queue_shard_mode", **orders, mode=m)
            for m in ("manual", "shadow", "auto")} == {"manual": 0, "shadow": 1, "auto": 0}
    assert value(s, "awa_queue_shard_mode", queue="work", mode="manual") == 1

    # Contention samples from the ticks, and the shadow decisions by action.
    assert value(s, "awa_lane_contention_samples", **orders) == TICKS
    assert value(s, "awa_lane_contention_waiters_per_held_lane", **orders) == 0
    assert value(s, "awa_lane_contention_wait_share", **orders) == 0
    assert value(s, "awa_lane_contention_enqueue_rate", **orders) >= 0
    assert 0 <= value(s, "awa_lane_contention_last_sample_age_seconds", **orders) < 120
    with db.connect() as admin:
        actions = dict(admin.execute(
            "select action, sum(repeats) from awa.autoscale_decisions where queue = 'orders'"
            " group by action").fetchall())
    assert sum(actions.values()) == TICKS
    for action in ("raised", "lowered", "would_raise", "would_lower", "held"):
        expected = actions.get(action, 0)
        assert value(s, "awa_autoscale_decisions_total", **orders, action=action) == expected
        assert value(s, "awa_autoscale_decisions_recent", **orders, action=action) == expected
    assert values(s, "awa_autoscale_decisions_total", queue="work") == []  # manual: no series
    assert value(s, "awa_autoscale_proposed_shards", **orders) == 4
    assert time.time() - value(s, "awa_autoscale_last_decision_timestamp_seconds",
                               **orders) < 120

    # The client side: every path, every job, the claims by shard.
    c = parse(generate_latest(registry).decode())
    for method, calls, jobs in (("enqueue", 1, 1), ("batch", 1, 10), ("copy", 1, 5)):
        labels = {"queue": "orders", "method": method}
        assert value(c, "awa_enqueue_duration_seconds_count", **labels) == calls
        assert 0 < value(c, "awa_enqueue_duration_seconds_sum", **labels) < 30
        assert value(c, "awa_enqueue_batch_size_sum", **labels) == jobs
        assert value(c, "awa_enqueue_lane_lock_wait_seconds_count", **labels) == calls
        assert value(c, "awa_enqueue_lane_lock_wait_seconds_sum", **labels) == 0
    # work's shard 0: the job that created the queue at S = 1, two "ok" and one "boom".
    assert value(c, "awa_job_claimed_total", queue="work", awa_enqueue_shard="0") == 4
    assert value(c, "awa_job_claimed_total", queue="work", awa_enqueue_shard="1") == 2
    assert value(c, "awa_job_completed_total", queue="work") == 4
    assert value(c, "awa_job_failed_total", queue="work") == 2


# -- the exporter's other faces ---------------------------------------------------------------

def test_render_wsgi_and_asgi_agree_and_need_only_the_reader(db, logins):
    with db.connect(logins.producer) as p:
        awa_sql.enqueue_many(p, [{"kind": "a"}] * 3, queue="faces")
    with db.connect(logins.reader) as r:
        body, content_type = render(r)
    assert content_type.startswith("text/plain")
    assert value(parse(body.decode()), "awa_queue_depth", queue="faces") == 3

    environ: dict = {}
    setup_testing_defaults(environ)
    seen = {}
    app = make_wsgi_app(db.dsn(logins.reader))
    wsgi_body = b"".join(app(environ, lambda status, headers: seen.update(status=status)))
    assert seen["status"] == "200 OK"
    assert value(parse(wsgi_body.decode()), "awa_queue_depth", queue="faces") == 3

    async def asgi_get(method: str = "GET") -> list[dict]:
        sent: list[dict] = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": method, "path": "/", "headers": []}
        await make_asgi_app(db.dsn(logins.reader))(scope, receive, send)
        return sent

    start, body_msg = asyncio.run(asgi_get())
    assert start["status"] == 200
    assert value(parse(body_msg["body"].decode()), "awa_queue_depth", queue="faces") == 3
    assert asyncio.run(asgi_get("POST"))[0]["status"] == 405
    # The same series from each, the exporter's own too: without awa_up,
    # AwaExporterDown's absent(awa_up) fired for ever beside render().
    names = {s.name for s in parse(body.decode())}
    assert names == {s.name for s in parse(wsgi_body.decode())}
    assert names == {s.name for s in parse(body_msg["body"].decode())}
    rendered = parse(body.decode())
    assert value(rendered, "awa_up") == 1
    assert 0 < value(rendered, "awa_scrape_duration_seconds") < 30


def test_a_held_snapshot_shows_in_the_horizon_age_and_the_hot_tables_dead_tuples(db, logins):
    with db.connect(logins.reader) as r:
        fresh = parse(render(r)[0].decode())
    for table in HOT_TABLES:
        assert len(values(fresh, "awa_table_dead_tuples", table=table)) == 1, table
    # A snapshot held open: no row deleted from here on can be removed.
    with db.connect() as holder:
        holder.execute("begin isolation level repeatable read")
        holder.execute("select 1")
        with db.connect(logins.producer) as p:
            for _ in range(40):
                p.execute("select awa.enqueue('held', 'a')")
        with db.connect(logins.worker) as w:
            done = w.execute("select count(awa.complete(c.job_id, c.run_lease))"
                             " from awa.claim(array['held'], 40, 'w') c").fetchone()[0]
        assert done == 40

        def dead() -> dict[str, float] | None:
            with db.connect(logins.reader) as r:
                s = parse(render(r)[0].decode())
            found = {t: value(s, "awa_table_dead_tuples", table=t) for t in ("ready", "running")}
            return found if min(found.values()) >= 40 else None

        # Statistics reach the shared counters when the worker's backend
        # reports them (at the latest when it exits), not at its commit.
        counted = wait_until(dead, what="40 dead rows in awa.ready and awa.running")
        # 40 enqueues and a claim, each a transaction, since the snapshot.
        with db.connect(logins.reader) as r:
            held = parse(render(r)[0].decode())
        assert value(held, "awa_xmin_horizon_age_transactions") >= 41
        holder.execute("rollback")
    assert counted


def test_a_transaction_that_wrote_and_sits_idle_holds_the_horizon_in_the_metric(db, logins):
    """BEGIN, one write, then nothing (a psql session left open, a request
    that never committed): in read committed the session keeps no snapshot
    (backend_xmin is null) but its transaction id holds vacuum back just
    the same (backend_xid), and AwaXminHorizonHeld must see it."""
    with db.connect(logins.producer, autocommit=False) as holder:
        holder.execute("select awa.enqueue('held', 'a')")
        held_xid = holder.execute("select pg_current_xact_id()::text").fetchone()[0]
        with db.connect() as su:
            for _ in range(30):
                su.execute("select pg_current_xact_id()")
            row = su.execute("select backend_xmin, backend_xid::text from pg_stat_activity"
                             " where backend_xid::text = %s", [held_xid]).fetchone()
            assert row == (None, held_xid)  # no snapshot: only its xid holds the horizon
        with db.connect(logins.reader) as r:
            s = parse(render(r)[0].decode())
        assert value(s, "awa_xmin_horizon_age_transactions") >= 30
        # The runbook's query, as written, names it first, to a reader, before
        # the sessions that took a snapshot since: their backend_xmin is its
        # xid, as old (a closing session showed so, and came first).
        runbook = (ROOT / "docs" / "operations.md").read_text()
        query = re.search(r"Find the holder with\n\n```sql\n(.*?)```", runbook, re.S).group(1)
        with ExitStack() as stack:
            for _ in range(3):
                since = stack.enter_context(db.connect(autocommit=False))
                since.execute("set transaction isolation level repeatable read")
                since.execute("select 1")
            with db.connect(logins.reader) as r:
                ranked = r.execute(query).fetchall()
        tied = [row[0] for row in ranked if row[1] is not None and str(row[1]) == held_xid]
        assert len(tied) >= 3, ranked  # the snapshots rank as old as the holder
        assert ranked[0][0] == holder.info.backend_pid, ranked
        # Which of tied rows the view lists first is up to the server: the
        # same rows in a fixed order, the holder last, through the query's
        # own ORDER BY (a CTE named pg_stat_activity stands in for the view).
        fixed = ("with pg_stat_activity (pid, datid, datname, backend_xmin, backend_xid,"
                 " xact_start, state, query) as (values"
                 " (1, 1::oid, current_database(), %(x)s::xid, null::xid, now(), 'active', ''),"
                 " (2, 1::oid, current_database(), %(x)s::xid, null::xid, now(), 'active', ''),"
                 " (3, 1::oid, current_database(), null::xid, %(x)s::xid, now(), 'idle', ''))"
                 " " + query.replace("%", "%%"))
        with db.connect(logins.reader) as r:
            assert r.execute(fixed, {"x": held_xid}).fetchone()[0] == 3
        holder.rollback()
    with db.connect(logins.reader) as r:
        assert value(parse(render(r)[0].decode()), "awa_xmin_horizon_age_transactions") < 30


def test_a_vacuum_in_progress_holds_no_horizon_in_the_metric_or_the_runbook(db, logins):
    """A lazy VACUUM and its parallel workers show a backend_xmin, to any
    login, that the server leaves out of the horizon (PROC_IN_VACUUM): a
    long vacuum of a big table is no held horizon, for the metric (and
    AwaXminHorizonHeld) nor for the runbook's holder query, while a
    snapshot held open beside it still is."""
    with db.connect() as su:
        # Autovacuum off: its ANALYZE of the table would hold a snapshot.
        su.execute("create table public.big (a int, b int) with (autovacuum_enabled = off)")
        su.execute("insert into public.big select g, g from generate_series(1, 300000) g")
        su.execute("create index on public.big (a)")
        su.execute("create index on public.big (b)")
        su.execute("vacuum public.big")
        su.execute("delete from public.big where a <= 100")
    vacuum = db.connect()
    ended: list[BaseException] = []

    def slow_vacuum() -> None:
        # Throttled: the heap's few pages pass in a second or two, each
        # index (over 800 pages) takes far longer than the test, and a
        # parallel worker vacuums one of them.
        vacuum.execute("set vacuum_cost_delay = '100ms'")
        vacuum.execute("set vacuum_cost_limit = 5")
        try:
            vacuum.execute("vacuum (parallel 2, index_cleanup on) public.big")
        except psycopg.errors.QueryCanceled as err:
            ended.append(err)

    thread = threading.Thread(target=slow_vacuum)
    thread.start()
    with db.connect() as su, db.connect(logins.reader) as r:
        def vacuums() -> dict[int, int]:
            """The VACUUM's sessions, leader and workers, by pid: the age of their xmin."""
            return dict(su.execute(
                "select pid, age(backend_xmin) from pg_stat_activity"
                " where %(pid)s in (pid, leader_pid)", {"pid": vacuum.info.backend_pid}))

        def horizon() -> float:
            return value(parse(render(r)[0].decode()), "awa_xmin_horizon_age_transactions")

        try:
            wait_until(lambda: len(vacuums()) >= 2, timeout=60,
                       what="the VACUUM and a parallel worker vacuuming an index")
            for _ in range(300):
                su.execute("select pg_current_xact_id()")
            scraped = horizon()
            during = vacuums()
            assert len(during) >= 2 and min(during.values()) >= 300, during  # still vacuuming
            assert scraped < 50
            # A snapshot held open beside it counts, from its own start.
            with db.connect() as holder:
                holder.execute("begin isolation level repeatable read")
                holder.execute("select 1")
                for _ in range(100):
                    su.execute("select pg_current_xact_id()")
                assert 100 <= horizon() < 300
                runbook = (ROOT / "docs" / "operations.md").read_text()
                query = re.search(r"Find the holder with\n\n```sql\n(.*?)```",
                                  runbook, re.S).group(1)
                ranked = [row[0] for row in r.execute(query)]
                assert len(vacuums()) >= 2
                assert ranked[0] == holder.info.backend_pid, ranked
                holder.execute("rollback")
            assert not set(during) & set(ranked), (during, ranked)
        finally:
            su.execute("select pg_cancel_backend(%s)", [vacuum.info.backend_pid])
            thread.join(30)
            vacuum.close()
    assert ended, "the VACUUM ended before it was cancelled"


def test_render_refuses_a_connection_inside_a_transaction_and_leaves_it_open(db, logins):
    """A scrape is a transaction of its own: inside the caller's, it would
    be a savepoint, and ending it would end the caller's and lose its
    writes. Refused, with the transaction left as it was."""
    with db.connect(autocommit=False) as p:  # a login that may scrape, too
        p.execute("select awa.enqueue('kept', 'a')")
        with pytest.raises(psycopg.ProgrammingError,
                           match=r"given to render\(conn\) is not idle \(transaction status"
                                 r" INTRANS\)"):
            render(p)
        assert p.info.transaction_status.name == "INTRANS"
        p.commit()
    with db.connect(logins.reader) as r:
        assert value(parse(render(r)[0].decode()), "awa_queue_depth", queue="kept") == 1
    with db.connect(logins.reader, autocommit=False) as r:  # idle, not autocommit: fine
        assert value(parse(render(r)[0].decode()), "awa_up") == 1
        assert r.info.transaction_status.name == "IDLE"


def test_a_due_job_left_in_awa_scheduled_shows_its_age_until_promoted(db, logins):
    """awa_scheduled_overdue_seconds: 0 with nothing scheduled or nothing due
    yet; the age of a due job promotion has not moved (not run, or the lane
    the job goes to held by a producer's open transaction, which the query
    of AwaPromotionBehind's text names); 0 once it is promoted."""
    def overdue() -> float:
        with db.connect(logins.reader) as r:
            return value(parse(render(r)[0].decode()), "awa_scheduled_overdue_seconds")

    assert overdue() == 0
    with db.connect(logins.producer) as p:
        p.execute("select awa.enqueue('later', 'k', run_at => now() + interval '1 hour')")
    assert overdue() == 0
    with db.connect() as su:  # due 90 seconds ago, and nothing has promoted it
        su.execute("update awa.scheduled set run_at = now() - interval '90 seconds'")
    assert 90 <= overdue() < 150
    rules = {rule["alert"]: rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
             for rule in group["rules"]}
    holders = re.search(r"`(select pid, .*? order by xact_start)`",
                        rules["AwaPromotionBehind"]["annotations"]["description"]).group(1)
    with db.connect(logins.producer, autocommit=False) as holder:
        holder.execute("select awa.enqueue('later', 'k')")  # the queue's one lane, held
        with db.connect(logins.maintenance) as m:
            assert m.execute("select awa.promote_due()").fetchone()[0] == 0
        assert 90 <= overdue() < 150
        with db.connect() as su:
            assert [row[0] for row in su.execute(holders)] == [holder.info.backend_pid]
        with db.connect(logins.reader) as r:  # another login's state is hidden from it
            assert [row[:3] for row in r.execute(holders)] == [
                (holder.info.backend_pid, None, None)]
        holder.commit()
    # So the alert and both runbooks say who can read it, in one wording.
    needs = ("session shows its state, xact_start and query only to a superuser or a member"
             " of pg_read_all_stats")
    description = rules["AwaPromotionBehind"]["annotations"]["description"]
    runbook = (ROOT / "docs" / "operations.md").read_text()
    for text, times in ((description, 1), (runbook, 2)):
        assert " ".join(text.replace("`", "").split()).count(needs) == times, text[:80]
    with db.connect(logins.maintenance) as m:
        assert m.execute("select awa.promote_due()").fetchone()[0] == 1
    assert overdue() == 0


def test_a_failed_scrape_reports_awa_up_0_then_recovers(db, logins):
    dsns = iter([db.dsn("awa_no_such_login"), db.dsn(logins.reader)])
    app = make_wsgi_app(connect=lambda: psycopg.connect(next(dsns), autocommit=True))
    environ: dict = {}
    setup_testing_defaults(environ)
    down = parse(b"".join(app(environ, lambda *_: None)).decode())
    assert value(down, "awa_up") == 0
    assert values(down, "awa_queue_depth") == []
    up = parse(b"".join(app(environ, lambda *_: None)).decode())
    assert value(up, "awa_up") == 1


@contextmanager
def silent_server() -> Iterator[int]:
    """A port whose connections the kernel accepts and nobody answers, as a
    host that hangs (a wedged server, a pooler or proxy whose backend is
    gone) looks to libpq; closing it resets the connections left."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def scrape_in_thread(dsn: str) -> threading.Thread:
    """One scrape of ``make_wsgi_app(dsn)`` in a thread; its samples in
    ``thread.samples`` once it is done."""
    def run() -> None:
        environ: dict = {}
        setup_testing_defaults(environ)
        body = b"".join(make_wsgi_app(dsn)(environ, lambda *_: None))
        thread.samples = parse(body.decode())

    thread = threading.Thread(target=run, daemon=True)
    thread.samples = None
    thread.start()
    return thread


def test_a_scrape_of_a_host_that_never_answers_reports_awa_up_0_in_time(monkeypatch):
    """libpq waits for ever to connect unless told otherwise: a scrape of a
    host that accepts and never answers hung, held the collector's lock,
    and every later scrape queued behind it, with no awa_up at all."""
    from awa_sql.metrics import apps

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.setattr(apps, "CONNECT_TIMEOUT", 2)
    with silent_server() as port:
        started = time.monotonic()
        scrape = scrape_in_thread(f"postgresql://metrics@127.0.0.1:{port}/app")
        scrape.join(30)
        took = time.monotonic() - started
        assert not scrape.is_alive(), "the scrape still waits to connect after 30 s"
    assert value(scrape.samples, "awa_up") == 0
    assert values(scrape.samples, "awa_queue_depth") == []
    # It waited, and gave up after the 2 s set above, not the 5 s default
    # (the rest of the scrape takes milliseconds).
    assert 1 <= took < 4, took


def test_the_dsns_own_connect_timeout_wins(monkeypatch):
    from awa_sql.metrics import apps

    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.setattr(apps, "CONNECT_TIMEOUT", 3600)
    with silent_server() as port:
        started = time.monotonic()
        scrape = scrape_in_thread(f"postgresql://metrics@127.0.0.1:{port}/app?connect_timeout=2")
        scrape.join(30)
        took = time.monotonic() - started
        assert not scrape.is_alive(), "the DSN's connect_timeout was not applied"
    assert value(scrape.samples, "awa_up") == 0
    # The DSN's 2 s, not the 3600 s above nor the 5 s default.
    assert 1 <= took < 4, took


def test_a_kept_connection_that_died_between_scrapes_is_reopened_in_the_scrape(db, logins):
    """A server restart or an idle timeout kills the exporter's kept
    connection; the next scrape reconnects instead of reporting awa_up 0."""
    opened: list[psycopg.Connection] = []

    def connect() -> psycopg.Connection:
        opened.append(psycopg.connect(db.dsn(logins.reader), autocommit=True))
        return opened[-1]

    app = make_wsgi_app(connect=connect)
    environ: dict = {}
    setup_testing_defaults(environ)
    assert value(parse(b"".join(app(environ, lambda *_: None)).decode()), "awa_up") == 1
    pid = opened[0].info.backend_pid
    with db.connect() as admin:
        assert admin.execute("select pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]
    again = parse(b"".join(app(environ, lambda *_: None)).decode())
    assert value(again, "awa_up") == 1
    assert len(opened) == 2


def test_metrics_serve_answers_a_scrape_filtered_by_name(db, logins, served):
    """prometheus_client's ``?name[]=`` filter finds a collector by the
    names its describe() declares: the database collector declares every
    family it yields (built from no rows, without a query), so a filtered
    scrape answers those series, not an empty page."""
    with db.connect(logins.producer) as p:
        awa_sql.enqueue_many(p, [{"kind": "a"}] * 2, queue="filtered")
    everything = parse(fetch(served)[0])
    assert value(everything, "awa_queue_depth", queue="filtered") == 2
    assert {"awa_queue_lag_seconds", "awa_table_dead_tuples", "awa_scrape_duration_seconds"
            } <= {s.name for s in everything}
    wanted = ("awa_up", "awa_queue_depth", "awa_queue_finished_total")
    some = parse(fetch(f"{served}?{urlencode([('name[]', n) for n in wanted])}")[0])
    assert {s.name for s in some} == set(wanted)
    assert value(some, "awa_up") == 1
    assert value(some, "awa_queue_depth", queue="filtered") == 2
    assert value(some, "awa_queue_finished_total", queue="filtered", state="completed") == 0
    collector = DatabaseCollector(lambda: db.connect(logins.reader))
    try:
        assert {f.name for f in collector.describe()} == {f.name for f in collector.collect()}
    finally:
        collector.close_connection()


def test_awa_admin_serve_serves_the_database_metrics(db, logins):
    """``awa admin serve`` routes /metrics to the same exporter as ``awa metrics serve``."""
    with db.connect(logins.producer) as p:
        awa_sql.enqueue_many(p, [{"kind": "a"}] * 2, queue="admin-scraped")
    with serve_cli(db.dsn(logins.reader)) as base:
        text, content_type = fetch(f"{base}/metrics")
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:  # noqa: S310
            assert response.url == f"{base}/metrics"  # answered, not redirected
    assert content_type.startswith("text/plain")
    s = parse(text)
    assert value(s, "awa_up") == 1
    assert value(s, "awa_queue_depth", queue="admin-scraped") == 2


@pytest.mark.one_version
def test_metrics_serve_rejects_a_bad_port(db):
    result = db.awa("metrics", "serve", "--port", "70000")
    assert result.returncode == 2
    assert "port must be between 0 and 65535, got 70000" in result.stderr


@pytest.mark.one_version
def test_metrics_serve_on_a_taken_port_is_a_clear_error(db):
    with taken_port() as port:
        result = db.awa("metrics", "serve", "--port", str(port), timeout=30)
    assert_cannot_listen(result, f"127.0.0.1:{port}")


@pytest.mark.one_version
def test_metrics_serve_on_an_unknown_host_is_a_clear_error(db):
    result = db.awa("metrics", "serve", "--host", "no-such-host.invalid", "--port", "0",
                    timeout=60)
    assert_cannot_listen(result, "no-such-host.invalid:0")


# -- the Host check (DNS rebinding) -----------------------------------------------------------

EVERY_ADDRESS = "0.0.0.0"  # noqa: S104 - the wildcard bind is what these tests start


def _scrape_as(url: str, host: str):
    import httpx

    return httpx.get(url, headers={"Host": host}, timeout=30)


@pytest.mark.one_version
def test_metrics_serve_refuses_a_host_it_does_not_answer_to(db, logins, served):
    """A page that rebinds its own name to 127.0.0.1 scrapes as that name:
    400 and no metric; the loopback names scrape, whatever the port."""
    port = served.rsplit(":", 1)[1].split("/")[0]
    refused = _scrape_as(served, f"evil.example:{port}")
    assert refused.status_code == 400
    assert "awa_up" not in refused.text and "awa_queue" not in refused.text
    assert "refused Host 'evil.example'" in refused.text, refused.text
    assert "--allowed-host evil.example" in refused.text
    assert "AWA_METRICS_ALLOWED_HOSTS" in refused.text
    for host in ("localhost", f"127.0.0.1:{port}", "[::1]:9", "LOCALHOST."):
        got = _scrape_as(served, host)
        assert got.status_code == 200 and "awa_up 1.0" in got.text, host


def _scrapers(db, login: str) -> int:
    """The exporter's sessions logged in as ``login`` (it connects at its first scrape)."""
    with db.connect() as conn:
        return conn.execute("select count(*) from pg_stat_activity where usename = %s"
                            " and application_name = 'awa-sql metrics'", [login]).fetchone()[0]


@pytest.mark.one_version
def test_metrics_serve_refuses_a_scrape_another_page_made_the_browser_send(db, logins, served):
    """An <img src="http://127.0.0.1:9187/metrics"> on any page the operator
    opens ran a scrape per load: 403 and no connection to the database.
    Prometheus sends neither Sec-Fetch-Site nor Origin and scrapes."""
    import httpx

    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://evil.example"}):
        refused = httpx.get(served, headers=headers, timeout=30)
        assert refused.status_code == 403, (headers, refused.text)
        assert "awa_up" not in refused.text
        assert "(the check against cross-site reads)" in refused.text, refused.text
    assert _scrapers(db, logins.reader) == 0
    for headers in ({}, {"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}):
        got = httpx.get(served, headers=headers, timeout=30)
        assert got.status_code == 200 and "awa_up 1.0" in got.text, headers
    assert _scrapers(db, logins.reader) == 1


@pytest.mark.one_version
def test_metrics_serve_answers_each_allowed_host_and_no_other(db, logins):
    with metrics_serve(db.dsn(logins.reader), "--allowed-host", "metrics.example",
                       env={"AWA_METRICS_ALLOWED_HOSTS": "ignored.example"}) as url:
        assert _scrape_as(url, "metrics.example:9187").status_code == 200
        assert _scrape_as(url, "localhost").status_code == 200
        # --allowed-host replaces the variable, as --dsn replaces AWA_DATABASE_URL.
        assert _scrape_as(url, "ignored.example").status_code == 400
        assert _scrape_as(url, "evil.example").status_code == 400
    with metrics_serve(db.dsn(logins.reader),
                       env={"AWA_METRICS_ALLOWED_HOSTS": "a.example,b.example"}) as url:
        assert _scrape_as(url, "b.example").status_code == 200
        assert _scrape_as(url, "evil.example").status_code == 400


@pytest.mark.one_version
def test_metrics_serve_on_every_address_answers_any_host_and_warns(db, logins):
    """Prometheus scrapes by the name or address of its target: bound to
    0.0.0.0 with no allowed host, any Host is scraped, with one warning line."""
    errors: list[str] = []
    with metrics_serve(db.dsn(logins.reader), "--host", EVERY_ADDRESS,
                       env={"AWA_METRICS_ALLOWED_HOSTS": ""}, errors=errors) as url:
        got = _scrape_as(url, "evil.example")
        assert got.status_code == 200 and "awa_up 1.0" in got.text
    assert len(errors) == 1, errors
    assert "listening on 0.0.0.0 with no allowed host" in errors[0]
    assert "DNS rebinding" in errors[0] and "AWA_METRICS_ALLOWED_HOSTS" in errors[0]
    errors.clear()
    with metrics_serve(db.dsn(logins.reader), "--host", EVERY_ADDRESS,
                       "--allowed-host", "10.0.0.5", errors=errors) as url:
        assert _scrape_as(url, "10.0.0.5:9187").status_code == 200
        assert _scrape_as(url, "evil.example").status_code == 400
    assert errors == []


@pytest.mark.one_version
@needs_ipv6
def test_metrics_serve_on_ipv6_prints_a_url_that_answers(db, logins):
    with metrics_serve(db.dsn(logins.reader), "--host", "::1",
                       env={"AWA_METRICS_ALLOWED_HOSTS": ""}) as url:
        assert re.fullmatch(r"http://\[::1\]:\d+/metrics", url), url
        assert "awa_up 1.0" in fetch(url)[0]


# -- the dashboard ----------------------------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not
    functions, keywords, label names, strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group().lower() in PROMQL_WORDS:
            continue
        names.add(m.group())
    return names


def test_the_promql_parser_finds_the_names():
    expr = ('histogram_quantile(0.99, sum by (le, queue) (rate('
            'awa_enqueue_lane_lock_wait_seconds_bucket{queue=~"$queue"}[$__rate_interval])))'
            ' / on (queue) group_left awa_queue_depth offset 5m > 1e3')
    assert promql_metric_names(expr) == {"awa_enqueue_lane_lock_wait_seconds_bucket",
                                         "awa_queue_depth"}


def emitted_series(served: str, registry: CollectorRegistry) -> set[str]:
    """Names of the series a real scrape and the client registry emit now."""
    return ({s.name for s in parse(fetch(served)[0])}
            | {s.name for s in parse(generate_latest(registry).decode())})


def test_every_metric_the_dashboard_queries_is_emitted(db, logins, registry, served):
    run_workload(db, logins)
    emitted = emitted_series(served, registry)
    doc = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(doc)
    assert len(queries) >= 15
    used = set()
    for title, expr in queries:
        names = promql_metric_names(expr)
        assert names, f"panel {title!r}: no metric in {expr!r}"
        missing = names - emitted
        assert not missing, f"panel {title!r} queries {sorted(missing)}, not emitted"
        used |= names
    # The panels the issue asks for are there.
    for needed in ("awa_queue_enqueue_shards", "awa_queue_shard_mode",
                   "awa_enqueue_lane_lock_wait_seconds_bucket",
                   "awa_lane_contention_waiters_per_held_lane", "awa_lane_depth",
                   "awa_lane_lag_seconds", "awa_enqueue_batch_size_sum",
                   "awa_job_claimed_total", "awa_autoscale_decisions_recent"):
        assert needed in used, f"no panel shows {needed}"


def test_every_alert_rule_is_well_formed_and_queries_emitted_series(db, logins, registry, served):
    """docs/prometheus/awa-alerts.yml: each rule has what Prometheus and an
    on-call reader need, and selects only series a real scrape, the client
    and `awa maintain` emit (a renamed metric would silence its alert)."""
    run_workload(db, logins)
    client_metrics.on_registry(MaintainMetrics, registry)
    emitted = emitted_series(served, registry)
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert len(rules) >= 5
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), f"alert names repeat: {names}"
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), (rule["alert"], rule["for"])
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        selected = promql_metric_names(rule["expr"])
        assert selected, f"alert {rule['alert']!r}: no metric in {rule['expr']!r}"
        missing = selected - emitted
        assert not missing, f"alert {rule['alert']!r} queries {sorted(missing)}, not emitted"
    # The signals an incident starts from.
    used = set().union(*(promql_metric_names(rule["expr"]) for rule in rules))
    for needed in ("awa_up", "awa_queue_lag_seconds", "awa_queue_depth",
                   "awa_table_dead_tuples", "awa_maintenance_last_run_timestamp_seconds",
                   "awa_xmin_horizon_age_transactions", "awa_queue_paused"):
        assert needed in used, f"no alert on {needed}"
    # A stopped exporter emits no series: the alert on it must also fire on
    # their absence (increase() of nothing is not 0). Maintenance is read from
    # the database, so a pg_cron that runs it does not leave it firing.
    by_name = {rule["alert"]: rule["expr"] for rule in rules}
    assert "absent(awa_up)" in by_name["AwaExporterDown"]
    assert "awa_maintenance_last_run_timestamp_seconds" in by_name["AwaMaintenanceNotRunning"]
    assert "awa_maintain_" not in by_name["AwaMaintenanceNotRunning"]
    # Neither the lag nor the backlog alert says "add workers" for a paused
    # queue; one alert says when a pause has held jobs back.
    for name in ("AwaQueueLagHigh", "AwaBacklogGrowing"):
        assert "unless on (queue) max by (queue) (awa_queue_paused) == 1" in by_name[name]
    assert "awa_queue_paused) == 1" in by_name["AwaQueuePausedWithBacklog"]
    # Every alert is in observability.md's table and has its entry in the
    # runbook (operations.md, "When an alert fires"): what to look at, what
    # ends it.
    table = (ROOT / "docs" / "observability.md").read_text()
    runbook = (ROOT / "docs" / "operations.md").read_text().split(
        "## When an alert fires", 1)[1].split("\n## ", 1)[0]
    for name in names:
        assert f"| `{name}` |" in table, f"{name} is not in observability.md's alert table"
        assert f"**{name}**" in runbook, f"{name} has no runbook entry in operations.md"



SELECTOR = re.compile(r"(?<![\w.$])([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
# Added by Prometheus to every series of a target.
TARGET_LABELS = {"instance", "job"}


def label_problems(expr: str, series: dict[str, list[dict[str, str]]]) -> list[str]:
    """What in ``expr`` selects or groups by a label the emitted ``series``
    (name: the label sets of its samples) do not have: a matcher on a label
    the series lacks, an equality or an alternative of a plain regex that
    matches no value emitted, a by/on clause on a label none of the
    expression's series has."""
    problems = []
    names = promql_metric_names(expr)
    for name, matchers in SELECTOR.findall(expr):
        found = series.get(name, [])
        for label, op, wanted in MATCHER.findall(matchers):
            emitted = {s[label] for s in found if label in s}
            if not emitted:
                problems.append(f"{name} has no label {label}")
            elif "$" in wanted or op in ("!=", "!~"):
                continue
            elif op == "=" and wanted not in emitted:
                problems.append(f'{name}{{{label}="{wanted}"}}: no such series')
            elif op == "=~" and re.fullmatch(r"[\w|]+", wanted):
                problems.extend(f'{name}{{{label}=~"{wanted}"}}: no {label}="{alt}"'
                                for alt in wanted.split("|") if alt not in emitted)
    for clause in GROUPING.findall(expr):
        for label in (x.strip() for x in clause.split(",") if x.strip()):
            if label not in TARGET_LABELS and not any(
                    label in s for name in names for s in series.get(name, [])):
                problems.append(f"groups by {label}, which none of {sorted(names)} has")
    return problems


def test_the_label_check_finds_a_renamed_label():
    series = {"awa_queue_jobs": [{"queue": "q", "state": "running"}],
              "awa_maintain_passes_total": [{"task": "promote", "outcome": "ran"}]}
    assert label_problems('sum by (queue) (awa_queue_jobs{state="running"})', series) == []
    assert label_problems('awa_queue_jobs{status="running"}', series) == [
        "awa_queue_jobs has no label status"]
    assert label_problems('awa_queue_jobs{state="runing"}', series) == [
        'awa_queue_jobs{state="runing"}: no such series']
    assert label_problems('awa_maintain_passes_total{task=~"promote|promot"}', series) == [
        'awa_maintain_passes_total{task=~"promote|promot"}: no task="promot"']
    assert label_problems("max by (shard) (awa_queue_jobs)", series) == [
        "groups by shard, which none of ['awa_queue_jobs'] has"]


def test_every_label_the_dashboard_and_the_alerts_use_is_emitted(db, logins, registry, served):
    """The name check above misses a renamed label or value: a panel on
    awa_queue_jobs{state="running"} or an alert on a task that is no more
    would show nothing, silently. Scraped with jobs in every state, a paused
    queue and `awa maintain`'s series."""
    run_workload(db, logins)
    with db.connect() as admin:
        admin.execute("select awa.enqueue('later', 'k', run_at => now() + interval '1 hour')")
        job = admin.execute("select job_id from awa.enqueue('later', 'k')").fetchone()[0]
        admin.execute("select awa.cancel_job(%s)", [job])
        admin.execute("select awa.pause_queue('later')")
    client_metrics.on_registry(MaintainMetrics, registry)
    scraped = parse(fetch(served)[0])
    assert value(scraped, "awa_queue_jobs", queue="later", state="scheduled") == 1
    assert value(scraped, "awa_queue_finished_total", queue="later", state="cancelled") == 1
    assert value(scraped, "awa_queue_paused", queue="later") == 1
    series: dict[str, list[dict[str, str]]] = {}
    for s in [*scraped, *parse(generate_latest(registry).decode())]:
        series.setdefault(s.name, []).append(s.labels)
    exprs = [(title, expr) for title, expr in dashboard_queries(json.loads(DASHBOARD.read_text()))
             if "(" in expr or "{" in expr]
    exprs += [(rule["alert"], rule["expr"])
              for group in yaml.safe_load(ALERTS.read_text())["groups"]
              for rule in group["rules"]]
    assert len(exprs) >= 30
    problems = [f"{title}: {p}" for title, expr in exprs for p in label_problems(expr, series)]
    assert problems == []

# An exporter's own series: one per exporter, on purpose.
PER_EXPORTER = {"awa_up", "awa_scrape_duration_seconds"}
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(")


def innermost_aggregation(expr: str, at: int) -> str | None:
    """The aggregation operator whose argument encloses position ``at``, the
    innermost one; None when no aggregation does."""
    found = None
    for m in AGGREGATION.finditer(expr):
        start = m.end() - 1  # its argument's "("
        if start > at:
            break
        depth = 0
        for end in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            if depth == 0:
                break
        if at < end:
            found = m.group(1)  # a later start inside is an inner one
    return found


def test_the_innermost_aggregation_is_found():
    expr = ('sum by (queue) (max by (queue, shard) (awa_lane_depth{a="x"})) + awa_queue_depth'
            ' + max(rate(awa_queue_retried_total[5m]))')
    assert innermost_aggregation(expr, expr.index("awa_lane_depth")) == "max"
    assert innermost_aggregation(expr, expr.index("awa_queue_depth")) is None
    assert innermost_aggregation(expr, expr.index("awa_queue_retried")) == "max"


def test_the_dashboard_and_the_alerts_read_a_database_series_once_however_many_exporters(
        db, logins, served):
    """Two exporters of one database (the admin server's /metrics beside
    `awa metrics serve`, or two for redundancy) give each database series
    twice, one per target. Read through max or min, it is its value; a sum
    doubled it, and a bare series drew two lines or fired two alerts."""
    run_workload(db, logins)
    database = {s.name for s in parse(fetch(served)[0])} - PER_EXPORTER
    exprs = [(title, expr) for title, expr in dashboard_queries(json.loads(DASHBOARD.read_text()))
             if not title.startswith("variable ")]  # label_values() lists each value once
    exprs += [(rule["alert"], rule["expr"])
              for group in yaml.safe_load(ALERTS.read_text())["groups"]
              for rule in group["rules"]]
    problems = []
    for title, expr in exprs:
        for name in sorted(promql_metric_names(expr) & database):
            for m in re.finditer(rf"\b{name}\b", expr):
                if innermost_aggregation(expr, m.start()) not in ("max", "min"):
                    problems.append(f"{title}: {name} at {m.start()} in {expr!r}")
    assert problems == []


def test_a_queue_with_few_scheduled_jobs_never_reads_another_queues_schedule(db, logins):
    """The overview counts scheduled jobs up to 10,000 per queue. In the view
    the queue is a parameter the planner estimates as the average; once one
    queue held most of awa.scheduled, the count of another scanned them all."""
    from awa_sql.metrics.database import SCRAPE_SQL

    with db.connect() as conn:
        conn.execute("select awa.enqueue_batch(array_agg('big'::text), array_agg('t'::text),"
                     " run_ats => array_agg(now() + interval '1 day'))"
                     " from generate_series(1, 100000)")
        conn.execute("analyze awa.scheduled")  # as autovacuum would after such a load
        conn.execute("select awa.enqueue('small', 't', run_at => now() + interval '1 day')")
    with db.connect(logins.reader) as conn:
        assert dict(conn.execute("select queue, scheduled from awa.queue_overview")) == {
            "big": 10_000, "small": 1}
        small = rows_read(conn, "awa.scheduled",
                          "select scheduled from awa.queue_overview where queue = 'small'")
        scrape = rows_read(conn, "awa.scheduled", SCRAPE_SQL)
    assert small <= 10
    assert scrape <= 2 * (10_000 + 10)  # index entries, and the rows they name


def test_a_job_made_ready_after_the_scrape_began_is_no_negative_lag(db, logins):
    """The views measure lag from now(), the start of the reader's
    transaction; a job enqueued after it (its ready_at is the clock at its
    insert) is visible to the reader's next statement."""
    with db.connect(logins.reader) as r, db.connect(logins.producer) as p:
        r.execute("begin")
        r.execute("select now()")
        p.execute("select awa.enqueue('lagq', 'k')")
        lane = r.execute("select min(lag) from awa.lane_overview where queue = 'lagq'"
                         " and ready > 0").fetchone()[0]
        age = r.execute("select oldest_ready_age from awa.queue_overview"
                        " where queue = 'lagq'").fetchone()[0]
        r.execute("rollback")
    assert lane.total_seconds() == 0 and age.total_seconds() == 0


def test_failed_attempts_retried_are_counted_by_the_database_for_every_worker(db, logins):
    """A worker in any language (plain SQL here): each failed attempt that is
    retried moves the queue's retried counter, by awa.fail and by a lease that
    ran out; the last attempt counts as failed instead; a stale fail, nothing."""
    retried = "select retried, failed from awa.queue_overview where queue = 'retries'"
    enqueue = "select awa.enqueue('retries', 'flaky', max_attempts => 2)"

    def fail_next(w, m) -> None:
        m.execute("select awa.promote_due()")
        [(job_id, lease)] = w.execute(
            "select job_id, run_lease from awa.claim(array['retries'], 1, 'w')").fetchall()
        assert w.execute("select awa.fail(%s, %s, 'stale', now())",
                         [job_id, lease + 1]).fetchone()[0] is False
        assert w.execute("select awa.fail(%s, %s, 'boom', now())",
                         [job_id, lease]).fetchone()[0] is True

    with db.connect(logins.producer) as p, db.connect(logins.worker) as w, \
            db.connect(logins.maintenance) as m, db.connect(logins.reader) as r:
        p.execute(enqueue)
        assert r.execute(retried).fetchone() == (0, 0)
        fail_next(w, m)
        assert r.execute(retried).fetchone() == (1, 0)
        fail_next(w, m)  # its last attempt
        assert r.execute(retried).fetchone() == (1, 1)
        # Another job's worker dies: its lease runs out.
        p.execute(enqueue)
        claim(w, ["retries"], n=1, lease="300 milliseconds")
        wait_until(lambda: m.execute("select awa.rescue_expired()").fetchone()[0] == 1,
                   what="the lease to run out")
        assert r.execute(retried).fetchone() == (2, 1)
        s = parse(render(r)[0].decode())
        assert value(s, "awa_queue_retried_total", queue="retries") == 2
        assert value(s, "awa_queue_finished_total", queue="retries", state="failed") == 1
