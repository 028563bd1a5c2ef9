"""A soak: the shipped long-lived processes together for `--minutes`, sampled
every `--every` seconds into a CSV, then a slope fitted to each series.

On a fresh PostgreSQL 18 (bench/_server.py's settings; or AWA_BENCH_DSN)
with awa migrated (--create-roles), three queues whose retention is 1
second (awa.set_retention; every queue's, so that the completed ring's slot
of the last hour is dropped once the hour turns):

  soak_s1    S = 1, retry policy 1 s .. 5 s; unique keys, failing and
             retried jobs, jobs past their max run time (async: cancelled;
             plain: rescued), a scheduled job cancelled with `awa jobs
             cancel` every 30 s
  soak_auto  S = 8, shard mode auto (max 8, a quick policy)
  soak_part  partitioned, P = 4, keyed jobs sent to the logical name

and these processes, each its own OS process:

  producer   a Producer: single enqueues, enqueue_many, enqueue_many_copy at
             `--rate` jobs/s in all, unique keys and max run times among them
  worker     a Worker of every queue and partition (maintain=True unless
             --maintain cli)
  maintain   `awa maintain` (unless --maintain worker): with both, the pass
             locks share the passes between the two
  metrics    `awa metrics serve`, scraped every 2 s
  admin      `awa admin serve`, its main API routes polled every 3 s

The worker and the producer write their own counts every 10 s (held jobs,
handed-back jobs, runtime activity keys, prepared statements per
connection, Python objects) for the sampler. Each sample records, per
process, RSS, threads, open files and log lines; per application_name the
server connections and the anonymous memory of their backends
(/proc/PID/status RssAnon: the plan caches and prepared statements that
live in each backend); per table of schema awa (partitions summed) its
size with indexes and its dead and live rows; and the jobs finished.

The summary fits a least-squares line to each series after `--warmup`
minutes: slope per hour, the change it predicts over the measured span
relative to the series' mean, and r^2. A series flagged `grows` rises
steadily (r^2 >= 0.6) by at least 10% of its mean and past a floor of its
kind (1 MiB for memory, 1 MiB for a table, 2 for counts). awa.finished
(and its indexes) grow by design between prunes: a slot holds an hour.

    python bench/soak.py --minutes 45 --out soak.csv [--rate 60] [--maintain both] [--write-docs]
    python bench/soak.py --analyse soak.csv         # the summary of a CSV written before
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gc
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _docs
from bench._server import BENCH_SETTINGS, machine

ROOT = Path(__file__).resolve().parent.parent
AWA = [sys.executable, "-m", "awa_sql"]
QUEUES = ("soak_s1", "soak_auto", "soak_part")
PARTITIONS = 4
STATS_EVERY = 10.0  # seconds between the worker's and producer's own counts
RETENTION = "1 second"
# A series "grows" when its fitted line rises by this share of its mean over
# the measured span, fits that well, and moves past the floor of its kind.
GROWTH_SHARE = 0.10
MIN_R2 = 0.6
# Memory that "creeps": a line this straight rising this fast (kB per hour),
# however small next to the whole: a month of it is what a soak cannot wait for.
CREEP_R2 = 0.9
CREEP_KB_PER_HOUR = 1024.0
FLOORS = {"kb": 1024.0, "bytes": 1024.0 * 1024.0}
COUNT_FLOOR = 2.0


# -- the worker and producer processes (`--role`) -------------------------------------------


def _stats_writer(path: Path, counts) -> None:
    """Writes ``counts()`` as JSON to ``path`` every STATS_EVERY seconds (a
    daemon thread of the worker or producer process)."""
    def loop() -> None:
        while True:
            try:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(counts()))
                os.replace(tmp, path)
            except Exception as err:  # a sample missed is a sample missed
                logging.getLogger("soak").warning("stats: %s", err)
            time.sleep(STATS_EVERY)
    threading.Thread(target=loop, name="soak-stats", daemon=True).start()


def _connection_counts() -> dict:
    """Client-side prepared statements of every psycopg connection alive here."""
    conns = [o for o in gc.get_objects() if isinstance(o, psycopg.Connection)]
    prepared = [len(c._prepared._names) for c in conns if not c.closed]
    seen = [len(c._prepared._counts) for c in conns if not c.closed]
    return {"py_connections": len(prepared), "prepared_max": max(prepared, default=0),
            "prepared_sum": sum(prepared), "prepare_counts_sum": sum(seen),
            "py_objects": len(gc.get_objects())}


def run_worker(dsn: str, stats: Path, maintain: bool) -> None:
    from awa_sql import PartitionedQueue
    from awa_sql.metrics import client_metrics
    from awa_sql.worker import Retry, Worker

    def ok(job) -> None:
        time.sleep(0.002)

    def flaky(job) -> None:
        if job.attempt == 1:
            raise RuntimeError("soak: fails its first attempt")
        if job.attempt == 2:
            raise Retry("soak: asks for a retry", after=timedelta(seconds=1))

    def doomed(job) -> None:
        raise ValueError(f"soak: always fails (attempt {job.attempt})")

    async def slow_async(job) -> None:
        await asyncio.sleep(3)  # past its 1 s max run time: cancelled

    def slow_sync(job) -> None:
        time.sleep(1.5)  # past its 1 s max run time: rescued

    handlers = {"ok": ok, "flaky": flaky, "doomed": doomed, "slow_async": slow_async,
                "slow_sync": slow_sync}
    configs = [{"queue": "soak_s1", "max_workers": 3}, {"queue": "soak_auto", "max_workers": 3},
               *PartitionedQueue("soak_part", PARTITIONS).queue_configs(
                   max_workers_per_partition=1)]
    worker = Worker(dsn, queues=configs, handlers=handlers, lease=timedelta(seconds=15),
                    poll_interval=0.2, maintain=maintain)

    def counts() -> dict:
        with worker._lock:
            held, back = len(worker._running), len(worker._handed_back)
        runtime = worker.runtime
        m = worker.maintainer
        return {"held": held, "handed_back": back, "completed": worker.completed,
                "failed": worker.failed, "claims": worker.claims,
                "runtime_keys": len(runtime._last) if runtime else 0,
                "lane_wait_conns": len(client_metrics._last_wait),
                "maintain_due": len(m._due) if m else 0,
                "maintain_failing": len(m._failing) if m else 0,
                "metric_samples": sum(len(f.samples) for f in
                                      client_metrics.current().registry.collect()),
                **_connection_counts()}

    _stats_writer(stats, counts)
    worker.run()


def run_producer(dsn: str, stats: Path, rate: float) -> None:
    from awa_sql import Producer
    from awa_sql.metrics import client_metrics

    producer = Producer(dsn)
    rng = random.Random(7)
    n = 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def counts() -> dict:
        return {"enqueued": n, "runtime_keys": len(producer.runtime._last),
                "lane_wait_conns": len(client_metrics._last_wait),
                "metric_samples": sum(len(f.samples) for f in
                                      client_metrics.current().registry.collect()),
                **_connection_counts()}

    _stats_writer(stats, counts)
    # One round a second: a fifth of the jobs single, two fifths a batch, two
    # fifths a COPY; special kinds among the singles.
    per_round = max(int(rate), 5)
    while not stop.is_set():
        started = time.monotonic()
        singles = per_round // 5
        for i in range(singles):
            pick = rng.random()
            if pick < 0.15:
                # A unique key of 300, held 2 s after completion: duplicates come.
                producer.enqueue("ok", {"i": i}, queue="soak_s1",
                                 unique_key=f"u{rng.randrange(300)}",
                                 unique_window=timedelta(seconds=2))
            elif pick < 0.25:
                producer.enqueue("flaky", {"i": i}, queue="soak_s1", max_attempts=3)
            elif pick < 0.30:
                producer.enqueue("doomed", {"i": i}, queue="soak_s1", max_attempts=2)
            elif pick < 0.33:
                producer.enqueue(rng.choice(("slow_async", "slow_sync")), {"i": i},
                                 queue="soak_s1", max_attempts=2,
                                 max_run_time=timedelta(seconds=1))
            elif pick < 0.66:
                producer.enqueue("ok", {"i": i}, queue="soak_auto",
                                 ordering_key=f"k{rng.randrange(64)}")
            else:
                producer.enqueue("ok", {"i": i}, queue="soak_part",
                                 ordering_key=f"a{rng.randrange(1000)}")
        batch = (per_round * 2) // 5
        producer.enqueue_many([{"kind": "ok", "args": {"b": j}, "queue": rng.choice(QUEUES),
                                "ordering_key": f"k{rng.randrange(64)}"}
                               for j in range(batch)])
        copied = per_round - singles - batch
        jobs = [{"kind": "ok", "args": {"c": j}, "queue": rng.choice(QUEUES)}
                for j in range(copied)]
        if rng.random() < 0.2:  # now and then a COPY with unique keys
            for j in jobs[:5]:
                j.update(queue="soak_s1", unique_key=f"c{rng.randrange(300)}",
                         unique_window=timedelta(seconds=2))
        producer.enqueue_many_copy(jobs)
        n += per_round
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    producer.close()


# -- the driver -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server() -> Iterator[tuple[str, Path | None]]:
    """The DSN of a fresh database with awa installed, and the server's log (None: a given DSN)."""
    from awa_sql import migrate
    from awa_sql.demo import embedded
    from awa_sql.roles import Roles

    if dsn := os.environ.get("AWA_BENCH_DSN"):
        yield dsn, None
        return
    workdir = Path(tempfile.mkdtemp(prefix="awa-soak-"))
    local = embedded.LocalServer(embedded.ensure_binaries(18), workdir / "pgdata",
                                 settings=BENCH_SETTINGS)
    local.start()
    try:
        dsn = local.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        yield dsn, local.log_file
    finally:
        local.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def set_up(dsn: str) -> None:
    from awa_sql import client

    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue in QUEUES:
            client.enqueue(conn, "ok", {"setup": True}, queue=queue)
        conn.execute("select awa.set_queue_partitions('soak_part', %s)", [PARTITIONS])
        conn.execute("select awa.set_enqueue_shards('soak_auto', 8)")
        conn.execute("select awa.set_shard_mode('soak_auto', 'auto', 8)")
        conn.execute("select awa.set_autoscale_policy('soak_auto', grow_window => '20 seconds',"
                     " cooldown => '20 seconds', shrink_window => '2 minutes')")
        conn.execute("select awa.set_retry_policy('soak_s1', '1 second', '5 seconds', 0.2)")
        for queue in QUEUES:
            conn.execute("select awa.set_retention(%s, %s::interval, %s::interval)",
                         [queue, RETENTION, RETENTION])


class Process:
    def __init__(self, name: str, argv: list[str], logdir: Path, env: dict) -> None:
        self.name = name
        self.log = logdir / f"{name}.log"
        self._out = self.log.open("wb")
        self.popen = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                      cwd=ROOT)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(40)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._out.close()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon (kB) and Threads of a process; {} when it is gone."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "Threads"):
                out[key] = int(value.split()[0])
    except OSError:
        return {}
    return out


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def line_count(path: Path) -> int:
    with contextlib.suppress(OSError), path.open("rb") as f:
        return sum(1 for _ in f)
    return 0


# Per table of schema awa, partitions and indexes summed: size, dead and live rows.
TABLES_SQL = """
select r.relname,
       sum(pg_catalog.pg_total_relation_size(t.relid))::bigint,
       coalesce(sum(s.n_dead_tup), 0)::bigint,
       coalesce(sum(s.n_live_tup), 0)::bigint
  from pg_catalog.pg_class as r
  -- The table and its partitions, if any (pg_partition_tree has no row
  -- for a table that is not partitioned).
  cross join lateral (
      select r.oid
      union all
      select p.relid from pg_catalog.pg_partition_tree(r.oid) as p where p.relid <> r.oid
  ) as t (relid)
  left join pg_catalog.pg_stat_all_tables as s on s.relid = t.relid
 where r.relnamespace = 'awa'::pg_catalog.regnamespace
   and r.relkind in ('r', 'p') and not r.relispartition
 group by r.relname
"""
FINISHED_SQL = """
select coalesce(sum(completed), 0), coalesce(sum(failed), 0), coalesce(sum(cancelled), 0),
       coalesce(sum(retried), 0), coalesce(sum(ready), 0), coalesce(sum(scheduled), 0)
  from awa.queue_overview
"""


class Sampler:
    """One row per (sample, series) in the CSV."""

    def __init__(self, dsn: str, out: Path, procs: dict[str, Process], stats: dict[str, Path],
                 loops: dict[str, Poller]) -> None:
        self.dsn, self.procs, self.stats, self.loops = dsn, procs, stats, loops
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="awa-soak sampler")
        self.file = out.open("w", newline="")
        self.csv = csv.writer(self.file)
        self.csv.writerow(["elapsed_s", "series", "value"])
        self.started = time.monotonic()
        self._last: dict[str, tuple[float, float]] = {}  # counter -> (time, value)

    def _rate(self, name: str, now: float, value: float) -> float | None:
        """Per minute since the last sample of the counter ``name``."""
        before = self._last.get(name)
        self._last[name] = (now, value)
        if before is None or now <= before[0]:
            return None
        return (value - before[1]) * 60.0 / (now - before[0])

    def sample(self) -> None:
        now = time.monotonic()
        row: dict[str, float] = {}
        for name, proc in self.procs.items():
            st = proc_status(proc.popen.pid)
            row[f"{name}.rss_kb"] = st.get("VmRSS", -1)
            row[f"{name}.threads"] = st.get("Threads", -1)
            row[f"{name}.fds"] = open_files(proc.popen.pid)
            row[f"{name}.alive"] = 1 if proc.popen.poll() is None else 0
            if (r := self._rate(f"{name}.log", now, line_count(proc.log))) is not None:
                row[f"{name}.log_lines_per_min"] = r
        for name, path in self.stats.items():
            with contextlib.suppress(OSError, ValueError):
                for key, value in json.loads(path.read_text()).items():
                    if key in ("completed", "failed", "claims", "enqueued"):
                        if (r := self._rate(f"{name}.{key}", now, value)) is not None:
                            row[f"{name}.{key}_per_min"] = r
                    else:
                        row[f"{name}.{key}"] = value
        for name, loop in self.loops.items():
            ok, failed, seconds = loop.take()
            row[f"{name}.requests"] = ok
            row[f"{name}.failures"] = failed
            row[f"{name}.mean_ms"] = seconds * 1000.0 / ok if ok else -1
        self._database(row, now)
        elapsed = round(now - self.started, 1)
        for series, value in sorted(row.items()):
            self.csv.writerow([elapsed, series, round(float(value), 3)])
        self.file.flush()

    def _database(self, row: dict[str, float], now: float) -> None:
        conns: dict[str, int] = defaultdict(int)
        anon: dict[str, int] = defaultdict(int)
        for app, pid, backend in self.conn.execute(
                "select coalesce(nullif(application_name, ''), backend_type), pid, backend_type"
                " from pg_catalog.pg_stat_activity where pid <> pg_catalog.pg_backend_pid()"):
            if backend != "client backend" or app.startswith("awa-soak"):
                continue  # the soak's own connections are not measured
            conns[app] += 1
            anon[app] += proc_status(pid).get("RssAnon", 0)
        for app in conns:
            row[f"pg.conns.{app}"] = conns[app]
            row[f"pg.backend_anon_kb.{app}"] = anon[app]
            # A pool's connections come and go: per connection, the growth of one.
            row[f"pg.backend_anon_kb_per_conn.{app}"] = anon[app] / conns[app]
        row["pg.conns.total"] = sum(conns.values())
        row["pg.backend_anon_kb.total"] = sum(anon.values())
        for table, size, dead, live in self.conn.execute(TABLES_SQL):
            row[f"table.{table}.bytes"] = size
            row[f"table.{table}.dead"] = dead
            row[f"table.{table}.live"] = live
        completed, failed, cancelled, retried, ready, scheduled = self.conn.execute(
            FINISHED_SQL).fetchone()
        for name, value in (("completed", completed), ("failed", failed),
                            ("cancelled", cancelled), ("retried", retried)):
            if (r := self._rate(f"jobs.{name}", now, float(value))) is not None:
                row[f"jobs.{name}_per_min"] = r
        row["jobs.ready"], row["jobs.scheduled"] = ready, scheduled
        row["pg.database_bytes"] = self.conn.execute(
            "select pg_catalog.pg_database_size(pg_catalog.current_database())").fetchone()[0]

    def close(self) -> None:
        self.file.close()
        self.conn.close()


class Poller:
    """GETs ``urls`` in turn every ``every`` seconds in a thread; counts answers."""

    def __init__(self, name: str, urls, every: float) -> None:
        self.name, self.urls, self.every = name, urls, every
        self._lock = threading.Lock()
        self._ok = self._failed = 0
        self._seconds = 0.0
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def take(self) -> tuple[int, int, float]:
        with self._lock:
            got = (self._ok, self._failed, self._seconds)
            self._ok = self._failed = 0
            self._seconds = 0.0
        return got

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for url in self.urls():
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310
                        answer.read()
                    ok = True
                except Exception as err:
                    ok = False
                    if len(self.errors) < 20:
                        self.errors.append(f"{url}: {err}")
                with self._lock:
                    if ok:
                        self._ok += 1
                        self._seconds += time.perf_counter() - started
                    else:
                        self._failed += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def admin_urls(base: str, dsn: str):
    """The admin API's main reads: server, queues, a queue, its history, its
    jobs, failures, one job (the newest), the page."""
    newest = [0]

    def urls() -> list[str]:
        with contextlib.suppress(psycopg.Error), psycopg.connect(
                dsn, autocommit=True, application_name="awa-soak driver") as conn:
            newest[0] = conn.execute("select coalesce(max(job_id), 0) from awa.finished"
                                     ).fetchone()[0]
        q = random.choice(QUEUES)
        return [f"{base}/api/server", f"{base}/api/queues", f"{base}/api/queues/{q}",
                f"{base}/api/queues/{q}/history", f"{base}/api/queues/{q}/jobs?limit=20",
                f"{base}/api/queues/{q}/jobs?state=failed&limit=20", f"{base}/api/failures",
                f"{base}/api/jobs/{newest[0]}", f"{base}/"]
    return urls


def canceller(dsn: str, env: dict, stop: threading.Event, every: float, done: list) -> None:
    """Every ``every`` s a job scheduled an hour out, cancelled with `awa jobs cancel`."""
    from awa_sql import client

    while not stop.wait(every):
        try:
            with psycopg.connect(dsn, autocommit=True,
                                 application_name="awa-soak driver") as conn:
                job = client.enqueue(conn, "ok", {"cancel": True}, queue="soak_s1",
                                     run_at=datetime.now(UTC) + timedelta(hours=1))
            result = subprocess.run([*AWA, "jobs", "cancel", "--dsn", dsn, str(job.job_id)],
                                    capture_output=True, text=True, env=env, check=False)
            done.append(0 if result.returncode == 0
                        else f"exit {result.returncode}: {result.stderr.strip()}")
        except Exception as err:  # counted, not raised in the thread
            done.append(f"{type(err).__name__}: {err}")


def soak(args: argparse.Namespace) -> list[_docs.Target]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "installer"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    logdir = Path(tempfile.mkdtemp(prefix="awa-soak-logs-"))
    with server() as (dsn, _server_log):
        set_up(dsn)
        me = [sys.executable, str(Path(__file__).resolve())]
        stats = {"worker": logdir / "worker.json", "producer": logdir / "producer.json"}
        mport, aport = free_port(), free_port()
        procs: dict[str, Process] = {}
        procs["worker"] = Process("worker", [*me, "--role", "worker", "--dsn", dsn, "--stats",
                                             str(stats["worker"]), "--maintain", args.maintain],
                                  logdir, env)
        if args.maintain in ("cli", "both"):
            procs["maintain"] = Process("maintain", [*AWA, "maintain", "--dsn", dsn], logdir, env)
        procs["metrics"] = Process("metrics", [*AWA, "metrics", "serve", "--dsn", dsn,
                                               "--port", str(mport)], logdir, env)
        procs["admin"] = Process("admin", [*AWA, "admin", "serve", "--dsn", dsn,
                                           "--port", str(aport)], logdir, env)
        procs["producer"] = Process("producer", [*me, "--role", "producer", "--dsn", dsn,
                                                 "--stats", str(stats["producer"]),
                                                 "--rate", str(args.rate)], logdir, env)
        loops = {"scrape": Poller("scrape", lambda: [f"http://127.0.0.1:{mport}/metrics"], 2.0),
                 "admin_poll": Poller("admin_poll",
                                      admin_urls(f"http://127.0.0.1:{aport}", dsn), 3.0)}
        stop = threading.Event()
        cancels: list[int] = []
        cancel_thread = threading.Thread(target=canceller, args=(dsn, env, stop, 30.0, cancels),
                                         daemon=True)
        sampler = None
        try:
            time.sleep(3)  # the servers bind their ports
            for loop in loops.values():
                loop.start()
            cancel_thread.start()
            sampler = Sampler(dsn, Path(args.out), procs, stats, loops)
            end = time.monotonic() + args.minutes * 60
            while (left := end - time.monotonic()) > 0:
                sampler.sample()
                dead = [n for n, p in procs.items() if p.popen.poll() is not None]
                if dead:
                    raise SystemExit(f"soak: {', '.join(dead)} ended early; logs in {logdir}")
                time.sleep(min(args.every, max(left, 0.1)))
            sampler.sample()
        finally:
            stop.set()
            for loop in loops.values():
                loop.stop()
            cancel_thread.join(30)
            for proc in reversed(list(procs.values())):
                proc.stop()
            if sampler is not None:
                sampler.close()
    print(f"# soak: {machine()}; PostgreSQL 18; {args.minutes:g} min, a sample every"
          f" {args.every:g} s, slopes after {args.warmup:g} min; producer {args.rate:g} jobs/s;"
          f" maintenance: {args.maintain}; logs in {logdir}")
    errors = [e for loop in loops.values() for e in loop.errors]
    cancel_ok = sum(1 for rc in cancels if rc == 0)
    failed_cancel = next((rc for rc in cancels if rc != 0), None)
    print(f"cancels by the CLI: {cancel_ok} of {len(cancels)} exited 0"
          f"{f' ({failed_cancel})' if failed_cancel else ''};"
          f" request errors: {len(errors)}{': ' + errors[0] if errors else ''}")
    return summarise(Path(args.out), args.warmup)


# -- the analysis ---------------------------------------------------------------------------


def read_series(path: Path) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            series[row["series"]].append((float(row["elapsed_s"]), float(row["value"])))
    return series


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope (per second) and r^2 of ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    if sxx == 0:
        return 0.0, 0.0
    slope = sxy / sxx
    return slope, (sxy * sxy / (sxx * syy) if syy else 0.0)


def floor_of(name: str) -> float:
    for suffix, floor in FLOORS.items():
        if name.endswith(suffix) or f"_{suffix}." in name:
            return floor
    return COUNT_FLOOR


# Series that grow through a run shorter than the window that bounds them.
BY_DESIGN = {
    "table.finished.": "a slot of the ring holds an hour",
    "pg.database_bytes": "awa.finished's slot",
    "table.contention_samples.": "samples kept an hour",
    "table.autoscale_decisions.": "decisions kept 24 h",
    "table.autoscale_decision_counts.": "one row per queue and action",
    "table.shard_changes.": "changes of S kept 90 days",
    "table.shard_change_lanes.": "lanes of each change of S, kept with it",
}


def verdict(name: str, points: list[tuple[float, float]]) -> tuple[str, float, float, float]:
    """(verdict, slope per hour, change over the span relative to the mean, r^2)."""
    slope, r2 = fit(points)
    span = points[-1][0] - points[0][0]
    mean = sum(y for _, y in points) / len(points)
    change = slope * span
    relative = change / abs(mean) if mean else (float("inf") if change else 0.0)
    grows = r2 >= MIN_R2 and relative >= GROWTH_SHARE and change >= floor_of(name)
    falls = r2 >= MIN_R2 and relative <= -GROWTH_SHARE and -change >= floor_of(name)
    if name.endswith("_per_min") or name.endswith("requests"):
        word = "degrades" if falls else "steady"
    elif not grows and name.endswith("_kb") and r2 >= CREEP_R2 \
            and slope * 3600 >= CREEP_KB_PER_HOUR:
        word = "creeps"
    elif grows:
        why = next((why for prefix, why in BY_DESIGN.items() if name.startswith(prefix)), None)
        word = f"grows (by design: {why})" if why else "grows"
    else:
        word = "flat" if not falls else "falls"
    return word, slope * 3600, relative, r2


def _shown(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def summarise(path: Path, warmup_minutes: float) -> list[_docs.Target]:
    series = read_series(path)
    rows, flagged, constant, creeping = [], [], [], []
    for name in sorted(series):
        if "awa-soak" in name:  # the soak's own connections, in a CSV of before they were left out
            continue
        points = [p for p in series[name] if p[0] >= warmup_minutes * 60]
        if len(points) < 4:
            continue
        if all(y == points[0][1] for _, y in points):
            if not name.endswith(".alive"):
                constant.append(f"{name} {_shown(points[0][1])}")
            continue
        word, per_hour, relative, r2 = verdict(name, points)
        first, last = points[0][1], points[-1][1]
        rows.append(f"| {name} | {_shown(first)} | {_shown(last)} | {_shown(per_hour)} |"
                    f" {relative:+.1%} | {r2:.2f} | {word} |")
        if word in ("grows", "degrades"):
            flagged.append(name)
        elif word == "creeps":
            creeping.append(name)
    span = max(p[0] for pts in series.values() for p in pts) / 60
    print(f"\n{len(rows) + len(constant)} series, {span:.1f} min; warm-up {warmup_minutes:g} min"
          " dropped; constant after it:")
    print(textwrap.fill(", ".join(constant), 100) + "\n")
    print("| series | after warm-up | last | slope / h | change / mean | r^2 | verdict |")
    print("|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print(f"\nflagged: {', '.join(flagged) if flagged else 'none'};"
          f" memory that creeps: {', '.join(creeping) if creeping else 'none'}")
    return [_docs.Target("no series grows or degrades after the warm-up", not flagged,
                         f"{len(flagged)} flagged" if flagged else "none flagged"),
            _docs.Target(f"no memory creeps (r^2 >= {CREEP_R2}, >= {CREEP_KB_PER_HOUR:g} kB/h)",
                         not creeping, ", ".join(creeping) if creeping else "none")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", default="soak.csv", help="the CSV of samples")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="minutes left out of the fit")
    parser.add_argument("--rate", type=float, default=60.0, help="jobs per second enqueued")
    parser.add_argument("--maintain", choices=("worker", "cli", "both"), default="both",
                        help="who runs the maintenance loop: the Worker, `awa maintain`, both")
    parser.add_argument("--analyse", metavar="CSV", help="only summarise a CSV written before")
    parser.add_argument("--role", choices=("worker", "producer"), help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    _docs.add_argument(parser)
    args = parser.parse_args()
    if args.role:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        if args.role == "worker":
            run_worker(args.dsn, Path(args.stats), args.maintain != "cli")
        else:
            run_producer(args.dsn, Path(args.stats), args.rate)
        return
    if args.analyse:
        summarise(Path(args.analyse), args.warmup)
        return
    block = _docs.Block(__file__, "Soak", args.write_docs)
    block.write(soak(args))


if __name__ == "__main__":
    main()
