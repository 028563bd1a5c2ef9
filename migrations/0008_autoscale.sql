-- 0008_autoscale: the auto-scaler's per-queue policy, its decision log, and
-- the sample columns it decides from.

alter table awa.queue_meta
add column shard_mode_changed_at timestamptz,
add column partitioned_fifo_accepted_by text,
add column partitioned_fifo_accepted_at timestamptz;

comment on column awa.queue_meta.partitioned_fifo_accepted_at is
'When a login opted the queue into shadow or auto mode, accepting that S may rise above 1 '
'and order then holds per lane and per ordering key only.';

alter table awa.contention_samples
add column busiest_priority_held integer not null default 0;

comment on column awa.contention_samples.busiest_priority_held is
'Lanes held at the sample in the queue''s busiest priority: the producers that had to fit '
'into S lanes at that instant.';

-- One row per queue with tuned settings; a null column takes the default
-- documented in docs/configuration.md (awa._autoscale_policy).
create table awa.autoscale_policy (
    queue_id integer primary key references awa.queue_meta (queue_id),
    grow_window interval,
    grow_wait_share numeric,
    grow_waiters numeric,
    shrink_window interval,
    shrink_wait_share numeric,
    cooldown interval,
    min_samples integer,
    constraint autoscale_policy_windows check (
        grow_window > interval '0' and shrink_window > interval '0'
        and cooldown >= interval '0'
    ),
    constraint autoscale_policy_shares check (
        grow_wait_share between 0 and 1 and shrink_wait_share between 0 and 1
        and grow_waiters >= 0
    ),
    constraint autoscale_policy_min_samples check (min_samples between 1 and 10000)
);

comment on table awa.autoscale_policy is
'Per-queue overrides of the auto-scaler''s thresholds; a null takes the default.';

create table awa.autoscale_decisions (
    decision_id bigint generated always as identity primary key,
    queue text not null,
    decided_at timestamptz not null default pg_catalog.clock_timestamp(),
    mode text not null,
    samples integer not null,
    mean_waiters numeric,
    wait_share numeric,
    enqueue_rate numeric,
    busiest_held integer,
    current_shards smallint not null,
    proposed_shards smallint not null,
    action text not null,
    reason text not null,
    constraint autoscale_decisions_mode_known check (mode in ('shadow', 'auto')),
    constraint autoscale_decisions_action_known check (
        action in ('raised', 'lowered', 'would_raise', 'would_lower', 'held')
    )
);

create index autoscale_decisions_queue_decided_at_idx
on awa.autoscale_decisions (queue, decided_at);

create index autoscale_decisions_decided_at_idx on awa.autoscale_decisions (decided_at);

comment on table awa.autoscale_decisions is
'Every auto-scaler decision, hold included: the signal it saw over its window, S before '
'and proposed, what it did (raised / lowered in auto mode, would_raise / would_lower in '
'shadow mode, held) and why in words. Pruned by awa.autoscale_tick after 24 hours.';
