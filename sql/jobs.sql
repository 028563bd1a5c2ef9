-- jobs.sql: the operators' job tools (ADR 025): one job by id, a page of a
-- queue's jobs, and retry and cancel, of one job or many.
--
-- Finding jobs. awa.scheduled, awa.running and awa.finished are read by
-- their keys (job_id; awa.scheduled and awa.finished also by queue).
-- awa.ready has its primary key (lane_id, lane_seq) only, on purpose: an
-- index on job_id would cost every enqueue. So:
--   - one job by id (awa.job, awa.cancel_job) is looked for in the keyed
--     tables first and, only when it is in none of them, in awa.ready
--     lane by lane, each lane bisected for where its ids reach it (ADR
--     031): a ready, an unknown and a pruned job cost the lanes, not the
--     backlog;
--   - a page of ready jobs (awa.jobs) is exact and costs the page and the
--     lanes, not the backlog (ADR 029): within a lane the jobs enqueued
--     there have ids rising with lane_seq, and the others (moved in with an
--     older id) are recorded in awa.ready_late with a stamp, so
--     awa._ready_from finds where a lane's ids pass the cursor by bisecting
--     lane_seq, the lane's own jobs are read from there in lane_seq order,
--     and the moved-in ones by job id from awa.ready_late (its rows match
--     their ready rows by place, lane_id and lane_seq: a lane_seq is handed
--     out once, so one job only ever holds a place).
--
-- Moving jobs. A cancelled job is written by awa._finish (sql/claim.sql),
-- as a failed one is: into the failed-and-cancelled ring of awa.finished,
-- with its args and ordering key, for the failed retention. A retried job
-- goes back into a lane as awa.promote_due moves a due one, through
-- awa._lock_lanes and awa._insert_jobs (sql/enqueue.sql): under its queue's
-- current S, a keyed job to its key's shard, with attempt 0.
--
-- Cancelling a ready job deletes its row: the claim hints (awa.lane_hints)
-- stay true, as a deleted row never comes back. A ready row a claim in
-- flight holds is being claimed: awa.cancel_job waits for that claim (the
-- caller's lock_timeout bounds the wait) and then cancels the job where it
-- is, running or, if the claim rolled back, still ready. The bulk
-- awa.cancel_jobs skips such rows: they run.
--
-- Reading after a rewrite. awa.rotate_running, awa.compact_ready and
-- awa.prune_finished copy the rows they keep and TRUNCATE, holding the
-- table meanwhile. The functions here that read jobs are volatile, not
-- stable: each statement then takes its snapshot once it holds its tables,
-- so a call that waited for a rewrite reads the rows it left. A stable one
-- reads with the snapshot of the statement that called it, taken before
-- the wait: the table empty and the copied rows not yet committed
-- (tests/test_job_tools_rewrites.py).

-- Function: awa._check_job_state(state text) returns void
-- Raises 22023 for a state that is not one of a job's six (null passes:
-- the callers say what null means).
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_job_state(state text)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if state is not null
       and state not in ('scheduled', 'ready', 'running', 'completed', 'failed', 'cancelled') then
        raise exception 'state must be one of scheduled, ready, running, completed, failed, '
                        'cancelled, got %', quote_literal(state)
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._check_max_jobs(what text, value integer) returns void
-- Raises 22004 for null and 22023 outside 1 .. 100000, naming `what`.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._check_max_jobs(what text, value integer)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if value is null then
        raise exception '% must not be null', what
            using errcode = '22004';
    end if;
    if value < 1 or value > 100000 then
        raise exception '% must be between 1 and 100000, got %', what, value
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._ready_lanes(queue_id integer)
--   returns table (lane_id integer, head_seq bigint, next_seq bigint)
-- The lanes of one physical queue that hold ready rows, each with its first
-- live row (looked for from its claim hint, awa._lane_starts) and one past
-- its last row: two index probes a lane. For the job tools, which look only
-- where rows are. No lane's sequence is read, as awa._lane_states reads it:
-- PostgreSQL 17 keeps a lock on each sequence read until the transaction
-- ends, and one a lane of every queue (a job looked up by id) filled the
-- shared lock table (53200 for every session) at a few hundred queues.
-- Calls: awa._lane_starts
-- Writes: nothing
create or replace function awa._ready_lanes(queue_id integer)
returns table (lane_id integer, head_seq bigint, next_seq bigint)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select l.lane_id, h.lane_seq, t.next_seq
      from awa._lane_starts(_ready_lanes.queue_id) as l
     cross join lateral (
         select x.lane_seq
           from awa.ready as x
          where x.lane_id = l.lane_id and x.lane_seq >= l.hint
          order by x.lane_seq
          limit 1
     ) as h
     cross join lateral (
         select x.lane_seq + 1 as next_seq
           from awa.ready as x
          where x.lane_id = l.lane_id
          order by x.lane_seq desc
          limit 1
     ) as t
$$;

-- Function: awa._ready_from(lane, head_seq, next_seq, after) returns bigint
-- The lane_seq from which every live row of a lane has f > after, where f
-- is a row's stamp in awa.ready_late if it has one, else its job id (null
-- if no row has). f never falls as lane_seq rises (ADR 029) and is never
-- below the job id, so no row before it has a job id above after. Bisects
-- [head_seq, next_seq) (the lane's first live row and one past its last,
-- as awa._ready_lanes gives them) with one probe a step: about log2 of the
-- lane's span, whatever its rows.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._ready_from(
    lane integer, head_seq bigint, next_seq bigint, after bigint
)
returns bigint
language plpgsql
stable
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    lo bigint := head_seq;
    top bigint := next_seq;
    mid bigint := head_seq;
    answer bigint;
    at_seq bigint;
    at_f bigint;
begin
    -- Invariant: rows below lo have f <= after; no row at or above top is
    -- before the answer. The first probe is the head: on a first page, or
    -- a cursor behind the lane, it is the answer.
    while lo < top loop
        at_seq := null;
        -- The stamp by a probe per row, never a join that reads the lane's
        -- every awa.ready_late row.
        select r.lane_seq, greatest(r.job_id, (
                   select x.stamp from awa.ready_late as x
                    where x.lane_id = r.lane_id and x.lane_seq = r.lane_seq
               ))
          into at_seq, at_f
          from awa.ready as r
         where r.lane_id = lane and r.lane_seq >= mid and r.lane_seq < top
         order by r.lane_seq
         limit 1;
        if at_seq is null then
            top := mid;
        elsif at_f > after then
            answer := at_seq;
            top := at_seq;
        else
            lo := at_seq + 1;
        end if;
        mid := lo + (top - lo) / 2;
    end loop;
    return answer;
end;
$$;

-- Function: awa._job_at(id bigint)
-- Where job `id` is, in one snapshot (every move of a job is one
-- transaction, so it is in one table at most), with its columns, and for a
-- ready or running job its lane position. The keyed tables first, then
-- awa.ready_late by job id per queue (a job that entered its lane with an
-- older id), then each lane with ready rows, bisected between its first and
-- last rows for where its ids reach `id` (awa._ready_from, ADR 031): the
-- first row whose f (stamp, else job id) is at least `id` is the job's own
-- row if the lane holds it. The LIMIT stops at the first row found. No row
-- for an unknown or pruned job, which costs every lane's bisection: the
-- queues' shape, not the backlog (awa._ready_lanes: no lane's sequence
-- read).
-- Calls: awa._ready_from, awa._ready_lanes
-- Writes: nothing
create or replace function awa._job_at(id bigint)
returns table (
    job_id bigint,
    queue_id integer,
    state text,
    priority smallint,
    kind text,
    args jsonb,
    ordering_key bytea,
    attempt integer,
    max_attempts integer,
    enqueued_at timestamptz,
    run_at timestamptz,
    finished_at timestamptz,
    last_error text,
    worker text,
    lease_expires_at timestamptz,
    lane_id integer,
    lane_seq bigint
)
language sql
volatile
set search_path = pg_catalog, pg_temp
-- Every table is read by a key, every join is a probe per row.
set enable_seqscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
    select j.*
      from (
          select s.job_id, s.queue_id, 'scheduled'::text, s.priority, s.kind, s.args,
                 s.ordering_key, s.attempt, s.max_attempts, s.enqueued_at, s.run_at,
                 null::timestamptz, s.last_error, null::text, null::timestamptz, null::integer,
                 null::bigint
            from awa.scheduled as s
           where s.job_id = _job_at.id
          union all
          select r.job_id, r.queue_id, 'running', r.priority, r.kind, r.args, r.ordering_key,
                 r.attempt, r.max_attempts, r.enqueued_at, r.claimed_at, null, null, r.worker,
                 r.lease_expires_at, r.lane_id, r.lane_seq
            from awa.running as r
           where r.job_id = _job_at.id
          union all
          select f.job_id, f.queue_id, f.state, f.priority, f.kind, f.args, f.ordering_key,
                 f.attempt, f.max_attempts, f.enqueued_at, null, f.finished_at, f.last_error,
                 null, null, null, null
            from awa.finished as f
           where f.job_id = _job_at.id
          union all
          select r.job_id, r.queue_id, 'ready', r.priority, r.kind, r.args, r.ordering_key,
                 r.attempt, r.max_attempts, r.enqueued_at, r.ready_at, null, r.last_error,
                 null, null, r.lane_id, r.lane_seq
            from awa.queue_meta as m
            join awa.ready_late as y on y.queue_id = m.queue_id and y.job_id = _job_at.id
            join awa.ready as r on r.lane_id = y.lane_id and r.lane_seq = y.lane_seq
          union all
          select r.job_id, r.queue_id, 'ready', r.priority, r.kind, r.args, r.ordering_key,
                 r.attempt, r.max_attempts, r.enqueued_at, r.ready_at, null, r.last_error,
                 null, null, r.lane_id, r.lane_seq
            from awa.queue_meta as m
           cross join lateral awa._ready_lanes(m.queue_id) as l
           cross join lateral (
               -- Lanes whose rows are all below `id` give null: no probe.
               select awa._ready_from(l.lane_id, l.head_seq, l.next_seq, _job_at.id - 1) as seq
               offset 0
           ) as f
           cross join lateral (
               -- The row at that place, by key. A join here let the planner
               -- read the whole of awa.ready for the job id instead (an
               -- unknown or rolled-back id, or a table without statistics).
               select x.* from awa.ready as x
                where x.lane_id = l.lane_id and x.lane_seq = f.seq
               offset 0
           ) as r
           where r.job_id = _job_at.id
      ) as j
     limit 1
$$;

-- Function: awa.job(job_id bigint) returns setof awa.job_info
-- One job, whatever its state: one row, or none for an unknown job and for
-- a terminal job retention has removed. Scheduled, running and terminal
-- jobs are found by key; a ready job (and an unknown one) costs a
-- bisection of each lane with ready rows (awa.ready has no index on
-- job_id: ADR 025, ADR 031).
-- Role: awa_reader, awa_operator.
-- Errors: 22004 null job_id; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._check_snapshot_current, awa._job_at
-- Writes: nothing
create or replace function awa.job(job_id bigint)
returns setof awa.job_info
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if job_id is null then
        raise exception 'job_id must not be null'
            using errcode = '22004';
    end if;
    -- Above every id handed out: no job, and no scan.
    if job_id > coalesce(pg_sequence_last_value('awa.job_id_seq'), 0) then
        return;
    end if;
    return query
    select j.job_id, m.queue, coalesce(m.root_queue, m.logical_queue, m.queue), j.kind,
           j.state, j.priority, j.ordering_key, j.args, j.attempt, j.max_attempts,
           j.enqueued_at, j.run_at, j.finished_at, j.last_error, j.worker, j.lease_expires_at
      from awa._job_at(job_id) as j
      join awa.queue_meta as m on m.queue_id = j.queue_id;
    perform awa._check_snapshot_current();
end;
$$;

-- Function: awa.jobs(queue, state, kind, after_job_id, max_jobs, worker)
--   returns setof awa.job_info
-- A page of a queue's jobs (a logical name covers its partitions and
-- stripes), optionally of one state, one kind and, for running jobs, one
-- worker: the max_jobs lowest job_ids above after_job_id, in job_id order.
-- A worker holds running jobs only: with a worker, state null means
-- running, and any other state is an error. Page on with the last
-- job_id of a page as the next after_job_id. Each state is read by its
-- keys, per physical queue, up to max_jobs rows, so a page costs what the
-- page holds, not what the queue or its history holds; with a kind, the
-- rows of other kinds it passes over count too. Ready jobs are read per
-- lane from where its job ids pass after_job_id (awa._ready_from: a
-- bisection of the lane), and those that entered their lane with an older
-- id from awa.ready_late by job id (ADR 029): every ready job is listed.
-- Role: awa_reader, awa_operator.
-- Errors: 22004 null queue or max_jobs; 22023 an unknown state, a worker
-- with a state other than running, max_jobs outside 1 .. 100000, a bad
-- name; 42704 no such queue; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._check_job_state, awa._check_max_jobs, awa._check_snapshot_current, awa._queue_ids,
--   awa._ready_from, awa._ready_lanes
-- Writes: nothing
create or replace function awa.jobs(
    queue text,
    state text default null,
    kind text default null,
    after_job_id bigint default null,
    max_jobs integer default 100,
    worker text default null
)
returns setof awa.job_info
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
-- One plan for every call: planning the union over 64 slots costs more than
-- running it, and the plan is written for any parameter (the ranges below).
set plan_cache_mode = force_generic_plan
-- Every state is read by a key, never by a scan, and every join is a probe
-- per row (a hash join would read a queue's every awa.ready_late row).
set enable_seqscan = off
-- Nor a bitmap scan: it takes every match of the key before the LIMIT.
set enable_bitmapscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
declare
    ids integer[] := awa._queue_ids(queue);
    from_id bigint := coalesce(after_job_id, 0);
    -- The state listed: null for every state.
    listed text;
    terminal text[];
begin
    perform awa._check_job_state(state);
    perform awa._check_max_jobs('max_jobs', max_jobs);
    if worker is not null and state <> 'running' then
        raise exception 'worker % holds running jobs only: state must be running or null, '
                        'got %', quote_literal(worker), quote_literal(state)
            using errcode = '22023';
    end if;
    listed := case when worker is not null then 'running' else state end;
    terminal := case when listed is null then array['completed', 'failed', 'cancelled']
                     when listed in ('completed', 'failed', 'cancelled') then array[listed]
                     else '{}'::text[] end;
    return query
    select j.job_id, m.queue, coalesce(m.root_queue, m.logical_queue, m.queue), j.kind,
           j.state, j.priority, j.ordering_key, j.args, j.attempt, j.max_attempts,
           j.enqueued_at, j.run_at, j.finished_at, j.last_error, j.worker, j.lease_expires_at
      from (
          select s.job_id, s.queue_id, 'scheduled'::text as state, s.priority, s.kind, s.args,
                 s.ordering_key, s.attempt, s.max_attempts, s.enqueued_at, s.run_at,
                 null::timestamptz as finished_at, s.last_error, null::text as worker,
                 null::timestamptz as lease_expires_at
            from unnest(ids) as q (id)
           cross join lateral (
               -- A range on the leading column, not an equality: then only
               -- the (queue_id, job_id) index gives this order, and a generic
               -- plan never walks the primary key instead (it would, where
               -- the statistics see one queue, reading every other queue's
               -- rows too).
               select x.*
                 from awa.scheduled as x
                where x.queue_id between q.id and q.id and x.job_id > from_id
                  and (jobs.kind is null or x.kind = jobs.kind)
                order by x.queue_id, x.job_id
                limit jobs.max_jobs
           ) as s
           where listed is null or listed = 'scheduled'
          union all
          select r.job_id, r.queue_id, 'running', r.priority, r.kind, r.args, r.ordering_key,
                 r.attempt, r.max_attempts, r.enqueued_at, r.claimed_at, null, null, r.worker,
                 r.lease_expires_at
            from (
                -- Running jobs are as many as the workers hold.
                select x.*
                  from awa.running as x
                 where x.queue_id = any(ids) and x.job_id > from_id
                   and (jobs.kind is null or x.kind = jobs.kind)
                   and (jobs.worker is null or x.worker = jobs.worker)
                 order by x.job_id
                 limit jobs.max_jobs
            ) as r
           where listed is null or listed = 'running'
          union all
          select w.job_id, w.queue_id, 'ready', w.priority, w.kind, w.args, w.ordering_key,
                 w.attempt, w.max_attempts, w.enqueued_at, w.ready_at, null, w.last_error,
                 null, null
            from unnest(ids) as q (id)
           cross join lateral awa._ready_lanes(q.id) as l
           cross join lateral (
               -- The lane's own jobs above from_id: in lane_seq order, which
               -- is their job id order, from where their ids pass it.
               select x.*
                 from awa.ready as x
                where x.lane_id = l.lane_id
                  and x.lane_seq >= awa._ready_from(l.lane_id, l.head_seq, l.next_seq, from_id)
                  and x.job_id > from_id and (jobs.kind is null or x.kind = jobs.kind)
                  and not exists (
                      select from awa.ready_late as y
                       where y.lane_id = x.lane_id and y.lane_seq = x.lane_seq
                  )
                order by x.lane_seq
                limit jobs.max_jobs
           ) as w
           where listed is null or listed = 'ready'
          union all
          select v.job_id, v.queue_id, 'ready', v.priority, v.kind, v.args, v.ordering_key,
                 v.attempt, v.max_attempts, v.enqueued_at, v.ready_at, null, v.last_error,
                 null, null
            from unnest(ids) as q (id)
           cross join lateral (
               -- The jobs that entered their lane with an older id, by id
               -- (a range on queue_id, as for awa.scheduled above).
               select x.*
                 from awa.ready_late as y
                 join awa.ready as x on x.lane_id = y.lane_id and x.lane_seq = y.lane_seq
                where y.queue_id between q.id and q.id and y.job_id > from_id
                  and (jobs.kind is null or x.kind = jobs.kind)
                order by y.queue_id, y.job_id
                limit jobs.max_jobs
           ) as v
           where listed is null or listed = 'ready'
          union all
          select f.job_id, f.queue_id, f.state, f.priority, f.kind, f.args, f.ordering_key,
                 f.attempt, f.max_attempts, f.enqueued_at, null, f.finished_at, f.last_error,
                 null, null
            from unnest(ids) as q (id)
           cross join unnest(terminal) as t (st)
           cross join lateral (
               -- A range on state for the same reason: only each slot's
               -- (queue_id, state, job_id) index gives this order, merged;
               -- never a primary key walked past the rows of other states
               -- and queues. queue_id stays an equality, so that the state
               -- range bounds the index scan on PostgreSQL 17 too (it stops
               -- at the state's last row).
               select x.*
                 from awa.finished as x
                where x.queue_id = q.id and x.state between t.st and t.st
                  and x.job_id > from_id and (jobs.kind is null or x.kind = jobs.kind)
                order by x.state, x.job_id
                limit jobs.max_jobs
           ) as f
      ) as j
      join awa.queue_meta as m on m.queue_id = j.queue_id
     order by j.job_id
     limit jobs.max_jobs;
    perform awa._check_snapshot_current();
end;
$$;

-- Function: awa.prune_ready_late(max_rows integer default 10000) returns bigint
-- Removes up to max_rows rows of awa.ready_late whose job has left its lane
-- (claimed, cancelled): those below the lane's first live row (from the
-- claim hint, as awa._lane_states finds it; for an empty lane, below the
-- next lane_seq). A row left behind by a job taken out of turn goes once
-- the lane's head passes it. Rows another transaction holds are skipped.
-- Reads each lane once (the queues' shape) and the rows it removes.
-- Role: awa_maintenance. Returns how many rows it removed.
-- Errors: 22023 max_rows null or below 0; 25000 the transaction is not
--   read committed (a snapshot from before a rewrite of awa.ready sees it
--   empty, every lane's head at its next lane_seq, and would remove the rows
--   of jobs still ready).
-- Calls: awa._check_limit, awa._check_read_committed, awa._note_run
-- Writes: awa.ready_late
create or replace function awa.prune_ready_late(max_rows integer default 10000)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
declare
    removed bigint;
begin
    perform awa._check_limit('max_rows', max_rows);
    perform awa._check_read_committed('awa.prune_ready_late()');
    perform awa._note_run('ready_late');
    delete from awa.ready_late as y
     where y.ctid = any(array(
         select x.ctid
           from awa.lanes as l
           cross join lateral (
               -- The lane's claim hint: its highest (ADR 030).
               select coalesce(max(hint.head_seq), 0) as head_seq
                 from awa.lane_hints as hint
                where hint.lane_id = l.lane_id
           ) as h
          cross join lateral (
              select coalesce(
                  (select r.lane_seq from awa.ready as r
                    where r.lane_id = l.lane_id and r.lane_seq >= h.head_seq
                    order by r.lane_seq
                    limit 1),
                  pg_sequence_last_value(l.seq) + 1,
                  0
              ) as live_from
          ) as b
          cross join lateral (
              select z.ctid from awa.ready_late as z
               where z.lane_id = l.lane_id and z.lane_seq < b.live_from
               order by z.lane_seq
               limit max_rows
                 for update skip locked
          ) as x
          limit max_rows
     ));
    get diagnostics removed = row_count;
    return removed;
end;
$$;

-- Function: awa.count_jobs(queue text, state text, kind text, up_to integer) returns bigint
-- How many jobs of a queue (a logical name covers its partitions and
-- stripes) are in `state`, optionally of one kind, counted up to `up_to`:
-- a count of up_to means at least that many. Reads at most up_to rows,
-- by key (with a kind, the rows of other kinds it passes over too): for a
-- confirmation before a bulk call (the admin page asks it how many jobs a
-- bulk retry or cancel takes). Ready jobs are counted lane by lane from
-- each lane's first live row.
-- Role: awa_reader, awa_operator.
-- Errors: 22004 null queue, state or up_to; 22023 an unknown state, up_to
-- outside 1 .. 100000, a bad name; 42704 no such queue; 40001 a snapshot
-- older than a rewrite (awa._check_snapshot_current).
-- Calls: awa._check_job_state, awa._check_max_jobs, awa._check_snapshot_current, awa._queue_ids,
--   awa._ready_lanes
-- Writes: nothing
create or replace function awa.count_jobs(
    queue text, state text, kind text default null, up_to integer default 10000
)
returns bigint
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
-- A bitmap scan reads every index entry that matches before the limit
-- applies: every row of a terminal state the queue has in its history.
set enable_bitmapscan = off
as $$
declare
    ids integer[] := awa._queue_ids(queue);
    counted bigint;
begin
    if state is null then
        raise exception 'state must not be null'
            using errcode = '22004';
    end if;
    perform awa._check_job_state(state);
    perform awa._check_max_jobs('up_to', up_to);
    select count(*) into counted
      from (
          select 1
            from unnest(ids) as q (id)
           cross join lateral (
               select
                 from awa.scheduled as x
                where x.queue_id = q.id and (count_jobs.kind is null or x.kind = count_jobs.kind)
                limit count_jobs.up_to
           ) as s
           where count_jobs.state = 'scheduled'
          union all
          select 1
            from awa.running as x
           where count_jobs.state = 'running' and x.queue_id = any(ids)
             and (count_jobs.kind is null or x.kind = count_jobs.kind)
          union all
          select 1
            from unnest(ids) as q (id)
           cross join lateral awa._ready_lanes(q.id) as l
           cross join lateral (
               select
                 from awa.ready as x
                where x.lane_id = l.lane_id and x.lane_seq >= l.head_seq
                  and (count_jobs.kind is null or x.kind = count_jobs.kind)
                limit count_jobs.up_to
           ) as r
           where count_jobs.state = 'ready'
          union all
          select 1
            from unnest(ids) as q (id)
           cross join lateral (
               select
                 from awa.finished as x
                where x.queue_id = q.id and x.state = count_jobs.state
                  and (count_jobs.kind is null or x.kind = count_jobs.kind)
                limit count_jobs.up_to
           ) as f
           where count_jobs.state in ('completed', 'failed', 'cancelled')
          limit count_jobs.up_to
      ) as c;
    perform awa._check_snapshot_current();
    return counted;
end;
$$;

-- Function: awa._error_class(last_error text) returns text
-- What awa.failure_summary groups a failed job's last error by: its first
-- line that holds text, trailing blanks dropped, cut to 200 characters
-- (the rest of a message, a stack trace, varies from job to job). Null for
-- a job with no last error. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._error_class(last_error text)
returns text
language sql
immutable parallel safe
as $$
    select pg_catalog.left(
        pg_catalog.rtrim(pg_catalog.substring(last_error, '[^[:space:]][^\r\n]*')), 200
    )
$$;

-- Function: awa.failure_summary(queue, since, max_groups) returns a row per failure
-- What is failing, where, since when: the jobs that failed for good (state
-- failed, their attempts spent; not the cancelled ones) and are still kept
-- in awa.finished, one row per logical queue, kind and error
-- class (awa._error_class: the first line of the last error, cut to 200
-- characters), with how many, the first and the last failure, and the
-- last one's job id and whole last error. For one queue (a logical name
-- covers its partitions and stripes) or, with a null queue, every queue;
-- with since, only the failures of that long back from now. The groups of
-- most failures first (then the latest), at most max_groups of them. Reads
-- every failed row kept of the queues asked for, whatever since: for an
-- operator on demand, never on a refresh path (the admin page and the
-- metrics do not call it).
-- Role: awa_reader, awa_operator.
-- Errors: 22004 null max_groups; 22023 since below 0 or above 10 years (the
-- longest retention), max_groups outside 1 .. 100000, a bad name; 42704 no
-- such queue; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._check_max_jobs, awa._check_snapshot_current, awa._error_class,
--   awa._finished_ring_slots, awa._in_seconds, awa._queue_ids
-- Writes: nothing
create or replace function awa.failure_summary(
    queue text default null, since interval default null, max_groups integer default 100
)
returns table (
    logical_queue text,
    kind text,
    error text,
    failed bigint,
    first_failed_at timestamptz,
    last_failed_at timestamptz,
    sample_job_id bigint,
    sample_error text
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    ids integer[];
    since_at timestamptz;
begin
    perform awa._check_max_jobs('max_groups', max_groups);
    -- In seconds, as since_at is (compared as an interval, '-1 year 361
    -- days' is a day, in seconds -4.25 days).
    if date_part('epoch', since) < 0
       or date_part('epoch', since) > date_part('epoch', interval '10 years') then
        raise exception 'since must be between 0 and 10 years, got %', since
            using errcode = '22023';
    end if;
    if failure_summary.queue is null then
        ids := array(select m.queue_id from awa.queue_meta as m order by m.queue_id);
    else
        ids := awa._queue_ids(failure_summary.queue);
    end if;
    since_at := now() - awa._in_seconds(since);  -- seconds, not the caller's calendar
    return query
    select g.name, g.kind, g.error, g.n, g.first_at, g.last_at, s.job_id, s.last_error
      from (
          select f.name, f.kind, f.error, count(*) as n, min(f.finished_at) as first_at,
                 max(f.finished_at) as last_at,
                 -- The group's last failure (then its highest job id), where
                 -- it is: one pass, with no sort of the rows.
                 max(array[extract(epoch from f.finished_at), f.job_id, f.slot]) as latest
            from (
                select coalesce(m.root_queue, m.logical_queue, m.queue) as name, x.kind,
                       awa._error_class(x.last_error) as error, x.finished_at, x.job_id,
                       x.slot
                  from unnest(ids) as q (id)
                  join awa.queue_meta as m on m.queue_id = q.id
                 cross join lateral (
                     -- Failed rows are in the failed and the long rings only
                     -- (sql/retention.sql): the completed ring's slots are
                     -- not read.
                     select y.kind, y.last_error, y.finished_at, y.job_id, y.slot
                       from awa.finished as y
                      where y.queue_id = q.id and y.state = 'failed'
                        and y.slot >= awa._finished_ring_slots()
                        and (since_at is null or y.finished_at >= since_at)
                 ) as x
            ) as f
           group by f.name, f.kind, f.error
           order by count(*) desc, max(f.finished_at) desc, f.name, f.kind, f.error
           limit failure_summary.max_groups
      ) as g
      join awa.finished as s on s.job_id = g.latest[2]::bigint and s.slot = g.latest[3]::smallint
     order by g.n desc, g.last_at desc, g.name, g.kind, g.error;
    perform awa._check_snapshot_current();
end;
$$;

-- Function: awa._cancelled_error(last_error text) returns text
-- What a cancelled job keeps as its last error: who cancelled it (the
-- login), and the last error it had, whole: its last failed attempt's,
-- or for a job cancelled, retried and cancelled again before it ran, the
-- earlier cancel's note. Never trimmed: an attempt's own error may read
-- like a note ('cancelled by upstream: ...'), and a login may hold a ';'.
-- Null for a job that has no error; '' for one whose failed attempt gave
-- none (the note still says an attempt failed). Bounded as awa.fail
-- bounds an error, so that cancels and retries never grow it.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._cancelled_error(last_error text)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
    select 'cancelled by ' || session_user
        || coalesce('; last error: ' || pg_catalog.left(last_error, 65536), '')
$$;

-- Function: awa._cancelled_after_failure(last_error text) returns boolean
-- Whether a cancelled job's last error (awa._cancelled_error) carries the
-- error of a failed attempt: it was cancelled while it waited for a retry,
-- not while it ran. The reading of the format awa._cancelled_error writes,
-- next to it. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._cancelled_after_failure(last_error text)
returns boolean
language sql
immutable parallel safe
as $$
    -- LIKE, not a pattern that stops at ';': a login's name may hold one.
    select coalesce(last_error operator(pg_catalog.~~) 'cancelled by %; last error: %', false)
$$;

-- Function: awa._cancel_waiting(job_id, queue_id, priority, kind, args, ordering_key,
--                               attempt, max_attempts, enqueued_at, last_error,
--                               max_run_time) returns void
-- Finishes as cancelled a scheduled or ready job whose row the caller has
-- just deleted, through awa._finish (a row in the failed-and-cancelled
-- ring, with the job's own max run time and unique key for a retry, one
-- more on the queue's cancelled counter; the key, if any, given back).
-- Calls: awa._cancelled_error, awa._finish
-- Writes: nothing
create or replace function awa._cancel_waiting(
    job_id bigint,
    queue_id integer,
    priority smallint,
    kind text,
    args jsonb,
    ordering_key bytea,
    attempt integer,
    max_attempts integer,
    enqueued_at timestamptz,
    last_error text,
    max_run_time interval
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
-- jsonb writes enqueued_at at the session's offset from UTC, which jsonb
-- cannot read back beyond 15:59 hours: a caller's zone of '<+20>-20' made
-- every cancel of a waiting job fail.
set timezone = 'UTC'
as $$
declare
    -- An awa.running row. Declared record: a field of a record may be assigned
    -- where the offline read of the body (tests/support/sql_headers.py) knows
    -- no fields of awa.running.
    job record;
begin
    -- The running-row value awa._finish takes, built by column name (its
    -- lane, lease, worker and deadline columns stay null). unique_jobs:
    -- look for a key (a waiting job's table does not say whether it has one).
    job := jsonb_populate_record(null::awa.running, jsonb_build_object(
        'job_id', job_id, 'queue_id', queue_id, 'priority', priority, 'kind', kind,
        'ordering_key', ordering_key, 'attempt', attempt,
        'max_attempts', max_attempts, 'enqueued_at', enqueued_at,
        'max_run_time', max_run_time, 'unique_jobs', true
    ));
    -- Set as it is: through jsonb, args that are JSON null ('null'::jsonb,
    -- which an enqueue stores as given) came out SQL null, and a job kept
    -- without args can never be retried.
    job.args := args;
    perform awa._finish(
        job,
        -- From its first failed attempt on, a waiting job waits for a retry:
        -- the note says so even when the attempt gave no error, as
        -- awa.run_outcome reads it (awa._cancelled_after_failure).
        'cancelled', awa._cancelled_error(
            case when attempt >= 1 then coalesce(last_error, '') else last_error end
        )
    );
end;
$$;

-- Function: awa.cancel_job(job_id bigint) returns boolean
-- Ends a scheduled, ready or running job as cancelled: it is never claimed
-- again, and a running job's worker gets false from awa.complete,
-- awa.fail and awa.heartbeat. Kept with its args like a failed job, for
-- the failed retention. A ready job a claim in flight holds is waited for
-- (up to the caller's lock_timeout, then 55P03): once the claim commits it
-- is cancelled as running. False, changing nothing, for a job already
-- completed, failed or cancelled, and for an unknown or pruned one. Cost:
-- as awa.job (a ready job costs a bisection of each lane with ready rows).
-- Role: awa_operator.
-- Errors: 22004 null job_id; 40001 the job moved on every look (retry), or
-- a snapshot older than a rewrite (awa._check_snapshot_current).
-- Calls: awa._cancel_waiting, awa._cancelled_error, awa._check_snapshot_current, awa._finish,
--   awa._job_at
-- Writes: awa.ready, awa.running, awa.scheduled
create or replace function awa.cancel_job(job_id bigint)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    here record;
    gone record;
    job awa.running;
begin
    if job_id is null then
        raise exception 'job_id must not be null'
            using errcode = '22004';
    end if;
    -- Where the job is, then its row taken there; a job that moved in
    -- between (promoted, claimed, failed an attempt) is looked for again.
    for round in 1 .. 10 loop
        select j.state, j.lane_id, j.lane_seq into here
          from awa._job_at(cancel_job.job_id) as j;
        perform awa._check_snapshot_current();  -- it resets FOUND: no job, no state
        if here.state is null or here.state in ('completed', 'failed', 'cancelled') then
            return false;
        end if;
        if here.state = 'running' then
            delete from awa.running as r
             where r.job_id = cancel_job.job_id
            returning r.* into job;
            if found then
                perform awa._finish(job, 'cancelled', awa._cancelled_error(null));
                return true;
            end if;
        else
            if here.state = 'scheduled' then
                delete from awa.scheduled as s
                 where s.job_id = cancel_job.job_id
                returning s.* into gone;
            else
                -- Waits for a claim that holds the row: committed, the row
                -- is gone (the job runs: the next round); rolled back, it is
                -- deleted here.
                delete from awa.ready as r
                 where r.lane_id = here.lane_id and r.lane_seq = here.lane_seq
                   and r.job_id = cancel_job.job_id
                returning r.* into gone;
            end if;
            if found then
                perform awa._cancel_waiting(
                    gone.job_id, gone.queue_id, gone.priority, gone.kind, gone.args,
                    gone.ordering_key, gone.attempt, gone.max_attempts, gone.enqueued_at,
                    gone.last_error, gone.max_run_time
                );
                return true;
            end if;
        end if;
    end loop;
    raise exception 'job % moved on each of 10 looks; try again', job_id
        using errcode = '40001';
end;
$$;

-- Function: awa.cancel_jobs(queue text, kind text, max_jobs integer,
--   enqueued_before timestamptz) returns bigint
-- Cancels up to max_jobs ready and scheduled jobs of a queue (a logical
-- name covers its partitions and stripes), optionally of one kind: ready
-- jobs first, lane by lane from the front of each lane, then scheduled
-- ones, and at most awa._pass_bytes() of payload (awa._job_bytes; at least
-- one job): each cancel copies the job's args into awa.finished. Running
-- jobs are left to run (awa.cancel_job cancels one), and so are ready rows
-- a claim in flight holds: they are being claimed. With enqueued_before,
-- only jobs enqueued before it (a retried or rescued job keeps its first
-- enqueue time), so that a caller that counted the jobs first
-- (awa.count_jobs, in the snapshot of its read of clock_timestamp(), the
-- bound) takes the jobs it counted, not ones enqueued since. Call it
-- again until it returns 0 to cancel more, each call its own transaction.
-- Moves the claim hints of the lanes it cancelled from past the rows it
-- cancelled (awa._move_lane_hints). The jobs' rows are locked first, then
-- their unique keys' rows, in (scope, key) order (awa._lock_unique_keys),
-- and then the jobs are cancelled, each giving its key back: given back in
-- lane order, a key held while a lower one was waited for deadlocked with
-- a join of the queue to a family (awa._join_unique_scope, 40P01).
-- Returns how many jobs it cancelled.
-- Role: awa_operator.
-- Errors: 22004 null queue or max_jobs; 22023 max_jobs outside 1 .. 100000,
-- a bad name; 42704 no such queue; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._cancel_waiting, awa._check_max_jobs, awa._check_snapshot_current, awa._job_bytes,
--   awa._lock_unique_keys, awa._move_lane_hints, awa._pass_bytes, awa._queue_ids, awa._ready_lanes
-- Writes: awa.ready, awa.scheduled
create or replace function awa.cancel_jobs(
    queue text, kind text default null, max_jobs integer default 10000,
    enqueued_before timestamptz default null
)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Rows are found by key and deleted by ctid, as a claim does.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
-- Nor a bitmap scan: it takes every match of the key before the LIMIT.
set enable_bitmapscan = off
as $$
declare
    ids integer[] := awa._queue_ids(queue);
    gone record;
    cancelled bigint := 0;
    copied bigint;
    lanes integer[] := '{}';
    -- The rows to cancel, locked: the ready ones by ctid, the scheduled by id.
    ready_rows tid[];
    ready_jobs bigint[];
    due_jobs bigint[] := '{}';
begin
    perform awa._check_max_jobs('max_jobs', max_jobs);
    select coalesce(array_agg(w.tid), '{}'), coalesce(array_agg(w.job_id), '{}'),
           coalesce(sum(w.bytes), 0)
      into ready_rows, ready_jobs, copied
      from (
          -- The rows locked, then those whose payload before them is under
          -- the bound (a window cannot run beside FOR UPDATE): a front of
          -- each lane still.
          select t.tid, t.job_id, t.bytes,
                 sum(t.bytes) over (order by t.lane_id, t.lane_seq) - t.bytes
                 as bytes_before
            from (
                select h.tid, h.job_id, h.lane_id, h.lane_seq, h.bytes
                  from unnest(ids) as q (id)
                 cross join lateral awa._ready_lanes(q.id) as l
                 cross join lateral (
                     select x.ctid as tid, x.job_id, x.lane_id, x.lane_seq,
                            awa._job_bytes(x.kind, x.args, x.last_error) as bytes
                       from awa.ready as x
                      where x.lane_id = l.lane_id and x.lane_seq >= l.head_seq
                        and (cancel_jobs.kind is null or x.kind = cancel_jobs.kind)
                        and (cancel_jobs.enqueued_before is null
                             or x.enqueued_at < cancel_jobs.enqueued_before)
                      order by x.lane_seq
                      limit cancel_jobs.max_jobs
                        for update of x skip locked
                 ) as h
                 limit cancel_jobs.max_jobs
            ) as t
      ) as w
     where w.bytes_before < awa._pass_bytes();
    if cardinality(ready_jobs) < max_jobs and copied < awa._pass_bytes() then
        select coalesce(array_agg(w.job_id), '{}') into due_jobs
          from (
              select t.job_id, sum(t.bytes) over (order by t.job_id) - t.bytes as bytes_before
                from (
                    select x.job_id, awa._job_bytes(x.kind, x.args, x.last_error) as bytes
                      from awa.scheduled as x
                     where x.queue_id = any(ids)
                       and (cancel_jobs.kind is null or x.kind = cancel_jobs.kind)
                       and (cancel_jobs.enqueued_before is null
                            or x.enqueued_at < cancel_jobs.enqueued_before)
                     limit cancel_jobs.max_jobs - cardinality(ready_jobs)
                       for update skip locked
                ) as t
          ) as w
         where copied + w.bytes_before < awa._pass_bytes();
    end if;
    -- Their keys' rows, in key order, before any is given back.
    perform awa._lock_unique_keys(ready_jobs || due_jobs);
    for gone in
        delete from awa.ready as r where r.ctid = any(ready_rows) returning r.*
    loop
        perform awa._cancel_waiting(
            gone.job_id, gone.queue_id, gone.priority, gone.kind, gone.args, gone.ordering_key,
            gone.attempt, gone.max_attempts, gone.enqueued_at, gone.last_error,
            gone.max_run_time
        );
        cancelled := cancelled + 1;
        if not gone.lane_id = any(lanes) then
            lanes := lanes || gone.lane_id;
        end if;
    end loop;
    -- Claims, the next call and the lane views start past what was
    -- cancelled from the front, not at each lane's old hint, which would
    -- walk every cancelled row until vacuum removes it (never, while a
    -- snapshot older than this transaction is held).
    if cardinality(lanes) > 0 then
        perform awa._move_lane_hints(lanes);
    end if;
    for gone in
        delete from awa.scheduled as s where s.job_id = any(due_jobs) returning s.*
    loop
        perform awa._cancel_waiting(
            gone.job_id, gone.queue_id, gone.priority, gone.kind, gone.args,
            gone.ordering_key, gone.attempt, gone.max_attempts, gone.enqueued_at,
            gone.last_error, gone.max_run_time
        );
        cancelled := cancelled + 1;
    end loop;
    perform awa._check_snapshot_current();
    return cancelled;
end;
$$;

-- Function: awa._requeue(job_ids, queue_ids, priorities, kinds, args, ordering_keys,
--                        max_attempts, enqueued_ats, last_errors, max_run_times,
--                        unique_keys, unique_windows) returns bigint[]
-- Puts jobs an operator retries back into lanes, ready now, with attempt
-- 0, their own job ids, max run times and unique keys: routed as
-- awa.promote_due routes a due job, under each queue's current S (a keyed
-- job to its key's shard), with the lanes taken by awa._lock_lanes and the
-- rows written by awa._insert_jobs. A job whose unique key another job
-- holds now stays where it is. Returns the ids of the jobs it put back. The
-- arrays come one element per job, indexed from 1.
-- Calls: awa._first_attempt, awa._insert_jobs, awa._key_shard, awa._lock_lanes,
--   awa._mark_unique_jobs, awa._null_at, awa._take_unique_keys
-- Writes: nothing
create or replace function awa._requeue(
    job_ids bigint[],
    queue_ids integer[],
    priorities smallint[],
    kinds text[],
    args jsonb[],
    ordering_keys bytea[],
    max_attempts integer[],
    enqueued_ats timestamptz[],
    last_errors text[],
    max_run_times interval[],
    unique_keys bytea[],
    unique_windows interval[]
)
returns bigint[]
language plpgsql
set search_path = pg_catalog, pg_temp
-- Array parameters make the planner re-plan every call.
set plan_cache_mode = force_generic_plan
as $$
declare
    n integer := cardinality(job_ids);
    key_shards smallint[];
    taken record;
    dup_i integer[];
begin
    -- Keys before lanes, as every enqueue takes them; a job whose key is
    -- held gets no lane (its queue id goes null) and no row (its kind goes
    -- null, which awa._insert_jobs skips).
    if cardinality(array_remove(unique_keys, null)) > 0 then
        select array_agg(d.i) into dup_i
          from awa._take_unique_keys(
              unique_keys, job_ids, queue_ids, priorities, unique_windows
          ) as d;
        if dup_i is not null then
            queue_ids := awa._null_at(queue_ids, dup_i);
            kinds := awa._null_at(kinds, dup_i);
        end if;
    end if;
    select array_agg(
               case when ordering_keys[i] is not null
                    then awa._key_shard(ordering_keys[i], m.enqueue_shards) end
               order by i
           )
      into key_shards
      from generate_series(1, cardinality(job_ids)) as i
      left join awa.queue_meta as m on m.queue_id = queue_ids[i];
    select * into taken from awa._lock_lanes(queue_ids, priorities, key_shards);
    if cardinality(array_remove(unique_keys, null)) > 0 then
        -- The keyed rows' queues, once their lanes are held.
        perform awa._mark_unique_jobs(queue_ids, unique_keys);
    end if;
    perform count(*) from awa._insert_jobs(
        taken.lanes, taken.seqs, queue_ids, priorities, kinds, args, ordering_keys,
        max_attempts, null, job_ids, array_fill(awa._first_attempt(), array[n]), enqueued_ats,
        last_errors, max_run_times
    );
    return array(
        select job_ids[i] from generate_series(1, n) as i
         where kinds[i] is not null
         order by i
    );
end;
$$;

-- Function: awa.release_worker(worker text) returns bigint
-- Ends now the leases of the jobs a worker runs, for a worker known dead
-- whose leases are long: the next awa.rescue_expired takes them back as it
-- takes any expired lease (the attempt counted, after the queue's backoff,
-- last error 'lease expired'), instead of after the lease the claim gave.
-- A worker still alive keeps a job it heartbeats before the rescue (the
-- heartbeat sets its lease again), and its complete or fail still counts
-- until the rescue has taken the job. Reads awa.running, which holds the
-- running jobs only. Returns how many leases it ended; 0 for a worker
-- running nothing. Waits at most 5 s for a row a worker's call holds
-- (55P03, to call again).
-- Role: awa_operator.
-- Errors: 22004 null worker; 55P03 a row held for over 5 s; 40001 a
-- snapshot older than a rewrite (awa._check_snapshot_current).
-- Calls: awa._check_snapshot_current
-- Writes: awa.running
create or replace function awa.release_worker(worker text)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '5s'
as $$
declare
    released bigint;
begin
    if worker is null then
        raise exception 'worker must not be null' using errcode = '22004';
    end if;
    update awa.running as r
       set lease_expires_at = now()
     where r.worker = release_worker.worker and r.lease_expires_at > now();
    get diagnostics released = row_count;
    perform awa._check_snapshot_current();
    return released;
end;
$$;

-- Function: awa._retry_states() returns text[]
-- The states a job is retried from: failed and cancelled. awa.retry_job
-- takes a job in either; awa.retry_jobs one of them a call. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retry_states()
returns text[]
language sql
immutable parallel safe
as $$
    select array['failed', 'cancelled']
$$;

-- Function: awa.retry_job(job_id bigint) returns boolean
-- A failed or cancelled job runs again now: back into a lane of its queue
-- with its job_id, args, ordering key, priority and max_attempts, and a
-- fresh set of attempts (attempt 0), routed under the queue's current S
-- (a keyed job to its key's lane). Its last error stays on it until it
-- runs. A job with a unique key takes it again. False, changing nothing,
-- for a job in any other state, an unknown one, one retention removed (a
-- prune emptying its slot meanwhile included), one that failed before
-- migration 0015 (it kept no args), and one whose unique key another job
-- holds now (ADR 027).
-- Role: awa_operator.
-- Errors: 22004 null job_id; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._check_snapshot_current, awa._requeue, awa._retry_states
-- Writes: awa.finished
create or replace function awa.retry_job(job_id bigint)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    f record;
    held boolean;
begin
    if job_id is null then
        raise exception 'job_id must not be null'
            using errcode = '22004';
    end if;
    -- A row a concurrent awa.prune_finished() emptied with its slot is not
    -- there: not found, like any job retention removed. Locked, the row
    -- keeps its slot from a prune until it is deleted here. A row a carry
    -- moved to the current slot while this statement waited for it is gone
    -- from this statement's view (a delete and an insert, ADR 040): the
    -- second look, with a snapshot taken after that commit, finds it.
    for look in 1 .. 2 loop
        select x.* into f
          from awa.finished as x
         where x.job_id = retry_job.job_id and x.state = any(awa._retry_states())
           and x.args is not null
           for update;
        held := found;
        exit when held;
    end loop;
    perform awa._check_snapshot_current();
    if not held then
        return false;
    end if;
    if cardinality(awa._requeue(
        array[f.job_id], array[f.queue_id], array[f.priority], array[f.kind], array[f.args],
        array[f.ordering_key], array[f.max_attempts], array[f.enqueued_at],
        array[f.last_error], array[f.max_run_time], array[f.unique_key],
        array[f.unique_window]
    )) = 0 then
        return false;
    end if;
    delete from awa.finished as x where x.job_id = f.job_id and x.slot = f.slot;
    return true;
end;
$$;

-- Function: awa.retry_jobs(queue text, kind text, max_jobs integer, state text,
--   finished_before timestamptz) returns bigint
-- awa.retry_job for up to max_jobs jobs of a queue (a logical name covers
-- its partitions and stripes) in `state`, failed (the default) or
-- cancelled, optionally of one kind, oldest job id first within each
-- physical queue, and at most awa._pass_bytes() of payload
-- (awa._job_bytes; at least one job): each retry copies the job's args
-- back into a lane, while the call holds the lanes it writes. One state a
-- call: bringing back a flood of cancelled jobs never retries the failed
-- ones too, nor the other way round. With finished_before, only jobs that
-- finished before it: a job retried since that failed again keeps its id
-- but finished later, so that a caller that counted the jobs first
-- (awa.count_jobs, in the snapshot of its read of clock_timestamp(), the
-- bound) retries each job it counted once, not one that fails again
-- round and round. Rows another transaction holds (a retry, a carry of
-- awa.prune_finished) are skipped; when they are all that is left, they
-- are waited for once (the caller's lock_timeout bounds the wait) and
-- looked for again, so a 0 means none is left to retry. Jobs whose unique
-- key another job holds now are skipped too (they stay failed or
-- cancelled). Call it again until it returns 0 to retry more, each call
-- its own transaction. Returns how many jobs it retried.
-- Role: awa_operator.
-- Errors: 22004 null queue, max_jobs or state; 22023 max_jobs outside
-- 1 .. 100000, a state other than failed or cancelled, a bad name; 42704
-- no such queue; 40001 a snapshot older than a rewrite
-- (awa._check_snapshot_current).
-- Calls: awa._check_max_jobs, awa._check_snapshot_current, awa._job_bytes, awa._key_holds,
--   awa._pass_bytes, awa._queue_ids, awa._requeue, awa._retry_states, awa._unique_scope
-- Writes: awa.finished
create or replace function awa.retry_jobs(
    queue text, kind text default null, max_jobs integer default 10000,
    state text default 'failed', finished_before timestamptz default null
)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
-- Nor a bitmap scan: it takes every match of the key before the LIMIT.
set enable_bitmapscan = off
as $$
declare
    ids integer[] := awa._queue_ids(queue);
    due record;
    requeued bigint[];
    keep boolean[];
    k integer := 1;
begin
    perform awa._check_max_jobs('max_jobs', max_jobs);
    if retry_jobs.state is null then
        raise exception 'state must not be null'
            using errcode = '22004';
    end if;
    if not retry_jobs.state = any(awa._retry_states()) then
        raise exception 'state must be %, got %',
                        array_to_string(awa._retry_states(), ' or '),
                        quote_literal(retry_jobs.state)
            using errcode = '22023';
    end if;
    for look in 1 .. 2 loop
        with gone as (
            select x.*
              from (
                  select m.queue_id as id, awa._unique_scope(m.queue, m.root_queue) as scope
                    from awa.queue_meta as m
                   where m.queue_id = any(ids)
              ) as q
             cross join lateral (
                 -- A range on state, as in awa.jobs: the (queue_id, state,
                 -- job_id) index of each slot, merged.
                 select y.*
                   from awa.finished as y
                  where y.queue_id = q.id and y.state between retry_jobs.state and retry_jobs.state
                    and y.args is not null
                    and (retry_jobs.kind is null or y.kind = retry_jobs.kind)
                    and (retry_jobs.finished_before is null
                         or y.finished_at < retry_jobs.finished_before)
                    and (y.unique_key is null or not exists (
                        select from awa.unique_keys as u
                         where u.queue = q.scope and u.unique_key = y.unique_key
                           and awa._key_holds(u.held_until)
                    ))
                  order by y.state, y.job_id
                  limit retry_jobs.max_jobs
                    for update of y skip locked
             ) as x
             limit retry_jobs.max_jobs
        ),
        sized as (
            -- The rows locked, then those whose payload before them is
            -- under the bound (a window cannot run beside FOR UPDATE).
            select g.*, sum(g.bytes) over (order by g.job_id, g.slot) - g.bytes as bytes_before
              from (
                  select x.*, awa._job_bytes(x.kind, x.args, x.last_error) as bytes
                    from gone as x
              ) as g
        )
        select array_agg(g.job_id order by g.job_id) as job_ids,
               array_agg(g.queue_id order by g.job_id) as queue_ids,
               array_agg(g.priority order by g.job_id) as priorities,
               array_agg(g.kind order by g.job_id) as kinds,
               array_agg(g.args order by g.job_id) as args,
               array_agg(g.ordering_key order by g.job_id) as ordering_keys,
               array_agg(g.max_attempts order by g.job_id) as max_attempts,
               array_agg(g.enqueued_at order by g.job_id) as enqueued_ats,
               array_agg(g.last_error order by g.job_id) as last_errors,
               array_agg(g.max_run_time order by g.job_id) as max_run_times,
               array_agg(g.unique_key order by g.job_id) as unique_keys,
               array_agg(g.unique_window order by g.job_id) as unique_windows,
               array_agg(g.slot order by g.job_id) as slots
          into due
          from sized as g
         where g.bytes_before < awa._pass_bytes();
        exit when due.job_ids is not null or look = 2;
        -- None free, but maybe rows another transaction holds: a retry, or
        -- a carry of awa.prune_finished moving them to the current slot
        -- (ADR 040), which nobody retries. Waited for once (the caller's
        -- lock_timeout bounds the wait), then looked for again with a
        -- snapshot taken after it ended, where a carried row is seen in its
        -- new slot: a 0 means none is left. The rows the look above takes,
        -- keys held by other jobs left out too: a free row whose key is held
        -- was locked at once, and the call returned 0 with a row held by a
        -- carry still to come.
        perform
          from awa.finished as y
          join awa.queue_meta as m on m.queue_id = y.queue_id
         where y.queue_id = any(ids) and y.state between retry_jobs.state and retry_jobs.state
           and y.args is not null
           and (retry_jobs.kind is null or y.kind = retry_jobs.kind)
           and (retry_jobs.finished_before is null or y.finished_at < retry_jobs.finished_before)
           and (y.unique_key is null or not exists (
               select from awa.unique_keys as u
                where u.queue = awa._unique_scope(m.queue, m.root_queue)
                  and u.unique_key = y.unique_key
                  and awa._key_holds(u.held_until)
           ))
         limit 1
           for update of y;
    end loop;
    perform awa._check_snapshot_current();
    if due.job_ids is null then
        return 0;
    end if;
    requeued := awa._requeue(
        due.job_ids, due.queue_ids, due.priorities, due.kinds, due.args, due.ordering_keys,
        due.max_attempts, due.enqueued_ats, due.last_errors, due.max_run_times,
        due.unique_keys, due.unique_windows
    );
    -- Which jobs went back, by merging the two lists (requeued is a
    -- subsequence of due.job_ids, in its order): `= any(requeued)` per row
    -- under a generic plan cost the product of the two.
    keep := array_fill(false, array[cardinality(due.job_ids)]);
    for i in 1 .. cardinality(due.job_ids) loop
        if k <= cardinality(requeued) and requeued[k] = due.job_ids[i] then
            keep[i] := true;
            k := k + 1;
        end if;
    end loop;
    delete from awa.finished as f
     using unnest(due.job_ids, due.slots, keep) as x (job_id, slot, r)
     where f.job_id = x.job_id and f.slot = x.slot and x.r;
    return cardinality(requeued);
end;
$$;

select awa._grant_execute('awa._check_job_state(text)');
select awa._grant_execute('awa._check_max_jobs(text, integer)');
select awa._grant_execute('awa._ready_lanes(integer)');
select awa._grant_execute('awa._job_at(bigint)');
select awa._grant_execute('awa.job(bigint)', 'reader', 'operator');
select awa._grant_execute('awa._ready_from(integer, bigint, bigint, bigint)');
select awa._grant_execute(
    'awa.jobs(text, text, text, bigint, integer, text)', 'reader', 'operator'
);
select awa._grant_execute('awa.prune_ready_late(integer)', 'maintenance');
select awa._grant_execute('awa.count_jobs(text, text, text, integer)', 'reader', 'operator');
select awa._grant_execute('awa._error_class(text)');
select awa._grant_execute(
    'awa.failure_summary(text, interval, integer)', 'reader', 'operator'
);
select awa._grant_execute('awa._cancelled_error(text)');
select awa._grant_execute('awa._cancelled_after_failure(text)');
select awa._grant_execute(
    'awa._cancel_waiting(bigint, integer, smallint, text, jsonb, bytea, integer, integer,'
    ' timestamptz, text, interval)'
);
select awa._grant_execute('awa.cancel_job(bigint)', 'operator');
select awa._grant_execute('awa.release_worker(text)', 'operator');
select awa._grant_execute('awa.cancel_jobs(text, text, integer, timestamptz)', 'operator');
select awa._grant_execute(
    'awa._requeue(bigint[], integer[], smallint[], text[], jsonb[], bytea[], integer[],'
    ' timestamptz[], text[], interval[], bytea[], interval[])'
);
select awa._grant_execute('awa._retry_states()');
select awa._grant_execute('awa.retry_job(bigint)', 'operator');
select awa._grant_execute(
    'awa.retry_jobs(text, text, integer, text, timestamptz)', 'operator'
);

-- The first apply of this layer after migration 0020 (the earlier layer's
-- last apply predates it): record the ready rows that entered their lane
-- with an older id before awa._insert_jobs did, those whose id is below an
-- earlier one of their lane, stamped with the lane's highest id before them
-- (ADR 029). Every mover of a job into a lane with its old id writes one of
-- these tables before it calls awa._insert_jobs (promote: awa.scheduled;
-- retry: awa.finished; a unique key: awa.unique_keys): the lock waits for
-- the movers in flight, whose rows the scan then sees, and holds the next
-- ones off until this layer commits, when their call reaches this layer's
-- awa._insert_jobs. Once: later applies skip it.
do $$
begin
    if coalesce((select max(f.applied_at) from awa.schema_functions as f), '-infinity')
       < (select m.applied_at from awa.schema_migrations as m where m.version = 20) then
        lock table awa.unique_keys, awa.scheduled, awa.finished in exclusive mode;
        insert into awa.ready_late (job_id, queue_id, lane_id, lane_seq, stamp)
        select r.job_id, r.queue_id, r.lane_id, r.lane_seq, r.prior_max
          from (
              select x.job_id, x.queue_id, x.lane_id, x.lane_seq,
                     max(x.job_id) over (
                         partition by x.lane_id order by x.lane_seq
                         rows between unbounded preceding and 1 preceding
                     ) as prior_max
                from awa.ready as x
          ) as r
         where r.job_id < r.prior_max
            on conflict (lane_id, lane_seq) do nothing;
    end if;
end;
$$;
