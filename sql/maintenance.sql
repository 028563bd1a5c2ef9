-- maintenance.sql: what awa maintain needs besides the calls it makes: the
-- lock that lets one of any number of maintain processes make each pass;
-- and the record of when each maintenance task last ran, whoever ran it.

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

-- Function: awa._note_run(task text) returns void
-- Records that maintenance task `task` ran, in the caller's transaction
-- (awa.maintenance_runs): every maintenance function calls it, so that
-- whether maintenance runs is known to the database, whatever runs it
-- (awa maintain, a Worker, pg_cron). A row updated in the last 5 seconds is
-- left as it is (a task called every second writes a row version every 5),
-- and one another transaction holds is skipped, not waited for: that
-- transaction records the run, and two maintenance calls never wait for
-- each other here. Outside read committed, a row another transaction
-- updated since the caller's snapshot is skipped too (that one recorded
-- the run): its lock would fail the caller's maintenance call with 40001.
-- The subtransaction that catches it is entered only when a record is due.
-- A read-only transaction (BEGIN READ ONLY, and every transaction of a
-- standby) records nothing: it can write no row, and a call there did no
-- maintenance; an idle call that writes nothing else stays a no-op there.
-- Calls: nothing
-- Writes: awa.maintenance_runs
create or replace function awa._note_run(task text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if pg_catalog.current_setting('transaction_read_only')::boolean then
        return;
    end if;
    if not exists (
        select from awa.maintenance_runs as x
         where x.name = _note_run.task and x.last_at < now() - interval '5 seconds'
    ) then
        return;
    end if;
    begin
        update awa.maintenance_runs as r set last_at = now()
          from (
              select x.ctid from awa.maintenance_runs as x
               where x.name = _note_run.task and x.last_at < now() - interval '5 seconds'
                 for update skip locked
          ) as s
         where r.ctid = s.ctid;
    exception when serialization_failure then
        null;  -- updated since this transaction's snapshot: recorded by another
    end;
end;
$$;

select awa._grant_execute('awa._note_run(text)');
select awa._grant_select('awa.maintenance_runs', 'reader', 'operator');
