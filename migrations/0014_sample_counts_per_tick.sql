-- 0014_sample_counts_per_tick: a contention sample is the pg_locks pass
-- alone; the per-lane counts (the enqueue counter, ready depth, lag) come
-- with the auto-scaler's tick (ADR 017), so a sample taken on its own has
-- no enqueue counter.

alter table awa.contention_samples
alter column enqueued drop not null;

comment on table awa.contention_samples is
'One row per queue per contention sample (awa.sample_lane_contention() or a tick of '
'awa.autoscale_tick()): lanes held and waited for, backends waiting for a lane lock; and, '
'in a tick''s sample, the sum of the lanes'' sequences (enqueues so far).';
comment on column awa.contention_samples.enqueued is
'Sum of the lane sequences of the queue, read by awa.autoscale_tick(): the difference '
'between two such samples is the number of enqueues between them (rolled-back '
'reservations included). Null in a sample taken by awa.sample_lane_contention() alone.';
