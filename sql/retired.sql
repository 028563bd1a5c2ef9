-- retired.sql: functions earlier versions defined and this one does not.
--
-- Applied in the function layer's transaction right after private.sql (the
-- grant helpers), before the files that define the other functions, so an
-- upgrade drops each one in the same commit that replaces its callers: no
-- moment exists in which a current function calls a dropped one, or an old
-- one a missing one. A function whose arguments or result change is dropped
-- here too (CREATE OR REPLACE cannot change them). Add a line when a
-- function goes; the line may stay: DROP ... IF EXISTS costs nothing on a
-- fresh install.

-- Unreleased (CHANGELOG.md): the row check takes the queue too
-- (sql/queues.sql); awa.enqueue routes and schedules in its own frame;
-- awa._lock_lanes returns each row's lane instead of the groups.
drop function if exists awa._check_job(text, smallint, integer);
drop function if exists awa._enqueue_slow(
    text, text, jsonb, smallint, bytea, timestamptz, integer
);
drop function if exists awa._lock_lanes(integer[], smallint[], smallint[]);
-- Unreleased: awa._claim_merged looks up its lanes itself (ADR 019).
drop function if exists awa._claim_merged(
    integer[], bigint[], smallint[], smallint[], text[], integer, text, interval
);
-- Unreleased: one claim path walks the lanes from a random start (ADR 023);
-- the merge is gone.
drop function if exists awa._claim_merged(text[], integer, text, interval);
-- Unreleased: a job may carry its own max run time (ADR 026): the batch
-- and general enqueue paths and the row check take it. awa.enqueue took it
-- too for a while on the branch that added it: that overload goes.
drop function if exists awa.enqueue(
    text, text, jsonb, smallint, bytea, timestamptz, integer, interval
);
drop function if exists awa.enqueue_batch(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[]
);
drop function if exists awa._enqueue_rows(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[], text, bigint
);
drop function if exists awa._insert_jobs(
    integer[], bigint[], integer[], smallint[], text[], jsonb[], bytea[], integer[],
    timestamptz[], bigint[], integer[], timestamptz[], text[]
);
drop function if exists awa._check_job(text, text, smallint, integer);
-- Unreleased: the job tools carry a job's own max run time (ADR 026) when
-- they cancel and retry it.
drop function if exists awa._cancel_waiting(
    bigint, integer, smallint, text, jsonb, bytea, integer, integer, timestamptz, text
);
drop function if exists awa._requeue(
    bigint[], integer[], smallint[], text[], jsonb[], bytea[], integer[], timestamptz[], text[]
);
-- Unreleased: the physical queues of a name have one home in queues.sql.
drop function if exists awa._job_queue_ids(text);
-- Unreleased: unique keys (ADR 027): the enqueue paths take a unique key
-- and window, and awa.enqueued says whether a row was a duplicate.
drop function if exists awa.enqueue(
    text, text, jsonb, smallint, bytea, timestamptz, integer
);
drop function if exists awa.enqueue_batch(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[], interval[]
);
drop function if exists awa._enqueue_rows(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[], interval[], text,
    bigint
);
drop function if exists awa._requeue(
    bigint[], integer[], smallint[], text[], jsonb[], bytea[], integer[], timestamptz[], text[],
    interval[]
);
drop function if exists awa._take_unique_keys(
    text[], bytea[], bigint[], integer[], smallint[], interval[]
);
-- Unreleased: a claim walks each queue's lanes from queue_meta.lane_ids by a
-- drawn stride (ADR 028) instead of sorting awa.lanes.
drop function if exists awa._claim_lane_order(smallint, integer, integer);
-- Unreleased: claim hints are rows inserted, never updated (ADR 030,
-- migration 0022): moving one takes the hint it was read at.
drop function if exists awa._advance_lane_heads(integer[], bigint[]);
-- Unreleased: queue_meta.lane_shards is set by awa._count_lane_shards,
-- which reads each queue's lanes once.
drop function if exists awa._lane_shards(integer);
-- Unreleased: awa.running is partitioned by slot (ADR 034, migration
-- 0024); the table it was is slot 2, awa.running_carried, whose row type
-- the earlier layer's two took.
drop function if exists awa._finish(awa.running_carried, text, text);
drop function if exists awa._retry_or_fail(awa.running_carried, text, timestamptz);
-- Unreleased: leader locks are rows of awa.leader_locks (ADR 037); these
-- advisory classes are taken no more.
drop function if exists awa._lock_class_autoscale();
drop function if exists awa._lock_class_prune();
drop function if exists awa._lock_class_running();
-- Unreleased: enqueue_batch checks an empty array's length without it.
drop function if exists awa._batch_dims(anyarray);
-- Unreleased: a slot's carry goes in batches until a time the prune gives
-- (ADR 040).
drop function if exists awa._prune_slot(integer);
-- Unreleased: COPY's mover takes a keyed load's keys before its first pass
-- and gives each pass the job ids it took them for.
drop function if exists awa._enqueue_rows(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[], interval[], bytea[],
    interval[], text, bigint
);
-- Unreleased: COPY's mover routes a load of several passes and takes its
-- lanes before the first pass, and gives each pass the rows' routing.
drop function if exists awa._enqueue_rows(
    text[], text[], jsonb[], smallint[], bytea[], timestamptz[], integer[], interval[], bytea[],
    interval[], text, bigint, bigint[]
);
-- Unreleased: the row check of a multi-row enqueue checks run_at too.
drop function if exists awa._row_ok(
    text, text, smallint, integer, interval, bytea, bytea, interval
);
drop function if exists awa._check_row(
    text, text, smallint, integer, interval, bytea, bytea, interval, text, bigint
);
-- Unreleased: awa.jobs lists one worker's running jobs too (its last
-- argument, worker).
drop function if exists awa.jobs(text, text, text, bigint, integer);
-- Unreleased: awa.retry_jobs takes the state it retries, failed or
-- cancelled (its last argument, state).
drop function if exists awa.retry_jobs(text, text, integer);
-- Unreleased: a trigger may fire in every session_replication_role (the
-- COPY staging triggers do).
drop function if exists awa._ensure_trigger(regclass, text, text);
-- Unreleased: awa._autoscale_signal returns the demand too (a sixth out
-- parameter; CREATE OR REPLACE cannot change a result's columns).
drop function if exists awa._autoscale_signal(awa.queue_meta, timestamptz);
-- Unreleased: the bulk job tools take a bound, so that a run that counted
-- first takes the jobs it counted: awa.retry_jobs the jobs finished before
-- it (finished_before), awa.cancel_jobs those enqueued before it
-- (enqueued_before).
drop function if exists awa.cancel_jobs(text, text, integer);
drop function if exists awa.retry_jobs(text, text, integer, text);
-- Unreleased: awa.claim takes family: false claims the named queues and
-- their own stripes only, not the partitions of a logical queue it names
-- (a per-partition worker of partition 0); awa._names_cover takes it too.
drop function if exists awa.claim(text[], integer, text, interval);
drop function if exists awa._names_cover(text[], text, text, text);
