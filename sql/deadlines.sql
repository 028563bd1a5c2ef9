-- deadlines.sql: how long a job may run, and how long a failed one waits
-- before its retry (ADR 026).
--
-- Max run time: a job's own (awa.enqueue's max_run_time, the batch's
-- max_run_times, COPY's max_run_time column; the rule is
-- awa._max_run_time_ok in sql/queues.sql), else its queue's
-- (awa.set_max_run_time), else none. awa.claim writes the deadline,
-- awa.heartbeat never extends a lease past it and awa.rescue_expired
-- retries a job whose lease ended there (sql/claim.sql).
--
-- Retry delay after a failed attempt n (awa.fail without retry_at, or a
-- rescue), awa._retry_delay:
--   delay = min(cap, base * 2^(n-1)) * (1 - jitter * r),  r uniform in [0, 1)
-- so every delay lies in (d * (1 - jitter), d] for d = min(cap, base *
-- 2^(n-1)): jitter 0 is plain exponential backoff, 0.5 "equal jitter", 1
-- "full jitter"; the cap bounds every delay. Defaults: base 2 seconds, cap
-- 1 hour, jitter 0.5. A queue's policy (awa.set_retry_policy) replaces any
-- of the three.

-- Function: awa._retry_default_base() returns interval
-- The first retry's delay before jitter, unless the queue sets its own. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retry_default_base()
returns interval
language sql
immutable parallel safe
as $$
    select '2 seconds'::pg_catalog.interval
$$;

-- Function: awa._retry_default_cap() returns interval
-- The longest retry delay, unless the queue sets its own. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retry_default_cap()
returns interval
language sql
immutable parallel safe
as $$
    select '1 hour'::pg_catalog.interval
$$;

-- Function: awa._retry_default_jitter() returns numeric
-- The share of a retry delay drawn at random, unless the queue sets its
-- own. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retry_default_jitter()
returns numeric
language sql
immutable parallel safe
as $$
    select 0.5::pg_catalog.numeric
$$;

-- Function: awa._retry_delay(attempt, base, cap, jitter, draw) returns interval
-- The delay before the retry of a job whose attempt `attempt` (1 or more)
-- failed, for a queue's retry_base, retry_cap and retry_jitter (null: the
-- default) and `draw`, a random number in [0, 1): min(cap, base *
-- 2^(attempt-1)) * (1 - jitter * draw). The doubling stops at 2^60, which
-- passes any cap. Inlined; immutable, as the caller draws the number.
-- (OPERATOR() syntax gives every operator one precedence, left to right:
-- hence the parentheses.)
-- Calls: awa._retry_default_base, awa._retry_default_cap, awa._retry_default_jitter
-- Writes: nothing
create or replace function awa._retry_delay(
    attempt integer, base interval, cap interval, jitter numeric, draw double precision
)
returns interval
language sql
immutable parallel safe
as $$
    select '1 second'::pg_catalog.interval operator(pg_catalog.*) (
        least(
            pg_catalog.date_part('epoch', coalesce(cap, awa._retry_default_cap())),
            pg_catalog.date_part('epoch', coalesce(base, awa._retry_default_base()))
            operator(pg_catalog.*) pg_catalog.power(
                2::pg_catalog.float8, least(attempt operator(pg_catalog.-) 1, 60)::pg_catalog.float8
            )
        )
        operator(pg_catalog.*) (
            1::pg_catalog.float8 operator(pg_catalog.-) (
                coalesce(jitter, awa._retry_default_jitter())::pg_catalog.float8
                operator(pg_catalog.*) draw
            )
        )
    )
$$;

-- Function: awa.set_retry_policy(queue text, base interval, cap interval, jitter numeric)
-- The queue's retry delay (see the file header): base, the first retry's
-- delay before jitter, doubled at each further attempt; cap, the longest
-- delay; jitter, the share drawn at random. A null takes the default (2
-- seconds, 1 hour, 0.5). Applies to every partition and stripe of a logical
-- queue, from the next failed attempt on; a retry_at given to awa.fail
-- still decides. Role: awa_operator.
-- Errors: 22023 base not above 0 or above 1 day, cap not above 0 or above
-- 30 days, jitter outside 0 to 1, or base above cap (defaults applied);
-- 42704 no such queue.
-- Calls: awa._in_seconds, awa._lock_family, awa._queue_ids, awa._retry_default_base,
--   awa._retry_default_cap
-- Writes: awa.queue_meta
create or replace function awa.set_retry_policy(
    queue text, base interval, cap interval, jitter numeric
)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- Resolved once, before the update: an unknown name fails even when
    -- no row would be scanned.
    ids integer[] := awa._queue_ids(set_retry_policy.queue);
begin
    -- In seconds, as they are stored (awa._in_seconds): compared as
    -- intervals, '-1 year 361 days' is a day, in seconds -4.25 days.
    if date_part('epoch', base) <= 0 or date_part('epoch', base) > 86400 then
        raise exception 'retry base must be above 0 and at most 1 day, got %', base
            using errcode = '22023';
    end if;
    if date_part('epoch', cap) <= 0 or date_part('epoch', cap) > 2592000 then
        raise exception 'retry cap must be above 0 and at most 30 days, got %', cap
            using errcode = '22023';
    end if;
    if jitter < 0 or jitter > 1 then
        raise exception 'retry jitter must be between 0 and 1, got %', jitter
            using errcode = '22023';
    end if;
    if date_part('epoch', coalesce(base, awa._retry_default_base()))
       > date_part('epoch', coalesce(cap, awa._retry_default_cap())) then
        raise exception 'retry base must not be above the cap, got base %, cap %',
            coalesce(base::text, awa._retry_default_base() || ' (the default)'),
            coalesce(cap::text, awa._retry_default_cap() || ' (the default)')
            using errcode = '22023';
    end if;
    ids := awa._lock_family(queue);
    update awa.queue_meta as m
       set retry_base = awa._in_seconds(set_retry_policy.base),
           retry_cap = awa._in_seconds(set_retry_policy.cap),
           retry_jitter = set_retry_policy.jitter
     where m.queue_id = any(ids);
end;
$$;

-- Function: awa.set_max_run_time(queue text, max_run_time interval) returns void
-- The max run time of the queue's jobs that carry none of their own: 1
-- second to 30 days, or null for none. Applies to every partition and
-- stripe of a logical queue, from the next claim on (a running job keeps
-- the deadline its claim gave it). Role: awa_operator.
-- Errors: 22023 out of range; 42704 no such queue.
-- Calls: awa._check_max_run_time, awa._in_seconds, awa._lock_family, awa._queue_ids
-- Writes: awa.queue_meta
create or replace function awa.set_max_run_time(queue text, max_run_time interval)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- Resolved once, before the update: an unknown name fails even when
    -- no row would be scanned.
    ids integer[] := awa._queue_ids(set_max_run_time.queue);
begin
    perform awa._check_max_run_time(max_run_time);
    ids := awa._lock_family(queue);
    update awa.queue_meta as m
       set max_run_time = awa._in_seconds(set_max_run_time.max_run_time)
     where m.queue_id = any(ids);
end;
$$;

select awa._grant_execute('awa._retry_default_base()');
select awa._grant_execute('awa._retry_default_cap()');
select awa._grant_execute('awa._retry_default_jitter()');
select awa._grant_execute(
    'awa._retry_delay(integer, interval, interval, numeric, double precision)'
);
select awa._grant_execute(
    'awa.set_retry_policy(text, interval, interval, numeric)', 'operator'
);
select awa._grant_execute('awa.set_max_run_time(text, interval)', 'operator');
