-- contention.sql: the lane-contention signal for operators and the
-- auto-scaler. Producers of any language show up here: it reads pg_locks.

-- Function: awa._sample_lane_contention(at timestamptz) returns integer
-- Records one sample per physical queue at `at`: how many of its lanes are
-- held, how many have waiters and how many backends wait (ungranted lane
-- locks, class awa._lock_class_lane(), in this database), the most lanes
-- held at once in one priority, and the sum of its lane sequences. Samples older
-- than one hour are pruned. Returns the number of queues sampled.
--
-- One pass over pg_locks, aggregated per lane before it meets the lanes (a
-- hash join): the cost is that pass plus one sequence read per lane.
create or replace function awa._sample_lane_contention(at timestamptz)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    sampled integer;
begin
    with locks as (
        select k.objid::integer as lane_id,
               bool_or(k.granted) as held,
               count(*) filter (where not k.granted)::integer as waiters
          from pg_catalog.pg_locks as k
         where k.locktype = 'advisory'
           and k.classid = awa._lock_class_lane()
           and k.objsubid = 2
           and k.database = (
               select d.oid from pg_catalog.pg_database as d
                where d.datname = pg_catalog.current_database()
           )
         group by k.objid
    ),
    per_priority as (
        select n.queue_id,
               count(*)::integer as lanes,
               count(*) filter (where k.held)::integer as lanes_held,
               count(*) filter (where k.waiters > 0)::integer as lanes_waited,
               coalesce(sum(k.waiters), 0)::integer as waiters,
               sum(coalesce(pg_catalog.pg_sequence_last_value(n.seq), 0))::bigint as enqueued
          from awa.lanes as n
          left join locks as k on k.lane_id = n.lane_id
         group by n.queue_id, n.priority
    )
    insert into awa.contention_samples (
        sampled_at, queue_id, lanes, lanes_held, lanes_waited, waiters, enqueued,
        busiest_priority_held
    )
    select at, p.queue_id, sum(p.lanes), sum(p.lanes_held), sum(p.lanes_waited),
           sum(p.waiters), sum(p.enqueued), max(p.lanes_held)
      from per_priority as p
     group by p.queue_id
    on conflict do nothing;
    get diagnostics sampled = row_count;
    delete from awa.contention_samples as s
     where s.sampled_at < at - interval '1 hour';
    return sampled;
end;
$$;

select awa._grant_execute('awa._sample_lane_contention(timestamptz)');

-- Function: awa.sample_lane_contention() returns integer
-- One contention sample now (awa._sample_lane_contention). Role:
-- awa_maintenance. Returns the number of queues sampled.
create or replace function awa.sample_lane_contention()
returns integer
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select awa._sample_lane_contention(pg_catalog.clock_timestamp())
$$;

select awa._grant_execute('awa.sample_lane_contention()', 'maintenance');

-- View: awa.lane_contention, per queue over the last minute of samples.
create or replace view awa.lane_contention as
with recent as (
    select s.*
    from awa.contention_samples as s
    where s.sampled_at > pg_catalog.clock_timestamp() - interval '1 minute'
)

select
    m.queue,
    count(*) as samples,
    avg(r.waiters::numeric / greatest(r.lanes_held, 1)) as mean_waiters_per_held_lane,
    avg((r.lanes_waited > 0)::integer::numeric) as wait_share,
    (max(r.enqueued) - min(r.enqueued))::numeric
    / nullif(extract(epoch from max(r.sampled_at) - min(r.sampled_at)), 0) as enqueue_rate,
    max(r.sampled_at) as last_sample
from recent as r
inner join awa.queue_meta as m on r.queue_id = m.queue_id
group by m.queue;

comment on view awa.lane_contention is
'Per queue over the last minute of awa.sample_lane_contention(): mean backends waiting '
'per held lane, the share of samples with any lane waited for, and enqueues per second.';

select awa._grant_select('awa.lane_contention', 'reader', 'operator');

-- View: awa.queue_history, per physical queue and sample over the last hour
-- (the samples kept): lanes held, backends waiting, the enqueue counter
-- (differences between samples are enqueues), and, for queues in shadow or
-- auto mode, the ready depth and the age of the oldest ready job. The admin
-- page charts it.
create or replace view awa.queue_history as
select
    s.sampled_at,
    m.queue,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    s.lanes_held,
    s.waiters,
    s.enqueued,
    s.ready,
    s.sampled_at - s.oldest_ready_at as lag
from awa.contention_samples as s
inner join awa.queue_meta as m on s.queue_id = m.queue_id;

comment on view awa.queue_history is
'Per physical queue and contention sample (the last hour): lanes held, backends waiting, '
'the sum of the lane sequences (its difference between samples is enqueues), and ready '
'depth and lag (oldest ready job) where the auto-scaler counted them (shadow or auto mode).';

select awa._grant_select('awa.queue_history', 'reader', 'operator');
