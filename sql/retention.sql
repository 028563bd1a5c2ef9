-- retention.sql: how long terminal jobs are kept, and how they go.
--
-- awa.finished is partitioned by slot into two rings (ADR 024): slots 0-31
-- for completed jobs, one per hour, 32 hours round; slots 32-63 for failed
-- and cancelled jobs, one per 6 hours, 8 days round. A job that finishes is
-- written to the slot of the moment. awa.prune_finished() empties a slot
-- with TRUNCATE: at once when everything in it is past the longest
-- retention of its ring, or, when it is the next slot its ring will write
-- to, after copying the rows still within their queue's retention into the
-- current slot. No row-by-row DELETE, so nothing for vacuum to chase and no
-- bloat, whatever a held snapshot does.

-- Function: awa._finished_slot_seconds(state text) returns integer
-- How long a slot of the state's ring is written to. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._finished_slot_seconds(state text)
returns integer
language sql
immutable parallel safe
as $$
    select case when state operator(pg_catalog.=) 'completed' then 3600 else 21600 end
$$;

-- Function: awa._finished_ring_slots() returns integer
-- Slots per ring. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._finished_ring_slots()
returns integer
language sql
immutable parallel safe
as $$
    select 32
$$;

-- Function: awa._finished_slot(state text, at timestamptz) returns smallint
-- The slot a job that reaches `state` at `at` is written to: the ring of
-- its state (completed 0-31, failed and cancelled 32-63), then the period
-- `at` falls in, modulo the ring. Every INSERT into awa.finished uses it.
-- Inlined; stable, not immutable, as the epoch of a timestamptz is (an
-- immutable SQL function whose body is not would not be inlined).
-- Calls: awa._finished_ring_slots, awa._finished_slot_seconds
-- Writes: nothing
create or replace function awa._finished_slot(state text, at timestamptz)
returns smallint
language sql
stable parallel safe
as $$
    select (
        case when state operator(pg_catalog.=) 'completed' then 0
             else awa._finished_ring_slots() end
        operator(pg_catalog.+)
        (pg_catalog.floor(
            pg_catalog.date_part('epoch', at)
            operator(pg_catalog./) awa._finished_slot_seconds(state)
        )::bigint operator(pg_catalog.%) awa._finished_ring_slots())
    )::smallint
$$;

-- Function: awa._retention(state text, retain_completed interval, retain_failed interval)
-- How long a terminal job in `state` is kept, given its queue's settings
-- (awa.queue_meta.retain_completed, retain_failed; null: the defaults, 24
-- hours completed, 7 days failed and cancelled). Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._retention(
    state text, retain_completed interval, retain_failed interval
)
returns interval
language sql
immutable parallel safe
as $$
    select case when state operator(pg_catalog.=) 'completed'
                then coalesce(retain_completed, interval '24 hours')
                else coalesce(retain_failed, interval '7 days') end
$$;

-- Function: awa.set_retention(queue text, completed interval, failed interval) returns void
-- How long the queue keeps its completed jobs and its failed and cancelled
-- ones; null restores the default (24 hours; 7 days). Applies to every
-- partition and stripe of a logical queue. Takes effect at the next prune.
-- Role: awa_operator.
-- Errors: 22023 a retention not above 0 or above 10 years; 42704 no such
-- queue.
-- Calls: awa._queue_ids
-- Writes: awa.queue_meta
create or replace function awa.set_retention(queue text, completed interval, failed interval)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    -- Resolved once, before the update: an unknown name fails even when
    -- no row would be scanned.
    ids integer[] := awa._queue_ids(set_retention.queue);
begin
    if completed <= interval '0' or completed > interval '10 years'
       or failed <= interval '0' or failed > interval '10 years' then
        raise exception 'retention must be above 0 and at most 10 years, got completed %, failed %',
            coalesce(completed::text, 'default'), coalesce(failed::text, 'default')
            using errcode = '22023';
    end if;
    update awa.queue_meta as m
       set retain_completed = set_retention.completed, retain_failed = set_retention.failed
     where m.queue_id = any(ids);
end;
$$;

-- Function: awa._prune_action(slot integer, at timestamptz) returns text
-- What a prune does to one slot of awa.finished at the moment `at` (see the
-- file header): 'drop' when everything it can hold is past the longest
-- retention of its ring, 'carry' when it is the ring's next slot and may
-- hold rows still retained, null when it stays (the current slot, or one
-- not yet due).
-- Calls: awa._finished_ring_slots, awa._finished_slot, awa._finished_slot_seconds, awa._retention
-- Writes: nothing
create or replace function awa._prune_action(slot integer, at timestamptz)
returns text
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    ring_state text := case when slot < awa._finished_ring_slots() then 'completed' else 'failed' end;
    width integer := awa._finished_slot_seconds(ring_state);
    n integer := awa._finished_ring_slots();
    current_period bigint := floor(date_part('epoch', at) / width)::bigint;
    current_slot integer := awa._finished_slot(ring_state, at);
    -- The latest period this slot was written in: no row in it finished later.
    written_until timestamptz;
    longest interval;
begin
    if slot = current_slot then
        return null;
    end if;
    written_until := to_timestamp(
        (current_period - ((current_slot - slot + n) % n) + 1)::double precision * width
    );
    select max(awa._retention(ring_state, m.retain_completed, m.retain_failed))
      into longest
      from awa.queue_meta as m;
    longest := coalesce(longest, awa._retention(ring_state, null, null));
    if written_until + longest < at then
        return 'drop';
    end if;
    if slot % n = (current_slot + 1) % n then
        return 'carry';
    end if;
    return null;
end;
$$;

-- Function: awa._prune_slot(slot integer) returns bigint
-- Empties one slot of awa.finished if it is due (awa._prune_action) and
-- its lock can be had at once; returns how many jobs it removed (rows
-- copied to the current slot do not count). The caller holds the prune
-- lock. Whether the slot is due is decided again once its lock is held,
-- at a time read then from the clock, not at the transaction's start: a
-- job that ends in a transaction begun before that moment is written to a
-- slot no later than the moment's current one, and a transaction begun
-- after it waits for the lock. Decided at the transaction's start, a
-- prune begun just before the hour turns took the new hour's slot for the
-- oldest, and emptied it with the jobs completed in it since.
-- Calls: awa._finished_slot (dynamic), awa._prune_action, awa._retention (dynamic)
-- Writes: awa.finished (dynamic)
create or replace function awa._prune_slot(slot integer)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    part text := format('awa.%I', 'finished_' || lpad(slot::text, 2, '0'));
    action text;
    at timestamptz;
    any_rows boolean;
    rows_in bigint;
    kept bigint := 0;
begin
    execute format('select exists (select from %s)', part) into strict any_rows;
    if not any_rows or awa._prune_action(slot, clock_timestamp()) is null then
        return 0;
    end if;
    begin
        execute format('lock table %s in access exclusive mode', part);
    exception when lock_not_available then
        return 0;
    end;
    at := clock_timestamp();
    action := awa._prune_action(slot, at);
    if action is null then
        return 0;
    end if;
    execute format('select count(*) from %s', part) into strict rows_in;
    if action = 'carry' then
        -- The ring's next slot, with rows still to keep: they move on.
        execute format($f$
            insert into awa.finished (
                job_id, slot, queue_id, priority, kind, state, attempt, max_attempts,
                enqueued_at, finished_at, args, ordering_key, last_error, max_run_time,
                unique_key, unique_window
            )
            select
                f.job_id, awa._finished_slot(f.state, $1), f.queue_id, f.priority, f.kind,
                f.state, f.attempt, f.max_attempts, f.enqueued_at, f.finished_at, f.args,
                f.ordering_key, f.last_error, f.max_run_time, f.unique_key, f.unique_window
              from %s as f
              join awa.queue_meta as m on m.queue_id = f.queue_id
             where f.finished_at + awa._retention(f.state, m.retain_completed, m.retain_failed)
                   >= $1
        $f$, part) using at;
        get diagnostics kept = row_count;
    end if;
    execute format('truncate %s', part);
    return rows_in - kept;
end;
$$;

-- Function: awa.prune_finished() returns bigint
-- Removes terminal jobs past their queue's retention by emptying whole
-- slots of awa.finished with TRUNCATE (see the file header). Never removes
-- a job within its retention, nor one that is not terminal. A slot whose
-- lock is not free at once (a reader of awa.finished holds it) is skipped
-- until the next call, so a prune never waits long, nor makes others wait.
-- One prune at a time: a second concurrent call returns 0 at once.
-- Run it every minute or so (awa maintain does); a slot becomes due about
-- once an hour.
-- Role: awa_maintenance.
-- Returns: how many jobs it removed.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than a slot's lock would not see the rows committed since, and the
-- TRUNCATE would remove them uncopied.
-- Calls: awa._check_read_committed, awa._finished_ring_slots, awa._prune_slot, awa._try_leader
-- Writes: nothing
create or replace function awa.prune_finished()
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    removed bigint := 0;
begin
    perform awa._check_read_committed('awa.prune_finished()');
    if not awa._try_leader('prune') then
        return 0;
    end if;
    for s in 0 .. 2 * awa._finished_ring_slots() - 1 loop
        removed := removed + awa._prune_slot(s);
    end loop;
    return removed;
end;
$$;

select awa._grant_execute('awa._finished_slot_seconds(text)');
select awa._grant_execute('awa._finished_ring_slots()');
select awa._grant_execute('awa._finished_slot(text, timestamptz)');
select awa._grant_execute('awa._retention(text, interval, interval)');
select awa._grant_execute('awa.set_retention(text, interval, interval)', 'operator');
select awa._grant_execute('awa._prune_action(integer, timestamptz)');
select awa._grant_execute('awa._prune_slot(integer)');
select awa._grant_execute('awa.prune_finished()', 'maintenance');
