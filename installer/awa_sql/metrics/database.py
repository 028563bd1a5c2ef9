"""Database-side metrics for every queue, whatever its producers: one query
per scrape over the awa views, rendered by prometheus_client.

Needs only awa_reader. ``render(conn)`` is the plain function; ``apps.py``
wraps it for WSGI, ASGI and ``awa metrics serve``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.pq import TransactionStatus

log = logging.getLogger("awa_sql.metrics")

MODES = ("manual", "shadow", "auto")
LIVE_STATES = ("ready", "running", "scheduled")
TERMINAL_STATES = ("completed", "failed", "cancelled")
ACTIONS = ("raised", "lowered", "would_raise", "would_lower", "held")
RECENT_DECISIONS = "5 minutes"
# The tables every job passes through (their partitions summed): their dead
# rows pile up while a snapshot holds the xmin horizon back.
HOT_TABLES = ("ready", "running", "scheduled", "finished", "lane_hints")

# One statement, one snapshot: every row is (kind, json object): json, not
# jsonb, which builds a tree to print it (a tenth of the statement at 10,000
# queues, bench/watch_queues.py). A queue's
# depth and lag are its lanes' (metric_families sums them): the overview's
# ready and oldest_ready_age are the same sums of the same reads, which a
# read of neither leaves out (docs/observability.md, "What a scrape costs").
SCRAPE_SQL = f"""
select 'queue' as kind, pg_catalog.json_build_object(
    'queue', q.queue, 'logical_queue', q.logical_queue, 'shards', q.enqueue_shards,
    'mode', q.shard_mode, 'max_shards', q.max_shards, 'paused', q.paused,
    'running', q.running, 'scheduled', q.scheduled, 'failed', q.failed,
    'completed', q.completed, 'cancelled', q.cancelled, 'retried', q.retried) as row
  from awa.queue_overview as q
union all
select 'lane', pg_catalog.json_build_object(
    'queue', l.queue, 'logical_queue', l.logical_queue, 'priority', l.priority,
    'shard', l.shard, 'ready', l.ready, 'draining', l.draining,
    'lag', coalesce(extract(epoch from l.lag), 0))
  from awa.lane_overview as l
union all
select 'contention', pg_catalog.json_build_object(
    'queue', c.queue, 'samples', c.samples, 'waiters', c.mean_waiters_per_held_lane,
    'wait_share', c.wait_share, 'enqueue_rate', c.enqueue_rate,
    'age', extract(epoch from pg_catalog.clock_timestamp() - c.last_sample))
  from awa.lane_contention as c
union all
select 'decisions', pg_catalog.json_build_object(
    'queue', c.queue, 'action', c.action, 'total', c.decisions)
  from awa.autoscale_decision_counts as c
union all
-- The last minutes of the log, from the index on last_decided_at. A folded
-- run of holds that began before them counts the share of its ticks that
-- fell in them (ticks come at a steady cadence): all of its repeats made a
-- queue held for days read as tens of thousands of holds "in the last 5
-- minutes".
select 'recent_decisions', pg_catalog.json_build_object(
    'queue', d.queue, 'action', d.action, 'recent', sum(
        case when d.decided_at >= w.since then d.repeats
             else pg_catalog.ceil(d.repeats * extract(epoch from d.last_decided_at - w.since)
                                  / extract(epoch from d.last_decided_at - d.decided_at))
        end))
  from awa.autoscale_decisions as d
 cross join (select pg_catalog.now() - interval '{RECENT_DECISIONS}' as since) as w
 where d.last_decided_at > w.since
 group by d.queue, d.action
union all
select 'last_decision', pg_catalog.json_build_object(
    'queue', x.queue, 'proposed', x.proposed_shards,
    'at', extract(epoch from x.last_decided_at))
  -- Each queue's latest decision from the top of its index: one probe per
  -- queue that has decided, not a sort of the whole log.
  from (select distinct c.queue from awa.autoscale_decision_counts as c) as q
 cross join lateral (
    select d.queue, d.proposed_shards, d.last_decided_at
      from awa.autoscale_decisions as d
     where d.queue = q.queue
     order by d.decided_at desc, d.decision_id desc
     limit 1
  ) as x
union all
select 'table', pg_catalog.json_build_object(
    'table', r.relname, 'dead', pg_catalog.sum(pg_catalog.pg_stat_get_dead_tuples(c.oid)))
  from pg_catalog.pg_class as r
  -- The table and its partitions, if any (pg_stat_user_tables would read
  -- every statistic of every table: four times the cost).
  cross join lateral (
      select r.oid
      union all
      select t.relid from pg_catalog.pg_partition_tree(r.oid) as t
       where t.isleaf and t.relid <> r.oid
  ) as c (oid)
 where r.relnamespace = 'awa'::pg_catalog.regnamespace
   and r.relname in ({", ".join(f"'{t}'" for t in HOT_TABLES)})
 group by r.relname
union all
select 'queue_limit', pg_catalog.json_build_object('max', l.max_queues)
  from awa.queue_limit as l
union all
select 'maintenance', pg_catalog.json_build_object(
    'task', r.name, 'at', extract(epoch from r.last_at))
  from awa.maintenance_runs as r
union all
-- One probe of awa.scheduled's run_at index: due jobs promotion left there.
select 'scheduled', pg_catalog.json_build_object(
    'overdue', extract(epoch from awa.scheduled_overdue()))
union all
select 'horizon', pg_catalog.json_build_object('age', coalesce(greatest(
    -- backend_xid too: a transaction that wrote and sits idle in read
    -- committed holds no snapshot (backend_xmin null), yet its xid holds
    -- vacuum back just the same.
    (select pg_catalog.max(greatest(pg_catalog.age(a.backend_xmin),
                                    pg_catalog.age(a.backend_xid)))
       from pg_catalog.pg_stat_activity as a
      where a.pid <> pg_catalog.pg_backend_pid()
        and (a.datname = pg_catalog.current_database() or a.datid is null)
        -- Not a lazy VACUUM (autovacuum's too) nor its parallel workers:
        -- the server leaves them out of the horizon (PROC_IN_VACUUM). Any
        -- login sees a VACUUM's pid in the progress view, and in pg_locks
        -- the sessions holding its ShareUpdateExclusiveLock granted beside
        -- it: that lock conflicts with itself, so they are its lock group
        -- (its workers, whose leader_pid only pg_read_all_stats sees).
        -- VACUUM FULL is not in the view, and counts. pg_locks only while
        -- a VACUUM runs: reading it holds up every lock taken meanwhile.
        and case when not exists (select from pg_catalog.pg_stat_progress_vacuum) then true
                 else a.pid not in (
            select l.pid from pg_catalog.pg_locks as l
              join pg_catalog.pg_locks as v
                on v.database = l.database and v.relation = l.relation
             where v.pid in (select p.pid from pg_catalog.pg_stat_progress_vacuum as p)
               and v.mode = 'ShareUpdateExclusiveLock' and v.granted
               and l.mode = 'ShareUpdateExclusiveLock' and l.granted) end),
    (select pg_catalog.max(pg_catalog.age(s.xmin)) from pg_catalog.pg_replication_slots as s),
    (select pg_catalog.max(pg_catalog.age(p.transaction))
       from pg_catalog.pg_prepared_xacts as p
      where p.database = pg_catalog.current_database())), 0))
"""


STATEMENT_TIMEOUT_MS = 10_000


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def metric_families(rows: list[tuple[str, dict[str, Any]]]) -> list[Metric]:
    """The Prometheus metric families for one scrape's rows."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for kind, row in rows:
        by_kind[kind].append(row)
    ql = ["queue", "logical_queue"]
    depth = _gauge("awa_queue_depth", "Ready jobs (enqueued, not claimed, due now).", ql)
    jobs = _gauge("awa_queue_jobs", "Live jobs by state: ready, running, scheduled "
                  "(scheduled counted up to 10,000).", [*ql, "state"])
    finished = CounterMetricFamily(
        "awa_queue_finished", "Jobs that reached a terminal state (completed, failed, "
        "cancelled), counted in the database whatever retention removed since.",
        labels=[*ql, "state"])
    retried = CounterMetricFamily(
        "awa_queue_retried", "Failed attempts scheduled for a retry (awa.fail, or a lease "
        "or deadline that ran out), counted in the database: with "
        "awa_queue_finished_total{state=\"failed\"}, every failed attempt, whatever "
        "language the worker is written in.", labels=ql)
    lag = _gauge("awa_queue_lag", "Age of the oldest ready job; 0 when none is ready.", ql,
                 unit="seconds")
    shards = _gauge("awa_queue_enqueue_shards", "S, the enqueue shards of the queue.", ql)
    max_shards = _gauge("awa_queue_max_shards", "The highest S the auto-scaler may set "
                        "(only queues that have one).", ql)
    mode = _gauge("awa_queue_shard_mode", "1 for the queue's current shard mode "
                  "(manual, shadow, auto), 0 for the others.", [*ql, "mode"])
    paused = _gauge("awa_queue_paused", "1 when the queue is paused.", ql)
    # A queue's ready jobs are its lanes' spans summed, its lag its oldest
    # lane's: awa.queue_overview's ready and oldest_ready_age, read once.
    lanes_of: dict[str, tuple[int, float]] = {}
    for ln in by_kind["lane"]:
        ready, lane_lag = lanes_of.get(ln["queue"], (0, 0))
        lanes_of[ln["queue"]] = (ready + ln["ready"], max(lane_lag, ln["lag"]))
    auto_queues: set[str] = set()
    for q in by_kind["queue"]:
        q["ready"], q["lag"] = lanes_of.get(q["queue"], (0, 0))
        values = [q["queue"], q["logical_queue"]]
        depth.add_metric(values, q["ready"])
        for state in LIVE_STATES:
            jobs.add_metric([*values, state], q[state])
        for state in TERMINAL_STATES:
            finished.add_metric([*values, state], q[state])
        retried.add_metric(values, q["retried"])
        lag.add_metric(values, q["lag"])
        shards.add_metric(values, q["shards"])
        if q["max_shards"] is not None:
            max_shards.add_metric(values, q["max_shards"])
        for m in MODES:
            mode.add_metric([*values, m], 1 if q["mode"] == m else 0)
        paused.add_metric(values, 1 if q["paused"] else 0)
        if q["mode"] != "manual" and q["queue"] == q["logical_queue"]:
            auto_queues.add(q["queue"])

    ll = ["queue", "logical_queue", "priority", "shard"]
    lane_depth = _gauge("awa_lane_depth", "Ready jobs in one lane (queue, priority, shard).", ll)
    lane_lag = _gauge("awa_lane_lag", "Age of the lane's oldest ready job; 0 when empty.", ll,
                      unit="seconds")
    draining = _gauge("awa_lane_draining", "1 for a lane at shard >= S that still holds "
                      "ready jobs.", ll)
    for ln in by_kind["lane"]:
        values = [ln["queue"], ln["logical_queue"], str(ln["priority"]), str(ln["shard"])]
        lane_depth.add_metric(values, ln["ready"])
        lane_lag.add_metric(values, ln["lag"])
        draining.add_metric(values, 1 if ln["draining"] else 0)

    cl = ["queue"]
    waiters = _gauge("awa_lane_contention_waiters_per_held_lane",
                     "Mean backends waiting per held lane over the last minute of contention "
                     "samples (awa.lane_contention).", cl)
    share = _gauge("awa_lane_contention_wait_share",
                   "Share of the last minute's samples in which any lane had a waiter.", cl)
    rate = _gauge("awa_lane_contention_enqueue_rate",
                  "Enqueues per second over the last minute of samples, all producers.", cl)
    samples = _gauge("awa_lane_contention_samples",
                     "Contention samples in the last minute.", cl)
    age = _gauge("awa_lane_contention_last_sample_age",
                 "Time since the queue's last contention sample, within the last minute "
                 "(no series for a queue not sampled in it).", cl, unit="seconds")
    for c in by_kind["contention"]:
        waiters.add_metric([c["queue"]], c["waiters"] or 0)
        share.add_metric([c["queue"]], c["wait_share"] or 0)
        rate.add_metric([c["queue"]], c["enqueue_rate"] or 0)
        samples.add_metric([c["queue"]], c["samples"])
        age.add_metric([c["queue"]], c["age"])

    dl = ["queue", "action"]
    total = CounterMetricFamily(
        "awa_autoscale_decisions", "Auto-scaler decisions since the queue's first, by "
        "action (each tick of a folded run of holds counted), whatever the log's "
        "24 hours removed since.", labels=dl)
    recent = _gauge("awa_autoscale_decisions_recent",
                    f"Auto-scaler decisions in the last {RECENT_DECISIONS}, by action (of a "
                    "folded run of holds, the share of its ticks in them).", dl)
    totals = {(d["queue"], d["action"]): d["total"] for d in by_kind["decisions"]}
    recents = {(d["queue"], d["action"]): d["recent"] for d in by_kind["recent_decisions"]}
    auto_queues.update(queue for queue, _action in totals)
    for queue in sorted(auto_queues):
        for action in ACTIONS:
            total.add_metric([queue, action], totals.get((queue, action), 0))
            recent.add_metric([queue, action], recents.get((queue, action), 0))
    proposed = _gauge("awa_autoscale_proposed_shards",
                      "S the auto-scaler's last decision proposed (in shadow mode: what it "
                      "would have set).", cl)
    last = _gauge("awa_autoscale_last_decision_timestamp",
                  "When the auto-scaler last decided for the queue (Unix time).", cl,
                  unit="seconds")
    for d in by_kind["last_decision"]:
        proposed.add_metric([d["queue"]], d["proposed"])
        last.add_metric([d["queue"]], d["at"])
    dead = _gauge("awa_table_dead_tuples",
                  "Dead row versions in one of awa's hot tables, partitions summed "
                  "(pg_stat_get_dead_tuples): they grow while a snapshot holds "
                  "the xmin horizon back.", ["table"])
    for t in by_kind["table"]:
        dead.add_metric([t["table"]], t["dead"])
    horizon = _gauge("awa_xmin_horizon_age_transactions",
                     "Transactions since the oldest snapshot or open transaction id, "
                     "replication slot or prepared transaction that holds vacuum back in "
                     "this database (other sessions than the scrape's): rows deleted since "
                     "cannot be removed.", [])
    for h in by_kind["horizon"]:
        horizon.add_metric([], h["age"])
    ran = _gauge("awa_maintenance_last_run_timestamp",
                 "When the maintenance task last ran and committed, whoever ran it (awa "
                 "maintain, a Worker, pg_cron), within about 5 s (Unix time).", ["task"],
                 unit="seconds")
    for m in by_kind["maintenance"]:
        ran.add_metric([m["task"]], m["at"])
    overdue = _gauge("awa_scheduled_overdue",
                     "How long the oldest job in awa.scheduled has been due and not moved "
                     "to its lane, every queue's; 0 when none is due. Promotion moves a due "
                     "job within a second or so.", [], unit="seconds")
    for o in by_kind["scheduled"]:
        overdue.add_metric([], o["overdue"])
    queues = _gauge("awa_queues", "Physical queues that exist (partitions and stripes "
                    "count): each enqueue to a new name creates one.", [])
    queues_max = _gauge("awa_queues_max", "The most physical queues that may exist "
                        "(awa.set_max_queues); creating one more is refused.", [])
    # The overview has one row per physical queue.
    queues.add_metric([], len(by_kind["queue"]))
    for q in by_kind["queue_limit"]:
        queues_max.add_metric([], q["max"])
    return [depth, jobs, finished, retried, lag, shards, max_shards, mode, paused, lane_depth,
            lane_lag, draining, waiters, share, rate, samples, age, total, recent, proposed, last,
            dead, horizon, ran, overdue, queues, queues_max]


def scrape(conn: psycopg.Connection) -> list[Metric]:
    """Run the one scrape query on ``conn`` and build the metric families.

    On an idle ``conn``, in a transaction of its own; inside a transaction,
    in a savepoint of it, its statement timeout lasting to that
    transaction's end (``render`` refuses that)."""
    # One transaction with a local statement timeout: no session state, so
    # a transaction pooler in front of the database is fine.
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("select pg_catalog.set_config('statement_timeout', %s, true)",
                    [f"{STATEMENT_TIMEOUT_MS}ms"])
        rows = cur.execute(SCRAPE_SQL).fetchall()
    return metric_families(rows)


def _exporter_families(up: int, started: float) -> list[Metric]:
    """The exporter's own series: ``awa_up`` and the time since ``started``
    (a ``time.perf_counter()``) as ``awa_scrape_duration_seconds``."""
    g = _gauge("awa_up", "1 when the last scrape of the awa views succeeded.", [])
    g.add_metric([], up)
    d = _gauge("awa_scrape_duration", "Time the scrape of the awa views took.", [],
               unit="seconds")
    d.add_metric([], time.perf_counter() - started)
    return [g, d]


class DatabaseCollector(Collector):
    """A prometheus_client collector that scrapes the database on each collect.

    ``connect`` opens a connection (a login with awa_reader is enough); it is
    kept between scrapes and reopened after an error. A kept connection
    found broken (the server restarted, or a proxy closed it while idle) is
    reopened at once and the scrape tried again on the new one. ``awa_up`` is
    0 when the scrape failed.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection]):
        self._connect = connect
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        """The families ``collect`` yields, built from no rows: registering
        queries nothing, and a scrape filtered by name (``?name[]=awa_up``)
        finds this collector by them."""
        return [*metric_families([]), *_exporter_families(0, time.perf_counter())]

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        with self._lock:
            families, up = self._scrape()
        yield from families
        yield from _exporter_families(up, started)

    def _scrape(self) -> tuple[list[Metric], int]:
        for _ in range(2):
            kept = self._conn is not None and not self._conn.closed
            try:
                if not kept:
                    self._conn = self._connect()
                return scrape(self._conn), 1
            except psycopg.Error as err:
                broken = kept and self._conn is not None and self._conn.broken
                self.close_connection()
                if not broken:
                    log.warning("awa metrics scrape failed: %s", str(err).strip())
                    return [], 0
                # The kept connection died between scrapes: one try on a new one.
        log.warning("awa metrics scrape failed: the new connection broke too")
        return [], 0

    def close_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class _OneConnection(Collector):
    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        yield from scrape(self.conn)
        yield from _exporter_families(1, started)


def render(conn: psycopg.Connection) -> tuple[bytes, str]:
    """One scrape on ``conn``: the Prometheus text exposition and its content type,
    ``awa_up 1`` and ``awa_scrape_duration_seconds`` included.

    Errors propagate (psycopg.Error), and no text is made: a caller that
    answers the scrape with an error leaves ``awa_up`` absent, which
    AwaExporterDown takes for an exporter down. ``conn`` must be idle (no
    transaction open), and is left so: one inside a transaction is refused
    (psycopg.ProgrammingError), the transaction left as it was.
    """
    status = conn.info.transaction_status
    # UNKNOWN is a connection closed or lost: psycopg's own error says so.
    if status not in (TransactionStatus.IDLE, TransactionStatus.UNKNOWN):
        raise psycopg.ProgrammingError(
            "the connection given to render(conn) is not idle (transaction status"
            f" {status.name}): a scrape runs as a transaction of its own, which it cannot"
            " inside yours; commit or roll back first, or scrape on a connection of its own")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_OneConnection(conn))
    return generate_latest(registry), CONTENT_TYPE_LATEST
