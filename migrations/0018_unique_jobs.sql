-- 0018_unique_jobs: unique keys (ADR 027).
--
-- A producer may give a job a unique key. While a job of the same logical
-- queue (the top name of its partitions and stripes) holds the key, another
-- enqueue with that key inserts nothing and reports the holder. A job holds
-- its key while scheduled, ready or running; a job enqueued with a unique
-- window holds it for that long after it completes, too. The key is free
-- again when the job completes (or its window ends), fails for good or is
-- cancelled. awa.ready carries no key: a key is looked up by job only where
-- a queue has had keyed jobs (queue_meta.unique_jobs, copied into the
-- running row by the claim), so unkeyed enqueues and claims pay nothing.

create table awa.unique_keys (
    queue text not null,
    unique_key bytea not null,
    job_id bigint not null,
    queue_id integer not null,
    priority smallint not null,
    unique_window interval,
    held_until timestamptz,
    constraint unique_keys_pkey primary key (queue, unique_key)
);

create index unique_keys_job_id_idx on awa.unique_keys (job_id);
create index unique_keys_held_until_idx on awa.unique_keys (held_until)
where held_until is not null;

comment on table awa.unique_keys is
'The unique keys held now, one row per (logical queue, key): by a live job (held_until '
'null), or by a completed one until held_until (its unique window). A row whose '
'held_until has passed holds nothing; awa.prune_unique_keys() removes it.';
comment on column awa.unique_keys.queue is
'The logical queue at the top of the holder''s partitions and stripes: the key''s scope.';
comment on column awa.unique_keys.queue_id is
'The physical queue the holding job was enqueued to.';
comment on column awa.unique_keys.unique_window is
'How long the key stays held after the job completes; null: it is free at once.';

alter table awa.queue_meta
add column unique_jobs boolean not null default false;

comment on column awa.queue_meta.unique_jobs is
'A job with a unique key was enqueued to this queue: claims and completes look its jobs'' '
'keys up from then on.';

alter table awa.running
add column unique_jobs boolean not null default false;

comment on column awa.running.unique_jobs is
'The queue''s unique_jobs at the claim: the job may hold a unique key, which its end '
'frees.';

-- A failed or cancelled job keeps its key (not held) for a retry.
alter table awa.finished
add column unique_key bytea,
add column unique_window interval;

alter table awa.copy_staging
add column unique_key bytea,
add column unique_window interval;

alter type awa.enqueued add attribute duplicate boolean;

comment on type awa.enqueued is
'Result row of awa.enqueue and awa.enqueue_batch; enqueue_shard and lane_seq are null '
'for a job scheduled in the future and for a duplicate. duplicate: true when the call '
'inserted nothing because another job holds its unique key; job_id, queue and priority '
'are then the holder''s.';
