-- 0017_deadlines: a maximum run time per job, with a per-queue default, and
-- a retry policy per queue (ADR 026).
--
-- A job may carry its own max_run_time (awa.enqueue, awa.enqueue_batch, the
-- COPY column); the queue's max_run_time (awa.set_max_run_time) applies to
-- the jobs that carry none. The claim writes the job's deadline into its
-- running row, the lease never runs past it, and the rescue retries (or
-- fails) a job whose deadline passed. Null everywhere means no deadline.
-- Every value is stored as a number of seconds (days count 24 hours,
-- months 30 days).
--
-- retry_base, retry_cap and retry_jitter (awa.set_retry_policy) shape the
-- queue's retry delay; null takes the default.

alter table awa.queue_meta
add column max_run_time interval,
add column retry_base interval,
add column retry_cap interval,
add column retry_jitter numeric;

comment on column awa.queue_meta.max_run_time is
'Max run time of the queue''s jobs that carry none of their own (awa.set_max_run_time); '
'null: no deadline.';
comment on column awa.queue_meta.retry_base is
'Retry delay of the first retry, doubled at each further attempt (awa.set_retry_policy); '
'null: the default.';
comment on column awa.queue_meta.retry_cap is
'Longest retry delay (awa.set_retry_policy); null: the default.';
comment on column awa.queue_meta.retry_jitter is
'Share of the retry delay drawn at random, 0 to 1 (awa.set_retry_policy); null: the '
'default.';

-- The job's own max run time travels with it through every state, so that
-- a retry keeps it.
alter table awa.ready add column max_run_time interval;
alter table awa.scheduled add column max_run_time interval;
alter table awa.finished add column max_run_time interval;
alter table awa.copy_staging add column max_run_time interval;

-- The claim writes the deadline: claimed_at plus the job's max run time, or
-- its queue's; the lease is never extended past it.
alter table awa.running
add column max_run_time interval,
add column deadline_at timestamptz;

comment on column awa.running.max_run_time is
'The job''s own max run time, as enqueued (null: its queue''s applies).';
comment on column awa.running.deadline_at is
'When this run must have finished: claimed_at plus the max run time in force at the '
'claim; lease_expires_at never passes it. Null: no deadline.';

alter type awa.claimed add attribute deadline_at timestamptz;

comment on type awa.claimed is
'Result row of awa.claim. Pass job_id and run_lease back to complete, fail or heartbeat; '
'deadline_at (null: none) is when the run must have finished.';
