-- 0011_lane_ids: each physical queue's lane ids on its settings row.
--
-- awa.enqueue reads S and the lanes it may write to in the one index lookup
-- it makes on awa.queue_meta: lane_ids[(priority - 1) * 64 + shard + 1] is
-- the lane of (queue, priority, shard), null where none is provisioned.
-- awa._provision_lanes, the only code that creates lanes, keeps it in step
-- with awa.lanes.

alter table awa.queue_meta
add column lane_ids integer[] not null default array_fill(null::integer, array[256]),
add constraint queue_meta_lane_ids_shape check (
    array_ndims(lane_ids) = 1
    and array_lower(lane_ids, 1) = 1
    and array_length(lane_ids, 1) = 256
);

comment on column awa.queue_meta.lane_ids is
'Lane ids by (priority, shard): element (priority - 1) * 64 + shard + 1; null where no lane '
'is provisioned. Kept in step with awa.lanes by awa._provision_lanes.';

update awa.queue_meta as m
set lane_ids = array(
    select l.lane_id
    from generate_series(0, 255) as k (i)
    left join awa.lanes as l
        on l.queue_id = m.queue_id and l.priority = k.i / 64 + 1 and l.shard = k.i % 64
    order by k.i
);

-- Lane choice has one definition now (sql/lanes.sql); these two helpers of
-- the old one are gone from the function layer.
drop function if exists awa._acquire_lane(integer, integer, smallint, bytea);
drop function if exists awa._held_lane_setting(integer, smallint);
