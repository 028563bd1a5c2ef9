-- 0006_partitions: partitioned logical queues, registered in the database so
-- that producers in any language route by the same rule.
--
-- A logical queue registered with P partitions is carried by itself
-- (partition 0) and name__p1 .. name__p(P-1), each an ordinary queue.

alter table awa.queue_meta
add column partitions integer not null default 1,
add column root_queue text,
add constraint queue_meta_partitions_range check (partitions between 1 and 32767);

create index queue_meta_root_queue_idx on awa.queue_meta (root_queue)
where root_queue is not null;

comment on column awa.queue_meta.partitions is
'P: how many partitions new enqueues to this logical name spread over (keyed jobs by '
'partition_hash64(key) mod P); 1 means not partitioned.';
comment on column awa.queue_meta.root_queue is
'For a partition or a stripe: the logical queue at the top (claims, pauses and shard '
'changes by that name cover this queue). Null for a logical name''s own row.';
