"""The JSON API under /api."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated
from urllib.parse import quote

import psycopg
from fastapi import APIRouter, Depends, Path, Query, Request

from awa_sql import queues as queue_calls
from awa_sql.admin import queries
from awa_sql.admin.errors import ApiError
from awa_sql.admin.guard import require_write
from awa_sql.admin.models import (
    NUL_MESSAGE,
    BulkBody,
    BulkPlan,
    BulkResult,
    DropBody,
    DropPlan,
    DropResult,
    Error,
    FailureSummary,
    Job,
    JobChange,
    JobPage,
    JobState,
    LiveRuntimes,
    MaintenanceRuns,
    PauseResult,
    QueueDetail,
    QueueHistory,
    QueueLimit,
    QueueLimitBody,
    QueueLimitResult,
    QueueSummary,
    ServerInfo,
    ShardModeBody,
    ShardModeResult,
    ShardPlan,
    ShardResult,
    ShardsBody,
    WorkerRelease,
)
from awa_sql.bulk_bound import BOUND_ARGUMENT
from awa_sql.defaults import JOB_TOOL_LOCK_TIMEOUT, RETRY_REFUSED
from awa_sql.maintain import last_runs
from awa_sql.routing import MAX_SHARDS
from awa_sql.runtimes import live
from awa_sql.shards import (
    ordering_consequence,
    plan_enqueue_shards,
    set_enqueue_shards,
    set_shard_modes,
)
from awa_sql.version import __version__


def refuse_nul(request: Request) -> None:
    """400 for a NUL byte in a path or query value (a queue name, a kind):
    PostgreSQL text cannot hold one, and psycopg refuses to send it with an
    error that has no SQLSTATE. Request bodies refuse it in their models."""
    for name, value in [*request.path_params.items(), *request.query_params.multi_items()]:
        if isinstance(value, str) and "\x00" in value:
            raise ApiError(400, f"{name}: {NUL_MESSAGE}", "22021")


# Answered by the app's RefuseCrossSite, before any route.
CROSS_SITE = "a request another page in the browser made (Sec-Fetch-Site, Origin)"
router = APIRouter(prefix="/api", dependencies=[Depends(refuse_nul)],
                   responses={403: {"model": Error, "description": CROSS_SITE}})
QueueName = Annotated[str, Path(description="a queue name (logical or physical)")]
NOT_FOUND = {404: {"model": Error, "description": "unknown queue"}}
WRITE = {
    **NOT_FOUND,
    400: {"model": Error, "description": "a value the database refuses (SQLSTATE 22xxx)"},
    403: {"model": Error, "description": "not --writable, or no or a wrong bearer token, "
                                         f"or {CROSS_SITE}"},
    503: {"model": Error, "description": "the database is a read-only standby"},
}


def _pool(request: Request):
    return request.app.state.pool


@router.get("/server", response_model=ServerInfo)
def server(request: Request) -> dict:
    with _pool(request).connection() as conn:
        recovery = conn.execute("select pg_catalog.pg_is_in_recovery()").fetchone()[0]
    return {"version": __version__, "writable": request.app.state.settings.writable,
            "in_recovery": recovery}


@router.get("/queues", response_model=list[QueueSummary])
def list_queues(request: Request) -> list[dict]:
    with _pool(request).connection() as conn, conn.transaction():
        return queries.list_queues(conn)


@router.get("/queues/{queue:path}/enqueue-shards/plan", response_model=ShardPlan,
            responses={**NOT_FOUND, 400: WRITE[400]})
def plan_shards(request: Request, queue: QueueName,
                shards: Annotated[int, Query(ge=-(2**31), le=2**31 - 1,
                                             description=f"the new S, 1..{MAX_SHARDS}")]
                ) -> dict:
    """What a change of S would do and what it means for ordering; changes nothing.
    An S out of range is refused as the change refuses it: 400, the same message."""
    with _pool(request).connection() as conn, conn.transaction():
        queries.require_queue(conn, queue)
        if not 1 <= shards <= MAX_SHARDS:
            # awa.set_enqueue_shards's message (awa._check_range, which only
            # the owner may call); the tests compare the two answers.
            raise ApiError(400, f"enqueue shards must be between 1 and {MAX_SHARDS}, "
                           f"got {shards}", "22023")
        plan = plan_enqueue_shards(conn, queue, shards)
    old = next((p.old_shards for p in plan if p.physical_queue == queue), plan[0].old_shards)
    return {"queue": queue, "old_shards": old, "new_shards": shards,
            "lanes_created": sum(p.lanes_created for p in plan),
            "consequence": ordering_consequence(queue, old, shards)}


@router.get("/queues/{queue:path}/history", response_model=QueueHistory,
            responses={**NOT_FOUND, 501: {"model": Error,
                                          "description": "the database keeps no history"}})
def queue_history(request: Request, queue: QueueName,
                  minutes: Annotated[int, Query(ge=1, le=60)] = 60) -> dict:
    """The queue over the last ``minutes`` (at most the hour of contention
    samples the database keeps): S, enqueues/s, waiters per held lane, ready
    depth and lag per sample, and the changes of S."""
    with _pool(request).connection() as conn, conn.transaction():
        found = queries.history(conn, queue, timedelta(minutes=minutes))
    if found is None:
        raise ApiError(501, "this database keeps no queue history (awa.queue_history); "
                       "run awa migrate", "42P01")
    return found


# -- jobs (awa.jobs, awa.count_jobs; ADR 025) ----------------------------------------------

JOBS_READ = {
    **NOT_FOUND,
    400: {"model": Error, "description": "a name or value the database refuses (SQLSTATE "
                                         "22xxx)"},
}
BulkAction = Annotated[str, Path(pattern="^(retry|cancel)$",
                                 description="retry (failed jobs, or cancelled ones with "
                                             "state) or cancel (ready and scheduled jobs)")]


@router.get("/queues/{queue:path}/jobs/{action}/plan", response_model=BulkPlan,
            responses=JOBS_READ)
def bulk_plan(request: Request, queue: QueueName, action: BulkAction,
              kind: Annotated[str | None, Query(description="only jobs of this kind")] = None,
              state: Annotated[str | None, Query(
                  description="retry only: the jobs of this state, failed (default) or "
                  "cancelled; another is 400, as the retry refuses it")] = None
              ) -> dict:
    """How many jobs a bulk retry or cancel would take, and the question that
    confirms it; changes nothing."""
    with _pool(request).connection() as conn:  # bulk_plan's transactions are its own
        return queries.bulk_plan(conn, queue, action, kind, state)


@router.get("/queues/{queue:path}/jobs", response_model=JobPage, responses=JOBS_READ)
def list_jobs(request: Request, queue: QueueName,
              state: Annotated[JobState | None, Query(description="only this state")] = None,
              kind: Annotated[str | None, Query(description="only this kind")] = None,
              after_job_id: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 50,
              worker: Annotated[str | None, Query(
                  description="only the running jobs this worker holds (the name it gave "
                  "awa.claim); implies state=running, another state is 400")] = None,
              brief: Annotated[bool, Query(
                  description="rows for a list that refreshes: args null, last_error cut "
                  f"to its first {queries.BRIEF_ERROR_CHARS} characters, kind and worker to "
                  f"their first {queries.BRIEF_NAME_CHARS} (GET /api/jobs/{{id}} has the "
                  "whole job)")] = False
              ) -> dict:
    """A page of the queue's jobs in job id order (awa.jobs): page on with
    ``next_after_job_id``. Every job is listed, ready ones included."""
    with _pool(request).connection() as conn, conn.transaction():
        return queries.jobs_page(conn, queue, state.value if state else None, kind,
                                 after_job_id, limit, worker, brief)


@router.get("/queues/{queue:path}/drop/plan", response_model=DropPlan, responses=JOBS_READ)
def drop_plan(request: Request, queue: QueueName,
              discard_finished: Annotated[bool, Query(
                  description="as the drop would take it: the question names the kept "
                  "terminal jobs it deletes")] = False) -> dict:
    """What a drop of the queue meets: its exact job counts (reads every row:
    on demand, not on a refresh) and the question that confirms it; changes
    nothing. The drop decides whether the queue may go (409 naming what it
    holds)."""
    with _pool(request).connection() as conn, conn.transaction():
        return queue_calls.plan_drop(conn, queue, discard_finished)


# Queue names may hold "/": every route takes the rest of the path as the
# name ({queue:path}), so this catch-all comes after the GET routes that end
# in a fixed suffix.
@router.get("/queues/{queue:path}", response_model=QueueDetail, responses=NOT_FOUND)
def queue_detail(request: Request, queue: QueueName) -> dict:
    with _pool(request).connection() as conn, conn.transaction():
        return queries.queue_detail(conn, queue)


@router.put("/queues/{queue:path}/enqueue-shards", response_model=ShardResult,
            dependencies=[Depends(require_write)], responses=WRITE)
def put_shards(request: Request, queue: QueueName, body: ShardsBody) -> dict:
    with _pool(request).connection() as conn, conn.transaction():
        queries.require_queue(conn, queue)
        changes = set_enqueue_shards(conn, queue, body.shards)
    old = next((c.old_shards for c in changes if c.physical_queue == queue),
               changes[0].old_shards if changes else body.shards)
    return {"queue": queue, "changes": [c.__dict__ for c in changes],
            "consequence": ordering_consequence(queue, old, body.shards)}


@router.put("/queues/{queue:path}/shard-mode", response_model=ShardModeResult,
            dependencies=[Depends(require_write)],
            responses={**WRITE, 501: {"model": Error,
                                      "description": "the database has no auto-scaler"}})
def put_shard_mode(request: Request, queue: QueueName, body: ShardModeBody) -> dict:
    with _pool(request).connection() as conn, conn.transaction():
        queries.require_queue(conn, queue)
        if not queries.has_function(conn, "awa.set_shard_mode(text, text, integer)"):
            raise ApiError(501, "this database has no auto-scaler (awa.set_shard_mode); "
                           "run awa migrate", "42883")
        rows = set_shard_modes(conn, queue, body.mode.value, body.max_shards)
    return {"queue": queue, "queues": [
        {"queue": q, "shard_mode": m, "max_shards": x} for q, m, x in rows]}


def _set_paused(request: Request, queue: str, paused: bool) -> dict:
    function = "awa.pause_queue" if paused else "awa.resume_queue"
    with _pool(request).connection() as conn, conn.transaction():
        changed = conn.execute(f"select {function}(%s::text)", [queue]).fetchone()[0]
    return {"queue": queue, "paused": paused, "changed": changed}


@router.post("/queues/{queue:path}/pause", response_model=PauseResult,
             dependencies=[Depends(require_write)], responses=WRITE)
def pause(request: Request, queue: QueueName) -> dict:
    return _set_paused(request, queue, True)


@router.post("/queues/{queue:path}/resume", response_model=PauseResult,
             dependencies=[Depends(require_write)], responses=WRITE)
def resume(request: Request, queue: QueueName) -> dict:
    return _set_paused(request, queue, False)


DROP_REFUSED = {409: {"model": Error, "description": "the queue is not empty (55006, naming "
                                                   "what it holds), or is a partition or "
                                                   "stripe or has them (0A000); nothing "
                                                   "changed"}}


@router.post("/queues/{queue:path}/drop", response_model=DropResult,
             dependencies=[Depends(require_write)], responses={**WRITE, **DROP_REFUSED})
def drop_queue(request: Request, queue: QueueName, body: DropBody | None = None) -> dict:
    """``awa.drop_queue`` (ADR 044): an empty queue's name is free at once,
    and ``awa maintain``'s drops pass removes the queue once no session can
    still enqueue to it by that name. ``discard_finished`` deletes its kept
    terminal jobs with the drop; without it a queue that keeps any is 409."""
    body = body or DropBody()
    with _pool(request).connection() as conn, conn.transaction():
        try:
            queue_calls.drop(conn, queue, body.discard_finished)
        except psycopg.Error as error:
            if error.sqlstate != "55006":
                raise
            # The server's hint is spelled for SQL (discard_finished => true).
            cancel = f"POST /api/queues/{quote(queue, safe='')}/jobs/cancel"
            raise ApiError(409, error.diag.message_primary, error.sqlstate, (
                f"Let its jobs finish, or cancel its ready and scheduled ones ({cancel}); "
                'the body {"discard_finished": true} deletes its kept terminal jobs with '
                "the drop.")) from None
    return {"queue": queue, "dropped": True, "discard_finished": body.discard_finished}


@router.post("/queues/{queue:path}/jobs/{action}", response_model=BulkResult,
             dependencies=[Depends(require_write)], responses=WRITE)
def bulk_change(request: Request, queue: QueueName, action: BulkAction,
                body: BulkBody | None = None) -> dict:
    """``awa.retry_jobs`` (failed jobs, or those of ``state``: failed or
    cancelled) or ``awa.cancel_jobs`` (ready and scheduled ones): one call, at
    most ``max_jobs`` (default 10,000); with the plan's ``before``, only the
    jobs the plan could count (finished, or first enqueued, before it)."""
    body = body or BulkBody()
    max_jobs = queries.BULK_MAX_JOBS if body.max_jobs is None else body.max_jobs
    state = None
    # Named, and only when given: a call without it works on a database whose
    # functions predate the bound.
    bound = [] if body.before is None else [body.before]
    with _pool(request).connection() as conn, conn.transaction():
        conn.execute(f"set local lock_timeout = '{JOB_TOOL_LOCK_TIMEOUT}'")
        if action == "retry":
            # awa.retry_jobs decides which states it takes (400 for another).
            state = "failed" if body.state is None else body.state
            changed = conn.execute(
                "select awa.retry_jobs(%s::text, %s::text, %s::integer, %s::text"
                + (f", {BOUND_ARGUMENT[action]} => %s::timestamptz)" if bound else ")"),
                [queue, body.kind, max_jobs, state, *bound]).fetchone()[0]
        else:
            queries.bulk_states(conn, queue, action, body.state)  # a cancel takes none
            changed = conn.execute(
                "select awa.cancel_jobs(%s::text, %s::text, %s::integer"
                + (f", {BOUND_ARGUMENT[action]} => %s::timestamptz)" if bound else ")"),
                [queue, body.kind, max_jobs, *bound]).fetchone()[0]
    return {"queue": queue, "action": action, "kind": body.kind, "state": state,
            "jobs": changed}


JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="a job id")]
JOB_NOT_FOUND = {404: {"model": Error, "description": "no such job (or removed by retention)"}}
JOB_WRITE = {
    **WRITE,
    **JOB_NOT_FOUND,
    409: {"model": Error, "description": "the job is in a state this does not apply to, or "
                                         "was being claimed for longer than 5 s"},
}
APPLIES_TO = {"retry": ("failed or cancelled", "retried"),
              "cancel": ("scheduled, ready or running", "cancelled")}


# awa.failure_summary takes an age of 0 to 10 years (its message says so); an
# age past this is beyond what an interval holds, refused here in its words.
TEN_YEARS_SECONDS = 315_576_000
MAX_AGE_SECONDS = 1e12


@router.get("/failures", response_model=FailureSummary,
            responses={**NOT_FOUND, 400: {"model": Error, "description": "an age out of range"}})
def failures(request: Request,
             queue: Annotated[str | None, Query(
                 description="one queue (a logical name covers its partitions); "
                 "none: every queue")] = None,
             since_seconds: Annotated[float | None, Query(
                 ge=0, description="only the failures of that many seconds back; "
                 "none: every failed job kept")] = None,
             limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict:
    """What is failing, where, since when (awa.failure_summary): the jobs that
    failed for good and are kept, by queue, kind and error class. Reads every
    failed job kept of the queues asked for: for an incident, not a refresh."""
    if since_seconds is not None and not since_seconds <= MAX_AGE_SECONDS:
        # More than an interval holds: make_interval would refuse it ("value
        # out of range: overflow") before awa.failure_summary says its range.
        raise ApiError(400, f"since_seconds must be between 0 and 10 years "
                       f"({TEN_YEARS_SECONDS} seconds), got {since_seconds:g}", "22023")
    with _pool(request).connection() as conn, conn.transaction():
        return queries.failure_summary(conn, queue, since_seconds, limit)


@router.get("/jobs/{job_id}", response_model=Job, responses=JOB_NOT_FOUND)
def get_job(request: Request, job_id: JobId,
            args: Annotated[bool, Query(
                description="false: args null, for a page that refreshes and has read "
                "them (a job's args change only with its state)")] = True) -> dict:
    """One job (awa.job): state, args, attempts, last error, times."""
    with _pool(request).connection() as conn, conn.transaction():
        return queries.job(conn, job_id, args)


def _change_job(request: Request, job_id: int, action: str) -> dict:
    with _pool(request).connection() as conn, conn.transaction():
        conn.execute(f"set local lock_timeout = '{JOB_TOOL_LOCK_TIMEOUT}'")
        changed = conn.execute(f"select awa.{action}_job(%s::bigint)", [job_id]).fetchone()[0]
        found = queries.job(conn, job_id)  # 404 for an unknown job
        if not changed:
            if action == "retry" and found["state"] in ("failed", "cancelled"):
                raise ApiError(409, f"job {job_id} is {found['state']} but was not retried: "
                               f"{RETRY_REFUSED}; nothing changed")
            states, done = APPLIES_TO[action]
            raise ApiError(409, f"job {job_id} is {found['state']}: only {states} jobs can be "
                           f"{done}; nothing changed")
    return {"job_id": job_id, "action": action, "state": found["state"]}


@router.post("/jobs/{job_id}/retry", response_model=JobChange,
             dependencies=[Depends(require_write)], responses=JOB_WRITE)
def retry_job(request: Request, job_id: JobId) -> dict:
    """``awa.retry_job``: a failed or cancelled job runs again now."""
    return _change_job(request, job_id, "retry")


@router.post("/jobs/{job_id}/cancel", response_model=JobChange,
             dependencies=[Depends(require_write)], responses=JOB_WRITE)
def cancel_job(request: Request, job_id: JobId) -> dict:
    """``awa.cancel_job``: a scheduled, ready or running job ends cancelled."""
    return _change_job(request, job_id, "cancel")


WorkerName = Annotated[str, Path(description="the name the worker gave awa.claim (a running "
                                             "job's worker)")]


@router.post("/workers/{worker:path}/release", response_model=WorkerRelease,
             dependencies=[Depends(require_write)],
             responses={**{k: v for k, v in WRITE.items() if k != 404},
                        409: {"model": Error, "description": "a row the worker's call held "
                                                            "for over 5 s (55P03); try again"}})
def release_worker(request: Request, worker: WorkerName) -> dict:
    """``awa.release_worker``: for a worker known dead, the leases of every
    job it runs (in any queue) end now, and the next rescue pass of ``awa
    maintain`` sends them back to retry, the attempt counted. A worker alive
    after all keeps a job it heartbeats before that pass."""
    with _pool(request).connection() as conn, conn.transaction():
        released = conn.execute("select awa.release_worker(%s::text)", [worker]).fetchone()[0]
    return {"worker": worker, "released": released}


# -- the queue limit (ADR 039), live runtimes, maintenance runs (ADR 045) -------------------


@router.get("/queue-limit", response_model=QueueLimit)
def get_queue_limit(request: Request) -> dict:
    """The most physical queues that may exist (``awa.queue_limit``) and how
    many count under it now."""
    with _pool(request).connection() as conn, conn.transaction():
        return queue_calls.queue_limit(conn)


@router.put("/queue-limit", response_model=QueueLimitResult,
            dependencies=[Depends(require_write)],
            responses={k: v for k, v in WRITE.items() if k != 404})
def put_queue_limit(request: Request, body: QueueLimitBody) -> dict:
    """``awa.set_max_queues``: a limit out of its range is 400 with its
    message; a limit below the count removes nothing."""
    with _pool(request).connection() as conn, conn.transaction():
        return queue_calls.set_queue_limit(conn, body.max_queues)


@router.get("/runtimes", response_model=LiveRuntimes, responses=JOBS_READ)
def runtimes(request: Request,
             queue: Annotated[str | None, Query(
                 description="only the runtimes that enqueued to or claimed from this queue "
                 "(a logical name covers its partitions and stripes), with only its "
                 "queues")] = None) -> dict:
    """The Python producers and workers that published a snapshot in the last
    30 seconds, each with the queues it works on."""
    with _pool(request).connection() as conn, conn.transaction():
        return {"queue": queue, "runtimes": live(conn, queue)}


@router.get("/maintenance-runs", response_model=MaintenanceRuns,
            responses={501: {"model": Error,
                             "description": "the database records no maintenance runs"}})
def maintenance_runs(request: Request) -> dict:
    """When each maintenance task last ran and committed, whoever ran it
    (``awa.maintenance_runs``)."""
    with _pool(request).connection() as conn, conn.transaction():
        runs = last_runs(conn)
    if runs is None:
        raise ApiError(501, "this database records no maintenance runs "
                       "(awa.maintenance_runs, migration 0034); run awa migrate", "42P01")
    return {"tasks": runs}
