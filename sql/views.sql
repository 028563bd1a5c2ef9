-- views.sql: read-only views for dashboards, the CLI and the admin page.
-- Granted to awa_reader and awa_operator.

-- Function: awa._lane_next_seq(lane_id integer) returns bigint
-- The lane_seq the lane's next job will get. A definer because reading a
-- sequence needs a privilege on it, which only the owner role has.
-- Calls: nothing
-- Writes: nothing
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

-- Function: awa._lane_states(queue_id integer)
-- Per lane of one physical queue, from its sequence and its first live row
-- (found from the claim hint, awa.lane_hints): the ready depth as the span
-- of lane_seqs from that row to the last one handed out, its ready_at, the
-- next lane_seq and the claim position. A probe and a sequence read per
-- lane: the cost of the queue's shape, never of its backlog or history.
-- The span counts as ready the lane_seqs of enqueues still in flight or
-- rolled back after that row (exact counts: awa.queue_counts). On a
-- standby the span ends at the lane's last ready row (a sequence there is
-- up to 32 ahead), and next_seq may be up to 32 ahead. A definer: reading
-- a sequence needs a privilege only the owner role has.
-- Role: awa_reader, awa_operator.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_states(queue_id integer)
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

-- Function: awa._scheduled_capped(queue_id integer) returns bigint
-- The queue's scheduled jobs, counted up to 10,000: a count at the cap means
-- at least that many. Read from the queue's own index only. In the view, the
-- queue is a parameter whose rows the planner estimates as the table's
-- average; once one queue held most of awa.scheduled, it took a sequential
-- scan (or a walk of the primary key) that read every other queue's rows
-- to count one. A definer: the reader roles may not read awa.scheduled.
-- Volatile, as the job tools are: its query takes its snapshot once it
-- holds the table, so a read that waited for awa.compact_scheduled's
-- rewrite counts the rows it left; a stable function reads with the
-- calling statement's snapshot, taken before the wait, and counted none.
-- Role: awa_reader, awa_operator.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._scheduled_capped(queue_id integer)
returns bigint
language sql
volatile
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

select awa._grant_execute('awa._scheduled_capped(integer)', 'reader', 'operator');

-- Function: awa._finished_totals(queue_id integer)
-- The queue's terminal counters (awa._provision_counters): jobs completed,
-- failed and cancelled since the counters were made, whatever retention
-- removed since. Non-transactional, as sequences are: a finish that rolls
-- back still counts. And the retention in force for each. A definer for the
-- same reason as awa._lane_states, and to apply awa._retention, which only
-- the owner may call.
-- Role: awa_reader, awa_operator.
-- Calls: awa._retention
-- Writes: nothing
create or replace function awa._finished_totals(queue_id integer)
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

select awa._grant_execute('awa._lane_states(integer)', 'reader', 'operator');
select awa._grant_execute('awa._finished_totals(integer)', 'reader', 'operator');

-- Function: awa._retried_total(queue_id integer) returns bigint
-- The queue's counter of failed attempts scheduled for a retry
-- (awa._retry_or_fail), since the counter was made; non-transactional, as
-- awa._finished_totals' counters are. Its own function, not a column of
-- awa._finished_totals, whose result type the view depends on. A definer
-- for the same reason.
-- Role: awa_reader, awa_operator.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retried_total(queue_id integer)
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

select awa._grant_execute('awa._retried_total(integer)', 'reader', 'operator');

-- Function: awa._run_policy(queue_id integer)
-- The queue's max run time (null: none) and its retry policy in force,
-- defaults applied (sql/deadlines.sql). A definer, to apply the defaults,
-- which only the owner may call.
-- Role: awa_reader, awa_operator.
-- Calls: awa._retry_default_base, awa._retry_default_cap, awa._retry_default_jitter
-- Writes: nothing
create or replace function awa._run_policy(queue_id integer)
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

select awa._grant_execute('awa._run_policy(integer)', 'reader', 'operator');

-- Each view below is made as a scratch view (its name after _new_) that
-- awa._ensure_view puts in place only when it differs: CREATE OR REPLACE
-- VIEW would hold every reader of the view off until the layer commits.

-- View: awa.queue_overview, one row per physical queue.
-- Reads what the queue's shape costs (its lanes, its counters, its jobs in
-- flight), never its backlog or history: ready is the lanes' span
-- (awa._lane_states); scheduled counts up to 10,000; completed,
-- failed, cancelled and retried (failed attempts scheduled again) are
-- counters since the counters were made.
-- awa.queue_counts(queue) counts every row, on purpose.
create view awa._new_queue_overview as
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
    awa._retried_total(m.queue_id) as retried
from awa.queue_meta as m
cross join lateral (
    select
        sum(x.ready) as ready,
        min(x.oldest_ready_at) as oldest_ready_at
    from awa._lane_states(m.queue_id) as x
) as r
cross join lateral awa._finished_totals(m.queue_id) as t
cross join lateral awa._run_policy(m.queue_id) as p
cross join lateral awa._scheduled_capped(m.queue_id) as s (scheduled)
left join (
    select
        x.queue_id,
        count(*) as running
    from awa.running as x
    group by x.queue_id
) as ru on m.queue_id = ru.queue_id;

select awa._ensure_view('awa.queue_overview', 'awa._new_queue_overview');

comment on view awa.queue_overview is
'Per physical queue: S, shard mode, paused; ready (the span of its lanes'' live lane_seqs), '
'running, scheduled (counted up to 10,000), and counters of completed, failed and cancelled '
'jobs; age of the oldest ready job; retention; max run time (null: none) and retry policy '
'in force; retried, a counter of failed attempts scheduled for a retry. logical_queue '
'names the logical queue a partition or stripe belongs to (itself otherwise); stripes is '
'K; partitions is P for a partitioned logical queue. Its cost follows queues and lanes, '
'not jobs: exact counts are awa.queue_counts(queue).';

-- Function: awa.queue_counts(queue text)
-- Exact job counts of a queue (a logical name covers its partitions and
-- stripes), one row per physical queue: every ready, running, scheduled
-- and kept terminal row is counted. It reads every row, so its cost grows
-- with the backlog and the history: for a dashboard, use
-- awa.queue_overview; call this on purpose.
-- Role: awa_reader, awa_operator.
-- Calls: awa._names_cover
-- Writes: nothing
create or replace function awa.queue_counts(queue text)
returns table (
    queue text,
    ready bigint,
    running bigint,
    scheduled bigint,
    completed_kept bigint,
    failed_kept bigint,
    cancelled_kept bigint
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        m.queue,
        (select count(*) from awa.ready as x where x.queue_id = m.queue_id),
        (select count(*) from awa.running as x where x.queue_id = m.queue_id),
        (select count(*) from awa.scheduled as x where x.queue_id = m.queue_id),
        (select count(*) from awa.finished as x
          where x.queue_id = m.queue_id and x.state = 'completed'),
        (select count(*) from awa.finished as x
          where x.queue_id = m.queue_id and x.state = 'failed'),
        (select count(*) from awa.finished as x
          where x.queue_id = m.queue_id and x.state = 'cancelled')
      from awa.queue_meta as m
     where awa._names_cover(array[queue_counts.queue], m.queue, m.logical_queue, m.root_queue)
     order by m.queue
$$;

select awa._grant_execute('awa.queue_counts(text)', 'reader', 'operator');

-- Function: awa.covered_queues(name text) returns setof text
-- The physical queues a name covers, as a claim, a pause or
-- awa.queue_counts reads it: the queue of that name, the partitions of the
-- logical queue it names and the stripes of either. For a filter by name
-- over awa.queue_overview and awa.lane_overview, whose logical_queue names
-- a stripe's root only (a partition's stripes name the logical queue, not
-- the partition). None for an unknown or null name. Cost: an index read
-- per column of awa.queue_meta, whatever the jobs.
-- Role: awa_reader, awa_operator.
-- Calls: awa._names_cover
-- Writes: nothing
create or replace function awa.covered_queues(name text)
returns setof text
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select m.queue
      from awa.queue_meta as m
     where awa._names_cover(array[covered_queues.name], m.queue, m.logical_queue,
                            m.root_queue)
     order by m.queue
$$;

select awa._grant_execute('awa.covered_queues(text)', 'reader', 'operator');

-- View: awa.lane_overview, one row per lane.
create view awa._new_lane_overview as
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
cross join lateral awa._lane_states(m.queue_id) as l;

select awa._ensure_view('awa.lane_overview', 'awa._new_lane_overview');

comment on view awa.lane_overview is
'Per lane: ready depth (the span of its live lane_seqs), lag (age of its oldest ready job), '
'the next lane_seq it will hand out, and the claim position (lane_seq of its head). '
'draining: shard >= the current S with ready jobs left. walked: claims still visit the '
'lane; false once awa.retire_lanes() has taken it, empty, out of their walk (ADR 041).';

select awa._grant_select('awa.queue_overview', 'reader', 'operator');
select awa._grant_select('awa.lane_overview', 'reader', 'operator');

select awa._grant_select('awa.shard_changes', 'reader', 'operator');
