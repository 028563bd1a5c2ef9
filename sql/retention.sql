-- retention.sql: how long terminal jobs are kept, and how they go.
--
-- awa.finished is partitioned by slot into three rings (ADR 024, ADR 040):
-- slots 0-31 for completed jobs, one per hour, 32 hours round; slots 32-63
-- for failed and cancelled jobs, one per 6 hours, 8 days round; slots 64-95,
-- the long ring, one per day, 32 days round, for the jobs a carry finds
-- kept past their own ring's next round (awa._carried_slot). A job that
-- finishes is written to the slot of the moment. awa.prune_finished() empties a slot
-- with TRUNCATE: at once when everything in it is past the longest
-- retention of its ring, or, when it is the next slot its ring will write
-- to, after carrying the rows still within their queue's retention into the
-- slot that turns first after their retention ends (awa._carried_slot, ADR
-- 057). The carry moves them in bounded batches through the period
-- the slot is next (awa._carry_slot, ADR 040), each batch reading the heap
-- from where the one before stopped (awa.finished_carry), so that no
-- statement grows with the retention; the TRUNCATE then takes what is left.
-- No row-by-row DELETE of the rows that go, so nothing for vacuum to chase
-- and no bloat, whatever a held snapshot does.

-- Function: awa._finished_slot_seconds(state text) returns integer
-- How long a slot of the state's ring is written to ('long': the long
-- ring's). Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._finished_slot_seconds(state text)
returns integer
language sql
immutable parallel safe
as $$
    select case when state operator(pg_catalog.=) 'completed' then 3600
                when state operator(pg_catalog.=) 'long' then 86400
                else 21600 end
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

-- Function: awa._finished_slot_count() returns integer
-- Slots of awa.finished, the three rings'. Inlined.
-- Calls: awa._finished_ring_slots
-- Writes: nothing
create or replace function awa._finished_slot_count()
returns integer
language sql
immutable parallel safe
as $$
    select 3 operator(pg_catalog.*) awa._finished_ring_slots()
$$;

-- Function: awa._finished_ring(slot integer) returns text
-- The ring a slot belongs to, named as awa._finished_slot takes it:
-- 'completed', 'failed' (failed and cancelled jobs) or 'long'. Inlined.
-- Calls: awa._finished_ring_slots
-- Writes: nothing
create or replace function awa._finished_ring(slot integer)
returns text
language sql
immutable parallel safe
as $$
    select case when slot operator(pg_catalog.<) awa._finished_ring_slots() then 'completed'
                when slot operator(pg_catalog.<)
                     (2 operator(pg_catalog.*) awa._finished_ring_slots()) then 'failed'
                else 'long' end
$$;

-- Function: awa._period(at timestamptz, seconds integer) returns bigint
-- The period of `seconds` that `at` falls in, counted from the epoch: a
-- slot's period (awa._finished_slot). Inlined; stable, as the epoch of a
-- timestamptz is.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._period(at timestamptz, seconds integer)
returns bigint
language sql
stable parallel safe
as $$
    select pg_catalog.floor(
        pg_catalog.date_part('epoch', at) operator(pg_catalog./) seconds
    )::bigint
$$;

-- Function: awa._finished_slot(state text, at timestamptz) returns smallint
-- The slot a job that reaches `state` at `at` is written to: the ring of
-- its state (completed 0-31, failed and cancelled 32-63; 'long', 64-95,
-- for a carry's), then the period `at` falls in, modulo the ring. Every
-- INSERT into awa.finished uses it.
-- Inlined; stable, not immutable, as the epoch of a timestamptz is (an
-- immutable SQL function whose body is not would not be inlined).
-- Calls: awa._finished_ring_slots, awa._finished_slot_seconds, awa._period
-- Writes: nothing
create or replace function awa._finished_slot(state text, at timestamptz)
returns smallint
language sql
stable parallel safe
as $$
    select (
        case when state operator(pg_catalog.=) 'completed' then 0
             when state operator(pg_catalog.=) 'long'
             then 2 operator(pg_catalog.*) awa._finished_ring_slots()
             else awa._finished_ring_slots() end
        operator(pg_catalog.+)
        (awa._period(at, awa._finished_slot_seconds(state))
         operator(pg_catalog.%) awa._finished_ring_slots())
    )::smallint
$$;

-- Function: awa._retention(state text, retain_completed interval, retain_failed interval)
-- How long a terminal job in `state` is kept, given its queue's settings
-- (awa.queue_meta.retain_completed, retain_failed; null: the defaults, 24
-- hours completed, 7 days failed and cancelled). The defaults are hours, as
-- awa.set_retention stores seconds: '7 days' added in a session's time zone
-- is 167 hours across a daylight-saving change. Inlined.
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
                else coalesce(retain_failed, interval '168 hours') end
$$;

-- Function: awa._carried_slot(state, finished_at, kept_until, at) returns smallint
-- The slot a carry at `at` moves a job that finished at `finished_at` and
-- is kept until `kept_until` to: the slot of its state's ring whose next
-- carry comes first after `kept_until`, so that it goes at that slot's turn
-- (within two of the ring's periods past its retention) and is not copied
-- again; never the slot the carry empties now. Kept past its ring's round,
-- the long ring's slot chosen alike, whose turn comes every 32 days, so
-- that a job kept D days is copied about D / 31 times more, not D x 24 /
-- 31 (ADR 040). A slot's drop (awa._prune_action) assumes that no job in it
-- finished after its last period ends (in the long ring, 30 of the job's
-- own ring's periods before): the slot is the first that also keeps that,
-- else the current one. Inlined.
-- Calls: awa._finished_ring_slots, awa._finished_slot, awa._finished_slot_seconds, awa._period
-- Writes: nothing
create or replace function awa._carried_slot(
    state text, finished_at timestamptz, kept_until timestamptz, at timestamptz
)
returns smallint
language sql
stable parallel safe
as $$
    select case
        -- Its own ring has a slot whose carry comes after kept_until.
        when (awa._period(kept_until, awa._finished_slot_seconds(state)) operator(pg_catalog.+) 2)
             operator(pg_catalog.<=)
             (awa._period(at, awa._finished_slot_seconds(state))
              operator(pg_catalog.+) awa._finished_ring_slots())
        then awa._finished_slot(state, pg_catalog.to_timestamp(
            (greatest(
                -- Not the slot being carried now: the one after.
                awa._period(at, awa._finished_slot_seconds(state)) operator(pg_catalog.+) 2,
                -- Its carry begins after kept_until.
                awa._period(kept_until, awa._finished_slot_seconds(state))
                operator(pg_catalog.+) 2,
                -- Last written after finished_at.
                awa._period(finished_at, awa._finished_slot_seconds(state))
                operator(pg_catalog.+) awa._finished_ring_slots()
            ) operator(pg_catalog.*) awa._finished_slot_seconds(state))::double precision
        ))
        else awa._finished_slot('long', pg_catalog.to_timestamp(
            (least(
                greatest(
                    awa._period(at, awa._finished_slot_seconds('long')) operator(pg_catalog.+) 2,
                    awa._period(kept_until, awa._finished_slot_seconds('long'))
                    operator(pg_catalog.+) 2,
                    -- Last written 30 of the job's own ring's periods after
                    -- finished_at, as the long ring's drop counts.
                    awa._period(
                        finished_at operator(pg_catalog.+) pg_catalog.make_interval(
                            secs => (awa._finished_ring_slots() operator(pg_catalog.-) 2)
                                     operator(pg_catalog.*) awa._finished_slot_seconds(state)
                        ),
                        awa._finished_slot_seconds('long')
                    ) operator(pg_catalog.+) awa._finished_ring_slots()
                ),
                -- Kept past the long ring's round too: its current slot,
                -- carried again at its turn.
                awa._period(at, awa._finished_slot_seconds('long'))
                operator(pg_catalog.+) awa._finished_ring_slots()
            ) operator(pg_catalog.*) awa._finished_slot_seconds('long'))::double precision
        ))
    end
$$;

-- Function: awa.set_retention(queue text, completed interval, failed interval) returns void
-- How long the queue keeps its completed jobs and its failed and cancelled
-- ones; null restores the default (24 hours; 7 days). Checked and stored
-- as seconds (awa._in_seconds: a day 24 hours, a month 30 days, a year
-- 365.25), so that what is checked is what a prune applies, whatever the
-- month or the session's time zone. Applies to every partition and stripe
-- of a logical queue. Takes effect at the next prune. Role: awa_operator.
-- Errors: 22023 a retention not above 0 or above 10 years; 42704 no such
-- queue.
-- Calls: awa._in_seconds, awa._lock_family, awa._queue_ids
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
    -- Checked as the seconds that are stored and applied: PostgreSQL's
    -- comparison of intervals counts a year 360 days, date_part 365.25.
    if not date_part('epoch', completed) > 0
       or date_part('epoch', completed) > date_part('epoch', interval '10 years')
       or not date_part('epoch', failed) > 0
       or date_part('epoch', failed) > date_part('epoch', interval '10 years') then
        raise exception 'retention must be above 0 and at most 10 years, got completed %, failed %',
            coalesce(completed::text, 'default'), coalesce(failed::text, 'default')
            using errcode = '22023';
    end if;
    ids := awa._lock_family(queue);
    update awa.queue_meta as m
       set retain_completed = awa._in_seconds(set_retention.completed),
           retain_failed = awa._in_seconds(set_retention.failed)
     where m.queue_id = any(ids);
end;
$$;

-- Function: awa._prune_action(slot integer, at timestamptz) returns text
-- What a prune does to one slot of awa.finished at the moment `at` (see the
-- file header): 'drop' when everything it can hold is past the longest
-- retention of its ring, 'carry' when it is the ring's next slot and may
-- hold rows still retained, null when it stays (the current slot, or one
-- not yet due).
-- Calls: awa._finished_ring, awa._finished_ring_slots, awa._finished_slot,
--   awa._finished_slot_seconds, awa._period, awa._retention
-- Writes: nothing
create or replace function awa._prune_action(slot integer, at timestamptz)
returns text
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    ring_state text := awa._finished_ring(slot);
    width integer := awa._finished_slot_seconds(ring_state);
    n integer := awa._finished_ring_slots();
    current_period bigint := awa._period(at, width);
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
    -- The long ring holds completed and failed jobs alike, each carried
    -- there from its own ring's next slot, so finished more than 30 of its
    -- own ring's periods before the long slot was written: that much less
    -- of its retention is left (awa._carried_slot).
    select max(case when ring_state = 'long'
                    then greatest(
                        awa._retention('completed', m.retain_completed, m.retain_failed)
                        - (n - 2) * awa._finished_slot_seconds('completed') * interval '1 second',
                        awa._retention('failed', m.retain_completed, m.retain_failed)
                        - (n - 2) * awa._finished_slot_seconds('failed') * interval '1 second')
                    else awa._retention(ring_state, m.retain_completed, m.retain_failed) end)
      into longest
      from awa.queue_meta as m;
    longest := coalesce(longest, awa._retention('failed', null, null));
    if written_until + longest < at then
        return 'drop';
    end if;
    if slot % n = (current_slot + 1) % n then
        return 'carry';
    end if;
    return null;
end;
$$;

-- Function: awa._finished_part(slot integer) returns text
-- The qualified name of the slot's partition of awa.finished, quoted for
-- format('%s'). Inlined; stable, as format() is.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._finished_part(slot integer)
returns text
language sql
stable parallel safe
as $$
    select pg_catalog.format('awa.%I', 'finished_' operator(pg_catalog.||)
                             pg_catalog.lpad(slot::pg_catalog.text, 2, '0'))
$$;

-- Function: awa._carry_blocks() returns integer
-- How many heap blocks of a slot one batch of a carry reads: 256 (2 MB),
-- some 20,000 completed rows. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._carry_blocks()
returns integer
language sql
immutable parallel safe
as $$
    select 256
$$;

-- Function: awa._carry_time() returns interval
-- How long one call of awa.prune_finished or awa.carry_finished goes on
-- carrying before it leaves the rest to its next call: well inside awa
-- maintain's 10 s statement timeout, with a batch and the slots' TRUNCATEs
-- still to come. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._carry_time()
returns interval
language sql
immutable parallel safe
as $$
    select interval '2 seconds'
$$;

-- Function: awa._carry_batch(slot, from_tid, stop_tid, at) returns (moved, last_tid, cut)
-- One batch of a carry: the slot's rows between the heap positions
-- from_tid (excluded) and stop_tid (excluded) still within their queue's
-- retention at `at`, at most awa._pass_bytes() of their payload (at least
-- one row), each deleted from the slot and inserted where
-- awa._carried_slot says in the same statement, so that every snapshot
-- sees it once. Rows another transaction holds are passed over. `cut`
-- when the payload bound stopped it before stop_tid, `last_tid` the last
-- row it took then. The batches of awa._carry_slot and the TRUNCATE's last
-- look (the whole slot, under its lock) both move rows with it.
-- Calls: awa._carried_slot (dynamic), awa._finished_part, awa._job_bytes (dynamic),
--   awa._pass_bytes (dynamic), awa._retention (dynamic)
-- Writes: awa.finished (dynamic), (dynamic)
create or replace function awa._carry_batch(
    slot integer, from_tid tid, stop_tid tid, at timestamptz,
    out moved bigint, out last_tid tid, out cut boolean
)
language plpgsql
set search_path = pg_catalog, pg_temp
-- A range of the slot's heap read by TID: a sequential scan would read it
-- from its start every batch.
set enable_seqscan = off
as $$
begin
    execute format($f$
        with retained as (
            select y.tid, sum(y.bytes) over (order by y.tid) - y.bytes as bytes_before
              from (
                  select f.ctid as tid, awa._job_bytes(f.kind, f.args, f.last_error) as bytes
                    from %1$s as f
                    join awa.queue_meta as m on m.queue_id = f.queue_id
                   where f.ctid > $1 and f.ctid < $2
                     and f.finished_at
                         + awa._retention(f.state, m.retain_completed, m.retain_failed) >= $3
              ) as y
        ),
        picked as (
            select r.tid from retained as r where r.bytes_before < awa._pass_bytes()
        ),
        -- Only the rows this batch moves are locked, and only they wait
        -- for the call's commit: a retry may take any other meanwhile.
        locked as (
            select f.ctid as tid
              from %1$s as f
             where f.ctid = any(array(select p.tid from picked as p))
               for update skip locked
        ),
        moved as (
            delete from %1$s as f
             using locked as l
             where f.ctid = l.tid
            returning f.*
        ),
        kept as (
            insert into awa.finished (
                job_id, slot, queue_id, priority, kind, state, attempt, max_attempts,
                enqueued_at, finished_at, args, ordering_key, last_error, max_run_time,
                unique_key, unique_window
            )
            select
                f.job_id,
                awa._carried_slot(
                    f.state,
                    f.finished_at,
                    f.finished_at
                    + awa._retention(f.state, m.retain_completed, m.retain_failed),
                    $3
                ),
                f.queue_id, f.priority, f.kind,
                f.state, f.attempt, f.max_attempts, f.enqueued_at, f.finished_at, f.args,
                f.ordering_key, f.last_error, f.max_run_time, f.unique_key, f.unique_window
              from moved as f
              join awa.queue_meta as m on m.queue_id = f.queue_id
            returning 1
        )
        select (select count(*) from kept),
               (select max(p.tid) from picked as p),
               (select count(*) from retained) > (select count(*) from picked)
    $f$, awa._finished_part(slot)) using from_tid, stop_tid, at into moved, last_tid, cut;
end;
$$;

-- Function: awa._carry_slot(slot integer, until timestamptz) returns (carried bigint, done boolean)
-- While the slot is the next its ring will write (awa._prune_action says
-- 'carry'), moves its rows still within their queue's retention out of it,
-- batch after batch (awa._carry_batch) until `until` (at least one batch;
-- none when `until` is null: only whether the batches are done), each
-- batch the rows of the next awa._carry_blocks() heap blocks.
-- awa.finished_carry keeps where the batches have got to in this period.
-- Rows another transaction holds (a retry) are passed over; the
-- TRUNCATE's last look takes them. `done` once no row lies past where the
-- batches have got to; carried counts the rows moved by this call.
-- Calls: awa._carry_batch, awa._carry_blocks, awa._finished_part, awa._finished_ring,
--   awa._finished_slot_seconds, awa._period, awa._prune_action
-- Writes: awa.finished_carry
create or replace function awa._carry_slot(
    slot integer, until timestamptz, out carried bigint, out done boolean
)
language plpgsql
set search_path = pg_catalog, pg_temp
-- The look past the batches' position reads the heap by TID.
set enable_seqscan = off
as $$
declare
    part text := awa._finished_part(slot);
    at timestamptz := clock_timestamp();
    -- The slot is to carry in this period only: the one it is next in.
    this_period bigint := awa._period(
        at, awa._finished_slot_seconds(awa._finished_ring(slot))
    );
    from_tid tid;
    stop_tid tid;
    b record;
    batches integer := 0;
begin
    carried := 0;
    done := false;
    select c.next_tid into from_tid
      from awa.finished_carry as c
     where c.slot = _carry_slot.slot and c.period = this_period;
    from_tid := coalesce(from_tid, '(0,0)'::tid);
    loop
        if awa._prune_action(slot, at) is distinct from 'carry' then
            return;
        end if;
        execute format('select not exists (select from %s as f where f.ctid > $1)', part)
            using from_tid into strict done;
        if done then
            return;
        end if;
        -- At least one batch a call, however little time is left.
        exit when until is null or (batches > 0 and at >= until);
        stop_tid := format('(%s,0)', (from_tid::text::point)[0]::bigint + awa._carry_blocks())::tid;
        select x.moved, x.last_tid, x.cut into b
          from awa._carry_batch(slot, from_tid, stop_tid, at) as x;
        -- Stopped at the payload bound: the next batch starts after the
        -- last row moved, in the same blocks.
        from_tid := case when b.cut then b.last_tid else stop_tid end;
        insert into awa.finished_carry as c (slot, period, next_tid)
        values (_carry_slot.slot, this_period, from_tid)
        on conflict on constraint finished_carry_pkey
        do update set period = excluded.period, next_tid = excluded.next_tid;
        carried := carried + b.moved;
        batches := batches + 1;
        at := clock_timestamp();
    end loop;
end;
$$;

-- Function: awa._carry_rows_locked() returns integer
-- The most retained rows the TRUNCATE's last look carries under the slot's
-- lock (rows the batches passed over, or a retention raised meanwhile);
-- past it the batches read the slot again from its start. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._carry_rows_locked()
returns integer
language sql
immutable parallel safe
as $$
    select 10000
$$;

-- Function: awa._prune_slot(slot integer, until timestamptz) returns bigint
-- Empties one slot of awa.finished if it is due (awa._prune_action) and
-- its lock can be had at once; returns how many jobs it removed (rows
-- carried to the current slot do not count), or -1 when the slot is due
-- and another session holds it. A slot to carry is first
-- carried in batches (awa._carry_slot, until `until`; with `until` null,
-- none), and emptied only once they have read all of it. The caller holds the prune lock. Whether
-- the slot is due is decided again once its lock is held, at a time read
-- then from the clock, not at the transaction's start: a job that ends in
-- a transaction begun before that moment is written to a slot no later
-- than the moment's current one, and a transaction begun after it waits
-- for the lock. Decided at the transaction's start, a prune begun just
-- before the hour turns took the new hour's slot for the oldest, and
-- emptied it with the jobs completed in it since. Under the lock, the rows
-- still retained (the batches moved all but a few) are carried before the
-- TRUNCATE, whatever the batches did; more than a batch's rows or payload
-- (awa._carry_rows_locked, awa._pass_bytes), and the batches read the slot
-- again instead.
-- Calls: awa._carry_batch, awa._carry_rows_locked, awa._carry_slot, awa._finished_part,
--   awa._job_bytes (dynamic), awa._pass_bytes, awa._prune_action, awa._retention (dynamic)
-- Writes: awa.finished (dynamic), awa.finished_carry
create or replace function awa._prune_slot(slot integer, until timestamptz)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    part text := awa._finished_part(slot);
    action text;
    at timestamptz;
    rows_in bigint;
    retained bigint := 0;
    retained_bytes bigint := 0;
    kept bigint := 0;
begin
    -- Its file, not its live rows: a slot whose rows the carry moved holds
    -- their dead versions, which its TRUNCATE is for.
    if pg_relation_size(part::regclass) = 0 then
        return 0;
    end if;
    action := awa._prune_action(slot, clock_timestamp());
    if action is null then
        return 0;
    end if;
    if action = 'carry' and not (awa._carry_slot(slot, until)).done then
        return 0;
    end if;
    begin
        execute format('lock table %s in access exclusive mode', part);
    exception when lock_not_available then
        return -1;
    end;
    at := clock_timestamp();
    action := awa._prune_action(slot, at);
    if action is null then
        return 0;
    end if;
    if action = 'carry' then
        execute format($f$
            select count(*), count(*) filter (where k.kept),
                   coalesce(sum(awa._job_bytes(f.kind, f.args, f.last_error))
                            filter (where k.kept), 0)
              from %s as f
              join awa.queue_meta as m on m.queue_id = f.queue_id
             cross join lateral (
                 select f.finished_at
                        + awa._retention(f.state, m.retain_completed, m.retain_failed) >= $1
                        as kept
             ) as k
        $f$, part) using at into strict rows_in, retained, retained_bytes;
    else
        execute format('select count(*) from %s', part) into strict rows_in;
    end if;
    if retained > awa._carry_rows_locked() or retained_bytes > awa._pass_bytes() then
        -- More than a batch: the batches read the slot again and move them.
        delete from awa.finished_carry as c where c.slot = _prune_slot.slot;
        return 0;
    end if;
    if retained > 0 then
        -- The whole slot as one batch: no other transaction holds a row of
        -- it now, and what it carries is within a batch's bound.
        select x.moved into kept
          from awa._carry_batch(slot, '(0,0)'::tid, '(4294967295,0)'::tid, at) as x;
    end if;
    execute format('truncate %s', part);
    delete from awa.finished_carry as c where c.slot = _prune_slot.slot;
    return rows_in - kept;
end;
$$;

-- Function: awa._carry_next_slots(until timestamptz) returns bigint
-- Carries the slot each ring writes next (awa._carry_slot, until `until`):
-- only a ring's next slot is ever carried, one per ring, not every slot.
-- Returns how many jobs it carried. The caller holds the prune lock.
-- Calls: awa._carry_slot, awa._finished_slot, awa._finished_slot_seconds
-- Writes: nothing
create or replace function awa._carry_next_slots(until timestamptz)
returns bigint
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    carried bigint := 0;
    ring text;
begin
    foreach ring in array array['completed', 'failed', 'long'] loop
        carried := carried + (awa._carry_slot(
            awa._finished_slot(
                ring, clock_timestamp() + awa._finished_slot_seconds(ring) * interval '1 second'
            ),
            until
        )).carried;
    end loop;
    return carried;
end;
$$;

-- Function: awa.prune_finished() returns bigint
-- Removes terminal jobs past their queue's retention by emptying whole
-- slots of awa.finished with TRUNCATE (see the file header). Never removes
-- a job within its retention, nor one that is not terminal. A slot whose
-- lock is not free at once (a reader of awa.finished holds it) is skipped
-- until the next call, so a prune never waits long; the call then records
-- no run (awa.maintenance_runs), so that a slot held for good shows as a
-- prune that does not run (alert AwaMaintenanceNotRunning). A slot with rows to
-- carry is carried in batches for at most awa._carry_time() per call
-- (awa.carry_finished does only that) and emptied by the call after its
-- batches have read it all. Every carry comes before the first TRUNCATE:
-- an emptied slot stays locked (ACCESS EXCLUSIVE) until the call ends, and
-- every reader of awa.finished (the job tools, awa.run_outcome) waits for
-- it, so readers wait for the TRUNCATEs (a count and a truncate per due
-- slot), never for the batches.
-- One prune at a time: a second concurrent call returns 0 at once.
-- Run it every minute or so (awa maintain does); a slot becomes due about
-- once an hour.
-- Role: awa_maintenance.
-- Returns: how many jobs it removed.
-- Errors: 25000 the calling transaction is not read committed: a snapshot
-- older than a slot's lock would not see the rows committed since, and the
-- TRUNCATE would remove them uncopied.
-- Calls: awa._carry_next_slots, awa._carry_time, awa._check_read_committed,
--   awa._finished_slot_count, awa._note_run, awa._prune_slot, awa._try_leader
-- Writes: nothing
create or replace function awa.prune_finished()
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    until timestamptz := clock_timestamp() + awa._carry_time();
    removed bigint := 0;
    slot_removed bigint;
    held boolean := false;
begin
    perform awa._check_read_committed('awa.prune_finished()');
    if not awa._try_leader('prune') then
        return 0;
    end if;
    perform awa._carry_next_slots(until);
    for s in 0 .. awa._finished_slot_count() - 1 loop
        slot_removed := awa._prune_slot(s, null);
        held := held or slot_removed < 0;
        removed := removed + greatest(slot_removed, 0);
    end loop;
    -- Recorded only when no due slot was held: a session that keeps
    -- awa.finished (idle in a transaction that read the job tools) stops
    -- every prune, and history then grows with no other sign.
    if not held then
        perform awa._note_run('prune');
    end if;
    return removed;
end;
$$;

-- Function: awa.carry_finished() returns bigint
-- The carry of awa.prune_finished alone: moves the rows still within their
-- retention out of the slot each ring writes next (three slots, not all
-- of them: its cost follows the rings, not the queues times the slots),
-- in batches, for at most
-- awa._carry_time(), and leaves the TRUNCATE to the next prune. A scheduler
-- calls it again at once while it returns rows (awa maintain does), so
-- that a long retention's carry is done long before the slot's turn comes,
-- whatever the prune's cadence. One call at a time with the prune: a call
-- while either runs returns 0 at once.
-- Role: awa_maintenance.
-- Returns: how many jobs it carried.
-- Errors: 25000 the calling transaction is not read committed.
-- Calls: awa._carry_next_slots, awa._carry_time, awa._check_read_committed, awa._note_run,
--   awa._try_leader
-- Writes: nothing
create or replace function awa.carry_finished()
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '100ms'
as $$
declare
    until timestamptz := clock_timestamp() + awa._carry_time();
begin
    perform awa._check_read_committed('awa.carry_finished()');
    -- Recorded once the leader lock is had, as every pass (a held lock
    -- must show as a task that does not run).
    if not awa._try_leader('prune') then
        return 0;
    end if;
    perform awa._note_run('carry');
    return awa._carry_next_slots(until);
end;
$$;

select awa._grant_execute('awa._finished_slot_seconds(text)');
select awa._grant_execute('awa._finished_ring_slots()');
select awa._grant_execute('awa._finished_slot_count()');
select awa._grant_execute('awa._finished_ring(integer)');
select awa._grant_execute('awa._finished_slot(text, timestamptz)');
select awa._grant_execute('awa._retention(text, interval, interval)');
select awa._grant_execute('awa._period(timestamptz, integer)');
select awa._grant_execute('awa._carried_slot(text, timestamptz, timestamptz, timestamptz)');
select awa._grant_execute('awa.set_retention(text, interval, interval)', 'operator');
select awa._grant_execute('awa._prune_action(integer, timestamptz)');
select awa._grant_execute('awa._finished_part(integer)');
select awa._grant_execute('awa._carry_blocks()');
select awa._grant_execute('awa._carry_time()');
select awa._grant_execute('awa._carry_batch(integer, tid, tid, timestamptz)');
select awa._grant_execute('awa._carry_slot(integer, timestamptz)');
select awa._grant_execute('awa._carry_rows_locked()');
select awa._grant_execute('awa._prune_slot(integer, timestamptz)');
select awa._grant_execute('awa._carry_next_slots(timestamptz)');
select awa._grant_execute('awa.prune_finished()', 'maintenance');
select awa._grant_execute('awa.carry_finished()', 'maintenance');
