"""Request bodies and response shapes: they make the OpenAPI schema."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from annotated_types import Interval
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
)

from awa_sql.routing import MAX_SHARDS

# The database checks ranges (and says so in its message, returned with 400);
# the bodies only check types, so that a value of the right type always
# reaches the one place that decides what is allowed.


def _whole_number(value: object) -> object:
    """A JSON integer: 4 and 4.0 (JSON Schema's own rule), never "4", 4.5 or true."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


Int32 = Annotated[int, Interval(ge=-(2**31), le=2**31 - 1), BeforeValidator(_whole_number)]

NUL_MESSAGE = "must not contain a NUL byte (0x00): PostgreSQL text cannot hold one"


def _no_nul(value: str) -> str:
    """Text PostgreSQL can hold: psycopg refuses a NUL byte before sending it,
    with an error that has no SQLSTATE."""
    if "\x00" in value:
        raise ValueError(NUL_MESSAGE)
    return value


Text = Annotated[str, AfterValidator(_no_nul)]


def _time_text(value: object) -> object:
    """A JSON string only: lax pydantic reads a number as seconds since 1970."""
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 date-time string with an offset, "
                         "as the plan's before")
    return value


# An offset is required: a time without one would be read in the login's
# TimeZone, another instant than the one the plan returned.
Instant = Annotated[AwareDatetime, BeforeValidator(_time_text)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShardsBody(Body):
    shards: Int32 = Field(description=f"the new S, 1..{MAX_SHARDS}", examples=[4])


class ShardMode(StrEnum):
    manual = "manual"
    shadow = "shadow"
    auto = "auto"


class ShardModeBody(Body):
    mode: ShardMode
    max_shards: Int32 | None = Field(
        default=None, description=f"the auto-scaler's ceiling, 1..{MAX_SHARDS}; null keeps none")


class Error(BaseModel):
    error: str
    sqlstate: str | None = None
    hint: str | None = None


class QueueSummary(BaseModel):
    queue: str
    logical_queue: str
    enqueue_shards: int
    shard_mode: str
    max_shards: int | None
    paused: bool
    stripes: int
    partitions: int
    ready: int
    running: int
    scheduled: int = Field(description="counted up to 10,000 a physical queue")
    scheduled_at_cap: bool = Field(
        description="a physical queue's count of scheduled jobs reached 10,000: at least "
                    "that many")
    failed: int
    completed: int
    oldest_ready_age_seconds: float | None = Field(
        description="lag: age of the oldest ready job")


class Lane(BaseModel):
    queue: str
    priority: int
    shard: int
    lane_id: int
    ready: int
    lag_seconds: float | None
    next_seq: int
    claim_position: int | None
    draining: bool = Field(description="shard >= S with ready jobs left")
    above_s: bool = Field(description="shard >= S: new enqueues no longer land here")
    walked: bool = Field(description="claims still visit the lane; false once "
                                     "awa.retire_lanes() has taken it out of their walk")


class Contention(BaseModel):
    queue: str
    samples: int
    mean_waiters_per_held_lane: float | None
    wait_share: float | None
    enqueue_rate: float | None
    last_sample: datetime | None


class ShardChangeRow(BaseModel):
    change_id: int
    queue: str
    old_shards: int
    new_shards: int
    lanes_created: int
    changed_by: str
    changed_at: datetime
    source: str


class Decision(BaseModel):
    decision_id: int
    queue: str
    decided_at: datetime
    mode: str
    samples: int | None
    mean_waiters: float | None
    wait_share: float | None
    enqueue_rate: float | None
    current_shards: int | None
    proposed_shards: int | None
    action: str
    reason: str | None
    repeats: int = Field(1, description="ticks folded into this row (a run of identical holds)")
    last_decided_at: datetime | None = Field(
        None, description="the latest tick of the run; decided_at is the first")


class HistoryPoint(BaseModel):
    at: datetime
    shards: int = Field(description="S at the sample")
    enqueue_rate: float | None = Field(
        description="enqueues per second since the tick's sample before (null in a sample "
                    "taken alone)")
    waiters_per_held_lane: float
    lanes_held: int
    ready: int | None = Field(description="ready jobs; counted for shadow and auto queues only")
    lag_seconds: float | None = Field(description="age of the oldest ready job")


class HistoryChange(BaseModel):
    at: datetime
    old_shards: int
    new_shards: int
    source: str | None


class QueueHistory(BaseModel):
    queue: str
    since: datetime
    until: datetime
    shard_mode: str
    max_shards: int | None
    points: list[HistoryPoint]
    changes: list[HistoryChange]


class RuntimeRow(BaseModel):
    instance_id: str
    kind: str
    hostname: str
    pid: int
    version: str
    in_flight: int
    last_seen: datetime
    started_at: datetime
    queue: str = Field(description="the physical queue of its latest activity of this kind: "
                       "the queue's own, or one of its partitions or stripes")
    queues: int = Field(description="how many of the queue's physical queues it did this on")
    activity: str
    last_at: datetime | None
    shards: int | None = Field(description="S of the queue at this runtime's last "
                               "enqueue (producer), claim or poll (worker)")


class ProducerCount(BaseModel):
    live: int
    on_current_s: int | None = Field(
        description="live producers that enqueued with S to one of the queue's physical "
        "queues since its last change")
    shards: int
    since: datetime | None


class LaneEvidence(BaseModel):
    change_id: int
    changed_at: datetime
    shards: int
    enqueues_since: int
    below_s: int
    at_or_above_s: int
    on_new_lanes: int


class Runtimes(BaseModel):
    live: list[RuntimeRow]
    producers: ProducerCount
    lane_evidence: LaneEvidence | None


class QueueDetail(QueueSummary):
    physical_queues: list[QueueSummary]
    lanes: list[Lane]
    contention: list[Contention]
    shard_changes: list[ShardChangeRow]
    decisions: list[Decision] | None = Field(
        description="the auto-scaler's recent decisions; null when the database has none")
    runtimes: Runtimes | None = Field(
        description="live runtimes; null when the database keeps no runtime snapshots")


class ShardChange(BaseModel):
    physical_queue: str
    old_shards: int
    new_shards: int
    lanes_created: int


class ShardPlan(BaseModel):
    queue: str
    old_shards: int
    new_shards: int
    lanes_created: int
    consequence: str


class ShardResult(BaseModel):
    queue: str
    changes: list[ShardChange]
    consequence: str


class ShardModeRow(BaseModel):
    queue: str
    shard_mode: str
    max_shards: int | None


class ShardModeResult(BaseModel):
    queue: str
    queues: list[ShardModeRow]


class PauseResult(BaseModel):
    queue: str
    paused: bool
    changed: bool


class ServerInfo(BaseModel):
    version: str
    writable: bool
    in_recovery: bool


# -- jobs (awa.job, awa.jobs, retry and cancel; ADR 025) ---------------------------------


class JobState(StrEnum):
    scheduled = "scheduled"
    ready = "ready"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class Job(BaseModel):
    job_id: int
    queue: str = Field(description="the physical queue (a partition or stripe, or the queue)")
    logical_queue: str = Field(description="the name the job was enqueued to")
    kind: str
    state: str = Field(description="scheduled, ready, running, completed, failed, cancelled")
    priority: int
    ordering_key: str | None = Field(
        description="the ordering key as text, when it is printable UTF-8")
    ordering_key_hex: str | None = Field(description="the ordering key's bytes, in hex")
    args: Any = Field(None, description="the job's args; null for a completed job; "
                      '{"undecodable": "<why>"} for args the JSON decoder refuses (an '
                      "integer of over 4300 digits, nesting thousands deep)")
    attempt: int = Field(description="attempts made (a running job's current one counts)")
    max_attempts: int
    enqueued_at: datetime
    run_at: datetime | None = Field(
        description="when a scheduled job is due, a ready one became ready, a running one "
                    "was claimed")
    finished_at: datetime | None
    last_error: str | None
    worker: str | None
    lease_expires_at: datetime | None


class JobPage(BaseModel):
    queue: str
    state: str | None
    kind: str | None
    worker: str | None = Field(default=None, description="the worker asked for, if any")
    brief: bool = Field(default=False, description="brief rows: args null, last_error cut")
    jobs: list[Job]
    next_after_job_id: int | None = Field(
        description="pass as after_job_id for the next page; null on the last page")


class FailureGroup(BaseModel):
    logical_queue: str
    kind: str
    error: str | None = Field(
        description="the error class: the first line of the last error, cut to 200 characters")
    failed: int = Field(description="jobs that failed for good and are still kept")
    first_failed_at: datetime
    last_failed_at: datetime
    sample_job_id: int = Field(description="the group's last failure")
    sample_error: str | None = Field(description="that job's whole last error")


class FailureSummary(BaseModel):
    queue: str | None = Field(description="the queue asked for; null: every queue")
    since_seconds: float | None
    groups: list[FailureGroup] = Field(description="most failures first, then the latest")
    more: bool = Field(description="more groups than limit: narrow the queue or the age")


class BulkBody(Body):
    kind: Text | None = Field(default=None, description="only jobs of this kind")
    state: Text | None = Field(
        default=None, description="retry only: the jobs of this state, failed (default) or "
        "cancelled; a cancel takes none", examples=["cancelled"])
    max_jobs: Int32 | None = Field(
        default=None, description="at most this many in this call, 1..100000 (default 10000)")
    before: Instant | None = Field(
        default=None, description="the plan's before: a retry takes only jobs that finished "
        "before it, a cancel only jobs first enqueued before it (RFC 3339 with an offset); "
        "none: any", examples=["2025-01-31T12:00:00.123456Z"])


# The state a bulk retry takes, echoed by its plan and its result: the one
# asked for, failed by default; null for a cancel (ready and scheduled).
BULK_STATE = "the state a retry takes (failed, the default, or cancelled); null for a cancel"


class BulkPlan(BaseModel):
    queue: str
    action: str = Field(description="retry or cancel")
    kind: str | None
    state: str | None = Field(description=BULK_STATE)
    counts: dict[str, int] = Field(
        description="jobs per state the call would take (retry: failed, or the state "
                    "asked for; cancel: ready and scheduled), each counted up to max_jobs + 1")
    jobs: int = Field(description="how many jobs one call takes: at most max_jobs")
    more: bool = Field(description="more jobs than one call takes")
    max_jobs: int
    question: str = Field(description="the confirmation to show, with the number of jobs")
    before: datetime = Field(
        description="the server's clock as the jobs were counted: sent back with the call, "
                    "it takes only jobs that were in the count's states before it (a retry: "
                    "finished before it; a cancel: first enqueued before it)")


class BulkResult(BaseModel):
    queue: str
    action: str
    kind: str | None
    state: str | None = Field(description=BULK_STATE)
    jobs: int = Field(description="how many jobs the call retried or cancelled")


class JobChange(BaseModel):
    job_id: int
    action: str
    state: str | None = Field(description="the job's state after the change")


class WorkerRelease(BaseModel):
    worker: str = Field(description="the worker name asked for")
    released: int = Field(description="running jobs whose lease this call ended; 0 for a "
                                      "worker that runs none")


# -- whole queues: drops (ADR 044) and the queue limit (ADR 039) ----------------------------


class DropBody(Body):
    # A JSON true or false only: lax pydantic reads "yes", "on" and 1 as true,
    # and this one deletes jobs.
    discard_finished: StrictBool = Field(
        default=False, description="delete the queue's kept terminal jobs (completed, failed, "
        "cancelled) and the unique keys their windows hold, with the drop")


class QueueCounts(BaseModel):
    ready: int
    running: int
    scheduled: int
    completed_kept: int
    failed_kept: int
    cancelled_kept: int


class DropPlan(BaseModel):
    queue: str
    discard_finished: bool
    counts: QueueCounts = Field(description="the queue's exact job counts (awa.queue_counts)")
    kept: int = Field(description="its kept terminal jobs: a drop without discard_finished "
                                  "refuses a queue that has any")
    question: str = Field(description="the confirmation to show")


class DropResult(BaseModel):
    queue: str
    dropped: bool
    discard_finished: bool


class QueueLimit(BaseModel):
    max_queues: int = Field(description="the most physical queues that may exist")
    queues: int = Field(description="the physical queues that count under it now")


class QueueLimitBody(Body):
    max_queues: Int32 = Field(description="the new limit, 1..1000000", examples=[20000])


class QueueLimitResult(QueueLimit):
    previous: int = Field(description="the limit this call replaced")


# -- live runtimes and maintenance runs -----------------------------------------------------


class RuntimeQueue(BaseModel):
    queue: str = Field(description="the physical queue")
    activity: str = Field(description="enqueue (a producer), claim (a worker got a job) or "
                          "poll (a worker's claim call, with or without a job)")
    last_at: datetime | None
    shards: int | None = Field(description="S of the queue at that moment")
    age_seconds: float | None = Field(description="how long ago, by the database's clock")


class LiveRuntime(BaseModel):
    instance_id: str
    kind: str = Field(description="producer or worker")
    hostname: str
    pid: int
    version: str
    in_flight: int
    started_at: datetime
    last_seen: datetime
    last_seen_age_seconds: float
    queues: list[RuntimeQueue]


class LiveRuntimes(BaseModel):
    queue: str | None = Field(description="the queue asked for; null: every runtime")
    runtimes: list[LiveRuntime]


class MaintenanceRun(BaseModel):
    name: str = Field(description="the task, as awa maintain names its pass")
    function: str | None = Field(description="the call it makes; null for a task this "
                                             "package does not know")
    default_every_seconds: float | None = Field(description="awa maintain's default cadence")
    last_at: datetime | None = Field(description="its last run that committed, whoever ran "
                                                 "it, within about 5 s")
    age_seconds: float | None


class MaintenanceRuns(BaseModel):
    tasks: list[MaintenanceRun]
