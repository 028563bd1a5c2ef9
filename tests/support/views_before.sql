-- tests/support/views_before.sql: awa.queue_overview and awa.lane_overview
-- as they were before they read their lanes and counters in place
-- (commit 9df3c08, sql/views.sql): the functions they called, one set per
-- queue, and the two views, in schema `before`, made by a superuser. The
-- oracle of tests/test_overview_differential.py; nothing else reads it.

create schema before;

create or replace function before._lane_states(queue_id integer)
returns table (
    lane_id integer,
    priority smallint,
    shard smallint,
    ready bigint,
    oldest_ready_at timestamptz,
    next_seq bigint,
    head_seq bigint
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    -- awa.lane_hints is unlogged: a standby cannot read it, and starts at
    -- the beginning of each lane instead.
    hints boolean := not pg_is_in_recovery();
begin
    if hints then
        return query
        select
            l.lane_id, l.priority, l.shard,
            case when f.lane_seq is null then 0
                 else pg_sequence_last_value(l.seq) - f.lane_seq + 1 end,
            f.ready_at,
            coalesce(pg_sequence_last_value(l.seq), 0) + 1,
            f.lane_seq
          from awa.lanes as l
          cross join lateral (
              -- The lane's claim hint: its highest (ADR 030).
              select coalesce(max(hint.head_seq), 0) as head_seq
                from awa.lane_hints as hint
               where hint.lane_id = l.lane_id
          ) as h
          left join lateral (
              select r.lane_seq, r.ready_at
                from awa.ready as r
               where r.lane_id = l.lane_id and r.lane_seq >= h.head_seq
               order by r.lane_seq
               limit 1
          ) as f on true
         where l.queue_id = _lane_states.queue_id;
    else
        -- Nor is a sequence exact there: it reads as the primary last logged
        -- it, up to 32 past the last lane_seq handed out. The span ends at
        -- the lane's last ready row instead.
        return query
        select
            l.lane_id, l.priority, l.shard,
            coalesce(t.lane_seq - f.lane_seq + 1, 0),
            f.ready_at,
            coalesce(pg_sequence_last_value(l.seq), 0) + 1,
            f.lane_seq
          from awa.lanes as l
          left join lateral (
              select r.lane_seq, r.ready_at
                from awa.ready as r
               where r.lane_id = l.lane_id
               order by r.lane_seq
               limit 1
          ) as f on true
          left join lateral (
              select r.lane_seq
                from awa.ready as r
               where r.lane_id = l.lane_id
               order by r.lane_seq desc
               limit 1
          ) as t on true
         where l.queue_id = _lane_states.queue_id;
    end if;
end;
$$;

create or replace function before._scheduled_capped(queue_id integer)
returns bigint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_bitmapscan = off
as $$
    select count(*)
      from (
          select from awa.scheduled as x
           where x.queue_id = _scheduled_capped.queue_id
           limit 10000
      ) as capped
$$;

create or replace function before._finished_totals(queue_id integer)
returns table (
    completed bigint,
    failed bigint,
    cancelled bigint,
    retain_completed interval,
    retain_failed interval
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        coalesce(pg_sequence_last_value(m.completed_seq), 0),
        coalesce(pg_sequence_last_value(m.failed_seq), 0),
        coalesce(pg_sequence_last_value(m.cancelled_seq), 0),
        awa._retention('completed', m.retain_completed, m.retain_failed),
        awa._retention('failed', m.retain_completed, m.retain_failed)
      from awa.queue_meta as m
     where m.queue_id = _finished_totals.queue_id
$$;

create or replace function before._retried_total(queue_id integer)
returns bigint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(pg_sequence_last_value(m.retried_seq), 0)
      from awa.queue_meta as m
     where m.queue_id = _retried_total.queue_id
$$;

create or replace function before._run_policy(queue_id integer)
returns table (
    max_run_time interval,
    retry_base interval,
    retry_cap interval,
    retry_jitter numeric
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        m.max_run_time,
        coalesce(m.retry_base, awa._retry_default_base()),
        coalesce(m.retry_cap, awa._retry_default_cap()),
        coalesce(m.retry_jitter, awa._retry_default_jitter())
      from awa.queue_meta as m
     where m.queue_id = _run_policy.queue_id
$$;

create view before.queue_overview as
select
    m.queue,
    m.enqueue_shards,
    m.shard_mode,
    m.max_shards,
    m.paused,
    coalesce(r.ready, 0)::bigint as ready,
    coalesce(ru.running, 0) as running,
    s.scheduled,
    t.failed,
    t.completed,
    -- A job made ready after this transaction began (ready_at is the clock at
    -- its insert) is visible to a later statement: not a negative age.
    greatest(interval '0', now() - r.oldest_ready_at) as oldest_ready_age,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    m.stripes,
    m.partitions,
    t.cancelled,
    t.retain_completed,
    t.retain_failed,
    p.max_run_time,
    p.retry_base,
    p.retry_cap,
    p.retry_jitter,
    before._retried_total(m.queue_id) as retried
from awa.queue_meta as m
cross join lateral (
    select
        sum(x.ready) as ready,
        min(x.oldest_ready_at) as oldest_ready_at
    from before._lane_states(m.queue_id) as x
) as r
cross join lateral before._finished_totals(m.queue_id) as t
cross join lateral before._run_policy(m.queue_id) as p
cross join lateral before._scheduled_capped(m.queue_id) as s (scheduled)
left join (
    select
        x.queue_id,
        count(*) as running
    from awa.running as x
    group by x.queue_id
) as ru on m.queue_id = ru.queue_id;

create view before.lane_overview as
select
    m.queue,
    l.priority,
    l.shard,
    l.lane_id,
    l.shard >= m.enqueue_shards and l.ready > 0 as draining,
    l.ready,
    greatest(interval '0', now() - l.oldest_ready_at) as lag,
    l.next_seq,
    l.head_seq as claim_position,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    -- The shards awa.claim walks: awa._walked_shards, written out here since
    -- the view runs with its reader's rights and that function is the owner's.
    l.shard < greatest(m.lane_shards, m.enqueue_shards) as walked
from awa.queue_meta as m
cross join lateral before._lane_states(m.queue_id) as l;
