-- unique.sql: unique keys (ADR 027).
--
-- A job enqueued with a unique key holds it in awa.unique_keys while it is
-- scheduled, ready or running, and for its unique window after it
-- completes; another enqueue of the key to the same logical queue inserts
-- nothing and reports the holder (awa.enqueued.duplicate). Keys are taken
-- by awa._take_unique_keys, the one home of the rule, from awa.enqueue's
-- general way, the general multi-row enqueue (awa._enqueue_rows: the batch
-- and COPY) and the retries of the job tools; they are given back by
-- awa._release_unique_key when a job ends (awa.complete, awa._finish).
-- Every call that takes, moves or gives back the rows of several keys
-- waits for them in (scope, key) order: awa._take_unique_keys settles its
-- keys in that order, awa._join_unique_scope locks the rows it moves in it,
-- and a call that ends several jobs locks their keys' rows in it
-- (awa._lock_unique_keys) before it gives any back. So no two single calls
-- deadlock over keys (ADR 027, ADR 056), but for a join while a producer
-- enqueues keyed jobs to the family, which the join's docs rule out: its
-- move checks each key against the new scope and may wait there for a key
-- below a row it locked.

-- Function: awa._unique_scope(queue text, root_queue text) returns text
-- The logical queue a unique key is unique in: the top name of a
-- physical queue's partitions and stripes. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._unique_scope(queue text, root_queue text)
returns text
language sql
immutable parallel safe
as $$
    select coalesce(root_queue, queue)
$$;

-- Function: awa._key_holds(held_until timestamptz) returns boolean
-- Whether a row of awa.unique_keys holds its key now: held by a live job
-- (held_until null), or by a completed one whose window has not passed.
-- Now is the call's statement, not its transaction's start: a window is
-- counted from the complete's clock (awa._release_unique_key), and a
-- producer's transaction may be older than that. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._key_holds(held_until timestamptz)
returns boolean
language sql
stable parallel safe
as $$
    select held_until is null
        or held_until operator(pg_catalog.>) pg_catalog.statement_timestamp()
$$;

-- Function: awa._unique_ok(unique_key bytea, unique_window interval) returns boolean
-- A job's unique key and window: no key and no window, or a key of 1 to
-- 1024 bytes with no window or one of 1 second to 365 days. The window is
-- checked as the seconds it is applied as (awa._release_unique_key): an
-- interval comparison counts a year 360 days, so '1 year', held 365.25,
-- passed. Inlined.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._unique_ok(unique_key bytea, unique_window interval)
returns boolean
language sql
immutable parallel safe
as $$
    select case
        when unique_key is null then unique_window is null
        else pg_catalog.length(unique_key) operator(pg_catalog.>=) 1
            and pg_catalog.length(unique_key) operator(pg_catalog.<=) 1024
            and (unique_window is null
                 or (pg_catalog.date_part('epoch', unique_window) operator(pg_catalog.>=) 1
                     and pg_catalog.date_part('epoch', unique_window)
                         operator(pg_catalog.<=) 31536000))
    end
$$;

-- Function: awa._check_unique(unique_key bytea, unique_window interval) returns void
-- Raises the error for what awa._unique_ok refuses: 22023 naming the value
-- and the allowed range.
-- Calls: awa._unique_ok
-- Writes: nothing
create or replace function awa._check_unique(unique_key bytea, unique_window interval)
returns void
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if unique_key is null and unique_window is not null then
        raise exception 'unique_window % needs a unique_key', unique_window
            using errcode = '22023';
    end if;
    if length(unique_key) not between 1 and 1024 then
        raise exception 'unique_key must be 1 to 1024 bytes, got %', length(unique_key)
            using errcode = '22023';
    end if;
    if not awa._unique_ok(unique_key, unique_window) then
        raise exception 'unique_window must be 1 second to 365 days (31,536,000 s), got % (% s)',
            unique_window, date_part('epoch', unique_window)
            using errcode = '22023';
    end if;
end;
$$;

-- Function: awa._take_unique_keys(unique_keys, job_ids, queue_ids, priorities,
--                                 unique_windows) returns table (i, job_id, queue_id, priority)
-- Takes the unique key of each element i that has one (unique_keys[i]) for
-- job job_ids[i] of physical queue queue_ids[i], in that queue's logical
-- queue (awa._unique_scope), and returns the elements another job holds
-- the key of, with that job, in the order their keys are settled: those
-- are duplicates, to be inserted nowhere.
-- Within the call the first element of each key takes it and the later
-- ones are its duplicates. A key is free when no row holds it or its row's
-- held_until has passed (a completed job's window ended): the row is then
-- taken over. The keys are settled one at a time, in (scope, key) order,
-- each before the next is touched: a call waits only for a key above
-- every key it took, so two calls never deadlock (a call that took a key
-- and then, given a key back, waited for a lower one did: ADR 027). The row
-- of a key a live job holds is read, not locked: the caller goes on to wait
-- for lanes, and a lock held meanwhile would deadlock with the holder's end
-- in a transaction that holds one of those lanes (a worker that enqueues
-- and completes in one transaction). If a holder gives its key back
-- between the insert and the read (a failed job deletes its row), the key
-- is taken again. The caller marks the queues that now have keyed jobs
-- (awa._mark_unique_jobs) once it holds its lanes. The arrays come
-- checked, one element per job, indexed from 1.
-- Calls: awa._default_priority, awa._unique_scope
-- Writes: awa.unique_keys
create or replace function awa._take_unique_keys(
    unique_keys bytea[],
    job_ids bigint[],
    queue_ids integer[],
    priorities smallint[],
    unique_windows interval[]
)
returns table (i integer, job_id bigint, queue_id integer, priority smallint)
language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
-- Keys are looked up by key, queues by id: a generic plan would otherwise
-- hash the whole table of keys for a call of one.
set enable_hashjoin = off
set enable_mergejoin = off
set enable_seqscan = off
as $$
declare
    e record;
    -- The key being settled and, once settled, the job holding it.
    key_scope text;
    key_value bytea;
    holder_job bigint;
    holder_queue integer;
    holder_priority smallint;
    holder_until timestamptz;
begin
    -- Each element's values read once, in order (unnest): a subscript of
    -- an array with nulls or of varying width walks it from the start, so
    -- one per element would cost the square of the call's size.
    for e in
        select x.i, awa._unique_scope(m.queue, m.root_queue) as scope, x.unique_key,
               x.job_id, x.queue_id, x.priority, x.unique_window
          from unnest(unique_keys, job_ids, queue_ids, priorities, unique_windows)
               with ordinality as x (unique_key, job_id, queue_id, priority, unique_window, i)
          left join awa.queue_meta as m on m.queue_id = x.queue_id
         where x.unique_key is not null
         order by 2, 3, 1
    loop
        if key_scope is distinct from e.scope or key_value is distinct from e.unique_key then
            key_scope := e.scope;
            key_value := e.unique_key;
            loop
                insert into awa.unique_keys as u (
                    queue, unique_key, job_id, queue_id, priority, unique_window, held_until
                ) values (
                    e.scope, e.unique_key, e.job_id, e.queue_id,
                    coalesce(e.priority, awa._default_priority()), e.unique_window,
                    null
                )
                on conflict (queue, unique_key) do nothing;
                if found then
                    holder_job := e.job_id;
                    holder_queue := e.queue_id;
                    holder_priority := coalesce(e.priority, awa._default_priority());
                    exit;
                end if;
                select u.job_id, u.queue_id, u.priority, u.held_until
                  into holder_job, holder_queue, holder_priority, holder_until
                  from awa.unique_keys as u
                 where u.queue = e.scope and u.unique_key = e.unique_key;
                -- Given back since the insert: take it again.
                continue when not found;
                exit when holder_until is null or holder_until > statement_timestamp();
                -- Its window has passed: take it over, unless another caller
                -- did meanwhile (then read again, and find it held).
                update awa.unique_keys as u
                   set job_id = e.job_id, queue_id = e.queue_id,
                       priority = coalesce(e.priority, awa._default_priority()),
                       unique_window = e.unique_window, held_until = null
                 where u.queue = e.scope and u.unique_key = e.unique_key
                   and u.held_until <= statement_timestamp()
                returning u.job_id, u.queue_id, u.priority
                     into holder_job, holder_queue, holder_priority;
                exit when found;
            end loop;
        end if;
        -- Each duplicate returned as it is found: arrays grown by one
        -- element at a time were copied whole at every step.
        if holder_job <> e.job_id then
            i := e.i;
            job_id := holder_job;
            queue_id := holder_queue;
            priority := holder_priority;
            return next;
        end if;
    end loop;
end;
$$;

-- Function: awa._null_at(arr anyarray, positions integer[]) returns anyarray
-- arr, indexed from 1, with its elements at these positions (distinct)
-- made null: how a multi-row call keeps the rows whose unique key another
-- job holds out of its lanes and rows (their queue ids and kinds). One
-- assignment per position, into the array PL/pgSQL holds expanded: a test
-- of each element against every position costs the product of the two,
-- and a join's cost depends on a plan made without the arrays' sizes.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._null_at(arr anyarray, positions integer[])
returns anyarray
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    p integer;
begin
    foreach p in array positions loop
        arr[p] := null;
    end loop;
    return arr;
end;
$$;

-- Function: awa._mark_unique_jobs(queue_ids integer[], unique_keys bytea[]) returns void
-- Marks the queues of the elements that took a unique key as having keyed
-- jobs (awa.queue_meta.unique_jobs), in the transaction that enqueues them,
-- so that a claim of one of them gives its key back at its end (ADR 027).
-- Called once the caller holds its lanes: a queue's first keyed enqueue
-- locks its queue_meta row, and waiting for a lane while holding it would
-- deadlock with another keyed enqueue of the queue that holds that lane.
-- Calls: awa._lock_rank
-- Writes: awa.queue_meta
create or replace function awa._mark_unique_jobs(queue_ids integer[], unique_keys bytea[])
returns void
language sql
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
    -- The rows still to mark, locked in lock order first (awa._lock_rank),
    -- as a change of a queue's family locks them (awa._lock_queue_rows): an UPDATE
    -- locks in its scan's order, which a bitmap scan makes the heap's.
    -- Once a queue is marked there is nothing to lock.
    update awa.queue_meta as m
       set unique_jobs = true
      from (
          select q.queue_id
            from awa.queue_meta as q
           where q.queue_id = any(array(
               select queue_ids[x.i] from generate_series(1, cardinality(unique_keys)) as x (i)
                where unique_keys[x.i] is not null
           ))
             and not q.unique_jobs
           order by awa._lock_rank(q.root_queue, q.logical_queue), q.queue_id
             for no key update
      ) as marked
     where m.queue_id = marked.queue_id
$$;

-- Function: awa._join_unique_scope(old_scope text, new_scope text) returns void
-- When an ordinary queue joins a logical one as its partition or stripe
-- (awa._ensure_linked), the keys its jobs hold move to the logical
-- queue's scope (awa._unique_scope), where every later enqueue to it
-- looks them up: left under its own name, a key a ready job held was
-- taken again by a second job. So do the keys a dropped queue's late jobs
-- took under '#dropped#<queue_id>' when awa.finish_drops puts it back. A
-- row that holds nothing any more (its window passed) gives way to the
-- other scope's row of the same key.
-- The rows it moves or removes are locked first, in (scope, key) order,
-- as the other calls that take or give back several keys wait for them
-- (awa._lock_unique_keys): locked by its UPDATE, in its scan's order, one
-- that waited for a key a worker's complete held deadlocked with an
-- awa.cancel_jobs of the queue that held a later key and waited for an
-- earlier one this call held (40P01).
-- Errors: 55006 a key held in both scopes: the two jobs holding it could
--   not both stay unique in one.
-- Calls: nothing
-- Writes: awa.unique_keys
create or replace function awa._join_unique_scope(old_scope text, new_scope text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    clash bytea;
begin
    -- Each of the old scope's rows, and the other scope's row of its key
    -- if that one holds nothing any more (removed below).
    perform from awa.unique_keys as o
       join awa.unique_keys as u
         on u.queue in (old_scope, new_scope) and u.unique_key = o.unique_key
      where o.queue = old_scope
        and (u.queue = old_scope or u.held_until <= statement_timestamp())
      order by u.queue, u.unique_key
        for update of u;
    delete from awa.unique_keys as u
     using awa.unique_keys as v
     where v.unique_key = u.unique_key and u.held_until <= statement_timestamp()
       and ((u.queue = old_scope and v.queue = new_scope)
            or (u.queue = new_scope and v.queue = old_scope));
    select o.unique_key into clash
      from awa.unique_keys as o
      join awa.unique_keys as n on n.unique_key = o.unique_key and n.queue = new_scope
     where o.queue = old_scope
     limit 1;
    if found then
        raise exception 'queue % and % both hold unique key %: % cannot join %',
            quote_literal(old_scope), quote_literal(new_scope), clash,
            quote_literal(old_scope), quote_literal(new_scope)
            using errcode = '55006',
                  hint = 'Once one of the two jobs has ended and its window passed, call again.';
    end if;
    begin
        update awa.unique_keys as u set queue = new_scope where u.queue = old_scope;
    exception when unique_violation then
        -- A key another transaction took in the new scope while this one
        -- looked, and committed since: the same clash, seen late.
        raise exception 'queue % and % both hold a unique key: % cannot join %',
            quote_literal(old_scope), quote_literal(new_scope),
            quote_literal(old_scope), quote_literal(new_scope)
            using errcode = '55006',
                  hint = 'Call again: the key is then named, and once one of the two jobs '
                         'has ended and its window passed, the call goes through.';
    end;
end;
$$;

-- Function: awa._release_unique_key(job_id bigint, completed boolean)
--           returns table (unique_key bytea, unique_window interval)
-- Gives back the unique key a job that ends holds: at once, or for a
-- completed job with a unique window once the window has passed, counted
-- from the clock now, not from the start of the worker's transaction,
-- which may be as old as the worker likes. The window counts in seconds
-- (awa._in_seconds), not by the calendar of the worker's time zone, where
-- '1 day' is 23 or 25 hours across a daylight-saving change, and 12 or 36
-- in a zone the worker makes up. Returns the key and window the job held
-- (no row when it held none), which a failed or cancelled job keeps for a
-- retry.
-- Calls: awa._in_seconds
-- Writes: awa.unique_keys
create or replace function awa._release_unique_key(job_id bigint, completed boolean)
returns table (unique_key bytea, unique_window interval)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if completed then
        return query
        update awa.unique_keys as u
           set held_until = clock_timestamp() + awa._in_seconds(u.unique_window)
         where u.job_id = _release_unique_key.job_id and u.held_until is null
           and u.unique_window is not null
        returning u.unique_key, u.unique_window;
        if found then
            return;
        end if;
    end if;
    return query
    delete from awa.unique_keys as u
     where u.job_id = _release_unique_key.job_id and u.held_until is null
    returning u.unique_key, u.unique_window;
end;
$$;

-- Function: awa._lock_unique_keys(job_ids bigint[]) returns void
-- Locks the rows of the unique keys these live jobs hold, in (scope, key)
-- order: what a call that ends several jobs does before it gives their
-- keys back one job at a time (awa._release_unique_key), so that, like the
-- calls that take keys (awa._take_unique_keys) or move them
-- (awa._join_unique_scope), it waits for a key only above every key it
-- holds. Given back in the order its jobs came (a lane's, a table's), an
-- awa.cancel_jobs that gave one key back and then waited for a lower one
-- deadlocked with a join that held the lower one and waited for the other.
-- Calls: nothing
-- Writes: nothing
create or replace function awa._lock_unique_keys(job_ids bigint[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
begin
    perform from awa.unique_keys as u
      where u.job_id = any(job_ids) and u.held_until is null
      order by u.queue, u.unique_key
        for update;
end;
$$;

-- Function: awa.prune_unique_keys(max_keys integer default 10000) returns bigint
-- Removes up to max_keys rows of awa.unique_keys that hold nothing any
-- more (a completed job's window has passed), oldest first; rows another
-- transaction holds are skipped. A passed row is taken over by the next
-- enqueue of its key anyway: this keeps the table to the keys held.
-- Role: awa_maintenance. Returns how many rows it removed.
-- Errors: 22004 max_keys null; 22023 max_keys below 0.
-- Calls: awa._check_limit, awa._note_run
-- Writes: awa.unique_keys
create or replace function awa.prune_unique_keys(max_keys integer default 10000)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    removed bigint;
begin
    perform awa._check_limit('max_keys', max_keys);
    perform awa._note_run('unique_keys');
    delete from awa.unique_keys as u
     where u.ctid = any(array(
         select x.ctid from awa.unique_keys as x
          where x.held_until <= statement_timestamp()
          order by x.held_until
          limit max_keys
            for update skip locked
     ));
    get diagnostics removed = row_count;
    return removed;
end;
$$;

select awa._grant_execute('awa._unique_scope(text, text)');
select awa._grant_execute('awa._key_holds(timestamptz)');
select awa._grant_execute('awa._unique_ok(bytea, interval)');
select awa._grant_execute('awa._check_unique(bytea, interval)');
select awa._grant_execute(
    'awa._take_unique_keys(bytea[], bigint[], integer[], smallint[], interval[])'
);
select awa._grant_execute('awa._null_at(anyarray, integer[])');
select awa._grant_execute('awa._mark_unique_jobs(integer[], bytea[])');
select awa._grant_execute('awa._release_unique_key(bigint, boolean)');
select awa._grant_execute('awa._lock_unique_keys(bigint[])');
select awa._grant_execute('awa._join_unique_scope(text, text)');
select awa._grant_execute('awa.prune_unique_keys(integer)', 'maintenance');
