-- 0002_storage: lanes, ready / scheduled / running / finished jobs.
--
-- A job lives in exactly one of four tables at a time and moves between them
-- inside the transaction that changes its state:
--   scheduled (run_at in the future, or waiting for a retry)
--     -> ready (in a lane, ordered by lane_seq)
--     -> running (claimed, with a run_lease)
--     -> finished (completed or failed)
-- Moving rows instead of updating a state column keeps the claim index small:
-- the ready table holds only claimable rows.

alter table awa.queue_meta
add column queue_id integer generated always as identity,
add column paused boolean not null default false,
add column shard_mode text not null default 'manual',
add column max_shards smallint,
add column created_at timestamptz not null default pg_catalog.now(),
add constraint queue_meta_queue_id_key unique (queue_id),
add constraint queue_meta_shard_mode_known check (
    shard_mode in ('manual', 'shadow', 'auto')
),
add constraint queue_meta_max_shards_range check (max_shards between 1 and 64);

comment on column awa.queue_meta.queue_id is
'Stable numeric id of the physical queue, used in lock keys and internal names.';
comment on column awa.queue_meta.paused is
'A paused queue accepts enqueues but yields nothing to claim.';
comment on column awa.queue_meta.shard_mode is
'manual (S is set by hand), shadow (the auto-scaler logs only) or auto.';

create table awa.lanes (
    lane_id integer generated always as identity primary key,
    queue_id integer not null references awa.queue_meta (queue_id),
    priority smallint not null,
    shard smallint not null,
    seq regclass not null,
    created_at timestamptz not null default pg_catalog.now(),
    constraint lanes_queue_priority_shard_key unique (queue_id, priority, shard),
    constraint lanes_priority_range check (priority between 1 and 4),
    constraint lanes_shard_range check (shard between 0 and 63)
);

comment on table awa.lanes is
'One lane per (physical queue, priority, enqueue shard). Its sequence and its '
'advisory lock (1635213644, lane_id) derive from lane_id, never from the queue name.';
comment on column awa.lanes.seq is
'The lane''s own sequence, awa.lane_seq_<lane_id>, owned by the owner role.';

create sequence awa.job_id_seq as bigint;
create sequence awa.run_lease_seq as bigint;

create table awa.ready (
    lane_id integer not null,
    lane_seq bigint not null,
    job_id bigint not null,
    queue_id integer not null,
    priority smallint not null,
    kind text not null,
    args jsonb not null,
    ordering_key bytea,
    attempt integer not null,
    max_attempts integer not null,
    enqueued_at timestamptz not null,
    ready_at timestamptz not null default pg_catalog.now(),
    last_error text,
    constraint ready_pkey primary key (lane_id, lane_seq)
);

comment on table awa.ready is
'Claimable jobs. FIFO within a lane by lane_seq; claim merges lanes by (priority, job_id).';

-- Claimers delete from the head of each lane all day long: vacuum often and
-- early so dead heads do not pile up in the primary key.
alter table awa.ready set (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 50000
);

create table awa.scheduled (
    job_id bigint primary key,
    queue_id integer not null references awa.queue_meta (queue_id),
    priority smallint not null,
    kind text not null,
    args jsonb not null,
    ordering_key bytea,
    attempt integer not null,
    max_attempts integer not null,
    enqueued_at timestamptz not null,
    run_at timestamptz not null,
    last_error text
);

create index scheduled_run_at_idx on awa.scheduled (run_at);

comment on table awa.scheduled is
'Jobs that wait outside the lanes until run_at: future jobs and retries. '
'awa.promote_due() moves due rows into lanes.';

create table awa.running (
    job_id bigint primary key,
    run_lease bigint not null,
    lane_id integer not null,
    lane_seq bigint not null,
    queue_id integer not null,
    priority smallint not null,
    kind text not null,
    args jsonb not null,
    ordering_key bytea,
    attempt integer not null,
    max_attempts integer not null,
    enqueued_at timestamptz not null,
    worker text not null,
    claimed_at timestamptz not null default pg_catalog.now(),
    heartbeat_at timestamptz not null default pg_catalog.now(),
    lease_expires_at timestamptz not null
);

create index running_lease_expires_at_idx on awa.running (lease_expires_at);

alter table awa.running set (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000
);

comment on table awa.running is
'Claimed jobs. run_lease changes at every claim, so a stale worker cannot finish a job.';

create table awa.finished (
    job_id bigint primary key,
    queue_id integer not null,
    priority smallint not null,
    kind text not null,
    state text not null,
    attempt integer not null,
    enqueued_at timestamptz not null,
    finished_at timestamptz not null default pg_catalog.now(),
    last_error text,
    constraint finished_state_known check (state in ('completed', 'failed'))
);

create index finished_queue_state_idx on awa.finished (queue_id, state);

comment on table awa.finished is
'Terminal jobs: completed, or failed after max_attempts. Prune with awa.prune_finished().';

-- What enqueue calls return, one row per job.
create type awa.enqueued as (
    job_id bigint,
    queue text,
    priority smallint,
    enqueue_shard smallint,
    lane_seq bigint
);

comment on type awa.enqueued is
'Result row of awa.enqueue and awa.enqueue_batch; enqueue_shard and lane_seq are null '
'for a job scheduled in the future.';

-- What awa.claim returns, one row per claimed job.
create type awa.claimed as (
    job_id bigint,
    run_lease bigint,
    queue text,
    priority smallint,
    enqueue_shard smallint,
    lane_seq bigint,
    kind text,
    args jsonb,
    attempt integer,
    max_attempts integer,
    ordering_key bytea
);

comment on type awa.claimed is
'Result row of awa.claim. Pass job_id and run_lease back to complete, fail or heartbeat.';
