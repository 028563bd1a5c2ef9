-- views.sql: read-only views for dashboards, the CLI and the admin page.
-- Granted to awa_reader and awa_operator.

-- Function: awa._sequence_value(seq regclass) returns bigint
-- The last value sequence `seq` handed out: null when it has handed out
-- none, and for no sequence (null) or one that is gone. What
-- pg_sequence_last_value says; on PostgreSQL 18 read through
-- pg_get_sequence_data instead, which lets go of the sequence's lock once
-- it has read it: pg_sequence_last_value keeps a lock on each sequence it
-- reads to the end of the transaction, so a read of every queue's lanes
-- and counters took a slot of the shared lock table per sequence, 80,000
-- for 10,000 queues at S = 1, past what max_locks_per_transaction gives
-- (64 x the connections), and failed with 53200 (out of shared memory).
-- On PostgreSQL 17 it still does. Not a definer: its callers are.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._sequence_value(seq regclass)
returns bigint
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    found record;
begin
    if pg_catalog.current_setting('server_version_num')::integer >= 180000 then
        -- Parsed when first run: PostgreSQL 17 has no such function.
        found := pg_catalog.pg_get_sequence_data(seq);
        return case when found.is_called then found.last_value end;
    end if;
    return pg_catalog.pg_sequence_last_value(seq);
end;
$$;

select awa._grant_execute('awa._sequence_value(regclass)');

-- Function: awa._lane_next_seq(lane_id integer) returns bigint
-- The lane_seq the lane's next job will get. A definer because reading a
-- sequence needs a privilege on it, which only the owner role has.
-- Calls: awa._sequence_value
-- Writes: nothing
create or replace function awa._lane_next_seq(lane_id integer)
returns bigint
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(awa._sequence_value(l.seq), 0) + 1
      from awa.lanes as l
     where l.lane_id = _lane_next_seq.lane_id
$$;

select awa._grant_execute('awa._lane_next_seq(integer)', 'reader', 'operator');

-- Function: awa._lane_last_seq(lane_id integer) returns bigint
-- The last lane_seq the lane handed out (null: none yet, or no such lane),
-- from its sequence, found by its name (awa._lane_seq_name: one lookup of
-- the catalog's cache), not by a read of awa.lanes: the views call it
-- per lane, and only for what they are asked (a lane's ready span once a
-- live row was found, its next lane_seq when that column is read). A
-- definer: reading a sequence needs a privilege only the owner role has.
-- It reads lane sequences only, whatever it is given.
-- Role: awa_reader, awa_operator.
-- Calls: awa._lane_seq_name, awa._sequence_value
-- Writes: nothing
create or replace function awa._lane_last_seq(lane_id integer)
returns bigint
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return awa._sequence_value(pg_catalog.to_regclass(
        pg_catalog.format('awa.%I', awa._lane_seq_name(_lane_last_seq.lane_id))));
end;
$$;

select awa._grant_execute('awa._lane_last_seq(integer)', 'reader', 'operator');

-- Function: awa._queue_counter(queue_id integer, counter text) returns bigint
-- One of the queue's counters (awa._provision_counters): jobs completed,
-- failed or cancelled, or failed attempts scheduled again ('retried'),
-- since the counter was made, whatever retention removed since; 0 when it
-- has counted none, or the queue has no such counter. Non-transactional,
-- as sequences are: a finish that rolls back still counts. Found by its
-- name (awa._counter_seq_name), as awa._lane_last_seq finds a lane's. A
-- definer for the same reason; it reads those four sequences of a queue
-- only.
-- Role: awa_reader, awa_operator.
-- Errors: 22023 another counter.
-- Calls: awa._counter_seq_name, awa._sequence_value
-- Writes: nothing
create or replace function awa._queue_counter(queue_id integer, counter text)
returns bigint
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if counter is null
       or counter <> all (array['completed', 'failed', 'cancelled', 'retried']) then
        raise exception 'no counter %', coalesce(counter, 'null') using errcode = '22023';
    end if;
    return coalesce(awa._sequence_value(pg_catalog.to_regclass(
        pg_catalog.format('awa.%I', awa._counter_seq_name(_queue_counter.queue_id, counter)))),
        0);
end;
$$;

select awa._grant_execute('awa._queue_counter(integer, text)', 'reader', 'operator');

-- Function: awa._lane_starts(queue_id integer)
-- Per lane of one physical queue, where the views start looking for its
-- first live row: its claim hint, awa.lane_hints' highest for the lane
-- (ADR 030), or 0 when it has none. One call per queue, one statement: the
-- views probe awa.ready from there themselves, and read the lane's
-- sequence only for what they are asked. awa.lane_hints is unlogged: a
-- standby cannot read it (nor plan a statement that names it, hence a
-- function and not the views' own join), so there every lane starts at 0
-- and span_end is the lane's last ready row, where the ready span ends (a
-- sequence there is up to 32 ahead); span_end is null on a primary, where
-- the lane's sequence ends it. A definer: the reader roles may not read
-- awa.lane_hints.
-- Role: awa_reader, awa_operator.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lane_starts(queue_id integer)
returns table (
    lane_id integer,
    priority smallint,
    shard smallint,
    hint bigint,
    span_end bigint
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    if not pg_is_in_recovery() then
        return query
        select
            l.lane_id, l.priority, l.shard,
            coalesce((
                select max(h.head_seq)
                  from awa.lane_hints as h
                 where h.lane_id = l.lane_id
            ), 0),
            null::bigint
          from awa.lanes as l
         where l.queue_id = _lane_starts.queue_id;
    else
        return query
        select
            l.lane_id, l.priority, l.shard, 0::bigint,
            (select r.lane_seq
               from awa.ready as r
              where r.lane_id = l.lane_id
              order by r.lane_seq desc
              limit 1)
          from awa.lanes as l
         where l.queue_id = _lane_starts.queue_id;
    end if;
end;
$$;

select awa._grant_execute('awa._lane_starts(integer)', 'reader', 'operator');

-- Function: awa._lane_states(queue_id integer)
-- Per lane of one physical queue, from its sequence and its first live row
-- (found from the claim hint, awa.lane_hints): the ready depth as the span
-- of lane_seqs from that row to the last one handed out, its ready_at, the
-- next lane_seq and the claim position. A probe and a sequence read per
-- lane: the cost of the queue's shape, never of its backlog or history.
-- The span counts as ready the lane_seqs of enqueues still in flight or
-- rolled back after that row (exact counts: awa.queue_counts). On a
-- standby the span ends at the lane's last ready row (a sequence there is
-- up to 32 ahead), and next_seq may be up to 32 ahead. For the job tools
-- and the auto-scaler's tick, which want every column; the views read the
-- same from awa._lane_starts, a lane's sequence only when asked. A
-- definer: reading a sequence needs a privilege only the owner role has.
-- Role: awa_reader, awa_operator.
-- Calls: awa._sequence_value
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
                 else s.last_seq - f.lane_seq + 1 end,
            f.ready_at,
            coalesce(s.last_seq, 0) + 1,
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
          -- The lane's sequence, read once.
          cross join lateral (select awa._sequence_value(l.seq) as last_seq offset 0) as s
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
            coalesce(awa._sequence_value(l.seq), 0) + 1,
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

-- Function: awa.scheduled_overdue() returns interval
-- How long the oldest job of awa.scheduled has been due: now() less the
-- smallest run_at, 0 when none is due (or none waits). awa.promote_due moves
-- a due job into its lane within about a second; an age that keeps growing
-- says promotion is behind: nothing runs it, or a transaction holds the lane
-- the job goes to (a producer's left open after an enqueue), whose due rows
-- awa.promote_due leaves where they are. Every queue's: awa.scheduled has no
-- index on (queue, run_at) to read a queue's oldest from. Cost: the first
-- entry of scheduled_run_at_idx, past the dead entries of jobs promoted
-- since vacuum last ran, which awa.promote_due walks too on each call
-- (while a snapshot is held, awa.compact_scheduled rewrites them away if at
-- most 100,000 jobs wait). A definer: the
-- reader roles may not read awa.scheduled. Volatile, as
-- awa._scheduled_capped is.
-- Role: awa_reader, awa_operator.
-- Calls: nothing
-- Writes: nothing
create or replace function awa.scheduled_overdue()
returns interval
language sql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_bitmapscan = off
as $$
    select greatest(interval '0', now() - min(s.run_at))
      from awa.scheduled as s
$$;

select awa._grant_execute('awa.scheduled_overdue()', 'reader', 'operator');

select awa._grant_execute('awa._lane_states(integer)', 'reader', 'operator');

-- Function: awa._policy_defaults()
-- The retention and the retry policy a queue has when it sets none of its
-- own (sql/retention.sql, sql/deadlines.sql), for awa.queue_overview to
-- fill in: once per read of the view, not once per queue. A definer: only
-- the owner may call those functions, which the planner inlines.
-- Role: awa_reader, awa_operator.
-- Calls: awa._retention, awa._retry_default_base, awa._retry_default_cap, awa._retry_default_jitter
-- Writes: nothing
create or replace function awa._policy_defaults()
returns table (
    retain_completed interval,
    retain_failed interval,
    retry_base interval,
    retry_cap interval,
    retry_jitter numeric
)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
rows 1
as $$
    select
        awa._retention('completed', null, null),
        awa._retention('failed', null, null),
        awa._retry_default_base(),
        awa._retry_default_cap(),
        awa._retry_default_jitter()
$$;

select awa._grant_execute('awa._policy_defaults()', 'reader', 'operator');

-- Each view below is made as a scratch view (its name after _new_) that
-- awa._ensure_view puts in place only when it differs: CREATE OR REPLACE
-- VIEW would hold every reader of the view off until the layer commits.

-- View: awa.queue_overview, one row per physical queue.
-- Reads what the queue's shape costs (its lanes, its counters, its jobs in
-- flight), never its backlog or history: ready is the lanes' span (from
-- each lane's first live row, found from its claim hint, to the last
-- lane_seq its sequence handed out); scheduled counts up to 10,000;
-- completed, failed, cancelled and retried (failed attempts scheduled
-- again) are counters since the counters were made.
-- Per queue: one call of awa._lane_starts, a probe of awa.ready per lane,
-- a sequence read per lane that holds a ready job, one per counter read,
-- and the capped count of scheduled jobs; a column not read costs
-- nothing (ready and oldest_ready_age share the lanes' reads). Every read
-- is an index probe or a function of the queue's own: the cost grows
-- with the queues and their lanes, not with their jobs.
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
    awa._scheduled_capped(m.queue_id) as scheduled,
    awa._queue_counter(m.queue_id, 'failed') as failed,
    awa._queue_counter(m.queue_id, 'completed') as completed,
    -- A job made ready after this transaction began (ready_at is the clock at
    -- its insert) is visible to a later statement: not a negative age.
    greatest(interval '0', now() - r.oldest_ready_at) as oldest_ready_age,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    m.stripes,
    m.partitions,
    awa._queue_counter(m.queue_id, 'cancelled') as cancelled,
    -- Each default a subquery of no column: read once per statement.
    coalesce(m.retain_completed, (select d.retain_completed from awa._policy_defaults() as d))
        as retain_completed,
    coalesce(m.retain_failed, (select d.retain_failed from awa._policy_defaults() as d))
        as retain_failed,
    m.max_run_time,
    coalesce(m.retry_base, (select d.retry_base from awa._policy_defaults() as d))
        as retry_base,
    coalesce(m.retry_cap, (select d.retry_cap from awa._policy_defaults() as d)) as retry_cap,
    coalesce(m.retry_jitter, (select d.retry_jitter from awa._policy_defaults() as d))
        as retry_jitter,
    awa._queue_counter(m.queue_id, 'retried') as retried
from awa.queue_meta as m
-- A left join of one row: left out of a read of neither ready nor
-- oldest_ready_age.
left join lateral (
    select
        sum(f.ready) as ready,
        min(f.ready_at) as oldest_ready_at
    from awa._lane_starts(m.queue_id) as l
    -- The lane's first live row from its hint, and the span from it to the
    -- span's end: as in awa.lane_overview, which reads it the same way.
    cross join lateral (
        select
            x.ready_at,
            coalesce(l.span_end, awa._lane_last_seq(l.lane_id)) - x.lane_seq + 1 as ready
        from awa.ready as x
        where x.lane_id = l.lane_id and x.lane_seq >= l.hint
        order by x.lane_seq
        limit 1
    ) as f
) as r on true
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
-- awa.queue_overview; call this on purpose. Volatile, as
-- awa._scheduled_capped is: a call that waited for a rewrite's or a
-- prune's TRUNCATE counts what it left (a stable function read with the
-- statement's snapshot, taken before the wait, and counted none; a drop's
-- question then named no kept jobs). A snapshot older than a rewrite is
-- refused (40001, awa._check_snapshot_current).
-- Role: awa_reader, awa_operator.
-- Calls: awa._check_snapshot_current, awa._names_cover
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
volatile
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
       -- After the statement's start locked every table it reads.
       and awa._check_snapshot_current()
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
-- Per queue one call of awa._lane_starts, then per lane a probe of
-- awa.ready from where its live rows start; its sequence is read for a
-- lane that holds a ready job (its span) and for next_seq when that column
-- is read: the metrics scrape reads no lane's sequence of an empty lane.
create view awa._new_lane_overview as
select
    m.queue,
    l.priority,
    l.shard,
    l.lane_id,
    l.shard >= m.enqueue_shards and coalesce(f.ready, 0) > 0 as draining,
    coalesce(f.ready, 0) as ready,
    greatest(interval '0', now() - f.ready_at) as lag,
    coalesce(awa._lane_last_seq(l.lane_id), 0) + 1 as next_seq,
    f.lane_seq as claim_position,
    coalesce(m.root_queue, m.logical_queue, m.queue) as logical_queue,
    -- The shards awa.claim walks: awa._walked_shards, written out here since
    -- the view runs with its reader's rights and that function is the owner's.
    l.shard < greatest(m.lane_shards, m.enqueue_shards) as walked
from awa.queue_meta as m
cross join lateral awa._lane_starts(m.queue_id) as l
-- The lane's first live row from where its live rows start; the span from
-- it to the span's end (the last lane_seq the lane's sequence handed out,
-- or on a standby its last ready row). The span counts as ready the
-- lane_seqs of enqueues still in flight or rolled back after that row.
left join lateral (
    select
        x.lane_seq,
        x.ready_at,
        coalesce(l.span_end, awa._lane_last_seq(l.lane_id)) - x.lane_seq + 1 as ready
    from awa.ready as x
    where x.lane_id = l.lane_id and x.lane_seq >= l.hint
    order by x.lane_seq
    limit 1
) as f on true;

select awa._ensure_view('awa.lane_overview', 'awa._new_lane_overview');

comment on view awa.lane_overview is
'Per lane: ready depth (the span of its live lane_seqs), lag (age of its oldest ready job), '
'the next lane_seq it will hand out, and the claim position (lane_seq of its head). '
'draining: shard >= the current S with ready jobs left. walked: claims still visit the '
'lane; false once awa.retire_lanes() has taken it, empty, out of their walk (ADR 041).';

select awa._grant_select('awa.queue_overview', 'reader', 'operator');
select awa._grant_select('awa.lane_overview', 'reader', 'operator');

-- The views called a function per queue for its counters, another for its
-- retried counter and another for its policy; they read them in place now.
-- Dropped here, not in retired.sql: that file runs before this one, while
-- the views of an upgraded database still call them.
drop function if exists awa._finished_totals(integer);
drop function if exists awa._retried_total(integer);
drop function if exists awa._run_policy(integer);

select awa._grant_select('awa.shard_changes', 'reader', 'operator');
