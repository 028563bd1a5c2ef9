-- queues.sql: queue names, queue creation, lane provisioning and lane locks.
--
-- Locks: the leader lock 'provisioning' (awa._lock_leader, sql/private.sql),
-- creating queues and lanes, serialised.
-- Nothing here is granted to a runtime role: the public definers call it.

-- The rules for a job row, each defined once as an inlined predicate (see
-- sql/private.sql): every path decides with these, and the awa._check_*
-- functions, which raise the error a caller sees, are built on them. Each
-- is written with as few function calls as it can be: every call in an
-- expression costs its set-up (an EXECUTE check and a lookup) again in each
-- transaction, before it computes anything (docs/benchmarks.md).

-- Function: awa._queue_name_ok(queue text) returns boolean
-- A queue name is 1 to 200 bytes of UTF-8 text without '#', which is
-- reserved for stripes (name#0, name#1, ...). Anything else is allowed:
-- quotes, ';', spaces, newlines, any script. Names are compared byte for
-- byte, so NFC and NFD spellings are two queues. False for null.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._queue_name_ok(queue text)
returns boolean
language sql
immutable parallel safe
as $$
    select queue is not null
       and pg_catalog.octet_length(queue) operator(pg_catalog.<@) '[1,200]'::pg_catalog.int4range
       and queue operator(pg_catalog.!~~) '%#%'
$$;

-- Function: awa._priority_ok(priority smallint) returns boolean
-- 1 (highest) to 4 (lowest). False for null.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._priority_ok(priority smallint)
returns boolean
language sql
immutable parallel safe
as $$
    select coalesce(
        priority operator(pg_catalog.=) any ('{1,2,3,4}'::pg_catalog.int2[]), false
    )
$$;

-- Function: awa._max_attempts_ok(max_attempts integer) returns boolean
-- 1 to 1000. False for null.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._max_attempts_ok(max_attempts integer)
returns boolean
language sql
immutable parallel safe
as $$
    select coalesce(
        max_attempts operator(pg_catalog.<@) '[1,1000]'::pg_catalog.int4range, false
    )
$$;

-- Function: awa._job_ok(queue, kind, priority, max_attempts) returns boolean
-- The row check of every enqueue path: a valid queue name, a kind, a valid
-- priority and max_attempts. Paths that default a null element (batch,
-- COPY) pass the defaulted value.
-- Calls: awa._max_attempts_ok, awa._priority_ok, awa._queue_name_ok
-- Writes: nothing
create or replace function awa._job_ok(
    queue text, kind text, priority smallint, max_attempts integer
)
returns boolean
language sql
immutable parallel safe
as $$
    select awa._queue_name_ok(queue) and kind is not null and awa._priority_ok(priority)
       and awa._max_attempts_ok(max_attempts)
$$;

-- The job row's defaults, each defined once as an inlined constant (see
-- sql/private.sql): every path that fills in a value the caller left out
-- (a null element of a batch or a COPY row, a new job's first attempt)
-- uses these, so the planner folds them and they cost nothing at run
-- time. The public signatures (awa.enqueue's parameter defaults, the
-- Python client's) write the same numbers, since a default expression runs
-- as the caller, who may not execute these; tests/test_inlined_functions.py
-- checks that they agree.

-- Function: awa._default_priority() returns smallint
-- The priority of a job that names none: 2 (1 is the highest, 4 the
-- lowest). Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._default_priority()
returns smallint
language sql
immutable parallel safe
as $$
    select 2::pg_catalog.int2
$$;

-- Function: awa._default_max_attempts() returns integer
-- How many attempts a job that names no max_attempts gets: 25. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._default_max_attempts()
returns integer
language sql
immutable parallel safe
as $$
    select 25
$$;

-- Function: awa._default_args() returns jsonb
-- The args of a job that names none: the empty object. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._default_args()
returns jsonb
language sql
immutable parallel safe
as $$
    select '{}'::pg_catalog.jsonb
$$;

-- Function: awa._first_attempt() returns integer
-- The attempt of a job that has not run yet (a new job, or one an operator
-- retries): 0; each claim adds one. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._first_attempt()
returns integer
language sql
immutable parallel safe
as $$
    select 0
$$;

-- Function: awa._max_run_time_ok(max_run_time interval) returns boolean
-- A job's own max run time: none (null), or 1 second to 30 days, in
-- seconds, as it is applied (awa._in_seconds): compared as an interval,
-- '-1 year 361 days' is one day and '1 year -335 days' 25, where their
-- seconds are -4.25 and 30.25 days. Not part of awa._job_ok: the fast
-- paths serve only jobs that carry none (a null test costs them nothing,
-- two comparisons would), and test this where a job carries one.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._max_run_time_ok(max_run_time interval)
returns boolean
language sql
immutable parallel safe
as $$
    select max_run_time is null
        or (pg_catalog.date_part('epoch', max_run_time) operator(pg_catalog.>=) 1
            and pg_catalog.date_part('epoch', max_run_time) operator(pg_catalog.<=) 2592000)
$$;

-- Function: awa._in_seconds(duration interval) returns interval
-- A duration as seconds only (days count 24 hours, months 30 days), the
-- form every max run time is stored in: a deadline is claimed_at plus it
-- whatever the session's time zone, where a '1 day' would be 23 or 25 hours
-- across a daylight-saving change.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._in_seconds(duration interval)
returns interval
language sql
immutable parallel safe
as $$
    select '1 second'::pg_catalog.interval
        operator(pg_catalog.*) pg_catalog.date_part('epoch', duration)
$$;

-- Function: awa._check_queue_name(queue text) returns void
-- Raises the error for a name awa._queue_name_ok refuses: 22004 for null,
-- else 22023.
-- Calls: awa._queue_name_ok
-- Writes: nothing
create or replace function awa._check_queue_name(queue text)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if awa._queue_name_ok(queue) then
        return;
    elsif queue is null then
        raise exception 'queue must not be null'
            using errcode = '22004';
    elsif strpos(queue, '#') > 0 then
        raise exception 'queue name must not contain ''#'' (reserved for stripes), got %',
            quote_literal(queue)
            using errcode = '22023';
    end if;
    if queue = '' then
        raise exception 'queue name must be 1 to 200 bytes, got an empty name'
            using errcode = '22023';
    end if;
    raise exception 'queue name must be 1 to 200 bytes, got % bytes: %',
        octet_length(queue), quote_literal(left(queue, 64))
        using errcode = '22023',
              hint = 'Use a shorter name; long names cost nothing in lane names or locks, '
                     'but 200 bytes is the contract.';
end;
$$;

-- Function: awa._check_priority(priority smallint) returns void
-- Raises for a priority awa._priority_ok refuses: 22004 null (a call that
-- wants the default leaves it out), 22023 out of range.
-- Calls: awa._default_priority, awa._priority_ok
-- Writes: nothing
create or replace function awa._check_priority(priority smallint)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if priority is null then
        raise exception 'priority must not be null (1 to 4; leave it out for the default, %)',
            awa._default_priority()
            using errcode = '22004';
    end if;
    if not awa._priority_ok(priority) then
        raise exception 'priority must be between 1 (highest) and 4 (lowest), got %', priority
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._check_job(queue, kind, priority, max_attempts, max_run_time) returns void
-- Raises the error for the first part of a row awa._job_ok or
-- awa._max_run_time_ok refuses, in the order queue, kind, priority,
-- max_attempts, max_run_time; returns for a row they accept.
-- Calls: awa._check_max_run_time, awa._check_priority, awa._check_queue_name,
--   awa._default_max_attempts, awa._job_ok, awa._max_attempts_ok, awa._max_run_time_ok
-- Writes: nothing
create or replace function awa._check_job(
    queue text, kind text, priority smallint, max_attempts integer,
    max_run_time interval default null
)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if awa._job_ok(queue, kind, priority, max_attempts)
       and awa._max_run_time_ok(max_run_time) then
        return;
    end if;
    perform awa._check_queue_name(queue);
    if kind is null then
        raise exception 'kind must not be null'
            using errcode = '22004';
    end if;
    perform awa._check_priority(priority);
    if max_attempts is null then
        raise exception 'max_attempts must not be null (1 to 1000; leave it out for the '
                        'default, %)', awa._default_max_attempts()
            using errcode = '22004';
    end if;
    if not awa._max_attempts_ok(max_attempts) then
        raise exception 'max_attempts must be between 1 and 1000, got %', max_attempts
            using errcode = '22023';
    end if;
    perform awa._check_max_run_time(max_run_time);
end;
$$;

-- Function: awa._check_max_run_time(max_run_time interval) returns void
-- Raises 22023 for a max run time awa._max_run_time_ok refuses.
-- Calls: awa._max_run_time_ok
-- Writes: nothing
create or replace function awa._check_max_run_time(max_run_time interval)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if not awa._max_run_time_ok(max_run_time) then
        raise exception 'max_run_time must be between 1 second and 30 days, got %',
            max_run_time
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._run_at_ok(run_at timestamptz) returns boolean
-- A time to run a job at (an enqueue's run_at, a failed attempt's
-- retry_at): none (null: now), or before 9999-12-31 00:00 UTC, so that it
-- is a date before year 10000 in every time zone. A later one (infinity
-- included) would never run, and clients that hold dates in a year of four
-- digits (Python's datetime among them) fail to read it: the job tools
-- failed on the whole queue that held one. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._run_at_ok(run_at timestamptz)
returns boolean
language sql
immutable parallel safe
as $$
    select run_at is null
        or run_at operator(pg_catalog.<) '9999-12-31 00:00:00+00'::pg_catalog.timestamptz
$$;

-- Function: awa._check_run_at(what text, run_at timestamptz) returns void
-- Raises 22023 for a time awa._run_at_ok refuses, naming the argument and
-- the value (in UTC, whatever the session's time zone).
-- Calls: awa._run_at_ok
-- Writes: nothing
create or replace function awa._check_run_at(what text, run_at timestamptz)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if not awa._run_at_ok(run_at) then
        raise exception '% must be before 9999-12-31 00:00:00+00, got % UTC', what,
            pg_catalog.timezone('UTC', run_at)
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._lease_ok(lease interval) returns boolean
-- A lease given to a claim or a heartbeat: not null, positive, and at most
-- 30 days (the longest max run time: awa._max_run_time_ok), in seconds, as
-- it is applied (awa._in_seconds): '1 mon -30 days 1 second' is one second,
-- where now() plus it in February would be two days in the past. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lease_ok(lease interval)
returns boolean
language sql
immutable parallel safe
as $$
    select lease is not null
       and pg_catalog.date_part('epoch', lease) operator(pg_catalog.>) 0
       and pg_catalog.date_part('epoch', lease) operator(pg_catalog.<=) 2592000
$$;

-- Function: awa._check_lease(what text, lease interval) returns void
-- Raises 22023 (22004 for null) for a lease awa._lease_ok refuses, naming
-- the argument and the value.
-- Calls: awa._lease_ok
-- Writes: nothing
create or replace function awa._check_lease(what text, lease interval)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if lease is null then
        raise exception '% must not be null', what using errcode = '22004';
    end if;
    if not awa._lease_ok(lease) then
        raise exception '% must be a positive interval of at most 30 days, got %', what, lease
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._limit_ok(value integer) returns boolean
-- A call's limit on what it handles (max_jobs of a claim, a promote or a
-- rescue, max_rows, max_keys, max_transactions): 0 or more (0 does
-- nothing). False for null. Inlined, so the claim's check costs no call.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._limit_ok(value integer)
returns boolean
language sql
immutable parallel safe
as $$
    select coalesce(value operator(pg_catalog.>=) 0, false)
$$;

-- Function: awa._check_limit(what text, value integer) returns void
-- Raises 22023 for a limit awa._limit_ok refuses, naming `what`; 22004
-- for null, as every other null argument.
-- Calls: awa._limit_ok
-- Writes: nothing
create or replace function awa._check_limit(what text, value integer)
returns void
language plpgsql
immutable parallel safe
set search_path = pg_catalog, pg_temp
as $$
begin
    if value is null then
        raise exception '% must not be null', what using errcode = '22004';
    end if;
    if not awa._limit_ok(value) then
        raise exception '% must be 0 or more, got %', what, value using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._counter_seq_name(queue_id integer, counter text) returns text
-- The name, in schema awa, of one of a queue's counters ('completed',
-- 'failed', 'cancelled', 'retried'): awa._provision_counters creates it,
-- awa.queue_meta records it, awa._queue_counter finds it by it. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._counter_seq_name(queue_id integer, counter text)
returns text
language sql
immutable parallel safe
as $$
    select 'queue_' operator(pg_catalog.||) queue_id::pg_catalog.text
           operator(pg_catalog.||) '_' operator(pg_catalog.||) counter
$$;

-- Function: awa._provision_counters(queue_id integer) returns void
-- Gives a physical queue each of its counters it has none of: one sequence
-- per terminal state and one of retried attempts
-- (queue_<queue_id>_<counter> in schema awa), kept in awa.queue_meta
-- (completed_seq, failed_seq, cancelled_seq, retried_seq). A sequence,
-- because every worker that finishes a job moves it: nextval never waits
-- for another transaction and leaves no dead row. A queue that already had
-- terminal jobs (an upgrade) starts at their count; the retried counter
-- starts at 0 (what was retried before it was made is not kept). The
-- caller holds the provisioning lock, or runs in the function layer's
-- transaction.
-- Calls: awa._counter_seq_name
-- Writes: awa.queue_meta
create or replace function awa._provision_counters(queue_id integer)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    counters text[] := array['completed', 'failed', 'cancelled', 'retried'];
    seqs regclass[];
    so_far bigint;
begin
    select array[m.completed_seq, m.failed_seq, m.cancelled_seq, m.retried_seq] into seqs
      from awa.queue_meta as m
     where m.queue_id = _provision_counters.queue_id;
    if array_position(seqs, null) is null then
        return;
    end if;
    for i in 1 .. cardinality(counters) loop
        continue when seqs[i] is not null;
        execute format('create sequence if not exists awa.%I as bigint',
                       awa._counter_seq_name(queue_id, counters[i]));
        seqs[i] := format('awa.%I', awa._counter_seq_name(queue_id, counters[i]))::regclass;
        if counters[i] <> 'retried' then
            select count(*) into so_far
              from awa.finished as f
             where f.queue_id = _provision_counters.queue_id and f.state = counters[i];
            if so_far > 0 then
                perform setval(seqs[i], so_far);
            end if;
        end if;
    end loop;
    update awa.queue_meta as m
       set completed_seq = seqs[1], failed_seq = seqs[2], cancelled_seq = seqs[3],
           retried_seq = seqs[4]
     where m.queue_id = _provision_counters.queue_id;
end;
$$;

-- Function: awa._count_lane_shards(queue_id integer) returns void
-- Sets queue_meta.lane_shards of one physical queue (every queue for null)
-- to the shards its lanes span, counted from its lanes of priority 1
-- (every priority has the same, awa._provision_lanes makes them together):
-- counted, not assumed, so lanes an earlier function layer made during an
-- upgrade count too. The one count of queue_meta.lane_shards (which
-- awa.retire_lanes lowers past drained lanes above S, ADR 041); each
-- queue's lanes are read once.
-- Calls: nothing
-- Writes: awa.queue_meta
create or replace function awa._count_lane_shards(queue_id integer)
returns void
language sql
set search_path = pg_catalog, pg_temp
as $$
    update awa.queue_meta as m
       set lane_shards = c.shards
      from (
          select l.queue_id, count(*)::smallint as shards
            from awa.lanes as l
           where l.priority = 1
             and (_count_lane_shards.queue_id is null
                  or l.queue_id = _count_lane_shards.queue_id)
           group by l.queue_id
      ) as c
     where m.queue_id = c.queue_id and m.lane_shards <> c.shards
$$;

-- Function: awa._count_linked() returns void
-- Sets queue_meta.has_linked on every queue another queue links to (the
-- logical queue of a stripe, the root of a partition or stripe): a claim by
-- its name must read those too, so awa.claim reads a queue's row alone only
-- where it is false. Never cleared: a link is never removed. The one writer
-- of has_linked; counted, not assumed, so links an earlier function layer
-- made during an upgrade count too. It takes the provisioning lock first,
-- which every link holds until it commits (awa._ensure_linked): a link in
-- flight when the layer is applied is waited for and counted, not missed.
-- Calls: awa._lock_leader
-- Writes: awa.queue_meta
create or replace function awa._count_linked()
returns void
language sql
set search_path = pg_catalog, pg_temp
as $$
    select awa._lock_leader('provisioning');
    update awa.queue_meta as m
       set has_linked = true
     where not m.has_linked
       and exists (
           select
             from awa.queue_meta as x
            where x.logical_queue = m.queue or x.root_queue = m.queue
       );
$$;

-- Function: awa._provision_lanes(queue_id integer, shards integer) returns integer
-- Creates every missing (priority, shard) lane below shards for one physical
-- queue, each with its own sequence awa.lane_seq_<lane_id>, and records
-- them in the queue's awa.queue_meta.lane_ids, lane_seqs and lane_shards
-- (the shards they span, which a claim walks); and the
-- queue's terminal counters (awa._provision_counters) when it has none.
-- Returns how many lanes it created. The caller holds the provisioning lock.
-- Errors: 2200H fewer lane ids left (an int4, never given back) than the
--   lanes it needs, before it makes any (docs/operations.md, "Counters and
--   their horizons").
-- Calls: awa._count_lane_shards, awa._lane_seq_name, awa._provision_counters
-- Writes: awa.lanes, awa.queue_meta
create or replace function awa._provision_lanes(queue_id integer, shards integer)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    created integer := 0;
    new_id integer;
    new_seq regclass;
    ids integer[];
    seqs regclass[];
    need_p smallint[];
    need_s smallint[];
    ids_left bigint;
    top bigint;
begin
    select m.lane_ids, m.lane_seqs into strict ids, seqs
      from awa.queue_meta as m where m.queue_id = _provision_lanes.queue_id;
    select coalesce(array_agg(p.priority::smallint order by p.priority, s.shard), '{}'),
           coalesce(array_agg(s.shard::smallint order by p.priority, s.shard), '{}')
      into need_p, need_s
      from generate_series(1, 4) as p (priority)
     cross join generate_series(0, shards - 1) as s (shard)
     where not exists (
         select from awa.lanes as l
          where l.queue_id = _provision_lanes.queue_id
            and l.priority = p.priority
            and l.shard = s.shard
     );
    -- All or none, and said so: the identity's own error came at the lane
    -- past its last id, naming a sequence, not what ran out. Read from the
    -- sequence itself: pg_sequence_last_value is null after a restart.
    select q.seqmax - (n.last_value - case when n.is_called then 0 else 1 end), q.seqmax
      into strict ids_left, top
      from awa.lanes_lane_id_seq as n
     cross join pg_sequence as q
     where q.seqrelid = 'awa.lanes_lane_id_seq'::regclass;
    if cardinality(need_p) > ids_left then
        raise exception 'lane ids used up: % more lanes needed, % of the lane ids up to % left',
            cardinality(need_p), ids_left, top
            using errcode = '2200H',
                  hint = 'Lane ids are never given back: every lane a queue gets takes one, '
                         'in a transaction that rolls back too. No queue can be created, '
                         'nor S raised past the shards a queue has had.';
    end if;
    for i in 1 .. cardinality(need_p) loop
        new_id := nextval('awa.lanes_lane_id_seq');
        execute format('create sequence awa.%I as bigint', awa._lane_seq_name(new_id));
        new_seq := format('awa.%I', awa._lane_seq_name(new_id))::regclass;
        insert into awa.lanes (lane_id, queue_id, priority, shard, seq)
        overriding system value
        values (new_id, _provision_lanes.queue_id, need_p[i], need_s[i], new_seq);
        ids[need_p[i]][need_s[i]] := new_id;
        seqs[need_p[i]][need_s[i]] := new_seq;
        created := created + 1;
    end loop;
    if created > 0 then
        update awa.queue_meta as m set lane_ids = ids, lane_seqs = seqs
         where m.queue_id = _provision_lanes.queue_id;
    end if;
    perform awa._count_lane_shards(_provision_lanes.queue_id);
    perform awa._provision_counters(_provision_lanes.queue_id);
    return created;
end;
$$;

-- Function: awa._take_queue_place() returns void
-- Counts one more physical queue in awa.queue_limit, or raises 53400 when
-- they already number max_queues: every creation of a queue row calls it,
-- in the transaction that inserts the row, so a rollback gives the place
-- back. An UPDATE of the one row: two creations cannot both take the last
-- place, and one in a repeatable read transaction that began before
-- another's commit fails to serialize (40001) instead of counting from its
-- snapshot.
-- Calls: awa._raise_queue_limit
-- Writes: awa.queue_limit
create or replace function awa._take_queue_place()
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    update awa.queue_limit as l set queues = l.queues + 1
     where l.queues < l.max_queues;
    if not found then
        perform awa._raise_queue_limit(null);
    end if;
end;
$$;

-- Function: awa._raise_queue_limit(creating text[]) returns void
-- Raises 53400: the queues already number max_queues, or there is no room
-- for all of `creating`, the names a call is about to create (null: one).
-- Calls: nothing
-- Writes: nothing
create or replace function awa._raise_queue_limit(creating text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    cap integer;
    queues bigint;
begin
    select l.max_queues, l.queues into cap, queues from awa.queue_limit as l;
    raise exception 'queue limit reached: % queues exist and at most % may%', queues, cap,
        case when creating is null then ''
             else format('; this call would create %s more (%s, ...)', cardinality(creating),
                         quote_literal(creating[1])) end
        using errcode = '53400',
              hint = 'awa.set_max_queues(n) (awa_operator) raises the limit. Each queue '
                     'costs eight sequences; a queue name made from input (an id, a '
                     'tenant) creates a queue per value.';
end;
$$;

-- Function: awa.set_max_queues(max_queues integer) returns integer
-- The most physical queues (partitions and stripes count) that may exist;
-- returns how many exist now. A limit below that count removes nothing:
-- only new queues are refused. Role: awa_operator.
-- Errors: 22004 null; 22023 outside 1 .. 1000000.
-- Calls: awa._check_range
-- Writes: awa.queue_limit
create or replace function awa.set_max_queues(max_queues integer)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    counted bigint;
begin
    perform awa._check_range('max_queues', max_queues, 1000000);
    update awa.queue_limit as l set max_queues = set_max_queues.max_queues
    returning l.queues into strict counted;
    return counted;
end;
$$;

-- Function: awa._ensure_queue(queue text) returns awa.queue_meta
-- The queue's settings row; a queue seen for the first time is created with
-- S = 1 and its four lanes, under the provisioning lock so that concurrent
-- first enqueues cannot race, unless the queues already number the limit
-- (awa._take_queue_place: 53400).
-- Calls: awa._check_queue_name, awa._lock_leader, awa._provision_lanes, awa._take_queue_place
-- Writes: awa.queue_meta
create or replace function awa._ensure_queue(queue text)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
begin
    select m.* into meta from awa.queue_meta as m where m.queue = _ensure_queue.queue;
    if found then
        return meta;
    end if;
    perform awa._check_queue_name(queue);
    perform awa._lock_leader('provisioning');
    -- Made by another transaction while this one waited: nothing to create.
    select m.* into meta from awa.queue_meta as m where m.queue = _ensure_queue.queue;
    if found then
        return meta;
    end if;
    perform awa._take_queue_place();
    insert into awa.queue_meta (queue) values (_ensure_queue.queue)
    on conflict do nothing;
    select m.* into strict meta from awa.queue_meta as m where m.queue = _ensure_queue.queue;
    if awa._provision_lanes(meta.queue_id, meta.enqueue_shards) > 0 then
        select m.* into strict meta from awa.queue_meta as m where m.queue_id = meta.queue_id;
    end if;
    return meta;
end;
$$;

-- Function: awa._check_queue_room(names text[]) returns void
-- Raises 53400 (awa._raise_queue_limit) when the names of `names` that no
-- queue has yet would not all fit under the queue limit: a call that
-- creates several queues checks them as a whole before it creates any.
-- One by one, a call refused at the limit's last place had created every
-- queue before it (their lanes' ids and sequences spent for good, the lock
-- held all along), and a client that tried again spent as many again. The
-- caller holds the provisioning lock, which every creation takes: a name
-- another transaction made while this one waited is not counted.
-- Calls: awa._raise_queue_limit
-- Writes: nothing
create or replace function awa._check_queue_room(names text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    missing text[];
begin
    select array_agg(u.q order by u.q) into missing
      from unnest(names) as u (q)
     where not exists (select from awa.queue_meta as m where m.queue = u.q);
    -- Nothing to create passes, whatever the count: a limit lowered below it
    -- refuses only new queues.
    if missing is not null and (select l.queues + cardinality(missing) > l.max_queues
                                  from awa.queue_limit as l) then
        perform awa._raise_queue_limit(missing);
    end if;
end;
$$;

-- Function: awa._ensure_queues(names text[]) returns void
-- Creates the queues of `names` (names no queue has, in name order, so
-- that concurrent calls agree) with awa._ensure_queue. More than one is
-- first checked against the queue limit as a whole, under the
-- provisioning lock (awa._check_queue_room).
-- Errors: 53400 no room for them all (awa._raise_queue_limit).
-- Calls: awa._check_queue_room, awa._ensure_queue, awa._lock_leader
-- Writes: nothing
create or replace function awa._ensure_queues(names text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q text;
begin
    if cardinality(names) > 1 then
        perform awa._lock_leader('provisioning');
        perform awa._check_queue_room(names);
    end if;
    foreach q in array names loop
        perform awa._ensure_queue(q);
    end loop;
end;
$$;

-- Function: awa._lock_queue(queue text, create_missing boolean default true) returns awa.queue_meta
-- The queue's settings row, locked until the transaction ends: the first
-- lock of an operator's change of a queue's settings (its pause, its shard
-- mode); a change that may create queues or lanes, or a drop, takes the
-- provisioning lock before it (awa._lock_queue_provisioning). A missing
-- queue is created (awa._ensure_queue), or with create_missing false is
-- 42704 naming it (awa._queue). Locked by its id and its name: a drop
-- (awa.drop_queue) that committed while this waited for the row renamed
-- it, and the name is then no queue's: created as any new name is, or
-- 42704. Taken by its id alone, the change went to the dropped
-- queue. Locked for no key update: it conflicts with every other change
-- of the queue and with a drop (for update), not with the key share an
-- enqueue of a job for later holds until it commits.
-- Calls: awa._ensure_queue, awa._queue
-- Writes: nothing
create or replace function awa._lock_queue(queue text, create_missing boolean default true)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
begin
    loop
        if create_missing then
            meta := awa._ensure_queue(queue);
        else
            meta := awa._queue(queue);
        end if;
        select m.* into meta
          from awa.queue_meta as m
         where m.queue_id = meta.queue_id and m.queue = _lock_queue.queue
           for no key update;
        if found then
            return meta;
        end if;
    end loop;
end;
$$;

-- Function: awa._lock_queue_provisioning(queue text, create_missing boolean default true)
--           returns awa.queue_meta
-- The provisioning lock, then the queue's row (awa._lock_queue): the first
-- locks of an operator's call that may create queues or lanes (a change of
-- S, partitions or stripes) or removes a queue (a drop). Never the row
-- first: a producer that creates a queue holds the provisioning lock until
-- it commits, and when the same call enqueues another queue's first keyed
-- job it then marks that queue's row (awa._mark_unique_jobs), once it
-- holds its lanes. A call that held the row while it waited for the
-- provisioning lock closed the cycle (40P01, two single calls).
-- Calls: awa._lock_leader, awa._lock_queue
-- Writes: nothing
create or replace function awa._lock_queue_provisioning(
    queue text, create_missing boolean default true
)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._lock_leader('provisioning');
    return awa._lock_queue(queue, create_missing);
end;
$$;

-- Function: awa._ensure_linked(physical text, logical text, is_stripe boolean)
-- A physical queue that belongs to a logical one (a stripe or a partition),
-- created with the logical queue's S, pause state, max run time, retry
-- policy, retention and lanes when missing; an existing ordinary queue of that name
-- joins it, keeping its settings, with the unique keys its jobs hold
-- (awa._join_unique_scope). Either way it takes the root's shard mode,
-- max_shards and opt-in record: the family's, which awa.set_shard_mode
-- sets on every member and the auto-scaler reads from the root, and by
-- which awa._count_lanes samples each member's ready depth and lag. One
-- with partitions or stripes of its own cannot join: they would stay
-- linked to it, out of the family's claims.
-- Errors: 0A000 the queue of that name has partitions or stripes; 55006
--   (awa._join_unique_scope).
-- Calls: awa._count_linked, awa._ensure_queue, awa._join_unique_scope, awa._lock_leader,
--   awa._provision_lanes, awa._take_queue_place
-- Writes: awa.queue_meta
create or replace function awa._ensure_linked(physical text, logical text, is_stripe boolean)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
    root awa.queue_meta;
    meta awa.queue_meta;
begin
    select m.* into meta from awa.queue_meta as m where m.queue = physical;
    if found and meta.root_queue is not null then
        return meta;
    end if;
    if found and (meta.has_linked or meta.partitions > 1 or meta.stripes > 1) then
        raise exception 'queue % has partitions or stripes of its own: it cannot become a % of %',
            quote_literal(physical), case when is_stripe then 'stripe' else 'partition' end,
            quote_literal(logical)
            using errcode = '0A000',
                  hint = 'Name the logical queue otherwise: a queue that has had partitions or '
                         'stripes cannot be dropped yet.';
    end if;
    anchor := awa._ensure_queue(logical);
    perform awa._lock_leader('provisioning');
    if not exists (select from awa.queue_meta as m where m.queue = physical) then
        perform awa._take_queue_place();
    end if;
    select m.* into strict root from awa.queue_meta as m
     where m.queue = coalesce(anchor.root_queue, logical);
    insert into awa.queue_meta (
        queue, logical_queue, root_queue, enqueue_shards, paused, max_run_time, retry_base,
        retry_cap, retry_jitter, retain_completed, retain_failed, shard_mode, max_shards,
        shard_mode_changed_at, partitioned_fifo_accepted_by, partitioned_fifo_accepted_at
    )
    values (
        physical, case when is_stripe then logical end,
        root.queue, anchor.enqueue_shards, anchor.paused,
        anchor.max_run_time, anchor.retry_base, anchor.retry_cap, anchor.retry_jitter,
        anchor.retain_completed, anchor.retain_failed, root.shard_mode, root.max_shards,
        root.shard_mode_changed_at, root.partitioned_fifo_accepted_by,
        root.partitioned_fifo_accepted_at
    )
    on conflict (queue) do update
        set root_queue = excluded.root_queue, logical_queue = excluded.logical_queue,
            shard_mode = excluded.shard_mode, max_shards = excluded.max_shards,
            shard_mode_changed_at = excluded.shard_mode_changed_at,
            partitioned_fifo_accepted_by = excluded.partitioned_fifo_accepted_by,
            partitioned_fifo_accepted_at = excluded.partitioned_fifo_accepted_at;
    if meta.queue_id is not null then
        perform awa._join_unique_scope(physical, coalesce(anchor.root_queue, logical));
    end if;
    perform awa._count_linked();
    select m.* into strict meta from awa.queue_meta as m where m.queue = physical;
    if awa._provision_lanes(meta.queue_id, meta.enqueue_shards) > 0 then
        select m.* into strict meta from awa.queue_meta as m where m.queue_id = meta.queue_id;
    end if;
    return meta;
end;
$$;

-- Function: awa._ensure_stripe(logical text, stripe integer) returns awa.queue_meta
-- Stripe k of a logical queue: logical#k.
-- Calls: awa._ensure_linked
-- Writes: nothing
create or replace function awa._ensure_stripe(logical text, stripe integer)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    return awa._ensure_linked(logical || '#' || stripe, logical, true);
end;
$$;

-- Function: awa._ensure_partition(logical text, partition integer) returns awa.queue_meta
-- Partition k > 0 of a logical queue: logical__pk.
-- Calls: awa._ensure_linked
-- Writes: nothing
create or replace function awa._ensure_partition(logical text, partition integer)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    return awa._ensure_linked(logical || '__p' || partition, logical, false);
end;
$$;

-- Function: awa._route_queue(anchor awa.queue_meta, ordering_key bytea) returns awa.queue_meta
-- The physical queue a new job for a logical name goes to: its partition
-- (awa._partition_of: by the partition hash, or this backend's sticky
-- partition when unkeyed), then that partition's stripe (awa._pick_stripe);
-- a queue with neither is its own. The ordering key goes on unchanged, so
-- inside the partition it picks the shard. awa._route_rows takes the same
-- steps for a whole call, each partition and stripe looked up once.
-- Calls: awa._partition_of, awa._partition_target, awa._pick_stripe
-- Writes: nothing
create or replace function awa._route_queue(anchor awa.queue_meta, ordering_key bytea)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if anchor.partitions <= 1 and anchor.stripes <= 1 then
        return anchor;
    end if;
    return awa._pick_stripe(
        awa._partition_target(anchor, awa._partition_of(anchor.partitions, ordering_key)),
        ordering_key
    );
end;
$$;

-- Function: awa._partition_of(partitions integer, ordering_key bytea) returns integer
-- Which partition of a logical queue of `partitions` a new job goes to: by
-- the partition hash when keyed, else this backend's sticky one (spread
-- apart from its sticky lane: awa._spread); 0 (the queue itself) when it
-- has one.
-- Calls: awa._spread, awa.partition_for_ordering_key
-- Writes: nothing
create or replace function awa._partition_of(partitions integer, ordering_key bytea)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if partitions <= 1 then
        return 0;
    elsif ordering_key is not null then
        return awa.partition_for_ordering_key(ordering_key, partitions);
    end if;
    return awa._spread(pg_catalog.pg_backend_pid(), partitions, 1);
end;
$$;

-- Function: awa._partition_target(anchor awa.queue_meta, partition integer) returns awa.queue_meta
-- Partition `partition` of a logical queue: the queue itself for 0, else
-- its partition queue, created when missing.
-- Calls: awa._ensure_partition
-- Writes: nothing
create or replace function awa._partition_target(anchor awa.queue_meta, partition integer)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if partition > 0 then
        return awa._ensure_partition(anchor.queue, partition);
    end if;
    return anchor;
end;
$$;

-- Function: awa._stripe_of(stripes integer, ordering_key bytea) returns integer
-- Which stripe of a queue of `stripes` a new job goes to: by the stripe
-- hash when keyed, else this backend's sticky one (awa._spread); 0 when it
-- has one.
-- Calls: awa._spread, awa.stripe_for_ordering_key
-- Writes: nothing
create or replace function awa._stripe_of(stripes integer, ordering_key bytea)
returns integer
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if stripes <= 1 then
        return 0;
    elsif ordering_key is not null then
        return awa.stripe_for_ordering_key(ordering_key, stripes);
    end if;
    return awa._spread(pg_catalog.pg_backend_pid(), stripes, 2);
end;
$$;

-- Function: awa._stripe_target(target awa.queue_meta, stripe integer) returns awa.queue_meta
-- Stripe `stripe` of a queue: the queue itself when it has one stripe,
-- else its stripe queue, created when missing.
-- Calls: awa._ensure_stripe
-- Writes: nothing
create or replace function awa._stripe_target(target awa.queue_meta, stripe integer)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if target.stripes <= 1 then
        return target;
    end if;
    return awa._ensure_stripe(target.queue, stripe);
end;
$$;

-- Function: awa._pick_stripe(anchor awa.queue_meta, ordering_key bytea) returns awa.queue_meta
-- The physical queue a new job of a logical queue goes to: the queue itself
-- when it has one stripe; else the key's stripe, or this backend's sticky
-- stripe for an unkeyed job.
-- Calls: awa._stripe_of, awa._stripe_target
-- Writes: nothing
create or replace function awa._pick_stripe(anchor awa.queue_meta, ordering_key bytea)
returns awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    return awa._stripe_target(anchor, awa._stripe_of(anchor.stripes, ordering_key));
end;
$$;

-- Function: awa._physical_queues(queue text) returns setof awa.queue_meta
-- Every physical queue of a logical name: its own row, its partitions and
-- all their stripes, the current ones created when missing. Locked against
-- concurrent changes (no key update), after the provisioning lock
-- (awa._lock_queue_provisioning), which the caller holds until it ends.
-- Calls: awa._ensure_partition, awa._ensure_stripe, awa._lock_queue_provisioning, awa._lock_rank
-- Writes: nothing
create or replace function awa._physical_queues(queue text)
returns setof awa.queue_meta
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    anchor awa.queue_meta;
    part awa.queue_meta;
begin
    anchor := awa._lock_queue_provisioning(queue);
    for k in 1 .. anchor.partitions - 1 loop
        perform awa._ensure_partition(anchor.queue, k);
    end loop;
    for part in
        select m.* from awa.queue_meta as m
         where (m.queue_id = anchor.queue_id or m.root_queue = anchor.queue)
           and m.stripes > 1
    loop
        perform awa._ensure_stripe(part.queue, k)
           from generate_series(0, part.stripes - 1) as k;
    end loop;
    return query
    select m.*
      from awa.queue_meta as m
     where m.queue_id = anchor.queue_id or m.root_queue = anchor.queue
        or m.logical_queue = anchor.queue
     order by awa._lock_rank(m.root_queue, m.logical_queue), m.queue_id
       for no key update;
end;
$$;

-- Function: awa._queue(queue text) returns awa.queue_meta
-- The settings row of an existing queue, or 42704 naming it.
-- Calls: awa._check_queue_name
-- Writes: nothing
create or replace function awa._queue(queue text)
returns awa.queue_meta
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    meta awa.queue_meta;
begin
    perform awa._check_queue_name(queue);
    select m.* into meta from awa.queue_meta as m where m.queue = _queue.queue;
    if not found then
        raise exception 'queue % does not exist', quote_literal(queue)
            using errcode = '42704';
    end if;
    return meta;
end;
$$;

-- Function: awa._names_cover(names, queue, logical_queue, root_queue, family) returns boolean
-- Whether one of names covers a physical queue, given as its awa.queue_meta
-- columns: a name covers its own queue and its stripes (logical_queue),
-- and with family (the default) the partitions of the logical queue it
-- names and the stripes of the root it names (root_queue). So with family
-- false the name of a partitioned queue covers its partition 0 alone (a
-- claim by one partition's worker). What a claim reads and a pause, a
-- count or a poll acts on. Null (false in a WHERE) for a queue no name
-- covers. Inlined: the callers' plans are those of the expression; a
-- constant family folds away (a call without it plans the three terms
-- alone), and a parameter keeps the root_queue term an index condition,
-- over no names when it is false.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._names_cover(
    names text[], queue text, logical_queue text, root_queue text, family boolean default true
)
returns boolean
language sql
immutable parallel safe
as $$
    select queue operator(pg_catalog.=) any (names)
        or logical_queue operator(pg_catalog.=) any (names)
        or root_queue operator(pg_catalog.=) any (case when family then names end)
$$;

-- Function: awa._queue_ids(queue text) returns integer[]
-- The physical queues of an existing name: the queue itself, its partitions
-- and their stripes, by queue_id. What every operator call that takes a
-- logical name acts on. Errors: 22004 null, 22023 a bad name, 42704 no such
-- queue (awa._queue).
-- Calls: awa._names_cover, awa._queue
-- Writes: nothing
create or replace function awa._queue_ids(queue text)
returns integer[]
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._queue(queue);
    return array(
        select m.queue_id
          from awa.queue_meta as m
         where awa._names_cover(array[_queue_ids.queue], m.queue, m.logical_queue,
                                m.root_queue)
         order by m.queue_id
    );
end;
$$;

-- Function: awa._lock_rank(root_queue text, logical_queue text) returns integer
-- Where a settings row comes in the order every call that locks several
-- rows of awa.queue_meta takes them, before its queue_id: 0 a queue of
-- its own (a logical queue), 1 a partition, 2 a stripe. A change of a
-- family locks the row it is named by first (awa._lock_queue), then the
-- rest in this order: the named row is the family's lowest rank, so that
-- is this order too. By queue_id alone, a queue that joined as a partition
-- of a queue made after it (enqueue to orders__p1, then to orders, then
-- set_queue_partitions('orders', 2)) came before its root in one call's
-- order and after it in another's: 40P01 between a pause and a retention.
-- Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_rank(root_queue text, logical_queue text)
returns integer
language sql
immutable parallel safe
as $$
    select case when root_queue is null then 0 else 1 end
           operator(pg_catalog.+) case when logical_queue is null then 0 else 1 end
$$;

-- Function: awa._lock_queue_rows(ids integer[]) returns integer
-- Locks the settings rows of queues `ids` in lock order (awa._lock_rank,
-- then queue_id), for no key update as awa._lock_queue does: what an
-- operator's change of a whole
-- family (a pause, a retention, a retry policy, a max run time, a shard
-- mode) takes before its UPDATE, which locks rows in the order it finds
-- them, the heap's, which every update of a row reshuffles. A producer's
-- first keyed batch marks the queues it reaches in the same lock order
-- (awa._mark_unique_jobs): two orders over the same rows deadlocked
-- (40P01, two single calls). Returns how many it locked: a count, which
-- reads every row (a SQL function's last SELECT may stop at its first).
-- Calls: awa._lock_rank
-- Writes: nothing
create or replace function awa._lock_queue_rows(ids integer[])
returns integer
language sql
set search_path = pg_catalog, pg_temp
as $$
    select count(*)::integer from (
        select m.queue_id
          from awa.queue_meta as m
         where m.queue_id = any(ids)
         order by awa._lock_rank(m.root_queue, m.logical_queue), m.queue_id
           for no key update
    ) as locked
$$;

-- Function: awa._lock_family(queue text) returns integer[]
-- What an operator's change of a setting every member of a family carries
-- (a pause, a retention, a retry policy, a max run time, a shard mode)
-- locks first: the named row (awa._lock_queue), then every member's row
-- (awa._lock_queue_rows); returns the members' ids (awa._queue_ids), read
-- once the named row is held. A call that makes new members (new stripes
-- or partitions) holds that row, and its family's root row, until it
-- commits (awa.set_queue_stripes), and copies the settings under
-- them: read before such a maker committed, the members missed the new
-- ones, which kept the old setting (an unpaused stripe of a paused queue).
-- Never the provisioning lock: a change that waited here for a row a
-- producer's open transaction holds would hold every queue's creation.
-- Errors: 42704 no such queue; 22004/22023 a bad name.
-- Calls: awa._lock_queue, awa._lock_queue_rows, awa._queue_ids
-- Writes: nothing
create or replace function awa._lock_family(queue text)
returns integer[]
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    ids integer[];
begin
    perform awa._lock_queue(queue, create_missing => false);
    ids := awa._queue_ids(queue);
    perform awa._lock_queue_rows(ids);
    return ids;
end;
$$;

select awa._grant_execute('awa._queue_name_ok(text)');
select awa._grant_execute('awa._lock_family(text)');
select awa._grant_execute('awa._check_queue_room(text[])');
select awa._grant_execute('awa._names_cover(text[], text, text, text, boolean)');
select awa._grant_execute('awa._priority_ok(smallint)');
select awa._grant_execute('awa._max_attempts_ok(integer)');
select awa._grant_execute('awa._job_ok(text, text, smallint, integer)');
select awa._grant_execute('awa._default_priority()');
select awa._grant_execute('awa._default_max_attempts()');
select awa._grant_execute('awa._default_args()');
select awa._grant_execute('awa._first_attempt()');
select awa._grant_execute('awa._max_run_time_ok(interval)');
select awa._grant_execute('awa._in_seconds(interval)');
select awa._grant_execute('awa._check_queue_name(text)');
select awa._grant_execute('awa._check_job(text, text, smallint, integer, interval)');
select awa._grant_execute('awa._check_max_run_time(interval)');
select awa._grant_execute('awa._run_at_ok(timestamp with time zone)');
select awa._grant_execute('awa._check_run_at(text, timestamp with time zone)');
select awa._grant_execute('awa._lease_ok(interval)');
select awa._grant_execute('awa._check_lease(text, interval)');
select awa._grant_execute('awa._check_priority(smallint)');
select awa._grant_execute('awa._limit_ok(integer)');
select awa._grant_execute('awa._check_limit(text, integer)');
select awa._grant_execute('awa._counter_seq_name(integer, text)');
select awa._grant_execute('awa._provision_counters(integer)');
select awa._grant_execute('awa._count_lane_shards(integer)');
select awa._grant_execute('awa._count_linked()');
select awa._grant_execute('awa._provision_lanes(integer, integer)');
select awa._grant_execute('awa._ensure_queue(text)');
select awa._grant_execute('awa._ensure_queues(text[])');
select awa._grant_execute('awa._lock_queue(text, boolean)');
select awa._grant_execute('awa._lock_queue_provisioning(text, boolean)');
select awa._grant_execute('awa._queue(text)');
select awa._grant_execute('awa._queue_ids(text)');
select awa._grant_execute('awa._lock_queue_rows(integer[])');
select awa._grant_execute('awa._lock_rank(text, text)');
select awa._grant_execute('awa._ensure_linked(text, text, boolean)');
select awa._grant_execute('awa._ensure_stripe(text, integer)');
select awa._grant_execute('awa._pick_stripe(awa.queue_meta, bytea)');
select awa._grant_execute('awa._partition_of(integer, bytea)');
select awa._grant_execute('awa._partition_target(awa.queue_meta, integer)');
select awa._grant_execute('awa._stripe_of(integer, bytea)');
select awa._grant_execute('awa._stripe_target(awa.queue_meta, integer)');
select awa._grant_execute('awa._ensure_partition(text, integer)');
select awa._grant_execute('awa._route_queue(awa.queue_meta, bytea)');
select awa._grant_execute('awa._physical_queues(text)');

-- Links made while migration 0023 and this layer were applied, by the
-- earlier layer (which did not mark them). Layers before migration 0026
-- held the advisory lock of provisioning while they linked, not the
-- leader row: wait for a link still in flight under it too.
select pg_catalog.pg_advisory_xact_lock(awa._lock_class_provisioning(), 0);
select awa._count_linked();

-- Lanes made while migration 0019 and this layer were applied, by the
-- earlier layer (which did not count them): every queue's lane_shards
-- counted again, as awa._provision_lanes counts it, once the lock above
-- has waited for a lane still in flight under it. Once, at the first
-- apply after that migration: at every apply it undid awa.retire_lanes
-- (ADR 041), and every claim walked the drained lanes again until its next
-- pass.
do $$
begin
    if coalesce((select max(f.applied_at) from awa.schema_functions as f), '-infinity')
       < (select m.applied_at from awa.schema_migrations as m where m.version = 19) then
        perform awa._count_lane_shards(null);
    end if;
end;
$$;

-- Queues created before a counter existed get it, and the jobs
-- their workers hold carry the completed one, as a claim copies it.
select awa._provision_counters(m.queue_id)
  from awa.queue_meta as m
 where m.completed_seq is null or m.retried_seq is null;
update awa.running as r
   set completed_seq = m.completed_seq
  from awa.queue_meta as m
 where m.queue_id = r.queue_id and r.completed_seq is null;
select awa._grant_execute('awa._take_queue_place()');
select awa._grant_execute('awa._raise_queue_limit(text[])');
select awa._grant_execute('awa.set_max_queues(integer)', 'operator');
select awa._grant_select('awa.queue_limit', 'reader', 'operator');
