-- views.sql: read-only views for dashboards, the CLI and the admin page.
-- Granted to awa_reader and awa_operator.

-- Function: awa._lane_next_seq(lane_id integer) returns bigint
-- The lane_seq the lane's next job will get. A definer because reading a
-- sequence needs a privilege on it, which only the owner role has.
create or replace function awa._lane_next_seq(lane_id integer)
returns bigint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(pg_sequence_last_value(l.seq), 0) + 1
      from awa.lanes as l
     where l.lane_id = _lane_next_seq.lane_id
$$;

select awa._grant_execute('awa._lane_next_seq(integer)', 'reader', 'operator');

-- View: awa.queue_overview, one row per physical queue.
create or replace view awa.queue_overview as
select
    m.queue,
    m.enqueue_shards,
    m.shard_mode,
    m.max_shards,
    m.paused,
    coalesce(r.ready, 0) as ready,
    coalesce(ru.running, 0) as running,
    coalesce(s.scheduled, 0) as scheduled,
    coalesce(f.failed, 0) as failed,
    coalesce(f.completed, 0) as completed,
    now() - r.oldest_ready_at as oldest_ready_age,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    m.stripes,
    m.partitions
from awa.queue_meta as m
left join (
    select
        x.queue_id,
        count(*) as ready,
        min(x.ready_at) as oldest_ready_at
    from awa.ready as x
    group by x.queue_id
) as r on m.queue_id = r.queue_id
left join (
    select
        x.queue_id,
        count(*) as running
    from awa.running as x
    group by x.queue_id
) as ru on m.queue_id = ru.queue_id
left join (
    select
        x.queue_id,
        count(*) as scheduled
    from awa.scheduled as x
    group by x.queue_id
) as s on m.queue_id = s.queue_id
left join (
    select
        x.queue_id,
        count(*) filter (where x.state = 'failed') as failed,
        count(*) filter (where x.state = 'completed') as completed
    from awa.finished as x
    group by x.queue_id
) as f on m.queue_id = f.queue_id;

comment on view awa.queue_overview is
'Per physical queue: S, shard mode, paused, job counts by state, age of the oldest ready '
'job; logical_queue names the logical queue a partition or stripe belongs to (itself '
'otherwise); stripes is K; partitions is P for a partitioned logical queue.';

-- View: awa.lane_overview, one row per lane.
create or replace view awa.lane_overview as
select
    m.queue,
    l.priority,
    l.shard,
    l.lane_id,
    l.shard >= m.enqueue_shards and coalesce(r.ready, 0) > 0 as draining,
    coalesce(r.ready, 0) as ready,
    now() - r.oldest_ready_at as lag,
    awa._lane_next_seq(l.lane_id) as next_seq,
    r.head_seq as claim_position,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue
from awa.lanes as l
inner join awa.queue_meta as m on l.queue_id = m.queue_id
left join (
    select
        x.lane_id,
        count(*) as ready,
        min(x.ready_at) as oldest_ready_at,
        min(x.lane_seq) as head_seq
    from awa.ready as x
    group by x.lane_id
) as r on l.lane_id = r.lane_id;

comment on view awa.lane_overview is
'Per lane: ready depth, lag (age of its oldest ready job), the next lane_seq it will hand '
'out, and the claim position (lane_seq of its head). draining: shard >= the current S '
'with ready jobs left.';

select awa._grant_select('awa.queue_overview', 'reader', 'operator');
select awa._grant_select('awa.lane_overview', 'reader', 'operator');

select awa._grant_select('awa.shard_changes', 'reader', 'operator');
