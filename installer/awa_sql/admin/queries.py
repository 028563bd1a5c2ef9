"""The reads behind the API: views granted to awa_reader, nothing else.

Parts that a newer contract adds (the auto-scaler's decisions, runtime
snapshots) are read only when their relation exists, so the page works
against an older database and shows those panels once they land.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import psycopg
from psycopg.rows import dict_row

from awa_sql.admin.errors import ApiError
from awa_sql.bulk_bound import count_in_bound
from awa_sql.defaults import RETRY_STATES, SCHEDULED_CAP
from awa_sql.jsonb import shown
from awa_sql.queues import covered_by

RECENT = 20

QUEUE_COLUMNS = """
    o.queue, o.logical_queue, o.enqueue_shards, o.shard_mode, o.max_shards, o.paused,
    o.stripes, o.partitions, o.ready, o.running, o.scheduled, o.failed, o.completed,
    o.oldest_ready_age
"""

FAMILY_COUNTS = ("ready", "running", "scheduled", "failed", "completed")


def _plain(row: dict) -> dict:
    """JSON-friendly values: intervals in seconds, numerics as floats."""
    out = {}
    for key, value in row.items():
        if isinstance(value, timedelta):
            key = "lag_seconds" if key == "lag" else f"{key}_seconds"
            value = round(value.total_seconds(), 3)
        elif isinstance(value, Decimal):
            value = float(value)
        out[key] = value
    if "oldest_ready_age" in row and row["oldest_ready_age"] is None:
        out.pop("oldest_ready_age")
        out["oldest_ready_age_seconds"] = None
    if "lag" in row and row["lag"] is None:
        out.pop("lag")
        out["lag_seconds"] = None
    return out


def _queue(row: dict) -> dict:
    """A row of QUEUE_COLUMNS, with whether its scheduled count is at the cap."""
    return {**_plain(row), "scheduled_at_cap": row["scheduled"] >= SCHEDULED_CAP}


def _exists(conn: psycopg.Connection, relation: str) -> bool:
    return conn.execute("select pg_catalog.to_regclass(%s) is not null",
                        [relation]).fetchone()[0]


def has_function(conn: psycopg.Connection, signature: str) -> bool:
    return conn.execute("select pg_catalog.to_regprocedure(%s) is not null",
                        [signature]).fetchone()[0]


def list_queues(conn: psycopg.Connection) -> list[dict]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"select {QUEUE_COLUMNS} from awa.queue_overview as o"
            " order by o.logical_queue, o.queue").fetchall()
    return [_queue(r) for r in rows]


def require_queue(conn: psycopg.Connection, queue: str) -> None:
    """404 unless ``queue`` names a queue (logical or physical)."""
    found = conn.execute(
        "select exists (select from awa.covered_queues(%s::text))", [queue]).fetchone()[0]
    if not found:
        raise ApiError(404, f"unknown queue {queue!r}", "42704")


def queue_detail(conn: psycopg.Connection, queue: str) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        physical = [_queue(r) for r in cur.execute(
            f"select {QUEUE_COLUMNS} from awa.queue_overview as o"
            f" where {covered_by('o.queue', 'q')}"
            " order by o.queue = %(q)s desc, o.queue", {"q": queue}).fetchall()]
        if not physical:
            raise ApiError(404, f"unknown queue {queue!r}", "42704")
        names = [p["queue"] for p in physical]
        lanes = [_plain(r) for r in cur.execute(
            "select l.queue, l.priority, l.shard, l.lane_id, l.ready, l.lag, l.next_seq,"
            " l.claim_position, l.draining, l.shard >= o.enqueue_shards as above_s, l.walked"
            " from awa.lane_overview as l"
            " join awa.queue_overview as o on o.queue = l.queue"
            " where l.queue = any(%s) order by l.queue, l.shard, l.priority",
            [names]).fetchall()]
        contention = cur.execute(
            "select c.queue, c.samples, c.mean_waiters_per_held_lane, c.wait_share,"
            " c.enqueue_rate, c.last_sample from awa.lane_contention as c"
            " where c.queue = any(%s) order by c.queue", [names]).fetchall()
        changes = cur.execute(
            "select c.change_id, c.queue, c.old_shards, c.new_shards, c.lanes_created,"
            " c.changed_by, c.changed_at, c.source from awa.shard_changes as c"
            " where c.queue = any(%s) order by c.change_id desc limit %s",
            [names, RECENT]).fetchall()
    detail = {**physical[0], **family_counts(physical)}
    detail["physical_queues"] = physical
    detail["lanes"] = lanes
    detail["contention"] = [_plain(c) for c in contention]
    detail["shard_changes"] = changes
    detail["decisions"] = decisions(conn, names)
    detail["runtimes"] = runtimes(conn, physical)
    return detail


def family_counts(physical: list[dict]) -> dict:
    """The jobs of every physical queue a name covers (its partitions and
    stripes): the counts summed, the lag the largest."""
    ages = [p["oldest_ready_age_seconds"] for p in physical
            if p["oldest_ready_age_seconds"] is not None]
    return {**{c: sum(p[c] for p in physical) for c in FAMILY_COUNTS},
            "oldest_ready_age_seconds": max(ages, default=None),
            "scheduled_at_cap": any(p["scheduled_at_cap"] for p in physical)}


def _has_column(conn: psycopg.Connection, relation: str, column: str) -> bool:
    return conn.execute(
        "select exists (select from pg_catalog.pg_attribute"
        " where attrelid = pg_catalog.to_regclass(%s) and attname = %s and not attisdropped)",
        [relation, column]).fetchone()[0]


def decisions(conn: psycopg.Connection, names: list[str]) -> list[dict] | None:
    """The auto-scaler's recent decisions, runs of identical holds folded into
    one row; None when the contract has none."""
    if not _exists(conn, "awa.autoscale_decisions"):
        return None
    folded = ("d.repeats, d.last_decided_at"
              if _has_column(conn, "awa.autoscale_decisions", "repeats")
              else "1 as repeats, d.decided_at as last_decided_at")
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "select d.decision_id, d.queue, d.decided_at, d.mode, d.samples, d.mean_waiters,"
            " d.wait_share, d.enqueue_rate, d.current_shards, d.proposed_shards, d.action,"
            f" d.reason, {folded} from unnest(%(names)s::text[]) as n (name)"
            # Each queue's latest from the top of its index, then the latest
            # of those: RECENT rows per queue, not the log down from its
            # newest row through every other queue's decisions since.
            " cross join lateral (select x.* from awa.autoscale_decisions as x"
            "  where x.queue = n.name order by x.decided_at desc, x.decision_id desc"
            "  limit %(recent)s) as d"
            " order by d.decided_at desc, d.decision_id desc limit %(recent)s",
            {"names": names, "recent": RECENT}).fetchall()
    return [_plain(r) for r in rows]


HISTORY = """
with h as (
    -- Only the ticks' samples carry the enqueue counter (it only grows): a
    -- rate runs from the last sample before that carries one.
    select h.sampled_at, h.lanes_held, h.waiters, h.ready, h.lag,
           case when h.enqueued is not null
                then greatest(h.enqueued - max(h.enqueued) over before, 0)
           end as enqueued_since,
           extract(epoch from h.sampled_at
                   - max(h.sampled_at) filter (where h.enqueued is not null) over before)
               as seconds_since
      from awa.queue_history as h
     where h.queue = any(%(names)s) and h.sampled_at > %(since)s
    window w as (partition by h.queue order by h.sampled_at),
           before as (w rows between unbounded preceding and 1 preceding)
)
select h.sampled_at as at,
       sum(h.enqueued_since / nullif(h.seconds_since, 0))::float8 as enqueue_rate,
       (sum(h.waiters)::numeric / greatest(sum(h.lanes_held), 1))::float8
           as waiters_per_held_lane,
       sum(h.lanes_held)::integer as lanes_held,
       sum(h.ready)::bigint as ready,
       extract(epoch from max(h.lag))::float8 as lag_seconds
  from h
 group by h.sampled_at
 order by h.sampled_at
"""


def history(conn: psycopg.Connection, queue: str, window: timedelta) -> dict | None:
    """The queue over the last ``window`` from the contention samples (kept one
    hour): S, enqueues/s, waiters per held lane, ready depth and lag, and the
    changes of S. None when the contract keeps no history."""
    if not _exists(conn, "awa.queue_history"):
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        physical = cur.execute(
            "select o.queue, o.enqueue_shards, o.shard_mode, o.max_shards,"
            " pg_catalog.clock_timestamp() as until from awa.queue_overview as o"
            f" where {covered_by('o.queue', 'q')}"
            " order by o.queue = %(q)s desc, o.queue", {"q": queue}).fetchall()
        if not physical:
            raise ApiError(404, f"unknown queue {queue!r}", "42704")
        anchor = physical[0]
        until = anchor["until"]
        since = until - window
        points = cur.execute(HISTORY, {"names": [p["queue"] for p in physical],
                                       "since": since}).fetchall()
        changes = cur.execute(
            "select c.changed_at as at, c.old_shards, c.new_shards, c.source"
            " from awa.shard_changes as c where c.queue = %s and c.changed_at > %s"
            " order by c.change_id", [anchor["queue"], since]).fetchall()
    # S at a sample: the S the latest change before it set, else the S the
    # first change after it started from, else today's S.
    for point in points:
        before = [c for c in changes if c["at"] <= point["at"]]
        after = [c for c in changes if c["at"] > point["at"]]
        point["shards"] = (before[-1]["new_shards"] if before
                           else after[0]["old_shards"] if after else anchor["enqueue_shards"])
    return {"queue": queue, "since": since, "until": until,
            "shard_mode": anchor["shard_mode"], "max_shards": anchor["max_shards"],
            "points": points, "changes": changes}


# One line per live runtime and activity over the physical queues a name
# covers (a worker polling a logical name has a row on each of them): how
# many, and the queue and S of the latest; on_s: whether it did this with
# S = %(shards)s since %(since)s on one of them (for enqueues, the producers
# on the current S).
RUNTIMES_OF_QUEUES = """
select r.instance_id::text, r.kind, r.hostname, r.pid, r.version, r.in_flight, r.last_seen,
       r.started_at, q.activity, count(*)::integer as queues,
       (array_agg(q.queue order by q.last_at desc nulls last, q.queue))[1] as queue,
       max(q.last_at) as last_at,
       (array_agg(q.shards order by q.last_at desc nulls last, q.queue))[1] as shards,
       coalesce(bool_or(q.last_at >= %(since)s and q.shards = %(shards)s), false) as on_s
  from awa.runtime_overview as r
  join awa.runtime_queue_overview as q on q.instance_id = r.instance_id
 where q.queue = any(%(names)s)
 group by r.instance_id, r.kind, r.hostname, r.pid, r.version, r.in_flight, r.last_seen,
          r.started_at, q.activity
 order by r.kind, r.hostname, r.pid, r.instance_id, q.activity
"""

# The enqueues since one change of S, summed over the physical queues it
# changed (a change of a logical name writes a row for each, at one time).
CHANGE_EVIDENCE = """
select %(change)s::bigint as change_id, min(e.changed_at) as changed_at,
       max(e.shards) filter (where e.change_id = %(change)s) as shards,
       sum(e.enqueues_since)::bigint as enqueues_since, sum(e.below_s)::bigint as below_s,
       sum(e.at_or_above_s)::bigint as at_or_above_s,
       sum(e.on_new_lanes)::bigint as on_new_lanes
  from awa.shard_change_evidence as e
 where e.queue = any(%(names)s) and e.changed_at = %(since)s
"""


def runtimes(conn: psycopg.Connection, physical: list[dict]) -> dict | None:
    """Live runtimes serving a queue, on any of the ``physical`` queues its
    name covers (the queue's own row first): one line per runtime and
    activity. And the evidence that producers use S since the queue's last
    change: of the live producers of those queues, those that enqueued with
    that S since; from the lanes, the enqueues since the change over the
    queues it changed.

    None when the contract has no runtime snapshots.
    """
    if not _exists(conn, "awa.runtime_overview"):
        return None
    queue = physical[0]
    names = [p["queue"] for p in physical]
    with conn.cursor(row_factory=dict_row) as cur:
        # The queue's own last change, not one among the recent changes of
        # all its physical queues (one change of a logical queue writes a row
        # per partition and stripe): the newest row of the index on (queue,
        # changed_at), the later change_id first within one transaction.
        last = cur.execute(
            "select c.change_id, c.changed_at from awa.shard_changes as c"
            " where c.queue = %s order by c.changed_at desc, c.change_id desc limit 1",
            [queue["queue"]]).fetchone()
        since = last["changed_at"] if last else None
        live = cur.execute(RUNTIMES_OF_QUEUES, {
            "names": names, "since": since, "shards": queue["enqueue_shards"]}).fetchall()
        evidence = None
        if last is not None:
            evidence = cur.execute(CHANGE_EVIDENCE, {
                "change": last["change_id"], "names": names, "since": since}).fetchone()
            if evidence["shards"] is None:  # the change's own row gone meanwhile
                evidence = None
    on_s = [(r["activity"], r.pop("on_s")) for r in live]
    producers = [on for activity, on in on_s if activity == "enqueue"]
    return {
        "live": live,
        "producers": {
            "live": len(producers),
            "on_current_s": sum(producers) if since is not None else None,
            "shards": queue["enqueue_shards"],
            "since": since,
        },
        "lane_evidence": evidence,
    }


# -- jobs (ADR 025) ----------------------------------------------------------------------

# One bulk call takes at most this many jobs (the functions' default).
BULK_MAX_JOBS = 10_000
BULK_STATES = {"retry": ("failed",), "cancel": ("ready", "scheduled")}


def bulk_states(conn: psycopg.Connection, queue: str, action: str,
                state: str | None) -> tuple[str, ...]:
    """The states a bulk call takes: a cancel, ready and scheduled (it takes
    no state); a retry, ``state``, failed by default. A state a retry does
    not take is refused as awa.retry_jobs refuses it (400, its message: the
    tests compare the two answers), a state given to a cancel with 400 too;
    either after an unknown queue's 404, as in the functions."""
    if action == "cancel" and state is None:
        return BULK_STATES[action]
    if action == "retry" and (state is None or state in RETRY_STATES):
        return BULK_STATES[action] if state is None else (state,)
    require_queue(conn, queue)
    if action == "cancel":
        raise ApiError(400, f"state goes with a retry only (a cancel takes ready and "
                       f"scheduled jobs), got {state!r}", "22023")
    quoted = conn.execute("select pg_catalog.quote_literal(%s::text)", [state]).fetchone()[0]
    raise ApiError(400, f"state must be {' or '.join(RETRY_STATES)}, got {quoted}", "22023")


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def _job(row: dict) -> dict:
    out = dict(row)
    key = out.pop("ordering_key")
    out["ordering_key"] = _key_text(key)
    out["ordering_key_hex"] = None if key is None else key.hex()
    out["args"] = shown(out["args"])
    return out


def job(conn: psycopg.Connection, job_id: int, args: bool = True) -> dict:
    """One job (awa.job), or 404; its args null unless ``args``."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(f"select {_columns(args)} from awa.job(%s::bigint) as j",
                          [job_id]).fetchone()
    if row is None:
        raise ApiError(404, f"no job {job_id} (unknown, or removed by retention)")
    return _job(row)


# A brief job row (a list that refreshes): no args, the first characters of
# the last error, the kind and the worker. A producer sets the args and the
# kind, and a worker the error and its own name (what it passed to
# awa.claim), of any size and uncapped in the database (a 10 MB args, a
# 1 MB stack trace, a 100 MB worker name): a page of 20 such rows read every
# 3 s was 200 MB each time, longer to read than the refresh. Queue names
# (200 bytes) and ordering keys (1024) are capped where they are written.
BRIEF_ERROR_CHARS = 200
BRIEF_NAME_CHARS = 200


def _cut(column: str, chars: int | None) -> str:
    return (f"j.{column}" if chars is None
            else f"pg_catalog.left(j.{column}, {int(chars)}) as {column}")


def _columns(args: bool = True, error_chars: int | None = None,
             name_chars: int | None = None) -> str:
    """awa.job_info's columns (as ``j``), args null unless ``args``, the last
    error cut to ``error_chars``, the kind and the worker to ``name_chars``."""
    return (f"j.job_id, j.queue, j.logical_queue, {_cut('kind', name_chars)}, j.state,"
            f" j.priority, j.ordering_key, {'j.args' if args else 'null::jsonb as args'},"
            " j.attempt, j.max_attempts, j.enqueued_at, j.run_at, j.finished_at,"
            f" {_cut('last_error', error_chars)}, {_cut('worker', name_chars)},"
            " j.lease_expires_at")


def jobs_page(conn: psycopg.Connection, queue: str, state: str | None, kind: str | None,
              after_job_id: int | None, limit: int, worker: str | None = None,
              brief: bool = False) -> dict:
    """A page of the queue's jobs by job id (awa.jobs); 404 for an unknown queue. With a
    worker, its running jobs only (awa.jobs refuses another state: 400). ``brief``:
    without args, the last error cut to its first BRIEF_ERROR_CHARS characters,
    the kind and the worker to BRIEF_NAME_CHARS."""
    columns = _columns(False, BRIEF_ERROR_CHARS, BRIEF_NAME_CHARS) if brief else _columns()
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"select {columns}"
            " from awa.jobs(%s::text, %s::text, %s::text, %s::bigint, %s::integer"
            # Named, and only when given: a page without one works on a database
            # whose awa.jobs predates the argument.
            + (", worker => %s::text)" if worker is not None else ")") + " as j",
            [queue, state, kind, after_job_id, limit,
             *([worker] if worker is not None else [])]).fetchall()
    return {"queue": queue, "state": state, "kind": kind, "worker": worker, "brief": brief,
            "jobs": [_job(r) for r in rows],
            "next_after_job_id": rows[-1]["job_id"] if len(rows) == limit else None}


def failure_summary(conn: psycopg.Connection, queue: str | None, since_seconds: float | None,
                    limit: int) -> dict:
    """The failed jobs kept, grouped (awa.failure_summary, one more group than
    ``limit`` to tell whether more are left); 404 for an unknown queue, 400 for
    an age out of range."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "select * from awa.failure_summary(%s::text,"
            " make_interval(secs => %s::double precision), %s::integer)",
            [queue, since_seconds, limit + 1]).fetchall()
    return {"queue": queue, "since_seconds": since_seconds, "groups": rows[:limit],
            "more": len(rows) > limit}


def bulk_plan(conn: psycopg.Connection, queue: str, action: str, kind: str | None,
              state: str | None = None, max_jobs: int = BULK_MAX_JOBS) -> dict:
    """How many jobs a bulk retry (of ``state``, failed by default) or cancel
    would take, counted (awa.count_jobs) up to one more than a call takes,
    and the question to confirm it with. ``before``, the bound the call takes
    back, is read_bound's, counted in its snapshot (as ``awa jobs
    retry/cancel`` does: count_in_bound). ``conn`` must be idle."""
    with conn.transaction():
        states = bulk_states(conn, queue, action, state)
    before, counts = count_in_bound(conn, queue, states, kind, max_jobs + 1)
    total = sum(counts.values())
    jobs = min(total, max_jobs)
    more = total > max_jobs
    what = " and ".join(f"{n:,} {state}" for state, n in counts.items() if n)
    of_kind = f" of kind {kind!r}" if kind else ""
    verb = action.capitalize()
    if total == 0:
        question = f"No {' or '.join(states)} jobs{of_kind} in {queue}."
    elif more:
        question = (f"{verb} {jobs:,} of more than {max_jobs:,} "
                    f"{' and '.join(states)} jobs{of_kind} of {queue}? One call "
                    f"takes {max_jobs:,}; repeat it for the rest.")
    else:
        question = f"{verb} {what} job{'s' if total > 1 else ''}{of_kind} of {queue}?"
    return {"queue": queue, "action": action, "kind": kind,
            "state": states[0] if action == "retry" else None, "counts": counts, "jobs": jobs,
            "more": more, "max_jobs": max_jobs, "question": question, "before": before}
