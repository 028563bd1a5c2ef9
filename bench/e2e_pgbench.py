"""Producers and workers at once, with a C client (pgbench) on both sides:
does the worker side keep up with the producer side, and for how long?

Each cell runs two pgbench processes side by side against one PostgreSQL 18
(synchronous commit on, fsync on, autovacuum on: the server's defaults), in
a database copied afresh from a template, so that no cell inherits another's
rows or dead tuples:
  P producers  one job per transaction
  W workers    one claim of one job and its completion per transaction (an
               empty claim is a transaction too: workers never sleep, unless
               --idle-sleep-ms N, after an empty claim)
Cells:
  awa S=1, 8, 16  awa.enqueue('q', 'bench.job') into queue q at S lanes
                  (awa.set_enqueue_shards), and
                  select count(awa.complete(c.job_id, c.run_lease))
                    from awa.claim(array['q'], 1, 'w') c
  plain           a plain table with a bigserial id: INSERT, and a DELETE of
                  the lowest id FOR UPDATE SKIP LOCKED moved into a history
                  table in the same statement
  procrastinate   procrastinate_defer_jobs_v1, and procrastinate_fetch_job_v2
                  with procrastinate_finish_job_v1 (the job kept, as
                  succeeded) in the same statement
Two more cells (not targets; --cells mirror,s8x2) show what the worker's
cost decides:
  mirror          awa S=8 producers, and workers that do exactly a producer's
                  work: awa.enqueue into a second queue at S=8 (consumed
                  counts those jobs). At equal cost per transaction the two
                  sides run at the same rate: this is the boundary a
                  claim-one worker has to reach.
  s8x2            awa S=8, workers claiming up to 2 jobs per transaction
                  (awa.claim(array['q'], 2, 'w')) and completing them in it
Cells are interleaved per run (run 1 of every cell, then run 2, ...).

Per cell, the median of the runs: produced/s and consumed/s over the cell,
the backlog left at the end (awa.ready + awa.running, the plain table, and
procrastinate's todo + doing jobs) and its share of what was produced, the
workers' transactions/s (empty claims included), and consumed/s per 10 s.
Produced is pgbench's count of the producers' transactions; consumed is
produced less the backlog. The 10-s series comes from a sampling connection
that reads the producers' sequence and counts the backlog every 10 s
(pgbench's own --progress would count empty claims as work).

Target: at S = 8 and 16, consumed/s >= produced/s (within 1 job/s: what is
left at the end is what was in flight) and the backlog < 5% of the jobs
produced.

    python bench/e2e_pgbench.py [--seconds 60] [--runs 3] [--producers 8]
                                [--workers 8] [--cells s1,s8,s16,plain,procrastinate,mirror,s8x2]
                                [--idle-sleep-ms 0] [--waits]

--long: awa at S = 8 only, --runs (3) rounds of two runs of --long-seconds
(600): one plain and one with another connection holding a repeatable-read
snapshot open for the whole run. Every --every (30) s it prints consumed/s,
the backlog (the lane sequences' last values less awa.run_lease_seq's, i.e.
produced less claimed: no scan; without that sequence, count(*) of
awa.ready and awa.running; the output says which) and the dead tuples of
awa.ready, awa.running, awa.finished (their partitions summed, if any) and
awa.lane_hints. `awa maintain`'s loop runs beside it, at its default
cadences, as it would in production: it empties the idle slot of
awa.running (ADR 034) and rewrites awa.lane_hints and awa.ready once a
held snapshot has left them dead rows (ADR 035, ADR 036). Target: the last
minute's consumed/s >= 0.9 x the first minute's, the median of the runs (an
hour at the defaults).

    python bench/e2e_pgbench.py --long [--long-seconds 600] [--runs 3]

--waits: where each side's backends spend their time. Every 20 ms a
sampling connection reads pg_stat_activity for the cell's two pgbench
processes (told apart by application_name) and counts each backend's
wait event while it runs a statement, "on CPU" when it has none (running,
or waiting for a core); "between statements" is a backend idle while its
pgbench client reads the result and sends the next. Also the WAL each
transaction wrote (pg_stat_wal over the cell: records, full-page images,
bytes, both sides together). Summed over the runs; printed after the
report.

--write-docs writes the run's block of docs/benchmarks.md (--long has a
block of its own).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import errors
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from awa_sql import migrate
from awa_sql.maintain import Maintainer
from awa_sql.roles import Roles
from bench import _docs
from bench._pgbench import install_procrastinate, pgbench_binary, pgbench_version, table
from bench._server import bench_server, machine
from bench.enqueue_pgbench import PROCRASTINATE_JOB

QUEUE = "q"
MIRROR_QUEUE = "q2"
TEMPLATE = "awa_e2e_template"
CELL_DB = "awa_e2e_cell"
TARGET_SHARDS = (8, 16)
MAX_BACKLOG_SHARE = 0.05
MIN_LONG_RATIO = 0.9
HOT_TABLES = ("awa.ready", "awa.running", "awa.finished", "awa.lane_hints")

AWA_PRODUCED = ("select coalesce((select sum(pg_sequence_last_value(l.seq))"
                " from awa.lanes as l), 0)::bigint")

PLAIN_TABLES = """
create table public.plain_jobs (
    id bigserial primary key,
    queue text not null,
    kind text not null,
    args jsonb not null default '{}',
    priority smallint not null default 2,
    attempt integer not null default 0,
    enqueued_at timestamptz not null default now()
);
create table public.plain_history (
    job_id bigint primary key,
    queue text not null,
    kind text not null,
    state text not null,
    attempt integer not null,
    enqueued_at timestamptz not null,
    finished_at timestamptz not null default now()
);
"""


@dataclass(frozen=True)
class System:
    """One cell: the two pgbench scripts, and how to count its jobs."""

    key: str
    name: str
    producer: str
    worker: str  # {worker_id} is procrastinate's registered worker
    # One row: jobs produced so far (a sequence, so no scan), and the backlog.
    counts: str
    shards: int | None = None
    # A cell the targets are read from (awa S = 8 and 16, claiming one).
    targeted: bool = False
    # Queues beside QUEUE the cell sets to `shards` lanes.
    extra_queues: tuple[str, ...] = ()
    # The worker's statement returning one row, count: the jobs it finished
    # (for --idle-sleep-ms); the worker's own when it already does.
    counted: str | None = None

    def worker_script(self, values: dict[str, str], idle_ms: int) -> str:
        if not idle_ms:
            return self.worker.format(**values) + ";\n"
        return ((self.counted or self.worker).format(**values)
                + f" \\gset\n\\if :count = 0\n\\sleep {idle_ms} ms\n\\endif\n")


def produced_in(queue: str) -> str:
    """Jobs enqueued into one queue so far: its lanes' sequences, no scan."""
    return ("(select coalesce(sum(pg_sequence_last_value(l.seq)), 0)::bigint from awa.lanes as l"
            f" join awa.queue_meta as m using (queue_id) where m.queue = '{queue}')")


def systems() -> list[System]:
    awa = [System(
        f"s{s}", f"awa S={s}",
        f"select awa.enqueue('{QUEUE}', 'bench.job');\n",
        "select count(awa.complete(c.job_id, c.run_lease))"
        f" from awa.claim(array['{QUEUE}'], 1, 'w') c",
        f"select ({AWA_PRODUCED}), (select count(*) from awa.ready)"
        " + (select count(*) from awa.running)",
        shards=s, targeted=s in TARGET_SHARDS) for s in (1, 8, 16)]
    mirror = System(
        "mirror", "mirror S=8",
        awa[1].producer,
        f"select awa.enqueue('{MIRROR_QUEUE}', 'bench.job')",
        f"select {produced_in(QUEUE)}, {produced_in(QUEUE)} - {produced_in(MIRROR_QUEUE)}",
        shards=8, extra_queues=(MIRROR_QUEUE,),
        counted=f"select count(awa.enqueue('{MIRROR_QUEUE}', 'bench.job'))")
    pairs = System(
        "s8x2", "awa S=8, claims of 2", awa[1].producer,
        "select count(awa.complete(c.job_id, c.run_lease))"
        f" from awa.claim(array['{QUEUE}'], 2, 'w') c",
        awa[1].counts, shards=8)
    take = ("with j as (delete from plain_jobs where id = (select id from plain_jobs order by id"
            " for update skip locked limit 1) returning *)")
    move = ("insert into plain_history (job_id, queue, kind, state, attempt, enqueued_at)"
            " select j.id, j.queue, j.kind, 'completed', j.attempt + 1, j.enqueued_at from j")
    plain = System(
        "plain", "plain",
        f"insert into plain_jobs (queue, kind, args) values ('{QUEUE}', 'bench.job', '{{}}');\n",
        f"{take} {move}",
        "select coalesce(pg_sequence_last_value('public.plain_jobs_id_seq'), 0),"
        " (select count(*) from public.plain_jobs)",
        counted=f"{take}, h as ({move} returning 1) select count(*) from h")
    peer = System(
        "procrastinate", "procrastinate",
        f"select procrastinate_defer_jobs_v1(array[{PROCRASTINATE_JOB}]);\n",
        "select count(*) from procrastinate_fetch_job_v2('{{default}}', {worker_id}) as f"
        " cross join lateral (select procrastinate_finish_job_v1(f.id, 'succeeded', false))"
        " as done where f.id is not null",
        "select coalesce(pg_sequence_last_value('public.procrastinate_jobs_id_seq'), 0),"
        " (select count(*) from public.procrastinate_jobs where status in ('todo', 'doing'))")
    return [*awa, plain, peer, mirror, pairs]


# --- pure parts (tests/test_e2e_pgbench.py) ---------------------------------

_PROCESSED = re.compile(r"^number of transactions actually processed: ([0-9]+)", re.M)
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.M)
_FAILED = re.compile(r"number of failed transactions: ([1-9][0-9]*)")


def parse_pgbench(stdout: str) -> tuple[int, float]:
    """(transactions processed, tps) from pgbench's summary."""
    processed, tps = _PROCESSED.search(stdout), _TPS.search(stdout)
    if not processed or not tps or _FAILED.search(stdout):
        raise ValueError("no clean pgbench summary")
    return int(processed.group(1)), float(tps.group(1))


Sample = tuple[float, int]  # (seconds since the start, jobs consumed so far)


def window_rates(samples: Sequence[Sample]) -> list[float]:
    """Jobs/s between consecutive samples."""
    return [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in itertools.pairwise(samples)
            if t1 > t0]


def first_last(samples: Sequence[Sample], window: float) -> tuple[float, float]:
    """Jobs/s over the first and over the last `window` seconds, taken between
    the samples nearest those bounds."""
    start, end = samples[0], samples[-1]
    first = min(samples[1:], key=lambda s: abs(s[0] - start[0] - window))
    last = min(samples[:-1], key=lambda s: abs(end[0] - s[0] - window))
    return ((first[1] - start[1]) / (first[0] - start[0]),
            (end[1] - last[1]) / (end[0] - last[0]))


def keeps_up(produced_rate: float, consumed_rate: float) -> bool:
    """consumed/s >= produced/s to within 1 job/s: consumed is produced less
    what is left at the end, so it cannot exceed it, and a cell that kept up
    still ends with the jobs in flight at the stop."""
    return produced_rate - consumed_rate < 1.0


def median_series(series: Sequence[Sequence[float]]) -> list[float]:
    """The median of each window over runs (runs cut to the shortest)."""
    n = min(map(len, series)) if series else 0
    return [statistics.median(s[i] for s in series) for i in range(n)]


# --- the server side -------------------------------------------------------


def db_dsn(dsn: str, dbname: str) -> str:
    return make_conninfo(dsn, dbname=dbname)


def make_template(dsn: str) -> str:
    """A database with awa, procrastinate and the plain tables, to copy per
    cell. Returns procrastinate's version."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        drop_database(admin, CELL_DB)
        with contextlib.suppress(errors.InvalidCatalogName):
            admin.execute(f"alter database {TEMPLATE} is_template false")
        drop_database(admin, TEMPLATE)
        admin.execute(f"create database {TEMPLATE}")
    with psycopg.connect(db_dsn(dsn, TEMPLATE), autocommit=True) as conn:
        migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        version = install_procrastinate(conn)
        conn.execute(PLAIN_TABLES)
        conn.execute("vacuum analyze")
    with psycopg.connect(dsn, autocommit=True) as admin:
        # No connections: autovacuum leaves it alone and copies never wait.
        admin.execute(f"alter database {TEMPLATE} with is_template true allow_connections false")
    return version


def drop_database(admin: psycopg.Connection, name: str) -> None:
    admin.execute(f"drop database if exists {name} with (force)")


def fresh_cell(admin: psycopg.Connection) -> None:
    drop_database(admin, CELL_DB)
    for attempt in range(20):
        try:
            admin.execute(f"create database {CELL_DB} template {TEMPLATE}")
            return
        except errors.ObjectInUse:
            if attempt == 19:
                raise
            time.sleep(0.5)


@contextlib.contextmanager
def cell_database(dsn: str, system: System) -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh copy of the template, set up for `system`: its DSN and the
    values to put in its scripts."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        fresh_cell(admin)
        cell = db_dsn(dsn, CELL_DB)
        values: dict[str, str] = {}
        try:
            with psycopg.connect(cell, autocommit=True) as conn:
                if system.shards is not None:
                    for queue in (QUEUE, *system.extra_queues):
                        conn.execute("select awa.set_enqueue_shards(%s, %s)",
                                     [queue, system.shards])
                if system.key == "procrastinate":
                    values["worker_id"] = str(conn.execute(
                        "select worker_id from procrastinate_register_worker_v1()"
                    ).fetchone()[0])
            admin.execute("checkpoint")
            yield cell, values
        finally:
            drop_database(admin, CELL_DB)


class Sampler(threading.Thread):
    """Runs `read` at start + k x every for every k with k x every <= until,
    on its own connection, unless stopped."""

    def __init__(self, dsn: str, every: float, until: float,
                 read: Callable[[psycopg.Connection], object], start: float,
                 on_sample: Callable[[float, object], None] | None = None):
        super().__init__(daemon=True)
        self.dsn, self.every, self.until, self.read = dsn, every, until, read
        self.start_at, self.on_sample = start, on_sample
        self.samples: list[tuple[float, object]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                k = 1
                while k * self.every <= self.until + 1e-9:
                    due = self.start_at + k * self.every
                    if self.stopping.wait(max(0.0, due - time.monotonic())):
                        return
                    at = time.monotonic() - self.start_at
                    value = self.read(conn)
                    self.samples.append((at, value))
                    if self.on_sample:
                        self.on_sample(at, value)
                    k += 1
        except BaseException as exc:  # re-raised by the caller
            self.error = exc


WAIT_SIDES = ("producers", "workers")
WAL_SQL = "select wal_records, wal_fpi, wal_bytes from pg_stat_wal"


class WaitSampler(threading.Thread):
    """--waits: counts, per side, the wait events of its backends every
    `every` s until stopped."""

    def __init__(self, dsn: str, every: float = 0.02):
        super().__init__(daemon=True)
        self.dsn, self.every = dsn, every
        self.counts: dict[str, collections.Counter[str]] = {
            side: collections.Counter() for side in WAIT_SIDES}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.wait(self.every):
                    for app, state, kind, event in conn.execute(
                            "select application_name, state, wait_event_type, wait_event"
                            "  from pg_stat_activity"
                            " where application_name = any(%s)",
                            [[f"e2e-{side}" for side in WAIT_SIDES]]):
                        self.counts[app.removeprefix("e2e-")][wait_label(state, kind, event)] += 1
        except BaseException as exc:  # re-raised by the caller
            self.error = exc


def wait_label(state: str | None, kind: str | None, event: str | None) -> str:
    """One sample of a backend, as --waits prints it."""
    if state != "active":
        return "between statements"
    return f"{kind}/{event}" if kind else "on CPU"


@dataclass
class Side:
    """One running pgbench process."""

    name: str
    proc: subprocess.Popen[bytes]
    script: str
    out: Path
    err: Path

    def result(self) -> tuple[int, float]:
        stdout, stderr = self.out.read_text(), self.err.read_text()
        try:
            if self.proc.returncode != 0:
                raise ValueError(f"exit {self.proc.returncode}")
            return parse_pgbench(stdout)
        except ValueError as exc:
            raise RuntimeError(f"pgbench {self.name} failed ({exc}):\n{self.script}\n"
                               f"{stdout}\n{stderr[-4000:]}") from None


@contextlib.contextmanager
def pgbench_sides(dsn: str, sides: Sequence[tuple[str, str, int]],
                  seconds: int) -> Iterator[list[Side]]:
    """Starts one pgbench per (name, script, clients), in that order; kills
    them if the caller fails before they finish."""
    tmp = Path(tempfile.mkdtemp(prefix="awa-e2e-"))
    started: list[Side] = []
    try:
        for name, script, clients in sides:
            # Named, so that --waits can tell the sides' backends apart.
            side_dsn = make_conninfo(dsn, application_name=f"e2e-{name}")
            path = tmp / f"{name}.sql"
            path.write_text(script)
            out, err = tmp / f"{name}.out", tmp / f"{name}.err"
            with out.open("wb") as o, err.open("wb") as e:
                proc = subprocess.Popen(
                    [pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients),
                     "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(seconds),
                     "-f", str(path), side_dsn],
                    stdout=o, stderr=e)
            started.append(Side(name, proc, script, out, err))
        yield started
    finally:
        for side in started:
            if side.proc.poll() is None:
                side.proc.kill()
            side.proc.wait()
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()


@dataclass
class Outcome:
    produced: int  # the producers' committed transactions, one job each
    backlog: int  # jobs not consumed when both sides had stopped
    seconds: float
    worker_tps: float
    samples: list[Sample] = field(default_factory=list)
    # --waits: each side's wait events, and pg_stat_wal's growth over the cell.
    waits: dict[str, collections.Counter[str]] = field(default_factory=dict)
    wal: tuple[int, int, int] = (0, 0, 0)

    @property
    def consumed(self) -> int:
        return self.produced - self.backlog

    @property
    def produced_rate(self) -> float:
        return self.produced / self.seconds

    @property
    def consumed_rate(self) -> float:
        return self.consumed / self.seconds

    @property
    def share(self) -> float:
        return self.backlog / self.produced if self.produced else 0.0


def run_both(cell: str, system: System, values: dict[str, str], args: argparse.Namespace,
             seconds: int, every: int, read: Callable[[psycopg.Connection], object],
             on_sample: Callable[[float, object], None] | None = None,
             ) -> tuple[int, int, float, list[tuple[float, object]], object]:
    """Producers and workers for `seconds`, sampled every `every` s. Returns
    (jobs produced, backlog at the end, workers' tps, samples, a last sample
    once both had stopped)."""
    producers, workers, idle_ms = args.producers, args.workers, args.idle_sleep_ms
    with psycopg.connect(cell, autocommit=True) as conn:
        zero = read(conn)
    start = time.monotonic()
    sampler = Sampler(cell, every, seconds, read, start, on_sample)
    sampler.samples.append((0.0, zero))
    # Producers first: they stop first too, and the workers take what is left.
    with pgbench_sides(cell, [("producers", system.producer, producers),
                              ("workers", system.worker_script(values, idle_ms), workers)],
                       seconds) as sides:
        sampler.start()
        try:
            for side in sides:
                side.proc.wait()
        finally:
            if any(side.proc.returncode != 0 for side in sides):
                sampler.stopping.set()
            sampler.join()
        if sampler.error:
            raise sampler.error
        (produced, _), (_, worker_tps) = (side.result() for side in sides)
    with psycopg.connect(cell, autocommit=True) as conn:
        backlog = int(conn.execute(system.counts).fetchone()[1])
        end = read(conn)
    return produced, backlog, worker_tps, sampler.samples, end


def measure_cell(dsn: str, system: System, args: argparse.Namespace) -> Outcome:
    def read(conn: psycopg.Connection) -> int:
        produced, backlog = conn.execute(system.counts).fetchone()
        return int(produced) - int(backlog)

    every = min(10, args.seconds)
    with cell_database(dsn, system) as (cell, values):
        waits = WaitSampler(cell) if args.waits else None
        with psycopg.connect(cell, autocommit=True) as conn:
            wal_before = conn.execute(WAL_SQL).fetchone()
        if waits:
            waits.start()
        try:
            produced, backlog, worker_tps, samples, _ = run_both(
                cell, system, values, args, args.seconds, every, read)
        finally:
            if waits:
                waits.stopping.set()
                waits.join()
        if waits and waits.error:
            raise waits.error
        with psycopg.connect(cell, autocommit=True) as conn:
            wal_after = conn.execute(WAL_SQL).fetchone()
    return Outcome(produced, backlog, args.seconds, worker_tps,
                   [(t, int(c)) for t, c in samples],
                   waits.counts if waits else {},
                   tuple(int(a - b) for a, b in zip(wal_after, wal_before, strict=True)))


def waits_report(chosen: Sequence[System], results: dict[str, list[Outcome]]) -> str:
    """--waits: per cell and side, the share of samples in each state, the
    six largest, summed over the runs; then the WAL per transaction."""
    rows = []
    for s in chosen:
        runs = results[s.key]
        transactions = sum(o.produced + o.worker_tps * o.seconds for o in runs)
        records, fpi, size = (sum(o.wal[i] for o in runs) for i in range(3))
        for side in WAIT_SIDES:
            counts: collections.Counter[str] = collections.Counter()
            for o in runs:
                counts.update(o.waits.get(side, {}))
            total = sum(counts.values()) or 1
            top = ", ".join(f"{label} {n / total:.0%}" for label, n in counts.most_common(6))
            wal = (f"{records / transactions:.1f} records, {fpi / transactions:.2f} FPI,"
                   f" {size / transactions:,.0f} B" if side == WAIT_SIDES[0] else "")
            rows.append([s.name, side, top, wal])
    return table(["cell", "side", "where its backends were (share of samples)",
                  "WAL per transaction (both sides)"], rows)


# --- the report --------------------------------------------------------------


def report(chosen: Sequence[System], results: dict[str, list[Outcome]],
           args: argparse.Namespace) -> str:
    med: dict[str, dict[str, float]] = {}
    for s in chosen:
        runs = results[s.key]
        med[s.key] = {
            "produced": statistics.median(o.produced_rate for o in runs),
            "consumed": statistics.median(o.consumed_rate for o in runs),
            "backlog": statistics.median(o.backlog for o in runs),
            "share": statistics.median(o.share for o in runs),
            "worker": statistics.median(o.worker_tps for o in runs),
        }
    plain = med.get("plain")
    rows = []
    for s in chosen:
        m, runs = med[s.key], results[s.key]
        series = median_series([window_rates(o.samples) for o in runs])
        spread = (f"{min(o.consumed_rate for o in runs):,.0f}-"
                  f"{max(o.consumed_rate for o in runs):,.0f}")
        rows.append([
            s.name, f"{m['produced']:,.0f}", f"{m['consumed']:,.0f}", spread,
            f"{m['backlog']:,.0f}", f"{m['share']:.1%}", f"{m['worker']:,.0f}",
            f"{m['consumed'] / plain['consumed']:.2f}x" if plain and plain["consumed"] else "-",
            " ".join(f"{r:,.0f}" for r in series),
        ])
    every = min(10, args.seconds)
    out = [table(["cell", "produced/s", "consumed/s", "consumed spread", "backlog", "of produced",
                  "worker tx/s", "consumed vs plain", f"consumed/s per {every} s"], rows)]
    targets = [s for s in chosen if s.targeted]
    if not targets:
        return "\n".join(out)
    out.append("")
    out.append(f"Target at S = {', '.join(map(str, TARGET_SHARDS))}: consumed/s >= produced/s"
               f" (within 1 job/s) and backlog < {MAX_BACKLOG_SHARE:.0%} of produced (medians)")
    for s in targets:
        m = med[s.key]
        up = keeps_up(m["produced"], m["consumed"])
        small = m["share"] < MAX_BACKLOG_SHARE
        out.append(f"  {s.name}: consumed {m['consumed']:,.0f}/s vs produced"
                   f" {m['produced']:,.0f}/s {'ok' if up else 'BEHIND'};"
                   f" backlog {m['share']:.1%} {'ok' if small else 'TOO LARGE'}:"
                   f" {'PASS' if up and small else 'FAIL'}")
    return "\n".join(out)


def targets(chosen: Sequence[System], results: dict[str, list[Outcome]]) -> list[_docs.Target]:
    out = []
    for s in chosen:
        if not s.targeted:
            continue
        runs = results[s.key]
        produced = statistics.median(o.produced_rate for o in runs)
        consumed = statistics.median(o.consumed_rate for o in runs)
        share = statistics.median(o.share for o in runs)
        out.append(_docs.Target(
            f"{s.name}: consumed/s >= produced/s (within 1 job/s), backlog"
            f" < {MAX_BACKLOG_SHARE:.0%} of produced",
            keeps_up(produced, consumed) and share < MAX_BACKLOG_SHARE,
            f"{consumed:,.0f} of {produced:,.0f}/s, backlog {share:.1%}"))
    return out


# --- --long ----------------------------------------------------------------


def long_reader(conn: psycopg.Connection) -> tuple[str, Callable[[psycopg.Connection], dict]]:
    """How the long run counts: by sequences when awa.run_lease_seq exists
    (produced less claimed, no scan), else by counting awa.ready."""
    by_sequence = conn.execute("select to_regclass('awa.run_lease_seq') is not null").fetchone()[0]
    if by_sequence:
        counts = (f"select ({AWA_PRODUCED}),"
                  " coalesce(pg_sequence_last_value('awa.run_lease_seq'), 0)::bigint")
        note = ("backlog = sum of the lanes' sequences (produced) - awa.run_lease_seq (claimed);"
                " consumed = claimed (claim and complete share a transaction)")
    else:
        counts = (f"select ({AWA_PRODUCED}), ({AWA_PRODUCED}) - (select count(*) from awa.ready)"
                  " - (select count(*) from awa.running)")
        note = ("backlog = count(*) of awa.ready and awa.running (no awa.run_lease_seq);"
                " consumed = produced - backlog")
    # A table's leaves: its partitions if partitioned, else the table itself
    # (pg_partition_tree has no rows for a table that is neither).
    dead_sql = (
        "select h.root, coalesce(sum(s.n_dead_tup), 0)::bigint, count(s.relid),"
        " coalesce(sum(s.autovacuum_count), 0)::bigint"
        " from unnest(%s::text[]) with ordinality as h (root, n)"
        " left join lateral ("
        "   select t.relid from pg_partition_tree(to_regclass(h.root)) as t where t.isleaf"
        "   union select c.oid from pg_class as c"
        "   where c.oid = to_regclass(h.root) and c.relkind <> 'p'"
        " ) as leaf on true"
        " left join pg_stat_user_tables as s on s.relid = leaf.relid"
        " group by h.root, h.n order by h.n")

    def read(c: psycopg.Connection) -> dict:
        produced, consumed = c.execute(counts).fetchone()
        dead = c.execute(dead_sql, [list(HOT_TABLES)]).fetchall()
        return {"produced": int(produced), "consumed": int(consumed),
                "dead": {root: (int(n), int(parts)) for root, n, parts, _ in dead},
                "autovacuums": sum(int(v) for *_, v in dead)}

    return note, read


def long_run(dsn: str, args: argparse.Namespace, hold_snapshot: bool) -> tuple[list[str], float]:
    """The lines printed, and the last minute's consumed/s over the first's."""
    system = next(s for s in systems() if s.key == "s8")
    label = "snapshot held" if hold_snapshot else "plain"
    seconds, every = args.long_seconds, args.every
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    with cell_database(dsn, system) as (cell, values), contextlib.ExitStack() as stack:
        with psycopg.connect(cell, autocommit=True) as conn:
            note, read = long_reader(conn)
        if hold_snapshot:
            holder = stack.enter_context(psycopg.connect(cell, autocommit=True))
            holder.execute("begin isolation level repeatable read")
            holder.execute("select 1")
        maintainer = Maintainer(cell)
        stack.callback(maintainer.start().join, 10)
        stack.callback(maintainer.stop)
        held = ", a repeatable-read snapshot open throughout" if hold_snapshot else ""
        emit(f"\n## {label}: awa S=8, {args.producers} producers + {args.workers} workers,"
             f" {seconds} s{held}")
        emit(f"({note}; dead tuples from pg_stat_user_tables.n_dead_tup)\n")
        header = ["s", "consumed/s", "backlog", *(f"dead {t.split('.')[1]}" for t in HOT_TABLES),
                  "autovacuums"]
        emit("| " + " | ".join(header) + " |")
        emit("|" + "|".join("---:" for _ in header) + "|")
        last: list[tuple[float, int]] = []

        def on_sample(at: float, v: object) -> None:
            assert isinstance(v, dict)
            rate = (v["consumed"] - last[-1][1]) / (at - last[-1][0]) if last else 0.0
            last.append((at, v["consumed"]))
            dead = [f"{n:,}" + (f" ({parts} parts)" if parts > 1 else "")
                    for n, parts in (v["dead"].get(t, (0, 0)) for t in HOT_TABLES)]
            emit(f"| {at:.0f} | {rate:,.0f} | {v['produced'] - v['consumed']:,} | "
                 + " | ".join(dead) + f" | {v['autovacuums']} |")

        with psycopg.connect(cell, autocommit=True) as conn:
            last.append((0.0, read(conn)["consumed"]))
        produced, backlog, _, samples, end = run_both(
            cell, system, values, args, seconds, every, read, on_sample)
        if hold_snapshot:
            holder.execute("rollback")
    counted = [(t, v["consumed"]) for t, v in samples]
    window = min(60.0, seconds / 2)
    first, final = first_last(counted, window)
    ratio = final / first if first else 0.0
    emit(f"\nfirst {window:g} s: {first:,.0f}/s; last {window:g} s: {final:,.0f}/s;"
         f" ratio {ratio:.3f} (target >= {MIN_LONG_RATIO}):"
         f" {'PASS' if ratio >= MIN_LONG_RATIO else 'FAIL'}")
    exact = produced - backlog
    emit(f"over the run: produced {produced / seconds:,.0f}/s, consumed {exact / seconds:,.0f}/s,"
         f" backlog at the end {backlog:,} ({backlog / produced if produced else 0:.1%})")
    assert isinstance(end, dict)
    if end["consumed"] != exact:
        emit(f"NOTE: the sampled consumed count ({end['consumed']:,}, read once both had"
             f" stopped) differs from produced less backlog ({exact:,}): the per-{every} s"
             " rates are not to be trusted")
    return lines, ratio


def long_summary(ratios: dict[bool, list[float]]) -> str:
    """Each variant's last-minute/first-minute ratio per run, and the median."""
    lines = ["\n## the last minute over the first, per run\n",
             "| variant | runs | median | target |", "|---|---|---:|---|"]
    for hold, rs in ratios.items():
        median = statistics.median(rs)
        lines.append(f"| {'snapshot held' if hold else 'plain'} |"
                     f" {', '.join(f'{r:.3f}' for r in rs)} | {median:.3f} |"
                     f" {'PASS' if median >= MIN_LONG_RATIO else 'FAIL'} (>= {MIN_LONG_RATIO}) |")
    return "\n".join(lines)


# --- main --------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60, help="per cell (default 60)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cells", default="",
                    help="comma-separated subset of s1,s8,s16,plain,procrastinate,mirror,s8x2")
    ap.add_argument("--long", action="store_true", help="the long run at S = 8 instead")
    ap.add_argument("--long-seconds", type=int, default=600)
    ap.add_argument("--every", type=int, default=30, help="--long: seconds between samples")
    ap.add_argument("--waits", action="store_true",
                    help="sample each side's wait events and the WAL per transaction")
    ap.add_argument("--idle-sleep-ms", type=int, default=0,
                    help="workers sleep this long after an empty claim (default 0: never)")
    _docs.add_argument(ap)
    args = ap.parse_args()
    if args.long:
        block = _docs.Block(__file__, "Ten minutes at S = 8, plain and with a snapshot held",
                            args.write_docs, variant="long")
    else:
        block = _docs.Block(__file__, "Producers and workers at once", args.write_docs)
    all_systems = systems()
    wanted = [w.strip() for w in args.cells.split(",") if w.strip()]
    unknown = set(wanted) - {s.key for s in all_systems}
    if unknown:
        ap.error(f"unknown cells: {', '.join(sorted(unknown))}")
    chosen = [s for s in all_systems if not wanted or s.key in wanted]

    with bench_server() as dsn:
        peer_version = make_template(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            server = conn.execute("show server_version").fetchone()[0]
        head = (f"# e2e_pgbench: {machine()}; PostgreSQL {server}; {pgbench_version()};"
                f" -M prepared, synchronous_commit=on, fsync on, autovacuum on;"
                f" {args.producers} producers + {args.workers} workers")
        try:
            if args.long:
                print(head + f"; {args.long_seconds} s, sampled every {args.every} s",
                      flush=True)
                ratios: dict[bool, list[float]] = {False: [], True: []}
                for run_no in range(1, args.runs + 1):
                    for hold in (False, True):
                        print(f"\n# run {run_no} of {args.runs}", flush=True)
                        ratios[hold].append(long_run(dsn, args, hold)[1])
                print(long_summary(ratios), flush=True)
                block.write([_docs.Target(
                    f"{'snapshot held' if hold else 'plain'}: the last minute's consumed/s"
                    f" >= {MIN_LONG_RATIO} x the first minute's (median of {len(rs)})",
                    statistics.median(rs) >= MIN_LONG_RATIO,
                    f"{statistics.median(rs):.2f} ({', '.join(f'{r:.2f}' for r in rs)})")
                    for hold, rs in ratios.items()])
                return
            results: dict[str, list[Outcome]] = {}
            for run_no in range(1, args.runs + 1):
                for s in chosen:
                    o = measure_cell(dsn, s, args)
                    results.setdefault(s.key, []).append(o)
                    print(f"  run {run_no} {s.name}: produced {o.produced_rate:,.0f}/s,"
                          f" consumed {o.consumed_rate:,.0f}/s, backlog {o.backlog:,}"
                          f" ({o.share:.1%}), worker tx/s {o.worker_tps:,.0f}",
                          file=sys.stderr, flush=True)
        finally:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f"alter database {TEMPLATE} is_template false")
                drop_database(admin, TEMPLATE)
    print(head + f"; procrastinate {peer_version}; {args.seconds} s per cell,"
          f" median of {args.runs}, cells interleaved per run, each in a fresh database\n")
    print(report(chosen, results, args))
    if args.waits:
        print("\n" + waits_report(chosen, results))
    block.write(targets(chosen, results))


if __name__ == "__main__":
    main()
