-- 0027_shard_change_retention: the history of changes of S is kept for a
-- retention, and a queue's latest change is read from the top of an index.
--
-- awa.shard_changes (and its lanes' rows in awa.shard_change_lanes) grew
-- for ever, one row per change of S and one more per lane of the queue.
-- awa.prune_shard_changes() removes changes older than the retention, but
-- never a queue's latest, oldest first, by the new index on changed_at.
--
-- The latest change of a queue (the one committed last: the highest
-- change_id) was read through the primary key, filtered by queue: for a
-- queue changed rarely among busy ones, that read every change made since
-- its own. The index on (queue, change_id) reads it first.

create index shard_changes_queue_change_id_idx on awa.shard_changes (queue, change_id);

create index shard_changes_changed_at_idx on awa.shard_changes (changed_at);
