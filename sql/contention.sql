-- contention.sql: the lane-contention signal for operators and the
-- auto-scaler. Producers of any language show up here: it reads pg_locks.

-- Function: awa._sample_lane_contention(at timestamptz) returns integer
-- Records one sample per physical queue at `at`: how many of its lanes are
-- held, how many have waiters and how many backends wait (ungranted lane
-- locks, class awa._lock_class_lane(), in this database), the most lanes
-- held at once in one priority, the most lanes held plus backends waiting
-- in one priority (the auto-scaler sizes S, lanes per priority, from it),
-- and the queue's S as this statement reads it (the auto-scaler judges S
-- on the samples taken at it: a change of S is stamped with its
-- transaction's start, not its commit). Samples older than one hour are
-- pruned. Returns the number of queues sampled.
--
-- One statement: one pass over pg_locks, aggregated per lane; only the
-- locked lanes are looked up in awa.lanes, and each queue's lanes are
-- counted from its awa.queue_meta.lane_ids. Nothing is read per lane: the
-- counts that need a read of each lane (enqueued, ready, oldest_ready_at)
-- are awa._count_lanes', once per tick (ADR 017). Contention is
-- instantaneous and is worth sampling often; a counter read once per tick
-- gives the same rates.
-- Calls: awa._lock_class_lane
-- Writes: awa.contention_samples
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
        -- the lanes that are locked, a handful, not every lane
        select n.queue_id, n.priority,
               count(*) filter (where k.held)::integer as lanes_held,
               count(*) filter (where k.waiters > 0)::integer as lanes_waited,
               sum(k.waiters)::integer as waiters
          from locks as k
          join awa.lanes as n on n.lane_id = k.lane_id
         group by n.queue_id, n.priority
    ),
    per_queue as (
        select p.queue_id, sum(p.lanes_held) as lanes_held,
               sum(p.lanes_waited) as lanes_waited, sum(p.waiters) as waiters,
               max(p.lanes_held) as busiest_priority_held,
               max(p.lanes_held + p.waiters) as busiest_priority_demand
          from per_priority as p
         group by p.queue_id
    ),
    lane_counts as (
        -- from each queue's settings row, which records its lanes, rather
        -- than a pass over every lane
        select m.queue_id, m.enqueue_shards,
               pg_catalog.num_nonnulls(variadic m.lane_ids) as lanes
          from awa.queue_meta as m
         where pg_catalog.num_nonnulls(variadic m.lane_ids) > 0
    ),
    inserted as (
        insert into awa.contention_samples (
            sampled_at, queue_id, lanes, lanes_held, lanes_waited, waiters,
            busiest_priority_held, busiest_priority_demand, enqueue_shards
        )
        select at, c.queue_id, c.lanes, coalesce(q.lanes_held, 0), coalesce(q.lanes_waited, 0),
               coalesce(q.waiters, 0), coalesce(q.busiest_priority_held, 0),
               coalesce(q.busiest_priority_demand, 0), c.enqueue_shards
          from lane_counts as c
          left join per_queue as q on q.queue_id = c.queue_id
        on conflict do nothing
        returning 1
    ),
    pruned as (
        delete from awa.contention_samples as s
         where s.sampled_at < at - interval '1 hour'
    )
    select count(*) into sampled from inserted;
    return sampled;
end;
$$;

-- Function: awa._count_lanes(at timestamptz) returns void
-- Completes the samples taken at `at` with what needs a read of each lane
-- (awa._lane_states: a head probe from the claim hint and a sequence read
-- per lane, no scan of the backlog): every queue's enqueue counter, the sum
-- of its lanes' sequences; and for queues in shadow or auto mode the ready
-- depth and the oldest ready job. No nested loop: after an ANALYZE that
-- saw only a few instants (a fresh install, samples pruned, statistics
-- reset by a crash), the instant `at` is estimated at one row, and a
-- nested loop read the lane states of every queue again for each sample
-- row, queues x queues calls (300 queues: 10 s a tick). A hash join reads
-- them once.
-- Calls: awa._lane_states
-- Writes: awa.contention_samples
create or replace function awa._count_lanes(at timestamptz)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set enable_nestloop = off
as $$
begin
    update awa.contention_samples as s
       set enqueued = d.enqueued, ready = d.ready, oldest_ready_at = d.oldest_ready_at
      from (
          select m.queue_id,
                 sum(x.next_seq - 1)::bigint as enqueued,
                 case when m.shard_mode <> 'manual' then coalesce(sum(x.ready), 0) end
                     ::bigint as ready,
                 case when m.shard_mode <> 'manual' then min(x.oldest_ready_at) end
                     as oldest_ready_at
            from awa.queue_meta as m
           cross join lateral awa._lane_states(m.queue_id) as x
           group by m.queue_id, m.shard_mode
      ) as d
     where s.queue_id = d.queue_id and s.sampled_at = at;
end;
$$;

select awa._grant_execute('awa._sample_lane_contention(timestamptz)');
select awa._grant_execute('awa._count_lanes(timestamptz)');

-- Function: awa.sample_lane_contention() returns integer
-- One contention sample now (awa._sample_lane_contention): lanes held and
-- waited for, without the per-lane counts awa.autoscale_tick adds to its
-- own sample. Role: awa_maintenance. Returns the number of queues sampled.
-- Calls: awa._sample_lane_contention
-- Writes: nothing
create or replace function awa.sample_lane_contention()
returns integer
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select awa._sample_lane_contention(pg_catalog.clock_timestamp())
$$;

select awa._grant_execute('awa.sample_lane_contention()', 'maintenance');

-- Each view below is made as a scratch view (its name after _new_) that
-- awa._ensure_view puts in place only when it differs: CREATE OR REPLACE
-- VIEW would hold every reader of the view off until the layer commits.

-- View: awa.lane_contention, per queue over the last minute of samples,
-- the minute before the reading transaction began: now(), not
-- clock_timestamp(), which is volatile, so the planner could not use the
-- index on sampled_at and every read (each scrape, each refresh of the
-- admin page) went through the whole hour kept for every queue.
create view awa._new_lane_contention as
with recent as (
    select s.*
    from awa.contention_samples as s
    where s.sampled_at > pg_catalog.now() - interval '1 minute'
)

select
    m.queue,
    count(*) as samples,
    avg(r.waiters::numeric / greatest(r.lanes_held, 1)) as mean_waiters_per_held_lane,
    avg((r.lanes_waited > 0)::integer::numeric) as wait_share,
    (max(r.enqueued) - min(r.enqueued))::numeric
    / nullif(extract(epoch from max(r.sampled_at) filter (where r.enqueued is not null)
        - min(r.sampled_at) filter (where r.enqueued is not null)), 0) as enqueue_rate,
    max(r.sampled_at) as last_sample
from recent as r
inner join awa.queue_meta as m on r.queue_id = m.queue_id
group by m.queue;

select awa._ensure_view('awa.lane_contention', 'awa._new_lane_contention');

comment on view awa.lane_contention is
'Per queue over the last minute of contention samples: mean backends waiting per held '
'lane, the share of samples with any lane waited for, and enqueues per second (from the '
'samples of awa.autoscale_tick(), which read the enqueue counter).';

select awa._grant_select('awa.lane_contention', 'reader', 'operator');

-- View: awa.queue_history, per physical queue and sample over the last hour
-- (the samples kept): lanes held, backends waiting, and in the samples of
-- awa.autoscale_tick the enqueue counter (differences between samples are
-- enqueues) and, for queues in shadow or auto mode, the ready depth and the
-- age of the oldest ready job. The admin page charts it.
create view awa._new_queue_history as
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

select awa._ensure_view('awa.queue_history', 'awa._new_queue_history');

comment on view awa.queue_history is
'Per physical queue and contention sample (the last hour): lanes held, backends waiting, '
'and where awa.autoscale_tick() counted the lanes the sum of the lane sequences (its '
'difference between samples is enqueues; null in a sample taken alone), and ready depth and '
'lag (oldest ready job) for queues in shadow or auto mode.';

select awa._grant_select('awa.queue_history', 'reader', 'operator');
