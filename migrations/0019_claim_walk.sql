-- 0019_claim_walk: how many shards a queue's lanes span (ADR 028).
--
-- A claim walks a queue's lanes straight from queue_meta.lane_ids, the
-- [priority][shard] map enqueues read, instead of reading and sorting
-- awa.lanes. Lanes are provisioned for shards 0 .. n - 1 at every priority
-- and never dropped (they drain after S is lowered); lane_shards is that n,
-- kept by awa._provision_lanes.

alter table awa.queue_meta add column lane_shards smallint not null default 0;

update awa.queue_meta as m
   set lane_shards = l.shards
  from (
      select y.queue_id, count(*)::smallint as shards
        from awa.lanes as y
       where y.priority = 1
       group by y.queue_id
  ) as l
 where l.queue_id = m.queue_id;

alter table awa.queue_meta add constraint queue_meta_lane_shards_range
check (lane_shards between 0 and 64);

comment on column awa.queue_meta.lane_shards is
'How many shards the queue''s lanes span: lanes exist for shards 0 .. lane_shards - 1 at '
'every priority (kept by awa._provision_lanes; lanes are never dropped). A claim walks them.';
