-- 0042_priority_demand: each contention sample records the demand of its
-- queue's busiest priority.
--
-- The auto-scaler added lanes held and backends waiting over all four
-- priorities of a queue and compared that with S, which is lanes per
-- priority: three producers of one key at priority 1 and two unkeyed ones
-- holding lanes at priority 2 raised S = 4 to 8 for waits no lane could
-- relieve, and one holder and one waiter in each priority took S = 1 to 8
-- where 2 gave each its own lane (then halved back, a remap each step). It
-- now judges the priority with the most lanes held plus backends waiting.
-- A column without a default: no rewrite, an ACCESS EXCLUSIVE lock on the
-- samples for an instant (the tick, awa.sample_lane_contention and the
-- views that read the samples wait for it; no enqueue or claim does). An
-- earlier layer, until the next one is applied, writes samples without it.

alter table awa.contention_samples add column busiest_priority_demand integer;

comment on column awa.contention_samples.busiest_priority_demand is
'Lanes held plus backends waiting for a lane in the queue''s priority with the most of them '
'at the sample: the producers that wanted one of that priority''s S lanes at once. Null in a '
'sample taken before migration 0042 (or by an earlier function layer), for which the '
'auto-scaler takes lanes_held + waiters over every priority.';
