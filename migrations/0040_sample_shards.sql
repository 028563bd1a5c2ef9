-- 0040_sample_shards: each contention sample records the S its queue had
-- when it was taken.
--
-- The auto-scaler judged a new S on the samples taken since the change's
-- record, which carries its transaction's start: an operator's change of S
-- in a transaction held open had the first tick past the cooldown judge
-- the new S on the samples taken at the old one meanwhile, and step again
-- at once. It
-- now counts only the samples taken at the queue's current S. A column
-- without a default: no rewrite, an ACCESS EXCLUSIVE lock on the samples
-- for an instant (the tick, awa.sample_lane_contention and the views that
-- read the samples wait for it; no enqueue or claim does). An earlier
-- layer, until the next one is applied, writes samples without it.

alter table awa.contention_samples add column enqueue_shards smallint;

comment on column awa.contention_samples.enqueue_shards is
'The queue''s S when the sample was taken: the auto-scaler judges S on the samples taken '
'at it. Null in a sample taken before migration 0040 (or by an earlier function layer), '
'which counts at any S.';

comment on column awa.autoscale_decisions.reason_code is
'The rule that decided, in one word (cooldown, draining, above_max, demand_within_s, '
'grow, at_max, shrink, few_samples, steady): holds with the same code, mode and S fold '
'into one row. Null on rows logged before migration 0013.';
