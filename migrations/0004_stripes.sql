-- 0004_stripes: striped queues, an advanced storage knob.
--
-- A logical queue may be stored as stripes name#0 .. name#(K-1): ordinary
-- physical queues whose rows point back at the logical name. The logical
-- name's own row keeps its lanes, so jobs enqueued before striping (or after
-- un-striping) drain like any other lane.

alter table awa.queue_meta
add column logical_queue text,
add column stripes smallint not null default 1,
add constraint queue_meta_stripes_range check (stripes between 1 and 64);

create index queue_meta_logical_queue_idx on awa.queue_meta (logical_queue)
where logical_queue is not null;

comment on column awa.queue_meta.logical_queue is
'For a stripe (name#k): the logical queue it belongs to. Null for a logical name''s own row.';
comment on column awa.queue_meta.stripes is
'K: how many stripes new enqueues to this logical name spread over; 1 means no striping.';
