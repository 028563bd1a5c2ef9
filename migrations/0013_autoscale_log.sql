-- 0013_autoscale_log: the decision log folds repeated holds, and the
-- contention samples keep what the admin page charts over the last hour.

-- A run of identical holds (same mode, S and reason_code) is one row:
-- decided_at is the first, last_decided_at the latest, repeats how many.
alter table awa.autoscale_decisions
add column reason_code text,
add column repeats integer not null default 1,
add column last_decided_at timestamptz,
add constraint autoscale_decisions_repeats_positive check (repeats >= 1);

update awa.autoscale_decisions set last_decided_at = decided_at;

alter table awa.autoscale_decisions
alter column last_decided_at set not null,
alter column last_decided_at set default pg_catalog.clock_timestamp();

-- The tick prunes by the last tick of a row, not its first.
drop index awa.autoscale_decisions_decided_at_idx;
create index autoscale_decisions_last_decided_at_idx
on awa.autoscale_decisions (last_decided_at);

comment on column awa.autoscale_decisions.reason_code is
'The rule that decided, in one word (cooldown, draining, above_max, grow, at_max, shrink, '
'few_samples, steady): holds with the same code, mode and S fold into one row. Null on '
'rows logged before migration 0013.';
comment on column awa.autoscale_decisions.repeats is
'How many ticks made this decision: 1 for a step, the length of the run for folded holds.';
comment on column awa.autoscale_decisions.last_decided_at is
'The latest tick of the run (decided_at is the first); the signal and the reason are '
'those of that latest tick.';

-- Ready depth and the oldest ready job at the sample, for the queues the
-- auto-scaler watches (the tick estimates them); null otherwise.
alter table awa.contention_samples
add column ready bigint,
add column oldest_ready_at timestamptz;

comment on column awa.contention_samples.ready is
'Ready jobs of the queue at the sample, estimated by awa.autoscale_tick from its lanes'' '
'heads and sequences, for queues in shadow or auto mode; null for the others.';

-- The hourly prune deletes by time across all queues.
create index contention_samples_sampled_at_idx on awa.contention_samples (sampled_at);
