"""A seeded, randomized concurrency harness: the whole SQL API at once.

Threads, each on its own connection logged in as the role a real caller
would use (producer, worker, operator, maintenance), make a seeded random
mix of calls over four queues for a while; then the harness checks
invariants on what the database holds against what the callers were told.

Queues:

- ``fifo``: S = 1, strict FIFO. Keyed jobs only, each key owned by one
  producer thread (so its enqueue order is known) at one priority; one
  worker thread alone claims it and completes in claim order; no job tool,
  failure, reschedule or change of S touches it. Completions per key must
  come out in enqueue order.
- ``uniq``: S = 2, unique keys from a small space (some with a window).
- ``keyed``: ordering keys, S changed up and down by the operator and by the
  auto-scaler (auto mode, cooldown 0); short leases that the rescue takes.
- ``drop``: plain jobs, dropped with ``discard_finished`` now and then and
  created again by the next enqueue.

Every job's args carry a token (``{"tok": "p2.17"}``) that names it before
its job id is known (COPY returns none).

Errors: every SQLSTATE a call raises is a failure unless ``ALLOWED`` lists
it for that call; each allowed one is counted. The harness device
``lease_jump`` (an admin connection moving ``awa.run_lease_seq`` forward, as
a busy system's claims would) makes ``awa.rotate_running`` carry live runs
within a short run.

``python -m tests.support.chaos --seconds 300 --seed 7`` runs it by hand on a
server it starts (README.md).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from awa_sql.maintain import LOCK_FUNCTION, PROLOGUE, TAKE_LOCK, TASKS

FIFO, UNIQ, KEYED, DROP = "fifo", "uniq", "keyed", "drop"
QUEUES = (FIFO, UNIQ, KEYED, DROP)
SHARED = (UNIQ, KEYED, DROP)  # the queues every general worker claims from
LONG_LEASE = 600.0  # seconds: never runs out within a run
SHORT_LEASE = 1.0  # seconds: the rescue takes what is left running
COPY_COLUMNS = "queue, priority, ordering_key, kind, args, run_at, max_attempts"

# The refusals a call may meet under concurrency, each with the document
# that promises it. Anything else a call raises is a failure.
ALLOWED: dict[str, dict[str, str]] = {
    "cancel_job": {
        "55P03": "docs/sql-api.md, awa.cancel_job: a claim in flight holds the job; "
                 "lock_timeout bounds the wait",
        "40001": "docs/sql-api.md, awa.cancel_job: the job moved between tables on each "
                 "of ten looks (retry)",
    },
    "release_worker": {
        "55P03": "docs/sql-api.md, awa.release_worker: waits at most 5 s for a row a "
                 "worker's call holds",
    },
    "retry_jobs": {
        "55P03": "docs/sql-api.md, awa.retry_jobs: waits once for a held row; your "
                 "lock_timeout bounds the wait",
        "42704": "docs/sql-api.md, job tools: no such queue (dropped under the call)",
    },
    "cancel_jobs": {
        "42704": "docs/sql-api.md, job tools: no such queue (dropped under the call)",
    },
    "drop_queue": {
        "55006": "docs/sql-api.md, awa.drop_queue: not empty, nothing changed",
        "42704": "docs/sql-api.md, awa.drop_queue: unknown queue (dropped already)",
    },
    "set_retention": {
        "42704": "docs/sql-api.md, awa.set_retention: no such queue (dropped under the call)",
    },
    "set_retry_policy": {
        "42704": "docs/sql-api.md, awa.set_retry_policy: no such queue (dropped under the call)",
    },
}


class Failure(AssertionError):
    pass


@dataclass
class Claim:
    job_id: int
    lease: int
    queue: str
    tok: str | None
    attempt: int
    max_attempts: int
    worker: str
    lease_s: float
    start: float
    end: float


@dataclass
class End:
    """A call on a run: complete, fail or heartbeat, and what it returned."""
    op: str
    job_id: int
    lease: int
    result: bool
    start: float
    end: float


@dataclass
class Ledger:
    """What the callers were told, under one lock."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: dict[int, dict] = field(default_factory=dict)  # job_id -> queue, tok, key, ukey, end
    tool_targets: list[int] = field(default_factory=list)  # ids the job tools may touch
    staged: dict[str, dict] = field(default_factory=dict)  # COPY token -> queue, end
    tok_ids: dict[str, set[int]] = field(default_factory=lambda: collections.defaultdict(set))
    claims: list[Claim] = field(default_factory=list)
    ends: list[End] = field(default_factory=list)
    cancels: list[tuple[int, float, float]] = field(default_factory=list)  # job, start, end
    retried_ids: list[tuple[int, str]] = field(default_factory=list)  # retry_job true
    bulk_retried: collections.Counter = field(default_factory=collections.Counter)  # queue -> n
    drops: list[tuple[str, float, float]] = field(default_factory=list)
    # awa.cancel_jobs of the dropped queue: start, end (it names no job).
    bulk_cancels: list[tuple[float, float]] = field(default_factory=list)
    rescued: int = 0
    fifo_enqueued: dict[bytes, list[str]] = field(
        default_factory=lambda: collections.defaultdict(list))
    fifo_done: dict[bytes, list[str]] = field(
        default_factory=lambda: collections.defaultdict(list))
    counts: collections.Counter = field(default_factory=collections.Counter)
    rolled_back_finishes: int = 0  # maintenance passes or ends that failed after a nextval
    failures: list[str] = field(default_factory=list)


class Actor(threading.Thread):
    """One caller: a connection as ``login`` and a seeded random mix of calls."""

    role = ""

    def __init__(self, chaos: Chaos, index: int, login: str):
        super().__init__(daemon=True, name=f"{self.role}{index}")
        self.chaos, self.index = chaos, index
        self.rng = random.Random(f"{chaos.seed}/{self.name}")
        self.conn = psycopg.connect(chaos.dsn(login), autocommit=True)
        self.history: collections.deque[str] = collections.deque(maxlen=400)
        self.serial = 0

    @property
    def ledger(self) -> Ledger:
        return self.chaos.ledger

    def tok(self) -> str:
        self.serial += 1
        return f"{self.name}.{self.serial}"

    def run(self) -> None:
        try:
            while time.monotonic() < self.chaos.deadline and not self.chaos.stop.is_set():
                self.step()
        except Exception:  # a bug of the harness, or a broken connection
            self.fail(f"crashed:\n{traceback.format_exc()}")
        finally:
            self.conn.close()

    def step(self) -> None:
        raise NotImplementedError

    def fail(self, what: str) -> None:
        history = "\n    ".join(self.history)
        with self.ledger.lock:
            self.ledger.failures.append(
                f"{self.name} (seed {self.chaos.seed}): {what}\n  its last calls:\n    {history}")
        self.chaos.stop.set()

    def call(self, op: str, fn, detail: str = ""):
        """``fn(conn)``; (result, None) or (None, sqlstate) for an allowed refusal;
        any other error is a failure, and (None, sqlstate) too."""
        started = time.monotonic()
        try:
            result = fn(self.conn)
        except psycopg.Error as err:
            state = err.sqlstate or "?????"
            self.history.append(f"{started - self.chaos.t0:8.3f} {op}({detail}) -> "
                                f"{state} {str(err).splitlines()[0] if str(err) else ''}")
            if self.conn.closed or self.conn.broken:
                self.fail(f"{op}({detail}): the connection broke: {err}")
                raise
            with self.ledger.lock:
                self.ledger.counts[(op, state)] += 1
            if state not in ALLOWED.get(op, {}):
                self.fail(f"{op}({detail}) raised {state}: {err}\n  detail: "
                          f"{err.diag.message_detail}\n  context: {err.diag.context}")
            return None, state
        self.history.append(f"{started - self.chaos.t0:8.3f} {op}({detail}) -> {result!r:.200}")
        with self.ledger.lock:
            self.ledger.counts[(op, "ok")] += 1
        return result, None


class Producer(Actor):
    role = "producer"

    def fifo_key(self) -> tuple[bytes, int]:
        k = self.rng.randrange(3)
        return f"{self.name}-k{k}".encode(), 1 + k % 2

    def job(self, queue: str) -> dict:
        """One job's columns, drawn for its queue."""
        tok = self.tok()
        job = {"queue": queue, "kind": "chaos", "tok": tok, "priority": 2, "key": None,
               "run_at": None, "max_attempts": self.rng.choice([1, 2, 3, 25]),
               "ukey": None, "uwindow": None}
        if queue == FIFO:
            job["key"], job["priority"] = self.fifo_key()
            job["max_attempts"] = 25
            return job
        job["priority"] = self.rng.randint(1, 4)
        if queue == KEYED:
            job["key"] = f"c{self.rng.randrange(20)}".encode()
        if queue == UNIQ and self.rng.random() < 0.8:
            job["ukey"] = f"u{self.rng.randrange(12)}".encode()
            if self.rng.random() < 0.2:
                job["uwindow"] = "2 seconds"
        if self.rng.random() < 0.15:
            job["run_at"] = f"{self.rng.uniform(0.2, 2.0):.2f} seconds"
        return job

    def pick_queue(self) -> str:
        return self.rng.choice(QUEUES)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.45:
            self.enqueue_one(self.job(self.pick_queue()))
        elif r < 0.75:
            self.enqueue_batch([self.job(self.pick_queue())
                                for _ in range(self.rng.randint(1, 12))])
        else:
            queue = self.pick_queue()
            if queue == UNIQ:  # COPY rows carry no unique key here: every row is a job
                queue = KEYED
            self.copy([self.job(queue) for _ in range(self.rng.randint(1, 20))],
                      call_enqueue_copied=self.rng.random() < 0.7)

    def record(self, jobs: list[dict], rows: list[tuple], start: float, end: float) -> None:
        with self.ledger.lock:
            for job, (job_id, duplicate) in zip(jobs, rows, strict=True):
                if duplicate:
                    self.check_duplicate(job, job_id)
                    continue
                if job_id in self.ledger.jobs:
                    self.ledger.failures.append(
                        f"{self.name} (seed {self.chaos.seed}): job id {job_id} handed out "
                        f"twice ({job['tok']} and {self.ledger.jobs[job_id]['tok']})")
                self.ledger.jobs[job_id] = {"queue": job["queue"], "tok": job["tok"],
                                            "key": job["key"], "ukey": job["ukey"],
                                            "start": start, "end": end}
                self.ledger.tok_ids[job["tok"]].add(job_id)
                if job["queue"] != FIFO:
                    self.ledger.tool_targets.append(job_id)
                if job["queue"] == FIFO:
                    self.ledger.fifo_enqueued[job["key"]].append(job["tok"])

    def check_duplicate(self, job: dict, holder: int) -> None:
        known = self.ledger.jobs.get(holder)
        if job["ukey"] is None or (known is not None and known["ukey"] != job["ukey"]):
            self.ledger.failures.append(
                f"{self.name} (seed {self.chaos.seed}): {job['tok']} (key {job['ukey']!r}) "
                f"got duplicate of job {holder}, which holds {known and known['ukey']!r}")

    def enqueue_one(self, job: dict) -> None:
        start = time.monotonic()

        def go(conn):
            return conn.execute(
                "select job_id, duplicate from awa.enqueue(%s::text, 'chaos'::text, %s::jsonb,"
                " %s::smallint, %s::bytea, now() + %s::interval, %s::integer, %s::bytea,"
                " %s::interval)",
                [job["queue"], json.dumps({"tok": job["tok"]}), job["priority"], job["key"],
                 job["run_at"], job["max_attempts"], job["ukey"], job["uwindow"]]).fetchall()
        rows, err = self.call("enqueue", go, f"{job['queue']} {job['tok']}")
        if err is None:
            self.record([job], rows, start, time.monotonic())

    def enqueue_batch(self, jobs: list[dict]) -> None:
        start = time.monotonic()

        def col(name):
            return [j[name] for j in jobs]

        def go(conn):
            return conn.execute(
                "select job_id, duplicate from awa.enqueue_batch(%s::text[], %s::text[],"
                " %s::jsonb[], %s::smallint[], %s::bytea[],"
                " (select array_agg(now() + d order by n) from unnest(%s::interval[])"
                "   with ordinality as u(d, n)), %s::integer[], null, %s::bytea[], %s::interval[])",
                [col("queue"), col("kind"), [json.dumps({"tok": j["tok"]}) for j in jobs],
                 col("priority"), col("key"), col("run_at"), col("max_attempts"), col("ukey"),
                 col("uwindow")]).fetchall()
        rows, err = self.call("enqueue_batch", go, f"{len(jobs)} rows")
        if err is None:
            self.record(jobs, rows, start, time.monotonic())

    def copy(self, jobs: list[dict], call_enqueue_copied: bool) -> None:
        start = time.monotonic()

        def go(conn):
            with conn.transaction():
                with conn.cursor().copy(
                        f"copy awa.copy_staging ({COPY_COLUMNS}) from stdin") as cp:
                    for j in jobs:
                        run_at = None
                        if j["run_at"] is not None:
                            run_at = datetime.now(UTC) + timedelta(
                                seconds=float(j["run_at"].split()[0]))
                        cp.write_row([j["queue"], j["priority"], j["key"], j["kind"],
                                      json.dumps({"tok": j["tok"]}), run_at, j["max_attempts"]])
                if call_enqueue_copied:
                    return conn.execute("select awa.enqueue_copied()").fetchone()[0]
                return None
        n, err = self.call("copy", go, f"{len(jobs)} rows, enqueue_copied {call_enqueue_copied}")
        if err is not None:
            return
        if n is not None and n != len(jobs):
            self.fail(f"awa.enqueue_copied() returned {n} for {len(jobs)} rows")
        end = time.monotonic()
        with self.ledger.lock:
            for j in jobs:
                self.ledger.staged[j["tok"]] = {"queue": j["queue"], "start": start, "end": end}
                if j["queue"] == FIFO:
                    self.ledger.fifo_enqueued[j["key"]].append(j["tok"])


class Worker(Actor):
    role = "worker"

    def __init__(self, chaos, index, login, fifo: bool = False):
        self.fifo = fifo
        super().__init__(chaos, index, login)
        if fifo:
            self.name = f"fifo_worker{index}"
            self.rng = random.Random(f"{chaos.seed}/{self.name}")
        self.stale: list[Claim] = []

    def step(self) -> None:
        if self.stale and self.rng.random() < 0.1:
            c = self.stale.pop(self.rng.randrange(len(self.stale)))
            self.end(c, self.rng.choice(["complete", "fail", "heartbeat"]), stale=True)
            return
        short = not self.fifo and self.rng.random() < 0.2
        if self.fifo:
            queues = [FIFO]
        elif short:
            queues = [UNIQ, KEYED]  # never the drop queue: its counters go with it
        else:
            queues = self.rng.sample(SHARED, self.rng.randint(1, 3))
        n = self.rng.choice([1, 1, 3, 8])
        worker = f"{self.name}-{'s' if short else 'l'}"
        lease = SHORT_LEASE if short else LONG_LEASE
        started = time.monotonic()
        rows, err = self.call(
            "claim", lambda conn: conn.execute(
                "select job_id, run_lease, queue, args, attempt, max_attempts, ordering_key"
                " from awa.claim(%s::text[], %s, %s, %s * interval '1 second')",
                [queues, n, worker, lease]).fetchall(), f"{queues} {n} {worker}")
        if err is not None or not rows:
            return
        end = time.monotonic()
        claims = [Claim(job_id, run_lease, queue, (args or {}).get("tok"), attempt, max_att,
                        worker, lease, started, end)
                  for job_id, run_lease, queue, args, attempt, max_att, _ in rows]
        with self.ledger.lock:
            self.ledger.claims += claims
            for c in claims:
                if c.tok is not None:
                    self.ledger.tok_ids[c.tok].add(c.job_id)
        for c, row in zip(claims, rows, strict=True):
            if self.fifo:
                if self.end(c, "complete"):
                    with self.ledger.lock:
                        self.ledger.fifo_done[bytes(row[6])].append(c.tok)
                continue
            if short and self.rng.random() < 0.5:
                self.stale.append(c)  # abandoned: the rescue takes it
                continue
            r = self.rng.random()
            if r < 0.1:
                self.end(c, "heartbeat")
            op = "complete" if r < 0.65 or c.queue.startswith(DROP) else "fail"
            self.end(c, op)

    def end(self, c: Claim, op: str, stale: bool = False) -> bool:
        started = time.monotonic()
        detail = f"{c.job_id}, {c.lease}{' (stale)' if stale else ''}"
        if op == "complete":
            sql, args = "select awa.complete(%s, %s)", [c.job_id, c.lease]
        elif op == "heartbeat":
            sql, args = "select awa.heartbeat(%s, %s, '10 minutes')", [c.job_id, c.lease]
        else:
            retry = self.rng.choice([None, "0.3 seconds"])
            sql = "select awa.fail(%s, %s, 'chaos', now() + %s::interval)"
            args = [c.job_id, c.lease, retry]
        result, err = self.call(op, lambda conn: conn.execute(sql, args).fetchone()[0], detail)
        if err is not None:
            return False
        with self.ledger.lock:
            self.ledger.ends.append(End(op, c.job_id, c.lease, bool(result), started,
                                        time.monotonic()))
        return bool(result)


class Operator(Actor):
    role = "operator"

    def known_job(self) -> int | None:
        with self.ledger.lock:
            ids = self.ledger.tool_targets
            return ids[self.rng.randrange(len(ids))] if ids else None

    def step(self) -> None:
        r = self.rng.random()
        q = self.rng.choice(SHARED)
        if r < 0.12:
            s = self.rng.choice([1, 2, 4, 8])
            queue = self.rng.choice([KEYED, UNIQ])
            self.call("set_enqueue_shards", lambda conn: conn.execute(
                "select new_shards from awa.set_enqueue_shards(%s, %s)", [queue, s]).fetchone(),
                f"{queue}, {s}")
        elif r < 0.2:
            self.call("set_retention", lambda conn: conn.execute(
                "select awa.set_retention(%s, %s::interval, %s::interval)",
                [q, self.rng.choice([None, "1 hour"]), self.rng.choice([None, "2 days"])]),
                q)
        elif r < 0.28:
            self.call("set_retry_policy", lambda conn: conn.execute(
                "select awa.set_retry_policy(%s::text, '0.2 seconds'::interval,"
                " '1 second'::interval, %s::numeric)",
                [q, self.rng.choice([0, 0.5, 1])]), q)
        elif r < 0.45:
            self.cancel_one()
        elif r < 0.6:
            self.retry_one()
        elif r < 0.7:
            n = self.rng.choice([1, 5, 50])
            state = self.rng.choice(["failed", "cancelled"])
            got, err = self.call("retry_jobs", lambda conn: self.with_lock_timeout(
                conn, "select awa.retry_jobs(%s, max_jobs => %s, state => %s)", [q, n, state]),
                f"{q}, {n}, {state}")
            if err is None:
                with self.ledger.lock:
                    self.ledger.bulk_retried[q] += got
        elif r < 0.78:
            self.call("cancel_jobs", lambda conn: conn.execute(
                "select awa.cancel_jobs(%s, max_jobs => %s)", [q, self.rng.choice([1, 5])]
            ).fetchone()[0], q)
        elif r < 0.82:
            w = f"worker{self.rng.randrange(self.chaos.workers)}-s"
            self.call("release_worker", lambda conn: conn.execute(
                "select awa.release_worker(%s)", [w]).fetchone()[0], w)
        elif r < 0.9:
            self.drop()
        else:
            self.call("queue_overview", lambda conn: conn.execute(
                "select count(*) from awa.queue_overview").fetchone()[0])

    @staticmethod
    def with_lock_timeout(conn, sql: str, args):
        with conn.transaction():
            conn.execute("set local lock_timeout = '2s'")
            return conn.execute(sql, args).fetchone()[0]

    def cancel_one(self) -> None:
        job = self.known_job()
        if job is None:
            return
        started = time.monotonic()
        got, err = self.call("cancel_job", lambda conn: self.with_lock_timeout(
            conn, "select awa.cancel_job(%s)", [job]), str(job))
        if err is None and got:
            with self.ledger.lock:
                self.ledger.cancels.append((job, started, time.monotonic()))

    def retry_one(self) -> None:
        job = self.known_job()
        if job is None:
            return
        got, err = self.call("retry_job", lambda conn: conn.execute(
            "select awa.retry_job(%s)", [job]).fetchone()[0], str(job))
        if err is None and got:
            with self.ledger.lock:
                self.ledger.retried_ids.append((job, self.ledger.jobs[job]["queue"]))

    def drop(self) -> None:
        started = time.monotonic()
        _, err = self.call("cancel_jobs", lambda conn: conn.execute(
            "select awa.cancel_jobs(%s, max_jobs => 1000)", [DROP]).fetchone()[0], DROP)
        if err is None:
            with self.ledger.lock:
                self.ledger.bulk_cancels.append((started, time.monotonic()))
        got, err = self.call("drop_queue", lambda conn: conn.execute(
            "select awa.drop_queue(%s, discard_finished => true)", [DROP]).fetchone()[0], DROP)
        if err is None and got:
            with self.ledger.lock:
                self.ledger.drops.append((DROP, started, time.monotonic()))


class Maintenance(Actor):
    role = "maintenance"

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.05 and self.chaos.jump_leases:
            self.chaos.lease_jump()
            self.history.append(f"{time.monotonic() - self.chaos.t0:8.3f} lease_jump()")
            return
        if r < 0.12:
            self.call("sample_lane_contention", lambda conn: conn.execute(
                "select awa.sample_lane_contention()").fetchone()[0])
            return
        weights = [8 if t.name in ("promote", "rescue") else 2 for t in TASKS]
        task = self.rng.choices(TASKS, weights)[0]
        got, err = self.call(f"pass:{task.name}", lambda conn: self.maintain(conn, task))
        with self.ledger.lock:
            if err is not None:
                self.ledger.rolled_back_finishes += 1
            elif got:  # the pass did something: how often each does
                self.ledger.counts[(f"pass:{task.name}", "did")] += 1
                if task.name == "rescue":
                    self.ledger.rescued += got

    @staticmethod
    def maintain(conn, task) -> int | None:
        """One pass as awa maintain makes it (awa_sql.maintain.Maintainer._pass)."""
        with conn.transaction():
            _, _, installed, lockable = conn.execute(
                PROLOGUE, ["10s", "60s", task.function, LOCK_FUNCTION]).fetchone()
            assert installed and lockable
            if not conn.execute(TAKE_LOCK, [task.name]).fetchone()[0]:
                return None
            return task.call(conn)[0]


class Chaos:
    """One run: ``run()`` returns the report; failures raise ``Failure``."""

    def __init__(self, db, logins, seed: int, seconds: float, producers: int = 3,
                 workers: int = 3, operators: int = 1, maintainers: int = 2,
                 jump_leases: bool = True):
        self.db, self.logins, self.seed, self.seconds = db, logins, seed, seconds
        self.producers, self.workers = producers, workers
        self.operators, self.maintainers = operators, maintainers
        self.jump_leases = jump_leases
        self.ledger = Ledger()
        self.stop = threading.Event()
        self.t0 = self.deadline = 0.0
        self._admin_lock = threading.Lock()
        self._admin: psycopg.Connection | None = None

    def dsn(self, login: str) -> str:
        return self.db.dsn(login)

    def lease_jump(self) -> None:
        """Moves the run lease sequence to just past half of the next block."""
        with self._admin_lock:
            self._admin.execute(
                "select setval('awa.run_lease_seq', (last_value / 65536 + 1) * 65536 + 32768)"
                " from awa.run_lease_seq")

    def setup(self) -> None:
        op = psycopg.connect(self.dsn(self.logins.operator), autocommit=True)
        with op:
            for queue, s in ((FIFO, 1), (UNIQ, 2), (KEYED, 4), (DROP, 1)):
                op.execute("select awa.set_enqueue_shards(%s, %s)", [queue, s])
            op.execute("select awa.set_shard_mode(%s, 'auto', 8)", [KEYED])
            op.execute("select awa.set_autoscale_policy(%s, cooldown => '0 seconds',"
                       " min_samples => 1, grow_window => '5 seconds',"
                       " shrink_window => '5 seconds')", [KEYED])
            for queue in SHARED:
                op.execute("select awa.set_retry_policy(%s, '0.2 seconds', '1 second', 0.5)",
                           [queue])

    def run(self) -> dict:
        self._admin = self.db.connect()
        try:
            self.setup()
            actors: list[Actor] = []
            actors += [Producer(self, i, self.logins.producer) for i in range(self.producers)]
            actors += [Worker(self, i, self.logins.worker) for i in range(self.workers)]
            actors.append(Worker(self, 0, self.logins.worker, fifo=True))
            actors += [Operator(self, i, self.logins.operator) for i in range(self.operators)]
            actors += [Maintenance(self, i, self.logins.maintenance)
                       for i in range(self.maintainers)]
            self.t0 = time.monotonic()
            self.deadline = self.t0 + self.seconds
            for a in actors:
                a.start()
            for a in actors:
                a.join(timeout=self.seconds + 120)
                if a.is_alive():
                    self.ledger.failures.append(f"{a.name} (seed {self.seed}) never ended; its "
                                                "last calls:\n    " + "\n    ".join(a.history))
                    self.stop.set()
            if self.ledger.failures:
                raise Failure("\n\n".join(self.ledger.failures))
            try:
                return check(self._admin, self.ledger, self.seed)
            except Failure as err:
                raise Failure(f"{err}\n{calls_naming(str(err), actors)}") from None
        finally:
            self._admin.close()


def calls_naming(report: str, actors: list[Actor], most: int = 60) -> str:
    """The calls of every caller that name a job the report names."""
    jobs = set(re.findall(r"\bjob (\d+)", report))
    lines = [f"{a.name}: {line}" for a in actors for line in a.history
             if jobs & set(re.findall(r"\d+", line))]
    if not lines:
        return ""
    lines.sort(key=lambda line: float(line.split(": ", 1)[1].split()[0]))
    return "calls naming those jobs (each caller keeps its last 400):\n    " + \
        "\n    ".join(lines[:most])


def _rows(admin) -> dict[int, list[tuple]]:
    """Every job row: job_id -> [(table, queue name, state, tok, ukey holder?)]."""
    out: dict[int, list[tuple]] = collections.defaultdict(list)
    for job_id, where, queue, state, tok in admin.execute("""
            select r.job_id, 'ready', m.queue, 'ready', r.args->>'tok'
              from awa.ready r join awa.queue_meta m using (queue_id)
            union all
            select r.job_id, 'running.' || r.slot, m.queue, 'running', r.args->>'tok'
              from awa.running r join awa.queue_meta m using (queue_id)
            union all
            select s.job_id, 'scheduled', m.queue, 'scheduled', s.args->>'tok'
              from awa.scheduled s join awa.queue_meta m using (queue_id)
            union all
            select f.job_id, 'finished.' || f.slot, m.queue, f.state, f.args->>'tok'
              from awa.finished f left join awa.queue_meta m using (queue_id)"""):
        out[job_id].append((where, queue, state, tok))
    return out


def check(admin, ledger: Ledger, seed: int) -> dict:
    """The invariants; raises Failure naming every one broken."""
    bad: list[str] = []
    rows = _rows(admin)
    by_tok: dict[str, set[int]] = collections.defaultdict(set)
    for job_id, rs in rows.items():
        for _, _, _, tok in rs:
            if tok is not None:
                by_tok[tok].add(job_id)
    for tok, ids in ledger.tok_ids.items():
        by_tok[tok] |= ids

    # 1. One row per job id, in one state.
    for job_id, rs in rows.items():
        if len(rs) > 1:
            bad.append(f"job {job_id} is in {len(rs)} places: {rs}")
    claims_of: dict[int, list[Claim]] = collections.defaultdict(list)
    for c in sorted(ledger.claims, key=lambda c: c.end):
        claims_of[c.job_id].append(c)
    ends_of: dict[tuple[int, int], list[End]] = collections.defaultdict(list)
    for e in ledger.ends:
        ends_of[(e.job_id, e.lease)].append(e)
    cancels_of: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for job_id, start, end in ledger.cancels:
        cancels_of[job_id].append((start, end))
    # 2. Every job a producer was told of is there, or went with its dropped queue.
    dropped_with_queue = 0

    def dropped_with(queue: str, info: dict, job_id: int | None) -> bool:
        """Whether a drop may have discarded the job: one ended after its
        enqueue began, and the job was not running then: its last claim was
        completed, or the job cancelled after it, alone or by the queue's
        awa.cancel_jobs (a claim abandoned or failed leaves the job to the
        rescue or a retry, scheduled, which that bulk cancel takes), or the
        claim was its last attempt (the rescue fails it for good)."""
        if queue != DROP or not any(end > info["start"] for _, _, end in ledger.drops):
            return False
        last = claims_of.get(job_id, [])[-1:] if job_id is not None else []
        return not last or any(
            e.result and e.op == "complete" for e in ends_of[(job_id, last[0].lease)]
        ) or any(s > last[0].start for s, _ in cancels_of[job_id]) or any(
            s > last[0].start for s, _ in ledger.bulk_cancels
        ) or last[0].attempt >= last[0].max_attempts

    for job_id, info in ledger.jobs.items():
        if job_id not in rows:
            if dropped_with(info["queue"], info, job_id):
                dropped_with_queue += 1
            else:
                bad.append(f"job {job_id} ({info['tok']}, queue {info['queue']}) is gone")
    for tok, info in ledger.staged.items():
        ids = by_tok.get(tok, set())
        if len(ids) > 1:
            bad.append(f"COPY row {tok} became jobs {sorted(ids)}")
        elif not ids or not any(i in rows for i in ids):
            if dropped_with(info["queue"], info, min(ids) if ids else None):
                dropped_with_queue += 1
            else:
                bad.append(f"COPY row {tok} (queue {info['queue']}) became no job")
    for tok, ids in by_tok.items():
        if len(ids) > 1:
            bad.append(f"token {tok} names jobs {sorted(ids)}")

    # 3. A run's lease is dead once the job was claimed again: no later call with
    # it succeeds, and no claim takes a job whose long lease is live.
    for job_id, cs in claims_of.items():
        for c1, c2 in itertools.pairwise(cs):
            for e in ends_of[(job_id, c1.lease)]:
                if e.result and e.start > c2.end:
                    bad.append(f"job {job_id}: {e.op} with lease {c1.lease} returned true after "
                               f"the job was claimed again (lease {c2.lease})")
            if c1.lease_s != LONG_LEASE:
                continue
            ended = any(e.result and e.op != "heartbeat" and e.start < c2.end
                        for e in ends_of[(job_id, c1.lease)])
            ended = ended or any(s < c2.end for s, _ in cancels_of[job_id])
            if not ended:
                bad.append(f"job {job_id} claimed again (lease {c2.lease}, {c2.worker}) while "
                           f"lease {c1.lease} ({c1.worker}) was live")

    # 4. What a true complete says holds: the job is completed (or dropped).
    for e in ledger.ends:
        if e.op == "complete" and e.result:
            rs = rows.get(e.job_id)
            if rs and rs[0][2] != "completed":
                bad.append(f"job {e.job_id} completed (lease {e.lease}) but is {rs}")

    # 5. Strict FIFO: per key, completions are a prefix of the enqueue order.
    for key, done in ledger.fifo_done.items():
        order = ledger.fifo_enqueued[key]
        if done != order[:len(done)]:
            first = next(i for i, (a, b) in enumerate(zip(done, order, strict=False)) if a != b)
            bad.append(f"fifo key {key!r}: completion {first} was {done[first]}, enqueued "
                       f"{order[first]} first ({len(done)} done of {len(order)})")

    # 6. Unique keys: a live job of a key holds it; a held key names a live job of it.
    live = {j for j, rs in rows.items() if rs[0][2] in ("ready", "running", "scheduled")}
    holders = dict(((bytes(k), j) for k, j, _ in admin.execute(
        "select unique_key, job_id, held_until from awa.unique_keys where queue = %s",
        [UNIQ])))
    held_live = {bytes(k): j for k, j in admin.execute(
        "select unique_key, job_id from awa.unique_keys where queue = %s and held_until is null",
        [UNIQ])}
    for job_id, info in ledger.jobs.items():
        if info["ukey"] is not None and job_id in live and holders.get(info["ukey"]) != job_id:
            bad.append(f"live job {job_id} has key {info['ukey']!r}, held by "
                       f"{holders.get(info['ukey'])}")
    for key, job_id in held_live.items():
        if job_id not in live:
            bad.append(f"key {key!r} held (no window) by job {job_id}, which is "
                       f"{rows.get(job_id, 'gone')}")
        elif ledger.jobs.get(job_id, {}).get("ukey") not in (None, key):
            bad.append(f"key {key!r} held by job {job_id} of key {ledger.jobs[job_id]['ukey']!r}")

    # 7. Counters agree with the rows (they are sequences: exact when nothing
    # that moved one rolled back).
    counters = {q: (c, f, x, r) for q, c, f, x, r in admin.execute(
        "select queue, completed, failed, cancelled, retried from awa.queue_overview")}
    states = collections.Counter()
    for rs in rows.values():
        states[(rs[0][1], rs[0][2])] += 1
    retried_back = collections.Counter(q for _, q in ledger.retried_ids)
    fails = sum(1 for e in ledger.ends if e.op == "fail" and e.result)
    counted_failures = 0
    exact = ledger.rolled_back_finishes == 0
    for q, (completed, failed, cancelled, retried) in counters.items():
        if q not in QUEUES or (q == DROP and ledger.drops):
            continue  # a queue put back keeps its counters, not its discarded rows
        if states[(q, "completed")] != completed:
            bad.append(f"queue {q}: completed counter {completed}, "
                       f"{states[(q, 'completed')]} completed rows")
        out = retried_back[q] + ledger.bulk_retried[q]
        if exact and failed + cancelled != states[(q, "failed")] + states[(q, "cancelled")] + out:
            bad.append(f"queue {q}: failed + cancelled counters {failed} + {cancelled}, rows "
                       f"{states[(q, 'failed')]} + {states[(q, 'cancelled')]}, {out} retried "
                       f"back out")
        if q != DROP:
            counted_failures += failed + retried
    if exact and counted_failures != fails + ledger.rescued:
        bad.append(f"failed + retried counters sum to {counted_failures}; {fails} fails "
                   f"returned true and the rescue took {ledger.rescued}")

    # 8. The security invariants and the layer.
    for rule, message, _ in admin.execute("select * from awa._security_violations()"):
        bad.append(f"security: {rule}: {message}")

    if bad:
        raise Failure(f"seed {seed}: {len(bad)} invariant(s) broken:\n  " + "\n  ".join(bad[:50]))
    return {"jobs": len(ledger.jobs) + len(ledger.staged), "claims": len(ledger.claims),
            "dropped_with_queue": dropped_with_queue, "drops": len(ledger.drops),
            "rescued": ledger.rescued,
            "fifo_completed_in_order": sum(len(d) for d in ledger.fifo_done.values()),
            "states": dict(collections.Counter(rs[0][2] for rs in rows.values())),
            "calls": {f"{op} {state}": n for (op, state), n in sorted(ledger.counts.items())}}


def main(argv: list[str] | None = None) -> int:
    from awa_sql import migrate
    from awa_sql.roles import Roles
    from tests.support.cluster import start_cluster
    from tests.support.database import Database
    from tests.support.jobs import Logins

    parser = argparse.ArgumentParser(prog="python -m tests.support.chaos",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, action="append",
                        help="a seed (repeat for several runs); default 1")
    parser.add_argument("--pg", type=int, choices=(17, 18), default=18)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--operators", type=int, default=1)
    parser.add_argument("--maintainers", type=int, default=2)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="awa-sql-chaos-"))
    cluster = start_cluster(args.pg, workdir)
    failed = 0
    try:
        template = cluster.create_database()
        with psycopg.connect(cluster.dsn(template), autocommit=True) as conn:
            migrate.migrate(conn, Roles(), create_roles=True, log=lambda _line: None)
        for seed in args.seed or [1]:
            db = Database(cluster, cluster.create_database(template=template))
            caps = list(Logins.__dataclass_fields__)
            logins = Logins(**dict(zip(caps, db.login_roles(*(f"awa_{c}" for c in caps)),
                                       strict=True)))
            try:
                report = Chaos(db, logins, seed, args.seconds, producers=args.producers,
                               workers=args.workers, operators=args.operators,
                               maintainers=args.maintainers).run()
                print(f"seed {seed}: ok {json.dumps(report, indent=1)}")
            except Failure as err:
                failed += 1
                print(f"seed {seed}: FAILED\n{err}", file=sys.stderr)
            finally:
                cluster.drop_database(db.name)
    finally:
        if cluster.stop:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
