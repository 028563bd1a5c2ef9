-- 0011_lane_ids: each physical queue's lanes on its settings row.
--
-- awa.enqueue reads S and the lanes it may write to in the one index lookup
-- it makes on awa.queue_meta: lane_ids[priority][shard] is the lane of
-- (queue, priority, shard) and lane_seqs[priority][shard] its sequence, null
-- where none is provisioned (both indexed [1:4][0:63]). awa._provision_lanes,
-- the only code that creates lanes, keeps them in step with awa.lanes.

alter table awa.queue_meta
add column lane_ids integer[] not null
default array_fill(null::integer, array[4, 64], array[1, 0]),
add column lane_seqs regclass[] not null
default array_fill(null::regclass, array[4, 64], array[1, 0]),
add constraint queue_meta_lane_ids_shape check (array_dims(lane_ids) = '[1:4][0:63]'),
add constraint queue_meta_lane_seqs_shape check (array_dims(lane_seqs) = '[1:4][0:63]');

comment on column awa.queue_meta.lane_ids is
'Lane ids by [priority][shard], null where no lane is provisioned. Kept in step with '
'awa.lanes by awa._provision_lanes.';
comment on column awa.queue_meta.lane_seqs is
'Each lane''s sequence by [priority][shard], as lane_ids.';

do $$
declare
    l record;
begin
    for l in select * from awa.lanes order by lane_id loop
        update awa.queue_meta
           set lane_ids[l.priority][l.shard] = l.lane_id,
               lane_seqs[l.priority][l.shard] = l.seq
         where queue_id = l.queue_id;
    end loop;
end;
$$;

-- Lane choice has one definition now (sql/lanes.sql); these two helpers of
-- the old one are gone from the function layer.
drop function if exists awa._acquire_lane(integer, integer, smallint, bytea);
drop function if exists awa._held_lane_setting(integer, smallint);
