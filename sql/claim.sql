-- claim.sql: claiming jobs and finishing them.
--
-- A claim walks the lanes of the requested queues, lanes at or above the
-- current S included (they drain after S is lowered, until
-- awa.retire_lanes takes them out of the walk), priority first and in
-- a fresh random order within a priority, and takes each lane's first free
-- rows from where awa.lane_hints says its live rows start, until it has its
-- jobs. Its cost follows the lanes it reaches, not the rows ever enqueued
-- nor the dead ones vacuum has not yet removed (ADR 012, ADR 023).
--
-- Every entry point here pins enable_seqscan = off: awa.ready and awa.running
-- are looked up by key only. awa.running is small and churns, so statistics
-- taken when it was nearly empty would otherwise make a kept plan scan its
-- heap, dead rows and all, until the next vacuum.

-- Function: awa._advance_lane_hints(lanes integer[], heads bigint[], seqs bigint[])
-- Moves each lane's claim hint from heads[i], the hint the claim read, up
-- to seqs[i], the lane's first row visible to the claim that calls it:
-- every row below it is gone for good (lane_seq order is commit order, and
-- a deleted row never comes back), so any later claim may start there. The
-- hint is a row of awa.lane_hints, inserted, never updated (ADR 030): the
-- row it was read at is locked, deleted and replaced; a lane read with no
-- row gets its first. Skips a hint another claim is moving.
-- Calls: nothing
-- Writes: awa.lane_hints
create or replace function awa._advance_lane_hints(
    lanes integer[], heads bigint[], seqs bigint[]
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    with held as (
        select h.ctid as tid, x.lane_id, x.seq
          from unnest(lanes, heads, seqs) as x (lane_id, head, seq)
          join awa.lane_hints as h on h.lane_id = x.lane_id and h.head_seq = x.head
         where x.seq > x.head
           for update of h skip locked
    ),
    gone as (
        delete from awa.lane_hints as h
         using held
         where h.ctid = held.tid
    )
    insert into awa.lane_hints (lane_id, head_seq)
    select distinct held.lane_id, held.seq
      from held
     union all
    -- A lane read without a hint (0): its first, unless one came meanwhile.
    -- Only then: the probe reads a lane's hints from the bottom, where the
    -- rows moved up from lie.
    select x.lane_id, x.seq
      from unnest(lanes, heads, seqs) as x (lane_id, head, seq)
     where x.head = 0
       and not exists (select from awa.lane_hints as h where h.lane_id = x.lane_id);
end;
$$;

-- Function: awa._move_lane_hints(lanes integer[]) returns void
-- Moves the claim hint of each of these lanes up to the lane's first row
-- still visible to the caller (free, or held by a claim in flight), when
-- that row is at least awa._claim_hint_step() past the hint: the rows
-- below it are gone once the caller commits, and the hint row written
-- here goes with the caller's rollback. A lane with no visible row at or
-- above its hint keeps its hint: an enqueue in flight may hold rows of
-- it that the caller cannot see. Called by awa.claim for the lanes it
-- took far from their hints, and by awa.cancel_jobs for the lanes it
-- cancelled from.
-- Calls: awa._advance_lane_hints, awa._claim_hint_step
-- Writes: nothing
create or replace function awa._move_lane_hints(lanes integer[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
-- Lanes, hints and rows are looked up by key, as in a claim.
set plan_cache_mode = force_generic_plan
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    hint_lanes integer[];
    hint_heads bigint[];
    hint_seqs bigint[];
begin
    select array_agg(l.lane_id order by l.lane_id),
           array_agg(hd.head_seq order by l.lane_id),
           array_agg(f.lane_seq order by l.lane_id)
      into hint_lanes, hint_heads, hint_seqs
      from unnest(lanes) as l (lane_id)
     cross join lateral (
         select coalesce(max(y.head_seq), 0) as head_seq
           from awa.lane_hints as y
          where y.lane_id = l.lane_id
     ) as hd
     cross join lateral (
         select r.lane_seq
           from awa.ready as r
          where r.lane_id = l.lane_id and r.lane_seq >= hd.head_seq
          order by r.lane_seq
          limit 1
     ) as f
     where f.lane_seq >= hd.head_seq + awa._claim_hint_step();
    if hint_lanes is not null then
        perform awa._advance_lane_hints(hint_lanes, hint_heads, hint_seqs);
    end if;
end;
$$;

-- Function: awa._claim_hint_step() returns integer
-- How far past its hint a lane's first claimable row must be before a claim
-- moves the hint: often enough that a claim walks few dead rows, rarely
-- enough that the hint row is not rewritten by every claim. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._claim_hint_step()
returns integer
language sql
immutable parallel safe
as $$
    select 64
$$;

-- Function: awa._walked_shards(lane_shards integer, enqueue_shards integer) returns integer
-- How many shards of a queue a claim walks: every shard that has lanes
-- (they drain after S is lowered, until awa.retire_lanes takes them out,
-- ADR 041), and every shard below S (a raise an earlier layer made during
-- an upgrade, not yet counted in lane_shards). Read by both walks of
-- awa.claim; awa.lane_overview's walked column repeats it. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._walked_shards(lane_shards integer, enqueue_shards integer)
returns integer
language sql
immutable parallel safe
as $$
    select greatest(lane_shards, enqueue_shards)
$$;

-- Function: awa._claim_walk_shard(step, shards, start, stride) returns integer
-- The shard a claim tries at its step-th lane of a queue whose lanes span
-- `shards` shards: from `start`, `stride` shards on each time. A stride
-- coprime with every lane count (a prime above 64) visits each shard once
-- in `shards` steps; start and stride are drawn for each call. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._claim_walk_shard(
    step integer, shards integer, start integer, stride integer
)
returns integer
language sql
immutable parallel safe
as $$
    select (start operator(pg_catalog.+) step operator(pg_catalog.*) stride)
        operator(pg_catalog.%) shards
$$;

-- Function: awa.claim(queues text[], max_jobs integer, worker text, lease interval, family boolean)
-- Claims up to max_jobs ready jobs from the named queues and all their
-- partitions and stripes (family false: their own stripes only), lane by
-- lane: the lanes of the highest priority first; within a priority the
-- queues in an order drawn for each call, and each queue's lanes from a
-- shard drawn for each call, by a stride drawn too
-- (awa._claim_walk_shard); from each lane its first free rows, FIFO.
-- family false is for a worker of one partition: the name of a
-- partitioned queue is its partition 0 too (awa._names_cover).
-- The lanes come from queue_meta.lane_ids, not awa.lanes, and it stops once
-- it has max_jobs, so a claim reads the lanes it takes from and the empty
-- ones before them, not every lane (ADR 023, ADR 028). Lanes at or above
-- the current S are visited too: they drain after S is lowered, until
-- awa.retire_lanes takes them out (ADR 041). Rows other transactions hold are
-- skipped, never waited for: a claim returns fewer than max_jobs only when
-- no other claimable row is left. Paused queues yield nothing.
-- At S = 1 (one lane per priority) this is strict FIFO per priority; at
-- S > 1 it is partitioned FIFO: FIFO within a lane, priority first, and no
-- order between the lanes of a priority (docs/concepts.md). A fast path
-- (docs/fast-paths.md), checked against an oracle of its order: the general
-- walk reads the named queues from queue_meta inside its statement; a claim
-- by one name of a queue no other queue links to (queue_meta.has_linked),
-- the usual call, reads that row first and walks its lanes with the same
-- statement less the queue lookup, about an eighth cheaper (ADR 033); such
-- a queue covers itself alone, whatever family says.
-- Each job's deadline is now plus its own max run time, else its queue's
-- (read from the queue_meta row the walk reads anyway); the lease never
-- runs past it (ADR 026). The running row notes whether the queue has had
-- keyed jobs (queue_meta.unique_jobs), so that the job's end looks for a
-- unique key only then (ADR 027); the fast path reads that flag again in
-- its walk, with the snapshot it takes jobs with, unless the row it read
-- first already says so.
-- Role: awa_worker.
-- Returns: setof awa.claimed, by priority then claim order; each job's
-- attempt is counted from 1; deadline_at null for a job without one.
-- Errors: 22023 max_jobs < 0, lease not positive or over 30 days (awa._lease_ok), or a
--   worker name over 255 bytes; 22004 null queues, worker, lease or family.
-- Calls: awa._check_lease, awa._check_limit, awa._claim_hint_step, awa._claim_walk_shard,
--   awa._in_seconds, awa._lease_ok, awa._limit_ok, awa._move_lane_hints, awa._names_cover,
--   awa._running_slot, awa._walked_shards
-- Writes: awa.ready, awa.running
create or replace function awa.claim(
    queues text[],
    max_jobs integer,
    worker text,
    lease interval default '5 minutes',
    family boolean default true
)
returns setof awa.claimed
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- The queues array would make the planner re-plan every call, and a generic
-- plan may hash-join awa.ready with a sequential scan, whose cost grows with
-- the table's history: a claim only ever looks rows up by primary key.
set plan_cache_mode = force_generic_plan
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    -- Orders the queues and lanes of a priority for this call: each lane is
    -- as likely as any other to be tried first, so no lane waits behind
    -- another's backlog.
    seed integer := (random() * 2147483647)::integer;
    -- A prime above 64, so coprime with every queue's lane count.
    stride integer := (array[67, 71, 73, 79, 83, 89, 97, 101])[1 + seed % 8];
    claimed record;
    one awa.claimed;
    far_lanes integer[] := '{}';
    -- A claim by one name of a queue no other queue links to (the usual
    -- call): its row, read once by name, so the walk's statement carries
    -- the queue as parameters instead of reading queue_meta (ADR 033).
    solo_queue text;
    solo_paused boolean;
    solo_lanes integer[];
    solo_shards integer;
    solo_completed_seq regclass;
    solo_run_time interval;
    solo_unique_jobs boolean;
begin
    -- A worker's name is stored with each run and read back by every job
    -- list: bounded as a runtime's host is. Every argument is checked by
    -- one condition, which PL/pgSQL sets up again at every call (ADR 018);
    -- the errors come in this order when it fails. A null worker fails the
    -- length test too (is not false).
    if queues is null or family is null or octet_length(worker) > 255 is not false
       or not awa._limit_ok(max_jobs) or not awa._lease_ok(lease) then
        if queues is null or worker is null or family is null then
            raise exception '% must not be null',
                case when queues is null then 'queues' when worker is null then 'worker'
                     else 'family' end
                using errcode = '22004';
        elsif octet_length(worker) > 255 then
            raise exception 'worker must be at most 255 bytes, got % bytes: %',
                octet_length(worker), quote_literal(left(worker, 64))
                using errcode = '22023';
        end if;
        perform awa._check_limit('max_jobs', max_jobs);
        perform awa._check_lease('lease', lease);
    end if;
    if max_jobs = 0 then
        return;
    end if;
    -- The lanes in the order they are tried; each lane's hint and rows are
    -- read only when the claim reaches it: the limits stop the scan, and the
    -- locking, once max_jobs rows are locked. Two blocks, each left by one
    -- test (ADR 018): solo, for one queue, then the general walk.
    <<general>>
    begin
        <<solo>>
        begin
            exit solo when cardinality(queues) <> 1;
            select m.queue, m.paused, m.lane_ids, awa._walked_shards(m.lane_shards, m.enqueue_shards),
                   m.completed_seq, m.max_run_time, m.unique_jobs
              into solo_queue, solo_paused, solo_lanes, solo_shards,
                   solo_completed_seq, solo_run_time, solo_unique_jobs
              from awa.queue_meta as m
             where m.queue = queues[1] and not m.has_linked;
            exit solo when not found;
            if solo_paused then
                return;
            end if;
            -- The general walk below, for one queue given as parameters: keep the two
            -- alike (tests/test_claim_differential.py runs both on the same seed).
            for claimed in
                with picked as (
                    select h.tid, l.shard, coalesce(hd.head_seq, 0) as head_seq
                      from (values (1), (2), (3), (4)) as p (priority)
                     cross join lateral (
                         select x.shard, solo_lanes[p.priority][x.shard] as lane_id
                           from (select awa._claim_walk_shard(
                                            generate_series(0, solo_shards - 1), solo_shards,
                                            seed / 8 % solo_shards, stride) as shard
                                 offset 0) as x
                         offset 0
                     ) as l
                      left join lateral (
                          select y.head_seq
                            from awa.lane_hints as y
                           where y.lane_id = l.lane_id
                           order by y.head_seq desc
                           limit 1
                      ) as hd on true
                     cross join lateral (
                         select r.ctid as tid
                           from awa.ready as r
                          where r.lane_id = l.lane_id and r.lane_seq >= coalesce(hd.head_seq, 0)
                          order by r.lane_seq
                          limit max_jobs
                            for update of r skip locked
                     ) as h
                     limit max_jobs
                ),
                moved as (
                    delete from awa.ready as r
                     using picked as p
                     where r.ctid = p.tid
                    returning r.job_id, r.lane_id, r.lane_seq, r.queue_id, r.priority, r.kind,
                        r.args, r.ordering_key, r.attempt, r.max_attempts, r.enqueued_at,
                        r.max_run_time, p.shard, p.head_seq,
                        nextval('awa.run_lease_seq') as run_lease,
                        statement_timestamp() + coalesce(r.max_run_time, solo_run_time) as deadline_at
                ),
                started as (
                    insert into awa.running (
                        job_id, run_lease, lane_id, lane_seq, queue_id, priority, kind, args,
                        ordering_key, attempt, max_attempts, enqueued_at, worker, claimed_at,
                        heartbeat_at, lease_expires_at, completed_seq, max_run_time, deadline_at,
                        unique_jobs, slot, claimed_by
                    )
                    select
                        m.job_id, m.run_lease, m.lane_id, m.lane_seq, m.queue_id, m.priority,
                        m.kind, m.args, m.ordering_key, m.attempt + 1, m.max_attempts,
                        m.enqueued_at, claim.worker, statement_timestamp(), statement_timestamp(),
                        least(statement_timestamp() + awa._in_seconds(claim.lease), m.deadline_at),
                        solo_completed_seq, m.max_run_time, m.deadline_at,
                        -- Read again with this statement's snapshot unless the row
                        -- read first said so: the first keyed job marks its queue in
                        -- its own transaction, which may have committed since, and
                        -- this statement may have taken that very job. By id: a drop
                        -- renames the queue meanwhile (null then broke the insert).
                        solo_unique_jobs or (select k.unique_jobs
                                               from awa.queue_meta as k
                                              where k.queue_id = m.queue_id),
                        awa._running_slot(m.run_lease), session_user
                      from moved as m
                )
                select
                    row(
                        m.job_id, m.run_lease, solo_queue, m.priority, m.shard, m.lane_seq, m.kind,
                        m.args, m.attempt + 1, m.max_attempts, m.ordering_key, m.deadline_at
                    )::awa.claimed as job,
                    m.lane_id,
                    m.lane_seq >= m.head_seq + awa._claim_hint_step() as far
                  from moved as m
            loop
                one := claimed.job;
                return next one;
                if claimed.far and not claimed.lane_id = any(far_lanes) then
                    far_lanes := far_lanes || claimed.lane_id;
                end if;
            end loop;
            exit general;
        end solo;
            for claimed in
                -- The named queues, each read once, in an order drawn for this call,
                -- with the shard their walk starts at (S >= 1: never a division by
                -- zero).
                with walked as materialized (
                    select m.queue, m.lane_ids,
                           awa._walked_shards(m.lane_shards, m.enqueue_shards) as lane_shards,
                           seed / 8 % awa._walked_shards(m.lane_shards, m.enqueue_shards)
                               as start,
                           m.completed_seq, m.max_run_time, m.unique_jobs
                      from awa.queue_meta as m
                     where awa._names_cover(queues, m.queue, m.logical_queue, m.root_queue,
                                            claim.family)
                       and not m.paused
                     order by pg_catalog.hashint4(m.queue_id operator(pg_catalog.#) seed)
                ),
                picked as (
                    select h.tid, l.queue, l.shard, coalesce(hd.head_seq, 0) as head_seq,
                           l.completed_seq, l.queue_run_time, l.unique_jobs
                      -- Priority by priority (the lanes_priority_range check: 1 to 4):
                      -- offset 0 keeps the subquery whole, and its lateral reference
                      -- to p inside p's loop (without it the planner joins the
                      -- priorities innermost); then queue by queue, each queue's
                      -- lanes in its walk's order.
                      from (values (1), (2), (3), (4)) as p (priority)
                     cross join lateral (
                         select w.queue, s.shard, s.lane_id,
                                w.completed_seq, w.max_run_time as queue_run_time, w.unique_jobs
                           from walked as w
                          -- The steps as a set-returning function in the select list
                          -- (no tuplestore built on every rescan, as in FROM); offset
                          -- 0 computes each step's shard once.
                          cross join lateral (
                              select x.shard, w.lane_ids[p.priority][x.shard] as lane_id
                                from (select awa._claim_walk_shard(
                                                 generate_series(0, w.lane_shards - 1),
                                                 w.lane_shards, w.start, stride) as shard
                                      offset 0) as x
                          ) as s
                         offset 0
                     ) as l
                      -- The lane's highest hint, from the top of the index: the
                      -- hints below it are never read (ADR 030).
                      left join lateral (
                          select y.head_seq
                            from awa.lane_hints as y
                           where y.lane_id = l.lane_id
                           order by y.head_seq desc
                           limit 1
                      ) as hd on true
                     cross join lateral (
                         select r.ctid as tid
                           from awa.ready as r
                          where r.lane_id = l.lane_id and r.lane_seq >= coalesce(hd.head_seq, 0)
                          order by r.lane_seq
                          limit max_jobs
                            for update of r skip locked
                     ) as h
                     limit max_jobs
                ),
                moved as (
                    delete from awa.ready as r
                     using picked as p
                     where r.ctid = p.tid
                    returning r.*, p.queue as lane_queue, p.shard, p.head_seq, p.completed_seq,
                        p.unique_jobs, nextval('awa.run_lease_seq') as run_lease,
                        statement_timestamp() + coalesce(r.max_run_time, p.queue_run_time) as deadline_at
                ),
                started as (
                    insert into awa.running (
                        job_id, run_lease, lane_id, lane_seq, queue_id, priority, kind, args,
                        ordering_key, attempt, max_attempts, enqueued_at, worker, claimed_at,
                        heartbeat_at, lease_expires_at, completed_seq, max_run_time, deadline_at,
                        unique_jobs, slot, claimed_by
                    )
                    select
                        m.job_id, m.run_lease, m.lane_id, m.lane_seq, m.queue_id, m.priority,
                        m.kind, m.args, m.ordering_key, m.attempt + 1, m.max_attempts,
                        m.enqueued_at,
                        -- least() passes over a null deadline.
                        claim.worker, statement_timestamp(), statement_timestamp(),
                        least(statement_timestamp() + awa._in_seconds(claim.lease), m.deadline_at),
                        m.completed_seq, m.max_run_time, m.deadline_at, m.unique_jobs,
                        awa._running_slot(m.run_lease), session_user
                      from moved as m
                )
                select
                    row(
                        m.job_id, m.run_lease, m.lane_queue, m.priority, m.shard, m.lane_seq,
                        m.kind, m.args, m.attempt + 1, m.max_attempts, m.ordering_key, m.deadline_at
                    )::awa.claimed as job,
                    m.lane_id,
                    -- Far enough past its lane's hint that the hint may move.
                    m.lane_seq >= m.head_seq + awa._claim_hint_step() as far
                  -- In claim order (priority, then the walk): the order the DELETE
                  -- yields its rows, which assigned run_lease in that order; no sort
                  -- (ADR 020's rule for RETURNING rows; tests/test_claim_order.py).
                  from moved as m
            loop
                one := claimed.job;
                return next one;
                if claimed.far and not claimed.lane_id = any(far_lanes) then
                    far_lanes := far_lanes || claimed.lane_id;
                end if;
            end loop;
    end general;
    if cardinality(far_lanes) > 0 then
        perform awa._move_lane_hints(far_lanes);
    end if;
end;
$$;

-- Function: awa.complete(job_id bigint, run_lease bigint) returns boolean
-- Marks a running job completed: a narrow row in the completed ring of
-- awa.finished (no args: a completed job is not run again) and one more on
-- the queue's counter (copied into the running row by the claim: no lookup
-- of the queue), and its unique key, if it holds one, given back (kept for
-- its unique window, if it has one: sql/unique.sql). The run is looked for
-- in the slot of awa.running its lease's block names, then, if it is not
-- there, in slot 2, where awa.rotate_running carries the runs it finds
-- when it empties a slot (sql/running.sql). One statement per slot, alike
-- but for the table (tests/test_running_slots.py compares them): a DELETE
-- through the partitioned table would set up all three slots at every
-- call, which cost 49k instructions more (ADR 034).
-- False, changing nothing, when the lease is stale (the job was rescued and
-- claimed again, or already finished).
-- Role: awa_worker.
-- Errors: 25000 no run for the lease outside read committed (awa._check_no_run).
-- Calls: awa._check_no_run, awa._finished_slot, awa._release_unique_key, awa._running_slot
-- Writes: awa.finished, awa.running_0, awa.running_1, awa.running_carried
create or replace function awa.complete(job_id bigint, run_lease bigint)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    counted bigint;
    keyed boolean;
begin
    if awa._running_slot(complete.run_lease) = 0 then
        with done as (
            delete from awa.running_0 as r
             where r.job_id = complete.job_id and r.run_lease = complete.run_lease
               and coalesce(r.claimed_by, session_user) = session_user
            returning r.job_id, r.queue_id, r.priority, r.kind, r.attempt, r.max_attempts,
                r.enqueued_at, r.completed_seq, r.unique_jobs
        ),
        kept as (
            -- A completed job keeps no args, key or error: it never runs again.
            insert into awa.finished (
                job_id, slot, queue_id, priority, kind, state, attempt, max_attempts,
                enqueued_at, finished_at, args, ordering_key, last_error, max_run_time,
                unique_key, unique_window
            )
            select
                d.job_id, awa._finished_slot('completed', now()), d.queue_id, d.priority,
                d.kind, 'completed', d.attempt, d.max_attempts, d.enqueued_at, now(), null,
                null, null, null, null, null
              from done as d
        )
        -- The queue's counter, which the claim copied into the running row.
        select nextval(d.completed_seq), d.unique_jobs into counted, keyed from done as d;
    else
        with done as (
            delete from awa.running_1 as r
             where r.job_id = complete.job_id and r.run_lease = complete.run_lease
               and coalesce(r.claimed_by, session_user) = session_user
            returning r.job_id, r.queue_id, r.priority, r.kind, r.attempt, r.max_attempts,
                r.enqueued_at, r.completed_seq, r.unique_jobs
        ),
        kept as (
            -- A completed job keeps no args, key or error: it never runs again.
            insert into awa.finished (
                job_id, slot, queue_id, priority, kind, state, attempt, max_attempts,
                enqueued_at, finished_at, args, ordering_key, last_error, max_run_time,
                unique_key, unique_window
            )
            select
                d.job_id, awa._finished_slot('completed', now()), d.queue_id, d.priority,
                d.kind, 'completed', d.attempt, d.max_attempts, d.enqueued_at, now(), null,
                null, null, null, null, null
              from done as d
        )
        -- The queue's counter, which the claim copied into the running row.
        select nextval(d.completed_seq), d.unique_jobs into counted, keyed from done as d;
    end if;
    -- Whether a run was deleted, not whether it counted: a running row
    -- without a counter (one an older layer claimed) completed all the same.
    if not found then
        with done as (
            delete from awa.running_carried as r
             where r.job_id = complete.job_id and r.run_lease = complete.run_lease
               and coalesce(r.claimed_by, session_user) = session_user
            returning r.job_id, r.queue_id, r.priority, r.kind, r.attempt, r.max_attempts,
                r.enqueued_at, r.completed_seq, r.unique_jobs
        ),
        kept as (
            -- A completed job keeps no args, key or error: it never runs again.
            insert into awa.finished (
                job_id, slot, queue_id, priority, kind, state, attempt, max_attempts,
                enqueued_at, finished_at, args, ordering_key, last_error, max_run_time,
                unique_key, unique_window
            )
            select
                d.job_id, awa._finished_slot('completed', now()), d.queue_id, d.priority,
                d.kind, 'completed', d.attempt, d.max_attempts, d.enqueued_at, now(), null,
                null, null, null, null, null
              from done as d
        )
        -- The queue's counter, which the claim copied into the running row.
        select nextval(d.completed_seq), d.unique_jobs into counted, keyed from done as d;
    end if;
    if not found then
        perform awa._check_no_run('awa.complete', complete.job_id, complete.run_lease);
        return false;
    end if;
    if keyed then
        perform awa._release_unique_key(complete.job_id, true);
    end if;
    return true;
end;
$$;

-- Function: awa._finish(job awa.running, state text, error text) returns void
-- A job that will not run again unless an operator retries it: a row in
-- the failed-and-cancelled ring of awa.finished with what a retry needs
-- (args, ordering key, max_attempts, its own max run time, the unique key
-- it gives back here), and one more on the queue's counter for `state`
-- ('failed' or 'cancelled'). awa.finished has no CHECK on its state (ADR
-- 030): this is where any other value is refused.
-- Errors: 22023 a state other than 'failed' or 'cancelled'.
-- Calls: awa._finished_slot, awa._release_unique_key
-- Writes: awa.finished
create or replace function awa._finish(job awa.running, state text, error text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    key bytea;
    key_window interval;
begin
    if state is null or state not in ('failed', 'cancelled') then
        raise exception 'state must be failed or cancelled, got %', coalesce(state, 'null')
            using errcode = '22023';
    end if;
    if job.unique_jobs then
        select u.unique_key, u.unique_window into key, key_window
          from awa._release_unique_key(job.job_id, false) as u;
    end if;
    insert into awa.finished (
        job_id, slot, queue_id, priority, kind, state, attempt, max_attempts, enqueued_at,
        finished_at, args, ordering_key, last_error, max_run_time, unique_key, unique_window
    ) values (
        job.job_id, awa._finished_slot(state, now()), job.queue_id, job.priority, job.kind,
        state, job.attempt, job.max_attempts, job.enqueued_at, now(), job.args,
        job.ordering_key, error, job.max_run_time, key, key_window
    );
    perform nextval(case state when 'failed' then m.failed_seq else m.cancelled_seq end)
       from awa.queue_meta as m
      where m.queue_id = job.queue_id;
end;
$$;

-- Function: awa._retry_or_fail(job awa.running, error text, retry_at timestamptz) returns void
-- After a failed attempt: back to awa.scheduled for a retry, at retry_at
-- when given, else after the queue's backoff (awa._retry_delay with its
-- retry policy: exponential with jitter), with its own max run time; or
-- finished as failed once attempt reaches max_attempts. A retry moves the
-- queue's retried counter (awa._provision_counters).
-- Calls: awa._finish, awa._retry_delay
-- Writes: awa.scheduled
create or replace function awa._retry_or_fail(
    job awa.running, error text, retry_at timestamptz
)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if job.attempt >= job.max_attempts then
        perform awa._finish(job, 'failed', error);
    else
        insert into awa.scheduled (
            job_id, queue_id, priority, kind, args, ordering_key, attempt, max_attempts,
            enqueued_at, run_at, last_error, max_run_time
        )
        select
            job.job_id, job.queue_id, job.priority, job.kind, job.args, job.ordering_key,
            job.attempt, job.max_attempts, job.enqueued_at,
            -- From the call, not its transaction's start (a handler may have
            -- run in it for longer than the delay); a retry_at already past
            -- is now (no unreadable date such as -infinity is kept).
            case when retry_at is null
                 then statement_timestamp() + awa._retry_delay(
                     job.attempt, m.retry_base, m.retry_cap, m.retry_jitter, random()
                 )
                 else greatest(retry_at, statement_timestamp()) end,
            error, job.max_run_time
          from awa.queue_meta as m
         where m.queue_id = job.queue_id;
        perform nextval(m.retried_seq)
           from awa.queue_meta as m
          where m.queue_id = job.queue_id;
    end if;
end;
$$;

-- Function: awa.fail(job_id bigint, run_lease bigint, error text, retry_at timestamptz)
-- Records a failed attempt: retried later (see awa._retry_or_fail) or failed
-- for good after max_attempts. False, changing nothing, for a stale lease.
-- The error is kept to its first 65,536 characters: it moves with the job
-- through the maintenance passes, which copy it (awa._pass_bytes).
-- Role: awa_worker.
-- Errors: 22023 retry_at not before 9999-12-31 UTC (awa._run_at_ok), before the
--   job is touched.
--   25000 no run for the lease outside read committed (awa._check_no_run).
-- Calls: awa._check_no_run, awa._check_run_at, awa._retry_or_fail, awa._run_at_ok
-- Writes: awa.running
create or replace function awa.fail(
    job_id bigint, run_lease bigint, error text, retry_at timestamptz default null
)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    job awa.running;
begin
    if not awa._run_at_ok(retry_at) then
        perform awa._check_run_at('retry_at', retry_at);
    end if;
    delete from awa.running as r
     where r.job_id = fail.job_id and r.run_lease = fail.run_lease
       and coalesce(r.claimed_by, session_user) = session_user
    returning r.* into job;
    if not found then
        perform awa._check_no_run('awa.fail', fail.job_id, fail.run_lease);
        return false;
    end if;
    perform awa._retry_or_fail(job, left(error, 65536), retry_at);
    return true;
end;
$$;

-- Function: awa.heartbeat(job_id bigint, run_lease bigint, extend interval) returns boolean
-- Extends a running job's lease to the call's time + extend, never past the job's
-- deadline: true while the run is the caller's, though past the deadline
-- the lease no longer moves and the rescue takes the job. False for a
-- stale lease.
-- Role: awa_worker.
-- Errors: 22023 extend not positive or over 30 days (awa._lease_ok); 22004 null extend.
--   25000 no run for the lease outside read committed (awa._check_no_run).
-- Calls: awa._check_lease, awa._check_no_run, awa._in_seconds, awa._lease_ok
-- Writes: awa.running
create or replace function awa.heartbeat(job_id bigint, run_lease bigint, extend interval)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    if not awa._lease_ok(extend) then
        perform awa._check_lease('extend', extend);
    end if;
    update awa.running as r
       set heartbeat_at = statement_timestamp(), lease_expires_at = least(
           statement_timestamp() + awa._in_seconds(extend), r.deadline_at
       )
     where r.job_id = heartbeat.job_id and r.run_lease = heartbeat.run_lease
       and coalesce(r.claimed_by, session_user) = session_user;
    if not found then
        perform awa._check_no_run('awa.heartbeat', heartbeat.job_id, heartbeat.run_lease);
        return false;
    end if;
    return true;
end;
$$;

-- Function: awa.run_outcome(job_id bigint, run_lease bigint, attempt integer) returns text
-- The outcome the database holds now for one run of a job, read only:
-- 'running', 'completed', 'failed' or 'gone'. For a worker whose
-- awa.complete or awa.fail went out on a connection lost before its answer
-- and whose second send answered false: did the first one commit?
-- 'running': the run still holds its lease. 'completed': the job completed
-- at this attempt, which only this run's awa.complete does. 'failed': this
-- attempt ended as a failure: the job waits for its retry at this attempt,
-- failed for good at it, was cancelled while it waited for that retry (its
-- last error names the failure: awa._cancelled_after_failure), or has run again
-- since (a later attempt, in any state); recorded by awa.fail, or by
-- awa.rescue_expired once the lease ran out: the rows do not tell which.
-- 'gone': none of these: cancelled while it ran, an unknown job, or one
-- removed (retention, a dropped queue). Once its running row is gone a run
-- is known by its attempt: each claim counts one more, a retry keeps it,
-- and only awa.retry_job starts a job's attempts over (at 0), after which
-- an attempt names a later run too: an answer about a job an operator
-- retried since the run is not to be trusted. Reads like awa.job
-- (awa._job_at): by key, and a ready, unknown or removed job costs a
-- bisection of each lane with ready rows, never the backlog or history.
-- Role: awa_worker.
-- Errors: 22004 a null argument; 22023 attempt below 1; 25000 outside read
--   committed (a snapshot from before a rotation of awa.running or a prune
--   could miss the rows that it moved).
-- Calls: awa._cancelled_after_failure, awa._check_read_committed, awa._check_run_owner, awa._job_at
-- Writes: nothing
create or replace function awa.run_outcome(job_id bigint, run_lease bigint, attempt integer)
returns text
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    here record;
begin
    if job_id is null or run_lease is null or attempt is null then
        raise exception '% must not be null',
            case when job_id is null then 'job_id'
                 when run_lease is null then 'run_lease' else 'attempt' end
            using errcode = '22004';
    end if;
    if attempt < 1 then
        raise exception 'attempt must be 1 or more (a claim counts from 1), got %', attempt
            using errcode = '22023';
    end if;
    perform awa._check_read_committed('awa.run_outcome');
    if exists (
        select from awa.running as r
         where r.job_id = run_outcome.job_id and r.run_lease = run_outcome.run_lease
           and r.attempt = run_outcome.attempt
           and coalesce(r.claimed_by, session_user) = session_user
    ) then
        return 'running';
    end if;
    perform awa._check_run_owner('awa.run_outcome', run_outcome.job_id, run_outcome.run_lease);
    -- Above every id handed out: no job, and no scan.
    if job_id > coalesce(pg_sequence_last_value('awa.job_id_seq'), 0) then
        return 'gone';
    end if;
    -- The job's one row, in one snapshot, wherever it is now.
    select j.state, j.attempt, j.last_error into here
      from awa._job_at(run_outcome.job_id) as j;
    if not found or here.attempt < attempt then
        return 'gone';
    elsif here.attempt > attempt then
        return 'failed';
    elsif here.state = 'completed' then
        return 'completed';
    elsif here.state in ('scheduled', 'ready', 'failed') then
        return 'failed';
    elsif here.state = 'cancelled' and awa._cancelled_after_failure(here.last_error) then
        return 'failed';
    end if;
    -- Cancelled while it ran, or running at this attempt under another
    -- lease (a run after an operator's retry).
    return 'gone';
end;
$$;

-- Function: awa.rescue_expired(max_jobs integer default 10000) returns integer
-- Running jobs whose lease expired go back to retry with the attempt
-- counted (or fail after max_attempts). The old run_lease is dead from then
-- on. A lease never runs past the job's deadline (awa.claim,
-- awa.heartbeat), so a job past its deadline is one of them; its last error
-- says 'deadline exceeded after N s' (N its max run time) when the lease
-- ended at the deadline, else 'lease expired'.
-- Up to max_jobs, oldest lease first, and awa._pass_bytes() of payload
-- (at least one job). The runs are locked first, then the rows of the
-- unique keys they hold, in (scope, key) order (awa._lock_unique_keys):
-- a job that fails for good gives its key back (awa._finish), and given
-- back in the order the runs came, a key held while a lower one was
-- waited for deadlocked with a join of the queue to a family
-- (awa._join_unique_scope, 40P01).
-- Role: awa_maintenance. Returns how many jobs it rescued.
-- Calls: awa._check_limit, awa._job_bytes, awa._lock_unique_keys, awa._note_run, awa._pass_bytes,
--   awa._retry_or_fail
-- Writes: awa.running
create or replace function awa.rescue_expired(max_jobs integer default 10000)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    job awa.running;
    rescued integer := 0;
    expired bigint[];
    keyed bigint[];
begin
    perform awa._check_limit('max_jobs', max_jobs);
    perform awa._note_run('rescue');
    select coalesce(array_agg(w.job_id), '{}'),
           coalesce(array_agg(w.job_id) filter (where w.unique_jobs), '{}')
      into expired, keyed
      from (
          -- The expired runs locked, then those whose payload before them
          -- is under awa._pass_bytes() (sql/enqueue.sql).
          select y.job_id, y.unique_jobs,
                 sum(y.bytes) over (order by y.lease_expires_at, y.job_id)
                 - y.bytes as bytes_before
            from (
                select x.job_id, x.lease_expires_at, x.unique_jobs,
                       awa._job_bytes(x.kind, x.args, x.worker) as bytes
                  from awa.running as x
                 where x.lease_expires_at < now()
                 order by x.lease_expires_at, x.job_id
                 limit max_jobs
                   for update skip locked
            ) as y
      ) as w
     where w.bytes_before < awa._pass_bytes();
    -- Those of the jobs that will be retried too: their keys stay held,
    -- and a lock of a live job's key row holds up no enqueue of the key.
    perform awa._lock_unique_keys(keyed);
    for job in
        delete from awa.running as r where r.job_id = any(expired) returning r.*
    loop
        perform awa._retry_or_fail(
            job,
            case when job.lease_expires_at >= job.deadline_at
                 then format('deadline exceeded after %s s',
                             trim_scale(extract(epoch from job.deadline_at - job.claimed_at)))
                 else 'lease expired' end,
            null
        );
        rescued := rescued + 1;
    end loop;
    return rescued;
end;
$$;

select awa._grant_execute('awa._advance_lane_hints(integer[], bigint[], bigint[])');
select awa._grant_execute('awa._move_lane_hints(integer[])');
select awa._grant_execute('awa._claim_hint_step()');
select awa._grant_execute('awa._claim_walk_shard(integer, integer, integer, integer)');
select awa._grant_execute('awa._walked_shards(integer, integer)');
select awa._grant_execute('awa.claim(text[], integer, text, interval, boolean)', 'worker');
select awa._grant_execute('awa.complete(bigint, bigint)', 'worker');
select awa._grant_execute('awa._finish(awa.running, text, text)');
select awa._grant_execute('awa._retry_or_fail(awa.running, text, timestamptz)');
select awa._grant_execute('awa.fail(bigint, bigint, text, timestamptz)', 'worker');
select awa._grant_execute('awa.heartbeat(bigint, bigint, interval)', 'worker');
select awa._grant_execute('awa.run_outcome(bigint, bigint, integer)', 'worker');
select awa._grant_execute('awa.rescue_expired(integer)', 'maintenance');
