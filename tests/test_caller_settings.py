"""No definer acts on the session settings its caller controls.

Every runtime role can SET (or set_config()) any user setting before it
calls a definer, and a definer runs with them: its search_path is pinned
(tests/test_security.py), nothing else is unless the function says so. One
sequence of the public API (the operator's settings, enqueues of every kind,
COPY, claims, a heartbeat, completes, fails with a backoff and with a time,
the job tools, every maintenance call, the views and read functions) runs in
a fresh database once with the server's defaults and once under each hostile
case (a time zone, most of them with a group of format settings beside it;
planner, jit and parallel settings; custom settings; isolation), given by
every login that runs it; the results and every row stored
in schema awa must be the same. Instants are compared as instants (results
are read in binary, so no DateStyle, IntervalStyle or TimeZone reaches the
client's parsing), durations as seconds. Two timestamps of a run that come
from the clock are compared within CLOCK_SLACK of the run's start, far below
the hour a time zone moves a day by.

An isolation level or a read-only transaction changes what a call may do:
each call is then either the same as the default's or refused with the
documented SQLSTATE (ISOLATION_REFUSALS), and the caller runs it again in a
read committed, read-write transaction, as the docs say to, so the sequence
goes on. A statement timeout fails calls anywhere in them: a failed call
must leave every row as it was.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb, set_json_loads

from tests.support.database import Database

CLOCK_SLACK = timedelta(seconds=60)
ROLES = ("producer", "worker", "maintenance", "operator", "reader")
# Unique windows of 1 day and every 30 days up to 360: in any zone that
# keeps daylight saving time, one of them ends on the other side of a change.
WINDOWS = ["1 day", *(f"{30 * k} days" for k in range(1, 13))]
# Texts (by column) that render values of other types: compared with their
# numbers masked (the instants differ between runs), so that the form counts.
RENDERED = {"reason"}
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _posix_zone(now: datetime, east_hours: int) -> str:
    """A POSIX time zone (UTC, and east_hours ahead in summer) whose summer
    time runs from an hour before `now` to an hour after: a day added to or
    taken from `now` by the calendar lands in winter time, east_hours away."""
    start = now - timedelta(hours=1)
    end_local = now + timedelta(hours=1) + timedelta(hours=east_hours)
    summer = f"<S>{-east_hours:+d}"

    def rule(t):
        return f"{t.timetuple().tm_yday - 1}/{t:%H:%M}"

    return f"<W>+0{summer},{rule(start)},{rule(end_local)}"


# Time zones a session may set (the instants and days a definer computes).
ZONES = {
    "TimeZone Chatham": [("TimeZone", "Pacific/Chatham")],
    "TimeZone St_Johns": [("TimeZone", "America/St_Johns")],
    "TimeZone Troll": [("TimeZone", "Antarctica/Troll")],
    "TimeZone POSIX +14": [("TimeZone", "<+14>-14")],
    "TimeZone POSIX summer 12h ahead": [("TimeZone", lambda now: _posix_zone(now, 12))],
    "TimeZone POSIX summer 12h behind": [("TimeZone", lambda now: _posix_zone(now, -12))],
    "TimeZone POSIX -15:59": [("TimeZone", "<-1559>+15:59")],
    "TimeZone POSIX +20": [("TimeZone", "<+20>-20")],
}
# Formats, parsing and planner settings, each of another setting than the
# others in its group, so that a group runs in one case: a difference names its case,
# and each of its settings can then be tried alone.
FORMATS = [
    [("DateStyle", "SQL, DMY"), ("IntervalStyle", "sql_standard"),
     ("extra_float_digits", "-15"), ("bytea_output", "escape")],
    [("DateStyle", "German"), ("IntervalStyle", "iso_8601"), ("extra_float_digits", "3"),
     ("lc_numeric", "C"), ("lc_monetary", "C"), ("lc_time", "C")],
    [("DateStyle", "Postgres, MDY"), ("IntervalStyle", "postgres_verbose"),
     ("client_encoding", "LATIN1")],
    [("standard_conforming_strings", "off"), ("array_nulls", "off")],
    [("transform_null_equals", "on")],
    # The planner's switches change no format: beside a zone as well.
    [("enable_indexscan", "off"), ("enable_bitmapscan", "off"), ("enable_indexonlyscan", "off")],
    [("enable_seqscan", "off"), ("enable_nestloop", "off"), ("enable_sort", "off")],
    [("plan_cache_mode", "force_generic_plan"), ("random_page_cost", "1000000"),
     ("cpu_tuple_cost", "0"), ("work_mem", "64kB")],
]


def _zones_with_formats() -> dict:
    """Each time zone case, each with a group of FORMATS too."""
    cases = {}
    for n, (zone, settings) in enumerate(ZONES.items()):
        extra = FORMATS[n] if n < len(FORMATS) else []
        name = ", ".join([zone, *(f"{k} {v}" for k, v in extra)])
        cases[name] = settings + extra
    return cases


# Each hostile case: (setting, value) pairs every login sets for its session.
# A callable value is built from the server's clock when the case runs.
HOSTILE = {
    **_zones_with_formats(),
    "planner: custom plans": [("plan_cache_mode", "force_custom_plan")],
    "jit at every cost": [("jit", "on"), ("jit_above_cost", "0"),
                          ("jit_inline_above_cost", "0"), ("jit_optimize_above_cost", "0")],
    "parallel query forced": [("debug_parallel_query", "on"),
                              ("parallel_setup_cost", "0"), ("parallel_tuple_cost", "0")],
    "custom awa.* settings": [("awa.anything", "x"), ("awa.lane_memo", "on"),
                              ("awa.lane_lock_wait_us", "not a number"),
                              ("awa.queue_limit", "0"), ("awa.now", "2000-01-01")],
    "plpgsql checks": [("plpgsql.extra_warnings", "all"), ("plpgsql.check_asserts", "off")],
    "lock_timeout 1ms": [("lock_timeout", "1ms")],
    "synchronous_commit off": [("synchronous_commit", "off")],
    "repeatable read": [("default_transaction_isolation", "repeatable read")],
    "serializable": [("default_transaction_isolation", "serializable")],
    "read only": [("default_transaction_read_only", "on")],
}

# Every maintenance call, by the name of its step.
MAINTENANCE = [
    ("promote", "awa.promote_due()"), ("rescue", "awa.rescue_expired()"),
    ("move staged", "awa.move_staged()"), ("sample", "awa.sample_lane_contention()"),
    ("tick", "* from awa.autoscale_tick()"), ("prune", "awa.prune_finished()"),
    ("carry", "awa.carry_finished()"), ("rotate", "awa.rotate_running()"),
    ("hints", "awa.compact_lane_hints()"), ("ready", "awa.compact_ready()"),
    ("scheduled", "awa.compact_scheduled()"),
    ("unique keys", "awa.prune_unique_keys()"), ("ready late", "awa.prune_ready_late()"),
    ("retire", "awa.retire_lanes()"), ("drops", "* from awa.finish_drops()"),
    ("shard changes", "awa.prune_shard_changes('1 day')"),
    ("pass lock", "awa.try_pass_lock('promote')"),
]
STEP_CALLS = {step: re.search(r"awa\.\w+", call)[0] for step, call in MAINTENANCE}
STEP_CALLS["drop"] = "awa.drop_queue"  # the operator's step of that name

# The calls a transaction that is not read committed may be refused (25000,
# docs/sql-api.md): each truncates what it read, which an older snapshot
# would not have seen, or decides from a table another truncates (a drop
# from what the queue holds, the late rows' prune from the lanes' heads).
READ_COMMITTED_ONLY = {
    "awa.rotate_running", "awa.compact_lane_hints", "awa.compact_ready",
    "awa.compact_scheduled", "awa.prune_finished", "awa.carry_finished", "awa.retire_lanes",
    "awa.finish_drops", "awa.prune_ready_late", "awa.drop_queue",
}
TIMEOUT = "57014"
ISOLATION_REFUSALS = {
    "repeatable read": ("25000", READ_COMMITTED_ONLY),
    "serializable": ("25000", READ_COMMITTED_ONLY),
    # Every call that writes (docs/security.md): none may write from a
    # read-only transaction.
    "read only": ("25006", None),
}


@dataclass
class Run:
    """One run of the sequence: its database, a login and a session per
    role, the start of the run, and what each call returned."""

    db: Database
    su: psycopg.Connection
    conns: dict[str, psycopg.Connection]
    logins: dict[str, str]
    anchor: datetime
    settings: list[tuple[str, str]]
    refusal: tuple[str, set[str] | None] | None = None
    results: dict[str, object] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unordered: set[str] = field(default_factory=set)

    def call(self, step: str, role: str, query: str, params=(), record=True, ordered=True):
        """The rows of the query, as dicts; sorted when their order is not
        the call's (a view's)."""
        def work(conn):
            cur = conn.execute(query, params, binary=True)
            names = [d.name for d in cur.description]
            rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            if not ordered:
                self.unordered.add(step)
            return rows if ordered else sorted(rows, key=repr)
        return self.attempt(step, role, work, record)

    def attempt(self, step: str, role: str, work: Callable, record=True):
        """work(conn) in one transaction of the role's session: its rows."""
        conn = self.conns[role]
        cut_short = self.refusal is not None and self.refusal[0] == TIMEOUT
        before = _stored(self.su) if cut_short else None
        try:
            with conn.transaction():
                rows = work(conn)
        except psycopg.Error as err:
            if self.refusal is None or err.sqlstate != self.refusal[0]:
                raise AssertionError(f"{step} ({role}) under {self.settings}: {err}") from err
            self.refused[step] = err.sqlstate
            if cut_short:
                assert _stored(self.su) == before, f"{step} cut short left rows changed"
            # Again as the docs say to: read committed, read-write, in time.
            # A SET is cut short by the session's 1 ms too, on a busy
            # machine: the timeout is lifted before the transaction, by a
            # SET tried until one is in time, and put back after.
            if cut_short:
                _lift_statement_timeout(conn)
            with conn.transaction():
                conn.execute("set transaction isolation level read committed, read write")
                rows = work(conn)
            if cut_short:
                _set_all(conn, self.settings)
        if record:
            self.results[step] = rows
        return rows

    def at(self, **delta) -> datetime:
        return self.anchor + timedelta(**delta)


def _lift_statement_timeout(conn: psycopg.Connection) -> None:
    # The timeout can cut short the COMMIT (or the ROLLBACK) that ended the
    # call before it ends the transaction: the session is then still in
    # the aborted transaction, and is rolled back first, in time too.
    # A 1 ms timer can also fire as a statement ends, and the cancel then
    # lands on the next statement: a `select 1` after the SET takes it.
    for _ in range(1000):
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.rollback()
            conn.execute("set statement_timeout = 0")
            conn.execute("select 1")
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.commit()
            return
        except psycopg.errors.QueryCanceled:
            continue
    raise AssertionError("no ROLLBACK and SET of statement_timeout in time in 1,000 tries")


def _set_all(conn: psycopg.Connection, settings) -> None:
    for name, value in settings:
        conn.execute("select set_config(%s, %s, false)", [name, value])


def _json_in(conn: psycopg.Connection, data) -> object:
    return json.loads(bytes(data).decode(conn.info.encoding))


def _job_id(rows) -> int:
    return rows[0]["job_id"]


def scenario(r: Run) -> None:
    """The sequence every run makes, each call its own transaction."""
    op, prod, work, maint, read = ROLES[3], ROLES[0], ROLES[1], ROLES[2], ROLES[4]
    # The operator's settings: durations given by the calendar, stored in seconds.
    # Unkeyed jobs go to queues of one lane: a producer's sticky lane
    # depends on its backend, which differs between runs.
    r.call("shards", op, "select * from awa.set_enqueue_shards('dwide', 4)")
    r.call("dq", op, "select * from awa.set_enqueue_shards('dq', 1)")
    r.call("max run time", op, "select awa.set_max_run_time('dq', '1 day')")
    r.call("retention", op, "select awa.set_retention('dq', '2 days', '9 days')")
    r.call("retry policy", op, "select awa.set_retry_policy('dq', '10 seconds', '1 day', 0.5)")
    r.call("partitions", op, "select * from awa.set_queue_partitions('dpart', 2)")
    r.call("stripes", op, "select * from awa.set_queue_stripes('dstripe', 2)")
    r.call("max queues", op, "select awa.set_max_queues(5000)")
    r.call("auto shards", op, "select * from awa.set_enqueue_shards('dauto', 2)")
    r.call("auto mode", op, "select * from awa.set_shard_mode('dauto', 'shadow', 8)")
    r.call("steady shards", op, "select * from awa.set_enqueue_shards('dsteady', 1)")
    r.call("steady mode", op, "select * from awa.set_shard_mode('dsteady', 'shadow', 4)")
    r.call("steady policy", op,
           "select awa.set_autoscale_policy('dsteady', grow_window => '1 hour',"
           " cooldown => '1 day', min_samples => 1)")
    r.call("history", op, "select * from awa.set_enqueue_shards('dhist', 2)")
    r.call("history again", op, "select * from awa.set_enqueue_shards('dhist', 1)")
    # The first change 20 hours old: kept by a prune of changes older than a day.
    r.su.execute("update awa.shard_changes set changed_at = changed_at - interval '20 hours'"
                 " where queue = 'dhist' and new_shards = 2")
    r.call("gone shards", op, "select * from awa.set_enqueue_shards('dgone', 1)")
    r.call("drop", op, "select * from awa.drop_queue('dgone')")

    # Producers: every path, with values whose text forms depend on settings.
    r.call("enqueue plain", prod,
           "select * from awa.enqueue('dq', 'plain', %s, priority => 1::smallint)",
           [Jsonb({"f": 0.1, "big": 1e300, "tiny": 5e-324, "s": "é"})])
    r.call("enqueue keyed", prod,
           "select * from awa.enqueue('dwide', 'keyed', ordering_key => %s)",
           [b"\\x41\x00\x01\xff'"])
    r.call("enqueue later", prod, "select * from awa.enqueue('dq', 'later', run_at => %s)",
           [r.at(hours=1)])
    r.call("enqueue past", prod, "select * from awa.enqueue('dq', 'past', run_at => %s)",
           [r.at(hours=-1)])
    r.call("enqueue once", prod, "select * from awa.enqueue('dq', 'once', max_attempts => 1)")
    for w in WINDOWS:
        r.call(f"enqueue unique {w}", prod,
               "select * from awa.enqueue('du', %s, unique_key => %s, unique_window => %s)",
               [f"u {w}", f"key {w}".encode(), w])
    r.call("enqueue unique again", prod,
           "select * from awa.enqueue('du', 'dup', unique_key => %s, unique_window => '1 day')",
           [b"key 1 day"])
    r.call("batch", prod,
           # Arrays in binary: their text form is the client's to get right.
           "select * from awa.enqueue_batch(%b::text[], %b::text[],"
           " ordering_keys => %b::bytea[], run_ats => %b::timestamptz[],"
           " max_run_times => array['1 day', '30 days', null, '1 mon', null]::interval[])",
           [["dq", "dq", "dpart", "dstripe", "dwide"], ["b1", "b2", "b3", "b4", "b5"],
            [None, None, b"pk", b"sk", b"wk"],
            [None, r.at(minutes=-10), None, r.at(hours=2), None]])
    r.call("enqueue non-ascii", prod, "select * from awa.enqueue('dé', 'kö', %s)",
           [Jsonb({"ü": "ß"})])
    def copy(conn):
        # Binary, as the arrays above.
        with conn.cursor().copy(
                "copy awa.copy_staging (queue, kind, run_at, max_run_time, ordering_key)"
                " from stdin (format binary)") as cp:
            cp.set_types(["text", "text", "timestamptz", "interval", "bytea"])
            cp.write_row(["dcopy", "c1", None, timedelta(days=2), None])
            cp.write_row(["dcopy", "c2", r.at(hours=3), None, b"ck"])
            cp.write_row(["dcopy", "c3", None, timedelta(days=30), None])
        return conn.execute("select awa.enqueue_copied()", binary=True).fetchall()

    r.attempt("copy", prod, copy)
    ready_tool = _job_id(r.call("tool ready", prod, "select * from awa.enqueue('dtool', 't1')"))
    later_tool = _job_id(r.call("tool later", prod,
                                "select * from awa.enqueue('dtool', 't2', run_at => %s)",
                                [r.at(hours=5)]))
    r.call("publish", prod,
           "select awa.publish_runtime(%s, 'producer', 'h', 1, 'v', 0, %s)",
           [uuid.UUID(int=7),
            Jsonb([{"queue": "dq", "activity": "enqueue", "age_seconds": 1.5}])])

    # Workers.
    claimed = r.call("claim dq", work, "select * from awa.claim(array['dq'], 100, 'w1', '1 day')")
    by_kind = {row["kind"]: (row["job_id"], row["run_lease"]) for row in claimed}
    plain, b1, b2, once = by_kind["plain"], by_kind["b1"], by_kind["b2"], by_kind["once"]
    r.call("heartbeat", work, "select awa.heartbeat(%s, %s, '2 days')", [plain[0], plain[1]])
    r.call("complete", work, "select awa.complete(%s, %s)", [plain[0], plain[1]])
    r.call("fail backoff", work, "select awa.fail(%s, %s, 'boom')", [b1[0], b1[1]])
    r.call("fail at", work, "select awa.fail(%s, %s, 'boom at', %s)", [b2[0], b2[1], r.at(hours=2)])
    r.call("fail once", work, "select awa.fail(%s, %s, 'no more')", [once[0], once[1]])
    for row in r.call("claim du", work, "select * from awa.claim(array['du'], 100, 'w1')"):
        r.call(f"complete {row['kind']}", work, "select awa.complete(%s, %s)",
               [row["job_id"], row["run_lease"]])
    # One call per name: the order between queues is drawn for each call.
    for queue in ("dpart", "dstripe", "dé", "dcopy", "dwide"):
        r.call(f"claim {queue}", work,
               "select * from awa.claim(array[%s], 100, 'w2', '30 seconds')", [queue])

    # The operator's job tools.
    r.call("release", op, "select awa.release_worker('w2')")
    r.call("cancel ready", op, "select awa.cancel_job(%s)", [ready_tool])
    r.call("cancel later", op, "select awa.cancel_job(%s)", [later_tool])
    r.call("retry once", op, "select awa.retry_job(%s)", [once[0]])
    r.call("retry cancelled", op, "select * from awa.retry_jobs('dtool', state => 'cancelled')")

    # Maintenance.
    for step, call in MAINTENANCE:
        r.call(step, maint, f"select {call}")

    # Readers: the views and read functions.
    for view in ("queue_overview", "lane_overview", "lane_contention", "queue_history",
                 "runtime_overview", "runtime_queue_overview", "shard_change_evidence",
                 "autoscale_decisions", "queue_limit", "maintenance_runs"):
        r.call(f"view {view}", read, f"select * from awa.{view}", ordered=False)
    for job in (plain[0], b1[0], b2[0], once[0], ready_tool, later_tool):
        r.call(f"job {job}", read, "select * from awa.job(%s)", [job])
    r.call("jobs", read, "select * from awa.jobs('dq', max_jobs => 1000)")
    r.call("jobs du", read, "select * from awa.jobs('du', max_jobs => 1000)")
    r.call("counts", read, "select * from awa.queue_counts('dq')")
    r.call("count ready", read, "select awa.count_jobs('dq', 'ready')")
    r.call("failures", read, "select * from awa.failure_summary('dq', '1 day')")
    r.call("shards of", read, "select awa.enqueue_shards('dq')")


# Stored state: every table of schema awa (a partitioned table with its
# partitions), read by the superuser with the server's defaults.
TABLES = """
    select c.relname from pg_class c
     where c.relnamespace = 'awa'::regnamespace and c.relkind in ('r', 'p')
       and not c.relispartition
     order by 1
"""


# Types whose values are the cluster's counters, not the run's: new in
# every database (oid, xid, xid8); compared as present or not.
COUNTERS = {26, 28, 5069}


def _stored(conn: psycopg.Connection) -> dict[str, list[dict]]:
    out = {}
    for (name,) in conn.execute(TABLES).fetchall():
        cur = conn.execute(sql.SQL("select * from awa.{}").format(sql.Identifier(name)))
        cols = [(d.name, d.type_code in COUNTERS) for d in cur.description]
        out[name] = [{c: ("<counter>" if counter and v is not None else v)
                      for (c, counter), v in zip(cols, row, strict=True)}
                     for row in cur.fetchall()]
    return out


def _changed(before, after) -> dict[str, list[dict]]:
    """The rows a run wrote (those stored at its end that were not at its
    start), and how many of each table's first rows it removed."""
    def key(row):
        return repr(sorted(row.items()))
    out = {}
    removed = {}
    for name, rows in after.items():
        old = {key(row) for row in before.get(name, [])}
        new = {key(row) for row in rows}
        out[name] = [row for row in rows if key(row) not in old]
        removed[name] = len(old - new)
    out["(removed)"] = [removed]
    return out


class Clock:
    """A time of the run, compared within CLOCK_SLACK."""

    def __init__(self, offset: timedelta):
        self.offset = offset

    def __eq__(self, other):
        return isinstance(other, Clock) and abs(self.offset - other.offset) <= CLOCK_SLACK

    def __repr__(self):
        return f"<run start {self.offset.total_seconds():+.3f} s>"


def _norm(value, run: Run, where=None):
    if isinstance(value, datetime):
        return Clock(value.astimezone(UTC) - run.anchor)
    if isinstance(value, timedelta):
        return Clock(value)
    if isinstance(value, str):
        for login_role, login in run.logins.items():
            value = value.replace(login, f"<{login_role} login>")
        return NUMBER.sub("#", value) if where in RENDERED else value
    if isinstance(value, list | tuple):
        return type(value)(_norm(v, run) for v in value)
    if isinstance(value, dict):
        out = {k: _norm(v, run, k) for k, v in value.items()}
        if "slot" in value and isinstance(value.get("finished_at"), datetime):
            out["slot"] = _finished_slot(value["slot"], value["finished_at"], run.anchor)
        return out
    if isinstance(value, float | Decimal | int | bool | bytes | memoryview | uuid.UUID) \
            or value is None:
        return bytes(value) if isinstance(value, memoryview) else value
    return value


# awa.finished's rings: slots per ring, and each ring's period in seconds.
RING_SLOTS = 32
RING_SECONDS = (3600, 21600, 86400)


def _finished_slot(slot: int, finished_at: datetime, anchor: datetime) -> str:
    """A row's slot of awa.finished named by the time it was taken from
    (its finished_at, else the run's start), not by its number: a run on
    either side of an hour's boundary writes the same slot, by a different
    number."""
    ring, _ = divmod(slot, RING_SLOTS)
    for name, at in (("finished_at", finished_at), ("run start", anchor)):
        at_slot = int(at.timestamp()) // RING_SECONDS[ring] % RING_SLOTS + ring * RING_SLOTS
        if slot == at_slot:
            return f"<slot of {name}, ring {ring}>"
    return f"<slot {slot}, ring {ring}>"


def _sort_key(value) -> str:
    """An order of rows that ignores the clock's small drift between runs."""
    if isinstance(value, Clock):
        return "<clock>"
    if isinstance(value, dict):
        return repr([(k, _sort_key(v)) for k, v in sorted(value.items())])
    if isinstance(value, list | tuple):
        return repr([_sort_key(v) for v in value])
    return repr(value)


def _outcome(run: Run, before, after) -> dict:
    results = {step: _norm(rows, run) for step, rows in run.results.items()}
    for step in run.unordered:
        results[step] = sorted(results[step], key=_sort_key)
    stored = {}
    for name, rows in _changed(before, after).items():
        normed = [_norm(row, run) for row in rows]
        stored[name] = sorted(normed, key=_sort_key)
    return {"results": results, "stored": stored}


def run_sequence(cluster, template: str, settings, refusal=None) -> tuple[dict, Run]:
    name = cluster.create_database(template=template)
    db = Database(cluster, name)
    try:
        logins = dict(zip(ROLES, db.login_roles(*(f"awa_{role}" for role in ROLES)),
                          strict=True))
        with db.connect() as su:
            # Stored values are read with fixed settings (regclass as names).
            _set_all(su, [("TimeZone", "UTC"), ("DateStyle", "ISO"),
                          ("IntervalStyle", "postgres")])
            anchor = su.execute("select now()").fetchone()[0].astimezone(UTC)
            values = [(n, v(anchor) if callable(v) else v) for n, v in settings]
            conns = {role: db.connect(login) for role, login in logins.items()}
            try:
                for conn in conns.values():
                    # psycopg reads json as UTF-8 whatever the client encoding.
                    set_json_loads(partial(_json_in, conn), conn)
                    # The same draws in every run: the claim's lane order, the
                    # retry's jitter. Before the settings: a statement timeout
                    # of 1 ms could cut this short on a loaded machine.
                    conn.execute("select setseed(0.25)")
                    _set_all(conn, values)
                run = Run(db, su, conns, logins, anchor, values, refusal)
                # Every maintenance call notes its run (at most once in 5 s):
                # in every run, then, whenever it starts.
                su.execute("update awa.maintenance_runs set last_at = now() - interval '1 hour'")
                before = _stored(su)
                scenario(run)
                after = _stored(su)
            finally:
                for conn in conns.values():
                    conn.close()
        return _outcome(run, before, after), run
    finally:
        cluster.drop_database(name)


@pytest.fixture(scope="module")
def baseline(cluster, template_db):
    return run_sequence(cluster, template_db, [])[0]


def _differences(expected: dict, got: dict) -> list[str]:
    out = []
    for part in ("results", "stored"):
        for key in sorted(set(expected[part]) | set(got[part])):
            a, b = expected[part].get(key) or [], got[part].get(key) or []
            if a != b:
                only_a = [row for row in a if row not in b]
                only_b = [row for row in b if row not in a]
                out.append(f"{part} {key}:\n  default only: {only_a!r}\n"
                           f"  hostile only: {only_b!r}")
    return out


def _take_unrecorded_runs(baseline: dict, outcome: dict) -> None:
    """A maintenance call that did nothing, read-only, records no run (ADR
    045): each record of the read-only run is the default run's or one left
    from before the run; then the default run's stand in for them."""
    for part, key in (("results", "view maintenance_runs"), ("stored", "maintenance_runs")):
        recorded = {row["name"]: row for row in baseline[part][key]}
        kept = outcome[part][key]
        assert all(row == recorded.get(row["name"]) or row["last_at"].offset < timedelta(0)
                   for row in kept), kept
        outcome[part][key] = baseline[part][key]
    for before, after in zip(baseline["stored"]["(removed)"], outcome["stored"]["(removed)"],
                             strict=True):
        after["maintenance_runs"] = before["maintenance_runs"]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_callers_settings_change_nothing_a_definer_stores_or_returns(
        cluster, template_db, baseline, case):
    refusal = ISOLATION_REFUSALS.get(case)
    outcome, run = run_sequence(cluster, template_db, HOSTILE[case], refusal)
    if case == "read only":
        _take_unrecorded_runs(baseline, outcome)
    differences = _differences(baseline, outcome)
    assert not differences, "\n".join(differences)
    if refusal is not None:
        _, allowed = refusal
        assert run.refused, f"{case}: no call was refused"
        if allowed is not None:
            assert {STEP_CALLS.get(step) for step in run.refused} <= allowed, run.refused


def test_a_call_cut_short_by_the_statement_timeout_leaves_every_row_as_it_was(
        cluster, template_db):
    """Every login with a statement timeout of 1 ms: a call it cuts short
    changes no row (checked in Run.attempt, then run again in time); the
    sequence's ids move on (a sequence is not rolled back), so it is not
    compared with the default's."""
    _, run = run_sequence(cluster, template_db, [("statement_timeout", "1ms")],
                          (TIMEOUT, None))
    assert run.refused, "the timeout cut no call short"
