-- 0016_job_tools: the shape of one job as the operators' job tools show it
-- (awa.job, awa.jobs; ADR 025), whatever table the job is in. No index:
-- awa.ready keeps its primary key alone, so enqueue pays nothing for these
-- tools.

create type awa.job_info as (
    job_id bigint,
    queue text,
    logical_queue text,
    kind text,
    state text,
    priority smallint,
    ordering_key bytea,
    args jsonb,
    attempt integer,
    max_attempts integer,
    enqueued_at timestamptz,
    run_at timestamptz,
    finished_at timestamptz,
    last_error text,
    worker text,
    lease_expires_at timestamptz
);

comment on type awa.job_info is
'One job as awa.job and awa.jobs show it. state: scheduled, ready, running, completed, '
'failed or cancelled. queue is the physical queue, logical_queue the name it was enqueued '
'to. run_at: when a scheduled job is due, a ready one became ready, a running one was '
'claimed. attempt counts the attempts made (a running job''s current one included). '
'args, ordering_key and last_error are null for a completed job. worker and '
'lease_expires_at only for a running job.';
