-- control.sql: operator switches on a queue.

-- Function: awa.pause_queue(queue text) returns boolean
-- A paused queue (all its stripes) still accepts enqueues; claims yield
-- nothing from it.
-- Returns true when this call changed the state. Role: awa_operator.
-- Errors: 42704 unknown queue; 22004/22023 bad name.
create or replace function awa.pause_queue(queue text)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._queue(queue);
    update awa.queue_meta as m set paused = true
     where (m.queue = pause_queue.queue or m.logical_queue = pause_queue.queue
            or m.root_queue = pause_queue.queue)
       and not m.paused;
    return found;
end;
$$;

-- Function: awa.resume_queue(queue text) returns boolean
-- Role: awa_operator. Errors as awa.pause_queue.
create or replace function awa.resume_queue(queue text)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform awa._queue(queue);
    update awa.queue_meta as m set paused = false
     where (m.queue = resume_queue.queue or m.logical_queue = resume_queue.queue
            or m.root_queue = resume_queue.queue)
       and m.paused;
    return found;
end;
$$;

select awa._grant_execute('awa.pause_queue(text)', 'operator');
select awa._grant_execute('awa.resume_queue(text)', 'operator');
