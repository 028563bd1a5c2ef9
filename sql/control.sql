-- control.sql: operator switches on a queue.

-- Function: awa._set_paused(queue text, paused boolean) returns boolean
-- Pauses or resumes a queue with all its partitions and stripes; true when
-- anything changed.
-- Calls: awa._lock_family
-- Writes: awa.queue_meta
create or replace function awa._set_paused(queue text, paused boolean)
returns boolean
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    ids integer[];
begin
    ids := awa._lock_family(queue);
    update awa.queue_meta as m set paused = _set_paused.paused
     where m.queue_id = any(ids)
       and m.paused <> _set_paused.paused;
    return found;
end;
$$;

-- Function: awa.pause_queue(queue text) returns boolean
-- A paused queue (all its partitions and stripes) still accepts enqueues;
-- claims yield nothing from it. Returns true when this call changed the
-- state. Role: awa_operator.
-- Errors: 42704 unknown queue; 22004/22023 bad name.
-- Calls: awa._set_paused
-- Writes: nothing
create or replace function awa.pause_queue(queue text)
returns boolean
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select awa._set_paused(queue, true)
$$;

-- Function: awa.resume_queue(queue text) returns boolean
-- Undoes awa.pause_queue: claims take the queue's jobs again. Returns true
-- when this call changed the state. Role: awa_operator. Errors as
-- awa.pause_queue.
-- Calls: awa._set_paused
-- Writes: nothing
create or replace function awa.resume_queue(queue text)
returns boolean
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
    select awa._set_paused(queue, false)
$$;

select awa._grant_execute('awa._set_paused(text, boolean)');
select awa._grant_execute('awa.pause_queue(text)', 'operator');
select awa._grant_execute('awa.resume_queue(text)', 'operator');
