"""``awa maintain``: the maintenance calls of the contract in one loop.

One connection, one thread. Each task (promote, rescue, move_staged,
autoscale, prune, ...) runs at its own cadence; every pass is one short
transaction that sets a local ``statement_timeout``, checks that the task's
function is installed (``to_regprocedure``), takes the task's pass lock with
``awa.try_pass_lock(task)`` (a row only the owner can lock, held until the
transaction ends: no runtime role can hold it to switch a pass off) and,
only if it got it, makes the call. So any number of processes may run the
loop at once, on every host, and no two run the same pass at once: a pass
that finds the lock taken is skipped. Each process keeps its own cadence,
so N of them make about N passes per cadence (the calls are safe to repeat).
Nothing outlives a transaction and nothing is prepared, so it runs through
PgBouncer in transaction mode.

A lost connection is reopened with exponential back-off (0.5 s up to 30 s).
``stop()`` sets an event the loop waits on and cancels a statement in flight,
so the loop ends well within a second. ``awa maintain`` (awa_sql.cli.maintain)
and ``Worker(maintain=True)`` both run this class.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg.rows import dict_row

from awa_sql import shards
from awa_sql.connect import (
    connect,
    network_defaults,
    one_line,
    parse_dsn,
    read_only_error,
    read_only_reason,
    resolve_dsn,
)

if TYPE_CHECKING:  # the metrics stack loads with a Maintainer, not with the CLI's parser
    from prometheus_client import CollectorRegistry

log = logging.getLogger("awa_sql.maintain")

BACKOFF_MIN = 0.5  # seconds before the first reconnect; doubles up to BACKOFF_MAX
BACKOFF_MAX = 30.0
STATEMENT_TIMEOUT = 10.0
BATCH = 1000  # jobs per promote or rescue call; a full pass runs again at once


@dataclass(frozen=True)
class Task:
    name: str  # metric label, log prefix; the flag is --<name with dashes>-every
    function: str  # its regprocedure: a pass skips while it is not installed
    every: float  # default cadence, seconds
    call: Callable[[psycopg.Connection], tuple[int, str]]  # -> (how many, what it did)
    batch: int | None = None  # a pass that handled this many runs again at once
    # A pass that handled any runs again at once: its call may stop short of
    # the batch at a bound of its own (promote and rescue: awa._pass_bytes;
    # carry: awa._carry_time; move_staged: one staging transaction;
    # retire_lanes and drops: 1,024 lane locks a call).
    again_while_any: bool = False

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}-every"


def _scalar(statement: str, params: tuple, did: str) -> Callable[[psycopg.Connection],
                                                                  tuple[int, str]]:
    """A call that returns how many it handled; ``did`` says what, with {n}."""
    def call(conn: psycopg.Connection) -> tuple[int, str]:
        count = conn.execute(statement, params).fetchone()[0] or 0
        return count, did.format(n=count)
    return call


def _autoscale(conn: psycopg.Connection) -> tuple[int, str]:
    """Counts the decisions that change S or would (holds are routine)."""
    acted = [d for d in shards.autoscale_tick(conn) if d.action != "held"]
    return len(acted), "; ".join(d.summary() for d in acted)


def _finish_drops(conn: psycopg.Connection) -> tuple[int, str]:
    """Counts the dropped queues removed or put back; names each put back."""
    rows = conn.execute("select queue, outcome, named from awa.finish_drops()").fetchall()
    removed = sum(1 for _, outcome, _ in rows if outcome == "removed")
    said = [f"removed {removed} dropped queue(s)"] if removed else []
    said += [f"put dropped queue {queue!r} back as {named!r}: a job came to it late"
             for queue, outcome, named in rows if outcome != "removed"]
    return len(rows), "; ".join(said)


TASKS: tuple[Task, ...] = (
    Task("promote", "awa.promote_due(integer)", 1.0,
         _scalar("select awa.promote_due(%s)", (BATCH,), "moved {n} due job(s) into their lanes"),
         batch=BATCH, again_while_any=True),
    Task("rescue", "awa.rescue_expired(integer)", 5.0,
         _scalar("select awa.rescue_expired(%s)", (BATCH,),
                 "sent {n} job(s) whose lease expired back to retry (or failed them)"),
         batch=BATCH, again_while_any=True),
    Task("move_staged", "awa.move_staged(integer)", 5.0,
         _scalar("select awa.move_staged()", (), "enqueued {n} staged COPY row(s)"),
         again_while_any=True),
    Task("autoscale", "awa.autoscale_tick()", 5.0, _autoscale),
    Task("prune", "awa.prune_finished()", 60.0,
         _scalar("select awa.prune_finished()", (), "pruned {n} finished job(s)")),
    Task("carry", "awa.carry_finished()", 60.0,
         _scalar("select awa.carry_finished()", (),
                 "carried {n} finished job(s) still within retention to the slot they go with"),
         again_while_any=True),
    Task("running_slots", "awa.rotate_running()", 5.0,
         _scalar("select awa.rotate_running()", (), "emptied {n} awa.running slot(s)")),
    Task("lane_hints", "awa.compact_lane_hints()", 10.0,
         _scalar("select awa.compact_lane_hints()", (), "compacted awa.lane_hints {n} time(s)")),
    Task("ready_rewrite", "awa.compact_ready()", 10.0,
         _scalar("select awa.compact_ready()", (), "rewrote awa.ready {n} time(s)")),
    Task("scheduled_rewrite", "awa.compact_scheduled()", 10.0,
         _scalar("select awa.compact_scheduled()", (), "rewrote awa.scheduled {n} time(s)")),
    Task("unique_keys", "awa.prune_unique_keys(integer)", 60.0,
         _scalar("select awa.prune_unique_keys(%s)", (BATCH,),
                 "removed {n} unique key(s) whose window had passed"),
         batch=BATCH),
    Task("ready_late", "awa.prune_ready_late(integer)", 60.0,
         _scalar("select awa.prune_ready_late(%s)", (BATCH,),
                 "removed {n} awa.ready_late row(s) of jobs gone from their lanes"),
         batch=BATCH),
    Task("retire_lanes", "awa.retire_lanes()", 60.0,
         _scalar("select awa.retire_lanes()", (),
                 "took the drained lanes above S of {n} queue(s) out of the claim walk"),
         again_while_any=True),
    Task("drops", "awa.finish_drops()", 60.0, _finish_drops, again_while_any=True),
    Task("shard_changes", "awa.prune_shard_changes(interval, integer)", 600.0,
         _scalar("select awa.prune_shard_changes(max_changes => %s)", (BATCH,),
                 "removed {n} change(s) of S past their 90 days"),
         batch=BATCH),
)
TASK_NAMES = tuple(t.name for t in TASKS)

# The first statement of each pass's transaction: its settings end with the
# transaction, and so does the pass lock the second takes (awa.try_pass_lock):
# nothing stays on the server connection. A pass is several round trips; a
# client that vanishes between two (a network cut) left its backend idle in
# the transaction, holding the pass lock and what the call took (lanes, a
# rewrite's ACCESS EXCLUSIVE lock) until the server's TCP keepalive gave up,
# up to two hours: the idle timeout ends it after the statement timeout, or
# a minute if that is longer.
LOCK_FUNCTION = "awa.try_pass_lock(text)"
IDLE_TIMEOUT_MIN_MS = 60_000
PROLOGUE = (
    "select pg_catalog.set_config('statement_timeout', %s, true),"
    " pg_catalog.set_config('idle_in_transaction_session_timeout', %s, true),"
    " pg_catalog.to_regprocedure(%s) is not null,"
    " pg_catalog.to_regprocedure(%s) is not null"
)
TAKE_LOCK = "select awa.try_pass_lock(%s)"


class MaintainMetrics:
    """The loop's metrics on one registry (client_metrics.on_registry makes it once)."""

    def __init__(self, registry: CollectorRegistry):
        from prometheus_client import Counter, Gauge

        self.passes = Counter(
            "awa_maintain_passes",
            "awa.maintain.passes: passes of each task by outcome: ran (this process held "
            "the task's lock and made the call), skipped (another process held it), absent "
            "(the function is not installed), failed.",
            ["task", "outcome"], registry=registry)
        self.handled = Counter(
            "awa_maintain_handled",
            "awa.maintain.handled: what the calls of this process handled: jobs promoted "
            "(promote), rescued (rescue), staged rows enqueued (move_staged), finished jobs "
            "pruned (prune), finished jobs carried to the slot they go with (carry), "
            "slots of awa.running emptied (running_slots), rewrites of "
            "awa.lane_hints (lane_hints), of awa.ready (ready_rewrite) and of "
            "awa.scheduled (scheduled_rewrite), unique keys "
            "whose window had passed removed (unique_keys), "
            "awa.ready_late rows of jobs gone from their lanes removed (ready_late), "
            "dropped queues removed or put back (drops), "
            "decisions that change S or would (autoscale).",
            ["task"], registry=registry)
        self.errors = Counter(
            "awa_maintain_errors",
            "awa.maintain.errors: passes that failed with an error, the connection lost "
            "included.", ["task"], registry=registry)
        self.connect_failures = Counter(
            "awa_maintain_connect_failures",
            "awa.maintain.connect_failures: attempts to open the connection that failed.",
            registry=registry)
        self.last_success = Gauge(
            "awa_maintain_last_success_timestamp_seconds",
            "awa.maintain.last_success: Unix time of the task's last pass that this process "
            "ran to completion (skipped passes do not count).",
            ["task"], registry=registry)
        for task in TASK_NAMES:
            self.handled.labels(task)
            self.errors.labels(task)
            for outcome in ("ran", "skipped", "absent", "failed"):
                self.passes.labels(task, outcome)


def cadences(every: Mapping[str, float | None] | None = None) -> dict[str, float | None]:
    """Each task's cadence in seconds (None: off), the defaults overridden by ``every``."""
    unknown = set(every or {}) - set(TASK_NAMES)
    if unknown:
        raise ValueError(f"unknown maintenance tasks {sorted(unknown)}; "
                         f"known: {', '.join(TASK_NAMES)}")
    chosen = {t.name: t.every for t in TASKS} | dict(every or {})
    for name, seconds in chosen.items():
        if seconds is not None and not seconds > 0:
            raise ValueError(f"the cadence of {name} must be > 0 seconds or None (off), "
                             f"got {seconds!r}")
    return chosen


LAST_RUNS_SQL = """
select r.name, r.last_at,
       extract(epoch from pg_catalog.statement_timestamp() - r.last_at)::float8 as age_seconds
  from awa.maintenance_runs as r
"""


def last_runs(conn: psycopg.Connection) -> list[dict] | None:
    """When each task last ran and committed, whoever ran it (awa maintain, a
    Worker, pg_cron: awa.maintenance_runs, ADR 045), in TASKS order, each
    with its function and default cadence; a row this package knows no task
    of comes last. None when the database records no runs (before migration
    0034). Needs awa_reader or awa_operator."""
    if conn.execute("select pg_catalog.to_regclass('awa.maintenance_runs') is null"
                    ).fetchone()[0]:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        runs = {r["name"]: r for r in cur.execute(LAST_RUNS_SQL)}
    known = [{"name": t.name, "function": t.function, "default_every_seconds": t.every,
              "last_at": runs.get(t.name, {}).get("last_at"),
              "age_seconds": runs.get(t.name, {}).get("age_seconds")} for t in TASKS]
    others = [{"name": name, "function": None, "default_every_seconds": None,
               "last_at": r["last_at"], "age_seconds": r["age_seconds"]}
              for name, r in sorted(runs.items()) if name not in TASK_NAMES]
    return known + others


class Backoff:
    """The wait before connecting again: BACKOFF_MIN, doubled after each wait
    up to BACKOFF_MAX, and BACKOFF_MIN again once the connection works
    (``reset``). A wait ends at once when ``stop`` is set. awa maintain's
    loop and ``awa storage autoscale run`` wait with it."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self.delay = BACKOFF_MIN  # seconds the next wait takes

    def wait(self) -> None:
        self._stop.wait(self.delay)
        self.delay = min(self.delay * 2, BACKOFF_MAX)

    def reset(self) -> None:
        self.delay = BACKOFF_MIN


class _ReadOnly(Exception):
    """The server takes no writes (a standby): no pass can run there."""


# Whether this login may take the pass locks, and which roles may (the
# maintenance role, whatever its name): read from the catalog, which any
# login may read, so that a login without USAGE on schema awa gets its answer too.
GRANT_CHECK = """
select pg_catalog.quote_ident(current_user),
       pg_catalog.has_schema_privilege(n.oid, 'USAGE')
           and pg_catalog.has_function_privilege(p.oid, 'EXECUTE'),
       (select pg_catalog.array_agg(pg_catalog.quote_ident(r.rolname) order by r.rolname)
          from pg_catalog.aclexplode(p.proacl) as a
          join pg_catalog.pg_roles as r on r.oid = a.grantee
         where a.privilege_type = 'EXECUTE' and a.grantee <> p.proowner)
  from pg_catalog.pg_proc as p
  join pg_catalog.pg_namespace as n on n.oid = p.pronamespace
 where n.nspname = 'awa' and p.proname = 'try_pass_lock'
   and p.proargtypes = '25'::pg_catalog.oidvector
"""


def missing_grant(dsn: str) -> str | None:
    """What to grant when this login may not take the pass locks (every pass
    would fail with "permission denied"), else None: also when the database
    cannot be asked now (the loop connects again) or has no pass lock yet
    (the loop waits for awa migrate)."""
    try:
        with connect(dsn, autocommit=True, prepared_statements="off",
                     application_name="awa-sql maintain", **network_defaults(dsn)) as conn:
            row = conn.execute(GRANT_CHECK).fetchone()
    except psycopg.Error:
        return None
    if row is None or row[1]:
        return None
    user, _, roles = row
    role = " or ".join(roles or ["awa_maintenance"])
    return (f"the login {user} does not hold {role} (it may not call awa.try_pass_lock): "
            f"every pass would fail with permission denied; grant {role} to {user}")


class Maintainer:
    """The loop: ``run()`` blocks until ``stop()``; ``every`` maps task names
    (TASK_NAMES) to cadences in seconds, None turning a task off."""

    def __init__(self, dsn: str | None = None, *,
                 every: Mapping[str, float | None] | None = None,
                 statement_timeout: float = STATEMENT_TIMEOUT,
                 registry: CollectorRegistry | None = None) -> None:
        self.dsn = resolve_dsn(dsn)
        parse_dsn(self.dsn)  # a malformed DSN fails here, not later, and without its text
        self.every = cadences(every)
        self.tasks = [t for t in TASKS if self.every[t.name] is not None]
        if not self.tasks:
            raise ValueError("every maintenance task is off: nothing to run")
        if not statement_timeout > 0:
            raise ValueError(f"statement_timeout must be > 0 seconds, got {statement_timeout!r}")
        self.statement_timeout = f"{max(1, round(statement_timeout * 1000))}ms"
        # At least a minute: the server counts a network round trip between
        # two statements of a pass as idle, and a short statement timeout
        # over a slow link would end every pass.
        self.idle_timeout = f"{max(IDLE_TIMEOUT_MIN_MS, round(statement_timeout * 1000))}ms"
        from awa_sql.metrics import client_metrics

        if registry is None:
            registry = client_metrics.current().registry
        self.metrics = client_metrics.on_registry(MaintainMetrics, registry)
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._busy = False  # a pass's transaction is open on _conn
        self._due = dict.fromkeys(self.every, 0.0)  # monotonic time of each task's next pass
        self._absent: dict[str, str] = {}  # task -> the function it missed at the last pass
        self._failing: dict[str, str] = {}  # task -> the error its last pass logged
        self._read_only: str | None = None  # why the last server took no writes
        self._backoff = Backoff(self._stop)

    def describe(self) -> str:
        return ", ".join(f"{name} every {seconds:g}s" if seconds is not None else f"{name} off"
                         for name, seconds in self.every.items())

    def stop(self) -> None:
        """Ends ``run()`` soon: the loop's waits end at once and a statement in
        flight is cancelled (its transaction rolls back)."""
        self._stop.set()
        conn = self._conn
        if conn is not None and self._busy:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=0.5)

    def start(self) -> threading.Thread:
        """``run()`` in a daemon thread of its own, started."""
        thread = threading.Thread(target=self.run, name="awa-maintain", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        """Blocks until ``stop()``."""
        troubled = False  # the last connection failed or was lost
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except psycopg.OperationalError as err:
                self.metrics.connect_failures.inc()
                if self._stop.is_set():
                    break
                log.warning("cannot connect: %s; retrying in %.1f s", one_line(err),
                            self._backoff.delay)
                troubled = True
                self._backoff.wait()
                continue
            if troubled:
                log.info("connected again")
                troubled = False
            try:
                with conn:
                    self._conn = conn
                    self._require_writes(conn)
                    self._serve(conn)
            except _ReadOnly as err:
                # Once, then briefly: connecting again follows a failover
                # (target_session_attrs, a moved address), and a standby
                # promoted in place takes writes on the next connection.
                if self._read_only is None:
                    log.warning("%s; no pass runs until it takes writes: connecting again"
                                " in %.1f s, then with back-off up to %g s", err,
                                self._backoff.delay, BACKOFF_MAX)
                else:
                    log.info("the server still takes no writes; connecting again in %.1f s",
                             self._backoff.delay)
                self._read_only = str(err)
                self._backoff.wait()
            except psycopg.Error as err:
                if self._stop.is_set():
                    break
                log.warning("connection lost: %s; reconnecting in %.1f s", one_line(err),
                            self._backoff.delay)
                troubled = True
                self._backoff.wait()
            finally:
                self._conn = None

    def _connect(self) -> psycopg.Connection:
        # A few statements a second gain nothing from server-side prepared
        # statements, and behind a transaction pooler they break.
        conn = connect(self.dsn, autocommit=True, prepared_statements="off",
                       application_name="awa-sql maintain", **network_defaults(self.dsn))
        # Each pass begins read committed whatever the login's or database's
        # default_transaction_isolation: most tasks refuse another level (25000).
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        return conn

    def _require_writes(self, conn: psycopg.Connection) -> None:
        """Raises _ReadOnly when ``conn``'s server takes no writes: every pass
        would fail 25006 (the pass lock is a row)."""
        if (reason := read_only_reason(conn)) is not None:
            raise _ReadOnly(read_only_error(reason, "maintenance"))
        if self._read_only is not None:
            log.info("the server takes writes: the passes resume")
            self._read_only = None

    def _serve(self, conn: psycopg.Connection) -> None:
        """Passes, each task when it is due, until stopped; raises when the
        connection is gone."""
        while not self._stop.is_set():
            task = min(self.tasks, key=lambda t: self._due[t.name])
            if self._stop.wait(max(0.0, self._due[task.name] - time.monotonic())):
                return
            self._pass(conn, task)

    def _pass(self, conn: psycopg.Connection, task: Task) -> None:
        started = time.monotonic()
        self._due[task.name] = started + self.every[task.name]
        try:
            self._busy = True
            with conn.transaction():
                _, _, installed, lockable = conn.execute(
                    PROLOGUE, [self.statement_timeout, self.idle_timeout, task.function,
                               LOCK_FUNCTION]
                ).fetchone()
                # A contract before migration 0026 has no pass lock: the pass
                # waits for awa migrate (ADR 037).
                missing = (task.function if not installed
                           else None if lockable else LOCK_FUNCTION)
                locked = missing is None and conn.execute(TAKE_LOCK, [task.name]).fetchone()[0]
                if locked:
                    count, did = task.call(conn)
        except psycopg.Error as err:
            if self._stop.is_set():
                raise  # cancelled by stop(): not a failure
            self.metrics.errors.labels(task.name).inc()
            self.metrics.passes.labels(task.name, "failed").inc()
            if conn.closed:
                raise
            if isinstance(err, psycopg.errors.ReadOnlySqlTransaction):
                self._require_writes(conn)  # the server became read-only since the connect
            message = one_line(err)
            if self._failing.get(task.name) != message:  # the same error again: logged once
                log.warning("%s: %s failed: %s", task.name, task.function, message)
            self._failing[task.name] = message
            return
        finally:
            self._busy = False
        self._backoff.reset()  # the connection works
        if missing is not None:
            self.metrics.passes.labels(task.name, "absent").inc()
            if self._absent.get(task.name) != missing:
                log.info("%s: %s is not installed; skipping %s until it is",
                         task.name, missing, task.name)
                self._absent[task.name] = missing
            return
        if task.name in self._absent:
            log.info("%s: %s is installed now", task.name, self._absent.pop(task.name))
        if not locked:
            self.metrics.passes.labels(task.name, "skipped").inc()
            return
        self.metrics.passes.labels(task.name, "ran").inc()
        self.metrics.handled.labels(task.name).inc(count)
        self.metrics.last_success.labels(task.name).set(time.time())
        if self._failing.pop(task.name, None) is not None:
            log.info("%s: working again", task.name)
        if count:
            log.info("%s: %s", task.name, did)
        if (task.batch is not None and count >= task.batch) or (task.again_while_any and count):
            # Due again from its end, not its start: due from its start, it
            # came before every task that fell due during it, which then
            # waited a second pass.
            self._due[task.name] = time.monotonic()
