-- contention.sql: the lane-contention signal for operators and the
-- auto-scaler. Producers of any language show up here: it reads pg_locks.

-- Function: awa.sample_lane_contention() returns integer
-- Records one sample per physical queue: how many of its lanes are held,
-- how many have waiters and how many backends wait (ungranted awa lane
-- locks, class 1635213644, in this database), and the sum of its lane
-- sequences. Samples older than one hour are pruned. Role: awa_maintenance.
-- Returns the number of queues sampled.
create or replace function awa.sample_lane_contention()
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    sampled integer;
    -- One instant for every queue's row, so rows of one sample group together.
    at timestamptz := pg_catalog.clock_timestamp();
begin
    with locks as (
        select l.objid::integer as lane_id, l.granted
          from pg_catalog.pg_locks as l
         where l.locktype = 'advisory'
           and l.classid = 1635213644
           and l.objsubid = 2
           and l.database = (
               select d.oid from pg_catalog.pg_database as d
                where d.datname = pg_catalog.current_database()
           )
    ),
    per_queue as (
        select
            n.queue_id,
            count(*)::integer as lanes,
            count(*) filter (
                where exists (select from locks as k where k.lane_id = n.lane_id and k.granted)
            )::integer as lanes_held,
            count(*) filter (
                where exists (
                    select from locks as k where k.lane_id = n.lane_id and not k.granted
                )
            )::integer as lanes_waited,
            coalesce(sum((
                select count(*) from locks as k where k.lane_id = n.lane_id and not k.granted
            )), 0)::integer as waiters,
            sum(coalesce(pg_catalog.pg_sequence_last_value(n.seq), 0))::bigint as enqueued
          from awa.lanes as n
         group by n.queue_id
    ),
    held_per_priority as (
        select n.queue_id, n.priority, count(*)::integer as held
          from awa.lanes as n
         where exists (select from locks as k where k.lane_id = n.lane_id and k.granted)
         group by n.queue_id, n.priority
    )
    insert into awa.contention_samples (
        sampled_at, queue_id, lanes, lanes_held, lanes_waited, waiters, enqueued,
        busiest_priority_held
    )
    select at, p.queue_id, p.lanes, p.lanes_held, p.lanes_waited, p.waiters, p.enqueued,
           coalesce((
               select max(h.held) from held_per_priority as h where h.queue_id = p.queue_id
           ), 0)
      from per_queue as p
    on conflict do nothing;
    get diagnostics sampled = row_count;
    delete from awa.contention_samples as s
     where s.sampled_at < at - interval '1 hour';
    return sampled;
end;
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
