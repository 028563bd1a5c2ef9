-- maintenance.sql: what awa maintain needs besides the calls it makes: the
-- lock that lets one of any number of maintain processes make each pass.

-- Function: awa.try_pass_lock(task text) returns boolean
-- Takes the leader lock of awa maintain's pass `task` (the row 'pass.' ||
-- task of awa.leader_locks, made on first use) until the transaction ends,
-- if no other transaction holds it; false, at once, if one does. A row only
-- the owner can lock, where an advisory lock would be one any role could
-- hold to switch the pass off (ADR 037).
-- Role: awa_maintenance.
-- Errors: 22023 a task name that is not 1 to 40 lowercase letters and
--   underscores; 22004 null.
-- Calls: awa._try_leader
-- Writes: awa.leader_locks
create or replace function awa.try_pass_lock(task text)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if task is null then
        raise exception 'task must not be null' using errcode = '22004';
    end if;
    if task !~ '^[a-z_]{1,40}$' then
        raise exception 'task must be 1 to 40 lowercase letters and underscores, got %',
            quote_literal(task)
            using errcode = '22023';
    end if;
    insert into awa.leader_locks (name) values ('pass.' || task) on conflict do nothing;
    return awa._try_leader('pass.' || task);
end;
$$;

select awa._grant_execute('awa.try_pass_lock(text)', 'maintenance');
