-- 0015_retention: terminal jobs kept for a per-queue retention in two rings
-- of slots that awa.prune_finished() empties with TRUNCATE (ADR 024), and
-- per-queue counters of terminal jobs.
--
-- awa.finished becomes a table partitioned by slot: slots 0-31 hold
-- completed jobs (a slot per hour of the day they finished, 32 hours
-- round), slots 32-63 failed and cancelled ones (a slot per 6 hours, 8 days
-- round). A failed or cancelled job keeps what a retry needs (args,
-- ordering key, max_attempts); a completed one keeps its outcome only.
-- Rows move from the old table into the slot of the moment of the upgrade,
-- and their payload, which the old table never kept, stays null.

alter table awa.queue_meta
add column retain_completed interval,
add column retain_failed interval,
add column completed_seq regclass,
add column failed_seq regclass,
add column cancelled_seq regclass,
add constraint queue_meta_retention_positive check (
    retain_completed > interval '0' and retain_failed > interval '0'
);

comment on column awa.queue_meta.retain_completed is
'How long completed jobs are kept (awa.set_retention); null: the default, 24 hours.';
comment on column awa.queue_meta.retain_failed is
'How long failed and cancelled jobs are kept (awa.set_retention); null: the default, '
'7 days.';
comment on column awa.queue_meta.completed_seq is
'Counter of the queue''s completed jobs (a sequence; see awa.queue_overview).';

-- A claim copies the queue's completed counter into the running row, so
-- that awa.complete moves it without looking the queue up.
alter table awa.running add column completed_seq regclass;

alter table awa.finished rename to finished_0014;
alter table awa.finished_0014 rename constraint finished_pkey to finished_0014_pkey;
alter table awa.finished_0014
rename constraint finished_state_known to finished_0014_state_known;
alter index awa.finished_queue_state_idx rename to finished_0014_queue_state_idx;

create table awa.finished (
    job_id bigint not null,
    slot smallint not null,
    queue_id integer not null,
    priority smallint not null,
    kind text not null,
    state text not null,
    attempt integer not null,
    max_attempts integer not null,
    enqueued_at timestamptz not null,
    finished_at timestamptz not null default pg_catalog.now(),
    args jsonb,
    ordering_key bytea,
    last_error text,
    constraint finished_pkey primary key (job_id, slot),
    constraint finished_state_known check (state in ('completed', 'failed', 'cancelled')),
    constraint finished_slot_range check (slot between 0 and 63)
) partition by list (slot);

do $$
begin
    for s in 0..63 loop
        execute format(
            'create table awa.%I partition of awa.finished for values in (%s)',
            'finished_' || lpad(s::text, 2, '0'), s
        );
    end loop;
end;
$$;

create index finished_queue_state_idx on awa.finished (queue_id, state, job_id);

comment on table awa.finished is
'Terminal jobs: completed, failed after max_attempts, or cancelled; kept for the '
'queue''s retention, then removed by awa.prune_finished(), which empties whole slots '
'with TRUNCATE. Failed and cancelled rows keep args, ordering_key and max_attempts.';
comment on column awa.finished.slot is
'The slot the row was written in (awa._finished_slot): 0-31 completed, one per hour; '
'32-63 failed and cancelled, one per 6 hours.';

-- The slot of the moment of the upgrade, by the rule of awa._finished_slot
-- in sql/retention.sql at this version.
insert into awa.finished (
    job_id, slot, queue_id, priority, kind, state, attempt, max_attempts, enqueued_at,
    finished_at, last_error
)
select
    f.job_id,
    case
        when f.state = 'completed'
            then (floor(extract(epoch from pg_catalog.now()) / 3600)::bigint % 32)
        else 32 + (floor(extract(epoch from pg_catalog.now()) / 21600)::bigint % 32)
    end::smallint,
    f.queue_id, f.priority, f.kind, f.state, f.attempt, f.attempt as max_attempts,
    f.enqueued_at,
    f.finished_at, f.last_error
from awa.finished_0014 as f;

drop table awa.finished_0014;

-- awa.queue_overview counts a queue's scheduled jobs up to a cap, and the
-- job tools page through them by queue.
create index scheduled_queue_idx on awa.scheduled (queue_id, job_id);
